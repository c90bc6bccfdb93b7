"""Prometheus metrics of a cluster, scraped at the gateway's GET /metrics. The names and
labels are documented in docs/operations.md ("Metrics"), and tests/executors/test_prometheus.py
checks a real Prometheus finds each one: they are a contract, changed only on purpose.

Per-stage figures come from the trace each answer carries: every stage appends
(stage, executor, run time in ms, batch size) as the request passes. What only an
executor sees (its batching stages' queues and batch sizes, work waiting for a thread,
its KVS cache) comes in its pongs, once a second (``ExecutorFigures``).

Why the pongs and not a /metrics per executor that this one federates: the gateway
pings every executor each second anyway, executors serve no HTTP (their sockets are
Unix or cluster-internal, and an HTTP server per executor would be more ports, threads
and a surface to secure), and one scrape target sees the whole cluster at one moment.
A figure is then at most a ping period old, well under a scrape interval.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

#: upper bounds of the executors' batch-size buckets (executors/worker/outputs.py BATCH_BUCKETS)
EXECUTOR_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)

_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("flowserve_requests", "Requests answered", ["flow", "status"], registry=r)
        self.latency = LoopHistogram(
            "flowserve_request_latency_ms", "End-to-end request latency (ms)", ["flow"], _MS, registry=r
        )
        self.stage_latency = LoopHistogram(
            "flowserve_stage_latency_ms", "Stage run time per call (ms)", ["flow", "stage"], _MS, registry=r
        )
        self.batch_size = LoopHistogram(
            "flowserve_stage_batch_size",
            "Size of the batch each request ran in, per stage",
            ["flow", "stage"],
            (1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.errors = Counter("flowserve_errors", "Requests answered with an error", ["flow", "status"], registry=r)
        self.retries = Counter("flowserve_retries", "Requests re-run after an executor died", ["flow"], registry=r)
        self.scaling = Counter(
            "flowserve_scaling_decisions", "Autoscaler decisions applied", ["flow", "stage", "direction"], registry=r
        )
        self.replicas = Gauge("flowserve_stage_replicas", "Replicas hosting a stage", ["flow", "stage"], registry=r)
        self.stuck = Gauge(
            "flowserve_executor_stuck_threads",
            "Threads held by abandoned work (past its deadline), per executor",
            ["executor"],
            registry=r,
        )
        self.recycles = Counter(
            "flowserve_executor_recycles",
            "Executors replaced because a thread was stuck",
            ["executor", "reason"],
            registry=r,
        )
        self.crashes = Counter(
            "flowserve_executor_crashes", "Executor processes that died unexpectedly", ["executor"], registry=r
        )
        # gpu executors' GPUs, from NVML through their pongs (executors/worker/gpu.py)
        self.gpu_utilisation = Gauge(
            "flowserve_gpu_utilisation_percent", "GPU utilisation (NVML)", ["executor", "gpu"], registry=r
        )
        self.gpu_memory_used = Gauge(
            "flowserve_gpu_memory_used_bytes", "GPU memory in use, whole device (NVML)", ["executor", "gpu"], registry=r
        )
        self.gpu_memory_total = Gauge(
            "flowserve_gpu_memory_total_bytes", "GPU memory of the device (NVML)", ["executor", "gpu"], registry=r
        )
        self.gpu_process_memory = Gauge(
            "flowserve_gpu_executor_memory_bytes",
            "GPU memory the executor process holds (NVML, where it can see the process)",
            ["executor", "gpu"],
            registry=r,
        )

        # flows served under a latency SLO (executors/hosts/profiling.py)
        self.slo_requests = Counter(
            "flowserve_slo_requests", "Answers within / over the flow's SLO", ["flow", "outcome"], registry=r
        )
        self.slo_attainment = Gauge(
            "flowserve_slo_attainment",
            "Share of answers within the flow's SLO (errors count as over)",
            ["flow"],
            registry=r,
        )
        self.slo_target = Gauge("flowserve_slo_target_ms", "The flow's latency SLO (ms)", ["flow"], registry=r)
        self.slo_budget_share = Gauge(
            "flowserve_slo_budget_share", "Each stage's share of the flow's SLO budget", ["flow", "stage"], registry=r
        )
        # Clipper's layer (flow/prediction.py): reported in the stage's trace entry (executors/worker/hedging.py)
        self.cache_lookups = Counter(
            "flowserve_prediction_cache_lookups",
            "Prediction cache lookups of map(..., cache=...) stages, by result (hit, shared_hit: from the KVS, miss)",
            ["flow", "stage", "result"],
            registry=r,
        )
        self.hedges = Counter(
            "flowserve_hedges",
            "Requests of hedged stages that sent a backup copy (outcome: sent), and those whose backup won (won)",
            ["flow", "stage", "outcome"],
            registry=r,
        )
        self.race_wins = Counter(
            "flowserve_race_wins",
            "Races of competitive stages won, by the executor whose copy answered first",
            ["flow", "stage", "executor"],
            registry=r,
        )
        self.inflight = Gauge(
            "flowserve_requests_in_flight", "Requests accepted and not answered yet", ["flow"], registry=r
        )
        self.executors = Gauge(
            "flowserve_executors",
            "Executors the gateway knows, by state (answering: a pong within 5 s; silent; dead)",
            ["state"],
            registry=r,
        )
        self.figures = ExecutorFigures()  # what the executors' pongs report
        r.register(self.figures)

        self._children: dict = {}  # (metric, labels) -> child: .labels() costs more than .observe()

    def refresh(self, dispatcher, recent_s: float) -> None:
        """Set what is read at scrape time from ``dispatcher``: executors by state (an
        executor answers with a pong within ``recent_s``), stuck threads, GPUs, replicas,
        requests in flight, and the executors' own figures (their last pongs). Gauges of
        flows no longer served go; the counters of each executor (crashes, recycles) and of
        each served flow (retries, scaling decisions) exist from its first scrape, at 0, so
        a rate over them never lacks a series."""
        answering = {e.id for e in dispatcher.answering(recent_s)}
        states = {"answering": 0, "silent": 0, "dead": 0}
        for e in dispatcher.executors.values():
            states["answering" if e.id in answering else ("silent" if e.alive else "dead")] += 1
            self.stuck.labels(e.id).set(sum(e.stuck.values()) if e.alive else 0)
            self.crashes.labels(e.id)
            self.recycles.labels(e.id, "stuck")
            if e.alive and e.gpus:
                self.observe_gpus(e.id, e.gpus)
        for state, n in states.items():
            self.executors.labels(state).set(n)
        self.replicas.clear()
        self.inflight.clear()
        for name, f in dispatcher.flows.items():
            self.retries.labels(name)
            for stage, ids in f.placement.items():
                self.replicas.labels(name, stage).set(len(ids))
                self.scaling.labels(name, stage, "up")
                self.scaling.labels(name, stage, "down")
            self.inflight.labels(name).set(0)
        for req in dispatcher.requests.values():
            name = req.flow.plan.flow_name
            if name in dispatcher.flows:
                self.inflight.labels(name).inc()
        self.figures.report({i: s for i, s in dispatcher.executor_stats.items() if i in answering})

    def observe_gpus(self, executor: str, gpus: list) -> None:
        """Set the GPU gauges from an executor's last pong."""
        for g in gpus:
            labels = (executor, str(g["index"]))
            self.gpu_utilisation.labels(*labels).set(g["utilisation"])
            self.gpu_memory_used.labels(*labels).set(g["memory_used"])
            self.gpu_memory_total.labels(*labels).set(g["memory_total"])
            if "process_memory_used" in g:
                self.gpu_process_memory.labels(*labels).set(g["process_memory_used"])

    def child(self, metric, *labels):
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def observe_trace(self, flow: str, trace, plan=None) -> None:
        """Count an answer's trace: each stage's run time and batch size, a racing stage's
        winner (``plan``: the flow's, which says which stages race), Clipper's figures."""
        stages = plan.stages if plan is not None else {}
        latency, batch_size = self.stage_latency.observe, self.batch_size.observe
        for entry in trace:
            stage, executor, ms, batch = entry[:4]
            labels = (flow, stage)
            latency(labels, float(ms))
            batch_size(labels, int(batch))
            s = stages.get(stage)
            if s is not None and s.competitive > 1 and s.continuation is None:
                self.child(self.race_wins, flow, stage, str(executor)).inc()
            if len(entry) > 4 and isinstance(entry[4], dict):
                self._clipper(flow, stage, entry[4])

    def _clipper(self, flow: str, stage: str, extra: dict) -> None:
        cache = extra.get("cache")
        if isinstance(cache, list) and len(cache) in (2, 3):  # [hits, misses] or [hits, misses, shared hits]
            self.child(self.cache_lookups, flow, stage, "hit").inc(max(0, int(cache[0])))
            self.child(self.cache_lookups, flow, stage, "miss").inc(max(0, int(cache[1])))
            if len(cache) == 3:
                self.child(self.cache_lookups, flow, stage, "shared_hit").inc(max(0, int(cache[2])))
        hedge = extra.get("hedge")
        if hedge in ("sent", "backup"):
            self.child(self.hedges, flow, stage, "sent").inc()
            if hedge == "backup":
                self.child(self.hedges, flow, stage, "won").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopHistogram:
    """A histogram family observed and scraped on the gateway's event loop (a collector,
    read by the async /metrics route): no other thread touches it, so an observation is a bucket search and two
    additions, without the lock and per-series objects of prometheus_client's Histogram
    (~0.15 us against ~0.7 us; a 6-stage flow's answer observes 12). Exposed as any
    histogram: ``_bucket`` (cumulative, ``le``), ``_count`` and ``_sum`` per label set."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], buckets, registry=None):
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        # label values -> observations per bucket (the last: above every bound), then their sum
        self.series: dict[tuple, list] = {}
        if registry is not None:
            registry.register(self)

    def observe(self, labels: tuple, value: float) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0] * (len(self.bounds) + 1) + [0.0]
        s[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus's ``le``
        s[-1] += value

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, s in list(self.series.items()):
            cumulative, buckets = 0, []
            for le, n in zip(self._les, s):  # zip stops at the last bucket; s[-1] is the sum
                cumulative += n
                buckets.append((le, cumulative))
            family.add_metric(list(labels), buckets, s[-1])
        yield family


class ExecutorFigures:
    """A collector of what each executor's last pong reported (executors/worker/executor.py
    ``Executor.stats``), set by the /metrics route before each scrape (``report``)."""

    def __init__(self):
        self.stats: dict[str, dict] = {}  # executor id -> its last pong's stats (answering executors)

    def report(self, stats: dict[str, dict]) -> None:
        self.stats = stats

    def describe(self):
        return []  # the families depend on what executors report; no name clashes to check

    def collect(self):
        queue = GaugeMetricFamily(
            "flowserve_executor_queue_depth",
            "Requests queued for a batching stage's next batch on an executor",
            labels=["executor", "flow", "stage"],
        )
        pool = GaugeMetricFamily(
            "flowserve_executor_pool_queue_depth",
            "Runs waiting for a worker thread on an executor",
            labels=["executor"],
        )
        chained = CounterMetricFamily(
            "flowserve_executor_chained_runs",
            "Stage runs an executor started on the thread of the stage before them, in the same run (no hop)",
            labels=["executor"],
        )
        relayed = CounterMetricFamily(
            "flowserve_executor_relayed_bodies",
            "Request bodies the gateway relayed unparsed that an executor read, by format (json, arrow)",
            labels=["executor", "format"],
        )
        batches = HistogramMetricFamily(
            "flowserve_executor_batch_size",
            "Requests per run of a batching stage, on each executor",
            labels=["executor", "flow", "stage"],
        )
        lookups = CounterMetricFamily(
            "flowserve_kvs_cache_lookups",
            "Reads of an executor's local KVS cache, by result (hit: served locally; miss: read from the store)",
            labels=["executor", "result"],
        )
        evictions = CounterMetricFamily(
            "flowserve_kvs_cache_evictions",
            "Entries an executor's local KVS cache dropped to fit its byte budget",
            labels=["executor"],
        )
        held = GaugeMetricFamily(
            "flowserve_kvs_cache_bytes", "Bytes held by an executor's local KVS cache", labels=["executor"]
        )
        for ex, s in sorted(self.stats.items()):
            try:
                _executor_figures(ex, s, queue, pool, chained, relayed, batches, lookups, evictions, held)
            except (TypeError, ValueError, KeyError, IndexError):
                continue  # a malformed report (an executor of another release) is left out, not a failed scrape
        yield from (queue, pool, chained, relayed, batches, lookups, evictions, held)


def _executor_figures(ex: str, s: dict, queue, pool, chained, relayed, batches, lookups, evictions, held) -> None:
    queued: dict = {}
    for flow, stage, n in s.get("queues", ()):  # a stage hosted in two versions counts once
        queued[(str(flow), str(stage))] = queued.get((str(flow), str(stage)), 0) + int(n)
    for (flow, stage), n in queued.items():
        queue.add_metric([ex, flow, stage], n)
    pool.add_metric([ex], int(s.get("pool", 0)))
    chained.add_metric([ex], int(s.get("chained", 0)))
    for kind, n in s.get("relayed", {}).items():
        relayed.add_metric([ex, str(kind)], int(n))
    for flow, stage, counts, total in s.get("batches", ()):
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, EXECUTOR_BATCH_BUCKETS), "+Inf"), counts):
            cumulative += int(n)
            buckets.append((bound, cumulative))
        batches.add_metric([ex, str(flow), str(stage)], buckets, float(total))
    kvs = s.get("kvs")
    if kvs is not None:
        hits, misses, evicted, nbytes = kvs
        lookups.add_metric([ex, "hit"], int(hits))
        lookups.add_metric([ex, "miss"], int(misses))
        evictions.add_metric([ex], int(evicted))
        held.add_metric([ex], int(nbytes))
