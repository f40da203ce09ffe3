"""pytest harness for the redisai-rs flow tests.

Every test talks to a real ``redis-server`` (or ``valkey-server``) that this file starts itself, with the
module loaded, on a free port on 127.0.0.1, in its own temporary directory (kept after the run, so the
log files can be read afterwards; pytest keeps the last few base temp dirs).

Environment:
  REDISAI_MODULE     path of the module (default: <repo>/target/release/libredisai.so)
  REDIS_SERVER       server binary (default: redis-server; valkey-server works too)
  REDISAI_ONNX_LIB   if set, the module is loaded with ``ONNX <that path>`` (likewise REDISAI_TF_LIB, REDISAI_TFLITE_LIB)
  REDISAI_LOG_TAIL   number of log lines shown for a failed test (default 200)

Fixtures:
  server        a fresh server for this test; ``@pytest.mark.server_args("--appendonly", "yes")`` and
                ``@pytest.mark.module_args("THREADS_PER_QUEUE", "2")`` change how it is started
  make_server   factory: ``make_server(server_args=[...], module_args=[...], load_module=True)``
  make_replica  factory: ``make_replica(master, server_args=[...])`` starts a server, REPLICAOF master,
                waits until the link is up
  module_server one server shared by the tests of a file (started once, default args)
  con           a client of ``module_server`` after FLUSHALL (the cheap default for tests that do not
                need their own server)

Helpers (import them with ``from conftest import ...``):
  check_error(con, msg, *cmd)         the command must fail with ResponseError whose str() == msg
                                      (redis-py strips a leading ``ERR ``)
  raw_command(port, *cmd)             send one command, return the RESP2 reply exactly as sent; an error
                                      reply comes back as a ``RespError`` (a str with the full text,
                                      ``ERR `` prefix included)
  check_error_raw(port, msg, *cmd)    like check_error but compares the full wire text
"""

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

FLOW_DIR = Path(__file__).resolve().parent
REPO_ROOT = FLOW_DIR.parent.parent

MODULE_PATH = os.environ.get("REDISAI_MODULE") or str(REPO_ROOT / "target" / "release" / "libredisai.so")
SERVER_BIN = os.environ.get("REDIS_SERVER") or "redis-server"
ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")
TF_LIB = os.environ.get("REDISAI_TF_LIB")
TFLITE_LIB = os.environ.get("REDISAI_TFLITE_LIB")
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


def _free_port():
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
# RESP helpers


class RespError(str):
    """An error reply, with the full text as sent (e.g. ``ERR invalid value``)."""


