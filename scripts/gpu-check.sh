#!/usr/bin/env bash
# GPU check of redisai-rs: on a machine with an NVIDIA GPU, start redis-server with the module and the GPU
# flavour of its backends, then
#   1. store a TorchScript model and an ONNX model on GPU:0 and check their outputs against the CPU results,
#   2. check that GPU:<number of GPUs> (a card that is not there) is refused with an error,
#   3. run a DAG with one heavy branch on CPU and one on GPU:0: print its latency over the serial sum,
#   4. print the GPU/CPU throughput ratio of a compute-bound model (heavy.onnx; torch_slow.pt for TORCH),
# and print ONE summary line, `GPU-CHECK <PASS|FAIL|SKIP|NO-GPU> ...`. It takes a minute or two.
#
#   scripts/gpu-check.sh            from the repo after `make build GPU=1`, or as ./gpu-check.sh from the
#                                   bundle of `make gpu-bundle` (its README-gpu.txt)
#   scripts/gpu-check.sh --dry-run-on-cpu
#                                   the same checks with CPU:1 in place of GPU:0 and the CPU backends (no GPU
#                                   needed): tests the script itself, its numbers mean nothing
#
# Exit status: 0 PASS (every check that ran passed, at least one backend ran on the GPU), 1 FAIL, 2 NO-GPU
# (no NVIDIA GPU here: nothing was started), 3 SKIP (a GPU, but neither GPU backend could be loaded).
#
# What the machine must provide (nothing is downloaded): an NVIDIA driver for CUDA 13 (>= 580) and
# nvidia-smi; python3 (standard library only); for TORCH, torch==2.13.0 built for CUDA 13.0 (the PyPI wheel,
# whose nvidia-* wheels bring cuDNN 9.20, cuBLAS 13, NCCL ...); for ONNX, onnxruntime-gpu==1.31.1 (CUDA 13,
# cuDNN 9). Environment overrides:
#   REDIS_SERVER    server binary (default: the bundle's bin/redis-server, else redis-server on PATH)
#   REDISAI_MODULE  the module (default: the bundle's redisai.so, else target/release/libredisai.so)
#   TORCH_BACKEND   the GPU flavour of the TORCH backend (default: the bundle's / target/gpu's
#                   libredisai_torch_cuda.so)
#   TORCH_LIB_DIR   torch 2.13.0's lib dir (default: that of `python3 -c 'import torch'`)
#   ORT_GPU_LIB     libonnxruntime.so.1.31.1 of onnxruntime-gpu, with libonnxruntime_providers_cuda.so beside it
#                   (default: the GPU build's cache, else python3's onnxruntime if it has the CUDA provider)
#   CUDA_LIB_DIRS   more library dirs (':'-separated) for the CUDA libraries (default: every
#                   site-packages/nvidia/*/lib of python3)
#   PYTHON          python3
#   GPU_CHECK_SECONDS  seconds of each throughput measurement (default 4)
#   GPU_CHECK_MODULE_ARGS  load-time arguments for the module, e.g. "EXECUTION_MODE ISOLATED" to run the
#                   backends in worker processes (redisai-worker beside the module, as the bundle ships it)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
TORCH_VERSION=2.13.0
ORT_VERSION=1.31.1

say() { echo "gpu-check: $*" >&2; }
summary() { echo "GPU-CHECK $*"; }

dry=0
case ${1:-} in
  --dry-run-on-cpu) dry=1 ;;
  "") ;;
  *) sed -n '2,33s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 64 ;;
esac

# ---- 1. Is there a GPU at all? (nothing else is needed to answer that)
if [[ $dry -eq 1 ]]; then
  gpus="none (dry run: CPU:1 stands for GPU:0)"
  ngpu=0
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  say "no NVIDIA GPU here: nvidia-smi is not on PATH, so there is nothing to check."
  say "Run this on a machine with an NVIDIA GPU and driver (docs/commands.md, section GPU)."
  summary "NO-GPU nvidia-smi not found"
  exit 2
else
  # only what a successful query prints: without a card, nvidia-smi prints its complaint and fails
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) || gpus=
  gpus=$(sed '/^[[:space:]]*$/d' <<<"$gpus")
  ngpu=$(printf '%s' "$gpus" | grep -c . || true)
  if [[ $ngpu -eq 0 ]]; then
    say "nvidia-smi is here but lists no GPU ($(nvidia-smi -L 2>&1 | head -n1)): nothing to check."
    summary "NO-GPU nvidia-smi lists no GPU"
    exit 2
  fi
