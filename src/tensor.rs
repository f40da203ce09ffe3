//! Tensors: ten data types, a shape, row-major little-endian bytes. STRING tensors keep their elements
//! NUL-terminated back to back (RedisAI's layout, also what BLOB and the RDB carry) plus each element's offset.

use crate::error::{Error, Result, MAX_TENSOR_BYTES};

pub use crate::limits::MAX_DIMS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Float,
    Double,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Bool,
    String,
}

/// DLPack type codes, as RedisAI stores them in the RDB.
const DL_INT: u64 = 0;
const DL_UINT: u64 = 1;
const DL_FLOAT: u64 = 2;
const DL_BOOL: u64 = 6;
const DL_STRING: u64 = 7;

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::Float,
        DataType::Double,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Bool,
        DataType::String,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DataType::Float => "FLOAT",
            DataType::Double => "DOUBLE",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Bool => "BOOL",
            DataType::String => "STRING",
        }
    }

    /// Case-insensitive, as RedisAI's `strcasecmp`.
    pub fn parse(name: &[u8]) -> Result<DataType> {
        DataType::ALL.into_iter().find(|t| t.name().as_bytes().eq_ignore_ascii_case(name)).ok_or(Error::InvalidDataType)
    }

    /// Bytes per element; STRING elements have no fixed size (1 counts their NUL terminator).
    pub fn elem_size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Bool | DataType::String => 1,
            DataType::Int16 | DataType::Uint16 => 2,
            DataType::Float | DataType::Int32 => 4,
            DataType::Double | DataType::Int64 => 8,
        }
    }

    /// (DLPack code, bits) as written to the RDB.
    pub fn dlpack(self) -> (u64, u64) {
        let code = match self {
            DataType::Float | DataType::Double => DL_FLOAT,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => DL_INT,
            DataType::Uint8 | DataType::Uint16 => DL_UINT,
            DataType::Bool => DL_BOOL,
            DataType::String => DL_STRING,
        };
        (code, 8 * self.elem_size() as u64)
    }

    pub fn from_dlpack(code: u64, bits: u64) -> Option<DataType> {
        DataType::ALL.into_iter().find(|t| t.dlpack() == (code, bits))
    }

    fn is_signed_int(self) -> bool {
        matches!(self, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64)
    }
}

/// Number of elements of `shape`, refusing products that overflow or whose payload would pass the size limit.
/// Zero dimensions are allowed here (a backend may return an empty tensor); AI.TENSORSET refuses them itself.
pub fn element_count(dtype: DataType, shape: &[i64]) -> Result<usize> {
    // The RDB format (ours and RedisAI's loader) takes at most MAX_DIMS: a bigger rank would be unloadable.
    if shape.len() > MAX_DIMS {
        return Err(Error::TensorRankTooLarge);
    }
    let mut count: u64 = 1;
    for &d in shape {
        if d < 0 {
            return Err(Error::InvalidShape);
        }
        count = count.checked_mul(d as u64).ok_or(Error::TensorTooLarge)?;
    }
    match count.checked_mul(dtype.elem_size() as u64) {
        Some(bytes) if bytes <= MAX_TENSOR_BYTES => Ok(count as usize),
        _ => Err(Error::TensorTooLarge),
    }
}

/// A number written into a tensor element (the low-level API's setters).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    F64(f64),
    I64(i64),
}

/// One element as a client sees it in a VALUES reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Int(i64),
    Double(f64),
    Str(&'a [u8]),
}

/// A tensor in no allocation besides itself when it is small: a 4-float key is the `Arc`'s one block of 48 bytes
/// (a key of it costs 138 bytes of used_memory in all: RedisAI's C struct took ~218, three `Vec`s 243, a tensor with
/// its words boxed apart 186). The words hold,
/// in 64-bit words: the shape; for STRING the data's length in bytes and each element's offset; then the data,
/// padded with zeros to a whole word (so the data is 8-byte aligned for the backends).
#[derive(Clone)]
pub struct Tensor(Repr);

