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

Three cluster setups are measured, one after the other:
- ``1x8``: one executor, as the default shape has on 2 cores, with 8 threads (a thread
  for each of 7 copies): the copies race as threads of one process;
- ``2x8``: 2 executors with 8 threads each;
- ``7x4``: 7 executors with 4 worker threads each, so each of 7 copies has its own
  executor.

    python -m benchmarks competition [--rounds 3] [--requests 300] [--quick] [--setups 1x8,2x8,7x4]
"""

from __future__ import annotations

import argparse
import json as jsonlib
import os
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot
from benchmarks.fusion import across_rounds, stats

REPLICAS = (1, 3, 7)
SCALES = {"low": 1.0, "medium": 2.0, "high": 4.0}  # Gamma scale in ms; shape 3
CONSTANT_MS = 1.0  # the fixed-cost runs: every copy waits this long (no variance: nothing to win)
SEED = {  # the seed's 1 -> 3 replica changes (report section 5)
    "p99": {"low": -71, "medium": -94, "high": -86},
    "p50": {"low": -39, "medium": -63, "high": -62},
}


def min_of_k(samples, k: int) -> dict:
    """The order-statistics bound: p50, p99 and mean of the minimum of ``k`` independent
    draws from the empirical distribution ``samples`` (the single replica's measured
    latencies). Racing k copies cannot do better than that, unless copies also dodged the
    delays every request shares (the HTTP path, the other stages), which they cannot."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    quantile = {q: float(np.percentile(x, 100 * (1 - (1 - q) ** (1 / k)))) for q in (0.5, 0.99)}
    above = ((n - np.arange(n + 1)) / n) ** k  # P(min > x_(i)), i = 0..n
    mean = float(np.sum(x * (above[:-1] - above[1:])))
    return {"p50_ms": quantile[0.5], "p99_ms": quantile[0.99], "mean_ms": mean}


def against_bound(single: list, raced: list, k: int, fixed: list | None = None) -> dict:
    """Per round, the change from 1 to k replicas, measured and as the bound of the round's
    single-replica samples has it, and the gap in percentage points (positive: short of
    the bound); medians over rounds. ``single``/``raced``: per round, a list of latencies.

    ``fixed``: per round, the machine's fixed cost of k copies in ms (``fixed_cost``: the
    same race with every copy waiting CONSTANT_MS, k copies against 1). The bound counts copies as free;
    ``{q}_gap_beyond_fixed_points`` is the gap left once that cost is added to the bound,
    ``fixed_cost_points`` the cost itself in points of the single replica's statistic."""
    out = {}
    for q in ("p50", "p99", "mean"):
        measured, bound, cost = [], [], []
        for i, (one, many) in enumerate(zip(single, raced)):
            base = stats(one)[f"{q}_ms"]
            measured.append(100 * (stats(many)[f"{q}_ms"] / base - 1))
            bound.append(100 * (min_of_k(one, k)[f"{q}_ms"] / base - 1))
            if fixed is not None:
                cost.append(100 * fixed[i] / base)
        out[f"{q}_change_pct"] = float(np.median(measured))
        out[f"bound_{q}_change_pct"] = float(np.median(bound))
        out[f"{q}_gap_points"] = float(np.median([m - b for m, b in zip(measured, bound)]))
        if fixed is not None:
            out[f"{q}_fixed_cost_points"] = float(np.median(cost))
            out[f"{q}_gap_beyond_fixed_points"] = float(
                np.median([m - b - c for m, b, c in zip(measured, bound, cost)])
            )
    if fixed is not None:
        out["fixed_cost_ms"] = float(np.median(fixed))
    out.update(gap_interval([x for r in single for x in r], [x for r in raced for x in r], k))
    return out


