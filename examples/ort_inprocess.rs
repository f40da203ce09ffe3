//! The in-process baseline of `bench/bench.py`: ONNX Runtime's own time for one run of a model through its C
//! API, as the module makes it (src/backends/onnx_run.rs): input values over existing bytes made once and
//! reused (as a session does for the same tensors), names made once, a reused RunOptions, the output's shape
//! and data read by reference and the outputs released; with the session options the module uses (an intra-op
//! pool whose threads spin briefly before they block, default thread counts), without Redis.
//! Usage: `ort_inprocess <libonnxruntime.so> <model.onnx> <rows> <runs>`. Every input is FLOAT, its free
//! dimensions `rows` (the first) and 2 (the others); prints `p50_us <n>`.
use std::ffi::CString;
use std::ptr;
use std::time::Instant;

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{RunOptions, Session};
use ort::sys::{ONNXTensorElementDataType, OrtStatusPtr, OrtValue};
use ort::value::ValueType;
use ort::AsPointer;

fn check(status: OrtStatusPtr) -> Result<(), Box<dyn std::error::Error>> {
    if status.0.is_null() {
        Ok(())
    } else {
        Err("ONNX Runtime call failed".into())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, lib, model, rows, runs] = args.as_slice() else {
        return Err("usage: ort_inprocess <libonnxruntime.so> <model.onnx> <rows> <runs>".into());
    };
    let (rows, runs): (i64, usize) = (rows.parse()?, runs.parse()?);
    let env = ort::init_from(lib)?.with_name("bench").build()?;
    let session =
        Session::builder(&env)?.with_intra_op_spinning(true)?.with_inter_op_spinning(false)?.commit_from_file(model)?;
    let shapes: Vec<Vec<i64>> = session
        .inputs()
        .iter()
        .map(|i| match i.dtype() {
            ValueType::Tensor { shape, .. } => Ok(shape
                .iter()
                .enumerate()
                .map(|(d, &n)| {
                    if n >= 0 {
                        n
                    } else if d == 0 {
                        rows
                    } else {
                        2
                    }
                })
                .collect()),
            _ => Err("an input is not a tensor"),
        })
        .collect::<Result<_, _>>()?;
    let data: Vec<Vec<f32>> =
        shapes.iter().map(|s| (0..s.iter().product::<i64>()).map(|i| (i % 97) as f32 / 97.0).collect()).collect();
    let in_names: Vec<CString> = session.inputs().iter().map(|i| CString::new(i.name())).collect::<Result<_, _>>()?;
    let out_names: Vec<CString> = session.outputs().iter().map(|o| CString::new(o.name())).collect::<Result<_, _>>()?;
    let in_ptrs: Vec<_> = in_names.iter().map(|n| n.as_ptr()).collect();
    let out_ptrs: Vec<_> = out_names.iter().map(|n| n.as_ptr()).collect();
    let memory = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default)?;
    let options = RunOptions::new()?;
    let api = ort::api();
    let mut times = Vec::with_capacity(runs);
    // The input values are made once and reused by every run, as the module's session does over the same
    // tensors (src/backends/onnx_run.rs, InputCache).
    let mut inputs: Vec<*mut OrtValue> = Vec::with_capacity(shapes.len());
    for (shape, d) in shapes.iter().zip(&data) {
        let mut v = ptr::null_mut();
        // SAFETY: `d` outlives the value (released at the end); the shape is read during the call.
        check(unsafe {
            (api.CreateTensorWithDataAsOrtValue)(
                memory.ptr(),
                d.as_ptr().cast_mut().cast(),
                d.len() * 4,
                shape.as_ptr(),
                shape.len(),
                ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                &mut v,
            )
        })?;
        inputs.push(v);
    }
    let values: Vec<*const OrtValue> = inputs.iter().map(|&v| v.cast_const()).collect();
    for i in 0..runs + runs / 10 {
        let t0 = Instant::now();
        let mut outputs: Vec<*mut OrtValue> = vec![ptr::null_mut(); out_ptrs.len()];
        // SAFETY: the arrays hold as many entries as their lengths say; each value ONNX Runtime returns is
        // released once; the output's shape is read by reference while the value lives.
        unsafe {
            check((api.Run)(
                session.ptr().cast_mut(),
                options.ptr(),
                in_ptrs.as_ptr(),
                values.as_ptr(),
                values.len(),
                out_ptrs.as_ptr(),
                out_ptrs.len(),
                outputs.as_mut_ptr(),
            ))?;
            let mut ty = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            let (mut dims, mut ndims) = (ptr::null(), 0usize);
            check((api.GetTensorElementTypeAndShapeDataReference)(outputs[0], &mut ty, &mut dims, &mut ndims))?;
            let mut y = ptr::null_mut();
            check((api.GetTensorMutableData)(outputs[0], &mut y))?;
            std::hint::black_box((ty, dims, ndims, y));
            for v in outputs {
                (api.ReleaseValue)(v);
            }
        }
        if i >= runs / 10 {
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    for v in inputs {
        // SAFETY: each input value was made above and is released once, after the last run.
        unsafe { (api.ReleaseValue)(v) };
    }
    times.sort_by(f64::total_cmp);
    println!("p50_us {:.2}", times[times.len() / 2]);
    Ok(())
}
