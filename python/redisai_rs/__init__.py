"""redisai-rs as a Python package: the Redis module (``libredisai.so``, a drop-in replacement of RedisAI 1.2.7), its
TORCH backend library, and a launcher that loads the module with the backends of the wheels installed beside it.

    pip install redisai-rs              # the module + ONNX Runtime
    pip install 'redisai-rs[all]'       # + TensorFlow, TFLite (LiteRT) and libtorch
    redisai-rs-server --port 6379       # redis-server (from PATH) with the module and every installed backend
    redisai-rs --loadmodule-line        # the `loadmodule ...` line for a redis.conf
    python -m redisai_rs --version      # the module's version and each backend's

Backends come from their own PyPI wheels, pinned exactly (``BACKENDS``); the launcher refuses a backend whose
installed version is not the pinned one. A backend whose wheel is not installed is given to the module as a path
that says how to install it, so the first model that needs it fails with that hint.

Python API: ``module_path()``, ``backends()``, ``module_args(gpu=False)``, ``loadmodule_line(gpu=False)``,
``server_command(redis_server_args, module_args, ...)``; errors are ``RedisAIError`` with the fix in the text.
"""

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import List, Optional, Sequence

try:
    from . import _build  # written by `make wheel` (scripts/build-wheel.py): versions and pins
except ImportError:  # pragma: no cover - running from the source tree
    _build = None

__all__ = ["RedisAIError", "Backend", "module_path", "backends", "module_args", "loadmodule_line",
           "server_command", "find_redis_server", "__version__"]

PACKAGE_DIR = Path(__file__).resolve().parent
LIB_DIR = PACKAGE_DIR / "lib"
__version__ = _build.VERSION if _build else "0+source"


class RedisAIError(Exception):
    """A problem with the installation; the message says what to do."""


def _require_build():
    if _build is None:
        raise RedisAIError("this is the source tree of redisai_rs, not an installed wheel: build one with "
                           "`make wheel` and `pip install target/wheel/redisai_rs-*.whl`")
    return _build


def module_path() -> Path:
    """The module, ``libredisai.so``, inside this package."""
    path = LIB_DIR / "libredisai.so"
    if not path.is_file():
        raise RedisAIError(f"the module {path} is missing: reinstall redisai-rs (pip install --force-reinstall "
                           f"redisai-rs=={__version__})")
    return path


@dataclass
class Backend:
    """One backend of the module and the wheel it comes from."""

    name: str  # the module's name: ONNX, TF, TFLITE, TORCH
    requirement: str  # the pinned distribution, e.g. tensorflow-cpu
    version: str  # the pinned version
    extra: Optional[str]  # pip extra that installs it (None: a default dependency)
    member: str  # the library inside the backend's wheel (below site-packages)
    distribution: Optional[str] = None  # the installed distribution (may be an accepted alternative), or None
    installed: Optional[str] = None  # its installed version
    library: Optional[Path] = None  # the backend library in the installed wheel

    @property
    def install_target(self) -> str:
        target = f"redisai-rs[{self.extra}]" if self.extra else "redisai-rs"
        return f"{target}=={__version__}"

    @property
    def install_hint(self) -> str:
        return f"pip install '{self.install_target}'"

    @property
    def matches_pin(self) -> bool:
        # A local version label (torch 2.13.0+cpu) is the same release: PEP 440 `==2.13.0` accepts it.
        return self.installed is not None and self.installed.split("+", 1)[0] == self.version

    def problem(self) -> Optional[str]:
        """Why this backend's installed wheel cannot be used (None: usable or absent)."""
        if self.installed is None:
            return None
        if not self.matches_pin:
            return (f"{self.distribution} {self.installed} is installed, but redisai-rs {__version__} needs "
                    f"{self.requirement}=={self.version} for its {self.name} backend. Run: "
                    f"pip install '{self.requirement}=={self.version}' "
                    f"(or `pip uninstall {self.distribution}` to run without {self.name})")
        if self.library is None or not self.library.is_file():
            return (f"{self.distribution} {self.installed} is installed but its library {self.member} is missing "
                    f"({self.library}). Run: pip install --force-reinstall '{self.requirement}=={self.version}'")
        return None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(names: Sequence[str]):
    for name in names:
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def backends() -> List[Backend]:
    """Every backend the module knows, with what is installed of it (nothing is imported or loaded)."""
    build = _require_build()
    out = []
    for b in build.BACKENDS:
        be = Backend(b["name"], b["requirement"], b["version"], b["extra"], b["member"])
        dist = _installed([b["requirement"]] + list(b["alternatives"]))
        if dist is not None:
            be.distribution = _canonical(dist.metadata["Name"])
            be.installed = dist.version
            be.library = Path(str(dist.locate_file(b["member"])))
        out.append(be)
    return out


