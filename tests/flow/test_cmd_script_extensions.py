"""TorchScript extensions, what a script run by AI.SCRIPTEXECUTE may call (docs/commands.md, AI.SCRIPTEXECUTE):
redis.execute / redis.asList (Redis commands from a script, under the global lock and replicated) and
redisAI.model_execute (a stored model run from a script), with RedisAI's texts for their errors. What they may not
do (the caller's ACL) is in test_security_acl.py."""
import numpy as np
import pytest
import redis

from helpers.onnx_models import blob, get_tensor, set_tensor
from helpers.torch_models import entry, store_ext_script


def test_redis_execute_set_get(con):
    store_ext_script(con)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "int_set_get", "KEYS", 1, "x", "ARGS", 1, "42",
                               "OUTPUTS", 1, "o") == b"OK"
    assert con.get("x") == b"42"
    assert con.execute_command("AI.TENSORGET", "o", "VALUES") == [42]


def test_redis_execute_lists_ints_and_nil(con):
    store_ext_script(con)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "func_list", "KEYS", 1, "l", "OUTPUTS", 1, "o") == b"OK"
    assert con.execute_command("AI.TENSORGET", "o", "VALUES") == [1, 2, 3]
    assert con.lrange("l", 0, -1) == [b"1", b"2", b"3"]
    con.set("n", 5)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "int_reply", "KEYS", 1, "n", "ARGS", 1, "3",
                               "OUTPUTS", 1, "o") == b"OK"
    assert con.execute_command("AI.TENSORGET", "o", "VALUES") == [8]
    con.delete("nothing")
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "missing", "KEYS", 1, "nothing", "OUTPUTS", 1, "o") == b"OK"
    assert con.execute_command("AI.TENSORGET", "o", "VALUES") == [1]


def test_redis_execute_error(con):
    store_ext_script(con)
    con.set("word", "abc")
    set_tensor(con, "t", np.array([1.0], dtype=np.float32))
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "failing", "KEYS", 1, "word", "INPUTS", 1, "t", "OUTPUTS", 1, "o")
    assert "Redis command returned an error: ERR value is not an integer or out of range" in str(e.value)
    assert con.exists("o") == 0
    assert con.ping()


def test_redis_execute_errors_in_redisais_words(con):
    """RedisAI's texts (its test_torchscript_extensions.py::test_redis_error): a command Redis cannot run at all (a
    wrong number of arguments, an unknown command) raises `strerror(errno)` of RedisModule_Call, a command that
    runs and fails raises Redis's reply."""
    src = (entry("arity", "redis.execute('SET', [keys[0]])", "return tensors[0]")
           + entry("unknown", "redis.execute('NOSUCHCOMMAND', [keys[0]])", "return tensors[0]")
           + entry("wrongtype", "redis.execute('GET', [keys[0]])", "return tensors[0]"))
    con.execute_command("AI.SCRIPTSTORE", "e", "CPU", "ENTRY_POINTS", 3, "arity", "unknown", "wrongtype", "SOURCE", src)
    set_tensor(con, "t", np.array([1.0], dtype=np.float32))
    con.hset("hash", "f", "1")
    for fn, key, text in [("arity", "x", "Redis command returned an error: Invalid argument"),
                          ("unknown", "x", "Redis command returned an error: No such file or directory"),
                          ("wrongtype", "hash", "Redis command returned an error: WRONGTYPE Operation against a key "
                                                "holding the wrong kind of value")]:
        with pytest.raises(redis.exceptions.ResponseError) as e:
            con.execute_command("AI.SCRIPTEXECUTE", "e", fn, "KEYS", 1, key, "INPUTS", 1, "t", "OUTPUTS", 1, "o")
        assert text in str(e.value), (fn, str(e.value))
    assert con.exists("x") == 0 and con.exists("o") == 0
    assert con.ping()


def test_redis_execute_uses_the_clients_database(server):
    con = server.client(db=3)
    store_ext_script(con)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "int_set_get", "KEYS", 1, "y", "ARGS", 1, "7",
                               "OUTPUTS", 1, "o") == b"OK"
    assert con.get("y") == b"7"
    assert server.client(db=0).get("y") is None


def test_model_execute_from_a_script(con):
    store_ext_script(con)
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    set_tensor(con, "a", x)
    assert con.execute_command("AI.SCRIPTEXECUTE", "s", "via_model", "KEYS", 1, "m", "INPUTS", 1, "a",
                               "OUTPUTS", 1, "o") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "o"), x * x)
    with pytest.raises(redis.exceptions.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "s", "via_model", "KEYS", 1, "nomodel", "INPUTS", 1, "a",
                            "OUTPUTS", 1, "o")
    assert "model key is empty" in str(e.value)


def test_source_without_final_newline(con):
    """`$(printf ...)` in a shell drops the final newline; the script must still compile and be kept as sent."""
    src = "def f(tensors: List[Tensor], keys: List[str], args: List[str]):\n    return tensors[0] * 2"
    assert con.execute_command("AI.SCRIPTSTORE", "nl", "CPU", "ENTRY_POINTS", 1, "f", "SOURCE", src) == b"OK"
    assert con.execute_command("AI.SCRIPTGET", "nl", "SOURCE") == src.encode()
    set_tensor(con, "t", np.array([1.5], dtype=np.float32))
    assert con.execute_command("AI.SCRIPTEXECUTE", "nl", "f", "INPUTS", 1, "t", "OUTPUTS", 1, "o") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "o"), np.array([3.0], dtype=np.float32))


