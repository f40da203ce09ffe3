"""TORCH models through libredisai_torch.so (libtorch 2.13): spec §1.5 (TORCH input/output names), §1.6-1.8,
§1.15, §3.3 (INTRA_OP_PARALLELISM), §3.5 (INFO MODULES), §3.6-3.8 (RDB, AOF rewrite, replication) and the
`m:torch` case recorded from RedisAI 1.2.7 (a model saved by torch 1.13 that computes a + b).

The committed models are described in tests/flow/helpers/torch_models.py (tests/data/gen_torch.cpp). Outputs are
checked against numpy. The backend library is opened at first use from the module's own directory (no
load-time `TORCH <path>` argument in helpers/server.py), or from `TORCH <path>` (test_without_torch_library).
Not implemented yet and not tested: the TorchScript extensions `redis.execute`, `redis.asList`,
`redisAI.model_execute`.
"""


import numpy as np
import pytest
import redis

from helpers.aof import aof_commands, aof_files, bgrewriteaof
from helpers.checks import WRONGTYPE, check_error_raw, wait_replicas
from helpers.data import DATA_DIR, weights
from helpers.onnx_models import (ai_info, concurrent_executes, get_tensor, model_execute, modules_sections, set_tensor,
                                 store)
from helpers.recorded import need_case, payload_body, recorded_create, recorded_reply
from helpers.resp import raw_command
from helpers.torch_models import TORCH_MODELS, TORCH_VERSION, pt_blob, pt_store, slow_reference, torch_meta

BOGUS_TORCH = "/nonexistent/libredisai_torch.so"
E_IN_COUNT = "Number of keys given as INPUTS here does not match model definition"
E_OUT_COUNT = "Number of keys given as OUTPUTS here does not match model definition"


@pytest.fixture
def port(shared_server):
    return shared_server.port


def error_text(fn, *args):
    """str() of the ResponseError that fn(*args) raises (fails if it succeeds)."""
    try:
        r = fn(*args)
    except redis.exceptions.ResponseError as e:
        return str(e)
    pytest.fail(f"expected an error, got {r!r}", pytrace=False)


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


@pytest.mark.parametrize("device", ["GPU", "GPU:0", "gpu:1"])
def test_modelstore_gpu_device(con, device):
    for cmd in (["AI.MODELSTORE", "m", "TORCH", device, "BLOB", pt_blob("torch_add")],
                ["AI.MODELSET", "m", "TORCH", device, "BLOB", pt_blob("torch_add")]):
        msg = error_text(con.execute_command, *cmd)
        assert "CUDA" in msg, msg
    assert con.exists("m") == 0


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


def test_ai_info_torch_model(con, port):
    pt_store(con, "m", "torch_two_outputs", "TAG", "t1", device="CPU:1")
    x = np.ones((3, 2), dtype=np.float32)
    set_tensor(con, "x", x)
    for _ in range(2):
        assert model_execute(con, "m", ["x"], ["p", "q"]) == b"OK"
    reply = con.execute_command("AI.INFO", "m")
    assert reply[:10] == [b"key", b"m", b"type", b"MODEL", b"backend", b"TORCH", b"device", b"CPU:1", b"tag", b"t1"]
    info = ai_info(con, "m")
    assert (info["samples"], info["calls"], info["errors"]) == (6, 2, 0), info
    assert info["duration"] > 0
    assert con.execute_command("AI.INFO", "m", "RESETSTAT") == b"OK"
    info = ai_info(con, "m")
    assert (info["duration"], info["samples"], info["calls"], info["errors"]) == (0, 0, 0, 0), info
    assert con.execute_command("AI.MODELDEL", "m") == b"OK"
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "m")


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
# concurrency and thread options


