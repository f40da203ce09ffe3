//! The `AI__MODEL` data type: RDB in RedisAI's chunked layout, AOF rewrite as AI.MODELSTORE, MEMORY USAGE.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use redis_module::raw;

use super::io::Io;
use super::log_warning;
use super::module_type::ModuleType;
use super::types::{guard, type_methods};
use crate::config::CONFIG;
use crate::model::{BackendKind, Model};
use crate::rdb::{load_model, save_model, ENCVER};
use crate::stats;

pub static MODEL_TYPE: ModuleType<Model> = ModuleType::new(
    "AI__MODEL",
    ENCVER,
    type_methods(
        Some(model_rdb_load),
        Some(model_rdb_save),
        Some(model_aof_rewrite),
        Some(model_mem_usage),
        Some(model_free),
        None,
    ),
);

/// SAFETY: every value of this type was made by `ModuleType::into_value` (`Key::set`, RDB load).
unsafe fn model_ref<'a>(value: *const c_void) -> &'a Model {
    // SAFETY: see above; Redis keeps the value alive during the callback.
    unsafe { ModuleType::<Model>::value(value) }
}

pub(super) fn key_name(rdb: *mut raw::RedisModuleIO) -> Vec<u8> {
    // SAFETY: rdb is the live IO of the load callback; the key name (if any) lives as long as it.
    unsafe {
        let k = api_opt!(RedisModule_GetKeyNameFromIO).map_or(std::ptr::null(), |f| f(rdb));
        if k.is_null() {
            return Vec::new();
        }
        let mut len = 0usize;
        let p = raw::string_ptr_len(k, &mut len);
        std::slice::from_raw_parts(p as *const u8, len).to_vec()
    }
}

extern "C" fn model_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("AI__MODEL rdb_load", std::ptr::null_mut(), || match load_model(&mut Io(rdb), encver) {
        Ok(spec) => {
            let key = key_name(rdb);
            let model = Model::restore(&key, spec);
            if let Some(Err(e)) = model.built() {
                log_warning(&format!(
                    "redisai: model '{}' was loaded with its data but cannot run: {e}",
                    String::from_utf8_lossy(&key)
                ));
            }
            stats::publish(&model.stats);
            if let Err(e) = crate::exec::queues().get(&model.spec.device.queue_key()) {
                log_warning(&format!("redisai: cannot start the queue of device {}: {e}", model.spec.device.name));
            }
            ModuleType::into_value(Arc::new(model))
        }
        Err(e) => {
            log_warning(&format!("redisai: cannot load model: {e}"));
            std::ptr::null_mut()
        }
    })
}

extern "C" fn model_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let chunk = CONFIG.read().model_chunk_size;
    // SAFETY: see `model_ref`.
    guard("AI__MODEL rdb_save", (), || save_model(&unsafe { model_ref(value) }.spec, chunk, &mut Io(rdb)))
}

/// `AI.MODELSTORE <key> <backend> <device> TAG .. BATCHSIZE .. MINBATCHSIZE .. MINBATCHTIMEOUT ..
/// [INPUTS n .. OUTPUTS n .. (TF)] BLOB <chunk>...`
fn modelstore_words(m: &Model, chunk: usize) -> Vec<Vec<u8>> {
    let s = &m.spec;
    let mut w: Vec<Vec<u8>> =
        vec![s.backend.name().into(), s.device.name.clone().into(), b"TAG".to_vec(), s.tag.clone()];
    for (k, v) in
        [("BATCHSIZE", s.batch.size), ("MINBATCHSIZE", s.batch.min_size), ("MINBATCHTIMEOUT", s.batch.min_timeout_ms)]
    {
        w.push(k.into());
        w.push(v.to_string().into());
    }
    if s.backend == BackendKind::Tf {
        for (k, names) in [("INPUTS", &s.inputs), ("OUTPUTS", &s.outputs)] {
            w.push(k.into());
            w.push(names.len().to_string().into());
            w.extend(names.iter().map(|n| n.clone().into_bytes()));
        }
    }
    w.push(b"BLOB".to_vec());
    w.extend(s.blob.chunks(chunk.max(1)).map(<[u8]>::to_vec));
    if s.blob.is_empty() {
        w.push(Vec::new());
    }
    w
}

extern "C" fn model_aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    let chunk = CONFIG.read().model_chunk_size;
    guard("AI__MODEL aof_rewrite", (), || {
        // SAFETY: see `model_ref`.
        let words = modelstore_words(unsafe { model_ref(value) }, chunk);
        super::emit::aof(aof, c"AI.MODELSTORE", key, &words, None);
    })
}

extern "C" fn model_mem_usage(value: *const c_void) -> usize {
    // SAFETY: see `model_ref`.
    guard("AI__MODEL mem_usage", 0, || unsafe { model_ref(value) }.mem_usage())
}

extern "C" fn model_free(value: *mut c_void) {
    // SAFETY: see `model_ref`; Redis frees each value once. Runs still holding the model keep it alive.
    guard("AI__MODEL free", (), || {
        // SAFETY: as above: the value Redis stored, given back once.
        let value = unsafe { ModuleType::<Model>::take_value(value) };
        // AI.INFO forgets the key now, even if a finishing run still holds the model for a moment.
        stats::unregister(&value.stats);
        if value.mem_usage() >= crate::exec::lazy_free::THRESHOLD {
            crate::exec::lazy_free::drop_later(value);
        }
    })
}
