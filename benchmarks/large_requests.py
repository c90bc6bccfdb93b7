"""Large requests: 5 and 50 MB JSON bodies and a 200 MB Arrow body sent to one flow while
another client keeps calling a small flow. Per body: status and time to answer, the
gateway's peak memory above its idle size (VmHWM, reset before each request) divided by
the body size, and the small client's p50/p99 before and while the big request runs.

    python -m benchmarks large_requests                   # this tree
    cd /tmp/base && PYTHONPATH=/tmp/base python /work/main/benchmarks/large_requests.py --label base

The script imports nothing but the cluster API, so it also runs against an older tree
(the cluster's processes import from the working directory and PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow

RESULTS = Path(__file__).resolve().parent / "results"


def scaled(table):
    """Vectorised over the whole request (batching=True): the figures are the serving
    system's, not 12 M calls of a Python function."""
    return table["x"] * 2.0 + table["k"]


def bump(row):
    return row.x + 1


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _json_body(mb: float) -> tuple[bytes, int]:
    n = int(mb * 1e6 / 21.5)  # {"x":12345.25,"k":3}, about 21.5 bytes a row
    rows = [{"x": i * 0.25, "k": i % 7} for i in range(n)]
    return orjson.dumps(rows), n


def _arrow_body(mb: float) -> tuple[bytes, int]:
    import pyarrow as pa

    n = int(mb * 1e6 / 16)
    table = pa.table({"x": np.arange(n, dtype=np.float64) * 0.25, "k": (np.arange(n) % 7).astype(np.int64)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes(), n


class Background:
    """One client calling the small flow in a closed loop: (time sent, latency ms, status)."""

    def __init__(self, url: str):
        self.url, self.samples, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                t = time.perf_counter()
                r = client.post(self.url, json={"x": 1})
                self.samples.append((t, (time.perf_counter() - t) * 1000, r.status_code))

    def window(self, start: float, end: float) -> dict:
        ms = [m for t, m, s in self.samples if start <= t < end and s == 200]
        failed = sum(1 for t, m, s in self.samples if start <= t < end and s != 200)
        if not ms:
            return {"n": 0, "failed": failed}
        return {"n": len(ms), "failed": failed, "p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99))}


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks large_requests", description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", default="json:5,json:50,arrow:200", help="KIND:MB,... (json or arrow)")
    p.add_argument("--label", default="this tree")
    p.add_argument("--out", default=str(RESULTS / "large_requests.json"))
    args = p.parse_args(argv)
    fields = dict(executors=1, threads=4, request_timeout_s=120.0, max_body_bytes=256 << 20, max_rows=20_000_000)
    if "max_request_timeout_s" in getattr(ClusterConfig, "__dataclass_fields__", {}):
        fields["max_request_timeout_s"] = 120.0
    cluster = LocalCluster(ClusterConfig(**fields)).start()
    results = []
    try:
        big = Flow("big", schema={"x": float, "k": int})
        big.map(scaled, names=["y"], batching=True)
        small = Flow("small", schema={"x": int})
        small.map(bump, names=["y"])
        d_big, d_small = cluster.deploy(big), cluster.deploy(small)
        pid = cluster.proc.pid  # the daemon process hosts the gateway
        bg = Background(d_small.url)
        bg.thread.start()
        for spec in args.bodies.split(","):
            kind, mb = spec.split(":")
            body, rows = (_json_body if kind == "json" else _arrow_body)(float(mb))
            ctype = "application/json" if kind == "json" else "application/vnd.apache.arrow.stream"
            time.sleep(2.0)  # the small client's undisturbed latency, just before
            idle_kb = _status_kb(pid, "VmRSS")
            _reset_peak(pid)
            t0 = time.perf_counter()
            try:
                r = httpx.post(d_big.url, content=body, headers={"content-type": ctype, "accept": ctype}, timeout=180)
                status, answer_bytes = r.status_code, len(r.content)
            except httpx.HTTPError as e:
                status, answer_bytes = f"{type(e).__name__}", 0
            t1 = time.perf_counter()
            peak_kb = _status_kb(pid, "VmHWM")
            row = {
                "body": spec,
                "body_mb": len(body) / 1e6,
                "rows": rows,
                "status": status,
                "seconds": t1 - t0,
                "answer_mb": answer_bytes / 1e6,
                "gateway_idle_mb": idle_kb / 1024,
                "gateway_peak_growth_mb": (peak_kb - idle_kb) / 1024,
                "growth_per_body": (peak_kb - idle_kb) * 1024 / len(body),
                "small_before": bg.window(t0 - 2.0, t0),
                "small_during": bg.window(t0, t1),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
            del body
        bg.stop.set()
        bg.thread.join()
    finally:
        cluster.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc[args.label] = {"machine": f"{os.cpu_count()} cores, shared", "results": results}
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    run()
