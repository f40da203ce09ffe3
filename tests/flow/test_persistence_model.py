"""Models across persistence and replication (docs/commands.md, "Persistence and replication"), every backend:
DEBUG RELOAD, SAVE + restart, AOF (command stream and rewrite), replicas, DUMP/RESTORE (our own payloads and the
cases recorded from RedisAI in tests/data/redisai-dumps.json, checked against what each model computes), payloads
in RedisAI's older encodings, and models whose backend is unavailable when they are loaded (kept; executing them
replies the backend error).

ONNX models first, then TF, TORCH and TFLITE. A refused (hostile) model that arrives through these routes is in
test_security_<backend>.py."""

import json
import time

import numpy as np
import pytest
import redis

from helpers.aof import aof_commands, aof_files, bgrewriteaof
from helpers.checks import wait_for, wait_replicas
from helpers.data import weights
from helpers.onnx_models import (ai_info, blob, get_tensor, model_execute, modules_info, recorded_model_function,
                                 set_tensor, store)
from helpers.rdb import buf, model_payload
from helpers.recorded import DUMPS_PATH, need_case, payload_body, recorded_create, recorded_reply
from helpers.server import MODULE_PATH
from helpers.tf_models import assert_close, evaluate, graph_nodes, tf_blob, tf_meta, tf_store
from helpers.tflite_models import ab, tfl_store
from helpers.torch_models import pt_blob, pt_store

BOGUS_ONNX = "/nonexistent/libonnxruntime.so"


# =================================================================================================
# ONNX
# -------------------------------------------------------------------------------------------------
# a set of models and what is observable about them

MODELS = {  # key: (file, options, device)
    "m:mul": ("mul", ["TAG", "tag one", "BATCHSIZE", 8, "MINBATCHSIZE", 2, "MINBATCHTIMEOUT", 30], "CPU"),
    "m:linear": ("linear", [], "cpu:1"),
    "m:two": ("two_outputs", ["TAG", "2"], "CPU"),
    "m:str": ("str_identity", [], "CPU"),
    "m:int": ("add_int32", ["BATCHSIZE", 3], "CPU"),
    "m:heavy": ("heavy", ["TAG", "big"], "CPU"),
}


def populate(con):
    for key, (name, opts, dev) in MODELS.items():
        store(con, key, name, *opts, device=dev)
    return snapshot(con)


def snapshot(con, keys=MODELS):
    return {k: (con.type(k), con.execute_command("AI.MODELGET", k, "META", "BLOB")) for k in keys}


def check_models(con, before, keys=MODELS):
    """Same META and BLOB as before, all executable with the right results, a fresh AI.INFO entry."""
    after = snapshot(con, keys)
    for k in keys:
        assert after[k] == before[k], f"model {k} changed"
        assert before[k][1][17] == blob(MODELS[k][0])
    if "m:mul" in keys:
        set_tensor(con, "a", np.array([[1.5, -2.0]], dtype=np.float32))
        assert model_execute(con, "m:mul", ["a", "a"], ["c"]) == b"OK"
        assert get_tensor(con, "c").tolist() == [[2.25, 4.0]]
    if "m:linear" in keys:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        set_tensor(con, "x", x)
        assert model_execute(con, "m:linear", ["x"], ["y"]) == b"OK"
        np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)
    if "m:two" in keys:
        set_tensor(con, "x2", np.array([[1.0, 2.0]], dtype=np.float32))
        assert model_execute(con, "m:two", ["x2"], ["p", "q"]) == b"OK"
        assert get_tensor(con, "p").tolist() == [[2.0, 3.0]] and get_tensor(con, "q").tolist() == [[2.0, 4.0]]
    if "m:str" in keys:
        con.execute_command("AI.TENSORSET", "s", "STRING", 2, "VALUES", "ab", "γ")
        assert model_execute(con, "m:str", ["s"], ["t"]) == b"OK"
        assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"ab", "γ".encode()]
    if "m:int" in keys:
        set_tensor(con, "i", np.array([5, -7], dtype=np.int32))
        assert model_execute(con, "m:int", ["i", "i"], ["j"]) == b"OK"
        assert con.execute_command("AI.TENSORGET", "j", "VALUES") == [10, -14]
    if "m:heavy" in keys:
        hx = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
        set_tensor(con, "hx", hx)
        assert model_execute(con, "m:heavy", ["hx"], ["hy"]) == b"OK"
        np.testing.assert_allclose(get_tensor(con, "hy"), weights.heavy(hx), rtol=1e-4, atol=1e-5)
    for k in keys:
        info = ai_info(con, k)
        meta = before[k][1]
        assert (info["key"], info["type"], info["backend"], info["device"], info["tag"]) == (
            k.encode(), b"MODEL", b"ONNX", meta[3], meta[5])


def run_all_once(con):
    check_models(con, snapshot(con))


# -------------------------------------------------------------------------------------------------
# RDB


