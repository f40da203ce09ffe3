#!/usr/bin/env python3
"""Soak: MINUTES of mixed traffic from many clients against one server with AOF and background saves.

A server of its own (`appendonly yes`, THREADS_PER_QUEUE 2) with ONNX models on three device queues (CPU,
CPU:1, CPU:2), a TF and a TORCH model and a TorchScript script per device. CLIENTS threads, each on its own
connection, send for MINUTES: random DAGs (test_dag_stress.Dag: failing ops, wrong shapes and dtypes, random
TIMEOUTs, checked against its model of the semantics), MODELEXECUTEs and SCRIPTEXECUTEs (good and bad
inputs, checked), model replacement (MODELSTORE over the key) and deletion (MODELDEL, stored again a moment
later) while others run them, and commands cut off by a disconnect. A thread runs BGSAVE and BGREWRITEAOF in
turn meanwhile.

Must hold: every command gets exactly one well-formed reply within REPLY_TIMEOUT (else: a lost reply), the
replies are right, the server stays up with no crash or panic in its log, every background save succeeds,
used_memory (after FLUSHALL, clients gone) is back within 2 MiB and RSS within RSS_SLACK of what they were
after the warm-up, and the AOF it wrote loads on restart.

  soak.py [--minutes 10] [--clients 20] [--seed S] [--warmup 20] [--persist-every 5]
"""

import argparse
import collections
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (HarnessError, ProtocolViolation, StrictClient, env_summary, errors_in,  # noqa: E402
                     fail_exit, health_problems, kind_of, mib, purged_rss, start_server)

import numpy as np  # noqa: E402
import redis  # noqa: E402

from helpers.data import DATA_DIR  # noqa: E402
from helpers.onnx_models import NP_OF, blob, mexec  # noqa: E402
from test_dag_stress import (DEVICES, MODEL_FILES, SHARED, Dag, close, disconnect_mid_command,  # noqa: E402
                             model_key, run_model, settle_memory, store_models, used_memory)
from helpers.torch_models import entry, pt_blob  # noqa: E402

REPLY_TIMEOUT = 60.0
USED_MEMORY_SLACK = 2 << 20  # as test_dag_stress
RSS_SLACK = 48 << 20  # backends keep freed memory in their own allocators; a leak per command exceeds this
E_DELETED = "model key is empty"  # a run that found its model deleted a moment before: expected
SCRIPT_SRC = (entry("add", "return tensors[0] + tensors[1]")
              + entry("scale", "return tensors[0] * float(args[0])")
              + entry("pair", "return tensors[0] + 1, tensors[0] * 2"))
TF_KEY, TORCH_KEY = "tf@CPU:2", "torch@CPU:1"


def script_key(dev):
    return f"script@{dev}"


def store_all(con):
    """test_dag_stress's models and tensors, plus a TF model, a TORCH model and a script per device."""
    store_models(con)
    tf = (DATA_DIR / "tf_mul.pb").read_bytes()
    assert con.execute_command("AI.MODELSTORE", TF_KEY, "TF", "CPU:2", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                               "BLOB", tf) == b"OK"
    assert con.execute_command("AI.MODELSTORE", TORCH_KEY, "TORCH", "CPU:1", "BLOB", pt_blob("torch_add")) == b"OK"
    for dev in DEVICES:
        assert con.execute_command("AI.SCRIPTSTORE", script_key(dev), dev, "ENTRY_POINTS", 3, "add", "scale", "pair",
                                   "SOURCE", SCRIPT_SRC) == b"OK"


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()  # sent, replies, kinds of reply, actions
        self.errors = collections.Counter()  # error texts (top level and DAG entries)
        self.problems = []

    def merge(self, counts, errors):
        with self.lock:
            self.counts.update(counts)
            self.errors.update(errors)

    def problem(self, text):
        with self.lock:
            self.counts["problems"] += 1
            if len(self.problems) < 50:
                self.problems.append(text)


