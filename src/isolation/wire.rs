//! The messages between Redis's process and a backend worker: little-endian integers, length-prefixed bytes and
//! tensors, written into a lane's shared memory and read back with every length checked, so that a worker
//! that crashed mid-write (or was made to write garbage) can make Redis return an error, never read past a
//! message or allocate what the message does not hold.

use crate::backend_kind::BackendKind;
use crate::caller::Caller;
use crate::error::{Error, Result};
use crate::script_spec::CallStyle;
use crate::tensor::{DataType, Tensor, MAX_DIMS};

/// What Redis asks of a worker (the first byte of a request).
pub const LOAD_MODEL: u8 = 1;
pub const LOAD_SCRIPT: u8 = 2;
pub const RUN_MODEL: u8 = 3;
pub const RUN_SCRIPT: u8 = 4;
pub const INFO: u8 = 5;

/// A reply's status: a run stopped at its deadline that may run again elsewhere (an inline run: `within`).
pub const STOPPED: u8 = 2;

/// What a worker asks of Redis while it runs a script or a TorchScript model (the first byte of a callback).
pub const CALL_REDIS: u8 = 1;
pub const CALL_MODEL: u8 = 2;

/// Where a message is written: a lane's shared memory (growing as it is written) or, in tests, a `Vec`.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

pub struct Writer<'a, S: Sink + ?Sized>(pub &'a mut S);

impl<S: Sink + ?Sized> Writer<'_, S> {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.put(&[v]);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.put(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.put(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.put(v);
        self
    }
    pub fn list<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) -> &mut Self {
        self.u32(items.len() as u32);
        for item in items {
            each(self, item);
        }
        self
    }
    pub fn strings<T: AsRef<[u8]>>(&mut self, items: &[T]) -> &mut Self {
        self.list(items, |w, s| {
            w.bytes(s.as_ref());
        })
    }
    pub fn tensor(&mut self, t: &Tensor) -> &mut Self {
        self.u8(dtype_code(t.dtype())).u8(t.shape().len() as u8);
        for d in t.shape() {
            self.u64(*d as u64);
        }
        self.bytes(t.data())
    }
    pub fn tensors(&mut self, ts: &[&Tensor]) -> &mut Self {
        self.list(ts, |w, t| {
            w.tensor(t);
        })
    }
    pub fn caller(&mut self, c: &Caller) -> &mut Self {
        self.u32(c.db as u32).u8(c.read_only as u8);
        match &c.user {
            Some(u) => self.u8(1).bytes(u),
            None => self.u8(0),
        }
    }
    /// A run's time limit and what was left of it when the request was made (the backend reports the limit, and
    /// stops when what was left has passed: copying the request's tensors across does not count against it).
    pub fn deadline(&mut self, limit: std::time::Duration, left: std::time::Duration) -> &mut Self {
        self.u64(limit.as_micros() as u64).u64(left.as_micros() as u64)
    }
    pub fn style(&mut self, s: CallStyle) -> &mut Self {
        match s {
            CallStyle::EntryPoint => self.u8(0),
            CallStyle::Positional { list_from: None } => self.u8(1),
            CallStyle::Positional { list_from: Some(i) } => self.u8(2).u64(i as u64),
        }
    }
    /// A failure, with the kind that AI.INFO counts and the reply's exact text.
    pub fn error(&mut self, e: &Error) -> &mut Self {
        let (code, text, prefixed) = match e {
            Error::Backend(t) => (1, t.as_str(), false),
            Error::Unavailable(t) => (2, t.as_str(), false),
            Error::Mismatch(t) => (3, t.as_str(), false),
            Error::Permission { text, prefixed } => (4, text.as_str(), *prefixed),
            Error::Refused { text, prefixed } => (5, text.as_str(), *prefixed),
            Error::TimedOut { text, prefixed } => (6, text.as_str(), *prefixed),
            Error::NotBuilt(t) => (7, t.as_str(), false),
            Error::NonTensorResult(t) => (8, t.as_str(), false),
            Error::Internal(t) => (9, t.as_str(), false),
            other => return self.u8(0).bytes(other.reply_text().as_bytes()).u8(0),
        };
        self.u8(code).bytes(text.as_bytes()).u8(prefixed as u8)
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn short() -> Error {
    Error::Internal("a backend worker sent a malformed message".into())
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len()).ok_or_else(short)?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| short())?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| short())?))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = usize::try_from(self.u64()?).map_err(|_| short())?;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| short())
    }
    /// A list's length, bounded by what is left (each item takes at least one byte).
    pub fn count(&mut self) -> Result<usize> {
        let n = self.u32()? as usize;
        if n > self.buf.len() - self.pos {
            return Err(short());
        }
        Ok(n)
    }
    pub fn strings(&mut self) -> Result<Vec<String>> {
        (0..self.count()?).map(|_| self.string()).collect()
    }
    pub fn byte_strings(&mut self) -> Result<Vec<Vec<u8>>> {
        (0..self.count()?).map(|_| self.bytes().map(<[u8]>::to_vec)).collect()
    }
    /// A tensor's type, shape and bytes, as they lie in the message.
    pub fn tensor_parts(&mut self) -> Result<(DataType, Vec<i64>, &'a [u8])> {
        let dtype = dtype_from(self.u8()?)?;
        let ndims = self.u8()? as usize;
        if ndims > MAX_DIMS {
            return Err(short());
        }
        let shape = (0..ndims).map(|_| self.u64().map(|d| d as i64)).collect::<Result<Vec<_>>>()?;
        Ok((dtype, shape, self.bytes()?))
    }
    /// A tensor, copied out of the message (its checks are a client's BLOB's).
    pub fn tensor(&mut self) -> Result<Tensor> {
        let (dtype, shape, data) = self.tensor_parts()?;
        Tensor::from_blob(dtype, shape, data)
    }
    pub fn tensors(&mut self) -> Result<Vec<Tensor>> {
        (0..self.count()?).map(|_| self.tensor()).collect()
    }
    pub fn caller(&mut self) -> Result<Caller> {
        let db = self.u32()? as i32;
        let read_only = self.u8()? != 0;
        let user = match self.u8()? {
            0 => None,
            _ => Some(std::sync::Arc::from(self.bytes()?)),
        };
        Ok(Caller { db, user, read_only })
    }
    /// `(start, deadline)` in this process's clock, from a limit and what was left of it when the request was
    /// made, counted from `now` (read last, once the request's tensors are read: copying them across does not
    /// count against the run, as it does not in Redis's process).
    pub fn deadline(&mut self, now: std::time::Instant) -> Result<(std::time::Instant, std::time::Instant)> {
        let (limit, left) = (self.u64()?, self.u64()?);
        let deadline = now + std::time::Duration::from_micros(left);
        let start = deadline.checked_sub(std::time::Duration::from_micros(limit)).unwrap_or(now);
        Ok((start, deadline))
    }
    pub fn style(&mut self) -> Result<CallStyle> {
        Ok(match self.u8()? {
            0 => CallStyle::EntryPoint,
            1 => CallStyle::Positional { list_from: None },
            2 => CallStyle::Positional { list_from: Some(self.u64()? as usize) },
            _ => return Err(short()),
        })
    }
    pub fn error(&mut self) -> Result<Error> {
        let code = self.u8()?;
        let text = String::from_utf8_lossy(self.bytes()?).into_owned();
        let prefixed = self.u8()? != 0;
        Ok(match code {
            0 => Error::Parse { text, prefixed: false },
            1 => Error::Backend(text),
            2 => Error::Unavailable(text),
            3 => Error::Mismatch(text),
            4 => Error::Permission { text, prefixed },
            5 => Error::Refused { text, prefixed },
            6 => Error::TimedOut { text, prefixed },
            7 => Error::NotBuilt(text),
            8 => Error::NonTensorResult(text),
            9 => Error::Internal(text),
            _ => return Err(short()),
        })
    }
    /// The next byte, not consumed.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }
    /// A reply's status: `Ok(())` to read on, or the error it carries.
    pub fn status(&mut self) -> Result<()> {
        match self.u8()? {
            0 => Ok(()),
            _ => Err(self.error()?),
        }
    }
    #[cfg(test)]
    pub fn is_done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

