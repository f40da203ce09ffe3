"""`make wheel`: the redisai-rs wheel, installed into fresh venvs the way users install it, runs.

REDISAI_WHEEL names the wheel, or the folder holding it (`make test` builds it with `make wheel` into target/wheel
and sets it). The backend wheels come from the wheelhouse of scripts/fetch-backend.sh (the files the build
downloaded once, ~/.cache/redisai-rs/wheels/<backend>-<version>/: no second download), installed with --no-deps:
the module needs their shared libraries only, so their pure-Python dependencies (numpy, protobuf, keras, sympy,
...) and torch's CUDA stack are left out, except nvidia-cuda-runtime and nvidia-cuda-cupti, which libtorch_cpu.so
links (the manifest's torch entry). What `pip install 'redisai-rs[...]'` would resolve is checked on the wheel's
metadata instead: each extra requires the exact pins of scripts/backends.manifest. The redisai-py client and its
dependencies (tests/requirements-wheel-client.txt) are downloaded from PyPI once into the same cache.

Two venvs: one with every backend (`redisai-rs[all]`), where `redisai-rs-server` (redis-server from PATH) runs the
README example, a model per backend and redisai-py's basic flow, and one with the default dependency only, where a
TF model gets the error that says what to install. The launcher's refusals (no redis-server on PATH, a backend
whose version is not the pin) are checked there too. This file runs once per `make test` (on the first server of
the matrix): the venvs are deleted afterwards (the full one is 2.5 GB), the servers' logs are kept."""
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import redis

from helpers.onnx_models import blob, get_tensor, set_tensor
from helpers.server import REPO_ROOT, SERVER_BIN, free_port

WHEEL = os.environ.get("REDISAI_WHEEL")
DATA = REPO_ROOT / "tests" / "data"
CLIENT_REQS = REPO_ROOT / "tests" / "requirements-wheel-client.txt"
CACHE = Path(os.environ.get("REDISAI_CACHE") or Path.home() / ".cache" / "redisai-rs")
VERSION = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "Cargo.toml").read_text(), re.M).group(1)
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input"]


def manifest_pins():
    """{backend: [requirement==version, ...]} of scripts/backends.manifest, in file order."""
    pins = {}
    for line in (REPO_ROOT / "scripts" / "backends.manifest").read_text().splitlines():
        f = line.split("#", 1)[0].split()
        if f:
            pins.setdefault(f[0], []).append(f[2])
    return pins


PINS = manifest_pins()
ORT, TF, TFLITE, TORCH = (PINS[b][0] for b in ("onnxruntime", "tensorflow", "litert", "torch"))


def run(cmd, timeout=600, check=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout}\n{r.stderr}", pytrace=False)
    return r


@pytest.fixture(scope="module")
def wheel():
    path = Path(WHEEL) if WHEEL else None
    if path is not None and path.is_dir():
        found = sorted(path.glob("redisai_rs-*.whl"))
        path = found[0] if len(found) == 1 else None
    if path is None or not path.is_file():
        pytest.fail(f"REDISAI_WHEEL={WHEEL!r} is not the wheel (or a folder with one): run `make wheel` "
                    "(make test does)", pytrace=False)
    return path


@pytest.fixture(scope="module")
def backend_wheelhouse():
    """The wheelhouse dirs of every backend (fetch-backend.sh downloads only what the cache lacks)."""
    out = run([REPO_ROOT / "scripts" / "fetch-backend.sh", "--wheels", "all"]).stdout.split()
    assert len(out) == len(PINS), out
    # fetch-backend.sh resolves the backend wheels for CPython 3.11: a venv of another Python cannot take them.
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    other = [w.name for d in out for w in Path(d).glob("*.whl") if "-cp3" in w.name and f"-{here}-" not in w.name]
    if other:
        pytest.fail(f"the wheelhouse holds wheels for another Python than this {here} ({other}): run the flow "
                    "tests with Python 3.11 (.venv, make venv)", pytrace=False)
    return out


@pytest.fixture(scope="module")
def client_wheelhouse():
    """tests/requirements-wheel-client.txt's wheels, downloaded from PyPI once."""
    digest = hashlib.sha256(CLIENT_REQS.read_bytes()).hexdigest()[:12]
    d = CACHE / "wheels" / f"client-{digest}"
    if not (d / ".complete").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-client-", dir=d.parent if d.parent.is_dir() else None))
        run([sys.executable, *PIP, "download", "--quiet", "--only-binary=:all:", "--no-deps", "-d", tmp,
             "-r", CLIENT_REQS])
        (tmp / ".complete").write_text(CLIENT_REQS.read_text())
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d


