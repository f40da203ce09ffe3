//! TFLITE admission: refuses a LiteRT model (a `tflite.Model` flatbuffer, schema.fbs of the ai-edge-litert
//! wheel) that would run code other than LiteRT's builtin kernels or read weights from outside the model:
//!
//! - custom ops: an `OperatorCode` whose builtin code is CUSTOM (32, in `deprecated_builtin_code` or
//!   `builtin_code`) or that has a `custom_code`. `Flex*` custom codes are select-TF ops, which LiteRT hands
//!   to the Flex delegate (found by `dlsym` in the process) to run TensorFlow kernels, ReadFile and
//!   WriteFile included. STABLEHLO_CUSTOM_CALL (173) is refused as a custom call too;
//! - external buffers (`Model.external_buffer_groups`, `Model.external_buffers`, `Tensor.external_buffer`):
//!   weights that LiteRT loads from outside the flatbuffer.
//!
//! The reader below is bounds-checked and never panics. A blob it cannot read is let through: LiteRT runs
//! flatbuffers' verifier (bounds, alignment, nesting) over the whole model before using it
//! ("Failed to verify flatbuffer"), which is stricter than this reader, and refuses such a blob itself with
//! the error clients already get. Blobs too big for the verifier (2 GiB and more) are refused instead.

use super::show;

/// Field ids (the n-th field of a table in schema.fbs; its vtable slot is 4 + 2n).
mod field {
    pub const MODEL_OPERATOR_CODES: usize = 1;
    pub const MODEL_SUBGRAPHS: usize = 2;
    pub const MODEL_EXTERNAL_BUFFER_GROUPS: usize = 8;
    pub const MODEL_EXTERNAL_BUFFERS: usize = 9;
    pub const OPCODE_DEPRECATED_BUILTIN_CODE: usize = 0; // byte
    pub const OPCODE_CUSTOM_CODE: usize = 1; // string
    pub const OPCODE_BUILTIN_CODE: usize = 3; // BuiltinOperator (int)
    pub const SUBGRAPH_TENSORS: usize = 0;
    pub const TENSOR_EXTERNAL_BUFFER: usize = 10; // uint
    pub const EXTERNAL_BUFFER_GROUP_NAME: usize = 0; // string
}

/// BuiltinOperator values.
const CUSTOM: i32 = 32;
const STABLEHLO_CUSTOM_CALL: i32 = 173;

/// flatbuffers' FLATBUFFERS_MAX_BUFFER_SIZE: the verifier does not take larger buffers.
const MAX_VERIFIABLE: usize = (1 << 31) - 1;

/// Refuses a model with custom ops or external buffers (see the module doc).
pub fn check(blob: &[u8]) -> Result<(), String> {
    match walk(blob) {
        Ok(()) => Ok(()),
        Err(Stop::Refused(msg)) => Err(msg),
        Err(Stop::Malformed) if blob.len() <= MAX_VERIFIABLE => Ok(()),
        Err(Stop::Malformed) => Err("TFLITE model refused: malformed flatbuffer".into()),
    }
}

#[derive(Debug)]
enum Stop {
    Refused(String),
    Malformed,
}

impl From<Malformed> for Stop {
    fn from(_: Malformed) -> Stop {
        Stop::Malformed
    }
}

fn walk(blob: &[u8]) -> Result<(), Stop> {
    let model = Table::root(blob)?;
    if let Some(codes) = model.vector(field::MODEL_OPERATOR_CODES, 4)? {
        for i in 0..codes.len {
            operator_code(i, &codes.table(i)?)?;
        }
    }
    if let Some(groups) = model.vector(field::MODEL_EXTERNAL_BUFFER_GROUPS, 4)? {
        if groups.len > 0 {
            let name = groups.table(0)?.string(field::EXTERNAL_BUFFER_GROUP_NAME)?.unwrap_or_default();
            return Err(Stop::Refused(format!(
                "TFLITE model refused: external buffers are not allowed (group '{}' would be read from outside \
                 the model)",
                show(name)
            )));
        }
    }
    if model.vector(field::MODEL_EXTERNAL_BUFFERS, 4)?.is_some_and(|v| v.len > 0) {
        return Err(external_buffer());
    }
    if let Some(subgraphs) = model.vector(field::MODEL_SUBGRAPHS, 4)? {
        for g in 0..subgraphs.len {
            let Some(tensors) = subgraphs.table(g)?.vector(field::SUBGRAPH_TENSORS, 4)? else { continue };
            for t in 0..tensors.len {
                if tensors.table(t)?.scalar::<4>(field::TENSOR_EXTERNAL_BUFFER)?.map(u32::from_le_bytes) > Some(0) {
                    return Err(external_buffer());
                }
            }
        }
    }
    Ok(())
}

