"""RESTORE of tensor DUMP payloads recorded from the original RedisAI (tests/data/redisai-dumps.json).

For every tensor case of redisai-dumps.json: RESTORE the recorded payload and compare the recorded replies;
DUMP it again from our module and RESTORE that (round trip, also across DEBUG RELOAD); our DUMP must carry
the same module payload as RedisAI's (same type name, encver 4 and field layout). Also the older tensor
layouts (encver 0-3), which a compatible module must still load, and corrupt payloads, which must be
refused without bringing the server down. Model and script cases are not part of this file.
"""

import json
import math
import struct

import pytest
import redis

from helpers.recorded import DUMPS_PATH, payload_body

BAD_DATA = "Bad data format"


def _load_cases():
    try:
        with open(DUMPS_PATH) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return [], f"cannot read the recorded dumps {DUMPS_PATH}: {e} (set REDISAI_COMPAT_DUMPS)"
    return [c for c in data["cases"] if c.get("kind") == "tensor"], None


TENSOR_CASES, LOAD_ERROR = _load_cases()
# one test per case; when the file cannot be read, a single parameter that fails with the reason
CASE_PARAMS = [pytest.param(c, id=c["key"]) for c in TENSOR_CASES] or [pytest.param(None, id="dumps-file-missing")]


def need(case):
    if case is None:
        pytest.fail(LOAD_ERROR or f"no tensor cases in {DUMPS_PATH}", pytrace=False)
    return case


# ---------------------------------------------------------------------------------------------
# comparing replies with the recording


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


def check_replies(con, case, key=None):
    for r in case["replies"]:
        cmd = list(r["cmd"])
        if key is not None:
            assert cmd[1] == case["key"]
            cmd[1] = key
        assert_reply(r["reply"], con.execute_command(*cmd), where=" ".join(map(str, cmd)))


def create_args(case):
    return [bytes.fromhex(a) if is_hex else a for a, is_hex in zip(case["create"], case["create_bytes_hex"])]


# ---------------------------------------------------------------------------------------------
# the recorded cases


