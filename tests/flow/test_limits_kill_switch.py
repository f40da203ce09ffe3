"""The kill switch (docs/commands.md, "Load-time arguments": MODEL_EXECUTION_TIMEOUT): an ONNX run that takes
longer than MODEL_EXECUTION_TIMEOUT ms (load-time, default 5000, at least 1000) is terminated and fails with ONNX
Runtime's `Exiting due to terminate flag being set to true`; the server stays responsive meanwhile, the worker
serves the next request right after, and with THREADS_PER_QUEUE 2 the other worker of the queue keeps serving.
A TFLITE run is cancelled between ops the same way, and so is a TF graph that loops. (TORCH models and scripts that loop are stopped by the sandbox:
test_security_torch.py.)

loop_forever.onnx (tests/data/gen_onnx.py): x FLOAT [1] -> y, an ONNX Loop with trip count 2^62 that never
ends unless stopped."""

import time

import numpy as np
import pytest
import redis

from helpers.checks import check_error, module_names, wait_for
from helpers.data import weights
from helpers.onnx_models import (Request, ai_info, blocked_names, get_tensor, mexec, model_execute, modules_info,
                                 set_tensor, store)
from helpers.resp import RespError
from helpers.server import MODULE_PATH, ONNX_LIB
from helpers.tf_graphs import while_go
from helpers.tflite_models import while_model

TERMINATED = "Exiting due to terminate flag being set to true"


def assert_terminated(reply):
    assert isinstance(reply, RespError) and TERMINATED in reply, reply


def setup_models(con):
    store(con, "loop", "loop_forever")
    store(con, "lin", "linear", device="CPU")
    set_tensor(con, "lx", np.zeros(1, dtype=np.float32))
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    assert con.execute_command(*mexec("lin", ["x"], ["warm"])) == b"OK"
    return x


def onnx_args():
    return ["ONNX", ONNX_LIB] if ONNX_LIB else []


# =================================================================================================
# ONNX


@pytest.mark.module_args("MODEL_EXECUTION_TIMEOUT", "1000")
def test_runaway_run_is_terminated(server):
    """A never-ending run fails after about 1 s with the terminate error; PING is answered at once
    meanwhile; a linear request queued behind it on the same `CPU` queue is served right after; AI.INFO
    counts the error."""
    con = server.client()
    assert modules_info(server)["ai_model_execution_timeout"] == "1000"
    x = setup_models(con)
    loop = Request(server, "loop", *mexec("loop", ["lx"], ["ly"]), start=True)
    wait_for(lambda: "loop" in blocked_names(server), 5, what="the runaway request to block")
    time.sleep(0.2)
    # queued behind the runaway run on the same device queue
    behind = Request(server, "behind", *mexec("lin", ["x"], ["y_behind"]), start=True)
    latencies = []
    while loop.is_alive() and len(latencies) < 1000:
        t0 = time.monotonic()
        assert con.ping()
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)
    assert_terminated(loop.result(10))
    assert 0.9 <= loop.elapsed < 4.0, f"the runaway run ended after {loop.elapsed:.3f}s"
    assert len(latencies) >= 10 and max(latencies) < 0.5, (len(latencies), max(latencies))
    assert behind.result(10) == "OK"
    # served right after the kill, not after another timeout
    assert behind.elapsed < loop.elapsed + 1.0, (behind.elapsed, loop.elapsed)
    np.testing.assert_allclose(get_tensor(con, "y_behind"), weights.linear(x), rtol=1e-5, atol=1e-5)
    assert con.exists("ly") == 0
    # and the same queue keeps serving
    t0 = time.monotonic()
    assert con.execute_command(*mexec("lin", ["x"], ["y_after"])) == b"OK"
    assert time.monotonic() - t0 < 1.0
    np.testing.assert_allclose(get_tensor(con, "y_after"), weights.linear(x), rtol=1e-5, atol=1e-5)
    info = ai_info(con, "loop")
    assert (info["calls"], info["errors"]) == (1, 1)
    info = ai_info(con, "lin")
    assert (info["calls"], info["errors"]) == (3, 0)


@pytest.mark.module_args("MODEL_EXECUTION_TIMEOUT", "1000")
def test_runaway_run_inside_a_dag(server):
    """A DAG whose model op runs away: the op's entry is the terminate error, the ops after it are `NA`,
    the op before it `OK`, nothing is PERSISTed; AI.INFO counts the error (and the successful op)."""
    con = server.client()
    setup_models(con)
    t0 = time.monotonic()
    reply = server.raw("AI.DAGEXECUTE", "LOAD", 2, "x", "lx", "PERSIST", 1, "y",
                       "|>", *mexec("lin", ["x"], ["y"]),
                       "|>", *mexec("loop", ["lx"], ["ly"]),
                       "|>", "AI.TENSORGET", "ly", "VALUES")
    elapsed = time.monotonic() - t0
    assert isinstance(reply, list) and len(reply) == 3, reply
    assert reply[0] == "OK" and reply[2] == "NA", reply
    assert_terminated(reply[1])
    assert 0.9 <= elapsed < 4.0, f"the DAG took {elapsed:.3f}s"
    assert con.exists("y") == 0
    assert ai_info(con, "loop")["errors"] == 1
    assert ai_info(con, "loop")["calls"] == 1
    info = ai_info(con, "lin")
    assert (info["calls"], info["errors"]) == (2, 0)
    assert con.ping()


