"""Server-assisted invalidation for ``CachedKVS`` (Redis ``CLIENT TRACKING``, RESP2
redirect mode, which every Redis >= 6 and Valkey support).

Three pieces:

* ``Tracker`` owns one connection subscribed to ``__redis__:invalidate`` and a daemon
  thread that reads it. The server pushes there the keys that another (or the same)
  client changed after one of our tracked connections read them. The thread hands
  them to the cache; no polling. When the connection is lost the thread tells the
  cache to flush everything (the messages sent meanwhile are gone), reconnects with
  backoff, and starts a new *epoch* (a new client id to redirect to). Behind Sentinel
  it reconnects to whichever server the sentinels name as primary.
* ``NodeTrackers``, for a Redis Cluster: a server only tracks the reads made on it and
  redirects only to its own clients, so every primary the cache reads from gets a
  ``Tracker`` of its own, started by the first read connection to that node. A node's
  tracker that loses its connection (the node died, failed over, or was reshaped) is
  not reconnected: the whole cache is flushed, and the next read connection to that
  address starts a fresh one, if the address still serves.
* ``tracked_connection_class`` makes redis-py connections that turn tracking on
  (``CLIENT TRACKING ON REDIRECT <listener id>``) whenever they connect, only towards a
  listener on the same server (a client id names a client of one server only: redirecting
  to another server's id would send the invalidations to a stranger, or nowhere), and
  that reconnect before their next command if their listener is gone or in a newer epoch,
  so every cache-miss read is tracked by a live listener.
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
_POOL_ONLY = ("maint_notifications", "himport_registry", "orig_")


def address_of(conn: Any) -> tuple:
    """Which server a redis-py connection is (or will be) connected to."""
    path = getattr(conn, "path", None)
    if path:
        return (path,)
    return (getattr(conn, "host", None), getattr(conn, "port", None))


class Tracker:
    """One invalidation connection and its reader thread (see the module docstring).

    ``handler`` is held weakly (so a forgotten ``CachedKVS`` can be collected) and must
    provide ``_tracking_ready(epoch)``, ``_tracking_lost(reason)`` and
    ``_tracking_invalidate(keys: list[bytes] | None)`` (None: the server flushed all);
    with ``reconnect=False`` (one life: a Cluster node's) also ``_tracking_ended(tracker)``,
    called when the thread ends.
    """

    def __init__(
        self, connection_class: type, kwargs: dict, handler: Any, options: KVSOptions, *, reconnect: bool = True
    ):
        self._connection_class = connection_class
        self._kwargs = kwargs
        self._handler = weakref.ref(handler)
        self._options = options
        self._reconnect = reconnect
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._conn: redis.Connection | None = None
        self._client_id: int | None = None
        self._address: tuple | None = None
        self._expected: tuple | None = None  # the primary the sentinels name (kvs/sentinel_watch.py)
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        #: bumped each time a new invalidation connection is subscribed
        self.epoch = 0
        #: set while subscribed (tests and the constructor wait on it)
        self.ready = threading.Event()
        #: set once the first subscription succeeded or failed
        self.settled = threading.Event()

    @classmethod
    def for_pool(cls, pool: redis.ConnectionPool, handler: Any, options: KVSOptions) -> Tracker:
        """A tracker connecting as ``pool``'s connections do (one server, or the primary
        the sentinels name)."""
        kwargs = {k: v for k, v in pool.connection_kwargs.items() if not k.startswith(_POOL_ONLY)}
        return cls(pool.connection_class, kwargs, handler, options)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flowserve-kvs-invalidations", daemon=True)
        self._thread.start()

    def current(self) -> tuple[int, int, tuple]:
        """``(epoch, client id, server address)`` to redirect tracking to; raises
        ``redis.ConnectionError`` (retried by the caller) while not subscribed."""
        with self._lock:
            if self._client_id is None or self._address is None:
                raise redis.ConnectionError("cache invalidation connection is not up yet")
            return self.epoch, self._client_id, self._address

    # what a tracked connection asks its source (NodeTrackers answers per node)
    def tracker_for(self, conn: Any) -> Tracker:
        return self

    def current_for(self, conn: Any) -> Tracker | None:
        return self

    def expect(self, address: tuple) -> bool:
        """Subscribe only on ``address`` from now on (the sentinels' primary); True if that
        moves the tracker (it was subscribed elsewhere: the cache is flushed)."""
        with self._lock:
            changed = self._expected is not None and self._expected != address
            self._expected = address
            elsewhere = self._address is not None and self._address != address and self._conn is not None
        if elsewhere:
            log.warning("the sentinels name %s as the primary: moving the cache invalidation connection there", address)
            self._shutdown_socket()
        return changed or elsewhere

    def elsewhere(self, address: tuple) -> None:
        """A read connection reached ``address``, another server than this tracker's (a
        failover moved the primary): drop the connection, so the thread flushes the cache
        and reconnects to the server the reads now go to."""
        log.warning(
            "KVS reads go to %s, the cache invalidation connection to %s: reconnecting it", address, self._address
        )
        self._shutdown_socket()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the connection (idempotent)."""
        self._stopping.set()
        if os.getpid() != self._pid:  # a forked child: never touch the parent's socket
            self.abandon()
            return
        self._shutdown_socket()
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

    def _shutdown_socket(self) -> None:
        with self._lock:
            conn = self._conn
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:  # wakes the reader thread blocked in poll/recv
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- the reader thread -------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff(self._options.backoff_base, self._options.backoff_cap)
        try:
            while not self._stopping.is_set():
                conn = self._connection_class(**self._kwargs)
                subscribed = False
                reason = ""
                try:
                    client_id = self._subscribe(conn)
                    with self._lock:
                        if self._stopping.is_set():
                            break
                        expected = self._expected
                    if expected is not None and address_of(conn) != expected:
                        # a sentinel that has not heard of the failover yet named the old primary
                        raise redis.ConnectionError(f"connected to {address_of(conn)}, not the primary {expected}")
                    with self._lock:
                        self._conn = conn
                        self.epoch += 1
                        self._client_id = client_id
                        self._address = address_of(conn)
                        epoch = self.epoch
                    handler = self._handler()
                    if handler is None:
                        break
                    handler._tracking_ready(epoch)
                    del handler
                    subscribed = True
                    self.ready.set()
                    self.settled.set()
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
                if not self._reconnect:
                    break
                self._stopping.wait(backoff.next())  # jittered: many executors lost the same server
        finally:
            self.settled.set()
            if not self._reconnect:
                handler = self._handler()
                if handler is not None:
                    handler._tracking_ended(self)

    def _subscribe(self, conn: redis.Connection) -> int:
        conn.connect()
        conn.send_command("CLIENT", "ID")
        client_id = int(conn.read_response())
        conn.send_command("SUBSCRIBE", INVALIDATE_CHANNEL)
        conn.read_response()  # [b"subscribe", channel, 1]
        return client_id

    def _read_loop(self, conn: redis.Connection) -> None:
        """Apply invalidations as they come (``pushed_messages``)."""
        for message in pushed_messages(conn, self._options.health_check_interval, self._stopping):
            if message[1] == INVALIDATE_CHANNEL:
                handler = self._handler()
                if handler is None:
                    return
                handler._tracking_invalidate(message[2])
                del handler