def _missing_path(backend: Backend) -> str:
    # The module opens the backend at first use; given a path that does not exist and names the fix, it replies
    # `Could not load backend TF: it is not installed (pip install 'redisai-rs[tf]==<version>', then restart the
    # server)` (src/backends/mod.rs, not_installed).
    hint = f"pip-install-{backend.install_target}"
    return str(PACKAGE_DIR / "backend-not-installed" / hint / Path(backend.member).name)


def _torch_lib_dir(backend: Backend) -> Optional[Path]:
    return backend.library.parent if backend.library is not None else None


def _resolve(gpu: bool):
    """(module args, environment additions, notes) for the installed backends; raises RedisAIError."""
    args, env, notes, problems = [], {}, [], []
    for b in backends():
        p = b.problem()
        if p:
            problems.append(p)
            continue
        if b.installed is None:
            args += [b.name, _missing_path(b)]
            notes.append(f"{b.name}: {b.requirement} is not installed; models of this backend will fail to load "
                         f"until you run {b.install_hint} and restart")
            continue
        if b.name == "TORCH":
            lib = LIB_DIR / ("libredisai_torch_cuda.so" if gpu else "libredisai_torch.so")
            if not lib.is_file():
                raise RedisAIError(f"{lib} is missing: reinstall redisai-rs (pip install --force-reinstall "
                                   f"redisai-rs=={__version__})")
            args += [b.name, str(lib)]
            # The TORCH backend finds libtorch through its RUNPATH $ORIGIN/../../torch/lib, which holds when torch
            # is installed into the same site-packages; otherwise the server needs its directory.
            torch_lib = _torch_lib_dir(b)
            expected = (PACKAGE_DIR.parent / "torch" / "lib").resolve()
            if torch_lib is not None and torch_lib.resolve() != expected:
                env["LD_LIBRARY_PATH"] = str(torch_lib)
                notes.append(f"TORCH: torch is installed in {torch_lib.parent.parent}, not beside redisai-rs: "
                             f"redis-server needs LD_LIBRARY_PATH={torch_lib}")
        else:
            args += [b.name, str(b.library)]
    if gpu and not any(b.name == "TORCH" and b.installed for b in backends()):
        problems.append(f"--gpu loads TORCH on CUDA, but torch is not installed: run pip install "
                        f"'redisai-rs[gpu]=={__version__}'")
    if problems:
        raise RedisAIError("\n".join(problems))
    return args, env, notes


def module_args(gpu: bool = False) -> List[str]:
    """The module's load-time arguments: ``ONNX <lib> TF <lib> TFLITE <lib> TORCH <lib>``."""
    return _resolve(gpu)[0]


def loadmodule_line(gpu: bool = False, extra_args: Sequence[str] = ()) -> str:
    """``loadmodule <module> <backend args> [extra args]`` for a redis.conf."""
    words = [str(module_path())] + module_args(gpu) + list(extra_args)
    return "loadmodule " + " ".join(_conf_quote(w) for w in words)


def _conf_quote(word: str) -> str:
    # redis.conf splits lines like a shell (sdssplitargs): quote what would not survive as one word.
    if word and all(c.isalnum() or c in "/._-+=:,@[]%" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def find_redis_server(given: Optional[str] = None) -> str:
    """The redis-server to run: ``given``, else $REDIS_SERVER, else redis-server on PATH."""
    cand = given or os.environ.get("REDIS_SERVER")
    if cand:
        path = shutil.which(cand) if os.sep not in cand else (cand if os.access(cand, os.X_OK) else None)
        if not path:
            raise RedisAIError(f"redis-server {cand!r} (given with --redis-server or $REDIS_SERVER) is not an "
                               "executable file: give the path of a redis-server (or valkey-server) binary")
        return path
    path = shutil.which("redis-server")
    if not path:
        raise RedisAIError(
            "redis-server is not on PATH. Install Redis 7.0 or newer (Debian/Ubuntu: sudo apt-get install "
            "redis-server; Fedora/RHEL: sudo dnf install redis), or give its path: redisai-rs-server "
            "--redis-server /path/to/redis-server ... (valkey-server works too; so does $REDIS_SERVER)")
    return path


def server_command(redis_server_args: Sequence[str] = (), extra_module_args: Sequence[str] = (),
                   redis_server: Optional[str] = None, gpu: bool = False):
    """(argv, environment) that start redis-server with the module and every installed backend."""
    server = find_redis_server(redis_server)
    args, env_add, notes = _resolve(gpu)
    argv = [server] + list(redis_server_args) + ["--loadmodule", str(module_path())] + args + list(extra_module_args)
    # A backend given after `--` replaces the wheel's (the module takes the last path given): no note about it.
    given = {str(a).upper() for a in list(extra_module_args)[0::2]}
    notes = [n for n in notes if n.split(":", 1)[0] not in given]
    env = dict(os.environ)
    for k, v in env_add.items():
        env[k] = v + (os.pathsep + env[k] if env.get(k) else "")
    return argv, env, notes


def describe_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
