//! The few files a worker's backends open after the sandbox is in, handed out without opening anything: the
//! filter traps `open`/`openat` (SIGSYS), and the handler answers with a copy of what was read or opened
//! before the sandbox — `/dev/urandom` (TensorFlow seeds generators from it and aborts when it cannot) and
//! snapshots of the CPU's description (the backends' CPU detection) — and EPERM for any other path. Every
//! other call the filter refuses comes here too, to be counted (refused.rs) and answered EPERM.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

/// Paths served from a snapshot taken before the sandbox, as a fresh in-memory file each time.
const SNAPSHOTS: &[&str] = &[
    "/proc/cpuinfo",
    "/sys/devices/system/cpu/possible",
    "/sys/devices/system/cpu/present",
    "/sys/devices/system/cpu/online",
];
const URANDOM: &str = "/dev/urandom";
const EMPTY_PATH: u64 = libc::AT_EMPTY_PATH as u64;

static TAKEN: OnceLock<Vec<(&'static str, Vec<u8>)>> = OnceLock::new();
static URANDOM_FD: AtomicI32 = AtomicI32::new(-1);
/// A GPU worker's other opens go to the kernel (`openat2`, which its filter allows), under its Landlock ruleset.
static KERNEL_OPENS: AtomicBool = AtomicBool::new(false);

/// Reads the snapshots, opens /dev/urandom and installs the SIGSYS handler (before the filter);
/// `kernel_opens`: a GPU worker's, whose other opens go to the kernel under Landlock.
pub fn prepare(kernel_opens: bool) {
    KERNEL_OPENS.store(kernel_opens, Ordering::Release);
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
        let args = [libc::REG_RDI, libc::REG_RSI, libc::REG_RDX, libc::REG_R10, libc::REG_R8, libc::REG_R9]
            .map(|r| g[r as usize] as u64);
        g[libc::REG_RAX as usize] = answer(g[libc::REG_RAX as usize], args);
    }
}

#[cfg(target_arch = "aarch64")]
extern "C" fn on_sigsys(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: as on x86_64: x8 holds the call's number, x0.. its arguments, x0 its result.
    unsafe {
        let r = &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.regs;
        let args = [r[0], r[1], r[2], r[3], r[4], r[5]];
        r[0] = answer(r[8] as i64, args) as u64;
    }
}

/// A trapped call's result: a file the broker serves, `fstat` asked as `newfstatat`, or EPERM (counted, with the
/// path the call named).
fn answer(nr: i64, args: [u64; 6]) -> i64 {
    let path = super::refused::path_arg(nr).map_or(std::ptr::null(), |i| args[i] as *const libc::c_char);
    // glibc's `fstat(fd)` is `newfstatat(fd, "", buf, AT_EMPTY_PATH)`: the descriptor's own metadata, which
    // `fstat` (allowed) gives. Any other path stays refused.
    // SAFETY: reads the first byte of the caller's path (a bad pointer faults in the worker, never in Redis).
    if nr == libc::SYS_newfstatat && !path.is_null() && unsafe { *path } == 0 && args[3] & EMPTY_PATH != 0 {
        // SAFETY: fstat of the caller's descriptor into the caller's buffer, as the call asked.
        return in_handler(|| unsafe {
            libc::syscall(libc::SYS_fstat, args[0] as libc::c_int, args[2] as *mut libc::stat)
        });
    }
    // (dirfd, flags, mode) of an open.
    #[cfg(target_arch = "x86_64")]
    let opening = match nr {
        libc::SYS_openat => Some((args[0] as i64, args[2], args[3])),
        libc::SYS_open => Some((libc::AT_FDCWD as i64, args[1], args[2])),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let opening = (nr == libc::SYS_openat).then(|| (args[0] as i64, args[2], args[3]));
    let mut result = if opening.is_some() { open(path) } else { -(libc::EPERM as i64) };
    if let Some((dirfd, flags, mode)) = opening.filter(|_| result < 0 && KERNEL_OPENS.load(Ordering::Acquire)) {
        result = kernel_open(dirfd, path, flags, mode);
    }
    if result == -(libc::EPERM as i64) || result == -(libc::EACCES as i64) {
        super::refused::count(nr, path);
    }
    result
}

/// `openat(dirfd, path, flags, mode)` as `openat2`, which the filter lets through to the kernel (and Landlock),
/// where `openat` comes back here. `openat2` refuses flags and modes that `openat` ignores: those are dropped.
fn kernel_open(dirfd: i64, path: *const libc::c_char, flags: u64, mode: u64) -> i64 {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let valid = (libc::O_ACCMODE
        | libc::O_CREAT
        | libc::O_EXCL
        | libc::O_NOCTTY
        | libc::O_TRUNC
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_ASYNC
        | libc::O_DIRECT
        | libc::O_LARGEFILE
        | libc::O_DIRECTORY
        | libc::O_NOFOLLOW
        | libc::O_NOATIME
        | libc::O_CLOEXEC
        | libc::O_PATH
        | libc::O_TMPFILE) as u64;
    let flags = flags & valid;
    let creating = flags & (libc::O_CREAT | libc::O_TMPFILE) as u64 != 0;
    let how = OpenHow { flags, mode: if creating { mode & 0o7777 } else { 0 }, resolve: 0 };
    // SAFETY: openat2 with the caller's descriptor and path and a valid `open_how` of the size given.
    in_handler(|| unsafe {
        libc::syscall(libc::SYS_openat2, dirfd as libc::c_int, path, &how, std::mem::size_of::<OpenHow>())
    })
}

/// A system call made for the trapped one: its result as the kernel gives it (a negated errno on failure), and
/// the thread's errno put back, since the interrupted code gets the result from this handler, not from errno.
fn in_handler(call: impl FnOnce() -> libc::c_long) -> i64 {
    // SAFETY: the calling thread's errno, read and written on that thread only.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let r = call();
        let r = if r < 0 { -(*errno as i64) } else { r };
        *errno = saved;
        r
    }
}
