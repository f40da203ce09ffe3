"""Crash recovery (issue #8, item 4): what a server brings back after `kill -9`, what a replica gets from a
full sync, and which RDB files load.

(a) AOF with `appendfsync everysec`: writer threads store tensors, models of every backend (ONNX, TF, TORCH),
    TorchScript scripts and model/script outputs under load; the server is killed with SIGKILL mid-load and
    started again on the same directory. Everything acknowledged more than FSYNC_PERIOD + MARGIN seconds
    before the kill must be back byte for byte; anything else that is back must be exactly what was sent
    (no torn values), and nothing else may appear.
(b) A replica that full-syncs from a master holding models of every backend, scripts and tensors serves the
    same data, and read-only DAGs give the same results on both.
(c) RDB files load: one written by this module (SAVE, then SIGKILL and start), and one built here, byte by
    byte, from the DUMP payloads recorded from the original RedisAI (tests/data/redisai-dumps.json).
"""

import os
import signal
import struct
import threading
import time

import numpy as np
import pytest
import redis

from helpers.checks import wait_for
from helpers.onnx_models import blob, get_tensor, recorded_model_function, set_tensor, store
from helpers.rdb import crc64, rdb_len
from helpers.recorded import RECORDED, assert_reply, need_case, payload_body, recorded_create
from helpers.resp import RespError
from helpers.tf_models import tf_blob
from helpers.torch_models import entry, pt_blob, pt_store, script_set, script_store

FSYNC_PERIOD = 1.0  # appendfsync everysec: Redis fsyncs the AOF once a second
MARGIN = 0.5  # a late fsync, scheduling on a loaded machine
LOAD_SECONDS = 3.5  # how long the writers run before the kill (> FSYNC_PERIOD + MARGIN, and an AOF rewrite)


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def onnx_variant(i):
    """mul.onnx with ModelProto.doc_string (field 6) set to a unique text: a different, valid blob."""
    text = f"crash-recovery {i}".encode()
    return blob("mul") + b"\x32" + varint(len(text)) + text


def tf_variant(i):
    """tf_mul.pb with an unknown varint field (number 100) appended: TensorFlow ignores it, the bytes differ."""
    return tf_blob("mul") + varint(100 << 3) + varint(i + 1)


TORCH_FILES = ("torch_add", "torch_two_outputs", "torch_linear", "torch_int")
TENSOR_DTYPES = {"FLOAT": np.float32, "DOUBLE": np.float64, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
                 "UINT8": np.uint8, "UINT16": np.uint16}


# =================================================================================================
# (a) kill -9 under write load, AOF everysec


class Ledger:
    """What the writers sent (key -> expectation, recorded before sending) and when each write was acknowledged."""

    def __init__(self):
        self.sent = {}
        self.acked = []  # (monotonic time the reply arrived, kind, key)
        self.counter = []  # (value, ack time) of the overwritten key "counter"
        self.counter_sent = -1
        self.errors = []  # replies that were errors (a bug), not connection losses
        self.disconnects = []  # (time, writer, error) of lost connections


def _writer(server, ledger, stop, name, step):
    con = server.client(socket_timeout=60)
    i = 0
    try:
        while not stop.is_set():
            step(con, ledger, name, i)
            i += 1
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError, OSError) as e:
        ledger.disconnects.append((time.monotonic(), name, repr(e)))  # the kill (checked: not before it)
    except redis.exceptions.ResponseError as e:
        ledger.errors.append(f"{name} step {i}: {e}")
    except Exception as e:  # noqa: BLE001  (reported by the test)
        ledger.errors.append(f"{name} step {i}: {e!r}")


def _ack(ledger, kind, key, reply):
    t = time.monotonic()
    assert reply in (b"OK", "OK"), (key, reply)
    ledger.acked.append((t, kind, key))


