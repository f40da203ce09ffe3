"""Watching a file for opens and reads (inotify(7), Linux): the security tests put a secret file in the server's
working directory and fail if the server touched it."""
import ctypes
import os
import struct


class Inotify:
    """Every open/read of one file."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        wd = self.libc.inotify_add_watch(self.fd, str(path).encode(), self.IN_ACCESS | self.IN_OPEN)
        assert wd >= 0, os.strerror(ctypes.get_errno())

    def events(self):
        """The masks of the events since the last call."""
        out = []
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return out
            i = 0
            while i < len(data):
                _wd, mask, _cookie, length = struct.unpack_from("iIII", data, i)
                out.append(mask)
                i += 16 + length

    def close(self):
        os.close(self.fd)


def watched_secret(server, content):
    """Generator for a fixture: writes `content` to secret.txt in the server's working directory, yields its path,
    and fails if the server opened or read it meanwhile."""
    path = os.path.join(server.client().config_get("dir")["dir"], "secret.txt")
    with open(path, "wb") as f:
        f.write(content)
    watch = Inotify(path)
    # the watch works: our own read shows up
    with open(path, "rb") as f:
        assert f.read() == content
    assert watch.events(), "inotify saw nothing"
    try:
        yield path
        assert watch.events() == [], "the server opened or read secret.txt"
    finally:
        watch.close()
        os.remove(path)
