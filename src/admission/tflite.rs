//! TFLITE admission: refuses a LiteRT model (a `tflite.Model` flatbuffer, schema.fbs of the ai-edge-litert
//! wheel) that would run code other than LiteRT's builtin kernels or read weights from outside the model:
//!
//! - custom ops: an `OperatorCode` whose builtin code is CUSTOM (32, in `deprecated_builtin_code` or
//!   `builtin_code`) or that has a `custom_code`. `Flex*` custom codes are select-TF ops, which LiteRT hands
//!   to the Flex delegate (found by `dlsym` in the process) to run TensorFlow kernels, ReadFile and
//!   WriteFile included. STABLEHLO_CUSTOM_CALL (173) is refused as a custom call too;
//! - external buffers (`Model.external_buffer_groups`, `Model.external_buffers`, `Tensor.external_buffer`):
//!   weights that LiteRT loads from outside the flatbuffer;
//! - control flow that recurses: an operator that runs other subgraphs (WHILE, IF, CALL_ONCE, CALL and the
//!   StableHLO ops with bodies or comparators) naming its own subgraph, a cycle of subgraphs, subgraphs nested
//!   more than `MAX_SUBGRAPH_DEPTH` deep, or a subgraph index that does not exist. LiteRT prepares and runs a
//!   control-flow op by recursing into the subgraphs it names: a 576-byte model whose WHILE body was its own
//!   subgraph was accepted at store and overflowed the stack at its first run. The indices are read as LiteRT reads them: by the op's builtin
//!   code, from its options when they are of the op's own options type, else 0 (LiteRT's parameters start
//!   zeroed, so a WHILE without options runs subgraph 0).
//!
//! Flatbuffers may share tables and vectors (offsets can point anywhere), so a few kilobytes can describe
//! millions of subgraphs or operators; every element the walk reads is counted, and a model that needs more
//! reads than it has bytes (which only sharing can do) is refused instead of walked.
//!
//! The reader below is bounds-checked and never panics. A blob it cannot read is let through: LiteRT runs
//! flatbuffers' verifier (bounds, alignment, nesting) over the whole model before using it
//! ("Failed to verify flatbuffer"), which is stricter than this reader, and refuses such a blob itself with
//! the error clients already get. Blobs too big for the verifier (2 GiB and more) are refused instead.

use std::collections::HashMap;

use super::callgraph::{show_path, CallGraph, Expansion, Refusal};
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
    pub const SUBGRAPH_OPERATORS: usize = 3;
    pub const OPERATOR_OPCODE_INDEX: usize = 0; // uint
    pub const OPERATOR_BUILTIN_OPTIONS_TYPE: usize = 3; // the BuiltinOptions union's type (ubyte) ...
    pub const OPERATOR_BUILTIN_OPTIONS: usize = 4; // ... and its table
    pub const OPERATOR_BUILTIN_OPTIONS_2_TYPE: usize = 11; // BuiltinOptions2
    pub const OPERATOR_BUILTIN_OPTIONS_2: usize = 12;
    pub const TENSOR_EXTERNAL_BUFFER: usize = 10; // uint
    pub const EXTERNAL_BUFFER_GROUP_NAME: usize = 0; // string
}

/// BuiltinOperator values.
const CUSTOM: i32 = 32;
const STABLEHLO_CUSTOM_CALL: i32 = 173;

/// How many subgraphs deep control flow may nest (the main subgraph is one level). LiteRT prepares, and runs,
/// a control-flow op's subgraphs by recursing into them (`Subgraph::AllocateTensors` -> the op's `Prepare` ->
/// the callee's `AllocateTensors`, several frames a level) on whichever thread prepares or runs the model (a
/// build thread, Redis's main thread at RDB load, a worker). Converted models nest a few levels (a loop
/// in a branch in a loop); 32 leaves them room and that recursion far from the stack's end (a WHILE model built
/// in tests/flow/test_tflite.py runs).
pub const MAX_SUBGRAPH_DEPTH: u32 = 32;

