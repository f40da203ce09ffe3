//! ONNX admission: refuses a `ModelProto` that would make ONNX Runtime read a file, read process memory or
//! run code that is not its own kernels. Found by walking the protobuf wire format (field numbers from
//! onnx.proto of the onnx 1.23 package, cited at each use):
//!
//! - tensors with external data (`data_location` EXTERNAL or any `external_data` entry) anywhere ORT could
//!   load one: graph initializers and sparse initializers, node attributes (`t`, `tensors`, `sparse_tensor`,
//!   `sparse_tensors`), nested graphs (`g`, `graphs`: If/Loop/Scan bodies) at any depth, model-local
//!   functions (their nodes and attribute defaults) and training-info graphs. ONNX Runtime 1.31 reads a
//!   relative `location` (`../` included) from its working directory, Redis's `dir` (absolute paths and the
//!   in-memory marker `*/_ORT_MEM_ADDR_/*` it refuses itself). Refused with RedisAI's text (its ONNX Runtime
//!   was built with DISABLE_EXTERNAL_INITIALIZERS);
//! - ORT's `EPContext` node, whose `ep_cache_context` attribute can name a file to read, and the `ATen`,
//!   `PythonOp` and `PythonOpGrad` nodes, which call into PyTorch or Python;
//! - nodes of domains that ONNX Runtime does not implement itself and that are not model-local functions:
//!   they need a custom-op library (none is ever loaded);
//! - the `ort_config` metadata entry, from which ORT takes session options (profiling files, thread counts)
//!   when the server runs with ORT_LOAD_CONFIG_FROM_MODEL=1;
//! - ORT-format models (flatbuffers; ORT takes any blob with the `ORTM` identifier as one), which this
//!   check does not read;
//! - model-local functions that reach themselves (a node of a function's body, at any subgraph depth, whose
//!   `(domain, op_type)` names a local function), and graphs nested deeper than `MAX_GRAPH_DEPTH` levels, where
//!   a subgraph (If/Loop/Scan bodies) and a called function's body each count as one more level: ONNX Runtime
//!   and ONNX's shape inference expand a function call by recursing into its body, so a function that calls
//!   itself recurses until the stack overflows.
//!
//! A blob that is not a well-formed protobuf is let through: ONNX Runtime parses the whole `ModelProto` with
//! protobuf before it looks at anything, `protobuf::fields` accepts everything protobuf accepts, and this
//! walk only descends into fields that onnx.proto declares as messages, so ONNX Runtime refuses such a blob
//! itself ("Protobuf parsing failed"), with the error text clients already get.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::callgraph::{show_path, CallGraph, Expansion, Refusal};
use super::protobuf::{fields, Value};
use super::{show, Rejection};

/// RedisAI's text (ONNX Runtime's, from a build with DISABLE_EXTERNAL_INITIALIZERS).
pub const EXTERNAL_DATA: &str = "Initializer tensors with external data is not allowed.";

/// Nesting of graphs (If/Loop/Scan bodies inside bodies, and bodies of called local functions) refused past this:
/// it bounds the recursion, here and in ONNX Runtime. Protobuf's recursion limit (100 messages) already keeps
/// ONNX Runtime from parsing 33 levels of subgraphs, but calls nest without nesting messages: a chain of
/// functions, each calling the next, is flat protobuf that ONNX Runtime expands by recursion.
pub const MAX_GRAPH_DEPTH: u32 = 64;

/// How many nodes the calls of local functions may bring into the model (or into one function) when each is
/// expanded in place (each call counted as often as it is made; the model's own nodes do not count). ONNX
/// Runtime inlines every call, and its time grows with the square of what it inlines: 1.7 KB of functions
/// each calling the next twice took 1 s at AI.MODELSTORE 13 levels deep (12,000 nodes), 4 s at 14, 15 s at
/// 15 (bench/expansion.py, 2-core machine), and froze the main thread at RESTORE. The bound admits the first.
pub const MAX_EXPANDED_NODES: u64 = 1 << 14;

/// The operator domains ONNX Runtime 1.31 registers itself (the domain strings in libonnxruntime.so.1.31.1:
/// onnxruntime/core/graph/constants.h and ONNX's own), less `org.pytorch.aten` (its ATen op calls into
/// PyTorch). A node of any other domain needs a custom-op library, unless it calls a model-local function.
const ORT_DOMAINS: &[&[u8]] = &[
    b"",
    b"ai.onnx",
    b"ai.onnx.ml",
    b"ai.onnx.preview",
    b"ai.onnx.preview.training",
    b"ai.onnx.training",
    b"com.microsoft",
    b"com.microsoft.nchwc",
    b"com.microsoft.experimental",
    b"com.ms.internal.nhwc",
];

/// Ops of domain com.microsoft that reach outside ONNX Runtime, and why they are refused.
const DENIED_MS_OPS: &[(&[u8], &str)] = &[
    (b"EPContext", "which may read files"),
    (b"ATen", "which calls into PyTorch"),
    (b"PythonOp", "which runs Python code"),
    (b"PythonOpGrad", "which runs Python code"),
];

/// Why the walk stopped.
enum Stop {
    Refused(String),
    /// ONNX Runtime's own refusal of external data (`EXTERNAL_DATA`), which RedisAI sent as it was.
    ExternalData,
    /// Not a protobuf ONNX Runtime could parse: it reports that itself.
    Malformed,
}

