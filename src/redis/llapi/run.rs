//! Runs of the API through the engine's queues (the same runs, batching, kill switch and statistics as the
//! commands'), and the completion callbacks.

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec::dag::{OpKind, Plan};
use crate::exec::run::{OpOutcome, Run};
use crate::tensor::Tensor;

/// A completion callback as the header declares it, over the finish context type `F` (ctx.rs).
pub type OnFinish<F> = Option<extern "C" fn(*mut F, *mut c_void)>;

/// The caller's callback and its data, carried to the thread that completes the run.
pub struct Callback<F> {
    cb: extern "C" fn(*mut F, *mut c_void),
    data: *mut c_void,
}

// SAFETY: RedisAI's contract: the callback may be called from any thread, and the caller keeps its data (and
// the run context the finish context points to) alive and untouched until the callback has been called.
unsafe impl<F> Send for Callback<F> {}

impl<F> Callback<F> {
    pub fn new(cb: OnFinish<F>, data: *mut c_void) -> Option<Callback<F>> {
        cb.map(|cb| Callback { cb, data })
    }

    pub fn call(self, mut finished: F) {
        (self.cb)(&mut finished, self.data);
    }
}

/// A raw pointer the caller keeps alive until the callback (the run context of an async run).
pub struct Lent<T>(pub *mut T);
// SAFETY: as for `Callback`: the caller lends it to the run and does not touch it before the callback.
unsafe impl<T> Send for Lent<T> {}

/// Queues `plan`; `done` is called once, on a worker thread, never on the caller's (RedisAI's callers wait
/// for it holding a lock the callback takes). The caller may wait on Redis's main thread, so the workers are
/// woken now rather than when the event loop sleeps.
pub fn submit(plan: Plan, done: impl FnOnce(Arc<Run>) + Send + 'static) -> Result<()> {
    crate::exec::ensure_queues(&plan)?;
    if plan.ops.is_empty() {
        return later(move || done(Arc::new(Run::finished(plan))));
    }
    Run::submit(plan, crate::exec::queues(), done)?;
    crate::exec::queue::flush_wakeups();
    Ok(())
}

/// Runs `f` on a thread of its own: a callback for a run that needs no worker (nothing to compute, or an
/// error known before it starts).
pub fn later(f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name("ai:llapi".into())
        .spawn(f)
        .map(drop)
        .map_err(|e| Error::Internal(format!("cannot start a thread for the callback: {e}")))
}

/// Runs plans and waits for all of them (the synchronous calls). A worker thread must not wait for the
/// queues it serves: that is refused.
pub fn wait(plans: Vec<Plan>) -> Result<Vec<Arc<Run>>> {
    if std::thread::current().name().is_some_and(|n| n.starts_with("ai:")) {
        return Err(Error::Internal("a synchronous run cannot wait on one of RedisAI's own threads".into()));
    }
    let n = plans.len();
    let (tx, rx) = crossbeam_channel::bounded(n);
    for (i, plan) in plans.into_iter().enumerate() {
        let tx = tx.clone();
        submit(plan, move |run| {
            let _ = tx.send((i, run));
        })?;
    }
    drop(tx);
    let mut runs: Vec<Option<Arc<Run>>> = vec![None; n];
    for _ in 0..n {
        let (i, run) = rx.recv().map_err(|_| Error::Internal("a run was lost".into()))?;
        runs[i] = Some(run);
    }
    Ok(runs.into_iter().flatten().collect())
}

/// The run's first error, if it failed, with the op that failed (none for a run that timed out).
pub fn run_error(run: &Run) -> Option<(Error, Option<&OpKind>)> {
    if run.timed_out() {
        return Some((Error::TimedOut { text: "TIMEDOUT".into(), prefixed: false }, None));
    }
    run.plan.ops.iter().enumerate().find_map(|(i, op)| match run.outcome(i) {
        OpOutcome::Failed(e) => Some((e, Some(&op.kind))),
        _ => None,
    })
}

/// The outputs of a run's single op (a run context's), `None` for one it did not produce.
pub fn op_outputs(run: &Run) -> Vec<Option<Arc<Tensor>>> {
    run.plan.ops.first().map_or_else(Vec::new, |op| op.outputs().iter().map(|&s| run.slot(s)).collect())
}
