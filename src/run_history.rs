//! A model's recent single (unbatched) runs, kept with the model: what the engine reads to decide whether a
//! request is short enough to run inline on Redis's main thread (exec/inline.rs).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Runs needed before a model may run inline (its first runs load caches and allocate).
pub const MIN_RUNS: u64 = 3;

/// The most a settled model's single run counts for, as a multiple of its average (`RunHistory::record`).
const OUTLIER: u64 = 4;

/// Recent single (unbatched) runs of a model.
#[derive(Debug, Default)]
pub struct RunHistory {
    runs: AtomicU64,
    /// Moving average of the run time (each run weighs 1/4), in µs, from the last of the first `MIN_RUNS`
    /// runs on (the first runs warm caches up: counting them would keep a fast model queued for a dozen runs).
    avg_us: AtomicU64,
    /// The biggest input (bytes, all inputs together) a recorded run had.
    max_input_bytes: AtomicU64,
}

impl RunHistory {
    /// A successful run of `micros` µs on `input_bytes` bytes of input (workers and inline runs alike). Once
    /// settled, a run counts as at most `OUTLIER` times the average: a run that lost its core for a few
    /// milliseconds says nothing of the model, and counted whole it sent a tiny model off the main thread (a
    /// 3 µs average past 100) and, behind it, the next few dozen clients' runs to its queue. Runs that stay
    /// slow still raise the average 1.75x per run, and a run stopped at the inline limit counts at once
    /// (`record_stopped`).
    pub fn record(&self, micros: u64, input_bytes: u64) {
        let avg = match self.runs.fetch_add(1, Relaxed) {
            n if n < MIN_RUNS => micros,
            _ => {
                let avg = self.avg_us.load(Relaxed);
                (avg * 3 + micros.min(avg.max(1).saturating_mul(OUTLIER))) / 4
            }
        };
        self.avg_us.store(avg, Relaxed);
        self.max_input_bytes.fetch_max(input_bytes, Relaxed);
    }

    /// A run stopped at the inline limit: it took at least `micros`, so the average says "slow" at once.
    pub fn record_stopped(&self, micros: u64) {
        self.avg_us.fetch_max(micros, Relaxed);
    }

    /// Whether `input_bytes` of input is like what the model has run (at most twice the biggest).
    pub fn fits(&self, input_bytes: u64) -> bool {
        input_bytes <= self.max_input_bytes.load(Relaxed).saturating_mul(2)
    }

    /// The average run time (µs), once the model has run `MIN_RUNS` times.
    pub fn settled_avg_us(&self) -> Option<u64> {
        (self.runs.load(Relaxed) >= MIN_RUNS).then(|| self.avg_us.load(Relaxed))
    }
}
