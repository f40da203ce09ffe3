//! What TorchScript scripts call back into: `redis.execute` (a Redis command under the global lock,
//! replicated) and `redisAI.model_execute` (a stored model, run on the calling worker).

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::raw;

use super::keyspace::Key;
use super::model_type::{ModelValue, MODEL_TYPE};
use crate::backends::torch_abi::{self, HostApi, StrView, TensorOut, TensorView};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::script::current_db;
use crate::tensor::{DataType, Tensor};

pub fn host_api() -> HostApi {
    HostApi { redis_call, model_execute, free_bytes, free_tensors, free_string }
}

/// SAFETY (callers): `v` points to `len` readable bytes for the call.
unsafe fn bytes<'a>(v: &StrView) -> &'a [u8] {
    if v.len == 0 {
        &[]
    } else {
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(v.ptr, v.len) }
    }
}

/// Runs `f` with a thread-safe context holding Redis's global lock, on the script's database.
fn locked<R>(f: impl FnOnce(*mut raw::RedisModuleCtx) -> R) -> R {
    // SAFETY: a detached thread-safe context may be created, locked and freed from any thread; it is
    // unlocked and freed before returning.
    unsafe {
        let ctx = raw::RedisModule_GetThreadSafeContext.expect("API initialised")(std::ptr::null_mut());
        raw::RedisModule_ThreadSafeContextLock.expect("API initialised")(ctx);
        raw::RedisModule_SelectDb.expect("API initialised")(ctx, current_db());
        let r = f(ctx);
        raw::RedisModule_ThreadSafeContextUnlock.expect("API initialised")(ctx);
        raw::RedisModule_FreeThreadSafeContext.expect("API initialised")(ctx);
        r
    }
}

/// A call reply as RESP2 (what the backend parses into TorchScript values).
fn encode(r: *mut raw::RedisModuleCallReply, out: &mut Vec<u8>) {
    let text = |out: &mut Vec<u8>| {
        let mut len = 0usize;
        let p = raw::call_reply_string_ptr(r, &mut len);
        // SAFETY: the reply owns `len` bytes at `p` while it lives.
        if p.is_null() { Vec::new() } else { unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec() }
            .into_iter()
            .for_each(|b| out.push(b));
    };
    match raw::call_reply_type(r) {
        raw::ReplyType::String | raw::ReplyType::VerbatimString | raw::ReplyType::BigNumber => {
            let mut body = Vec::new();
            text(&mut body);
            out.extend_from_slice(format!("${}\r\n", body.len()).as_bytes());
            out.extend_from_slice(&body);
            out.extend_from_slice(b"\r\n");
        }
        raw::ReplyType::Error => {
            let mut body = Vec::new();
            text(&mut body);
            out.push(b'-');
            out.extend(body.into_iter().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
            out.extend_from_slice(b"\r\n");
        }
        raw::ReplyType::Integer | raw::ReplyType::Bool => {
            out.extend_from_slice(format!(":{}\r\n", raw::call_reply_integer(r)).as_bytes());
        }
        raw::ReplyType::Array | raw::ReplyType::Set | raw::ReplyType::Map => {
            let n = raw::call_reply_length(r);
            out.extend_from_slice(format!("*{n}\r\n").as_bytes());
            for i in 0..n {
                encode(raw::call_reply_array_element(r, i), out);
            }
        }
        _ => out.extend_from_slice(b"$-1\r\n"),
    }
}

unsafe extern "C" fn redis_call(
    cmd: StrView,
    args: *const StrView,
    nargs: usize,
    reply: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    let resp = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the backend lends `nargs` views and the command for the duration of this call.
        let (cmd, args) =
            unsafe { (bytes(&cmd), if nargs == 0 { &[][..] } else { std::slice::from_raw_parts(args, nargs) }) };
        let Ok(name) = CString::new(cmd) else { return b"-ERR bad command name\r\n".to_vec() };
        locked(|ctx| {
            // SAFETY: ctx is locked; strings are created and freed with it; "!v" takes a vector and its
            // length and replicates the command, as RedisAI's redis.execute did.
            unsafe {
                let create = raw::RedisModule_CreateString.expect("API initialised");
                let mut argv: Vec<*mut raw::RedisModuleString> =
                    args.iter().map(|a| create(ctx, a.ptr as *const c_char, a.len)).collect();
                let r = raw::RedisModule_Call.expect("API initialised")(
                    ctx,
                    name.as_ptr(),
                    c"!v".as_ptr(),
                    argv.as_mut_ptr(),
                    argv.len(),
                );
                let mut out = Vec::new();
                if r.is_null() {
                    out.extend_from_slice(b"-ERR unknown command or wrong number of arguments\r\n");
                } else {
                    encode(r, &mut out);
                    raw::free_call_reply(r);
                }
                for s in argv {
                    raw::RedisModule_FreeString.expect("API initialised")(ctx, s);
                }
                out
            }
        })
    }))
    .unwrap_or_else(|_| b"-ERR internal error in redis.execute\r\n".to_vec());
    let boxed = resp.into_boxed_slice();
    // SAFETY: the out-pointers are writable; the buffer goes back through `free_bytes`.
    unsafe {
        *len = boxed.len();
        *reply = Box::into_raw(boxed) as *mut u8;
    }
    0
}

