"""Short model runs inline on the main thread (exec/inline.rs): which runs qualify, and that replies, outputs,
replication, AI.INFO statistics and errors are those of a queued run. A run whose time suddenly grows is
stopped at the inline limit and finished on a worker, with the right result."""
import time

import numpy as np
import pytest
import redis

from helpers.onnx_models import (TWO_DEVICE_DAG, TWO_DEVICE_DAG_REPLY, blob, get_tensor, loop_model, modules_info,
                                 set_tensor, two_device_dag)


def runs(server):
    info = modules_info(server)
    return int(info["ai_inline_runs"]), int(info["ai_queued_runs"])


def execute(con, key="m", inputs=("a", "a"), out="c"):
    return con.execute_command("AI.MODELEXECUTE", key, "INPUTS", len(inputs), *inputs, "OUTPUTS", 1, out)

# A threshold of 1 ms in the tests that need runs to qualify: a loaded CI machine can take the tiny model past
# the default 100 µs now and then, and what is tested is which runs go inline, not the default.

SHORT = ("INLINE_THRESHOLD", "1000")


# The counts of inline and queued runs are this process's policy; isolated, a run not known to be short is also
# posted while no other posted run is in flight (test_isolation.py).
@pytest.mark.in_process
@pytest.mark.module_args(*SHORT)
def test_short_runs_go_inline_after_the_first_ones(server):
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(c, "a", np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    before = runs(server)
    for _ in range(10):
        assert execute(c) == b"OK"
    inline, queued = (a - b for a, b in zip(runs(server), before))
    assert queued >= 3 and inline >= 1 and inline + queued == 10, (inline, queued)
    np.testing.assert_array_equal(get_tensor(c, "c"), [[1.0, 4.0], [9.0, 16.0]])
    info = c.execute_command("AI.INFO", "m")
    fields = dict(zip(info[::2], info[1::2]))
    assert fields[b"calls"] == 10 and fields[b"errors"] == 0 and fields[b"samples"] == 20
    # Errors are the same: a wrong input type fails inline as on a worker.
    set_tensor(c, "i", np.array([[1, 2]], dtype=np.int32))
    with pytest.raises(redis.ResponseError) as e:
        execute(c, inputs=("i", "i"))
    assert "Unexpected input data type" in str(e.value)


@pytest.mark.module_args("INLINE_THRESHOLD", "0")
def test_threshold_zero_keeps_every_run_queued(server):
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(c, "a", np.full((2, 2), 3.0, dtype=np.float32))
    before = runs(server)
    for _ in range(10):
        assert execute(c) == b"OK"
    np.testing.assert_array_equal(get_tensor(c, "c"), np.full((2, 2), 9.0))
    assert tuple(a - b for a, b in zip(runs(server), before)) == (0, 10)
    assert c.execute_command("AI.CONFIG", "GET", "INLINE_THRESHOLD") == 0
    # Control: the default threshold, set at run time, lets the same runs go inline.
    assert c.execute_command("AI.CONFIG", "INLINE_THRESHOLD", 100) == b"OK"
    for _ in range(3):
        assert execute(c) == b"OK"
    assert runs(server)[0] >= 1
    np.testing.assert_array_equal(get_tensor(c, "c"), np.full((2, 2), 9.0))
    with pytest.raises(redis.ResponseError):
        c.execute_command("AI.CONFIG", "INLINE_THRESHOLD", -1)


@pytest.mark.module_args(*SHORT)
def test_batching_models_never_run_inline(server):
    """A model stored with BATCHSIZE is always queued (its runs are batched on a worker), even where the same model
    without BATCHSIZE, with the same inputs, runs inline."""
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BATCHSIZE", 4, "BLOB", blob("mul"))
    c.execute_command("AI.MODELSTORE", "plain", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(c, "a", np.array([[1.0, 2.0]], dtype=np.float32))
    before = runs(server)
    for _ in range(10):
        assert execute(c) == b"OK"
    np.testing.assert_array_equal(get_tensor(c, "c"), [[1.0, 4.0]])
    assert tuple(a - b for a, b in zip(runs(server), before)) == (0, 10)
    # Control: the same runs of the model without BATCHSIZE go inline after the first ones.
    before = runs(server)
    for _ in range(10):
        assert execute(c, "plain", out="p") == b"OK"
    np.testing.assert_array_equal(get_tensor(c, "p"), [[1.0, 4.0]])
    inline, queued = (a - b for a, b in zip(runs(server), before))
    assert inline >= 1 and inline + queued == 10, (inline, queued)


# The counts of inline and queued runs are this process's policy; isolated, a run not known to be short is also
# posted while no other posted run is in flight (test_isolation.py).
@pytest.mark.in_process
def test_a_run_that_suddenly_grows_finishes_on_a_worker(make_server, make_replica):
    master = make_server(module_args=list(SHORT))
    replica = make_replica(master)
    c = master.client()
    c.execute_command("AI.MODELSTORE", "loop", "ONNX", "CPU", "BLOB", loop_model())
    c.execute_command("AI.TENSORSET", "x", "FLOAT", 1, "VALUES", 0)
    c.execute_command("AI.TENSORSET", "n", "INT64", "VALUES", 1)
    for _ in range(30):  # the first runs are slow (ONNX Runtime warms up): enough short ones to forget them
        execute(c, "loop", ("n", "x"), "y")
    inline0, queued0 = runs(master)
    assert inline0 >= 1
    # 300,000 iterations take far longer than the inline limit: stopped there, run again on a worker.
    c.execute_command("AI.TENSORSET", "n", "INT64", "VALUES", 300000)
    assert execute(c, "loop", ("n", "x"), "y") == b"OK"
    assert get_tensor(c, "y").tolist() == [300000.0]
    inline1, queued1 = runs(master)
    assert (inline1, queued1) == (inline0, queued0 + 1)
    # The model is slow now: the next runs are queued from the start.
    execute(c, "loop", ("n", "x"), "y")
    assert runs(master) == (inline1, queued1 + 1)
    # The stopped run's error was ours to handle: ONNX Runtime did not log it to the server's output.
    assert "terminate flag" not in master.log()
    info = c.execute_command("AI.INFO", "loop")
    fields = dict(zip(info[::2], info[1::2]))
    assert fields[b"calls"] == 32 and fields[b"errors"] == 0
    # Outputs of inline and queued runs replicate alike.
    assert c.execute_command("WAIT", 1, 10000) == 1
    assert get_tensor(replica.client(), "y").tolist() == [300000.0]


def test_inside_multi_it_is_still_refused(con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(5):
        execute(con)
    p = con.pipeline(transaction=True)
    p.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    with pytest.raises(redis.ResponseError) as e:
        p.execute()
    assert "Cannot run RedisAI command within a transaction or a LUA script" in str(e.value)


def dag(con, *args):
    return con.execute_command("AI.DAGEXECUTE", *args)


def calls(con, key):
    info = con.execute_command("AI.INFO", key)
    return dict(zip(info[::2], info[1::2]))[b"calls"]


# The counts of inline and queued runs are this process's policy; isolated, a run not known to be short is also
# posted while no other posted run is in flight (test_isolation.py).
@pytest.mark.in_process
def test_a_dag_of_short_model_runs_goes_inline(make_server, make_replica):
    master = make_server(module_args=list(SHORT))
    replica = make_replica(master)
    c = master.client()
    two_device_dag(c)
    before = runs(master)
    # Enough runs for both models' averages to forget ONNX Runtime's slow first runs.
    replies = [dag(c, *TWO_DEVICE_DAG) for _ in range(30)]
    inline, queued = (a - b for a, b in zip(runs(master), before))
    assert queued >= 3 and inline >= 1 and inline + queued == 30, (inline, queued)
    # The same reply whether the DAG ran on the workers or inline.
    assert all(r == TWO_DEVICE_DAG_REPLY for r in replies), replies
    assert calls(c, "m") == 30 and calls(c, "m1") == 30
    np.testing.assert_array_equal(get_tensor(c, "d"), [[1.0, 8.0], [27.0, 64.0]])
    assert c.execute_command("WAIT", 1, 10000) == 1
    np.testing.assert_array_equal(get_tensor(replica.client(), "d"), [[1.0, 8.0], [27.0, 64.0]])
    # An error inline is the error of a queued run: the op fails, the ops after it are not run.
    set_tensor(c, "i", np.array([[1, 2]], dtype=np.int32))
    before = runs(master)
    reply = dag(c, "LOAD", 2, "a", "i", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b",
                "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "b", "i", "OUTPUTS", 1, "e", "|>",
                "AI.MODELEXECUTE", "m", "INPUTS", 2, "e", "e", "OUTPUTS", 1, "f")
    assert runs(master)[0] == before[0] + 1
    assert reply[0] == b"OK" and isinstance(reply[1], redis.ResponseError) and reply[2] == b"NA", reply
    assert "Unexpected input data type" in str(reply[1])


# The counts of inline and queued runs are this process's policy; isolated, a run not known to be short is also
# posted while no other posted run is in flight (test_isolation.py).
@pytest.mark.in_process
@pytest.mark.module_args(*SHORT)
def test_dags_that_do_not_qualify_are_queued(server):
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    c.execute_command("AI.MODELSTORE", "batched", "ONNX", "CPU", "BATCHSIZE", 4, "BLOB", blob("mul"))
    set_tensor(c, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(5):
        dag(c, "LOAD", 1, "a", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b")
    assert runs(server)[0] >= 1
    before = runs(server)
    # A batching model anywhere in the DAG keeps all of it on the workers.
    for _ in range(5):
        reply = dag(c, "LOAD", 1, "a", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b",
                    "|>", "AI.MODELEXECUTE", "batched", "INPUTS", 2, "b", "b", "OUTPUTS", 1, "d")
        assert reply == [b"OK", b"OK"]
    # An input bigger than the model has seen (twice its biggest) waits for a worker too.
    set_tensor(c, "big", np.ones((64, 64), dtype=np.float32))
    assert dag(c, "LOAD", 1, "big", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "big", "big", "OUTPUTS", 1,
               "b") == [b"OK"]
    assert runs(server) == (before[0], before[1] + 6)
    # Nothing to run: the DAG is answered at once and counted nowhere.
    assert dag(c, "LOAD", 1, "a", "|>", "AI.TENSORGET", "a", "META")[0][:2] == [b"dtype", b"FLOAT"]
    assert runs(server) == (before[0], before[1] + 6)


def test_a_dag_whose_second_op_grows_runs_again_on_a_worker_and_counts_once(make_server):
    s = make_server(module_args=list(SHORT))
    c = s.client()
    c.execute_command("AI.MODELSTORE", "first", "ONNX", "CPU", "BLOB", loop_model())
    c.execute_command("AI.MODELSTORE", "loop", "ONNX", "CPU", "BLOB", loop_model())
    c.execute_command("AI.TENSORSET", "x", "FLOAT", 1, "VALUES", 2)
    c.execute_command("AI.TENSORSET", "one", "INT64", "VALUES", 1)
    c.execute_command("AI.TENSORSET", "n", "INT64", "VALUES", 1)
    args = ("LOAD", 3, "one", "n", "x", "|>", "AI.MODELEXECUTE", "first", "INPUTS", 2, "one", "x", "OUTPUTS", 1,
            "x2", "|>", "AI.MODELEXECUTE", "loop", "INPUTS", 2, "n", "x2", "OUTPUTS", 1, "y", "|>",
            "AI.TENSORGET", "y", "VALUES")
    for _ in range(30):  # enough short runs to forget ONNX Runtime's slow first ones
        assert dag(c, *args)[2] == [b"4"]
    inline0, queued0 = runs(s)
    assert inline0 >= 1
    # The loop's 300,000 iterations pass the inline limit: the DAG is stopped there and run again on the
    # workers, from the start, and each model's statistics count this request once.
    c.execute_command("AI.TENSORSET", "n", "INT64", "VALUES", 300000)
    got = dag(c, *args)
    assert got[2] == [b"300003"], got
    assert runs(s) == (inline0, queued0 + 1)
    assert calls(c, "first") == 31 and calls(c, "loop") == 31


@pytest.mark.module_args(*SHORT)
def test_an_output_written_again_is_a_fresh_write(server):
    """Outputs overwrite a tensor key in place when they can (no delete and add): what a client sees is still
    a new write, inline or queued: the TTL goes as with SET, WATCH sees it, the old value's memory comes back."""
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(c, "a", np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    for _ in range(5):
        execute(c)
    assert runs(server)[0] >= 1, "the runs below are inline"
    c.expire("c", 1000)
    execute(c)
    assert c.ttl("c") == -1
    np.testing.assert_array_equal(get_tensor(c, "c"), [[1.0, 4.0], [9.0, 16.0]])
    # WATCH: a transaction over the output aborts once another client's run wrote it.
    other = server.client()
    p = c.pipeline(transaction=True)
    p.watch("c")
    p.multi()
    p.get("x")
    execute(other)
    with pytest.raises(redis.WatchError):
        p.execute()
    # Writing the same key many times keeps memory flat: every replaced value is freed.
    set_tensor(c, "big", np.ones((256, 256), dtype=np.float32))
    for _ in range(5):
        execute(c, inputs=("big", "big"))
    before = c.info("memory")["used_memory"]
    for _ in range(200):
        execute(c, inputs=("big", "big"))
    # (Big values are freed on a background thread: give it a moment.)
    deadline = time.monotonic() + 5
    while c.info("memory")["used_memory"] - before >= 256 * 256 * 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.info("memory")["used_memory"] - before < 256 * 256 * 4, "replaced outputs are freed"
    # Another type under the output name is still refused.
    c.set("s", "x")
    with pytest.raises(redis.ResponseError) as e:
        execute(c, out="s")
    assert "WRONGTYPE" in str(e.value)
