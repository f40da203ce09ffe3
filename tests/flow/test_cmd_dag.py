"""AI.DAGEXECUTE / AI.DAGEXECUTE_RO / AI.DAGRUN / AI.DAGRUN_RO (docs/commands.md, "AI.DAGEXECUTE"), whatever ops
the DAG holds: parse errors, LOAD / PERSIST and names local to the DAG, model ops and script ops, the multi-device
pipelines of RedisAI's DAG tests (pre-processing, two models on two devices, ensemble, post-processing; rebuilt with
the tiny models of tests/data on the devices `CPU` and `CPU:1`), TIMEOUT, read-only DAGs on a replica and the keys
the commands declare. Replication of PERSISTed outputs is in test_persistence_tensor.py, DAGs in MULTI / Lua in
test_exec_transactions.py, two devices at once in test_exec_concurrency.py, AI.INFO counts in test_observability.py.

Deliberate deviation from RedisAI 1.2.7 asserted here: a negative DAG TIMEOUT is refused with
`ERR Invalid value for TIMEOUT` (RedisAI compared a pointer with 0 and let it through as "no timeout").
"""

import os
import time

import numpy as np
import pytest
import redis

from helpers.checks import check_error, check_error_raw, wait_for
from helpers.dag import X24, dag_cmd, from_meta_blob, heavy_batch, is_error, keys_of, tensorset_args, tget, tset
from helpers.data import DATA_DIR, weights
from helpers.onnx_models import get_tensor, set_tensor
from helpers.resp import RawClient, RespError
from helpers.torch_models import MAIN_FNS, MAIN_SRC, OLD_SRC, entry, f32, pt_store, script_set, script_store


ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")
# Model tests need ONNX Runtime: the module finds it through REDISAI_ONNX_LIB or the path compiled in by
# `make build`; when it is missing they fail (never skip).

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
E_EMPTY_TENSOR = "tensor key is empty or in a different shard"
E_INPUT_NOT_FOUND = "INPUT key cannot be found in DAG"
E_PERSIST_NOT_FOUND = "PERSIST key cannot be found in DAG"
E_MUST_CONTAIN = ("AI.DAGEXECUTE and AI.DAGEXECUTE_RO commands must contain at least one out of ROUTING, LOAD, "
                  "PERSIST keywords")
E_EMPTY = "DAG is empty"
E_UNSUPPORTED = "Unsupported command within DAG"
E_TIMEOUT_IN_OP = "TIMEOUT not allowed within a DAG command"
E_TIMEOUT_VALUE = "Invalid value for TIMEOUT"
E_NOT_IN_TXN = "Cannot run RedisAI command within a transaction or a LUA script"
E_ARITY_GET = "wrong number of arguments for 'AI.TENSORGET' command"
E_ARITY_SET = "wrong number of arguments for 'AI.TENSORSET' command"
# ONNX Runtime's messages for the failures this file provokes (ORT 1.31): a prefix is enough.
ORT_BAD_TYPE = "Unexpected input data type"
ORT_BAD_RANK = "Invalid rank for input"


def unexpected(arg):
    return f"Invalid DAG command. Unexpected argument:  {arg}"


# --------------------------------------------------------------------------------------------------
# helpers


_BLOBS = {}


def blob(name):
    if name not in _BLOBS:
        _BLOBS[name] = (DATA_DIR / f"{name}.onnx").read_bytes()
    return _BLOBS[name]


def store(con, key, name, device="CPU"):
    assert con.execute_command("AI.MODELSTORE", key, "ONNX", device, "BLOB", blob(name)) == b"OK"


def mexec(model, inputs, outputs):
    return ["AI.MODELEXECUTE", model, "INPUTS", len(inputs), *inputs, "OUTPUTS", len(outputs), *outputs]


def ai_info(con, key):
    reply = con.execute_command("AI.INFO", key)
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


# --------------------------------------------------------------------------------------------------
# parse errors (no backend needed)


@pytest.mark.parametrize("cmd, msg", [
    (["AI.DAGEXECUTE"], "missing arguments for 'AI.DAGEXECUTE' command"),
    (["AI.DAGEXECUTE", "LOAD", "1", "a", "|>"], "missing arguments for 'AI.DAGEXECUTE' command"),
    (["AI.DAGEXECUTE_RO"], "missing arguments for 'AI.DAGEXECUTE_RO' command"),
    (["AI.DAGEXECUTE_RO", "ROUTING", "x", "|>", "AI.TENSORGET"], "missing arguments for 'AI.DAGEXECUTE_RO' command"),
    (["AI.DAGRUN"], "wrong number of arguments for 'AI.DAGRUN' command"),
    (["AI.DAGRUN", "|>", "AI.TENSORGET"], "wrong number of arguments for 'AI.DAGRUN' command"),
    (["AI.DAGRUN_RO"], "wrong number of arguments for 'AI.DAGRUN_RO' command"),
    (["AI.DAGRUN_RO", "|>", "AI.TENSORGET"], "wrong number of arguments for 'AI.DAGRUN_RO' command"),
])
def test_dag_arity(con, cmd, msg):
    check_error(con, msg, *cmd)


def test_dag_load_errors(con):
    check_error(con, "missing arguments after LOAD keyword in DAG command",
                "AI.DAGEXECUTE", "PERSIST", 2, "no1", "no2", "LOAD", 1)
    for bad in ("notnumber", "0", "-1"):
        check_error(con, "invalid or negative value found in number of keys to LOAD",
                    "AI.DAGEXECUTE", "LOAD", bad, "|>", "AI.TENSORGET", "x", "VALUES")
    tset(con, "a", X24)
    check_error(con, "number of keys to LOAD into DAG does not match the number of given arguments",
                "AI.DAGEXECUTE", "ROUTING", "a", "LOAD", 2, "a")
    check_error(con, E_EMPTY_TENSOR, "AI.DAGEXECUTE", "ROUTING", "no_tensor", "LOAD", 1, "no_tensor")
    check_error(con, E_EMPTY_TENSOR, "AI.DAGEXECUTE", "LOAD", 2, "a", "no_tensor", "|>", "AI.TENSORGET", "a")
    con.set("str", "value")
    check_error(con, WRONGTYPE, "AI.DAGEXECUTE", "ROUTING", "str", "LOAD", 1, "str")
    check_error(con, WRONGTYPE, "AI.DAGEXECUTE_RO", "LOAD", 1, "str", "|>", "AI.TENSORGET", "str")
    check_error(con, WRONGTYPE, "AI.DAGRUN", "LOAD", 1, "str", "|>", "AI.TENSORGET", "str")
    check_error(con, E_EMPTY_TENSOR, "AI.DAGRUN_RO", "LOAD", 1, "nope", "|>", "AI.TENSORGET", "nope")
    # LOAD at most once
    check_error(con, unexpected("LOAD"), "AI.DAGEXECUTE", "LOAD", 1, "a", "LOAD", 1, "a", "|>", "AI.TENSORGET", "a")


