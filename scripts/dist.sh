#!/usr/bin/env bash
# Package the module in RedisAI's deployment layout, as one tarball that runs on a machine without Rust or
# Python (Debian 12 or newer glibc; the system's libstdc++):
#
#   redisai-rs-<version>-linux-x86_64/
#     redisai.so                                      the module (libredisai.so)
#     redisai-worker                                  the backend worker (EXECUTION_MODE ISOLATED)
#     include/redisai.h                               the low-level API's header
#     backends/redisai_onnxruntime/redisai_onnxruntime.so   ONNX Runtime
#     backends/redisai_tensorflow/redisai_tensorflow.so     TensorFlow (+ libtensorflow_framework.so.2)
#     backends/redisai_tflite/redisai_tflite.so             LiteRT
#     backends/redisai_torch/redisai_torch.so               the TORCH backend (+ libtorch, c10, gomp, cudart, cupti)
#
# Usage: scripts/dist.sh <out dir>   (after `make build`; prints the tarball's path). Unpack it and run
#   redis-server --loadmodule <dir>/redisai.so
# The default BACKENDSPATH is <dir>/backends, where the module finds each backend at first use; RedisAI's
# load-time arguments (`ONNX redisai_onnxruntime/redisai_onnxruntime.so`, ...) and
# `AI.CONFIG LOADBACKEND TORCH redisai_torch/redisai_torch.so` work unchanged.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(realpath -m "${1:?usage: scripts/dist.sh <out dir>}")
version=$(awk -F'"' '/^version = / { print $2; exit }' "$repo/Cargo.toml")
name=redisai-rs-$version-linux-x86_64
backend() { "$repo/scripts/fetch-backend.sh" --dir "$1"; }
release=$repo/target/release

for f in "$release/libredisai.so" "$release/libredisai_torch.so" "$release/redisai-worker"; do
  [[ -f $f ]] || { echo "dist: $f is missing (run make build)" >&2; exit 1; }
done

rm -rf "${out:?}/$name" "$out/$name.tar.gz"
root=$out/$name
mkdir -p "$root/backends"/{redisai_onnxruntime,redisai_tensorflow,redisai_tflite,redisai_torch}

# The module without its debug information (the build keeps it for backtraces: 20 MB of the 22).
strip --strip-debug -o "$root/redisai.so" "$release/libredisai.so"
# The backend worker (EXECUTION_MODE ISOLATED), found beside the module.
strip --strip-debug -o "$root/redisai-worker" "$release/redisai-worker"
# The low-level API's header, for modules built against it (docs/commands.md, "Low-level API").
mkdir -p "$root/include"
cp "$repo/include/redisai.h" "$root/include/"

ort=$(backend onnxruntime)/lib
cp "$(realpath "$ort/libonnxruntime.so")" "$root/backends/redisai_onnxruntime/redisai_onnxruntime.so"

# libtensorflow_cc.so.2 finds libtensorflow_framework.so.2 beside it ($ORIGIN in its RUNPATH).
tf=$(backend tensorflow)/lib
cp "$tf/libtensorflow_cc.so.2" "$root/backends/redisai_tensorflow/redisai_tensorflow.so"
cp "$tf/libtensorflow_framework.so.2" "$root/backends/redisai_tensorflow/"

cp "$(backend litert)/lib/libLiteRt.so" "$root/backends/redisai_tflite/redisai_tflite.so"

# redisai_torch.so and libtorch_cpu.so look for their libraries in $ORIGIN first (torch/build.rs; the wheel).
torch=$(backend torch)/lib
strip --strip-debug -o "$root/backends/redisai_torch/redisai_torch.so" "$release/libredisai_torch.so"
for lib in libtorch_cpu.so libtorch.so libc10.so libgomp.so.1 libcudart.so.13 libcupti.so.13; do
  cp "$torch/$lib" "$root/backends/redisai_torch/"
done

tar -C "$out" -cf - "$name" | gzip -1 >"$out/$name.tar.gz"
rm -rf "${root:?}"
echo "$out/$name.tar.gz"
