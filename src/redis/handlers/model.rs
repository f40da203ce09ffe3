//! AI.MODELSTORE / MODELSET / MODELGET / MODELDEL / MODELEXECUTE / MODELRUN.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::raw;

use super::persist::{replicate_argv, write_outputs};
use super::Cmd;
use crate::commands::model::{
    modelget_reply, parse_modelexecute, parse_modelrun, parse_modelset, parse_modelstore, ExecuteArgs,
};
use crate::config::CONFIG;
use crate::error::{Error, Result};
use crate::exec::dag::{Op, OpKind, Plan};
use crate::exec::queues;
use crate::exec::run::{OpOutcome, Run};
use crate::model::{Model, ModelSpec};
use crate::redis::blocking::Blocked;
use crate::redis::keyspace::Key;
use crate::redis::model_type::{ModelValue, MODEL_TYPE};
use crate::redis::reply::{error, send};
use crate::redis::strings::OwnedStrings;
use crate::redis::types::{TensorValue, TENSOR_TYPE};
use crate::reply::Reply;
use crate::stats;

pub fn modelstore(c: &Cmd) -> Result<()> {
    store(c, parse_modelstore(&c.args)?)
}

pub fn modelset(c: &Cmd) -> Result<()> {
    store(c, parse_modelset(&c.args)?)
}

/// Builds the model on a background thread (Redis keeps serving), then stores it on the main thread.
fn store(c: &Cmd, spec: ModelSpec) -> Result<()> {
    let key = c.args[1].to_vec();
    let argv = OwnedStrings::retain(c.raw);
    if Blocked::check_can_block(c.ctx).is_err() {
        // Inside MULTI or Lua nothing may block: build here, as RedisAI always did.
        finish_store(c.ctx, &key, Model::build(&key, spec), argv);
        return Ok(());
    }
    let blocked = Blocked::new(c.ctx)?;
    let job = move || {
        let built = catch_unwind(AssertUnwindSafe(|| Model::build(&key, spec)))
            .unwrap_or_else(|_| Err(Error::Generic("internal error while building the model".into())));
        blocked.complete(move |ctx| finish_store(ctx, &key, built, argv));
    };
    std::thread::Builder::new()
        .name("ai:modelstore".into())
        .spawn(job)
        .map(drop)
        .map_err(|e| Error::Generic(format!("cannot start a model build: {e}")))
}

fn finish_store(ctx: *mut raw::RedisModuleCtx, key: &[u8], built: Result<Model>, mut argv: OwnedStrings) {
    let result = built.and_then(|model| {
        // RedisAI creates the device's queue (and its workers) when a model is stored.
        queues()
            .get(&model.spec.device.queue_key())
            .map_err(|_| Error::Generic("Could not initialize queue on requested device".into()))?;
        let k = Key::open_name(ctx, key, true);
        k.check_type(&MODEL_TYPE)?;
        let model = Arc::new(model);
        let s = model.stats.clone();
        k.set::<ModelValue>(&MODEL_TYPE, model)?;
        stats::publish(&s);
        replicate_argv(ctx, &mut argv)
    });
    match result {
        Ok(()) => send(ctx, &Reply::OK),
        Err(e) => error(ctx, &e.reply_text()),
    }
}

pub fn modelget(c: &Cmd) -> Result<()> {
    if !(2..=4).contains(&c.args.len()) {
        return Err(Error::WrongArity("AI.MODELGET"));
    }
    let k = Key::open(c.ctx, c.raw[1], false);
    let m = k.get::<ModelValue>(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?;
    let chunk = CONFIG.read().model_chunk_size;
    c.reply(&modelget_reply(&m.spec, &m.spec.inputs, &m.spec.outputs, &c.args[2..], chunk));
    Ok(())
}

pub fn modeldel(c: &Cmd) -> Result<()> {
    if c.args.len() != 2 {
        return Err(Error::WrongArity("AI.MODELDEL"));
    }
    let k = Key::open(c.ctx, c.raw[1], true);
    k.get::<ModelValue>(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?;
    k.delete();
    c.replicate_verbatim();
    c.reply(&Reply::OK);
    Ok(())
}

pub fn modelexecute(c: &Cmd) -> Result<()> {
    if c.args.len() < 8 {
        return Err(Error::WrongArity("AI.MODELEXECUTE"));
    }
    execute(c, parse_modelexecute)
}

pub fn modelrun(c: &Cmd) -> Result<()> {
    if c.args.len() < 6 {
        return Err(Error::WrongArity("AI.MODELRUN"));
    }
    execute(c, parse_modelrun)
}

type ExecuteParser = for<'a> fn(&[&'a [u8]], usize, usize) -> Result<ExecuteArgs<'a>>;

/// A model execution is a one-op DAG: inputs loaded at parse time, outputs persisted at reply time.
fn execute(c: &Cmd, parse: ExecuteParser) -> Result<()> {
    Blocked::check_can_block(c.ctx)?;
    let model = Key::open(c.ctx, c.raw[1], false).get::<ModelValue>(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?.clone();
    let args = parse(&c.args, model.spec.inputs.len(), model.spec.outputs.len())?;
    let mut plan = Plan { timeout: args.timeout, ..Plan::default() };
    let mut inputs = Vec::with_capacity(args.inputs.len());
    for key in &args.inputs {
        let t =
            Key::open_name(c.ctx, key, false).get::<TensorValue>(&TENSOR_TYPE)?.ok_or(Error::TensorKeyEmpty)?.clone();
        let s = plan.new_slot();
        plan.loaded.push((s, t));
        inputs.push(s);
    }
    let outputs: Vec<usize> = args.outputs.iter().map(|_| plan.new_slot()).collect();
    plan.persist = args.outputs.iter().map(|k| k.to_vec()).zip(outputs.iter().copied()).collect();
    let device = model.spec.device.queue_key();
    queues().get(&device).map_err(|_| Error::Generic("Could not initialize queue on requested device".into()))?;
    plan.ops.push(Op { kind: OpKind::Model { model, inputs, outputs }, device });
    let blocked = Blocked::new(c.ctx)?;
    Run::submit(plan, queues(), move |run| blocked.complete(move |ctx| reply_single_op(ctx, &run)))
}

/// `OK` after storing the outputs, `TIMEDOUT`, or the op's error.
fn reply_single_op(ctx: *mut raw::RedisModuleCtx, run: &Run) {
    if run.timed_out() {
        return send(ctx, &Reply::Simple("TIMEDOUT"));
    }
    let result = match run.outcome(0) {
        OpOutcome::Failed(e) => Err(e),
        OpOutcome::NotRun => Err(Error::Generic("the operation did not run".into())),
        OpOutcome::Done => run
            .plan
            .persist
            .iter()
            .map(|(k, s)| run.slot(*s).map(|t| (k.clone(), t)).ok_or_else(|| Error::Generic("missing output".into())))
            .collect::<Result<Vec<_>>>()
            .and_then(|outs| write_outputs(ctx, &outs)),
    };
    match result {
        Ok(()) => send(ctx, &Reply::OK),
        Err(e) => error(ctx, &e.reply_text()),
    }
}
