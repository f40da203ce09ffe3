//! Command handlers: argv -> pure parser -> keyspace -> reply. Each runs behind `run_command`, which
//! turns an `Err` into an error reply and a panic into an error reply plus a log line.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use super::reply::{error, send};
use crate::error::{Error, Result};
use crate::reply::Reply;

mod admin;
mod dag;
mod model;
mod persist;
mod script;
mod shared;
mod tensor;

/// One invocation of a command: the context, the raw argv (for opening keys) and argv as bytes.
pub struct Cmd<'a> {
    pub ctx: Ctx<'a>,
    pub raw: &'a [*mut raw::RedisModuleString],
    pub args: smallvec::SmallVec<[&'a [u8]; 24]>,
}

impl Cmd<'_> {
    fn reply(&self, r: &Reply) {
        send(self.ctx, r)
    }
    fn replicate_verbatim(&self) {
        raw::replicate_verbatim(self.ctx.as_ptr());
    }
    /// Opens a key named by one of this command's arguments (a slice of `args`) through its argv string, so
    /// that no string is made for it; any other name through a new string.
    fn open_key(&self, name: &[u8], write: bool) -> crate::redis::keyspace::Key<'_> {
        use crate::redis::keyspace::Key;
        let argv = self.args.iter().zip(self.raw).find(|(a, _)| std::ptr::eq(**a, name)).map(|(_, r)| *r);
        match argv {
            Some(r) => Key::open(self.ctx, r, write),
            None => Key::open_name(self.ctx, name, write),
        }
    }
    /// The client's selected database.
    fn db(&self) -> i32 {
        // SAFETY: ctx is the live context of this command (main thread).
        unsafe { api!(RedisModule_GetSelectedDb)(self.ctx.as_ptr()) }
    }
}

use crate::commands::{KeyAccess, KeyPositions};

/// The key-spec flags Redis checks ACL selectors and cluster routing against.
fn key_flags(access: KeyAccess) -> c_int {
    let f = match access {
        KeyAccess::Read => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        KeyAccess::Write => raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
        KeyAccess::ReadWrite => {
            raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE
        }
        KeyAccess::Delete => raw::REDISMODULE_CMD_KEY_RM | raw::REDISMODULE_CMD_KEY_DELETE,
        KeyAccess::Route => raw::REDISMODULE_CMD_KEY_RO,
    };
    f as c_int
}

/// The body shared by every registered command.
///
/// # Safety
/// `ctx` is the live context of the command being called, on the main thread, and `argv` holds `argc` strings
/// that live as long as the call.
pub unsafe fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: fn(&Cmd) -> Result<()>,
    keys: Option<KeyPositions>,
    arity: Arity,
) -> c_int {
    // SAFETY: the caller's contract: a live command context on the main thread, valid for this call.
    let ctx = unsafe { Ctx::from_raw(ctx) };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let raw_args: &[*mut raw::RedisModuleString] = if argv.is_null() || argc <= 0 {
            &[]
        } else {
            // SAFETY: Redis passes `argc` valid argument strings that live until the command returns.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        let args = raw_args
            .iter()
            .map(|&s| {
                let mut len = 0usize;
                let p = raw::string_ptr_len(s, &mut len);
                // SAFETY: StringPtrLen returns a pointer to `len` bytes owned by the argv string, which
                // outlives this command invocation.
                unsafe { std::slice::from_raw_parts(p as *const u8, len) }
            })
            .collect();
        let cmd = Cmd { ctx, raw: raw_args, args };
        if let Some(keys) = keys {
            // SAFETY: ctx is the live context of this call.
            if unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx.as_ptr()) } != 0 {
                // A position past argv would make the server read past it (Valkey crashed on `AI.SCRIPTEXECUTE`
                // alone): the position functions must not return one, and this filter makes sure.
                for (pos, access) in keys(&cmd.args).into_iter().filter(|&(p, _)| p < cmd.args.len()) {
                    // SAFETY: as above; pos is within argv. Every command is registered with getkeys-api, so
                    // these flags (not a legacy full-access key spec) are what ACL selectors are checked against.
                    unsafe { api!(RedisModule_KeyAtPosWithFlags)(ctx.as_ptr(), pos as c_int, key_flags(access)) };
                }
                return;
            }
        }
        let n = cmd.args.len();
        let result = if n < arity.min || n > arity.max { Err(Error::WrongArity(arity.name)) } else { handler(&cmd) };
        if let Err(e) = result {
            error(ctx, &e.reply_text());
        }
    }));
    if outcome.is_err() {
        super::log_warning("redisai: a command handler panicked; the client got an error reply");
        error(ctx, "ERR internal error in redisai (see the server log)");
    }
    raw::REDISMODULE_OK as c_int
}

/// One registered command: what `RedisModule_OnLoad` passes to `RedisModule_CreateCommand`.
pub struct Command {
    pub name: &'static str,
    pub entry: extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int,
    pub flags: &'static str,
    /// First, last and step of the legacy key range (Redis also asks `getkeys-api` commands for their keys).
    pub keys: (c_int, c_int, c_int),
}

/// How many arguments (the command name included) a command takes, and the name its arity error gives.
/// Checked before the handler runs; commands whose arity depends on their words (subcommands, sections)
/// leave the rest to their parser.
#[derive(Clone, Copy)]
pub struct Arity {
    pub min: usize,
    pub max: usize,
    pub name: &'static str,
}

const fn at_least(min: usize, name: &'static str) -> Arity {
    Arity { min, max: usize::MAX, name }
}
const fn between(min: usize, max: usize, name: &'static str) -> Arity {
    Arity { min, max, name }
}
const ANY: Arity = at_least(0, "");