def tensor_step(con, ledger, name, i):
    rng = np.random.default_rng([*name.encode(), i])
    key = f"t:{name}:{i}"
    kind = i % 5
    if kind == 4:  # STRING through VALUES
        vals = [f"{name}-{i}-{j}-γ" for j in range(int(rng.integers(1, 20)))]
        expect = ("tensor", b"STRING", [len(vals)], b"".join(v.encode() + b"\0" for v in vals))
        ledger.sent[key] = expect
        _ack(ledger, "tensor", key, con.execute_command("AI.TENSORSET", key, "STRING", len(vals), "VALUES", *vals))
        return
    dtype = list(TENSOR_DTYPES)[int(rng.integers(0, len(TENSOR_DTYPES)))]
    n = int(rng.integers(1, 64)) if kind != 3 else int(rng.integers(1000, 8000))
    shape = [n] if n % 2 else [2, n // 2]
    data = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(TENSOR_DTYPES[dtype]).itemsize, dtype=np.uint8).tobytes()
    ledger.sent[key] = ("tensor", dtype.encode(), shape, data)
    _ack(ledger, "tensor", key, con.execute_command("AI.TENSORSET", key, dtype, *shape, "BLOB", data))


def model_step(con, ledger, name, i):
    backend = ("ONNX", "TF", "TORCH")[i % 3]
    key, tag = f"m:{backend.lower()}:{i}", f"tag-{i}"
    if backend == "ONNX":
        b, io = onnx_variant(i), []
    elif backend == "TF":
        b, io = tf_variant(i), ["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"]
    else:
        b, io = pt_blob(TORCH_FILES[(i // 3) % len(TORCH_FILES)]), []
    ledger.sent[key] = ("model", backend.encode(), tag.encode(), b)
    _ack(ledger, "model:" + backend, key, con.execute_command("AI.MODELSTORE", key, backend, "CPU", "TAG", tag, *io,
                                                              "BLOB", b))


def script_step(con, ledger, name, i):
    key, tag = f"s:{i}", f"v{i}"
    src = entry("f", f"return tensors[0] + {i}") + entry("g", f"return tensors[0] * {i % 7 + 1}")
    ledger.sent[key] = ("script", tag.encode(), src.encode())
    _ack(ledger, "script", key, con.execute_command("AI.SCRIPTSTORE", key, "CPU", "TAG", tag, "ENTRY_POINTS", 2,
                                                    "f", "g", "SOURCE", src))


def execute_step(con, ledger, name, i):
    """An output written by MODELEXECUTE, a DAG's PERSIST or SCRIPTEXECUTE (replicated as AI.TENSORSET)."""
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) * np.float32(i + 1) / np.float32(3)
    inp, out = f"x:{i}", f"out:{i}"
    which = i % 3
    if which == 0:
        ledger.sent[inp] = ("tensor", b"FLOAT", [2, 3], a.tobytes())
        _ack(ledger, "tensor", inp, con.execute_command("AI.TENSORSET", inp, "FLOAT", 2, 3, "BLOB", a.tobytes()))
        ledger.sent[out] = ("tensor", b"FLOAT", [2, 3], (a * a).tobytes())
        _ack(ledger, "output", out, con.execute_command("AI.MODELEXECUTE", "base:onnx", "INPUTS", 2, inp, inp,
                                                        "OUTPUTS", 1, out))
    elif which == 1:
        ledger.sent[out] = ("tensor", b"FLOAT", [2, 3], (a * a).tobytes())
        reply = con.execute_command(
            "AI.DAGEXECUTE", "PERSIST", 1, out, "|>", "AI.TENSORSET", "in", "FLOAT", 2, 3, "BLOB", a.tobytes(),
            "|>", "AI.MODELEXECUTE", "base:tf", "INPUTS", 2, "in", "in", "OUTPUTS", 1, out)
        _ack(ledger, "output", out, b"OK" if reply == [b"OK", b"OK"] else reply)
    else:
        ledger.sent[inp] = ("tensor", b"FLOAT", [2, 3], a.tobytes())
        _ack(ledger, "tensor", inp, con.execute_command("AI.TENSORSET", inp, "FLOAT", 2, 3, "BLOB", a.tobytes()))
        ledger.sent[out] = ("tensor", b"FLOAT", [2, 3], (a + np.float32(5)).tobytes())
        _ack(ledger, "output", out, con.execute_command("AI.SCRIPTEXECUTE", "base:script", "f", "INPUTS", 1, inp,
                                                        "OUTPUTS", 1, out))


def counter_step(con, ledger, name, i):
    """One key overwritten again and again: the value after the crash is not older than the cutoff."""
    ledger.counter_sent = i
    reply = con.execute_command("AI.TENSORSET", "counter", "INT64", 1, "VALUES", i)
    t = time.monotonic()
    assert reply == b"OK", reply
    ledger.counter.append((i, t))


def observed(con, key):
    """The stored value of `key` in the form of a Ledger expectation (None if the key is absent)."""
    t = con.type(key)
    if t == b"none":
        return None
    if t == b"AI_TENSOR":
        r = con.execute_command("AI.TENSORGET", key, "META", "BLOB")
        return ("tensor", r[1], r[3], r[5])
    if t == b"AI__MODEL":
        r = con.execute_command("AI.MODELGET", key, "META", "BLOB")
        return ("model", r[1], r[5], r[17])
    if t == b"AI_SCRIPT":
        r = con.execute_command("AI.SCRIPTGET", key, "META", "SOURCE")
        assert r[:6:2] == [b"device", b"tag", b"Entry Points"] and r[5] == [b"f", b"g"], r
        return ("script", r[3], r[7])
    return ("other", t)


@pytest.mark.server_args("--appendonly", "yes", "--appendfsync", "everysec")
def test_kill9_under_write_load_loses_nothing_older_than_a_second(server):
    con = server.client()
    store(con, "base:onnx", "mul")
    assert con.execute_command("AI.MODELSTORE", "base:tf", "TF", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                               "BLOB", tf_blob("mul")) == b"OK"
    script_store(con, "base:script", entry("f", "return tensors[0] + 5"), ["f"])
    pt_store(con, "warm:torch", "torch_add")  # loads libtorch before the clock starts
    fixed = {"base:onnx", "base:tf", "base:script", "warm:torch", "counter", "in"}

    ledger, stop = Ledger(), threading.Event()
    steps = [("t0", tensor_step), ("t1", tensor_step), ("models", model_step), ("scripts", script_step),
             ("exec", execute_step), ("counter", counter_step)]
    threads = [threading.Thread(target=_writer, args=(server, ledger, stop, n, s), daemon=True) for n, s in steps]
    for th in threads:
        th.start()
    # an AOF rewrite in the middle of the load: the restart then reads a base file written by the module's
    # rewrite callbacks in the fork (RDB preamble) plus the commands that followed it
    time.sleep(1.0)
    rewrites = int(server.info("persistence")["aof_rewrites"])
    assert con.bgrewriteaof()
    time.sleep(LOAD_SECONDS - 1.0)
    wait_for(lambda: int(server.info("persistence")["aof_rewrites"]) > rewrites, 15, what="the AOF rewrite")
    assert server.is_alive() and ledger.disconnects == [], ledger.disconnects
    t_kill = time.monotonic()
    os.kill(server.pid, signal.SIGKILL)  # mid-load: the writers are still sending
    server.proc.wait(10)
    stop.set()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads), "a writer did not notice the kill"
    server.kill()  # bookkeeping only (the process is gone)
    assert ledger.errors == [], ledger.errors
    assert all(t >= t_kill for t, _, _ in ledger.disconnects), ledger.disconnects
    assert ledger.disconnects, "no writer was cut off by the kill: it did not happen under load"

    cutoff = t_kill - FSYNC_PERIOD - MARGIN
    must = [(t, kind, key) for t, kind, key in ledger.acked if t < cutoff]
    kinds = {kind for _, kind, _ in must}
    # the test only proves something if every kind of write was acknowledged before the cutoff
    assert kinds >= {"tensor", "model:ONNX", "model:TF", "model:TORCH", "script", "output"}, kinds
    assert any(t < cutoff for _, t in ledger.counter)

    server.start()  # same port, directory and arguments: loads the AOF
    con = server.client()
    lost = [(kind, key) for _, kind, key in must if observed(con, key) is None]
    assert lost == [], f"{len(lost)} of {len(must)} writes acknowledged before the cutoff are gone: {lost[:10]}"
    wrong = [key for _, _, key in must if observed(con, key) != ledger.sent[key]]
    assert wrong == [], f"changed after the restart: {wrong[:10]}"
    # anything else that came back (written later, or in flight at the kill) is exactly what was sent
    present = {k.decode() for k in con.keys("*")}
    unknown = present - set(ledger.sent) - fixed
    assert unknown == set(), unknown
    torn = [k for k in present & set(ledger.sent) if observed(con, k) != ledger.sent[k]]
    assert torn == [], torn
    # the overwritten key holds a value from the cutoff on, never an older one
    last_before = max(v for v, t in ledger.counter if t < cutoff)
    value = con.execute_command("AI.TENSORGET", "counter", "VALUES")[0]
    assert last_before <= value <= ledger.counter_sent, (last_before, value, ledger.counter_sent)

    # what came back runs: one model of each backend and a script
    x = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32)
    set_tensor(con, "check:x", x)
    for kind in ("model:ONNX", "model:TF"):
        key = next(k for _, kd, k in must if kd == kind)
        assert con.execute_command("AI.MODELEXECUTE", key, "INPUTS", 2, "check:x", "check:x",
                                   "OUTPUTS", 1, "check:y") == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "check:y"), x * x)
    torch_key = next(k for _, kd, k in must if kd == "model:TORCH" and ledger.sent[k][3] == pt_blob("torch_add"))
    assert con.execute_command("AI.MODELEXECUTE", torch_key, "INPUTS", 2, "check:x", "check:x",
                               "OUTPUTS", 1, "check:y") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "check:y"), x + x)
    script_key = next(k for _, kd, k in must if kd == "script")
    n = int(script_key.split(":")[1])
    assert con.execute_command("AI.SCRIPTEXECUTE", script_key, "f", "INPUTS", 1, "check:x",
                               "OUTPUTS", 1, "check:y") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "check:y"), x + np.float32(n))
    after = [key for t, _, key in ledger.acked if t >= cutoff]
    counts = {k: sum(1 for _, kd, _ in must if kd == k) for k in sorted(kinds)}
    print(f"acknowledged: {len(ledger.acked)} ({len(must)} before the cutoff, all back: {counts}); "
          f"after the cutoff {sum(observed(con, k) is not None for k in after)} of {len(after)} came back")


