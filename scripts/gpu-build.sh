#!/usr/bin/env bash
# The GPU flavour of redisai-rs: the same module, other backend libraries, chosen at load time.
#
#   scripts/gpu-build.sh build          (make build GPU=1, after the CPU build) fetch the GPU backends of
#                                       scripts/backends-gpu.manifest and link target/gpu/libredisai_torch_cuda.so
#   scripts/gpu-build.sh load-args      print `ONNX <lib> TORCH <lib>` for --loadmodule (no network)
#   scripts/gpu-build.sh ld-path        print the LD_LIBRARY_PATH the server needs: the libtorch of the build
#                                       cache, then every site-packages/nvidia/*/lib of python3 (torch 2.13.0's
#                                       CUDA wheels)
#   scripts/gpu-build.sh bundle <dir>   (make gpu-bundle) one small tarball for a GPU machine: the stripped
#                                       module, the TORCH backend and its CUDA flavour, a redis-server,
#                                       scripts/gpu-check.sh and its test models; prints its path
#
# target/gpu/libredisai_torch_cuda.so is a library with no code of its own: it needs libredisai_torch.so (the
# TORCH backend of the CPU build, unchanged) and libtorch_cuda.so + libc10_cuda.so, so that opening it as
# `TORCH <path>` loads libtorch's CUDA hooks with the backend (without them libtorch sees no CUDA device). The
# module finds the backend's symbols through it (dlsym searches a library's dependencies).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpu_manifest=$repo/scripts/backends-gpu.manifest
release=$repo/target/release
gpu_dir=$repo/target/gpu
wrapper=$gpu_dir/libredisai_torch_cuda.so

die() { echo "gpu-build: error: $*" >&2; exit 1; }
gpu_backend_dir() { REDISAI_BACKENDS_MANIFEST=$gpu_manifest "$repo/scripts/fetch-backend.sh" --dir "$1"; }
cpu_backend_dir() { "$repo/scripts/fetch-backend.sh" --dir "$1"; }

build() {
  REDISAI_BACKENDS_MANIFEST=$gpu_manifest "$repo/scripts/fetch-backend.sh" all >/dev/null
  [[ -f $release/libredisai_torch.so ]] || die "$release/libredisai_torch.so is missing (make build)"
  local torch_cuda torch
  torch_cuda=$(gpu_backend_dir gpu-torch)/lib
  torch=$(cpu_backend_dir torch)/lib
  mkdir -p "$gpu_dir"
  # --no-as-needed: the libraries are needed for their static initialisers, not for any symbol. The CUDA
  # libraries they need themselves (cuDNN, cuBLAS, ...) are not here: -rpath-link finds what is, and ld only
  # warns about the rest. $ORIGIN first: the bundle puts libredisai_torch.so beside this library.
  # shellcheck disable=SC2016 # $ORIGIN is for the dynamic linker
  ${CC:-cc} -shared -o "$wrapper.tmp" -x c /dev/null \
    -Wl,--no-as-needed -L"$release" -lredisai_torch -L"$torch_cuda" -ltorch_cuda -lc10_cuda -Wl,--as-needed \
    -Wl,-rpath-link,"$torch" -Wl,-rpath,'$ORIGIN' -Wl,-rpath,"$release" -Wl,-rpath,"$torch_cuda" -Wl,-rpath,"$torch" \
    2> >(grep -v 'not found (try using -rpath or -rpath-link)' >&2)
  mv "$wrapper.tmp" "$wrapper"
  echo "gpu-build: $wrapper (TORCH) and $(gpu_backend_dir gpu-onnxruntime)/lib/libonnxruntime.so.1.31.1 (ONNX)" >&2
}

load_args() {
  echo "ONNX $(gpu_backend_dir gpu-onnxruntime)/lib/libonnxruntime.so.1.31.1 TORCH $wrapper"
}

ld_path() {
  local dirs
  dirs=$("${PYTHON:-python3}" - <<'PY' 2>/dev/null || true
import glob, os, site, sys
dirs = []
for sp in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib"))):
        if d not in dirs:
            dirs.append(d)
print(":".join(dirs))
PY
)
  echo "$(gpu_backend_dir gpu-torch)/lib:$(cpu_backend_dir torch)/lib${dirs:+:$dirs}"
}