@pytest.mark.module_args("THREADS_PER_QUEUE", "4")
def test_concurrent_execute(server):
    """8 clients x 25 MODELEXECUTE of torch_linear, each with its own input: every output belongs to its input."""
    con = server.client()
    pt_store(con, "m", "torch_linear")
    n_threads, n_runs = 8, 25
    inputs, results = concurrent_executes(server, "m", n_threads, n_runs)
    for key, x in inputs.items():
        np.testing.assert_allclose(results[key], weights.linear(x), rtol=1e-5, atol=1e-5)
    # exact: each output is bit for bit what a run of the same input alone gives
    for (t, i), x in inputs.items():
        if i % 5 == 0:
            assert model_execute(con, "m", [f"x:{t}:{i}"], ["ref"]) == b"OK"
            assert get_tensor(con, "ref").tobytes() == results[t, i].tobytes(), (t, i)
    info = ai_info(con, "m")
    assert (info["errors"], info["calls"], info["samples"]) == (
        0, n_threads * n_runs * 6 // 5, 2 * n_threads * n_runs * 6 // 5), info


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
# INFO MODULES and the backend library


def test_info_modules_backends(server):
    con = server.client()
    # only loaded backends are listed: TORCH is opened at first use
    keys = [k for k, _ in dict(modules_sections(server)).get("ai_backends_info", [])]
    assert "ai_Torch_version" not in keys, keys
    pt_store(con, "t", "torch_add")
    backends = dict(modules_sections(server))["ai_backends_info"]
    assert ("ai_Torch_version", TORCH_VERSION) in backends, backends
    # loaded in another order, listed as RedisAI does: TensorFlow, Torch, onnxruntime
    store(con, "o", "mul")
    tf_graph = (DATA_DIR / "tf_mul.pb").read_bytes()
    assert con.execute_command("AI.MODELSTORE", "tf", "TF", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                               "BLOB", tf_graph) == b"OK"
    keys = [k for k, _ in dict(modules_sections(server))["ai_backends_info"]]
    assert [k for k in keys if k in ("ai_TensorFlow_version", "ai_Torch_version", "ai_onnxruntime_version")] == [
        "ai_TensorFlow_version", "ai_Torch_version", "ai_onnxruntime_version"], keys
    assert keys[0] == "ai_TensorFlow_version", keys


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
# persistence and replication

MODELS = {  # key: (file, options, device)
    "t:add": ("torch_add", ["TAG", "add"], "CPU"),
    "t:two": ("torch_two_outputs", [], "cpu:1"),
    "t:lin": ("torch_linear", ["TAG", "lin", "BATCHSIZE", 4, "MINBATCHSIZE", 2, "MINBATCHTIMEOUT", 7], "CPU"),
    "t:int": ("torch_int", [], "CPU:1"),
}


def populate(con):
    for key, (name, opts, dev) in MODELS.items():
        pt_store(con, key, name, *opts, device=dev)
    return snapshot(con)


def snapshot(con, keys=MODELS):
    return {k: (con.type(k), con.execute_command("AI.MODELGET", k, "META", "BLOB")) for k in keys}


def check_models(con, before):
    """Same META and BLOB as before, fresh AI.INFO entries, all executable with the right results."""
    assert snapshot(con) == before
    for k, (name, _, _) in MODELS.items():
        assert before[k][1][17] == pt_blob(name)
        info = ai_info(con, k)
        assert (info["type"], info["backend"], info["device"], info["tag"], info["calls"]) == (
            b"MODEL", b"TORCH", before[k][1][3], before[k][1][5], 0), info
    a = np.array([[1.5, -2.0, 3.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "t:add", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + a)
    assert model_execute(con, "t:two", ["a"], ["p", "q"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "q"), a * 2)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    set_tensor(con, "x", x)
    assert model_execute(con, "t:lin", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)
    i = np.array([5, -7], dtype=np.int64)
    set_tensor(con, "i", i)
    assert model_execute(con, "t:int", ["i", "i"], ["j"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "j", "VALUES") == [26, 50]


def test_debug_reload(server):
    con = server.client()
    before = populate(con)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_models(con, before)
    # again, from what our own rdb_save wrote after a reload
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.MODELGET", "t:lin", "META", "BLOB") == before["t:lin"][1]


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite(server):
    con = server.client()
    before = populate(con)
    bgrewriteaof(server, con)
    base, _ = aof_files(server)
    assert base.suffix == ".aof", base
    stores = {c[1].decode(): c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert set(stores) == set(MODELS)
    for key, (name, _, dev) in MODELS.items():
        meta = before[key][1]
        cmd = stores[key]
        # AI.MODELSTORE <key> TORCH <device> TAG <tag> BATCHSIZE n MINBATCHSIZE m MINBATCHTIMEOUT t BLOB <chunk>...
        assert cmd[1:13] == [key.encode(), b"TORCH", dev.encode(), b"TAG", meta[5], b"BATCHSIZE", str(meta[7]).encode(),
                             b"MINBATCHSIZE", str(meta[9]).encode(), b"MINBATCHTIMEOUT", str(meta[15]).encode(),
                             b"BLOB"], cmd[:13]
        assert b"".join(cmd[13:]) == pt_blob(name)
    server.restart()
    con = server.client()
    check_models(con, before)


def test_replication(make_server, make_replica):
    master = make_server(name="master")
    mcon = master.client()
    pt_store(mcon, "early", "torch_linear", "TAG", "full sync")  # reaches the replica through the RDB
    replica = make_replica(master)
    rcon = replica.client()
    assert rcon.execute_command("AI.MODELGET", "early", "META", "BLOB") == mcon.execute_command(
        "AI.MODELGET", "early", "META", "BLOB")
    # stored after the link is up: replicated verbatim, the replica loads the model itself
    pt_store(mcon, "m", "torch_two_outputs", "TAG", "v1")
    assert mcon.execute_command("AI.MODELSET", "old", "TORCH", "CPU:1", "BLOB", pt_blob("torch_add")) == b"OK"
    wait_replicas(mcon)
    for k in ("m", "old"):
        assert rcon.execute_command("AI.MODELGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.MODELGET", k, "META", "BLOB")
        assert ai_info(rcon, k)["calls"] == 0
    # executions: the outputs reach the replica as tensors; the models are not run there
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    set_tensor(mcon, "x", x)
    assert model_execute(mcon, "m", ["x"], ["p", "q"]) == b"OK"
    assert model_execute(mcon, "early", ["x"], ["y"]) == b"OK"
    assert mcon.execute_command("AI.MODELRUN", "old", "INPUTS", "x", "x", "OUTPUTS", "s") == b"OK"
    wait_replicas(mcon)
    for k in ("p", "q", "y", "s"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB"), k
    np.testing.assert_array_equal(get_tensor(rcon, "q"), x * 2)
    np.testing.assert_allclose(get_tensor(rcon, "y"), weights.linear(x), rtol=1e-5, atol=1e-6)
    for k in ("m", "early", "old"):
        assert ai_info(rcon, k)["calls"] == 0
    # MODELDEL is replicated
    assert mcon.execute_command("AI.MODELDEL", "m") == b"OK"
    wait_replicas(mcon)
    assert rcon.exists("m") == 0
    assert sorted(rcon.execute_command("AI._MODELSCAN")) == sorted(mcon.execute_command("AI._MODELSCAN"))


# =================================================================================================
# RESTORE of the model recorded from RedisAI 1.2.7


def test_restore_recorded_torch(con):
    case = need_case("m:torch")
    recorded = bytes.fromhex(case["dump_hex"])
    assert con.restore("m:torch", 0, recorded) == b"OK"
    assert con.type("m:torch") == b"AI__MODEL"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    model_blob = recorded_create(case)[-1]
    assert con.execute_command("AI.MODELGET", "m:torch", "BLOB") == model_blob
    meta = con.execute_command("AI.MODELGET", "m:torch", "META")
    assert meta[11] == [b"a", b"b"] and meta[13] == [b""]
    rng = np.random.default_rng(12)
    a = rng.standard_normal((2, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m:torch", ["a", "b"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    info = ai_info(con, "m:torch")
    assert (info["backend"], info["tag"], info["calls"], info["errors"], info["samples"]) == (b"TORCH", b"v1", 1, 0, 2)
    # our DUMP carries RedisAI's payload; storing the recorded command gives the same payload too
    assert payload_body(con.dump("m:torch")) == payload_body(recorded)
    assert con.execute_command(*recorded_create(case)) == b"OK"
    assert payload_body(con.dump("m:torch")) == payload_body(recorded)
    # and it survives a reload
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    assert model_execute(con, "m:torch", ["b", "a"], ["c2"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c2"), b + a)


def test_memory_usage(con):
    pt_store(con, "m", "torch_slow")
    assert con.memory_usage("m") >= len(pt_blob("torch_slow"))


def test_not_in_transaction(con):
    pt_store(con, "m", "torch_add")
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    pipe = con.pipeline(transaction=True)
    pipe.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    res = pipe.execute(raise_on_error=False)
    assert isinstance(res[0], redis.exceptions.ResponseError), res
    assert str(res[0]) == "Cannot run RedisAI command within a transaction or a LUA script"
    assert con.exists("c") == 0
