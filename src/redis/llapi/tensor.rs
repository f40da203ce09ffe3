//! Tensor functions. A `RAI_Tensor *` is the pointer of an `Arc<Tensor>` (what an AI_TENSOR key stores, see
//! module_type.rs), so a key's value and a tensor made here are the same kind of handle.

use std::ffi::{c_char, c_int, c_longlong, CStr};
use std::sync::Arc;

use super::{borrow, ffi, free_handle, hand_out, shallow_copy, unique};
use crate::tensor::{DataType, Number, Tensor};

pub extern "C" fn create(dtype: *const c_char, dims: *const c_longlong, ndims: c_int) -> *mut Tensor {
    ffi("RedisAI_TensorCreate", std::ptr::null_mut(), || {
        if dtype.is_null() || ndims < 0 || (dims.is_null() && ndims > 0) {
            return std::ptr::null_mut();
        }
        // SAFETY: a NUL-terminated type name and `ndims` dimensions, lent for the call.
        let (name, shape) = unsafe {
            let shape = if ndims == 0 { &[][..] } else { std::slice::from_raw_parts(dims, ndims as usize) };
            (CStr::from_ptr(dtype).to_bytes(), shape.to_vec())
        };
        if shape.iter().any(|&d| d < 0) || shape.len() > crate::tensor::MAX_DIMS {
            return std::ptr::null_mut();
        }
        DataType::parse(name)
            .and_then(|t| Tensor::zeros(t, shape))
            .map_or(std::ptr::null_mut(), |t| hand_out(Arc::new(t)))
    })
}

pub extern "C" fn create_by_concatenating(ts: *const *const Tensor, n: c_longlong) -> *mut Tensor {
    ffi("RedisAI_TensorCreateByConcatenatingTensors", std::ptr::null_mut(), || {
        if ts.is_null() || n <= 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: `n` tensor handles, lent for the call.
        let parts: Option<Vec<&Tensor>> =
            unsafe { std::slice::from_raw_parts(ts, n as usize) }.iter().map(|&t| unsafe { borrow(t) }).collect();
        parts.and_then(|p| Tensor::concat(&p).ok()).map_or(std::ptr::null_mut(), |t| hand_out(Arc::new(t)))
    })
}

pub extern "C" fn create_by_slicing(t: *const Tensor, offset: c_longlong, len: c_longlong) -> *mut Tensor {
    ffi("RedisAI_TensorCreateBySlicingTensor", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live tensor handle.
        let Some(t) = (unsafe { borrow(t) }) else { return std::ptr::null_mut() };
        if offset < 0 || len < 0 {
            return std::ptr::null_mut();
        }
        t.slice_dim0(offset as usize, len as usize).map_or(std::ptr::null_mut(), |t| hand_out(Arc::new(t)))
    })
}

/// Reads a tensor through its handle (`fallback` for NULL).
fn with<R: Copy>(name: &str, t: *const Tensor, fallback: R, f: impl FnOnce(&Tensor) -> R) -> R {
    // SAFETY: NULL or a live tensor handle, lent for the call.
    ffi(name, fallback, || unsafe { borrow(t) }.map_or(fallback, f))
}

/// Writes a value where the caller asked for it: 1, or 0 when there is none (or nowhere to write it).
fn put<V>(v: Option<V>, out: *mut V) -> c_int {
    match v {
        Some(v) if !out.is_null() => {
            // SAFETY: the caller's out-parameter, writable for the call.
            unsafe { out.write(v) };
            1
        }
        _ => 0,
    }
}

pub extern "C" fn length(t: *const Tensor) -> usize {
    with("RedisAI_TensorLength", t, 0, Tensor::len)
}

pub extern "C" fn data_size(t: *const Tensor) -> usize {
    with("RedisAI_TensorDataSize", t, 0, |t| t.dtype().elem_size())
}

