"""The TF backend: frozen TensorFlow GraphDefs run through TensorFlow's C API (spec §1.5 steps 7 and 9, §1.6,
§1.8, §1.18, §3.5-3.8), with the tiny graphs of tests/data (tests/data/gen_tf.py):

  tf_mul.pb          a, b -> c = a * b            FLOAT, any shape
  tf_dense.pb        x[batch, 4] -> y = x @ W + B  (xw = x @ W inside; the weights of linear.onnx)
  tf_str_identity.pb s -> t                       STRING
  tf_add_int32.pb    a, b -> c = a + b            INT32

The module is loaded with `TF <path>` (REDISAI_TF_LIB, the libtensorflow_cc.so.2 of the tensorflow-cpu 2.21.0
wheel) and `ONNX <path>` (REDISAI_ONNX_LIB) by helpers/server.py. Outputs are checked against numpy; the `m:tf` graph
recorded from RedisAI (tests/data/redisai-dumps.json) is decoded here with a small protobuf reader and
evaluated in numpy, so that its MODELEXECUTE output is checked against what the graph says it computes.

Behaviour settled for this module (beyond RedisAI 1.2.7): INPUTS/OUTPUTS names may be `op:index`.
"""

import json

import numpy as np
import pytest
import redis

from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import check_error_raw, wait_for
from helpers.data import DATA_DIR, weights
from helpers.onnx_models import (ai_info, blob, concurrent_executes, get_tensor, model_execute, modules_sections,
                                 set_tensor, store)
from helpers.recorded import DUMPS_PATH, recorded_reply
from helpers.resp import RespError, raw_command
from helpers.server import MODULE_PATH, ONNX_LIB

TF_VERSION = "2.21.0"
BOGUS_TF = "/nonexistent/libtensorflow_cc.so.2"

# name: (file, inputs, outputs)
GRAPHS = {
    "mul": ("tf_mul.pb", ["a", "b"], ["c"]),
    "dense": ("tf_dense.pb", ["x"], ["y"]),
    "str_identity": ("tf_str_identity.pb", ["s"], ["t"]),
    "add_int32": ("tf_add_int32.pb", ["a", "b"], ["c"]),
}
_BLOBS = {}


def tf_blob(name):
    """The bytes of the committed graph `name` (a GRAPHS key)."""
    if name not in _BLOBS:
        _BLOBS[name] = (DATA_DIR / GRAPHS[name][0]).read_bytes()
    return _BLOBS[name]


def io_args(inputs, outputs):
    return ["INPUTS", len(inputs), *inputs, "OUTPUTS", len(outputs), *outputs]


def tf_store(con, key, name, *opts, device="CPU", inputs=None, outputs=None):
    """AI.MODELSTORE <key> TF <device> <opts...> INPUTS .. OUTPUTS .. BLOB <graph>; asserts OK."""
    _, ins, outs = GRAPHS[name]
    reply = con.execute_command("AI.MODELSTORE", key, "TF", device, *opts,
                                *io_args(inputs or ins, outputs or outs), "BLOB", tf_blob(name))
    assert reply == b"OK", reply
    return reply


def meta(backend=b"TF", device=b"CPU", tag=b"", batch=0, minbatch=0, inputs=(), outputs=(), minbatchtimeout=0):
    return [b"backend", backend, b"device", device, b"tag", tag, b"batchsize", batch, b"minbatchsize", minbatch,
            b"inputs", [i.encode() for i in inputs], b"outputs", [o.encode() for o in outputs],
            b"minbatchtimeout", minbatchtimeout]


def values_of(con, key):
    return [float(v) for v in con.execute_command("AI.TENSORGET", key, "VALUES")]


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.fixture
def port(shared_server):
    return shared_server.port


