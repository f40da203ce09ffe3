//! `RAI_ModelRunCtx` and `RAI_ScriptRunCtx`: one call of a model or script function, with its inputs, and
//! its outputs or error once it ran (synchronously, or asynchronously with a completion callback).

use std::ffi::{c_int, c_longlong, c_void};
use std::sync::Arc;

use super::error::{self, RaiError};
use super::run::{self, Callback, Lent, OnFinish};
use super::{ffi, share, ERR, OK};
use crate::commands::dag_builder::{call_plan, CallOp};
use crate::error::Error;
use crate::exec::op::record_failed_call;
use crate::exec::run::Run;
use crate::tensor::Tensor;

/// `RAI_OnFinishCtx`: what a completed run hands its callback.
pub enum OnFinishCtx {
    Model(*mut RunCtx),
    Script(*mut RunCtx),
    Dag { outputs: Vec<Arc<Tensor>>, error: Option<RaiError> },
}

pub struct RunCtx {
    pub op: CallOp,
    tensors: Vec<Arc<Tensor>>,
    /// Where a script call's List[Tensor] argument starts (`RedisAI_ScriptRunCtxAddTensorInputList`).
    pub list_from: Option<usize>,
    outputs: Vec<Option<Arc<Tensor>>>,
    pub error: Option<RaiError>,
}

impl RunCtx {
    pub fn new(op: CallOp) -> RunCtx {
        RunCtx { op, tensors: Vec::new(), list_from: None, outputs: Vec::new(), error: None }
    }

    pub fn add_input(&mut self, t: Arc<Tensor>) {
        self.op.inputs.push(format!("input{}", self.tensors.len()).into_bytes());
        self.tensors.push(t);
    }

    pub fn add_output(&mut self) {
        self.op.outputs.push(format!("output{}", self.op.outputs.len()).into_bytes());
    }

    fn error_code(&self) -> c_int {
        if self.op.is_model() {
            error::EMODELRUN
        } else {
            error::ESCRIPTRUN
        }
    }

    /// The run's plan; a context that cannot run counts in AI.INFO as a failed call, as RedisAI counted the
    /// backend's refusal of it (its test module runs a model without inputs and expects `calls 2, errors 1`).
    fn plan(&mut self) -> crate::error::Result<crate::exec::dag::Plan> {
        self.op.set_list_from(self.list_from);
        self.outputs.clear();
        self.error = None;
        call_plan(&self.op, &self.tensors).inspect_err(|e| record_failed_call(self.op.stats(), e))
    }

    fn fail(&mut self, e: &Error) {
        self.error = Some(RaiError::new(self.error_code(), e));
    }

    fn finish(&mut self, run: &Run) {
        match run::run_error(run) {
            Some((e, _)) => self.fail(&e),
            None => self.outputs = run::op_outputs(run),
        }
    }

    fn finished(&mut self) -> OnFinishCtx {
        if self.op.is_model() {
            OnFinishCtx::Model(self)
        } else {
            OnFinishCtx::Script(self)
        }
    }
}

/// # Safety
/// `ctx` is NULL or a live run context from a `*RunCtxCreate`, not used by another thread during the call.
pub unsafe fn ctx_mut<'a>(ctx: *mut RunCtx) -> Option<&'a mut RunCtx> {
    // SAFETY: see the contract.
    unsafe { ctx.as_mut() }
}

/// Adds a tensor input (a reference of the context's own); 1, or 0 for NULL arguments.
pub fn add_input(name: &str, ctx: *mut RunCtx, t: *const Tensor) -> c_int {
    ffi(name, 0, || {
        // SAFETY: NULL or a live context / tensor handle, lent for the call.
        match unsafe { (ctx_mut(ctx), share(t)) } {
            (Some(ctx), Some(t)) => {
                ctx.add_input(t);
                1
            }
            _ => 0,
        }
    })
}

pub fn add_output(name: &str, ctx: *mut RunCtx) -> c_int {
    ffi(name, 0, || {
        // SAFETY: NULL or a live context.
        unsafe { ctx_mut(ctx) }.map_or(0, |c| {
            c.add_output();
            1
        })
    })
}

pub fn num_outputs(name: &str, ctx: *mut RunCtx) -> usize {
    // Before a run: the outputs asked for; after: the outputs it gave.
    ffi(name, 0, || {
        // SAFETY: NULL or a live context.
        unsafe { ctx_mut(ctx) }.map_or(0, |c| if c.outputs.is_empty() { c.op.outputs.len() } else { c.outputs.len() })
    })
}

