//! Per-key run statistics for AI.INFO (docs/commands.md, AI.INFO): a registry keyed by key name, entries shared with the
//! model or script they describe, counters updated by workers without locks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

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

    pub fn reset(&self) {
        for c in [&self.duration_us, &self.samples, &self.calls, &self.errors] {
            c.store(0, Relaxed);
        }
    }
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
