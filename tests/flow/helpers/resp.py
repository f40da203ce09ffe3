"""RESP2 on a plain socket: encode a command, read replies exactly as sent (errors as RespError)."""

import socket


class RespError(str):
    """An error reply, with the full text as sent (e.g. ``ERR invalid value``)."""


def encode_command(args):
    """A command (str, bytes, int or float arguments) as a RESP multi-bulk request."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        elif isinstance(a, (int, float)):
            b = repr(a).encode()
        else:
            raise TypeError(f"cannot send {type(a)}")
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class RespReader:
    """Reads RESP2 replies from a socket: status as str, errors as RespError, bulk strings as bytes."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self):
        line = self.line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RespError(rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ValueError(f"unexpected RESP line {line!r}")


def raw_command(port, *args, timeout=30.0):
    """Send one command on a fresh connection and return the RESP2 reply as sent (errors as RespError)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(encode_command(args))
        return RespReader(s).reply()


class RawClient:
    """A raw RESP connection: send commands without waiting for their replies (to queue work)."""

    def __init__(self, port, timeout=60.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.reader = RespReader(self.sock)

    def send(self, *args):
        self.sock.sendall(encode_command(args))

    def reply(self):
        return self.reader.reply()

    def call(self, *args):
        """Send one command and return its reply."""
        self.send(*args)
        return self.reply()

    def close(self):
        self.sock.close()
