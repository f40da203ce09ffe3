//! The system calls a worker's sandbox refused. The SIGSYS handler (broker.rs) counts each refusal as it answers
//! EPERM (or Landlock's EACCES, for a GPU worker's opens), and the worker reports the count and the last call
//! refused to Redis, where INFO's per-worker line shows them; asked to (`LOG_VARIABLE`), it also writes the first
//! refusal of each call, and each that names a path, to stderr. A backend that needs a call the sandbox refuses
//! (a new version, a GPU library) then says which one, instead of failing with its own vague error.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

/// Calls numbered below this are counted one by one (x86_64 and aarch64 both number theirs below 512).
const CALLS: usize = 512;
static SEEN: [AtomicU64; CALLS / 64] = [const { AtomicU64::new(0) }; CALLS / 64];
static TOTAL: AtomicU64 = AtomicU64::new(0);
/// The last call refused, -1 before any.
static LAST: AtomicI64 = AtomicI64::new(-1);

/// The backend the worker loads, for the lines on stderr (set once, before the filter).
static LABEL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
/// Refusals that name a path are told with it, each of them up to this many (a backend probes a few paths at
/// load; a loop of them would otherwise fill the log).
const PATHS_TOLD: u64 = 64;
static PATHS: AtomicU64 = AtomicU64::new(0);

/// Whether refusals are told on stderr (`LOG_VARIABLE` set in Redis's environment; the count is always kept):
/// TensorFlow alone makes some twenty at each start, which an operator's terminal need not show.
static TELL: AtomicBool = AtomicBool::new(false);

/// The environment variable that makes workers tell each refusal on stderr (scripts/gpu-check.sh sets it).
pub const LOG_VARIABLE: &str = "REDISAI_WORKER_LOG_REFUSALS";

/// Names the worker's backend in what it tells, and tells only if asked to.
pub fn set_label(label: &'static str, tell: bool) {
    let _ = LABEL.set(label);
    TELL.store(tell, Relaxed);
}

/// Counts a refusal of call `nr`; the first refusal of each call goes to stderr, and each one that names a path
/// (`path` not null: an open, a stat) with its path. Async-signal-safe: atomics and one write(2) from a stack
/// buffer.
pub fn count(nr: i64, path: *const libc::c_char) {
    TOTAL.fetch_add(1, Relaxed);
    LAST.store(nr, Relaxed);
    // Numbers past the table (another ABI's, such as x32's) are told every time.
    let first = usize::try_from(nr).ok().filter(|&i| i < CALLS).is_none_or(|i| {
        let bit = 1u64 << (i % 64);
        SEEN[i / 64].fetch_or(bit, Relaxed) & bit == 0
    });
    let with_path = !path.is_null() && PATHS.fetch_add(1, Relaxed) < PATHS_TOLD;
    if (first || with_path) && TELL.load(Relaxed) {
        tell(nr, if with_path { path } else { std::ptr::null() });
    }
}

/// `(refusals so far, the last call refused)`.
pub fn totals() -> (u64, Option<i64>) {
    let last = LAST.load(Relaxed);
    (TOTAL.load(Relaxed), (last >= 0).then_some(last))
}

/// The section of a worker's INFO answer that tells of its sandbox.
const SECTION: &str = "sandbox";

/// This worker's refusals as fields of its INFO answer: `refused_calls`, and `last_refused` (the call's number
/// + 1, 0 before any).
pub fn info_fields() -> [(&'static str, &'static str, u64); 2] {
    let (count, last) = totals();
    [(SECTION, "refused_calls", count), (SECTION, "last_refused", last.map_or(0, |nr| nr as u64 + 1))]
}

/// Redis's side: `(refusals, the last call's name or "none")` from a worker's INFO answer.
pub fn from_info(fields: &[(String, String, u64)]) -> (u64, String) {
    let field = |name: &str| fields.iter().find(|(s, f, _)| s == SECTION && f == name).map_or(0, |(_, _, v)| *v);
    let last = match field("last_refused") {
        0 => "none".to_string(),
        n => {
            let nr = n as i64 - 1;
            name(nr).map_or_else(|| format!("call_{nr}"), str::to_string)
        }
    };
    (field("refused_calls"), last)
}

