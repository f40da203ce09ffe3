//! A run: one execution of a plan, shared (`Arc`) by one entry per device queue, and its scheduling. The
//! entries share one lock over the tensor slots; each worker step runs one ready op outside that lock
//! (`op.rs` runs it). An entry whose op lacks inputs is parked on the run and requeued when another op
//! finishes (no polling). The entry that finishes last calls the completion exactly once, also after a
//! failure or a timeout.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::batch::{BatchKey, Queued};
use super::dag::{OpKind, Plan};
use super::op::{self, input_bytes, op_stats, run_model, Req, Sample, Tensors};
use super::queue::{Job, Queue, Queues};
use crate::backends::Posted;
use crate::error::{Error, Result};
use crate::histogram::window_of;
use crate::stats::{self, ErrorKind};
use crate::tensor::Tensor;

#[derive(Debug, Clone, PartialEq)]
pub enum OpOutcome {
    NotRun,
    Done,
    Failed(Error),
}

type Completion = Box<dyn FnOnce(Arc<Run>) + Send>;

struct State {
    slots: SmallVec<[Option<Arc<Tensor>>; 8]>,
    outcomes: SmallVec<[OpOutcome; 2]>,
    parked: Vec<Entry>,
    failed: bool,
}

impl State {
    /// Before any op ran: the plan's loaded tensors in their slots.
    fn of(plan: &Plan) -> State {
        let mut slots = smallvec::smallvec![None; plan.slots];
        for (s, t) in &plan.loaded {
            slots[*s] = Some(t.clone());
        }
        State {
            slots,
            outcomes: smallvec::smallvec![OpOutcome::NotRun; plan.ops.len()],
            parked: Vec::new(),
            failed: false,
        }
    }

    /// Op `op`'s result: its outputs into their slots, or its failure (which stops the run's later ops).
    fn record(&mut self, op: usize, outputs: &[usize], result: Result<Tensors>) {
        match result {
            Ok(outs) => {
                for (&s, t) in outputs.iter().zip(outs) {
                    self.slots[s] = Some(t);
                }
                self.outcomes[op] = OpOutcome::Done;
            }
            Err(e) => {
                self.outcomes[op] = OpOutcome::Failed(e);
                self.failed = true;
            }
        }
    }
}

pub struct Run {
    pub plan: Plan,
    state: Mutex<State>,
    /// Entries not finished yet; the one that takes it to zero completes the run.
    remaining: AtomicUsize,
    timed_out: AtomicBool,
    deadline: Option<Instant>,
    /// When the run was made (the command's arrival, as far as AI.INFO's `total_*` is concerned).
    created: Instant,
    queues: Vec<Arc<Queue<Entry>>>,
    device_ops: Vec<Vec<usize>>,
    completion: Mutex<Option<Completion>>,
}

/// A run's presence on one device queue: the position of that device's next op.
pub struct Entry {
    run: Arc<Run>,
    dev: usize,
    pos: usize,
    queued_at: Instant,
    /// When it was last put on its queue (AI.INFO's and INFO's queue wait).
    pushed_at: Instant,
}

impl Run {
    /// Queues the plan: one entry per device. `done` is called exactly once, on a worker thread.
    pub fn submit(plan: Plan, queues: &Queues<Entry>, done: impl FnOnce(Arc<Run>) + Send + 'static) -> Result<()> {
        let run = Run::new(plan, queues, Box::new(done))?;
        if run.device_ops.is_empty() {
            run.complete();
            return Ok(());
        }
        for entry in Run::entries(&run) {
            run.queues[entry.dev].push_back(entry);
        }
        Ok(())
    }

