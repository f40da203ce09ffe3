"""`make dist`: the tarball in RedisAI's deployment layout runs on its own. It is unpacked into an empty folder and
redis-server starts it with the arguments RedisAI deployments pass (backend paths relative to BACKENDSPATH,
which defaults to <module dir>/backends); every backend then runs a model, and every backend library the server
mapped comes from the unpacked folder, not from the build's cache.

REDISAI_DIST names the tarball (`make test` builds it with `make dist` and sets it)."""
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from helpers.onnx_models import blob, get_tensor, set_tensor

DIST = os.environ.get("REDISAI_DIST")
DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    if not DIST or not os.path.isfile(DIST):
        pytest.fail(f"REDISAI_DIST={DIST!r} is not a tarball: run `make dist` (make test does)", pytrace=False)
    into = tmp_path_factory.mktemp("dist")
    with tarfile.open(DIST) as t:
        t.extractall(into, filter="tar")
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    return root


def mapped_libraries(pid):
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if ".so" in line.split()[-1]}


def test_dist_layout_runs_every_backend_with_redisai_arguments(make_server, unpacked):
    srv = make_server(load_module=False, server_args=[
        "--loadmodule", str(unpacked / "redisai.so"),
        "ONNX", "redisai_onnxruntime/redisai_onnxruntime.so",
        "TF", "redisai_tensorflow/redisai_tensorflow.so",
        "TFLITE", "redisai_tflite/redisai_tflite.so"])
    c = srv.client()
    assert c.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == str(unpacked / "backends").encode()
    assert c.execute_command("AI.CONFIG", "LOADBACKEND", "TORCH", "redisai_torch/redisai_torch.so") == b"OK"

    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([[5.0, 6.0], [7.0, 8.0]], dtype=np.float32)
    set_tensor(c, "a", a)
    set_tensor(c, "b", b)
    c.execute_command("AI.MODELSTORE", "onnx", "ONNX", "CPU", "BLOB", blob("mul"))
    c.execute_command("AI.MODELSTORE", "tf", "TF", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                      "BLOB", (DATA / "tf_mul.pb").read_bytes())
    c.execute_command("AI.MODELSTORE", "tflite", "TFLITE", "CPU", "BLOB", (DATA / "tflite_sub_mul.tflite").read_bytes())
    c.execute_command("AI.MODELSTORE", "torch", "TORCH", "CPU", "BLOB", (DATA / "torch_add.pt").read_bytes())
    for key in ("onnx", "tf", "torch"):
        c.execute_command("AI.MODELEXECUTE", key, "INPUTS", 2, "a", "b", "OUTPUTS", 1, "out:" + key)
    c.execute_command("AI.MODELEXECUTE", "tflite", "INPUTS", 2, "a", "b", "OUTPUTS", 2, "diff", "prod")
    np.testing.assert_allclose(get_tensor(c, "out:onnx"), a * b)
    np.testing.assert_allclose(get_tensor(c, "out:tf"), a * b)
    np.testing.assert_allclose(get_tensor(c, "out:torch"), a + b)
    np.testing.assert_allclose(get_tensor(c, "diff"), a - b)
    np.testing.assert_allclose(get_tensor(c, "prod"), a * b)

    libs = mapped_libraries(srv.pid)
    backend_libs = [p for p in libs if any(n in p for n in ("onnxruntime", "tensorflow", "tflite", "LiteRt", "torch",
                                                          "c10", "redisai"))]
    outside = [p for p in backend_libs if not p.startswith(str(unpacked))]
    assert not outside, f"libraries loaded from outside the unpacked dist: {outside}"
    for name in ("redisai_onnxruntime.so", "redisai_tensorflow.so", "redisai_tflite.so", "redisai_torch.so",
                 "libtorch_cpu.so"):
        assert any(p.endswith(name) for p in backend_libs), (name, backend_libs)


def test_dist_finds_its_backends_without_arguments(make_server, unpacked):
    """No load-time arguments at all: each backend is found under the default BACKENDSPATH at first use."""
    srv = make_server(load_module=False, server_args=["--loadmodule", str(unpacked / "redisai.so")])
    c = srv.client()
    set_tensor(c, "a", np.array([[2.0]], dtype=np.float32))
    c.execute_command("AI.MODELSTORE", "onnx", "ONNX", "CPU", "BLOB", blob("mul"))
    c.execute_command("AI.MODELSTORE", "torch", "TORCH", "CPU", "BLOB", (DATA / "torch_add.pt").read_bytes())
    c.execute_command("AI.MODELEXECUTE", "onnx", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "x")
    c.execute_command("AI.MODELEXECUTE", "torch", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "y")
    assert get_tensor(c, "x").tolist() == [[4.0]] and get_tensor(c, "y").tolist() == [[4.0]]
    libs = mapped_libraries(srv.pid)
    assert any(p.startswith(str(unpacked)) and p.endswith("redisai_onnxruntime.so") for p in libs)
    assert any(p.startswith(str(unpacked)) and p.endswith("redisai_torch.so") for p in libs)