type Walk = Result<(), Stop>;

fn refused<T>(msg: impl Into<String>) -> Result<T, Stop> {
    Err(Stop::Refused(msg.into()))
}

/// Calls `f` on every field of the message `buf`.
fn each<'a>(buf: &'a [u8], mut f: impl FnMut(u32, Value<'a>) -> Walk) -> Walk {
    for field in fields(buf) {
        let (number, value) = field.map_err(|_| Stop::Malformed)?;
        f(number, value)?;
    }
    Ok(())
}

/// Refuses `blob` if it asks ONNX Runtime for files, memory or code (see the module doc).
pub fn check(blob: &[u8]) -> Result<(), Rejection> {
    // ORT's IsOrtFormatModelBytes: flatbuffers' file identifier at bytes 4..8.
    if blob.get(4..8) == Some(b"ORTM") {
        return Err(Rejection::from(
            "ONNX model refused: ORT format models are not allowed (only ONNX protobuf models)",
        ));
    }
    let walk = local_functions(blob).and_then(|functions| {
        let n = functions.names.len();
        let walker = Walker {
            functions,
            function: Cell::new(None),
            calls: RefCell::default(),
            levels: RefCell::new(vec![1; n]),
            sizes: RefCell::new(vec![0; n + 1]),
        };
        walker.model(blob)?;
        walker.call_graph()
    });
    match walk {
        Ok(()) | Err(Stop::Malformed) => Ok(()),
        Err(Stop::Refused(msg)) => Err(Rejection::from(msg)),
        Err(Stop::ExternalData) => Err(Rejection { text: EXTERNAL_DATA.into(), verbatim: true }),
    }
}

/// `(domain, name)` of a FunctionProto (name = 1, domain = 10; the last occurrence of a singular field wins, as
/// in protobuf).
fn function_id(function: &[u8]) -> Result<(&[u8], &[u8]), Stop> {
    let (mut name, mut domain) = (&[][..], &[][..]);
    each(function, |n, v| {
        match (n, v.bytes()) {
            (1, Some(b)) => name = b,
            (10, Some(b)) => domain = b,
            _ => {}
        }
        Ok(())
    })?;
    Ok((domain, name))
}

/// Every model-local function (ModelProto.functions = 25), numbered in order. Two of the same `(domain, name)`
/// are one (their calls merged), and overloads (FunctionProto.overload) are not told apart: more calls only
/// make the cycle check stricter.
fn local_functions(model: &[u8]) -> Result<Functions<'_>, Stop> {
    let mut functions = Functions::default();
    each(model, |n, v| {
        if let (25, Some(function)) = (n, v.bytes()) {
            let id = function_id(function)?;
            if functions.get(id.0, id.1).is_none() {
                functions.index.insert((domain_key(id.0), id.1), functions.names.len());
                functions.names.push(id);
            }
        }
        Ok(())
    })?;
    Ok(functions)
}

/// ONNX Runtime reads the domain `ai.onnx` as the default domain.
fn domain_key(domain: &[u8]) -> &[u8] {
    if domain == b"ai.onnx" {
        b""
    } else {
        domain
    }
}

/// The model-local functions: `(domain, name)` of each, and its number by `(domain key, name)`.
#[derive(Default)]
struct Functions<'a> {
    names: Vec<(&'a [u8], &'a [u8])>,
    index: HashMap<(&'a [u8], &'a [u8]), usize>,
}

impl Functions<'_> {
    fn get(&self, domain: &[u8], op: &[u8]) -> Option<usize> {
        self.index.get(&(domain_key(domain), op)).copied()
    }
}

struct Walker<'a> {
    functions: Functions<'a>,
    /// The function whose body is being walked (`None`: the model's graphs).
    function: Cell<Option<usize>>,
    /// `(caller, callee, level)`: a node `level` graphs deep in the caller (`None`: the model) calls a function.
    calls: RefCell<Vec<(Option<usize>, usize, u32)>>,
    /// The graph levels each function's body uses by itself (its body is 1).
    levels: RefCell<Vec<u32>>,
    /// The nodes of each function's body (subgraphs included), by function number; the model's last.
    sizes: RefCell<Vec<u64>>,
}

impl<'a> Walker<'a> {
    /// ModelProto: graph = 7, metadata_props = 14, training_info = 20, functions = 25.
    fn model(&self, buf: &'a [u8]) -> Walk {
        each(buf, |n, v| match (n, v.bytes()) {
            (7, Some(graph)) => self.graph(graph, 1),
            (14, Some(entry)) => ort_config(entry),
            (20, Some(info)) => self.training_info(info),
            (25, Some(function)) => self.function(function),
            _ => Ok(()),
        })
    }

    /// TrainingInfoProto: initialization = 1, algorithm = 2 (ONNX Runtime ignores them for inference;
    /// walked anyway, so that nothing in the model escapes the check).
    fn training_info(&self, buf: &'a [u8]) -> Walk {
        each(buf, |n, v| match (n, v.bytes()) {
            (1 | 2, Some(graph)) => self.graph(graph, 1),
            _ => Ok(()),
        })
    }

