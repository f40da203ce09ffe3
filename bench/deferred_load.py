"""Restart-to-first-PING with many models in the RDB, with and without DEFERRED_MODEL_BUILD (docs/benchmarks.md).

One RDB holding N ONNX models of ~20 MB each (y = x @ W, W a random FLOAT [2236, 2236]) and a tensor is written
once; the server is started on it twice, with each setting, and the script prints the seconds from the process's
start to its first PONG, to the first successful MODELEXECUTE of the last model, and to the last deferred build.

    python bench/deferred_load.py [--models 40]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import MODULE, ONNX_LIB, SERVER, free_port  # noqa: E402

N = 2236  # 2236 * 2236 * 4 bytes = 20.0 MB


def model_blob(seed):
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((N, N), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])],
                              initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def start(workdir, deferred):
    port = free_port()
    args = [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
            "--logfile", os.path.join(workdir, "log"), "--loadmodule", MODULE, "ONNX", ONNX_LIB]
    if deferred:
        args += ["DEFERRED_MODEL_BUILD", "yes"]
    t0 = time.monotonic()
    proc = subprocess.Popen(args)
    return proc, port, t0


def cli(port, *args):
    r = subprocess.run(["redis-cli", "-p", str(port), *map(str, args)], capture_output=True)
    return r.stdout.decode().strip()


def wait_for(what, fn, ok, timeout=600):
    """Poll fn() until ok(reply); a reply that never comes right fails loudly instead of looping forever."""
    deadline = time.monotonic() + timeout
    while not ok(reply := fn()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: no success in {timeout} s, last reply {reply!r}")
        time.sleep(0.005)


def field(port, name):
    for line in cli(port, "INFO", "modules").splitlines():
        if line.startswith(f"ai_{name}:"):
            return int(line.split(":", 1)[1])
    return None


def measure(workdir, models, deferred):
    proc, port, t0 = start(workdir, deferred)
    wait_for("PING", lambda: cli(port, "PING"), lambda r: r == "PONG")
    ping = time.monotonic() - t0
    last = f"m{models - 1}"
    wait_for("MODELEXECUTE", lambda: cli(port, "AI.MODELEXECUTE", last, "INPUTS", 1, "x", "OUTPUTS", 1, "y"),
             lambda r: r == "OK")
    first_run = time.monotonic() - t0
    wait_for("pending builds", lambda: field(port, "models_pending_build"), lambda r: r in (0, None))
    built = time.monotonic() - t0
    proc.terminate()
    proc.wait(30)
    return ping, first_run, built


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=40)
    opts = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="redisai-deferred-")
    try:
        proc, port, _ = start(workdir, False)
        wait_for("PING", lambda: cli(port, "PING"), lambda r: r == "PONG")
        for i in range(opts.models):
            blob = model_blob(i)
            r = subprocess.run(["redis-cli", "-p", str(port), "-x", "AI.MODELSTORE", f"m{i}", "ONNX", "CPU", "BLOB"],
                               input=blob, check=True, capture_output=True)
            if r.stdout.strip() != b"OK":
                raise SystemExit(f"MODELSTORE m{i}: {r.stdout!r}")
        x = np.ones((1, N), dtype=np.float32).tobytes()
        subprocess.run(["redis-cli", "-p", str(port), "-x", "AI.TENSORSET", "x", "FLOAT", "1", str(N), "BLOB"],
                       input=x, check=True, capture_output=True)
        cli(port, "SAVE")
        proc.terminate()
        proc.wait(30)
        size = os.path.getsize(os.path.join(workdir, "dump.rdb"))
        print(f"RDB: {opts.models} models of {N * N * 4 / 1e6:.1f} MB, {size / 1e6:.0f} MB in all")
        for deferred in (False, True, False, True):
            ping, first_run, built = measure(workdir, opts.models, deferred)
            label = "DEFERRED_MODEL_BUILD yes" if deferred else "DEFERRED_MODEL_BUILD no "
            print(f"{label}: first PONG {ping:6.2f} s, last model runs {first_run:6.2f} s, all built {built:6.2f} s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
