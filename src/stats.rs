//! Per-key run statistics for AI.INFO (docs/commands.md, AI.INFO): a registry keyed by key name, entries shared with the
//! model or script they describe, counters updated by workers without locks. RedisAI's four counters, then our
//! `Detail`: where each request's time went and how it ended (docs/commands.md, "Observability").

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use crate::histogram::Histogram;

/// DETAILED_STATS (load time, default yes): whether `Detail` is recorded. Off only to measure its cost.
pub static DETAILED: AtomicBool = AtomicBool::new(true);

pub fn detailed() -> bool {
    DETAILED.load(Relaxed)
}

/// How a request that did not succeed ended, for AI.INFO's split of `errors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The run's TIMEOUT (or the module's execution timeout) passed before the op ran.
    Timeout,
    /// Stopped by a bound the module enforces: the backend memory bound, the kill switch, a sandbox refusal.
    Refused,
    /// Any other failure of the backend or of the inputs.
    Backend,
}

/// Where one request's time went, in µs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    /// From the run's entry being queued (or requeued once its inputs were ready) to a worker taking it.
    pub queue_us: u64,
    /// Inside the backend, copies excluded.
    pub backend_us: u64,
    /// Copying inputs into and outputs out of the backend, and joining/splitting a batch.
    pub copy_us: u64,
    /// From the command's arrival to the op's end.
    pub total_us: u64,
    /// Ran on the main thread (exec/inline.rs) rather than on a worker.
    pub inline: bool,
}

/// Our additions to RedisAI's four counters.
#[derive(Debug, Default)]
pub struct Detail {
    pub queue_us: Histogram,
    pub backend_us: Histogram,
    pub copy_us: Histogram,
    pub total_us: Histogram,
    /// Requests served by each backend execution (1 unless auto-batched).
    pub batch: Histogram,
    /// Backend executions (a batch of requests is one).
    pub executions: AtomicU64,
    pub inline_runs: AtomicU64,
    pub queued_runs: AtomicU64,
    pub errors_timeout: AtomicU64,
    pub errors_refused: AtomicU64,
    pub errors_backend: AtomicU64,
}

impl Detail {
    /// One request that ran (successfully or not), `w` the histogram window of its end.
    pub fn record_request(&self, t: &Timing, w: u64) {
        self.queue_us.record(t.queue_us, w);
        self.backend_us.record(t.backend_us, w);
        self.copy_us.record(t.copy_us, w);
        self.total_us.record(t.total_us, w);
        if t.inline { &self.inline_runs } else { &self.queued_runs }.fetch_add(1, Relaxed);
    }

    /// One backend execution serving `requests` requests.
    pub fn record_execution(&self, requests: u64, w: u64) {
        self.executions.fetch_add(1, Relaxed);
        self.batch.record(requests, w);
    }

    pub fn record_error(&self, kind: ErrorKind) {
        match kind {
            ErrorKind::Timeout => &self.errors_timeout,
            ErrorKind::Refused => &self.errors_refused,
            ErrorKind::Backend => &self.errors_backend,
        }
        .fetch_add(1, Relaxed);
    }

