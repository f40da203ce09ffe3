//! AI.MODELSTORE / MODELSET / MODELGET / MODELEXECUTE / MODELRUN argument parsing (docs/commands.md, AI.MODELSTORE … AI.MODELRUN).

use crate::blob::Blob;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::{is_keyword, optional_tag, KeyAccess};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::model::{BackendKind, BatchOpts, ModelSpec};
use crate::reply::Reply;
use crate::tensor::parse_i64;

fn err(msg: &str) -> Error {
    Error::parse(msg)
}

fn plain(msg: &str) -> Error {
    Error::parse_verbatim(msg)
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn non_negative(arg: Option<&&[u8]>, what: &str) -> Result<u64> {
    arg.and_then(|a| parse_i64(a))
        .filter(|&v| v >= 0)
        .map(|v| v as u64)
        .ok_or_else(|| err(&format!("Invalid argument for {what}")))
}

/// Largest model payload (the chunks together): what the RDB and every backend can carry.
pub const MAX_MODEL_BYTES: usize = 4 << 30;

/// The payload's chunks `argv[first..]`, refused above MAX_MODEL_BYTES together.
fn payload_at(argv: &[&[u8]], first: usize) -> Result<usize> {
    let total: usize = argv[first..].iter().map(|c| c.len()).sum();
    if total > MAX_MODEL_BYTES {
        return Err(err(&format!("model payload exceeds the limit of {MAX_MODEL_BYTES} bytes")));
    }
    Ok(first)
}

/// Concatenates the BLOB chunks into one payload (one copy for the usual single chunk). The command handler
/// does this on the build thread, so that a big model is not copied on Redis's main thread.
pub fn concat(chunks: &[&[u8]]) -> Blob {
    let mut v = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
    for c in chunks {
        v.extend_from_slice(c);
    }
    Arc::new(v)
}

/// AI.MODELSTORE parsed, payload included.
pub fn parse_modelstore(argv: &[&[u8]]) -> Result<ModelSpec> {
    let (spec, first) = parse_modelstore_head(argv)?;
    Ok(ModelSpec { blob: concat(&argv[first..]), ..spec })
}

/// AI.MODELSET parsed, payload included.
pub fn parse_modelset(argv: &[&[u8]]) -> Result<ModelSpec> {
    let (spec, first) = parse_modelset_head(argv)?;
    Ok(ModelSpec { blob: concat(&argv[first..]), ..spec })
}

/// `AI.MODELSTORE <key> <backend> <device> [TAG t] [BATCHSIZE n [MINBATCHSIZE m [MINBATCHTIMEOUT t]]]
/// [INPUTS n ... OUTPUTS n ...] BLOB <chunk>...`, checked in RedisAI's order: the spec with an empty payload,
/// and where the payload's chunks start in `argv`.
pub fn parse_modelstore_head(argv: &[&[u8]]) -> Result<(ModelSpec, usize)> {
    if argv.len() < 6 {
        // RedisAI answers with RedisModule_WrongArity: Redis 7 names the registered (lower-case) command.
        return Err(Error::WrongArity("ai.modelstore"));
    }
    let backend = BackendKind::parse(argv[2])?;
    let device = Device::parse(argv[3])?;
    let mut pos = 4;
    let tag = optional_tag(argv, &mut pos, "Insufficient arguments, missing model BLOB")?;
    let mut batch = BatchOpts::default();
    if argv.get(pos).is_some_and(|a| is_keyword(a, "BATCHSIZE")) {
        batch.size = non_negative(argv.get(pos + 1), "BATCHSIZE")?;
        pos += 2;
    }
    if argv.get(pos).is_some_and(|a| is_keyword(a, "MINBATCHSIZE")) {
        batch.min_size = non_negative(argv.get(pos + 1), "MINBATCHSIZE")?;
        if batch.min_size > 0 && batch.size == 0 {
            return Err(err("MINBATCHSIZE specified without BATCHSIZE"));
        }
        pos += 2;
    }
    if argv.get(pos).is_some_and(|a| is_keyword(a, "MINBATCHTIMEOUT")) {
        batch.min_timeout_ms = non_negative(argv.get(pos + 1), "MINBATCHTIMEOUT")?;
        if batch.min_timeout_ms > 0 && batch.min_size == 0 {
            return Err(err("MINBATCHTIMEOUT specified without MINBATCHSIZE"));
        }
        pos += 2;
    }
    if pos >= argv.len() {
        return Err(err("Insufficient arguments, missing model BLOB"));
    }
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    if backend == BackendKind::Tf {
        inputs = counted_names(argv, &mut pos, "INPUTS", "input_count", "inputs")?;
        outputs = counted_names(argv, &mut pos, "OUTPUTS", "output_count", "outputs")?;
    } else if is_keyword(argv[pos], "INPUTS") {
        return Err(err("INPUTS argument should not be specified for this backend"));
    }
    if !argv.get(pos).is_some_and(|a| is_keyword(a, "BLOB")) {
        return Err(err("Invalid argument, expected BLOB"));
    }
    if pos + 1 >= argv.len() {
        return Err(err("Insufficient arguments, missing model BLOB"));
    }
    let blob: Blob = Arc::default();
    Ok((ModelSpec { backend, device, tag, batch, inputs, outputs, blob }, payload_at(argv, pos + 1)?))
}

/// `INPUTS <n> <name>...` / `OUTPUTS <n> <name>...` of a TF MODELSTORE.
fn counted_names(argv: &[&[u8]], pos: &mut usize, keyword: &str, count_name: &str, what: &str) -> Result<Vec<String>> {
    if !argv.get(*pos).is_some_and(|a| is_keyword(a, keyword)) {
        return Err(err(&format!("{keyword} not specified for TF")));
    }
    let n = argv
        .get(*pos + 1)
        .and_then(|a| parse_i64(a))
        .filter(|&n| n >= 1)
        .ok_or_else(|| err(&format!("Invalid argument for {count_name}")))? as usize;
    let names = argv
        .get(*pos + 2..)
        .filter(|rest| rest.len() >= n)
        .ok_or_else(|| err(&format!("number of model {what} does not match the number of given arguments")))?;
    *pos += 2 + n;
    Ok(names[..n].iter().map(|a| utf8(a)).collect())
}

const MODELSET_KEYWORDS: [&str; 7] =
    ["TAG", "BATCHSIZE", "MINBATCHSIZE", "MINBATCHTIMEOUT", "INPUTS", "OUTPUTS", "BLOB"];

/// Deprecated `AI.MODELSET <key> <backend> <device> [TAG t] [BATCHSIZE n [MINBATCHSIZE m [MINBATCHTIMEOUT t]]]
/// [INPUTS name... OUTPUTS name...] BLOB <chunk>...` (no counts; INPUTS/OUTPUTS only matter for TF): as
/// `parse_modelstore_head`.
pub fn parse_modelset_head(argv: &[&[u8]]) -> Result<(ModelSpec, usize)> {
    if argv.len() < 4 {
        return Err(Error::WrongArity("AI.MODELSET"));
    }
    let backend = BackendKind::parse(argv[2])?;
    if argv[3].len() > 10 || MODELSET_KEYWORDS.iter().any(|k| is_keyword(argv[3], k)) {
        return Err(Error::InvalidDevice);
    }
    let device = Device::parse(argv[3]).map_err(|_| err("Error configuring model: unsupported device"))?;
    let mut pos = 4;
    let tag = optional_tag(argv, &mut pos, "Insufficient arguments, missing model BLOB")?;
    let mut batch = BatchOpts::default();
    if argv.get(pos).is_some_and(|a| is_keyword(a, "BATCHSIZE")) {
        if backend == BackendKind::TfLite {
            return Err(err("Auto-batching not supported by the TFLITE backend"));
        }
        batch.size = non_negative(argv.get(pos + 1), "BATCHSIZE")?;
        pos += 2;
        if argv.get(pos).is_some_and(|a| is_keyword(a, "MINBATCHSIZE")) {
            batch.min_size = non_negative(argv.get(pos + 1), "MINBATCHSIZE")?;
            pos += 2;
        }
    }
    if argv.get(pos).is_some_and(|a| is_keyword(a, "MINBATCHTIMEOUT")) {
        batch.min_timeout_ms = non_negative(argv.get(pos + 1), "MINBATCHTIMEOUT")?;
        if batch.size == 0 {
            return Err(err("MINBATCHTIMEOUT specified without BATCHSIZE"));
        }
        pos += 2;
    }
    let blob_at = argv[pos..].iter().position(|a| is_keyword(a, "BLOB")).map(|i| pos + i);
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    if backend == BackendKind::Tf {
        let opts = &argv[pos..blob_at.unwrap_or(argv.len())];
        if opts.is_empty() {
            return Err(err("Insufficient arguments, INPUTS and OUTPUTS not specified"));
        }
        if !is_keyword(opts[0], "INPUTS") {
            return Err(err("INPUTS not specified"));
        }
        let out_at = opts.iter().position(|a| is_keyword(a, "OUTPUTS")).ok_or_else(|| err("OUTPUTS not specified"))?;
        inputs = opts[1..out_at].iter().map(|a| utf8(a)).collect();
        outputs = opts[out_at + 1..].iter().map(|a| utf8(a)).collect();
    }
    let blob_at = blob_at.ok_or_else(|| err("Insufficient arguments, missing model BLOB"))?;
    if blob_at + 1 >= argv.len() {
        return Err(err("Insufficient arguments, missing model BLOB"));
    }
    let blob: Blob = Arc::default();
    Ok((ModelSpec { backend, device, tag, batch, inputs, outputs, blob }, payload_at(argv, blob_at + 1)?))
}

/// The reply of AI.MODELGET: META fields and/or the BLOB (an array of chunks once it reaches `chunk`).
pub fn modelget_reply<'a>(
    spec: &'a ModelSpec,
    inputs: &[String],
    outputs: &[String],
    words: &[&[u8]],
    chunk: usize,
) -> Reply<'a> {
    let meta = words.iter().any(|w| is_keyword(w, "META"));
    let blob = words.iter().any(|w| is_keyword(w, "BLOB"));
    let (meta, blob) = if !meta && !blob { (true, true) } else { (meta, blob) };
    let blob_reply = || {
        let b = &spec.blob;
        // Borrowed: the blob is copied once, into the client's reply buffer (a model can be hundreds of MB).
        if b.len() < chunk {
            Reply::Bulk(Cow::Borrowed(&b[..]))
        } else {
            // RedisAI's count: len / chunk + 1, the last chunk possibly empty.
            let n = b.len() / chunk + 1;
            Reply::Array(
                (0..n).map(|i| Reply::Bulk(Cow::Borrowed(&b[i * chunk..((i + 1) * chunk).min(b.len())]))).collect(),
            )
        }
    };
    if !meta {
        return blob_reply();
    }
    let names = |v: &[String]| Reply::Array(v.iter().map(|s| Reply::Bulk(s.as_bytes().to_vec().into())).collect());
    let mut out = vec![
        Reply::str("backend"),
        Reply::str(spec.backend.name()),
        Reply::str("device"),
        Reply::Bulk(spec.device.name.as_bytes().to_vec().into()),
        Reply::str("tag"),
        Reply::Bulk(spec.tag.clone().into()),
        Reply::str("batchsize"),
        Reply::Int(spec.batch.size as i64),
        Reply::str("minbatchsize"),
        Reply::Int(spec.batch.min_size as i64),
        Reply::str("inputs"),
        names(inputs),
        Reply::str("outputs"),
        names(outputs),
        Reply::str("minbatchtimeout"),
        Reply::Int(spec.batch.min_timeout_ms as i64),
    ];
    if blob {
        out.push(Reply::str("blob"));
        out.push(blob_reply());
    }
    Reply::Array(out)
}

