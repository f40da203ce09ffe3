"""TorchScript scripts (type AI_SCRIPT): AI.SCRIPTSTORE / SCRIPTSET / SCRIPTGET / SCRIPTDEL / SCRIPTEXECUTE /
SCRIPTRUN / _SCRIPTSCAN, script ops in DAGs, AI.INFO, persistence and replication: spec §1.10-1.15, §2.3-2.4,
§3.6-3.9, §4.4 (the resnet-style multi-device pipelines rebuilt with torch_linear on `CPU`, linear.onnx on
`CPU:1` and a pre/post-processing script on `CPU:1`), and the `s:1` case recorded from RedisAI 1.2.7.

Error texts are compared on the wire: entry-point checks, `Function does not exist: <fn>`,
`Function returned unexpected number of outputs - <fn>` and TorchScript's own messages come without `ERR`.

Deliberate fix of an upstream bug asserted here: the AOF rewrite of a script stored with the deprecated
AI.SCRIPTSET is `AI.SCRIPTSET <key> <device> TAG <tag> SOURCE <src>` (RedisAI wrote an AI.SCRIPTSTORE without
ENTRY_POINTS, which cannot be replayed).

Two more RedisAI 1.2.7 behaviours asserted here: SCRIPTEXECUTE without OUTPUTS runs
and discards the function's result (torch_c.cpp `torchHandlOutputs`: `if (nOutputs == 0) return;`), and
SCRIPTEXECUTE on a script stored with SCRIPTSET makes the "best effort" positional call of §1.13.

The runaway-loop script of RedisAI's TIMEOUT test (`long_func`, `for i in range(100000000)`) is bounded here by
its ARGS (`range(int(args[0]))`, sized to run about 1.5 s) so that the test ends.

Not implemented yet and not tested: the TorchScript extensions `redis.execute`, `redis.asList`,
`redisAI.model_execute`.
"""

import socket
import threading
import time

import numpy as np
import pytest
import redis

from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import WRONGTYPE, check_error, check_error_raw, wait_replicas
from helpers.data import weights
from helpers.onnx_models import AI_INFO_LEN, ai_info, get_tensor, set_tensor, store
from helpers.recorded import need_case, payload_body, recorded_create, recorded_reply
from helpers.resp import RespError, RespReader, encode_command, raw_command
from helpers.torch_models import entry, pt_store, script_execute, script_set, script_store, scriptexecute_args

# the main test script: entry points with RedisAI's signature
MAIN_FNS = ["bar", "scale", "pair", "swap", "counts", "keylens", "argsum", "int_fn", "make"]
MAIN_SRC = (
    entry("bar", "return tensors[0] + tensors[1]")
    + entry("scale", "return tensors[0] * float(args[0])")
    + entry("pair", "return tensors[0] + 1, tensors[0] * 2")
    + entry("swap", "return [tensors[1], tensors[0]]")
    + entry("counts", "return torch.tensor([len(tensors), len(keys), len(args)])")
    + entry("keylens", "return torch.tensor([len(k) for k in keys])")
    + entry("argsum", "x = torch.zeros(1)", "for a in args:", "    x = x + float(a)", "return x")
    + entry("int_fn", "return 1")
    + entry("make", "return torch.ones(2, 3)")
)
# an old-style script (AI.SCRIPTSET): positional tensor arguments, a trailing List[Tensor]
OLD_SRC = (
    "def bar(a, b):\n    return a + b\n\n"
    "def bar_variadic(a, args: List[Tensor]):\n    return a + args[0] + args[1]\n\n"
    "def pre(a):\n    return a / 10\n\n"
    "def ens(a, rest: List[Tensor]):\n    return (a + rest[0]) / 2\n\n"
    "def post(a):\n    return a * 2 - 1\n"
)
# the pre/post-processing script of the §4.4 pipelines
PIPE_FNS = ["pre_process", "post_process", "ensemble"]
PIPE_SRC = (
    entry("pre_process", "return [t / 10 for t in tensors]")
    + entry("post_process", "return tensors[0] * 2 - 1")
    + entry("ensemble", "return (tensors[0] + tensors[1]) / 2")
)
LONG_SRC = entry("long_func", "a = tensors[0]", "for i in range(int(args[0])):", "    a = a + 1", "return a")
BAR_SRC = entry("bar", "return tensors[0] + tensors[1]")


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


@pytest.fixture
def port(shared_server):
    return shared_server.port


def error_text(fn, *args, **kwargs):
    try:
        r = fn(*args, **kwargs)
    except redis.exceptions.ResponseError as e:
        return str(e)
    pytest.fail(f"expected an error, got {r!r}", pytrace=False)


def values(con, key):
    return [float(v) for v in con.execute_command("AI.TENSORGET", key, "VALUES")]


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def scriptget_full(device, tag, entry_points, source):
    return [b"device", device, b"tag", tag, b"Entry Points", [e.encode() for e in entry_points],
            b"source", source.encode()]


# =================================================================================================
# AI.SCRIPTSTORE