fi
gpu0=$(head -n1 <<<"$gpus")
say "$ngpu GPU(s): $(paste -sd';' <<<"$gpus")"
if ! command -v "$python" >/dev/null; then
  say "python3 is needed (standard library only)"
  summary "FAIL no python3"
  exit 1
fi

# ---- 2. What to run: the bundle's files, or the repo's build
if [[ -f $here/redisai.so ]]; then
  module=${REDISAI_MODULE:-$here/redisai.so}
  torch_backend=${TORCH_BACKEND:-$here/backends/redisai_torch/libredisai_torch_cuda.so}
  models=$here/models
  server=${REDIS_SERVER:-$here/bin/redis-server}
  ort_cache=
else
  repo=$(cd "$here/.." && pwd)
  module=${REDISAI_MODULE:-$repo/target/release/libredisai.so}
  torch_backend=${TORCH_BACKEND:-$repo/target/gpu/libredisai_torch_cuda.so}
  models=$repo/tests/data
  server=${REDIS_SERVER:-$(command -v redis-server || true)}
  ort_cache=$(REDISAI_BACKENDS_MANIFEST=$repo/scripts/backends-gpu.manifest \
    "$repo/scripts/fetch-backend.sh" --dir gpu-onnxruntime 2>/dev/null)/lib
fi
if [[ $dry -eq 1 ]]; then
  # The CPU builds stand in for the GPU flavour.
  if [[ -n ${repo:-} ]]; then
    TORCH_BACKEND=${TORCH_BACKEND:-$repo/target/release/libredisai_torch.so}
    ORT_GPU_LIB=${ORT_GPU_LIB:-$("$repo/scripts/fetch-backend.sh" --dir onnxruntime)/lib/libonnxruntime.so.$ORT_VERSION}
  else
    TORCH_BACKEND=${TORCH_BACKEND:-$here/backends/redisai_torch/libredisai_torch.so}
  fi
  torch_backend=$TORCH_BACKEND
  TORCH_LIB_DIR=${TORCH_LIB_DIR:-$(dirname "$torch_backend")}
  CUDA_LIB_DIRS=${CUDA_LIB_DIRS:-/nonexistent}
fi
[[ -f $module ]] || { say "module not found: $module"; summary "FAIL no module"; exit 1; }
if [[ ! -x $server ]]; then
  say "redis-server not found: ${server:-none} (set REDIS_SERVER)"
  summary "FAIL no redis-server"
  exit 1
fi

