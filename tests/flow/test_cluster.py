"""The module in a local 3-shard Redis Cluster: key positions reported through the getkeys API (COMMAND GETKEYS) let
the cluster route AI.MODELEXECUTE / AI.DAGEXECUTE by their keys (models, LOAD/PERSIST keys, ROUTING) and refuse
cross-slot commands with Redis's own CROSSSLOT error. Models are per shard: a model is stored on the shard that
owns its key's slot.

Shards are started by `make_server` with `--cluster-enabled yes` and joined with
`redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes` (REDIS_CLI names another binary).
"""

import os
import random
import shutil
import socket
import subprocess

import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from helpers.checks import wait_for
from helpers.data import DATA_DIR, weights
from helpers.resp import RespError
from helpers.server import SERVER_BIN


ONNX_LIB = os.environ.get("REDISAI_ONNX_LIB")

CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"


def cli_binary():
    if os.environ.get("REDIS_CLI"):
        return os.environ["REDIS_CLI"]
    server_dir = os.path.dirname(shutil.which(SERVER_BIN) or SERVER_BIN)
    for name in ("redis-cli", "valkey-cli"):
        local = os.path.join(server_dir, name)
        if os.path.isfile(local) and os.access(local, os.X_OK):
            return local
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def blob(name):
    return (DATA_DIR / f"{name}.onnx").read_bytes()


def cluster_info(srv):
    text = srv.raw("CLUSTER", "INFO")
    assert isinstance(text, bytes), text
    return dict(line.split(":", 1) for line in text.decode().split("\r\n") if ":" in line)


