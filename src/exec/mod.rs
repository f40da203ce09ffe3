//! The execution engine: every execution is a DAG plan, run by per-device queues.

pub mod batch;
pub mod dag;
pub mod deferred;
pub mod inline;
pub mod lazy_free;
pub mod op;
pub mod queue;
pub mod run;

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// A device queue of run entries.
pub type DeviceQueue = queue::Queue<run::Entry>;

/// The module's device queues, sized by THREADS_PER_QUEUE (fixed at load time) on first use.
pub fn queues() -> &'static queue::Queues<run::Entry> {
    static QUEUES: OnceLock<queue::Queues<run::Entry>> = OnceLock::new();
    QUEUES.get_or_init(|| queue::Queues::new(crate::config::CONFIG.read().threads_per_queue))
}

/// The queue of `device` (upper-cased device string), created with its workers on first use.
pub fn queue_of(device: &str) -> Result<Arc<DeviceQueue>> {
    queues().get(device).map_err(queue_unavailable)
}

/// The queue of a model's device (created, with its workers, on first use), remembered in the model: every
/// request needs it, and queues live as long as the module.
pub fn model_queue(model: &crate::model::Model) -> Result<&'static Arc<DeviceQueue>> {
    let slot = match model.queue_slot.get() {
        Some(&slot) => slot,
        None => {
            let slot = queues().number(&model.spec.device.queue_key()).map_err(queue_unavailable)?;
            *model.queue_slot.get_or_init(|| slot)
        }
    };
    queues().at(slot).ok_or_else(|| queue_unavailable(std::io::Error::other("no such queue")))
}

/// Makes the queue of every op of `plan` (a model's through `model_queue`, remembered in the model), so that a
/// device that cannot get one fails the request before anything is queued.
pub fn ensure_queues(plan: &dag::Plan) -> Result<()> {
    for op in &plan.ops {
        match &op.kind {
            dag::OpKind::Model { model, .. } => model_queue(model).map(drop)?,
            dag::OpKind::Script { .. } => queue_of(&op.device).map(drop)?,
        }
    }
    Ok(())
}

/// RedisAI's error when a device's queue cannot be made (too many queues, or its threads would not start).
pub fn queue_unavailable(_: std::io::Error) -> Error {
    Error::Unavailable("Could not initialize queue on requested device".into())
}
