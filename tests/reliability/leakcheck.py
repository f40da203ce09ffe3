#!/usr/bin/env python3
"""Leak check: a short mixed ONNX workload against redis-server under valgrind (memcheck).

The workload touches every path that allocates and frees: tensors of every dtype (good and bad), ONNX models
on three device queues (runs that fail, runs that time out in a busy queue, a run stopped by the kill
switch, auto-batching), DAGs over two devices, MODELSTORE over a key and MODELDEL while a run of that model
is in flight, clients that disconnect in the middle of a command, DEBUG RELOAD (RDB save and load of every
type), RedisAI's low-level C API through the test module tests/llapi/llapi_test.c, then the soak's random traffic (soak.Client) for a while. At the end FLUSHALL frees everything and the
server is stopped, so that valgrind's leak report at exit sees every model and tensor dropped.

Fails on: an unsuppressed valgrind error (memory errors anywhere, "definitely lost" leaks anywhere; see
valgrind.supp for the third-party noise that is suppressed and why), a "definitely lost" block with a frame
of the module in its stack (reported separately, with the stack), a wrong reply, or a crash.

Valgrind must see the module's allocations. `make leakcheck` checks a build with the cargo feature
`system-alloc` (target/leakcheck), where the module uses the C library's malloc, which valgrind replaces.
valgrind is also told to treat libjemalloc as the malloc library (--soname-synonyms), so Redis's own
allocations are seen too, and so are the default build's, which allocates through Redis's allocator. The
default build needs --valgrind-opt=--alignment=64 though: its allocator (redis_module::alloc::RedisAlloc)
gets over-aligned blocks (ONNX Runtime's, 64 bytes) only from jemalloc's size classes, and valgrind's malloc
aligns to 16, on which ONNX Runtime's AVX kernels fault.

  leakcheck.py [--seconds 45] [--clients 4] [--seed S] [--valgrind-opt=OPT ...]
  (REDISAI_MODULE names the module to check, as for the flow tests)
"""

import argparse
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (HarnessError, RedisServer, RespError, env_summary, fail_exit, health_problems,  # noqa: E402
                     start_server)

import numpy as np  # noqa: E402
import redis  # noqa: E402

from helpers import server as flow_server  # noqa: E402  (RedisServer reads its settings from there)
from helpers.onnx_models import get_tensor, mexec, set_tensor, store  # noqa: E402
from helpers.server import REPO_ROOT  # noqa: E402
from helpers.resp import RawClient, raw_command  # noqa: E402
from soak import Client, Stats  # noqa: E402
from test_dag_stress import SHARED, close, disconnect_mid_command, store_models, weights  # noqa: E402

SUPPRESSIONS = Path(__file__).resolve().parent / "valgrind.supp"
VALGRIND_ERROR_EXIT = 97
KILL_SWITCH_MS = 2000  # MODEL_EXECUTION_TIMEOUT: how long a run of loop_forever.onnx keeps its worker
# The low-level API's test module (tests/llapi/llapi_test.c, `make llapi-module`), loaded after the module.
LLAPI_MODULE = os.environ.get("REDISAI_LLAPI_MODULE") or str(REPO_ROOT / "target" / "llapi" / "libllapi_test.so")


class ValgrindServer(RedisServer):
    """helpers.server's RedisServer, run under valgrind; the report goes to valgrind.log in its directory."""

    extra = []  # more valgrind options (--valgrind-opt)

    def argv(self):
        # --fair-sched=yes: valgrind runs one thread at a time, and its default lock lets two workers busy in
        # never-ending runs keep Redis's main thread (and the watchdog) off the CPU for minutes, which a native
        # run never does; the scenarios need the main thread to take commands while workers are busy.
        return ["valgrind", *self.extra, "--fair-sched=yes", "--tool=memcheck", "--leak-check=full",
                "--errors-for-leak-kinds=definite",
                "--show-leak-kinds=definite", f"--error-exitcode={VALGRIND_ERROR_EXIT}", "--num-callers=40",
                "--soname-synonyms=somalloc=libjemalloc.so*", f"--suppressions={SUPPRESSIONS}",
                "--gen-suppressions=all", f"--log-file={self.dir / 'valgrind.log'}"] + super().argv()


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: {got!r}, expected {want!r}")


