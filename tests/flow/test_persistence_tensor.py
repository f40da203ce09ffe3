"""Tensors across persistence and replication (docs/commands.md, "Persistence and replication"): RDB (DEBUG RELOAD,
SAVE + restart, save on shutdown), AOF (the command stream and the module's AOF rewrite callback, which emits
`AI.TENSORSET <key> <type> <dims...> BLOB <data>`), replication (of AI.TENSORSET, of model outputs and of a DAG's
PERSISTed outputs), and RESTORE of the tensor DUMP payloads recorded from RedisAI, of older encodings and of corrupt
payloads. Every check is byte-exact."""

import json
import struct

import numpy as np
import pytest
import redis

from helpers.aof import parse_resp_commands
from helpers.checks import wait_for
from helpers.dag import X24, dag_cmd, is_error, keys_of, tget, tset
from helpers.data import weights
from helpers.onnx_models import mexec, store
from helpers.rdb import buf, crc64, dump_payload, u
from helpers.recorded import DUMPS_PATH, assert_reply, payload_body
from helpers.resp import RespError, encode_command, raw_command

ELEM_SIZE = {"FLOAT": 4, "DOUBLE": 8, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "UINT8": 1, "UINT16": 2,
             "BOOL": 1}


def _blob(dtype, n, rng):
    if dtype == "BOOL":
        return rng.integers(0, 2, n, dtype=np.uint8).tobytes()
    # any byte pattern is a valid numeric tensor (NaN payloads included): it must come back unchanged
    return rng.integers(0, 256, n * ELEM_SIZE[dtype], dtype=np.uint8).tobytes()


def tensor_commands():
    """key -> AI.TENSORSET arguments after the key; every dtype, scalars, zero-filled, STRING edge cases."""
    rng = np.random.default_rng(1234)
    cmds = {}
    for dt in ELEM_SIZE:
        cmds[f"{dt.lower()}:2x3"] = [dt, 2, 3, "BLOB", _blob(dt, 6, rng)]
        cmds[f"{dt.lower()}:1x1x7"] = [dt, 1, 1, 7, "BLOB", _blob(dt, 7, rng)]
        cmds[f"{dt.lower()}:scalar"] = [dt, "BLOB", _blob(dt, 1, rng)]
        cmds[f"{dt.lower()}:zeros"] = [dt, 4]
    cmds["int8:values"] = ["INT8", 4, "VALUES", -128, -1, 0, 127]
    cmds["double:values"] = ["DOUBLE", 3, "VALUES", "0.1", "-2.5e-300", "1e300"]
    cmds["bool:values"] = ["BOOL", 2, 2, "VALUES", 1, 0, 0, 1]
    cmds["string:values"] = ["STRING", 5, "VALUES", "alpha", "", "γειά", "日本語", "x" * 300]
    cmds["string:blob"] = ["STRING", 2, 2, "BLOB", b"uno\x00\x00tres\x00cuatro\x00"]
    cmds["string:scalar"] = ["STRING", "VALUES", "only"]
    cmds["string:zeros"] = ["STRING", 3]
    cmds["string:all-empty"] = ["STRING", 2, "BLOB", b"\x00\x00"]
    cmds["float:big"] = ["FLOAT", 512, 1024, "BLOB", rng.standard_normal(512 * 1024).astype(np.float32).tobytes()]
    cmds[b"bin\x00key\xff"] = ["UINT16", 3, "VALUES", 0, 1, 65535]
    return cmds


def populate(con, cmds=None):
    cmds = cmds or tensor_commands()
    for key, args in cmds.items():
        assert con.execute_command("AI.TENSORSET", key, *args) == b"OK"
    return snapshot(con, cmds)


def snapshot(con, keys):
    out = {}
    for key in keys:
        t = con.type(key)
        out[key] = (t, con.execute_command("AI.TENSORGET", key, "META", "BLOB") if t == b"AI_TENSOR" else None)
    return out


def assert_same(before, after):
    assert set(before) == set(after)
    for key in before:
        assert after[key] == before[key], f"tensor {key!r} changed"


# ---------------------------------------------------------------------------------------------
# RDB


def test_debug_reload(server):
    con = server.client()
    before = populate(con)
    assert all(v[0] == b"AI_TENSOR" for v in before.values())
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert_same(before, snapshot(con, before))
    assert con.dbsize() == len(before)
    # and a second time, from what our rdb_load produced
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert_same(before, snapshot(con, before))


