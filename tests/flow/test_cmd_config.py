"""AI.CONFIG and the module's load-time arguments (docs/commands.md, "AI.CONFIG" and "Load-time arguments"): the
subcommands and their errors, GET, what the load-time arguments set, and the default BACKENDSPATH. Who may run
AI.CONFIG is in test_security_acl.py, the bounds of the load-time values in test_limits.py, loading a backend
library (LOADBACKEND, a bogus path) in test_backend_<backend>.py."""

import os

import numpy as np
import pytest

from helpers.checks import check_error_raw
from helpers.data import weights
from helpers.onnx_models import blob, get_tensor, model_execute, modules_sections, set_tensor, store
from helpers.resp import raw_command
from helpers.server import MODULE_PATH, ONNX_LIB

ARITY_CONFIG = "ERR wrong number of arguments for 'AI.CONFIG' command"


# =================================================================================================
# AI.CONFIG


def test_ai_config(server):
    con = server.client()
    port = server.port
    check_error_raw(port, ARITY_CONFIG, "AI.CONFIG")
    check_error_raw(port, ARITY_CONFIG, "AI.CONFIG", "LOADBACKEND")
    check_error_raw(port, ARITY_CONFIG, "AI.CONFIG", "LOADBACKEND", "ONNX")
    check_error_raw(port, ARITY_CONFIG, "AI.CONFIG", "GET")
    check_error_raw(port, "ERR unsupported backend", "AI.CONFIG", "LOADBACKEND", "FOO", "/x.so")
    check_error_raw(port, "ERR BACKENDSPATH: missing path argument", "AI.CONFIG", "BACKENDSPATH")
    check_error_raw(port, "ERR MODEL_CHUNK_SIZE: missing chunk size", "AI.CONFIG", "MODEL_CHUNK_SIZE")
    for bad in ("x", "0", "-1", "1.5"):
        check_error_raw(port, "ERR MODEL_CHUNK_SIZE: invalid chunk size", "AI.CONFIG", "MODEL_CHUNK_SIZE", bad)
    check_error_raw(port, "ERR unsupported subcommand", "AI.CONFIG", "FOO")
    check_error_raw(port, "ERR unsupported subcommand", "AI.CONFIG", "FOO", "bar")
    # GET
    assert raw_command(port, "AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 535822336  # an integer reply
    path = raw_command(port, "AI.CONFIG", "GET", "BACKENDSPATH")
    assert isinstance(path, bytes)
    candidates = {os.path.join(os.path.dirname(p), "backends") for p in
                  (MODULE_PATH, os.path.abspath(MODULE_PATH), os.path.realpath(MODULE_PATH))}
    assert path.decode() in candidates, (path, candidates)
    assert raw_command(port, "AI.CONFIG", "GET", "FOO") is None
    # setters
    assert raw_command(port, "AI.CONFIG", "MODEL_CHUNK_SIZE", 1000) == "OK"
    assert con.execute_command("AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 1000
    assert raw_command(port, "ai.config", "model_chunk_size", 77) == "OK"
    assert con.execute_command("ai.config", "get", "model_chunk_size") == 77
    assert raw_command(port, "AI.CONFIG", "BACKENDSPATH", "/tmp/some/where") == "OK"
    assert con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == b"/tmp/some/where"
    # LOADBACKEND of a backend already loaded, or of a library that cannot be loaded
    store(con, "m", "mul")
    if ONNX_LIB:
        check_error_raw(port, "ERR error loading backend", "AI.CONFIG", "LOADBACKEND", "ONNX", ONNX_LIB)
    check_error_raw(port, "ERR error loading backend", "AI.CONFIG", "LOADBACKEND", "TF", "/nonexistent/tf.so")
    check_error_raw(port, "ERR error loading backend", "AI.CONFIG", "LOADBACKEND", "TORCH", "relative/torch.so")
    # the module still works
    set_tensor(con, "a", np.array([[3.0]], dtype=np.float32))
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"9"]


# =================================================================================================
# load-time arguments and defaults


@pytest.mark.module_args("MODEL_CHUNK_SIZE", "1000", "BACKENDSPATH", "/opt/ai/backends", "INTRA_OP_PARALLELISM", "1",
                         "INTER_OP_PARALLELISM", "1", "MODEL_EXECUTION_TIMEOUT", "2000")
def test_load_time_config(server):
    con = server.client()
    assert con.execute_command("AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 1000
    assert con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == b"/opt/ai/backends"
    cfg = dict(dict(modules_sections(server))["ai_load_time_configs"])
    assert (cfg["ai_inter_op_parallelism"], cfg["ai_intra_op_parallelism"], cfg["ai_model_execution_timeout"]) == (
        "1", "1", "2000")
    store(con, "h", "heavy")
    assert len(con.execute_command("AI.MODELGET", "h", "BLOB")) == len(blob("heavy")) // 1000 + 1
    x = np.ones((2, 256), dtype=np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "h", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.heavy(x), rtol=1e-4, atol=1e-5)


def test_module_finds_its_own_directory(shared_server, con):
    """The default BACKENDSPATH is <module dir>/backends on every server (Redis 8.2 reported it empty, and
    TORCH then had no library path)."""
    expected = os.path.join(os.path.dirname(os.path.realpath(MODULE_PATH)), "backends")
    assert con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == expected.encode()
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] + 1\n")
    set_tensor(con, "a", np.array([1.0], dtype=np.float32))
    con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 1, "a", "OUTPUTS", 1, "b")
    assert get_tensor(con, "b").tolist() == [2.0]
