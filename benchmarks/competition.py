"""Competitive execution: a high-variance middle stage raced by 1, 3 or 7 replicas.

The seed's experiment (report section 5): three stages, the middle one sleeping
Gamma(shape 3, scale 1 / 2 / 4) ms (low / medium / high variance) and marked
``high_variance=True``; ``OptimizerOptions(competitive_replicas=k)`` gives it k racing
replicas and the first answer wins (k=1 is the baseline: no racing). The sleep's scale
comes with each request, so one deployment per k serves all three variances, and the
configurations are interleaved in rounds (every k, every scale per round); reported
figures are medians over rounds of each round's p50 / p99, with the pooled percentiles
beside them. Each answer names the process that won the race, which shows how many
replicas really raced.

Two cluster setups are measured, one after the other:
- ``7x4``: 7 executors with 4 worker threads each, so each of 7 copies has its own
  executor;
- ``2x8``: 2 executors with 8 threads each (the 2-core machine's natural shape).

    python -m benchmarks competition [--rounds 3] [--requests 300] [--quick] [--setups 7x4,2x8]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot
from benchmarks.fusion import across_rounds, stats

REPLICAS = (1, 3, 7)
SCALES = {"low": 1.0, "medium": 2.0, "high": 4.0}  # Gamma scale in ms; shape 3
SEED = {  # the seed's 1 -> 3 replica changes (report section 5)
    "p99": {"low": -71, "medium": -94, "high": -86},
    "p50": {"low": -39, "medium": -63, "high": -62},
}


def first(row):
    return row.x, row.scale


class GammaSleep:
    """Sleeps Gamma(3, scale) ms; each replica draws from its own generator."""

    def __init__(self):
        self.rng = np.random.default_rng()
        self.pid = os.getpid()

    def __call__(self, row):
        time.sleep(self.rng.gamma(3.0, row.scale) / 1000.0)
        return row.x, self.pid


def last(row):
    return row.x, row.winner


def race_flow(k: int):
    from flow import Flow

    flow = Flow(f"compete_{k}", schema={"x": float, "scale": float})
    a = flow.map(first, names=["x", "scale"])
    b = a.map(GammaSleep, names=["x", "winner"], high_variance=True)
    b.map(last, names=["x", "winner"])
    return flow


def measure_setup(executors: int, threads: int, rounds: int, requests: int) -> dict:
    from benchmarks.client import BareClient
    from executors import ClusterConfig, LocalCluster
    from optimizer import OptimizerOptions

    samples = {(k, v): [] for k in REPLICAS for v in SCALES}
    winners = {(k, v): set() for k in REPLICAS for v in SCALES}
    plans = {}
    with LocalCluster(ClusterConfig(executors=executors, threads=threads)) as cluster:
        urls = {}
        for k in REPLICAS:
            d = cluster.deploy(race_flow(k), options=OptimizerOptions(competitive_replicas=k))
            urls[k] = d.url
            plans[str(k)] = {
                s.name: {"competitive": s.competitive, "replicas": s.replicas} for s in d.plan.stages.values()
            }
            st = cluster.http.get(f"/flows/{d.name}").json()["stages"]
            plans[str(k)]["hosts"] = {s["name"]: s["executors"] for s in st}
        with BareClient(timeout=30) as http:

            def call(url, scale):
                t0 = time.perf_counter()
                r = http.post(url, json={"x": 1.0, "scale": scale})
                ms = (time.perf_counter() - t0) * 1000
                if r.status_code != 200:
                    raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")
                server = float(r.headers["server-timing"].split("dur=")[1])
                return ms, server, r.json()["rows"][0]["winner"]

            for k in REPLICAS:  # warm up: connections, replicas built, cheap-stage estimates
                for _ in range(30):
                    call(urls[k], 1.0)
            for r in range(rounds):
                for v, scale in SCALES.items():
                    for k in REPLICAS:
                        got = [call(urls[k], scale) for _ in range(requests)]
                        winners[(k, v)].update(w for _, _, w in got)
                        samples[(k, v)].append(
                            {
                                **stats([(ms, sv) for ms, sv, _ in got]),
                                "raw": [(round(ms, 3), round(sv, 3)) for ms, sv, _ in got],
                            }
                        )
                    progress(
                        f"{executors}x{threads} round {r + 1} {v:6s} variance: "
                        + "  ".join(
                            f"k={k} p50 {samples[(k, v)][-1]['p50_ms']:6.2f} p99 {samples[(k, v)][-1]['p99_ms']:6.2f} ms"
                            for k in REPLICAS
                        )
                    )
    summary = {}
    for v in SCALES:
        base = None
        for k in REPLICAS:
            rs = samples[(k, v)]
            med = across_rounds([{x: y for x, y in s.items() if x != "raw"} for s in rs])
            pooled = stats([pair for s in rs for pair in s["raw"]])
            entry = {
                **med,
                "pooled_p50_ms": pooled["p50_ms"],
                "pooled_p99_ms": pooled["p99_ms"],
                "n": pooled["n"],
                "distinct_winners": len(winners[(k, v)]),
            }
            if base is None:
                base = entry
            else:
                for q in ("p50", "p99", "server_p50", "server_p99"):
                    entry[f"{q}_change_pct"] = 100 * (entry[f"{q}_ms"] / base[f"{q}_ms"] - 1)
            summary[f"{v}/{k}"] = entry
            progress(
                f"{executors}x{threads} {v:6s} k={k}: p50 {entry['p50_ms']:6.2f} ms  p99 {entry['p99_ms']:6.2f} ms"
                + (
                    f"  ({entry['p50_change_pct']:+.0f}% / {entry['p99_change_pct']:+.0f}% vs k=1; in the gateway "
                    f"{entry['server_p50_change_pct']:+.0f}% / {entry['server_p99_change_pct']:+.0f}%)"
                    if k > 1
                    else ""
                )
                + f"  winners: {entry['distinct_winners']} processes"
            )
    return {
        "executors": executors,
        "threads": threads,
        "summary": summary,
        "plans": plans,
        "rounds": {
            f"{v}/{k}": [{x: y for x, y in s.items() if x != "raw"} for s in samples[(k, v)]]
            for k in REPLICAS
            for v in SCALES
        },
    }


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks competition", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over every configuration (default 3)")
    p.add_argument("--requests", type=int, default=300, help="sequential requests per configuration and round")
    p.add_argument("--setups", default="7x4,2x8", help="EXECUTORSxTHREADS cluster setups, comma-separated")
    p.add_argument("--quick", action="store_true", help="1 round of 100 requests per configuration")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.quick:
        args.rounds, args.requests = 1, 100
    setups = [tuple(int(v) for v in s.split("x")) for s in args.setups.split(",")]
    results = {}
    for executors, threads in setups:
        progress(
            f"competition: {executors} executors x {threads} threads, {args.rounds} round(s) "
            f"of {args.requests} requests per configuration"
        )
        results[f"{executors}x{threads}"] = measure_setup(executors, threads, args.rounds, args.requests)
    out = {
        "replicas": list(REPLICAS),
        "scales_ms": SCALES,
        "gamma_shape": 3.0,
        "requests": args.requests,
        "rounds": args.rounds,
        "seed_1_to_3_change_pct": SEED,
        "setups": results,
    }
    save("competition", out)
    _plot(results)
    return out


def _plot(results: dict) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(results), figsize=(6.5 * len(results), 4), squeeze=False)
    for ax, (_setup, res) in zip(axes[0], results.items()):
        width = 0.8 / len(REPLICAS)
        x = np.arange(len(SCALES))
        for i, k in enumerate(REPLICAS):
            p50 = [res["summary"][f"{v}/{k}"]["p50_ms"] for v in SCALES]
            p99 = [res["summary"][f"{v}/{k}"]["p99_ms"] for v in SCALES]
            ax.bar(x + i * width, p99, width, alpha=0.35, color=f"C{i}")
            ax.bar(x + i * width, p50, width, color=f"C{i}", label=f"{k} replica{'s' if k > 1 else ''}")
        ax.set_xticks(x + width)
        ax.set_xticklabels([f"{v}\nGamma(3, {s:g} ms)" for v, s in SCALES.items()])
        ax.set_ylabel("latency over HTTP (ms): p50 solid, p99 light")
        ax.set_title(f"{res['executors']} executors x {res['threads']} threads")
        ax.legend(fontsize=8)
    save_plot(fig, "competition")


if __name__ == "__main__":
    run()
