//! Device queues: a deque of run entries and a condition variable, served by N worker threads that
//! sleep until work arrives (an idle module uses no CPU).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::run::Entry;

pub struct Queue {
    pub name: String,
    deque: Mutex<VecDeque<Entry>>,
    cv: Condvar,
    /// Each worker's CPU-time clock, in creation order (INFO's `ai_queue_<DEV>_bthread_n<i>_used_cpu_total`).
    clocks: Mutex<Vec<libc::clockid_t>>,
}

/// The CPU-time clock of the calling thread.
fn thread_cpu_clock() -> Option<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: pthread_self() is the calling thread; the call only writes `clock`.
    (unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0).then_some(clock)
}

/// CPU time consumed so far by the thread owning `clock`, in seconds and microseconds.
fn cpu_time(clock: libc::clockid_t) -> Option<(i64, i64)> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes `ts`; a clock of a thread that exited just yields an error.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then_some((ts.tv_sec, ts.tv_nsec / 1000))
}

impl Queue {
    /// Puts an entry that has not started (or that waited for inputs) at the back.
    pub fn push_back(&self, e: Entry) {
        self.deque.lock().push_back(e);
        self.cv.notify_one();
    }

    /// Puts an entry that just made progress at the front, so its next op runs without waiting behind others.
    pub fn push_front(&self, e: Entry) {
        self.deque.lock().push_front(e);
        self.cv.notify_one();
    }

    pub fn len(&self) -> usize {
        self.deque.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn pop_blocking(&self) -> Entry {
        let mut q = self.deque.lock();
        loop {
            if let Some(e) = q.pop_front() {
                return e;
            }
            self.cv.wait(&mut q);
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

    fn work(self: Arc<Self>) {
        if let Some(clock) = thread_cpu_clock() {
            self.clocks.lock().push(clock);
        }
        loop {
            let entry = self.pop_blocking();
            // `step` catches panics of the op itself; this only guards the bookkeeping around it.
            if catch_unwind(AssertUnwindSafe(|| entry.step())).is_err() {
                crate::log::warning(&format!("redisai: a worker of queue {} panicked outside an op", self.name));
            }
        }
    }
}

/// All device queues, created on first use.
pub struct Queues {
    threads_per_queue: usize,
    map: RwLock<HashMap<String, Arc<Queue>>>,
    workers: AtomicUsize,
}

impl Queues {
    pub fn new(threads_per_queue: usize) -> Queues {
        Queues {
            threads_per_queue: threads_per_queue.max(1),
            map: RwLock::new(HashMap::new()),
            workers: AtomicUsize::new(0),
        }
    }

    /// The queue of `device` (upper-cased device string), starting its workers if it is new.
    pub fn get(&self, device: &str) -> std::io::Result<Arc<Queue>> {
        if let Some(q) = self.map.read().get(device) {
            return Ok(q.clone());
        }
        let mut map = self.map.write();
        if let Some(q) = map.get(device) {
            return Ok(q.clone());
        }
        let q = Arc::new(Queue {
            name: device.to_string(),
            deque: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            clocks: Mutex::new(Vec::new()),
        });
        for i in 0..self.threads_per_queue {
            let worker = q.clone();
            // Thread names are limited to 15 bytes by Linux; keep the device visible in `top -H`.
            std::thread::Builder::new().name(format!("ai:{device}:{i}")).spawn(move || worker.work())?;
            self.workers.fetch_add(1, Ordering::Relaxed);
        }
        map.insert(device.to_string(), q.clone());
        Ok(q)
    }

    /// Worker threads over all queues.
    pub fn worker_count(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    /// Every queue, by name.
    pub fn all(&self) -> Vec<Arc<Queue>> {
        let mut v: Vec<Arc<Queue>> = self.map.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn threads_per_queue(&self) -> usize {
        self.threads_per_queue
    }
}
