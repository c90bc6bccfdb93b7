"""The local cluster's control channel: between its supervisor and each gateway process.

The supervisor (executors/hosts/supervisor.py) owns the processes: the store, the executors and the
gateways. A gateway (executors/hosts/local_gateway.py) owns what requests need: routing,
flows, liveness pings. They talk over one connected Unix socket pair that the supervisor
makes for each gateway it starts (the gateway inherits its end): a process that is not
the supervisor's child cannot reach it, and a restarted gateway gets a fresh one. With
several gateways (``ClusterConfig.gateways``) each has a channel of its own: events go to
every one, a reply to the gateway that called.

One JSON object per line, never pickle. The supervisor sends a ``hello`` first (the
executors and their state, which start of a gateway this is, in which slot of how many),
then ``event``s as processes come and go; a gateway sends ``call``s and gets a ``reply``
with the same number, and tells the supervisor when it is ``ready``. The autoscaler's
calls (``add``, ``remove``) carry the caller's fencing token (executors/hosts/leadership.py):
one that is not the current one is refused, so a gateway that lost the lease starts or
stops nothing. A ``kill`` says how long the executor has been silent: a process younger
than that is its replacement, started since another gateway asked, and is left alone.

    supervisor -> gateway   {"hello": {"executors": [...], "incarnation": 3, "slot": 1, "gateways": 2}}
                            {"event": "exited", "id": "cpu0", "code": -9, "running": [...]}
                            {"event": "started", "id": "cpu0"}
                            {"event": "start_failed", "id": "cpu0", "reason": "...", "retry_in_s": 0.4}
                            {"event": "added", "executor": {"id": "cpu2", "address": "ipc://...", ...}}
                            {"event": "removed", "id": "cpu2"}
    gateway -> supervisor   {"call": 3, "op": "add", "device": "cpu", "fence": 7}   (also "remove")
                            {"call": 4, "op": "kill", "id": "cpu0", "silent_s": 10.0}
                            {"ready": true}
    supervisor -> gateway   {"reply": 3, "id": "cpu2", "address": "ipc://..."}  or {"reply": 3, "error": "..."}
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
from collections.abc import Awaitable, Callable

from executors.wire.frames import WireError

log = logging.getLogger("flowserve.control")

MAX_LINE = 1 << 20  # a hello lists every executor: far below this


class Channel:
    """One end of the control channel on an asyncio loop: ``send`` a message, ``call`` and
    await the reply, and hand everything else that arrives to ``on_message``."""

    def __init__(self, sock: socket.socket, on_message: Callable[[dict], Awaitable[None] | None]):
        self._sock = sock
        self._on_message = on_message
        self._writer: asyncio.StreamWriter | None = None
        self._early: list[bytes] = []  # sent before ``run`` opened the connection
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.closed = asyncio.Event()

    async def run(self) -> None:
        """Read messages until the other end closes the channel."""
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock, limit=MAX_LINE)
        for line in self._early:
            self._writer.write(line)
        self._early.clear()
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.warning("dropped a malformed control message: %r", line[:200])
                    continue
                if "reply" in msg:
                    fut = self._calls.pop(msg["reply"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                try:
                    handled = self._on_message(msg)
                    if asyncio.iscoroutine(handled):
                        await handled
                except Exception:  # the channel's reader must outlive one message its handler fails on
                    log.exception("handling control message %r failed", msg)
        except (ConnectionError, OSError) as e:
            log.warning("control channel lost: %s", e)
        finally:
            self.closed.set()
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(WireError("the control channel closed"))
            self._calls.clear()
            if self._writer is not None:
                self._writer.close()

    def send(self, msg: dict) -> None:
        line = json.dumps(msg).encode() + b"\n"
        if self._writer is None:
            if not self.closed.is_set():
                self._early.append(line)
            return
        if self._writer.is_closing():
            return  # the other end is gone: what it would have learned, it reads in the next hello
        self._writer.write(line)

    async def call(self, op: str, timeout: float = 60.0, **fields) -> dict:
        """Send a call and return its reply; ``WireError`` if it answers an error or the channel closes."""
        n = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[n] = fut
        self.send({"call": n, "op": op, **fields})
        try:
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._calls.pop(n, None)
        if reply.get("error"):
            raise WireError(reply["error"])
        return reply

    def reply(self, call: dict, **fields) -> None:
        self.send({"reply": call["call"], **fields})
