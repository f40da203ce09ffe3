//! One ONNX Runtime run through its C API, for models whose outputs are all numeric or BOOL tensors (most
//! models). Inputs are values over the tensors' own bytes with one memory description made at load (kept for
//! the session's next run over the same tensors), names are C strings made at load, and outputs are copied
//! straight into tensors. `ort`'s safe wrappers allocate for each of these on every run, which costs a tiny
//! model about half as much main-thread time as ONNX Runtime's own run (docs/benchmarks.md). Anything else (STRING tensors, maps, unaligned bytes) takes `ort`'s path in
//! onnx.rs.

use std::ffi::{c_void, CStr, CString};
use std::ptr::{self, NonNull};

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{RunOptions, Session};
use ort::sys::{ONNXTensorElementDataType as Onnx, OrtStatusPtr, OrtValue};
use ort::value::{TensorElementType, ValueType};
use ort::AsPointer;
use smallvec::SmallVec;

use super::Outputs;
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};

pub(super) struct Direct {
    inputs: Vec<CString>,
    outputs: Vec<CString>,
    memory: MemoryInfo<'static>,
}

/// The one dtype table of ONNX Runtime: each type that is handed over as it is, in the C API's and in `ort`'s
/// words (not STRING: ONNX strings are objects). BOOL bytes are 0 or 1 (checked when the tensor was made):
/// ONNX's bool layout.
const TYPES: [(DataType, Onnx, TensorElementType); 9] = [
    (DataType::Float, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, TensorElementType::Float32),
    (DataType::Double, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, TensorElementType::Float64),
    (DataType::Int8, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, TensorElementType::Int8),
    (DataType::Int16, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, TensorElementType::Int16),
    (DataType::Int32, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, TensorElementType::Int32),
    (DataType::Int64, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, TensorElementType::Int64),
    (DataType::Uint8, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, TensorElementType::Uint8),
    (DataType::Uint16, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, TensorElementType::Uint16),
    (DataType::Bool, Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, TensorElementType::Bool),
];

/// The C API's element type of a tensor that can be handed over as it is.
fn onnx_type(dt: DataType) -> Option<Onnx> {
    TYPES.iter().find(|(d, ..)| *d == dt).map(|&(_, o, _)| o)
}

/// Our type of an `ort` element type, for those handed over as they are.
fn data_type(t: TensorElementType) -> Option<DataType> {
    TYPES.iter().find(|(.., e)| *e == t).map(|&(d, ..)| d)
}

/// Ok, or the status's message as the error (the status released).
fn check(status: OrtStatusPtr) -> Result<()> {
    let Some(status) = NonNull::new(status.0) else {
        return Ok(());
    };
    let api = ort::api();
    // SAFETY: `status` is a live status ONNX Runtime returned; its message is a NUL-terminated string owned
    // by it, copied before the status is released (once).
    let msg = unsafe {
        let msg = CStr::from_ptr((api.GetErrorMessage)(status.as_ptr())).to_string_lossy().into_owned();
        (api.ReleaseStatus)(status.as_ptr());
        msg
    };
    Err(backend_err(msg))
}

/// OrtValues this run owns, released when it ends however it ends.
struct Values(SmallVec<[*mut OrtValue; 4]>);

impl Drop for Values {
    fn drop(&mut self) {
        for &v in self.0.iter().filter(|v| !v.is_null()) {
            // SAFETY: each non-null pointer is a value ONNX Runtime created for this run and nothing else
            // releases it.
            unsafe { (ort::api().ReleaseValue)(v) };
        }
    }
}

/// What makes an input value: a value over the same bytes with the same type and shape is the same value (the
/// type and shape also give the bytes' length).
#[derive(PartialEq)]
struct InputKey {
    data: *const u8,
    dtype: DataType,
    shape: SmallVec<[i64; 4]>,
}

impl InputKey {
    fn of(t: &Tensor) -> InputKey {
        InputKey { data: t.data().as_ptr(), dtype: t.dtype(), shape: t.shape().into() }
    }
}

struct Cached {
    key: InputKey,
    value: *mut OrtValue,
}

impl Drop for Cached {
    fn drop(&mut self) {
        // SAFETY: the value was made for this entry by CreateTensorWithDataAsOrtValue and nothing else releases
        // it; a value over borrowed bytes never reads them when released.
        unsafe { (ort::api().ReleaseValue)(self.value) };
    }
}

/// A session's input values from its last run, reused by the next run over the same tensors (a stored reference
/// input, or the same keys run again): making and releasing a value costs about as much as the module's own
/// work around a tiny model's run. Only compared by address, type and shape, never read, once its tensor is gone.
#[derive(Default)]
pub(super) struct InputCache(SmallVec<[Cached; 4]>);

// SAFETY: the values are only used by the runner that owns the cache, by one thread at a time (`&mut`); ONNX
// Runtime values are not tied to the thread that made them, and the raw addresses are only compared.
unsafe impl Send for InputCache {}

