//! TensorFlow graphs (RedisAI's `TF` backend): a frozen GraphDef plus the input and output op names given
//! at store time, run through TensorFlow's C API from the PyPI `tensorflow-cpu` wheel's libtensorflow_cc.

mod ffi;

use crate::blob::Blob;
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::Instant;

use super::{check_input_count, LibrarySlot, LoadOptions, LoadedModel, Outputs, RunRequest};
use crate::config::CONFIG;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};
use ffi::Api;

const LIB_NAME: &str = "libtensorflow_cc.so.2";

static RUNTIME: LibrarySlot<Api> = LibrarySlot::new("TF");

fn open(path: &str) -> Result<Api> {
    bound_memory();
    eigen_kernels();
    Api::open(path).map_err(|e| Error::Unavailable(format!("Could not load backend TF from {path}: {e}")))
}

/// TensorFlow's switch for a bounded CPU allocator, and its bound in MiB.
const USE_BFC: &str = "TF_CPU_ALLOCATOR_USE_BFC";
const BFC_LIMIT_MB: &str = "TF_CPU_BFC_MEM_LIMIT_IN_MB";

/// Holds TensorFlow's CPU memory to the module's backend memory bound (BACKEND_MEMORY_LIMIT, or the default
/// derived from `maxmemory`): without it, `Fill(dims, value)` with dims from an input allocates until the
/// kernel's OOM killer ends Redis. TensorFlow has no API for this; its process-wide CPU allocator becomes a
/// BFC allocator capped at TF_CPU_BFC_MEM_LIMIT_IN_MB when TF_CPU_ALLOCATOR_USE_BFC is true, both read once,
/// when the first CPU device is created (`ProcessState::GetCPUAllocator`, common_runtime/process_state.cc).
/// An allocation past the cap is retried for up to 10 s (TensorFlow waits for memory to be freed), then fails
/// the op with ResourceExhausted ("OOM when allocating tensor ..."); the run replies an error (with the default
/// MODEL_EXECUTION_TIMEOUT of 5 s, TensorFlow's "Timed out waiting for notification", after the retry) and the
/// allocator stays usable. The variables are set only where the operator has not set them (so
/// `TF_CPU_ALLOCATOR_USE_BFC=false` opts out). Called before the library is opened; idempotent. Measured on
/// tf_dense.pb, a run costs the same with and without the BFC allocator (p50 86-88 us either way).
pub fn bound_memory() {
    let bound = CONFIG.read().backend_memory_bound();
    if bound == 0 {
        return;
    }
    let mb = (bound >> 20).max(1).to_string();
    for (name, value) in [(USE_BFC, "true"), (BFC_LIMIT_MB, mb.as_str())] {
        if std::env::var_os(name).is_none() {
            // SAFETY: setenv must not race a getenv of another thread. TensorFlow, the only reader, has no
            // threads yet (its library is not open; it reads these when it creates its first device). Rust
            // readers are ordered by std's environment lock. The other threads that may exist by now (Redis's
            // own, the module's queue workers, other backends' pools) read the environment when they start,
            // not while serving.
            std::env::set_var(name, value);
        }
    }
}

/// TensorFlow's switch for oneDNN's kernels.
const ONEDNN: &str = "TF_ENABLE_ONEDNN_OPTS";

/// Runs graphs with Eigen's kernels, as RedisAI's TensorFlow 2.8 did (2.9 turned oneDNN's on by default on
/// Linux x86; their results differ in the last bits, as TensorFlow's start-up message says). For the small
/// graphs served per request, oneDNN's per-op set-up (memory descriptors, primitive cache lookups) costs more
/// than the math: the fraud-scoring graph of `make bench` took 12.8 µs of worker CPU per run with it and 6.4
/// without (docs/benchmarks.md). Only where the operator has not set the variable, so TF_ENABLE_ONEDNN_OPTS=1
/// in the server's environment opts back in (big convolutional graphs may gain). The library reads it when it
/// is opened (its static initialisers), so this runs before; idempotent.
fn eigen_kernels() {
    if std::env::var_os(ONEDNN).is_none() {
        // SAFETY: as in `bound_memory`: TensorFlow, the reader, is not open yet, and no other thread reads the
        // environment while serving.
        std::env::set_var(ONEDNN, "0");
    }
}

/// The library; without a load-time path, the one in the build's backend cache (set by `make build`).
fn runtime() -> Result<Arc<Api>> {
    RUNTIME.get(option_env!("REDISAI_TF_LIB_DIR").map(|d| format!("{d}/{LIB_NAME}")), open)
}

