//! The `AI_SCRIPT` data type: RDB in RedisAI's layout, AOF rewrite, MEMORY USAGE.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use redis_module::raw;

use super::io::Io;
use super::log_warning;
use super::model_type::key_name;
use super::module_type::ModuleType;
use super::types::{guard, type_methods};
use crate::rdb::{load_script, save_script, ENCVER};
use crate::script::Script;
use crate::stats;

pub static SCRIPT_TYPE: ModuleType<Script> = ModuleType::new(
    "AI_SCRIPT",
    ENCVER,
    type_methods(
        Some(script_rdb_load),
        Some(script_rdb_save),
        Some(script_aof_rewrite),
        Some(script_mem_usage),
        Some(script_free),
        None,
    ),
);

/// SAFETY: every value of this type was made by `ModuleType::into_value` (`Key::set`, RDB load).
unsafe fn script_ref<'a>(value: *const c_void) -> &'a Script {
    // SAFETY: see above; Redis keeps the value alive during the callback.
    unsafe { ModuleType::<Script>::value(value) }
}

extern "C" fn script_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("AI_SCRIPT rdb_load", std::ptr::null_mut(), || match load_script(&mut Io(rdb), encver) {
        Ok(spec) => {
            let key = key_name(rdb);
            let script = Script::restore(&key, spec);
            if let Err(e) = &script.handle {
                log_warning(&format!(
                    "redisai: script '{}' was loaded but cannot run until it compiles: {e}",
                    String::from_utf8_lossy(&key)
                ));
            }
            stats::publish(&script.stats);
            ModuleType::into_value(Arc::new(script))
        }
        Err(e) => {
            log_warning(&format!("redisai: cannot load script: {e}"));
            std::ptr::null_mut()
        }
    })
}

extern "C" fn script_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: see `script_ref`.
    guard("AI_SCRIPT rdb_save", (), || save_script(&unsafe { script_ref(value) }.spec, &mut Io(rdb)))
}

/// `AI.SCRIPTSTORE <key> <device> TAG <tag> ENTRY_POINTS <n> <fn>... SOURCE <src>`, or for scripts stored
/// with the deprecated AI.SCRIPTSET (no entry points) `AI.SCRIPTSET <key> <device> TAG <tag> SOURCE <src>`:
/// RedisAI wrote SCRIPTSTORE without ENTRY_POINTS for those, which cannot be replayed.
extern "C" fn script_aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    guard("AI_SCRIPT aof_rewrite", (), || {
        // SAFETY: see `script_ref`.
        let s = &unsafe { script_ref(value) }.spec;
        let mut w: Vec<Vec<u8>> = vec![s.device_name.clone().into(), b"TAG".to_vec(), s.tag.clone()];
        let cmd = if s.entry_points.is_empty() {
            c"AI.SCRIPTSET"
        } else {
            w.push(b"ENTRY_POINTS".to_vec());
            w.push(s.entry_points.len().to_string().into());
            w.extend(s.entry_points.iter().map(|e| e.clone().into_bytes()));
            c"AI.SCRIPTSTORE"
        };
        w.push(b"SOURCE".to_vec());
        w.push(s.source.clone().into_bytes());
        super::emit::aof(aof, cmd, key, &w, None);
    })
}

extern "C" fn script_mem_usage(value: *const c_void) -> usize {
    // SAFETY: see `script_ref`.
    guard("AI_SCRIPT mem_usage", 0, || unsafe { script_ref(value) }.mem_usage())
}

extern "C" fn script_free(value: *mut c_void) {
    // SAFETY: see `script_ref`; Redis frees each value once. Runs still holding the script keep it alive.
    guard("AI_SCRIPT free", (), || {
        // SAFETY: as above: the value Redis stored, given back once.
        let value = unsafe { ModuleType::<Script>::take_value(value) };
        // AI.INFO forgets the key now, even if a finishing run still holds the script for a moment.
        stats::unregister(&value.stats);
    })
}
