//! The backend seam: a backend turns a serialized model into a `LoadedModel` that runs tensors.

#[cfg(feature = "onnx")]
pub mod onnx;
#[cfg(feature = "tensorflow")]
pub mod tensorflow;
#[cfg(feature = "torch")]
pub mod torch;
#[cfg(feature = "torch")]
pub mod torch_abi;

use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::model::BackendKind;
use crate::script::{CallStyle, ScriptSpec};
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

/// A model ready to run. `run` may be called from several worker threads at once.
pub trait LoadedModel: Send + Sync {
    fn inputs(&self) -> &[String];
    fn outputs(&self) -> &[String];
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;
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
        Err(Error::Generic("Could not load backend TORCH: not built into this module".into()))
    }
}

pub fn load_model(backend: BackendKind, blob: Arc<[u8]>, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    match backend {
        #[cfg(feature = "onnx")]
        BackendKind::Onnx => onnx::load(blob, opts),
        #[cfg(feature = "tensorflow")]
        BackendKind::Tf => tensorflow::load(blob, opts),
        #[cfg(feature = "torch")]
        BackendKind::Torch => torch::load(blob, opts),
        other => {
            let _ = (blob, opts);
            Err(Error::Generic(format!("Could not load backend {}: not built into this module", other.name())))
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
        #[cfg(feature = "torch")]
        BackendKind::Torch => torch::load_library(path),
        _ => {
            let _ = path;
            Err(Error::Generic("error loading backend".into()))
        }
    }
}

/// A relative backend path is taken relative to BACKENDSPATH, as RedisAI does.
pub fn resolve_path(path: &str) -> String {
    match &crate::config::CONFIG.read().backends_path {
        Some(base) if !path.starts_with('/') => format!("{base}/{path}"),
        _ => path.to_string(),
    }
}
