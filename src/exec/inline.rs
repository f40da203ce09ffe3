//! Short runs inline: a model execution known to be short runs inside the command on Redis's main thread, as
//! any short command does, instead of blocking the client and handing the run to a worker (block, wake,
//! unblock, reply callback: more CPU than a small model's run). The policy is here; the run itself is
//! `Run::run_inline` and the handler decides with `may_run_inline`.
//!
//! Never a model's first runs, never a batching model, never a backend that cannot stop a run early, never
//! while its device queue has work (no overtaking). "Known to be short" means: the model's recent runs took at
//! most INLINE_THRESHOLD µs on average, and this request's inputs are no more than twice as big as the biggest
//! it has run. A run that still takes longer (its time suddenly grew) is stopped at `inline_limit` and handed to
//! a worker as if it had never started (model runs have no side effects), so the main thread is never held much
//! longer than the limit; the run's history then keeps the model off the main thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Runs needed before a model may run inline (its first runs load caches and allocate).
pub const MIN_RUNS: u64 = 3;

/// Recent single (unbatched) runs of a model.
#[derive(Debug, Default)]
pub struct RunHistory {
    runs: AtomicU64,
    /// Moving average of the run time (each run weighs 1/4), in µs.
    avg_us: AtomicU64,
    /// The biggest input (bytes, all inputs together) a recorded run had.
    max_input_bytes: AtomicU64,
}

impl RunHistory {
    /// A successful run of `micros` µs on `input_bytes` bytes of input (workers and inline runs alike).
    pub fn record(&self, micros: u64, input_bytes: u64) {
        let avg = match self.runs.fetch_add(1, Relaxed) {
            0 => micros,
            _ => (self.avg_us.load(Relaxed) * 3 + micros) / 4,
        };
        self.avg_us.store(avg, Relaxed);
        self.max_input_bytes.fetch_max(input_bytes, Relaxed);
    }

    /// A run stopped at the inline limit: it took at least `micros`, so the average says "slow" at once.
    pub fn record_stopped(&self, micros: u64) {
        self.avg_us.fetch_max(micros, Relaxed);
    }
}

/// Whether a request with `input_bytes` of input to a model with this history may run inline.
pub fn may_run_inline(h: &RunHistory, input_bytes: u64, threshold_us: u64) -> bool {
    threshold_us > 0
        && h.runs.load(Relaxed) >= MIN_RUNS
        && h.avg_us.load(Relaxed) <= threshold_us
        && input_bytes <= h.max_input_bytes.load(Relaxed).saturating_mul(2)
}

/// How long an inline run may take before it is stopped and queued instead.
pub fn inline_limit(threshold_us: u64) -> Duration {
    Duration::from_micros(threshold_us.saturating_mul(10)).max(Duration::from_millis(1))
}

static INLINE_RUNS: AtomicU64 = AtomicU64::new(0);
static QUEUED_RUNS: AtomicU64 = AtomicU64::new(0);

/// Counts one model execution by where it ran (INFO's `ai_inline_runs` / `ai_queued_runs`).
pub fn count(inline: bool) {
    if inline { &INLINE_RUNS } else { &QUEUED_RUNS }.fetch_add(1, Relaxed);
}

/// `(inline, queued)` model executions so far (MODELEXECUTE / MODELRUN).
pub fn counts() -> (u64, u64) {
    (INLINE_RUNS.load(Relaxed), QUEUED_RUNS.load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(runs: &[(u64, u64)]) -> RunHistory {
        let h = RunHistory::default();
        for &(us, bytes) in runs {
            h.record(us, bytes);
        }
        h
    }

    #[test]
    fn never_the_first_runs() {
        assert!(!may_run_inline(&history(&[(5, 16), (5, 16)]), 16, 100));
        assert!(may_run_inline(&history(&[(5, 16), (5, 16), (5, 16)]), 16, 100));
    }

    #[test]
    fn only_short_models_and_similar_inputs() {
        let h = history(&[(50, 100); 5]);
        assert!(may_run_inline(&h, 200, 100));
        assert!(!may_run_inline(&h, 201, 100), "twice the biggest input seen at most");
        assert!(!may_run_inline(&h, 100, 40), "slower than the threshold");
        assert!(!may_run_inline(&h, 100, 0), "0 turns inline runs off");
    }

    #[test]
    fn a_slow_run_moves_the_model_off_the_main_thread() {
        let h = history(&[(20, 16); 5]);
        h.record(5000, 16);
        assert!(!may_run_inline(&h, 16, 100));
        // It comes back once its runs are short again (the average forgets a quarter per run).
        for _ in 0..16 {
            h.record(20, 16);
        }
        assert!(may_run_inline(&h, 16, 100));
        h.record_stopped(1000);
        assert!(!may_run_inline(&h, 16, 100));
    }

    #[test]
    fn the_limit_is_at_least_a_millisecond() {
        assert_eq!(inline_limit(20), Duration::from_millis(1));
        assert_eq!(inline_limit(500), Duration::from_millis(5));
    }
}
