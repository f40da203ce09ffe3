"""AI.MODELSTORE / MODELSET / MODELGET / MODELDEL / MODELEXECUTE / MODELRUN / AI._MODELSCAN with ONNX models
(docs/commands.md, the sections of these commands): what is stored and replied, the errors in the order the
commands check them, TIMEOUT, the deprecated forms, the keys each command declares and its command table entry.
What only one backend does is in test_backend_<backend>.py; AI.INFO is in test_observability.py.

Error texts are compared on the wire (`ERR` prefix present exactly where RedisAI sends it). Outputs are
checked against numpy (tests/data/weights.py). Also asserted: MODELSTORE builds the model on a background thread
(the storing client blocks), and wrong-arity errors carry the upper-case command name.
"""

import time

import numpy as np
import pytest
import redis

from helpers.checks import WRONGTYPE, check_error, check_error_raw
from helpers.data import weights
from helpers.onnx_models import ai_info, blob, get_tensor, model_execute, set_tensor, store, wide_model
from helpers.resp import RawClient, RespError, raw_command


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


def meta(backend=b"ONNX", device=b"CPU", tag=b"", batch=0, minbatch=0, inputs=(), outputs=(), minbatchtimeout=0):
    return [b"backend", backend, b"device", device, b"tag", tag, b"batchsize", batch, b"minbatchsize", minbatch,
            b"inputs", [i.encode() for i in inputs], b"outputs", [o.encode() for o in outputs],
            b"minbatchtimeout", minbatchtimeout]


IO_NAMES = {
    "mul": (["a", "b"], ["c"]),
    "linear": (["x"], ["y"]),
    "two_outputs": (["x"], ["plus_one", "times_two"]),
    "str_identity": (["s"], ["t"]),
    "add_int32": (["a", "b"], ["c"]),
    "heavy": (["x"], ["y"]),
}


# =================================================================================================
# AI.MODELSTORE: success, META, BLOB


@pytest.mark.parametrize("name", list(IO_NAMES))
def test_modelstore_meta_and_blob(con, port, name):
    assert raw_command(port, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob(name)) == "OK"  # +OK
    ins, outs = IO_NAMES[name]
    expected = meta(inputs=ins, outputs=outs)
    assert con.execute_command("AI.MODELGET", "m", "META") == expected
    assert len(expected) == 16
    got = con.execute_command("AI.MODELGET", "m", "BLOB")
    assert isinstance(got, bytes) and got == blob(name)
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == expected + [b"blob", blob(name)]
    assert con.execute_command("AI.MODELGET", "m", "BLOB", "META") == expected + [b"blob", blob(name)]
    assert con.execute_command("AI.MODELGET", "m") == expected + [b"blob", blob(name)]
    assert con.type("m") == b"AI__MODEL"


def test_modelstore_options_round_trip(con):
    assert con.execute_command("ai.modelstore", "m", "onnx", "cpu:1", "tag", "my tag", "batchsize", 8,
                               "minbatchsize", 2, "minbatchtimeout", 50, "blob", blob("linear")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(
        device=b"cpu:1", tag=b"my tag", batch=8, minbatch=2, minbatchtimeout=50, inputs=["x"], outputs=["y"])
    # each option alone
    store(con, "m2", "mul", "TAG", "t2")
    assert con.execute_command("AI.MODELGET", "m2", "META") == meta(tag=b"t2", inputs=["a", "b"], outputs=["c"])
    store(con, "m3", "linear", "BATCHSIZE", 4)
    assert con.execute_command("AI.MODELGET", "m3", "META") == meta(batch=4, inputs=["x"], outputs=["y"])
    store(con, "m4", "linear", "BATCHSIZE", 4, "MINBATCHSIZE", 3)
    assert con.execute_command("AI.MODELGET", "m4", "META") == meta(batch=4, minbatch=3, inputs=["x"], outputs=["y"])
    # a binary tag comes back as given
    store(con, "m5", "mul", "TAG", b"\x00\xffbin")
    assert con.execute_command("AI.MODELGET", "m5", "META")[5] == b"\x00\xffbin"
    # the model with options still runs
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6, atol=1e-6)


def test_modelstore_device_stored_as_given(con):
    for i, dev in enumerate(["CPU", "cpu", "Cpu:0", "CPU:12345", "cpu:1"]):
        store(con, f"m{i}", "mul", device=dev)
        assert con.execute_command("AI.MODELGET", f"m{i}", "META")[3] == dev.encode()
        assert ai_info(con, f"m{i}")["device"] == dev.encode()


def test_modelstore_blob_in_chunks_is_concatenated(con):
    b = blob("linear")
    parts = [b[:7], b[7:100], b[100:]]
    assert con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", *parts) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == b
    x = np.ones((1, 4), dtype=np.float32)
    set_tensor(con, "x", x)
    model_execute(con, "m", ["x"], ["y"])
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)


def test_modelstore_replaces_model(con):
    store(con, "m", "mul", "TAG", "first")
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert ai_info(con, "m")["calls"] == 1
    store(con, "m", "linear", "TAG", "second")  # same key, another model: swapped
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(tag=b"second", inputs=["x"], outputs=["y"])
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob("linear")
    info = ai_info(con, "m")
    assert (info["tag"], info["calls"], info["samples"], info["duration"]) == (b"second", 0, 0, 0)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)
    check_error(con, "Number of keys given as INPUTS here does not match model definition",
                "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")


