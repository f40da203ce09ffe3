"""How runs are executed (docs/design.md, "The path of a request"): many clients at once (ONNX, TF, TFLITE, TORCH
models and scripts: every client gets its own result), blocked clients that go away, shutdown while busy, device
queues and THREADS_PER_QUEUE, the main thread staying responsive while a model is built, two devices of one DAG
running at once, and idle workers that do not burn CPU."""

import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.checks import wait_for
from helpers.dag import dag_cmd, from_meta_blob, heavy_batch, tset
from helpers.data import weights
from helpers.onnx_models import (ai_info, big_model, blob, concurrent_executes, get_tensor, mexec, model_execute,
                                 modules_info, proc_cpu_seconds, sessions, set_tensor, store)
from helpers.resp import RawClient, raw_command
from helpers.tf_models import assert_close, tf_store
from helpers.tflite_models import ab, tfl_store
from helpers.torch_models import MAIN_FNS, MAIN_SRC, pt_store, script_execute, script_store


def crash_signs(server):
    log = server.log()
    return [s for s in ("BUG REPORT", "panicked", "Guru Meditation", "Segmentation fault") if s in log]


# =================================================================================================
# many clients at once


def test_concurrent_clients(server):
    """16 clients x 50 MODELEXECUTE on `linear`, each with its own inputs and outputs: every result is the
    one a lone run of the same input gives (byte for byte), and matches numpy."""
    con = server.client()
    store(con, "m", "linear")
    n_threads, n_iter = 16, 50
    inputs = {}
    for t in range(n_threads):
        for i in range(n_iter):
            rng = np.random.default_rng(1000 * t + i)
            inputs[t, i] = (rng.standard_normal(((i % 3) + 1, 4)) * (t + 1)).astype(np.float32)
    # reference: the same inputs, one at a time
    reference = {}
    for (t, i), x in inputs.items():
        set_tensor(con, "rx", x)
        model_execute(con, "m", ["rx"], ["ry"])
        reference[t, i] = con.execute_command("AI.TENSORGET", "ry", "BLOB")
    con.execute_command("AI.INFO", "m", "RESETSTAT")

    errors, results = [], {}

    def worker(t):
        try:
            c = server.client()
            for i in range(n_iter):
                x = inputs[t, i]
                set_tensor(c, f"x:{t}", x)
                assert model_execute(c, "m", [f"x:{t}"], [f"y:{t}:{i}"]) == b"OK"
                results[t, i] = c.execute_command("AI.TENSORGET", f"y:{t}:{i}", "META", "BLOB")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:5]
    assert len(results) == n_threads * n_iter
    for (t, i), reply in results.items():
        x = inputs[t, i]
        assert reply[:4] == [b"dtype", b"FLOAT", b"shape", [x.shape[0], 3]], (t, i)
        assert reply[5] == reference[t, i], f"client {t} iteration {i}: result differs from a lone run"
        np.testing.assert_allclose(np.frombuffer(reply[5], dtype=np.float32).reshape(-1, 3), weights.linear(x),
                                   rtol=1e-5, atol=1e-5)
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"]) == (n_threads * n_iter, 0)
    assert info["samples"] == sum(x.shape[0] for x in inputs.values())


