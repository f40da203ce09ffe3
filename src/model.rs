//! Models: what a store (or an RDB load) declared, plus the backend's loaded handle and the run stats.

use crate::blob::Blob;
use std::sync::Arc;

use crate::backends::{self, LoadOptions, LoadedModel};
use crate::config::CONFIG;
use crate::device::Device;
use crate::error::Result;
use crate::exec::deferred::Handle;
use crate::run_history::RunHistory;
use crate::stats::{self, EntryKind, Stats};

pub use crate::backend_kind::BackendKind;

/// An input or output count that is not known, so not checked (see `Model::io_counts`).
pub const ANY_COUNT: usize = usize::MAX;

/// A model's auto-batching options (BATCHSIZE, MINBATCHSIZE, MINBATCHTIMEOUT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchOpts {
    pub size: u64,
    pub min_size: u64,
    pub min_timeout_ms: u64,
}

/// Everything a model is declared with; what the RDB, AOF and MODELGET carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub backend: BackendKind,
    pub device: Device,
    pub tag: Vec<u8>,
    pub batch: BatchOpts,
    /// Input/output names given at store time (TF) or remembered from the backend (RDB).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub blob: Blob,
}

pub struct Model {
    pub spec: ModelSpec,
    /// The backend's model; an error when it could not be built at RDB load (the data is kept, runs fail). Unset
    /// while a deferred build is pending (exec/deferred.rs).
    handle: Arc<Handle>,
    pub stats: Arc<Stats>,
    /// Recent run times, for running short requests inline (exec/inline.rs).
    pub history: RunHistory,
    /// The number of its device's queue, once looked up (`exec::model_queue`).
    pub queue_slot: std::sync::OnceLock<usize>,
}

impl Model {
    /// Builds the backend model (slow: call it off the main thread). Its stats are published by whoever
    /// puts it in the keyspace.
    pub fn build(key: &[u8], mut spec: ModelSpec) -> Result<Model> {
        let handle = load_handle(&spec)?;
        spec.inputs = handle.inputs().to_vec();
        spec.outputs = handle.outputs().to_vec();
        Ok(Model::with_handle(key, spec, Ok(handle)))
    }

    /// For RDB loads (and the AOF, a primary, RESTORE): a model whose backend cannot be built is still kept, so
    /// no data is lost. The names come from the backend where it reports them (RDB encodings 0 and 1 stored
    /// none), as in `build`. With DEFERRED_MODEL_BUILD, a model whose names are known is built on the builder
    /// thread instead, after this returns.
    pub fn restore(key: &[u8], mut spec: ModelSpec) -> Model {
        let named = !spec.inputs.is_empty() && !spec.outputs.is_empty();
        if CONFIG.read().deferred_model_build && (named || spec.backend == BackendKind::Tf) {
            let model = Model::new(key, spec, Arc::new(Handle::new()));
            let handle = model.handle.clone();
            let spec = model.spec.clone();
            crate::exec::deferred::submit(key, spec.blob.clone(), handle, move || load_handle(&spec));
            return model;
        }
        let handle = load_handle(&spec);
        if let (Ok(h), false) = (&handle, spec.backend == BackendKind::Tf) {
            spec.inputs = h.inputs().to_vec();
            spec.outputs = h.outputs().to_vec();
        }
        Model::with_handle(key, spec, handle)
    }

    /// A model around an already loaded handle (tests use their own `LoadedModel`).
    pub fn with_handle(key: &[u8], spec: ModelSpec, handle: Result<Box<dyn LoadedModel>>) -> Model {
        Model::new(key, spec, Arc::new(Handle::from(handle)))
    }

    fn new(key: &[u8], spec: ModelSpec, handle: Arc<Handle>) -> Model {
        let stats = Arc::new(Stats::new(key, EntryKind::Model, spec.backend.name(), &spec.device.name, &spec.tag));
        Model { spec, handle, stats, history: RunHistory::default(), queue_slot: std::sync::OnceLock::new() }
    }

    /// The numbers of inputs and outputs requests are checked against. A model kept without names whose backend
    /// never loaded it (an AOF's AI.MODELSTORE of a model refused now) has none: `ANY_COUNT`, and its runs
    /// reply why it cannot run.
    pub fn io_counts(&self) -> (usize, usize) {
        if !matches!(self.handle.get(), Some(Ok(_))) && self.spec.inputs.is_empty() && self.spec.outputs.is_empty() {
            (ANY_COUNT, ANY_COUNT)
        } else {
            (self.spec.inputs.len(), self.spec.outputs.len())
        }
    }

    /// The backend's model, waiting for a deferred build to finish: never on the main thread (see `built`).
    pub fn loaded(&self) -> Result<&dyn LoadedModel> {
        self.handle.wait().as_deref().map_err(Clone::clone)
    }

    /// The backend's model if it is built, without waiting (None while a deferred build is pending).
    pub fn built(&self) -> Option<Result<&dyn LoadedModel>> {
        self.handle.get().map(|h| h.as_deref().map_err(Clone::clone))
    }

    pub fn mem_usage(&self) -> usize {
        std::mem::size_of::<Model>() + self.spec.blob.len() + self.spec.tag.len()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        stats::unregister(&self.stats);
    }
}

fn load_handle(spec: &ModelSpec) -> Result<Box<dyn LoadedModel>> {
    let opts = LoadOptions::from_config(spec.device.clone(), spec.inputs.clone(), spec.outputs.clone());
    if crate::isolation::enabled() {
        crate::isolation::load_model(spec.backend, spec.blob.clone(), &opts)
    } else {
        backends::load_model(spec.backend, spec.blob.clone(), &opts)
    }
}
