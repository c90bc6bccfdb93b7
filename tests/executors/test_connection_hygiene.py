"""Connection hygiene at the HTTP edge (executors/gateway/http_server.py), met over real sockets against
real gateways: idle sockets cannot fill the connection limit (the idle longest make room,
and the idle timeout closes them), a body must keep a minimum rate, and an error answer is
closed lingering, so the client reads it instead of a reset."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import statistics
import time
from urllib.parse import urlsplit

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow


def _edge_flow() -> Flow:
    f = Flow("edge", schema={"x": int, "s": float})
    f.map(lambda r: (time.sleep(r.s), r.x + 1)[1], names=["y"])  # s: how long the request is in progress
    return f


def _addr(c) -> tuple[str, int]:
    u = urlsplit(c.url)
    return u.hostname, u.port


def _sock(c, timeout: float = 10) -> socket.socket:
    return socket.create_connection(_addr(c), timeout=timeout)


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /flows/edge HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (len(body), extra)
    ) + body


def _answer(s: socket.socket) -> tuple[int, dict, bytes]:
    """One answer: (status, headers, body). Raises ConnectionResetError where a client would."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError(f"the connection closed before an answer; got {data[:80]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (an end or a reset is waiting), without blocking."""
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


def _wait_until(condition, seconds: float, poll: float = 0.02):
    """Poll ``condition`` until it is true or ``seconds`` pass; returns its last value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(poll)  # polling a condition under a deadline
    return value


def gateway_pid(c) -> int:
    """The process that accepted a connection of ours: the gateway (/proc/net/tcp names the
    accepted socket's inode, /proc/<pid>/fd its owner)."""
    with _sock(c) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        _answer(s)  # accepted and answered: the server's socket exists
        ours = s.getsockname()[1]
        server_port = _addr(c)[1]
        inode = None
        for line in open("/proc/net/tcp").read().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == ours:
                inode = fields[9]
        assert inode, "the gateway's side of our connection is not in /proc/net/tcp"
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                            return int(pid)
    raise AssertionError("no process holds the gateway's side of our connection")


def _open_files_limit(pid: int) -> int:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


@contextlib.contextmanager
def _soft_open_files(n: int):
    """This process's soft open-file limit at ``n`` meanwhile (what a child inherits)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- 1,100 idle sockets against the default limit of 1,024 ----------------------------------


@pytest.fixture(scope="module")
def big():
    """A gateway at the default max_connections (1024), started with the common soft limit of
    1024 open files (it must raise its own), and an idle timeout long enough that only
    eviction closes idle sockets here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-file limit ({hard}) is too low for 1,100 sockets on each side")
    with _soft_open_files(1024):
        cluster = LocalCluster(ClusterConfig(executors=1, idle_timeout_s=120.0)).start()
    enough = soft if soft == resource.RLIM_INFINITY or soft >= 4096 else 4096
    with cluster, _soft_open_files(enough):  # this process holds the 1,100 sockets
        cluster.deploy(_edge_flow())
        yield cluster


def test_the_gateway_raises_its_open_file_limit_to_what_max_connections_needs(big):
    # 1024 connections and as many lingering, plus the headroom (serving.raise_open_files)
    assert _open_files_limit(gateway_pid(big)) >= 2 * 1024 + 1024


def test_1100_idle_sockets_make_room_for_a_client_instead_of_refusing_it(big):
    idle = []
    try:
        for _ in range(1100):
            idle.append(_sock(big))
        # the 76 oldest made room for the newest (eviction: the idle timeout is 120 s; a
        # connection this process's cluster client keeps may take one more)
        assert _wait_until(lambda: sum(map(_closed_by_server, idle)) >= 76, 10), sum(map(_closed_by_server, idle))
        closed = [_closed_by_server(s) for s in idle]
        first = sum(closed)
        assert 76 <= first <= 78 and closed[:first] == [True] * first, first

        # meanwhile a client is served: on new connections (the first makes room: each closes
        # when done) and on one kept alive (it makes room once)
        seen = []
        one_each = httpx.Limits(max_keepalive_connections=0)  # a new connection for every request
        with httpx.Client(timeout=10) as kept, httpx.Client(timeout=10, limits=one_each) as fresh:
            for i in range(100):
                for kind, client in (("new", fresh), ("kept", kept)):
                    t0 = time.monotonic()
                    r = client.post(big.url + "/flows/edge", json={"x": i, "s": 0})
                    seen.append((kind, r.status_code, time.monotonic() - t0))
        statuses = [status for _, status, _ in seen]
        times = sorted(t for _, _, t in seen)
        for kind in ("new", "kept"):
            ts = sorted(t for k, _, t in seen if k == kind)
            ok = sum(1 for k, status, _ in seen if k == kind and status == 200)
            print(
                f"\n1,100 idle sockets held, {kind} connections: {ok} answered 200, {len(ts) - ok} refused; "
                f"p50 {statistics.median(ts) * 1e3:.1f} ms, p99 {ts[-2] * 1e3:.1f} ms, max {ts[-1] * 1e3:.1f} ms"
            )
        assert statuses == [200] * 200, [s for s in seen if s[1] != 200][:5]
        assert times[-1] < 2.0, times[-1]
        # the oldest made that room (one for the kept-alive connection, one for each new one
        # that came before the gateway saw the last one close); the others are still open
        closed = [_closed_by_server(s) for s in idle]
        now = sum(closed)
        assert first + 1 <= now <= first + 101 and closed[:now] == [True] * now, (first, now)
    finally:
        for s in idle:
            s.close()


# -- eviction order and the 503 when every connection is busy -------------------------------


@pytest.fixture(scope="module")
def small():
    config = ClusterConfig(executors=1, threads=8, max_connections=8, idle_timeout_s=120.0, header_timeout_s=30.0)
    with LocalCluster(config) as cluster:
        cluster.deploy(_edge_flow())
        cluster.close()  # its client's kept-alive connection would take one of the 8 slots
        yield cluster


def _kept_alive(c) -> socket.socket:
    """A connection that served a request and is idle between requests."""
    s = _sock(c)
    s.sendall(_post(b'{"x": 1, "s": 0}'))
    assert _answer(s)[0] == 200
    return s


def test_fresh_idle_sockets_make_room_first_and_kept_alive_ones_survive_a_flood(small):
    kept = [_kept_alive(small) for _ in range(4)]
    fresh = [_sock(small) for _ in range(4)]  # 8: the limit
    flood = []
    try:
        for _ in range(20):  # newcomers that send nothing: each closes the oldest that sent nothing
            flood.append(_sock(small))
        _wait_until(lambda: all(map(_closed_by_server, fresh + flood[:16])), 10)
        closed = [_closed_by_server(s) for s in flood]
        n = sum(closed)
        assert all(map(_closed_by_server, fresh)) and closed[:n] == [True] * n and n == 16, closed
        assert not any(map(_closed_by_server, kept))
        for i, s in enumerate(kept):  # the kept-alive connections still serve
            s.sendall(_post(b'{"x": %d, "s": 0}' % i))
            status, _, body = _answer(s)
            assert status == 200 and json.loads(body)["rows"][0]["y"] == i + 1
    finally:
        for s in kept + fresh + flood:
            s.close()


def _in_progress(c, seconds: float) -> socket.socket:
    """A connection whose request is in progress for ``seconds`` once this returns: its head
    asks for 100-continue, which the gateway sends when it starts reading the body."""
    body = b'{"x": 1, "s": %g}' % seconds
    s = _sock(c)
    s.sendall(_post(body, b"expect: 100-continue\r\n")[: -len(body)])
    assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.sendall(body)
    return s


def test_a_slow_head_makes_room_before_a_request_in_progress(small):
    busy = []
    try:
        slow = _sock(small)
        slow.sendall(b"POST /flows/edge HTTP/1.1\r\nhost: t\r\n")  # a head still arriving
        # 7 requests in progress for 3 s; the gateway read the slow head before their heads
        # (it was sent first), so it is a head arriving, no longer a socket yet to send
        busy = [_in_progress(small, 3) for _ in range(7)]
        newcomer = _sock(small)
        status, _, body = _answer(slow)  # 408, readable, not a reset
        assert status == 408 and "with the gateway at its limit of 8 connections" in json.loads(body)["message"]
        newcomer.sendall(_post(b'{"x": 2, "s": 0}'))
        assert _answer(newcomer)[0] == 200
        for s in busy:  # the requests in progress were not touched
            assert _answer(s)[0] == 200
        newcomer.close()
        slow.close()
    finally:
        for s in busy:
            s.close()


def test_a_newcomer_is_refused_503_only_when_every_connection_is_busy(small):
    busy = []
    try:
        busy = [_in_progress(small, 2) for _ in range(8)]
        t0 = time.monotonic()
        for _ in range(5):
            with _sock(small) as s:  # sends nothing: its answer comes unasked
                status, headers, body = _answer(s)
                assert status == 503 and headers.get("retry-after") == "1"
                assert json.loads(body)["error"] == "TooManyConnections"
        assert time.monotonic() - t0 < 1.5  # while the 8 are in progress
        for s in busy:
            assert _answer(s)[0] == 200  # answered, and now idle between requests
        with _sock(small) as s:  # so a newcomer makes room again
            s.sendall(_post(b'{"x": 3, "s": 0}'))
            assert _answer(s)[0] == 200
    finally:
        for s in busy:
            s.close()


# -- idle timeout -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def brief():
    config = ClusterConfig(executors=1, threads=8, max_connections=100, idle_timeout_s=0.4)
    with LocalCluster(config) as cluster:
        cluster.deploy(_edge_flow())
        big = Flow("big", schema={"n": int})
        big.map(lambda r: "a" * r.n, names=["s"])
        cluster.deploy(big)
        yield cluster


def test_sockets_that_send_nothing_are_closed_after_the_idle_timeout(brief):
    idle = [_sock(brief) for _ in range(150)]  # past the limit of 100: some make room, all time out
    try:
        with httpx.Client(timeout=10) as client:
            assert client.post(brief.url + "/flows/edge", json={"x": 1, "s": 0}).status_code == 200
        t0 = time.monotonic()
        assert _wait_until(lambda: all(map(_closed_by_server, idle)), 5)
        assert time.monotonic() - t0 < 2.0
    finally:
        for s in idle:
            s.close()


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout_but_not_while_busy(brief):
    with _sock(brief) as s:
        s.sendall(_post(b'{"x": 1, "s": 1.0}'))  # in progress for 1 s, longer than the idle timeout
        status, _, body = _answer(s)
        assert status == 200 and json.loads(body)["rows"][0]["y"] == 2
        t0 = time.monotonic()
        assert s.recv(1) == b""  # blocks until the server closes the idle connection
        idle_for = time.monotonic() - t0
        assert 0.3 < idle_for < 2.0, idle_for
    with _sock(brief) as s:  # a connection that keeps sending requests is not idle
        for i in range(6):
            s.sendall(_post(b'{"x": %d, "s": 0.15}' % i))
            assert _answer(s)[0] == 200


def test_a_slow_reader_gets_its_whole_answer_past_the_idle_timeout(brief):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # the answer waits in the gateway
    s.settimeout(10)
    s.connect(_addr(brief))
    with s:
        body = b'{"n": 6000000}'
        s.sendall(_post(body).replace(b"/flows/edge", b"/flows/big"))
        data, t0 = b"", time.monotonic()
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, _, got = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(got) < length:  # 64 KiB every 50 ms at most: seconds, many idle timeouts
            chunk = s.recv(65536)
            assert chunk, f"closed after {len(got)} of {length} bytes, {time.monotonic() - t0:.1f} s in"
            got += chunk
            time.sleep(0.05)  # the reader's pace
        assert time.monotonic() - t0 > 1.0 and json.loads(got)["rows"][0]["s"] == "a" * 6_000_000
        assert s.recv(1) == b""  # and once it is read, the idle connection is closed


# -- the body's minimum rate ----------------------------------------------------------------


@pytest.fixture(scope="module")
def rated():
    config = ClusterConfig(executors=1, body_timeout_s=0.5, min_body_rate=8192, max_body_bytes=1 << 20)
    with LocalCluster(config) as cluster:
        cluster.deploy(_edge_flow())
        yield cluster


def _send_paced(s: socket.socket, data: bytes, piece: int, every: float) -> None:
    """``data`` in pieces of ``piece`` bytes, one every ``every`` seconds (the link's pace)."""
    t0 = time.monotonic()
    for k, i in enumerate(range(0, len(data), piece)):
        s.sendall(data[i : i + piece])
        time.sleep(max(0.0, t0 + (k + 1) * every - time.monotonic()))


def test_a_steady_slow_body_longer_than_the_window_is_served(rated):
    body = b'{"x": 1, "s": 0}' + b" " * (160 * 1024 - 16)  # 160 KiB at 64 KiB/s: 2.5 s, five windows
    with _sock(rated) as s:
        s.sendall(_post(body)[: -len(body)])
        t0 = time.monotonic()
        _send_paced(s, body, 4096, 4096 / (64 * 1024))
        assert time.monotonic() - t0 > 2.0
        status, _, answer = _answer(s)
        assert status == 200 and json.loads(answer)["rows"][0]["y"] == 2


def test_a_trickling_body_gets_408_after_a_window_and_reads_it(rated):
    body = b'{"x": 1, "s": 0}' + b" " * 4000
    with _sock(rated) as s:
        s.sendall(_post(body)[: -len(body)])
        t0 = time.monotonic()
        for i in range(0, 3000, 100):  # 1 KB/s, under the 8 KiB/s asked, until the answer comes
            s.sendall(body[i : i + 100])
            if _wait_until(lambda: _readable(s), 0.1, poll=0.01):
                break
        answered = time.monotonic() - t0
        status, _, answer = _answer(s)
        err = json.loads(answer)
        assert status == 408 and err["error"] == "RequestTimeout" and "request body too slow" in err["message"]
        assert 0.45 < answered < 1.6, answered  # after the first window of 0.5 s


def _readable(s: socket.socket) -> bool:
    timeout = s.gettimeout()
    s.settimeout(0)
    try:
        return bool(s.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        s.settimeout(timeout)


# -- error answers are read, not reset --------------------------------------------------------


@pytest.fixture(scope="module")
def edge():
    config = ClusterConfig(executors=1, max_header_bytes=16 * 1024, max_headers=20, max_body_bytes=64 * 1024)
    with LocalCluster(config) as cluster:
        cluster.deploy(_edge_flow())
        yield cluster


LIMIT = 16 * 1024


def _head_of(exact: int, extra: bytes = b"") -> bytes:
    """A POST head whose counted size (URL, header names and values, 4 bytes a header; the
    limit's measure) is ``exact``."""
    fixed = [(b"host", b"t"), (b"content-type", b"application/json")]
    url, fixed = b"/flows/edge", fixed + ([(b"content-length", extra)] if extra else [])
    counted = len(url) + sum(len(n) + len(v) + 4 for n, v in fixed) + len(b"x-big") + 4
    lines = b"".join(b"%s: %s\r\n" % (n, v) for n, v in fixed)
    return b"POST %s HTTP/1.1\r\n%sx-big: %s\r\n\r\n" % (url, lines, b"a" * (exact - counted))


def _round_trip(c) -> None:
    """A request answered on another connection: the gateway has read what was sent to it
    before (its event loop takes ready sockets in the order they became ready)."""
    with _sock(c) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        _answer(s)


def _status_read(c, request: bytes, split: int | None = None, piece: int | None = None) -> int | str:
    """Send ``request`` (its first ``split`` bytes read by the gateway before the rest, or
    in pieces of ``piece`` bytes), then read: the status, or the error a client meets (what
    a reset looks like)."""
    with _sock(c) as s:
        try:
            if split is not None:
                s.sendall(request[:split])
                _round_trip(c)
                s.sendall(request[split:])
            elif piece is not None:
                for i in range(0, len(request), piece):
                    s.sendall(request[i : i + piece])
            else:
                s.sendall(request)
            return _answer(s)[0]
        except (OSError, EOFError) as e:
            return errno.errorcode.get(getattr(e, "errno", None) or 0, type(e).__name__)


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(_head_of(LIMIT + 1), id="limit+1"),
        pytest.param(_head_of(LIMIT + 1000), id="limit+1000"),
        pytest.param(_head_of(LIMIT + 1, b"2097152") + b" " * (2 << 20), id="limit+1 and a 2 MiB body"),
        pytest.param(_head_of(LIMIT + 200_000), id="limit+200000"),
        pytest.param(
            b"POST /flows/edge HTTP/1.1\r\nhost: t\r\n" + b"".join(b"x-%d: y\r\n" % i for i in range(20)) + b"\r\n",
            id="21 headers",
        ),
    ],
)
def test_every_head_over_the_limit_gets_a_431_the_client_reads(edge, request_):
    runs = 300 if len(request_) < 1 << 20 else 40
    seen = [_status_read(edge, request_) for _ in range(runs)]
    assert seen == [431] * runs, {x: seen.count(x) for x in set(seen)}


