//! RedisAI's low-level API for other modules (include/redisai.h; docs/commands.md, "Low-level API"): every
//! function of RedisAI 1.2.7's, exported under its name through Redis's shared-API mechanism at load. A client
//! module gets them with `RedisModule_GetSharedAPI` (RedisAI_Initialize in the header).
//!
//! Handles are the engine's own values: a `RAI_Tensor *`, `RAI_Model *` or `RAI_Script *` is the pointer of an
//! `Arc` (what the keys store, so a key's value is a handle too), and shallow copies are references of that
//! `Arc`. Runs go through the engine's queues like the commands' (`run.rs`). Every function catches panics and
//! checks its pointers for NULL; beyond that, a pointer must be what the header says it is (C cannot be checked).

mod ctx;
mod dag;
mod error;
mod model;
mod run;
mod script;
mod tensor;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::Arc;

use redis_module::raw;

use super::ctx::Ctx;
use super::gil::Gil;
use super::keyspace::Key;
use super::module_type::ModuleType;
use crate::error::Error;
use error::RaiError;

/// RedisAI's LLAPI version (INFO's `ai_low_level_API_version`).
pub const VERSION: c_int = 1;

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// Runs an API function: a panic becomes `fallback` and a log line, never an unwind into the caller's C.
fn ffi<R>(name: &str, fallback: R, f: impl FnOnce() -> R) -> R {
    super::types::guard(name, fallback, f)
}

/// RedisAI_*Free of a tensor, model or script: the caller's reference given back (NULL is ignored).
fn free_handle<T>(name: &str, p: *const T) {
    // SAFETY: NULL or a reference the caller owns (from a create or a shallow copy), given back once.
    ffi(name, (), || unsafe { release(p) })
}

/// RedisAI_*GetShallowCopy: one more reference to the handle's value (NULL for NULL).
fn shallow_copy<T>(name: &str, p: *const T) -> *mut T {
    // SAFETY: NULL or a live handle.
    ffi(name, std::ptr::null_mut(), || unsafe { share(p) }.map_or(std::ptr::null_mut(), hand_out))
}

/// A handle's value, for the call.
///
/// # Safety
/// `p` is NULL or the pointer of a live `Arc<T>` (a key's value or a reference the API handed out), alive for
/// the caller's use of the result.
unsafe fn borrow<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: see the contract.
    unsafe { p.as_ref() }
}

/// One more reference to a handle's value.
///
/// # Safety
/// As for `borrow`.
unsafe fn share<T>(p: *const T) -> Option<Arc<T>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a live `Arc<T>`'s pointer: adding a count and taking it as an `Arc` leaves the holder's intact.
    unsafe {
        Arc::increment_strong_count(p);
        Some(Arc::from_raw(p))
    }
}

/// Gives back one reference the caller held.
///
/// # Safety
/// `p` is NULL or a reference of a live `Arc<T>` that the caller owns and gives back once.
unsafe fn release<T>(p: *const T) {
    if !p.is_null() {
        // SAFETY: see the contract.
        unsafe { Arc::decrement_strong_count(p) };
    }
}

/// A reference handed to the caller (who gives it back with the matching free).
fn hand_out<T>(a: Arc<T>) -> *mut T {
    Arc::into_raw(a) as *mut T
}

/// The handle's value to change, only when the caller's is its one reference (no key, run or copy sees it).
///
/// # Safety
/// As for `borrow`, and the caller does not use the handle from another thread during the call.
unsafe fn unique<'a, T>(p: *const T) -> Option<&'a mut T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a live `Arc<T>`'s pointer, looked at without taking its count (ManuallyDrop). With one strong
    // reference and no weak one, nothing else can read the value while the caller changes it.
    unsafe {
        let mut arc = ManuallyDrop::new(Arc::from_raw(p));
        Arc::get_mut(&mut arc).map(|v| &mut *(v as *mut T))
    }
}

/// A NUL-terminated string's bytes (None for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string alive for the caller's use of the result.
unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: see the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// `n` NUL-terminated names (None when the array or one name is NULL).
///
/// # Safety
/// `p` is NULL or an array of `n` strings as for `cstr`.
unsafe fn names(p: *const *const c_char, n: usize) -> Option<Vec<String>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: see the contract.
    unsafe { std::slice::from_raw_parts(p, n) }
        .iter()
        .map(|&s| unsafe { cstr(s) }.map(|b| String::from_utf8_lossy(b).into_owned()))
        .collect()
}

/// `len` bytes (None for NULL with a length).
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes alive for the caller's use of the result.
unsafe fn bytes<'a>(p: *const c_char, len: usize) -> Option<&'a [u8]> {
    match (p.is_null(), len) {
        (_, 0) => Some(&[]),
        (true, _) => None,
        // SAFETY: see the contract.
        (false, _) => Some(unsafe { std::slice::from_raw_parts(p as *const u8, len) }),
    }
}

