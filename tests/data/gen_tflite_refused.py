"""Writes the TensorFlow Lite models that model admission must refuse (src/admission/tflite.rs), for
tests/flow/test_security_tflite.py and the unit tests. Same environment as gen_tflite.py:

    python3 -m venv /tmp/lt && /tmp/lt/bin/pip install ai-edge-litert==2.3.0
    /tmp/lt/bin/python tests/data/gen_tflite_refused.py

  tflite_flex_op.tflite    filename: STRING [] -> contents = FlexReadFile(filename): a select-TF (Flex) op,
                           which the Flex delegate would run as TensorFlow's ReadFile kernel
  tflite_custom_op.tflite  x: FLOAT [N, 2] -> y = MyCustomOp(x): a custom op (needs a custom-op library)

Each is otherwise a well-formed model (LiteRT's Python interpreter reads it and only fails to resolve the op).
"""

import flatbuffers
from ai_edge_litert import schema_py_generated as s
from ai_edge_litert.interpreter import Interpreter

from gen_tflite import HERE, model, op, tensor


def custom_opcode(name):
    c = s.OperatorCodeT()
    c.builtinCode = s.BuiltinOperator.CUSTOM
    c.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
    c.customCode = name
    c.version = 1
    return c


def custom_op(inputs, outputs, options=b""):
    o = op(0, inputs, outputs, s.BuiltinOptions.NONE, None)
    o.customOptions = list(options)
    o.customOptionsFormat = s.CustomOptionsFormat.FLEXBUFFERS
    return o


def flex_model():
    string = s.TensorType.STRING
    tensors = [tensor("filename", string, [], []), tensor("contents", string, [], [])]
    return model(tensors, [custom_op([0], [1])], [custom_opcode("FlexReadFile")], [0], [1])


def custom_model():
    f = s.TensorType.FLOAT32
    tensors = [tensor("x", f, [1, 2], [-1, 2]), tensor("y", f, [1, 2], [-1, 2])]
    return model(tensors, [custom_op([0], [1])], [custom_opcode("MyCustomOp")], [0], [1])


def main():
    for name, blob in (("tflite_flex_op.tflite", flex_model()), ("tflite_custom_op.tflite", custom_model())):
        # LiteRT reads it; only the op is missing
        try:
            Interpreter(model_content=blob).allocate_tensors()
            raise AssertionError(f"{name}: LiteRT resolved the op")
        except RuntimeError as e:
            assert "custom op" in str(e) or "Flex" in str(e) or "Select TensorFlow" in str(e), e
        (HERE / name).write_bytes(blob)
    print("wrote tflite_flex_op.tflite, tflite_custom_op.tflite")


if __name__ == "__main__":
    main()