    fn new(plan: Plan, queues: &Queues<Entry>, done: Completion) -> Result<Arc<Run>> {
        let devices = plan.device_ops();
        let qs = devices
            .iter()
            .map(|(d, _)| queues.get(d))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(super::queue_unavailable)?;
        let now = Instant::now();
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Run {
            state: Mutex::new(State::of(&plan)),
            remaining: AtomicUsize::new(devices.len()),
            timed_out: AtomicBool::new(false),
            deadline: plan.timeout.map(|t| now + t),
            created: now,
            queues: qs,
            device_ops: devices.into_iter().map(|(_, ops)| ops).collect(),
            completion: Mutex::new(Some(done)),
            plan,
        }))
    }

    /// The run's entries, one per device (each must be queued or dropped: `remaining` counts them).
    fn entries(run: &Arc<Run>) -> impl Iterator<Item = Entry> + '_ {
        let now = Instant::now();
        (0..run.device_ops.len()).map(move |dev| Entry {
            run: run.clone(),
            dev,
            pos: 0,
            queued_at: now,
            pushed_at: now,
        })
    }

    /// A run with nothing to queue (a DAG of TENSORSET/TENSORGET only), complete as it is.
    pub fn finished(plan: Plan) -> Run {
        Run {
            state: Mutex::new(State::of(&plan)),
            remaining: AtomicUsize::new(0),
            timed_out: AtomicBool::new(false),
            deadline: None,
            created: Instant::now(),
            queues: Vec::new(),
            device_ops: Vec::new(),
            completion: Mutex::new(None),
            plan,
        }
    }

    /// Time since the run was made: the execution's whole time once it is complete.
    pub fn age(&self) -> std::time::Duration {
        self.created.elapsed()
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Acquire)
    }

    pub fn outcome(&self, op: usize) -> OpOutcome {
        self.state.lock().outcomes[op].clone()
    }

    /// The value of a slot after the run (None if the op producing it never ran).
    pub fn slot(&self, s: usize) -> Option<Arc<Tensor>> {
        self.state.lock().slots[s].clone()
    }

    /// True when an op failed.
    pub fn failed(&self) -> bool {
        self.state.lock().failed
    }

    /// Runs a plan of model ops on the calling thread (Redis's main thread: exec/inline.rs), in DAG order,
    /// giving up once `limit` has passed. The finished run, or the plan when the run was stopped (the caller
    /// queues it). Statistics are recorded only for a finished run, so a stopped one counts once, on a worker.
    pub fn run_inline(plan: Plan, limit: std::time::Duration) -> std::result::Result<Run, Box<Plan>> {
        let run = Run::finished(plan);
        let mut now = Instant::now();
        let deadline = now + limit;
        let mut samples: SmallVec<[(usize, (Sample, Instant)); 4]> = SmallVec::new();
        let stopped = {
            let mut st = run.state.lock();
            let mut stopped = false;
            for (i, op) in run.plan.ops.iter().enumerate() {
                let OpKind::Model { model, inputs, outputs } = &op.kind else {
                    stopped = true;
                    break;
                };
                let loaded: Option<Tensors> = inputs.iter().map(|&s| st.slots[s].clone()).collect();
                let Some(loaded) = loaded.filter(|l| now < deadline && model.history.fits(input_bytes(l))) else {
                    stopped = true;
                    break;
                };
                let start = now;
                let ran = catch_unwind(AssertUnwindSafe(|| {
                    let caller = &run.plan.caller;
                    run_model(model, outputs.len(), &loaded, caller, (start, deadline), |m, req| m.execute_within(req))
                }));
                let result = match ran {
                    Ok(Some((result, sample, end))) => {
                        samples.push((i, (sample, end)));
                        now = end;
                        result
                    }
                    Ok(None) => {
                        model.history.record_stopped(start.elapsed().as_micros() as u64);
                        stopped = true;
                        break;
                    }
                    Err(_) => Err(Error::Internal("internal error: the operation panicked".into())),
                };
                st.record(i, outputs, result);
                if st.failed {
                    break;
                }
            }
            stopped
        };
        if stopped {
            return Err(Box::new(run.plan));
        }
        let req = Req::inline(run.created);
        for (i, (sample, end)) in samples {
            if let OpKind::Model { model, .. } = &run.plan.ops[i].kind {
                sample.record(model, &req, end);
            }
        }
        Ok(run)
    }

    /// Whether `post_inline` may post the plan: model ops only, each of a model built (this runs on Redis's main
    /// thread, which must not wait for a deferred build) by a backend that takes posted runs (a worker process),
    /// and no DAG TIMEOUT (a posted op waits in no queue).
    pub fn posts(plan: &Plan) -> bool {
        plan.timeout.is_none()
            && !plan.ops.is_empty()
            && plan.ops.iter().all(|op| {
                matches!(&op.kind, OpKind::Model { model, .. }
                    if model.built().is_some_and(|m| m.is_ok_and(|m| m.posts())))
            })
    }

    /// `run_inline` without waiting, for a plan that `posts`: each op is posted to its worker
    /// (isolation/post.rs) once its inputs are there, so that ops on different devices run at once, and `done`
    /// gets the finished run later, on Redis's main thread, or the plan when an op was stopped at `limit` or
    /// could not be posted (the caller queues the whole plan: model runs have no side effects). Without a limit
    /// (a run not known to be short), or for a model that cannot be stopped early, an op has
    /// MODEL_EXECUTION_TIMEOUT, as on a queue. Statistics as `run_inline`'s: recorded once the run is finished.
    pub fn post_inline(
        plan: Plan,
        limit: Option<std::time::Duration>,
        done: impl FnOnce(std::result::Result<Run, Box<Plan>>) + Send + 'static,
    ) {
        let posted = smallvec::smallvec![false; plan.ops.len()];
        let posting = Arc::new(Mutex::new(Posting {
            run: Some(Run::finished(plan)),
            deadline: limit.map(|l| Instant::now() + l),
            posted,
            in_flight: 0,
            stopped: false,
            samples: SmallVec::new(),
            done: Some(Box::new(done)),
        }));
        Posting::advance(&posting);
    }

    /// Hands the run to its completion. Takes the caller's `Arc` so that no worker keeps the run (and the
    /// models it holds) alive once the reply is on its way.
    fn complete(self: Arc<Self>) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
        if self.timed_out() && stats::detailed() {
            self.count_timeouts();
        }
        let done = self.completion.lock().take();
        if let Some(done) = done {
            done(self);
        }
    }

    /// AI.INFO's `errors_timeout`: each op the timeout kept from running.
    fn count_timeouts(&self) {
        let st = self.state.lock();
        for (op, outcome) in self.plan.ops.iter().zip(&st.outcomes) {
            if *outcome == OpOutcome::NotRun {
                op_stats(&op.kind).detail.record_error(ErrorKind::Timeout);
            }
        }
    }

    /// Wakes every parked entry (after progress, a failure or a timeout) by putting it back on its queue.
    fn wake(&self, parked: Vec<Entry>) {
        for e in parked {
            self.queues[e.dev].push_back(e);
        }
    }
}