def test_debug_reload(server):
    con = server.client()
    before = populate(con)
    run_all_once(con)
    assert ai_info(con, "m:mul")["calls"] == 1
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.dbsize() >= len(MODELS)
    # stats are not persisted: the entry is there again, with zero counters
    info = ai_info(con, "m:mul")
    assert (info["calls"], info["samples"], info["errors"], info["duration"]) == (0, 0, 0, 0)
    assert sorted(con.execute_command("AI._MODELSCAN")) == sorted(
        [[k.encode(), snapshot(con, [k])[k][1][5]] for k in MODELS])
    check_models(con, before)
    # and again, from what our own rdb_save wrote after a reload
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_models(con, before)


def test_debug_reload_chunked(server):
    """A small MODEL_CHUNK_SIZE makes the RDB payload chunked (n = len // chunk + 1): still identical."""
    con = server.client()
    before = populate(con)
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 1000)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 535822336)
    check_models(con, before)
    # a chunk size that divides the blob (the last chunk is empty)
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", len(blob("mul")) // 2)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 535822336)
    check_models(con, before)


def test_save_and_restart(server):
    con = server.client()
    before = populate(con)
    set_tensor(con, "keep", np.array([1.0, 2.0], dtype=np.float32))
    assert con.save() is True
    server.restart()
    con = server.client()
    assert con.execute_command("AI.TENSORGET", "keep", "VALUES") == [b"1", b"2"]
    check_models(con, before)
    info = ai_info(con, "m:heavy")
    assert (info["calls"], info["samples"]) == (1, 2)  # only the run of check_models


# -------------------------------------------------------------------------------------------------
# AOF


