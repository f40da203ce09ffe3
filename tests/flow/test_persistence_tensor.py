"""Tensor persistence: RDB (DEBUG RELOAD, SAVE + restart, save on shutdown), AOF (command stream and the
module's AOF rewrite callback, spec §3.7) and replication (spec §3.8). Every check is byte-exact."""

import numpy as np
import pytest
import redis

from helpers.aof import parse_resp_commands
from helpers.checks import wait_for
from helpers.resp import RespError, raw_command

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
    """What spec §3.7 says the rewrite emits for `key`: AI.TENSORSET key TYPE dims... BLOB data."""
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
