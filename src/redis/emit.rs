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

/// Replicates `<name> <key> <words>... <blob>` (main thread, or a reply callback). Redis takes its own
/// reference to the key and to each word.
pub fn replicate(
    ctx: *mut raw::RedisModuleCtx,
    name: &CStr,
    key: *mut raw::RedisModuleString,
    words: &[*mut raw::RedisModuleString],
    blob: &[u8],
) {
    // SAFETY: as in `aof`.
    let replicate = api!(RedisModule_Replicate);
    let (b, n) = (blob.as_ptr() as *const c_char, blob.len());
    // Up to eight words are passed one by one ("s" each): Redis sizes its argument array from the format, and
    // a vector ("v") makes it grow the array once more, an allocation per replicated tensor.
    let mut format = [0u8; 12];
    let fixed = words.len() <= 8;
    if fixed {
        format[..words.len() + 1].fill(b's');
        format[words.len() + 1] = b'b';
    }
    let w = |i: usize| words.get(i).copied().unwrap_or(std::ptr::null_mut());
    let f = format.as_ptr() as *const c_char;
    // SAFETY: ctx is the live context of the command or reply callback; each format matches the arguments that
    // follow it ("s": a string, "v": a vector and its length, "b": a buffer and its length: the fixed formats
    // name exactly `words.len()` words, so the null padding of `w` is never read), and the key and the words
    // are live strings.
    unsafe {
        match words.len() {
            _ if !fixed => replicate(ctx, name.as_ptr(), c"svb".as_ptr(), key, words.as_ptr(), words.len(), b, n),
            0 => replicate(ctx, name.as_ptr(), f, key, b, n),
            1 => replicate(ctx, name.as_ptr(), f, key, w(0), b, n),
            2 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), b, n),
            3 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), b, n),
            4 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), w(3), b, n),
            5 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), w(3), w(4), b, n),
            6 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), w(3), w(4), w(5), b, n),
            7 => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), w(3), w(4), w(5), w(6), b, n),
            _ => replicate(ctx, name.as_ptr(), f, key, w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7), b, n),
        };
    }
}
