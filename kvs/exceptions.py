"""Errors raised by the KVS layer, rooted at ``flow.exceptions.FlowError``.

    KVSError                      root of everything kvs raises on purpose
    ├── KVSConnectionError        (also RetryableError) server unreachable or timed out
    ├── StoreLostError            (also RetryableError) the server restarted empty: the data is gone
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