def test_dag_persist_errors(con):
    tset(con, "a", X24)
    check_error(con, "missing arguments after PERSIST keyword in DAG command",
                "AI.DAGEXECUTE", "ROUTING", "a", "LOAD", 1, "a", "PERSIST", 1)
    for bad in ("not_number", "0", "-2"):
        check_error(con, "invalid or negative value found in number of keys to PERSIST",
                    "AI.DAGEXECUTE", "ROUTING", "a", "PERSIST", bad, "a")
    check_error(con, "number of keys to PERSIST after DAG execution does not match the number of given arguments",
                "AI.DAGEXECUTE", "ROUTING", "a", "PERSIST", 2, "a")
    check_error(con, "PERSIST keys must be unique",
                "AI.DAGEXECUTE", "PERSIST", 2, "b", "b", "|>", "AI.TENSORSET", "b", "FLOAT", 1)
    check_error(con, unexpected("PERSIST"),
                "AI.DAGEXECUTE", "PERSIST", 1, "b", "PERSIST", 1, "c", "|>", "AI.TENSORSET", "b", "FLOAT", 1)
    for ro in ("AI.DAGEXECUTE_RO", "AI.DAGRUN_RO"):
        check_error(con, "PERSIST cannot be specified in a read-only DAG",
                    ro, "PERSIST", 1, "t1", "|>", "AI.TENSORSET", "t1", "FLOAT", 1, 2, "VALUES", 5, 10)
    check_error(con, E_PERSIST_NOT_FOUND,
                "AI.DAGEXECUTE", "PERSIST", 1, "zz", "|>", "AI.TENSORSET", "b", "FLOAT", 1)
    check_error(con, E_PERSIST_NOT_FOUND,
                "AI.DAGRUN", "PERSIST", 2, "b", "zz", "|>", "AI.TENSORSET", "b", "FLOAT", 1)
    assert keys_of(con) == ["a"]


def test_dag_timeout_and_routing_errors(con):
    check_error(con, "No value provided for TIMEOUT", "AI.DAGEXECUTE", "ROUTING", "a", "PERSIST", 1, "a", "TIMEOUT")
    for bad in ("not_number", "0", "-1", "-1000", "1.5"):
        check_error(con, E_TIMEOUT_VALUE, "AI.DAGEXECUTE", "ROUTING", "a", "PERSIST", 1, "a", "TIMEOUT", bad)
        check_error(con, E_TIMEOUT_VALUE,
                    "AI.DAGRUN", "TIMEOUT", bad, "|>", "AI.TENSORSET", "a", "FLOAT", 1, "VALUES", 1)
    check_error(con, E_TIMEOUT_VALUE,
                "AI.DAGEXECUTE_RO", "ROUTING", "a", "TIMEOUT", "-5", "|>", "AI.TENSORSET", "a", "FLOAT", 1)
    check_error(con, unexpected("TIMEOUT"),
                "AI.DAGEXECUTE", "ROUTING", "a", "TIMEOUT", 5, "TIMEOUT", 5, "|>", "AI.TENSORSET", "a", "FLOAT", 1)
    check_error(con, "Missing ROUTING value", "AI.DAGEXECUTE", "PERSIST", 3, "a", "b", "c", "ROUTING")
    check_error(con, unexpected("ROUTING"),
                "AI.DAGEXECUTE", "ROUTING", "a", "ROUTING", "b", "|>", "AI.TENSORSET", "a", "FLOAT", 1)


def test_dag_header_errors_and_order(con):
    tset(con, "v", X24)
    check_error(con, unexpected("BAD_ARG"), "AI.DAGEXECUTE", "ROUTING", "a", "PERSIST", 1, "a", "BAD_ARG")
    check_error(con, unexpected("BAD_ARG"),
                "AI.DAGEXECUTE", "BAD_ARG", "LOAD", 1, "v", "|>", "AI.TENSORGET", "v")
    # an unexpected argument is reported before the missing LOAD/PERSIST/ROUTING
    check_error(con, unexpected("foo"), "AI.DAGEXECUTE", "TIMEOUT", 5, "foo", "|>", "AI.TENSORGET", "v")
    check_error(con, E_MUST_CONTAIN, "AI.DAGEXECUTE", "|>", "AI.TENSORSET", "a", "FLOAT", 1, 2, "VALUES", 5, 10)
    check_error(con, E_MUST_CONTAIN, "AI.DAGEXECUTE_RO", "|>", "AI.TENSORSET", "a", "FLOAT", 1, 2, "VALUES", 5, 10)
    # ... and before the (op) INPUT lookup
    check_error(con, E_MUST_CONTAIN, "AI.DAGEXECUTE", "TIMEOUT", 100, "|>", "AI.TENSORGET", "nothing")
    check_error(con, E_EMPTY, "AI.DAGEXECUTE", "ROUTING", "v", "LOAD", 1, "v")
    check_error(con, E_EMPTY, "AI.DAGEXECUTE_RO", "ROUTING", "v", "TIMEOUT", 5, "LOAD", 1, "v")
    check_error(con, E_EMPTY, "AI.DAGRUN", "LOAD", 1, "v")
    check_error(con, E_EMPTY, "AI.DAGRUN_RO", "TIMEOUT", 10, "LOAD", 1, "v")
    # a trailing lone |>
    check_error(con, unexpected("|>"), "AI.DAGEXECUTE", "LOAD", 1, "v", "|>", "AI.TENSORGET", "v", "|>")
    check_error(con, unexpected("|>"), "AI.DAGEXECUTE", "ROUTING", "v", "TIMEOUT", 5, "|>")
    check_error(con, unexpected("|>"), "AI.DAGRUN", "LOAD", 1, "v", "|>")
    # the deprecated DAGRUN does not need LOAD/PERSIST/ROUTING (and a lower-case command name works too)
    assert con.execute_command("AI.DAGRUN", "|>", "AI.TENSORSET", "a", "FLOAT", 1, "VALUES", 1) == [b"OK"]
    assert con.execute_command("ai.dagrun_ro", "|>", "ai.tensorset", "a", "FLOAT", 1, "VALUES", 1,
                               "|>", "ai.tensorget", "a", "values") == [b"OK", [b"1"]]
    # header clauses in any order
    reply = con.execute_command("AI.DAGEXECUTE", "TIMEOUT", 5000, "PERSIST", 1, "out", "ROUTING", "v", "LOAD", 1, "v",
                                "|>", "AI.TENSORGET", "v", "META", "|>", "AI.TENSORSET", "out", "INT32", 1,
                                "VALUES", 7)
    assert reply == [[b"dtype", b"FLOAT", b"shape", [2, 4]], b"OK"]
    assert con.execute_command("AI.TENSORGET", "out", "VALUES") == [7]


