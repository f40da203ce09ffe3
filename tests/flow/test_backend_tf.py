"""The TF backend: frozen TensorFlow GraphDefs run through TensorFlow's C API (docs/commands.md, AI.MODELSTORE and
AI.MODELEXECUTE for TF), with the tiny graphs of tests/data (tests/data/gen_tf.py):

  tf_mul.pb          a, b -> c = a * b            FLOAT, any shape
  tf_dense.pb        x[batch, 4] -> y = x @ W + B  (xw = x @ W inside; the weights of linear.onnx)
  tf_str_identity.pb s -> t                       STRING
  tf_add_int32.pb    a, b -> c = a + b            INT32

The module is loaded with `TF <path>` (REDISAI_TF_LIB, the libtensorflow_cc.so.2 of the tensorflow-cpu 2.21.0
wheel) and `ONNX <path>` (REDISAI_ONNX_LIB) by helpers/server.py. Outputs are checked against numpy, and the
protobuf reader of helpers/tf_models.py (which checks the `m:tf` graph recorded from RedisAI in
test_persistence_model.py) is checked here against the committed graphs.

Elsewhere: TF graphs across RDB, AOF, replication and RESTORE in test_persistence_model.py, TF admission in
test_security_tf.py, TF on GPU devices in test_gpu_errors.py, batching in test_exec_batching.py, concurrent clients
in test_exec_concurrency.py, INFO MODULES in test_observability.py.

Behaviour settled for this module (beyond RedisAI 1.2.7): INPUTS/OUTPUTS names may be `op:index`.
"""

import numpy as np
import pytest
import redis

from helpers.checks import check_error_raw
from helpers.data import weights
from helpers.onnx_models import ai_info, blob, get_tensor, model_execute, modules_sections, set_tensor, store
from helpers.resp import RespError, raw_command
from helpers.server import MODULE_PATH, ONNX_LIB
from helpers.tf_models import GRAPHS, assert_close, evaluate, graph_nodes, io_args, tf_blob, tf_meta, tf_store

BOGUS_TF = "/nonexistent/libtensorflow_cc.so.2"


def values_of(con, key):
    return [float(v) for v in con.execute_command("AI.TENSORGET", key, "VALUES")]


# =================================================================================================
# the protobuf reader and numpy evaluator of helpers/tf_models.py


def test_protobuf_reader_on_committed_graphs():
    """Self-check of the reader and the evaluator on the graphs written by gen_tf.py."""
    mul = graph_nodes(tf_blob("mul"))
    assert [(n["name"], n["op"], n["inputs"]) for n in mul] == [
        ("a", "Placeholder", []), ("b", "Placeholder", []), ("c", "Mul", ["a", "b"])]
    assert mul[0]["attrs"] == {"dtype": ("type", "FLOAT"), "shape": ("shape", None)}
    dense = graph_nodes(tf_blob("dense"))
    assert [(n["name"], n["op"]) for n in dense] == [
        ("x", "Placeholder"), ("W", "Const"), ("B", "Const"), ("xw", "MatMul"), ("y", "AddV2")]
    assert dense[0]["attrs"]["shape"] == ("shape", [-1, 4])
    np.testing.assert_array_equal(dense[1]["attrs"]["value"][1], weights.LINEAR_W)
    np.testing.assert_array_equal(dense[2]["attrs"]["value"][1], weights.LINEAR_B)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert_close(evaluate(tf_blob("dense"), "y", {"x": x}), weights.linear(x))
    a = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(evaluate(tf_blob("mul"), "c:0", {"a": a, "b": a}), a * a)
    assert [n["op"] for n in graph_nodes(tf_blob("str_identity"))] == ["Placeholder", "Identity"]
    add = graph_nodes(tf_blob("add_int32"))
    assert [n["attrs"]["dtype"] for n in add[:2]] == [("type", "INT32")] * 2 and add[2]["op"] == "AddV2"


# =================================================================================================
# AI.MODELSTORE TF: success, META, BLOB