def scriptstore_parse_cases():
    s = BAR_SRC
    return [
        (arity("ai.scriptstore"), ["AI.SCRIPTSTORE", "s", "CPU"]),
        (arity("ai.scriptstore"), ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE"]),
        ("ERR Insufficient arguments, missing script entry points",
         ["AI.SCRIPTSTORE", "s", "CPU", "TAG", "t", "SOURCE", s, "x"]),
        ("ERR Insufficient arguments, missing script entry points",
         ["AI.SCRIPTSTORE", "s", "CPU", "SOURCE", s, "ENTRY_POINTS", 1, "bar"]),
        ("ERR Non numeric entry points number provided to AI.SCRIPTSTORE command",
         ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", "x", "bar", "SOURCE", s]),
        ("ERR Non numeric entry points number provided to AI.SCRIPTSTORE command",
         ["AI.SCRIPTSTORE", "s", "CPU", "TAG", "t", "ENTRY_POINTS", "1.5", "bar", "SOURCE", s]),
        ("ERR Insufficient arguments, missing script entry points",
         ["AI.SCRIPTSTORE", "s", "CPU", "TAG", "t", "ENTRY_POINTS", 5, "bar", "SOURCE", s]),
        ("ERR Insufficient arguments, missing script SOURCE",
         ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SRC", s]),
        ("ERR Insufficient arguments, missing script SOURCE",
         ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 2, "bar", "baz", "SOURCE"]),
        ("ERR Insufficient arguments, missing script SOURCE",
         ["AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "baz", "SOURCE"]),
    ]


@pytest.mark.parametrize("case", range(len(scriptstore_parse_cases())))
def test_scriptstore_parse_errors(con, port, case):
    msg, cmd = scriptstore_parse_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("s") == 0


def test_scriptstore_entry_point_errors(con, port):
    sig = "(tensors: List[Tensor], keys: List[str], args: List[str])"
    check_error_raw(port, "Function bar1 does not exist in the given script.",
                    "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar1", "SOURCE", BAR_SRC)
    check_error_raw(port, "Function bar1 does not exist in the given script.",
                    "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 2, "bar", "bar1", "SOURCE", BAR_SRC)
    check_error_raw(port, "Wrong number of inputs in function bar. Expected 3 but was 2",
                    "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE",
                    "def bar(tensors: List[Tensor], keys: List[str]):\n    return tensors[0]\n")
    check_error_raw(port, "Wrong number of inputs in function bar. Expected 3 but was 2",
                    "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", OLD_SRC)
    wrong_types = ("Wrong inputs type in function bar. Expected signature similar to: "
                   "def bar(tensors: List[Tensor], keys: List[str], args: List[str])")
    check_error_raw(port, wrong_types, "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE",
                    "def bar(tensors: List[Tensor], keys: List[str], args: List[Tensor]):\n    return tensors[0]\n")
    check_error_raw(port, wrong_types, "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE",
                    "def bar(a, b, c):\n    return a\n")
    # the second entry point is checked too
    check_error_raw(port, wrong_types.replace("bar", "baz"), "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 2,
                    "bar", "baz", "SOURCE", BAR_SRC + "def baz(a, b, c):\n    return a\n")
    assert con.exists("s") == 0
    # a syntax error: TorchScript's own message, on one line, without ERR
    bad = f"def bar{sig}:\n    return tensors[0] +\n"
    reply = raw_command(port, "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", bad)
    assert isinstance(reply, RespError), reply
    assert not reply.startswith("ERR"), reply
    assert "<string>" in reply and "\n" not in reply, reply
    reply = raw_command(port, "AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", "this is not python")
    assert isinstance(reply, RespError) and "<string>" in reply, reply
    assert con.exists("s") == 0
    # a failed store does not replace the script at the key
    script_store(con, "s", BAR_SRC, ["bar"], tag="keep")
    before = con.execute_command("AI.SCRIPTGET", "s")
    check_error_raw(port, "Function bar1 does not exist in the given script.",
                    "AI.SCRIPTSTORE", "s", "CPU", "TAG", "new", "ENTRY_POINTS", 1, "bar1", "SOURCE", BAR_SRC)
    assert con.execute_command("AI.SCRIPTGET", "s") == before
    assert ai_info(con, "s")["tag"] == b"keep"


def test_scriptstore_devices(con, port):
    check_error_raw(port, "ERR Error configuring script: unsupported device",
                    "AI.SCRIPTSTORE", "s", "XPU", "ENTRY_POINTS", 1, "bar", "SOURCE", BAR_SRC)
    check_error_raw(port, "ERR Error configuring script: unsupported device",
                    "AI.SCRIPTSET", "s", "bad_device", "SOURCE", OLD_SRC)
    for dev in ("GPU", "GPU:0", "gpu:1"):
        for cmd in (["AI.SCRIPTSTORE", "s", dev, "ENTRY_POINTS", 1, "bar", "SOURCE", BAR_SRC],
                    ["AI.SCRIPTSET", "s", dev, "SOURCE", OLD_SRC]):
            msg = error_text(con.execute_command, *cmd)
            assert "CUDA" in msg, msg
    assert con.exists("s") == 0
    # the device string is stored as given
    for i, dev in enumerate(["CPU", "cpu", "CPU:1", "cpu:3"]):
        script_store(con, f"s{i}", BAR_SRC, ["bar"], device=dev)
        assert con.execute_command("AI.SCRIPTGET", f"s{i}", "META")[1] == dev.encode()
        assert ai_info(con, f"s{i}")["device"] == dev.encode()


def test_scriptstore_wrongtype_and_replace(con, port):
    set_tensor(con, "t", np.ones(2, dtype=np.float32))
    con.set("str", "v")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTSTORE", "t", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", BAR_SRC)
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTSET", "str", "CPU", "SOURCE", OLD_SRC)
    pt_store(con, "m", "torch_add")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTSTORE", "m", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", BAR_SRC)
    assert con.type("t") == b"AI_TENSOR" and con.get("str") == b"v" and con.type("m") == b"AI__MODEL"
    # storing again replaces the script and resets its stats
    script_store(con, "s", BAR_SRC, ["bar"], tag="v1")
    set_tensor(con, "a", np.array([1.0, 2.0], dtype=np.float32))
    assert script_execute(con, "s", "bar", inputs=["a", "a"], outputs=["c"]) == b"OK"
    assert ai_info(con, "s")["calls"] == 1
    script_store(con, "s", MAIN_SRC, MAIN_FNS, tag="v2")
    assert con.type("s") == b"AI_SCRIPT"
    info = ai_info(con, "s")
    assert (info["tag"], info["calls"]) == (b"v2", 0)
    assert script_execute(con, "s", "scale", inputs=["a"], args=["3"], outputs=["c"]) == b"OK"
    assert values(con, "c") == [3.0, 6.0]
    # SCRIPTSET over a SCRIPTSTORE script: no entry points any more
    script_set(con, "s", OLD_SRC, tag="v3")
    assert con.execute_command("AI.SCRIPTGET", "s", "META") == [b"device", b"CPU", b"tag", b"v3",
                                                                 b"Entry Points", []]


# =================================================================================================
# AI.SCRIPTSET (deprecated), AI.SCRIPTGET, AI.SCRIPTDEL


def test_scriptset_errors(con, port):
    check_error_raw(port, arity("AI.SCRIPTSET"), "AI.SCRIPTSET", "s", "CPU", "SOURCE")
    check_error_raw(port, arity("AI.SCRIPTSET"), "AI.SCRIPTSET", "s", "CPU", "TAG", "t", "SOURCE")
    check_error_raw(port, arity("AI.SCRIPTSET"), "AI.SCRIPTSET", "s", "CPU", "TAG", "t", "SOURCE", OLD_SRC, "x")
    check_error_raw(port, arity("AI.SCRIPTSET"), "AI.SCRIPTSET", "s")
    check_error_raw(port, "ERR Insufficient arguments, missing script SOURCE", "AI.SCRIPTSET", "s", "CPU", "SRC", OLD_SRC)
    check_error_raw(port, "ERR Insufficient arguments, missing script SOURCE",
                    "AI.SCRIPTSET", "s", "CPU", "TAG", "t", "SRC", OLD_SRC)
    assert con.exists("s") == 0
    # a compilation error is TorchScript's message
    msg = error_text(con.execute_command, "AI.SCRIPTSET", "s", "CPU", "SOURCE", "def bar(a, b):\n    return a +\n")
    assert "<string>" in msg and "\n" not in msg, msg
    assert con.exists("s") == 0
    assert con.execute_command("AI.SCRIPTSET", "s", "CPU", "SOURCE", OLD_SRC) == b"OK"
    assert con.execute_command("AI.SCRIPTSET", "s2", "cpu:1", "TAG", "old", "SOURCE", OLD_SRC) == b"OK"
    assert con.execute_command("AI.SCRIPTGET", "s2") == scriptget_full(b"cpu:1", b"old", [], OLD_SRC)
    assert con.type("s2") == b"AI_SCRIPT"


def test_scriptget_replies(con, port):
    script_store(con, "s", MAIN_SRC, MAIN_FNS, tag="my tag", device="CPU:1")
    full = scriptget_full(b"CPU:1", b"my tag", MAIN_FNS, MAIN_SRC)
    assert len(full) == 8
    assert con.execute_command("AI.SCRIPTGET", "s") == full
    assert con.execute_command("AI.SCRIPTGET", "s", "META", "SOURCE") == full
    assert con.execute_command("AI.SCRIPTGET", "s", "source", "meta") == full
    assert con.execute_command("AI.SCRIPTGET", "s", "META") == full[:6]
    assert con.execute_command("AI.SCRIPTGET", "s", "SOURCE") == MAIN_SRC.encode()
    assert raw_command(port, "AI.SCRIPTGET", "s", "META")[4] == b"Entry Points"
    script_set(con, "old", OLD_SRC)
    assert con.execute_command("AI.SCRIPTGET", "old", "META") == [b"device", b"CPU", b"tag", b"",
                                                                   b"Entry Points", []]
    assert con.execute_command("AI.SCRIPTGET", "old", "SOURCE") == OLD_SRC.encode()
    # errors
    check_error_raw(port, arity("AI.SCRIPTGET"), "AI.SCRIPTGET")
    check_error_raw(port, arity("AI.SCRIPTGET"), "AI.SCRIPTGET", "s", "META", "SOURCE", "x")
    check_error_raw(port, "ERR script key is empty", "AI.SCRIPTGET", "nokey")
    check_error_raw(port, "ERR script key is empty", "AI.SCRIPTGET", "nokey", "SOURCE")
    set_tensor(con, "t", np.ones(1, dtype=np.float32))
    con.set("str", "v")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTGET", "t")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTGET", "str", "META")


def test_scriptdel(con, port):
    script_store(con, "s", BAR_SRC, ["bar"], tag="t")
    assert ai_info(con, "s")["type"] == b"SCRIPT"
    assert raw_command(port, "AI.SCRIPTDEL", "s") == "OK"
    assert con.exists("s") == 0
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "s")
    check_error_raw(port, "ERR script key is empty", "AI.SCRIPTDEL", "s")
    check_error_raw(port, arity("AI.SCRIPTDEL"), "AI.SCRIPTDEL")
    check_error_raw(port, arity("AI.SCRIPTDEL"), "AI.SCRIPTDEL", "s", "x")
    set_tensor(con, "t", np.ones(1, dtype=np.float32))
    pt_store(con, "m", "torch_add")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTDEL", "t")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTDEL", "m")
    assert con.exists("t") == 1 and con.exists("m") == 1
    # DEL works too and removes the stats entry
    script_set(con, "s2", OLD_SRC)
    assert con.delete("s2") == 1
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "s2")


