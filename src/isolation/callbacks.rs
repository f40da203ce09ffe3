//! Redis's side of a script's callbacks: the thread waiting for a run serves the `redis.execute` and
//! `redisAI.model_execute` calls its worker sends on the run's lane, through the functions a backend in this
//! process reaches too (the Redis layer's `script_host`), acting for the run's caller (set on this thread).

use super::lane::Lane;
use super::wire::{self, Reader, Writer};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub type ModelExecute = fn(&[u8], Vec<Tensor>, usize) -> Result<Vec<Tensor>>;

/// What the Redis layer gives to serve callbacks with.
pub struct Host {
    /// `redis.execute`: the command's words in, Redis's reply (RESP2) out.
    pub execute: fn(&[&[u8]]) -> Vec<u8>,
    /// `redisAI.model_execute`: key, inputs, the number of outputs.
    pub model_execute: ModelExecute,
}

static HOST: std::sync::OnceLock<Host> = std::sync::OnceLock::new();

pub fn set_host(host: Host) {
    let _ = HOST.set(host);
}

/// Reads the callback on `lane`, makes it, and writes its answer there, a status first (the caller passes the
/// turn back). Gives the callback's error when the kill switch stopped it (a nested model run that timed out).
pub fn serve(lane: &mut Lane) -> Result<Option<Error>> {
    let answer = answer(lane);
    lane.start()?;
    let mut stopped = None;
    match answer {
        Ok(Ok(resp)) => {
            Writer(&mut *lane).u8(0).bytes(&resp);
        }
        Ok(Err(Ok(ts))) => {
            let refs: Vec<&Tensor> = ts.iter().collect();
            Writer(&mut *lane).u8(0).tensors(&refs);
        }
        Ok(Err(Err(e))) | Err(e) => {
            Writer(&mut *lane).u8(1).error(&e);
            if matches!(e, Error::TimedOut { .. }) {
                stopped = Some(e);
            }
        }
    }
    lane.written()?;
    Ok(stopped)
}

/// A `redis.execute` reply, or a `redisAI.model_execute` result.
type Answer = std::result::Result<Vec<u8>, Result<Vec<Tensor>>>;

fn answer(lane: &mut Lane) -> Result<Answer> {
    let host = HOST.get().ok_or_else(|| Error::Internal("no callback host".into()))?;
    let (map, len) = lane.message()?;
    let mut r = Reader::new(&map.data()[..len]);
    match r.u8()? {
        wire::CALL_REDIS => {
            let words = (0..r.count()?).map(|_| r.bytes()).collect::<Result<Vec<_>>>()?;
            Ok(Ok((host.execute)(&words)))
        }
        wire::CALL_MODEL => {
            let key = r.bytes()?.to_vec();
            let tensors = r.tensors()?;
            let noutputs = r.u64()? as usize;
            drop(map);
            Ok(Err((host.model_execute)(&key, tensors, noutputs)))
        }
        _ => Err(Error::Internal("a backend worker sent an unknown callback".into())),
    }
}
