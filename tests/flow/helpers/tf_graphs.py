"""Hand-encoded TensorFlow GraphDefs for the flow tests (no TensorFlow package): the encoders of
tests/data/gen_tf.py (which writes files when imported), plus function libraries and the attr kinds the
security tests need. Field numbers: tensorflow/core/framework/{graph,node_def,function,attr_value,op_def,
tensor,tensor_shape}.proto.
"""
import struct

DT_FLOAT, DT_INT32, DT_STRING, DT_INT64, DT_BOOL = 1, 3, 7, 9, 10


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(num, wire, payload):
    """A varint field (wire 0) or a length-delimited one (wire 2)."""
    if wire == 0:
        return varint(num << 3) + varint(payload)
    return varint((num << 3) | 2) + varint(len(payload)) + payload


def _b(s):
    return s if isinstance(s, bytes) else s.encode()


def shape(dims):
    if dims is None:
        return field(3, 0, 1)  # unknown_rank
    return b"".join(field(2, 2, field(1, 0, d)) for d in dims)


# ---- AttrValue (s = 2, i = 3, f = 4, b = 5, type = 6, shape = 7, tensor = 8, list = 1, func = 10)


def a_type(t):
    return field(6, 0, t)


def a_str(s):
    return field(2, 2, _b(s))


def a_int(i):
    return field(3, 0, i)


def a_bool(b):
    return field(5, 0, int(b))


def a_shape(dims):
    return field(7, 2, shape(dims))


def a_strs(values):
    """list(string)."""
    return field(1, 2, b"".join(field(2, 2, _b(v)) for v in values))


def a_types(types):
    """list(type) (packed)."""
    return field(1, 2, field(6, 2, b"".join(varint(t) for t in types)))


def name_attr_list(name, attrs=()):
    return field(1, 2, _b(name)) + b"".join(field(2, 2, field(1, 2, _b(k)) + field(2, 2, v)) for k, v in attrs)


def a_func(name, attrs=()):
    return field(10, 2, name_attr_list(name, attrs))


def a_funcs(names):
    """list(func)."""
    return field(1, 2, b"".join(field(9, 2, name_attr_list(n)) for n in names))


def tensor_proto(dtype, dims, content=b"", strings=(), ints=()):
    t = field(1, 0, dtype) + field(2, 2, shape(dims))
    if content:
        t += field(4, 2, content)
    t += b"".join(field(8, 2, _b(s)) for s in strings)  # string_val
    if ints:
        t += field(7, 2, b"".join(varint(i) for i in ints))  # int_val (packed)
    return t


def a_tensor(dtype, dims, **kw):
    return field(8, 2, tensor_proto(dtype, dims, **kw))


# ---- NodeDef / FunctionDef / GraphDef


def node_def(name, op, inputs=(), attrs=()):
    body = field(1, 2, _b(name)) + field(2, 2, _b(op))
    for i in inputs:
        body += field(3, 2, _b(i))
    for k, v in attrs:
        body += field(5, 2, field(1, 2, _b(k)) + field(2, 2, v))
    return body


def placeholder(name, dtype, dims=None):
    return node_def(name, "Placeholder", attrs=[("dtype", a_type(dtype)), ("shape", a_shape(dims))])


def const_str(name, *values):
    dims = [] if len(values) == 1 else [len(values)]
    return node_def(name, "Const", attrs=[("dtype", a_type(DT_STRING)),
                                          ("value", a_tensor(DT_STRING, dims, strings=values))])


def const_float(name, value):
    return node_def(name, "Const", attrs=[("dtype", a_type(DT_FLOAT)),
                                          ("value", a_tensor(DT_FLOAT, [], content=struct.pack("<f", value)))])


def function_def(name, inputs=(), outputs=(), nodes=(), ret=(), attrs=()):
    """FunctionDef: signature (OpDef: name 1, input_arg 2, output_arg 3, attr 4), node_def 3, ret 4.
    inputs/outputs: [(arg name, dtype)]; ret: [(output arg, "node:out_arg:index")]; attrs: [(name, type)]."""
    sig = field(1, 2, _b(name))
    sig += b"".join(field(2, 2, field(1, 2, _b(n)) + field(3, 0, t)) for n, t in inputs)
    sig += b"".join(field(3, 2, field(1, 2, _b(n)) + field(3, 0, t)) for n, t in outputs)
    sig += b"".join(field(4, 2, field(1, 2, _b(n)) + field(2, 2, _b(t))) for n, t in attrs)
    body = field(1, 2, sig) + b"".join(field(3, 2, n) for n in nodes)
    body += b"".join(field(4, 2, field(1, 2, _b(k)) + field(2, 2, _b(v))) for k, v in ret)
    return body


def graph_def(nodes, functions=(), producer=1205):
    g = b"".join(field(1, 2, n) for n in nodes)
    if functions:
        g += field(2, 2, b"".join(field(1, 2, f) for f in functions))
    return g + field(4, 2, field(1, 0, producer))


def while_go():
    """go BOOL [1] -> y INT32: a `While` that counts from 0 for as long as `go` (its only element) is true, which
    it stays: with go = 1 it never ends unless stopped; with go = 0 it returns 0 at once."""
    scalar = node_def("scalar", "Const", attrs=[("dtype", a_type(DT_INT32)), ("value", a_tensor(DT_INT32, [0]))])
    as_scalar = node_def("b", "Reshape", ["go", "scalar:output:0"],
                         attrs=[("T", a_type(DT_BOOL)), ("Tshape", a_type(DT_INT32))])
    cond = function_def("cond", inputs=[("go", DT_BOOL), ("i", DT_INT32)], outputs=[("b", DT_BOOL)],
                        nodes=[scalar, as_scalar], ret=[("b", "b:output:0")])
    one = node_def("one", "Const", attrs=[("dtype", a_type(DT_INT32)),
                                          ("value", a_tensor(DT_INT32, [], content=struct.pack("<i", 1)))])
    body = function_def("body", inputs=[("go", DT_BOOL), ("i", DT_INT32)], outputs=[("g", DT_BOOL), ("j", DT_INT32)],
                        nodes=[one, node_def("next", "AddV2", ["i", "one:output:0"], attrs=[("T", a_type(DT_INT32))]),
                               node_def("same", "Identity", ["go"], attrs=[("T", a_type(DT_BOOL))])],
                        ret=[("g", "same:output:0"), ("j", "next:z:0")])
    zero = node_def("zero", "Const", attrs=[("dtype", a_type(DT_INT32)),
                                            ("value", a_tensor(DT_INT32, [], content=struct.pack("<i", 0)))])
    loop = node_def("loop", "While", ["go", "zero"], attrs=[("T", a_types([DT_BOOL, DT_INT32])), ("cond", a_func("cond")),
                                                          ("body", a_func("body")), ("parallel_iterations", a_int(10))])
    return graph_def([placeholder("go", DT_BOOL), zero, loop,
                      node_def("y", "Identity", ["loop:1"], attrs=[("T", a_type(DT_INT32))])], functions=[cond, body])