@pytest.mark.parametrize("name", list(GRAPHS))
def test_modelstore_meta_and_blob(con, port, name):
    _, ins, outs = GRAPHS[name]
    assert raw_command(port, "AI.MODELSTORE", "m", "TF", "CPU", *io_args(ins, outs), "BLOB", tf_blob(name)) == "OK"
    expected = tf_meta(inputs=ins, outputs=outs)
    assert con.execute_command("AI.MODELGET", "m", "META") == expected
    got = con.execute_command("AI.MODELGET", "m", "BLOB")
    assert isinstance(got, bytes) and got == tf_blob(name)
    assert con.execute_command("AI.MODELGET", "m") == expected + [b"blob", tf_blob(name)]
    assert con.type("m") == b"AI__MODEL"
    # options, lower-case keywords, a chunked BLOB
    g = tf_blob(name)
    assert con.execute_command("ai.modelstore", "m2", "tf", "cpu:1", "TAG", "t 1", "BATCHSIZE", 4, "MINBATCHSIZE", 2,
                               "inputs", len(ins), *ins, "outputs", len(outs), *outs,
                               "blob", g[:10], g[10:30], g[30:]) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META", "BLOB") == tf_meta(
        device=b"cpu:1", tag=b"t 1", batch=4, minbatch=2, inputs=ins, outputs=outs) + [b"blob", g]


def test_ai_info_as_redisai_s_own_test_reads_it(con):
    """RedisAI's test_tensorflow_modelinfo, in our words: AI.INFO turned into a dict is exactly RedisAI's nine
    fields, before any run, after storing the model again, after each of nine runs and after RESETSTAT."""
    def info():
        r = con.execute_command("AI.INFO", "m{1}")
        return {r[i].decode(): r[i + 1].decode() if isinstance(r[i + 1], bytes) else r[i + 1]
                for i in range(0, len(r), 2)}

    tf_store(con, "m{1}", "mul")
    fresh = {"key": "m{1}", "type": "MODEL", "backend": "TF", "device": "CPU", "tag": "", "duration": 0,
             "samples": 0, "calls": 0, "errors": 0}
    assert info() == fresh
    tf_store(con, "m{1}", "mul")
    assert info() == fresh
    set_tensor(con, "a{1}", np.array([[2, 3], [2, 3]], dtype=np.float32))
    set_tensor(con, "b{1}", np.array([[2, 3], [2, 3]], dtype=np.float32))
    previous = 0
    for call in range(1, 10):
        assert model_execute(con, "m{1}", ["a{1}", "b{1}"], ["c{1}"]) == b"OK"
        now = info()
        assert now.keys() == fresh.keys(), now
        assert now["duration"] > previous, now
        assert (now["samples"], now["calls"], now["errors"]) == (2 * call, call, 0), now
        previous = now["duration"]
    assert con.execute_command("AI.INFO", "m{1}", "RESETSTAT") == b"OK"
    assert info() == fresh


def test_modelstore_tf_parse_errors(con, port):
    """TF's INPUTS / OUTPUTS checks of AI.MODELSTORE, in the order they are made."""
    g = tf_blob("mul")
    cases = [
        (["TAG", "t"], "ERR Insufficient arguments, missing model BLOB"),
        (["BLOB", g], "ERR INPUTS not specified for TF"),
        (["OUTPUTS", 1, "c", "BLOB", g], "ERR INPUTS not specified for TF"),
        (["INPUTS", 0, "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", "x", "a", "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", -1, "a", "BLOB", g], "ERR Invalid argument for input_count"),
        (["INPUTS", 5, "a", "b", "BLOB", g], "ERR number of model inputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "BLOB", g], "ERR OUTPUTS not specified for TF"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 0, "BLOB", g], "ERR Invalid argument for output_count"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", "y", "BLOB", g], "ERR Invalid argument for output_count"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 4, "c", "BLOB", g],
         "ERR number of model outputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1], "ERR number of model outputs does not match the number of given arguments"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "NOTBLOB", g], "ERR Invalid argument, expected BLOB"),
        (["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c", "BLOB"], "ERR Insufficient arguments, missing model BLOB"),
    ]
    for args, msg in cases:
        check_error_raw(port, msg, "AI.MODELSTORE", "m", "TF", "CPU", *args)
    check_error_raw(port, "ERR INPUTS argument should not be specified for this backend",
                    "AI.MODELSTORE", "m", "ONNX", "CPU", "INPUTS", 1, "a", "OUTPUTS", 1, "c", "BLOB", blob("mul"))
    assert con.exists("m") == 0


