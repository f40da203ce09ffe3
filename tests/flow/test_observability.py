"""Where each request's time goes (docs/commands.md, "Observability"): AI.INFO's timings, batching and error
kinds after RedisAI's fields, INFO's per-queue and per-key figures, and long executions in LATENCY."""
import threading
import time

import numpy as np
import pytest
import redis

from helpers.onnx_models import OUR_INFO_FIELDS as OURS
from helpers.onnx_models import REDISAI_INFO_FIELDS as REDISAI
from helpers.onnx_models import loop_model, modules_sections, set_tensor, store

QUEUED = ("INLINE_THRESHOLD", "0")  # every run through the queue, so that queue waits are what is measured


def info(con, key):
    r = con.execute_command("AI.INFO", key)
    return {k.decode(): v for k, v in zip(r[::2], r[1::2])}


def loop_run(con, key="slow", n="n", out="y"):
    return con.execute_command("AI.MODELEXECUTE", key, "INPUTS", 2, n, "x", "OUTPUTS", 1, out)


def slow_model(con, target_s=0.03):
    """The loop model as `slow`, with `n` set so that one run takes about `target_s`; returns that time."""
    store_blob(con, "slow", loop_model())
    set_tensor(con, "x", np.zeros(1, dtype=np.float32))
    n = 20000
    while True:
        set_tensor(con, "n", np.array(n, dtype=np.int64))
        t0 = time.perf_counter()
        loop_run(con)
        took = time.perf_counter() - t0
        if took >= target_s or n >= 1 << 26:
            return took
        n = int(n * min(8.0, max(1.5, target_s / max(took, 1e-4))))


def store_blob(con, key, data, *opts):
    assert con.execute_command("AI.MODELSTORE", key, "ONNX", "CPU", *opts, "BLOB", data) == b"OK"


def queue_fields(server, dev="CPU"):
    fields = dict(dict(modules_sections(server))["ai_queues"])
    prefix = f"ai_queue_{dev}_"
    return {k[len(prefix):]: int(v) for k, v in fields.items() if k.startswith(prefix)}


def test_fields_follow_redisai_and_reset(con):
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(5):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    r = con.execute_command("AI.INFO", "m")
    assert tuple(k.decode() for k in r[::2]) == REDISAI + OURS
    f = info(con, "m")
    assert f["calls"] == 5 and f["executions"] == 5 and f["inline_runs"] + f["queued_runs"] == 5, f
    assert f["batch_size_p50"] == 1 and f["batch_size_p99"] == 1, f
    assert f["backend_us"] > 0 and f["total_us"] >= f["backend_us"] + f["copy_us"], f
    assert 0 < f["backend_p50_us"] <= f["backend_p99_us"] and f["total_p50_us"] <= f["total_p99_us"], f
    assert con.execute_command("AI.INFO", "m", "RESETSTAT") == b"OK"
    f = info(con, "m")
    assert all(f[k] == 0 for k in ("duration", "samples", "calls", "errors") + OURS), f


def test_scripts_have_the_same_fields(con):
    script = "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] + tensors[1]\n"
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE", script)
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(3):
        con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    f = info(con, "s")
    assert f["samples"] == -1 and f["calls"] == 3 and f["executions"] == 3 and f["queued_runs"] == 3, f
    assert f["backend_us"] > 0 and f["total_p99_us"] >= f["total_p50_us"] > 0, f