def tensors(con, port):
    """Every dtype in and out (BLOB and VALUES), and TENSORSETs that fail at each check."""
    for dtype, values in [("FLOAT", [1.5, -2]), ("DOUBLE", [1e300, 0]), ("INT8", [-128, 127]), ("INT16", [1, -1]),
                          ("INT32", [7, 8]), ("INT64", [2 ** 62, -1]), ("UINT8", [0, 255]), ("UINT16", [65535, 0]),
                          ("BOOL", [0, 1]), ("STRING", ["alpha", ""])]:
        expect(dtype, con.execute_command("AI.TENSORSET", f"t:{dtype}", dtype, 2, "VALUES", *values), b"OK")
        con.execute_command("AI.TENSORGET", f"t:{dtype}", "META", "VALUES")
        got = con.execute_command("AI.TENSORGET", f"t:{dtype}", "META", "BLOB")
        expect(f"{dtype} BLOB round trip",
               con.execute_command("AI.TENSORSET", f"t2:{dtype}", dtype, 2, "BLOB", got[5]), b"OK")
    for bad in (["FLOAT", 2, "VALUES", 1], ["FLOAT", 2, "BLOB", b"123"], ["INT8", 2, "VALUES", 1, 300],
                ["STRING", 2, "BLOB", b"a\x00\xff\x00"], ["BOOL", 2, "VALUES", 1, 2], ["FLOAT", 1 << 40],
                ["NOTYPE", 2], ["FLOAT", -1]):
        reply = raw(port, "AI.TENSORSET", "t:bad", *bad)
        assert isinstance(reply, RespError), (bad, reply)


def raw(port, *cmd):
    return raw_command(port, *cmd, timeout=300)


def in_flight(port, *cmd):
    """Send a command on a connection of its own without waiting; read the reply later with .reply()."""
    c = RawClient(port, timeout=300)
    c.send(*cmd)
    return c


def scenarios(srv, con):
    """The paths a random workload may miss, each checked. A run of loop_forever.onnx keeps a worker busy until
    the kill switch stops it (KILL_SWITCH_MS): a deterministic way to have runs in flight and queues full."""
    port = srv.port
    lin = weights.linear(SHARED["kA"]).astype(np.float32)
    # a DAG over two devices, persisted
    reply = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "kA", "PERSIST", 1, "out", "|>", "AI.MODELEXECUTE",
                                "lin@CPU", "INPUTS", 1, "kA", "OUTPUTS", 1, "y", "|>", "AI.MODELEXECUTE", "two@CPU:1",
                                "INPUTS", 1, "y", "OUTPUTS", 2, "p", "out", "|>", "AI.TENSORGET", "p", "VALUES")
    expect("DAG over two devices", reply[:2], [b"OK", b"OK"])
    assert close(get_tensor(con, "out"), lin * 2), "DAG output"
    # failing runs: wrong dtype, wrong shape, an op failing inside a DAG with later ops never run
    for cmd in (mexec("lin@CPU", ["kI"], ["y"]), mexec("lin@CPU:1", ["kB"], ["y"])):
        assert isinstance(raw(port, *cmd), RespError), cmd
    reply = con.execute_command("AI.DAGEXECUTE", "LOAD", 2, "kA", "kB", "|>", "AI.MODELEXECUTE", "mul@CPU",
                                "INPUTS", 2, "kA", "kB", "OUTPUTS", 1, "m", "|>", "AI.MODELEXECUTE", "lin@CPU:1",
                                "INPUTS", 1, "m", "OUTPUTS", 1, "z", "|>", "AI.TENSORGET", "z", "META")
    expect("failing DAG", reply[1:], [b"NA", b"NA"])
    # the kill switch stops a run that never ends
    expect("x1", con.execute_command("AI.TENSORSET", "x1", "FLOAT", 1, "VALUES", 1), b"OK")
    for dev in ("CPU:1", "CPU:2"):
        store(con, f"loop@{dev}", "loop_forever", device=dev)
    assert isinstance(raw(port, *mexec("loop@CPU:1", ["x1"], ["y1"])), RespError), "the never-ending run"
    # MODELDEL, then MODELSTORE over the key, while a run of the model is in flight: it goes on, on the old model
    for replace in (False, True):
        busy = in_flight(port, *mexec("loop@CPU:1", ["x1"], ["y1"]))
        time.sleep(0.3)
        if replace:
            store(con, "loop@CPU:1", "loop_forever", "TAG", "v2", device="CPU:1")
        else:
            expect("MODELDEL", raw(port, "AI.MODELDEL", "loop@CPU:1"), "OK")
        assert isinstance(busy.reply(), RespError), "the never-ending run of a deleted or replaced model"
        busy.close()
        if not replace:
            store(con, "loop@CPU:1", "loop_forever", device="CPU:1")
    # TIMEOUT: both CPU:2 workers busy, runs that may wait 1 ms time out (when a worker takes them). Short runs
    # are kept off the main thread here: an inline run would not wait for the busy workers at all.
    expect("INLINE_THRESHOLD 0", con.execute_command("AI.CONFIG", "INLINE_THRESHOLD", 0), b"OK")
    busy = [in_flight(port, *mexec("loop@CPU:2", ["x1"], [f"y{i}"])) for i in range(2)]
    time.sleep(0.3)
    late = [in_flight(port, *mexec("lin@CPU:2", ["kA"], ["y"], "TIMEOUT", 1)),
            in_flight(port, "AI.DAGEXECUTE", "LOAD", 1, "kA", "TIMEOUT", 1, "|>", "AI.MODELEXECUTE", "lin@CPU:2",
                      "INPUTS", 1, "kA", "OUTPUTS", 1, "y")]
    for c in late:
        expect("TIMEOUT in a busy queue", c.reply(), "TIMEDOUT")
        c.close()
    for c in busy:
        assert isinstance(c.reply(), RespError), "the never-ending run"
        c.close()
    expect("INLINE_THRESHOLD back", con.execute_command("AI.CONFIG", "INLINE_THRESHOLD", 100), b"OK")
    # auto-batching: concurrent requests to a BATCHSIZE model are joined and split
    store(con, "batched", "linear", "BATCHSIZE", 8, "MINBATCHSIZE", 3, "MINBATCHTIMEOUT", 2000, device="CPU:1")
    runs = [in_flight(port, *mexec("batched", ["kA"], [f"b{i}"])) for i in range(3)]
    for i, c in enumerate(runs):
        expect("batched run", c.reply(), "OK")
        c.close()
        assert close(get_tensor(con, f"b{i}"), lin), "batched output"
    # clients gone in the middle of a command: half sent, or sent and closed while it runs or waits
    rng = random.Random(5)
    for cmd in (mexec("loop@CPU:2", ["x1"], ["dc"]), mexec("lin@CPU:2", ["kA"], ["dc"]),
                ["AI.DAGEXECUTE", "LOAD", 1, "kA", "PERSIST", 1, "dc2", "|>", "AI.MODELEXECUTE", "lin@CPU:1",
                 "INPUTS", 1, "kA", "OUTPUTS", 1, "dc2"]):
        for _ in range(4):
            disconnect_mid_command(port, cmd, rng)
    # MODELGET (META and BLOB), AI.INFO, AI._MODELSCAN, getkeys
    for cmd in (["AI.MODELGET", "lin@CPU"], ["AI.INFO", "lin@CPU"], ["AI.INFO", "lin@CPU", "RESETSTAT"],
                ["AI._MODELSCAN"], ["COMMAND", "GETKEYS", *mexec("lin@CPU", ["kA"], ["y"])]):
        assert not isinstance(raw(port, *cmd), RespError), cmd


