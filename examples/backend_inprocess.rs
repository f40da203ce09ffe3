//! The in-process baseline of `bench/bench.py`'s latency table: one backend running a model (or a TorchScript
//! function) through the module's own seam (`backends::load_model` / `load_script`, then `run`), with the load
//! options and thread defaults the module uses, in a process without Redis. The module's round trip minus this
//! is what Redis, the queue, the copies in and out and the reply add.
//!
//! Usage: `backend_inprocess <ONNX|TF|TFLITE|TORCH> <file> <rows> <cols> <runs> [key=value ...]`, keys: `lib=<path>`
//! (the backend library: ONNX/TF/TFLITE default to the build's cache; TORCH needs it, target/release/
//! libredisai_torch.so), `inputs=a,b` / `outputs=y` (TF), `function=f` (a TorchScript script: <file> is its
//! source, `f` an entry point), `intra=N` (INTRA_OP_PARALLELISM), `gap_us=N` (sleep N µs before each timed run, as a
//! worker waits between a lone client's requests: caches cool meanwhile). Every input is FLOAT [rows, cols], but a
//! script's second, the weights [cols, cols].
//! Prints `p50_us <x> p99_us <y>`. Built with the system allocator (there is no Redis to allocate from):
//! `cargo build --release --features system-alloc --target-dir target/leakcheck --example backend_inprocess`
//! (`make bench` does).
use std::sync::Arc;
use std::time::Instant;

use redisai::backend_kind::BackendKind;
use redisai::backends::{self, LoadOptions, RunRequest, ScriptRequest};
use redisai::caller::Caller;
use redisai::config::CONFIG;
use redisai::device::Device;
use redisai::script_spec::{CallStyle, ScriptSpec};
use redisai::tensor::{DataType, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn floats(rows: i64, cols: i64, seed: u32) -> Res<Tensor> {
    let data: Vec<u8> =
        (0..rows * cols).flat_map(|i| (((i as u32 ^ seed) % 97) as f32 / 97.0 - 0.5).to_le_bytes()).collect();
    Ok(Tensor::from_blob(DataType::Float, [rows, cols], &data)?)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, backend, file, rows, cols, runs, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: backend_inprocess <ONNX|TF|TFLITE|TORCH> <file> <rows> <cols> <runs> [key=value ...]".into()
        );
    };
    let (rows, cols, runs): (i64, i64, usize) = (rows.parse()?, cols.parse()?, runs.parse()?);
    let opt = |key: &str| rest.iter().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string));
    let names = |key: &str| opt(key).map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default();
    let kind = BackendKind::parse(backend.as_bytes())?;
    if let Some(lib) = opt("lib") {
        CONFIG.write().backend_libs.push((kind.name().to_string(), lib));
    }
    if let Some(n) = opt("intra") {
        CONFIG.write().intra_op_parallelism = n.parse()?;
    }
    let device = Device::parse(b"CPU")?;
    // MODEL_EXECUTION_TIMEOUT's default, as the module gives each run.
    let limit = CONFIG.read().execution_limit();
    let run: Box<dyn Fn() -> Res<()>> = if let Some(function) = opt("function") {
        let spec = ScriptSpec {
            device_name: "CPU".into(),
            tag: Vec::new(),
            source: std::fs::read_to_string(file)?,
            entry_points: vec![function.clone()],
        };
        let script = backends::load_script(&spec, &device)?;
        let (x, w) = (floats(rows, cols, 1)?, floats(cols, cols, 2)?);
        Box::new(move || {
            let deadline = std::time::Instant::now() + limit;
            let tensors = [&x, &w];
            let call = ScriptRequest {
                function: function.as_bytes(),
                style: CallStyle::EntryPoint,
                tensors: &tensors,
                keys: &[],
                args: &[],
                caller: &Caller::default(),
                deadline,
            };
            script.run(&call)?;
            Ok(())
        })
    } else {
        let opts = LoadOptions::from_config(device, names("inputs"), names("outputs"));
        let model = backends::load_model(kind, Arc::new(std::fs::read(file)?), &opts)?;
        let inputs = (0..model.inputs().len() as u32).map(|i| floats(rows, cols, i)).collect::<Res<Vec<_>>>()?;
        Box::new(move || {
            let refs: Vec<&Tensor> = inputs.iter().collect();
            model.run(&RunRequest::new(&refs, &Caller::default(), limit))?;
            Ok(())
        })
    };
    for _ in 0..runs.div_ceil(10).max(3) {
        run()?; // warm-up: first runs allocate and fill caches
    }
    let gap = opt("gap_us").map(|v| v.parse()).transpose()?.map(std::time::Duration::from_micros);
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        if let Some(g) = gap {
            std::thread::sleep(g);
        }
        let t = Instant::now();
        run()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!("p50_us {:.1} p99_us {:.1}", at(0.5), at(0.99));
    Ok(())
}