pub fn backend_code(k: BackendKind) -> u8 {
    k.code() as u8
}

pub fn backend_from(code: u8) -> Result<BackendKind> {
    BackendKind::from_code(code as u64).ok_or_else(short)
}

fn dtype_code(t: DataType) -> u8 {
    DataType::ALL.iter().position(|d| *d == t).unwrap_or(0) as u8
}

fn dtype_from(code: u8) -> Result<DataType> {
    DataType::ALL.get(code as usize).copied().ok_or_else(short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_as_written() {
        let t = Tensor::from_blob(DataType::Float, [2, 2], &[0u8; 16]).unwrap();
        let s = Tensor::from_values(DataType::String, vec![2], &[b"ab", b""]).unwrap();
        let caller = Caller { db: 3, user: Some(std::sync::Arc::from(&b"alice"[..])), read_only: true };
        let mut buf = Vec::new();
        Writer(&mut buf)
            .u8(7)
            .u32(9)
            .u64(u64::MAX)
            .bytes(b"xyz")
            .strings(&["a", "bc"])
            .tensors(&[&t, &s])
            .caller(&caller)
            .caller(&Caller::default())
            .style(CallStyle::Positional { list_from: Some(2) })
            .error(&Error::TimedOut { text: "stopped".into(), prefixed: true })
            .error(&Error::InvalidShape);
        let mut r = Reader::new(&buf);
        assert_eq!((r.u8().unwrap(), r.u32().unwrap(), r.u64().unwrap()), (7, 9, u64::MAX));
        assert_eq!(r.bytes().unwrap(), b"xyz");
        assert_eq!(r.strings().unwrap(), ["a", "bc"]);
        assert_eq!(r.tensors().unwrap(), vec![t, s]);
        assert_eq!(r.caller().unwrap(), caller);
        assert_eq!(r.caller().unwrap(), Caller::default());
        assert_eq!(r.style().unwrap(), CallStyle::Positional { list_from: Some(2) });
        let e = r.error().unwrap();
        assert!(matches!(&e, Error::TimedOut { prefixed: true, .. }) && e.to_string() == "stopped");
        assert_eq!(r.error().unwrap().reply_text(), Error::InvalidShape.reply_text());
        assert!(r.is_done());
    }

    #[test]
    fn a_cut_or_corrupt_message_is_an_error_not_a_read_past_it() {
        let t = Tensor::from_blob(DataType::Int64, [3], &[1u8; 24]).unwrap();
        let mut buf = Vec::new();
        Writer(&mut buf).tensors(&[&t]).strings(&["name"]);
        for cut in 0..buf.len() {
            let mut r = Reader::new(&buf[..cut]);
            assert!(r.tensors().and_then(|_| r.strings()).is_err(), "cut at {cut}");
        }
        // A count far beyond the message, a length of 2^64 - 1, an unknown dtype.
        for bad in [
            &[0xff, 0xff, 0xff, 0xff][..],
            &[1, 0, 0, 0, 0, 1, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[1, 0, 0, 0, 99],
        ] {
            assert!(Reader::new(bad).tensors().is_err());
        }
    }
}
