//! The backend seam: a backend turns a serialized model into a `LoadedModel` that runs tensors.

#[cfg(any(feature = "tensorflow", feature = "tflite"))]
mod dl;
#[cfg(feature = "onnx")]
pub mod onnx;
#[cfg(feature = "onnx")]
pub mod onnx_alloc;
#[cfg(feature = "onnx")]
mod onnx_run;
#[cfg(feature = "tensorflow")]
pub mod tensorflow;
#[cfg(feature = "tflite")]
pub mod tflite;
pub mod thread_name;
#[cfg(feature = "torch")]
pub mod torch;
#[cfg(feature = "torch")]
pub mod torch_abi;
#[cfg(feature = "torch")]
pub mod torch_host;

use crate::blob::Blob;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend_kind::BackendKind;
use crate::caller::Caller;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::script_spec::{CallStyle, ScriptSpec};
use crate::tensor::Tensor;

pub struct LoadOptions {
    pub device: Device,
    /// 0 = the backend's default.
    pub intra_op_threads: usize,
    pub inter_op_threads: usize,
    /// Names given at store time (TF needs them; other backends report their own).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

impl LoadOptions {
    /// A model's load options with the thread counts the configuration gives every model.
    pub fn from_config(device: Device, inputs: Vec<String>, outputs: Vec<String>) -> LoadOptions {
        let c = crate::config::CONFIG.read();
        LoadOptions {
            device,
            intra_op_threads: c.intra_op_threads(),
            inter_op_threads: c.inter_op_parallelism,
            inputs,
            outputs,
        }
    }
}

/// A model run's output tensors (a few: on the stack).
pub type Outputs = smallvec::SmallVec<[Tensor; 2]>;

/// One model run as the engine asks for it: the inputs and the kill switch's deadline. A backend reads nothing
/// else about a run from globals, so that a run can cross a process boundary as this value (docs/design.md,
/// "Isolated execution").
pub struct RunRequest<'a> {
    pub inputs: &'a [&'a Tensor],
    /// Whom the run acts for: the callbacks of a TorchScript model (`redis.execute`, …) use its ACL user.
    pub caller: &'a Caller,
    /// When the engine started the run.
    pub start: Instant,
    /// When the kill switch stops it: MODEL_EXECUTION_TIMEOUT after `start`, or the inline limit.
    pub deadline: Instant,
}

impl<'a> RunRequest<'a> {
    /// A run starting now, stopped after `limit`.
    pub fn new(inputs: &'a [&'a Tensor], caller: &'a Caller, limit: Duration) -> RunRequest<'a> {
        let start = Instant::now();
        RunRequest { inputs, caller, start, deadline: start + limit }
    }

    /// The time the run was given.
    pub fn limit(&self) -> Duration {
        self.deadline.saturating_duration_since(self.start)
    }

    /// The error of a run `backend` stopped at its deadline (the TORCH library writes the same text itself).
    pub fn cancelled(&self, backend: &str) -> Error {
        Error::TimedOut {
            text: format!(
                "{backend}: the run was cancelled after MODEL_EXECUTION_TIMEOUT ({} ms)",
                self.limit().as_millis()
            ),
            prefixed: false,
        }
    }
}

/// Milliseconds left until `deadline`, rounded up and at least 1 (backends that take a timeout, not a deadline:
/// 0 would mean "none" to some).
pub fn remaining_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    (left.as_micros().div_ceil(1000) as u64).max(1)
}

/// What a model run gives the engine back.
#[derive(Debug)]
pub struct RunReport {
    pub outputs: Outputs,
    /// µs spent copying the inputs in and the outputs out (AI.INFO's `copy_*`).
    pub copy_us: u64,
    /// µs the run took where it ran, when that is another process (the engine's clock would add the trip
    /// there and back); `None`: the engine times it.
    pub run_us: Option<u64>,
}

