"""The committed TensorFlow graphs of tests/data (tests/data/gen_tf.py) and how the tests store them, and a small
protobuf reader (GraphDef / NodeDef / AttrValue / TensorProto) with a numpy evaluator, which works out what a graph
computes (the `m:tf` graph recorded from RedisAI is checked with it)."""

import numpy as np

from .data import DATA_DIR

TF_VERSION = "2.21.0"


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


def tf_meta(backend=b"TF", device=b"CPU", tag=b"", batch=0, minbatch=0, inputs=(), outputs=(), minbatchtimeout=0):
    return [b"backend", backend, b"device", device, b"tag", tag, b"batchsize", batch, b"minbatchsize", minbatch,
            b"inputs", [i.encode() for i in inputs], b"outputs", [o.encode() for o in outputs],
            b"minbatchtimeout", minbatchtimeout]


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


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