def gap_interval(single, raced, k: int, resamples: int = 400, level: float = 0.9, seed: int = 0) -> dict:
    """How far chance alone moves the gap: the gap in points (p50, p99, mean) on the pooled
    samples of every round, and its bootstrap interval. Both sides are resampled, the bound
    recomputed from each resampled single replica. A gap whose interval straddles 5 points
    is within or beyond the goal by chance. With free copies (the raced latencies drawn as
    the bound has them) and 900 samples a side, the p50 gap's spread is about 2 points
    (standard deviation over 60 simulated runs), and this 90% interval held 0 in 52 of them."""
    one, many = np.asarray(single, dtype=float), np.asarray(raced, dtype=float)
    rng = np.random.default_rng(seed)
    gaps = {q: [] for q in ("p50", "p99", "mean")}
    for _ in range(resamples):
        a = one[rng.integers(0, one.size, one.size)]
        b = many[rng.integers(0, many.size, many.size)]
        base, got, bound = stats(a), stats(b), min_of_k(a, k)
        for q in gaps:
            gaps[q].append(100 * (got[f"{q}_ms"] - bound[f"{q}_ms"]) / base[f"{q}_ms"])
    tail = 100 * (1 - level) / 2
    base, got, bound = stats(one), stats(many), min_of_k(one, k)
    out = {}
    for q, g in gaps.items():
        out[f"{q}_gap_pooled_points"] = float(100 * (got[f"{q}_ms"] - bound[f"{q}_ms"]) / base[f"{q}_ms"])
        out[f"{q}_gap_interval_points"] = [float(np.percentile(g, tail)), float(np.percentile(g, 100 - tail))]
    return out


def fixed_cost(zero: dict, k: int) -> list:
    """Per round, the fixed cost in ms of racing k copies on this machine: the p50 of the
    same deployment with every copy waiting the same CONSTANT_MS (a race with nothing to
    win) for k copies less for 1 copy: k dispatches and encodes, k executors woken, the
    first answer, the Cancel messages and the other copies' CPU on the shared cores (all
    k finish together: the most any race pays for them). ``zero``: k -> per round, a list
    of latencies."""
    return [float(np.percentile(a, 50) - np.percentile(b, 50)) for a, b in zip(zero[k], zero[1])]


def _gap_line(b: dict) -> str:
    return ", ".join(
        f"{q} {b[f'{q}_change_pct']:+.0f}% (bound {b[f'bound_{q}_change_pct']:+.0f}%, gap {b[f'{q}_gap_points']:+.1f}"
        + (" [{:+.1f}, {:+.1f}]".format(*b[f"{q}_gap_interval_points"]) if f"{q}_gap_interval_points" in b else "")
        + (
            f"; fixed cost {b[f'{q}_fixed_cost_points']:+.1f}, beyond it {b[f'{q}_gap_beyond_fixed_points']:+.1f}"
            if f"{q}_fixed_cost_points" in b
            else ""
        )
        + ")"
        for q in ("p50", "p99", "mean")
    ) + (f"  [fixed cost {b['fixed_cost_ms']:.3f} ms]" if "fixed_cost_ms" in b else "")


def stage_bound(latency, stage, k: int, draws: int = 200_000) -> dict:
    """The bound of racing the one stage only: each single-replica request keeps its own
    share outside the stage (``latency - stage``: HTTP, gateway, hops) and its stage time
    is replaced by the min of ``k`` draws of the measured stage times (the runtime's trace).
    p50/p99 by sampling (seeded), the mean exactly."""
    lat, st = np.asarray(latency, dtype=float), np.asarray(stage, dtype=float)
    rest = lat - st
    rng = np.random.default_rng(0)
    m = st[rng.integers(0, st.size, (draws, k))].min(axis=1) + rest[rng.integers(0, rest.size, draws)]
    return {
        "p50_ms": float(np.percentile(m, 50)),
        "p99_ms": float(np.percentile(m, 99)),
        "mean_ms": float(rest.mean() + min_of_k(st, k)["mean_ms"]),
    }