class Client:
    """One soak client: its own connection, random actions until the deadline, every reply counted and checked."""

    HEAVY = True  # may use heavy.onnx (slow: under valgrind, too slow)

    def __init__(self, srv, cid, seed, stats):
        self.srv, self.cid, self.stats = srv, cid, stats
        self.rng = random.Random(f"{seed}:{cid}")
        self.counts, self.errors = collections.Counter(), collections.Counter()
        self.con = None

    # ---- sending

    def connect(self):
        if self.con is not None:
            self.con.close()
        self.con = StrictClient(self.srv.port, REPLY_TIMEOUT)

    def call(self, *argv):
        """Send one command; its reply (redis-py style), or the ResponseError; None if the reply was lost."""
        self.counts["sent"] += 1
        try:
            reply = self.con.execute_command(*argv)
        except redis.exceptions.ResponseError as e:
            reply = e
        except ProtocolViolation as e:
            self.stats.problem(f"client {self.cid}: {e} for {' '.join(map(str, argv))[:300]}")
            self.counts["lost replies"] += 1
            self.connect()
            return None
        self.counts["replies"] += 1
        self.counts["TIMEDOUT" if self.con.last == "TIMEDOUT" else kind_of(self.con.last)] += 1
        for text in errors_in(self.con.last):
            self.errors[text[:90]] += 1
            if "internal error" in text or "panic" in text:
                self.stats.problem(f"client {self.cid}: {text!r} for {' '.join(map(str, argv))[:300]}")
        return reply

    def unexpected(self, what, argv, reply):
        self.stats.problem(f"client {self.cid}: {what}: {' '.join(map(str, argv))[:200]} -> {reply!r:.300} {str(reply)[:300]}")

    # ---- actions

    def new_dag(self):
        while True:
            dag = Dag(self.rng, self.cid)
            if self.HEAVY or not any(op.kind == "model" and "heavy@" in op.words[1] for op in dag.ops):
                return dag

    def dag(self):
        dag = self.new_dag()
        argv = dag.argv()
        reply = self.call(*argv)
        if reply is None:
            return
        if isinstance(reply, redis.exceptions.ResponseError):
            if str(reply) not in (dag.parse_error, E_DELETED):
                self.unexpected("DAG error", argv, reply)
            return
        _, _, problems = dag.check_reply(reply)
        for p in problems:
            self.unexpected(f"DAG: {p}", argv, reply)

    def modelexecute(self):
        kind = self.rng.choice(["lin", "mul", "two"])
        n_in, n_out = (2 if kind == "mul" else 1), (2 if kind == "two" else 1)
        ins = [self.rng.choice(["kA", "kA", "kB", "kI"]) for _ in range(n_in)]
        outs = [f"c{self.cid}:y{j}" for j in range(n_out)]
        timeout = ["TIMEOUT", self.rng.choice([1, 5, 100, 1000])] if self.rng.random() < 0.15 else []
        want = run_model(kind, [SHARED[k] for k in ins])
        argv = mexec(model_key(kind, self.rng.choice(DEVICES)), ins, outs, *timeout)
        self.check_run(argv, want, outs, timeout)

    def backend_execute(self):
        """The TF or TORCH model: a * b / a + b of kA with kA (ok) or kB (shapes do not broadcast)."""
        key = self.rng.choice([TF_KEY, TORCH_KEY])
        b = self.rng.choice(["kA", "kA", "kB"])
        ok = b == "kA"
        want = [SHARED["kA"] * SHARED["kA"] if key == TF_KEY else SHARED["kA"] + SHARED["kA"]] if ok else None
        self.check_run(mexec(key, ["kA", b], [f"c{self.cid}:b"]), want, [f"c{self.cid}:b"], [])

    def scriptexecute(self):
        fn = self.rng.choice(["add", "scale", "pair"])
        a = SHARED["kA"]
        if fn == "add":
            b = self.rng.choice(["kA", "kA", "kB"])
            ins, args, want = ["kA", b], [], [a + a] if b == "kA" else None
        elif fn == "scale":
            f = self.rng.choice(["2", "0.5", "x"])
            ins, args, want = ["kA"], [f], None if f == "x" else [a * np.float32(float(f))]
        else:
            ins, args, want = ["kA"], [], [a + 1, a * 2]
        outs = [f"c{self.cid}:s{j}" for j in range(2 if fn == "pair" else 1)]
        argv = ["AI.SCRIPTEXECUTE", script_key(self.rng.choice(DEVICES)), fn, "INPUTS", len(ins), *ins]
        if args:
            argv += ["ARGS", len(args), *args]
        argv += ["OUTPUTS", len(outs), *outs]
        timeout = ["TIMEOUT", self.rng.choice([1, 1000])] if self.rng.random() < 0.1 else []
        self.check_run(argv + timeout, want, outs, timeout)

    def check_run(self, argv, want, outs, timeout):
        """A single run: OK (and then, sometimes, the outputs read back) only if `want` says it can succeed."""
        reply = self.call(*argv)
        if reply is None:
            return
        if reply == b"TIMEDOUT":
            if not timeout:
                self.unexpected("TIMEDOUT without TIMEOUT", argv, reply)
        elif isinstance(reply, redis.exceptions.ResponseError):
            if want is not None and str(reply) != E_DELETED:
                self.unexpected("error for a run that must succeed", argv, reply)
        elif reply != b"OK" or want is None:
            self.unexpected("OK for a run that must fail" if reply == b"OK" else "reply", argv, reply)
        elif self.rng.random() < 0.3:
            for key, expected in zip(outs, want):
                got = self.call("AI.TENSORGET", key, "META", "BLOB")
                if got is None:
                    return
                try:
                    got = np.frombuffer(got[5], dtype=NP_OF[got[1]]).reshape(got[3])
                except Exception as e:  # noqa: BLE001  (whatever it is, it is not the tensor)
                    self.unexpected(f"reading {key}: {e!r}", argv, got)
                    continue
                if not close(got, expected.astype(got.dtype)):
                    self.unexpected(f"{key} holds {got.tolist()}, expected {expected.tolist()}", argv, reply)

    def replace_model(self):
        """MODELSTORE over a key in use: the same model (so every check still holds), another TAG/BATCHSIZE."""
        kind, dev = self.rng.choice(["lin", "mul", "two"]), self.rng.choice(DEVICES)
        opts = self.rng.choice([[], ["TAG", f"v{self.rng.randint(0, 9)}"]] + ([["BATCHSIZE", 4]] if kind == "lin"
                                                                               else []))
        reply = self.call("AI.MODELSTORE", model_key(kind, dev), "ONNX", dev, *opts, "BLOB", blob(MODEL_FILES[kind]))
        if reply is not None and reply != b"OK":
            self.unexpected("MODELSTORE", ["AI.MODELSTORE", model_key(kind, dev)], reply)
        self.counts["model replacements"] += 1

    def delete_model(self):
        """MODELDEL of a key others are running, then the same model stored again a moment later."""
        kind, dev = self.rng.choice(["lin", "mul", "two"]), self.rng.choice(DEVICES)
        key = model_key(kind, dev)
        reply = self.call("AI.MODELDEL", key)
        if reply is not None and reply != b"OK" and str(reply) != E_DELETED:  # another client deleted it first
            self.unexpected("MODELDEL", ["AI.MODELDEL", key], reply)
        time.sleep(self.rng.uniform(0, 0.02))
        reply = self.call("AI.MODELSTORE", key, "ONNX", dev, "BLOB", blob(MODEL_FILES[kind]))
        if reply is not None and reply != b"OK":
            self.unexpected("MODELSTORE", ["AI.MODELSTORE", key], reply)
        self.counts["model deletions"] += 1

    def disconnect(self):
        """A command cut off by its client: half sent, or sent and the connection closed (or reset) at once."""
        if self.rng.random() < 0.5:
            argv = self.new_dag().argv(persist_rename=lambda n: n + ":dc")
        elif self.HEAVY:
            argv = mexec(model_key("heavy", self.rng.choice(DEVICES)), ["kH"], [f"c{self.cid}:dc"])
        else:
            argv = mexec(model_key("lin", self.rng.choice(DEVICES)), ["kA"], [f"c{self.cid}:dc"])
        disconnect_mid_command(self.srv.port, argv, self.rng)
        self.counts["disconnects"] += 1

    ACTIONS = [(40, dag), (25, modelexecute), (5, backend_execute), (15, scriptexecute), (3, replace_model),
               (1, delete_model), (3, disconnect)]

    def run(self, deadline):
        actions, weights = [a for _, a in self.ACTIONS], [w for w, _ in self.ACTIONS]
        try:
            self.connect()
            while time.monotonic() < deadline:
                self.rng.choices(actions, weights)[0](self)
        except Exception as e:  # noqa: BLE001  (report; the other clients go on)
            self.stats.problem(f"client {self.cid}: {type(e).__name__}: {e}")
        finally:
            if self.con is not None:
                self.con.close()
            self.stats.merge(self.counts, self.errors)


