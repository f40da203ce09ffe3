"""Structured generators of the protocol fuzz (protocol_fuzz.py; issue 21, item 7): crafted models of all four
backends and scripts that change their own keys, each drawn at random from the fuzz's seed.

The mutations of protocol_fuzz.py reach the parsers and the handlers but never build a model with structure;
these cases do, and each is a short sequence of commands sent in order on one connection (so the fuzz's other
traffic runs beside it), with what each reply must be:

  TF      GraphDefs (tests/flow/helpers/tf_graphs.py's encoder): library functions that call each other in a
          cycle of random length through every way a function can be named (a node's op, PartitionedCall /
          StatefulPartitionedCall `f`, If / StatelessIf branches, While cond / body, Case `branches`,
          SymbolicGradient, funcs nested in funcs' attrs and in list attrs, a function's own attrs, its argument
          attrs and signature defaults, GradientDef entries); call chains around and far above the depth bound
          (32), built from calls TensorFlow runs; call fan-out (each level calling the next 2 or 3 times, within
          the bound); Fill, Tile, BroadcastTo, Reshape, Range, OneHot, Pad and Empty sized by an input's values.
  TFLITE  flatbuffers: subgraph tables where WHILE, IF, CALL_ONCE, CALL and the STABLEHLO control-flow ops form
          cycles, name their own subgraph, name subgraphs that do not exist or leave their options out; IF
          chains around the bound (32) that LiteRT runs; IF fan-out; FILL, BROADCAST_TO, TILE and RESHAPE sized
          by an input.
  ONNX    model-local functions calling each other in a cycle (also from If / Loop bodies inside them, and
          cycles the graph never reaches); function call chains, If / Loop nesting, and both mixed, around the
          bound (64) and far above it; function fan-out; ConstantOfShape, Expand, Tile, Range and Pad sized by an
          input.
  TORCH   TorchScript archives (torch_add.pt with its code rewritten) and scripts: methods / functions that call
          each other in a cycle, call chains of 1 to 3,000, call fan-out, code nested around the bound (256),
          loops whose trip count comes from an input, and zeros / empty / ones / full / arange / repeat / expand
          / new_zeros / cat sized by an input.

Models are stored with AI.MODELSTORE, some with AI.MODELSET, some through RESTORE of their payload (the DUMP
format), then executed with small inputs. Sizes taken from inputs are either small (the run must succeed and
compute the right values) or far past any memory bound (4e11 bytes and more, or past the 64-bit range): a
refused allocation is what is tested, never the machine's memory. What must hold: a cycle, a dangling index or
nesting past a bound is refused (MODELSTORE replies an error; a RESTOREd copy replies an error when run); a
legitimate model within the bounds stores, runs and computes the right values; every other case gets a reply.

Scripts (`script_keys`): a TorchScript entry point runs, through redis.execute, a random sequence of DEL,
UNLINK, SET, RENAME, EXPIRE, PEXPIRE, GET, TYPE and EXISTS on its own input keys, its output key, the key of the
script itself, a model (which it may then run with redisAI.model_execute) and tensors of 128 KiB (adopted BLOB
arguments), from AI.SCRIPTEXECUTE or from inside AI.DAGEXECUTE. When the run succeeds its output must hold input
+ 1, and a tensor of 128 KiB no command touches must keep its bytes.

  crafted.py --port P [--kind KIND]... [--cases N] [--seed S] [--slow] [-v]
      (cases one by one against a running server: each case, its problems, and at the end the replies by kind)
"""

import io
import math
import re
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402,F401  (puts tests/flow on sys.path)
from helpers import tf_graphs as tfg  # noqa: E402
from helpers.onnx_models import blob as onnx_blob  # noqa: E402
from helpers.resp import RespError  # noqa: E402
from helpers.torch_models import entry, pt_blob  # noqa: E402
from helpers.rdb import model_payload  # noqa: E402
from helpers.tflite_models import _flatbuffer, fanout_model as tflite_fanout_model  # noqa: E402

BACKEND_CODE = {"TF": 0, "TFLITE": 1, "TORCH": 2, "ONNX": 3}  # in RDB / DUMP payloads
TF_CALL_DEPTH, TFLITE_DEPTH, ONNX_DEPTH, TORCH_NESTING = 32, 32, 64, 256  # docs/security.md
# What calls may bring in once expanded (docs/security.md, "Call expansion"); TORCH: functions deep
TF_EXPANDED, ONNX_EXPANDED, TFLITE_EXPANDED, TORCH_CALL_DEPTH = 1 << 18, 1 << 14, 1 << 16, 64


def brought_in(own, fan, levels, leaf):
    """What a call of level 0 brings in when each of `levels` levels (`own` nodes each, calling the next `fan`
    times) is expanded in place down to a leaf of `leaf` nodes: the size of one call, counted as admission does."""
    size = leaf
    for _ in range(levels):
        size = own + fan * size
    return size
BIG_FLOATS = 32768  # 128 KiB by BLOB: a tensor that adopts its argument (64 KiB or more)

# --------------------------------------------------------------------------------------------------
# cases and checks


class Case:
    """A crafted case: commands sent in order on one connection, each with a check of its reply."""

    def __init__(self, kind, desc):
        self.kind, self.desc = kind, desc
        self.steps = []  # (argv, check, label)
        self.replies = {}  # label -> reply, filled in as the replies come

    def add(self, argv, check=None, label=None):
        self.steps.append((list(argv), check, label))
        return self

    def outcome(self):
        """What the store and the run replied, in short (for the statistics)."""
        def short(label):
            reply = self.replies.get(label)
            if label not in self.replies:
                return None
            if isinstance(reply, RespError):
                return "error " + re.sub(r"'[^']*'|\d+", "_", reply)[:48]
            return "OK" if is_ok(reply) else "array" if isinstance(reply, list) else str(reply)[:20]
        parts = [f"{label} {short(label)}" for label in ("store", "run", "exec") if short(label) is not None]
        return ", ".join(parts) or "no store"

    def verify(self, index, reply):
        """The problem with the reply to step `index`, or None."""
        argv, check, label = self.steps[index]
        if label:
            self.replies[label] = reply
        problem = check(reply, self) if check else None
        return f"{self.kind} ({self.desc}): {argv[0]} {label or ''}: {problem}" if problem else None


def _show(reply):
    text = repr(reply)
    return text if len(text) < 300 else text[:300] + "..."


def is_ok(reply):
    return reply == "OK" and not isinstance(reply, RespError)


def ok(reply, case):
    return None if is_ok(reply) else f"expected OK, got {_show(reply)}"


def error(*texts):
    """An error reply, containing one of `texts` when any are given."""
    def check(reply, case):
        if not isinstance(reply, RespError):
            return f"expected an error{' (' + ' | '.join(texts) + ')' if texts else ''}, got {_show(reply)}"
        if texts and not any(t in reply for t in texts):
            return f"expected an error with {' | '.join(texts)}, got {_show(reply)}"
        return None
    return check


def when(label, check):
    """`check`, applied only when the step labelled `label` replied OK."""
    def guarded(reply, case):
        return check(reply, case) if is_ok(case.replies.get(label)) else None
    return guarded


NP = {b"FLOAT": np.float32, b"DOUBLE": np.float64, b"INT32": np.int32, b"INT64": np.int64, b"INT8": np.int8,
      b"INT16": np.int16, b"UINT8": np.uint8, b"UINT16": np.uint16, b"BOOL": np.uint8}


def tensor_is(expected, exact=False):
    """The reply of `AI.TENSORGET <key> META BLOB` holds `expected` (shape and values; the dtype when exact)."""
    expected = np.asarray(expected)

    def check(reply, case):
        try:
            assert reply[0] == b"dtype" and reply[2] == b"shape" and reply[4] == b"blob"
            got = np.frombuffer(reply[5], dtype=NP[reply[1]]).reshape(reply[3])
        except Exception:  # noqa: BLE001  (a malformed reply is the finding)
            return f"expected a tensor {expected.tolist()!r:.200}, got {_show(reply)}"
        if exact and got.dtype != expected.dtype:
            return f"expected dtype {expected.dtype}, got {got.dtype}"
        if got.shape != expected.shape or not np.allclose(got.astype(np.float64), expected.astype(np.float64)):
            return f"expected {expected.tolist()!r:.200} (shape {expected.shape}), got {got.tolist()!r:.200} " \
                   f"(shape {got.shape})"
        return None
    return check


def bytes_are(data):
    def check(reply, case):
        return None if reply == data else f"expected the {len(data)} bytes written first, got {_show(reply)}"
    return check


def tensor_cmd(key, arr):
    """AI.TENSORSET of a numpy array by BLOB."""
    arr = np.ascontiguousarray(arr)
    dtype = {np.float32: "FLOAT", np.float64: "DOUBLE", np.int32: "INT32", np.int64: "INT64",
             np.uint8: "UINT8"}[arr.dtype.type]
    return ["AI.TENSORSET", key, dtype, *arr.shape, "BLOB", arr.tobytes()]


# --------------------------------------------------------------------------------------------------
# TF GraphDefs


F, I32, I64, BOOL = tfg.DT_FLOAT, tfg.DT_INT32, tfg.DT_INT64, tfg.DT_BOOL
node_def, a_type, a_types, a_func, a_funcs, a_int = (tfg.node_def, tfg.a_type, tfg.a_types, tfg.a_func,
                                                     tfg.a_funcs, tfg.a_int)


