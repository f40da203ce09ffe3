"""pytest harness for the redisai-rs flow tests.

Every test talks to a real ``redis-server`` (or ``valkey-server``) that this file starts itself, with the
module loaded, on a free port on 127.0.0.1, in its own temporary directory (kept after the run, so the
log files can be read afterwards; pytest keeps the last few base temp dirs).

Environment:
  REDISAI_MODULE     path of the module (default: <repo>/target/release/libredisai.so)
  REDIS_SERVER       server binary (default: redis-server; valkey-server works too)
  REDISAI_ONNX_LIB   if set, the module is loaded with ``ONNX <that path>`` (likewise REDISAI_TF_LIB, REDISAI_TFLITE_LIB)
  REDISAI_LOG_TAIL   number of log lines shown for a failed test (default 200)
  REDISAI_LLAPI_MODULE  the C client module of test_llapi.py (default: <repo>/target/llapi/libllapi_test.so)

Fixtures:
  server        a fresh server for this test; ``@pytest.mark.server_args("--appendonly", "yes")`` and
                ``@pytest.mark.module_args("THREADS_PER_QUEUE", "2")`` change how it is started
  make_server   factory: ``make_server(server_args=[...], module_args=[...], load_module=True)``
  make_replica  factory: ``make_replica(master, server_args=[...])`` starts a server, REPLICAOF master,
                waits until the link is up
  module_server one server shared by the tests of a file (started once, default args)
  con           a client of ``module_server`` after FLUSHALL (the cheap default for tests that do not
                need their own server)
  port          the port of that shared server, for raw RESP (helpers.resp.raw_command)

This file holds only the fixtures and pytest hooks. Everything the tests import lives in the package
``helpers`` next to it (tests/flow is on sys.path under pytest): ``from helpers.checks import check_error``.
  helpers/server.py       RedisServer, server_flavor, the paths and environment (REPO_ROOT, DATA_DIR,
                          MODULE_PATH, SERVER_BIN, ONNX_LIB, ...)
  helpers/resp.py         RESP on a socket: raw_command, RespError, RespReader, RawClient, encode_command
  helpers/checks.py       check_error, check_error_raw, error_text, wait_for, module_names
  helpers/data.py         files of tests/data: DATA_DIR, data_blob, weights (tests/data/weights.py)
  helpers/onnx_models.py  ONNX models, tensor / INFO helpers, Request, generated models (`onnx` package)
  helpers/torch_models.py TorchScript models, script sources and script calls
  helpers/tf_models.py    the committed TF graphs, tf_store, a GraphDef reader and numpy evaluator
  helpers/tflite_models.py the committed TFLITE models, tfl_store, a hand-built WHILE model
  helpers/tf_graphs.py    hand-encoded TensorFlow GraphDefs
  helpers/dag.py          DAG commands (dag_cmd) and tensors as numpy arrays (tset, tget)
  helpers/rdb.py          DUMP payloads built byte by byte (RDB encoding, CRC-64, AI_TENSOR / AI__MODEL layouts)
  helpers/recorded.py     the cases recorded from RedisAI (tests/data/redisai-dumps.json), assert_reply
  helpers/admission.py    refused models kept but never run (test_security_onnx.py, test_security_tflite.py)
  helpers/watch.py        inotify on a file the server must not touch
  helpers/aof.py          reading the AOF, waiting for rewrites
No test file imports another: what two test files share lives here. Where each test lives: tests/README.md.
"""

import os

import pytest

from helpers.server import (MODULE_PATH, ONNX_LIB, SERVER_BIN, RedisServer, check_still_alive, register_for_report,
                            safe_name, server_flavor)


# --------------------------------------------------------------------------------------------------
# pytest hooks


def pytest_configure(config):
    config.addinivalue_line("markers", "server_args(*args): extra redis-server arguments for the `server` fixture")
    config.addinivalue_line("markers", "module_args(*args): extra module load arguments for the `server` fixture")
    config.addinivalue_line("markers", "in_process: the test is about in-process execution (inline runs, the "
                            "queue threads' own CPU time): its servers run backends in Redis's process whatever "
                            "REDISAI_EXECUTION_MODE says")
    # An exception in a test's own thread (a client thread of a concurrency test) fails that test: pytest alone
    # only warns, and the thread's checks would be lost without a trace.
    config.addinivalue_line("filterwarnings", "error::pytest.PytestUnhandledThreadExceptionWarning")


