"""What a call fan-out costs each backend, up to the bound that refuses it (docs/security.md, "Call expansion").

Each backend gets models of a few KB whose function (subgraph, method) at level i calls the one at level i + 1
twice, for growing depth: the expanded call tree doubles with each level while the model grows by a few hundred
bytes. For each depth this stores the model (AI.MODELSTORE, or AI.SCRIPTSTORE for TORCH) and runs it once (the
first run is where TorchScript inlines and LiteRT walks the branches), timing both, until the store is refused.
The last admitted depth is the worst case the bound lets through; its times are what a client can make a
backend spend with one model.

    REDISAI_ONNX_LIB=… REDISAI_TF_LIB=… REDISAI_TFLITE_LIB=… .venv/bin/python bench/expansion.py [--max-depth 24]
"""
import argparse
import os
import random
import sys
import time

import numpy as np
import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reliability"))
import bench  # noqa: E402
import crafted  # noqa: E402


def torch_source(d):
    """The TorchScript fan-out of crafted.py as a script whose entry point `f` calls h0 on its input."""
    gen = crafted.Crafted(random.Random(0), "bench:")
    return gen.torch_code("fanout", ["return CALL(h0)(INPUT)"], crafted.torch_fanout_functions(d), what="script")[1]


def backends():
    """name -> (store(con, depth) args, run args, input (key, tensor))."""
    x = np.array([1.0], dtype=np.float32)
    i = np.array([1], dtype=np.int32)
    out = {
        "ONNX": (lambda d: ["AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", crafted.onnx_fanout_model(d, 2)],
                 ["AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y"], ("x", x)),
        "TORCH": (lambda d: ["AI.SCRIPTSTORE", "m", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE", torch_source(d)],
                  ["AI.SCRIPTEXECUTE", "m", "f", "INPUTS", 1, "x", "OUTPUTS", 1, "y"], ("x", x)),
        "TFLITE": (lambda d: ["AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", crafted.tflite_fanout_model(d, 2)],
                   ["AI.MODELEXECUTE", "m", "INPUTS", 1, "i", "OUTPUTS", 1, "y"], ("i", i)),
    }
    if bench.TF_LIB:
        out["TF"] = (lambda d: ["AI.MODELSTORE", "m", "TF", "CPU", "INPUTS", 1, "x", "OUTPUTS", 1, "y", "BLOB",
                                crafted.tf_fanout_graph(d, 2)],
                     ["AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y"], ("x", x))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-depth", type=int, default=24)
    ap.add_argument("--only", help="one backend")
    a = ap.parse_args()
    extra = ["MODEL_EXECUTION_TIMEOUT", "60000"]  # the run's own time, not the kill switch's
    for name, env in (("TF", "REDISAI_TF_LIB"), ("TFLITE", "REDISAI_TFLITE_LIB")):
        if os.environ.get(env):
            extra += [name, os.environ[env]]
    s = bench.Server(extra=extra)
    try:
        con = redis.Redis(port=s.port, socket_timeout=600)
        print("%-7s %5s %12s %10s %10s %7s  %s" % ("backend", "depth", "calls", "store s", "run s", "PING s", "reply"))
        for name, (store, run, (key, value)) in backends().items():
            if a.only and name != a.only:
                continue
            con.execute_command("AI.TENSORSET", key, "INT32" if value.dtype == np.int32 else "FLOAT", 1, "BLOB",
                                value.tobytes())
            for d in range(2, a.max_depth + 1):
                con.delete("m")
                t0 = time.monotonic()
                try:
                    con.execute_command(*store(d))
                except redis.ResponseError as e:
                    print("%-7s %5d %12d %10.3f %10s %7s  %s" % (name, d, 2 ** (d - 1), time.monotonic() - t0, "",
                                                                 "", str(e)[:90]), flush=True)
                    break
                t_store = time.monotonic() - t0
                t0 = time.monotonic()
                try:
                    reply = con.execute_command(*run)
                except redis.ResponseError as e:
                    reply = str(e)[:60]
                t_run = time.monotonic() - t0
                t0 = time.monotonic()
                con.ping()
                print("%-7s %5d %12d %10.3f %10.3f %7.3f  %s" % (name, d, 2 ** (d - 1), t_store, t_run,
                                                                 time.monotonic() - t0, reply), flush=True)
    finally:
        s.stop()


if __name__ == "__main__":
    main()
