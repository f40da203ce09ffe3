//! Time a worker spends copying a run's inputs into a backend and its outputs out (AI.INFO's `copy_*`): the
//! backends wrap their conversions in `copying()`, and the run takes the sum after the backend returns. One
//! counter per thread, so no lock and no allocation; a run is on one thread from start to end.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static COPY_NS: Cell<u64> = const { Cell::new(0) };
}

/// Counts the time until it is dropped as copying.
pub struct Copying(Instant);

pub fn copying() -> Copying {
    Copying(Instant::now())
}

impl Drop for Copying {
    fn drop(&mut self) {
        let ns = self.0.elapsed().as_nanos() as u64;
        COPY_NS.with(|c| c.set(c.get().saturating_add(ns)));
    }
}

/// Puts back copying time taken out by `take_us` (a nested run keeps the outer run's count).
pub fn add_us(us: u64) {
    COPY_NS.with(|c| c.set(c.get().saturating_add(us.saturating_mul(1000))));
}

/// Runs `f` and gives its copying time (µs) besides its result, apart from this thread's count, which is as
/// before `f` (a caller that wants both adds it back with `add_us`).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let outer = COPY_NS.with(|c| c.replace(0));
    let result = f();
    let inner = COPY_NS.with(|c| c.replace(outer));
    (result, inner / 1000)
}

/// The copying time counted on this thread since the last call, in µs (and restarts the count).
pub fn take_us() -> u64 {
    COPY_NS.with(|c| c.replace(0)) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_the_guards_cover() {
        take_us();
        {
            let _c = copying();
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        // Not counted: far longer than the guarded part could be stretched by a busy machine.
        std::thread::sleep(std::time::Duration::from_millis(60));
        let us = take_us();
        assert!((3000..60_000).contains(&us), "{us}");
        assert_eq!(take_us(), 0);
    }

    #[test]
    fn measure_reports_its_part_apart() {
        take_us();
        add_us(1000);
        let ((), inner) = measure(|| {
            let _c = copying();
            std::thread::sleep(std::time::Duration::from_millis(3));
        });
        assert!((3000..60_000).contains(&inner), "{inner}");
        assert_eq!(take_us(), 1000, "the enclosing count is left as it was");
    }
}