    fn reset(&self) {
        for h in [&self.queue_us, &self.backend_us, &self.copy_us, &self.total_us, &self.batch] {
            h.reset();
        }
        for c in [
            &self.executions,
            &self.inline_runs,
            &self.queued_runs,
            &self.errors_timeout,
            &self.errors_refused,
            &self.errors_backend,
        ] {
            c.store(0, Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Model,
    Script,
}

#[derive(Debug)]
pub struct Stats {
    pub key: Vec<u8>,
    pub kind: EntryKind,
    pub backend: &'static str,
    pub device: String,
    pub tag: Vec<u8>,
    pub duration_us: AtomicI64,
    pub samples: AtomicI64,
    pub calls: AtomicI64,
    pub errors: AtomicI64,
    pub detail: Detail,
}

impl Stats {
    pub fn new(key: &[u8], kind: EntryKind, backend: &'static str, device: &str, tag: &[u8]) -> Stats {
        Stats {
            key: key.to_vec(),
            kind,
            backend,
            device: device.to_string(),
            tag: tag.to_vec(),
            duration_us: AtomicI64::new(0),
            samples: AtomicI64::new(0),
            calls: AtomicI64::new(0),
            errors: AtomicI64::new(0),
            detail: Detail::default(),
        }
    }

    pub fn record_success(&self, duration_us: i64, samples: i64) {
        self.duration_us.fetch_add(duration_us, Relaxed);
        self.samples.fetch_add(samples, Relaxed);
        self.calls.fetch_add(1, Relaxed);
    }

    pub fn record_error(&self) {
        self.calls.fetch_add(1, Relaxed);
        self.errors.fetch_add(1, Relaxed);
    }

    /// A call that failed before any backend ran it: RedisAI's counters and our error kind, no execution.
    pub fn record_failed_call(&self, kind: ErrorKind) {
        self.record_error();
        if detailed() {
            self.detail.record_error(kind);
        }
    }

    pub fn reset(&self) {
        for c in [&self.duration_us, &self.samples, &self.calls, &self.errors] {
            c.store(0, Relaxed);
        }
        self.detail.reset();
    }
}

/// Our AI.INFO fields (and INFO's per-key ones), in their order; percentiles over the last one to two minutes
/// as of window `now`.
pub fn detail_fields(d: &Detail, now: u64) -> Vec<(&'static str, u64)> {
    let mut v = vec![
        ("executions", d.executions.load(Relaxed)),
        ("inline_runs", d.inline_runs.load(Relaxed)),
        ("queued_runs", d.queued_runs.load(Relaxed)),
        ("errors_timeout", d.errors_timeout.load(Relaxed)),
        ("errors_refused", d.errors_refused.load(Relaxed)),
        ("errors_backend", d.errors_backend.load(Relaxed)),
        ("batch_size_p50", d.batch.quantile(0.5, now)),
        ("batch_size_p99", d.batch.quantile(0.99, now)),
    ];
    let timings: [(&Histogram, [&'static str; 3]); 4] = [
        (&d.queue_us, ["queue_us", "queue_p50_us", "queue_p99_us"]),
        (&d.backend_us, ["backend_us", "backend_p50_us", "backend_p99_us"]),
        (&d.copy_us, ["copy_us", "copy_p50_us", "copy_p99_us"]),
        (&d.total_us, ["total_us", "total_p50_us", "total_p99_us"]),
    ];
    for (h, [total, p50, p99]) in timings {
        v.push((total, h.total.load(Relaxed)));
        v.push((p50, h.quantile(0.5, now)));
        v.push((p99, h.quantile(0.99, now)));
    }
    v
}

/// Every entry (INFO's per-key lines), by key.
pub fn all() -> Vec<Arc<Stats>> {
    let mut v: Vec<Arc<Stats>> = REGISTRY.lock().values().cloned().collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

static REGISTRY: LazyLock<Mutex<HashMap<Vec<u8>, Arc<Stats>>>> = LazyLock::new(Default::default);

/// Makes `stats` the entry of its key (replacing any), once its value is in the keyspace.
pub fn publish(stats: &Arc<Stats>) {
    REGISTRY.lock().insert(stats.key.clone(), stats.clone());
}

/// Removes the entry when the value it belongs to is freed, unless a newer value already replaced it.
pub fn unregister(stats: &Arc<Stats>) {
    let mut reg = REGISTRY.lock();
    if reg.get(&stats.key).is_some_and(|cur| Arc::ptr_eq(cur, stats)) {
        reg.remove(&stats.key);
    }
}

pub fn lookup(key: &[u8]) -> Option<Arc<Stats>> {
    REGISTRY.lock().get(key).cloned()
}

/// `(key, tag)` of every entry of `kind`, for AI._MODELSCAN / AI._SCRIPTSCAN.
pub fn scan(kind: EntryKind) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> =
        REGISTRY.lock().values().filter(|s| s.kind == kind).map(|s| (s.key.clone(), s.tag.clone())).collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaced_entries_survive_the_old_value() {
        let old = Arc::new(Stats::new(b"stats-test", EntryKind::Model, "ONNX", "CPU", b""));
        let new = Arc::new(Stats::new(b"stats-test", EntryKind::Model, "ONNX", "CPU", b"v2"));
        publish(&old);
        publish(&new);
        unregister(&old);
        assert!(Arc::ptr_eq(&lookup(b"stats-test").unwrap(), &new));
        new.record_success(10, 4);
        new.record_error();
        assert_eq!((new.calls.load(Relaxed), new.errors.load(Relaxed), new.samples.load(Relaxed)), (2, 1, 4));
        unregister(&new);
        assert!(lookup(b"stats-test").is_none());
    }
}
