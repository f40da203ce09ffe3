//! A model or script whose backend runs in a worker: the same seam (`LoadedModel`, `LoadedScript`) as a backend
//! in this process, each call one request on a lane of the worker of the model's (device queue, backend). A
//! worker that is new since the model was last loaded there gets the model's bytes first (generations), so
//! models survive a worker's crash without anyone storing them again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lane::{self, Lane};
use super::post::Late;
use super::request::{killed_at_kill_switch, read_outputs, read_run, write_request};
use super::supervisor::{Process, Slot};
use super::wire::{self, Reader, Writer};
use crate::backend_kind::BackendKind;
use crate::backends::{
    LoadOptions, LoadedModel, LoadedScript, Outputs, PostDone, Posted, RunReport, RunRequest, ScriptReport,
    ScriptRequest,
};
use crate::blob::Blob;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::script_spec::ScriptSpec;
use crate::tensor::Tensor;

/// How long Redis's thread polls for a reply before it sleeps (a tiny model's whole run fits in it). Measured on
/// two cores against not polling at all: tiny ONNX at 50 clients 0.62 of in-process instead of 0.30, TF fraud
/// 0.50 instead of 0.70 (its own pool polls too); docs/benchmarks.md.
const SPIN: Duration = Duration::from_micros(30);
/// Beyond a run's deadline and its limit again, how long its worker has to honour the kill switch before it is
/// killed.
const GRACE: Duration = Duration::from_secs(2);
/// How long a load may take (a large TensorFlow graph takes seconds).
const LOAD_LIMIT: Duration = Duration::from_secs(600);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What the worker needs to (re)build a model or script.
enum Source {
    Model { kind: BackendKind, blob: Blob, opts: LoadOptions },
    Script { source: String, entry_points: Vec<String> },
}

/// A model or script held by a worker.
struct Remote {
    id: u64,
    slot: Arc<Slot>,
    device: Device,
    source: Source,
}

impl Remote {
    fn new(kind: BackendKind, device: Device, source: Source) -> Remote {
        let slot = super::supervisor::slot(device.queue_key(), kind);
        Remote { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), slot, device, source }
    }

    /// The running worker, if it has this model or script loaded (else nothing on the main thread waits for one).
    fn loaded_process(&self) -> Option<Arc<Process>> {
        self.slot.current().filter(|p| p.loaded.lock().contains(&self.id))
    }

    /// One request on a lane of the running worker, loading the model there first when it is new to it.
    fn call<R>(
        &self,
        (limit, deadline, spin): (Duration, Instant, Duration),
        write: impl FnOnce(&mut Writer<Lane>),
        read: impl FnOnce(&mut Reader) -> Result<R>,
    ) -> Result<R> {
        let process = self.slot.process()?;
        let mut lane = process.lane()?;
        let result = (|| {
            if !process.loaded.lock().contains(&self.id) {
                exchange(
                    &process,
                    &mut lane,
                    (Instant::now() + LOAD_LIMIT, Overrun::Kill, SPIN),
                    |w| self.write_load(w),
                    |_| Ok(()),
                )?;
                process.loaded.lock().insert(self.id);
            }
            // A backend may overrun its kill switch a little (TensorFlow retries a failed allocation for 10 s):
            // the worker is killed only after the limit again and GRACE.
            exchange(&process, &mut lane, (deadline + limit + GRACE, Overrun::Kill, spin), write, read)
        })();
        process.give(lane);
        result
    }

    fn write_load(&self, w: &mut Writer<Lane>) {
        match &self.source {
            Source::Model { kind, blob, opts } => {
                w.u8(wire::LOAD_MODEL)
                    .u64(self.id)
                    .u8(wire::backend_code(*kind))
                    .bytes(self.device.name.as_bytes())
                    .u32(opts.intra_op_threads as u32)
                    .u32(opts.inter_op_threads as u32)
                    .strings(&opts.inputs)
                    .strings(&opts.outputs)
                    .bytes(blob);
            }
            Source::Script { source, entry_points } => {
                w.u8(wire::LOAD_SCRIPT)
                    .u64(self.id)
                    .bytes(self.device.name.as_bytes())
                    .bytes(source.as_bytes())
                    .strings(entry_points);
            }
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(p) = self.slot.current() {
            if p.loaded.lock().remove(&self.id) {
                p.to_free.lock().push(self.id);
            }
        }
    }
}

/// What to do with a worker still running a request at its hard deadline.
#[derive(Clone, Copy)]
enum Overrun<'a> {
    /// It overran its kill switch: stuck in the backend.
    Kill,
    /// A question that may wait (INFO), or a run that may go to a worker thread instead (inline): give up on the
    /// answer, leave the worker be (the lane comes back once it has answered: `Process::give`), and say so in
    /// the flag (the error alone cannot tell a late answer from a failed one).
    GiveUp(&'a std::cell::Cell<bool>),
}