def pushed_messages(conn: redis.Connection, interval: float, stopping: threading.Event):
    """The pub/sub messages (``[b"message", channel, data]``) a subscribed connection gets,
    until ``stopping`` is set. It blocks on the socket and pings when idle to notice a dead
    server: no PONG within another ``interval`` raises redis.TimeoutError (the caller's
    reconnect path)."""
    awaiting_pong = False
    while not stopping.is_set():
        if not conn.can_read(timeout=interval):
            if awaiting_pong:
                raise redis.TimeoutError(f"no PONG within {interval:g} s")
            conn.send_command("PING")
            awaiting_pong = True
            continue
        message = conn.read_response()
        kind = message[0] if isinstance(message, list) and message else None
        if kind == b"message":
            yield message
        elif kind == b"pong":
            awaiting_pong = False


class _Node:
    """What a Cluster node's ``Tracker`` reports to, passed on to its ``NodeTrackers``
    (held by it, so the tracker's weak reference stays alive)."""

    def __init__(self, group: NodeTrackers, address: tuple):
        self.group, self.address = group, address

    def _tracking_ready(self, epoch: int) -> None:
        pass  # the cache already caches (NodeTrackers.generation)

    def _tracking_lost(self, reason: str) -> None:
        self.group._node_lost(self, reason)

    def _tracking_invalidate(self, keys) -> None:
        self.group._node_invalidate(keys)

    def _tracking_ended(self, tracker: Tracker) -> None:
        self.group._node_ended(self.address, tracker)


