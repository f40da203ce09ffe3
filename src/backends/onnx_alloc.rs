//! ONNX Runtime's CPU memory through the module's allocator (Redis's, so it shows in `used_memory`), counted for
//! INFO (`ai_onnxruntime_memory`, `ai_onnxruntime_memory_access_num`) and held to BACKEND_MEMORY_LIMIT, as
//! RedisAI's custom allocator did. Registered on the environment once; sessions opt in with
//! `session.use_env_allocators`.
//!
//! The bound is BACKEND_MEMORY_LIMIT, or by default one derived from `maxmemory` and the machine's memory
//! (`Config::backend_memory_bound`): without it, a 1 KB model (`ConstantOfShape` of a huge shape) made Redis
//! allocate until the kernel's OOM killer ended it. An allocation that would pass the bound is refused (null),
//! which ONNX Runtime turns into a failed run; it is counted as an overrun, and the session creation or run
//! during which the count grew fails with RedisAI's error.

use std::alloc::Layout;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use ort::AsPointer;

use ort::environment::Environment;
use ort::sys::{OrtAllocator, OrtAllocatorType, OrtEnv, OrtMemType, OrtMemoryInfo, OrtStatusPtr};

/// Bytes handed out and not yet freed.
static MEMORY: AtomicU64 = AtomicU64::new(0);
/// Allocations plus frees.
static ACCESSES: AtomicU64 = AtomicU64::new(0);
/// Allocations refused at the bound (a failed call during which this grew failed for the bound).
static OVERRUNS: AtomicU64 = AtomicU64::new(0);
/// The bound in bytes (0: none), fixed when the runtime is opened.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// ONNX Runtime wants 64-byte aligned buffers (its AVX kernels fault otherwise). The global allocator only
/// promises small alignments (Redis's `RedisModule_Alloc` rounds sizes, jemalloc's size classes happen to
/// align them, a libc malloc or valgrind does not), so blocks are over-allocated and aligned here; the two
/// words before the returned pointer hold the requested size and the distance back to the block's start.
const ALIGN: usize = 64;
const SLACK: usize = 2 * ALIGN;
const HEADER: usize = 2 * std::mem::size_of::<usize>();

fn block_layout(size: usize) -> Option<Layout> {
    size.checked_add(SLACK).and_then(|t| Layout::from_size_align(t, std::mem::align_of::<usize>()).ok())
}

pub const LIMIT_ERROR: &str = "Onnxruntime memory limit exceeded, memory allocation failed.";

#[repr(C)]
struct CountingAllocator {
    base: OrtAllocator,
    info: *mut OrtMemoryInfo,
}

// `alloc`, throwing `std::bad_alloc` instead of returning null (onnx_alloc.cpp): what ONNX Runtime calls.
// Rust never calls them (an exception must not unwind a Rust frame); it only hands their addresses to ONNX
// Runtime, whose C++ callers catch the exception.
extern "system" {
    fn rai_onnx_alloc_or_throw(this: *mut OrtAllocator, size: usize) -> *mut c_void;
    fn rai_onnx_reserve_or_throw(this: *const OrtAllocator, size: usize) -> *mut c_void;
}

/// Called by `rai_onnx_alloc_or_throw`: `alloc`, where null means refused.
#[no_mangle]
extern "C" fn rai_onnx_counted_alloc(size: usize) -> *mut c_void {
    // SAFETY: `alloc` does not use its allocator argument.
    unsafe { alloc(std::ptr::null_mut(), size) }
}

/// Adds `size` to `memory` if the sum stays within `limit` (0: no limit), in one atomic step: checking and adding
/// in two let concurrent runs pass the bound together.
fn reserve(memory: &AtomicU64, limit: u64, size: u64) -> bool {
    if limit == 0 {
        memory.fetch_add(size, Ordering::Relaxed);
        return true;
    }
    memory.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_add(size).filter(|&t| t <= limit)).is_ok()
}

