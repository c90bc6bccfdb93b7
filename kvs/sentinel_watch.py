"""``PrimaryWatch``: which server the sentinels name as primary, told the moment it changes.

A Sentinel failover does not always break the connections to the old primary: after a
manual one (``SENTINEL FAILOVER``), or when the old primary was cut off rather than dead,
it runs on as a primary that no longer receives the writes, until the sentinels reach it
and make it a replica (at their next INFO round, up to 10 s). A cache whose invalidation
connection is still on it hears of none of the new primary's writes. So a ``CachedKVS`` of
a Sentinel store also subscribes to a sentinel's ``+switch-master`` channel: when its
service moves, the cache is flushed and every connection reconnects, to the new primary
(``kvs/cache.py``).

The watch reads one sentinel at a time and moves to the next when it fails; after each
(re)subscription it asks that sentinel for the primary, so a switch missed while it was
not subscribed is still seen. While subscribed, its word is what new connections use
(``kvs.connect.WatchedSentinel``): a sentinel that has not heard of a failover yet would
name the old primary.
"""

from __future__ import annotations

import logging
import socket
import threading
import weakref
from collections.abc import Callable

import redis

from kvs.options import KVSOptions
from kvs.retry import Backoff
from kvs.tracking import pushed_messages
from kvs.urls import StoreURL

log = logging.getLogger(__name__)

SWITCH_CHANNEL = b"+switch-master"


class PrimaryWatch:
    """A daemon thread that calls ``on_primary((host, port))`` with the primary of
    ``parsed.service`` after it subscribed to a sentinel, and whenever it switches.
    ``on_primary`` is held weakly (a bound method of the cache)."""

    def __init__(self, parsed: StoreURL, options: KVSOptions, on_primary: Callable[[tuple], None]):
        self._parsed = parsed
        self._options = options
        self._callback = weakref.WeakMethod(on_primary)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._conn: redis.Connection | None = None
        self._thread: threading.Thread | None = None
        #: the primary as last heard, (host, port)
        self.primary: tuple | None = None

    def current(self) -> tuple | None:
        """The primary while a sentinel is watched; None otherwise (ask the sentinels)."""
        return self.primary

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flowserve-kvs-sentinel-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.primary = None
        with self._lock:
            conn = self._conn
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:  # wakes the thread blocked in poll/recv
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def abandon(self) -> None:
        """After ``fork`` in the child: close our copy of the socket, forget the thread."""
        self._stopping.set()
        self.primary = None
        sock = getattr(self._conn, "_sock", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._thread = None

    def _run(self) -> None:
        backoff = Backoff(self._options.backoff_base, self._options.backoff_cap)
        i = 0
        while not self._stopping.is_set():
            host, port = self._parsed.hosts[i % len(self._parsed.hosts)]
            i += 1
            conn = redis.Connection(
                host=host,
                port=port,
                username=self._parsed.sentinel_username,
                password=self._parsed.sentinel_password,
                socket_timeout=self._options.socket_timeout,
                socket_connect_timeout=self._options.connect_timeout,
                retry=None,
                protocol=2,
            )
            try:
                conn.connect()
                with self._lock:
                    if self._stopping.is_set():
                        break
                    self._conn = conn
                conn.send_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._parsed.service)
                addr = conn.read_response()
                conn.send_command("SUBSCRIBE", SWITCH_CHANNEL)
                conn.read_response()
                if addr:  # what may have switched while no sentinel was watched
                    self._tell((addr[0].decode(), int(addr[1])))
                backoff.reset()
                self._read_loop(conn)
            except Exception as exc:  # a sentinel that is down or restarting: the next one
                if not self._stopping.is_set():
                    log.debug("sentinel %s:%s: %s", host, port, exc)
            finally:
                with self._lock:
                    self._conn = None
                self.primary = None  # not watching: a switch now would go unheard
                try:
                    conn.disconnect()
                except Exception:  # already closed under us by stop()
                    pass
            self._stopping.wait(backoff.next())

    def _read_loop(self, conn: redis.Connection) -> None:
        service = self._parsed.service.encode() if self._parsed.service else b""
        for message in pushed_messages(conn, self._options.health_check_interval, self._stopping):
            if message[1] == SWITCH_CHANNEL:
                # "<service> <old ip> <old port> <new ip> <new port>"
                parts = message[2].split()
                if len(parts) == 5 and parts[0] == service:
                    log.warning(
                        "sentinels switched %s's primary to %s:%s", self._parsed.service, parts[3].decode(), parts[4]
                    )
                    self._tell((parts[3].decode(), int(parts[4])))

    def _tell(self, address: tuple) -> None:
        self.primary = address
        callback = self._callback()
        if callback is None:
            self._stopping.set()
            return
        callback(address)