def tf_const(name, dtype, dims, content):
    return node_def(name, "Const", attrs=[("dtype", a_type(dtype)),
                                          ("value", tfg.a_tensor(dtype, dims, content=content))])


def tf_function(name, nodes, ret, attrs=(), arg_attrs=None, sig_attrs=()):
    """f(a: float) -> (b: float); `attrs`: the FunctionDef's own attrs (field 5), `arg_attrs`: attrs of argument 0
    (field 7), `sig_attrs`: (name, type, default AttrValue) of the signature (OpDef.attr with default_value)."""
    sig = tfg.field(1, 2, name.encode())
    sig += tfg.field(2, 2, tfg.field(1, 2, b"a") + tfg.field(3, 0, F))
    sig += tfg.field(3, 2, tfg.field(1, 2, b"b") + tfg.field(3, 0, F))
    for n, t, default in sig_attrs:
        sig += tfg.field(4, 2, tfg.field(1, 2, n.encode()) + tfg.field(2, 2, t.encode()) + tfg.field(3, 2, default))
    body = tfg.field(1, 2, sig) + b"".join(tfg.field(3, 2, n) for n in nodes)
    body += tfg.field(4, 2, tfg.field(1, 2, b"b") + tfg.field(2, 2, ret.encode()))
    for k, v in attrs:
        body += tfg.field(5, 2, tfg.field(1, 2, k.encode()) + tfg.field(2, 2, v))
    if arg_attrs:
        arg = b"".join(tfg.field(1, 2, tfg.field(1, 2, k.encode()) + tfg.field(2, 2, v)) for k, v in arg_attrs)
        body += tfg.field(7, 2, tfg.field(1, 0, 0) + tfg.field(2, 2, arg))
    return body


def tf_graph(nodes, functions=(), gradients=()):
    """GraphDef with a library of `functions` and GradientDef (function, gradient function) entries."""
    g = b"".join(tfg.field(1, 2, n) for n in nodes)
    if functions or gradients:
        lib = b"".join(tfg.field(1, 2, f) for f in functions)
        lib += b"".join(tfg.field(2, 2, tfg.field(1, 2, f.encode()) + tfg.field(2, 2, gf.encode()))
                        for f, gf in gradients)
        g += tfg.field(2, 2, lib)
    return g + tfg.field(4, 2, tfg.field(1, 0, 1205))


FLOAT_IO = [("Tin", a_types([F])), ("Tout", a_types([F]))]
# Calls TensorFlow runs (a chain of them computes): mechanism -> node builder (name, input, callee) -> (node
# defs, output reference inside a function body)
RUNNABLE_CALLS = ["direct", "PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "Case",
                  "StatelessCase"]
CYCLE_CALLS = RUNNABLE_CALLS + ["While", "StatelessWhile", "SymbolicGradient", "nested-func-attr", "list-attr",
                                "function-attr", "arg-attr", "signature-default", "gradient"]


def tf_call(name, inp, callee, mech, leaf="leaf"):
    """Nodes calling `callee` from `inp`, and the reference of their float output (function-body syntax)."""
    if mech == "direct":
        return [node_def(name, callee, [inp])], f"{name}:b:0"
    if mech in ("PartitionedCall", "StatefulPartitionedCall", "SymbolicGradient"):
        return [node_def(name, mech, [inp], FLOAT_IO + [("f", a_func(callee))])], f"{name}:output:0"
    if mech in ("If", "StatelessIf"):
        then, other = (callee, callee) if leaf is None else ((callee, leaf) if name.endswith("0") else (leaf, callee))
        return [tf_const(f"{name}_k", BOOL, [], b"\x01"),
                node_def(name, mech, [f"{name}_k:output:0", inp], [("Tcond", a_type(BOOL))] + FLOAT_IO + [
                    ("then_branch", a_func(then)), ("else_branch", a_func(other))])], f"{name}:output:0"
    if mech in ("Case", "StatelessCase"):
        branches = [callee, callee] if leaf is None else [leaf, callee]
        return [tf_const(f"{name}_i", I32, [], struct.pack("<i", 0)),
                node_def(name, mech, [f"{name}_i:output:0", inp], FLOAT_IO + [("branches", a_funcs(branches))])], \
            f"{name}:output:0"
    if mech in ("While", "StatelessWhile"):
        return [node_def(name, mech, [inp], [("T", a_types([F])), ("cond", a_func(callee if name.endswith("0") else
                                                                                   leaf)),
                                              ("body", a_func(callee))])], f"{name}:output:0"
    if mech == "nested-func-attr":
        return [node_def(name, "PartitionedCall", [inp], FLOAT_IO + [
            ("f", a_func(leaf, attrs=[("inner", a_func(callee))]))])], f"{name}:output:0"
    if mech == "list-attr":
        return [node_def(name, "PartitionedCall", [inp], FLOAT_IO + [("f", a_func(leaf)),
                                                                     ("_extra", a_funcs([leaf, callee]))])], \
            f"{name}:output:0"
    raise ValueError(mech)


def scalar_input(name, dtype):
    """Placeholder `name` of shape [1] and `<name>s`, its one value as a scalar."""
    return [tfg.placeholder(name, dtype, [1]), tf_const(f"{name}_shape", I32, [0], b""),
            node_def(f"{name}s", "Reshape", [name, f"{name}_shape"], [("T", a_type(dtype)), ("Tshape", a_type(I32))])]


def leaf_function(name="leaf"):
    return tf_function(name, [node_def("i", "Identity", ["a"], [("T", a_type(F))])], "i:output:0")


def tf_io(ins, outs):
    return ["INPUTS", len(ins), *ins, "OUTPUTS", len(outs), *outs]


# --------------------------------------------------------------------------------------------------
# TFLITE flatbuffers (the flow tests' hand encoder, helpers/tflite_models.py)


def flatbuffer(root):
    return _flatbuffer(root)


TFL_F32, TFL_I32, TFL_BOOL = 0, 2, 6
TFL = {"ADD": 0, "RESHAPE": 22, "CALL": 31, "TILE": 69, "SUM": 74, "FILL": 94, "IF": 118, "WHILE": 119,
       "CALL_ONCE": 129, "BROADCAST_TO": 130, "STABLEHLO_REDUCE": 174, "STABLEHLO_SCATTER": 190,
       "STABLEHLO_REDUCE_WINDOW": 198, "STABLEHLO_SORT": 199, "STABLEHLO_WHILE": 200, "STABLEHLO_COMPOSITE": 206,
       "STABLEHLO_CASE": 209}
TFL_VERSION = {"BROADCAST_TO": 2}  # LiteRT registers BROADCAST_TO from version 2
# control flow: op -> (options2, options union type, fields holding one index, field holding a vector)
TFL_CONTROL = {"CALL": (False, 16, [0], None), "IF": (False, 92, [0, 1], None), "WHILE": (False, 93, [0, 1], None),
               "CALL_ONCE": (False, 103, [0], None), "STABLEHLO_REDUCE": (True, 6, [1], None),
               "STABLEHLO_SCATTER": (True, 7, [6], None), "STABLEHLO_REDUCE_WINDOW": (True, 13, [5], None),
               "STABLEHLO_SORT": (True, 14, [2], None), "STABLEHLO_WHILE": (True, 15, [0, 1], None),
               "STABLEHLO_COMPOSITE": (True, 21, [1], None), "STABLEHLO_CASE": (True, 23, [], 0)}


def tfl_tensor(name, ttype, shape, buffer=0, signature=None):
    fields = [(0, "ints", shape), (1, "i8", ttype), (2, "u32", buffer), (3, "str", name)]
    if signature is not None:
        fields.append((7, "ints", signature))
    return fields


def tfl_op(opcode_index, inputs, outputs, options=None):
    """options: (options2, union type, fields) or None."""
    fields = [(0, "u32", opcode_index), (1, "ints", inputs), (2, "ints", outputs)]
    if options is not None:
        options2, utype, table = options
        fields += [(11, "u8", utype), (12, "table", table)] if options2 else [(3, "u8", utype), (4, "table", table)]
    return fields


def tfl_subgraph(name, tensors, inputs, outputs, ops):
    return [(0, "tables", tensors), (1, "ints", inputs), (2, "ints", outputs), (3, "tables", ops), (4, "str", name)]


def tfl_model(codes, subgraphs, buffers):
    """codes: BuiltinOperator names (opcode index = position); buffers: data of buffers 1.. (0 is empty)."""
    opcodes = [[(0, "i8", min(TFL[c], 127)), (2, "i32", TFL_VERSION.get(c, 1)), (3, "i32", TFL[c])] for c in codes]
    bufs = [[]] + [[(0, "bytes", b)] for b in buffers]
    return flatbuffer([(0, "u32", 3), (1, "tables", opcodes), (2, "tables", subgraphs),
                       (3, "str", "redisai-rs crafted"), (4, "tables", bufs)])


# --------------------------------------------------------------------------------------------------
# ONNX


def _onnx():
    import onnx
    from onnx import TensorProto, helper
    return onnx, TensorProto, helper


# --------------------------------------------------------------------------------------------------
# TORCH archives: torch_add.pt with its code rewritten (tests/flow/test_security_torch.py does the same)


def _torch_add_code():
    z = zipfile.ZipFile(io.BytesIO(pt_blob("torch_add")))
    return z.read(z.namelist()[0].split("/")[0] + "/code/__torch__.py").decode()


TORCH_ADD_BODY = "    return torch.add(a, b)\n"
TORCH_SELF = "self: __torch__.torch_add"