# =================================================================================================
# a small protobuf reader (GraphDef / NodeDef / AttrValue / TensorProto) and a numpy evaluator


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def pb_fields(buf):
    """[(field number, wire type, value)]: an int for varints and fixed ints, bytes for length-delimited."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
            assert i <= len(buf), "truncated length-delimited field"
        elif wire == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise AssertionError(f"unsupported wire type {wire}")
        out.append((num, wire, v))
    return out


DT_NAMES = {1: "FLOAT", 3: "INT32", 7: "STRING"}
DT_NUMPY = {1: np.float32, 3: np.int32}


def _shape(buf):
    """TensorShapeProto -> list of dims (None for unknown rank)."""
    dims = []
    for num, _, v in pb_fields(buf):
        if num == 2:
            size = next((s for n, _, s in pb_fields(v) if n == 1), 0)
            dims.append(size - (1 << 64) if size >= 1 << 63 else size)
        elif num == 3 and v:
            return None
    return dims


def _tensor(buf):
    """TensorProto (dtype + shape + tensor_content) -> numpy array."""
    f = {num: v for num, _, v in pb_fields(buf)}
    dtype = DT_NUMPY[f[1]]
    return np.frombuffer(f.get(4, b""), dtype=dtype).reshape(_shape(f.get(2, b"")))


def _attr(buf):
    """AttrValue -> ('type', name) | ('shape', dims) | ('tensor', array) | ('b', bool) | ('raw', fields)."""
    fields = pb_fields(buf)
    for num, _, v in fields:
        if num == 6:
            return ("type", DT_NAMES.get(v, v))
        if num == 7:
            return ("shape", _shape(v))
        if num == 8:
            return ("tensor", _tensor(v))
        if num == 5:
            return ("b", bool(v))
    return ("raw", fields)


def graph_nodes(graph):
    """GraphDef bytes -> [{'name', 'op', 'inputs', 'attrs'}] in file order."""
    nodes = []
    for num, wire, v in pb_fields(graph):
        if num != 1:
            continue
        assert wire == 2
        node = {"name": None, "op": None, "inputs": [], "attrs": {}}
        for n, _, x in pb_fields(v):
            if n == 1:
                node["name"] = x.decode()
            elif n == 2:
                node["op"] = x.decode()
            elif n == 3:
                node["inputs"].append(x.decode())
            elif n == 5:
                entry = {k: val for k, _, val in pb_fields(x)}
                node["attrs"][entry[1].decode()] = _attr(entry.get(2, b""))
        nodes.append(node)
    return nodes


def evaluate(graph, name, feeds):
    """Evaluate output 0 of node `name` of a GraphDef in numpy (Placeholder, Const, Identity, Mul, Add, AddV2,
    MatMul), with `feeds` {placeholder name: array}."""
    nodes = {n["name"]: n for n in graph_nodes(graph)}

    def ev(ref):
        op_name, _, index = ref.partition(":")
        assert index in ("", "0"), f"only output 0 is supported: {ref}"
        node = nodes[op_name]
        data_inputs = [i for i in node["inputs"] if not i.startswith("^")]
        args = [ev(i) for i in data_inputs]
        op = node["op"]
        if op == "Placeholder":
            return feeds[op_name]
        if op == "Const":
            return node["attrs"]["value"][1]
        if op == "Identity":
            return args[0]
        if op == "Mul":
            return args[0] * args[1]
        if op in ("Add", "AddV2"):
            return args[0] + args[1]
        if op == "MatMul":
            return args[0] @ args[1]
        raise AssertionError(f"op {op} not supported by this evaluator")

    return ev(name)


def test_protobuf_reader_on_committed_graphs():
    """Self-check of the reader and the evaluator on the graphs written by gen_tf.py."""
    mul = graph_nodes(tf_blob("mul"))
    assert [(n["name"], n["op"], n["inputs"]) for n in mul] == [
        ("a", "Placeholder", []), ("b", "Placeholder", []), ("c", "Mul", ["a", "b"])]
    assert mul[0]["attrs"] == {"dtype": ("type", "FLOAT"), "shape": ("shape", None)}
    dense = graph_nodes(tf_blob("dense"))
    assert [(n["name"], n["op"]) for n in dense] == [
        ("x", "Placeholder"), ("W", "Const"), ("B", "Const"), ("xw", "MatMul"), ("y", "AddV2")]
    assert dense[0]["attrs"]["shape"] == ("shape", [-1, 4])
    np.testing.assert_array_equal(dense[1]["attrs"]["value"][1], weights.LINEAR_W)
    np.testing.assert_array_equal(dense[2]["attrs"]["value"][1], weights.LINEAR_B)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert_close(evaluate(tf_blob("dense"), "y", {"x": x}), weights.linear(x))
    a = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(evaluate(tf_blob("mul"), "c:0", {"a": a, "b": a}), a * a)
    assert [n["op"] for n in graph_nodes(tf_blob("str_identity"))] == ["Placeholder", "Identity"]
    add = graph_nodes(tf_blob("add_int32"))
    assert [n["attrs"]["dtype"] for n in add[:2]] == [("type", "INT32")] * 2 and add[2]["op"] == "AddV2"


# =================================================================================================
# AI.MODELSTORE TF: success, META, BLOB


@pytest.mark.parametrize("name", list(GRAPHS))
def test_modelstore_meta_and_blob(con, port, name):
    _, ins, outs = GRAPHS[name]
    assert raw_command(port, "AI.MODELSTORE", "m", "TF", "CPU", *io_args(ins, outs), "BLOB", tf_blob(name)) == "OK"
    expected = meta(inputs=ins, outputs=outs)
    assert con.execute_command("AI.MODELGET", "m", "META") == expected
    got = con.execute_command("AI.MODELGET", "m", "BLOB")
    assert isinstance(got, bytes) and got == tf_blob(name)
    assert con.execute_command("AI.MODELGET", "m") == expected + [b"blob", tf_blob(name)]
    assert con.type("m") == b"AI__MODEL"
    # options, lower-case keywords, a chunked BLOB
    g = tf_blob(name)
    assert con.execute_command("ai.modelstore", "m2", "tf", "cpu:1", "TAG", "t 1", "BATCHSIZE", 4, "MINBATCHSIZE", 2,
                               "inputs", len(ins), *ins, "outputs", len(outs), *outs,
                               "blob", g[:10], g[10:30], g[30:]) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META", "BLOB") == meta(
        device=b"cpu:1", tag=b"t 1", batch=4, minbatch=2, inputs=ins, outputs=outs) + [b"blob", g]


def test_modelstore_tf_parse_errors(con, port):
    """§1.5 steps 6-8 for TF, in order."""
    g = tf_blob("mul")
    cases = [
        (["TAG", "t"], "ERR Insufficient arguments, missing model BLOB"),
        (["BLOB", g], "ERR INPUTS not specified for TF"),
        (["OUTPUTS", 1, "c", "BLOB", g], "ERR INPUTS not specified for TF"),
        (["INPUTS", 0, "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", "x", "a", "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", -1, "a", "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", 5, "a", "b", "BLOB", g], "ERR number of model inputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "BLOB", g], "ERR OUTPUTS not specified for TF"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 0, "BLOB", g], "ERR Invalid argument for output_count"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", "y", "BLOB", g], "ERR Invalid argument for output_count"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 4, "c", "BLOB", g],
         "ERR number of model outputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1], "ERR number of model outputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "NOTBLOB", g], "ERR Invalid argument, expected BLOB"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "BLOB"], "ERR Insufficient arguments, missing model BLOB"),
    ]
    for args, msg in cases:
        check_error_raw(port, msg, "AI.MODELSTORE", "m", "TF", "CPU", *args)
    check_error_raw(port, "ERR INPUTS argument should not be specified for this backend",
                    "AI.MODELSTORE", "m", "ONNX", "CPU", "INPUTS", 1, "a", "OUTPUTS", 1, "c", "BLOB", blob("mul"))
    assert con.exists("m") == 0


def test_node_not_found(con, port):
    g = tf_blob("mul")
    check_error_raw(port, 'ERR Input node named "z" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "z"], ["c"]), "BLOB", g)
    # a graph whose output is not named what was asked
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["d"]), "BLOB", g)
    check_error_raw(port, 'ERR Output node named "c" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["x"], ["y", "c"]), "BLOB", tf_blob("dense"))
    # inputs are checked before outputs
    check_error_raw(port, 'ERR Input node named "q" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["q"], ["d"]), "BLOB", g)
    # op:index with an index the op does not have
    check_error_raw(port, 'ERR Input node named "a:1" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a:1", "b"], ["c"]), "BLOB", g)
    check_error_raw(port, 'ERR Output node named "c:1" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c:1"]), "BLOB", g)
    # an empty GraphDef is a valid, empty graph
    check_error_raw(port, 'ERR Input node named "a" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a"], ["c"]), "BLOB", b"")
    assert con.exists("m") == 0
    # a failed store leaves an existing model alone
    tf_store(con, "m", "mul", "TAG", "kept")
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["d"]), "BLOB", g)
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(tag=b"kept", inputs=["a", "b"], outputs=["c"])


def test_input_must_be_a_placeholder(con, port):
    """RedisAI 1.2.7 (src/backends/tensorflow.c, RAI_ModelCreateTF) accepts as input only an op of type
    Placeholder: `oper == NULL || strcmp(TF_OperationOpType(oper), "Placeholder") != 0` -> the not-found error."""
    check_error_raw(port, 'ERR Input node named "c" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["c"], ["c"]), "BLOB", tf_blob("mul"))
    check_error_raw(port, 'ERR Input node named "W" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["W"], ["y"]), "BLOB", tf_blob("dense"))
    assert con.exists("m") == 0


def test_op_index_names(con):
    """INPUTS/OUTPUTS given as `op:index` are kept as given (META, AOF) and select that output of the op."""
    tf_store(con, "m", "mul", inputs=["a:0", "b:0"], outputs=["c:0"])
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(inputs=["a:0", "b:0"], outputs=["c:0"])
    a = np.array([[1.5, -2.0, 3.0]], dtype=np.float32)
    b = np.array([[2.0, 0.25, -1.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * b)
    # two outputs, one of them an inner node of the graph: x @ W and x @ W + B
    tf_store(con, "d", "dense", outputs=["xw:0", "y"])
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    set_tensor(con, "x", x)
    assert model_execute(con, "d", ["x"], ["xw", "y"]) == b"OK"
    assert_close(get_tensor(con, "xw"), x @ weights.LINEAR_W)
    assert_close(get_tensor(con, "y"), weights.linear(x))


def test_corrupt_graphdef(con, port):
    """TensorFlow's own message comes back verbatim (no ERR prefix); nothing is stored."""
    check_error_raw(port, "Invalid GraphDef",
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c"]), "BLOB", b"\xff\xfe not a graph")
    truncated = tf_blob("dense")[:60]
    check_error_raw(port, "Invalid GraphDef",
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["x"], ["y"]), "BLOB", truncated)
    # a well-formed GraphDef with an op TensorFlow does not know
    bogus = b"\x0a\x0a\x0a\x01z\x12\x05Bogus"
    # An op TensorFlow does not know is refused by admission (docs/security.md) before TensorFlow sees it.
    check_error_raw(port, "ERR TF model refused: node 'z' uses op Bogus, which is not an op of TensorFlow 2.21.0 "
                    "nor a function of the graph", "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["z"], ["z"]), "BLOB",
                    bogus)
    assert con.exists("m") == 0
    assert con.ping()


