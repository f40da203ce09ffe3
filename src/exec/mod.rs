//! The execution engine: every execution is a DAG plan, run by per-device queues.

pub mod batch;
pub mod dag;
pub mod inline;
pub mod lazy_free;
pub mod queue;
pub mod run;
pub mod watchdog;

use std::sync::OnceLock;

/// The module's device queues, sized by THREADS_PER_QUEUE (fixed at load time) on first use.
pub fn queues() -> &'static queue::Queues {
    static QUEUES: OnceLock<queue::Queues> = OnceLock::new();
    QUEUES.get_or_init(|| queue::Queues::new(crate::config::CONFIG.read().threads_per_queue))
}