def test_dag_op_errors(con):
    tset(con, "v", X24)
    base = ["AI.DAGEXECUTE", "LOAD", 1, "v"]
    check_error(con, E_UNSUPPORTED, *base, "|>", "AI.NOCOMMAND", "a", "FLOAT", 1, 2, "VALUES", 5, 10)
    check_error(con, E_UNSUPPORTED, *base, "|>", "SET", "a", "b")
    check_error(con, E_UNSUPPORTED, *base, "|>", "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", "x")
    check_error(con, E_UNSUPPORTED, *base, "|>", "AI.TENSORGET", "v", "|>", "AI.DAGEXECUTE", "LOAD", 1, "v")
    check_error(con, E_UNSUPPORTED, "AI.DAGRUN", "|>", "AI.TENSORGET", "v", "|>", "TENSORGET", "v")
    check_error(con, "Deprecated AI.MODELRUN cannot be used in AI.DAGEXECUTE command",
                *base, "|>", "AI.MODELRUN", "m", "INPUTS", "v", "v", "OUTPUTS", "o")
    check_error(con, "Deprecated AI.SCRIPTRUN cannot be used in AI.DAGEXECUTE command",
                *base, "|>", "AI.SCRIPTRUN", "s", "bar", "INPUTS", "v", "v", "OUTPUTS", "o")
    check_error(con, "Deprecated AI.MODELRUN cannot be used in AI.DAGEXECUTE command",
                "AI.DAGEXECUTE_RO", "LOAD", 1, "v", "|>", "AI.MODELRUN", "m", "INPUTS", "v", "v", "OUTPUTS", "o")
    check_error(con, "AI.MODELEXECUTE cannot be used in a deprecated AI.DAGRUN command",
                "AI.DAGRUN", "LOAD", 1, "v", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 1, "v", "OUTPUTS", 1, "o")
    check_error(con, "AI.SCRIPTEXECUTE cannot be used in a deprecated AI.DAGRUN command",
                "AI.DAGRUN_RO", "LOAD", 1, "v", "|>", "AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 1, "v")
    check_error(con, "AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG",
                "AI.DAGEXECUTE_RO", "LOAD", 1, "v", "|>", "AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "v", "v")
    # scripts are not implemented: a script op on a missing key
    check_error(con, "script key is empty",
                *base, "|>", "AI.SCRIPTEXECUTE", "nos", "bar", "INPUTS", 1, "v", "OUTPUTS", 1, "o")
    check_error(con, "script key is empty",
                "AI.DAGRUN_RO", "LOAD", 1, "v", "|>", "AI.SCRIPTRUN", "nos", "bar", "INPUTS", "v", "OUTPUTS", "o")
    # sub-op arity and parse errors (the module's own texts, without ERR)
    check_error(con, E_ARITY_GET, "AI.DAGEXECUTE", "ROUTING", "a", "|>", "AI.TENSORSET", "a", "FLOAT", 1,
                "|>", "AI.TENSORGET")
    check_error(con, E_ARITY_GET, "AI.DAGEXECUTE", "ROUTING", "a", "|>", "AI.TENSORSET", "a", "FLOAT", 1,
                "|>", "AI.TENSORGET", "a", "META", "BLOB", "extra")
    check_error(con, E_ARITY_SET, "AI.DAGEXECUTE", "ROUTING", "a", "|>", "AI.TENSORSET", "a", "FLOAT", 1,
                "|>", "AI.TENSORSET")
    check_error(con, E_ARITY_SET, "AI.DAGEXECUTE", "ROUTING", "a", "|>", "AI.TENSORSET", "a", "FLOAT")
    check_error(con, "invalid data type", *base, "|>", "AI.TENSORSET", "a", "FLOAT7", 1)
    check_error(con, "invalid or negative value found in tensor shape", *base, "|>", "AI.TENSORSET", "a", "FLOAT", 0)
    check_error(con, "wrong number of values was given in 'AI.TENSORSET' command",
                *base, "|>", "AI.TENSORSET", "a", "FLOAT", 2, "VALUES", 1)
    check_error(con, "unsupported data format", *base, "|>", "AI.TENSORGET", "v", "FOO")
    check_error(con, "both BLOB and VALUES specified", *base, "|>", "AI.TENSORGET", "v", "BLOB", "VALUES")
    # every op is parsed before names are resolved: a later parse error wins over an earlier unknown INPUT
    check_error(con, E_UNSUPPORTED, *base, "|>", "AI.TENSORGET", "unknown", "|>", "AI.BOGUS")
    check_error(con, E_INPUT_NOT_FOUND, *base, "|>", "AI.TENSORGET", "unknown", "VALUES")
    check_error(con, E_INPUT_NOT_FOUND, "AI.DAGRUN_RO", "|>", "AI.TENSORGET", "unknown", "VALUES")
    # a name is only visible to the ops after the one that sets it
    check_error(con, E_INPUT_NOT_FOUND, *base, "|>", "AI.TENSORGET", "later", "|>", "AI.TENSORSET", "later", "FLOAT",
                1)
    # INPUT before PERSIST
    check_error(con, E_INPUT_NOT_FOUND, "AI.DAGEXECUTE", "PERSIST", 1, "zz", "|>", "AI.TENSORGET", "unknown")
    assert keys_of(con) == ["v"]


def test_dag_model_op_errors(con):
    tset(con, "v", X24)
    store(con, "m", "mul")
    store(con, "lin", "linear", "CPU:1")
    base = ["AI.DAGEXECUTE", "LOAD", 1, "v"]
    check_error(con, "model key is empty", *base, "|>", *mexec("nomodel", ["v"], ["o"]))
    con.set("str", "x")
    check_error(con, WRONGTYPE, *base, "|>", *mexec("str", ["v"], ["o"]))
    check_error(con, WRONGTYPE, *base, "|>", *mexec("v", ["v"], ["o"]))
    check_error(con, "model key is empty", "AI.DAGRUN", "LOAD", 1, "v",
                "|>", "AI.MODELRUN", "nomodel", "INPUTS", "v", "OUTPUTS", "o")
    check_error(con, "wrong number of arguments for 'AI.MODELEXECUTE' command",
                *base, "|>", "AI.MODELEXECUTE", "m", "INPUTS", 1, "v")
    check_error(con, "Number of keys given as INPUTS here does not match model definition",
                *base, "|>", *mexec("m", ["v"], ["o"]))
    check_error(con, "Number of keys given as OUTPUTS here does not match model definition",
                *base, "|>", *mexec("m", ["v", "v"], ["o", "p"]))
    check_error(con, "Number of keys given as INPUTS here does not match model definition",
                "AI.DAGRUN", "LOAD", 1, "v", "|>", "AI.MODELRUN", "m", "INPUTS", "v", "OUTPUTS", "o")
    check_error(con, "INPUTS not specified", *base, "|>", "AI.MODELEXECUTE", "m", "OUTPUTS", 1, "o", "INPUTS", 2,
                "v", "v")
    # TIMEOUT is only allowed for the whole DAG
    check_error(con, E_TIMEOUT_IN_OP, *base, "|>", *mexec("m", ["v", "v"], ["o"]), "TIMEOUT", 100)
    check_error(con, E_TIMEOUT_IN_OP, "AI.DAGEXECUTE", "LOAD", 1, "v", "TIMEOUT", 100,
                "|>", *mexec("lin", ["v"], ["o"]), "TIMEOUT", 5)
    check_error(con, E_TIMEOUT_IN_OP, "AI.DAGRUN", "LOAD", 1, "v",
                "|>", "AI.MODELRUN", "lin", "TIMEOUT", 100, "INPUTS", "v", "OUTPUTS", "o")
    check_error(con, E_INPUT_NOT_FOUND, *base, "|>", *mexec("m", ["v", "w"], ["o"]))
    check_error(con, E_INPUT_NOT_FOUND, *base, "|>", *mexec("lin", ["v"], ["o"]),
                "|>", *mexec("lin", ["o_typo"], ["p"]))
    check_error(con, E_PERSIST_NOT_FOUND, "AI.DAGEXECUTE", "LOAD", 1, "v", "PERSIST", 1, "p",
                "|>", *mexec("lin", ["v"], ["o"]))
    # nothing ran: no stats, no keys
    assert ai_info(con, "lin")["calls"] == 0
    assert ai_info(con, "m")["calls"] == 0
    assert keys_of(con) == ["lin", "m", "str", "v"]


# --------------------------------------------------------------------------------------------------
# LOAD / PERSIST / names


def test_dag_load_tensorget(con):
    tset(con, "p1", np.array([[5, 10]], dtype=np.float32))
    assert con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "p1", "|>", "AI.TENSORGET", "p1", "VALUES") == [
        [b"5", b"10"]]
    assert con.execute_command("AI.DAGEXECUTE_RO", "LOAD", 1, "p1", "|>", "AI.TENSORGET", "p1", "VALUES") == [
        [b"5", b"10"]]
    assert con.execute_command("AI.DAGRUN_RO", "LOAD", 1, "p1", "|>", "AI.TENSORGET", "p1", "META", "VALUES") == [
        [b"dtype", b"FLOAT", b"shape", [1, 2], b"values", [b"5", b"10"]]]


def test_dag_local_tensorset_is_not_in_keyspace(con):
    for cmd in ("AI.DAGEXECUTE", "AI.DAGEXECUTE_RO"):
        ret = con.execute_command(cmd, "ROUTING", "{1}", "|>", "AI.TENSORSET", "volatile1", "FLOAT", 1, 2, "VALUES", 5,
                                  10, "|>", "AI.TENSORSET", "volatile2", "FLOAT", 1, 2, "VALUES", 5, 10)
        assert ret == [b"OK", b"OK"]
        assert keys_of(con) == []


def test_dag_persist_only_the_persist_keys(con):
    ret = con.execute_command("AI.DAGEXECUTE", "PERSIST", 1, "t3", "|>", "AI.TENSORSET", "t1", "FLOAT", 1, 2, "VALUES",
                              5, 10, "|>", "AI.TENSORSET", "t2", "FLOAT", 1, 2, "VALUES", 5, 10, "|>", "AI.TENSORSET",
                              "t3", "FLOAT", 1, 2, "VALUES", 5, 10, "|>", "AI.TENSORSET", "t4", "FLOAT", 1, 2,
                              "VALUES", 5, 10)
    assert ret == [b"OK"] * 4
    assert keys_of(con) == ["t3"]
    assert con.execute_command("AI.TENSORGET", "t3", "META", "VALUES") == [b"dtype", b"FLOAT", b"shape", [1, 2],
                                                                          b"values", [b"5", b"10"]]


def test_dag_same_name_set_twice(con):
    """A TENSORGET between two TENSORSETs of one name sees the first; PERSIST the last."""
    ret = con.execute_command("AI.DAGEXECUTE", "PERSIST", 1, "t1", "|>",
                              "AI.TENSORSET", "t1", "FLOAT", 1, 2, "VALUES", 5, 10, "|>",
                              "AI.TENSORGET", "t1", "META", "VALUES", "|>",
                              "AI.TENSORSET", "t1", "FLOAT", 1, 4, "VALUES", 20, 40, 60, 80, "|>",
                              "AI.TENSORGET", "t1", "META", "VALUES")
    assert ret == [b"OK", [b"dtype", b"FLOAT", b"shape", [1, 2], b"values", [b"5", b"10"]], b"OK",
                   [b"dtype", b"FLOAT", b"shape", [1, 4], b"values", [b"20", b"40", b"60", b"80"]]]
    assert con.execute_command("AI.TENSORGET", "t1", "META", "VALUES") == [
        b"dtype", b"FLOAT", b"shape", [1, 4], b"values", [b"20", b"40", b"60", b"80"]]


def test_dag_load_then_set_same_name(con):
    """A TENSORSET of a LOADed name shadows it inside the DAG only; the key keeps its value."""
    tset(con, "k", np.array([1, 2], dtype=np.float32))
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "k", "|>", "AI.TENSORGET", "k", "VALUES",
                              "|>", "AI.TENSORSET", "k", "INT32", 3, "VALUES", 7, 8, 9, "|>", "AI.TENSORGET", "k",
                              "VALUES")
    assert ret == [[b"1", b"2"], b"OK", [7, 8, 9]]
    assert tget(con, "k").tolist() == [1, 2]
    # with PERSIST the last value is written
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "k", "PERSIST", 1, "k", "|>", "AI.TENSORSET", "k", "INT32",
                              3, "VALUES", 7, 8, 9)
    assert ret == [b"OK"]
    assert tget(con, "k").dtype == np.int32 and tget(con, "k").tolist() == [7, 8, 9]
    # PERSIST of a LOADed name that no op touched writes the same value back
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "k", "PERSIST", 1, "copy", "|>", "AI.TENSORSET", "copy",
                              "FLOAT", 1, "|>", "AI.TENSORGET", "k", "VALUES")
    assert ret == [b"OK", [7, 8, 9]]
    assert tget(con, "copy").tolist() == [0.0]


