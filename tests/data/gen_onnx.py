"""Regenerates the tiny ONNX models used by the flow tests and benchmarks.

    python3 -m pip install onnx numpy && python3 tests/data/gen_onnx.py

Weights are deterministic (see `weights.py`), so tests recompute every expected output with numpy.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weights  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))
F, S, I32 = TensorProto.FLOAT, TensorProto.STRING, TensorProto.INT32


def save(name, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, producer_name="redisai-rs tests", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    with open(os.path.join(OUT, name + ".onnx"), "wb") as f:
        f.write(model.SerializeToString())


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


# c = a * b, any shape (broadcasting as numpy).
save("mul", [helper.make_node("Mul", ["a", "b"], ["c"])],
     [vi("a", F, ["n", "m"]), vi("b", F, ["n", "m"])], [vi("c", F, ["n", "m"])])

# y = x @ W + B with x [batch, 4]: dimension 0 free, for batching.
save("linear", [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
     [vi("x", F, ["batch", 4])], [vi("y", F, ["batch", 3])],
     [numpy_helper.from_array(weights.LINEAR_W, "W"), numpy_helper.from_array(weights.LINEAR_B, "B")])

# Two outputs: x + 1 and x * 2.
one = numpy_helper.from_array(np.array(1, dtype=np.float32), "one")
two = numpy_helper.from_array(np.array(2, dtype=np.float32), "two")
save("two_outputs", [helper.make_node("Add", ["x", "one"], ["plus_one"]), helper.make_node("Mul", ["x", "two"], ["times_two"])],
     [vi("x", F, ["batch", "m"])], [vi("plus_one", F, ["batch", "m"]), vi("times_two", F, ["batch", "m"])], [one, two])

# STRING identity.
save("str_identity", [helper.make_node("Identity", ["s"], ["t"])], [vi("s", S, ["n"])], [vi("t", S, ["n"])])

# INT32 addition.
save("add_int32", [helper.make_node("Add", ["a", "b"], ["c"])],
     [vi("a", I32, ["n"]), vi("b", I32, ["n"])], [vi("c", I32, ["n"])])

# Compute-heavy: HEAVY_DEPTH x (MatMul 256x256 + Tanh), dimension 0 free. For benchmarks and DAG parallelism.
nodes, prev = [], "x"
for i in range(weights.HEAVY_DEPTH):
    nodes.append(helper.make_node("MatMul", [prev, "W"], [f"m{i}"]))
    prev = f"h{i}" if i < weights.HEAVY_DEPTH - 1 else "y"
    nodes.append(helper.make_node("Tanh", [f"m{i}"], [prev]))
save("heavy", nodes, [vi("x", F, ["batch", weights.HEAVY_WIDTH])], [vi("y", F, ["batch", weights.HEAVY_WIDTH])],
     [numpy_helper.from_array(weights.HEAVY_W, "W")])

# Reveals batching: y = x + sum of x over dimension 0. Alone (one row) y = 2x; batched with other
# requests, every row also gets the others' rows.
save("batch_sum", [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])],
     [vi("x", F, ["batch", 2])], [vi("y", F, ["batch", 2])],
     [numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")])

# Breaks the batch contract: dimension 0 of the output is always 1.
save("batch_break", [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
     [vi("x", F, ["batch", 2])], [vi("y", F, [1, 2])],
     [numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")])

# Never finishes on its own: a Loop with a huge trip count (for the kill switch).
body = helper.make_graph(
    [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one_b"], ["v_out"])],
    "body",
    [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", F, [1])],
    [vi("cond_out", TensorProto.BOOL, []), vi("v_out", F, [1])],
    [numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one_b")])
save("loop_forever", [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
     [vi("x", F, [1])], [vi("y", F, [1])],
     [numpy_helper.from_array(np.array(2**62, dtype=np.int64), "trips"),
      numpy_helper.from_array(np.array(True), "cond")])

print("models written to", OUT)