def torch_archive(body_lines, methods=()):
    """torch_add.pt whose forward(a, b) runs `body_lines` (4 spaces deep) and which has the extra `methods`
    ((name, [argument declarations], return type, body lines))."""
    if _TORCH_CODE[0] is None:
        _TORCH_CODE[0] = _torch_add_code()
    code = _TORCH_CODE[0]
    assert TORCH_ADD_BODY in code
    extra = "".join(f"  def {name}({TORCH_SELF}" + "".join(f",\n    {a}" for a in args) + f") -> {ret}:\n"
                    + "".join(f"    {line}\n" for line in body) for name, args, ret, body in methods)
    code = code.replace(TORCH_ADD_BODY, "".join(f"    {line}\n" for line in body_lines)) + extra
    src = zipfile.ZipFile(io.BytesIO(pt_blob("torch_add")))
    top = src.namelist()[0].split("/")[0] + "/"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = code.encode() if info.filename == top + "code/__torch__.py" else src.read(info)
            z.writestr(info.filename, data)
    return out.getvalue()


_TORCH_CODE = [None]

# --------------------------------------------------------------------------------------------------
# the generator

SCRIPT_KEYS_SRC = '''
def run(tensors: List[Tensor], keys: List[str], args: List[str]):
    i = 0
    while i + 1 < len(args):
        cmd = args[i]
        n = int(args[i + 1])
        rest = args[i + 2:i + 2 + n]
        if cmd == "MODEL":
            out = redisAI.model_execute(rest[0], [tensors[0], tensors[0]], 1)
        else:
            r = redis.execute(cmd, rest)
        i = i + 2 + n
    return tensors[0] + 1
'''
KEY_COMMANDS = ["DEL", "UNLINK", "SET", "RENAME", "EXPIRE", "PEXPIRE", "GET", "TYPE", "EXISTS", "MODEL"]


def tf_fanout_graph(d, fan, mech=lambda: "PartitionedCall"):
    """A GraphDef whose function f<i> calls f<i+1> `fan` times (and sums), d levels: fan^(d-1) calls; y = x * 2 *
    fan^(d-1). `mech()` picks how each call is made ("direct" or "PartitionedCall")."""
    functions = []
    for i in range(d):
        if i == d - 1:
            nodes, ret = [node_def("s", "AddV2", ["a", "a"], [("T", a_type(F))])], "s:z:0"
        else:
            nodes, outs = [], []
            for k in range(fan):
                ns, o = tf_call(f"c{k}", "a", f"f{i + 1}", mech())
                nodes += ns
                outs.append(o)
            nodes.append(node_def("s", "AddN", outs, [("T", a_type(F)), ("N", a_int(fan))]))
            ret = "s:sum:0"
        functions.append(tf_function(f"f{i}", nodes, ret))
    return tf_graph([tfg.placeholder("x", F), tf_call("y", "x", "f0", "PartitionedCall")[0][0]], functions)


def onnx_model(nodes, inputs, outputs, functions=(), domains=("local.fn",)):
    onnx, TensorProto, helper = _onnx()
    g = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m.SerializeToString()


def onnx_fanout_model(d, fan):
    """An ONNX model whose local function F<i> calls F<i+1> `fan` times (and sums), d levels: fan^(d-1) calls;
    y = x * 2 * fan^(d-1)."""
    onnx, TensorProto, helper = _onnx()
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)]
    functions = [helper.make_function("local.fn", f"F{d - 1}", ["X"], ["Y"],
                                      [helper.make_node("Add", ["X", "X"], ["Y"])], opsets)]
    for i in range(d - 2, -1, -1):
        calls = [helper.make_node(f"F{i + 1}", ["X"], [f"r{k}"], domain="local.fn") for k in range(fan)]
        functions.append(helper.make_function("local.fn", f"F{i}", ["X"], ["Y"],
                                              calls + [helper.make_node("Sum", [f"r{k}" for k in range(fan)],
                                                                        ["Y"])], opsets))
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"])  # noqa: E731
    return onnx_model([helper.make_node("F0", ["x"], ["y"], domain="local.fn")], [vi("x")], [vi("y")], functions)


def torch_fanout_functions(d, fan=2):
    """(name, body) of d TorchScript helpers, h<i> calling h<i+1> `fan` times (summed): fan^(d-1) calls;
    CALL(h0)(x) = x * fan^(d-1)."""
    return [(f"h{i}", ["return " + " + ".join([f"CALL(h{i + 1})(x)"] * fan) if i < d - 1 else "return x"])
            for i in range(d)]


