"""DUMP payloads built byte by byte: the RDB encoding of module values as Redis writes them (RedisModule_SaveUnsigned,
RedisModule_SaveStringBuffer), Redis's CRC-64 trailer, module type ids, and RedisAI's AI_TENSOR and AI__MODEL
layouts. test_persistence_tensor.py checks the tensor encoder, and test_persistence_model.py the model encoder,
against the payloads recorded from RedisAI (tests/data/redisai-dumps.json)."""
import struct

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


TYPE_CHARSET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def module_type_id(name, encver):
    """Redis's 64-bit module type id: the 9-character name in 6-bit symbols, then 10 bits of encoding version."""
    mid = 0
    for ch in name:
        mid = (mid << 6) | TYPE_CHARSET.index(ch)
    return (mid << 10) | encver


# AI_TENSOR with encver 4, as found in the recorded dumps; the low 10 bits of a module type id are the encver
TENSOR_TYPE_ID_V4 = 0x008FD310D48E4404


def dump_payload(fields, encver=4, rdbver=10):
    """An AI_TENSOR DUMP payload of the given fields in encoding `encver`."""
    mid = (TENSOR_TYPE_ID_V4 & ~0x3FF) | encver
    body = b"\x07" + b"\x81" + struct.pack(">Q", mid) + b"".join(fields) + b"\x00" + struct.pack("<H", rdbver)
    return body + struct.pack("<Q", crc64(body))


def model_payload(encver, backend_code, device, data, inputs=(), outputs=()):
    """An AI__MODEL DUMP payload in RedisAI's encoding `encver` (0: one buffer; 1+: chunked)."""
    fields = [u(backend_code), buf(device.encode() + b"\0"), buf(b""), u(0), u(0)]
    if encver >= 2:
        fields.append(u(0))
    for names in (inputs, outputs):
        fields += [u(len(names))] + [buf(n.encode() + b"\0") for n in names]
    fields += [buf(data)] if encver == 0 else [u(len(data)), u(1), buf(data)]
    body = b"\x07\x81" + struct.pack(">Q", module_type_id("AI__MODEL", encver)) + b"".join(fields) + b"\x00"
    body += struct.pack("<H", 10)
    return body + struct.pack("<Q", crc64(body))