# =================================================================================================
# a data set with every backend, for (b) and (c)

X = np.arange(8, dtype=np.float32).reshape(2, 4) / np.float32(3) - np.float32(1)
NEW_SRC = entry("add", "return tensors[0] + tensors[1]") + entry("scale", "return tensors[0] * float(args[0])")
OLD_SRC = "def bar(a, b):\n    return a + b\n\ndef double(a):\n    return a * 2\n"


def populate_all(con):
    """Tensors, models of every backend (with tags, batching, names) and scripts with and without entry
    points. Returns {key: what was sent} for the blobs and sources."""
    rng = np.random.default_rng(21)
    set_tensor(con, "t:x", X)
    set_tensor(con, "t:f64", rng.standard_normal((3, 2)))
    set_tensor(con, "t:i8", rng.integers(-128, 128, 7, dtype=np.int8))
    set_tensor(con, "t:u16", rng.integers(0, 65536, (2, 2, 2), dtype=np.uint16))
    con.execute_command("AI.TENSORSET", "t:bool", "BOOL", 4, "VALUES", 1, 0, 0, 1)
    con.execute_command("AI.TENSORSET", "t:str", "STRING", 3, "VALUES", "uno", "", "γειά")
    con.execute_command("AI.TENSORSET", "t:big", "FLOAT", 256, 1024, "BLOB",
                        rng.standard_normal(256 * 1024).astype(np.float32).tobytes())
    store(con, "m:onnx", "linear", "TAG", "onnx v1", "BATCHSIZE", 4, "MINBATCHSIZE", 2, "MINBATCHTIMEOUT", 20)
    store(con, "m:onnx2", "two_outputs", device="CPU:1")
    assert con.execute_command("AI.MODELSTORE", "m:tf", "TF", "cpu", "TAG", "tf", "INPUTS", 1, "x",
                               "OUTPUTS", 1, "y", "BLOB", tf_blob("dense")) == b"OK"
    pt_store(con, "m:torch", "torch_linear", "TAG", "pt", "BATCHSIZE", 2)
    pt_store(con, "m:torch2", "torch_two_outputs", device="CPU:1")
    script_store(con, "s:new", NEW_SRC, ["add", "scale"], tag="s1")
    script_set(con, "s:old", OLD_SRC, device="CPU:1", tag="old")
    return {"m:onnx": blob("linear"), "m:onnx2": blob("two_outputs"), "m:tf": tf_blob("dense"),
            "m:torch": pt_blob("torch_linear"), "m:torch2": pt_blob("torch_two_outputs"),
            "s:new": NEW_SRC.encode(), "s:old": OLD_SRC.encode()}


