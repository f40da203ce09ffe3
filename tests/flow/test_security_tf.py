"""TF model admission (docs/security.md; src/admission/tensorflow.rs): a stored TensorFlow graph is untrusted
input. Each test stores a graph that, in TensorFlow itself, reads or writes the server's files, runs Python,
talks to the network or kills the process, and asserts that it is refused with an error naming the op and the
node, that nothing is stored, read or written, and that Redis keeps serving. The graphs are hand-encoded
(tests/flow/helpers/tf_graphs.py); the file read, file write, hidden-function and nested-function graphs return the
file's bytes or write the file when run by TensorFlow directly.

Also: functions that call themselves (the report's 204-byte graph, which made TensorFlow recurse until Redis's
stack overflowed) and call chains past the bound are refused, Redis stays up and keeps its data; the RESTORE route
(the model is kept, running it replies the refusal), AI.MODELSET, library functions that only compute (admitted
and run), every committed tests/data/*.pb, and the TF memory bound (BACKEND_MEMORY_LIMIT: TensorFlow's CPU
allocator is capped, so Fill(dims from an input) gets an error instead of the machine's memory).
"""
import os
import re

import numpy as np
import pytest
import redis

from helpers.checks import check_error
from helpers.data import DATA_DIR
from helpers.onnx_models import get_tensor, set_tensor
from helpers.rdb import model_payload
from helpers.server import REPO_ROOT
from helpers.tf_graphs import (DT_BOOL, DT_FLOAT, DT_INT32, DT_INT64, DT_STRING, a_bool, a_func, a_funcs, a_shape,
                               a_str, a_strs, a_tensor, a_type, a_types, const_float, const_str, function_def,
                               graph_def, node_def, placeholder)

TF_CODE = 0  # the TF backend's code in RDB payloads


def _reasons():
    """op -> the end of its refusal ("which <reason>"), from the committed allowlist file."""
    classes, ops = {}, {}
    for line in (REPO_ROOT / "src" / "admission" / "tf_ops.txt").read_text().splitlines():
        words = line.split(" ", 2)
        if words[0] == "class":
            classes[words[1]] = words[2]
        elif words[0] == "deny":
            ops[words[1]] = classes[words[2]]
    return ops


REASONS = _reasons()


def refusal(node, op, function=None):
    where = f"node '{node}'" + (f" of function '{function}'" if function else "")
    return f"TF model refused: {where} uses op {op}, which {REASONS[op]}"


def io(inputs, outputs):
    return ["INPUTS", len(inputs), *inputs, "OUTPUTS", len(outputs), *outputs]


def assert_refused(con, graph, inputs, outputs, msg, key="m"):
    check_error(con, msg, "AI.MODELSTORE", key, "TF", "CPU", *io(inputs, outputs), "BLOB", graph)
    assert con.exists(key) == 0
    assert con.ping()


def identity(name, inp, dtype=DT_STRING, control=()):
    return node_def(name, "Identity", [inp] + [f"^{c}" for c in control], [("T", a_type(dtype))])


# =================================================================================================
# files


def read_file_graph():
    """The report's graph: y = ReadFile(x), x a string input (the path)."""
    return graph_def([placeholder("x", DT_STRING), node_def("y", "ReadFile", ["x"])])


def test_file_read(con, shared_server):
    secret = os.urandom(16).hex()
    path = shared_server.dir / "secret.txt"
    path.write_text(secret)
    replies = []
    g = read_file_graph()
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["x"], ["y"]), "BLOB", g)
    replies.append(str(e.value))
    assert str(e.value) == "TF model refused: node 'y' uses op ReadFile, which reads or writes files"
    # the path as a constant instead of an input
    g2 = graph_def([const_str("p", str(path)), node_def("y", "ReadFile", ["p"]), placeholder("x", DT_STRING)])
    assert_refused(con, g2, ["x"], ["y"], refusal("y", "ReadFile"))
    # there is no model to run, and nothing ever replied the file's bytes
    con.execute_command("AI.TENSORSET", "path", "STRING", 1, "VALUES", str(path))
    for cmd in (["AI.MODELEXECUTE", "m", "INPUTS", 1, "path", "OUTPUTS", 1, "out"], ["AI.TENSORGET", "out", "VALUES"]):
        with pytest.raises(redis.ResponseError) as e:
            con.execute_command(*cmd)
        replies.append(str(e.value))
    assert all(secret not in r for r in replies), replies
    assert con.exists("out") == 0