def test_debug_reload_values_replies(server):
    con = server.client()
    populate(con)
    keys = [k for k in tensor_commands() if k != "float:big"]
    values = {k: con.execute_command("AI.TENSORGET", k, "META", "VALUES") for k in keys}
    con.execute_command("DEBUG", "RELOAD")
    assert {k: con.execute_command("AI.TENSORGET", k, "META", "VALUES") for k in keys} == values


def test_save_and_restart(server):
    con = server.client()
    before = populate(con)
    assert con.save()
    assert (server.dir / server.dbfilename).is_file()
    server.restart()
    con = server.client()
    assert_same(before, snapshot(con, before))
    assert con.dbsize() == len(before)


@pytest.mark.server_args("--save", "3600", "1")
def test_save_on_shutdown(server):
    con = server.client()
    before = populate(con)
    server.restart()  # SIGTERM with a save point configured: Redis saves the RDB on the way out
    assert_same(before, snapshot(server.client(), before))


def test_bgsave_and_restart(server):
    con = server.client()
    before = populate(con)
    con.bgsave()
    wait_for(lambda: server.info("persistence").get("rdb_bgsave_in_progress") == "0", 30, what="BGSAVE")
    assert server.info("persistence").get("rdb_last_bgsave_status") == "ok"
    server.restart()
    assert_same(before, snapshot(server.client(), before))


# ---------------------------------------------------------------------------------------------
# AOF


def _aof_files(srv):
    """The AOF files of `srv`, in load order: Redis >= 7 (and Valkey) keep them in a directory with a
    manifest; older servers have one appendonly.aof in the data directory."""
    for d in [srv.dir / "appendonlydir"] + sorted(p for p in srv.dir.iterdir() if p.is_dir()):
        manifests = list(d.glob("*.manifest")) if d.is_dir() else []
        if manifests:
            files = []
            for line in manifests[0].read_text().splitlines():
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "file" and fields[1].endswith(".aof"):
                    files.append(d / fields[1])
            return files
    single = srv.dir / "appendonly.aof"
    return [single] if single.exists() else []


def _wait_rewrite_done(srv):
    def done():
        info = srv.info("persistence")
        return info.get("aof_rewrite_in_progress") == "0" and info.get("aof_rewrite_scheduled") == "0"

    wait_for(done, 60, what="BGREWRITEAOF to finish")
    assert srv.info("persistence").get("aof_last_bgrewrite_status") == "ok"


def _expected_rewrite_argv(con, key):
    """What the rewrite emits for `key` (docs/commands.md): AI.TENSORSET key TYPE dims... BLOB data."""
    _, dtype, _, shape, _, blob = con.execute_command("AI.TENSORGET", key, "META", "BLOB")
    k = key if isinstance(key, bytes) else key.encode()
    return [b"AI.TENSORSET", k, dtype] + [str(d).encode() for d in shape] + [b"BLOB", blob]


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite(server):
    con = server.client()
    before = populate(con)
    # overwrite and delete some keys so that the command stream differs from the final state
    con.execute_command("AI.TENSORSET", "gone", "FLOAT", 2)
    con.delete("gone")
    con.execute_command("AI.TENSORSET", "int8:zeros", "INT8", 4)  # same value, set twice
    con.bgrewriteaof()
    _wait_rewrite_done(server)

    files = _aof_files(server)
    assert files, f"no AOF file found under {server.dir}"
    cmds = [c for f in files for c in parse_resp_commands(f.read_bytes())]
    tensorsets = [c for c in cmds if c[0].upper() == b"AI.TENSORSET"]
    by_key = {}
    for c in tensorsets:
        by_key.setdefault(c[1], []).append(c)
    for key in before:
        k = key if isinstance(key, bytes) else key.encode()
        assert k in by_key, f"no AI.TENSORSET for {key!r} in the rewritten AOF {files}"
        assert len(by_key[k]) == 1, f"{key!r} appears {len(by_key[k])} times after the rewrite"
        got = by_key[k][0]
        assert b"BLOB" in [a.upper() for a in got], f"rewritten command for {key!r} has no BLOB: {got[:6]}"
        got = [got[0].upper()] + got[1:]
        assert got == _expected_rewrite_argv(con, key)
    assert b"gone" not in by_key

    server.restart()
    con = server.client()
    assert_same(before, snapshot(con, before))
    assert con.dbsize() == len(before)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "yes")