fn run_model(key: &[u8], inputs: &[TensorView], noutputs: usize) -> Result<Vec<Tensor>> {
    let model: Arc<Model> = locked(|ctx| {
        let k = Key::open_name(ctx, key, false);
        k.get::<ModelValue>(&MODEL_TYPE)?.cloned().ok_or(Error::ModelKeyEmpty)
    })?;
    let tensors = inputs
        .iter()
        .map(|v| {
            let dtype = *DataType::ALL.get(v.dtype as usize).ok_or(Error::InvalidDataType)?;
            // SAFETY: the backend lends each view's shape and data for the duration of the call.
            let (shape, data) = unsafe {
                (
                    if v.ndim == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(v.shape, v.ndim as usize).to_vec()
                    },
                    if v.len == 0 { &[][..] } else { std::slice::from_raw_parts(v.data, v.len) },
                )
            };
            Tensor::from_blob(dtype, shape, data)
        })
        .collect::<Result<Vec<_>>>()?;
    let outs = model.loaded()?.run(&tensors.iter().collect::<Vec<_>>())?;
    if outs.len() != noutputs {
        return Err(Error::Generic("Model did not generate the expected number of outputs".into()));
    }
    Ok(outs)
}

unsafe extern "C" fn model_execute(
    key: StrView,
    inputs: *const TensorView,
    ninputs: usize,
    noutputs: usize,
    outputs: *mut *mut TensorOut,
    nout: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the backend lends the key and `ninputs` views for the duration of this call.
        let (key, views) =
            unsafe { (bytes(&key), if ninputs == 0 { &[][..] } else { std::slice::from_raw_parts(inputs, ninputs) }) };
        run_model(key, views, noutputs)
    }))
    .unwrap_or_else(|_| Err(Error::Generic("internal error in redisAI.model_execute".into())));
    // SAFETY: the out-pointers are writable; what we hand out comes back through free_tensors/free_string.
    unsafe {
        match result {
            Ok(ts) => {
                let outs = ts
                    .into_iter()
                    .map(|t| {
                        let dtype = DataType::ALL.iter().position(|&d| d == t.dtype()).unwrap_or(0) as u32;
                        TensorOut::new(dtype, t.shape().to_vec(), t.data().to_vec())
                    })
                    .collect();
                torch_abi::give_outs(outs, outputs, nout);
                0
            }
            Err(e) => {
                *err = CString::new(e.reply_text().replace('\0', " ")).unwrap_or_default().into_raw();
                1
            }
        }
    }
}

unsafe extern "C" fn free_bytes(p: *mut u8, len: usize) {
    if !p.is_null() {
        // SAFETY: `p`/`len` came from `redis_call` and are freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
    }
}

unsafe extern "C" fn free_tensors(p: *mut TensorOut, n: usize) {
    // SAFETY: `p`/`n` came from `model_execute` (give_outs) and are freed once.
    unsafe { torch_abi::free_outs(p, n) }
}

unsafe extern "C" fn free_string(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: `p` came from `model_execute` (CString::into_raw) and is freed once.
        drop(unsafe { CString::from_raw(p) });
    }
}
