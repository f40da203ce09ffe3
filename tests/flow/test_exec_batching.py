"""Auto-batching (docs/commands.md, AI.MODELSTORE BATCHSIZE / MINBATCHSIZE / MINBATCHTIMEOUT, and AI.MODELEXECUTE),
with ONNX, TF and TFLITE models, and its AI.INFO counts.

A model stored with `BATCHSIZE n` batches the pending MODELEXECUTEs of the same model object that wait on the
same device queue (from different clients and from inside DAGs): the inputs are concatenated on dimension 0,
the model runs once, every output's dimension 0 must equal the total (`ERR Model did not generate the expected
batch size` to every request of the batch otherwise) and is sliced back per request.

Batching only picks up compatible requests queued *behind* the one a worker pops, so most tests first occupy
the `CPU` queue with heavy.onnx runs (2048 rows each, from other clients), fire the batched requests
concurrently (each from its own named connection, on a thread), wait until CLIENT LIST shows all of them
blocked while a heavy run is still pending, and only then let the queue drain.

Models (tests/data/gen_onnx.py):
  batch_sum.onnx   x [batch, 2] -> y = x + ReduceSum(x over dim 0, keepdims): a lone one-row request gets 2x;
                   batched, every row also gets the other requests' rows, which makes batching observable
  batch_break.onnx x [batch, 2] -> y [1, 2]: breaks the batch contract as soon as two requests are batched
  linear.onnx      y = x @ W + B (numpy: weights.linear), to check that every client gets its own rows
  str_identity.onnx STRING identity
  tf_dense.pb      TF, the math of linear.onnx (INPUTS 1 x OUTPUTS 1 y)
  tflite_sub_mul.tflite  TFLITE, a, b -> a - b, a * b (MINBATCHSIZE and MINBATCHTIMEOUT)
"""

import math
import threading
import time

import numpy as np
import pytest

from helpers.checks import wait_for
from helpers.data import DATA_DIR, weights
from helpers.onnx_models import (Request, ai_info, blocked_names, get_tensor, make_model, mexec, model_execute,
                                 proc_cpu_seconds, set_tensor, store)
from helpers.resp import RawClient, RespError
from helpers.server import TF_LIB
from helpers.tflite_models import ab, tfl_store

E_BATCH = "ERR Model did not generate the expected batch size"
ORT_BAD_TYPE = "Unexpected input data type"
HEAVY_ROWS = 2048


# -------------------------------------------------------------------------------------------------
# helpers


def rows(seed, n, m=2, dtype=np.float32):
    """n x m small integers (exact in float32, so sums compare exactly)."""
    return np.random.default_rng(seed).integers(1, 50, size=(n, m)).astype(dtype)


def fire(srv, named_cmds):
    """Start one Request per (name, cmd) at once; returns them (in order)."""
    reqs = [Request(srv, name, *cmd) for name, cmd in named_cmds]
    for r in reqs:
        r.start()
    return reqs


class Occupier:
    """heavy.onnx runs queued on the `CPU` queue (HEAVY_ROWS rows each, one client per run), worth about
    `seconds` of work, so that requests sent now pile up behind them."""

    def __init__(self, srv, con, seconds=1.2, device="CPU"):
        self.srv = srv
        store(con, "heavy", "heavy", device=device)
        set_tensor(con, "hx", np.random.default_rng(0).standard_normal((HEAVY_ROWS, 256)).astype(np.float32))
        assert con.execute_command(*mexec("heavy", ["hx"], ["hy"])) == b"OK"  # warms the session up
        t0 = time.monotonic()
        assert con.execute_command(*mexec("heavy", ["hx"], ["hy"])) == b"OK"
        one = time.monotonic() - t0
        self.n = max(3, min(40, math.ceil(seconds / max(one, 1e-3))))
        self.clients = []
        for i in range(self.n):
            c = RawClient(srv.port, timeout=120)
            c.send("CLIENT", "SETNAME", f"heavy{i}")
            assert c.reply() == "OK"
            c.send(*mexec("heavy", ["hx"], [f"hy{i}"]))
            self.clients.append(c)
        wait_for(lambda: any(n.startswith("heavy") for n in blocked_names(srv)), 5, what="heavy runs queued")

    def wait_queued(self, names, timeout=10.0):
        """Wait until every client in `names` is blocked while a heavy run is still pending (so they all
        sit in the queue behind it)."""
        names = set(names)
        deadline = time.monotonic() + timeout
        while True:
            b = blocked_names(self.srv)
            heavy_pending = any(n.startswith("heavy") for n in b)
            if names <= b and heavy_pending:
                return
            if not heavy_pending:
                pytest.fail(f"the heavy runs finished before all requests were queued (blocked: {sorted(b)}); "
                            f"the occupying work is too short", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"requests not all blocked after {timeout}s: missing {sorted(names - b)}", pytrace=False)
            time.sleep(0.005)

    def release(self):
        replies = [c.reply() for c in self.clients]
        for c in self.clients:
            c.close()
        assert replies == ["OK"] * self.n, replies


