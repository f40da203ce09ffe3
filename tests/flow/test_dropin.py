"""Drop-in behaviour that RedisAI's users and tools rely on (issue: the remaining differences): names of models
restored from old RDB encodings, SCRIPTEXECUTE's KEYS error, arity errors, INFO MODULES fields, scripts that
return nothing, error texts from inside scripts, non-tensor ONNX outputs, and the module's own path on every
server (Redis 8 builds modules into the server, which once hid ours from dladdr)."""
import struct

import numpy as np
import pytest
import redis

from helpers.onnx_models import blob, get_tensor, modules_sections, set_tensor
from test_restore import buf, crc64, u

TYPE_CHARSET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def module_type_id(name, encver):
    """Redis's 64-bit module type id: the 9-character name in 6-bit symbols, then 10 bits of encoding version."""
    mid = 0
    for ch in name:
        mid = (mid << 6) | TYPE_CHARSET.index(ch)
    return (mid << 10) | encver


def model_payload(encver, backend_code, device, data, inputs=(), outputs=()):
    """An AI__MODEL DUMP payload in RedisAI's encoding `encver` (0: one buffer; 1+: chunked)."""
    fields = [u(backend_code), buf(device.encode() + b"\0"), buf(b""), u(0), u(0)]
    if encver >= 2:
        fields.append(u(0))
    for names in (inputs, outputs):
        fields += [u(len(names))] + [buf(n.encode() + b"\0") for n in names]
    fields += [buf(data)] if encver == 0 else [u(len(data)), u(1), buf(data)]
    body = b"\x07\x81" + struct.pack(">Q", module_type_id("AI__MODEL", encver)) + b"".join(fields) + b"\x00"
    body += struct.pack("<H", 10)
    return body + struct.pack("<Q", crc64(body))


def test_type_id_encoder_matches_the_tensor_type():
    from test_restore import TENSOR_TYPE_ID_V4
    assert module_type_id("AI_TENSOR", 4) == TENSOR_TYPE_ID_V4


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


def test_keys_with_nothing_after_the_count(con):
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0]\n")
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "KEYS", 1)
    assert str(e.value) == "Missing arguments after KEYS keyword"
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "KEYS", 2, "k1")
    assert str(e.value) == ("Number of pre declared KEYS to be used in the command does not match the number of "
                            "given arguments")


@pytest.mark.parametrize("cmd", ["AI.MODELSTORE", "AI.SCRIPTSTORE"])
def test_arity_errors_name_the_registered_command(con, cmd):
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command(cmd, "k", "CPU")
    assert str(e.value) == f"wrong number of arguments for '{cmd.lower()}' command"


def test_info_modules_fields_are_redisais(shared_server, con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(con, "a", np.array([[1.0]], dtype=np.float32))
    con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    sections = {name: dict(fields) for name, fields in modules_sections(shared_server) if name.startswith("ai_")}
    names = list(sections)
    assert names[:5] == ["ai_versions", "ai_git", "ai_load_time_configs", "ai_backends_info", "ai_cpu"], names
    assert list(sections["ai_versions"]) == ["ai_RedisAI_version", "ai_low_level_API_version", "ai_rdb_version"]
    assert list(sections["ai_git"]) == ["ai_git_sha"]
    assert list(sections["ai_load_time_configs"]) == [
        "ai_threads_per_queue", "ai_inter_op_parallelism", "ai_intra_op_parallelism", "ai_model_execution_timeout",
        "ai_backend_memory_limit"]
    cpu = sections["ai_cpu"]
    for f in ("ai_self_used_cpu_sys", "ai_self_used_cpu_user", "ai_children_used_cpu_sys",
              "ai_children_used_cpu_user", "ai_queue_CPU_bthread_n1_used_cpu_total"):
        assert f in cpu, (f, list(cpu))
    assert list(sections["ai_redisai_rs"]) == ["ai_redisai_rs_version", "ai_backend_memory_bound", "ai_inline_runs",
                                               "ai_queued_runs", "ai_models_pending_build",
                                               "ai_models_failed_build", "ai_tflite_memory",
                                               "ai_tflite_memory_refusals"]
    # Ours after it: per device queue, then a line per model and script (docs/commands.md, "Observability").
    assert names[5:] == ["ai_redisai_rs", "ai_queues", "ai_keys"], names
    assert {"ai_queue_CPU_pending", "ai_queue_CPU_busy_workers", "ai_queue_CPU_wait_p99_us"} <= set(sections["ai_queues"])
    assert "ai_model_m" in sections["ai_keys"], sections["ai_keys"]


def test_module_finds_its_own_directory(shared_server, con):
    """The default BACKENDSPATH is <module dir>/backends on every server (Redis 8.2 reported it empty, and
    TORCH then had no library path)."""
    import os
    from helpers.server import MODULE_PATH
    expected = os.path.join(os.path.dirname(os.path.realpath(MODULE_PATH)), "backends")
    assert con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == expected.encode()
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE",
                        "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] + 1\n")
    set_tensor(con, "a", np.array([1.0], dtype=np.float32))
    con.execute_command("AI.SCRIPTEXECUTE", "s", "f", "INPUTS", 1, "a", "OUTPUTS", 1, "b")
    assert get_tensor(con, "b").tolist() == [2.0]


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


SIDE_EFFECTS = '''
def set_only(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("SET", [keys[0], args[0]])

def count(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redis.execute("INCR", [keys[0]])
'''


def test_script_functions_that_return_nothing_run_without_outputs(con):
    con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 2, "set_only", "count", "SOURCE", SIDE_EFFECTS)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "set_only", "KEYS", 1, "k", "ARGS", 1, "v") == b"OK"
    assert con.get("k") == b"v"
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "count", "KEYS", 1, "n") == b"OK"
    assert con.get("n") == b"1"
    # Only when OUTPUTS are asked for is a tensor required (RedisAI's text).
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "set_only", "KEYS", 1, "k", "ARGS", 1, "w", "OUTPUTS", 1, "o")
    assert str(e.value) == "Function returned non-tensor valuesset_only"
    assert con.exists("o") == 0


def test_errors_inside_scripts_keep_redisais_wording(con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    src = '''
def bad_rank(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redisAI.model_execute(keys[0], [tensors[0], tensors[0]], 1)[0]

def bad_cmd(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("INCR", [keys[0]])
    return tensors[0]
'''
    con.execute_command("AI.SCRIPTSTORE", "e", "CPU", "ENTRY_POINTS", 2, "bad_rank", "bad_cmd", "SOURCE", src)
    set_tensor(con, "x", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    con.set("str", "abc")
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "e", "bad_rank", "KEYS", 1, "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert "Invalid rank for input: a Got: 1 Expected: 2 Please fix either the inputs or the model" in str(e.value)
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "e", "bad_cmd", "KEYS", 1, "str", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert "Redis command returned an error: ERR value is not an integer or out of range" in str(e.value)
