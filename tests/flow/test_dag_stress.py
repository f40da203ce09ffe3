"""DAG stress: many clients sending random DAGs over three device queues (`CPU`, `CPU:1`, `CPU:2`), with
failing ops (wrong dtype / shape inputs), reused names, random TIMEOUTs, parse errors and clients that
disconnect in the middle of a command. Every reply is checked against a Python model of the DAG semantics
(docs/commands.md, "AI.DAGEXECUTE"): reply length and entry kinds, which entries may be NA, the values of
TENSORGETs, PERSIST only when no op failed. Afterwards the server must be alive, its memory back to the baseline
after FLUSHALL, and the module's INFO must answer.

Environment: STRESS_CLIENTS (default 20), STRESS_DAGS per client (default 500), STRESS_SEED.
"""

import os
import random
import socket
import threading
import time

import numpy as np
import redis

from helpers.data import DATA_DIR, weights
from helpers.resp import encode_command


ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")

N_CLIENTS = int(os.environ.get("STRESS_CLIENTS", "20"))
N_DAGS = int(os.environ.get("STRESS_DAGS", "500"))
SEED = int(os.environ.get("STRESS_SEED", "20240611"))

DEVICES = ["CPU", "CPU:1", "CPU:2"]
MODEL_FILES = {"lin": "linear", "mul": "mul", "two": "two_outputs", "heavy": "heavy"}
SHARED = {  # keys every client may LOAD; never written during the stress
    "kA": np.array([[1, -0.5, 0, 0.5], [-1, 1, 0.5, -0.5]], dtype=np.float32),
    "kB": np.array([[0.5, 1, -1], [0, -0.5, 1]], dtype=np.float32),
    "kI": np.array([[1, 2, 3, 4], [-5, 6, -7, 8]], dtype=np.int32),
    # input of the (rare) heavy.onnx ops, which keep the queues busy long enough for TIMEOUTs to matter
    "kH": np.random.default_rng(11).uniform(-1, 1, (192, weights.HEAVY_WIDTH)).astype(np.float32),
}
MEMORY_SLACK = 2 * 1024 * 1024
E_INPUT_NOT_FOUND = "INPUT key cannot be found in DAG"
NP_OF = {b"FLOAT": np.float32, b"INT32": np.int32}


def blob(name):
    return (DATA_DIR / f"{name}.onnx").read_bytes()


def model_key(kind, dev):
    return f"{kind}@{dev}"


# --------------------------------------------------------------------------------------------------
# the model of the semantics


_HEAVY = {}


def run_model(kind, inputs):
    """The model's outputs for `inputs` (numpy arrays), or None if the backend must refuse them."""
    if kind == "lin":
        (a,) = inputs
        if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != 4:
            return None
        return [(a @ weights.LINEAR_W + weights.LINEAR_B).astype(np.float32)]
    if kind == "two":
        (a,) = inputs
        if a.dtype != np.float32 or a.ndim != 2:
            return None
        return [a + np.float32(1), a * np.float32(2)]
    if kind == "heavy":
        (a,) = inputs
        if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != weights.HEAVY_WIDTH:
            return None
        if a is SHARED["kH"]:  # the only input the generator gives it: compute once
            if "kH" not in _HEAVY:
                _HEAVY["kH"] = weights.heavy(a).astype(np.float32)
            return [_HEAVY["kH"]]
        return [weights.heavy(a).astype(np.float32)]
    if kind == "mul":
        a, b = inputs
        if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != 2 or b.ndim != 2:
            return None
        try:  # numpy broadcasting, as ONNX Mul (the symbolic dims of mul.onnx are not enforced)
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            return None
        return [a * b]
    raise AssertionError(kind)


class Op:
    def __init__(self, kind, words, **kw):
        self.kind = kind  # "set" | "get" | "model"
        self.words = words
        self.__dict__.update(kw)


