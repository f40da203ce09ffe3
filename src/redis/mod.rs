//! The Redis FFI layer: the only code that talks to `redis_module`. Everything it calls into is pure Rust.

pub mod acl;
pub mod blocking;
pub mod handlers;
pub mod info;
pub mod io;
pub mod keyspace;
pub mod memory;
pub mod model_type;
pub mod module;
pub mod module_type;
pub mod reply;
#[cfg(feature = "torch")]
pub mod script_host;
pub mod script_type;
pub mod strings;
pub mod types;

/// Inside Redis every Rust allocation goes through Redis's allocator, so `used_memory` and `maxmemory`
/// see it. Unit tests run outside Redis, where that allocator does not exist.
#[cfg(all(not(test), not(feature = "system-alloc")))]
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc;

use std::ffi::CString;

use redis_module::raw;

/// Writes one line to the Redis log; usable from any thread (a NULL context is allowed for logging).
pub fn log(level: &str, msg: &str) {
    let level = CString::new(level).unwrap_or_default();
    let fmt = c"%s";
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: RedisModule_Log is set once the module is initialised (we log only after OnLoad has run
    // Export_RedisModule_Init); all three strings are valid NUL-terminated C strings for the call.
    unsafe {
        if let Some(f) = raw::RedisModule_Log {
            f(std::ptr::null_mut(), level.as_ptr(), fmt.as_ptr(), msg.as_ptr());
        }
    }
}

pub fn log_warning(msg: &str) {
    log("warning", msg)
}