@pytest.mark.parametrize("device", ["GPU", "GPU:0", "gpu:1"])
def test_gpu_device(con, port, device):
    check_error_raw(port, "ERR GPU requested but TF couldn't find CUDA",
                    "AI.MODELSTORE", "m", "TF", device, *io_args(["x"], ["y"]), "BLOB", tf_blob("dense"))
    assert con.exists("m") == 0


def test_modelset_deprecated(con, port):
    g = tf_blob("mul")
    assert con.execute_command("AI.MODELSET", "m", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "c", "BLOB", g) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == meta(inputs=["a", "b"], outputs=["c"]) + [
        b"blob", g]
    a = np.array([2.0, 3.0, -4.0], dtype=np.float32)
    set_tensor(con, "a", a)
    assert con.execute_command("AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * a)
    assert con.execute_command("AI.MODELSET", "m2", "TF", "CPU", "TAG", "old", "INPUTS", "x", "OUTPUTS", "xw", "y",
                               "BLOB", tf_blob("dense")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META") == meta(tag=b"old", inputs=["x"], outputs=["xw", "y"])
    # the MODELSET-only TF errors (spec §1.5, deprecated.c)
    check_error_raw(port, "ERR Insufficient arguments, INPUTS and OUTPUTS not specified",
                    "AI.MODELSET", "m3", "TF", "CPU", "BLOB", g)
    check_error_raw(port, "ERR INPUTS not specified", "AI.MODELSET", "m3", "TF", "CPU", "not_inputs", "BLOB", g)
    check_error_raw(port, "ERR OUTPUTS not specified", "AI.MODELSET", "m3", "TF", "CPU", "INPUTS", "a", "b", "BLOB", g)
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSET", "m3", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "d", "BLOB", g)
    assert con.exists("m3") == 0


# =================================================================================================
# AI.MODELEXECUTE


def test_execute_mul(con):
    tf_store(con, "m", "mul")
    rng = np.random.default_rng(1)
    for shape in [(1,), (7,), (2, 3), (2, 3, 4), ()]:
        a = np.asarray(rng.standard_normal(shape), dtype=np.float32)
        b = np.asarray(rng.standard_normal(shape), dtype=np.float32)
        # (set_tensor would make a scalar 1-D: np.ascontiguousarray returns at least one dimension)
        assert con.execute_command("AI.TENSORSET", "a", "FLOAT", *shape, "BLOB", a.tobytes()) == b"OK"
        assert con.execute_command("AI.TENSORSET", "b", "FLOAT", *shape, "BLOB", b.tobytes()) == b"OK"
        assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
        c = get_tensor(con, "c")
        assert c.shape == shape
        np.testing.assert_array_equal(c, a * b)
    # broadcasting is TensorFlow's
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([10.0, -1.0], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"], "TIMEOUT", 10000) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * b)
    info = ai_info(con, "m")
    assert (info["backend"], info["calls"], info["errors"]) == (b"TF", 6, 0), info


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_execute_dense(con, batch):
    tf_store(con, "m", "dense")
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "META") == [b"dtype", b"FLOAT", b"shape", [batch, 3]]
    assert_close(get_tensor(con, "y"), weights.linear(x))
    assert ai_info(con, "m")["samples"] == batch


def test_execute_str_identity(con):
    tf_store(con, "m", "str_identity")
    values = ["alpha", "", "βeta", "日本語", "x" * 300, ""]
    con.execute_command("AI.TENSORSET", "s", "STRING", 2, 3, "VALUES", *values)
    assert model_execute(con, "m", ["s"], ["t"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"STRING", b"shape", [2, 3]]
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [v.encode() for v in values]
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == b"".join(v.encode() + b"\x00" for v in values)
    # a single empty string
    con.execute_command("AI.TENSORSET", "s1", "STRING", 1, "BLOB", b"\x00")
    assert model_execute(con, "m", ["s1"], ["t1"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t1", "META", "BLOB") == [b"dtype", b"STRING", b"shape", [1],
                                                                         b"blob", b"\x00"]


def test_execute_int32_add(con):
    tf_store(con, "m", "add_int32")
    a = np.array([[1, -2, 3], [2**31 - 1, 0, -(2**31)]], dtype=np.int32)
    b = np.array([[10, 20, -30], [1, 7, 0]], dtype=np.int32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", b"INT32", b"shape", [2, 3]]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(get_tensor(con, "c"), a + b)  # int32 wrap-around, as TensorFlow does
    assert con.execute_command("AI.TENSORGET", "c", "VALUES")[:3] == [11, 18, -27]


def test_execute_errors(con, port):
    """Backend errors come back as TensorFlow's message on one line; the server stays up; no output stored."""
    tf_store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    set_tensor(con, "b", np.ones((3,), dtype=np.float32))
    reply = raw_command(port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c")
    assert isinstance(reply, RespError), reply
    assert reply.startswith("Incompatible shapes"), reply
    assert "\n" not in reply and "\r" not in reply, repr(reply)
    assert con.exists("c") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"], info["samples"]) == (1, 1, 0), info
    # the wrong dtype
    tf_store(con, "i", "add_int32")
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "i", ["a", "a"], ["c"])
    assert "int32" in str(e.value) and "\n" not in str(e.value), str(e.value)
    # the argument counts are checked against the INPUTS/OUTPUTS given at store time
    check_error_raw(port, "Number of keys given as INPUTS here does not match model definition",
                    "AI.MODELEXECUTE", "m", "INPUTS", 1, "a", "OUTPUTS", 1, "c")
    check_error_raw(port, "Number of keys given as OUTPUTS here does not match model definition",
                    "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 2, "c", "d")
    assert con.exists("c") == 0
    # and the model still runs
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), np.ones((2, 2), dtype=np.float32))
    assert con.ping()


# =================================================================================================
# persistence and replication


def populate(con):
    """The four graphs with a few options; returns {key: MODELGET META BLOB}."""
    tf_store(con, "tf:mul", "mul", "TAG", "t one")
    tf_store(con, "tf:dense", "dense", "TAG", "d", "BATCHSIZE", 8, "MINBATCHSIZE", 2, device="CPU:1")
    tf_store(con, "tf:str", "str_identity")
    tf_store(con, "tf:int", "add_int32", inputs=["a:0", "b"])
    return {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in ("tf:mul", "tf:dense", "tf:str", "tf:int")}


def check_models(con, before):
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    a = np.array([1.5, -2.0, 4.0], dtype=np.float32)
    set_tensor(con, "ca", a)
    assert model_execute(con, "tf:mul", ["ca", "ca"], ["cc"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "cc"), a * a)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    set_tensor(con, "cx", x)
    assert model_execute(con, "tf:dense", ["cx"], ["cy"]) == b"OK"
    assert_close(get_tensor(con, "cy"), weights.linear(x))
    con.execute_command("AI.TENSORSET", "cs", "STRING", 2, "VALUES", "", "q")
    assert model_execute(con, "tf:str", ["cs"], ["ct"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "ct", "VALUES") == [b"", b"q"]
    i = np.array([5, -7], dtype=np.int32)
    set_tensor(con, "ci", i)
    assert model_execute(con, "tf:int", ["ci", "ci"], ["co"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "co"), i + i)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite(server):
    con = server.client()
    before = populate(con)
    bgrewriteaof(server, con)
    stores = {c[1].decode(): c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert set(stores) == set(before)
    assert stores["tf:mul"] == [b"AI.MODELSTORE", b"tf:mul", b"TF", b"CPU", b"TAG", b"t one", b"BATCHSIZE", b"0",
                                b"MINBATCHSIZE", b"0", b"MINBATCHTIMEOUT", b"0", b"INPUTS", b"2", b"a", b"b",
                                b"OUTPUTS", b"1", b"c", b"BLOB", tf_blob("mul")]
    assert stores["tf:dense"] == [b"AI.MODELSTORE", b"tf:dense", b"TF", b"CPU:1", b"TAG", b"d", b"BATCHSIZE", b"8",
                                  b"MINBATCHSIZE", b"2", b"MINBATCHTIMEOUT", b"0", b"INPUTS", b"1", b"x",
                                  b"OUTPUTS", b"1", b"y", b"BLOB", tf_blob("dense")]
    assert stores["tf:int"][12:19] == [b"INPUTS", b"2", b"a:0", b"b", b"OUTPUTS", b"1", b"c"]
    assert stores["tf:str"][12:] == [b"INPUTS", b"1", b"s", b"OUTPUTS", b"1", b"t", b"BLOB", tf_blob("str_identity")]
    server.restart()
    con = server.client()
    check_models(con, before)


def test_debug_reload(server):
    con = server.client()
    before = populate(con)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_models(con, before)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_replication(server, make_replica):
    """MODELSTORE reaches the replica verbatim (the replica builds the graph itself); MODELEXECUTE is not
    replicated, its outputs are, as AI.TENSORSET. The master's AOF holds the propagated stream."""
    master = server
    mcon = master.client()
    tf_store(mcon, "early", "mul", "TAG", "full sync")  # through the full sync (RDB)
    replica = make_replica(master)
    rcon = replica.client()
    g = tf_blob("dense")
    assert mcon.execute_command("ai.modelstore", "m", "tf", "cpu", "TAG", "v1", "inputs", 1, "x", "outputs", 2,
                                "xw", "y:0", "BLOB", g[:50], g[50:]) == b"OK"
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    set_tensor(mcon, "x", x)
    assert model_execute(mcon, "m", ["x"], ["xw", "y"]) == b"OK"
    a = np.array([1.5, 2.5], dtype=np.float32)
    set_tensor(mcon, "a", a)
    assert model_execute(mcon, "early", ["a", "a"], ["c"]) == b"OK"
    assert mcon.execute_command("WAIT", 1, 10000) == 1
    for k in ("early", "m"):
        assert rcon.execute_command("AI.MODELGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.MODELGET", k, "META", "BLOB")
        assert ai_info(rcon, k)["calls"] == 0
    for k in ("xw", "y", "c"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB")
    assert_close(get_tensor(rcon, "y"), weights.linear(x))
    np.testing.assert_array_equal(get_tensor(rcon, "c"), a * a)
    # the names and the device string as given
    assert rcon.execute_command("AI.MODELGET", "m", "META") == meta(
        device=b"cpu", tag=b"v1", inputs=["x"], outputs=["xw", "y:0"])

    # what was propagated
    def stream():
        return [c for c in aof_commands(master, "incr") if c[0].upper() not in (b"SELECT", b"MULTI", b"EXEC")]

    wait_for(lambda: any(c[0].upper() == b"AI.TENSORSET" and c[1] == b"c" for c in stream()), 10,
             what="the outputs in the AOF")
    got = stream()
    names = [c[0].upper() for c in got]
    assert b"AI.MODELEXECUTE" not in names
    assert [b"ai.modelstore", b"m", b"tf", b"cpu", b"TAG", b"v1", b"inputs", b"1", b"x", b"outputs", b"2", b"xw",
            b"y:0", b"BLOB", g[:50], g[50:]] in got
    tensorsets = {c[1]: c for c in got if c[0].upper() == b"AI.TENSORSET"}
    assert set(tensorsets) == {b"x", b"xw", b"y", b"a", b"c"}
    y = mcon.execute_command("AI.TENSORGET", "y", "BLOB")
    assert tensorsets[b"y"][1:] == [b"y", b"FLOAT", b"5", b"3", b"BLOB", y]
    assert tensorsets[b"c"][1:] == [b"c", b"FLOAT", b"2", b"BLOB", (a * a).tobytes()]


# =================================================================================================
# DUMP / RESTORE of the TF model recorded from RedisAI


def _tf_case():
    try:
        with open(DUMPS_PATH) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        pytest.fail(f"cannot read the recorded dumps {DUMPS_PATH}: {e} (set REDISAI_COMPAT_DUMPS)", pytrace=False)
    for c in data["cases"]:
        if c["key"] == "m:tf":
            return c
    pytest.fail(f"recorded case 'm:tf' not found in {DUMPS_PATH}", pytrace=False)


def test_restore_recorded_tf(con):
    case = _tf_case()
    assert con.restore("m:tf", 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    assert con.type("m:tf") == b"AI__MODEL"
    (r,) = case["replies"]
    assert r["cmd"] == ["AI.MODELGET", "m:tf", "META"]
    recorded_meta = recorded_reply(r["reply"])
    assert con.execute_command("AI.MODELGET", "m:tf", "META") == recorded_meta
    assert recorded_meta == meta(tag=b"v1", inputs=["a", "b"], outputs=["c"])
    # the payload is the graph RedisAI was given
    graph = con.execute_command("AI.MODELGET", "m:tf", "BLOB")
    assert graph == bytes.fromhex(case["create"][-1])
    # what it computes: a, b FLOAT placeholders of shape [-1]; c = Identity(a * b)
    nodes = graph_nodes(graph)
    assert [(n["name"], n["op"], n["inputs"]) for n in nodes] == [
        ("a", "Placeholder", []), ("b", "Placeholder", []), ("mul", "Mul", ["a", "b"]),
        ("c", "Identity", ["mul"]), ("Identity", "Identity", ["c"])]
    for n in nodes[:2]:
        assert n["attrs"] == {"shape": ("shape", [-1]), "dtype": ("type", "FLOAT")}, n
    a = np.array([1.5, -2.0, 3.25, 0.0, 1e-3], dtype=np.float32)
    b = np.array([4.0, 0.5, -2.0, 7.0, 1e3], dtype=np.float32)
    want = evaluate(graph, "c", {"a": a, "b": b})
    np.testing.assert_array_equal(want, a * b)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m:tf", ["a", "b"], ["out"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "out", "META") == [b"dtype", b"FLOAT", b"shape", [5]]
    np.testing.assert_array_equal(get_tensor(con, "out"), want)
    # our DUMP of it RESTOREs again, same META and payload, and runs
    payload = con.dump("m:tf")
    assert payload is not None
    assert con.restore("m:tf:copy", 0, payload) == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf:copy", "META", "BLOB") == recorded_meta + [b"blob", graph]
    assert model_execute(con, "m:tf:copy", ["b", "a"], ["out2"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "out2"), b * a)
    assert con.restore("m:tf", 0, payload, replace=True) == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf", "META") == recorded_meta
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf:copy", "META", "BLOB") == recorded_meta + [b"blob", graph]


# =================================================================================================
# INFO MODULES


def test_info_modules_backends(server):
    con = server.client()
    tf_store(con, "t", "mul")
    backends = dict(modules_sections(server))["ai_backends_info"]
    assert ("ai_TensorFlow_version", TF_VERSION) in backends, backends
    # with ONNX Runtime loaded too, TensorFlow comes first (RedisAI's order: TF, TFLITE, TORCH, ONNX)
    store(con, "o", "mul")
    set_tensor(con, "a", np.ones((1, 1), dtype=np.float32))
    assert model_execute(con, "o", ["a", "a"], ["c"]) == b"OK"
    assert model_execute(con, "t", ["a", "a"], ["c2"]) == b"OK"
    keys = [k for k, _ in dict(modules_sections(server))["ai_backends_info"]]
    assert "ai_TensorFlow_version" in keys and "ai_onnxruntime_version" in keys, keys
    assert keys.index("ai_TensorFlow_version") < keys.index("ai_onnxruntime_version"), keys
    assert keys[0] == "ai_TensorFlow_version", keys


# =================================================================================================
# DAGs mixing TF and ONNX models on two devices


@pytest.mark.parametrize("tf_dev,onnx_dev", [("CPU", "CPU:1"), ("CPU:1", "CPU")])
def test_dag_tf_and_onnx(con, tf_dev, onnx_dev):
    tf_store(con, "tfdense", "dense", device=tf_dev)
    tf_store(con, "tfmul", "mul", device=tf_dev)
    store(con, "onnxlinear", "linear", device=onnx_dev)  # the same weights as tf_dense
    x = np.random.default_rng(11).standard_normal((6, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    reply = con.execute_command(
        "AI.DAGEXECUTE", "LOAD", 1, "x", "PERSIST", 1, "out",
        "|>", "AI.MODELEXECUTE", "tfdense", "INPUTS", 1, "x", "OUTPUTS", 1, "y1",
        "|>", "AI.MODELEXECUTE", "onnxlinear", "INPUTS", 1, "x", "OUTPUTS", 1, "y2",
        "|>", "AI.MODELEXECUTE", "tfmul", "INPUTS", 2, "y1", "y2", "OUTPUTS", 1, "out",
        "|>", "AI.TENSORGET", "out", "VALUES")
    assert reply[:3] == [b"OK", b"OK", b"OK"], reply
    want = weights.linear(x) * weights.linear(x)
    np.testing.assert_allclose(np.array([float(v) for v in reply[3]]).reshape(6, 3), want, rtol=1e-5, atol=1e-6)
    assert con.execute_command("AI.TENSORGET", "out", "META") == [b"dtype", b"FLOAT", b"shape", [6, 3]]
    np.testing.assert_allclose(get_tensor(con, "out"), want, rtol=1e-5, atol=1e-6)
    assert con.exists("y1") == 0 and con.exists("y2") == 0
    for k in ("tfdense", "tfmul", "onnxlinear"):
        info = ai_info(con, k)
        assert (info["calls"], info["errors"]) == (1, 0), (k, info)
    # a TF error inside the DAG is that op's reply; nothing is persisted
    set_tensor(con, "bad", np.ones((2, 5), dtype=np.float32))
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "bad", "PERSIST", 1, "out2",
                              "|>", "AI.MODELEXECUTE", "tfdense", "INPUTS", 1, "bad", "OUTPUTS", 1, "out2",
                              "|>", "AI.TENSORGET", "out2", "META")
    assert len(ret) == 2 and isinstance(ret[0], redis.exceptions.ResponseError), ret
    assert "\n" not in str(ret[0]), str(ret[0])
    assert ret[1] == b"NA", ret
    assert con.exists("out2") == 0


# =================================================================================================
# concurrency and thread options


@pytest.mark.module_args("THREADS_PER_QUEUE", "4")
def test_concurrent_execute(server):
    """8 clients x 25 MODELEXECUTE of tf_dense, each with its own input: every output belongs to its input."""
    con = server.client()
    tf_store(con, "m", "dense")
    n_threads, n_runs = 8, 25
    inputs, results = concurrent_executes(server, "m", n_threads, n_runs)
    for key, x in inputs.items():
        assert_close(results[key], weights.linear(x))
    # exact: each output is bit for bit what a run of the same input alone gives
    for (t, i), x in inputs.items():
        if i % 5 == 0:
            assert model_execute(con, "m", [f"x:{t}:{i}"], ["ref"]) == b"OK"
            assert get_tensor(con, "ref").tobytes() == results[t, i].tobytes(), (t, i)
    info = ai_info(con, "m")
    assert (info["errors"], info["samples"]) == (0, 2 * (n_threads * n_runs + n_threads * n_runs // 5)), info


@pytest.mark.module_args("INTRA_OP_PARALLELISM", "1", "INTER_OP_PARALLELISM", "1", "THREADS_PER_QUEUE", "2")
def test_intra_inter_op_parallelism_one(server):
    fields = dict(dict(modules_sections(server))["ai_load_time_configs"])
    assert (fields["ai_intra_op_parallelism"], fields["ai_inter_op_parallelism"]) == ("1", "1"), fields
    con = server.client()
    tf_store(con, "d", "dense")
    tf_store(con, "m", "mul", device="CPU:1")
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        set_tensor(con, "x", x)
        assert model_execute(con, "d", ["x"], ["y"]) == b"OK"
        assert_close(get_tensor(con, "y"), weights.linear(x))
        assert model_execute(con, "m", ["y", "y"], ["z"]) == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "z"), get_tensor(con, "y") * get_tensor(con, "y"))


# =================================================================================================
# without the TensorFlow library


def test_without_tf_library(make_server):
    args = ["--loadmodule", MODULE_PATH] + (["ONNX", ONNX_LIB] if ONNX_LIB else []) + ["TF", BOGUS_TF]
    srv = make_server(load_module=False, server_args=args, name="no_tf")
    con = srv.client()
    set_tensor(con, "a", np.array([[1.0, 2.0]], dtype=np.float32))
    assert con.execute_command("AI.TENSORGET", "a", "VALUES") == [b"1", b"2"]
    for cmd in (["AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c"]), "BLOB", tf_blob("mul")],
                ["AI.MODELSET", "m", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "c", "BLOB", tf_blob("mul")]):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command(*cmd)
        assert "Could not load backend TF from /nonexistent" in str(e.value), str(e.value)
    assert con.exists("m") == 0
    backends = dict(modules_sections(srv)).get("ai_backends_info", [])
    assert "ai_TensorFlow_version" not in dict(backends), backends
    # the parse errors come first, as with the library
    check_error_raw(srv.port, "ERR INPUTS not specified for TF", "AI.MODELSTORE", "m", "TF", "CPU", "BLOB", b"x")
    # ONNX models are unaffected
    store(con, "o", "mul")
    assert model_execute(con, "o", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"1", b"4"]
    assert con.ping()


@pytest.mark.parametrize("setting", [None, "1"])
def test_onednn_kernels_only_when_the_operator_turns_them_on(make_server, monkeypatch, setting):
    """RedisAI's TensorFlow 2.8 ran graphs with Eigen's kernels; 2.9 turned oneDNN's on by default (for small graphs
    slower per run, results differing in the last bits). The module opens TensorFlow with TF_ENABLE_ONEDNN_OPTS=0
    unless the server's environment sets it; TensorFlow says at start-up when oneDNN's kernels are on."""
    if setting is None:
        monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    else:
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", setting)
    srv = make_server()
    con = srv.client()
    tf_store(con, "m", "mul")
    con.execute_command("AI.TENSORSET", "a", "FLOAT", 2, "VALUES", 1.5, -2)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"2.25", b"4"]
    assert ("oneDNN custom operations are on" in srv.log()) == (setting == "1")
