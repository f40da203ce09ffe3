//! Short runs inline: a model execution known to be short runs inside the command on Redis's main thread, as
//! any short command does, instead of blocking the client and handing the run to a worker (block, wake,
//! unblock, reply callback: more CPU than a small model's run). The policy is here; the run itself is
//! `Run::run_inline` and the handler decides with `may_run_inline`.
//!
//! Never a model's first runs, never a batching model, never a backend that cannot stop a run early, never
//! while its device queue has work (no overtaking). "Known to be short" means: the model's recent runs took at
//! most INLINE_THRESHOLD µs on average, and this request's inputs are no more than twice as big as the biggest
//! it has run. A DAG runs inline when every op is such a model run and their averages add up to at most the
//! threshold (an op whose inputs another op computes has its size checked just before it runs). A run that
//! still takes longer (its time suddenly grew) is stopped at `inline_limit` and handed to a worker as if it had
//! never started (model runs have no side effects, and an inline run records its statistics only once it has
//! finished), so the main thread is never held much longer than the limit; the run's history then keeps the
//! model off the main thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::run_history::RunHistory;

/// Whether a run of these model ops may run inline: each op's history, with its input size when it is known
/// before the run (inputs another op computes are checked as the op starts: `RunHistory::fits`).
pub fn may_run_inline<'a>(ops: impl IntoIterator<Item = (&'a RunHistory, Option<u64>)>, threshold_us: u64) -> bool {
    let mut total_us = 0u64;
    let mut any = false;
    for (h, input_bytes) in ops {
        let Some(avg_us) = h.settled_avg_us() else { return false };
        if input_bytes.is_some_and(|b| !h.fits(b)) {
            return false;
        }
        total_us = total_us.saturating_add(avg_us);
        any = true;
    }
    any && threshold_us > 0 && total_us <= threshold_us
}

/// How long an inline run may take before it is stopped and queued instead.
pub fn inline_limit(threshold_us: u64) -> Duration {
    Duration::from_micros(threshold_us.saturating_mul(10)).max(Duration::from_millis(1))
}

static INLINE_RUNS: AtomicU64 = AtomicU64::new(0);
static QUEUED_RUNS: AtomicU64 = AtomicU64::new(0);

/// Counts one execution by where it ran (INFO's `ai_inline_runs` / `ai_queued_runs`).
pub fn count(inline: bool) {
    if inline { &INLINE_RUNS } else { &QUEUED_RUNS }.fetch_add(1, Relaxed);
}

/// `(inline, queued)` executions so far: MODELEXECUTE / MODELRUN, and DAGs with at least one op.
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

    fn one(h: &RunHistory, input_bytes: u64, threshold_us: u64) -> bool {
        may_run_inline([(h, Some(input_bytes))], threshold_us)
    }

    #[test]
    fn never_the_first_runs() {
        assert!(!one(&history(&[(5, 16), (5, 16)]), 16, 100));
        assert!(one(&history(&[(5, 16), (5, 16), (5, 16)]), 16, 100));
        // A slow warm-up run does not count once the model has run MIN_RUNS times.
        assert!(one(&history(&[(5000, 16), (900, 16), (5, 16)]), 16, 100));
    }

    #[test]
    fn one_late_run_is_not_a_slow_model() {
        // A 3 µs model whose run lost its core for 3 ms stays inline; runs that stay slow send it to the queue.
        let mut runs = vec![(3, 16); 5];
        runs.push((3000, 16));
        assert!(one(&history(&runs), 16, 100));
        runs.extend([(3000, 16); 6]);
        assert!(!one(&history(&runs), 16, 100));
        // A model that was slow all along never came inline.
        assert!(!one(&history(&[(5000, 16), (900, 16), (500, 16), (500, 16)]), 16, 100));
    }

    #[test]
    fn only_short_models_and_similar_inputs() {
        let h = history(&[(50, 100); 5]);
        assert!(one(&h, 200, 100));
        assert!(!one(&h, 201, 100), "twice the biggest input seen at most");
        assert!(!one(&h, 100, 40), "slower than the threshold");
        assert!(!one(&h, 100, 0), "0 turns inline runs off");
        assert!(h.fits(200) && !h.fits(201));
    }

    #[test]
    fn a_dag_is_short_when_its_ops_add_up_to_the_threshold() {
        let (a, b) = (history(&[(40, 100); 5]), history(&[(50, 100); 5]));
        // b's input is computed by a: unknown before the run.
        assert!(may_run_inline([(&a, Some(100)), (&b, None)], 100));
        assert!(!may_run_inline([(&a, Some(100)), (&b, None)], 80), "40 + 50 > 80");
        assert!(!may_run_inline([(&a, Some(100)), (&b, None), (&b, None)], 100), "three ops: 140 > 100");
        assert!(!may_run_inline([(&a, Some(300)), (&b, None)], 100), "a known input still has to fit");
        assert!(!may_run_inline([(&a, Some(100)), (&history(&[(1, 100); 2]), None)], 100), "a new model");
        assert!(!may_run_inline(std::iter::empty::<(&RunHistory, Option<u64>)>(), 100), "nothing to run");
    }

    #[test]
    fn slow_runs_move_the_model_off_the_main_thread() {
        let h = history(&[(20, 16); 5]);
        h.record(5000, 16);
        h.record(5000, 16);
        assert!(one(&h, 16, 100), "20 -> 35 -> 61 µs");
        h.record(5000, 16);
        assert!(!one(&h, 16, 100), "-> 107 µs");
        // It comes back once its runs are short again (the average forgets a quarter per run).
        for _ in 0..16 {
            h.record(20, 16);
        }
        assert!(one(&h, 16, 100));
        h.record_stopped(1000);
        assert!(!one(&h, 16, 100));
    }

    #[test]
    fn the_limit_is_at_least_a_millisecond() {
        assert_eq!(inline_limit(20), Duration::from_millis(1));
        assert_eq!(inline_limit(500), Duration::from_millis(5));
    }
}
