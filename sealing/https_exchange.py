"""One keep-alive HTTPS connection's request and answer, with little Python per exchange.

Why not http.client: a holder's whole upload is one small request, and http.client spent
more CPU on it than the holder's two HPKE seals and its signature together (the request
assembled header by header, the answer's headers parsed by the email package, a response
object per answer): about 250 us of the ~570 us a load process spent per holder. Here a
request is one buffer and one TLS write, and an answer is a status line, the few headers
HTTP/1.1 framing needs (Content-Length, Transfer-Encoding: chunked, Connection: close),
then its body. Standard library only; the server is verified against the caller's context
(certificate and host name) exactly as http.client does.
"""
from __future__ import annotations

import socket
import ssl


class HttpError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it (the connection is dropped)."""


MAX_LINE = 65536
MAX_HEADERS = 100
MAX_INTERIM = 10        # 1xx answers before the real one


class Exchange:
    """One TLS connection to ``host:port``; :meth:`request` sends one request and reads its
    answer. Any failure closes it (the caller reopens); so does ``Connection: close``."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, timeout: float):
        raw = socket.create_connection((host, port), timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = ctx.wrap_socket(raw, server_hostname=host)
        except BaseException:
            raw.close()
            raise
        self.file = self.sock.makefile("rb")
        self.head = f"Host: {host}:{port}\r\nAccept-Encoding: identity\r\n".encode()
        self.open = True

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        """``(status, body)`` of one request; raises (and closes) on any transport failure."""
        try:
            parts = [f"{method} {path} HTTP/1.1\r\n".encode(), self.head]
            for name, value in (headers or {}).items():
                parts.append(f"{name}: {value}\r\n".encode())
            if body is not None or method in ("POST", "PUT"):
                parts.append(b"Content-Length: %d\r\n" % len(body or b""))
            parts.append(b"\r\n")
            if body:
                parts.append(body)
            self.sock.sendall(b"".join(parts))      # one write: one TLS record for small ones
            return self._answer(method)
        except ValueError as exc:                 # a number that does not parse
            self.close()
            raise HttpError(f"the answer's framing does not parse ({exc})") from None
        except BaseException:
            self.close()
            raise

    def _answer(self, method: str, interim: int = 0) -> tuple[int, bytes]:
        line = self.file.readline(MAX_LINE + 1)
        version, _, rest = line.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise HttpError(f"not an HTTP/1.x status line: {line[:80]!r}")
        status = int(rest[:3])
        length, chunked, close = None, False, version == b"HTTP/1.0"
        for _ in range(MAX_HEADERS + 1):
            line = self.file.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n"):
                break
            if not line.endswith(b"\n"):
                raise HttpError("the answer's headers end early or a header line is too long")
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        else:
            raise HttpError(f"more than {MAX_HEADERS} header lines in an answer")
        if 100 <= status < 200:                   # an interim answer: the real one follows
            if interim >= MAX_INTERIM:
                raise HttpError(f"more than {MAX_INTERIM} interim (1xx) answers to one request")
            return self._answer(method, interim + 1)
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif chunked:
            body = self._chunks()
        elif length is not None:
            body = self._exactly(length)
        else:
            body, close = self.file.read(), True  # framed by the connection's end
        if close:
            self.close()
        return status, body

    def _chunks(self) -> bytes:
        out = []
        while True:
            size = int(self.file.readline(MAX_LINE + 1).split(b";", 1)[0], 16)
            if size < 0:
                raise HttpError(f"a chunk of negative size ({size})")
            if size == 0:
                while self.file.readline(MAX_LINE + 1) not in (b"\r\n", b"\n", b""):
                    pass                          # trailers, unused
                return b"".join(out)
            out.append(self._exactly(size))
            self._exactly(2)                      # the chunk's CRLF

    def _exactly(self, n: int) -> bytes:
        data = self.file.read(n)
        if len(data) != n:
            raise HttpError(f"the connection ended {n - len(data)} bytes before the answer's end")
        return data

    def close(self) -> None:
        if self.open:
            self.open = False
            self.file.close()
            self.sock.close()
