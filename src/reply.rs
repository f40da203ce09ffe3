//! A reply as plain data, built by pure code and written to the client by `redis::reply`.

use std::borrow::Cow;

use crate::error::Error;

#[derive(Debug, Clone, PartialEq)]
pub enum Reply<'a> {
    Simple(&'static str),
    Int(i64),
    /// Sent with `RedisModule_ReplyWithDouble`: a bulk string in RESP2, formatted by Redis itself.
    Double(f64),
    Bulk(Cow<'a, [u8]>),
    Array(Vec<Reply<'a>>),
    Null,
    Error(Error),
}

impl<'a> Reply<'a> {
    pub const OK: Reply<'static> = Reply::Simple("OK");

    pub fn str(s: &'a str) -> Reply<'a> {
        Reply::Bulk(Cow::Borrowed(s.as_bytes()))
    }
    pub fn bytes(b: &'a [u8]) -> Reply<'a> {
        Reply::Bulk(Cow::Borrowed(b))
    }
}
