"""The low-level C API (include/redisai.h) as another module uses it: tests/llapi/llapi_test.c, built by
`make llapi-module` into target/llapi/libllapi_test.so, is loaded after the module, gets every function with
RedisAI_Initialize, and runs the checks itself, in C: each LLAPI.* command replies OK, or an error naming the first
check that failed and its line in llapi_test.c. Here: the keys those commands read, one test per command (errors,
tensors, model runs sync / batched / async, ModelCreate, scripts, DAGs as in RedisAI's tests/module/DAG_utils.c, a
DAG over two devices, reference counts, NULL arguments), AI.INFO counting the runs made through the API, INFO
MODULES' API version, the module refused without the "ai" module loaded first, and async runs from several clients
at once while the same models run through AI.MODELEXECUTE.

REDISAI_LLAPI_MODULE names the test module (default <repo>/target/llapi/libllapi_test.so); without it the tests
fail, they never skip.
"""

import os
import threading

import numpy as np
import pytest
import redis

from helpers.checks import error_text, module_names
from helpers.onnx_models import ai_info, get_tensor, set_tensor
from helpers.resp import RespError
from helpers.server import MODULE_PATH, REPO_ROOT
from helpers.tf_graphs import DT_STRING, graph_def, node_def, placeholder
from helpers.tf_models import tf_blob, tf_store
from helpers.torch_models import OLD_SRC, script_set

LLAPI_MODULE = os.environ.get("REDISAI_LLAPI_MODULE") or str(REPO_ROOT / "target" / "llapi" / "libllapi_test.so")

# a{1} and b{1}: llapi_test.c works out what each run must give from their values (a * b, a + b, a + 2b, ...);
# b differs from a so that swapped inputs or outputs show.
A = np.array([[2, 3], [2, 3]], dtype=np.float32)
B = np.array([[5, 7], [11, 13]], dtype=np.float32)
T = np.array([[1, 2], [3, 4]], dtype=np.float32)  # t{1}: LLAPI.TENSORS checks these very values
TMP = np.array([[1.5, -2], [3, 0.25]], dtype=np.float32)  # tmp{1}, which LLAPI.REFCOUNT deletes
CLIENT_TIMEOUT = 120  # s; llapi_test.c gives up on a completion callback after 60 s and replies an error


def llapi_module():
    assert os.path.isfile(LLAPI_MODULE), (
        f"LLAPI test module not found at {LLAPI_MODULE}: build it with `make llapi-module` "
        f"or point REDISAI_LLAPI_MODULE at it")
    return LLAPI_MODULE


def store_keys(con):
    """The keys the LLAPI.* commands read."""
    set_tensor(con, "a{1}", A)
    set_tensor(con, "b{1}", B)
    set_tensor(con, "t{1}", T)
    set_tensor(con, "tmp{1}", TMP)
    tf_store(con, "m{1}", "mul")  # INPUTS a b OUTPUTS c: c = a * b
    tf_store(con, "m2{1}", "mul", device="CPU:1")
    tf_store(con, "mtmp{1}", "mul")  # deleted by LLAPI.REFCOUNT
    script_set(con, "myscript{1}", OLD_SRC)  # bar(a, b) = a + b, bar_variadic(a, args) = a + args[0] + args[1]


@pytest.fixture
def llapi(make_server):
    """A server with the module, then llapi_test (server_args come after the module's --loadmodule), and the keys."""
    srv = make_server(server_args=["--loadmodule", llapi_module()])
    con = srv.client(socket_timeout=CLIENT_TIMEOUT)
    store_keys(con)
    return srv, con


def run_ok(srv, con, *cmd):
    """cmd must reply OK (a failed check's error is shown as is) and leave the server alive."""
    try:
        reply = con.execute_command(*cmd)
    except redis.exceptions.ResponseError as e:
        pytest.fail(f"{cmd[0]}: {e}", pytrace=False)
    assert reply == b"OK", (cmd[0], reply)
    assert srv.responsive(), f"the server does not answer after {cmd[0]}"


# =================================================================================================
# one test per LLAPI.* command


def test_version(llapi):
    srv, con = llapi
    assert con.execute_command("LLAPI.VERSION") == 1


def test_errors(llapi):
    run_ok(*llapi, "LLAPI.ERRORS")


def test_tensors(llapi):
    run_ok(*llapi, "LLAPI.TENSORS", "t{1}")


def test_model_run(llapi):
    run_ok(*llapi, "LLAPI.MODELRUN")


