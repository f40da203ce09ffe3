"""AI commands inside MULTI/EXEC and Lua scripts, where nothing may block: a model is stored (built inline) and read,
while every command that would run on a worker (AI.MODELEXECUTE / MODELRUN with ONNX and TORCH models,
AI.SCRIPTEXECUTE, the DAG commands) is refused with `Cannot run RedisAI command within a transaction or a LUA
script` (docs/commands.md, AI.MODELSTORE and AI.MODELEXECUTE), and writes nothing."""

import numpy as np
import pytest
import redis

from helpers.checks import NOT_IN_TXN, check_error_raw
from helpers.dag import X24, keys_of, tset
from helpers.onnx_models import ai_info, blob, model_execute, set_tensor
from helpers.resp import RawClient, RespError
from helpers.torch_models import BAR_SRC, pt_store, script_store, scriptexecute_args


# =================================================================================================
# models


def test_multi_exec(con, shared_server):
    set_tensor(con, "a", np.array([[2.0, 3.0]], dtype=np.float32))
    pipe = con.pipeline(transaction=True)
    pipe.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "TAG", "multi", "BLOB", blob("mul"))
    pipe.execute_command("AI.MODELGET", "m", "META")  # the model is there at once: built synchronously
    pipe.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    pipe.execute_command("AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c")
    pipe.execute_command("AI.TENSORGET", "a", "VALUES")
    res = pipe.execute(raise_on_error=False)
    assert res[0] == b"OK"
    assert res[1][:6] == [b"backend", b"ONNX", b"device", b"CPU", b"tag", b"multi"]
    for r in res[2:4]:
        assert isinstance(r, redis.exceptions.ResponseError) and str(r) == NOT_IN_TXN, r
    assert res[4] == [b"2", b"3"]
    assert con.exists("c") == 0
    # the exact error as sent inside the EXEC reply
    c = RawClient(shared_server.port)
    c.send("MULTI")
    c.send("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    c.send("EXEC")
    assert c.reply() == "OK" and c.reply() == "QUEUED"
    (err,) = c.reply()
    c.close()
    assert isinstance(err, RespError) and str(err) == "ERR " + NOT_IN_TXN
    # the model stored in MULTI runs normally afterwards
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4", b"9"]
    assert ai_info(con, "m")["calls"] == 1


def test_lua(con, shared_server):
    port = shared_server.port
    set_tensor(con, "a", np.array([[2.0, 3.0]], dtype=np.float32))
    script_store = ("redis.call('AI.MODELSTORE', KEYS[1], 'ONNX', 'CPU', 'TAG', 'lua', 'BLOB', ARGV[1]) "
                    "return redis.call('AI.MODELGET', KEYS[1], 'META')")
    reply = con.eval(script_store, 1, "m", blob("mul"))
    assert reply[:6] == [b"backend", b"ONNX", b"device", b"CPU", b"tag", b"lua"]
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob("mul")
    pcall = "return redis.pcall('AI.MODELEXECUTE', KEYS[1], 'INPUTS', '2', KEYS[2], KEYS[2], 'OUTPUTS', '1', KEYS[3])"
    check_error_raw(port, "ERR " + NOT_IN_TXN, "EVAL", pcall, 3, "m", "a", "c")
    pcall_run = "return redis.pcall('AI.MODELRUN', KEYS[1], 'INPUTS', KEYS[2], KEYS[2], 'OUTPUTS', KEYS[3])"
    check_error_raw(port, "ERR " + NOT_IN_TXN, "EVAL", pcall_run, 3, "m", "a", "c")
    call = "return redis.call('AI.MODELEXECUTE', KEYS[1], 'INPUTS', '2', KEYS[2], KEYS[2], 'OUTPUTS', '1', KEYS[3])"
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.eval(call, 3, "m", "a", "c")
    assert NOT_IN_TXN in str(e.value), str(e.value)
    assert con.exists("c") == 0
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4", b"9"]


def test_not_in_transaction_torch(con):
    pt_store(con, "m", "torch_add")
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    pipe = con.pipeline(transaction=True)
    pipe.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    res = pipe.execute(raise_on_error=False)
    assert isinstance(res[0], redis.exceptions.ResponseError), res
    assert str(res[0]) == "Cannot run RedisAI command within a transaction or a LUA script"
    assert con.exists("c") == 0


# =================================================================================================
# scripts and DAGs


def test_not_in_transaction_script(con):
    script_store(con, "s", BAR_SRC, ["bar"])
    set_tensor(con, "a", np.ones(2, dtype=np.float32))
    pipe = con.pipeline(transaction=True)
    pipe.execute_command(*scriptexecute_args("s", "bar", inputs=["a", "a"], outputs=["c"]))
    res = pipe.execute(raise_on_error=False)
    assert isinstance(res[0], redis.exceptions.ResponseError), res
    assert str(res[0]) == "Cannot run RedisAI command within a transaction or a LUA script"
    assert con.exists("c") == 0


def test_dag_in_multi_and_lua(server):
    con = server.client()
    tset(con, "x", X24)
    dags = [["AI.DAGEXECUTE", "LOAD", 1, "x", "|>", "AI.TENSORGET", "x", "VALUES"],
            ["AI.DAGEXECUTE_RO", "ROUTING", "x", "|>", "AI.TENSORSET", "a", "FLOAT", 1],
            ["AI.DAGRUN", "|>", "AI.TENSORSET", "a", "FLOAT", 1],
            ["AI.DAGRUN_RO", "LOAD", 1, "x", "|>", "AI.TENSORGET", "x", "VALUES"]]
    c = RawClient(server.port)
    try:
        for dag in dags:
            assert c.call("MULTI") == "OK"
            assert c.call(*dag) == "QUEUED"
            assert c.call("EXEC") == [RespError("ERR " + NOT_IN_TXN)]
        for dag in dags:
            script = "return redis.call(" + ",".join(f"'{a}'" for a in dag) + ")"
            r = c.call("EVAL", script, 0)
            assert isinstance(r, RespError) and NOT_IN_TXN in r, r
    finally:
        c.close()
    assert keys_of(con) == ["x"]
