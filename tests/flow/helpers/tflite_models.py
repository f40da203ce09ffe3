"""The committed TFLITE models of tests/data (tests/data/gen_tflite.py) and how the tests store them, and a
hand-built WHILE model (a flatbuffer encoder: no flatbuffers package in the test environment)."""

import struct

import numpy as np

from .data import DATA_DIR


LITERT_VERSION = "2.3.0"


def tfl_blob(name):
    """The bytes of tests/data/tflite_<name>.tflite."""
    return (DATA_DIR / f"tflite_{name}.tflite").read_bytes()


def tfl_store(con, key, name, *opts, device="CPU"):
    """AI.MODELSTORE <key> TFLITE <device> <opts...> BLOB <tests/data/tflite_name.tflite>; asserts OK."""
    reply = con.execute_command("AI.MODELSTORE", key, "TFLITE", device, *opts, "BLOB", tfl_blob(name))
    assert reply == b"OK", reply


def ab(rows, seed=0):
    """Inputs a, b (FLOAT [rows, 2]) of tflite_sub_mul."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 2)).astype(np.float32), rng.standard_normal((rows, 2)).astype(np.float32))


def _fb_table(fields, out):
    """Appends a table: `fields` are (field id, kind, value), kind one of u8 i8 i32 u32 str bytes ints table tables.
    Laid out front to back (every offset points forward), everything 4-byte aligned, as the verifier requires."""
    slots = max((f[0] for f in fields), default=-1) + 1
    slots += slots % 2  # an even vtable keeps the table after it aligned
    vtable = len(out)
    out += bytes(4 + 2 * slots)
    pos = len(out)
    out += struct.pack("<i", pos - vtable)
    pending = []
    for fid, kind, value in fields:
        at = len(out)
        struct.pack_into("<H", out, vtable + 4 + 2 * fid, at - pos)
        if kind in ("u8", "i8"):
            out += struct.pack("<B" if kind == "u8" else "<b", value) + bytes(3)
        elif kind in ("i32", "u32"):
            out += struct.pack("<i" if kind == "i32" else "<I", value)
        else:
            out += bytes(4)
            pending.append((at, kind, value))
    struct.pack_into("<HH", out, vtable, 4 + 2 * slots, len(out) - pos)
    for at, kind, value in pending:
        if kind == "table":
            target = _fb_table(value, out)
        else:
            if kind == "bytes":  # Buffer.data is force_align 16
                out += bytes(-(len(out) + 4) % 16)
            target = len(out)
            if kind == "str":
                out += struct.pack("<I", len(value)) + value.encode() + b"\0"
            elif kind == "bytes":
                out += struct.pack("<I", len(value)) + value
            elif kind == "ints":
                out += struct.pack(f"<I{len(value)}i", len(value), *value)
            else:  # tables
                out += struct.pack("<I", len(value))
                slots_at = len(out)
                out += bytes(4 * len(value))
                for i, t in enumerate(value):
                    struct.pack_into("<I", out, slots_at + 4 * i, _fb_table(t, out) - (slots_at + 4 * i))
            out += bytes(-len(out) % 4)
        struct.pack_into("<I", out, at, target - at)
    return pos


def _flatbuffer(root, identifier=b"TFL3"):
    out = bytearray(8)
    out[4:8] = identifier
    struct.pack_into("<I", out, 0, _fb_table(root, out))
    return bytes(out)


INT32, BOOL = 2, 6  # TensorType
WHILE, LESS, ADD = 119, 58, 0  # BuiltinOperator
WHILE_OPTIONS, IF_OPTIONS = 93, 92  # BuiltinOptions union type
IF = 118


def _tensor(name, ttype, buffer=0):
    return [(0, "ints", [1]), (1, "i8", ttype), (2, "u32", buffer), (3, "str", name)]


def _subgraph(name, tensors, inputs, outputs, ops):
    return [(0, "tables", tensors), (1, "ints", inputs), (2, "ints", outputs), (3, "tables", ops), (4, "str", name)]


def while_model(body=2):
    """x: INT32 [1] -> y: while (i < 10) i += 1, from i = x (subgraphs: 0 main, 1 cond, 2 body). `body=0` makes the
    loop's body the main subgraph itself: LiteRT recursed into it until the stack overflowed."""
    while_op = [(0, "u32", 0), (1, "ints", [0]), (2, "ints", [1]), (3, "u8", WHILE_OPTIONS),
                (4, "table", [(0, "i32", 1), (1, "i32", body)])]
    main = _subgraph("main", [_tensor("x", INT32), _tensor("y", INT32)], [0], [1], [while_op])
    cond = _subgraph("cond", [_tensor("i", INT32), _tensor("limit", INT32, 1), _tensor("c", BOOL)], [0], [2],
                     [[(0, "u32", 1), (1, "ints", [0, 1]), (2, "ints", [2])]])
    step = _subgraph("body", [_tensor("i", INT32), _tensor("one", INT32, 2), _tensor("o", INT32)], [0], [2],
                     [[(0, "u32", 2), (1, "ints", [0, 1]), (2, "ints", [2])]])
    codes = [[(0, "i8", code), (2, "i32", 1), (3, "i32", code)] for code in (WHILE, LESS, ADD)]
    buffers = [[], [(0, "bytes", struct.pack("<i", 10))], [(0, "bytes", struct.pack("<i", 1))]]
    return _flatbuffer([(0, "u32", 3), (1, "tables", codes), (2, "tables", [main, cond, step]),
                        (3, "str", "redisai-rs while"), (4, "tables", buffers)])


