"""Writes the TensorFlow Lite models that allocate as much as a request asks (for the TFLITE memory bound,
tests/flow/test_security_tflite.py) and checks them with LiteRT's own Python interpreter. Same environment as
gen_tflite.py:

    python3 -m venv /tmp/lt && /tmp/lt/bin/pip install ai-edge-litert==2.3.0
    /tmp/lt/bin/python tests/data/gen_tflite_alloc.py

  tflite_fill_sum.tflite   dims: INT32 [2] -> z = sum(fill(dims, 1.5)): FILL's output is a dynamic tensor whose
                           size is the product of the *values* of `dims` (LiteRT allocates it with malloc in the
                           run); the output is a scalar
  tflite_outer_sum.tflite  a: INT32 [N, 1], b: INT32 [1, M] -> z = sum(a + b): the broadcast sum is an N x M
                           tensor of LiteRT's arena, planned from the request's shapes (INT32: run by TFLite's
                           own kernels)
  tflite_outer_sum_float.tflite  the same in FLOAT: run by XNNPACK, which allocates the N x M tensor itself
"""


import numpy as np
from gen_tflite import HERE, model, op, run, s, tensor

F32, I32 = s.TensorType.FLOAT32, s.TensorType.INT32


def opcode(builtin):
    c = s.OperatorCodeT()
    c.builtinCode = builtin
    c.deprecatedBuiltinCode = min(builtin, 127)  # 127: "see builtinCode"
    c.version = 1
    return c


def sum_all(y, axes, z, opcode_index):
    o = s.ReducerOptionsT()
    o.keepDims = False
    return op(opcode_index, [y, axes], [z], s.BuiltinOptions.ReducerOptions, o)


def fill_sum_model():
    tensors = [
        tensor("dims", I32, [2], [2]),
        tensor("value", F32, [], [], buffer=1),
        tensor("filled", F32, [1, 1], [-1, -1]),
        tensor("axes", I32, [2], [2], buffer=2),
        tensor("z", F32, [], []),
    ]
    ops = [op(0, [0, 1], [2], s.BuiltinOptions.FillOptions, s.FillOptionsT()), sum_all(2, 3, 4, 1)]
    buffers = [np.float32(1.5).tobytes(), np.array([0, 1], dtype="<i4").tobytes()]
    return model(tensors, ops, [opcode(s.BuiltinOperator.FILL), opcode(s.BuiltinOperator.SUM)], [0], [4],
                 buffers=buffers)


def outer_sum_model(dtype):
    tensors = [
        tensor("a", dtype, [1, 1], [-1, 1]),
        tensor("b", dtype, [1, 1], [1, -1]),
        tensor("outer", dtype, [1, 1], [-1, -1]),
        tensor("axes", I32, [2], [2], buffer=1),
        tensor("z", dtype, [], []),
    ]
    ops = [op(0, [0, 1], [2], s.BuiltinOptions.AddOptions, s.AddOptionsT()), sum_all(2, 3, 4, 1)]
    return model(tensors, ops, [opcode(s.BuiltinOperator.ADD), opcode(s.BuiltinOperator.SUM)], [0, 1], [4],
                 buffers=[np.array([0, 1], dtype="<i4").tobytes()])


def main():
    fill_sum = fill_sum_model()
    (z,) = run(fill_sum, np.array([2, 3], dtype=np.int32))
    assert z == 9.0, z
    (HERE / "tflite_fill_sum.tflite").write_bytes(fill_sum)

    for suffix, dtype, np_type in (("", I32, np.int32), ("_float", F32, np.float32)):
        outer = outer_sum_model(dtype)
        (z,) = run(outer, np.array([[1], [2]], dtype=np_type), np.array([[10, 20, 30]], dtype=np_type))
        assert z == 3 * 3 + 2 * 60, z
        (HERE / f"tflite_outer_sum{suffix}.tflite").write_bytes(outer)
    print("wrote tflite_fill_sum.tflite, tflite_outer_sum.tflite, tflite_outer_sum_float.tflite")


if __name__ == "__main__":
    main()
