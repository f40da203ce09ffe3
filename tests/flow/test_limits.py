"""Resource limits (docs/commands.md, "Limits" and "Load-time arguments"): what the module bounds, the exact errors,
and `maxmemory`; load-time arguments out of their bounds (or unknown) make the module refuse to load.

Limits in the module (src/):
  THREADS_PER_QUEUE        1..=256 (src/config.rs MAX_THREADS_PER_QUEUE), INTRA/INTER_OP_PARALLELISM 1..=1024:
                           anything else makes the module refuse to load, logging
                           `ERR error processing argument: <KEY> <VALUE>`
  tensor data              at most 4 GiB (src/error.rs MAX_TENSOR_BYTES, checked in tensor::element_count for
                           every constructor, overflowing shapes included):
                           `ERR tensor size exceeds the limit of 4294967296 bytes`
  tensor rank              64 dimensions (src/tensor.rs MAX_DIMS, what the RDB layout takes), checked for every
                           constructor: `ERR tensor rank exceeds the limit of 64 dimensions`
  model blobs              4 GiB, the chunks together (src/commands/model.rs MAX_MODEL_BYTES):
                           `ERR model payload exceeds the limit of 4294967296 bytes`
  DAG length               100,000 ops (src/commands/dag.rs MAX_DAG_OPS):
                           `ERR DAG has too many operations (the limit is 100000)`
  device queues            128 distinct device strings (src/exec/queue.rs MAX_QUEUES), each with THREADS_PER_QUEUE
                           threads, kept until the server exits: `ERR Could not initialize queue on requested device`
Commands that create data are flagged `deny-oom` (src/redis/module.rs COMMANDS): with `maxmemory` reached they
are refused by Redis with its OOM error before the module sees them, while reads and deletions still work.
Redis checks before a command runs; a zero-filled AI.TENSORSET (a few bytes of request, up to 4 GiB of tensor),
alone or as DAG ops, is also checked against maxmemory by the module with what it would allocate
(src/redis/memory.rs), so one command cannot take the server far past maxmemory.
"""

import subprocess

import numpy as np
import pytest
import redis

from helpers.checks import check_error_raw, module_names
from helpers.onnx_models import blob, get_tensor, model_execute, modules_info, sessions, set_tensor, store
from helpers.resp import RawClient, RespError, raw_command
from helpers.server import MODULE_PATH, ONNX_LIB, SERVER_BIN, free_port
from helpers.torch_models import entry, script_set, script_store

TOO_LARGE = "ERR tensor size exceeds the limit of 4294967296 bytes"
BAD_SHAPE = "ERR invalid or negative value found in tensor shape"
OOM = "OOM command not allowed when used memory > 'maxmemory'."


# =================================================================================================
# load-time arguments


@pytest.mark.parametrize("key, value", [("THREADS_PER_QUEUE", "257"), ("INTRA_OP_PARALLELISM", "1025"),
                                        ("INTER_OP_PARALLELISM", "1025"), ("THREADS_PER_QUEUE", "-5")])
def test_load_time_bounds(make_server, key, value):
    srv = make_server(load_module=False)
    reply = srv.raw("MODULE", "LOAD", MODULE_PATH, key, value)
    assert isinstance(reply, RespError), reply
    assert "ai" not in module_names(srv.raw("MODULE", "LIST"))
    assert f"ERR error processing argument: {key} {value}" in srv.log()
    # one below the bound loads
    ok = {"THREADS_PER_QUEUE": "2", "INTRA_OP_PARALLELISM": "1024", "INTER_OP_PARALLELISM": "1024"}[key]
    assert srv.raw("MODULE", "LOAD", MODULE_PATH, key, ok) == "OK"


def onnx_args():
    return ["ONNX", ONNX_LIB] if ONNX_LIB else []


