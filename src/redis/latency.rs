//! Long executions in Redis's latency monitor: `LATENCY LATEST`, `HISTORY` and `DOCTOR` show an event per
//! command kind (`ai.modelexecute`, `ai.dagexecute` …) with the execution's whole time, from the command's
//! arrival to its reply, of which SLOWLOG sees only the main thread's part (docs/commands.md, "Observability").
//! Called on the main thread as the reply is sent, as Redis's own events are.

use std::ffi::CStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::redis::ctx::Ctx;
use redis_module::raw;

/// The event of a command that runs a plan, by its name.
pub fn event_of(command: &[u8]) -> &'static CStr {
    const EVENTS: [(&str, &CStr); 8] = [
        ("AI.MODELEXECUTE", c"ai.modelexecute"),
        ("AI.MODELRUN", c"ai.modelrun"),
        ("AI.SCRIPTEXECUTE", c"ai.scriptexecute"),
        ("AI.SCRIPTRUN", c"ai.scriptrun"),
        ("AI.DAGEXECUTE", c"ai.dagexecute"),
        ("AI.DAGEXECUTE_RO", c"ai.dagexecute_ro"),
        ("AI.DAGRUN", c"ai.dagrun"),
        ("AI.DAGRUN_RO", c"ai.dagrun_ro"),
    ];
    EVENTS.iter().find(|(name, _)| name.as_bytes().eq_ignore_ascii_case(command)).map_or(c"ai.execute", |(_, e)| e)
}

/// `latency-monitor-threshold` (ms; 0: off), read again at most once a second (a CONFIG SET shows within one).
static THRESHOLD_MS: AtomicI64 = AtomicI64::new(0);
/// The second (from 1) of the last read; 0: never read.
static READ_AT_S: AtomicU64 = AtomicU64::new(0);

fn threshold_ms(ctx: Ctx<'_>) -> i64 {
    let now = crate::histogram::seconds() + 1;
    if READ_AT_S.swap(now, Relaxed) != now {
        if let Some(ms) = read_threshold(ctx) {
            THRESHOLD_MS.store(ms, Relaxed);
        }
    }
    THRESHOLD_MS.load(Relaxed)
}

fn read_threshold(ctx: Ctx<'_>) -> Option<i64> {
    // SAFETY: ctx is the context of the reply being sent, on the main thread; the reply is freed before return
    // and its string read before that.
    unsafe {
        let r = api!(RedisModule_Call)(
            ctx.as_ptr(),
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            c"latency-monitor-threshold".as_ptr(),
        );
        if r.is_null() {
            return None;
        }
        let value = raw::call_reply_array_element(r, 1);
        let mut len = 0usize;
        let p = if value.is_null() { std::ptr::null() } else { raw::call_reply_string_ptr(value, &mut len) };
        let ms = (!p.is_null())
            .then(|| std::str::from_utf8(std::slice::from_raw_parts(p as *const u8, len)).ok()?.parse().ok())
            .flatten();
        raw::free_call_reply(r);
        ms
    }
}

/// Adds an execution that took `took` to the monitor when it reaches the threshold (Redis's own check adds every
/// sample while the monitor is off, so ours comes first).
pub fn record(ctx: Ctx<'_>, event: &'static CStr, took: Duration) {
    let ms = took.as_millis() as i64;
    if ms == 0 {
        return;
    }
    let threshold = threshold_ms(ctx);
    if threshold > 0 && ms >= threshold {
        // SAFETY: main thread (a reply callback or the command itself); `event` is a static C string.
        unsafe { api!(RedisModule_LatencyAddSample)(event.as_ptr(), ms) };
    }
}
