//! ONNX Runtime through `ort` with `load-dynamic`: the library is opened at first use, so the module
//! loads (and serves everything else) without it.

use crate::backend_kind::BackendKind;
use crate::blob::Blob;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use ort::environment::Environment;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, ValueType};

use super::onnx_run::{backend_err, Direct, InputCache};
use super::{check_input_count, onnx_alloc, LibrarySlot, LoadOptions, LoadedModel, Outputs, Pool, RunRequest};
use crate::clock::watchdog;
use crate::config::CONFIG;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};

/// The library link the fetch script makes in the cache (`scripts/backends.manifest`, which alone names the
/// version).
const LIB_NAME: &str = "libonnxruntime.so";

struct Runtime {
    env: Environment,
    version: String,
}

static RUNTIME: LibrarySlot<Runtime> = LibrarySlot::new("ONNX");

fn open(path: &str) -> Result<Runtime> {
    let fail = |why: String| Error::Unavailable(format!("Could not load backend ONNX from {path}: {why}"));
    let env = ort::init_from(path)
        .map_err(|e| fail(e.to_string()))?
        .with_name("redisai")
        .build()
        .map_err(|e| fail(e.to_string()))?;
    super::onnx_alloc::register(&env, CONFIG.read().backend_memory_bound()).map_err(fail)?;
    let version = library_version(path).unwrap_or_else(|| "unknown".into());
    Ok(Runtime { env, version })
}

/// The runtime; without a load-time path, the library in the build's backend cache (set by `make build`).
fn runtime() -> Result<Arc<Runtime>> {
    RUNTIME.get(option_env!("REDISAI_ONNX_LIB_DIR").map(|d| format!("{d}/{LIB_NAME}")), open)
}

/// Opens the library where `runtime` would (a worker, before its sandbox goes in).
pub fn open_default() -> Result<()> {
    runtime().map(|_| ())
}

/// `AI.CONFIG LOADBACKEND ONNX <path>` (one ONNX Runtime per process).
pub fn load_library(path: &str) -> Result<()> {
    RUNTIME.load(path, open)
}

pub fn version() -> Option<String> {
    RUNTIME.loaded().map(|r| r.version.clone())
}

/// INFO's `ai_onnxruntime_memory` and `ai_onnxruntime_memory_access_num` (RedisAI's), once ONNX Runtime is loaded.
pub fn info() -> Vec<(&'static str, &'static str, u64)> {
    if RUNTIME.loaded().is_none() {
        return Vec::new();
    }
    let (memory, accesses) = onnx_alloc::counters();
    vec![("backends_info", "onnxruntime_memory", memory), ("backends_info", "onnxruntime_memory_access_num", accesses)]
}

/// Asks the already-opened library for its version (`OrtGetApiBase()->GetVersionString()`).
fn library_version(path: &str) -> Option<String> {
    #[repr(C)]
    struct OrtApiBase {
        get_api: unsafe extern "C" fn(u32) -> *const c_void,
        get_version_string: unsafe extern "C" fn() -> *const c_char,
    }
    let cpath = CString::new(path).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle if ort already opened this file, so nothing new is loaded;
    // OrtGetApiBase has this C signature and returns a pointer to a static struct whose
    // GetVersionString returns a static NUL-terminated string.
    unsafe {
        let h = libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let sym = libc::dlsym(h, c"OrtGetApiBase".as_ptr());
        let v = if sym.is_null() {
            None
        } else {
            let get_base: unsafe extern "C" fn() -> *const OrtApiBase = std::mem::transmute(sym);
            let base = get_base();
            (!base.is_null()).then(|| CStr::from_ptr(((*base).get_version_string)()).to_string_lossy().into_owned())
        };
        libc::dlclose(h);
        v
    }
}

pub struct OnnxModel {
    blob: Blob,
    runtime: Arc<Runtime>,
    intra: usize,
    inter: usize,
    gpu: Option<i32>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    /// `Session::run` needs `&mut`: each concurrent run takes a session from here (or makes one).
    pool: Pool<Runner>,
    /// The C API path of onnx_run.rs, when the model's outputs allow it.
    direct: Option<Direct>,
}

/// A session with its kill switch and its last run's input values.
struct Runner {
    session: Session,
    stop: Arc<Stop>,
    inputs: InputCache,
}

pub fn load(blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    let runtime = runtime()?;
    let gpu = match opts.device.kind {
        DeviceKind::Gpu => Some(opts.device.id.unwrap_or(0) as i32),
        DeviceKind::Cpu => None,
    };
    let mut m = OnnxModel {
        blob,
        runtime,
        intra: opts.intra_op_threads,
        inter: opts.inter_op_threads,
        gpu,
        inputs: Vec::new(),
        outputs: Vec::new(),
        pool: Pool::new(None),
        direct: None,
    };
    let runner = m.new_runner()?;
    m.inputs = runner.session.inputs().iter().map(|o| o.name().to_string()).collect();
    m.outputs = runner.session.outputs().iter().map(|o| o.name().to_string()).collect();
    m.direct = Direct::new(&runner.session);
    m.pool.give(runner);
    Ok(Box::new(m))
}

