"""The TFLITE backend: TensorFlow Lite flatbuffers run by LiteRT's C API (libLiteRt.so of the PyPI
ai-edge-litert 2.3.0 wheel; REDISAI_TFLITE_LIB, passed as `TFLITE <path>` by helpers/server.py), with the tiny models of
tests/data (tests/data/gen_tflite.py):

  tflite_sub_mul.tflite  a, b: FLOAT [N, 2] -> diff = a - b, prod = a * b
  tflite_int.tflite      x: INT32 [N, 3]   -> y = x + [1, 2, 3]

Also control flow (src/admission/tflite.rs): a WHILE model built here (`while_model`) stores and runs, and the
same model whose WHILE body is its own subgraph, which made LiteRT recurse until Redis's stack overflowed, is
refused at store and never run when it comes through RESTORE.

Spec: §1.5 (TFLITE is a backend; MODELSET refuses BATCHSIZE for it), §1.8 (`Input tensor type doesn't match the
type expected by the model definition`), model names are the interpreter's (the main subgraph's tensors).
"""

import os
import struct
import threading
import time

import numpy as np
import pytest
import redis

from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import check_error, check_error_raw
from helpers.data import DATA_DIR
from helpers.onnx_models import ai_info, get_tensor, model_execute, modules_sections, set_tensor, store
from helpers.server import MODULE_PATH
from test_dropin import model_payload

LITERT_VERSION = "2.3.0"
BOGUS = "/nonexistent/libLiteRt.so"


def tfl_blob(name):
    return (DATA_DIR / f"tflite_{name}.tflite").read_bytes()


def tfl_store(con, key, name, *opts, device="CPU"):
    reply = con.execute_command("AI.MODELSTORE", key, "TFLITE", device, *opts, "BLOB", tfl_blob(name))
    assert reply == b"OK", reply


def ab(rows, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 2)).astype(np.float32), rng.standard_normal((rows, 2)).astype(np.float32))


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


def test_autobatching(server):
    """MODELSTORE allows BATCHSIZE for TFLITE: requests wait for MINBATCHSIZE rows (or MINBATCHTIMEOUT), run as
    one batch (inputs joined on dimension 0), and each gets its own rows back."""
    con = server.client()
    tfl_store(con, "m", "sub_mul", "BATCHSIZE", 16, "MINBATCHSIZE", 10, "MINBATCHTIMEOUT", 1000)
    replies, inputs = {}, {}

    def one(i):
        c = server.client()
        a, b = ab(2, seed=100 + i)
        inputs[i] = (a, b)
        set_tensor(c, f"a{i}", a)
        set_tensor(c, f"b{i}", b)
        replies[i] = model_execute(c, "m", [f"a{i}", f"b{i}"], [f"d{i}", f"p{i}"])

    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - start
    assert replies == {i: b"OK" for i in range(4)}
    # 8 rows < MINBATCHSIZE 10: nothing ran before MINBATCHTIMEOUT, then all four together
    assert elapsed >= 0.95, elapsed
    for i, (a, b) in inputs.items():
        np.testing.assert_array_equal(get_tensor(con, f"d{i}"), a - b)
        np.testing.assert_array_equal(get_tensor(con, f"p{i}"), a * b)
    info = ai_info(con, "m")
    assert (info["calls"], info["samples"], info["errors"]) == (4, 8, 0), info


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


@pytest.mark.module_args("THREADS_PER_QUEUE", "3")
def test_concurrent_clients(server):
    """THREADS_PER_QUEUE 3: each worker runs its own compiled model; every reply matches its own input."""
    con = server.client()
    tfl_store(con, "m", "sub_mul")
    errors = []

    def worker(t):
        c = server.client()
        try:
            for i in range(30):
                a, b = ab(1 + (t + i) % 5, seed=t * 1000 + i)
                set_tensor(c, f"a{t}", a)
                set_tensor(c, f"b{t}", b)
                assert model_execute(c, "m", [f"a{t}", f"b{t}"], [f"d{t}", f"p{t}"]) == b"OK"
                np.testing.assert_array_equal(get_tensor(c, f"d{t}"), a - b)
                np.testing.assert_array_equal(get_tensor(c, f"p{t}"), a * b)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert ai_info(con, "m")["calls"] == 180


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_persistence(server):
    con = server.client()
    tfl_store(con, "m", "sub_mul", "TAG", "t", "BATCHSIZE", 4)
    tfl_store(con, "i", "int", device="CPU:1")
    before = {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in ("m", "i")}
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    bgrewriteaof(server, con)
    stores = {c[1]: c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert stores[b"m"][:4] == [b"AI.MODELSTORE", b"m", b"TFLITE", b"CPU"], stores[b"m"]
    server.restart()
    con = server.client()
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    a, b = ab(2)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["d", "p"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "d"), a - b)


