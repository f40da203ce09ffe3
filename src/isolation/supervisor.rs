//! Redis's side of the workers: one worker process per (device queue, backend), started on first use from a
//! thread of its own (the worker's death signal follows the thread that started it, so that thread lives as
//! long as the worker), watched through a pidfd, and replaced on demand after it exits: every lane it held is
//! marked dead at once, so every request it held gets an error, and the next request starts a new worker.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::channel;
use super::lane::{Bell, Killer, Lane};
use super::wire::Reader;
use crate::backend_kind::BackendKind;
use crate::error::{Error, Result};

/// How long a worker may take to load its backend library and say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(120);
/// Lanes one worker may have (a lane per Redis thread waiting on it at once).
const MAX_LANES: usize = 1024;

/// One running worker process.
pub struct Process {
    pub pid: i32,
    /// Counts the workers of its slot: a model loaded in one is not loaded in the next.
    pub generation: u64,
    channel: OwnedFd,
    free: Mutex<Vec<Lane>>,
    /// Lanes whose request was given up on (the worker still runs it): free again once it has answered.
    waiting: Mutex<Vec<Lane>>,
    killers: Mutex<Vec<Killer>>,
    /// Free posted lanes (post.rs), and the bell of the worker's thread that serves them, once it has one.
    posted: Mutex<Vec<Lane>>,
    bell: std::sync::OnceLock<Bell>,
    /// Why it exited, once it has.
    exit: Mutex<Option<String>>,
    /// Models and scripts loaded in it (by id) and those to free there with the next request.
    pub loaded: Mutex<std::collections::HashSet<u64>>,
    pub to_free: Mutex<Vec<u64>>,
}

impl Process {
    /// A free lane, or a new one handed to the worker.
    pub fn lane(&self) -> Result<Lane> {
        if let Some(l) = self.free.lock().pop() {
            return Ok(l);
        }
        {
            let mut waiting = self.waiting.lock();
            if let Some(i) = waiting.iter().position(|l| l.state() == super::lane::REPLY) {
                return Ok(waiting.swap_remove(i));
            }
        }
        self.new_lane(b"L")
    }

    /// A new lane handed to the worker with `tag` (`L`: a thread of its own, `P`: the posted lanes' thread).
    fn new_lane(&self, tag: &[u8]) -> Result<Lane> {
        let mut killers = self.killers.lock();
        if let Some(why) = self.exit.lock().as_ref() {
            return Err(exited(why));
        }
        if killers.len() >= MAX_LANES {
            return Err(Error::Unavailable("too many requests wait on one backend worker".into()));
        }
        let lane = Lane::create()?;
        channel::send(&self.channel, tag, Some(lane.fd()))?;
        killers.push(lane.killer());
        Ok(lane)
    }

    /// A free posted lane (post.rs), or a new one handed to the worker's posted lanes' thread; the first one
    /// starts that thread (its bell, and `notify`: the eventfd it writes when it has answered).
    pub fn posted_lane(&self, notify: &OwnedFd) -> Result<Lane> {
        {
            let mut posted = self.posted.lock();
            if let Some(l) = posted.pop() {
                return Ok(l);
            }
            // Under `posted`'s lock: the worker gets one bell.
            if self.bell.get().is_none() {
                let b = Bell::create()?;
                channel::send(&self.channel, b"B", Some(b.fd()))?;
                channel::send(&self.channel, b"E", Some(notify))?;
                let _ = self.bell.set(b);
            }
        }
        self.new_lane(b"P")
    }

    /// Tells the posted lanes' thread that a lane holds a request.
    pub fn ring(&self) {
        if let Some(b) = self.bell.get() {
            b.ring();
        }
    }

    /// Gives a posted lane back once its answer is read, or unused (a dead one is dropped).
    pub fn give_posted(&self, lane: Lane) {
        if matches!(lane.state(), super::lane::REPLY | super::lane::IDLE) {
            self.posted.lock().push(lane);
        }
    }

    /// Gives a lane back: free after a request that finished, waiting while the worker still runs one that was
    /// given up on, dropped when dead (or broken half-way through a callback).
    pub fn give(&self, lane: Lane) {
        match lane.state() {
            super::lane::REPLY => self.free.lock().push(lane),
            super::lane::REQUEST => self.waiting.lock().push(lane),
            _ => {}
        }
    }