/// A model ready to run. `run` may be called from several worker threads at once. The engine calls `execute`
/// and `execute_within` (the seam: a request in, a report out); a backend in this process implements `run` and
/// `run_within`, and times its copies with `clock::copy_clock` on the calling thread.
pub trait LoadedModel: Send + Sync {
    fn inputs(&self) -> &[String];
    fn outputs(&self) -> &[String];
    /// Runs to the end, or until the deadline (then the kill switch's error).
    fn run(&self, req: &RunRequest) -> Result<Outputs>;

    /// Whether `run_within` stops a run that takes too long (a kill switch between ops): only such models
    /// run inline on Redis's main thread (exec/inline.rs).
    fn stops_early(&self) -> bool {
        false
    }

    /// `run`, but stopped once the deadline has passed gives `None` (the run had no effect; the caller queues
    /// it), and a model without a session at hand does not make one.
    fn run_within(&self, req: &RunRequest) -> Option<Result<Outputs>> {
        Some(self.run(req))
    }

    /// The run and what its copies took.
    fn execute(&self, req: &RunRequest) -> Result<RunReport> {
        let (result, copy_us) = crate::clock::copy_clock::measure(|| self.run(req));
        result.map(|outputs| RunReport { outputs, copy_us, run_us: None })
    }

    /// `run_within` and what its copies took.
    fn execute_within(&self, req: &RunRequest) -> Option<Result<RunReport>> {
        let (result, copy_us) = crate::clock::copy_clock::measure(|| self.run_within(req));
        result.map(|r| r.map(|outputs| RunReport { outputs, copy_us, run_us: None }))
    }

    /// Whether `post` may start the run without waiting for it (a model in a worker process).
    fn posts(&self) -> bool {
        false
    }

    /// `execute_within` (`within`: stopped at the deadline, it is `Stopped`) or `execute` without waiting: the
    /// request is on its way when this returns, and `done` gets what came of it later, on Redis's main thread
    /// (isolation/post.rs); `done` gets `NotPosted` at once when the run could not be started so.
    fn post(&self, _req: &RunRequest, _within: bool, done: PostDone) {
        done(Posted::NotPosted)
    }
}

/// What came of a posted run.
pub enum Posted {
    Ran(Result<RunReport>),
    /// Stopped at its deadline with no effect: the caller queues it.
    Stopped,
    NotPosted,
}

pub type PostDone = Box<dyn FnOnce(Posted) + Send>;

/// One call of a compiled script's function, as the engine asks for it.
pub struct ScriptRequest<'a> {
    pub function: &'a [u8],
    pub style: CallStyle,
    pub tensors: &'a [&'a Tensor],
    pub keys: &'a [Vec<u8>],
    pub args: &'a [Vec<u8>],
    /// Whom the call acts for (its callbacks' ACL user, database, read-only).
    pub caller: &'a Caller,
    /// MODEL_EXECUTION_TIMEOUT after the call's start.
    pub deadline: Instant,
}

/// What a script call gives the engine back.
#[derive(Debug)]
pub struct ScriptReport {
    pub outputs: Vec<Tensor>,
    /// µs spent copying its tensors in and its results out (AI.INFO's `copy_*`).
    pub copy_us: u64,
}

/// A compiled script. `run` may be called from several worker threads at once. The engine calls `execute` (a
/// request in, a report out); a backend in this process implements `run`, timing its copies on its thread.
pub trait LoadedScript: Send + Sync {
    fn run(&self, req: &ScriptRequest) -> Result<Vec<Tensor>>;

    /// The call and what its copies took.
    fn execute(&self, req: &ScriptRequest) -> Result<ScriptReport> {
        let (result, copy_us) = crate::clock::copy_clock::measure(|| self.run(req));
        result.map(|outputs| ScriptReport { outputs, copy_us })
    }
}

/// Compiles a script's source and checks its entry points.
pub type ScriptLoader = fn(&ScriptSpec, &Device) -> Result<Box<dyn LoadedScript>>;

