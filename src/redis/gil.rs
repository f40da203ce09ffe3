//! Redis's global lock (the GIL of a thread-safe context) as a guard that one thread cannot take twice.
//!
//! Redis's lock is not re-entrant: a thread that holds it and takes it again waits for itself forever. That
//! happened when a script's `redis.execute('DEL', …)` (run on a worker holding the lock) freed a tensor whose
//! bytes were an adopted argument string, whose release took the lock again. So every taker goes through
//! here: `Gil::lock` refuses on a thread that already holds the lock (Redis's main thread always does while
//! it runs commands and callbacks), and `with_gil` runs its closure under the lock the thread already holds
//! or takes it. The guard releases the lock when dropped, also when a panic unwinds through it.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::thread::ThreadId;

use redis_module::raw;

thread_local! {
    /// This thread holds a `Gil`.
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// The main thread, recorded at module load: it holds the lock whenever it runs module code.
static MAIN_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Called once from `RedisModule_OnLoad` (the main thread).
pub fn record_main_thread() {
    let _ = MAIN_THREAD.set(std::thread::current().id());
}

pub fn on_main_thread() -> bool {
    MAIN_THREAD.get() == Some(&std::thread::current().id())
}

/// Whether this thread holds Redis's lock: the main thread, or a thread inside a `Gil`.
pub fn held() -> bool {
    on_main_thread() || HELD.with(Cell::get)
}

/// Redis's lock, held through a detached thread-safe context until dropped. Not `Send`: it must be released
/// by the thread that took it.
pub struct Gil {
    ctx: *mut raw::RedisModuleCtx,
    _not_send: PhantomData<*mut ()>,
}

/// Taking the lock again on a thread that holds it would wait forever.
#[derive(Debug)]
pub struct AlreadyHeld;

impl Gil {
    /// Takes the lock; refused on a thread that already holds it.
    pub fn lock() -> Result<Gil, AlreadyHeld> {
        if held() {
            return Err(AlreadyHeld);
        }
        // SAFETY: a detached thread-safe context may be created and locked from any thread; this thread does
        // not hold the lock (checked above), so locking cannot wait for itself. Drop unlocks and frees it.
        let ctx = unsafe {
            let ctx = api!(RedisModule_GetThreadSafeContext)(std::ptr::null_mut());
            api!(RedisModule_ThreadSafeContextLock)(ctx);
            ctx
        };
        HELD.with(|h| h.set(true));
        Ok(Gil { ctx, _not_send: PhantomData })
    }

    /// The locked context, for as long as the guard lives.
    pub fn ctx(&self) -> super::ctx::Ctx<'_> {
        // SAFETY: a thread-safe context this guard holds locked, on this thread (the guard is not Send), until
        // the guard is dropped, which the borrow outlasts.
        unsafe { super::ctx::Ctx::from_raw(self.ctx) }
    }
}

impl Drop for Gil {
    fn drop(&mut self) {
        HELD.with(|h| h.set(false));
        // SAFETY: the context was made and locked by this guard on this thread (the guard is not Send); it is
        // unlocked and freed once.
        unsafe {
            api!(RedisModule_ThreadSafeContextUnlock)(self.ctx);
            api!(RedisModule_FreeThreadSafeContext)(self.ctx);
        }
    }
}

/// Runs `f` under Redis's lock: the one this thread holds, or taken for the call. For releasing what Redis
/// owns (its reference counts are not atomic), from whatever thread drops it.
pub fn with_gil<R>(f: impl FnOnce() -> R) -> R {
    match Gil::lock() {
        Ok(gil) => {
            let r = f();
            drop(gil);
            r
        }
        Err(AlreadyHeld) => f(),
    }
}