class Crafted:
    """Draws crafted cases. `prefix`: the keys of this generator (one per fuzz connection, so that cases on
    different connections never share keys); `backends`: those the server has; `slow`: also cases that take
    seconds by design (TensorFlow retries a refused allocation for up to 10 s; loops stopped by
    MODEL_EXECUTION_TIMEOUT)."""

    def __init__(self, rng, prefix, backends=("ONNX", "TF", "TFLITE", "TORCH"), slow=False, exclude=()):
        self.rng, self.p, self.slow = rng, prefix, slow
        self.kinds = [(w, k) for w, k, b in self.KINDS if b in backends and k not in exclude]
        self.n = 0

    KINDS = [  # (weight, kind, backend)
        (4, "tf_cycle", "TF"), (4, "tf_chain", "TF"), (1, "tf_fanout", "TF"), (3, "tf_size", "TF"),
        (4, "tflite_cycle", "TFLITE"), (3, "tflite_chain", "TFLITE"), (3, "tflite_size", "TFLITE"),
        (1, "tflite_fanout", "TFLITE"),
        (4, "onnx_cycle", "ONNX"), (4, "onnx_nest", "ONNX"), (1, "onnx_fanout", "ONNX"), (3, "onnx_size", "ONNX"),
        (3, "torch_cycle", "TORCH"), (3, "torch_chain", "TORCH"), (3, "torch_nest", "TORCH"),
        (3, "torch_size", "TORCH"), (1, "torch_loop", "TORCH"), (1, "torch_fanout", "TORCH"),
        (8, "script_keys", "TORCH"),
    ]

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def key(self, what):
        return f"{self.p}{what}"

    def case(self, kind=None):
        if kind is None:
            kind = self.rng.choices([k for _, k in self.kinds], [w for w, _ in self.kinds])[0]
        self.n += 1
        return getattr(self, kind)()

    def depth(self, bound, far=2000):
        """A depth: mostly around `bound` (bound - 3 .. bound + 3), else small, else far past it."""
        r = self.rng.random()
        if r < 0.55:
            return bound + self.rng.randint(-3, 3)
        if r < 0.8:
            return self.rng.randint(1, bound)
        return self.rng.randint(bound + 1, far)

    # ---- storing and running a model

    def store(self, case, key, backend, blob, io_names, expect, run=(), outputs=(), checks=(), device="CPU",
              restore=True):
        """Stores `blob` (MODELSTORE, sometimes MODELSET or RESTORE) and runs it on `run` (input keys) into
        `outputs`; `expect` is "ok" (stores, runs and computes: `checks` are TENSORGET checks of the outputs),
        "refused" (a store replies an error; a restored copy replies an error when run) or "any"."""
        ins, outs = io_names
        r = self.rng.random()
        how = "restore" if restore and r < 0.2 else "modelset" if r < 0.3 else "modelstore"
        if self.rng.random() < 0.03:  # a few bytes changed: whatever the backend makes of it, a reply
            blob = self.mutate(blob)
            expect = "any"
        case.desc += f", {how}, {len(blob)} bytes"
        # the key may hold the model of an earlier case: delete it so that a refused store leaves nothing to run
        case.add(["DEL", key])
        if how == "restore":
            payload = model_payload(4, BACKEND_CODE[backend], device, blob, inputs=ins, outputs=outs)
            case.add(["RESTORE", key, "0", payload, "REPLACE"], ok if expect != "any" else None, "store")
        elif how == "modelset":
            io_words = (["INPUTS", *ins, "OUTPUTS", *outs] if backend == "TF" else [])
            case.add(["AI.MODELSET", key, backend, device, *io_words, "BLOB", blob],
                     {"ok": ok, "refused": error()}.get(expect), "store")
        else:
            io_words = tf_io(ins, outs) if backend == "TF" else []
            chunks = [blob]
            if self.rng.random() < 0.2 and len(blob) > 1:
                cut = self.rng.randint(1, len(blob) - 1)
                chunks = [blob[:cut], blob[cut:]]
            case.add(["AI.MODELSTORE", key, backend, device, *io_words, "BLOB", *chunks],
                     {"ok": ok, "refused": error()}.get(expect), "store")
        if not run:
            return expect
        for out in outputs:
            case.add(["DEL", out])
        run_check = {"ok": ok, "refused": error()}.get(expect)
        case.add(["AI.MODELEXECUTE", key, "INPUTS", len(run), *run, "OUTPUTS", len(outputs), *outputs],
                 run_check, "run")
        for out, check in zip(outputs, checks):
            if check is not None:
                case.add(["AI.TENSORGET", out, "META", "BLOB"], when("run", check) if expect != "ok" else check)
        return expect

    def mutate(self, blob):
        b = bytearray(blob)
        for _ in range(self.rng.randint(1, 4)):
            i = self.rng.randrange(len(b))
            b[i] = self.rng.choice([0, 0xFF, b[i] ^ (1 << self.rng.randrange(8)), self.rng.randrange(256)])
        return bytes(b)

    # ---- TF

    def tf_cycle(self):
        n = self.rng.choice([1, 1, 2, 2, 3, 4, 5]) if self.rng.random() < 0.9 else self.rng.randint(6, 60)
        mechs = [self.pick(CYCLE_CALLS) for _ in range(n)]
        reachable = self.rng.random() < 0.8
        names = [f"f{i}" for i in range(n)]
        functions, gradients = [leaf_function()], []
        for i, mech in enumerate(mechs):
            callee = names[(i + 1) % n]
            attrs, arg_attrs, sig_attrs = (), None, ()
            if mech in ("function-attr", "arg-attr", "signature-default", "gradient"):
                nodes, ret = tf_call("c", "a", "leaf", "PartitionedCall")
                if mech == "function-attr":
                    attrs = [("_f", a_func(callee))]
                elif mech == "arg-attr":
                    arg_attrs = [("_f", a_func(callee))]
                elif mech == "signature-default":
                    sig_attrs = [("g", "func", a_func(callee))]
                else:
                    gradients.append((names[i], callee))
            else:
                nodes, ret = tf_call(f"c{i % 2}", "a", callee, mech)
            functions.append(tf_function(names[i], nodes, ret, attrs, arg_attrs, sig_attrs))
        self.rng.shuffle(functions)
        top = tf_call("y", "x", "f0", self.pick(["direct", "PartitionedCall", "StatefulPartitionedCall"]))[0] \
            if reachable else [node_def("y", "Identity", ["x"], [("T", a_type(F))])]
        g = tf_graph([tfg.placeholder("x", F), *top], functions, gradients)
        case = Case("tf_cycle", f"{n} functions in a cycle through {','.join(sorted(set(mechs)))}"
                                f"{'' if reachable else ', not reached from the graph'}")
        x = np.array([1.5, -2.0], dtype=np.float32)
        case.add(tensor_cmd(self.key("x"), x))
        self.store(case, self.key("m0"), "TF", g, (["x"], ["y"]), "refused", [self.key("x")], [self.key("y")])
        return case

    def tf_chain(self):
        d = self.depth(TF_CALL_DEPTH, far=600)
        mechs = [self.pick(RUNNABLE_CALLS) for _ in range(d)]
        functions = []
        for i in range(d):
            if i == d - 1:
                nodes, ret = [node_def("s", "AddV2", ["a", "a"], [("T", a_type(F))])], "s:z:0"
            else:
                nodes, ret = tf_call("c", "a", f"f{i + 1}", mechs[i + 1], leaf=None)
            functions.append(tf_function(f"f{i}", nodes, ret))
        self.rng.shuffle(functions)
        top = tf_call("y", "x", "f0", self.pick(["PartitionedCall", "StatefulPartitionedCall"]), leaf=None)[0]
        g = tf_graph([tfg.placeholder("x", F), *top], functions)
        case = Case("tf_chain", f"call chain {d} deep through {','.join(sorted(set(mechs[1:]))) or 'one call'}")
        x = np.array([[1.5, -2.0, 0.25]], dtype=np.float32)
        case.add(tensor_cmd(self.key("x"), x))
        expect = "ok" if d <= TF_CALL_DEPTH else "refused"
        self.store(case, self.key("m1"), "TF", g, (["x"], ["y"]), expect, [self.key("x")], [self.key("y")],
                   [tensor_is(2 * x)])
        return case

    def tf_fanout(self):
        """Each function calls the next `fan` times: 2^depth calls from a graph of a few KB, within the depth
        bound."""
        fan = self.rng.choice([2, 2, 3])
        d = self.rng.randint(2, TF_CALL_DEPTH)
        g = tf_fanout_graph(d, fan, lambda: self.pick(["direct", "PartitionedCall"]))
        # the graph calls f0 once; each level is its fan calls and an AddN, the leaf one AddV2
        size = brought_in(fan + 1, fan, d - 1, 1)
        case = Case("tf_fanout", f"{d} levels, each calling the next {fan} times ({fan ** (d - 1)} calls, "
                                 f"{size} nodes)")
        x = np.array([1.0], dtype=np.float32)
        case.add(tensor_cmd(self.key("x"), x))
        expect = "refused" if size > TF_EXPANDED else "ok"
        self.store(case, self.key("m2"), "TF", g, (["x"], ["y"]), expect, [self.key("x")], [self.key("y")],
                   [tensor_is(x * 2 * fan ** (d - 1))])
        return case


    def sizes(self, rank, int64, min_elems=10 ** 11):
        """(dims, what) for an input that supplies sizes: "small" (each 0..5), "huge" (a product of at least
        `min_elems`, i.e. 4e11 bytes and more: past any memory bound, never anything a machine could hold),
        "overflow" (past the 64-bit range) or "negative". A huge product the index type cannot reach at this rank
        turns into a negative one."""
        r = self.rng.random()
        top = (1 << 63) - 1 if int64 else (1 << 31) - 1
        if r < 0.45:
            return [self.rng.randint(0, 5) for _ in range(rank)], "small"
        if r < 0.75:
            per = math.ceil(min_elems ** (1 / rank))
            dims = [per] * rank
            if per <= top and math.prod(dims) >= min_elems:
                return dims, "huge"
        elif r < 0.88:
            if top ** rank >= 1 << 64:
                return [top] * rank, "overflow"
        return [self.rng.randint(0, 5) for _ in range(rank - 1)] + [self.pick([-1, -2, -(1 << 31)])], "negative"

    def tf_size(self):
        op = self.pick(["Fill", "BroadcastTo", "Tile", "Reshape", "Range", "OneHot", "Pad", "Empty"])
        index = self.pick([I32, I64]) if op in ("Fill", "BroadcastTo", "Tile", "Reshape", "Range", "Pad") else I32
        int64 = index == I64
        np_index = np.int64 if int64 else np.int32
        rank = 1 if op in ("Range", "OneHot") else 2 if op == "Pad" else self.rng.randint(1, 3)
        # TensorFlow retries a refused allocation for up to 10 s (docs/security.md): without `slow`, a huge size
        # is one of more than 2^62 elements, which its allocator refuses at once
        slow = self.slow and self.rng.random() < 0.3
        dims, size = self.sizes(rank, int64, 10 ** 11 if slow else (1 << 62) + 1)
        c15 = tf_const("v", F, [], struct.pack("<f", 1.5))
        expected = None
        if op == "Fill":
            nodes = [tfg.placeholder("d", index, [rank]), c15,
                     node_def("y", "Fill", ["d", "v"], [("T", a_type(F)), ("index_type", a_type(index))])]
            expected = lambda d: np.full(d, 1.5, dtype=np.float32)  # noqa: E731
        elif op == "BroadcastTo":
            nodes = [tfg.placeholder("d", index, [rank]), c15,
                     node_def("y", "BroadcastTo", ["v", "d"], [("T", a_type(F)), ("Tidx", a_type(index))])]
            expected = lambda d: np.full(d, 1.5, dtype=np.float32)  # noqa: E731
        elif op == "Tile":
            nodes = [tfg.placeholder("d", index, [rank]),
                     tf_const("v", F, [1] * rank, struct.pack("<f", 1.5)),
                     node_def("y", "Tile", ["v", "d"], [("T", a_type(F)), ("Tmultiples", a_type(index))])]
            expected = lambda d: np.full(d, 1.5, dtype=np.float32)  # noqa: E731
        elif op == "Reshape":
            nodes = [tfg.placeholder("d", index, [rank]), tf_const("v", F, [1], struct.pack("<f", 1.5)),
                     node_def("y", "Reshape", ["v", "d"], [("T", a_type(F)), ("Tshape", a_type(index))])]
        elif op == "Range":
            fmt = "<q" if int64 else "<i"
            nodes = [*scalar_input("d", index), tf_const("s", index, [], struct.pack(fmt, 0)),
                     tf_const("t", index, [], struct.pack(fmt, 1)),
                     node_def("y", "Range", ["s", "ds", "t"], [("Tidx", a_type(index))])]
            expected = lambda d: np.arange(d[0], dtype=np_index)  # noqa: E731
        elif op == "OneHot":
            nodes = [*scalar_input("d", I32), tf_const("i", I32, [2], struct.pack("<2i", 0, 1)),
                     tf_const("on", F, [], struct.pack("<f", 1.0)), tf_const("off", F, [], struct.pack("<f", 0.0)),
                     node_def("y", "OneHot", ["i", "ds", "on", "off"], [("T", a_type(F)), ("TI", a_type(I32)),
                                                                       ("axis", a_int(-1))])]
            expected = lambda d: np.eye(2, d[0], dtype=np.float32)  # noqa: E731
        elif op == "Pad":  # [1, 1] padded by [[0, p], [q, 0]]
            nodes = [tfg.placeholder("d", index, [2, 2]), tf_const("v", F, [1, 1], struct.pack("<f", 1.5)),
                     node_def("y", "Pad", ["v", "d"], [("T", a_type(F)), ("Tpaddings", a_type(index))])]
        else:  # Empty: denied (its memory is not written)
            nodes = [tfg.placeholder("d", I32, [rank]),
                     node_def("y", "Empty", ["d"], [("dtype", a_type(F)), ("init", tfg.a_bool(False))])]
        case = Case("tf_size", f"{op} sized by an input: {size} {dims}")
        darr = np.array(dims, dtype=np_index)
        if op == "Pad":
            darr = np.array([[0, dims[0]], [dims[1], 0]], dtype=np_index)
        case.add(tensor_cmd(self.key("d"), darr))
        key, run, out = self.key("m3"), [self.key("d")], [self.key("y")]
        device = "CPU:5" if slow else "CPU"  # a queue of its own: a slow case holds up no other case
        if op == "Empty":
            self.store(case, key, "TF", tf_graph(nodes), (["d"], ["y"]), "refused", run, out)
        elif size == "small":
            check = tensor_is(expected(dims)) if expected else None
            self.store(case, key, "TF", tf_graph(nodes), (["d"], ["y"]), "ok" if op != "Reshape" else "any", run,
                       out, [check], device=device)
        elif self.store(case, key, "TF", tf_graph(nodes), (["d"], ["y"]), "ok", device=device) == "ok":
            # (Reshape's -1 is "whatever is left": a valid shape)
            case.add(["AI.MODELEXECUTE", key, "INPUTS", 1, *run, "OUTPUTS", 1, *out],
                     None if op == "Reshape" and size == "negative" else error(), "run")
        return case

    # ---- TFLITE

    def tflite_cycle(self):
        n = self.rng.choice([1, 1, 2, 2, 3, 4]) if self.rng.random() < 0.9 else self.rng.randint(5, 60)
        variant = self.pick(["cycle", "cycle", "cycle", "self", "dangling", "no-options", "unreached"])
        ops_used = [self.pick(list(TFL_CONTROL)) for _ in range(n)]
        codes = list(dict.fromkeys(ops_used + ["ADD"]))
        bad = self.rng.randrange(n)  # the subgraph whose op dangles / names itself
        subgraphs = []
        for i, name in enumerate(ops_used):
            options2, utype, fields, vector = TFL_CONTROL[name]
            if variant == "unreached" and n < 2:
                variant = "self"
            # "unreached": subgraphs 1 .. n - 1 call each other in a cycle, subgraph 0 only adds one
            target = 1 + i % (n - 1) if variant == "unreached" else (i + 1) % n
            if variant == "self" and i == bad:
                target = i
            if variant == "dangling" and i == bad:
                target = self.pick([n, n + 1, n + 1000, -1, -(1 << 31), (1 << 31) - 1])
            table = [(f, "i32", target if k == 0 else self.rng.randrange(n)) for k, f in enumerate(fields)]
            if vector is not None:
                table.append((vector, "ints", [self.rng.randrange(n), target]))
            options = None if variant == "no-options" and i == bad else (options2, utype, table)
            if name == "CALL" and variant == "dangling" and i == bad and target < 0:
                table[0] = (0, "u32", target & 0xFFFFFFFF)
            tensors = [tfl_tensor("x", TFL_I32, [1]), tfl_tensor("y", TFL_I32, [1]),
                       tfl_tensor("c", TFL_BOOL, [1], buffer=1)]
            ins = [2, 0] if name == "IF" else [0]
            subgraphs.append(tfl_subgraph(f"s{i}", tensors, [0], [1],
                                          [tfl_op(codes.index(name), ins, [1], options)]))
        if variant == "unreached":
            subgraphs[0] = tfl_subgraph("main", [tfl_tensor("x", TFL_I32, [1]), tfl_tensor("y", TFL_I32, [1]),
                                                 tfl_tensor("one", TFL_I32, [1], buffer=2)], [0], [1],
                                        [tfl_op(codes.index("ADD"), [0, 2], [1])])
        blob = tfl_model(codes, subgraphs, [b"\x01", struct.pack("<i", 1)])
        case = Case("tflite_cycle", f"{variant}: {n} subgraphs through {','.join(sorted(set(ops_used)))}")
        case.add(tensor_cmd(self.key("i"), np.array([3], dtype=np.int32)))
        self.store(case, self.key("m4"), "TFLITE", blob, ([], []), "refused", [self.key("i")], [self.key("o")])
        return case

    def tflite_chain(self):
        """IF chains: subgraph i runs IF(true) into subgraph i + 1; the last adds one."""
        d = self.depth(TFLITE_DEPTH, far=400)
        subgraphs = []
        for i in range(d):
            tensors = [tfl_tensor("x", TFL_I32, [1]), tfl_tensor("y", TFL_I32, [1]),
                       tfl_tensor("c", TFL_BOOL, [1], buffer=1)]
            table = [(0, "i32", i + 1), (1, "i32", i + 1)]
            subgraphs.append(tfl_subgraph(f"s{i}", tensors, [0], [1], [tfl_op(0, [2, 0], [1], (False, 92, table))]))
        subgraphs.append(tfl_subgraph("leaf", [tfl_tensor("x", TFL_I32, [1]), tfl_tensor("y", TFL_I32, [1]),
                                               tfl_tensor("one", TFL_I32, [1], buffer=2)], [0], [1],
                                      [tfl_op(1, [0, 2], [1])]))
        blob = tfl_model(["IF", "ADD"], subgraphs, [b"\x01", struct.pack("<i", 1)])
        case = Case("tflite_chain", f"IF chain {d} deep ({d + 1} subgraphs)")
        x = np.array([self.rng.randint(-100, 100)], dtype=np.int32)
        case.add(tensor_cmd(self.key("i"), x))
        expect = "ok" if d < TFLITE_DEPTH else "refused"
        self.store(case, self.key("m5"), "TFLITE", blob, ([], []), expect, [self.key("i")], [self.key("o")],
                   [tensor_is(x + 1)])
        return case

    def tflite_fanout(self, d=None, fan=None):
        """Subgraph i runs subgraph i + 1 from `fan` IF ops (their sum): fan^depth subgraph invocations from a
        model of a few KB, within the depth bound."""
        fan = fan or self.rng.choice([2, 2, 3])
        d = d or self.rng.randint(2, TFLITE_DEPTH - 1)
        blob = tflite_fanout_model(d, fan)
        # subgraph 0's IFs run subgraph 1 fan times; each level is fan IFs and fan - 1 ADDs, the leaf one ADD
        size = fan * brought_in(2 * fan - 1, fan, d - 1, 1)
        case = Case("tflite_fanout", f"{d} levels, each running the next {fan} times ({fan ** d} runs of the leaf, "
                                     f"{size} ops)")
        x = np.array([1], dtype=np.int32)
        case.add(tensor_cmd(self.key("i"), x))
        expect = "refused" if size > TFLITE_EXPANDED else "ok"
        self.store(case, self.key("m13"), "TFLITE", blob, ([], []), expect, [self.key("i")], [self.key("o")],
                   [tensor_is(x * 2 * fan ** d) if 2 * fan ** d < 1 << 31 else None])
        return case

    def tflite_size(self):
        op = self.pick(["FILL", "BROADCAST_TO", "TILE", "RESHAPE"])
        rank = self.rng.randint(2, 3)  # INT32 sizes of rank 1 cannot reach past every bound
        dims, size = self.sizes(rank, False)
        direct = self.rng.random() < 0.3  # the sized tensor is the output itself (else its sum)
        tensors = [tfl_tensor("d", TFL_I32, [rank]),
                   tfl_tensor("v", TFL_F32, [] if op in ("FILL", "BROADCAST_TO") else [1] * rank, buffer=1),
                   tfl_tensor("sized", TFL_F32, [1] * rank, signature=[-1] * rank),
                   tfl_tensor("axes", TFL_I32, [rank], buffer=2), tfl_tensor("z", TFL_F32, [])]
        ins = [0, 1] if op == "FILL" else [1, 0]
        ops = [tfl_op(0, ins, [2])] + ([] if direct else [tfl_op(1, [2, 3], [4])])
        blob = tfl_model([op, "SUM"], [tfl_subgraph("main", tensors, [0], [2 if direct else 4], ops)],
                         [struct.pack("<f", 1.5), struct.pack(f"<{rank}i", *range(rank))])
        case = Case("tflite_size", f"{op} sized by an input: {size} {dims}{', as the output' if direct else ''}")
        case.add(tensor_cmd(self.key("d"), np.array(dims, dtype=np.int32)))
        key, run, out = self.key("m6"), [self.key("d")], [self.key("o")]
        if size == "small" and op != "RESHAPE" and not direct:
            self.store(case, key, "TFLITE", blob, ([], []), "ok", run, out,
                       [tensor_is(np.float32(np.full(dims, 1.5, dtype=np.float32).sum()))])
        elif size == "small":  # (a dynamic tensor as the output: LiteRT 2.3 cannot hand it over)
            self.store(case, key, "TFLITE", blob, ([], []), "any", run, out)
        elif self.store(case, key, "TFLITE", blob, ([], []), "ok") == "ok":
            # (RESHAPE's -1 is "whatever is left": a valid shape)
            case.add(["AI.MODELEXECUTE", key, "INPUTS", 1, *run, "OUTPUTS", 1, *out],
                     None if op == "RESHAPE" and size == "negative" else error(), "run")
        return case

    # ---- ONNX

    def onnx_model(self, nodes, inputs, outputs, functions=(), domains=("local.fn",)):
        return onnx_model(nodes, inputs, outputs, functions, domains)

    def onnx_cycle(self):
        onnx, TensorProto, helper = _onnx()
        n = self.rng.choice([1, 1, 2, 2, 3, 4]) if self.rng.random() < 0.9 else self.rng.randint(5, 60)
        reachable = self.rng.random() < 0.8
        ways = []
        functions = []
        vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"])  # noqa: E731
        for i in range(n):
            callee = f"F{(i + 1) % n}"
            way = self.pick(["node", "node", "if", "loop", "attribute"])
            ways.append(way)
            call = helper.make_node(callee, ["X"], ["R"], domain="local.fn")
            if way == "node":
                body = [call]
            elif way == "if":
                then = helper.make_graph([helper.make_node(callee, ["X"], ["t"], domain="local.fn")], "then", [],
                                         [vi("t")])
                other = helper.make_graph([helper.make_node("Identity", ["X"], ["e"])], "else", [], [vi("e")])
                body = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [],
                                                                                         [True])),
                        helper.make_node("If", ["c"], ["R"], then_branch=then, else_branch=other)]
            elif way == "loop":
                lbody = helper.make_graph(
                    [helper.make_node("Identity", ["ci"], ["co"]),
                     helper.make_node(callee, ["vi"], ["vo"], domain="local.fn")], "body",
                    [helper.make_tensor_value_info("it", TensorProto.INT64, []),
                     helper.make_tensor_value_info("ci", TensorProto.BOOL, []), vi("vi")],
                    [helper.make_tensor_value_info("co", TensorProto.BOOL, []), vi("vo")])
                body = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [],
                                                                                         [1])),
                        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [],
                                                                                         [True])),
                        helper.make_node("Loop", ["m", "c", "X"], ["R"], body=lbody)]
            else:  # a call inside a graph attribute of a node of another domain's op (an If nested in an If)
                inner = helper.make_graph([helper.make_node(callee, ["X"], ["t"], domain="local.fn")], "inner", [],
                                          [vi("t")])
                outer = helper.make_graph([
                    helper.make_node("Constant", [], ["c2"], value=helper.make_tensor("c2", TensorProto.BOOL, [],
                                                                                      [False])),
                    helper.make_node("If", ["c2"], ["u"], then_branch=inner,
                                     else_branch=helper.make_graph([helper.make_node("Identity", ["X"], ["e2"])],
                                                                   "e2", [], [vi("e2")]))], "outer", [], [vi("u")])
                body = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [],
                                                                                         [True])),
                        helper.make_node("If", ["c"], ["R"], then_branch=outer,
                                         else_branch=helper.make_graph([helper.make_node("Identity", ["X"], ["e"])],
                                                                       "else", [], [vi("e")]))]
            body.append(helper.make_node("Add", ["R", "X"], ["Y"]))
            functions.append(helper.make_function("local.fn", f"F{i}", ["X"], ["Y"], body,
                                                  [helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)]))
        self.rng.shuffle(functions)
        top = helper.make_node("F0", ["x"], ["y"], domain="local.fn") if reachable else \
            helper.make_node("Identity", ["x"], ["y"])
        blob = self.onnx_model([top], [vi("x")], [vi("y")], functions)
        case = Case("onnx_cycle", f"{n} local functions in a cycle through {','.join(sorted(set(ways)))}"
                                  f"{'' if reachable else ', not reached from the graph'}")
        case.add(tensor_cmd(self.key("x"), np.array([1.5, -2.0], dtype=np.float32)))
        self.store(case, self.key("m7"), "ONNX", blob, (["x"], ["y"]), "refused", [self.key("x")], [self.key("y")])
        return case

    @staticmethod
    def onnx_levels(levels):
        """(graph nodes, local functions), serialized, computing `y` = `x` + 1 through nested `levels` ("fn": a
        call of a local function, "if": a then-branch, "loop": a body run once). Nested messages are put
        together as bytes: the protobuf package refuses (and copies) messages nested deeper than 100."""
        onnx, T, helper = _onnx()
        field = tfg.field
        functions = []
        vi = lambda name, t=T.FLOAT: helper.make_tensor_value_info(name, t, None)  # noqa: E731
        scalar = lambda name, t: helper.make_tensor_value_info(name, t, [])  # noqa: E731
        ser = lambda node: node.SerializeToString()  # noqa: E731
        const = lambda name, t, v: ser(helper.make_node(  # noqa: E731
            "Constant", [], [name], value=helper.make_tensor(name, t, [], [v])))

        def graph(name, nodes, inputs, outputs, first=()):
            return helper.make_graph(list(first), name, inputs, outputs).SerializeToString() + \
                b"".join(field(1, 2, n) for n in nodes)

        def attr(name, g):
            return field(1, 2, name.encode()) + field(20, 0, 5) + field(6, 2, g)  # type GRAPH, g

        # names top-down (level k computes outs[k] from ins[k]), then the nodes bottom-up
        ins, outs = ["x"], ["y"]
        for k, level in enumerate(levels):
            ins.append("X" if level == "fn" else ins[k] if level == "if" else f"vi{k}")
            outs.append("Y" if level == "fn" else f"t{k}" if level == "if" else f"vo{k}")
        n = len(levels)
        nodes = [const(f"one{n}", T.FLOAT, 1.0), ser(helper.make_node("Add", [ins[n], f"one{n}"], [outs[n]]))]
        for k in range(n - 1, -1, -1):
            inp, out, inner = ins[k], outs[k], nodes
            if levels[k] == "fn":
                functions.append(helper.make_function(
                    "local.fn", f"L{k}", ["X"], ["Y"], [],
                    [helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)]).SerializeToString()
                    + b"".join(field(7, 2, node) for node in inner))
                nodes = [ser(helper.make_node(f"L{k}", [inp], [out], domain="local.fn"))]
            elif levels[k] == "if":
                then = graph(f"then{k}", inner, [], [vi(f"t{k}")])
                other = graph(f"else{k}", [], [], [vi(f"e{k}")], [helper.make_node("Identity", [inp], [f"e{k}"])])
                node = ser(helper.make_node("If", [f"c{k}"], [out]))
                nodes = [const(f"c{k}", T.BOOL, True),
                         node + field(5, 2, attr("then_branch", then)) + field(5, 2, attr("else_branch", other))]
            else:
                body = graph(f"body{k}", inner, [scalar(f"it{k}", T.INT64), scalar(f"ci{k}", T.BOOL), vi(f"vi{k}")],
                             [scalar(f"co{k}", T.BOOL), vi(f"vo{k}")],
                             [helper.make_node("Identity", [f"ci{k}"], [f"co{k}"])])
                nodes = [const(f"m{k}", T.INT64, 1), const(f"c{k}", T.BOOL, True),
                         ser(helper.make_node("Loop", [f"m{k}", f"c{k}", inp], [out])) + field(5, 2, attr("body", body))]
        return nodes, functions

    def onnx_nest(self):
        onnx, T, helper = _onnx()
        d = self.depth(ONNX_DEPTH, far=3000)
        style = self.pick(["fn", "if", "loop", "mixed"])
        levels = [self.pick(["fn", "if", "loop"]) if style == "mixed" else style for _ in range(d)]
        nodes, functions = self.onnx_levels(levels)
        vi = lambda name: helper.make_tensor_value_info(name, T.FLOAT, ["n"])  # noqa: E731
        g = helper.make_graph([], "g", [vi("x")], [vi("y")]).SerializeToString()
        g += b"".join(tfg.field(1, 2, n) for n in nodes)
        m = helper.make_model(helper.make_graph([], "g", [], []),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)])
        m.ir_version = 8
        m.ClearField("graph")
        blob = m.SerializeToString() + tfg.field(7, 2, g) + b"".join(tfg.field(25, 2, f) for f in functions)
        # ONNX Runtime's protobuf parser refuses messages nested more than 100 deep: each subgraph level nests
        # three (node, attribute, graph), a function body starts again from its own message
        run, longest = 0, 0
        for level in levels:
            run = 0 if level == "fn" else run + 1
            longest = max(longest, run)
        case = Case("onnx_nest", f"{d} levels of {style} ({longest} subgraphs in a row)")
        x = np.array([1.5, -2.0, 0.0], dtype=np.float32)
        case.add(tensor_cmd(self.key("x"), x))
        expect = "refused" if d >= ONNX_DEPTH or longest > 33 else "ok" if longest < 31 else "any"
        self.store(case, self.key("m8"), "ONNX", blob, (["x"], ["y"]), expect, [self.key("x")], [self.key("y")],
                   [tensor_is(x + 1)])
        return case

    def onnx_fanout(self):
        fan = self.rng.choice([2, 2, 3])
        d = self.rng.randint(2, 24)
        blob = onnx_fanout_model(d, fan)
        # the graph calls F0 once; each level is its fan calls and a Sum, the leaf one Add
        size = brought_in(fan + 1, fan, d - 1, 1)
        case = Case("onnx_fanout", f"{d} levels, each calling the next {fan} times ({fan ** (d - 1)} calls, "
                                   f"{size} nodes)")
        x = np.array([1.0], dtype=np.float32)
        case.add(tensor_cmd(self.key("x"), x))
        expect = "refused" if size > ONNX_EXPANDED else "ok"
        self.store(case, self.key("m9"), "ONNX", blob, (["x"], ["y"]), expect, [self.key("x")], [self.key("y")],
                   [tensor_is(x * 2 * fan ** (d - 1))])
        return case

    def onnx_size(self):
        onnx, TensorProto, helper = _onnx()
        op = self.pick(["ConstantOfShape", "Expand", "Tile", "Range", "Pad"])
        rank = 1 if op == "Range" else 2 if op == "Pad" else self.rng.randint(1, 3)
        dims, size = self.sizes(rank, True)
        T = TensorProto
        one5 = lambda name, shape: helper.make_node(  # noqa: E731
            "Constant", [], [name], value=helper.make_tensor(name, T.FLOAT, shape, [1.5] * max(1, math.prod(shape))))
        expected, y_type = None, T.FLOAT
        if op == "ConstantOfShape":
            nodes = [helper.make_node("ConstantOfShape", ["d"], ["y"],
                                      value=helper.make_tensor("v", T.FLOAT, [1], [1.5]))]
            expected = np.full(dims, 1.5, dtype=np.float32) if size == "small" else None
        elif op == "Expand":
            nodes = [one5("v", [1]), helper.make_node("Expand", ["v", "d"], ["y"])]
            expected = np.full(dims, 1.5, dtype=np.float32) if size == "small" else None
        elif op == "Tile":
            nodes = [one5("v", [1] * rank), helper.make_node("Tile", ["v", "d"], ["y"])]
            expected = np.full(dims, 1.5, dtype=np.float32) if size == "small" else None
        elif op == "Range":
            y_type = T.INT64
            nodes = [helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", T.INT64, [], [0])),
                     helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", T.INT64, [], [1])),
                     helper.make_node("Range", ["s", "d", "t"], ["y"])]
            expected = np.arange(dims[0], dtype=np.int64) if size == "small" else None
        else:  # Pad of a [1, 1] tensor by pads [0, q, p, 0] (begin of each axis, then end)
            nodes = [one5("v", [1, 1]), helper.make_node("Pad", ["v", "d"], ["y"])]
            if size == "small":
                expected = np.pad(np.full([1, 1], 1.5, dtype=np.float32), [[0, dims[1]], [dims[0], 0]])
            dims = [0, dims[0], dims[1], 0]
        d_shape = [] if op == "Range" else [len(dims)]
        blob = self.onnx_model(nodes, [helper.make_tensor_value_info("d", T.INT64, d_shape)],
                               [helper.make_tensor_value_info("y", y_type, None)], domains=())
        case = Case("onnx_size", f"{op} sized by an input: {size} {dims}")
        darr = np.array(dims, dtype=np.int64).reshape(d_shape)
        case.add(tensor_cmd(self.key("d"), darr))
        key, run, out = self.key("m10"), [self.key("d")], [self.key("y")]
        if size == "small":
            self.store(case, key, "ONNX", blob, (["d"], ["y"]), "ok", run, out,
                       [tensor_is(expected) if expected is not None else None])
        elif self.store(case, key, "ONNX", blob, (["d"], ["y"]), "ok") == "ok":
            # (an empty Range and a Pad that removes elements are valid)
            case.add(["AI.MODELEXECUTE", key, "INPUTS", 1, *run, "OUTPUTS", 1, *out],
                     None if size == "negative" and op in ("Range", "Pad") else error(), "run")
        return case

    # ---- TORCH: archives (forward(a, b) of torch_add.pt rewritten) and scripts

    def torch_code(self, kind, body_lines, functions, what=None):
        """("model", archive) or ("script", source) running `body_lines`, where INPUT is the input tensor.
        `functions`: (name, body lines) of helpers taking and returning one tensor `x`, called as
        `CALL(name)(...)`."""
        if (what or self.pick(["model", "script"])) == "model":
            sub = lambda line: re.sub(r"CALL\((\w+)\)", r"self.\1", line).replace("INPUT", "a")  # noqa: E731
            methods = [(name, ["x: Tensor"], "Tensor", [sub(b) for b in body]) for name, body in functions]
            return "model", torch_archive([sub(b) for b in body_lines], methods)
        sub = lambda line: re.sub(r"CALL\((\w+)\)", r"\1", line).replace("INPUT", "tensors[0]")  # noqa: E731
        src = "".join(f"def {name}(x: Tensor) -> Tensor:\n" + "".join(f"    {sub(b)}\n" for b in body) + "\n"
                      for name, body in functions)
        return "script", src + entry("f", *[sub(b) for b in body_lines])

    def torch_case(self, case, what, code, x, expect, check=None, device="CPU", key="m11"):
        """Stores and runs a model (archive) or a script on input tensor `x`."""
        case.add(tensor_cmd(self.key("a"), x))
        case.desc += f" ({what})"
        k, a, out = self.key(key), self.key("a"), self.key("y")
        if what == "model":
            self.store(case, k, "TORCH", code, ([], []), expect, [a, a], [out], [check], device=device)
            return
        case.desc += f", {len(code)} bytes of source"
        case.add(["DEL", k])
        case.add(["AI.SCRIPTSTORE", k, device, "ENTRY_POINTS", 1, "f", "SOURCE", code],
                 {"ok": ok, "refused": error()}.get(expect), "store")
        case.add(["DEL", out])
        case.add(["AI.SCRIPTEXECUTE", k, "f", "INPUTS", 1, a, "OUTPUTS", 1, out],
                 {"ok": ok, "refused": error()}.get(expect), "run")
        if check is not None:
            case.add(["AI.TENSORGET", out, "META", "BLOB"], check if expect == "ok" else when("run", check))

    def torch_cycle(self):
        n = self.rng.choice([1, 1, 2, 2, 3, 4]) if self.rng.random() < 0.9 else self.rng.randint(5, 60)
        reachable = self.rng.random() < 0.8
        ways = []
        functions = []
        for i in range(n):
            call = f"CALL(h{(i + 1) % n})(x)"
            way = self.pick(["return", "if", "loop", "twice"])
            ways.append(way)
            body = {"return": [f"return {call}"],
                    "if": ["if bool(x.sum() > 0):", f"    return {call}", "return x"],
                    "loop": ["for i in range(2):", f"    x = {call}", "return x"],
                    "twice": [f"return {call} + {call}"]}[way]
            functions.append((f"h{i}", body))
        self.rng.shuffle(functions)
        body = ["return CALL(h0)(INPUT)"] if reachable else ["return INPUT + 1"]
        what, code = self.torch_code("cycle", body, functions)
        case = Case("torch_cycle", f"{n} functions in a cycle through {','.join(sorted(set(ways)))}"
                                   f"{'' if reachable else ', not called'}")
        self.torch_case(case, what, code, np.array([1.5, -2.0], dtype=np.float32),
                        "refused" if reachable else "any")
        return case

    def torch_chain(self):
        """h0 calls h1 ... calls h(d-1): each adds one."""
        d = max(1, int(math.exp(self.rng.uniform(0, math.log(3000)))))
        functions = [(f"h{i}", [f"return CALL(h{i + 1})(x) + 1" if i < d - 1 else "return x + 1"])
                     for i in range(d)]
        self.rng.shuffle(functions)
        what, code = self.torch_code("chain", ["return CALL(h0)(INPUT)"], functions)
        case = Case("torch_chain", f"call chain {d} deep")
        x = np.array([1.5, -2.0], dtype=np.float32)
        # the entry point (forward, f) calls h0: d + 1 functions deep
        expect = "ok" if d + 1 <= TORCH_CALL_DEPTH else "refused"
        self.torch_case(case, what, code, x, expect, tensor_is(x + d))
        return case

    def torch_fanout(self):
        d = self.rng.randint(2, 24)
        what, code = self.torch_code("fanout", ["return CALL(h0)(INPUT)"], torch_fanout_functions(d))
        case = Case("torch_fanout", f"{d} levels, each calling the next twice ({2 ** (d - 1)} calls)")
        x = np.array([1.0], dtype=np.float32)
        # TorchScript's own node count per level (constants, the add) is libtorch's: bench/expansion.py found
        # 15 levels admitted and 16 refused; a margin each side
        expect = "ok" if d <= 14 else "refused" if d >= 17 else "any"
        self.torch_case(case, what, code, x, expect, tensor_is(x * 2 ** (d - 1)))
        return case

    def torch_nest(self):
        """Code nested around the sandbox's bound: 256 levels, where a call counts three (the call, its
        parentheses, its arguments), an if-block two, an operator on `tensors[0]` (scripts) two."""
        style = self.pick(["parentheses", "calls", "operators", "blocks", "lists"])
        what = self.pick(["model", "script"])
        cost = {"calls": 3, "blocks": 2, "operators": 2 if what == "script" else 1}.get(style, 1)
        bound = TORCH_NESTING // cost
        r = self.rng.random()
        far = 400 if style == "blocks" else 20 * bound  # (blocks: 2 d^2 bytes of indentation)
        d = bound + self.rng.randint(-12, 12) if r < 0.5 else self.rng.randint(1, bound - 12) if r < 0.8 else \
            self.rng.randint(bound + 13, far)
        x = np.array([1.5, -2.0], dtype=np.float32)
        if style == "parentheses":
            body, want = ["return " + "(" * d + "INPUT" + ")" * d], x
        elif style == "calls":
            body, want = ["return " + "torch.neg(" * d + "INPUT" + ")" * d], x * (-1) ** d
        elif style == "operators":
            body, want = ["return " + " + ".join(["INPUT"] * (d + 1))], x * (d + 1)
        elif style == "lists":
            body, want = ["y = " + "[" * d + "INPUT" + "]" * d, "return INPUT"], x
        else:
            body = ["y = INPUT"] + [" " * 4 * k + "if True:" for k in range(d)] + [" " * 4 * d + "y = y + 1",
                                                                                     "return y"]
            want = x + 1
        what, code = self.torch_code("nest", body, [], what)
        case = Case("torch_nest", f"{style} nested {d} deep")
        expect = "ok" if d <= bound - 8 else "refused" if d > bound + 8 else "any"
        self.torch_case(case, what, code, x, expect, tensor_is(want))
        return case

    def torch_size(self):
        op = self.pick(["zeros", "empty", "ones", "full", "arange", "repeat", "expand", "new_zeros", "cat"])
        r = self.rng.random()
        n, size = (self.rng.randint(0, 5), "small") if r < 0.45 else \
            (self.pick([10 ** 11, 10 ** 12, 1 << 40, 1 << 50]), "huge") if r < 0.8 else \
            (self.pick([1 << 62, (1 << 63) - 1]), "overflow") if r < 0.9 else (self.pick([-1, -(1 << 31)]), "negative")
        line, want = {
            "zeros": ("return torch.zeros(n)", lambda: np.zeros(n, np.float32)),
            "empty": ("return torch.empty(n)", lambda: np.zeros(n, np.float32)),  # the allocator zeroes it
            "ones": ("return torch.ones([n, 2])", lambda: np.ones((n, 2), np.float32)),
            "full": ("return torch.full([n], 1.5)", lambda: np.full(n, 1.5, np.float32)),
            "arange": ("return torch.arange(n)", lambda: np.arange(n, dtype=np.int64)),
            "repeat": ("return INPUT.repeat(n)", lambda: np.full(n, n, np.int64)),
            "expand": ("return INPUT.expand(n)", lambda: np.full(n, n, np.int64)),
            "new_zeros": ("return INPUT.new_zeros([n, 3])", lambda: np.zeros((n, 3), np.int64)),
            "cat": ("return torch.cat([torch.zeros(n), torch.ones(n)])",
                    lambda: np.concatenate([np.zeros(n, np.float32), np.ones(n, np.float32)])),
        }[op]
        what, code = self.torch_code("size", ["n = int(INPUT.sum())", line], [])
        case = Case("torch_size", f"{op} sized by an input: {size} {n}")
        x = np.array([n], dtype=np.int64)
        if size == "small":
            self.torch_case(case, what, code, x, "ok", tensor_is(want()))
        else:
            self.torch_case(case, what, code, x, "any")
            if not (op == "expand" and size == "negative"):  # (expand's -1 keeps the size: valid)
                case.steps[-1] = (case.steps[-1][0], error(), "run")
        return case

    def torch_loop(self):
        slow = self.slow and self.rng.random() < 0.2
        n = self.rng.randint(0, 300) if not slow else self.pick([10 ** 9, 10 ** 12])
        style = self.pick(["for", "while", "nested", "list"])
        body = {"for": ["s = torch.zeros(1)", "for i in range(int(INPUT.sum())):", "    s = s + 1", "return s"],
                "while": ["i = 0", "n = int(INPUT.sum())", "while i < n:", "    i += 1", "return torch.tensor([i])"],
                "nested": ["k = 0", "n = int(INPUT.sum())", "for i in range(n):", "    for j in range(n):",
                           "        k += 1", "return torch.tensor([k])"],
                "list": ["l: List[int] = []", "for i in range(int(INPUT.sum())):", "    l.append(i)",
                         "return torch.tensor([len(l)])"]}[style]
        want = None if slow else {"for": np.array([n], np.float32), "while": np.array([n], np.int64),
                                  "nested": np.array([n * n], np.int64), "list": np.array([n], np.int64)}[style]
        what, code = self.torch_code("loop", body, [])
        case = Case("torch_loop", f"{style} loop of {n} iterations from the input")
        x = np.array([n], dtype=np.int64)
        if slow:
            self.torch_case(case, what, code, x, "any", device="CPU:5", key="m12")
            case.steps[-1] = (case.steps[-1][0], error(), "run")
        else:
            self.torch_case(case, what, code, x, "ok", tensor_is(want), key="m12")
        return case

    # ---- scripts whose redis.execute changes their own keys

    def script_keys(self):
        k = {name: self.key(f"k:{name}") for name in ("in", "out", "script", "model", "big", "str", "none")}
        case = Case("script_keys", "")
        canary = self.key("k:canary")
        if getattr(self, "canary", None) is None:
            self.canary = np.random.default_rng(self.rng.randrange(1 << 30)).random(BIG_FLOATS, dtype=np.float32)
            case.add(tensor_cmd(canary, self.canary), ok)
        case.add(["DEL", *k.values()])  # what the last case left: any type, maybe renamed
        big_in = self.rng.random() < 0.6
        x = np.arange(BIG_FLOATS if big_in else 4, dtype=np.float32) * np.float32(0.5)
        case.add(tensor_cmd(k["in"], x), ok)
        r = self.rng.random()
        if r < 0.3:
            pass
        elif r < 0.8:
            case.add(tensor_cmd(k["out"], np.ones(BIG_FLOATS, dtype=np.float32)), ok)
        else:
            case.add(["SET", k["out"], "plain"])
        case.add(["AI.SCRIPTSTORE", k["script"], "CPU", "ENTRY_POINTS", 1, "run", "SOURCE", SCRIPT_KEYS_SRC], ok)
        case.add(["AI.MODELSTORE", k["model"], "ONNX", "CPU", "BLOB", onnx_blob("mul")], ok)
        case.add(tensor_cmd(k["big"], np.ones(BIG_FLOATS, dtype=np.float32)), ok)
        case.add(["SET", k["str"], "s"], ok)
        targets = ["in", "in", "out", "out", "script", "script", "model", "big", "str", "none"]
        args, expiring, seq = [], False, []
        for _ in range(self.rng.randint(1, 5)):
            cmd = self.pick(KEY_COMMANDS)
            t = self.pick(targets)
            rest = [k[t]]
            if cmd == "SET":
                rest.append("v")
            elif cmd == "RENAME":
                rest.append(k[self.pick(targets)])
            elif cmd in ("EXPIRE", "PEXPIRE"):
                v = self.pick(["0", "1", "-1", "100000"])
                rest.append(v)
                expiring |= v not in ("0", "-1") and (t == "out" or t == "in")
            elif cmd == "MODEL":
                rest = [k[self.pick(["model", "model", "in", "script", "none"])]]
            if cmd == "RENAME" and rest[1] == k["out"]:
                expiring = True  # the renamed key may carry a TTL over to the output key
            args += [cmd, str(len(rest)), *rest]
            seq.append(f"{cmd} {t}")
        keys = [k["in"], k["out"]]
        call = ["AI.SCRIPTEXECUTE", k["script"], "run", "KEYS", len(keys), *keys, "INPUTS", 1, k["in"],
                "ARGS", len(args), *args, "OUTPUTS", 1, k["out"]]
        in_dag = self.rng.random() < 0.3
        if in_dag:
            persist = self.rng.random() < 0.8
            dag = ["AI.DAGEXECUTE", "LOAD", 1, k["in"]] + (["PERSIST", 1, k["out"]] if persist else []) + \
                ["|>", *call, "|>", "AI.TENSORGET", k["out"], "META"]
            case.add(dag, None, "exec")
            # (a PERSIST that fails, over a key of another type, adds its error to the reply)
            succeeded = lambda c: isinstance(c.replies.get("exec"), list) and is_ok(c.replies["exec"][0]) and \
                not any(isinstance(e, RespError) for e in c.replies["exec"])  # noqa: E731
            checked = persist
        else:
            case.add(call, None, "exec")
            succeeded = lambda c: is_ok(c.replies.get("exec"))  # noqa: E731
            checked = True
        case.desc = f"{'in a DAG: ' if in_dag else ''}{'; '.join(seq)}; input of {x.nbytes} bytes"
        if checked and not expiring:
            want = tensor_is(x + 1)
            case.add(["AI.TENSORGET", k["out"], "META", "BLOB"], lambda reply, c: want(reply, c) if succeeded(c)
                     else None)
        case.add(["AI.TENSORGET", canary, "BLOB"], bytes_are(self.canary.tobytes()))
        case.add(["PING"], lambda reply, c: None if reply == "PONG" else f"PING replied {_show(reply)}")
        return case