/// Type and rank, in every variant so that they share the enum tag's word (32 bytes in all; a unit test checks).
#[derive(Clone, Copy)]
struct Meta {
    dtype: DataType,
    ndims: u8,
    /// Words in use, inline.
    used: u8,
}

/// Words kept in the tensor itself.
const INLINE: usize = 3;

#[derive(Clone)]
enum Repr {
    Inline(Meta, [u64; INLINE]),
    Heap(Meta, Box<[u64]>),
    /// The data is bytes kept elsewhere (a big BLOB argument adopted from Redis); the words hold the rest.
    External(Meta, Box<[u64]>, Box<std::sync::Arc<dyn ExternalBytes>>),
}

/// Bytes owned elsewhere that a tensor uses as its data without copying them: the argument string of an
/// `AI.TENSORSET … BLOB`, which Redis keeps for us (copying it cost ~0.25 ms per MB on the main thread).
pub trait ExternalBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

/// BLOBs at least this long are adopted instead of copied; below it the copy is cheaper than keeping a string.
pub const ADOPT_FROM: usize = 64 * 1024;

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.dtype() == other.dtype()
            && self.shape() == other.shape()
            && self.offsets() == other.offsets()
            && self.data() == other.data()
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("data", &self.data())
            .field("offsets", &self.offsets())
            .finish()
    }
}

/// The words before the data: the shape, and for STRING the data's length and the offsets; room for `more`.
fn header_words(dtype: DataType, shape: &[i64], offsets: &[u64], data_len: usize, more: usize) -> Vec<u64> {
    let strings = if dtype == DataType::String { 1 + offsets.len() } else { 0 };
    let mut words = Vec::with_capacity(shape.len() + strings + more);
    words.extend(shape.iter().map(|&d| d as u64));
    if dtype == DataType::String {
        words.push(data_len as u64);
        words.extend_from_slice(offsets);
    }
    words
}

/// Packs bytes into native-endian words, zero-padding the last one (a plain copy: the byte view of the words
/// is `bytes` again).
fn pack(words: &mut Vec<u64>, bytes: &[u8]) {
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    words.extend(chunks.map(|c| u64::from_ne_bytes(arr(c))));
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        words.push(u64::from_ne_bytes(last));
    }
}

impl Tensor {
    /// Assembles a tensor whose shape, offsets and data were checked by the caller.
    fn assemble(dtype: DataType, shape: &[i64], offsets: &[u64], parts: &[&[u8]]) -> Tensor {
        let data_len: usize = parts.iter().map(|p| p.len()).sum();
        let mut words = header_words(dtype, shape, offsets, data_len, data_len.div_ceil(8));
        match parts {
            [one] => pack(&mut words, one),
            _ => pack(&mut words, &parts.concat()),
        }
        Tensor::from_words(dtype, shape.len(), words)
    }

    fn from_words(dtype: DataType, ndims: usize, words: Vec<u64>) -> Tensor {
        let mut meta = Meta { dtype, ndims: ndims as u8, used: words.len() as u8 };
        if words.len() <= INLINE {
            let mut w = [0u64; INLINE];
            w[..words.len()].copy_from_slice(&words);
            return Tensor(Repr::Inline(meta, w));
        }
        meta.used = 0;
        Tensor(Repr::Heap(meta, words.into_boxed_slice()))
    }

    fn meta(&self) -> Meta {
        match &self.0 {
            Repr::Inline(m, _) | Repr::Heap(m, _) | Repr::External(m, _, _) => *m,
        }
    }

