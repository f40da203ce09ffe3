"""Same-run A/B of module builds (or of one build with other load-time arguments) on the workloads whose cost a
change to the engine or the backends' allocators may show in: the tiny ONNX model at 50 clients (req/s, and its
ratio to PING) as MODELEXECUTE and as a LOAD -> MODELEXECUTE -> TENSORGET DAG, heavy.onnx at 1 and 64 rows and a TORCH model from one client (p50 us; at 1 row also the backend's own run, by AI.INFO), and RedisAI's TF fraud
graph at 16 clients (req/s). Each variant runs on a server of its own; rounds are interleaved across the variants
so that the machine's speed changes hit each alike (docs/benchmarks.md). Prints every round and the median, and
for the req/s workloads and heavy.onnx at 1 row the CPU µs per request of Redis's main thread, its other threads,
the backend workers and the load generator (for req/s, with the throughput ratios those bound: docs/benchmarks.md,
"Where the CPU goes").

    REDISAI_ONNX_LIB=… REDISAI_TF_LIB=… .venv/bin/python bench/ab_workloads.py \\
        before=/tmp/old/target/release/libredisai.so after=target/release/libredisai.so [--rounds 3]
    # a variant may add load-time arguments after a '+': name=path+ARG,VALUE,ARG,VALUE
    # isolated against in-process, one build: in_process=<lib> isolated=<lib>+EXECUTION_MODE,ISOLATED
    # --only <part of a workload's name> (repeatable) measures those alone

The TORCH backend is the libredisai_torch.so beside each module (build the old one from a worktree:
`git worktree add /tmp/old <rev> && make -C /tmp/old build`).
"""
import argparse
import os
import random
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def rows_blob(rows, cols, seed):
    rng = random.Random(seed)
    return struct.pack(f"<{rows * cols}f", *(rng.random() for _ in range(rows * cols)))


def prepare(s):
    bench.prepare_tiny(s)
    with open(os.path.join(bench.DATA, "heavy.onnx"), "rb") as f:
        s.cli("-x", "AI.MODELSTORE", "h", "ONNX", "CPU", "BLOB", stdin=f.read())
    for rows in (1, 64):
        s.cli("-x", "AI.TENSORSET", f"x{rows}", "FLOAT", str(rows), "256", "BLOB", stdin=rows_blob(rows, 256, rows))
    with open(os.path.join(bench.DATA, "torch_slow.pt"), "rb") as f:
        s.cli("-x", "AI.MODELSTORE", "t", "TORCH", "CPU", "BLOB", stdin=f.read())
    s.cli("-x", "AI.TENSORSET", "tx", "FLOAT", "256", "256", "BLOB", stdin=rows_blob(256, 256, 7))
    if bench.TF_LIB:
        s.cli("-x", "AI.MODELSTORE", "fraud", "TF", "CPU", "INPUTS", "2", "transaction", "reference", "OUTPUTS", "1",
              "output", "BLOB", stdin=bench.fraud_graph())
        s.cli("-x", "AI.TENSORSET", "transaction", "FLOAT", "1", "30", "BLOB", stdin=rows_blob(1, 30, 1))
        s.cli("-x", "AI.TENSORSET", "reference", "FLOAT", "1", "256", "BLOB", stdin=rows_blob(1, 256, 2))
    for cmd in WORKLOADS.values():
        if cmd[0] is not None:
            reply = s.cli(*cmd[0])
            assert reply == "OK", (cmd[0], reply)


def single(cmd, n):
    return lambda s: bench.single_client_p50(s.port, n, cmd)[1]


def single_cpu(cmd, n):
    """p50 (µs) as `single`, with the CPU µs per MODELEXECUTE (its interleaved PING included) of the main thread,
    Redis's other threads, the backend workers and the client. One client's requests go one after another, so
    the main thread's share is on every request's path; the backends' pool threads count what they spin."""
    def measure(s):
        before, client = s.cpu(), time.thread_time()
        p50 = bench.single_client_p50(s.port, n, cmd)[1]
        client = time.thread_time() - client
        used = [(b - a) * 1e6 / n for a, b in zip(before, s.cpu())] + [client * 1e6 / n]
        return p50, used
    return measure


def backend_run(model, cmd, n):
    """The backend's own run time (µs, mean): AI.INFO's duration over its calls, for `n` runs from one client.
    Isolated, that is the worker's clock: the run without the trip there and back."""
    def measure(s):
        s.cli("AI.INFO", model, "RESETSTAT")
        bench.single_client_p50(s.port, n, cmd)
        lines = s.cli("AI.INFO", model).splitlines()
        info = dict(zip(lines[::2], lines[1::2]))
        return int(info["duration"]) / int(info["calls"])
    return measure


def rps(cmd, clients, n):
    """req/s, with the CPU µs per request of the main thread, Redis's other threads, the backend workers and the
    load generator."""
    def measure(s):
        (r, _, _), cpu = bench.cpu_per_request(s, n, *cmd, clients=clients)
        return r, cpu[:4]
    return measure


FRAUD = ("AI.MODELEXECUTE", "fraud", "INPUTS", "2", "transaction", "reference", "OUTPUTS", "1", "out")
WORKLOADS = {}  # name -> (command checked at start, measure(server) -> value, unit)


