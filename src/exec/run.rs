//! A run: one execution of a plan, shared (`Arc`) by one entry per device queue. The entries share one
//! lock over the tensor slots; each worker step runs one ready op outside that lock. An entry whose op
//! lacks inputs is parked on the run and requeued when another op finishes (no polling). The entry that
//! finishes last calls the completion exactly once, also after a failure or a timeout.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::dag::{OpKind, Plan};
use super::queue::{Queue, Queues};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Debug, Clone, PartialEq)]
pub enum OpOutcome {
    NotRun,
    Done,
    Failed(Error),
}

type Completion = Box<dyn FnOnce(Arc<Run>) + Send>;

struct State {
    slots: Vec<Option<Arc<Tensor>>>,
    outcomes: Vec<OpOutcome>,
    parked: Vec<Entry>,
    failed: bool,
}

pub struct Run {
    pub plan: Plan,
    state: Mutex<State>,
    /// Entries not finished yet; the one that takes it to zero completes the run.
    remaining: AtomicUsize,
    timed_out: AtomicBool,
    deadline: Option<Instant>,
    queues: Vec<Arc<Queue>>,
    device_ops: Vec<Vec<usize>>,
    completion: Mutex<Option<Completion>>,
}

/// A run's presence on one device queue: the position of that device's next op.
pub struct Entry {
    run: Arc<Run>,
    dev: usize,
    pos: usize,
}

impl Run {
    /// Queues the plan: one entry per device. `done` is called exactly once, on a worker thread.
    pub fn submit(plan: Plan, queues: &Queues, done: impl FnOnce(Arc<Run>) + Send + 'static) -> Result<()> {
        let devices = plan.device_ops();
        let qs = devices
            .iter()
            .map(|(d, _)| queues.get(d))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|_| Error::Generic("Could not initialize queue on requested device".into()))?;
        let mut slots = vec![None; plan.slots];
        for (s, t) in &plan.loaded {
            slots[*s] = Some(t.clone());
        }
        let run = Arc::new(Run {
            state: Mutex::new(State {
                slots,
                outcomes: vec![OpOutcome::NotRun; plan.ops.len()],
                parked: Vec::new(),
                failed: false,
            }),
            remaining: AtomicUsize::new(devices.len()),
            timed_out: AtomicBool::new(false),
            deadline: plan.timeout.map(|t| Instant::now() + t),
            queues: qs,
            device_ops: devices.into_iter().map(|(_, ops)| ops).collect(),
            completion: Mutex::new(Some(Box::new(done))),
            plan,
        });
        if run.device_ops.is_empty() {
            run.complete();
            return Ok(());
        }
        for dev in 0..run.device_ops.len() {
            run.queues[dev].push_back(Entry { run: run.clone(), dev, pos: 0 });
        }
        Ok(())
    }

    /// A run with nothing to queue (a DAG of TENSORSET/TENSORGET only), complete as it is.
    pub fn finished(plan: Plan) -> Run {
        let mut slots = vec![None; plan.slots];
        for (s, t) in &plan.loaded {
            slots[*s] = Some(t.clone());
        }
        Run {
            state: Mutex::new(State { slots, outcomes: Vec::new(), parked: Vec::new(), failed: false }),
            remaining: AtomicUsize::new(0),
            timed_out: AtomicBool::new(false),
            deadline: None,
            queues: Vec::new(),
            device_ops: Vec::new(),
            completion: Mutex::new(None),
            plan,
        }
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

    fn complete(self: &Arc<Self>) {
        if let Some(done) = self.completion.lock().take() {
            done(self.clone());
        }
    }

    /// Wakes every parked entry (after progress, a failure or a timeout) by putting it back on its queue.
    fn wake(&self, parked: Vec<Entry>) {
        for e in parked {
            self.queues[e.dev].clone().push_back(e);
        }
    }
}

impl Entry {
    fn finish(self) {
        let run = self.run;
        if run.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            run.complete();
        }
    }

    /// Runs this device's next op if its inputs are ready; see the module comment.
    pub fn step(mut self) {
        let run = self.run.clone();
        let op_index = run.device_ops[self.dev][self.pos];
        let op = &run.plan.ops[op_index];

        let inputs = {
            let mut st = run.state.lock();
            if st.failed || run.timed_out() {
                drop(st);
                return self.finish();
            }
            if run.deadline.is_some_and(|d| Instant::now() > d) {
                run.timed_out.store(true, Ordering::Release);
                let parked = std::mem::take(&mut st.parked);
                drop(st);
                run.wake(parked);
                return self.finish();
            }
            let ready: Option<Vec<Arc<Tensor>>> = op.inputs().iter().map(|&s| st.slots[s].clone()).collect();
            match ready {
                Some(v) => v,
                None => {
                    st.parked.push(self);
                    return;
                }
            }
        };

        let result = catch_unwind(AssertUnwindSafe(|| execute(&op.kind, &inputs)))
            .unwrap_or_else(|_| Err(Error::Generic("internal error: the operation panicked".into())));

        let (parked, failed) = {
            let mut st = run.state.lock();
            match result {
                Ok(outputs) => {
                    for (&s, t) in op.outputs().iter().zip(outputs) {
                        st.slots[s] = Some(t);
                    }
                    st.outcomes[op_index] = OpOutcome::Done;
                }
                Err(e) => {
                    st.outcomes[op_index] = OpOutcome::Failed(e);
                    st.failed = true;
                }
            }
            (std::mem::take(&mut st.parked), st.failed)
        };
        run.wake(parked);

        self.pos += 1;
        if !failed && self.pos < run.device_ops[self.dev].len() {
            run.queues[self.dev].clone().push_front(self);
        } else {
            self.finish();
        }
    }
}

/// Runs one op on the calling worker thread.
fn execute(op: &OpKind, inputs: &[Arc<Tensor>]) -> Result<Vec<Arc<Tensor>>> {
    match op {
        OpKind::Model { model, outputs, .. } => {
            let refs: Vec<&Tensor> = inputs.iter().map(|t| t.as_ref()).collect();
            let start = Instant::now();
            let result = model.loaded().and_then(|m| m.run(&refs)).and_then(|outs| {
                if outs.len() == outputs.len() {
                    Ok(outs)
                } else {
                    Err(Error::Generic("Model did not generate the expected number of outputs".into()))
                }
            });
            match &result {
                Ok(outs) => {
                    let samples = outs.first().map_or(0, |t| t.dim0());
                    model.stats.record_success(start.elapsed().as_micros() as i64, samples);
                }
                Err(_) => model.stats.record_error(),
            }
            Ok(result?.into_iter().map(Arc::new).collect())
        }
    }
}
