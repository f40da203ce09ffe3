//! The few files a worker's backends open after the sandbox is in, handed out without opening anything: the
//! filter traps `open`/`openat` (SIGSYS), and the handler answers with a copy of what was read or opened
//! before the sandbox — `/dev/urandom` (TensorFlow seeds generators from it and aborts when it cannot) and
//! snapshots of the CPU's description (the backends' CPU detection) — and EPERM for any other path.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// Paths served from a snapshot taken before the sandbox, as a fresh in-memory file each time.
const SNAPSHOTS: &[&str] = &[
    "/proc/cpuinfo",
    "/sys/devices/system/cpu/possible",
    "/sys/devices/system/cpu/present",
    "/sys/devices/system/cpu/online",
];
const URANDOM: &str = "/dev/urandom";

static TAKEN: OnceLock<Vec<(&'static str, Vec<u8>)>> = OnceLock::new();
static URANDOM_FD: AtomicI32 = AtomicI32::new(-1);

/// Reads the snapshots, opens /dev/urandom and installs the SIGSYS handler (before the filter).
pub fn prepare() {
    let snaps = SNAPSHOTS.iter().filter_map(|p| std::fs::read(p).ok().map(|b| (*p, b))).collect();
    let _ = TAKEN.set(snaps);
    // SAFETY: open of a static path; the descriptor is kept for the life of the process.
    let fd = unsafe { libc::open(c"/dev/urandom".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    URANDOM_FD.store(fd, Ordering::Release);
    // SAFETY: installs a handler with a valid sigaction; the handler only makes async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut());
    }
}

/// The answer to `open(path)`: a descriptor, or a negated errno.
fn open(path: *const libc::c_char) -> i64 {
    let matches = |want: &str| {
        let want = want.as_bytes();
        // SAFETY: reads at most want.len() + 1 bytes of the caller's path, stopping at its NUL; a bad pointer
        // faults in the worker (which then dies), never in Redis.
        (0..=want.len()).all(|i| unsafe { *path.add(i) } as u8 == want.get(i).copied().unwrap_or(0))
    };
    if path.is_null() {
        return -(libc::EFAULT as i64);
    }
    if matches(URANDOM) {
        let fd = URANDOM_FD.load(Ordering::Acquire);
        // SAFETY: dup of a descriptor this process holds.
        return if fd < 0 { -(libc::EPERM as i64) } else { unsafe { libc::dup(fd) as i64 } };
    }
    for (p, bytes) in TAKEN.get().map(Vec::as_slice).unwrap_or(&[]) {
        if matches(p) {
            // SAFETY: memfd_create, write and lseek on the new descriptor, with a buffer that lives as long as
            // the process (TAKEN is never cleared).
            unsafe {
                let fd = libc::memfd_create(c"snapshot".as_ptr(), libc::MFD_CLOEXEC);
                if fd < 0 {
                    return -(libc::EPERM as i64);
                }
                libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                libc::lseek(fd, 0, libc::SEEK_SET);
                return fd as i64;
            }
        }
    }
    -(libc::EPERM as i64)
}

#[cfg(target_arch = "x86_64")]
extern "C" fn on_sigsys(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes the interrupted thread's ucontext; its registers hold the trapped call's
    // number and arguments, and RAX is where the call's result goes when the handler returns.
    unsafe {
        let g = &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs;
        let nr = g[libc::REG_RAX as usize];
        let path = match nr {
            n if n == libc::SYS_open => g[libc::REG_RDI as usize],
            n if n == libc::SYS_openat => g[libc::REG_RSI as usize],
            _ => 0,
        } as *const libc::c_char;
        g[libc::REG_RAX as usize] = open(path);
    }
}

#[cfg(target_arch = "aarch64")]
extern "C" fn on_sigsys(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: as on x86_64: x8 holds the call's number, x0.. its arguments, x0 its result.
    unsafe {
        let r = &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.regs;
        let path = if r[8] as i64 == libc::SYS_openat { r[1] } else { 0 } as *const libc::c_char;
        r[0] = open(path) as u64;
    }
}