def cluster_ready(nodes):
    for s in nodes:
        info = cluster_info(s)
        if info.get("cluster_state") != "ok" or info.get("cluster_slots_assigned") != "16384" \
                or info.get("cluster_known_nodes") != str(len(nodes)):
            return False
        slots = s.raw("CLUSTER", "SLOTS")
        if not isinstance(slots, list) or len(slots) != len(nodes):
            return False
    return True


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken):
    """A free port <= 55535 whose cluster bus port (+10000) is free too (redis refuses higher ones)."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(20000, 30000)
        if port not in taken and port + 10000 not in taken and _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture
def cluster(make_server):
    cli = cli_binary()
    if not cli:
        pytest.fail("redis-cli (or valkey-cli) not found: set REDIS_CLI")
    nodes = []
    for i in range(3):
        srv = make_server(name=f"shard{i}", start=False)
        srv.port = cluster_port({p for s in nodes for p in (s.port, s.port + 10000)})
        srv.server_args = ["--cluster-enabled", "yes", "--cluster-config-file", str(srv.dir / "nodes.conf"),
                           "--cluster-node-timeout", "5000"]
        srv.start()
        nodes.append(srv)
    out = subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in nodes],
                          "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{cli} --cluster create failed:\n{out.stdout}\n{out.stderr}"
    wait_for(lambda: cluster_ready(nodes), timeout=60, interval=0.1, what="cluster_state:ok on every shard")
    rc = RedisCluster(host="127.0.0.1", port=nodes[0].port, protocol=2, socket_timeout=30)
    try:
        yield nodes, rc
    finally:
        rc.close()


def owner(nodes, rc, key):
    """The server (of `nodes`) that owns the slot of `key`."""
    port = rc.get_node_from_key(key).port
    (srv,) = [s for s in nodes if s.port == port]
    return srv


def calls(srv, command):
    stats = srv.info("commandstats")
    entry = stats.get(f"cmdstat_{command}", "")
    return int(entry.split("calls=")[1].split(",")[0]) if entry else 0


def as_array(reply):
    assert reply[0] == b"dtype" and reply[2] == b"shape" and reply[4] == b"blob", reply
    return np.frombuffer(reply[5], dtype=np.float32).reshape(reply[3])


A = np.array([[1, 2, 3, 4], [-1, 0.5, 2, -3]], dtype=np.float32)


def test_cluster_modelexecute_and_dag_with_hash_tags(cluster):
    nodes, rc = cluster
    assert len({owner(nodes, rc, f"{{{t}}}").port for t in ("u1", "u2", "u3")}) == 3  # one tag per shard
    home = owner(nodes, rc, "{u1}")
    others = [s for s in nodes if s is not home]

    # the cluster client routes MODELSTORE / TENSORSET by key: the model lives on the shard of its slot only
    assert rc.execute_command("AI.MODELSTORE", "m{u1}", "ONNX", "CPU", "BLOB", blob("mul")) == b"OK"
    assert rc.execute_command("AI.MODELSTORE", "lin{u1}", "ONNX", "CPU:1", "BLOB", blob("linear")) == b"OK"
    assert rc.execute_command("AI.TENSORSET", "a{u1}", "FLOAT", 2, 4, "BLOB", A.tobytes()) == b"OK"
    assert home.client().execute_command("AI.MODELGET", "m{u1}", "META")[1] == b"ONNX"
    assert sorted(home.client().keys("*")) == [b"a{u1}", b"lin{u1}", b"m{u1}"]
    for s in others:
        assert s.client().keys("*") == []
        r = s.raw("AI.MODELGET", "m{u1}", "META")
        assert isinstance(r, RespError) and r.startswith(f"MOVED {key_slot(b'm{u1}')} "), r

    # MODELEXECUTE
    assert rc.execute_command("AI.MODELEXECUTE", "m{u1}", "INPUTS", 2, "a{u1}", "a{u1}", "OUTPUTS", 1,
                              "b{u1}") == b"OK"
    np.testing.assert_array_equal(as_array(rc.execute_command("AI.TENSORGET", "b{u1}", "META", "BLOB")), A * A)

    # DAGEXECUTE with LOAD / PERSIST and a model, all in slot {u1}
    ret = rc.execute_command("AI.DAGEXECUTE", "LOAD", 1, "a{u1}", "PERSIST", 1, "c{u1}",
                             "|>", "AI.MODELEXECUTE", "lin{u1}", "INPUTS", 1, "a{u1}", "OUTPUTS", 1, "h",
                             "|>", "AI.MODELEXECUTE", "m{u1}", "INPUTS", 2, "h", "h", "OUTPUTS", 1, "c{u1}",
                             "|>", "AI.TENSORGET", "c{u1}", "META", "BLOB")
    h = weights.linear(A)
    assert ret[:2] == [b"OK", b"OK"]
    np.testing.assert_allclose(as_array(ret[2]), h * h, rtol=1e-5)
    np.testing.assert_allclose(as_array(rc.execute_command("AI.TENSORGET", "c{u1}", "META", "BLOB")), h * h,
                               rtol=1e-5)
    assert home.client().exists("c{u1}") == 1

    # DAGEXECUTE_RO and the deprecated DAGRUN(_RO), routed by LOAD keys
    ret = rc.execute_command("AI.DAGEXECUTE_RO", "LOAD", 1, "a{u1}",
                             "|>", "AI.MODELEXECUTE", "m{u1}", "INPUTS", 2, "a{u1}", "a{u1}", "OUTPUTS", 1, "sq",
                             "|>", "AI.TENSORGET", "sq", "META", "BLOB")
    assert ret[0] == b"OK"
    np.testing.assert_array_equal(as_array(ret[1]), A * A)
    ret = rc.execute_command("AI.DAGRUN", "LOAD", 1, "a{u1}", "PERSIST", 1, "d{u1}",
                             "|>", "AI.MODELRUN", "lin{u1}", "INPUTS", "a{u1}", "OUTPUTS", "d{u1}")
    assert ret == [b"OK"]
    np.testing.assert_allclose(as_array(home.client().execute_command("AI.TENSORGET", "d{u1}", "META", "BLOB")), h,
                               rtol=1e-5)
    ret = rc.execute_command("AI.DAGRUN_RO", "LOAD", 1, "d{u1}", "|>", "AI.TENSORGET", "d{u1}", "META")
    assert ret == [[b"dtype", b"FLOAT", b"shape", [2, 3]]]


def test_cluster_dag_routing(cluster):
    nodes, rc = cluster
    home = owner(nodes, rc, "{u1}")
    assert rc.execute_command("AI.MODELSTORE", "m{u1}", "ONNX", "CPU", "BLOB", blob("mul")) == b"OK"

    # ROUTING {u1} with the model m{u1}: the client sends it to the shard of slot {u1} (checked through the
    # command statistics of every shard), where the model is
    before = {s.port: calls(s, "ai.dagexecute") for s in nodes}
    ret = rc.execute_command("AI.DAGEXECUTE", "ROUTING", "{u1}",
                             "|>", "AI.TENSORSET", "x", "FLOAT", 1, 2, "VALUES", 3, -2,
                             "|>", "AI.MODELEXECUTE", "m{u1}", "INPUTS", 2, "x", "x", "OUTPUTS", 1, "y",
                             "|>", "AI.TENSORGET", "y", "VALUES")
    assert ret == [b"OK", b"OK", [b"9", b"4"]]
    after = {s.port: calls(s, "ai.dagexecute") for s in nodes}
    assert {p: after[p] - before[p] for p in after} == {s.port: int(s is home) for s in nodes}

    # ROUTING alone decides the shard of a DAG without other keys
    for tag in ("u2", "u3"):
        target = owner(nodes, rc, f"{{{tag}}}")
        before = {s.port: calls(s, "ai.dagexecute_ro") for s in nodes}
        ret = rc.execute_command("AI.DAGEXECUTE_RO", "ROUTING", f"{{{tag}}}",
                                 "|>", "AI.TENSORSET", "x", "INT32", 2, "VALUES", 1, 2, "|>", "AI.TENSORGET", "x",
                                 "VALUES")
        assert ret == [b"OK", [1, 2]]
        after = {s.port: calls(s, "ai.dagexecute_ro") for s in nodes}
        assert {p: after[p] - before[p] for p in after} == {s.port: int(s is target) for s in nodes}
        # sent to another shard, the server itself redirects by the ROUTING value
        for s in nodes:
            if s is target:
                continue
            r = s.raw("AI.DAGEXECUTE_RO", "ROUTING", f"{{{tag}}}", "|>", "AI.TENSORSET", "x", "FLOAT", 1)
            assert isinstance(r, RespError) and r == f"MOVED {key_slot(tag.encode())} 127.0.0.1:{target.port}", r

    # the model is only on its own shard: a DAG routed to {u2} cannot use m{u2}
    target = owner(nodes, rc, "{u2}")
    with pytest.raises(redis.exceptions.ResponseError) as e:
        rc.execute_command("AI.DAGEXECUTE", "ROUTING", "{u2}", "|>", "AI.TENSORSET", "x", "FLOAT", 1,
                           "|>", "AI.MODELEXECUTE", "m{u2}", "INPUTS", 2, "x", "x", "OUTPUTS", 1, "y")
    assert str(e.value) == "model key is empty"
    assert target.client().keys("*") == []


def test_cluster_crossslot(cluster):
    nodes, rc = cluster
    home = owner(nodes, rc, "{u1}")
    assert owner(nodes, rc, "{u2}") is not home
    assert rc.execute_command("AI.MODELSTORE", "m{u1}", "ONNX", "CPU", "BLOB", blob("linear")) == b"OK"
    assert rc.execute_command("AI.TENSORSET", "a{u1}", "FLOAT", 2, 4, "BLOB", A.tobytes()) == b"OK"

    cross = [
        ["AI.MODELEXECUTE", "m{u1}", "INPUTS", 1, "a{u1}", "OUTPUTS", 1, "b{u2}"],
        ["AI.MODELRUN", "m{u1}", "INPUTS", "a{u1}", "OUTPUTS", "b{u2}"],
        ["AI.DAGEXECUTE", "LOAD", 1, "a{u1}", "PERSIST", 1, "b{u2}",
         "|>", "AI.MODELEXECUTE", "m{u1}", "INPUTS", 1, "a{u1}", "OUTPUTS", 1, "b{u2}"],
        ["AI.DAGEXECUTE", "ROUTING", "{u1}", "|>", "AI.TENSORSET", "t", "FLOAT", 1, 4,
         "|>", "AI.MODELEXECUTE", "m{u2}", "INPUTS", 1, "t", "OUTPUTS", 1, "o"],
        ["AI.DAGEXECUTE_RO", "LOAD", 1, "a{u1}", "ROUTING", "{u2}", "|>", "AI.TENSORGET", "a{u1}"],
    ]
    plain = home.client()
    for cmd in cross:
        # sent to the shard of {u1}: Redis refuses it with CROSSSLOT (from the keys the module reports)
        assert home.raw(*cmd) == RespError(CROSSSLOT), cmd
        with pytest.raises(redis.exceptions.ResponseError) as e:
            plain.execute_command(*cmd)
        assert isinstance(e.value, redis.exceptions.ClusterCrossSlotError) or "CROSSSLOT" in str(e.value), e.value
        # the cluster client finds the keys (COMMAND GETKEYS, i.e. the module's getkeys callback) in two slots
        # and refuses to send it: a client-side RedisClusterException, or a CROSSSLOT error from a server
        with pytest.raises((redis.exceptions.ResponseError, redis.exceptions.RedisClusterException)) as e:
            rc.execute_command(*cmd)
        text = str(e.value)
        assert isinstance(e.value, redis.exceptions.ClusterCrossSlotError) or "CROSSSLOT" in text \
            or "all keys must map to the same key slot" in text, text
    assert sorted(home.client().keys("*")) == [b"a{u1}", b"m{u1}"]
    for s in nodes:
        if s is not home:
            assert s.client().keys("*") == []
    assert calls(home, "ai.modelexecute") == 0
    assert calls(home, "ai.dagexecute") == 0