def persistence_main(srv, every, stop, stats):
    """BGSAVE and BGREWRITEAOF in turn every `every` seconds; each reply counted by its text."""
    turn = 0
    while not stop.wait(every):
        cmd = ("BGSAVE", "BGREWRITEAOF")[turn % 2]
        turn += 1
        try:
            reply = srv.raw(cmd, timeout=REPLY_TIMEOUT)
        except (OSError, ConnectionError) as e:
            stats.problem(f"{cmd}: {type(e).__name__}: {e}")
            return
        stats.merge(collections.Counter({f"{cmd}: {reply}": 1}), {})


def wait_persistence_idle(srv, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = srv.info("persistence")
        if all(info.get(k, "0") == "0" for k in ("rdb_bgsave_in_progress", "aof_rewrite_in_progress",
                                                 "aof_rewrite_scheduled")):
            return info
        time.sleep(0.2)
    raise HarnessError(f"background save or AOF rewrite still running after {timeout} s")


def run_phase(srv, seconds, n_clients, seed, persist_every, stats):
    stop = threading.Event()
    clients = [Client(srv, cid, seed, stats) for cid in range(n_clients)]
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=c.run, args=(deadline,)) for c in clients]
    threads.append(threading.Thread(target=persistence_main, args=(srv, persist_every, stop, stats)))
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join()
    stop.set()
    threads[-1].join()