    /// FunctionProto: node = 7, attribute_proto = 11 (default values of the function's attributes).
    fn function(&self, buf: &'a [u8]) -> Walk {
        let (domain, name) = function_id(buf)?;
        self.function.set(self.functions.get(domain, name));
        let walked = each(buf, |n, v| match (n, v.bytes()) {
            (7, Some(node)) => self.node(node, 1),
            (11, Some(attribute)) => self.attribute(attribute, 1),
            _ => Ok(()),
        });
        self.function.set(None);
        walked
    }

    /// Refuses a local function that reaches itself, or graphs and calls nested deeper than `MAX_GRAPH_DEPTH`.
    fn call_graph(&self) -> Walk {
        let names = &self.functions.names;
        let show_fn = |f: usize| format!("function '{}' of domain '{}'", show(names[f].1), show(names[f].0));
        let mut graph = CallGraph::new(names.len());
        for (f, &levels) in self.levels.borrow().iter().enumerate() {
            graph.uses(f, levels);
        }
        let sizes = self.sizes.borrow();
        for (f, &size) in sizes[..names.len()].iter().enumerate() {
            graph.weigh(f, size);
        }
        let calls = self.calls.borrow();
        for &(caller, callee, level) in calls.iter() {
            if let Some(caller) = caller {
                graph.call(caller, callee, level);
            }
        }
        let too_deep = |what: String| {
            refused(format!(
                "ONNX model refused: subgraphs and function calls nested deeper than {MAX_GRAPH_DEPTH} levels ({what})"
            ))
        };
        let heights = match graph.heights(MAX_GRAPH_DEPTH) {
            Ok(heights) => heights,
            Err(Refusal::Cycle(path)) => {
                return refused(format!(
                    "ONNX model refused: {} calls itself ({}): recursive functions are not allowed",
                    show_fn(path[0]),
                    show_path(&path, |f| show(names[f].1))
                ))
            }
            Err(Refusal::TooDeep(f)) => return too_deep(format!("from {}", show_fn(f))),
        };
        // The model's graphs: a call `level` deep puts the callee's body one level below.
        for &(caller, callee, level) in calls.iter() {
            if caller.is_none() && level.saturating_add(heights[callee]) > MAX_GRAPH_DEPTH {
                return too_deep(format!("the graph calls {}", show_fn(callee)));
            }
        }
        let root_calls = calls.iter().filter(|c| c.0.is_none()).map(|c| c.1);
        let what = match graph.expansion(&heights, root_calls, MAX_EXPANDED_NODES) {
            Expansion::Fits => return Ok(()),
            Expansion::Node(f) => show_fn(f),
            Expansion::Root => "the model".to_string(),
        };
        refused(format!(
            "ONNX model refused: {what} calls local functions that expand to more than {MAX_EXPANDED_NODES} nodes \
             (the calls fan out)"
        ))
    }

    /// GraphProto: node = 1, initializer = 5, sparse_initializer = 15. `depth` counts graphs from the top.
    fn graph(&self, buf: &'a [u8], depth: u32) -> Walk {
        if depth > MAX_GRAPH_DEPTH {
            return refused(format!("ONNX model refused: subgraphs nested deeper than {MAX_GRAPH_DEPTH} levels"));
        }
        if let Some(f) = self.function.get() {
            let mut levels = self.levels.borrow_mut();
            levels[f] = levels[f].max(depth);
        }
        each(buf, |n, v| match (n, v.bytes()) {
            (1, Some(node)) => self.node(node, depth),
            (5, Some(tensor)) => self::tensor(tensor),
            (15, Some(sparse)) => sparse_tensor(sparse),
            _ => Ok(()),
        })
    }

    /// NodeProto: name = 3, op_type = 4, attribute = 5, domain = 7.
    fn node(&self, buf: &'a [u8], depth: u32) -> Walk {
        let (mut name, mut op, mut domain) = (&[][..], &[][..], &[][..]);
        each(buf, |n, v| {
            match (n, v.bytes()) {
                (3, Some(b)) => name = b,
                (4, Some(b)) => op = b,
                (7, Some(b)) => domain = b,
                _ => {}
            }
            Ok(())
        })?;
        self.op(name, op, domain)?;
        {
            let mut sizes = self.sizes.borrow_mut();
            let model = sizes.len() - 1;
            sizes[self.function.get().unwrap_or(model)] += 1;
        }
        if let Some(callee) = self.functions.get(domain, op) {
            self.calls.borrow_mut().push((self.function.get(), callee, depth));
        }
        each(buf, |n, v| match (n, v.bytes()) {
            (5, Some(attribute)) => self.attribute(attribute, depth),
            _ => Ok(()),
        })
    }

    fn op(&self, name: &[u8], op: &[u8], domain: &[u8]) -> Walk {
        let what = || {
            let node = if name.is_empty() { "a node".to_string() } else { format!("node '{}'", show(name)) };
            format!("ONNX model refused: {node} uses op")
        };
        if domain == b"com.microsoft" {
            if let Some((_, why)) = DENIED_MS_OPS.iter().find(|(denied, _)| *denied == op) {
                return refused(format!("{} {}, {why}", what(), show(op)));
            }
        }
        if ORT_DOMAINS.contains(&domain) || self.functions.get(domain, op).is_some() {
            return Ok(());
        }
        if domain == b"org.pytorch.aten" {
            return refused(format!("{} {} of domain org.pytorch.aten, which calls into PyTorch", what(), show(op)));
        }
        refused(format!(
            "{} '{}' of domain '{}', which ONNX Runtime does not implement (no custom-op libraries)",
            what(),
            show(op),
            show(domain)
        ))
    }