def test_file_write(con, shared_server):
    """WriteFile runs through a control dependency of the output: the file must not appear."""
    target = shared_server.dir / "written.txt"
    g = graph_def([const_str("f", str(target)), const_str("c", "pwned"), node_def("w", "WriteFile", ["f", "c"]),
                   placeholder("x", DT_STRING), identity("y", "x", control=["w"])])
    assert_refused(con, g, ["x"], ["y"], "TF model refused: node 'w' uses op WriteFile, which reads or writes files")
    with pytest.raises(redis.ResponseError):
        con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert not target.exists()


def test_match_list_delete_rename(con, shared_server):
    d = str(shared_server.dir)
    cases = [
        # list the server's files
        ("ls", "MatchingFiles", [const_str("p", d + "/*"), node_def("ls", "MatchingFiles", ["p"])]),
        # MergeV2Checkpoints renames checkpoint files and deletes the source directories
        ("mv", "MergeV2Checkpoints", [const_str("src", d + "/a"), const_str("dst", d + "/b"),
                                      node_def("mv", "MergeV2Checkpoints", ["src", "dst"],
                                               [("delete_old_dirs", a_bool(True))])]),
        # reconfigures a filesystem (e.g. remote credentials)
        ("cfg", "FileSystemSetConfiguration", [const_str("s", "s3"), const_str("k", "k"), const_str("v", "v"),
                                               node_def("cfg", "FileSystemSetConfiguration", ["s", "k", "v"])]),
    ]
    (shared_server.dir / "a.index").write_text("keep")
    for node, op, nodes in cases:
        g = graph_def(nodes + [placeholder("x", DT_STRING), identity("y", "x", control=[node])])
        assert_refused(con, g, ["x"], ["y"], refusal(node, op))
    assert (shared_server.dir / "a.index").read_text() == "keep"
    assert not (shared_server.dir / "b.index").exists()


def test_checkpoint_save_restore(con, shared_server):
    prefix = str(shared_server.dir / "ckpt")
    save = graph_def([const_str("prefix", prefix), const_str("names", "v"), const_str("slices", ""),
                      placeholder("x", DT_FLOAT), node_def("s", "SaveV2", ["prefix", "names", "slices", "x"],
                                                           [("dtypes", a_types([DT_FLOAT]))]),
                      identity("y", "x", DT_FLOAT, control=["s"])])
    assert_refused(con, save, ["x"], ["y"], refusal("s", "SaveV2"))
    restore = graph_def([const_str("prefix", prefix), const_str("names", "v"), const_str("slices", ""),
                         node_def("r", "RestoreV2", ["prefix", "names", "slices"], [("dtypes", a_types([DT_FLOAT]))]),
                         placeholder("x", DT_FLOAT)])
    assert_refused(con, restore, ["x"], ["r"], refusal("r", "RestoreV2"))
    for old in ("Save", "Restore"):  # the TF1 ops
        g = graph_def([placeholder("x", DT_FLOAT), node_def("o", old, ["x"])])
        assert_refused(con, g, ["x"], ["o"], refusal("o", old))
    assert not any(p.name.startswith("ckpt") for p in shared_server.dir.iterdir())


