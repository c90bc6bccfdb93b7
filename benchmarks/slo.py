"""Serving under a latency SLO (issue 17): the simulator against the real local cluster,
and the planner + tuner against a fused unit sized for the peak and today's autoscaler.

    python -m benchmarks slo validate [--seconds 12]      # 4 pipelines x 3 loads: predicted vs measured
    python -m benchmarks slo compare  [--seconds 120]     # bursty open-loop trace, 3 deployments

Accelerator kernels are emulated with sleeps (``latency = a + c * batch`` ms), so many
replicas fit on this 2-core machine: a sleeping replica holds no core. Load is open loop
(benchmarks/openloop.py). Results: benchmarks/results/slo_validate.json, slo_compare.json
and slo_compare.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

import httpx
import numpy as np

from benchmarks.common import machine, plt, progress, save, save_plot
from benchmarks.openloop import replay

os.environ.setdefault("FLOWSERVE_QUIET", "1")


class Kernel:
    """An emulated accelerator kernel on a batch: sleeps ``a + c * rows`` ms."""

    def __init__(self, name: str, a_ms: float, c_ms: float):
        self.__name__ = name
        self.a_ms, self.c_ms = a_ms, c_ms

    def __call__(self, table):
        time.sleep((self.a_ms + self.c_ms * len(table)) / 1000.0)
        return table.column("x").to_numpy()


# name -> stages (name, a ms, c ms per row) and each stage's (batch size, replicas) as deployed
PIPELINES = {
    "single": ([("net", 6.0, 1.0)], [(8, 2)]),
    "chain2": ([("pre", 2.0, 0.2), ("model", 8.0, 1.0)], [(8, 1), (8, 2)]),
    "chain3": ([("decode", 3.0, 0.3), ("detect", 10.0, 1.5), ("post", 2.0, 0.1)], [(8, 1), (8, 3), (8, 1)]),
    "chain4": (
        [("a", 2.0, 0.2), ("b", 6.0, 1.0), ("c", 9.0, 0.5), ("d", 1.5, 0.2)],
        [(8, 1), (8, 2), (8, 2), (8, 1)],
    ),
}
LOADS = (40, 90, 140)  # requests per second


def make_flow(name: str, stages):
    from flow import Flow

    f = Flow(name)
    node = f
    for stage, a, c in stages:
        node = node.map(Kernel(stage, a, c), names=["x"], batching=True)
    return f


def register(cluster, plan) -> None:
    """Deploy ``plan`` as it is (what ClusterClient.deploy does after optimizing)."""
    from executors.cluster import _register_by_value
    from executors.placement import PLAN_KEY, next_version

    _register_by_value(plan)
    version = next_version(cluster.kvs.redis, plan.flow_name)
    cluster.kvs.put_trusted(PLAN_KEY.format(flow=plan.flow_name, version=version), plan)
    r = httpx.post(
        f"{cluster.url}/admin/deploy",
        json={"flow": plan.flow_name, "version": version},
        headers={"Authorization": f"Bearer {cluster.state['admin_token']}"},
        timeout=120,
    )
    r.raise_for_status()


def pinned(plan, configs, profile, slo_ms: float = 1000.0):
    """``plan`` with each stage's batch size and replicas fixed (no AIMD, no tuner)."""
    from dataclasses import replace

    from optimizer.plan import BatchConfig
    from optimizer.slo import SLO, ServingSLO, StageConfig

    stages, cfgs = {}, {}
    for (name, stage), (b, r) in zip(plan.stages.items(), configs):
        stages[name] = replace(stage, replicas=r, batch=BatchConfig(max_batch_size=b))
        cfgs[name] = StageConfig(b, r, stage.device)
    serving = ServingSLO(
        SLO(slo_ms),
        budgets=dict.fromkeys(stages, slo_ms / len(stages)),
        configs=cfgs,
        profile_json=profile.to_json(),
        adapt=False,
    )
    return replace(plan.replace_stages(stages), slo=serving)


