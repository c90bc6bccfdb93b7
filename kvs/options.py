"""``KVSOptions``: every KVS/CachedKVS setting in one frozen, validated object.

One options object with documented defaults instead of a growing list of keyword
arguments (DESIGN §4); ``KVS.from_url(url, socket_timeout=1.0)`` builds one for you.

    >>> KVSOptions(retry_timeout=0.5).cache_max_bytes
    268435456
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from kvs.exceptions import KVSTypeError, KVSValueError

MiB = 1 << 20


@dataclass(frozen=True)
class KVSOptions:
    """Client settings (seconds and bytes).

    Attributes:
        socket_timeout: longest wait for one reply (5 s). A hung server fails a call
            after this, then it is retried within ``retry_timeout``.
        connect_timeout: longest wait to open a TCP connection (2 s).
        retry_timeout: total time budget for retrying a call that failed on a
            connection error or timeout (5 s; 0 = no retry). After it a
            ``KVSConnectionError`` is raised; the worst case is this plus one
            ``socket_timeout``.
        backoff_base: first retry delay; it doubles per failure (0.01 s).
        backoff_cap: longest delay between retries (0.5 s).
        max_connections: connections per pool; more concurrent callers wait for a
            free one up to ``socket_timeout`` (64).
        cache_max_bytes: byte budget of ``CachedKVS``'s local LRU (256 MiB); a value
            larger than this is never cached.
        health_check_interval: ``CachedKVS`` pings its invalidation connection when it
            was idle this long, and declares it lost (flushing the cache) when the
            PONG does not come within another interval (5 s).
        client_name: ``CLIENT SETNAME`` for the connections, visible in ``CLIENT LIST``.
    """

    socket_timeout: float = 5.0
    connect_timeout: float = 2.0
    retry_timeout: float = 5.0
    backoff_base: float = 0.01
    backoff_cap: float = 0.5
    max_connections: int = 64
    cache_max_bytes: int = 256 * MiB
    health_check_interval: float = 5.0
    client_name: str | None = "flowserve"

    def __post_init__(self) -> None:
        for name in ("socket_timeout", "connect_timeout", "backoff_base", "backoff_cap",
                     "health_check_interval"):
            _number(name, getattr(self, name), allow_zero=False)
        _number("retry_timeout", self.retry_timeout, allow_zero=True)
        _integer("max_connections", self.max_connections, minimum=1)
        _integer("cache_max_bytes", self.cache_max_bytes, minimum=0)
        if self.backoff_base > self.backoff_cap:
            raise KVSValueError(
                f"backoff_base must be <= backoff_cap, got {self.backoff_base!r} > {self.backoff_cap!r}"
            )
        if self.client_name is not None:
            if not isinstance(self.client_name, str):
                raise KVSTypeError(f"client_name must be a str or None, got {self.client_name!r}")
            if not self.client_name or any(c.isspace() for c in self.client_name):
                raise KVSValueError(
                    f"client_name must be non-empty without spaces, got {self.client_name!r}"
                )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _number(name: str, value, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KVSTypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise KVSValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _integer(name: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVSTypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise KVSValueError(f"{name} must be >= {minimum}, got {value!r}")