def test_model_create(llapi):
    run_ok(*llapi, "LLAPI.MODELCREATE", tf_blob("mul"), b"\xff\xff\xff\xff not a GraphDef")


def test_model_create_goes_through_admission(llapi):
    """RedisAI_ModelCreate checks a model as AI.MODELSTORE does: a graph TensorFlow would load as it is (its
    inputs a, b and output c exist) but that reads files is refused (LLAPI.MODELCREATE's second graph must fail)."""
    srv, con = llapi
    reads_files = graph_def([placeholder("a", DT_STRING), placeholder("b", DT_STRING), node_def("c", "ReadFile", ["a"])])
    with pytest.raises(redis.exceptions.ResponseError, match="TF model refused"):
        con.execute_command("AI.MODELSTORE", "refused{1}", "TF", "CPU", "INPUTS", 2, "a", "b", "OUTPUTS", 1, "c",
                            "BLOB", reads_files)
    run_ok(srv, con, "LLAPI.MODELCREATE", tf_blob("mul"), reads_files)


def test_script_run(llapi):
    srv, con = llapi
    run_ok(srv, con, "LLAPI.SCRIPTRUN")
    # its script that calls redis.execute("SET", ...) through the API was refused: nothing written
    assert con.exists("llapi:callback") == 0


def test_dag_run(llapi):
    run_ok(*llapi, "LLAPI.DAGRUN")


def test_dag_multidevice(llapi):
    srv, con = llapi
    before = {k: ai_info(con, k)["calls"] for k in ("m{1}", "m2{1}")}
    run_ok(srv, con, "LLAPI.DAG_MULTIDEVICE")
    # one op on each device's model
    assert {k: ai_info(con, k)["calls"] - before[k] for k in before} == {"m{1}": 1, "m2{1}": 1}


def test_refcount(llapi):
    srv, con = llapi
    run_ok(srv, con, "LLAPI.REFCOUNT")
    # the command deleted the keys whose copies it then used
    assert con.exists("tmp{1}", "mtmp{1}") == 0
    # the keys it did not touch are as they were
    np.testing.assert_array_equal(get_tensor(con, "a{1}"), A)
    assert con.execute_command("AI.MODELEXECUTE", "m{1}", "INPUTS", 2, "a{1}", "b{1}", "OUTPUTS", 1, "c{1}") == b"OK"
    np.testing.assert_array_equal(get_tensor(con, "c{1}"), A * B)


def test_nulls(llapi):
    run_ok(*llapi, "LLAPI.NULLS")


def test_failed_check_is_reported(llapi):
    """A check that fails replies an error naming it (so that the OK replies above mean every check passed)."""
    srv, con = llapi
    con.delete("m{1}")
    text = error_text(con.execute_command, "LLAPI.MODELRUN")
    assert text.startswith("check failed: model m{1} in the keyspace, of type ModelRedisType at llapi_test.c:"), text
    con.delete("a{1}")
    text = error_text(con.execute_command, "LLAPI.SCRIPTRUN")
    assert text.startswith("check failed: tensors a{1} and b{1} in the keyspace at llapi_test.c:"), text
    assert "wrong number of arguments" in error_text(con.execute_command, "LLAPI.VERSION", "x")
    assert srv.responsive()


# =================================================================================================
# what the server reports about runs made through the API


def test_ai_info_counts_dag_ops(llapi):
    """AI.INFO counts the model and script ops of DAGs built with the API, as for AI.DAGEXECUTE; ops refused
    when added or at DAGRun count nothing."""
    srv, con = llapi
    m0, s0 = ai_info(con, "m{1}"), ai_info(con, "myscript{1}")
    run_ok(srv, con, "LLAPI.DAGRUN")
    m1, s1 = ai_info(con, "m{1}"), ai_info(con, "myscript{1}")
    # the DAG built op by op and the one parsed from a string
    assert (m1["calls"] - m0["calls"], m1["errors"] - m0["errors"]) == (2, 0), (m0, m1)
    # bar, then no_function (an error)
    assert (s1["calls"] - s0["calls"], s1["errors"] - s0["errors"]) == (2, 1), (s0, s1)


