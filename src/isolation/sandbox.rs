//! What a worker does to itself before it takes a model: only its channel open, dead when Redis dies, no new
//! privileges, an address-space limit derived from the backend memory bound, no core dumps, and a seccomp filter
//! that lets the backends compute, allocate and make threads but not open a file, make a socket, run a program,
//! trace a process or raise a limit. Applied after the backend library is loaded (loading opens files).

use crate::error::{Error, Result};

/// Linux's seccomp and BPF constants (linux/seccomp.h, linux/filter.h, linux/audit.h).
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_FILTER_FLAG_TSYNC: libc::c_ulong = 1;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
/// Offsets in `struct seccomp_data`: nr, arch, then six 64-bit arguments from 16.
const NR: u32 = 0;
const ARCH: u32 = 4;
fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
fn arg_hi(i: u32) -> u32 {
    20 + 8 * i
}

/// What the backends need to run models: memory, threads and their synchronisation, time, signals for their
/// own threads, reading and writing descriptors they already hold (the channel, the lanes, stderr).
const ALLOWED: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_lseek,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_mincore,
    libc::SYS_msync,
    libc::SYS_brk,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_tgkill,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_restart_syscall,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_getrusage,
    libc::SYS_sysinfo,
    libc::SYS_uname,
    libc::SYS_getrandom,
    libc::SYS_membarrier,
    libc::SYS_getcpu,
    libc::SYS_get_mempolicy,
    libc::SYS_ftruncate,
    libc::SYS_fcntl,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_ppoll,
    libc::SYS_eventfd2,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fstat,
    // TensorFlow reads /proc/self/exe's target when it builds a session (and aborts when it cannot): a link's
    // target is a name, not a file's contents.
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    // The broker's in-memory copies of the files it hands out (broker.rs).
    libc::SYS_memfd_create,
];

/// Calls answered by the broker's SIGSYS handler (broker.rs) instead of the kernel.
const TRAPPED: &[libc::c_long] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    libc::SYS_openat,
];

