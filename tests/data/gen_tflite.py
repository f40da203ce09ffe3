"""Writes the tiny TensorFlow Lite test models (flatbuffers) of tests/data and checks them with LiteRT's own
Python interpreter.

    python3 -m venv /tmp/lt && /tmp/lt/bin/pip install ai-edge-litert==2.3.0
    /tmp/lt/bin/python tests/data/gen_tflite.py

Only this generator needs ai-edge-litert (for the TFLite schema's object API and the interpreter); the build,
the tests and CI use the committed .tflite files.

  tflite_sub_mul.tflite  a, b: FLOAT [N, 2] (N free) -> diff = a - b, prod = a * b; its signature
                         "serving_default" lists them as (b, a) -> (prod, diff): the module must keep the
                         subgraph's order (a, b) -> (diff, prod), as RedisAI's interpreter did
  tflite_int.tflite      x: INT32 [N, 3] -> y = x + [1, 2, 3] (a constant buffer; no signature: LiteRT makes one)
"""

from pathlib import Path

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as s
from ai_edge_litert.interpreter import Interpreter

HERE = Path(__file__).resolve().parent


def tensor(name, ttype, shape, signature, buffer=0):
    t = s.TensorT()
    t.name = name
    t.type = ttype
    t.shape = list(shape)
    t.shapeSignature = list(signature)
    t.buffer = buffer
    return t


def op(opcode, inputs, outputs, options_type, options):
    o = s.OperatorT()
    o.opcodeIndex = opcode
    o.inputs = inputs
    o.outputs = outputs
    o.builtinOptionsType = options_type
    o.builtinOptions = options
    return o


def opcode(builtin):
    c = s.OperatorCodeT()
    c.builtinCode = builtin
    c.deprecatedBuiltinCode = builtin
    c.version = 1
    return c


def tensor_map(name, index):
    m = s.TensorMapT()
    m.name = name
    m.tensorIndex = index
    return m


def model(tensors, ops, opcodes, inputs, outputs, buffers=(), signature=True, reverse_signature=False):
    g = s.SubGraphT()
    g.tensors = tensors
    g.operators = ops
    g.inputs = inputs
    g.outputs = outputs
    g.name = "main"
    m = s.ModelT()
    m.version = 3
    m.operatorCodes = opcodes
    m.subgraphs = [g]
    m.description = "redisai-rs test model"
    empty = s.BufferT()
    m.buffers = [empty]
    for data in buffers:
        b = s.BufferT()
        b.data = list(data)
        m.buffers.append(b)
    if signature:
        sig = s.SignatureDefT()
        sig.signatureKey = "serving_default"
        sig.subgraphIndex = 0
        order = (lambda v: v[::-1]) if reverse_signature else list
        sig.inputs = [tensor_map(tensors[i].name, i) for i in order(inputs)]
        sig.outputs = [tensor_map(tensors[i].name, i) for i in order(outputs)]
        m.signatureDefs = [sig]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def sub_mul_model():
    f = s.TensorType.FLOAT32
    tensors = [tensor(n, f, [1, 2], [-1, 2]) for n in ("a", "b", "diff", "prod")]
    ops = [
        op(0, [0, 1], [2], s.BuiltinOptions.SubOptions, s.SubOptionsT()),
        op(1, [0, 1], [3], s.BuiltinOptions.MulOptions, s.MulOptionsT()),
    ]
    opcodes = [opcode(s.BuiltinOperator.SUB), opcode(s.BuiltinOperator.MUL)]
    return model(tensors, ops, opcodes, [0, 1], [2, 3], reverse_signature=True)


def int_model():
    i32 = s.TensorType.INT32
    tensors = [
        tensor("x", i32, [1, 3], [-1, 3]),
        tensor("bias", i32, [3], [3], buffer=1),
        tensor("y", i32, [1, 3], [-1, 3]),
    ]
    ops = [op(0, [0, 1], [2], s.BuiltinOptions.AddOptions, s.AddOptionsT())]
    bias = np.array([1, 2, 3], dtype="<i4").tobytes()
    return model(tensors, ops, [opcode(s.BuiltinOperator.ADD)], [0], [2], buffers=[bias], signature=False)


def run(blob, *inputs):
    it = Interpreter(model_content=blob)
    for d, x in zip(it.get_input_details(), inputs):
        it.resize_tensor_input(d["index"], x.shape)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def main():
    sub_mul = sub_mul_model()
    a = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    b = np.array([[10, 20], [30, 40], [50, 60]], dtype=np.float32)
    got = run(sub_mul, a, b)  # the interpreter uses the subgraph's order
    assert np.array_equal(got[0], a - b) and np.array_equal(got[1], a * b), got
    (HERE / "tflite_sub_mul.tflite").write_bytes(sub_mul)

    ints = int_model()
    x = np.array([[1, 1, 1], [-5, 0, 5]], dtype=np.int32)
    (y,) = run(ints, x)
    assert np.array_equal(y, x + np.array([1, 2, 3], dtype=np.int32)), y
    (HERE / "tflite_int.tflite").write_bytes(ints)
    print("wrote tflite_sub_mul.tflite, tflite_int.tflite")


if __name__ == "__main__":
    main()
