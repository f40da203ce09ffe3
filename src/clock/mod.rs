//! Clocks that both the backends and the engine use, below both: the kill switch's deadlines (watchdog) and
//! the per-thread copy clock. A leaf: imports nothing of the crate.

pub mod copy_clock;
pub mod watchdog;