def check_rewritten_stores(server, backend, models, before, blob_of):
    """The rewritten AOF's base holds one AI.MODELSTORE per model, in RedisAI's argument order (AI.MODELSTORE <key>
    <backend> <device> TAG <tag> BATCHSIZE n MINBATCHSIZE m MINBATCHTIMEOUT t BLOB <chunk>...), the options as
    META reported them before, and the model's bytes."""
    base, _ = aof_files(server)
    assert base.suffix == ".aof", base
    stores = {c[1].decode(): c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert set(stores) == set(models)
    for key, (name, _, dev) in models.items():
        meta, cmd = before[key][1], stores[key]
        assert cmd[1:13] == [key.encode(), backend, dev.encode(), b"TAG", meta[5], b"BATCHSIZE", str(meta[7]).encode(),
                             b"MINBATCHSIZE", str(meta[9]).encode(), b"MINBATCHTIMEOUT", str(meta[15]).encode(),
                             b"BLOB"], cmd[:13]
        assert b"".join(cmd[13:]) == blob_of(name)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite(server):
    con = server.client()
    before = populate(con)
    bgrewriteaof(server, con)
    check_rewritten_stores(server, b"ONNX", MODELS, before, blob)
    server.restart()
    con = server.client()
    check_models(con, before)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite_chunked(server):
    """With a small MODEL_CHUNK_SIZE the rewritten MODELSTORE carries the blob in several BLOB arguments."""
    con = server.client()
    store(con, "h", "heavy", "TAG", "t")
    before = snapshot(con, ["h"])
    con.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 100000)
    bgrewriteaof(server, con)
    (cmd,) = [c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"]
    heavy = blob("heavy")
    chunks = cmd[cmd.index(b"BLOB") + 1:]
    assert len(chunks) == len(heavy) // 100000 + 1
    assert all(len(c) == 100000 for c in chunks[:-1]) and b"".join(chunks) == heavy
    server.restart()
    con = server.client()
    assert snapshot(con, ["h"]) == before


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_command_stream(server):
    """What is propagated (= replicated): MODELSTORE / MODELDEL verbatim, MODELEXECUTE outputs as TENSORSET,
    nothing for failed commands; restarting from that AOF gives the same state."""
    con = server.client()
    mul = blob("mul")
    assert con.execute_command("ai.modelstore", "m", "onnx", "cpu", "tag", "t1", "BLOB", mul[:60], mul[60:]) == b"OK"
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("AI.MODELSTORE", "bad", "ONNX", "CPU", "BLOB", b"garbage")
    store(con, "gone", "linear")
    assert con.execute_command("AI.MODELDEL", "gone") == b"OK"
    a = np.array([[1.5, 2.0], [3.0, -4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    store(con, "t", "two_outputs")
    assert model_execute(con, "t", ["a"], ["p", "q"], "TIMEOUT", 10000) == b"OK"
    with pytest.raises(redis.exceptions.ResponseError):
        model_execute(con, "m", ["a", "nokey"], ["z"])

    def cmds():
        return [c for c in aof_commands(server, "incr") if c[0].upper() not in (b"SELECT", b"MULTI", b"EXEC")]

    wait_for(lambda: any(c[0].upper() == b"AI.TENSORSET" and c[1] == b"q" for c in cmds()), 10,
             what="the outputs in the AOF")
    got = cmds()
    names = [c[0].upper() for c in got]
    assert b"AI.MODELEXECUTE" not in names and b"AI.MODELRUN" not in names
    assert ["ai.modelstore", "m", "onnx", "cpu", "tag", "t1", "BLOB"] == [x.decode() for x in got[0][:7]]
    assert got[0][7:] == [mul[:60], mul[60:]]
    assert not any(c[1] == b"bad" for c in got)
    assert [b"AI.MODELDEL", b"gone"] in [[c[0].upper(), *c[1:]] for c in got]
    tensorsets = {c[1]: c for c in got if c[0].upper() == b"AI.TENSORSET"}
    assert set(tensorsets) == {b"a", b"c", b"p", b"q"}
    assert [x.upper() for x in tensorsets[b"c"][:1]] + tensorsets[b"c"][1:] == [
        b"AI.TENSORSET", b"c", b"FLOAT", b"2", b"2", b"BLOB", (a * a).tobytes()]
    assert tensorsets[b"p"][1:] == [b"p", b"FLOAT", b"2", b"2", b"BLOB", (a + np.float32(1)).tobytes()]
    assert tensorsets[b"q"][1:] == [b"q", b"FLOAT", b"2", b"2", b"BLOB", (a * np.float32(2)).tobytes()]
    before = {k: con.execute_command("AI.TENSORGET", k, "META", "BLOB") for k in ("a", "c", "p", "q")}
    meta = con.execute_command("AI.MODELGET", "m", "META", "BLOB")
    server.restart()
    con = server.client()
    assert con.exists("gone") == 0 and con.exists("bad") == 0 and con.exists("z") == 0
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == meta
    assert {k: con.execute_command("AI.TENSORGET", k, "META", "BLOB") for k in before} == before
    # the model was not re-run when the AOF was loaded
    assert ai_info(con, "m")["calls"] == 0
    assert model_execute(con, "m", ["a", "a"], ["c2"]) == b"OK"
    assert get_tensor(con, "c2").tobytes() == (a * a).tobytes()


# -------------------------------------------------------------------------------------------------
# replication


def test_replication(make_server, make_replica):
    master = make_server(name="master")
    mcon = master.client()
    store(mcon, "early", "linear", "TAG", "full sync")  # reaches the replica through the full sync (RDB)
    replica = make_replica(master)
    rcon = replica.client()
    assert rcon.execute_command("AI.MODELGET", "early", "META", "BLOB") == mcon.execute_command(
        "AI.MODELGET", "early", "META", "BLOB")

    # stored after the link is up: MODELSTORE is replicated verbatim, the replica builds the model itself
    store(mcon, "m", "mul", "TAG", "v1")
    store(mcon, "h", "heavy", device="CPU:1")
    wait_replicas(mcon)
    for k in ("m", "h"):
        assert rcon.execute_command("AI.MODELGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.MODELGET", k, "META", "BLOB")
        assert ai_info(rcon, k)["calls"] == 0

    # MODELEXECUTE: the outputs reach the replica as tensors; the model is not run there
    a = np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)
    set_tensor(mcon, "a", a)
    assert model_execute(mcon, "m", ["a", "a"], ["c"]) == b"OK"
    hx = np.random.default_rng(5).standard_normal((4, 256)).astype(np.float32)
    set_tensor(mcon, "hx", hx)
    assert model_execute(mcon, "h", ["hx"], ["hy"]) == b"OK"
    assert mcon.execute_command("AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c_run") == b"OK"
    wait_replicas(mcon)
    for k in ("c", "hy", "c_run"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB")
    assert get_tensor(rcon, "c").tobytes() == (a * a).tobytes()
    for k in ("m", "h"):
        assert ai_info(rcon, k)["calls"] == 0
    assert ai_info(mcon, "m")["calls"] == 2 and ai_info(mcon, "h")["calls"] == 1

    # replacing and deleting
    store(mcon, "m", "linear", "TAG", "v2")
    wait_replicas(mcon)
    assert rcon.execute_command("AI.MODELGET", "m", "META") == mcon.execute_command("AI.MODELGET", "m", "META")
    assert rcon.execute_command("AI.MODELGET", "m", "META")[5] == b"v2"
    assert mcon.execute_command("AI.MODELDEL", "m") == b"OK"
    wait_replicas(mcon)
    assert rcon.exists("m") == 0
    with pytest.raises(redis.exceptions.ResponseError):
        rcon.execute_command("AI.INFO", "m")

    # a store followed at once by a delete: the replica must end without the key (ordering kept)
    store(mcon, "quick", "heavy")
    mcon.execute_command("AI.MODELDEL", "quick")
    store(mcon, "quick2", "heavy", "TAG", "a")
    store(mcon, "quick2", "mul", "TAG", "b")
    wait_replicas(mcon)
    time.sleep(0.3)
    assert rcon.exists("quick") == 0
    assert rcon.execute_command("AI.MODELGET", "quick2", "META", "BLOB") == mcon.execute_command(
        "AI.MODELGET", "quick2", "META", "BLOB")
    assert sorted(rcon.execute_command("AI._MODELSCAN")) == sorted(mcon.execute_command("AI._MODELSCAN"))

    # the replica can run the models it got
    set_tensor(mcon, "x", np.ones((1, 4), dtype=np.float32))
    wait_replicas(mcon)
    with pytest.raises(redis.exceptions.ResponseError):  # read-only replica: no writes of outputs
        rcon.execute_command("AI.TENSORSET", "zz", "FLOAT", 1)
    assert rcon.execute_command("AI.MODELGET", "early", "META")[5] == b"full sync"


# -------------------------------------------------------------------------------------------------
# DUMP / RESTORE


def test_dump_restore_round_trip(con):
    store(con, "m", "heavy", "TAG", "t", "BATCHSIZE", 16, "MINBATCHSIZE", 4, "MINBATCHTIMEOUT", 3, device="CPU:1")
    before = con.execute_command("AI.MODELGET", "m", "META", "BLOB")
    payload = con.dump("m")
    assert payload is not None
    assert con.restore("copy", 0, payload) == b"OK"
    assert con.type("copy") == b"AI__MODEL"
    assert con.execute_command("AI.MODELGET", "copy", "META", "BLOB") == before
    info = ai_info(con, "copy")
    assert (info["key"], info["tag"], info["device"], info["calls"]) == (b"copy", b"t", b"CPU:1", 0)
    hx = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    set_tensor(con, "hx", hx)
    assert model_execute(con, "copy", ["hx"], ["hy"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "hy"), weights.heavy(hx), rtol=1e-4, atol=1e-5)
    # our DUMP of the copy is the same payload
    assert con.dump("copy") == payload
    # RESTORE ... REPLACE over another model swaps it
    store(con, "other", "mul")
    with pytest.raises(redis.exceptions.ResponseError):
        con.restore("other", 0, payload)  # BUSYKEY
    assert con.restore("other", 0, payload, replace=True) == b"OK"
    assert con.execute_command("AI.MODELGET", "other", "META", "BLOB") == before
    assert ai_info(con, "other")["tag"] == b"t"
    assert sorted(con.execute_command("AI._MODELSCAN")) == [[b"copy", b"t"], [b"m", b"t"], [b"other", b"t"]]


def check_recorded_replies(con, case, key=None):
    for r in case["replies"]:
        cmd = list(r["cmd"])
        if key is not None:
            cmd[1] = key
        assert con.execute_command(*cmd) == recorded_reply(r["reply"]), cmd


@pytest.mark.parametrize("key", ["m:onnx", "m:onnx1"])
def test_restore_recorded_onnx(con, key):
    case = need_case(key)
    recorded = bytes.fromhex(case["dump_hex"])
    assert con.restore(key, 0, recorded) == b"OK"
    assert con.type(key) == b"AI__MODEL"
    check_recorded_replies(con, case)
    model_blob = con.execute_command("AI.MODELGET", key, "BLOB")
    create_blob = bytes.fromhex(case["create"][-1])
    assert model_blob == create_blob
    meta = con.execute_command("AI.MODELGET", key, "META")
    inputs, fn, width = recorded_model_function(model_blob)
    assert [i.encode() for i in inputs] == meta[11]
    rng = np.random.default_rng(11)
    feeds = {}
    for name in inputs:
        arr = rng.standard_normal((2, width) if width else (5,)).astype(np.float32)
        feeds[name] = arr
        set_tensor(con, "in:" + name, arr)
    outs = [o.decode() for o in meta[13]]
    assert model_execute(con, key, ["in:" + n for n in inputs], ["out:" + o for o in outs]) == b"OK"
    for o, want in zip(outs, fn(feeds)):
        np.testing.assert_allclose(get_tensor(con, "out:" + o), want, rtol=1e-5, atol=1e-6)
    info = ai_info(con, key)
    assert (info["calls"], info["errors"], info["device"], info["tag"]) == (1, 0, meta[3], meta[5])


@pytest.mark.parametrize("key", ["m:onnx", "m:onnx1"])
def test_dump_payload_matches_redisai_onnx(con, key):
    """Our rdb_save writes RedisAI's encver-4 model layout: DUMP equals the recorded payload apart from the
    trailer, both after RESTORE and after storing the recorded `create` command."""
    case = need_case(key)
    recorded = bytes.fromhex(case["dump_hex"])
    con.restore("restored", 0, recorded)
    assert payload_body(con.dump("restored")) == payload_body(recorded)
    args = [bytes.fromhex(a) if h else a for a, h in zip(case["create"], case["create_bytes_hex"])]
    assert con.execute_command(*args) == b"OK"
    assert payload_body(con.dump(key)) == payload_body(recorded)
    check_recorded_replies(con, case)


@pytest.mark.parametrize("key", ["m:onnx", "m:onnx1"])
def test_restore_recorded_then_reload(con, key):
    case = need_case(key)
    con.restore(key, 0, bytes.fromhex(case["dump_hex"]))
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_recorded_replies(con, case)
    assert ai_info(con, key)["calls"] == 0


# -------------------------------------------------------------------------------------------------
# models whose backend is not available when they are loaded


def _without_onnx(server):
    """Make `server` start with a bogus ONNX path from now on."""
    server.load_module = False
    server.server_args = ["--loadmodule", MODULE_PATH, "ONNX", BOGUS_ONNX]


def _with_onnx(server):
    server.load_module = True
    server.server_args = []


def test_models_kept_without_backend(server):
    con = server.client()
    before = populate(con)
    assert con.save() is True
    _without_onnx(server)
    server.restart()
    con = server.client()
    # the models are kept, with their metadata and payload
    assert snapshot(con) == before
    assert sorted(k for k, _ in con.execute_command("AI._MODELSCAN")) == sorted(k.encode() for k in MODELS)
    assert "ai_onnxruntime_version" not in modules_info(server)
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "new", "ONNX", "CPU", "BLOB", blob("mul"))
    assert f"Could not load backend ONNX from {BOGUS_ONNX}" in str(e.value), str(e.value)
    # executing one replies the backend error
    set_tensor(con, "a", np.array([[1.0]], dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "m:mul", ["a", "a"], ["c"])
    assert "Could not load backend ONNX" in str(e.value), str(e.value)
    assert con.exists("c") == 0
    # RESTORE of a recorded ONNX model works too and keeps it
    case = need_case("m:onnx")
    assert con.restore("m:onnx", 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    check_recorded_replies(con, case)
    # and both survive a reload / save done without the backend
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert snapshot(con) == before
    check_recorded_replies(con, case)
    assert con.save() is True
    # back with the backend: everything runs
    _with_onnx(server)
    server.restart()
    con = server.client()
    check_models(con, before)
    check_recorded_replies(con, case)
    set_tensor(con, "x3", np.ones((2, 3), dtype=np.float32))
    assert model_execute(con, "m:onnx", ["x3"], ["y3"]) == b"OK"
    assert get_tensor(con, "y3").tolist() == [[9.5, 11.5], [9.5, 11.5]]


# -------------------------------------------------------------------------------------------------
# payloads built here (helpers/rdb.py): the encoder against RedisAI's, then RedisAI's older encodings


def test_model_payload_encoder_matches_recorded(con):
    """helpers/rdb.py's model_payload (the payloads of the old-encoding tests below and of the refused models of
    test_security_*.py) against RedisAI 1.2.7: for the recorded `m:onnx1` (no TAG, no batching) it writes RedisAI's
    bytes up to the model's data, which Redis LZF-compressed in the recording (same type id and encoding version,
    same fields); and the module reads the two payloads as the same model: same META and BLOB, same DUMP, same
    results."""
    case = need_case("m:onnx1")
    recorded = bytes.fromhex(case["dump_hex"])
    create = recorded_create(case)
    device, model_blob = create[3], create[-1]
    (r,) = case["replies"]
    assert r["cmd"] == ["AI.MODELGET", "m:onnx1", "META"]
    recorded_meta = recorded_reply(r["reply"])
    names = dict(zip(recorded_meta[::2], recorded_meta[1::2]))
    inputs, outputs = [n.decode() for n in names[b"inputs"]], [n.decode() for n in names[b"outputs"]]
    built = model_payload(4, 3, device, model_blob, inputs=inputs, outputs=outputs)
    data_at = len(built) - 10 - 1 - len(buf(model_blob))  # before the data buffer, the EOF byte and the trailer
    assert built[:data_at] == recorded[:data_at]
    assert recorded[data_at] == built[data_at] == 0x05  # both go on with the model's bytes as a string buffer
    assert con.restore("recorded", 0, recorded) == b"OK"
    assert con.restore("built", 0, built) == b"OK"
    assert con.execute_command("AI.MODELGET", "built", "META") == recorded_meta
    assert con.execute_command("AI.MODELGET", "built", "BLOB") == model_blob
    assert payload_body(con.dump("built")) == payload_body(con.dump("recorded"))
    a = np.array([1.5, -2.0, 4.0], dtype=np.float32)
    set_tensor(con, "a", a)
    for key in ("recorded", "built"):
        assert model_execute(con, key, ["a", "a"], [f"c:{key}"]) == b"OK"
        np.testing.assert_array_equal(get_tensor(con, f"c:{key}"), a + a)


@pytest.mark.parametrize("encver", [0, 1])
def test_models_from_old_encodings_report_the_backends_names(con, encver):
    """RedisAI's encodings 0 and 1 stored no names for ONNX and TORCH models: META reports the backend's."""
    con.restore("m", 0, model_payload(encver, 3, "CPU", blob("mul")))
    meta = con.execute_command("AI.MODELGET", "m", "META")
    fields = dict(zip(meta[::2], meta[1::2]))
    assert fields[b"inputs"] == [b"a", b"b"]
    assert fields[b"outputs"] == [b"c"]
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    assert get_tensor(con, "c").tolist() == [[4.0]]


# =================================================================================================
# TF


def tf_populate(con):
    """The four graphs with a few options; returns {key: MODELGET META BLOB}."""
    tf_store(con, "tf:mul", "mul", "TAG", "t one")
    tf_store(con, "tf:dense", "dense", "TAG", "d", "BATCHSIZE", 8, "MINBATCHSIZE", 2, device="CPU:1")
    tf_store(con, "tf:str", "str_identity")
    tf_store(con, "tf:int", "add_int32", inputs=["a:0", "b"])
    keys = ("tf:mul", "tf:dense", "tf:str", "tf:int")
    return {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in keys}


def tf_check_models(con, before):
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    a = np.array([1.5, -2.0, 4.0], dtype=np.float32)
    set_tensor(con, "ca", a)
    assert model_execute(con, "tf:mul", ["ca", "ca"], ["cc"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "cc"), a * a)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    set_tensor(con, "cx", x)
    assert model_execute(con, "tf:dense", ["cx"], ["cy"]) == b"OK"
    assert_close(get_tensor(con, "cy"), weights.linear(x))
    con.execute_command("AI.TENSORSET", "cs", "STRING", 2, "VALUES", "", "q")
    assert model_execute(con, "tf:str", ["cs"], ["ct"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "ct", "VALUES") == [b"", b"q"]
    i = np.array([5, -7], dtype=np.int32)
    set_tensor(con, "ci", i)
    assert model_execute(con, "tf:int", ["ci", "ci"], ["co"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "co"), i + i)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite_tf(server):
    con = server.client()
    before = tf_populate(con)
    bgrewriteaof(server, con)
    stores = {c[1].decode(): c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert set(stores) == set(before)
    assert stores["tf:mul"] == [b"AI.MODELSTORE", b"tf:mul", b"TF", b"CPU", b"TAG", b"t one", b"BATCHSIZE", b"0",
                                b"MINBATCHSIZE", b"0", b"MINBATCHTIMEOUT", b"0", b"INPUTS", b"2", b"a", b"b",
                                b"OUTPUTS", b"1", b"c", b"BLOB", tf_blob("mul")]
    assert stores["tf:dense"] == [b"AI.MODELSTORE", b"tf:dense", b"TF", b"CPU:1", b"TAG", b"d", b"BATCHSIZE", b"8",
                                  b"MINBATCHSIZE", b"2", b"MINBATCHTIMEOUT", b"0", b"INPUTS", b"1", b"x",
                                  b"OUTPUTS", b"1", b"y", b"BLOB", tf_blob("dense")]
    assert stores["tf:int"][12:19] == [b"INPUTS", b"2", b"a:0", b"b", b"OUTPUTS", b"1", b"c"]
    assert stores["tf:str"][12:] == [b"INPUTS", b"1", b"s", b"OUTPUTS", b"1", b"t", b"BLOB", tf_blob("str_identity")]
    server.restart()
    con = server.client()
    tf_check_models(con, before)


def test_debug_reload_tf(server):
    con = server.client()
    before = tf_populate(con)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    tf_check_models(con, before)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_replication_tf(server, make_replica):
    """MODELSTORE reaches the replica verbatim (the replica builds the graph itself); MODELEXECUTE is not
    replicated, its outputs are, as AI.TENSORSET. The master's AOF holds the propagated stream."""
    master = server
    mcon = master.client()
    tf_store(mcon, "early", "mul", "TAG", "full sync")  # through the full sync (RDB)
    replica = make_replica(master)
    rcon = replica.client()
    g = tf_blob("dense")
    assert mcon.execute_command("ai.modelstore", "m", "tf", "cpu", "TAG", "v1", "inputs", 1, "x", "outputs", 2,
                                "xw", "y:0", "BLOB", g[:50], g[50:]) == b"OK"
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    set_tensor(mcon, "x", x)
    assert model_execute(mcon, "m", ["x"], ["xw", "y"]) == b"OK"
    a = np.array([1.5, 2.5], dtype=np.float32)
    set_tensor(mcon, "a", a)
    assert model_execute(mcon, "early", ["a", "a"], ["c"]) == b"OK"
    assert mcon.execute_command("WAIT", 1, 10000) == 1
    for k in ("early", "m"):
        assert rcon.execute_command("AI.MODELGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.MODELGET", k, "META", "BLOB")
        assert ai_info(rcon, k)["calls"] == 0
    for k in ("xw", "y", "c"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB")
    assert_close(get_tensor(rcon, "y"), weights.linear(x))
    np.testing.assert_array_equal(get_tensor(rcon, "c"), a * a)
    # the names and the device string as given
    assert rcon.execute_command("AI.MODELGET", "m", "META") == tf_meta(
        device=b"cpu", tag=b"v1", inputs=["x"], outputs=["xw", "y:0"])

    # what was propagated
    def stream():
        return [c for c in aof_commands(master, "incr") if c[0].upper() not in (b"SELECT", b"MULTI", b"EXEC")]

    wait_for(lambda: any(c[0].upper() == b"AI.TENSORSET" and c[1] == b"c" for c in stream()), 10,
             what="the outputs in the AOF")
    got = stream()
    names = [c[0].upper() for c in got]
    assert b"AI.MODELEXECUTE" not in names
    assert [b"ai.modelstore", b"m", b"tf", b"cpu", b"TAG", b"v1", b"inputs", b"1", b"x", b"outputs", b"2", b"xw",
            b"y:0", b"BLOB", g[:50], g[50:]] in got
    tensorsets = {c[1]: c for c in got if c[0].upper() == b"AI.TENSORSET"}
    assert set(tensorsets) == {b"x", b"xw", b"y", b"a", b"c"}
    y = mcon.execute_command("AI.TENSORGET", "y", "BLOB")
    assert tensorsets[b"y"][1:] == [b"y", b"FLOAT", b"5", b"3", b"BLOB", y]
    assert tensorsets[b"c"][1:] == [b"c", b"FLOAT", b"2", b"BLOB", (a * a).tobytes()]


def _tf_case():
    try:
        with open(DUMPS_PATH) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        pytest.fail(f"cannot read the recorded dumps {DUMPS_PATH}: {e} (set REDISAI_COMPAT_DUMPS)", pytrace=False)
    for c in data["cases"]:
        if c["key"] == "m:tf":
            return c
    pytest.fail(f"recorded case 'm:tf' not found in {DUMPS_PATH}", pytrace=False)


def test_restore_recorded_tf(con):
    case = _tf_case()
    assert con.restore("m:tf", 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    assert con.type("m:tf") == b"AI__MODEL"
    (r,) = case["replies"]
    assert r["cmd"] == ["AI.MODELGET", "m:tf", "META"]
    recorded_meta = recorded_reply(r["reply"])
    assert con.execute_command("AI.MODELGET", "m:tf", "META") == recorded_meta
    assert recorded_meta == tf_meta(tag=b"v1", inputs=["a", "b"], outputs=["c"])
    # the payload is the graph RedisAI was given
    graph = con.execute_command("AI.MODELGET", "m:tf", "BLOB")
    assert graph == bytes.fromhex(case["create"][-1])
    # what it computes: a, b FLOAT placeholders of shape [-1]; c = Identity(a * b)
    nodes = graph_nodes(graph)
    assert [(n["name"], n["op"], n["inputs"]) for n in nodes] == [
        ("a", "Placeholder", []), ("b", "Placeholder", []), ("mul", "Mul", ["a", "b"]),
        ("c", "Identity", ["mul"]), ("Identity", "Identity", ["c"])]
    for n in nodes[:2]:
        assert n["attrs"] == {"shape": ("shape", [-1]), "dtype": ("type", "FLOAT")}, n
    a = np.array([1.5, -2.0, 3.25, 0.0, 1e-3], dtype=np.float32)
    b = np.array([4.0, 0.5, -2.0, 7.0, 1e3], dtype=np.float32)
    want = evaluate(graph, "c", {"a": a, "b": b})
    np.testing.assert_array_equal(want, a * b)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m:tf", ["a", "b"], ["out"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "out", "META") == [b"dtype", b"FLOAT", b"shape", [5]]
    np.testing.assert_array_equal(get_tensor(con, "out"), want)
    # our DUMP of it RESTOREs again, same META and payload, and runs
    payload = con.dump("m:tf")
    assert payload is not None
    assert con.restore("m:tf:copy", 0, payload) == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf:copy", "META", "BLOB") == recorded_meta + [b"blob", graph]
    assert model_execute(con, "m:tf:copy", ["b", "a"], ["out2"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "out2"), b * a)
    assert con.restore("m:tf", 0, payload, replace=True) == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf", "META") == recorded_meta
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.MODELGET", "m:tf:copy", "META", "BLOB") == recorded_meta + [b"blob", graph]


# =================================================================================================
# TORCH


PT_MODELS = {  # key: (file, options, device)
    "t:add": ("torch_add", ["TAG", "add"], "CPU"),
    "t:two": ("torch_two_outputs", [], "cpu:1"),
    "t:lin": ("torch_linear", ["TAG", "lin", "BATCHSIZE", 4, "MINBATCHSIZE", 2, "MINBATCHTIMEOUT", 7], "CPU"),
    "t:int": ("torch_int", [], "CPU:1"),
}


def pt_populate(con):
    for key, (name, opts, dev) in PT_MODELS.items():
        pt_store(con, key, name, *opts, device=dev)
    return snapshot(con, PT_MODELS)


def pt_check_models(con, before):
    """Same META and BLOB as before, fresh AI.INFO entries, all executable with the right results."""
    assert snapshot(con, PT_MODELS) == before
    for k, (name, _, _) in PT_MODELS.items():
        assert before[k][1][17] == pt_blob(name)
        info = ai_info(con, k)
        assert (info["type"], info["backend"], info["device"], info["tag"], info["calls"]) == (
            b"MODEL", b"TORCH", before[k][1][3], before[k][1][5], 0), info
    a = np.array([[1.5, -2.0, 3.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "t:add", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + a)
    assert model_execute(con, "t:two", ["a"], ["p", "q"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "q"), a * 2)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    set_tensor(con, "x", x)
    assert model_execute(con, "t:lin", ["x"], ["y"]) == b"OK"
    np.testing.assert_allclose(get_tensor(con, "y"), weights.linear(x), rtol=1e-6)
    i = np.array([5, -7], dtype=np.int64)
    set_tensor(con, "i", i)
    assert model_execute(con, "t:int", ["i", "i"], ["j"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "j", "VALUES") == [26, 50]


def test_debug_reload_torch(server):
    con = server.client()
    before = pt_populate(con)
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    pt_check_models(con, before)
    # again, from what our own rdb_save wrote after a reload
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.MODELGET", "t:lin", "META", "BLOB") == before["t:lin"][1]


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_rewrite_torch(server):
    con = server.client()
    before = pt_populate(con)
    bgrewriteaof(server, con)
    check_rewritten_stores(server, b"TORCH", PT_MODELS, before, pt_blob)
    server.restart()
    con = server.client()
    pt_check_models(con, before)


def test_replication_torch(make_server, make_replica):
    master = make_server(name="master")
    mcon = master.client()
    pt_store(mcon, "early", "torch_linear", "TAG", "full sync")  # reaches the replica through the RDB
    replica = make_replica(master)
    rcon = replica.client()
    assert rcon.execute_command("AI.MODELGET", "early", "META", "BLOB") == mcon.execute_command(
        "AI.MODELGET", "early", "META", "BLOB")
    # stored after the link is up: replicated verbatim, the replica loads the model itself
    pt_store(mcon, "m", "torch_two_outputs", "TAG", "v1")
    assert mcon.execute_command("AI.MODELSET", "old", "TORCH", "CPU:1", "BLOB", pt_blob("torch_add")) == b"OK"
    wait_replicas(mcon)
    for k in ("m", "old"):
        assert rcon.execute_command("AI.MODELGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.MODELGET", k, "META", "BLOB")
        assert ai_info(rcon, k)["calls"] == 0
    # executions: the outputs reach the replica as tensors; the models are not run there
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    set_tensor(mcon, "x", x)
    assert model_execute(mcon, "m", ["x"], ["p", "q"]) == b"OK"
    assert model_execute(mcon, "early", ["x"], ["y"]) == b"OK"
    assert mcon.execute_command("AI.MODELRUN", "old", "INPUTS", "x", "x", "OUTPUTS", "s") == b"OK"
    wait_replicas(mcon)
    for k in ("p", "q", "y", "s"):
        assert rcon.execute_command("AI.TENSORGET", k, "META", "BLOB") == mcon.execute_command(
            "AI.TENSORGET", k, "META", "BLOB"), k
    np.testing.assert_array_equal(get_tensor(rcon, "q"), x * 2)
    np.testing.assert_allclose(get_tensor(rcon, "y"), weights.linear(x), rtol=1e-5, atol=1e-6)
    for k in ("m", "early", "old"):
        assert ai_info(rcon, k)["calls"] == 0
    # MODELDEL is replicated
    assert mcon.execute_command("AI.MODELDEL", "m") == b"OK"
    wait_replicas(mcon)
    assert rcon.exists("m") == 0
    assert sorted(rcon.execute_command("AI._MODELSCAN")) == sorted(mcon.execute_command("AI._MODELSCAN"))


def test_restore_recorded_torch(con):
    case = need_case("m:torch")
    recorded = bytes.fromhex(case["dump_hex"])
    assert con.restore("m:torch", 0, recorded) == b"OK"
    assert con.type("m:torch") == b"AI__MODEL"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    model_blob = recorded_create(case)[-1]
    assert con.execute_command("AI.MODELGET", "m:torch", "BLOB") == model_blob
    meta = con.execute_command("AI.MODELGET", "m:torch", "META")
    assert meta[11] == [b"a", b"b"] and meta[13] == [b""]
    rng = np.random.default_rng(12)
    a = rng.standard_normal((2, 5)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m:torch", ["a", "b"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a + b)
    info = ai_info(con, "m:torch")
    assert (info["backend"], info["tag"], info["calls"], info["errors"], info["samples"]) == (b"TORCH", b"v1", 1, 0, 2)
    # our DUMP carries RedisAI's payload; storing the recorded command gives the same payload too
    assert payload_body(con.dump("m:torch")) == payload_body(recorded)
    assert con.execute_command(*recorded_create(case)) == b"OK"
    assert payload_body(con.dump("m:torch")) == payload_body(recorded)
    # and it survives a reload
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    for r in case["replies"]:
        assert con.execute_command(*r["cmd"]) == recorded_reply(r["reply"]), r["cmd"]
    assert model_execute(con, "m:torch", ["b", "a"], ["c2"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c2"), b + a)


# =================================================================================================
# TFLITE


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_persistence_tflite(server):
    con = server.client()
    tfl_store(con, "m", "sub_mul", "TAG", "t", "BATCHSIZE", 4)
    tfl_store(con, "i", "int", device="CPU:1")
    before = {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in ("m", "i")}
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    bgrewriteaof(server, con)
    stores = {c[1]: c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"}
    assert stores[b"m"][:4] == [b"AI.MODELSTORE", b"m", b"TFLITE", b"CPU"], stores[b"m"]
    server.restart()
    con = server.client()
    assert {k: con.execute_command("AI.MODELGET", k, "META", "BLOB") for k in before} == before
    a, b = ab(2)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["d", "p"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "d"), a - b)
