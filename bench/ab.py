"""Same-run A/B of module builds on the tiny-model workload of `bench.py --only execute`: each build on its own
server, PING / MODELEXECUTE / DAG at 50 clients, rounds interleaved across the builds so that the machine's speed
changes (docs/benchmarks.md) hit every build alike. Prints req/s and main-thread µs per request of each round and
the ratios against PING.

Usage: `REDISAI_ONNX_LIB=… .venv/bin/python bench/ab.py old/libredisai.so,new/libredisai.so [rounds] [requests]`
(build the old one from a worktree, e.g. `git worktree add /tmp/old <rev> && cargo build --release` there).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main():
    libs = sys.argv[1].split(",")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
    servers = {}
    try:
        for lib in libs:
            bench.MODULE = lib
            s = bench.Server()
            servers[lib] = s
            bench.prepare_tiny(s)
        res = {(lib, c): [] for lib in libs for c in ("PING", "EXEC", "DAG")}
        for _ in range(rounds):
            for lib in libs:
                for name, cmd in (("PING", ("PING",)), ("EXEC", bench.EXECUTE), ("DAG", bench.DAG)):
                    (rps, _, _), cpu = bench.cpu_per_request(servers[lib], n, *cmd)
                    res[(lib, name)].append((rps, cpu[0]))
    finally:
        for s in servers.values():
            s.stop()
    for lib in libs:
        print(lib)
        for c in ("PING", "EXEC", "DAG"):
            v = res[(lib, c)]
            print("  %-5s req/s %s   main us %s" % (c, " ".join("%7.0f" % x[0] for x in v),
                                                  " ".join("%5.2f" % x[1] for x in v)))
        for c in ("EXEC", "DAG"):
            ratios = (a[0] / p[0] for a, p in zip(res[(lib, c)], res[(lib, "PING")]))
            print("  %s/PING: %s" % (c, " ".join("%.3f" % r for r in ratios)))


if __name__ == "__main__":
    main()
