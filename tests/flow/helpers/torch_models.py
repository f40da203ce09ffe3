"""Helpers of the TORCH flow tests (test_torch.py, test_scripts.py, ...): the TorchScript models of tests/data
(tests/data/gen_torch.cpp), and script sources and script calls.

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