/// An entry leaves its run only by being dropped: once its device has no ops left, when the run failed or timed
/// out, or because something went wrong outside an op (a panic in a worker's bookkeeping unwinds through it).
/// Either way the run loses one entry, and the last one out completes it: its client is answered exactly once.
impl Drop for Entry {
    fn drop(&mut self) {
        let run = &self.run;
        if self.pos < run.device_ops[self.dev].len() {
            // Ops left: normal for a failed or timed-out run. Otherwise this entry was lost mid-way: the run
            // fails, so that the entries parked on its outputs stop waiting and the client gets an error.
            let parked = {
                let mut st = run.state.lock();
                if !st.failed && !run.timed_out() {
                    let op = run.device_ops[self.dev][self.pos];
                    if st.outcomes[op] == OpOutcome::NotRun {
                        st.outcomes[op] =
                            OpOutcome::Failed(Error::Internal("internal error: the run was interrupted".into()));
                    }
                    st.failed = true;
                }
                std::mem::take(&mut st.parked)
            };
            run.wake(parked);
        }
        if run.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            run.clone().complete();
        }
    }
}

impl Entry {
    fn finish(self) {
        drop(self);
    }

    /// How long it has waited on its queue, recorded in the queue's figures.
    fn waited(&self) -> u64 {
        if !stats::detailed() {
            return 0;
        }
        let now = Instant::now();
        let us = now.saturating_duration_since(self.pushed_at).as_micros() as u64;
        self.run.queues[self.dev].waits.record(us, window_of(now));
        us
    }

    fn req(&self, queue_us: u64) -> Req {
        Req::queued(queue_us, self.run.created)
    }

    fn op_index(&self) -> usize {
        self.run.device_ops[self.dev][self.pos]
    }

    /// Skips a failed or timed-out run, parks an entry whose inputs are missing, or returns the inputs.
    /// One lock decides all three: a producer that fails (or a run that times out) between "inputs
    /// missing" and "parked" would otherwise leave this entry parked with nobody left to wake it.
    fn prepare(self) -> Option<(Entry, Tensors, u64)> {
        let run = self.run.clone();
        let mut st = run.state.lock();
        let finish = if st.failed || run.timed_out() {
            Some(Vec::new())
        } else if run.deadline.is_some_and(|d| Instant::now() > d) {
            run.timed_out.store(true, Ordering::Release);
            Some(std::mem::take(&mut st.parked))
        } else {
            None
        };
        if let Some(parked) = finish {
            drop(st);
            run.wake(parked);
            drop(run);
            self.finish();
            return None;
        }
        let inputs = run.plan.ops[self.op_index()].inputs().iter().map(|&s| st.slots[s].clone()).collect();
        match inputs {
            Some(v) => {
                drop(st);
                drop(run);
                let waited = self.waited();
                Some((self, v, waited))
            }
            None => {
                st.parked.push(self);
                None
            }
        }
    }

    /// Records the op's result, wakes parked entries, and goes on with this device's next op or finishes.
    fn complete(mut self, result: Result<Tensors>) {
        let op_index = self.op_index();
        let (parked, failed) = {
            let run = &self.run;
            let op = &run.plan.ops[op_index];
            let mut st = run.state.lock();
            st.record(op_index, op.outputs(), result);
            (std::mem::take(&mut st.parked), st.failed)
        };
        self.run.wake(parked);

        self.pos += 1;
        if !failed && self.pos < self.run.device_ops[self.dev].len() {
            let queue = self.run.queues[self.dev].clone();
            queue.push_front(self);
        } else {
            self.finish();
        }
    }