class Dag:
    """A random DAG and what the module must answer to it."""

    def __init__(self, rng, cid):
        self.rng = rng
        self.cid = cid
        self.command = rng.choices(["AI.DAGEXECUTE", "AI.DAGEXECUTE_RO", "AI.DAGRUN", "AI.DAGRUN_RO"],
                                   [70, 15, 10, 5])[0]
        self.ro = self.command.endswith("_RO")
        self.deprecated = self.command.startswith("AI.DAGRUN")
        self.names = ["n0", "n1", "n2", "n3", "kA", f"c{cid}:p0", f"c{cid}:p1"]
        self.values = {}  # producer -> numpy value (only for producers whose inputs were all computable)
        self.current = {}  # name -> producer
        self.ops = []
        self.load = []
        self.persist = []
        self.timeout = None
        self.parse_error = None
        self.build()

    # -- generation

    def new_value(self):
        rng = self.rng
        shape = rng.choice([(2, 4), (2, 4), (2, 3), (1, 4)])
        if rng.random() < 0.15:
            vals = [rng.randint(-4, 4) for _ in range(shape[0] * shape[1])]
            return "INT32", shape, np.array(vals, dtype=np.int32).reshape(shape)
        vals = [rng.choice([-1, -0.5, 0, 0.25, 0.5, 1]) for _ in range(shape[0] * shape[1])]
        return "FLOAT", shape, np.array(vals, dtype=np.float32).reshape(shape)

    def add_load(self, key):
        if key not in self.load:
            self.load.append(key)
            self.current[key] = ("load", key)
            self.values[("load", key)] = SHARED[key]

    def build(self):
        rng = self.rng
        if rng.random() < 0.5:
            for key in rng.sample(["kA", "kB", "kI"], rng.randint(1, 2)):
                self.add_load(key)
        n_ops = rng.randint(1, 8)
        n_models = 0
        for i in range(n_ops):
            r = rng.random()
            if not self.current or r < 0.25:
                name = rng.choice(self.names)
                dtype, shape, arr = self.new_value()
                words = ["AI.TENSORSET", name, dtype, *shape, "VALUES", *arr.ravel().tolist()]
                prod = ("op", len(self.ops))
                self.values[prod] = arr
                self.ops.append(Op("set", words))
                self.current[name] = prod
            elif r < 0.45 or n_models >= 6:
                name = rng.choice(sorted(self.current))
                fmt = rng.choice([["VALUES"], ["META", "BLOB"], ["BLOB"], ["META"], [], ["META", "VALUES"]])
                self.ops.append(Op("get", ["AI.TENSORGET", name, *fmt], src=self.current[name], fmt=fmt))
            else:
                n_models += 1
                kind = "heavy" if rng.random() < 0.05 else rng.choice(["lin", "mul", "two"])
                dev = rng.choice(DEVICES)
                n_in = 2 if kind == "mul" else 1
                n_out = 2 if kind == "two" else 1
                if kind == "heavy":
                    self.add_load("kH")
                    inputs = ["kH"]
                else:
                    inputs = [rng.choice(sorted(self.current)) for _ in range(n_in)]
                outputs = rng.sample(self.names, n_out)
                key = model_key(kind, dev)
                if self.deprecated:
                    words = ["AI.MODELRUN", key, "INPUTS", *inputs, "OUTPUTS", *outputs]
                else:
                    words = ["AI.MODELEXECUTE", key, "INPUTS", n_in, *inputs, "OUTPUTS", n_out, *outputs]
                srcs = [self.current[n] for n in inputs]
                index = len(self.ops)
                prods = [("op", index, j) for j in range(n_out)]
                if all(s in self.values for s in srcs):
                    outs = run_model(kind, [self.values[s] for s in srcs])
                    pred_ok = outs is not None
                    if pred_ok:
                        for p, v in zip(prods, outs):
                            self.values[p] = v
                else:
                    pred_ok = None  # cannot run: an input never exists
                self.ops.append(Op("model", words, srcs=srcs, prods=prods, pred_ok=pred_ok))
                for name, p in zip(outputs, prods):
                    self.current[name] = p
        if not self.ro and rng.random() < 0.35:
            mine = [n for n in self.names if n.startswith(f"c{self.cid}:") and n in self.current]
            if mine:
                self.persist = rng.sample(mine, rng.randint(1, len(mine)))
        if rng.random() < 0.15:
            self.timeout = rng.choice([1, 2, 5, 1000])
        if rng.random() < 0.03:
            # a TENSORGET of a name no op sets: the whole command fails at parse time
            pos = rng.randint(0, len(self.ops))
            self.ops.insert(pos, Op("get", ["AI.TENSORGET", "never_set", "VALUES"], src=None, fmt=["VALUES"]))
            self.parse_error = E_INPUT_NOT_FOUND

    def argv(self, persist_rename=None):
        header = []
        if self.load:
            header += ["LOAD", len(self.load), *self.load]
        if self.persist:
            names = self.persist if persist_rename is None else [persist_rename(n) for n in self.persist]
            header += ["PERSIST", len(names), *names]
        if self.timeout is not None:
            header += ["TIMEOUT", self.timeout]
        if not self.deprecated and not self.load and not self.persist:
            header += ["ROUTING", f"{{r{self.rng.randint(0, 9)}}}"]
        out = [self.command, *header]
        for op in self.ops:
            words = op.words
            if persist_rename is not None:
                words = [persist_rename(w) if isinstance(w, str) and w in self.persist else w for w in words]
            out += ["|>", *words]
        return out

    # -- checking

    def check_reply(self, reply):
        """Returns (ok, any_error, problems)."""
        problems = []
        if self.parse_error:
            return False, True, [f"expected the error {self.parse_error!r}, got {reply!r}"]
        if reply == b"TIMEDOUT":
            if self.timeout is None:
                problems.append("TIMEDOUT without TIMEOUT")
            return False, True, problems
        if not isinstance(reply, list) or len(reply) != len(self.ops):
            return False, True, [f"reply of {len(reply) if isinstance(reply, list) else reply!r} entries for "
                                 f"{len(self.ops)} ops"]
        any_error = any(isinstance(e, redis.exceptions.ResponseError) for e in reply)
        done = {("load", k) for k in self.load}
        for i, (op, entry) in enumerate(zip(self.ops, reply)):
            where = f"op {i} ({' '.join(map(str, op.words[:2]))})"
            if op.kind == "set":
                if entry != b"OK":
                    problems.append(f"{where}: {entry!r} for a TENSORSET")
                done.add(("op", i))
            elif op.kind == "get":
                if op.src in done:
                    problems += check_tensor(where, entry, self.values[op.src], op.fmt)
                elif entry != b"NA":
                    problems.append(f"{where}: {entry!r} for a TENSORGET of a value never computed")
            else:
                runnable = all(s in done for s in op.srcs)
                if entry == b"OK":
                    if runnable and op.pred_ok:
                        done.update(op.prods)
                    else:
                        problems.append(f"{where}: OK but runnable={runnable} predicted={op.pred_ok}")
                elif isinstance(entry, redis.exceptions.ResponseError):
                    text = str(entry)
                    if not runnable or op.pred_ok is not False:
                        problems.append(f"{where}: error {text!r} but runnable={runnable} predicted={op.pred_ok}")
                    if not text or "internal error" in text or "panic" in text:
                        problems.append(f"{where}: suspicious error {text!r}")
                elif entry == b"NA":
                    if not any_error:
                        problems.append(f"{where}: NA in a DAG without any error")
                else:
                    problems.append(f"{where}: unexpected entry {entry!r}")
        if not any_error and any(op.kind == "model" and op.pred_ok is not True for op in self.ops):
            problems.append("no error although an op must fail")
        return not any_error, any_error, problems


