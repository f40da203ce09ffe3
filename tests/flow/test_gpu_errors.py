"""GPU devices on a machine without a GPU (docs/commands.md, "GPU").

Every backend parses `GPU` / `GPU:<n>`, but the default (CPU) build has no CUDA libraries, and the flow tests
run where there is no GPU. Every GPU request must then fail with a clear error, create nothing, and leave the
rest of the server as it was: CPU models and scripts in the same server keep working, INFO is unchanged.

Exact replies (RedisAI's for ONNX and TF; the others are this module's):
  ONNX    ERR GPU requested but ONNX couldn't find CUDA
  TF      ERR GPU requested but TF couldn't find CUDA
  TFLITE  ERR GPU requested but TFLITE has no GPU support in this module
  TORCH   ERR GPU requested but Torch couldn't find CUDA (models and scripts)

On a machine with a GPU, scripts/gpu-check.sh checks the other side (models on GPU:0 give the CPU results;
GPU:<number of GPUs> is refused).
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import redis

from helpers.checks import check_error_raw, error_text
from helpers.data import DATA_DIR
from helpers.onnx_models import blob, get_tensor, model_execute, modules_sections, set_tensor, store
from helpers.resp import raw_command
from helpers.server import MODULE_PATH, REPO_ROOT, SERVER_BIN
from helpers.tf_models import tf_blob
from helpers.torch_models import entry, pt_blob, pt_store


GPU_DEVICES = ["GPU", "GPU:0", "GPU:1", "gpu:1"]

ONNX_GPU_ERROR = "ERR GPU requested but ONNX couldn't find CUDA"
TF_GPU_ERROR = "ERR GPU requested but TF couldn't find CUDA"
TFLITE_GPU_ERROR = "ERR GPU requested but TFLITE has no GPU support in this module"
# torch/src/lib.rs (rai_torch_model_load, rai_torch_script_compile), sent with `ERR ` like the three above.
TORCH_GPU_ERROR = "ERR GPU requested but Torch couldn't find CUDA"

SRC = entry("bar", "return tensors[0] + tensors[1]")


def data(name):
    return (DATA_DIR / name).read_bytes()


def io_args(inputs, outputs):
    return ["INPUTS", len(inputs), *inputs, "OUTPUTS", len(outputs), *outputs]


def gpu_stores(device):
    """(backend, expected error, MODELSTORE command) for each backend on `device`."""
    return [
        ("ONNX", ONNX_GPU_ERROR, ["AI.MODELSTORE", "m", "ONNX", device, "BLOB", blob("mul")]),
        ("TF", TF_GPU_ERROR, ["AI.MODELSTORE", "m", "TF", device, *io_args(["x"], ["y"]), "BLOB", data("tf_dense.pb")]),
        ("TFLITE", TFLITE_GPU_ERROR, ["AI.MODELSTORE", "m", "TFLITE", device, "BLOB", data("tflite_sub_mul.tflite")]),
        ("TORCH", TORCH_GPU_ERROR, ["AI.MODELSTORE", "m", "TORCH", device, "BLOB", pt_blob("torch_add")]),
    ]


@pytest.mark.parametrize("device", GPU_DEVICES)
@pytest.mark.parametrize("backend", ["ONNX", "TF", "TFLITE", "TORCH"])
def test_modelstore_gpu(con, port, backend, device):
    [(_, msg, cmd)] = [s for s in gpu_stores(device) if s[0] == backend]
    check_error_raw(port, msg, *cmd)
    # the deprecated AI.MODELSET takes the same path
    check_error_raw(port, msg, "AI.MODELSET", *cmd[1:])
    assert con.exists("m") == 0
    assert con.execute_command("AI._MODELSCAN") == []


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_scriptstore_gpu(con, port, device):
    check_error_raw(port, TORCH_GPU_ERROR, "AI.SCRIPTSTORE", "s", device, "ENTRY_POINTS", 1, "bar", "SOURCE", SRC)
    check_error_raw(port, TORCH_GPU_ERROR, "AI.SCRIPTSET", "s", device, "SOURCE", "def bar(a, b):\n    return a + b\n")
    assert con.exists("s") == 0
    check_error_raw(port, "ERR script key is empty",
                    "AI.SCRIPTEXECUTE", "s", "bar", "KEYS", 1, "a", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")


def test_gpu_device_without_cuda(con):
    store(con, "cpu", "mul")
    for dev in ("GPU", "GPU:0", "gpu:1"):
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command("AI.MODELSTORE", "m", "ONNX", dev, "BLOB", blob("mul"))
        assert "CUDA" in str(e.value), str(e.value)
        assert con.exists("m") == 0
    assert con.execute_command("AI._MODELSCAN") == [[b"cpu", b""]]
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    assert model_execute(con, "cpu", ["a", "a"], ["c"]) == b"OK"


@pytest.mark.parametrize("device", ["GPU", "GPU:0", "gpu:1"])
def test_gpu_device_tf(con, port, device):
    check_error_raw(port, "ERR GPU requested but TF couldn't find CUDA",
                    "AI.MODELSTORE", "m", "TF", device, *io_args(["x"], ["y"]), "BLOB", tf_blob("dense"))
    assert con.exists("m") == 0


@pytest.mark.parametrize("device", ["GPU", "GPU:0", "gpu:1"])
def test_modelstore_gpu_device_torch(con, device):
    for cmd in (["AI.MODELSTORE", "m", "TORCH", device, "BLOB", pt_blob("torch_add")],
                ["AI.MODELSET", "m", "TORCH", device, "BLOB", pt_blob("torch_add")]):
        msg = error_text(con.execute_command, *cmd)
        assert "CUDA" in msg, msg
    assert con.exists("m") == 0


def test_failed_gpu_store_keeps_the_cpu_model(con, port):
    """A failed MODELSTORE on GPU does not replace the CPU model already at the key, for every backend."""
    store(con, "m", "mul", "TAG", "cpu")
    for backend, msg, cmd in gpu_stores("GPU:0"):
        if backend == "ONNX":
            check_error_raw(port, msg, *cmd[:4], "TAG", "gpu", *cmd[4:])
        else:
            check_error_raw(port, msg, *cmd)
    meta = con.execute_command("AI.MODELGET", "m", "META")
    assert meta[:6] == [b"backend", b"ONNX", b"device", b"CPU", b"tag", b"cpu"], meta
    set_tensor(con, "a", np.array([[3.0]], dtype=np.float32))
    assert model_execute(con, "m", ["a", "a"], ["c"]) == b"OK"
    assert get_tensor(con, "c").tolist() == [[9.0]]


def test_dag_naming_a_gpu_model(con, port):
    """A DAG naming the key of a model whose GPU store failed gets the module's error; nothing is persisted.
    The same DAG with the CPU model in the same server works."""
    store(con, "cpu", "mul")
    set_tensor(con, "a", np.array([[2.0]], dtype=np.float32))
    for _, msg, cmd in gpu_stores("GPU"):
        cmd = list(cmd)
        cmd[1] = "gpu"
        check_error_raw(port, msg, *cmd)
    assert con.exists("gpu") == 0
    for dag in (["AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "c", "|>",
                 "AI.MODELEXECUTE", "gpu", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c"],
                ["AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "c", "|>",
                 "AI.MODELEXECUTE", "cpu", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b", "|>",
                 "AI.MODELEXECUTE", "gpu", "INPUTS", 2, "b", "b", "OUTPUTS", 1, "c"],
                ["AI.DAGRUN", "LOAD", 1, "a", "|>", "AI.MODELRUN", "gpu", "INPUTS", "a", "a", "OUTPUTS", "c"]):
        check_error_raw(port, "ERR model key is empty", *dag)
    check_error_raw(port, "ERR model key is empty", "AI.MODELEXECUTE", "gpu", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "c")
    assert con.exists("c") == 0
    reply = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "a", "PERSIST", 1, "c", "|>",
                                "AI.MODELEXECUTE", "cpu", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b", "|>",
                                "AI.MODELEXECUTE", "cpu", "INPUTS", 2, "b", "b", "OUTPUTS", 1, "c")
    assert reply == [b"OK", b"OK"], reply
    assert get_tensor(con, "c").tolist() == [[16.0]]


def test_cpu_models_and_info_unchanged(con, port, shared_server):
    """GPU failures of every kind leave the server as it was: the same INFO sections and backend versions, no
    run counted, CPU models of all four backends and a CPU script still run."""
    # Backends load at first use, and a GPU request loads its backend before failing: the first round adds
    # its version to INFO; any later failure must change nothing.
    for _, msg, cmd in gpu_stores("GPU"):
        check_error_raw(port, msg, *cmd)
    before = dict(modules_sections(shared_server))
    for device in GPU_DEVICES:
        for _, msg, cmd in gpu_stores(device):
            check_error_raw(port, msg, *cmd)
        check_error_raw(port, TORCH_GPU_ERROR, "AI.SCRIPTSTORE", "s", device, "ENTRY_POINTS", 1, "bar", "SOURCE", SRC)
    after = dict(modules_sections(shared_server))
    assert list(after) == list(before)
    assert after["ai_backends_info"] == before["ai_backends_info"]
    assert after["ai_versions"] == before["ai_versions"]
    assert after["ai_redisai_rs"] == before["ai_redisai_rs"]
    assert con.execute_command("AI._MODELSCAN") == [] and con.execute_command("AI._SCRIPTSCAN") == []

    x = np.array([[1.0, 2.0]], dtype=np.float32)
    set_tensor(con, "x", x)
    store(con, "onnx", "mul")
    assert con.execute_command("AI.MODELSTORE", "tf", "TF", "CPU", *io_args(["a", "b"], ["c"]),
                               "BLOB", data("tf_mul.pb")) == b"OK"
    tflite = data("tflite_sub_mul.tflite")
    assert con.execute_command("AI.MODELSTORE", "tflite", "TFLITE", "CPU", "BLOB", tflite) == b"OK"
    pt_store(con, "torch", "torch_add")
    assert con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "bar", "SOURCE", SRC) == b"OK"
    for key in ("onnx", "tf", "torch"):
        assert model_execute(con, key, ["x", "x"], ["y"]) == b"OK"
        expected = x * x if key != "torch" else x + x
        assert get_tensor(con, "y").tolist() == expected.tolist(), key
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "bar", "INPUTS", 2, "x", "x", "OUTPUTS", 1, "z") == b"OK"
    assert get_tensor(con, "z").tolist() == (x + x).tolist()
    assert model_execute(con, "tflite", ["x", "x"], ["d", "p"]) == b"OK"
    assert get_tensor(con, "p").tolist() == (x * x).tolist()
    assert isinstance(raw_command(port, "INFO", "everything"), bytes)
    assert con.ping()


# =================================================================================================
# scripts/gpu-check.sh where there is no GPU


GPU_CHECK = str(REPO_ROOT / "scripts" / "gpu-check.sh")


def run_gpu_check(*args, path_prefix=None, env=None, timeout=300):
    e = dict(os.environ, REDISAI_MODULE=MODULE_PATH, REDIS_SERVER=shutil.which(SERVER_BIN) or SERVER_BIN,
             GPU_CHECK_SECONDS="0.3", **(env or {}))
    # no nvidia-smi, unless path_prefix brings one
    e["PATH"] = os.pathsep.join(([path_prefix] if path_prefix else [])
                                + [d for d in e["PATH"].split(os.pathsep)
                                   if not os.path.exists(os.path.join(d, "nvidia-smi"))])
    return subprocess.run([GPU_CHECK, *args], capture_output=True, text=True, env=e, timeout=timeout)


def test_gpu_check_without_gpu():
    """No nvidia-smi: a clear message, one summary line, exit 2, and no server started."""
    r = run_gpu_check()
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "GPU-CHECK NO-GPU nvidia-smi not found\n", r.stdout
    assert "gpu-check: no NVIDIA GPU here: nvidia-smi is not on PATH, so there is nothing to check." in r.stderr


def test_gpu_check_nvidia_smi_without_gpu(tmp_path):
    """An nvidia-smi that lists no GPU (a driver without a card) is no GPU either."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    r = run_gpu_check(path_prefix=str(tmp_path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "GPU-CHECK NO-GPU nvidia-smi lists no GPU\n", r.stdout
    assert "nvidia-smi is here but lists no GPU (No devices were found)" in r.stderr


