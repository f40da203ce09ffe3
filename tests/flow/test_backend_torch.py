"""TORCH models through libredisai_torch.so (libtorch 2.13; docs/commands.md, AI.MODELSTORE and AI.MODELEXECUTE
for TORCH): input and output names taken from the model, stored options, the types a run takes, its errors, the
deprecated forms, INTRA_OP_PARALLELISM, MEMORY USAGE, and a server without the backend library.

The committed models are described in tests/flow/helpers/torch_models.py (tests/data/gen_torch.cpp). Outputs are
checked against numpy. The backend library is opened at first use from the module's own directory (no
load-time `TORCH <path>` argument in helpers/server.py), or from `TORCH <path>` (test_without_torch_library).

Elsewhere: TORCH models across RDB, AOF, replication and the `m:torch` case recorded from RedisAI in
test_persistence_model.py, the sandbox in test_security_torch.py, GPU devices in test_gpu_errors.py, concurrent
clients in test_exec_concurrency.py, AI.INFO and INFO MODULES in test_observability.py, TorchScript scripts in
test_cmd_script.py.
"""


import numpy as np
import pytest
import redis

from helpers.checks import WRONGTYPE, check_error_raw, error_text
from helpers.data import weights
from helpers.onnx_models import ai_info, get_tensor, model_execute, modules_sections, set_tensor, store
from helpers.resp import raw_command
from helpers.torch_models import TORCH_MODELS, pt_blob, pt_store, slow_reference, torch_meta

BOGUS_TORCH = "/nonexistent/libredisai_torch.so"
E_IN_COUNT = "Number of keys given as INPUTS here does not match model definition"
E_OUT_COUNT = "Number of keys given as OUTPUTS here does not match model definition"


# =================================================================================================
# AI.MODELSTORE / AI.MODELGET


@pytest.mark.parametrize("name", list(TORCH_MODELS))
def test_modelstore_meta_and_blob(con, port, name):
    assert raw_command(port, "AI.MODELSTORE", "m", "TORCH", "CPU", "BLOB", pt_blob(name)) == "OK"  # +OK
    inputs, nout = TORCH_MODELS[name]
    expected = torch_meta(inputs=inputs, noutputs=nout)
    assert len(expected) == 16
    assert con.execute_command("AI.MODELGET", "m", "META") == expected
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == pt_blob(name)
    assert con.execute_command("AI.MODELGET", "m") == expected + [b"blob", pt_blob(name)]
    assert con.execute_command("AI.MODELGET", "m", "BLOB", "META") == expected + [b"blob", pt_blob(name)]
    assert con.type("m") == b"AI__MODEL"
    info = ai_info(con, "m")
    assert (info["type"], info["backend"], info["device"], info["calls"]) == (b"MODEL", b"TORCH", b"CPU", 0)


def test_modelstore_options_round_trip(con):
    assert con.execute_command("ai.modelstore", "m", "torch", "cpu:1", "TAG", "my tag", "BATCHSIZE", 8,
                               "MINBATCHSIZE", 2, "MINBATCHTIMEOUT", 50, "BLOB", pt_blob("torch_linear")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META") == torch_meta(
        device=b"cpu:1", tag=b"my tag", batch=8, minbatch=2, minbatchtimeout=50, inputs=["x"])
    # the blob may come in several chunks
    b = pt_blob("torch_add")
    assert con.execute_command("AI.MODELSTORE", "m2", "TORCH", "CPU", "BLOB", b[:100], b[100:500], b[500:]) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "BLOB") == b
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6, atol=1e-6)
    assert model_execute(con, "m2", ["x", "x"], ["z"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "z"), x + x)
    # replacing the model at a key resets its stats
    pt_store(con, "m", "torch_two_outputs", "TAG", "v2")
    assert con.execute_command("AI.MODELGET", "m", "META") == torch_meta(tag=b"v2", inputs=["x"], noutputs=2)
    info = ai_info(con, "m")
    assert (info["tag"], info["calls"]) == (b"v2", 0)


