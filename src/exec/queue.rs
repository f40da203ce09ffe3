//! Device queues: a deque of run entries and a condition variable, served by N worker threads that
//! sleep until work arrives (an idle module uses no CPU). Generic over what is queued (`Job`: a run's entry,
//! exec/run.rs), so that this file does not depend on runs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex, RwLock};

use std::time::{Duration, Instant};

use super::batch::{take_work, Queued, Work};
use crate::histogram::Histogram;

/// How long a worker that ran out of work polls its queue before it sleeps, when nothing says more work is on its
/// way (no other run in flight, `Job::quiet`, and Redis's main thread queued at most one run in its last
/// event-loop iteration that queued any, `MAIN_BURST`): the next request of a lone client that waits for each
/// answer usually arrives within it and finds the worker awake (a sleeping worker's wake-up was 30-44 µs of its
/// queue wait on 2 vCPUs: a TF run's p50 from one client went 195-207 -> 162 µs). When the main thread queues
/// several runs per iteration it is the bottleneck, and a polling worker took a core it needed (50 clients of a
/// tiny model, queued: 8-16 % fewer requests/s); the workers then sleep until the iteration's wake-up. An idle
/// queue's workers poll once, after their last work, and then sleep.
const POLL: Duration = Duration::from_micros(100);

/// Runs the main thread queued in its last event-loop iteration that queued any (`flush_wakeups`).
static MAIN_BURST: AtomicUsize = AtomicUsize::new(0);

/// What a queue holds and how a worker runs it.
pub trait Job: Queued + Send + Sized + 'static {
    /// Called as it goes on its queue.
    fn mark_queued(&mut self);
    /// Runs its next step.
    fn step(self);
    /// Runs the next steps of several as one batch (same model, compatible inputs: `Queued::batch_key`).
    fn step_batch(jobs: Vec<Self>);
    /// No job of its kind is in flight anywhere (see `POLL`).
    fn quiet() -> bool;
}

pub struct Queue<J> {
    pub name: String,
    deque: Mutex<VecDeque<J>>,
    cv: Condvar,
    /// Each worker's CPU-time clock, in creation order (INFO's `ai_queue_<DEV>_bthread_n<i>_used_cpu_total`).
    clocks: Mutex<Vec<libc::clockid_t>>,
    /// On the deferred list of the thread that pushed (see `defer_wakeups_on_this_thread`).
    wake_pending: AtomicBool,
    /// How long entries waited here before a worker took them (INFO's `ai_queue_<DEV>_wait_*`).
    pub waits: Histogram,
    /// Workers running an op or a batch now.
    busy: AtomicUsize,
    /// Entries pushed so far: what a polling worker watches (`next_work`) without taking the lock.
    pushed: AtomicUsize,
}

/// A queue whose workers a deferred push still has to wake (`flush_wakeups`), whatever it holds.
trait Wake: Send + Sync {
    fn wake_deferred(&self);
}

thread_local! {
    static DEFER: Cell<bool> = const { Cell::new(false) };
    /// Runs this (main) thread queued since its last `flush_wakeups`.
    static PUSHES: Cell<usize> = const { Cell::new(0) };
    static DEFERRED: RefCell<Vec<Arc<dyn Wake>>> = const { RefCell::new(Vec::new()) };
}

/// From now on, work pushed by the calling thread (Redis's main thread) wakes the workers only at
/// `flush_wakeups`, which Redis calls before its event loop sleeps: one wake-up per queue and loop iteration
/// instead of one per command (each wake-up is a futex call and, on a busy machine, a context switch of the
/// main thread).
pub fn defer_wakeups_on_this_thread() {
    DEFER.with(|d| d.set(true));
}

/// Wakes the workers of every queue the calling thread pushed to since the last call.
pub fn flush_wakeups() {
    let pushes = PUSHES.with(|p| p.replace(0));
    if pushes > 0 {
        MAIN_BURST.store(pushes, Ordering::Relaxed);
    }
    let queues = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    for q in &queues {
        q.wake_deferred();
    }
    // Keep the list's capacity for the next iteration.
    DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_empty() {
            let mut queues = queues;
            queues.clear();
            *d = queues;
        }
    });
}