/// Input and output keys and TIMEOUT of a model execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecuteArgs<'a> {
    pub inputs: Keys<'a>,
    pub outputs: Keys<'a>,
    pub timeout: Option<Duration>,
}

/// `TIMEOUT <ms>`: a positive integer.
pub fn parse_timeout(value: Option<&&[u8]>) -> Result<Duration> {
    let v = value.ok_or_else(|| err("No value provided for TIMEOUT"))?;
    parse_i64(v)
        .filter(|&t| t > 0)
        .map(|t| Duration::from_millis(t as u64))
        .ok_or_else(|| err("Invalid value for TIMEOUT"))
}

/// Key names of one scope (a few, on the stack).
pub type Keys<'a> = smallvec::SmallVec<[&'a [u8]; 4]>;

/// One `INPUTS|OUTPUTS <n> <key>...` scope of AI.MODELEXECUTE.
fn execute_scope<'a>(args: &[&'a [u8]], pos: &mut usize, keyword: &str, expected: usize) -> Result<Keys<'a>> {
    // The error texts' wording, made only on the error paths.
    let lower = || keyword.to_ascii_lowercase();
    let upper = keyword;
    if !args.get(*pos).is_some_and(|a| is_keyword(a, keyword)) {
        return Err(err(&format!("{upper} not specified")));
    }
    let n = args
        .get(*pos + 1)
        .and_then(|a| parse_i64(a))
        .ok_or_else(|| err(&format!("Invalid argument for {}_count", &lower()[..upper.len() - 1])))?;
    if n <= 0 {
        let lower = lower();
        let what = &lower[..lower.len() - 1];
        let cap = format!("{}{}", what[..1].to_ascii_uppercase(), &what[1..]);
        return Err(err(&format!("{cap} count must be a positive integer")));
    }
    if expected != crate::model::ANY_COUNT && n as usize != expected {
        return Err(plain(&format!("Number of keys given as {upper} here does not match model definition")));
    }
    let keys = args.get(*pos + 2..*pos + 2 + n as usize).ok_or_else(|| {
        let lower = lower();
        let what = &lower[..lower.len() - 1];
        err(&format!("number of {what} keys to AI.MODELEXECUTE command does not match the number of given arguments"))
    })?;
    *pos += 2 + n as usize;
    Ok(keys.iter().copied().collect())
}