def test_dag_load_persist_tensorset_tensorget(con):
    tset(con, "p1", np.array([[5, 10]], dtype=np.float32))
    tset(con, "p2", np.zeros((1, 3), dtype=np.float32))
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 2, "p1", "p2", "PERSIST", 1, "vp", "|>",
                              "AI.TENSORSET", "vp", "FLOAT", 1, 2, "VALUES", 5, 10, "|>",
                              "AI.TENSORGET", "p1", "META", "VALUES", "|>",
                              "AI.TENSORGET", "p2", "META", "VALUES")
    assert ret == [b"OK", [b"dtype", b"FLOAT", b"shape", [1, 2], b"values", [b"5", b"10"]],
                   [b"dtype", b"FLOAT", b"shape", [1, 3], b"values", [b"0", b"0", b"0"]]]
    assert con.execute_command("AI.TENSORGET", "vp", "META", "VALUES") == [
        b"dtype", b"FLOAT", b"shape", [1, 2], b"values", [b"5", b"10"]]


def test_dag_tensorget_formats(con):
    a = np.array([[1.5, -2], [3, 4]], dtype=np.float32)
    ret = con.execute_command("AI.DAGEXECUTE", "ROUTING", "x", "|>", *tensorset_args("a", a),
                              "|>", "AI.TENSORGET", "a",
                              "|>", "AI.TENSORGET", "a", "META",
                              "|>", "AI.TENSORGET", "a", "BLOB",
                              "|>", "AI.TENSORGET", "a", "VALUES",
                              "|>", "AI.TENSORGET", "a", "META", "VALUES",
                              "|>", "AI.TENSORGET", "a", "BLOB", "META")
    meta = [b"dtype", b"FLOAT", b"shape", [2, 2]]
    assert ret == [b"OK", meta + [b"blob", a.tobytes()], meta, a.tobytes(), [b"1.5", b"-2", b"3", b"4"],
                   meta + [b"values", [b"1.5", b"-2", b"3", b"4"]], meta + [b"blob", a.tobytes()]]


def test_dag_persist_wrongtype(con):
    """PERSIST into a key of another type: the ops' entries and one trailing WRONGTYPE error."""
    con.set("s", "string")
    ret = con.execute_command("AI.DAGEXECUTE", "PERSIST", 1, "s", "|>", "AI.TENSORSET", "s", "FLOAT", 1)
    assert len(ret) == 2 and ret[0] == b"OK"
    assert is_error(ret[1]) and str(ret[1]) == WRONGTYPE
    assert con.get("s") == b"string"


