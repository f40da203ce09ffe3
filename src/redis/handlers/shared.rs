//! What model, script and DAG commands share: building off the main thread and storing on it, running a plan
//! (inline when it is short, else on the workers), and the reply of a single-op run (MODELEXECUTE,
//! SCRIPTEXECUTE and their deprecated forms).

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::persist::{replicate_argv, write_outputs};
use super::Cmd;
use crate::commands::tensor::Word;
use crate::config::CONFIG;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::exec::dag::{OpKind, Plan, Slots};
use crate::exec::run::{OpOutcome, Run};
use crate::exec::{inline, queues};
use crate::redis::blocking::Blocked;
use crate::redis::ctx::Ctx;
use crate::redis::latency;
use crate::redis::reply::{error, send};
use crate::redis::strings::{can_pin, OwnedStrings, PinnedArgs};
use crate::redis::types::TENSOR_TYPE;
use crate::reply::Reply;

/// Stores a built value under the key (on the main thread): the caller's checks, then the command is
/// replicated as the client sent it.
pub type Commit<V> = fn(Ctx<'_>, &[u8], V) -> Result<()>;

/// Runs `build` (given the key and the command's arguments) on a background thread while only this client
/// waits, then `commit`s on the main thread. Inside MULTI or Lua nothing may block, and a replica is not
/// blocked on its primary's stream (nor the AOF loader): there it is built inline, as RedisAI always did.
pub fn store_in_background<V: Send + 'static>(
    c: &Cmd,
    what: &'static str,
    build: impl FnOnce(&[u8], &[&[u8]]) -> Result<V> + Send + 'static,
    commit: Commit<V>,
) -> Result<()> {
    let key = c.args[1].to_vec();
    if Blocked::check_can_block(c.ctx).is_err() || Blocked::from_replication(c.ctx) || !can_pin() {
        finish_store(c.ctx, &key, build(&key, &c.args), commit, OwnedStrings::retain(c.raw));
        return Ok(());
    }
    // The build reads the arguments through `args` only: pinning may move their bytes under `c.args`.
    let args = PinnedArgs::pin(c.raw)
        .map_err(|_| Error::Internal(format!("cannot keep the {what}'s arguments for its build")))?;
    let blocked = Blocked::new(c.ctx)?;
    let job = move || {
        let built = catch_unwind(AssertUnwindSafe(|| build(&key, &args.slices())))
            .unwrap_or_else(|_| Err(Error::Internal(format!("internal error while building the {what}"))));
        let argv = args.into_strings();
        blocked.complete(move |ctx| finish_store(ctx, &key, built, commit, argv));
    };
    std::thread::Builder::new()
        .name(format!("ai:{what}store"))
        .spawn(job)
        .map(drop)
        .map_err(|e| Error::Internal(format!("cannot start a {what} build: {e}")))
}

fn finish_store<V>(ctx: Ctx<'_>, key: &[u8], built: Result<V>, commit: Commit<V>, mut argv: OwnedStrings) {
    match built.and_then(|v| commit(ctx, key, v)).and_then(|_| replicate_argv(ctx, &mut argv)) {
        Ok(()) => send(ctx, &Reply::OK),
        Err(e) => error(ctx, &e.reply_text()),
    }
}

/// RedisAI creates a device's queue (and its workers) when a model or script is stored for it.
pub fn ensure_queue(device: &str) -> Result<()> {
    crate::exec::queue_of(device).map(drop)
}

/// A single-op plan's slots: each input key's tensor loaded, each output a fresh slot persisted to its key.
pub fn bind_keys(c: &Cmd, plan: &mut Plan, inputs: &[&[u8]], outputs: &[&[u8]]) -> Result<(Slots, Slots)> {
    let mut ins = Slots::new();
    for key in inputs {
        let t = c.open_key(key, false).get_arc(&TENSOR_TYPE)?.ok_or(Error::TensorKeyEmpty)?;
        let s = plan.new_slot();
        plan.loaded.push((s, t));
        ins.push(s);
    }
    let outs: Slots = outputs.iter().map(|_| plan.new_slot()).collect();
    plan.persist = outputs.iter().map(|k| Word::from_slice(k)).zip(outs.iter().copied()).collect();
    Ok((ins, outs))
}