    /// AttributeProto: t = 5, g = 6, tensors = 10, graphs = 11, sparse_tensor = 22, sparse_tensors = 23.
    fn attribute(&self, buf: &'a [u8], depth: u32) -> Walk {
        each(buf, |n, v| match (n, v.bytes()) {
            (5 | 10, Some(t)) => tensor(t),
            (22 | 23, Some(sparse)) => sparse_tensor(sparse),
            (6 | 11, Some(graph)) => self.graph(graph, depth + 1),
            _ => Ok(()),
        })
    }
}

/// TensorProto: external_data = 13 (repeated StringStringEntryProto), data_location = 14 (enum; EXTERNAL = 1).
fn tensor(buf: &[u8]) -> Walk {
    each(buf, |n, v| match (n, v) {
        (13, Value::Bytes(_)) => Err(Stop::ExternalData),
        // protobuf reads an enum varint as int32, keeping the low 32 bits.
        (14, Value::Varint(location)) if location as u32 == 1 => Err(Stop::ExternalData),
        _ => Ok(()),
    })
}

/// SparseTensorProto: values = 1, indices = 2.
fn sparse_tensor(buf: &[u8]) -> Walk {
    each(buf, |n, v| match (n, v.bytes()) {
        (1 | 2, Some(t)) => tensor(t),
        _ => Ok(()),
    })
}