/// Opens the library where `runtime` would (a worker, before its sandbox goes in).
pub fn open_default() -> Result<()> {
    runtime().map(|_| ())
}

/// `AI.CONFIG LOADBACKEND TF <path>`.
pub fn load_library(path: &str) -> Result<()> {
    RUNTIME.load(path, open)
}

pub fn version() -> Option<String> {
    let api = RUNTIME.loaded()?;
    // SAFETY: TF_Version returns a static NUL-terminated string.
    Some(unsafe { CStr::from_ptr((api.version)()) }.to_string_lossy().into_owned())
}

/// A TF_Status, deleted on drop.
struct Status<'a>(&'a Api, *mut ffi::Status);

impl<'a> Status<'a> {
    fn new(api: &'a Api) -> Status<'a> {
        // SAFETY: TF_NewStatus has no preconditions.
        Status(api, unsafe { (api.new_status)() })
    }
    /// TensorFlow's message, as RedisAI passed it on (no `ERR`, one line at reply time).
    fn check(&self) -> Result<()> {
        // SAFETY: self.1 is a live status; TF_Message returns a string owned by it, copied here.
        unsafe {
            if (self.0.get_code)(self.1) == 0 {
                Ok(())
            } else {
                Err(Error::Backend(CStr::from_ptr((self.0.message)(self.1)).to_string_lossy().into_owned()))
            }
        }
    }
}

impl Drop for Status<'_> {
    fn drop(&mut self) {
        // SAFETY: created by TF_NewStatus, deleted once.
        unsafe { (self.0.delete_status)(self.1) }
    }
}

/// Tensors we own, deleted on drop (TF_SessionRun does not take the inputs).
struct Tensors<'a>(&'a Api, Vec<*mut ffi::Tensor>);

impl Drop for Tensors<'_> {
    fn drop(&mut self) {
        for &t in &self.1 {
            if !t.is_null() {
                // SAFETY: every non-null pointer here is a tensor we own, deleted once.
                unsafe { (self.0.delete_tensor)(t) }
            }
        }
    }
}

pub struct TfModel {
    api: Arc<Api>,
    graph: *mut ffi::Graph,
    session: *mut ffi::Session,
    inputs: Vec<String>,
    outputs: Vec<String>,
    input_ops: Vec<ffi::Output>,
    output_ops: Vec<ffi::Output>,
}

// SAFETY: the session and graph are freed in Drop only, by whichever thread drops the model last.
unsafe impl Send for TfModel {}
// SAFETY: a TF_Session may run from several threads at once (TensorFlow documents Session::Run as
// thread-safe); the graph is never changed after the session is created.
unsafe impl Sync for TfModel {}

/// Protobuf varint fields (tag byte, value), skipping zeros.
fn varint_fields(fields: &[(u8, u64)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(tag, mut n) in fields {
        if n > 0 {
            v.push(tag);
            while n >= 0x80 {
                v.push((n as u8) | 0x80);
                n >>= 7;
            }
            v.push(n as u8);
        }
    }
    v
}

/// ConfigProto with intra_op_parallelism_threads (field 2) and inter_op_parallelism_threads (field 5). Without
/// INTER_OP_PARALLELISM, ops run on the calling worker (`inter_op_parallelism_threads` -1, "all operations are
/// performed in caller's thread"): TensorFlow's default inter-op pool hands every op of a small graph to
/// another thread and back, which cost RedisAI's fraud-scoring graph half its throughput (docs/benchmarks.md).
fn config_proto(intra: usize, inter: usize) -> Vec<u8> {
    let inter = if inter == 0 { u64::MAX } else { inter as u64 }; // -1 as a protobuf int32 varint
    varint_fields(&[(0x10, intra as u64), (0x28, inter)])
}

/// The inter-op threads of a graph's session when INTER_OP_PARALLELISM gives none (`given` 0): the caller's thread
/// (0 here, -1 to TensorFlow), unless the graph can loop (`admission::tensorflow::iterates`). TensorFlow's
/// timeout (the kill switch) cancels a run from the thread that waits for it, between ops; on the caller's
/// thread nothing waits, and a `While` whose condition stays true ran until Redis stopped (a 300-byte graph took
/// a worker, and every model of its queue, for good). Such a graph runs on TensorFlow's inter-op pool.
fn inter_op_threads(graph: &[u8], given: usize) -> usize {
    if given == 0 && crate::admission::tensorflow::iterates(graph) {
        1
    } else {
        given
    }
}

/// RunOptions with timeout_in_ms (field 2): TensorFlow's own kill switch for MODEL_EXECUTION_TIMEOUT.
fn run_options_proto(timeout_ms: u64) -> Vec<u8> {
    varint_fields(&[(0x10, timeout_ms)])
}

/// `name` or `name:<index>`.
fn split_output_name(name: &str) -> (&str, i32) {
    match name.rsplit_once(':') {
        Some((op, idx)) if !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) => (op, idx.parse().unwrap_or(0)),
        _ => (name, 0),
    }
}

