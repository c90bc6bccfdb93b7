"""The gateway's HTTP server: uvicorn, with a graceful stop that keeps answering, and the
limits at the HTTP edge (``HttpLimits``, ``limited_protocol``).

uvicorn closes its listening socket as soon as it is told to stop, so requests that arrive
while in-flight ones finish meet "connection refused". ``DrainingServer`` instead, on the
first SIGTERM/SIGINT, keeps the socket open and answers new requests 503 with
``Retry-After`` (``Gateway.accepting`` is false; /readyz says 503 too, so a load balancer
stops sending) until the requests in flight are answered (at most ``drain_s``), then closes
its listening socket, lets a connection accepted an instant before send its request (to
be refused, not cut), and stops as uvicorn does. A second signal stops at once. Every
answer given while draining is the last on its connection (``Connection: close``): a
client's next request opens a connection anew, so none is ever sent on a kept-alive
connection just as the server closes it (that request would be lost, neither refused nor
answered).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import select
import time
from dataclasses import dataclass

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from executors.errors import http_error
from executors.gateway.leanhttp import LeanCycle, flow_name

log = logging.getLogger("flowserve.gateway")


def serve(app, gateway, config, *, sockets=None, host: str = "127.0.0.1", port: int = 0) -> None:
    """Run a gateway's HTTP server until it is stopped: the one server setup of every
    gateway host (the local cluster's gateway process on the listening socket its
    supervisor holds, ``sockets``; the standalone gateway on ``host``:``port``). ``config``
    gives the HTTP limits (``http_limits()``) and how long a graceful stop drains
    (``request_timeout_s``). No access log (a line per request costs more than routing it;
    errors are logged where they happen) and no proxy headers (the client address is the
    socket's: a proxy in front is not trusted to say who called)."""
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=30,
            access_log=False,
            proxy_headers=False,
            http=limited_protocol(config.http_limits()),
        ),
        gateway,
        drain_s=config.request_timeout_s,
    )
    server.run(sockets=sockets)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway, drain_s: float):
        super().__init__(config)
        self.gateway = gateway
        self.drain_s = drain_s
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        limits = getattr(self.config.http_protocol_class, "limits", None)  # limited_protocol's
        if limits is not None:
            raise_open_files(limits.max_connections)
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self._loop is None:
            return super().handle_exit(sig, frame)  # a second signal, or not started: stop now
        self._draining = True
        self.gateway.accepting = False  # new requests: 503 + Retry-After, the socket stays open
        # here, not in _drain: a request read before the signal may be refused (503) before
        # _drain runs, and its answer must close its connection too
        for conn in list(self.server_state.connections):  # their answers in progress: the last on them
            cycle = getattr(conn, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain(sig, frame)))

    async def _drain(self, sig, frame) -> None:
        await drain(self.gateway, self.drain_s)
        await self._stop_listening()
        log.info("in-flight requests answered; stopping")
        super().handle_exit(sig, frame)

    async def _stop_listening(self) -> None:
        """Close the listening sockets, then give each connection that has brought no request
        yet (one accepted an instant before) ``CONNECTION_GRACE_S`` to send it, so that it is
        answered (503, ``Connection: close``) rather than cut: uvicorn's stop closes such a
        connection at once, and a request its client sent meanwhile would be lost, neither
        refused nor answered. A client that connects from now on is refused the connection,
        which tells it nothing was sent."""
        deadline = time.monotonic() + CONNECTION_GRACE_S
        listening = [sock.fileno() for server in self.servers for sock in server.sockets or ()]
        # a connection the kernel completed but the loop has not accepted yet would be reset
        # by the close (its request lost): close at an instant when none is pending
        while listening and time.monotonic() < deadline and select.select(listening, [], [], 0)[0]:
            await asyncio.sleep(0.005)  # the loop accepts them meanwhile
        for server in self.servers:
            server.close()  # a socket the supervisor holds stays open there: the next gateway takes it
        while time.monotonic() < deadline and any(no_request_yet(c) for c in self.server_state.connections):
            await asyncio.sleep(0.01)  # bounded wait for those clients' own requests (or their closing)


