"""Helpers of the model / execution flow tests (test_cmd_model.py, test_persistence_model.py,
test_exec_concurrency.py, ...): the ONNX test models of tests/data, models generated at test time with the `onnx`
package, what a recorded ONNX model computes, tensor and INFO helpers (AI.INFO, INFO MODULES, the ONNX sessions
count), commands sent from threads (Request)."""

import os
import re
import threading
import time

import numpy as np
import redis

from .data import data_blob
from .resp import RawClient, RespError

MODEL_NAMES = ("mul", "linear", "two_outputs", "str_identity", "add_int32", "heavy")


def blob(name):
    """The bytes of tests/data/<name>.onnx."""
    return data_blob(f"{name}.onnx")


def store(con, key, name, *opts, device="CPU"):
    """AI.MODELSTORE <key> ONNX <device> <opts...> BLOB <tests/data/name.onnx>; asserts OK."""
    reply = con.execute_command("AI.MODELSTORE", key, "ONNX", device, *opts, "BLOB", blob(name))
    assert reply in (b"OK", "OK"), reply
    return reply


def set_tensor(con, key, arr, dtype=None):
    """AI.TENSORSET of a numpy array (FLOAT/DOUBLE/INT32/... from the numpy dtype) via BLOB."""
    arr = np.ascontiguousarray(arr)
    dtype = dtype or {np.float32: "FLOAT", np.float64: "DOUBLE", np.int32: "INT32", np.int64: "INT64",
                      np.int8: "INT8", np.int16: "INT16", np.uint8: "UINT8", np.uint16: "UINT16"}[arr.dtype.type]
    assert con.execute_command("AI.TENSORSET", key, dtype, *arr.shape, "BLOB", arr.tobytes()) in (b"OK", "OK")


NP_OF = {b"FLOAT": np.float32, b"DOUBLE": np.float64, b"INT32": np.int32, b"INT64": np.int64, b"INT8": np.int8,
         b"INT16": np.int16, b"UINT8": np.uint8, b"UINT16": np.uint16}


def get_tensor(con, key):
    """AI.TENSORGET META BLOB -> numpy array (numeric dtypes)."""
    reply = con.execute_command("AI.TENSORGET", key, "META", "BLOB")
    assert reply[0] == b"dtype" and reply[2] == b"shape" and reply[4] == b"blob", reply
    return np.frombuffer(reply[5], dtype=NP_OF[reply[1]]).reshape(reply[3])


def model_execute(con, key, inputs, outputs, *extra):
    return con.execute_command("AI.MODELEXECUTE", key, "INPUTS", len(inputs), *inputs,
                               "OUTPUTS", len(outputs), *outputs, *extra)


# AI.INFO: RedisAI's 9 pairs; `AI.INFO <key> DETAIL` adds this module's (docs/commands.md, "Observability"), in
# this order.
REDISAI_INFO_FIELDS = ("key", "type", "backend", "device", "tag", "duration", "samples", "calls", "errors")
OUR_INFO_FIELDS = (
    "executions", "inline_runs", "queued_runs", "errors_timeout", "errors_refused", "errors_backend", "batch_size_p50",
    "batch_size_p99", "queue_us", "queue_p50_us", "queue_p99_us", "backend_us", "backend_p50_us", "backend_p99_us",
    "copy_us", "copy_p50_us", "copy_p99_us", "total_us", "total_p50_us", "total_p99_us")
AI_INFO_LEN = 2 * len(REDISAI_INFO_FIELDS)
AI_INFO_DETAIL_LEN = 2 * (len(REDISAI_INFO_FIELDS) + len(OUR_INFO_FIELDS))


def ai_info(con, key):
    """`AI.INFO <key> DETAIL` as a dict (keys decoded), checking that its fields are RedisAI's, then ours, in
    order."""
    reply = con.execute_command("AI.INFO", key, "DETAIL")
    assert tuple(k.decode() for k in reply[::2]) == REDISAI_INFO_FIELDS + OUR_INFO_FIELDS, reply
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def modules_sections(server):
    """INFO MODULES -> [(section name, [(field, value), ...]), ...] in the order sent."""
    text = server.raw("INFO", "MODULES")
    assert not isinstance(text, RespError), text
    sections = []
    for line in text.decode().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            sections.append((line[1:].strip(), []))
            continue
        assert sections, f"field before any section: {line!r}"
        k, _, v = line.partition(":")
        sections[-1][1].append((k, v))
    return sections


def modules_info(server):
    """INFO MODULES fields of every section as one dict."""
    out = {}
    for _, fields in modules_sections(server):
        out.update(fields)
    return out


def proc_cpu_seconds(pid):
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# -------------------------------------------------------------------------------------------------
# models generated at test time (the `onnx` package)


