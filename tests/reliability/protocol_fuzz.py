#!/usr/bin/env python3
"""Protocol fuzz: malformed and random AI.* commands, pipelined, every reply checked on the wire.

The parsers have property tests (src/commands/fuzz.rs); this drives the whole path instead — Redis, the
handlers, blocking, the queues and all three backends — with commands built from valid ones by dropping,
duplicating, swapping and replacing words (wrong counts, huge and negative numbers, random byte blobs, every
dtype, odd devices, nested `|>`). What must hold whatever is sent:

  * every command gets exactly one reply, in order, and it is well-formed RESP2 (checked by a strict reader:
    integer syntax, bulk terminators, no CR/LF inside a status or error line, no empty error, no RESP3 types);
    an ECHO marker after each pipelined batch proves the replies stayed in step;
  * no reply says "internal error" (a caught panic) and the log shows no crash or panic;
  * afterwards the server answers PING and AI.INFO, a model of each backend and a script stored at the start
    still compute right, and tensors (one of 128 KiB, adopted from its BLOB) and a string written at the start
    keep their bytes.

Between the random commands come crafted cases (crafted.py, `--crafted`, a share of the draws): models of every
backend with call cycles, deep nesting, call fan-out and sizes taken from inputs, and scripts whose
redis.execute changes their own keys, each a short sequence of commands with what each reply must be (a
cycle refused, a legitimate model computing right, ...). A case's commands go in order on one connection, the
random traffic of the others beside them.

The generator avoids what may legitimately take forever or a lot of memory: tensors that could be allocated
stay small (so that broadcasting chains stay small too), models with MINBATCHSIZE (which wait forever for a
batch) go to keys nothing executes, no script loops, and no command outside AI.* except through a script's
redis.execute from a short harmless list. It never sends FLUSHALL, SHUTDOWN, DEBUG or CONFIG SET. (The crafted
cases below ask for more on purpose, with sizes either small or past any memory bound, and loops short unless
--slow.)

  protocol_fuzz.py [--port P] [--commands N] [--seed S] [--connections C] [--batch B] [--crafted SHARE]
                   [--crafted-exclude KIND,...] [--slow]

Without --port it starts its own redis-server with the module (tests/flow/helpers/server.py, the same environment
variables as the flow tests: REDISAI_MODULE, REDIS_SERVER, REDISAI_ONNX_LIB, REDISAI_TF_LIB,
REDISAI_TFLITE_LIB). With --port, use a scratch server: mutated commands write keys with arbitrary names;
afterwards the keys named `*fz*` are removed and AI.CONFIG is put back, the others stay.
"""

import argparse
import collections
import math
import random
import re
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (AttachedServer, HarnessError, ProtocolViolation, StrictReader, env_summary,  # noqa: E402
                     errors_in, fail_exit, health_problems, kind_of, raw_command, start_server)
from helpers import server as flow_server  # noqa: E402
from helpers.data import DATA_DIR, weights  # noqa: E402
from helpers.onnx_models import blob as onnx_blob  # noqa: E402
from helpers.resp import encode_command  # noqa: E402
from helpers.torch_models import entry, pt_blob  # noqa: E402
from crafted import Crafted  # noqa: E402

import numpy as np  # noqa: E402

REPLY_TIMEOUT = 60.0  # seconds without the next reply: a lost or hung reply
MAX_BLOB = 1 << 20
# A tensor the generator may get allocated: at most this rank and dimension, so that whatever chain of
# broadcasting ops a DAG builds from such tensors stays at most MAX_DIM ** MAX_RANK elements.
MAX_RANK, MAX_DIM = 3, 64
TENSOR_LIMIT_BYTES = 1 << 32  # the module refuses larger tensors (docs/commands.md)

# Never generated, whatever the mutations do (checked on every command before it is sent).
DENY = {b"FLUSHALL", b"FLUSHDB", b"SHUTDOWN", b"DEBUG", b"CONFIG", b"SAVE", b"BGSAVE", b"BGREWRITEAOF",
        b"MODULE", b"REPLICAOF", b"SLAVEOF", b"CLIENT", b"MONITOR", b"FAILOVER", b"SCRIPT", b"FUNCTION",
        b"EVAL", b"MIGRATE", b"SYNC", b"PSYNC", b"WAIT", b"BLPOP", b"BRPOP", b"XREAD", b"SUBSCRIBE", b"QUIT"}

# --------------------------------------------------------------------------------------------------
# what is stored before fuzzing

# key: (backend, file, number of inputs, number of outputs, TF input names, TF output names, device)
MODELS = {
    "fz:m:mul": ("ONNX", "mul", 2, 1, None, None, "CPU"),
    "fz:m:lin": ("ONNX", "linear", 1, 1, None, None, "CPU:1"),
    "fz:m:two": ("ONNX", "two_outputs", 1, 2, None, None, "cpu:2"),
    "fz:m:str": ("ONNX", "str_identity", 1, 1, None, None, "CPU"),
    "fz:m:i32": ("ONNX", "add_int32", 2, 1, None, None, "CPU:1"),
    "fz:m:tfmul": ("TF", "tf_mul", 2, 1, ["a", "b"], ["c"], "CPU"),
    "fz:m:tfdense": ("TF", "tf_dense", 1, 1, ["x"], ["y"], "CPU:2"),
    "fz:m:tfstr": ("TF", "tf_str_identity", 1, 1, ["s"], ["t"], "CPU:1"),
    "fz:m:ptadd": ("TORCH", "torch_add", 2, 1, None, None, "CPU"),
    "fz:m:ptlin": ("TORCH", "torch_linear", 1, 1, None, None, "cpu:1"),
    "fz:m:pttwo": ("TORCH", "torch_two_outputs", 1, 2, None, None, "CPU:2"),
    "fz:m:ptint": ("TORCH", "torch_int", 2, 1, None, None, "CPU"),
    "fz:m:tflsub": ("TFLITE", "tflite_sub_mul", 2, 2, None, None, "CPU:1"),
    "fz:m:tflint": ("TFLITE", "tflite_int", 1, 1, None, None, "CPU"),
}
OPTIONAL_BACKENDS = {"TFLITE"}  # stored only where the server has the library
MODEL_SCRATCH = [f"fz:m{i}" for i in range(6)]
# MODELSTOREs with MINBATCHSIZE land here: nothing executes these keys (a run would wait for its batch forever).
MODEL_NOEXEC = [f"fz:nx{i}" for i in range(3)]

SCRIPT_SRC = (
    entry("add", "return tensors[0] + tensors[1]")
    + entry("scale", "return tensors[0] * float(args[0])")
    + entry("pair", "return tensors[0] + 1, tensors[0] * 2")
    + entry("count", "return torch.tensor([len(tensors), len(keys), len(args)])")
    + entry("swap", "return [tensors[1], tensors[0]]")
    + entry("fail", "return tensors[0] + tensors[7]")
    + entry("noret", "return 1")
    + entry("setkey", 'redis.execute("SET", ["fz:sx:" + keys[0], args[0]])', "return tensors[0]")
    + entry("call", "r = redis.execute(args[0], args[1:])", "return torch.tensor([len(str(r))])")
    + entry("model", "return redisAI.model_execute(keys[0], tensors, int(args[0]))")
)
SCRIPT_FUNCS = ["add", "scale", "pair", "count", "swap", "fail", "noret", "setkey", "call", "model"]
OLD_SCRIPT_SRC = ("def bar(a, b):\n    return a + b\n\n"
                  "def var(a, rest: List[Tensor]):\n    return a + rest[0]\n\n"
                  "def one(a):\n    return a * 2\n")
