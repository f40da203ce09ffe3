//! The host side of the TORCH ABI in Rust terms: what `redis.execute` and `redisAI.model_execute` answer, turned
//! into the C functions the backend calls (`torch_abi::HostApi`), once for every host. Not in `torch_abi.rs`,
//! which the backend library shares and which names nothing of this crate.

use std::ffi::c_char;

use super::torch_abi::{free_outs, give_outs, HostApi, StrView, TensorOut, TensorView};
use crate::error::{Error, Result};
use crate::tensor::{DataType, Tensor};

/// The two calls a host answers, in Rust terms: Redis's process (`redis::script_host`) and a worker
/// (`isolation::worker`, which sends them back to Redis) each implement them, and `host_api` makes the C
/// functions the backend calls from them, so that the ABI's conversions and frees exist once.
pub trait Host {
    /// `redis.execute(words...)`: Redis's reply as RESP2, or an error reply.
    fn execute(words: &[&[u8]]) -> Vec<u8>;
    /// `redisAI.model_execute(key, inputs, noutputs)`.
    fn model_execute(key: &[u8], inputs: Vec<Tensor>, noutputs: usize) -> Result<Vec<Tensor>>;
}

pub fn host_api<H: Host>() -> HostApi {
    HostApi {
        redis_call: host_redis_call::<H>,
        model_execute: host_model_execute::<H>,
        free_bytes: host_free_bytes,
        free_tensors: host_free_tensors,
        free_string: host_free_string,
    }
}

/// # Safety
/// `v` points to `len` readable bytes for the call.
unsafe fn view_bytes<'a>(v: &StrView) -> &'a [u8] {
    if v.len == 0 {
        &[]
    } else {
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(v.ptr, v.len) }
    }
}

/// # Safety
/// `p` points to `n` readable values for the call (or `n` is 0).
unsafe fn view_slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// A tensor from a view the backend lends.
///
/// # Safety
/// The view's shape and data are readable for the call.
pub unsafe fn tensor_from_view(v: &TensorView) -> Result<Tensor> {
    let dtype = *DataType::ALL.get(v.dtype as usize).ok_or(Error::InvalidDataType)?;
    // SAFETY: see above.
    let (shape, data) = unsafe { (view_slice(v.shape, v.ndim as usize), view_slice(v.data, v.len)) };
    Tensor::from_blob(dtype, shape, data)
}

unsafe extern "C" fn host_redis_call<H: Host>(
    cmd: StrView,
    args: *const StrView,
    nargs: usize,
    reply: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    // SAFETY: the backend lends the command and `nargs` views for the duration of this call.
    let words: Vec<&[u8]> = unsafe {
        std::iter::once(view_bytes(&cmd)).chain(view_slice(args, nargs).iter().map(|a| view_bytes(a))).collect()
    };
    let resp = std::panic::catch_unwind(|| H::execute(&words))
        .unwrap_or_else(|_| b"-ERR internal error in redis.execute\r\n".to_vec());
    let boxed = resp.into_boxed_slice();
    // SAFETY: the out-pointers are writable; the buffer comes back through `host_free_bytes`.
    unsafe {
        *len = boxed.len();
        *reply = Box::into_raw(boxed) as *mut u8;
    }
    0
}

unsafe extern "C" fn host_model_execute<H: Host>(
    key: StrView,
    inputs: *const TensorView,
    ninputs: usize,
    noutputs: usize,
    outputs: *mut *mut TensorOut,
    nout: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    let result = std::panic::catch_unwind(|| {
        // SAFETY: the backend lends the key and `ninputs` views for the duration of this call.
        let (key, views) = unsafe { (view_bytes(&key), view_slice(inputs, ninputs)) };
        // SAFETY: as above, each view is readable for the call.
        let tensors = views.iter().map(|v| unsafe { tensor_from_view(v) }).collect::<Result<_>>()?;
        H::model_execute(key, tensors, noutputs)
    })
    .unwrap_or_else(|_| Err(Error::Internal("internal error in redisAI.model_execute".into())));
    // SAFETY: the out-pointers are writable; what we hand out comes back through host_free_tensors/_string.
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
                give_outs(outs, outputs, nout);
                0
            }
            Err(e) => {
                *err = std::ffi::CString::new(e.reply_text().replace('\0', " ")).unwrap_or_default().into_raw();
                1
            }
        }
    }
}

unsafe extern "C" fn host_free_bytes(p: *mut u8, len: usize) {
    if !p.is_null() {
        // SAFETY: `p`/`len` came from `host_redis_call` and are freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
    }
}

unsafe extern "C" fn host_free_tensors(p: *mut TensorOut, n: usize) {
    // SAFETY: `p`/`n` came from `host_model_execute` (give_outs) and are freed once.
    unsafe { free_outs(p, n) }
}

unsafe extern "C" fn host_free_string(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: `p` came from `host_model_execute` (CString::into_raw) and is freed once.
        drop(unsafe { std::ffi::CString::from_raw(p) });
    }
}
