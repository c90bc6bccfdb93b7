"""Added latency per stage: chains of 2, 5 and 10 unfused no-op stages over HTTP.

Each stage is its own function (``optimize=False``), so every stage adds one hop between
executors (a socket hop, the wire format, a wake-up). The per-stage cost is the slope of p50
latency against chain length; rounds interleave the chain lengths and the medians of the
rounds are reported.

    python -m benchmarks chain [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

from benchmarks.common import plt, progress, save, save_plot, wait_http, wrk

LENGTHS = (2, 5, 10)


def noop(row):
    return row.x


def chain_flow(n: int, name: str | None = None):
    """``n`` no-op row maps over one int column, named ``name`` (default ``chain{n}``)."""
    from flow import Flow

    flow = Flow(name or f"chain{n}", schema={"x": int})
    node = flow
    for _ in range(n):
        node = node.map(noop, names=["x"])
    return flow


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks chain", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--spread",
        action="store_true",
        help="ClusterConfig(colocate=False): every hop crosses executors (the research's setting)",
    )
    p.add_argument("--busy-poll-ms", type=float, default=None, help="ClusterConfig.busy_poll_ms (default: its default)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from executors import ClusterConfig, LocalCluster

    body = json.dumps({"x": 1}).encode()
    samples: dict[int, list[dict]] = {n: [] for n in LENGTHS}
    extra = {} if args.busy_poll_ms is None else {"busy_poll_ms": args.busy_poll_ms}
    with LocalCluster(ClusterConfig(executors=2, colocate=not args.spread, **extra)) as cluster:
        urls = {n: cluster.deploy(chain_flow(n), optimize=False).url for n in LENGTHS}
        for url in urls.values():
            wait_http(url, body)
            wrk(url, body, 1, 1)
        for r in range(args.rounds):
            for n in LENGTHS:
                res = wrk(urls[n], body, 1, args.seconds)
                samples[n].append(res)
                progress(f"round {r + 1}: {n:2d} stages  p50 {res['p50_ms']:.3f} ms  p99 {res['p99_ms']:.3f} ms")
    p50 = {n: statistics.median(s["p50_ms"] for s in samples[n]) for n in LENGTHS}
    p99 = {n: statistics.median(s["p99_ms"] for s in samples[n]) for n in LENGTHS}
    slope = float(np.polyfit(LENGTHS, [p50[n] for n in LENGTHS], 1)[0])
    progress(f"added latency per stage (slope of p50): {slope:.3f} ms")
    out = {
        "spread": args.spread,
        "lengths": LENGTHS,
        "p50_ms": p50,
        "p99_ms": p99,
        "per_stage_ms": slope,
        "rounds": samples,
    }
    name = "chain_spread" if args.spread else "chain"
    save(name, out)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(5, 3.5))
    ax.plot(LENGTHS, [p50[n] for n in LENGTHS], "o-", label="p50")
    ax.plot(LENGTHS, [p99[n] for n in LENGTHS], "s--", label="p99")
    ax.set_xlabel("unfused no-op stages")
    ax.set_ylabel("latency over HTTP (ms)")
    ax.set_title(f"{slope:.2f} ms added per stage")
    ax.legend()
    save_plot(fig, name)
    return out


if __name__ == "__main__":
    run()
