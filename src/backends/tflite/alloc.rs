//! LiteRT's memory, counted and held to BACKEND_MEMORY_LIMIT (`Config::backend_memory_bound`).
//!
//! LiteRT has no allocator hook: it calls `malloc` & co. and `operator new` directly. So once libLiteRt.so
//! is loaded, its calls to them — and only its — are pointed at the wrappers below (`got.rs`). Every block of
//! at least `TRACKED` bytes LiteRT gets is counted (its usable size) in a table of live blocks, and uncounted
//! when it frees it: a table, because LiteRT also frees memory other libraries allocated (strings libstdc++
//! built for its log lines), so counting every free made the count drift down by ~10 KB per compiled model.
//! Smaller blocks are LiteRT's bookkeeping (the 23 allocations of a run of tests/data/tflite_sub_mul.tflite,
//! 8 to 392 bytes); counting them cost ~10% of that model's throughput. A model cannot hold much in them:
//! each of its tensors costs a `TfLiteTensor` (~112 bytes) in one counted array, so what its small tensors
//! hold is less than 5 times that array.
//!
//! The bound: an allocation of at least `LARGE` bytes through `malloc`, `calloc`, `realloc`, `aligned_alloc`,
//! `posix_memalign`, `memalign` or `new (std::nothrow)` that would take the count past the bound is refused
//! (null). That is where sizes taken from a request land — dynamic tensors (FILL, BROADCAST_TO, …), the tensor
//! arena, XNNPACK's buffers, tensor buffers — and LiteRT 2.3.0 checks each of those for null and fails the run
//! cleanly (measured: tests/flow/test_tflite.py). Smaller blocks and `operator new` are never refused (LiteRT
//! does not check small ones, e.g. `TfLiteIntArrayCreate`, and its C API does not catch `std::bad_alloc`): they
//! are counted (from TRACKED bytes up), and when they take the count past the bound the run on that thread is
//! marked, so that its cancellation check stops it before its next op and it fails with the memory error.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::hash::{BuildHasherDefault, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

pub const LIMIT_ERROR: &str = "TFLITE memory limit exceeded, memory allocation failed.";

/// Blocks at least this large may be refused; smaller ones are only counted (see the module comment).
pub const LARGE: usize = 64 * 1024;

/// Blocks at least this large are counted (see the module comment).
pub const TRACKED: usize = 512;

/// Block addresses: aligned, so the low bits carry nothing; one multiply spreads the rest.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = ((n as u64) >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Blocks = HashMap<usize, usize, BuildHasherDefault<AddrHasher>>;
const SHARDS: usize = 16;

/// The count, the bound and the live blocks.
pub struct Budget {
    /// Bytes of live blocks plus reservations of allocations in progress.
    live: AtomicU64,
    /// The bound in bytes (0: none).
    limit: AtomicU64,
    /// Allocations refused at the bound.
    refusals: AtomicU64,
    blocks: [Mutex<Blocks>; SHARDS],
}

/// What `Budget::admit` decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead; `over`: the count is now past the bound (only for blocks that cannot be refused).
    Granted {
        over: bool,
    },
    Refused,
}

impl Budget {
    pub const fn new() -> Budget {
        Budget {
            live: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            blocks: [const { Mutex::new(HashMap::with_hasher(BuildHasherDefault::new())) }; SHARDS],
        }
    }

    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    fn shard(&self, p: usize) -> &Mutex<Blocks> {
        &self.blocks[((p >> 4).wrapping_mul(0x9e37_79b9) >> 7) & (SHARDS - 1)]
    }