CONNECTION_GRACE_S = 1.0  # how long a stopping gateway waits for a request on a connection it accepted


def no_request_yet(connection) -> bool:
    """Whether a connection has brought no request yet: just opened, its client's first
    request maybe on its way. (A kept-alive connection idle after an answer is not waited
    for: every answer while draining closes its connection, so such a one was idle before.)"""
    return getattr(connection, "cycle", None) is None


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
    """What one client may hold of the gateway (the ClusterConfig fields of these names).

    max_header_bytes / max_headers: a request head larger (its URL and header names and
        values, 4 bytes more a header) or with more headers gets 431.
    header_timeout_s: a head not complete this long after its first byte gets 408.
    min_body_rate / body_timeout_s: a body must bring ``min_body_rate`` bytes a second,
        counted over each ``body_timeout_s`` window from the end of its head (the first
        window is its grace; a window always needs a byte), or get 408: a 100 MB upload
        over a slow but steady link is served, a trickle is cut after one window. A window
        in which the gateway itself stopped reading (its app not keeping up) does not count.
    idle_timeout_s: a connection with no request in progress (none yet, or between requests
        on a kept-alive one) is closed after this long (one whose last answer is still
        leaving: once it has left, which must go at ``min_body_rate``). It replaces
        uvicorn's ``timeout_keep_alive`` (5 s, never set by the gateway). Idle sockets make
        room at the limit whatever this is, so it only frees their descriptors sooner; 10 s
        outlasts the pools of httpx and Node (5 s), so their reuse of a connection never
        races its close; behind a load balancer, set it above the balancer's idle timeout
        (AWS ALB: 60 s).
    max_connections: open connections at most. A newcomer at the limit closes the connection
        idle longest (one yet to send a byte first, then one between requests, then one
        whose head is still arriving: 408), so idle sockets cannot fill it; only when every
        connection holds a request in progress is the newcomer refused (503, Retry-After).
    """

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_connections: int = 1024
    idle_timeout_s: float = 10.0
    min_body_rate: int = 1024


#: a head still arriving may hold this much more than max_header_bytes before it is refused
#: unparsed: its request line, line ends and spaces, which the exact count leaves out (so a
#: head within the limit is served however it is split into packets)
HEAD_SLACK = 1024
#: lingering close. Closing a socket whose client data is still unread makes the kernel
#: send a reset (RFC 1122 4.2.2.13), and a client still sending then fails on its send before
#: it reads the answer. After an error answer the gateway shuts its write side and reads and
#: drops what the client still sends, until the client closes, sends nothing for
#: LINGER_QUIET_S or LINGER_BYTES in all, or LINGER_S pass (nginx's lingering close, with
#: Go's shorter time: a flood costs little to drop, but a few MiB is all a client that
#: means well sends past a refused head or early answer)
LINGER_S = 2.0
LINGER_QUIET_S = 0.5
LINGER_BYTES = 4 << 20
#: an answer given before its request's body came (413, 401, 404...): the rest of the body
#: is read past so that the connection serves its next request, up to this much; past it,
#: the connection is closed (lingering)
DISCARD_BYTES = 1 << 20
#: open files a gateway needs besides its connections: the executors' and the KVS's
#: sockets, shared-memory segments, logs, connections being accepted or evicted
FD_HEADROOM = 1024


def raise_open_files(max_connections: int) -> int:
    """Raise this process's soft limit on open files towards its hard one, to what
    ``max_connections`` connections and as many lingering ones need; returns the limit.

    A soft limit of 1024 (common) makes accept() fail with EMFILE before the connection
    limit is reached, and asyncio then stops accepting for a second. The gateway does not
    use select(), which cannot take descriptors past 1023."""
    need = 2 * max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < need:
        log.warning(
            "max_connections=%d needs %d open files, but their hard limit is %d: connections past about %d fail",
            max_connections,
            need,
            hard,
            (hard - FD_HEADROOM) // 2,
        )
    return new