def test_aof_rewrite_with_rdb_preamble(server):
    con = server.client()
    before = populate(con)
    con.bgrewriteaof()
    _wait_rewrite_done(server)
    server.restart()
    assert_same(before, snapshot(server.client(), before))


@pytest.mark.server_args("--appendonly", "yes")
def test_aof_command_stream(server):
    """Without a rewrite the AOF holds the TENSORSET commands as sent; replaying them gives the same tensors."""
    con = server.client()
    before = populate(con)
    con.execute_command("AI.TENSORSET", "float:2x3", "FLOAT", 1)  # overwritten below again
    con.execute_command("AI.TENSORSET", "float:2x3", *tensor_commands()["float:2x3"])
    server.restart()
    con = server.client()
    assert_same(before, snapshot(con, before))
    assert con.dbsize() == len(before)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_failed_commands_not_logged(server):
    con = server.client()
    con.execute_command("AI.TENSORSET", "t", "INT8", 2, "VALUES", 1, 2)
    for bad in (["FLOAT", 0], ["INT8", 2, "VALUES", 1], ["UINT32", 1], ["FLOAT", 2, "BLOB", b"abc"]):
        with pytest.raises(redis.exceptions.ResponseError):
            con.execute_command("AI.TENSORSET", "t", *bad)
    server.restart()
    con = server.client()
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == [
        b"dtype", b"INT8", b"shape", [2], b"values", [1, 2]]


# ---------------------------------------------------------------------------------------------
# replication