# --------------------------------------------------------------------------------------------------
# standalone: cases one by one against a running server


def main():
    import argparse
    import random
    import socket
    import time

    from harness import StrictReader
    from helpers.resp import encode_command

    ap = argparse.ArgumentParser(description="Run crafted cases one by one against a server and print them.")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kind", action="append", help="only this kind (repeatable); default: all")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slow", action="store_true", help="also cases that take seconds by design")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every reply")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    gen = Crafted(rng, "fz:cx:", slow=args.slow)
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=120)
    reader = StrictReader(sock)
    problems = 0
    outcomes = {}
    for i in range(args.cases):
        case = gen.case(rng.choice(args.kind) if args.kind else None)
        t0 = time.monotonic()
        lines = []
        for j, (argv, _, label) in enumerate(case.steps):
            sock.sendall(encode_command(argv))
            reply = reader.reply()
            problem = case.verify(j, reply)
            if args.verbose or problem:
                lines.append(f"    {argv[0]} {label or ''}: {_show(reply)[:200]}")
            if problem:
                problems += 1
                lines.append(f"    PROBLEM: {problem}")
        print(f"{i} {case.kind}: {case.desc} [{time.monotonic() - t0:.2f} s]", flush=True)
        for line in lines:
            print(line, flush=True)
        key = (case.kind, case.outcome())
        outcomes[key] = outcomes.get(key, 0) + 1
    for (kind, outcome), n in sorted(outcomes.items()):
        print(f"{n:6d}  {kind}: {outcome}")
    print(f"{args.cases} cases, {problems} problems")


if __name__ == "__main__":
    main()
