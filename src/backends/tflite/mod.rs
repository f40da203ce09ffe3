//! TensorFlow Lite models (RedisAI's `TFLITE` backend): a flatbuffer run by LiteRT's CompiledModel C API
//! (libLiteRt.so from the PyPI `ai-edge-litert` wheel), opened with `dlopen` at first use.
//!
//! Inputs and outputs follow the main subgraph's order, as RedisAI's interpreter did (a signature may list
//! them in another order). Inputs are resized to the shapes given, so dimension 0 is free (batching).
//!
//! LiteRT's memory is held to BACKEND_MEMORY_LIMIT by counting wrappers around its allocation calls
//! (`alloc.rs`, `got.rs`).

mod alloc;
mod ffi;
mod got;

use crate::blob::Blob;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use super::{check_input_count, LibrarySlot, LoadOptions, LoadedModel, Outputs, Pool, RunRequest};
use crate::config::CONFIG;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};
use ffi::Api;

const LIB_NAME: &str = "libLiteRt.so";

static RUNTIME: LibrarySlot<Api> = LibrarySlot::new("TFLITE");

fn open(path: &str) -> Result<Api> {
    let fail = |e: String| Error::Unavailable(format!("Could not load backend TFLITE from {path}: {e}"));
    let api = Api::open(path).map_err(fail)?;
    // Before anything of LiteRT runs: from here on its allocations are counted and bounded.
    alloc::install(api.run as *const c_void, CONFIG.read().backend_memory_bound()).map_err(fail)?;
    Ok(api)
}

/// INFO's `ai_tflite_memory` and `ai_tflite_memory_refusals` (ours; 0 until a TFLITE model is loaded).
pub fn info() -> Vec<(&'static str, &'static str, u64)> {
    let (bytes, refusals) = (alloc::BUDGET.live(), alloc::BUDGET.refusals());
    vec![("redisai_rs", "tflite_memory", bytes), ("redisai_rs", "tflite_memory_refusals", refusals)]
}

fn default_path() -> Option<String> {
    option_env!("REDISAI_TFLITE_LIB_DIR").map(|d| format!("{d}/{LIB_NAME}"))
}

/// The library; without a load-time path, the one in the build's backend cache (set by `make build`).
fn runtime() -> Result<Arc<Api>> {
    RUNTIME.get(default_path(), open)
}

/// Opens the library where `runtime` would (a worker, before its sandbox goes in).
pub fn open_default() -> Result<()> {
    runtime().map(|_| ())
}

/// `AI.CONFIG LOADBACKEND TFLITE <path>`.
pub fn load_library(path: &str) -> Result<()> {
    RUNTIME.load(path, open)
}

/// LiteRT exports no version call: the wheel version the build fetched (the cache dir is `litert-<version>`).
pub fn version() -> Option<String> {
    RUNTIME.loaded()?;
    let dir = option_env!("REDISAI_TFLITE_LIB_DIR").unwrap_or("");
    let v = dir.trim_end_matches("/lib").rsplit('/').next().and_then(|d| d.strip_prefix("litert-"));
    Some(format!("LiteRT {}", v.unwrap_or("(version unknown)")))
}

fn check(status: ffi::Status, what: &str) -> Result<()> {
    if status == ffi::OK {
        Ok(())
    } else {
        Err(Error::Backend(format!("TFLITE: LiteRT failed to {what} (status {status})")))
    }
}

fn lite_type(t: DataType) -> Option<i32> {
    Some(match t {
        DataType::Float => ffi::FLOAT32,
        DataType::Double => ffi::FLOAT64,
        DataType::Int8 => ffi::INT8,
        DataType::Int16 => ffi::INT16,
        DataType::Int32 => ffi::INT32,
        DataType::Int64 => ffi::INT64,
        DataType::Uint8 => ffi::UINT8,
        DataType::Uint16 => ffi::UINT16,
        DataType::Bool => ffi::BOOL,
        DataType::String => return None,
    })
}

fn our_type(t: i32) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| lite_type(d) == Some(t))
}

/// Deadlines are nanoseconds since this instant, so that the cancellation check reads one atomic.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
const NO_DEADLINE: u64 = u64::MAX;