class OneWrite:
    """A connection's transport whose writes in one turn of the event loop leave together.

    uvicorn writes an answer's head as soon as it is started and its body after: two
    sends, and two wake-ups of the client, which on a small machine shares the cores with
    the gateway and the executors (benchmarks/README.md: a bare uvicorn app served
    this way took 3 us less CPU a request at concurrency 8 and wrk got 1.4x the answers).
    Small writes are joined; a big one (a streamed answer's piece) is not copied. After
    ``write_eof`` (a lingering close) it is closing: later writes are dropped. ``on_close``:
    asked first by ``close``; true when it closes the connection its own way (lingering)."""

    JOIN_MAX = 64 * 1024

    __slots__ = ("_transport", "_loop", "_pending", "_size", "_eof", "on_close")

    def __init__(self, transport, loop, on_close=None):
        self._transport, self._loop = transport, loop
        self._pending: list = []
        self._size = 0
        self._eof = False
        self.on_close = on_close

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
        if not self.is_closing():
            self._transport.write(data)

    def flush(self) -> None:
        pending, size = self._pending, self._size
        if not pending:
            return
        self._pending, self._size = [], 0
        if self.is_closing():
            return  # the connection went meanwhile (as a plain transport drops such writes)
        if len(pending) == 1:
            self._transport.write(pending[0])
        elif size <= self.JOIN_MAX:
            self._transport.write(b"".join(pending))
        else:
            for data in pending:
                self._transport.write(data)

    def is_closing(self) -> bool:
        return self._eof or self._transport.is_closing()

    def write_eof(self) -> None:
        self.flush()
        self._eof = True
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written goes before the close, as on a plain transport
        if self.on_close is None or not self.on_close():
            self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def __getattr__(self, name):  # abort, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


class _Flow(FlowControl):
    """uvicorn's flow control, noting that reading was paused (the app not keeping up with a
    body): a body-rate window with a pause in it is not the client's fault."""

    paused_once = False

    def pause_reading(self) -> None:
        self.paused_once = True
        super().pause_reading()


class _Room:
    """One server's connections that may be closed to make room or for idleness, each kind
    oldest first: a dict keeps insertion order, and adding, removing and finding the oldest
    are O(1) (amortized: the oldest is found past the slots freed since the dict last grew)."""

    __slots__ = ("fresh", "kept", "heads", "lingering", "sweep")

    def __init__(self):
        self.fresh: dict = {}  # connected, no byte yet: protocol -> since (loop time)
        self.kept: dict = {}  # between requests on a kept-alive connection: protocol -> since
        self.heads: dict = {}  # a head still arriving: protocol -> its first byte
        self.lingering: dict = {}  # closing after an error answer: protocol -> None
        self.sweep = None  # the timer that closes idle connections, while there are any

    def oldest(self):
        """The connection to close for a newcomer at the limit, or None: every one holds a
        request in progress."""
        for kind in (self.fresh, self.kept, self.heads):
            for protocol in kind:
                return protocol
        return None


class _Refused(Exception):
    """Stops the parser in a callback once a limit refused the request (its answer is written)."""