def assert_batched_sum(got, x, batch_rows):
    """batch_sum semantics: every row = own row + sum of all rows of the batch."""
    want = x + np.sum(np.concatenate(batch_rows, axis=0), axis=0, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def any_dims_sum_model():
    """x FLOAT [batch, m] -> y = x + ReduceSum(x over dim 0): batch_sum with a free trailing dimension."""
    from onnx import TensorProto, helper, numpy_helper

    F = TensorProto.FLOAT
    return make_model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["batch", "m"])],
        [helper.make_tensor_value_info("y", F, ["batch", "m"])],
        [numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")], name="any_dims_sum")


def require_tf():
    if not TF_LIB:
        pytest.fail("REDISAI_TF_LIB must name the TensorFlow library for this test", pytrace=False)


def tf_store(con, key, *opts):
    reply = con.execute_command("AI.MODELSTORE", key, "TF", "CPU", *opts, "INPUTS", 1, "x", "OUTPUTS", 1, "y",
                                "BLOB", (DATA_DIR / "tf_dense.pb").read_bytes())
    assert reply == b"OK", reply


# -------------------------------------------------------------------------------------------------
# requests that run alone


def test_lone_requests_run_alone(con):
    """Requests sent one after the other never batch: a one-row request gets 2x, a three-row one x + its own
    sum; a request at or above BATCHSIZE and one reaching MINBATCHSIZE by itself run at once."""
    store(con, "bs", "batch_sum", "BATCHSIZE", 4)
    store(con, "bm", "batch_sum", "BATCHSIZE", 4, "MINBATCHSIZE", 3)
    x1, x3, x4, x6 = rows(1, 1), rows(3, 3), rows(4, 4), rows(6, 6)
    for key, x in (("x1", x1), ("x3", x3), ("x4", x4), ("x6", x6)):
        set_tensor(con, key, x)
    for key, x in (("x1", x1), ("x3", x3), ("x6", x6)):
        assert con.execute_command(*mexec("bs", [key], ["y"])) == b"OK"
        assert_batched_sum(get_tensor(con, "y"), x, [x])
    for key, x in (("x3", x3), ("x4", x4), ("x6", x6)):
        t0 = time.monotonic()
        assert con.execute_command(*mexec("bm", [key], ["y"])) == b"OK"
        assert time.monotonic() - t0 < 2.0
        assert_batched_sum(get_tensor(con, "y"), x, [x])
    info = ai_info(con, "bs")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 10, 0)


# -------------------------------------------------------------------------------------------------
# requests from different clients batch together


def test_concurrent_requests_batch_together(server):
    """Four clients with 1, 2, 1, 3 rows queued behind heavy runs: one batched run; every row gets the sum of
    all 7 rows; AI.INFO counts 4 calls with their own samples (7)."""
    con = server.client()
    store(con, "bs", "batch_sum", "BATCHSIZE", 8)
    xs = {f"r{i}": rows(10 + i, n) for i, n in enumerate((1, 2, 1, 3))}
    for k, x in xs.items():
        set_tensor(con, f"x:{k}", x)
    occ = Occupier(server, con)
    reqs = fire(server, [(k, mexec("bs", [f"x:{k}"], [f"y:{k}"])) for k in xs])
    occ.wait_queued(xs)
    occ.release()
    assert [r.result() for r in reqs] == ["OK"] * 4
    for k, x in xs.items():
        y = get_tensor(con, f"y:{k}")
        assert y.shape == x.shape
        assert_batched_sum(y, x, list(xs.values()))
    info = ai_info(con, "bs")
    assert (info["calls"], info["samples"], info["errors"]) == (4, 7, 0)
    assert info["duration"] > 0


