"""The two-process floor: the least any server that keeps the model out of the HTTP
process can do per request -- an HTTP process that relays the raw body over a Unix socket
to one worker process, which computes the floor's pipeline in-process (the floor's own
code: benchmarks/floor_server.py for e2e, ``--app matrix`` for every cell of the matrix,
benchmarks/matrix.py) and sends back the answer's bytes.

No parsing in the relay, no Table, no routing, no deadlines, no retries, no metrics, no
fault handling: what is left is two processes and two hops. Both sides can busy-poll for
``--busy-poll-ms`` after a message (as FlowServe's gateway and executors do by default),
so the figure is the two-process design's own cost, not a sleeping process's wake-up.

    python benchmarks/relay_server.py --port 8002 [--busy-poll-ms 10] [--app matrix]

e2e and matrix measure it beside the floor and FlowServe (``python -m benchmarks e2e
--relay``, ``python -m benchmarks matrix --relay``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time

_HEAD = struct.Struct("<IIHB")  # body length, request id, flow (its index in the app's paths), Arrow (1) or JSON
_ANSWER = struct.Struct("<II")  # answer length, request id
APPS = ("e2e", "matrix")


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def paths(app: str) -> list[bytes]:
    """The app's flow paths; a request's flow is its path's index here."""
    if app == "e2e":
        return [b"/flows/ensemble", b"/flows/cascade"]
    from benchmarks import matrix

    return [f"/flows/{name}".encode() for name in matrix.floor_cells()]


def computer(app: str):
    """``compute(flow, arrow, body) -> answer bytes`` for the app's flows, in the floor's code."""
    if app == "e2e":
        from benchmarks.floor_server import compute  # its models pin one torch thread, as in every system

        return lambda flow, arrow, body: compute(flow, body)
    from benchmarks import matrix

    runs = list(matrix.floor_cells().values())
    return lambda flow, arrow, body: matrix.floor_answer(runs[flow], body, matrix.ARROW if arrow else matrix.JSON)


# -- the worker: the floor's code, fed by the socket ---------------------------------------------


def _recv_exact(sock: socket.socket, n: int, hot_until: list) -> bytes:
    """``n`` bytes from a non-blocking socket: polled (sched_yield between tries) while hot,
    else waited for in the kernel."""
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("relay closed")
            buf += chunk
            continue
        except BlockingIOError:
            pass
        if time.perf_counter() < hot_until[0]:
            os.sched_yield()
        else:
            sel.select(1.0)
    sel.close()
    return bytes(buf)


def worker(path: str, busy_poll_ms: float, app: str) -> None:
    sys.path.insert(0, _root())
    compute = computer(app)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    print("READY", flush=True)
    conn, _ = listener.accept()
    conn.setblocking(False)
    poll_s = busy_poll_ms / 1000.0
    hot_until = [0.0]
    while True:
        try:
            length, rid, flow, arrow = _HEAD.unpack(_recv_exact(conn, _HEAD.size, hot_until))
            body = _recv_exact(conn, length, hot_until)
        except ConnectionError:
            return
        answer = compute(flow, arrow, body)
        conn.setblocking(True)
        conn.sendall(_ANSWER.pack(len(answer), rid) + answer)
        conn.setblocking(False)
        hot_until[0] = time.perf_counter() + poll_s


# -- the relay: a bare ASGI app under uvicorn (no framework), one connection to the worker -----------


class Relay:
    def __init__(self, path: str, busy_poll_ms: float, app: str):
        self.path = path
        self.flows = {p: i for i, p in enumerate(paths(app))}
        self.poll_s = busy_poll_ms / 1000.0
        self.waiting: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.writer = None
        self._hot_until = 0.0
        self._polling = False

    async def start(self) -> None:
        reader, self.writer = await asyncio.open_unix_connection(self.path)
        asyncio.get_running_loop().create_task(self._answers(reader))

    async def _answers(self, reader) -> None:
        while True:
            length, rid = _ANSWER.unpack(await reader.readexactly(_ANSWER.size))
            answer = await reader.readexactly(length)
            fut = self.waiting.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(answer)

    def _poll(self) -> None:
        """Keep the loop turning (a ready callback makes it poll without sleeping) while hot."""
        if self.waiting and time.perf_counter() < self._hot_until:
            os.sched_yield()
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self._polling = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        flow = self.flows.get(scope["raw_path"])
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if flow is None:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        rid = self.next_id = self.next_id + 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        arrow = any(k == b"content-type" and v.startswith(b"application/vnd.apache.arrow") for k, v in scope["headers"])
        self.writer.write(_HEAD.pack(len(body), rid, flow, arrow) + body)
        if self.poll_s:
            self._hot_until = time.perf_counter() + self.poll_s
            if not self._polling:
                self._polling = True
                asyncio.get_running_loop().call_soon(self._poll)
        answer = await fut
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--busy-poll-ms", type=float, default=10.0)
    p.add_argument("--app", choices=APPS, default="e2e", help="whose flows: e2e's two, or every matrix cell")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.busy_poll_ms, args.app)
    import uvicorn

    sys.path.insert(0, _root())
    path = os.path.join(tempfile.mkdtemp(prefix="relay-"), "worker.sock")
    child = subprocess.Popen(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--port",
            "0",
            "--busy-poll-ms",
            str(args.busy_poll_ms),
            "--app",
            args.app,
            "--worker",
            path,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "READY"
        uvicorn.run(Relay(path, args.busy_poll_ms, args.app), port=args.port, log_level="warning", lifespan="on")
    finally:
        child.terminate()
        child.wait()


if __name__ == "__main__":
    main()