def test_concurrent_stores_and_runs(server):
    """Clients storing models while others execute: no client is blocked by another's store."""
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[2.0, 3.0]], dtype=np.float32))
    errors = []

    def storer(k):
        try:
            c = server.client()
            for j in range(10):
                store(c, f"s:{k}", "heavy" if j % 2 else "linear", "TAG", str(j))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def runner(k):
        try:
            c = server.client()
            for j in range(30):
                assert model_execute(c, "m", ["a", "a"], [f"c:{k}"]) == b"OK"
                assert c.execute_command("AI.TENSORGET", f"c:{k}", "VALUES") == [b"4", b"9"]
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=storer, args=(k,)) for k in range(3)]
    threads += [threading.Thread(target=runner, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:5]
    for k in range(3):
        assert con.execute_command("AI.MODELGET", f"s:{k}", "META")[5] == b"9"
        assert con.execute_command("AI.MODELGET", f"s:{k}", "BLOB") == blob("heavy")
    assert ai_info(con, "m")["calls"] == 4 * 30


# =================================================================================================
# clients that disconnect while blocked


def test_client_disconnect_while_blocked(server):
    con = server.client()
    store(con, "h", "heavy")
    x = np.random.default_rng(0).standard_normal((2048, 256)).astype(np.float32)
    set_tensor(con, "hx", x)
    for i in range(5):
        c = RawClient(server.port)
        c.send("AI.MODELEXECUTE", "h", "INPUTS", 1, "hx", "OUTPUTS", 1, f"gone:{i}")
        c.close()
    # several pipelined requests, then gone
    c = RawClient(server.port)
    for i in range(3):
        c.send("AI.MODELEXECUTE", "h", "INPUTS", 1, "hx", "OUTPUTS", 1, f"piped:{i}")
    c.close()
    # a store whose client goes away
    c = RawClient(server.port)
    c.send("AI.MODELSTORE", "stored", "ONNX", "CPU", "TAG", "t", "BLOB", blob("heavy"))
    c.close()
    assert con.ping()
    # the queue still works (this request waits behind the abandoned ones)
    set_tensor(con, "small", x[:3])
    assert model_execute(con, "h", ["small"], ["out"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "out"), weights.heavy(x[:3]), rtol=1e-4, atol=1e-5)
    # outputs of abandoned requests may or may not exist; if they do they are right
    expected = None
    for k in [f"gone:{i}" for i in range(5)] + [f"piped:{i}" for i in range(3)]:
        if con.exists(k):
            if expected is None:
                expected = weights.heavy(x)
            np.testing.assert_allclose(get_tensor(con, k), expected, rtol=1e-4, atol=1e-5)
    wait_for(lambda: ai_info(con, "h")["calls"] >= 1, 10, what="runs to finish")
    if con.exists("stored"):
        assert con.execute_command("AI.MODELGET", "stored", "META")[5] == b"t"
        assert con.execute_command("AI.MODELGET", "stored", "BLOB") == blob("heavy")
    assert not crash_signs(server)
    assert con.ping()


def test_shutdown_while_busy(make_server):
    """SIGTERM while runs are queued and a model is being built: a clean exit, no crash report."""
    srv = make_server()
    con = srv.client()
    store(con, "h", "heavy")
    set_tensor(con, "hx", np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32))
    clients = []
    for i in range(4):
        c = RawClient(srv.port)
        c.send("AI.MODELEXECUTE", "h", "INPUTS", 1, "hx", "OUTPUTS", 1, f"y{i}")
        clients.append(c)
    c = RawClient(srv.port)
    c.send("AI.MODELSTORE", "h2", "ONNX", "CPU:1", "BLOB", blob("heavy"))
    clients.append(c)
    time.sleep(0.05)
    code = srv.stop()
    for c in clients:
        c.close()
    assert code == 0, f"exit code {code}"
    assert not crash_signs(srv), srv.log_tail(60)


# =================================================================================================
# device queues and THREADS_PER_QUEUE


@pytest.mark.module_args("THREADS_PER_QUEUE", "4")
def test_threads_per_queue(server):
    con = server.client()
    assert modules_info(server)["ai_threads_per_queue"] == "4"
    store(con, "h0", "heavy", device="CPU")
    assert sessions(server) == 4  # the queue (and its workers) is created by the store
    store(con, "h1", "heavy", device="CPU:1")
    assert sessions(server) == 8
    rng = np.random.default_rng(9)
    xs = {i: rng.standard_normal((8 + i, 256)).astype(np.float32) for i in range(16)}
    for i, x in xs.items():
        set_tensor(con, f"x{i}", x)
    model_execute(con, "h0", ["x0"], ["warm0"])
    model_execute(con, "h1", ["x0"], ["warm1"])
    assert sessions(server) == 8
    # device strings are case-insensitive for queues: no new queue
    store(con, "l0", "linear", device="cpu")
    store(con, "l1", "linear", device="Cpu:1")
    set_tensor(con, "lx", np.ones((1, 4), dtype=np.float32))
    model_execute(con, "l0", ["lx"], ["ly0"])
    model_execute(con, "l1", ["lx"], ["ly1"])
    assert sessions(server) == 8
    errors = []

    def worker(i):
        try:
            c = server.client()
            for j in range(5):
                model = ("h0", "h1")[(i + j) % 2]
                assert model_execute(c, model, [f"x{i}"], [f"y{i}:{j}"]) == b"OK"
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:5]
    for i, x in xs.items():
        want = weights.heavy(x)
        for j in range(5):
            np.testing.assert_allclose(get_tensor(con, f"y{i}:{j}"), want, rtol=1e-4, atol=1e-5)
    assert ai_info(con, "h0")["calls"] + ai_info(con, "h1")["calls"] == 82
    assert sessions(server) == 8
    assert modules_info(server)["ai_threads_per_queue"] == "4"