# =================================================================================================
# AI.SCRIPTEXECUTE


def scriptexecute_parse_cases():
    S = ["AI.SCRIPTEXECUTE", "s", "bar"]
    dup = "ERR Already Encountered {} scope in AI.SCRIPTEXECUTE command"
    return [
        (arity("AI.SCRIPTEXECUTE"), ["AI.SCRIPTEXECUTE", "s"]),
        (arity("AI.SCRIPTEXECUTE"), ["AI.SCRIPTEXECUTE"]),
        ("ERR script key is empty", ["AI.SCRIPTEXECUTE", "nokey", "bar", "INPUTS", 1, "a"]),
        (WRONGTYPE, ["AI.SCRIPTEXECUTE", "a", "bar", "INPUTS", 1, "a"]),
        (WRONGTYPE, ["AI.SCRIPTEXECUTE", "str", "bar", "INPUTS", 1, "a"]),
        ("ERR KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command", S),
        ("ERR KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command", S + ["ARGS", 1, "x"]),
        ("ERR KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command", S + ["OUTPUTS", 1, "o"]),
        ("ERR KEYS or INPUTS scope must be provided first for AI.SCRIPTEXECUTE command", S + ["TIMEOUT", 10]),
        ("ERR Missing arguments after KEYS keyword", S + ["KEYS"]),
        ("ERR Invalid or negative value found in number of KEYS", S + ["KEYS", 0, "k"]),
        ("ERR Invalid or negative value found in number of KEYS", S + ["KEYS", -1, "k"]),
        ("ERR Invalid or negative value found in number of KEYS", S + ["KEYS", "x", "k"]),
        ("ERR Number of pre declared KEYS to be used in the command does not match the number of given arguments",
         S + ["KEYS", 3, "k1", "k2"]),
        ("ERR Invalid arguments provided to AI.SCRIPTEXECUTE", S + ["INPUTS"]),
        ("ERR Invalid arguments provided to AI.SCRIPTEXECUTE", S + ["INPUTS", 1, "a", "ARGS"]),
        ("ERR Invalid arguments provided to AI.SCRIPTEXECUTE", S + ["INPUTS", 1, "a", "OUTPUTS"]),
        ("ERR Invalid argument for inputs count in AI.SCRIPTEXECUTE", S + ["INPUTS", "x", "a"]),
        ("ERR Invalid argument for keys count in AI.SCRIPTEXECUTE", S + ["INPUTS", 1, "a", "ARGS", "x", "y"]),
        ("ERR Invalid argument for outputs count in AI.SCRIPTEXECUTE", S + ["INPUTS", 1, "a", "OUTPUTS", "x", "o"]),
        ("ERR number of inputs to AI.SCRIPTEXECUTE command does not match the number of given arguments",
         S + ["INPUTS", 3, "a", "a"]),
        ("ERR number of args to AI.SCRIPTEXECUTE command does not match the number of given arguments",
         S + ["INPUTS", 2, "a", "a", "ARGS", 3, "x"]),
        ("ERR number of outputs to AI.SCRIPTEXECUTE command does not match the number of given arguments",
         S + ["INPUTS", 2, "a", "a", "OUTPUTS", 2, "o"]),
        (dup.format("INPUTS"), S + ["INPUTS", 1, "a", "INPUTS", 1, "a"]),
        (dup.format("KEYS"), S + ["KEYS", 1, "k", "KEYS", 1, "k"]),
        (dup.format("KEYS"), S + ["KEYS", 1, "k", "INPUTS", 2, "a", "a", "KEYS", 1, "k"]),
        (dup.format("ARGS"), S + ["INPUTS", 2, "a", "a", "ARGS", 1, "x", "ARGS", 1, "y"]),
        (dup.format("OUTPUTS"), S + ["INPUTS", 2, "a", "a", "OUTPUTS", 1, "o", "OUTPUTS", 1, "p"]),
        ("ERR No value provided for TIMEOUT in AI.SCRIPTEXECUTE", S + ["INPUTS", 2, "a", "a", "TIMEOUT"]),
        ("ERR Invalid value for TIMEOUT", S + ["INPUTS", 2, "a", "a", "OUTPUTS", 1, "o", "TIMEOUT", 0]),
        ("ERR Invalid value for TIMEOUT", S + ["INPUTS", 2, "a", "a", "TIMEOUT", -5]),
        ("ERR Invalid value for TIMEOUT", S + ["INPUTS", 2, "a", "a", "TIMEOUT", "x"]),
        ("ERR Encountered problem parsing AI.SCRIPTEXECUTE", S + ["INPUTS", 2, "a", "a", "TIMEOUT", 100,
                                                                 "OUTPUTS", 1, "o"]),
        ("ERR Encountered problem parsing AI.SCRIPTEXECUTE", S + ["INPUTS", 2, "a", "a", "TIMEOUT", 100, "x"]),
        ("ERR Invalid AI.SCRIPTEXECUTE command. Unexpected argument: X", S + ["INPUTS", 2, "a", "a", "X"]),
        ("ERR Invalid AI.SCRIPTEXECUTE command. Unexpected argument: FOO",
         S + ["KEYS", 1, "k", "FOO", "INPUTS", 1, "a"]),
        ("ERR tensor key is empty or in a different shard", S + ["INPUTS", 2, "a", "nokey", "OUTPUTS", 1, "o"]),
        (WRONGTYPE, S + ["INPUTS", 2, "a", "str", "OUTPUTS", 1, "o"]),
    ]


@pytest.mark.parametrize("case", range(len(scriptexecute_parse_cases())))
def test_scriptexecute_parse_errors(con, port, case):
    script_store(con, "s", BAR_SRC, ["bar"])
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    con.set("str", "v")
    msg, cmd = scriptexecute_parse_cases()[case]
    check_error_raw(port, msg, *cmd)
    assert con.exists("o") == 0
    assert ai_info(con, "s")["calls"] == 0


