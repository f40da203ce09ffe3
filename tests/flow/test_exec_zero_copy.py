"""Big AI.TENSORSET BLOBs are kept as Redis received them instead of being copied on the main thread: the
tensor then reads the argument string itself. These tests check that such tensors behave as any other
(replies, runs, persistence, replication of the command) and that their memory goes back whichever thread lets
go of them last (the main thread, a worker still running on a deleted key, the lazy-free thread)."""
import threading

import numpy as np
import pytest
import redis

from helpers.onnx_models import blob, get_tensor, set_tensor

BIG = 1 << 20  # floats: 4 MiB, past the adoption threshold (64 KiB) and the lazy-free one (1 MiB)


def used_memory(con):
    return int(con.info("memory")["used_memory"])


def test_adopted_blob_reads_back_and_runs(con):
    x = np.random.default_rng(1).random((BIG // 4, 4), dtype=np.float32)
    set_tensor(con, "x", x)
    np.testing.assert_array_equal(get_tensor(con, "x"), x)
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    con.execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "x", "x", "OUTPUTS", 1, "y")
    np.testing.assert_array_equal(get_tensor(con, "y"), x * x)
    # STRING and BOOL BLOBs are checked as before (the same errors), adopted or not.
    big_bool = bytes([0, 1]) * (BIG // 2)
    assert con.execute_command("AI.TENSORSET", "b", "BOOL", len(big_bool), "BLOB", big_bool) == b"OK"
    bad_bool = big_bool[:-1] + b"\x02"
    with pytest.raises(Exception) as e:
        con.execute_command("AI.TENSORSET", "b", "BOOL", len(bad_bool), "BLOB", bad_bool)
    assert "BOOL tensor elements must be 0 or 1" in str(e.value)
    strings = b"ab\0" * (BIG // 3)
    n = strings.count(b"\0")
    assert con.execute_command("AI.TENSORSET", "s", "STRING", n, "BLOB", strings) == b"OK"
    assert con.execute_command("AI.TENSORGET", "s", "BLOB") == strings


def test_adopted_blob_survives_reload_and_copy(server):
    c = server.client()
    x = np.arange(BIG, dtype=np.float32)
    set_tensor(c, "x", x)
    assert c.execute_command("COPY", "x", "x2") == 1
    c.execute_command("DEBUG", "RELOAD")
    np.testing.assert_array_equal(get_tensor(c, "x"), x)
    np.testing.assert_array_equal(get_tensor(c, "x2"), x)


def test_memory_comes_back_from_every_thread(server):
    c = server.client()
    c.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(c, "small", np.ones((1, 1), dtype=np.float32))
    base = used_memory(c)
    x = np.ones((BIG // 4, 4), dtype=np.float32)
    for _ in range(20):
        set_tensor(c, "x", x)  # replacing: freed on the lazy-free thread
    c.delete("x")
    # A run that still holds a deleted key's tensor lets go of it on its worker. The run races the deletion:
    # it either ran or found the key gone, and nothing else.
    replies = []

    def run():
        try:
            replies.append(server.client().execute_command("AI.MODELEXECUTE", "m", "INPUTS", 2, "x", "x",
                                                           "OUTPUTS", 1, "y"))
        except redis.ResponseError as e:
            replies.append(str(e))

    for _ in range(10):
        set_tensor(c, "x", x)
        t = threading.Thread(target=run)
        t.start()
        c.delete("x")
        t.join()
    assert set(replies) <= {b"OK", "tensor key is empty or in a different shard"}, replies
    assert len(replies) == 10
    c.delete("y")
    for _ in range(100):
        if used_memory(c) < base + (1 << 20):
            break
        import time
        time.sleep(0.05)
    assert used_memory(c) < base + (1 << 20), (base, used_memory(c))
    assert c.ping()


def test_multi_with_set_and_delete(server):
    c = server.client()
    payload = np.ones(BIG, dtype=np.float32).tobytes()
    p = c.pipeline(transaction=True)
    p.execute_command("AI.TENSORSET", "x", "FLOAT", BIG, "BLOB", payload)
    p.execute_command("AI.TENSORGET", "x", "META")
    p.delete("x")
    p.execute_command("AI.TENSORSET", "x", "FLOAT", BIG, "BLOB", payload)
    assert p.execute()[0] == b"OK"
    assert c.execute_command("AI.TENSORGET", "x", "BLOB") == payload