    fn words(&self) -> &[u64] {
        match &self.0 {
            Repr::Inline(m, w) => &w[..m.used as usize],
            Repr::Heap(_, w) | Repr::External(_, w, _) => w,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match &mut self.0 {
            Repr::Inline(m, w) => &mut w[..m.used as usize],
            Repr::Heap(_, w) | Repr::External(_, w, _) => w,
        }
    }

    fn ndims(&self) -> usize {
        self.meta().ndims as usize
    }

    /// Words before the data.
    fn header(&self) -> usize {
        self.ndims() + if self.dtype() == DataType::String { 1 + self.len() } else { 0 }
    }

    /// A tensor of zeros (STRING: empty strings).
    pub fn zeros(dtype: DataType, shape: Vec<i64>) -> Result<Tensor> {
        let n = element_count(dtype, &shape)?;
        if dtype == DataType::String {
            let offsets: Vec<u64> = (0..n as u64).collect();
            return Ok(Tensor::assemble(dtype, &shape, &offsets, &[&vec![0; n]]));
        }
        let mut words = vec![0u64; shape.len() + (n * dtype.elem_size()).div_ceil(8)];
        for (w, &d) in words.iter_mut().zip(&shape) {
            *w = d as u64;
        }
        Ok(Tensor::from_words(dtype, shape.len(), words))
    }

    /// The STRING offsets of a BLOB, after RedisAI's checks of its length (and BOOL values).
    fn check_blob(dtype: DataType, shape: &[i64], blob: &[u8]) -> Result<Vec<u64>> {
        let n = element_count(dtype, shape)?;
        match dtype {
            DataType::String => string_offsets(blob, n),
            _ if blob.len() != n * dtype.elem_size() => Err(Error::DataLength),
            DataType::Bool if blob.iter().any(|&b| b > 1) => Err(Error::BoolValue),
            _ => Ok(Vec::new()),
        }
    }

    /// From raw bytes as sent after BLOB (or stored in the RDB).
    pub fn from_blob(dtype: DataType, shape: impl AsRef<[i64]>, blob: &[u8]) -> Result<Tensor> {
        let shape = shape.as_ref();
        let offsets = Tensor::check_blob(dtype, shape, blob)?;
        Ok(Tensor::assemble(dtype, shape, &offsets, &[blob]))
    }

    /// Like `from_blob`, keeping `blob`'s bytes where they are instead of copying them.
    pub fn from_external(dtype: DataType, shape: Vec<i64>, blob: std::sync::Arc<dyn ExternalBytes>) -> Result<Tensor> {
        let offsets = Tensor::check_blob(dtype, &shape, blob.bytes())?;
        let words = header_words(dtype, &shape, &offsets, blob.bytes().len(), 0);
        let meta = Meta { dtype, ndims: shape.len() as u8, used: 0 };
        Ok(Tensor(Repr::External(meta, words.into_boxed_slice(), Box::new(blob))))
    }

    /// From the arguments after VALUES.
    pub fn from_values(dtype: DataType, shape: Vec<i64>, values: &[&[u8]]) -> Result<Tensor> {
        let n = element_count(dtype, &shape)?;
        if values.len() != n {
            return Err(Error::ValuesCount);
        }
        let mut data = Vec::with_capacity(n * dtype.elem_size());
        let mut offsets = Vec::new();
        for v in values {
            match dtype {
                DataType::Float => data.extend_from_slice(&(parse_double(v)? as f32).to_le_bytes()),
                DataType::Double => data.extend_from_slice(&parse_double(v)?.to_le_bytes()),
                DataType::String => {
                    let s = v.strip_suffix(b"\0").unwrap_or(v);
                    if s.contains(&0) {
                        return Err(Error::NulInString);
                    }
                    std::str::from_utf8(s).map_err(|_| Error::StringUtf8)?;
                    offsets.push(data.len() as u64);
                    data.extend_from_slice(s);
                    data.push(0);
                }
                _ => {
                    let x = parse_int_in_range(dtype, v)?;
                    data.extend_from_slice(&x.to_le_bytes()[..dtype.elem_size()]);
                }
            }
        }
        Ok(Tensor::assemble(dtype, &shape, &offsets, &[&data]))
    }

    /// From a decoded RDB payload: the same checks as a client's BLOB, plus the stored offsets must agree.
    pub fn from_stored(dtype: DataType, shape: Vec<i64>, data: Vec<u8>, offsets: Option<Vec<u64>>) -> Result<Tensor> {
        let t = Tensor::from_blob(dtype, shape, &data)?;
        match offsets {
            Some(o) if o != t.offsets() => Err(Error::StringElements),
            _ => Ok(t),
        }
    }

    pub fn dtype(&self) -> DataType {
        self.meta().dtype
    }
    pub fn shape(&self) -> &[i64] {
        bytemuck::cast_slice(&self.words()[..self.ndims()])
    }
    /// The BLOB form: raw elements, or NUL-terminated strings back to back.
    pub fn data(&self) -> &[u8] {
        if let Repr::External(_, _, e) = &self.0 {
            return e.bytes();
        }
        let len = if self.dtype() == DataType::String {
            self.words()[self.ndims()] as usize
        } else {
            self.len() * self.dtype().elem_size()
        };
        &bytemuck::cast_slice::<u64, u8>(&self.words()[self.header()..])[..len]
    }
    pub fn offsets(&self) -> &[u64] {
        if self.dtype() == DataType::String {
            &self.words()[self.ndims() + 1..self.header()]
        } else {
            &[]
        }
    }
    pub fn len(&self) -> usize {
        self.shape().iter().product::<i64>() as usize
    }
    /// Size of dimension 0 (1 for a scalar): the batch size RedisAI counts in its stats.
    pub fn dim0(&self) -> i64 {
        self.shape().first().copied().unwrap_or(1)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Joins tensors along dimension 0 (auto-batching). All must share the dtype and the other dimensions.
    pub fn concat(parts: &[&Tensor]) -> Result<Tensor> {
        let first = parts.first().ok_or_else(|| Error::Internal("Nothing to run".into()))?;
        let mismatch = || Error::Mismatch("cannot batch tensors of different types or shapes".into());
        if first.shape().is_empty()
            || parts.iter().any(|t| t.dtype() != first.dtype() || t.shape().get(1..) != first.shape().get(1..))
        {
            return Err(mismatch());
        }
        let mut shape = first.shape().to_vec();
        shape[0] = parts.iter().map(|t| t.shape()[0]).sum();
        let mut offsets = Vec::new();
        let mut base = 0u64;
        for t in parts {
            offsets.extend(t.offsets().iter().map(|o| o + base));
            base += t.data().len() as u64;
        }
        let data: Vec<&[u8]> = parts.iter().map(|t| t.data()).collect();
        Ok(Tensor::assemble(first.dtype(), &shape, &offsets, &data))
    }

    /// Rows `start..start + rows` of dimension 0 (splitting a batched output back per request).
    pub fn slice_dim0(&self, start: usize, rows: usize) -> Result<Tensor> {
        let total = self.dim0().max(0) as usize;
        if self.shape().is_empty() || start + rows > total {
            return Err(Error::Mismatch("Model did not generate the expected batch size".into()));
        }
        let mut shape = self.shape().to_vec();
        shape[0] = rows as i64;
        let per_row = self.len().checked_div(total).unwrap_or(0);
        let data = self.data();
        if self.dtype() == DataType::String {
            let offsets = self.offsets();
            let (first, end) = (start * per_row, (start + rows) * per_row);
            let from = offsets.get(first).map_or(data.len(), |&o| o as usize);
            let to = offsets.get(end).map_or(data.len(), |&o| o as usize);
            let offsets: Vec<u64> = offsets[first..end].iter().map(|o| o - from as u64).collect();
            return Ok(Tensor::assemble(self.dtype(), &shape, &offsets, &[&data[from..to]]));
        }
        let row_bytes = per_row * self.dtype().elem_size();
        Ok(Tensor::assemble(self.dtype(), &shape, &[], &[&data[start * row_bytes..(start + rows) * row_bytes]]))
    }

    /// The data, writable (the low-level API's `RedisAI_TensorData` on a tensor nobody else holds). Adopted
    /// bytes are copied in first.
    pub fn data_mut(&mut self) -> &mut [u8] {
        if let Repr::External(..) = self.0 {
            let owned = Tensor::assemble(self.dtype(), self.shape(), self.offsets(), &[self.data()]);
            *self = owned;
        }
        let len = self.data().len();
        let header = self.header();
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words_mut()[header..])[..len]
    }

    /// Replaces the data with `blob`, checked as a BLOB of this tensor's type and shape.
    pub fn set_data(&mut self, blob: &[u8]) -> Result<()> {
        *self = Tensor::from_blob(self.dtype(), self.shape(), blob)?;
        Ok(())
    }

    /// Element `i` as a double (not for STRING).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        match (i < self.len()).then(|| self.value_at(i))? {
            Value::Double(d) => Some(d),
            Value::Int(n) => Some(n as f64),
            Value::Str(_) => None,
        }
    }

    /// Element `i` as an integer (not for STRING; a floating value is truncated, as a C cast does).
    pub fn get_i64(&self, i: usize) -> Option<i64> {
        match (i < self.len()).then(|| self.value_at(i))? {
            Value::Double(d) => Some(d as i64),
            Value::Int(n) => Some(n),
            Value::Str(_) => None,
        }
    }

    /// Sets element `i`, converted to the tensor's type as a C cast would (a BOOL takes 0 or 1 only).
    pub fn set_number(&mut self, i: usize, v: Number) -> Result<()> {
        if i >= self.len() || self.dtype() == DataType::String {
            return Err(Error::InvalidValue);
        }
        let (f, n) = match v {
            Number::F64(f) => (f, f as i64),
            Number::I64(n) => (n as f64, n),
        };
        let mut b = [0u8; 8];
        let bytes: &[u8] = match self.dtype() {
            DataType::Float => {
                b[..4].copy_from_slice(&(f as f32).to_le_bytes());
                &b[..4]
            }
            DataType::Double => {
                b = f.to_le_bytes();
                &b[..]
            }
            DataType::Bool if !(0..=1).contains(&n) => return Err(Error::BoolValue),
            t => {
                b = n.to_le_bytes();
                &b[..t.elem_size()]
            }
        };
        let size = bytes.len();
        self.data_mut()[i * size..(i + 1) * size].copy_from_slice(bytes);
        Ok(())
    }

    /// Heap bytes held, for MEMORY USAGE.
    pub fn mem_usage(&self) -> usize {
        std::mem::size_of::<Tensor>()
            + match &self.0 {
                Repr::Inline(..) => 0,
                Repr::Heap(_, w) => std::mem::size_of_val(&**w),
                Repr::External(_, w, e) => std::mem::size_of_val(&**w) + e.bytes().len(),
            }
    }

    /// Element `i` of a STRING tensor, without its NUL.
    pub fn string_at(&self, i: usize) -> &[u8] {
        let (offsets, data) = (self.offsets(), self.data());
        let start = offsets[i] as usize;
        let end = offsets.get(i + 1).map_or(data.len(), |&o| o as usize) - 1;
        &data[start..end]
    }

    /// Every element, as the VALUES reply gives it.
    pub fn values(&self) -> impl Iterator<Item = Value<'_>> + '_ {
        (0..self.len()).map(|i| self.value_at(i))
    }

    /// Element `i` (< `len()`).
    fn value_at(&self, i: usize) -> Value<'_> {
        let n = self.dtype().elem_size();
        let d = &self.data()[i * n..];
        match self.dtype() {
            DataType::String => Value::Str(self.string_at(i)),
            DataType::Float => Value::Double(f32::from_le_bytes(arr(&d[..4])) as f64),
            DataType::Double => Value::Double(f64::from_le_bytes(arr(&d[..8]))),
            DataType::Int8 => Value::Int(d[0] as i8 as i64),
            DataType::Uint8 | DataType::Bool => Value::Int(d[0] as i64),
            DataType::Int16 => Value::Int(i16::from_le_bytes(arr(&d[..2])) as i64),
            DataType::Uint16 => Value::Int(u16::from_le_bytes(arr(&d[..2])) as i64),
            DataType::Int32 => Value::Int(i32::from_le_bytes(arr(&d[..4])) as i64),
            DataType::Int64 => Value::Int(i64::from_le_bytes(arr(&d[..8]))),
        }
    }
}