def test_every_client_gets_its_own_rows(server):
    """Six linear.onnx requests (1..4 rows) and two batch_sum requests batched behind heavy runs: every
    linear client gets exactly linear(its own input); batch_sum shows that the queue did batch."""
    con = server.client()
    store(con, "lin", "linear", "BATCHSIZE", 16)
    store(con, "bs", "batch_sum", "BATCHSIZE", 8)
    xl = {f"l{i}": (np.random.default_rng(20 + i).standard_normal((n, 4)) * (i + 1)).astype(np.float32)
          for i, n in enumerate((1, 2, 3, 1, 4, 2))}
    xb = {f"b{i}": rows(30 + i, n) for i, n in enumerate((1, 2))}
    for k, x in {**xl, **xb}.items():
        set_tensor(con, f"x:{k}", x)
    occ = Occupier(server, con)
    cmds = [(k, mexec("lin", [f"x:{k}"], [f"y:{k}"])) for k in xl]
    cmds += [(k, mexec("bs", [f"x:{k}"], [f"y:{k}"])) for k in xb]
    # interleave the two models in the queue
    order = [cmds[0], cmds[6], cmds[1], cmds[2], cmds[7], cmds[3], cmds[4], cmds[5]]
    reqs = fire(server, order)
    occ.wait_queued([name for name, _ in order])
    occ.release()
    assert [r.result() for r in reqs] == ["OK"] * 8
    for k, x in xl.items():
        y = get_tensor(con, f"y:{k}")
        assert y.shape == (x.shape[0], 3)
        np.testing.assert_allclose(y, weights.linear(x), rtol=1e-5, atol=1e-5)
    for k, x in xb.items():
        assert_batched_sum(get_tensor(con, f"y:{k}"), x, list(xb.values()))
    info = ai_info(con, "lin")
    assert (info["calls"], info["samples"], info["errors"]) == (6, 13, 0)
    info = ai_info(con, "bs")
    assert (info["calls"], info["samples"], info["errors"]) == (2, 3, 0)


def test_broken_batch_contract_fails_every_request(server):
    """batch_break.onnx answers one row whatever the batch: alone (one row) that is right; batched, every
    request gets `ERR Model did not generate the expected batch size`, no output is stored, and AI.INFO
    counts an error per request."""
    con = server.client()
    store(con, "bb", "batch_break", "BATCHSIZE", 4)
    x = rows(40, 1)
    set_tensor(con, "x0", x)
    assert con.execute_command(*mexec("bb", ["x0"], ["y0"])) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y0"), x)
    for i in range(3):
        set_tensor(con, f"x{i + 1}", rows(41 + i, 1))
    occ = Occupier(server, con)
    names = [f"r{i}" for i in range(1, 4)]
    reqs = fire(server, [(f"r{i}", mexec("bb", [f"x{i}"], [f"y{i}"])) for i in range(1, 4)])
    occ.wait_queued(names)
    occ.release()
    replies = [r.result() for r in reqs]
    for reply in replies:
        assert isinstance(reply, RespError) and str(reply) == E_BATCH, replies
    for i in range(1, 4):
        assert con.exists(f"y{i}") == 0
    info = ai_info(con, "bb")
    assert (info["calls"], info["errors"], info["samples"]) == (4, 3, 1)


def test_request_at_batchsize_runs_alone(server):
    """BATCHSIZE 2: a two-row request popped first runs alone (its rows only); the two one-row requests
    queued behind it batch together."""
    con = server.client()
    store(con, "bs", "batch_sum", "BATCHSIZE", 2)
    xa, xb, xc = rows(50, 2), rows(51, 1), rows(52, 1)
    for k, x in (("xa", xa), ("xb", xb), ("xc", xc)):
        set_tensor(con, k, x)
    occ = Occupier(server, con)
    (a,) = fire(server, [("a", mexec("bs", ["xa"], ["ya"]))])
    occ.wait_queued(["a"])
    b, c = fire(server, [("b", mexec("bs", ["xb"], ["yb"])), ("c", mexec("bs", ["xc"], ["yc"]))])
    occ.wait_queued(["a", "b", "c"])
    occ.release()
    assert [r.result() for r in (a, b, c)] == ["OK"] * 3
    assert_batched_sum(get_tensor(con, "ya"), xa, [xa])
    assert_batched_sum(get_tensor(con, "yb"), xb, [xb, xc])
    assert_batched_sum(get_tensor(con, "yc"), xc, [xb, xc])
    info = ai_info(con, "bs")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 4, 0)


