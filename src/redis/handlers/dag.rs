//! AI.DAGEXECUTE / AI.DAGEXECUTE_RO / AI.DAGRUN / AI.DAGRUN_RO.

use std::sync::Arc;

use redis_module::raw;

use super::persist::write_outputs;
use super::shared::{run_plan, set_caller};
use super::Cmd;
use crate::commands::dag::{dag_zero_filled_bytes, parse_dag, DagKind};
use crate::commands::tensor::tensor_reply;
use crate::error::{Error, Result};
use crate::exec::dag::ReplyItem;
use crate::exec::run::{OpOutcome, Run};
use crate::redis::blocking::Blocked;
use crate::redis::ctx::Ctx;
use crate::redis::keyspace::DagKeys;
use crate::redis::reply::send;
use crate::reply::Reply;
use crate::tensor::Tensor;

pub fn dagexecute(c: &Cmd) -> Result<()> {
    dag(c, DagKind::Execute)
}
pub fn dagexecute_ro(c: &Cmd) -> Result<()> {
    dag(c, DagKind::ExecuteRo)
}
pub fn dagrun(c: &Cmd) -> Result<()> {
    dag(c, DagKind::Run)
}
pub fn dagrun_ro(c: &Cmd) -> Result<()> {
    dag(c, DagKind::RunRo)
}

fn dag(c: &Cmd, kind: DagKind) -> Result<()> {
    Blocked::check_can_block(c.ctx)?;
    crate::redis::memory::check_room(c.ctx, dag_zero_filled_bytes(&c.args))?;
    let mut plan = parse_dag(&c.args, kind, &DagKeys(|k: &[u8]| c.open_key(k, false)))?;
    set_caller(c, &mut plan, matches!(kind, DagKind::ExecuteRo | DagKind::RunRo));
    crate::exec::ensure_queues(&plan)?;
    if plan.ops.is_empty() {
        // Only TENSORSET/TENSORGET: nothing to queue, answer now.
        let run = Run::finished(plan);
        reply_dag(c.ctx, &run);
        return Ok(());
    }
    run_plan(c, plan, reply_dag)
}

/// One entry per op (`OK`, a TENSORGET reply, an error, or `NA`), PERSIST done only when every op
/// succeeded (a failed PERSIST adds one trailing error), or `TIMEDOUT` for the whole DAG.
fn reply_dag(ctx: Ctx<'_>, run: &Run) {
    if run.timed_out() {
        return send(ctx, &Reply::Simple("TIMEDOUT"));
    }
    let plan = &run.plan;
    // PERSIST first: a failure there is the reply's last entry. The entries are then sent one by one.
    let mut persist_error = None;
    if !run.failed() && !plan.persist.is_empty() {
        let outputs: Option<Vec<(&[u8], Arc<Tensor>)>> =
            plan.persist.iter().map(|(k, s)| run.slot(*s).map(|t| (k.as_slice(), t))).collect();
        persist_error = outputs
            .ok_or_else(|| Error::parse("PERSIST key cannot be found in DAG"))
            .and_then(|o| write_outputs(ctx, &o))
            .err();
    }
    raw::reply_with_array(
        ctx.as_ptr(),
        (plan.replies.len() + usize::from(persist_error.is_some())) as std::ffi::c_long,
    );
    for item in &plan.replies {
        match item {
            ReplyItem::Ok => send(ctx, &Reply::OK),
            ReplyItem::Get { slot, format } => match run.slot(*slot) {
                Some(t) => send(ctx, &tensor_reply(&t, *format)),
                None => send(ctx, &Reply::Simple("NA")),
            },
            ReplyItem::Op(i) => match run.outcome(*i) {
                OpOutcome::Done => send(ctx, &Reply::OK),
                OpOutcome::Failed(e) => send(ctx, &Reply::Error(e)),
                OpOutcome::NotRun => send(ctx, &Reply::Simple("NA")),
            },
        }
    }
    if let Some(e) = persist_error {
        send(ctx, &Reply::Error(e));
    }
}
