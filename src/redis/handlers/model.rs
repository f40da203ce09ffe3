//! AI.MODELSTORE / MODELSET / MODELGET / MODELDEL / MODELEXECUTE / MODELRUN.

use std::sync::Arc;

use super::shared::{bind_keys, reply_single_op, run_plan, set_caller, store_in_background};
use super::Cmd;
use crate::commands::model::{
    concat, modelget_reply, parse_modelexecute, parse_modelrun, parse_modelset_head, parse_modelstore_head, ExecuteArgs,
};
use crate::config::CONFIG;
use crate::error::{Error, Result};
use crate::exec::dag::{Op, OpKind, Plan};
use crate::model::{Model, ModelSpec};
use crate::redis::blocking::Blocked;
use crate::redis::ctx::Ctx;
use crate::redis::keyspace::Key;
use crate::redis::model_type::MODEL_TYPE;
use crate::reply::Reply;
use crate::stats;

pub fn modelstore(c: &Cmd) -> Result<()> {
    let (spec, payload) = parse_modelstore_head(&c.args)?;
    let keep = Blocked::from_replication(c.ctx);
    store_in_background(c, "model", move |key, args| build_model(key, spec, &args[payload..], keep), commit_model)
}

pub fn modelset(c: &Cmd) -> Result<()> {
    let (spec, payload) = parse_modelset_head(&c.args)?;
    let keep = Blocked::from_replication(c.ctx);
    store_in_background(c, "model", move |key, args| build_model(key, spec, &args[payload..], keep), commit_model)
}

/// On the build thread: the payload is joined here, not on the main thread (a model can be hundreds of MB).
/// `keep`: the command comes from the AOF or the primary, where the model was accepted once: as for an RDB, a
/// model that cannot be built (its backend is missing, or admission refuses it now) is kept with its bytes and
/// replies the error when executed, so no data is lost.
fn build_model(key: &[u8], spec: ModelSpec, chunks: &[&[u8]], keep: bool) -> Result<Model> {
    let spec = ModelSpec { blob: concat(chunks), ..spec };
    if keep {
        Ok(Model::restore(key, spec))
    } else {
        let model = Model::build(key, spec)?;
        crate::exec::deferred::built_by_client(&model.spec.blob);
        Ok(model)
    }
}

fn commit_model(ctx: Ctx<'_>, key: &[u8], model: Model) -> Result<()> {
    crate::exec::model_queue(&model)?;
    let k = Key::open_name(ctx, key, true);
    k.check_type(&MODEL_TYPE)?;
    let model = Arc::new(model);
    let s = model.stats.clone();
    k.set(&MODEL_TYPE, model)?;
    stats::publish(&s);
    Ok(())
}

pub fn modelget(c: &Cmd) -> Result<()> {
    let k = Key::open(c.ctx, c.raw[1], false);
    let m = k.get(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?;
    let chunk = CONFIG.read().model_chunk_size;
    c.reply(&modelget_reply(&m.spec, &m.spec.inputs, &m.spec.outputs, &c.args[2..], chunk));
    Ok(())
}

pub fn modeldel(c: &Cmd) -> Result<()> {
    let k = Key::open(c.ctx, c.raw[1], true);
    k.get(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?;
    k.delete();
    c.replicate_verbatim();
    c.reply(&Reply::OK);
    Ok(())
}

pub fn modelexecute(c: &Cmd) -> Result<()> {
    execute(c, parse_modelexecute)
}

pub fn modelrun(c: &Cmd) -> Result<()> {
    execute(c, parse_modelrun)
}

type ExecuteParser = for<'a> fn(&[&'a [u8]], usize, usize) -> Result<ExecuteArgs<'a>>;

/// A model execution is a one-op DAG: inputs loaded at parse time, outputs persisted at reply time.
fn execute(c: &Cmd, parse: ExecuteParser) -> Result<()> {
    Blocked::check_can_block(c.ctx)?;
    let model = Key::open(c.ctx, c.raw[1], false).get_arc(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)?;
    let (ni, no) = model.io_counts();
    let args = parse(&c.args, ni, no)?;
    let mut plan = Plan { timeout: args.timeout, ..Plan::default() };
    let (inputs, outputs) = bind_keys(c, &mut plan, &args.inputs, &args.outputs)?;
    crate::exec::model_queue(&model)?;
    let device = model.spec.device.queue_key();
    plan.ops.push(Op { kind: OpKind::Model { model, inputs, outputs }, device });
    set_caller(c, &mut plan, false);
    run_plan(c, plan, reply_single_op)
}
