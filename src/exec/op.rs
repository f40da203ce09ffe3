//! Running one op on the calling thread: a model alone (`execute_model`, also a script's nested
//! `redisAI.model_execute`), a model over a batch of requests (`run_batch`), a script function (`execute`),
//! and what each adds to AI.INFO (`Sample`, `record_detail`). `run.rs` decides when an op runs; this decides
//! how, with the model-run logic in one place (`run_model`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use super::dag::OpKind;
use crate::backends::{LoadedModel, Outputs, RunReport, RunRequest, ScriptRequest};
use crate::caller::Caller;
use crate::clock::copy_clock;
use crate::config::CONFIG;
use crate::error::{Error, Result};
use crate::histogram::window_of;
use crate::model::Model;
use crate::stats::{self, ErrorKind, Stats, Timing};
use crate::tensor::Tensor;

/// An op's input or output tensors (a few: on the stack).
pub(super) type Tensors = SmallVec<[Arc<Tensor>; 4]>;

/// Runs one model over a batch of requests (the same model, compatible inputs): their inputs joined on
/// dimension 0, one backend run, the outputs split back per request. A failure reaches every request; each
/// request is charged the whole batch's time and its own samples, as RedisAI did.
pub(super) fn run_batch(model: &Arc<Model>, requests: Vec<(Tensors, Req)>) -> Vec<Result<Tensors>> {
    let outputs = model.spec.outputs.len();
    let rows: Vec<usize> = requests.iter().map(|(ins, _)| ins[0].dim0().max(0) as usize).collect();
    let total: usize = rows.iter().sum();
    let start = Instant::now();
    copy_clock::take_us();
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<Outputs> {
        let joined = {
            let _copying = copy_clock::copying();
            (0..requests[0].0.len())
                .map(|i| Tensor::concat(&requests.iter().map(|(ins, _)| ins[i].as_ref()).collect::<Vec<_>>()))
                .collect::<Result<Vec<Tensor>>>()?
        };
        let refs: Vec<&Tensor> = joined.iter().collect();
        // Requests of several clients: no one caller for the model's callbacks, which are refused.
        let report =
            model.loaded()?.execute(&RunRequest::new(&refs, &Caller::default(), CONFIG.read().execution_limit()))?;
        // The batch's copy time: its joins and splits, and the backend's.
        copy_clock::add_us(report.copy_us);
        let outs = report.outputs;
        if outs.len() != outputs {
            return Err(wrong_output_count());
        }
        if outs.iter().any(|t| t.dim0() != total as i64) {
            return Err(Error::Mismatch("Model did not generate the expected batch size".into()));
        }
        Ok(outs)
    }))
    .unwrap_or_else(|_| Err(Error::Internal("internal error: the operation panicked".into())));
    let micros = start.elapsed().as_micros() as i64;
    let stats = &model.stats;
    let detailed = stats::detailed();
    if detailed {
        stats.detail.record_execution(requests.len() as u64, window_of(Instant::now()));
    }
    let mut offset = 0;
    let mut results = Vec::with_capacity(requests.len());
    for ((inputs, req), n) in requests.into_iter().zip(rows) {
        drop(inputs);
        let mine = {
            let _copying = copy_clock::copying();
            result.as_ref().map_err(Clone::clone).and_then(|outs| {
                outs.iter().map(|t| t.slice_dim0(offset, n).map(Arc::new)).collect::<Result<Tensors>>()
            })
        };
        offset += n;
        match &mine {
            Ok(_) => stats.record_success(micros, n as i64),
            Err(_) => stats.record_error(),
        }
        if detailed {
            // The batch's copies (joining, the backend's, splitting up to this request's share) and the rest.
            let copy_us = copy_clock::take_us();
            let end = Instant::now();
            record_detail(stats, &mine, &req, (micros as u64).saturating_sub(copy_us), copy_us, end);
        }
        results.push(mine);
    }
    results
}

/// RedisAI's error for a model that returned another number of outputs than it declares.
fn wrong_output_count() -> Error {
    Error::Mismatch("Model did not generate the expected number of outputs".into())
}

/// The stats of the model or script an op runs.
pub(super) fn op_stats(op: &OpKind) -> &Stats {
    match op {
        OpKind::Model { model, .. } => &model.stats,
        OpKind::Script { script, .. } => &script.stats,
    }
}