/// What the module knows of one backend built into it: the one place that names the backends' modules, so
/// that what is built in is a table, not a `cfg` match at every use.
pub struct BackendEntry {
    pub kind: BackendKind,
    /// Its version's field in INFO's `ai_backends_info` (RedisAI's name).
    pub version_field: &'static str,
    /// The library's version, once it is loaded.
    pub version: fn() -> Option<String>,
    /// `AI.CONFIG LOADBACKEND <backend> <path>`.
    pub load_library: fn(&str) -> Result<()>,
    /// Opens the library from the load-time path or the default, as the first model would.
    pub open: fn() -> Result<()>,
    /// Builds an admitted model.
    pub load_model: fn(Blob, &LoadOptions) -> Result<Box<dyn LoadedModel>>,
    /// Compiles a script (TORCH only).
    pub load_script: Option<ScriptLoader>,
    /// What the backend adds to INFO besides its version, once loaded: `(section, field, value)`.
    pub info: fn() -> Vec<(&'static str, &'static str, u64)>,
}

fn no_info() -> Vec<(&'static str, &'static str, u64)> {
    Vec::new()
}

/// The backends built into this module, in the order RedisAI's INFO lists their versions.
pub static BACKENDS: &[BackendEntry] = &[
    #[cfg(feature = "tensorflow")]
    BackendEntry {
        kind: BackendKind::Tf,
        version_field: "TensorFlow_version",
        version: tensorflow::version,
        load_library: tensorflow::load_library,
        open: tensorflow::open_default,
        load_model: tensorflow::load,
        load_script: None,
        info: no_info,
    },
    #[cfg(feature = "tflite")]
    BackendEntry {
        kind: BackendKind::TfLite,
        version_field: "TensorFlowLite_version",
        version: tflite::version,
        load_library: tflite::load_library,
        open: tflite::open_default,
        load_model: tflite::load,
        load_script: None,
        info: tflite::info,
    },
    #[cfg(feature = "torch")]
    BackendEntry {
        kind: BackendKind::Torch,
        version_field: "Torch_version",
        version: torch::version,
        load_library: torch::load_library,
        open: torch::open_default,
        load_model: torch::load,
        load_script: Some(torch::load_script),
        info: no_info,
    },
    #[cfg(feature = "onnx")]
    BackendEntry {
        kind: BackendKind::Onnx,
        version_field: "onnxruntime_version",
        version: onnx::version,
        load_library: onnx::load_library,
        open: onnx::open_default,
        load_model: onnx::load,
        load_script: None,
        info: onnx::info,
    },
];

/// The entry of `kind`, or why there is none.
fn entry(kind: BackendKind) -> Result<&'static BackendEntry> {
    BACKENDS.iter().find(|b| b.kind == kind).ok_or_else(|| {
        Error::Unavailable(format!("Could not load backend {}: not built into this module", kind.name()))
    })
}

/// Compiles a TorchScript script and checks its entry points (scripts only exist for TORCH).
pub fn load_script(spec: &ScriptSpec, device: &Device) -> Result<Box<dyn LoadedScript>> {
    let load =
        entry(BackendKind::Torch)?.load_script.ok_or_else(|| Error::Internal("TORCH compiles no scripts".into()))?;
    thread_name::named(BackendKind::Torch, || load(spec, device))
}

/// Admits (crate::admission) and builds a model: every way a model comes in (store, RDB/AOF load, RESTORE,
/// replication) ends here, so a refused model never reaches a backend.
pub fn load_model(backend: BackendKind, blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    crate::admission::check(backend, &blob)?;
    let load = entry(backend)?.load_model;
    thread_name::named(backend, || load(blob, opts))
}

/// Opens `kind`'s library now (a worker does, before its sandbox goes in) and gives its version.
pub fn open_library(kind: BackendKind) -> Result<String> {
    let b = entry(kind)?;
    (b.open)()?;
    Ok((b.version)().unwrap_or_default())
}

