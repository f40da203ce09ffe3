//! AI.TENSORSET and AI.TENSORGET (docs/commands.md, AI.TENSORSET, AI.TENSORGET).

use super::is_keyword;
use crate::error::{Error, Result};
use crate::reply::Reply;
use std::sync::Arc;

use crate::tensor::{parse_i64, DataType, ExternalBytes, Tensor, Value, ADOPT_FROM};

/// `AI.TENSORSET <key> <type> <dim>... [BLOB <data> | VALUES <v>...]`, checked in RedisAI's order.
/// `adopt(i)` may hand over argv[i] (a BLOB of at least `ADOPT_FROM` bytes) to be kept instead of copied.
pub fn parse_tensorset(argv: &[&[u8]], adopt: &dyn Fn(usize) -> Option<Arc<dyn ExternalBytes>>) -> Result<Tensor> {
    if argv.len() < 4 {
        return Err(Error::WrongArity("AI.TENSORSET"));
    }
    parse_tensor_args(&argv[2..], &|i| adopt(i + 2))
}

/// Bytes a zero-filled `<type> <dim>...` (no BLOB/VALUES) would allocate, if its shape is valid: a request of a
/// few bytes that may ask for gigabytes, so the handler checks it against maxmemory first.
pub fn zero_filled_bytes(args: &[&[u8]]) -> Option<usize> {
    let (dtype, dims) = args.split_first()?;
    if dims.iter().any(|a| is_keyword(a, "BLOB") || is_keyword(a, "VALUES")) {
        return None;
    }
    let dtype = DataType::parse(dtype).ok()?;
    let shape = dims.iter().map(|d| parse_i64(d)).collect::<Option<Vec<i64>>>()?;
    crate::tensor::element_count(dtype, &shape).ok().map(|n| n * dtype.elem_size())
}

/// `<type> <dim>... [BLOB <data> | VALUES <v>...]`: shared with the TENSORSET op of a DAG. `adopt` as in
/// `parse_tensorset`, with positions in `args`.
pub fn parse_tensor_args(args: &[&[u8]], adopt: &dyn Fn(usize) -> Option<Arc<dyn ExternalBytes>>) -> Result<Tensor> {
    let dtype = DataType::parse(args[0])?;
    let rest = &args[1..];
    let data_at = rest.iter().position(|a| is_keyword(a, "BLOB") || is_keyword(a, "VALUES")).unwrap_or(rest.len());
    let shape = rest[..data_at]
        .iter()
        .map(|d| parse_i64(d).filter(|&d| d > 0).ok_or(Error::InvalidShape))
        .collect::<Result<Vec<i64>>>()?;
    match rest.get(data_at) {
        None => Tensor::zeros(dtype, shape),
        Some(kw) if is_keyword(kw, "BLOB") => match &rest[data_at + 1..] {
            [blob] if blob.len() >= ADOPT_FROM => match adopt(data_at + 2) {
                Some(kept) => Tensor::from_external(dtype, shape, kept),
                None => Tensor::from_blob(dtype, shape, blob),
            },
            [blob] => Tensor::from_blob(dtype, shape, blob),
            _ => Err(Error::BlobArgument),
        },
        Some(_) => Tensor::from_values(dtype, shape, &rest[data_at + 1..]),
    }
}

pub use crate::reply::GetFormat;

/// The format words of `AI.TENSORGET <key> [META] [BLOB | VALUES]` (any order, repeats allowed).
pub fn parse_tensorget_format(words: &[&[u8]]) -> Result<GetFormat> {
    let mut f = GetFormat::default();
    for w in words {
        if is_keyword(w, "META") {
            f.meta = true;
        } else if is_keyword(w, "BLOB") {
            f.blob = true;
        } else if is_keyword(w, "VALUES") {
            f.values = true;
        } else {
            return Err(Error::UnsupportedFormat);
        }
    }
    if f.blob && f.values {
        return Err(Error::BothBlobAndValues);
    }
    if !f.meta && !f.blob && !f.values {
        return Ok(GetFormat { meta: true, blob: true, values: false });
    }
    Ok(f)
}

/// The words between the key and the data of `AI.TENSORSET <key> <TYPE> <dims>... BLOB <data>`, the form
/// used for AOF rewrites and for replicating computed tensors.
pub fn tensorset_words(t: &Tensor) -> smallvec::SmallVec<[Word; 6]> {
    use std::io::Write;
    let mut words = smallvec::SmallVec::new();
    words.push(Word::from_slice(t.dtype().name().as_bytes()));
    for d in t.shape() {
        let mut w = Word::new();
        let _ = write!(w, "{d}");
        words.push(w);
    }
    words.push(Word::from_slice(b"BLOB"));
    words
}

