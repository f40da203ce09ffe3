//! Writes a pure [`Reply`] to the client.

use std::ffi::CString;
use std::os::raw::{c_char, c_long};

use redis_module::raw;

use crate::redis::ctx::Ctx;
use crate::reply::Reply;

pub fn send(ctx: Ctx<'_>, r: &Reply) {
    let doubles = if contains_double(r) { Doubles::of(ctx) } else { Doubles::Server };
    send_with(ctx, r, doubles);
}

/// Who writes a double reply: the server (`RedisModule_ReplyWithDouble`), or this module with `%.17g`'s text
/// (`reply::format_g17`), where that is exactly what the server would write: Redis before 7.2, RESP2.
#[derive(Clone, Copy)]
enum Doubles {
    Server,
    Printf,
}

impl Doubles {
    fn of(ctx: Ctx<'_>) -> Doubles {
        static PRINTF_SERVER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // SAFETY: GetServerVersion takes no argument and reads a constant.
        let printf = *PRINTF_SERVER.get_or_init(|| unsafe { api!(RedisModule_GetServerVersion)() } < 0x00_07_02_00);
        // SAFETY: ctx is the live context of the command or reply callback being answered.
        let resp3 =
            unsafe { api!(RedisModule_GetContextFlags)(ctx.as_ptr()) } as u32 & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0;
        if printf && !resp3 {
            Doubles::Printf
        } else {
            Doubles::Server
        }
    }
}

fn contains_double(r: &Reply) -> bool {
    match r {
        Reply::Double(_) => true,
        Reply::Array(items) => items.iter().any(contains_double),
        _ => false,
    }
}

fn send_with(ctx: Ctx<'_>, r: &Reply, doubles: Doubles) {
    match r {
        Reply::Simple(s) => {
            // NUL-terminated on the stack: "OK" is the most common reply of all.
            let mut buf = [0u8; 64];
            if s.len() < buf.len() && !s.contains('\0') {
                buf[..s.len()].copy_from_slice(s.as_bytes());
                raw::reply_with_simple_string(ctx.as_ptr(), buf.as_ptr().cast());
            } else {
                let s = CString::new(*s).unwrap_or_default();
                raw::reply_with_simple_string(ctx.as_ptr(), s.as_ptr());
            }
        }
        Reply::Int(i) => {
            raw::reply_with_long_long(ctx.as_ptr(), *i);
        }
        Reply::Double(d) => match doubles {
            Doubles::Printf if d.is_finite() => {
                let mut buf = [0u8; 32];
                let n = crate::reply::format_g17(*d, &mut buf);
                raw::reply_with_string_buffer(ctx.as_ptr(), buf.as_ptr().cast(), n);
            }
            _ => {
                raw::reply_with_double(ctx.as_ptr(), *d);
            }
        },
        Reply::Bulk(b) => {
            raw::reply_with_string_buffer(ctx.as_ptr(), b.as_ptr() as *const c_char, b.len());
        }
        Reply::Array(items) => {
            raw::reply_with_array(ctx.as_ptr(), items.len() as c_long);
            for item in items {
                send_with(ctx, item, doubles);
            }
        }
        Reply::Null => {
            raw::reply_with_null(ctx.as_ptr());
        }
        Reply::Error(e) => error(ctx, &e.reply_text()),
    }
}

/// An error reply on one line (RESP cannot carry newlines in errors; backends' messages may have them).
/// Sent with RedisModule_ReplyWithError itself: redis-module's wrapper cuts every character to one byte
/// (mangling non-ASCII text, and panicking on a character whose low byte is 0, such as U+0100).
pub fn error(ctx: Ctx<'_>, text: &str) {
    let one_line: String = text.chars().map(|c| if c == '\r' || c == '\n' || c == '\0' { ' ' } else { c }).collect();
    let c = CString::new(one_line).unwrap_or_default();
    // SAFETY: ctx is the context of the command or reply callback being answered; `c` is NUL-terminated
    // and outlives the call (Redis copies it).
    unsafe {
        if let Some(reply) = api_opt!(RedisModule_ReplyWithError) {
            reply(ctx.as_ptr(), c.as_ptr());
        }
    }
}
