"""TorchScript scripts across persistence and replication (docs/commands.md, "Persistence and replication"): DEBUG
RELOAD, the AOF rewrite, replicas (the stored script and the outputs of its runs), and RESTORE of the `s:1` case
recorded from RedisAI 1.2.7 (tests/data/redisai-dumps.json).

Deliberate fix of an upstream bug asserted here: the AOF rewrite of a script stored with the deprecated
AI.SCRIPTSET is `AI.SCRIPTSET <key> <device> TAG <tag> SOURCE <src>` (RedisAI wrote an AI.SCRIPTSTORE without
ENTRY_POINTS, which cannot be replayed)."""

import numpy as np
import pytest

from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import wait_for, wait_replicas
from helpers.dag import dag_cmd
from helpers.onnx_models import ai_info, get_tensor, set_tensor
from helpers.recorded import need_case, payload_body, recorded_create, recorded_reply
from helpers.torch_models import (BAR_SRC, MAIN_FNS, MAIN_SRC, OLD_SRC, f32, script_execute, script_set, script_store,
                                  scriptget_full, store_ext_script, values)

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


# =================================================================================================
# RDB, AOF, replicas


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
    assert mcon.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "a", "PERSIST", 1, "d"], [
        ["AI.SCRIPTEXECUTE", "early", "scale", "INPUTS", 1, "a", "ARGS", 1, "3", "OUTPUTS", 1, "d"]])) == [b"OK"]
    wait_replicas(mcon)
    for k in ("c", "p", "q", "r", "d"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB"), k
    np.testing.assert_array_equal(get_tensor(rcon, "d"), a * np.float32(3))
    for k in ("s", "old", "early"):
        assert ai_info(rcon, k)["calls"] == 0
    # the read-only replica can run a read-only DAG with SCRIPTRUN
    ret = rcon.execute_command(*dag_cmd("AI.DAGRUN_RO", ["LOAD", 1, "a"], [
        ["AI.SCRIPTRUN", "old", "bar", "INPUTS", "a", "a", "OUTPUTS", "t"], ["AI.TENSORGET", "t", "BLOB"]]))
    assert ret[0] == b"OK" and ret[1] == (a + a).tobytes(), ret
    # SCRIPTDEL is replicated
    assert mcon.execute_command("AI.SCRIPTDEL", "s") == b"OK"
    wait_replicas(mcon)
    assert rcon.exists("s") == 0
    assert sorted(rcon.execute_command("AI._SCRIPTSCAN")) == sorted(mcon.execute_command("AI._SCRIPTSCAN"))


# =================================================================================================
# RESTORE of the script recorded from RedisAI 1.2.7


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


# =================================================================================================
# replication of what a script writes with redis.execute


def test_redis_execute_is_replicated(server, make_replica):
    con = server.client()
    replica = make_replica(server)
    store_ext_script(con)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "int_set_get", "KEYS", 1, "r", "ARGS", 1, "9",
                               "OUTPUTS", 1, "o") == b"OK"
    assert con.execute_command("WAIT", 1, 10000) == 1
    rc = replica.client()
    wait_for(lambda: rc.get("r") == b"9", 10, what="the SET from redis.execute on the replica")
    assert rc.execute_command("AI.TENSORGET", "o", "VALUES") == [9]