/// What a run's cancellation check reads.
struct RunState {
    deadline: AtomicU64,
    /// Set by the allocation wrappers when this run passed the memory bound (alloc.rs).
    over_bound: AtomicBool,
}

/// LiteRT calls this between ops: true once the run's MODEL_EXECUTION_TIMEOUT has passed (the kill switch)
/// or the run has passed the memory bound.
extern "C" fn past_deadline(data: *mut c_void) -> bool {
    // SAFETY: `data` is the `RunState` of the `Instance` that owns the compiled model, which holds it as long
    // as the compiled model lives; it is only read atomically.
    let state = unsafe { &*(data as *const RunState) };
    let deadline = state.deadline.load(Ordering::Relaxed);
    state.over_bound.load(Ordering::Relaxed)
        || (deadline != NO_DEADLINE && EPOCH.elapsed().as_nanos() as u64 > deadline)
}

/// One environment + model + compiled model. A compiled model runs one request at a time.
struct Instance {
    api: Arc<Api>,
    env: *mut ffi::Environment,
    model: *mut ffi::Model,
    compiled: *mut ffi::CompiledModel,
    /// Shared with LiteRT's cancellation check for the compiled model's lifetime.
    state: Arc<RunState>,
    /// Input shapes the compiled model currently has (signature order), to resize only on change.
    shapes: Vec<Vec<i32>>,
    /// A run of it failed at the memory bound: it is rebuilt before the next (a failed allocation leaves
    /// LiteRT in its least-tested state, and the rebuild frees what the failed run grew).
    stale: bool,
    /// LiteRT reads the flatbuffer in place: it must outlive the model.
    _blob: Blob,
}

// SAFETY: an Instance is used by one thread at a time (taken out of the pool by value); LiteRT objects
// are not tied to the thread that made them. Everything is freed in Drop only.
unsafe impl Send for Instance {}

impl Drop for Instance {
    fn drop(&mut self) {
        let a = &*self.api;
        // SAFETY: each pointer was made by this library for this instance, is freed once, users first.
        unsafe {
            if !self.compiled.is_null() {
                (a.destroy_compiled_model)(self.compiled);
            }
            if !self.model.is_null() {
                (a.destroy_model)(self.model);
            }
            if !self.env.is_null() {
                (a.destroy_environment)(self.env);
            }
        }
    }
}

/// A tensor of the model as the signature and the subgraph see it.
struct Port {
    name: String,
    element_type: i32,
    /// Its index in the signature (the order LiteRtRunCompiledModel takes buffers in).
    sig_index: usize,
}

pub struct TfLiteModel {
    api: Arc<Api>,
    blob: Blob,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
    input_names: Vec<String>,
    output_names: Vec<String>,
    pool: Pool<Instance>,
}

pub fn load(blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    let api = runtime()?;
    if opts.device.kind == DeviceKind::Gpu {
        return Err(Error::Unavailable("GPU requested but TFLITE has no GPU support in this module".into()));
    }
    let first = new_instance(&api, &blob)?;
    let (inputs, outputs) = ports(&api, first.model)?;
    let m = TfLiteModel {
        input_names: inputs.iter().map(|p| p.name.clone()).collect(),
        output_names: outputs.iter().map(|p| p.name.clone()).collect(),
        api,
        blob,
        inputs,
        outputs,
        pool: Pool::new(Some(first)),
    };
    Ok(Box::new(m))
}

/// An instance holding nothing yet (every pointer null).
fn empty_instance(api: &Arc<Api>, blob: &Blob) -> Instance {
    Instance {
        api: api.clone(),
        env: std::ptr::null_mut(),
        model: std::ptr::null_mut(),
        compiled: std::ptr::null_mut(),
        state: Arc::new(RunState { deadline: AtomicU64::new(NO_DEADLINE), over_bound: AtomicBool::new(false) }),
        shapes: Vec::new(),
        stale: true,
        _blob: blob.clone(),
    }
}

