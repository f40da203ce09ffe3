"""Model admission of ONNX and TFLITE models (src/admission/onnx.rs, src/admission/tflite.rs): a client that may
store a model must not make the server read its files or load code.

Every attack is reproduced against a real server and refused, and nothing is read: `secret.txt`, a file with
known bytes in the server's working directory (its `dir`, where ONNX Runtime resolves a relative external-data
`location`, `../` included: checked by hand against onnxruntime 1.31.1, which then returns the file's bytes as
the tensor), is watched with inotify, so that any open or read of it by the server fails the test. Each ONNX
model also exists in a harmless twin with the same bytes inline, which stores and runs (so the refusal is about
the external data, not a broken model).

Also refused: ONNX Runtime's EPContext (reads the file its ep_cache_context names), ATen, custom-op domains, the
`ort_config` metadata entry, ORT-format blobs, a model-local function that calls itself; TFLITE models with
select-TF (Flex) or other custom ops.

A refused model that arrives through RESTORE, an RDB, a replica's sync or an AOF (with or without an RDB
preamble) is kept with its bytes (no data is lost) but never runs: AI.MODELEXECUTE replies the refusal,
AI.MODELGET BLOB gives the original bytes. The refusal of external data is sent as RedisAI sent it (ONNX
Runtime's text, without `ERR `).
"""

import os

import numpy as np
import onnx
import pytest
import redis
from onnx import TensorProto, helper

from helpers.aof import aof_commands, bgrewriteaof
from helpers.checks import check_error, check_error_raw
from helpers.data import DATA_DIR as DATA
from helpers.onnx_models import blob, get_tensor, model_execute, set_tensor, store
from helpers.watch import watched_secret
from test_dropin import model_payload

EXTERNAL = "Initializer tensors with external data is not allowed."
SECRET = b"redisai-rs admission test: TOP SECRET 4242"
N = len(SECRET)
ONNX, TFLITE = 3, 1  # backend codes in RDB payloads


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


def no_secret_anywhere(con):
    """No key holds the secret's bytes (tensors read back with TENSORGET BLOB, other values with DUMP)."""
    for key in con.scan_iter(count=1000):
        if con.type(key) == b"AI_TENSOR":
            assert SECRET not in con.execute_command("AI.TENSORGET", key, "BLOB"), key
        elif con.type(key) != b"AI__MODEL":  # a model's DUMP holds its own bytes (a location, not the data)
            assert SECRET not in (con.dump(key) or b""), key


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


def assert_kept_not_run(con, key, evil, error=EXTERNAL, backend=b"ONNX", names=([b"x"], [b"y"])):
    """`names`: what META reports (an AOF's AI.MODELSTORE of an ONNX model carries none, and a refused model never
    reached the backend that would report them)."""
    assert con.execute_command("AI.MODELGET", key, "BLOB") == evil
    meta = con.execute_command("AI.MODELGET", key, "META")
    meta = dict(zip(meta[::2], meta[1::2]))
    assert (meta[b"backend"], meta[b"inputs"], meta[b"outputs"]) == (backend, *names)
    set_tensor(con, "zeros", np.zeros(N, dtype=np.uint8), "UINT8")
    check_error(con, error, "AI.MODELEXECUTE", key, "INPUTS", 1, "zeros", "OUTPUTS", 1, "out")
    check_error(con, error, "AI.MODELRUN", key, "INPUTS", "zeros", "OUTPUTS", "out")
    # a DAG replies per op: the error, then NA for the TENSORGET that had nothing to read
    reply = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "zeros", "|>", "AI.MODELEXECUTE", key, "INPUTS", 1,
                                "zeros", "OUTPUTS", 1, "out", "|>", "AI.TENSORGET", "out", "BLOB")
    assert [str(reply[0]), reply[1]] == [error, b"NA"], reply
    assert con.exists("out") == 0
    no_secret_anywhere(con)


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


# -------------------------------------------------------------------------------------------------
# TFLITE


def tflite(name):
    return (DATA / f"{name}.tflite").read_bytes()


FLEX = ("TFLITE model refused: operator code 0 is the select-TF (Flex) op 'FlexReadFile': Flex ops are not allowed "
        "(they would run TensorFlow kernels such as ReadFile)")
CUSTOM = ("TFLITE model refused: operator code 0 is the custom op 'MyCustomOp': custom ops are not allowed "
          "(no custom-op libraries)")


def test_tflite_custom_ops_refused_at_store(con):
    for name, error in (("tflite_flex_op", FLEX), ("tflite_custom_op", CUSTOM)):
        check_error(con, error, "AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", tflite(name))
        check_error(con, error, "AI.MODELSET", "m", "TFLITE", "CPU", "BLOB", tflite(name))
    assert con.exists("m") == 0


def test_tflite_restore_keeps_refused_model(con):
    evil = tflite("tflite_flex_op")
    assert con.restore("flex", 0, model_payload(4, TFLITE, "CPU", evil, inputs=["x"], outputs=["y"])) == b"OK"
    assert_kept_not_run(con, "flex", evil, error=FLEX, backend=b"TFLITE")


# -------------------------------------------------------------------------------------------------
# legitimate models still store and run


LEGIT_ONNX = sorted(p.stem for p in DATA.glob("*.onnx"))
LEGIT_TFLITE = sorted(p.stem for p in DATA.glob("*.tflite") if "custom" not in p.stem and "flex" not in p.stem)


@pytest.mark.parametrize("name", LEGIT_ONNX)
def test_committed_onnx_models_store(con, name):
    assert con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob(name)) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == blob(name)


@pytest.mark.parametrize("name", LEGIT_TFLITE)
def test_committed_tflite_models_store(con, name):
    assert con.execute_command("AI.MODELSTORE", "m", "TFLITE", "CPU", "BLOB", tflite(name)) == b"OK"


def test_legitimate_models_run(con):
    store(con, "mul", "mul")
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    assert model_execute(con, "mul", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * a)
    assert con.execute_command("AI.MODELSTORE", "t", "TFLITE", "CPU", "BLOB", tflite("tflite_int")) == b"OK"
    x = np.array([[1, 1, 1]], dtype=np.int32)
    set_tensor(con, "x", x)
    assert model_execute(con, "t", ["x"], ["y"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), x + np.array([1, 2, 3], dtype=np.int32))
