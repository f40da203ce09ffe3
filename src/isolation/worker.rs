//! The worker process (`redisai-worker`): loads one backend library, confines itself (sandbox.rs), then serves
//! lanes: each lane Redis hands over (a memfd through the channel, its stdin) gets a thread that loads models
//! and scripts and runs them as the lane's messages ask (protocol.rs), and passes a script's callbacks back to
//! Redis on the same lane.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use super::lane::{self, Lane};
use super::sandbox::Policy;
use super::wire::{self, Reader, Writer};
use crate::backends::{self, LoadOptions, LoadedModel, LoadedScript, RunRequest, ScriptRequest};
use crate::caller::Caller;
use crate::config::{Config, CONFIG};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::script_spec::ScriptSpec;
use crate::tensor::Tensor;

/// The environment variable through which Redis tells a worker its device queue (`CPU`, `GPU:0`, …).
pub const DEVICE_VARIABLE: &str = "REDISAI_WORKER_DEVICE";

/// How long a lane's thread polls for the next request before it sleeps: requests that follow each other
/// within it cost no system call.
const SPIN: Duration = Duration::from_micros(200);

/// How much of the posted thread's run time (µs) an answer waits behind before the thread tells Redis (the
/// eventfd): Redis then replies to the first runs of a burst while the rest still run, instead of the whole
/// burst moving as one wave (TF fraud at 16 clients: 0.85-0.90 of in-process -> 0.99-1.13). Tiny runs are told
/// of in groups: an eventfd write for each cost the worker more CPU than the run (docs/benchmarks.md).
const SIGNAL_AFTER_US: u64 = 10;

static MODELS: parking_lot::RwLock<Option<HashMap<u64, Arc<dyn LoadedModel>>>> = parking_lot::RwLock::new(None);
static SCRIPTS: parking_lot::RwLock<Option<HashMap<u64, Arc<dyn LoadedScript>>>> = parking_lot::RwLock::new(None);

/// `redisai-worker <parent pid> <backend> <memory bound> <module dir> [KEY VALUE ...]` (the load-time arguments
/// that say where the backend library is), or `redisai-worker --sandbox-test`.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--sandbox-test") {
        let policy = if args.get(1).map(String::as_str) == Some("gpu") { Policy::Gpu } else { Policy::Cpu };
        return if super::self_test::run(policy) { 0 } else { 1 };
    }
    match start(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("redisai-worker: {e}");
            1
        }
    }
}

