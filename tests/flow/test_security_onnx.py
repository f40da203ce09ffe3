"""ONNX model admission and the ONNX memory bound (src/admission/onnx.rs; docs/security.md): a client that may store
a model must not make the server read its files, load code, or allocate what a request asks for.

Every attack is reproduced against a real server and refused, and nothing is read: `secret.txt`, a file with
known bytes in the server's working directory (its `dir`, where ONNX Runtime resolves a relative external-data
`location`, `../` included: checked by hand against onnxruntime 1.31.1, which then returns the file's bytes as
the tensor), is watched with inotify, so that any open or read of it by the server fails the test. Each ONNX
model also exists in a harmless twin with the same bytes inline, which stores and runs (so the refusal is about
the external data, not a broken model).

Also refused: ONNX Runtime's EPContext (reads the file its ep_cache_context names), ATen, custom-op domains, the
`ort_config` metadata entry, ORT-format blobs, a model-local function that calls itself.

A refused model that arrives through RESTORE, an RDB, a replica's sync or an AOF (with or without an RDB
preamble) is kept with its bytes (no data is lost) but never runs: AI.MODELEXECUTE replies the refusal,
AI.MODELGET BLOB gives the original bytes. The refusal of external data is sent as RedisAI sent it (ONNX
Runtime's text, without `ERR `).

Memory: BACKEND_MEMORY_LIMIT (MB) holds ONNX Runtime's memory, and without it a default bound does; a model that
asks for more than the bound (ConstantOfShape sized by its input) fails that run only, and Redis keeps its data.
"""

import os
import time

import numpy as np
import onnx
import pytest
import redis
from onnx import TensorProto, helper

from helpers.admission import EXTERNAL, N, SECRET, assert_kept_not_run, no_secret_anywhere
from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import check_error, check_error_raw
from helpers.data import DATA_DIR as DATA
from helpers.onnx_models import (big_model, blob, get_tensor, make_model, model_execute, modules_sections, set_tensor,
                                 store)
from helpers.rdb import model_payload
from helpers.watch import watched_secret

ONNX = 3  # the backend code in RDB payloads


# -------------------------------------------------------------------------------------------------
# watching secret.txt


@pytest.fixture
def secret(shared_server):
    """secret.txt in the shared server's working directory, watched; the test fails if the server touched it."""
    yield from _secret_in(shared_server)


@pytest.fixture
def server_secret(server):
    """The same in the test's own server (`server` fixture)."""
    yield from _secret_in(server)


def _secret_in(srv):
    return watched_secret(srv, SECRET)


# -------------------------------------------------------------------------------------------------
# ONNX models: y = x + w (x, y, w: UINT8 [N]) with `w` in every place a tensor can be; `external` gives
# `w` as `location: secret.txt`, otherwise its bytes are inline (the harmless twin).


def weight(name="w", external=True, location="secret.txt"):
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.UINT8
    t.dims.append(N)
    if external:
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", "0"), ("length", str(N))):
            e = t.external_data.add()
            e.key, e.value = k, v
    else:
        t.raw_data = SECRET
    return t


def vi(name):
    return helper.make_tensor_value_info(name, TensorProto.UINT8, [N])


def onnx_model(nodes, inits=(), sparse=(), functions=(), domains=(), **graph):
    g = helper.make_graph(nodes, "g", [vi("x")], [vi("y")], initializer=list(inits), sparse_initializer=list(sparse),
                          **graph)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m.SerializeToString()


def add():
    return helper.make_node("Add", ["x", "w"], ["y"])


def true_const(name="cond"):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.BOOL, [], [True]))


def m_initializer(external=True, location="secret.txt"):
    return onnx_model([add()], inits=[weight(external=external, location=location)])


def m_constant(external=True):
    return onnx_model([helper.make_node("Constant", [], ["w"], value=weight(external=external)), add()])


def m_sparse_initializer(external=True):
    indices = helper.make_tensor("w_indices", TensorProto.INT64, [N], list(range(N)))
    sparse = helper.make_sparse_tensor(weight("w", external), indices, [N])
    return onnx_model([add()], sparse=[sparse])


def _if(then_graph, out="y", cond="cond"):
    other = helper.make_graph([helper.make_node("Identity", ["x"], [f"e_{out}"])], "else", [], [vi(f"e_{out}")])
    return helper.make_node("If", [cond], [out], then_branch=then_graph, else_branch=other)


