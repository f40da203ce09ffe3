//! The module's Redis data types and their callbacks (RDB, AOF rewrite, MEMORY USAGE, COPY, free).

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::raw;

use super::io::Io;
use super::log_warning;
use super::module_type::ModuleType;
use crate::commands::tensor::tensorset_words;
use crate::rdb::{load_tensor, save_tensor, ENCVER};
use crate::tensor::Tensor;

pub static TENSOR_TYPE: ModuleType<Tensor> = ModuleType::new(
    "AI_TENSOR",
    ENCVER,
    type_methods(
        Some(tensor_rdb_load),
        Some(tensor_rdb_save),
        Some(tensor_aof_rewrite),
        Some(tensor_mem_usage),
        Some(tensor_free),
        Some(tensor_copy),
    ),
);

/// The type callbacks the module implements; the others stay unset.
pub(super) const fn type_methods(
    rdb_load: raw::RedisModuleTypeLoadFunc,
    rdb_save: raw::RedisModuleTypeSaveFunc,
    aof_rewrite: raw::RedisModuleTypeRewriteFunc,
    mem_usage: raw::RedisModuleTypeMemUsageFunc,
    free: raw::RedisModuleTypeFreeFunc,
    copy: raw::RedisModuleTypeCopyFunc,
) -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load,
        rdb_save,
        aof_rewrite,
        mem_usage,
        digest: None,
        free,
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    }
}

/// Runs a type callback, turning a panic into `fallback` and a log line: nothing may unwind into Redis.
pub(super) fn guard<R>(what: &str, fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log_warning(&format!("redisai: panic in {what}; the operation was abandoned"));
        fallback
    })
}

/// SAFETY (for every callback below): Redis passes a `value` that was stored by `Key::set` or returned by
/// `tensor_rdb_load`/`tensor_copy`, i.e. made by `ModuleType::into_value` of TENSOR_TYPE.
unsafe fn tensor_ref<'a>(value: *const c_void) -> &'a Tensor {
    // SAFETY: see above; Redis keeps the value alive for the duration of the callback.
    unsafe { ModuleType::<Tensor>::value(value) }
}

extern "C" fn tensor_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("AI_TENSOR rdb_load", std::ptr::null_mut(), || match load_tensor(&mut Io(rdb), encver) {
        Ok(t) => ModuleType::into_value(Arc::new(t)),
        Err(e) => {
            log_warning(&format!("redisai: cannot load tensor: {e}"));
            std::ptr::null_mut()
        }
    })
}

extern "C" fn tensor_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: see `tensor_ref`.
    guard("AI_TENSOR rdb_save", (), || save_tensor(unsafe { tensor_ref(value) }, &mut Io(rdb)))
}

extern "C" fn tensor_aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    guard("AI_TENSOR aof_rewrite", (), || {
        // SAFETY: see `tensor_ref`.
        let t = unsafe { tensor_ref(value) };
        super::emit::aof(aof, c"AI.TENSORSET", key, &tensorset_words(t), Some(t.data()));
    })
}

extern "C" fn tensor_mem_usage(value: *const c_void) -> usize {
    // SAFETY: see `tensor_ref`.
    guard("AI_TENSOR mem_usage", 0, || unsafe { tensor_ref(value) }.mem_usage() + 2 * std::mem::size_of::<usize>())
}

pub extern "C" fn tensor_free(value: *mut c_void) {
    // SAFETY: see `tensor_ref`; Redis calls free exactly once per value, after which it is never used.
    guard("AI_TENSOR free", (), || {
        // SAFETY: as above: the value Redis stored, given back once.
        let value = unsafe { ModuleType::<Tensor>::take_value(value) };
        if value.mem_usage() >= crate::exec::lazy_free::THRESHOLD {
            crate::exec::lazy_free::drop_later(value);
        }
    })
}

extern "C" fn tensor_copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: see `tensor_ref`. Tensors are immutable once stored, so the copy can share the data.
    guard("AI_TENSOR copy", std::ptr::null_mut(), || {
        // SAFETY: as above: a live value of this type; the copy counts one more reference.
        ModuleType::into_value(unsafe { ModuleType::<Tensor>::clone_value(value) })
    })
}