def make_venv(tmp_root, name, wheel, wheelhouses, requirements):
    """A fresh venv with the redisai-rs wheel and `requirements` from the wheelhouses (nothing from an index)."""
    venv = Path(tmp_root) / name
    run([sys.executable, "-m", "venv", venv], timeout=120)
    find = [a for d in [wheel.parent, *wheelhouses] for a in ("--find-links", d)]
    # --no-compile: no .pyc for torch's and TensorFlow's Python code (the test runs none of it): 26 s, not 75.
    run([venv / "bin" / "python", *PIP, "install", "--quiet", "--no-compile", "--no-index", "--no-deps", *find,
         f"redisai-rs=={VERSION}", *requirements], timeout=900)
    return venv


@pytest.fixture(scope="module")
def venvs():
    root = tempfile.mkdtemp(prefix="redisai-wheel-venvs-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def full_venv(venvs, wheel, backend_wheelhouse, client_wheelhouse):
    """`redisai-rs[all]`: every backend's wheel (and libtorch_cpu's two CUDA runtime wheels), the client."""
    backends = [req for b in ("onnxruntime", "tensorflow", "litert", "torch") for req in PINS[b]]
    return make_venv(venvs, "all", wheel, backend_wheelhouse + [client_wheelhouse],
                     backends + ["-r", CLIENT_REQS])


@pytest.fixture(scope="module")
def default_venv(venvs, wheel, backend_wheelhouse):
    """`redisai-rs`: the default dependency (ONNX Runtime) only."""
    return make_venv(venvs, "default", wheel, backend_wheelhouse, [ORT])


def server_path_env():
    """PATH with the matrix's server first, when it is a redis-server (else it is given with --redis-server)."""
    server = shutil.which(SERVER_BIN)
    assert server, f"server {SERVER_BIN!r} not found"
    env = dict(os.environ)
    env.pop("REDIS_SERVER", None)  # the launcher would take it: the test means PATH
    env["PATH"] = os.path.dirname(server) + os.pathsep + env.get("PATH", "")
    args = [] if os.path.basename(server) == "redis-server" else ["--redis-server", server]
    return env, args


class Launched:
    """redisai-rs-server of a venv on a free port, in its own folder (its log stays there)."""

    def __init__(self, venv, workdir, module_args=()):
        env, launcher_args = server_path_env()
        self.port = free_port()
        self.dir = Path(workdir)
        self.log = self.dir / "redis.log"
        self.cmd = [str(venv / "bin" / "redisai-rs-server"), *launcher_args, "--port", str(self.port),
                    "--bind", "127.0.0.1", "--dir", str(self.dir), "--logfile", str(self.log), "--save", "",
                    "--appendonly", "no"]
        if module_args:
            self.cmd += ["--", *module_args]
        self.stderr = open(self.dir / "launcher.err", "w+")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.stderr, env=env)
        self.con = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.con.ping():
                    break
            except (redis.ConnectionError, socket.error):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"redisai-rs-server did not start ({self.cmd}):\n{self.launcher_stderr()}\n"
                            f"{self.log.read_text() if self.log.exists() else ''}", pytrace=False)
            time.sleep(0.1)

    def launcher_stderr(self):
        self.stderr.seek(0)
        return self.stderr.read()

    def mapped_libraries(self):
        # The launcher execs redis-server: its pid is the server's.
        with open(f"/proc/{self.proc.pid}/maps") as f:
            return {line.split()[-1] for line in f if ".so" in line.split()[-1]}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def full_server(full_venv, tmp_path_factory):
    srv = Launched(full_venv, tmp_path_factory.mktemp("wheel-all-server"),
                   module_args=["THREADS_PER_QUEUE", "2", "MODEL_CHUNK_SIZE", "65536"])
    yield srv
    srv.stop()


# ------------------------------------------------------------------------------------------------------------


