//! TORCH models through `libredisai_torch.so` (crate `torch/`), opened at first use: the module itself never
//! links libtorch, so it loads fast and without it. The ABI is `torch_abi.rs`.

use crate::blob::Blob;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

use libloading::Library;

use super::torch_abi::{self as abi, StrView, TensorOut, TensorView};
use super::{LibrarySlot, LoadOptions, LoadedModel, LoadedScript, Outputs, RunRequest, ScriptRequest};
use crate::config::CONFIG;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::script_spec::{CallStyle, ScriptSpec};
use crate::tensor::{DataType, Tensor};

pub const LIB_NAME: &str = "libredisai_torch.so";

/// The backend's entry points; valid while `_lib` lives (it is never unloaded).
pub struct Backend {
    _lib: Library,
    version: String,
    model_load: abi::ModelLoadFn,
    model_run: abi::ModelRunFn,
    model_free: abi::FreeFn,
    pub script_compile: abi::ScriptCompileFn,
    pub script_check_entry: abi::ScriptCheckEntryFn,
    pub script_run: abi::ScriptRunFn,
    pub script_free: abi::FreeFn,
    free_tensors: abi::FreeTensorsFn,
    free_string: abi::FreeStringFn,
    memory: abi::MemoryFn,
}

static BACKEND: LibrarySlot<Backend> = LibrarySlot::new("TORCH");

/// The callbacks scripts use to reach Redis (`redis.execute` …), given by the Redis layer at load time.
static HOST: std::sync::OnceLock<abi::HostApi> = std::sync::OnceLock::new();

pub fn set_host(host: abi::HostApi) {
    let _ = HOST.set(host);
}

fn open(path: &str) -> Result<Backend> {
    let fail = |why: String| Error::Unavailable(format!("Could not load backend TORCH from {path}: {why}"));
    // SAFETY: the library is our own backend, built from `torch/` against the same `torch_abi.rs`; each
    // symbol is read with the signature that file declares, and the ABI version is checked first.
    unsafe {
        let lib = Library::new(path).map_err(|e| fail(e.to_string()))?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {
                *lib.get::<$ty>(concat!($name, "\0").as_bytes()).map_err(|e| fail(e.to_string()))?
            };
        }
        let abi_version = sym!("rai_torch_abi", abi::AbiVersionFn);
        if abi_version() != abi::ABI_VERSION {
            return Err(fail(format!("ABI version {} (this module needs {})", abi_version(), abi::ABI_VERSION)));
        }
        if let Some(host) = HOST.get() {
            sym!("rai_torch_set_host", abi::SetHostFn)(host);
        }
        let free_string = sym!("rai_torch_free_string", abi::FreeStringFn);
        // The sandbox (torch/src/sandbox.cpp) goes in before any model or script: without it the backend is
        // not used at all.
        let (inter_op, bound) = {
            let c = CONFIG.read();
            (c.inter_op_parallelism as i32, c.backend_memory_bound())
        };
        let mut err = std::ptr::null_mut();
        if sym!("rai_torch_configure", abi::ConfigureFn)(inter_op, bound, &mut err) != 0 {
            let why = if err.is_null() {
                "the sandbox could not be installed".to_string()
            } else {
                let s = CStr::from_ptr(err).to_string_lossy().into_owned();
                free_string(err);
                s
            };
            return Err(fail(why));
        }
        let version_fn = sym!("rai_torch_version", abi::VersionFn);
        let v = version_fn();
        let version = CStr::from_ptr(v).to_string_lossy().into_owned();
        free_string(v);
        Ok(Backend {
            version,
            model_load: sym!("rai_torch_model_load", abi::ModelLoadFn),
            model_run: sym!("rai_torch_model_run", abi::ModelRunFn),
            model_free: sym!("rai_torch_model_free", abi::FreeFn),
            script_compile: sym!("rai_torch_script_compile", abi::ScriptCompileFn),
            script_check_entry: sym!("rai_torch_script_check_entry", abi::ScriptCheckEntryFn),
            script_run: sym!("rai_torch_script_run", abi::ScriptRunFn),
            script_free: sym!("rai_torch_script_free", abi::FreeFn),
            free_tensors: sym!("rai_torch_free_tensors", abi::FreeTensorsFn),
            memory: sym!("rai_torch_memory", abi::MemoryFn),
            free_string,
            _lib: lib,
        })
    }
}

/// The backend library; without a load-time path (`TORCH <path>`), the one next to libredisai.so.
pub fn backend() -> Result<Arc<Backend>> {
    let default = CONFIG.read().module_dir.as_ref().map(|d| format!("{d}/{LIB_NAME}"));
    BACKEND.get(default, open)
}

/// Opens the library where `backend` would (a worker, before its sandbox goes in).
pub fn open_default() -> Result<()> {
    backend().map(|_| ())
}

