//! A lane: one shared-memory region (a memfd) between a thread of Redis's process and a thread of a worker,
//! holding one message at a time and a state word that says whose turn it is. A turn passes by storing the
//! state; the other side polls it for a while and then sleeps on it (a futex), and the writer makes the wake-up
//! system call only when the other side sleeps: back-to-back requests cost no system call.
//!
//! Region: a 64-byte header (state, message length, capacity) and the message. The side whose turn it is may
//! grow the region (ftruncate the memfd, map it again); the other maps the new size when its turn comes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The state word's values. Redis's turn: `IDLE`, `REPLY`, `CALLBACK`; the worker's: `REQUEST`,
/// `CALLBACK_REPLY`; `DEAD` ends the lane (its worker is gone).
pub const IDLE: u32 = 0;
pub const REQUEST: u32 = 1;
pub const REPLY: u32 = 2;
pub const CALLBACK: u32 = 3;
pub const CALLBACK_REPLY: u32 = 4;
pub const DEAD: u32 = 5;
/// Set in the state word by a side that sleeps on it: the writer wakes it.
const SLEEPING: u32 = 1 << 31;

const HEADER: usize = 64;
const FIRST_CAPACITY: usize = 64 * 1024;

#[repr(C)]
struct Header {
    state: AtomicU32,
    _pad: u32,
    len: AtomicU64,
    capacity: AtomicU64,
}

/// One mapping of the region; a remap makes a new one, and the old one stays mapped while anything borrows it.
pub struct Mapping {
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain shared memory; concurrent access goes through the header's atomics, and the
// message bytes are only touched by the side whose turn it is.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, size: usize) -> Result<Mapping> {
        // SAFETY: maps `size` bytes of a memfd we hold, shared, at an address the kernel picks.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
        Ok(Mapping { ptr: ptr.cast(), size })
    }
    fn header(&self) -> &Header {
        // SAFETY: every mapping is at least HEADER bytes, page-aligned, and Header is all atomics.
        unsafe { &*(self.ptr as *const Header) }
    }
    /// The message area.
    pub fn data(&self) -> &[u8] {
        // SAFETY: the mapping holds `size` bytes from `ptr`; the area after the header is plain bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.add(HEADER), self.size - HEADER) }
    }
    #[allow(clippy::mut_from_ref)]
    fn data_mut(&self) -> &mut [u8] {
        // SAFETY: only the side whose turn it is writes the message area, and it holds the lane exclusively
        // (`&mut Lane`) while it does.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(HEADER), self.size - HEADER) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; nothing borrows it any more (it is dropped).
        unsafe { libc::munmap(self.ptr.cast(), self.size) };
    }
}

pub fn os_error(what: &str) -> Error {
    Error::Internal(format!("backend worker: {what}: {}", std::io::Error::last_os_error()))
}

/// One side's view of a lane.
pub struct Lane {
    fd: OwnedFd,
    map: Arc<Mapping>,
    /// Bytes written so far of the message being written.
    len: usize,
    /// The region could not grow for the message being written.
    short: bool,
}

impl Lane {
    /// A new lane (Redis's side): its memfd is then handed to the worker.
    pub fn create() -> Result<Lane> {
        let fd = memfd(c"redisai-lane", HEADER + FIRST_CAPACITY)?;
        let map = Arc::new(Mapping::new(&fd, HEADER + FIRST_CAPACITY)?);
        map.header().capacity.store(FIRST_CAPACITY as u64, Ordering::Release);
        Ok(Lane { fd, map, len: 0, short: false })
    }