def test_different_trailing_dims_or_dtypes_do_not_batch(server):
    """x [batch, m] -> x + sum over dim 0, with requests of trailing dims 2 and 3 and INT32 requests all
    queued together: the [*, 2] FLOAT ones batch only with each other, the [*, 3] ones only with each
    other, and the INT32 ones fail with ONNX Runtime's type error without touching anyone else's rows."""
    con = server.client()
    assert con.execute_command("AI.MODELSTORE", "ad", "ONNX", "CPU", "BATCHSIZE", 16,
                               "BLOB", any_dims_sum_model()) == b"OK"
    xs = {"a1": rows(60, 1), "b1": rows(61, 1, 3), "d1": rows(62, 1, dtype=np.int32),
          "a2": rows(63, 2), "b2": rows(64, 2, 3), "d2": rows(65, 1, dtype=np.int32)}
    for k, x in xs.items():
        set_tensor(con, f"x:{k}", x)
    occ = Occupier(server, con)
    reqs = fire(server, [(k, mexec("ad", [f"x:{k}"], [f"y:{k}"])) for k in xs])
    occ.wait_queued(xs)
    occ.release()
    replies = {k: r.result() for k, r in zip(xs, reqs)}
    for k in ("a1", "a2", "b1", "b2"):
        assert replies[k] == "OK", replies
    for k in ("d1", "d2"):
        assert isinstance(replies[k], RespError) and ORT_BAD_TYPE in replies[k], replies
        assert con.exists(f"y:{k}") == 0
    for k in ("a1", "a2"):
        assert_batched_sum(get_tensor(con, f"y:{k}"), xs[k], [xs["a1"], xs["a2"]])
    for k in ("b1", "b2"):
        assert_batched_sum(get_tensor(con, f"y:{k}"), xs[k], [xs["b1"], xs["b2"]])


# -------------------------------------------------------------------------------------------------
# MINBATCHSIZE / MINBATCHTIMEOUT


def test_minbatchsize_waits_for_enough_requests(server):
    """MINBATCHSIZE 3 without MINBATCHTIMEOUT: two one-row requests get no reply; meanwhile the server
    answers PING, another model on the same `CPU` queue runs, and the waiting costs no CPU; the third request
    releases all three in one batch."""
    con = server.client()
    store(con, "bm", "batch_sum", "BATCHSIZE", 8, "MINBATCHSIZE", 3)
    store(con, "lin", "linear", device="CPU")
    xs = {f"r{i}": rows(70 + i, 1) for i in range(3)}
    for k, x in xs.items():
        set_tensor(con, f"x:{k}", x)
    xl = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)
    set_tensor(con, "xl", xl)
    assert con.execute_command(*mexec("lin", ["xl"], ["warm"])) == b"OK"
    first = fire(server, [(k, mexec("bm", [f"x:{k}"], [f"y:{k}"])) for k in ("r0", "r1")])
    wait_for(lambda: {"r0", "r1"} <= blocked_names(server), 5, what="the two requests to block")
    time.sleep(0.3)
    assert all(r.is_alive() for r in first), [(r.name_, r.reply, r.error) for r in first]
    # waiting must not spin
    before = proc_cpu_seconds(server.pid)
    time.sleep(1.0)
    used = proc_cpu_seconds(server.pid) - before
    assert used < 0.1, f"the server used {used:.3f}s of CPU in 1s while two requests waited for a batch"
    # responsive, and the same device queue still serves other models
    t0 = time.monotonic()
    assert con.ping()
    assert time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    assert con.execute_command(*mexec("lin", ["xl"], ["yl"])) == b"OK"
    assert time.monotonic() - t0 < 2.0
    np.testing.assert_allclose(get_tensor(con, "yl"), weights.linear(xl), rtol=1e-5, atol=1e-5)
    assert all(r.is_alive() for r in first), [(r.name_, r.reply, r.error) for r in first]
    assert {"r0", "r1"} <= blocked_names(server)
    for k in ("r0", "r1"):
        assert con.exists(f"y:{k}") == 0
    (third,) = fire(server, [("r2", mexec("bm", ["x:r2"], ["y:r2"]))])
    assert [r.result(10) for r in first + [third]] == ["OK"] * 3
    for k, x in xs.items():
        assert_batched_sum(get_tensor(con, f"y:{k}"), x, list(xs.values()))
    info = ai_info(con, "bm")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 3, 0)