def test_node_not_found(con, port):
    g = tf_blob("mul")
    check_error_raw(port, 'ERR Input node named "z" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "z"], ["c"]), "BLOB", g)
    # a graph whose output is not named what was asked
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["d"]), "BLOB", g)
    check_error_raw(port, 'ERR Output node named "c" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["x"], ["y", "c"]), "BLOB", tf_blob("dense"))
    # inputs are checked before outputs
    check_error_raw(port, 'ERR Input node named "q" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["q"], ["d"]), "BLOB", g)
    # op:index with an index the op does not have
    check_error_raw(port, 'ERR Input node named "a:1" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a:1", "b"], ["c"]), "BLOB", g)
    check_error_raw(port, 'ERR Output node named "c:1" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c:1"]), "BLOB", g)
    # an empty GraphDef is a valid, empty graph
    check_error_raw(port, 'ERR Input node named "a" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a"], ["c"]), "BLOB", b"")
    assert con.exists("m") == 0
    # a failed store leaves an existing model alone
    tf_store(con, "m", "mul", "TAG", "kept")
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["d"]), "BLOB", g)
    assert con.execute_command("AI.MODELGET", "m", "META") == tf_meta(tag=b"kept", inputs=["a", "b"], outputs=["c"])


def test_input_must_be_a_placeholder(con, port):
    """RedisAI 1.2.7 (src/backends/tensorflow.c, RAI_ModelCreateTF) accepts as input only an op of type
    Placeholder: `oper == NULL || strcmp(TF_OperationOpType(oper), "Placeholder") != 0` -> the not-found error."""
    check_error_raw(port, 'ERR Input node named "c" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["c"], ["c"]), "BLOB", tf_blob("mul"))
    check_error_raw(port, 'ERR Input node named "W" not found in TF graph.',
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["W"], ["y"]), "BLOB", tf_blob("dense"))
    assert con.exists("m") == 0


def test_op_index_names(con):
    """INPUTS/OUTPUTS given as `op:index` are kept as given (META, AOF) and select that output of the op."""
    tf_store(con, "m", "mul", inputs=["a:0", "b:0"], outputs=["c:0"])
    assert con.execute_command("AI.MODELGET", "m", "META") == tf_meta(inputs=["a:0", "b:0"], outputs=["c:0"])
    a = np.array([[1.5, -2.0, 3.0]], dtype=np.float32)
    b = np.array([[2.0, 0.25, -1.0]], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * b)
    # two outputs, one of them an inner node of the graph: x @ W and x @ W + B
    tf_store(con, "d", "dense", outputs=["xw:0", "y"])
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    set_tensor(con, "x", x)
    assert model_execute(con, "d", ["x"], ["xw", "y"]) == b"OK"
    assert_close(get_tensor(con, "xw"), x @ weights.LINEAR_W)
    assert_close(get_tensor(con, "y"), weights.linear(x))


def test_corrupt_graphdef(con, port):
    """TensorFlow's own message comes back verbatim (no ERR prefix); nothing is stored."""
    check_error_raw(port, "Invalid GraphDef",
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c"]), "BLOB", b"\xff\xfe not a graph")
    truncated = tf_blob("dense")[:60]
    check_error_raw(port, "Invalid GraphDef",
                    "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["x"], ["y"]), "BLOB", truncated)
    # a well-formed GraphDef with an op TensorFlow does not know
    bogus = b"\x0a\x0a\x0a\x01z\x12\x05Bogus"
    # An op TensorFlow does not know is refused by admission (docs/security.md) before TensorFlow sees it.
    check_error_raw(port, "ERR TF model refused: node 'z' uses op Bogus, which is not an op of TensorFlow 2.21.0 "
                    "nor a function of the graph", "AI.MODELSTORE", "m", "TF", "CPU", *io_args(["z"], ["z"]), "BLOB",
                    bogus)
    assert con.exists("m") == 0
    assert con.ping()


def test_modelset_deprecated(con, port):
    g = tf_blob("mul")
    assert con.execute_command("AI.MODELSET", "m", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "c", "BLOB", g) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "META", "BLOB") == tf_meta(inputs=["a", "b"], outputs=["c"]) + [
        b"blob", g]
    a = np.array([2.0, 3.0, -4.0], dtype=np.float32)
    set_tensor(con, "a", a)
    assert con.execute_command("AI.MODELRUN", "m", "INPUTS", "a", "a", "OUTPUTS", "c") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * a)
    assert con.execute_command("AI.MODELSET", "m2", "TF", "CPU", "TAG", "old", "INPUTS", "x", "OUTPUTS", "xw", "y",
                               "BLOB", tf_blob("dense")) == b"OK"
    assert con.execute_command("AI.MODELGET", "m2", "META") == tf_meta(tag=b"old", inputs=["x"], outputs=["xw", "y"])
    # the MODELSET-only TF errors (RedisAI's deprecated.c)
    check_error_raw(port, "ERR Insufficient arguments, INPUTS and OUTPUTS not specified",
                    "AI.MODELSET", "m3", "TF", "CPU", "BLOB", g)
    check_error_raw(port, "ERR INPUTS not specified", "AI.MODELSET", "m3", "TF", "CPU", "not_inputs", "BLOB", g)
    check_error_raw(port, "ERR OUTPUTS not specified", "AI.MODELSET", "m3", "TF", "CPU", "INPUTS", "a", "b", "BLOB", g)
    check_error_raw(port, 'ERR Output node named "d" not found in TF graph',
                    "AI.MODELSET", "m3", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "d", "BLOB", g)
    assert con.exists("m3") == 0


# =================================================================================================
# AI.MODELEXECUTE


def test_execute_mul(con):
    tf_store(con, "m", "mul")
    rng = np.random.default_rng(1)
    for shape in [(1,), (7,), (2, 3), (2, 3, 4), ()]:
        a = np.asarray(rng.standard_normal(shape), dtype=np.float32)
        b = np.asarray(rng.standard_normal(shape), dtype=np.float32)
        # (set_tensor would make a scalar 1-D: np.ascontiguousarray returns at least one dimension)
        assert con.execute_command("AI.TENSORSET", "a", "FLOAT", *shape, "BLOB", a.tobytes()) == b"OK"
        assert con.execute_command("AI.TENSORSET", "b", "FLOAT", *shape, "BLOB", b.tobytes()) == b"OK"
        assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
        c = get_tensor(con, "c")
        assert c.shape == shape
        np.testing.assert_array_equal(c, a * b)
    # broadcasting is TensorFlow's
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([10.0, -1.0], dtype=np.float32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"], "TIMEOUT", 10000) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), a * b)
    info = ai_info(con, "m")
    assert (info["backend"], info["calls"], info["errors"]) == (b"TF", 6, 0), info


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_execute_dense(con, batch):
    tf_store(con, "m", "dense")
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    assert model_execute(con, "m", ["x"], ["y"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "META") == [b"dtype", b"FLOAT", b"shape", [batch, 3]]
    assert_close(get_tensor(con, "y"), weights.linear(x))
    assert ai_info(con, "m")["samples"] == batch


def test_execute_str_identity(con):
    tf_store(con, "m", "str_identity")
    values = ["alpha", "", "βeta", "日本語", "x" * 300, ""]
    con.execute_command("AI.TENSORSET", "s", "STRING", 2, 3, "VALUES", *values)
    assert model_execute(con, "m", ["s"], ["t"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"STRING", b"shape", [2, 3]]
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [v.encode() for v in values]
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == b"".join(v.encode() + b"\x00" for v in values)
    # a single empty string
    con.execute_command("AI.TENSORSET", "s1", "STRING", 1, "BLOB", b"\x00")
    assert model_execute(con, "m", ["s1"], ["t1"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t1", "META", "BLOB") == [b"dtype", b"STRING", b"shape", [1],
                                                                         b"blob", b"\x00"]


def test_execute_int32_add(con):
    tf_store(con, "m", "add_int32")
    a = np.array([[1, -2, 3], [2**31 - 1, 0, -(2**31)]], dtype=np.int32)
    b = np.array([[10, 20, -30], [1, 7, 0]], dtype=np.int32)
    set_tensor(con, "a", a)
    set_tensor(con, "b", b)
    assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "META") == [b"dtype", b"INT32", b"shape", [2, 3]]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(get_tensor(con, "c"), a + b)  # int32 wrap-around, as TensorFlow does
    assert con.execute_command("AI.TENSORGET", "c", "VALUES")[:3] == [11, 18, -27]


def test_execute_errors(con, port):
    """Backend errors come back as TensorFlow's message on one line; the server stays up; no output stored."""
    tf_store(con, "m", "mul")
    set_tensor(con, "a", np.ones((2, 2), dtype=np.float32))
    set_tensor(con, "b", np.ones((3,), dtype=np.float32))
    reply = raw_command(port, "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c")
    assert isinstance(reply, RespError), reply
    assert reply.startswith("Incompatible shapes"), reply
    assert "\n" not in reply and "\r" not in reply, repr(reply)
    assert con.exists("c") == 0
    info = ai_info(con, "m")
    assert (info["calls"], info["errors"], info["samples"]) == (1, 1, 0), info
    # the wrong dtype
    tf_store(con, "i", "add_int32")
    with pytest.raises(redis.exceptions.ResponseError) as e:
        model_execute(con, "i", ["a", "a"], ["c"])
    assert "int32" in str(e.value) and "\n" not in str(e.value), str(e.value)
    # the argument counts are checked against the INPUTS/OUTPUTS given at store time
    check_error_raw(port, "Number of keys given as INPUTS here does not match model definition",
                    "AI.MODELEXECUTE", "m", "INPUTS", 1, "a", "OUTPUTS", 1, "c")
    check_error_raw(port, "Number of keys given as OUTPUTS here does not match model definition",
                    "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 2, "c", "d")
    assert con.exists("c") == 0
    # and the model still runs
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c"), np.ones((2, 2), dtype=np.float32))
    assert con.ping()


# =================================================================================================
# DAGs mixing TF and ONNX models on two devices


@pytest.mark.parametrize("tf_dev,onnx_dev", [("CPU", "CPU:1"), ("CPU:1", "CPU")])
def test_dag_tf_and_onnx(con, tf_dev, onnx_dev):
    tf_store(con, "tfdense", "dense", device=tf_dev)
    tf_store(con, "tfmul", "mul", device=tf_dev)
    store(con, "onnxlinear", "linear", device=onnx_dev)  # the same weights as tf_dense
    x = np.random.default_rng(11).standard_normal((6, 4)).astype(np.float32)
    set_tensor(con, "x", x)
    reply = con.execute_command(
        "AI.DAGEXECUTE", "LOAD", 1, "x", "PERSIST", 1, "out",
        "|>", "AI.MODELEXECUTE", "tfdense", "INPUTS", 1, "x", "OUTPUTS", 1, "y1",
        "|>", "AI.MODELEXECUTE", "onnxlinear", "INPUTS", 1, "x", "OUTPUTS", 1, "y2",
        "|>", "AI.MODELEXECUTE", "tfmul", "INPUTS", 2, "y1", "y2", "OUTPUTS", 1, "out",
        "|>", "AI.TENSORGET", "out", "VALUES")
    assert reply[:3] == [b"OK", b"OK", b"OK"], reply
    want = weights.linear(x) * weights.linear(x)
    np.testing.assert_allclose(np.array([float(v) for v in reply[3]]).reshape(6, 3), want, rtol=1e-5, atol=1e-6)
    assert con.execute_command("AI.TENSORGET", "out", "META") == [b"dtype", b"FLOAT", b"shape", [6, 3]]
    np.testing.assert_allclose(get_tensor(con, "out"), want, rtol=1e-5, atol=1e-6)
    assert con.exists("y1") == 0 and con.exists("y2") == 0
    for k in ("tfdense", "tfmul", "onnxlinear"):
        info = ai_info(con, k)
        assert (info["calls"], info["errors"]) == (1, 0), (k, info)
    # a TF error inside the DAG is that op's reply; nothing is persisted
    set_tensor(con, "bad", np.ones((2, 5), dtype=np.float32))
    ret = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "bad", "PERSIST", 1, "out2",
                              "|>", "AI.MODELEXECUTE", "tfdense", "INPUTS", 1, "bad", "OUTPUTS", 1, "out2",
                              "|>", "AI.TENSORGET", "out2", "META")
    assert len(ret) == 2 and isinstance(ret[0], redis.exceptions.ResponseError), ret
    assert "\n" not in str(ret[0]), str(ret[0])
    assert ret[1] == b"NA", ret
    assert con.exists("out2") == 0


# =================================================================================================
# thread options


@pytest.mark.module_args("INTRA_OP_PARALLELISM", "1", "INTER_OP_PARALLELISM", "1", "THREADS_PER_QUEUE", "2")
def test_intra_inter_op_parallelism_one(server):
    fields = dict(dict(modules_sections(server))["ai_load_time_configs"])
    assert (fields["ai_intra_op_parallelism"], fields["ai_inter_op_parallelism"]) == ("1", "1"), fields
    con = server.client()
    tf_store(con, "d", "dense")
    tf_store(con, "m", "mul", device="CPU:1")
    for batch in (1, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        set_tensor(con, "x", x)
        assert model_execute(con, "d", ["x"], ["y"]) == b"OK"
        assert_close(get_tensor(con, "y"), weights.linear(x))
        assert model_execute(con, "m", ["y", "y"], ["z"]) == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "z"), get_tensor(con, "y") * get_tensor(con, "y"))


# =================================================================================================
# without the TensorFlow library


def test_without_tf_library(make_server):
    args = ["--loadmodule", MODULE_PATH] + (["ONNX", ONNX_LIB] if ONNX_LIB else []) + ["TF", BOGUS_TF]
    srv = make_server(load_module=False, server_args=args, name="no_tf")
    con = srv.client()
    set_tensor(con, "a", np.array([[1.0, 2.0]], dtype=np.float32))
    assert con.execute_command("AI.TENSORGET", "a", "VALUES") == [b"1", b"2"]
    for cmd in (["AI.MODELSTORE", "m", "TF", "CPU", *io_args(["a", "b"], ["c"]), "BLOB", tf_blob("mul")],
                ["AI.MODELSET", "m", "TF", "CPU", "INPUTS", "a", "b", "OUTPUTS", "c", "BLOB", tf_blob("mul")]):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command(*cmd)
        assert "Could not load backend TF from /nonexistent" in str(e.value), str(e.value)
    assert con.exists("m") == 0
    backends = dict(modules_sections(srv)).get("ai_backends_info", [])
    assert "ai_TensorFlow_version" not in dict(backends), backends
    # the parse errors come first, as with the library
    check_error_raw(srv.port, "ERR INPUTS not specified for TF", "AI.MODELSTORE", "m", "TF", "CPU", "BLOB", b"x")
    # ONNX models are unaffected
    store(con, "o", "mul")
    assert model_execute(con, "o", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"1", b"4"]
    assert con.ping()


@pytest.mark.parametrize("setting", [None, "1"])
def test_onednn_kernels_only_when_the_operator_turns_them_on(make_server, monkeypatch, setting):
    """RedisAI's TensorFlow 2.8 ran graphs with Eigen's kernels; 2.9 turned oneDNN's on by default (for small graphs
    slower per run, results differing in the last bits). The module opens TensorFlow with TF_ENABLE_ONEDNN_OPTS=0
    unless the server's environment sets it; TensorFlow says at start-up when oneDNN's kernels are on."""
    if setting is None:
        monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    else:
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", setting)
    srv = make_server()
    con = srv.client()
    tf_store(con, "m", "mul")
    con.execute_command("AI.TENSORSET", "a", "FLOAT", 2, "VALUES", 1.5, -2)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c") == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"2.25", b"4"]
    assert ("oneDNN custom operations are on" in srv.log()) == (setting == "1")