BAD_LOAD_ARGS = [
    ["THREADS_PER_QUEUE", "0"],
    ["THREADS_PER_QUEUE", "1000"],
    ["THREADS_PER_QUEUE", "-1"],
    ["THREADS_PER_QUEUE", "x"],
    ["THREADS_PER_QUEUE"],
    ["MODEL_EXECUTION_TIMEOUT", "999"],
    ["NO_SUCH_OPTION", "1"],
]


def test_module_load_validates_threads_per_queue(make_server):
    srv = make_server(load_module=False)
    con = srv.client()
    for bad in BAD_LOAD_ARGS:
        with pytest.raises(redis.exceptions.ResponseError):
            con.execute_command("MODULE", "LOAD", MODULE_PATH, *onnx_args(), *bad)
        assert "ai" not in module_names(con.execute_command("MODULE", "LIST")), bad
        assert con.ping()
    assert "error processing argument: THREADS_PER_QUEUE 0" in srv.log()
    # the bounds themselves are fine
    assert con.execute_command("MODULE", "LOAD", MODULE_PATH, *onnx_args(), "THREADS_PER_QUEUE", "256") == b"OK"
    assert modules_info(srv)["ai_threads_per_queue"] == "256"
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4"]
    if ONNX_LIB:
        assert sessions(srv) == 256


@pytest.mark.parametrize("value", ["0", "1000"])
def test_server_refuses_to_start_with_bad_threads_per_queue(tmp_path, value):
    port = free_port()
    log = tmp_path / "redis.log"
    argv = [SERVER_BIN, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "",
            "--logfile", str(log), "--loadmodule", MODULE_PATH, *onnx_args(), "THREADS_PER_QUEUE", value]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"redis-server started with THREADS_PER_QUEUE {value}")
    assert code != 0
    text = log.read_text(errors="replace") if log.exists() else ""
    assert f"THREADS_PER_QUEUE {value}" in text, text[-2000:]
    assert "BUG REPORT" not in text


def test_threads_per_queue_1_is_the_minimum(make_server):
    """THREADS_PER_QUEUE 1 loads and gives each device queue one worker, which runs the models; 0, one below,
    makes the module refuse to load."""
    srv = make_server(module_args=["THREADS_PER_QUEUE", "1"])
    assert modules_info(srv)["ai_threads_per_queue"] == "1"
    con = srv.client()
    store(con, "m", "mul")
    store(con, "m1", "mul", device="CPU:1")
    assert sessions(srv) == 2  # one worker (ONNX Runtime session) per queue
    set_tensor(con, "a", np.array([[3.0]], dtype=np.float32))
    for key in ("m", "m1"):
        assert model_execute(con, key, ["a", "a"], ["c"]) == b"OK"
        assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"9"]
    below = make_server(load_module=False, name="below")
    reply = below.raw("MODULE", "LOAD", MODULE_PATH, *onnx_args(), "THREADS_PER_QUEUE", "0")
    assert isinstance(reply, RespError), reply
    assert "ai" not in module_names(below.raw("MODULE", "LIST"))
    assert "ERR error processing argument: THREADS_PER_QUEUE 0" in below.log()


# =================================================================================================
# tensor size


TOO_LARGE_SHAPES = {
    "float-4GiB+4": ["FLOAT", 1073741825],
    "double-2d": ["DOUBLE", 536870912, 2],
    "int8-4GiB+1": ["INT8", 4294967297],
    "uint16-3d": ["UINT16", 1024, 1024, 2049],
    "string-4Gi+1-elements": ["STRING", 4294967297],
    "overflowing-product": ["INT8", 4294967296, 4294967296, 4294967296],
    "i64-max-dims": ["INT64", 9223372036854775807, 9223372036854775807],
}


