"""Protocol fuzz (tests/reliability/protocol_fuzz.py, `make protofuzz` for the long run) for PROTOFUZZ_COMMANDS
(default 5,000) random and malformed AI.* commands: every command gets exactly one well-formed RESP2 reply,
no reply is an internal error (a caught panic), the log stays clean, and afterwards the server answers and a
model stored before the fuzz still computes right. PROTOFUZZ_SEED (default fixed) changes the commands."""

import os
import sys

from helpers.resp import raw_command
from helpers.server import REPO_ROOT

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


def test_non_ascii_in_error_texts(make_server):
    """Error texts that echo client input keep its bytes (UTF-8): a character whose low byte is 0 (U+0100)
    once made the reply path panic, and others were cut to one byte each (both found by the fuzz)."""
    server = make_server()
    assert raw_command(server.port, "AI.TENSORSET", "t", "FLOAT", 1, "VALUES", 1) == "OK"
    for word in ("Ā", "é€", "ĀxȀ"):
        reply = raw_command(server.port, "AI.DAGEXECUTE", "ROUTING", "k", word, "|>", "AI.TENSORGET", "t")
        assert reply == f"ERR Invalid DAG command. Unexpected argument:  {word}", reply
    assert "panic" not in server.log()
