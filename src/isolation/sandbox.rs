//! What a worker does to itself before it takes a model: only its channel open, dead when Redis dies, first in
//! line for the kernel's OOM killer, no new privileges, an address-space limit derived from the backend memory
//! bound, no core dumps, and a seccomp filter that lets the backends compute, allocate and make threads but not
//! open a file, make a socket, run a program, trace a process or raise a limit. Applied after the backend
//! library is loaded (loading opens files).
//!
//! A GPU worker (`Policy::Gpu`) differs where CUDA needs it to: CUDA opens its device nodes and libraries
//! lazily and drives the device through `ioctl`, and it reserves more address space than any bound. Its opens
//! go to the kernel under a Landlock ruleset made before the library loads (so that every thread is under it:
//! `gpu_rules`), `ioctl` is allowed but for a terminal's input injection, stat calls are allowed, and there is
//! no address-space limit.

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

/// What a GPU worker may do besides (CUDA's driver and runtime): open what the Landlock ruleset allows
/// (`openat2`, which the broker uses for the trapped opens: broker.rs), stat paths, list directories, poll its
/// own descriptors. `ioctl` is allowed apart (`filter`).
const GPU_ALLOWED: &[libc::c_long] = &[
    libc::SYS_openat2,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_access,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
    libc::SYS_getdents64,
    libc::SYS_pipe2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
];

/// `ioctl` requests a GPU worker may not make on any descriptor: pushing input into a terminal (stderr may be
/// Redis's) and the console's. The kernel reads the request as 32 bits, so the low word is what is compared.
const REFUSED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// Which confinement a worker gets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Policy {
    Cpu,
    Gpu,
}

impl Policy {
    /// A GPU device's workers get the GPU policy (device names as `Device::parse` reads them: `GPU`, `gpu:1`).
    pub fn for_device(device: &str) -> Policy {
        if device.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("gpu")) {
            Policy::Gpu
        } else {
            Policy::Cpu
        }
    }
}

