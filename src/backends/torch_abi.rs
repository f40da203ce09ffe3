//! The C ABI between the module and its libtorch backend, `libredisai_torch.so` (crate `torch/`), which is
//! opened at first use so that the module never loads libtorch unless TORCH is used. Both sides include
//! this file. Memory crosses the boundary only as borrowed views (module → backend) or as values the
//! backend allocated and frees itself (`rai_torch_free_*`).

#![allow(dead_code)]

use std::ffi::{c_char, c_void};

/// Bumped on every change of the functions or structs below; both sides check it.
/// 4: runs take MODEL_EXECUTION_TIMEOUT; configure takes the memory bound and can fail; `rai_torch_memory`.
/// 7: a failure returns its kind (`FAILED`, `REFUSED`, `TIMED_OUT`, ...), never left to be read from its text.
pub const ABI_VERSION: u32 = 7;

/// A tensor lent to the backend for one call. `dtype` is the index in `DataType::ALL`.
#[repr(C)]
pub struct TensorView {
    pub dtype: u32,
    pub ndim: u32,
    pub shape: *const i64,
    pub data: *const u8,
    pub len: usize,
}

/// A tensor the backend produced; freed with `rai_torch_free_tensors`.
#[repr(C)]
pub struct TensorOut {
    pub dtype: u32,
    pub ndim: u32,
    pub shape: *mut i64,
    pub data: *mut u8,
    pub len: usize,
}

impl TensorOut {
    /// Takes `shape` and `data`; the side that made the value frees it (`free_outs`).
    pub fn new(dtype: u32, shape: Vec<i64>, data: Vec<u8>) -> TensorOut {
        let (shape, data) = (shape.into_boxed_slice(), data.into_boxed_slice());
        TensorOut {
            dtype,
            ndim: shape.len() as u32,
            len: data.len(),
            shape: Box::into_raw(shape) as *mut i64,
            data: Box::into_raw(data) as *mut u8,
        }
    }
}

/// Hands `outs` to the other side as a raw array, which comes back through `free_outs`.
///
/// # Safety
/// `ptr` and `n` are writable.
pub unsafe fn give_outs(outs: Vec<TensorOut>, ptr: *mut *mut TensorOut, n: *mut usize) {
    let boxed = outs.into_boxed_slice();
    // SAFETY: see above.
    unsafe {
        *n = boxed.len();
        *ptr = Box::into_raw(boxed) as *mut TensorOut;
    }
}

/// Frees an array from `give_outs` and the buffers of its `TensorOut::new` values.
///
/// # Safety
/// `p`/`n` came from `give_outs` on this same side and are freed once.
pub unsafe fn free_outs(p: *mut TensorOut, n: usize) {
    if p.is_null() {
        return;
    }
    // SAFETY: see above; every element was built by `TensorOut::new`.
    unsafe {
        let all = Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n));
        for t in all.iter() {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(t.shape, t.ndim as usize)));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(t.data, t.len)));
        }
    }
}

/// A borrowed byte string.
#[repr(C)]
pub struct StrView {
    pub ptr: *const u8,
    pub len: usize,
}

/// How a script function is called.
pub const CALL_ENTRY_POINT: i32 = 0; // def f(tensors: List[Tensor], keys: List[str], args: List[str])
pub const CALL_POSITIONAL: i32 = 1; // AI.SCRIPTSET scripts: tensor arguments, optionally a trailing List[Tensor]

/// Every function returns 0 on success; on failure one of the codes above (`FAILED`, `REFUSED`, ...) and a
/// message in `*err` (freed with `rai_torch_free_string`).
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
pub type VersionFn = unsafe extern "C" fn() -> *mut c_char;
/// What a loaded model declares: forward()'s argument names (joined by '\n': TorchScript names are identifiers;
/// the string is freed with `FreeStringFn`) and the number of values it returns (a tuple counts its elements).
#[repr(C)]
pub struct ModelInfo {
    pub input_names: *mut c_char,
    pub noutputs: usize,
}

