"""Settings of a local cluster: one frozen, validated object with documented defaults."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from executors.autoscale import AutoscalingConfig
from executors.busypoll import MAX_MS as BUSY_POLL_MAX_MS
from kvs.options import KVSOptions


STATE_FILE = "cluster.json"  # a running local cluster's state (URL, tokens; mode 0600) in its directory
CONFIG_ENV = "FLOWSERVE_CLUSTER_CONFIG"  # the daemon's ClusterConfig JSON: the environment, not argv (a token)
KEY_ENV = "FLOWSERVE_CLUSTER_KEY"  # the cluster key (hex) plans are signed with; never stored in the KVS


def cluster_key(hex_key: str | None = None) -> bytes | None:
    """The cluster key from ``hex_key`` or else ``$FLOWSERVE_CLUSTER_KEY`` (None: plans
    unsigned, as on a Kubernetes deployment whose Secret does not carry one yet)."""
    value = hex_key if hex_key is not None else os.environ.get(KEY_ENV)
    if not value:
        return None
    try:
        key = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"{KEY_ENV} must be hex, got {len(value)} characters that are not") from None
    if len(key) < 16:
        raise ValueError(f"{KEY_ENV} must hold at least 16 bytes (32 hex digits), got {len(key)}")
    return key


def default_executors() -> int:
    """One executor per core, at least two."""
    return max(2, os.cpu_count() or 2)


@dataclass(frozen=True)
class ClusterConfig:
    """How the embedded local cluster runs.

    host/port: where the gateway listens (default 127.0.0.1 and a free port; bind
        0.0.0.0 only on purpose, and then set ``token``).
    executors: CPU executor processes (default: one per core, at least 2).
    gpu_executors: GPU-class executor processes (default 0; stages with gpu=True then
        run on CPU executors, with a warning).
    threads: worker threads per executor.
    token: optional bearer token the gateway then requires on every route but /healthz
        (the admin token is accepted too; admin routes need the admin token).
    public_metrics: with a token, serve /metrics without it (a scraper with no
        credentials; default False).
    max_body_bytes: request bodies above this get 413 (default 64 MiB).
    max_rows: requests with more rows get 413 (default 1,000,000).
    max_header_bytes / max_headers: a request head larger, or with more headers, gets 431
        before anything of it is kept (defaults 64 KiB, 100).
    header_timeout_s / body_timeout_s: a client that has not sent its request head, or its
        body, within this long gets 408 and its connection closed (defaults 10 s, 60 s).
    max_connections: open HTTP connections at most; more get 503 with Retry-After (1024).
    request_timeout_s: a request not answered within this gets 504.
    load_timeout_s: how long building a flow's stages (loading models) may take.
    max_retries: re-runs of a request whose executor died.
    restart_executors: the supervisor restarts an executor that dies (default True).
    autoscaling: an ``AutoscalingConfig`` (or its JSON dict) to scale each stage's replicas
        on its own load (default None: every stage may run on every executor).
    max_executors: executor processes the autoscaler may grow the cluster to.
    colocate: among equally loaded executors, run a stage where its input already is, and
        hand the Table over in-process (default True). False spreads consecutive stages
        over different executors, as on a cluster of many machines; the benchmarks use it
        to reproduce the research's one-function-per-executor setting.
    executor_cache_bytes: byte budget of each executor's local KVS cache (default 256 MiB).
        Lookups of keys it holds cost no round trip to Redis; continuations route each
        key to one executor, so the cluster caches about executors x this much.
    busy_poll_ms: after a message, the gateway and each executor keep polling for this long
        before sleeping (default 10): a woken process runs slowly for a while, so polling
        cuts each hop's latency; each poll yields the CPU to runnable work, so it uses idle
        time only. 0 turns it off (executors/busypoll.py).
    stuck_grace_s: an executor whose abandoned work (a run past its deadline or its
        operator's ``timeout_s``, already answered 504) has not come back within this long
        is recycled: a new process takes its place (default 10; executors/watchdog.py).
    persistence: keep the KVS on disk (append-only file, fsync every second) so its data
        survives a restart of the KVS server (default True; `flowserve up` too). The
        embedded cluster's directory is temporary unless ``dir`` is set, so its data
        lasts as long as the cluster. False: a KVS restart loses every plan and every
        value (gateways re-publish their flows; lookups answer 503 until data is back).
    dir: where state, logs and sockets live (None: a private temporary directory).
    """

    host: str = "127.0.0.1"
    port: int = 0
    executors: int = dataclasses.field(default_factory=default_executors)
    gpu_executors: int = 0
    threads: int = 4
    token: str | None = None
    public_metrics: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    max_rows: int = 1_000_000
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 1024
    request_timeout_s: float = 30.0
    load_timeout_s: float = 300.0
    max_retries: int = 2
    restart_executors: bool = True
    autoscaling: Any = None
    max_executors: int = 8
    colocate: bool = True
    busy_poll_ms: float = 10.0
    executor_cache_bytes: int = KVSOptions.cache_max_bytes  # one default for every cache
    stuck_grace_s: float = 10.0
    persistence: bool = True
    dir: str | None = None

    def __post_init__(self):
        def need(cond: bool, field: str, what: str):
            if not cond:
                raise ValueError(f"ClusterConfig.{field} must be {what}, got {getattr(self, field)!r}")

        need(isinstance(self.host, str) and bool(self.host), "host", "a host name or address")
        need(_int(self.port) and 0 <= self.port < 65536, "port", "an int in 0..65535 (0: a free port)")
        need(_int(self.executors) and self.executors >= 1, "executors", "an int >= 1")
        need(_int(self.gpu_executors) and self.gpu_executors >= 0, "gpu_executors", "an int >= 0")
        need(_int(self.threads) and 1 <= self.threads <= 256, "threads", "an int in 1..256")
        need(self.token is None or (isinstance(self.token, str) and len(self.token) >= 8), "token",
             "None or a string of at least 8 characters")
        need(_int(self.max_body_bytes) and self.max_body_bytes >= 1024, "max_body_bytes", "an int >= 1024")
        need(_num(self.request_timeout_s) and self.request_timeout_s > 0, "request_timeout_s", "a number > 0")
        need(_int(self.max_rows) and self.max_rows >= 1, "max_rows", "an int >= 1")
        need(_int(self.max_header_bytes) and self.max_header_bytes >= 1024, "max_header_bytes", "an int >= 1024")
        need(_int(self.max_headers) and self.max_headers >= 8, "max_headers", "an int >= 8")
        need(_num(self.header_timeout_s) and self.header_timeout_s > 0, "header_timeout_s", "a number > 0")
        need(_num(self.body_timeout_s) and self.body_timeout_s > 0, "body_timeout_s", "a number > 0")
        need(_int(self.max_connections) and self.max_connections >= 1, "max_connections", "an int >= 1")
        need(_num(self.load_timeout_s) and self.load_timeout_s > 0, "load_timeout_s", "a number > 0")
        need(_int(self.max_retries) and 0 <= self.max_retries <= 10, "max_retries", "an int in 0..10")
        need(isinstance(self.persistence, bool), "persistence", "a bool")
        need(isinstance(self.public_metrics, bool), "public_metrics", "a bool")
        need(isinstance(self.restart_executors, bool), "restart_executors", "a bool")
        need(_int(self.max_executors) and self.max_executors >= 1, "max_executors", "an int >= 1")
        need(isinstance(self.colocate, bool), "colocate", "a bool")
        need(_num(self.busy_poll_ms) and 0 <= self.busy_poll_ms <= BUSY_POLL_MAX_MS, "busy_poll_ms",
             f"a number in 0..{BUSY_POLL_MAX_MS:g}")
        need(_int(self.executor_cache_bytes) and self.executor_cache_bytes >= 0, "executor_cache_bytes",
             "an int >= 0 (0: no local cache)")
        need(_num(self.stuck_grace_s) and 0 < self.stuck_grace_s <= 3600, "stuck_grace_s", "a number in (0, 3600]")
        if isinstance(self.autoscaling, dict):
            object.__setattr__(self, "autoscaling", AutoscalingConfig.from_json(self.autoscaling))
        need(self.autoscaling is None or isinstance(self.autoscaling, AutoscalingConfig), "autoscaling",
             "None or an AutoscalingConfig")
        need(self.dir is None or isinstance(self.dir, (str, os.PathLike)), "dir", "None or a path")

    def http_limits(self):
        """The HTTP edge's limits (executors/serving.py)."""
        from executors.serving import HttpLimits

        return HttpLimits(self.max_header_bytes, self.max_headers, self.header_timeout_s, self.body_timeout_s,
                          self.max_connections)

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.autoscaling is not None:
            doc["autoscaling"] = self.autoscaling.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "ClusterConfig":
        return cls(**doc)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