/// The command table, the one place a command is declared: its name, handler, flags, legacy key range and the
/// function giving its keys with their read/write flags. Every command with keys declares `getkeys-api`: its key
/// function (not a legacy full-access key spec) is what ACL selectors (`%R~in:*`, `%W~out:*`) are checked
/// against. AI.CONFIG is `admin` (see `module::admin_categories`): it loads shared libraries.
macro_rules! commands {
    ($($name:literal => $entry:ident, $handler:path, $flags:literal, $range:expr, $arity:expr
       $(, keys $keys:path)?;)*) => {
        $(
            extern "C" fn $entry(
                ctx: *mut raw::RedisModuleCtx,
                argv: *mut *mut raw::RedisModuleString,
                argc: c_int,
            ) -> c_int {
                #[allow(unused_mut, unused_assignments)]
                let mut keys: Option<KeyPositions> = None;
                $(keys = Some($keys);)?
                // SAFETY: Redis calls a command's function with its live context and `argc` arguments at `argv`.
                unsafe { run_command(ctx, argv, argc, $handler, keys, $arity) }
            }
        )*
        pub const COMMANDS: &[Command] = &[$(Command { name: $name, entry: $entry, flags: $flags, keys: $range }),*];
    };
}

use crate::commands::dag::dag_key_positions;
use crate::commands::model::{modelexecute_key_positions, modelrun_key_positions};
use crate::commands::script::{scriptexecute_key_positions, scriptrun_key_positions};
use crate::commands::{first_key_delete, first_key_read, first_key_write};
use crate::redis::ctx::Ctx;

commands! {
    "ai.tensorset" => ai_tensorset, tensor::tensorset, "write deny-oom getkeys-api", (1, 1, 1), at_least(4, "AI.TENSORSET"), keys first_key_write;
    "ai.tensorget" => ai_tensorget, tensor::tensorget, "readonly getkeys-api", (1, 1, 1), ANY, keys first_key_read;
    "ai.modelstore" => ai_modelstore, model::modelstore, "write deny-oom getkeys-api", (1, 1, 1), ANY, keys first_key_write;
    "ai.modelset" => ai_modelset, model::modelset, "write deny-oom getkeys-api", (1, 1, 1), ANY, keys first_key_write;
    "ai.modelget" => ai_modelget, model::modelget, "readonly getkeys-api", (1, 1, 1), between(2, 4, "AI.MODELGET"), keys first_key_read;
    "ai.modeldel" => ai_modeldel, model::modeldel, "write getkeys-api", (1, 1, 1), between(2, 2, "AI.MODELDEL"), keys first_key_delete;
    "ai.modelexecute" => ai_modelexecute, model::modelexecute, "write deny-oom getkeys-api", (4, 4, 1), at_least(8, "AI.MODELEXECUTE"),
        keys modelexecute_key_positions;
    "ai.modelrun" => ai_modelrun, model::modelrun, "write deny-oom getkeys-api", (3, 3, 1), at_least(6, "AI.MODELRUN"), keys modelrun_key_positions;
    "ai._modelscan" => ai_modelscan, admin::modelscan, "readonly", (0, 0, 0), between(1, 1, "AI._MODELSCAN");
    "ai.scriptstore" => ai_scriptstore, script::scriptstore, "write deny-oom getkeys-api", (1, 1, 1), ANY,
        keys first_key_write;
    "ai.scriptset" => ai_scriptset, script::scriptset, "write deny-oom getkeys-api", (1, 1, 1), ANY, keys first_key_write;
    "ai.scriptget" => ai_scriptget, script::scriptget, "readonly getkeys-api", (1, 1, 1), between(2, 4, "AI.SCRIPTGET"), keys first_key_read;
    "ai.scriptdel" => ai_scriptdel, script::scriptdel, "write getkeys-api", (1, 1, 1), between(2, 2, "AI.SCRIPTDEL"), keys first_key_delete;
    "ai.scriptexecute" => ai_scriptexecute, script::scriptexecute, "write deny-oom getkeys-api", (5, 5, 1), at_least(3, "AI.SCRIPTEXECUTE"),
        keys scriptexecute_key_positions;
    "ai.scriptrun" => ai_scriptrun, script::scriptrun, "write deny-oom getkeys-api", (4, 4, 1), at_least(3, "AI.SCRIPTRUN"),
        keys scriptrun_key_positions;
    "ai._scriptscan" => ai_scriptscan, admin::scriptscan, "readonly", (0, 0, 0), between(1, 1, "AI._SCRIPTSCAN");
    "ai.info" => ai_info, admin::info, "readonly getkeys-api", (1, 1, 1), between(2, 3, "AI.INFO"), keys first_key_read;
    "ai.config" => ai_config, admin::config, "admin", (0, 0, 0), ANY;
    "ai.dagexecute" => ai_dagexecute, dag::dagexecute, "write deny-oom getkeys-api", (3, 3, 1), ANY, keys dag_key_positions;
    "ai.dagexecute_ro" => ai_dagexecute_ro, dag::dagexecute_ro, "readonly getkeys-api", (3, 3, 1), ANY,
        keys dag_key_positions;
    "ai.dagrun" => ai_dagrun, dag::dagrun, "write deny-oom getkeys-api", (3, 3, 1), ANY, keys dag_key_positions;
    "ai.dagrun_ro" => ai_dagrun_ro, dag::dagrun_ro, "readonly getkeys-api", (3, 3, 1), ANY, keys dag_key_positions;
}