/// The value of a key of type `ty`, borrowed from the key (RedisAI_Get{Model,Script}FromKeyspace).
///
/// # Safety
/// `ctx` is the caller's live context (holding Redis's lock), `key` a live string, `out` writable; `err` as
/// for `error::set`.
#[allow(clippy::too_many_arguments)]
unsafe fn from_keyspace<T>(
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleString,
    out: *mut *mut T,
    mode: c_int,
    err: *mut RaiError,
    ty: &ModuleType<T>,
    empty: Error,
    code: c_int,
) -> c_int {
    if ctx.is_null() || key.is_null() || out.is_null() {
        // SAFETY: NULL or the caller's live error.
        unsafe { error::set(err, code, &Error::parse("no context, key or result given")) };
        return ERR;
    }
    // SAFETY: the caller's context, live for the call.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    let write = mode & raw::KeyMode::WRITE.bits() != 0;
    let k = Key::open(ctx, key, write);
    let found = k.get(ty).and_then(|v| v.ok_or(empty));
    match found {
        Ok(v) => {
            // SAFETY: the caller's out-parameter. The value stays the key's (no reference is taken).
            unsafe { *out = v as *const T as *mut T };
            OK
        }
        Err(e) => {
            // SAFETY: as above.
            unsafe { error::set(err, code, &e) };
            ERR
        }
    }
}

