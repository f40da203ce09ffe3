"""The ONNX backend's own behaviour (ONNX Runtime 1.31 through its C API; docs/design.md, "Models and backends"):
loading the library (a bogus path, then AI.CONFIG LOADBACKEND), a pooled session given new tensors at the addresses
of the last run's inputs, and non-tensor outputs (an ONNX-ML ZipMap: a sequence of maps becomes a FLOAT tensor).

ONNX models are the default of the command tests: AI.MODEL* with ONNX models is in test_cmd_model.py, ONNX admission
and the ONNX memory bound in test_security_onnx.py, the ONNX kill switch in test_limits_kill_switch.py."""

import os

import numpy as np
import pytest
import redis

from helpers.checks import check_error_raw
from helpers.onnx_models import blob, check_common_sections, get_tensor, model_execute, modules_info, set_tensor, store
from helpers.server import MODULE_PATH, ONNX_LIB

BOGUS_ONNX = "/nonexistent/libonnxruntime.so"


def require_onnx_lib():
    if not ONNX_LIB:
        pytest.fail("REDISAI_ONNX_LIB must name the ONNX Runtime library for this test", pytrace=False)


# =================================================================================================
# the ONNX Runtime library


def test_bogus_onnx_path(make_server):
    """The module loads with a bogus ONNX path; ONNX MODELSTORE then names the path tried; LOADBACKEND with
    a path relative to BACKENDSPATH loads the real library afterwards."""
    srv = make_server(load_module=False, server_args=["--loadmodule", MODULE_PATH, "ONNX", BOGUS_ONNX])
    con = srv.client()
    assert con.ping()
    check_common_sections(srv)
    assert "ai_onnxruntime_version" not in modules_info(srv)
    for _ in range(2):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
        assert f"Could not load backend ONNX from {BOGUS_ONNX}" in str(e.value), str(e.value)
        assert con.exists("m") == 0
    # the other commands still work
    set_tensor(con, "t", np.ones(2, dtype=np.float32))
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"1", b"1"]
    assert isinstance(srv.raw("INFO", "everything"), bytes)
    require_onnx_lib()
    check_error_raw(srv.port, "ERR error loading backend", "AI.CONFIG", "LOADBACKEND", "ONNX", BOGUS_ONNX)
    assert con.execute_command("AI.CONFIG", "BACKENDSPATH", os.path.dirname(ONNX_LIB)) == b"OK"
    assert con.execute_command("AI.CONFIG", "LOADBACKEND", "ONNX", os.path.basename(ONNX_LIB)) == b"OK"
    check_error_raw(srv.port, "ERR error loading backend", "AI.CONFIG", "LOADBACKEND", "ONNX", ONNX_LIB)
    store(con, "m", "mul")
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert con.execute_command("AI.TENSORGET", "c", "VALUES") == [b"4"]
    assert modules_info(srv)["ai_onnxruntime_version"] == "1.31.1"


# =================================================================================================
# sessions


def test_new_tensors_at_reused_memory_give_their_own_results(con):
    """A session keeps its last run's ONNX input values for the next run over tensors at the same address with the
    same type and shape (onnx_run.rs). Keys overwritten again and again, whose memory the allocator hands out
    again, with the same bytes in other shapes and then another type: every run computes on its own inputs."""
    store(con, "m", "mul")
    rng = np.random.default_rng(11)
    for i in range(300):
        shape = [(2, 2), (1, 4), (4, 1)][i % 3]
        a, b = rng.random(shape, dtype=np.float32), rng.random(shape, dtype=np.float32)
        set_tensor(con, "a", a)
        set_tensor(con, "b", b)
        assert model_execute(con, "m", ["a", "b"], ["c"]) == b"OK"
        np.testing.assert_array_equal(get_tensor(con, "c"), a * b)
        if i % 50 == 0:
            assert model_execute(con, "m", ["b", "a"], ["c"]) == b"OK"
            np.testing.assert_array_equal(get_tensor(con, "c"), b * a)
    # A tensor of another type where a freed input was (the allocator hands its memory out again): refused by
    # the model, never read as the floats that were there.
    for i in range(20):
        set_tensor(con, "x", rng.random((16, 16), dtype=np.float32))
        set_tensor(con, "y", rng.random((16, 16), dtype=np.float32))
        assert model_execute(con, "m", ["x", "y"], ["c"]) == b"OK"
        con.delete("x")
        # VALUES, so that no BLOB argument of the same size takes the freed memory first.
        con.execute_command("AI.TENSORSET", "z", "INT32", 16, 16, "VALUES", *range(256))
        with pytest.raises(redis.ResponseError, match="Unexpected input data type"):
            model_execute(con, "m", ["z", "y"], ["c"])


# =================================================================================================
# outputs that are not tensors


def sklearn_style_classifier():
    """What skl2onnx makes of a logistic regression: output 0 the labels, output 1 (ZipMap) a sequence of maps
    from class to probability. Weights: class 1 scores x0 - x1, class 0 the opposite; softmax post-transform."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [
        helper.make_node("LinearClassifier", ["X"], ["label", "probs"], domain="ai.onnx.ml",
                         coefficients=[-1.0, 1.0, 1.0, -1.0], intercepts=[0.0, 0.0], classlabels_ints=[0, 1],
                         post_transform="SOFTMAX"),
        helper.make_node("ZipMap", ["probs"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]),
    ]
    seq_map = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64,
                                                                         helper.make_tensor_type_proto(
                                                                             TensorProto.FLOAT, [])))
    graph = helper.make_graph(nodes, "clf", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
                               helper.make_value_info("probabilities", seq_map)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_zipmap_probabilities_become_a_float_tensor(con):
    con.execute_command("AI.MODELSTORE", "clf", "ONNX", "CPU", "BLOB", sklearn_style_classifier())
    x = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32)
    set_tensor(con, "x", x)
    con.execute_command("AI.MODELEXECUTE", "clf", "INPUTS", 1, "x", "OUTPUTS", 2, "label", "probs")
    assert get_tensor(con, "label").tolist() == [1, 0, 0]
    probs = get_tensor(con, "probs")
    assert probs.shape == (3, 2)
    score = x[:, 0] - x[:, 1]
    p1 = np.exp(score) / (np.exp(score) + np.exp(-score))
    np.testing.assert_allclose(probs[:, 1], p1, rtol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
