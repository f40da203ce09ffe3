//! RDB payloads of the module's data types, in RedisAI's layouts (encoding version 4; 0–3 for loading).
//! Pure Rust over two small traits, so the Redis side only supplies the primitive reads and writes.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::model::{BackendKind, BatchOpts, ModelSpec};
use crate::script::ScriptSpec;
use crate::tensor::{DataType, Tensor, MAX_DIMS};

/// The encoding version written today (RedisAI 1.2.5+).
pub const ENCVER: i32 = 4;

pub trait RdbRead {
    fn read_unsigned(&mut self) -> Result<u64>;
    /// Redis stores signed values as the same bits through the unsigned opcode.
    fn read_signed(&mut self) -> Result<i64> {
        Ok(self.read_unsigned()? as i64)
    }
    fn read_buffer(&mut self) -> Result<Vec<u8>>;
    /// Appends the next buffer to `out` (the Redis side copies straight from its buffer: a model's chunks are
    /// hundreds of MB).
    fn read_buffer_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&self.read_buffer()?);
        Ok(())
    }
}

pub trait RdbWrite {
    fn write_unsigned(&mut self, v: u64);
    fn write_signed(&mut self, v: i64) {
        self.write_unsigned(v as u64)
    }
    fn write_buffer(&mut self, b: &[u8]);
}

fn bad(why: impl Into<String>) -> Error {
    Error::rdb("tensor", why)
}

fn read_dims(r: &mut impl RdbRead, signed: bool) -> Result<Vec<i64>> {
    let ndim = if signed { r.read_signed()? } else { r.read_unsigned()? as i64 };
    if !(0..=MAX_DIMS as i64).contains(&ndim) {
        return Err(bad(format!("{ndim} dimensions")));
    }
    (0..ndim).map(|_| if signed { r.read_signed() } else { r.read_unsigned().map(|d| d as i64) }).collect()
}

pub fn save_tensor(t: &Tensor, w: &mut impl RdbWrite) {
    let (code, bits) = t.dtype().dlpack();
    w.write_unsigned(code);
    w.write_unsigned(bits);
    w.write_signed(t.shape().len() as i64);
    for &d in t.shape() {
        w.write_signed(d);
    }
    w.write_buffer(t.data());
    if t.dtype() == DataType::String {
        for &o in t.offsets() {
            w.write_unsigned(o);
        }
    }
}

pub fn load_tensor(r: &mut impl RdbRead, encver: i32) -> Result<Tensor> {
    match encver {
        4 => {
            let code = r.read_unsigned()?;
            let bits = r.read_unsigned()?;
            let dtype =
                DataType::from_dlpack(code, bits).ok_or_else(|| bad(format!("dtype code {code} bits {bits}")))?;
            let shape = read_dims(r, true)?;
            let data = r.read_buffer()?;
            let offsets = if dtype == DataType::String {
                // Validate the data first: it bounds how many offsets we are willing to read.
                let n = Tensor::from_blob(dtype, shape.clone(), &data).map_err(|e| bad(e.to_string()))?.len();
                Some((0..n).map(|_| r.read_unsigned()).collect::<Result<Vec<u64>>>()?)
            } else {
                None
            };
            Tensor::from_stored(dtype, shape, data, offsets).map_err(|e| bad(e.to_string()))
        }
        0..=3 => {
            let _device_type = r.read_unsigned()?;
            let _device_id = r.read_unsigned()?;
            let bits = r.read_unsigned()?;
            let code = r.read_unsigned()?;
            let _lanes = r.read_unsigned()?;
            let dtype = DataType::from_dlpack(code, bits)
                .filter(|t| !matches!(t, DataType::String | DataType::Bool))
                .ok_or_else(|| bad(format!("dtype code {code} bits {bits}")))?;
            let shape = read_dims(r, false)?;
            for _ in 0..shape.len() {
                let _stride = r.read_unsigned()?;
            }
            let _byte_offset = r.read_unsigned()?;
            let data = r.read_buffer()?;
            Tensor::from_stored(dtype, shape, data, None).map_err(|e| bad(e.to_string()))
        }
        v => Err(bad(format!("encoding version {v} is newer than this module supports ({ENCVER})"))),
    }
}

/// A C string as RedisAI saved names and devices: the bytes up to a trailing NUL.
fn c_string(b: Vec<u8>) -> Result<String> {
    let s = b.strip_suffix(b"\0").unwrap_or(&b);
    String::from_utf8(s.to_vec()).map_err(|_| Error::rdb("model", "name is not UTF-8"))
}

