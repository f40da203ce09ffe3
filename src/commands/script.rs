//! AI.SCRIPTSTORE / SCRIPTSET / SCRIPTGET / SCRIPTEXECUTE / SCRIPTRUN arguments (docs/commands.md, AI.SCRIPTSTORE … AI.SCRIPTRUN).

use std::time::Duration;

use super::{is_keyword, optional_tag, KeyAccess};
use crate::error::{Error, Result};
use crate::reply::Reply;
use crate::script::{CallStyle, ScriptSpec};
use crate::tensor::parse_i64;

fn err(msg: &str) -> Error {
    Error::parse(msg)
}

fn utf8(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| err("script source and names must be valid UTF-8"))
}

/// `AI.SCRIPTSTORE <key> <device> [TAG <tag>] ENTRY_POINTS <n> <fn>... SOURCE <src>`.
pub fn parse_scriptstore(argv: &[&[u8]]) -> Result<ScriptSpec> {
    if argv.len() < 8 {
        // RedisAI answers with RedisModule_WrongArity: Redis 7 names the registered (lower-case) command.
        return Err(Error::WrongArity("ai.scriptstore"));
    }
    let device_name = String::from_utf8_lossy(argv[2]).into_owned();
    let mut pos = 3;
    let tag = optional_tag(argv, &mut pos, "Insufficient arguments, missing script SOURCE")?;
    let missing_entries = || err("Insufficient arguments, missing script entry points");
    if !argv.get(pos).is_some_and(|a| is_keyword(a, "ENTRY_POINTS")) {
        return Err(missing_entries());
    }
    let n = argv
        .get(pos + 1)
        .and_then(|a| parse_i64(a))
        .filter(|&n| n > 0)
        .ok_or_else(|| err("Non numeric entry points number provided to AI.SCRIPTSTORE command"))? as usize;
    let names = argv.get(pos + 2..pos + 2 + n).ok_or_else(missing_entries)?;
    if names.iter().any(|a| is_keyword(a, "SOURCE")) {
        return Err(missing_entries());
    }
    let entry_points = names.iter().map(|a| utf8(a)).collect::<Result<Vec<_>>>()?;
    pos += 2 + n;
    let missing_source = || err("Insufficient arguments, missing script SOURCE");
    if !argv.get(pos).is_some_and(|a| is_keyword(a, "SOURCE")) {
        return Err(missing_source());
    }
    let source = utf8(argv.get(pos + 1).ok_or_else(missing_source)?)?;
    Ok(ScriptSpec { device_name, tag, source, entry_points })
}

/// Deprecated `AI.SCRIPTSET <key> <device> [TAG <tag>] SOURCE <src>`.
pub fn parse_scriptset(argv: &[&[u8]]) -> Result<ScriptSpec> {
    if argv.len() != 5 && argv.len() != 7 {
        return Err(Error::WrongArity("AI.SCRIPTSET"));
    }
    let device_name = String::from_utf8_lossy(argv[2]).into_owned();
    let mut pos = 3;
    let tag = optional_tag(argv, &mut pos, "Insufficient arguments, missing script SOURCE")?;
    if !argv.get(pos).is_some_and(|a| is_keyword(a, "SOURCE")) || pos + 1 >= argv.len() {
        return Err(err("Insufficient arguments, missing script SOURCE"));
    }
    Ok(ScriptSpec { device_name, tag, source: utf8(argv[pos + 1])?, entry_points: Vec::new() })
}

/// The reply of AI.SCRIPTGET for `words` (META and/or SOURCE; none means both).
pub fn scriptget_reply<'a>(s: &'a ScriptSpec, words: &[&[u8]]) -> Reply<'a> {
    let meta = words.iter().any(|w| is_keyword(w, "META"));
    let source = words.iter().any(|w| is_keyword(w, "SOURCE"));
    let (meta, source) = if !meta && !source { (true, true) } else { (meta, source) };
    if !meta {
        return Reply::str(&s.source);
    }
    let mut out = vec![
        Reply::str("device"),
        Reply::str(&s.device_name),
        Reply::str("tag"),
        Reply::bytes(&s.tag),
        Reply::str("Entry Points"),
        Reply::Array(s.entry_points.iter().map(|e| Reply::str(e)).collect()),
    ];
    if source {
        out.push(Reply::str("source"));
        out.push(Reply::str(&s.source));
    }
    Reply::Array(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall<'a> {
    pub function: &'a [u8],
    pub style: CallStyle,
    pub keys: Vec<&'a [u8]>,
    pub inputs: Vec<&'a [u8]>,
    pub args: Vec<&'a [u8]>,
    pub outputs: Vec<&'a [u8]>,
    pub timeout: Option<Duration>,
}