def make_model(nodes, inputs, outputs, inits=(), name="gen"):
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, producer_name="redisai-rs tests", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def wide_model():
    """5 FLOAT inputs a..e [n] -> 3 outputs: s = a+b+c+d+e, p = a, q = b (for the argument-count errors)."""
    from onnx import TensorProto, helper

    F = TensorProto.FLOAT
    vi = lambda n: helper.make_tensor_value_info(n, F, ["n"])  # noqa: E731
    nodes = [helper.make_node("Sum", list("abcde"), ["s"]), helper.make_node("Identity", ["a"], ["p"]),
             helper.make_node("Identity", ["b"], ["q"])]
    return make_model(nodes, [vi(n) for n in "abcde"], [vi("s"), vi("p"), vi("q")], name="wide")


def big_model(n=3072, seed=5):
    """y = x @ (A @ B) with A, B [n, n] FLOAT initializers (n=3072: a 72 MiB model). ONNX Runtime folds the
    constant A @ B when it builds the session (~58 GFLOP), so building it takes a while (about a second on
    two cores). Returns (blob, A, B)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    F = TensorProto.FLOAT
    blob_ = make_model([helper.make_node("MatMul", ["A", "B"], ["C"]), helper.make_node("MatMul", ["x", "C"], ["y"])],
                       [helper.make_tensor_value_info("x", F, ["batch", n])],
                       [helper.make_tensor_value_info("y", F, ["batch", n])],
                       [numpy_helper.from_array(a, "A"), numpy_helper.from_array(b, "B")], name="big")
    return blob_, a, b


def is_ok(reply):
    return reply in (b"OK", "OK")


def redis_error_text(fn, *args, **kwargs):
    """Run fn; return str() of the ResponseError it raises (fails if it does not raise)."""
    try:
        r = fn(*args, **kwargs)
    except redis.exceptions.ResponseError as e:
        return str(e)
    raise AssertionError(f"expected an error, got {r!r}")


FLOAT_FMT = re.compile(r"^\d+\.\d{6}$")


def mexec(model, inputs, outputs, *extra):
    """The argv of AI.MODELEXECUTE."""
    return ["AI.MODELEXECUTE", model, "INPUTS", len(inputs), *inputs, "OUTPUTS", len(outputs), *outputs, *extra]


def blocked_names(srv):
    """Names of the clients that CLIENT LIST shows as blocked (flag `b`)."""
    text = srv.raw("CLIENT", "LIST")
    assert not isinstance(text, RespError), text
    names = set()
    for line in text.decode(errors="replace").splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        if "b" in fields.get("flags", ""):
            names.add(fields.get("name", ""))
    return names


class Request(threading.Thread):
    """One command sent from its own named connection on a thread; the reply is kept as sent on the wire
    (`OK`/`TIMEDOUT` as str, errors as RespError with their full text, arrays as lists)."""

    def __init__(self, srv, name, *cmd, start=False):
        super().__init__(daemon=True)
        self.name_ = name
        self.conn = RawClient(srv.port, timeout=60)
        self.conn.send("CLIENT", "SETNAME", name)
        assert self.conn.reply() == "OK"
        self.cmd = cmd
        self.reply = None
        self.error = None
        self.elapsed = None
        if start:
            self.start()

    def run(self):
        t0 = time.monotonic()
        try:
            self.conn.send(*self.cmd)
            self.reply = self.conn.reply()
        except Exception as e:  # noqa: BLE001
            self.error = e
        finally:
            self.elapsed = time.monotonic() - t0
            self.conn.close()

    def result(self, timeout=30.0):
        self.join(timeout)
        assert not self.is_alive(), f"{self.name_}: no reply after {timeout}s"
        assert self.error is None, f"{self.name_}: {self.error!r}"
        return self.reply


def concurrent_executes(server, model, n_threads, n_runs):
    """n_threads clients each run `model` (x [2, 4] -> one output) n_runs times on inputs of their own;
    returns ({(t, i): input}, {(t, i): output}). Keys x:t:i / y:t:i are left for re-checks."""
    inputs = {(t, i): (np.full((2, 4), t, dtype=np.float32) + np.arange(8, dtype=np.float32).reshape(2, 4) * (i + 1)
                       - np.float32(i) / 7) for t in range(n_threads) for i in range(n_runs)}
    results, errors = {}, []

    def worker(t):
        c = server.client()
        try:
            for i in range(n_runs):
                set_tensor(c, f"x:{t}:{i}", inputs[t, i])
                assert model_execute(c, model, [f"x:{t}:{i}"], [f"y:{t}:{i}"]) == b"OK"
                results[t, i] = get_tensor(c, f"y:{t}:{i}")
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "workers did not finish"
    assert errors == [], errors
    assert len(results) == n_threads * n_runs
    return inputs, results


def loop_model():
    """y = x + n (a Loop of n iterations, n an INT64 scalar input): its run time grows with the value of n."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), helper.make_tensor_value_info("v_in", f, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", f, [1])],
        [helper.make_tensor("one", f, [1], [1.0])])
    return make_model([helper.make_node("Loop", ["n", "cond", "x"], ["y"], body=body)],
                      [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                       helper.make_tensor_value_info("x", f, [1])],
                      [helper.make_tensor_value_info("y", f, [1])],
                      [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])


