"""Settings of a local cluster: one frozen, validated object with documented defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from executors.hosts.autoscale import AutoscalingConfig
from executors.tracing import TracingConfig
from executors.wire.busypoll import WINDOW_MS
from flow.configuration import (
    Bool,
    Check,
    Config,
    Int,
    Invalid,
    Nested,
    Number,
    Str,
    setting,
)
from flow.errors import FlowValueError
from kvs.options import KVSOptions
from kvs.urls import parse_store_url

STATE_FILE = "cluster.json"  # a running local cluster's state (URL, tokens; mode 0600) in its directory
# a starting cluster's progress on a long step (its store loading its data), for whoever waits
# for it to start (LocalCluster.start): rewritten about once a second, removed when done
STARTING_FILE = "starting.json"
CONFIG_ENV = "FLOWSERVE_CLUSTER_CONFIG"  # the daemon's ClusterConfig JSON: the environment, not argv (a token)


_SECONDS = Number(gt=0, note="seconds")


def _token(value, name: str):
    """None or a string of at least 8 characters; the message does not quote a token (a secret)."""
    if value is not None and (not isinstance(value, str) or len(value) < 8):
        got = f"a string of {len(value)} characters" if isinstance(value, str) else repr(value)
        raise Invalid(
            message=f"{name} must be None or a string of at least 8 characters, got {got}",
            wrong_type=not isinstance(value, str),
        )
    return value


def _kvs_url(value, name: str):
    """None or a store URL (kvs/urls.py); the message says what is wrong, the password masked."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Invalid(
            message=f"{name} must be None or a store URL (a str), got {type(value).__name__}", wrong_type=True
        )
    try:
        parse_store_url(value)
    except FlowValueError as e:
        raise Invalid(message=f"{name}: {e}") from None
    return value


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset),
    not the host's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_executors(cores: int | None = None) -> int:
    """One executor per core but the one the gateway needs, at least one.

    The gateway's event loop takes about a core under load (HTTP, JSON, routing), so on
    2 cores a second executor only fights the gateway and the first executor for the CPUs:
    measured side by side on the Ensemble (benchmarks/README.md, "End to end"), 2 cores
    served more with 1 executor than with 2."""
    cores = machine_cores() if cores is None else cores
    return max(1, cores - 1)