def snapshot(con):
    """Every key with its full GET reply (tensors META BLOB, models META BLOB, scripts META SOURCE)."""
    out = {}
    for k in sorted(con.keys("*")):
        t = con.type(k)
        if t == b"AI_TENSOR":
            out[k] = (t, con.execute_command("AI.TENSORGET", k, "META", "BLOB"))
        elif t == b"AI__MODEL":
            out[k] = (t, con.execute_command("AI.MODELGET", k, "META", "BLOB"))
        elif t == b"AI_SCRIPT":
            out[k] = (t, con.execute_command("AI.SCRIPTGET", k, "META", "SOURCE"))
        else:
            out[k] = (t, None)
    out["_modelscan"] = sorted(con.execute_command("AI._MODELSCAN"))
    out["_scriptscan"] = sorted(con.execute_command("AI._SCRIPTSCAN"))
    return out


def check_sent(snap, sent):
    for k, b in sent.items():
        t, reply = snap[k.encode()]
        assert reply[-1] == b, f"{k}: the stored blob/source is not what was sent"


# read-only DAGs: they run on a read-only replica too
RO_RUNS = {
    "m:onnx": ["AI.DAGEXECUTE_RO", "LOAD", 1, "t:x", "|>", "AI.MODELEXECUTE", "m:onnx", "INPUTS", 1, "t:x",
               "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "META", "BLOB"],
    "m:onnx2": ["AI.DAGEXECUTE_RO", "LOAD", 1, "t:x", "|>", "AI.MODELEXECUTE", "m:onnx2", "INPUTS", 1, "t:x",
                "OUTPUTS", 2, "p", "q", "|>", "AI.TENSORGET", "p", "BLOB", "|>", "AI.TENSORGET", "q", "BLOB"],
    "m:tf": ["AI.DAGEXECUTE_RO", "LOAD", 1, "t:x", "|>", "AI.MODELEXECUTE", "m:tf", "INPUTS", 1, "t:x",
             "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "META", "BLOB"],
    "m:torch": ["AI.DAGEXECUTE_RO", "LOAD", 1, "t:x", "|>", "AI.MODELEXECUTE", "m:torch", "INPUTS", 1, "t:x",
                "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "META", "BLOB"],
    "m:torch2": ["AI.DAGEXECUTE_RO", "LOAD", 1, "t:x", "|>", "AI.MODELEXECUTE", "m:torch2", "INPUTS", 1, "t:x",
                 "OUTPUTS", 2, "p", "q", "|>", "AI.TENSORGET", "p", "BLOB", "|>", "AI.TENSORGET", "q", "BLOB"],
    "s:old": ["AI.DAGRUN_RO", "LOAD", 1, "t:x", "|>", "AI.SCRIPTRUN", "s:old", "bar", "INPUTS", "t:x", "t:x",
              "OUTPUTS", "z", "|>", "AI.SCRIPTRUN", "s:old", "double", "INPUTS", "z", "OUTPUTS", "w",
              "|>", "AI.TENSORGET", "w", "BLOB"],
}


def ro_results(con):
    out = {k: con.execute_command(*cmd) for k, cmd in RO_RUNS.items()}
    for k, r in out.items():
        assert all(not isinstance(e, redis.exceptions.ResponseError) for e in r), (k, r)
    # sanity: what the models compute (the linear ones share the weights of tests/data/weights.py)
    from helpers.data import weights
    for k in ("m:onnx", "m:tf", "m:torch"):
        y = np.frombuffer(out[k][1][5], dtype=np.float32).reshape(out[k][1][3])
        np.testing.assert_allclose(y, weights.linear(X), rtol=1e-5, atol=1e-6)
    for k in ("m:onnx2", "m:torch2"):
        assert out[k][1] == (X + 1).tobytes() and out[k][2] == (X * 2).tobytes(), k
    assert out["s:old"][2] == ((X + X) * 2).tobytes()
    return out


# =================================================================================================
# (b) full sync to a replica


@pytest.mark.parametrize("load", ["disabled", "on-empty-db"])
def test_replica_full_sync_serves_the_same_data(make_server, make_replica, load):
    """repl-diskless-load disabled: the replica saves the RDB stream to disk and loads the file; on-empty-db: it loads
    straight from the socket (allowed because the module handles RDB read errors; `swapdb` would fall back to
    disk: the module does not declare REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD, nor did RedisAI)."""
    master = make_server(name="master")
    mcon = master.client()
    sent = populate_all(mcon)
    want = snapshot(mcon)
    check_sent(want, sent)
    results = ro_results(mcon)
    # a script with entry points, run on the master (SCRIPTEXECUTE is a write: not allowed on the replica)
    assert mcon.execute_command("AI.SCRIPTEXECUTE", "s:new", "scale", "INPUTS", 1, "t:x", "ARGS", 1, "3",
                                "OUTPUTS", 1, "t:scaled") == b"OK"
    want = snapshot(mcon)

    replica = make_replica(master, server_args=["--repl-diskless-load", load])
    assert master.info("stats")["sync_full"] == "1"
    assert ("EOF to disk" in replica.log()) == (load == "disabled")
    rcon = replica.client()
    assert snapshot(rcon) == want
    assert ro_results(rcon) == results
    # the replica refuses writes, AI.MODELEXECUTE included (it writes its outputs)
    reply = replica.raw("AI.MODELEXECUTE", "m:onnx", "INPUTS", 1, "t:x", "OUTPUTS", 1, "y")
    assert isinstance(reply, RespError) and reply.startswith("READONLY"), reply
    # and keeps following the master after the sync
    pt_store(mcon, "m:late", "torch_add")
    assert mcon.execute_command("WAIT", 1, 10000) == 1
    assert rcon.execute_command("AI.MODELGET", "m:late", "BLOB") == pt_blob("torch_add")


# =================================================================================================
# (c) RDB files


def test_rdb_written_by_module_loads_after_kill9(server):
    con = server.client()
    sent = populate_all(con)
    want = snapshot(con)
    check_sent(want, sent)
    results = ro_results(con)
    # the models go into the file in several chunks each
    assert con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 100) == b"OK"
    assert con.save() is True
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(10)
    server.kill()
    server.start()
    con = server.client()
    assert con.execute_command("AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 511 * 1024 * 1024  # not persisted
    assert snapshot(con) == want
    assert ro_results(con) == results


RDB_VERSION = 10  # Redis 7.0 writes and reads RDB 10; the recorded DUMP payloads carry 10 too


def rdb_from_dumps(payloads, checksum=True):
    """An RDB file holding `payloads` ({key: DUMP payload}) in database 0.

    DUMP payload: <type byte> <value as in an RDB> <RDB version, 2 bytes LE> <CRC64, 8 bytes LE>.
    RDB file: "REDIS" + 4-digit version, SELECTDB 0, then per key <type byte> <key as RDB string> <value>,
    then EOF (0xFF) and the CRC64 of everything before it (LE). Redis 7.0 skips the check when it is 0
    (rdbLoadRio: "RDB file was saved with checksum disabled: no check performed")."""
    out = [b"REDIS%04d" % RDB_VERSION, b"\xfe\x00"]
    for key, p in payloads.items():
        version = struct.unpack("<H", p[-10:-8])[0]
        assert version <= RDB_VERSION, (key, version)
        assert struct.unpack("<Q", p[-8:])[0] == crc64(p[:-8]), f"{key}: bad recorded payload"
        k = key.encode()
        out += [p[:1], rdb_len(len(k)), k, p[1:-10]]
    out.append(b"\xff")
    body = b"".join(out)
    return body + struct.pack("<Q", crc64(body) if checksum else 0)


@pytest.mark.parametrize("checksum", [True, False], ids=["crc64", "zero-checksum"])
def test_rdb_built_from_redisai_dumps_loads(make_server, checksum):
    assert RECORDED, "no recorded cases"
    for key in ("m:onnx", "m:onnx1", "m:tf", "m:torch", "s:1", "t:float:0", "t:string:0"):
        need_case(key)
    payloads = {key: bytes.fromhex(c["dump_hex"]) for key, c in RECORDED.items()}
    srv = make_server(start=False)
    (srv.dir / srv.dbfilename).write_bytes(rdb_from_dumps(payloads, checksum))
    srv.start()
    con = srv.client()
    assert con.dbsize() == len(payloads)
    types = {"tensor": b"AI_TENSOR", "model": b"AI__MODEL", "script": b"AI_SCRIPT"}
    for key, case in RECORDED.items():
        assert con.type(key) == types[case["kind"]], key
        for r in case["replies"]:
            assert_reply(r["reply"], con.execute_command(*r["cmd"]), where=" ".join(map(str, r["cmd"])))
        # loaded from the file = what RESTORE of the payload gives: our DUMP carries the same module payload
        assert payload_body(con.dump(key)) == payload_body(payloads[key]), key
    assert ("RDB file was saved with checksum disabled" in srv.log()) == (not checksum)

    # the models and the script run
    for key in ("m:onnx", "m:onnx1"):
        model_blob = con.execute_command("AI.MODELGET", key, "BLOB")
        assert model_blob == recorded_create(RECORDED[key])[-1]
        inputs, fn, width = recorded_model_function(model_blob)
        feeds = {n: np.random.default_rng(5).standard_normal((2, width) if width else (5,)).astype(np.float32)
                 for n in inputs}
        for n, arr in feeds.items():
            set_tensor(con, "in:" + n, arr)
        outs = [o.decode() for o in con.execute_command("AI.MODELGET", key, "META")[13]]
        assert con.execute_command("AI.MODELEXECUTE", key, "INPUTS", len(inputs), *["in:" + n for n in inputs],
                                   "OUTPUTS", len(outs), *["out:" + o for o in outs]) == b"OK"
        for o, want in zip(outs, fn(feeds)):
            np.testing.assert_allclose(get_tensor(con, "out:" + o), want, rtol=1e-5, atol=1e-6)
    a = np.array([1.5, -2.0, 3.25, 0.0, 1e-3], dtype=np.float32)
    b = np.array([4.0, 0.5, -2.0, 7.0, 1e3], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    for key, fn in (("m:tf", np.multiply), ("m:torch", np.add)):
        assert con.execute_command("AI.MODELEXECUTE", key, "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "c"), fn(a, b))
    assert con.execute_command("AI.SCRIPTEXECUTE", "s:1", "bar", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s:1", "baz", "INPUTS", 1, "a", "OUTPUTS", 1, "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * 2)


# --------------------------------------------------------------------------------------------------
# (d) DEFERRED_MODEL_BUILD: models from the RDB are built after loading, off the main thread, one at a time
# through a crash journal, so that a model whose build crashes the server cannot keep it down.

DEFERRED = ("DEFERRED_MODEL_BUILD", "yes")


def _modules_field(srv, name):
    return int(srv.info("modules")[f"ai_{name}"])


@pytest.mark.module_args(*DEFERRED)
def test_deferred_build_loads_models_after_the_rdb(server):
    con = server.client()
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[1, 2], [3, 4]], dtype=np.float32))
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] * 2\n")
    assert con.save()
    server.restart()
    con = server.client()
    # Right after the restart: the model is there (its data at once, its build in the background) and runs.
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), np.array([[1, 4], [9, 16]], dtype=np.float32))
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob("mul")
    wait_for(lambda: _modules_field(server, "models_pending_build") == 0, 30, what="the deferred build")
    assert _modules_field(server, "models_failed_build") == 0
    assert not (server.dir / "redisai-builds.journal").exists()


