"""End to end over HTTP: the Ensemble and the Cascade on FlowServe (optimized and not),
on Ray Serve, and on one plain uvicorn process computing in-process (the floor).

Closed loop with wrk at concurrency 1 and 8; systems run one after another in one run,
on the same machine, with the same model code (benchmarks/pipelines.py).

    python -m benchmarks e2e [--seconds 10] [--rounds 3] [--executors 1] [--ray-python /tmp/rayenv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from benchmarks.common import ROOT, free_port, plt, progress, save, save_plot, wait_http, wrk
from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess, sample_image

FLOWS = ("ensemble", "cascade")


# -- the pipelines as flows ---------------------------------------------------------------


def preprocess_table(table):
    return preprocess(table["img"])


class Small:
    def __init__(self):
        self.model = MLP("small")

    def __call__(self, table):
        return self.model(table["img"])


class Big(Small):
    def __init__(self):
        self.model = MLP("big")


def pick_row(row):
    return pick(row.cls, row.conf, row.cls_right, row.conf_right)


def pick_cascade(row):
    if row.cls_right is None:
        return row.cls, row.conf
    return pick(row.cls, row.conf, row.cls_right, row.conf_right)


def unsure(row):
    return row.conf < CASCADE_THRESHOLD


def ensemble_flow():
    from flow import ColumnType, Flow

    flow = Flow("ensemble", schema={"img": ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess_table, names=["img"], batching=True)
    small = img.map(Small, names=["cls", "conf"], batching=True)
    big = img.map(Big, names=["cls", "conf"], batching=True)
    small.join(big).map(pick_row, names=["cls", "conf"])
    return flow


def cascade_flow():
    from flow import ColumnType, Flow

    flow = Flow("cascade", schema={"img": ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess_table, names=["img"], batching=True)
    small = img.map(Small, names=["cls", "conf"], batching=True)
    big = img.join(small).filter(unsure).map(Big, names=["cls", "conf"], batching=True)
    small.join(big, how="left").map(pick_cascade, names=["cls", "conf"])
    return flow


# -- systems ----------------------------------------------------------------------------------


class _ServerProcess:
    """A peer system served by a child process on a local port."""

    port: int
    proc: subprocess.Popen

    def url(self, flow):
        return f"http://127.0.0.1:{self.port}/flows/{flow}"

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()


class Floor(_ServerProcess):
    name = "floor (1 uvicorn process, in-process)"

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "benchmarks.floor_server:app", "--port",
                                      str(self.port), "--log-level", "warning"], cwd=ROOT)
        return self


class Ours:
    def __init__(self, optimize: bool, executors: int = 1):
        self.optimize = optimize
        self.executors = executors
        self.name = "flowserve " + ("optimized" if optimize else "unoptimized")

    def __enter__(self):
        from executors import ClusterConfig, LocalCluster

        self.cluster = LocalCluster(ClusterConfig(executors=self.executors)).start()
        self.deployments = {f.name: self.cluster.deploy(f, optimize=self.optimize)
                            for f in (ensemble_flow(), cascade_flow())}
        self.plans = {n: d.explain() for n, d in self.deployments.items()}
        return self

    def url(self, flow):
        return self.deployments[flow].url

    def __exit__(self, *exc):
        self.cluster.stop()


class RayServe(_ServerProcess):
    name = "ray serve"

    def __init__(self, python: str):
        self.python = python

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([self.python, str(ROOT / "benchmarks" / "ray_server.py"), "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        for line in self.proc.stdout:
            if line.startswith("READY"):
                break
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        subprocess.run([self.python, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


# -- the run -------------------------------------------------------------------------------------


def measure(system, seconds: float, concurrencies=(1, 8)) -> dict:
    body = json.dumps({"img": sample_image().tolist()}).encode()
    out = {}
    with system as s:
        for flow in FLOWS:
            wait_http(s.url(flow), body)
            wrk(s.url(flow), body, 2, 2)  # warm up: models, caches, connections
            for c in concurrencies:
                r = wrk(s.url(flow), body, c, seconds)
                progress(f"{system.name:40s} {flow:9s} c={c}: {r['rps']:8.1f} req/s  p50 {r['p50_ms']:.2f} ms  "
                         f"p99 {r['p99_ms']:.2f} ms  non-2xx {r['non_2xx']}")
                out[f"{flow}/c{c}"] = r
        if hasattr(s, "plans"):
            out["plans"] = s.plans
    return out


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="per measurement (default 10)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over all systems; medians of the figures and of each round's ratios (default 3)")
    p.add_argument("--executors", type=int, default=1,
                   help="executor processes of our local cluster (default 1: with the gateway, the two processes "
                        "the floor's one is compared with; the cluster's own default is one per core, at least 2)")
    p.add_argument("--ray-python", default=os.environ.get("RAY_PYTHON", "/tmp/rayenv/bin/python"),
                   help="a Python with ray[serve] and torch (benchmarks/requirements-peers.txt); skipped if missing")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    systems = [Floor(), Ours(True, args.executors), Ours(False, args.executors)]
    if os.path.exists(args.ray_python):
        systems.append(RayServe(args.ray_python))
    else:
        progress(f"Ray Serve skipped: {args.ray_python} not found")
    rounds: dict[str, list[dict]] = {s.name: [] for s in systems}
    for r in range(args.rounds):  # rounds interleave the systems: drift hits all alike
        progress(f"round {r + 1} of {args.rounds}")
        for s in systems:
            rounds[s.name].append(measure(s, args.seconds))
    results = {name: _median(rs) for name, rs in rounds.items()}
    # the machine's speed drifts between minutes: compare systems within a round, where
    # they ran side by side, and report the median of those ratios
    per_round = [_ratios({name: rs[r] for name, rs in rounds.items()}) for r in range(args.rounds)]
    ratios = {k: statistics.median(pr[k] for pr in per_round) for k in per_round[0]}
    for k, v in ratios.items():
        progress(f"{k}: {v:.2f} (rounds: {', '.join(f'{pr[k]:.2f}' for pr in per_round)})")
    save("e2e", {"seconds": args.seconds, "rounds": args.rounds, "executors": args.executors, "results": results,
                 "ratios": ratios, "ratios_per_round": per_round, "per_round": rounds})
    _plot(results)
    return results


def _median(rounds: list[dict]) -> dict:
    out = {}
    for key in rounds[0]:
        if key == "plans":
            out[key] = rounds[0][key]
            continue
        out[key] = {m: statistics.median(r[key][m] for r in rounds)
                    for m in ("rps", "p50_ms", "p90_ms", "p99_ms")}
    return out


def _ratios(results: dict) -> dict:
    floor, opt = results.get(Floor.name), results.get("flowserve optimized")
    ray = results.get(RayServe.name)
    out = {}
    for flow in FLOWS:
        if opt and floor:
            out[f"{flow}: optimized / floor throughput at c=8"] = opt[f"{flow}/c8"]["rps"] / floor[f"{flow}/c8"]["rps"]
            out[f"{flow}: optimized / floor p50 at c=1"] = opt[f"{flow}/c1"]["p50_ms"] / floor[f"{flow}/c1"]["p50_ms"]
        if opt and ray:
            out[f"{flow}: optimized / ray serve throughput at c=8"] = opt[f"{flow}/c8"]["rps"] / ray[f"{flow}/c8"]["rps"]
    return out


def _plot(results: dict) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    for ax, metric, label in ((axes[0], "rps", "throughput at concurrency 8 (req/s)"),
                              (axes[1], "p50_ms", "p50 latency at concurrency 1 (ms)")):
        key = "c8" if metric == "rps" else "c1"
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            vals = [results[n].get(f"{f}/{key}", {}).get(metric, 0) for f in FLOWS]
            ax.bar(np.arange(len(FLOWS)) + i * width, vals, width, label=n)
        ax.set_xticks(np.arange(len(FLOWS)) + 0.4 - width / 2)
        ax.set_xticklabels(FLOWS)
        ax.set_title(label)
    axes[0].legend(fontsize=7)
    save_plot(fig, "e2e")


if __name__ == "__main__":
    run()