def test_wheel_is_small_manylinux_and_pins_the_manifest(wheel):
    assert re.fullmatch(rf"redisai_rs-{re.escape(VERSION)}-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name)
    assert wheel.stat().st_size < 8 * 2**20, wheel.stat().st_size
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"redisai_rs-{VERSION}.dist-info/METADATA").decode()
        entry_points = z.read(f"redisai_rs-{VERSION}.dist-info/entry_points.txt").decode()
    for f in ("libredisai.so", "libredisai_torch.so", "libredisai_torch_cuda.so"):
        assert f"redisai_rs/lib/{f}" in names
    requires = re.findall(r"^Requires-Dist: (.*)$", meta, re.M)
    assert sorted(requires) == sorted([
        ORT,
        f'{TF}; extra == "tf"', f'{TFLITE}; extra == "tflite"', f'{TORCH}; extra == "torch"',
        f'{TORCH}; extra == "gpu"',
        f'{TF}; extra == "all"', f'{TFLITE}; extra == "all"', f'{TORCH}; extra == "all"']), requires
    assert "redisai-rs-server = redisai_rs._cli:server_main" in entry_points
    assert "redisai-rs = redisai_rs._cli:main" in entry_points


def test_version_and_loadmodule_line(full_venv):
    py = full_venv / "bin" / "python"
    out = run([py, "-m", "redisai_rs", "--version"]).stdout
    assert f"redisai-rs {VERSION} " in out, out
    for name, pin in (("ONNX", ORT), ("TF", TF), ("TFLITE", TFLITE), ("TORCH", TORCH)):
        dist, ver = pin.split("==")
        assert re.search(rf"^  {name} +{re.escape(dist)} {re.escape(ver)} ", out, re.M), (name, out)

    line = run([full_venv / "bin" / "redisai-rs", "--loadmodule-line"]).stdout.strip()
    words = line.split()
    assert words[0] == "loadmodule" and words[1].endswith("/redisai_rs/lib/libredisai.so"), line
    args = dict(zip(words[2::2], words[3::2]))
    assert list(args) == ["ONNX", "TF", "TFLITE", "TORCH"], line
    site = Path(words[1]).parent.parent.parent
    assert args["TORCH"] == str(site / "redisai_rs" / "lib" / "libredisai_torch.so")
    for path in [words[1], *args.values()]:
        assert Path(path).is_file() and Path(path).resolve().is_relative_to(full_venv.resolve()), path
    # RedisAI's load-time arguments go after the backends, unchanged.
    extra = run([full_venv / "bin" / "redisai-rs", "--loadmodule-line", "THREADS_PER_QUEUE", "4"]).stdout
    assert extra.strip() == line + " THREADS_PER_QUEUE 4"

    # What the dynamic linker makes of the installed libraries: every one found, libtorch in the venv's torch.
    for so in ("libredisai.so", "libredisai_torch.so"):
        ldd = run(["ldd", site / "redisai_rs" / "lib" / so]).stdout
        assert "not found" not in ldd, ldd
        if so == "libredisai_torch.so":
            torch_cpu = re.search(r"libtorch_cpu\.so => (\S+)", ldd).group(1)
            assert Path(torch_cpu).resolve() == (site / "torch" / "lib" / "libtorch_cpu.so").resolve(), ldd


