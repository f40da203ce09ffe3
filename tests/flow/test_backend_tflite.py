"""The TFLITE backend: TensorFlow Lite flatbuffers run by LiteRT's C API (libLiteRt.so of the PyPI
ai-edge-litert 2.3.0 wheel; REDISAI_TFLITE_LIB, passed as `TFLITE <path>` by helpers/server.py), with the tiny models of
tests/data (tests/data/gen_tflite.py):

  tflite_sub_mul.tflite  a, b: FLOAT [N, 2] -> diff = a - b, prod = a * b
  tflite_int.tflite      x: INT32 [N, 3]   -> y = x + [1, 2, 3]

Also control flow: a WHILE model built by helpers/tflite_models.py (`while_model`) stores and runs.

As RedisAI: TFLITE is a backend of AI.MODELSTORE, AI.MODELSET refuses BATCHSIZE for it, a wrong input type fails
with `Input tensor type doesn't match the type expected by the model definition`, and the input and output names
are the interpreter's (the main subgraph's tensors).

Elsewhere: admission (custom ops, recursive control flow) and the memory bound in test_security_tflite.py, the kill
switch in test_limits_kill_switch.py, batching in test_exec_batching.py, concurrent clients in
test_exec_concurrency.py, persistence in test_persistence_model.py, INFO MODULES in test_observability.py.
"""

import os

import numpy as np
import pytest
import redis

from helpers.checks import check_error, check_error_raw
from helpers.onnx_models import ai_info, get_tensor, model_execute, set_tensor, store
from helpers.server import MODULE_PATH
from helpers.tflite_models import ab, tfl_blob, tfl_store, while_model

BOGUS = "/nonexistent/libLiteRt.so"


def meta(batch=0, minbatch=0, inputs=(), outputs=(), device=b"CPU", tag=b""):
    return [b"backend", b"TFLITE", b"device", device, b"tag", tag, b"batchsize", batch, b"minbatchsize", minbatch,
            b"inputs", [i.encode() for i in inputs], b"outputs", [o.encode() for o in outputs],
            b"minbatchtimeout", 0]


def test_store_meta_and_blob(con):
    tfl_store(con, "m", "sub_mul", "TAG", "v1")
    assert con.execute_command("AI.MODELGET", "m", "META") == meta(inputs=["a", "b"], outputs=["diff", "prod"],
                                                                   tag=b"v1")
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == tfl_blob("sub_mul")
    tfl_store(con, "i", "int", device="cpu:1")
    assert con.execute_command("AI.MODELGET", "i", "META") == meta(inputs=["x"], outputs=["y"], device=b"cpu:1")


@pytest.mark.parametrize("rows", [1, 3, 17, 1])
def test_execute_float_any_batch(con, rows):
    """Dimension 0 is free: the inputs are resized to each request's shape (also back to a smaller one)."""
    tfl_store(con, "m", "sub_mul")
    a, b = ab(rows, seed=rows)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["d", "p"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "d"), a - b)
    np.testing.assert_array_equal(get_tensor(con, "p"), a * b)


def test_execute_int32_with_constant(con):
    tfl_store(con, "m", "int")
    x = np.array([[1, 1, 1], [-5, 0, 5]], dtype=np.int32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "META") == [b"dtype", b"INT32", b"shape", [2, 3]]
    np.testing.assert_array_equal(get_tensor(con, "y"), x + np.array([1, 2, 3], dtype=np.int32))


