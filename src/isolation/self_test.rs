//! `redisai-worker --sandbox-test [gpu]`: the worker confines itself as a worker of that policy does (no backend
//! loaded) and tries what a worker must not do, then what it must be able to do; one line per attempt, and the
//! exit status says whether every answer was the expected one. Run by the flow tests (test_isolation.py).

use super::sandbox::{self, Policy};

pub fn run(policy: Policy) -> bool {
    super::refused::set_label("sandbox test", true);
    // SAFETY: getppid has no arguments.
    let parent = unsafe { libc::getppid() };
    let confined = sandbox::detach(parent)
        .and_then(|()| sandbox::restrict_files(policy))
        .and_then(|()| sandbox::confine(1 << 30, policy));
    if let Err(e) = confined {
        println!("sandbox: {e}");
        return false;
    }
    let mut all = true;
    let mut refused = 0u64;
    let mut attempt = |what: &str, rc: libc::c_long| {
        // EPERM from the filter's handler, EACCES from Landlock (a GPU worker's opens).
        let errno = std::io::Error::last_os_error().raw_os_error();
        let ok = rc < 0 && matches!(errno, Some(libc::EPERM) | Some(libc::EACCES));
        println!("{what}: {}", if ok { "refused" } else { "ALLOWED" });
        all &= ok;
        refused += 1;
    };
    let environ = std::ffi::CString::new(format!("/proc/{parent}/environ")).unwrap_or_default();
    // SAFETY: each call is made with valid arguments (static strings, null-terminated argument vectors, a
    // valid rlimit); the filter or Landlock refuses them before they do anything.
    unsafe {
        attempt("open /etc/passwd", libc::open(c"/etc/passwd".as_ptr(), libc::O_RDONLY) as _);
        // A GPU worker reads its own /proc (CUDA does); its environment holds the backend variables only.
        if policy == Policy::Cpu {
            attempt("open /proc/self/environ", libc::open(c"/proc/self/environ".as_ptr(), libc::O_RDONLY) as _);
        }
        attempt("open the parent's environ", libc::open(environ.as_ptr(), libc::O_RDONLY) as _);
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
        attempt("raise RLIMIT_CORE", libc::setrlimit(libc::RLIMIT_CORE, &inf) as _);
        attempt("prctl PR_SET_DUMPABLE", libc::prctl(libc::PR_SET_DUMPABLE, 1) as _);
        attempt("ioctl TIOCSTI on stderr", libc::ioctl(2, libc::TIOCSTI, c"x".as_ptr()) as _);
        if policy == Policy::Cpu {
            attempt(
                "stat /etc/passwd",
                libc::syscall(
                    libc::SYS_newfstatat,
                    libc::AT_FDCWD,
                    c"/etc/passwd".as_ptr(),
                    [0u8; 256].as_mut_ptr(),
                    0,
                ),
            );
        } else {
            attempt(
                "openat /usr/lib, create",
                libc::openat(
                    libc::AT_FDCWD,
                    c"/usr/lib/redisai-worker-test".as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o600,
                ) as _,
            );
        }
    }
    // Each refusal above was counted (INFO's per-worker line shows the count), the last by name.
    let (counted, last) = super::refused::totals();
    let last_expected = if policy == Policy::Cpu { libc::SYS_newfstatat } else { libc::SYS_openat };
    println!("refusals counted: {counted}, the last {}", last.and_then(super::refused::name).unwrap_or("none"));
    all &= counted >= refused && last == Some(last_expected);

    let mut check = |what: &str, ok: bool| {
        println!("{what}: {}", if ok { "allowed" } else { "FAILED" });
        all &= ok;
    };
    let mut buf = [0u8; 8];
    // SAFETY: open of a static path and a read into a local buffer.
    let urandom = unsafe { libc::open(c"/dev/urandom".as_ptr(), libc::O_RDONLY) };
    // SAFETY: a read into a local buffer from the descriptor just opened.
    check("read /dev/urandom", urandom >= 0 && unsafe { libc::read(urandom, buf.as_mut_ptr().cast(), 8) } == 8);
    // fstat of a descriptor it holds, as glibc asks for it (newfstatat with an empty path: broker.rs).
    // SAFETY: newfstatat of the descriptor opened above, with an empty path, into a local stat.
    let fstat = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let r = libc::syscall(libc::SYS_newfstatat, urandom, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH);
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR
    };
    check("fstat as newfstatat(fd, \"\")", fstat);
    check("read /proc/cpuinfo", std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains("processor")));
    if policy == Policy::Gpu {
        // A library directory (what CUDA's libraries are loaded from), its own /proc, and no address-space limit
        // (CUDA reserves more than any bound).
        check("list /usr/lib", std::fs::read_dir("/usr/lib").is_ok_and(|mut d| d.next().is_some()));
        check(
            "read /proc/self/status",
            std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.contains("Seccomp:")),
        );
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit into a local.
        let unlimited =
            unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 && lim.rlim_cur == libc::RLIM_INFINITY;
        check("no address-space limit", unlimited);
    }
    let sum = std::thread::spawn(|| vec![1u8; 1 << 20].iter().map(|b| *b as u64).sum::<u64>()).join().ok();
    check("thread and memory", sum == Some(1 << 20));
    all
}