pub fn load(blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    let api = runtime()?;
    if opts.device.kind == DeviceKind::Gpu {
        return Err(Error::Unavailable("GPU requested but TF couldn't find CUDA".into()));
    }
    let a = &*api;
    let status = Status::new(a);
    // SAFETY: (this block) every pointer passed was just created by the same library and is live;
    // the GraphDef buffer is copied by TF_NewBufferFromString; objects are freed on every path.
    unsafe {
        let graph = (a.new_graph)();
        let buf = (a.new_buffer_from_string)(blob.as_ptr().cast(), blob.len());
        let import = (a.new_import_options)();
        (a.import_graph_def)(graph, buf, import, status.1);
        (a.delete_import_options)(import);
        (a.delete_buffer)(buf);
        let mut model = TfModel {
            api: api.clone(),
            graph,
            session: std::ptr::null_mut(),
            inputs: opts.inputs.clone(),
            outputs: opts.outputs.clone(),
            input_ops: Vec::new(),
            output_ops: Vec::new(),
        };
        status.check()?;
        // As in RedisAI, an input must be a Placeholder; any op can be an output.
        for (names, ops, what, dot, placeholder) in [
            (&opts.inputs, &mut model.input_ops, "Input", ".", true),
            (&opts.outputs, &mut model.output_ops, "Output", "", false),
        ] {
            for name in names {
                let (op_name, index) = split_output_name(name);
                let c = CString::new(op_name)
                    .map_err(|_| Error::parse(format!("{what} node named \"{name}\" not found in TF graph{dot}")))?;
                let op = (a.operation_by_name)(graph, c.as_ptr());
                let wrong_kind =
                    || placeholder && CStr::from_ptr((a.operation_op_type)(op)).to_bytes() != b"Placeholder";
                if op.is_null() || index >= (a.operation_num_outputs)(op) || wrong_kind() {
                    return Err(Error::parse(format!("{what} node named \"{name}\" not found in TF graph{dot}")));
                }
                ops.push(ffi::Output { oper: op, index });
            }
        }
        let session_opts = (a.new_session_options)();
        let config = config_proto(opts.intra_op_threads, inter_op_threads(&blob, opts.inter_op_threads));
        (a.set_config)(session_opts, config.as_ptr().cast(), config.len(), status.1);
        if status.check().is_ok() {
            model.session = (a.new_session)(graph, session_opts, status.1);
        }
        (a.delete_session_options)(session_opts);
        status.check()?;
        Ok(Box::new(model))
    }
}

impl Drop for TfModel {
    fn drop(&mut self) {
        let a = &*self.api;
        let status = Status::new(a);
        // SAFETY: the session and graph belong to this model and are freed once, session first.
        unsafe {
            if !self.session.is_null() {
                (a.close_session)(self.session, status.1);
                (a.delete_session)(self.session, status.1);
            }
            (a.delete_graph)(self.graph);
        }
    }
}

fn tf_type(t: DataType) -> i32 {
    match t {
        DataType::Float => ffi::TF_FLOAT,
        DataType::Double => ffi::TF_DOUBLE,
        DataType::Int8 => ffi::TF_INT8,
        DataType::Int16 => ffi::TF_INT16,
        DataType::Int32 => ffi::TF_INT32,
        DataType::Int64 => ffi::TF_INT64,
        DataType::Uint8 => ffi::TF_UINT8,
        DataType::Uint16 => ffi::TF_UINT16,
        DataType::Bool => ffi::TF_BOOL,
        DataType::String => ffi::TF_STRING,
    }
}

fn our_type(t: i32) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| tf_type(d) == t)
}

