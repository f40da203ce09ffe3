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
#[cfg(feature = "torch")]
pub mod torch;
#[cfg(feature = "torch")]
pub mod torch_abi;

use crate::blob::Blob;
use std::sync::Arc;
use std::time::Instant;

use crate::backend_kind::BackendKind;
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

/// A model run's output tensors (a few: on the stack).
pub type Outputs = smallvec::SmallVec<[Tensor; 2]>;

/// A model ready to run. `run` may be called from several worker threads at once.
pub trait LoadedModel: Send + Sync {
    fn inputs(&self) -> &[String];
    fn outputs(&self) -> &[String];
    fn run(&self, inputs: &[&Tensor]) -> Result<Outputs>;

    /// Whether `run_within` stops a run that takes too long (a kill switch between ops): only such models
    /// run inline on Redis's main thread (exec/inline.rs).
    fn stops_early(&self) -> bool {
        false
    }

    /// `run` started `now`, stopped once `deadline` has passed: `None` then (the run had no effect; the caller
    /// queues it).
    fn run_within(&self, inputs: &[&Tensor], now: Instant, deadline: Instant) -> Option<Result<Outputs>> {
        let _ = (now, deadline);
        Some(self.run(inputs))
    }
}

/// A compiled script. `run` may be called from several worker threads at once.
pub trait LoadedScript: Send + Sync {
    fn run(
        &self,
        function: &[u8],
        style: CallStyle,
        tensors: &[&Tensor],
        keys: &[Vec<u8>],
        args: &[Vec<u8>],
    ) -> Result<Vec<Tensor>>;
}

/// Compiles a TorchScript script and checks its entry points (scripts only exist for TORCH).
pub fn load_script(spec: &ScriptSpec, device: &Device) -> Result<Box<dyn LoadedScript>> {
    #[cfg(feature = "torch")]
    {
        torch::load_script(spec, device)
    }
    #[cfg(not(feature = "torch"))]
    {
        let _ = (spec, device);
        Err(Error::Unavailable("Could not load backend TORCH: not built into this module".into()))
    }
}

/// Admits (crate::admission) and builds a model: every way a model comes in (store, RDB/AOF load, RESTORE,
/// replication) ends here, so a refused model never reaches a backend.
pub fn load_model(backend: BackendKind, blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    crate::admission::check(backend, &blob)?;
    match backend {
        #[cfg(feature = "onnx")]
        BackendKind::Onnx => onnx::load(blob, opts),
        #[cfg(feature = "tensorflow")]
        BackendKind::Tf => tensorflow::load(blob, opts),
        #[cfg(feature = "tflite")]
        BackendKind::TfLite => tflite::load(blob, opts),
        #[cfg(feature = "torch")]
        BackendKind::Torch => torch::load(blob, opts),
        // Reached only when a backend's feature is off.
        #[allow(unreachable_patterns)]
        other => {
            let _ = (blob, opts);
            Err(Error::Unavailable(format!("Could not load backend {}: not built into this module", other.name())))
        }
    }
}

/// `(INFO field, version)` of every backend loaded so far, for INFO's ai_backends_info.
pub fn loaded_versions() -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    #[cfg(feature = "tensorflow")]
    if let Some(ver) = tensorflow::version() {
        v.push(("TensorFlow_version", ver));
    }
    #[cfg(feature = "tflite")]
    if let Some(ver) = tflite::version() {
        v.push(("TensorFlowLite_version", ver));
    }
    #[cfg(feature = "torch")]
    if let Some(ver) = torch::version() {
        v.push(("Torch_version", ver));
    }
    #[cfg(feature = "onnx")]
    if let Some(ver) = onnx::version() {
        v.push(("onnxruntime_version", ver));
    }
    v
}

/// `AI.CONFIG LOADBACKEND <backend> <path>`.
pub fn load_backend_library(backend: BackendKind, path: &str) -> Result<()> {
    match backend {
        #[cfg(feature = "onnx")]
        BackendKind::Onnx => onnx::load_library(path),
        #[cfg(feature = "tensorflow")]
        BackendKind::Tf => tensorflow::load_library(path),
        #[cfg(feature = "tflite")]
        BackendKind::TfLite => tflite::load_library(path),
        #[cfg(feature = "torch")]
        BackendKind::Torch => torch::load_library(path),
        #[allow(unreachable_patterns)]
        _ => {
            let _ = path;
            Err(Error::Unavailable("error loading backend".into()))
        }
    }
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