def llapi(con):
    """The low-level API through llapi_test.c's commands (each checks itself and replies OK), on ONNX models
    (mul.onnx: c = a * b, as the TF graph of the flow tests): tensors, errors, sync/batched/async runs, a DAG over
    two devices, references kept past a key's deletion. Scripts and TF are left to the flow tests (too slow here)."""
    for key, arr in (("a{1}", [[2, 3], [2, 3]]), ("b{1}", [[5, 7], [11, 13]]), ("t{1}", [[1, 2], [3, 4]]),
                     ("tmp{1}", [[1.5, -2], [3, 0.25]])):
        set_tensor(con, key, np.array(arr, dtype=np.float32))
    for key, dev in (("m{1}", "CPU"), ("m2{1}", "CPU:1"), ("mtmp{1}", "CPU")):
        store(con, key, "mul", device=dev)
    expect("LLAPI.VERSION", con.execute_command("LLAPI.VERSION"), 1)
    for cmd in (["LLAPI.TENSORS", "t{1}"], ["LLAPI.ERRORS"], ["LLAPI.MODELRUN"], ["LLAPI.DAG_MULTIDEVICE"],
                ["LLAPI.REFCOUNT"]):
        expect(cmd[0], con.execute_command(*cmd), b"OK")


def debug_reload(con):
    """RDB save and load of everything in the keyspace; the data must survive it."""
    expect("DEBUG RELOAD", con.execute_command("DEBUG", "RELOAD"), b"OK")
    assert close(get_tensor(con, "kA"), SHARED["kA"]), "kA after DEBUG RELOAD"
    expect("run after DEBUG RELOAD", con.execute_command(*mexec("lin@CPU:1", ["kA"], ["y"])), b"OK")


