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

import uvicorn

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
        deadline = time.monotonic() + self.drain_s
        while self.gateway.dispatcher.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # bounded wait for the in-flight requests' own answers
        log.info("in-flight requests answered; stopping")
        super().handle_exit(sig, frame)