def test_replication(make_server, make_replica):
    master = make_server(name="master")
    mcon = master.client()
    cmds = tensor_commands()
    keys = list(cmds)
    early = {k: cmds[k] for k in keys[: len(keys) // 2]}
    late = {k: cmds[k] for k in keys[len(keys) // 2:]}

    # tensors that exist before the replica attaches arrive with the full sync (RDB)
    populate(mcon, early)
    replica = make_replica(master)
    rcon = replica.client()
    assert_same(snapshot(mcon, early), snapshot(rcon, early))

    # later ones arrive through the replication stream (TENSORSET replicated verbatim)
    populate(mcon, late)
    mcon.execute_command("AI.TENSORSET", "float:2x3", "FLOAT", 2, "VALUES", 1.5, -2.5)
    mcon.delete("int8:2x3")
    assert mcon.execute_command("WAIT", 1, 5000) == 1
    master_state = snapshot(mcon, keys)
    assert master_state[b"bin\x00key\xff"][0] == b"AI_TENSOR"
    assert_same(master_state, snapshot(rcon, keys))
    assert rcon.execute_command("AI.TENSORGET", "float:2x3", "VALUES") == [b"1.5", b"-2.5"]
    assert rcon.exists("int8:2x3") == 0
    assert rcon.dbsize() == mcon.dbsize()


def test_replica_is_read_only(make_server, make_replica):
    master = make_server(name="master")
    master.client().execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1, 2)
    replica = make_replica(master)
    reply = raw_command(replica.port, "AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 3, 4)
    assert isinstance(reply, RespError) and reply.startswith("READONLY"), reply
    with pytest.raises(redis.exceptions.ReadOnlyError):
        replica.client().execute_command("AI.TENSORSET", "x", "INT8", 1)
    # reads work on the replica and nothing changed
    rcon = replica.client()
    assert rcon.execute_command("AI.TENSORGET", "t", "VALUES") == [b"1", b"2"]
    assert rcon.exists("x") == 0


def test_replication_failed_commands_keep_replica_in_sync(make_server, make_replica):
    master = make_server(name="master")
    replica = make_replica(master)
    mcon, rcon = master.client(), replica.client()
    mcon.execute_command("AI.TENSORSET", "t", "INT32", 2, "VALUES", 1, 2)
    for bad in (["FLOAT", 0], ["INT8", 1, "VALUES", 1000], ["STRING", 1, "BLOB", b"x"]):
        with pytest.raises(redis.exceptions.ResponseError):
            mcon.execute_command("AI.TENSORSET", "t", *bad)
    mcon.execute_command("AI.TENSORSET", "u", "STRING", 2, "VALUES", "a", "")
    assert mcon.execute_command("WAIT", 1, 5000) == 1
    assert rcon.execute_command("AI.TENSORGET", "t", "VALUES") == [1, 2]
    assert rcon.execute_command("AI.TENSORGET", "u", "VALUES") == [b"a", b""]


def test_replica_after_master_restart_from_rdb(make_server, make_replica):
    """The replica resyncs (full sync through our rdb_save / rdb_load) after the master restarts."""
    master = make_server(name="master")
    mcon = master.client()
    before = populate(mcon)
    mcon.save()
    replica = make_replica(master)
    master.restart()
    mcon = master.client()
    assert_same(before, snapshot(mcon, before))
    mcon.execute_command("AI.TENSORSET", "after-restart", "DOUBLE", "VALUES", "2.5")
    assert mcon.execute_command("WAIT", 1, 15000) == 1
    replica.wait_link_up(30)
    rcon = replica.client()
    assert_same(before, snapshot(rcon, before))
    assert rcon.execute_command("AI.TENSORGET", "after-restart", "VALUES") == [b"2.5"]


def test_computed_outputs_replicate_byte_exact(make_server, make_replica):
    """MODELEXECUTE/SCRIPTEXECUTE outputs reach the replica as AI.TENSORSET … BLOB, whose type and dimension words
    the module shares between replications (dimensions from 1024 on are made per tensor): every dtype the
    script can return, dimensions on both sides of that limit, ranks 1 to 8, the same shapes twice."""
    from helpers.torch_models import entry, script_store
    master = make_server(name="master")
    replica = make_replica(master)
    mcon, rcon = master.client(), replica.client()
    script_store(mcon, "id", entry("f", "return tensors[0]"), ["f"])
    rng = np.random.default_rng(7)
    outputs = []
    for round_ in range(2):
        for dt in ("FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "BOOL"):
            # Ranks up to 6 are replicated with one word per argument, longer ones as a vector (emit.rs).
            for shape in ([2, 3], [1, 1023], [1024], [1, 1025, 2], [3000], [2, 1, 2, 3], [1, 2, 3, 1, 2],
                          [1, 2, 1, 2, 1, 2], [2, 1, 1, 1, 1, 1, 3],
                          [1, 1, 2, 1, 1, 1, 1, 2]):
                n = int(np.prod(shape))
                key_in, key_out = f"in:{dt}:{shape}", f"out:{round_}:{dt}:{shape}"
                mcon.execute_command("AI.TENSORSET", key_in, dt, *shape, "BLOB", _blob(dt, n, rng))
                assert mcon.execute_command("AI.SCRIPTEXECUTE", "id", "f", "INPUTS", 1, key_in,
                                            "OUTPUTS", 1, key_out) == b"OK"
                outputs.append(key_out)
    assert mcon.execute_command("WAIT", 1, 5000) == 1
    for key in outputs:
        want = mcon.execute_command("AI.TENSORGET", key, "META", "BLOB")
        assert rcon.execute_command("AI.TENSORGET", key, "META", "BLOB") == want, key


# ---------------------------------------------------------------------------------------------
# replication of a DAG's PERSISTed outputs


def test_dag_persist_replication(make_server, make_replica):
    master = make_server(server_args=["--appendonly", "yes", "--appendfsync", "always"])
    replica = make_replica(master)
    con, rcon = master.client(), replica.client()
    store(con, "lin", "linear", device="CPU:1")
    store(con, "two", "two_outputs")
    tset(con, "x", X24)
    assert con.execute_command("WAIT", 1, 10000) == 1
    rcon.execute_command("CONFIG", "RESETSTAT")
    y = weights.linear(X24)
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["LOAD", 1, "x", "PERSIST", 3, "y", "p", "set"], [
        mexec("lin", ["x"], ["y"]), mexec("two", ["y"], ["p", "t"]),
        ["AI.TENSORSET", "set", "INT32", 2, "VALUES", 1, 2], ["AI.TENSORSET", "local", "FLOAT", 1]]))
    assert ret == [b"OK"] * 4
    ret = con.execute_command("AI.DAGRUN", "LOAD", 1, "x", "PERSIST", 1, "yy", "|>",
                              "AI.MODELRUN", "lin", "INPUTS", "x", "OUTPUTS", "yy")
    assert ret == [b"OK"]
    assert con.execute_command("WAIT", 1, 10000) == 1
    np.testing.assert_allclose(tget(rcon, "y"), y, rtol=1e-5)
    np.testing.assert_allclose(tget(rcon, "yy"), y, rtol=1e-5)
    np.testing.assert_allclose(tget(rcon, "p"), y + 1, rtol=1e-5)
    assert tget(rcon, "set").tolist() == [1, 2] and tget(rcon, "set").dtype == np.int32
    assert keys_of(rcon) == ["lin", "p", "set", "two", "x", "y", "yy"]
    # the replica received AI.TENSORSET commands, never the DAG itself (nor the model runs)
    stats = replica.info("commandstats")
    assert "calls=4," in stats.get("cmdstat_ai.tensorset", ""), stats
    assert not any(k.startswith(("cmdstat_ai.dag", "cmdstat_ai.model")) for k in stats), stats
    # ... as `AI.TENSORSET <key> <TYPE> <dims> BLOB <data>` (the same stream goes to the AOF)
    aof = b"".join(p.read_bytes() for p in sorted((master.dir / "appendonlydir").glob("*.incr.aof")))
    assert b"AI.DAGEXECUTE" not in aof.upper() and b"AI.DAGRUN" not in aof.upper()
    expected = encode_command(["AI.TENSORSET", "p", "FLOAT", 2, 3, "BLOB", (y + 1).astype(np.float32).tobytes()])
    assert expected in aof
    expected = encode_command(["AI.TENSORSET", "set", "INT32", 2, "BLOB", np.array([1, 2], np.int32).tobytes()])
    assert expected in aof
    # a failed DAG replicates nothing
    before = replica.info("commandstats")["cmdstat_ai.tensorset"]
    ret = con.execute_command(*dag_cmd("AI.DAGEXECUTE", ["PERSIST", 1, "z"], [
        ["AI.TENSORSET", "i", "INT32", 2, 4], mexec("lin", ["i"], ["z"])]))
    assert ret[0] == b"OK" and is_error(ret[1])
    assert con.execute_command("WAIT", 1, 10000) == 1
    assert replica.info("commandstats")["cmdstat_ai.tensorset"] == before
    assert rcon.exists("z") == 0


# =================================================================================================
# RESTORE of the tensor DUMP payloads recorded from RedisAI (tests/data/redisai-dumps.json)
#
# For every tensor case: RESTORE the recorded payload and compare the recorded replies; DUMP it again from our
# module and RESTORE that (round trip, also across DEBUG RELOAD); our DUMP must carry the same module payload as
# RedisAI's (same type name, encver 4 and field layout). Also the older tensor layouts (encver 0-3), which a
# compatible module must still load, and corrupt payloads, which must be refused without bringing the server
# down.


BAD_DATA = "Bad data format"


def _load_cases():
    try:
        with open(DUMPS_PATH) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return [], f"cannot read the recorded dumps {DUMPS_PATH}: {e} (set REDISAI_COMPAT_DUMPS)"
    return [c for c in data["cases"] if c.get("kind") == "tensor"], None


TENSOR_CASES, LOAD_ERROR = _load_cases()
# one test per case; when the file cannot be read, a single parameter that fails with the reason
CASE_PARAMS = [pytest.param(c, id=c["key"]) for c in TENSOR_CASES] or [pytest.param(None, id="dumps-file-missing")]


def need(case):
    if case is None:
        pytest.fail(LOAD_ERROR or f"no tensor cases in {DUMPS_PATH}", pytrace=False)
    return case


# ---------------------------------------------------------------------------------------------
# comparing replies with the recording


def check_replies(con, case, key=None):
    for r in case["replies"]:
        cmd = list(r["cmd"])
        if key is not None:
            assert cmd[1] == case["key"]
            cmd[1] = key
        assert_reply(r["reply"], con.execute_command(*cmd), where=" ".join(map(str, cmd)))


def create_args(case):
    return [bytes.fromhex(a) if is_hex else a for a, is_hex in zip(case["create"], case["create_bytes_hex"])]


# ---------------------------------------------------------------------------------------------
# the recorded cases


def test_dumps_file_covers_all_dtypes():
    assert LOAD_ERROR is None, LOAD_ERROR
    dtypes = {c["create"][2].upper() for c in TENSOR_CASES}
    assert dtypes == {"FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "BOOL", "STRING"}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_restore_recorded(con, case):
    case = need(case)
    assert con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    assert con.type(case["key"]) == b"AI_TENSOR"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_restore_replace(con, case):
    case = need(case)
    con.execute_command("AI.TENSORSET", case["key"], "INT8", 1)
    with pytest.raises(redis.exceptions.ResponseError):
        con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))  # BUSYKEY without REPLACE
    assert con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]), replace=True) == b"OK"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_create_gives_recorded_replies(con, case):
    """The recorded `create` command on our module gives the recorded replies too."""
    case = need(case)
    assert con.execute_command(*create_args(case)) == b"OK"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_roundtrip(con, case):
    case = need(case)
    con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    ours = con.dump(case["key"])
    assert ours is not None
    assert con.restore("copy:" + case["key"], 0, ours) == b"OK"
    check_replies(con, case, key="copy:" + case["key"])
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_payload_matches_redisai(con, case):
    """Our rdb_save writes RedisAI's encver-4 layout: the DUMP payload equals the recorded one, apart from
    the trailer (RDB version and checksum, which belong to the server version)."""
    case = need(case)
    recorded = bytes.fromhex(case["dump_hex"])
    con.restore("restored", 0, recorded)
    assert payload_body(con.dump("restored")) == payload_body(recorded)
    con.execute_command(*create_args(case))
    assert payload_body(con.dump(case["key"])) == payload_body(recorded)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_restores_after_debug_reload(con, case):
    case = need(case)
    con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    ours = con.dump(case["key"])
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_replies(con, case)  # the key itself went through our rdb_save / rdb_load
    assert con.restore("after-reload", 0, ours) == b"OK"
    check_replies(con, case, key="after-reload")
    assert con.restore("recorded-after-reload", 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    check_replies(con, case, key="recorded-after-reload")


def test_restore_all_then_reload(con):
    assert LOAD_ERROR is None, LOAD_ERROR
    for case in TENSOR_CASES:
        con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.dbsize() == len(TENSOR_CASES)
    for case in TENSOR_CASES:
        check_replies(con, case)


# ---------------------------------------------------------------------------------------------
# payloads built here (helpers/rdb.py): RedisAI's encoding, the encoder checked against the recorded dumps first

DLPACK = {  # name -> (code, bits, numpy format)
    "FLOAT": (2, 32, "<f"), "DOUBLE": (2, 64, "<d"), "INT8": (0, 8, "<b"), "INT16": (0, 16, "<h"),
    "INT32": (0, 32, "<i"), "INT64": (0, 64, "<q"), "UINT8": (1, 8, "<B"), "UINT16": (1, 16, "<H"),
    "BOOL": (6, 8, "<B"), "STRING": (7, 8, None),
}


def v4_fields(dtype, shape, data, offsets=None):
    code, bits, _ = DLPACK[dtype]
    f = [u(code), u(bits), u(len(shape))] + [u(d) for d in shape] + [buf(data)]
    if offsets is not None:
        f += [u(o) for o in offsets]
    return f


def legacy_fields(dtype, shape, data):
    """encver 0-3: device_type device_id bits code lanes ndims shape... strides... byte_offset data."""
    code, bits, _ = DLPACK[dtype]
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    return ([u(1), u(0), u(bits), u(code), u(1), u(len(shape))] + [u(d) for d in shape] + [u(s) for s in strides]
            + [u(0), buf(data)])


def test_payload_encoder_matches_recorded():
    """Self-check of the encoder used below against RedisAI's own dumps (uncompressed ones)."""
    assert LOAD_ERROR is None, LOAD_ERROR
    checked = 0
    for case in TENSOR_CASES:
        recorded = bytes.fromhex(case["dump_hex"])
        assert struct.unpack("<Q", recorded[-8:])[0] == crc64(recorded[:-8])
        args = create_args(case)
        dtype = args[2].upper()
        if "BLOB" not in args or dtype == "STRING" or len(args[-1]) > 20:
            continue  # Redis LZF-compresses longer buffers; the encoder here does not
        shape = [int(a) for a in args[3:args.index("BLOB")]]
        mine = dump_payload(v4_fields(dtype, shape, args[-1]), rdbver=struct.unpack("<H", recorded[-10:-8])[0])
        assert mine == recorded, case["key"]
        checked += 1
    assert checked >= 10


def _values(dtype, data):
    fmt = DLPACK[dtype][2]
    n = len(data) // struct.calcsize(fmt)
    vals = struct.unpack("<" + fmt[1] * n, data)
    if dtype in ("FLOAT", "DOUBLE"):
        return [float(v) for v in vals]
    return list(vals)


SAMPLE_DATA = {
    "FLOAT": struct.pack("<6f", 1.5, -2.25, 0.0, 3e38, -1e-3, 7),
    "DOUBLE": struct.pack("<6d", 1.5, -2.25, 0.1, 1e300, -1e-300, 7),
    "INT8": struct.pack("<6b", -128, 127, 0, -1, 5, 9),
    "INT16": struct.pack("<6h", -32768, 32767, 0, -1, 5, 9),
    "INT32": struct.pack("<6i", -2 ** 31, 2 ** 31 - 1, 0, -1, 5, 9),
    "INT64": struct.pack("<6q", -2 ** 63, 2 ** 63 - 1, 0, -1, 5, 9),
    "UINT8": struct.pack("<6B", 0, 255, 1, 2, 3, 4),
    "UINT16": struct.pack("<6H", 0, 65535, 1, 2, 3, 4),
    "BOOL": bytes([0, 1, 1, 0, 0, 1]),
}


def _check_tensor(con, key, dtype, shape, data, values):
    assert con.execute_command("AI.TENSORGET", key, "META", "BLOB") == [
        b"dtype", dtype.encode(), b"shape", list(shape), b"blob", data]
    got = con.execute_command("AI.TENSORGET", key, "VALUES")
    if dtype in ("FLOAT", "DOUBLE"):
        assert [float(v) for v in got] == values
    else:
        assert got == values


def _dump_of_created(con, dtype, shape, data):
    """DUMP of the same tensor made with AI.TENSORSET ... BLOB on our module."""
    con.execute_command("AI.TENSORSET", "__tmp", dtype, *shape, "BLOB", data)
    d = con.dump("__tmp")
    con.delete("__tmp")
    return d


def _dump_encver(dump):
    assert dump[0] == 7 and dump[1] == 0x81
    return struct.unpack(">Q", dump[2:10])[0] & 0x3FF


@pytest.mark.parametrize("dtype", [d for d in SAMPLE_DATA if d != "BOOL"])
@pytest.mark.parametrize("encver", [0, 1, 2, 3])
def test_restore_legacy_encver(con, encver, dtype):
    """Tensors saved by RedisAI 1.0-1.2.4 (encver 0-3; no BOOL/STRING then) still load, and are saved in v4."""
    data = SAMPLE_DATA[dtype]
    assert con.restore("old", 0, dump_payload(legacy_fields(dtype, (2, 3), data), encver=encver)) == b"OK"
    _check_tensor(con, "old", dtype, (2, 3), data, _values(dtype, data))
    ours = con.dump("old")
    assert _dump_encver(ours) == 4
    assert ours == _dump_of_created(con, dtype, (2, 3), data)


@pytest.mark.parametrize("encver", [0, 1, 2, 3])
def test_restore_legacy_int32_column(con, encver):
    """The layout of RedisAI's own v0/v1 test payload: INT32 shape [2, 1], values [1, 2]."""
    data = struct.pack("<2i", 1, 2)
    con.restore("t", 0, dump_payload(legacy_fields("INT32", (2, 1), data), encver=encver))
    assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"INT32", b"shape", [2, 1]]
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [1, 2]


