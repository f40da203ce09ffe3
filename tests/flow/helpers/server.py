"""The redis-server (or valkey-server) of the flow tests: where the module, the server binary and the backend
libraries are (environment, see conftest.py), and RedisServer, one server process with the module loaded, on a
free port on 127.0.0.1, in a directory of its own."""

import atexit
import functools
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .checks import wait_for
from .resp import RespError, raw_command

FLOW_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = FLOW_DIR.parent.parent

MODULE_PATH = os.environ.get("REDISAI_MODULE") or str(REPO_ROOT / "target" / "release" / "libredisai.so")
SERVER_BIN = os.environ.get("REDIS_SERVER") or "redis-server"
ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")
TF_LIB = os.environ.get("REDISAI_TF_LIB")
TFLITE_LIB = os.environ.get("REDISAI_TFLITE_LIB")
# Where backends run in every server the tests start (EXECUTION_MODE): `isolated` or `in_process`; unset, the
# module's default. `make test` runs the suite both ways.
EXECUTION_MODE = os.environ.get("REDISAI_EXECUTION_MODE")
LOG_TAIL_LINES = int(os.environ.get("REDISAI_LOG_TAIL", "200"))

START_TIMEOUT = 30.0  # seconds for a server to answer PING (loading a big AOF/RDB can take a while)
STOP_TIMEOUT = 15.0  # seconds between SIGTERM and SIGKILL

_REDIS_PY_MAJOR = int(re.match(r"\d+", redis.__version__).group())

_ALL_SERVERS = []  # every server started in this process, so that atexit can kill leftovers


# --------------------------------------------------------------------------------------------------
# server binary