OLD_FUNCS = ["bar", "var", "one"]
BAD_SOURCES = [
    "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] +\n",
    "def f(a, b, c):\n    return a\n",
    "def f(tensors: List[Tensor], keys: List[str]):\n    return tensors[0]\n",
    "import os\n",
    "",
    "\x00\xff",
]
SCRIPTS = {"fz:s:ep": "CPU:1", "fz:s:cpu": "CPU"}
OLD_SCRIPTS = {"fz:s:old": "cpu:2"}
SCRIPT_SCRATCH = [f"fz:s{i}" for i in range(4)]
# Commands a script may run through redis.execute (the "call" entry point): harmless, some refused there.
CALLABLE = ["GET", "SET", "STRLEN", "DEL", "EXISTS", "TYPE", "PING", "INCR", "AI.TENSORGET", "AI.TENSORSET",
            "AI.MODELEXECUTE", "AI.SCRIPTEXECUTE", "AI.DAGEXECUTE", "AI.MODELGET", "AI.INFO", "AI.MODELDEL",
            "AI._MODELSCAN", "NOSUCHCOMMAND"]

TENSORS = {  # key: (dtype, shape, values)
    "fz:t:a": ("FLOAT", [2, 2], [1, 2, 3, 4]),
    "fz:t:b": ("FLOAT", [2, 2], [5, 6, 7, 8]),
    "fz:t:x": ("FLOAT", [2, 4], [1, -0.5, 0, 0.5, -1, 1, 0.5, -0.5]),
    "fz:t:i": ("INT32", [2, 2], [1, -2, 3, 4]),
    "fz:t:l": ("INT64", [2, 2], [1, 2, 3, 4]),
    "fz:t:d": ("DOUBLE", [2, 2], [0.5, 1.5, 2.5, 3.5]),
    "fz:t:s": ("STRING", [2], ["alpha", "beta"]),
    "fz:t:u8": ("UINT8", [4], [0, 1, 254, 255]),
    "fz:t:bool": ("BOOL", [3], [0, 1, 1]),
    "fz:t:scalar": ("FLOAT", [], [3]),
    "fz:t:col": ("FLOAT", [4, 1], [1, 2, 3, 4]),
    "fz:t:i3": ("INT32", [2, 3], [1, 2, 3, -4, -5, -6]),
    "fz:t:iv": ("INT32", [3], [7, -8, 9]),
}
TENSOR_SCRATCH = [f"fz:t{i}" for i in range(16)]
DAG_NAMES = ["fz:n0", "fz:n1", "fz:n2"]  # names local to a DAG (keys once PERSISTed)
OTHER_KEYS = ["fz:str", "fz:list", "fz:missing", "{fz}routed"]
# inputs each model computes with (the tensors above)
GOOD_INPUTS = {
    "fz:m:mul": [["fz:t:a", "fz:t:b"], ["fz:t:x", "fz:t:x"], ["fz:t:col", "fz:t:col"]],
    "fz:m:lin": [["fz:t:x"]], "fz:m:two": [["fz:t:a"], ["fz:t:x"]], "fz:m:str": [["fz:t:s"]],
    "fz:m:i32": [["fz:t:iv", "fz:t:iv"]], "fz:m:tfmul": [["fz:t:a", "fz:t:b"], ["fz:t:col", "fz:t:col"]],
    "fz:m:tfdense": [["fz:t:x"]], "fz:m:tfstr": [["fz:t:s"]], "fz:m:ptadd": [["fz:t:a", "fz:t:b"]],
    "fz:m:ptlin": [["fz:t:x"]], "fz:m:pttwo": [["fz:t:a"], ["fz:t:x"]], "fz:m:ptint": [["fz:t:i", "fz:t:i"]],
    "fz:m:tflsub": [["fz:t:a", "fz:t:b"]], "fz:m:tflint": [["fz:t:i3"]],
}
FINAL_MODEL, FINAL_IN, FINAL_OUT = "fz:final:lin", "fz:final:x", "fz:final:y"  # never in the vocabulary
# more that nothing touches, checked at the end: a model of each other backend and a script, run on A and B;
# a tensor of 128 KiB (its BLOB adopted), a small one and a string, which must keep their bytes
FINAL_A, FINAL_B = "fz:final:a", "fz:final:b"
FINAL_AB = (np.array([[1, 2], [3, 4]], dtype=np.float32), np.array([[5, 6], [7, 8]], dtype=np.float32))
FINAL_RUNS = {  # key: (backend or SCRIPT, file, TF names, expected outputs from (a, b))
    "fz:final:tf": ("TF", "tf_mul", (["a", "b"], ["c"]), lambda a, b: [a * b]),
    "fz:final:pt": ("TORCH", "torch_add", None, lambda a, b: [a + b]),
    "fz:final:tfl": ("TFLITE", "tflite_sub_mul", None, lambda a, b: [a - b, a * b]),
    "fz:final:s": ("SCRIPT", "add", None, lambda a, b: [a + b]),
}
FINAL_BIG = "fz:final:big"
FINAL_BIG_DATA = np.random.default_rng(20240611).random(32768, dtype=np.float32)
FINAL_STR, FINAL_STR_DATA = "fz:final:str", b"sentinel \x00\xff written first"

# --------------------------------------------------------------------------------------------------
# vocabulary

