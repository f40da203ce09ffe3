//! Command handlers: argv -> pure parser -> keyspace -> reply. Each runs behind `run_command`, which
//! turns an `Err` into an error reply and a panic into an error reply plus a log line.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::raw;

use super::keyspace::Key;
use super::reply::{error, send};
use super::types::{TensorValue, TENSOR_TYPE};
use crate::commands::tensor::{check_tensorget_arity, parse_tensorget_format, parse_tensorset, tensor_reply};
use crate::error::{Error, Result};
use crate::reply::Reply;

/// One invocation of a command: the context, the raw argv (for opening keys) and argv as bytes.
pub struct Cmd<'a> {
    pub ctx: *mut raw::RedisModuleCtx,
    pub raw: &'a [*mut raw::RedisModuleString],
    pub args: Vec<&'a [u8]>,
}

impl Cmd<'_> {
    fn reply(&self, r: &Reply) {
        send(self.ctx, r)
    }
    fn replicate_verbatim(&self) {
        raw::replicate_verbatim(self.ctx);
    }
}

/// The body shared by every registered command.
pub fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: fn(&Cmd) -> Result<()>,
) -> c_int {
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
        if let Err(e) = handler(&cmd) {
            error(ctx, &e.reply_text());
        }
    }));
    if outcome.is_err() {
        super::log_warning("redisai: a command handler panicked; the client got an error reply");
        error(ctx, "ERR internal error in redisai (see the server log)");
    }
    raw::REDISMODULE_OK as c_int
}

/// Declares the `extern "C"` entry point Redis calls for a command.
macro_rules! entry_points {
    ($($name:ident => $handler:path),* $(,)?) => {$(
        pub extern "C" fn $name(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            run_command(ctx, argv, argc, $handler)
        }
    )*};
}

entry_points! {
    ai_tensorset => tensorset,
    ai_tensorget => tensorget,
}

fn tensorset(c: &Cmd) -> Result<()> {
    if c.args.len() < 4 {
        return Err(Error::WrongArity("AI.TENSORSET"));
    }
    let key = Key::open(c.ctx, c.raw[1], true);
    key.check_type(&TENSOR_TYPE)?;
    let tensor = parse_tensorset(&c.args)?;
    key.set::<TensorValue>(&TENSOR_TYPE, Arc::new(tensor))?;
    c.replicate_verbatim();
    c.reply(&Reply::OK);
    Ok(())
}

fn tensorget(c: &Cmd) -> Result<()> {
    check_tensorget_arity(&c.args)?;
    let key = Key::open(c.ctx, c.raw[1], false);
    let tensor = key.get::<TensorValue>(&TENSOR_TYPE)?.ok_or(Error::TensorKeyEmpty)?;
    let format = parse_tensorget_format(&c.args[2..])?;
    c.reply(&tensor_reply(tensor, format));
    Ok(())
}