    /// Reserves `size` bytes for an allocation about to be made. A refusable one of at least LARGE bytes that
    /// would pass the bound is refused, the check and the addition in one atomic step (two concurrent runs must
    /// not pass the bound together).
    pub fn admit(&self, size: usize, refusable: bool) -> Admit {
        let limit = self.limit.load(Ordering::Relaxed);
        let size = size as u64;
        if limit != 0 && refusable && size >= LARGE as u64 {
            let r = self
                .live
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_add(size).filter(|&t| t <= limit));
            if r.is_err() {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return Admit::Refused;
            }
            return Admit::Granted { over: false };
        }
        let now = self.live.fetch_add(size, Ordering::Relaxed).saturating_add(size);
        Admit::Granted { over: limit != 0 && now > limit }
    }

    /// Turns the reservation of `reserved` bytes into the block `p` of `usable` bytes (`p` 0: the allocation
    /// failed, the reservation is returned).
    pub fn settle(&self, p: usize, reserved: usize, usable: usize) {
        if p != 0 {
            // A block still in the table at this address was freed by someone else (a foreign free): drop it.
            if let Some(stale) = self.shard(p).lock().insert(p, usable) {
                self.live.fetch_sub(stale as u64, Ordering::Relaxed);
            }
            self.live.fetch_add(usable as u64, Ordering::Relaxed);
        }
        self.live.fetch_sub(reserved as u64, Ordering::Relaxed);
    }

    /// Uncounts the block at `p` before it is freed; its size if it was counted (0 if not: another library's).
    pub fn release(&self, p: usize) -> usize {
        if p == 0 {
            return 0;
        }
        let size = self.shard(p).lock().remove(&p).unwrap_or(0);
        self.live.fetch_sub(size as u64, Ordering::Relaxed);
        size
    }

    /// The counted size of the live block at `p` (0 if not counted).
    pub fn size_of(&self, p: usize) -> usize {
        self.shard(p).lock().get(&p).copied().unwrap_or(0)
    }
}

/// LiteRT's memory.
pub static BUDGET: Budget = Budget::new();

thread_local! {
    /// The flag of the run (or model build) in progress on this thread: set when it passes the bound.
    static RUN: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
}

/// While alive, allocations on this thread are the run's whose flag it holds.
pub struct Attribution<'a> {
    previous: *const AtomicBool,
    _flag: PhantomData<&'a AtomicBool>,
}

pub fn attribute(flag: &AtomicBool) -> Attribution<'_> {
    let previous = RUN.with(|r| r.replace(flag));
    Attribution { previous, _flag: PhantomData }
}

impl Drop for Attribution<'_> {
    fn drop(&mut self) {
        RUN.with(|r| r.set(self.previous));
    }
}

fn mark_run() {
    let _ = RUN.try_with(|r| {
        let flag = r.get();
        if !flag.is_null() {
            // SAFETY: a non-null pointer here is the flag of a live `Attribution` on this thread, which borrows it.
            unsafe { &*flag }.store(true, Ordering::Relaxed);
        }
    });
}

/// `Budget::admit` on LiteRT's budget for a block of `size` bytes about to be allocated (nothing for an
/// untracked one), marking this thread's run when it is refused or passes the bound.
#[no_mangle]
pub extern "C" fn rai_tflite_admit(size: usize, refusable: bool) -> bool {
    size < TRACKED || admit(size, refusable)
}

fn admit(size: usize, refusable: bool) -> bool {
    match BUDGET.admit(size, refusable) {
        Admit::Refused => {
            mark_run();
            false
        }
        Admit::Granted { over } => {
            if over {
                mark_run();
            }
            true
        }
    }
}

fn usable(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: `p` is a live block of the process's malloc (or of operator new, which uses it).
        unsafe { libc::malloc_usable_size(p) }
    }
}

/// After an allocation of `size` bytes admitted by `rai_tflite_admit`: counts the block `p` (null: failed).
#[no_mangle]
pub extern "C" fn rai_tflite_settle(p: *mut c_void, size: usize) {
    if size >= TRACKED {
        BUDGET.settle(p as usize, size, usable(p));
    }
}

/// Before a block is freed. A block under TRACKED bytes cannot have been counted (its usable size is at least
/// what was asked), so the table is not searched for it.
#[no_mangle]
pub extern "C" fn rai_tflite_release(p: *mut c_void) {
    if usable(p) >= TRACKED {
        BUDGET.release(p as usize);
    }
}