def check_tensor(where, entry, expected, fmt):
    dtype = b"FLOAT" if expected.dtype == np.float32 else b"INT32"
    shape = list(expected.shape)
    fmt = [f.upper() for f in fmt] or ["META", "BLOB"]
    try:
        if fmt == ["META"]:
            ok = entry == [b"dtype", dtype, b"shape", shape]
            return [] if ok else [f"{where}: META {entry!r}, expected {dtype} {shape}"]
        if fmt == ["BLOB"]:
            got = np.frombuffer(entry, dtype=expected.dtype).reshape(expected.shape)
        elif fmt == ["VALUES"]:
            got = np.array([float(v) if isinstance(v, bytes) else v for v in entry], dtype=expected.dtype)
            got = got.reshape(expected.shape)
        else:
            if entry[:4] != [b"dtype", dtype, b"shape", shape]:
                return [f"{where}: META {entry[:4]!r}, expected {dtype} {shape}"]
            if fmt == ["META", "BLOB"]:
                assert entry[4] == b"blob"
                got = np.frombuffer(entry[5], dtype=expected.dtype).reshape(expected.shape)
            else:
                assert entry[4] == b"values"
                got = np.array([float(v) if isinstance(v, bytes) else v for v in entry[5]], dtype=expected.dtype)
                got = got.reshape(expected.shape)
    except Exception as e:  # a malformed entry
        return [f"{where}: cannot read {entry!r} as {fmt}: {e!r}"]
    return [] if close(got, expected) else [f"{where}: got {got.tolist()}, expected {expected.tolist()}"]


def close(got, expected):
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return False
    if expected.dtype == np.int32:
        return bool(np.array_equal(got, expected))
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    return bool(np.allclose(got, expected, rtol=1e-4, atol=1e-4 * scale))


def read_key(con, key):
    try:
        reply = con.execute_command("AI.TENSORGET", key, "META", "BLOB")
    except redis.exceptions.ResponseError as e:
        if str(e) == "tensor key is empty or in a different shard":
            return None
        raise
    return np.frombuffer(reply[5], dtype=NP_OF[reply[1]]).reshape(reply[3])


# --------------------------------------------------------------------------------------------------
# the clients


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []

    def add(self, what, n=1):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def problem(self, text):
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(text)
            self.counts["problems"] = self.counts.get("problems", 0) + 1


def disconnect_mid_command(port, argv, rng):
    data = encode_command(argv)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        if rng.random() < 0.3:
            s.sendall(data[: rng.randint(1, len(data) - 1)])  # half a command
        else:
            s.sendall(data)
        if rng.random() < 0.5:  # reset instead of a clean close
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    finally:
        s.close()