/// Output `index` after a run, borrowed from the context (NULL when there is none).
pub fn output_tensor(name: &str, ctx: *mut RunCtx, index: usize) -> *mut Tensor {
    ffi(name, std::ptr::null_mut(), || {
        // SAFETY: NULL or a live context.
        unsafe { ctx_mut(ctx) }
            .and_then(|c| c.outputs.get(index).cloned().flatten())
            .map_or(std::ptr::null_mut(), |t| Arc::as_ptr(&t) as *mut Tensor)
    })
}

pub fn free(name: &str, ctx: *mut RunCtx) {
    ffi(name, (), || {
        if !ctx.is_null() {
            // SAFETY: a context from a `*RunCtxCreate`, freed once, with no run of it in flight.
            drop(unsafe { Box::from_raw(ctx) });
        }
    })
}

/// Runs `n` contexts (RedisAI_ModelRun takes several, which the model's batching may join) and waits.
pub fn run_sync(name: &str, ctxs: *const *mut RunCtx, n: c_longlong, err: *mut RaiError) -> c_int {
    ffi(name, ERR, || {
        let mut ctxs: Vec<&mut RunCtx> = match usize::try_from(n) {
            // SAFETY: `n` context pointers, lent for the call.
            Ok(n) if n > 0 && !ctxs.is_null() => unsafe { std::slice::from_raw_parts(ctxs, n) }
                .iter()
                // SAFETY: each NULL (refused: the list is dropped) or a live context, lent for the call.
                .map(|&c| unsafe { ctx_mut(c) })
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if ctxs.is_empty() {
            // SAFETY: NULL or the caller's live error.
            unsafe { error::set(err, error::EMODELRUN, &Error::parse("no run context to run")) };
            return ERR;
        }
        // Every context is planned (each one that cannot run counts), then the first error fails them all.
        let planned: Vec<_> = ctxs.iter_mut().map(|c| c.plan()).collect();
        let plans = planned.into_iter().collect::<crate::error::Result<Vec<_>>>();
        let runs = plans.and_then(run::wait);
        match runs {
            Ok(runs) => {
                for (c, r) in ctxs.iter_mut().zip(&runs) {
                    c.finish(r);
                }
            }
            Err(e) => ctxs.iter_mut().for_each(|c| c.fail(&e)),
        }
        match ctxs.iter().find_map(|c| c.error.as_ref()) {
            Some(e) => {
                // SAFETY: NULL or the caller's live error.
                unsafe { error::copy(err, Some(e)) };
                ERR
            }
            None => OK,
        }
    })
}

/// Queues the context's run; the callback gets it back through RedisAI_GetAs*RunCtx, with its outputs or
/// its error (also an error found before the run: it too reaches the callback, from another thread).
pub fn run_async(name: &str, ctx: *mut RunCtx, cb: OnFinish<OnFinishCtx>, data: *mut c_void) -> c_int {
    ffi(name, ERR, || {
        // SAFETY: NULL or a live context, which the caller leaves to the run until the callback.
        let (Some(c), Some(callback)) = (unsafe { ctx_mut(ctx) }, Callback::new(cb, data)) else { return ERR };
        let lent = Lent(ctx);
        let queued = match c.plan() {
            Ok(plan) => run::submit(plan, move |r| {
                let lent = lent;
                // SAFETY: lent by the caller until the callback; nothing else touches it meanwhile.
                let c = unsafe { &mut *lent.0 };
                c.finish(&r);
                callback.call(c.finished());
            }),
            Err(e) => {
                c.fail(&e);
                run::later(move || {
                    let lent = lent;
                    // SAFETY: as above.
                    callback.call(unsafe { &mut *lent.0 }.finished());
                })
            }
        };
        if queued.is_ok() {
            OK
        } else {
            ERR
        }
    })
}

/// The run context of a finished model (or script) run, its error copied into `err`.
pub fn get_as(name: &str, finished: *mut OnFinishCtx, model: bool, err: *mut RaiError) -> *mut RunCtx {
    ffi(name, std::ptr::null_mut(), || {
        // SAFETY: NULL or the finish context the callback was handed, live during the callback.
        let ctx = match unsafe { finished.as_ref() } {
            Some(OnFinishCtx::Model(c)) if model => *c,
            Some(OnFinishCtx::Script(c)) if !model => *c,
            _ => {
                let what = if model { "model" } else { "script" };
                let e = Error::parse(format!("the finish context is not of a {what} run"));
                // SAFETY: NULL or the caller's live error.
                unsafe { error::set(err, error::EFINISHCTX, &e) };
                return std::ptr::null_mut();
            }
        };
        // SAFETY: the context lent to the run, live until the caller frees it after the callback.
        unsafe { error::copy(err, ctx_mut(ctx).and_then(|c| c.error.as_ref())) };
        ctx
    })
}