@pytest.mark.parametrize("how", ["ASYNC", "SYNC"])
def test_ai_info_counts_failed_api_runs(llapi, how):
    """RedisAI's test_model_run_async: a run of m{1} without inputs (it fails), then a proper one; AI.INFO then
    says calls 2, errors 1, samples 2, as RedisAI did. The failed run counts as a failed run through a command does
    (one call, one error of kind backend), though no backend executed it."""
    srv, con = llapi
    assert con.execute_command("AI.INFO", "m{1}", "RESETSTAT") == b"OK"
    run_ok(srv, con, "LLAPI.FAILTHENRUN", how)
    reply = con.execute_command("AI.INFO", "m{1}")
    assert reply[12:] == [b"samples", 2, b"calls", 2, b"errors", 1], reply
    info = ai_info(con, "m{1}")
    assert (info["errors_backend"], info["errors_refused"], info["errors_timeout"]) == (1, 0, 0), info
    assert info["executions"] == 1, info
    # the same kind of failure through a command: one more call and one more error
    set_tensor(con, "i{1}", np.array([[1, 2]], dtype=np.int32))
    with pytest.raises(redis.exceptions.ResponseError):
        con.execute_command("AI.MODELEXECUTE", "m{1}", "INPUTS", 2, "i{1}", "b{1}", "OUTPUTS", 1, "c{1}")
    after = ai_info(con, "m{1}")
    assert (after["calls"], after["errors"], after["errors_backend"]) == (3, 2, 2), after


def test_info_modules_api_version(llapi):
    srv, con = llapi
    version = con.execute_command("LLAPI.VERSION")
    assert srv.info("modules")["ai_low_level_API_version"] == str(version) == "1"


# =================================================================================================
# loading


def test_refused_without_the_ai_module(make_server):
    """RedisAI_Initialize fails (logging the first function it misses) when the module is not loaded, and the
    client module's load with it; loaded after the module, the same file loads."""
    module = llapi_module()
    srv = make_server(load_module=False, name="no_ai")
    reply = srv.raw("MODULE", "LOAD", module)
    assert isinstance(reply, RespError), reply
    assert "llapi_test" not in module_names(srv.raw("MODULE", "LIST"))
    assert "could not initialize RedisAI_InitError" in srv.log()
    assert srv.raw("MODULE", "LOAD", MODULE_PATH, *srv.module_arguments()) == "OK"
    assert srv.raw("MODULE", "LOAD", module) == "OK"
    assert srv.raw("LLAPI.VERSION") == 1


def test_server_refuses_to_start_with_it_loaded_first(make_server):
    """--loadmodule order matters: the client module first, and the server exits at start."""
    srv = make_server(load_module=False, start=False, name="wrong_order",
                      server_args=["--loadmodule", llapi_module(), "--loadmodule", MODULE_PATH])
    with pytest.raises(pytest.fail.Exception):
        srv.start()
    assert not srv.is_alive()
    assert "could not initialize RedisAI_InitError" in srv.log()
    srv.stop()  # the fixture's teardown must not take the exit for a crash


# =================================================================================================
# async runs under load


def test_async_runs_from_many_clients(llapi):
    """4 clients send LLAPI.MODELRUN (sync, batched and async runs of m{1}) 20 times each while a fifth runs
    m{1} and m2{1} with AI.MODELEXECUTE: every reply OK, every AI.MODELEXECUTE output right."""
    srv, _ = llapi
    problems = []
    clients = [srv.client(socket_timeout=CLIENT_TIMEOUT) for _ in range(5)]

    def llapi_client(con):
        try:
            for _ in range(20):
                reply = con.execute_command("LLAPI.MODELRUN")
                if reply != b"OK":
                    problems.append(reply)
        except Exception as e:  # a failed check's error reply, or a dropped connection
            problems.append(repr(e))

    def plain_client(con, stop):
        try:
            i = 0
            while not stop.is_set():
                model = ("m{1}", "m2{1}")[i % 2]
                out = f"out{i % 4}{{1}}"
                assert con.execute_command("AI.MODELEXECUTE", model, "INPUTS", 2, "a{1}", "b{1}",
                                           "OUTPUTS", 1, out) == b"OK"
                np.testing.assert_array_equal(get_tensor(con, out), A * B)
                i += 1
        except Exception as e:
            problems.append(repr(e))

    stop = threading.Event()
    plain = threading.Thread(target=plain_client, args=(clients[4], stop))
    threads = [threading.Thread(target=llapi_client, args=(c,)) for c in clients[:4]]
    plain.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    stop.set()
    plain.join(CLIENT_TIMEOUT)
    assert not any(t.is_alive() for t in threads + [plain]), "a client is stuck"
    assert problems == []
    assert srv.responsive()