def m_if(external=True, levels=1):
    """If(true) whose then-branch (nested `levels` deep) holds `w` as its own initializer."""
    body = helper.make_graph([add()], "then", [], [vi("y")], initializer=[weight(external=external)])
    for level in range(1, levels):
        inner = [true_const(f"cond{level}"), _if(body, f"y{level}", f"cond{level}"),
                 helper.make_node("Identity", [f"y{level}"], [f"z{level}"])]
        body = helper.make_graph(inner, f"then{level}", [], [vi(f"z{level}")])
    return onnx_model([true_const(), _if(body)])


def m_loop(external=True):
    """Loop(1 iteration) whose body adds `w`, an initializer of the body."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "w"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []), vi("v_in")],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), vi("v_out")],
        initializer=[weight(external=external)])
    trip = helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TensorProto.INT64, [], [1]))
    return onnx_model([trip, true_const(), helper.make_node("Loop", ["n", "cond", "x"], ["y"], body=body)])


def m_function(external=True):
    """A model-local function Leak(X) = X + w, w a Constant of its body."""
    fn = helper.make_function(
        "local.fn", "Leak", ["X"], ["Y"],
        [helper.make_node("Constant", [], ["w"], value=weight(external=external)),
         helper.make_node("Add", ["X", "w"], ["Y"])],
        [helper.make_opsetid("", 17)])
    return onnx_model([helper.make_node("Leak", ["x"], ["y"], domain="local.fn")], functions=[fn],
                      domains=["local.fn"])


EXTERNAL_MODELS = {
    "initializer": m_initializer,
    "constant-attribute": m_constant,
    "sparse-initializer": m_sparse_initializer,
    "if-subgraph": m_if,
    "if-in-if-subgraph": lambda external=True: m_if(external, levels=2),
    "loop-body": m_loop,
    "local-function": m_function,
}


def run_twin(con, key):
    set_tensor(con, "zeros", np.zeros(N, dtype=np.uint8), "UINT8")
    assert model_execute(con, key, ["zeros"], ["out"]) == b"OK"
    return get_tensor(con, "out").tobytes()


# -------------------------------------------------------------------------------------------------
# ONNX: refused at store


@pytest.mark.parametrize("where", list(EXTERNAL_MODELS))
def test_external_data_refused_at_store(con, secret, where):
    make = EXTERNAL_MODELS[where]
    evil = make()
    check_error(con, EXTERNAL, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", evil)
    check_error(con, EXTERNAL, "AI.MODELSET", "m", "ONNX", "CPU", "BLOB", evil)
    # the same bytes in chunks
    check_error(con, EXTERNAL, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", evil[:40], evil[40:])
    assert con.exists("m") == 0
    # the twin with the bytes inline is a valid model: it stores and runs (and shows what would have leaked)
    assert con.execute_command("AI.MODELSTORE", "twin", "ONNX", "CPU", "BLOB", make(external=False)) == b"OK"
    assert run_twin(con, "twin") == SECRET
    con.delete("twin", "out", "zeros")
    no_secret_anywhere(con)


def test_external_data_path_escapes_refused(con, secret):
    """`../<dir>/secret.txt` (ONNX Runtime 1.31 follows it) and other locations: refused all the same."""
    d = os.path.basename(os.path.dirname(secret))
    for location in (f"../{d}/secret.txt", "../../../../../../etc/hostname", "/etc/hostname",
                     "*/_ORT_MEM_ADDR_/*", "secret.txt\0"):
        check_error(con, EXTERNAL, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", m_initializer(location=location))
    assert con.exists("m") == 0


def test_onnx_ops_that_reach_outside_refused(con, secret):
    def one_node(node, domain):
        return onnx_model([node], domains=[domain])

    ep = helper.make_node("EPContext", ["x"], ["y"], name="ctx", domain="com.microsoft", embed_mode=0,
                          ep_cache_context="secret.txt", source="QNN")
    check_error(con, "ONNX model refused: node 'ctx' uses op EPContext, which may read files",
                "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", one_node(ep, "com.microsoft"))
    custom = helper.make_node("ReadFile", ["x"], ["y"], name="rf", domain="my.custom.ops")
    check_error(con, "ONNX model refused: node 'rf' uses op 'ReadFile' of domain 'my.custom.ops', which ONNX Runtime "
                     "does not implement (no custom-op libraries)",
                "AI.MODELSET", "m", "ONNX", "CPU", "BLOB", one_node(custom, "my.custom.ops"))
    aten = helper.make_node("ATen", ["x"], ["y"], name="a", domain="com.microsoft", operator="add")
    check_error(con, "ONNX model refused: node 'a' uses op ATen, which calls into PyTorch",
                "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", one_node(aten, "com.microsoft"))
    # ONNX Runtime takes session options (profiling files, threads) from this entry under ORT_LOAD_CONFIG_FROM_MODEL
    m = onnx.load_from_string(m_initializer(external=False))
    helper.set_model_props(m, {"ort_config": '{"session_options": {"enable_profiling": 1}}'})
    check_error(con, "ONNX model refused: metadata 'ort_config' would set ONNX Runtime's session options",
                "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", m.SerializeToString())
    # the ORT flatbuffer format, which this check does not read
    check_error(con, "ONNX model refused: ORT format models are not allowed (only ONNX protobuf models)",
                "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", b"\x10\x00\x00\x00ORTM" + bytes(64))
    assert con.exists("m") == 0
    # contrib ops of com.microsoft and the ML domain still load
    fused = helper.make_node("Gelu", ["f"], ["g"], domain="com.microsoft")
    g = helper.make_graph([fused], "g", [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2])])
    ok = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    ok.ir_version = 8
    assert con.execute_command("AI.MODELSTORE", "gelu", "ONNX", "CPU", "BLOB", ok.SerializeToString()) == b"OK"


def test_unparsable_onnx_left_to_onnx_runtime(con):
    """What is not a protobuf ONNX Runtime refuses itself, with its own text (as RedisAI replied)."""
    for bad in (b"not an onnx model", b"\x08\x08\x12\x00garbage" * 3):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", bad)
        assert str(e.value) == "Failed to load model because protobuf parsing failed.", str(e.value)


# -------------------------------------------------------------------------------------------------
# ONNX: RESTORE, RDB and AOF keep a refused model but never run it


def restore_evil(con, key="evil", make=m_initializer):
    evil = make()
    payload = model_payload(4, ONNX, "CPU", evil, inputs=["x"], outputs=["y"])
    assert con.restore(key, 0, payload) == b"OK"
    return evil


def test_restore_keeps_refused_model_without_running_it(con, secret):
    for where in ("initializer", "if-subgraph", "local-function"):
        evil = restore_evil(con, where, EXTERNAL_MODELS[where])
        assert_kept_not_run(con, where, evil)
        # DUMP gives it back as it came; RESTORE of that is refused the same way
        assert con.restore("copy", 0, con.dump(where), replace=True) == b"OK"
        assert_kept_not_run(con, "copy", evil)


def test_rdb_reload_and_restart_keep_refused_model(server, server_secret):
    con = server.client()
    evil = restore_evil(con)
    store(con, "good", "mul")
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert_kept_not_run(con, "evil", evil)
    assert con.save() is True
    server.restart()
    con = server.client()
    assert_kept_not_run(con, "evil", evil)
    assert "Initializer tensors with external data is not allowed" in server.log()
    # the legitimate model beside it runs
    a = np.array([[2.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "good", ["a", "a"], ["c"]) == b"OK"
    assert get_tensor(con, "c").tolist() == [[4.0]]


@pytest.mark.server_args("--appendonly", "yes")
def test_aof_with_rdb_preamble_keeps_refused_model(server, server_secret):
    con = server.client()
    evil = restore_evil(con)
    bgrewriteaof(server, con)
    server.restart()
    con = server.client()
    assert_kept_not_run(con, "evil", evil)


def test_replica_keeps_refused_model(make_server, make_replica):
    """A RESTOREd refused model reaches a replica by full sync (RDB) and by the command stream (RESTORE): kept
    there too, its bytes intact, and neither server reads the file."""
    master = make_server(name="master")
    watches = [_secret_in(master)]
    next(watches[0])
    con = master.client()
    evil = restore_evil(con, "before-sync")
    replica = make_replica(master)
    watches.append(_secret_in(replica))
    next(watches[1])
    evil2 = restore_evil(con, "streamed", m_loop)
    assert con.wait(1, 10000) == 1
    rcon = replica.client()
    assert rcon.execute_command("AI.MODELGET", "before-sync", "BLOB") == evil
    assert rcon.execute_command("AI.MODELGET", "streamed", "BLOB") == evil2
    assert "Initializer tensors with external data is not allowed" in replica.log()
    for w in watches:
        next(w, None)


def _rewrite_without_preamble(server):
    """A refused model RESTOREd, the AOF replayed, then rewritten: the base AOF holds it as AI.MODELSTORE."""
    con = server.client()
    evil = restore_evil(con)
    assert [c[0].upper() for c in aof_commands(server, "incr")].count(b"RESTORE") == 1
    server.restart()  # replays the RESTORE: kept, not run
    con = server.client()
    assert_kept_not_run(con, "evil", evil)
    bgrewriteaof(server, con)
    (cmd,) = [c for c in aof_commands(server, "base") if c[0].upper() == b"AI.MODELSTORE"]
    assert b"".join(cmd[cmd.index(b"BLOB") + 1:]) == evil
    server.restart()
    return server.client(), evil


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_modelstore_of_refused_model_never_runs(server, server_secret):
    """Loading that AI.MODELSTORE runs the admission check again: refused before ONNX Runtime sees the model."""
    con, evil = _rewrite_without_preamble(server)
    assert "Initializer tensors with external data is not allowed" in server.log()
    assert_kept_not_run(con, "evil", evil, names=([], []))
    no_secret_anywhere(con)


@pytest.mark.server_args("--appendonly", "yes", "--aof-use-rdb-preamble", "no")
def test_aof_modelstore_of_refused_model_is_kept(server, server_secret):
    con, evil = _rewrite_without_preamble(server)
    assert_kept_not_run(con, "evil", evil, names=([], []))


def test_external_data_wire_text_is_redisais(con, secret):
    port = con.connection_pool.connection_kwargs["port"]
    check_error_raw(port, EXTERNAL, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", m_initializer())


# -------------------------------------------------------------------------------------------------
# ONNX: a model-local function that calls itself (ONNX Runtime expands a call by recursing into the body)


def m_recursive_function():
    """Rec(X) = Rec(X) + X: a model-local function whose body calls itself; the graph calls it."""
    fn = helper.make_function(
        "local.fn", "Rec", ["X"], ["Y"],
        [helper.make_node("Rec", ["X"], ["R"], domain="local.fn"), helper.make_node("Add", ["R", "X"], ["Y"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)])
    return onnx_model([helper.make_node("Rec", ["x"], ["y"], domain="local.fn")], functions=[fn],
                      domains=["local.fn"])


RECURSIVE = ("ONNX model refused: function 'Rec' of domain 'local.fn' calls itself (Rec -> Rec): recursive "
             "functions are not allowed")


def test_recursive_local_function_refused(con):
    set_tensor(con, "keep", np.arange(N, dtype=np.uint8), "UINT8")
    evil = m_recursive_function()
    check_error(con, RECURSIVE, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", evil)
    check_error(con, RECURSIVE, "AI.MODELSET", "m", "ONNX", "CPU", "BLOB", evil)
    assert con.exists("m") == 0
    assert con.ping()
    assert get_tensor(con, "keep").tolist() == list(range(N))
    # through RESTORE: kept with its bytes, never run
    restore_evil(con, "rec", m_recursive_function)
    assert_kept_not_run(con, "rec", evil, error=RECURSIVE)
    assert con.ping()
    assert get_tensor(con, "keep").tolist() == list(range(N))


def m_fanout(levels):
    """F0 calls F1 twice (and sums), ..., F(levels-1) is x + x: 2^(levels-1) calls of local functions from a few KB.
    Once expanded the calls bring in 4 * 2^(levels-1) - 3 nodes: 16,381 at 13 levels, within the bound (16,384),
    32,765 at 14 (ONNX Runtime took 4 s inlining those, 15 s at 15 levels, minutes at 16)."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local.fn", 1)]
    fns = [helper.make_function("local.fn", f"F{levels - 1}", ["X"], ["Y"], [helper.make_node("Add", ["X", "X"], ["Y"])],
                                opsets)]
    for i in range(levels - 2, -1, -1):
        fns.append(helper.make_function("local.fn", f"F{i}", ["X"], ["Y"], [
            helper.make_node(f"F{i + 1}", ["X"], ["A"], domain="local.fn"),
            helper.make_node(f"F{i + 1}", ["X"], ["B"], domain="local.fn"),
            helper.make_node("Add", ["A", "B"], ["Y"])], opsets))
    fvi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    g = helper.make_graph([helper.make_node("F0", ["x"], ["y"], domain="local.fn")], "g", [fvi("x")], [fvi("y")])
    m = helper.make_model(g, opset_imports=opsets, functions=fns)
    m.ir_version = 8
    return m.SerializeToString()