    /// Runs this device's next op if its inputs are ready; see the module comment.
    pub fn step(self) {
        if let Some((entry, inputs, waited)) = self.prepare() {
            let result = {
                let op = &entry.run.plan.ops[entry.op_index()];
                let caller = &entry.run.plan.caller;
                let req = entry.req(waited);
                catch_unwind(AssertUnwindSafe(|| op::execute(&op.kind, &inputs, &req, caller)))
                    .unwrap_or_else(|_| Err(Error::Internal("internal error: the operation panicked".into())))
            };
            drop(inputs);
            entry.complete(result);
        }
    }
}

impl Job for Entry {
    fn mark_queued(&mut self) {
        if stats::detailed() {
            self.pushed_at = Instant::now();
        }
    }

    fn step(self) {
        Entry::step(self)
    }

    fn step_batch(jobs: Vec<Entry>) {
        step_batch(jobs)
    }

    fn quiet() -> bool {
        IN_FLIGHT.load(Ordering::Relaxed) == 0
    }
}

/// Runs submitted and not yet completed (`Job::quiet`).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

impl Queued for Entry {
    /// What auto-batching needs to know about this entry's current op, if it is a batchable model run
    /// whose inputs are ready (`None` otherwise: the entry is then simply stepped).
    fn queued_at(&self) -> Instant {
        self.queued_at
    }

    fn deadline(&self) -> Option<Instant> {
        self.run.deadline
    }

    fn batch_key(&self) -> Option<BatchKey> {
        let op = &self.run.plan.ops[self.op_index()];
        let OpKind::Model { model, inputs, .. } = &op.kind else { return None };
        if model.spec.batch.size == 0 || inputs.is_empty() {
            return None;
        }
        let st = self.run.state.lock();
        if st.failed || self.run.timed_out() {
            return None;
        }
        let tensors: Option<Vec<&Arc<Tensor>>> = inputs.iter().map(|&s| st.slots[s].as_ref()).collect();
        let tensors = tensors?;
        let dim0 = tensors[0].shape().first().copied()?;
        if tensors.iter().any(|t| t.shape().first() != Some(&dim0)) {
            return None;
        }
        Some(BatchKey {
            model: Arc::as_ptr(model) as usize,
            opts: model.spec.batch,
            layout: tensors.iter().map(|t| (t.dtype(), t.shape()[1..].to_vec())).collect(),
            rows: dim0.max(0) as u64,
        })
    }
}

/// Runs the current ops of `entries` (same model, compatible inputs) as one batch (`op::run_batch`); a failure
/// reaches every request.
pub fn step_batch(entries: Vec<Entry>) {
    let ready: Vec<(Entry, Tensors, u64)> = entries.into_iter().filter_map(Entry::prepare).collect();
    let Some(model) = ready.first().and_then(|(e, _, _)| match &e.run.plan.ops[e.op_index()].kind {
        OpKind::Model { model, .. } => Some(model.clone()),
        OpKind::Script { .. } => None,
    }) else {
        // Only model runs are ever batched (`batch_key`); anything else steps alone.
        for (entry, inputs, waited) in ready {
            let (plan, req) = (&entry.run.plan, entry.req(waited));
            let result = op::execute(&plan.ops[entry.op_index()].kind, &inputs, &req, &plan.caller);
            entry.complete(result);
        }
        return;
    };
    let (entries, requests): (Vec<Entry>, Vec<(Tensors, Req)>) = ready
        .into_iter()
        .map(|(entry, inputs, waited)| {
            let req = entry.req(waited);
            (entry, (inputs, req))
        })
        .unzip();
    let results = op::run_batch(&model, requests);
    // Not kept past the replies: a model deleted meanwhile is freed here, not after the last one.
    drop(model);
    for (entry, result) in entries.into_iter().zip(results) {
        entry.complete(result);
    }
}

/// A plan whose ops are posted (`Run::post_inline`): what is posted, in flight and answered so far. Touched on
/// Redis's main thread only (posting, and the answers `isolation::post::collect` hands over).
struct Posting {
    /// Taken when the run is finished.
    run: Option<Run>,
    /// When a known-short plan's ops are stopped (the inline limit); `None`: MODEL_EXECUTION_TIMEOUT per op.
    deadline: Option<Instant>,
    posted: SmallVec<[bool; 4]>,
    in_flight: usize,
    /// An op was stopped or could not be posted: the plan is queued once nothing is in flight.
    stopped: bool,
    samples: SmallVec<[(usize, Sample); 4]>,
    done: Option<PostingDone>,
}