/// `(INFO field, version)` of every backend loaded so far, for INFO's ai_backends_info.
pub fn loaded_versions() -> Vec<(&'static str, String)> {
    BACKENDS.iter().filter_map(|b| (b.version)().map(|v| (b.version_field, v))).collect()
}

/// What the loaded backends add to INFO's `section`: `(field, value)`.
pub fn info_fields(section: &str) -> Vec<(&'static str, u64)> {
    BACKENDS.iter().flat_map(|b| (b.info)()).filter(|(s, ..)| *s == section).map(|(_, f, v)| (f, v)).collect()
}

/// `AI.CONFIG LOADBACKEND <backend> <path>`.
pub fn load_backend_library(backend: BackendKind, path: &str) -> Result<()> {
    let b = entry(backend).map_err(|_| Error::Unavailable("error loading backend".into()))?;
    (b.load_library)(path)
}

/// RedisAI's check of the number of inputs a model got.
pub fn check_input_count(expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::Mismatch(format!("Expected {expected} inputs but got {got}")))
    }
}

/// Backend objects that serve one run at a time (ONNX Runtime sessions, LiteRT compiled models): a run takes
/// a free one, or makes one if none is free, and gives it back afterwards, so that workers run in parallel.
pub struct Pool<T>(parking_lot::Mutex<Vec<T>>);

impl<T> Pool<T> {
    pub fn new(first: Option<T>) -> Pool<T> {
        Pool(parking_lot::Mutex::new(first.into_iter().collect()))
    }

    pub fn give(&self, item: T) {
        self.0.lock().push(item);
    }

    /// `run` with a free object, or `None` when none is free (nothing is made).
    pub fn try_with<R>(&self, run: impl FnOnce(&mut T) -> R) -> Option<R> {
        let mut item = self.0.lock().pop()?;
        let result = run(&mut item);
        self.give(item);
        Some(result)
    }

    /// `run` with a free object (`make` one when none is free).
    pub fn with<R>(&self, make: impl FnOnce() -> Result<T>, run: impl FnOnce(&mut T) -> R) -> Result<R> {
        let pooled = self.0.lock().pop();
        let mut item = match pooled {
            Some(item) => item,
            None => make()?,
        };
        let result = run(&mut item);
        self.give(item);
        Ok(result)
    }
}

/// A backend library, opened once: at first use (from the load-time path or a default) or by
/// `AI.CONFIG LOADBACKEND`. A failed open leaves the slot empty, so a later attempt may succeed.
pub struct LibrarySlot<T> {
    backend: &'static str,
    slot: parking_lot::Mutex<Option<Arc<T>>>,
}

impl<T> LibrarySlot<T> {
    pub const fn new(backend: &'static str) -> Self {
        LibrarySlot { backend, slot: parking_lot::Mutex::new(None) }
    }

    /// The library, opened the first time from the load-time path (`<BACKEND> <path>`), else RedisAI's layout
    /// under BACKENDSPATH (`redisai_<backend>/redisai_<backend>.so`, what `make dist` ships) if it is there,
    /// else `default` (the build's backend cache).
    pub fn get(&self, default: Option<String>, open: impl FnOnce(&str) -> Result<T>) -> Result<Arc<T>> {
        let mut slot = self.slot.lock();
        if let Some(lib) = slot.as_ref() {
            return Ok(lib.clone());
        }
        let path = given_path(self.backend).or_else(|| layout_path(self.backend)).or(default).ok_or_else(|| {
            Error::Unavailable(format!(
                "Could not load backend {0}: no library path (load-time argument {0} <path>)",
                self.backend
            ))
        })?;
        if let Some(spec) = not_installed(&path) {
            return Err(Error::Unavailable(format!(
                "Could not load backend {}: it is not installed (pip install '{spec}', then restart the server)",
                self.backend
            )));
        }
        let lib = Arc::new(open(&path)?);
        *slot = Some(lib.clone());
        Ok(lib)
    }

