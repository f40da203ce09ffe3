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

    fn work(self: Arc<Self>) {
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
        let q = Arc::new(Queue { name: device.to_string(), deque: Mutex::new(VecDeque::new()), cv: Condvar::new() });
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

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.map.read().keys().cloned().collect();
        v.sort();
        v
    }

    pub fn threads_per_queue(&self) -> usize {
        self.threads_per_queue
    }
}