impl<'a> ScriptCall<'a> {
    /// What the engine's script op takes of the call.
    pub fn op_args(&self) -> crate::exec::dag::ScriptArgs<'_> {
        crate::exec::dag::ScriptArgs { function: self.function, style: self.style, keys: &self.keys, args: &self.args }
    }
}

/// `AI.SCRIPTEXECUTE <key> <fn> [KEYS n ..] [INPUTS n ..] [ARGS n ..] [OUTPUTS n ..] [TIMEOUT ms]`, after the
/// script was found. `in_dag` lifts the KEYS-or-INPUTS-first rule, as in RedisAI.
pub fn parse_scriptexecute<'a>(argv: &[&'a [u8]], in_dag: bool) -> Result<ScriptCall<'a>> {
    let mut call = ScriptCall {
        function: argv[2],
        style: CallStyle::EntryPoint,
        keys: vec![],
        inputs: vec![],
        args: vec![],
        outputs: vec![],
        timeout: None,
    };
    if !in_dag && !argv.get(3).is_some_and(|a| is_keyword(a, "KEYS") || is_keyword(a, "INPUTS")) {
        return Err(err("KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command"));
    }
    let mut seen = [false; 4];
    let mut pos = 3;
    while pos < argv.len() {
        let a = argv[pos];
        let scope = ["KEYS", "INPUTS", "ARGS", "OUTPUTS"].iter().position(|k| is_keyword(a, k));
        if let Some(i) = scope {
            let name = ["KEYS", "INPUTS", "ARGS", "OUTPUTS"][i];
            if seen[i] {
                return Err(err(&format!("Already Encountered {name} scope in AI.SCRIPTEXECUTE command")));
            }
            seen[i] = true;
            let items: Vec<&[u8]> = if i == 0 {
                // RedisAI needs the count and at least one more argument after KEYS.
                if pos + 2 >= argv.len() {
                    return Err(err("Missing arguments after KEYS keyword"));
                }
                let n = parse_i64(argv[pos + 1])
                    .filter(|&n| n > 0)
                    .ok_or_else(|| err("Invalid or negative value found in number of KEYS"))? as usize;
                argv.get(pos + 2..pos + 2 + n).ok_or_else(|| {
                    err("Number of pre declared KEYS to be used in the command does not match the number of given arguments")
                })?
            } else {
                let what = ["", "inputs", "args", "outputs"][i];
                let count_word = ["", "inputs", "keys", "outputs"][i];
                let c = argv.get(pos + 1).ok_or_else(|| err("Invalid arguments provided to AI.SCRIPTEXECUTE"))?;
                let n = parse_i64(c)
                    .filter(|&n| n >= 0)
                    .ok_or_else(|| err(&format!("Invalid argument for {count_word} count in AI.SCRIPTEXECUTE")))? as usize;
                argv.get(pos + 2..pos + 2 + n).ok_or_else(|| {
                    err(&format!("number of {what} to AI.SCRIPTEXECUTE command does not match the number of given arguments"))
                })?
            }
            .to_vec();
            pos += 2 + items.len();
            match i {
                0 => call.keys = items,
                1 => call.inputs = items,
                2 => call.args = items,
                _ => call.outputs = items,
            }
        } else if is_keyword(a, "TIMEOUT") {
            let v = argv.get(pos + 1).ok_or_else(|| err("No value provided for TIMEOUT in AI.SCRIPTEXECUTE"))?;
            call.timeout = Some(
                parse_i64(v)
                    .filter(|&t| t > 0)
                    .map(|t| Duration::from_millis(t as u64))
                    .ok_or_else(|| err("Invalid value for TIMEOUT"))?,
            );
            if pos + 2 < argv.len() {
                return Err(err("Encountered problem parsing AI.SCRIPTEXECUTE"));
            }
            break;
        } else {
            return Err(err(&format!(
                "Invalid AI.SCRIPTEXECUTE command. Unexpected argument: {}",
                String::from_utf8_lossy(a)
            )));
        }
    }
    Ok(call)
}