def test_dag_simple_string_replies(server):
    """OK and NA are simple strings, an op error an error entry (checked on the wire)."""
    store(server.client(), "lin", "linear")
    ret = server.raw("AI.DAGEXECUTE", "ROUTING", "x", "|>", "AI.TENSORSET", "a", "FLOAT", 1, "VALUES", 2,
                     "|>", "AI.TENSORGET", "a", "VALUES")
    assert ret == ["OK", [b"2"]] and isinstance(ret[0], str)
    ret = server.raw("AI.DAGEXECUTE", "ROUTING", "x", "|>", "AI.TENSORSET", "a", "INT32", 2, 4,
                     "|>", *mexec("lin", ["a"], ["y"]), "|>", "AI.TENSORGET", "y", "VALUES")
    assert len(ret) == 3 and ret[0] == "OK" and ret[2] == "NA" and isinstance(ret[2], str)
    assert isinstance(ret[1], RespError) and ORT_BAD_TYPE in ret[1], ret


# --------------------------------------------------------------------------------------------------
# model ops


def test_dag_modelexecute_values(con):
    store(con, "lin", "linear")
    store(con, "two", "two_outputs", "CPU:1")
    store(con, "mul", "mul", "cpu:1")
    tset(con, "x", X24)
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x", "PERSIST", 2, "y", "p"], [
        mexec("lin", ["x"], ["y"]),
        mexec("two", ["y"], ["p", "t"]),
        mexec("mul", ["p", "t"], ["m"]),
        ["AI.TENSORGET", "m", "META", "BLOB"],
        ["AI.TENSORGET", "t", "META", "BLOB"],
    ]))
    y = weights.linear(X24)
    assert ret[:3] == [b"OK"] * 3
    np.testing.assert_allclose(from_meta_blob(ret[3]), (y + 1) * (2 * y), rtol=1e-5)
    np.testing.assert_allclose(from_meta_blob(ret[4]), 2 * y, rtol=1e-5)
    np.testing.assert_allclose(tget(con, "y"), y, rtol=1e-5)
    np.testing.assert_allclose(tget(con, "p"), y + 1, rtol=1e-5)
    assert keys_of(con) == ["lin", "mul", "p", "two", "x", "y"]


def test_dag_op_output_named_like_loaded_key(con):
    """An op writing a name that was LOADed gets a new value inside the DAG; the key is untouched without
    PERSIST, and replaced with PERSIST."""
    store(con, "lin", "linear")
    store(con, "two", "two_outputs", "CPU:1")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tset(con, "a", x)
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a"], [
        ["AI.TENSORGET", "a", "META", "BLOB"],
        mexec("two", ["a"], ["a", "b"]),
        ["AI.TENSORGET", "a", "META", "BLOB"],
        mexec("lin", ["a"], ["a"]),
        ["AI.TENSORGET", "a", "META", "BLOB"],
        ["AI.TENSORGET", "b", "META", "BLOB"],
    ]))
    assert ret[1] == b"OK" and ret[3] == b"OK"
    np.testing.assert_array_equal(from_meta_blob(ret[0]), x)
    np.testing.assert_array_equal(from_meta_blob(ret[2]), x + 1)
    np.testing.assert_allclose(from_meta_blob(ret[4]), weights.linear(x + 1), rtol=1e-5)
    np.testing.assert_array_equal(from_meta_blob(ret[5]), 2 * x)
    np.testing.assert_array_equal(tget(con, "a"), x)
    assert keys_of(con) == ["a", "lin", "two"]
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a", "PERSIST", 1, "a"], [
        mexec("two", ["a"], ["a", "b"]), mexec("two", ["a"], ["c", "a"])]))
    assert ret == [b"OK", b"OK"]
    np.testing.assert_array_equal(tget(con, "a"), 2 * (x + 1))
    assert keys_of(con) == ["a", "lin", "two"]


def test_dag_tensorget_of_computed_value_survives_later_failure(con):
    store(con, "lin", "linear")
    store(con, "mul", "mul")
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["PERSIST", 1, "y"], [
        tensorset_args("x", X24),
        mexec("lin", ["x"], ["y"]),
        ["AI.TENSORSET", "i", "INT32", 2, 3],
        mexec("mul", ["y", "i"], ["z"]),
        ["AI.TENSORGET", "y", "META", "BLOB"],
        ["AI.TENSORGET", "z", "VALUES"],
    ]))
    assert ret[:3] == [b"OK"] * 3
    assert is_error(ret[3]) and ORT_BAD_TYPE in str(ret[3]), ret[3]
    np.testing.assert_allclose(from_meta_blob(ret[4]), weights.linear(X24), rtol=1e-5)
    assert ret[5] == b"NA"
    assert len(ret) == 6
    assert keys_of(con) == ["lin", "mul"]  # nothing persisted after a failure


def test_dagrun_with_modelrun(con):
    store(con, "lin", "linear", "CPU:1")
    store(con, "two", "two_outputs")
    tset(con, "x", X24)
    y = weights.linear(X24)
    ret = con.execute_command("AI.DAGRUN", "LOAD", 1, "x", "PERSIST", 1, "t", "|>",
                              "AI.MODELRUN", "lin", "INPUTS", "x", "OUTPUTS", "y", "|>",
                              "AI.MODELRUN", "two", "INPUTS", "y", "OUTPUTS", "p", "t", "|>",
                              "AI.TENSORGET", "p", "META", "BLOB")
    assert ret[:2] == [b"OK", b"OK"]
    np.testing.assert_allclose(from_meta_blob(ret[2]), y + 1, rtol=1e-5)
    np.testing.assert_allclose(tget(con, "t"), 2 * y, rtol=1e-5)
    ret = con.execute_command("AI.DAGRUN_RO", "LOAD", 1, "t", "TIMEOUT", 10000, "|>",
                              "AI.MODELRUN", "two", "INPUTS", "t", "OUTPUTS", "a", "b", "|>",
                              "AI.TENSORGET", "b", "META", "BLOB")
    assert ret[0] == b"OK"
    np.testing.assert_allclose(from_meta_blob(ret[1]), 4 * y, rtol=1e-5)
    # without any header clause
    ret = con.execute_command("AI.DAGRUN", "|>", *tensorset_args("x2", X24), "|>",
                              "AI.MODELRUN", "lin", "INPUTS", "x2", "OUTPUTS", "y2", "|>",
                              "AI.TENSORGET", "y2", "META", "BLOB")
    assert ret[:2] == [b"OK", b"OK"]
    np.testing.assert_allclose(from_meta_blob(ret[2]), y, rtol=1e-5)
    # a failing MODELRUN op
    ret = con.execute_command("AI.DAGRUN", "PERSIST", 1, "z", "|>", "AI.TENSORSET", "i", "INT32", 2, 4, "|>",
                              "AI.MODELRUN", "lin", "INPUTS", "i", "OUTPUTS", "z", "|>", "AI.TENSORGET", "z", "VALUES")
    assert ret[0] == b"OK" and is_error(ret[1]) and ORT_BAD_TYPE in str(ret[1]) and ret[2] == b"NA"
    assert keys_of(con) == ["lin", "t", "two", "x"]


# --------------------------------------------------------------------------------------------------
# multi-device pipelines (CPU and CPU:1)


