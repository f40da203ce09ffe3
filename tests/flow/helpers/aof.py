"""Reading the AOF of a test server (Redis >= 7 multi-part AOF in appendonlydir/) and waiting for rewrites."""
from .checks import wait_for


def parse_resp_commands(data):
    """An AOF (RESP multi-bulk commands, `#...` annotations skipped) -> list of argument lists (bytes)."""
    cmds, i = [], 0
    while i < len(data):
        if data[i:i + 1] == b"#":
            i = data.index(b"\r\n", i) + 2
            continue
        assert data[i:i + 1] == b"*", f"unexpected AOF byte at {i}: {data[i:i + 20]!r}"
        j = data.index(b"\r\n", i)
        n = int(data[i + 1:j])
        i = j + 2
        args = []
        for _ in range(n):
            assert data[i:i + 1] == b"$"
            j = data.index(b"\r\n", i)
            ln = int(data[i + 1:j])
            args.append(data[j + 2:j + 2 + ln])
            i = j + 2 + ln + 2
        cmds.append(args)
    return cmds


def aof_files(server):
    """(base file path, [incr file paths]) of the current multi-part AOF."""
    d = server.dir / "appendonlydir"
    manifests = list(d.glob("*.manifest"))
    assert manifests, f"no AOF manifest in {d}"
    base, incr = None, []
    for line in manifests[0].read_text().splitlines():
        parts = line.split()
        name = parts[parts.index("file") + 1]
        kind = parts[parts.index("type") + 1]
        if kind == "b":
            base = d / name
        elif kind == "i":
            incr.append(d / name)
    return base, incr


def aof_commands(server, which="all", forbid_rdb=False):
    """Commands of the base ('base'), incremental ('incr') or all files; an RDB preamble base is skipped,
    or refused with forbid_rdb."""
    base, incr = aof_files(server)
    files = ([base] if which in ("all", "base") and base else []) + (incr if which in ("all", "incr") else [])
    out = []
    for f in files:
        if f.suffix == ".rdb":
            assert not forbid_rdb, f"AOF file {f.name} has an RDB preamble"
            continue
        out += parse_resp_commands(f.read_bytes())
    return out


def wait_rewrite_done(server, since):
    def done():
        info = server.info("persistence")
        return (info["aof_rewrite_in_progress"] == "0" and info["aof_rewrite_scheduled"] == "0"
                and int(info.get("aof_rewrites", "0")) > since)
    wait_for(done, 30, what="BGREWRITEAOF to finish")
    assert server.info("persistence")["aof_last_bgrewrite_status"] == "ok"


def bgrewriteaof(server, con):
    """BGREWRITEAOF, waiting first for the rewrite Redis starts on its own, then for ours."""
    wait_for(lambda: server.info("persistence")["aof_rewrite_in_progress"] == "0", 30, what="startup rewrite")
    since = int(server.info("persistence").get("aof_rewrites", "0"))
    con.bgrewriteaof()
    wait_rewrite_done(server, since)