fn start(args: &[String]) -> Result<()> {
    let bad = || {
        Error::Internal(
            "usage: redisai-worker <parent pid> <backend> <memory bound> <module dir> [KEY VALUE ...]".into(),
        )
    };
    let [parent, backend, bound, module_dir, rest @ ..] = args else { return Err(bad()) };
    super::sandbox::detach(parent.parse().map_err(|_| bad())?)?;
    let kind = crate::backend_kind::BackendKind::parse(backend.as_bytes())?;
    super::refused::set_label(kind.name(), std::env::var_os(super::refused::LOG_VARIABLE).is_some());
    let bound: u64 = bound.parse().map_err(|_| bad())?;
    let pairs: Vec<&[u8]> = rest.iter().map(|s| s.as_bytes()).collect();
    let mut config = Config::from_args(&pairs)?;
    config.default_memory_bound = bound;
    config.backend_memory_limit_mb = 0;
    config.module_dir = (!module_dir.is_empty()).then(|| module_dir.clone());
    *CONFIG.write() = config;
    *MODELS.write() = Some(HashMap::new());
    *SCRIPTS.write() = Some(HashMap::new());
    #[cfg(feature = "torch")]
    if kind == crate::backend_kind::BackendKind::Torch {
        backends::torch::set_host(crate::backends::torch_host::host_api::<WorkerHost>());
    }
    // The device queue this worker serves (Redis passes it): a GPU's gets the GPU policy (sandbox.rs).
    let policy = Policy::for_device(&std::env::var(DEVICE_VARIABLE).unwrap_or_default());
    // The library is opened (reading files) before the filter goes in, a GPU worker's after its files are
    // restricted; a load error is the hello's answer.
    let loaded =
        super::sandbox::restrict_files(policy).and_then(|()| backends::open_library(kind)).and_then(|version| {
            super::sandbox::confine(bound, policy)?;
            Ok(version)
        });
    // SAFETY: stdin is the channel Redis gave this process; it is owned here from now on.
    let channel = unsafe { OwnedFd::from_raw_fd(0) };
    let mut hello = Vec::new();
    match &loaded {
        Ok(version) => Writer(&mut hello).u8(0).bytes(version.as_bytes()),
        Err(e) => Writer(&mut hello).u8(1).error(e),
    };
    super::channel::send(&channel, &hello, None)?;
    loaded?;
    // Each message on the channel brings a lane (`L`: a thread of its own; `P`: the posted lanes' thread), or
    // what the posted lanes' thread needs (`B`: its bell, `E`: the eventfd that tells Redis it has answered).
    // The channel's end (Redis closed it) ends the worker.
    let mut bell = None;
    let mut posted: Option<crossbeam_channel::Sender<Lane>> = None;
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(drop)
            .map_err(|e| Error::Internal(format!("backend worker: thread: {e}")))
    };
    while let Some((tag, fd)) = super::channel::receive_fd(&channel)? {
        match tag {
            b'B' => bell = Some(Arc::new(lane::Bell::open(fd)?)),
            b'E' => {
                let bell = bell.clone().ok_or_else(|| Error::Internal("backend worker: no bell".into()))?;
                let (tx, rx) = crossbeam_channel::unbounded();
                posted = Some(tx);
                spawn("ai:posted", Box::new(move || serve_posted(&bell, &fd, &rx)))?;
            }
            b'P' => {
                let (Some(tx), Some(bell)) = (&posted, &bell) else {
                    return Err(Error::Internal("backend worker: a posted lane before its thread".into()));
                };
                let _ = tx.send(Lane::open(fd)?);
                // Its request may be passed already, and the bell rung before the thread had the lane.
                bell.ring();
            }
            _ => {
                let lane = Lane::open(fd)?;
                spawn("ai:lane", Box::new(move || serve(lane)))?;
            }
        }
    }
    Ok(())
}

/// The posted lanes' thread: serves each lane that holds a request, tells Redis's main thread (eventfd) once it
/// has answered `SIGNAL_AFTER_US` of runs or all it found, and sleeps on the bell when no lane holds one. One
/// thread for all of them: posted runs are short (they would otherwise run on Redis's main thread), and threads
/// polling for them would take the cores the runs need.
fn serve_posted(bell: &lane::Bell, notify: &OwnedFd, new: &crossbeam_channel::Receiver<Lane>) {
    let mut lanes: Vec<Lane> = Vec::new();
    let mut burst = 0usize;
    loop {
        let seen = bell.seen();
        lanes.extend(new.try_iter());
        let (mut answered, mut unsignaled_us) = (0, 0);
        lanes.retain_mut(|lane| match lane.state() {
            lane::REQUEST => {
                answered += 1;
                let alive = answer(lane);
                unsignaled_us += LAST_RUN_US.get().max(1);
                if unsignaled_us >= SIGNAL_AFTER_US {
                    super::notifier::signal(notify);
                    unsignaled_us = 0;
                }
                alive
            }
            lane::DEAD => false,
            _ => true,
        });
        if answered > 0 {
            burst += answered;
            if unsignaled_us > 0 {
                super::notifier::signal(notify);
            }
            continue;
        }
        // Polls for the next request only after a lone run (one client's, say), whose next request comes soon. A
        // burst means many clients: the main thread rings once it has posted the next burst (post.rs), and a
        // thread polling meanwhile takes the core that the main thread and the clients need.
        let spin = if burst <= 1 { lane::spin_after(LAST_RUN_US.get(), SPIN) } else { Duration::ZERO };
        burst = 0;
        bell.wait(seen, spin);
    }
}

