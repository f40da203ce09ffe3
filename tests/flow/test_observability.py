"""What the module reports about itself (docs/commands.md, "AI.INFO", "INFO MODULES" and "Observability"): where each
request's time goes (AI.INFO's timings, batching and error kinds after RedisAI's fields, INFO's per-queue and per-key
figures, long executions in LATENCY), AI.INFO's RedisAI counters for models of every backend, scripts and DAG ops,
INFO MODULES (RedisAI's sections and fields, then ours; each backend's version), and the time of background runs in
SLOWLOG and commandstats."""
import re
import threading
import time

import numpy as np
import pytest
import redis

from helpers.checks import check_error, check_error_raw, wait_for
from helpers.dag import dag_cmd, is_error, tensorset_args
from helpers.data import DATA_DIR
from helpers.onnx_models import OUR_INFO_FIELDS as OURS
from helpers.onnx_models import REDISAI_INFO_FIELDS as REDISAI
from helpers.onnx_models import (AI_INFO_DETAIL_LEN, AI_INFO_LEN, FLOAT_FMT, ai_info, big_model, blob,
                                 check_common_sections, loop_model, mexec, model_execute, modules_sections, sessions, set_tensor, store)
from helpers.resp import raw_command
from helpers.server import REPO_ROOT
from helpers.tf_models import TF_VERSION, tf_store
from helpers.tflite_models import LITERT_VERSION, tfl_store
from helpers.torch_models import (MAIN_FNS, MAIN_SRC, OLD_SRC, TORCH_VERSION, entry, pt_store, script_execute,
                                  script_set, script_store)

QUEUED = ("INLINE_THRESHOLD", "0")  # every run through the queue, so that queue waits are what is measured


def info(con, key):
    r = con.execute_command("AI.INFO", key, "DETAIL")
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


# =================================================================================================
# where each request's time goes