V4_CASES = {
    "float-scalar": ("FLOAT", (), struct.pack("<f", 2.5), None),
    "bool-2x3": ("BOOL", (2, 3), SAMPLE_DATA["BOOL"], None),
    "int64-6": ("INT64", (6,), SAMPLE_DATA["INT64"], None),
    "uint16-1x1x6": ("UINT16", (1, 1, 6), SAMPLE_DATA["UINT16"], None),
    "string-3": ("STRING", (3,), b"ab\x00c\x00def\x00", [0, 3, 5]),
    "string-empty-elements": ("STRING", (3,), b"\x00b\x00\x00", [0, 1, 3]),
    "string-scalar": ("STRING", (), b"only\x00", [0]),
    "string-2x2-utf8": ("STRING", (2, 2), "γ\x00日本\x00\x00z\x00".encode(), [0, 3, 10, 11]),
}


@pytest.mark.parametrize("name", list(V4_CASES))
def test_restore_built_v4(con, name):
    dtype, shape, data, offsets = V4_CASES[name]
    payload = dump_payload(v4_fields(dtype, shape, data, offsets))
    assert con.restore("t", 0, payload) == b"OK"
    if dtype == "STRING":
        assert con.execute_command("AI.TENSORGET", "t", "META", "BLOB") == [
            b"dtype", b"STRING", b"shape", list(shape), b"blob", data]
        assert con.execute_command("AI.TENSORGET", "t", "VALUES") == data.split(b"\x00")[:-1]
    else:
        _check_tensor(con, "t", dtype, shape, data, _values(dtype, data))
    ours = con.dump("t")
    assert _dump_encver(ours) == 4
    assert ours == _dump_of_created(con, dtype, shape, data)
    if len(data) <= 20:  # short buffers are stored uncompressed: then the bytes are exactly ours
        assert payload_body(ours) == payload_body(payload)


