"""Assertions and waits shared by the flow tests: expected error replies (through redis-py or on the wire),
polling until a condition holds, reading MODULE LIST replies, and error texts several tests expect."""

import time

import pytest
import redis

from .resp import RespError, raw_command

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOT_IN_TXN = "Cannot run RedisAI command within a transaction or a LUA script"


def fmt_cmd(cmd):
    """A command for a failure message, long arguments cut."""
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
        assert got == msg, f"{fmt_cmd(cmd)}: expected error {msg!r}, got {got!r}"
        return e
    pytest.fail(f"{fmt_cmd(cmd)}: expected error {msg!r}, but it succeeded with {reply!r}", pytrace=False)


def check_error_raw(port, msg, *cmd):
    """The command must fail with exactly ``msg`` on the wire (``ERR`` prefix included where sent).
    `port` may be a server (anything with a `.port`)."""
    if hasattr(port, "port"):
        port = port.port
    reply = raw_command(port, *cmd)
    assert isinstance(reply, RespError), f"{fmt_cmd(cmd)}: expected error {msg!r}, got reply {reply!r}"
    assert str(reply) == msg, f"{fmt_cmd(cmd)}: expected error {msg!r}, got {str(reply)!r}"
    return reply


def wait_for(predicate, timeout=10.0, interval=0.01, what="condition"):
    """Poll `predicate` until it returns a true value (returned); after `timeout` seconds fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}", pytrace=False)
        time.sleep(interval)


def wait_replicas(con, n=1):
    """WAIT until `n` replicas acknowledged the writes so far (10 s at most); asserts they did."""
    assert con.execute_command("WAIT", n, 10000) == n


def error_text(fn, *args):
    """str() of the ResponseError that fn(*args) raises (fails if it succeeds)."""
    try:
        r = fn(*args)
    except redis.exceptions.ResponseError as e:
        return str(e)
    pytest.fail(f"expected an error, got {r!r}", pytrace=False)