def store_pipeline_models(con):
    store(con, "pre{1}", "linear", "CPU:1")  # pre-processing: x[2,4] -> h[2,3]
    store(con, "branch_a{1}", "two_outputs", "CPU")  # h -> (h+1, 2h)
    store(con, "branch_b{1}", "mul", "CPU:1")  # (h, h) -> h*h
    store(con, "ensemble{1}", "mul", "CPU")  # (a, b) -> a*b
    store(con, "post{1}", "two_outputs", "CPU:1")  # e -> (e+1, 2e)


def pipeline_ops(x, ensemble_inputs=("temp1{1}", "temp2")):
    return [
        tensorset_args("image", x),
        mexec("pre{1}", ["image"], ["h"]),
        mexec("branch_a{1}", ["h"], ["temp1{1}", "unused"]),
        mexec("branch_b{1}", ["h", "h"], ["temp2"]),
        # the ensemble writes back into one of the branch names (alias): later ops see the new value
        mexec("ensemble{1}", list(ensemble_inputs), ["temp1{1}"]),
        mexec("post{1}", ["temp1{1}"], ["out{1}", "out2"]),
    ]


def pipeline_expected(x):
    h = weights.linear(x)
    temp1 = h + 1
    e = temp1 * (h * h)
    return h, temp1, e, e + 1


def test_dag_multidevice_pipeline_ensemble_alias(con):
    store_pipeline_models(con)
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    h, temp1, e, out = pipeline_expected(x)
    for cmd in ("AI.DAGEXECUTE",):
        ret = con.execute_command(*dag_cmd(cmd, ["PERSIST", 2, "out{1}", "temp1{1}"], pipeline_ops(x)))
        assert ret == [b"OK"] * 6
        np.testing.assert_allclose(tget(con, "out{1}"), out, rtol=1e-5)
        np.testing.assert_allclose(tget(con, "temp1{1}"), e, rtol=1e-5)  # PERSIST takes the last value of a name
    assert sorted(k for k in keys_of(con) if "{1}" in k and not k.startswith(("pre", "branch", "ensemble", "post"))) \
        == ["out{1}", "temp1{1}"]
    # the same pipeline with TENSORGETs around the alias: before the ensemble temp1 is the branch output
    ops = pipeline_ops(x)
    ops.insert(4, ["AI.TENSORGET", "temp1{1}", "META", "BLOB"])
    ops.append(["AI.TENSORGET", "temp1{1}", "META", "BLOB"])
    ops.append(["AI.TENSORGET", "out{1}", "META", "BLOB"])
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE_RO", ["ROUTING", "{1}"], ops))
    assert ret[:4] == [b"OK"] * 4 and ret[5:7] == [b"OK"] * 2 and len(ret) == 9
    np.testing.assert_allclose(from_meta_blob(ret[4]), temp1, rtol=1e-5)
    np.testing.assert_allclose(from_meta_blob(ret[7]), e, rtol=1e-5)
    np.testing.assert_allclose(from_meta_blob(ret[8]), out, rtol=1e-5)
    # the stats of every model count its one or two runs, 2 samples each
    for key, calls in (("pre{1}", 2), ("branch_a{1}", 2), ("branch_b{1}", 2), ("ensemble{1}", 2), ("post{1}", 2)):
        info = ai_info(con, key)
        assert (info["calls"], info["samples"], info["errors"]) == (calls, 2 * calls, 0), (key, info)


@pytest.mark.parametrize("bad", [np.arange(6, dtype=np.int32).reshape(2, 3), np.ones(3, dtype=np.float32)],
                         ids=["int32", "rank1"])
def test_dag_multidevice_pipeline_ensemble_failure(con, bad):
    """The ensemble op gets a bad second input: [OK, OK, OK, OK, <error>, NA], nothing persisted. (The ensemble
    reads branch B's output and runs on CPU after branch A, so both branches have run when it fails.)"""
    store_pipeline_models(con)
    tset(con, "bad{1}", bad)
    tset(con, "temp1{1}", np.array([42], dtype=np.float32))  # must keep its value
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "bad{1}", "PERSIST", 2, "out{1}", "temp1{1}"],
                                       pipeline_ops(x, ensemble_inputs=("temp2", "bad{1}"))))
    assert len(ret) == 6, ret
    assert ret[:4] == [b"OK"] * 4, ret
    assert is_error(ret[4]), ret
    assert (ORT_BAD_TYPE if bad.dtype == np.int32 else ORT_BAD_RANK) in str(ret[4]), str(ret[4])
    assert ret[5] == b"NA"
    assert con.exists("out{1}") == 0
    assert tget(con, "temp1{1}").tolist() == [42]
    info = ai_info(con, "ensemble{1}")
    assert (info["calls"], info["errors"], info["samples"]) == (1, 1, 0), info
    info = ai_info(con, "post{1}")
    assert (info["calls"], info["errors"]) == (0, 0), info  # never ran
    info = ai_info(con, "branch_b{1}")
    assert (info["calls"], info["errors"], info["samples"]) == (1, 0, 2), info


def test_dag_multidevice_branch_failure(con):
    """One branch fails (CPU:1, rank-1 input to mul.onnx) while the other (CPU) may or may not have run yet:
    [OK, OK, OK|NA, <error>, NA, NA], nothing persisted."""
    store_pipeline_models(con)
    tset(con, "bad{1}", np.ones(3, dtype=np.float32))
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    ops = pipeline_ops(x)
    ops[3] = mexec("branch_b{1}", ["h", "bad{1}"], ["temp2"])
    for _ in range(5):
        ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "bad{1}", "PERSIST", 1, "out{1}"], ops))
        assert len(ret) == 6, ret
        assert ret[:2] == [b"OK"] * 2, ret
        assert ret[2] in (b"OK", b"NA"), ret
        assert is_error(ret[3]) and ORT_BAD_RANK in str(ret[3]), ret
        assert ret[4:] == [b"NA", b"NA"], ret
        assert con.exists("out{1}") == 0


# --------------------------------------------------------------------------------------------------
# TIMEOUT


def blocked_clients(srv):
    return int(srv.info("clients")["blocked_clients"])


