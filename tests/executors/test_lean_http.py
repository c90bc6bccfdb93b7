"""The data plane's lean HTTP path (executors/gateway/leanhttp.py) over real connections: which
requests it takes, and that it keeps HTTP's rules as the ASGI path did: keep-alive,
pipelined requests answered in order (mixed with requests the ASGI app answers), chunked
bodies, the body limit's 413, malformed requests 400 without harm to others, concurrent
clients, a poison row failing only its own request."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import uvicorn

from executors.gateway.http_server import HttpLimits, limited_protocol
from executors.gateway.leanhttp import flow_name
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow

LIMIT = 64 * 1024


def _boom(r):
    if r.x < 0:
        raise ValueError(f"poison row {r.x}")
    return r.x + 1


@pytest.fixture(scope="module")
def c():
    with LocalCluster(ClusterConfig(executors=1, max_body_bytes=LIMIT)) as cluster:
        f = Flow("inc", schema={"x": int})
        f.map(_boom, names=["y"])
        cluster.deploy(f)
        yield cluster


def _conn(url: str) -> socket.socket:
    u = urlsplit(url)
    return socket.create_connection((u.hostname, u.port), timeout=30)


def _post(name: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST /flows/{name} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def _read(f) -> tuple[int, dict, bytes]:
    """One answer from a connection's buffered reader (Content-Length or chunked)."""
    status = int(f.readline().split()[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while (size := int(f.readline(), 16)) > 0:
            body += f.read(size)
            f.readline()
        f.readline()
    else:
        body = f.read(int(headers.get("content-length", 0)))
    return status, headers, body


def _rows(body: bytes) -> list:
    return json.loads(body)["rows"]


def test_flow_name_takes_only_a_plain_invocation_target():
    assert flow_name(b"/flows/inc") == "inc"
    assert flow_name(b"/flows/inc?x=1") == "inc"
    for other in (b"/flows/", b"/flows", b"/flows/inc/feedback", b"/flows/a%20b", b"/healthz", b"/flows/\xc3\xa9"):
        assert flow_name(other) is None, other


def test_keep_alive_and_pipelined_requests_answered_in_order(c):
    # five requests in one write, a GET the ASGI app answers among them: five answers, in order
    burst = (
        _post("inc", b'{"x": 1}')
        + _post("inc", b'[{"x": 2}, {"x": 3}]')
        + b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n"
        + _post("nope", b'{"x": 1}')
        + _post("inc", b'{"x": 4}')
    )
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(burst)
        answers = [_read(f) for _ in range(5)]
        assert [a[0] for a in answers] == [200, 200, 200, 404, 200]
        assert [r["y"] for r in _rows(answers[0][2])] == [2]
        assert [r["y"] for r in _rows(answers[1][2])] == [3, 4]
        assert json.loads(answers[3][2])["error"] == "UnknownFlow"
        assert [r["y"] for r in _rows(answers[4][2])] == [5]
        assert all("connection" not in a[1] for a in answers)  # kept alive
        for i in range(20):  # and the connection goes on serving
            s.sendall(_post("inc", json.dumps({"x": i}).encode()))
            status, headers, body = _read(f)
            assert status == 200 and _rows(body)[0]["y"] == i + 1 and "x-qid-start" in headers


def test_http_1_0_and_connection_close_end_the_connection_after_the_answer(c):
    for request in (
        b'POST /flows/inc HTTP/1.0\r\ncontent-length: 8\r\n\r\n{"x": 1}',
        _post("inc", b'{"x": 1}', "connection: close\r\n"),
    ):
        with _conn(c.url) as s, s.makefile("rb") as f:
            s.sendall(request)
            status, headers, body = _read(f)
            assert status == 200 and _rows(body)[0]["y"] == 2
            assert headers.get("connection") == "close"
            assert f.read() == b""  # closed by the server


def test_a_chunked_body_is_read_whole(c):
    rows = json.dumps([{"x": i} for i in range(300)]).encode()
    pieces = [rows[i : i + 97] for i in range(0, len(rows), 97)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = b"POST /flows/inc HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(head)
        s.sendall(chunked[:500])  # in several packets
        s.sendall(chunked[500:])
        status, _, body = _read(f)
        assert status == 200 and [r["y"] for r in _rows(body)] == list(range(1, 301))


def test_expect_100_continue(c):
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(
            b"POST /flows/inc HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\nexpect: 100-continue\r\n"
            b"content-type: application/json\r\n\r\n"
        )
        assert f.readline().startswith(b"HTTP/1.1 100")
        assert f.readline() == b"\r\n"
        s.sendall(b'{"x": 7}')
        status, _, body = _read(f)
        assert status == 200 and _rows(body)[0]["y"] == 8


def test_an_oversized_body_gets_413_declared_or_chunked(c):
    big = json.dumps([{"x": 1}] * (LIMIT // 8)).encode()
    assert len(big) > LIMIT
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(_post("inc", big))
        status, _, body = _read(f)
        assert status == 413 and json.loads(body)["error"] == "PayloadTooLarge"
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (big[i : i + 8192] for i in range(0, len(big), 8192)))
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(b"POST /flows/inc HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n")
        status, _, body = _read(f)
        assert status == 413 and json.loads(body)["error"] == "PayloadTooLarge"
        s.sendall(_post("inc", b'{"x": 1}'))  # the rest of the body was read past: the next request is served
        status, _, body = _read(f)
        assert status == 200 and _rows(body)[0]["y"] == 2


@pytest.mark.parametrize(
    "garbage",
    [
        b"POST /flows/inc HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
        b"POST /flows/inc HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"\x00\x01\x02 nonsense\r\n\r\n",
    ],
)
def test_malformed_http_gets_400_and_harms_no_one(c, garbage):
    with _conn(c.url) as other, other.makefile("rb") as of:
        with _conn(c.url) as s, s.makefile("rb") as f:
            s.sendall(garbage)
            status, headers, _ = _read(f)
            assert status == 400 and headers.get("connection") == "close"
        other.sendall(_post("inc", b'{"x": 1}'))  # a connection opened before: still served
        status, _, body = _read(of)
        assert status == 200 and _rows(body)[0]["y"] == 2


def test_errors_keep_their_mapping(c):
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(_post("inc", b'{"x": "one"}'))
        status, _, body = _read(f)
        assert status == 400 and "'x'" in json.loads(body)["message"]
        s.sendall(_post("inc", b"{not json"))
        status, _, body = _read(f)
        assert status == 400 and json.loads(body)["error"] == "BadRequestError"
        s.sendall(_post("inc", b'{"x": 1}', "x-request-timeout: soon\r\n"))
        status, _, body = _read(f)
        assert status == 400 and "X-Request-Timeout" in json.loads(body)["message"]
        s.sendall(_post("inc", b'{"x": -1}'))
        status, _, body = _read(f)
        err = json.loads(body)
        assert status == 500 and "poison row -1" in err["message"] and err.get("operator")


def test_concurrent_clients_and_a_poison_row_harms_only_its_request(c):
    def client(k: int) -> list:
        out = []
        with _conn(c.url) as s, s.makefile("rb") as f:
            for i in range(30):
                x = -1 if k == 0 and i % 3 == 0 else k * 1000 + i
                s.sendall(_post("inc", json.dumps({"x": x}).encode()))
                status, headers, body = _read(f)
                out.append((x, status, body, int(headers.get("x-qid-start", -1))))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(client, range(8)) for r in rs]
    assert len(results) == 240
    qids = []
    for x, status, body, qid in results:
        if x < 0:
            assert status == 500 and "poison" in json.loads(body)["message"]
        else:
            row = _rows(body)[0]
            assert status == 200 and row["y"] == x + 1 and row["qid"] == qid
            qids.append(qid)
    assert len(set(qids)) == len(qids)  # every request its own query id


def test_metrics_count_lean_answers(c):
    def count(text: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("flowserve_requests_total{") and 'flow="inc"' in line and 'status="200"' in line
        )

    def metrics() -> str:
        with _conn(c.url) as s, s.makefile("rb") as f:
            s.sendall(b"GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n")
            return _read(f)[2].decode()

    before = count(metrics())
    with _conn(c.url) as s, s.makefile("rb") as f:
        for _ in range(5):
            s.sendall(_post("inc", b'{"x": 1}'))
            assert _read(f)[0] == 200
    assert count(metrics()) == before + 5


# -- which path answers: a server with an app that says which of its doors was used ----------


class TwoDoors:
    """An app with the gateway's lean entry (``answer``/``send``) and an ASGI one."""

    def __init__(self):
        self.release = threading.Event()

    async def answer(self, name, raw_headers, receive, hangup=None):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        doc = {"door": "lean", "name": name, "body": body.decode(), "headers": len(raw_headers)}
        return 200, json.dumps(doc).encode(), [(b"content-type", b"application/json")]

    @staticmethod
    async def send(send, status, body, extra):
        raise AssertionError("only whole answers here")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = json.dumps({"door": "asgi", "path": scope["path"]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def two_doors():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        TwoDoors(), log_level="warning", http=limited_protocol(HttpLimits()), lifespan="off", proxy_headers=False
    )  # as the gateway hosts configure it (daemon.py, standalone.py)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    started = threading.Event()
    while not server.started:
        started.wait(0.01)  # the server thread sets .started; nothing to wait on but polling it
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def test_invocations_take_the_lean_path_and_the_rest_the_asgi_app(two_doors):
    cases = [
        (_post("m", b"{}"), {"door": "lean", "name": "m", "body": "{}"}),
        (_post("m", b"{}").replace(b"/flows/m", b"/flows/m?q=1"), {"door": "lean", "name": "m"}),
        (_post("m", b"{}").replace(b"/flows/m", b"/flows/m/feedback"), {"door": "asgi"}),
        (_post("m", b"{}").replace(b"/flows/m", b"/flows/a%20b"), {"door": "asgi", "path": "/flows/a b"}),
        (b"GET /flows/m HTTP/1.1\r\nhost: t\r\n\r\n", {"door": "asgi", "path": "/flows/m"}),
        (b"PUT /flows/m HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n", {"door": "asgi"}),
    ]
    with _conn(two_doors) as s, s.makefile("rb") as f:
        s.sendall(b"".join(request for request, _ in cases))  # pipelined, both doors mixed
        for _, want in cases:
            status, headers, body = _read(f)
            doc = json.loads(body)
            assert status == 200 and {k: doc.get(k) for k in want} == want
            assert headers["server"] == "uvicorn" and "date" in headers  # uvicorn's own headers on both


def test_a_client_gone_before_its_answer_harms_no_one(c):
    for _ in range(5):
        with _conn(c.url) as s:
            s.sendall(_post("inc", b'{"x": 1}'))  # and closes at once, before the answer
    with _conn(c.url) as s, s.makefile("rb") as f:
        s.sendall(_post("inc", b'{"x": 2}'))
        status, _, body = _read(f)
        assert status == 200 and _rows(body)[0]["y"] == 3