def test_file_readers_and_datasets(con, shared_server):
    path = str(shared_server.dir / "secret.txt")
    reader = graph_def([node_def("reader", "WholeFileReaderV2"),
                        node_def("q", "FIFOQueueV2", attrs=[("component_types", a_types([DT_STRING]))]),
                        node_def("rd", "ReaderReadV2", ["reader", "q"]), placeholder("x", DT_STRING)])
    assert_refused(con, reader, ["x"], ["rd"], refusal("reader", "WholeFileReaderV2"))
    # tf.data: a TFRecord file read through an iterator
    dataset = graph_def([
        const_str("files", path), const_str("comp", ""),
        node_def("bs", "Const", attrs=[("dtype", a_type(DT_INT64)),
                                       ("value", a_tensor(DT_INT64, [], content=bytes(8)))]),
        node_def("ds", "TFRecordDataset", ["files", "comp", "bs"]),
        node_def("it", "AnonymousIteratorV3", attrs=[("output_types", a_types([DT_STRING])),
                                                     ("output_shapes", a_shape(None))]),
        node_def("mk", "MakeIterator", ["ds", "it"]),
        node_def("next", "IteratorGetNext", ["it", "^mk"], [("output_types", a_types([DT_STRING]))]),
        placeholder("x", DT_STRING)])
    assert_refused(con, dataset, ["x"], ["next"], refusal("ds", "TFRecordDataset"))
    # datasets that write: SaveDataset, DatasetToTFRecord, SnapshotDatasetV2; and SQL
    for op in ("SaveDatasetV2", "DatasetToTFRecord", "SnapshotDatasetV2", "SqlDataset", "TextLineDataset",
               "MatchingFilesDataset", "IteratorGetNext", "LoadDataset"):
        g = graph_def([placeholder("x", DT_STRING), node_def("d", op, ["x"])])
        assert_refused(con, g, ["x"], ["d"], refusal("d", op))


def test_immutable_const_maps_a_file(con, shared_server):
    g = graph_def([node_def("c", "ImmutableConst", attrs=[
        ("dtype", a_type(DT_FLOAT)), ("shape", a_shape([4])),
        ("memory_region_name", a_str(str(shared_server.dir / "secret.txt")))]), placeholder("x", DT_FLOAT)])
    assert_refused(con, g, ["x"], ["c"], refusal("c", "ImmutableConst"))


def test_debug_op_writes_dumps(con, shared_server):
    dump = shared_server.dir / "dumps"
    g = graph_def([placeholder("x", DT_FLOAT), node_def("d", "DebugIdentityV2", ["x"], [
        ("T", a_type(DT_FLOAT)), ("debug_urls", a_strs([f"file://{dump}"])), ("tfdbg_run_id", a_str("r"))])])
    assert_refused(con, g, ["x"], ["d"], refusal("d", "DebugIdentityV2"))
    for op in ("DebugIdentity", "DebugNumericSummaryV2", "Copy"):
        g = graph_def([placeholder("x", DT_FLOAT), node_def("d", op, ["x"], [("T", a_type(DT_FLOAT))])])
        assert_refused(con, g, ["x"], ["d"], refusal("d", op))
    assert not dump.exists()


def test_print_to_file(con, shared_server):
    out = shared_server.dir / "printed.txt"
    g = graph_def([placeholder("x", DT_STRING),
                   node_def("p", "PrintV2", ["x"], [("output_stream", a_str(f"file://{out}"))]),
                   identity("y", "x", control=["p"])])
    assert_refused(con, g, ["x"], ["y"], "TF model refused: node 'p' uses op PrintV2, which prints to the server's "
                                         "log or to a file")
    assert not out.exists()


def test_py_func(con):
    for op in ("PyFunc", "PyFuncStateless", "EagerPyFunc"):
        g = graph_def([placeholder("x", DT_FLOAT), node_def("p", op, ["x"], [
            ("token", a_str("pyfunc_0")), ("Tin", a_types([DT_FLOAT])), ("Tout", a_types([DT_FLOAT]))])])
        assert_refused(con, g, ["x"], ["p"], refusal("p", op))