impl OnnxModel {
    fn new_runner(&self) -> Result<Runner> {
        Ok(Runner { session: self.new_session()?, stop: Arc::new(Stop::new()?), inputs: InputCache::default() })
    }

    fn new_session(&self) -> Result<Session> {
        // The intra-op pool's threads spin briefly before they block: a thread that blocks at once costs each of
        // a run's parallel sections a wake-up (2x a compute-bound model's latency at one row). Their spin is
        // bounded, so an idle server still costs nothing. `session.force_spinning_stop` (stop spinning when a run
        // returns) was measured worse on both sides: the next run's first sections wake sleeping threads again,
        // and PING answered 7x slower between runs (docs/benchmarks.md, "Thread pools"). The inter-op pool
        // exists only in parallel execution mode, which the module does not use.
        let mut b = Session::builder(&self.runtime.env).map_err(backend_err)?;
        b = b.with_env_allocators().map_err(backend_err)?;
        b = b.with_intra_op_spinning(true).map_err(backend_err)?;
        b = b.with_inter_op_spinning(false).map_err(backend_err)?;
        if self.intra > 0 {
            b = b.with_intra_threads(self.intra).map_err(backend_err)?;
        }
        if self.inter > 0 {
            b = b.with_inter_threads(self.inter).map_err(backend_err)?;
        }
        if let Some(id) = self.gpu {
            let cuda = ort::ep::CUDA::default().with_device_id(id).build().error_on_failure();
            b = b
                .with_execution_providers([cuda])
                .map_err(|_| Error::Unavailable("GPU requested but ONNX couldn't find CUDA".into()))?;
        }
        let before = onnx_alloc::overruns();
        // A session made for a second concurrent run is made on a queue's worker: its pool is named, as at load.
        let session = super::thread_name::named(BackendKind::Onnx, || b.commit_from_memory(&self.blob));
        if session.is_err() && onnx_alloc::overruns() > before {
            return Err(Error::refused(format!("Exception during initialization: {}", onnx_alloc::LIMIT_ERROR)));
        }
        session.map_err(backend_err)
    }
}

impl LoadedModel for OnnxModel {
    fn inputs(&self) -> &[String] {
        &self.inputs
    }
    fn outputs(&self) -> &[String] {
        &self.outputs
    }

    fn run(&self, req: &RunRequest) -> Result<Outputs> {
        check_input_count(self.inputs.len(), req.inputs.len())?;
        let limit = req.limit();
        // The limit counts from the run's start, once a session is at hand (making one is not the run).
        self.pool.with(
            || self.new_runner(),
            |runner| {
                let now = Instant::now();
                match self.run_on(runner, req.inputs, now, now + limit) {
                    (Err(e), true) => Err(e.timed_out()),
                    (result, _) => result,
                }
            },
        )?
    }

    fn stops_early(&self) -> bool {
        true
    }

    /// Only with a session already built (building one would take the main thread far past the deadline).
    fn run_within(&self, req: &RunRequest) -> Option<Result<Outputs>> {
        if let Err(e) = check_input_count(self.inputs.len(), req.inputs.len()) {
            return Some(Err(e));
        }
        let (result, stopped) =
            self.pool.try_with(|runner| self.run_on(runner, req.inputs, req.start, req.deadline))?;
        (!stopped).then_some(result)
    }
}

/// A run's kill switch: the watchdog sets ONNX Runtime's terminate flag. Its RunOptions is reused from run to
/// run (making one costs a tiny model a tenth of its run). The watchdog may call a run's callback late, while
/// the runner's next run is going: each run has a number, and a callback only stops the run it was made for.
struct Stop {
    options: RunOptions,
    state: Mutex<Armed>,
}

#[derive(Default)]
struct Armed {
    run: u64,
    fired: bool,
}

impl Stop {
    fn new() -> Result<Stop> {
        // A failed run's error goes to its client; ONNX Runtime logging it too (at error level, e.g. every run
        // the kill switch stopped) would only fill the server's output.
        let mut options = RunOptions::new().map_err(backend_err)?;
        options.set_log_level(ort::logging::LogLevel::Fatal).map_err(backend_err)?;
        Ok(Stop { options, state: Mutex::new(Armed::default()) })
    }