@pytest.mark.module_args(*DEFERRED)
def test_model_whose_build_crashes_cannot_keep_the_server_down(server, monkeypatch):
    con = server.client()
    store(con, "good", "mul")
    store(con, "crasher", "linear")
    set_tensor(con, "a", np.array([[1, 2], [3, 4]], dtype=np.float32))
    con.set("plain", "kept")
    assert con.save()
    server.stop()
    # The crasher's build takes the process down (as a backend bug would), after the RDB was loaded.
    monkeypatch.setenv("REDISAI_TEST_CRASH_BUILDING", "crasher")
    server._spawn_and_wait()
    server.proc.wait(timeout=60)
    assert server.proc.returncode != 0
    journal = server.dir / "redisai-builds.journal"
    assert journal.read_text().split()[1] == "crasher"
    # Started again (the crash would happen again if the model were built): the server serves everything.
    server.start()
    con = server.client()
    assert con.ping()
    assert con.get("plain") == b"kept"
    assert con.execute_command("AI.MODELEXECUTE", "good", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), np.array([[1, 4], [9, 16]], dtype=np.float32))
    with pytest.raises(redis.ResponseError, match="build crashed the server before"):
        con.execute_command("AI.MODELEXECUTE", "crasher", "INPUTS", 1, "a", "OUTPUTS", 1, "y")
    assert con.execute_command("AI.MODELGET", "crasher", "BLOB") == blob("linear")
    wait_for(lambda: _modules_field(server, "models_pending_build") == 0, 30, what="the deferred builds")
    assert _modules_field(server, "models_failed_build") == 1
    assert con.ping()
    # Stored again by a client, it is built as any MODELSTORE is, and no longer quarantined.
    monkeypatch.delenv("REDISAI_TEST_CRASH_BUILDING")
    store(con, "crasher", "linear")
    assert not journal.exists()
    set_tensor(con, "x", np.ones((1, 4), dtype=np.float32))
    con.execute_command("AI.MODELEXECUTE", "crasher", "INPUTS", 1, "x", "OUTPUTS", 1, "y")


