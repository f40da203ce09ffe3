//! The kill switch's clock: callbacks that fire once a deadline passes (MODEL_EXECUTION_TIMEOUT). One
//! thread sleeps on a condition variable until the earliest deadline; nothing polls.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// What a deadline stops: `expire(tag)` is called once if the deadline passes first. A shared object and a tag
/// rather than a boxed closure, so that registering a run allocates nothing (an inline run registers one).
pub trait Expire: Send + Sync {
    fn expire(&self, tag: u64);
}

type Callback = (Arc<dyn Expire>, u64);

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

static WATCHDOG: LazyLock<Watchdog> =
    LazyLock::new(|| Watchdog { state: Mutex::new(State::default()), cv: Condvar::new() });

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

/// Calls `target.expire(tag)` once if `deadline` passes before the returned `Watch` is dropped. `now`: the
/// caller's current time (it has just read the clock).
pub fn watch(now: Instant, deadline: Instant, target: Arc<dyn Expire>, tag: u64) -> Watch {
    let dog: &'static Watchdog = &WATCHDOG;
    let mut st = dog.state.lock();
    st.next_id += 1;
    let id = st.next_id;
    st.items.push((id, deadline, (target, tag)));
    if !st.started {
        st.started = std::thread::Builder::new().name("ai:watchdog".into()).spawn(move || dog.run()).is_ok();
    }
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
                for (target, tag) in due {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.expire(tag)));
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

    struct Count(AtomicUsize);

    impl Expire for Count {
        fn expire(&self, tag: u64) {
            self.0.fetch_add(tag as usize, Ordering::SeqCst);
        }
    }

    #[test]
    fn fires_expired_and_not_cancelled() {
        let fired = Arc::new(Count(AtomicUsize::new(0)));
        let now = Instant::now();
        let _late = watch(now, now + Duration::from_millis(20), fired.clone(), 1);
        let cancelled = watch(now, now + Duration::from_millis(20), fired.clone(), 100);
        drop(cancelled);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(fired.0.load(Ordering::SeqCst), 1);
    }
}