# the other classes of the registry, one op each (and a few more where the class is wide)
OTHER_CLASSES = [
    ("summary", "CreateSummaryFileWriter"), ("summary", "WriteScalarSummary"),
    ("network", "RpcClient"), ("network", "CollectiveReduceV2"), ("network", "_Recv"), ("network", "RemoteCall"),
    ("abort", "Abort"),
    ("accelerator", "XlaLaunch"), ("accelerator", "TPUExecute"),
    ("code", "MlirPassthroughOp"),
    ("files", "InitializeTableFromTextFileV2"), ("files", "FixedUnigramCandidateSampler"), ("files", "Skipgram"),
    ("files", "DecodeProtoV2"), ("files", "LoadAndRemapMatrix"), ("files", "RecordInput"),
    ("uninit", "Empty"), ("uninit", "ParallelConcat"),
    ("batching", "BatchFunction"),
    ("staging", "Unstage"), ("staging", "StagePeek"), ("staging", "MapPeek"), ("staging", "OrderedMapUnstageNoKey"),
    ("internal", "_Arg"),
]


@pytest.mark.parametrize("cls,op", OTHER_CLASSES, ids=[f"{c}-{o}" for c, o in OTHER_CLASSES])
def test_other_denied_classes(con, cls, op):
    g = graph_def([placeholder("x", DT_FLOAT), node_def("n", op, ["x"])])
    assert_refused(con, g, ["x"], ["n"], refusal("n", op))


def test_unknown_op(con):
    g = graph_def([placeholder("x", DT_FLOAT), node_def("n", "ReadFileV9", ["x"])])
    assert_refused(con, g, ["x"], ["n"], "TF model refused: node 'n' uses op ReadFileV9, which is not an op of "
                                         "TensorFlow 2.21.0 nor a function of the graph")


# =================================================================================================
# functions


def leak_function(name="leak"):
    return function_def(name, [("path", DT_STRING)], [("out", DT_STRING)], [node_def("r", "ReadFile", ["path"])],
                        [("out", "r:contents:0")])


def test_op_hidden_in_library_function(con):
    g = graph_def([placeholder("x", DT_STRING), node_def("y", "leak", ["x"])], [leak_function()])
    assert_refused(con, g, ["x"], ["y"], refusal("r", "ReadFile", function="leak"))
    # called through StatefulPartitionedCall: the same
    g = graph_def([placeholder("x", DT_STRING), node_def("y", "StatefulPartitionedCall", ["x"], [
        ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])), ("f", a_func("leak"))])], [leak_function()])
    assert_refused(con, g, ["x"], ["y"], refusal("r", "ReadFile", function="leak"))


def test_partitioned_call_naming_a_primitive_op(con):
    for op, attr in (("PartitionedCall", "f"), ("StatefulPartitionedCall", "f"), ("SymbolicGradient", "f")):
        g = graph_def([placeholder("x", DT_STRING), node_def("y", op, ["x"], [
            ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])), (attr, a_func("ReadFile"))])])
        assert_refused(con, g, ["x"], ["y"], f"TF model refused: node 'y' calls op ReadFile through attr '{attr}', "
                                             f"which {REASONS['ReadFile']}")
    # If / Case branches
    g = graph_def([placeholder("c", DT_BOOL), placeholder("x", DT_STRING), node_def("y", "If", ["c", "x"], [
        ("Tcond", a_type(DT_BOOL)), ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])),
        ("then_branch", a_func("ReadFile")), ("else_branch", a_func("ReadFile"))])])
    assert_refused(con, g, ["c", "x"], ["y"], f"TF model refused: node 'y' calls op ReadFile through attr "
                                              f"'then_branch', which {REASONS['ReadFile']}")
    g = graph_def([placeholder("i", DT_INT32), placeholder("x", DT_STRING), node_def("y", "Case", ["i", "x"], [
        ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])),
        ("branches", a_funcs(["Identity", "WriteFile"]))])])
    assert_refused(con, g, ["i", "x"], ["y"], f"TF model refused: node 'y' calls op WriteFile through attr "
                                              f"'branches', which {REASONS['WriteFile']}")