/// `f` with this thread's allocations marked as the instance's. Its result is the memory limit's error when
/// one of them was refused or passed the bound (the flag), or when `f` failed while an allocation was refused
/// on a thread that cannot be attributed (one of LiteRT's own).
fn bounded<T>(state: &RunState, f: impl FnOnce() -> Result<T>) -> Result<T> {
    state.over_bound.store(false, Ordering::Relaxed);
    let refusals = alloc::BUDGET.refusals();
    let result = {
        let _attribution = alloc::attribute(&state.over_bound);
        f()
    };
    let over = state.over_bound.load(Ordering::Relaxed);
    if over || (result.is_err() && alloc::BUDGET.refusals() > refusals) {
        return Err(Error::refused(alloc::LIMIT_ERROR));
    }
    result
}

fn new_instance(api: &Arc<Api>, blob: &Blob) -> Result<Instance> {
    let mut inst = empty_instance(api, blob);
    let state = inst.state.clone();
    bounded(&state, || build(&mut inst))?;
    inst.stale = false;
    Ok(inst)
}

fn build(inst: &mut Instance) -> Result<()> {
    let api = inst.api.clone();
    let blob = inst._blob.clone();
    let a = &*api;
    // SAFETY: out-pointers are valid locals/fields; the blob stays alive in `inst`; the options object
    // is freed on every path; whatever was created is freed by Instance::drop on error.
    unsafe {
        check((a.create_environment)(0, std::ptr::null(), &mut inst.env), "create an environment")?;
        if (a.create_model_from_buffer)(inst.env, blob.as_ptr().cast(), blob.len(), &mut inst.model) != ffi::OK {
            return Err(Error::Backend("TFLITE: the model is not a valid TensorFlow Lite flatbuffer".into()));
        }
        let mut options = std::ptr::null_mut();
        check((a.create_options)(&mut options), "create options")?;
        let mut status = (a.set_hw_accelerators)(options, ffi::HW_ACCELERATOR_CPU);
        if status == ffi::OK {
            status = (a.create_compiled_model)(inst.env, inst.model, options, &mut inst.compiled);
        }
        (a.destroy_options)(options);
        check(status, "compile the model (an op may be unsupported)")?;
        let data = Arc::as_ptr(&inst.state) as *mut c_void;
        check((a.set_cancellation)(inst.compiled, data, past_deadline), "set the cancellation check")?;
    }
    Ok(())
}

/// Inputs and outputs of the main subgraph, in its order, with their index in signature 0.
fn ports(api: &Api, model: *mut ffi::Model) -> Result<(Vec<Port>, Vec<Port>)> {
    let a = api;
    // SAFETY: `model` is live; every out-pointer is a valid local; the strings LiteRT returns are owned by
    // the model and copied here.
    unsafe {
        let mut nsig = 0;
        check((a.num_signatures)(model, &mut nsig), "read the signatures")?;
        if nsig == 0 {
            return Err(Error::Backend("TFLITE: the model has no signature".into()));
        }
        let mut sig = std::ptr::null_mut();
        check((a.signature)(model, 0, &mut sig), "read the signature")?;
        let mut main = 0;
        let mut graph = std::ptr::null_mut();
        check((a.main_subgraph_index)(model, &mut main), "find the main subgraph")?;
        check((a.subgraph)(model, main, &mut graph), "read the main subgraph")?;
        let mut result = Vec::new();
        for input in [true, false] {
            let (mut n_sig, mut n_graph) = (0, 0);
            if input {
                check((a.num_signature_inputs)(sig, &mut n_sig), "read the inputs")?;
                check((a.num_subgraph_inputs)(graph, &mut n_graph), "read the inputs")?;
            } else {
                check((a.num_signature_outputs)(sig, &mut n_sig), "read the outputs")?;
                check((a.num_subgraph_outputs)(graph, &mut n_graph), "read the outputs")?;
            }
            let mut sig_tensors = Vec::with_capacity(n_sig);
            for i in 0..n_sig {
                let mut t = std::ptr::null_mut();
                let f = if input { a.signature_input } else { a.signature_output };
                check(f(sig, i, &mut t), "read a signature tensor")?;
                sig_tensors.push(t);
            }
            let mut ports = Vec::with_capacity(n_graph);
            for k in 0..n_graph {
                let mut t = std::ptr::null_mut();
                let f = if input { a.subgraph_input } else { a.subgraph_output };
                check(f(graph, k, &mut t), "read a subgraph tensor")?;
                // The subgraph's k-th tensor is the same object the signature lists; else keep position k.
                let sig_index = sig_tensors.iter().position(|&s| s == t).unwrap_or(k);
                if sig_index >= n_sig {
                    return Err(Error::Backend("TFLITE: the signature does not cover the main subgraph".into()));
                }
                let mut name = std::ptr::null();
                check((a.tensor_name)(t, &mut name), "read a tensor name")?;
                let name = if name.is_null() { String::new() } else { CStr::from_ptr(name).to_string_lossy().into() };
                let mut ty = ffi::RankedTensorType::default();
                check((a.ranked_tensor_type)(t, &mut ty), "read a tensor type (unranked tensors are unsupported)")?;
                ports.push(Port { name, element_type: ty.element_type, sig_index });
            }
            if n_graph != n_sig {
                return Err(Error::Backend("TFLITE: the signature does not cover the main subgraph".into()));
            }
            result.push(ports);
        }
        let outputs = result.pop().unwrap_or_default();
        let inputs = result.pop().unwrap_or_default();
        Ok((inputs, outputs))
    }
}