def test_scriptexecute_runtime_errors(con, port):
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    check_error_raw(port, "Function does not exist: nope", *scriptexecute_args("s", "nope", inputs=["a"], outputs=["o"]))
    # fewer / more tensors returned than OUTPUTS
    check_error_raw(port, "Function returned unexpected number of outputs - bar",
                    *scriptexecute_args("s", "bar", inputs=["a", "a"], outputs=["o", "p"]))
    check_error_raw(port, "Function returned unexpected number of outputs - pair",
                    *scriptexecute_args("s", "pair", inputs=["a"], outputs=["o"]))
    check_error_raw(port, "Function returned unexpected number of outputs - swap",
                    *scriptexecute_args("s", "swap", inputs=["a", "a"], outputs=["o", "p", "q"]))
    check_error_raw(port, "Function returned non-tensor valuesint_fn",
                    *scriptexecute_args("s", "int_fn", inputs=["a"], outputs=["o"]))
    # a TorchScript runtime error: its message, on one line
    reply = raw_command(port, *scriptexecute_args("s", "bar", inputs=["a"], outputs=["o"]))
    assert isinstance(reply, RespError) and "list index out of range" in reply and "\n" not in reply, reply
    reply = raw_command(port, *scriptexecute_args("s", "scale", inputs=["a"], args=["abc"], outputs=["o"]))
    assert isinstance(reply, RespError) and "\n" not in reply, reply
    for k in ("o", "p", "q"):
        assert con.exists(k) == 0
    info = ai_info(con, "s")
    assert (info["calls"], info["errors"], info["samples"]) == (7, 7, -1), info
    # still usable
    assert script_execute(con, "s", "bar", inputs=["a", "a"], outputs=["o"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "o"), a + a)


