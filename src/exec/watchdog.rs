//! The kill switch's clock: callbacks that fire once a deadline passes (MODEL_EXECUTION_TIMEOUT). One
//! thread sleeps on a condition variable until the earliest deadline; nothing polls.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

type Callback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    next_id: u64,
    /// Registered deadlines `(id, deadline, callback)`: a few at a time (one per running model), kept in a
    /// vector whose capacity stays, so that registering a run allocates nothing but its callback.
    items: Vec<(u64, Instant, Callback)>,
    started: bool,
    /// When the watchdog thread wakes next (None: it sleeps until notified). A new deadline later than this
    /// needs no wake-up, so the common case (every run has the same limit) costs no context switch.
    wake_at: Option<Instant>,
    sleeping: bool,
    /// While short deadlines keep coming (inline runs' millisecond limits), the thread wakes every `TICK`
    /// until then instead of being woken for each: a wake-up per inline run would cost the main thread a
    /// futex call, more than the run itself.
    tick_until: Option<Instant>,
}

/// A deadline this close is short (an inline run's), and puts the thread in ticking mode for `TICK_FOR`.
const SHORT: Duration = Duration::from_millis(20);
const TICK: Duration = Duration::from_millis(1);
const TICK_FOR: Duration = Duration::from_millis(200);

struct Watchdog {
    state: Mutex<State>,
    cv: Condvar,
}

static WATCHDOG: LazyLock<Arc<Watchdog>> =
    LazyLock::new(|| Arc::new(Watchdog { state: Mutex::new(State::default()), cv: Condvar::new() }));

/// A registered deadline; dropping it (the run finished in time) cancels the callback.
pub struct Watch(u64);

impl Drop for Watch {
    fn drop(&mut self) {
        let mut st = WATCHDOG.state.lock();
        let cancelled = st.items.iter().position(|(id, _, _)| *id == self.0).map(|i| st.items.swap_remove(i));
        drop(st);
        // The callback (and what it holds) is dropped outside the lock.
        drop(cancelled);
    }
}

/// Calls `on_expiry` once if `deadline` passes before the returned `Watch` is dropped.
pub fn watch(deadline: Instant, on_expiry: impl FnOnce() + Send + 'static) -> Watch {
    let dog = WATCHDOG.clone();
    let mut st = dog.state.lock();
    st.next_id += 1;
    let id = st.next_id;
    st.items.push((id, deadline, Box::new(on_expiry)));
    if !st.started {
        let worker = dog.clone();
        st.started = std::thread::Builder::new().name("ai:watchdog".into()).spawn(move || worker.run()).is_ok();
    }
    let now = Instant::now();
    if deadline.saturating_duration_since(now) < SHORT {
        st.tick_until = Some(st.tick_until.map_or(now + TICK_FOR, |t| t.max(now + TICK_FOR)));
    }
    let wake = st.sleeping && st.wake_at.is_none_or(|w| deadline < w);
    drop(st);
    if wake {
        dog.cv.notify_one();
    }
    Watch(id)
}

impl Watchdog {
    fn run(&self) {
        let mut st = self.state.lock();
        loop {
            let now = Instant::now();
            let due: Vec<Callback> = st.items.extract_if(.., |(_, d, _)| *d <= now).map(|(_, _, cb)| cb).collect();
            if !due.is_empty() {
                drop(st);
                for cb in due {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb));
                }
                st = self.state.lock();
                continue;
            }
            let tick = st.tick_until.filter(|&t| t > now).map(|_| now + TICK);
            st.wake_at = st.items.iter().map(|(_, d, _)| *d).chain(tick).min();
            st.sleeping = true;
            match st.wake_at {
                Some(d) => {
                    self.cv.wait_until(&mut st, d);
                }
                None => self.cv.wait(&mut st),
            }
            st.sleeping = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn fires_expired_and_not_cancelled() {
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let _late = watch(Instant::now() + Duration::from_millis(20), move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let f = fired.clone();
        let cancelled = watch(Instant::now() + Duration::from_millis(20), move || {
            f.fetch_add(100, Ordering::SeqCst);
        });
        drop(cancelled);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}
