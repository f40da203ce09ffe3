//! Typed access to keys holding the module's values, with RedisAI's WRONGTYPE rule.

use std::os::raw::c_void;
use std::sync::Arc;

use redis_module::raw;

use super::module_type::ModuleType;
use crate::error::{Error, Result};
use crate::redis::ctx::Ctx;

/// An open key, closed on drop; it cannot outlive the context it was opened in.
pub struct Key<'a> {
    _ctx: Ctx<'a>,
    key: *mut raw::RedisModuleKey,
}

impl<'a> Key<'a> {
    /// Opens `name` (an argv string of the running command) for reading, or for writing too.
    pub fn open(ctx: Ctx<'a>, name: *mut raw::RedisModuleString, write: bool) -> Key<'a> {
        let mode = if write { raw::KeyMode::READ | raw::KeyMode::WRITE } else { raw::KeyMode::READ };
        // SAFETY: ctx and name are the live context and argv string of the command being executed.
        let key = unsafe { api!(RedisModule_OpenKey)(ctx.as_ptr(), name, mode.bits()) };
        Key { _ctx: ctx, key }
    }

    /// Opens a key given by name (not an argv string), e.g. an input or output of a run.
    pub fn open_name(ctx: Ctx<'a>, name: &[u8], write: bool) -> Key<'a> {
        let s = super::strings::OwnedStrings::new(&[name]);
        // OpenKey takes its own reference to the name, so ours can go when `s` drops.
        Key::open(ctx, s.0[0], write)
    }

    /// Deletes the key (opened for writing).
    pub fn delete(&self) {
        // SAFETY: self.key is an open key of this context, opened for writing by the caller.
        unsafe { api!(RedisModule_DeleteKey)(self.key) };
    }

    fn key_type(&self) -> raw::KeyType {
        // SAFETY: self.key is an open, non-null key of the running command's context.
        unsafe { api!(RedisModule_KeyType)(self.key) }.into()
    }

    pub fn is_empty(&self) -> bool {
        self.key.is_null() || self.key_type() == raw::KeyType::Empty
    }

    fn holds<T>(&self, ty: &ModuleType<T>) -> bool {
        // SAFETY: self.key is an open key of this context; ModuleTypeGetType only reads it.
        self.key_type() == raw::KeyType::Module
            && unsafe { api!(RedisModule_ModuleTypeGetType)(self.key) } == *ty.raw.raw_type.borrow()
    }

    /// The value if the key holds `ty`; `None` if the key is empty; WRONGTYPE otherwise.
    pub fn get<T>(&self, ty: &ModuleType<T>) -> Result<Option<&T>> {
        Ok(self.value_ptr(ty)?.map(|p| {
            // SAFETY: the key holds a value of `ty`, stored by `set` (or RDB load / COPY) through
            // `ModuleType::into_value`; the reference lives no longer than this open key.
            unsafe { ModuleType::<T>::value(p) }
        }))
    }

    /// Like `get`, as a shared reference that outlives the key (for work that runs after the command).
    pub fn get_arc<T>(&self, ty: &ModuleType<T>) -> Result<Option<Arc<T>>> {
        // SAFETY: as in `get`; the new reference is counted, so it stays valid after the key changes.
        Ok(self.value_ptr(ty)?.map(|p| unsafe { ModuleType::<T>::clone_value(p) }))
    }

    fn value_ptr<T>(&self, ty: &ModuleType<T>) -> Result<Option<*const c_void>> {
        if self.is_empty() {
            return Ok(None);
        }
        if !self.holds(ty) {
            return Err(Error::WrongType);
        }
        // SAFETY: the key is open and holds a module value.
        Ok(Some(unsafe { api!(RedisModule_ModuleTypeGetValue)(self.key) }))
    }

    /// Fails with WRONGTYPE unless the key is empty or holds `ty`.
    pub fn check_type<T>(&self, ty: &ModuleType<T>) -> Result<()> {
        if self.is_empty() || self.holds(ty) {
            Ok(())
        } else {
            Err(Error::WrongType)
        }
    }

    /// Stores `value` (replacing whatever the key held; Redis frees the old value with the type's free callback).
    pub fn set<T>(&self, ty: &ModuleType<T>, value: Arc<T>) -> Result<()> {
        let ptr = ModuleType::into_value(value);
        // SAFETY: the key was opened for writing; on success Redis owns `ptr` and gives it back to the type's
        // free callback.
        let status = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.key, *ty.raw.raw_type.borrow(), ptr) };
        if status == raw::REDISMODULE_OK as i32 {
            Ok(())
        } else {
            // SAFETY: Redis refused the value, so the reference is still ours.
            drop(unsafe { ModuleType::<T>::take_value(ptr) });
            Err(Error::Internal("could not save the value".into()))
        }
    }

    /// Stores `value` as `set` does (the key loses any TTL, as with SET). When the key already holds a value of
    /// `ty` and has no TTL, the value is swapped in place instead of the key being deleted and added again
    /// (no allocation on the main thread); the old value is then released with `free`, the type's own free
    /// callback.
    pub fn store<T>(&self, ty: &ModuleType<T>, value: Arc<T>, free: extern "C" fn(*mut c_void)) -> Result<()> {
        // SAFETY: self.key is an open key of this context; GetExpire only reads it.
        if self.is_empty() || !self.holds(ty) || unsafe { api!(RedisModule_GetExpire)(self.key) } != NO_EXPIRE {
            return self.set(ty, value);
        }
        let new = ModuleType::into_value(value);
        let mut old: *mut c_void = std::ptr::null_mut();
        // SAFETY: the key was opened for writing and holds a value of `ty`; on success Redis owns `new` and hands
        // the old value back in `old`, which nothing else references any more.
        let status =
            unsafe { api!(RedisModule_ModuleTypeReplaceValue)(self.key, *ty.raw.raw_type.borrow(), new, &mut old) };
        if status == raw::REDISMODULE_OK as i32 {
            if !old.is_null() {
                free(old);
            }
            Ok(())
        } else {
            // SAFETY: Redis refused the value, so the reference is still ours.
            let value = unsafe { ModuleType::<T>::take_value(new) };
            self.set(ty, value)
        }
    }
}

/// RedisModule_GetExpire's "no TTL".
const NO_EXPIRE: i64 = -1;

impl Drop for Key<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: the key was opened by `open` on this context and is closed exactly once.
            unsafe { api!(RedisModule_CloseKey)(self.key) };
        }
    }
}

/// The keys a DAG names, read as its parser asks for them (`commands::dag::Resolver`), each opened by `open`:
/// AI.DAGEXECUTE opens them in the client's context, the low-level API's DAG strings in database 0.
pub struct DagKeys<F>(pub F);

impl<'k, F: Fn(&[u8]) -> Key<'k>> crate::commands::dag::Resolver for DagKeys<F> {
    fn tensor(&self, key: &[u8]) -> Result<Arc<crate::tensor::Tensor>> {
        (self.0)(key).get_arc(&super::types::TENSOR_TYPE)?.ok_or(Error::TensorKeyEmpty)
    }
    fn model(&self, key: &[u8]) -> Result<Arc<crate::model::Model>> {
        (self.0)(key).get_arc(&super::model_type::MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)
    }
    fn script(&self, key: &[u8]) -> Result<Arc<crate::script::Script>> {
        (self.0)(key).get_arc(&super::script_type::SCRIPT_TYPE)?.ok_or(Error::ScriptKeyEmpty)
    }
}
