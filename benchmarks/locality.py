"""Data locality: per-row lookups routed to the executor that caches the key, or not.

The seed's experiment (report section 5): 100 objects (float32 arrays of 8 KB, 4 MB or
8 MB) in the KVS, each read 10 times in a random order (1,000 requests, one key each,
sent one at a time over HTTP) by the flow ``map(key) -> lookup(column="key") ->
map(sum)``, deployed three ways:

- ``naive``: ``optimize=False``, one stage per operator;
- ``fusion``: ``rules=["fusion"]``, one fused stage that any executor may run (the
  lookup reads wherever the request lands);
- ``fusion+continuations``: the default rules: the lookup starts a continuation stage and
  each row is routed by its key (rendezvous hashing) to the executor that caches it.

The cluster runs with ``ClusterConfig(colocate=False)`` by default (``--colocate``):
consecutive stages go to different executors, as in the seed's one-function-per-executor
setting, so ``naive`` ships every value from the lookup's executor to the sum's.
Each executor's KVS cache holds 256 MiB, so the cluster has ``--executors`` (default 5)
executors: with continuations each one owns about 20 of the 100 objects (160 MB at
8 MB), which fits; without them every executor sees all 100 (800 MB), which does not.
Per object size: the objects are loaded, then every round runs the three deployments
one after the other, each after a warm-up pass that reads every object once through it
("caches warmed"), on a fresh random order of the 1,000 reads. Reported: medians over
rounds of each round's p50 / p99 / mean latency. The objects are deleted afterwards.

    python -m benchmarks locality [--rounds 3] [--reads 10] [--quick] [--sizes 8KB,4MB,8MB] [--colocate off]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot
from benchmarks.fusion import across_rounds, stats

SIZES = {"8KB": 8 * 1024, "4MB": 4 * 1024 * 1024, "8MB": 8 * 1024 * 1024}
OBJECTS = 100
MODES = ("naive", "fusion", "fusion+continuations")
SEED = {"8MB": {"fusion": 15.0, "naive": 22.0}}  # seed: fusion+continuations this many times faster


def key_of(row):
    return f"locality:{row.size}:{row.i}"


def total(row):
    return float(row.value.sum())


def locality_flow(mode: str):
    from flow import Flow

    flow = Flow(f"locality_{mode.replace('+', '_')}", schema={"i": int, "size": str})
    flow.map(key_of, names=["key"]).lookup(column="key", name="value").map(total, names=["total"])
    return flow


def deploy(cluster, mode: str):
    flow = locality_flow(mode)
    if mode == "naive":
        return cluster.deploy(flow, optimize=False)
    if mode == "fusion":
        return cluster.deploy(flow, rules=["fusion"])
    return cluster.deploy(flow)


def measure(colocate: bool, executors: int, sizes, rounds: int, reads: int, busy_poll_ms: float | None = None) -> dict:
    """Every object size on one cluster; per round the three deployments, each warmed."""
    from benchmarks.client import BareClient
    from executors import ClusterConfig, LocalCluster

    tag = "colocated" if colocate else "spread"
    rng = np.random.default_rng(0)
    results, plans = {}, {}
    extra = {} if busy_poll_ms is None else {"busy_poll_ms": busy_poll_ms}
    with (
        LocalCluster(ClusterConfig(executors=executors, colocate=colocate, **extra)) as cluster,
        BareClient(timeout=60) as http,
    ):
        deployments = {m: deploy(cluster, m) for m in MODES}
        for m, d in deployments.items():
            plans[m] = {s.name: {"continuation": s.continuation} for s in d.plan.stages.values()}
        where: dict = {}
        stage_times: dict = {}

        def read(mode, size, i):
            t0 = time.perf_counter()
            r = http.post(deployments[mode].url, json={"i": int(i), "size": size})
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"{mode} answered {r.status_code}: {r.text[:300]}")
            for stage, ex, stage_ms, *_ in json.loads(r.headers.get("x-flowserve-trace", "[]")):
                if "lookup" in stage:  # which executor read the key, and how long its stage ran
                    where.setdefault((mode, size, int(i)), set()).add(ex)
                    stage_times.setdefault((mode, size), []).append(stage_ms)
            return ms, float(r.headers["server-timing"].split("dur=")[1])

        # the request path alone: the same continuation deployment reading tiny objects (8 bytes)
        path_keys = [f"locality:path:{i}" for i in range(OBJECTS)]
        cluster.kvs.mput({k: np.zeros(2, np.float32) for k in path_keys})
        for i in range(OBJECTS):
            read("fusion+continuations", "path", i)
        for size in sizes:
            n = SIZES[size] // 4
            # one memory pass over an object, measured in this process: memcpy (and the sum the
            # flow's last map does) of arrays of the object's size, cycled so none is in the caches
            pool = [rng.standard_normal(n).astype(np.float32) for _ in range(max(2, (64 << 20) // SIZES[size]))]
            sink = np.empty(n, np.float32)
            progress(f"locality ({tag}) {size}: loading {OBJECTS} objects of {SIZES[size]:,} bytes")
            keys = [f"locality:{size}:{i}" for i in range(OBJECTS)]
            for j in range(0, OBJECTS, 10):  # MSET in slices: 800 MB in one command is too much
                cluster.kvs.mput({k: rng.standard_normal(n).astype(np.float32) for k in keys[j : j + 10]})
            samples = {m: [] for m in MODES}
            path, copy, total_pass = [], [], []
            for r in range(rounds):
                order = rng.permutation(np.repeat(np.arange(OBJECTS), reads))
                for m in MODES:
                    for i in range(OBJECTS):  # warm the caches this deployment uses
                        read(m, size, i)
                    del stage_times.get((m, size), [])[-OBJECTS:]  # only timed reads count
                    if m != "fusion+continuations":
                        samples[m].append(stats([read(m, size, i) for i in order]))
                    else:  # each hit followed by the request path alone (an 8-byte object), in turn
                        got = [(read(m, size, i), read(m, "path", i)) for i in order]
                        samples[m].append(stats([h for h, _ in got]))
                        path.append(stats([p for _, p in got]))
                    progress(
                        f"{tag} {size} round {r + 1} {m:22s} p50 {samples[m][-1]['p50_ms']:8.2f} ms  "
                        f"p99 {samples[m][-1]['p99_ms']:8.2f} ms  mean {samples[m][-1]['mean_ms']:8.2f} ms"
                    )
                copy.append(_pass_ms(functools.partial(np.copyto, sink), pool))
                total_pass.append(_pass_ms(np.sum, pool))
                progress(
                    f"{tag} {size} round {r + 1} request path (8-byte object) p50 {path[-1]['p50_ms']:.2f} ms; "
                    f"memcpy {copy[-1]:.2f} ms, sum {total_pass[-1]:.2f} ms of one {size} object"
                )
            summary = {m: across_rounds(samples[m]) for m in MODES}
            hit = summary["fusion+continuations"]
            summary["hit_bound"] = {
                "request_path": across_rounds(path),
                "memcpy_ms": statistics.median(copy),
                "sum_ms": statistics.median(total_pass),
                # per round: the hit's p50 over (request path p50 + memcpy of the object)
                "hit_over_bound": statistics.median(
                    s["p50_ms"] / (pa["p50_ms"] + c) for s, pa, c in zip(samples["fusion+continuations"], path, copy)
                ),
                "hit_p50_ms": hit["p50_ms"],
                # the lookup's stage (lookup + sum) as the runtime's trace has it, hits and the path
                "stage_p50_ms_hit": float(np.median(stage_times.get(("fusion+continuations", size), [np.nan]))),
                "stage_p50_ms_path": float(np.median(stage_times.get(("fusion+continuations", "path"), [np.nan]))),
            }
            stage_times.pop(("fusion+continuations", "path"), None)
            progress(
                f"{tag} {size}: a hit (fusion+continuations p50) {hit['p50_ms']:.2f} ms vs the request path "
                f"{summary['hit_bound']['request_path']['p50_ms']:.2f} ms + memcpy "
                f"{summary['hit_bound']['memcpy_ms']:.2f} ms: {summary['hit_bound']['hit_over_bound']:.2f}x (goal <= 1); "
                f"the lookup's stage {summary['hit_bound']['stage_p50_ms_hit']:.2f} ms for a hit, "
                f"{summary['hit_bound']['stage_p50_ms_path']:.2f} ms for the path"
            )
            best = summary["fusion+continuations"]
            for m in MODES:
                summary[m]["executors_per_key"] = statistics.mean(
                    len(where.get((m, size, i), ())) for i in range(OBJECTS)
                )
            for m in ("naive", "fusion"):
                summary[m]["continuations_speedup_p50"] = summary[m]["p50_ms"] / best["p50_ms"]
                summary[m]["continuations_speedup_mean"] = summary[m]["mean_ms"] / best["mean_ms"]
            results[size] = {"summary": summary, "rounds": samples}
            progress(
                f"{tag} {size}: fusion+continuations p50 {best['p50_ms']:.2f} ms; "
                f"{summary['fusion']['continuations_speedup_p50']:.1f}x faster than fusion only, "
                f"{summary['naive']['continuations_speedup_p50']:.1f}x faster than naive; executors "
                f"reading each key: " + ", ".join(f"{m} {summary[m]['executors_per_key']:.1f}" for m in MODES)
            )
            cluster.kvs.delete(*keys)
        cluster.kvs.delete(*path_keys)
    return {"colocate": colocate, "executors": executors, "plans": plans, "results": results}


def _pass_ms(fn, pool, reps: int = 30) -> float:
    """Median ms of ``fn`` over arrays of ``pool`` in turn (each out of the CPU caches by then)."""
    times = []
    for j in range(reps):
        a = pool[j % len(pool)]
        t0 = time.perf_counter()
        fn(a)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run(argv=None) -> dict:
    from executors import ClusterConfig

    p = argparse.ArgumentParser(prog="python -m benchmarks locality", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over the three deployments (default 3)")
    p.add_argument("--reads", type=int, default=10, help="reads of each object per round (default 10)")
    p.add_argument("--sizes", default=",".join(SIZES), help="object sizes, comma-separated")
    p.add_argument("--executors", type=int, default=5)
    p.add_argument(
        "--colocate",
        choices=("both", "on", "off"),
        default="off",
        help="ClusterConfig.colocate: off (default: consecutive stages on different executors, the "
        "seed's setting, so naive ships each value to the next stage), on (the default runtime), "
        "or both, one cluster after the other",
    )
    p.add_argument("--busy-poll-ms", type=float, default=None, help="ClusterConfig.busy_poll_ms (default: its default)")
    p.add_argument("--quick", action="store_true", help="1 round, 3 reads of each object")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.quick:
        args.rounds, args.reads = 1, 3
    sizes = [s for s in args.sizes.split(",") if s]
    settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.colocate]
    results = {
        ("colocated" if c else "spread"): measure(c, args.executors, sizes, args.rounds, args.reads, args.busy_poll_ms)
        for c in settings
    }
    out = {
        "objects": OBJECTS,
        "reads_per_object": args.reads,
        "rounds": args.rounds,
        "busy_poll_ms": args.busy_poll_ms,
        "executor_cache_bytes": ClusterConfig.executor_cache_bytes,
        "sizes": {s: SIZES[s] for s in sizes},
        "seed_speedup": SEED,
        "setups": results,
    }
    save("locality", out)
    _plot(results)
    return out


def _plot(setups: dict) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(len(setups), 2, figsize=(11, 4 * len(setups)), squeeze=False)
    for row, (tag, res) in zip(axes, setups.items()):
        results = res["results"]
        names = list(results)
        x = np.arange(len(names))
        width = 0.8 / len(MODES)
        for ax, metric, label in ((row[0], "p50_ms", "p50"), (row[1], "p99_ms", "p99")):
            for i, m in enumerate(MODES):
                ax.bar(x + i * width, [results[s]["summary"][m][metric] for s in names], width, label=m)
            if metric == "p50_ms":
                bound = [results[s]["summary"].get("hit_bound") for s in names]
                if all(bound):
                    ax.scatter(
                        x + 2 * width,
                        [b["request_path"]["p50_ms"] + b["memcpy_ms"] for b in bound],
                        marker="_",
                        s=400,
                        color="black",
                        label="request path + memcpy of the object",
                    )
            ax.set_xticks(x + width)
            ax.set_xticklabels(names)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(pyplot.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(pyplot.FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "25" else ""))
            ax.set_xlabel("object size")
            ax.set_ylabel(f"{label} latency over HTTP (ms, log)")
            ax.set_title(f"{tag} ({res['executors']} executors)", fontsize=9)
        row[0].legend(fontsize=8)
    fig.suptitle("map -> lookup(column=key) -> map(sum): 100 objects, each read 10 times in random order")
    save_plot(fig, "locality")


if __name__ == "__main__":
    run()
