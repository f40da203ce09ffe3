//! Writing computed tensors to the keyspace at reply time, and replicating them as AI.TENSORSET … BLOB
//! (replicas and the AOF get the data, never a re-run of the model).

use std::sync::Arc;

use redis_module::raw;

use crate::commands::tensor::tensorset_words;
use crate::error::{Error, Result};
use crate::redis::keyspace::Key;
use crate::redis::strings::OwnedStrings;
use crate::redis::types::{tensor_free, TENSOR_TYPE};
use crate::tensor::Tensor;

/// Stores every `(key, tensor)`; checks all key types first so that a WRONGTYPE writes nothing.
pub fn write_outputs(ctx: *mut raw::RedisModuleCtx, outputs: &[(&[u8], Arc<Tensor>)]) -> Result<()> {
    if let [(key, t)] = outputs {
        // One key (the usual case): opened once, its type checked before anything is written.
        let k = Key::open_name(ctx, key, true);
        k.check_type(&TENSOR_TYPE)?;
        k.store(&TENSOR_TYPE, t.clone(), tensor_free)?;
        replicate_tensorset(ctx, key, t);
        return Ok(());
    }
    // Several: one open key at a time (an output name may repeat, and two open handles of one key would not
    // see each other's writes).
    for (key, _) in outputs {
        Key::open_name(ctx, key, false).check_type(&TENSOR_TYPE)?;
    }
    for (key, t) in outputs {
        Key::open_name(ctx, key, true).store(&TENSOR_TYPE, t.clone(), tensor_free)?;
        replicate_tensorset(ctx, key, t);
    }
    Ok(())
}

fn replicate_tensorset(ctx: *mut raw::RedisModuleCtx, key: &[u8], t: &Tensor) {
    crate::redis::emit::replicate(ctx, c"AI.TENSORSET", key, &tensorset_words(t), Some(t.data()));
}

/// Replicates a command as the client sent it, from a completion (where the client's argv is gone).
pub fn replicate_argv(ctx: *mut raw::RedisModuleCtx, argv: &mut OwnedStrings) -> Result<()> {
    let (name, rest) = argv.0.split_first_mut().ok_or_else(|| Error::Generic("empty command".into()))?;
    let mut len = 0usize;
    let p = raw::string_ptr_len(*name, &mut len);
    // SAFETY: `p` points to `len` bytes of a string we retain.
    let cmd = std::ffi::CString::new(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
        .map_err(|_| Error::Generic("bad command name".into()))?;
    // SAFETY: ctx is the main-thread reply context; format "v" takes a vector and its length.
    unsafe {
        api!(RedisModule_Replicate)(ctx, cmd.as_ptr(), c"v".as_ptr(), rest.as_mut_ptr(), rest.len());
    }
    Ok(())
}
