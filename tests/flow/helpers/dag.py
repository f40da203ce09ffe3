"""Building AI.DAGEXECUTE commands and reading their replies: the argv of a DAG, tensors set and read as numpy
arrays, and the inputs the DAG tests share."""

import numpy as np
import redis

from .data import weights
from .onnx_models import NP_OF


NP_TYPES = {np.float32: "FLOAT", np.float64: "DOUBLE", np.int32: "INT32", np.int64: "INT64"}


def tensorset_args(key, arr):
    arr = np.ascontiguousarray(arr)
    return ["AI.TENSORSET", key, NP_TYPES[arr.dtype.type], *arr.shape, "BLOB", arr.tobytes()]


def tset(con, key, arr):
    assert con.execute_command(*tensorset_args(key, arr)) == b"OK"


def from_meta_blob(reply):
    """A TENSORGET META BLOB reply -> numpy array."""
    assert isinstance(reply, list) and len(reply) == 6, reply
    assert reply[0] == b"dtype" and reply[2] == b"shape" and reply[4] == b"blob", reply
    return np.frombuffer(reply[5], dtype=NP_OF[reply[1]]).reshape(reply[3])


def tget(con, key):
    return from_meta_blob(con.execute_command("AI.TENSORGET", key, "META", "BLOB"))


def dag_cmd(command, header, ops):
    """[command, *header, '|>', *op1, '|>', *op2, ...]."""
    out = [command, *header]
    for op in ops:
        out += ["|>", *op]
    return out


def is_error(x):
    return isinstance(x, redis.exceptions.ResponseError)


def keys_of(con):
    return sorted(k.decode() for k in con.keys("*"))


X24 = np.array([[1, -2, 3, 0.5], [0.25, 4, -1, 2]], dtype=np.float32)


def heavy_batch(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, weights.HEAVY_WIDTH)).astype(np.float32)
