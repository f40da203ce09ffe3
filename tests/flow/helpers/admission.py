"""Model admission checks shared by test_security_onnx.py and test_security_tflite.py: the watched secret's bytes,
and what a refused model that arrived through RESTORE, an RDB or an AOF must look like (kept with its bytes, never
run)."""

import numpy as np

from .checks import check_error
from .onnx_models import set_tensor

EXTERNAL = "Initializer tensors with external data is not allowed."
# secret.txt, the file the server must not read (test_security_onnx.py puts it in the server's directory)
SECRET = b"redisai-rs admission test: TOP SECRET 4242"
N = len(SECRET)


def no_secret_anywhere(con):
    """No key holds the secret's bytes (tensors read back with TENSORGET BLOB, other values with DUMP)."""
    for key in con.scan_iter(count=1000):
        if con.type(key) == b"AI_TENSOR":
            assert SECRET not in con.execute_command("AI.TENSORGET", key, "BLOB"), key
        elif con.type(key) != b"AI__MODEL":  # a model's DUMP holds its own bytes (a location, not the data)
            assert SECRET not in (con.dump(key) or b""), key


def assert_kept_not_run(con, key, evil, error=EXTERNAL, backend=b"ONNX", names=([b"x"], [b"y"])):
    """`names`: what META reports (an AOF's AI.MODELSTORE of an ONNX model carries none, and a refused model never
    reached the backend that would report them)."""
    assert con.execute_command("AI.MODELGET", key, "BLOB") == evil
    meta = con.execute_command("AI.MODELGET", key, "META")
    meta = dict(zip(meta[::2], meta[1::2]))
    assert (meta[b"backend"], meta[b"inputs"], meta[b"outputs"]) == (backend, *names)
    set_tensor(con, "zeros", np.zeros(N, dtype=np.uint8), "UINT8")
    check_error(con, error, "AI.MODELEXECUTE", key, "INPUTS", 1, "zeros", "OUTPUTS", 1, "out")
    check_error(con, error, "AI.MODELRUN", key, "INPUTS", "zeros", "OUTPUTS", "out")
    # a DAG replies per op: the error, then NA for the TENSORGET that had nothing to read
    reply = con.execute_command("AI.DAGEXECUTE", "LOAD", 1, "zeros", "|>", "AI.MODELEXECUTE", key, "INPUTS", 1,
                                "zeros", "OUTPUTS", 1, "out", "|>", "AI.TENSORGET", "out", "BLOB")
    assert [str(reply[0]), reply[1]] == [error, b"NA"], reply
    assert con.exists("out") == 0
    no_secret_anywhere(con)
