"""Benchmarks printed as numbers (ratios against baselines measured in the same run). `make bench` runs it.

1. Throughput and latency of a tiny-model AI.MODELEXECUTE, and of a LOAD -> MODELEXECUTE -> TENSORGET DAG, against
   PING on the same server, 50 clients (redis-benchmark), and their ratio; the single-client p50 round trip.
2. Idle CPU of a server with the module (queues created, nothing running) against a plain redis-server.
3. One AI.DAGEXECUTE (TENSORSET |> MODELEXECUTE |> TENSORGET) against the same flow as three commands.
4. A DAG with two equal compute-heavy branches on CPU and CPU:1 against the same DAG with both on CPU
   (INTRA_OP_PARALLELISM 1, so each branch uses one core).
5. A compute-bound model (heavy.onnx, one row per request) at 16 clients with and without BATCHSIZE 16.
6. used_memory per small tensor key (FLOAT [4]) over 100,000 keys, against a 16-byte string key (SET).
7. Main-thread time of AI.TENSORSET with a 16 MB BLOB against SET of the same 16 MB (INFO commandstats).
8. RedisAI's fraud-scoring workload: a small TF graph (inputs `transaction` FLOAT [1,30] and `reference` FLOAT
   [1,256], three dense layers, output [1,2]) at 16 clients, against PING.
9. A compute-bound model at batch 1 (heavy.onnx, one row): the module's round trip against ONNX Runtime's own run
   in a process of its own (examples/ort_inprocess.rs).
10. Single-client latency at default settings, per backend (the same compute-bound MLP, 24 x (256x256 MatMul +
   Tanh), as heavy.onnx, a TF graph and a TorchScript function) at 1 and 64 rows: p50/p99 of the command and of
   PING interleaved with it, beside the same backend's run in a process without Redis, with the same load options
   and threads (examples/backend_inprocess.rs). A backend that runs slower inside the module than alone, or a
   default that costs latency, shows here. `latency-intra1`: the same with INTRA_OP_PARALLELISM 1 in both (the
   batch-1 overhead, p50 minus the in-process run minus PING). Each row also has the in-process runs paced as a
   lone client's worker sees them (a pause before each), and the overhead against those.
"""
import argparse
import csv
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get("REDISAI_MODULE", os.path.join(ROOT, "target/release/libredisai.so"))
# Load-time arguments every module server of the run gets (--module-args), e.g. EXECUTION_MODE ISOLATED.
MODULE_ARGS = []
ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")
TF_LIB = os.environ.get("REDISAI_TF_LIB")
SERVER = os.environ.get("REDIS_SERVER", "redis-server")
DATA = os.path.join(ROOT, "tests", "data")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, module=True, extra=()):
        self.dir = tempfile.mkdtemp(prefix="redisai-bench-")
        self.port = free_port()
        args = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")]
        if module:
            args += ["--loadmodule", MODULE] + (["ONNX", ONNX_LIB] if ONNX_LIB else []) + MODULE_ARGS + list(extra)
        self.proc = subprocess.Popen(args)
        for _ in range(3000):  # 30 s: a cold start loads TensorFlow's libraries from disk
            if self.cli("PING", check=False) == "PONG":
                return
            time.sleep(0.01)
        raise RuntimeError("server did not start")

    def cli(self, *args, stdin=None, check=True):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], input=stdin, capture_output=True, check=check)
        return r.stdout.decode().strip()

    def cpu(self):
        """CPU seconds so far of Redis's main thread, of its other threads (the module's queues, lanes and
        Redis's own background threads) and of the backend workers it started (EXECUTION_MODE ISOLATED)."""
        pid = self.proc.pid
        main = schedstat_seconds(pid, pid)
        return main, process_cpu(pid) - main, sum(process_cpu(w) for w in children(pid))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_benchmark(port, clients, requests, *command):
    """(requests/s, p50 ms, p99 ms); options such as `-r N` may lead `command`."""
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests), "--csv", *command],
                         capture_output=True, check=True, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    r = rows[-1]
    return float(r["rps"]), float(r["p50_latency_ms"]), float(r["p99_latency_ms"])


def schedstat_seconds(pid, tid):
    """CPU seconds a thread has run (/proc/<pid>/task/<tid>/schedstat, in ns: ticks are 10 ms)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def process_cpu(pid):
    """CPU seconds of every thread of `pid` alive now."""
    try:
        return sum(schedstat_seconds(pid, tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0.0


def children(pid):
    """The processes `pid` started that are still running (the module's backend workers), whichever of its
    threads started them."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        pass
    return out


def command_usec(server, name):
    """(calls, usec) of `name` in INFO commandstats: the time Redis spent inside the command itself, reading,
    parsing and writing around it excluded."""
    out = server.cli("INFO", "commandstats")
    for line in out.splitlines():
        if line.startswith("cmdstat_%s:" % name.lower()):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].strip().split(","))
            return int(fields["calls"]), float(fields["usec"])
    return 0, 0.0