    /// Readies the flag for a new run, whose number it returns.
    fn arm(&self) -> Result<u64> {
        let mut st = self.state.lock();
        st.run += 1;
        // ONNX Runtime's flag is only ever set together with `fired`, under this lock.
        if st.fired {
            self.options.unterminate().map_err(backend_err)?;
            st.fired = false;
        }
        Ok(st.run)
    }

    fn fired(&self) -> bool {
        self.state.lock().fired
    }
}

impl watchdog::Expire for Stop {
    fn expire(&self, run: u64) {
        let mut st = self.state.lock();
        if st.run == run {
            st.fired = true;
            let _ = self.options.terminate();
        }
    }
}

impl OnnxModel {
    fn values<'t>(&self, inputs: &[&'t Tensor]) -> Result<smallvec::SmallVec<[SessionInputValue<'t>; 4]>> {
        inputs.iter().map(|t| to_value(t)).collect()
    }

    /// One run, told to stop by the watchdog once `deadline` has passed (the kill switch: MODEL_EXECUTION_TIMEOUT,
    /// or the inline limit); with whether the watchdog fired. The number of inputs is checked.
    fn run_on(
        &self,
        runner: &mut Runner,
        inputs: &[&Tensor],
        now: Instant,
        deadline: Instant,
    ) -> (Result<Outputs>, bool) {
        let run = match runner.stop.arm() {
            Ok(run) => run,
            Err(e) => return (Err(e), false),
        };
        let watch = watchdog::watch(now, deadline, runner.stop.clone(), run);
        let result = self.run_once(runner, inputs);
        drop(watch);
        (result, runner.stop.fired())
    }

    fn run_once(&self, runner: &mut Runner, inputs: &[&Tensor]) -> Result<Outputs> {
        let (session, options) = (&mut runner.session, &runner.stop.options);
        let before = onnx_alloc::overruns();
        let outs = match self.direct.as_ref().and_then(|d| d.run(session, &mut runner.inputs, inputs, options)) {
            Some(outs) => outs,
            None => {
                let values = {
                    let _copying = crate::clock::copy_clock::copying();
                    self.values(inputs)
                };
                values.and_then(|values| {
                    let outs = session.run_with_options(&values[..], options).map_err(backend_err)?;
                    let _copying = crate::clock::copy_clock::copying();
                    outs.values().map(|v| from_value(&v)).collect::<Result<Outputs>>()
                })
            }
        };
        // A refused allocation fails the run (ONNX Runtime reports std::bad_alloc): RedisAI's text says why. The
        // count is the process's, so only a failed run reads it: another run's refusal must not fail this one.
        if outs.is_err() && onnx_alloc::overruns() > before {
            return Err(Error::refused(onnx_alloc::LIMIT_ERROR));
        }
        outs
    }
}

/// An input value over the tensor's own bytes where their alignment allows (no copy), else over a copy.
fn to_value(t: &Tensor) -> Result<SessionInputValue<'_>> {
    use ort::value::{Tensor as OrtTensor, TensorRef};
    let shape = t.shape();
    let d = t.data();
    macro_rules! prim {
        ($ty:ty) => {{
            match bytemuck::try_cast_slice::<u8, $ty>(d) {
                // Tensor data is little-endian, as ONNX Runtime's on these targets.
                Ok(view) if cfg!(target_endian = "little") => {
                    TensorRef::from_array_view((shape, view)).map(|r| SessionInputValue::from(r.into_dyn()))
                }
                _ => {
                    let n = std::mem::size_of::<$ty>();
                    let v: Vec<$ty> =
                        d.chunks_exact(n).map(|c| <$ty>::from_le_bytes(c.try_into().unwrap_or_default())).collect();
                    OrtTensor::from_array((shape.to_vec(), v)).map(|t| SessionInputValue::from(t.into_dyn()))
                }
            }
        }};
    }
    let v = match t.dtype() {
        DataType::Float => prim!(f32),
        DataType::Double => prim!(f64),
        DataType::Int8 => prim!(i8),
        DataType::Int16 => prim!(i16),
        DataType::Int32 => prim!(i32),
        DataType::Int64 => prim!(i64),
        DataType::Uint8 => prim!(u8),
        DataType::Uint16 => prim!(u16),
        // BOOL bytes are 0 or 1 (checked when the tensor was made): ONNX's bool layout.
        DataType::Bool => match bytemuck::checked::try_cast_slice::<u8, bool>(d) {
            Ok(view) => TensorRef::from_array_view((shape, view)).map(|r| SessionInputValue::from(r.into_dyn())),
            Err(_) => OrtTensor::from_array((shape.to_vec(), d.iter().map(|&b| b != 0).collect::<Vec<bool>>()))
                .map(|t| SessionInputValue::from(t.into_dyn())),
        },
        DataType::String => {
            let strings: Vec<String> =
                (0..t.len()).map(|i| String::from_utf8_lossy(t.string_at(i)).into_owned()).collect();
            OrtTensor::from_string_array((shape.to_vec(), strings.as_slice()))
                .map(|t| SessionInputValue::from(t.into_dyn()))
        }
    };
    v.map_err(backend_err)
}