def test_fields_follow_redisai_and_reset(con):
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(5):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    r = con.execute_command("AI.INFO", "m", "DETAIL")
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


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "100", "MODEL_EXECUTION_TIMEOUT", "1000")
def test_torch_errors_are_counted_by_kind(server):
    """The TORCH backend returns each failure's kind (torch_abi.rs): the memory bound counts as refused, the kill
    switch as a timeout, anything else as a backend error; the texts are the plain ones."""
    con = server.client()
    src = (entry("big", "return torch.ones(int(args[0]))")
           + entry("spin", "x = tensors[0]", "while True:", "    x = x + 1", "return x")
           + entry("bad", "return tensors[0].view(2, 2)"))  # 3 values
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 3, "big", "spin", "bad", "SOURCE", src)
    set_tensor(con, "a", np.ones(3, dtype=np.float32))
    run = lambda fn: con.execute_command("AI.SCRIPTEXECUTE", "s", fn, "INPUTS", 1, "a", "ARGS", 1, 300_000_000,  # noqa
                                         "OUTPUTS", 1, "y")
    with pytest.raises(redis.ResponseError, match="^TORCH memory limit exceeded, memory allocation failed.$"):
        run("big")
    with pytest.raises(redis.ResponseError, match=r"^TORCH: the run was cancelled after MODEL_EXECUTION_TIMEOUT"):
        run("spin")
    with pytest.raises(redis.ResponseError):
        run("bad")
    f = info(con, "s")
    assert (f["errors"], f["errors_refused"], f["errors_timeout"], f["errors_backend"]) == (3, 1, 1, 1), f
    # A model the kill switch stops inside a script's redisAI.model_execute: a timeout for both, in plain words.
    pt_store(con, "slow", "torch_slow")
    set_tensor(con, "x", np.random.default_rng(1).random((2048, 2048), dtype=np.float32))
    con.execute_command("AI.SCRIPTSTORE", "n", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        entry("f", "return redisAI.model_execute(keys[0], [tensors[0]], 1)[0]"))
    with pytest.raises(redis.ResponseError, match=r"^TORCH: the run was cancelled after MODEL_EXECUTION_TIMEOUT "
                                                  r"\(1000 ms\)$"):
        con.execute_command("AI.SCRIPTEXECUTE", "n", "f", "KEYS", 1, "slow", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    for key in ("n", "slow"):
        f = info(con, key)
        assert (f["errors"], f["errors_timeout"]) == (1, 1), (key, f)


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


def test_exporter_script_returns_every_numeric_field(server):
    """scripts/redis_exporter_ai.lua, as redis_exporter's --script runs it (EVAL, no keys): flat name/value pairs,
    one per numeric field of the module's INFO sections, a key's k=v list split into one name per figure."""
    con = server.client()
    store(con, "model:1", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(3):
        con.execute_command("AI.MODELEXECUTE", "model:1", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    script = (REPO_ROOT / "scripts" / "redis_exporter_ai.lua").read_text()
    reply = con.eval(script, 0)
    pairs = dict(zip([k.decode() for k in reply[::2]], [float(v) for v in reply[1::2]]))
    assert len(pairs) * 2 == len(reply)
    assert pairs["ai_model_model_1_calls"] == 3 and pairs["ai_model_model_1_executions"] == 3, pairs
    assert pairs["ai_model_model_1_total_p99_us"] >= pairs["ai_model_model_1_total_p50_us"] > 0
    assert "ai_queue_CPU_wait_p99_us" in pairs and "ai_queue_CPU_pending" in pairs, sorted(pairs)
    # every numeric field of the sections is there (and nothing else)
    info = con.execute_command("INFO", "modules")
    numeric = {k for k, v in info.items() if k.startswith("ai_") and isinstance(v, (int, float))}
    assert numeric <= set(pairs), numeric - set(pairs)


@pytest.mark.module_args("DETAILED_STATS", "no")
def test_detailed_stats_off_records_only_redisais_fields(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    for _ in range(3):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    f = info(con, "m")
    assert f["calls"] == 3 and all(f[k] == 0 for k in OURS), f


# =================================================================================================
# AI.INFO


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


# A model's AI.INFO before any run (and after RESETSTAT): exactly RedisAI's fields; with DETAIL, then ours, all zero.
FRESH_INFO = [b"key", b"m", b"type", b"MODEL", b"backend", b"ONNX", b"device", b"CPU", b"tag", b"v1",
              b"duration", 0, b"samples", 0, b"calls", 0, b"errors", 0]
FRESH_INFO_DETAIL = FRESH_INFO + [x for f in OURS for x in (f.encode(), 0)]


def test_ai_info_default_reply_is_redisai_s(con, port):
    """By default the reply is RedisAI's nine pairs and nothing else, field by field (RedisAI's own
    test_tensorflow_modelinfo compares the whole reply), after runs as before them; our figures only with DETAIL."""
    store(con, "m", "linear", "TAG", "v1")
    set_tensor(con, "x", np.ones((2, 4), dtype=np.float32))
    model_execute(con, "m", ["x"], ["y"])
    reply = con.execute_command("AI.INFO", "m")
    assert len(reply) == AI_INFO_LEN == 18, reply
    assert reply[:10] == [b"key", b"m", b"type", b"MODEL", b"backend", b"ONNX", b"device", b"CPU", b"tag", b"v1"]
    assert reply[10] == b"duration" and isinstance(reply[11], int) and reply[11] > 0, reply
    assert reply[12:] == [b"samples", 2, b"calls", 1, b"errors", 0], reply
    # the same over RESP as sent, for a client that reads the raw reply
    raw = raw_command(port, "AI.INFO", "m")
    assert len(raw) == 18 and [f.decode() if isinstance(f, bytes) else f for f in raw[::2]] == list(REDISAI), raw
    detail = con.execute_command("AI.INFO", "m", "DETAIL")
    assert len(detail) == AI_INFO_DETAIL_LEN and tuple(k.decode() for k in detail[::2]) == REDISAI + OURS, detail
    assert detail[:10] == reply[:10] and detail[12:18] == reply[12:18]
    assert con.execute_command("AI.INFO", "m", "detail")[::2] == detail[::2], "DETAIL in any case"
    f = info(con, "m")
    assert (f["calls"], f["executions"]) == (1, 1), f


def test_ai_info(con, port):
    store(con, "m", "linear", "TAG", "v1")
    assert con.execute_command("AI.INFO", "m") == FRESH_INFO
    assert con.execute_command("AI.INFO", "m", "DETAIL") == FRESH_INFO_DETAIL
    for batch in (1, 5, 3):
        set_tensor(con, "x", np.ones((batch, 4), dtype=np.float32))
        model_execute(con, "m", ["x"], ["y"])
    info = ai_info(con, "m")
    assert (info["samples"], info["calls"], info["errors"]) == (9, 3, 0)
    assert isinstance(info["duration"], int) and info["duration"] > 0
    # duration is in microseconds: three tiny runs take far less than a second
    assert info["duration"] < 1_000_000
    # an error counts as a call and an error
    set_tensor(con, "bad", np.ones((2, 7), dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError):
        model_execute(con, "m", ["bad"], ["y"])
    info2 = ai_info(con, "m")
    assert (info2["samples"], info2["calls"], info2["errors"]) == (9, 4, 1)
    assert info2["duration"] >= info["duration"]
    # RESETSTAT
    assert raw_command(port, "AI.INFO", "m", "RESETSTAT") == "OK"
    assert con.execute_command("AI.INFO", "m") == FRESH_INFO
    assert con.execute_command("AI.INFO", "m", "DETAIL") == FRESH_INFO_DETAIL
    assert con.execute_command("AI.INFO", "m", "resetstat") == b"OK"
    # any other third argument is ignored, as RedisAI did
    assert len(con.execute_command("AI.INFO", "m", "whatever")) == AI_INFO_LEN
    # two outputs: samples = dim 0 of the first output
    store(con, "t", "two_outputs")
    set_tensor(con, "x2", np.ones((6, 2), dtype=np.float32))
    model_execute(con, "t", ["x2"], ["p", "q"])
    assert ai_info(con, "t")["samples"] == 6


def test_ai_info_errors(con, port):
    check_error_raw(port, arity("AI.INFO"), "AI.INFO")
    check_error_raw(port, arity("AI.INFO"), "AI.INFO", "m", "RESETSTAT", "x")
    check_error_raw(port, arity("AI.INFO"), "AI.INFO", "m", "DETAIL", "x")
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "nokey", "DETAIL")
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "nokey")
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "nokey", "RESETSTAT")
    set_tensor(con, "t", np.ones(1, dtype=np.float32))
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "t")


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


def test_ai_info_script(con, port):
    script_store(con, "s", MAIN_SRC, MAIN_FNS, tag="v1", device="CPU:1")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    assert script_execute(con, "s", "bar", inputs=["a", "a"], outputs=["c"]) == b"OK"
    assert script_execute(con, "s", "pair", inputs=["a"], outputs=["p", "q"]) == b"OK"
    with pytest.raises(redis.exceptions.ResponseError):
        script_execute(con, "s", "nope", inputs=["a"], outputs=["c"])
    reply = con.execute_command("AI.INFO", "s")
    assert len(reply) == AI_INFO_LEN
    assert reply[:10] == [b"key", b"s", b"type", b"SCRIPT", b"backend", b"TORCH", b"device", b"CPU:1", b"tag", b"v1"]
    assert reply[10] == b"duration" and reply[11] > 0
    assert reply[12:18] == [b"samples", -1, b"calls", 3, b"errors", 1]
    assert con.execute_command("AI.INFO", "s", "RESETSTAT") == b"OK"
    assert con.execute_command("AI.INFO", "s")[10:18] == [b"duration", 0, b"samples", -1, b"calls", 0, b"errors", 0]
    # the deprecated commands count too
    script_set(con, "old", OLD_SRC, tag="o")
    assert con.execute_command("AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "c") == b"OK"
    info = ai_info(con, "old")
    assert (info["type"], info["backend"], info["tag"], info["samples"], info["calls"]) == (
        b"SCRIPT", b"TORCH", b"o", -1, 1), info
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "nokey")


def test_dag_ai_info_stats(con):
    store(con, "lin", "linear")
    store(con, "lin1", "linear", device="CPU:1")
    x5 = np.ones((5, 4), dtype=np.float32)
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["ROUTING", "x"], [
        tensorset_args("x", x5), mexec("lin", ["x"], ["a"]), mexec("lin", ["x"], ["b"]),
        mexec("lin1", ["x"], ["c"]), ["AI.TENSORSET", "one", "FLOAT", 1, 4], mexec("lin", ["one"], ["d"])]))
    assert ret == [b"OK"] * 6
    info = ai_info(con, "lin")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 11, 0), info
    assert info["duration"] > 0
    info = ai_info(con, "lin1")
    assert (info["calls"], info["samples"], info["errors"]) == (1, 5, 0), info
    assert (info["key"], info["type"], info["backend"], info["device"]) == (b"lin1", b"MODEL", b"ONNX", b"CPU:1")
    # a failing op counts a call and an error; the op after it, never run, counts nothing
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["ROUTING", "x"], [
        ["AI.TENSORSET", "i", "INT32", 1, 4], mexec("lin", ["i"], ["a"]), mexec("lin1", ["a"], ["b"])]))
    assert ret[0] == b"OK" and is_error(ret[1]) and ret[2] == b"NA"
    info = ai_info(con, "lin")
    assert (info["calls"], info["samples"], info["errors"]) == (4, 11, 1), info
    info = ai_info(con, "lin1")
    assert (info["calls"], info["samples"], info["errors"]) == (1, 5, 0), info
    # parse-time errors count nothing
    check_error(con, "INPUT key cannot be found in DAG",
                *dag_cmd("AI.DAGEXECUTE", ["ROUTING", "x"], [mexec("lin", ["nope"], ["a"])]))
    assert ai_info(con, "lin")["calls"] == 4