/// RedisAI's `DLDataType` (code, bits, lanes = 1) in the integer its API returns it as.
pub extern "C" fn data_type(t: *const Tensor) -> usize {
    with("RedisAI_TensorDataType", t, 0, |t| {
        let (code, bits) = t.dtype().dlpack();
        (code as usize & 0xff) | ((bits as usize & 0xff) << 8) | (1 << 16)
    })
}

pub extern "C" fn free(t: *const Tensor) {
    free_handle("RedisAI_TensorFree", t)
}

/// Changes a tensor nobody else holds (0 when it is shared: its other holders see it immutable).
fn change(name: &str, t: *const Tensor, f: impl FnOnce(&mut Tensor) -> bool) -> c_int {
    // SAFETY: NULL or a live tensor handle; `unique` gives it out only when this is its one reference.
    ffi(name, 0, || unsafe { unique(t) }.is_some_and(f) as c_int)
}

pub extern "C" fn set_data(t: *const Tensor, data: *const c_char, len: usize) -> c_int {
    if data.is_null() && len > 0 {
        return 0;
    }
    change("RedisAI_TensorSetData", t, |t| {
        // SAFETY: `len` bytes lent for the call.
        let blob = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(data as *const u8, len) } };
        t.set_data(blob).is_ok()
    })
}

pub extern "C" fn set_value_from_long_long(t: *const Tensor, i: c_longlong, val: c_longlong) -> c_int {
    change("RedisAI_TensorSetValueFromLongLong", t, |t| i >= 0 && t.set_number(i as usize, Number::I64(val)).is_ok())
}

pub extern "C" fn set_value_from_double(t: *const Tensor, i: c_longlong, val: f64) -> c_int {
    change("RedisAI_TensorSetValueFromDouble", t, |t| i >= 0 && t.set_number(i as usize, Number::F64(val)).is_ok())
}

pub extern "C" fn get_value_as_double(t: *const Tensor, i: c_longlong, val: *mut f64) -> c_int {
    with("RedisAI_TensorGetValueAsDouble", t, 0, |t| put(usize::try_from(i).ok().and_then(|i| t.get_f64(i)), val))
}

pub extern "C" fn get_value_as_long_long(t: *const Tensor, i: c_longlong, val: *mut c_longlong) -> c_int {
    with("RedisAI_TensorGetValueAsLongLong", t, 0, |t| put(usize::try_from(i).ok().and_then(|i| t.get_i64(i)), val))
}

pub extern "C" fn get_shallow_copy(t: *const Tensor) -> *mut Tensor {
    shallow_copy("RedisAI_TensorGetShallowCopy", t)
}

pub extern "C" fn num_dims(t: *const Tensor) -> c_int {
    with("RedisAI_TensorNumDims", t, 0, |t| t.shape().len() as c_int)
}

pub extern "C" fn dim(t: *const Tensor, dim: c_int) -> c_longlong {
    with("RedisAI_TensorDim", t, -1, |t| {
        usize::try_from(dim).ok().and_then(|d| t.shape().get(d).copied()).unwrap_or(-1)
    })
}

pub extern "C" fn byte_size(t: *const Tensor) -> usize {
    with("RedisAI_TensorByteSize", t, 0, |t| t.data().len())
}

/// The data. Writable only for a tensor nobody else holds (as one made by RedisAI_TensorCreate): the others'
/// data is shared with keys and runs, and must not be written through this pointer.
pub extern "C" fn data(t: *const Tensor) -> *mut c_char {
    ffi("RedisAI_TensorData", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live tensor handle; `unique` only for its one reference.
        if let Some(t) = unsafe { unique(t) } {
            return t.data_mut().as_mut_ptr() as *mut c_char;
        }
        // SAFETY: as above.
        unsafe { borrow(t) }.map_or(std::ptr::null_mut(), |t| t.data().as_ptr() as *mut c_char)
    })
}

pub extern "C" fn redis_type() -> *mut redis_module::raw::RedisModuleType {
    ffi("RedisAI_TensorRedisType", std::ptr::null_mut(), || *crate::redis::types::TENSOR_TYPE.raw.raw_type.borrow())
}
