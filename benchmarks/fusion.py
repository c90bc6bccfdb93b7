"""Operator fusion: chains of 2-10 no-op stages, fused vs one stage per operator, over HTTP.

The seed's experiment (report section 5): a chain of N no-op functions (a map returning
its column unchanged) on a payload of 10 KB, 500 KB or 10 MB (one float32 tensor row),
deployed fused (``optimize``: one stage) and unfused (``optimize=False``: one stage per
operator). Requests are Arrow IPC both ways (JSON would be far too big at 10 MB), sent
one at a time from a bare keep-alive client (client.py); the bodies are built once. Configurations
are interleaved in rounds (every payload per round; within a payload, requests alternate
between every chain and mode one by one) and the reported figure is the median over
rounds of each round's median / p99.

Two cluster setups, one after the other (``--colocate``): ``spread``
(``ClusterConfig(colocate=False)``: consecutive stages run on different executors, so
every unfused stage costs a socket hop of the payload, the seed's one-function-per-
executor setting) and ``colocated`` (the default runtime: a request's stages run where
their input is and the Table is handed over in-process).

    python -m benchmarks fusion [--rounds 3] [--quick] [--rowwise] [--colocate both|on|off]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot

LENGTHS = (2, 4, 6, 8, 10)
PAYLOADS = {"10KB": 10 * 1024, "500KB": 500 * 1024, "10MB": 10 * 1024 * 1024}
REQUESTS = {"10KB": 60, "500KB": 40, "10MB": 12}  # per configuration and round
ARROW = "application/vnd.apache.arrow.stream"


# -- helpers shared by the issue-7 benchmarks (fusion, competition, locality, batching) ---------


def arrow_body(columns: dict) -> bytes:
    """An Arrow IPC stream request body for one or more rows (``{name: values}``)."""
    import pyarrow as pa

    from flow.table import Table

    t = Table.from_dict(columns).to_arrow().drop_columns(["qid"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def post_arrow(http, url: str, body: bytes) -> tuple[float, float]:
    """POST one Arrow body and read the whole answer: (latency at the client, the gateway's
    own time from the parsed request to the result, from Server-Timing), both in ms."""
    t0 = time.perf_counter()
    r = http.post(url, content=body, headers={"Content-Type": ARROW, "Accept": ARROW})
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")
    timing = r.headers.get("server-timing", "")
    server = float(timing.split("dur=")[1].split(",")[0]) if "dur=" in timing else float("nan")
    return ms, server


def stats(timings) -> dict:
    """Percentiles of (client ms, server ms) pairs, or of plain latencies."""
    a = np.asarray(timings, dtype=float)
    client = a[:, 0] if a.ndim == 2 else a
    out = {
        "n": int(client.size),
        "p50_ms": float(np.percentile(client, 50)),
        "p99_ms": float(np.percentile(client, 99)),
        "mean_ms": float(client.mean()),
    }
    if a.ndim == 2:
        out["server_p50_ms"] = float(np.nanpercentile(a[:, 1], 50))
        out["server_p99_ms"] = float(np.nanpercentile(a[:, 1], 99))
    return out


def across_rounds(rounds: list[dict]) -> dict:
    """Median over rounds of each round's statistics (robust to one noisy round)."""
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "n"}


# -- the flows ----------------------------------------------------------------------------------


def noop(x):
    """A no-op stage: the column comes back unchanged (batching: the whole column at once)."""
    return x


def chain_flow(n: int, mode: str, rowwise: bool):
    from flow import Flow

    flow = Flow(f"fusion_{n}_{mode}")
    node = flow
    for _ in range(n):
        node = node.map(noop, names=["x"], col="x", batching=not rowwise)
    return flow


