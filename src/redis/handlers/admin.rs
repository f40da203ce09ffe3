//! AI.INFO, AI.CONFIG and AI._MODELSCAN.

use super::Cmd;
use crate::backends;
use crate::commands::config::{info_reply, parse_config, parse_info, ConfigCmd, InfoCmd};
use crate::commands::is_keyword;
use crate::config::CONFIG;
use crate::error::{Error, Result};
use crate::redis::log_warning;
use crate::reply::Reply;
use crate::stats::{self, EntryKind};

pub fn info(c: &Cmd) -> Result<()> {
    let s = stats::lookup(c.args[1]).ok_or(Error::NoRunInfo)?;
    match parse_info(c.args.get(2).copied()) {
        InfoCmd::ResetStat => {
            s.reset();
            c.reply(&Reply::OK);
        }
        what => c.reply(&info_reply(&s, what == InfoCmd::Detail)),
    }
    Ok(())
}

pub fn config(c: &Cmd) -> Result<()> {
    if !crate::redis::module::ADMIN_BY_CATEGORY.load(std::sync::atomic::Ordering::Relaxed) {
        // Redis 7.0 cannot put a module command in @admin: allow AI.CONFIG to those who may CONFIG SET.
        let user = crate::redis::acl::current_user(c.ctx);
        let argv = crate::redis::strings::OwnedStrings::new(&["CONFIG", "SET", "dir", "."]);
        crate::redis::acl::check_command(user.as_deref(), &argv).map_err(|_| {
            let name = String::from_utf8_lossy(user.as_deref().unwrap_or_default()).into_owned();
            Error::Permission {
                text: format!("NOPERM User {name} has no permissions to run the 'ai.config' command"),
                prefixed: false,
            }
        })?;
    }
    let parsed = parse_config(&c.args)?;
    if matches!(parsed, ConfigCmd::LoadBackend(..) | ConfigCmd::BackendsPath(_))
        && !CONFIG.read().runtime_backend_loading
    {
        return Err(Error::Unavailable(
            "AI.CONFIG LOADBACKEND and BACKENDSPATH are disabled (load-time option RUNTIME_BACKEND_LOADING no)".into(),
        ));
    }
    match parsed {
        ConfigCmd::LoadBackend(b, path) if crate::isolation::enabled() => {
            crate::isolation::load_backend_library(b, &path)?
        }
        ConfigCmd::LoadBackend(b, path) => backends::load_backend_library(b, &path)?,
        ConfigCmd::BackendsPath(p) => CONFIG.write().backends_path = Some(p),
        ConfigCmd::ModelChunkSize(n) => CONFIG.write().model_chunk_size = n,
        ConfigCmd::InlineThreshold(us) => CONFIG.write().inline_threshold_us = us,
        ConfigCmd::Get(what) => {
            let cfg = CONFIG.read().clone();
            let r = if is_keyword(&what, "BACKENDSPATH") {
                Reply::Bulk(cfg.backends_path.unwrap_or_default().into_bytes().into())
            } else if is_keyword(&what, "MODEL_CHUNK_SIZE") {
                Reply::Int(cfg.model_chunk_size as i64)
            } else if is_keyword(&what, "INLINE_THRESHOLD") {
                Reply::Int(cfg.inline_threshold_us as i64)
            } else {
                Reply::Null
            };
            c.reply(&r);
            return Ok(());
        }
    }
    c.reply(&Reply::OK);
    Ok(())
}

pub fn modelscan(c: &Cmd) -> Result<()> {
    scan(c, EntryKind::Model, "AI._MODELSCAN")
}

pub fn scriptscan(c: &Cmd) -> Result<()> {
    scan(c, EntryKind::Script, "AI._SCRIPTSCAN")
}

fn scan(c: &Cmd, kind: EntryKind, name: &'static str) -> Result<()> {
    log_warning(&format!("{name} is experimental and might be removed in future versions"));
    let items = stats::scan(kind)
        .into_iter()
        .map(|(k, t)| Reply::Array(vec![Reply::Bulk(k.into()), Reply::Bulk(t.into())]))
        .collect();
    c.reply(&Reply::Array(items));
    Ok(())
}