thread_local! {
    /// How long this thread's last run took (µs).
    static LAST_RUN_US: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// One lane's thread: a request, its reply, until the lane dies.
fn serve(mut lane: Lane) {
    let mut from = lane::IDLE;
    loop {
        match lane.wait(from, lane::spin_after(LAST_RUN_US.get(), SPIN), None) {
            Some(lane::REQUEST) => {}
            _ => return,
        }
        if !answer(&mut lane) {
            return;
        }
        from = lane::REPLY;
    }
}

/// Handles the request the lane holds and passes the turn back with its reply; false once the lane is dead.
fn answer(lane: &mut Lane) -> bool {
    let reply = handle(lane);
    let mut sent = lane.start();
    if sent.is_ok() {
        match reply {
            Ok(Reply::Write(write)) => {
                Writer(&mut *lane).u8(0);
                write(lane);
            }
            Ok(Reply::Stopped) => {
                Writer(&mut *lane).u8(wire::STOPPED);
            }
            Err(e) => {
                Writer(&mut *lane).u8(1).error(&e);
            }
        }
        sent = lane.written();
    }
    if let Err(e) = sent {
        let _ = lane.start();
        Writer(&mut *lane).u8(1).error(&e);
    }
    lane.pass(lane::REPLY).is_ok()
}

/// A request's answer: what to write after the OK status, or that the run stopped at its deadline.
enum Reply {
    Write(Box<dyn FnOnce(&mut Lane)>),
    Stopped,
}

fn handle(lane: &mut Lane) -> Result<Reply> {
    let (map, len) = lane.message()?;
    let mut r = Reader::new(&map.data()[..len]);
    for _ in 0..r.count()? {
        let id = r.u64()?;
        MODELS.write().as_mut().map(|m| m.remove(&id));
        SCRIPTS.write().as_mut().map(|m| m.remove(&id));
    }
    match r.u8()? {
        wire::LOAD_MODEL => {
            let id = r.u64()?;
            let kind = wire::backend_from(r.u8()?)?;
            let device = Device::parse(r.bytes()?)?;
            let (intra, inter) = (r.u32()? as usize, r.u32()? as usize);
            let (inputs, outputs) = (r.strings()?, r.strings()?);
            let blob = Arc::new(r.bytes()?.to_vec());
            drop(map);
            let opts = LoadOptions { device, intra_op_threads: intra, inter_op_threads: inter, inputs, outputs };
            let model: Arc<dyn LoadedModel> = Arc::from(backends::load_model(kind, blob, &opts)?);
            let (ins, outs) = (model.inputs().to_vec(), model.outputs().to_vec());
            MODELS.write().as_mut().map(|m| m.insert(id, model));
            Ok(Reply::Write(Box::new(move |lane| {
                Writer(lane).strings(&ins).strings(&outs);
            })))
        }
        wire::LOAD_SCRIPT => {
            let id = r.u64()?;
            let device = Device::parse(r.bytes()?)?;
            let source = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| Error::Internal("script source".into()))?;
            let entry_points = r.strings()?;
            drop(map);
            let spec = ScriptSpec { device_name: device.name.clone(), tag: Vec::new(), source, entry_points };
            let script: Arc<dyn LoadedScript> = Arc::from(backends::load_script(&spec, &device)?);
            SCRIPTS.write().as_mut().map(|m| m.insert(id, script));
            Ok(Reply::Write(Box::new(|_| {})))
        }
        wire::RUN_MODEL => {
            let id = r.u64()?;
            let within = r.u8()? != 0;
            let caller = r.caller()?;
            let inputs = r.tensors()?;
            let (start, deadline) = r.deadline(std::time::Instant::now())?;
            drop(map);
            let model = MODELS.read().as_ref().and_then(|m| m.get(&id).cloned()).ok_or_else(not_loaded)?;
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let req = RunRequest { inputs: &refs, caller: &caller, start, deadline };
            run_answer(lane, || {
                let report = if within { model.execute_within(&req)? } else { model.execute(&req) };
                Some(report.map(|r| (r.copy_us, r.outputs)))
            })
        }
        wire::RUN_SCRIPT => {
            let id = r.u64()?;
            let function = r.bytes()?.to_vec();
            let style = r.style()?;
            let tensors = r.tensors()?;
            let (keys, args) = (r.byte_strings()?, r.byte_strings()?);
            let caller: Caller = r.caller()?;
            let (_, deadline) = r.deadline(std::time::Instant::now())?;
            drop(map);
            let script = SCRIPTS.read().as_ref().and_then(|m| m.get(&id).cloned()).ok_or_else(not_loaded)?;
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let req = ScriptRequest {
                function: &function,
                style,
                tensors: &refs,
                keys: &keys,
                args: &args,
                caller: &caller,
                deadline,
            };
            run_answer(lane, || Some(script.execute(&req).map(|r| (r.copy_us, r.outputs))))
        }
        wire::INFO => {
            drop(map);
            let mut fields: Vec<_> = backends::BACKENDS.iter().flat_map(|b| (b.info)()).collect();
            fields.extend(super::refused::info_fields());
            Ok(Reply::Write(Box::new(move |lane| {
                Writer(lane).list(&fields, |w, (section, field, value)| {
                    w.bytes(section.as_bytes()).bytes(field.as_bytes()).u64(*value);
                });
            })))
        }
        _ => Err(Error::Internal("backend worker: unknown request".into())),
    }
}