def test_a_431_is_read_by_a_client_still_sending_its_body(edge):
    head = _head_of(LIMIT + 1, b"2097152")
    request = head + b" " * (2 << 20)  # the body is sent after the gateway refused the head
    seen = [_status_read(edge, request, split=len(head)) for _ in range(40)]
    assert seen == [431] * 40, {x: seen.count(x) for x in set(seen)}


def test_a_head_over_the_limit_sent_in_pieces_gets_a_431_the_client_reads(edge):
    request = _head_of(LIMIT + 200_000)  # refused unparsed once LIMIT + HEAD_SLACK bytes came
    seen = [_status_read(edge, request, piece=4096) for _ in range(100)]
    seen += [_status_read(edge, request, split=LIMIT + 2000) for _ in range(20)]
    assert seen == [431] * 120, {x: seen.count(x) for x in set(seen)}


def test_a_head_at_the_limit_is_served_however_it_is_split(edge):
    request = _head_of(LIMIT, b"16") + b'{"x": 1, "s": 0}'
    for split in (None, 40, 9000, len(request) - 20):  # the last: the head's raw bytes are over LIMIT
        assert _status_read(edge, request, split) == 200, split


def test_an_oversized_head_on_a_kept_alive_connection_gets_its_431(edge):
    with _sock(edge) as s:
        s.sendall(_post(b'{"x": 1, "s": 0}'))
        assert _answer(s)[0] == 200
        s.sendall(_head_of(LIMIT + 1))
        status, _, body = _answer(s)
        assert status == 431 and json.loads(body)["error"] == "HeadersTooLarge"


