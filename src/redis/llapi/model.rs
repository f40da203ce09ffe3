//! Model functions. A `RAI_Model *` is the pointer of an `Arc<Model>`, as an AI__MODEL key stores it.

use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::sync::Arc;

use super::ctx::{self, OnFinishCtx, RunCtx};
use super::error::{self, RaiError};
use super::run::OnFinish;
use super::{borrow, cstr, ffi, free_handle, from_keyspace, hand_out, names, shallow_copy, share, ERR, OK};
use crate::backend_kind::BackendKind;
use crate::commands::dag_builder::CallOp;
use crate::device::Device;
use crate::error::Error;
use crate::model::{BatchOpts, Model, ModelSpec};
use crate::redis::model_type::MODEL_TYPE;

/// RedisAI's `RAI_ModelOpts`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModelOpts {
    batchsize: usize,
    minbatchsize: usize,
    minbatchtimeout: usize,
    /// Per-model thread counts in RedisAI; here the module's INTRA/INTER_OP_PARALLELISM apply to every model.
    backends_intra_op_parallelism: c_longlong,
    backends_inter_op_parallelism: c_longlong,
}

/// Builds a model as AI.MODELSTORE does (admission included), on the calling thread.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn create(
    backend: c_int,
    devicestr: *const c_char,
    tag: *const c_char,
    opts: ModelOpts,
    ninputs: usize,
    inputs: *const *const c_char,
    noutputs: usize,
    outputs: *const *const c_char,
    modeldef: *const c_char,
    modellen: usize,
    err: *mut RaiError,
) -> *mut Model {
    ffi("RedisAI_ModelCreate", std::ptr::null_mut(), || {
        let fail = |code, e: Error| {
            // SAFETY: NULL or the caller's live error.
            unsafe { error::set(err, code, &e) };
            std::ptr::null_mut()
        };
        let Some(backend) = u64::try_from(backend).ok().and_then(BackendKind::from_code) else {
            return fail(error::EUNSUPPORTEDBACKEND, Error::UnsupportedBackend);
        };
        // SAFETY: NUL-terminated strings, arrays of `n` of them and `modellen` bytes, lent for the call.
        let (device, tag, ins, outs, blob) = unsafe {
            (
                cstr(devicestr),
                cstr(tag),
                names(inputs, ninputs),
                names(outputs, noutputs),
                super::bytes(modeldef, modellen),
            )
        };
        let device = match device.ok_or(Error::InvalidDevice).and_then(Device::parse) {
            Ok(d) => d,
            Err(e) => return fail(error::EMODELCONFIGURE, e),
        };
        let (Some(inputs), Some(outputs), Some(blob)) = (ins, outs, blob) else {
            return fail(error::EMODELCREATE, Error::parse("invalid model definition arguments"));
        };
        let spec = ModelSpec {
            backend,
            device,
            tag: tag.unwrap_or_default().to_vec(),
            batch: BatchOpts {
                size: opts.batchsize as u64,
                min_size: opts.minbatchsize as u64,
                min_timeout_ms: opts.minbatchtimeout as u64,
            },
            inputs,
            outputs,
            blob: blob.to_vec().into(),
        };
        let model = Model::build(b"", spec).and_then(|m| crate::exec::model_queue(&m).map(drop).map(|()| m));
        match model {
            Ok(m) => hand_out(Arc::new(m)),
            Err(e @ Error::Unavailable(_)) => fail(error::EBACKENDNOTLOADED, e),
            Err(e) => fail(error::EMODELCREATE, e),
        }
    })
}

pub extern "C" fn free(model: *const Model, _err: *mut RaiError) {
    free_handle("RedisAI_ModelFree", model)
}

pub extern "C" fn get_shallow_copy(model: *const Model) -> *mut Model {
    shallow_copy("RedisAI_ModelGetShallowCopy", model)
}

