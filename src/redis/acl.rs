//! The caller's ACL: who sent a command, and whether that user may run a command or read a key. Script
//! callbacks (`redis.execute`, `redisAI.model_execute`) run on a thread-safe context, which Redis treats as
//! the superuser; every callback is checked here against the user of the client that sent the AI command.
//! `RedisModule_ACLCheckCommandPermissions` (Redis 7.0+, Valkey) checks the command, its subcommand and every
//! key with its key-spec read/write flags against all of the user's selectors, as Redis does for a client.

use std::sync::Arc;

use redis_module::raw;

use super::strings::OwnedStrings;
use crate::redis::ctx::Ctx;

/// The ACL user name of the client running the current command (main thread).
pub fn current_user(ctx: Ctx<'_>) -> Option<Arc<[u8]>> {
    // SAFETY: Init fills the API table once, before any command runs; it never changes afterwards.
    let get = api_opt!(RedisModule_GetCurrentUserName)?;
    // SAFETY: ctx is the live context of the running command; the returned string is ours to free.
    unsafe {
        let s = get(ctx.as_ptr());
        if s.is_null() {
            return None;
        }
        let mut len = 0usize;
        let p = raw::string_ptr_len(s, &mut len);
        let name: Arc<[u8]> = std::slice::from_raw_parts(p as *const u8, len).into();
        api!(RedisModule_FreeString)(std::ptr::null_mut(), s);
        Some(name)
    }
}

/// A user looked up by name, released on drop.
struct User(*mut raw::RedisModuleUser);

impl User {
    /// Must be called with Redis's global lock held (the user table is the main thread's).
    fn lookup(name: &[u8]) -> Result<User, String> {
        // SAFETY: Init fills the API table once, before any command runs; it never changes afterwards.
        let (Some(get), Some(_)) =
            (api_opt!(RedisModule_GetModuleUserFromUserName), api_opt!(RedisModule_FreeModuleUser))
        else {
            return Err("NOPERM this server cannot check ACL permissions for module callbacks".into());
        };
        let s = OwnedStrings::new(&[name]);
        // SAFETY: s.0[0] is a live string; a non-null user is released in Drop.
        let u = unsafe { get(s.0[0]) };
        if u.is_null() {
            return Err(format!("NOPERM User {} does not exist anymore", String::from_utf8_lossy(name)));
        }
        Ok(User(u))
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // SAFETY: see `current_user` for the table; self.0 came from GetModuleUserFromUserName, freed once.
        if let Some(free) = api_opt!(RedisModule_FreeModuleUser) {
            // SAFETY: as above.
            unsafe { free(self.0) };
        }
    }
}

/// The refusal of a callback made for an unknown user (a run whose caller was not looked up).
pub fn no_user() -> String {
    "NOPERM no ACL user is known for this call".into()
}

/// May `user` run `argv` (command name first)? Redis's own NOPERM text when not. Global lock held.
pub fn check_command(user: Option<&[u8]>, argv: &OwnedStrings) -> Result<(), String> {
    let user = User::lookup(user.ok_or_else(no_user)?)?;
    // SAFETY: Init fills the API table once, before any command runs; it never changes afterwards.
    let Some(check) = api_opt!(RedisModule_ACLCheckCommandPermissions) else {
        return Err("NOPERM this server cannot check ACL permissions for module callbacks".into());
    };
    let mut args = argv.0.clone();
    // SAFETY: the user is live; args are live strings, argc matches. The function only reads them.
    let ok = unsafe { check(user.0, args.as_mut_ptr(), args.len() as i32) } == raw::REDISMODULE_OK as i32;
    if ok {
        return Ok(());
    }
    if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        // An unknown command is no permission matter: RedisModule_Call reports it, in RedisAI's words.
        return Ok(());
    }
    Err("NOPERM this user has no permissions to run this command or to access one of its keys".into())
}

/// May `user` read `key` (`redisAI.model_execute` reads a model)? Global lock held.
pub fn check_read_key(user: Option<&[u8]>, key: &[u8]) -> Result<(), String> {
    let user = User::lookup(user.ok_or_else(no_user)?)?;
    // SAFETY: Init fills the API table once, before any command runs; it never changes afterwards.
    let Some(check) = api_opt!(RedisModule_ACLCheckKeyPermissions) else {
        return Err("NOPERM this server cannot check ACL permissions for module callbacks".into());
    };
    let k = OwnedStrings::new(&[key]);
    // SAFETY: the user and the key string are live for the call, which only reads them.
    let ok = unsafe { check(user.0, k.0[0], raw::REDISMODULE_CMD_KEY_ACCESS as i32) } == raw::REDISMODULE_OK as i32;
    if ok {
        Ok(())
    } else {
        Err("NOPERM No permissions to access a key".into())
    }
}