def pytest_report_header(config):
    try:
        flavor, version = server_flavor()
        ver = f"{flavor} {'.'.join(map(str, version))}"
    except BaseException:
        ver = "unknown version"
    exists = "" if os.path.isfile(MODULE_PATH) else " (MISSING)"
    return [f"redisai flow tests: server {SERVER_BIN} ({ver}), module {MODULE_PATH}{exists}"
            + (f", ONNX {ONNX_LIB}" if ONNX_LIB else "")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    for srv, since in getattr(item, "_redis_servers", []):
        if since and srv.log_size() < since:  # restarted with a fresh log? show all of it
            since = 0
        tail = srv.failure_excerpt(since=since)
        state = "running" if srv.is_alive() else f"exited with {srv.proc.returncode if srv.proc else None}"
        rep.sections.append((f"redis-server log: {srv.describe()} [{state}], full log {srv.logfile}",
                             tail or "(empty log)"))


# --------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def make_server(request, tmp_path_factory):
    """Factory for servers owned by this test: make_server(server_args=[...], module_args=[...])."""
    servers = []

    def factory(server_args=(), module_args=(), load_module=True, name=None, start=True):
        if request.node.get_closest_marker("in_process"):
            module_args = ["EXECUTION_MODE", "IN_PROCESS", *module_args]
        name = name or f"server{len(servers)}"
        d = tmp_path_factory.mktemp(f"{safe_name(request.node.name)}-{name}")
        srv = RedisServer(d, server_args=server_args, module_args=module_args,
                          load_module=load_module, name=name)
        servers.append(srv)
        register_for_report(request.node, srv)
        if start:
            srv.start()
        return srv

    yield factory
    try:
        check_still_alive(servers)
    finally:
        for s in reversed(servers):  # replicas (started later) before their masters
            s.stop()


@pytest.fixture
def make_replica(make_server):
    """make_replica(master, server_args=[...], module_args=[...]) -> a synced replica of `master`."""

    def factory(master, server_args=(), module_args=(), name=None, timeout=30.0):
        rep = make_server(server_args=server_args, module_args=module_args, name=name or "replica")
        rep.replicaof(master, timeout=timeout)
        return rep

    return factory


@pytest.fixture
def server(request, make_server):
    """A fresh server for this test (see the server_args / module_args markers)."""
    server_args, module_args = [], []
    for m in request.node.iter_markers("server_args"):
        server_args = list(m.args) + server_args
    for m in request.node.iter_markers("module_args"):
        module_args = list(m.args) + module_args
    return make_server(server_args=server_args, module_args=module_args, name="server")


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, request):
    """One server for all tests of a module that use it; tests get it through `con`/`shared_server`."""
    d = tmp_path_factory.mktemp(f"{safe_name(request.module.__name__)}-shared")
    srv = RedisServer(d, name="module")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def shared_server(request, module_server):
    """The module-scoped server after FLUSHALL (restarted first if an earlier test killed it)."""
    if not module_server.responsive():
        module_server.kill()
        module_server.start()
    register_for_report(request.node, module_server, log_from_now=True)
    # SYNC: Valkey 8+ flushes asynchronously by default (lazyfree-lazy-user-flush yes), and a model freed on its
    # background thread after the next test started would still show in that test's AI.INFO / AI._MODELSCAN.
    reply = module_server.raw("FLUSHALL", "SYNC")
    assert reply == "OK", f"FLUSHALL failed: {reply!r}"
    yield module_server
    check_still_alive([module_server])


@pytest.fixture
def con(shared_server):
    """A redis-py client of the shared server (empty keyspace)."""
    return shared_server.client()


@pytest.fixture
def port(shared_server):
    """The port of the shared server, for raw RESP checks (helpers.resp.raw_command, checks.check_error_raw)."""
    return shared_server.port
