"""Streamed answers: time to the first row against time to the whole answer.
``python -m benchmarks streaming [--reps 5] [--baseline DIR]``

On a local cluster (2 executors):

- **rows**: a 100-row request through a batching stage and a row stage whose work per row
  varies (1 to 20 ms, ``fs.wait``): streamed (``Accept: application/x-ndjson``), the time
  to the first row event and to the end event; not streamed, the time to the answer;
- **progressive**: the same 100 rows through ``first_then(fast, slow, when=unsure)`` (fast
  1 ms per row, slow 20 ms per unsure row, half the rows unsure): the time to the first
  event (a fast row), to every row's first event, and to the end; not streamed, the answer;
- **plain**: the p50 of a one-row JSON request (not streamed) to a one-stage flow at
  concurrency 1, the gateway's hot path; with ``--baseline DIR`` (a tree without streaming,
  e.g. ``git archive HEAD``) measured there too, interleaved, on the same machine.

Writes benchmarks/results/streaming.json and streaming.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROWS = 100


def row_work(row):
    import flowserve as fs

    fs.wait(0.001 + (row.x * 7 % 20) / 1000)  # 1-20 ms, spread over the rows
    return row.x * 2


def scale(table):
    return table["x"] + 0


def fast(row):
    import flowserve as fs

    fs.wait(0.001)
    return row.x, 0.5 if row.x % 2 else 0.95


def slow(row):
    import flowserve as fs

    fs.wait(0.02)
    return row.x, 0.99


def unsure(row):
    return row.conf < 0.9


def plus_one(row):
    return row.x + 1


def _stream(http, url: str, rows: list) -> dict:
    t0 = time.perf_counter()
    first = None
    per_row: dict[int, float] = {}
    with http.stream("POST", url, json=rows, headers={"Accept": "application/x-ndjson"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            event = json.loads(line)
            now = (time.perf_counter() - t0) * 1000
            if "row" in event:
                first = now if first is None else first
                per_row.setdefault(event["qid"], now)
            elif event.get("end"):
                return {"first_ms": first, "all_first_ms": max(per_row.values()), "end_ms": now}
            else:
                raise RuntimeError(f"stream failed: {event}")
    raise RuntimeError("stream ended without its end event")


def _whole(http, url: str, rows: list) -> float:
    t0 = time.perf_counter()
    http.post(url, json=rows).raise_for_status()
    return (time.perf_counter() - t0) * 1000


def measure_flows(reps: int) -> dict:
    import httpx

    import flowserve as fs
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig

    cluster = LocalCluster(ClusterConfig(executors=2, threads=8, request_timeout_s=60)).start()
    out: dict = {}
    try:
        rows_flow = fs.Flow("stream-rows", schema={"x": int})
        rows_flow.map(scale, names=["x"], batching=True).map(row_work, names=["y"])
        prog = fs.Flow("stream-progressive", schema={"x": int})
        prog.first_then(fast, slow, names=["cls", "conf"], when=unsure)
        rows = [{"x": i} for i in range(ROWS)]
        with httpx.Client(timeout=120) as http:
            for name, flow in (("rows", rows_flow), ("progressive", prog)):
                d = flow.deploy(cluster=cluster)
                _stream(http, d.url, rows)  # warm
                _whole(http, d.url, rows)
                streamed, whole = [], []
                for _ in range(reps):
                    streamed.append(_stream(http, d.url, rows))
                    whole.append(_whole(http, d.url, rows))
                out[name] = {
                    "first_ms": statistics.median(s["first_ms"] for s in streamed),
                    "all_first_ms": statistics.median(s["all_first_ms"] for s in streamed),
                    "end_ms": statistics.median(s["end_ms"] for s in streamed),
                    "whole_ms": statistics.median(whole),
                    "reps": reps,
                }
                print(name, out[name], flush=True)
                d.undeploy()
    finally:
        cluster.stop()
    return out


def _plain(n: int) -> float:
    """p50 ms of a one-row JSON request to a one-stage flow, at concurrency 1."""
    import flowserve as fs
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig

    cluster = LocalCluster(ClusterConfig(executors=2, threads=4)).start()
    try:
        flow = fs.Flow("plain", schema={"x": int})
        flow.map(plus_one, names=["y"])
        d = flow.deploy(cluster=cluster)
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(d.url)
        conn = http.client.HTTPConnection(u.hostname, u.port)
        body = b'{"x": 1}'
        times = []
        for i in range(n + 50):
            t0 = time.perf_counter()
            conn.request("POST", u.path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"plain request answered {r.status}")
            if i >= 50:  # the first ones warm the connection and the stage
                times.append((time.perf_counter() - t0) * 1000)
        conn.close()
        d.undeploy()
        return statistics.median(times)
    finally:
        cluster.stop()


def plain_summary(plain: dict) -> dict:
    """Medians of the plain p50s, and this tree's to the baseline's as the median of the
    per-round ratios (the machine's speed drifts between rounds, less within one)."""
    out = {"this_p50_ms": statistics.median(plain["this"])}
    if plain["baseline"]:
        out["baseline_p50_ms"] = statistics.median(plain["baseline"])
        out["round_ratios"] = [a / b for a, b in zip(plain["this"], plain["baseline"])]
        out["ratio"] = statistics.median(out["round_ratios"])
    return out


def _plain_in(tree: Path, n: int) -> float:
    """``_plain`` run by a fresh process on ``tree``'s code (this file's function, that tree's runtime)."""
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); "
        "import runpy; ns = runpy.run_path(sys.argv[2]); print(json.dumps(ns['_plain'](int(sys.argv[3]))))"
    )
    env = dict(os.environ, PYTHONPATH=str(tree), FLOWSERVE_QUIET="1")
    r = subprocess.run(
        [sys.executable, "-c", code, str(tree), __file__, str(n)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return float(r.stdout.strip().splitlines()[-1])


def run(argv: list[str]) -> None:
    from benchmarks.common import ROOT, plt, progress, save, save_plot

    ap = argparse.ArgumentParser(prog="python -m benchmarks streaming")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--plain-requests", type=int, default=400)
    ap.add_argument("--baseline", type=Path, help="a tree without streaming: the plain p50 measured there too")
    args = ap.parse_args(argv)
    progress("streamed and whole answers: 100 rows, and the progressive cascade")
    flows = measure_flows(args.reps)
    plain: dict = {"this": [], "baseline": []}
    for _ in range(3 if args.baseline else 1):  # interleaved: each tree's cluster in turn
        plain["this"].append(_plain_in(ROOT, args.plain_requests))
        if args.baseline:
            plain["baseline"].append(_plain_in(args.baseline, args.plain_requests))
    summary = plain_summary(plain)
    progress(f"plain one-row p50: {summary}")
    save(
        "streaming",
        {
            "rows": ROWS,
            "flows": flows,
            "plain": {**plain, **summary},
            "args": vars(args) | {"baseline": str(args.baseline)},
        },
    )

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 3.6))
    names = list(flows)
    series = [
        ("first row (stream)", "first_ms"),
        ("every row's first event (stream)", "all_first_ms"),
        ("end (stream)", "end_ms"),
        ("whole answer (not streamed)", "whole_ms"),
    ]
    width = 0.2
    for k, (label, key) in enumerate(series):
        ax.bar([i + k * width for i in range(len(names))], [flows[n][key] for n in names], width, label=label)
    ax.set_xticks([i + 1.5 * width for i in range(len(names))], [f"{n} ({ROWS} rows)" for n in names])
    ax.set_ylabel("ms (median)")
    ax.set_title("Streamed answers: time to the first row vs the whole answer")
    ax.legend(fontsize=8)
    save_plot(fig, "streaming")


if __name__ == "__main__":
    run(sys.argv[1:])