fn external_buffer() -> Stop {
    Stop::Refused("TFLITE model refused: external buffers are not allowed (weights from outside the model)".into())
}

fn operator_code(i: usize, code: &Table) -> Result<(), Stop> {
    let deprecated = code.scalar::<1>(field::OPCODE_DEPRECATED_BUILTIN_CODE)?.map_or(0, |b| i32::from(b[0] as i8));
    let builtin = code.scalar::<4>(field::OPCODE_BUILTIN_CODE)?.map_or(0, i32::from_le_bytes);
    let custom = code.string(field::OPCODE_CUSTOM_CODE)?.unwrap_or_default();
    if custom.starts_with(b"Flex") {
        return Err(Stop::Refused(format!(
            "TFLITE model refused: operator code {i} is the select-TF (Flex) op '{}': Flex ops are not allowed \
             (they would run TensorFlow kernels such as ReadFile)",
            show(custom)
        )));
    }
    if deprecated == CUSTOM || builtin == CUSTOM || !custom.is_empty() {
        return Err(Stop::Refused(format!(
            "TFLITE model refused: operator code {i} is the custom op '{}': custom ops are not allowed \
             (no custom-op libraries)",
            show(custom)
        )));
    }
    if builtin == STABLEHLO_CUSTOM_CALL {
        return Err(Stop::Refused(format!(
            "TFLITE model refused: operator code {i} is STABLEHLO_CUSTOM_CALL: custom calls are not allowed"
        )));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------------------
// A bounds-checked flatbuffer reader: tables, vectors, strings and scalars, every read checked against the
// buffer, every offset sum checked for overflow. Alignment is not checked (the verifier does; reading
// unaligned little-endian bytes is fine here).

#[derive(Debug)]
struct Malformed;

type R<T> = Result<T, Malformed>;

fn bytes<const N: usize>(buf: &[u8], pos: usize) -> R<[u8; N]> {
    let end = pos.checked_add(N).ok_or(Malformed)?;
    buf.get(pos..end).and_then(|b| b.try_into().ok()).ok_or(Malformed)
}

fn u32_at(buf: &[u8], pos: usize) -> R<usize> {
    usize::try_from(u32::from_le_bytes(bytes(buf, pos)?)).map_err(|_| Malformed)
}

/// The target of the uoffset stored at `pos` (uoffsets point forward).
fn indirect(buf: &[u8], pos: usize) -> R<usize> {
    pos.checked_add(u32_at(buf, pos)?).ok_or(Malformed)
}

struct Table<'a> {
    buf: &'a [u8],
    pos: usize,
    vtable: usize,
    vsize: usize,
}

impl<'a> Table<'a> {
    fn root(buf: &'a [u8]) -> R<Table<'a>> {
        Table::at(buf, u32_at(buf, 0)?)
    }

    /// The table at `pos`: an soffset to its vtable (`pos - soffset`), whose first u16 is its size in bytes.
    fn at(buf: &'a [u8], pos: usize) -> R<Table<'a>> {
        let soffset = i32::from_le_bytes(bytes(buf, pos)?);
        let vtable = i64::try_from(pos).map_err(|_| Malformed)? - i64::from(soffset);
        let vtable = usize::try_from(vtable).map_err(|_| Malformed)?;
        let vsize = usize::from(u16::from_le_bytes(bytes(buf, vtable)?));
        Ok(Table { buf, pos, vtable, vsize })
    }

    /// Where field `id` lies, `None` if absent (a vtable slot past its size, or 0, means absent).
    fn field(&self, id: usize) -> R<Option<usize>> {
        let slot = 4 + 2 * id;
        if slot + 2 > self.vsize {
            return Ok(None);
        }
        let offset = usize::from(u16::from_le_bytes(bytes(self.buf, self.vtable + slot)?));
        if offset == 0 {
            return Ok(None);
        }
        self.pos.checked_add(offset).map(Some).ok_or(Malformed)
    }

    fn scalar<const N: usize>(&self, id: usize) -> R<Option<[u8; N]>> {
        self.field(id)?.map(|pos| bytes(self.buf, pos)).transpose()
    }

    /// The vector in field `id`, of elements `elem` bytes wide.
    fn vector(&self, id: usize, elem: usize) -> R<Option<Vector<'a>>> {
        let Some(pos) = self.field(id)? else { return Ok(None) };
        let at = indirect(self.buf, pos)?;
        let len = u32_at(self.buf, at)?;
        let start = at + 4;
        let end = len.checked_mul(elem).and_then(|n| n.checked_add(start)).ok_or(Malformed)?;
        if end > self.buf.len() {
            return Err(Malformed);
        }
        Ok(Some(Vector { buf: self.buf, start, len }))
    }

    fn string(&self, id: usize) -> R<Option<&'a [u8]>> {
        Ok(self.vector(id, 1)?.map(|v| &v.buf[v.start..v.start + v.len]))
    }
}

struct Vector<'a> {
    buf: &'a [u8],
    start: usize,
    len: usize,
}

