"""Helpers of the TORCH flow tests (test_backend_torch.py, test_cmd_script.py, ...): the TorchScript models of
tests/data (tests/data/gen_torch.cpp), and script sources (the scripts the script tests share), script calls and
their inputs.

Committed models (tests/data/gen_torch.cpp):
  torch_add.pt          forward(a, b) = a + b
  torch_two_outputs.pt  forward(x) = (x + 1, x * 2)
  torch_linear.pt       forward(x) = x @ W + B   (x [batch, 4]; W, B of tests/data/weights.py)
  torch_int.pt          forward(a, b) = a * b + 1
  torch_slow.pt         forward(x): 200 times x = tanh(x @ x.T @ x / 256)
  torch_quantized_linear.pt, torch_quantized_frozen.pt   quantized models (packed params) that must keep working
  torch_sec_*.pt        models the TORCH sandbox refuses or bounds (test_security_torch.py): from_file, save,
                        a forbidden buffer, zeros past the memory bound, an endless loop, __setstate__ with a
                        loop or a save
"""

import numpy as np

from .data import data_blob

TORCH_VERSION = "2.13.0"

# name: (forward() argument names, number of outputs)
TORCH_MODELS = {
    "torch_add": (["a", "b"], 1),
    "torch_two_outputs": (["x"], 2),
    "torch_linear": (["x"], 1),
    "torch_int": (["a", "b"], 1),
    "torch_slow": (["x"], 1),
}


def pt_blob(name):
    """The bytes of tests/data/<name>.pt."""
    return data_blob(f"{name}.pt")


def pt_store(con, key, name, *opts, device="CPU"):
    """AI.MODELSTORE <key> TORCH <device> <opts...> BLOB <tests/data/name.pt>; asserts OK."""
    reply = con.execute_command("AI.MODELSTORE", key, "TORCH", device, *opts, "BLOB", pt_blob(name))
    assert reply == b"OK", reply
    return reply


def torch_meta(device=b"CPU", tag=b"", batch=0, minbatch=0, inputs=(), noutputs=1, minbatchtimeout=0):
    """The 16-element AI.MODELGET META reply of a TORCH model (outputs are "" each)."""
    return [b"backend", b"TORCH", b"device", device, b"tag", tag, b"batchsize", batch, b"minbatchsize", minbatch,
            b"inputs", [i.encode() for i in inputs], b"outputs", [b""] * noutputs,
            b"minbatchtimeout", minbatchtimeout]


def slow_reference(x):
    """What torch_slow computes, in float64 numpy."""
    x = x.astype(np.float64)
    for _ in range(200):
        x = np.tanh(x @ x.T @ x / 256.0)
    return x


# -------------------------------------------------------------------------------------------------
# scripts

SIG = "(tensors: List[Tensor], keys: List[str], args: List[str])"


def entry(name, *body):
    """`def <name>(tensors: List[Tensor], keys: List[str], args: List[str]):` with the given body lines."""
    return f"def {name}{SIG}:\n" + "".join(f"    {line}\n" for line in body)


def script_store(con, key, source, entry_points, *, device="CPU", tag=None):
    """AI.SCRIPTSTORE <key> <device> [TAG <tag>] ENTRY_POINTS <n> <names> SOURCE <source>; asserts OK."""
    tag_args = ["TAG", tag] if tag is not None else []
    reply = con.execute_command("AI.SCRIPTSTORE", key, device, *tag_args, "ENTRY_POINTS", len(entry_points),
                                *entry_points, "SOURCE", source)
    assert reply == b"OK", reply
    return reply


def script_set(con, key, source, *, device="CPU", tag=None):
    """Deprecated AI.SCRIPTSET <key> <device> [TAG <tag>] SOURCE <source>; asserts OK."""
    tag_args = ["TAG", tag] if tag is not None else []
    reply = con.execute_command("AI.SCRIPTSET", key, device, *tag_args, "SOURCE", source)
    assert reply == b"OK", reply
    return reply


def scriptexecute_args(key, fn, *, keys=(), inputs=(), args=(), outputs=(), timeout=None):
    out = ["AI.SCRIPTEXECUTE", key, fn]
    if keys:
        out += ["KEYS", len(keys), *keys]
    if inputs:
        out += ["INPUTS", len(inputs), *inputs]
    if args:
        out += ["ARGS", len(args), *args]
    if outputs:
        out += ["OUTPUTS", len(outputs), *outputs]
    if timeout is not None:
        out += ["TIMEOUT", timeout]
    return out