def test_scriptexecute_results(con):
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    a = f32(2, 3, seed=1)
    b = f32(2, 3, seed=2)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert script_execute(con, "s", "bar", inputs=["a", "b"], outputs=["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", b"FLOAT", b"shape", [2, 3]]
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    # ARGS reach the function as List[str]
    assert script_execute(con, "s", "scale", inputs=["a"], args=["2.5"], outputs=["c"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "c"), a * np.float32(2.5), rtol=1e-6)
    assert script_execute(con, "s", "argsum", keys=["k"], args=["1.5", "-4", "10"], outputs=["c"]) == b"OK"
    assert values(con, "c") == [7.5]
    # KEYS as List[str]
    assert script_execute(con, "s", "keylens", keys=["k", "key2", "{tag}x"], outputs=["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META", "VALUES") == [
        b"dtype", b"INT64", b"shape", [3], b"values", [1, 4, 6]]
    assert script_execute(con, "s", "counts", keys=["k1", "k2"], inputs=["a", "b", "a"], args=["x"],
                          outputs=["c"], timeout=10000) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [3, 2, 1]
    # a returned tuple and a returned List[Tensor] are flattened into the outputs
    assert script_execute(con, "s", "pair", inputs=["a"], outputs=["p", "q"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "p"), a + np.float32(1))
    np.testing.assert_array_equal(get_tensor(con, "q"), a * np.float32(2))
    assert script_execute(con, "s", "swap", inputs=["a", "b"], outputs=["x", "y"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "x"), b)
    np.testing.assert_array_equal(get_tensor(con, "y"), a)
    # integer tensors keep their type
    i = np.array([[5, -7], [100, 3]], dtype=np.int64)
    set_tensor(con, "i", i)
    assert script_execute(con, "s", "pair", inputs=["i"], outputs=["p", "q"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "p", "META", "VALUES") == [
        b"dtype", b"INT64", b"shape", [2, 2], b"values", [6, -6, 101, 4]]
    j = np.array([1, 2, 3], dtype=np.int32)
    set_tensor(con, "j", j)
    assert script_execute(con, "s", "bar", inputs=["j", "j"], outputs=["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META", "VALUES") == [
        b"dtype", b"INT32", b"shape", [3], b"values", [2, 4, 6]]
    info = ai_info(con, "s")
    assert (info["calls"], info["errors"], info["samples"]) == (9, 0, -1), info


def test_scriptexecute_without_outputs(con):
    """RedisAI 1.2.7 (torch_c.cpp torchHandlOutputs: `if (nOutputs == 0) return;`) runs a SCRIPTEXECUTE without
    OUTPUTS and discards what the function returns (the form used by scripts that only write via redis.execute)."""
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    assert script_execute(con, "s", "bar", inputs=["a", "a"]) == b"OK"
    assert script_execute(con, "s", "counts", keys=["k"], args=["x"]) == b"OK"
    info = ai_info(con, "s")
    assert (info["calls"], info["errors"]) == (2, 0), info


def test_scriptexecute_on_scriptset_script(con):
    """§1.13: for scripts stored with SCRIPTSET (no entry points) SCRIPTEXECUTE makes a "best effort" positional
    call (tensor arguments, a trailing List[Tensor] takes the remaining inputs)."""
    script_set(con, "old", OLD_SRC)
    a = np.array([1.0, 2.0], dtype=np.float32)
    b = np.array([10.0, 20.0], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert script_execute(con, "old", "bar", inputs=["a", "b"], outputs=["c"]) == b"OK"
    assert values(con, "c") == [11.0, 22.0]
    assert script_execute(con, "old", "bar_variadic", inputs=["a", "b", "b"], outputs=["c"]) == b"OK"
    assert values(con, "c") == [21.0, 42.0]


def test_scriptexecute_concurrent_clients(server):
    """Several clients running the same script on the same and on another device at once."""
    con = server.client()
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    script_store(con, "s1", MAIN_SRC, MAIN_FNS, device="CPU:1")
    errors = []

    def worker(t):
        c = server.client()
        try:
            for i in range(15):
                x = np.full((2, 2), t * 100 + i, dtype=np.float32)
                set_tensor(c, f"x{t}", x)
                key = "s" if (t + i) % 2 else "s1"
                assert script_execute(c, key, "scale", inputs=[f"x{t}"], args=[str(t + 1)],
                                      outputs=[f"y{t}"]) == b"OK"
                np.testing.assert_array_equal(get_tensor(c, f"y{t}"), x * np.float32(t + 1))
        except Exception as e:  # noqa: BLE001
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert errors == [], errors
    assert ai_info(con, "s")["calls"] + ai_info(con, "s1")["calls"] == 90


def _send(port, *args):
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(encode_command(args))
    return sock


def test_scriptexecute_timeout_while_queue_busy(server):
    """A runaway loop (RedisAI's `long_func`) keeps the CPU queue busy; requests waiting behind it longer than
    their TIMEOUT get +TIMEDOUT (simple string), are not run and store nothing."""
    con = server.client()
    script_store(con, "ll", LONG_SRC, ["long_func"])
    pt_store(con, "m", "torch_add")
    set_tensor(con, "a", np.array([1.0], dtype=np.float32))
    # calibrate the loop so that the busy run takes about 1.5 s (TorchScript profiles the first run: time the second)
    for _ in range(2):
        t0 = time.monotonic()
        assert script_execute(con, "ll", "long_func", inputs=["a"], args=["50000"], outputs=["b"]) == b"OK"
    per_iter = (time.monotonic() - t0) / 50000
    n = int(min(max(1.5 / per_iter, 200000), 20000000))
    busy = _send(server.port, *scriptexecute_args("ll", "long_func", inputs=["a"], args=[str(n)], outputs=["b"]))
    waiting = []
    try:
        time.sleep(0.3)
        # a SCRIPTEXECUTE, a MODELEXECUTE and a DAG queued on the same device behind it, each with TIMEOUT 100 ms
        waiting.append(_send(server.port, *scriptexecute_args("ll", "long_func", inputs=["a"], args=["1"],
                                                              outputs=["c"], timeout=100)))
        waiting.append(_send(server.port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "d",
                             "TIMEOUT", 100))
        waiting.append(_send(server.port, "AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "e", "TIMEOUT", 100,
                             "|>", *scriptexecute_args("ll", "long_func", inputs=["a"], args=["1"], outputs=["e"])))
        replies = [RespReader(w).reply() for w in waiting]
        assert replies == ["TIMEDOUT"] * 3, replies
        # the busy run finishes normally
        reply = RespReader(busy).reply()
        assert reply == "OK", reply
    finally:
        for sock in [busy] + waiting:
            sock.close()
    assert values(con, "b") == [1.0 + n]
    for k in ("c", "d", "e"):
        assert con.exists(k) == 0, k
    # timed-out requests were never run
    assert ai_info(con, "ll")["calls"] == 3
    assert ai_info(con, "m")["calls"] == 0
    # with a TIMEOUT that is long enough it runs
    assert script_execute(con, "ll", "long_func", inputs=["a"], args=["3"], outputs=["c"], timeout=30000) == b"OK"
    assert values(con, "c") == [4.0]


# =================================================================================================
# AI.SCRIPTRUN (deprecated)


def test_scriptrun(con, port):
    script_set(con, "old", OLD_SRC)
    a = np.array([[1.0, 2.0]], dtype=np.float32)
    b = np.array([[10.0, 20.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert con.execute_command("AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "b", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    assert con.execute_command("AI.SCRIPTRUN", "old", "bar", "TIMEOUT", 5000, "INPUTS", "b", "b",
                               "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), b + b)
    # `$` starts the List[Tensor] argument
    assert con.execute_command("AI.SCRIPTRUN", "old", "bar_variadic", "INPUTS", "a", "$", "b", "b",
                               "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b + b)
    assert con.execute_command("AI.SCRIPTRUN", "old", "ens", "INPUTS", "a", "$", "b", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), (a + b) / 2)
    # runtime errors
    check_error_raw(port, "Function does not exist: nope", "AI.SCRIPTRUN", "old", "nope", "INPUTS", "a",
                    "OUTPUTS", "c")
    check_error_raw(port, "Wrong number of inputs provided to function: bar", "AI.SCRIPTRUN", "old", "bar",
                    "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, "Function returned unexpected number of outputs - bar", "AI.SCRIPTRUN", "old", "bar",
                    "INPUTS", "a", "b", "OUTPUTS", "c", "d")
    script_set(con, "typed", "def f(a, n: int):\n    return a\n")
    check_error_raw(port, "Unsupported input type in function definition: f", "AI.SCRIPTRUN", "typed", "f",
                    "INPUTS", "a", "OUTPUTS", "c")
    assert con.exists("d") == 0


def test_scriptrun_parse_errors(con, port):
    script_set(con, "old", OLD_SRC)
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    R = ["AI.SCRIPTRUN", "old", "bar"]
    check_error_raw(port, arity("AI.SCRIPTRUN"), "AI.SCRIPTRUN", "old")
    check_error_raw(port, arity("AI.SCRIPTRUN"), "AI.SCRIPTRUN")
    check_error_raw(port, "ERR script key is empty", "AI.SCRIPTRUN", "nokey", "bar", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, WRONGTYPE, "AI.SCRIPTRUN", "a", "bar", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR Already encountered an TIMEOUT section in SCRIPTRUN",
                    *R, "TIMEOUT", 10, "TIMEOUT", 10, "INPUTS", "a", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR Already encountered an INPUTS section in SCRIPTRUN",
                    *R, "INPUTS", "a", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR Already encountered an OUTPUTS keyword in SCRIPTRUN",
                    *R, "INPUTS", "a", "a", "OUTPUTS", "c", "OUTPUTS", "d")
    check_error_raw(port, "ERR Encountered a variable size list of tensors outside of input section",
                    *R, "$", "a", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR Encountered a variable size list of tensors outside of input section",
                    *R, "INPUTS", "a", "OUTPUTS", "c", "$", "d")
    check_error_raw(port, "ERR Already encountered a variable size list of tensors",
                    *R, "INPUTS", "a", "$", "a", "$", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR Unrecongnized parameter to SCRIPTRUN", *R, "x", "INPUTS", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR No value provided for TIMEOUT", *R, "INPUTS", "a", "a", "OUTPUTS", "c", "TIMEOUT")
    check_error_raw(port, "ERR Invalid value for TIMEOUT", *R, "TIMEOUT", 0, "INPUTS", "a", "a", "OUTPUTS", "c")
    check_error_raw(port, "ERR tensor key is empty or in a different shard", *R, "INPUTS", "a", "nokey",
                    "OUTPUTS", "c")
    assert con.exists("c") == 0 and con.exists("d") == 0


# =================================================================================================
# AI.INFO, AI._SCRIPTSCAN, MEMORY USAGE, COMMAND GETKEYS


def test_ai_info_script(con, port):
    script_store(con, "s", MAIN_SRC, MAIN_FNS, tag="v1", device="CPU:1")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    assert script_execute(con, "s", "bar", inputs=["a", "a"], outputs=["c"]) == b"OK"
    assert script_execute(con, "s", "pair", inputs=["a"], outputs=["p", "q"]) == b"OK"
    with pytest.raises(redis.exceptions.ResponseError):
        script_execute(con, "s", "nope", inputs=["a"], outputs=["c"])
    reply = con.execute_command("AI.INFO", "s")
    assert len(reply) == AI_INFO_LEN
    assert reply[:10] == [b"key", b"s", b"type", b"SCRIPT", b"backend", b"TORCH", b"device", b"CPU:1", b"tag", b"v1"]
    assert reply[10] == b"duration" and reply[11] > 0
    assert reply[12:18] == [b"samples", -1, b"calls", 3, b"errors", 1]
    assert con.execute_command("AI.INFO", "s", "RESETSTAT") == b"OK"
    assert con.execute_command("AI.INFO", "s")[10:18] == [b"duration", 0, b"samples", -1, b"calls", 0, b"errors", 0]
    # the deprecated commands count too
    script_set(con, "old", OLD_SRC, tag="o")
    assert con.execute_command("AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "c") == b"OK"
    info = ai_info(con, "old")
    assert (info["type"], info["backend"], info["tag"], info["samples"], info["calls"]) == (
        b"SCRIPT", b"TORCH", b"o", -1, 1), info
    check_error_raw(port, "ERR cannot find run info for key", "AI.INFO", "nokey")


def test_scriptscan(con, port):
    script_store(con, "s1", BAR_SRC, ["bar"], tag="t1")
    script_set(con, "s2", OLD_SRC)
    script_store(con, "s3", BAR_SRC, ["bar"], tag="t3", device="CPU:1")
    pt_store(con, "m", "torch_add", "TAG", "model")
    assert sorted(con.execute_command("AI._SCRIPTSCAN")) == [[b"s1", b"t1"], [b"s2", b""], [b"s3", b"t3"]]
    assert con.execute_command("AI._MODELSCAN") == [[b"m", b"model"]]
    con.execute_command("AI.SCRIPTDEL", "s1")
    assert sorted(con.execute_command("AI._SCRIPTSCAN")) == [[b"s2", b""], [b"s3", b"t3"]]
    check_error_raw(port, arity("AI._SCRIPTSCAN"), "AI._SCRIPTSCAN", "x")


def test_memory_usage(con):
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    script_set(con, "old", OLD_SRC)
    assert con.memory_usage("s") >= len(MAIN_SRC)
    assert con.memory_usage("old") >= len(OLD_SRC)


def test_getkeys(con, port):
    reply = raw_command(port, "COMMAND", "GETKEYS", "AI.SCRIPTEXECUTE", "s", "f", "KEYS", 1, "k", "INPUTS", 2, "a",
                        "b", "ARGS", 1, "x", "OUTPUTS", 1, "o")
    assert reply == [b"s", b"k", b"a", b"b", b"o"]


# =================================================================================================
# script ops in DAGs (§1.14, §2, §4.4)


def pipeline_setup(con):
    """The §4.4 pipeline parts: a pre/post-processing script on CPU:1, torch_linear on CPU, linear.onnx on CPU:1."""
    script_store(con, "imagenet_script", PIPE_SRC, PIPE_FNS, device="CPU:1")
    pt_store(con, "imagenet_model1", "torch_linear", device="CPU")
    store(con, "imagenet_model2", "linear", device="CPU:1")
    x1 = f32(3, 4, seed=21) * 10
    x2 = f32(3, 4, seed=22) * 10
    set_tensor(con, "image2", x2)
    return x1, x2


def head(x1):
    """TENSORSET image1 + pre_process of both images + the two models on two devices in parallel."""
    return [
        ["AI.TENSORSET", "image1", "FLOAT", 3, 4, "BLOB", x1.tobytes()],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "pre_process", "INPUTS", 2, "image1", "image2",
         "OUTPUTS", 2, "pre1", "pre2"],
        ["AI.MODELEXECUTE", "imagenet_model1", "INPUTS", 1, "pre1", "OUTPUTS", 1, "temp_key1"],
        ["AI.MODELEXECUTE", "imagenet_model2", "INPUTS", 1, "pre2", "OUTPUTS", 1, "temp_key2"],
    ]


def dag(header, ops, command="AI.DAGEXECUTE"):
    out = [command, *header]
    for op in ops:
        out += ["|>", *op]
    return out


def post(x):
    return x * np.float32(2) - np.float32(1)


def test_dag_multidevice_pipeline(con, port):
    x1, x2 = pipeline_setup(con)
    # ops may only read what was LOADed or produced before
    check_error(con, "INPUT key cannot be found in DAG", *dag(["LOAD", 1, "image2"], [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "pre_process", "INPUTS", 2, "image1", "image2",
         "OUTPUTS", 2, "pre1", "pre2"]]))
    check_error(con, "Number of keys given as INPUTS here does not match model definition", *dag(
        ["LOAD", 1, "image2"], [["AI.MODELEXECUTE", "imagenet_model1", "INPUTS", 2, "image2", "image2",
                                 "OUTPUTS", 1, "y"]]))
    # a function that does not exist is that op's error entry; the ops after it are not run
    ret = con.execute_command(*dag(["LOAD", 1, "image2"], [
        ["AI.TENSORSET", "image1", "FLOAT", 3, 4, "BLOB", x1.tobytes()],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "wrong_fn", "INPUTS", 2, "image1", "image2",
         "OUTPUTS", 2, "pre1", "pre2"],
        ["AI.TENSORGET", "pre1", "META"]]))
    assert ret[0] == b"OK" and ret[2] == b"NA", ret
    assert isinstance(ret[1], redis.exceptions.ResponseError) and str(ret[1]) == "Function does not exist: wrong_fn"
    # the full pipeline: TENSORSET -> pre_process (CPU:1) -> two models (CPU, CPU:1) -> two post_process
    ret = con.execute_command(*dag(["LOAD", 1, "image2", "PERSIST", 2, "output1", "output2"], head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key2", "OUTPUTS", 1, "output2"],
    ]))
    assert ret == [b"OK"] * 6, ret
    np.testing.assert_allclose(get_tensor(con, "output1"), post(weights.linear(x1 / np.float32(10))),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(get_tensor(con, "output2"), post(weights.linear(x2 / np.float32(10))),
                               rtol=1e-5, atol=1e-5)
    for k in ("image1", "pre1", "pre2", "temp_key1", "temp_key2"):
        assert con.exists(k) == 0, k
    info = ai_info(con, "imagenet_script")
    assert (info["calls"], info["errors"], info["device"]) == (4, 1, b"CPU:1"), info
    assert ai_info(con, "imagenet_model1")["calls"] == 1 and ai_info(con, "imagenet_model2")["calls"] == 1


def test_dag_ensemble_alias(con):
    x1, x2 = pipeline_setup(con)
    header = ["LOAD", 1, "image2", "PERSIST", 2, "output", "temp_key1"]
    check_error(con, "PERSIST key cannot be found in DAG", *dag(["LOAD", 1, "image2", "PERSIST", 1, "nothere"],
                                                                head(x1)))
    check_error(con, "INPUT key cannot be found in DAG", *dag(header, head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "ensemble", "INPUTS", 2, "temp_key1_foo", "temp_key2",
         "OUTPUTS", 1, "temp_key1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output"]]))
    # the ensemble gets one tensor only and indexes tensors[1]: libtorch's error in that op's entry, NA after it,
    # nothing persisted
    before = ai_info(con, "imagenet_script")
    ret = con.execute_command(*dag(header, head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "ensemble", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "temp_key1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output"]]))
    assert len(ret) == 6 and ret[:4] == [b"OK"] * 4 and ret[5] == b"NA", ret
    assert isinstance(ret[4], redis.exceptions.ResponseError), ret
    assert "list index out of range" in str(ret[4]) and "\n" not in str(ret[4]), str(ret[4])
    assert con.exists("output") == 0 and con.exists("temp_key1") == 0
    after = ai_info(con, "imagenet_script")
    assert (after["calls"] - before["calls"], after["errors"] - before["errors"]) == (2, 1), (before, after)
    # the ensemble writes back into temp_key1 (a new tensor under the same name); post_process reads that one
    ret = con.execute_command(*dag(header, head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "ensemble", "INPUTS", 2, "temp_key1", "temp_key2",
         "OUTPUTS", 1, "temp_key1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output"]]))
    assert ret == [b"OK"] * 6, ret
    y1 = weights.linear(x1 / np.float32(10))
    y2 = weights.linear(x2 / np.float32(10))
    ens = (y1 + y2) / np.float32(2)
    np.testing.assert_allclose(get_tensor(con, "temp_key1"), ens, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(get_tensor(con, "output"), post(ens), rtol=1e-5, atol=1e-5)
    assert not np.allclose(ens, y1)  # the alias is observable: the branches differ


def test_dag_script_ops(con, port):
    script_store(con, "s", MAIN_SRC, MAIN_FNS)
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    # inside a DAG the KEYS/INPUTS-first rule does not apply; KEYS/ARGS reach the function
    ret = con.execute_command(*dag(["ROUTING", "s"], [
        ["AI.SCRIPTEXECUTE", "s", "make", "OUTPUTS", 1, "z"],
        ["AI.SCRIPTEXECUTE", "s", "scale", "INPUTS", 1, "z", "ARGS", 1, "4", "OUTPUTS", 1, "z4"],
        ["AI.SCRIPTEXECUTE", "s", "counts", "KEYS", 2, "k1", "k2", "INPUTS", 1, "z", "ARGS", 3, "x", "y", "w",
         "OUTPUTS", 1, "n"],
        ["AI.TENSORGET", "z4", "VALUES"],
        ["AI.TENSORGET", "n", "VALUES"]]))
    assert ret[:3] == [b"OK"] * 3, ret
    assert [float(v) for v in ret[3]] == [4.0] * 6 and ret[4] == [1, 2, 3], ret
    # tuples / lists flattened inside a DAG; PERSIST of script outputs
    ret = con.execute_command(*dag(["LOAD", 1, "a", "PERSIST", 2, "p", "q"], [
        ["AI.SCRIPTEXECUTE", "s", "pair", "INPUTS", 1, "a", "OUTPUTS", 2, "p", "q"],
        ["AI.SCRIPTEXECUTE", "s", "swap", "INPUTS", 2, "p", "q", "OUTPUTS", 2, "q", "p"]]))
    assert ret == [b"OK", b"OK"], ret
    np.testing.assert_array_equal(get_tensor(con, "p"), a + 1)
    np.testing.assert_array_equal(get_tensor(con, "q"), a * 2)
    # errors of script ops
    check_error_raw(port, "ERR AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG",
                    *dag(["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "a",
                                             "OUTPUTS", 1, "c"]], "AI.DAGEXECUTE_RO"))
    check_error_raw(port, "Deprecated AI.SCRIPTRUN cannot be used in AI.DAGEXECUTE command",
                    *dag(["LOAD", 1, "a"], [["AI.SCRIPTRUN", "s", "bar", "INPUTS", "a", "a", "OUTPUTS", "c"]]))
    check_error_raw(port, "AI.SCRIPTEXECUTE cannot be used in a deprecated AI.DAGRUN command",
                    *dag(["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "a",
                                             "OUTPUTS", 1, "c"]], "AI.DAGRUN"))
    check_error_raw(port, "ERR TIMEOUT not allowed within a DAG command",
                    *dag(["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "a",
                                             "OUTPUTS", 1, "c", "TIMEOUT", 100]]))
    check_error_raw(port, "ERR script key is empty",
                    *dag(["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "nos", "bar", "INPUTS", 2, "a", "a",
                                             "OUTPUTS", 1, "c"]]))
    check_error(con, "INPUT key cannot be found in DAG",
                *dag(["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "undefined",
                                         "OUTPUTS", 1, "c"]]))
    # a runtime error in the middle: the error entry, NA for what follows, nothing persisted
    ret = con.execute_command(*dag(["LOAD", 1, "a", "PERSIST", 1, "c"], [
        ["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 1, "a", "OUTPUTS", 1, "b"],
        ["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "b", "b", "OUTPUTS", 1, "c"],
        ["AI.TENSORGET", "c", "VALUES"]]))
    assert isinstance(ret[0], redis.exceptions.ResponseError) and "list index out of range" in str(ret[0]), ret
    assert ret[1:] == [b"NA", b"NA"], ret
    assert con.exists("c") == 0


def test_dagrun_scriptrun(con, port):
    x1, x2 = pipeline_setup(con)
    script_set(con, "old_script", OLD_SRC, device="CPU:1")
    # the ensemble pipeline with the deprecated commands; SCRIPTRUN's `$` inside a DAG
    ret = con.execute_command(*dag(["LOAD", 1, "image2", "PERSIST", 1, "output"], [
        ["AI.TENSORSET", "image1", "FLOAT", 3, 4, "BLOB", x1.tobytes()],
        ["AI.SCRIPTRUN", "old_script", "pre", "INPUTS", "image1", "OUTPUTS", "pre1"],
        ["AI.SCRIPTRUN", "old_script", "pre", "INPUTS", "image2", "OUTPUTS", "pre2"],
        ["AI.MODELRUN", "imagenet_model1", "INPUTS", "pre1", "OUTPUTS", "temp_key1"],
        ["AI.MODELRUN", "imagenet_model2", "INPUTS", "pre2", "OUTPUTS", "temp_key2"],
        ["AI.SCRIPTRUN", "old_script", "ens", "INPUTS", "temp_key1", "$", "temp_key2", "OUTPUTS", "temp_key1"],
        ["AI.SCRIPTRUN", "old_script", "post", "INPUTS", "temp_key1", "OUTPUTS", "output"],
        ["AI.TENSORGET", "output", "META"]], "AI.DAGRUN"))
    assert ret[:7] == [b"OK"] * 7 and ret[7] == [b"dtype", b"FLOAT", b"shape", [3, 4 - 1]], ret
    ens = (weights.linear(x1 / np.float32(10)) + weights.linear(x2 / np.float32(10))) / np.float32(2)
    np.testing.assert_allclose(get_tensor(con, "output"), post(ens), rtol=1e-5, atol=1e-5)
    # DAGRUN_RO allows SCRIPTRUN
    ret = con.execute_command(*dag(["LOAD", 1, "image2"], [
        ["AI.SCRIPTRUN", "old_script", "bar_variadic", "INPUTS", "image2", "$", "image2", "image2",
         "OUTPUTS", "t"],
        ["AI.TENSORGET", "t", "BLOB"]], "AI.DAGRUN_RO"))
    assert ret[0] == b"OK", ret
    np.testing.assert_array_equal(np.frombuffer(ret[1], dtype=np.float32).reshape(3, 4), x2 * np.float32(3))
    assert con.exists("t") == 0


# =================================================================================================
# persistence, replication, RESTORE


SCRIPTS = {  # key: (command, source, entry points, device, tag)
    "s:main": ("AI.SCRIPTSTORE", MAIN_SRC, MAIN_FNS, "CPU:1", "main tag"),
    "s:bar": ("AI.SCRIPTSTORE", BAR_SRC, ["bar"], "CPU", None),
    "s:old": ("AI.SCRIPTSET", OLD_SRC, [], "cpu", "old"),
    "s:old2": ("AI.SCRIPTSET", OLD_SRC, [], "CPU", None),
}


def populate_scripts(con):
    for key, (cmd, src, eps, dev, tag) in SCRIPTS.items():
        if cmd == "AI.SCRIPTSTORE":
            script_store(con, key, src, eps, device=dev, tag=tag)
        else:
            script_set(con, key, src, device=dev, tag=tag)
    return {k: con.execute_command("AI.SCRIPTGET", k) for k in SCRIPTS}


def check_scripts(con, before):
    for k, (cmd, src, eps, dev, tag) in SCRIPTS.items():
        assert con.type(k) == b"AI_SCRIPT", k
        assert con.execute_command("AI.SCRIPTGET", k) == before[k], k
        assert before[k] == scriptget_full(dev.encode(), (tag or "").encode(), eps, src)
        info = ai_info(con, k)
        assert (info["type"], info["backend"], info["device"], info["tag"], info["calls"], info["samples"]) == (
            b"SCRIPT", b"TORCH", dev.encode(), (tag or "").encode(), 0, -1), info
    a = np.array([[1.0, -2.0]], dtype=np.float32)
    set_tensor(con, "in", a)
    assert script_execute(con, "s:main", "scale", inputs=["in"], args=["3"], outputs=["o1"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "o1"), a * 3)
    assert script_execute(con, "s:bar", "bar", inputs=["in", "in"], outputs=["o2"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "o2"), a + a)
    for k in ("s:old", "s:old2"):
        assert con.execute_command("AI.SCRIPTRUN", k, "bar_variadic", "INPUTS", "in", "$", "in", "in",
                                   "OUTPUTS", "o3") == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "o3"), a * 3)
    assert sorted(con.execute_command("AI._SCRIPTSCAN")) == sorted(
        [[k.encode(), (v[4] or "").encode()] for k, v in SCRIPTS.items()])