/// `AI.CONFIG LOADBACKEND TORCH <path>`.
pub fn load_library(path: &str) -> Result<()> {
    BACKEND.load(path, open)
}

pub fn version() -> Option<String> {
    BACKEND.loaded().map(|b| b.version.clone())
}

/// Bytes of CPU tensors the backend holds (its counting allocator), once it is loaded.
pub fn memory() -> Option<u64> {
    // SAFETY: reads a counter of the loaded backend.
    BACKEND.loaded().map(|b| unsafe { (b.memory)() })
}

impl Backend {
    /// The error a call returned `code` for (its kind, `torch_abi.rs`) with the message the backend allocated.
    /// Refusals of the sandbox carry `ERR ` as every model admission refusal does (crate::admission), and so does
    /// a missing GPU (the other backends' words); other backend messages go out as libtorch wrote them.
    fn error(&self, code: i32, p: *mut c_char) -> Error {
        let text = if p.is_null() { "unknown TORCH backend error".to_string() } else { self.take_string(p) };
        match code {
            abi::REFUSED => Error::Refused { text, prefixed: true },
            abi::TIMED_OUT => Error::TimedOut { text, prefixed: false },
            abi::OVER_MEMORY => Error::Refused { text, prefixed: false },
            abi::SCRIPT_NON_TENSOR => Error::NonTensorResult(text),
            abi::NO_GPU => Error::Unavailable(text),
            _ => Error::Backend(text),
        }
    }

    /// Takes a string the backend allocated ("" for null).
    fn take_string(&self, p: *mut c_char) -> String {
        if p.is_null() {
            return String::new();
        }
        // SAFETY: p is a NUL-terminated string from the backend, read before it is handed back.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        // SAFETY: p came from this backend and is freed once, here.
        unsafe { (self.free_string)(p) };
        s
    }

    /// Runs `call` (which fills outputs or an error) and copies the outputs into module tensors.
    pub fn collect(
        &self,
        call: impl FnOnce(*mut *mut TensorOut, *mut usize, *mut *mut c_char) -> i32,
    ) -> Result<Vec<Tensor>> {
        let (mut outs, mut n, mut err) = (std::ptr::null_mut(), 0usize, std::ptr::null_mut());
        match call(&mut outs, &mut n, &mut err) {
            0 => {}
            code => return Err(self.error(code, err)),
        }
        let _copying = crate::clock::copy_clock::copying();
        // SAFETY: on success the backend returned `n` tensors at `outs`, each describing its own
        // shape/data buffers; we copy them and hand the array back to the backend once.
        unsafe {
            let all = if n == 0 { &[][..] } else { std::slice::from_raw_parts(outs, n) };
            let converted = all
                .iter()
                .map(|t| {
                    let dtype = *DataType::ALL
                        .get(t.dtype as usize)
                        .ok_or_else(|| Error::Backend("bad dtype from TORCH".into()))?;
                    let shape = if t.ndim == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(t.shape, t.ndim as usize).to_vec()
                    };
                    let data = if t.len == 0 { &[][..] } else { std::slice::from_raw_parts(t.data, t.len) };
                    Tensor::from_blob(dtype, shape, data)
                })
                .collect();
            (self.free_tensors)(outs, n);
            converted
        }
    }

    pub fn error_from(&self, rc: i32, err: *mut c_char) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error(rc, err))
        }
    }
}

/// Views of module tensors for one call (they borrow `tensors`).
pub fn views(tensors: &[&Tensor]) -> Vec<TensorView> {
    tensors
        .iter()
        .map(|t| TensorView {
            dtype: DataType::ALL.iter().position(|&d| d == t.dtype()).unwrap_or(0) as u32,
            ndim: t.shape().len() as u32,
            shape: t.shape().as_ptr(),
            data: t.data().as_ptr(),
            len: t.data().len(),
        })
        .collect()
}

pub fn str_view(s: &[u8]) -> StrView {
    StrView { ptr: s.as_ptr(), len: s.len() }
}

pub fn gpu_index(opts: &LoadOptions) -> i32 {
    match opts.device.kind {
        DeviceKind::Gpu => opts.device.id.unwrap_or(0) as i32,
        DeviceKind::Cpu => -1,
    }
}

pub struct TorchModel {
    backend: Arc<Backend>,
    handle: *mut c_void,
    inputs: Vec<String>,
    outputs: Vec<String>,
    intra: i32,
}

// SAFETY: a TorchScript module's forward may run from several threads at once (inference only, no
// state is mutated); the handle is freed only in Drop.
unsafe impl Send for TorchModel {}
// SAFETY: as for Send: concurrent forward() calls share the module read-only.
unsafe impl Sync for TorchModel {}