@pytest.mark.module_args("THREADS_PER_QUEUE", "2", "MODEL_EXECUTION_TIMEOUT", "1000")
def test_runaway_run_does_not_stop_the_other_worker(server):
    """THREADS_PER_QUEUE 2: while one worker is stuck in a runaway run, the other worker of the same queue
    serves linear requests one after the other (none of them is terminated); after the kill both workers
    serve; two runaway runs at once (one per worker) are both terminated."""
    con = server.client()
    x = setup_models(con)
    want = weights.linear(x)
    loop = Request(server, "loop", *mexec("loop", ["lx"], ["ly"]), start=True)
    wait_for(lambda: "loop" in blocked_names(server), 5, what="the runaway request to block")
    served = 0
    while loop.is_alive():
        t0 = time.monotonic()
        reply = server.raw(*mexec("lin", ["x"], ["y"]))
        dt = time.monotonic() - t0
        assert reply == "OK", reply
        assert dt < 0.5 or not loop.is_alive(), f"a linear run took {dt:.3f}s while the other worker was stuck"
        served += 1
        time.sleep(0.01)
    assert_terminated(loop.result(10))
    assert 0.9 <= loop.elapsed < 4.0, f"the runaway run ended after {loop.elapsed:.3f}s"
    assert served >= 10, served
    np.testing.assert_allclose(get_tensor(con, "y"), want, rtol=1e-5, atol=1e-5)
    for _ in range(6):
        assert server.raw(*mexec("lin", ["x"], ["y"])) == "OK"
    # two at once: one per worker
    loops = [Request(server, f"loop{i}", *mexec("loop", ["lx"], [f"ly{i}"]), start=True) for i in range(2)]
    for r in loops:
        assert_terminated(r.result(10))
        assert 0.9 <= r.elapsed < 5.0, f"{r.name_} ended after {r.elapsed:.3f}s"
    for _ in range(4):
        t0 = time.monotonic()
        assert server.raw(*mexec("lin", ["x"], ["y"])) == "OK"
        assert time.monotonic() - t0 < 1.0
    np.testing.assert_allclose(get_tensor(con, "y"), want, rtol=1e-5, atol=1e-5)
    info = ai_info(con, "loop")
    assert (info["calls"], info["errors"]) == (3, 3)
    info = ai_info(con, "lin")
    assert (info["calls"], info["errors"]) == (1 + served + 6 + 4, 0)


@pytest.mark.parametrize("value", ["999", "0", "500", "-1", "x"])
def test_execution_timeout_below_1000_is_refused(make_server, value):
    """MODEL_EXECUTION_TIMEOUT < 1000 (or not a number) makes MODULE LOAD fail; 1000 is accepted."""
    srv = make_server(load_module=False)
    con = srv.client()
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("MODULE", "LOAD", MODULE_PATH, *onnx_args(), "MODEL_EXECUTION_TIMEOUT", value)
    assert "ai" not in module_names(con.execute_command("MODULE", "LIST"))
    assert f"MODEL_EXECUTION_TIMEOUT {value}" in srv.log()
    assert con.execute_command("MODULE", "LOAD", MODULE_PATH, *onnx_args(), "MODEL_EXECUTION_TIMEOUT", "1000") == b"OK"
    assert modules_info(srv)["ai_model_execution_timeout"] == "1000"


def test_default_execution_timeout_is_5000(server):
    """Without MODEL_EXECUTION_TIMEOUT the limit is 5000 ms: INFO says so and a runaway run stops after 5 to
    8 s (the one slow test of this file), with PING answered meanwhile."""
    con = server.client()
    assert modules_info(server)["ai_model_execution_timeout"] == "5000"
    setup_models(con)
    loop = Request(server, "loop", *mexec("loop", ["lx"], ["ly"]), start=True)
    worst = 0.0
    while loop.is_alive():
        t0 = time.monotonic()
        assert con.ping()
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.05)
    assert_terminated(loop.result(10))
    assert 4.9 <= loop.elapsed < 8.0, f"the runaway run ended after {loop.elapsed:.3f}s"
    assert worst < 0.5, worst
    assert con.execute_command(*mexec("lin", ["x"], ["y"])) == b"OK"
    info = ai_info(con, "loop")
    assert (info["calls"], info["errors"]) == (1, 1)


# =================================================================================================
# TFLITE


def test_kill_switch_stops_a_long_loop_tflite(make_server):
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


def test_kill_switch_stops_a_tf_loop(make_server):
    """A TF `While` whose condition stays true fails after MODEL_EXECUTION_TIMEOUT (TensorFlow's own timeout, which
    reaches a run on its inter-op pool, where a graph that can loop runs), PING answers meanwhile, and the same
    model, and its queue, serve the next request."""
    srv = make_server(module_args=["MODEL_EXECUTION_TIMEOUT", "1000"], name="tf_kill_switch")
    con = srv.client()
    assert con.execute_command("AI.MODELSTORE", "w", "TF", "CPU", "INPUTS", 1, "go", "OUTPUTS", 1, "y",
                               "BLOB", while_go()) == b"OK"
    con.execute_command("AI.TENSORSET", "go", "BOOL", 1, "VALUES", 1)
    loop = Request(srv, "tf_loop", *mexec("w", ["go"], ["y"]), start=True)
    wait_for(lambda: "tf_loop" in blocked_names(srv), 5, what="the looping request to block")
    assert con.ping()
    reply = loop.result(10)
    assert isinstance(reply, RespError) and \
        "TF: the run was cancelled after MODEL_EXECUTION_TIMEOUT (1000 ms)" in reply, reply
    assert 0.9 <= loop.elapsed < 5.0, loop.elapsed
    con.execute_command("AI.TENSORSET", "go", "BOOL", 1, "VALUES", 0)
    assert model_execute(con, "w", ["go"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "VALUES") == [0]
    assert ai_info(con, "w")["errors"] == 1