/// `redisai-worker (<backend>): refused system call <name> (<number>)[: <path>]` on stderr, without allocating.
fn tell(nr: i64, path: *const libc::c_char) {
    let mut buf = [0u8; 320];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        // The line's end is kept free: a long path is cut, not the newline.
        let n = bytes.len().min(buf.len() - 1 - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"redisai-worker (");
    put(LABEL.get().copied().unwrap_or("?").as_bytes());
    put(b"): refused system call ");
    put(name(nr).unwrap_or("?").as_bytes());
    // The number through core's formatting, into a stack buffer (no allocation).
    let mut number = Digits([0; 24], 0);
    let _ = std::fmt::Write::write_fmt(&mut number, format_args!(" ({nr})"));
    put(&number.0[..number.1]);
    if !path.is_null() {
        put(b": ");
        for i in 0..256 {
            // SAFETY: reads the trapped call's path up to its NUL or 256 bytes; a bad pointer faults in the
            // worker (which then dies), never in Redis, as the broker's own reading of it does.
            let b = unsafe { *path.add(i) } as u8;
            if b == 0 {
                break;
            }
            put(&[b]);
        }
    }
    buf[len] = b'\n';
    // SAFETY: writes `len + 1` bytes of a local buffer to stderr; the result does not matter.
    unsafe { libc::write(2, buf.as_ptr().cast(), len + 1) };
}

/// A few formatted bytes on the stack.
struct Digits([u8; 24], usize);

impl std::fmt::Write for Digits {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.1 + s.len();
        self.0.get_mut(self.1..end).ok_or(std::fmt::Error)?.copy_from_slice(s.as_bytes());
        self.1 = end;
        Ok(())
    }
}

