"""``KVS``: the Redis-backed key-value store client used by every FlowServe process.

Values go through the codec in ``kvs.serialization`` (numpy arrays, Tables, bytes, str,
JSON-able data, ``KVSRef``); ``.redis`` gives the raw redis-py client for the hashes
other layers keep (membership, metrics): a ``redis.Redis`` for one server or a Sentinel
primary, a ``RedisCluster`` for a Cluster (``kvs/urls.py`` has the URL forms).

Connection errors and timeouts are retried with exponential backoff for at most
``options.retry_timeout`` seconds, then raised as ``UnreachableError`` (retryable,
names the URL); the pool reconnects by itself when the server comes back. redis-py's
pool notices a ``fork`` (it checks the pid) and opens fresh sockets in the child.

    >>> store = KVS.from_url("redis://127.0.0.1:6379/0", retry_timeout=1.0)  # doctest: +SKIP
    >>> store.put("w", np.ones(3)); store.get("w")                             # doctest: +SKIP
    array([1., 1., 1.])
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import redis
from redis import ConnectionPool
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from flow.errors import AccessDeniedError, FlowTypeError, FlowValueError, InternalError, UnreachableError
from kvs.connect import StoreClient, close_client, open_client
from kvs.errors import (
    KeyNotFoundError,
    SerializationError,
    StoreLostError,
    StoreWriteError,
    is_write_refusal,
    store_problem,
)
from kvs.markers import DATA_MARKER
from kvs.options import KVSOptions
from kvs.redact import redact_url
from kvs.replicas import Write, written
from kvs.retry import Backoff, retry
from kvs.serialization import decode, dumps_trusted, encode, sign_trusted
from kvs.urls import parse_store_url

T = TypeVar("T")

#: Default for ``get``/``mget``'s ``default``: raise ``KeyNotFoundError`` instead.
MISSING: Any = object()


def check_key(key: Any) -> str:
    """Keys are ``str``; anything else is a ``FlowTypeError`` naming the type."""
    if type(key) is not str:
        if isinstance(key, str):
            return str(key)
        raise FlowTypeError(f"KVS keys must be str, got {type(key).__name__} ({key!r})")
    return key


class Retrier:
    """Runs a Redis call, retrying connection errors and timeouts with jittered
    exponential backoff (``kvs.retry``) until ``options.retry_timeout`` has passed since
    the first failure; then raises ``UnreachableError`` naming the (redacted) URL.

    Authentication failures and command errors are not retried: they will not fix
    themselves, so they surface at once (``AccessDeniedError``, ``InternalError``). ``clock`` and ``sleep`` are
    injectable for tests.
    """

    def __init__(
        self,
        url: str,
        options: KVSOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
    ):
        self.url = redact_url(url)
        self.options = options
        self._clock, self._sleep = clock, sleep

    def __call__(self, fn: Callable[[], T], what: str = "call") -> T:
        try:
            return fn()  # every KVS call comes here: a success costs nothing more
        except Exception as exc:  # retry() sorts it: retried if reconnecting may help, else re-raised
            first = exc
        o = self.options
        backoff = Backoff(o.backoff_base, o.backoff_cap)
        try:
            return retry(
                fn,
                backoff=backoff,
                retry_if=_reconnecting_may_help,
                give_up_after=o.retry_timeout,
                clock=self._clock,
                sleep=self._sleep,
                failed=first,
            )
        except (AuthenticationError, AuthorizationError) as exc:
            raise AccessDeniedError(f"Redis at {self.url} refused the credentials: {exc}") from exc
        except redis.BusyLoadingError as exc:  # a ConnectionError in redis-py: said apart, as it ends by itself
            raise UnreachableError(
                f"Redis at {self.url} is loading its data (it has just restarted): {what} waited "
                f"retry_timeout={o.retry_timeout:g} s for it; try again shortly",
                url=self.url,
            ) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise UnreachableError(
                f"Redis at {self.url} unreachable: {what} failed {backoff.failures + 1} time(s) within "
                f"retry_timeout={o.retry_timeout:g} s; last error: {exc}",
                url=self.url,
            ) from exc
        except redis.ResponseError as exc:
            if is_write_refusal(exc):
                raise StoreWriteError(f"Redis at {self.url} refused {what}: {store_problem(exc)}") from exc
            raise InternalError(f"Redis at {self.url} rejected {what}: {exc}") from exc
        except (ClusterDownError, TryAgainError, SlotNotCoveredError) as exc:
            raise UnreachableError(
                f"Redis Cluster at {self.url} did not serve {what} within retry_timeout={o.retry_timeout:g} s "
                f"(a failover or resharding under way?); last error: {type(exc).__name__}: {exc}",
                url=self.url,
            ) from exc
        except redis.RedisError as exc:
            raise InternalError(f"Redis at {self.url}: {what} failed: {exc}") from exc
        except RedisClusterException as exc:  # redis-py's cluster errors are not RedisErrors
            raise InternalError(f"Redis Cluster at {self.url}: {what} failed: {exc}") from exc


#: a Cluster in a failover (no primary for a slot yet) or a resharding (a slot between nodes)
_CLUSTER_TRANSIENT = (ClusterDownError, TryAgainError, SlotNotCoveredError)


def _reconnecting_may_help(error: BaseException) -> bool:
    """Connection losses, timeouts and a Cluster's failovers heal by themselves; refused
    credentials (a ConnectionError in redis-py) do not."""
    if isinstance(error, (AuthenticationError, AuthorizationError)):
        return False
    return isinstance(error, (redis.ConnectionError, redis.TimeoutError, *_CLUSTER_TRANSIENT))


def mget(client: StoreClient, keys: list[str]) -> list:
    """MGET of ``keys`` in order; on a Cluster one MGET per slot, pipelined per node."""
    if isinstance(client, RedisCluster):
        return client.mget_nonatomic(keys)
    return client.mget(keys)


class KVS:
    """A Redis-backed key-value store of FlowServe values (see the module docstring).

    Thread-safe (a blocking connection pool) and fork-safe. Use ``from_url``.
    """

    def __init__(self, url: str, options: KVSOptions | None = None, *, signing_key: bytes | None = None):
        if options is None:
            options = KVSOptions()
        elif not isinstance(options, KVSOptions):
            raise FlowTypeError(f"options must be a KVSOptions, got {type(options).__name__}")
        self._url = url
        self._options = options
        self._store_url = parse_store_url(url)
        self._retry = Retrier(url, options)
        self._closed = False
        self._client_lock = threading.Lock()
        self._client: StoreClient | None = None
        if self._store_url.kind != "cluster":
            self._client = open_client(self._store_url, options)  # connects on first use
        # the cluster key (never stored in the KVS): trusted pickles are signed with it on
        # put_trusted and checked before any is unpickled (kvs.serialization.sign_trusted)
        if signing_key is not None and (not isinstance(signing_key, bytes) or len(signing_key) < 16):
            raise FlowValueError("signing_key must be bytes of at least 16 (the cluster key)")
        self._signing_key = signing_key

    @classmethod
    def from_url(cls, url: str, options: KVSOptions | None = None, *, signing_key: bytes | None = None, **fields: Any):
        """Connect lazily to ``url``: ``redis://[:password@]host:port/db``, a Sentinel
        primary (``redis+sentinel://[:password@]s1:26379,s2:26379/service/db``) or a
        Cluster (``redis+cluster://[:password@]n1:7000,n2:7001``); ``kvs/urls.py``.

        ``fields`` override single options, e.g. ``KVS.from_url(url, retry_timeout=1)``.

            >>> store = KVS.from_url(server.url)                    # doctest: +SKIP
        """
        return cls(url, _merge_options(options, fields), signing_key=signing_key)

    # -- properties --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server URL with the password redacted."""
        return self._retry.url

    @property
    def signing_key(self) -> bytes | None:
        """The cluster key trusted pickles are signed and checked with (None: unsigned)."""
        return self._signing_key

    @property
    def options(self) -> KVSOptions:
        return self._options

    @property
    def redis(self) -> Any:
        """The raw redis-py client (bytes in, bytes out) for hashes, counters and other
        structures outside the codec; it shares this client's connections. A
        ``redis.Redis``, or a ``RedisCluster`` for a Cluster store (built on first use: it
        asks a node for the cluster's map at once, and raises ``redis.ConnectionError``
        while none answers)."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = open_client(self._store_url, self._options)
                client = self._client
        return client

    @property
    def kind(self) -> str:
        """``"redis"`` (one server), ``"sentinel"`` or ``"cluster"``."""
        return self._store_url.kind

    # -- values ------------------------------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` (encoded; see ``kvs.serialization``).

        >>> store.put("model/version", 3)                      # doctest: +SKIP
        """
        key = check_key(key)
        self._set_encoded(key, encode(value), mark=True)

    def put_trusted(self, key: str, obj: Any) -> None:
        """Store a trusted internal object (e.g. a user function a deploy registers)
        with cloudpickle; read it back with ``get(key, trusted=True)``. With a cluster key
        it is signed for ``key``: read from any other key, it is refused."""
        key = check_key(key)
        data = dumps_trusted(obj)
        self._set_encoded(key, data if self._signing_key is None else sign_trusted(data, self._signing_key, key))

    def get(self, key: str, default: Any = MISSING, *, trusted: bool = False) -> Any:
        """The value under ``key``; ``default`` if it is missing, or
        ``KeyNotFoundError`` when no default is given.

            >>> store.get("absent", None) is None                  # doctest: +SKIP
            True
        """
        key = check_key(key)
        data = self._call(lambda: self.redis.get(key), "GET")
        if data is None:
            if default is MISSING:
                raise KeyNotFoundError(key)
            return default
        return decode_value(key, data, trusted, self._signing_key)

    def get_bytes(self, key: str) -> bytes | None:
        """The stored bytes under ``key`` (not decoded, never from a local cache), or None:
        for callers that keep a value exactly as stored, e.g. to write it back."""
        key = check_key(key)
        return self._call(lambda: self.redis.get(key), "GET")  # bytes: the pool never decodes replies

    def mget(self, keys: Iterable[str], default: Any = MISSING, *, trusted: bool = False) -> list:
        """Values of ``keys`` in order, in one round trip. A missing key gives
        ``default``, or ``KeyNotFoundError`` when no default is given (pass your own
        sentinel object as ``default`` to detect missing keys)."""
        keys = [check_key(k) for k in keys]
        if not keys:
            return []
        blobs = self._call(lambda: mget(self.redis, keys), "MGET")
        return [
            _value_or_default(k, b, default, trusted, self._signing_key) for k, b in zip(keys, blobs)
        ]  # bytes: the pool never decodes replies

    def mput(self, mapping: Mapping[str, Any]) -> None:
        """Store several values atomically (one MSET; on a Cluster, atomically per slot:
        one MSET per slot, pipelined per node)."""
        encoded = {check_key(k): encode(v) for k, v in mapping.items()}
        if not encoded:
            return

        def write():
            client = self.redis
            # user data: its marker goes with it (kvs/markers.py)
            if not isinstance(client, RedisCluster):
                pairs = [x for kv in {**encoded, DATA_MARKER: b"1"}.items() for x in kv]
                return written(client, [Write(DATA_MARKER, ("MSET", *pairs))])
            by_slot: dict[int, list] = {}
            for k, v in encoded.items():
                by_slot.setdefault(client.keyslot(k), []).extend((k, v))
            writes = [Write(pairs[0], ("MSET", *pairs)) for pairs in by_slot.values()]
            return written(client, [*writes, Write(DATA_MARKER, ("SET", DATA_MARKER, b"1"), wait=False)])

        self._call(write, "MSET")

    def delete(self, *keys: str) -> int:
        """Delete ``keys``; returns how many existed."""
        keys = tuple(check_key(k) for k in keys)
        if not keys:
            return 0
        return int(self._call(lambda: self.redis.delete(*keys), "DEL"))

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value."""
        key = check_key(key)
        return bool(self._call(lambda: self.redis.exists(key), "EXISTS"))

    def raise_if_lost(self, keys) -> None:
        """Raise ``StoreLostError`` if the store lost its data (its data marker is gone,
        kvs/markers.py), so that ``keys`` are missing because of a server-side loss.
        A lookup asks this before it calls a key missing; the marker is read from the
        server, never from a local cache."""
        if not self._call(lambda: self.redis.exists(DATA_MARKER), "EXISTS"):
            shown = ", ".join(repr(k) for k in list(keys)[:3])
            raise StoreLostError(
                f"the KVS at {self.url} lost its data (it restarted empty); "
                f"key(s) {shown} are missing because of that: write the data again, then retry"
            )

    def ping(self) -> bool:
        """True if the server answers (raises ``UnreachableError`` otherwise)."""
        return bool(self._call(lambda: self.redis.ping(), "PING"))

    def call(self, fn: Callable[[Any], T], what: str) -> T:
        """``fn(self.redis)``, with this client's retries (a restart or failover of the store
        is waited out, within ``retry_timeout``) and its errors as the tree's classes
        (``UnreachableError``, ``StoreWriteError``, ...): for the runtime's own scripts
        (``executors/plans.py``) and structures outside the codec.

            >>> store.call(lambda r: r.incr("counter"), "INCR")        # doctest: +SKIP
            1
        """
        return self._call(lambda: fn(self.redis), what)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close all connections. Idempotent; the object is unusable afterwards."""
        if not self._closed:
            self._closed = True
            with self._client_lock:
                client = self._client
            if client is not None:
                close_client(client)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- internals shared with CachedKVS -----------------------------------------------

    def _call(self, fn: Callable[[], T], what: str) -> T:
        if self._closed:
            raise FlowValueError(f"{type(self).__name__} for {self.url} is closed")  # as a closed file
        try:
            return self._retry(fn, what)
        except StoreWriteError as e:
            where = self.data_dir() if "cannot write to its disk" in str(e) else None
            if where is None:
                raise
            raise StoreWriteError(f"{e} (the store's data directory: {where})") from e.__cause__

    def data_dir(self) -> str | None:
        """Where the server keeps its data, to name the disk in an error (None if it will
        not say: CONFIG may be renamed or refused on a managed server)."""
        try:
            # keys are bytes here (the pool does not decode), though redis-py types them str
            reply: Any = self.redis.config_get("dir")
        except redis.RedisError:
            return None
        value = reply.get(b"dir", reply.get("dir")) if isinstance(reply, dict) else None
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    def _plain_pool(self) -> ConnectionPool:
        """The connection pool of a one-server or Sentinel store (a Cluster has one per node)."""
        client = self.redis
        if isinstance(client, RedisCluster):
            raise FlowValueError(f"{self.url} is a Redis Cluster: it has a pool per node")
        return client.connection_pool

    def _set_encoded(self, key: str, data: bytes, mark: bool = False) -> None:
        """SET, waiting for the replicas the store URL names (``kvs/replicas.py``); with
        ``mark`` (user data) the data marker too, in the same round trip."""
        writes = [Write(key, ("SET", key, data))]
        if mark:
            writes.append(Write(DATA_MARKER, ("SET", DATA_MARKER, b"1"), wait=False))
        self._call(lambda: written(self.redis, writes), "SET")


def decode_value(key: str, data: bytes, trusted: bool, signing_key: bytes | None = None) -> Any:
    """``decode`` of the value read from ``key``: a signed pickle must have been signed for
    ``key``; any ``SerializationError`` names the key."""
    try:
        return decode(data, trusted=trusted, signing_key=signing_key, key=key)
    except SerializationError as exc:
        raise SerializationError(f"value of key {key!r}: {exc}") from None


def _value_or_default(
    key: str, data: bytes | None, default: Any, trusted: bool, signing_key: bytes | None = None
) -> Any:
    if data is None:
        if default is MISSING:
            raise KeyNotFoundError(key)
        return default
    return decode_value(key, data, trusted, signing_key)


def _merge_options(options: KVSOptions | None, fields: dict) -> KVSOptions:
    if options is not None and not isinstance(options, KVSOptions):
        raise FlowTypeError(f"options must be a KVSOptions, got {type(options).__name__}")
    if not fields:
        return options or KVSOptions()
    unknown = sorted(set(fields) - set(KVSOptions.field_names()))
    if unknown:
        raise FlowTypeError(
            f"unknown KVS option(s) {', '.join(map(repr, unknown))}; known: {', '.join(KVSOptions.field_names())}"
        )
    return dataclasses.replace(options or KVSOptions(), **fields)