/// What a posted plan's caller gets: the finished run, or the plan to queue.
type PostingDone = Box<dyn FnOnce(std::result::Result<Run, Box<Plan>>) + Send>;

/// An op ready to post: its index, model, inputs and caller.
type Ready = (usize, Arc<crate::model::Model>, Tensors, crate::caller::Caller);

impl Posting {
    /// Posts every op whose inputs are there (unless an op failed or stopped), then finishes the run if nothing
    /// is left in flight. No lock is held while posting: an op that cannot be posted answers at once.
    fn advance(p: &Arc<Mutex<Posting>>) {
        let (ready, deadline) = {
            let mut g = p.lock();
            let g = &mut *g;
            let mut ready: SmallVec<[Ready; 4]> = SmallVec::new();
            if let Some(run) = g.run.as_ref().filter(|_| !g.stopped) {
                let st = run.state.lock();
                if !st.failed {
                    for (i, op) in run.plan.ops.iter().enumerate() {
                        let OpKind::Model { model, inputs, .. } = &op.kind else { continue };
                        if g.posted[i] {
                            continue;
                        }
                        let loaded: Option<Tensors> = inputs.iter().map(|&s| st.slots[s].clone()).collect();
                        if let Some(loaded) = loaded {
                            ready.push((i, model.clone(), loaded, run.plan.caller.clone()));
                        }
                    }
                }
            }
            for (i, ..) in &ready {
                g.posted[*i] = true;
                g.in_flight += 1;
            }
            (ready, g.deadline)
        };
        for op in ready {
            Posting::post(p, op, deadline);
        }
        Posting::finish(p);
    }

    fn post(p: &Arc<Mutex<Posting>>, (i, model, inputs, caller): Ready, deadline: Option<Instant>) {
        let Ok(m) = model.loaded() else {
            return Posting::answered(p, i, &model, &inputs, Instant::now(), Posted::NotPosted);
        };
        let start = Instant::now();
        let within = deadline.filter(|_| m.stops_early());
        if within.is_some_and(|d| start >= d || !model.history.fits(input_bytes(&inputs))) {
            return Posting::answered(p, i, &model, &inputs, start, Posted::NotPosted);
        }
        let end = within.unwrap_or_else(|| start + crate::config::CONFIG.read().execution_limit());
        let refs: SmallVec<[&Tensor; 4]> = inputs.iter().map(|t| t.as_ref()).collect();
        let req = crate::backends::RunRequest { inputs: &refs, caller: &caller, start, deadline: end };
        let (p2, held, ins) = (p.clone(), model.clone(), inputs.clone());
        m.post(&req, within.is_some(), Box::new(move |outcome| Posting::answered(&p2, i, &held, &ins, start, outcome)));
    }

    /// Op `i`'s answer: its outputs (or its failure) into the run, then the ops it made ready.
    fn answered(
        p: &Arc<Mutex<Posting>>,
        i: usize,
        model: &crate::model::Model,
        inputs: &[Arc<Tensor>],
        start: Instant,
        outcome: Posted,
    ) {
        {
            let mut g = p.lock();
            let g = &mut *g;
            g.in_flight -= 1;
            match outcome {
                Posted::Ran(result) => {
                    let Some(run) = g.run.as_ref() else { return };
                    let OpKind::Model { outputs, .. } = &run.plan.ops[i].kind else { return };
                    let micros = start.elapsed().as_micros() as u64;
                    let (result, sample) = op::model_result(result, outputs.len(), micros, inputs);
                    run.state.lock().record(i, outputs, result);
                    g.samples.push((i, sample));
                }
                // A posted run holds no thread of Redis's: its stop (or a worker that did not get to it in time:
                // the machine's cores were busy) counts as one slow run, capped as any, not as a model proven
                // slow at once (`record_stopped`, for runs on the main thread). One stall on a busy machine then
                // keeps a tiny model posted instead of queueing the next few hundred runs; runs stopped again
                // and again still send it to the queue (7 in a row for a 3 µs model).
                Posted::Stopped => {
                    model.history.record(start.elapsed().as_micros() as u64, input_bytes(inputs));
                    g.stopped = true;
                }
                Posted::NotPosted => g.stopped = true,
            }
        }
        Posting::advance(p);
    }

