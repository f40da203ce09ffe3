//! TorchScript scripts: source, device, tag and entry points as stored, the compiled handle, and stats.

use std::sync::Arc;

use crate::backends::{self, LoadedScript};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::{self, EntryKind, Stats};

pub use crate::script_spec::{CallStyle, ScriptSpec};

/// Whom a run acts for: what scripts' `redis.execute` and `redisAI.model_execute` (and TorchScript models that
/// call them) run as. Callbacks act with the client's ACL user, never as the module's superuser context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client's database.
    pub db: i32,
    /// The client's ACL user name; `None` (not looked up: the run has no TorchScript) makes callbacks refuse.
    pub user: Option<Arc<[u8]>>,
    /// The command was read-only (AI.DAGEXECUTE_RO, AI.DAGRUN_RO): callbacks may not write.
    pub read_only: bool,
}

thread_local! {
    /// The caller of the request whose op runs on this thread.
    static CALLER: std::cell::RefCell<Caller> = std::cell::RefCell::new(Caller::default());
}

/// Runs `f` with `caller` as the caller that script callbacks of this thread act for.
pub fn with_caller<R>(caller: &Caller, f: impl FnOnce() -> R) -> R {
    let old = CALLER.with(|c| c.replace(caller.clone()));
    let r = f();
    CALLER.with(|c| *c.borrow_mut() = old);
    r
}

pub fn current_caller() -> Caller {
    CALLER.with(|c| c.borrow().clone())
}

pub struct Script {
    pub spec: ScriptSpec,
    pub device: std::result::Result<Device, Error>,
    pub handle: std::result::Result<Box<dyn LoadedScript>, Error>,
    pub stats: Arc<Stats>,
}

fn parse_device(name: &str) -> Result<Device> {
    Device::parse(name.as_bytes()).map_err(|_| Error::parse("Error configuring script: unsupported device"))
}

impl Script {
    /// Compiles the script and checks its entry points (slow: off the main thread).
    pub fn build(key: &[u8], spec: ScriptSpec) -> Result<Script> {
        let device = parse_device(&spec.device_name)?;
        let handle = backends::load_script(&spec, &device)?;
        Ok(Script::with_handle(key, spec, Ok(device), Ok(handle)))
    }

    /// For RDB loads: a script that cannot be compiled now is kept, so no data is lost.
    pub fn restore(key: &[u8], spec: ScriptSpec) -> Script {
        let device = parse_device(&spec.device_name);
        let handle = device.as_ref().map_err(Clone::clone).and_then(|d| backends::load_script(&spec, d));
        Script::with_handle(key, spec, device, handle)
    }

    pub fn with_handle(
        key: &[u8],
        spec: ScriptSpec,
        device: Result<Device>,
        handle: Result<Box<dyn LoadedScript>>,
    ) -> Script {
        let stats = Arc::new(Stats::new(key, EntryKind::Script, "TORCH", &spec.device_name, &spec.tag));
        Script { spec, device, handle, stats }
    }

    pub fn loaded(&self) -> Result<&dyn LoadedScript> {
        self.handle.as_deref().map_err(Clone::clone)
    }

    /// The queue its ops run on.
    pub fn queue_key(&self) -> std::sync::Arc<str> {
        self.spec.device_name.to_ascii_uppercase().into()
    }

    pub fn mem_usage(&self) -> usize {
        std::mem::size_of::<Script>() + self.spec.source.len() + self.spec.tag.len()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        stats::unregister(&self.stats);
    }
}
