//! What TorchScript scripts call back into: `redis.execute` (a Redis command under the global lock,
//! replicated) and `redisAI.model_execute` (a stored model, run on the calling worker).

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::raw;

use super::acl;
use super::gil::Gil;
use super::keyspace::Key;
use super::model_type::MODEL_TYPE;
use super::strings::OwnedStrings;
use crate::backends::torch_abi::HostApi;
use crate::caller::{current_caller, Caller};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::redis::ctx::Ctx;
use crate::tensor::Tensor;

/// The backend's callbacks in this process.
pub struct RedisHost;

impl crate::backends::torch_host::Host for RedisHost {
    fn execute(words: &[&[u8]]) -> Vec<u8> {
        execute(words)
    }
    fn model_execute(key: &[u8], inputs: Vec<Tensor>, noutputs: usize) -> Result<Vec<Tensor>> {
        model_execute_tensors(key, inputs, noutputs)
    }
}

pub fn host_api() -> HostApi {
    crate::backends::torch_host::host_api::<RedisHost>()
}

/// Runs `f` with a context holding Redis's global lock, on the caller's database. The guard releases the lock
/// also when `f` panics; a thread that already holds it (none should: callbacks run on workers) is refused
/// rather than left waiting for itself.
fn locked<R>(caller: &Caller, f: impl FnOnce(Ctx<'_>) -> Result<R>) -> Result<R> {
    // No user, no callback: refused before taking the lock, whose holder may be waiting for this very run (a
    // module that runs a script through the low-level API and waits on Redis's main thread).
    if caller.user.is_none() {
        return Err(Error::Permission { text: acl::no_user(), prefixed: false });
    }
    let gil = Gil::lock().map_err(|_| Error::Internal("the Redis lock is already held by this thread".into()))?;
    // SAFETY: the context is locked by `gil` for the call.
    unsafe { api!(RedisModule_SelectDb)(gil.ctx().as_ptr(), caller.db) };
    f(gil.ctx())
}

/// How deeply nested a reply handed to a script may be (Redis's own commands nest a few levels; the backend's
/// parser bounds its own recursion too).
const MAX_REPLY_DEPTH: usize = 32;

/// A call reply as RESP2 (what the backend parses into TorchScript values); a reply nested deeper than
/// `MAX_REPLY_DEPTH` becomes an error there.
fn encode(r: *mut raw::RedisModuleCallReply, out: &mut Vec<u8>, depth: usize) {
    // The reply's bytes, borrowed (a GET of a large value is copied once, into `out`, under the lock).
    let text = || -> &[u8] {
        let mut len = 0usize;
        let p = raw::call_reply_string_ptr(r, &mut len);
        if p.is_null() {
            &[]
        } else {
            // SAFETY: the reply owns `len` bytes at `p` while it lives, which is past this call.
            unsafe { std::slice::from_raw_parts(p as *const u8, len) }
        }
    };
    match raw::call_reply_type(r) {
        raw::ReplyType::String | raw::ReplyType::VerbatimString | raw::ReplyType::BigNumber => {
            let body = text();
            out.extend_from_slice(format!("${}\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
            out.extend_from_slice(b"\r\n");
        }
        raw::ReplyType::Error => {
            out.push(b'-');
            out.extend(text().iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
            out.extend_from_slice(b"\r\n");
        }
        raw::ReplyType::Integer | raw::ReplyType::Bool => {
            out.extend_from_slice(format!(":{}\r\n", raw::call_reply_integer(r)).as_bytes());
        }
        raw::ReplyType::Array | raw::ReplyType::Set | raw::ReplyType::Map if depth >= MAX_REPLY_DEPTH => {
            out.extend_from_slice(b"-ERR the reply is nested too deeply for a script\r\n");
        }
        raw::ReplyType::Array | raw::ReplyType::Set | raw::ReplyType::Map => {
            let n = raw::call_reply_length(r);
            out.extend_from_slice(format!("*{n}\r\n").as_bytes());
            for i in 0..n {
                encode(raw::call_reply_array_element(r, i), out, depth + 1);
            }
        }
        _ => out.extend_from_slice(b"$-1\r\n"),
    }
}

/// `redis.execute(words...)` for the current caller: Redis's reply as RESP2, or an error reply.
pub fn execute(words: &[&[u8]]) -> Vec<u8> {
    catch_unwind(AssertUnwindSafe(|| {
        let Some(Ok(name)) = words.first().map(|c| CString::new(*c)) else {
            return b"-ERR bad command name\r\n".to_vec();
        };
        let caller = current_caller();
        locked(&caller, |ctx| {
            // The command name first: the ACL check looks the command (and subcommand) up from argv. Made and
            // freed under the lock: a command may keep a reference to an argument (SET stores its value).
            let argv = OwnedStrings::new(words);
            let mut out = Vec::new();
            let checked = acl::check_command(caller.user.as_deref(), &argv)
                .and_then(|()| allowed_in_scripts(ctx, words).map_err(str::to_string));
            if let Err(e) = checked {
                out.extend_from_slice(format!("-{e}\r\n").as_bytes());
                return Ok(out);
            }
            // "!" replicates the command, as RedisAI's redis.execute did; "M" refuses deny-oom commands past
            // maxmemory; "W" refuses writes from a read-only command; "v" takes the argument vector. (Not "S",
            // script mode: Valkey 9.1 crashes refusing a command with it; `allowed_in_scripts` does it.)
            let flags = if caller.read_only { c"!vMW" } else { c"!vM" };
            // SAFETY: ctx is locked; argv (after the command name) are live strings; the reply is freed here.
            unsafe {
                let r = api!(RedisModule_Call)(
                    ctx.as_ptr(),
                    name.as_ptr(),
                    flags.as_ptr(),
                    argv.0[1..].as_ptr(),
                    argv.0.len() - 1,
                );
                if r.is_null() {
                    out.extend_from_slice(format!("-{}\r\n", call_error()).as_bytes());
                } else {
                    encode(r, &mut out, 0);
                    raw::free_call_reply(r);
                }
            }
            Ok(out)
        })
        .unwrap_or_else(|e| format!("-{}\r\n", e.reply_text()).into_bytes())
    }))
    .unwrap_or_else(|_| b"-ERR internal error in redis.execute\r\n".to_vec())
}

/// Whether a command may run from a script, as Redis decides for Lua: not if it (or its subcommand) is flagged
/// `noscript` (EVAL, MULTI, SUBSCRIBE, ...: EVAL would run Lua as the superuser), nor this module's own
/// commands (they block their client, which a callback's context cannot). Looked up with COMMAND INFO under
/// the global lock, and remembered per existing command (so the memory is bounded by Redis's command table).
fn allowed_in_scripts(ctx: Ctx<'_>, words: &[&[u8]]) -> std::result::Result<(), &'static str> {
    const REFUSED: &str = "ERR This Redis command is not allowed from script";
    let name = words[0].to_ascii_lowercase();
    if name.starts_with(b"ai.") {
        return Err(REFUSED);
    }
    let Some(container) = command_flags(ctx, &name) else { return Ok(()) };
    if container.noscript {
        return Err(REFUSED);
    }
    if let (true, Some(sub)) = (container.has_subcommands, words.get(1)) {
        let full = [&name[..], b"|", &sub.to_ascii_lowercase()[..]].concat();
        if command_flags(ctx, &full).is_some_and(|f| f.noscript) {
            return Err(REFUSED);
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct CommandFlags {
    noscript: bool,
    has_subcommands: bool,
}

/// COMMAND INFO `name` (cached), or `None` for a name Redis does not know (RedisModule_Call reports those).
fn command_flags(ctx: Ctx<'_>, name: &[u8]) -> Option<CommandFlags> {
    type Cache = parking_lot::Mutex<std::collections::HashMap<Vec<u8>, CommandFlags>>;
    static CACHE: std::sync::LazyLock<Cache> = std::sync::LazyLock::new(Default::default);
    if let Some(f) = CACHE.lock().get(name) {
        return Some(*f);
    }
    let arg = OwnedStrings::new(&[b"INFO".as_slice(), name]);
    // SAFETY: ctx is locked by the caller; the strings live across the call; the reply is freed here. The reply
    // is [[name, arity, [flags...], first, last, step, categories, tips, key specs, [subcommands...]]].
    let flags = unsafe {
        let r = api!(RedisModule_Call)(ctx.as_ptr(), c"COMMAND".as_ptr(), c"v".as_ptr(), arg.0.as_ptr(), arg.0.len());
        if r.is_null() {
            return None;
        }
        let info = raw::call_reply_array_element(r, 0);
        let found = !info.is_null() && raw::call_reply_type(info) == raw::ReplyType::Array;
        let array = |i| {
            let e = if found { raw::call_reply_array_element(info, i) } else { std::ptr::null_mut() };
            (!e.is_null() && raw::call_reply_type(e) == raw::ReplyType::Array).then_some(e)
        };
        let noscript = array(2).is_some_and(|list| {
            (0..raw::call_reply_length(list)).any(|i| {
                let mut len = 0usize;
                let p = raw::call_reply_string_ptr(raw::call_reply_array_element(list, i), &mut len);
                !p.is_null() && std::slice::from_raw_parts(p as *const u8, len) == b"noscript"
            })
        });
        let has_subcommands = array(9).is_some_and(|subs| raw::call_reply_length(subs) > 0);
        raw::free_call_reply(r);
        found.then_some(CommandFlags { noscript, has_subcommands })
    }?;
    CACHE.lock().insert(name.to_vec(), flags);
    Some(flags)
}

/// Why `RedisModule_Call` returned no reply (Redis reports it through errno). Where RedisAI could get there (an
/// unknown command, a wrong number of arguments, a cluster that cannot take the command) its text is
/// `strerror(errno)` ("Redis command returned an error: Invalid argument"), kept for clients that match it;
/// where only this module's flags lead (`M`: over maxmemory, `W`: a write from a read-only run) Redis's own words.
fn call_error() -> String {
    let errno = std::io::Error::last_os_error().raw_os_error();
    match errno {
        Some(libc::ENOSPC) => "OOM command not allowed when used memory > 'maxmemory'.".into(),
        Some(libc::EROFS) => "ERR Write commands are not allowed from read-only scripts.".into(),
        Some(code) => strerror(code),
        None => "Unknown error".into(),
    }
}

/// The C library's text for `code`, as `strerror` gives it (without Rust's " (os error N)").
fn strerror(code: i32) -> String {
    let text = std::io::Error::from_raw_os_error(code).to_string();
    match text.rsplit_once(" (os error ") {
        Some((head, _)) => head.to_string(),
        None => text,
    }
}

/// `redisAI.model_execute(key, tensors, noutputs)` for the current caller.
pub fn model_execute_tensors(key: &[u8], tensors: Vec<Tensor>, noutputs: usize) -> Result<Vec<Tensor>> {
    let caller = current_caller();
    let model: Arc<Model> = locked(&caller, |ctx| {
        acl::check_read_key(caller.user.as_deref(), key).map_err(|text| Error::Permission { text, prefixed: true })?;
        let k = Key::open_name(ctx, key, false);
        k.get_arc(&MODEL_TYPE)?.ok_or(Error::ModelKeyEmpty)
    })?;
    let inputs: Vec<Arc<Tensor>> = tensors.into_iter().map(Arc::new).collect();
    let outs = crate::exec::op::run_nested(&model, &inputs, noutputs, &caller)?;
    Ok(outs.into_iter().map(|t| Arc::try_unwrap(t).unwrap_or_else(|t| (*t).clone())).collect())
}
