//! Blocked clients: the command blocks its client, work finishes on another thread, and the reply is
//! written on the main thread by a closure the worker hands back. A client that disconnects meanwhile
//! gets nothing; the closure is then dropped unrun.

use std::os::raw::{c_int, c_void};

use redis_module::raw;

use super::reply::error;
use crate::error::{Error, Result};
use crate::redis::ctx::Ctx;

/// What runs on the main thread to answer the client.
type Finish = Box<dyn FnOnce(Ctx<'_>) + Send>;

pub struct Blocked {
    bc: *mut raw::RedisModuleBlockedClient,
    db: c_int,
    completed: bool,
}

// SAFETY: a blocked-client handle may be unblocked from any thread (RedisModule_UnblockClient is
// thread-safe); `Blocked` touches nothing else off the main thread.
unsafe impl Send for Blocked {}

impl Blocked {
    /// RedisAI's rule: no blocking command inside MULTI, Lua or any context that cannot block.
    pub fn check_can_block(ctx: Ctx<'_>) -> Result<()> {
        let no_block = raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
        // SAFETY: ctx is the live context of the running command (main thread).
        let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx.as_ptr()) } as u32;
        if flags & no_block != 0 {
            return Err(Error::InTransaction);
        }
        Ok(())
    }

    /// Whether the command came from the primary (replication) or the AOF: such a client is never blocked
    /// (Valkey refuses to block its primary's client; Redis 7 allows it), so work is done inline.
    pub fn from_replication(ctx: Ctx<'_>) -> bool {
        // SAFETY: ctx is the live context of the running command (main thread).
        let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx.as_ptr()) } as u32;
        flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
    }

    /// Blocks the calling client.
    pub fn new(ctx: Ctx<'_>) -> Result<Blocked> {
        Blocked::check_can_block(ctx)?;
        // SAFETY: as above; the callbacks match Redis's signatures and outlive the module.
        unsafe {
            let db = api!(RedisModule_GetSelectedDb)(ctx.as_ptr());
            let bc = api!(RedisModule_BlockClient)(ctx.as_ptr(), Some(on_reply), None, Some(on_free), 0);
            if bc.is_null() {
                return Err(Error::InTransaction);
            }
            if let Some(start) = api_opt!(RedisModule_BlockedClientMeasureTimeStart) {
                start(bc);
            }
            Ok(Blocked { bc, db, completed: false })
        }
    }

    /// Unblocks the client; `finish` runs on the main thread with the client's database selected.
    pub fn complete(mut self, finish: impl FnOnce(Ctx<'_>) + Send + 'static) {
        let db = self.db;
        let f: Finish = Box::new(move |ctx| {
            // SAFETY: ctx is the reply context Redis passes to on_reply, on the main thread.
            unsafe { api!(RedisModule_SelectDb)(ctx.as_ptr(), db) };
            finish(ctx)
        });
        self.unblock(Box::new(Some(f)));
    }

    fn unblock(&mut self, payload: Box<Option<Finish>>) {
        self.completed = true;
        // SAFETY: bc came from BlockClient and is unblocked exactly once (guarded by `completed`);
        // Redis owns `payload` from here and hands it back to on_reply/on_free.
        unsafe {
            if let Some(end) = api_opt!(RedisModule_BlockedClientMeasureTimeEnd) {
                end(self.bc);
            }
            api!(RedisModule_UnblockClient)(self.bc, Box::into_raw(payload) as *mut c_void);
        }
    }
}

impl Drop for Blocked {
    /// A dropped, never-completed block (a bug or a panic) still releases the client, with an error.
    fn drop(&mut self) {
        if !self.completed {
            self.unblock(Box::new(None));
        }
    }
}

extern "C" fn on_reply(ctx: *mut raw::RedisModuleCtx, _argv: *mut *mut raw::RedisModuleString, _argc: c_int) -> c_int {
    // SAFETY: the reply context Redis passes to this callback, on the main thread, live for the call.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the private data is the Box<Option<Finish>> passed to UnblockClient; it stays alive
        // until on_free, which runs after this callback on the same (main) thread.
        let slot =
            unsafe { (api!(RedisModule_GetBlockedClientPrivateData)(ctx.as_ptr()) as *mut Option<Finish>).as_mut() };
        match slot.and_then(Option::take) {
            Some(finish) => finish(ctx),
            None => error(ctx, "ERR internal error in redisai: the request was abandoned (see the server log)"),
        }
    }));
    if outcome.is_err() {
        super::log_warning("redisai: panic while replying to a blocked client");
        error(ctx, "ERR internal error in redisai (see the server log)");
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn on_free(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if !privdata.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: privdata is the Box<Option<Finish>> given to UnblockClient; Redis frees it once.
            drop(unsafe { Box::from_raw(privdata as *mut Option<Finish>) })
        }));
    }
}
