//! TorchScript scripts: source, device, tag and entry points as stored, the compiled handle, and stats.

use std::sync::Arc;

use crate::backends::{self, LoadedScript};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::{self, EntryKind, Stats};

/// How a script function receives its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStyle {
    /// `def f(tensors: List[Tensor], keys: List[str], args: List[str])` (AI.SCRIPTEXECUTE).
    EntryPoint,
    /// Tensor parameters, the ones from `list_from` on (`$`) as a List[Tensor] (AI.SCRIPTRUN).
    Positional { list_from: Option<usize> },
}

thread_local! {
    /// The database of the request whose script runs on this thread (what `redis.execute` works on).
    static CURRENT_DB: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with `db` as the database that script callbacks of this thread use.
pub fn with_db<R>(db: i32, f: impl FnOnce() -> R) -> R {
    let old = CURRENT_DB.with(|c| c.replace(db));
    let r = f();
    CURRENT_DB.with(|c| c.set(old));
    r
}

pub fn current_db() -> i32 {
    CURRENT_DB.with(|c| c.get())
}

/// Everything a script is declared with; what the RDB, AOF and SCRIPTGET carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptSpec {
    /// As given (RedisAI does not validate it at the command level; the backend does).
    pub device_name: String,
    pub tag: Vec<u8>,
    pub source: String,
    /// Empty for scripts stored with the deprecated AI.SCRIPTSET.
    pub entry_points: Vec<String>,
}

pub struct Script {
    pub spec: ScriptSpec,
    pub device: std::result::Result<Device, Error>,
    pub handle: std::result::Result<Box<dyn LoadedScript>, Error>,
    pub stats: Arc<Stats>,
}

fn parse_device(name: &str) -> Result<Device> {
    Device::parse(name.as_bytes()).map_err(|_| Error::Generic("Error configuring script: unsupported device".into()))
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
    pub fn queue_key(&self) -> String {
        self.spec.device_name.to_ascii_uppercase()
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