# =================================================================================================
# time spent on the workers in SLOWLOG and commandstats


@pytest.mark.server_args("--slowlog-log-slower-than", "5000")
def test_background_time_in_slowlog_and_commandstats(server):
    """The time spent on the background thread counts for SLOWLOG and commandstats (Redis >= 6.2), as RedisAI's
    blocked clients' time did."""
    con = server.client()
    store(con, "h", "heavy")
    set_tensor(con, "hx", np.ones((4096, 256), dtype=np.float32))
    con.execute_command("CONFIG", "RESETSTAT")
    con.execute_command("SLOWLOG", "RESET")
    t0 = time.monotonic()
    assert model_execute(con, "h", ["hx"], ["hy"]) == b"OK"
    elapsed_us = (time.monotonic() - t0) * 1e6
    run_us = ai_info(con, "h")["duration"]
    assert run_us >= 5000, f"the run itself took only {run_us} us; the test needs a slower run"
    entries = raw_command(server.port, "SLOWLOG", "GET", 10)
    mine = [e for e in entries if e[3][0].upper() == b"AI.MODELEXECUTE"]
    assert mine, entries
    # The upper bound is a sanity check only: Redis 7.0's own accounting has been seen to exceed the client's
    # round trip by ~2% (81.9 vs 80.1 ms), so allow 5% + 2 ms.
    assert run_us * 0.5 <= mine[0][2] <= elapsed_us * 1.05 + 2000, (mine[0][2], run_us, elapsed_us)
    stats = server.info("commandstats")
    usec = int(dict(kv.split("=") for kv in stats["cmdstat_ai.modelexecute"].split(","))["usec"])
    assert usec >= run_us * 0.5, (usec, run_us)


