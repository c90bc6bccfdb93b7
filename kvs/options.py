"""``KVSOptions``: every KVS/CachedKVS setting in one frozen, validated object.

One options object with documented defaults instead of a growing list of keyword
arguments (DESIGN §4); ``KVS.from_url(url, socket_timeout=1.0)`` builds one for you.

    >>> KVSOptions(retry_timeout=0.5).cache_max_bytes
    268435456
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from flow.configuration import Config, Int, Number, Str, setting

MiB = 1 << 20


_SECONDS = Number(gt=0, note="seconds")


@dataclass(frozen=True)
class KVSOptions(Config):
    """Client settings (seconds and bytes).

    Attributes:
        socket_timeout: longest wait for one reply (5 s). A hung server fails a call
            after this, then it is retried within ``retry_timeout``.
        connect_timeout: longest wait to open a TCP connection (2 s).
        retry_timeout: total time budget for retrying a call that failed on a
            connection error or timeout (5 s; 0 = no retry). After it a
            ``UnreachableError`` is raised; the worst case is this plus one
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

    socket_timeout: float = setting(5.0, _SECONDS)
    connect_timeout: float = setting(2.0, _SECONDS)
    retry_timeout: float = setting(5.0, Number(ge=0, note="seconds; 0: no retry"))
    backoff_base: float = setting(0.01, _SECONDS)
    backoff_cap: float = setting(0.5, _SECONDS)
    max_connections: int = setting(64, Int(1))
    cache_max_bytes: int = setting(256 * MiB, Int(0, note="0: no local cache"))
    health_check_interval: float = setting(5.0, _SECONDS)
    client_name: str | None = setting(
        "flowserve",
        Str("a non-empty string without spaces", lambda v: bool(v) and not any(c.isspace() for c in v), optional=True),
    )

    def _validate(self) -> None:
        if self.backoff_base > self.backoff_cap:
            raise self.error(
                f"KVSOptions.backoff_base must be <= backoff_cap, got {self.backoff_base!r} > {self.backoff_cap!r}"
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