def test_info_modules_version(server):
    con = server.client()
    backends = dict(dict(modules_sections(server)).get("ai_backends_info", []))
    assert "ai_TensorFlowLite_version" not in backends, backends  # loaded at first use
    tfl_store(con, "m", "int")
    backends = dict(dict(modules_sections(server))["ai_backends_info"])
    assert backends["ai_TensorFlowLite_version"] == f"LiteRT {LITERT_VERSION}", backends


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
# control flow: a hand-built WHILE model (no flatbuffers package in the test environment)


def _fb_table(fields, out):
    """Appends a table: `fields` are (field id, kind, value), kind one of u8 i8 i32 u32 str bytes ints table tables.
    Laid out front to back (every offset points forward), everything 4-byte aligned, as the verifier requires."""
    slots = max((f[0] for f in fields), default=-1) + 1
    slots += slots % 2  # an even vtable keeps the table after it aligned
    vtable = len(out)
    out += bytes(4 + 2 * slots)
    pos = len(out)
    out += struct.pack("<i", pos - vtable)
    pending = []
    for fid, kind, value in fields:
        at = len(out)
        struct.pack_into("<H", out, vtable + 4 + 2 * fid, at - pos)
        if kind in ("u8", "i8"):
            out += struct.pack("<B" if kind == "u8" else "<b", value) + bytes(3)
        elif kind in ("i32", "u32"):
            out += struct.pack("<i" if kind == "i32" else "<I", value)
        else:
            out += bytes(4)
            pending.append((at, kind, value))
    struct.pack_into("<HH", out, vtable, 4 + 2 * slots, len(out) - pos)
    for at, kind, value in pending:
        if kind == "table":
            target = _fb_table(value, out)
        else:
            if kind == "bytes":  # Buffer.data is force_align 16
                out += bytes(-(len(out) + 4) % 16)
            target = len(out)
            if kind == "str":
                out += struct.pack("<I", len(value)) + value.encode() + b"\0"
            elif kind == "bytes":
                out += struct.pack("<I", len(value)) + value
            elif kind == "ints":
                out += struct.pack(f"<I{len(value)}i", len(value), *value)
            else:  # tables
                out += struct.pack("<I", len(value))
                slots_at = len(out)
                out += bytes(4 * len(value))
                for i, t in enumerate(value):
                    struct.pack_into("<I", out, slots_at + 4 * i, _fb_table(t, out) - (slots_at + 4 * i))
            out += bytes(-len(out) % 4)
        struct.pack_into("<I", out, at, target - at)
    return pos


def _flatbuffer(root, identifier=b"TFL3"):
    out = bytearray(8)
    out[4:8] = identifier
    struct.pack_into("<I", out, 0, _fb_table(root, out))
    return bytes(out)


INT32, BOOL = 2, 6  # TensorType
WHILE, LESS, ADD = 119, 58, 0  # BuiltinOperator
WHILE_OPTIONS = 93  # BuiltinOptions union type


def _tensor(name, ttype, buffer=0):
    return [(0, "ints", [1]), (1, "i8", ttype), (2, "u32", buffer), (3, "str", name)]


def _subgraph(name, tensors, inputs, outputs, ops):
    return [(0, "tables", tensors), (1, "ints", inputs), (2, "ints", outputs), (3, "tables", ops), (4, "str", name)]