    /// Once nothing is in flight and nothing more can be posted: the finished run (its statistics recorded), or
    /// the plan to queue when an op stopped (or an op could never be posted).
    fn finish(p: &Arc<Mutex<Posting>>) {
        let (run, stopped, samples, done) = {
            let mut g = p.lock();
            let Some(run) = g.run.as_ref() else { return };
            if g.in_flight > 0 {
                return;
            }
            let failed = run.state.lock().failed;
            // Ops left unposted with nothing in flight: their inputs will never come (not in a checked plan);
            // the queue then says what is wrong.
            if !g.stopped && !failed && g.posted.iter().any(|&b| !b) {
                g.stopped = true;
            }
            let (Some(run), Some(done)) = (g.run.take(), g.done.take()) else { return };
            (run, g.stopped, std::mem::take(&mut g.samples), done)
        };
        if stopped {
            return done(Err(Box::new(run.plan)));
        }
        let (req, now) = (Req::inline(run.created), Instant::now());
        for (i, sample) in samples {
            if let OpKind::Model { model, .. } = &run.plan.ops[i].kind {
                sample.record(model, &req, now);
            }
        }
        done(Ok(run))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::backends::{LoadedModel, Outputs};
    use crate::device::Device;
    use crate::exec::dag::{Op, OpKind, Plan};
    use crate::model::{BackendKind, BatchOpts, Model, ModelSpec};
    use crate::tensor::DataType;

    /// Adds its inputs plus one (f64 scalars); counts its runs; fails when told to.
    struct Fake {
        names: Vec<String>,
        outputs: Vec<String>,
        runs: Arc<AtomicUsize>,
        fail: bool,
        delay: Duration,
    }

    impl LoadedModel for Fake {
        fn inputs(&self) -> &[String] {
            &self.names
        }
        fn outputs(&self) -> &[String] {
            &self.outputs
        }
        fn run(&self, req: &crate::backends::RunRequest) -> Result<Outputs> {
            let inputs = req.inputs;
            self.runs.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            if self.fail {
                return Err(Error::Backend("injected failure".into()));
            }
            let sum: f64 = inputs.iter().map(|t| value(t)).sum();
            Ok(smallvec::smallvec![scalar(sum + 1.0)])
        }
    }

    fn scalar(v: f64) -> Tensor {
        Tensor::from_blob(DataType::Double, vec![], &v.to_le_bytes()).unwrap()
    }
    fn value(t: &Tensor) -> f64 {
        f64::from_le_bytes(t.data().try_into().unwrap())
    }

    /// An ONNX-kind spec on `device` (the fake backend ignores everything else).
    fn spec(device: &str) -> ModelSpec {
        ModelSpec {
            backend: BackendKind::Onnx,
            device: Device::parse(device.as_bytes()).unwrap(),
            tag: vec![],
            batch: BatchOpts::default(),
            inputs: vec![],
            outputs: vec![],
            blob: Vec::new().into(),
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn random_dags_run_each_op_once_after_its_inputs_and_reply_once() {
        let queues = Queues::new(2);
        let devices = ["CPU", "CPU:1", "CPU:2"];
        let mut rng = Rng(0x9e3779b97f4a7c15);
        for round in 0..300 {
            let nops = 1 + rng.next(8);
            let mut plan = Plan::default();
            let first = plan.new_slot();
            plan.loaded.push((first, Arc::new(scalar(1.0))));
            let mut expected = vec![Some(1.0)];
            let mut runs = Vec::new();
            let mut models = Vec::new();
            let mut any_fail = false;
            for _ in 0..nops {
                let k = 1 + rng.next(2);
                let inputs: Vec<usize> = (0..k).map(|_| rng.next(plan.slots)).collect();
                let fail = rng.next(12) == 0;
                any_fail |= fail;
                let counter = Arc::new(AtomicUsize::new(0));
                let dev = devices[rng.next(devices.len())];
                let fake = Fake {
                    names: vec!["x".into(); k],
                    outputs: vec!["y".into()],
                    runs: counter.clone(),
                    fail,
                    delay: Duration::from_micros(50),
                };
                let model = Arc::new(Model::with_handle(b"m", spec(dev), Ok(Box::new(fake))));
                let out = plan.new_slot();
                let v = inputs.iter().map(|&i| expected[i]).sum::<Option<f64>>().filter(|_| !fail).map(|s| s + 1.0);
                expected.push(v);
                plan.ops.push(Op {
                    kind: OpKind::Model {
                        model: model.clone(),
                        inputs: inputs.into(),
                        outputs: smallvec::smallvec![out],
                    },
                    device: dev.into(),
                });
                runs.push(counter);
                models.push(model);
            }
            let replies = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = mpsc::channel();
            let r = replies.clone();
            Run::submit(plan, &queues, move |run| {
                r.fetch_add(1, Ordering::SeqCst);
                tx.send(run).unwrap();
            })
            .unwrap();
            let run = rx.recv_timeout(Duration::from_secs(10)).expect("the run replied");
            for (i, counter) in runs.iter().enumerate() {
                let n = counter.load(Ordering::SeqCst);
                assert!(n <= 1, "round {round}: op {i} ran {n} times");
                match run.outcome(i) {
                    OpOutcome::Done => {
                        assert_eq!(n, 1);
                        let out = run.plan.ops[i].outputs()[0];
                        assert_eq!(run.slot(out).map(|t| value(&t)), expected[out], "round {round} op {i}");
                    }
                    OpOutcome::Failed(_) => assert_eq!(n, 1),
                    OpOutcome::NotRun => assert!(any_fail, "round {round}: op {i} skipped without a failure"),
                }
            }
            assert_eq!(run.failed(), any_fail && (0..nops).any(|i| matches!(run.outcome(i), OpOutcome::Failed(_))));
            drop(run);
            // Every entry is gone once the completion ran: nothing holds the run (and its models) any more.
            std::thread::sleep(Duration::from_millis(1));
            for m in &models {
                let deadline = Instant::now() + Duration::from_secs(2);
                while Arc::strong_count(m) > 1 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(Arc::strong_count(m), 1, "round {round}: a run still holds a model");
            }
            assert_eq!(replies.load(Ordering::SeqCst), 1);
        }
    }

    /// An entry dropped outside an op (a panic in a worker's bookkeeping) fails the run: the entry parked on its
    /// output is woken, and the client is answered once instead of staying blocked.
    #[test]
    fn an_entry_lost_outside_an_op_fails_the_run_and_it_replies_once() {
        let queues = Queues::new(1);
        let mut plan = Plan::default();
        let (a, b, c) = (plan.new_slot(), plan.new_slot(), plan.new_slot());
        plan.loaded.push((a, Arc::new(scalar(1.0))));
        for (dev, input, output) in [("CPU", a, b), ("CPU:1", b, c)] {
            let fake = Fake {
                names: vec!["x".into()],
                outputs: vec!["y".into()],
                runs: Arc::new(AtomicUsize::new(0)),
                fail: false,
                delay: Duration::ZERO,
            };
            let model = Arc::new(Model::with_handle(b"m", spec(dev), Ok(Box::new(fake))));
            plan.ops.push(Op {
                kind: OpKind::Model { model, inputs: smallvec::smallvec![input], outputs: smallvec::smallvec![output] },
                device: dev.into(),
            });
        }
        let replies = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let r = replies.clone();
        let run = Run::new(
            plan,
            &queues,
            Box::new(move |run| {
                r.fetch_add(1, Ordering::SeqCst);
                tx.send(run).unwrap();
            }),
        )
        .unwrap();
        let mut entries: Vec<Entry> = Run::entries(&run).collect();
        drop(run);
        let consumer = entries.pop().unwrap();
        assert_eq!(consumer.dev, 1);
        assert!(consumer.prepare().is_none(), "the consumer parks: its input is not there yet");
        let producer = entries.pop().unwrap();
        let lost = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _held = producer;
            panic!("injected: a worker's bookkeeping panicked");
        }));
        assert!(lost.is_err());
        let run = rx.recv_timeout(Duration::from_secs(5)).expect("the run replied");
        assert!(run.failed());
        assert!(matches!(run.outcome(0), OpOutcome::Failed(_)));
        assert_eq!(run.outcome(1), OpOutcome::NotRun);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(replies.load(Ordering::SeqCst), 1);
    }

