"""The DUMP payloads and replies recorded from the original RedisAI (tests/data/redisai-dumps.json, described in
tests/data/redisai-dumps.md; a copy of the project's compatibility fixtures, so that a clone tests on its own)."""
import json
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