@functools.lru_cache(maxsize=None)
def server_flavor():
    """('redis'|'valkey', (major, minor, patch)) of SERVER_BIN."""
    try:
        out = subprocess.run([SERVER_BIN, "--version"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.fail(f"server binary {SERVER_BIN!r} not found (set REDIS_SERVER)", pytrace=False)
    text = out.stdout + out.stderr
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        pytest.fail(f"cannot parse the version of {SERVER_BIN!r}: {text!r}", pytrace=False)
    flavor = "valkey" if "valkey" in text.lower() else "redis"
    return flavor, tuple(int(x) for x in m.groups())


def _supports_enable_commands():
    flavor, version = server_flavor()
    # enable-debug-command / enable-module-command exist since Redis 7.0 and in every Valkey release.
    return flavor == "valkey" or version >= (7, 0, 0)


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split_options(args):
    """['--a', 'x', '--b', 'y', 'z'] -> [('a', ['x']), ('b', ['y', 'z'])] (names lower-cased)."""
    out = []
    for a in args:
        a = str(a)
        if a.startswith("--"):
            out.append((a[2:].lower(), []))
        else:
            if not out:
                raise ValueError(f"server argument {a!r} does not follow an --option")
            out[-1][1].append(a)
    return out


# --------------------------------------------------------------------------------------------------
# the server


class RedisServer:
    """One redis-server process with the module loaded, in its own directory."""

    def __init__(self, workdir, server_args=(), module_args=(), load_module=True, name="server"):
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.server_args = [str(a) for a in server_args]
        self.module_args = [str(a) for a in module_args]
        self.load_module = load_module
        self.port = None
        self.proc = None
        self.logfile = self.dir / "redis.log"
        self.stdout_file = self.dir / "stdout.log"
        self.dbfilename = "dump.rdb"
        self._clients = []
        self._stopping = False
        self.starts = 0

    # ---- command line

    def module_arguments(self):
        args = []
        if ONNX_LIB:
            args += ["ONNX", ONNX_LIB]
        if TF_LIB:
            args += ["TF", TF_LIB]
        if TFLITE_LIB:
            args += ["TFLITE", TFLITE_LIB]
        if EXECUTION_MODE:
            args += ["EXECUTION_MODE", EXECUTION_MODE]
        return args + self.module_args

    def argv(self):
        defaults = [
            ("port", [str(self.port)]),
            ("bind", ["127.0.0.1"]),
            ("daemonize", ["no"]),
            ("dir", [str(self.dir)]),
            ("dbfilename", [self.dbfilename]),
            ("logfile", [str(self.logfile)]),
            ("save", [""]),
            # Redis 7 syncs replicas diskless after a 5 s delay by default; tests want it now.
            ("repl-diskless-sync-delay", ["0"]),
        ]
        if _supports_enable_commands():
            defaults += [("enable-debug-command", ["yes"]), ("enable-module-command", ["yes"]),
                         # keep the crash report (stack trace) but skip its slow memory test
                         ("crash-memcheck-enabled", ["no"])]
        user = _split_options(self.server_args)
        given = {name for name, _ in user if name != "loadmodule"}
        argv = [SERVER_BIN]
        for name, values in defaults:
            if name not in given:
                argv += ["--" + name] + values
        if self.load_module:
            argv += ["--loadmodule", MODULE_PATH] + self.module_arguments()
        for name, values in user:
            argv += ["--" + name] + values
        return argv

    # ---- lifecycle

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def is_alive(self):
        return self.proc is not None and self.proc.poll() is None

    def died_unexpectedly(self):
        return self.proc is not None and not self._stopping and self.proc.poll() is not None

    def responsive(self, timeout=10.0):
        """True if the server answers PING. A server that does not (e.g. one busy writing its crash
        report) is given up to `timeout` seconds to exit, so that the caller sees its exit code."""
        if not self.is_alive():
            return False
        try:
            if raw_command(self.port, "PING", timeout=timeout) == "PONG":
                return True
        except (OSError, ConnectionError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return False

    def start(self):
        if self.is_alive():
            raise RuntimeError(f"{self.describe()} is already running")
        if self.load_module and not os.path.isfile(MODULE_PATH):
            pytest.fail(
                f"RedisAI module not found at {MODULE_PATH}: build it (cargo build --release) "
                f"or point REDISAI_MODULE at it",
                pytrace=False,
            )
        fixed_port = self.port is not None
        attempts = 20 if fixed_port else 5
        for attempt in range(attempts):
            if not fixed_port:
                self.port = free_port()
            mark = self.log_size()
            if self._spawn_and_wait():
                self.starts += 1
                return self
            log = self.log(since=mark)
            if "Address already in use" in log or "Could not create server TCP listening socket" in log:
                time.sleep(0.1 if fixed_port else 0)
                continue
            break
        pytest.fail(
            f"{self.describe()} did not start (exit code {self.proc.returncode if self.proc else None}); "
            f"command line: {' '.join(self.argv())}\n--- log ---\n{self.failure_excerpt()}",
            pytrace=False,
        )

    def _spawn_and_wait(self):
        self._stopping = False
        with open(self.stdout_file, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        if self not in _ALL_SERVERS:
            _ALL_SERVERS.append(self)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if raw_command(self.port, "PING", timeout=1.0) == "PONG":
                    # make sure it is our process answering, not another one that took the port
                    info = raw_command(self.port, "INFO", "server", timeout=2.0)
                    if isinstance(info, bytes) and f"process_id:{self.proc.pid}\r\n".encode() in info:
                        return True
            except (OSError, ConnectionError):
                pass
            time.sleep(0.002)
        self._kill_hard()
        return False

    def _close_clients(self):
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        self._clients = []

    def _kill_hard(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM by pid, wait, SIGKILL if it does not exit in time. Returns the exit code."""
        self._stopping = True
        self._close_clients()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def kill(self):
        """SIGKILL (no shutdown save)."""
        self._stopping = True
        self._close_clients()
        self._kill_hard()

    def restart(self):
        """Stop (SIGTERM) and start again with the same port, directory and arguments."""
        self.stop()
        self.start()
        return self

    # ---- clients and introspection

    def client(self, **kwargs):
        # No retries at all: a command must reach the server exactly once (a retried write would hide
        # a crash or a dropped connection). Retry(NoBackoff(), 0) turns them off in every redis-py;
        # retry_on_timeout=False is the default and deprecated as an argument since redis-py 6.
        opts = dict(host="127.0.0.1", port=self.port, socket_timeout=30, socket_connect_timeout=10,
                    retry=Retry(NoBackoff(), 0), protocol=2)
        if _REDIS_PY_MAJOR < 6:
            opts["retry_on_timeout"] = False
        opts.update(kwargs)
        try:
            c = redis.Redis(**opts)
        except TypeError:  # an old redis-py without `protocol`
            opts.pop("protocol", None)
            c = redis.Redis(**opts)
        self._clients.append(c)
        return c

    def raw(self, *args, timeout=30.0):
        return raw_command(self.port, *args, timeout=timeout)

    def info(self, section=None):
        """INFO parsed into a dict of str -> str (generic; works for any server flavor)."""
        text = self.raw("INFO", section) if section else self.raw("INFO")
        if isinstance(text, RespError):
            raise redis.exceptions.ResponseError(str(text))
        out = {}
        for line in text.decode(errors="replace").splitlines():
            if not line or line.startswith("#") or ":" not in line:
                continue
            k, v = line.split(":", 1)
            out[k] = v
        return out

    def log_size(self):
        try:
            return self.logfile.stat().st_size
        except FileNotFoundError:
            return 0

    def log(self, since=0):
        """stdout/stderr of the process, then the log file (from byte offset `since`)."""
        parts = []
        try:
            t = self.stdout_file.read_text(errors="replace")
            if t.strip():
                parts.append(t)
        except FileNotFoundError:
            pass
        try:
            with open(self.logfile, "rb") as f:
                f.seek(since)
                t = f.read().decode(errors="replace")
            if t.strip():
                parts.append(t)
        except FileNotFoundError:
            pass
        return "\n".join(parts)

    def log_tail(self, lines=LOG_TAIL_LINES, since=0):
        return "\n".join(self.log(since).splitlines()[-lines:])

    def failure_excerpt(self, lines=LOG_TAIL_LINES, since=0):
        """The log tail; for a crash, the lines before the bug report and the report's head (the
        stack trace), which a plain tail would miss."""
        text = self.log(since).splitlines()
        for i, line in enumerate(text):
            if "BUG REPORT START" in line:
                return "\n".join(text[max(0, i - 40):i + lines])
        return "\n".join(text[-lines:])

    def describe(self):
        return f"{self.name} (port {self.port}, pid {self.pid}, dir {self.dir})"

    # ---- replication

    def replicaof(self, master, timeout=30.0):
        """Make this server a replica of `master` and wait until the link is up and the sync is done."""
        reply = self.raw("REPLICAOF", "127.0.0.1", str(master.port))
        assert not isinstance(reply, RespError), f"REPLICAOF failed: {reply}"
        self.wait_link_up(timeout)
        return self

    def link_up(self):
        info = self.info("replication")
        status = info.get("master_link_status", info.get("primary_link_status"))
        sync = info.get("master_sync_in_progress", info.get("primary_sync_in_progress", "0"))
        return status == "up" and sync == "0"

    def wait_link_up(self, timeout=30.0):
        wait_for(self.link_up, timeout, what=f"{self.describe()} to finish syncing with its master")


# --------------------------------------------------------------------------------------------------
# for the fixtures of conftest.py


def register_for_report(node, srv, log_from_now=False):
    """Attach `srv` to a test item so that its log is shown when the test fails; for a shared server
    only what it logged from now on."""
    lst = getattr(node, "_redis_servers", None)
    if lst is None:
        lst = []
        node._redis_servers = lst
    if all(s is not srv for s, _ in lst):
        lst.append((srv, srv.log_size() if log_from_now else 0))


def safe_name(name, limit=40):
    """`name` usable as a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:limit] or "test"


@atexit.register
def _kill_leftovers():
    for s in _ALL_SERVERS:
        try:
            s.kill()
        except Exception:
            pass


def check_still_alive(servers):
    """Fail the test (in teardown) if one of its servers crashed or stopped answering."""
    msgs = []
    for s in servers:
        if s.proc is None or s._stopping:
            continue
        if s.responsive():
            continue
        if s.is_alive():
            msgs.append(f"{s.describe()} does not answer PING")
        else:
            msgs.append(f"{s.describe()} exited unexpectedly with code {s.proc.returncode}")
    if msgs:
        pytest.fail("; ".join(msgs), pytrace=False)