DTYPES = ["FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "BOOL", "STRING"]
BAD_DTYPES = ["float", "Int32", "FLOAT32", "UINT32", "UINT64", "BFLOAT16", "HALF", "COMPLEX64", "", "INT"]
DEVICES = ["CPU", "cpu", "CPU:0", "CPU:1", "cpu:2", "GPU", "GPU:0", "gpu:99"]
BAD_DEVICES = ["", "CPU:", "CPU:-1", "CPU:1.5", "TPU", "CPU::1", "cpu:abc", "CPUCPUCPUCPU", "CPU:123456",
               "GPU:0 ", "INPUTS", "BLOB", "\xe9"]
BACKENDS = ["ONNX", "TF", "TORCH", "TFLITE", "onnx", "torch", "PYTORCH", "XGBOOST", ""]
NUMBERS = ["0", "1", "2", "3", "4", "-1", "-2", "7", "16", "64", "65", "100", "1000", "2147483647", "2147483648",
           "4294967295", "4294967296", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
           "-9223372036854775809", "18446744073709551616", "99999999999999999999999", "1e3", "0x10", "1.5", "-0",
           "+1", "01", " 1", "1 ", "nan", "inf", "-inf", "1e400", ""]
KEYWORDS = ["INPUTS", "OUTPUTS", "TIMEOUT", "BLOB", "VALUES", "META", "TAG", "BATCHSIZE", "MINBATCHSIZE",
            "MINBATCHTIMEOUT", "ENTRY_POINTS", "SOURCE", "KEYS", "ARGS", "LOAD", "PERSIST", "ROUTING", "|>", "$",
            "RESETSTAT", "BACKENDSPATH", "LOADBACKEND", "MODEL_CHUNK_SIZE", "GET", "inputs", "blob", "|", ">",
            "|>|>"]
COMMANDS = ["AI.TENSORSET", "AI.TENSORGET", "AI.MODELSTORE", "AI.MODELSET", "AI.MODELGET", "AI.MODELDEL",
            "AI.MODELEXECUTE", "AI.MODELRUN", "AI.SCRIPTSTORE", "AI.SCRIPTSET", "AI.SCRIPTGET", "AI.SCRIPTDEL",
            "AI.SCRIPTEXECUTE", "AI.SCRIPTRUN", "AI.DAGEXECUTE", "AI.DAGEXECUTE_RO", "AI.DAGRUN", "AI.DAGRUN_RO",
            "AI.INFO", "AI.CONFIG", "AI._MODELSCAN", "AI._SCRIPTSCAN"]
JUNK = ["", " ", "\x00", "junk", "\xe9\u20ac", b"\xff\xfe\x00", "a\r\nb", "\n", "\r", "x\r\n-ERR fake\r\n",
        "-ERR", "+OK", ":1", "$-1", "*3", "%s%n%s", "{fz}", "fz:*", "AI.", "\t"]
# LOADBACKEND paths: missing files, files that are not backends, the real libraries again
BACKEND_PATHS = ["/nonexistent/libonnxruntime.so", "nonexistent.so", "", "/", "/etc/passwd",
                 "/lib/x86_64-linux-gnu/libm.so.6", "../../../../etc/hostname", "x" * 300]


def model_file(backend, name):
    """The bytes of a committed test model."""
    if backend == "ONNX":
        return onnx_blob(name)
    if backend == "TORCH":
        return pt_blob(name)
    return (DATA_DIR / f"{name}.{'pb' if backend == 'TF' else 'tflite'}").read_bytes()


def real_backend_paths():
    out = [flow_server.MODULE_PATH, str(Path(flow_server.MODULE_PATH).with_name("libredisai_torch.so"))]
    return out + [p for p in (flow_server.ONNX_LIB, flow_server.TF_LIB, flow_server.TFLITE_LIB) if p]


# --------------------------------------------------------------------------------------------------
# the generator


def _lenient_int(word):
    """An integer a parser could possibly read from `word` (Python's parsers accept a superset of Redis's
    string2ll: signs, spaces, leading zeros, 0x, exponents), or None."""
    if isinstance(word, bytes):
        try:
            word = word.decode()
        except UnicodeDecodeError:
            return None
    for parse in (int, lambda w: int(w, 0), float):
        try:
            v = parse(word)
        except ValueError:
            continue
        if v == v and abs(v) != float("inf"):
            return int(v)
    return None


def _upper(word):
    return (word if isinstance(word, bytes) else str(word).encode(errors="surrogateescape")).upper()


def allocation_is_small(argv):
    """False if some AI.TENSORSET in argv (the command itself, a DAG op, or a script's redis.execute) could
    make the module allocate a tensor outside the bounds above. Dimensions run until BLOB/VALUES; since the
    real command may end earlier (a script's ARGS), every prefix of the dimensions must be fine."""
    ups = [_upper(w) for w in argv]
    for i, w in enumerate(ups):
        if w != b"AI.TENSORSET":
            continue
        product, rank, big = 1, 0, False
        for d in argv[i + 3:]:
            u = _upper(d)
            if u in (b"BLOB", b"VALUES", b"|>"):
                break
            v = _lenient_int(d)
            if v is None or v < 0:
                break
            product *= v
            rank += 1
            big = big or v > MAX_DIM
            if product == 0 or product > TENSOR_LIMIT_BYTES:
                break  # refused from here on, whatever follows
            if rank > MAX_RANK or big:
                return False
    return True


class Generator:
    def __init__(self, rng, crafted=None, crafted_share=0.0):
        self.rng = rng
        self.crafted, self.crafted_share = crafted, crafted_share
        self.pending = collections.deque()  # the commands of the crafted case under way: (argv, case, step)
        self.last_case = None
        self.tensor_keys = list(TENSORS) + TENSOR_SCRATCH
        self.model_keys = list(MODELS) + MODEL_SCRATCH
        self.script_keys = list(SCRIPTS) + list(OLD_SCRIPTS) + SCRIPT_SCRATCH
        self.all_keys = self.tensor_keys + self.model_keys + self.script_keys + OTHER_KEYS
        self.blobs = self._model_blobs()
        self.backend_paths = BACKEND_PATHS + real_backend_paths()

    @staticmethod
    def _model_blobs():
        """key -> (backend, blob, TF inputs, TF outputs, device) of every committed model the fuzz stores."""
        return {key: (backend, model_file(backend, name), ins, outs, dev)
                for key, (backend, name, _, _, ins, outs, dev) in MODELS.items()}

    # ---- words

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def rand_bytes(self):
        r = self.rng.random()
        n = self.rng.randint(0, 16) if r < 0.8 else self.rng.randint(0, 4096) if r < 0.98 else \
            self.rng.randint(0, MAX_BLOB)
        return self.rng.randbytes(n)

    def junk_word(self):
        r = self.rng.random()
        if r < 0.25:
            return self.pick(NUMBERS)
        if r < 0.45:
            return self.pick(KEYWORDS)
        if r < 0.55:
            return self.pick(JUNK)
        if r < 0.65:
            return self.pick(self.all_keys)
        if r < 0.72:
            return self.pick(DTYPES + BAD_DTYPES)
        if r < 0.79:
            return self.pick(DEVICES + BAD_DEVICES)
        if r < 0.84:
            return self.pick(COMMANDS)
        if r < 0.87:
            return self.pick(BACKENDS)
        return self.rand_bytes()

    def number(self, lo=0, hi=4):
        return str(self.rng.randint(lo, hi)) if self.rng.random() < 0.9 else self.pick(NUMBERS)

    def device(self):
        return self.pick(DEVICES) if self.rng.random() < 0.85 else self.pick(BAD_DEVICES)

    def tkey(self):
        return self.pick(self.tensor_keys) if self.rng.random() < 0.9 else self.pick(self.all_keys)

    def mkey(self):
        r = self.rng.random()
        return self.pick(list(MODELS)) if r < 0.8 else self.pick(MODEL_SCRATCH) if r < 0.95 else \
            self.pick(self.all_keys)

    def skey(self):
        return self.pick(self.script_keys) if self.rng.random() < 0.9 else self.pick(self.all_keys)

    def out_key(self):
        return self.pick(TENSOR_SCRATCH)

    def timeout(self):
        return ["TIMEOUT", self.pick(["1", "5", "100", "1000", "0", "-1", "x", "99999999999"])]

    def counted(self, word, items):
        """`WORD n items...`, with n sometimes wrong."""
        n = len(items)
        if self.rng.random() < 0.04:
            n = self.pick([n + 1, max(0, n - 1), 0, -1, "x", 2 ** 63, n + 100])
        return [word, str(n), *items]

    # ---- valid-ish commands

    def shape(self):
        """A shape within MAX_RANK/MAX_DIM and of at most 4096 elements (its data stays under MAX_BLOB)."""
        while True:
            dims = [self.pick([1, 1, 2, 2, 3, 4, 8, 16, 64]) for _ in range(self.pick([0, 1, 1, 2, 2, 2, 3]))]
            if math.prod(dims) <= 4096:
                return dims

    def tensor_args(self, dtype=None):
        """`<type> <dims> [BLOB <data> | VALUES ...]` of a small tensor (data mostly of the right size)."""
        dtype = dtype or (self.pick(DTYPES) if self.rng.random() < 0.9 else self.pick(BAD_DTYPES))
        shape = self.shape()
        n = math.prod(shape)
        words = [dtype, *map(str, shape)]
        r = self.rng.random()
        if r < 0.15:
            return words
        if r < 0.55 and n <= 1024:
            return words + ["VALUES", *self.values(dtype, n + (self.rng.random() < 0.1))]
        return words + ["BLOB", self.blob_for(dtype, n)]

    def values(self, dtype, n):
        """n values for VALUES: valid for the type, or (sometimes) each drawn from edge cases and junk."""
        u = dtype.upper()
        if u in ("FLOAT", "DOUBLE"):
            good, odd = ["0", "1", "-1.5", "2.5", "0.25"], ["1e30", "-1e-30", "3.4e39", "inf", "-inf", "nan",
                                                           "1e400", "x", "", "1,5"]
        elif u == "BOOL":
            good, odd = ["0", "1"], ["2", "-1", "true"]
        elif u == "STRING":
            good, odd = ["alpha", "", "\xe9t\xe9"], ["a\x00b", b"\xff", b"\xc3"]
        else:
            good = ["0", "1", "-1", "7"] if u.startswith("INT") else ["0", "1", "7"]
            odd = ["127", "-128", "255", "256", "65535", "-32769", "2147483648", "9223372036854775807",
                   "-9223372036854775809", "1.5", "x", "", "1e3"]
        pool = good if self.rng.random() < 0.85 else good * 8 + odd
        return self.rng.choices(pool, k=n)

    def blob_for(self, dtype, n):
        u = dtype.upper()
        size = {"FLOAT": 4, "DOUBLE": 8, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "UINT8": 1, "UINT16": 2,
                "BOOL": 1}.get(u, 4)
        r = self.rng.random()
        if r < 0.15:
            return self.rand_bytes()
        if u == "STRING":
            pool = [b"a", b"", b"word", "\xe9".encode()] + ([b"\xff"] if self.rng.random() < 0.1 else [])
            elems = [self.pick(pool) for _ in range(n)]
            return b"\x00".join(elems) + (b"\x00" if self.rng.random() < 0.95 else b"")
        if u == "BOOL":
            return bytes(self.rng.choices([0, 1, 2], [50, 50, 1], k=n))
        length = n * size + (self.rng.choice([-1, 1]) if r < 0.2 else 0)
        return self.rng.randbytes(max(0, length))

    def tensorset(self, key=None):
        return ["AI.TENSORSET", key or self.pick(TENSOR_SCRATCH), *self.tensor_args()]

    def tensorget(self, key=None):
        fmt = self.rng.sample(["META", "BLOB", "VALUES", "meta", "values"], self.pick([0, 1, 1, 2, 2, 3]))
        return ["AI.TENSORGET", key or self.tkey(), *fmt]

    def model_blob_args(self, key, deprecated=False):
        """`<backend> <device> [TAG..] [BATCHSIZE..] [INPUTS..OUTPUTS..] BLOB <chunks>`: mostly the model the
        key was stored with at the start (so that executions keep working), else any model or junk."""
        own = self.blobs.get(key)
        backend, data, ins, outs, dev = own if own and self.rng.random() < 0.7 else \
            self.pick(list(self.blobs.values()))
        if self.rng.random() < 0.1:
            backend = self.pick(BACKENDS)
        r = self.rng.random()
        if r < 0.1:
            data = self.rand_bytes()
        elif r < 0.15:
            data = data[:self.rng.randint(0, len(data))]
        words = [backend, dev if self.rng.random() < 0.7 else self.device()]
        if self.rng.random() < 0.3:
            words += ["TAG", self.pick(["v1", "", "\xe9", "a b"])]
        if self.rng.random() < 0.2:
            words += ["BATCHSIZE", self.number(0, 8)]
            if self.rng.random() < 0.3:
                words += ["MINBATCHSIZE", self.number(0, 4)]
                if self.rng.random() < 0.5:
                    words += ["MINBATCHTIMEOUT", self.number(0, 50)]
        if ins is not None or self.rng.random() < 0.1:
            ins = ins or ["a"]
            outs = outs or ["c"]
            if deprecated:
                words += ["INPUTS", *ins, "OUTPUTS", *outs]
            else:
                words += self.counted("INPUTS", ins) + self.counted("OUTPUTS", outs)
        cuts = sorted(self.rng.sample(range(len(data) + 1), min(len(data) + 1, self.rng.randint(0, 2))))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        return words + ["BLOB", *chunks]

    def modelstore(self):
        key = self.mkey()
        return ["AI.MODELSTORE", key, *self.model_blob_args(key)]

    def modelset(self):
        key = self.mkey()
        return ["AI.MODELSET", key, *self.model_blob_args(key, deprecated=True)]

    def modelget(self):
        return ["AI.MODELGET", self.mkey(), *self.rng.sample(["META", "BLOB", "junk"], self.rng.randint(0, 2))]

    def modeldel(self):
        return ["AI.MODELDEL", self.pick(MODEL_SCRATCH) if self.rng.random() < 0.8 else self.mkey()]

    def inputs(self, n, avail, good=None):
        """n input names: a combination known to work (top level), else names available in the DAG or keys."""
        if good and avail is None and self.rng.random() < 0.8:
            return list(self.pick(good))
        pool = avail if avail and self.rng.random() < 0.9 else self.tensor_keys
        return [self.pick(pool) for _ in range(n)]

    def model_io(self, key, avail):
        spec = MODELS.get(key)
        if spec and self.rng.random() < 0.9:
            n_in, n_out = spec[2], spec[3]
        else:
            n_in, n_out = self.rng.randint(0, 3), self.rng.randint(0, 3)
        ins = self.inputs(n_in, avail, GOOD_INPUTS.get(key) if spec and n_in == spec[2] else None)
        return ins, [self.out_key(avail) for _ in range(n_out)]

    def out_key(self, avail=None):
        """An output name: in a DAG, a new local name or one already used; else a scratch key."""
        if avail is None:
            return self.pick(TENSOR_SCRATCH)
        name = self.pick(DAG_NAMES) if self.rng.random() < 0.8 else self.pick(TENSOR_SCRATCH[:4])
        avail.append(name)
        return name

    def modelexecute(self, avail=None):
        key = self.mkey()
        ins, outs = self.model_io(key, avail)
        words = ["AI.MODELEXECUTE", key, *self.counted("INPUTS", ins), *self.counted("OUTPUTS", outs)]
        if self.rng.random() < (0.01 if avail is not None else 0.3):
            words += self.timeout()
        return words

    def modelrun(self, avail=None):
        key = self.mkey()
        ins, outs = self.model_io(key, avail)
        words = ["AI.MODELRUN", key]
        if avail is None and self.rng.random() < 0.3:
            words += self.timeout()
        return words + ["INPUTS", *ins, "OUTPUTS", *outs]

    def scriptstore(self):
        r = self.rng.random()
        src = SCRIPT_SRC if r < 0.7 else OLD_SCRIPT_SRC if r < 0.8 else self.pick(BAD_SOURCES)
        eps = self.rng.sample(SCRIPT_FUNCS + ["nosuch"], self.rng.randint(1, 4))
        if src is SCRIPT_SRC and self.rng.random() < 0.5:
            eps = SCRIPT_FUNCS
        key = self.skey()
        dev = SCRIPTS.get(key) or OLD_SCRIPTS.get(key) or "CPU"
        words = ["AI.SCRIPTSTORE", key, dev if self.rng.random() < 0.7 else self.device()]
        if self.rng.random() < 0.3:
            words += ["TAG", "t"]
        return words + self.counted("ENTRY_POINTS", eps) + ["SOURCE", src]

    def scriptset(self):
        src = OLD_SCRIPT_SRC if self.rng.random() < 0.8 else self.pick(BAD_SOURCES + [SCRIPT_SRC])
        tag = ["TAG", "old"] if self.rng.random() < 0.3 else []
        key = self.pick(list(OLD_SCRIPTS) + SCRIPT_SCRATCH) if self.rng.random() < 0.8 else self.skey()
        return ["AI.SCRIPTSET", key, self.device(), *tag, "SOURCE", src]

    def scriptget(self):
        return ["AI.SCRIPTGET", self.skey(), *self.rng.sample(["META", "SOURCE", "x"], self.rng.randint(0, 2))]

    def scriptdel(self):
        return ["AI.SCRIPTDEL", self.pick(SCRIPT_SCRATCH) if self.rng.random() < 0.8 else self.skey()]

    def script_call(self, avail):
        """(fn, KEYS, INPUTS, ARGS, n outputs) of an entry point of SCRIPT_SRC, mostly one that works."""
        fn = self.pick(SCRIPT_FUNCS) if self.rng.random() < 0.9 else self.pick(OLD_FUNCS + ["nosuch", ""])
        pair = self.inputs(2, avail, [["fz:t:a", "fz:t:b"], ["fz:t:x", "fz:t:x"], ["fz:t:d", "fz:t:d"]])
        one = self.inputs(1, avail, [["fz:t:a"], ["fz:t:x"], ["fz:t:i"], ["fz:t:scalar"], ["fz:t:u8"]])
        keys, args, n_out = [], [], 1
        if fn in ("add", "swap", "fail"):
            ins, n_out = pair, 2 if fn == "swap" else 1
        elif fn == "pair":
            ins, n_out = one, 2
        elif fn == "scale":
            ins, args = one, [self.pick(["2", "0.5", "-1", "1e308", "nan", "x", ""])]
        elif fn == "setkey":
            ins, keys, args = one, [self.pick(["k1", "k2", "\xe9", b"\xff"])], [self.pick(["v", "", "1"])]
        elif fn == "model":
            key = self.pick(list(MODELS))
            spec = MODELS[key]
            ins = self.inputs(spec[2], avail, GOOD_INPUTS.get(key))
            keys, args, n_out = [key], [self.pick([str(spec[3]), str(spec[3]), "0", "-1", "x"])], spec[3]
        elif fn == "call":
            ins, keys = [], ["fz:k"]
            cmd = self.pick(CALLABLE)
            rest = {"SET": ["fz:sx", "v"], "GET": ["fz:sx"], "AI.TENSORGET": [self.tkey(), "META"],
                    "AI.TENSORSET": self.tensorset()[1:], "AI.MODELEXECUTE": self.modelexecute()[1:],
                    "AI.SCRIPTEXECUTE": ["fz:s:cpu", "count", "KEYS", "1", "k"],
                    "AI.DAGEXECUTE": ["ROUTING", "k", "|>", "AI.TENSORGET", "fz:t:a"],
                    "AI.INFO": [self.mkey()], "AI.MODELDEL": [self.pick(MODEL_SCRATCH)]}.get(cmd, ["fz:sx"])
            args = [cmd, *rest]
        else:
            ins = [self.pick(avail or self.tensor_keys) for _ in range(self.rng.randint(0, 3))]
            keys = [self.pick(self.all_keys) for _ in range(self.rng.randint(0, 2))]
            args = [self.junk_word() for _ in range(self.rng.randint(0, 2))]
        return fn, keys, ins, args, n_out

    def scriptexecute(self, avail=None):
        key = self.pick(list(SCRIPTS)) if self.rng.random() < 0.7 else self.skey()
        fn, keys, ins, args, n_out = self.script_call(avail)
        scopes = []
        if keys or self.rng.random() < 0.05:
            scopes.append(self.counted("KEYS", keys))
        if ins or self.rng.random() < 0.05:
            scopes.append(self.counted("INPUTS", ins))
        if args or self.rng.random() < 0.05:
            scopes.append(self.counted("ARGS", args))
        if self.rng.random() < 0.95:
            scopes.append(self.counted("OUTPUTS", [self.out_key(avail) for _ in range(n_out)]))
        if self.rng.random() < 0.05:
            self.rng.shuffle(scopes)
        words = ["AI.SCRIPTEXECUTE", key, fn]
        for scope in scopes:
            words += scope
        if self.rng.random() < (0.01 if avail is not None else 0.2):
            words += self.timeout()
        return words

    def scriptrun(self, avail=None):
        fn = self.pick(OLD_FUNCS) if self.rng.random() < 0.9 else self.pick(SCRIPT_FUNCS + ["nosuch"])
        key = self.pick(list(OLD_SCRIPTS)) if self.rng.random() < 0.7 else self.skey()
        words = ["AI.SCRIPTRUN", key, fn]
        if avail is None and self.rng.random() < 0.2:
            words += self.timeout()
        n_in = {"bar": 2, "var": 1, "one": 1}.get(fn, self.rng.randint(0, 3))
        words += ["INPUTS", *self.inputs(n_in, avail, [["fz:t:a", "fz:t:b"]] if n_in == 2 else [["fz:t:x"]])]
        if fn == "var" or self.rng.random() < 0.1:
            words += ["$", *self.inputs(self.rng.randint(1, 2), avail)]
        return words + ["OUTPUTS", *[self.out_key(avail) for _ in range(1 if self.rng.random() < 0.9 else 2)]]

    def dag_op(self, deprecated, ro, avail, depth):
        r = self.rng.random()
        if r < 0.2:
            name = self.pick(DAG_NAMES)
            avail.append(name)
            return self.tensorset(key=name)
        if r < 0.4:
            return self.tensorget(key=self.pick(avail) if avail and self.rng.random() < 0.9 else self.tkey())
        if r < 0.75:
            return self.modelrun(avail) if deprecated else self.modelexecute(avail)
        if r < 0.97:
            if ro and not deprecated and self.rng.random() < 0.9:  # SCRIPTEXECUTE is refused in _RO DAGs
                return self.tensorget(key=self.pick(avail) if avail else self.tkey())
            return self.scriptrun(avail) if deprecated else self.scriptexecute(avail)
        if r < 0.98 and depth < 2:
            return self.dag(depth + 1)
        if r < 0.99:
            return []  # an empty op: `|> |>`
        return self.pick([self.modelstore, self.modeldel, self.modelget, self.scriptget, self.info])()

    def dag(self, depth=0):
        cmd = self.pick(["AI.DAGEXECUTE", "AI.DAGEXECUTE", "AI.DAGEXECUTE", "AI.DAGEXECUTE_RO", "AI.DAGRUN",
                         "AI.DAGRUN_RO"])
        deprecated, ro = cmd.startswith("AI.DAGRUN"), cmd.endswith("_RO")
        words, avail = [cmd], []
        if self.rng.random() < 0.7:
            avail = self.rng.sample(list(TENSORS), self.rng.randint(1, 4))
            words += self.counted("LOAD", avail)
        ops = []
        for _ in range(self.rng.randint(1, 5) if self.rng.random() < 0.98 else 0):
            ops += ["|>", *self.dag_op(deprecated, ro, avail, depth)]
        produced = [n for n in dict.fromkeys(avail) if n in DAG_NAMES or n in TENSOR_SCRATCH]
        if (not ro or self.rng.random() < 0.05) and produced and self.rng.random() < 0.4:
            words += self.counted("PERSIST", self.rng.sample(produced, self.rng.randint(1, len(produced))))
        if not deprecated and (len(words) == 1 or self.rng.random() < 0.2):
            words += ["ROUTING", self.pick(OTHER_KEYS)]
        if self.rng.random() < 0.15:
            words += self.timeout()
        return words + ops

    def info(self):
        words = ["AI.INFO", self.pick(self.all_keys)]
        if self.rng.random() < 0.3:
            words.append(self.pick(["RESETSTAT", "resetstat", "x"]))
        return words

    def config(self):
        r = self.rng.random()
        if r < 0.4:
            return ["AI.CONFIG", "GET", self.pick(["BACKENDSPATH", "MODEL_CHUNK_SIZE", "model_chunk_size", "x", ""])]
        if r < 0.6:
            return ["AI.CONFIG", "MODEL_CHUNK_SIZE", self.pick(["1", "1024", "535822336", "0", "-1", "x", "1e3",
                                                                 "9223372036854775807"])]
        if r < 0.75:
            return ["AI.CONFIG", "BACKENDSPATH", self.pick(["/tmp", "", "relative/dir", "/nonexistent", "\x00"])]
        if r < 0.95:
            return ["AI.CONFIG", "LOADBACKEND", self.pick(BACKENDS), self.pick(self.backend_paths)]
        return ["AI.CONFIG", *[self.junk_word() for _ in range(self.rng.randint(0, 3))]]

    def scan(self):
        return [self.pick(["AI._MODELSCAN", "AI._SCRIPTSCAN"])] + ([self.junk_word()] if self.rng.random() < 0.2 else [])

    def random_arity(self):
        return [self.pick(COMMANDS), *[self.junk_word() for _ in range(self.rng.randint(0, 10))]]

    # ---- mutations

    def mutate(self, argv):
        argv = list(argv)
        for _ in range(self.rng.choice([1, 1, 1, 2, 3])):
            n = len(argv)
            op = self.rng.random()
            i = self.rng.randint(1, n - 1) if n > 1 else None
            if i is None or op < 0.1:
                argv.append(self.junk_word())
            elif op < 0.25:
                del argv[i]
            elif op < 0.35:
                argv.insert(i, argv[i])
            elif op < 0.45:
                j = self.rng.randint(1, n - 1)
                argv[i], argv[j] = argv[j], argv[i]
            elif op < 0.65:
                argv[i] = self.junk_word()
            elif op < 0.75:
                argv.insert(i, self.junk_word())
            elif op < 0.82:
                del argv[self.rng.randint(1, n):]  # truncate
            elif op < 0.92:
                nums = [k for k in range(1, n) if isinstance(argv[k], str) and re.fullmatch(r"-?\d+", argv[k])]
                argv[self.pick(nums) if nums else i] = self.pick(NUMBERS)
            else:
                w = argv[i]
                if isinstance(w, str):
                    argv[i] = w.lower() if self.rng.random() < 0.5 else w.swapcase()
        if self.rng.random() < 0.05:
            argv[0] = argv[0].lower()
        return argv

    # ---- one command

    FAMILIES = [  # (weight, method name)
        (10, "tensorset"), (8, "tensorget"), (5, "modelstore"), (2, "modelset"), (4, "modelget"), (2, "modeldel"),
        (12, "modelexecute"), (4, "modelrun"), (3, "scriptstore"), (2, "scriptset"), (2, "scriptget"),
        (1, "scriptdel"), (8, "scriptexecute"), (3, "scriptrun"), (14, "dag"), (3, "info"), (3, "config"),
        (1, "scan"), (5, "random_arity"),
    ]

    def command(self):
        """The next command; `last_family` names its family, `last_case` is (case, step) for a crafted one."""
        if not self.pending and self.crafted is not None and self.rng.random() < self.crafted_share:
            case = self.crafted.case()
            self.pending.extend((argv, case, i) for i, (argv, _, _) in enumerate(case.steps))
        if self.pending:
            argv, case, i = self.pending.popleft()
            self.last_family, self.last_case = f"crafted:{case.kind}", (case, i)
            return argv
        self.last_case = None
        names = [n for _, n in self.FAMILIES]
        weights_ = [w for w, _ in self.FAMILIES]
        while True:
            family = self.rng.choices(names, weights_)[0]
            argv = getattr(self, family)()
            if family != "random_arity" and self.rng.random() < 0.5:
                argv = self.mutate(argv)
            argv = self.fixup(argv)
            if argv is not None:
                self.last_family = family
                return argv

    def fixup(self, argv):
        """The rules of the module docstring; None to draw another command."""
        ups = [_upper(w) for w in argv]
        if any(u in DENY for u in ups) or not allocation_is_small(argv):
            return None
        if ups[0] in (b"AI.MODELSTORE", b"AI.MODELSET") and b"MINBATCHSIZE" in ups and len(argv) > 1:
            argv[1] = self.pick(MODEL_NOEXEC)
        if sum(len(w) for w in argv if isinstance(w, (bytes, str))) > 4 * MAX_BLOB:
            return None
        return argv


# --------------------------------------------------------------------------------------------------
# running it


def setup(port):
    """Store the models, scripts and tensors of the vocabulary (and the never-touched ones for the end)."""
    def ok(*cmd):
        reply = raw_command(port, *cmd, timeout=120)
        if reply != "OK" and reply != 1:
            raise HarnessError(f"setup: {cmd[:3]} -> {reply!r}")

    for key, (dtype, shape, values) in TENSORS.items():
        ok("AI.TENSORSET", key, dtype, *shape, "VALUES", *values)
    for key, (backend, name, _, _, ins, outs, dev) in MODELS.items():
        io = ["INPUTS", len(ins), *ins, "OUTPUTS", len(outs), *outs] if backend == "TF" else []
        try:
            ok("AI.MODELSTORE", key, backend, dev, *io, "BLOB", model_file(backend, name))
        except HarnessError as e:
            if backend not in OPTIONAL_BACKENDS:
                raise
            print(f"protocol fuzz: no {backend} models ({e})")
    for key, dev in SCRIPTS.items():
        ok("AI.SCRIPTSTORE", key, dev, "ENTRY_POINTS", len(SCRIPT_FUNCS), *SCRIPT_FUNCS, "SOURCE", SCRIPT_SRC)
    for key, dev in OLD_SCRIPTS.items():
        ok("AI.SCRIPTSET", key, dev, "SOURCE", OLD_SCRIPT_SRC)
    ok("SET", "fz:str", "v")
    ok("RPUSH", "fz:list", "v")
    ok("AI.MODELSTORE", FINAL_MODEL, "ONNX", "CPU", "BLOB", onnx_blob("linear"))
    ok("AI.TENSORSET", FINAL_IN, "FLOAT", 2, 4, "VALUES", *TENSORS["fz:t:x"][2])
    for key, arr in zip((FINAL_A, FINAL_B), FINAL_AB):
        ok("AI.TENSORSET", key, "FLOAT", *arr.shape, "BLOB", arr.tobytes())
    for key, (backend, name, io, _) in FINAL_RUNS.items():
        try:
            if backend == "SCRIPT":
                ok("AI.SCRIPTSTORE", key, "CPU", "ENTRY_POINTS", len(SCRIPT_FUNCS), *SCRIPT_FUNCS, "SOURCE", SCRIPT_SRC)
            else:
                words = ["INPUTS", 2, *io[0], "OUTPUTS", 1, *io[1]] if io else []
                ok("AI.MODELSTORE", key, backend, "CPU", *words, "BLOB", model_file(backend, name))
        except HarnessError:
            if backend not in OPTIONAL_BACKENDS:
                raise
    ok("AI.TENSORSET", FINAL_BIG, "FLOAT", FINAL_BIG_DATA.size, "BLOB", FINAL_BIG_DATA.tobytes())
    ok("SET", FINAL_STR, FINAL_STR_DATA)


def final_checks(port):
    """After the fuzz: AI.INFO answers, the models and the script stored first still compute the right thing,
    the sentinel tensors and string keep their bytes."""
    problems = []
    info = raw_command(port, "AI.INFO", FINAL_MODEL, timeout=30)
    # RedisAI's 18 elements, then this module's pairs (docs/commands.md, "Observability").
    if not isinstance(info, list) or len(info) < 18 or info[:18:2] != [b"key", b"type", b"backend", b"device", b"tag",
                                                                         b"duration", b"samples", b"calls", b"errors"]:
        problems.append(f"AI.INFO {FINAL_MODEL}: {info!r}")
    reply = raw_command(port, "AI.MODELEXECUTE", FINAL_MODEL, "INPUTS", 1, FINAL_IN, "OUTPUTS", 1, FINAL_OUT,
                        timeout=30)
    if reply != "OK":
        return problems + [f"AI.MODELEXECUTE {FINAL_MODEL}: {reply!r}"]
    got = raw_command(port, "AI.TENSORGET", FINAL_OUT, "META", "BLOB", timeout=30)
    x = np.array(TENSORS["fz:t:x"][2], dtype=np.float32).reshape(2, 4)
    try:
        y = np.frombuffer(got[5], dtype=np.float32).reshape(got[3])
        right = np.allclose(y, weights.linear(x), rtol=1e-5, atol=1e-5)
    except Exception as e:  # noqa: BLE001  (a malformed reply is a finding too)
        right, y = False, f"{got!r} ({e})"
    if not right:
        problems.append(f"{FINAL_MODEL} computed {y}, expected {weights.linear(x)}")
    for key, (backend, name, _, expected) in FINAL_RUNS.items():
        want = expected(*FINAL_AB)
        outs = [f"fz:final:out{i}" for i in range(len(want))]
        if backend == "SCRIPT":
            cmd = ["AI.SCRIPTEXECUTE", key, name, "INPUTS", 2, FINAL_A, FINAL_B, "OUTPUTS", len(outs), *outs]
        elif raw_command(port, "EXISTS", key, timeout=30) == 0 and backend in OPTIONAL_BACKENDS:
            continue
        else:
            cmd = ["AI.MODELEXECUTE", key, "INPUTS", 2, FINAL_A, FINAL_B, "OUTPUTS", len(outs), *outs]
        reply = raw_command(port, *cmd, timeout=30)
        if reply != "OK":
            problems.append(f"{' '.join(map(str, cmd))}: {reply!r}")
            continue
        for out, w in zip(outs, want):
            got = raw_command(port, "AI.TENSORGET", out, "META", "BLOB", timeout=30)
            try:
                y = np.frombuffer(got[5], dtype=np.float32).reshape(got[3])
                right = np.array_equal(y, w)
            except Exception as e:  # noqa: BLE001
                right, y = False, f"{got!r} ({e})"
            if not right:
                problems.append(f"{key} computed {y} into {out}, expected {w}")
    for key, data in ((FINAL_A, FINAL_AB[0].tobytes()), (FINAL_B, FINAL_AB[1].tobytes()),
                      (FINAL_BIG, FINAL_BIG_DATA.tobytes())):
        got = raw_command(port, "AI.TENSORGET", key, "BLOB", timeout=30)
        if got != data:
            problems.append(f"{key}: its {len(data)} bytes changed: {got[:100]!r}...")
    got = raw_command(port, "GET", FINAL_STR, timeout=30)
    if got != FINAL_STR_DATA:
        problems.append(f"{FINAL_STR}: {got!r}, expected {FINAL_STR_DATA!r}")
    return problems


def cleanup(port, config_before):
    """Put AI.CONFIG back and remove what the fuzz stored (for --port on a server that is kept)."""
    raw_command(port, "AI.CONFIG", "MODEL_CHUNK_SIZE", config_before["MODEL_CHUNK_SIZE"])
    raw_command(port, "AI.CONFIG", "BACKENDSPATH", config_before["BACKENDSPATH"])
    cursor = b"0"
    while True:
        cursor, keys = raw_command(port, "SCAN", cursor, "MATCH", "*fz*", "COUNT", 1000)
        if keys:
            raw_command(port, "UNLINK", *keys)
        if cursor == b"0":
            break


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.kinds = collections.Counter()
        self.errors = collections.Counter()
        self.families = collections.Counter()
        self.cases = collections.Counter()  # crafted cases done: (kind, what the store / run replied)
        self.sent = 0
        self.problems = {}  # what went wrong -> [count, the first command it happened to]

    def problem(self, what, example=""):
        with self.lock:
            entry = self.problems.setdefault(what, [0, example])
            entry[0] += 1

    def problem_lines(self):
        return [f"{n} x {what}" + (f"; first for: {example}" if example else "")
                for what, (n, example) in self.problems.items()]


def short(argv, limit=400):
    text = " ".join(repr(w)[:80] for w in argv)
    return text if len(text) <= limit else text[:limit] + " ..."


def in_flight(cases):
    """The crafted cases among a batch's commands, for a report."""
    seen = {id(c): c for c in cases if c is not None}
    return "".join(f"\n    crafted case under way: {c.kind}: {c.desc}" for c in seen.values())


def connection_main(port, conn_id, n, seed, batch, stats, stop, crafted):
    """Send n generated commands in pipelined batches on one connection and check every reply."""
    rng = random.Random(f"{seed}:{conn_id}")
    share, backends, slow, exclude = crafted
    gen = Generator(rng, Crafted(rng, f"fz:c{conn_id}:", backends, slow, exclude) if share else None, share)
    kinds, errors, families = collections.Counter(), collections.Counter(), collections.Counter()
    cases = collections.Counter()
    sent = 0
    cmds, steps = [], []
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
        reader = StrictReader(sock)
        seq = 0
        while sent < n and not stop.is_set():
            cmds, fams, steps = [], [], []
            while len(cmds) < min(batch, n - sent):  # (a crafted case cut off at n is checked as far as it went)
                cmds.append(gen.command())
                fams.append(gen.last_family)
                steps.append(gen.last_case)
            marker = f"fz-mark-{conn_id}-{seq}".encode()
            seq += 1
            sock.sendall(b"".join(encode_command(c) for c in cmds) + encode_command(["ECHO", marker]))
            for i, c in enumerate(cmds):
                try:
                    reply = reader.reply()
                except socket.timeout:
                    raise ProtocolViolation(f"no reply within {REPLY_TIMEOUT:.0f} s to: {short(c)}"
                                            f"{in_flight([steps[i] and steps[i][0]])}") from None
                except (ProtocolViolation, ConnectionError, ValueError) as e:
                    raise ProtocolViolation(f"{e} (reading the reply to: {short(c)})"
                                            f"{in_flight([st and st[0] for st in steps[i:]])}") from None
                kinds[kind_of(reply)] += 1
                families[fams[i], kind_of(reply)] += 1
                if steps[i] is not None:
                    case, step = steps[i]
                    problem = case.verify(step, reply)
                    if problem:
                        stats.problem(problem, short(c))
                    if step == len(case.steps) - 1:
                        cases[case.kind, case.outcome()] += 1
                for text in errors_in(reply):
                    errors[re.sub(r"\d+", "N", text[:60])] += 1
                    if "internal error" in text or "panic" in text:
                        stats.problem(f"reply {text!r}", short(c))
            sent += len(cmds)
            got = reader.reply()
            if got != marker:
                raise ProtocolViolation(f"replies out of step: expected the ECHO {marker!r}, got {got!r} "
                                        f"(batch ending with: {short(cmds[-1])})")
        # nothing more may come: the next reply is the PING's and the stream ends there
        sock.sendall(encode_command(["PING"]))
        got = reader.reply()
        if got != "PONG" or reader.buf:
            raise ProtocolViolation(f"after the last command: {got!r}, then {reader.buf[:100]!r}")
        sock.close()
    except Exception as e:  # noqa: BLE001  (report, and let the other connections stop)
        stats.problem(f"connection {conn_id}, after {sent} commands: {type(e).__name__}: {e}")
        stop.set()
    with stats.lock:
        stats.sent += sent
        stats.kinds.update(kinds)
        stats.errors.update(errors)
        stats.families.update(families)
        stats.cases.update(cases)


def run_fuzz(srv, commands, seed, connections=4, batch=32, verbose=False, crafted=0.05, slow=False, exclude=()):
    """Fuzz the server `srv` (a helpers.server RedisServer or AttachedServer). Returns (stats, elapsed, problems).
    `crafted`: the share of draws that start a crafted case (0: none); `slow`: crafted cases may take seconds
    by design; `exclude`: crafted kinds left out."""
    port = srv.port
    log_mark = srv.log_size()
    config_before = {k: raw_command(port, "AI.CONFIG", "GET", k) for k in ("MODEL_CHUNK_SIZE", "BACKENDSPATH")}
    setup(port)
    backends = ("ONNX", "TF", "TORCH") + (("TFLITE",) if raw_command(port, "EXISTS", "fz:m:tflsub") else ())
    unknown = set(exclude) - {k for _, k, _ in Crafted.KINDS}
    if unknown:
        raise HarnessError(f"no crafted kinds {sorted(unknown)} (kinds: {[k for _, k, _ in Crafted.KINDS]})")
    stats, stop = Stats(), threading.Event()
    per = [commands // connections + (i < commands % connections) for i in range(connections)]
    threads = [threading.Thread(target=connection_main, args=(port, i, per[i], seed, batch, stats, stop,
                                                              (crafted, backends, slow, tuple(exclude))))
               for i in range(connections)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    problems = stats.problem_lines()
    problems += health_problems(srv, since=log_mark)
    if srv.responsive():
        try:
            problems += final_checks(port)
            cleanup(port, config_before)
        except (OSError, ConnectionError) as e:  # a queue still held by a hung run, say
            problems.append(f"final checks: {type(e).__name__}: {e}")
    if verbose:
        print("replies by command family:")
        for family in sorted({f for f, _ in stats.families}):
            kinds = {k: n for (f, k), n in sorted(stats.families.items()) if f == family}
            print(f"  {family:14s} {kinds}")
        print("most frequent errors:")
        for text, n in stats.errors.most_common(60):
            print(f"  {n:7d}  {text}")
        print("crafted cases by kind and what the store and the run replied:")
        for (kind, outcome), n in sorted(stats.cases.items()):
            print(f"  {n:7d}  {kind}: {outcome}")
    return stats, elapsed, problems


def summary(stats, elapsed, connections):
    kinds = ", ".join(f"{k}={v}" for k, v in sorted(stats.kinds.items()))
    by_kind = collections.Counter()
    for (kind, _), n in stats.cases.items():
        by_kind[kind] += n
    crafted = ", ".join(f"{k}={v}" for k, v in sorted(by_kind.items()))
    return (f"protocol fuzz: {stats.sent} commands on {connections} connections in {elapsed:.1f} s "
            f"({stats.sent / max(elapsed, 1e-9):.0f} commands/s); replies: {sum(stats.kinds.values())} "
            f"({kinds}); distinct errors (first 60 characters): {len(stats.errors)}; "
            f"crafted cases: {sum(by_kind.values())} ({crafted or 'none'})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, help="fuzz the server on 127.0.0.1:PORT instead of starting one")
    ap.add_argument("--commands", type=int, default=100000, help="number of commands (default 100000)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--connections", type=int, default=4, help="pipelining connections (default 4)")
    ap.add_argument("--batch", type=int, default=32, help="commands per pipelined batch (default 32)")
    ap.add_argument("--crafted", type=float, default=0.05,
                    help="share of draws that start a crafted case (crafted.py; default 0.05, 0: none)")
    ap.add_argument("--crafted-exclude", default="", metavar="KIND,...", help="crafted kinds to leave out")
    ap.add_argument("--slow", action="store_true",
                    help="also crafted cases that take seconds by design (TensorFlow's allocation retries, loops "
                         "stopped by MODEL_EXECUTION_TIMEOUT)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print commands by family, error texts and crafted cases by outcome")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"protocol fuzz: seed {seed}, {args.commands} commands; {env_summary()}")
    srv = None
    try:
        srv = AttachedServer(args.port) if args.port else start_server("protofuzz")
        print(f"server: {srv.describe()}, log {srv.logfile}")
        stats, elapsed, problems = run_fuzz(srv, args.commands, seed, args.connections, args.batch, args.verbose,
                                            args.crafted, args.slow,
                                            [k for k in args.crafted_exclude.split(",") if k])
    except HarnessError as e:
        print(f"protocol fuzz: cannot run: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        if srv is not None and not args.port:
            srv.stop()
    print(summary(stats, elapsed, args.connections))
    fail_exit(problems + ([] if stats.sent == args.commands else [f"only {stats.sent} commands were sent"]),
              f"protocol fuzz (seed {seed})")


if __name__ == "__main__":
    main()
