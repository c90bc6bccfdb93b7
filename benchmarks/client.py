"""A bare HTTP/1.1 keep-alive client for benchmarks that send requests one at a time.

Why not httpx: on this 2-core machine httpx spends 0.5-1 ms of the client's own CPU on a
small request (and tens of ms moving a 10 MB body), time that lands in every latency
measured and competes with the servers for the cores; a benchmark then compares clients
as much as systems. This client writes one prebuilt request and reads the answer into
one buffer: about 50 us a request. It speaks only what the benchmarks need: POST with a
body, answers with Content-Length (chunked answers are refused), one connection.
Where a benchmark needs no per-request logic it uses wrk (common.py) instead.
"""

from __future__ import annotations

import json as jsonlib
import socket
from urllib.parse import urlsplit


class ClientError(RuntimeError):
    """The server closed the connection or answered outside what this client reads."""


class _ClosedBeforeAnswer(ClientError):
    """The connection closed before a byte of the answer arrived."""


class Answer:
    """The parts of an answer the benchmarks read (httpx-like names)."""

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes):
        self.status_code = status_code
        self.headers = headers  # lower-case names
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return jsonlib.loads(self.content)


class BareClient:
    """``with BareClient() as http: http.post(url, content=..., headers=...)``; every
    URL must be on the host and port of the first one posted to."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.origin: tuple[str, int] | None = None
        self.pending = b""  # bytes read past the previous answer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def post(self, url: str, content: bytes = b"", json=None, headers: dict[str, str] | None = None) -> Answer:
        parts = urlsplit(url)
        origin = (parts.hostname or "127.0.0.1", parts.port or 80)
        if self.origin is None:
            self.origin = origin
        elif origin != self.origin:
            raise ClientError(f"this client talks to {self.origin[0]}:{self.origin[1]} only, not {url}")
        head = {"content-type": "application/json"} if json is not None else {}
        if json is not None:
            content = jsonlib.dumps(json).encode()
        head.update({k.lower(): v for k, v in (headers or {}).items()})
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {path} HTTP/1.1", f"host: {origin[0]}:{origin[1]}", f"content-length: {len(content)}"]
        lines += [f"{k}: {v}" for k, v in head.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        reused = self.sock is not None
        try:
            return self._exchange(origin, request, content)
        except _ClosedBeforeAnswer:
            if not reused:
                raise ClientError("the server closed the connection without answering") from None
        # A server closes a kept-alive connection it found idle (uvicorn after 5 s), and
        # the close can cross our request: the request was not answered, so sending it
        # again on a new connection is safe here (benchmarks, idempotent reads). Once.
        try:
            return self._exchange(origin, request, content)
        except _ClosedBeforeAnswer:
            raise ClientError("the server closed the connection without answering") from None

    def _exchange(self, origin, request: bytes, content: bytes) -> Answer:
        if self.sock is None:
            self.sock = socket.create_connection(origin, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.pending = b""
        try:
            try:
                if len(content) < 65536:
                    self.sock.sendall(request + content)
                else:  # no copy of a large body
                    self.sock.sendall(request)
                    self.sock.sendall(content)
            except (BrokenPipeError, ConnectionResetError):
                raise _ClosedBeforeAnswer() from None
            return self._read_answer()
        except (OSError, ClientError):
            self.close()  # the next request starts on a new connection
            raise

    def _read_answer(self) -> Answer:
        data = self.pending
        if not data:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                raise _ClosedBeforeAnswer()
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv()
        head, rest = data[:end].decode("latin-1").split("\r\n"), data[end + 4 :]
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise ClientError(f"not an HTTP status line: {head[0]!r}") from None
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise ClientError(f"answer without Content-Length (headers: {sorted(headers)})")
        size = int(headers["content-length"])
        if len(rest) >= size:
            self.pending = rest[size:]
            return Answer(status, headers, rest[:size])
        body = bytearray(size)
        body[: len(rest)] = rest
        view, got = memoryview(body), len(rest)
        while got < size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ClientError("the server closed the connection mid-answer")
            got += n
        self.pending = b""
        return Answer(status, headers, bytes(body) if size < 65536 else body)

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ClientError("the server closed the connection")
        return chunk