def test_nested_functions(con):
    """outer -> middle (a plain call) -> inner (through PartitionedCall) -> ReadFile: found at any depth."""
    inner = leak_function("inner")
    middle = function_def("middle", [("p", DT_STRING)], [("o", DT_STRING)], [node_def("c", "PartitionedCall", ["p"], [
        ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])), ("f", a_func("inner"))])],
        [("o", "c:output:0")])
    outer = function_def("outer", [("p", DT_STRING)], [("o", DT_STRING)], [node_def("c", "middle", ["p"])],
                         [("o", "c:o:0")])
    g = graph_def([placeholder("x", DT_STRING), node_def("y", "outer", ["x"])], [outer, middle, inner])
    assert_refused(con, g, ["x"], ["y"], refusal("r", "ReadFile", function="inner"))
    # a function that names a denied op in a func attr of its body, called through While
    body = function_def("body", [("p", DT_STRING)], [("o", DT_STRING)], [node_def("c", "PartitionedCall", ["p"], [
        ("Tin", a_types([DT_STRING])), ("Tout", a_types([DT_STRING])), ("f", a_func("WriteFile"))])],
        [("o", "c:output:0")])
    g = graph_def([placeholder("x", DT_STRING), node_def("y", "While", ["x"], [
        ("T", a_types([DT_STRING])), ("cond", a_func("body")), ("body", a_func("body"))])], [body])
    assert_refused(con, g, ["x"], ["y"], f"TF model refused: node 'c' of function 'body' calls op WriteFile through "
                                         f"attr 'f', which {REASONS['WriteFile']}")


def test_functions_that_only_compute_are_admitted(con):
    double = function_def("double", [("a", DT_FLOAT)], [("b", DT_FLOAT)],
                          [node_def("s", "AddV2", ["a", "a"], [("T", a_type(DT_FLOAT))])], [("b", "s:z:0")])
    g = graph_def([placeholder("x", DT_FLOAT), node_def("d", "double", ["x"]),
                   node_def("y", "StatefulPartitionedCall", ["d"], [
                       ("Tin", a_types([DT_FLOAT])), ("Tout", a_types([DT_FLOAT])), ("f", a_func("double"))])],
                  [double])
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["x"], ["y"]), "BLOB", g) == b"OK"
    x = np.array([1.0, -2.5, 3.0], dtype=np.float32)
    set_tensor(con, "x", x)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), 4 * x)


# =================================================================================================
# call cycles and depth


def call_node(name, inp, callee, op="PartitionedCall"):
    return node_def(name, op, [inp], [("Tin", a_types([DT_FLOAT])), ("Tout", a_types([DT_FLOAT])),
                                      ("f", a_func(callee))])


def self_calling_graph():
    """The report's graph (~200 bytes): f(x) = PartitionedCall(x, f=f), called by the graph. TensorFlow recursed
    into f until the stack of Redis's thread overflowed."""
    f = function_def("f", [("x", DT_FLOAT)], [("y", DT_FLOAT)], [call_node("p", "x", "f")], [("y", "p:output:0")])
    return graph_def([placeholder("x", DT_FLOAT), call_node("y", "x", "f")], [f])


RECURSIVE_F = "TF model refused: function 'f' calls itself (f -> f): recursive functions are not allowed"