#: the math libraries' thread settings an executor is started with (torch reads OMP's)
MATH_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def default_math_threads(executors: int, cores: int | None = None) -> int:
    """Threads each executor's math libraries (torch, BLAS) may use: the cores the gateway
    leaves, shared out among the executors, at least one.

    Left alone, every executor's torch and BLAS start one thread per core of the machine:
    15 executors on 16 cores would run 240 compute threads fighting for 15 cores. A user's
    own OMP_NUM_THREADS (or the others of MATH_THREAD_ENV) wins."""
    cores = machine_cores() if cores is None else cores
    return max(1, (cores - 1) // max(1, executors))


def math_thread_env(executors: int, environ=None, cores: int | None = None) -> dict[str, str]:
    """The MATH_THREAD_ENV settings to start an executor with: ``default_math_threads`` for
    each one ``environ`` (default: this process's) does not set already."""
    environ = os.environ if environ is None else environ
    n = str(default_math_threads(executors, cores))
    return {name: n for name in MATH_THREAD_ENV if not environ.get(name)}


@dataclass(frozen=True)
class ClusterConfig(Config):
    """How the embedded local cluster runs.

    host/port: where the gateway listens (default 127.0.0.1 and a free port; bind
        0.0.0.0 only on purpose, and then set ``token``).
    executors: CPU executor processes (default: one per core but the gateway's, at least 1).
    gpu_executors: GPU-class executor processes (default 0; stages with gpu=True then
        run on CPU executors, with a warning).
    gateways: gateway processes, all serving on the one listening socket (default 1). One
        of them, elected through a lease in the store, runs the autoscaler and the SLO
        tuner, and the others serve its placements; one that dies is restarted while the
        others keep serving (executors/hosts/leadership.py).
    threads: worker threads per executor.
    token: optional bearer token the gateway then requires on every route but /healthz
        (the admin token is accepted too; admin routes need the admin token).
    public_metrics: with a token, serve /metrics without it (a scraper with no
        credentials; default False).
    max_body_bytes: request bodies above this get 413 (default 64 MiB).
    max_rows: requests with more rows get 413 (default 1,000,000).
    max_header_bytes / max_headers: a request head larger, or with more headers, gets 431
        before anything of it is kept (defaults 64 KiB, 100).
    header_timeout_s: a request head not complete this long after its first byte gets 408
        (default 10 s).
    min_body_rate / body_timeout_s: a request body must bring ``min_body_rate`` bytes a
        second (default 1024), counted over each ``body_timeout_s`` window from the end of
        its head (default 10 s; a window always needs a byte), or get 408: a slow but steady
        upload is served, a trickle is cut after one window.
    idle_timeout_s: a connection with no request in progress (none yet, or between requests
        on a kept-alive one) is closed after this long (default 10 s; behind a load
        balancer, set it above the balancer's idle timeout).
    max_connections: open HTTP connections at most (1024). A newcomer at the limit closes
        the connection idle longest; only when every one holds a request in progress is it
        refused with 503 and Retry-After. The gateway raises its open-file limit to match.
    request_timeout_s: a request not answered within this gets 504 (default 30 s), unless
        its flow was deployed with its own ``timeout_s``.
    max_request_timeout_s: the most a request may ask for with ``X-Request-Timeout`` (it may
        ask for more or less than its flow's deadline, up to this; default 300 s), and the
        most a flow's ``timeout_s`` may be.
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
        time only. 0 turns it off (executors/wire/busypoll.py).
    stuck_grace_s: an executor whose abandoned work (a run past its deadline or its
        operator's ``timeout_s``, already answered 504) has not come back within this long
        is recycled: a new process takes its place (default 10; executors/worker/watchdog.py).
    persistence: keep the KVS on disk (append-only file, fsync every second) so its data
        survives a restart of the KVS server (default True; `flowserve up` too). The
        embedded cluster's directory is temporary unless ``dir`` is set, so its data
        lasts as long as the cluster. False: a KVS restart loses every plan and every
        value (gateways re-publish their flows; lookups answer 503 until data is back).
    kvs_url: an external store to use instead of starting one (default None: the cluster
        starts its own Redis): ``redis://``, ``redis+sentinel://`` or ``redis+cluster://``
        (kvs/urls.py). The cluster then neither starts, restarts nor persists a store
        (``persistence`` is the store's own business); with a password, it reaches the
        processes through their environment only, as the token does.
    dir: where state, logs and sockets live (None: a private temporary directory).
    tracing: a ``TracingConfig`` (or its JSON dict) to trace requests with OpenTelemetry
        across the gateway and the executors: where spans go, and the share of requests
        traced (default None: off; executors/tracing.py, docs/operations.md). Needs the
        ``tracing`` extra (``pip install 'flowserve[tracing]'``).
    """

    host: str = setting("127.0.0.1", Str("a host name or address"))
    port: int = setting(0, Int(0, 65535, note="0: a free port"))
    executors: int = setting(default_factory=default_executors, check=Int(1))
    gpu_executors: int = setting(0, Int(0))
    gateways: int = setting(1, Int(1, 64))
    threads: int = setting(4, Int(1, 256))
    token: str | None = setting(None, _token)
    public_metrics: bool = setting(False, Bool())
    max_body_bytes: int = setting(64 * 1024 * 1024, Int(1024))
    max_rows: int = setting(1_000_000, Int(1))
    max_header_bytes: int = setting(64 * 1024, Int(1024))
    max_headers: int = setting(100, Int(8))
    header_timeout_s: float = setting(10.0, _SECONDS)
    body_timeout_s: float = setting(10.0, _SECONDS)
    min_body_rate: int = setting(1024, Int(0, note="bytes a second"))
    idle_timeout_s: float = setting(10.0, _SECONDS)
    max_connections: int = setting(1024, Int(1))
    request_timeout_s: float = setting(30.0, _SECONDS)
    max_request_timeout_s: float = setting(300.0, _SECONDS)
    load_timeout_s: float = setting(300.0, _SECONDS)
    max_retries: int = setting(2, Int(0, 10))
    restart_executors: bool = setting(True, Bool())
    autoscaling: Any = setting(None, Nested(AutoscalingConfig, optional=True, accept_mapping=True))
    max_executors: int = setting(8, Int(1))
    colocate: bool = setting(True, Bool())
    busy_poll_ms: float = setting(10.0, WINDOW_MS)
    executor_cache_bytes: int = setting(
        KVSOptions.cache_max_bytes,  # one default for every cache
        Int(0, note="0: no local cache"),
    )
    stuck_grace_s: float = setting(10.0, Number(gt=0, le=3600, note="seconds"))
    persistence: bool = setting(True, Bool())
    kvs_url: str | None = setting(None, _kvs_url)
    dir: str | None = setting(None, Check("a path", types=(str, os.PathLike), optional=True))
    tracing: Any = setting(None, Nested(TracingConfig, optional=True, accept_mapping=True))

    def _validate(self) -> None:
        if self.request_timeout_s > self.max_request_timeout_s:
            raise self.error(
                f"ClusterConfig.request_timeout_s must be <= max_request_timeout_s ({self.max_request_timeout_s!r}), "
                f"got {self.request_timeout_s!r}"
            )

    def tracing_env(self) -> dict[str, str]:
        """What the cluster's processes are started with to trace as ``tracing`` says
        (nothing when it is off)."""
        return {} if self.tracing is None else self.tracing.env()

    def gateway_options(self) -> dict:
        """The gateway's settings from this config (``Gateway(..., **options)``), the same for
        a local cluster's gateways and a standalone one."""
        return {
            "token": self.token,
            "max_body_bytes": self.max_body_bytes,
            "request_timeout_s": self.request_timeout_s,
            "max_request_timeout_s": self.max_request_timeout_s,
            "load_timeout_s": self.load_timeout_s,
            "public_metrics": self.public_metrics,
            "max_rows": self.max_rows,
        }

    def http_limits(self):
        """The HTTP edge's limits (executors/gateway/http_server.py)."""
        from executors.gateway.http_server import HttpLimits

        return HttpLimits(
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            max_connections=self.max_connections,
            idle_timeout_s=self.idle_timeout_s,
            min_body_rate=self.min_body_rate,
        )