fn arr<const N: usize>(c: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(c);
    a
}

/// Offsets of the `n` NUL-terminated UTF-8 elements that must make up `blob` exactly.
fn string_offsets(blob: &[u8], n: usize) -> Result<Vec<u64>> {
    if blob.last().is_some_and(|&b| b != 0) || blob.iter().filter(|&&b| b == 0).count() != n {
        return Err(Error::StringElements);
    }
    let mut offsets = Vec::with_capacity(n);
    let mut start = 0;
    for elem in blob.split_inclusive(|&b| b == 0) {
        std::str::from_utf8(&elem[..elem.len() - 1]).map_err(|_| Error::StringUtf8)?;
        offsets.push(start as u64);
        start += elem.len();
    }
    Ok(offsets)
}

/// Redis's `string2ll`: optional '-', no '+', no spaces, no leading zeros, fits in i64.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    if s == b"0" {
        return Some(0);
    }
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mag: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    if neg {
        0i64.checked_sub_unsigned(mag)
    } else {
        i64::try_from(mag).ok()
    }
}

/// Redis's `getDoubleFromObject`: no spaces, no trailing garbage, no NaN, no overflow to infinity.
pub fn parse_double(s: &[u8]) -> Result<f64> {
    let text = std::str::from_utf8(s).map_err(|_| Error::InvalidValue)?;
    let v: f64 = text.parse().map_err(|_| Error::InvalidValue)?;
    let literal_inf = text.trim_start_matches(['+', '-']).to_ascii_lowercase().starts_with("inf");
    if v.is_nan() || (v.is_infinite() && !literal_inf) {
        return Err(Error::InvalidValue);
    }
    Ok(v)
}