def test_execute_errors(con):
    tfl_store(con, "m", "sub_mul")
    a, b = ab(2)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    set_tensor(con, "i", np.ones((2, 2), dtype=np.int32))
    set_tensor(con, "d", np.ones((2, 2), dtype=np.float64))
    for bad in ("i", "d"):
        check_error(con, "Input tensor type doesn't match the type expected by the model definition",
                    "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", bad, "OUTPUTS", 2, "x", "y")
    check_error(con, "Number of keys given as INPUTS here does not match model definition",
                "AI.MODELEXECUTE", "m", "INPUTS", 1, "a", "OUTPUTS", 2, "x", "y")
    # a shape the graph cannot take (broadcasting [2, 2] against [3, 5] fails inside LiteRT): an error, no crash
    set_tensor(con, "w", np.ones((3, 5), dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "m", ["a", "w"], ["x", "y"])
    assert "TFLITE" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert con.exists("x") == 0 and con.exists("y") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"]) == (3, 3), info  # two type errors, one shape error
    # and the model still runs right afterwards (its compiled model was resized back)
    assert model_execute(con, "m", ["a", "b"], ["x", "y"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "x"), a - b)


def test_store_errors(con):
    port = con.connection_pool.connection_kwargs["port"]
    check_error_raw(port, "TFLITE: the model is not a valid TensorFlow Lite flatbuffer",
                    "AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", b"not a flatbuffer")
    blob = tfl_blob("sub_mul")
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", blob[: len(blob) // 2])
    check_error_raw(port, "ERR GPU requested but TFLITE has no GPU support in this module",
                    "AI.MODELSTORE", "m", "TFLITE", "GPU:0", "BLOB", blob)
    check_error_raw(port, "ERR Auto-batching not supported by the TFLITE backend",
                    "AI.MODELSET", "m", "TFLITE", "CPU", "BATCHSIZE", 2, "BLOB", blob)
    assert con.exists("m") == 0
    # the deprecated form stores it too (INPUTS/OUTPUTS are ignored for TFLITE, as in RedisAI)
    assert con.execute_command("AI.MODELSET", "m", "TFLITE", "CPU", "BLOB", blob) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META")[1] == b"TFLITE"


def test_dag_tflite_and_onnx(con):
    """TFLITE on CPU:1 next to ONNX on CPU in one DAG: diff and prod, then ONNX mul of the two."""
    tfl_store(con, "t", "sub_mul", device="CPU:1")
    store(con, "o", "mul")
    a, b = ab(3, seed=7)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    reply = con.execute_command(
        "AI.DAGEXECUTE", "LOAD", 2, "a", "b", "PERSIST", 1, "out",
        "|>", "AI.MODELEXECUTE", "t", "INPUTS", 2, "a", "b", "OUTPUTS", 2, "d", "p",
        "|>", "AI.MODELEXECUTE", "o", "INPUTS", 2, "d", "p", "OUTPUTS", 1, "out",
        "|>", "AI.TENSORGET", "out", "META")
    assert reply == [b"OK", b"OK", [b"dtype", b"FLOAT", b"shape", [3, 2]]], reply
    np.testing.assert_allclose(get_tensor(con, "out"), (a - b) * (a * b), rtol=1e-6)


def test_without_library(make_server):
    srv = make_server(load_module=False, server_args=["--loadmodule", MODULE_PATH, "TFLITE", BOGUS],
                      name="no_tflite")
    con = srv.client()
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", tfl_blob("int"))
    assert f"Could not load backend TFLITE from {BOGUS}" in str(e.value), str(e.value)
    assert con.exists("m") == 0
    assert con.ping()


def test_loadbackend(make_server):
    real = os.environ.get("REDISAI_TFLITE_LIB")
    assert real, "REDISAI_TFLITE_LIB must name libLiteRt.so (make test sets it)"
    srv = make_server(load_module=False, server_args=["--loadmodule", MODULE_PATH], name="tflite_loadbackend")
    con = srv.client()
    assert con.execute_command("AI.CONFIG", "LOADBACKEND", "TFLITE", real) == b"OK"
    check_error(con, "error loading backend", "AI.CONFIG", "LOADBACKEND", "TFLITE", real)  # loaded already
    tfl_store(con, "m", "int")
    set_tensor(con, "x", np.zeros((1, 3), dtype=np.int32))
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "VALUES") == [1, 2, 3]


# =================================================================================================
# control flow: a hand-built WHILE model (helpers/tflite_models.py)


def test_while_model_runs(con):
    """A legitimate loop is admitted and runs."""
    assert con.execute_command("AI.MODELSTORE", "w", "TFLITE", "CPU", "BLOB", while_model()) == b"OK"
    for start, end in ((3, 10), (-5, 10), (12, 12)):
        set_tensor(con, "x", np.array([start], dtype=np.int32))
        assert model_execute(con, "w", ["x"], ["y"]) == b"OK"
        assert con.execute_command("AI.TENSORGET", "y", "VALUES") == [end]