/// Tensor buffers we made, destroyed on drop (also when a run fails half-way).
struct Buffers<'a>(&'a Api, Vec<*mut ffi::TensorBuffer>);

impl Drop for Buffers<'_> {
    fn drop(&mut self) {
        for &b in &self.1 {
            if !b.is_null() {
                // SAFETY: every non-null pointer here is a buffer we created, destroyed once.
                unsafe { (self.0.destroy_buffer)(b) }
            }
        }
    }
}

impl TfLiteModel {
    /// A run on a fresh instance if the last one failed at the memory bound; a run that fails there marks it.
    fn run_bounded(&self, inst: &mut Instance, req: &RunRequest) -> Result<Outputs> {
        if inst.stale {
            // The old one is freed before the new one is built: it may hold most of the bound.
            drop(std::mem::replace(inst, empty_instance(&self.api, &self.blob)));
            *inst = new_instance(&self.api, &self.blob)?;
        }
        let state = inst.state.clone();
        let result = bounded(&state, || self.run_on(inst, req));
        if matches!(&result, Err(Error::Refused { .. })) {
            inst.stale = true;
        }
        result
    }

    fn run_on(&self, inst: &mut Instance, req: &RunRequest) -> Result<Outputs> {
        let inputs = req.inputs;
        let a = &*self.api;
        let n_in = self.inputs.len();
        let n_out = self.outputs.len();
        if inst.shapes.len() != n_in {
            inst.shapes = vec![Vec::new(); n_in];
        }
        let mut ins = Buffers(a, vec![std::ptr::null_mut(); n_in]);
        let copying_in = crate::clock::copy_clock::copying();
        // SAFETY: the compiled model and environment are live and used by this thread only;
        // every layout has rank <= MAX_RANK; a locked buffer holds at least the bytes it was created with,
        // which is what we copy in or out; buffers are destroyed by `Buffers`.
        unsafe {
            for (port, t) in self.inputs.iter().zip(inputs) {
                let dims = t
                    .shape()
                    .iter()
                    .map(|&d| i32::try_from(d).map_err(|_| Error::Backend("TFLITE: a dimension is too large".into())))
                    .collect::<Result<Vec<i32>>>()?;
                if dims.len() > ffi::MAX_RANK {
                    return Err(Error::Backend(format!("TFLITE: tensors of rank above {} unsupported", ffi::MAX_RANK)));
                }
                if inst.shapes[port.sig_index] != dims {
                    let status = (a.resize_input)(inst.compiled, 0, port.sig_index, dims.as_ptr(), dims.len());
                    inst.shapes[port.sig_index].clear();
                    if status != ffi::OK {
                        return Err(Error::Backend(format!(
                            "TFLITE: input {} cannot take the shape {:?} (status {status})",
                            port.name,
                            t.shape()
                        )));
                    }
                    inst.shapes[port.sig_index] = dims.clone();
                }
                let ty = ffi::RankedTensorType { element_type: port.element_type, layout: ffi::Layout::new(&dims) };
                let bytes = t.data();
                let buf = &mut ins.1[port.sig_index];
                check(
                    (a.create_managed_buffer)(inst.env, ffi::BUFFER_TYPE_HOST_MEMORY, &ty, bytes.len().max(1), buf),
                    "allocate an input buffer",
                )?;
                let mut p = std::ptr::null_mut();
                check((a.lock_buffer)(*buf, &mut p, ffi::LOCK_WRITE), "lock an input buffer")?;
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len());
                check((a.unlock_buffer)(*buf), "unlock an input buffer")?;
            }
            drop(copying_in);
            let mut layouts = vec![ffi::Layout::default(); n_out];
            check((a.output_layouts)(inst.compiled, 0, n_out, layouts.as_mut_ptr(), true), "size the outputs")?;
            let mut outs = Buffers(a, vec![std::ptr::null_mut(); n_out]);
            let mut shapes = vec![Vec::new(); n_out];
            for port in &self.outputs {
                let dtype = our_type(port.element_type).ok_or_else(|| {
                    Error::Backend(format!(
                        "TFLITE: output {} has an unsupported type ({})",
                        port.name, port.element_type
                    ))
                })?;
                let layout = layouts[port.sig_index];
                let shape: Vec<i64> = layout.dims().iter().map(|&d| d as i64).collect();
                let size = crate::tensor::element_count(dtype, &shape)? * dtype.elem_size();
                let ty = ffi::RankedTensorType { element_type: port.element_type, layout };
                let buf = &mut outs.1[port.sig_index];
                check(
                    (a.create_managed_buffer)(inst.env, ffi::BUFFER_TYPE_HOST_MEMORY, &ty, size.max(1), buf),
                    "allocate an output buffer",
                )?;
                shapes[port.sig_index] = shape;
            }
            let deadline = req.deadline.saturating_duration_since(*EPOCH).as_nanos() as u64;
            inst.state.deadline.store(deadline, Ordering::Relaxed);
            let status = (a.run)(inst.compiled, 0, n_in, ins.1.as_mut_ptr(), n_out, outs.1.as_mut_ptr());
            inst.state.deadline.store(NO_DEADLINE, Ordering::Relaxed);
            if status != ffi::OK {
                if EPOCH.elapsed().as_nanos() as u64 > deadline {
                    return Err(req.cancelled("TFLITE"));
                }
                return Err(Error::Backend(format!("TFLITE: LiteRT failed to run the model (status {status})")));
            }
            let _copying = crate::clock::copy_clock::copying();
            let mut result = Outputs::with_capacity(n_out);
            for port in &self.outputs {
                let dtype = our_type(port.element_type).unwrap_or(DataType::Float);
                let shape = std::mem::take(&mut shapes[port.sig_index]);
                let size = crate::tensor::element_count(dtype, &shape)? * dtype.elem_size();
                let buf = outs.1[port.sig_index];
                let mut p = std::ptr::null_mut();
                check((a.lock_buffer)(buf, &mut p, ffi::LOCK_READ), "lock an output buffer")?;
                let data = if size == 0 { &[][..] } else { std::slice::from_raw_parts(p as *const u8, size) };
                let t = Tensor::from_blob(dtype, shape, data);
                check((a.unlock_buffer)(buf), "unlock an output buffer")?;
                result.push(t?);
            }
            Ok(result)
        }
    }
}

impl LoadedModel for TfLiteModel {
    fn inputs(&self) -> &[String] {
        &self.input_names
    }
    fn outputs(&self) -> &[String] {
        &self.output_names
    }

    fn run(&self, req: &RunRequest) -> Result<Outputs> {
        let inputs = req.inputs;
        check_input_count(self.inputs.len(), inputs.len())?;
        for (port, t) in self.inputs.iter().zip(inputs) {
            if lite_type(t.dtype()) != Some(port.element_type) {
                return Err(Error::Backend(
                    "Input tensor type doesn't match the type expected by the model definition".into(),
                ));
            }
        }
        self.pool.with(|| new_instance(&self.api, &self.blob), |inst| self.run_bounded(inst, req))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_both_ways() {
        for t in DataType::ALL {
            match lite_type(t) {
                Some(code) => assert_eq!(our_type(code), Some(t)),
                None => assert_eq!(t, DataType::String),
            }
        }
    }
}
