"""AI.TENSORSET / AI.TENSORGET (docs/commands.md, "AI.TENSORSET" and "AI.TENSORGET"): round trips of every type,
reply formats, zero-filled tensors and scalars, STRING tensors, value ranges, every error in the documented order
of checks with its wire text, and the tensor key in the keyspace (TYPE, DEL, EXPIRE, RENAME, MEMORY USAGE).

Deliberate deviations from RedisAI 1.2.7 that these tests assert (our behaviour, see docs/commands.md):
  * negative integers via VALUES are accepted for INT8/16/32/64 within range (RedisAI rejected every negative);
  * an empty string is a valid STRING element (VALUES "" and BLOB "a\\0\\0b\\0");
  * a STRING element that is not UTF-8 is refused with `ERR STRING tensor elements must be valid UTF-8`;
  * a shape whose data would exceed 4 GiB (or whose element count overflows) is refused with
    `ERR tensor size exceeds the limit of 4294967296 bytes` instead of crashing the server.
"""

import math
import time

import numpy as np
import pytest
import redis

from helpers.checks import check_error, check_error_raw
from helpers.resp import raw_command

NUMERIC = {
    "FLOAT": np.float32,
    "DOUBLE": np.float64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "BOOL": np.bool_,
}
FLOATS = ("FLOAT", "DOUBLE")
INTS = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16")
ALL_DTYPES = list(NUMERIC) + ["STRING"]
ELEM_SIZE = {"FLOAT": 4, "DOUBLE": 8, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "UINT8": 1, "UINT16": 2,
             "BOOL": 1}

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
E_ARITY_SET = "wrong number of arguments for 'AI.TENSORSET' command"
E_ARITY_GET = "wrong number of arguments for 'AI.TENSORGET' command"
E_DTYPE = "invalid data type"
E_SHAPE = "invalid or negative value found in tensor shape"
E_BLOB_ARG = "a single binary string should come after the BLOB argument in 'AI.TENSORSET' command"
E_DATA_LEN = "data length does not match tensor shape and type"
E_BOOL = "BOOL tensor elements must be 0 or 1"
E_STR_COUNT = "Number of string elements in data blob does not match tensor length"
E_NVALUES = "wrong number of values was given in 'AI.TENSORSET' command"
E_VALUE = "invalid value"
E_NUL = "C-string value contains null character"
E_UTF8 = "STRING tensor elements must be valid UTF-8"
E_EMPTY_KEY = "tensor key is empty or in a different shard"
E_FORMAT = "unsupported data format"
E_BOTH = "both BLOB and VALUES specified"
E_LIMIT = "tensor size exceeds the limit of 4294967296 bytes"


# ---------------------------------------------------------------------------------------------
# helpers


