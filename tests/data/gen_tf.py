"""Regenerates the tiny frozen TensorFlow graphs (GraphDef protobufs) used by the flow tests.

    python3 tests/data/gen_tf.py

TensorFlow itself is not needed: the few GraphDef messages are encoded by hand below (tensorflow/core/
framework/{graph,node_def,attr_value,tensor,tensor_shape}.proto). Weights come from `weights.py`.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weights  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))
DT_FLOAT, DT_INT32, DT_STRING = 1, 3, 7


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(num, wire, payload):
    if wire == 0:
        return varint(num << 3) + varint(payload)
    return varint((num << 3) | 2) + varint(len(payload)) + payload


def shape(dims):
    if dims is None:
        return field(3, 0, 1)  # unknown_rank
    return b"".join(field(2, 2, field(1, 0, d)) for d in dims)


def attr(key, value):
    return field(5, 2, field(1, 2, key.encode()) + field(2, 2, value))


def attr_type(t):
    return field(6, 0, t)


def attr_bool(b):
    return field(5, 0, int(b))


def attr_shape(dims):
    return field(7, 2, shape(dims))


def attr_tensor(array, dtype):
    t = field(1, 0, dtype) + field(2, 2, shape(list(array.shape))) + field(4, 2, array.astype("<f4").tobytes())
    return field(8, 2, t)


def node(name, op, inputs=(), attrs=()):
    body = field(1, 2, name.encode()) + field(2, 2, op.encode())
    for i in inputs:
        body += field(3, 2, i.encode())
    for k, v in attrs:
        body += attr(k, v)
    return field(1, 2, body)


def graph(*nodes):
    return b"".join(nodes) + field(4, 2, field(1, 0, 1205))


def placeholder(name, dtype, dims=None):
    return node(name, "Placeholder", attrs=[("dtype", attr_type(dtype)), ("shape", attr_shape(dims))])


def save(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


# c = a * b (FLOAT, any shape): stored as INPUTS 2 a b OUTPUTS 1 c.
save("tf_mul.pb", graph(placeholder("a", DT_FLOAT), placeholder("b", DT_FLOAT),
                        node("c", "Mul", ["a", "b"], [("T", attr_type(DT_FLOAT))])))

# y = x @ W + B with x [batch, 4] (the weights of linear.onnx): INPUTS 1 x OUTPUTS 1 y.
save("tf_dense.pb", graph(
    placeholder("x", DT_FLOAT, [-1, 4]),
    node("W", "Const", attrs=[("dtype", attr_type(DT_FLOAT)), ("value", attr_tensor(weights.LINEAR_W, DT_FLOAT))]),
    node("B", "Const", attrs=[("dtype", attr_type(DT_FLOAT)), ("value", attr_tensor(weights.LINEAR_B, DT_FLOAT))]),
    node("xw", "MatMul", ["x", "W"], [("T", attr_type(DT_FLOAT)), ("transpose_a", attr_bool(False)),
                                       ("transpose_b", attr_bool(False))]),
    node("y", "AddV2", ["xw", "B"], [("T", attr_type(DT_FLOAT))])))

# STRING identity: INPUTS 1 s OUTPUTS 1 t.
save("tf_str_identity.pb", graph(placeholder("s", DT_STRING), node("t", "Identity", ["s"], [("T", attr_type(DT_STRING))])))

# INT32 c = a + b.
save("tf_add_int32.pb", graph(placeholder("a", DT_INT32), placeholder("b", DT_INT32),
                              node("c", "AddV2", ["a", "b"], [("T", attr_type(DT_INT32))])))

print("graphs written to", OUT)