def limited_protocol(limits: HttpLimits):
    """uvicorn's httptools protocol with limits, checked before anything is parsed or kept:
    request head bytes and header count (431), time to send the head and the body's rate
    (408), idle connections closed, open connections (the idle longest make room; 503 with
    Retry-After when none is idle). Error answers close lingering, so the client reads
    them. A slow or flooding client costs a bounded amount of memory and time, and never
    stalls the others. A request that arrives whole arms no timer."""
    room = _Room()
    lingering = room.lingering
    idle_s = limits.idle_timeout_s
    head_s = limits.header_timeout_s
    window = limits.body_timeout_s
    need = max(1, int(limits.min_body_rate * window))  # bytes each window must bring
    head_max = limits.max_header_bytes + HEAD_SLACK
    too_big = f"request headers over the limit of {limits.max_header_bytes} bytes"

    def sweep(loop) -> None:
        """Close the connections idle for idle_timeout_s; again when the next one is due."""
        room.sweep = None
        cutoff = loop.time() - idle_s + 0.001  # a timer may run a hair early
        first = None
        for kind in (room.fresh, room.kept):
            expired = []
            for protocol, since in kind.items():
                if since > cutoff:
                    first = since if first is None else min(first, since)
                    break
                expired.append(protocol)
            for protocol in expired:
                del kind[protocol]
                protocol._idle = None
                protocol._close_idle()
        if first is not None:
            room.sweep = loop.call_at(first + idle_s, sweep, loop)

    class LimitedHttpTools(HttpToolsProtocol):
        discard_bytes = DISCARD_BYTES  # what of a body answered early is read past (leanhttp.py)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            # an answer's head and body: one write; a close with a body still coming: lingering
            self.transport = OneWrite(transport, self.loop, self._close_lingering)
            self.flow.__class__ = _Flow  # uvicorn's FlowControl, noting pauses (not made twice)
            self._head_bytes = 0  # bytes received while the head is incomplete (bounds memory)
            self._exact_head = 0  # bytes of the URL and headers parsed (the exact limit)
            self._header_count = 0
            self._heads_done = 0
            self._in_head = True
            self._began = False
            self._timer = None  # the head's, the body's window, or the lingering close's
            self._idle = None  # room.fresh, room.kept or room.lingering while in it
            self._got = 0  # bytes in this body window (lingering: dropped)
            self._early = None  # answered before its body came: bytes of it read past since
            # the app answers invocations itself (gateway.InvokeFastPath.answer): the lean path
            app = self.app
            self._invoker = app if hasattr(app, "answer") and self.limit_concurrency is None else None
            self._gateway = getattr(app, "gateway", None)  # its .accepting: false while it drains
            connections = self.connections
            while len(connections) > limits.max_connections:
                victim = room.oldest()
                if victim is None:
                    return self._reject(
                        "TooManyConnections",
                        f"over the limit of {limits.max_connections} open connections, all busy; retry shortly",
                    )
                victim._evict()
            self._rest(room.fresh)

        def data_received(self, data: bytes) -> None:
            idle = self._idle
            if idle is not None:
                if idle is lingering:  # (uvloop keeps a protocol's data_received: no swapping it)
                    return self._drop(data)
                del idle[self]  # a request begins
                self._idle = None
            in_head = self._in_head
            heads = self._heads_done
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:  # as uvicorn's data_received
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError:
                if not self.transport.is_closing():  # else a limit stopped the parser (_Refused)
                    self.logger.warning("Invalid HTTP request received.")
                    self.send_400_response("Invalid HTTP request received.")
                return
            if in_head and self._heads_done == heads:  # no head completed in it: count what it holds so far
                self._head_bytes += len(data)
                if self._head_bytes > head_max:
                    return self._reject("HeadersTooLarge", too_big, True)
            # a head or body left incomplete by this packet waits under its timer (a request
            # that came whole, most, arms none)
            if self._timer is None:
                if not self._in_head:
                    if not self.transport.is_closing():
                        self._arm_body()
                elif (self._began or self._head_bytes) and not self.transport.is_closing():
                    now = self.loop.time()
                    room.heads[self] = now  # a slow head makes room before a request in progress
                    self._timer = self.loop.call_at(now + head_s, self._head_late)
            else:
                self._got += len(data)
                early = self._early
                if early is not None:
                    early += len(data)
                    self._early = early
                    if early > DISCARD_BYTES:  # too much to read past: close instead
                        self._early = None
                        self._linger()

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
            if self._timer is not None:
                self._disarm()
            if self._header_count > limits.max_headers:
                self._reject("HeadersTooLarge", f"more than {limits.max_headers} request headers", True)
                raise _Refused  # parse no further (a body would find no request)
            if self._exact_head > limits.max_header_bytes:
                self._reject("HeadersTooLarge", too_big, True)
                raise _Refused
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
                    if self._gateway is not None and not self._gateway.accepting:
                        keep_alive = False  # draining: the last answer on this connection
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
            if self._gateway is not None and not self._gateway.accepting and self.cycle is not None:
                self.cycle.keep_alive = False  # draining: the last answer on this connection

        def on_message_complete(self) -> None:
            if self._timer is not None:
                self._disarm()
                if self._early is not None:  # the body answered early is read past: idle, once the loop is back
                    self._early = None
                    self.loop.call_soon(self._rest_if_done)
            self._in_head, self._head_bytes, self._exact_head, self._header_count = True, 0, 0, 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            """uvicorn's, with the connection idle (room.kept) in place of its keep-alive timer."""
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif self._timer is None:
                self._rest(room.kept)
            elif not self._in_head:  # answered before its body came: read past the rest (bounded)
                self._early = 0
            # else the next request's head is arriving, under its timer

        def send_400_response(self, msg: str) -> None:
            """uvicorn's 400 for a request it cannot parse, closed lingering."""
            content = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:
                content.extend([name, b": ", value, b"\r\n"])
            body = msg.encode("ascii")
            content.append(b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body))
            content += [b"connection: close\r\n\r\n", body]
            self.transport.write(b"".join(content))
            self._linger()

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._disarm()
            idle = self._idle
            if idle is not None:
                idle.pop(self, None)
                self._idle = None
            cycle = self.cycle
            super().connection_lost(exc)
            if cycle is not None and not cycle.response_complete and type(cycle) is LeanCycle:
                # the client left before its answer: the gateway gives the request up (its
                # work on the executors cancelled); an ASGI cycle's app learns it from receive()
                cycle.hangup.hang_up()

        # -- idle connections ------------------------------------------------------------

        def _rest(self, kind: dict) -> None:
            """No request in progress: idle (closed after idle_timeout_s, or to make room)."""
            now = self.loop.time()
            kind[self] = now
            self._idle = kind
            if room.sweep is None:
                room.sweep = self.loop.call_at(now + idle_s, sweep, self.loop)

        def _rest_if_done(self) -> None:
            cycle = self.cycle
            if (
                self._idle is None
                and self._timer is None
                and not self.pipeline
                and (cycle is None or cycle.response_complete)
                and not self.transport.is_closing()
            ):
                self._rest(room.kept)

        def _close_idle(self) -> None:
            """Closed for idleness or to make room: at once, or once its last answer has left."""
            size = self.transport.get_write_buffer_size()
            if not size:
                return self.transport.abort()
            # a slow reader: the answer goes first (a graceful close), as fast as a body must
            # come (min_body_rate), and the connection counts no more meanwhile
            self.connections.discard(self)
            self._enter_lingering()
            self._timer = self.loop.call_later(idle_s + size / max(1, limits.min_body_rate), self.transport.abort)
            self.transport.close()

        def _evict(self) -> None:
            """Closed to make room for a newcomer (connection_made): it counts no more now."""
            self.connections.discard(self)
            idle = self._idle
            if idle is not None:
                del idle[self]
                self._idle = None
                self._close_idle()
            else:
                since = self.loop.time() - room.heads[self]
                self._reject(
                    "RequestTimeout",
                    f"request headers not received after {since:.1f} s, with the gateway at its limit of "
                    f"{limits.max_connections} connections",
                    True,
                )

        # -- timers --------------------------------------------------------------------

        def _arm_body(self) -> None:
            self._got = 0
            self.flow.paused_once = self.flow.read_paused
            self._timer = self.loop.call_later(window, self._body_window)

        def _body_window(self) -> None:
            """A body window is over: enough came, or the gateway was not reading, or 408."""
            self._timer = None
            got, flow, cycle = self._got, self.flow, self.cycle
            if (
                got >= need
                or flow.read_paused
                or flow.paused_once
                or (cycle is not None and cycle.waiting_for_100_continue)  # the app has not asked for it yet
            ):
                return self._arm_body()
            if self._early is not None:  # answered already: the rest of the body is not worth waiting for
                self._early = None
                return self._linger()
            self._reject(
                "RequestTimeout",
                f"request body too slow: {got} bytes in the last {window:g} s, "
                f"at least {limits.min_body_rate} bytes/s needed",
            )

        def _head_late(self) -> None:
            self._timer = None
            room.heads.pop(self, None)
            self._reject("RequestTimeout", f"request headers not received within {head_s:g} s", True)

        def _disarm(self) -> None:
            self._timer.cancel()
            self._timer = None
            room.heads.pop(self, None)

        # -- error answers and lingering close -------------------------------------------

        def _reject(self, error: str, message: str, head: bool = False) -> None:
            """Answer the error (errors.http_error: its status and JSON body) and close,
            lingering. ``head``: about a head being parsed, answered once the answers before
            it are written; else about the request in progress, if its answer has not started."""
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if head:  # every answer before it written (an answer now would be taken for theirs)
                answer = cycle is None or (cycle.response_complete and not self.pipeline)
            else:
                answer = cycle is None or not cycle.response_started
            if answer:
                status, body = http_error(error, message)
                head_lines = [
                    STATUS_LINE[status],
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n",
                ]
                if status == 503:
                    head_lines.append(b"retry-after: 1\r\n")
                self.transport.write(b"".join(head_lines) + b"\r\n" + body)
            log.warning("closing a connection from %s: %s", self.client, message)
            self._linger()

        def _linger(self) -> None:
            """Close after an answer: shut the write side (the client reads the answer, then
            the end), read and drop what the client still sends, and close once it closes,
            goes quiet or the bounds are reached (LINGER_*)."""
            idle = self._idle
            if idle is lingering:
                return
            if self._timer is not None:
                self._disarm()
            if idle is not None:
                del idle[self]
                self._idle = None
            self.connections.discard(self)  # closing: out of the count (room.lingering bounds these)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:  # the app's receive() ends; its answer is dropped
                cycle.disconnected = True
                cycle.waiting_for_100_continue = False
                cycle.message_event.set()
            transport = self.transport
            if transport.is_closing():
                return
            self._enter_lingering()
            if not transport.can_write_eof():
                return transport.close()
            self.flow.resume_reading()
            transport.write_eof()
            self._got = self._seen = 0
            self._linger_end = self.loop.time() + LINGER_S
            self._timer = self.loop.call_later(LINGER_QUIET_S, self._linger_tick)

        def _enter_lingering(self) -> None:
            """Into room.lingering: what comes now goes to _drop (the parser is done with it)."""
            self._idle = lingering
            lingering[self] = None
            if len(lingering) > limits.max_connections:  # a flood of errors: the oldest goes now
                oldest = next(iter(lingering))
                del lingering[oldest]
                oldest._idle = None
                oldest.transport.abort()

        def _close_lingering(self) -> bool:
            """A close asked for while the request's body is still coming (an answer given
            before it, to a request with Connection: close): lingering instead."""
            if self._in_head or self._idle is lingering or self.transport.is_closing():
                return False
            self._linger()
            return True

        def _drop(self, data: bytes) -> None:
            self._got += len(data)
            if self._got > LINGER_BYTES:
                self.transport.abort()

        def _linger_tick(self) -> None:
            self._timer = None
            if self._got == self._seen or self.loop.time() >= self._linger_end:
                return self.transport.abort()  # the answer went before; a reset now harms no reading
            self._seen = self._got
            self._timer = self.loop.call_later(LINGER_QUIET_S, self._linger_tick)

    LimitedHttpTools.limits = limits  # DrainingServer raises the open-file limit to match
    return LimitedHttpTools