@pytest.mark.parametrize("name", list(TOO_LARGE_SHAPES))
def test_tensor_size_limit(shared_server, name):
    port, shape = shared_server.port, TOO_LARGE_SHAPES[name]
    before = int(shared_server.info("memory")["used_memory"])
    check_error_raw(port, TOO_LARGE, "AI.TENSORSET", "t", *shape)
    # checked before the data: the same error with a BLOB or VALUES that could never match
    check_error_raw(port, TOO_LARGE, "AI.TENSORSET", "t", *shape, "BLOB", b"\x00" * 8)
    check_error_raw(port, TOO_LARGE, "AI.TENSORSET", "t", *shape, "VALUES", 1, 2)
    # the TENSORSET op of a DAG: the whole command is refused
    check_error_raw(port, TOO_LARGE, "AI.DAGEXECUTE", "PERSIST", 1, "t", "|>", "AI.TENSORSET", "t", *shape)
    assert raw_command(port, "EXISTS", "t") == 0
    # nothing was allocated for it
    assert int(shared_server.info("memory")["used_memory"]) - before < 1 << 20


def test_tensor_size_limit_keeps_existing_key(con, shared_server):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1, 2)
    check_error_raw(shared_server.port, TOO_LARGE, "AI.TENSORSET", "t", "FLOAT", 1073741825)
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"1", b"2"]


@pytest.mark.parametrize("dims", [[0], [2, 0], [-1], [2, -3], ["9223372036854775808"], ["x"]])
def test_tensor_shape_errors(shared_server, dims):
    check_error_raw(shared_server.port, BAD_SHAPE, "AI.TENSORSET", "t", "FLOAT", *dims)
    check_error_raw(shared_server.port, BAD_SHAPE, "AI.DAGEXECUTE", "PERSIST", 1, "t",
                    "|>", "AI.TENSORSET", "t", "FLOAT", *dims)


def test_tensor_rank_64_persists(server):
    con = server.client()
    dims = [1] * 62 + [2, 3]
    con.execute_command("AI.TENSORSET", "t", "INT8", *dims, "VALUES", 1, 2, 3, 4, 5, 6)
    before = con.execute_command("AI.TENSORGET", "t", "META", "BLOB")
    assert con.restore("copy", 0, con.dump("t")) == b"OK"
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META", "BLOB") == before
    assert con.execute_command("AI.TENSORGET", "copy", "META", "BLOB") == before


def test_tensor_rank_above_64_is_refused(server):
    """Rank 65 cannot be stored (the RDB layout takes 64): refused when made, by TENSORSET and in a DAG."""
    con = server.client()
    check_error_raw(server.port, "ERR tensor rank exceeds the limit of 64 dimensions",
                    "AI.TENSORSET", "t", "FLOAT", *([1] * 65))
    assert con.exists("t") == 0
    check_error_raw(server.port, "ERR tensor rank exceeds the limit of 64 dimensions",
                    "AI.DAGEXECUTE", "PERSIST", 1, "t", "|>", "AI.TENSORSET", "t", "FLOAT", *([1] * 65))
    assert con.exists("t") == 0
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"


# =================================================================================================
# DAG length, model size, device queues


def test_long_dag_runs(con, shared_server):
    """10000 TENSORSET ops and a TENSORGET run (the limit is 100,000 ops)."""
    n = 10000
    args = ["AI.DAGEXECUTE", "PERSIST", 1, "x"]
    for i in range(n):
        args += ["|>", "AI.TENSORSET", "x", "INT64", 1, "VALUES", i]
    args += ["|>", "AI.TENSORGET", "x", "VALUES"]
    reply = con.execute_command(*args)
    assert len(reply) == n + 1 and reply[-1] == [n - 1]
    assert con.execute_command("AI.TENSORGET", "x", "VALUES") == [n - 1]


def test_dag_op_limit(con, shared_server):
    ops = []
    for _ in range(100_001):
        ops += ["|>", "AI.TENSORGET", "x"]
    check_error_raw(shared_server.port, "ERR DAG has too many operations (the limit is 100000)",
                    "AI.DAGEXECUTE", "ROUTING", "r", *ops)
    assert con.ping()