def script_execute(con, key, fn, **kw):
    return con.execute_command(*scriptexecute_args(key, fn, **kw))


# =================================================================================================
# the scripts the script tests share (test_cmd_script.py, test_cmd_dag.py, test_persistence_script.py, ...)

# the main test script: entry points with RedisAI's signature
MAIN_FNS = ["bar", "scale", "pair", "swap", "counts", "keylens", "argsum", "int_fn", "make"]


MAIN_SRC = (
    entry("bar", "return tensors[0] + tensors[1]")
    + entry("scale", "return tensors[0] * float(args[0])")
    + entry("pair", "return tensors[0] + 1, tensors[0] * 2")
    + entry("swap", "return [tensors[1], tensors[0]]")
    + entry("counts", "return torch.tensor([len(tensors), len(keys), len(args)])")
    + entry("keylens", "return torch.tensor([len(k) for k in keys])")
    + entry("argsum", "x = torch.zeros(1)", "for a in args:", "    x = x + float(a)", "return x")
    + entry("int_fn", "return 1")
    + entry("make", "return torch.ones(2, 3)")
)


# an old-style script (AI.SCRIPTSET): positional tensor arguments, a trailing List[Tensor]
OLD_SRC = (
    "def bar(a, b):\n    return a + b\n\n"
    "def bar_variadic(a, args: List[Tensor]):\n    return a + args[0] + args[1]\n\n"
    "def pre(a):\n    return a / 10\n\n"
    "def ens(a, rest: List[Tensor]):\n    return (a + rest[0]) / 2\n\n"
    "def post(a):\n    return a * 2 - 1\n"
)


BAR_SRC = entry("bar", "return tensors[0] + tensors[1]")


def scriptget_full(device, tag, entry_points, source):
    """The full AI.SCRIPTGET reply."""
    return [b"device", device, b"tag", tag, b"Entry Points", [e.encode() for e in entry_points],
            b"source", source.encode()]


def values(con, key):
    """AI.TENSORGET VALUES as floats."""
    return [float(v) for v in con.execute_command("AI.TENSORGET", key, "VALUES")]


def f32(*shape, seed=0):
    """A FLOAT array of the given shape, standard normal, from `seed`."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# the script of the TorchScript extension tests (test_cmd_script_extensions.py, test_persistence_script.py)
EXT_SRC = '''
def redis_string_int_to_tensor(redis_value: Any):
    return torch.tensor(int(str(redis_value)))

def int_set_get(tensors: List[Tensor], keys: List[str], args: List[str]):
    key = keys[0]
    value = args[0]
    redis.execute("SET", [key, value])
    res = redis.execute("GET", [key])
    return redis_string_int_to_tensor(res)

def func_list(tensors: List[Tensor], keys: List[str], args: List[str]):
    key = keys[0]
    redis.execute("DEL", [key])
    redis.execute("RPUSH", [key, "1", "2", "3"])
    res = redis.asList(redis.execute("LRANGE", [key, "0", "-1"]))
    return torch.tensor([int(str(x)) for x in res])

def int_reply(tensors: List[Tensor], keys: List[str], args: List[str]):
    n = redis.execute("INCRBY", [keys[0], args[0]])
    return torch.tensor(int(str(n)))

def missing(tensors: List[Tensor], keys: List[str], args: List[str]):
    r = redis.execute("GET", [keys[0]])
    # A nil reply is None (`is None` on an Any value is decided statically, so compare its text).
    if str(r) == "None":
        return torch.tensor(1)
    return torch.tensor(0)

def failing(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("INCR", [keys[0]])
    return tensors[0]

def via_model(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redisAI.model_execute(keys[0], [tensors[0], tensors[0]], 1)[0]
'''


EXT_FNS = ["int_set_get", "func_list", "int_reply", "missing", "failing", "via_model"]


def store_ext_script(con):
    """EXT_SRC as the script `s`."""
    assert con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", len(EXT_FNS), *EXT_FNS,
                               "SOURCE", EXT_SRC) == b"OK"
