//! Commands written to the AOF (on rewrite) and to replicas: the one place for Redis's variadic calls.
//! A command is `<name> <key> <words>... [<blob>]`; the blob, when there is one, is passed as a buffer so that a
//! big tensor is not copied into a Redis string first.

use std::ffi::{c_char, CStr};

use redis_module::raw;

use super::strings::OwnedStrings;

/// Appends `<name> <key> <words>... [<blob>]` to the AOF being rewritten.
pub fn aof<T: AsRef<[u8]>>(
    io: *mut raw::RedisModuleIO,
    name: &CStr,
    key: *mut raw::RedisModuleString,
    words: &[T],
    blob: Option<&[u8]>,
) {
    let mut words = OwnedStrings::new(words);
    // SAFETY: Init filled the API table once, before any callback ran; it never changes afterwards.
    let emit = api!(RedisModule_EmitAOF);
    // SAFETY: io and key are the live arguments of an aof_rewrite callback; each format matches the arguments
    // that follow it ("s": a string, "v": a vector and its length, "b": a buffer and its length); EmitAOF copies
    // them before `words` is freed.
    unsafe {
        match blob {
            Some(b) => emit(
                io,
                name.as_ptr(),
                c"svb".as_ptr(),
                key,
                words.0.as_mut_ptr(),
                words.0.len(),
                b.as_ptr() as *const c_char,
                b.len(),
            ),
            None => emit(io, name.as_ptr(), c"sv".as_ptr(), key, words.0.as_mut_ptr(), words.0.len()),
        }
    }
}

/// Replicates `<name> <key> <words>... [<blob>]` (main thread, or a reply callback). Redis takes its own
/// reference to each word.
pub fn replicate(
    ctx: *mut raw::RedisModuleCtx,
    name: &CStr,
    key: &[u8],
    words: &mut [*mut raw::RedisModuleString],
    blob: Option<&[u8]>,
) {
    // SAFETY: as in `aof`.
    let replicate = api!(RedisModule_Replicate);
    let key_ptr = key.as_ptr() as *const c_char;
    // SAFETY: ctx is the live context of the command or reply callback; each format matches the arguments that
    // follow it, and the words are live strings.
    unsafe {
        match blob {
            Some(b) => replicate(
                ctx,
                name.as_ptr(),
                c"bvb".as_ptr(),
                key_ptr,
                key.len(),
                words.as_mut_ptr(),
                words.len(),
                b.as_ptr() as *const c_char,
                b.len(),
            ),
            None => replicate(ctx, name.as_ptr(), c"bv".as_ptr(), key_ptr, key.len(), words.as_mut_ptr(), words.len()),
        };
    }
}
