"""The gateway's HTTP server: uvicorn, with a graceful stop that keeps answering.

uvicorn closes its listening socket as soon as it is told to stop, so requests that arrive
while in-flight ones finish meet "connection refused". ``DrainingServer`` instead, on the
first SIGTERM/SIGINT, keeps the socket open and answers new requests 503 with
``Retry-After`` (``Gateway.accepting`` is false) until the requests in flight are answered
(at most ``drain_s``), then stops as uvicorn does. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from executors.errors import http_error
from executors.leanhttp import LeanCycle, flow_name

log = logging.getLogger("flowserve.gateway")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway, drain_s: float):
        super().__init__(config)
        self.gateway = gateway
        self.drain_s = drain_s
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self._loop is None:
            return super().handle_exit(sig, frame)  # a second signal, or not started: stop now
        self._draining = True
        self.gateway.accepting = False  # new requests: 503 + Retry-After, the socket stays open
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain(sig, frame)))

    async def _drain(self, sig, frame) -> None:
        await drain(self.gateway, self.drain_s)
        log.info("in-flight requests answered; stopping")
        super().handle_exit(sig, frame)


async def drain(gateway, seconds: float) -> None:
    """Refuse new requests (503 + Retry-After) and wait, at most ``seconds``, until the
    requests in flight are answered: the graceful stop of both gateway hosts."""
    gateway.accepting = False
    deadline = time.monotonic() + seconds
    while gateway.dispatcher.requests and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # bounded wait for the in-flight requests' own answers


# -- limits at the HTTP edge --------------------------------------------------------------


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of the gateway before its request is read (ClusterConfig)."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 1024


class OneWrite:
    """A connection's transport whose writes in one turn of the event loop leave together.

    uvicorn writes an answer's head as soon as it is started and its body after: two
    sends, and two wake-ups of the client, which on a small machine shares the cores with
    the gateway and the executors (benchmarks/README.md, #20: a bare uvicorn app served
    this way took 3 us less CPU a request at concurrency 8 and wrk got 1.4x the answers).
    Small writes are joined; a big one (a streamed answer's piece) is not copied."""

    JOIN_MAX = 64 * 1024

    __slots__ = ("_transport", "_loop", "_pending", "_size")

    def __init__(self, transport, loop):
        self._transport, self._loop = transport, loop
        self._pending: list = []
        self._size = 0

    def write(self, data) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._size += len(data)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def write_now(self, data) -> None:
        """``data`` (a whole answer) to the socket now, after what is pending: no turn of
        the loop waited for (leanhttp.py)."""
        if self._pending:
            self.write(data)
            return self.flush()
        if not self._transport.is_closing():
            self._transport.write(data)

    def flush(self) -> None:
        pending, size = self._pending, self._size
        if not pending:
            return
        self._pending, self._size = [], 0
        if self._transport.is_closing():
            return  # the connection went meanwhile (as a plain transport drops such writes)
        if len(pending) == 1:
            self._transport.write(pending[0])
        elif size <= self.JOIN_MAX:
            self._transport.write(b"".join(pending))
        else:
            for data in pending:
                self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written goes before the close, as on a plain transport
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def __getattr__(self, name):  # is_closing, abort, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


def limited_protocol(limits: HttpLimits):
    """uvicorn's httptools protocol with limits, checked before anything is parsed or kept:
    request head bytes and header count (431), time to send the head and the body (408),
    open connections (503 with Retry-After). A slow or flooding client costs a bounded
    amount of memory and time, and never stalls the others."""

    class LimitedHttpTools(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.transport = OneWrite(transport, self.loop)  # an answer's head and body: one write
            self._head_bytes = 0  # bytes received while the head is incomplete (bounds memory)
            self._exact_head = 0  # bytes of the URL and headers parsed (the exact limit)
            self._header_count = 0
            self._heads_done = 0
            self._in_head = True
            self._timer = None
            self._began = False
            # the app answers invocations itself (gateway.InvokeFastPath.answer): the lean path
            app = self.app
            self._invoker = app if hasattr(app, "answer") and self.limit_concurrency is None else None
            if len(self.connections) > limits.max_connections:
                self._reject(
                    "TooManyConnections", f"over the limit of {limits.max_connections} open connections; retry shortly"
                )

        def data_received(self, data: bytes) -> None:
            in_head = self._in_head
            heads = self._heads_done
            super().data_received(data)
            if in_head and self._heads_done == heads:  # no head completed in it: count what it holds so far
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes:
                    return self._reject(
                        "HeadersTooLarge", f"request headers over the limit of {limits.max_header_bytes} bytes"
                    )
            # a head or body left incomplete by this packet waits under its timer, armed once (a
            # request that came whole, most, arms none: two timers less per request)
            if self._timer is None and not self.transport.is_closing():
                if not self._in_head:
                    self._arm(limits.body_timeout_s, f"request body not received within {limits.body_timeout_s:g} s")
                elif self._began or self._head_bytes:
                    self._arm(
                        limits.header_timeout_s, f"request headers not received within {limits.header_timeout_s:g} s"
                    )

        def on_url(self, url: bytes) -> None:
            self._exact_head += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            self._exact_head += len(name) + len(value) + 4
            if self._header_count <= limits.max_headers and self._exact_head <= limits.max_header_bytes:
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads_done += 1
            self._disarm()
            if self._header_count > limits.max_headers:
                return self._reject("HeadersTooLarge", f"more than {limits.max_headers} request headers")
            if self._exact_head > limits.max_header_bytes:
                return self._reject(
                    "HeadersTooLarge", f"request headers over the limit of {limits.max_header_bytes} bytes"
                )
            self._began = False
            self._begin()

        def on_message_begin(self) -> None:
            # the ASGI scope is built in _begin, for a request the lean path does not take
            self.url, self.expect_100_continue, self.headers = b"", False, []
            self._began = True  # a head has started

        def _begin(self) -> None:
            """An invocation to the lean path (leanhttp.py), anything else to the ASGI app."""
            invoker, parser = self._invoker, self.parser
            if invoker is not None and parser.get_method() == b"POST" and not parser.should_upgrade():
                name = flow_name(self.url)
                if name is not None:
                    keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
                    existing = self.cycle
                    self.cycle = cycle = LeanCycle(self, invoker, name, keep_alive)
                    if existing is None or existing.response_complete:
                        self._start_asgi_task(cycle, None)
                    else:  # pipelined: started when the answers before it are written (uvicorn's queue)
                        self.flow.pause_reading()
                        self.pipeline.appendleft((cycle, None))
                    return
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            HttpToolsProtocol.on_message_begin(self)  # the scope, as uvicorn builds it
            self.url, self.expect_100_continue = url, expect
            self.headers = self.scope["headers"] = headers
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            self._in_head, self._head_bytes, self._exact_head, self._header_count = True, 0, 0, 0
            super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, seconds: float, why: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._reject, "RequestTimeout", why)

        def _disarm(self) -> None:
            if getattr(self, "_timer", None) is not None:
                self._timer.cancel()
                self._timer = None

        def _reject(self, error: str, message: str) -> None:
            """Answer the error (errors.http_error: its status and JSON body) if no answer
            has started, and close."""
            self._disarm()
            if self.transport.is_closing():
                return
            cycle = getattr(self, "cycle", None)
            if cycle is None or not cycle.response_started:
                status, body = http_error(error, message)
                head = [
                    b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode()),
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n",
                ]
                if status == 503:
                    head.append(b"retry-after: 1\r\n")
                self.transport.write(b"".join(head) + b"\r\n" + body)
            log.warning("closing a connection from %s: %s", self.client, message)
            self.transport.close()

    return LimitedHttpTools