def test_gpu_check_gpu_without_cuda_libraries(tmp_path):
    """A GPU (a fake nvidia-smi) but no CUDA libraries for the backends: both are skipped, each with the reason,
    exit 3."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Fake GPU'\n")
    fake.chmod(0o755)
    r = run_gpu_check(path_prefix=str(tmp_path), env={"TORCH_LIB_DIR": "/nonexistent", "CUDA_LIB_DIRS": "/nonexistent"})
    assert r.returncode == 3, (r.stdout, r.stderr)
    [line] = r.stdout.splitlines()
    assert line.startswith('GPU-CHECK SKIP gpus=1 gpu0="Fake GPU" mode=in_process torch=skip("'), line
    assert 'onnx=skip("' in line, line


@pytest.mark.parametrize("args,mode", [("", "in_process"), ("EXECUTION_MODE ISOLATED", "isolated")])
def test_gpu_check_dry_run_on_cpu(args, mode):
    """--dry-run-on-cpu runs every check of the script with CPU:1 for GPU:0 and the CPU backends, in this process
    or (GPU_CHECK_MODULE_ARGS) in backend workers; the summary says which."""
    r = run_gpu_check("--dry-run-on-cpu", env={"GPU_CHECK_MODULE_ARGS": args})
    assert r.returncode == 0, (r.stdout, r.stderr)
    [line] = r.stdout.splitlines()
    assert line.startswith('GPU-CHECK DRY-RUN-PASS gpus=0 gpu0="none (dry run: CPU:1 stands for GPU:0)" '
                           f"mode={mode} torch=loaded onnx=loaded dag_parallel/serial="), line
    assert "heavy.onnx_gpu/cpu=" in line and "torch_slow.pt_gpu/cpu=" in line, line
    # What the workers' sandboxes refused, if anything: counted per worker, each call named on stderr.
    for part in line.split():
        if part.startswith("refused["):
            assert mode == "isolated" and re.fullmatch(r"refused\[\w+\]=\d+\(last=\w+\)", part), part
            assert "refused system call" in r.stderr, r.stderr
    for name in ("torch_add", "torch_two_outputs", "torch_slow", "onnx_linear", "onnx_heavy", "dag_cpu_gpu",
                 "throughput_heavy_onnx", "throughput_torch_slow"):
        assert f"gpu-check: {name}: pass" in r.stderr, (name, r.stderr)
