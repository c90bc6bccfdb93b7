"""The per-stage cost table: chains of 1, 2, 4 and 8 no-op stages over HTTP, unfused
(``optimize=False``: a stage per operator) and fused (the default optimizer: one stage),
beside Ray Serve's chain of as many no-op deployments composed through handles.

    python -m benchmarks stages [--reps 3] [--seconds 2] [--ray-python PATH]

One JSON row ``{"x": 1}`` per request (benchmarks/chain.py's flows); wrk at concurrency 8
(requests/s) and 1 (p50). FlowServe runs in the local cluster's default shape; its chains
alternate with each other rep after rep. Ray Serve (its own venv, requirements-peers.txt;
skipped if missing) is measured in a phase of its own in the same run, as e2e measures it,
so that its idle processes do not tax FlowServe's figures. An added stage's cost is its
share of the 1-stage chain's throughput: (1 - req/s(n) / req/s(1)) / (n - 1), the median
of per-rep figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import time

from benchmarks.chain import chain_flow
from benchmarks.common import ROOT, free_port, plt, progress, save, save_plot, wait_http, wrk
from benchmarks.e2e import PEERS, RayServe

LENGTHS = (1, 2, 4, 8)


class RayChains(RayServe):
    """Ray Serve serving /flows/chainN for every length (ray_server.py --chains)."""

    name = "ray serve"

    def __enter__(self):
        self.port = free_port()
        lengths = ",".join(map(str, LENGTHS))
        self.proc = subprocess.Popen(
            [self.python, str(ROOT / "benchmarks" / "ray_server.py"), "--port", str(self.port), "--chains", lengths],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        if not any(line.startswith("READY") for line in self.proc.stdout):
            self.proc.wait()
            raise RuntimeError(f"ray_server.py --chains exited with {self.proc.returncode} before serving")
        return self

    def urls(self) -> dict[str, str]:
        return {f"ray serve/{n}": f"http://127.0.0.1:{self.port}/flows/chain{n}" for n in LENGTHS}


def measure(urls: dict[str, str], reps: int, seconds: float) -> list[dict]:
    """Every URL at c=8 and c=1, one after another, ``reps`` times: one {label: figures} per rep."""
    body = json.dumps({"x": 1}).encode()
    for url in urls.values():
        wait_http(url, body)
        wrk(url, body, 8, 1)  # warm: connections, code paths
    out = []
    for rep in range(reps):
        figures = {}
        for label, url in urls.items():
            c8, c1 = wrk(url, body, 8, seconds), wrk(url, body, 1, seconds)
            if c8["non_2xx"] or c1["non_2xx"]:
                raise RuntimeError(f"{label}: answers that were not 2xx")
            figures[label] = {"rps_c8": c8["rps"], "p50_c1_ms": c1["p50_ms"]}
        progress(
            f"rep {rep + 1} of {reps}: "
            + "; ".join(f"{k} {v['rps_c8']:.0f} req/s, {v['p50_c1_ms']:.3f} ms" for k, v in figures.items())
        )
        out.append(figures)
    return out


def table(per_rep: list[dict], system: str) -> dict:
    """Per length: median req/s at c=8, p50 at c=1, share of the 1-stage throughput, cost per added stage."""
    out = {}
    for n in LENGTHS:
        label = f"{system}/{n}"
        if label not in per_rep[0]:
            continue
        share = [r[label]["rps_c8"] / r[f"{system}/1"]["rps_c8"] for r in per_rep]
        out[n] = {
            "rps_c8": statistics.median(r[label]["rps_c8"] for r in per_rep),
            "p50_c1_ms": statistics.median(r[label]["p50_c1_ms"] for r in per_rep),
            "throughput_share_of_1": statistics.median(share),
            "cost_per_added_stage": None if n == 1 else statistics.median((1 - s) / (n - 1) for s in share),
        }
    return out


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="reps over every chain (default 3)")
    p.add_argument("--seconds", type=float, default=2.0, help="per wrk measurement, whole seconds (default 2)")
    _cls, _dest, env, default = PEERS["ray"]
    p.add_argument(
        "--ray-python",
        default=os.environ.get(env, default),
        help=f"a Python with ray[serve] (its own venv); Ray Serve is skipped if missing (default ${env} or {default})",
    )
    p.add_argument("--name", default="stages", help="results file name (default stages)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from executors import LocalCluster

    started = time.monotonic()
    with LocalCluster() as cluster:
        urls = {}
        plans = {}
        for fused in (False, True):
            system = "fused" if fused else "unfused"
            for n in LENGTHS:
                d = cluster.deploy(chain_flow(n, f"{system}{n}"), optimize=fused)
                urls[f"{system}/{n}"] = d.url
                plans[f"{system}/{n}"] = len(d.plan.stages)
        progress(f"stages per plan: {plans}")
        ours = measure(urls, args.reps, args.seconds)
    ray: list[dict] = []
    ray_note = None
    if os.path.exists(args.ray_python):
        progress("phase: ray serve")
        with contextlib.ExitStack() as stack:
            chains = stack.enter_context(RayChains(args.ray_python))
            ray = measure(chains.urls(), args.reps, args.seconds)
    else:
        ray_note = f"not measured: {args.ray_python} not found (benchmarks/requirements-peers.txt)"
        progress(f"ray serve {ray_note}")
    tables = {s: table(ours, s) for s in ("unfused", "fused")}
    if ray:
        tables["ray serve"] = table(ray, "ray serve")
    for system, rows in tables.items():
        for n, f in rows.items():
            cost = f["cost_per_added_stage"]
            progress(
                f"{system:9s} {n} stages: {f['rps_c8']:6.0f} req/s at c=8 ({f['throughput_share_of_1']:.2f} of 1 stage"
                + (f", {cost:.1%} per added stage" if cost is not None else "")
                + f"), p50 {f['p50_c1_ms']:.3f} ms at c=1"
            )
    out = {
        "reps": args.reps,
        "seconds": args.seconds,
        "took_s": round(time.monotonic() - started),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "lengths": LENGTHS,
        "stages_per_plan": plans,
        "ray_serve": ray_note or "measured in a phase of its own",
        "table": tables,
        "per_rep": ours,
        "ray_per_rep": ray,
    }
    save(args.name, out)
    _plot(tables, args.name)
    return out


def _plot(tables: dict, name: str) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 3.8))
    for system, rows in tables.items():
        ns = list(rows)
        axes[0].plot(ns, [rows[n]["throughput_share_of_1"] for n in ns], "o-", label=system)
        axes[1].plot(ns, [rows[n]["p50_c1_ms"] for n in ns], "o-", label=system)
    axes[0].set_ylabel("req/s at c=8, share of 1 stage")
    axes[1].set_ylabel("p50 at c=1 (ms)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("no-op stages")
        ax.set_xticks(LENGTHS)
        ax.legend(fontsize=8)
    axes[0].set_ylim(0, 1.1)
    save_plot(fig, name)


if __name__ == "__main__":
    run()