/// The counted size of `p` (0: not counted).
fn counted(p: *mut c_void) -> usize {
    if usable(p) >= TRACKED {
        BUDGET.size_of(p as usize)
    } else {
        0
    }
}

// The C allocation functions as LiteRT sees them: the process's own, counted and bounded.

unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if !rai_tflite_admit(size, true) {
        return std::ptr::null_mut();
    }
    // SAFETY: plain malloc.
    let p = unsafe { libc::malloc(size) };
    rai_tflite_settle(p, size);
    p
}

unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else { return std::ptr::null_mut() };
    if !rai_tflite_admit(total, true) {
        return std::ptr::null_mut();
    }
    // SAFETY: plain calloc.
    let p = unsafe { libc::calloc(n, size) };
    rai_tflite_settle(p, total);
    p
}

/// # Safety
/// `old` is null or a live block of the process's malloc (realloc's contract).
unsafe extern "C" fn realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let old_size = counted(old);
    if size < TRACKED && old_size == 0 {
        // SAFETY: realloc's contract is the caller's.
        return unsafe { libc::realloc(old, size) };
    }
    // Only the growth is reserved: a counted block already counts its old size.
    let growth = size.saturating_sub(old_size);
    if growth >= TRACKED && !admit(growth, true) {
        return std::ptr::null_mut();
    }
    let growth = if growth >= TRACKED { growth } else { 0 };
    // Uncounted before realloc frees it: once freed, its address may be another thread's new block.
    let released = if old_size > 0 { BUDGET.release(old as usize) } else { 0 };
    // SAFETY: realloc's contract is the caller's.
    let p = unsafe { libc::realloc(old, size) };
    if p.is_null() {
        if size != 0 && released > 0 {
            // Failed: the old block is still live.
            BUDGET.settle(old as usize, 0, released);
        }
        BUDGET.settle(0, growth, 0);
    } else if size >= TRACKED {
        BUDGET.settle(p as usize, growth, usable(p));
    } else {
        BUDGET.settle(0, growth, 0);
    }
    p
}

/// # Safety
/// `p` is null or a live block of the process's malloc.
unsafe extern "C" fn free(p: *mut c_void) {
    rai_tflite_release(p);
    // SAFETY: free's contract is the caller's.
    unsafe { libc::free(p) }
}

unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !rai_tflite_admit(size, true) {
        return std::ptr::null_mut();
    }
    // SAFETY: plain aligned_alloc (it checks `align` itself).
    let p = unsafe { libc::aligned_alloc(align, size) };
    rai_tflite_settle(p, size);
    p
}

unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    if !rai_tflite_admit(size, true) {
        return std::ptr::null_mut();
    }
    // SAFETY: plain memalign.
    let p = unsafe { libc::memalign(align, size) };
    rai_tflite_settle(p, size);
    p
}

/// # Safety
/// `out` is writable (posix_memalign's contract).
unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !rai_tflite_admit(size, true) {
        return libc::ENOMEM;
    }
    // SAFETY: posix_memalign's contract is the caller's.
    let err = unsafe { libc::posix_memalign(out, align, size) };
    // SAFETY: on success `out` holds the block; on failure it is not read.
    rai_tflite_settle(if err == 0 { unsafe { *out } } else { std::ptr::null_mut() }, size);
    err
}

// The C++ operators (alloc.cpp): C++, because `operator new` reports failure by exception, which must not cross
// a Rust frame. Only their addresses are used here.
extern "C" {
    fn rai_tflite_new(size: usize) -> *mut c_void;
    fn rai_tflite_new_array(size: usize) -> *mut c_void;
    fn rai_tflite_new_nothrow(size: usize, tag: *const c_void) -> *mut c_void;
    fn rai_tflite_new_array_nothrow(size: usize, tag: *const c_void) -> *mut c_void;
    fn rai_tflite_delete(p: *mut c_void);
    fn rai_tflite_delete_array(p: *mut c_void);
    fn rai_tflite_delete_sized(p: *mut c_void, size: usize);
    fn rai_tflite_delete_array_sized(p: *mut c_void, size: usize);
    fn rai_tflite_delete_nothrow(p: *mut c_void, tag: *const c_void);
    fn rai_tflite_delete_array_nothrow(p: *mut c_void, tag: *const c_void);
}

