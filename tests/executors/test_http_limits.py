"""Limits at the HTTP edge, met as an attacker on the same host would test them: a header
flood, too many headers, a client that sends its head or its body slowly, more
connections than allowed, more rows than allowed. Each gets its status (431/408/413) as a
JSON error or makes room (idle connections over the limit), the gateway's memory does not
grow, and other clients are unaffected."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from tests.executors.test_connection_hygiene import gateway_pid


@pytest.fixture(scope="module")
def c():
    config = ClusterConfig(
        executors=1,
        max_header_bytes=16 * 1024,
        max_headers=20,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        max_connections=40,
        max_rows=100,
    )
    with LocalCluster(config) as cluster:
        f = Flow("edge", schema={"x": int})
        f.map(lambda r: r.x + 1, names=["y"])
        cluster.deploy(f)
        cluster.close()  # its client's kept-alive connection would take one of the 40 slots
        yield cluster


def _sock(c) -> socket.socket:
    u = urlsplit(c.url)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    return s


def _answer(s: socket.socket) -> tuple[int, dict, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def _other_client(c):
    """A client sending good requests meanwhile; yields the list of (status, seconds)."""
    stop, seen = threading.Event(), []

    def run():
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                t0 = time.monotonic()
                r = http.post(c.url + "/flows/edge", json={"x": 1})
                seen.append((r.status_code, time.monotonic() - t0))

    t = threading.Thread(target=run)
    t.start()
    try:
        yield seen
        n, deadline = len(seen), time.monotonic() + 10
        while len(seen) < n + 3 and time.monotonic() < deadline:  # a few answers after the fault too
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(30)


def _unaffected(seen):
    assert seen and all(s == 200 for s, _ in seen), seen[:5]
    assert max(t for _, t in seen) < 2.0, max(t for _, t in seen)


def test_a_header_flood_is_refused_before_it_is_kept(c):
    gateway = gateway_pid(c)
    rss0 = _rss_mb(gateway)
    with _other_client(c) as seen:
        s = _sock(c)
        s.sendall(b"POST /flows/edge HTTP/1.1\r\nHost: x\r\nX-Flood: ")
        sent, status = 0, None
        with contextlib.suppress(OSError):
            while sent < 64 << 20:  # would be 64 MB of one header
                s.sendall(b"a" * (1 << 20))
                sent += 1 << 20
        status, headers, body = _answer(s)
        s.close()
    assert status == 431 and body["error"] == "HeadersTooLarge" and "16384 bytes" in body["message"]
    assert sent < 64 << 20  # the gateway closed the connection long before the flood ended
    assert _rss_mb(gateway) - rss0 < 20
    _unaffected(seen)


def test_too_many_headers(c):
    s = _sock(c)
    head = b"POST /flows/edge HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(30))
    s.sendall(head + b'content-type: application/json\r\ncontent-length: 8\r\n\r\n{"x": 1}')
    status, _, body = _answer(s)
    s.close()
    assert status == 431 and "more than 20 request headers" in body["message"]


def test_a_slow_head_and_a_stalled_body_get_408(c):
    with _other_client(c) as seen:
        slow = _sock(c)
        slow.sendall(b"POST /flows/edge HTTP/1.1\r\nHo")  # and nothing more
        stalled = _sock(c)
        stalled.sendall(
            b"POST /flows/edge HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"x":'
        )
        t0 = time.monotonic()
        s1, _, b1 = _answer(slow)
        s2, _, b2 = _answer(stalled)
        waited = time.monotonic() - t0
        slow.close()
        stalled.close()
    assert s1 == 408 and "headers not received within 1 s" in b1["message"]
    assert s2 == 408 and "request body too slow: 0 bytes in the last 1 s" in b2["message"]
    assert waited < 5
    _unaffected(seen)


def test_idle_connections_over_the_limit_make_room_for_newcomers(c):
    """The limit is 40: 45 sockets that send nothing close the 5 oldest (503s for a busy
    gateway, the eviction order and the idle timeout: test_connection_hygiene.py)."""
    idle = [_sock(c) for _ in range(45)]
    try:
        deadline = time.monotonic() + 10
        while not all(map(_closed, idle[:5])) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the sockets' state under a deadline
        assert [i for i, s in enumerate(idle) if _closed(s)] == [0, 1, 2, 3, 4]  # the oldest
        r = httpx.post(c.url + "/flows/edge", json={"x": 1}, timeout=10)  # one more: makes room too
        assert r.status_code == 200
    finally:
        for s in idle:
            s.close()


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s``, without blocking."""
    timeout = s.gettimeout()
    s.settimeout(0)  # (with a timeout, recv waits for data even when told not to)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        s.settimeout(timeout)


def test_more_rows_than_allowed_get_413(c):
    r = httpx.post(c.url + "/flows/edge", json=[{"x": i} for i in range(101)], timeout=30)
    assert r.status_code == 413 and r.json()["error"] == "TooManyRows" and "100 (max_rows)" in r.json()["message"]
    assert httpx.post(c.url + "/flows/edge", json=[{"x": i} for i in range(100)], timeout=30).status_code == 200


def test_a_large_body_in_the_same_packets_as_its_head_is_not_a_large_head(c):
    """The head limit counts the head: a 300 KB body arriving with it (one write) is served."""
    rows = [{"x": i} for i in range(100)]
    body = json.dumps(rows).encode() + b" " * 300_000  # JSON allows trailing whitespace
    s = _sock(c)
    s.sendall(
        b"POST /flows/edge HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )
    status, _, answer = _answer(s)
    s.close()
    assert status == 200 and len(answer["rows"]) == 100