def recorded_model_function(model_blob):
    """Work out what a recorded ONNX model computes (with the onnx package) -> (input names, fn)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(model_blob)
    g = m.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    ops = [(n.op_type, list(n.input), list(n.output)) for n in g.node]
    inputs = [i.name for i in g.input if i.name not in inits]
    if [o[0] for o in ops] == ["MatMul", "Add"]:
        (_, (x, w), (xw,)), (_, add_in, (y,)) = ops
        b_name = [n for n in add_in if n != xw][0]
        W, Bv = inits[w], inits[b_name]
        assert [o.name for o in g.output] == [y]
        return inputs, (lambda feeds: [feeds[x] @ W + Bv]), W.shape[0]
    if [o[0] for o in ops] == ["Add"]:
        (_, (p, q), (y,)), = ops
        return inputs, (lambda feeds: [feeds[p] + feeds[q]]), None
    raise AssertionError(f"unexpected recorded model graph: {ops}")


def sessions(server):
    """ai_onnxruntime_maximum_run_sessions_number: one ONNX Runtime session per worker of every device queue."""
    return int(modules_info(server)["ai_onnxruntime_maximum_run_sessions_number"])


# RedisAI's five sections in its order, then this module's own (its version and the backend memory bound, where
# backends run and their worker processes, the device queues, a line per model and script).
AI_SECTIONS = ["ai_versions", "ai_git", "ai_load_time_configs", "ai_backends_info", "ai_cpu", "ai_redisai_rs",
               "ai_workers", "ai_queues", "ai_keys"]


def check_common_sections(server, threads="1"):
    """INFO MODULES has RedisAI's sections with RedisAI's fields, then ours (docs/commands.md, "INFO MODULES")."""
    sections = modules_sections(server)
    names = [n for n, _ in sections]
    assert names[-len(AI_SECTIONS):] == AI_SECTIONS, names
    assert [n for n in names if n.startswith("ai_")] == AI_SECTIONS, names
    fields = dict(sections)
    versions = [k for k, _ in fields["ai_versions"]]
    want = ["ai_RedisAI_version", "ai_low_level_API_version", "ai_rdb_version"]
    assert [k for k in versions if k in want] == want, versions
    v = dict(fields["ai_versions"])
    assert (v["ai_RedisAI_version"], v["ai_low_level_API_version"], v["ai_rdb_version"]) == ("1.2.7", "1", "4")
    git = dict(fields["ai_git"])
    assert "ai_git_sha" in git and git["ai_git_sha"]
    assert fields["ai_load_time_configs"] == [
        ("ai_threads_per_queue", threads), ("ai_inter_op_parallelism", "0"), ("ai_intra_op_parallelism", "0"),
        ("ai_model_execution_timeout", "5000"), ("ai_backend_memory_limit", "0")]
    cpu = fields["ai_cpu"]
    want_cpu = ["ai_self_used_cpu_sys", "ai_self_used_cpu_user", "ai_children_used_cpu_sys",
                "ai_children_used_cpu_user", "ai_main_thread_used_cpu_sys", "ai_main_thread_used_cpu_user"]
    assert [k for k, _ in cpu][:6] == want_cpu
    for k, val in cpu[:6]:
        assert FLOAT_FMT.match(val) or val == "N/A", (k, val)
    return fields


# A DAG across two devices: LOAD, a model op on CPU (`m`), one on CPU:1 (`m1`) reading the first one's output,
# TENSORGET and PERSIST. `two_device_dag(con)` stores both models and the input; the DAG's reply is
# TWO_DEVICE_DAG_REPLY and its output `d` holds a**3.
TWO_DEVICE_DAG = ("LOAD", 1, "a", "PERSIST", 1, "d", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 2, "a", "a", "OUTPUTS", 1,
                  "b", "|>", "AI.MODELEXECUTE", "m1", "INPUTS", 2, "b", "a", "OUTPUTS", 1, "d", "|>",
                  "AI.TENSORGET", "d", "VALUES")
TWO_DEVICE_DAG_REPLY = [b"OK", b"OK", [b"1", b"8", b"27", b"64"]]


def two_device_dag(con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    con.execute_command("AI.MODELSTORE", "m1", "ONNX", "CPU:1", "BLOB", blob("mul"))
    set_tensor(con, "a", np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