def test_device_queue_limit(make_server):
    """128 distinct device queues at most; then MODELSTORE on a new device fails, existing ones still work."""
    srv = make_server()
    con = srv.client()
    mul = blob("mul")
    for i in range(128):
        store(con, f"m{i}", "mul", device="CPU" if i == 0 else f"CPU:{i}")
    check_error_raw(srv.port, "ERR Could not initialize queue on requested device",
                    "AI.MODELSTORE", "extra", "ONNX", "CPU:500", "BLOB", mul)
    assert con.exists("extra") == 0
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    assert con.execute_command("AI.MODELEXECUTE", "m127", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4"]


def test_zero_filled_tensorset_respects_maxmemory(server):
    """A zero-filled TENSORSET is a few bytes on the wire but allocates its whole shape: the module checks it
    (alone and as DAG ops) against maxmemory before allocating, with Redis's OOM error."""
    con = server.client()
    used = int(con.info("memory")["used_memory"])
    con.config_set("maxmemory", used + 50_000_000)
    try:
        check_error_raw(server.port, OOM, "AI.TENSORSET", "t", "UINT8", 200_000_000)
        check_error_raw(server.port, OOM, "AI.DAGEXECUTE", "PERSIST", 1, "t",
                        "|>", "AI.TENSORSET", "t", "UINT8", 30_000_000,
                        "|>", "AI.TENSORSET", "u", "UINT8", 30_000_000)
        assert con.exists("t") == 0
        assert int(con.info("memory")["used_memory"]) < used + 10_000_000
        # what fits is still made
        assert con.execute_command("AI.TENSORSET", "t", "UINT8", 20_000_000) == b"OK"
        assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"UINT8", b"shape", [20_000_000]]
    finally:
        con.config_set("maxmemory", 0)


# =================================================================================================
# deny-oom and maxmemory

# every command that may create or grow data; reads, deletions, AI.CONFIG and AI.INFO are not deny-oom
DENY_OOM = {"ai.tensorset", "ai.modelstore", "ai.modelset", "ai.modelexecute", "ai.modelrun", "ai.scriptstore",
            "ai.scriptset", "ai.scriptexecute", "ai.scriptrun", "ai.dagexecute", "ai.dagrun"}
NOT_DENY_OOM = {"ai.tensorget", "ai.modelget", "ai.modeldel", "ai._modelscan", "ai.scriptget", "ai.scriptdel",
                "ai._scriptscan", "ai.info", "ai.config", "ai.dagexecute_ro", "ai.dagrun_ro"}


def test_command_flags(shared_server):
    infos = shared_server.raw("COMMAND", "INFO", *sorted(DENY_OOM | NOT_DENY_OOM))
    flags = {info[0].decode(): set(info[2]) for info in infos}
    assert set(flags) == DENY_OOM | NOT_DENY_OOM
    for name in DENY_OOM:
        assert {"write", "denyoom"} <= flags[name], (name, flags[name])
    for name in NOT_DENY_OOM:
        assert "denyoom" not in flags[name], (name, flags[name])
    for name in ("ai.tensorget", "ai.modelget", "ai.scriptget", "ai.dagexecute_ro", "ai.dagrun_ro"):
        assert "readonly" in flags[name], (name, flags[name])


OLD_SRC = "def bar(a, b):\n    return a + b\n"
NEW_SRC = entry("f", "return tensors[0] + tensors[1]")