/// Records a call of a model or script that failed before it could run (a low-level API run context whose
/// inputs do not match the model): one call and one error, as RedisAI counted the backend's refusal.
pub fn record_failed_call(stats: &Stats, e: &Error) {
    stats.record_failed_call(error_kind(e));
}

/// What AI.INFO's split of `errors` calls this failure.
fn error_kind(e: &Error) -> ErrorKind {
    match e {
        Error::Refused { .. } => ErrorKind::Refused,
        Error::TimedOut { .. } => ErrorKind::Timeout,
        _ => ErrorKind::Backend,
    }
}

/// A request as far as its statistics are concerned: how long it waited, when its run began, where it ran.
pub(super) struct Req {
    queue_us: u64,
    created: Instant,
    inline: bool,
}

impl Req {
    /// A request that waited `queue_us` on a device queue.
    pub(super) fn queued(queue_us: u64, created: Instant) -> Req {
        Req { queue_us, created, inline: false }
    }

    /// A request run on Redis's main thread (exec/inline.rs).
    pub(super) fn inline(created: Instant) -> Req {
        Req { queue_us: 0, created, inline: true }
    }
}

/// AI.INFO's timings of one request that ran (a success), or the kind of its failure.
fn record_detail<T>(stats: &Stats, result: &Result<T>, req: &Req, backend_us: u64, copy_us: u64, end: Instant) {
    let w = window_of(end);
    match result {
        Ok(_) => {
            let total_us = end.saturating_duration_since(req.created).as_micros() as u64;
            let timing = Timing { queue_us: req.queue_us, backend_us, copy_us, total_us, inline: req.inline };
            stats.detail.record_request(&timing, w);
        }
        Err(e) => stats.detail.record_error(error_kind(e)),
    }
}

/// What a model run adds to AI.INFO's statistics and to the model's run history.
pub(super) enum Sample {
    Success { micros: u64, copy_us: u64, samples: i64, input_bytes: u64 },
    Error(ErrorKind),
}

impl Sample {
    /// Records the run of one request, which ended at `end`.
    pub(super) fn record(&self, model: &Model, req: &Req, end: Instant) {
        let detailed = stats::detailed();
        if detailed {
            model.stats.detail.record_execution(1, window_of(end));
        }
        match *self {
            Sample::Success { micros, copy_us, samples, input_bytes } => {
                model.stats.record_success(micros as i64, samples);
                model.history.record(micros, input_bytes);
                if detailed {
                    record_detail(&model.stats, &Ok(()), req, micros.saturating_sub(copy_us), copy_us, end);
                }
            }
            Sample::Error(kind) => {
                model.stats.record_error();
                if detailed {
                    model.stats.detail.record_error(kind);
                }
            }
        }
    }
}

pub(super) fn input_bytes(inputs: &[Arc<Tensor>]) -> u64 {
    inputs.iter().map(|t| t.data().len() as u64).sum()
}

/// Runs a model op started at `start`, stopped at `deadline`, with `runner` (the backend's `run`, or `run_within`
/// for an inline run) and checks the number of outputs; the result with what it adds to the statistics
/// (recorded by the caller) and when it ended. `None`: `runner` gave up.
pub(super) fn run_model(
    model: &Model,
    noutputs: usize,
    inputs: &[Arc<Tensor>],
    caller: &Caller,
    (start, deadline): (Instant, Instant),
    runner: impl FnOnce(&dyn LoadedModel, &RunRequest) -> Option<Result<RunReport>>,
) -> Option<(Result<Tensors>, Sample, Instant)> {
    let refs: SmallVec<[&Tensor; 4]> = inputs.iter().map(|t| t.as_ref()).collect();
    let result = match model.loaded() {
        Ok(m) => runner(m, &RunRequest { inputs: &refs, caller, start, deadline })?,
        Err(e) => Err(e),
    };
    let end = Instant::now();
    let (result, sample) = model_result(result, noutputs, end.duration_since(start).as_micros() as u64, inputs);
    Some((result, sample, end))
}