def test_device_queues_are_independent(server):
    """A request on CPU:1 does not wait behind work queued on CPU (and one on CPU does)."""
    con = server.client()
    store(con, "h", "heavy", device="CPU")
    store(con, "l_cpu", "linear", device="CPU")
    store(con, "l_cpu1", "linear", device="CPU:1")
    set_tensor(con, "hx", np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32))
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    set_tensor(con, "x", x)
    model_execute(con, "l_cpu", ["x"], ["warm"])
    model_execute(con, "l_cpu1", ["x"], ["warm"])
    t0 = time.monotonic()
    model_execute(con, "h", ["hx"], ["warm"])
    one_run = time.monotonic() - t0
    n = min(60, max(3, math.ceil(1.5 / max(one_run, 1e-3)) + 1))  # at least ~1.5 s of work queued on CPU
    clients = []
    for i in range(n):
        c = RawClient(server.port)
        c.send("AI.MODELEXECUTE", "h", "INPUTS", 1, "hx", "OUTPUTS", 1, f"hy{i}")
        clients.append(c)
    time.sleep(0.05)
    other = raw_command(server.port, "AI.MODELEXECUTE", "l_cpu1", "INPUTS", 1, "x", "OUTPUTS", 1, "y1", "TIMEOUT", 500)
    same = raw_command(server.port, "AI.MODELEXECUTE", "l_cpu", "INPUTS", 1, "x", "OUTPUTS", 1, "y0", "TIMEOUT", 500)
    replies = [c.reply() for c in clients]
    for c in clients:
        c.close()
    assert other == "OK"
    assert same == "TIMEDOUT"
    assert replies == ["OK"] * n
    np.testing.assert_allclose(get_tensor(con, "y1"), weights.linear(x), rtol=1e-6)
    assert con.exists("y0") == 0


@pytest.mark.module_args("THREADS_PER_QUEUE", "3")
def test_modelstore_creates_device_queue(server):
    """MODELSTORE (and loading a model from an RDB) creates the run queue of the model's device, so the workers
    exist (and are counted in ai_onnxruntime_maximum_run_sessions_number) before any run."""
    con = server.client()
    store(con, "m", "mul", device="CPU")
    assert sessions(server) == 3
    store(con, "m1", "mul", device="CPU:1")
    assert sessions(server) == 6
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert sessions(server) == 6


# =================================================================================================
# the main thread stays responsive while a big model is built