@pytest.mark.parametrize("bad", [
    b"garbage",
    "truncated",
    "damaged",
    b"PK\x03\x04" + b"\x00" * 60,
], ids=["garbage", "truncated", "damaged", "zip-header-only"])
def test_modelstore_corrupt_blob(con, bad):
    good = pt_blob("torch_add")
    if bad == "truncated":
        bad = good[:len(good) // 2]
    elif bad == "damaged":
        bad = good[:100] + b"x" * 100 + good[200:]
    msg = error_text(con.execute_command, "AI.MODELSTORE", "m", "TORCH", "CPU", "BLOB", bad)
    assert msg and "\n" not in msg, msg
    # libtorch's own message (its stream/zip reader), not one of the module's
    assert "reader failed" in msg or "PytorchStreamReader" in msg, msg
    assert con.exists("m") == 0
    # a failed store does not replace the model at the key
    pt_store(con, "m", "torch_add", "TAG", "keep")
    before = con.execute_command("AI.MODELGET", "m", "META", "BLOB")
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("AI.MODELSTORE", "m", "TORCH", "CPU", "TAG", "new", "BLOB", bad)
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == before
    assert ai_info(con, "m")["tag"] == b"keep"
    assert con.ping()


def test_modelstore_wrongtype(con, port):
    con.set("s", "string")
    check_error_raw(port, WRONGTYPE, "AI.MODELSTORE", "s", "TORCH", "CPU", "BLOB", pt_blob("torch_add"))
    check_error_raw(port, "ERR INPUTS argument should not be specified for this backend",
                    "AI.MODELSTORE", "m", "TORCH", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                    "BLOB", pt_blob("torch_add"))
    assert con.get("s") == b"string" and con.exists("m") == 0


# =================================================================================================
# AI.MODELEXECUTE


def test_execute_add_float(con):
    pt_store(con, "m", "torch_add")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3)).astype(np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", b"FLOAT", b"shape", [2, 3]]
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    # broadcasting, and TIMEOUT at the end
    row = np.array([10, 20, 30], dtype=np.float32)
    set_tensor(con, "row", row)
    assert model_execute(con, "m", ["a", "row"], ["c2"], "TIMEOUT", 5000) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c2"), a + row)
    # DOUBLE in, DOUBLE out
    d = rng.standard_normal((4,))
    set_tensor(con, "d", d)
    assert model_execute(con, "m", ["d", "d"], ["dd"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "dd", "META") == [b"dtype", b"DOUBLE", b"shape", [4]]
    np.testing.assert_array_equal(get_tensor(con, "dd"), d + d)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8])
def test_execute_add_small_int_types(con, dtype):
    pt_store(con, "m", "torch_add")
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    b = np.array([[7, 8, 9], [10, 11, 12]], dtype=dtype)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    out = get_tensor(con, "c")
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, a + b)


def test_execute_two_outputs(con, port):
    pt_store(con, "m", "torch_two_outputs")
    x = np.array([[1.5, -2.0, 0.25], [3.0, 4.0, -8.5]], dtype=np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["p", "q"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "p"), x + np.float32(1))
    np.testing.assert_array_equal(get_tensor(con, "q"), x * np.float32(2))
    check_error_raw(port, E_OUT_COUNT, "AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "p")
    check_error_raw(port, E_OUT_COUNT, "AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 3, "p", "q", "r")
    check_error_raw(port, E_IN_COUNT, "AI.MODELEXECUTE", "m", "INPUTS", 2, "x", "x", "OUTPUTS", 2, "p", "q")


@pytest.mark.parametrize("batch", [1, 5])
def test_execute_linear(con, batch):
    pt_store(con, "m", "torch_linear")
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "META") == [b"dtype", b"FLOAT", b"shape", [batch, 3]]
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,name", [(np.int64, b"INT64"), (np.int32, b"INT32")])
def test_execute_int(con, dtype, name):
    pt_store(con, "m", "torch_int")
    a = np.array([[3, -4, 5], [0, 7, -1000]], dtype=dtype)
    b = np.array([[2, 2, -3], [9, -7, 1000]], dtype=dtype)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", name, b"shape", [2, 3]]
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == (a * b + 1).ravel().tolist()


def test_execute_slow_model(con):
    pt_store(con, "m", "torch_slow")
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), slow_reference(x), rtol=1e-4, atol=1e-5)