pub use crate::exec::dag::Word;

/// Arity of AI.TENSORGET, checked before the key is looked up.
pub fn check_tensorget_arity(argv: &[&[u8]]) -> Result<()> {
    if (2..=4).contains(&argv.len()) {
        Ok(())
    } else {
        Err(Error::WrongArity("AI.TENSORGET"))
    }
}

fn values_reply(t: &Tensor) -> Reply<'_> {
    Reply::Array(
        t.values()
            .map(|v| match v {
                Value::Int(i) => Reply::Int(i),
                Value::Double(d) => Reply::Double(d),
                Value::Str(s) => Reply::bytes(s),
            })
            .collect(),
    )
}

/// The reply of AI.TENSORGET for `t` in format `f`.
pub fn tensor_reply(t: &Tensor, f: GetFormat) -> Reply<'_> {
    let data = if f.blob {
        Some(("blob", Reply::bytes(t.data())))
    } else if f.values {
        Some(("values", values_reply(t)))
    } else {
        None
    };
    if !f.meta {
        return data.map(|(_, r)| r).unwrap_or(Reply::Null);
    }
    let mut out = vec![
        Reply::str("dtype"),
        Reply::str(t.dtype().name()),
        Reply::str("shape"),
        Reply::Array(t.shape().iter().map(|&d| Reply::Int(d)).collect()),
    ];
    if let Some((name, r)) = data {
        out.push(Reply::str(name));
        out.push(r);
    }
    Reply::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<Vec<u8>> {
        s.split(' ').map(|w| w.as_bytes().to_vec()).collect()
    }
    fn set(s: &str) -> Result<Tensor> {
        let a = argv(s);
        let refs: Vec<&[u8]> = a.iter().map(|x| x.as_slice()).collect();
        parse_tensorset(&refs, &|_| None)
    }

    #[test]
    fn tensorset_checks_in_order() {
        assert_eq!(set("AI.TENSORSET t FLOAT"), Err(Error::WrongArity("AI.TENSORSET")));
        assert_eq!(set("AI.TENSORSET t FLOAT16 0 BLOB"), Err(Error::InvalidDataType));
        assert_eq!(set("AI.TENSORSET t FLOAT 0 BLOB"), Err(Error::InvalidShape));
        assert_eq!(set("AI.TENSORSET t FLOAT 1.5"), Err(Error::InvalidShape));
        assert_eq!(set("AI.TENSORSET t FLOAT 2 BLOB"), Err(Error::BlobArgument));
        assert_eq!(set("AI.TENSORSET t FLOAT 2 BLOB a b"), Err(Error::BlobArgument));
        assert_eq!(set("AI.TENSORSET t FLOAT 2 BLOB abc"), Err(Error::DataLength));
        assert_eq!(set("AI.TENSORSET t FLOAT 2 VALUES 1"), Err(Error::ValuesCount));
        assert_eq!(set("AI.TENSORSET t float 2 values 1 x"), Err(Error::InvalidValue));
        let t = set("AI.TENSORSET t int16 1 2 VALUES -3 4").unwrap();
        assert_eq!(t.shape(), &[1, 2]);
        let scalar = set("AI.TENSORSET t DOUBLE VALUES 3").unwrap();
        assert!(scalar.shape().is_empty());
        assert_eq!(set("AI.TENSORSET t UINT8 3").unwrap().data(), &[0, 0, 0]);
    }

    #[test]
    fn tensorget_formats() {
        let f = |s: &str| {
            let a = argv(s);
            let refs: Vec<&[u8]> = a.iter().map(|x| x.as_slice()).collect();
            parse_tensorget_format(&refs)
        };
        assert_eq!(f("blob meta blob").unwrap(), GetFormat { meta: true, blob: true, values: false });
        assert_eq!(f("BLOB VALUES"), Err(Error::BothBlobAndValues));
        assert_eq!(f("RAW"), Err(Error::UnsupportedFormat));
        assert_eq!(parse_tensorget_format(&[]).unwrap(), GetFormat { meta: true, blob: true, values: false });

        let t = set("AI.TENSORSET t FLOAT 2 VALUES 1 2").unwrap();
        let r = tensor_reply(&t, f("META VALUES").unwrap());
        let Reply::Array(items) = r else { panic!() };
        assert_eq!(items.len(), 6);
        assert_eq!(items[5], Reply::Array(vec![Reply::Double(1.0), Reply::Double(2.0)]));
        assert_eq!(tensor_reply(&t, f("BLOB").unwrap()), Reply::bytes(t.data()));
    }
}
