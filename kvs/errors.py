"""The KVS layer's own errors, leaves of the one tree in ``flow.errors``.

    StoreLostError        (RetryableError) the server restarted empty: the data is gone  -> 503
    StoreWriteError       (RetryableError) the server refuses writes: it cannot write its
                          disk (full or read-only), it is a read-only replica, out of memory,
                          or no replica confirmed a write that must survive a failover
    KeyNotFoundError      (DataError, KeyError) get/mget of a missing key, no default
    SerializationError    (FlowTypeError) a value the codec refuses, or bytes it cannot read

The rest are the tree's shared classes: ``UnreachableError`` (the server did not answer
within the retry budget: retry), ``AccessDeniedError`` (it refused the password),
``FlowTypeError``/``FlowValueError`` (a wrong argument: a non-str key, a malformed URL),
``ConfigError`` (a ``KVSOptions`` field), ``InternalError`` (a command the server rejected,
a redis-server that did not start), ``NotInstalledError`` (no redis-server binary).
"""

from __future__ import annotations

from flow.errors import DataError, FlowTypeError, RetryableError


class StoreLostError(RetryableError):
    """A key is missing because the store lost its data (it restarted empty: the data
    marker of ``kvs.markers`` is gone), not because it was never written.

    Retryable (HTTP 503): the answer changes once the data is written again.
    """


class StoreWriteError(RetryableError):
    """The server refuses writes for now: it cannot persist them to its disk (full or
    read-only: Redis answers MISCONF), it is a read-only replica, it is out of memory, or
    too few replicas confirmed a write that must survive a failover (NOREPLICAS,
    kvs/replicas.py). Reads still work. Retryable (HTTP 503): it takes writes again once
    the cause is gone, by itself for a disk that has space again or a replica that is back."""


def store_problem(error: BaseException) -> str:
    """A store's refusal in words a user can act on (Redis's MISCONF names neither the
    disk nor what to do); any other error as it is."""
    text = _reply(error)
    head = text.split(" ", 1)[0]
    if head == "MISCONF":
        return (
            "the store cannot write to its disk (full or read-only?), so it refuses writes until it can; "
            f"free space there and it recovers by itself. Redis said: {text}"
        )
    if head == "READONLY":
        return f"the store is a read-only replica; point the cluster at the primary. Redis said: {text}"
    if head == "OOM":
        return f"the store is out of memory (its maxmemory); free keys or give it more. Redis said: {text}"
    if head == "NOREPLICAS":
        return (
            "the store's primary has too few replicas confirming writes, so a write that must survive a "
            f"failover did not succeed; it does once a replica is attached again. Redis said: {text}"
        )
    return text


def is_write_refusal(error: BaseException) -> bool:
    """Whether a Redis error is the server refusing writes for now (``StoreWriteError``)."""
    return _reply(error).split(" ", 1)[0] in ("MISCONF", "READONLY", "OOM", "NOREPLICAS")


def _reply(error: BaseException) -> str:
    """The server's error reply, without what redis-py puts before it in a pipeline, and
    with the error code redis-py strips from the errors it has a class for (READONLY, OOM)."""
    text = str(error).split(" of pipeline caused error: ", 1)[-1]
    code = getattr(error, "status_code", None)
    if isinstance(code, str) and code and not text.startswith(code):
        text = f"{code} {text}"
    return text


class KeyNotFoundError(DataError, KeyError):
    """``get``/``mget`` found no value for ``key`` and no default was given."""

    key: str | None = None

    def __init__(self, key: str, message: str | None = None):
        super().__init__(message or f"key {key!r} not found in the KVS", key=key)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.key, self.args[0]), self.__dict__)


class SerializationError(FlowTypeError):
    """The codec refuses a value (unsupported type, object array, untrusted pickle)
    or cannot read stored bytes (unknown tag, truncated payload, a signature for another
    key): fix what is stored."""