/// A model run's result, its number of outputs checked, and its sample (`micros`: how long it ran by the
/// engine's clock, unless the backend timed it in another process).
pub(super) fn model_result(
    result: Result<RunReport>,
    noutputs: usize,
    micros: u64,
    inputs: &[Arc<Tensor>],
) -> (Result<Tensors>, Sample) {
    let result = result.and_then(|r| if r.outputs.len() == noutputs { Ok(r) } else { Err(wrong_output_count()) });
    let sample = match &result {
        Ok(r) => Sample::Success {
            micros: r.run_us.unwrap_or(micros),
            copy_us: r.copy_us,
            samples: r.outputs.first().map_or(0, |t| t.dim0()),
            input_bytes: input_bytes(inputs),
        },
        Err(e) => Sample::Error(error_kind(e)),
    };
    (result.map(|r| r.outputs.into_iter().map(Arc::new).collect()), sample)
}

/// Runs a model on the calling worker thread and records the run: the one path of a queued model op and of a
/// script's `redisAI.model_execute` (`run_nested`); batches (`step_batch`) and inline runs (`run_inline`) share
/// `run_model` and `Sample`.
fn execute_model(
    model: &Model,
    noutputs: usize,
    inputs: &[Arc<Tensor>],
    req: &Req,
    caller: &Caller,
) -> Result<Tensors> {
    let start = Instant::now();
    let when = (start, start + CONFIG.read().execution_limit());
    match run_model(model, noutputs, inputs, caller, when, |m, req| Some(m.execute(req))) {
        Some((result, sample, end)) => {
            sample.record(model, req, end);
            result
        }
        // `run` always answers; only `run_within` (inline) gives up.
        None => Err(Error::Internal("the operation did not run".into())),
    }
}

/// A model run asked for by a running script (TorchScript's `redisAI.model_execute`), on the script's worker:
/// checked and counted in AI.INFO as any other run of the model (it waited in no queue).
pub fn run_nested(model: &Model, inputs: &[Arc<Tensor>], noutputs: usize, caller: &Caller) -> Result<Tensors> {
    // Its copies are the model run's (its report's), not the script's: the script's own count is untouched.
    execute_model(model, noutputs, inputs, &Req::queued(0, Instant::now()), caller)
}

/// Runs one op on the calling worker thread.
pub(super) fn execute(op: &OpKind, inputs: &[Arc<Tensor>], req: &Req, caller: &Caller) -> Result<Tensors> {
    match op {
        OpKind::Model { model, outputs, .. } => execute_model(model, outputs.len(), inputs, req, caller),
        OpKind::Script { script, function, style, keys, args, outputs, .. } => {
            let refs: Vec<&Tensor> = inputs.iter().map(|t| t.as_ref()).collect();
            let start = Instant::now();
            let call = ScriptRequest {
                function,
                style: *style,
                tensors: &refs,
                keys,
                args,
                caller,
                deadline: start + CONFIG.read().execution_limit(),
            };
            let mut copy_us = 0;
            let result = match script.loaded().and_then(|s| s.execute(&call)) {
                Ok(report) => {
                    copy_us = report.copy_us;
                    Ok(report.outputs)
                }
                // A function run for its side effects (`redis.execute`) may return nothing, as in RedisAI.
                Err(Error::NonTensorResult(_)) if outputs.is_empty() => Ok(Vec::new()),
                Err(e) => Err(e),
            }
            .and_then(|outs| {
                // No OUTPUTS: the results are dropped (scripts run for their side effects), as in RedisAI.
                if outputs.is_empty() {
                    Ok(Vec::new())
                } else if outs.len() == outputs.len() {
                    Ok(outs)
                } else {
                    Err(Error::Backend(format!(
                        "Function returned unexpected number of outputs - {}",
                        String::from_utf8_lossy(function)
                    )))
                }
            });
            let end = Instant::now();
            let micros = end.saturating_duration_since(start).as_micros() as u64;
            match &result {
                // Scripts report no samples (AI.INFO shows -1).
                Ok(_) => script.stats.record_success(micros as i64, 0),
                Err(_) => script.stats.record_error(),
            }
            if stats::detailed() {
                script.stats.detail.record_execution(1, window_of(end));
                record_detail(&script.stats, &result, req, micros.saturating_sub(copy_us), copy_us, end);
            }
            Ok(result?.into_iter().map(Arc::new).collect())
        }
    }
}