# ---- 3. The CUDA libraries of the machine: torch 2.13.0, onnxruntime-gpu 1.31.1, the nvidia-* wheels
read -r py_torch_version py_torch_lib < <("$python" - <<'PY' 2>/dev/null || echo "none none"
import os
try:
    import torch
    print(torch.__version__.split("+")[0], os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    print("none", "none")
PY
)
torch_lib=${TORCH_LIB_DIR:-}
torch_skip=
if [[ -z $torch_lib ]]; then
  if [[ $py_torch_version == "$TORCH_VERSION" ]]; then
    torch_lib=$py_torch_lib
  elif [[ $py_torch_version == none ]]; then
    torch_skip="no torch in $python (need torch==$TORCH_VERSION with CUDA; or set TORCH_LIB_DIR)"
  else
    torch_skip="$python has torch $py_torch_version, the backend is built for $TORCH_VERSION (set TORCH_LIB_DIR)"
  fi
fi
if [[ -z $torch_skip && $dry -eq 0 ]]; then
  [[ -f $torch_lib/libtorch_cuda.so ]] || torch_skip="no libtorch_cuda.so in $torch_lib (a CPU-only torch?)"
  [[ -f $torch_backend ]] || torch_skip="TORCH GPU backend not found: $torch_backend (make build GPU=1)"
fi

cuda_dirs=${CUDA_LIB_DIRS:-$("$python" - <<'PY' 2>/dev/null
import glob, os, site, sys
dirs = []
for sp in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib"))):
        if d not in dirs:
            dirs.append(d)
print(":".join(dirs))
PY
)}

ort_lib=${ORT_GPU_LIB:-}
if [[ -z $ort_lib ]]; then
  for cand in "${ort_cache:+$ort_cache/libonnxruntime.so.$ORT_VERSION}" \
    "$("$python" -c 'import onnxruntime as o, os; print(os.path.join(os.path.dirname(o.__file__), "capi"))' 2>/dev/null)"; do
    [[ -n $cand ]] || continue
    [[ -d $cand ]] && cand=$(ls "$cand"/libonnxruntime.so.1.* 2>/dev/null | head -n1)
    if [[ -n $cand && -f $cand && -f $(dirname "$cand")/libonnxruntime_providers_cuda.so ]]; then
      ort_lib=$cand
      break
    fi
  done
fi
ort_skip=
if [[ -z $ort_lib ]]; then
  ort_skip="no onnxruntime-gpu (need onnxruntime-gpu==$ORT_VERSION with libonnxruntime_providers_cuda.so;"
  ort_skip+=" or set ORT_GPU_LIB)"
elif [[ $dry -eq 0 && ! -f $(dirname "$ort_lib")/libonnxruntime_providers_cuda.so ]]; then
  ort_skip="no libonnxruntime_providers_cuda.so beside $ort_lib"
fi

ld_path=$(printf '%s\n' "$torch_lib" "$cuda_dirs" "${LD_LIBRARY_PATH:-}" | sed '/^$/d' | paste -sd:)

# dl_error <lib>...: open the libraries in order as the server would (with its LD_LIBRARY_PATH) and print why
# one cannot be opened, if one cannot: the server itself only answers `ERR error loading backend`, or for
# ONNX, `couldn't find CUDA` at the first GPU model.
dl_error() {
  LD_LIBRARY_PATH=$ld_path "$python" - "$@" <<'PY' 2>&1
import ctypes, os, sys
try:
    for lib in sys.argv[1:-1]:
        ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    ctypes.CDLL(sys.argv[-1], mode=os.RTLD_LAZY)
except OSError as e:
    print(e)
PY
}
if [[ $dry -eq 0 && -z $torch_skip ]]; then
  err=$(dl_error "$torch_backend")
  [[ -z $err ]] || torch_skip="cannot open the TORCH GPU backend: $err"
fi
if [[ $dry -eq 0 && -z $ort_skip ]]; then
  ort_dir=$(dirname "$ort_lib")
  err=$(dl_error "$ort_dir/libonnxruntime_providers_shared.so" "$ort_dir/libonnxruntime_providers_cuda.so")
  [[ -z $err ]] || ort_skip="cannot open ONNX Runtime's CUDA provider: $err"
fi
say "server:  $server"
say "module:  $module"
say "TORCH:   ${torch_skip:-$torch_backend with torch $TORCH_VERSION in $torch_lib}"
say "ONNX:    ${ort_skip:-$ort_lib}"
say "LD_LIBRARY_PATH=$ld_path"

# ---- 4. The server
work=$(mktemp -d "${TMPDIR:-/tmp}/redisai-gpu-check.XXXXXX")
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The workers (EXECUTION_MODE ISOLATED) name on stderr each system call their sandbox refuses.
REDISAI_WORKER_LOG_REFUSALS=1 LD_LIBRARY_PATH=$ld_path "$server" --port "$port" --bind 127.0.0.1 --dir "$work" --save '' --appendonly no \
  --daemonize no --logfile "$work/redis.log" \
  --loadmodule "$module" ${GPU_CHECK_MODULE_ARGS:-} >"$work/stdout.log" 2>&1 &
server_pid=$!
cleanup() { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; }
trap cleanup EXIT

DEVICE=$([[ $dry -eq 1 ]] && echo CPU:1 || echo GPU:0) GPU_NAME=$gpu0 NGPU=$ngpu PORT=$port MODELS=$models \
  TORCH_BACKEND=$torch_backend TORCH_SKIP=$torch_skip \
  ORT_LIB=$ort_lib ORT_SKIP=$ort_skip "$python" - <<'PY'
import math, os, random, socket, statistics, struct, sys, time

E = os.environ
PORT, NGPU, MODELS, DEV = int(E["PORT"]), int(E["NGPU"]), E["MODELS"], E["DEVICE"]
DRY = DEV != "GPU:0"
results = {}  # name -> "pass" | "fail: why" | "skip: why"
metrics = []  # "name=value" for the summary line
failed = []


def log(msg):
    print(f"gpu-check: {msg}", file=sys.stderr, flush=True)


class Error(Exception):
    pass


class Client:
    def __init__(self, port, timeout=120):
        deadline = time.time() + 30
        while True:
            try:
                self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return Error(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError(f"bad reply {line!r}")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.s.sendall(b"".join(out))
        r = self._reply()
        if isinstance(r, Error):
            raise r
        return r


def floats(n, seed, lo=-1.0, hi=1.0):
    rng = random.Random(seed)
    return [rng.uniform(lo, hi) for _ in range(n)]


def tensorset(c, key, shape, values):
    c.call("AI.TENSORSET", key, "FLOAT", *shape, "BLOB", struct.pack(f"<{len(values)}f", *values))


def tensorget(c, key):
    r = c.call("AI.TENSORGET", key, "META", "BLOB")
    assert r[1] == b"FLOAT", r[:4]
    blob = r[5]
    return r[3], struct.unpack(f"<{len(blob) // 4}f", blob)


def max_diff(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def blob(name):
    with open(os.path.join(MODELS, name), "rb") as f:
        return f.read()


def execute(c, key, ins, outs):
    return c.call("AI.MODELEXECUTE", key, "INPUTS", len(ins), *ins, "OUTPUTS", len(outs), *outs)


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def check(name, fn):
    try:
        fn()
        results[name] = "pass"
        log(f"{name}: pass")
        return True
    except Exception as e:  # noqa: BLE001 - every failure is reported, the check goes on
        results[name] = f"fail: {e}"
        failed.append(name)
        log(f"{name}: FAIL: {e}")
        return False


try:
    c = Client(PORT)
    c.call("PING")
except Exception as e:  # noqa: BLE001
    print(f"GPU-CHECK FAIL gpus={NGPU} the server does not answer: {e}", flush=True)
    sys.exit(1)

# ---- backends
backends = {}  # "TORCH"/"ONNX" -> usable on GPU
for be, lib, skip in (("TORCH", E.get("TORCH_BACKEND"), E.get("TORCH_SKIP")),
                      ("ONNX", E.get("ORT_LIB"), E.get("ORT_SKIP"))):
    if skip:
        results[be] = f"skip: {skip}"
        log(f"{be}: skipped: {skip}")
        continue
    try:
        c.call("AI.CONFIG", "LOADBACKEND", be, lib)
        backends[be] = True
        log(f"{be}: loaded {lib}")
    except Error as e:
        results[be] = f"fail: LOADBACKEND {lib}: {e}"
        failed.append(be)
        log(f"{be}: FAIL: cannot load {lib}: {e}")

# ---- 1. the same outputs on GPU:0 as on CPU
TOL = 1e-3


def same_on_gpu(backend, model, inputs, nout):
    """Store `model` on CPU and GPU:0, run both on `inputs` [(shape, values)], compare every output."""
    data = blob(model)
    for dev in ("CPU", DEV):
        c.call("AI.MODELSTORE", f"{model}:{dev}", backend, dev, "BLOB", data)
    names = []
    for i, (shape, values) in enumerate(inputs):
        tensorset(c, f"in{i}", shape, values)
        names.append(f"in{i}")
    got = {}
    for dev in ("CPU", DEV):
        outs = [f"out{j}:{dev}" for j in range(nout)]
        execute(c, f"{model}:{dev}", names, outs)
        got[dev] = [tensorget(c, o) for o in outs]
    for j, ((shape_c, vc), (shape_g, vg)) in enumerate(zip(got["CPU"], got[DEV])):
        if shape_c != shape_g:
            raise AssertionError(f"{model} output {j}: shape {shape_g} on {DEV}, {shape_c} on CPU")
        d = max_diff(vc, vg)
        if not d <= TOL * max(1.0, max(abs(x) for x in vc)):
            raise AssertionError(f"{model} output {j}: max |GPU - CPU| = {d:.3g}")
    info = c.call("AI.INFO", f"{model}:{DEV}")
    dev = info[info.index(b"device") + 1] if b"device" in info else None
    if dev != DEV.encode():
        raise AssertionError(f"AI.INFO device {dev!r}")


if "TORCH" in backends:
    check("torch_add", lambda: same_on_gpu("TORCH", "torch_add.pt",
                                           [([2, 3], floats(6, 1)), ([2, 3], floats(6, 2))], 1))
    check("torch_two_outputs", lambda: same_on_gpu("TORCH", "torch_two_outputs.pt", [([4, 5], floats(20, 3))], 2))
    check("torch_slow", lambda: same_on_gpu("TORCH", "torch_slow.pt", [([64, 256], floats(64 * 256, 4, -0.1, 0.1))], 1))
if "ONNX" in backends:
    check("onnx_linear", lambda: same_on_gpu("ONNX", "linear.onnx", [([3, 4], floats(12, 5))], 1))
    check("onnx_heavy", lambda: same_on_gpu("ONNX", "heavy.onnx", [([32, 256], floats(32 * 256, 6))], 1))


# ---- 2. a GPU that is not there
def refused(backend, model):
    dev = f"GPU:{NGPU}"
    try:
        c.call("AI.MODELSTORE", "absent", backend, dev, "BLOB", blob(model))
    except Error as e:
        log(f"{backend} on {dev} ({NGPU} GPU(s) here) is refused: {e}")
        if c.call("EXISTS", "absent") != 0:
            raise AssertionError("the key was created")
        return
    raise AssertionError(f"MODELSTORE on {dev} succeeded with {NGPU} GPU(s)")


if "TORCH" in backends and not DRY:
    check("torch_absent_gpu_refused", lambda: refused("TORCH", "torch_add.pt"))
if "ONNX" in backends and not DRY:
    check("onnx_absent_gpu_refused", lambda: refused("ONNX", "heavy.onnx"))
check("server_alive", lambda: c.call("PING"))

# ---- 3. a DAG with a heavy branch on CPU and one on GPU:0; 4. throughput GPU vs CPU
if "ONNX" in backends and results.get("onnx_heavy") == "pass":
    heavy = ("ONNX", "heavy.onnx", [1024, 256])
elif "TORCH" in backends and results.get("torch_slow") == "pass":
    heavy = ("TORCH", "torch_slow.pt", [256, 256])
else:
    heavy = None


def dag_ratio():
    """One op on CPU and r ops on the GPU, r chosen so that both branches take about as long: the DAG's latency
    over the serial sum is 1.0 when the branches run one after the other, 0.5 when they overlap fully."""
    backend, model, shape = heavy
    data = blob(model)
    c.call("AI.MODELSTORE", "h:cpu", backend, "CPU", "BLOB", data)
    c.call("AI.MODELSTORE", "h:gpu", backend, DEV, "BLOB", data)
    tensorset(c, "hx", shape, floats(shape[0] * shape[1], 7, -0.1, 0.1))
    run_cpu = lambda: execute(c, "h:cpu", ["hx"], ["hy"])  # noqa: E731
    run_gpu = lambda: execute(c, "h:gpu", ["hx"], ["hy"])  # noqa: E731
    for fn in (run_cpu, run_gpu):
        fn()
    t_cpu, t_gpu = timed(run_cpu, 5), timed(run_gpu, 5)
    r = max(1, min(64, round(t_cpu / t_gpu)))
    dag = ["AI.DAGEXECUTE", "LOAD", 1, "hx", "|>", "AI.MODELEXECUTE", "h:cpu", "INPUTS", 1, "hx", "OUTPUTS", 1, "a"]
    for i in range(r):
        dag += ["|>", "AI.MODELEXECUTE", "h:gpu", "INPUTS", 1, "hx", "OUTPUTS", 1, f"b{i}"]
    c.call(*dag)
    t_dag = timed(lambda: c.call(*dag), 5)
    serial = t_cpu + r * t_gpu
    ratio, ideal = t_dag / serial, max(t_cpu, r * t_gpu) / serial
    log(f"DAG {model} {shape}: CPU branch 1 x {t_cpu * 1e3:.1f} ms, {DEV} branch {r} x {t_gpu * 1e3:.1f} ms, "
        f"DAG {t_dag * 1e3:.1f} ms: parallel/serial {ratio:.2f} (ideal {ideal:.2f}, serial 1.00)")
    metrics.append(f"dag_parallel/serial={ratio:.2f}(ideal={ideal:.2f},{model},1xCPU+{r}x{DEV})")
    # On a GPU the branches must overlap; the CPU dry run shares two busy cores, so it only reports the ratio.
    if ratio > 1.25 and DEV.startswith("GPU"):
        raise AssertionError(f"the DAG took {ratio:.2f}x the serial time")


def throughput(backend, model, shape, seconds=float(E.get("GPU_CHECK_SECONDS", "4"))):
    data = blob(model)
    c.call("AI.MODELSTORE", "t:cpu", backend, "CPU", "BLOB", data)
    c.call("AI.MODELSTORE", "t:gpu", backend, DEV, "BLOB", data)
    tensorset(c, "tx", shape, floats(shape[0] * shape[1], 8, -0.1, 0.1))
    rates = {}
    for dev in ("cpu", "gpu"):
        execute(c, f"t:{dev}", ["tx"], ["ty"])  # warm-up
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < seconds:
            execute(c, f"t:{dev}", ["tx"], ["ty"])
            n += 1
        rates[dev] = n / (time.perf_counter() - t0)
    ratio = rates["gpu"] / rates["cpu"]
    log(f"throughput {model} {shape}: CPU {rates['cpu']:.1f}/s, {DEV} {rates['gpu']:.1f}/s: GPU/CPU {ratio:.1f}x")
    metrics.append(f"{model}_gpu/cpu={ratio:.1f}x")


if heavy:
    check("dag_cpu_gpu", dag_ratio)
if "ONNX" in backends and results.get("onnx_heavy") == "pass":
    check("throughput_heavy_onnx", lambda: throughput("ONNX", "heavy.onnx", [1024, 256]))
if "TORCH" in backends and results.get("torch_slow") == "pass":
    check("throughput_torch_slow", lambda: throughput("TORCH", "torch_slow.pt", [256, 256]))
check("server_alive", lambda: c.call("PING"))

ran = [k for k in results if k not in ("TORCH", "ONNX", "server_alive")]
status = "FAIL" if failed else ("PASS" if ran else "SKIP")
if DRY and status == "PASS":
    status = "DRY-RUN-PASS"
try:
    info = c.call("INFO", "ai_workers").decode().splitlines()
except Exception:  # noqa: BLE001 (the server died: server_alive says so)
    info = []
mode = next((l.split(":", 1)[1].strip() for l in info if l.startswith("ai_execution_mode:")), "unknown")
parts = [status, f"gpus={NGPU}", f"gpu0=\"{E['GPU_NAME']}\"", f"mode={mode}"]
for be in ("TORCH", "ONNX"):
    r = results.get(be, "loaded")
    why = r.split(": ", 1)[1][:120] if ": " in r else ""
    parts.append(f"{be.lower()}={r.split(':')[0]}" + (f'("{why}")' if why else ""))
parts += metrics
# Isolated: the system calls each worker's sandbox refused (the workers' stderr, after this line, names them).
for line in info:
    name, _, fields = line.partition(":")
    f = dict(kv.split("=", 1) for kv in fields.strip().split(",") if "=" in kv)
    if name.startswith("ai_worker_") and f.get("refused_calls", "0") != "0":
        parts.append(f"refused[{name[len('ai_worker_'):]}]={f['refused_calls']}(last={f.get('last_refused')})")
if failed:
    parts.append("failed=" + ",".join(failed))
print("GPU-CHECK " + " ".join(parts), flush=True)
for k, v in results.items():
    if v != "pass":
        log(f"{k}: {v}")
sys.exit({"PASS": 0, "DRY-RUN-PASS": 0, "FAIL": 1, "SKIP": 3}[status])
PY
rc=$?
# What the workers' sandboxes refused, each call the first time and each refused open with its path.
grep -h "refused system call" "$work/stdout.log" 2>/dev/null | sort | uniq -c | sort -rn | head -n 40 >&2
if [[ $rc -ne 0 && $rc -ne 3 ]] && ! kill -0 "$server_pid" 2>/dev/null; then
  say "the server died; the end of its log ($work/redis.log):"
  tail -n 30 "$work/redis.log" >&2
fi
cleanup
trap - EXIT
if [[ $rc -eq 1 ]]; then
  say "server log kept: $work/redis.log"
else
  rm -rf "${work:?}"
fi
exit $rc