/// `AI.MODELEXECUTE <key> INPUTS <n> <in>... OUTPUTS <n> <out>... [TIMEOUT <ms>]`, after the model was found.
pub fn parse_modelexecute<'a>(argv: &[&'a [u8]], ninputs: usize, noutputs: usize) -> Result<ExecuteArgs<'a>> {
    let mut pos = 2;
    let inputs = execute_scope(argv, &mut pos, "INPUTS", ninputs)?;
    let outputs = execute_scope(argv, &mut pos, "OUTPUTS", noutputs)?;
    let mut timeout = None;
    if let Some(a) = argv.get(pos) {
        if !is_keyword(a, "TIMEOUT") {
            return Err(plain(&format!("Invalid argument: {}", utf8(a))));
        }
        timeout = Some(parse_timeout(argv.get(pos + 1))?);
        if let Some(extra) = argv.get(pos + 2) {
            return Err(plain(&format!("Invalid argument: {}", utf8(extra))));
        }
    }
    Ok(ExecuteArgs { inputs, outputs, timeout })
}

/// Deprecated `AI.MODELRUN <key> [TIMEOUT <ms>] INPUTS <in>... OUTPUTS <out>...`, after the model was found.
pub fn parse_modelrun<'a>(argv: &[&'a [u8]], ninputs: usize, noutputs: usize) -> Result<ExecuteArgs<'a>> {
    let mut pos = 2;
    let mut timeout = None;
    if argv.get(pos).is_some_and(|a| is_keyword(a, "TIMEOUT")) {
        timeout = Some(parse_timeout(argv.get(pos + 1))?);
        pos += 2;
    }
    if !argv.get(pos).is_some_and(|a| is_keyword(a, "INPUTS")) {
        return Err(err("INPUTS not specified"));
    }
    let rest = &argv[pos + 1..];
    let out_at = rest.iter().position(|a| is_keyword(a, "OUTPUTS")).ok_or_else(|| err("OUTPUTS not specified"))?;
    let (inputs, outputs): (Keys, Keys) =
        (rest[..out_at].iter().copied().collect(), rest[out_at + 1..].iter().copied().collect());
    let differs = |n: usize, expected: usize| expected != crate::model::ANY_COUNT && n != expected;
    if differs(inputs.len(), ninputs) {
        return Err(plain("Number of keys given as INPUTS here does not match model definition"));
    }
    if differs(outputs.len(), noutputs) {
        return Err(plain("Number of keys given as OUTPUTS here does not match model definition"));
    }
    Ok(ExecuteArgs { inputs, outputs, timeout })
}

