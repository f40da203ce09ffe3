//! AI.SCRIPTSTORE / SCRIPTSET / SCRIPTGET / SCRIPTDEL / SCRIPTEXECUTE / SCRIPTRUN / _SCRIPTSCAN.

use std::sync::Arc;

use super::shared::{bind_keys, ensure_queue, reply_single_op, run_plan, set_caller, store_in_background};
use super::Cmd;
use crate::commands::script::{
    parse_scriptexecute, parse_scriptrun, parse_scriptset, parse_scriptstore, scriptget_reply, ScriptCall,
};
use crate::error::{Error, Result};
use crate::exec::dag::{Op, OpKind, Plan};
use crate::redis::blocking::Blocked;
use crate::redis::ctx::Ctx;
use crate::redis::keyspace::Key;
use crate::redis::script_type::SCRIPT_TYPE;
use crate::reply::Reply;
use crate::script::Script;
use crate::stats;

pub fn scriptstore(c: &Cmd) -> Result<()> {
    let spec = parse_scriptstore(&c.args)?;
    store_in_background(c, "script", move |key, _| Script::build(key, spec), commit_script)
}

pub fn scriptset(c: &Cmd) -> Result<()> {
    let spec = parse_scriptset(&c.args)?;
    store_in_background(c, "script", move |key, _| Script::build(key, spec), commit_script)
}

fn commit_script(ctx: Ctx<'_>, key: &[u8], script: Script) -> Result<()> {
    ensure_queue(&script.queue_key())?;
    let k = Key::open_name(ctx, key, true);
    k.check_type(&SCRIPT_TYPE)?;
    let script = Arc::new(script);
    let s = script.stats.clone();
    k.set(&SCRIPT_TYPE, script)?;
    stats::publish(&s);
    Ok(())
}

pub fn scriptget(c: &Cmd) -> Result<()> {
    let k = Key::open(c.ctx, c.raw[1], false);
    let s = k.get(&SCRIPT_TYPE)?.ok_or(Error::ScriptKeyEmpty)?;
    c.reply(&scriptget_reply(&s.spec, &c.args[2..]));
    Ok(())
}

pub fn scriptdel(c: &Cmd) -> Result<()> {
    let k = Key::open(c.ctx, c.raw[1], true);
    k.get(&SCRIPT_TYPE)?.ok_or(Error::ScriptKeyEmpty)?;
    k.delete();
    c.replicate_verbatim();
    c.reply(&Reply::OK);
    Ok(())
}

pub fn scriptexecute(c: &Cmd) -> Result<()> {
    execute(c, |argv| parse_scriptexecute(argv, false))
}

pub fn scriptrun(c: &Cmd) -> Result<()> {
    execute(c, parse_scriptrun)
}

/// A script call is a one-op DAG, like a model execution.
fn execute(c: &Cmd, parse: for<'a> fn(&[&'a [u8]]) -> Result<ScriptCall<'a>>) -> Result<()> {
    Blocked::check_can_block(c.ctx)?;
    let script = Key::open(c.ctx, c.raw[1], false).get_arc(&SCRIPT_TYPE)?.ok_or(Error::ScriptKeyEmpty)?;
    let call = parse(&c.args)?;
    let mut plan = Plan { timeout: call.timeout, ..Plan::default() };
    let (inputs, outputs) = bind_keys(c, &mut plan, &call.inputs, &call.outputs)?;
    let device = script.queue_key();
    ensure_queue(&device)?;
    plan.ops.push(Op { kind: OpKind::script(script, call.op_args(), inputs, outputs), device });
    set_caller(c, &mut plan, false);
    run_plan(c, plan, reply_single_op)
}
