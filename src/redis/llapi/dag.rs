//! DAG functions: `RAI_DAGRunCtx` is a `DagBuilder` (commands/dag_builder.rs), `RAI_DAGRunOp` one model or
//! script call of it; a DAG is planned and queued like AI.DAGEXECUTE's, its TENSORGETs are the outputs.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::ctx::OnFinishCtx;
use super::error::{self, RaiError};
use super::run::{self, Callback, OnFinish};
use super::{cstr, ffi, share, ERR, OK};
use crate::commands::dag_builder::{get_slots, CallOp, DagBuilder};
use crate::error::{Error, Result};
use crate::exec::dag::OpKind;
use crate::model::Model;
use crate::redis::keyspace::{DagKeys, Key};
use crate::script::Script;
use crate::tensor::Tensor;

pub extern "C" fn create() -> *mut DagBuilder {
    ffi("RedisAI_DAGRunCtxCreate", std::ptr::null_mut(), || Box::into_raw(Box::default()))
}

pub extern "C" fn free(dag: *mut DagBuilder) {
    ffi("RedisAI_DAGFree", (), || {
        if !dag.is_null() {
            // SAFETY: a DAG from RedisAI_DAGRunCtxCreate, freed once (a run of it holds its own plan).
            drop(unsafe { Box::from_raw(dag) });
        }
    })
}

pub extern "C" fn create_model_run_op(model: *const Model) -> *mut CallOp {
    ffi("RedisAI_DAGCreateModelRunOp", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live model handle: the op keeps a reference of its own.
        unsafe { share(model) }.map_or(std::ptr::null_mut(), |m| Box::into_raw(Box::new(CallOp::model(m))))
    })
}

pub extern "C" fn create_script_run_op(script: *const Script, function: *const c_char) -> *mut CallOp {
    ffi("RedisAI_DAGCreateScriptRunOp", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live script handle (the op keeps a reference) and a NUL-terminated name.
        match unsafe { (share(script), cstr(function)) } {
            (Some(s), Some(f)) => Box::into_raw(Box::new(CallOp::script(s, f, None))),
            _ => std::ptr::null_mut(),
        }
    })
}

/// Adds a name to an op's inputs or outputs: REDISMODULE_OK, or ERR for NULL arguments (RedisAI's values).
fn add_name(what: &str, op: *mut CallOp, name: *const c_char, output: bool) -> c_int {
    ffi(what, ERR, || {
        // SAFETY: NULL or a live op, and a NUL-terminated name lent for the call.
        match unsafe { (op.as_mut(), cstr(name)) } {
            (Some(op), Some(n)) => {
                if output { &mut op.outputs } else { &mut op.inputs }.push(n.to_vec());
                OK
            }
            _ => ERR,
        }
    })
}

pub extern "C" fn run_op_add_input(op: *mut CallOp, input: *const c_char) -> c_int {
    add_name("RedisAI_DAGRunOpAddInput", op, input, false)
}

pub extern "C" fn run_op_add_output(op: *mut CallOp, output: *const c_char) -> c_int {
    add_name("RedisAI_DAGRunOpAddOutput", op, output, true)
}

pub extern "C" fn run_op_free(op: *mut CallOp) {
    ffi("RedisAI_DAGRunOpFree", (), || {
        if !op.is_null() {
            // SAFETY: an op the caller owns (never added, or refused), freed once.
            drop(unsafe { Box::from_raw(op) });
        }
    })
}

/// Runs `f` on a live DAG, or answers ERR for NULL.
fn with_dag(what: &str, dag: *mut DagBuilder, f: impl FnOnce(&mut DagBuilder) -> c_int) -> c_int {
    // SAFETY: NULL or a live DAG, used by this thread only during the call.
    ffi(what, ERR, || unsafe { dag.as_mut() }.map_or(ERR, f))
}

fn status(r: Result<()>, err: *mut RaiError, code: c_int) -> c_int {
    match r {
        Ok(()) => OK,
        Err(e) => {
            // SAFETY: NULL or the caller's live error.
            unsafe { error::set(err, code, &e) };
            ERR
        }
    }
}

/// Takes the op into the DAG when its counts fit the model; a refused op stays the caller's to free.
pub extern "C" fn add_run_op(dag: *mut DagBuilder, op: *mut CallOp, err: *mut RaiError) -> c_int {
    with_dag("RedisAI_DAGAddRunOp", dag, |dag| {
        // SAFETY: NULL or a live op the caller owns.
        let Some(checked) = (unsafe { op.as_ref() }).map(CallOp::check_counts) else {
            return status(Err(Error::parse("no op to add")), err, error::EDAGBUILDER);
        };
        if checked.is_ok() {
            // SAFETY: the caller's op, now the DAG's (the caller no longer frees it).
            let op = unsafe { Box::from_raw(op) };
            return status(dag.call(*op), err, error::EDAGBUILDER);
        }
        status(checked, err, error::EDAGBUILDER)
    })
}

/// Runs `f` with a tensor handle and a name.
fn tensor_step(
    what: &str,
    dag: *mut DagBuilder,
    name: *const c_char,
    t: *const Tensor,
    f: impl FnOnce(&mut DagBuilder, &[u8], Arc<Tensor>) -> c_int,
) -> c_int {
    with_dag(what, dag, |dag| {
        // SAFETY: a NUL-terminated name and NULL or a live tensor handle (the DAG keeps a reference).
        match unsafe { (cstr(name), share(t)) } {
            (Some(n), Some(t)) => f(dag, n, t),
            _ => ERR,
        }
    })
}