/// Keys of AI.MODELEXECUTE (for the getkeys callback): the model and inputs are read, outputs written.
pub fn modelexecute_key_positions(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    let mut keys = vec![(1, KeyAccess::Read)];
    let mut pos = 2;
    for (keyword, access) in [("INPUTS", KeyAccess::Read), ("OUTPUTS", KeyAccess::Write)] {
        if !argv.get(pos).is_some_and(|a| is_keyword(a, keyword)) {
            break;
        }
        let Some(n) = argv.get(pos + 1).and_then(|a| parse_i64(a)).filter(|&n| n > 0) else { break };
        let end = (pos + 2 + n as usize).min(argv.len());
        keys.extend((pos + 2..end).map(|k| (k, access)));
        pos = end;
    }
    keys.retain(|&(k, _)| k < argv.len());
    keys
}

/// Keys of AI.MODELRUN: the model and every argument after INPUTS (read) or OUTPUTS (written).
pub fn modelrun_key_positions(argv: &[&[u8]]) -> Vec<(usize, KeyAccess)> {
    let mut keys = vec![(1, KeyAccess::Read)];
    if let Some(i) = argv.iter().position(|a| is_keyword(a, "INPUTS")) {
        let mut access = KeyAccess::Read;
        for (p, a) in argv.iter().enumerate().skip(i + 1) {
            if is_keyword(a, "OUTPUTS") {
                access = KeyAccess::Write;
            } else {
                keys.push((p, access));
            }
        }
    }
    keys.retain(|&(k, _)| k < argv.len());
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::commands::words;

    #[test]
    fn model_payload_limit() {
        // 4097 references to one 1 MiB chunk: refused before anything is copied.
        let chunk = vec![0u8; 1 << 20];
        let mut argv: Vec<&[u8]> = words("AI.MODELSTORE m ONNX CPU BLOB");
        argv.extend(std::iter::repeat_n(&chunk[..], 4097));
        let e = parse_modelstore(&argv).unwrap_err().reply_text();
        assert_eq!(e, "ERR model payload exceeds the limit of 4294967296 bytes");
    }

    #[test]
    fn modelstore_checks_in_order() {
        let e = |s: &str| parse_modelstore(&words(s)).unwrap_err().reply_text();
        assert_eq!(e("AI.MODELSTORE m ONNX CPU BLOB"), "ERR wrong number of arguments for 'ai.modelstore' command");
        assert_eq!(e("AI.MODELSTORE m PT CPU BLOB x"), "ERR unsupported backend");
        assert_eq!(e("AI.MODELSTORE m ONNX CPU:1.8 BLOB x"), "ERR Invalid DEVICE");
        assert_eq!(e("AI.MODELSTORE m ONNX CPU BATCHSIZE x BLOB x"), "ERR Invalid argument for BATCHSIZE");
        assert_eq!(e("AI.MODELSTORE m ONNX CPU MINBATCHSIZE 2 BLOB x"), "ERR MINBATCHSIZE specified without BATCHSIZE");
        assert_eq!(
            e("AI.MODELSTORE m ONNX CPU BATCHSIZE 2 MINBATCHTIMEOUT 2 BLOB x"),
            "ERR MINBATCHTIMEOUT specified without MINBATCHSIZE"
        );
        assert_eq!(e("AI.MODELSTORE m ONNX CPU TAG a b c"), "ERR Invalid argument, expected BLOB");
        assert_eq!(e("AI.MODELSTORE m ONNX CPU TAG a BLOB"), "ERR Insufficient arguments, missing model BLOB");
        assert_eq!(
            e("AI.MODELSTORE m ONNX CPU INPUTS 1 a BLOB"),
            "ERR INPUTS argument should not be specified for this backend"
        );
        assert_eq!(e("AI.MODELSTORE m TF CPU BLOB x y"), "ERR INPUTS not specified for TF");
        assert_eq!(e("AI.MODELSTORE m TF CPU INPUTS 0 BLOB x"), "ERR Invalid argument for input_count");
        assert_eq!(
            e("AI.MODELSTORE m TF CPU INPUTS 9 a"),
            "ERR number of model inputs does not match the number of given arguments"
        );
        assert_eq!(e("AI.MODELSTORE m TF CPU INPUTS 1 a BLOB x"), "ERR OUTPUTS not specified for TF");
        let s = parse_modelstore(&words("AI.MODELSTORE m tf cpu:1 TAG v INPUTS 2 a b OUTPUTS 1 c BLOB xy z")).unwrap();
        assert_eq!(
            (s.inputs.len(), s.outputs, s.blob.as_slice(), s.device.name.as_str()),
            (2, vec!["c".to_string()], &b"xyz"[..], "cpu:1")
        );
        let s =
            parse_modelstore(&words("AI.MODELSTORE m ONNX CPU BATCHSIZE 4 MINBATCHSIZE 2 MINBATCHTIMEOUT 10 BLOB b"))
                .unwrap();
        assert_eq!(s.batch, BatchOpts { size: 4, min_size: 2, min_timeout_ms: 10 });
    }

    #[test]
    fn modelset_forms() {
        let s = parse_modelset(&words("AI.MODELSET m TF CPU INPUTS a b OUTPUTS c BLOB x")).unwrap();
        assert_eq!(s.inputs, vec!["a", "b"]);
        let e = |s: &str| parse_modelset(&words(s)).unwrap_err().reply_text();
        assert_eq!(e("AI.MODELSET m TF CPU BLOB x"), "ERR Insufficient arguments, INPUTS and OUTPUTS not specified");
        assert_eq!(
            e("AI.MODELSET m TFLITE CPU BATCHSIZE 2 BLOB x"),
            "ERR Auto-batching not supported by the TFLITE backend"
        );
        assert_eq!(e("AI.MODELSET m ONNX BLOB BLOB x"), "ERR Invalid DEVICE");
        assert!(parse_modelset(&words("AI.MODELSET m ONNX CPU INPUTS a OUTPUTS b BLOB x")).unwrap().inputs.is_empty());
    }

    #[test]
    fn modelexecute_checks_in_order() {
        let e = |s: &str| parse_modelexecute(&words(s), 2, 1).unwrap_err().reply_text();
        assert_eq!(e("AI.MODELEXECUTE m OUTPUTS 2 a b OUTPUTS 1 c"), "ERR INPUTS not specified");
        assert_eq!(e("AI.MODELEXECUTE m INPUTS x a b OUTPUTS 1 c"), "ERR Invalid argument for input_count");
        assert_eq!(e("AI.MODELEXECUTE m INPUTS -1 a b OUTPUTS 1 c"), "ERR Input count must be a positive integer");
        assert_eq!(
            e("AI.MODELEXECUTE m INPUTS 1 a OUTPUTS 1 c"),
            "Number of keys given as INPUTS here does not match model definition"
        );
        assert_eq!(
            e("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 2 c d"),
            "Number of keys given as OUTPUTS here does not match model definition"
        );
        assert_eq!(
            e("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1"),
            "ERR number of output keys to AI.MODELEXECUTE command does not match the number of given arguments"
        );
        assert_eq!(e("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1 c TIMEOUT"), "ERR No value provided for TIMEOUT");
        assert_eq!(e("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1 c TIMEOUT 0"), "ERR Invalid value for TIMEOUT");
        assert_eq!(e("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1 c FOO"), "Invalid argument: FOO");
        let a = parse_modelexecute(&words("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1 c TIMEOUT 5"), 2, 1).unwrap();
        assert_eq!(
            (a.inputs.to_vec(), a.outputs.to_vec(), a.timeout),
            (words("a b"), words("c"), Some(Duration::from_millis(5)))
        );
    }

    #[test]
    fn modelrun_and_key_positions() {
        use KeyAccess::{Read as R, Write as W};
        let a = parse_modelrun(&words("AI.MODELRUN m TIMEOUT 9 INPUTS a b OUTPUTS c"), 2, 1).unwrap();
        assert_eq!((a.inputs.to_vec(), a.outputs.to_vec()), (words("a b"), words("c")));
        assert_eq!(
            modelexecute_key_positions(&words("AI.MODELEXECUTE m INPUTS 2 a b OUTPUTS 1 c TIMEOUT 5")),
            vec![(1, R), (4, R), (5, R), (8, W)]
        );
        assert_eq!(
            modelrun_key_positions(&words("AI.MODELRUN m TIMEOUT 9 INPUTS a b OUTPUTS c")),
            vec![(1, R), (5, R), (6, R), (8, W)]
        );
    }

    #[test]
    fn modelget_chunks_like_redisai() {
        let s = parse_modelstore(&words("AI.MODELSTORE m ONNX CPU BLOB abcdef")).unwrap();
        let Reply::Array(chunks) = modelget_reply(&s, &[], &[], &words("BLOB"), 3) else { panic!() };
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[2], Reply::Bulk(Vec::new().into()));
        assert_eq!(modelget_reply(&s, &[], &[], &words("BLOB"), 7), Reply::Bulk(b"abcdef".to_vec().into()));
        let Reply::Array(meta) = modelget_reply(&s, &[], &[], &[], 100) else { panic!() };
        assert_eq!(meta.len(), 18);
    }
}