def while_model(body=2):
    """x: INT32 [1] -> y: while (i < 10) i += 1, from i = x (subgraphs: 0 main, 1 cond, 2 body). `body=0` makes the
    loop's body the main subgraph itself: LiteRT recursed into it until the stack overflowed."""
    while_op = [(0, "u32", 0), (1, "ints", [0]), (2, "ints", [1]), (3, "u8", WHILE_OPTIONS),
                (4, "table", [(0, "i32", 1), (1, "i32", body)])]
    main = _subgraph("main", [_tensor("x", INT32), _tensor("y", INT32)], [0], [1], [while_op])
    cond = _subgraph("cond", [_tensor("i", INT32), _tensor("limit", INT32, 1), _tensor("c", BOOL)], [0], [2],
                     [[(0, "u32", 1), (1, "ints", [0, 1]), (2, "ints", [2])]])
    step = _subgraph("body", [_tensor("i", INT32), _tensor("one", INT32, 2), _tensor("o", INT32)], [0], [2],
                     [[(0, "u32", 2), (1, "ints", [0, 1]), (2, "ints", [2])]])
    codes = [[(0, "i8", code), (2, "i32", 1), (3, "i32", code)] for code in (WHILE, LESS, ADD)]
    buffers = [[], [(0, "bytes", struct.pack("<i", 10))], [(0, "bytes", struct.pack("<i", 1))]]
    return _flatbuffer([(0, "u32", 3), (1, "tables", codes), (2, "tables", [main, cond, step]),
                        (3, "str", "redisai-rs while"), (4, "tables", buffers)])


RECURSIVE_WHILE = ("TFLITE model refused: subgraph 0 calls itself through WHILE (subgraphs 0 -> 0): recursive control "
                   "flow is not allowed")


def test_while_model_runs(con):
    """A legitimate loop is admitted and runs."""
    assert con.execute_command("AI.MODELSTORE", "w", "TFLITE", "CPU", "BLOB", while_model()) == b"OK"
    for start, end in ((3, 10), (-5, 10), (12, 12)):
        set_tensor(con, "x", np.array([start], dtype=np.int32))
        assert model_execute(con, "w", ["x"], ["y"]) == b"OK"
        assert con.execute_command("AI.TENSORGET", "y", "VALUES") == [end]


def test_while_whose_body_is_its_own_subgraph_refused(con):
    set_tensor(con, "keep", np.array([7, 8], dtype=np.int32))
    blob = while_model(body=0)
    check_error(con, RECURSIVE_WHILE, "AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", blob)
    assert con.exists("m") == 0
    assert con.ping()
    assert con.execute_command("AI.TENSORGET", "keep", "VALUES") == [7, 8]
    # RESTORE keeps it (no data is lost) but LiteRT never sees it: running it replies the refusal
    assert con.restore("m", 0, model_payload(4, 1, "CPU", blob)) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob
    check_error(con, RECURSIVE_WHILE, "AI.MODELEXECUTE", "m", "INPUTS", 1, "keep", "OUTPUTS", 1, "out")
    assert con.exists("out") == 0
    assert con.ping()
    assert con.execute_command("AI.TENSORGET", "keep", "VALUES") == [7, 8]


