"""The benchmarks' bare HTTP client against a real HTTP/1.1 server (the stdlib's)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.client import BareClient, ClientError


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/drop":  # read the request, close without answering
            self.close_connection = True
            return
        if self.path == "/chunked":  # an answer this client must refuse
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"0\r\n\r\n")
            return
        out = (
            body[::-1]
            if self.path == "/reverse"
            else json.dumps({"path": self.path, "type": self.headers["content-type"], "n": len(body)}).encode()
        )
        self.send_response(201 if self.path == "/created" else 200)
        self.send_header("content-length", str(len(out)))
        self.send_header("x-connection", str(self.client_address[1]))  # our port: one per connection
        self.end_headers()
        self.wfile.write(out)
        # as a server closing a kept-alive connection it found idle: no "Connection: close"
        self.close_connection = self.path == "/then-close"

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_answers_small_and_large_bodies_on_one_connection(server):
    big = bytes(range(256)) * (3 << 12)  # 3 MB: read in many recv calls
    with BareClient() as http:
        r1 = http.post(f"{server}/a?x=1", json={"k": 1})
        r2 = http.post(f"{server}/reverse", content=big, headers={"Content-Type": "application/octet-stream"})
        r3 = http.post(f"{server}/created", content=b"xyz")
    assert r1.status_code == 200 and r1.json() == {"path": "/a?x=1", "type": "application/json", "n": 8}
    assert r2.status_code == 200 and bytes(r2.content) == big[::-1]
    assert r3.status_code == 201 and r3.json()["n"] == 3
    assert r1.headers["x-connection"] == r2.headers["x-connection"] == r3.headers["x-connection"]


def test_refuses_what_it_cannot_read_and_other_origins(server):
    with BareClient() as http:
        with pytest.raises(ClientError, match="Content-Length"):
            http.post(f"{server}/chunked", content=b"x")
        assert http.post(f"{server}/again", content=b"x").status_code == 200  # a new connection
        with pytest.raises(ClientError, match="only"):
            http.post("http://127.0.0.1:1/elsewhere", content=b"x")


def test_resends_once_when_a_kept_alive_connection_was_closed(server):
    with BareClient() as http:
        first = http.post(f"{server}/then-close", content=b"x")
        second = http.post(f"{server}/after", content=b"xy")  # the old socket is closed: resent on a new one
        assert second.status_code == 200 and second.json()["n"] == 2
        assert first.headers["x-connection"] != second.headers["x-connection"]
        # a server that drops the request on a kept-alive connection and again on the
        # new one: one resend, then the error
        with pytest.raises(ClientError, match="without answering"):
            http.post(f"{server}/drop", content=b"x")


def test_open_loop_replay_sends_each_request_at_its_time_and_answers_all(server):
    """benchmarks/openloop.py: request i goes out no earlier than its trace time (open
    loop, each request's task made at its time) and every answer is counted."""
    import asyncio
    import time

    import numpy as np

    from benchmarks.openloop import replay

    trace = np.arange(40) * 5.0  # one every 5 ms
    started = time.perf_counter()
    lat, ok, done = asyncio.run(replay(f"{server}/a", b'{"k": 1}', trace, connections=2))
    assert ok.all() and np.isfinite(lat).all() and len(lat) == 40
    assert (done * 1000.0 >= trace).all()  # none answered before it was due to be sent
    assert time.perf_counter() - started >= trace[-1] / 1000.0
    lat, ok, _ = asyncio.run(replay(f"{server}/created", b"{}", np.zeros(3), connections=1))
    assert not ok.any() and np.isfinite(lat).all()  # answered, but not 200: not ok