def test_minbatchtimeout_releases_waiting_requests(server):
    """MINBATCHSIZE 3 MINBATCHTIMEOUT 600: a lone request runs after about 600 ms (not at once, not much
    later) on its own; two one-row requests sent together (2 rows < 3) are released together after the
    timeout, as one batch."""
    con = server.client()
    store(con, "bt", "batch_sum", "BATCHSIZE", 8, "MINBATCHSIZE", 3, "MINBATCHTIMEOUT", 600)
    x0, x1, x2 = rows(80, 1), rows(81, 1), rows(82, 1)
    for k, x in (("x0", x0), ("x1", x1), ("x2", x2)):
        set_tensor(con, k, x)
    (lone,) = fire(server, [("lone", mexec("bt", ["x0"], ["y0"]))])
    assert lone.result(10) == "OK"
    assert 0.6 <= lone.elapsed < 2.6, f"the lone request took {lone.elapsed:.3f}s"
    assert_batched_sum(get_tensor(con, "y0"), x0, [x0])
    pair = fire(server, [("p1", mexec("bt", ["x1"], ["y1"])), ("p2", mexec("bt", ["x2"], ["y2"]))])
    assert [r.result(10) for r in pair] == ["OK", "OK"]
    assert max(r.elapsed for r in pair) >= 0.6, [r.elapsed for r in pair]
    assert max(r.elapsed for r in pair) < 2.6, [r.elapsed for r in pair]
    assert_batched_sum(get_tensor(con, "y1"), x1, [x1, x2])
    assert_batched_sum(get_tensor(con, "y2"), x2, [x1, x2])
    info = ai_info(con, "bt")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 3, 0)


def test_timeout_applies_while_waiting_for_a_batch(server):
    """MINBATCHSIZE 3, no MINBATCHTIMEOUT: a lone request with TIMEOUT 300 gets TIMEDOUT after about 300 ms
    and stores nothing; it is gone from the queue, so the next three requests batch only with each other."""
    con = server.client()
    store(con, "bm", "batch_sum", "BATCHSIZE", 8, "MINBATCHSIZE", 3)
    xt = rows(90, 1)
    set_tensor(con, "xt", xt)
    (timed,) = fire(server, [("timed", mexec("bm", ["xt"], ["yt"], "TIMEOUT", 300))])
    assert timed.result(10) == "TIMEDOUT"
    assert 0.29 <= timed.elapsed < 3.0, f"TIMEDOUT after {timed.elapsed:.3f}s"
    assert con.exists("yt") == 0
    xs = {f"r{i}": rows(91 + i, 1) for i in range(3)}
    for k, x in xs.items():
        set_tensor(con, f"x:{k}", x)
    reqs = fire(server, [(k, mexec("bm", [f"x:{k}"], [f"y:{k}"])) for k in xs])
    assert [r.result(10) for r in reqs] == ["OK"] * 3
    for k, x in xs.items():
        assert_batched_sum(get_tensor(con, f"y:{k}"), x, list(xs.values()))
    info = ai_info(con, "bm")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 3, 0)


# -------------------------------------------------------------------------------------------------
# DAGs, STRING tensors, TF


def test_dag_modelexecute_batches_with_plain_requests(server):
    """A MODELEXECUTE inside a DAG (LOAD, PERSIST, TENSORGET after it), one inside a read-only DAG and a plain
    MODELEXECUTE from a third client, queued together: one batch of the 4 rows; the DAG replies carry the
    right tensors, the PERSISTed output is stored and the DAG-local one is not."""
    con = server.client()
    store(con, "bs", "batch_sum", "BATCHSIZE", 8)
    xa, xb, xc = rows(100, 2), rows(101, 1), rows(102, 1)
    for k, x in (("xa", xa), ("xb", xb), ("xc", xc)):
        set_tensor(con, k, x)
    dag_a = ["AI.DAGEXECUTE", "LOAD", 1, "xa", "PERSIST", 1, "ya", "|>", *mexec("bs", ["xa"], ["ya"]),
             "|>", "AI.TENSORGET", "ya", "META", "BLOB"]
    dag_b = ["AI.DAGEXECUTE_RO", "LOAD", 1, "xb", "|>", *mexec("bs", ["xb"], ["yb"]),
             "|>", "AI.TENSORGET", "yb", "META", "BLOB"]
    occ = Occupier(server, con)
    reqs = fire(server, [("dag_a", dag_a), ("dag_b", dag_b), ("plain", mexec("bs", ["xc"], ["yc"]))])
    occ.wait_queued(["dag_a", "dag_b", "plain"])
    occ.release()
    ra, rb, rc = (r.result() for r in reqs)
    batch = [xa, xb, xc]
    for reply, x in ((ra, xa), (rb, xb)):
        assert isinstance(reply, list) and len(reply) == 2 and reply[0] == "OK", reply
        meta = reply[1]
        assert meta[:4] == [b"dtype", b"FLOAT", b"shape", list(x.shape)], meta
        assert meta[4] == b"blob"
        assert_batched_sum(np.frombuffer(meta[5], dtype=np.float32).reshape(x.shape), x, batch)
    assert rc == "OK"
    assert_batched_sum(get_tensor(con, "ya"), xa, batch)
    assert_batched_sum(get_tensor(con, "yc"), xc, batch)
    assert con.exists("yb") == 0
    info = ai_info(con, "bs")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 4, 0)