def sample(dtype, shape, seed=0):
    """A deterministic numpy array of `dtype` (a RedisAI type name) and `shape`, with the extremes."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    npt = NUMERIC[dtype]
    if dtype in FLOATS:
        a = (rng.standard_normal(n) * 100).astype(npt)
        if n >= 3:
            a[0], a[1], a[2] = np.finfo(npt).max, np.finfo(npt).tiny, -0.0
    elif dtype == "BOOL":
        a = rng.integers(0, 2, n).astype(np.bool_)
    else:
        info = np.iinfo(npt)
        a = rng.integers(info.min, info.max, n, endpoint=True, dtype=npt)
        if n >= 2:
            a[0], a[-1] = info.min, info.max
    return a.reshape(shape)


def value_strings(a, dtype):
    """The VALUES arguments that describe numpy array `a`."""
    if dtype in FLOATS:
        return [repr(float(x)) for x in a.flatten()]
    return [str(int(x)) for x in a.flatten()]


def expected_values(a, dtype):
    return [float(x) if dtype in FLOATS else int(x) for x in a.flatten()]


def decode_values(reply, dtype):
    """VALUES reply -> python numbers, checking the RESP types (bulk strings for floats, integers else)."""
    out = []
    for v in reply:
        if dtype in FLOATS:
            assert isinstance(v, bytes), f"{dtype} values must be bulk strings, got {v!r}"
            out.append(float(v))
        else:
            assert isinstance(v, int) and not isinstance(v, bool), f"{dtype} values must be integers, got {v!r}"
            out.append(v)
    return out


def tensor_state(con, key):
    """Everything observable about `key`: None when missing, else (TYPE, TENSORGET META BLOB)."""
    if not con.exists(key):
        return None
    t = con.type(key)
    if t != b"AI_TENSOR":
        return (t, con.dump(key))
    return (t, con.execute_command("AI.TENSORGET", key, "META", "BLOB"))


def meta(dtype, shape):
    return [b"dtype", dtype.encode(), b"shape", list(shape)]


# ---------------------------------------------------------------------------------------------
# round trips


SHAPES = [(1,), (7,), (2, 3), (2, 3, 4), (1, 1, 1, 1, 5), ()]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("dtype", list(NUMERIC))
def test_blob_roundtrip(con, dtype, shape):
    a = sample(dtype, shape, seed=len(shape))
    blob = a.tobytes()
    assert con.execute_command("AI.TENSORSET", "t", dtype, *shape, "BLOB", blob) == b"OK"

    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == blob
    got = np.frombuffer(con.execute_command("AI.TENSORGET", "t", "BLOB"), dtype=NUMERIC[dtype]).reshape(shape)
    np.testing.assert_array_equal(got, a)
    assert con.execute_command("AI.TENSORGET", "t", "META") == meta(dtype, shape)
    assert con.execute_command("AI.TENSORGET", "t", "META", "BLOB") == meta(dtype, shape) + [b"blob", blob]
    assert con.execute_command("AI.TENSORGET", "t") == meta(dtype, shape) + [b"blob", blob]

    values = con.execute_command("AI.TENSORGET", "t", "VALUES")
    assert decode_values(values, dtype) == expected_values(a, dtype)
    mv = con.execute_command("AI.TENSORGET", "t", "META", "VALUES")
    assert mv[:4] == meta(dtype, shape) and mv[4] == b"values"
    assert decode_values(mv[5], dtype) == expected_values(a, dtype)


@pytest.mark.parametrize("shape", [(1,), (5,), (2, 3), ()], ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("dtype", list(NUMERIC))
def test_values_roundtrip(con, dtype, shape):
    a = sample(dtype, shape, seed=7)  # signed types include negatives (accepted: deviation, see top)
    assert con.execute_command("AI.TENSORSET", "t", dtype, *shape, "VALUES", *value_strings(a, dtype)) == b"OK"
    blob = con.execute_command("AI.TENSORGET", "t", "BLOB")
    np.testing.assert_array_equal(np.frombuffer(blob, dtype=NUMERIC[dtype]).reshape(shape), a)
    assert blob == a.tobytes()
    assert decode_values(con.execute_command("AI.TENSORGET", "t", "VALUES"), dtype) == expected_values(a, dtype)
    assert con.execute_command("AI.TENSORGET", "t", "META") == meta(dtype, shape)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_values_parsing(con, dtype):
    texts = ["3", "-2", "0", "-0", "0.1", "1e-3", "-2.5E+2", "1.5e10", "123456789.125", ".5", "7.", "3.4028234e38"]
    con.execute_command("AI.TENSORSET", "t", dtype, len(texts), "VALUES", *texts)
    npt = NUMERIC[dtype]
    want = np.array([np.float64(t) for t in texts]).astype(npt)
    got = np.frombuffer(con.execute_command("AI.TENSORGET", "t", "BLOB"), dtype=npt)
    np.testing.assert_array_equal(got, want)
    # the VALUES reply is the stored value printed as a double: parses back to exactly the stored value
    values = con.execute_command("AI.TENSORGET", "t", "VALUES")
    assert all(isinstance(v, bytes) for v in values)
    assert [float(v) for v in values] == [float(x) for x in want]


def test_float_values_reply_example(con):
    """The example of docs/commands.md (AI.TENSORGET t META VALUES after VALUES 1 2 3 4), exact bytes."""
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, 2, "VALUES", 1, 2, 3, 4)
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == [
        b"dtype", b"FLOAT", b"shape", [2, 2], b"values", [b"1", b"2", b"3", b"4"]]


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_infinity_values(con, dtype):
    """RedisModule_StringToDouble accepts inf (it only refuses NaN, garbage and overflow)."""
    con.execute_command("AI.TENSORSET", "t", dtype, 3, "VALUES", "inf", "-inf", "1")
    got = np.frombuffer(con.execute_command("AI.TENSORGET", "t", "BLOB"), dtype=NUMERIC[dtype])
    assert math.isinf(got[0]) and got[0] > 0 and math.isinf(got[1]) and got[1] < 0 and got[2] == 1
    values = [float(v) for v in con.execute_command("AI.TENSORGET", "t", "VALUES")]
    assert values == [math.inf, -math.inf, 1.0]


def test_values_text_is_the_servers_own_double_text(con, shared_server):
    """VALUES of FLOAT and DOUBLE tensors read exactly as the server writes a double itself (ZSCORE is the
    oracle): Redis 7.0 writes `%.17g` (the module formats those itself, faster), later servers their own."""
    rng = np.random.default_rng(7)
    doubles = [0.0, 0.1, 1e20, 1.5e-7, 123456789.125, 1e16, 1e17, 1e-5, 5e-324, 1.7976931348623157e308,
               1234567890123456.25, math.inf, -math.inf]
    doubles += list(rng.standard_normal(100) * 10.0 ** rng.integers(-30, 30, 100))
    doubles += list(np.frombuffer(rng.bytes(8 * 100), dtype=np.float64))
    doubles = [d for d in doubles if not math.isnan(d)]
    floats = [float(np.float32(d)) for d in doubles if abs(d) < 3e38 or math.isinf(d)]
    # A sorted set stores -0 as 0, so the oracle cannot show -0: it is checked on its own below.
    doubles, floats = ([v for v in vs if not (v == 0 and math.copysign(1, v) < 0)] for vs in (doubles, floats))
    for dtype, values, npt in (("DOUBLE", doubles, np.float64), ("FLOAT", floats, np.float32)):
        blob = np.array(values, dtype=npt).tobytes()
        con.execute_command("AI.TENSORSET", "t", dtype, len(values), "BLOB", blob)
        got = con.execute_command("AI.TENSORGET", "t", "VALUES")
        con.delete("z")
        want = []
        for v in np.frombuffer(blob, dtype=npt):
            con.execute_command("ZADD", "z", repr(float(v)), "m")
            want.append(raw_command(shared_server.port, "ZSCORE", "z", "m"))  # the server's bytes, not a float
        assert got == want, [(g, w) for g, w in zip(got, want) if g != w][:5]
    con.execute_command("AI.TENSORSET", "t", "DOUBLE", 1, "VALUES", "-0")
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"-0"]
    # RESP3 clients get doubles as doubles.
    c3 = redis.Redis(port=shared_server.port, protocol=3)
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", "0.5", "-2")
    assert c3.execute_command("AI.TENSORGET", "t", "VALUES") == [0.5, -2.0]


def test_double_precision_kept(con):
    vals = [0.1, 1 / 3, -2.925182246327349, 1e-300, 1.7976931348623157e308, 5e-324]
    con.execute_command("AI.TENSORSET", "t", "DOUBLE", len(vals), "VALUES", *[repr(v) for v in vals])
    assert [float(v) for v in con.execute_command("AI.TENSORGET", "t", "VALUES")] == vals
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == np.array(vals, dtype=np.float64).tobytes()


def test_float32_rounding(con):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", "0.1", "16777217")
    values = [float(v) for v in con.execute_command("AI.TENSORGET", "t", "VALUES")]
    assert values == [float(np.float32(0.1)), 16777216.0]


def test_blob_with_arbitrary_bytes(con):
    blob = bytes(range(256))
    con.execute_command("AI.TENSORSET", "t", "UINT8", 16, 16, "BLOB", blob)
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == blob
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == list(range(256))
    blob = b"\r\n\x00$*-+:" * 8
    con.execute_command("AI.TENSORSET", "t", "INT8", len(blob), "BLOB", blob)
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == blob


def test_large_tensor(con):
    a = np.arange(1_000_000, dtype=np.float32) * 0.5
    con.execute_command("AI.TENSORSET", "big", "FLOAT", 1000, 1000, "BLOB", a.tobytes())
    assert con.execute_command("AI.TENSORGET", "big", "BLOB") == a.tobytes()
    values = con.execute_command("AI.TENSORGET", "big", "VALUES")
    assert len(values) == 1_000_000 and float(values[-1]) == 499999.5
    v = np.arange(10000, dtype=np.int64) - 5000
    con.execute_command("AI.TENSORSET", "v", "INT64", 100, 100, "VALUES", *[str(x) for x in v])
    assert con.execute_command("AI.TENSORGET", "v", "VALUES") == [int(x) for x in v]


# ---------------------------------------------------------------------------------------------
# reply shapes and format arguments


@pytest.fixture
def t22(con):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, 2, "VALUES", 1, 2, 3, 4)
    return con


BLOB22 = np.array([1, 2, 3, 4], dtype=np.float32).tobytes()
META22 = [b"dtype", b"FLOAT", b"shape", [2, 2]]
VALUES22 = [b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("args,expected", [
    ((), META22 + [b"blob", BLOB22]),
    (("META",), META22),
    (("BLOB",), BLOB22),
    (("VALUES",), VALUES22),
    (("META", "BLOB"), META22 + [b"blob", BLOB22]),
    (("BLOB", "META"), META22 + [b"blob", BLOB22]),
    (("META", "VALUES"), META22 + [b"values", VALUES22]),
    (("VALUES", "META"), META22 + [b"values", VALUES22]),
    (("META", "META"), META22),
    (("BLOB", "BLOB"), BLOB22),
    (("VALUES", "VALUES"), VALUES22),
    (("meta",), META22),
    (("blob",), BLOB22),
    (("values",), VALUES22),
    (("Meta", "vAlUeS"), META22 + [b"values", VALUES22]),
    (("bLoB", "mEtA"), META22 + [b"blob", BLOB22]),
], ids=lambda x: "-".join(x) if isinstance(x, tuple) else None)
def test_tensorget_reply_shapes(t22, args, expected):
    assert t22.execute_command("AI.TENSORGET", "t", *args) == expected


def test_tensorget_reply_resp_types(shared_server, t22):
    """Exact RESP2 types: keys are bulk strings, dtype a bulk string, dims integers, floats bulk strings."""
    reply = raw_command(shared_server.port, "AI.TENSORGET", "t", "META", "VALUES")
    assert reply == [b"dtype", b"FLOAT", b"shape", [2, 2], b"values", VALUES22]
    assert raw_command(shared_server.port, "AI.TENSORSET", "u", "INT32", 2, "VALUES", 5, 6) == "OK"
    assert raw_command(shared_server.port, "AI.TENSORGET", "u", "VALUES") == [5, 6]


# ---------------------------------------------------------------------------------------------
# zero-filled tensors and scalars


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_zero_filled(con, dtype):
    assert con.execute_command("AI.TENSORSET", "z", dtype, 2, 3) == b"OK"
    assert con.execute_command("AI.TENSORGET", "z", "META") == meta(dtype, (2, 3))
    values = con.execute_command("AI.TENSORGET", "z", "VALUES")
    if dtype == "STRING":
        assert values == [b""] * 6
        assert con.execute_command("AI.TENSORGET", "z", "BLOB") == b"\x00" * 6
    else:
        assert decode_values(values, dtype) == [0] * 6
        assert con.execute_command("AI.TENSORGET", "z", "BLOB") == b"\x00" * (6 * ELEM_SIZE[dtype])


@pytest.mark.parametrize("dtype", list(NUMERIC))
def test_scalar_values(con, dtype):
    text = {"FLOAT": "3", "DOUBLE": "-2.5", "BOOL": "1", "UINT8": "200", "UINT16": "60000"}.get(dtype, "42")
    assert con.execute_command("AI.TENSORSET", "s", dtype, "VALUES", text) == b"OK"
    assert con.execute_command("AI.TENSORGET", "s", "META") == meta(dtype, ())
    want = np.array([np.float64(text)]).astype(NUMERIC[dtype])
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == want.tobytes()
    assert decode_values(con.execute_command("AI.TENSORGET", "s", "VALUES"), dtype) == expected_values(want, dtype)
    assert con.execute_command("AI.TENSORGET", "s") == meta(dtype, ()) + [b"blob", want.tobytes()]


def test_scalar_spec_example(con):
    assert con.execute_command("AI.TENSORSET", "t", "FLOAT", "VALUES", 3) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == [
        b"dtype", b"FLOAT", b"shape", [], b"values", [b"3"]]


@pytest.mark.parametrize("dtype", list(NUMERIC))
def test_scalar_blob(con, dtype):
    a = sample(dtype, (), seed=3)
    assert con.execute_command("AI.TENSORSET", "s", dtype, "BLOB", a.tobytes()) == b"OK"
    assert con.execute_command("AI.TENSORGET", "s", "META", "BLOB") == meta(dtype, ()) + [b"blob", a.tobytes()]


def test_string_scalar(con):
    con.execute_command("AI.TENSORSET", "s", "STRING", "VALUES", "hello")
    assert con.execute_command("AI.TENSORGET", "s", "META", "BLOB") == meta("STRING", ()) + [b"blob", b"hello\x00"]
    con.execute_command("AI.TENSORSET", "s", "STRING", "BLOB", b"abc\x00")
    assert con.execute_command("AI.TENSORGET", "s", "META", "VALUES") == meta("STRING", ()) + [b"values", [b"abc"]]


# ---------------------------------------------------------------------------------------------
# case insensitivity


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_dtype_case_insensitive(con, dtype):
    for variant in (dtype.lower(), dtype.capitalize(), dtype[:1].lower() + dtype[1:]):
        con.delete("t")
        assert con.execute_command("AI.TENSORSET", "t", variant, 2) == b"OK"
        assert con.execute_command("AI.TENSORGET", "t", "META") == meta(dtype, (2,))


def test_keywords_and_command_case_insensitive(con):
    assert con.execute_command("ai.tensorset", "a", "float", 2, "values", 1, 2) == b"OK"
    assert con.execute_command("Ai.TensorSet", "b", "Int8", 2, "bLoB", b"\x01\x02") == b"OK"
    assert con.execute_command("ai.tensorget", "a", "values") == [b"1", b"2"]
    assert con.execute_command("AI.TENSORGET", "b", "Values") == [1, 2]
    assert con.execute_command("ai.TENSORget", "b", "meta", "blob") == meta("INT8", (2,)) + [b"blob", b"\x01\x02"]


# ---------------------------------------------------------------------------------------------
# STRING tensors


def test_string_values_roundtrip(con):
    elems = ["alpha", "beta", "γειά", "日本語", "x" * 1000, "with space", "line\r\nbreak"]
    con.execute_command("AI.TENSORSET", "s", "STRING", len(elems), "VALUES", *elems)
    enc = [e.encode() for e in elems]
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == enc
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == b"".join(e + b"\x00" for e in enc)
    assert con.execute_command("AI.TENSORGET", "s", "META") == meta("STRING", (len(elems),))


def test_string_blob_roundtrip(con):
    blob = b"uno\x00dos\x00tres\x00cuatro\x00"
    con.execute_command("AI.TENSORSET", "s", "STRING", 2, 2, "BLOB", blob)
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == blob
    assert con.execute_command("AI.TENSORGET", "s", "META", "VALUES") == meta("STRING", (2, 2)) + [
        b"values", [b"uno", b"dos", b"tres", b"cuatro"]]
    assert con.execute_command("AI.TENSORGET", "s") == meta("STRING", (2, 2)) + [b"blob", blob]


def test_string_values_trailing_nul_dropped(con):
    con.execute_command("AI.TENSORSET", "s", "STRING", 2, "VALUES", b"ab\x00", b"cd")
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == [b"ab", b"cd"]
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == b"ab\x00cd\x00"


def test_string_empty_elements_are_valid(con):
    """Deviation: RedisAI could not store an empty string element; we can."""
    con.execute_command("AI.TENSORSET", "s", "STRING", 3, "VALUES", "", "b", "")
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == [b"", b"b", b""]
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == b"\x00b\x00\x00"
    con.execute_command("AI.TENSORSET", "s", "STRING", 3, "BLOB", b"a\x00\x00b\x00")
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == [b"a", b"", b"b"]
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == b"a\x00\x00b\x00"
    con.execute_command("AI.TENSORSET", "s", "STRING", 1, "BLOB", b"\x00")
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == [b""]
    con.execute_command("AI.TENSORSET", "s", "STRING", 1, "VALUES", b"\x00")
    assert con.execute_command("AI.TENSORGET", "s", "VALUES") == [b""]


# ---------------------------------------------------------------------------------------------
# value ranges (VALUES)

RANGES = {
    "INT8": (-128, 127),
    "INT16": (-32768, 32767),
    "INT32": (-2147483648, 2147483647),
    "INT64": (-9223372036854775808, 9223372036854775807),
    "UINT8": (0, 255),
    "UINT16": (0, 65535),
    "BOOL": (0, 1),
}


@pytest.mark.parametrize("dtype", list(RANGES))
def test_values_range_limits_accepted(con, dtype):
    lo, hi = RANGES[dtype]
    con.execute_command("AI.TENSORSET", "t", dtype, 3, "VALUES", lo, hi, 0)
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [lo, hi, 0]
    assert con.execute_command("AI.TENSORGET", "t", "BLOB") == np.array([lo, hi, 0], dtype=NUMERIC[dtype]).tobytes()


def test_negative_signed_values_accepted(con):
    """Deviation from RedisAI (which rejected every negative value via VALUES): in-range negatives work."""
    assert con.execute_command("AI.TENSORSET", "z", "INT8", 2, "VALUES", -1, -128) == b"OK"
    assert con.execute_command("AI.TENSORGET", "z", "VALUES") == [-1, -128]
    assert con.execute_command("AI.TENSORGET", "z", "BLOB") == b"\xff\x80"
    for dtype in ("INT16", "INT32", "INT64"):
        lo = RANGES[dtype][0]
        con.execute_command("AI.TENSORSET", "z", dtype, 3, "VALUES", -1, lo, -7)
        assert con.execute_command("AI.TENSORGET", "z", "VALUES") == [-1, lo, -7]
        assert con.execute_command("AI.TENSORGET", "z", "BLOB") == np.array([-1, lo, -7], NUMERIC[dtype]).tobytes()


INVALID_VALUES = {
    "INT8": ["128", "-129", "1000"],
    "INT16": ["32768", "-32769"],
    "INT32": ["2147483648", "-2147483649"],
    "INT64": ["9223372036854775808", "-9223372036854775809", "99999999999999999999"],
    "UINT8": ["256", "-1"],
    "UINT16": ["65536", "-1", "70000"],
    "BOOL": ["2", "-1", "true", "10"],
}
INVALID_INT_TEXT = ["1.87", "1.0", "1e3", "abc", "", "+1", "01", "-0", " 1", "1 ", "0x10", "--1", "1-"]
INVALID_FLOAT_TEXT = ["nan", "NaN", "-nan", "abc", "", "1.0x", "1,5", " 1", "1 ", "1e400", "-1e400", "--1", "e5"]


def _invalid_value_cases():
    for dtype, vals in INVALID_VALUES.items():
        for v in vals:
            yield dtype, v
    for dtype in list(RANGES):
        for v in INVALID_INT_TEXT:
            yield dtype, v
    for dtype in FLOATS:
        for v in INVALID_FLOAT_TEXT:
            yield dtype, v


@pytest.mark.parametrize("dtype,value", list(_invalid_value_cases()), ids=lambda x: repr(x))
def test_invalid_value(con, dtype, value):
    check_error(con, E_VALUE, "AI.TENSORSET", "t", dtype, 2, "VALUES", "1", value)
    check_error(con, E_VALUE, "AI.TENSORSET", "t", dtype, "VALUES", value)
    assert con.exists("t") == 0


# ---------------------------------------------------------------------------------------------
# TENSORSET errors, in the order docs/commands.md lists the checks. Each case runs against a missing key (must stay
# missing) and against an existing tensor (must be left unchanged).

SET_ERRORS = [
    # argc < 4
    ("arity-key-only", [], E_ARITY_SET),
    ("arity-no-dims", ["FLOAT"], E_ARITY_SET),
    ("arity-bad-type", ["UINT32"], E_ARITY_SET),
    # data type, checked before the shape
    ("dtype-uint32", ["UINT32", 2], E_DTYPE),
    ("dtype-uint64", ["UINT64", 2], E_DTYPE),
    ("dtype-float16", ["FLOAT16", 2], E_DTYPE),
    ("dtype-bfloat16", ["BFLOAT16", 2], E_DTYPE),
    ("dtype-float32", ["FLOAT32", 2], E_DTYPE),
    ("dtype-int", ["INT", 2], E_DTYPE),
    ("dtype-empty", ["", 2], E_DTYPE),
    ("dtype-garbage", ["garbage", 2, "VALUES", 1, 2], E_DTYPE),
    ("dtype-trailing-space", ["FLOAT ", 2], E_DTYPE),
    ("dtype-before-shape", ["UINT32", 0, "BLOB"], E_DTYPE),
    ("dtype-before-shape2", ["FLOAT16", -1], E_DTYPE),
    # shape
    ("shape-zero", ["FLOAT", 0], E_SHAPE),
    ("shape-negative", ["FLOAT", -1], E_SHAPE),
    ("shape-fraction", ["FLOAT", "1.5"], E_SHAPE),
    ("shape-word", ["FLOAT", "abc"], E_SHAPE),
    ("shape-second-zero", ["FLOAT", 2, 0], E_SHAPE),
    ("shape-second-negative", ["FLOAT", 2, -3, "VALUES", 1, 2], E_SHAPE),
    ("shape-leading-zero", ["FLOAT", "01"], E_SHAPE),
    ("shape-plus", ["FLOAT", "+2"], E_SHAPE),
    ("shape-empty", ["FLOAT", ""], E_SHAPE),
    ("shape-space", ["FLOAT", " 2"], E_SHAPE),
    ("shape-exponent", ["FLOAT", "1e3"], E_SHAPE),
    ("shape-i64-overflow", ["FLOAT", "9223372036854775808"], E_SHAPE),
    ("shape-before-blob-arity", ["FLOAT", 0, "BLOB"], E_SHAPE),
    ("shape-before-values-count", ["FLOAT", 0, "VALUES"], E_SHAPE),
    ("shape-unknown-keyword", ["FLOAT", 2, "BLOBS", "x"], E_SHAPE),
    ("shape-word-before-values", ["FLOAT", 2, "abc", "VALUES", 1, 2], E_SHAPE),
    ("shape-word-before-blob", ["FLOAT", 2, "abc", "BLOB", b"12345678"], E_SHAPE),
    # BLOB arity
    ("blob-missing", ["FLOAT", 2, "BLOB"], E_BLOB_ARG),
    ("blob-two-args", ["FLOAT", 2, "BLOB", b"\x00" * 8, b"\x00" * 8], E_BLOB_ARG),
    ("blob-scalar-missing", ["FLOAT", "BLOB"], E_BLOB_ARG),
    ("blob-string-missing", ["STRING", 1, "BLOB"], E_BLOB_ARG),
    ("blob-then-values", ["FLOAT", 2, "BLOB", b"\x00" * 8, "VALUES"], E_BLOB_ARG),
    # BLOB length (numeric types)
    ("datalen-scalar", ["FLOAT", "BLOB", b"abc"], E_DATA_LEN),
    ("datalen-keyword-as-blob", ["FLOAT", 2, "BLOB", "VALUES"], E_DATA_LEN),
    ("datalen-bool-before-content", ["BOOL", 2, "BLOB", b"\x02"], E_DATA_LEN),
    ("datalen-2x2-float", ["FLOAT", 2, 2, "BLOB", b"\x00" * 12], E_DATA_LEN),
    # BOOL content
    ("bool-2", ["BOOL", 2, "BLOB", b"\x00\x02"], E_BOOL),
    ("bool-ff", ["BOOL", 2, "BLOB", b"\xff\x00"], E_BOOL),
    ("bool-scalar", ["BOOL", "BLOB", b"\x02"], E_BOOL),
    ("bool-ascii-1", ["BOOL", 1, "BLOB", b"1"], E_BOOL),
    # STRING blob
    ("strblob-missing-final-nul", ["STRING", 2, "BLOB", b"a\x00b"], E_STR_COUNT),
    ("strblob-no-nul", ["STRING", 1, "BLOB", b"abc"], E_STR_COUNT),
    ("strblob-too-many", ["STRING", 1, "BLOB", b"a\x00b\x00"], E_STR_COUNT),
    ("strblob-too-few", ["STRING", 3, "BLOB", b"a\x00b\x00"], E_STR_COUNT),
    ("strblob-empty", ["STRING", 1, "BLOB", b""], E_STR_COUNT),
    ("strblob-one-of-two", ["STRING", 2, "BLOB", b"\x00"], E_STR_COUNT),
    ("strblob-2x2", ["STRING", 2, 2, "BLOB", b"a\x00b\x00c\x00"], E_STR_COUNT),
    # VALUES count, checked before any value is parsed
    ("nvalues-few", ["FLOAT", 2, "VALUES", 1], E_NVALUES),
    ("nvalues-many", ["FLOAT", 2, "VALUES", 1, 2, 3], E_NVALUES),
    ("nvalues-none-scalar", ["FLOAT", "VALUES"], E_NVALUES),
    ("nvalues-none", ["FLOAT", 1, "VALUES"], E_NVALUES),
    ("nvalues-2x2", ["FLOAT", 2, 2, "VALUES", 1, 2, 3], E_NVALUES),
    ("nvalues-string", ["STRING", 2, "VALUES", "a"], E_NVALUES),
    ("nvalues-before-parse", ["INT8", 2, "VALUES", 1, "abc", 3], E_NVALUES),
    ("nvalues-blob-after-values", ["FLOAT", 2, "VALUES", 1, 2, "BLOB", b"x"], E_NVALUES),
    # values
    ("value-float-garbage", ["FLOAT", 2, "VALUES", 1, "abc"], E_VALUE),
    ("value-float-nan", ["FLOAT", 2, "VALUES", 1, "nan"], E_VALUE),
    ("value-double-nan", ["DOUBLE", 1, "VALUES", "nan"], E_VALUE),
    ("value-int-fraction", ["INT32", 1, "VALUES", "1.87"], E_VALUE),
    ("value-int8-range", ["INT8", 2, "VALUES", 1000, "abc"], E_VALUE),
    ("value-int8-minus129", ["INT8", 2, "VALUES", -1, -129], E_VALUE),
    ("value-uint8-256", ["UINT8", 1, "VALUES", 256], E_VALUE),
    ("value-bool-2", ["BOOL", 2, "VALUES", 0, 2], E_VALUE),
    ("value-keywords-as-values", ["FLOAT", 2, "VALUES", "BLOB", b"x"], E_VALUE),
    # STRING values
    ("string-interior-nul", ["STRING", 1, "VALUES", b"a\x00b"], E_NUL),
    ("string-leading-nul", ["STRING", 2, "VALUES", "ok", b"\x00x"], E_NUL),
    # UTF-8 (deviation)
    ("utf8-values-ff", ["STRING", 1, "VALUES", b"\xff"], E_UTF8),
    ("utf8-values-bad-continuation", ["STRING", 2, "VALUES", "a", b"\xc3\x28"], E_UTF8),
    ("utf8-values-overlong", ["STRING", 1, "VALUES", b"\xc0\xaf"], E_UTF8),
    ("utf8-values-surrogate", ["STRING", 1, "VALUES", b"\xed\xa0\x80"], E_UTF8),
    ("utf8-blob", ["STRING", 2, "BLOB", b"a\x00\xfe\x00"], E_UTF8),
    ("utf8-blob-truncated", ["STRING", 1, "BLOB", b"\xe6\x97\x00"], E_UTF8),
    # size limit (deviation: RedisAI would overflow or abort)
    ("limit-1e24-floats", ["FLOAT", 100000000, 100000000, 100000000], E_LIMIT),
    ("limit-2^64-int8", ["INT8", 4294967296, 4294967296], E_LIMIT),
    ("limit-float-4GiB+4", ["FLOAT", 1073741825], E_LIMIT),
    ("limit-int8-4GiB+1", ["INT8", 4294967297], E_LIMIT),
    ("limit-double", ["DOUBLE", 536870913], E_LIMIT),
    ("limit-i64-max-dim", ["INT64", 9223372036854775807], E_LIMIT),
    ("limit-overflow-3-dims", ["UINT16", 4294967296, 4294967296, 4294967296], E_LIMIT),
    ("limit-string-zero-filled", ["STRING", 1000000000000], E_LIMIT),
]

# data length for every numeric type: one element short, one long, empty
for _dt, _sz in ELEM_SIZE.items():
    SET_ERRORS += [
        (f"datalen-{_dt.lower()}-short", [_dt, 3, "BLOB", b"\x00" * (3 * _sz - 1)], E_DATA_LEN),
        (f"datalen-{_dt.lower()}-long", [_dt, 3, "BLOB", b"\x00" * (3 * _sz + 1)], E_DATA_LEN),
        (f"datalen-{_dt.lower()}-extra-element", [_dt, 3, "BLOB", b"\x00" * (4 * _sz)], E_DATA_LEN),
        (f"datalen-{_dt.lower()}-empty", [_dt, 3, "BLOB", b""], E_DATA_LEN),
    ]


@pytest.mark.parametrize("existing", [False, True], ids=["missing-key", "existing-tensor"])
@pytest.mark.parametrize("args,msg", [(a, m) for _, a, m in SET_ERRORS], ids=[i for i, _, _ in SET_ERRORS])
def test_tensorset_error(con, args, msg, existing):
    if existing:
        con.execute_command("AI.TENSORSET", "k", "INT16", 2, "VALUES", 7, 8)
    before = tensor_state(con, "k")
    check_error(con, msg, "AI.TENSORSET", "k", *args)
    assert tensor_state(con, "k") == before
    assert con.ping()


def test_tensorset_arity_without_key(con):
    check_error(con, E_ARITY_SET, "AI.TENSORSET")


@pytest.mark.parametrize("args", [
    ["FLOAT", 2, "VALUES", 1, 2],  # a valid command
    ["UINT32", 2],  # invalid data type
    ["FLOAT", 0],  # invalid shape
    ["FLOAT", 2, "BLOB"],  # blob arity
    ["FLOAT", 2, "BLOB", b"abc"],  # data length
    ["FLOAT", 2, "VALUES", 1],  # values count
    ["INT8", 1, "VALUES", 1000],  # invalid value
    ["FLOAT", 100000000, 100000000, 100000000],  # size limit
], ids=["valid", "dtype", "shape", "blob-arity", "datalen", "nvalues", "value", "limit"])
@pytest.mark.parametrize("kind", ["string", "list", "hash"])
def test_tensorset_wrongtype_first(con, kind, args):
    """An existing non-tensor key gives WRONGTYPE before anything after the key is looked at."""
    if kind == "string":
        con.set("k", "v")
    elif kind == "list":
        con.rpush("k", "a", "b")
    else:
        con.hset("k", "f", "v")
    before = tensor_state(con, "k")
    check_error(con, WRONGTYPE, "AI.TENSORSET", "k", *args)
    assert tensor_state(con, "k") == before


def test_tensorset_arity_before_wrongtype(con):
    con.set("k", "v")
    check_error(con, E_ARITY_SET, "AI.TENSORSET", "k", "FLOAT")
    check_error(con, E_ARITY_SET, "AI.TENSORSET", "k")
    assert con.get("k") == b"v"


@pytest.mark.parametrize("args,alternatives", [
    (["FLOAT", 100000000, 100000000, 100000000, "BLOB", b"abcd"], (E_LIMIT, E_DATA_LEN)),
    (["INT8", 4294967296, 4294967296, "BLOB", b"\x00" * 16], (E_LIMIT, E_DATA_LEN)),
    (["FLOAT", 1073741825, "BLOB", b"\x00" * 4], (E_LIMIT, E_DATA_LEN)),
    (["INT8", 4294967296, 4294967296, "VALUES", 1], (E_LIMIT, E_NVALUES)),
    (["STRING", 4294967296, 4294967296, "BLOB", b"a\x00"], (E_LIMIT, E_STR_COUNT)),
    (["STRING", 1000000000000, "VALUES", "a"], (E_LIMIT, E_NVALUES)),
], ids=["float-blob", "int8-blob", "float-4GiB-blob", "int8-values", "string-blob", "string-values"])
def test_huge_shape_with_data_errors(con, args, alternatives):
    """Huge dims together with (too little) data: an error, whichever of the two, and no crash."""
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.TENSORSET", "k", *args)
    assert str(e.value) in alternatives
    assert con.exists("k") == 0
    assert con.ping()


def test_size_limit_exact_wire_text(shared_server, con):
    check_error_raw(shared_server, "ERR " + E_LIMIT, "AI.TENSORSET", "t", "FLOAT", 100000000, 100000000, 100000000)
    check_error_raw(shared_server, "ERR " + E_LIMIT, "AI.TENSORSET", "t", "INT8", 4294967296, 4294967296)
    assert con.ping()
    # the server is still fully usable
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1, 2)
    assert con.execute_command("AI.TENSORGET", "t", "VALUES") == [b"1", b"2"]


# ---------------------------------------------------------------------------------------------
# TENSORGET errors


@pytest.mark.parametrize("keykind", ["tensor", "missing", "string"])
@pytest.mark.parametrize("args", [
    [],
    ["META", "BLOB", "VALUES"],
    ["META", "META", "META"],
    ["FOO", "BAR", "BAZ", "QUX"],
], ids=["no-key", "5-args", "5-args-meta", "6-args"])
def test_tensorget_arity(con, keykind, args):
    if keykind == "tensor":
        con.execute_command("AI.TENSORSET", "k", "FLOAT", 1)
    elif keykind == "string":
        con.set("k", "v")
    cmd = ["AI.TENSORGET"] + (["k"] + args if args else [])
    check_error(con, E_ARITY_GET, *cmd)


@pytest.mark.parametrize("args", [[], ["META"], ["BLOB"], ["VALUES"], ["FOO"], ["BLOB", "VALUES"], ["META", "FOO"]])
def test_tensorget_missing_key(con, args):
    """The key is looked up before the format arguments are parsed."""
    check_error(con, E_EMPTY_KEY, "AI.TENSORGET", "nokey", *args)


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset", "hash"])
@pytest.mark.parametrize("args", [[], ["META"], ["FOO"], ["BLOB", "VALUES"]])
def test_tensorget_wrongtype(con, kind, args):
    {"string": lambda: con.set("k", "v"), "list": lambda: con.rpush("k", "a"),
     "set": lambda: con.sadd("k", "a"), "zset": lambda: con.zadd("k", {"a": 1}),
     "hash": lambda: con.hset("k", "f", "v")}[kind]()
    check_error(con, WRONGTYPE, "AI.TENSORGET", "k", *args)


# at most two format arguments fit in the arity limit (argc <= 4)
@pytest.mark.parametrize("args,msg", [
    (["FOO"], E_FORMAT),
    ([""], E_FORMAT),
    (["METAS"], E_FORMAT),
    (["META", "FOO"], E_FORMAT),
    (["BLOB", "X"], E_FORMAT),
    (["FOO", "BLOB"], E_FORMAT),
    (["VALUES", "FOO"], E_FORMAT),
    (["BLOB", "VALUES"], E_BOTH),
    (["VALUES", "BLOB"], E_BOTH),
    (["values", "blob"], E_BOTH),
    (["Blob", "vAlUeS"], E_BOTH),
], ids=lambda x: "-".join(x) if isinstance(x, list) else None)
def test_tensorget_format_errors(con, args, msg):
    con.execute_command("AI.TENSORSET", "k", "FLOAT", 2, "VALUES", 1, 2)
    check_error(con, msg, "AI.TENSORGET", "k", *args)


# ---------------------------------------------------------------------------------------------
# exact wire texts (ERR prefix, upper-case command name in the arity message)


@pytest.mark.parametrize("cmd,wire", [
    (["AI.TENSORSET", "t", "FLOAT"], "ERR " + E_ARITY_SET),
    (["ai.tensorset", "t", "FLOAT"], "ERR " + E_ARITY_SET),
    (["AI.TENSORSET"], "ERR " + E_ARITY_SET),
    (["AI.TENSORGET"], "ERR " + E_ARITY_GET),
    (["ai.tensorget"], "ERR " + E_ARITY_GET),
    (["Ai.TensorGet", "t", "META", "BLOB", "VALUES"], "ERR " + E_ARITY_GET),
    (["AI.TENSORSET", "t", "UINT32", 1], "ERR " + E_DTYPE),
    (["AI.TENSORSET", "t", "FLOAT", 0], "ERR " + E_SHAPE),
    (["AI.TENSORSET", "t", "FLOAT", 1, "BLOB"], "ERR " + E_BLOB_ARG),
    (["AI.TENSORSET", "t", "FLOAT", 1, "BLOB", b"abc"], "ERR " + E_DATA_LEN),
    (["AI.TENSORSET", "t", "BOOL", 1, "BLOB", b"\x05"], "ERR " + E_BOOL),
    (["AI.TENSORSET", "t", "STRING", 1, "BLOB", b"abc"], "ERR " + E_STR_COUNT),
    (["AI.TENSORSET", "t", "FLOAT", 2, "VALUES", 1], "ERR " + E_NVALUES),
    (["AI.TENSORSET", "t", "FLOAT", 1, "VALUES", "x"], "ERR " + E_VALUE),
    (["AI.TENSORSET", "t", "STRING", 1, "VALUES", b"a\x00b"], "ERR " + E_NUL),
    (["AI.TENSORSET", "t", "STRING", 1, "VALUES", b"\xff"], "ERR " + E_UTF8),
    (["AI.TENSORGET", "nokey"], "ERR " + E_EMPTY_KEY),
    (["AI.TENSORGET", "tensor", "FOO"], "ERR " + E_FORMAT),
    (["AI.TENSORGET", "tensor", "BLOB", "VALUES"], "ERR " + E_BOTH),
    (["AI.TENSORGET", "str"], WRONGTYPE),
    (["AI.TENSORSET", "str", "FLOAT", 1], WRONGTYPE),
], ids=lambda x: x if isinstance(x, str) else "-".join(str(a)[:12] for a in x))
def test_error_wire_text(shared_server, con, cmd, wire):
    con.execute_command("AI.TENSORSET", "tensor", "FLOAT", 1)
    con.set("str", "v")
    check_error_raw(shared_server, wire, *cmd)


def test_tensorset_reply_is_simple_ok(shared_server):
    assert raw_command(shared_server.port, "AI.TENSORSET", "t", "FLOAT", 1) == "OK"


# ---------------------------------------------------------------------------------------------
# keyspace behaviour


def test_type_is_ai_tensor(con):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2)
    assert con.type("t") == b"AI_TENSOR"
    con.execute_command("AI.TENSORSET", "s", "STRING", "VALUES", "x")
    assert con.type("s") == b"AI_TENSOR"


def test_memory_usage(con):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 1000, "BLOB", np.zeros(1000, np.float32).tobytes())
    usage = con.execute_command("MEMORY", "USAGE", "t")
    assert isinstance(usage, int)
    assert 4000 < usage < 3 * 4000, usage
    con.execute_command("AI.TENSORSET", "big", "FLOAT", 100000)
    big = con.execute_command("MEMORY", "USAGE", "big")
    assert 400000 < big < 3 * 400000, big


def test_overwrite(con):
    con.execute_command("AI.TENSORSET", "t", "INT8", 2, "VALUES", 1, 2)
    assert con.execute_command("AI.TENSORSET", "t", "FLOAT", 3, 1, "VALUES", 4, 5, 6) == b"OK"
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == meta("FLOAT", (3, 1)) + [
        b"values", [b"4", b"5", b"6"]]
    con.execute_command("AI.TENSORSET", "t", "STRING", 1, "VALUES", "s")
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == meta("STRING", (1,)) + [b"values", [b"s"]]
    con.execute_command("AI.TENSORSET", "t", "BOOL", 2)
    assert con.execute_command("AI.TENSORGET", "t", "META", "VALUES") == meta("BOOL", (2,)) + [b"values", [0, 0]]
    assert con.dbsize() == 1


def test_del_and_exists(con):
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2)
    assert con.exists("t") == 1
    assert con.delete("t") == 1
    assert con.exists("t") == 0
    check_error(con, E_EMPTY_KEY, "AI.TENSORGET", "t")
    con.execute_command("AI.TENSORSET", "t", "FLOAT", 2)
    assert con.unlink("t") == 1
    assert con.exists("t") == 0


def test_expire_and_rename(con):
    con.execute_command("AI.TENSORSET", "t", "INT32", 2, "VALUES", 1, 2)
    assert con.rename("t", "u")
    assert con.execute_command("AI.TENSORGET", "u", "VALUES") == [1, 2]
    assert con.pexpire("u", 50)
    time.sleep(0.2)
    assert con.exists("u") == 0


def test_binary_key_names(con):
    key = b"k\x00\xff{x}\r\n"
    con.execute_command("AI.TENSORSET", key, "UINT8", 2, "VALUES", 1, 2)
    assert con.execute_command("AI.TENSORGET", key, "VALUES") == [1, 2]
    assert con.type(key) == b"AI_TENSOR"


def test_many_keys_and_flush(con):
    for i in range(200):
        con.execute_command("AI.TENSORSET", f"t{i}", "INT16", 2, "VALUES", i, -i)
    assert con.dbsize() == 200
    assert con.execute_command("AI.TENSORGET", "t199", "VALUES") == [199, -199]
    con.flushall()
    assert con.dbsize() == 0
