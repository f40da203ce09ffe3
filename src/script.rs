//! TorchScript scripts: source, device, tag and entry points as stored, the compiled handle, and stats.

use std::sync::Arc;

use crate::backends::{self, LoadedScript};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::{self, EntryKind, Stats};

pub use crate::script_spec::{CallStyle, ScriptSpec};

pub struct Script {
    pub spec: ScriptSpec,
    pub device: std::result::Result<Device, Error>,
    pub handle: std::result::Result<Box<dyn LoadedScript>, Error>,
    pub stats: Arc<Stats>,
}

fn parse_device(name: &str) -> Result<Device> {
    Device::parse(name.as_bytes()).map_err(|_| Error::parse("Error configuring script: unsupported device"))
}

/// Compiles in a worker when backends run isolated, else in this process.
fn load_handle(spec: &ScriptSpec, device: &Device) -> Result<Box<dyn LoadedScript>> {
    if crate::isolation::enabled() {
        crate::isolation::load_script(spec, device)
    } else {
        backends::load_script(spec, device)
    }
}

impl Script {
    /// Compiles the script and checks its entry points (slow: off the main thread).
    pub fn build(key: &[u8], spec: ScriptSpec) -> Result<Script> {
        let device = parse_device(&spec.device_name)?;
        let handle = load_handle(&spec, &device)?;
        Ok(Script::with_handle(key, spec, Ok(device), Ok(handle)))
    }

    /// For RDB loads: a script that cannot be compiled now is kept, so no data is lost.
    pub fn restore(key: &[u8], spec: ScriptSpec) -> Script {
        let device = parse_device(&spec.device_name);
        let handle = device.as_ref().map_err(Clone::clone).and_then(|d| load_handle(&spec, d));
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