pub extern "C" fn get_from_keyspace(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key: *mut redis_module::raw::RedisModuleString,
    model: *mut *mut Model,
    mode: c_int,
    err: *mut RaiError,
) -> c_int {
    // SAFETY: the caller's context and key name, and where to put the model, lent for the call.
    ffi("RedisAI_GetModelFromKeyspace", ERR, || unsafe {
        from_keyspace(ctx, key, model, mode, err, &MODEL_TYPE, Error::ModelKeyEmpty, error::EMODELRUN)
    })
}

pub extern "C" fn serialize(
    model: *const Model,
    buffer: *mut *mut c_char,
    len: *mut usize,
    err: *mut RaiError,
) -> c_int {
    ffi("RedisAI_ModelSerialize", ERR, || {
        // SAFETY: NULL or a live model handle.
        let Some(m) = (unsafe { borrow(model) }) else {
            // SAFETY: NULL or the caller's live error.
            unsafe { error::set(err, error::EMODELSERIALIZE, &Error::ModelKeyEmpty) };
            return ERR;
        };
        if buffer.is_null() || len.is_null() {
            return ERR;
        }
        let blob: &[u8] = &m.spec.blob;
        // SAFETY: Redis's allocator (the caller frees the buffer with RedisModule_Free); `blob.len()` bytes are
        // copied into the fresh buffer; the out-parameters are the caller's.
        unsafe {
            let buf = api!(RedisModule_Alloc)(blob.len().max(1)) as *mut u8;
            std::ptr::copy_nonoverlapping(blob.as_ptr(), buf, blob.len());
            *buffer = buf as *mut c_char;
            *len = blob.len();
        }
        OK
    })
}

pub extern "C" fn redis_type() -> *mut redis_module::raw::RedisModuleType {
    ffi("RedisAI_ModelRedisType", std::ptr::null_mut(), || *MODEL_TYPE.raw.raw_type.borrow())
}

pub extern "C" fn run_ctx_create(model: *const Model) -> *mut RunCtx {
    ffi("RedisAI_ModelRunCtxCreate", std::ptr::null_mut(), || {
        // SAFETY: NULL or a live model handle; the context keeps a reference of its own.
        unsafe { share(model) }.map_or(std::ptr::null_mut(), |m| Box::into_raw(Box::new(RunCtx::new(CallOp::model(m)))))
    })
}

/// The input's name is not used: inputs go in the order they are added, as in RedisAI.
pub extern "C" fn run_ctx_add_input(mctx: *mut RunCtx, _name: *const c_char, t: *const crate::tensor::Tensor) -> c_int {
    ctx::add_input("RedisAI_ModelRunCtxAddInput", mctx, t)
}

pub extern "C" fn run_ctx_add_output(mctx: *mut RunCtx, _name: *const c_char) -> c_int {
    ctx::add_output("RedisAI_ModelRunCtxAddOutput", mctx)
}

pub extern "C" fn run_ctx_num_outputs(mctx: *mut RunCtx) -> usize {
    ctx::num_outputs("RedisAI_ModelRunCtxNumOutputs", mctx)
}

pub extern "C" fn run_ctx_output_tensor(mctx: *mut RunCtx, index: usize) -> *mut crate::tensor::Tensor {
    ctx::output_tensor("RedisAI_ModelRunCtxOutputTensor", mctx, index)
}

pub extern "C" fn run_ctx_free(mctx: *mut RunCtx) {
    ctx::free("RedisAI_ModelRunCtxFree", mctx)
}

pub extern "C" fn run(mctxs: *const *mut RunCtx, n: c_longlong, err: *mut RaiError) -> c_int {
    ctx::run_sync("RedisAI_ModelRun", mctxs, n, err)
}

pub extern "C" fn run_async(mctx: *mut RunCtx, cb: OnFinish<OnFinishCtx>, data: *mut c_void) -> c_int {
    ctx::run_async("RedisAI_ModelRunAsync", mctx, cb, data)
}

pub extern "C" fn get_as_run_ctx(finished: *mut OnFinishCtx, err: *mut RaiError) -> *mut RunCtx {
    ctx::get_as("RedisAI_GetAsModelRunCtx", finished, true, err)
}