    /// Why the worker exited (a lane found dead).
    pub fn exit_error(&self) -> Error {
        match self.exit.lock().as_ref() {
            Some(why) => exited(why),
            None => super::lane::dead(),
        }
    }

    /// Stops a worker that overran its run's kill switch: its exit then fails every request it held.
    pub fn kill(&self) {
        // SAFETY: kill with a pid we started and have not reaped (the slot's thread reaps it after this).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }

    fn exited(&self, why: String) {
        let killers = std::mem::take(&mut *self.killers.lock());
        *self.exit.lock() = Some(why);
        for k in &killers {
            k.kill();
        }
        self.free.lock().clear();
        self.waiting.lock().clear();
        self.posted.lock().clear();
        // The main thread collects the posted runs it held (their lanes are dead now) without waiting for its
        // next event-loop iteration.
        super::notifier::notify();
    }
}

fn exited(why: &str) -> Error {
    Error::Unavailable(format!("the backend worker {why}; the request was not completed"))
}

#[derive(Default)]
struct SlotState {
    current: Option<Arc<Process>>,
    starting: bool,
    /// The last start's failure, for those that waited for it.
    failed: Option<Error>,
    generation: u64,
}

/// The worker of one (device queue, backend), across its restarts.
pub struct Slot {
    pub device: Arc<str>,
    pub kind: BackendKind,
    state: Mutex<SlotState>,
    changed: Condvar,
    pub restarts: AtomicU64,
    pub last_exit: Mutex<Option<String>>,
}

type Slots = HashMap<(Arc<str>, BackendKind), Arc<Slot>>;

static SLOTS: Mutex<Option<Slots>> = Mutex::new(None);

/// The slot of (`device`'s queue, `kind`).
pub fn slot(device: Arc<str>, kind: BackendKind) -> Arc<Slot> {
    let mut slots = SLOTS.lock();
    slots
        .get_or_insert_with(HashMap::new)
        .entry((device.clone(), kind))
        .or_insert_with(|| {
            Arc::new(Slot {
                device,
                kind,
                state: Mutex::new(SlotState::default()),
                changed: Condvar::new(),
                restarts: AtomicU64::new(0),
                last_exit: Mutex::new(None),
            })
        })
        .clone()
}

/// Every slot, for INFO.
pub fn slots() -> Vec<Arc<Slot>> {
    let mut v: Vec<_> = SLOTS.lock().as_ref().map(|s| s.values().cloned().collect()).unwrap_or_default();
    v.sort_by(|a, b| (&a.device, a.kind.name()).cmp(&(&b.device, b.kind.name())));
    v
}

impl Slot {
    /// The running worker, started (and waited for) if there is none.
    pub fn process(self: &Arc<Self>) -> Result<Arc<Process>> {
        let mut st = self.state.lock();
        loop {
            if let Some(p) = &st.current {
                return Ok(p.clone());
            }
            if !st.starting {
                st.starting = true;
                st.failed = None;
                let slot = self.clone();
                let started = std::thread::Builder::new()
                    .name(format!("ai:worker:{}", self.device))
                    .spawn(move || slot.supervise());
                if let Err(e) = started {
                    st.starting = false;
                    return Err(Error::Unavailable(format!("could not start a backend worker: {e}")));
                }
            }
            let generation = st.generation;
            while st.starting && st.generation == generation {
                self.changed.wait(&mut st);
            }
            if st.current.is_none() {
                if let Some(e) = st.failed.clone() {
                    return Err(e);
                }
            }
        }
    }

    /// The running worker, if any (without starting one).
    pub fn current(&self) -> Option<Arc<Process>> {
        self.state.lock().current.clone()
    }

