//! A request's framing on a lane, shared by the runs that wait on a lane (proxy.rs) and the posted ones
//! (post.rs): the ids of the models and scripts the worker may free come first, then the request; a run's
//! answer is its copy time, its time in the worker and its outputs.

use super::lane::Lane;
use super::supervisor::Process;
use super::wire::{Reader, Writer};
use crate::backends::RunReport;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The error of a run whose worker was killed because it overran the run's kill switch.
pub fn killed_at_kill_switch() -> Error {
    Error::TimedOut {
        text: "the backend worker did not stop at MODEL_EXECUTION_TIMEOUT and was killed".into(),
        prefixed: true,
    }
}

/// Writes a request on the lane, after the ids of the models and scripts the worker may free (they are kept for
/// the next request when this one cannot be written).
pub fn write_request(process: &Process, lane: &mut Lane, write: impl FnOnce(&mut Writer<Lane>)) -> Result<()> {
    let to_free = std::mem::take(&mut *process.to_free.lock());
    let written = lane.start().and_then(|()| {
        let mut w = Writer(&mut *lane);
        w.list(&to_free, |w, id| {
            w.u64(*id);
        });
        write(&mut w);
        lane.written()
    });
    if written.is_err() {
        process.to_free.lock().extend(to_free);
    }
    written
}

/// A run's answer: its copy time, how long the run took in the worker, its outputs.
pub fn read_outputs(r: &mut Reader) -> Result<(u64, u64, Vec<Tensor>)> {
    Ok((r.u64()?, r.u64()?, r.tensors()?))
}

/// A model run's answer.
pub fn read_run(r: &mut Reader) -> Result<RunReport> {
    let (copy_us, run_us, outputs) = read_outputs(r)?;
    Ok(RunReport { outputs: outputs.into_iter().collect(), copy_us, run_us: Some(run_us) })
}
