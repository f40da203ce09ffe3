//! The Redis FFI layer: the only code that talks to `redis_module`. Everything it calls into is pure Rust.

/// A function of the Redis module API, read from the table `RedisModule_Init` fills: the one accessor every raw
/// call goes through. Calling it is still `unsafe` (FFI); reading the table is not a concern of the caller.
macro_rules! api {
    ($f:ident) => {{
        // SAFETY: Init fills the API table once, before any command or callback runs, and it never changes
        // afterwards; reading a function pointer from it is a plain load.
        #[allow(unused_unsafe)]
        let f = unsafe { redis_module::raw::$f };
        f.expect(concat!(stringify!($f), " is not provided by this server"))
    }};
}

/// A function of the module API that older servers may not provide (`None` there): as `api!`.
macro_rules! api_opt {
    ($f:ident) => {{
        // SAFETY: as in `api!`.
        #[allow(unused_unsafe)]
        let f = unsafe { redis_module::raw::$f };
        f
    }};
}

pub mod acl;
pub mod blocking;
pub mod ctx;
pub mod emit;
pub mod gil;
pub mod handlers;
pub mod info;
pub mod io;
pub mod keyspace;
pub mod latency;
pub mod llapi;
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
static ALLOCATOR: ModuleAlloc = ModuleAlloc;

#[cfg(all(not(test), not(feature = "system-alloc")))]
/// Redis's allocator in Redis's process; the system's in the backend worker (`redisai-worker` links this
/// crate), where Redis's functions are never set. The choice cannot change within a process: Redis sets them
/// in OnLoad before the module allocates anything, and never unsets them.
struct ModuleAlloc;

#[cfg(all(not(test), not(feature = "system-alloc")))]
// SAFETY: each call goes to one allocator, the same for a pointer's allocation and its release (see above).
unsafe impl std::alloc::GlobalAlloc for ModuleAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's contract.
        unsafe {
            if std::ptr::addr_of!(raw::RedisModule_Alloc).read().is_some() {
                redis_module::alloc::RedisAlloc.alloc(layout)
            } else {
                std::alloc::System.alloc(layout)
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded with the caller's contract.
        unsafe {
            if std::ptr::addr_of!(raw::RedisModule_Free).read().is_some() {
                redis_module::alloc::RedisAlloc.dealloc(ptr, layout)
            } else {
                std::alloc::System.dealloc(ptr, layout)
            }
        }
    }
}

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