    /// The slot's thread: starts the worker, publishes it, waits for its exit, records it.
    fn supervise(self: Arc<Self>) {
        let generation = self.state.lock().generation + 1;
        let started = start(&self.device, self.kind, generation);
        let (process, pidfd) = {
            let mut st = self.state.lock();
            st.starting = false;
            st.generation = generation;
            match started {
                Ok((p, pidfd)) => {
                    st.current = Some(p.clone());
                    self.changed.notify_all();
                    (p, pidfd)
                }
                Err(e) => {
                    st.failed = Some(e);
                    self.changed.notify_all();
                    return;
                }
            }
        };
        let why = wait_exit(process.pid, pidfd.as_ref());
        crate::log::warning(&format!(
            "backend worker {} for {} (pid {}) {why}; requests it held get an error, the next one starts a new worker",
            self.kind.name(),
            self.device,
            process.pid
        ));
        {
            let mut st = self.state.lock();
            if st.current.as_ref().is_some_and(|p| Arc::ptr_eq(p, &process)) {
                st.current = None;
            }
        }
        self.restarts.fetch_add(1, Ordering::Relaxed);
        *self.last_exit.lock() = Some(why.clone());
        process.exited(why);
    }
}

/// Spawns a worker (posix_spawn through `Command`: never a fork of Redis) and reads its hello.
fn start(device: &str, kind: BackendKind, generation: u64) -> Result<(Arc<Process>, Option<OwnedFd>)> {
    let (path, args) = super::worker_command(kind)?;
    let (ours, theirs) = channel::pair()?;
    let fail = |why: String| Error::Unavailable(format!("Could not load backend {}: {why}", kind.name()));
    let child = std::process::Command::new(&path)
        .args(&args)
        .env_clear()
        .envs(environment().iter().cloned())
        // ONNX Runtime keeps a telemetry database under the user's cache directory, opened at load (before the
        // sandbox) and written afterwards: none, and nowhere to make one.
        .env("ORT_DISABLE_TELEMETRY", "1")
        .env("XDG_CACHE_HOME", "/nonexistent/redisai-worker")
        // Its device queue (a GPU's worker is confined for CUDA: sandbox.rs); CUDA's JIT cache would be written
        // under the home, which no worker may write.
        .env(super::worker::DEVICE_VARIABLE, device)
        .env("CUDA_CACHE_DISABLE", "1")
        .stdin(std::process::Stdio::from(theirs))
        .spawn()
        .map_err(|e| fail(format!("cannot start the backend worker {path}: {e}")))?;
    let pid = child.id() as i32;
    drop(child);
    // SAFETY: pidfd_open on the pid just spawned (not yet reaped: only this thread reaps it).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // Without pidfds (kernels before 5.3, valgrind) the slot's thread waits with waitpid instead.
    // SAFETY: a fresh descriptor, owned from here on.
    let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
    let hello = channel::receive(&ours, HELLO_TIMEOUT);
    let version = match hello {
        Ok(Some(bytes)) => {
            let mut r = Reader::new(&bytes);
            match r.status().and_then(|()| r.bytes().map(|v| String::from_utf8_lossy(v).into_owned())) {
                Ok(v) => Ok(v),
                Err(e) => Err(e),
            }
        }
        Ok(None) => Err(fail("the backend worker exited while loading the library".into())),
        Err(e) => Err(fail(format!("no answer from the backend worker ({e})"))),
    };
    let version = match version {
        Ok(v) => v,
        Err(e) => {
            // SAFETY: stop and reap the worker that failed to start.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = wait_exit(pid, pidfd.as_ref());
            return Err(e);
        }
    };
    super::record_version(kind, &version);
    let p = Process {
        pid,
        generation,
        channel: ours,
        free: Mutex::new(Vec::new()),
        waiting: Mutex::new(Vec::new()),
        killers: Mutex::new(Vec::new()),
        posted: Mutex::new(Vec::new()),
        bell: std::sync::OnceLock::new(),
        exit: Mutex::new(None),
        loaded: Mutex::new(Default::default()),
        to_free: Mutex::new(Vec::new()),
    };
    Ok((Arc::new(p), pidfd))
}

/// The backend variables of Redis's environment (made once, at load: `super::capture_environment`), as
/// `getenv` (and so every backend in Redis's process) sees them: the executable's `__environ`. Valkey's
/// executable has a copy of it apart from libc's, and libc's, which `std::env` reads, is empty there.
pub fn environment() -> &'static [(std::ffi::OsString, std::ffi::OsString)] {
    static ENVIRONMENT: std::sync::OnceLock<Vec<(std::ffi::OsString, std::ffi::OsString)>> = std::sync::OnceLock::new();
    ENVIRONMENT.get_or_init(|| {
        let mut vars: Vec<_> = std::env::vars_os().filter(|(k, _)| backend_variable(k)).collect();
        for (name, value) in executable_environment() {
            if backend_variable(&name) && !vars.iter().any(|(k, _)| *k == name) {
                vars.push((name, value));
            }
        }
        vars
    })
}