def test_string_tensors_batch(server):
    """str_identity.onnx with BATCHSIZE 8 MINBATCHSIZE 6: requests of 1 and 2 strings wait (3 rows < 6), one
    of 3 strings completes the batch; every client gets back exactly its own strings."""
    con = server.client()
    store(con, "si", "str_identity", "BATCHSIZE", 8, "MINBATCHSIZE", 6)
    values = {"s1": ["alpha"], "s2": ["βeta", "gamma gamma"], "s3": ["日本語", "x" * 100, "z"]}
    for k, v in values.items():
        assert con.execute_command("AI.TENSORSET", f"in:{k}", "STRING", len(v), "VALUES", *v) == b"OK"
    first = fire(server, [(k, mexec("si", [f"in:{k}"], [f"out:{k}"])) for k in ("s1", "s2")])
    wait_for(lambda: {"s1", "s2"} <= blocked_names(server), 5, what="the two requests to block")
    time.sleep(0.3)
    assert all(r.is_alive() for r in first), [(r.name_, r.reply, r.error) for r in first]
    (third,) = fire(server, [("s3", mexec("si", ["in:s3"], ["out:s3"]))])
    assert [r.result(10) for r in first + [third]] == ["OK"] * 3
    for k, v in values.items():
        assert con.execute_command("AI.TENSORGET", f"out:{k}", "META") == [b"dtype", b"STRING", b"shape", [len(v)]]
        assert con.execute_command("AI.TENSORGET", f"out:{k}", "VALUES") == [s.encode() for s in v]
    info = ai_info(con, "si")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 6, 0)


def test_tf_model_batches(server):
    """tf_dense.pb stored with BATCHSIZE: MINBATCHSIZE 3 holds two requests until a third arrives; four
    requests queued behind heavy runs each get exactly linear(their own input)."""
    require_tf()
    con = server.client()
    tf_store(con, "tfm", "BATCHSIZE", 8, "MINBATCHSIZE", 3)
    tf_store(con, "tfb", "BATCHSIZE", 8)
    xs = {f"m{i}": np.random.default_rng(110 + i).standard_normal((1, 4)).astype(np.float32) for i in range(3)}
    xs.update({f"b{i}": np.random.default_rng(120 + i).standard_normal((n, 4)).astype(np.float32)
               for i, n in enumerate((1, 3, 2, 1))})
    for k, x in xs.items():
        set_tensor(con, f"x:{k}", x)
    # MINBATCHSIZE
    first = fire(server, [(k, mexec("tfm", [f"x:{k}"], [f"y:{k}"])) for k in ("m0", "m1")])
    wait_for(lambda: {"m0", "m1"} <= blocked_names(server), 5, what="the two requests to block")
    time.sleep(0.3)
    assert all(r.is_alive() for r in first), [(r.name_, r.reply, r.error) for r in first]
    (third,) = fire(server, [("m2", mexec("tfm", ["x:m2"], ["y:m2"]))])
    assert [r.result(10) for r in first + [third]] == ["OK"] * 3
    info = ai_info(con, "tfm")
    assert (info["calls"], info["samples"], info["errors"]) == (3, 3, 0)
    # concurrent requests behind heavy runs
    occ = Occupier(server, con)
    names = [k for k in xs if k.startswith("b")]
    reqs = fire(server, [(k, mexec("tfb", [f"x:{k}"], [f"y:{k}"])) for k in names])
    occ.wait_queued(names)
    occ.release()
    assert [r.result() for r in reqs] == ["OK"] * 4
    for k, x in xs.items():
        y = get_tensor(con, f"y:{k}")
        assert y.shape == (x.shape[0], 3)
        np.testing.assert_allclose(y, weights.linear(x), rtol=1e-5, atol=1e-5)
    info = ai_info(con, "tfb")
    assert (info["calls"], info["samples"], info["errors"]) == (4, 7, 0)


# -------------------------------------------------------------------------------------------------
# TFLITE


def test_autobatching_tflite(server):
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