def against_stage_bound(single: list, stages: list, raced: list, k: int) -> dict:
    """``against_bound`` with ``stage_bound`` (per round: single-replica latencies, their
    stage times, and the raced latencies)."""
    out = {}
    for q in ("p50", "p99", "mean"):
        measured, bound = [], []
        for one, st, many in zip(single, stages, raced):
            base = stats(one)[f"{q}_ms"]
            measured.append(100 * (stats(many)[f"{q}_ms"] / base - 1))
            bound.append(100 * (stage_bound(one, st, k)[f"{q}_ms"] / base - 1))
        out[f"{q}_change_pct"] = float(np.median(measured))
        out[f"bound_{q}_change_pct"] = float(np.median(bound))
        out[f"{q}_gap_points"] = float(np.median([m - b for m, b in zip(measured, bound)]))
    return out


def first(row):
    return row.x, row.scale


class GammaSleep:
    """Waits Gamma(3, scale) ms (``flow.wait``: a losing copy stops when its race is won,
    as a copy waiting on a remote model or a device would); each replica draws from its
    own generator."""

    def __init__(self):
        self.rng = np.random.default_rng()
        self.pid = os.getpid()

    def __call__(self, row):
        from flow import wait

        wait(_draw(self.rng, row.scale) / 1000.0)
        return row.x, self.pid


class GammaSleepPlain(GammaSleep):
    """The same in ``time.sleep``: a losing copy runs to its end (``--plain-sleep``)."""

    def __call__(self, row):
        time.sleep(_draw(self.rng, row.scale) / 1000.0)
        return row.x, self.pid


class GammaSleepBatch(GammaSleep):
    """The same as a batching map (``--batching``): one wait for the batch (a request's one
    row here), the batch's rows and this replica's pid back as columns."""

    def __call__(self, table):
        from flow import wait

        wait(_draw(self.rng, float(table["scale"][0])) / 1000.0)
        return table["x"], np.full(len(table), self.pid)


RACERS = {"wait": GammaSleep, "plain": GammaSleepPlain, "batch": GammaSleepBatch}


def _draw(rng, scale: float) -> float:
    """Gamma(3, scale) ms; a scale <= 0 asks for a constant -scale ms (the fixed-cost runs)."""
    return rng.gamma(3.0, scale) if scale > 0 else -scale


def last(row):
    return row.x, row.winner


def race_flow(k: int, racer: str = "wait"):
    """``racer``: the racing stage waits in ``flow.wait`` (a losing copy is stopped), in
    ``time.sleep`` ("plain": it runs to its end), or as a batching map ("batch")."""
    from flow import Flow

    flow = Flow(f"compete_{k}", schema={"x": float, "scale": float})
    a = flow.map(first, names=["x", "scale"])
    b = a.map(RACERS[racer], names=["x", "winner"], high_variance=True, batching=racer == "batch")
    b.map(last, names=["x", "winner"])
    return flow