impl Drop for TorchModel {
    fn drop(&mut self) {
        // SAFETY: the handle came from model_load and is freed once.
        unsafe { (self.backend.model_free)(self.handle) }
    }
}

pub fn load(blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    let backend = backend()?;
    let (mut handle, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut info = abi::ModelInfo { input_names: std::ptr::null_mut(), noutputs: 0 };
    // SAFETY: blob is valid for its length during the call; the out-pointers are writable.
    let rc =
        unsafe { (backend.model_load)(blob.as_ptr(), blob.len(), gpu_index(opts), &mut handle, &mut info, &mut err) };
    backend.error_from(rc, err)?;
    let names = backend.take_string(info.input_names);
    let inputs: Vec<String> =
        if names.is_empty() { Vec::new() } else { names.split('\n').map(str::to_string).collect() };
    let outputs = vec![String::new(); info.noutputs];
    Ok(Box::new(TorchModel { backend, handle, inputs, outputs, intra: opts.intra_op_threads as i32 }))
}

impl LoadedModel for TorchModel {
    fn inputs(&self) -> &[String] {
        &self.inputs
    }
    fn outputs(&self) -> &[String] {
        &self.outputs
    }
    fn run(&self, req: &RunRequest) -> Result<Outputs> {
        let v = views(req.inputs);
        // The backend enforces the time left inside runs (a deadline checked in every loop iteration and
        // allocation of TorchScript code).
        let timeout_ms = super::remaining_ms(req.deadline);
        // The model's callbacks come back on this thread and act for the request's caller.
        let _caller = crate::caller::Scope::new(req.caller);
        // SAFETY: the views borrow `inputs` for the call; the handle is live.
        self.backend
            .collect(|outs, n, err| unsafe {
                (self.backend.model_run)(self.handle, v.as_ptr(), v.len(), self.intra, timeout_ms, outs, n, err)
            })
            .map(Outputs::from_vec)
    }
}

pub struct TorchScript {
    backend: Arc<Backend>,
    handle: *mut c_void,
    intra: i32,
}

// SAFETY: a compiled TorchScript CompilationUnit's functions may be called from several threads; the
// handle is freed only in Drop.
unsafe impl Send for TorchScript {}
// SAFETY: as for Send: concurrent calls share the compiled functions read-only.
unsafe impl Sync for TorchScript {}

impl Drop for TorchScript {
    fn drop(&mut self) {
        // SAFETY: the handle came from script_compile and is freed once.
        unsafe { (self.backend.script_free)(self.handle) }
    }
}

pub fn load_script(spec: &ScriptSpec, device: &crate::device::Device) -> Result<Box<dyn LoadedScript>> {
    let backend = backend()?;
    let gpu = match device.kind {
        DeviceKind::Gpu => device.id.unwrap_or(0) as i32,
        DeviceKind::Cpu => -1,
    };
    let (mut handle, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the source is valid for its length during the call; the out-pointers are writable.
    let rc = unsafe { (backend.script_compile)(spec.source.as_ptr(), spec.source.len(), gpu, &mut handle, &mut err) };
    backend.error_from(rc, err)?;
    let script = TorchScript { backend: backend.clone(), handle, intra: CONFIG.read().intra_op_threads() as i32 };
    for name in &spec.entry_points {
        let mut err = std::ptr::null_mut();
        // SAFETY: the handle is live; the name is borrowed for the call.
        let rc = unsafe { (backend.script_check_entry)(script.handle, str_view(name.as_bytes()), &mut err) };
        backend.error_from(rc, err)?;
    }
    Ok(Box::new(script))
}

impl LoadedScript for TorchScript {
    fn run(&self, req: &ScriptRequest) -> Result<Vec<Tensor>> {
        let v = views(req.tensors);
        let k: Vec<StrView> = req.keys.iter().map(|x| str_view(x)).collect();
        let a: Vec<StrView> = req.args.iter().map(|x| str_view(x)).collect();
        let timeout_ms = super::remaining_ms(req.deadline);
        let (call, list_from) = match req.style {
            CallStyle::EntryPoint => (abi::CALL_ENTRY_POINT, -1),
            CallStyle::Positional { list_from } => (abi::CALL_POSITIONAL, list_from.map_or(-1, |i| i as isize)),
        };
        // The script's callbacks come back on this thread and act for the request's caller.
        let _caller = crate::caller::Scope::new(req.caller);
        // SAFETY: every view borrows data that outlives the call; the handle is live.
        self.backend.collect(|outs, n, err| unsafe {
            (self.backend.script_run)(
                self.handle,
                str_view(req.function),
                call,
                v.as_ptr(),
                v.len(),
                list_from,
                k.as_ptr(),
                k.len(),
                a.as_ptr(),
                a.len(),
                self.intra,
                timeout_ms,
                outs,
                n,
                err,
            )
        })
    }
}