# =================================================================================================
# INFO MODULES


def test_info_modules_at_start(server):
    """Right after start (ONNX named at load time, nothing stored or run yet)."""
    check_common_sections(server)
    for section in ("everything", "all", "modules", "ai_cpu", "ai_backends_info"):
        assert isinstance(server.raw("INFO", section), bytes)
    assert isinstance(server.raw("INFO"), bytes)
    con = server.client()
    assert con.ping()


def test_info_modules_after_model(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.ones((1, 1), dtype=np.float32))
    model_execute(con, "m", ["a", "a"], ["c"])
    fields = check_common_sections(server)
    backends = dict(fields["ai_backends_info"])
    assert backends["ai_onnxruntime_version"] == "1.31.1"
    assert backends["ai_onnxruntime_maximum_run_sessions_number"] == "1"
    store(con, "m1", "mul", device="CPU:1")
    model_execute(con, "m1", ["a", "a"], ["c"])
    assert sessions(server) == 2
    assert isinstance(server.raw("INFO", "everything"), bytes)


def test_info_onnx_memory_counters(server):
    """ai_backends_info of ONNX has ai_onnxruntime_memory and ai_onnxruntime_memory_access_num (the counting
    allocator's bytes held, and its allocations plus frees; docs/commands.md, "INFO MODULES"), between the version and the
    sessions number, and they count: a stored model holds its weights, a run allocates and frees."""
    con = server.client()
    store(con, "m", "linear")
    set_tensor(con, "x", np.ones((4, 4), dtype=np.float32))
    model_execute(con, "m", ["x"], ["y"])
    backends = dict(modules_sections(server))["ai_backends_info"]
    keys = [k for k, _ in backends]
    assert keys == ["ai_onnxruntime_version", "ai_onnxruntime_memory", "ai_onnxruntime_memory_access_num",
                    "ai_onnxruntime_maximum_run_sessions_number"], keys
    d = dict(backends)
    # linear.onnx's initializers, W [4, 3] and B [3] FLOAT, are held through the allocator while the model is stored
    assert int(d["ai_onnxruntime_memory"]) >= (4 * 3 + 3) * 4, d
    accesses = int(d["ai_onnxruntime_memory_access_num"])
    assert accesses > 0, d
    model_execute(con, "m", ["x"], ["y"])
    d = dict(dict(modules_sections(server))["ai_backends_info"])
    assert int(d["ai_onnxruntime_memory_access_num"]) > accesses, d
    # a model with initializers: its weights go through the counting allocator (and Redis's used_memory)
    before = int(d["ai_onnxruntime_memory"])
    blob_, _, _ = big_model(n=256)
    assert con.execute_command("AI.MODELSTORE", "big", "ONNX", "CPU", "BLOB", blob_) == b"OK"
    held = int(dict(dict(modules_sections(server))["ai_backends_info"])["ai_onnxruntime_memory"])
    assert held - before >= 256 * 256 * 4, (before, held)
    con.delete("big")
    # and gives them back with the model (the counter returns to what it was: `<=`, it held exactly the weights)
    wait_for(lambda: int(dict(dict(modules_sections(server))["ai_backends_info"])["ai_onnxruntime_memory"])
             <= held - 256 * 256 * 4)