impl TfModel {
    fn make_input(&self, t: &Tensor) -> Result<*mut ffi::Tensor> {
        let a = &*self.api;
        let dims = t.shape();
        let strings = t.dtype() == DataType::String;
        let bytes = if strings { t.len() * std::mem::size_of::<ffi::TString>() } else { t.data().len() };
        // SAFETY: TF_AllocateTensor returns a tensor of `bytes` writable bytes; for STRING each 24-byte slot
        // is initialised with TF_StringInit before TF_StringCopy fills it.
        unsafe {
            let out = (a.allocate_tensor)(tf_type(t.dtype()), dims.as_ptr(), dims.len() as i32, bytes);
            if out.is_null() {
                return Err(Error::Backend("TensorFlow could not allocate an input tensor".into()));
            }
            let data = (a.tensor_data)(out);
            if strings {
                let slots = data as *mut ffi::TString;
                for i in 0..t.len() {
                    let s = t.string_at(i);
                    (a.string_init)(slots.add(i));
                    (a.string_copy)(slots.add(i), s.as_ptr().cast(), s.len());
                }
            } else if bytes > 0 {
                std::ptr::copy_nonoverlapping(t.data().as_ptr(), data as *mut u8, bytes);
            }
            Ok(out)
        }
    }

    fn read_output(&self, out: *mut ffi::Tensor) -> Result<Tensor> {
        let a = &*self.api;
        // SAFETY: `out` is a live output tensor of TF_SessionRun; we read its dims and its
        // TF_TensorByteSize bytes (or, for STRING, its element count of TF_TString slots).
        unsafe {
            let ty = (a.tensor_type)(out);
            let dtype = our_type(ty)
                .ok_or_else(|| Error::Backend(format!("TF model returned an unsupported tensor type ({ty})")))?;
            let shape: Vec<i64> = (0..(a.num_dims)(out)).map(|i| (a.dim)(out, i)).collect();
            let data = (a.tensor_data)(out);
            let size = (a.tensor_byte_size)(out);
            if dtype == DataType::String {
                let n: i64 = shape.iter().product();
                let slots = data as *const ffi::TString;
                let mut bytes = Vec::new();
                for i in 0..n.max(0) as usize {
                    let p = (a.string_data)(slots.add(i)) as *const u8;
                    let len = (a.string_size)(slots.add(i));
                    bytes.extend_from_slice(if len == 0 { &[] } else { std::slice::from_raw_parts(p, len) });
                    bytes.push(0);
                }
                Tensor::from_blob(dtype, shape, &bytes)
            } else {
                let raw = if size == 0 { &[][..] } else { std::slice::from_raw_parts(data as *const u8, size) };
                Tensor::from_blob(dtype, shape, raw)
            }
        }
    }
}

impl LoadedModel for TfModel {
    fn inputs(&self) -> &[String] {
        &self.inputs
    }
    fn outputs(&self) -> &[String] {
        &self.outputs
    }

    fn run(&self, req: &RunRequest) -> Result<Outputs> {
        let inputs = req.inputs;
        check_input_count(self.input_ops.len(), inputs.len())?;
        let a = &*self.api;
        let mut ins = Tensors(a, Vec::with_capacity(inputs.len()));
        {
            let _copying = crate::clock::copy_clock::copying();
            for t in inputs {
                ins.1.push(self.make_input(t)?);
            }
        }
        let mut outs = Tensors(a, vec![std::ptr::null_mut(); self.output_ops.len()]);
        let status = Status::new(a);
        let options = run_options_proto(super::remaining_ms(req.deadline));
        // SAFETY: the session is live; the arrays hold `ninputs`/`noutputs` entries; TF fills `outs`,
        // which we own afterwards (freed by `Tensors`); the options buffer is copied and freed here.
        unsafe {
            let run_options = (a.new_buffer_from_string)(options.as_ptr().cast(), options.len());
            (a.session_run)(
                self.session,
                run_options,
                self.input_ops.as_ptr(),
                ins.1.as_ptr(),
                ins.1.len() as i32,
                self.output_ops.as_ptr(),
                outs.1.as_mut_ptr(),
                outs.1.len() as i32,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                status.1,
            );
            (a.delete_buffer)(run_options);
        }
        if let Err(e) = status.check() {
            return Err(if Instant::now() >= req.deadline { req.cancelled("TF") } else { e });
        }
        let _copying = crate::clock::copy_clock::copying();
        outs.1.iter().map(|&t| self.read_output(t)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_config_and_names() {
        // -1 (caller's thread) for inter-op when none was given: ten bytes of varint.
        let mut caller = vec![0x28];
        caller.extend([0xff; 9]);
        caller.push(0x01);
        assert_eq!(config_proto(0, 0), caller);
        assert_eq!(config_proto(2, 300), vec![0x10, 2, 0x28, 0xac, 0x02]);
        assert_eq!(run_options_proto(5000), vec![0x10, 0x88, 0x27]);
        assert_eq!(split_output_name("out:1"), ("out", 1));
        assert_eq!(split_output_name("scope/out"), ("scope/out", 0));
        assert_eq!(split_output_name("a:b"), ("a:b", 0));
    }
}
