"""Queue wait and backend time of one model under 1, 8 and 32 clients, read from the module's INFO fields alone
(docs/commands.md, "Observability"): heavy.onnx with one row per request, driven by redis-benchmark; before each
load AI.INFO RESETSTAT, after it INFO's `ai_keys` line of the model. Prints a table and writes an SVG chart
(docs/observability.svg by default) of the p50/p99 of queue wait and backend time.

    REDISAI_ONNX_LIB=… .venv/bin/python bench/observability.py [--requests 3000] [--svg docs/observability.svg]
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

CLIENTS = (1, 8, 32)
SERIES = (("queue_p50_us", "queue wait p50", "#9ecae1"), ("queue_p99_us", "queue wait p99", "#3182bd"),
          ("backend_p50_us", "backend p50", "#fdae6b"), ("backend_p99_us", "backend p99", "#e6550d"))


def key_line(server, key):
    """The model's `ai_keys` INFO line as a dict of integers."""
    for line in server.cli("INFO", "ai_keys").splitlines():
        if line.startswith(f"ai_model_{key}:"):
            return {k: int(v) for k, v in (kv.split("=") for kv in line.split(":", 1)[1].split(","))}
    raise RuntimeError(f"no ai_keys line for {key}")


def queue_line(server, dev="CPU"):
    out = {}
    for line in server.cli("INFO", "ai_queues").splitlines():
        if line.startswith(f"ai_queue_{dev}_"):
            name, value = line.split(":", 1)
            out[name[len(f"ai_queue_{dev}_"):]] = int(value)
    return out


def svg(rows, path):
    """Grouped bars (µs, log scale) per client count: four series."""
    import math

    width, height, left, top, bottom = 640, 320, 70, 30, 50
    plot_h = height - top - bottom
    vmax = max(r[s] for r in rows.values() for s, _, _ in SERIES) or 1
    decades = max(1, math.ceil(math.log10(vmax)))
    y = lambda v: top + plot_h - plot_h * (math.log10(max(v, 1)) / decades)  # noqa: E731
    group_w = (width - left - 20) / len(rows)
    bar_w = group_w / (len(SERIES) + 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="16" font-size="13">heavy.onnx, one row per request: queue wait and backend time '
             f'(µs, log scale)</text>']
    for d in range(decades + 1):
        yy = y(10 ** d)
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{10 ** d:g}</text>')
    for gi, (clients, r) in enumerate(rows.items()):
        x0 = left + gi * group_w + bar_w / 2
        for si, (field, _, color) in enumerate(SERIES):
            x = x0 + si * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{y(r[field]):.1f}" width="{bar_w * 0.9:.1f}" '
                         f'height="{top + plot_h - y(r[field]):.1f}" fill="{color}"/>')
        parts.append(f'<text x="{x0 + bar_w * len(SERIES) / 2:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                     f'{clients} client{"s" if clients > 1 else ""}</text>')
    for si, (_, label, color) in enumerate(SERIES):
        lx = left + si * 140
        parts.append(f'<rect x="{lx}" y="{height - 18}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{height - 9}">{label}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--svg", default=os.path.join(bench.ROOT, "docs", "observability.svg"))
    a = ap.parse_args()
    s = bench.Server()
    rows = {}
    try:
        with open(os.path.join(bench.DATA, "heavy.onnx"), "rb") as f:
            s.cli("-x", "AI.MODELSTORE", "h", "ONNX", "CPU", "BLOB", stdin=f.read())
        s.cli("-x", "AI.TENSORSET", "x", "FLOAT", "1", "256", "BLOB", stdin=struct.pack("<256f", *[0.5] * 256))
        cmd = ("AI.MODELEXECUTE", "h", "INPUTS", "1", "x", "OUTPUTS", "1", "y")
        bench.redis_benchmark(s.port, 1, 200, *cmd)  # warm-up
        for clients in CLIENTS:
            assert s.cli("AI.INFO", "h", "RESETSTAT") == "OK"
            rps, p50_ms, p99_ms = bench.redis_benchmark(s.port, clients, a.requests, *cmd)
            r = key_line(s, "h")
            r.update(rps=rps, client_p50_us=p50_ms * 1000, client_p99_us=p99_ms * 1000, queue=queue_line(s))
            rows[clients] = r
    finally:
        s.stop()
    print("== heavy.onnx, one row per request, %d requests per load (µs, from INFO's ai_keys line)" % a.requests)
    print("%8s %8s %10s %10s %10s %10s %10s %10s %9s %9s" % (
        "clients", "req/s", "queue p50", "queue p99", "backend50", "backend99", "total p50", "total p99",
        "inline", "queued"))
    for clients, r in rows.items():
        print("%8d %8.0f %10d %10d %10d %10d %10d %10d %9d %9d" % (
            clients, r["rps"], r["queue_p50_us"], r["queue_p99_us"], r["backend_p50_us"], r["backend_p99_us"],
            r["total_p50_us"], r["total_p99_us"], r["inline_runs"], r["queued_runs"]))
    print("client-side p50/p99 (redis-benchmark, µs): " + ", ".join(
        "%d clients %.0f/%.0f" % (c, r["client_p50_us"], r["client_p99_us"]) for c, r in rows.items()))
    svg(rows, a.svg)
    print("chart: %s" % a.svg)


if __name__ == "__main__":
    main()