def fanout_model(levels, fan=2):
    """x: INT32 [1] -> y = x * 2 * fan^levels: subgraph i (i < levels) runs subgraph i + 1 from `fan` IFs (both
    branches the same, the condition a constant true) and adds their results; subgraph `levels` is y = x + x. A
    few KB running fan^levels subgraphs a pass: each level is `fan` IFs and `fan - 1` ADDs and the leaf one ADD
    (with fan 2, the IFs of subgraph 0 run 4 * 2^levels - 6 ops of other subgraphs: 65,530 at 14 levels)."""
    subgraphs = []
    for i in range(levels):
        tensors = [_tensor("x", INT32), _tensor("c", BOOL, 1)] + [_tensor(f"r{k}", INT32) for k in range(fan)]
        tensors += [_tensor(f"s{k}", INT32) for k in range(1, fan)]
        if_op = lambda out: [(0, "u32", 0), (1, "ints", [1, 0]), (2, "ints", [out]), (3, "u8", IF_OPTIONS),  # noqa
                             (4, "table", [(0, "i32", i + 1), (1, "i32", i + 1)])]
        ops = [if_op(2 + k) for k in range(fan)]
        acc = 2
        for k in range(1, fan):  # r0 + r1 -> s1, s1 + r2 -> s2, ...
            ops.append([(0, "u32", 1), (1, "ints", [acc, 2 + k]), (2, "ints", [1 + fan + k])])
            acc = 1 + fan + k
        subgraphs.append(_subgraph(f"s{i}", tensors, [0], [acc], ops))
    subgraphs.append(_subgraph("leaf", [_tensor("x", INT32), _tensor("y", INT32)], [0], [1],
                               [[(0, "u32", 1), (1, "ints", [0, 0]), (2, "ints", [1])]]))
    codes = [[(0, "i8", min(code, 127)), (2, "i32", 1), (3, "i32", code)] for code in (IF, ADD)]
    buffers = [[], [(0, "bytes", b"\x01")]]
    return _flatbuffer([(0, "u32", 3), (1, "tables", codes), (2, "tables", subgraphs),
                        (3, "str", "redisai-rs fan-out"), (4, "tables", buffers)])