/// prctl options a backend uses on itself: naming threads (and glibc naming its mappings).
const ALLOWED_PRCTL: &[u32] = &[libc::PR_SET_NAME as u32, libc::PR_GET_NAME as u32, 0x5356_4d41 /* PR_SET_VMA */];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: the architecture checked first (another ABI's numbers would mean other calls), each allowed
/// call let through, opening a file trapped (the broker answers: broker.rs), `prlimit64` only to read a limit, `prctl` only for the options above; anything else is
/// trapped too, and the handler counts it (refused.rs) and fails it with EPERM, which the backends treat as a
/// missing file or feature rather than crashing.
pub fn filter() -> Vec<libc::sock_filter> {
    let allow = stmt(BPF_RET_K, SECCOMP_RET_ALLOW);
    let deny = stmt(BPF_RET_K, SECCOMP_RET_TRAP);
    let mut f = vec![
        stmt(BPF_LD_W_ABS, ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR),
    ];
    for nr in ALLOWED {
        f.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        f.push(allow);
    }
    for nr in TRAPPED {
        f.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        f.push(stmt(BPF_RET_K, SECCOMP_RET_TRAP));
    }
    // prlimit64(pid, resource, new, old): allowed when `new` is NULL (getrlimit).
    f.push(jump(BPF_JEQ_K, libc::SYS_prlimit64 as u32, 0, 6));
    f.push(stmt(BPF_LD_W_ABS, arg_lo(2)));
    f.push(jump(BPF_JSET_K, u32::MAX, 3, 0));
    f.push(stmt(BPF_LD_W_ABS, arg_hi(2)));
    f.push(jump(BPF_JSET_K, u32::MAX, 1, 0));
    f.push(allow);
    f.push(deny);
    // prctl(option, ...): the listed options only.
    f.push(jump(BPF_JEQ_K, libc::SYS_prctl as u32, 0, 1 + 2 * ALLOWED_PRCTL.len() as u8 + 1));
    f.push(stmt(BPF_LD_W_ABS, arg_lo(0)));
    for opt in ALLOWED_PRCTL {
        f.push(jump(BPF_JEQ_K, *opt, 0, 1));
        f.push(allow);
    }
    f.push(deny);
    f.push(deny);
    f
}

fn check(rc: libc::c_long, what: &str) -> Result<()> {
    if rc < 0 {
        Err(Error::Internal(format!("backend worker sandbox: {what}: {}", std::io::Error::last_os_error())))
    } else {
        Ok(())
    }
}

/// First thing in the worker: close every descriptor but stdin (the channel), stdout and stderr; die with the
/// process that started it (`parent`), which must still be the parent (else it is already gone).
pub fn detach(parent: i32) -> Result<()> {
    // SAFETY: close_range on descriptors this process does not use (Redis's, inherited through exec).
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if closed < 0 {
        for fd in 3..1024 {
            // SAFETY: as above, one by one on kernels without close_range.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } as _, "PR_SET_PDEATHSIG")?;
    // SAFETY: getppid has no arguments.
    if unsafe { libc::getppid() } != parent {
        return Err(Error::Internal("backend worker: Redis exited before the worker started".into()));
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as _, "PR_SET_NO_NEW_PRIVS")?;
    // A fault ends the worker (Redis sees the signal and replaces it); Rust's handler, which reports stack
    // overflows, would return from a SIGSEGV that was sent rather than caused.
    // SAFETY: resets two signals to their default action.
    unsafe {
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
    Ok(())
}

/// The process's address space now (VmSize), in bytes.
pub fn address_space() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

/// Address space beyond the loaded libraries and the backend memory bound: thread stacks, the allocators'
/// reservations, the lanes' mappings.
pub const HEADROOM: u64 = 1 << 30;

/// Limits, then the filter (for every thread of the process, the backends' own included). `memory_bound` 0:
/// no address-space limit (the operator asked for an unbounded backend).
pub fn confine(memory_bound: u64) -> Result<()> {
    let set = |resource, value: u64| {
        let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit with a valid struct.
        check(unsafe { libc::setrlimit(resource, &lim) } as _, "setrlimit")
    };
    set(libc::RLIMIT_CORE, 0)?;
    super::broker::prepare();
    if memory_bound > 0 {
        set(libc::RLIMIT_AS, address_space().saturating_add(memory_bound).saturating_add(HEADROOM))?;
    }
    apply_filter()
}

fn apply_filter() -> Result<()> {
    let f = filter();
    let prog = libc::sock_fprog { len: f.len() as u16, filter: f.as_ptr() as *mut libc::sock_filter };
    // SAFETY: NO_NEW_PRIVS is set (detach), so an unprivileged filter is allowed; `prog` points to `f`, which
    // lives across the call (the kernel copies it).
    check(
        unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) },
        "seccomp",
    )
}

/// `redisai-worker --sandbox-test`: confines itself as a worker does and tries what a worker must not do; one
/// line per attempt, and whether every one was refused.
pub fn self_test() -> bool {
    super::refused::set_label("sandbox test");
    // SAFETY: getppid has no arguments.
    if let Err(e) = detach(unsafe { libc::getppid() }).and_then(|()| confine(1 << 30)) {
        println!("sandbox: {e}");
        return false;
    }
    let mut all = true;
    let mut attempt = |what: &str, rc: libc::c_long| {
        let refused = rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        println!("{what}: {}", if refused { "refused" } else { "ALLOWED" });
        all &= refused;
    };
    // SAFETY: each call is made with valid arguments (static strings, null-terminated argument vectors, a
    // valid rlimit); the filter refuses them before they do anything.
    unsafe {
        attempt("open /etc/passwd", libc::open(c"/etc/passwd".as_ptr(), libc::O_RDONLY) as _);
        attempt("open /proc/self/environ", libc::open(c"/proc/self/environ".as_ptr(), libc::O_RDONLY) as _);
        attempt(
            "openat /tmp, create",
            libc::openat(libc::AT_FDCWD, c"/tmp/redisai-worker-test".as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600)
                as _,
        );
        attempt("socket AF_INET", libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as _);
        attempt("socket AF_UNIX", libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) as _);
        let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
        attempt("execve /bin/true", libc::execve(c"/bin/true".as_ptr(), argv.as_ptr(), std::ptr::null()) as _);
        attempt("ptrace TRACEME", libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0));
        let inf = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
        attempt("raise RLIMIT_AS", libc::setrlimit(libc::RLIMIT_AS, &inf) as _);
        attempt("prctl PR_SET_DUMPABLE", libc::prctl(libc::PR_SET_DUMPABLE, 1) as _);
        attempt(
            "stat /etc/passwd",
            libc::syscall(libc::SYS_newfstatat, libc::AT_FDCWD, c"/etc/passwd".as_ptr(), [0u8; 256].as_mut_ptr(), 0),
        );
    }
    // Each refusal above was counted (INFO's per-worker line shows the count).
    let (counted, last) = super::refused::totals();
    let told = counted >= 10 && last == Some(libc::SYS_newfstatat);
    println!("refusals counted: {counted}, the last {}", last.and_then(super::refused::name).unwrap_or("none"));
    all &= told;
    // What it may do: threads, memory, time, and read the broker's files.
    let mut buf = [0u8; 8];
    // SAFETY: open of a static path and a read into a local buffer.
    let random = unsafe {
        let fd = libc::open(c"/dev/urandom".as_ptr(), libc::O_RDONLY);
        fd >= 0 && libc::read(fd, buf.as_mut_ptr().cast(), 8) == 8
    };
    println!("read /dev/urandom: {}", if random { "allowed" } else { "FAILED" });
    // fstat of a descriptor it holds, as glibc asks for it (newfstatat with an empty path: broker.rs).
    // SAFETY: newfstatat of the descriptor just opened, with an empty path, into a local stat.
    let fstat = unsafe {
        let fd = libc::open(c"/dev/urandom".as_ptr(), libc::O_RDONLY);
        let mut st: libc::stat = std::mem::zeroed();
        let r = libc::syscall(libc::SYS_newfstatat, fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH);
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR
    };
    println!("fstat as newfstatat(fd, \"\"): {}", if fstat { "allowed" } else { "FAILED" });
    all &= fstat;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains("processor"));
    println!("read /proc/cpuinfo (snapshot): {}", if cpuinfo { "allowed" } else { "FAILED" });
    all &= random && cpuinfo;
    let ok =
        std::thread::spawn(|| vec![1u8; 1 << 20].iter().map(|b| *b as u64).sum::<u64>()).join().ok() == Some(1 << 20);
    println!("thread and memory: {}", if ok { "allowed" } else { "FAILED" });
    all && ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_s_jumps_land_inside_it() {
        let f = filter();
        for (i, ins) in f.iter().enumerate() {
            if ins.code == BPF_JEQ_K || ins.code == BPF_JSET_K {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < f.len(), "jump at {i} leaves the program");
            }
        }
        assert!(f.len() < 4096, "BPF_MAXINSNS");
        let last = f.last().unwrap();
        assert_eq!((last.code, last.k), (BPF_RET_K, SECCOMP_RET_TRAP), "default: refuse (the handler counts it)");
    }
}