    /// Gives up on every inline run (as a run past the inline limit does).
    struct GivesUp(Vec<String>);

    impl LoadedModel for GivesUp {
        fn inputs(&self) -> &[String] {
            &self.0
        }
        fn outputs(&self) -> &[String] {
            &self.0[..1]
        }
        fn run(&self, _: &crate::backends::RunRequest) -> Result<Outputs> {
            Ok(smallvec::smallvec![scalar(0.0)])
        }
        fn run_within(&self, _: &crate::backends::RunRequest) -> Option<Result<Outputs>> {
            None
        }
    }

    /// An inline run goes op by op in DAG order; one that gives up returns the plan untouched and records no
    /// statistics for the ops that had finished, so that the queued rerun counts each op once.
    #[test]
    fn inline_runs_in_dag_order_and_a_stopped_one_records_nothing() {
        let runs = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            names: vec!["x".into(); 2],
            outputs: vec!["y".into()],
            runs: runs.clone(),
            fail: false,
            delay: Duration::ZERO,
        };
        let first = Arc::new(Model::with_handle(b"first", spec("CPU"), Ok(Box::new(fake))));
        let plan_of = |second: Arc<Model>| {
            let mut plan = Plan::default();
            let (a, b, c) = (plan.new_slot(), plan.new_slot(), plan.new_slot());
            plan.loaded.push((a, Arc::new(scalar(1.0))));
            let op = |model, inputs, out| Op {
                kind: OpKind::Model { model, inputs, outputs: smallvec::smallvec![out] },
                device: "CPU".into(),
            };
            plan.ops.push(op(first.clone(), smallvec::smallvec![a, a], b));
            plan.ops.push(op(second, smallvec::smallvec![b, a], c));
            (plan, c)
        };
        // Inline runs are for models with a history of runs on inputs of this size (16 bytes).
        let warm = |m: &Model| (0..3).for_each(|_| m.history.record(1, 16));
        warm(&first);
        // first: 1 + 1 + 1 = 3; then first again on (3, 1): 5.
        let (plan, out) = plan_of(first.clone());
        let run = Run::run_inline(plan, Duration::from_secs(5)).ok().expect("ran inline");
        assert_eq!(run.slot(out).map(|t| value(&t)), Some(5.0));
        assert!(matches!((run.outcome(0), run.outcome(1)), (OpOutcome::Done, OpOutcome::Done)));
        assert_eq!(first.stats.calls.load(Ordering::SeqCst), 2);
        drop(run);