class LeakClient(Client):
    """The soak's client without heavy.onnx (valgrind is ~50x slower) and the TF/TORCH/script actions."""
    HEAVY = False
    ACTIONS = [(50, Client.dag), (30, Client.modelexecute), (3, Client.replace_model), (2, Client.delete_model),
               (5, Client.disconnect)]


def random_traffic(srv, seconds, n_clients, seed):
    stats = Stats()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=LeakClient(srv, cid, seed, stats).run, args=(deadline,))
               for cid in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


# a frame of the module: a Rust symbol of the crate, or an address in the module's library
MODULE_FRAME = re.compile(r"\bredisai::|_ZN7redisai|/libredisai(_torch)?\.so\b")
LOSS_RECORD = re.compile(r"^==\d+== (\S+ bytes in \S+ blocks are definitely lost in loss record .*?)\n==\d+== \n",
                         re.S | re.M)


def read_report(path):
    """(definitely lost bytes, the definitely-lost records with a frame of the module, error summary line)."""
    text = path.read_text(errors="replace")
    lost = re.findall(r"definitely lost: ([\d,]+) bytes in ([\d,]+) blocks", text)
    lost_bytes = sum(int(b.replace(",", "")) for b, _ in lost)
    ours = [r for r in LOSS_RECORD.findall(text) if MODULE_FRAME.search(r)]
    summary = re.findall(r"ERROR SUMMARY: .*", text)
    return lost_bytes, ours, summary[-1] if summary else "(no ERROR SUMMARY: valgrind did not finish)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=45.0, help="random traffic after the scenarios (default 45)")
    ap.add_argument("--clients", type=int, default=4, help="client threads of the random traffic (default 4)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--valgrind-opt", action="append", default=[],
                    help="an extra valgrind option, e.g. --valgrind-opt=--alignment=64 (repeatable)")
    args = ap.parse_args()
    ValgrindServer.extra = args.valgrind_opt
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    # ONNX and tensors only: TensorFlow, LiteRT and libtorch are far too slow under valgrind
    flow_server.TF_LIB = flow_server.TFLITE_LIB = None
    flow_server.START_TIMEOUT = 300.0
    print(f"leakcheck: seed {seed}; {env_summary()}")
    start = time.monotonic()
    problems = []
    try:
        assert os.path.isfile(LLAPI_MODULE), f"{LLAPI_MODULE} is missing: `make llapi-module` builds it"
        srv = start_server("leakcheck", server_args=["--appendonly", "no", "--loadmodule", LLAPI_MODULE],
                           module_args=["THREADS_PER_QUEUE", "2", "MODEL_EXECUTION_TIMEOUT", KILL_SWITCH_MS],
                           server_class=ValgrindServer)
    except HarnessError as e:
        print(f"leakcheck: cannot start the server under valgrind: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"server under valgrind: {srv.describe()}; started in {time.monotonic() - start:.0f} s")
    try:
        con = srv.client(socket_timeout=300)
        store_models(con)
        tensors(con, srv.port)
        scenarios(srv, con)
        llapi(con)
        debug_reload(con)
        print(f"scenarios done at {time.monotonic() - start:.0f} s")
        stats = random_traffic(srv, args.seconds, args.clients, seed)
        problems += stats.problems
        print(f"random traffic: {dict(sorted(stats.counts.items()))}")
        debug_reload(con)
        assert con.flushall() is True  # every model and tensor dropped: what they leak shows at exit
        time.sleep(2)
        con.close()
    except (AssertionError, HarnessError, OSError, redis.exceptions.RedisError) as e:
        import traceback
        traceback.print_exc()
        problems.append(f"workload: {type(e).__name__}: {e}")
    problems += health_problems(srv)
    code = srv.stop(timeout=600)
    log = srv.dir / "valgrind.log"
    lost_bytes, ours, summary = read_report(log)
    print(f"leakcheck: {time.monotonic() - start:.0f} s; valgrind exit code {code}; {summary}; "
          f"definitely lost: {lost_bytes} bytes, {len(ours)} loss records with module frames; report {log}")
    for record in ours:
        problems.append("definitely lost in the module:\n" + record)
    if code == VALGRIND_ERROR_EXIT:
        problems.append(f"valgrind found errors ({summary}): see {log}")
    elif code != 0:
        problems.append(f"redis-server under valgrind exited with code {code}")
    fail_exit(problems, f"leakcheck (seed {seed})")


if __name__ == "__main__":
    main()