def test_self_calling_function_refused(con):
    set_tensor(con, "keep", np.array([1.5, -2.0], dtype=np.float32))
    g = self_calling_graph()
    assert len(g) < 256
    assert_refused(con, g, ["x"], ["y"], RECURSIVE_F)
    np.testing.assert_array_equal(get_tensor(con, "keep"), [1.5, -2.0])
    # f -> g -> f, the second call through a While body
    f = function_def("f", [("x", DT_FLOAT)], [("y", DT_FLOAT)], [call_node("p", "x", "g", "StatefulPartitionedCall")],
                     [("y", "p:output:0")])
    g2 = function_def("g", [("x", DT_FLOAT)], [("y", DT_FLOAT)], [node_def("w", "While", ["x"], [
        ("T", a_types([DT_FLOAT])), ("cond", a_func("f")), ("body", a_func("f"))])], [("y", "w:output:0")])
    graph = graph_def([placeholder("x", DT_FLOAT), call_node("y", "x", "f")], [f, g2])
    assert_refused(con, graph, ["x"], ["y"], "TF model refused: function 'f' calls itself (f -> g -> f): recursive "
                                             "functions are not allowed")
    np.testing.assert_array_equal(get_tensor(con, "keep"), [1.5, -2.0])


def test_self_calling_function_restored_never_runs(con):
    """RESTORE keeps the model, and TensorFlow never sees it: running it replies the refusal, Redis stays up."""
    set_tensor(con, "keep", np.array([3.0], dtype=np.float32))
    g = self_calling_graph()
    assert con.restore("m", 0, model_payload(4, TF_CODE, "CPU", g, inputs=["x"], outputs=["y"])) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == g
    check_error(con, RECURSIVE_F, "AI.MODELEXECUTE", "m", "INPUTS", 1, "keep", "OUTPUTS", 1, "out")
    assert con.exists("out") == 0
    assert con.ping()
    np.testing.assert_array_equal(get_tensor(con, "keep"), [3.0])


def call_chain(levels):
    """The graph calls f0, f0 calls f1, ..., f(levels-1) returns a + a: `levels` functions deep."""
    functions = [function_def(f"f{i}", [("a", DT_FLOAT)], [("b", DT_FLOAT)], [call_node("c", "a", f"f{i + 1}")],
                              [("b", "c:output:0")]) for i in range(levels - 1)]
    functions.append(function_def(f"f{levels - 1}", [("a", DT_FLOAT)], [("b", DT_FLOAT)],
                                  [node_def("s", "AddV2", ["a", "a"], [("T", a_type(DT_FLOAT))])], [("b", "s:z:0")]))
    return graph_def([placeholder("x", DT_FLOAT), call_node("y", "x", "f0")], functions)


def test_call_depth_bound(con):
    """32 nested functions (the bound) store and run in TensorFlow; 33 are refused."""
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["x"], ["y"]), "BLOB", call_chain(32)) == b"OK"
    x = np.array([1.0, -2.5], dtype=np.float32)
    set_tensor(con, "x", x)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), 2 * x)
    assert_refused(con, call_chain(33), ["x"], ["y"], "TF model refused: function 'f0' nests function calls more "
                                                      "than 32 levels deep", key="m2")


def call_fanout(levels):
    """f0 calls f1 twice, ..., f(levels-1) returns a + a: 2^(levels-1) calls from a few KB. Each level is three
    nodes (two calls, their sum) and the leaf one, so calls bring in 4 * 2^(levels-1) - 3 nodes once expanded:
    262,141 at 17 levels, within the bound (262,144); 524,285 at 18."""
    functions = [function_def(f"f{i}", [("a", DT_FLOAT)], [("b", DT_FLOAT)],
                              [call_node("c0", "a", f"f{i + 1}"), call_node("c1", "a", f"f{i + 1}"),
                               node_def("s", "AddV2", ["c0:output:0", "c1:output:0"], [("T", a_type(DT_FLOAT))])],
                              [("b", "s:z:0")]) for i in range(levels - 1)]
    functions.append(function_def(f"f{levels - 1}", [("a", DT_FLOAT)], [("b", DT_FLOAT)],
                                  [node_def("s", "AddV2", ["a", "a"], [("T", a_type(DT_FLOAT))])], [("b", "s:z:0")]))
    return graph_def([placeholder("x", DT_FLOAT), call_node("y", "x", "f0")], functions)


