//! Runs posted without waiting (docs/design.md, "Isolated execution"): Redis's main thread writes a short run's
//! request to a posted lane of its worker, rings the worker's bell, and goes on with the next command while the
//! client is blocked. One thread of the worker serves the posted lanes and writes an eventfd once it has
//! answered ~10 µs of runs (worker.rs, `SIGNAL_AFTER_US`) or all it found; the main thread collects the
//! answers when that eventfd is readable and before Redis sleeps. No thread on either side waits for one
//! request, and the worker's thread is woken once per burst, not per run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::lane::{self, Lane};
use super::supervisor::Process;
use super::wire::{self, Reader, Writer};
use crate::backends::{PostDone, Posted};

/// Set once Redis's event loop watches the eventfd (`enable`); nothing is posted before.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Posting starts: the eventfd is watched by Redis's event loop, and `collect` runs before Redis sleeps.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

struct Pending {
    process: Arc<Process>,
    lane: Lane,
    late: Late,
    /// How long the worker's posted thread may go without answering any run before this one is late (its limit).
    each: Duration,
    /// `None` once given up on.
    done: Option<PostDone>,
}

/// What to do about a posted run its worker has not answered in time. The time is pushed back while the worker's
/// posted thread keeps answering other runs (`collect`): it runs them one after another, each within its own
/// limit, so a run waiting behind others there is not stuck, and giving up on it would only run it twice (and
/// count a slow run against its model: with 50 clients of a tiny model on a busy machine, the queue then took
/// 0.5-1 % of the runs; docs/benchmarks.md, stop 40).
pub enum Late {
    /// Queue it instead, once this has passed (as an inline run that waits on its lane gives up at its
    /// deadline); its lane comes back once the worker has answered.
    GiveUp(Instant),
    /// Kill the worker once this has passed (the run overran its kill switch: stuck in the backend); the run
    /// then fails with the kill switch's error.
    Kill(Instant),
    Killed,
}

impl Late {
    /// Not before `at`: the worker was seen answering.
    fn not_before(&mut self, at: Instant) {
        if let Late::GiveUp(t) | Late::Kill(t) = self {
            *t = (*t).max(at);
        }
    }
}

/// The posted runs not yet collected (touched by the main thread only; a lock, as statics need).
static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());

/// Posts a model run: `write` writes its request on a posted lane of `process`; `done` gets the answer on
/// the main thread (`collect`), or `NotPosted` at once. `late` applies once the worker has also answered
/// nothing for `each`.
pub fn post(
    process: &Arc<Process>,
    (late, each): (Late, Duration),
    write: impl FnOnce(&mut Writer<Lane>),
    done: PostDone,
) {
    let notify = match super::notifier::notifier() {
        Some(fd) if ENABLED.load(Ordering::Acquire) => fd,
        _ => return done(Posted::NotPosted),
    };
    let Ok(mut lane) = process.posted_lane(notify) else { return done(Posted::NotPosted) };
    if super::request::write_request(process, &mut lane, write).is_err() || lane.pass(lane::REQUEST).is_err() {
        process.give_posted(lane);
        return done(Posted::NotPosted);
    }
    if DEFERRING.load(Ordering::Relaxed) {
        let mut r = TO_RING.lock();
        if !r.iter().any(|p| Arc::ptr_eq(p, process)) {
            r.push(process.clone());
        }
    } else {
        process.ring();
    }
    PENDING.lock().push(Pending { process: process.clone(), lane, late, each, done: Some(done) });
}

/// Whether posts ring their worker's bell later (`ring_deferred`): from the time Redis wakes until it is about to
/// sleep again. The workers' posted threads then sleep while the main thread reads a burst of commands and take
/// the burst in one sweep once it is posted, instead of being woken (and polling) per run on the core the main
/// thread, the clients and the other threads share (docs/benchmarks.md, "Isolated execution").
static DEFERRING: AtomicBool = AtomicBool::new(false);
/// The workers whose bell a deferred post still has to ring (main thread only).
static TO_RING: Mutex<Vec<Arc<Process>>> = Mutex::new(Vec::new());

/// Redis woke (main thread, its event loop's after-sleep): posts until `ring_deferred` ring their bells then.
pub fn defer_rings() {
    DEFERRING.store(true, Ordering::Relaxed);
}

/// Redis is about to sleep (main thread, after `collect`): rings the bells that posts since it woke deferred, and
/// has later posts ring at once (commands Redis runs after the hook, such as a pipelined client's next one).
pub fn ring_deferred() {
    DEFERRING.store(false, Ordering::Relaxed);
    for p in TO_RING.lock().drain(..) {
        p.ring();
    }
}

/// Whether posted runs wait for their answer (main thread).
pub fn in_flight() -> bool {
    !PENDING.lock().is_empty()
}

/// Hands each posted run that has an answer (or whose worker died) to its `done`, and each one past its time
/// to give up on as `Stopped` (main thread: before Redis sleeps, and with `drain` when the eventfd is readable).
pub fn collect(drain: bool) {
    if drain {
        super::notifier::drain();
    }
    let mut answered = Vec::new();
    let mut late = Vec::new();
    {
        let mut pending = PENDING.lock();
        if pending.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            if pending[i].lane.state() != lane::REQUEST {
                answered.push(pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        let mut working: smallvec::SmallVec<[&Arc<Process>; 4]> = smallvec::SmallVec::new();
        for a in &answered {
            if !working.iter().any(|w| Arc::ptr_eq(w, &a.process)) {
                working.push(&a.process);
            }
        }
        for p in pending.iter_mut() {
            if working.iter().any(|w| Arc::ptr_eq(w, &p.process)) {
                p.late.not_before(now + p.each);
            }
            match p.late {
                Late::GiveUp(at) if now > at => late.extend(p.done.take()),
                Late::Kill(at) if now > at => {
                    p.late = Late::Killed;
                    p.process.kill();
                }
                _ => {}
            }
        }
    }
    for done in late {
        done(Posted::Stopped);
    }
    for mut p in answered {
        let outcome = match p.late {
            Late::Killed => Posted::Ran(Err(super::request::killed_at_kill_switch())),
            _ => read(&p.process, &mut p.lane),
        };
        p.process.give_posted(p.lane);
        if let Some(done) = p.done {
            done(outcome);
        }
    }
}

fn read(process: &Process, lane: &mut Lane) -> Posted {
    match lane.state() {
        lane::REPLY => {}
        lane::DEAD => return Posted::Ran(Err(process.exit_error())),
        _ => return Posted::Ran(Err(lane::broken())),
    }
    let (map, len) = match lane.message() {
        Ok(m) => m,
        Err(e) => return Posted::Ran(Err(e)),
    };
    let mut r = Reader::new(&map.data()[..len]);
    if r.peek() == Some(wire::STOPPED) {
        return Posted::Stopped;
    }
    Posted::Ran(r.status().and_then(|()| super::request::read_run(&mut r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_pushes_lateness_back_never_forward() {
        let now = Instant::now();
        let later = now + Duration::from_millis(5);
        let mut l = Late::GiveUp(now);
        l.not_before(later);
        assert!(matches!(l, Late::GiveUp(t) if t == later));
        let mut l = Late::Kill(later);
        l.not_before(now);
        assert!(matches!(l, Late::Kill(t) if t == later));
        let mut l = Late::Killed;
        l.not_before(later);
        assert!(matches!(l, Late::Killed));
    }
}