FANOUT = ("ONNX model refused: function 'F0' of domain 'local.fn' calls local functions that expand to more than 16384 "
          "nodes (the calls fan out)")


def test_local_function_fanout_bound(con):
    x = np.array([1.0, -2.5], dtype=np.float32)
    set_tensor(con, "x", x)
    assert con.execute_command("AI.MODELSTORE", "ok", "ONNX", "CPU", "BLOB", m_fanout(13)) == b"OK"
    assert model_execute(con, "ok", ["x"], ["y"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), x * 2 ** 13)
    check_error(con, FANOUT, "AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", m_fanout(14))
    t0 = time.monotonic()
    with pytest.raises(redis.ResponseError, match="calls local functions that expand to more than 16384 nodes"):
        con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", m_fanout(24))
    assert time.monotonic() - t0 < 1, "refused before ONNX Runtime expands anything"
    assert con.exists("m") == 0
    # RESTORE (and RDB load) keeps it and never builds it: running it replies the refusal
    restore_evil(con, "rec", lambda: m_fanout(14))
    check_error(con, FANOUT, "AI.MODELEXECUTE", "rec", "INPUTS", 1, "x", "OUTPUTS", 1, "out")
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_error(con, FANOUT, "AI.MODELEXECUTE", "rec", "INPUTS", 1, "x", "OUTPUTS", 1, "out")
    assert con.exists("out") == 0
    np.testing.assert_array_equal(get_tensor(con, "x"), x)