fn not_loaded() -> Error {
    Error::Internal("backend worker: the model is not loaded here".into())
}

thread_local! {
    /// The lane of the request this thread runs: where its script's callbacks go.
    static LANE: std::cell::Cell<*mut Lane> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// A model's or script's run on this lane (`None`: it stopped at its deadline) and its answer: the copy time, the
/// run's time (which also sets how long this thread then polls: `LAST_RUN_US`) and the outputs.
fn run_answer<O: std::ops::Deref<Target = [Tensor]> + 'static>(
    lane: &mut Lane,
    run: impl FnOnce() -> Option<Result<(u64, O)>>,
) -> Result<Reply> {
    let began = std::time::Instant::now();
    let Some(ran) = with_lane(lane, run) else { return Ok(Reply::Stopped) };
    let (copy_us, outputs) = ran?;
    let run_us = began.elapsed().as_micros() as u64;
    LAST_RUN_US.set(run_us);
    Ok(Reply::Write(Box::new(move |lane| {
        let outs: Vec<&Tensor> = outputs.iter().collect();
        Writer(lane).u64(copy_us).u64(run_us).tensors(&outs);
    })))
}

/// Runs `f` with `lane` as the thread's callback lane.
fn with_lane<R>(lane: &mut Lane, f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            LANE.with(|l| l.set(std::ptr::null_mut()));
        }
    }
    LANE.with(|l| l.set(lane as *mut Lane));
    let _reset = Reset;
    f()
}

/// Sends a callback on this thread's lane and waits for Redis's answer; `read` decodes it.
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
fn callback<R>(write: impl FnOnce(&mut Writer<Lane>), read: impl FnOnce(&mut Reader) -> Result<R>) -> Result<R> {
    let lane = LANE.with(|l| l.get());
    if lane.is_null() {
        return Err(Error::Internal("a callback outside a request".into()));
    }
    // SAFETY: the pointer was set by `with_lane` on this thread for the duration of the request that is running
    // this callback; nothing else uses the lane meanwhile (the request's reader dropped its mapping).
    let lane = unsafe { &mut *lane };
    lane.start()?;
    write(&mut Writer(lane));
    lane.written()?;
    lane.pass(lane::CALLBACK)?;
    match lane.wait(lane::CALLBACK, SPIN, None) {
        Some(lane::CALLBACK_REPLY) => {}
        _ => return Err(lane::dead()),
    }
    let (map, len) = lane.message()?;
    let mut r = Reader::new(&map.data()[..len]);
    read(&mut r)
}

/// The TORCH backend's callbacks (`redis.execute`, `redisAI.model_execute`) in a worker: each goes to Redis on
/// the request's lane, where the thread waiting for the run makes the call for the request's caller.
#[cfg(feature = "torch")]
struct WorkerHost;

#[cfg(feature = "torch")]
impl crate::backends::torch_host::Host for WorkerHost {
    fn execute(words: &[&[u8]]) -> Vec<u8> {
        callback(
            |w| {
                w.u8(wire::CALL_REDIS).strings(words);
            },
            |r| {
                r.status()?;
                Ok(r.bytes()?.to_vec())
            },
        )
        .unwrap_or_else(|e| format!("-{}\r\n", e.reply_text()).into_bytes())
    }

    fn model_execute(key: &[u8], inputs: Vec<Tensor>, noutputs: usize) -> Result<Vec<Tensor>> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        callback(
            |w| {
                w.u8(wire::CALL_MODEL).bytes(key).tensors(&refs).u64(noutputs as u64);
            },
            |r| {
                r.status()?;
                r.tensors()
            },
        )
    }
}
