//! Script functions. A `RAI_Script *` is the pointer of an `Arc<Script>`, as an AI_SCRIPT key stores it.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::ctx::{self, ctx_mut, OnFinishCtx, RunCtx};
use super::error::{self, RaiError};
use super::run::OnFinish;
use super::{cstr, ffi, free_handle, from_keyspace, hand_out, shallow_copy, share, ERR};
use crate::commands::dag_builder::CallOp;
use crate::error::Error;
use crate::redis::script_type::SCRIPT_TYPE;
use crate::script::{Script, ScriptSpec};
use crate::tensor::Tensor;

/// Compiles a script as AI.SCRIPTSET does (no entry points: its functions take positional tensors).
pub extern "C" fn create(
    devicestr: *const c_char,
    tag: *const c_char,
    scriptdef: *const c_char,
    err: *mut RaiError,
) -> *mut Script {
    ffi("RedisAI_ScriptCreate", std::ptr::null_mut(), || {
        // SAFETY: NUL-terminated strings lent for the call.
        let (device, tag, source) = unsafe { (cstr(devicestr), cstr(tag), cstr(scriptdef)) };
        let (Some(device), Some(source)) = (device, source) else {
            // SAFETY: NULL or the caller's live error.
            unsafe { error::set(err, error::ESCRIPTCREATE, &Error::parse("invalid script definition arguments")) };
            return std::ptr::null_mut();
        };
        let spec = ScriptSpec {
            device_name: String::from_utf8_lossy(device).into_owned(),
            tag: tag.unwrap_or_default().to_vec(),
            source: String::from_utf8_lossy(source).into_owned(),
            entry_points: Vec::new(),
        };
        let script = Script::build(b"", spec).and_then(|s| crate::exec::queue_of(&s.queue_key()).map(|_| s));
        match script {
            Ok(s) => hand_out(Arc::new(s)),
            Err(e) => {
                // SAFETY: as above.
                unsafe { error::set(err, error::ESCRIPTCREATE, &e) };
                std::ptr::null_mut()
            }
        }
    })
}

pub extern "C" fn free(script: *const Script, _err: *mut RaiError) {
    free_handle("RedisAI_ScriptFree", script)
}

pub extern "C" fn get_shallow_copy(script: *const Script) -> *mut Script {
    shallow_copy("RedisAI_ScriptGetShallowCopy", script)
}

pub extern "C" fn get_from_keyspace(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key: *mut redis_module::raw::RedisModuleString,
    script: *mut *mut Script,
    mode: c_int,
    err: *mut RaiError,
) -> c_int {
    // SAFETY: the caller's context and key name, and where to put the script, lent for the call.
    ffi("RedisAI_GetScriptFromKeyspace", ERR, || unsafe {
        from_keyspace(ctx, key, script, mode, err, &SCRIPT_TYPE, Error::ScriptKeyEmpty, error::ESCRIPTRUN)
    })
}

pub extern "C" fn redis_type() -> *mut redis_module::raw::RedisModuleType {
    ffi("RedisAI_ScriptRedisType", std::ptr::null_mut(), || *SCRIPT_TYPE.raw.raw_type.borrow())
}

pub extern "C" fn run_ctx_create(script: *const Script, fnname: *const c_char) -> *mut RunCtx {
    ffi("RedisAI_ScriptRunCtxCreate", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live script handle (the context keeps a reference) and a NUL-terminated name.
        match unsafe { (share(script), cstr(fnname)) } {
            (Some(s), Some(f)) => Box::into_raw(Box::new(RunCtx::new(CallOp::script(s, f, None)))),
            _ => std::ptr::null_mut(),
        }
    })
}

/// One tensor argument. After a list, refused: only a call's last arguments can form its List[Tensor].
fn add_one(name: &str, sctx: *mut RunCtx, t: *const Tensor) -> c_int {
    // SAFETY: NULL or a live context.
    if unsafe { ctx_mut(sctx) }.is_some_and(|c| c.list_from.is_some()) {
        return 0;
    }
    ctx::add_input(name, sctx, t)
}

/// Tensors passed together as one List[Tensor] argument.
fn add_list(name: &str, sctx: *mut RunCtx, ts: *const *const Tensor, n: usize) -> c_int {
    ffi(name, 0, || {
        // SAFETY: NULL or a live context.
        let Some(c) = (unsafe { ctx_mut(sctx) }) else { return 0 };
        if c.list_from.is_some() || (ts.is_null() && n > 0) {
            return 0;
        }
        // SAFETY: `n` tensor handles lent for the call (not NULL: checked above).
        let list = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ts, n) } };
        // SAFETY: each a live tensor handle: the context keeps a reference of its own.
        let Some(list) = list.iter().map(|&t| unsafe { share(t) }).collect::<Option<Vec<_>>>() else { return 0 };
        c.list_from = Some(c.op.inputs.len());
        list.into_iter().for_each(|t| c.add_input(t));
        1
    })
}

pub extern "C" fn run_ctx_add_input(sctx: *mut RunCtx, t: *const Tensor, _err: *mut RaiError) -> c_int {
    add_one("RedisAI_ScriptRunCtxAddInput", sctx, t)
}

pub extern "C" fn run_ctx_add_input_list(
    sctx: *mut RunCtx,
    ts: *const *const Tensor,
    n: usize,
    _err: *mut RaiError,
) -> c_int {
    add_list("RedisAI_ScriptRunCtxAddInputList", sctx, ts, n)
}

pub extern "C" fn run_ctx_add_tensor_input(sctx: *mut RunCtx, t: *const Tensor) -> c_int {
    add_one("RedisAI_ScriptRunCtxAddTensorInput", sctx, t)
}

pub extern "C" fn run_ctx_add_tensor_input_list(sctx: *mut RunCtx, ts: *const *const Tensor, n: usize) -> c_int {
    add_list("RedisAI_ScriptRunCtxAddTensorInputList", sctx, ts, n)
}

pub extern "C" fn run_ctx_add_output(sctx: *mut RunCtx) -> c_int {
    ctx::add_output("RedisAI_ScriptRunCtxAddOutput", sctx)
}

pub extern "C" fn run_ctx_num_outputs(sctx: *mut RunCtx) -> usize {
    ctx::num_outputs("RedisAI_ScriptRunCtxNumOutputs", sctx)
}

pub extern "C" fn run_ctx_output_tensor(sctx: *mut RunCtx, index: usize) -> *mut Tensor {
    ctx::output_tensor("RedisAI_ScriptRunCtxOutputTensor", sctx, index)
}

pub extern "C" fn run_ctx_free(sctx: *mut RunCtx) {
    ctx::free("RedisAI_ScriptRunCtxFree", sctx)
}

pub extern "C" fn run(sctx: *mut RunCtx, err: *mut RaiError) -> c_int {
    let one = [sctx];
    ctx::run_sync("RedisAI_ScriptRun", one.as_ptr(), 1, err)
}

pub extern "C" fn run_async(sctx: *mut RunCtx, cb: OnFinish<OnFinishCtx>, data: *mut c_void) -> c_int {
    ctx::run_async("RedisAI_ScriptRunAsync", sctx, cb, data)
}

pub extern "C" fn get_as_run_ctx(finished: *mut OnFinishCtx, err: *mut RaiError) -> *mut RunCtx {
    ctx::get_as("RedisAI_GetAsScriptRunCtx", finished, false, err)
}