def measure(url: str, trace, raw: bool = False) -> dict:
    from optimizer.slo import poisson

    rate = len(trace) / max(float(trace[-1] - trace[0]) / 1000.0, 1e-3)
    asyncio.run(replay(url, b'{"x": 1}', poisson(rate, int(rate * 2), seed=7)))  # 2 s warm-up, not timed
    lat, ok, done = asyncio.run(replay(url, b'{"x": 1}', trace))
    good = lat[ok]
    span = float(done.max() - trace[0] / 1000.0) if len(done) else 1.0
    lat = np.where(ok, lat, np.inf)  # a failed request counts as over any bound
    return {
        "p50_ms": float(np.percentile(lat, 50, method="higher")),
        "p99_ms": float(np.percentile(lat, 99, method="higher")),
        "throughput_rps": float(len(good) / span),
        "errors": int((~ok).sum()),
        **({"latencies_ms": lat[ok]} if raw else {}),
    }


def validate(seconds: float, only=None, loads=LOADS) -> dict:
    from dataclasses import replace

    from executors.cluster import LocalCluster
    from executors.config import ClusterConfig
    from executors.slo import profile_plan
    from optimizer import optimize
    from optimizer.slo import pipeline_from_plan, poisson, simulate

    rows = []
    config = ClusterConfig(executors=4, threads=4, colocate=False, request_timeout_s=30)
    with LocalCluster(config) as cluster:
        for pname, (stages, configs) in PIPELINES.items():
            if only and pname not in only:
                continue
            flow = make_flow(f"val-{pname}", stages)
            base = optimize(flow, rules=["batching"])
            progress(f"{pname}: profiling {len(base.stages)} stage(s) in-process")
            profile = profile_plan(base, [{"x": i} for i in range(8)], max_batch=16, repeats=20)
            plan = pinned(base, configs, profile)
            register(cluster, plan)
            url = f"{cluster.url}/flows/{plan.flow_name}"
            # where the gateway put each replica: the dispatcher routes by requests in flight
            # per executor, so replicas of different stages on one executor matter
            shown = httpx.get(url, timeout=10).json()
            placement = {s["name"]: tuple(s["executors"]) for s in shown["stages"]}
            # the hop cost: end to end at a trickle, less the stages' own time, per hop
            # (its spread too: each request's overhead split evenly over its hops, one draw a request)
            calib = measure(url, poisson(10, 100, seed=99), raw=True)
            own = sum(profile.latency(n, plan.stages[n].device, 1) for n in plan.stages)
            hops = np.maximum(0.0, (calib["latencies_ms"] - own) / (len(plan.stages) + 1))
            hop_ms = float(np.median(hops))
            sim_configs = plan.slo.configs
            for rate in loads:
                trace = poisson(rate, int(rate * seconds), seed=rate)
                old = replace(
                    pipeline_from_plan(plan, profile, sim_configs, hop_ms, threads=config.threads),
                    hop_samples=tuple(hops),
                )
                # the model as the runtime runs: up-front routing by executor, one overhead per request
                pipe = replace(old, routing="gateway", placement=placement, hop_per_request=True)
                sim, sim_old = simulate(pipe, trace, seed=1), simulate(old, trace, seed=1)
                real = measure(url, trace)
                row = {
                    "pipeline": pname,
                    "rate_rps": rate,
                    "hop_ms": round(hop_ms, 3),
                    "placement": placement,
                    "predicted_p99_ms_first_model": sim_old.p99_ms,
                    "predicted_rps_first_model": sim_old.throughput_rps,
                    "predicted_p99_ms": sim.p99_ms,
                    "measured_p99_ms": real["p99_ms"],
                    "predicted_p50_ms": sim.p50_ms,
                    "measured_p50_ms": real["p50_ms"],
                    "predicted_rps": sim.throughput_rps,
                    "measured_rps": real["throughput_rps"],
                    "errors": real["errors"],
                }
                row["p99_error"] = row["measured_p99_ms"] / row["predicted_p99_ms"] - 1
                row["rps_error"] = row["measured_rps"] / row["predicted_rps"] - 1
                progress(
                    f"{pname} @ {rate}/s: p99 predicted {sim.p99_ms:.1f} measured {real['p99_ms']:.1f} ms "
                    f"({row['p99_error']:+.0%}); rps {sim.throughput_rps:.0f} vs {real['throughput_rps']:.0f}"
                )
                rows.append(row)
            cluster.undeploy(plan.flow_name)
    out = {"seconds": seconds, "pipelines": {k: v[0] for k, v in PIPELINES.items()}, "rows": rows}
    save("slo_validate", out)
    return out


