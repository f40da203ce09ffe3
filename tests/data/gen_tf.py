"""Regenerates the tiny frozen TensorFlow graphs (GraphDef protobufs) used by the flow tests.

    python3 tests/data/gen_tf.py

TensorFlow itself is not needed: the few GraphDef messages are encoded by hand with the encoders the flow tests
use (tests/flow/helpers/tf_graphs.py). Weights come from `weights.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "flow"))
import weights  # noqa: E402
# The GraphDef encoders are shared with the flow tests (the package tests/flow/helpers).
from helpers.tf_graphs import (DT_FLOAT, DT_INT32, DT_STRING, a_bool, a_tensor, a_type, graph_def,  # noqa: E402
                               node_def, placeholder)

attr_type, attr_bool = a_type, a_bool

OUT = os.path.dirname(os.path.abspath(__file__))


def node(name, op, inputs=(), attrs=()):
    return node_def(name, op, inputs, attrs)


def graph(*nodes):
    return graph_def(nodes)


def attr_tensor(array, dtype):
    return a_tensor(dtype, list(array.shape), content=array.astype("<f4").tobytes())


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