def test_dumps_file_covers_all_dtypes():
    assert LOAD_ERROR is None, LOAD_ERROR
    dtypes = {c["create"][2].upper() for c in TENSOR_CASES}
    assert dtypes == {"FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "BOOL", "STRING"}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_restore_recorded(con, case):
    case = need(case)
    assert con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    assert con.type(case["key"]) == b"AI_TENSOR"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_restore_replace(con, case):
    case = need(case)
    con.execute_command("AI.TENSORSET", case["key"], "INT8", 1)
    with pytest.raises(redis.exceptions.ResponseError):
        con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))  # BUSYKEY without REPLACE
    assert con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]), replace=True) == b"OK"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_create_gives_recorded_replies(con, case):
    """The recorded `create` command on our module gives the recorded replies too."""
    case = need(case)
    assert con.execute_command(*create_args(case)) == b"OK"
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_roundtrip(con, case):
    case = need(case)
    con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    ours = con.dump(case["key"])
    assert ours is not None
    assert con.restore("copy:" + case["key"], 0, ours) == b"OK"
    check_replies(con, case, key="copy:" + case["key"])
    check_replies(con, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_payload_matches_redisai(con, case):
    """Our rdb_save writes RedisAI's encver-4 layout: the DUMP payload equals the recorded one, apart from
    the trailer (RDB version and checksum, which belong to the server version)."""
    case = need(case)
    recorded = bytes.fromhex(case["dump_hex"])
    con.restore("restored", 0, recorded)
    assert payload_body(con.dump("restored")) == payload_body(recorded)
    con.execute_command(*create_args(case))
    assert payload_body(con.dump(case["key"])) == payload_body(recorded)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_dump_restores_after_debug_reload(con, case):
    case = need(case)
    con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    ours = con.dump(case["key"])
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    check_replies(con, case)  # the key itself went through our rdb_save / rdb_load
    assert con.restore("after-reload", 0, ours) == b"OK"
    check_replies(con, case, key="after-reload")
    assert con.restore("recorded-after-reload", 0, bytes.fromhex(case["dump_hex"])) == b"OK"
    check_replies(con, case, key="recorded-after-reload")


def test_restore_all_then_reload(con):
    assert LOAD_ERROR is None, LOAD_ERROR
    for case in TENSOR_CASES:
        con.restore(case["key"], 0, bytes.fromhex(case["dump_hex"]))
    assert con.execute_command("DEBUG", "RELOAD") == b"OK"
    assert con.dbsize() == len(TENSOR_CASES)
    for case in TENSOR_CASES:
        check_replies(con, case)


# ---------------------------------------------------------------------------------------------
# payloads built here: the same encoding (spec §3.6), checked against the recorded dumps first

_CRC_POLY = 0x95AC9329AC4BC9B5  # crc-64-jones, reflected, as used by Redis for DUMP payloads
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _CRC_POLY if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc64(data):
    crc = 0
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def rdb_len(n):
    if n < 1 << 6:
        return bytes([n])
    if n < 1 << 14:
        return bytes([0x40 | (n >> 8), n & 0xFF])
    if n <= 0xFFFFFFFF:
        return b"\x80" + struct.pack(">I", n)
    return b"\x81" + struct.pack(">Q", n)


def u(v):
    """RedisModule_SaveUnsigned (and SaveSigned, stored the same way)."""
    return b"\x02" + rdb_len(v & 0xFFFFFFFFFFFFFFFF)


def buf(data):
    """RedisModule_SaveStringBuffer (stored uncompressed)."""
    return b"\x05" + rdb_len(len(data)) + data


# AI_TENSOR with encver 4, as found in the recorded dumps; the low 10 bits of a module type id are the encver
TENSOR_TYPE_ID_V4 = 0x008FD310D48E4404


def dump_payload(fields, encver=4, rdbver=10):
    mid = (TENSOR_TYPE_ID_V4 & ~0x3FF) | encver
    body = b"\x07" + b"\x81" + struct.pack(">Q", mid) + b"".join(fields) + b"\x00" + struct.pack("<H", rdbver)
    return body + struct.pack("<Q", crc64(body))


DLPACK = {  # name -> (code, bits, numpy format)
    "FLOAT": (2, 32, "<f"), "DOUBLE": (2, 64, "<d"), "INT8": (0, 8, "<b"), "INT16": (0, 16, "<h"),
    "INT32": (0, 32, "<i"), "INT64": (0, 64, "<q"), "UINT8": (1, 8, "<B"), "UINT16": (1, 16, "<H"),
    "BOOL": (6, 8, "<B"), "STRING": (7, 8, None),
}


def v4_fields(dtype, shape, data, offsets=None):
    code, bits, _ = DLPACK[dtype]
    f = [u(code), u(bits), u(len(shape))] + [u(d) for d in shape] + [buf(data)]
    if offsets is not None:
        f += [u(o) for o in offsets]
    return f


def legacy_fields(dtype, shape, data):
    """encver 0-3: device_type device_id bits code lanes ndims shape... strides... byte_offset data."""
    code, bits, _ = DLPACK[dtype]
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    return ([u(1), u(0), u(bits), u(code), u(1), u(len(shape))] + [u(d) for d in shape] + [u(s) for s in strides]
            + [u(0), buf(data)])


def test_payload_encoder_matches_recorded():
    """Self-check of the encoder used below against RedisAI's own dumps (uncompressed ones)."""
    assert LOAD_ERROR is None, LOAD_ERROR
    checked = 0
    for case in TENSOR_CASES:
        recorded = bytes.fromhex(case["dump_hex"])
        assert struct.unpack("<Q", recorded[-8:])[0] == crc64(recorded[:-8])
        args = create_args(case)
        dtype = args[2].upper()
        if "BLOB" not in args or dtype == "STRING" or len(args[-1]) > 20:
            continue  # Redis LZF-compresses longer buffers; the encoder here does not
        shape = [int(a) for a in args[3:args.index("BLOB")]]
        mine = dump_payload(v4_fields(dtype, shape, args[-1]), rdbver=struct.unpack("<H", recorded[-10:-8])[0])
        assert mine == recorded, case["key"]
        checked += 1
    assert checked >= 10


def _values(dtype, data):
    fmt = DLPACK[dtype][2]
    n = len(data) // struct.calcsize(fmt)
    vals = struct.unpack("<" + fmt[1] * n, data)
    if dtype in ("FLOAT", "DOUBLE"):
        return [float(v) for v in vals]
    return list(vals)


SAMPLE_DATA = {
    "FLOAT": struct.pack("<6f", 1.5, -2.25, 0.0, 3e38, -1e-3, 7),
    "DOUBLE": struct.pack("<6d", 1.5, -2.25, 0.1, 1e300, -1e-300, 7),
    "INT8": struct.pack("<6b", -128, 127, 0, -1, 5, 9),
    "INT16": struct.pack("<6h", -32768, 32767, 0, -1, 5, 9),
    "INT32": struct.pack("<6i", -2 ** 31, 2 ** 31 - 1, 0, -1, 5, 9),
    "INT64": struct.pack("<6q", -2 ** 63, 2 ** 63 - 1, 0, -1, 5, 9),
    "UINT8": struct.pack("<6B", 0, 255, 1, 2, 3, 4),
    "UINT16": struct.pack("<6H", 0, 65535, 1, 2, 3, 4),
    "BOOL": bytes([0, 1, 1, 0, 0, 1]),
}


def _check_tensor(con, key, dtype, shape, data, values):
    assert con.execute_command("AI.TENSORGET", key, "META", "BLOB") == [
        b"dtype", dtype.encode(), b"shape", list(shape), b"blob", data]
    got = con.execute_command("AI.TENSORGET", key, "VALUES")
    if dtype in ("FLOAT", "DOUBLE"):
        assert [float(v) for v in got] == values
    else:
        assert got == values


def _dump_of_created(con, dtype, shape, data):
    """DUMP of the same tensor made with AI.TENSORSET ... BLOB on our module."""
    con.execute_command("AI.TENSORSET", "__tmp", dtype, *shape, "BLOB", data)
    d = con.dump("__tmp")
    con.delete("__tmp")
    return d


def _dump_encver(dump):
    assert dump[0] == 7 and dump[1] == 0x81
    return struct.unpack(">Q", dump[2:10])[0] & 0x3FF


@pytest.mark.parametrize("dtype", [d for d in SAMPLE_DATA if d != "BOOL"])
@pytest.mark.parametrize("encver", [0, 1, 2, 3])
def test_restore_legacy_encver(con, encver, dtype):
    """Tensors saved by RedisAI 1.0-1.2.4 (encver 0-3; no BOOL/STRING then) still load, and are saved in v4."""
    data = SAMPLE_DATA[dtype]
    assert con.restore("old", 0, dump_payload(legacy_fields(dtype, (2, 3), data), encver=encver)) == b"OK"
    _check_tensor(con, "old", dtype, (2, 3), data, _values(dtype, data))
    ours = con.dump("old")
    assert _dump_encver(ours) == 4
    assert ours == _dump_of_created(con, dtype, (2, 3), data)


@pytest.mark.parametrize("encver", [0, 1, 2, 3])
def test_restore_legacy_int32_column(con, encver):
    """The layout of RedisAI's own v0/v1 test payload: INT32 shape [2, 1], values [1, 2]."""
    data = struct.pack("<2i", 1, 2)
    con.restore("t", 0, dump_payload(legacy_fields("INT32", (2, 1), data), encver=encver))
    assert con.execute_command("AI.TENSORGET", "t", "META") == [b"dtype", b"INT32", b"shape", [2, 1]]
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [1, 2]


V4_CASES = {
    "float-scalar": ("FLOAT", (), struct.pack("<f", 2.5), None),
    "bool-2x3": ("BOOL", (2, 3), SAMPLE_DATA["BOOL"], None),
    "int64-6": ("INT64", (6,), SAMPLE_DATA["INT64"], None),
    "uint16-1x1x6": ("UINT16", (1, 1, 6), SAMPLE_DATA["UINT16"], None),
    "string-3": ("STRING", (3,), b"ab\x00c\x00def\x00", [0, 3, 5]),
    "string-empty-elements": ("STRING", (3,), b"\x00b\x00\x00", [0, 1, 3]),
    "string-scalar": ("STRING", (), b"only\x00", [0]),
    "string-2x2-utf8": ("STRING", (2, 2), "γ\x00日本\x00\x00z\x00".encode(), [0, 3, 10, 11]),
}


@pytest.mark.parametrize("name", list(V4_CASES))
def test_restore_built_v4(con, name):
    dtype, shape, data, offsets = V4_CASES[name]
    payload = dump_payload(v4_fields(dtype, shape, data, offsets))
    assert con.restore("t", 0, payload) == b"OK"
    if dtype == "STRING":
        assert con.execute_command("AI.TENSORGET", "t", "META", "BLOB") == [
            b"dtype", b"STRING", b"shape", list(shape), b"blob", data]
        assert con.execute_command("AI.TENSORGET", "t", "VALUES") == data.split(b"\x00")[:-1]
    else:
        _check_tensor(con, "t", dtype, shape, data, _values(dtype, data))
    ours = con.dump("t")
    assert _dump_encver(ours) == 4
    assert ours == _dump_of_created(con, dtype, shape, data)
    if len(data) <= 20:  # short buffers are stored uncompressed: then the bytes are exactly ours
        assert payload_body(ours) == payload_body(payload)


# ---------------------------------------------------------------------------------------------
# corrupt payloads (valid checksum): refused, the server stays up

CORRUPT = {
    "encver-5": dump_payload(v4_fields("FLOAT", (2,), b"\x00" * 8), encver=5),
    "encver-1023": dump_payload(v4_fields("FLOAT", (2,), b"\x00" * 8), encver=1023),
    "unknown-dtype-code": dump_payload([u(9), u(32), u(1), u(2), buf(b"\x00" * 8)]),
    "float16": dump_payload([u(2), u(16), u(1), u(2), buf(b"\x00" * 4)]),
    "int24": dump_payload([u(0), u(24), u(1), u(2), buf(b"\x00" * 6)]),
    "uint32": dump_payload([u(1), u(32), u(1), u(2), buf(b"\x00" * 8)]),
    "data-too-short": dump_payload(v4_fields("FLOAT", (2, 3), b"\x00" * 20)),
    "data-too-long": dump_payload(v4_fields("FLOAT", (2, 3), b"\x00" * 28)),
    "huge-shape": dump_payload(v4_fields("FLOAT", (1 << 40, 1 << 40), b"\x00" * 4)),
    "overflowing-shape": dump_payload(v4_fields("INT8", (1 << 32, 1 << 32), b"\x00")),
    "huge-ndim": dump_payload([u(2), u(32), u(1 << 31), u(2)]),
    "truncated-after-bits": dump_payload([u(2), u(32)]),
    "truncated-before-data": dump_payload([u(2), u(32), u(1), u(2)]),
    "string-missing-offsets": dump_payload(v4_fields("STRING", (2,), b"a\x00b\x00")),
    "string-one-offset-missing": dump_payload(v4_fields("STRING", (2,), b"a\x00b\x00", [0])),
    "legacy-data-too-short": dump_payload(legacy_fields("INT32", (2, 3), b"\x00" * 8), encver=2),
    "legacy-unknown-dtype": dump_payload([u(1), u(0), u(32), u(5), u(1), u(1), u(2), u(1), u(0),
                                          buf(b"\x00" * 8)], encver=0),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_restore_corrupt_payload_refused(con, name):
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.restore("bad", 0, CORRUPT[name])
    assert str(e.value) == BAD_DATA
    assert con.ping()
    assert con.exists("bad") == 0
    con.execute_command("AI.TENSORSET", "ok", "FLOAT", 1)
    assert con.execute_command("AI.TENSORGET", "ok", "VALUES") == [b"0"]


# Inconsistent STRING layouts: refusing them is best; if one is accepted it must then be served safely.
STRING_ODD = {
    "offset-out-of-range": v4_fields("STRING", (2,), b"ab\x00", [0, 100]),
    "offsets-decreasing": v4_fields("STRING", (2,), b"a\x00b\x00", [2, 0]),
    "no-final-nul": v4_fields("STRING", (1,), b"ab", [0]),
    "offset-not-after-nul": v4_fields("STRING", (2,), b"ab\x00c\x00", [0, 1]),
    "non-utf8": v4_fields("STRING", (1,), b"\xff\x00", [0]),
    "bool-value-2": v4_fields("BOOL", (2,), b"\x00\x02"),
}


@pytest.mark.parametrize("name", list(STRING_ODD))
def test_restore_inconsistent_payload_is_safe(con, name):
    try:
        con.restore("odd", 0, dump_payload(STRING_ODD[name]))
    except redis.exceptions.ResponseError as e:
        assert str(e) == BAD_DATA
        assert con.exists("odd") == 0
    else:
        for fmt in ([], ["META"], ["BLOB"], ["VALUES"], ["META", "VALUES"]):
            con.execute_command("AI.TENSORGET", "odd", *fmt)
        con.dump("odd")
        con.execute_command("DEBUG", "RELOAD")
    assert con.ping()