/// An integer element, range-checked for its type. Negative values are accepted for signed types
/// (RedisAI rejected them all by a bug in its range check).
fn parse_int_in_range(dtype: DataType, s: &[u8]) -> Result<i64> {
    let v = parse_i64(s).ok_or(Error::InvalidValue)?;
    let bits = 8 * dtype.elem_size() as u32;
    let ok = match dtype {
        DataType::Bool => v == 0 || v == 1,
        _ if dtype.is_signed_int() => bits == 64 || (v >= -(1i64 << (bits - 1)) && v < (1i64 << (bits - 1))),
        _ => v >= 0 && v < (1i64 << bits),
    };
    if ok {
        Ok(v)
    } else {
        Err(Error::InvalidValue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_tensor_is_one_block_of_48_bytes_in_its_arc() {
        assert_eq!(std::mem::size_of::<Tensor>(), 32);
        let t = Tensor::from_values(DataType::Float, vec![4], &[b"1", b"2", b"3", b"4"]).unwrap();
        assert!(matches!(t.0, Repr::Inline(..)));
        assert_eq!(t.data(), bytemuck::cast_slice::<f32, u8>(&[1.0, 2.0, 3.0, 4.0]));
        let big = Tensor::zeros(DataType::Float, vec![2, 2]).unwrap();
        assert!(matches!(big.0, Repr::Heap(..)));
        assert_eq!((big.shape(), big.data().len()), (&[2i64, 2][..], 16));
        let s = Tensor::from_values(DataType::String, vec![1], &[b"a"]).unwrap();
        assert_eq!((s.offsets(), s.string_at(0)), (&[0u64][..], &b"a"[..]));
    }

    #[test]
    fn elements_set_and_read_as_numbers() {
        let mut t = Tensor::zeros(DataType::Float, vec![2, 2]).unwrap();
        t.set_number(1, Number::F64(2.5)).unwrap();
        t.set_number(2, Number::I64(-3)).unwrap();
        assert_eq!(t.get_f64(1), Some(2.5));
        assert_eq!(t.get_i64(2), Some(-3));
        assert_eq!(t.get_f64(4), None);
        assert!(t.set_number(4, Number::F64(1.0)).is_err());
        let mut b = Tensor::zeros(DataType::Bool, vec![2]).unwrap();
        assert!(b.set_number(0, Number::I64(2)).is_err());
        b.set_number(0, Number::I64(1)).unwrap();
        assert_eq!(b.data(), &[1, 0]);
        let mut i8t = Tensor::zeros(DataType::Int8, vec![1]).unwrap();
        i8t.set_number(0, Number::I64(-2)).unwrap();
        assert_eq!(i8t.get_i64(0), Some(-2));
        let s = Tensor::zeros(DataType::String, vec![1]).unwrap();
        assert_eq!(s.get_f64(0), None);
    }

    #[test]
    fn data_is_replaced_only_by_a_valid_blob() {
        let mut t = Tensor::zeros(DataType::Bool, vec![2]).unwrap();
        assert!(t.set_data(&[2, 0]).is_err());
        assert!(t.set_data(&[1]).is_err());
        t.set_data(&[1, 1]).unwrap();
        assert_eq!(t.data(), &[1, 1]);
        t.data_mut()[0] = 0;
        assert_eq!(t.data(), &[0, 1]);
        let mut s = Tensor::zeros(DataType::String, vec![2]).unwrap();
        assert!(s.set_data(b"one\0").is_err());
        s.set_data(b"one\0two\0").unwrap();
        assert_eq!(s.string_at(1), b"two");
    }

    fn vals(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }
    fn from_values(dtype: DataType, shape: Vec<i64>, v: &[&str]) -> Result<Tensor> {
        let owned = vals(v);
        let refs: Vec<&[u8]> = owned.iter().map(|x| x.as_slice()).collect();
        Tensor::from_values(dtype, shape, &refs)
    }

    #[test]
    fn dtype_names_and_dlpack_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::parse(t.name().to_lowercase().as_bytes()), Ok(t));
            let (c, b) = t.dlpack();
            assert_eq!(DataType::from_dlpack(c, b), Some(t));
        }
        assert_eq!(DataType::parse(b"UINT32"), Err(Error::InvalidDataType));
        assert_eq!(DataType::Bool.dlpack(), (6, 8));
        assert_eq!(DataType::String.dlpack(), (7, 8));
    }

    #[test]
    fn string2ll_semantics() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        for bad in [&b"9223372036854775808"[..], b"01", b"-0", b"+1", b" 1", b"1.0", b"", b"-", b"1e3"] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn doubles() {
        assert_eq!(parse_double(b"1.5"), Ok(1.5));
        assert_eq!(parse_double(b"-inf"), Ok(f64::NEG_INFINITY));
        for bad in [&b"nan"[..], b"1e999", b"abc", b" 1", b"1 ", b""] {
            assert_eq!(parse_double(bad), Err(Error::InvalidValue), "{bad:?}");
        }
    }

    #[test]
    fn values_all_types_with_ranges() {
        let t = from_values(DataType::Int8, vec![2], &["-128", "127"]).unwrap();
        assert_eq!(t.values().collect::<Vec<_>>(), vec![Value::Int(-128), Value::Int(127)]);
        assert_eq!(from_values(DataType::Int8, vec![1], &["128"]), Err(Error::InvalidValue));
        assert_eq!(from_values(DataType::Int8, vec![1], &["-129"]), Err(Error::InvalidValue));
        assert_eq!(from_values(DataType::Uint8, vec![1], &["-1"]), Err(Error::InvalidValue));
        assert_eq!(
            from_values(DataType::Uint16, vec![1], &["65535"]).unwrap().values().collect::<Vec<_>>(),
            vec![Value::Int(65535)]
        );
        assert_eq!(from_values(DataType::Int64, vec![1], &["-5"]).unwrap().data(), &(-5i64).to_le_bytes());
        assert_eq!(from_values(DataType::Bool, vec![1], &["2"]), Err(Error::InvalidValue));
        assert_eq!(from_values(DataType::Int32, vec![1], &["1.87"]), Err(Error::InvalidValue));
        let f = from_values(DataType::Float, vec![2], &["1.5", "-2"]).unwrap();
        assert_eq!(f.values().collect::<Vec<_>>(), vec![Value::Double(1.5), Value::Double(-2.0)]);
        assert_eq!(from_values(DataType::Float, vec![3], &["1", "2"]), Err(Error::ValuesCount));
    }

    #[test]
    fn strings() {
        let t = from_values(DataType::String, vec![3], &["a", "", "bc\0"]).unwrap();
        assert_eq!(t.data(), b"a\0\0bc\0");
        assert_eq!(t.offsets(), &[0, 2, 3]);
        assert_eq!(t.values().collect::<Vec<_>>(), vec![Value::Str(b"a"), Value::Str(b""), Value::Str(b"bc")]);
        assert_eq!(Tensor::from_blob(DataType::String, vec![3], b"a\0\0bc\0").unwrap(), t);
        assert_eq!(from_values(DataType::String, vec![1], &["a\0b"]), Err(Error::NulInString));
        assert_eq!(Tensor::from_blob(DataType::String, vec![2], b"a\0b"), Err(Error::StringElements));
        assert_eq!(Tensor::from_blob(DataType::String, vec![1], b"a\0b\0"), Err(Error::StringElements));
        assert_eq!(Tensor::from_blob(DataType::String, vec![1], b"\xff\0"), Err(Error::StringUtf8));
        let owned = [b"\xc3".to_vec()];
        let refs: Vec<&[u8]> = owned.iter().map(|x| x.as_slice()).collect();
        assert_eq!(Tensor::from_values(DataType::String, vec![1], &refs), Err(Error::StringUtf8));
        let z = Tensor::zeros(DataType::String, vec![2]).unwrap();
        assert_eq!(z.values().collect::<Vec<_>>(), vec![Value::Str(b""), Value::Str(b"")]);
    }

    #[test]
    fn concat_and_slice_on_dim0() {
        let a = from_values(DataType::Int32, vec![1, 2], &["1", "2"]).unwrap();
        let b = from_values(DataType::Int32, vec![2, 2], &["3", "4", "5", "6"]).unwrap();
        let c = Tensor::concat(&[&a, &b]).unwrap();
        assert_eq!(c.shape(), &[3, 2]);
        assert_eq!(c.slice_dim0(0, 1).unwrap(), a);
        assert_eq!(c.slice_dim0(1, 2).unwrap(), b);
        assert!(c.slice_dim0(2, 2).is_err());
        let x = from_values(DataType::Int32, vec![1, 3], &["1", "2", "3"]).unwrap();
        assert!(Tensor::concat(&[&a, &x]).is_err());
        let s1 = from_values(DataType::String, vec![2], &["a", "bc"]).unwrap();
        let s2 = from_values(DataType::String, vec![1], &[""]).unwrap();
        let s = Tensor::concat(&[&s1, &s2]).unwrap();
        assert_eq!(s.values().collect::<Vec<_>>(), vec![Value::Str(b"a"), Value::Str(b"bc"), Value::Str(b"")]);
        assert_eq!(s.slice_dim0(1, 2).unwrap().values().collect::<Vec<_>>(), vec![Value::Str(b"bc"), Value::Str(b"")]);
        assert_eq!(s.slice_dim0(0, 2).unwrap(), s1);
    }

    #[test]
    fn blobs_and_limits() {
        assert_eq!(Tensor::from_blob(DataType::Float, vec![2], &[0; 7]), Err(Error::DataLength));
        assert_eq!(Tensor::from_blob(DataType::Bool, vec![2], &[0, 2]), Err(Error::BoolValue));
        assert_eq!(Tensor::zeros(DataType::Float, vec![-1]), Err(Error::InvalidShape));
        assert!(Tensor::zeros(DataType::Float, vec![0, 3]).unwrap().is_empty());
        assert_eq!(Tensor::zeros(DataType::Float, vec![100_000_000; 3]), Err(Error::TensorTooLarge));
        assert_eq!(Tensor::zeros(DataType::Int8, vec![1 << 32, 1 << 32]), Err(Error::TensorTooLarge));
        assert_eq!(element_count(DataType::Int8, &[1 << 32]), Ok(1 << 32));
        assert_eq!(element_count(DataType::Int16, &[1 << 32]), Err(Error::TensorTooLarge));
        let scalar = Tensor::zeros(DataType::Double, vec![]).unwrap();
        assert_eq!(scalar.len(), 1);
        assert_eq!(scalar.data().len(), 8);
    }
}