FANOUT = "TF model refused: function 'f0' calls functions that expand to more than 262144 nodes (the calls fan out)"


def test_call_fanout_bound(con):
    """A fan-out at the bound stores and computes; one level more is refused at once (TensorFlow took minutes
    expanding 2^23 calls, on the main thread at RESTORE); restored, it is kept and running it replies the refusal
    while Redis answers at once."""
    x = np.array([1.0, -2.5], dtype=np.float32)
    set_tensor(con, "x", x)
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["x"], ["y"]), "BLOB", call_fanout(17)) == b"OK"
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "y"), x * 2 ** 17)
    big = call_fanout(24)
    assert len(big) < 8192
    assert_refused(con, call_fanout(18), ["x"], ["y"], FANOUT, key="m2")
    with pytest.raises(redis.ResponseError, match="calls functions that expand to more than 262144 nodes"):
        con.execute_command("AI.MODELSTORE", "m2", "TF", "CPU", *io(["x"], ["y"]), "BLOB", big)
    assert con.restore("r", 0, model_payload(4, TF_CODE, "CPU", call_fanout(18), inputs=["x"],
                                              outputs=["y"])) == b"OK"
    check_error(con, FANOUT, "AI.MODELEXECUTE", "r", "INPUTS", 1, "x", "OUTPUTS", 1, "out")
    assert con.exists("out") == 0
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"  # RDB load: kept, not built
    check_error(con, FANOUT, "AI.MODELEXECUTE", "r", "INPUTS", 1, "x", "OUTPUTS", 1, "out")
    np.testing.assert_array_equal(get_tensor(con, "x"), x)


# =================================================================================================
# other ways in


def test_restore_keeps_the_model_and_running_it_replies_the_refusal(con, shared_server):
    """RESTORE (like RDB/AOF load and replication) cannot refuse a key: the model is kept with its bytes, and
    running it replies the refusal; TensorFlow never sees the graph."""
    secret = os.urandom(16).hex()
    (shared_server.dir / "secret.txt").write_text(secret)
    g = read_file_graph()
    assert con.restore("m", 0, model_payload(4, TF_CODE, "CPU", g, inputs=["x"], outputs=["y"])) == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == g
    con.execute_command("AI.TENSORSET", "path", "STRING", 1, "VALUES", str(shared_server.dir / "secret.txt"))
    for _ in range(2):  # refused each time, and across a reload (RDB load)
        with pytest.raises(redis.ResponseError) as e:
            con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "path", "OUTPUTS", 1, "out")
        assert str(e.value) == refusal("y", "ReadFile")
        assert con.exists("out") == 0
        assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.execute_command("AI.MODELGET", "m", "BLOB") == g


def test_modelset_refused(con, shared_server):
    target = shared_server.dir / "modelset.txt"
    g = graph_def([const_str("f", str(target)), const_str("c", "pwned"), node_def("w", "WriteFile", ["f", "c"]),
                   placeholder("x", DT_STRING), identity("y", "x", control=["w"])])
    check_error(con, refusal("w", "WriteFile"), "AI.MODELSET", "m", "TF", "CPU", "INPUTS", "x", "OUTPUTS", "y",
                "BLOB", g)
    assert con.exists("m") == 0
    assert not target.exists()


# =================================================================================================
# the committed graphs


def _check_committed(con, name):
    rng = np.random.default_rng(7)
    if name in ("tf_mul.pb", "tf_add_int32.pb"):
        dtype = np.float32 if name == "tf_mul.pb" else np.int32
        a, b = (rng.integers(-50, 50, size=(2, 3)).astype(dtype) for _ in range(2))
        set_tensor(con, "a", a)
        set_tensor(con, "b", b)
        assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "c"), a * b if name == "tf_mul.pb" else a + b)
    elif name == "tf_dense.pb":
        x = rng.standard_normal((3, 4)).astype(np.float32)
        set_tensor(con, "x", x)
        assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y") == b"OK"
        assert get_tensor(con, "y").shape[0] == 3
    elif name == "tf_str_identity.pb":
        con.execute_command("AI.TENSORSET", "s", "STRING", 2, "VALUES", "ab", "c")
        assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "s", "OUTPUTS", 1, "t") == b"OK"
        assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"ab", b"c"]
    else:
        pytest.fail(f"tests/data/{name}: add how to run it to this test")


