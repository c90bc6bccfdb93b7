"""Server-assisted invalidation for ``CachedKVS`` (Redis ``CLIENT TRACKING``, RESP2
redirect mode, which every Redis >= 6 and Valkey support).

Two pieces:

* ``Tracker`` owns one connection subscribed to ``__redis__:invalidate`` and a daemon
  thread that reads it. The server pushes there the keys that another (or the same)
  client changed after one of our tracked connections read them. The thread hands
  them to the cache; no polling. When the connection is lost the thread tells the
  cache to flush everything (the messages sent meanwhile are gone), reconnects with
  backoff, and starts a new *epoch* (a new client id to redirect to).
* ``tracked_connection_class`` makes redis-py connections that turn tracking on
  (``CLIENT TRACKING ON REDIRECT <listener id>``) whenever they connect, and that
  reconnect before their next command if they were registered in an older epoch, so
  every cache-miss read is tracked by the live listener.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from typing import TYPE_CHECKING, Any

import redis
from redis.utils import str_if_bytes

from kvs.options import KVSOptions
from kvs.retry import Backoff

log = logging.getLogger(__name__)

INVALIDATE_CHANNEL = b"__redis__:invalidate"

# pool-internal settings that must not leak into a standalone connection
_POOL_ONLY = ("maint_notifications", "himport_registry", "orig_", "tracker")


class Tracker:
    """The invalidation connection and its reader thread (see the module docstring).

    ``handler`` is held weakly (so a forgotten ``CachedKVS`` can be collected) and must
    provide ``_tracking_ready(epoch)``, ``_tracking_lost(reason)`` and
    ``_tracking_invalidate(keys: list[bytes] | None)`` (None: the server flushed all).
    """

    def __init__(self, pool: redis.ConnectionPool, handler: Any, options: KVSOptions):
        self._connection_class = pool.connection_class
        self._kwargs = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_ONLY)}
        self._handler = weakref.ref(handler)
        self._options = options
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._conn: redis.Connection | None = None
        self._client_id: int | None = None
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        #: bumped each time a new invalidation connection is subscribed
        self.epoch = 0
        #: set while subscribed (tests and the constructor wait on it)
        self.ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flowserve-kvs-invalidations", daemon=True)
        self._thread.start()

    def current(self) -> tuple[int, int]:
        """``(epoch, client id)`` to redirect tracking to; raises
        ``redis.ConnectionError`` (retried by the caller) while not subscribed."""
        with self._lock:
            if self._client_id is None:
                raise redis.ConnectionError("cache invalidation connection is not up yet")
            return self.epoch, self._client_id

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the connection (idempotent)."""
        self._stopping.set()
        if os.getpid() != self._pid:  # a forked child: never touch the parent's socket
            self.abandon()
            return
        with self._lock:
            conn = self._conn
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:  # wakes the reader thread blocked in poll/recv
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def abandon(self) -> None:
        """After ``fork`` in the child: close our copy of the socket without shutting
        it down (that would cut the parent's connection) and forget the thread."""
        self._stopping.set()
        sock = getattr(self._conn, "_sock", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._thread = None

    # -- the reader thread -------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff(self._options.backoff_base, self._options.backoff_cap)
        while not self._stopping.is_set():
            conn = self._connection_class(**self._kwargs)
            subscribed = False
            reason = ""
            try:
                client_id = self._subscribe(conn)
                with self._lock:
                    if self._stopping.is_set():
                        break
                    self._conn = conn
                    self.epoch += 1
                    self._client_id = client_id
                    epoch = self.epoch
                handler = self._handler()
                if handler is None:
                    break
                handler._tracking_ready(epoch)
                del handler
                subscribed = True
                self.ready.set()
                backoff.reset()
                self._read_loop(conn)
            except Exception as exc:  # connection loss shows up as several error types
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    self._conn = None
                    self._client_id = None
                self.ready.clear()
                try:
                    conn.disconnect()
                except Exception:  # already closed under us by stop()
                    pass
            if self._stopping.is_set():
                break
            handler = self._handler()
            if handler is None:
                break
            if subscribed:
                log.warning("KVS cache invalidation connection lost (%s); cache flushed", reason)
                handler._tracking_lost(reason)
            del handler
            self._stopping.wait(backoff.next())  # jittered: many executors lost the same server

    def _subscribe(self, conn: redis.Connection) -> int:
        conn.connect()
        conn.send_command("CLIENT", "ID")
        client_id = int(conn.read_response())
        conn.send_command("SUBSCRIBE", INVALIDATE_CHANNEL)
        conn.read_response()  # [b"subscribe", channel, 1]
        return client_id

    def _read_loop(self, conn: redis.Connection) -> None:
        """Block on the socket; apply invalidations; ping when idle to notice a dead
        server (no PONG within another interval = lost)."""
        interval = self._options.health_check_interval
        awaiting_pong = False
        while not self._stopping.is_set():
            if not conn.can_read(timeout=interval):
                if awaiting_pong:
                    raise redis.TimeoutError(f"no PONG within {interval:g} s")
                conn.send_command("PING")
                awaiting_pong = True
                continue
            message = conn.read_response()
            kind = message[0] if isinstance(message, list) and message else None
            if kind == b"message" and message[1] == INVALIDATE_CHANNEL:
                handler = self._handler()
                if handler is None:
                    return
                handler._tracking_invalidate(message[2])
                del handler
            elif kind == b"pong":
                awaiting_pong = False


if TYPE_CHECKING:
    # the mixin always comes first in a redis connection class (tracked_connection_class)
    _ConnectionBase = redis.connection.AbstractConnection
else:
    _ConnectionBase = object


class _TrackingMixin(_ConnectionBase):
    """Connection mixin: ``CLIENT TRACKING ON REDIRECT`` after the handshake, and
    re-registration when the tracker has moved to a new epoch."""

    def __init__(self, *args, tracker: Tracker, **kwargs):
        super().__init__(*args, **kwargs)
        self._tracker = tracker
        self._tracking_epoch = -1
        self._handshake = False  # True while the handshake runs its own commands

    def _enable_tracking(self) -> None:
        epoch, client_id = self._tracker.current()
        self.send_command("CLIENT", "TRACKING", "ON", "REDIRECT", client_id, check_health=False)
        reply = str_if_bytes(self.read_response())
        if reply != "OK":
            raise redis.ConnectionError(f"CLIENT TRACKING answered {reply!r}")
        self._tracking_epoch = epoch

    def send_packed_command(self, command, check_health: bool = True):
        if self._sock is not None and not self._handshake and self._tracking_epoch != self._tracker.epoch:
            # registered with a listener that is gone: its invalidations would be lost
            self.disconnect()
        super().send_packed_command(command, check_health=check_health)


_classes: dict[type, type] = {}


def tracked_connection_class(base: type) -> type:
    """A subclass of redis-py connection class ``base`` (TCP, TLS or unix socket)
    whose connections are always tracked."""
    cls = _classes.get(base)
    if cls is not None:
        return cls
    # the handshake hook redis-py calls after connecting (renamed in redis-py 6)
    hook = "on_connect_check_health" if hasattr(base, "on_connect_check_health") else "on_connect"

    def handshake(self, *args, **kwargs):
        self._handshake = True
        try:
            getattr(super(cls, self), hook)(*args, **kwargs)
            self._enable_tracking()
        finally:
            self._handshake = False

    cls = type(f"Tracked{base.__name__}", (_TrackingMixin, base), {hook: handshake})
    _classes[base] = cls
    return cls
