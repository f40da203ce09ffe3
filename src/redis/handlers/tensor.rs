//! AI.TENSORSET / AI.TENSORGET.

use std::sync::Arc;

use super::Cmd;
use crate::commands::tensor::{
    check_tensorget_arity, parse_tensorget_format, parse_tensorset, tensor_reply, zero_filled_bytes,
};
use crate::error::{Error, Result};
use crate::redis::keyspace::Key;
use crate::redis::strings::AdoptedString;
use crate::redis::types::TENSOR_TYPE;
use crate::reply::Reply;

pub fn tensorset(c: &Cmd) -> Result<()> {
    let key = Key::open(c.ctx, c.raw[1], true);
    key.check_type(&TENSOR_TYPE)?;
    crate::redis::memory::check_room(c.ctx, zero_filled_bytes(&c.args[2..]).unwrap_or(0))?;
    // A big BLOB is kept as Redis received it rather than copied (like SET keeps its value).
    let tensor = parse_tensorset(&c.args, &|i| AdoptedString::adopt(c.raw[i]))?;
    key.set(&TENSOR_TYPE, Arc::new(tensor))?;
    c.replicate_verbatim();
    c.reply(&Reply::OK);
    Ok(())
}

pub fn tensorget(c: &Cmd) -> Result<()> {
    check_tensorget_arity(&c.args)?;
    let key = Key::open(c.ctx, c.raw[1], false);
    let tensor = key.get(&TENSOR_TYPE)?.ok_or(Error::TensorKeyEmpty)?;
    let format = parse_tensorget_format(&c.args[2..])?;
    c.reply(&tensor_reply(tensor, format));
    Ok(())
}