/// Every function LiteRT may import to allocate or free, with its replacement (mangled C++ names: x86-64 and
/// AArch64 Itanium ABI, `size_t` = `unsigned long`).
fn replacements() -> [(&'static str, usize); 17] {
    [
        ("malloc", malloc as *const () as usize),
        ("calloc", calloc as *const () as usize),
        ("realloc", realloc as *const () as usize),
        ("free", free as *const () as usize),
        ("aligned_alloc", aligned_alloc as *const () as usize),
        ("posix_memalign", posix_memalign as *const () as usize),
        ("memalign", memalign as *const () as usize),
        ("_Znwm", rai_tflite_new as *const () as usize),
        ("_Znam", rai_tflite_new_array as *const () as usize),
        ("_ZnwmRKSt9nothrow_t", rai_tflite_new_nothrow as *const () as usize),
        ("_ZnamRKSt9nothrow_t", rai_tflite_new_array_nothrow as *const () as usize),
        ("_ZdlPv", rai_tflite_delete as *const () as usize),
        ("_ZdaPv", rai_tflite_delete_array as *const () as usize),
        ("_ZdlPvm", rai_tflite_delete_sized as *const () as usize),
        ("_ZdaPvm", rai_tflite_delete_array_sized as *const () as usize),
        ("_ZdlPvRKSt9nothrow_t", rai_tflite_delete_nothrow as *const () as usize),
        ("_ZdaPvRKSt9nothrow_t", rai_tflite_delete_array_nothrow as *const () as usize),
    ]
}

/// Points libLiteRt.so's allocation calls at the wrappers (`inside`: any function of it) and sets the bound
/// (bytes, 0: none). Refuses a library whose `malloc` and `free` it cannot find: its memory would be unbounded.
pub fn install(inside: *const c_void, bound: u64) -> Result<(), String> {
    BUDGET.set_limit(bound);
    // SAFETY: each replacement has the signature and contract of the function it replaces (above and
    // alloc.cpp) and lives as long as the module, which outlives LiteRT (never unloaded).
    let done = unsafe { super::got::interpose(inside, &replacements()) }?;
    for needed in ["malloc", "free"] {
        if !done.contains(&needed) {
            return Err(format!("cannot bound its memory: it does not import {needed}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_refused_at_the_bound_small_ones_mark_it() {
        let b = Budget::new();
        b.set_limit(1_000_000);
        assert_eq!(b.admit(600_000, true), Admit::Granted { over: false });
        b.settle(0x1000, 600_000, 600_016);
        assert_eq!(b.live(), 600_016);
        assert_eq!(b.admit(500_000, true), Admit::Refused, "past the bound");
        assert_eq!(b.refusals(), 1);
        assert_eq!(b.live(), 600_016, "a refusal reserves nothing");
        // operator new cannot be refused: granted, and the run marked once the count passes the bound
        assert_eq!(b.admit(500_000, false), Admit::Granted { over: true });
        b.settle(0x2000, 500_000, 500_000);
        assert_eq!(b.admit(100, true), Admit::Granted { over: true }, "small blocks are never refused");
        b.settle(0x3000, 100, 112);
        assert_eq!(b.release(0x2000), 500_000);
        assert_eq!(b.release(0x3000), 112);
        assert_eq!(b.admit(300_000, true), Admit::Granted { over: false });
        b.settle(0, 300_000, 0); // the allocation itself failed: the reservation goes back
        assert_eq!(b.live(), 600_016);
        b.set_limit(0);
        assert_eq!(b.admit(usize::MAX / 2, true), Admit::Granted { over: false }, "no bound");
        b.settle(0, usize::MAX / 2, 0);
        assert_eq!(b.release(0x1000), 600_016);
        assert_eq!(b.live(), 0);
    }

    /// Only counted blocks are uncounted: another library's block freed by LiteRT changes nothing, and a block
    /// LiteRT allocated but another library freed is dropped when its address comes back.
    #[test]
    fn only_counted_blocks_are_uncounted() {
        let b = Budget::new();
        b.admit(64, true);
        b.settle(0x10, 64, 64);
        assert_eq!(b.release(0x9990), 0, "foreign block");
        assert_eq!(b.live(), 64);
        b.admit(32, true);
        b.settle(0x10, 32, 48); // 0x10 was freed elsewhere and handed out again
        assert_eq!(b.live(), 48);
        assert_eq!(b.size_of(0x10), 48);
        assert_eq!(b.release(0x10), 48);
        assert_eq!(b.live(), 0);
    }

    #[test]
    fn concurrent_large_blocks_never_pass_the_bound() {
        const THREADS: usize = 4;
        for _ in 0..500 {
            let b = Budget::new();
            b.set_limit(100 * LARGE as u64);
            let barrier = std::sync::Barrier::new(THREADS);
            let granted = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    s.spawn(|| {
                        barrier.wait();
                        if b.admit(60 * LARGE, true) != Admit::Refused {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert_eq!(granted.load(Ordering::Relaxed), 1);
            assert_eq!(b.live(), 60 * LARGE as u64);
        }
    }

    /// The C wrappers over the real malloc, on the process-wide budget (the only test that uses it).
    #[test]
    fn wrappers_count_refuse_and_mark_the_run() {
        BUDGET.set_limit(0);
        let start = BUDGET.live();
        let flag = AtomicBool::new(false);
        let _run = attribute(&flag);
        // SAFETY: the wrappers keep malloc's contracts; every block is freed once, through the wrappers.
        unsafe {
            let small = malloc(100);
            assert_eq!(BUDGET.live(), start, "small blocks are not counted");
            let p = malloc(1000);
            assert!(!p.is_null());
            assert!(BUDGET.live() >= start + 1000);
            let p = realloc(p, 200_000);
            assert!(!p.is_null());
            assert!(BUDGET.live() >= start + 200_000);
            let p = realloc(p, 200_100); // grows by less than TRACKED: still counted whole
            assert!(BUDGET.live() >= start + 200_100);
            let small = realloc(small, 5000); // an uncounted block grows into a counted one
            assert!(BUDGET.live() >= start + 205_100);
            let q = calloc(10, 100);
            let mut r = std::ptr::null_mut();
            assert_eq!(posix_memalign(&mut r, 64, 1000), 0);
            assert_eq!(r as usize % 64, 0);
            let s = aligned_alloc(64, 1024);
            let m = memalign(64, 4096);
            assert!(BUDGET.live() >= start + 205_100 + 1000 + 1000 + 1024 + 4096);
            for b in [q, r, s, m, p] {
                free(b);
            }
            let small = realloc(small, 10); // and shrinks back
            assert_eq!(BUDGET.live(), start);
            free(small);
            assert_eq!(BUDGET.live(), start);
            assert!(calloc(usize::MAX, 2).is_null(), "overflow");

            BUDGET.set_limit(start + 1_000_000);
            let big = malloc(2_000_000);
            assert!(big.is_null(), "refused");
            assert!(flag.load(Ordering::Relaxed), "the run is marked");
            flag.store(false, Ordering::Relaxed);
            let ok = malloc(500_000);
            assert!(!ok.is_null());
            assert!(realloc(ok, 3_000_000).is_null(), "growth refused, block kept");
            assert!(BUDGET.live() >= start + 500_000);
            let mut out = std::ptr::null_mut();
            assert_eq!(posix_memalign(&mut out, 64, 2_000_000), libc::ENOMEM);
            assert!(aligned_alloc(64, 2_000_000).is_null());
            free(ok);
            assert_eq!(BUDGET.live(), start);
            BUDGET.set_limit(0);
        }
    }
}