/// The CPU-time clock of the calling thread.
fn thread_cpu_clock(thread: libc::pthread_t) -> Option<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` is a live thread (just spawned, never joined: workers run until exit); the call only
    // writes `clock`.
    (unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } == 0).then_some(clock)
}

/// CPU time consumed so far by the thread owning `clock`, in seconds and microseconds.
fn cpu_time(clock: libc::clockid_t) -> Option<(i64, i64)> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes `ts`; a clock of a thread that exited just yields an error.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then_some((ts.tv_sec, ts.tv_nsec / 1000))
}

impl<J: Job> Wake for Queue<J> {
    fn wake_deferred(&self) {
        self.wake_pending.store(false, Ordering::Release);
        match self.len() {
            0 => {}
            1 => {
                self.cv.notify_one();
            }
            _ => {
                self.cv.notify_all();
            }
        }
    }
}

impl<J: Job> Queue<J> {
    /// Puts an entry that has not started (or that waited for inputs) at the back.
    pub fn push_back(self: &Arc<Self>, mut e: J) {
        e.mark_queued();
        self.deque.lock().push_back(e);
        self.signal();
    }

    /// Puts an entry that just made progress at the front, so its next op runs without waiting behind others.
    pub fn push_front(self: &Arc<Self>, mut e: J) {
        e.mark_queued();
        self.deque.lock().push_front(e);
        self.signal();
    }

    /// An entry was pushed: counted for polling workers, and its queue's workers woken (or to be).
    fn signal(self: &Arc<Self>) {
        self.pushed.fetch_add(1, Ordering::Release);
        if DEFER.with(Cell::get) {
            PUSHES.with(|p| p.set(p.get() + 1));
            if !self.wake_pending.swap(true, Ordering::AcqRel) {
                DEFERRED.with(|d| d.borrow_mut().push(self.clone() as Arc<dyn Wake>));
            }
        } else {
            self.cv.notify_one();
        }
    }

    pub fn len(&self) -> usize {
        self.deque.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next work, sleeping on the condition variable until there is some: woken by a push, or at
    /// the earliest MINBATCHTIMEOUT / TIMEOUT of a batch that is still waiting for requests.
    fn next_work(&self) -> Work<J> {
        let mut q = self.deque.lock();
        let mut polled = false;
        loop {
            let (work, wake_at) = take_work(&mut q, Instant::now());
            if let Some(w) = work {
                return w;
            }
            match wake_at {
                Some(t) => {
                    self.cv.wait_until(&mut q, t);
                }
                None if !polled && MAIN_BURST.load(Ordering::Relaxed) <= 1 && J::quiet() => {
                    polled = true;
                    let seen = self.pushed.load(Ordering::Acquire);
                    parking_lot::MutexGuard::unlocked(&mut q, || {
                        let start = Instant::now();
                        while self.pushed.load(Ordering::Acquire) == seen && start.elapsed() < POLL {
                            std::hint::spin_loop();
                        }
                    });
                }
                None => self.cv.wait(&mut q),
            }
        }
    }

    /// `(worker number from 1, "seconds.micros")` for every worker of this queue.
    pub fn worker_cpu(&self) -> Vec<(usize, String)> {
        self.clocks
            .lock()
            .iter()
            .enumerate()
            .map(|(i, &c)| (i + 1, cpu_time(c).map_or("N/A".into(), |(s, us)| format!("{s}.{us:06}"))))
            .collect()
    }

    /// Nothing waiting in the queue: a request may run inline without overtaking anything. (A worker may still
    /// be busy: with another client's run, or finishing the one whose reply brought this very request, so
    /// counting busy workers kept a client that sends one request after another off the main thread.)
    pub fn is_idle(&self) -> bool {
        self.deque.lock().is_empty()
    }

    /// Workers of this queue running something now.
    pub fn busy_workers(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    fn work(self: Arc<Self>) {
        loop {
            let work = self.next_work();
            self.busy.fetch_add(1, Ordering::Relaxed);
            // Ops catch their own panics; this only guards the bookkeeping around them.
            let done = catch_unwind(AssertUnwindSafe(|| match work {
                Work::One(e) => e.step(),
                Work::Batch(es) => J::step_batch(es),
            }));
            self.busy.fetch_sub(1, Ordering::Relaxed);
            if done.is_err() {
                crate::log::warning(&format!("redisai: a worker of queue {} panicked outside an op", self.name));
            }
        }
    }
}

/// Most distinct device queues (`CPU`, `CPU:1`, `GPU:0` … each is one).
pub const MAX_QUEUES: usize = 128;

/// All device queues, created on first use.
pub struct Queues<J> {
    threads_per_queue: usize,
    /// Few (one per device string in use), looked up on every request: a short list scans faster than a hash
    /// map hashes.
    map: RwLock<Vec<Arc<Queue<J>>>>,
    /// The same queues by number, in creation order, readable without a lock (`at`): a model keeps its
    /// queue's number (`Model::queue_slot`).
    slots: [OnceLock<Arc<Queue<J>>>; MAX_QUEUES],
    workers: AtomicUsize,
}

impl<J: Job> Queues<J> {
    pub fn new(threads_per_queue: usize) -> Queues<J> {
        Queues {
            threads_per_queue: threads_per_queue.max(1),
            map: RwLock::new(Vec::new()),
            slots: std::array::from_fn(|_| OnceLock::new()),
            workers: AtomicUsize::new(0),
        }
    }

    /// The queue numbered `slot` (see `number`).
    pub fn at(&self, slot: usize) -> Option<&Arc<Queue<J>>> {
        self.slots.get(slot)?.get()
    }

    /// The number of the queue of `device`, creating it as `get` does.
    pub fn number(&self, device: &str) -> std::io::Result<usize> {
        self.get(device)?;
        Ok(self.map.read().iter().position(|q| q.name == device).unwrap_or(usize::MAX))
    }

    /// The queue of `device` (upper-cased device string), starting its workers if it is new. Queues live
    /// as long as the module, so their number is capped (each has THREADS_PER_QUEUE threads).
    pub fn get(&self, device: &str) -> std::io::Result<Arc<Queue<J>>> {
        if let Some(q) = self.map.read().iter().find(|q| q.name == device) {
            return Ok(q.clone());
        }
        let mut map = self.map.write();
        if let Some(q) = map.iter().find(|q| q.name == device) {
            return Ok(q.clone());
        }
        if map.len() >= MAX_QUEUES {
            return Err(std::io::Error::other("too many device queues"));
        }
        let q = Arc::new(Queue {
            name: device.to_string(),
            deque: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            clocks: Mutex::new(Vec::new()),
            wake_pending: AtomicBool::new(false),
            waits: Histogram::default(),
            busy: AtomicUsize::new(0),
            pushed: AtomicUsize::new(0),
        });
        for i in 0..self.threads_per_queue {
            let worker = q.clone();
            // Thread names are limited to 15 bytes by Linux; keep the device visible in `top -H`.
            let handle = std::thread::Builder::new().name(format!("ai:{device}:{i}")).spawn(move || worker.work())?;
            // Registered by the spawner, so that INFO right after the queue's creation lists every worker.
            if let Some(clock) = thread_cpu_clock(std::os::unix::thread::JoinHandleExt::as_pthread_t(&handle)) {
                q.clocks.lock().push(clock);
            }
            self.workers.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self.slots[map.len()].set(q.clone());
        map.push(q.clone());
        Ok(q)
    }

    /// Worker threads over all queues.
    pub fn worker_count(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    /// Every queue, by name.
    pub fn all(&self) -> Vec<Arc<Queue<J>>> {
        let mut v: Vec<Arc<Queue<J>>> = self.map.read().clone();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn threads_per_queue(&self) -> usize {
        self.threads_per_queue
    }
}