# -- compare: planner + tuner vs a fused unit for the peak vs today's autoscaler -------------

COMPARE_STAGES = [("decode", 2.0, 0.3), ("detect", 12.0, 1.2), ("classify", 6.0, 0.8), ("post", 1.0, 0.1)]
BASE_RPS = 60
SLO_MS = 150.0


def _bursts(seconds: float):
    # 2x and 4x bursts, each a tenth of the run
    return [(0.2 * seconds, 0.3 * seconds, 2.0), (0.6 * seconds, 0.7 * seconds, 4.0)]


class Sampler(threading.Thread):
    """Polls GET /flows/{name} every 0.5 s: replicas and batch caps per stage over time."""

    def __init__(self, cluster, name: str):
        super().__init__(daemon=True)
        self.cluster, self.name = cluster, name
        self.samples: list = []
        self.stop = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        with httpx.Client(timeout=10) as http:
            while not self.stop.wait(0.5):
                try:
                    body = http.get(f"{self.cluster.url}/flows/{self.name}").json()
                except (httpx.HTTPError, ValueError):
                    continue
                self.samples.append((time.perf_counter() - t0, {s["name"]: s["replicas"] for s in body["stages"]}))


def _run_one(cluster, url, name, trace) -> dict:
    sampler = Sampler(cluster, name)
    sampler.start()
    lat, ok, done = asyncio.run(replay(url, b'{"x": 1}', trace))
    sampler.stop.set()
    sampler.join()
    ts = [t for t, _ in sampler.samples]
    reps = [sum(r.values()) for _, r in sampler.samples]
    cost = float(np.trapezoid(reps, ts)) if len(ts) > 1 else 0.0
    within = (lat <= SLO_MS) & ok
    return {
        "attainment": float(within.mean()),
        "p99_ms": float(np.percentile(lat, 99)),
        "replica_seconds": cost,
        "errors": int((~ok).sum()),
        "timeline": {"t": ts, "replicas": [r for _, r in sampler.samples]},
        "latency": {"sent_ms": trace.tolist(), "ms": [float(x) if np.isfinite(x) else None for x in lat]},
    }


