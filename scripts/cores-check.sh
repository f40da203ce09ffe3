#!/usr/bin/env bash
# Issue 32's CPU rows, and issue 33's figures of isolated against in-process execution, on a machine with more
# cores. The rows still missed on the 2-vCPU development VM (tiny and DAG against PING at 50 clients, auto-batching
# gain, two devices, idle CPU with THREADS_PER_QUEUE 4, batch-1 overhead; isolated: the tiny model at 50 clients
# and heavy.onnx at one row) are bounded by its two cores: the main thread, the backend's threads, the worker
# processes and redis-benchmark contend for them (docs/benchmarks.md). This runs the same `bench/bench.py` parts
# and `bench/ab_workloads.py` elsewhere and prints ONE summary line, `CORES-CHECK ...`, with the issues' goals
# beside each figure. It takes about three minutes.
#
#   scripts/cores-check.sh bundle [DIR]   here, after `make build`: the stripped module and its worker, ONNX
#                                         Runtime, Redis 7.0 (redis-server, redis-cli, redis-benchmark: the
#                                         bench's own server) with every library they need but glibc's, and the
#                                         in-process baselines (examples/ort_inprocess, backend_inprocess) in DIR
#                                         (default target/cores-bundle, about 51 MB)
#   scripts/cores-check.sh run [DIR]      on the other machine, in a clone of the repository (bench/ and
#                                         tests/data/ come from it): python3 (standard library only) and
#                                         glibc >= 2.34 are all it needs. The whole output goes to
#                                         $OUT/cores-check.log when OUT is set, else DIR/cores-check.log.
#
# Environment: PYTHON (python3); REDISAI_TF_LIB, a libtensorflow_cc.so.2 of TensorFlow 2.21 on that machine, adds
# the TF fraud row (TensorFlow's libraries are too big to carry). Exit status: 0 when every part ran, 1 otherwise.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ORT_VERSION=1.31.1

die() { echo "cores-check: $*" >&2; exit 1; }

# The shared libraries `bin` needs, but glibc's own (the other machine's loader must be its own glibc).
libs_of() {
  ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so'
}