# ---------------------------------------------------------------------------------------------
# corrupt payloads (valid checksum): refused, the server stays up

CORRUPT = {
    "encver-5": dump_payload(v4_fields("FLOAT", (2,), b"\x00" * 8), encver=5),
    "encver-1023": dump_payload(v4_fields("FLOAT", (2,), b"\x00" * 8), encver=1023),
    "unknown-dtype-code": dump_payload([u(9), u(32), u(1), u(2), buf(b"\x00" * 8)]),
    "float16": dump_payload([u(2), u(16), u(1), u(2), buf(b"\x00" * 4)]),
    "int24": dump_payload([u(0), u(24), u(1), u(2), buf(b"\x00" * 6)]),
    "uint32": dump_payload([u(1), u(32), u(1), u(2), buf(b"\x00" * 8)]),
    "data-too-short": dump_payload(v4_fields("FLOAT", (2, 3), b"\x00" * 20)),
    "data-too-long": dump_payload(v4_fields("FLOAT", (2, 3), b"\x00" * 28)),
    "huge-shape": dump_payload(v4_fields("FLOAT", (1 << 40, 1 << 40), b"\x00" * 4)),
    "overflowing-shape": dump_payload(v4_fields("INT8", (1 << 32, 1 << 32), b"\x00")),
    "huge-ndim": dump_payload([u(2), u(32), u(1 << 31), u(2)]),
    "truncated-after-bits": dump_payload([u(2), u(32)]),
    "truncated-before-data": dump_payload([u(2), u(32), u(1), u(2)]),
    "string-missing-offsets": dump_payload(v4_fields("STRING", (2,), b"a\x00b\x00")),
    "string-one-offset-missing": dump_payload(v4_fields("STRING", (2,), b"a\x00b\x00", [0])),
    "legacy-data-too-short": dump_payload(legacy_fields("INT32", (2, 3), b"\x00" * 8), encver=2),
    "legacy-unknown-dtype": dump_payload([u(1), u(0), u(32), u(5), u(1), u(1), u(2), u(1), u(0),
                                          buf(b"\x00" * 8)], encver=0),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_restore_corrupt_payload_refused(con, name):
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.restore("bad", 0, CORRUPT[name])
    assert str(e.value) == BAD_DATA
    assert con.ping()
    assert con.exists("bad") == 0
    con.execute_command("AI.TENSORSET", "ok", "FLOAT", 1)
    assert con.execute_command("AI.TENSORGET", "ok", "VALUES") == [b"0"]


# Inconsistent STRING layouts: refusing them is best; if one is accepted it must then be served safely.
STRING_ODD = {
    "offset-out-of-range": v4_fields("STRING", (2,), b"ab\x00", [0, 100]),
    "offsets-decreasing": v4_fields("STRING", (2,), b"a\x00b\x00", [2, 0]),
    "no-final-nul": v4_fields("STRING", (1,), b"ab", [0]),
    "offset-not-after-nul": v4_fields("STRING", (2,), b"ab\x00c\x00", [0, 1]),
    "non-utf8": v4_fields("STRING", (1,), b"\xff\x00", [0]),
    "bool-value-2": v4_fields("BOOL", (2,), b"\x00\x02"),
}


@pytest.mark.parametrize("name", list(STRING_ODD))
def test_restore_inconsistent_payload_is_safe(con, name):
    try:
        con.restore("odd", 0, dump_payload(STRING_ODD[name]))
    except redis.exceptions.ResponseError as e:
        assert str(e) == BAD_DATA
        assert con.exists("odd") == 0
    else:
        for fmt in ([], ["META"], ["BLOB"], ["VALUES"], ["META", "VALUES"]):
            con.execute_command("AI.TENSORGET", "odd", *fmt)
        con.dump("odd")
        con.execute_command("DEBUG", "RELOAD")
    assert con.ping()
