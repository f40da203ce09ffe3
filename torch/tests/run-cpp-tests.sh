#!/usr/bin/env bash
# Builds and runs the C++ unit tests of the TORCH sandbox's scanners of untrusted input
# (torch/tests/sandbox_scan_test.cpp, against torch/src/sandbox_scan.cpp and sandbox_policy.cpp) with
# torch/build.rs's compiler flags and the libtorch in $LIBTORCH (`make` exports it; else the cache dir that
# scripts/fetch-backend.sh names). Objects are kept in target/cpp-tests and rebuilt when a source, a header
# or the flags change. Exits non-zero, loudly, when the build or any test case fails.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
libtorch=${LIBTORCH:-$("$repo/scripts/fetch-backend.sh" --dir torch)}
if [[ ! -d $libtorch/include || ! -d $libtorch/lib ]]; then
  echo "run-cpp-tests.sh: no libtorch at '$libtorch' (run scripts/fetch-backend.sh torch)" >&2
  exit 1
fi
out=$repo/target/cpp-tests
mkdir -p "$out"
cxx=${CXX:-c++}
# As build.rs (cc's release flags, its includes, -std and the ABI define); -isystem keeps libtorch's warnings out.
flags=(-std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -O3 -fPIC -g -fno-omit-frame-pointer -Wall
  -isystem "$libtorch/include" -isystem "$libtorch/include/torch/csrc/api/include")
sources=(torch/src/sandbox_scan.cpp torch/src/sandbox_policy.cpp torch/src/sandbox_calls.cpp torch/tests/sandbox_scan_test.cpp)
headers=("$repo"/torch/src/*.h)

stamp=$out/flags
if [[ ! -f $stamp || "$(cat "$stamp")" != "$cxx ${flags[*]}" ]]; then
  rm -f "$out"/*.o
  echo "$cxx ${flags[*]}" >"$stamp"
fi

objects=()
for src in "${sources[@]}"; do
  obj=$out/$(basename "${src%.cpp}").o
  objects+=("$obj")
  stale=
  [[ -f $obj ]] || stale=1
  for dep in "$repo/$src" "${headers[@]}"; do
    [[ $dep -nt $obj ]] && stale=1
  done
  if [[ -n $stale ]]; then
    echo "run-cpp-tests.sh: compiling $src"
    "$cxx" "${flags[@]}" -c "$repo/$src" -o "$obj"
  fi
done

binary=$out/sandbox_scan_test
"$cxx" -o "$binary" "${objects[@]}" -L"$libtorch/lib" -Wl,-rpath,"$libtorch/lib" -ltorch_cpu -lc10

echo "run-cpp-tests.sh: running $binary"
if ! "$binary"; then
  echo "run-cpp-tests.sh: FAILED: the TORCH sandbox's C++ unit tests (output above)" >&2
  exit 1
fi
