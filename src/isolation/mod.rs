//! Isolated execution (docs/design.md, "Isolated execution"): backends run in worker processes that the module
//! starts (`redisai-worker`, shipped beside libredisai.so), confined by the kernel, and reached through the
//! same seam as a backend in this process. Load-time `EXECUTION_MODE ISOLATED` turns it on.
//!
//! Redis's side: `proxy` (the seam's implementation), `supervisor` (starting, watching, replacing workers),
//! `callbacks` (a script's calls back into Redis). Both sides: `lane` (shared memory and its turn-taking),
//! `wire` (the messages), `channel` (lanes handed over). The worker's side: `worker`, `sandbox`.

mod broker;
mod callbacks;
mod channel;
mod landlock;
mod lane;
mod notifier;
mod post;
mod proxy;
mod refused;
mod request;
pub mod sandbox;
mod self_test;
mod supervisor;
mod wire;
pub mod worker;

use crate::backend_kind::BackendKind;
use crate::backends::{LoadOptions, LoadedModel, LoadedScript};
use crate::blob::Blob;
use crate::config::CONFIG;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::script_spec::ScriptSpec;

pub use callbacks::{set_host, Host};
pub use notifier::notifier as posted_notifier;
pub use post::{
    collect as collect_posted, defer_rings, enable as enable_posting, in_flight as posted_in_flight, ring_deferred,
};

/// The worker executable's name, beside libredisai.so unless load-time `WORKER_PATH` says otherwise.
pub const WORKER_NAME: &str = "redisai-worker";

/// Keeps the backend variables of the server's environment for the workers (at load: Valkey empties the
/// environment once it has started).
pub fn capture_environment() {
    supervisor::environment();
}

/// Whether backends run in workers.
pub fn enabled() -> bool {
    CONFIG.read().isolated
}

/// Admits (crate::admission) and builds a model in its worker.
pub fn load_model(backend: BackendKind, blob: Blob, opts: &LoadOptions) -> Result<Box<dyn LoadedModel>> {
    crate::admission::check(backend, &blob)?;
    proxy::load_model(backend, blob, opts)
}

/// Compiles a script in the TORCH worker of its device.
pub fn load_script(spec: &ScriptSpec, device: &Device) -> Result<Box<dyn LoadedScript>> {
    proxy::load_script(spec, device)
}

/// The worker's path and arguments for `kind`: this process (its parent), the backend, the memory bound, the
/// module's directory, and the load-time arguments that say where the library is.
fn worker_command(kind: BackendKind) -> Result<(String, Vec<String>)> {
    let c = CONFIG.read();
    let dir = c.module_dir.clone().unwrap_or_default();
    let path = match &c.worker_path {
        Some(p) => p.clone(),
        None if !dir.is_empty() => format!("{dir}/{WORKER_NAME}"),
        None => return Err(Error::Unavailable(format!("Could not load backend {}: no worker path", kind.name()))),
    };
    // SAFETY: getpid has no arguments.
    let mut args = vec![unsafe { libc::getpid() }.to_string(), kind.name().to_string()];
    args.push(c.backend_memory_bound().to_string());
    args.push(dir);
    if let Some(base) = &c.backends_path {
        args.extend(["BACKENDSPATH".to_string(), base.clone()]);
    }
    for (backend, lib) in c.backend_libs.iter().filter(|(b, _)| b == kind.name()) {
        args.extend([backend.clone(), lib.clone()]);
    }
    if c.inter_op_parallelism > 0 {
        args.extend(["INTER_OP_PARALLELISM".to_string(), c.inter_op_parallelism.to_string()]);
    }
    Ok((path, args))
}

static VERSIONS: parking_lot::Mutex<Vec<(BackendKind, String)>> = parking_lot::Mutex::new(Vec::new());

fn record_version(kind: BackendKind, version: &str) {
    let mut v = VERSIONS.lock();
    v.retain(|(k, _)| *k != kind);
    v.push((kind, version.to_string()));
}

/// The version a worker of `kind` reported, once one started.
pub fn version(kind: BackendKind) -> Option<String> {
    VERSIONS.lock().iter().find(|(k, _)| *k == kind).map(|(_, v)| v.clone())
}

/// `(INFO field, version)` of every backend a worker has loaded so far (INFO's ai_backends_info).
pub fn loaded_versions() -> Vec<(&'static str, String)> {
    crate::backends::BACKENDS.iter().filter_map(|b| version(b.kind).map(|v| (b.version_field, v))).collect()
}

/// `AI.CONFIG LOADBACKEND <backend> <path>` when backends run in workers: workers load the library from `path`;
/// RedisAI's error when the backend is loaded already (a worker of it has started) or the file is not there.
pub fn load_backend_library(kind: BackendKind, path: &str) -> Result<()> {
    let path = crate::backends::resolve_path(path);
    if version(kind).is_some() || !std::path::Path::new(&path).is_file() {
        return Err(Error::Unavailable("error loading backend".into()));
    }
    CONFIG.write().backend_libs.push((kind.name().to_string(), path));
    Ok(())
}

/// What the workers' backends add to INFO's `section`, summed over the workers of each backend.
pub fn info_fields(section: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for p in supervisor::slots().iter().filter_map(|s| s.current()) {
        for (sec, field, value) in proxy::worker_info(&p).unwrap_or_default() {
            if sec != section {
                continue;
            }
            match out.iter_mut().find(|(f, _)| *f == field) {
                Some((_, v)) => *v += value,
                None => out.push((field, value)),
            }
        }
    }
    out
}

/// INFO's per-worker lines: `(field, value)` with the worker's pid, resident memory, restarts, last exit, and the
/// system calls its sandbox refused (how many, and the last: a backend that fails inside the sandbox says why).
pub fn info() -> Vec<(String, String)> {
    supervisor::slots()
        .iter()
        .map(|s| {
            let current = s.current();
            let (refusals, last_refused) =
                refused::from_info(&current.as_ref().and_then(|p| proxy::worker_info(p).ok()).unwrap_or_default());
            let field = format!(
                "worker_{}_{}",
                s.device.replace(':', "_").to_ascii_lowercase(),
                s.kind.name().to_ascii_lowercase()
            );
            let value = format!(
                "pid={},generation={},rss={},restarts={},last_exit={},refused_calls={},last_refused={}",
                current.as_ref().map_or(0, |p| p.pid),
                current.as_ref().map_or(0, |p| p.generation),
                current.as_ref().map_or(0, |p| supervisor::rss(p.pid)),
                s.restarts.load(std::sync::atomic::Ordering::Relaxed),
                s.last_exit.lock().as_deref().unwrap_or("none").replace([' ', ',', ':'], "_"),
                refusals,
                last_refused,
            );
            (field, value)
        })
        .collect()
}