def test_kill_switch_stops_a_long_loop(make_server):
    """MODEL_EXECUTION_TIMEOUT stops a run between ops (LiteRT's cancellation check, which the memory bound
    shares): a WHILE loop of 2^32 iterations fails after the limit and the model serves the next request."""
    srv = make_server(module_args=["MODEL_EXECUTION_TIMEOUT", "1000"], name="tflite_kill_switch")
    con = srv.client()
    assert con.execute_command("AI.MODELSTORE", "w", "TFLITE", "CPU", "BLOB", while_model()) == b"OK"
    set_tensor(con, "x", np.array([-2**31], dtype=np.int32))
    start = time.monotonic()
    check_error(con, "TFLITE: the run was cancelled after MODEL_EXECUTION_TIMEOUT (1000 ms)",
                "AI.MODELEXECUTE", "w", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert time.monotonic() - start < 10
    set_tensor(con, "x", np.array([3], dtype=np.int32))
    assert model_execute(con, "w", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "VALUES") == [10]


# =================================================================================================
# the memory bound (src/backends/tflite/alloc.rs): models that allocate what a request asks for
# (tests/data/gen_tflite_alloc.py): FILL's dynamic tensor sized by an input's values, and a broadcast sum whose
# N x M tensor is sized by the inputs' shapes (in LiteRT's arena for INT32, in XNNPACK for FLOAT)

MEMORY_TEXT = "TFLITE memory limit exceeded, memory allocation failed."
BOMBS = ["fill_sum", "outer_sum", "outer_sum_float"]


def bomb_inputs(con, name, n, m):
    """Sets the inputs of model `name` for an n x m tensor inside it; returns their keys."""
    if name == "fill_sum":
        set_tensor(con, "dims", np.array([n, m], dtype=np.int32))
        return ["dims"]
    dtype = np.float32 if name.endswith("float") else np.int32
    set_tensor(con, "a", np.ones((n, 1), dtype=dtype))
    set_tensor(con, "b", np.full((1, m), 2, dtype=dtype))
    return ["a", "b"]


def bomb_sum(name, n, m):
    return 1.5 * n * m if name == "fill_sum" else 3 * n * m


def check_bomb_refused(con, name, n, m):
    """An n x m request fails with the memory error; Redis keeps serving with its data, and the model still runs
    requests that fit (its failed instance is rebuilt)."""
    con.set("keep", "data")
    set_tensor(con, "kept", np.array([7, 8], dtype=np.int32))
    tfl_store(con, "bomb", name)
    inputs = bomb_inputs(con, name, n, m)
    check_error(con, MEMORY_TEXT, "AI.MODELEXECUTE", "bomb", "INPUTS", len(inputs), *inputs, "OUTPUTS", 1, "z")
    assert con.exists("z") == 0
    assert con.ping()
    assert con.get("keep") == b"data"
    assert con.execute_command("AI.TENSORGET", "kept", "VALUES") == [7, 8]
    for rows, cols in ((3, 4), (30, 50)):
        inputs = bomb_inputs(con, name, rows, cols)
        assert model_execute(con, "bomb", inputs, ["z"]) == b"OK"
        assert get_tensor(con, "z").item() == bomb_sum(name, rows, cols)


@pytest.mark.parametrize("name", BOMBS)
def test_memory_bomb_refused_under_the_default_bound(server, name):
    """4e11 bytes: more than the default bound (maxmemory, else half the machine's memory) of any test machine."""
    bound = int(server.info("modules")["ai_backend_memory_bound"])
    assert 0 < bound < 4 * 10**11, bound
    check_bomb_refused(server.client(), name, 200_000, 500_000)


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "100")
@pytest.mark.parametrize("name", BOMBS)
def test_memory_bomb_refused_past_backend_memory_limit(server, name):
    """1.6 GB: the machine has it, the 100 MB bound refuses it; 16 MB fits and runs."""
    assert int(server.info("modules")["ai_backend_memory_bound"]) == 100_000_000
    con = server.client()
    check_bomb_refused(con, name, 20_000, 20_000)
    inputs = bomb_inputs(con, name, 2_000, 2_000)
    assert model_execute(con, "bomb", inputs, ["z"]) == b"OK"
    assert get_tensor(con, "z").item() == bomb_sum(name, 2_000, 2_000)


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "100", "THREADS_PER_QUEUE", "2")
def test_memory_refusal_fails_only_the_refused_run(server):
    """A refused run fails alone: legitimate runs on the other worker, side by side with it, all succeed."""
    c = server.client()
    tfl_store(c, "bomb", "fill_sum")
    tfl_store(c, "m", "sub_mul")
    bomb_inputs(c, "fill_sum", 20_000, 20_000)
    a, b = ab(64)
    set_tensor(c, "a", a)
    set_tensor(c, "b", b)
    stop = threading.Event()
    bomb_errors = []

    def bomb():
        con = server.client()
        while not stop.is_set():
            try:
                con.execute_command("AI.MODELEXECUTE", "bomb", "INPUTS", 1, "dims", "OUTPUTS", 1, "z")
                bomb_errors.append("succeeded")
            except redis.ResponseError as e:
                bomb_errors.append(str(e))

    t = threading.Thread(target=bomb)
    t.start()
    failures, runs = [], 0
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            runs += 1
            try:
                assert model_execute(c, "m", ["a", "b"], ["d", "p"]) == b"OK"
            except redis.ResponseError as e:
                failures.append(str(e))
    finally:
        stop.set()
        t.join()
    assert bomb_errors and set(bomb_errors) == {MEMORY_TEXT}, set(bomb_errors)
    assert not failures, f"{len(failures)} of {runs} legitimate runs failed: {failures[:3]}"
    np.testing.assert_array_equal(get_tensor(c, "p"), a * b)
    assert c.ping()