pub type ModelLoadFn = unsafe extern "C" fn(
    blob: *const u8,
    len: usize,
    gpu: i32,
    model: *mut *mut c_void,
    info: *mut ModelInfo,
    err: *mut *mut c_char,
) -> i32;
/// `timeout_ms` (MODEL_EXECUTION_TIMEOUT, 0: none) bounds the run: a loop or an allocation past it fails the run
/// with "TORCH: the run was cancelled after MODEL_EXECUTION_TIMEOUT (<ms> ms)".
pub type ModelRunFn = unsafe extern "C" fn(
    model: *mut c_void,
    inputs: *const TensorView,
    ninputs: usize,
    intra_threads: i32,
    timeout_ms: u64,
    outputs: *mut *mut TensorOut,
    noutputs: *mut usize,
    err: *mut *mut c_char,
) -> i32;
pub type FreeFn = unsafe extern "C" fn(ptr: *mut c_void);
pub type ScriptCompileFn =
    unsafe extern "C" fn(src: *const u8, len: usize, gpu: i32, script: *mut *mut c_void, err: *mut *mut c_char) -> i32;
pub type ScriptCheckEntryFn = unsafe extern "C" fn(script: *mut c_void, name: StrView, err: *mut *mut c_char) -> i32;
/// What a failed call returns: its kind, with its text in `err`, so that the module never reads the text to tell
/// them apart (torch/src/sandbox.h keeps the C++ side's copies of 1, 3, 4 and 5).
pub const FAILED: i32 = 1;
/// `ScriptRunFn`'s return value when the function's result holds no tensors.
pub const SCRIPT_NON_TENSOR: i32 = 2;
/// The sandbox refused the model or script ("TORCH model refused: …", sent with `ERR` like every admission refusal).
pub const REFUSED: i32 = 3;
/// The run passed MODEL_EXECUTION_TIMEOUT (the kill switch).
pub const TIMED_OUT: i32 = 4;
/// The run or load passed the backend memory bound (RedisAI's text, as ONNX's).
pub const OVER_MEMORY: i32 = 5;
/// GPU:n asked for and not there.
pub const NO_GPU: i32 = 6;

/// Returns 0 with the outputs, a failure's kind with its text in `err`, or `SCRIPT_NON_TENSOR` (with RedisAI's
/// message in `err`) when the function returned something other than tensors: the module decides whether that is
/// an error.
pub type ScriptRunFn = unsafe extern "C" fn(
    script: *mut c_void,
    function: StrView,
    call: i32,
    tensors: *const TensorView,
    ntensors: usize,
    list_from: isize,
    keys: *const StrView,
    nkeys: usize,
    args: *const StrView,
    nargs: usize,
    intra_threads: i32,
    timeout_ms: u64,
    outputs: *mut *mut TensorOut,
    noutputs: *mut usize,
    err: *mut *mut c_char,
) -> i32;
pub type FreeTensorsFn = unsafe extern "C" fn(tensors: *mut TensorOut, n: usize);
pub type FreeStringFn = unsafe extern "C" fn(s: *mut c_char);

/// What scripts may call back into the module (`redis.execute`, `redisAI.model_execute`). Given to the
/// backend once with `rai_torch_set_host`; the pointers stay valid for the life of the process.
#[repr(C)]
pub struct HostApi {
    /// Runs a Redis command (replicated); `*reply` gets Redis's reply encoded as RESP (free with `free_bytes`).
    pub redis_call: unsafe extern "C" fn(
        cmd: StrView,
        args: *const StrView,
        nargs: usize,
        reply: *mut *mut u8,
        len: *mut usize,
    ) -> i32,
    /// Runs the model stored at `key` on the calling thread.
    pub model_execute: unsafe extern "C" fn(
        key: StrView,
        inputs: *const TensorView,
        ninputs: usize,
        noutputs: usize,
        outputs: *mut *mut TensorOut,
        nout: *mut usize,
        err: *mut *mut c_char,
    ) -> i32,
    pub free_bytes: unsafe extern "C" fn(p: *mut u8, len: usize),
    pub free_tensors: unsafe extern "C" fn(p: *mut TensorOut, n: usize),
    pub free_string: unsafe extern "C" fn(p: *mut c_char),
}
pub type SetHostFn = unsafe extern "C" fn(host: *const HostApi);
/// Process-wide libtorch settings, called once right after the library is opened, before any model or script:
/// INTER_OP_PARALLELISM (`set_num_interop_threads`, which libtorch accepts only once per process; 0 leaves the
/// default) and the backend memory bound in bytes (0: unbounded), which installs the backend's sandbox (its
/// counting CPU allocator, the bounded string/list ops). On failure (the sandbox could not be installed) the
/// backend must not be used.
pub type ConfigureFn = unsafe extern "C" fn(inter_op_threads: i32, memory_bound: u64, err: *mut *mut c_char) -> i32;
/// Bytes of CPU tensors the backend holds now (models' weights and runs' tensors), as its allocator counts them.
pub type MemoryFn = unsafe extern "C" fn() -> u64;