@pytest.mark.module_args(*QUEUED)
def test_queue_wait_rises_under_contention_and_backend_time_does_not(server):
    con = server.client()
    slow_model(con)
    for _ in range(8):
        loop_run(con)
    solo = info(con, "slow")
    assert solo["queued_runs"] >= 8 and solo["inline_runs"] == 0, solo
    con.execute_command("AI.INFO", "slow", "RESETSTAT")

    seen = {"busy": 0, "pending": 0}
    done = threading.Event()

    def client(i):
        c = server.client()
        for _ in range(6):
            loop_run(c, out=f"y{i}")

    def watch():
        while not done.is_set():
            q = queue_fields(server)
            seen["busy"] = max(seen["busy"], q["busy_workers"])
            seen["pending"] = max(seen["pending"], q["pending"])
            time.sleep(0.005)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    busy = info(con, "slow")
    assert busy["calls"] == 24 and busy["errors"] == 0, busy
    # Four clients, one worker: a request waits for about the runs of the others ahead of it.
    assert busy["queue_p50_us"] > max(10 * solo["queue_p50_us"], busy["backend_p50_us"] // 2), (solo, busy)
    assert busy["queue_us"] > busy["backend_us"] // 2, (solo, busy)
    # The run itself is no slower for waiting.
    assert solo["backend_p50_us"] / 2.5 <= busy["backend_p50_us"] <= solo["backend_p50_us"] * 2.5, (solo, busy)
    assert busy["total_p50_us"] >= busy["queue_p50_us"], busy
    assert seen["busy"] == 1 and seen["pending"] >= 1, seen
    # A worker counts itself idle just after the reply it completed is on its way.
    deadline = time.monotonic() + 5
    while (q := queue_fields(server))["busy_workers"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert q["busy_workers"] == 0 and q["pending"] == 0 and q["taken"] >= 32, q
    assert q["wait_p99_us"] >= q["wait_p50_us"] > 0, q


@pytest.mark.module_args(*QUEUED)
def test_batching_shows_fewer_executions_than_requests(server):
    con = server.client()
    store(con, "b", "mul", "BATCHSIZE", 4, "MINBATCHSIZE", 4, "MINBATCHTIMEOUT", 2000)
    set_tensor(con, "a", np.ones((1, 2), dtype=np.float32))
    for _ in range(3):
        replies = []
        threads = [threading.Thread(target=lambda i=i: replies.append(server.client().execute_command(
            "AI.MODELEXECUTE", "b", "INPUTS", 2, "a", "a", "OUTPUTS", 1, f"c{i}"))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert replies == [b"OK"] * 4
    f = info(con, "b")
    assert f["calls"] == 12 and f["executions"] < f["calls"], f
    assert f["batch_size_p99"] >= 2, f


@pytest.mark.module_args("MODEL_EXECUTION_TIMEOUT", "1000", *QUEUED)
def test_timeouts_are_counted_as_timeouts(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    took = slow_model(con, target_s=0.2)
    # A run whose TIMEOUT passes while it waits behind a slow one: TIMEDOUT, counted on the model that did not run.
    blocker = threading.Thread(target=lambda: loop_run(server.client(), out="yb"))
    blocker.start()
    time.sleep(took / 4)
    reply = con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c", "TIMEOUT", 20)
    blocker.join()
    assert reply == b"TIMEDOUT"
    f = info(con, "m")
    assert (f["errors_timeout"], f["errors_backend"], f["errors_refused"]) == (1, 0, 0), f
    # The kill switch stopping a run at MODEL_EXECUTION_TIMEOUT is a timeout too (the same text as before).
    set_tensor(con, "n", np.array(1 << 40, dtype=np.int64))
    with pytest.raises(redis.ResponseError):
        loop_run(con)
    f = info(con, "slow")
    assert (f["errors_timeout"], f["errors_backend"], f["errors"]) == (1, 0, 1), f


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "1")
def test_memory_bound_refusals_are_counted_as_refused(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "big", np.ones((600, 600), dtype=np.float32))
    set_tensor(con, "i", np.ones((2, 2), dtype=np.int32))
    with pytest.raises(redis.ResponseError, match="Onnxruntime memory limit exceeded"):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "big", "big", "OUTPUTS", 1, "c")
    with pytest.raises(redis.ResponseError):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "i", "i", "OUTPUTS", 1, "c")
    f = info(con, "m")
    assert (f["errors"], f["errors_refused"], f["errors_backend"], f["errors_timeout"]) == (2, 1, 1, 0), f


def test_long_executions_reach_the_latency_monitor(server):
    con = server.client()
    slow_model(con, target_s=0.05)
    con.config_set("latency-monitor-threshold", 10)
    time.sleep(1.1)  # the module reads the threshold again at most once a second
    loop_run(con)
    con.execute_command("AI.DAGEXECUTE", "LOAD", 2, "n", "x", "|>", "AI.MODELEXECUTE", "slow", "INPUTS", 2, "n", "x",
                        "OUTPUTS", 1, "y")
    events = {e[0] for e in con.execute_command("LATENCY", "LATEST")}
    assert {b"ai.modelexecute", b"ai.dagexecute"} <= events, events
    # Below the threshold: nothing.
    con.execute_command("LATENCY", "RESET")
    con.config_set("latency-monitor-threshold", 100000)
    time.sleep(1.1)  # the module reads the threshold again at most once a second
    loop_run(con)
    assert con.execute_command("LATENCY", "LATEST") == []
    # Off (0): nothing either, although Redis's own check would add every sample.
    con.config_set("latency-monitor-threshold", 0)
    time.sleep(1.1)
    loop_run(con)
    assert con.execute_command("LATENCY", "LATEST") == []


def test_info_lists_each_key_with_its_figures(server):
    con = server.client()
    store(con, "model:1", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    con.execute_command("AI.MODELEXECUTE", "model:1", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    raw = con.execute_command("INFO", "ai_keys")
    assert isinstance(raw, dict), raw
    line = raw["ai_model_model_1"]
    assert line["calls"] == 1 and line["executions"] == 1 and set(OURS) <= set(line), line


@pytest.mark.module_args("DETAILED_STATS", "no")
def test_detailed_stats_off_records_only_redisais_fields(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(3):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    f = info(con, "m")
    assert f["calls"] == 3 and all(f[k] == 0 for k in OURS), f
