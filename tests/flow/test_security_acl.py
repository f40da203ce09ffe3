"""Security of access (docs/security.md): scripts act with their caller's ACL, AI.CONFIG is an admin command (and
runtime backend loading can be turned off), and every key of every AI command carries its read/write flags for ACL
selectors.

Model admission and the memory bound per backend are tested in test_security_onnx.py, test_security_tf.py,
test_security_tflite.py and test_security_torch.py.
Each test reproduces an attack made by a client that holds only AI.* commands and a key pattern, and asserts
the refusal and that nothing was read, written or granted."""
import numpy as np
import pytest
import redis

from helpers.onnx_models import blob, get_tensor, set_tensor
from helpers.server import server_flavor

APP = ("app", "pw")
# The user of the report: every command but admin/dangerous ones, keys app:* only.
APP_RULES = ("on", ">pw", "~app:*", "+@all", "-@admin", "-@dangerous")
SEL = ("sel", "pw")
# Redis 7 selectors: read in:*, write out:*, both both:*.
SEL_RULES = ("on", ">pw", "+@all", "%R~in:*", "%W~out:*", "~both:*")

SCRIPT = '''
def get(tensors: List[Tensor], keys: List[str], args: List[str]):
    r = redis.execute("GET", [args[0]])
    return torch.tensor(len(str(r)))

def setk(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("SET", [args[0], "written"])
    return torch.tensor(1)

def escalate(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("ACL", ["SETUSER", "app", "allkeys", "+@all"])
    return torch.tensor(1)

def flush(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("FLUSHALL", [])
    return torch.tensor(1)

def multi(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("MULTI", [])
    return torch.tensor(1)

def lua(tensors: List[Tensor], keys: List[str], args: List[str]):
    redis.execute("EVAL", ["return redis.call('GET', KEYS[1])", "1", args[0]])
    return torch.tensor(1)

def run_model(tensors: List[Tensor], keys: List[str], args: List[str]):
    return redisAI.model_execute(args[0], [tensors[0], tensors[0]], 1)[0]
'''
ENTRIES = ["get", "setk", "escalate", "flush", "multi", "lua", "run_model"]
# AI.SCRIPTRUN (deprecated) calls positionally: the key is hard-coded.
POSITIONAL = '''
def read_secret(a):
    r = redis.execute("GET", ["secret"])
    return a + len(str(r))
'''


@pytest.fixture
def users(con):
    con.execute_command("ACL", "SETUSER", "app", "reset", *APP_RULES)
    con.execute_command("ACL", "SETUSER", "sel", "reset", *SEL_RULES)
    con.set("secret", "topsecret")
    for key in ("app:s", "in:s", "both:s"):
        con.execute_command("AI.SCRIPTSTORE", key, "CPU", "ENTRY_POINTS", len(ENTRIES), *ENTRIES, "SOURCE", SCRIPT)
    yield
    con.execute_command("ACL", "DELUSER", "app", "sel")


def as_user(server, user):
    return server.client(username=user[0], password=user[1])


def refused(fn, *args):
    with pytest.raises(redis.ResponseError) as e:
        fn(*args)
    return str(e.value)


def noperm(fn, *args):
    """The call fails with a NOPERM error (redis-py raises NoPermissionError and strips the prefix)."""
    with pytest.raises(redis.exceptions.NoPermissionError):
        fn(*args)
    return True


# ---- scripts act as their caller ------------------------------------------------------------------


def test_script_cannot_read_a_key_outside_the_callers_pattern(shared_server, con, users):
    app = as_user(shared_server, APP)
    err = refused(app.execute_command, "AI.SCRIPTEXECUTE", "app:s", "get", "KEYS", 1, "app:k", "ARGS", 1, "secret",
                  "OUTPUTS", 1, "app:o")
    assert "Redis command returned an error: NOPERM" in err
    assert con.exists("app:o") == 0
    # Inside the pattern it works (the script returns the length of the value).
    con.set("app:k", "v")
    app.execute_command("AI.SCRIPTEXECUTE", "app:s", "get", "KEYS", 1, "app:k", "ARGS", 1, "app:k",
                        "OUTPUTS", 1, "app:o")
    assert con.execute_command("AI.TENSORGET", "app:o", "VALUES") == [len("v")]