@pytest.mark.parametrize("extra", [b"", b"connection: close\r\n"], ids=["kept-alive", "connection-close"])
def test_a_413_before_the_body_is_read_is_read_too(edge, extra):
    body = b" " * (2 << 20)  # declared over max_body_bytes: answered before it is read
    request = _post(body, extra)
    seen = [_status_read(edge, request) for _ in range(20)]
    seen += [_status_read(edge, request, split=len(request) - len(body)) for _ in range(20)]  # sent after the 413
    assert seen == [413] * 40, {x: seen.count(x) for x in set(seen)}


def test_malformed_http_gets_a_400_the_client_reads(edge):
    request = b"POST /flows/edge HTTP/1.1\r\ncontent-length: abc\r\n\r\n" + b"z" * (1 << 20)
    seen = [_status_read(edge, request) for _ in range(50)]
    assert seen == [400] * 50, {x: seen.count(x) for x in set(seen)}


@pytest.mark.parametrize("size, reused", [(2 << 20, False), (256 << 10, True)])
def test_an_early_413_says_whether_the_connection_serves_another_request(edge, size, reused):
    """The rest of a body answered early is read past when it is small (the connection then
    serves the next request) and not when it is big: then the answer says Connection: close,
    so a client that keeps connections never sends its next request on a closed one."""
    with httpx.Client(timeout=30) as http:
        first = http.post(f"{edge.url}/flows/edge", content=b" " * size)
        assert first.status_code == 413, first.text
        assert (first.headers.get("connection") == "close") is not reused, dict(first.headers)
        again = http.post(f"{edge.url}/flows/edge", json={"x": 1, "s": 0.5})  # on the same connection if kept
        assert again.status_code == 200, again.text