/// Deprecated `AI.SCRIPTRUN <key> <fn> [TIMEOUT t] INPUTS <in>... [$ <in>...] OUTPUTS <out>...`.
pub fn parse_scriptrun<'a>(argv: &[&'a [u8]]) -> Result<ScriptCall<'a>> {
    let mut call = ScriptCall {
        function: argv[2],
        style: CallStyle::Positional { list_from: None },
        keys: vec![],
        inputs: vec![],
        args: vec![],
        outputs: vec![],
        timeout: None,
    };
    #[derive(PartialEq)]
    enum Section {
        None,
        Inputs,
        Outputs,
    }
    let mut section = Section::None;
    let (mut seen_inputs, mut seen_outputs) = (false, false);
    let mut list_from = None;
    let mut pos = 3;
    while pos < argv.len() {
        let a = argv[pos];
        if is_keyword(a, "TIMEOUT") {
            if call.timeout.is_some() {
                return Err(err("Already encountered an TIMEOUT section in SCRIPTRUN"));
            }
            call.timeout = Some(super::model::parse_timeout(argv.get(pos + 1))?);
            pos += 2;
            section = Section::None;
            continue;
        } else if is_keyword(a, "INPUTS") {
            if seen_inputs {
                return Err(err("Already encountered an INPUTS section in SCRIPTRUN"));
            }
            seen_inputs = true;
            section = Section::Inputs;
        } else if is_keyword(a, "OUTPUTS") {
            if seen_outputs {
                return Err(err("Already encountered an OUTPUTS keyword in SCRIPTRUN"));
            }
            seen_outputs = true;
            section = Section::Outputs;
        } else if a == b"$" {
            if section != Section::Inputs {
                return Err(err("Encountered a variable size list of tensors outside of input section"));
            }
            if list_from.is_some() {
                return Err(err("Already encountered a variable size list of tensors"));
            }
            list_from = Some(call.inputs.len());
        } else {
            match section {
                Section::Inputs => call.inputs.push(a),
                Section::Outputs => call.outputs.push(a),
                Section::None => return Err(err("Unrecongnized parameter to SCRIPTRUN")),
            }
        }
        pos += 1;
    }
    call.style = CallStyle::Positional { list_from };
    Ok(call)
}

/// Keys of AI.SCRIPTEXECUTE: the script and INPUTS are read, OUTPUTS written, and KEYS (which the script's
/// `redis.execute` calls may read or write) both; ARGS are not keys.
pub fn scriptexecute_key_positions(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    let mut keys = vec![(1, KeyAccess::Read)];
    let mut pos = 3;
    while pos + 1 < argv.len() {
        let a = argv[pos];
        let sections = [Some(KeyAccess::ReadWrite), Some(KeyAccess::Read), None, Some(KeyAccess::Write)];
        let counted = ["KEYS", "INPUTS", "ARGS", "OUTPUTS"].iter().position(|k| is_keyword(a, k));
        let Some(i) = counted else { break };
        let n = parse_i64(argv[pos + 1]).filter(|&n| n >= 0).unwrap_or(0) as usize;
        let end = (pos + 2 + n).min(argv.len());
        if let Some(access) = sections[i] {
            keys.extend((pos + 2..end).map(|k| (k, access)));
        }
        pos = end;
    }
    keys.retain(|&(k, _)| k < argv.len());
    keys
}

