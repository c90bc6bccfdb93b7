"""The gateway's sockets to and from its executors, on its asyncio loop.

Messages a turn of the event loop sends leave as one write per executor (one wake-up of
it, and it sees the requests that arrived together together); a lone request leaves at
once. After a message the loop keeps polling for the busy-poll window (busypoll.py: a
process woken from sleep runs slowly for a while). Answers are read by the loop's reader
callbacks; an answer no request waits for any more is dropped before its tables are
decoded (``is_stale``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from executors.wire.busypoll import BusyPoll
from executors.wire.frames import WireError
from executors.wire.messages import Message, decode_unless
from executors.wire.transport import Outbox, Reader, accept, listen

log = logging.getLogger("flowserve.gateway")


class ExecutorLinks:
    def __init__(
        self,
        address: str,
        busy_poll_ms: float,
        on_message: Callable[[Message], None],
        is_stale: Callable[[dict], bool],
        in_flight: Callable[[], int],
    ):
        self.address = address
        self.listener = listen(address)  # answers arrive on connections read by the loop's reader callbacks
        self.outbox = Outbox("gateway")
        self.on_message, self.is_stale, self.in_flight = on_message, is_stale, in_flight
        self._connections: dict[int, socket.socket] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsent: dict[str, list] = {}  # address -> messages sent this turn of the loop
        self.busy_poll = BusyPoll(busy_poll_ms)  # busypoll.py: why the loop polls after a message
        self._polling = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.listener.fileno(), self._accept)

    def close(self) -> None:
        self._flush()
        if self._loop is not None:
            self._loop.remove_reader(self.listener.fileno())
            for fd, conn in list(self._connections.items()):
                self._loop.remove_reader(fd)
                conn.close()
        self._connections.clear()
        self.outbox.close()
        self.listener.close()

    def forget(self, address: str) -> None:
        """An executor that died or left: its connection goes (a new one is made if it returns)."""
        self.outbox.forget(address)

    def send(self, address: str, frames: list) -> None:
        """Send at the end of this turn of the event loop: the requests that arrived together
        leave as one write per executor (one wake-up of it, and it sees them together). A
        lone request (concurrency 1) leaves at once."""
        if self._loop is None:
            return self._send_now(address, [frames])
        if not self._unsent and self.in_flight() <= 1:
            # the only request in flight: none to wait for this turn, so no turn waited for
            self._keep_hot()
            return self._send_now(address, [frames])
        if not self._unsent:
            self._loop.call_soon(self._flush)
        self._unsent.setdefault(address, []).append(frames)

    def _keep_hot(self) -> None:
        """A message came or went: keep the event loop polling (a ready callback makes it poll
        without sleeping) for the busy-poll window, so the answer is read at once."""
        self.busy_poll.touch()
        if not self._polling and self.busy_poll.window_s:
            self._polling = True
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        if self.busy_poll.hot():
            self.busy_poll.pause()
            self._loop.call_soon(self._poll)
        else:
            self._polling = False

    def _flush(self) -> None:
        self._keep_hot()
        unsent, self._unsent = self._unsent, {}
        for address, messages in unsent.items():
            self._send_now(address, messages)

    def _send_now(self, address: str, messages: list) -> None:
        if not self.outbox.send_many(address, messages):
            log.debug("%s cannot be reached; %d message(s) to it dropped", address, len(messages))

    def _accept(self) -> None:
        while (conn := accept(self.listener)) is not None:
            self._connections[conn.fileno()] = conn
            self._loop.add_reader(conn.fileno(), self._readable, conn, Reader(conn))

    def _readable(self, conn: socket.socket, reader: Reader) -> None:
        self._keep_hot()
        try:
            messages, still_open = reader.read()
        except WireError as e:
            log.warning("closing a connection that broke the framing: %s", e)
            messages, still_open = [], False
        for frames in messages:
            try:
                msg = decode_unless(frames, self.is_stale)
                if msg is not None:
                    self.on_message(msg)
            except WireError as e:
                log.warning("dropped a malformed message: %s", e)
            except Exception:  # one answer's bug must not stop the gateway reading the others
                log.exception("error handling an answer")
        if not still_open:
            self._loop.remove_reader(conn.fileno())
            self._connections.pop(conn.fileno(), None)
            conn.close()