def cpu_per_request(server, requests, *command, clients=50):
    """redis_benchmark() plus the CPU microseconds per request of the server's main thread, of its other
    threads (the module's queue workers), of the backend worker processes (isolated), of redis-benchmark itself
    (the load generator shares the cores), and the microseconds per call Redis spent inside the command (INFO
    commandstats)."""
    before, child_before, stat_before = server.cpu(), os.times(), command_usec(server, command[0])
    result = redis_benchmark(server.port, clients, requests, *command)
    after, child_after, stat_after = server.cpu(), os.times(), command_usec(server, command[0])
    client = (child_after.children_user + child_after.children_system
              - child_before.children_user - child_before.children_system)
    calls = stat_after[0] - stat_before[0]
    inside = (stat_after[1] - stat_before[1]) / calls if calls else 0.0
    used = tuple(a - b for a, b in zip(after, before)) + (client,)
    return result, tuple(1e6 * x / requests for x in used) + (inside,)


EXECUTE = ("AI.MODELEXECUTE", "m", "INPUTS", "2", "a", "b", "OUTPUTS", "1", "c")
DAG = ("AI.DAGEXECUTE", "LOAD", "2", "a", "b", "|>", "AI.MODELEXECUTE", "m", "INPUTS", "2", "a", "b", "OUTPUTS", "1",
       "c", "|>", "AI.TENSORGET", "c", "VALUES")


def prepare_tiny(s):
    """Stores the tiny model `m` (mul.onnx) and its inputs `a` and `b` on server `s`, and runs EXECUTE and DAG
    ten times (their first runs are never inline), checking their replies."""
    with open(os.path.join(DATA, "mul.onnx"), "rb") as f:
        s.cli("-x", "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", stdin=f.read())
    s.cli("AI.TENSORSET", "a", "FLOAT", "2", "2", "VALUES", "1", "2", "3", "4")
    s.cli("AI.TENSORSET", "b", "FLOAT", "2", "2", "VALUES", "5", "6", "7", "8")
    for _ in range(10):
        assert s.cli(*EXECUTE) == "OK"
        assert s.cli(*DAG).split() == ["OK", "5", "12", "21", "32"]


