"""Prometheus metrics of the gateway (scraped at GET /metrics).

Per-stage figures come from the trace each answer carries: every stage appends
(stage, executor, run time in ms, batch size) as the request passes. Queue lengths are
not exported: a stage's queue is its batcher's, inside the executor, and no message
carries its length to the gateway (the autoscaler uses requests in flight instead).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("flowserve_requests", "Requests answered", ["flow", "status"], registry=r)
        self.latency = Histogram(
            "flowserve_request_latency_ms", "End-to-end request latency (ms)", ["flow"], buckets=_MS, registry=r
        )
        self.stage_latency = Histogram(
            "flowserve_stage_latency_ms", "Stage run time per call (ms)", ["flow", "stage"], buckets=_MS, registry=r
        )
        self.batch_size = Histogram(
            "flowserve_stage_batch_size",
            "Size of the batch each request ran in, per stage",
            ["flow", "stage"],
            buckets=(1, 2, 4, 8, 16, 32, 64),
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

        self._children: dict = {}  # (metric, labels) -> child: .labels() costs more than .observe()

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

    def observe_trace(self, flow: str, trace) -> None:
        for entry in trace:
            stage, _executor, ms, batch = entry[:4]
            self.child(self.stage_latency, flow, stage).observe(float(ms))
            self.child(self.batch_size, flow, stage).observe(int(batch))
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