/// Keys of AI.SCRIPTRUN: the script and inputs (read), outputs (written); not `$`, the section words or
/// TIMEOUT.
pub fn scriptrun_key_positions(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    let mut keys = vec![(1, KeyAccess::Read)];
    let mut pos = 3;
    let mut section = None;
    while pos < argv.len() {
        let a = argv[pos];
        if is_keyword(a, "TIMEOUT") {
            pos += 2;
            section = None;
            continue;
        }
        if is_keyword(a, "INPUTS") {
            section = Some(KeyAccess::Read);
        } else if is_keyword(a, "OUTPUTS") {
            section = Some(KeyAccess::Write);
        } else if let Some(access) = section.filter(|_| a != b"$") {
            keys.push((pos, access));
        }
        pos += 1;
    }
    keys.retain(|&(k, _)| k < argv.len());
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::commands::words;

    #[test]
    fn scriptstore_errors() {
        let e = |s: &str| parse_scriptstore(&words(s)).unwrap_err().reply_text();
        assert_eq!(e("AI.SCRIPTSTORE s CPU SOURCE x"), "ERR wrong number of arguments for 'ai.scriptstore' command");
        assert_eq!(
            e("AI.SCRIPTSTORE s CPU TAG t SOURCE a b c"),
            "ERR Insufficient arguments, missing script entry points"
        );
        assert_eq!(
            e("AI.SCRIPTSTORE s CPU ENTRY_POINTS x f SOURCE a"),
            "ERR Non numeric entry points number provided to AI.SCRIPTSTORE command"
        );
        assert_eq!(
            e("AI.SCRIPTSTORE s CPU ENTRY_POINTS 3 f SOURCE a"),
            "ERR Insufficient arguments, missing script entry points"
        );
        assert_eq!(
            e("AI.SCRIPTSTORE s CPU ENTRY_POINTS 2 f g h SOURC a"),
            "ERR Insufficient arguments, missing script SOURCE"
        );
        let s = parse_scriptstore(&words("AI.SCRIPTSTORE s cpu TAG v ENTRY_POINTS 2 f g SOURCE src")).unwrap();
        assert_eq!(
            (s.entry_points, s.source.as_str(), s.tag),
            (vec!["f".to_string(), "g".into()], "src", b"v".to_vec())
        );
        assert_eq!(
            parse_scriptset(&words("AI.SCRIPTSET s CPU SOURCE")).unwrap_err(),
            Error::WrongArity("AI.SCRIPTSET")
        );
        assert!(parse_scriptset(&words("AI.SCRIPTSET s CPU TAG t SOURCE x")).unwrap().entry_points.is_empty());
    }

    #[test]
    fn scriptexecute_scopes() {
        let e = |s: &str| parse_scriptexecute(&words(s), false).unwrap_err().reply_text();
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f ARGS 1 a"),
            "ERR KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command"
        );
        assert_eq!(e("AI.SCRIPTEXECUTE s f KEYS"), "ERR Missing arguments after KEYS keyword");
        assert_eq!(e("AI.SCRIPTEXECUTE s f KEYS 1"), "ERR Missing arguments after KEYS keyword");
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f KEYS 2 k1"),
            "ERR Number of pre declared KEYS to be used in the command does not match the number of given arguments"
        );
        assert_eq!(e("AI.SCRIPTEXECUTE s f KEYS 0 a"), "ERR Invalid or negative value found in number of KEYS");
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f KEYS 3 a"),
            "ERR Number of pre declared KEYS to be used in the command does not match the number of given arguments"
        );
        assert_eq!(e("AI.SCRIPTEXECUTE s f INPUTS"), "ERR Invalid arguments provided to AI.SCRIPTEXECUTE");
        assert_eq!(e("AI.SCRIPTEXECUTE s f INPUTS x a"), "ERR Invalid argument for inputs count in AI.SCRIPTEXECUTE");
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a ARGS x"),
            "ERR Invalid argument for keys count in AI.SCRIPTEXECUTE"
        );
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a OUTPUTS 3 b"),
            "ERR number of outputs to AI.SCRIPTEXECUTE command does not match the number of given arguments"
        );
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a INPUTS 1 b"),
            "ERR Already Encountered INPUTS scope in AI.SCRIPTEXECUTE command"
        );
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a TIMEOUT"),
            "ERR No value provided for TIMEOUT in AI.SCRIPTEXECUTE"
        );
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a TIMEOUT 5 X"),
            "ERR Encountered problem parsing AI.SCRIPTEXECUTE"
        );
        assert_eq!(
            e("AI.SCRIPTEXECUTE s f INPUTS 1 a FOO"),
            "ERR Invalid AI.SCRIPTEXECUTE command. Unexpected argument: FOO"
        );
        let c = parse_scriptexecute(
            &words("AI.SCRIPTEXECUTE s f KEYS 1 k INPUTS 2 a b ARGS 1 x OUTPUTS 1 o TIMEOUT 9"),
            false,
        )
        .unwrap();
        assert_eq!((c.keys.len(), c.inputs.len(), c.args.len(), c.outputs.len()), (1, 2, 1, 1));
        assert!(parse_scriptexecute(&words("AI.SCRIPTEXECUTE s f OUTPUTS 1 o"), true).is_ok());
        assert_eq!(
            scriptexecute_key_positions(&words("AI.SCRIPTEXECUTE s f KEYS 1 k INPUTS 2 a b ARGS 1 x OUTPUTS 1 o")),
            vec![
                (1, KeyAccess::Read),
                (5, KeyAccess::ReadWrite),
                (8, KeyAccess::Read),
                (9, KeyAccess::Read),
                (15, KeyAccess::Write)
            ]
        );
    }

    #[test]
    fn scriptrun_sections() {
        let e = |s: &str| parse_scriptrun(&words(s)).unwrap_err().reply_text();
        assert_eq!(
            e("AI.SCRIPTRUN s f $ a"),
            "ERR Encountered a variable size list of tensors outside of input section"
        );
        assert_eq!(e("AI.SCRIPTRUN s f INPUTS a $ b $ c"), "ERR Already encountered a variable size list of tensors");
        assert_eq!(e("AI.SCRIPTRUN s f INPUTS a INPUTS b"), "ERR Already encountered an INPUTS section in SCRIPTRUN");
        assert_eq!(e("AI.SCRIPTRUN s f x"), "ERR Unrecongnized parameter to SCRIPTRUN");
        let c = parse_scriptrun(&words("AI.SCRIPTRUN s f TIMEOUT 5 INPUTS a $ b c OUTPUTS o")).unwrap();
        assert_eq!((c.inputs.len(), c.outputs.len(), c.style), (3, 1, CallStyle::Positional { list_from: Some(1) }));
        assert_eq!(
            scriptrun_key_positions(&words("AI.SCRIPTRUN s f TIMEOUT 5 INPUTS a $ b OUTPUTS o")),
            vec![(1, KeyAccess::Read), (6, KeyAccess::Read), (8, KeyAccess::Read), (10, KeyAccess::Write)]
        );
    }
}
