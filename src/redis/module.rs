//! `RedisModule_OnLoad`: initialises the API, reads the load-time arguments, registers types and commands.

use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use super::handlers;
use super::model_type::MODEL_TYPE;
use super::script_type::SCRIPT_TYPE;
use super::types::TENSOR_TYPE;
use super::{info, log_warning};
use crate::config::{self, Config};
use crate::redis::ctx::Ctx;

/// RedisAI 1.2.7 as MAJOR*10000+MINOR*100+PATCH: the release whose interface this module implements.
const MODULE_VERSION: c_int = 10207;

/// # Safety
/// Called by Redis exactly once, with a valid context and `argc` argument strings.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // Nothing may allocate before this call: the global allocator is Redis's, reached through the API
    // table that Init fills in.
    // SAFETY: ctx is the loading context; the name is a static NUL-terminated string.
    let init = unsafe {
        raw::Export_RedisModule_Init(ctx, c"ai".as_ptr(), MODULE_VERSION, raw::REDISMODULE_APIVER_1 as c_int)
    };
    if init == raw::Status::Err as c_int {
        return init;
    }
    // SAFETY: the loading context Redis passed to OnLoad, on the main thread, live for the call.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    catch_unwind(AssertUnwindSafe(|| on_load(ctx, argv, argc))).unwrap_or_else(|_| {
        log_warning("redisai: panic while loading the module");
        raw::Status::Err as c_int
    })
}

fn on_load(ctx: Ctx<'_>, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    std::panic::set_hook(Box::new(|p| log_warning(&format!("redisai: {p}"))));
    super::gil::record_main_thread();
    crate::log::set_sink(log_warning);
    // Before anything sets a variable of its own, and while the environment is there (Valkey empties it later).
    crate::isolation::capture_environment();
    #[cfg(feature = "torch")]
    crate::backends::torch::set_host(super::script_host::host_api());
    #[cfg(feature = "torch")]
    crate::isolation::set_host(crate::isolation::Host {
        execute: super::script_host::execute,
        model_execute: super::script_host::model_execute_tensors,
    });
    const ERR: c_int = raw::Status::Err as c_int;

    let args: Vec<Vec<u8>> = (0..argc.max(0) as usize)
        .map(|i| {
            let mut len = 0usize;
            // SAFETY: Redis passes `argc` valid strings that live for the duration of OnLoad.
            let p = raw::string_ptr_len(unsafe { *argv.add(i) }, &mut len);
            // SAFETY: StringPtrLen returns `len` readable bytes owned by that string.
            unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec()
        })
        .collect();
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    match Config::from_args(&refs) {
        Ok(c) => {
            crate::stats::DETAILED.store(c.detailed_stats, std::sync::atomic::Ordering::Relaxed);
            *config::CONFIG.write() = c;
        }
        Err(e) => {
            log_warning(&e.reply_text());
            return ERR;
        }
    }

    // SAFETY: ctx is the loading context; the option only changes how RDB read errors are reported.
    unsafe { api!(RedisModule_SetModuleOptions)(ctx.as_ptr(), raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as c_int) };

    {
        let mut c = config::CONFIG.write();
        c.default_memory_bound = config::default_memory_bound(super::memory::maxmemory(ctx));
        c.module_dir = module_dir();
        if c.backends_path.is_none() {
            c.backends_path = c.module_dir.as_ref().map(|d| format!("{d}/backends"));
        }
    }
    // TensorFlow reads its allocator settings from the environment: set them now, while Redis is loading and
    // the module has started no threads (see `bound_memory`).
    #[cfg(feature = "tensorflow")]
    crate::backends::tensorflow::bound_memory();

    if TENSOR_TYPE.raw.create_data_type(ctx.as_ptr()).is_err()
        || MODEL_TYPE.raw.create_data_type(ctx.as_ptr()).is_err()
        || SCRIPT_TYPE.raw.create_data_type(ctx.as_ptr()).is_err()
    {
        return ERR;
    }

    for cmd in handlers::COMMANDS {
        let (name, (first, last, step)) = (cmd.name, cmd.keys);
        let (name_c, flags_c) = (CString::new(name).unwrap_or_default(), CString::new(cmd.flags).unwrap_or_default());
        // SAFETY: ctx is the loading context; both strings are NUL-terminated and copied by Redis.
        let status = unsafe {
            api!(RedisModule_CreateCommand)(
                ctx.as_ptr(),
                name_c.as_ptr() as *const c_char,
                Some(cmd.entry),
                flags_c.as_ptr() as *const c_char,
                first,
                last,
                step,
            )
        };
        if status == ERR {
            log_warning(&format!("redisai: cannot register command {name}"));
            return ERR;
        }
    }

    // RedisAI's low-level API for other modules (llapi/): all of it or the load fails, as a client module's
    // RedisAI_Initialize needs every function.
    if !super::llapi::export(ctx) {
        log_warning("redisai: cannot export the low-level API");
        return ERR;
    }
    admin_categories(ctx);
    raw::register_info_function(ctx.as_ptr(), Some(info::info_func));
    // RedisAI made the CPU queue (and its workers) at load: INFO lists `ai_queue_CPU_bthread_n1_used_cpu_total`
    // before any model exists, and tools read it. The workers sleep until work comes.
    if let Err(e) = crate::exec::queue_of("CPU") {
        log_warning(&format!("redisai: {}", e.reply_text()));
    }
    // Commands queue work without waking a worker each; the wake-ups go out once per event-loop iteration.
    let event = raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_EVENTLOOP, dataver: 1 };
    if raw::subscribe_to_server_event(ctx.as_ptr(), event, Some(event_loop)) == raw::Status::Ok {
        crate::exec::queue::defer_wakeups_on_this_thread();
        // Isolated: short runs are posted to the workers, whose answers are collected when the eventfd they
        // write is readable and before Redis sleeps (isolation/post.rs).
        if crate::isolation::enabled() {
            watch_posted_runs();
        }
    }
    raw::Status::Ok as c_int
}