/// StringStringEntryProto (ModelProto.metadata_props): key = 1.
fn ort_config(buf: &[u8]) -> Walk {
    let mut key = &[][..];
    each(buf, |n, v| {
        if let (1, Some(b)) = (n, v.bytes()) {
            key = b;
        }
        Ok(())
    })?;
    if key == b"ort_config" {
        return refused("ONNX model refused: metadata 'ort_config' would set ONNX Runtime's session options");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A tiny protobuf encoder for hand-built messages.
    enum F {
        V(u32, u64),
        B(u32, Vec<u8>),
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn msg(fields: &[F]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in fields {
            match f {
                F::V(n, v) => {
                    varint(u64::from(*n) << 3, &mut out);
                    varint(*v, &mut out);
                }
                F::B(n, b) => {
                    varint(u64::from(*n) << 3 | 2, &mut out);
                    varint(b.len() as u64, &mut out);
                    out.extend_from_slice(b);
                }
            }
        }
        out
    }

    fn s(n: u32, text: &str) -> F {
        F::B(n, text.as_bytes().to_vec())
    }

    /// A tensor "w" with `location: secret.txt`.
    fn external_tensor() -> Vec<u8> {
        let entry = msg(&[s(1, "location"), s(2, "secret.txt")]);
        msg(&[F::V(1, 4), F::V(2, 1), s(8, "w"), F::B(13, entry), F::V(14, 1)])
    }

    fn plain_tensor() -> Vec<u8> {
        msg(&[F::V(1, 1), F::V(2, 1), s(8, "w"), F::B(9, vec![0; 4])])
    }

    fn node(name: &str, op: &str, domain: &str, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut f = vec![s(1, "x"), s(2, "y"), s(3, name), s(4, op), s(7, domain)];
        f.extend(attrs.iter().map(|a| F::B(5, a.clone())));
        msg(&f)
    }

    fn graph(nodes: &[Vec<u8>], extra: Vec<F>) -> Vec<u8> {
        let mut f: Vec<F> = nodes.iter().map(|n| F::B(1, n.clone())).collect();
        f.push(s(2, "g"));
        f.extend(extra);
        msg(&f)
    }

    fn model(graph: Vec<u8>, extra: Vec<F>) -> Vec<u8> {
        let opset = msg(&[s(1, ""), F::V(2, 17)]);
        let mut f = vec![F::V(1, 8), s(2, "test"), F::B(8, opset), F::B(7, graph)];
        f.extend(extra);
        msg(&f)
    }

    fn identity() -> Vec<u8> {
        node("id", "Identity", "", &[])
    }

    fn graph_attr(name: &str, g: Vec<u8>) -> Vec<u8> {
        msg(&[s(1, name), F::V(20, 5), F::B(6, g)])
    }

    /// An If node whose then-branch is `body`.
    fn if_node(body: Vec<u8>) -> Vec<u8> {
        let other = graph(&[identity()], vec![]);
        node("if", "If", "", &[graph_attr("then_branch", body), graph_attr("else_branch", other)])
    }

    fn refusal(blob: &[u8]) -> String {
        check(blob).expect_err("refused").text
    }

    #[test]
    fn plain_models_pass() {
        let g = graph(&[identity()], vec![F::B(5, plain_tensor())]);
        assert_eq!(check(&model(g, vec![])), Ok(()));
        // subgraphs, contrib ops, ai.onnx alias, ML ops
        let g = graph(
            &[
                if_node(graph(&[identity()], vec![])),
                node("a", "FusedMatMul", "com.microsoft", &[]),
                node("b", "Relu", "ai.onnx", &[]),
                node("c", "LinearRegressor", "ai.onnx.ml", &[]),
                node("d", "ReorderInput", "com.microsoft.nchwc", &[]),
            ],
            vec![],
        );
        assert_eq!(check(&model(g, vec![])), Ok(()));
    }

    #[test]
    fn external_initializer() {
        let g = graph(&[identity()], vec![F::B(5, external_tensor())]);
        assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        // data_location alone, external_data alone
        for t in [msg(&[s(8, "w"), F::V(14, 1)]), msg(&[s(8, "w"), F::B(13, msg(&[s(1, "location")]))])] {
            let g = graph(&[identity()], vec![F::B(5, t)]);
            assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        }
        // protobuf keeps the low 32 bits of an enum varint: 2^32 + 1 is EXTERNAL
        let g = graph(&[identity()], vec![F::B(5, msg(&[F::V(14, (1 << 32) + 1)]))]);
        assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        // DEFAULT is fine
        let g = graph(&[identity()], vec![F::B(5, msg(&[F::V(14, 0)]))]);
        assert_eq!(check(&model(g, vec![])), Ok(()));
    }

    #[test]
    fn sparse_initializer() {
        for field in [1, 2] {
            let sparse = msg(&[F::B(field, external_tensor()), F::V(3, 4)]);
            let g = graph(&[identity()], vec![F::B(15, sparse)]);
            assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA, "field {field}");
        }
    }

    #[test]
    fn node_attributes() {
        let sparse = msg(&[F::B(1, external_tensor())]);
        for attr in [
            msg(&[s(1, "value"), F::V(20, 4), F::B(5, external_tensor())]),
            msg(&[s(1, "value"), F::V(20, 9), F::B(10, plain_tensor()), F::B(10, external_tensor())]),
            msg(&[s(1, "sparse_value"), F::V(20, 11), F::B(22, sparse.clone())]),
            msg(&[s(1, "x"), F::V(20, 12), F::B(23, sparse.clone())]),
        ] {
            let g = graph(&[node("c", "Constant", "", &[attr])], vec![]);
            assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        }
    }

    #[test]
    fn nested_graphs() {
        let bad = graph(&[identity()], vec![F::B(5, external_tensor())]);
        // If (g), Loop/Scan-like (graphs), and three levels down
        let g = graph(&[if_node(bad.clone())], vec![]);
        assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        let graphs =
            msg(&[s(1, "bodies"), F::V(20, 10), F::B(11, graph(&[identity()], vec![])), F::B(11, bad.clone())]);
        let g = graph(&[node("l", "Loop", "", &[graphs])], vec![]);
        assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
        let deep = (0..3).fold(bad, |inner, _| graph(&[if_node(inner)], vec![]));
        assert_eq!(refusal(&model(deep, vec![])), EXTERNAL_DATA);
        // a Constant inside a subgraph
        let constant = node("k", "Constant", "", &[msg(&[s(1, "value"), F::B(5, external_tensor())])]);
        let g = graph(&[if_node(graph(&[constant], vec![]))], vec![]);
        assert_eq!(refusal(&model(g, vec![])), EXTERNAL_DATA);
    }

    #[test]
    fn depth_bomb() {
        let nest =
            |levels: u32| (1..levels).fold(graph(&[identity()], vec![]), |inner, _| graph(&[if_node(inner)], vec![]));
        assert_eq!(check(&model(nest(MAX_GRAPH_DEPTH), vec![])), Ok(()));
        let err = refusal(&model(nest(MAX_GRAPH_DEPTH + 1), vec![]));
        assert!(err.contains("nested deeper than 64"), "{err}");
        // far deeper: no stack overflow, refused at the limit
        let mut g = graph(&[identity()], vec![]);
        for _ in 0..5000 {
            g = graph(&[node("", "If", "", &[graph_attr("then_branch", g)])], vec![]);
        }
        assert!(refusal(&model(g, vec![])).contains("nested deeper"));
    }

    fn function(name: &str, domain: &str, nodes: &[Vec<u8>], attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut f = vec![s(1, name), s(4, "x"), s(5, "y"), s(10, domain)];
        f.extend(nodes.iter().map(|n| F::B(7, n.clone())));
        f.extend(attrs.iter().map(|a| F::B(11, a.clone())));
        f.push(F::B(9, msg(&[s(1, ""), F::V(2, 17)])));
        msg(&f)
    }

    #[test]
    fn local_functions() {
        let call = node("call", "MyFn", "my.domain", &[]);
        // a call to a model-local function of a custom domain is fine
        let ok = function("MyFn", "my.domain", &[identity()], &[]);
        assert_eq!(check(&model(graph(std::slice::from_ref(&call), vec![]), vec![F::B(25, ok)])), Ok(()));
        // external data inside the function body, or in an attribute default
        let constant = node("k", "Constant", "", &[msg(&[s(1, "value"), F::B(5, external_tensor())])]);
        let bad = function("MyFn", "my.domain", &[constant], &[]);
        assert_eq!(refusal(&model(graph(std::slice::from_ref(&call), vec![]), vec![F::B(25, bad)])), EXTERNAL_DATA);
        let default = msg(&[s(1, "value"), F::V(20, 4), F::B(5, external_tensor())]);
        let bad = function("MyFn", "my.domain", &[identity()], &[default]);
        assert_eq!(refusal(&model(graph(std::slice::from_ref(&call), vec![]), vec![F::B(25, bad)])), EXTERNAL_DATA);
        // an unused function is checked too
        let unused = function("Other", "my.domain", &[node("e", "EPContext", "com.microsoft", &[])], &[]);
        assert!(refusal(&model(graph(&[identity()], vec![]), vec![F::B(25, unused)])).contains("EPContext"));
        // a subgraph inside a function node
        let inner = graph(&[identity()], vec![F::B(5, external_tensor())]);
        let bad = function("MyFn", "my.domain", &[if_node(inner)], &[]);
        assert_eq!(refusal(&model(graph(std::slice::from_ref(&call), vec![]), vec![F::B(25, bad)])), EXTERNAL_DATA);
        // same name, other domain: not a local function
        let other = function("MyFn", "other.domain", &[identity()], &[]);
        let err = refusal(&model(graph(&[call], vec![]), vec![F::B(25, other)]));
        assert!(err.contains("'MyFn' of domain 'my.domain'"), "{err}");
    }

    /// Model-local function `name` of domain "d" whose body calls each of `callees` (one node each).
    fn calling(name: &str, callees: &[&str]) -> Vec<u8> {
        let nodes: Vec<Vec<u8>> = callees.iter().map(|c| node("", c, "d", &[])).collect();
        function(name, "d", &nodes, &[])
    }

    fn with_functions(main: Vec<Vec<u8>>, functions: Vec<Vec<u8>>) -> Vec<u8> {
        model(graph(&main, vec![]), functions.into_iter().map(|f| F::B(25, f)).collect())
    }

    #[test]
    fn a_function_calling_itself_is_refused() {
        let call = node("call", "Leak", "d", &[]);
        let m = with_functions(vec![call.clone()], vec![calling("Leak", &["Leak"])]);
        assert_eq!(
            refusal(&m),
            "ONNX model refused: function 'Leak' of domain 'd' calls itself (Leak -> Leak): recursive functions are \
             not allowed"
        );
        // from inside a subgraph of its body (an If branch), and with nobody calling it
        let f = function("Leak", "d", &[if_node(graph(&[node("", "Leak", "d", &[])], vec![]))], &[]);
        assert!(refusal(&with_functions(vec![identity()], vec![f])).contains("calls itself (Leak -> Leak)"));
        // the default domain under its other name
        let f = function("F", "", &[node("", "F", "ai.onnx", &[])], &[]);
        assert!(refusal(&with_functions(vec![identity()], vec![f])).contains("calls itself (F -> F)"));
        // through an attribute's default graph
        let default = msg(&[s(1, "body"), F::V(20, 5), F::B(6, graph(&[node("", "Leak", "d", &[])], vec![]))]);
        let f = function("Leak", "d", &[identity()], &[default]);
        assert!(refusal(&with_functions(vec![call], vec![f])).contains("calls itself"));
    }

    #[test]
    fn call_cycles_are_refused() {
        // A -> B -> A, B's call inside a Loop body
        let loop_body = msg(&[s(1, "body"), F::V(20, 5), F::B(6, graph(&[node("", "A", "d", &[])], vec![]))]);
        let b = function("B", "d", &[node("l", "Loop", "", &[loop_body])], &[]);
        let m = with_functions(vec![node("c", "A", "d", &[])], vec![calling("A", &["B"]), b]);
        assert_eq!(
            refusal(&m),
            "ONNX model refused: function 'A' of domain 'd' calls itself (A -> B -> A): recursive functions are not \
             allowed"
        );
        // the same names in another domain are other functions: no cycle
        let other = function("A", "e", &[identity()], &[]);
        let m = with_functions(vec![node("c", "A", "d", &[])], vec![calling("A", &["A2"]), calling("A2", &[]), other]);
        assert_eq!(check(&m), Ok(()));
    }

    /// F0 -> F1 -> ... -> F(n-1), the graph calling F0.
    fn chain(n: usize) -> Vec<u8> {
        let names: Vec<String> = (0..n).map(|i| format!("F{i}")).collect();
        let functions = (0..n)
            .map(|i| if i + 1 < n { calling(&names[i], &[&names[i + 1]]) } else { calling(&names[i], &[]) })
            .collect();
        with_functions(vec![node("c", "F0", "d", &[])], functions)
    }

    /// F0 calls F1 twice, ..., F(n-1) calls nothing: 2^(n-1) calls in n small functions; the graph calls F0.
    fn fan_out(n: usize) -> Vec<u8> {
        let names: Vec<String> = (0..n).map(|i| format!("F{i}")).collect();
        let functions =
            (0..n)
                .map(|i| {
                    if i + 1 < n {
                        calling(&names[i], &[&names[i + 1], &names[i + 1]])
                    } else {
                        calling(&names[i], &[])
                    }
                })
                .collect();
        with_functions(vec![node("c", "F0", "d", &[])], functions)
    }

    #[test]
    fn call_fan_out_is_bounded() {
        // F0's calls bring in 2^n - 4 nodes: 16,380 at 14 levels, 32,764 at 15
        assert_eq!(check(&fan_out(14)), Ok(()));
        assert_eq!(
            refusal(&fan_out(15)),
            "ONNX model refused: function 'F0' of domain 'd' calls local functions that expand to more than 16384 \
             nodes (the calls fan out)"
        );
        assert!(refusal(&fan_out(60)).contains("expand to more than 16384 nodes"));
        // the model's own calls: 20 calls of a function of 1,000 nodes
        let big = function("B", "d", &vec![identity(); 1000], &[]);
        let calls: Vec<Vec<u8>> = (0..20).map(|_| node("c", "B", "d", &[])).collect();
        assert!(refusal(&with_functions(calls, vec![big])).contains("the model calls local functions"));
        // a model of many nodes and no calls is not refused for its size
        assert_eq!(check(&with_functions(vec![identity(); 100_000], vec![])), Ok(()));
    }

    #[test]
    fn calls_count_as_levels() {
        // the graph is level 1, each function's body one more
        let max = MAX_GRAPH_DEPTH as usize;
        assert_eq!(check(&chain(max - 1)), Ok(()));
        let err = refusal(&chain(max));
        assert_eq!(
            err,
            "ONNX model refused: subgraphs and function calls nested deeper than 64 levels (the graph calls function \
             'F0' of domain 'd')"
        );
        // a chain no graph calls: its own depth
        let functions: Vec<Vec<u8>> = (0..=max)
            .map(|i| calling(&format!("F{i}"), &[format!("F{}", i + 1).as_str()][..usize::from(i < max)]))
            .collect();
        assert!(refusal(&with_functions(vec![identity()], functions)).contains("(from function 'F0' of domain 'd')"));
        // far deeper: stops at the bound
        assert!(refusal(&chain(20_000)).contains("nested deeper than 64 levels"));
        // subgraphs and calls add up: a call 60 graphs deep into a function whose body nests 4 graphs
        let deep_fn = |levels: u32| {
            let top = (1..levels).fold(identity(), |inner, _| if_node(graph(&[inner], vec![])));
            function("G", "d", &[top], &[])
        };
        let call_at = |depth: u32| {
            (1..depth).fold(graph(&[node("", "G", "d", &[])], vec![]), |inner, _| graph(&[if_node(inner)], vec![]))
        };
        assert_eq!(check(&model(call_at(60), vec![F::B(25, deep_fn(4))])), Ok(()));
        assert!(refusal(&model(call_at(60), vec![F::B(25, deep_fn(5))])).contains("the graph calls function 'G'"));
        assert!(refusal(&model(call_at(61), vec![F::B(25, deep_fn(4))])).contains("nested deeper than 64"));
    }

    #[test]
    fn legitimate_local_functions_pass() {
        // a diamond: the graph calls A and B, both call C, C calls nothing; a Loop in A calls C again
        let loop_body = msg(&[s(1, "body"), F::V(20, 5), F::B(6, graph(&[node("", "C", "d", &[])], vec![]))]);
        let a = function("A", "d", &[node("", "C", "d", &[]), node("l", "Loop", "", &[loop_body])], &[]);
        let m = with_functions(
            vec![node("a", "A", "d", &[]), node("b", "B", "d", &[])],
            vec![a, calling("B", &["C"]), calling("C", &[])],
        );
        assert_eq!(check(&m), Ok(()));
    }

    #[test]
    fn denied_and_custom_ops() {
        let one = |n: Vec<u8>| refusal(&model(graph(&[n], vec![]), vec![]));
        let ep = node("ctx", "EPContext", "com.microsoft", &[msg(&[s(1, "ep_cache_context"), s(4, "/etc/passwd")])]);
        assert_eq!(one(ep), "ONNX model refused: node 'ctx' uses op EPContext, which may read files");
        assert!(one(node("", "ATen", "com.microsoft", &[])).contains("a node uses op ATen, which calls into PyTorch"));
        assert!(one(node("p", "PythonOp", "com.microsoft", &[])).contains("runs Python code"));
        assert!(one(node("p", "ATen", "org.pytorch.aten", &[])).contains("PyTorch"));
        assert_eq!(
            one(node("n", "Foo", "my.ops", &[])),
            "ONNX model refused: node 'n' uses op 'Foo' of domain 'my.ops', which ONNX Runtime does not implement \
             (no custom-op libraries)"
        );
        // inside a subgraph, and in a training-info graph
        let g = graph(&[if_node(graph(&[node("n", "Foo", "my.ops", &[])], vec![]))], vec![]);
        assert!(refusal(&model(g, vec![])).contains("'Foo'"));
        let info = msg(&[F::B(2, graph(&[node("n", "EPContext", "com.microsoft", &[])], vec![]))]);
        assert!(refusal(&model(graph(&[identity()], vec![]), vec![F::B(20, info)])).contains("EPContext"));
        // the last domain of a node wins, as in protobuf
        let n = msg(&[s(3, "n"), s(4, "EPContext"), s(7, "my.ops"), s(7, "com.microsoft")]);
        assert!(one(n).contains("EPContext, which may read files"));
        let n = msg(&[s(3, "n"), s(4, "Relu"), s(7, "my.ops"), s(7, "")]);
        assert_eq!(check(&model(graph(&[n], vec![]), vec![])), Ok(()));
        // names are escaped: nothing can break the reply
        let err = one(node("a\r\nb", "Foo", "x\u{7f}", &[]));
        assert!(err.contains(r"node 'a\r\nb'") && err.contains(r"'x\x7f'"), "{err}");
        let err = one(node(&"n".repeat(1000), "Foo", "d", &[]));
        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn ort_config_and_ort_format() {
        let meta = msg(&[s(1, "ort_config"), s(2, r#"{"session_options": {"enable_profiling": 1}}"#)]);
        let err = refusal(&model(graph(&[identity()], vec![]), vec![F::B(14, meta)]));
        assert!(err.contains("ort_config"), "{err}");
        let meta = msg(&[s(1, "author"), s(2, "me")]);
        assert_eq!(check(&model(graph(&[identity()], vec![]), vec![F::B(14, meta)])), Ok(()));
        let err = refusal(b"\x10\x00\x00\x00ORTM\x00\x00\x00\x00");
        assert!(err.contains("ORT format"), "{err}");
    }

    #[test]
    fn malformed_is_left_to_onnx_runtime() {
        // what ONNX Runtime cannot parse it refuses itself, with its own text
        for bad in [&b"not an onnx model"[..], b"\x08\x08\x12\x00garbage", b"", b"\xff\xff"] {
            assert_eq!(check(bad), Ok(()), "{bad:?}");
        }
        // a truncated good model, and a model whose external tensor comes after a malformed field
        let good = model(graph(&[identity()], vec![F::B(5, plain_tensor())]), vec![]);
        for cut in 0..good.len() {
            assert_eq!(check(&good[..cut]), Ok(()));
        }
        // a group (protobuf parses and skips it) does not hide what follows
        let mut m = model(graph(&[identity()], vec![]), vec![]);
        m.extend_from_slice(&[0x9b, 0x01, 0x08, 0x01, 0x9c, 0x01]); // group 19 { 1: 1 }
        m.extend(msg(&[F::B(7, graph(&[identity()], vec![F::B(5, external_tensor())]))]));
        assert_eq!(refusal(&m), EXTERNAL_DATA);
    }

    proptest::proptest! {
        #![proptest_config(crate::commands::fuzz::config())]

        /// Any bytes: an answer, never a panic.
        #[test]
        fn any_bytes(blob in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = check(&blob);
        }

        /// Random local-function libraries (a chain, to get deep ones, plus random calls, some from inside an If
        /// branch): never a panic, and refused exactly when a function reaches itself or levels pass the bound.
        #[test]
        fn random_function_libraries(
            chain_len in 0usize..70,
            extra in proptest::collection::vec((0usize..80, 0usize..80, proptest::prelude::any::<bool>()), 0..16),
        ) {
            let n = chain_len.max(1) + 8;
            let mut calls: Vec<(usize, usize, bool)> = (1..chain_len).map(|i| (i - 1, i, false)).collect();
            calls.extend(extra.iter().map(|&(a, b, nested)| (a % n, b % n, nested)));
            let functions: Vec<Vec<u8>> = (0..n)
                .map(|f| {
                    let mut body = vec![identity()];
                    for &(_, b, nested) in calls.iter().filter(|c| c.0 == f) {
                        let call = node("", &format!("F{b}"), "d", &[]);
                        body.push(if nested { if_node(graph(&[call], vec![])) } else { call });
                    }
                    function(&format!("F{f}"), "d", &body, &[])
                })
                .collect();
            let result = check(&with_functions(vec![node("c", "F0", "d", &[])], functions));
            // the reference: heights by relaxation (a call in an If branch is 2 levels into the caller)
            let mut height = vec![1u32; n];
            let mut cyclic = false;
            for round in 0..=n {
                let mut changed = false;
                for &(a, b, nested) in &calls {
                    let h = height[b] + if nested { 2 } else { 1 };
                    let own = if calls.iter().any(|c| c.0 == a && c.2) { 2 } else { 1 };
                    if height[a] < h.max(own) {
                        height[a] = h.max(own);
                        changed = true;
                    }
                }
                if !changed {
                    break;
                }
                cyclic = round == n;
            }
            let too_deep = height.iter().any(|&h| h > MAX_GRAPH_DEPTH) || 1 + height[0] > MAX_GRAPH_DEPTH;
            match result {
                Ok(()) => proptest::prop_assert!(!cyclic && !too_deep),
                Err(Rejection { text: e, .. }) => {
                    proptest::prop_assert!(cyclic || too_deep, "{}", e);
                    proptest::prop_assert!(e.contains("calls itself") || e.contains("nested deeper"), "{}", e);
                }
            }
        }

        /// Models (committed, and one with every construct above) with a few bytes changed: never a panic.
        #[test]
        fn mutated_models(
            which in 0usize..16,
            edits in proptest::collection::vec((proptest::prelude::any::<u32>(), proptest::prelude::any::<u8>()), 1..8),
        ) {
            let mut models = committed();
            let call = node("call", "MyFn", "my.domain", &[]);
            let sparse = msg(&[F::B(1, plain_tensor())]);
            let g = graph(&[if_node(graph(&[call], vec![F::B(15, sparse)]))], vec![F::B(5, plain_tensor())]);
            models.push(model(g, vec![F::B(25, function("MyFn", "my.domain", &[identity()], &[]))]));
            let mut blob = models[which % models.len()].clone();
            for (at, byte) in edits {
                let n = blob.len();
                blob[at as usize % n] = byte;
            }
            let _ = check(&blob);
        }
    }

    fn committed() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "onnx") {
                out.push(std::fs::read(&path).unwrap());
            }
        }
        out
    }

    #[test]
    fn committed_models_pass() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "onnx") {
                let blob = std::fs::read(&path).unwrap();
                assert_eq!(check(&blob), Ok(()), "{}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 9, "{seen} models in {}", dir.display());
    }
}
