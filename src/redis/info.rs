//! INFO MODULES: RedisAI's sections, in RedisAI's order (clients split the text on `#`).

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::config::CONFIG;

fn cpu_time(who: c_int) -> (String, String) {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above: the call writes into `ru` only.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return ("N/A".into(), "N/A".into());
    }
    let fmt = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (fmt(ru.ru_stime), fmt(ru.ru_utime))
}

pub extern "C" fn info_func(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let c = CONFIG.read().clone();
        raw::add_info_section(ctx, Some("versions"));
        raw::add_info_field_str(ctx, "RedisAI_version", "1.2.7");
        // RedisAI's value; this module exports no low-level API to other modules (docs/commands.md, AI.INFO).
        raw::add_info_field_long_long(ctx, "low_level_API_version", super::llapi::VERSION as i64);
        raw::add_info_field_long_long(ctx, "rdb_version", crate::rdb::ENCVER as i64);

        raw::add_info_section(ctx, Some("git"));
        raw::add_info_field_str(ctx, "git_sha", env!("REDISAI_GIT_SHA"));

        raw::add_info_section(ctx, Some("load_time_configs"));
        raw::add_info_field_long_long(ctx, "threads_per_queue", c.threads_per_queue as i64);
        raw::add_info_field_long_long(ctx, "inter_op_parallelism", c.inter_op_parallelism as i64);
        raw::add_info_field_long_long(ctx, "intra_op_parallelism", c.intra_op_parallelism as i64);
        raw::add_info_field_long_long(ctx, "model_execution_timeout", c.model_execution_timeout_ms as i64);
        raw::add_info_field_long_long(ctx, "backend_memory_limit", c.backend_memory_limit_mb as i64);

        raw::add_info_section(ctx, Some("backends_info"));
        let versions = if crate::isolation::enabled() {
            crate::isolation::loaded_versions()
        } else {
            crate::backends::loaded_versions()
        };
        for (field, version) in &versions {
            raw::add_info_field_str(ctx, field, version);
        }
        for (field, value) in backend_fields("backends_info") {
            raw::add_info_field_unsigned_long_long(ctx, &field, value);
        }
        if versions.iter().any(|(f, _)| *f == "onnxruntime_version") {
            let sessions = crate::exec::queues().worker_count() as i64;
            raw::add_info_field_long_long(ctx, "onnxruntime_maximum_run_sessions_number", sessions);
        }

        raw::add_info_section(ctx, Some("cpu"));
        let (sys, user) = cpu_time(libc::RUSAGE_SELF);
        raw::add_info_field_str(ctx, "self_used_cpu_sys", &sys);
        raw::add_info_field_str(ctx, "self_used_cpu_user", &user);
        let (sys, user) = cpu_time(libc::RUSAGE_CHILDREN);
        raw::add_info_field_str(ctx, "children_used_cpu_sys", &sys);
        raw::add_info_field_str(ctx, "children_used_cpu_user", &user);
        // INFO runs on the main thread, so the calling thread's usage is the main thread's.
        let (sys, user) = cpu_time(libc::RUSAGE_THREAD);
        raw::add_info_field_str(ctx, "main_thread_used_cpu_sys", &sys);
        raw::add_info_field_str(ctx, "main_thread_used_cpu_user", &user);
        for q in crate::exec::queues().all() {
            // INFO lines are `name:value`: a device's ':' would cut the name short.
            let dev = q.name.replace(':', "_");
            for (n, total) in q.worker_cpu() {
                raw::add_info_field_str(ctx, &format!("queue_{dev}_bthread_n{n}_used_cpu_total"), &total);
            }
        }

        // Our own version, in a section of its own after RedisAI's five (tools index those by position).
        raw::add_info_section(ctx, Some("redisai_rs"));
        raw::add_info_field_str(ctx, "redisai_rs_version", env!("CARGO_PKG_VERSION"));
        // The backend memory bound in force (BACKEND_MEMORY_LIMIT, or the default from maxmemory / the machine).
        raw::add_info_field_long_long(ctx, "backend_memory_bound", c.backend_memory_bound() as i64);
        // Model executions run inline on the main thread, and handed to a worker (exec/inline.rs).
        let (inline, queued) = crate::exec::inline::counts();
        raw::add_info_field_long_long(ctx, "inline_runs", inline as i64);
        raw::add_info_field_long_long(ctx, "queued_runs", queued as i64);
        // Models from RDB/AOF waiting for their deferred build, and deferred builds that failed (DEFERRED_MODEL_BUILD).
        let (pending, failed) = crate::exec::deferred::counts();
        raw::add_info_field_long_long(ctx, "models_pending_build", pending as i64);
        raw::add_info_field_long_long(ctx, "models_failed_build", failed as i64);
        // What the backends add here: what LiteRT holds now and how many of its allocations the backend memory
        // bound refused (its allocation imports are counted: backends/tflite/alloc.rs).
        for (field, value) in backend_fields("redisai_rs") {
            raw::add_info_field_unsigned_long_long(ctx, &field, value);
        }

        // Where backends run (EXECUTION_MODE), and each worker process: pid, resident memory, restarts, last exit.
        raw::add_info_section(ctx, Some("workers"));
        raw::add_info_field_str(ctx, "execution_mode", if c.isolated { "isolated" } else { "in_process" });
        for (field, value) in crate::isolation::info() {
            raw::add_info_field_str(ctx, &field, &value);
        }

        // Per device queue: what waits, what runs, and how long requests waited (docs/commands.md,
        // "Observability"). Plain `name:value` fields, so that exporters scraping INFO need no custom code.
        let now = crate::histogram::window_now();
        raw::add_info_section(ctx, Some("queues"));
        for q in crate::exec::queues().all() {
            let dev = q.name.replace(':', "_");
            let field = |name: &str, v: u64| {
                raw::add_info_field_unsigned_long_long(ctx, &format!("queue_{dev}_{name}"), v);
            };
            field("pending", q.len() as u64);
            field("busy_workers", q.busy_workers() as u64);
            field("taken", q.waits.count.load(std::sync::atomic::Ordering::Relaxed));
            field("wait_us", q.waits.total.load(std::sync::atomic::Ordering::Relaxed));
            field("wait_p50_us", q.waits.quantile(0.5, now));
            field("wait_p99_us", q.waits.quantile(0.99, now));
        }

        // Per model and script: one line each, `model_<key>:calls=…,errors=…,…` (AI.INFO's figures).
        raw::add_info_section(ctx, Some("keys"));
        for s in crate::stats::all() {
            let kind = if s.kind == crate::stats::EntryKind::Model { "model" } else { "script" };
            raw::add_info_begin_dict_field(ctx, &format!("{kind}_{}", info_name(&s.key)));
            use std::sync::atomic::Ordering::Relaxed;
            for (name, v) in [("calls", s.calls.load(Relaxed)), ("errors", s.errors.load(Relaxed))] {
                raw::add_info_field_long_long(ctx, name, v);
            }
            for (name, v) in crate::stats::detail_fields(&s.detail, now) {
                raw::add_info_field_unsigned_long_long(ctx, name, v);
            }
            raw::add_info_end_dict_field(ctx);
        }
    }));
}

/// A key as part of an INFO field name: bytes other than letters, digits, `_`, `-` and `.` become `_` (INFO's
/// syntax reserves `:`, `,`, `=` and line ends), so two keys may share a line name; AI.INFO tells them apart.
fn info_name(key: &[u8]) -> String {
    key.iter().map(|&b| if b.is_ascii_alphanumeric() || b"_-.".contains(&b) { b as char } else { '_' }).collect()
}

/// What the backends add to INFO's `section`: this process's, or its workers' when backends run isolated.
fn backend_fields(section: &str) -> Vec<(String, u64)> {
    if crate::isolation::enabled() {
        crate::isolation::info_fields(section)
    } else {
        crate::backends::info_fields(section).into_iter().map(|(f, v)| (f.to_string(), v)).collect()
    }
}