def _encode_command(args):
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        elif isinstance(a, (int, float)):
            b = repr(a).encode()
        else:
            raise TypeError(f"cannot send {type(a)}")
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class _RespReader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self):
        line = self.line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RespError(rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ValueError(f"unexpected RESP line {line!r}")


def raw_command(port, *args, timeout=30.0):
    """Send one command on a fresh connection and return the RESP2 reply as sent (errors as RespError)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode_command(args))
        return _RespReader(s).reply()


def _fmt_cmd(cmd):
    shown = []
    for a in cmd:
        r = repr(a)
        shown.append(r if len(r) <= 60 else r[:57] + "...")
    return " ".join(shown)


def module_names(module_list):
    """The names in a MODULE LIST reply (Valkey 9 lists its built-in `lua` module too)."""
    names = []
    for entry in module_list:
        fields = dict(zip(entry[::2], entry[1::2]))
        name = fields.get(b"name", fields.get("name"))
        names.append(name.decode() if isinstance(name, bytes) else name)
    return names


def check_error(con, msg, *cmd):
    """The command must raise redis.exceptions.ResponseError with str(e) == msg.

    redis-py strips a leading ``ERR `` (and maps a few other error codes to subclasses, e.g.
    ``READONLY`` -> ReadOnlyError with the code stripped); a message without ``ERR`` (``WRONGTYPE ...``,
    ``Number of ...``) is compared verbatim."""
    try:
        reply = con.execute_command(*cmd)
    except redis.exceptions.ResponseError as e:
        got = str(e)
        assert got == msg, f"{_fmt_cmd(cmd)}: expected error {msg!r}, got {got!r}"
        return e
    pytest.fail(f"{_fmt_cmd(cmd)}: expected error {msg!r}, but it succeeded with {reply!r}", pytrace=False)


def check_error_raw(port, msg, *cmd):
    """The command must fail with exactly ``msg`` on the wire (``ERR`` prefix included where sent)."""
    if hasattr(port, "port"):
        port = port.port
    reply = raw_command(port, *cmd)
    assert isinstance(reply, RespError), f"{_fmt_cmd(cmd)}: expected error {msg!r}, got reply {reply!r}"
    assert str(reply) == msg, f"{_fmt_cmd(cmd)}: expected error {msg!r}, got {str(reply)!r}"
    return reply


def wait_for(predicate, timeout=10.0, interval=0.01, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}", pytrace=False)
        time.sleep(interval)


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
                self.port = _free_port()
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


def _register(node, srv, log_from_now=False):
    """Attach `srv` to a test item so that its log is shown when the test fails; for a shared server
    only what it logged from now on."""
    lst = getattr(node, "_redis_servers", None)
    if lst is None:
        lst = []
        node._redis_servers = lst
    if all(s is not srv for s, _ in lst):
        lst.append((srv, srv.log_size() if log_from_now else 0))


def _safe_name(name, limit=40):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:limit] or "test"


@atexit.register
def _kill_leftovers():
    for s in _ALL_SERVERS:
        try:
            s.kill()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------
# pytest hooks


def pytest_configure(config):
    config.addinivalue_line("markers", "server_args(*args): extra redis-server arguments for the `server` fixture")
    config.addinivalue_line("markers", "module_args(*args): extra module load arguments for the `server` fixture")


def pytest_report_header(config):
    try:
        flavor, version = server_flavor()
        ver = f"{flavor} {'.'.join(map(str, version))}"
    except BaseException:
        ver = "unknown version"
    exists = "" if os.path.isfile(MODULE_PATH) else " (MISSING)"
    return [f"redisai flow tests: server {SERVER_BIN} ({ver}), module {MODULE_PATH}{exists}"
            + (f", ONNX {ONNX_LIB}" if ONNX_LIB else "")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    for srv, since in getattr(item, "_redis_servers", []):
        if since and srv.log_size() < since:  # restarted with a fresh log? show all of it
            since = 0
        tail = srv.failure_excerpt(since=since)
        state = "running" if srv.is_alive() else f"exited with {srv.proc.returncode if srv.proc else None}"
        rep.sections.append((f"redis-server log: {srv.describe()} [{state}], full log {srv.logfile}",
                             tail or "(empty log)"))


# --------------------------------------------------------------------------------------------------
# fixtures


def _check_still_alive(servers):
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


@pytest.fixture
def make_server(request, tmp_path_factory):
    """Factory for servers owned by this test: make_server(server_args=[...], module_args=[...])."""
    servers = []

    def factory(server_args=(), module_args=(), load_module=True, name=None, start=True):
        name = name or f"server{len(servers)}"
        d = tmp_path_factory.mktemp(f"{_safe_name(request.node.name)}-{name}")
        srv = RedisServer(d, server_args=server_args, module_args=module_args,
                          load_module=load_module, name=name)
        servers.append(srv)
        _register(request.node, srv)
        if start:
            srv.start()
        return srv

    yield factory
    try:
        _check_still_alive(servers)
    finally:
        for s in reversed(servers):  # replicas (started later) before their masters
            s.stop()


@pytest.fixture
def make_replica(make_server):
    """make_replica(master, server_args=[...], module_args=[...]) -> a synced replica of `master`."""

    def factory(master, server_args=(), module_args=(), name=None, timeout=30.0):
        rep = make_server(server_args=server_args, module_args=module_args, name=name or "replica")
        rep.replicaof(master, timeout=timeout)
        return rep

    return factory


@pytest.fixture
def server(request, make_server):
    """A fresh server for this test (see the server_args / module_args markers)."""
    server_args, module_args = [], []
    for m in request.node.iter_markers("server_args"):
        server_args = list(m.args) + server_args
    for m in request.node.iter_markers("module_args"):
        module_args = list(m.args) + module_args
    return make_server(server_args=server_args, module_args=module_args, name="server")


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, request):
    """One server for all tests of a module that use it; tests get it through `con`/`shared_server`."""
    d = tmp_path_factory.mktemp(f"{_safe_name(request.module.__name__)}-shared")
    srv = RedisServer(d, name="shared")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def shared_server(request, module_server):
    """The module-scoped server after FLUSHALL (restarted first if an earlier test killed it)."""
    if not module_server.responsive():
        module_server.kill()
        module_server.start()
    _register(request.node, module_server, log_from_now=True)
    reply = module_server.raw("FLUSHALL")
    assert reply == "OK", f"FLUSHALL failed: {reply!r}"
    yield module_server
    _check_still_alive([module_server])


@pytest.fixture
def con(shared_server):
    """A redis-py client of the shared server (empty keyspace)."""
    return shared_server.client()