fn watch_posted_runs() {
    let (Some(fd), Some(add)) = (crate::isolation::posted_notifier(), api_opt!(RedisModule_EventLoopAdd)) else {
        return log_warning("redisai: short runs wait for their worker (no event-loop hook for posted runs)");
    };
    // SAFETY: registers our eventfd (open for the module's lifetime) with a callback that outlives it.
    let ok = unsafe {
        add(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            raw::REDISMODULE_EVENTLOOP_READABLE as c_int,
            Some(on_posted),
            std::ptr::null_mut(),
        )
    };
    if ok == raw::REDISMODULE_OK as c_int {
        crate::isolation::enable_posting();
    }
}

/// The workers answered posted runs (main thread).
extern "C" fn on_posted(_fd: c_int, _data: *mut std::ffi::c_void, _mask: c_int) {
    let _ = catch_unwind(|| crate::isolation::collect_posted(true));
}

/// Puts AI.CONFIG in @admin and @dangerous. The `admin` flag does not do it for module commands; Redis 7.2+
/// and Valkey take the categories through `SetCommandACLCategories`. Redis 7.0 has no such call: there the
/// AI.CONFIG handler checks that the caller may run CONFIG SET instead (`ADMIN_BY_CATEGORY`).
fn admin_categories(ctx: Ctx<'_>) {
    // SAFETY: Init filled the API table; ctx is the loading context; the strings are NUL-terminated.
    let set = unsafe {
        match (api_opt!(RedisModule_GetCommand), api_opt!(RedisModule_SetCommandACLCategories)) {
            (Some(get), Some(set)) => {
                let cmd = get(ctx.as_ptr(), c"ai.config".as_ptr());
                !cmd.is_null() && set(cmd, c"admin dangerous".as_ptr()) == raw::REDISMODULE_OK as c_int
            }
            _ => false,
        }
    };
    ADMIN_BY_CATEGORY.store(set, std::sync::atomic::Ordering::Relaxed);
}

/// Whether AI.CONFIG is in @admin (else its handler checks the caller's right to CONFIG SET).
pub static ADMIN_BY_CATEGORY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Redis's event-loop hook (main thread): before it sleeps, collect the posted runs that have an answer, ring
/// the bells of the workers that got posted runs and wake the workers of the queues that got work; once it has
/// woken, defer the bells again (isolation/post.rs).
extern "C" fn event_loop(
    _ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::ffi::c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
        // Collected first: a posted run given up on is queued, and its queue's wake-up goes out with the rest.
        let _ = catch_unwind(|| crate::isolation::collect_posted(false));
        let _ = catch_unwind(crate::isolation::ring_deferred);
        let _ = catch_unwind(crate::exec::queue::flush_wakeups);
    } else if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_AFTER_SLEEP {
        crate::isolation::defer_rings();
    }
}

/// The directory holding this module's shared object (RedisAI's default BACKENDSPATH is `<it>/backends`).
fn module_dir() -> Option<String> {
    // SAFETY: dladdr only inspects the address of one of our own functions and fills `info`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // A private item: the exported RedisModule_OnLoad may resolve to another object's (Redis 8 builds modules
    // such as vectorset into the server, and symbol interposition then points dladdr at redis-server).
    static ANCHOR: u8 = 0;
    let addr = std::ptr::addr_of!(ANCHOR) as *const std::ffi::c_void;
    // SAFETY: as above: dladdr reads the address and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let abs = std::fs::canonicalize(&path).ok()?;
    abs.parent().map(|p| p.to_string_lossy().into_owned())
}
