//! The in-process baseline of `bench/bench.py`: ONNX Runtime's own time for one run of a model (its input
//! values made per run, as the module does per request), with the session options the module uses (no
//! spinning, default thread counts), without Redis.
//! Usage: `ort_inprocess <libonnxruntime.so> <model.onnx> <rows> <runs>`. Every input is FLOAT, its free
//! dimensions `rows` (the first) and 2 (the others); prints `p50_us <n>`.
use std::time::Instant;

use ort::session::{Session, SessionInputValue};
use ort::value::{Tensor, ValueType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, lib, model, rows, runs] = args.as_slice() else {
        return Err("usage: ort_inprocess <libonnxruntime.so> <model.onnx> <rows> <runs>".into());
    };
    let (rows, runs): (i64, usize) = (rows.parse()?, runs.parse()?);
    let env = ort::init_from(lib)?.with_name("bench").build()?;
    let mut session = Session::builder(&env)?
        .with_intra_op_spinning(false)?
        .with_inter_op_spinning(false)?
        .commit_from_file(model)?;
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
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs + runs / 10 {
        let t0 = Instant::now();
        let inputs: Vec<SessionInputValue> = shapes
            .iter()
            .zip(&data)
            .map(|(s, d)| Tensor::from_array((s.clone(), d.clone())).map(Into::into))
            .collect::<Result<_, _>>()?;
        let outputs = session.run(inputs.as_slice())?;
        let (_, y) = outputs[0].try_extract_tensor::<f32>()?;
        std::hint::black_box(y);
        drop(outputs);
        if i >= runs / 10 {
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    println!("p50_us {:.2}", times[times.len() / 2]);
    Ok(())
}