impl<'a> Vector<'a> {
    /// Element `i` of a vector of tables (uoffsets).
    fn table(&self, i: usize) -> R<Table<'a>> {
        Table::at(self.buf, indirect(self.buf, self.start + 4 * i)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A field of a hand-built table.
    #[derive(Clone)]
    enum V {
        I8(i8),
        I32(i32),
        U32(u32),
        Str(&'static [u8]),
        Tables(Vec<T>),
    }

    /// A table: `(field id, value)` pairs.
    #[derive(Clone)]
    struct T(Vec<(usize, V)>);

    /// Lays out `root` front to back: vtable, table, then what its offsets point to (always forward).
    fn build(root: &T) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        let pos = table(root, &mut out);
        out[0..4].copy_from_slice(&(pos as u32).to_le_bytes());
        out
    }

    fn patch(out: &mut [u8], at: usize, target: usize) {
        out[at..at + 4].copy_from_slice(&((target - at) as u32).to_le_bytes());
    }

    fn table(t: &T, out: &mut Vec<u8>) -> usize {
        let slots = t.0.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
        let vtable = out.len();
        out.extend(vec![0u8; 4 + 2 * slots]);
        let pos = out.len();
        out.extend(((pos - vtable) as i32).to_le_bytes());
        let mut pending = Vec::new();
        for (id, v) in &t.0 {
            let at = out.len();
            out[vtable + 4 + 2 * id..vtable + 6 + 2 * id].copy_from_slice(&((at - pos) as u16).to_le_bytes());
            match v {
                V::I8(x) => out.extend([*x as u8, 0, 0, 0]),
                V::I32(x) => out.extend(x.to_le_bytes()),
                V::U32(x) => out.extend(x.to_le_bytes()),
                V::Str(_) | V::Tables(_) => {
                    out.extend([0; 4]);
                    pending.push((at, v));
                }
            }
        }
        let (vsize, tsize) = ((4 + 2 * slots) as u16, (out.len() - pos) as u16);
        out[vtable..vtable + 2].copy_from_slice(&vsize.to_le_bytes());
        out[vtable + 2..vtable + 4].copy_from_slice(&tsize.to_le_bytes());
        for (at, v) in pending {
            let target = out.len();
            patch(out, at, target);
            match v {
                V::Str(s) => {
                    out.extend((s.len() as u32).to_le_bytes());
                    out.extend(*s);
                    out.push(0);
                }
                V::Tables(ts) => {
                    out.extend((ts.len() as u32).to_le_bytes());
                    let slots = out.len();
                    out.extend(vec![0u8; 4 * ts.len()]);
                    for (i, t) in ts.iter().enumerate() {
                        let p = table(t, out);
                        patch(out, slots + 4 * i, p);
                    }
                }
                _ => unreachable!(),
            }
        }
        pos
    }

    fn opcode(deprecated: i8, builtin: i32, custom: Option<&'static [u8]>) -> T {
        let mut f = vec![(0, V::I8(deprecated)), (2, V::I32(1)), (3, V::I32(builtin))];
        if let Some(c) = custom {
            f.push((1, V::Str(c)));
        }
        T(f)
    }

    fn model(codes: Vec<T>, extra: Vec<(usize, V)>) -> Vec<u8> {
        let tensor = T(vec![(3, V::Str(b"x")), (2, V::U32(0))]);
        let subgraph = T(vec![(0, V::Tables(vec![tensor])), (4, V::Str(b"main"))]);
        let mut f = vec![(0, V::U32(3)), (1, V::Tables(codes)), (2, V::Tables(vec![subgraph]))];
        f.extend(extra);
        build(&T(f))
    }

    #[test]
    fn builtin_ops_pass() {
        assert_eq!(check(&model(vec![opcode(0, 0, None), opcode(18, 18, None)], vec![])), Ok(()));
        // BuiltinOperator past 127: deprecated_builtin_code = PLACEHOLDER_FOR_GREATER_OP_CODES
        assert_eq!(check(&model(vec![opcode(127, 150, None)], vec![])), Ok(()));
        // an empty custom_code is no custom op
        assert_eq!(check(&model(vec![opcode(0, 0, Some(b""))], vec![])), Ok(()));
    }

    #[test]
    fn custom_ops_refused() {
        let err = check(&model(vec![opcode(0, 0, None), opcode(32, 32, Some(b"MyOp"))], vec![])).unwrap_err();
        assert!(err.contains("operator code 1 is the custom op 'MyOp'"), "{err}");
        // CUSTOM in either field, or a custom_code alone
        for code in [opcode(32, 0, None), opcode(0, 32, None), opcode(0, 0, Some(b"Op")), opcode(127, 32, None)] {
            assert!(check(&model(vec![code], vec![])).unwrap_err().contains("custom op"));
        }
        let err = check(&model(vec![opcode(32, 32, Some(b"FlexReadFile"))], vec![])).unwrap_err();
        assert!(err.contains("select-TF (Flex) op 'FlexReadFile'") && err.contains("ReadFile"), "{err}");
        let err = check(&model(vec![opcode(127, 173, None)], vec![])).unwrap_err();
        assert!(err.contains("STABLEHLO_CUSTOM_CALL"), "{err}");
        let err = check(&model(vec![opcode(32, 32, Some(b"a\r\nb"))], vec![])).unwrap_err();
        assert!(err.contains(r"'a\r\nb'"), "{err}");
    }

    #[test]
    fn external_buffers_refused() {
        let group = T(vec![(0, V::Str(b"weights.bin"))]);
        let err = check(&model(vec![], vec![(8, V::Tables(vec![group]))])).unwrap_err();
        assert!(err.contains("external buffers") && err.contains("weights.bin"), "{err}");
        let buffer = T(vec![(0, V::U32(1)), (1, V::U32(0))]);
        assert!(check(&model(vec![], vec![(9, V::Tables(vec![buffer]))])).unwrap_err().contains("external"));
        // a tensor that names an external buffer
        let tensor = T(vec![(3, V::Str(b"w")), (10, V::U32(1))]);
        let subgraph = T(vec![(0, V::Tables(vec![tensor]))]);
        let blob = build(&T(vec![(2, V::Tables(vec![subgraph]))]));
        assert!(check(&blob).unwrap_err().contains("external"));
        // empty vectors are fine
        assert_eq!(check(&model(vec![], vec![(8, V::Tables(vec![])), (9, V::Tables(vec![]))])), Ok(()));
    }

    fn committed() -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "tflite") {
                out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
        out
    }