COMMITTED = {"tf_mul.pb": (["a", "b"], ["c"]), "tf_dense.pb": (["x"], ["y"]), "tf_str_identity.pb": (["s"], ["t"]),
             "tf_add_int32.pb": (["a", "b"], ["c"])}


@pytest.mark.parametrize("name", sorted(p.name for p in DATA_DIR.glob("*.pb")))
def test_committed_graphs_store_and_run(con, name):
    assert name in COMMITTED, f"tests/data/{name}: add its inputs and outputs to COMMITTED"
    inputs, outputs = COMMITTED[name]
    g = (DATA_DIR / name).read_bytes()
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(inputs, outputs), "BLOB", g) == b"OK"
    _check_committed(con, name)


# =================================================================================================
# memory


def peak_rss_kb(server):
    text = open(f"/proc/{server.pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1))


def fill_graph():
    """y = Fill(d, 1.0): d (INT32 [2]) from the request sets the size."""
    return graph_def([placeholder("d", DT_INT32, [2]), const_float("v", 1.0),
                      node_def("y", "Fill", ["d", "v"], [("T", a_type(DT_FLOAT)), ("index_type", a_type(DT_INT32))])])


def test_memory_bound(make_server):
    """BACKEND_MEMORY_LIMIT 100 (MB) caps TensorFlow's CPU allocator (TF_CPU_ALLOCATOR_USE_BFC + its limit):
    Fill of 20 MB runs, Fill of 300 MB fails without the process ever holding it, and Redis keeps serving.
    (TensorFlow retries a failed allocation for up to 10 s before it fails the op.)"""
    srv = make_server(module_args=["BACKEND_MEMORY_LIMIT", "100"])
    con = srv.client()
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["d"], ["y"]), "BLOB", fill_graph()) == b"OK"

    def fill(rows, cols, out):
        con.execute_command("AI.TENSORSET", "d", "INT32", 2, "VALUES", rows, cols)
        return con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "d", "OUTPUTS", 1, out)

    assert fill(5, 1_000_000, "small") == b"OK"  # 20 MB
    assert con.execute_command("AI.TENSORGET", "small", "META")[3] == [5, 1_000_000]
    before = peak_rss_kb(srv)
    with pytest.raises(redis.ResponseError):
        fill(75, 1_000_000, "big")  # 300 MB
    assert con.exists("big") == 0
    assert peak_rss_kb(srv) - before < 150_000, "the 300 MB tensor was allocated"
    assert con.ping()
    # the allocator still serves
    assert fill(5, 1_000_000, "again") == b"OK"
    assert "by allocator bfc_cpu_allocator" in srv.log()  # TensorFlow's OOM message names the capped allocator


def test_memory_bound_respects_the_operators_setting(make_server, monkeypatch):
    """An operator's TF_CPU_ALLOCATOR_USE_BFC=false wins over the module's bound: a 150 MB Fill runs."""
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    srv = make_server(module_args=["BACKEND_MEMORY_LIMIT", "100"])
    con = srv.client()
    assert con.execute_command("AI.MODELSTORE", "m", "TF", "CPU", *io(["d"], ["y"]), "BLOB", fill_graph()) == b"OK"
    con.execute_command("AI.TENSORSET", "d", "INT32", 2, "VALUES", 38, 1_000_000)
    assert con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 1, "d", "OUTPUTS", 1, "y") == b"OK"
    assert con.execute_command("AI.TENSORGET", "y", "META")[3] == [38, 1_000_000]