def test_execute_errors(con, port):
    pt_store(con, "m", "torch_linear")
    check_error_raw(port, E_IN_COUNT, "AI.MODELEXECUTE", "m", "INPUTS", 2, "x", "x", "OUTPUTS", 1, "y")
    check_error_raw(port, E_OUT_COUNT, "AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 2, "y", "z")
    check_error_raw(port, "ERR tensor key is empty or in a different shard",
                    "AI.MODELEXECUTE", "m", "INPUTS", 1, "nokey", "OUTPUTS", 1, "y")
    # a libtorch runtime error (x has 5 columns, W has 4 rows): that error, on one line; nothing stored
    set_tensor(con, "bad", np.ones((2, 5), dtype=np.float32))
    msg = error_text(model_execute, con, "m", ["bad"], ["y"])
    assert msg and "\n" not in msg, msg
    assert con.exists("y") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"]) == (1, 1), info
    # the model still works
    x = np.ones((1, 4), dtype=np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)


@pytest.mark.parametrize("dtype,args", [("UINT16", [2, 2, "VALUES", 1, 2, 3, 4]),
                                        ("STRING", [2, 2, "VALUES", "a", "b", "c", "d"])])
def test_execute_unsupported_input_types(con, dtype, args):
    pt_store(con, "m", "torch_add")
    assert con.execute_command("AI.TENSORSET", "t", dtype, *args) == b"OK"
    msg = error_text(model_execute, con, "m", ["t", "t"], ["c"])
    assert msg and "\n" not in msg, msg
    assert con.exists("c") == 0
    set_tensor(con, "f", np.ones((2, 2), dtype=np.float32))
    msg = error_text(model_execute, con, "m", ["f", "t"], ["c"])
    assert msg and "\n" not in msg, msg
    assert con.exists("c") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"]) == (2, 2), info
    assert con.ping()


# =================================================================================================
# deprecated AI.MODELSET / AI.MODELRUN


def test_modelset_modelrun_deprecated(con, port):
    assert con.execute_command("AI.MODELSET", "m", "TORCH", "CPU", "BLOB", pt_blob("torch_add")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META") == torch_meta(inputs=["a", "b"])
    # INPUTS / OUTPUTS are ignored for TORCH by MODELSET: the names come from forward()
    assert con.execute_command("AI.MODELSET", "m2", "TORCH", "CPU", "TAG", "old", "INPUTS", "x", "y",
                               "OUTPUTS", "z", "BLOB", pt_blob("torch_two_outputs")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META") == torch_meta(tag=b"old", inputs=["x"], noutputs=2)
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    b = np.array([0.5, -1.0, 4.0], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert con.execute_command("AI.MODELRUN", "m", "INPUTS", "a", "b", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    assert con.execute_command("AI.MODELRUN", "m", "TIMEOUT", 5000, "INPUTS", "b", "b", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), b + b)
    assert con.execute_command("AI.MODELRUN", "m2", "INPUTS", "a", "OUTPUTS", "p", "q") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "p"), a + 1)
    np.testing.assert_array_equal(get_tensor(con, "q"), a * 2)
    check_error_raw(port, E_IN_COUNT, "AI.MODELRUN", "m", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, E_OUT_COUNT, "AI.MODELRUN", "m2", "INPUTS", "a", "OUTPUTS", "p")
    assert ai_info(con, "m")["calls"] == 2


# =================================================================================================
# thread options


@pytest.mark.module_args("INTRA_OP_PARALLELISM", "1", "THREADS_PER_QUEUE", "2")
def test_intra_op_parallelism_one(server):
    fields = dict(dict(modules_sections(server))["ai_load_time_configs"])
    assert fields["ai_intra_op_parallelism"] == "1", fields
    con = server.client()
    pt_store(con, "lin", "torch_linear")
    pt_store(con, "slow", "torch_slow", device="CPU:1")
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        set_tensor(con, "x", x)
        assert model_execute(con, "lin", ["x"], ["y"]) == b"OK"
        np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-5, atol=1e-6)
    x = np.random.default_rng(9).standard_normal((64, 256)).astype(np.float32)
    set_tensor(con, "big", x)
    assert model_execute(con, "slow", ["big"], ["out"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "out"), slow_reference(x), rtol=1e-4, atol=1e-5)


# =================================================================================================
# without the backend library


def test_backend_not_installed_says_so_in_words(make_server, tmp_path):
    """The wheel's launcher passes a backend pip has not installed as <...>/backend-not-installed/pip-install-<req>/
    <library> (python/redisai_rs): the reply says, in words, that the backend is not installed and which pip
    command installs it, for models and scripts; no loader text, no path."""
    missing = tmp_path / "redisai_rs" / "backend-not-installed" / "pip-install-redisai-rs[torch]" / "libtorch_cpu.so"
    srv = make_server(module_args=["TORCH", str(missing)], name="torch_not_installed")
    con = srv.client()
    src = "def bar(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0]\n"
    want = "Could not load backend TORCH: it is not installed (pip install 'redisai-rs[torch]', then restart the server)"
    for cmd in (["AI.MODELSTORE", "m", "TORCH", "CPU", "BLOB", pt_blob("torch_add")],
                ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", src]):
        assert error_text(con.execute_command, *cmd) == want
    assert con.exists("m") == 0 and con.exists("s") == 0


def test_without_torch_library(make_server):
    srv = make_server(module_args=["TORCH", BOGUS_TORCH], name="no_torch")
    con = srv.client()
    set_tensor(con, "a", np.array([[1.0, 2.0]], dtype=np.float32))
    src = "def bar(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0]\n"
    for cmd in (["AI.MODELSTORE", "m", "TORCH", "CPU", "BLOB", pt_blob("torch_add")],
                ["AI.MODELSET", "m", "TORCH", "CPU", "BLOB", pt_blob("torch_add")],
                ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", src],
                ["AI.SCRIPTSET", "s", "CPU", "SOURCE", src]):
        msg = error_text(con.execute_command, *cmd)
        assert f"Could not load backend TORCH from {BOGUS_TORCH}" in msg, msg
    assert con.exists("m") == 0 and con.exists("s") == 0
    backends = dict(dict(modules_sections(srv)).get("ai_backends_info", []))
    assert "ai_Torch_version" not in backends, backends
    # ONNX models are unaffected
    store(con, "o", "mul")
    assert model_execute(con, "o", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"1", b"4"]


# =================================================================================================
# MEMORY USAGE


def test_memory_usage(con):
    pt_store(con, "m", "torch_slow")
    assert con.memory_usage("m") >= len(pt_blob("torch_slow"))
