"""What OpenTelemetry tracing costs a request: off, sampling 1 % of requests, and 100 %.

Three local clusters side by side, the same but for ``ClusterConfig.tracing`` (off;
``TracingConfig(sample_ratio=0.01)``; ``sample_ratio=1.0``), each serving a flow of two
stages (two hops: gateway -> executor -> executor -> gateway), its spans exported over
OTLP/HTTP to a receiver in this process that takes and drops them (a collector's cost is
the collector's, not the cluster's). wrk drives one cluster at a time, closed loop: p50 at
concurrency 1 (what a request pays), and throughput and the cluster's CPU per request at
concurrency 8 (what the machine pays); the configurations take turns, round after round,
and each figure is the median of its rounds (a ratio to off: the median of the per-round
ratios), so a drift of the machine falls on all three alike. Then the hooks alone, in this
process (``hooks_us``). About 100 s.

    python -m benchmarks tracing [--seconds 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import statistics
import subprocess
import threading

from benchmarks.common import plt, progress, save, save_plot, wait_http, wrk

NAME = "tracing"
SETTINGS = {"off": None, "1%": 0.01, "100%": 1.0}
BODY = b'{"x": 1}'
_TICK = os.sysconf("SC_CLK_TCK")


def plus_one(row):
    return row.x + 1


def times_two(row):
    return row.y * 2


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (from /proc)."""
    total = 0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _serving(cluster) -> list[int]:
    """The pids of a local cluster's gateway and executors (its supervisor's children
    but the KVS server)."""
    out = subprocess.run(["pgrep", "-P", str(cluster.proc.pid)], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in map(int, out):
        cmd = open(f"/proc/{pid}/cmdline").read()
        if "local_gateway" in cmd or "executors.worker.executor" in cmd:
            pids.append(pid)
    return pids


class Sink:
    """An OTLP/HTTP endpoint that answers every export 200 and keeps only a count."""

    def __init__(self):
        self.exports = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server API)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def run(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks tracing", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="wrk duration per measurement (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the three configurations (default 5)")
    args = p.parse_args(argv)

    from executors import ClusterConfig, LocalCluster
    from executors.tracing import TracingConfig
    from flow import Flow

    sink = Sink()
    clusters, urls = {}, {}
    try:
        for label, ratio in SETTINGS.items():
            tracing = None if ratio is None else TracingConfig(endpoint=sink.endpoint, sample_ratio=ratio)
            clusters[label] = LocalCluster(ClusterConfig(tracing=tracing)).start()
            f = Flow("traced", schema={"x": int})
            f.map(plus_one, names=["y"]).map(times_two, names=["z"])
            urls[label] = clusters[label].deploy(f, optimize=False).url
            wait_http(urls[label], BODY)
        pids = {label: _serving(c) for label, c in clusters.items()}
        runs: dict = {label: {"c1": [], "c8": []} for label in SETTINGS}
        for r in range(args.rounds):
            for label in SETTINGS:
                wrk(urls[label], BODY, 1, 1)  # warm: the cluster was idle while the others ran
                one = wrk(urls[label], BODY, 1, args.seconds)
                cpu0 = _cpu_s(pids[label])
                eight = wrk(urls[label], BODY, 8, args.seconds, threads=2)
                # CPU per request of the cluster's processes: what tracing costs the machine,
                # and less moved than latency by other work on it
                eight["cpu_us_per_request"] = (_cpu_s(pids[label]) - cpu0) / (eight["rps"] * args.seconds) * 1e6
                runs[label]["c1"].append(one)
                runs[label]["c8"].append(eight)
                progress(
                    f"round {r + 1} tracing {label:>4}: c=1 p50 {one['p50_ms']:.3f} ms, "
                    f"c=8 {eight['rps']:.0f} req/s (p50 {eight['p50_ms']:.2f} ms), "
                    f"CPU {eight['cpu_us_per_request']:.0f} us/request"
                )
        hooks = _hooks(sink.endpoint)  # while the sink still takes what the hooks export
    finally:
        for c in clusters.values():
            c.stop()
        sink.server.shutdown()

    summary = {
        label: {
            "c1_p50_ms": statistics.median(x["p50_ms"] for x in runs[label]["c1"]),
            "c1_p99_ms": statistics.median(x["p99_ms"] for x in runs[label]["c1"]),
            "c8_rps": statistics.median(x["rps"] for x in runs[label]["c8"]),
            "c8_p50_ms": statistics.median(x["p50_ms"] for x in runs[label]["c8"]),
            "c8_cpu_us_per_request": statistics.median(x["cpu_us_per_request"] for x in runs[label]["c8"]),
        }
        for label in SETTINGS
    }
    for label, s in summary.items():  # medians of the per-round ratios: a round's three ran minutes apart at most
        s["c1_p50_vs_off"] = round(
            statistics.median(x["p50_ms"] / o["p50_ms"] for x, o in zip(runs[label]["c1"], runs["off"]["c1"])), 3
        )
        s["c8_rps_vs_off"] = round(
            statistics.median(x["rps"] / o["rps"] for x, o in zip(runs[label]["c8"], runs["off"]["c8"])), 3
        )
        s["c8_cpu_vs_off"] = round(
            statistics.median(
                x["cpu_us_per_request"] / o["cpu_us_per_request"] for x, o in zip(runs[label]["c8"], runs["off"]["c8"])
            ),
            3,
        )
        progress(
            f"tracing {label:>4}: p50 at c=1 {s['c1_p50_ms']:.3f} ms ({s['c1_p50_vs_off']:.2f}x off), "
            f"{s['c8_rps']:.0f} req/s at c=8 ({s['c8_rps_vs_off']:.2f}x off), "
            f"CPU {s['c8_cpu_us_per_request']:.0f} us/request ({s['c8_cpu_vs_off']:.2f}x off)"
        )
    save(
        NAME,
        {
            "flow": "two stages (plus_one -> times_two), one JSON row, optimize=False",
            "seconds": args.seconds,
            "rounds": args.rounds,
            "exports_received": sink.exports,
            "summary": summary,
            "hooks_us": hooks,
            "runs": runs,
        },
    )
    _plot(summary)


def _hooks(endpoint: str, n: int = 20000) -> dict:
    """The tracing hooks alone, in this process (best of 5 loops, us a call): the gateway's
    work for one request at each ratio, and an executor's for one traced stage run. Less
    moved by other work on the machine than the end-to-end figures."""
    import time

    from executors import tracing
    from executors.tracing import TracingConfig

    def best(fn, count: int) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(count):
                fn()
            times.append((time.perf_counter() - t0) / count * 1e6)
        return round(min(times), 2)

    headers = {"content-type": "application/json"}

    def gateway():
        span = tracing.request_span("f", headers, "0123456789abcdef")
        tracing.traceparent(span)
        tracing.end_request(span, 200)

    def stage_run():
        with tracing.start_run("stage s", [tp], {"flowserve.stage": "s", "flowserve.batch.size": 1}):
            pass

    out = {"gateway, off (the test of tracing.tracer)": best(lambda: tracing.tracer is not None, n)}
    # these loops make spans faster than one export thread sends them: the SDK drops what its
    # queue cannot hold (the hooks' cost is what is measured here), warning of each drop
    logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    tracing.setup(TracingConfig(endpoint=endpoint, sample_ratio=0.01), "benchmark")
    try:
        out["gateway, one request, sampling 1%"] = best(gateway, n)
        tracing._ratio = 1.0
        out["gateway, one request, sampling 100%"] = best(gateway, n // 4)
        tp = tracing.traceparent(tracing.request_span("f", headers))
        out["executor, one traced stage run"] = best(stage_run, n // 4)
    finally:
        tracing.shutdown()
    for what, us in out.items():
        progress(f"hooks: {what}: {us:.2f} us")
    return out


def _plot(summary: dict) -> None:
    pyplot = plt()
    fig, (a, b, c) = pyplot.subplots(1, 3, figsize=(12, 3.4))
    labels = list(summary)
    a.bar(labels, [summary[k]["c1_p50_ms"] for k in labels], color=["#888", "#4a90d9", "#d9534f"])
    a.set_title("p50 latency, concurrency 1")
    a.set_ylabel("ms")
    b.bar(labels, [summary[k]["c8_rps"] for k in labels], color=["#888", "#4a90d9", "#d9534f"])
    b.set_title("throughput, concurrency 8")
    b.set_ylabel("requests / s")
    c.bar(labels, [summary[k]["c8_cpu_us_per_request"] for k in labels], color=["#888", "#4a90d9", "#d9534f"])
    c.set_title("CPU per request, concurrency 8")
    c.set_ylabel("us (gateway + executor)")
    for ax in (a, b, c):
        ax.set_xlabel("tracing (share of requests sampled)")
    save_plot(fig, NAME)


if __name__ == "__main__":
    import sys

    run(sys.argv[1:])