        let stops = Arc::new(Model::with_handle(b"stops", spec("CPU"), Ok(Box::new(GivesUp(vec!["x".into(); 2])))));
        warm(&stops);
        let (plan, _) = plan_of(stops.clone());
        let plan = Run::run_inline(plan, Duration::from_secs(5)).err().expect("stopped");
        assert_eq!(plan.ops.len(), 2, "the plan comes back whole");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "the first op did run");
        assert_eq!(first.stats.calls.load(Ordering::SeqCst), 2, "but its run is not counted");
        assert_eq!(stops.stats.calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn timeout_replies_once_and_skips_waiting_ops() {
        let queues = Queues::new(1);
        let slow = Arc::new(AtomicUsize::new(0));
        let fake = |runs: &Arc<AtomicUsize>| Fake {
            names: vec!["x".into()],
            outputs: vec!["y".into()],
            runs: runs.clone(),
            fail: false,
            delay: Duration::from_micros(50),
        };
        let model = Arc::new(Model::with_handle(b"m", spec("CPU"), Ok(Box::new(fake(&slow)))));
        let mut plan = Plan { timeout: Some(Duration::from_nanos(1)), ..Plan::default() };
        let s = plan.new_slot();
        plan.loaded.push((s, Arc::new(scalar(0.0))));
        let out = plan.new_slot();
        plan.ops.push(Op {
            kind: OpKind::Model { model, inputs: smallvec::smallvec![s], outputs: smallvec::smallvec![out] },
            device: "CPU".into(),
        });
        std::thread::sleep(Duration::from_millis(2));
        let (tx, rx) = mpsc::channel();
        Run::submit(plan, &queues, move |run| tx.send(run.timed_out()).unwrap()).unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
        assert_eq!(slow.load(Ordering::SeqCst), 0);
    }

    /// A consumer that parks while its producer, on another device, fails (or the run times out) must still
    /// be finished: the failure and the parking are decided under the same lock. Many fast rounds, since
    /// the window between "inputs missing" and "parked" is short.
    #[test]
    fn consumer_of_a_failing_producer_on_another_device_replies() {
        let queues = Queues::new(1);
        let model = |d: &str, fail: bool| {
            let fake = Fake {
                names: vec!["x".into()],
                outputs: vec!["y".into()],
                runs: Arc::new(AtomicUsize::new(0)),
                fail,
                delay: Duration::ZERO,
            };
            Arc::new(Model::with_handle(b"m", spec(d), Ok(Box::new(fake))))
        };
        let (producer, consumer) = (model("CPU", true), model("CPU:1", false));
        for round in 0..100_000 {
            let mut plan = Plan::default();
            let a = plan.new_slot();
            plan.loaded.push((a, Arc::new(scalar(0.0))));
            let (b, c) = (plan.new_slot(), plan.new_slot());
            plan.ops.push(Op {
                kind: OpKind::Model {
                    model: producer.clone(),
                    inputs: smallvec::smallvec![a],
                    outputs: smallvec::smallvec![b],
                },
                device: "CPU".into(),
            });
            plan.ops.push(Op {
                kind: OpKind::Model {
                    model: consumer.clone(),
                    inputs: smallvec::smallvec![b],
                    outputs: smallvec::smallvec![c],
                },
                device: "CPU:1".into(),
            });
            let (tx, rx) = mpsc::channel();
            Run::submit(plan, &queues, move |run| tx.send(run.failed()).unwrap()).unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true), "round {round}: no reply");
        }
    }
}