def test_server_runs_readme_example_and_a_model_per_backend(full_server, full_venv):
    c = full_server.con
    # README's example, command for command.
    assert c.execute_command("AI.MODELSTORE", "mymodel", "ONNX", "CPU", "BLOB", blob("mul")) == b"OK"
    assert c.execute_command("AI.TENSORSET", "a", "FLOAT", 2, 2, "VALUES", 1, 2, 3, 4) == b"OK"
    assert c.execute_command("AI.TENSORSET", "b", "FLOAT", 2, 2, "VALUES", 5, 6, 7, 8) == b"OK"
    assert c.execute_command("AI.MODELEXECUTE", "mymodel", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c") == b"OK"
    assert [float(v) for v in c.execute_command("AI.TENSORGET", "c", "VALUES")] == [5, 12, 21, 32]

    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([[5.0, 6.0], [7.0, 8.0]], dtype=np.float32)
    set_tensor(c, "a", a)
    set_tensor(c, "b", b)
    c.execute_command("AI.MODELSTORE", "tf", "TF", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                      "BLOB", (DATA / "tf_mul.pb").read_bytes())
    c.execute_command("AI.MODELSTORE", "tflite", "TFLITE", "CPU", "BLOB", (DATA / "tflite_sub_mul.tflite").read_bytes())
    c.execute_command("AI.MODELSTORE", "torch", "TORCH", "CPU", "BLOB", (DATA / "torch_add.pt").read_bytes())
    c.execute_command("AI.MODELEXECUTE", "tf", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "out:tf")
    c.execute_command("AI.MODELEXECUTE", "torch", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "out:torch")
    c.execute_command("AI.MODELEXECUTE", "tflite", "INPUTS", 2, "a", "b", "OUTPUTS", 2, "diff", "prod")
    np.testing.assert_allclose(get_tensor(c, "out:tf"), a * b)
    np.testing.assert_allclose(get_tensor(c, "out:torch"), a + b)
    np.testing.assert_allclose(get_tensor(c, "diff"), a - b)
    np.testing.assert_allclose(get_tensor(c, "prod"), a * b)

    # The load-time arguments after `--` reached the module.
    info = c.info("modules")
    assert info["ai_threads_per_queue"] == 2 and info["ai_redisai_rs_version"] == VERSION, info
    assert c.execute_command("AI.CONFIG", "GET", "MODEL_CHUNK_SIZE") == 65536

    # Every backend library the server mapped is the venv's: none from the build's cache.
    venv = str(full_venv.resolve())
    libs = full_server.mapped_libraries()
    backend_libs = [p for p in libs if any(n in p for n in ("onnxruntime", "tensorflow", "LiteRt", "torch", "c10",
                                                          "redisai", "nvidia"))]
    outside = [p for p in backend_libs if not p.startswith(venv)]
    assert not outside, f"libraries loaded from outside the venv: {outside}"
    for suffix in ("redisai_rs/lib/libredisai.so", "redisai_rs/lib/libredisai_torch.so",
                   f"onnxruntime/capi/libonnxruntime.so.{ORT.split('==')[1]}",
                   "tensorflow/libtensorflow_cc.so.2", "ai_edge_litert/libLiteRt.so", "torch/lib/libtorch_cpu.so"):
        assert any(p.endswith(suffix) for p in backend_libs), (suffix, sorted(backend_libs))


CLIENT_FLOW = r"""
import json, sys
import numpy as np
import redisai
from redisai import Client

c = Client(host="127.0.0.1", port=int(sys.argv[1]), decode_responses=False)
out = {}
c.tensorset("x", np.array([[1, 2], [3, 4]], dtype=np.float32))
c.tensorset("y", [5, 6, 7, 8], shape=(2, 2), dtype="float")
out["tensorget"] = c.tensorget("x").tolist()
out["tensorget_meta"] = c.tensorget("y", meta_only=True)
out["modelstore"] = c.modelstore("m", "ONNX", "CPU", open(sys.argv[2], "rb").read(), tag="v1")
meta = c.modelget("m", meta_only=True)
out["modelget"] = [meta["backend"], meta["device"], meta["tag"]]
out["modelexecute"] = c.modelexecute("m", inputs=["x", "y"], outputs=["z"])
out["z"] = c.tensorget("z").tolist()
out["torch_modelstore"] = c.modelstore("t", "TORCH", "CPU", open(sys.argv[3], "rb").read())
c.modelexecute("t", inputs=["x", "y"], outputs=["w"])
out["w"] = c.tensorget("w").tolist()
script = "def mul(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] * tensors[1]\n"
out["scriptstore"] = c.scriptstore("s", "CPU", script, entry_points=["mul"])
out["scriptexecute"] = c.scriptexecute("s", "mul", keys=["x", "y"], inputs=["x", "y"], outputs=["v"])
out["v"] = c.tensorget("v").tolist()
dag = c.dag(load=["x"], persist=["u"])
dag.tensorset("one", np.ones((2, 2), dtype=np.float32))
dag.modelexecute("m", inputs=["one", "x"], outputs=["u"])
dag.tensorget("u")
res = dag.execute()
out["dag"] = [res[0], res[1], res[2].tolist()]
info = c.infoget("m")
out["info"] = [info["key"], info["backend"], info["calls"]]
out["modeldel"] = c.modeldel("m")
out["scriptdel"] = c.scriptdel("s")
out["versions"] = [redisai.__name__]
print(json.dumps(out))
"""


def test_redisai_py_client_basic_flow(full_server, full_venv, tmp_path):
    script = tmp_path / "client_flow.py"
    script.write_text(CLIENT_FLOW)
    r = run([full_venv / "bin" / "python", script, full_server.port, DATA / "mul.onnx", DATA / "torch_add.pt"],
            timeout=120)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    x, y = [[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]
    assert out["tensorget"] == x
    assert out["tensorget_meta"] == {"dtype": "FLOAT", "shape": [2, 2]}
    assert out["modelstore"] == "OK" and out["modelget"] == ["ONNX", "CPU", "v1"]
    assert out["modelexecute"] == "OK" and out["z"] == [[5.0, 12.0], [21.0, 32.0]]
    assert out["torch_modelstore"] == "OK" and out["w"] == [[6.0, 8.0], [10.0, 12.0]]
    assert out["scriptstore"] == "OK" and out["scriptexecute"] == "OK" and out["v"] == [[5.0, 12.0], [21.0, 32.0]]
    assert out["dag"] == ["OK", "OK", x]
    assert out["info"] == ["m", "ONNX", 2]
    assert out["modeldel"] == "OK" and out["scriptdel"] == "OK"


def test_default_extra_serves_onnx_and_says_what_to_install_for_the_others(default_venv, tmp_path):
    out = run([default_venv / "bin" / "python", "-m", "redisai_rs", "--version"]).stdout
    assert re.search(rf"^  ONNX +{re.escape(ORT.replace('==', ' '))} ", out, re.M), out
    assert f"TF      not installed (pip install 'redisai-rs[tf]=={VERSION}')" in out, out
    assert f"TORCH   not installed (pip install 'redisai-rs[torch]=={VERSION}')" in out, out

    srv = Launched(default_venv, tmp_path)
    try:
        c = srv.con
        set_tensor(c, "a", np.array([[2.0]], dtype=np.float32))
        c.execute_command("AI.MODELSTORE", "onnx", "ONNX", "CPU", "BLOB", blob("mul"))
        c.execute_command("AI.MODELEXECUTE", "onnx", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "x")
        assert get_tensor(c, "x").tolist() == [[4.0]]
        for backend, extra, args, data in (
                ("TF", "tf", ["INPUTS", 2, "a", "b", "OUTPUTS", 1, "c"], "tf_mul.pb"),
                ("TFLITE", "tflite", [], "tflite_sub_mul.tflite"),
                ("TORCH", "torch", [], "torch_add.pt")):
            with pytest.raises(redis.ResponseError) as e:
                c.execute_command("AI.MODELSTORE", "m", backend, "CPU", *args, "BLOB", (DATA / data).read_bytes())
            msg = str(e.value)
            assert msg == (f"Could not load backend {backend}: it is not installed "
                           f"(pip install 'redisai-rs[{extra}]=={VERSION}', then restart the server)"), msg
            assert not c.exists("m")
        # The launcher said so at start.
        err = srv.launcher_stderr()
        assert f"TF: tensorflow-cpu is not installed; models of this backend will fail to load until you run " \
               f"pip install 'redisai-rs[tf]=={VERSION}' and restart" in err, err
        # It still serves after the refusals.
        assert c.ping()
    finally:
        srv.stop()


def test_launcher_without_redis_server_says_what_to_do(default_venv):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_SERVER"}
    env["PATH"] = str(default_venv / "bin")  # python, the launcher; no redis-server
    r = run([default_venv / "bin" / "redisai-rs-server", "--port", free_port()], check=False, env=env, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "redisai-rs-server: error: redis-server is not on PATH" in r.stderr, r.stderr
    assert "apt-get install redis-server" in r.stderr and "--redis-server /path/to/redis-server" in r.stderr
    r = run([default_venv / "bin" / "redisai-rs-server", "--redis-server", "/nonexistent/redis-server"],
            check=False, env=env)
    assert r.returncode == 1 and "is not an executable file" in r.stderr, r.stderr


def test_launcher_refuses_a_backend_that_is_not_the_pinned_version(default_venv):
    dist, pinned = ORT.split("==")
    (meta,) = (default_venv / "lib").glob(f"python*/site-packages/{dist}-{pinned}.dist-info/METADATA")
    original = meta.read_text()
    meta.write_text(original.replace(f"\nVersion: {pinned}\n", "\nVersion: 1.0.0\n", 1))
    try:
        want = (f"{dist} 1.0.0 is installed, but redisai-rs {VERSION} needs {ORT} for its ONNX backend. "
                f"Run: pip install '{ORT}'")
        env, launcher_args = server_path_env()
        for cmd in ([default_venv / "bin" / "redisai-rs-server", *launcher_args, "--port", free_port()],
                    [default_venv / "bin" / "redisai-rs", "--loadmodule-line"]):
            r = run(cmd, check=False, env=env, timeout=60)
            assert r.returncode == 1 and want in r.stderr, (cmd, r.returncode, r.stderr)
        r = run([default_venv / "bin" / "python", "-m", "redisai_rs", "--version"], check=False)
        assert r.returncode == 1 and "NOT USABLE" in r.stdout, r.stdout
    finally:
        meta.write_text(original)
    assert run([default_venv / "bin" / "redisai-rs", "--check"]).returncode == 0