@pytest.mark.module_args("THREADS_PER_QUEUE", "2")
def test_info_cpu_per_worker_thread(server):
    """ai_cpu has ai_queue_<DEVICE>_bthread_n<i>_used_cpu_total for every worker thread (as RedisAI's)."""
    con = server.client()
    store(con, "m", "mul")
    store(con, "m1", "mul", device="CPU:1")
    set_tensor(con, "a", np.ones((1, 1), dtype=np.float32))
    model_execute(con, "m", ["a", "a"], ["c"])
    model_execute(con, "m1", ["a", "a"], ["c"])
    cpu = dict(dict(modules_sections(server))["ai_cpu"])
    per_thread = {k: v for k, v in cpu.items() if re.match(r"ai_queue_.+_bthread_n\d+_used_cpu_total$", k)}
    cpu0 = [k for k in per_thread if k.upper().startswith("AI_QUEUE_CPU_BTHREAD")]
    # the device's ':' becomes '_' so that INFO's `name:value` lines stay parseable
    cpu1 = [k for k in per_thread if k.upper().startswith("AI_QUEUE_CPU_1_BTHREAD")]
    assert len(cpu0) == 2 and len(cpu1) == 2, sorted(cpu)
    for v in per_thread.values():
        assert FLOAT_FMT.match(v), v


