#!/usr/bin/env bash
# Fetch backend shared libraries (ONNX Runtime, later TensorFlow, libtorch) from
# PyPI wheels into a versioned cache outside the repo.
#
#   scripts/fetch-backend.sh <backend>|all     fetch (or reuse) and print the dir(s)
#   scripts/fetch-backend.sh --dir <backend>...  print the dir(s) only, one per line; no network
#   scripts/fetch-backend.sh --wheels <backend>|all  make sure the backend's .whl files are in the wheelhouse
#                                                (downloading only those missing) and print its dir(s)
#
# Backends are described in scripts/backends.manifest. The cache directory is
# ${REDISAI_CACHE:-$HOME/.cache/redisai-rs}/<backend>-<version>/. Progress goes
# to stderr; stdout carries only the absolute backend dir(s), one per line, so
# `scripts/fetch-backend.sh onnxruntime | tail -n1` is the dir. The downloaded
# wheels themselves are kept (sha256-checked) in the wheelhouse
# <cache>/wheels/<backend>-<version>/, for `pip install --no-index --find-links`
# (the test of `make wheel` installs the backends from there: no second download),
# and a fetch takes a wheel from there, when it is kept, instead of downloading it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
manifest=${REDISAI_BACKENDS_MANIFEST:-$here/backends.manifest}
cache=${REDISAI_CACHE:-$HOME/.cache/redisai-rs}
[[ $cache == /* ]] || cache=$PWD/$cache
python=${PYTHON:-python3}

die() { echo "fetch-backend: error: $*" >&2; exit 1; }
log() { echo "fetch-backend: $*" >&2; }

usage() { sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

[[ -r $manifest ]] || die "manifest not found: $manifest"

# Manifest lines without comments and blank lines.
entries() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$manifest"; }
backend_lines() { entries | awk -v b="$1" '$1 == b'; }
all_backends() { entries | awk '!seen[$1]++ { print $1 }'; }

backend_version() {
  local lines version
  lines=$(backend_lines "$1")
  [[ -n $lines ]] || die "unknown backend '$1' (known: $(all_backends | tr '\n' ' '))"
  version=$(awk '{ print $2 }' <<<"$lines" | sort -u)
  [[ $(wc -l <<<"$version") -eq 1 ]] || die "backend '$1' has several versions in $manifest"
  echo "$version"
}

# The wheelhouse of a backend: its .whl files, kept after extraction.
wheel_dir() {
  local version
  version=$(backend_version "$1")
  echo "$cache/wheels/$1-$version"
}

backend_dir() {
  local version
  version=$(backend_version "$1")
  echo "$cache/$1-$version"
}

# The wheel tags pip may pick: every manylinux x86_64 glibc level this Debian 12
# (glibc 2.36) runs. pip 23 does not widen an explicit --platform to the older
# levels it implies, so each one is listed.
pip_platforms() {
  local v
  for v in $(seq 36 -1 5); do printf -- '--platform manylinux_2_%s_x86_64 ' "$v"; done
  printf -- '--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64'
}

# download_wheel <backend> <requirement> <sha256> <into dir>: pip download one wheel, check its sha256, print
# its path.
download_wheel() {
  local name=$1 req=$2 sha=$3 into=$4 wheel got
  log "$name: downloading $req"
  [[ $sha =~ ^[0-9a-f]{64}$ ]] || die "$name: bad sha256 '$sha' for $req in $manifest"
  # shellcheck disable=SC2046 # word splitting of the platform flags is wanted
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: $(pip_platforms) --python-version 3.11 \
    -d "$into" "$req" >&2 || die "$name: pip download $req failed"
  wheel=$(find "$into" -name '*.whl')
  [[ -n $wheel && $(wc -l <<<"$wheel") -eq 1 ]] || die "$name: expected one wheel for $req, got: ${wheel:-none}"
  got=$(sha256sum "$wheel" | awk '{ print $1 }')
  if [[ $got != "$sha" ]]; then
    die "$name: sha256 mismatch for $(basename "$wheel")
  expected $sha ($manifest)
  got      $got"
  fi
  log "$name: $(basename "$wheel") sha256 ok"
  echo "$wheel"
}

# kept_wheel <sha256>: the path of a kept wheel with that sha256, in any backend's wheelhouse (or nothing).
kept_wheel() {
  local list f
  for list in "$cache"/wheels/*/.sha256; do
    [[ -f $list ]] || continue
    f=$(awk -v s="$1" '$1 == s { print $2; exit }' "$list")
    if [[ -n $f && -f $(dirname "$list")/$f ]]; then
      echo "$(dirname "$list")/$f"
      return
    fi
  done
}

# keep_wheel <backend> <wheel> <sha256>: put a checked wheel into the backend's wheelhouse: moved there, or
# hard-linked when it is already kept for another backend (the torch wheel of torch and gpu-torch: one copy).
# <wheelhouse>/.sha256 lists `<sha256>  <file>` of every wheel there (so a later check needs no hashing).
keep_wheel() {
  local wh
  wh=$(wheel_dir "$1")
  mkdir -p "$wh"
  if [[ $2 == "$cache"/wheels/* ]]; then
    [[ $(dirname "$2") == "$wh" ]] || ln -f "$2" "$wh/" 2>/dev/null || cp -f "$2" "$wh/"
  else
    mv -f "$2" "$wh/"
  fi
  touch "$wh/.sha256"
  { grep -v "  $(basename "$2")\$" "$wh/.sha256" || true; echo "$3  $(basename "$2")"; } >"$wh/.sha256.new"
  mv "$wh/.sha256.new" "$wh/.sha256"
}

# have_wheel <backend> <sha256>: is the wheel with that sha256 in the backend's wheelhouse?
have_wheel() {
  local wh f
  wh=$(wheel_dir "$1")
  f=$(awk -v s="$2" '$1 == s { print $2; exit }' "$wh/.sha256" 2>/dev/null || true)
  [[ -n $f && -f $wh/$f ]]
}

# get_wheel <backend> <requirement> <sha256> <tmp dir>: the wheel kept in a wheelhouse if there is one (no
# download), else downloaded into <tmp dir> and checked; print its path.
get_wheel() {
  local kept
  kept=$(kept_wheel "$3")
  if [[ -n $kept && $(sha256sum "$kept" | awk '{ print $1 }') != "$3" ]]; then
    log "$1: $kept does not match its sha256 any more: downloading $2 again"
    kept=
  fi
  if [[ -n $kept ]]; then
    log "$1: $(basename "$kept") from the wheelhouse"
    echo "$kept"
  else
    download_wheel "$@"
  fi
}

# extract_wheel <wheel> <stage dir> <extract:glob:dir>...
extract_wheel() {
  "$python" - "$@" <<'PY'
import fnmatch, os, re, shutil, sys, zipfile

wheel, stage, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    members = [i for i in z.infolist() if not i.is_dir()]
    for spec in specs:
        _, glob, dest = spec.split(":", 2)
        # Literal directory part of the glob: kept paths are relative to it.
        literal = re.split(r"[*?\[]", glob, maxsplit=1)[0]
        prefix = literal[: literal.rfind("/") + 1]
        hits = [i for i in members if fnmatch.fnmatchcase(i.filename, glob)]
        if not hits:
            sys.exit(f"fetch-backend: error: {os.path.basename(wheel)}: no member matches {glob!r}")
        for info in hits:
            rel = info.filename[len(prefix):]
            if rel.startswith("/") or ".." in rel.split("/"):
                sys.exit(f"fetch-backend: error: unsafe member path {info.filename!r}")
            out = os.path.join(stage, dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            # Wheels do not always keep mode bits; shared libraries get 0755.
            mode = (info.external_attr >> 16) & 0o777 or 0o644
            if ".so" in os.path.basename(out):
                mode |= 0o755
            os.chmod(out, mode)
        # One line per glob (the torch headers alone are ~10,000 files).
        shown = hits[0].filename if len(hits) == 1 else f"{len(hits)} files matching {glob}"
        print(f"fetch-backend:   {shown} -> {dest}/", file=sys.stderr)
PY
}

fetch() {
  local name=$1 dir lines stamp tmp n=0 req sha rest wheel got action
  local -a actions extracts links
  dir=$(backend_dir "$name")
  lines=$(backend_lines "$name")
  stamp=$dir/.fetch-complete
  # The stamp holds the manifest lines it was made from: any change refetches.
  if [[ -f $stamp ]] && [[ $(cat "$stamp") == "$lines" ]]; then
    log "$name: cached in $dir"
    echo "$dir"
    return
  fi
  log "$name: fetching into $dir"
  tmp=$(mktemp -d "$cache/.tmp-$name.XXXXXX")
  # shellcheck disable=SC2064 # expand $tmp now: it is local
  trap "rm -rf '$tmp'" EXIT
  mkdir "$tmp/stage"
  links=()
  while read -r _ _ req sha rest; do
    n=$((n + 1))
    mkdir "$tmp/dl$n"
    wheel=$(get_wheel "$name" "$req" "$sha" "$tmp/dl$n")
    extracts=()
    read -r -a actions <<<"$rest" # read -a: no glob expansion of the actions
    for action in "${actions[@]}"; do
      case $action in
        extract:*:*) extracts+=("$action") ;;
        link:*:*) links+=("$action") ;;
        *) die "$name: unknown action '$action' in $manifest" ;;
      esac
    done
    extract_wheel "$wheel" "$tmp/stage" "${extracts[@]}"
    keep_wheel "$name" "$wheel" "$sha" # the wheelhouse (pip install --find-links), not a second download later
    rm -rf "$tmp/dl$n"
  done <<<"$lines"
  for action in ${links[@]+"${links[@]}"}; do
    IFS=: read -r _ path target <<<"$action"
    mkdir -p "$(dirname "$tmp/stage/$path")"
    ln -sfn "$target" "$tmp/stage/$path"
    [[ -e $tmp/stage/$path ]] || die "$name: link $path -> $target is dangling"
  done
  printf '%s\n' "$lines" >"$tmp/stage/.fetch-complete.new"
  rm -rf "$dir"
  mv "$tmp/stage" "$dir"
  # Written last, so an interrupted fetch never looks complete.
  mv "$dir/.fetch-complete.new" "$stamp"
  rm -rf "$tmp"
  trap - EXIT
  log "$name: done"
  echo "$dir"
}

# wheels <backend>: every wheel of the backend's manifest lines in its wheelhouse; print the wheelhouse.
wheels() {
  local name=$1 req sha tmp wheel
  while read -r _ _ req sha _; do
    have_wheel "$name" "$sha" && continue
    tmp=$(mktemp -d "$cache/.tmp-$name.XXXXXX")
    # shellcheck disable=SC2064 # expand $tmp now: it is local
    trap "rm -rf '$tmp'" EXIT
    wheel=$(get_wheel "$name" "$req" "$sha" "$tmp")
    keep_wheel "$name" "$wheel" "$sha"
    rm -rf "$tmp"
    trap - EXIT
  done <<<"$(backend_lines "$name")"
  wheel_dir "$name"
}

[[ $# -ge 1 ]] || usage
if [[ $1 == --dir ]]; then
  [[ $# -ge 2 ]] || usage
  for b in "${@:2}"; do backend_dir "$b"; done
  exit 0
fi
mode=fetch
if [[ $1 == --wheels ]]; then mode=wheels; shift; fi
[[ $# -eq 1 && $1 != -* ]] || usage

case $(realpath -m "$cache")/ in
  "$(realpath "$repo")"/*) die "cache $cache is inside the repo; set REDISAI_CACHE elsewhere" ;;
esac
mkdir -p "$cache"

# One fetch at a time per cache (make -j, parallel CI jobs on one machine).
exec 9>"$cache/.lock"
flock 9

if [[ $1 == all ]]; then
  for b in $(all_backends); do "$mode" "$b"; done
else
  "$mode" "$1"
fi