    /// The worker's view of a lane Redis made.
    pub fn open(fd: OwnedFd) -> Result<Lane> {
        // The header says the region's size (fstat is not allowed in a worker's sandbox).
        let first = Mapping::new(&fd, HEADER)?;
        let cap = first.header().capacity.load(Ordering::Acquire) as usize;
        let map = Arc::new(Mapping::new(&fd, HEADER + cap)?);
        Ok(Lane { fd, map, len: 0, short: false })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn state(&self) -> u32 {
        self.map.header().state.load(Ordering::Acquire) & !SLEEPING
    }

    /// The mapping that holds the current message (remapped first when the other side grew the region).
    pub fn mapping(&mut self) -> Result<Arc<Mapping>> {
        let cap = self.map.header().capacity.load(Ordering::Acquire) as usize;
        if HEADER + cap > self.map.size {
            self.map = Arc::new(Mapping::new(&self.fd, HEADER + cap)?);
        }
        Ok(self.map.clone())
    }

    /// The current message.
    pub fn message(&mut self) -> Result<(Arc<Mapping>, usize)> {
        let map = self.mapping()?;
        let len = map.header().len.load(Ordering::Acquire) as usize;
        if len > map.size - HEADER {
            return Err(Error::Internal("a backend worker sent a malformed message".into()));
        }
        Ok((map, len))
    }

    /// Starts writing a message (the side whose turn it is).
    pub fn start(&mut self) -> Result<()> {
        self.mapping()?;
        self.len = 0;
        self.short = false;
        Ok(())
    }

    fn reserve(&mut self, more: usize) -> Result<()> {
        let need = self.len + more;
        if HEADER + need <= self.map.size {
            return Ok(());
        }
        let cap = need.next_power_of_two().max(2 * (self.map.size - HEADER));
        truncate(&self.fd, HEADER + cap)?;
        let map = Arc::new(Mapping::new(&self.fd, HEADER + cap)?);
        map.data_mut()[..self.len].copy_from_slice(&self.map.data()[..self.len]);
        map.header().capacity.store(cap as u64, Ordering::Release);
        self.map = map;
        Ok(())
    }

    /// Passes the turn: the message written since `start` becomes the other side's, with `state`. Fails (and
    /// passes nothing) when the lane is dead.
    pub fn pass(&mut self, state: u32) -> Result<()> {
        let h = self.map.header();
        h.len.store(self.len as u64, Ordering::Release);
        let mut cur = h.state.load(Ordering::Acquire);
        loop {
            if cur & !SLEEPING == DEAD {
                return Err(dead());
            }
            match h.state.compare_exchange_weak(cur, state, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if cur & SLEEPING != 0 {
            futex_wake(&h.state);
        }
        Ok(())
    }

    /// Waits until the state is no longer `from`, polling for `spin` first, then sleeping; gives the new state,
    /// or `None` once `deadline` has passed.
    pub fn wait(&self, from: u32, spin: Duration, deadline: Option<Instant>) -> Option<u32> {
        wait_word(&self.map.header().state, from, spin, deadline)
    }

    /// The state word, for whoever marks the lane dead from another thread.
    pub fn killer(&self) -> Killer {
        Killer(self.map.clone())
    }
}

/// How long a side polls for the lane's next turn after a run that took `run_us`: its `budget`, but not at all
/// after a run longer than that. Its next turn is that far off anyway, and a thread that polls keeps its core busy
/// just when another worker's thread is woken, so the scheduler queues that one on a core that is already
/// computing (two devices' runs then shared one core for a scheduler tick: docs/benchmarks.md, "Two devices").
pub fn spin_after(run_us: u64, budget: Duration) -> Duration {
    if run_us < budget.as_micros() as u64 {
        budget
    } else {
        Duration::ZERO
    }
}

/// A doorbell: a counter in a region of its own. Redis's main thread rings it after posting requests on lanes
/// that one thread of the worker serves (post.rs); that thread sleeps on it when no lane has a request.
pub struct Bell {
    fd: OwnedFd,
    map: Mapping,
}

impl Bell {
    /// A new bell (Redis's side): its memfd is then handed to the worker.
    pub fn create() -> Result<Bell> {
        Bell::open(memfd(c"redisai-bell", HEADER)?)
    }

    /// The worker's view of a bell Redis made.
    pub fn open(fd: OwnedFd) -> Result<Bell> {
        let map = Mapping::new(&fd, HEADER)?;
        Ok(Bell { fd, map })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The count of rings so far (wrapping).
    pub fn seen(&self) -> u32 {
        self.map.header().state.load(Ordering::Acquire) & !SLEEPING
    }

    /// Counts one ring; wakes the thread sleeping on the bell, if it sleeps.
    pub fn ring(&self) {
        let word = &self.map.header().state;
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let next = (cur & !SLEEPING).wrapping_add(1) & !SLEEPING;
            match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if cur & SLEEPING != 0 {
            futex_wake(word);
        }
    }

    /// Waits until the bell has rung since `seen`, polling for `spin` first.
    pub fn wait(&self, seen: u32, spin: Duration) {
        wait_word(&self.map.header().state, seen, spin, None);
    }
}

/// Marks one lane dead from the thread that saw its worker exit.
pub struct Killer(Arc<Mapping>);

impl Killer {
    pub fn kill(&self) {
        mark_dead(&self.0.header().state);
    }
}

fn mark_dead(state: &AtomicU32) {
    if state.swap(DEAD, Ordering::AcqRel) & SLEEPING != 0 {
        futex_wake(state);
    }
}

pub fn dead() -> Error {
    Error::Unavailable("the backend worker exited".into())
}

/// A lane whose turn word holds what its protocol does not allow there.
pub fn broken() -> Error {
    Error::Internal("a backend worker broke the lane's protocol".into())
}

impl super::wire::Sink for Lane {
    fn put(&mut self, bytes: &[u8]) {
        // A region that cannot grow (the kernel refused memory) marks the message short: `written` says so.
        if self.short || self.reserve(bytes.len()).is_err() {
            self.short = true;
            return;
        }
        self.map.data_mut()[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

impl Lane {
    /// Whether the message written since `start` is whole (a region that could not grow is not).
    pub fn written(&self) -> Result<()> {
        if self.short {
            Err(Error::Refused { text: "a message too large for the backend worker's memory".into(), prefixed: true })
        } else {
            Ok(())
        }
    }
}

/// A new memfd of `size` bytes (Redis's side of a region; the worker gets its descriptor).
fn memfd(name: &std::ffi::CStr, size: usize) -> Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned from here on.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    truncate(&fd, size)?;
    Ok(fd)
}

fn truncate(fd: &OwnedFd, size: usize) -> Result<()> {
    // SAFETY: resizes a memfd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(os_error("ftruncate"));
    }
    Ok(())
}

fn wait_word(word: &AtomicU32, from: u32, spin: Duration, deadline: Option<Instant>) -> Option<u32> {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        let s = word.load(Ordering::Acquire) & !SLEEPING;
        if s != from {
            return Some(s);
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) {
            if start.elapsed() >= spin {
                break;
            }
            // A polling thread gives its core to a thread that waits for one: Redis's main thread otherwise
            // waited for a scheduler slice (up to 4 ms seen) behind a worker thread polling for requests that
            // only the main thread could send (docs/benchmarks.md, stop 40).
            // SAFETY: sched_yield takes no arguments; its result does not matter.
            unsafe { libc::sched_yield() };
        }
        std::hint::spin_loop();
    }
    loop {
        let cur = word.load(Ordering::Acquire);
        if cur & !SLEEPING != from {
            return Some(cur & !SLEEPING);
        }
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                Some(left)
            }
            None => None,
        };
        if cur & SLEEPING == 0
            && word.compare_exchange(cur, cur | SLEEPING, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            continue;
        }
        futex_wait(word, from | SLEEPING, timeout);
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a word of shared memory we map (not PRIVATE: the other side is another process);
    // the kernel compares it with `expected` before sleeping; `tsp` is null or a valid relative timeout.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp, std::ptr::null::<u32>(), 0);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a word of shared memory we map; wakes every sleeper (at most one per side).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<u32>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::Writer;
    use super::*;

    fn peer(lane: &Lane) -> Lane {
        // SAFETY: dup of a descriptor we own, owned by the new lane.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::dup(lane.fd().as_raw_fd())) };
        Lane::open(fd).unwrap()
    }

    #[test]
    fn a_message_crosses_and_the_region_grows_for_a_large_one() {
        let mut redis = Lane::create().unwrap();
        let mut worker = peer(&redis);
        let big = vec![7u8; 3 * FIRST_CAPACITY];
        let t = std::thread::spawn(move || {
            assert_eq!(worker.wait(IDLE, Duration::from_micros(10), None), Some(REQUEST));
            let (map, len) = worker.message().unwrap();
            let got = map.data()[..len].to_vec();
            worker.start().unwrap();
            Writer(&mut worker).bytes(&got[8..]);
            worker.pass(REPLY).unwrap();
            got.len()
        });
        redis.start().unwrap();
        Writer(&mut redis).bytes(&big);
        redis.written().unwrap();
        redis.pass(REQUEST).unwrap();
        assert_eq!(redis.wait(REQUEST, Duration::ZERO, None), Some(REPLY));
        let (map, len) = redis.message().unwrap();
        assert_eq!(super::super::wire::Reader::new(&map.data()[..len]).bytes().unwrap(), &big[..]);
        assert_eq!(t.join().unwrap(), big.len() + 8);
    }

    #[test]
    fn a_bell_wakes_its_sleeper_and_a_ring_before_the_wait_is_not_lost() {
        let bell = Bell::create().unwrap();
        // SAFETY: dup of a descriptor we own, owned by the worker's view.
        let theirs = Bell::open(unsafe { OwnedFd::from_raw_fd(libc::dup(bell.fd().as_raw_fd())) }).unwrap();
        let seen = theirs.seen();
        bell.ring();
        theirs.wait(seen, Duration::ZERO); // rung before: returns at once
        let seen = theirs.seen();
        assert_eq!(seen, 1);
        let t = std::thread::spawn(move || {
            theirs.wait(seen, Duration::ZERO);
            theirs.seen()
        });
        std::thread::sleep(Duration::from_millis(20)); // asleep on the futex by now
        bell.ring();
        assert_eq!(t.join().unwrap(), 2);
    }

    #[test]
    fn a_dead_lane_wakes_its_waiter_and_refuses_the_next_turn() {
        let mut redis = Lane::create().unwrap();
        redis.start().unwrap();
        redis.pass(REQUEST).unwrap();
        let killer = redis.killer();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            killer.kill();
        });
        assert_eq!(redis.wait(REQUEST, Duration::ZERO, None), Some(DEAD));
        t.join().unwrap();
        redis.start().unwrap();
        assert!(redis.pass(REQUEST).is_err());
        let deadline = Some(Instant::now() + Duration::from_millis(5));
        assert_eq!(Lane::create().unwrap().wait(IDLE, Duration::ZERO, deadline), None, "times out");
    }
}
