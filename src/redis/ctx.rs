//! Redis's context as a type with a lifetime (as redismodule-rs's `Context`): a `Ctx<'a>` is only made from a
//! context Redis handed to a command or callback, or from a locked thread-safe context (`gil::Gil::ctx`), and
//! cannot outlive it or leave the thread (it is neither `Send` nor `Sync`). Safe functions take a `Ctx`; only
//! the raw API calls inside them see the pointer.

use std::marker::PhantomData;

use redis_module::raw;

#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    ptr: *mut raw::RedisModuleCtx,
    _life: PhantomData<&'a mut raw::RedisModuleCtx>,
}

impl<'a> Ctx<'a> {
    /// # Safety
    /// `ptr` is a live context that Redis passed to the running command or callback, or a thread-safe context
    /// this thread has locked, and it stays valid for `'a`; the caller is on a thread that holds Redis's lock.
    pub unsafe fn from_raw(ptr: *mut raw::RedisModuleCtx) -> Ctx<'a> {
        Ctx { ptr, _life: PhantomData }
    }

    /// The pointer, for a raw API call.
    pub fn as_ptr(self) -> *mut raw::RedisModuleCtx {
        self.ptr
    }
}
