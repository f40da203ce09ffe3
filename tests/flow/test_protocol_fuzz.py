"""Protocol fuzz (tests/reliability/protocol_fuzz.py, `make protofuzz` for the long run) for PROTOFUZZ_COMMANDS
(default 5,000) random and malformed AI.* commands, among them the crafted cases of tests/reliability/crafted.py
(models of every backend with call cycles, deep nesting, call fan-out and sizes from inputs; scripts whose
redis.execute changes their own keys; PROTOFUZZ_CRAFTED, default 0.08 of the draws: about 280 cases): every
command gets exactly one well-formed RESP2 reply, every crafted reply is what its case expects, no reply is an
internal error (a caught panic), the log stays clean, and afterwards the server answers, the models and the
script stored before the fuzz still compute right and the sentinel keys keep their bytes. PROTOFUZZ_SEED
(default fixed) changes the commands; PROTOFUZZ_CRAFTED_EXCLUDE (comma-separated kinds) leaves kinds out."""

import os
import sys

from helpers.resp import raw_command
from helpers.server import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "reliability"))

from protocol_fuzz import run_fuzz, summary  # noqa: E402

COMMANDS = int(os.environ.get("PROTOFUZZ_COMMANDS", "5000"))
SEED = int(os.environ.get("PROTOFUZZ_SEED", "20240611"))
CRAFTED = float(os.environ.get("PROTOFUZZ_CRAFTED", "0.08"))
CRAFTED_EXCLUDE = [k for k in os.environ.get("PROTOFUZZ_CRAFTED_EXCLUDE", "").split(",") if k]
CONNECTIONS = 4


def test_protocol_fuzz(make_server):
    server = make_server()
    stats, elapsed, problems = run_fuzz(server, COMMANDS, SEED, connections=CONNECTIONS, crafted=CRAFTED,
                                        exclude=CRAFTED_EXCLUDE)
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