/// The environment array that the executable's `__environ` holds (looked up from the main program's handle).
fn executable_environment() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use std::os::unix::ffi::OsStrExt;
    let mut vars = Vec::new();
    // SAFETY: dlopen(NULL) gives the main program's handle (no new object); its `__environ` is a `char **`
    // holding a NULL-terminated array of NUL-terminated strings, read on the main thread at load while nothing
    // sets a variable.
    unsafe {
        let main = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY);
        if main.is_null() {
            return vars;
        }
        let env = libc::dlsym(main, c"__environ".as_ptr()) as *const *const *const libc::c_char;
        if !env.is_null() {
            let mut p = *env;
            while !p.is_null() && !(*p).is_null() {
                let entry = std::ffi::CStr::from_ptr(*p).to_bytes();
                if let Some(eq) = entry.iter().position(|&b| b == b'=') {
                    let (name, value) = (&entry[..eq], &entry[eq + 1..]);
                    vars.push((
                        std::ffi::OsStr::from_bytes(name).to_owned(),
                        std::ffi::OsStr::from_bytes(value).to_owned(),
                    ));
                }
                p = p.add(1);
            }
        }
        libc::dlclose(main);
    }
    vars
}

/// The variables of Redis's environment a worker gets: those the backend libraries read (thread pools, kernels,
/// devices, logging), not the rest (which may hold the operator's secrets).
fn backend_variable(name: &std::ffi::OsStr) -> bool {
    const PREFIXES: &[&str] = &[
        "TF_",
        "TFLITE_",
        "ORT_",
        "OMP_",
        "KMP_",
        "MKL_",
        "ONEDNN_",
        "DNNL_",
        "TORCH_",
        "PYTORCH_",
        "CUDA_",
        "NVIDIA_",
        "CUBLAS",
        "CUDNN",
        "XLA_",
        "LD_LIBRARY_PATH",
        super::refused::LOG_VARIABLE,
    ];
    name.to_str().is_some_and(|n| PREFIXES.iter().any(|p| n.starts_with(p)))
}

/// Waits for the worker to exit and says how. Redis may have reaped it (it waits for any child while a
/// BGSAVE runs), so the exit is seen on the pidfd and the status read when it is still there; without a pidfd,
/// waitpid (which then cannot say how a worker Redis reaped ended).
fn wait_exit(pid: i32, pidfd: Option<&OwnedFd>) -> String {
    let Some(pidfd) = pidfd else {
        let mut status = 0;
        let reaped = loop {
            // SAFETY: waitpid on our own child, into a local.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break r;
            }
        };
        return match reaped {
            r if r == pid && libc::WIFEXITED(status) => how(libc::CLD_EXITED, libc::WEXITSTATUS(status)),
            r if r == pid && libc::WIFSIGNALED(status) => how(libc::CLD_KILLED, libc::WTERMSIG(status)),
            _ => "exited".into(),
        };
    };
    let mut pfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one valid pollfd.
    while unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {}
    // SAFETY: siginfo is plain data; waitid writes it for our child (P_PIDFD = 3).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        if libc::waitid(3, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED) != 0 {
            return "exited".into();
        }
        how(info.si_code, info.si_status())
    }
}

/// An exit in words, from waitid's code and status.
fn how(code: i32, status: i32) -> String {
    match code {
        libc::CLD_EXITED => format!("exited with status {status}"),
        libc::CLD_KILLED | libc::CLD_DUMPED => format!("was killed by signal {status} ({})", signal_name(status)),
        _ => "exited".into(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "signal",
    }
}

/// A worker's resident memory, in bytes (0 when it cannot be read).
pub fn rss(pid: i32) -> u64 {
    let pages = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_s_environment_holds_what_getenv_sees() {
        // A variable of this test's own (std's environment lock orders it with other tests' reads).
        std::env::set_var("TF_REDISAI_SUPERVISOR_TEST", "7");
        let vars = executable_environment();
        let found = vars.iter().find(|(k, _)| k == "TF_REDISAI_SUPERVISOR_TEST").map(|(_, v)| v.clone());
        assert_eq!(found.as_deref(), Some(std::ffi::OsStr::new("7")), "{} variables read", vars.len());
        assert!(backend_variable(std::ffi::OsStr::new("TF_REDISAI_SUPERVISOR_TEST")));
        assert!(!backend_variable(std::ffi::OsStr::new("AWS_SECRET_ACCESS_KEY")), "not a backend's");
    }
}
