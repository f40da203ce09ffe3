"""Protocol fuzz (tests/reliability/protocol_fuzz.py, `make protofuzz` for the long run) for PROTOFUZZ_COMMANDS
(default 5,000) random and malformed AI.* commands: every command gets exactly one well-formed RESP2 reply,
no reply is an internal error (a caught panic), the log stays clean, and afterwards the server answers and a
model stored before the fuzz still computes right. PROTOFUZZ_SEED (default fixed) changes the commands."""

import os
import sys

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "reliability"))

from protocol_fuzz import run_fuzz, summary  # noqa: E402

COMMANDS = int(os.environ.get("PROTOFUZZ_COMMANDS", "5000"))
SEED = int(os.environ.get("PROTOFUZZ_SEED", "20240611"))
CONNECTIONS = 4


def test_protocol_fuzz(make_server):
    server = make_server()
    stats, elapsed, problems = run_fuzz(server, COMMANDS, SEED, connections=CONNECTIONS)
    print("\n" + summary(stats, elapsed, CONNECTIONS))
    assert not problems, f"seed {SEED}:\n" + "\n".join(problems)
    assert stats.sent == COMMANDS
    assert sum(stats.kinds.values()) == COMMANDS
