//! The execution engine: every execution is a DAG plan, run by per-device queues.

pub mod batch;
pub mod copy_clock;
pub mod dag;
pub mod deferred;
pub mod inline;
pub mod lazy_free;
pub mod queue;
pub mod run;
pub mod watchdog;

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// The module's device queues, sized by THREADS_PER_QUEUE (fixed at load time) on first use.
pub fn queues() -> &'static queue::Queues {
    static QUEUES: OnceLock<queue::Queues> = OnceLock::new();
    QUEUES.get_or_init(|| queue::Queues::new(crate::config::CONFIG.read().threads_per_queue))
}

/// The queue of `device` (upper-cased device string), created with its workers on first use.
pub fn queue_of(device: &str) -> Result<Arc<queue::Queue>> {
    queues().get(device).map_err(queue_unavailable)
}

/// RedisAI's error when a device's queue cannot be made (too many queues, or its threads would not start).
pub fn queue_unavailable(_: std::io::Error) -> Error {
    Error::Generic("Could not initialize queue on requested device".into())
}