def test_script_cannot_escalate_the_callers_acl(shared_server, con, users):
    app = as_user(shared_server, APP)
    before = con.execute_command("ACL", "GETUSER", "app")
    err = refused(app.execute_command, "AI.SCRIPTEXECUTE", "app:s", "escalate", "KEYS", 1, "app:k",
                  "OUTPUTS", 1, "app:o")
    assert "Redis command returned an error: NOPERM" in err
    assert con.execute_command("ACL", "GETUSER", "app") == before
    err = refused(app.execute_command, "AI.SCRIPTEXECUTE", "app:s", "flush", "KEYS", 1, "app:k")
    assert "Redis command returned an error: NOPERM" in err
    assert con.get("secret") == b"topsecret"


def test_deprecated_scriptrun_and_dag_forms_act_as_the_caller(shared_server, con, users):
    con.execute_command("AI.SCRIPTSET", "app:p", "CPU", "SOURCE", POSITIONAL)
    set_tensor(con, "app:a", np.array([1.0], dtype=np.float32))
    app = as_user(shared_server, APP)
    err = refused(app.execute_command, "AI.SCRIPTRUN", "app:p", "read_secret", "INPUTS", "app:a", "OUTPUTS", "app:o")
    assert "Redis command returned an error: NOPERM" in err
    assert con.exists("app:o") == 0
    reply = app.execute_command("AI.DAGEXECUTE", "ROUTING", "app:k", "|>", "AI.SCRIPTEXECUTE", "app:s", "get",
                                "KEYS", 1, "app:k", "ARGS", 1, "secret", "OUTPUTS", 1, "o", "|>", "AI.TENSORGET", "o",
                                "VALUES")
    assert isinstance(reply[0], redis.ResponseError)
    assert "Redis command returned an error: NOPERM" in str(reply[0])
    reply = app.execute_command("AI.DAGRUN", "LOAD", 1, "app:a", "|>", "AI.SCRIPTRUN", "app:p", "read_secret",
                                "INPUTS", "app:a", "OUTPUTS", "o", "|>", "AI.TENSORGET", "o", "VALUES")
    assert isinstance(reply[0], redis.ResponseError)
    assert "Redis command returned an error: NOPERM" in str(reply[0])


def test_selectors_decide_what_a_script_may_read_and_write(shared_server, con, users):
    sel = as_user(shared_server, SEL)
    con.set("in:x", "1")
    con.set("out:x", "1")
    call = ("AI.SCRIPTEXECUTE", "in:s")
    tail = ("KEYS", 1, "both:k", "OUTPUTS", 1, "out:o")
    sel.execute_command(*call, "get", *tail[:3], "ARGS", 1, "in:x", *tail[3:])
    assert "NOPERM" in refused(sel.execute_command, *call, "setk", *tail[:3], "ARGS", 1, "in:x", *tail[3:])
    assert con.get("in:x") == b"1"
    sel.execute_command(*call, "setk", *tail[:3], "ARGS", 1, "out:x", *tail[3:])
    assert con.get("out:x") == b"written"
    assert "NOPERM" in refused(sel.execute_command, *call, "get", *tail[:3], "ARGS", 1, "out:x", *tail[3:])


def test_read_only_dag_scripts_cannot_write(con, users):
    # As in RedisAI, a read-only DAG takes no script op at all (so none of its callbacks can write).
    err = refused(con.execute_command, "AI.DAGEXECUTE_RO", "ROUTING", "both:k", "|>", "AI.SCRIPTEXECUTE", "in:s",
                  "setk", "KEYS", 1, "both:k", "ARGS", 1, "both:w", "OUTPUTS", 1, "o")
    assert err == "AI.SCRIPTEXECUTE command cannot be specified in a read-only DAG"
    assert con.exists("both:w") == 0
    # The same op in a read-write DAG writes.
    con.execute_command("AI.DAGEXECUTE", "ROUTING", "both:k", "|>", "AI.SCRIPTEXECUTE", "in:s", "setk", "KEYS", 1, "both:k",
                        "ARGS", 1, "both:w", "OUTPUTS", 1, "o")
    assert con.get("both:w") == b"written"


def test_commands_forbidden_in_scripts_are_refused(con, users):
    for fn in ("multi", "lua"):
        err = refused(con.execute_command, "AI.SCRIPTEXECUTE", "both:s", fn, "KEYS", 1, "both:k",
                      "ARGS", 1, "secret", "OUTPUTS", 1, "both:o")
        assert "Redis command returned an error:" in err and "not allowed from script" in err, err