/// How many ops of other subgraphs the control-flow ops of a subgraph may run in one pass, each callee expanded in
/// place (both branches of an IF counted, a subgraph an op names twice once, each op counted as often as it
/// is reached; the subgraph's own ops do not count). LiteRT runs a control-flow op's
/// subgraph on every pass, and its cancellation check (the kill switch) runs between the ops of the subgraph
/// being invoked, so a few KB of subgraphs each running the next from two IFs, 24 levels deep, ran 2^24
/// subgraphs and ignored MODEL_EXECUTION_TIMEOUT for 30 s. Loops (WHILE) repeat at run time, where the
/// kill switch stops them between iterations; this bounds one pass. Converted models expand to their own size
/// plus a few branches.
pub const MAX_EXPANDED_OPS: u64 = 1 << 16;

/// An operator that runs other subgraphs, with where its options keep their indices (schema.fbs).
struct ControlFlow {
    code: i32,
    name: &'static str,
    /// In `builtin_options_2` (else `builtin_options`), when the union's type is `options_type`.
    options2: bool,
    options_type: u8,
    /// Fields holding one subgraph index (`int`; CallOptions' is a `uint`).
    indices: &'static [usize],
    unsigned: bool,
    /// A field holding a vector of indices (`[int]`).
    index_vector: Option<usize>,
}

const fn cf(code: i32, name: &'static str, options2: bool, options_type: u8, indices: &'static [usize]) -> ControlFlow {
    ControlFlow { code, name, options2, options_type, indices, unsigned: false, index_vector: None }
}

/// BuiltinOperator codes, BuiltinOptions / BuiltinOptions2 union types and field ids, from schema.fbs.
const CONTROL_FLOW: &[ControlFlow] = &[
    // CallOptions.subgraph (no builtin kernel in LiteRT 2.3; a later one may add it)
    ControlFlow { unsigned: true, ..cf(31, "CALL", false, 16, &[0]) },
    cf(118, "IF", false, 92, &[0, 1]),                  // IfOptions: then, else
    cf(119, "WHILE", false, 93, &[0, 1]),               // WhileOptions: cond, body
    cf(129, "CALL_ONCE", false, 103, &[0]),             // CallOnceOptions: init
    cf(174, "STABLEHLO_REDUCE", true, 6, &[1]),         // StablehloReduceOptions.body_subgraph_index
    cf(190, "STABLEHLO_SCATTER", true, 7, &[6]),        // StablehloScatterOptions.update_computation_subgraph_index
    cf(198, "STABLEHLO_REDUCE_WINDOW", true, 13, &[5]), // StablehloReduceWindowOptions.body_subgraph_index
    cf(199, "STABLEHLO_SORT", true, 14, &[2]),          // StablehloSortOptions.comparator_subgraph_index
    cf(200, "STABLEHLO_WHILE", true, 15, &[0, 1]),      // StablehloWhileOptions: cond, body
    cf(206, "STABLEHLO_COMPOSITE", true, 21, &[1]),     // StableHLOCompositeOptions.decomposition_subgraph_index
    ControlFlow { index_vector: Some(0), ..cf(209, "STABLEHLO_CASE", true, 23, &[]) }, // branch_subgraph_indices
];

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

/// Elements (of vectors of tables or indices) the walk may still read. Each element takes 4 bytes of its own
/// in a flatbuffer whose parts are not shared, so a model never needs more reads than a quarter of its size.
struct Budget(usize);

impl Budget {
    fn spend(&mut self) -> Result<(), Stop> {
        self.0 = self.0.checked_sub(1).ok_or_else(|| {
            Stop::Refused(
                "TFLITE model refused: its flatbuffer shares the same data between many subgraphs or operators \
                 (more to read than the model's size)"
                    .into(),
            )
        })?;
        Ok(())
    }
}