def test_debug_reload(server):
    con = server.client()
    before = populate_scripts(con)
    check_scripts(con, before)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_scripts(con, before)  # stats are not persisted: calls back to 0
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_scripts(con, before)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite(server):
    con = server.client()
    before = populate_scripts(con)
    bgrewriteaof(server, con)
    cmds = {c[1].decode(): c for c in aof_commands(server, "base")
            if c[0].upper() in (b"AI.SCRIPTSTORE", b"AI.SCRIPTSET")}
    assert set(cmds) == set(SCRIPTS)
    for key, (cmd, src, eps, dev, tag) in SCRIPTS.items():
        t = (tag or "").encode()
        if eps:
            want = [b"AI.SCRIPTSTORE", key.encode(), dev.encode(), b"TAG", t, b"ENTRY_POINTS",
                    str(len(eps)).encode(), *[e.encode() for e in eps], b"SOURCE", src.encode()]
        else:  # the deliberate fix: SCRIPTSET scripts are rewritten as AI.SCRIPTSET
            want = [b"AI.SCRIPTSET", key.encode(), dev.encode(), b"TAG", t, b"SOURCE", src.encode()]
        got = cmds[key]
        assert [got[0].upper(), *got[1:]] == want, got
    # what follows the rewrite: SCRIPTSTORE / SCRIPTDEL verbatim, SCRIPTEXECUTE as the TENSORSET of its output
    set_tensor(con, "a", np.array([2.0, 5.0], dtype=np.float32))
    script_store(con, "s:tmp", BAR_SRC, ["bar"])
    assert con.execute_command("AI.SCRIPTDEL", "s:tmp") == b"OK"
    assert script_execute(con, "s:bar", "bar", inputs=["a", "a"], outputs=["out"]) == b"OK"
    incr = [c for c in aof_commands(server, "incr") if c[0].upper() not in (b"SELECT", b"MULTI", b"EXEC")]
    names = [c[0].upper() for c in incr]
    assert b"AI.SCRIPTEXECUTE" not in names, names
    assert [b"AI.SCRIPTDEL", b"s:tmp"] in [[c[0].upper(), *c[1:]] for c in incr]
    assert any(c[0].upper() == b"AI.SCRIPTSTORE" and c[1] == b"s:tmp" for c in incr)
    outs = [c for c in incr if c[0].upper() == b"AI.TENSORSET" and c[1] == b"out"]
    assert outs and outs[-1][2:] == [b"FLOAT", b"2", b"BLOB", np.array([4.0, 10.0], dtype=np.float32).tobytes()]
    server.restart()
    con = server.client()
    assert con.exists("s:tmp") == 0
    assert values(con, "out") == [4.0, 10.0]
    check_scripts(con, before)


