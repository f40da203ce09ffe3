"""TFLITE model admission and the TFLITE memory bound (src/admission/tflite.rs, src/backends/tflite/alloc.rs;
docs/security.md): a client that may store a model must not make the server load code, recurse until its stack
overflows, or allocate what a request asks for.

Refused at store: models with select-TF (Flex) or other custom ops, and a WHILE whose body is the calling subgraph
itself (LiteRT recursed into it until Redis's stack overflowed). A refused model that arrives through RESTORE is
kept with its bytes but never reaches LiteRT: running it replies the refusal. Every committed tests/data/*.tflite
model that is not an attack stores and runs.

The memory bound: models whose tensors are sized by the request (tests/data/gen_tflite_alloc.py) get
`TFLITE memory limit exceeded, memory allocation failed.` past the bound (the default one or BACKEND_MEMORY_LIMIT),
Redis keeps its data, and only the refused run fails.
"""

import threading
import time

import numpy as np
import pytest
import redis

from helpers.admission import assert_kept_not_run
from helpers.checks import check_error
from helpers.data import DATA_DIR as DATA
from helpers.onnx_models import get_tensor, model_execute, set_tensor
from helpers.rdb import model_payload
from helpers.tflite_models import ab, fanout_model, tfl_store, while_model

TFLITE = 1  # the backend code in RDB payloads
RECURSIVE_WHILE = ("TFLITE model refused: subgraph 0 calls itself through WHILE (subgraphs 0 -> 0): recursive control "
                   "flow is not allowed")
FLEX = ("TFLITE model refused: operator code 0 is the select-TF (Flex) op 'FlexReadFile': Flex ops are not allowed "
        "(they would run TensorFlow kernels such as ReadFile)")
CUSTOM = ("TFLITE model refused: operator code 0 is the custom op 'MyCustomOp': custom ops are not allowed "
          "(no custom-op libraries)")


def tflite(name):
    return (DATA / f"{name}.tflite").read_bytes()


# =================================================================================================
# refused at store: custom ops, recursive control flow


def test_tflite_custom_ops_refused_at_store(con):
    for name, error in (("tflite_flex_op", FLEX), ("tflite_custom_op", CUSTOM)):
        check_error(con, error, "AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", tflite(name))
        check_error(con, error, "AI.MODELSET", "m", "TFLITE", "CPU", "BLOB", tflite(name))
    assert con.exists("m") == 0


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


# =================================================================================================
# RESTORE keeps a refused model, which never runs


def test_tflite_restore_keeps_refused_model(con):
    evil = tflite("tflite_flex_op")
    assert con.restore("flex", 0, model_payload(4, TFLITE, "CPU", evil, inputs=["x"], outputs=["y"])) == b"OK"
    assert_kept_not_run(con, "flex", evil, error=FLEX, backend=b"TFLITE")


# =================================================================================================
# legitimate models still store and run


LEGIT_TFLITE = sorted(p.stem for p in DATA.glob("*.tflite") if "custom" not in p.stem and "flex" not in p.stem)


@pytest.mark.parametrize("name", LEGIT_TFLITE)
def test_committed_tflite_models_store(con, name):
    assert con.execute_command("AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", tflite(name)) == b"OK"


def test_legitimate_models_run(con):
    assert con.execute_command("AI.MODELSTORE", "t", "TFLITE", "CPU", "BLOB", tflite("tflite_int")) == b"OK"
    x = np.array([[1, 1, 1]], dtype=np.int32)
    set_tensor(con, "x", x)
    assert model_execute(con, "t", ["x"], ["y"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), x + np.array([1, 2, 3], dtype=np.int32))


# =================================================================================================
# the memory bound: models that allocate what a request asks for (tests/data/gen_tflite_alloc.py): FILL's
# dynamic tensor sized by an input's values, and a broadcast sum whose N x M tensor is sized by the inputs' shapes
# (in LiteRT's arena for INT32, in XNNPACK for FLOAT)

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


FANOUT = ("TFLITE model refused: the control-flow ops of subgraph 0 run more than 65536 ops of other subgraphs in one "
          "pass (the calls fan out)")


def test_control_flow_fanout_bound(con):
    """IFs that each run the next subgraph twice: at the bound the model stores and computes in a blink; one level
    more is refused (24 levels ran 2^24 subgraphs and ignored MODEL_EXECUTION_TIMEOUT for 30 s: LiteRT checks
    cancellation between the ops of the subgraph it is in); restored, it is kept and never run."""
    set_tensor(con, "i", np.array([3], dtype=np.int32))
    assert con.execute_command("AI.MODELSTORE", "ok", "TFLITE", "CPU", "BLOB", fanout_model(14)) == b"OK"
    t0 = time.monotonic()
    assert con.execute_command("AI.MODELEXECUTE", "ok", "INPUTS", 1, "i", "OUTPUTS", 1, "o") == b"OK"
    assert time.monotonic() - t0 < 2
    assert get_tensor(con, "o").tolist() == [3 * 2 ** 15]
    for levels in (15, 30):
        check_error(con, FANOUT, "AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", fanout_model(levels))
    assert con.exists("m") == 0
    assert con.restore("r", 0, model_payload(4, TFLITE, "CPU", fanout_model(30))) == b"OK"
    check_error(con, FANOUT, "AI.MODELEXECUTE", "r", "INPUTS", 1, "i", "OUTPUTS", 1, "o2")
    assert con.exists("o2") == 0
    assert get_tensor(con, "i").tolist() == [3]
