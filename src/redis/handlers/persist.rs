//! Writing computed tensors to the keyspace at reply time, and replicating them as AI.TENSORSET … BLOB
//! (replicas and the AOF get the data, never a re-run of the model).

use std::sync::Arc;

use redis_module::raw;

use crate::error::{Error, Result};
use crate::redis::ctx::Ctx;
use crate::redis::keyspace::Key;
use crate::redis::strings::OwnedStrings;
use crate::redis::types::{tensor_free, TENSOR_TYPE};
use crate::tensor::Tensor;

/// Stores every `(key, tensor)`; checks all key types first so that a WRONGTYPE writes nothing.
pub fn write_outputs(ctx: Ctx<'_>, outputs: &[(&[u8], Arc<Tensor>)]) -> Result<()> {
    if let [(key, t)] = outputs {
        // One key (the usual case): opened once, its type checked before anything is written.
        return store_and_replicate(ctx, key, t, true);
    }
    // Several: one open key at a time (an output name may repeat, and two open handles of one key would not
    // see each other's writes).
    for (key, _) in outputs {
        Key::open_name(ctx, key, false).check_type(&TENSOR_TYPE)?;
    }
    for (key, t) in outputs {
        store_and_replicate(ctx, key, t, false)?;
    }
    Ok(())
}

/// Stores `t` under `key` (its type checked first when `check`) and replicates it; one Redis string of the
/// name serves both (the replication takes a reference to it rather than a copy).
fn store_and_replicate(ctx: Ctx<'_>, key: &[u8], t: &Arc<Tensor>, check: bool) -> Result<()> {
    let name = OwnedStrings::new(&[key]);
    let k = Key::open(ctx, name.0[0], true);
    if check {
        k.check_type(&TENSOR_TYPE)?;
    }
    k.store(&TENSOR_TYPE, t.clone(), tensor_free)?;
    replicate_tensorset(ctx, name.0[0], t);
    Ok(())
}

/// Dimensions below this have their replication word cached (`shared_word`).
const CACHED_DIMS: i64 = 1024;

/// Words of replicated AI.TENSORSETs as Redis strings made once and shared by every replication: Redis only
/// takes and drops references to them, where making and freeing them for each computed tensor cost about
/// 0.1 µs of main thread. Indexed by `DataType::ALL` position, then BLOB, then dimension. They live as long as
/// the process; held in a static, so a leak checker sees them as reachable.
static WORDS: parking_lot::Mutex<Vec<SharedString>> = parking_lot::const_mutex(Vec::new());

struct SharedString(*mut raw::RedisModuleString);

// SAFETY: the strings are made and handed to Redis only by replication, which runs on the main thread; the
// mutex is what lets a static hold them.
unsafe impl Send for SharedString {}

fn shared_word(
    words: &mut Vec<SharedString>,
    index: usize,
    word: impl FnOnce() -> crate::commands::tensor::Word,
) -> *mut raw::RedisModuleString {
    if words.len() <= index {
        words.resize_with(index + 1, || SharedString(std::ptr::null_mut()));
    }
    if words[index].0.is_null() {
        let mut made = OwnedStrings::new(&[word()]);
        words[index] = SharedString(made.0.pop().unwrap_or(std::ptr::null_mut()));
    }
    words[index].0
}

/// `key`: the key's name as a Redis string (Redis takes a reference to it rather than a copy).
fn replicate_tensorset(ctx: Ctx<'_>, key: *mut raw::RedisModuleString, t: &Tensor) {
    use crate::commands::tensor::Word;
    use crate::tensor::DataType;
    let types = DataType::ALL.len();
    let type_index = DataType::ALL.iter().position(|&d| d == t.dtype()).unwrap_or(0);
    let mut uncached = OwnedStrings::new::<&[u8]>(&[]);
    let mut words: smallvec::SmallVec<[*mut raw::RedisModuleString; 8]> = smallvec::SmallVec::new();
    let mut cache = WORDS.lock();
    words.push(shared_word(&mut cache, type_index, || Word::from_slice(t.dtype().name().as_bytes())));
    for &d in t.shape() {
        let text = || {
            let mut w = Word::new();
            let _ = std::io::Write::write_fmt(&mut w, format_args!("{d}"));
            w
        };
        words.push(if (0..CACHED_DIMS).contains(&d) {
            shared_word(&mut cache, types + 1 + d as usize, text)
        } else {
            uncached.add(&text())
        });
    }
    words.push(shared_word(&mut cache, types, || Word::from_slice(b"BLOB")));
    drop(cache);
    crate::redis::emit::replicate(ctx.as_ptr(), c"AI.TENSORSET", key, &words, t.data());
}

/// Replicates a command as the client sent it, from a completion (where the client's argv is gone).
pub fn replicate_argv(ctx: Ctx<'_>, argv: &mut OwnedStrings) -> Result<()> {
    let (name, rest) = argv.0.split_first_mut().ok_or_else(|| Error::parse("empty command"))?;
    let mut len = 0usize;
    let p = raw::string_ptr_len(*name, &mut len);
    // SAFETY: `p` points to `len` bytes of a string we retain.
    let cmd = std::ffi::CString::new(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
        .map_err(|_| Error::parse("bad command name"))?;
    // SAFETY: ctx is the main-thread reply context; format "v" takes a vector and its length.
    unsafe {
        api!(RedisModule_Replicate)(ctx.as_ptr(), cmd.as_ptr(), c"v".as_ptr(), rest.as_mut_ptr(), rest.len());
    }
    Ok(())
}