def test_replication(make_server, make_replica):
    master = make_server(name="master")
    mcon = master.client()
    script_store(mcon, "early", MAIN_SRC, MAIN_FNS, tag="full sync")  # reaches the replica through the RDB
    replica = make_replica(master)
    rcon = replica.client()
    assert rcon.execute_command("AI.SCRIPTGET", "early") == mcon.execute_command("AI.SCRIPTGET", "early")
    # stored after the link is up: SCRIPTSTORE / SCRIPTSET replicated verbatim, compiled by the replica
    script_store(mcon, "s", BAR_SRC, ["bar"], tag="v1", device="CPU:1")
    script_set(mcon, "old", OLD_SRC, tag="o")
    wait_replicas(mcon)
    for k in ("s", "old"):
        assert rcon.execute_command("AI.SCRIPTGET", k) == mcon.execute_command("AI.SCRIPTGET", k)
        assert ai_info(rcon, k)["calls"] == 0
    # executions: the outputs reach the replica as tensors; the scripts are not run there
    a = f32(2, 3, seed=5)
    set_tensor(mcon, "a", a)
    assert script_execute(mcon, "s", "bar", inputs=["a", "a"], outputs=["c"]) == b"OK"
    assert script_execute(mcon, "early", "pair", inputs=["a"], outputs=["p", "q"]) == b"OK"
    assert mcon.execute_command("AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "r") == b"OK"
    assert mcon.execute_command(*dag(["LOAD", 1, "a", "PERSIST", 1, "d"], [
        ["AI.SCRIPTEXECUTE", "early", "scale", "INPUTS", 1, "a", "ARGS", 1, "3", "OUTPUTS", 1, "d"]])) == [b"OK"]
    wait_replicas(mcon)
    for k in ("c", "p", "q", "r", "d"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB"), k
    np.testing.assert_array_equal(get_tensor(rcon, "d"), a * np.float32(3))
    for k in ("s", "old", "early"):
        assert ai_info(rcon, k)["calls"] == 0
    # the read-only replica can run a read-only DAG with SCRIPTRUN
    ret = rcon.execute_command(*dag(["LOAD", 1, "a"], [
        ["AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "t"], ["AI.TENSORGET", "t", "BLOB"]],
        "AI.DAGRUN_RO"))
    assert ret[0] == b"OK" and ret[1] == (a + a).tobytes(), ret
    # SCRIPTDEL is replicated
    assert mcon.execute_command("AI.SCRIPTDEL", "s") == b"OK"
    wait_replicas(mcon)
    assert rcon.exists("s") == 0
    assert sorted(rcon.execute_command("AI._SCRIPTSCAN")) == sorted(mcon.execute_command("AI._SCRIPTSCAN"))


def test_restore_recorded_script(con):
    case = need_case("s:1")
    recorded = bytes.fromhex(case["dump_hex"])
    assert con.restore("s:1", 0, recorded) == b"OK"
    assert con.type("s:1") == b"AI_SCRIPT"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    source = recorded_create(case)[-1]
    assert con.execute_command("AI.SCRIPTGET", "s:1", "SOURCE") == source.encode()
    a = f32(2, 2, seed=7)
    b = f32(2, 2, seed=8)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert script_execute(con, "s:1", "bar", inputs=["a", "b"], outputs=["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    assert script_execute(con, "s:1", "baz", inputs=["a"], outputs=["d"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "d"), a * 2)
    info = ai_info(con, "s:1")
    assert (info["type"], info["backend"], info["device"], info["tag"], info["calls"], info["samples"]) == (
        b"SCRIPT", b"TORCH", b"CPU", b"v1", 2, -1), info
    # our DUMP carries RedisAI's payload, after RESTORE and after storing the recorded command
    assert payload_body(con.dump("s:1")) == payload_body(recorded)
    assert con.execute_command(*recorded_create(case)) == b"OK"
    assert payload_body(con.dump("s:1")) == payload_body(recorded)
    assert con.restore("s:1:copy", 0, con.dump("s:1")) == b"OK"
    assert con.execute_command("AI.SCRIPTGET", "s:1:copy") == con.execute_command("AI.SCRIPTGET", "s:1")
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    assert script_execute(con, "s:1:copy", "baz", inputs=["b"], outputs=["e"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "e"), b * 2)


def test_not_in_transaction(con):
    script_store(con, "s", BAR_SRC, ["bar"])
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    pipe = con.pipeline(transaction=True)
    pipe.execute_command(*scriptexecute_args("s", "bar", inputs=["a", "a"], outputs=["c"]))
    res = pipe.execute(raise_on_error=False)
    assert isinstance(res[0], redis.exceptions.ResponseError), res
    assert str(res[0]) == "Cannot run RedisAI command within a transaction or a LUA script"
    assert con.exists("c") == 0


RESIZE_SRC = "".join([
    entry("grow", "x = torch.arange(4.0) + 1", "x.resize_([int(args[0])])", "return x"),
    entry("grow_as", "x = torch.arange(4.0) + 1", "x.resize_as_(torch.ones(int(args[0])))", "return x"),
    entry("grow_out", "o = torch.zeros(2) + 7", "torch.resize(torch.arange(4.0) + 1, [int(args[0])], out=o)",
          "return o"),
    entry("empty_out", "o = torch.ones(4)", "torch.empty([int(args[0])], out=o)", "return o"),
    entry("fill_empty", "x = torch.empty([int(args[0])])", "x.fill_(2.5)", "return x"),
])


@pytest.mark.parametrize("n", [8, 100000])
def test_resized_and_empty_tensors(con, n):
    """What an op leaves unwritten reads as zero (the backend zeroes new memory); what it keeps stays."""
    script_store(con, "s", RESIZE_SRC, ["grow", "grow_as", "grow_out", "empty_out", "fill_empty"])
    head = {"grow": [1, 2, 3, 4], "grow_as": [1, 2, 3, 4], "grow_out": [1, 2, 3, 4], "empty_out": [1, 1, 1, 1]}
    for fn, kept in head.items():
        assert script_execute(con, "s", fn, keys=["k"], args=[n], outputs=[fn]) == b"OK"
        want = np.zeros(n, dtype=np.float32)
        want[:4] = kept
        np.testing.assert_array_equal(get_tensor(con, fn), want, err_msg=fn)
    assert script_execute(con, "s", "fill_empty", keys=["k"], args=[n], outputs=["f"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "f"), np.full(n, 2.5, dtype=np.float32))