def test_dag_timeout_while_queue_busy(server):
    con = server.client()
    store(con, "heavy", "heavy", "CPU")
    store(con, "lin", "linear", "CPU")
    store(con, "lin1", "linear", "CPU:1")
    store(con, "two", "two_outputs", "CPU")
    tset(con, "hx", heavy_batch(4096))
    tset(con, "x", X24)
    # how long one heavy run takes here, so that the queue surely stays busy for > 10x the TIMEOUT
    t0 = time.monotonic()
    assert con.execute_command(*mexec("heavy", ["hx"], ["hy"])) == b"OK"
    one_run = time.monotonic() - t0
    n_heavy = max(3, int(0.6 / max(one_run, 1e-3)) + 2)
    timeout_ms = 20
    others = []
    try:
        for _ in range(n_heavy):
            c = RawClient(server.port)
            c.send(*mexec("heavy", ["hx"], ["hy"]))
            others.append(c)
        wait_for(lambda: blocked_clients(server) >= n_heavy, what="the heavy runs to be queued")
        # TENSORSET/TENSORGET need no worker: such a DAG answers at once while the CPU queue is busy
        ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "x", "|>", "AI.TENSORSET", "s", "FLOAT", 1, "VALUES",
                                  3, "|>", "AI.TENSORGET", "s", "VALUES", "|>", "AI.TENSORGET", "x", "META")
        assert ret == [b"OK", [b"3"], [b"dtype", b"FLOAT", b"shape", [2, 4]]]
        assert blocked_clients(server) >= 1  # the heavy runs are still going on
        # single-device DAG behind them
        dag1 = RawClient(server.port)
        dag1.send(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x", "PERSIST", 1, "y1", "TIMEOUT", timeout_ms],
                           [mexec("lin", ["x"], ["y1"]), ["AI.TENSORGET", "y1", "VALUES"]]))
        # two-device DAG: its CPU:1 part could run at once, its CPU part waits behind the heavy runs
        dag2 = RawClient(server.port)
        dag2.send(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x", "PERSIST", 1, "y2", "TIMEOUT", timeout_ms],
                           [mexec("lin1", ["x"], ["a"]), mexec("two", ["a"], ["y2", "b"])]))
        # the deprecated command
        dag3 = RawClient(server.port)
        dag3.send("AI.DAGRUN", "LOAD", 1, "x", "TIMEOUT", timeout_ms, "|>", "AI.MODELRUN", "lin", "INPUTS", "x",
                  "OUTPUTS", "y3", "|>", "AI.TENSORGET", "y3", "VALUES")
        for d in (dag1, dag2, dag3):
            r = d.reply()
            assert r == "TIMEDOUT" and not isinstance(r, bytes), r  # a simple string, the whole reply
            d.close()
        for c in others:
            assert c.reply() == "OK"
    finally:
        for c in others:
            c.close()
    assert con.exists("y1", "y2") == 0
    assert ai_info(con, "lin")["calls"] == 0  # timed-out ops never ran
    # a TIMEOUT that is not reached changes nothing
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x", "PERSIST", 1, "y2", "TIMEOUT", 60000],
                                       [mexec("lin1", ["x"], ["a"]), mexec("two", ["a"], ["y2", "b"])]))
    assert ret == [b"OK", b"OK"]
    np.testing.assert_allclose(tget(con, "y2"), weights.linear(X24) + 1, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# read-only DAGs on a replica


def test_dag_ro_on_replica(make_server, make_replica):
    master = make_server()
    replica = make_replica(master)
    con, rcon = master.client(), replica.client()
    store(con, "lin", "linear", "CPU:1")
    store(con, "two", "two_outputs")
    tset(con, "x", X24)
    assert con.execute_command("WAIT", 1, 10000) == 1
    assert replica.info("replication")["role"] == "slave"
    y = weights.linear(X24)
    ret = rcon.execute_command(*dag_cmd("AI.DAGEXECUTE_RO", ["LOAD", 1, "x"], [
        mexec("lin", ["x"], ["y"]), mexec("two", ["y"], ["p", "t"]), ["AI.TENSORGET", "t", "META", "BLOB"]]))
    assert ret[:2] == [b"OK", b"OK"]
    np.testing.assert_allclose(from_meta_blob(ret[2]), 2 * y, rtol=1e-5)
    ret = rcon.execute_command("AI.DAGRUN_RO", "LOAD", 1, "x", "|>", "AI.MODELRUN", "lin", "INPUTS", "x", "OUTPUTS",
                               "y", "|>", "AI.TENSORGET", "y", "META", "BLOB")
    assert ret[0] == b"OK"
    np.testing.assert_allclose(from_meta_blob(ret[1]), y, rtol=1e-5)
    ret = rcon.execute_command("AI.DAGEXECUTE_RO", "ROUTING", "x", "|>", "AI.TENSORSET", "a", "FLOAT", 1, "|>",
                               "AI.TENSORGET", "a", "VALUES")
    assert ret == [b"OK", [b"0"]]
    # the writing variants are refused on a read-only replica
    for cmd in (["AI.DAGEXECUTE", "LOAD", 1, "x", "|>", "AI.TENSORGET", "x"],
                ["AI.DAGRUN", "LOAD", 1, "x", "|>", "AI.TENSORGET", "x"]):
        with pytest.raises(redis.exceptions.ReadOnlyError):
            rcon.execute_command(*cmd)
    assert keys_of(rcon) == ["lin", "two", "x"]


# --------------------------------------------------------------------------------------------------
# COMMAND GETKEYS


@pytest.mark.parametrize("cmd, keys", [
    (["AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "b", "ROUTING", "r", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 1,
      "a", "OUTPUTS", 1, "b"], [b"a", b"b", b"r", b"m"]),
    (["AI.DAGEXECUTE", "ROUTING", "{t}", "TIMEOUT", 5, "|>", "AI.TENSORSET", "local", "FLOAT", 1, "|>",
      "AI.MODELEXECUTE", "m1{t}", "INPUTS", 1, "local", "OUTPUTS", 1, "o", "|>", "AI.TENSORGET", "o", "|>",
      "AI.MODELEXECUTE", "m2{t}", "INPUTS", 1, "o", "OUTPUTS", 1, "p"], [b"{t}", b"m1{t}", b"m2{t}"]),
    (["AI.DAGEXECUTE_RO", "LOAD", 2, "a", "b", "|>", "AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 1, "a"],
     [b"a", b"b", b"s"]),
    (["AI.DAGRUN", "LOAD", 1, "a", "PERSIST", 1, "b", "|>", "AI.MODELRUN", "m", "INPUTS", "a", "OUTPUTS", "b"],
     [b"a", b"b"]),
    (["AI.DAGRUN_RO", "TIMEOUT", 5, "LOAD", 1, "a", "|>", "AI.TENSORGET", "a"], [b"a"]),
])
def test_dag_getkeys(shared_server, cmd, keys):
    assert shared_server.raw("COMMAND", "GETKEYS", *cmd) == keys


# --------------------------------------------------------------------------------------------------
# script ops in DAGs


# the pre/post-processing script of the multi-device pipelines
PIPE_FNS = ["pre_process", "post_process", "ensemble"]
PIPE_SRC = (
    entry("pre_process", "return [t / 10 for t in tensors]")
    + entry("post_process", "return tensors[0] * 2 - 1")
    + entry("ensemble", "return (tensors[0] + tensors[1]) / 2")
)


def pipeline_setup(con):
    """The pipeline parts: a pre/post-processing script on CPU:1, torch_linear on CPU, linear.onnx on CPU:1."""
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


def post(x):
    return x * np.float32(2) - np.float32(1)


def test_dag_multidevice_pipeline(con, port):
    x1, x2 = pipeline_setup(con)
    # ops may only read what was LOADed or produced before
    check_error(con, "INPUT key cannot be found in DAG", *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "image2"], [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "pre_process", "INPUTS", 2, "image1", "image2",
         "OUTPUTS", 2, "pre1", "pre2"]]))
    check_error(con, "Number of keys given as INPUTS here does not match model definition", *dag_cmd("AI.DAGEXECUTE", 
        ["LOAD", 1, "image2"], [["AI.MODELEXECUTE", "imagenet_model1", "INPUTS", 2, "image2", "image2",
                                 "OUTPUTS", 1, "y"]]))
    # a function that does not exist is that op's error entry; the ops after it are not run
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "image2"], [
        ["AI.TENSORSET", "image1", "FLOAT", 3, 4, "BLOB", x1.tobytes()],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "wrong_fn", "INPUTS", 2, "image1", "image2",
         "OUTPUTS", 2, "pre1", "pre2"],
        ["AI.TENSORGET", "pre1", "META"]]))
    assert ret[0] == b"OK" and ret[2] == b"NA", ret
    assert isinstance(ret[1], redis.exceptions.ResponseError) and str(ret[1]) == "Function does not exist: wrong_fn"
    # the full pipeline: TENSORSET -> pre_process (CPU:1) -> two models (CPU, CPU:1) -> two post_process
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "image2", "PERSIST", 2, "output1", "output2"],
                                       head(x1) + [
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
    check_error(con, "PERSIST key cannot be found in DAG",
                *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "image2", "PERSIST", 1, "nothere"], head(x1)))
    check_error(con, "INPUT key cannot be found in DAG", *dag_cmd("AI.DAGEXECUTE", header, head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "ensemble", "INPUTS", 2, "temp_key1_foo", "temp_key2",
         "OUTPUTS", 1, "temp_key1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output"]]))
    # the ensemble gets one tensor only and indexes tensors[1]: libtorch's error in that op's entry, NA after it,
    # nothing persisted
    before = ai_info(con, "imagenet_script")
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", header, head(x1) + [
        ["AI.SCRIPTEXECUTE", "imagenet_script", "ensemble", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "temp_key1"],
        ["AI.SCRIPTEXECUTE", "imagenet_script", "post_process", "INPUTS", 1, "temp_key1", "OUTPUTS", 1, "output"]]))
    assert len(ret) == 6 and ret[:4] == [b"OK"] * 4 and ret[5] == b"NA", ret
    assert isinstance(ret[4], redis.exceptions.ResponseError), ret
    assert "list index out of range" in str(ret[4]) and "\n" not in str(ret[4]), str(ret[4])
    assert con.exists("output") == 0 and con.exists("temp_key1") == 0
    after = ai_info(con, "imagenet_script")
    assert (after["calls"] - before["calls"], after["errors"] - before["errors"]) == (2, 1), (before, after)
    # the ensemble writes back into temp_key1 (a new tensor under the same name); post_process reads that one
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", header, head(x1) + [
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
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["ROUTING", "s"], [
        ["AI.SCRIPTEXECUTE", "s", "make", "OUTPUTS", 1, "z"],
        ["AI.SCRIPTEXECUTE", "s", "scale", "INPUTS", 1, "z", "ARGS", 1, "4", "OUTPUTS", 1, "z4"],
        ["AI.SCRIPTEXECUTE", "s", "counts", "KEYS", 2, "k1", "k2", "INPUTS", 1, "z", "ARGS", 3, "x", "y", "w",
         "OUTPUTS", 1, "n"],
        ["AI.TENSORGET", "z4", "VALUES"],
        ["AI.TENSORGET", "n", "VALUES"]]))
    assert ret[:3] == [b"OK"] * 3, ret
    assert [float(v) for v in ret[3]] == [4.0] * 6 and ret[4] == [1, 2, 3], ret
    # tuples / lists flattened inside a DAG; PERSIST of script outputs
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a", "PERSIST", 2, "p", "q"], [
        ["AI.SCRIPTEXECUTE", "s", "pair", "INPUTS", 1, "a", "OUTPUTS", 2, "p", "q"],
        ["AI.SCRIPTEXECUTE", "s", "swap", "INPUTS", 2, "p", "q", "OUTPUTS", 2, "q", "p"]]))
    assert ret == [b"OK", b"OK"], ret
    np.testing.assert_array_equal(get_tensor(con, "p"), a + 1)
    np.testing.assert_array_equal(get_tensor(con, "q"), a * 2)
    # errors of script ops
    check_error_raw(port, "ERR AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG",
                    *dag_cmd("AI.DAGEXECUTE_RO", ["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a",
                                                                     "a", "OUTPUTS", 1, "c"]]))
    check_error_raw(port, "Deprecated AI.SCRIPTRUN cannot be used in AI.DAGEXECUTE command",
                    *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a"], [["AI.SCRIPTRUN", "s", "bar", "INPUTS", "a", "a",
                                                                  "OUTPUTS", "c"]]))
    check_error_raw(port, "AI.SCRIPTEXECUTE cannot be used in a deprecated AI.DAGRUN command",
                    *dag_cmd("AI.DAGRUN", ["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "a",
                                                              "OUTPUTS", 1, "c"]]))
    check_error_raw(port, "ERR TIMEOUT not allowed within a DAG command",
                    *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a", "a",
                                                                  "OUTPUTS", 1, "c", "TIMEOUT", 100]]))
    check_error_raw(port, "ERR script key is empty",
                    *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "nos", "bar", "INPUTS", 2, "a",
                                                                  "a", "OUTPUTS", 1, "c"]]))
    check_error(con, "INPUT key cannot be found in DAG",
                *dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a"], [["AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "a",
                                                              "undefined", "OUTPUTS", 1, "c"]]))
    # a runtime error in the middle: the error entry, NA for what follows, nothing persisted
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a", "PERSIST", 1, "c"], [
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
    ret = con.execute_command(*dag_cmd("AI.DAGRUN", ["LOAD", 1, "image2", "PERSIST", 1, "output"], [
        ["AI.TENSORSET", "image1", "FLOAT", 3, 4, "BLOB", x1.tobytes()],
        ["AI.SCRIPTRUN", "old_script", "pre", "INPUTS", "image1", "OUTPUTS", "pre1"],
        ["AI.SCRIPTRUN", "old_script", "pre", "INPUTS", "image2", "OUTPUTS", "pre2"],
        ["AI.MODELRUN", "imagenet_model1", "INPUTS", "pre1", "OUTPUTS", "temp_key1"],
        ["AI.MODELRUN", "imagenet_model2", "INPUTS", "pre2", "OUTPUTS", "temp_key2"],
        ["AI.SCRIPTRUN", "old_script", "ens", "INPUTS", "temp_key1", "$", "temp_key2", "OUTPUTS", "temp_key1"],
        ["AI.SCRIPTRUN", "old_script", "post", "INPUTS", "temp_key1", "OUTPUTS", "output"],
        ["AI.TENSORGET", "output", "META"]]))
    assert ret[:7] == [b"OK"] * 7 and ret[7] == [b"dtype", b"FLOAT", b"shape", [3, 4 - 1]], ret
    ens = (weights.linear(x1 / np.float32(10)) + weights.linear(x2 / np.float32(10))) / np.float32(2)
    np.testing.assert_allclose(get_tensor(con, "output"), post(ens), rtol=1e-5, atol=1e-5)
    # DAGRUN_RO allows SCRIPTRUN
    ret = con.execute_command(*dag_cmd("AI.DAGRUN_RO", ["LOAD", 1, "image2"], [
        ["AI.SCRIPTRUN", "old_script", "bar_variadic", "INPUTS", "image2", "$", "image2", "image2",
         "OUTPUTS", "t"],
        ["AI.TENSORGET", "t", "BLOB"]]))
    assert ret[0] == b"OK", ret
    np.testing.assert_array_equal(np.frombuffer(ret[1], dtype=np.float32).reshape(3, 4), x2 * np.float32(3))
    assert con.exists("t") == 0