/// prctl options a backend uses on itself: naming threads (and glibc naming its mappings).
const ALLOWED_PRCTL: &[u32] = &[libc::PR_SET_NAME as u32, libc::PR_GET_NAME as u32, 0x5356_4d41 /* PR_SET_VMA */];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: the architecture checked first (another ABI's numbers would mean other calls), each allowed
/// call let through, `prlimit64` only to read a limit, `prctl` only for the options above; anything else is
/// trapped (SIGSYS) and the handler answers it (broker.rs): `open`/`openat` with the files the broker serves,
/// everything else counted (refused.rs) and failed with EPERM, which the backends treat as a missing file or
/// feature rather than crashing.
pub fn filter(policy: Policy) -> Vec<libc::sock_filter> {
    let allow = stmt(BPF_RET_K, SECCOMP_RET_ALLOW);
    let deny = stmt(BPF_RET_K, SECCOMP_RET_TRAP);
    let mut f = vec![
        stmt(BPF_LD_W_ABS, ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR),
    ];
    let gpu: &[libc::c_long] = if policy == Policy::Gpu { GPU_ALLOWED } else { &[] };
    for nr in ALLOWED.iter().chain(gpu) {
        f.push(jump(BPF_JEQ_K, *nr as u32, 0, 1));
        f.push(allow);
    }
    if policy == Policy::Gpu {
        // ioctl(fd, request, ...): any request but the refused ones (other calls jump past, the number still
        // loaded).
        f.push(jump(BPF_JEQ_K, libc::SYS_ioctl as u32, 0, 2 * REFUSED_IOCTLS.len() as u8 + 2));
        f.push(stmt(BPF_LD_W_ABS, arg_lo(1)));
        for req in REFUSED_IOCTLS {
            f.push(jump(BPF_JEQ_K, *req, 0, 1));
            f.push(deny);
        }
        f.push(allow);
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
    // Should memory run out, the kernel kills a worker (which Redis replaces) before Redis: a worker may raise
    // its own score without privileges. Best effort: a read-only /proc leaves it as it was.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
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

/// Before the backend library loads, while the process has one thread (Landlock binds the thread that asks
/// and the threads it starts later, not those already running): a GPU worker's files (`gpu_rules`).
pub fn restrict_files(policy: Policy) -> Result<()> {
    if policy == Policy::Cpu {
        return Ok(());
    }
    let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0);
    if threads != 1 {
        return Err(Error::Internal(format!(
            "backend worker sandbox: {threads} threads before Landlock (it would bind only one of them)"
        )));
    }
    super::landlock::restrict(&gpu_rules())
}

/// What a GPU worker may open: read the libraries (the system's, CUDA toolkits', the backends' and those beside
/// them) and the descriptions of the machine and of itself; read, write and drive the NVIDIA device nodes.
/// Not Redis's `dir`, not a home, not `/etc` (but the loader's cache), not another process's `/proc`.
pub fn gpu_rules() -> Vec<(String, u64)> {
    use super::landlock::{IOCTL_DEV, READ_DIR, READ_FILE, WRITE_FILE};
    let mut read: Vec<String> = [
        "/usr/lib",
        "/usr/lib64",
        "/lib",
        "/lib64",
        "/usr/local/lib",
        "/etc/ld.so.cache",
        "/proc/self",
        "/proc/driver/nvidia",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/sys/devices",
        "/sys/bus",
        "/sys/class",
        "/sys/module",
        "/sys/dev",
        "/dev/urandom",
        "/dev/null",
        "/dev/zero",
    ]
    .map(String::from)
    .to_vec();
    let entries = |dir: &str, prefix: &str| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|it| {
                it.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .map(|e| e.path().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    // CUDA toolkits: /usr/local/cuda, /usr/local/cuda-12.8, …
    read.extend(entries("/usr/local", "cuda"));
    // The backends' libraries and what they load beside them: the module's directory, BACKENDSPATH, each
    // library given at load time and two levels above it (pip's CUDA wheels are found through
    // `$ORIGIN/../../nvidia/*`), the build's backend cache, LD_LIBRARY_PATH.
    {
        let c = crate::config::CONFIG.read();
        read.extend(c.module_dir.iter().cloned());
        read.extend(c.backends_path.iter().cloned());
        for (_, lib) in &c.backend_libs {
            let lib = std::path::Path::new(lib);
            read.extend(lib.ancestors().skip(1).take(3).map(|d| d.to_string_lossy().into_owned()));
        }
    }
    let built = [
        option_env!("REDISAI_ONNX_LIB_DIR"),
        option_env!("REDISAI_TF_LIB_DIR"),
        option_env!("REDISAI_TFLITE_LIB_DIR"),
        option_env!("LIBTORCH"),
    ];
    read.extend(built.iter().flatten().map(|d| d.to_string()));
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        read.extend(std::env::split_paths(&paths).map(|p| p.to_string_lossy().into_owned()));
    }
    read.retain(|p| p.starts_with('/') && p.len() > 1);
    let mut rules: Vec<(String, u64)> = read.into_iter().map(|p| (p, READ_FILE | READ_DIR)).collect();
    // /dev/nvidiactl, /dev/nvidia0…, /dev/nvidia-uvm, /dev/nvidia-caps/…
    rules.extend(entries("/dev", "nvidia").into_iter().map(|p| (p, READ_FILE | WRITE_FILE | READ_DIR | IOCTL_DEV)));
    rules
}

/// Limits, then the filter (for every thread of the process, the backends' own included). `memory_bound` 0:
/// no address-space limit (the operator asked for an unbounded backend); a GPU worker has none either (CUDA
/// reserves address space for the device's memory and more: the kernel's OOM killer takes the worker first).
pub fn confine(memory_bound: u64, policy: Policy) -> Result<()> {
    let set = |resource, value: u64| {
        let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: setrlimit with a valid struct.
        check(unsafe { libc::setrlimit(resource, &lim) } as _, "setrlimit")
    };
    set(libc::RLIMIT_CORE, 0)?;
    super::broker::prepare(policy == Policy::Gpu);
    if memory_bound > 0 && policy == Policy::Cpu {
        set(libc::RLIMIT_AS, address_space().saturating_add(memory_bound).saturating_add(HEADROOM))?;
    }
    apply_filter(policy)
}

fn apply_filter(policy: Policy) -> Result<()> {
    let f = filter(policy);
    let prog = libc::sock_fprog { len: f.len() as u16, filter: f.as_ptr() as *mut libc::sock_filter };
    // SAFETY: NO_NEW_PRIVS is set (detach), so an unprivileged filter is allowed; `prog` points to `f`, which
    // lives across the call (the kernel copies it).
    check(
        unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) },
        "seccomp",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_s_jumps_land_inside_it() {
        for policy in [Policy::Cpu, Policy::Gpu] {
            check_jumps(&filter(policy));
        }
    }

    /// What the filter answers for a call: the program run on a `seccomp_data` (LD W ABS, JEQ, JSET and RET:
    /// what `filter` uses).
    fn run(f: &[libc::sock_filter], nr: libc::c_long, args: [u64; 6]) -> u32 {
        let word = |k: u32| -> u32 {
            match k {
                NR => nr as u32,
                ARCH => AUDIT_ARCH,
                k if k >= 16 => {
                    let a = args[((k - 16) / 8) as usize];
                    if (k - 16) % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                _ => panic!("offset {k}"),
            }
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = f[pc];
            pc += 1;
            match ins.code {
                BPF_LD_W_ABS => acc = word(ins.k),
                BPF_JEQ_K => pc += if acc == ins.k { ins.jt } else { ins.jf } as usize,
                BPF_JSET_K => pc += if acc & ins.k != 0 { ins.jt } else { ins.jf } as usize,
                BPF_RET_K => return ins.k,
                c => panic!("code {c}"),
            }
        }
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // ioctl requests are c_ulong: u64 on 64-bit Linux, not everywhere
    fn the_filter_answers_each_policy_s_calls() {
        let (cpu, gpu) = (filter(Policy::Cpu), filter(Policy::Gpu));
        let none = [0u64; 6];
        let ioctl = |req: u64| [2, req, 0, 0, 0, 0];
        for f in [&cpu, &gpu] {
            assert_eq!(run(f, libc::SYS_read, none), SECCOMP_RET_ALLOW);
            assert_eq!(run(f, libc::SYS_socket, none), SECCOMP_RET_TRAP);
            assert_eq!(run(f, libc::SYS_execve, none), SECCOMP_RET_TRAP);
            assert_eq!(run(f, libc::SYS_openat, none), SECCOMP_RET_TRAP, "opens go to the broker");
            assert_eq!(run(f, libc::SYS_prlimit64, none), SECCOMP_RET_ALLOW, "reading a limit");
            assert_eq!(run(f, libc::SYS_prlimit64, [0, 9, 1 << 40, 0, 0, 0]), SECCOMP_RET_TRAP, "setting one");
            assert_eq!(run(f, libc::SYS_prctl, [libc::PR_SET_NAME as u64, 0, 0, 0, 0, 0]), SECCOMP_RET_ALLOW);
            assert_eq!(run(f, libc::SYS_ioctl, ioctl(libc::TIOCSTI as u64)), SECCOMP_RET_TRAP);
            assert_eq!(run(f, libc::SYS_ioctl, ioctl((1 << 32) | libc::TIOCSTI as u64)), SECCOMP_RET_TRAP);
        }
        assert_eq!(run(&cpu, libc::SYS_ioctl, ioctl(0xc020_462a)), SECCOMP_RET_TRAP, "no ioctl on CPU");
        assert_eq!(run(&gpu, libc::SYS_ioctl, ioctl(0xc020_462a)), SECCOMP_RET_ALLOW, "a driver's request");
        assert_eq!(run(&gpu, libc::SYS_ioctl, ioctl(libc::TIOCLINUX as u64)), SECCOMP_RET_TRAP);
        assert_eq!(run(&cpu, libc::SYS_openat2, none), SECCOMP_RET_TRAP);
        assert_eq!(run(&gpu, libc::SYS_openat2, none), SECCOMP_RET_ALLOW, "under Landlock");
        assert_eq!(run(&cpu, libc::SYS_newfstatat, none), SECCOMP_RET_TRAP);
        assert_eq!(run(&gpu, libc::SYS_newfstatat, none), SECCOMP_RET_ALLOW);
    }

    #[test]
    fn gpu_devices_get_the_gpu_policy() {
        assert_eq!(Policy::for_device("GPU:0"), Policy::Gpu);
        assert_eq!(Policy::for_device("gpu"), Policy::Gpu);
        assert_eq!(Policy::for_device("CPU:1"), Policy::Cpu);
        assert_eq!(Policy::for_device(""), Policy::Cpu);
        assert_eq!(Policy::for_device("GP€"), Policy::Cpu, "not a character boundary: no panic");
    }

    fn check_jumps(f: &[libc::sock_filter]) {
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