fn walk(blob: &[u8]) -> Result<(), Stop> {
    let model = Table::root(blob)?;
    let mut budget = Budget(blob.len() / 4 + 1);
    let mut builtin_codes = Vec::new();
    if let Some(codes) = model.vector(field::MODEL_OPERATOR_CODES, 4)? {
        for i in 0..codes.len {
            budget.spend()?;
            let code = codes.table(i)?;
            operator_code(i, &code)?;
            builtin_codes.push(builtin_code(&code)?);
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
    let Some(subgraphs) = model.vector(field::MODEL_SUBGRAPHS, 4)? else { return Ok(()) };
    let mut calls = Calls { graph: CallGraph::new(subgraphs.len), ops: HashMap::new() };
    for g in 0..subgraphs.len {
        budget.spend()?;
        let subgraph = subgraphs.table(g)?;
        if let Some(tensors) = subgraph.vector(field::SUBGRAPH_TENSORS, 4)? {
            for t in 0..tensors.len {
                budget.spend()?;
                if tensors.table(t)?.scalar::<4>(field::TENSOR_EXTERNAL_BUFFER)?.map(u32::from_le_bytes) > Some(0) {
                    return Err(external_buffer());
                }
            }
        }
        if let Some(operators) = subgraph.vector(field::SUBGRAPH_OPERATORS, 4)? {
            calls.graph.weigh(g, operators.len as u64);
            for i in 0..operators.len {
                budget.spend()?;
                calls.operator(g, i, &operators.table(i)?, &builtin_codes, &mut budget)?;
            }
        }
    }
    calls.check()
}

/// The subgraph call graph, and the op behind each call (for the error).
struct Calls {
    graph: CallGraph,
    ops: HashMap<(usize, usize), &'static str>,
}

impl Calls {
    /// Records the subgraphs operator `i` of subgraph `g` runs.
    fn operator(&mut self, g: usize, i: usize, op: &Table, codes: &[i32], budget: &mut Budget) -> Result<(), Stop> {
        let index = op.scalar::<4>(field::OPERATOR_OPCODE_INDEX)?.map_or(0, u32::from_le_bytes);
        // An index past the codes: LiteRT refuses the model ("Missing registration for opcode_index").
        let Some(&code) = usize::try_from(index).ok().and_then(|i| codes.get(i)) else { return Ok(()) };
        let Some(cf) = CONTROL_FLOW.iter().find(|c| c.code == code) else { return Ok(()) };
        let (type_field, table_field) = if cf.options2 {
            (field::OPERATOR_BUILTIN_OPTIONS_2_TYPE, field::OPERATOR_BUILTIN_OPTIONS_2)
        } else {
            (field::OPERATOR_BUILTIN_OPTIONS_TYPE, field::OPERATOR_BUILTIN_OPTIONS)
        };
        let options_type = op.scalar::<1>(type_field)?.map_or(0, |b| b[0]);
        let options = if options_type == cf.options_type { op.table(table_field)? } else { None };
        let mut targets = Vec::new();
        for &id in cf.indices {
            // Absent options or field: 0, as in LiteRT.
            let raw = options.as_ref().map(|o| o.scalar::<4>(id)).transpose()?.flatten().unwrap_or([0; 4]);
            let target =
                if cf.unsigned { i64::from(u32::from_le_bytes(raw)) } else { i64::from(i32::from_le_bytes(raw)) };
            targets.push(target);
        }
        if let (Some(id), Some(options)) = (cf.index_vector, &options) {
            if let Some(indices) = options.vector(id, 4)? {
                for k in 0..indices.len {
                    budget.spend()?;
                    targets.push(i64::from(indices.i32(k)?));
                }
            }
        }
        // One op runs a subgraph it names twice (an IF whose branches are one subgraph) once per pass.
        targets.sort_unstable();
        targets.dedup();
        for target in targets {
            self.call(g, i, cf.name, target)?;
        }
        Ok(())
    }

    fn call(&mut self, g: usize, i: usize, op: &'static str, target: i64) -> Result<(), Stop> {
        let n = self.graph.len();
        let Some(callee) = usize::try_from(target).ok().filter(|&t| t < n) else {
            return Err(Stop::Refused(format!(
                "TFLITE model refused: operator {i} of subgraph {g} ({op}) names subgraph {target}, which does not \
                 exist (the model has {n})"
            )));
        };
        self.graph.call(g, callee, 1);
        self.ops.entry((g, callee)).or_insert(op);
        Ok(())
    }

    fn check(&self) -> Result<(), Stop> {
        let refusal = match self.graph.heights(MAX_SUBGRAPH_DEPTH) {
            Ok(heights) => {
                // every subgraph is checked as a caller: any may be a signature's entry
                match self.graph.expansion(&heights, [], MAX_EXPANDED_OPS) {
                    Expansion::Node(g) => format!(
                        "TFLITE model refused: the control-flow ops of subgraph {g} run more than \
                         {MAX_EXPANDED_OPS} ops of other subgraphs in one pass (the calls fan out)"
                    ),
                    Expansion::Fits | Expansion::Root => return Ok(()),
                }
            }
            Err(Refusal::Cycle(path)) => format!(
                "TFLITE model refused: subgraph {} calls itself through {} (subgraphs {}): recursive control flow is \
                 not allowed",
                path[0],
                self.ops.get(&(path[0], path[1])).copied().unwrap_or("a control-flow op"),
                show_path(&path, |g| g.to_string())
            ),
            Err(Refusal::TooDeep(g)) => format!(
                "TFLITE model refused: subgraph {g} nests control flow more than {MAX_SUBGRAPH_DEPTH} subgraphs deep"
            ),
        };
        Err(Stop::Refused(refusal))
    }
}

fn external_buffer() -> Stop {
    Stop::Refused("TFLITE model refused: external buffers are not allowed (weights from outside the model)".into())
}

/// The operator an `OperatorCode` names, as LiteRT reads it (`GetBuiltinCode`: the larger of its two fields).
fn builtin_code(code: &Table) -> R<i32> {
    let deprecated = code.scalar::<1>(field::OPCODE_DEPRECATED_BUILTIN_CODE)?.map_or(0, |b| i32::from(b[0] as i8));
    let builtin = code.scalar::<4>(field::OPCODE_BUILTIN_CODE)?.map_or(0, i32::from_le_bytes);
    Ok(deprecated.max(builtin))
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

    /// The table in field `id`.
    fn table(&self, id: usize) -> R<Option<Table<'a>>> {
        let Some(pos) = self.field(id)? else { return Ok(None) };
        Table::at(self.buf, indirect(self.buf, pos)?).map(Some)
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

    /// Element `i` of a vector of `int`.
    fn i32(&self, i: usize) -> R<i32> {
        bytes(self.buf, self.start + 4 * i).map(i32::from_le_bytes)
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
        U8(u8),
        I32(i32),
        U32(u32),
        Str(&'static [u8]),
        Tables(Vec<T>),
        Table(Box<T>),
        Ints(Vec<i32>),
        /// A vector of `n` offsets to one table (flatbuffers allow sharing).
        Shared(usize, Box<T>),
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
                V::U8(x) => out.extend([*x, 0, 0, 0]),
                V::I32(x) => out.extend(x.to_le_bytes()),
                V::U32(x) => out.extend(x.to_le_bytes()),
                V::Str(_) | V::Tables(_) | V::Table(_) | V::Ints(_) | V::Shared(..) => {
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
            if let V::Table(t) = v {
                let p = table(t, out);
                patch(out, at, p);
                continue;
            }
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
                V::Ints(xs) => {
                    out.extend((xs.len() as u32).to_le_bytes());
                    xs.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
                V::Shared(n, t) => {
                    out.extend((*n as u32).to_le_bytes());
                    let slots = out.len();
                    out.extend(vec![0u8; 4 * n]);
                    let p = table(t, out);
                    for i in 0..*n {
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

    // ---- control flow

    const IF: i32 = 118;
    const WHILE: i32 = 119;

    /// The operator codes of the control-flow tests: code i is CONTROL_FLOW[i], then ADD.
    fn cf_codes() -> Vec<T> {
        let mut codes: Vec<T> = CONTROL_FLOW.iter().map(|c| opcode(c.code.min(127) as i8, c.code, None)).collect();
        codes.push(opcode(0, 0, None));
        codes
    }

    fn add_op() -> T {
        T(vec![(0, V::U32(CONTROL_FLOW.len() as u32))])
    }

    /// Operator `code` (a BuiltinOperator of CONTROL_FLOW) whose options name `targets`.
    fn cf_op(code: i32, targets: &[i32]) -> T {
        let (i, cf) = CONTROL_FLOW.iter().enumerate().find(|(_, c)| c.code == code).unwrap();
        let mut fields: Vec<(usize, V)> = cf.indices.iter().zip(targets).map(|(&id, &t)| (id, V::I32(t))).collect();
        if let Some(id) = cf.index_vector {
            fields.push((id, V::Ints(targets.to_vec())));
        }
        let (ty, table) = if cf.options2 { (11, 12) } else { (3, 4) };
        T(vec![(0, V::U32(i as u32)), (ty, V::U8(cf.options_type)), (table, V::Table(Box::new(T(fields))))])
    }

    /// A model whose subgraph i holds `subgraphs[i]`'s operators.
    fn cf_model(subgraphs: Vec<Vec<T>>) -> Vec<u8> {
        let subgraphs = subgraphs.into_iter().map(|ops| T(vec![(3, V::Tables(ops)), (4, V::Str(b"g"))])).collect();
        build(&T(vec![(0, V::U32(3)), (1, V::Tables(cf_codes())), (2, V::Tables(subgraphs))]))
    }

    #[test]
    fn while_whose_body_is_its_own_subgraph_is_refused() {
        let blob = cf_model(vec![vec![add_op(), cf_op(WHILE, &[1, 0])], vec![add_op()]]);
        assert_eq!(
            check(&blob).unwrap_err(),
            "TFLITE model refused: subgraph 0 calls itself through WHILE (subgraphs 0 -> 0): recursive control flow \
             is not allowed"
        );
        // a cond that is its own subgraph, in a subgraph other than the main one
        let blob = cf_model(vec![vec![cf_op(WHILE, &[1, 2])], vec![cf_op(WHILE, &[1, 2])], vec![]]);
        assert!(check(&blob).unwrap_err().contains("subgraph 1 calls itself through WHILE (subgraphs 1 -> 1)"));
    }

    #[test]
    fn every_control_flow_op_is_followed() {
        for cf in CONTROL_FLOW {
            let targets = vec![0; cf.indices.len().max(1)];
            let err = check(&cf_model(vec![vec![cf_op(cf.code, &targets)], vec![]])).unwrap_err();
            assert!(err.contains(&format!("subgraph 0 calls itself through {} (subgraphs 0 -> 0)", cf.name)), "{err}");
            // the same op calling subgraph 1 is fine
            let targets = vec![1; cf.indices.len().max(1)];
            assert_eq!(check(&cf_model(vec![vec![cf_op(cf.code, &targets)], vec![]])), Ok(()), "{}", cf.name);
        }
        // CASE: any branch
        let err = check(&cf_model(vec![vec![cf_op(209, &[1, 2, 0])], vec![], vec![]])).unwrap_err();
        assert!(err.contains("through STABLEHLO_CASE"), "{err}");
    }

    #[test]
    fn options_are_read_as_litert_reads_them() {
        // no options, or options of another type: LiteRT's parameters stay 0, so WHILE runs subgraph 0
        let bare = T(vec![(0, V::U32(2))]);
        assert!(check(&cf_model(vec![vec![bare], vec![]])).unwrap_err().contains("calls itself through WHILE"));
        let mut wrong = cf_op(WHILE, &[1, 1]);
        wrong.0[1] = (3, V::U8(92)); // IfOptions
        assert!(check(&cf_model(vec![vec![wrong], vec![]])).unwrap_err().contains("calls itself through WHILE"));
        // an absent field is 0 as well
        let half = T(vec![(0, V::U32(2)), (3, V::U8(93)), (4, V::Table(Box::new(T(vec![(0, V::I32(1))]))))]);
        assert!(check(&cf_model(vec![vec![half], vec![]])).unwrap_err().contains("calls itself"));
        // the op is the larger of the two code fields, as LiteRT's GetBuiltinCode has it
        for (deprecated, builtin, refused) in [(0, WHILE, true), (WHILE as i8, 0, true), (127, WHILE, false)] {
            let mut codes = cf_codes();
            codes[2] = opcode(deprecated, builtin, None);
            let g = T(vec![(3, V::Tables(vec![cf_op(WHILE, &[0, 0])]))]);
            let blob = build(&T(vec![(1, V::Tables(codes)), (2, V::Tables(vec![g]))]));
            assert_eq!(check(&blob).is_err(), refused, "{deprecated} {builtin}");
        }
        // an op whose code index does not exist: LiteRT refuses it itself
        let blob = cf_model(vec![vec![T(vec![(0, V::U32(999))])]]);
        assert_eq!(check(&blob), Ok(()));
    }

    #[test]
    fn cycles_through_several_subgraphs_are_refused() {
        // 0 -WHILE-> 2 -IF-> 0
        let blob = cf_model(vec![vec![cf_op(WHILE, &[1, 2])], vec![], vec![cf_op(IF, &[3, 0])], vec![]]);
        assert_eq!(
            check(&blob).unwrap_err(),
            "TFLITE model refused: subgraph 0 calls itself through WHILE (subgraphs 0 -> 2 -> 0): recursive control \
             flow is not allowed"
        );
        // a cycle of subgraphs the main one never calls
        let blob = cf_model(vec![vec![add_op()], vec![cf_op(IF, &[2, 2])], vec![cf_op(129, &[1])]]);
        assert!(check(&blob).unwrap_err().contains("subgraph 1 calls itself through IF (subgraphs 1 -> 2 -> 1)"));
    }

    #[test]
    fn subgraph_indices_must_exist() {
        let blob = cf_model(vec![vec![cf_op(WHILE, &[1, 5])], vec![]]);
        assert_eq!(
            check(&blob).unwrap_err(),
            "TFLITE model refused: operator 0 of subgraph 0 (WHILE) names subgraph 5, which does not exist (the \
             model has 2)"
        );
        assert!(check(&cf_model(vec![vec![cf_op(IF, &[-1, 0])]])).unwrap_err().contains("names subgraph -1"));
        assert!(check(&cf_model(vec![vec![cf_op(209, &[1, 7])], vec![]])).unwrap_err().contains("names subgraph 7"));
    }

    /// Subgraph i runs subgraph i + 1 (IF, WHILE, CALL_ONCE in turn), the last runs nothing.
    fn nested(levels: usize) -> Vec<u8> {
        let subgraphs = (0..levels)
            .map(|i| {
                let next = (i + 1) as i32;
                match (i + 1 == levels, i % 3) {
                    (true, _) => vec![add_op()],
                    (_, 0) => vec![cf_op(IF, &[next, next])],
                    (_, 1) => vec![add_op(), cf_op(WHILE, &[next, next])],
                    _ => vec![cf_op(129, &[next])],
                }
            })
            .collect();
        cf_model(subgraphs)
    }

    #[test]
    fn nesting_is_bounded() {
        assert_eq!(check(&nested(MAX_SUBGRAPH_DEPTH as usize)), Ok(()));
        assert_eq!(
            check(&nested(MAX_SUBGRAPH_DEPTH as usize + 1)).unwrap_err(),
            "TFLITE model refused: subgraph 0 nests control flow more than 32 subgraphs deep"
        );
        assert!(check(&nested(3000)).unwrap_err().contains("more than 32 subgraphs deep"));
    }

    /// Subgraph i runs subgraph i + 1 from two IFs (both branches the same subgraph), `levels` deep, the last an
    /// ADD: 2^levels runs of it in one pass.
    fn fan_out(levels: usize) -> Vec<u8> {
        let subgraphs = (0..=levels)
            .map(|i| {
                let next = (i + 1) as i32;
                if i == levels {
                    vec![add_op()]
                } else {
                    vec![cf_op(IF, &[next, next]), cf_op(IF, &[next, next]), add_op()]
                }
            })
            .collect();
        cf_model(subgraphs)
    }

    #[test]
    fn fan_out_is_bounded() {
        // subgraph 0's IFs bring in 4 * 2^levels - 6 ops: 65,530 at 14 levels, 131,066 at 15
        assert_eq!(check(&fan_out(14)), Ok(()));
        assert_eq!(
            check(&fan_out(15)).unwrap_err(),
            "TFLITE model refused: the control-flow ops of subgraph 0 run more than 65536 ops of other subgraphs in \
             one pass (the calls fan out)"
        );
        assert!(check(&fan_out(31)).unwrap_err().contains("(the calls fan out)"));
        // a subgraph of many ops and no control flow is not refused for its size
        assert_eq!(check(&cf_model(vec![vec![add_op(); 100_000]])), Ok(()));
    }

    #[test]
    fn legitimate_control_flow_passes() {
        // main: WHILE(cond 1, body 2); the body: IF(then 3, else 4); both branches called twice, CASE over them
        let blob = cf_model(vec![
            vec![add_op(), cf_op(WHILE, &[1, 2]), cf_op(IF, &[3, 4])],
            vec![add_op()],
            vec![cf_op(IF, &[3, 4]), cf_op(209, &[3, 4, 3])],
            vec![add_op()],
            vec![],
        ]);
        assert_eq!(check(&blob), Ok(()));
    }

    #[test]
    fn shared_data_is_refused_not_walked() {
        // 3,000 subgraph offsets to one subgraph whose 3,000 operator offsets point to one ADD: 9 million
        // operators in 25 KB
        let subgraph = T(vec![(3, V::Shared(3000, Box::new(add_op())))]);
        let blob = build(&T(vec![(1, V::Tables(cf_codes())), (2, V::Shared(3000, Box::new(subgraph)))]));
        assert!(blob.len() < 30_000, "{}", blob.len());
        assert!(check(&blob).unwrap_err().contains("shares the same data"));
        // a few shared tables are fine
        let subgraph = T(vec![(3, V::Shared(3, Box::new(add_op())))]);
        assert_eq!(check(&build(&T(vec![(1, V::Tables(cf_codes())), (2, V::Shared(2, Box::new(subgraph)))]))), Ok(()));
    }

    proptest! {
        #![proptest_config(crate::commands::fuzz::config())]

        /// Random subgraph tables (a chain, to get deep ones, plus random control-flow ops, a few naming
        /// subgraphs that do not exist): never a panic, and refused exactly when a subgraph reaches itself,
        /// control flow nests deeper than the bound, or an index is out of range.
        #[test]
        fn random_subgraph_tables(
            chain in 0usize..40,
            extra in proptest::collection::vec((0usize..48, -2i32..50, 0usize..11), 0..16),
        ) {
            let n = chain.max(1) + 8;
            let mut calls: Vec<(usize, i32, usize)> = (1..chain).map(|i| (i - 1, i as i32, i % 11)).collect();
            calls.extend(extra.iter().map(|&(a, b, op)| (a % n, if b < 48 { b % n as i32 } else { b }, op)));
            let subgraphs: Vec<Vec<T>> = (0..n)
                .map(|g| {
                    let mut ops = vec![add_op()];
                    for &(_, b, op) in calls.iter().filter(|c| c.0 == g) {
                        let cf = &CONTROL_FLOW[op];
                        ops.push(cf_op(cf.code, &vec![b; cf.indices.len().max(1)]));
                    }
                    ops
                })
                .collect();
            let result = check(&cf_model(subgraphs));
            let out_of_range = calls.iter().any(|c| c.1 < 0 || c.1 as usize >= n);
            let edges: Vec<(usize, usize)> = calls.iter().filter(|c| c.1 >= 0).map(|c| (c.0, c.1 as usize)).collect();
            let mut height = vec![1u32; n];
            let mut cyclic = false;
            for round in 0..=n {
                let mut changed = false;
                for &(a, b) in edges.iter().filter(|e| e.1 < n) {
                    if height[a] < height[b] + 1 {
                        height[a] = height[b] + 1;
                        changed = true;
                    }
                }
                if !changed {
                    break;
                }
                cyclic = round == n;
            }
            let deepest = height.iter().copied().max().unwrap_or(0);
            match result {
                Ok(()) => prop_assert!(!cyclic && !out_of_range && deepest <= MAX_SUBGRAPH_DEPTH),
                Err(e) => prop_assert!(
                    (cyclic && e.contains("calls itself"))
                        || (out_of_range && e.contains("does not exist"))
                        || ((cyclic || deepest > MAX_SUBGRAPH_DEPTH) && e.contains("subgraphs deep")),
                    "{}", e
                ),
            }
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