def define(requests, heavy_runs, torch_runs):
    WORKLOADS.update({
        "PING req/s (50 clients)": (None, rps(("PING",), 50, requests), "req/s"),
        "tiny ONNX req/s (50 clients)": (bench.EXECUTE, rps(bench.EXECUTE, 50, requests), "req/s"),
        "tiny ONNX DAG req/s (50 clients)": (None, rps(bench.DAG, 50, requests), "req/s"),
        "heavy.onnx 1 row p50 us": (h := ("AI.MODELEXECUTE", "h", "INPUTS", "1", "x1", "OUTPUTS", "1", "y"),
                                    single_cpu(h, heavy_runs), "us"),
        "heavy.onnx 1 row backend run us": (None, backend_run("h", h, heavy_runs), "us"),
        "heavy.onnx 64 rows p50 us": (h64 := ("AI.MODELEXECUTE", "h", "INPUTS", "1", "x64", "OUTPUTS", "1", "y"),
                                      single(h64, heavy_runs // 4), "us"),
        "torch_slow.pt 256x256 p50 us": (t := ("AI.MODELEXECUTE", "t", "INPUTS", "1", "tx", "OUTPUTS", "1", "ty"),
                                         single(t, torch_runs), "us"),
    })
    if bench.TF_LIB:
        WORKLOADS["TF fraud req/s (16 clients)"] = (FRAUD, rps(FRAUD, 16, requests // 2), "req/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="name=module[+ARG,VALUE,...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--heavy-runs", type=int, default=2000)
    ap.add_argument("--torch-runs", type=int, default=30)
    ap.add_argument("--only", action="append", default=[],
                    help="measure only the workloads whose name contains this (repeatable)")
    a = ap.parse_args()
    define(a.requests, a.heavy_runs, a.torch_runs)
    if a.only:
        for w in [w for w in WORKLOADS if not any(o in w for o in a.only)]:
            del WORKLOADS[w]
    variants = []
    for v in a.variants:
        name, spec = v.split("=", 1)
        path, _, extra = spec.partition("+")
        variants.append((name, path, extra.split(",") if extra else []))
    servers = {}
    try:
        for name, path, extra in variants:
            bench.MODULE = path
            servers[name] = bench.Server(extra=(["TF", bench.TF_LIB] if bench.TF_LIB else []) + extra)
            prepare(servers[name])
        res = {(n, w): [] for n, _, _ in variants for w in WORKLOADS}
        cpu = {(n, w): [] for n, _, _ in variants for w in WORKLOADS}
        for r in range(a.rounds):
            for w, (_, measure, _) in WORKLOADS.items():
                for name, _, _ in variants:
                    try:
                        value = measure(servers[name])
                        if isinstance(value, tuple):
                            value, used = value
                            cpu[(name, w)].append(used)
                        res[(name, w)].append(value)
                    except (AssertionError, subprocess.CalledProcessError) as e:
                        # One failed measurement (a run past MODEL_EXECUTION_TIMEOUT on a loaded machine): shown,
                        # and left out of the median.
                        print(f"{name}: {w}: failed: {e}", file=sys.stderr, flush=True)
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.stop()
    base = variants[0][0]
    print("%-30s %s" % ("workload (median of %d rounds)" % a.rounds,
                        "".join("%14s" % n for n, _, _ in variants) + "   ratio to " + base))
    for w, (_, _, unit) in WORKLOADS.items():
        med = {n: statistics.median(res[(n, w)] or [float("nan")]) for n, _, _ in variants}
        ratios = " ".join("%.3f" % (med[n] / med[base]) for n, _, _ in variants[1:])
        print("%-30s %s   %s" % (w, "".join("%14.1f" % med[n] for n, _, _ in variants), ratios))
        print("%-30s %s" % ("  rounds", "  ".join("%s: %s" % (n, "/".join("%.0f" % x for x in res[(n, w)]))
                                                   for n, _, _ in variants)))
        if all(cpu[(n, w)] for n, _, _ in variants):
            print_cpu(w, [n for n, _, _ in variants], cpu, bounds=unit == "req/s")


def print_cpu(w, names, cpu, bounds):
    """The median CPU µs per request by consumer, and for a throughput row (`bounds`) the ratios they predict:
    with every consumer sharing the cores (this 2-vCPU machine: the bound is their sum) and with a core each
    (the bound is the busiest). A prediction from CPU time, which varies less than req/s here; not a
    measurement of another machine."""
    med = {n: [statistics.median(c[i] for c in cpu[(n, w)]) for i in range(4)] for n in names}
    for n in names:
        print("%-30s %s: main %.2f, threads %.2f, workers %.2f, client %.2f = %.2f" % (
            "  CPU us/req", n, *med[n], sum(med[n])))
    base = med[names[0]]
    for n in names[1:] if bounds else []:
        print("%-30s %s: cores shared %.3f, a core each %.3f" % (
            "  CPU-bound ratio", n, sum(base) / sum(med[n]), max(base) / max(med[n])))


if __name__ == "__main__":
    main()