    #[test]
    fn committed_models() {
        let models = committed();
        assert!(models.len() >= 4, "{}", models.len());
        for (name, blob) in &models {
            // the models the generator writes to be refused, and the legitimate ones
            let refused = name.contains("custom") || name.contains("flex");
            assert!(walk(blob).is_ok() != refused, "{name}: {:?}", walk(blob));
            if name.contains("flex") {
                assert!(check(blob).unwrap_err().contains("Flex"), "{name}");
            }
        }
    }

    #[test]
    fn malformed_is_left_to_litert() {
        // LiteRT's verifier refuses these itself
        for bad in [&b"not a flatbuffer"[..], b"", b"\x04\x00\x00\x00\xff\xff\xff\x7f"] {
            assert!(matches!(walk(bad), Err(Stop::Malformed)), "{bad:?}");
            assert_eq!(check(bad), Ok(()));
        }
        let good = model(vec![opcode(0, 0, None)], vec![]);
        for cut in 0..good.len() {
            let _ = check(&good[..cut]);
        }
    }

    proptest! {
        #![proptest_config(crate::commands::fuzz::config())]

        /// Any bytes: an answer, never a panic.
        #[test]
        fn any_bytes(blob in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = check(&blob);
        }

        /// Committed and hand-built models with a few bytes changed: an answer, never a panic.
        #[test]
        fn mutated_models(which in 0usize..8, edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..8)) {
            let mut models: Vec<Vec<u8>> = committed().into_iter().map(|(_, b)| b).collect();
            models.push(model(vec![opcode(0, 0, None), opcode(32, 32, Some(b"FlexX"))], vec![]));
            let mut blob = models[which % models.len()].clone();
            for (at, byte) in edits {
                let n = blob.len();
                blob[at as usize % n] = byte;
            }
            let _ = check(&blob);
        }
    }
}