def bench_execute(requests):
    """The tiny model against PING, as MODELEXECUTE and as a LOAD -> MODELEXECUTE -> TENSORGET DAG, with the
    default INLINE_THRESHOLD (short runs inline on the main thread) and with INLINE_THRESHOLD 0 (every run
    handed to a worker), each on its own server."""
    rows = []
    for label, extra in (("inline (default)", ()), ("queued (INLINE_THRESHOLD 0)", ("INLINE_THRESHOLD", "0"))):
        s = Server(extra=extra)
        try:
            prepare_tiny(s)
            redis_benchmark(s.port, 50, requests // 10, "PING")  # warm-up
            ping, ping_cpu = cpu_per_request(s, requests, "PING")
            execute, exec_cpu = cpu_per_request(s, requests, *EXECUTE)
            dag, dag_cpu = cpu_per_request(s, requests, *DAG)
            # PING again: the development machine switches between a fast and a slow mode (system calls cost
            # half as much in the fast one), which would make ratios across a switch meaningless.
            ping_after = cpu_per_request(s, requests, "PING")[0]
            if abs(ping_after[0] - ping[0]) > 0.1 * min(ping_after[0], ping[0]):
                print("WARNING (%s): PING ran at %.0f req/s before the commands and %.0f after: the machine changed "
                      "speed during the measurement, so its ratios mix two speeds; run it again"
                      % (label, ping[0], ping_after[0]))
            single = single_client_p50(s.port, 5000)
        finally:
            s.stop()
        rows.append((label, ping, ping_cpu, (("MODELEXECUTE", execute, exec_cpu, 0.9),
                                             ("DAG", dag, dag_cpu, 0.85))))
        print("single client, %s: p50 PING %.1f us, MODELEXECUTE %.1f us, ratio %.2f (target <= 1.3), 5000 each, "
              "interleaved" % (label, single[0], single[1], single[1] / single[0]))
    ort = ort_inprocess_p50("mul.onnx", 2, 20000) if (os.cpu_count() or 1) <= 2 else None
    print("== tiny model (mul.onnx, 2x2) vs PING, 50 clients, %d requests each; DAG: LOAD 2 a b |> "
          "AI.MODELEXECUTE |> AI.TENSORGET c VALUES" % requests)
    row = "%-34s %12.0f %10.3f %10.3f %12.2f %14.2f %14.2f %14.2f %12.2f"
    print("%-34s %12s %10s %10s %12s %14s %14s %14s %12s" % ("command", "req/s", "p50 ms", "p99 ms", "main us/req",
                                                             "threads us/req", "workers us/req", "client us/req",
                                                             "in command"))
    for label, ping, ping_cpu, commands in rows:
        print(row % ("PING", *ping, *ping_cpu))
        for name, result, cpu, _ in commands:
            print(row % (name + " " + label.split()[0], *result, *cpu))
        for name, result, cpu, target in commands:
            print("throughput ratio %s/PING, %s: %.3f (target >= %s)" % (name, label, result[0] / ping[0], target))
            if (os.cpu_count() or 1) <= 2 and label.startswith("inline"):
                explain_ceiling(name, target, ping, ping_cpu, result, cpu, ort)


def explain_ceiling(name, target, ping, ping_cpu, result, cpu, ort):
    """Where the per-request time goes when a single-threaded server and a single-threaded load generator share
    two cores: each process has a core, so throughput is bounded by the busier one. PING is bounded by
    redis-benchmark; an inline command by the server's main thread (busy ~100% of the time)."""
    main, _, _, client, inside = cpu
    print("  main thread busy %.2f of a core (PING: redis-benchmark busy %.2f): the ratio is PING's client time "
          "per request over %s's main-thread time" % (main * result[0] / 1e6, ping_cpu[3] * ping[0] / 1e6, name))
    needed = 1e6 / (target * ping[0])
    around = main - inside
    print("  the target needs the main thread at <= %.2f us per request; it takes %.2f: Redis's own work around "
          "the command (read, parse, reply, write) %.2f, inside the command (INFO commandstats) %.2f"
          % (needed, main, around, inside))
    if ort is not None:
        print("  ONNX Runtime's own run of this model (in-process, C API, input values made once, as a session keeps "
              "them) takes %.2f: a module whose command cost only that would run at %.3f of PING; the target leaves "
              "the module's own code %.2f us per request (it uses %.2f)"
              % (ort, 1e6 / (around + ort) / ping[0], needed - around - ort, inside - ort))


def resp(*args):
    """A command encoded once as RESP, so that the timed loop does no client-side packing."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def single_client_p50(port, n, command=EXECUTE):
    """p50 round trip (us) of PING and of `command` (a MODELEXECUTE) from one client, interleaved."""
    ping, run = single_client(port, n, command)
    return ping[0], run[0]


def single_client(port, n, command=EXECUTE):
    """(p50, p99) round trip (us) of PING and of `command` (a MODELEXECUTE) from one client, interleaved. Requests
    are encoded in advance and both replies are one line (+PONG, +OK), so the time is the server's round trip,
    not a client library's packing and parsing of nine arguments against one."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    requests = {"ping": (resp("PING"), b"+PONG\r\n"), "exec": (resp(*command), b"+OK\r\n")}
    times = {"ping": [], "exec": []}
    for _ in range(n):
        for name, (request, expected) in requests.items():
            t0 = time.perf_counter()
            sock.sendall(request)
            reply = sock.recv(64)
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(64)
            times[name].append(time.perf_counter() - t0)
            assert reply == expected, reply
    sock.close()

    def quantiles(t):
        t = sorted(t)
        return t[n // 2] * 1e6, t[min(n - 1, int(n * 0.99))] * 1e6
    return quantiles(times["ping"]), quantiles(times["exec"])


ORT_INPROCESS = os.environ.get("REDISAI_ORT_INPROCESS",
                               os.path.join(ROOT, "target", "release", "examples", "ort_inprocess"))


def ort_inprocess_p50(model, rows, runs):
    """p50 us of one ONNX Runtime run of tests/data/<model> in a process of its own (examples/ort_inprocess.rs,
    built by `make bench`), with the module's library and session options; None when it is not built."""
    if not (ONNX_LIB and os.path.exists(ORT_INPROCESS)):
        print("  (no in-process baseline: build it with `cargo build --release --example ort_inprocess`)")
        return None
    out = subprocess.run([ORT_INPROCESS, ONNX_LIB, os.path.join(DATA, model), str(rows), str(runs)],
                         capture_output=True, check=True, text=True).stdout
    return float(out.split()[-1])


def bench_heavy_batch1(n):
    """A compute-bound model at batch 1 (heavy.onnx, one row): the module's round trip against ONNX Runtime's
    own run in a process of its own, alternated twice; the overhead should be at most a PING round trip + 50 us."""
    import random
    import struct

    s = Server()
    try:
        with open(os.path.join(DATA, "heavy.onnx"), "rb") as f:
            s.cli("-x", "AI.MODELSTORE", "h", "ONNX", "CPU", "BLOB", stdin=f.read())
        row = struct.pack("<256f", *(random.random() for _ in range(256)))
        s.cli("-x", "AI.TENSORSET", "x", "FLOAT", "1", "256", "BLOB", stdin=row)
        command = ("AI.MODELEXECUTE", "h", "INPUTS", "1", "x", "OUTPUTS", "1", "y")
        single_client_p50(s.port, 200, command)  # warm-up
        rounds = []
        for _ in range(2):
            ping, module = single_client_p50(s.port, n, command)
            rounds.append((ping, module, ort_inprocess_p50("heavy.onnx", 1, n)))
        inline, queued = (modules_field(s, f) for f in ("ai_inline_runs", "ai_queued_runs"))
    finally:
        s.stop()
    print("== heavy.onnx, one row, single client, %d runs each, two rounds (p50 us)" % n)
    for ping, module, ort in rounds:
        if ort is None:
            print("module round trip %.1f, PING %.1f" % (module, ping))
            continue
        print("module round trip %.1f, in-process ONNX Runtime run %.1f, PING %.1f: overhead %.1f us (target <= PING "
              "+ 50 = %.1f)" % (module, ort, ping, module - ort, ping + 50))
    print("runs inline / queued: %s / %s" % (inline, queued))


BACKEND_INPROCESS = os.environ.get("REDISAI_BACKEND_INPROCESS",
                                   os.path.join(ROOT, "target", "leakcheck", "release", "examples", "backend_inprocess"))
TORCH_LIB = os.environ.get("REDISAI_TORCH_LIB", os.path.join(os.path.dirname(MODULE), "libredisai_torch.so"))

# The MLP of tests/data/heavy.onnx, as a TorchScript entry point (its weights are the second input).
MLP_SCRIPT = """def mlp(tensors: List[Tensor], keys: List[str], args: List[str]):
    x = tensors[0]
    w = tensors[1]
    for i in range(24):
        x = torch.tanh(torch.matmul(x, w))
    return x
"""


def mlp_graph():
    """tests/data/heavy.onnx's MLP (x [-1, 256], 24 x (MatMul W + Tanh), y) as a TF GraphDef."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "flow"))
    sys.path.insert(0, DATA)
    from helpers.tf_graphs import DT_FLOAT, a_bool, a_tensor, a_type, graph_def, node_def, placeholder
    from weights import HEAVY_DEPTH, HEAVY_W, HEAVY_WIDTH

    f = ("T", a_type(DT_FLOAT))
    nodes = [placeholder("x", DT_FLOAT, [-1, HEAVY_WIDTH]),
             node_def("W", "Const", attrs=[("dtype", a_type(DT_FLOAT)),
                                           ("value", a_tensor(DT_FLOAT, list(HEAVY_W.shape), content=HEAVY_W.tobytes()))])]
    prev = "x"
    for i in range(HEAVY_DEPTH):
        nodes.append(node_def(f"m{i}", "MatMul", [prev, "W"], [f, ("transpose_a", a_bool(False)),
                                                               ("transpose_b", a_bool(False))]))
        prev = "y" if i == HEAVY_DEPTH - 1 else f"t{i}"
        nodes.append(node_def(prev, "Tanh", [f"m{i}"], [f]))
    return graph_def(nodes)


def inprocess(backend, path, rows, runs, *extra):
    """(p50, p99) us of the backend's own run in a process without Redis (examples/backend_inprocess.rs), or None
    when it is not built."""
    if not os.path.exists(BACKEND_INPROCESS):
        return None
    out = subprocess.run([BACKEND_INPROCESS, backend, path, str(rows), "256", str(runs), *extra],
                         capture_output=True, check=True, text=True).stdout.split()
    return float(out[out.index("p50_us") + 1]), float(out[out.index("p99_us") + 1])


def bench_latency(runs, intra=None):
    """Single client, default settings (nothing but the backend libraries given at load; `intra`: with
    INTRA_OP_PARALLELISM, in both): per backend and rows, the command's and PING's p50/p99 and the in-process
    run's."""
    import struct
    import random

    rng = random.Random(5)
    work = tempfile.mkdtemp(prefix="redisai-latency-")
    tf_path, script_path = os.path.join(work, "mlp.pb"), os.path.join(work, "mlp.py")
    cases = [("ONNX", "heavy.onnx", os.path.join(DATA, "heavy.onnx"), (f"lib={ONNX_LIB}",) if ONNX_LIB else ())]
    if TF_LIB:
        with open(tf_path, "wb") as f:
            f.write(mlp_graph())
        cases.append(("TF", "MLP graph", tf_path, ("inputs=x", "outputs=y", f"lib={TF_LIB}")))
    if os.path.exists(TORCH_LIB):
        with open(script_path, "w") as f:
            f.write(MLP_SCRIPT)
        cases.append(("TORCH", "MLP script", script_path, ("function=mlp", f"lib={TORCH_LIB}")))
    rows_list = (1, 64)
    if intra:
        cases = [(b, n, p, (*e, f"intra={intra}")) for b, n, p, e in cases]
    s = Server(extra=(["TF", TF_LIB] if TF_LIB else []) + (["INTRA_OP_PARALLELISM", str(intra)] if intra else []))
    results = []
    try:
        for rows in rows_list:
            blob = struct.pack(f"<{rows * 256}f", *(rng.random() - 0.5 for _ in range(rows * 256)))
            s.cli("-x", "AI.TENSORSET", f"x{rows}", "FLOAT", str(rows), "256", "BLOB", stdin=blob)
        w = struct.pack("<65536f", *(rng.random() / 16 - 1 / 32 for _ in range(65536)))
        s.cli("-x", "AI.TENSORSET", "w", "FLOAT", "256", "256", "BLOB", stdin=w)
        for backend, _, path, _ in cases:
            if backend == "TORCH":
                with open(path) as f:
                    reply = s.cli("-x", "AI.SCRIPTSTORE", "torch", "CPU", "ENTRY_POINTS", "1", "mlp", "SOURCE",
                                  stdin=f.read().encode())
            else:
                io_args = ["INPUTS", "1", "x", "OUTPUTS", "1", "y"] if backend == "TF" else []
                with open(path, "rb") as f:
                    reply = s.cli("-x", "AI.MODELSTORE", backend.lower(), backend, "CPU", *io_args, "BLOB",
                                  stdin=f.read())
            assert reply == "OK", (backend, reply)
        for backend, name, path, extra in cases:
            for rows in rows_list:
                n = runs if rows == 1 else max(50, runs // 8)
                if backend == "TORCH":
                    cmd = ("AI.SCRIPTEXECUTE", "torch", "mlp", "INPUTS", "2", f"x{rows}", "w", "OUTPUTS", "1", "y")
                else:
                    cmd = ("AI.MODELEXECUTE", backend.lower(), "INPUTS", "1", f"x{rows}", "OUTPUTS", "1", "y")
                single_client(s.port, max(20, n // 10), cmd)  # warm-up
                ping, module = single_client(s.port, n, cmd)
                alone = inprocess(backend, path, rows, n, *extra)
                # The same runs with the pause a lone client's worker has between them (its round trip less the
                # run): caches cool meanwhile, which the module's figure pays and a back-to-back loop does not.
                paced = alone and inprocess(backend, path, rows, n, *extra,
                                            f"gap_us={max(0, int(module[0] - alone[0]))}")
                results.append((backend, name, rows, ping, module, alone, paced))
    finally:
        s.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("== single client, %s: p50 / p99 us (module: the command's round trip; in-process: the "
          "backend's run through the module's seam, without Redis)" %
          (f"INTRA_OP_PARALLELISM {intra}" if intra else "default settings"))
    print("%-7s %-11s %5s %17s %17s %17s %12s %12s %17s %12s" % (
        "backend", "model", "rows", "module", "in-process", "PING", "p50 overhead", "minus PING", "in-process paced",
        "minus PING"))
    for backend, name, rows, ping, module, alone, paced in results:
        a = "%8.1f /%7.1f" % alone if alone else "%17s" % "(not built)"
        over = "%9.1f" % (module[0] - alone[0]) if alone else "%9s" % "-"
        net = "%9.1f" % (module[0] - alone[0] - ping[0]) if alone else "%9s" % "-"
        p = "%8.1f /%7.1f" % paced if paced else "%17s" % "-"
        pnet = "%9.1f" % (module[0] - paced[0] - ping[0]) if paced else "%9s" % "-"
        print("%-7s %-11s %5d %8.1f /%7.1f %s %8.1f /%7.1f %12s %12s %s %12s" % (
            backend, name, rows, *module, a, *ping, over, net, p, pnet))
    print("  (paced: the in-process runs with the pause between them that the module's worker has, a sleep of the "
          "module's p50 less the run; 'minus PING' after it is the overhead against that)")
    if not os.path.exists(BACKEND_INPROCESS):
        print("  (no in-process figures: build examples/backend_inprocess.rs, as `make bench` does)")


def modules_field(server, name):
    for line in server.cli("INFO", "MODULES").splitlines() + server.cli("INFO", "ai_redisai_rs").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return "?"


def bench_idle(seconds):
    results = {}
    for name, module in (("plain redis-server", False), ("with redisai", True)):
        s = Server(module=module)
        try:
            if module:
                with open(os.path.join(DATA, "mul.onnx"), "rb") as f:
                    for dev in ("CPU", "CPU:1"):
                        s.cli("-x", "AI.MODELSTORE", "m" + dev, "ONNX", dev, "BLOB", stdin=f.read() if dev == "CPU" else blob)
                        if dev == "CPU":
                            f.seek(0)
                            blob = f.read()
                s.cli("AI.TENSORSET", "a", "FLOAT", "1", "VALUES", "1")
                for dev in ("CPU", "CPU:1"):
                    s.cli("AI.MODELEXECUTE", "m" + dev, "INPUTS", "2", "a", "a", "OUTPUTS", "1", "c")
            time.sleep(1)
            before = s.cpu()
            time.sleep(seconds)
            results[name] = [a - b for a, b in zip(s.cpu(), before)]
        finally:
            s.stop()
    print("== idle CPU over %d s (two device queues created on the module server): Redis's main thread, its other "
          "threads, the backend workers (isolated)" % seconds)
    for name, (main, threads, workers) in results.items():
        total = main + threads + workers
        print("%-20s %7.1f ms CPU (%.3f%% of one core): main %.1f, threads %.1f, workers %.1f"
              % (name, 1e3 * total, 100 * total / seconds, 1e3 * main, 1e3 * max(threads, 0), 1e3 * workers))
    plain, module = (sum(results[n]) for n in ("plain redis-server", "with redisai"))
    print("with redisai over plain Redis: %.1f ms in %d s (%.2f ticks of 10 ms; target <= 1 tick)"
          % (1e3 * (module - plain), seconds, 100 * (module - plain)))


def latency(fn, n):
    """Median and p99 of n sequential calls, in ms."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def bench_dag_vs_commands(n):
    import redis

    s = Server()
    try:
        r = redis.Redis(port=s.port)
        with open(os.path.join(DATA, "linear.onnx"), "rb") as f:
            r.execute_command("AI.MODELSTORE", "lin", "ONNX", "CPU", "BLOB", f.read())
        blob = bytes(16)

        def three():
            r.execute_command("AI.TENSORSET", "x", "FLOAT", 1, 4, "BLOB", blob)
            r.execute_command("AI.MODELEXECUTE", "lin", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
            r.execute_command("AI.TENSORGET", "y", "BLOB")

        def dag():
            r.execute_command("AI.DAGEXECUTE", "ROUTING", "x", "|>", "AI.TENSORSET", "x", "FLOAT", 1, 4, "BLOB", blob,
                              "|>", "AI.MODELEXECUTE", "lin", "INPUTS", 1, "x", "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "BLOB")

        latency(three, n // 10)
        cmds = latency(three, n)
        dags = latency(dag, n)
    finally:
        s.stop()
    print("== TENSORSET + MODELEXECUTE + TENSORGET (linear.onnx), %d sequential runs" % n)
    print("three commands: p50 %.3f ms  p99 %.3f ms" % cmds)
    print("one DAGEXECUTE: p50 %.3f ms  p99 %.3f ms" % dags)
    print("DAG/commands p50 ratio: %.3f" % (dags[0] / cmds[0]))


def bench_two_devices(n, batch):
    import struct

    # The tests' plain-socket client (standard library only: redis-py may be missing where scripts/cores-check.sh
    # runs the bench); an error reply stops the bench, as redis-py's exception did.
    sys.path.insert(0, os.path.join(ROOT, "tests", "flow"))
    from helpers.resp import RawClient, RespError

    def call(*args):
        reply = r.call(*args)
        if isinstance(reply, RespError):
            raise RuntimeError(reply)
        return reply

    s = Server(extra=["INTRA_OP_PARALLELISM", "1"])
    try:
        r = RawClient(s.port)
        with open(os.path.join(DATA, "heavy.onnx"), "rb") as f:
            heavy = f.read()
        for key, dev in (("h_cpu", "CPU"), ("h_cpu_b", "CPU"), ("h_cpu1", "CPU:1")):
            call("AI.MODELSTORE", key, "ONNX", dev, "BLOB", heavy)
        call("AI.TENSORSET", "x", "FLOAT", batch, 256, "BLOB", struct.pack("<%df" % (batch * 256), *([0.01] * (batch * 256))))

        def dag(second):
            return lambda: call(
                "AI.DAGEXECUTE", "LOAD", 1, "x", "|>", "AI.MODELEXECUTE", "h_cpu", "INPUTS", 1, "x", "OUTPUTS", 1, "a",
                "|>", "AI.MODELEXECUTE", second, "INPUTS", 1, "x", "OUTPUTS", 1, "b", "|>", "AI.TENSORGET", "b", "META")

        latency(dag("h_cpu1"), 3)
        # Interleaved, one DAG of each at a time: the machine's speed drifts over a run, and measured one block
        # after the other the ratio moved 0.53-0.70 between runs.
        pairs = [(latency(dag("h_cpu_b"), 1)[0], latency(dag("h_cpu1"), 1)[0]) for _ in range(n)]
        one = sorted(p[0] for p in pairs)[n // 2]
        two = sorted(p[1] for p in pairs)[n // 2]
        per_pair = sorted(p[1] / p[0] for p in pairs)
        r.close()
    finally:
        s.stop()
    print("== two heavy branches (heavy.onnx, batch %d), %d runs each, interleaved, INTRA_OP_PARALLELISM 1" % (batch, n))
    print("both on CPU:       p50 %.1f ms" % one)
    print("on CPU and CPU:1:  p50 %.1f ms" % two)
    print("two-device/one-device latency: %.3f (target <= 0.55 on 2 cores); per pair p25/p50/p75 %.3f / %.3f / %.3f"
          % (two / one, per_pair[n // 4], per_pair[n // 2], per_pair[3 * n // 4]))


def bench_batching(requests, clients=16):
    s = Server()
    try:
        with open(os.path.join(DATA, "heavy.onnx"), "rb") as f:
            heavy = f.read()
        s.cli("-x", "AI.MODELSTORE", "plain", "ONNX", "CPU", "BLOB", stdin=heavy)
        s.cli("-x", "AI.MODELSTORE", "batched", "ONNX", "CPU", "BATCHSIZE", str(clients), "BLOB", stdin=heavy)
        s.cli("-x", "AI.TENSORSET", "x", "FLOAT", "1", "256", "BLOB", stdin=bytes(4 * 256))

        def run(model):
            # Each client writes its own output key (redis-benchmark substitutes __rand_int__).
            return redis_benchmark(s.port, clients, requests, "-r", str(clients), "AI.MODELEXECUTE", model,
                                   "INPUTS", "1", "x", "OUTPUTS", "1", "y:__rand_int__")

        run("plain")  # warm-up
        plain = run("plain")
        batched = run("batched")
    finally:
        s.stop()
    print("== heavy.onnx, one row per request, %d clients (redis-benchmark), %d requests each" % (clients, requests))
    print("without BATCHSIZE: %8.0f requests/s  p50 %.3f ms  p99 %.3f ms" % plain)
    print("BATCHSIZE %d:      %8.0f requests/s  p50 %.3f ms  p99 %.3f ms" % ((clients,) + batched))
    print("batched/unbatched throughput: %.2f (target >= 2)" % (batched[0] / plain[0]))


def used_memory(server):
    info = server.cli("INFO", "memory")
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))


def bench_tensor_memory(keys):
    """Bytes of used_memory per key: AI.TENSORSET t FLOAT 4 VALUES 1 2 3 4, and SET of the same 16 bytes."""
    import redis
    srv = Server()
    try:
        c = redis.Redis(port=srv.port)
        per_key = {}
        for name, cmd in (("SET 16-byte string", lambda p, i: p.set(f"s:{i}", b"\0" * 16)),
                          ("AI.TENSORSET FLOAT [4]", lambda p, i: p.execute_command(
                              "AI.TENSORSET", f"t:{i}", "FLOAT", 4, "VALUES", 1, 2, 3, 4))):
            before = used_memory(srv)
            for start in range(0, keys, 1000):
                p = c.pipeline(transaction=False)
                for i in range(start, min(keys, start + 1000)):
                    cmd(p, i)
                p.execute()
            per_key[name] = (used_memory(srv) - before) / keys
        for name, b in per_key.items():
            print(f"tensor memory: {name}: {b:.1f} bytes per key over {keys} keys")
        t, s_ = per_key["AI.TENSORSET FLOAT [4]"], per_key["SET 16-byte string"]
        print(f"tensor memory: tensor key / string key = {t / s_:.2f} (target: tensor key <= 150 bytes)")
    finally:
        srv.stop()


def bench_blob(runs, mb=16):
    """usec_per_call (main thread, Redis's own accounting) of TENSORSET ... BLOB <mb MB> and SET of the same."""
    import redis
    srv = Server()
    try:
        c = redis.Redis(port=srv.port)
        payload = os.urandom(mb << 20)
        for _ in range(runs):
            c.execute_command("AI.TENSORSET", "t", "UINT8", len(payload), "BLOB", payload)
            c.set("s", payload)
        stats = c.info("commandstats")
        tset, sset = stats["cmdstat_ai.tensorset"]["usec_per_call"], stats["cmdstat_set"]["usec_per_call"]
        print(f"blob: TENSORSET {mb} MB BLOB {tset:.0f} us, SET {mb} MB {sset:.0f} us per call (main thread), "
              f"ratio {tset / sset:.2f} over {runs} runs each (target <= 1.2)")
    finally:
        srv.stop()


def fraud_graph(seed=3):
    """RedisAI's benchmark shape: concat(transaction [1,30], reference [1,256]) -> dense 286x128 relu -> dense
    128x64 relu -> dense 64x2 -> softmax, as a hand-encoded GraphDef (tests/flow/helpers/tf_graphs.py)."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tests", "flow"))
    from helpers.tf_graphs import DT_FLOAT, DT_INT32, a_bool, a_int, a_tensor, a_type, graph_def, node_def, placeholder

    rng = np.random.default_rng(seed)
    f = ("T", a_type(DT_FLOAT))

    def const(name, arr, dtype=DT_FLOAT):
        return node_def(name, "Const", attrs=[("dtype", a_type(dtype)),
                                              ("value", a_tensor(dtype, list(arr.shape), content=arr.tobytes()))])

    nodes = [placeholder("transaction", DT_FLOAT, [-1, 30]), placeholder("reference", DT_FLOAT, [-1, 256]),
             const("axis", np.array(1, dtype=np.int32), DT_INT32),
             node_def("x", "ConcatV2", ["transaction", "reference", "axis"],
                      [("N", a_int(2)), f, ("Tidx", a_type(DT_INT32))])]
    prev, sizes = "x", [286, 128, 64, 2]
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
        nodes += [const(f"w{i}", w), const(f"b{i}", b),
                  node_def(f"m{i}", "MatMul", [prev, f"w{i}"], [f, ("transpose_a", a_bool(False)),
                                                                 ("transpose_b", a_bool(False))]),
                  node_def(f"a{i}", "BiasAdd", [f"m{i}", f"b{i}"], [f])]
        prev = f"a{i}"
        if i < 2:
            nodes.append(node_def(f"r{i}", "Relu", [prev], [f]))
            prev = f"r{i}"
    nodes.append(node_def("output", "Softmax", [prev], [f]))
    return graph_def(nodes)


def bench_tf_fraud(requests, clients=16):
    import numpy as np
    srv = Server(extra=["TF", TF_LIB] if TF_LIB else [])
    try:
        srv.cli("-x", "AI.MODELSTORE", "fraud", "TF", "CPU", "INPUTS", "2", "transaction", "reference", "OUTPUTS", "1",
                "output", "BLOB", stdin=fraud_graph())
        rng = np.random.default_rng(4)
        srv.cli("-x", "AI.TENSORSET", "transaction", "FLOAT", "1", "30", "BLOB",
                stdin=rng.random((1, 30), dtype=np.float32).tobytes())
        srv.cli("-x", "AI.TENSORSET", "reference", "FLOAT", "1", "256", "BLOB",
                stdin=rng.random((1, 256), dtype=np.float32).tobytes())
        cmd = ("AI.MODELEXECUTE", "fraud", "INPUTS", "2", "transaction", "reference", "OUTPUTS", "1", "out")
        assert srv.cli(*cmd) == "OK"
        redis_benchmark(srv.port, clients, requests // 10, *cmd)  # warm-up
        ping = redis_benchmark(srv.port, clients, requests, "PING")
        fraud = redis_benchmark(srv.port, clients, requests, *cmd)
    finally:
        srv.stop()
    print(f"== TF fraud scoring ([1,30] + [1,256] -> 3 dense layers -> [1,2]), {clients} clients, {requests} requests")
    print(f"PING {ping[0]:.0f} req/s, MODELEXECUTE {fraud[0]:.0f} req/s (p50 {fraud[1]:.3f} ms, p99 {fraud[2]:.3f} ms)")
    print(f"throughput ratio MODELEXECUTE/PING: {fraud[0] / ping[0]:.3f} (target >= 0.25)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--idle-seconds", type=int, default=10)
    ap.add_argument("--dag-runs", type=int, default=2000)
    ap.add_argument("--heavy-runs", type=int, default=60)
    ap.add_argument("--heavy-batch", type=int, default=256)
    ap.add_argument("--batch-requests", type=int, default=20000)
    ap.add_argument("--memory-keys", type=int, default=100000)
    ap.add_argument("--blob-runs", type=int, default=30)
    ap.add_argument("--tf-requests", type=int, default=50000)
    ap.add_argument("--heavy1-runs", type=int, default=3000)
    ap.add_argument("--latency-runs", type=int, default=1000)
    ap.add_argument("--only", help="run one benchmark: latency, latency-intra1, execute, idle, dag, devices, batching, memory, blob, tf, "
                                   "heavy1")
    ap.add_argument("--module-args", default="", help="load-time arguments for every module server, e.g. "
                                                      "'EXECUTION_MODE ISOLATED'")
    a = ap.parse_args()
    MODULE_ARGS.extend(a.module_args.split())
    if not os.path.exists(MODULE):
        sys.exit(f"module not built: {MODULE}")
    benches = {
        "latency": lambda: bench_latency(a.latency_runs),
        "latency-intra1": lambda: bench_latency(a.latency_runs, intra=1),
        "execute": lambda: bench_execute(a.requests),
        "idle": lambda: bench_idle(a.idle_seconds),
        "dag": lambda: bench_dag_vs_commands(a.dag_runs),
        "devices": lambda: bench_two_devices(a.heavy_runs, a.heavy_batch),
        "batching": lambda: bench_batching(a.batch_requests),
        "memory": lambda: bench_tensor_memory(a.memory_keys),
        "blob": lambda: bench_blob(a.blob_runs),
        "tf": lambda: bench_tf_fraud(a.tf_requests),
        "heavy1": lambda: bench_heavy_batch1(a.heavy1_runs),
    }
    for name, run in benches.items():
        if a.only in (None, name):
            run()


if __name__ == "__main__":
    main()