/// Null when the allocation would pass the bound or fails: ONNX Runtime gets an exception then (see above).
/// The memory is zeroed: ONNX Runtime hands some buffers to a kernel before anything wrote them, and what the
/// allocator held before may be another client's tensor.
/// # Safety
/// None beyond FFI: it only allocates; `_this` is unused.
unsafe fn alloc(_this: *mut OrtAllocator, size: usize) -> *mut c_void {
    ACCESSES.fetch_add(1, Ordering::Relaxed);
    let Some(layout) = block_layout(size) else {
        return std::ptr::null_mut();
    };
    if !reserve(&MEMORY, LIMIT.load(Ordering::Relaxed), size as u64) {
        OVERRUNS.fetch_add(1, Ordering::Relaxed);
        return std::ptr::null_mut();
    }
    // SAFETY: `layout` has a non-zero size. The returned pointer is the first ALIGN boundary at least HEADER
    // bytes into the block, so it is at most HEADER + ALIGN - 1 < SLACK bytes in, and `size` bytes fit after
    // it; the two header words sit inside the block, word-aligned.
    unsafe {
        let base = std::alloc::alloc(layout);
        if base.is_null() {
            MEMORY.fetch_sub(size as u64, Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        let offset = (ALIGN - (base as usize + HEADER) % ALIGN) % ALIGN + HEADER;
        let user = base.add(offset);
        (user.sub(std::mem::size_of::<usize>()) as *mut usize).write(size);
        (user.sub(HEADER) as *mut usize).write(offset);
        std::ptr::write_bytes(user, 0, size);
        user.cast()
    }
}

unsafe extern "system" fn free(_this: *mut OrtAllocator, p: *mut c_void) {
    if p.is_null() {
        return;
    }
    ACCESSES.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `p` came from `alloc` above: its header words give the size and the block's start, which was
    // allocated with `block_layout(size)`.
    unsafe {
        let user = p as *mut u8;
        let size = (user.sub(std::mem::size_of::<usize>()) as *const usize).read();
        let offset = (user.sub(HEADER) as *const usize).read();
        MEMORY.fetch_sub(size as u64, Ordering::Relaxed);
        if let Some(layout) = block_layout(size) {
            std::alloc::dealloc(user.sub(offset), layout);
        }
    }
}

unsafe extern "system" fn info(this: *const OrtAllocator) -> *const OrtMemoryInfo {
    // SAFETY: `this` is the `base` field of a leaked CountingAllocator (repr(C), first field).
    unsafe { (*(this as *const CountingAllocator)).info }
}

fn status_text(OrtStatusPtr(status): OrtStatusPtr) -> Option<String> {
    if status.is_null() {
        return None;
    }
    let api = ort::api();
    // SAFETY: a non-null status from the API; its message is copied before the status is released.
    unsafe {
        let text = CStr::from_ptr((api.GetErrorMessage)(status)).to_string_lossy().into_owned();
        (api.ReleaseStatus)(status);
        Some(text)
    }
}

/// Registers the counting allocator on `env` (once per process, with the runtime) and fixes the bound (bytes).
pub fn register(env: &Environment, bound: u64) -> Result<(), String> {
    LIMIT.store(bound, Ordering::Relaxed);
    let api = ort::api();
    let mut mem_info = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the memory info and the allocator are leaked on purpose: the
    // environment keeps using them until the process exits.
    unsafe {
        let status = (api.CreateCpuMemoryInfo)(
            OrtAllocatorType::OrtDeviceAllocator,
            OrtMemType::OrtMemTypeDefault,
            &mut mem_info,
        );
        if let Some(e) = status_text(status) {
            return Err(e);
        }
        let mut base = OrtAllocator::default();
        base.Alloc = Some(rai_onnx_alloc_or_throw);
        base.Free = Some(free);
        base.Info = Some(info);
        base.Reserve = Some(rai_onnx_reserve_or_throw);
        let allocator = Box::leak(Box::new(CountingAllocator { base, info: mem_info }));
        match status_text((api.RegisterAllocator)(env.ptr() as *mut OrtEnv, &mut allocator.base)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `(ai_onnxruntime_memory, ai_onnxruntime_memory_access_num)`.
pub fn counters() -> (u64, u64) {
    (MEMORY.load(Ordering::Relaxed), ACCESSES.load(Ordering::Relaxed))
}

/// Allocations past the limit so far: a call that failed while this grew failed for the bound (`LIMIT_ERROR`).
/// A call that succeeded did not: the refusal was another run's.
pub fn overruns() -> u64 {
    OVERRUNS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh blocks hold zeros, also where a freed block with other bytes stood.
    #[test]
    fn blocks_come_zeroed() {
        for round in 0..50 {
            let size = 4096 + round * 64;
            // SAFETY: alloc/free do not use their allocator argument; each block is written within its size and
            // freed once.
            unsafe {
                let p = alloc(std::ptr::null_mut(), size) as *mut u8;
                std::ptr::write_bytes(p, 0x5a, size);
                free(std::ptr::null_mut(), p.cast());
                let q = alloc(std::ptr::null_mut(), size) as *mut u8;
                assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 0), "round {round}");
                free(std::ptr::null_mut(), q.cast());
            }
        }
    }

    /// Of several runs that each want 60 of a bound of 100 at the same moment, exactly one gets it.
    #[test]
    fn concurrent_reservations_never_pass_the_bound() {
        const THREADS: usize = 4;
        for _ in 0..2000 {
            let memory = AtomicU64::new(0);
            let barrier = std::sync::Barrier::new(THREADS);
            let granted = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    s.spawn(|| {
                        barrier.wait();
                        if reserve(&memory, 100, 60) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert_eq!(granted.load(Ordering::Relaxed), 1);
            assert_eq!(memory.load(Ordering::Relaxed), 60);
        }
        let memory = AtomicU64::new(0);
        assert!(reserve(&memory, 0, u64::MAX - 1), "no bound");
        assert!(!reserve(&memory, 100, 2), "an overflow is refused, not wrapped");
    }

    #[test]
    fn blocks_are_aligned_and_counted() {
        let before = counters().0;
        // SAFETY: alloc/free do not use their allocator argument; each block is freed once.
        let blocks: Vec<(*mut c_void, usize)> = (0..200)
            .map(|i| {
                let size = 1 + i * 37;
                // SAFETY: as above.
                (unsafe { alloc(std::ptr::null_mut(), size) }, size)
            })
            .collect();
        for &(p, size) in &blocks {
            assert!(!p.is_null());
            assert_eq!(p as usize % ALIGN, 0);
            // SAFETY: the whole block is writable: `alloc` returned `size` bytes at `p`.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0xab, size) };
        }
        assert!(counters().0 >= before + blocks.iter().map(|b| b.1 as u64).sum::<u64>());
        for &(p, size) in &blocks {
            // SAFETY: each block holds `size` readable bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
            assert!(bytes.iter().all(|&b| b == 0xab));
        }
        for (p, _) in blocks {
            // SAFETY: each block came from `alloc` and is freed once.
            unsafe { free(std::ptr::null_mut(), p) };
        }
    }
}