def test_responsive_while_storing_big_model(server):
    """The model is built on a background thread: while a 72 MiB model (whose build takes about a second)
    is stored by one client, PING from another is answered at once."""
    big, a, b = big_model()
    assert 50 * 2 ** 20 <= len(big) <= 100 * 2 ** 20
    con = server.client()
    done = threading.Event()
    result = {}

    def storer():
        try:
            c = server.client(socket_timeout=300)
            t0 = time.monotonic()
            result["reply"] = c.execute_command("AI.MODELSTORE", "big", "ONNX", "CPU", "TAG", "big", "BLOB", big)
            result["seconds"] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001
            result["error"] = repr(e)
        finally:
            done.set()

    th = threading.Thread(target=storer)
    latencies = []
    th.start()
    while not done.is_set():
        t0 = time.monotonic()
        assert con.ping()
        latencies.append(time.monotonic() - t0)
        time.sleep(0.002)
    th.join()
    assert "error" not in result, result
    assert result["reply"] == b"OK"
    assert latencies, "no PING was answered while the model was stored"
    assert max(latencies) < 0.5, (
        f"PING took up to {max(latencies):.3f}s while a {len(big) >> 20} MiB model was stored "
        f"(store took {result['seconds']:.2f}s, {len(latencies)} PINGs)")
    x = np.random.default_rng(1).standard_normal((2, a.shape[0])).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "big", ["x"], ["y"]) == b"OK"
    want = (x.astype(np.float64) @ a) @ b
    np.testing.assert_allclose(get_tensor(con, "y"), want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
    assert con.execute_command("AI.MODELGET", "big", "BLOB") == big


# =================================================================================================
# idle workers sleep


@pytest.mark.module_args("THREADS_PER_QUEUE", "2")
def test_idle_workers_use_no_cpu(server):
    con = server.client()
    store(con, "h0", "heavy", device="CPU")
    store(con, "h1", "heavy", device="CPU:1")
    set_tensor(con, "x", np.ones((64, 256), dtype=np.float32))
    for _ in range(3):
        model_execute(con, "h0", ["x"], ["y0"])
        model_execute(con, "h1", ["x"], ["y1"])
    assert sessions(server) == 4
    time.sleep(2.0)
    before = proc_cpu_seconds(server.pid)
    time.sleep(2.0)
    used = proc_cpu_seconds(server.pid) - before
    assert used < 0.05, f"an idle server used {used:.3f}s of CPU in 2s"


# =================================================================================================
# many clients at once, per backend


@pytest.mark.module_args("THREADS_PER_QUEUE", "3")
def test_concurrent_clients_tflite(server):
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


@pytest.mark.module_args("THREADS_PER_QUEUE", "4")
def test_concurrent_execute_tf(server):
    """8 clients x 25 MODELEXECUTE of tf_dense, each with its own input: every output belongs to its input."""
    con = server.client()
    tf_store(con, "m", "dense")
    n_threads, n_runs = 8, 25
    inputs, results = concurrent_executes(server, "m", n_threads, n_runs)
    for key, x in inputs.items():
        assert_close(results[key], weights.linear(x))
    # exact: each output is bit for bit what a run of the same input alone gives
    for (t, i), x in inputs.items():
        if i % 5 == 0:
            assert model_execute(con, "m", [f"x:{t}:{i}"], ["ref"]) == b"OK"
            assert get_tensor(con, "ref").tobytes() == results[t, i].tobytes(), (t, i)
    info = ai_info(con, "m")
    assert (info["errors"], info["samples"]) == (0, 2 * (n_threads * n_runs + n_threads * n_runs // 5)), info


@pytest.mark.module_args("THREADS_PER_QUEUE", "4")
def test_concurrent_execute_torch(server):
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


def test_scriptexecute_concurrent_clients(server):
    """Several clients running the same script on the same and on another device at once."""
    con = server.client()
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    script_store(con, "s1", MAIN_SRC, MAIN_FNS, device="CPU:1")
    errors = []

    def worker(t):
        c = server.client()
        try:
            for i in range(15):
                x = np.full((2, 2), t * 100 + i, dtype=np.float32)
                set_tensor(c, f"x{t}", x)
                key = "s" if (t + i) % 2 else "s1"
                assert script_execute(c, key, "scale", inputs=[f"x{t}"], args=[str(t + 1)],
                                      outputs=[f"y{t}"]) == b"OK"
                np.testing.assert_array_equal(get_tensor(c, f"y{t}"), x * np.float32(t + 1))
        except Exception as e:  # noqa: BLE001
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert errors == [], errors
    assert ai_info(con, "s")["calls"] + ai_info(con, "s1")["calls"] == 90


# =================================================================================================
# two devices in one DAG


def threads(pid):
    """[(thread name, tid)] of a process."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.append(((task / "comm").read_text().strip(), int(task.name)))
        except OSError:
            pass
    return out


def worker_threads(pid):
    """{thread name: tid} of a process."""
    return dict(threads(pid))


@pytest.mark.in_process  # a worker process's pools are in that process
@pytest.mark.module_args("INTRA_OP_PARALLELISM", "2", "THREADS_PER_QUEUE", "2")
def test_backend_threads_take_their_backend_s_name(server):
    """A new thread takes its creator's name: ONNX Runtime's pool threads were `ai:modelstore` (the store's thread,
    long gone) or a second `ai:CPU:1` (a worker that made a session for a concurrent run). They are `ai:onnx`."""
    con = server.client()
    store(con, "m", "linear")
    concurrent_executes(server, "m", 4, 20)  # two workers at once: the second makes a session of its own
    names = [name for name, _ in threads(server.pid)]
    assert "ai:modelstore" not in names, sorted(names)
    assert names.count("ai:onnx") >= 1, sorted(names)  # INTRA_OP_PARALLELISM 2: one pool thread per session
    for worker in ("ai:CPU:0", "ai:CPU:1"):
        assert names.count(worker) == 1, sorted(names)


def thread_cpu_ticks(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, clock ticks


@pytest.mark.in_process  # it reads the queue threads' own CPU time; bench.py --only devices measures both modes
@pytest.mark.module_args("INTRA_OP_PARALLELISM", "1")
@pytest.mark.skipif(os.cpu_count() < 2, reason="needs two CPUs to run two device queues at once")
def test_dag_two_devices_run_in_parallel(server):
    """heavy.onnx on CPU and on CPU:1 in one DAG: the worker threads `ai:CPU:0` and `ai:CPU:1:0` both
    accumulate CPU time in the same sampling intervals (many of them), which a sequential run could only do in
    the one interval where the first op ends and the second starts."""
    con = server.client()
    store(con, "h0", "heavy", device="CPU")
    store(con, "h1", "heavy", device="cpu:1")
    x = heavy_batch(512, seed=1)
    tset(con, "x", x)
    # size the batch so that each op takes about a second here
    assert con.execute_command(*mexec("h1", ["x"], ["y"])) == b"OK"
    start = time.monotonic()
    assert con.execute_command(*mexec("h0", ["x"], ["y"])) == b"OK"
    per_row = (time.monotonic() - start) / 512
    names = worker_threads(server.pid)
    assert "ai:CPU:0" in names and "ai:CPU:1:0" in names, sorted(names)
    assert "ai:cpu:1:0" not in names  # device strings name queues case-insensitively (h1 was stored on cpu:1)
    t0, t1 = names["ai:CPU:0"], names["ai:CPU:1:0"]
    batch = int(min(max(1.0 / max(per_row, 1e-7), 512), 65536))
    x = heavy_batch(batch, seed=2)
    tset(con, "x", x)

    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((thread_cpu_ticks(server.pid, t0), thread_cpu_ticks(server.pid, t1)))
            time.sleep(0.05)

    th = threading.Thread(target=sampler)
    th.start()
    try:
        ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x"], [
            mexec("h0", ["x"], ["y0"]), mexec("h1", ["x"], ["y1"]),
            ["AI.TENSORGET", "y0", "META", "BLOB"], ["AI.TENSORGET", "y1", "META", "BLOB"]]))
    finally:
        stop.set()
        th.join()
    assert ret[:2] == [b"OK", b"OK"]
    expected = weights.heavy(x)
    np.testing.assert_allclose(from_meta_blob(ret[2]), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(from_meta_blob(ret[3]), expected, rtol=1e-4, atol=1e-4)
    d0 = samples[-1][0] - samples[0][0]
    d1 = samples[-1][1] - samples[0][1]
    assert d0 > 0 and d1 > 0, (d0, d1, batch)
    both = sum(1 for a, b in zip(samples, samples[1:]) if b[0] > a[0] and b[1] > a[1])
    assert both >= 3, (f"only {both} of {len(samples) - 1} intervals saw both workers run "
                       f"(batch {batch}, ticks {d0}/{d1})")