def measure_setup(executors: int, threads: int, rounds: int, requests: int, racer: str = "wait") -> dict:
    from benchmarks.client import BareClient
    from executors import ClusterConfig, LocalCluster
    from optimizer import OptimizerOptions

    samples = {(k, v): [] for k in REPLICAS for v in SCALES}
    winners = {(k, v): set() for k in REPLICAS for v in SCALES}
    zero = {k: [] for k in REPLICAS}  # per round: latencies of the constant wait (fixed_cost)
    plans = {}
    with LocalCluster(ClusterConfig(executors=executors, threads=threads)) as cluster:
        urls = {}
        for k in REPLICAS:
            d = cluster.deploy(race_flow(k, racer), options=OptimizerOptions(competitive_replicas=k))
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
                stage = sum(e[2] for e in jsonlib.loads(r.headers.get("x-flowserve-trace", "[]")))
                return ms, server, r.json()["rows"][0]["winner"], stage

            for k in REPLICAS:  # warm up: connections, replicas built, cheap-stage estimates
                for _ in range(30):
                    call(urls[k], 1.0)
            for r in range(rounds):
                for k in REPLICAS:  # the fixed cost of k copies: the same race, every copy a no-op
                    zero[k].append([call(urls[k], -CONSTANT_MS)[0] for _ in range(requests)])
                progress(
                    f"{executors}x{threads} round {r + 1} constant {CONSTANT_MS:g} ms: "
                    + "  ".join(f"k={k} p50 {np.percentile(zero[k][-1], 50):6.3f} ms" for k in REPLICAS)
                )
                for v, scale in SCALES.items():
                    for k in REPLICAS:
                        got = [call(urls[k], scale) for _ in range(requests)]
                        winners[(k, v)].update(w for _, _, w, _ in got)
                        samples[(k, v)].append(
                            {
                                **stats([(ms, sv) for ms, sv, _, _ in got]),
                                "raw": [(round(ms, 3), round(sv, 3), round(st, 3)) for ms, sv, _, st in got],
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
            pooled = stats([pair[:2] for s in rs for pair in s["raw"]])
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
                for side, i in (("client", 0), ("gateway", 1)):
                    single = [[pair[i] for pair in s["raw"]] for s in samples[(1, v)]]
                    raced = [[pair[i] for pair in s["raw"]] for s in rs]
                    entry[f"vs_bound_{side}"] = against_bound(single, raced, k, fixed_cost(zero, k))
                    stage = [[pair[2] for pair in s["raw"]] for s in samples[(1, v)]]
                    entry[f"vs_stage_bound_{side}"] = against_stage_bound(single, stage, raced, k)
                for label, key in (("min-of-k latencies", "vs_bound_client"), ("stage only", "vs_stage_bound_client")):
                    progress(f"{executors}x{threads} {v:6s} k={k} vs the bound ({label}): " + _gap_line(entry[key]))
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
        "plain_sleep": racer == "plain",
        "racer": racer,
        "fixed_cost_ms": {str(k): float(np.median(fixed_cost(zero, k))) for k in REPLICAS},
        "zero_p50_ms": {str(k): float(np.median([np.percentile(a, 50) for a in zero[k]])) for k in REPLICAS},
        "summary": summary,
        "plans": plans,
        "rounds": {
            f"{v}/{k}": [{x: y for x, y in s.items() if x != "raw"} for s in samples[(k, v)]]
            for k in REPLICAS
            for v in SCALES
        },
    }


def measure_open(
    executors: int,
    threads: int,
    rounds: int,
    util: float,
    seconds: float,
    racer: str = "wait",
    zero_requests: int = 200,
) -> dict:
    """Open-loop Poisson load at ``util`` of one replica's capacity (``threads`` worker
    threads over the mean sleep, 3 x scale ms). Each k gets its own cluster of k executors
    x ``threads`` (``executors`` is not used), so k=1 is one replica and every racing copy
    has its own executor: each replica then runs every request, at ``util`` of its
    capacity for every k (racing k copies costs k times the work). The k are interleaved
    in rounds; latency from each request's scheduled time (openloop.py). The bound is the
    min of k draws from the single replica's latencies under the same load; the fixed cost
    of k copies (``fixed_cost``) is measured per round on the same clusters with
    ``zero_requests`` sequential requests whose copies all wait CONSTANT_MS."""
    import asyncio
    import contextlib

    from benchmarks.client import BareClient
    from benchmarks.openloop import replay
    from executors import ClusterConfig, LocalCluster
    from optimizer import OptimizerOptions
    from optimizer.slo import poisson

    lat = {(k, v): [] for k in REPLICAS for v in SCALES}
    zero = {k: [] for k in REPLICAS}
    failed = {(k, v): 0 for k in REPLICAS for v in SCALES}
    rates = {v: util * threads / (3.0 * scale) * 1000.0 for v, scale in SCALES.items()}
    with contextlib.ExitStack() as stack:
        urls, hosts = {}, {}
        for k in REPLICAS:
            cluster = stack.enter_context(LocalCluster(ClusterConfig(executors=k, threads=threads)))
            d = cluster.deploy(race_flow(k, racer), options=OptimizerOptions(competitive_replicas=k))
            urls[k] = d.url
            hosts[k] = {s["name"]: s["executors"] for s in cluster.http.get(f"/flows/{d.name}").json()["stages"]}
        progress(f"open loop, k executors x {threads} thread(s) for k replicas; rates {rates} req/s")
        for k in REPLICAS:  # warm up
            asyncio.run(replay(urls[k], b'{"x": 1.0, "scale": 1.0}', poisson(50, 50, seed=3)))
        http = {k: stack.enter_context(BareClient(timeout=30)) for k in REPLICAS}  # one origin each
        for r in range(rounds):
            for k in REPLICAS:  # the fixed cost of k copies: the same race, every copy a no-op
                got = []
                for _ in range(zero_requests):
                    t0 = time.perf_counter()
                    if http[k].post(urls[k], json={"x": 1.0, "scale": -CONSTANT_MS}).status_code != 200:
                        raise RuntimeError(f"{urls[k]} failed with a constant wait")
                    got.append((time.perf_counter() - t0) * 1000)
                zero[k].append(got)
            progress(
                f"open loop round {r + 1} constant {CONSTANT_MS:g} ms, sequential: "
                + "  ".join(f"k={k} p50 {np.percentile(zero[k][-1], 50):6.3f} ms" for k in REPLICAS)
            )
            for v, scale in SCALES.items():
                body = f'{{"x": 1.0, "scale": {scale}}}'.encode()
                for k in REPLICAS:
                    trace = poisson(rates[v], int(rates[v] * seconds), seed=1000 * r + list(SCALES).index(v))
                    ms, ok, _ = asyncio.run(replay(urls[k], body, trace))
                    failed[(k, v)] += int((~ok).sum())
                    lat[(k, v)].append([float(x) for x in ms[ok]])
                progress(
                    f"open loop round {r + 1} {v:6s} at {rates[v]:.0f} req/s: "
                    + "  ".join(
                        f"k={k} p50 {np.percentile(lat[(k, v)][-1], 50):6.2f} "
                        f"p99 {np.percentile(lat[(k, v)][-1], 99):6.2f} ms"
                        for k in REPLICAS
                    )
                )
    summary = {}
    for v in SCALES:
        for k in REPLICAS:
            entry = {
                **across_rounds([stats(x) for x in lat[(k, v)]]),
                "n": sum(len(x) for x in lat[(k, v)]),
                "failed": failed[(k, v)],
                "rate": rates[v],
            }
            if k > 1:
                entry["vs_bound_client"] = b = against_bound(lat[(1, v)], lat[(k, v)], k, fixed_cost(zero, k))
                progress(f"open loop {v:6s} k={k} vs the bound: " + _gap_line(b))
            summary[f"{v}/{k}"] = entry
    return {
        "executors": "k",
        "threads": threads,
        "utilisation": util,
        "seconds": seconds,
        "plain_sleep": racer == "plain",
        "racer": racer,
        "fixed_cost_ms": {str(k): float(np.median(fixed_cost(zero, k))) for k in REPLICAS},
        "rates": rates,
        "hosts": {str(k): h for k, h in hosts.items()},
        "summary": summary,
    }


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks competition", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over every configuration (default 3)")
    p.add_argument("--requests", type=int, default=300, help="sequential requests per configuration and round")
    p.add_argument(
        "--setups",
        default="1x8,2x8,7x4",
        help="EXECUTORSxTHREADS cluster setups, comma-separated (default: one executor, as the default shape "
        "on 2 cores, with a thread for each of 7 copies; two; one per copy)",
    )
    p.add_argument("--quick", action="store_true", help="1 round of 100 requests per configuration")
    p.add_argument(
        "--open-loop",
        type=float,
        metavar="UTIL",
        help="open-loop Poisson load at this utilisation of the single replica (e.g. 0.7) instead of "
        "sequential requests; with --seconds per configuration and round (results: competition_open.json)",
    )
    p.add_argument("--seconds", type=float, default=5.0, help="open loop: seconds per configuration and round")
    p.add_argument(
        "--plain-sleep",
        action="store_true",
        help="the racing stage sleeps in time.sleep (a losing copy runs to its end) instead of flow.wait",
    )
    p.add_argument(
        "--batching",
        action="store_true",
        help="the racing stage is a batching map (its copies on one executor go through its batcher)",
    )
    p.add_argument("--name", help="results file name (default competition / competition_open)")
    args = p.parse_args(argv)
    racer = "plain" if args.plain_sleep else "batch" if args.batching else "wait"
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.quick:
        args.rounds, args.requests = 1, 100
    setups = [tuple(int(v) for v in s.split("x")) for s in args.setups.split(",")]
    results = {}
    if args.open_loop:
        for executors, threads in setups:
            results[f"{executors}x{threads}"] = measure_open(
                executors, threads, args.rounds, args.open_loop, args.seconds, racer
            )
        out = {"replicas": list(REPLICAS), "scales_ms": SCALES, "gamma_shape": 3.0, "setups": results}
        save(args.name or "competition_open", out)
        _plot_bound(results, args.name or "competition_open")
        return out
    for executors, threads in setups:
        progress(
            f"competition: {executors} executors x {threads} threads, {args.rounds} round(s) "
            f"of {args.requests} requests per configuration"
        )
        results[f"{executors}x{threads}"] = measure_setup(executors, threads, args.rounds, args.requests, racer)
    out = {
        "replicas": list(REPLICAS),
        "scales_ms": SCALES,
        "gamma_shape": 3.0,
        "requests": args.requests,
        "rounds": args.rounds,
        "seed_1_to_3_change_pct": SEED,
        "setups": results,
    }
    save(args.name or "competition", out)
    if not args.name:
        _plot(results)
    _plot_bound(results, f"{args.name}_bound" if args.name else "competition_bound")
    return out