/// Writes a request (after the ids the worker may free), waits for its reply (polling for `spin` first),
/// serving the callbacks that come first, and reads it. A dead worker is an error; one still running at `hard`
/// is killed or left be (`overrun`).
fn exchange<R>(
    process: &Process,
    lane: &mut Lane,
    (hard, overrun, spin): (Instant, Overrun<'_>, Duration),
    write: impl FnOnce(&mut Writer<Lane>),
    read: impl FnOnce(&mut Reader) -> Result<R>,
) -> Result<R> {
    write_request(process, lane, write)?;
    lane.pass(lane::REQUEST).map_err(|_| process.exit_error())?;
    let mut from = lane::REQUEST;
    // A callback the kill switch stopped: the run's own error then (as in this process, where the nested run
    // stops the caller's run with it).
    let mut stopped = None;
    loop {
        match lane.wait(from, spin, Some(hard)) {
            Some(lane::REPLY) => break,
            Some(lane::CALLBACK) => {
                if let Some(e) = super::callbacks::serve(lane)? {
                    stopped = Some(e);
                }
                lane.pass(lane::CALLBACK_REPLY).map_err(|_| process.exit_error())?;
                from = lane::CALLBACK_REPLY;
            }
            Some(lane::DEAD) => return Err(process.exit_error()),
            Some(_) => return Err(lane::broken()),
            None => {
                if let Overrun::GiveUp(late) = overrun {
                    late.set(true);
                    return Err(Error::Unavailable("the backend worker did not answer in time".into()));
                }
                // Past the kill switch and its grace: the worker is stuck in the backend. Killing it fails
                // every request it holds (this one too, once its exit is seen).
                process.kill();
                return match lane.wait(from, Duration::ZERO, Some(Instant::now() + GRACE)) {
                    Some(lane::DEAD) | None => Err(killed_at_kill_switch()),
                    Some(_) => Err(process.exit_error()),
                };
            }
        }
    }
    let (map, len) = lane.message()?;
    let mut r = Reader::new(&map.data()[..len]);
    if let (Some(wire::STOPPED), Overrun::GiveUp(late)) = (r.peek(), overrun) {
        late.set(true);
        return Err(Error::Unavailable("the run was stopped at its deadline in the backend worker".into()));
    }
    match (r.status(), stopped) {
        (Err(_), Some(e)) => Err(e),
        (Err(e), None) => Err(e),
        (Ok(()), _) => read(&mut r),
    }
}

/// How long INFO waits for a worker's figures (on Redis's main thread).
const INFO_LIMIT: Duration = Duration::from_millis(100);

/// What a running worker's backend adds to INFO: `(section, field, value)`.
pub fn worker_info(process: &Process) -> Result<Vec<(String, String, u64)>> {
    let mut lane = process.lane()?;
    let fields = exchange(
        process,
        &mut lane,
        (Instant::now() + INFO_LIMIT, Overrun::GiveUp(&std::cell::Cell::new(false)), SPIN),
        |w| {
            w.u8(wire::INFO);
        },
        |r| {
            (0..r.count()?)
                .map(|_| {
                    Ok((
                        String::from_utf8_lossy(r.bytes()?).into_owned(),
                        String::from_utf8_lossy(r.bytes()?).into_owned(),
                        r.u64()?,
                    ))
                })
                .collect()
        },
    );
    process.give(lane);
    fields
}

/// Builds a model in its worker (so that MODELSTORE reports the backend's error, as RedisAI does).
pub fn load_model(kind: BackendKind, blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    let opts = LoadOptions {
        device: opts.device.clone(),
        intra_op_threads: opts.intra_op_threads,
        inter_op_threads: opts.inter_op_threads,
        inputs: opts.inputs.clone(),
        outputs: opts.outputs.clone(),
    };
    let remote = Remote::new(kind, opts.device.clone(), Source::Model { kind, blob, opts });
    let process = remote.slot.process()?;
    let mut lane = process.lane()?;
    let names = exchange(
        &process,
        &mut lane,
        (Instant::now() + LOAD_LIMIT, Overrun::Kill, SPIN),
        |w| remote.write_load(w),
        |r| Ok((r.strings()?, r.strings()?)),
    );
    process.give(lane);
    let (inputs, outputs) = names?;
    process.loaded.lock().insert(remote.id);
    Ok(Box::new(RemoteModel { remote, inputs, outputs, last_run_us: AtomicU64::new(0) }))
}

/// Compiles a script in its worker.
pub fn load_script(spec: &ScriptSpec, device: &Device) -> Result<Box<dyn LoadedScript>> {
    let source = Source::Script { source: spec.source.clone(), entry_points: spec.entry_points.clone() };
    let remote = Remote::new(BackendKind::Torch, device.clone(), source);
    remote.call((LOAD_LIMIT, Instant::now(), SPIN), |w| remote.write_load(w), |_| Ok(()))?;
    Ok(Box::new(RemoteScript { remote }))
}

struct RemoteModel {
    remote: Remote,
    inputs: Vec<String>,
    outputs: Vec<String>,
    /// How long its last run took in the worker (µs): how long a thread waiting for its next run polls
    /// (`lane::spin_after`).
    last_run_us: AtomicU64,
}

impl RemoteModel {
    fn spin(&self) -> Duration {
        lane::spin_after(self.last_run_us.load(Ordering::Relaxed), SPIN)
    }

    fn ran(&self, report: Result<RunReport>) -> Result<RunReport> {
        if let Ok(RunReport { run_us: Some(us), .. }) = &report {
            self.last_run_us.store(*us, Ordering::Relaxed);
        }
        report
    }
}

/// A model run's request: its tensors, then its time (`left`: what was left of it when the request was made);
/// `within`: stopped at the deadline, it answers STOPPED (it may run again on a queue) instead of an error.
fn write_run(w: &mut Writer<Lane>, id: u64, req: &RunRequest, left: Duration, within: bool) {
    w.u8(wire::RUN_MODEL).u64(id).u8(within as u8).caller(req.caller).tensors(req.inputs).deadline(req.limit(), left);
}

impl LoadedModel for RemoteModel {
    fn inputs(&self) -> &[String] {
        &self.inputs
    }
    fn outputs(&self) -> &[String] {
        &self.outputs
    }
    fn run(&self, req: &RunRequest) -> Result<Outputs> {
        self.execute(req).map(|r| r.outputs)
    }
    fn execute(&self, req: &RunRequest) -> Result<RunReport> {
        // The model's callbacks are served on this thread, for the request's caller.
        let _caller = crate::caller::Scope::new(req.caller);
        let left = req.deadline.saturating_duration_since(Instant::now());
        let report = self.remote.call(
            (req.limit(), req.deadline, self.spin()),
            |w| write_run(w, self.remote.id, req, left, false),
            read_run,
        );
        self.ran(report)
    }

    /// ONNX models run inline on Redis's main thread as in this process (exec/inline.rs), the main thread
    /// polling the worker's answer: no queue, no worker thread of Redis's, no wake-up.
    fn stops_early(&self) -> bool {
        matches!(self.remote.source, Source::Model { kind: BackendKind::Onnx, .. })
    }

    /// The run, if the worker answers by the deadline; `None` (queue it) when it does not, or when the worker
    /// would first have to start or load the model (nothing on the main thread waits for that).
    fn execute_within(&self, req: &RunRequest) -> Option<Result<RunReport>> {
        let process = self.remote.loaded_process()?;
        let mut lane = process.lane().ok()?;
        let left = req.deadline.saturating_duration_since(Instant::now());
        let late = std::cell::Cell::new(false);
        let result = exchange(
            &process,
            &mut lane,
            (req.deadline, Overrun::GiveUp(&late), SPIN),
            |w| write_run(w, self.remote.id, req, left, true),
            read_run,
        );
        process.give(lane);
        if late.get() {
            return None;
        }
        Some(result)
    }

    /// Every backend but TORCH, whose models may call back into Redis (the posted lanes' thread serves no
    /// callbacks).
    fn posts(&self) -> bool {
        matches!(self.remote.source, Source::Model { kind, .. } if kind != BackendKind::Torch)
    }

    /// As `execute_within` or `execute`, on a posted lane (post.rs); a model the worker has not loaded is not
    /// posted.
    fn post(&self, req: &RunRequest, within: bool, done: PostDone) {
        let Some(process) = self.remote.loaded_process() else { return done(Posted::NotPosted) };
        let left = req.deadline.saturating_duration_since(Instant::now());
        // Within: it answers STOPPED at the deadline, which the worker counts from when it reads the request, so
        // a run waiting behind others there is given the limit again (and longer while the worker answers others:
        // post.rs, `Late`) before it is run elsewhere. Else it runs to the end, as on a queue, or overruns its kill
        // switch: then the worker is killed, as then.
        let late = match within {
            true => (Late::GiveUp(req.deadline + req.limit()), req.limit()),
            false => (Late::Kill(req.deadline + req.limit() + GRACE), req.limit() + GRACE),
        };
        super::post::post(&process, late, |w| write_run(w, self.remote.id, req, left, within), done);
    }
}

struct RemoteScript {
    remote: Remote,
}

impl LoadedScript for RemoteScript {
    fn run(&self, req: &ScriptRequest) -> Result<Vec<Tensor>> {
        self.execute(req).map(|r| r.outputs)
    }
    fn execute(&self, req: &ScriptRequest) -> Result<ScriptReport> {
        // The script's callbacks are served on this thread, for the request's caller.
        let _caller = crate::caller::Scope::new(req.caller);
        let limit = crate::config::CONFIG.read().execution_limit();
        let left = req.deadline.saturating_duration_since(Instant::now());
        let (copy_us, _, outputs) = self.remote.call(
            (limit, req.deadline, SPIN),
            |w| {
                w.u8(wire::RUN_SCRIPT)
                    .u64(self.remote.id)
                    .bytes(req.function)
                    .style(req.style)
                    .tensors(req.tensors)
                    .strings(req.keys)
                    .strings(req.args)
                    .caller(req.caller)
                    .deadline(limit, left);
            },
            read_outputs,
        )?;
        Ok(ScriptReport { outputs, copy_us })
    }
}
