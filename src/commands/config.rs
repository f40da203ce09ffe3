//! AI.CONFIG and AI.INFO (docs/commands.md) arguments and replies.

use super::is_keyword;
use crate::error::{Error, Result};
use crate::model::BackendKind;
use crate::reply::Reply;
use crate::stats::{EntryKind, Stats};
use crate::tensor::parse_i64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigCmd {
    LoadBackend(BackendKind, String),
    BackendsPath(String),
    ModelChunkSize(usize),
    InlineThreshold(u64),
    Get(Vec<u8>),
}

fn err(msg: &str) -> Error {
    Error::parse(msg)
}

pub fn parse_config(argv: &[&[u8]]) -> Result<ConfigCmd> {
    let arity = Error::WrongArity("AI.CONFIG");
    let sub = argv.get(1).ok_or(arity.clone())?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if is_keyword(sub, "LOADBACKEND") {
        if argv.len() < 4 {
            return Err(arity);
        }
        Ok(ConfigCmd::LoadBackend(BackendKind::parse(argv[2])?, text(argv[3])))
    } else if is_keyword(sub, "BACKENDSPATH") {
        let p = argv.get(2).ok_or_else(|| err("BACKENDSPATH: missing path argument"))?;
        Ok(ConfigCmd::BackendsPath(text(p)))
    } else if is_keyword(sub, "MODEL_CHUNK_SIZE") {
        let v = argv.get(2).ok_or_else(|| err("MODEL_CHUNK_SIZE: missing chunk size"))?;
        let n = parse_i64(v).filter(|&n| n > 0).ok_or_else(|| err("MODEL_CHUNK_SIZE: invalid chunk size"))?;
        Ok(ConfigCmd::ModelChunkSize(n as usize))
    } else if is_keyword(sub, "INLINE_THRESHOLD") {
        let v = argv.get(2).ok_or_else(|| err("INLINE_THRESHOLD: missing value"))?;
        let us = crate::config::inline_threshold(v).ok_or_else(|| err("INLINE_THRESHOLD: invalid value"))?;
        Ok(ConfigCmd::InlineThreshold(us))
    } else if is_keyword(sub, "GET") {
        Ok(ConfigCmd::Get(argv.get(2).ok_or(arity)?.to_vec()))
    } else {
        Err(err("unsupported subcommand"))
    }
}

/// What `AI.INFO <key> [arg]` asks for. RedisAI ignored a third argument other than RESETSTAT (the info is
/// returned), so `DETAIL` is free for our figures and every other word keeps RedisAI's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoCmd {
    /// RedisAI's 18 elements, exactly.
    Info,
    /// RedisAI's 18 elements, then ours (stats::detail_fields).
    Detail,
    ResetStat,
}

pub fn parse_info(third: Option<&[u8]>) -> InfoCmd {
    match third {
        Some(a) if is_keyword(a, "RESETSTAT") => InfoCmd::ResetStat,
        Some(a) if is_keyword(a, "DETAIL") => InfoCmd::Detail,
        _ => InfoCmd::Info,
    }
}

/// The AI.INFO reply: RedisAI's 18 elements, then, with `detail`, our fields (stats::detail_fields).
pub fn info_reply(s: &Stats, detail: bool) -> Reply<'static> {
    use std::sync::atomic::Ordering::Relaxed;
    let samples = match s.kind {
        EntryKind::Model => s.samples.load(Relaxed),
        EntryKind::Script => -1,
    };
    let bulk = |b: &[u8]| Reply::Bulk(b.to_vec().into());
    let mut fields = vec![
        Reply::str("key"),
        bulk(&s.key),
        Reply::str("type"),
        Reply::str(if s.kind == EntryKind::Model { "MODEL" } else { "SCRIPT" }),
        Reply::str("backend"),
        Reply::str(s.backend),
        Reply::str("device"),
        bulk(s.device.as_bytes()),
        Reply::str("tag"),
        bulk(&s.tag),
        Reply::str("duration"),
        Reply::Int(s.duration_us.load(Relaxed)),
        Reply::str("samples"),
        Reply::Int(samples),
        Reply::str("calls"),
        Reply::Int(s.calls.load(Relaxed)),
        Reply::str("errors"),
        Reply::Int(s.errors.load(Relaxed)),
    ];
    if !detail {
        return Reply::Array(fields);
    }
    // Ours, after RedisAI's, only when asked for: clients compare the plain reply as a whole (docs/commands.md).
    for (name, value) in crate::stats::detail_fields(&s.detail, crate::histogram::window_now()) {
        fields.push(Reply::str(name));
        fields.push(Reply::Int(value as i64));
    }
    Reply::Array(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::commands::words;

    #[test]
    fn config_subcommands() {
        let e = |s: &str| parse_config(&words(s)).unwrap_err().reply_text();
        assert_eq!(e("AI.CONFIG"), "ERR wrong number of arguments for 'AI.CONFIG' command");
        assert_eq!(e("AI.CONFIG LOADBACKEND ONNX"), "ERR wrong number of arguments for 'AI.CONFIG' command");
        assert_eq!(e("AI.CONFIG LOADBACKEND XX p"), "ERR unsupported backend");
        assert_eq!(e("AI.CONFIG BACKENDSPATH"), "ERR BACKENDSPATH: missing path argument");
        assert_eq!(e("AI.CONFIG MODEL_CHUNK_SIZE"), "ERR MODEL_CHUNK_SIZE: missing chunk size");
        assert_eq!(e("AI.CONFIG MODEL_CHUNK_SIZE -1"), "ERR MODEL_CHUNK_SIZE: invalid chunk size");
        assert_eq!(e("AI.CONFIG GET"), "ERR wrong number of arguments for 'AI.CONFIG' command");
        assert_eq!(e("AI.CONFIG FOO"), "ERR unsupported subcommand");
        assert_eq!(parse_config(&words("AI.CONFIG model_chunk_size 10")), Ok(ConfigCmd::ModelChunkSize(10)));
    }

    #[test]
    fn info_third_argument() {
        assert_eq!(parse_info(None), InfoCmd::Info);
        assert_eq!(parse_info(Some(b"resetstat")), InfoCmd::ResetStat);
        assert_eq!(parse_info(Some(b"Detail")), InfoCmd::Detail);
        assert_eq!(parse_info(Some(b"whatever")), InfoCmd::Info, "RedisAI ignores any other word");
    }

    #[test]
    fn info_reply_is_redisai_s_unless_detail_is_asked_for() {
        let s = Stats::new(b"k", EntryKind::Script, "TORCH", "CPU", b"t");
        let Reply::Array(plain) = info_reply(&s, false) else { panic!("not an array") };
        assert_eq!(plain.len(), 18);
        assert_eq!(plain[12], Reply::str("samples"));
        assert_eq!(plain[13], Reply::Int(-1));
        let Reply::Array(detail) = info_reply(&s, true) else { panic!("not an array") };
        assert_eq!(detail.len(), 18 + 2 * crate::stats::detail_fields(&s.detail, 0).len());
        assert_eq!(detail[..18], plain[..]);
    }
}
