"""The DUMP payloads and replies recorded from the original RedisAI (tests/data/redisai-dumps.json, described in
tests/data/redisai-dumps.md; a copy of the project's compatibility fixtures, so that a clone tests on its own)."""
import json
import math
import os

import pytest

from .data import DATA_DIR

DUMPS_PATH = os.environ.get("REDISAI_COMPAT_DUMPS") or str(DATA_DIR / "redisai-dumps.json")


def _recorded_cases():
    try:
        with open(DUMPS_PATH) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {c["key"]: c for c in data["cases"]}


RECORDED = _recorded_cases()


def need_case(key):
    """The recorded case `key`; a missing file or case fails the test (never skips)."""
    if key not in RECORDED:
        pytest.fail(f"recorded case {key!r} not found in {DUMPS_PATH} (set REDISAI_COMPAT_DUMPS)", pytrace=False)
    return RECORDED[key]


def recorded_reply(expected):
    """The recording's reply form -> what redis-py returns (bulk strings as bytes)."""
    if isinstance(expected, dict):
        return bytes.fromhex(expected["hex"])
    if isinstance(expected, list):
        return [recorded_reply(e) for e in expected]
    return expected


def recorded_create(case):
    """The recorded `create` command with its binary arguments decoded."""
    return [bytes.fromhex(a) if h else a for a, h in zip(case["create"], case["create_bytes_hex"])]


def payload_body(dump):
    """A DUMP payload without its trailer (2-byte RDB version + 8-byte CRC64), which depend on the server."""
    return dump[:-10]


def assert_reply(expected, got, where="reply"):
    """Recorded reply (bulk strings as {"hex": ...}, integers as numbers, arrays as lists, and floats of
    VALUES replies as JSON floats where the server sends a bulk string) against what the server sent."""
    if isinstance(expected, dict):
        assert set(expected) == {"hex"}, f"{where}: unknown recorded form {expected!r}"
        want = bytes.fromhex(expected["hex"])
        assert got == want, f"{where}: expected bulk {want!r}, got {got!r}"
    elif isinstance(expected, bool):
        raise AssertionError(f"{where}: unexpected boolean in the recording")
    elif isinstance(expected, int):
        assert isinstance(got, int) and got == expected, f"{where}: expected integer {expected}, got {got!r}"
    elif isinstance(expected, float):
        assert isinstance(got, bytes), f"{where}: expected a double as bulk string, got {got!r}"
        value = float(got)
        assert value == expected or math.isclose(value, expected, rel_tol=1e-12, abs_tol=0.0), (
            f"{where}: expected {expected!r}, got {got!r}")
    elif isinstance(expected, list):
        assert isinstance(got, list), f"{where}: expected an array, got {got!r}"
        assert len(got) == len(expected), f"{where}: expected {len(expected)} elements, got {len(got)}: {got!r}"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_reply(e, g, f"{where}[{i}]")
    elif expected is None:
        assert got is None, f"{where}: expected nil, got {got!r}"
    else:
        raise AssertionError(f"{where}: unknown recorded value {expected!r}")