# --------------------------------------------------------------------------------------------------
# redis.execute of any command on any key returns (the worker holds Redis's lock while the command runs, and
# freeing what the command removes must not take that lock again)

KEY_SRC = '''
def on_key(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute(args[0], [keys[0]] + args[1:])
    return tensors[0] + 1
'''
# What each command leaves at the key.
KEY_COMMANDS = {
    "DEL": ([], None),
    "UNLINK": ([], None),
    "SET": (["plain"], b"plain"),
    "RENAME": (["renamed"], None),
    "EXPIRE": (["0"], None),
    "PEXPIRE": (["0"], None),
}
FLOATS_ADOPTED = 32768  # 128 KiB by BLOB: the tensor keeps the argument string itself
FLOATS_LAZY = 1 << 19  # 2 MiB: freed on the module's lazy-free thread


def _make_key(con, kind, key):
    if kind == "small":
        con.execute_command("AI.TENSORSET", key, "FLOAT", 4, "VALUES", 1, 2, 3, 4)
    elif kind in ("adopted", "own_input", "own_output"):
        con.execute_command("AI.TENSORSET", key, "FLOAT", FLOATS_ADOPTED, "BLOB",
                            np.arange(FLOATS_ADOPTED, dtype=np.float32).tobytes())
    elif kind == "lazy":
        con.execute_command("AI.TENSORSET", key, "FLOAT", FLOATS_LAZY, "BLOB",
                            np.ones(FLOATS_LAZY, dtype=np.float32).tobytes())
    elif kind == "model":
        con.execute_command("AI.MODELSTORE", key, "ONNX", "CPU", "BLOB", blob("mul"))
    elif kind in ("script", "own_script"):
        con.execute_command("AI.SCRIPTSTORE", key, "CPU", "ENTRY_POINTS", 1, "on_key", "SOURCE", KEY_SRC)


@pytest.mark.parametrize("command", sorted(KEY_COMMANDS))
@pytest.mark.parametrize("kind", ["small", "adopted", "lazy", "model", "script", "own_input", "own_output",
                                  "own_script"])
def test_redis_execute_on_any_key_returns(shared_server, kind, command):
    con = shared_server.client(socket_timeout=20)
    canary = np.arange(FLOATS_ADOPTED, dtype=np.float32)
    con.execute_command("AI.TENSORSET", "canary", "FLOAT", FLOATS_ADOPTED, "BLOB", canary.tobytes())
    script = "k" if kind == "own_script" else "s"
    if script == "s":
        con.execute_command("AI.SCRIPTSTORE", "s", "CPU", "ENTRY_POINTS", 1, "on_key", "SOURCE", KEY_SRC)
    _make_key(con, kind, "k")
    source = "k" if kind == "own_input" else "in"
    if source == "in":
        con.execute_command("AI.TENSORSET", "in", "FLOAT", FLOATS_ADOPTED, "BLOB",
                            np.arange(FLOATS_ADOPTED, dtype=np.float32).tobytes())
    output = "k" if kind == "own_output" else "out"
    extra, left = KEY_COMMANDS[command]
    cmd = ("AI.SCRIPTEXECUTE", script, "on_key", "KEYS", 1, "k", "INPUTS", 1, source, "ARGS", 1 + len(extra),
           command, *extra, "OUTPUTS", 1, output)
    if output == "k" and command == "SET":
        # The output key now holds a string: writing the output there is refused, as any WRONGTYPE key is.
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            con.execute_command(*cmd)
        assert con.get("k") == b"plain"
        np.testing.assert_array_equal(get_tensor(con, "canary"), canary)
        return
    assert con.execute_command(*cmd) == b"OK"
    assert con.ping()
    # The script's output is written after it ran, also over the key it changed.
    out = get_tensor(con, output)
    np.testing.assert_array_equal(out, np.arange(FLOATS_ADOPTED, dtype=np.float32) + 1)
    if output != "k":
        if left is None:
            assert con.exists("k") == 0
        else:
            assert con.get("k") == left
    if command == "RENAME" and output != "k":
        assert con.exists("renamed") == 1
    np.testing.assert_array_equal(get_tensor(con, "canary"), canary)


def test_errors_inside_scripts_keep_redisais_wording(con):
    con.execute_command("AI.MODELSTORE", "m", "ONNX", "CPU", "BLOB", blob("mul"))
    src = '''
def bad_rank(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redisAI.model_execute(keys[0], [tensors[0], tensors[0]], 1)[0]

def bad_cmd(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("INCR", [keys[0]])
    return tensors[0]
'''
    con.execute_command("AI.SCRIPTSTORE", "e", "CPU", "ENTRY_POINTS", 2, "bad_rank", "bad_cmd", "SOURCE", src)
    set_tensor(con, "x", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    con.set("str", "abc")
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "e", "bad_rank", "KEYS", 1, "m", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert "Invalid rank for input: a Got: 1 Expected: 2 Please fix either the inputs or the model" in str(e.value)
    with pytest.raises(redis.ResponseError) as e:
        con.execute_command("AI.SCRIPTEXECUTE", "e", "bad_cmd", "KEYS", 1, "str", "INPUTS", 1, "x", "OUTPUTS", 1, "y")
    assert "Redis command returned an error: ERR value is not an integer or out of range" in str(e.value)
