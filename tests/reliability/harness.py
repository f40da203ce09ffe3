"""What the reliability scripts (protocol_fuzz.py, soak.py, leakcheck.py) share: the flow-test harness of
tests/flow/helpers used outside pytest, and the end-of-run health checks (alive, crash-free log, memory).

Everything about starting servers, RESP and the test models lives in tests/flow (the helpers package:
server.py, resp.py, onnx_models.py, torch_models.py; and test_dag_stress.py); this file only adapts it to
standalone scripts, which put tests/flow on sys.path here."""

import re
import socket
import sys
import tempfile
import time
from pathlib import Path

FLOW_DIR = Path(__file__).resolve().parent.parent / "flow"
if str(FLOW_DIR) not in sys.path:
    sys.path.insert(0, str(FLOW_DIR))

import pytest  # noqa: E402  (helpers.server reports start failures through pytest.fail)
import redis  # noqa: E402

from helpers import server as flow_server  # noqa: E402  (its environment: SERVER_BIN, MODULE_PATH, ONNX_LIB, ...)
from helpers.resp import RawClient, RespError, RespReader, raw_command  # noqa: E402,F401
from helpers.server import RedisServer  # noqa: E402

# Lines of a server log that mean the process crashed or the module panicked (a panic is caught and turned
# into an error reply, but it is still a bug).
CRASH_MARKS = ("BUG REPORT START", "crashed by signal", "redisai: panic", "panicked at", "ASSERTION FAILED",
               "Guru Meditation")


class ProtocolViolation(Exception):
    """A reply that is not well-formed RESP2, or no reply at all (lost, or the connection closed)."""


_INT = re.compile(rb"-?(0|[1-9][0-9]*)\Z")


class StrictReader(RespReader):
    """helpers.resp's reader (errors as RespError, status as str), refusing anything a RESP2 server may not send."""

    def line(self):
        line = super().line()
        if b"\r" in line or b"\n" in line:
            raise ProtocolViolation(f"CR or LF inside a reply line: {line[:200]!r}")
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        if self.buf[n:n + 2] != b"\r\n":
            raise ProtocolViolation(f"bulk string of {n} bytes not followed by CRLF: {self.buf[n:n + 20]!r}")
        return super().exact(n)

    def reply(self):
        line = self.line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode(errors="replace")
        if t == b"-":
            if not rest.strip():
                raise ProtocolViolation("empty error reply")
            return RespError(rest.decode(errors="replace"))
        if t in (b":", b"$", b"*"):
            if not _INT.match(rest):
                raise ProtocolViolation(f"malformed length or integer: {line[:100]!r}")
            n = int(rest)
            if t == b":":
                return n
            if n < -1:
                raise ProtocolViolation(f"negative length: {line!r}")
            if t == b"$":
                return None if n < 0 else self.exact(n)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ProtocolViolation(f"not a RESP2 reply: {line[:100]!r}")


def kind_of(reply):
    if isinstance(reply, RespError):
        return "error"
    if isinstance(reply, str):
        return "ok" if reply == "OK" else "status"
    if isinstance(reply, int):
        return "integer"
    if isinstance(reply, bytes):
        return "bulk"
    if reply is None:
        return "nil"
    return "array"


def errors_in(reply):
    """Every error text in a reply as sent (nested ones too: DAG entries)."""
    if isinstance(reply, RespError):
        yield str(reply)
    elif isinstance(reply, list):
        for r in reply:
            yield from errors_in(r)


def as_redis_py(reply):
    """A reply as redis-py (RESP2) gives it: statuses as bytes, errors as ResponseError without `ERR `, so that
    the flow tests' checkers (test_dag_stress.Dag.check_reply, helpers.onnx_models.get_tensor) take it."""
    if isinstance(reply, RespError):
        return redis.exceptions.ResponseError(reply[4:] if reply.startswith("ERR ") else str(reply))
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, list):
        return [as_redis_py(r) for r in reply]
    return reply


class StrictClient(RawClient):
    """One raw connection, replies read by StrictReader. execute_command works like redis-py's (an error reply
    raises ResponseError) and raises ProtocolViolation for a malformed, lost (timeout) or cut-off reply.
    `last` is the reply as sent (errors as RespError, with their full text)."""

    def __init__(self, port, timeout):
        super().__init__(port, timeout=timeout)
        self.reader = StrictReader(self.sock)
        self.timeout = timeout
        self.last = None

    def execute_command(self, *args):
        try:
            self.send(*args)
            self.last = self.reply()
        except socket.timeout:
            raise ProtocolViolation(f"no reply within {self.timeout:.0f} s") from None
        except (ConnectionError, OSError) as e:
            raise ProtocolViolation(f"connection lost: {e}") from None
        reply = as_redis_py(self.last)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply


class HarnessError(Exception):
    """The server could not be started or reached: not a finding about the module."""


def start_server(name, server_args=(), module_args=(), server_class=RedisServer):
    """A server with the module in a fresh directory under $TMPDIR (kept afterwards for its log)."""
    workdir = tempfile.mkdtemp(prefix=f"redisai-{name}-")
    srv = server_class(workdir, server_args=server_args, module_args=module_args, name=name)
    try:
        srv.start()
    except pytest.fail.Exception as e:  # helpers.server's way of saying the server did not come up
        raise HarnessError(str(e)) from None
    return srv


class AttachedServer(RedisServer):
    """A server someone else started (``--port``): never stopped or restarted here; its log is read if it
    writes one to a file this machine can see."""

    def __init__(self, port):
        super().__init__(tempfile.mkdtemp(prefix="redisai-attached-"), name="attached")
        self.port = port
        reply = self.raw("PING", timeout=10)
        if reply != "PONG":
            raise HarnessError(f"the server on port {port} does not answer PING: {reply!r}")
        self.remote_pid = int(self.info("server")["process_id"])
        logfile = self.raw("CONFIG", "GET", "logfile")
        logdir = self.raw("CONFIG", "GET", "dir")
        if isinstance(logfile, list) and logfile[1]:
            path = Path(logfile[1].decode())
            if not path.is_absolute() and isinstance(logdir, list):
                path = Path(logdir[1].decode()) / path
            self.logfile = path
        else:
            self.logfile = None

    @property
    def pid(self):
        return self.remote_pid

    def is_alive(self):
        try:
            return raw_command(self.port, "PING", timeout=10) == "PONG"
        except (OSError, ConnectionError):
            return False

    def responsive(self, timeout=10.0):
        return self.is_alive()

    def log_size(self):
        return super().log_size() if self.logfile else 0

    def log(self, since=0):
        return super().log(since) if self.logfile else ""

    def stop(self, timeout=None):
        return None

    def kill(self):
        pass


def crash_lines(srv, since=0):
    """The log lines that show a crash or a module panic (empty when the log is clean)."""
    return [line for line in srv.log(since).splitlines() if any(m in line for m in CRASH_MARKS)]


def health_problems(srv, since=0):
    """Problems of a server at the end of a run: dead, not answering, or a crash/panic in its log."""
    problems = []
    if srv.proc is not None and srv.proc.poll() is not None:
        problems.append(f"{srv.describe()} exited with code {srv.proc.returncode}")
    elif not srv.responsive():
        problems.append(f"{srv.describe()} does not answer PING")
    bad = crash_lines(srv, since)
    if any("BUG REPORT" in line or "crashed by" in line for line in bad):
        problems.append("the server crashed; log excerpt:\n" + srv.failure_excerpt(lines=80, since=since))
    elif bad:
        distinct = sorted({line.split("# ", 1)[-1][:300] for line in bad})
        problems.append(f"{len(bad)} panic lines in the log {srv.logfile}; distinct ones:\n    "
                        + "\n    ".join(distinct[:10]))
    return problems


def rss_bytes(pid):
    """Resident set size of a local process."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise HarnessError(f"no VmRSS for pid {pid}")


def purged_rss(srv, settle=1.0):
    """RSS after MEMORY PURGE (jemalloc returns its dirty pages), so that before/after compare live memory."""
    srv.raw("MEMORY", "PURGE")
    time.sleep(settle)
    return rss_bytes(srv.pid)


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def env_summary():
    return (f"server {flow_server.SERVER_BIN}, module {flow_server.MODULE_PATH}, "
            f"ONNX {flow_server.ONNX_LIB or '(default)'}, TF {flow_server.TF_LIB or '(default)'}")


def fail_exit(problems, what):
    """Print the problems and exit 1 (or say that there were none)."""
    if problems:
        print(f"{what}: FAILED with {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print("  - " + p, file=sys.stderr)
        sys.exit(1)
    print(f"{what}: OK")