bundle() {
  local out release ort
  out=$(realpath -m "${1:-$repo/target/cores-bundle}")
  release=$repo/target/release
  ort=${REDISAI_ONNX_LIB:-$HOME/.cache/redisai-rs/onnxruntime-$ORT_VERSION/lib/libonnxruntime.so.$ORT_VERSION}
  [[ -f $release/libredisai.so ]] || die "$release/libredisai.so is missing (make build)"
  [[ -f $ort ]] || die "$ort is missing (make build fetches it)"
  local server cli bench
  server=$(readlink -f "$(command -v redis-server)") || die "no redis-server on PATH"
  cli=$(command -v redis-cli) && bench=$(command -v redis-benchmark) || die "no redis-cli / redis-benchmark on PATH"
  rm -rf "${out:?}"
  mkdir -p "$out"/{bin,lib}
  strip --strip-debug -o "$out/redisai.so" "$release/libredisai.so"
  # EXECUTION_MODE ISOLATED finds its worker beside the module.
  [[ -x $release/redisai-worker ]] || die "$release/redisai-worker is missing (make build)"
  strip --strip-debug -o "$out/redisai-worker" "$release/redisai-worker"
  # The server under its own name: Redis picks its mode from argv[0] (Debian's is a link to redis-check-rdb).
  cp "$server" "$out/bin/redis-server"
  cp "$cli" "$bench" "$out/bin/"
  cp "$ort" "$out/lib/"
  local inprocess=("$release/examples/ort_inprocess" "$repo/target/leakcheck/release/examples/backend_inprocess")
  for f in "${inprocess[@]}"; do
    if [[ -x $f ]]; then
      strip --strip-debug -o "$out/bin/$(basename "$f")" "$f"
    else
      echo "cores-check: $f is not built (make bench builds it): its in-process figures will be missing" >&2
    fi
  done
  # shellcheck disable=SC2046
  cp -L $(libs_of "$out"/bin/* "$out/redisai.so" "$out/redisai-worker") "$out/lib/"
  du -sh "$out" | awk '{ print "cores-check: bundle of " $1 " in '"$out"'" }' >&2
}

run() {
  local dir py log rc=0
  dir=$(realpath -m "${1:-$repo/target/cores-bundle}")
  [[ -f $dir/redisai.so ]] || die "no bundle at $dir (scripts/cores-check.sh bundle)"
  py=${PYTHON:-python3}
  log=${OUT:-$dir}/cores-check.log
  export PATH="$dir/bin:$PATH" LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export REDIS_SERVER=$dir/bin/redis-server REDISAI_MODULE=$dir/redisai.so
  export REDISAI_ONNX_LIB=$dir/lib/libonnxruntime.so.$ORT_VERSION
  export REDISAI_ORT_INPROCESS=$dir/bin/ort_inprocess REDISAI_BACKEND_INPROCESS=$dir/bin/backend_inprocess
  # No TORCH here: its backend library needs libtorch (GBs).
  export REDISAI_TORCH_LIB=/nonexistent
  {
    echo "== cores-check on $(hostname): $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo))"
    "$REDIS_SERVER" --version
  } >"$log"
  local parts=("execute" "batching" "devices" "idle" "idle THREADS_PER_QUEUE 4" "latency-intra1")
  [[ -n ${REDISAI_TF_LIB:-} ]] && parts+=("tf")
  # part <label> <command...>: one part of the log, its output under its label; a failure is logged and counted.
  part() {
    local label=$1
    shift
    echo "== part: $label" >>"$log"
    echo "cores-check: $label" >&2
    if ! "$@" >>"$log" 2>&1; then
      echo "== part failed: $label" >>"$log"
      rc=1
    fi
  }
  local p only args
  for p in "${parts[@]}"; do
    read -r only args <<<"$p"
    part "$p" "$py" "$repo/bench/bench.py" --only "$only" --module-args "${args:-}"
  done
  # Issue 33's figures: the backends in worker processes against in this one, interleaved rounds.
  part isolation "$py" "$repo/bench/ab_workloads.py" "in_process=$REDISAI_MODULE" \
    "isolated=$REDISAI_MODULE+EXECUTION_MODE,ISOLATED" --rounds 3 --only "tiny ONNX req" \
    --only "heavy.onnx 1 row p50" --only "heavy.onnx 64"
  "$py" - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
parts = dict(re.findall(r"^== part: (.+)\n((?:(?!== part: ).*\n)*)", text, re.M))
def find(part, pattern, conv=float):
    m = re.search(pattern, parts.get(part, ""), re.M)
    return conv(m.group(1)) if m else None
cores = re.search(r"(\d+) cores", text).group(1)
def intra1(i):
    """A number of latency-intra1's heavy.onnx 1-row line: 8 its overhead over the back-to-back run and PING, 11 over
    the paced run and PING."""
    m = re.search(r"^ONNX\s+heavy\.onnx\s+1\s.*$", parts.get("latency-intra1", ""), re.M)
    nums = re.findall(r"-?\d+(?:\.\d+)?", m.group(0)) if m else []
    return float(nums[i]) if len(nums) > i else None
rows = [
    ("tiny/PING", find("execute", r"ratio MODELEXECUTE/PING, inline \(default\): ([\d.]+)"), ">=", 0.9),
    ("dag/PING", find("execute", r"ratio DAG/PING, inline \(default\): ([\d.]+)"), ">=", 0.9),
    ("batching", find("batching", r"batched/unbatched throughput: ([\d.]+)"), ">=", 4.0),
    ("devices", find("devices", r"two-device/one-device latency: ([\d.]+)"), "<=", 0.52),
    ("idle_ticks_over_plain", find("idle", r"\(([\d.-]+) ticks"), "<=", 1.0),
    ("idle_tpq4_ticks_over_plain", find("idle THREADS_PER_QUEUE 4", r"\(([\d.-]+) ticks"), "<=", 1.0),
    ("onnx_intra1_overhead_us", intra1(8), "<=", 20.0),
    ("onnx_intra1_overhead_paced_us", intra1(11), "<=", 20.0),
    ("tf_fraud/PING", find("tf", r"throughput ratio MODELEXECUTE/PING: ([\d.]+)"), ">=", 0.6),
    ("isolated/in_process_tiny", find("isolation", r"^tiny ONNX req/s \(50 clients\).*\s([\d.]+)\s*$"), ">=", 0.85),
    ("isolated/in_process_heavy1", find("isolation", r"^heavy\.onnx 1 row p50 us.*\s([\d.]+)\s*$"), "<=", 1.05),
    ("isolated/in_process_heavy64", find("isolation", r"^heavy\.onnx 64 rows p50 us.*\s([\d.]+)\s*$"), "<=", 1.05),
]
out, met, ran = [], 0, 0
for name, value, op, goal in rows:
    if value is None:
        out.append(f"{name}=n/a")
        continue
    ok = value >= goal if op == ">=" else value <= goal
    ran += 1
    met += ok
    out.append(f"{name}={value:g}({op}{goal:g}:{'met' if ok else 'MISSED'})")
print(f"CORES-CHECK cores={cores} met={met}/{ran} " + " ".join(out))
PY
  echo "cores-check: the whole output is in $log" >&2
  return $rc
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,21s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 64 ;;
esac