def client_main(server, cid, n_dags, stats):
    rng = random.Random(SEED * 1000 + cid)
    con = server.client(socket_timeout=120)
    persisted = {}  # key -> value this client last persisted (None: never)
    try:
        for i in range(n_dags):
            dag = Dag(rng, cid)
            if rng.random() < 0.03:
                # persist into keys nobody checks: the DAG may or may not complete
                disconnect_mid_command(server.port, dag.argv(persist_rename=lambda n: n + ":dc"), rng)
                stats.add("disconnects")
                continue
            argv = dag.argv()
            try:
                reply = con.execute_command(*argv)
            except redis.exceptions.ResponseError as e:
                if dag.parse_error and str(e) == dag.parse_error:
                    stats.add("parse errors")
                else:
                    stats.problem(f"client {cid} dag {i}: error {str(e)!r} for {argv!r}")
                continue
            ok, any_error, problems = dag.check_reply(reply)
            for p in problems:
                stats.problem(f"client {cid} dag {i}: {p}; command {argv!r}; reply {reply!r}")
            stats.add("timed out" if reply == b"TIMEDOUT" else "with an error" if any_error else "all ok")
            if dag.persist:
                if ok:
                    for name in dag.persist:
                        persisted[name] = dag.values[dag.current[name]]
                    stats.add("persisted")
                for name in dag.persist:
                    got, want = read_key(con, name), persisted.get(name)
                    if (got is None) != (want is None) or (want is not None and not close(got, want)):
                        stats.problem(f"client {cid} dag {i}: key {name} holds {got!r}, expected {want!r} "
                                      f"(reply {reply!r})")
    except Exception as e:  # a broken connection, a crash: report, do not hang the other threads
        stats.problem(f"client {cid}: {type(e).__name__}: {e}")
    finally:
        con.close()


def used_memory(server):
    return int(server.info("memory")["used_memory"])


def settle_memory(server, con, bound, timeout=20.0):
    """used_memory once it is <= bound (or the last value after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        m = used_memory(server)
        if m <= bound or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def store_models(con):
    for dev in DEVICES:
        for kind, name in MODEL_FILES.items():
            assert con.execute_command("AI.MODELSTORE", model_key(kind, dev), "ONNX", dev, "BLOB", blob(name)) == b"OK"
    for key, arr in SHARED.items():
        dtype = "FLOAT" if arr.dtype == np.float32 else "INT32"
        assert con.execute_command("AI.TENSORSET", key, dtype, *arr.shape, "BLOB", arr.tobytes()) == b"OK"


def test_dag_stress(make_server):
    server = make_server(module_args=["THREADS_PER_QUEUE", "2", "INTRA_OP_PARALLELISM", "1"])
    con = server.client()

    # warm up every queue and model once (queues, threads, ORT sessions), then measure the baseline
    store_models(con)
    warm = Stats()
    client_main(server, 999, 40, warm)
    assert not warm.problems, warm.problems
    assert con.flushall() is True
    time.sleep(0.5)
    baseline = min(used_memory(server) for _ in range(3))

    store_models(con)
    stats = Stats()
    threads = [threading.Thread(target=client_main, args=(server, cid, N_DAGS, stats)) for cid in range(N_CLIENTS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    total = N_CLIENTS * N_DAGS
    print(f"\nDAG stress: {N_CLIENTS} clients x {N_DAGS} DAGs = {total} in {elapsed:.1f} s "
          f"({total / elapsed:.0f}/s); {dict(sorted(stats.counts.items()))}")
    assert not stats.problems, "\n".join(stats.problems[:20])
    assert stats.counts.get("all ok", 0) > total // 4 and stats.counts.get("with an error", 0) > 0
    assert stats.counts.get("disconnects", 0) > 0

    # alive and still right
    assert con.ping() is True
    for key, arr in SHARED.items():  # ops wrote names like kA, never the keys
        assert np.array_equal(read_key(con, key), arr), key
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "kA", "|>", "AI.MODELEXECUTE", "lin@CPU:2", "INPUTS", 1,
                              "kA", "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "META", "BLOB")
    assert ret[0] == b"OK"
    got = np.frombuffer(ret[1][5], dtype=np.float32).reshape(ret[1][3])
    assert close(got, weights.linear(SHARED["kA"]))

    # memory back to the baseline once the keyspace is flushed and the clients are gone
    assert con.flushall() is True
    m = settle_memory(server, con, baseline + MEMORY_SLACK)
    print(f"used_memory: baseline {baseline}, after {m} (+{m - baseline} bytes)")
    assert m <= baseline + MEMORY_SLACK, f"used_memory {m} > baseline {baseline} + {MEMORY_SLACK}"
    info = server.raw("INFO", "MODULES")
    assert isinstance(info, bytes) and b"ai_RedisAI_version" in info, info
    assert int(server.info("clients")["blocked_clients"]) == 0