def _plot_bound(results: dict, name: str) -> None:
    """Measured change from 1 to k replicas against the order-statistics bound, per
    variance: p50, p99 and mean."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(results), figsize=(6.5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results.values()):
        x = np.arange(len(SCALES))
        for i, (k, q) in enumerate((k, q) for k in REPLICAS[1:] for q in ("p50", "p99", "mean")):
            got = [res["summary"][f"{v}/{k}"]["vs_bound_client"] for v in SCALES]
            w = 0.8 / (3 * len(REPLICAS[1:]))
            ax.bar(x + i * w, [g[f"{q}_change_pct"] for g in got], w, color=f"C{i}", label=f"k={k} {q}")
            ax.scatter(x + i * w, [g[f"bound_{q}_change_pct"] for g in got], marker="_", s=200, color="black")
            stage = [res["summary"][f"{v}/{k}"].get("vs_stage_bound_client") for v in SCALES]
            if all(stage):
                ax.scatter(x + i * w, [g[f"bound_{q}_change_pct"] for g in stage], marker="x", s=30, color="black")
        ax.set_xticks(x + 0.4)
        ax.set_xticklabels(list(SCALES))
        ax.set_ylabel("change vs 1 replica (%)\nbound: - min of k latencies, x stage only")
        title = f"{res['executors']} executors x {res['threads']} threads"
        if "utilisation" in res:
            title = f"k executors x {res['threads']} thread(s), open loop at {res['utilisation']:.0%} per replica"
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
    save_plot(fig, name)


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