def measure(colocate: bool, executors: int, lengths, rounds: int, scale: float, rowwise: bool) -> dict:
    """Every (payload, chain length, fused/unfused) on one cluster, interleaved in rounds."""
    from benchmarks.client import BareClient
    from executors import ClusterConfig, LocalCluster

    modes = ("fused", "unfused")
    rng = np.random.default_rng(0)
    bodies = {
        name: arrow_body({"x": rng.standard_normal((1, size // 4)).astype(np.float32)})
        for name, size in PAYLOADS.items()
    }
    samples = {(pl, n, m): [] for pl in PAYLOADS for n in lengths for m in modes}
    plans, where = {}, {}
    tag = "colocated" if colocate else "spread"
    config = ClusterConfig(executors=executors, max_body_bytes=64 << 20, colocate=colocate)
    with LocalCluster(config) as cluster, BareClient(timeout=120) as http:
        urls = {}
        for n in lengths:
            for m in modes:
                d = cluster.deploy(chain_flow(n, m, rowwise), optimize=(m == "fused"))
                urls[(n, m)] = d.url
                plans[f"{n}/{m}"] = list(d.plan.stages)
        for (n, m), url in urls.items():  # warm up: connections, replicas, cheap-stage estimates
            for body in bodies.values():
                for _ in range(3):
                    post_arrow(http, url, body)
            r = http.post(url, content=bodies["10KB"], headers={"Content-Type": ARROW, "Accept": ARROW})
            where[f"{n}/{m}"] = [e[1] for e in json.loads(r.headers.get("x-flowserve-trace", "[]"))]
        for r in range(rounds):
            for pl, body in bodies.items():
                k = max(3, int(REQUESTS[pl] * scale))
                # request by request across the configurations (the order rotating), so a stall
                # of the shared machine falls on all of them alike, not on one block
                got = {c: [] for c in urls}
                configs = list(urls)
                for i in range(k):
                    for c in configs[i % len(configs) :] + configs[: i % len(configs)]:
                        got[c].append(post_arrow(http, urls[c], body))
                for n in lengths:
                    for m in modes:
                        samples[(pl, n, m)].append(stats(got[(n, m)]))
                    progress(
                        f"{tag} round {r + 1} {pl:>5s} {n:2d} stages: fused p50 "
                        f"{samples[(pl, n, 'fused')][-1]['p50_ms']:8.2f} ms  unfused p50 "
                        f"{samples[(pl, n, 'unfused')][-1]['p50_ms']:8.2f} ms"
                    )
    summary = {}
    for pl in PAYLOADS:
        for n in lengths:
            f, u = across_rounds(samples[(pl, n, "fused")]), across_rounds(samples[(pl, n, "unfused")])
            summary[f"{pl}/{n}"] = {
                "fused": f,
                "unfused": u,
                "speedup_p50": u["p50_ms"] / f["p50_ms"],
                "speedup_p99": u["p99_ms"] / f["p99_ms"],
            }
            progress(
                f"{tag} {pl:>5s} {n:2d} stages: fused {f['p50_ms']:8.2f} / {f['p99_ms']:8.2f} ms, unfused "
                f"{u['p50_ms']:8.2f} / {u['p99_ms']:8.2f} ms (p50 / p99): {u['p50_ms'] / f['p50_ms']:.2f}x; "
                f"in the gateway {f['server_p50_ms']:.2f} vs {u['server_p50_ms']:.2f} ms"
            )
    return {
        "colocate": colocate,
        "executors": executors,
        "summary": summary,
        "plans": plans,
        "executor_per_stage": where,
        "samples": {f"{pl}/{n}/{m}": v for (pl, n, m), v in samples.items()},
    }


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks fusion", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over every configuration (default 3)")
    p.add_argument("--quick", action="store_true", help="1 round, fewer requests, chains of 2 and 10 only")
    p.add_argument(
        "--rowwise",
        action="store_true",
        help="no-op maps called per row (each builds its output column: a copy) instead of on the whole column",
    )
    p.add_argument(
        "--colocate",
        choices=("both", "on", "off"),
        default="both",
        help="ClusterConfig.colocate: on (the default runtime: a request's stages run where their "
        "input is, hand-over in-process), off (consecutive stages on different executors, "
        "the seed's setting), or both, one cluster after the other (default)",
    )
    p.add_argument("--executors", type=int, default=2)
    p.add_argument(
        "--no-shm",
        action="store_true",
        help="every frame through the socket, shared memory (executors/wire/shm.py) off; results: fusion_noshm",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.no_shm:
        os.environ["FLOWSERVE_SHM_MIN_BYTES"] = str(1 << 62)  # read by the cluster's processes at start
    lengths = (2, 10) if args.quick else LENGTHS
    rounds = 1 if args.quick else args.rounds
    scale = 0.5 if args.quick else 1.0
    settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.colocate]
    progress(f"fusion: chains {lengths}, payloads {list(PAYLOADS)}, {rounds} round(s), colocate {args.colocate}")
    results = {
        ("colocated" if c else "spread"): measure(c, args.executors, lengths, rounds, scale, args.rowwise)
        for c in settings
    }
    flat = flatness(results, lengths)
    for key, f in flat.items():
        progress(
            f"{key}: fused p50 within {f['client_max_dev_pct']:+.1f}% of its median over chain lengths "
            f"({f['gateway_max_dev_pct']:+.1f}% in the gateway); goal +-10%"
        )
    out = {
        "lengths": list(lengths),
        "payloads": PAYLOADS,
        "fused_flatness": flat,
        "rounds": rounds,
        "rowwise": args.rowwise,
        "seed": "fused flat in chain length; unfused 20-40% slower on short chains, 3-5x slower at 10",
        "results": results,
    }
    out["shared_memory"] = not args.no_shm
    save("fusion_noshm" if args.no_shm else "fusion", out)
    _plot(results, lengths, "fusion_noshm" if args.no_shm else "fusion")
    return out


def flatness(results: dict, lengths) -> dict:
    """How flat the fused latency is in chain length, per setup and payload: the largest
    deviation of a chain length's p50 (client, and in the gateway) from the median of
    them all, in percent (the goal: within +-10%)."""
    out = {}
    for tag, res in results.items():
        for pl in PAYLOADS:
            entry = {}
            for name, key in (("client", "p50_ms"), ("gateway", "server_p50_ms")):
                values = [res["summary"][f"{pl}/{n}"]["fused"][key] for n in lengths]
                mid = statistics.median(values)
                entry[f"{name}_p50_ms"] = values
                entry[f"{name}_max_dev_pct"] = max((v / mid - 1) * 100 for v in values) if mid else float("nan")
                entry[f"{name}_min_dev_pct"] = min((v / mid - 1) * 100 for v in values) if mid else float("nan")
            out[f"{tag}/{pl}"] = entry
    return out


def _plot(results: dict, lengths, name: str = "fusion") -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(len(results), len(PAYLOADS), figsize=(13, 3.6 * len(results)), squeeze=False)
    for row, (tag, res) in zip(axes, results.items()):
        summary = res["summary"]
        for ax, pl in zip(row, PAYLOADS):
            for mode, style in (("fused", "o-"), ("unfused", "s--")):
                ax.plot(
                    lengths,
                    [summary[f"{pl}/{n}"][mode]["p50_ms"] for n in lengths],
                    style,
                    color="C0" if mode == "fused" else "C1",
                    label=f"{mode} p50",
                )
                ax.plot(
                    lengths,
                    [summary[f"{pl}/{n}"][mode]["p99_ms"] for n in lengths],
                    style,
                    alpha=0.3,
                    color="C0" if mode == "fused" else "C1",
                    label=f"{mode} p99",
                )
            ax.set_title(
                f"{tag}, {pl}: unfused/fused {summary[f'{pl}/{lengths[-1]}']['speedup_p50']:.2f}x at {lengths[-1]}",
                fontsize=9,
            )
            ax.set_xlabel("no-op stages in the chain")
            ax.set_ylabel("latency over HTTP (ms)")
            ax.set_ylim(bottom=0)
        row[0].legend(fontsize=7)
    save_plot(fig, name)


if __name__ == "__main__":
    run()