def test_modelstore_invalid_blob(con):
    for bad in (b"not an onnx model", b"\x08\x08\x12\x00garbage" * 3):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", bad)
        assert "\n" not in str(e.value)
        assert con.exists("m") == 0
    # a failed store does not replace the model at that key
    store(con, "m", "mul", "TAG", "keep")
    before = con.execute_command("AI.MODELGET", "m", "META", "BLOB")
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "new", "BLOB", b"garbage")
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == before
    assert ai_info(con, "m")["tag"] == b"keep"
    assert con.ping()


# =================================================================================================
# AI.MODELSTORE: errors in the order they are checked

B = "BLOB"


def modelstore_error_cases():
    mul = blob("mul")
    return [
        # 1. arity
        (arity("ai.modelstore"), ["AI.MODELSTORE"]),
        (arity("ai.modelstore"), ["AI.MODELSTORE", "m", "ONNX", "CPU", B]),
        (arity("ai.modelstore"), ["AI.MODELSTORE", "m", "FOO", "bad_device", B]),
        # 2. backend (before the device)
        ("ERR unsupported backend", ["AI.MODELSTORE", "m", "FOO", "CPU", B, mul]),
        ("ERR unsupported backend", ["AI.MODELSTORE", "m", "PT", "bad_device", B, mul]),
        ("ERR unsupported backend", ["AI.MODELSTORE", "m", "ONNXX", "CPU", B, mul]),
        # 3. device
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "bad_device", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "CPU::", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "CPU:1.8", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "CPU:123456", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "GPU:x", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "CPU:-1", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "TPU", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "ONNX", "bad_device", "BATCHSIZE", "x", B, mul]),
        # 5. batching options
        ("ERR Invalid argument for BATCHSIZE", ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", "x", B, mul]),
        ("ERR Invalid argument for BATCHSIZE", ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", "-1", B, mul]),
        ("ERR Invalid argument for BATCHSIZE", ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", "1.5", B, mul]),
        ("ERR Invalid argument for BATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "t", "BATCHSIZE", "x", "MINBATCHSIZE", "y", B, mul]),
        ("ERR Invalid argument for MINBATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHSIZE", "x", B, mul]),
        ("ERR Invalid argument for MINBATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHSIZE", "-3", B, mul]),
        ("ERR MINBATCHSIZE specified without BATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "MINBATCHSIZE", 2, B, mul]),
        ("ERR MINBATCHSIZE specified without BATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 0, "MINBATCHSIZE", 2, B, mul]),
        ("ERR Invalid argument for MINBATCHTIMEOUT",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHSIZE", 1, "MINBATCHTIMEOUT", "x", B, mul]),
        ("ERR MINBATCHTIMEOUT specified without MINBATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHTIMEOUT", 10, B, mul]),
        ("ERR MINBATCHTIMEOUT specified without MINBATCHSIZE",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "MINBATCHTIMEOUT", 10, B, mul]),
        # 6. nothing left after the options
        ("ERR Insufficient arguments, missing model BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "t"]),
        ("ERR Insufficient arguments, missing model BLOB",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHSIZE", 1, "MINBATCHTIMEOUT", 3]),
        # 7. INPUTS for a non-TF backend
        ("ERR INPUTS argument should not be specified for this backend",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", B, mul]),
        ("ERR INPUTS argument should not be specified for this backend",
         ["AI.MODELSTORE", "m", "TORCH", "CPU", "TAG", "t", "INPUTS", 1, "a", B, mul]),
        ("ERR INPUTS argument should not be specified for this backend",
         ["AI.MODELSTORE", "m", "TFLITE", "CPU", "INPUTS", 1, "a", B, mul]),
        # 8. BLOB
        ("ERR Invalid argument, expected BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "FOO", mul]),
        ("ERR Invalid argument, expected BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "OUTPUTS", 1, "c", B, mul]),
        ("ERR Invalid argument, expected BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "t", "x", "y"]),
        # options out of the documented order are not recognised
        ("ERR Invalid argument, expected BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "TAG", "t", B, mul]),
        ("ERR Invalid argument, expected BLOB",
         ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 2, "MINBATCHTIMEOUT", 0, "MINBATCHSIZE", 1, B, mul]),
        ("ERR Insufficient arguments, missing model BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "t", B]),
        ("ERR Insufficient arguments, missing model BLOB", ["AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 1, B]),
    ]


@pytest.mark.parametrize("case", range(len(modelstore_error_cases())))
def test_modelstore_errors(con, port, case):
    msg, cmd = modelstore_error_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("m") == 0
    assert con.execute_command("AI._MODELSCAN") == []


def tf_parse_error_cases():
    return [
        ("ERR INPUTS not specified for TF", ["AI.MODELSTORE", "m", "TF", "CPU", B, "x"]),
        ("ERR INPUTS not specified for TF", ["AI.MODELSTORE", "m", "TF", "CPU", "OUTPUTS", 1, "c", B, "x"]),
        ("ERR Invalid argument for input_count", ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", "x", "a", B, "x"]),
        ("ERR Invalid argument for input_count", ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 0, "OUTPUTS", B, "x"]),
        ("ERR Invalid argument for input_count", ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", -1, "a", B, "x"]),
        ("ERR number of model inputs does not match the number of given arguments",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 3, "a", "b"]),
        ("ERR OUTPUTS not specified for TF", ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", B, "x"]),
        ("ERR OUTPUTS not specified for TF", ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 2, "a", "b", "c", B, "x"]),
        ("ERR Invalid argument for output_count",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", "OUTPUTS", 0, B, "x"]),
        ("ERR Invalid argument for output_count",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", "OUTPUTS", "y", "c", B, "x"]),
        ("ERR number of model outputs does not match the number of given arguments",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", "OUTPUTS", 3, "b", "c"]),
        ("ERR Invalid argument, expected BLOB",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", "OUTPUTS", 1, "b", "NOTBLOB", "x"]),
        ("ERR Insufficient arguments, missing model BLOB",
         ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "a", "OUTPUTS", 1, "b", B]),
        # the device and batching checks come first
        ("ERR Invalid DEVICE", ["AI.MODELSTORE", "m", "TF", "CPU::", B, "x"]),
        ("ERR Invalid argument for BATCHSIZE", ["AI.MODELSTORE", "m", "TF", "CPU", "BATCHSIZE", "z", B, "x"]),
        ("ERR Insufficient arguments, missing model BLOB", ["AI.MODELSTORE", "m", "TF", "CPU", "TAG", "t"]),
    ]


def test_arity_errors_name_the_registered_command(con):
    """redis-py sees the arity error as Redis words it for the registered (lower-case) name."""
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "k", "CPU")
    assert str(e.value) == "wrong number of arguments for 'ai.modelstore' command"


@pytest.mark.parametrize("case", range(len(tf_parse_error_cases())))
def test_modelstore_tf_parse_errors(con, port, case):
    """TF's INPUTS/OUTPUTS errors are parse-time: they come before the (unavailable) backend is loaded."""
    msg, cmd = tf_parse_error_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("m") == 0


# Every backend is built (test_backend_tf.py, test_backend_tflite.py, test_backend_torch.py): the backend name is
# case-insensitive and a payload the backend cannot read is that backend's error, with nothing stored.
@pytest.mark.parametrize("backend,extra,error", [
    ("TFLITE", [], "TFLITE: the model is not a valid TensorFlow Lite flatbuffer"),
    ("tflite", ["BATCHSIZE", 2], "TFLITE: the model is not a valid TensorFlow Lite flatbuffer"),
    ("TfLite", ["TAG", "x"], "TFLITE: the model is not a valid TensorFlow Lite flatbuffer"),
])
def test_modelstore_unreadable_payload(con, backend, extra, error):
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "m", backend, "CPU", *extra, "BLOB", b"\x00\x01 payload")
    assert str(e.value) == error
    assert con.exists("m") == 0
    assert con.ping()


def test_modelstore_wrongtype(con, port):
    con.set("s", "string value")
    set_tensor(con, "t", np.ones((2,), dtype=np.float32))
    check_error_raw(port, WRONGTYPE, "AI.MODELSTORE", "s", "ONNX", "CPU", "BLOB", blob("mul"))
    check_error_raw(port, WRONGTYPE, "AI.MODELSTORE", "t", "ONNX", "CPU", "BLOB", blob("mul"))
    assert con.get("s") == b"string value"
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"1", b"1"]
    # the type is checked after the model is built: a bad blob reports the backend error first
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "s", "ONNX", "CPU", "BLOB", b"garbage")
    assert not str(e.value).startswith("WRONGTYPE"), str(e.value)
    # and the parse errors come before it too
    check_error_raw(port, "ERR Invalid DEVICE", "AI.MODELSTORE", "s", "ONNX", "bad_device", "BLOB", blob("mul"))
    # the other way round: a model key used as a tensor / string
    store(con, "m", "mul")
    check_error_raw(port, WRONGTYPE, "AI.TENSORGET", "m", "META")
    check_error_raw(port, WRONGTYPE, "AI.TENSORSET", "m", "FLOAT", 1, "VALUES", 1)
    check_error_raw(port, WRONGTYPE, "GET", "m")
    assert con.type("m") == b"AI__MODEL"


# =================================================================================================
# AI.MODELSET (deprecated)


def test_modelset_ok(con):
    assert con.execute_command("AI.MODELSET", "m", "ONNX", "CPU", "BLOB", blob("mul")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(inputs=["a", "b"], outputs=["c"])
    # INPUTS/OUTPUTS without counts are ignored by non-TF backends
    assert con.execute_command("AI.MODELSET", "m2", "onnx", "cpu", "TAG", "t", "BATCHSIZE", 4, "MINBATCHSIZE", 2,
                               "MINBATCHTIMEOUT", 5, "INPUTS", "q", "OUTPUTS", "r", "BLOB", blob("linear")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META") == meta(
        device=b"cpu", tag=b"t", batch=4, minbatch=2, minbatchtimeout=5, inputs=["x"], outputs=["y"])
    b = blob("mul")
    assert con.execute_command("AI.MODELSET", "m3", "ONNX", "CPU", "BLOB", b[:50], b[50:]) == b"OK"
    assert con.execute_command("AI.MODELGET", "m3", "BLOB") == b
    set_tensor(con, "a", np.array([[1.5, 2.0]], dtype=np.float32))
    assert model_execute(con, "m3", ["a", "a"], ["c"]) == b"OK"
    assert get_tensor(con, "c").tolist() == [[2.25, 4.0]]


def modelset_error_cases():
    mul = blob("mul")
    return [
        (arity("AI.MODELSET"), ["AI.MODELSET", "m", "ONNX"]),
        ("ERR unsupported backend", ["AI.MODELSET", "m", "FOO", "CPU", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSET", "m", "ONNX", "BLOB", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSET", "m", "ONNX", "tag", "x", B, mul]),
        ("ERR Invalid DEVICE", ["AI.MODELSET", "m", "ONNX", "CPU:1234567", B, mul]),
        ("ERR Auto-batching not supported by the TFLITE backend",
         ["AI.MODELSET", "m", "TFLITE", "CPU", "BATCHSIZE", 2, B, mul]),
        ("ERR MINBATCHTIMEOUT specified without BATCHSIZE",
         ["AI.MODELSET", "m", "ONNX", "CPU", "MINBATCHTIMEOUT", 5, B, mul]),
        ("ERR Insufficient arguments, INPUTS and OUTPUTS not specified", ["AI.MODELSET", "m", "TF", "CPU", B, "x"]),
        ("ERR INPUTS not specified", ["AI.MODELSET", "m", "TF", "CPU", "OUTPUTS", "c", B, "x"]),
        ("ERR OUTPUTS not specified", ["AI.MODELSET", "m", "TF", "CPU", "INPUTS", "a", B, "x"]),
    ]


@pytest.mark.parametrize("case", range(len(modelset_error_cases())))
def test_modelset_errors(con, port, case):
    msg, cmd = modelset_error_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("m") == 0


def test_modelset_lenient_device_goes_to_backend(con):
    """MODELSET hands an odd (<= 10 chars, not a keyword) device to the backend, which refuses it."""
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSET", "m", "ONNX", "bad_dev", "BLOB", blob("mul"))
    assert "unsupported device" in str(e.value).lower(), str(e.value)
    assert con.exists("m") == 0


def test_modelset_unreadable_payload(con):
    """INPUTS/OUTPUTS are ignored for non-TF backends in MODELSET; the payload then reaches the backend."""
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSET", "m", "TFLITE", "CPU", "INPUTS", "a", "OUTPUTS", "b", "BLOB", b"x")
    assert str(e.value) == "TFLITE: the model is not a valid TensorFlow Lite flatbuffer"
    assert con.exists("m") == 0


# =================================================================================================
# AI.MODELGET / AI.MODELDEL


def test_modelget_errors(con, port):
    store(con, "m", "mul")
    check_error_raw(port, arity("AI.MODELGET"), "AI.MODELGET")
    check_error_raw(port, arity("AI.MODELGET"), "AI.MODELGET", "m", "META", "BLOB", "x")
    check_error_raw(port, "ERR model key is empty", "AI.MODELGET", "nokey")
    check_error_raw(port, "ERR model key is empty", "AI.MODELGET", "nokey", "META")
    con.set("s", "v")
    set_tensor(con, "t", np.ones(1, dtype=np.float32))
    check_error_raw(port, WRONGTYPE, "AI.MODELGET", "s", "META")
    check_error_raw(port, WRONGTYPE, "AI.MODELGET", "t")
    # unknown extra arguments are ignored; keywords are case-insensitive
    assert con.execute_command("AI.MODELGET", "m", "meta", "foo") == meta(inputs=["a", "b"], outputs=["c"])
    assert con.execute_command("AI.MODELGET", "m", "Blob") == blob("mul")
    assert con.execute_command("AI.MODELGET", "m", "bar", "BLOB") == blob("mul")


def test_modelget_blob_chunks(server):
    """BLOB as an array of chunks once len >= MODEL_CHUNK_SIZE: n = len // chunk + 1 (docs/commands.md, AI.MODELGET)."""
    con = server.client()
    store(con, "h", "heavy")
    store(con, "m", "mul")
    heavy, mul = blob("heavy"), blob("mul")
    assert con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 100) == b"OK"
    assert con.execute_command("AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 100
    chunks = con.execute_command("AI.MODELGET", "h", "BLOB")
    assert isinstance(chunks, list)
    assert len(chunks) == len(heavy) // 100 + 1
    assert all(len(c) == 100 for c in chunks[:-1]) and len(chunks[-1]) == len(heavy) % 100
    assert b"".join(chunks) == heavy
    full = con.execute_command("AI.MODELGET", "h", "META", "BLOB")
    assert len(full) == 18 and full[16] == b"blob" and full[17] == chunks
    assert full[:16] == meta(inputs=["x"], outputs=["y"])
    # the small model: 118 bytes -> 2 chunks, the last one 18 bytes
    assert len(mul) == 118
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == [mul[:100], mul[100:]]
    # a multiple of the chunk size: the last chunk is empty
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 59)
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == [mul[:59], mul[59:], b""]
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", len(mul))
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == [mul, b""]
    # below the chunk size: a plain bulk string
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", len(mul) + 1)
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == mul
    # a model stored while the chunk size is small is still whole and runs
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 10)
    store(con, "l", "linear")
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 535822336)
    assert con.execute_command("AI.MODELGET", "l", "BLOB") == blob("linear")
    assert con.execute_command("AI.MODELGET", "h", "BLOB") == heavy


def test_modeldel(con, port):
    store(con, "m", "mul", "TAG", "t")
    assert raw_command(port, "AI.MODELDEL", "m") == "OK"
    assert con.exists("m") == 0
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "m")
    assert con.execute_command("AI._MODELSCAN") == []
    check_error_raw(port, "ERR model key is empty", "AI.MODELDEL", "m")
    check_error_raw(port, arity("AI.MODELDEL"), "AI.MODELDEL")
    check_error_raw(port, arity("AI.MODELDEL"), "AI.MODELDEL", "a", "b")
    con.set("s", "v")
    set_tensor(con, "t", np.ones(1, dtype=np.float32))
    check_error_raw(port, WRONGTYPE, "AI.MODELDEL", "s")
    check_error_raw(port, WRONGTYPE, "AI.MODELDEL", "t")
    assert con.get("s") == b"v" and con.exists("t") == 1
    # DEL works on models too and drops the stats entry
    store(con, "m2", "mul")
    assert con.delete("m2") == 1
    check_error(con, "cannot find run info for key", "AI.INFO", "m2")


def test_memory_usage(con):
    store(con, "h", "heavy")
    store(con, "m", "mul")
    assert con.memory_usage("h") >= len(blob("heavy"))
    assert con.memory_usage("m") >= len(blob("mul"))


# =================================================================================================
# AI.MODELEXECUTE: results


def test_execute_mul(con, port):
    store(con, "m", "mul")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert raw_command(port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == "OK"  # +OK
    out = con.execute_command("AI.TENSORGET", "c", "META", "BLOB")
    assert out[:4] == [b"dtype", b"FLOAT", b"shape", [3, 5]]
    assert np.frombuffer(out[5], dtype=np.float32).tobytes() == (a * b).tobytes()  # one IEEE multiply: exact
    # VALUES form of the same
    set_tensor(con, "v", np.array([[1, 2], [3, 4]], dtype=np.float32))
    model_execute(con, "m", ["v", "v"], ["sq"])
    assert con.execute_command("AI.TENSORGET", "sq", "VALUES") == [b"1", b"4", b"9", b"16"]


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_execute_linear(con, batch):
    store(con, "m", "linear")
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    y = get_tensor(con, "y")
    assert y.shape == (batch, 3) and y.dtype == np.float32
    np.testing.assert_allclose(y, weights.linear(x), rtol=1e-5, atol=1e-6)


def test_execute_two_outputs(con):
    store(con, "m", "two_outputs")
    x = np.random.default_rng(2).standard_normal((2, 7)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["p", "t"]) == b"OK"
    assert get_tensor(con, "p").tobytes() == (x + np.float32(1)).tobytes()
    assert get_tensor(con, "t").tobytes() == (x * np.float32(2)).tobytes()
    assert get_tensor(con, "p").shape == (2, 7)


def test_execute_add_int32(con):
    store(con, "m", "add_int32")
    a = np.array([1, -2, 2 ** 31 - 10, -(2 ** 31), 0], dtype=np.int32)
    b = np.array([5, -7, 9, 0, 0], dtype=np.int32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", b"INT32", b"shape", [5]]
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == (a + b).tolist()


def test_execute_str_identity(con):
    store(con, "m", "str_identity")
    values = ["alpha", "βeta", "日本語", "x" * 100]
    con.execute_command("AI.TENSORSET", "s", "STRING", len(values), "VALUES", *values)
    assert model_execute(con, "m", ["s"], ["t"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"STRING", b"shape", [4]]
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [v.encode() for v in values]
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == b"".join(v.encode() + b"\x00" for v in values)


def test_execute_wide_model(con):
    """5 inputs, 3 outputs (a model generated here)."""
    assert con.execute_command("AI.MODELSTORE", "w", "ONNX", "CPU", "BLOB", wide_model()) == b"OK"
    assert con.execute_command("AI.MODELGET", "w", "META") == meta(inputs=list("abcde"), outputs=["s", "p", "q"])
    arrs = {k: np.arange(3, dtype=np.float32) * (i + 1) for i, k in enumerate("abcde")}
    for k, v in arrs.items():
        set_tensor(con, k, v)
    assert model_execute(con, "w", list("abcde"), ["S", "P", "Q"]) == b"OK"
    assert get_tensor(con, "S").tolist() == sum(arrs.values()).tolist()
    assert get_tensor(con, "P").tolist() == arrs["a"].tolist()
    assert get_tensor(con, "Q").tolist() == arrs["b"].tolist()


def test_execute_outputs_overwrite_and_alias(con):
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[3.0]], dtype=np.float32))
    con.execute_command("AI.TENSORSET", "c", "INT8", 2, 2, "VALUES", 1, 2, 3, 4)  # another tensor: replaced
    model_execute(con, "m", ["a", "a"], ["c"])
    assert con.execute_command("AI.TENSORGET", "c", "META", "VALUES") == [
        b"dtype", b"FLOAT", b"shape", [1, 1], b"values", [b"9"]]
    # input and output may be the same key
    model_execute(con, "m", ["a", "a"], ["a"])
    assert con.execute_command("AI.TENSORGET", "a", "VALUES") == [b"9"]
    model_execute(con, "m", ["a", "a"], ["a"])
    assert con.execute_command("AI.TENSORGET", "a", "VALUES") == [b"81"]


def test_execute_case_insensitive_and_timeout(con, port):
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[2.0, 3.0]], dtype=np.float32))
    assert raw_command(port, "ai.modelexecute", "m", "inputs", 2, "a", "a", "outputs", 1, "c", "timeout", 10000) == "OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4", b"9"]
    assert raw_command(port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "d", "TIMEOUT", 1000) == "OK"
    assert con.execute_command("AI.TENSORGET", "d", "VALUES") == [b"4", b"9"]


# =================================================================================================
# AI.MODELEXECUTE: errors, in the order they are checked


def execute_error_cases():
    E = "AI.MODELEXECUTE"
    return [
        # 1. arity first (even before the model lookup)
        (arity(E), [E]),
        (arity(E), [E, "nokey", "INPUTS", 1, "a", "OUTPUTS", 1]),
        (arity(E), [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS"]),
        # 2. model
        ("ERR model key is empty", [E, "nokey", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]),
        (WRONGTYPE, [E, "str", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]),
        (WRONGTYPE, [E, "a", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]),
        # 3. INPUTS right after the key
        ("ERR INPUTS not specified", [E, "m", "OUTPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]),
        ("ERR INPUTS not specified", [E, "m", "TIMEOUT", 5, "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]),
        ("ERR INPUTS not specified", [E, "m", "FOO", 2, "a", "b", "OUTPUTS", 1, "c"]),
        # 4. input count
        ("ERR Invalid argument for input_count", [E, "m", "INPUTS", "x", "a", "b", "OUTPUTS", 1, "c"]),
        ("ERR Invalid argument for input_count", [E, "m", "INPUTS", "1.5", "a", "b", "OUTPUTS", 1, "c"]),
        ("ERR Input count must be a positive integer", [E, "m", "INPUTS", 0, "a", "b", "OUTPUTS", 1, "c"]),
        ("ERR Input count must be a positive integer", [E, "m", "INPUTS", -1, "a", "b", "OUTPUTS", 1, "c"]),
        ("Number of keys given as INPUTS here does not match model definition",
         [E, "m", "INPUTS", 1, "a", "OUTPUTS", 1, "c"]),
        ("Number of keys given as INPUTS here does not match model definition",
         [E, "m", "INPUTS", 3, "a", "b", "b", "OUTPUTS", 1, "c"]),
        # 5. outputs
        ("ERR OUTPUTS not specified", [E, "m", "INPUTS", 2, "a", "b", "FOO", 1, "c"]),
        ("ERR OUTPUTS not specified", [E, "m", "INPUTS", 2, "a", "b", "c", "OUTPUTS", 1, "c"]),
        ("ERR Invalid argument for output_count", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", "x", "c"]),
        ("ERR Output count must be a positive integer", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 0, "c"]),
        ("ERR Output count must be a positive integer", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", -2, "c"]),
        ("Number of keys given as OUTPUTS here does not match model definition",
         [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 2, "c", "d"]),
        # 6. TIMEOUT and trailing arguments (before the input tensors are looked up)
        ("ERR No value provided for TIMEOUT", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT"]),
        ("ERR Invalid value for TIMEOUT", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT", 0]),
        ("ERR Invalid value for TIMEOUT", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT", -5]),
        ("ERR Invalid value for TIMEOUT", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT", "x"]),
        ("ERR Invalid value for TIMEOUT", [E, "m", "INPUTS", 2, "nokey", "b", "OUTPUTS", 1, "c", "TIMEOUT", 0]),
        ("Invalid argument: FOO", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "FOO"]),
        ("Invalid argument: FOO", [E, "m", "INPUTS", 2, "nokey", "b", "OUTPUTS", 1, "c", "FOO"]),
        ("Invalid argument: d", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "d"]),
        ("Invalid argument: FOO", [E, "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT", 5, "FOO"]),
        # 7. input tensors
        ("ERR tensor key is empty or in a different shard", [E, "m", "INPUTS", 2, "a", "nokey", "OUTPUTS", 1, "c"]),
        ("ERR tensor key is empty or in a different shard",
         [E, "m", "INPUTS", 2, "nokey", "a", "OUTPUTS", 1, "c", "TIMEOUT", 5]),
        (WRONGTYPE, [E, "m", "INPUTS", 2, "a", "str", "OUTPUTS", 1, "c"]),
        (WRONGTYPE, [E, "m", "INPUTS", 2, "m", "a", "OUTPUTS", 1, "c"]),
    ]


@pytest.fixture
def mul_setup(con):
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[1.0, 2.0]], dtype=np.float32))
    set_tensor(con, "b", np.array([[3.0, 4.0]], dtype=np.float32))
    con.set("str", "v")
    return con


@pytest.mark.parametrize("case", range(len(execute_error_cases())))
def test_execute_errors(mul_setup, port, case):
    con = mul_setup
    msg, cmd = execute_error_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("c") == 0 and con.exists("d") == 0
    # parse-time errors are not counted in the stats
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"]) == (0, 0)


def test_execute_argument_count_errors(con, port):
    """`number of input/output keys ... does not match the number of given arguments` (needs more than 2
    inputs or outputs to be reachable without an arity error)."""
    con.execute_command("AI.MODELSTORE", "w", "ONNX", "CPU", "BLOB", wide_model())
    E = "AI.MODELEXECUTE"
    check_error_raw(port, "ERR number of input keys to AI.MODELEXECUTE command does not match the number of given "
                          "arguments", E, "w", "INPUTS", 5, "a", "b", "c", "d")
    check_error_raw(port, "ERR number of output keys to AI.MODELEXECUTE command does not match the number of given "
                          "arguments", E, "w", "INPUTS", 5, "a", "b", "c", "d", "e", "OUTPUTS", 3, "s", "p")
    # the count is compared with the model before the arguments are counted
    check_error_raw(port, "Number of keys given as INPUTS here does not match model definition",
                    E, "w", "INPUTS", 4, "a", "b", "c", "d")
    check_error_raw(port, "Number of keys given as OUTPUTS here does not match model definition",
                    E, "w", "INPUTS", 5, "a", "b", "c", "d", "e", "OUTPUTS", 2, "s")


def test_execute_output_wrongtype(con):
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    con.set("out", "keep me")
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "m", ["a", "a"], ["out"])
    assert str(e.value) == WRONGTYPE
    assert con.get("out") == b"keep me"
    store(con, "m2", "two_outputs")
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "m2", ["a"], ["p", "m"])  # the second output is a model key
    assert str(e.value) == WRONGTYPE
    assert con.type("m") == b"AI__MODEL"


def test_execute_backend_errors(con):
    """Bad input dtype / shape: an error from ONNX Runtime (text not fixed), counted in AI.INFO; the server and
    the model keep working."""
    store(con, "m", "mul")
    store(con, "l", "linear")
    set_tensor(con, "d", np.ones((2, 2), dtype=np.float64))
    set_tensor(con, "i", np.ones((2, 2), dtype=np.int32))
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "m", ["d", "d"], ["c"])
    assert str(e.value) and "\n" not in str(e.value)
    with pytest.raises(redis.exceptions.ResponseError):
        model_execute(con, "m", ["i", "i"], ["c"])
    assert con.exists("c") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"], info["samples"]) == (2, 2, 0)
    # wrong inner dimension for linear (x must be [batch, 4])
    set_tensor(con, "x5", np.ones((2, 5), dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "l", ["x5"], ["y"])
    assert "\n" not in str(e.value)
    # mismatching shapes for mul (no broadcast between [2,2] and [3,3])
    set_tensor(con, "f2", np.ones((2, 2), dtype=np.float32))
    set_tensor(con, "f3", np.ones((3, 3), dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError):
        model_execute(con, "m", ["f2", "f3"], ["c"])
    assert con.ping()
    assert model_execute(con, "m", ["f2", "f2"], ["c"]) == b"OK"
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"], info["samples"]) == (4, 3, 2)
    assert ai_info(con, "l")["errors"] == 1


# =================================================================================================
# TIMEOUT -> TIMEDOUT


def _busy_queue(port, n=4, batch=4096, key="h"):
    """n clients each queue a heavy run (batch x 256) on the model's queue; returns the clients."""
    clients = []
    for i in range(n):
        c = RawClient(port)
        c.send("AI.MODELEXECUTE", key, "INPUTS", 1, "hx", "OUTPUTS", 1, f"hy{i}")
        clients.append(c)
    time.sleep(0.05)
    return clients


def test_execute_timedout(con, port):
    store(con, "h", "heavy")
    store(con, "m", "mul")
    set_tensor(con, "hx", np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32))
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    # MODELEXECUTE ... TIMEOUT 1 behind heavy runs on the same (CPU) queue
    clients = _busy_queue(port)
    t0 = time.monotonic()
    reply = raw_command(port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "late", "TIMEOUT", 1)
    waited = time.monotonic() - t0
    assert reply == "TIMEDOUT" and not isinstance(reply, RespError), reply  # a simple string, not an error
    assert [c.reply() for c in clients] == ["OK"] * len(clients)
    for c in clients:
        c.close()
    assert waited >= 0.001
    assert con.exists("late") == 0
    # the timed-out request did not run: not counted
    assert (ai_info(con, "m")["calls"], ai_info(con, "m")["errors"]) == (0, 0)
    assert ai_info(con, "h")["calls"] == 4
    # same for the deprecated form (TIMEOUT right after the key)
    clients = _busy_queue(port)
    reply = raw_command(port, "AI.MODELRUN", "m", "TIMEOUT", 1, "INPUTS", "a", "a", "OUTPUTS", "late2")
    assert reply == "TIMEDOUT", reply
    assert [c.reply() for c in clients] == ["OK"] * len(clients)
    for c in clients:
        c.close()
    assert con.exists("late2") == 0
    # redis-py sees the simple string too
    clients = _busy_queue(port)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "late3",
                               "TIMEOUT", 1) in (b"TIMEDOUT", "TIMEDOUT")
    for c in clients:
        assert c.reply() == "OK"
        c.close()
    # and without the queue being busy the same request runs
    assert model_execute(con, "m", ["a", "a"], ["ok"], "TIMEOUT", 5000) == b"OK"
    assert con.execute_command("AI.TENSORGET", "ok", "VALUES") == [b"4"]
    np.testing.assert_allclose(get_tensor(con, "hy0")[:2], weights.heavy(get_tensor(con, "hx")[:2]),
                               rtol=1e-4, atol=1e-5)


# =================================================================================================
# AI.MODELRUN (deprecated)


def test_modelrun_ok(con, port):
    store(con, "m", "mul")
    store(con, "t", "two_outputs")
    set_tensor(con, "a", np.array([[1.5, -2.0]], dtype=np.float32))
    assert raw_command(port, "AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c") == "OK"
    assert get_tensor(con, "c").tolist() == [[2.25, 4.0]]
    assert raw_command(port, "ai.modelrun", "t", "timeout", 5000, "inputs", "a", "outputs", "p", "q") == "OK"
    assert get_tensor(con, "p").tolist() == [[2.5, -1.0]]
    assert get_tensor(con, "q").tolist() == [[3.0, -4.0]]
    assert ai_info(con, "m")["calls"] == 1


def modelrun_error_cases():
    R = "AI.MODELRUN"
    return [
        (arity(R), [R]),
        (arity(R), [R, "m", "INPUTS", "a", "OUTPUTS"]),
        (arity(R), [R, "nokey", "INPUTS", "a", "b"]),
        ("ERR model key is empty", [R, "nokey", "INPUTS", "a", "b", "OUTPUTS", "c"]),
        (WRONGTYPE, [R, "str", "INPUTS", "a", "b", "OUTPUTS", "c"]),
        ("ERR INPUTS not specified", [R, "m", "FOO", "a", "b", "OUTPUTS", "c"]),
        ("ERR INPUTS not specified", [R, "m", "OUTPUTS", "c", "INPUTS", "a", "b"]),
        ("ERR INPUTS not specified", [R, "m", "TIMEOUT", 10, "a", "b", "OUTPUTS", "c"]),
        ("Number of keys given as INPUTS here does not match model definition",
         [R, "m", "INPUTS", "a", "OUTPUTS", "c"]),
        ("Number of keys given as INPUTS here does not match model definition",
         [R, "m", "INPUTS", "a", "b", "b", "OUTPUTS", "c"]),
        ("Number of keys given as OUTPUTS here does not match model definition",
         [R, "m", "INPUTS", "a", "b", "OUTPUTS", "c", "d"]),
        ("ERR Invalid value for TIMEOUT", [R, "m", "TIMEOUT", 0, "INPUTS", "a", "b", "OUTPUTS", "c"]),
        ("ERR Invalid value for TIMEOUT", [R, "m", "TIMEOUT", "x", "INPUTS", "a", "b", "OUTPUTS", "c"]),
        ("ERR Invalid value for TIMEOUT", [R, "m", "TIMEOUT", "INPUTS", "a", "b", "OUTPUTS", "c"]),
        ("ERR tensor key is empty or in a different shard", [R, "m", "INPUTS", "a", "nokey", "OUTPUTS", "c"]),
        (WRONGTYPE, [R, "m", "INPUTS", "a", "str", "OUTPUTS", "c"]),
    ]


@pytest.mark.parametrize("case", range(len(modelrun_error_cases())))
def test_modelrun_errors(mul_setup, port, case):
    con = mul_setup
    msg, cmd = modelrun_error_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("c") == 0
    assert ai_info(con, "m")["calls"] == 0


# =================================================================================================
# AI._MODELSCAN


def test_modelscan(con, port):
    assert con.execute_command("AI._MODELSCAN") == []
    store(con, "m1", "mul", "TAG", "t1")
    store(con, "m2", "linear")
    store(con, "m3", "linear", "TAG", "t3", device="CPU:1")
    set_tensor(con, "tensor", np.ones(1, dtype=np.float32))
    assert sorted(con.execute_command("AI._MODELSCAN")) == [[b"m1", b"t1"], [b"m2", b""], [b"m3", b"t3"]]
    con.execute_command("AI.MODELDEL", "m2")
    assert sorted(con.execute_command("AI._MODELSCAN")) == [[b"m1", b"t1"], [b"m3", b"t3"]]
    store(con, "m1", "mul", "TAG", "new")
    assert sorted(con.execute_command("AI._MODELSCAN")) == [[b"m1", b"new"], [b"m3", b"t3"]]
    check_error_raw(port, arity("AI._MODELSCAN"), "AI._MODELSCAN", "x")


# =================================================================================================
# keys of the commands (COMMAND GETKEYS) and the command table (COMMAND INFO)


def test_getkeys(port):
    gk = lambda *a: raw_command(port, "COMMAND", "GETKEYS", *a)  # noqa: E731
    assert gk("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == [b"m", b"a", b"b", b"c"]
    assert gk("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "TIMEOUT", 5) == [
        b"m", b"a", b"b", b"c"]
    assert gk("AI.MODELEXECUTE", "m", "INPUTS", 1, "a", "OUTPUTS", 2, "c", "d") == [b"m", b"a", b"c", b"d"]
    assert gk("AI.MODELRUN", "m", "INPUTS", "a", "b", "OUTPUTS", "c") == [b"m", b"a", b"b", b"c"]
    assert gk("AI.MODELRUN", "m", "TIMEOUT", 9, "INPUTS", "a", "OUTPUTS", "c", "d") == [b"m", b"a", b"c", b"d"]
    assert gk("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", "x") == [b"m"]
    assert gk("AI.MODELSET", "m", "ONNX", "CPU", "BLOB", "x") == [b"m"]
    assert gk("AI.MODELGET", "m", "META") == [b"m"]
    assert gk("AI.MODELDEL", "m") == [b"m"]
    assert gk("AI.INFO", "m") == [b"m"]


COMMAND_TABLE = {  # name: (flags that must be present, first, last, step)
    "ai.modelstore": ({"write", "denyoom"}, 1, 1, 1),
    "ai.modelset": ({"write", "denyoom"}, 1, 1, 1),
    "ai.modelget": ({"readonly"}, 1, 1, 1),
    "ai.modeldel": ({"write"}, 1, 1, 1),
    "ai.modelexecute": ({"write", "denyoom", "movablekeys"}, 4, 4, 1),
    "ai.modelrun": ({"write", "denyoom", "movablekeys"}, 3, 3, 1),
    "ai._modelscan": ({"readonly"}, 0, 0, 0),
    "ai.info": ({"readonly"}, 1, 1, 1),
    # RedisAI registered it "write"; here it is an admin command (it loads shared libraries): docs/security.md.
    "ai.config": ({"admin"}, 0, 0, 0),
}


@pytest.mark.parametrize("name", list(COMMAND_TABLE))
def test_command_table(port, name):
    flags, first, last, step = COMMAND_TABLE[name]
    info = raw_command(port, "COMMAND", "INFO", name)
    assert info and info[0], f"{name} not registered"
    entry = info[0]
    assert entry[0] == name.encode()
    got_flags = {f.decode() if isinstance(f, bytes) else f for f in entry[2]}  # status replies come as str
    assert flags <= got_flags, (name, got_flags)
    if "readonly" in flags:
        assert "write" not in got_flags
    assert (entry[3], entry[4], entry[5]) == (first, last, step)