def memory(srv, con, bound=None):
    """used_memory and RSS once the keyspace is flushed, background saves are done and `con` is the only
    client; used_memory is waited for (up to 20 s) to come down to `bound`."""
    assert con.flushall() is True
    wait_persistence_idle(srv)
    time.sleep(1.0)
    mem = settle_memory(srv, con, bound) if bound is not None else min(used_memory(srv) for _ in range(3))
    return mem, purged_rss(srv)


def final_checks(srv, con):
    """After the soak: still computing right, background saves all succeeded, nobody left blocked."""
    problems = []
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "kA", "|>", "AI.MODELEXECUTE", "lin@CPU:2", "INPUTS", 1,
                              "kA", "OUTPUTS", 1, "y", "|>", "AI.SCRIPTEXECUTE", script_key("CPU:1"), "scale",
                              "INPUTS", 1, "y", "ARGS", 1, 2, "OUTPUTS", 1, "z", "|>", "AI.TENSORGET", "z", "BLOB")
    got = np.frombuffer(ret[2], dtype=np.float32).reshape(2, 3)
    if not close(got, (run_model("lin", [SHARED["kA"]])[0] * 2).astype(np.float32)):
        problems.append(f"the final DAG computed {got.tolist()}")
    info = wait_persistence_idle(srv)
    for k in ("rdb_last_bgsave_status", "aof_last_bgrewrite_status", "aof_last_write_status"):
        if info.get(k) != "ok":
            problems.append(f"INFO persistence {k}:{info.get(k)}")
    blocked = int(srv.info("clients")["blocked_clients"])
    if blocked:
        problems.append(f"{blocked} clients still blocked after every client finished")
    return problems