fn from_value(v: &DynValue) -> Result<Tensor> {
    let ty = match v.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        ValueType::Sequence(inner) if matches!(**inner, ValueType::Map { .. }) => return probabilities(v),
        _ => return Err(Error::Backend("ONNX model returned a non-tensor output".into())),
    };
    macro_rules! prim {
        ($ty:ty, $dt:expr) => {{
            let (shape, data) = v.try_extract_tensor::<$ty>().map_err(backend_err)?;
            if cfg!(target_endian = "little") {
                Tensor::from_blob($dt, &shape[..], bytemuck::cast_slice(data))
            } else {
                let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
                Tensor::from_blob($dt, &shape[..], &bytes)
            }
        }};
    }
    match ty {
        TensorElementType::Float32 => prim!(f32, DataType::Float),
        TensorElementType::Float64 => prim!(f64, DataType::Double),
        TensorElementType::Int8 => prim!(i8, DataType::Int8),
        TensorElementType::Int16 => prim!(i16, DataType::Int16),
        TensorElementType::Int32 => prim!(i32, DataType::Int32),
        TensorElementType::Int64 => prim!(i64, DataType::Int64),
        TensorElementType::Uint8 => prim!(u8, DataType::Uint8),
        TensorElementType::Uint16 => prim!(u16, DataType::Uint16),
        TensorElementType::Bool => {
            let (shape, data) = v.try_extract_tensor::<bool>().map_err(backend_err)?;
            // A `bool` is one byte, 0 or 1: the BOOL tensor layout.
            Tensor::from_blob(DataType::Bool, &shape[..], bytemuck::cast_slice::<bool, u8>(data))
        }
        TensorElementType::String => {
            let (shape, strings) = v.try_extract_strings().map_err(backend_err)?;
            let mut bytes = Vec::new();
            for s in &strings {
                bytes.extend_from_slice(s.as_bytes());
                bytes.push(0);
            }
            Tensor::from_blob(DataType::String, &shape[..], &bytes)
        }
        other => Err(Error::Backend(format!("ONNX model returned a tensor of unsupported type {other:?}"))),
    }
}

/// A sequence of maps from class to probability (scikit-learn classifiers converted with `ZipMap`) as a FLOAT
/// tensor [N, classes]: row i is map i, classes in ONNX Runtime's map order (ascending keys, the order of
/// scikit-learn's `classes_`). RedisAI skipped such outputs; its users then had to convert without ZipMap.
fn probabilities(v: &DynValue) -> Result<Tensor> {
    let maps = v.try_extract_sequence::<ort::value::DynMapValueType>().map_err(backend_err)?;
    let mut classes: Option<Vec<String>> = None;
    let mut data = Vec::new();
    for m in &maps {
        let ValueType::Map { key, value } = m.dtype() else {
            return Err(Error::Backend("ONNX model returned a non-tensor output".into()));
        };
        let row: Vec<(String, f32)> = match (key, value) {
            (TensorElementType::Int64, TensorElementType::Float32) => m
                .try_extract_key_values::<i64, f32>()
                .map_err(backend_err)?
                .into_iter()
                .map(|(k, p)| (k.to_string(), p))
                .collect(),
            (TensorElementType::String, TensorElementType::Float32) => {
                m.try_extract_key_values::<String, f32>().map_err(backend_err)?
            }
            _ => {
                return Err(Error::Backend(format!(
                    "ONNX model returned a map of {key} to {value}; only maps to float probabilities are supported"
                )))
            }
        };
        let keys: Vec<String> = row.iter().map(|(k, _)| k.clone()).collect();
        match &classes {
            Some(c) if *c != keys => {
                return Err(Error::Backend("ONNX model returned probability maps with different classes".into()))
            }
            Some(_) => {}
            None => classes = Some(keys),
        }
        data.extend(row.iter().flat_map(|(_, p)| p.to_le_bytes()));
    }
    let width = classes.map_or(0, |c| c.len());
    Tensor::from_blob(DataType::Float, vec![maps.len() as i64, width as i64], &data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_keep_redisais_wording() {
        assert_eq!(
            crate::backends::onnx_run::redisai_wording(
                "Invalid rank for input: X Got: 1 Expected: 2 Please fix either the inputs/outputs or the model."
            ),
            "Invalid rank for input: X Got: 1 Expected: 2 Please fix either the inputs or the model"
        );
    }
}
