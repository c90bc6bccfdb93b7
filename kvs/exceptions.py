"""Errors raised by the KVS layer, rooted at ``flow.exceptions.FlowError``.

    KVSError                      root of everything kvs raises on purpose
    ├── KVSConnectionError        (also RetryableError) server unreachable or timed out
    ├── StoreLostError            (also RetryableError) the server restarted empty: the data is gone
    ├── StoreWriteError           (also RetryableError) the server refuses writes: it cannot write its
    │                             disk (full or read-only), or it is a read-only replica
    ├── KeyNotFoundError          (also KeyError) get/mget of a missing key, no default
    ├── SerializationError        (also TypeError) a value the codec refuses or cannot read
    ├── ServerStartError          the embedded redis-server could not be found or started
    ├── KVSTypeError              (also TypeError) a wrong argument type (a non-str key)
    └── KVSValueError             (also ValueError) a bad argument value (an option, a URL)

Grouped by what the caller can do, like redis-py's tree: retry a
``KVSConnectionError``; fix the key or the value for the others.
"""

from __future__ import annotations

from flow.exceptions import FlowError, RetryableError


class KVSError(FlowError):
    """Root of every error the KVS layer raises on purpose."""


class KVSConnectionError(KVSError, RetryableError):
    """The Redis server at ``url`` did not answer within the retry budget.

    Retryable: the client reconnects by itself once the server is back.
    """

    def __init__(self, message: str, *, url: str | None = None):
        super().__init__(message)
        self.url = url

    def __reduce__(self):  # keep ``url`` when sent to another process
        return (_rebuild, (type(self), self.args[0], {"url": self.url}))


class StoreLostError(KVSError, RetryableError):
    """A key is missing because the store lost its data (it restarted empty: the data
    marker of ``kvs.markers`` is gone), not because it was never written.

    Retryable (HTTP 503): the answer changes once the data is written again.
    """


class StoreWriteError(KVSError, RetryableError):
    """The server refuses writes for now: it cannot persist them to its disk (full or
    read-only: Redis answers MISCONF), it is a read-only replica, or it is out of memory.
    Reads still work. Retryable (HTTP 503): it takes writes again once the cause is gone,
    by itself for a disk that has space again."""


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
    return text


def is_write_refusal(error: BaseException) -> bool:
    """Whether a Redis error is the server refusing writes for now (``StoreWriteError``)."""
    return _reply(error).split(" ", 1)[0] in ("MISCONF", "READONLY", "OOM")


def _reply(error: BaseException) -> str:
    """The server's error reply, without what redis-py puts before it in a pipeline."""
    text = str(error)
    return text.split(" of pipeline caused error: ", 1)[-1]


class KeyNotFoundError(KVSError, KeyError):
    """``get``/``mget`` found no value for ``key`` and no default was given."""

    def __init__(self, key: str, message: str | None = None):
        super().__init__(message or f"key {key!r} not found in the KVS")
        self.key = key

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.key, self.args[0]))


class SerializationError(KVSError, TypeError):
    """The codec refuses a value (unsupported type, object array, untrusted pickle)
    or cannot read stored bytes (unknown tag, truncated payload)."""


class ServerStartError(KVSError):
    """No redis-server binary was found, or it did not come up (message has its log tail)."""


class KVSTypeError(KVSError, TypeError):
    """An argument of the wrong type, e.g. a key that is not a ``str``."""


class KVSValueError(KVSError, ValueError):
    """An argument with a bad value, e.g. a negative timeout or a malformed URL;
    the message quotes the value."""


def _rebuild(cls, message, attrs):
    return cls(message, **attrs)