/// Runs `f` with a context that may open keys (database 0): under Redis's lock, taken here on a thread
/// that does not hold it.
fn with_keyspace<R>(f: impl FnOnce(Ctx<'_>) -> R) -> R {
    match Gil::lock() {
        Ok(gil) => f(gil.ctx()),
        Err(_) => {
            // This thread holds the lock (Redis's main thread): a detached context of its own to open keys with.
            // SAFETY: a detached thread-safe context, used on this thread under the lock it holds, then freed.
            unsafe {
                let raw = api!(RedisModule_GetThreadSafeContext)(std::ptr::null_mut());
                let r = f(Ctx::from_raw(raw));
                api!(RedisModule_FreeThreadSafeContext)(raw);
                r
            }
        }
    }
}

extern "C" fn get_llapi_version() -> c_int {
    VERSION
}

/// Exports every function (RedisAI_OnLoad did the same); false when the server refuses one.
pub fn export(ctx: Ctx<'_>) -> bool {
    let table: &[(&CStr, *mut c_void)] = &[
        (c"RedisAI_InitError", error::init_error as *mut c_void),
        (c"RedisAI_ClearError", error::clear_error as *mut c_void),
        (c"RedisAI_FreeError", error::free_error as *mut c_void),
        (c"RedisAI_GetError", error::get_error as *mut c_void),
        (c"RedisAI_GetErrorOneLine", error::get_error_one_line as *mut c_void),
        (c"RedisAI_GetErrorCode", error::get_error_code as *mut c_void),
        (c"RedisAI_CloneError", error::clone_error as *mut c_void),
        (c"RedisAI_GetLLAPIVersion", get_llapi_version as *mut c_void),
        (c"RedisAI_TensorCreate", tensor::create as *mut c_void),
        (c"RedisAI_TensorCreateByConcatenatingTensors", tensor::create_by_concatenating as *mut c_void),
        (c"RedisAI_TensorCreateBySlicingTensor", tensor::create_by_slicing as *mut c_void),
        (c"RedisAI_TensorLength", tensor::length as *mut c_void),
        (c"RedisAI_TensorDataSize", tensor::data_size as *mut c_void),
        (c"RedisAI_TensorDataType", tensor::data_type as *mut c_void),
        (c"RedisAI_TensorFree", tensor::free as *mut c_void),
        (c"RedisAI_TensorSetData", tensor::set_data as *mut c_void),
        (c"RedisAI_TensorSetValueFromLongLong", tensor::set_value_from_long_long as *mut c_void),
        (c"RedisAI_TensorSetValueFromDouble", tensor::set_value_from_double as *mut c_void),
        (c"RedisAI_TensorGetValueAsDouble", tensor::get_value_as_double as *mut c_void),
        (c"RedisAI_TensorGetValueAsLongLong", tensor::get_value_as_long_long as *mut c_void),
        (c"RedisAI_TensorGetShallowCopy", tensor::get_shallow_copy as *mut c_void),
        (c"RedisAI_TensorNumDims", tensor::num_dims as *mut c_void),
        (c"RedisAI_TensorDim", tensor::dim as *mut c_void),
        (c"RedisAI_TensorByteSize", tensor::byte_size as *mut c_void),
        (c"RedisAI_TensorData", tensor::data as *mut c_void),
        (c"RedisAI_TensorRedisType", tensor::redis_type as *mut c_void),
        (c"RedisAI_ModelCreate", model::create as *mut c_void),
        (c"RedisAI_ModelFree", model::free as *mut c_void),
        (c"RedisAI_ModelRunCtxCreate", model::run_ctx_create as *mut c_void),
        (c"RedisAI_GetModelFromKeyspace", model::get_from_keyspace as *mut c_void),
        (c"RedisAI_ModelRunCtxAddInput", model::run_ctx_add_input as *mut c_void),
        (c"RedisAI_ModelRunCtxAddOutput", model::run_ctx_add_output as *mut c_void),
        (c"RedisAI_ModelRunCtxNumOutputs", model::run_ctx_num_outputs as *mut c_void),
        (c"RedisAI_ModelRunCtxOutputTensor", model::run_ctx_output_tensor as *mut c_void),
        (c"RedisAI_ModelRunCtxFree", model::run_ctx_free as *mut c_void),
        (c"RedisAI_ModelRun", model::run as *mut c_void),
        (c"RedisAI_ModelGetShallowCopy", model::get_shallow_copy as *mut c_void),
        (c"RedisAI_ModelSerialize", model::serialize as *mut c_void),
        (c"RedisAI_ModelRedisType", model::redis_type as *mut c_void),
        (c"RedisAI_ModelRunAsync", model::run_async as *mut c_void),
        (c"RedisAI_GetAsModelRunCtx", model::get_as_run_ctx as *mut c_void),
        (c"RedisAI_ScriptCreate", script::create as *mut c_void),
        (c"RedisAI_GetScriptFromKeyspace", script::get_from_keyspace as *mut c_void),
        (c"RedisAI_ScriptFree", script::free as *mut c_void),
        (c"RedisAI_ScriptRunCtxCreate", script::run_ctx_create as *mut c_void),
        (c"RedisAI_ScriptRunCtxAddInput", script::run_ctx_add_input as *mut c_void),
        (c"RedisAI_ScriptRunCtxAddInputList", script::run_ctx_add_input_list as *mut c_void),
        (c"RedisAI_ScriptRunCtxAddTensorInput", script::run_ctx_add_tensor_input as *mut c_void),
        (c"RedisAI_ScriptRunCtxAddTensorInputList", script::run_ctx_add_tensor_input_list as *mut c_void),
        (c"RedisAI_ScriptRunCtxAddOutput", script::run_ctx_add_output as *mut c_void),
        (c"RedisAI_ScriptRunCtxNumOutputs", script::run_ctx_num_outputs as *mut c_void),
        (c"RedisAI_ScriptRunCtxOutputTensor", script::run_ctx_output_tensor as *mut c_void),
        (c"RedisAI_ScriptRunCtxFree", script::run_ctx_free as *mut c_void),
        (c"RedisAI_ScriptRun", script::run as *mut c_void),
        (c"RedisAI_ScriptGetShallowCopy", script::get_shallow_copy as *mut c_void),
        (c"RedisAI_ScriptRedisType", script::redis_type as *mut c_void),
        (c"RedisAI_ScriptRunAsync", script::run_async as *mut c_void),
        (c"RedisAI_GetAsScriptRunCtx", script::get_as_run_ctx as *mut c_void),
        (c"RedisAI_DAGRunCtxCreate", dag::create as *mut c_void),
        (c"RedisAI_DAGCreateModelRunOp", dag::create_model_run_op as *mut c_void),
        (c"RedisAI_DAGCreateScriptRunOp", dag::create_script_run_op as *mut c_void),
        (c"RedisAI_DAGRunOpAddInput", dag::run_op_add_input as *mut c_void),
        (c"RedisAI_DAGRunOpAddOutput", dag::run_op_add_output as *mut c_void),
        (c"RedisAI_DAGAddRunOp", dag::add_run_op as *mut c_void),
        (c"RedisAI_DAGLoadTensor", dag::load_tensor as *mut c_void),
        (c"RedisAI_DAGAddTensorSet", dag::add_tensor_set as *mut c_void),
        (c"RedisAI_DAGAddTensorGet", dag::add_tensor_get as *mut c_void),
        (c"RedisAI_DAGAddOpsFromString", dag::add_ops_from_string as *mut c_void),
        (c"RedisAI_DAGNumOps", dag::num_ops as *mut c_void),
        (c"RedisAI_DAGRun", dag::run as *mut c_void),
        (c"RedisAI_DAGNumOutputs", dag::num_outputs as *mut c_void),
        (c"RedisAI_DAGOutputTensor", dag::output_tensor as *mut c_void),
        (c"RedisAI_DAGRunError", dag::run_error as *mut c_void),
        (c"RedisAI_DAGGetError", dag::get_error as *mut c_void),
        (c"RedisAI_DAGRunOpFree", dag::run_op_free as *mut c_void),
        (c"RedisAI_DAGFree", dag::free as *mut c_void),
    ];
    table.iter().all(|(name, f)| {
        // SAFETY: the loading context; Redis keeps the name's pointer, and these are static strings.
        unsafe { api!(RedisModule_ExportSharedAPI)(ctx.as_ptr(), name.as_ptr(), *f) == OK }
    })
}
