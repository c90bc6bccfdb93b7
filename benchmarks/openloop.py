"""An open-loop HTTP load generator: request i is sent at its trace time whatever the
answers do (wrk is closed loop: a slow server slows its own load and hides its queues).

Each request takes an idle keep-alive connection or opens one; a request's latency runs
from its scheduled time, so time spent waiting for the client counts against the server
as it would for a real caller. About 100 us of client CPU a request (asyncio streams,
prebuilt request bytes).

    lat_ms, ok, t_done = asyncio.run(replay(url, body, trace_ms))
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import numpy as np

IDLE_S = 4.0  # below the server's keep-alive timeout


def _request(url: str, body: bytes) -> bytes:
    u = urlsplit(url)
    head = (
        f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_answer(reader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if length:
        await reader.readexactly(length)
    return status


async def replay(url: str, body: bytes, trace_ms, timeout_s: float = 30.0, connections: int = 32):
    """Send ``body`` at each time of ``trace_ms`` (ms from now). Returns per request: its
    latency (ms; inf if it failed), whether it answered 200, and its finish time (s).
    ``connections`` are opened (and used once) before the trace starts, so that opening
    them is not timed; more are opened when that many requests are outstanding. A connection
    idle for ``IDLE_S`` is closed rather than reused: the server (uvicorn: 5 s keep-alive)
    may have closed it, and a request sent on it would fail for the client's sake."""
    u = urlsplit(url)
    host, port = u.hostname, u.port or 80
    raw = _request(url, body)
    idle: list = []
    for _ in range(connections):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(raw)
        await _read_answer(reader)
        idle.append((reader, writer, time.perf_counter()))
    n = len(trace_ms)
    lat = np.full(n, np.inf)
    ok = np.zeros(n, dtype=bool)
    done_at = np.zeros(n)
    t0 = time.perf_counter()

    async def one(i: int, at: float):
        delay = t0 + at / 1000.0 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        while idle and time.perf_counter() - idle[-1][2] > IDLE_S:
            idle.pop()[1].close()
        conn = idle.pop()[:2] if idle else await asyncio.open_connection(host, port)
        reader, writer = conn
        try:
            writer.write(raw)
            status = await asyncio.wait_for(_read_answer(reader), timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            writer.close()
            done_at[i] = time.perf_counter() - t0
            return
        now = time.perf_counter()
        lat[i] = (now - (t0 + at / 1000.0)) * 1000.0
        ok[i] = status == 200
        done_at[i] = now - t0
        idle.append((reader, writer, now))

    # each request's task is made at its time, not all up front: making thousands of tasks
    # (and their first steps) before the first request went out held the loop for 100-200
    # ms at the start of every run, and the first answers measured that wait (10,000
    # requests: the first 160 ms late, in every deployment alike)
    tasks = []
    for i, t in enumerate(trace_ms):
        delay = t0 + float(t) / 1000.0 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, float(t))))
    await asyncio.gather(*tasks)
    for _, w, _ in idle:
        w.close()
    return lat, ok, done_at
