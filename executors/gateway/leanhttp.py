"""The data plane's HTTP path: ``POST /flows/{name}`` answered by the connection's protocol
itself, without the ASGI layers; every other request goes to the ASGI app unchanged.

uvicorn's httptools protocol turns each request into an ASGI scope (a dict, the URL parsed
again, the app state copied), runs the app, and takes the answer back as two ASGI messages
whose headers it checks one by one against two regular expressions: for the gateway's hot
path that is a fifth of its own CPU per small request, and a request at concurrency 1
waits for it (benchmarks/README.md, "The gateway's HTTP layer": the ensemble's p50 0.91x
with this path). Here the protocol (http_server.LimitedHttpTools) recognises an invocation
when its head is complete and runs a ``LeanCycle`` instead: a uvicorn request cycle, so
the body, ``Expect: 100-continue``, flow control, disconnects, pipelining (answers in
order, one request at a time per connection), keep-alive, draining and the connection
limits are uvicorn's own code (a connection lost before the answer hangs up the request's
``Hangup``: the gateway gives the request up), but the request goes straight to the gateway's
``InvokeFastPath.answer`` with the headers as they were parsed, and a whole answer (head
and body) leaves in one write. Streamed, multi-piece and big answers (over
``WRITE_SLICE``: written in slices) go through the ASGI ``send``.

What the client sees is the same as on the ASGI path: the same statuses, error bodies,
headers (uvicorn's ``server``/``date`` included) and metrics; a request the lean path does
not take (another method or route, a percent-encoded name, an upgrade) is the ASGI app's.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from executors.codec.bodies import WRITE_SLICE
from executors.gateway.invoke import Hangup

log = logging.getLogger("flowserve.gateway")

_PREFIX = b"/flows/"


def flow_name(url: bytes) -> str | None:
    """The flow named by an invocation's request target (``/flows/{name}``, a query string
    ignored), or None when the target is anything else or needs decoding (the ASGI path
    decodes it)."""
    if not url.startswith(_PREFIX):
        return None
    end = len(url)
    for sep in (b"?", b"#"):
        i = url.find(sep, 7)
        if i >= 0 and i < end:
            end = i
    name = url[7:end]
    if not name or b"/" in name or b"%" in name or not name.isascii():
        return None
    return name.decode("ascii")


class LeanCycle(RequestResponseCycle):
    """One invocation on a connection: uvicorn's request cycle (body, flow control,
    disconnect, pipelining) with the gateway called directly in place of an ASGI app."""

    def __init__(self, protocol, invoker, name: str, keep_alive: bool):
        super().__init__(
            scope={"method": "POST", "type": "http"},  # what send() reads, for a streamed answer
            transport=protocol.transport,
            flow=protocol.flow,
            logger=protocol.logger,
            access_logger=protocol.access_logger,
            access_log=False,
            default_headers=protocol.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=protocol.expect_100_continue,
            keep_alive=keep_alive,
            on_response=protocol.on_response_complete,
        )
        self.invoker, self.name, self.raw_headers = invoker, name, protocol.headers
        self.hangup = Hangup()  # the protocol hangs it up if the connection is lost before the answer
        self.discard_bytes = getattr(protocol, "discard_bytes", None)

    async def run_asgi(self, app) -> None:  # the protocol starts every cycle by this name
        try:
            status, body, extra = await self.invoker.answer(self.name, self.raw_headers, self.receive, self.hangup)
            if type(body) is bytes and len(body) <= WRITE_SLICE:
                await self.write_answer(status, body, extra)
            else:  # streamed, in pieces, or big (written in slices): through the ASGI send
                await self.invoker.send(self.send, status, body, extra)
        except BaseException as exc:
            log.error("unhandled error answering an invocation", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def write_answer(self, status: int, body: bytes, extra: list) -> None:
        """The answer's head and body, one write (what ``send`` writes for the two ASGI
        messages of an answer with a Content-Length, but for the header checks: these
        headers are the gateway's own)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        out = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            out += (name, b": ", value, b"\r\n")
        out.append(b"content-length: %d\r\n" % len(body))
        for name, value in extra:
            out += (name, b": ", value, b"\r\n")
        if self.keep_alive and self.more_body and not self._body_cheap_to_skip():
            # answered before the body came (a 413, say), and the rest is more than the
            # server reads past: it closes the connection, so the client must not reuse it
            self.keep_alive = False
        if not self.keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        transport = self.transport
        write = getattr(transport, "write_now", transport.write)
        write(b"".join(out))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            transport.close()
        self.on_response()

    def _body_cheap_to_skip(self) -> bool:
        """Whether the rest of this request's body is small enough for the server to read
        past (``discard_bytes``) so that the connection serves the next request."""
        if self.discard_bytes is None:
            return True
        declared = next((v for k, v in self.raw_headers if k == b"content-length"), None)
        return declared is not None and declared.isdigit() and int(declared) <= self.discard_bytes


def _nothing() -> None:
    pass