impl Direct {
    /// None when some output is not a numeric or BOOL tensor, or a name holds a NUL (or on a big-endian
    /// target, where tensor bytes would need swapping).
    pub fn new(session: &Session) -> Option<Direct> {
        if cfg!(target_endian = "big") {
            return None;
        }
        let plain = |t: &ValueType| matches!(t, ValueType::Tensor { ty, .. } if data_type(*ty).is_some());
        if !session.outputs().iter().all(|o| plain(o.dtype())) {
            return None;
        }
        let names = |o: &[ort::value::Outlet]| -> Option<Vec<CString>> {
            o.iter().map(|o| CString::new(o.name()).ok()).collect()
        };
        let memory = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default).ok()?;
        Some(Direct { inputs: names(session.inputs())?, outputs: names(session.outputs())?, memory })
    }

    /// The run; None when an input cannot be handed over as it is (the caller takes `ort`'s path). The
    /// caller has checked the number of inputs.
    pub fn run(
        &self,
        session: &mut Session,
        cache: &mut InputCache,
        inputs: &[&Tensor],
        options: &RunOptions,
    ) -> Option<Result<Outputs>> {
        let handed_over =
            |t: &&Tensor| onnx_type(t.dtype()).is_some() && t.data().as_ptr().align_offset(t.dtype().elem_size()) == 0;
        if inputs.len() != self.inputs.len() || !inputs.iter().all(handed_over) {
            return None;
        }
        Some(self.run_unchecked(session, cache, inputs, options))
    }

    fn run_unchecked(
        &self,
        session: &mut Session,
        cache: &mut InputCache,
        inputs: &[&Tensor],
        options: &RunOptions,
    ) -> Result<Outputs> {
        let api = ort::api();
        cache.0.truncate(inputs.len());
        let copying = crate::clock::copy_clock::copying();
        for (i, t) in inputs.iter().enumerate() {
            let key = InputKey::of(t);
            if cache.0.get(i).is_some_and(|c| c.key == key) {
                continue;
            }
            let (shape, data) = (t.shape(), t.data());
            let mut v = ptr::null_mut();
            // SAFETY: `data` is the tensor's bytes, aligned for its element type (checked by `run`), of exactly
            // the length its shape and type give; ONNX Runtime only reads input values, and the value is used
            // only while a tensor of this type and shape has its bytes at this address (`InputKey`). The
            // memory info and shape are read during the call.
            check(unsafe {
                (api.CreateTensorWithDataAsOrtValue)(
                    self.memory.ptr(),
                    data.as_ptr().cast_mut().cast::<c_void>(),
                    data.len(),
                    shape.as_ptr(),
                    shape.len(),
                    onnx_type(t.dtype()).unwrap_or(Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED),
                    &mut v,
                )
            })?;
            let made = Cached { key, value: v };
            match cache.0.get_mut(i) {
                // The replaced value is released by `Cached`'s drop.
                Some(c) => *c = made,
                None => cache.0.push(made),
            }
        }
        drop(copying);
        let in_names: SmallVec<[_; 4]> = self.inputs.iter().map(|n| n.as_ptr()).collect();
        let out_names: SmallVec<[_; 4]> = self.outputs.iter().map(|n| n.as_ptr()).collect();
        let mut outs = Values(smallvec::smallvec![ptr::null_mut(); self.outputs.len()]);
        let in_values: SmallVec<[*const OrtValue; 4]> = cache.0.iter().map(|c| c.value.cast_const()).collect();
        // SAFETY: the session is this thread's alone (`&mut`); every array holds as many entries as its length
        // says, the names are NUL-terminated and live in `self`; ONNX Runtime fills `outs` with values this run
        // then owns (`Values` releases them).
        check(unsafe {
            (api.Run)(
                session.ptr().cast_mut(),
                options.ptr(),
                in_names.as_ptr(),
                in_values.as_ptr(),
                in_values.len(),
                out_names.as_ptr(),
                out_names.len(),
                outs.0.as_mut_ptr(),
            )
        })?;
        let _copying = crate::clock::copy_clock::copying();
        outs.0.iter().map(|&v| tensor_of(v)).collect()
    }
}

/// The output value `v` (a tensor, as the model's metadata says) copied into a tensor.
fn tensor_of(v: *mut OrtValue) -> Result<Tensor> {
    let api = ort::api();
    let mut ty = Onnx::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    let (mut dims, mut ndims): (*const i64, usize) = (ptr::null(), 0);
    // SAFETY: `v` is a live output value of this run; the dimensions it points to belong to the value and are
    // copied before it is released (a reference rather than an info object: nothing is allocated).
    let shape: SmallVec<[i64; 8]> = unsafe {
        check((api.GetTensorElementTypeAndShapeDataReference)(v, &mut ty, &mut dims, &mut ndims))?;
        if ndims == 0 || dims.is_null() {
            SmallVec::new()
        } else {
            SmallVec::from_slice(std::slice::from_raw_parts(dims, ndims))
        }
    };
    let dt = TYPES
        .iter()
        .find(|(_, o, _)| *o == ty)
        .map(|&(d, ..)| d)
        .ok_or_else(|| Error::Backend(format!("ONNX model returned a tensor of unsupported type {}", ty as i32)))?;
    let n = crate::tensor::element_count(dt, &shape)?;
    let mut data: *mut c_void = ptr::null_mut();
    // SAFETY: `v` is a live tensor value of `n` elements of `dt`; its data stays valid until the value is
    // released, after the copy.
    let bytes = unsafe {
        check((api.GetTensorMutableData)(v, &mut data))?;
        if n == 0 || data.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(data.cast::<u8>(), n * dt.elem_size())
        }
    };
    // Little-endian, as tensor data is (`Direct::new`).
    Tensor::from_blob(dt, &shape[..], bytes)
}

pub(super) fn backend_err(e: impl std::fmt::Display) -> Error {
    Error::Backend(redisai_wording(&e.to_string()))
}

/// ONNX Runtime's messages in the wording RedisAI's runtime (1.11) used, where a newer runtime reworded them:
/// clients and tests match substrings of these texts.
pub(super) fn redisai_wording(msg: &str) -> String {
    const REWORDED: &[(&str, &str)] =
        &[("Please fix either the inputs/outputs or the model.", "Please fix either the inputs or the model")];
    REWORDED.iter().fold(msg.to_string(), |m, (new, old)| m.replace(new, old))
}