def test_maxmemory_refuses_writes_reads_still_work(server):
    con = server.client()
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    store(con, "m", "mul")
    script_store(con, "s", NEW_SRC, ["f"])
    script_set(con, "old", OLD_SRC)
    used = int(server.info("memory")["used_memory"])
    # a 4 MiB tensor, then a limit 2 MiB above what was used before it: the server is over the limit
    assert con.execute_command("AI.TENSORSET", "big", "UINT8", 4 << 20) == b"OK"
    assert con.config_set("maxmemory", used + (2 << 20))
    assert int(server.info("memory")["used_memory"]) > used + (2 << 20)

    refused = {
        "t": ["AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1, 2],
        "m2": ["AI.MODELSTORE", "m2", "ONNX", "CPU", "BLOB", blob("mul")],
        "m3": ["AI.MODELSET", "m3", "ONNX", "CPU", "BLOB", blob("mul")],
        "s2": ["AI.SCRIPTSTORE", "s2", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE", NEW_SRC],
        "s3": ["AI.SCRIPTSET", "s3", "CPU", "SOURCE", OLD_SRC],
        "d": ["AI.DAGEXECUTE", "PERSIST", 1, "d", "|>", "AI.TENSORSET", "d", "FLOAT", 1, "VALUES", 1],
        "d2": ["AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "d2",
               "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "d2"],
        "d3": ["AI.DAGRUN", "LOAD", 1, "a", "PERSIST", 1, "d3", "|>", "AI.MODELRUN", "m", "INPUTS", "a", "a",
               "OUTPUTS", "d3"],
        "c": ["AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c"],
        "c2": ["AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c2"],
        "c3": ["AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c3"],
        "c4": ["AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "c4"],
    }
    for key, cmd in refused.items():
        check_error_raw(server.port, OOM, *cmd)
        assert con.exists(key) == 0, key
    # replacing an existing key is refused too, and leaves it as it was
    check_error_raw(server.port, OOM, "AI.TENSORSET", "a", "FLOAT", 1)
    check_error_raw(server.port, OOM, "AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "new", "BLOB", blob("mul"))

    # reads work
    np.testing.assert_array_equal(get_tensor(con, "a"), a)
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob("mul")
    assert con.execute_command("AI.MODELGET", "m", "META")[5] == b""
    assert con.execute_command("AI.SCRIPTGET", "s", "SOURCE") == NEW_SRC.encode()
    assert con.execute_command("AI.INFO", "m")[1] == b"m"
    assert sorted(con.execute_command("AI._MODELSCAN")) == [[b"m", b""]]
    ro = con.execute_command("AI.DAGEXECUTE_RO", "LOAD", 1, "a", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a",
                             "OUTPUTS", 1, "y", "|>", "AI.TENSORGET", "y", "BLOB")
    assert ro == [b"OK", (a * a).tobytes()]
    ro = con.execute_command("AI.DAGRUN_RO", "LOAD", 1, "a", "|>", "AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a",
                             "OUTPUTS", "y", "|>", "AI.TENSORGET", "y", "BLOB")
    assert ro == [b"OK", (a + a).tobytes()]

    # deleting works and frees memory: then writes are accepted again
    assert con.execute_command("AI.SCRIPTDEL", "old") == b"OK"
    assert con.execute_command("AI.MODELDEL", "m") == b"OK"
    assert con.delete("big") == 1
    assert con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1, 2) == b"OK"
    store(con, "m", "mul")
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * a)
    script_store(con, "s2", NEW_SRC, ["f"])


def test_maxmemory_refuses_writes_in_multi(server):
    """Inside MULTI Redis checks memory when a command is queued (any command: queuing itself takes memory),
    and EXEC is then aborted."""
    con = server.client()
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    used = int(server.info("memory")["used_memory"])
    con.execute_command("AI.TENSORSET", "big", "UINT8", 2 << 20)
    con.config_set("maxmemory", used + (1 << 20))
    c = RawClient(server.port)
    for cmd in (["MULTI"], ["AI.TENSORSET", "t", "FLOAT", 1], ["AI.TENSORGET", "a", "VALUES"], ["EXEC"]):
        c.send(*cmd)
    replies = [c.reply() for _ in range(4)]
    # Redis refuses queuing any command past maxmemory; Valkey 9 queues the read (not deny-oom). Either way the
    # write is refused and EXEC aborts.
    assert replies[:2] == ["OK", OOM] and replies[2] in (OOM, "QUEUED"), replies
    assert replies[3] == "EXECABORT Transaction discarded because of previous errors."
    c.close()
    assert con.exists("t") == 0