    /// `AI.CONFIG LOADBACKEND <backend> <path>`: RedisAI's error if one is loaded already or it fails.
    pub fn load(&self, path: &str, open: impl FnOnce(&str) -> Result<T>) -> Result<()> {
        let mut slot = self.slot.lock();
        let fail = || Error::Unavailable("error loading backend".into());
        if slot.is_some() {
            return Err(fail());
        }
        *slot = Some(Arc::new(open(&resolve_path(path)).map_err(|_| fail())?));
        Ok(())
    }

    pub fn loaded(&self) -> Option<Arc<T>> {
        self.slot.lock().clone()
    }
}

/// The wheel's launcher passes a backend that pip has not installed as a path that does not exist and names the
/// fix, `<...>/backend-not-installed/pip-install-<requirement>/<library>` (python/redisai_rs): the requirement to
/// tell the user, when the path is such a one and nothing is there.
fn not_installed(path: &str) -> Option<&str> {
    let mut parts = path.split('/').skip_while(|p| *p != "backend-not-installed").skip(1);
    let spec = parts.next()?.strip_prefix("pip-install-")?;
    let wellformed = !spec.is_empty() && parts.next().is_some_and(|lib| !lib.is_empty()) && parts.next().is_none();
    (wellformed && !std::path::Path::new(path).exists()).then_some(spec)
}

/// RedisAI's name for a backend's directory and library under BACKENDSPATH.
pub fn layout_name(backend: &str) -> Option<&'static str> {
    match backend {
        "TF" => Some("redisai_tensorflow"),
        "TFLITE" => Some("redisai_tflite"),
        "TORCH" => Some("redisai_torch"),
        "ONNX" => Some("redisai_onnxruntime"),
        _ => None,
    }
}

/// `<BACKENDSPATH>/redisai_<backend>/redisai_<backend>.so`, if that file exists.
fn layout_path(backend: &str) -> Option<String> {
    let name = layout_name(backend)?;
    let path = resolve_path(&format!("{name}/{name}.so"));
    std::path::Path::new(&path).is_file().then_some(path)
}

/// The library path given at load time for `backend`, if any.
fn given_path(backend: &str) -> Option<String> {
    let given =
        crate::config::CONFIG.read().backend_libs.iter().rev().find(|(b, _)| b == backend).map(|(_, p)| p.clone());
    given.map(|p| resolve_path(&p))
}

/// A relative backend path is taken relative to BACKENDSPATH, as RedisAI does.
pub fn resolve_path(path: &str) -> String {
    match &crate::config::CONFIG.read().backends_path {
        Some(base) if !path.starts_with('/') => format!("{base}/{path}"),
        _ => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::not_installed;

    #[test]
    fn the_launcher_s_missing_backend_path_names_the_requirement() {
        let p = "/v/lib/python3.11/site-packages/redisai_rs/backend-not-installed/pip-install-redisai-rs[torch]/libtorch_cpu.so";
        assert_eq!(not_installed(p), Some("redisai-rs[torch]"));
        assert_eq!(
            not_installed("/x/backend-not-installed/pip-install-redisai-rs/libonnxruntime.so"),
            Some("redisai-rs")
        );
        assert_eq!(not_installed("/usr/lib/libtorch_cpu.so"), None, "any other missing path keeps the loader's error");
        assert_eq!(not_installed("/x/backend-not-installed/redisai-rs/lib.so"), None);
        assert_eq!(not_installed("/x/backend-not-installed/pip-install-/lib.so"), None);
        assert_eq!(not_installed("/x/backend-not-installed/pip-install-a/b/lib.so"), None);
        assert_eq!(not_installed("/x/backend-not-installed/pip-install-a"), None);
    }
}
