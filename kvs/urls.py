"""The store URL forms: one Redis server, a Sentinel-managed primary, or a Redis Cluster.

    redis://[[user]:password@]host:port/db          one server (also rediss://, unix://)
    redis+sentinel://[[user]:password@]s1:26379,s2:26379/service[/db]
    redis+cluster://[[user]:password@]n1:7000,n2:7001

The password is the data nodes' (primary and replicas; every Cluster node); sentinels that
require one of their own take ``?sentinel_password=...``. The host list is where to start:
the Sentinel form names sentinels (the client asks them for the primary), the Cluster
form any nodes of the cluster (the client learns the rest). The ``+`` schemes follow
Celery's and kombu's ``sentinel://`` convention in the shape node-redis and Lettuce use
(``redis-sentinel://``, a host list, the service in the path).

Two query parameters say which writes must survive a failover (``kvs/replicas.py``):
``wait_replicas=N`` (the writes that must survive, plans, the registry and ``put``/``mput``,
wait until N replicas hold them; default 1 for Sentinel and Cluster, 0 for one server)
and ``wait_timeout=S`` (seconds, default 1).

    >>> u = parse_store_url("redis+sentinel://:pw@h1:26379,h2:26379/mymaster/0")
    >>> u.kind, u.hosts, u.service, u.db, u.wait_replicas
    ('sentinel', (('h1', 26379), ('h2', 26379)), 'mymaster', 0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode

from flow.errors import FlowTypeError, FlowValueError
from kvs.redact import redact_url

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_ONE_SERVER = ("redis", "rediss", "unix")
_OURS = ("wait_replicas", "wait_timeout")  # read here, never passed to redis-py
_SENTINEL_PARAMS = ("sentinel_password", "sentinel_username")
DEFAULT_WAIT_TIMEOUT = 1.0


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL (``parse_store_url``).

    kind: ``"redis"`` (one server), ``"sentinel"`` or ``"cluster"``.
    url: for one server, the URL redis-py reads (this module's parameters removed).
    hosts: sentinels or cluster nodes to start from, ``(host, port)`` each.
    service: the Sentinel service (its primary's name); db: the database number.
    wait_replicas / wait_timeout: see the module docstring.
    """

    kind: str
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    wait_replicas: int = 0
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT

    @property
    def replicated(self) -> bool:
        """Sentinel or Cluster: a primary may be replaced by a replica."""
        return self.kind != "redis"


def parse_store_url(url: str) -> StoreURL:
    """``url`` parsed, or ``FlowValueError`` saying what is wrong with it (the password
    masked)."""
    if not isinstance(url, str):
        raise FlowTypeError(f"a store URL must be a str, got {type(url).__name__} ({redact_url(url)})")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "no scheme; expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://")
    scheme = scheme.lower()
    rest, _, query = rest.partition("?")
    rest = rest.split("#", 1)[0]
    params = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in params if k in _OURS}
    replicas, timeout = _wait(url, ours, default=0 if scheme in _ONE_SERVER else 1)
    if scheme in _ONE_SERVER:
        kept = [(k, v) for k, v in params if k not in _OURS]
        head = url.split("?", 1)[0].split("#", 1)[0]
        return StoreURL(
            "redis", head + ("?" + urlencode(kept) if kept else ""), wait_replicas=replicas, wait_timeout=timeout
        )
    if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        raise _bad(
            url,
            f"unknown scheme {scheme!r}; expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://",
        )
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    hosts = tuple(_host_port(url, h) for h in hostlist.split(","))
    extra = {k: v for k, v in params if k not in _OURS}
    if scheme == CLUSTER_SCHEME:
        if path.strip("/") not in ("", "0"):
            raise _bad(url, f"a Redis Cluster has only database 0, got path {'/' + path!r}")
        if extra:
            raise _bad(url, f"unknown parameter(s) {sorted(extra)}; known: {list(_OURS)}")
        return StoreURL(
            "cluster",
            url,
            hosts,
            username=username,
            password=password,
            wait_replicas=replicas,
            wait_timeout=timeout,
        )
    unknown = sorted(set(extra) - set(_SENTINEL_PARAMS))
    if unknown:
        raise _bad(url, f"unknown parameter(s) {unknown}; known: {list(_OURS + _SENTINEL_PARAMS)}")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise _bad(url, "the path must be /<service>[/<db>], the name Sentinel monitors the primary under")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise _bad(url, f"the database must be a number, got {parts[1]!r}")
        db = int(parts[1])
    return StoreURL(
        "sentinel",
        url,
        hosts,
        service=unquote(parts[0]),
        db=db,
        username=username,
        password=password,
        sentinel_username=extra.get("sentinel_username") or None,
        sentinel_password=extra.get("sentinel_password") or None,
        wait_replicas=replicas,
        wait_timeout=timeout,
    )


def _host_port(url: str, text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, close, after = text[1:].partition("]")
        if not close or not after.startswith(":"):
            raise _bad(url, f"host {text!r} must be [address]:port")
        port_text = after[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise _bad(url, f"host {text!r} has no port (host:port, comma-separated)")
    if not host:
        raise _bad(url, f"host {text!r} has no name")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(url, f"host {text!r} has no valid port (1..65535)")
    return host, int(port_text)


def _wait(url: str, ours: dict, default: int) -> tuple[int, float]:
    replicas, timeout = default, DEFAULT_WAIT_TIMEOUT
    if "wait_replicas" in ours:
        text = ours["wait_replicas"]
        if not text.isdigit():
            raise _bad(url, f"wait_replicas must be an int >= 0, got {text!r}")
        replicas = int(text)
    if "wait_timeout" in ours:
        text = ours["wait_timeout"]
        try:
            timeout = float(text)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout < 3600:
            raise _bad(url, f"wait_timeout must be seconds in (0, 3600), got {text!r}")
    return replicas, timeout


def _bad(url: str, why: str) -> FlowValueError:
    return FlowValueError(f"bad store URL {redact_url(url)!r}: {why}")