def test_info_modules_fields_are_redisais(shared_server, con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(con, "a", np.array([[1.0]], dtype=np.float32))
    con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    sections = {name: dict(fields) for name, fields in modules_sections(shared_server) if name.startswith("ai_")}
    names = list(sections)
    assert names[:5] == ["ai_versions", "ai_git", "ai_load_time_configs", "ai_backends_info", "ai_cpu"], names
    assert list(sections["ai_versions"]) == ["ai_RedisAI_version", "ai_low_level_API_version", "ai_rdb_version"]
    assert list(sections["ai_git"]) == ["ai_git_sha"]
    assert list(sections["ai_load_time_configs"]) == [
        "ai_threads_per_queue", "ai_inter_op_parallelism", "ai_intra_op_parallelism", "ai_model_execution_timeout",
        "ai_backend_memory_limit"]
    cpu = sections["ai_cpu"]
    for f in ("ai_self_used_cpu_sys", "ai_self_used_cpu_user", "ai_children_used_cpu_sys",
              "ai_children_used_cpu_user", "ai_queue_CPU_bthread_n1_used_cpu_total"):
        assert f in cpu, (f, list(cpu))
    assert list(sections["ai_redisai_rs"]) == ["ai_redisai_rs_version", "ai_backend_memory_bound", "ai_inline_runs",
                                               "ai_queued_runs", "ai_models_pending_build",
                                               "ai_models_failed_build", "ai_tflite_memory",
                                               "ai_tflite_memory_refusals"]
    # Ours after it: per device queue, then a line per model and script (docs/commands.md, "Observability").
    assert names[5:] == ["ai_redisai_rs", "ai_workers", "ai_queues", "ai_keys"], names
    assert {"ai_queue_CPU_pending", "ai_queue_CPU_busy_workers", "ai_queue_CPU_wait_p99_us"} <= set(sections["ai_queues"])
    assert "ai_model_m" in sections["ai_keys"], sections["ai_keys"]


def test_info_modules_version_tflite(server):
    con = server.client()
    backends = dict(dict(modules_sections(server)).get("ai_backends_info", []))
    assert "ai_TensorFlowLite_version" not in backends, backends  # loaded at first use
    tfl_store(con, "m", "int")
    backends = dict(dict(modules_sections(server))["ai_backends_info"])
    assert backends["ai_TensorFlowLite_version"] == f"LiteRT {LITERT_VERSION}", backends


def test_info_modules_backends_tf(server):
    con = server.client()
    tf_store(con, "t", "mul")
    backends = dict(modules_sections(server))["ai_backends_info"]
    assert ("ai_TensorFlow_version", TF_VERSION) in backends, backends
    # with ONNX Runtime loaded too, TensorFlow comes first (RedisAI's order: TF, TFLITE, TORCH, ONNX)
    store(con, "o", "mul")
    set_tensor(con, "a", np.ones((1, 1), dtype=np.float32))
    assert model_execute(con, "o", ["a", "a"], ["c"]) == b"OK"
    assert model_execute(con, "t", ["a", "a"], ["c2"]) == b"OK"
    keys = [k for k, _ in dict(modules_sections(server))["ai_backends_info"]]
    assert "ai_TensorFlow_version" in keys and "ai_onnxruntime_version" in keys, keys
    assert keys.index("ai_TensorFlow_version") < keys.index("ai_onnxruntime_version"), keys
    assert keys[0] == "ai_TensorFlow_version", keys


def test_info_modules_backends_torch(server):
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