@pytest.mark.module_args(*DEFERRED)
def test_a_run_of_a_model_still_building_waits_off_the_main_thread(server):
    """A MODELEXECUTE of a model whose deferred build is pending waits on a worker, not on Redis's main thread:
    PING answers meanwhile (big_model(4096)'s build takes seconds)."""
    from helpers.onnx_models import big_model

    con = server.client()
    big, a, _ = big_model(n=4096)
    con.execute_command("AI.MODELSTORE", "big", "ONNX", "CPU", "BLOB", big)
    x = np.ones((1, a.shape[0]), dtype=np.float32)
    set_tensor(con, "x", x)
    assert con.save()
    server.restart()
    con = server.client()
    reply = []
    runner = threading.Thread(target=lambda: reply.append(server.client().execute_command(
        "AI.MODELEXECUTE", "big", "INPUTS", 1, "x", "OUTPUTS", 1, "y")))
    runner.start()
    time.sleep(0.05)
    start = time.monotonic()
    assert con.ping()
    ping_s = time.monotonic() - start
    pending = _modules_field(server, "models_pending_build")
    runner.join(timeout=60)
    assert reply == [b"OK"], reply
    assert (pending, ping_s < 0.25) == (1, True), (pending, ping_s)


def test_without_deferred_build_models_are_built_while_loading(server):
    con = server.client()
    store(con, "m", "mul")
    assert con.save()
    server.restart()
    assert _modules_field(server, "models_pending_build") == 0
    assert not (server.dir / "redisai-builds.journal").exists()