/// Runs the plan and answers with `reply`: inline on the main thread when the plan is known to be short
/// (exec/inline.rs), posted to its worker process when it runs in one (isolation/post.rs), else on the workers
/// while the client is blocked.
pub fn run_plan(c: &Cmd, mut plan: Plan, reply: fn(Ctx<'_>, &Run)) -> Result<()> {
    let event = latency::event_of(c.args[0]);
    let post = Run::posts(&plan) && Blocked::check_can_block(c.ctx).is_ok() && !Blocked::from_replication(c.ctx);
    match skip_queue(&plan, post) {
        // Posted: the main thread goes on. A run not known to be short is posted only while no other posted run
        // is in flight (one client's runs, say); under load it takes the queue, whose threads run in parallel.
        Some(limit) if post && (limit.is_some() || !crate::isolation::posted_in_flight()) => {
            let blocked = Blocked::new(c.ctx)?;
            Run::post_inline(plan, limit, move |ran| match ran {
                Ok(run) => {
                    inline::count(true);
                    blocked.complete(move |ctx| {
                        reply(ctx, &run);
                        latency::record(ctx, event, run.age());
                    })
                }
                // Stopped at the limit, or not posted: it runs on the workers as if it had not started. A queue
                // that cannot take it drops `blocked`, which answers the client with an error.
                Err(plan) => {
                    let _ = queue(*plan, blocked, reply, event);
                }
            });
            return Ok(());
        }
        Some(Some(limit)) => match Run::run_inline(plan, limit) {
            Ok(run) => {
                inline::count(true);
                reply(c.ctx, &run);
                latency::record(c.ctx, event, run.age());
                return Ok(());
            }
            // Stopped at the limit: it runs on the workers as if it had not started.
            Err(p) => plan = *p,
        },
        _ => {}
    }
    queue(plan, Blocked::new(c.ctx)?, reply, event)
}

/// Runs the plan on the workers; `blocked` is answered once it is done.
fn queue(plan: Plan, blocked: Blocked, reply: fn(Ctx<'_>, &Run), event: &'static std::ffi::CStr) -> Result<()> {
    inline::count(false);
    Run::submit(plan, queues(), move |run| {
        blocked.complete(move |ctx| {
            reply(ctx, &run);
            latency::record(ctx, event, run.age());
        })
    })
}

/// Whether the plan may skip its queue (`None`: not): every op runs a model that can be stopped early, on a CPU
/// queue with nothing queued, without batching, and INLINE_THRESHOLD is not 0. A posted run (the main thread does
/// not wait for it) may skip a queue that has work: its worker runs it on a thread of its own, and with 50
/// clients a queue that took one run (given up on while the machine's cores were busy) never emptied again,
/// hundreds of runs queued behind it. Then how long it may run inline: `Some` when the models' recent runs are short
/// (exec/inline.rs).
fn skip_queue(plan: &Plan, posted: bool) -> Option<Option<std::time::Duration>> {
    let threshold = CONFIG.read().inline_threshold_us;
    if threshold == 0 {
        return None;
    }
    let mut ops: smallvec::SmallVec<[_; 4]> = smallvec::SmallVec::new();
    for op in &plan.ops {
        let OpKind::Model { model, inputs, .. } = &op.kind else { return None };
        let eligible = model.spec.batch.size == 0
            && model.spec.device.kind == DeviceKind::Cpu
            && model.built().is_some_and(|m| m.is_ok_and(|m| posted || m.stops_early()))
            && (posted || crate::exec::model_queue(model).is_ok_and(|q| q.is_idle()));
        if !eligible {
            return None;
        }
        // Inputs loaded before the run have a known size; the others are checked as their op starts.
        let known: Option<u64> =
            inputs.iter().map(|s| plan.loaded.iter().find(|(l, _)| l == s).map(|(_, t)| t.data().len() as u64)).sum();
        ops.push((&model.history, known));
    }
    Some(inline::may_run_inline(ops, threshold).then(|| inline::inline_limit(threshold)))
}

/// `OK` after storing the outputs, `TIMEDOUT`, or the op's error.
pub fn reply_single_op(ctx: Ctx<'_>, run: &Run) {
    if run.timed_out() {
        return send(ctx, &Reply::Simple("TIMEDOUT"));
    }
    let result = match run.outcome(0) {
        OpOutcome::Failed(e) => Err(e),
        OpOutcome::NotRun => Err(Error::Internal("the operation did not run".into())),
        OpOutcome::Done => run
            .plan
            .persist
            .iter()
            .map(|(k, s)| {
                run.slot(*s).map(|t| (k.as_slice(), t)).ok_or_else(|| Error::Internal("missing output".into()))
            })
            .collect::<Result<smallvec::SmallVec<[_; 2]>>>()
            .and_then(|outs| write_outputs(ctx, &outs)),
    };
    match result {
        Ok(()) => send(ctx, &Reply::OK),
        Err(e) => error(ctx, &e.reply_text()),
    }
}

/// Whom the run acts for: the client's database and, when it runs TorchScript (whose callbacks reach Redis),
/// the client's ACL user. Call it once the plan's ops are known.
pub fn set_caller(c: &Cmd, plan: &mut crate::exec::dag::Plan, read_only: bool) {
    let user = if plan.runs_torchscript() { crate::redis::acl::current_user(c.ctx) } else { None };
    plan.caller = crate::caller::Caller { db: c.db(), user, read_only };
}