/// Which argument of call `nr` is a path (told with the refusal), for the calls that name one.
pub fn path_arg(nr: i64) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if [libc::SYS_open, libc::SYS_stat, libc::SYS_lstat, libc::SYS_access, libc::SYS_mkdir, libc::SYS_unlink]
        .contains(&nr)
        || nr == libc::SYS_execve
    {
        return Some(0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    if nr == libc::SYS_execve {
        return Some(0);
    }
    let second = [
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_mkdirat,
        libc::SYS_unlinkat,
        libc::SYS_execveat,
        libc::SYS_mknodat,
    ];
    second.contains(&nr).then_some(1)
}

/// The name of call `nr`, for the calls a backend library might try that the filter refuses (and a few it
/// allows, for the trapped ones); `None` for the rest.
pub fn name(nr: i64) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    let arch_only = match nr {
        libc::SYS_open => Some("open"),
        libc::SYS_stat => Some("stat"),
        libc::SYS_lstat => Some("lstat"),
        libc::SYS_access => Some("access"),
        libc::SYS_pipe => Some("pipe"),
        libc::SYS_poll => Some("poll"),
        libc::SYS_select => Some("select"),
        libc::SYS_fork => Some("fork"),
        libc::SYS_vfork => Some("vfork"),
        libc::SYS_mkdir => Some("mkdir"),
        libc::SYS_unlink => Some("unlink"),
        libc::SYS_rename => Some("rename"),
        libc::SYS_readlink => Some("readlink"),
        libc::SYS_getdents => Some("getdents"),
        libc::SYS_epoll_wait => Some("epoll_wait"),
        libc::SYS_epoll_create => Some("epoll_create"),
        libc::SYS_mknod => Some("mknod"),
        libc::SYS_arch_prctl => Some("arch_prctl"),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let arch_only = None;
    arch_only.or(match nr {
        libc::SYS_ioctl => Some("ioctl"),
        libc::SYS_openat => Some("openat"),
        libc::SYS_openat2 => Some("openat2"),
        libc::SYS_newfstatat => Some("newfstatat"),
        libc::SYS_statx => Some("statx"),
        libc::SYS_faccessat => Some("faccessat"),
        libc::SYS_faccessat2 => Some("faccessat2"),
        libc::SYS_getdents64 => Some("getdents64"),
        libc::SYS_pipe2 => Some("pipe2"),
        libc::SYS_ppoll => Some("ppoll"),
        libc::SYS_pselect6 => Some("pselect6"),
        libc::SYS_epoll_create1 => Some("epoll_create1"),
        libc::SYS_epoll_ctl => Some("epoll_ctl"),
        libc::SYS_epoll_pwait => Some("epoll_pwait"),
        libc::SYS_socket => Some("socket"),
        libc::SYS_socketpair => Some("socketpair"),
        libc::SYS_connect => Some("connect"),
        libc::SYS_bind => Some("bind"),
        libc::SYS_listen => Some("listen"),
        libc::SYS_accept4 => Some("accept4"),
        libc::SYS_sendto => Some("sendto"),
        libc::SYS_recvfrom => Some("recvfrom"),
        libc::SYS_execve => Some("execve"),
        libc::SYS_execveat => Some("execveat"),
        libc::SYS_ptrace => Some("ptrace"),
        libc::SYS_process_vm_readv => Some("process_vm_readv"),
        libc::SYS_process_vm_writev => Some("process_vm_writev"),
        libc::SYS_kill => Some("kill"),
        libc::SYS_tkill => Some("tkill"),
        libc::SYS_setrlimit => Some("setrlimit"),
        libc::SYS_prlimit64 => Some("prlimit64"),
        libc::SYS_prctl => Some("prctl"),
        libc::SYS_mkdirat => Some("mkdirat"),
        libc::SYS_unlinkat => Some("unlinkat"),
        libc::SYS_renameat => Some("renameat"),
        libc::SYS_mknodat => Some("mknodat"),
        libc::SYS_fchmodat => Some("fchmodat"),
        libc::SYS_fchownat => Some("fchownat"),
        libc::SYS_statfs => Some("statfs"),
        libc::SYS_fstatfs => Some("fstatfs"),
        libc::SYS_getcwd => Some("getcwd"),
        libc::SYS_chdir => Some("chdir"),
        libc::SYS_fchdir => Some("fchdir"),
        libc::SYS_flock => Some("flock"),
        libc::SYS_fsync => Some("fsync"),
        libc::SYS_fdatasync => Some("fdatasync"),
        libc::SYS_pread64 => Some("pread64"),
        libc::SYS_pwrite64 => Some("pwrite64"),
        libc::SYS_wait4 => Some("wait4"),
        libc::SYS_waitid => Some("waitid"),
        libc::SYS_setpriority => Some("setpriority"),
        libc::SYS_getpriority => Some("getpriority"),
        libc::SYS_sched_setattr => Some("sched_setattr"),
        libc::SYS_sched_getattr => Some("sched_getattr"),
        libc::SYS_sched_setscheduler => Some("sched_setscheduler"),
        libc::SYS_mlock => Some("mlock"),
        libc::SYS_munlock => Some("munlock"),
        libc::SYS_mlockall => Some("mlockall"),
        libc::SYS_shmget => Some("shmget"),
        libc::SYS_shmat => Some("shmat"),
        libc::SYS_timerfd_create => Some("timerfd_create"),
        libc::SYS_timer_create => Some("timer_create"),
        libc::SYS_signalfd4 => Some("signalfd4"),
        libc::SYS_inotify_init1 => Some("inotify_init1"),
        libc::SYS_io_uring_setup => Some("io_uring_setup"),
        libc::SYS_userfaultfd => Some("userfaultfd"),
        libc::SYS_perf_event_open => Some("perf_event_open"),
        libc::SYS_bpf => Some("bpf"),
        libc::SYS_seccomp => Some("seccomp"),
        libc::SYS_personality => Some("personality"),
        libc::SYS_setsid => Some("setsid"),
        libc::SYS_umask => Some("umask"),
        libc::SYS_times => Some("times"),
        libc::SYS_capget => Some("capget"),
        libc::SYS_kcmp => Some("kcmp"),
        libc::SYS_mount => Some("mount"),
        libc::SYS_unshare => Some("unshare"),
        libc::SYS_setns => Some("setns"),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_calls_a_backend_may_try() {
        assert_eq!(name(libc::SYS_ioctl), Some("ioctl"));
        assert_eq!(name(libc::SYS_socket), Some("socket"));
        assert_eq!(name(libc::SYS_statx), Some("statx"));
        assert_eq!(name(-5), None);
        assert_eq!(name(100_000), None);
    }
}