fn with_nul(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn read_names(r: &mut impl RdbRead) -> Result<Vec<String>> {
    let n = r.read_unsigned()?;
    // No preallocation: a corrupt count fails at the end of the payload instead of allocating.
    let mut names = Vec::new();
    for _ in 0..n {
        names.push(c_string(r.read_buffer()?)?);
    }
    Ok(names)
}

/// Model payload: RedisAI's v4 layout with the blob in chunks of at most `chunk` bytes.
pub fn save_model(m: &ModelSpec, chunk: usize, w: &mut impl RdbWrite) {
    w.write_unsigned(m.backend.code());
    w.write_buffer(&with_nul(&m.device.name));
    w.write_buffer(&m.tag);
    w.write_unsigned(m.batch.size);
    w.write_unsigned(m.batch.min_size);
    w.write_unsigned(m.batch.min_timeout_ms);
    for names in [&m.inputs, &m.outputs] {
        w.write_unsigned(names.len() as u64);
        for n in names {
            w.write_buffer(&with_nul(n));
        }
    }
    let chunk = chunk.max(1);
    let n_chunks = m.blob.len() / chunk + 1;
    w.write_unsigned(m.blob.len() as u64);
    w.write_unsigned(n_chunks as u64);
    for i in 0..n_chunks {
        w.write_buffer(&m.blob[(i * chunk).min(m.blob.len())..((i + 1) * chunk).min(m.blob.len())]);
    }
}

pub fn load_model(r: &mut impl RdbRead, encver: i32) -> Result<ModelSpec> {
    let bad = |why: String| Error::rdb("model", why);
    if !(0..=ENCVER).contains(&encver) {
        return Err(bad(format!("encoding version {encver} is newer than this module supports ({ENCVER})")));
    }
    let code = r.read_unsigned()?;
    let backend = BackendKind::from_code(code).ok_or_else(|| bad(format!("backend {code}")))?;
    let device_name = c_string(r.read_buffer()?)?;
    let device = Device::parse(device_name.as_bytes()).map_err(|_| bad(format!("device {device_name}")))?;
    let tag = r.read_buffer()?;
    let tag = if encver == 0 { tag.strip_suffix(b"\0").unwrap_or(&tag).to_vec() } else { tag };
    let size = r.read_unsigned()?;
    let min_size = r.read_unsigned()?;
    let min_timeout_ms = if encver >= 2 { r.read_unsigned()? } else { 0 };
    let inputs = read_names(r)?;
    let outputs = read_names(r)?;
    let blob = if encver == 0 {
        r.read_buffer()?
    } else {
        let total = r.read_unsigned()?;
        let n_chunks = r.read_unsigned()?;
        let mut blob = Vec::new();
        for _ in 0..n_chunks {
            r.read_buffer_into(&mut blob)?;
            if blob.len() as u64 > total {
                return Err(bad("chunks longer than the declared length".into()));
            }
        }
        if blob.len() as u64 != total {
            return Err(bad(format!("blob of {} bytes, {total} declared", blob.len())));
        }
        blob
    };
    Ok(ModelSpec {
        backend,
        device,
        tag,
        batch: BatchOpts { size, min_size, min_timeout_ms },
        inputs,
        outputs,
        blob: blob.into(),
    })
}

pub fn save_script(s: &ScriptSpec, w: &mut impl RdbWrite) {
    w.write_buffer(&with_nul(&s.device_name));
    w.write_buffer(&s.tag);
    w.write_buffer(&with_nul(&s.source));
    w.write_unsigned(s.entry_points.len() as u64);
    for e in &s.entry_points {
        w.write_buffer(&with_nul(e));
    }
}

/// Script payload: v3/v4 carry entry points; v0–v2 do not (and v0 saved the tag as a C string).
pub fn load_script(r: &mut impl RdbRead, encver: i32) -> Result<ScriptSpec> {
    if !(0..=ENCVER).contains(&encver) {
        return Err(Error::rdb(
            "script",
            format!("encoding version {encver} is newer than this module supports ({ENCVER})"),
        ));
    }
    let device_name = c_string(r.read_buffer()?)?;
    let tag = r.read_buffer()?;
    let tag = if encver == 0 { tag.strip_suffix(b"\0").unwrap_or(&tag).to_vec() } else { tag };
    let source = c_string(r.read_buffer()?)?;
    let entry_points = if encver >= 3 { read_names(r)? } else { Vec::new() };
    Ok(ScriptSpec { device_name, tag, source, entry_points })
}

/// An in-memory stream of RDB primitives, for tests and fuzzing.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MemRdb {
    pub items: Vec<MemItem>,
    pos: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MemItem {
    Unsigned(u64),
    Buffer(Vec<u8>),
}

impl MemRdb {
    pub fn new(items: Vec<MemItem>) -> Self {
        MemRdb { items, pos: 0 }
    }
    fn next(&mut self) -> Result<MemItem> {
        let item = self.items.get(self.pos).cloned().ok_or_else(|| bad("unexpected end of payload"))?;
        self.pos += 1;
        Ok(item)
    }
}

impl RdbRead for MemRdb {
    fn read_unsigned(&mut self) -> Result<u64> {
        match self.next()? {
            MemItem::Unsigned(v) => Ok(v),
            MemItem::Buffer(_) => Err(bad("expected an integer, found a string")),
        }
    }
    fn read_buffer(&mut self) -> Result<Vec<u8>> {
        match self.next()? {
            MemItem::Buffer(b) => Ok(b),
            MemItem::Unsigned(_) => Err(bad("expected a string, found an integer")),
        }
    }
}

impl RdbWrite for MemRdb {
    fn write_unsigned(&mut self, v: u64) {
        self.items.push(MemItem::Unsigned(v));
    }
    fn write_buffer(&mut self, b: &[u8]) {
        self.items.push(MemItem::Buffer(b.to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemItem::*;

    /// Reads the module opcodes of a `DUMP` payload (type 7 = module, id, then UINT=2 / STRING=5 ... EOF=0).
    fn dump_items(hex: &str) -> (i32, MemRdb) {
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let mut p = 1; // type byte
        fn len(b: &[u8], p: &mut usize) -> u64 {
            let first = b[*p];
            *p += 1;
            match first >> 6 {
                0 => (first & 0x3f) as u64,
                1 => {
                    *p += 1;
                    (((first & 0x3f) as u64) << 8) | b[*p - 1] as u64
                }
                _ => {
                    let n = if first == 0x80 { 4 } else { 8 };
                    let v = b[*p..*p + n].iter().fold(0u64, |a, &x| (a << 8) | x as u64);
                    *p += n;
                    v
                }
            }
        }
        let module_id = len(&bytes, &mut p);
        let encver = (module_id & 1023) as i32;
        let mut items = Vec::new();
        loop {
            match len(&bytes, &mut p) {
                0 => break,
                2 => items.push(Unsigned(len(&bytes, &mut p))),
                5 => {
                    let n = len(&bytes, &mut p) as usize;
                    items.push(Buffer(bytes[p..p + n].to_vec()));
                    p += n;
                }
                op => panic!("opcode {op}"),
            }
        }
        (encver, MemRdb::new(items))
    }

    #[test]
    fn reads_payloads_recorded_from_redisai() {
        let (v, mut r) = dump_items("0781008fd310d48e4404020602080202020202030506000100000001000a00507f96ce2b9aa4bc");
        let t = load_tensor(&mut r, v).unwrap();
        assert_eq!((t.dtype(), t.shape(), t.data()), (DataType::Bool, &[2i64, 3][..], &[0u8, 1, 0, 0, 0, 1][..]));

        let (v, mut r) = dump_items(
            "0781008fd310d48e440402070208020102040517616c70686100626574610067616d6d610064656c74610002000206020b0211000a002e61143f69475722",
        );
        let t = load_tensor(&mut r, v).unwrap();
        assert_eq!(t.dtype(), DataType::String);
        assert_eq!(t.string_at(3), b"delta");
        let mut w = MemRdb::default();
        save_tensor(&t, &mut w);
        assert_eq!(w.items, dump_items("0781008fd310d48e440402070208020102040517616c70686100626574610067616d6d610064656c74610002000206020b0211000a002e61143f69475722").1.items);
    }

    #[test]
    fn round_trips_every_dtype() {
        for dtype in DataType::ALL {
            let t = Tensor::zeros(dtype, vec![2, 3]).unwrap();
            let mut w = MemRdb::default();
            save_tensor(&t, &mut w);
            assert_eq!(load_tensor(&mut MemRdb::new(w.items), ENCVER).unwrap(), t);
        }
        let s = Tensor::from_blob(DataType::String, vec![3], b"x\0\0yz\0").unwrap();
        let mut w = MemRdb::default();
        save_tensor(&s, &mut w);
        assert_eq!(load_tensor(&mut MemRdb::new(w.items), ENCVER).unwrap(), s);
    }

    #[test]
    fn reads_the_v0_to_v3_layout() {
        let items = vec![
            Unsigned(1),
            Unsigned(0),
            Unsigned(32),
            Unsigned(2),
            Unsigned(1), // device, id, bits, code, lanes
            Unsigned(2),
            Unsigned(1),
            Unsigned(2),
            Unsigned(2),
            Unsigned(1),
            Unsigned(0), // ndims, shape, strides, offset
            Buffer(vec![0, 0, 128, 63, 0, 0, 0, 64]),
        ];
        for v in 0..=3 {
            let t = load_tensor(&mut MemRdb::new(items.clone()), v).unwrap();
            assert_eq!(t.dtype(), DataType::Float);
            assert_eq!(t.shape(), &[1, 2]);
        }
    }

    #[test]
    fn models_round_trip_in_chunks() {
        let spec = ModelSpec {
            backend: BackendKind::Onnx,
            device: Device::parse(b"CPU:1").unwrap(),
            tag: b"v1".to_vec(),
            batch: BatchOpts { size: 4, min_size: 2, min_timeout_ms: 10 },
            inputs: vec!["a".into(), "b".into()],
            outputs: vec!["c".into()],
            blob: b"0123456789".to_vec().into(),
        };
        for chunk in [1, 3, 5, 10, 1000] {
            let mut w = MemRdb::default();
            save_model(&spec, chunk, &mut w);
            let n = w.items.iter().filter(|i| matches!(i, Buffer(_))).count() - 5; // device, tag, 3 names
            assert_eq!(n, 10 / chunk + 1);
            assert_eq!(load_model(&mut MemRdb::new(w.items), ENCVER).unwrap(), spec);
        }
        // v1: no MINBATCHTIMEOUT; v0: NUL-terminated tag and one blob buffer.
        let v1 = vec![
            Unsigned(3),
            Buffer(b"CPU\0".to_vec()),
            Buffer(b"t".to_vec()),
            Unsigned(0),
            Unsigned(0),
            Unsigned(1),
            Buffer(b"x\0".to_vec()),
            Unsigned(1),
            Buffer(b"y\0".to_vec()),
            Unsigned(2),
            Unsigned(1),
            Buffer(b"ab".to_vec()),
        ];
        let m = load_model(&mut MemRdb::new(v1), 1).unwrap();
        assert_eq!((m.blob.as_slice(), m.tag.as_slice(), m.batch.min_timeout_ms), (&b"ab"[..], &b"t"[..], 0));
        let v0 = vec![
            Unsigned(3),
            Buffer(b"CPU\0".to_vec()),
            Buffer(b"t\0".to_vec()),
            Unsigned(0),
            Unsigned(0),
            Unsigned(0),
            Unsigned(0),
            Buffer(b"ab".to_vec()),
        ];
        assert_eq!(load_model(&mut MemRdb::new(v0), 0).unwrap().tag, b"t");
        let lying = vec![
            Unsigned(3),
            Buffer(b"CPU\0".to_vec()),
            Buffer(vec![]),
            Unsigned(0),
            Unsigned(0),
            Unsigned(0),
            Unsigned(0),
            Unsigned(0),
            Unsigned(u64::MAX),
            Unsigned(u64::MAX),
            Buffer(b"ab".to_vec()),
        ];
        assert!(load_model(&mut MemRdb::new(lying), 4).is_err());
    }

    #[test]
    fn scripts_round_trip_and_read_the_recorded_layout() {
        let spec = ScriptSpec {
            device_name: "CPU".into(),
            tag: b"v1".to_vec(),
            source: "def bar(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0]\n".into(),
            entry_points: vec!["bar".into()],
        };
        let mut w = MemRdb::default();
        save_script(&spec, &mut w);
        assert_eq!(load_script(&mut MemRdb::new(w.items.clone()), ENCVER).unwrap(), spec);
        // v2: the same without entry points.
        let v2: Vec<MemItem> = w.items[..3].to_vec();
        assert!(load_script(&mut MemRdb::new(v2), 2).unwrap().entry_points.is_empty());
    }

    #[test]
    fn rejects_corrupt_payloads() {
        let cases = vec![
            vec![Unsigned(9), Unsigned(32)],                    // unknown dtype
            vec![Unsigned(2), Unsigned(32), Unsigned(1 << 40)], // absurd ndim
            vec![Unsigned(2), Unsigned(32), Unsigned(1), Unsigned(2), Buffer(vec![0; 7])], // short data
            vec![Unsigned(7), Unsigned(8), Unsigned(1), Unsigned(1), Buffer(b"a\0".to_vec()), Unsigned(1)], // bad offset
            vec![Unsigned(2), Unsigned(32), Unsigned(1), Unsigned(1)],                                      // truncated
            vec![Unsigned(2), Unsigned(32), Unsigned(1), Unsigned(u64::MAX), Buffer(vec![])], // negative dim
        ];
        for items in cases {
            assert!(load_tensor(&mut MemRdb::new(items.clone()), 4).is_err(), "{items:?}");
        }
        assert!(load_tensor(&mut MemRdb::default(), 5).is_err());
    }
}