def soak(srv, args, seed):
    """Warm-up, baseline, the soak, the checks. Returns (stats, elapsed, memory numbers, problems)."""
    con = srv.client(socket_timeout=REPLY_TIMEOUT)
    store_all(con)
    # warm-up: every queue, worker, backend session and allocator arena exists before the baseline
    warm = Stats()
    run_phase(srv, args.warmup, args.clients, seed + 1, args.persist_every, warm)
    problems = [f"warm-up: {p}" for p in warm.problems]
    mem0, rss0 = memory(srv, con)
    print(f"after a warm-up of {warm.counts['sent']} commands: used_memory {mib(mem0)}, RSS {mib(rss0)}")

    store_all(con)
    stats = Stats()
    start = time.monotonic()
    run_phase(srv, args.minutes * 60, args.clients, seed, args.persist_every, stats)
    elapsed = time.monotonic() - start
    problems += stats.problems + final_checks(srv, con)
    mem1, rss1 = memory(srv, con, bound=mem0 + USED_MEMORY_SLACK)
    if mem1 > mem0 + USED_MEMORY_SLACK:
        problems.append(f"used_memory {mib(mem1)} after the soak, {mib(mem0)} after the warm-up")
    if rss1 > rss0 + RSS_SLACK:
        problems.append(f"RSS {mib(rss1)} after the soak, {mib(rss0)} after the warm-up")
    problems += health_problems(srv)
    if not problems:  # the AOF written under all this must load (and replay to the empty keyspace)
        con.close()
        srv.restart()
        if srv.client().dbsize() != 0:
            problems.append("the AOF did not replay to the empty keyspace it ended with")
        problems += health_problems(srv)
        print(f"restart: the AOF loaded{'' if not problems else ' with problems'}")
    return stats, elapsed, (mem0, mem1, rss0, rss1), problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default 10)")
    ap.add_argument("--clients", type=int, default=20, help="client threads (default 20)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds of the same traffic before the memory "
                                                                "baseline is taken (default 20)")
    ap.add_argument("--persist-every", type=float, default=5.0, help="seconds between BGSAVE/BGREWRITEAOF")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"soak: {args.minutes} min, {args.clients} clients, seed {seed}; {env_summary()}")
    try:
        srv = start_server("soak", server_args=["--appendonly", "yes"],
                           module_args=["THREADS_PER_QUEUE", "2", "INTRA_OP_PARALLELISM", "1"])
    except HarnessError as e:
        print(f"soak: cannot start the server: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"server: {srv.describe()}")
    try:
        stats, elapsed, (mem0, mem1, rss0, rss1), problems = soak(srv, args, seed)
    finally:
        srv.stop()

    c = stats.counts
    kinds = {k: c[k] for k in ("ok", "TIMEDOUT", "status", "error", "array", "bulk", "integer", "nil") if c[k]}
    print(f"soak: {elapsed / 60:.1f} min, {args.clients} clients: {c['sent']} commands sent, {c['replies']} replies "
          f"{kinds}, {c['lost replies']} lost; {c['disconnects']} disconnects mid-command, "
          f"{c['model replacements']} model replacements, {c['model deletions']} model deletions; "
          f"{c['sent'] / max(elapsed, 1e-9):.0f} commands/s")
    print(f"background saves: { {k: v for k, v in sorted(c.items()) if k.startswith('BG')} }")
    print("errors by text:")
    for text, n in stats.errors.most_common(25):
        print(f"  {n:8d}  {text}")
    print(f"used_memory: after warm-up {mib(mem0)} ({mem0} bytes), after the soak {mib(mem1)} ({mem1} bytes); "
          f"RSS: after warm-up {mib(rss0)}, after the soak {mib(rss1)}")
    print(f"server directory (log, AOF): {srv.dir}")
    if c["sent"] != c["replies"] + c["lost replies"]:
        problems.append(f"{c['sent']} commands sent but {c['replies']} replies and {c['lost replies']} lost")
    fail_exit(problems, f"soak (seed {seed})")


if __name__ == "__main__":
    main()