def compare(seconds: float) -> dict:
    from dataclasses import replace

    from executors.autoscale import AutoscalingConfig
    from executors.cluster import LocalCluster
    from executors.config import ClusterConfig
    from executors.slo import profile_plan
    from optimizer import optimize
    from optimizer.slo import SLO, PlannerOptions, bursty, serve_under

    trace = bursty(BASE_RPS, seconds, _bursts(seconds), seed=3)
    peak = 4 * BASE_RPS
    out = {"seconds": seconds, "base_rps": BASE_RPS, "slo_ms": SLO_MS, "stages": COMPARE_STAGES, "runs": {}}
    samples = [{"x": i} for i in range(8)]
    opts = PlannerOptions(hop_ms=0.5, max_replicas=8, max_batch=16)

    # (a) planner + tuner, (b) fused unit for the peak: one cluster with room for both
    with LocalCluster(ClusterConfig(executors=10, threads=4, colocate=False, max_executors=12)) as cluster:
        flow = make_flow("cmp-planned", COMPARE_STAGES)
        base = optimize(flow, rules=["batching"])
        profile = profile_plan(base, samples, max_batch=16, repeats=5)
        planned = serve_under(base, SLO(SLO_MS), profile=profile, rate_rps=BASE_RPS, options=opts)
        out["plan_explain"] = planned.slo.explain()
        progress(planned.slo.explain())
        register(cluster, planned)
        out["runs"]["planner+tuner"] = _run_one(cluster, f"{cluster.url}/flows/cmp-planned", "cmp-planned", trace)
        cluster.undeploy("cmp-planned")

        fused_flow = make_flow("cmp-fused", COMPARE_STAGES)
        fused = optimize(fused_flow)  # fusion: the whole pipeline is one stage
        fprofile = profile_plan(fused, samples, max_batch=16, repeats=5)
        fplan = serve_under(fused, SLO(SLO_MS), profile=fprofile, rate_rps=peak, options=opts)
        fplan = replace(fplan, slo=replace(fplan.slo, adapt=False))  # provisioned once, for the peak
        out["fused_explain"] = fplan.slo.explain()
        progress(fplan.slo.explain())
        register(cluster, fplan)
        out["runs"]["fused-for-peak"] = _run_one(cluster, f"{cluster.url}/flows/cmp-fused", "cmp-fused", trace)

    # (c) today's autoscaler, no SLO: default batching, Little's law at 0.7
    policy = AutoscalingConfig(max_replicas=8)
    cfg = ClusterConfig(executors=4, threads=4, colocate=False, autoscaling=policy, max_executors=12)
    with LocalCluster(cfg) as cluster:
        flow = make_flow("cmp-auto", COMPARE_STAGES)
        cluster.deploy(flow, rules=["batching"])
        out["runs"]["autoscaler"] = _run_one(cluster, f"{cluster.url}/flows/cmp-auto", "cmp-auto", trace)

    for name, r in out["runs"].items():
        progress(
            f"{name}: attainment {r['attainment']:.2%}, p99 {r['p99_ms']:.0f} ms, "
            f"{r['replica_seconds']:.0f} replica-s, {r['errors']} errors"
        )
    save("slo_compare", out)
    _plot(out)
    return out


def _plot(out: dict) -> None:
    pyplot = plt()
    fig, (ax1, ax2) = pyplot.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for name, r in out["runs"].items():
        ax1.plot(r["timeline"]["t"], [sum(x.values()) for x in r["timeline"]["replicas"]], label=name)
        sent = np.asarray(r["latency"]["sent_ms"]) / 1000.0
        ms = np.array([np.inf if x is None else x for x in r["latency"]["ms"]])
        edges = np.arange(0, sent.max() + 2, 2.0)
        p99 = [
            np.percentile(ms[(sent >= a) & (sent < b)], 99) if ((sent >= a) & (sent < b)).any() else np.nan
            for a, b in zip(edges[:-1], edges[1:])
        ]
        ax2.plot(edges[:-1], np.minimum(p99, 2000), label=name)
    ax2.axhline(out["slo_ms"], color="k", ls="--", lw=0.8, label="SLO")
    ax1.set_ylabel("replicas (all stages)")
    ax2.set_ylabel("p99 per 2 s (ms, capped 2 s)")
    ax2.set_xlabel("time (s); 2x burst at 20-30%, 4x at 60-70% of the run")
    ax1.legend()
    ax2.legend()
    save_plot(fig, "slo_compare")


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks slo", description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["validate", "compare"], nargs="?", default="validate")
    p.add_argument("--seconds", type=float, help="trace length per run (validate 12, compare 120)")
    p.add_argument("--pipelines", nargs="*", choices=list(PIPELINES), help="validate: only these pipelines")
    p.add_argument("--loads", type=float, nargs="*", default=LOADS, help="validate: offered rates (req/s)")
    args = p.parse_args(argv)
    progress(f"machine: {json.dumps(machine())} (shared with other engineers' work)")
    if args.part == "validate":
        return validate(args.seconds or 12.0, args.pipelines, args.loads)
    return compare(args.seconds or 120.0)