/// A tensor present before the run under `name` (AI.DAGEXECUTE's LOAD); a name is loaded once.
pub extern "C" fn load_tensor(dag: *mut DagBuilder, name: *const c_char, t: *const Tensor) -> c_int {
    tensor_step("RedisAI_DAGLoadTensor", dag, name, t, |dag, n, t| if dag.load(n, t).is_ok() { OK } else { ERR })
}

pub extern "C" fn add_tensor_set(dag: *mut DagBuilder, name: *const c_char, t: *const Tensor) -> c_int {
    tensor_step("RedisAI_DAGAddTensorSet", dag, name, t, |dag, n, t| {
        dag.set(n, t);
        OK
    })
}

pub extern "C" fn add_tensor_get(dag: *mut DagBuilder, name: *const c_char) -> c_int {
    with_dag("RedisAI_DAGAddTensorGet", dag, |dag| {
        // SAFETY: a NUL-terminated name lent for the call.
        unsafe { cstr(name) }.map_or(ERR, |n| {
            dag.get(n);
            OK
        })
    })
}

/// `|> AI.MODELEXECUTE … |> AI.SCRIPTEXECUTE … |> AI.TENSORSET … |> AI.TENSORGET …`, words split on spaces,
/// keys read from database 0; all its ops are added, or none.
pub extern "C" fn add_ops_from_string(dag: *mut DagBuilder, text: *const c_char, err: *mut RaiError) -> c_int {
    with_dag("RedisAI_DAGAddOpsFromString", dag, |dag| {
        // SAFETY: a NUL-terminated string lent for the call.
        let Some(text) = (unsafe { cstr(text) }) else { return ERR };
        let words: Vec<&[u8]> = text.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).collect();
        let added =
            super::with_keyspace(|ctx| dag.add_words(&words, &DagKeys(|k: &[u8]| Key::open_name(ctx, k, false))));
        status(added, err, error::EDAGBUILDER)
    })
}

pub extern "C" fn num_ops(dag: *mut DagBuilder) -> usize {
    // SAFETY: NULL or a live DAG.
    ffi("RedisAI_DAGNumOps", 0, || unsafe { dag.as_ref() }.map_or(0, DagBuilder::num_ops))
}

/// Plans and queues the DAG (errors found while planning are returned, and the callback is not called); the
/// callback gets the TENSORGET outputs, or the first failed op's error and no outputs.
pub extern "C" fn run(dag: *mut DagBuilder, cb: OnFinish<OnFinishCtx>, data: *mut c_void, err: *mut RaiError) -> c_int {
    with_dag("RedisAI_DAGRun", dag, |dag| {
        let Some(callback) = Callback::new(cb, data) else {
            return status(Err(Error::parse("no callback for the DAG run")), err, error::EDAGRUN);
        };
        let queued = dag.plan().and_then(|plan| {
            run::submit(plan, move |r| {
                let error = run::run_error(&r).map(|(e, op)| RaiError::new(error_code(op), &e));
                let outputs = if error.is_some() {
                    Vec::new()
                } else {
                    get_slots(&r.plan).into_iter().filter_map(|s| r.slot(s)).collect()
                };
                callback.call(OnFinishCtx::Dag { outputs, error });
            })
        });
        status(queued, err, error::EDAGRUN)
    })
}

/// ESCRIPTRUN or EMODELRUN after the kind of op that failed; EDAGRUN when none did (a timeout).
fn error_code(failed: Option<&OpKind>) -> c_int {
    match failed {
        Some(OpKind::Script { .. }) => error::ESCRIPTRUN,
        Some(OpKind::Model { .. }) => error::EMODELRUN,
        None => error::EDAGRUN,
    }
}

/// The DAG outputs a callback was handed (none for a model or script run's finish context).
fn dag_outputs<'a>(finished: *mut OnFinishCtx) -> Option<(&'a [Arc<Tensor>], Option<&'a RaiError>)> {
    // SAFETY: NULL or the finish context the callback was handed, live during the callback.
    match unsafe { finished.as_ref() }? {
        OnFinishCtx::Dag { outputs, error } => Some((outputs, error.as_ref())),
        _ => None,
    }
}

pub extern "C" fn num_outputs(finished: *mut OnFinishCtx) -> usize {
    ffi("RedisAI_DAGNumOutputs", 0, || dag_outputs(finished).map_or(0, |(o, _)| o.len()))
}

/// Output `index`, borrowed for the callback (NULL past the last).
pub extern "C" fn output_tensor(finished: *mut OnFinishCtx, index: usize) -> *const Tensor {
    ffi("RedisAI_DAGOutputTensor", std::ptr::null(), || {
        dag_outputs(finished).and_then(|(o, _)| o.get(index)).map_or(std::ptr::null(), Arc::as_ptr)
    })
}

pub extern "C" fn run_error(finished: *mut OnFinishCtx) -> c_int {
    ffi("RedisAI_DAGRunError", 0, || {
        dag_outputs(finished).is_some_and(|(_, e)| e.is_some_and(RaiError::is_error)) as c_int
    })
}

/// The run's error, borrowed for the callback (NULL when it succeeded).
pub extern "C" fn get_error(finished: *mut OnFinishCtx) -> *const RaiError {
    ffi("RedisAI_DAGGetError", std::ptr::null(), || {
        dag_outputs(finished).and_then(|(_, e)| e).map_or(std::ptr::null(), |e| e as *const RaiError)
    })
}
