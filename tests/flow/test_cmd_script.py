"""TorchScript scripts (type AI_SCRIPT): AI.SCRIPTSTORE / SCRIPTSET / SCRIPTGET / SCRIPTDEL / SCRIPTEXECUTE /
SCRIPTRUN / _SCRIPTSCAN (docs/commands.md, the sections of these commands): parsing and its errors, entry points,
devices, results, TIMEOUT, the deprecated forms, MEMORY USAGE and COMMAND GETKEYS. Script ops inside DAGs are in
test_cmd_dag.py, what a script may call (redis.execute, redisAI.model_execute) in test_cmd_script_extensions.py,
persistence in test_persistence_script.py.

Error texts are compared on the wire: entry-point checks, `Function does not exist: <fn>`,
`Function returned unexpected number of outputs - <fn>` and TorchScript's own messages come without `ERR`.

Two RedisAI 1.2.7 behaviours asserted here: SCRIPTEXECUTE without OUTPUTS runs and discards the function's result
(torch_c.cpp `torchHandlOutputs`: `if (nOutputs == 0) return;`), and SCRIPTEXECUTE on a script stored with
SCRIPTSET calls the function with its tensors as positional arguments (RedisAI's "best effort" call).

The runaway-loop script of RedisAI's TIMEOUT test (`long_func`, `for i in range(100000000)`) is bounded here by
its ARGS (`range(int(args[0]))`, sized to run about 1.5 s) so that the test ends.
"""

import socket
import time

import numpy as np
import pytest
import redis

from helpers.checks import WRONGTYPE, check_error_raw
from helpers.onnx_models import ai_info, get_tensor, set_tensor
from helpers.resp import RespError, RespReader, encode_command, raw_command
from helpers.torch_models import (BAR_SRC, MAIN_FNS, MAIN_SRC, OLD_SRC, entry, f32, pt_store, script_execute,
                                  script_set, script_store, scriptexecute_args, scriptget_full, values)

LONG_SRC = entry("long_func", "a = tensors[0]", "for i in range(int(args[0])):", "    a = a + 1", "return a")


def arity(cmd):
    return f"ERR wrong number of arguments for '{cmd}' command"


def error_text(fn, *args, **kwargs):
    try:
        r = fn(*args, **kwargs)
    except redis.exceptions.ResponseError as e:
        return str(e)
    pytest.fail(f"expected an error, got {r!r}", pytrace=False)


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


def test_arity_errors_name_the_registered_command(con):
    """redis-py sees the arity error as Redis words it for the registered (lower-case) name."""
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTSTORE", "k", "CPU")
    assert str(e.value) == "wrong number of arguments for 'ai.scriptstore' command"


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
    """For scripts stored with SCRIPTSET (no entry points) SCRIPTEXECUTE makes a "best effort" positional
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
# AI._SCRIPTSCAN, MEMORY USAGE, COMMAND GETKEYS


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
# tensors a script resizes or leaves unwritten


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


# =================================================================================================
# tensors in and out of a script, byte for byte (one copy each way: torch/src/lib.rs)


COPY_SRC = "".join([
    entry("same", "return tensors[0]"),
    entry("tail", "return tensors[0][1:]"),
    entry("turned", "return tensors[0].t()"),
])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("shape", [(1,), (300, 129)])
def test_tensors_cross_a_script_whole(con, dtype, shape):
    """Every byte of an input reaches the script and every byte of an output comes back, for each dtype: small
    and big tensors (above the allocator's small sizes), a view that starts inside its storage (empty for one
    row), and one whose layout the script transposed."""
    rng = np.random.default_rng(7)
    a = (rng.random(shape) * 100 - 50).astype(dtype)
    set_tensor(con, "a", a)
    script_store(con, "s", COPY_SRC, ["same", "tail", "turned"])
    for fn, want in (("same", a), ("tail", a[1:]), ("turned", a.T)):
        for _ in range(3):  # again: a block used before must come back with this run's bytes only
            assert script_execute(con, "s", fn, inputs=["a"], outputs=[fn]) == b"OK"
            got = get_tensor(con, fn)
            assert got.shape == want.shape and got.dtype == want.dtype, fn
            np.testing.assert_array_equal(got, want, err_msg=fn)


# =================================================================================================
# RedisAI's texts: KEYS without its keys, functions that return nothing


def test_keys_with_nothing_after_the_count(con):
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0]\n")
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "KEYS", 1)
    assert str(e.value) == "Missing arguments after KEYS keyword"
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "KEYS", 2, "k1")
    assert str(e.value) == ("Number of pre declared KEYS to be used in the command does not match the number of "
                            "given arguments")


SIDE_EFFECTS = '''
def set_only(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("SET", [keys[0], args[0]])

def count(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redis.execute("INCR", [keys[0]])
'''


def test_script_functions_that_return_nothing_run_without_outputs(con):
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 2, "set_only", "count", "SOURCE", SIDE_EFFECTS)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "set_only", "KEYS", 1, "k", "ARGS", 1, "v") == b"OK"
    assert con.get("k") == b"v"
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "count", "KEYS", 1, "n") == b"OK"
    assert con.get("n") == b"1"
    # Only when OUTPUTS are asked for is a tensor required (RedisAI's text).
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "set_only", "KEYS", 1, "k", "ARGS", 1, "w", "OUTPUTS", 1, "o")
    assert str(e.value) == "Function returned non-tensor valuesset_only"
    assert con.exists("o") == 0