class NodeTrackers:
    """One ``Tracker`` per Cluster node the cache reads from (see the module docstring).

    To the cache it is one tracker whose epoch (``generation``) moves on whenever any
    node's invalidation connection is lost: reads begun before that are not cached, and
    the cache is flushed. The cache caches from the start: a read is only ever made on a
    connection whose node's tracker is subscribed, so what it reads is tracked.
    """

    def __init__(self, handler: Any, options: KVSOptions, connection_class: type, kwargs: dict):
        self._handler = weakref.ref(handler)
        self._options = options
        self._connection_class = connection_class
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._nodes: dict[tuple, tuple[Tracker, _Node]] = {}
        self._stopped = False
        self.generation = 1
        self.ready = threading.Event()
        self.ready.set()

    def start(self) -> None:
        handler = self._handler()
        if handler is not None:
            handler._tracking_ready(self.generation)

    def addresses(self) -> list[tuple]:
        """The nodes with a subscribed invalidation connection now."""
        with self._lock:
            return [a for a, (t, _) in self._nodes.items() if t.ready.is_set()]

    def tracker_for(self, conn: Any) -> Tracker:
        """The subscribed tracker of ``conn``'s node, started if there is none; raises
        ``redis.ConnectionError`` if it cannot subscribe within the connect timeout."""
        address = address_of(conn)
        with self._lock:
            if self._stopped:
                raise redis.ConnectionError("the cache is closed")
            entry = self._nodes.get(address)
            if entry is None:
                node = _Node(self, address)
                kwargs = dict(self._kwargs, host=address[0], port=address[1])
                tracker = Tracker(self._connection_class, kwargs, node, self._options, reconnect=False)
                entry = self._nodes[address] = (tracker, node)
                tracker.start()
        tracker = entry[0]
        tracker.settled.wait(self._options.connect_timeout)
        if not tracker.ready.is_set():
            raise redis.ConnectionError(f"no cache invalidation connection to {address[0]}:{address[1]}")
        return tracker

    def current_for(self, conn: Any) -> Tracker | None:
        entry = self._nodes.get(address_of(conn))
        return entry[0] if entry is not None else None

    def elsewhere(self, address: tuple) -> None:
        pass  # never: each node's connections are tracked by that node's tracker

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stopped = True
            trackers = [t for t, _ in self._nodes.values()]
            self._nodes.clear()
        for t in trackers:
            t.stop(timeout)

    def abandon(self) -> None:
        """After ``fork`` in the child (see ``Tracker.abandon``)."""
        self._stopped = True
        for t, _ in list(self._nodes.values()):
            t.abandon()

    # -- from the nodes' trackers --------------------------------------------------------

    def _node_lost(self, node: _Node, reason: str) -> None:
        address = node.address
        with self._lock:
            entry = self._nodes.get(address)
            if entry is not None and entry[1] is node:
                # forgotten before the flush: a connection still registered with the lost
                # tracker reconnects at its next command (send_packed_command), so no read
                # after the flush is cached untracked
                del self._nodes[address]
            self.generation += 1
            generation = self.generation
        handler = self._handler()
        if handler is None:
            return
        handler._tracking_lost(f"node {address[0]}:{address[1]}: {reason}")
        handler._tracking_ready(generation)

    def _node_ended(self, address: tuple, tracker: Tracker) -> None:
        with self._lock:
            entry = self._nodes.get(address)
            if entry is not None and entry[0] is tracker:
                del self._nodes[address]

    def _node_invalidate(self, keys) -> None:
        handler = self._handler()
        if handler is not None:
            handler._tracking_invalidate(keys)


if TYPE_CHECKING:
    # the mixin always comes first in a redis connection class (tracked_connection_class)
    _ConnectionBase = redis.connection.AbstractConnection
else:
    _ConnectionBase = object


class _TrackingMixin(_ConnectionBase):
    """Connection mixin: ``CLIENT TRACKING ON REDIRECT`` after the handshake, and
    re-registration when its listener is gone or has moved to a new epoch."""

    _tracking_source: Any  # a Tracker or NodeTrackers (set by tracked_connection_class)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tracked_by: Tracker | None = None
        self._tracking_epoch = -1
        self._handshake = False  # True while the handshake runs its own commands

    def _enable_tracking(self) -> None:
        tracker = self._tracking_source.tracker_for(self)
        epoch, client_id, address = tracker.current()
        if address != address_of(self):
            tracker.elsewhere(address_of(self))
            raise redis.ConnectionError(
                f"the cache invalidation connection is on {address}, this read on {address_of(self)}: reconnecting"
            )
        self.send_command("CLIENT", "TRACKING", "ON", "REDIRECT", client_id, check_health=False)
        try:
            reply = str_if_bytes(self.read_response())
        except redis.ResponseError as e:
            # "the client ID you want redirect to does not exist": the listener's connection
            # is gone (the server restarted, or dropped it) and its thread has not noticed
            # yet. It will subscribe again: a connection error, so the read is retried
            # (a ResponseError would be the request's 500)
            raise redis.ConnectionError(f"CLIENT TRACKING refused the cache's listener: {e}") from e
        if reply != "OK":
            raise redis.ConnectionError(f"CLIENT TRACKING answered {reply!r}")
        self._tracked_by, self._tracking_epoch = tracker, epoch

    def send_packed_command(self, command, check_health: bool = True):
        if self._sock is not None and not self._handshake:
            tracker = self._tracked_by
            if (
                tracker is None
                or tracker is not self._tracking_source.current_for(self)
                or self._tracking_epoch != tracker.epoch
            ):
                # registered with a listener that is gone: its invalidations would be lost
                self.disconnect()
        super().send_packed_command(command, check_health=check_health)


def tracked_connection_class(base: type, source: Tracker | NodeTrackers) -> type:
    """A subclass of redis-py connection class ``base`` (TCP, TLS, unix socket, or
    Sentinel-managed) whose connections are always tracked by ``source``'s listeners."""
    # the handshake hook redis-py calls after connecting (renamed in redis-py 6)
    hook = "on_connect_check_health" if hasattr(base, "on_connect_check_health") else "on_connect"

    def handshake(self, *args, **kwargs):
        self._handshake = True
        try:
            getattr(super(cls, self), hook)(*args, **kwargs)
            self._enable_tracking()
        finally:
            self._handshake = False

    cls = type(f"Tracked{base.__name__}", (_TrackingMixin, base), {hook: handshake, "_tracking_source": source})
    return cls