# -------------------------------------------------------------------------------------------------
# legitimate models still store and run


LEGIT_ONNX = sorted(p.stem for p in DATA.glob("*.onnx"))


@pytest.mark.parametrize("name", LEGIT_ONNX)
def test_committed_onnx_models_store(con, name):
    assert con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob(name)) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob(name)


def test_legitimate_models_run(con):
    store(con, "mul", "mul")
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "mul", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * a)


# -------------------------------------------------------------------------------------------------
# the memory bound: BACKEND_MEMORY_LIMIT


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "1")
def test_backend_memory_limit(server):
    """BACKEND_MEMORY_LIMIT (MB) holds ONNX Runtime's memory: a run or a session that needs more fails with
    RedisAI's error, and the server goes on serving (what fits still runs)."""
    con = server.client()
    fields = dict(dict(modules_sections(server))["ai_load_time_configs"])
    assert fields["ai_backend_memory_limit"] == "1", fields
    store(con, "m", "mul")
    set_tensor(con, "small", np.ones((2, 2), dtype=np.float32))
    set_tensor(con, "big", np.ones((600, 600), dtype=np.float32))  # 1.44 MB output
    assert model_execute(con, "m", ["small", "small"], ["c"]) == b"OK"
    check_error(con, "Onnxruntime memory limit exceeded, memory allocation failed.",
                "AI.MODELEXECUTE", "m", "INPUTS", 2, "big", "big", "OUTPUTS", 1, "c2")
    assert con.exists("c2") == 0
    blob_, _, _ = big_model(n=600)  # 2 x 1.44 MB of initializers
    check_error(con, "Exception during initialization: Onnxruntime memory limit exceeded, memory allocation failed.",
                "AI.MODELSTORE", "bigm", "ONNX", "CPU", "BLOB", blob_)
    assert con.exists("bigm") == 0
    assert model_execute(con, "m", ["small", "small"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"1", b"1", b"1", b"1"]
    assert int(dict(dict(modules_sections(server))["ai_backends_info"])["ai_onnxruntime_memory"]) < 1_000_000


# -------------------------------------------------------------------------------------------------
# the memory bound: runaway memory


def refused(fn, *args):
    with pytest.raises(redis.ResponseError) as e:
        fn(*args)
    return str(e.value)


def constant_of_shape_model():
    """y = ConstantOfShape(shape): 1 KB that asks for as much memory as its input says."""
    return make_model([helper.make_node("ConstantOfShape", ["shape"], ["y"])],
                      [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])


def test_onnx_memory_bomb_fails_and_redis_keeps_its_data(server):
    c = server.client()
    c.set("keep", "data")
    c.execute_command("AI.MODELSTORE", "bomb", "ONNX", "CPU", "BLOB", constant_of_shape_model())
    # 4e11 bytes: far more than any test machine has, refused by the default bound before it is allocated.
    set_tensor(c, "shape", np.array([100_000_000_000], dtype=np.int64))
    err = refused(c.execute_command, "AI.MODELEXECUTE", "bomb", "INPUTS", 1, "shape", "OUTPUTS", 1, "y")
    assert "memory" in err.lower(), err
    assert c.get("keep") == b"data"
    assert c.ping()
    # The model still serves requests that fit.
    set_tensor(c, "shape", np.array([4], dtype=np.int64))
    c.execute_command("AI.MODELEXECUTE", "bomb", "INPUTS", 1, "shape", "OUTPUTS", 1, "y")
    assert get_tensor(c, "y").tolist() == [0.0] * 4
    bound = int(server.info("modules")["ai_backend_memory_bound"])
    assert bound > 0


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "100", "THREADS_PER_QUEUE", "2", "INLINE_THRESHOLD", "0")
def test_onnx_refusal_fails_only_the_run_that_was_refused(server):
    """The bound's refusals are counted for the process: a run that succeeds while another run's allocation is
    refused must not fail for it (two workers: the bomb and a legitimate model run side by side)."""
    import threading

    c = server.client()
    c.execute_command("AI.MODELSTORE", "bomb", "ONNX", "CPU", "BLOB", constant_of_shape_model())
    c.execute_command("AI.MODELSTORE", "mm", "ONNX", "CPU", "BLOB", big_model(n=512)[0])
    set_tensor(c, "shape", np.array([50_000_000], dtype=np.int64))  # 200 MB > 100 MB
    set_tensor(c, "x", np.ones((64, 512), dtype=np.float32))
    stop = threading.Event()
    bomb_errors = []

    def bomb():
        b = server.client()
        while not stop.is_set():
            bomb_errors.append(refused(b.execute_command, "AI.MODELEXECUTE", "bomb", "INPUTS", 1, "shape",
                                       "OUTPUTS", 1, "y"))

    t = threading.Thread(target=bomb)
    t.start()
    failures = []
    try:
        deadline = time.monotonic() + 3
        runs = 0
        while time.monotonic() < deadline:
            runs += 1
            try:
                c.execute_command("AI.MODELEXECUTE", "mm", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
            except redis.ResponseError as e:
                failures.append(str(e))
    finally:
        stop.set()
        t.join()
    assert bomb_errors and set(bomb_errors) == {"Onnxruntime memory limit exceeded, memory allocation failed."}
    assert not failures, f"{len(failures)} of {runs} legitimate runs failed: {failures[:3]}"
    assert c.ping()


@pytest.mark.module_args("BACKEND_MEMORY_LIMIT", "100")
def test_onnx_allocation_past_the_configured_limit_is_refused(server):
    c = server.client()
    c.execute_command("AI.MODELSTORE", "bomb", "ONNX", "CPU", "BLOB", constant_of_shape_model())
    set_tensor(c, "shape", np.array([50_000_000], dtype=np.int64))  # 200 MB > 100 MB
    err = refused(c.execute_command, "AI.MODELEXECUTE", "bomb", "INPUTS", 1, "shape", "OUTPUTS", 1, "y")
    assert err == "Onnxruntime memory limit exceeded, memory allocation failed.", err
    set_tensor(c, "shape", np.array([1000], dtype=np.int64))
    c.execute_command("AI.MODELEXECUTE", "bomb", "INPUTS", 1, "shape", "OUTPUTS", 1, "y")
    assert int(server.info("modules")["ai_backend_memory_bound"]) == 100_000_000