def test_model_execute_inside_a_script_checks_the_model_key(shared_server, con, users):
    con.execute_command("AI.MODELSTORE", "secret:m", "ONNX", "CPU", "BLOB", blob("mul"))
    con.execute_command("AI.MODELSTORE", "app:m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(con, "app:a", np.array([[3.0]], dtype=np.float32))
    app = as_user(shared_server, APP)
    run = ("AI.SCRIPTEXECUTE", "app:s", "run_model", "KEYS", 1, "app:k", "INPUTS", 1, "app:a", "ARGS", 1)
    assert "NOPERM" in refused(app.execute_command, *run, "secret:m", "OUTPUTS", 1, "app:o")
    assert con.exists("app:o") == 0
    app.execute_command(*run, "app:m", "OUTPUTS", 1, "app:o")
    assert get_tensor(con, "app:o").tolist() == [[9.0]]


# ---- AI.CONFIG is an admin command --------------------------------------------------------------


def test_ai_config_is_refused_to_non_admin_users(shared_server, con, users):
    app = as_user(shared_server, APP)
    before = con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH")
    for cmd in (("AI.CONFIG", "BACKENDSPATH", "/tmp"), ("AI.CONFIG", "LOADBACKEND", "TORCH", "/tmp/evil.so"),
                ("AI.CONFIG", "GET", "BACKENDSPATH")):
        assert noperm(app.execute_command, *cmd), cmd
    assert con.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") == before
    flavor, version = server_flavor()
    if flavor == "valkey" or version >= (7, 2, 0):
        admin = {c.decode() for c in con.execute_command("ACL", "CAT", "admin")}
        dangerous = {c.decode() for c in con.execute_command("ACL", "CAT", "dangerous")}
        assert "ai.config" in admin and "ai.config" in dangerous


@pytest.mark.module_args("RUNTIME_BACKEND_LOADING", "no")
def test_runtime_backend_loading_can_be_forbidden(server):
    c = server.client()
    for cmd in (("AI.CONFIG", "BACKENDSPATH", "/tmp"), ("AI.CONFIG", "LOADBACKEND", "TORCH", "/tmp/evil.so")):
        assert "RUNTIME_BACKEND_LOADING no" in refused(c.execute_command, *cmd)
    assert c.execute_command("AI.CONFIG", "MODEL_CHUNK_SIZE", 1024) == b"OK"
    assert c.execute_command("AI.CONFIG", "GET", "BACKENDSPATH") != b"/tmp"


# ---- exact key permissions ----------------------------------------------------------------------


def test_selectors_apply_to_every_key_of_every_command(shared_server, con, users):
    sel = as_user(shared_server, SEL)
    mul = blob("mul")
    one = np.array([[2.0]], dtype=np.float32)
    # TENSORSET writes, TENSORGET reads.
    set_tensor(sel, "out:t", one)
    assert noperm(set_tensor, sel, "in:t", one)
    set_tensor(con, "in:t", one)
    assert get_tensor(sel, "in:t").tolist() == [[2.0]]
    assert noperm(get_tensor, sel, "out:t")
    # MODELSTORE writes, MODELGET reads, MODELDEL deletes (a write).
    sel.execute_command("AI.MODELSTORE", "out:m", "ONNX", "CPU", "BLOB", mul)
    assert noperm(sel.execute_command, "AI.MODELSTORE", "in:m", "ONNX", "CPU", "BLOB", mul)
    con.execute_command("AI.MODELSTORE", "in:m", "ONNX", "CPU", "BLOB", mul)
    assert sel.execute_command("AI.MODELGET", "in:m", "META")
    assert noperm(sel.execute_command, "AI.MODELGET", "out:m", "META")
    assert noperm(sel.execute_command, "AI.MODELDEL", "in:m")
    sel.execute_command("AI.MODELDEL", "out:m")
    # MODELEXECUTE: model and inputs read, outputs written.
    sel.execute_command("AI.MODELEXECUTE", "in:m", "INPUTS", 2, "in:t", "in:t", "OUTPUTS", 1, "out:r")
    assert get_tensor(con, "out:r").tolist() == [[4.0]]
    for bad in (("in:m", "in:t", "in:r"), ("in:m", "out:t", "out:r"), ("out:m", "in:t", "out:r")):
        m, i, o = bad
        assert noperm(sel.execute_command, "AI.MODELEXECUTE", m, "INPUTS", 2, i, i, "OUTPUTS", 1, o), bad
    assert noperm(sel.execute_command, "AI.MODELRUN", "in:m", "INPUTS", "in:t", "in:t", "OUTPUTS",
                   "in:r")
    sel.execute_command("AI.MODELRUN", "in:m", "INPUTS", "in:t", "in:t", "OUTPUTS", "out:r2")
    # DAG: LOAD reads, PERSIST writes.
    dag = ("|>", "AI.MODELEXECUTE", "in:m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b")
    sel.execute_command("AI.DAGEXECUTE", "LOAD", 1, "in:t", "PERSIST", 1, "out:b", *dag[:5], "in:t", "in:t",
                        *dag[7:9], "out:b")
    assert get_tensor(con, "out:b").tolist() == [[4.0]]
    assert noperm(sel.execute_command, "AI.DAGEXECUTE", "LOAD", 1, "out:t", "PERSIST", 1, "out:b",
                   *dag)
    assert noperm(sel.execute_command, "AI.DAGEXECUTE", "LOAD", 1, "in:t", "PERSIST", 1, "in:b",
                   *dag)
    # SCRIPTEXECUTE: KEYS are read and written; SCRIPTSTORE writes, SCRIPTGET reads, SCRIPTDEL deletes.
    run = ("AI.SCRIPTEXECUTE", "in:s", "get", "KEYS", 1)
    assert noperm(sel.execute_command, *run, "in:k", "ARGS", 1, "in:x", "OUTPUTS", 1, "out:o")
    assert sel.execute_command("AI.SCRIPTGET", "in:s", "META")
    assert noperm(sel.execute_command, "AI.SCRIPTDEL", "in:s")
    assert noperm(sel.execute_command, "AI.SCRIPTSTORE", "in:s2", "CPU", "ENTRY_POINTS", 1, "get", "SOURCE",
                   SCRIPT)


def test_dag_forms_apply_selectors(shared_server, con, users):
    sel = as_user(shared_server, SEL)
    con.execute_command("AI.MODELSTORE", "in:m", "ONNX", "CPU", "BLOB", blob("mul"))
    set_tensor(con, "in:t", np.array([[3.0]], dtype=np.float32))
    dag = ("|>", "AI.MODELEXECUTE", "in:m", "INPUTS", 2, "a", "a", "OUTPUTS", 1, "b")
    sel.execute_command("AI.DAGRUN", "LOAD", 1, "in:t", "PERSIST", 1, "out:b", "|>", "AI.MODELRUN", "in:m",
                        "INPUTS", "in:t", "in:t", "OUTPUTS", "out:b")
    assert get_tensor(con, "out:b").tolist() == [[9.0]]
    assert noperm(sel.execute_command, "AI.DAGRUN", "LOAD", 1, "in:t", "PERSIST", 1, "in:b", "|>", "AI.MODELRUN",
                   "in:m", "INPUTS", "in:t", "in:t", "OUTPUTS", "in:b")
    for cmd in ("AI.DAGEXECUTE_RO", "AI.DAGRUN_RO"):
        reply = sel.execute_command(cmd, "LOAD", 1, "in:t", "|>", "AI.TENSORGET", "in:t", "VALUES")
        assert reply == [[3.0]] or reply == [[b"3"]], reply
        assert noperm(sel.execute_command, cmd, "LOAD", 1, "out:t", "|>", "AI.TENSORGET", "out:t",
                       "VALUES")
        # A model key named inside the DAG is read.
        assert noperm(sel.execute_command, cmd, "LOAD", 1, "in:t", "|>", "AI.MODELEXECUTE", "out:m", "INPUTS", 2,
                       "in:t", "in:t", "OUTPUTS", 1, "x")


def test_getkeysandflags_reports_read_and_write(shared_server):
    def flags(*cmd):
        def text(b):
            return b.decode() if isinstance(b, bytes) else str(b)
        reply = shared_server.raw("COMMAND", "GETKEYSANDFLAGS", *cmd)
        return {text(k): {text(f) for f in fl} for k, fl in reply}
    assert flags("AI.MODELEXECUTE", "m", "INPUTS", 1, "a", "OUTPUTS", 1, "b") == {
        "m": {"RO", "access"}, "a": {"RO", "access"}, "b": {"OW", "update"}}
    assert flags("AI.TENSORGET", "t", "VALUES") == {"t": {"RO", "access"}}
    assert flags("AI.TENSORSET", "t", "FLOAT", 1) == {"t": {"OW", "update"}}
    assert flags("AI.MODELDEL", "m") == {"m": {"RM", "delete"}}
    assert flags("AI.SCRIPTEXECUTE", "s", "f", "KEYS", 1, "k", "INPUTS", 1, "i", "OUTPUTS", 1, "o") == {
        "s": {"RO", "access"}, "k": {"RW", "access", "update"}, "i": {"RO", "access"}, "o": {"OW", "update"}}
    assert flags("AI.DAGEXECUTE", "LOAD", 1, "l", "PERSIST", 1, "p", "|>", "AI.MODELEXECUTE", "m", "INPUTS", 1, "l",
                 "OUTPUTS", 1, "p") == {"l": {"RO", "access"}, "p": {"OW", "update"}, "m": {"RO", "access"}}