bundle() {
  local out name root version server
  out=$(realpath -m "${1:?usage: scripts/gpu-build.sh bundle <out dir>}")
  [[ -f $wrapper ]] || die "$wrapper is missing (make build GPU=1)"
  for f in "$release/libredisai.so" "$release/libredisai_torch.so"; do
    [[ -f $f ]] || die "$f is missing (make build)"
  done
  # A redis-server that needs only glibc and libstdc++ (Redis 8.2 of the test venv), not Debian's (jemalloc,
  # lzf, systemd, OpenSSL), since the GPU machine is another distribution.
  server=${REDIS_SERVER:-}
  if [[ -z $server ]]; then
    server=$(eval "$("$repo/scripts/servers.sh" "$repo/.venv")" && echo "$REDIS82_SERVER") ||
      die "no Redis 8.2 from the test venv (make venv), and REDIS_SERVER is not set"
  fi
  version=$(awk -F'"' '/^version = / { print $2; exit }' "$repo/Cargo.toml")
  name=redisai-rs-$version-gpu-check
  root=$out/$name
  rm -rf "${root:?}" "$out/$name.tar.gz"
  mkdir -p "$root"/{bin,models,backends/redisai_torch}
  strip --strip-debug -o "$root/redisai.so" "$release/libredisai.so"
  strip --strip-debug -o "$root/redisai-worker" "$release/redisai-worker"
  strip --strip-debug -o "$root/backends/redisai_torch/libredisai_torch.so" "$release/libredisai_torch.so"
  cp "$wrapper" "$root/backends/redisai_torch/"
  strip --strip-debug -o "$root/bin/redis-server" "$server"
  cp "$repo/scripts/gpu-check.sh" "$root/"
  for m in torch_add.pt torch_two_outputs.pt torch_slow.pt linear.onnx heavy.onnx; do
    cp "$repo/tests/data/$m" "$root/models/"
  done
  cat >"$root/README-gpu.txt" <<EOF
redisai-rs $version: GPU check bundle (scripts/gpu-build.sh bundle; docs/commands.md, section GPU)

Run on the GPU machine:  ./gpu-check.sh          (one summary line on stdout: GPU-CHECK PASS|FAIL|SKIP|NO-GPU ...)

Inside: redisai.so (the module), redisai-worker (its backend worker, for EXECUTION_MODE ISOLATED:
GPU_CHECK_MODULE_ARGS="EXECUTION_MODE ISOLATED" ./gpu-check.sh), bin/redis-server ($("$server" --version | awk '{ print $3 }')), models/ (test models),
backends/redisai_torch/libredisai_torch.so (TORCH backend, built against libtorch 2.13.0) and
libredisai_torch_cuda.so (its CUDA flavour: needs libtorch_cuda.so and libc10_cuda.so).

Not inside (too big: the CUDA libraries are GBs), found on the machine by gpu-check.sh:
  - NVIDIA driver for CUDA 13 (>= 580) and nvidia-smi
  - python3 (standard library only)
  - TORCH: torch==2.13.0 for CUDA 13.0 (the PyPI wheel) in python3, with its nvidia-* wheels
    (cuda-toolkit 13.0.3: cudart/cublas/cufft/curand/cusolver/cusparse/nvrtc/nvjitlink/cufile, cuDNN 9.20,
    NCCL 2.29.7, cuSPARSELt 0.8.1, NVSHMEM 3.4.5); or TORCH_LIB_DIR=<its torch/lib> + CUDA_LIB_DIRS
  - ONNX: onnxruntime-gpu==1.31.1 (libonnxruntime_providers_cuda.so alone is 271 MiB) in python3, or
    ORT_GPU_LIB=<.../libonnxruntime.so.1.31.1> with the providers beside it; it needs CUDA 13 and cuDNN 9
A backend whose libraries are missing or of another version is skipped, and the summary line says why.
EOF
  tar -C "$out" -cf - "$name" | gzip -9 >"$out/$name.tar.gz"
  rm -rf "${root:?}"
  echo "$out/$name.tar.gz"
}

case ${1:-} in
  build) build ;;
  load-args) load_args ;;
  ld-path) ld_path ;;
  bundle) shift; bundle "$@" ;;
  *) sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
