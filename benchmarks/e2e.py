"""End to end over HTTP: the Ensemble and the Cascade on FlowServe (optimized and not),
on Ray Serve, and on one plain uvicorn process computing in-process (the floor).

Closed loop with wrk at concurrency 1 and 8, the same model code in every system
(benchmarks/pipelines.py). The systems run side by side: all are up at once and short
measurements alternate between them, rep after rep, so the drift of a shared machine hits
them alike; ratios are the medians of the per-rep ratios. Ray Serve, 40x slower, is
measured in a second phase against FlowServe optimized (its idle processes would disturb
the others).

    python -m benchmarks e2e [--seconds 3] [--reps 8] [--executors N] [--peers ray,litserve,bentoml] [--relay]

Phase 1: the floor, FlowServe optimized in the cluster's default shape (what flow.deploy()
gives), the same with a hand-picked shape (--shape, default 2 executors), unoptimized.
Then each peer alone beside FlowServe optimized (their own venvs, requirements-peers.txt).
    python -m benchmarks e2e --baseline /tmp/base   # A/B: this tree against another checkout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

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
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "benchmarks.floor_server:app",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        return self


class Relay(_ServerProcess):
    """The two-process floor (relay_server.py): an HTTP process relaying raw bodies to one
    worker process that runs the floor's code; both busy-poll as FlowServe does."""

    name = "two-process floor (relay + 1 worker)"

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "relay_server.py"), "--port", str(self.port)], cwd=ROOT
        )
        return self  # measure_side_by_side waits until it answers


class Ours:
    def __init__(self, optimize: bool, executors: int | None = None, busy_poll_ms: float | None = None):
        self.optimize = optimize
        self.executors = executors
        self.busy_poll_ms = busy_poll_ms  # None: the cluster's default
        self.name = "flowserve " + ("optimized" if optimize else "unoptimized")
        if busy_poll_ms is not None:
            self.name += f", busy_poll_ms={busy_poll_ms:g}"

    def __enter__(self):
        from executors import ClusterConfig, LocalCluster

        extra = {} if self.busy_poll_ms is None else {"busy_poll_ms": self.busy_poll_ms}
        if self.executors is not None:  # None: the cluster's default shape
            extra["executors"] = self.executors
        self.cluster = LocalCluster(ClusterConfig(**extra)).start()
        self.deployments = {
            f.name: self.cluster.deploy(f, optimize=self.optimize) for f in (ensemble_flow(), cascade_flow())
        }
        self.plans = {n: d.explain() for n, d in self.deployments.items()}
        return self

    def url(self, flow):
        return self.deployments[flow].url

    def __exit__(self, *exc):
        self.cluster.stop()


class OursAt(Ours):
    """FlowServe optimized, its cluster run from another checkout (e.g. the previous commit
    in a git worktree) with this tree's process layout (executors/hosts/): an A/B of a
    change side by side. The cluster's processes import the
    other tree first, and the flows are deployed by that tree's own client (a subprocess):
    a plan pickled by this tree need not unpickle there (modules move between commits)."""

    def __init__(self, tree: str, executors: int | None = None):
        super().__init__(True, executors)
        self.tree = os.path.abspath(tree)
        self.name = f"flowserve optimized @ {os.path.basename(self.tree)}"

    def __enter__(self):
        import re

        from executors import ClusterConfig, LocalCluster

        # the other tree's ClusterConfig may not know this tree's newer fields: send only its own
        src = open(os.path.join(self.tree, "executors", "hosts", "cluster_config.py")).read()
        known = set(re.findall(r"^    (\w+): [^=\n]+=", src.split("class ClusterConfig", 1)[1], re.M))
        config = ClusterConfig(**({} if self.executors is None else {"executors": self.executors}))
        doc = {k: v for k, v in config.to_json().items() if k in known}
        here = os.getcwd()
        os.chdir(self.tree)  # LocalCluster puts the cwd first on its processes' PYTHONPATH
        try:
            self.cluster = LocalCluster(config)
            self.cluster.config = _Sent(config, doc)
            self.cluster.start()
        finally:
            os.chdir(here)
        deploy = (
            "import json, sys\n"
            "from benchmarks.e2e import cascade_flow, ensemble_flow\n"
            "from executors.hosts.cluster import LocalCluster\n"
            "c = LocalCluster.connect(sys.argv[1])\n"
            "ds = [c.deploy(f, optimize=True) for f in (ensemble_flow(), cascade_flow())]\n"
            "print(json.dumps({d.name: [d.url, d.explain()] for d in ds}))\n"
        )
        env = dict(os.environ, PYTHONPATH=self.tree)
        out = subprocess.run(
            [sys.executable, "-c", deploy, str(self.cluster.dir)],
            cwd=self.tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        deployed = json.loads(out.strip().splitlines()[-1])
        self.deployments = {name: _Deployed(url) for name, (url, _) in deployed.items()}
        self.plans = {name: text for name, (_, text) in deployed.items()}
        return self


class _Deployed:
    def __init__(self, url: str):
        self.url = url


class _Sent:
    """A ClusterConfig whose JSON (what the cluster process is started with) is ``doc``."""

    def __init__(self, config, doc: dict):
        self._config, self._doc = config, doc

    def to_json(self) -> dict:
        return dict(self._doc)

    def __getattr__(self, name):
        return getattr(self._config, name)


class RayServe(_ServerProcess):
    name = "ray serve"

    def __init__(self, python: str):
        self.python = python

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [self.python, str(ROOT / "benchmarks" / "ray_server.py"), "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        for line in self.proc.stdout:
            if line.startswith("READY"):
                break
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        subprocess.run([self.python, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


class LitServe(_ServerProcess):
    name = "litserve"

    def __init__(self, python: str):
        self.python = python

    def __enter__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [self.python, str(ROOT / "benchmarks" / "litserve_server.py"), "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            start_new_session=True,  # its API server and worker processes go with it
        )
        for line in self.proc.stdout:
            if line.startswith("READY"):
                break
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        self.proc.wait()


class BentoML(_ServerProcess):
    name = "bentoml"

    def __init__(self, python: str):
        self.python = python

    def __enter__(self):
        self.port = free_port()
        bentoml = str(Path(self.python).parent / "bentoml")
        self.proc = subprocess.Popen(
            [bentoml, "serve", "benchmarks.bentoml_server:Pipelines", "--port", str(self.port), "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT), BENTOML_DO_NOT_TRACK="true"),
            start_new_session=True,
        )
        return self  # measure_side_by_side waits until it answers

    def __exit__(self, *exc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        self.proc.wait()


# a peer: (its class, the option naming its Python, the environment variable, the default venv)
PEERS = {
    "ray": (RayServe, "ray_python", "RAY_PYTHON", "/tmp/peer-ray/bin/python"),
    "litserve": (LitServe, "litserve_python", "LITSERVE_PYTHON", "/tmp/peer-litserve/bin/python"),
    "bentoml": (BentoML, "bentoml_python", "BENTOML_PYTHON", "/tmp/peer-bentoml/bin/python"),
}


def add_peer_options(p) -> None:
    """One option per peer naming the Python it runs with (its own venv)."""
    for peer, (_cls, dest, env, default) in PEERS.items():
        p.add_argument(
            f"--{peer}-python",
            dest=dest,
            default=os.environ.get(env, default),
            help=f"a Python with {peer} and torch, its own venv (benchmarks/requirements-peers.txt); "
            f"skipped if missing (default ${env} or {default})",
        )


# -- the run -------------------------------------------------------------------------------------


def measure_side_by_side(systems: list, seconds: float, reps: int, concurrencies=(1, 8)) -> list[dict]:
    """All ``systems`` up at once; each rep measures every system at every flow and
    concurrency, one after another. Returns one {system name: {flow/cN: figures}} per rep."""
    body = json.dumps({"img": sample_image().tolist()}).encode()
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(s) for s in systems]
        for s in started:
            for flow in FLOWS:
                wait_http(s.url(flow), body)
                wrk(s.url(flow), body, 2, 2)  # warm up: models, caches, connections
        out = []
        for rep in range(reps):
            figures: dict = {s.name: {} for s in started}
            for flow in FLOWS:
                for c in concurrencies:
                    for s in started:
                        figures[s.name][f"{flow}/c{c}"] = wrk(s.url(flow), body, c, seconds)
            progress(
                f"rep {rep + 1} of {reps}: "
                + "; ".join(
                    f"{name} c=1 p50 {f['ensemble/c1']['p50_ms']:.2f} ms, c=8 {f['ensemble/c8']['rps']:.0f} req/s"
                    for name, f in figures.items()
                )
            )
            out.append(figures)
        plans = {s.name: s.plans for s in started if hasattr(s, "plans")}
    for figures in out:
        for name, p in plans.items():
            figures[name]["plans"] = p
    return out


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    p.add_argument(
        "--reps",
        type=int,
        default=8,
        help="reps over all systems; medians of the figures and of each rep's ratios (default 8)",
    )
    p.add_argument(
        "--shape",
        type=int,
        default=2,
        help="executors of the hand-picked shape measured beside the default one (default 2; 0: none)",
    )
    p.add_argument("--busy-poll-off", action="store_true", help="also measure FlowServe with busy_poll_ms=0")
    p.add_argument(
        "--relay",
        action="store_true",
        help="also measure the two-process floor (relay_server.py: raw bodies relayed to one worker process)",
    )
    p.add_argument(
        "--executors",
        type=int,
        default=None,
        help="executor processes of our local cluster (default: the cluster's own default shape, one per "
        "core but the gateway's, at least 1)",
    )
    add_peer_options(p)
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="peers to measure, each in a phase of its own beside FlowServe optimized (default: all; '' for none)",
    )
    p.add_argument("--peer-reps", type=int, default=None, help="reps per peer phase (default: reps // 3, at least 2)")
    p.add_argument(
        "--baseline",
        default=None,
        help="another checkout (e.g. `git worktree add /tmp/base HEAD~1`): measure only the floor, this "
        "tree and that one side by side, and report this / baseline ratios",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    ours = Ours(True, args.executors)
    if args.baseline:
        systems = [Floor(), ours, OursAt(args.baseline, args.executors)]
        if args.relay:
            systems.insert(1, Relay())
    else:
        systems = [Floor(), ours]
        if args.relay:
            systems.insert(1, Relay())
        if args.shape:
            hand = Ours(True, args.shape)
            hand.name = f"flowserve optimized, {args.shape} executors"
            systems.append(hand)
        if args.busy_poll_off:
            systems.append(Ours(True, args.executors, busy_poll_ms=0))
        systems.append(Ours(False, args.executors))
    progress(f"phase 1: {', '.join(s.name for s in systems)}")
    reps = measure_side_by_side(systems, args.seconds, args.reps)
    # each peer alone beside ours: their idle processes must not tax the others
    peer_reps: dict[str, list] = {}
    for peer in [] if args.baseline else [p for p in args.peers.split(",") if p]:
        cls, dest, _env, _default = PEERS[peer]
        python = getattr(args, dest)
        if not os.path.exists(python):
            progress(f"{cls.name} skipped: {python} not found")
            continue
        progress(f"phase: {cls.name} against flowserve optimized")
        peer_reps[cls.name] = measure_side_by_side(
            [cls(python), ours], args.seconds, args.peer_reps or max(2, args.reps // 3)
        )
    ray_reps = [r for rs in peer_reps.values() for r in rs]
    names = [s.name for s in systems]
    by_system = {n: [r[n] for r in reps] for n in names}
    for name, rs in peer_reps.items():
        by_system[name] = [r[name] for r in rs]
        by_system[f"flowserve optimized (beside {name})"] = [r["flowserve optimized"] for r in rs]
    results = {name: _median(rs) for name, rs in by_system.items()}
    # the machine's speed drifts between minutes: compare systems within a rep, where
    # they ran side by side, and report the median of those ratios
    per_rep = [_ratios(r) for r in reps] + [_ratios(r) for r in ray_reps]
    keys = dict.fromkeys(k for pr in per_rep for k in pr)
    ratios = {k: statistics.median(pr[k] for pr in per_rep if k in pr) for k in keys}
    for k, v in ratios.items():
        progress(f"{k}: {v:.2f} (reps: {', '.join(f'{pr[k]:.2f}' for pr in per_rep if k in pr)})")
    save(
        "e2e_ab" if args.baseline else "e2e",
        {
            "baseline": args.baseline,
            "seconds": args.seconds,
            "reps": args.reps,
            "executors": args.executors,
            "results": results,
            "ratios": ratios,
            "ratios_per_rep": per_rep,
            "per_rep": reps,
            "peer_per_rep": peer_reps,
        },
    )
    if not args.baseline:
        _plot(results)
    return results


def _median(rounds: list[dict]) -> dict:
    out = {}
    for key in rounds[0]:
        if key == "plans":
            out[key] = rounds[0][key]
            continue
        out[key] = {m: statistics.median(r[key][m] for r in rounds) for m in ("rps", "p50_ms", "p90_ms", "p99_ms")}
    return out


def _ratios(results: dict) -> dict:
    """Per flow, "A / B" throughput at c=8 and p50 at c=1 for each pair of systems measured."""
    floor, opt = results.get(Floor.name), results.get("flowserve optimized")
    relay = results.get(Relay.name)
    unpolled = results.get("flowserve optimized, busy_poll_ms=0")
    base = next((v for k, v in results.items() if k.startswith("flowserve optimized @ ")), None)
    hand = next(
        (v for k, v in results.items() if k.startswith("flowserve optimized, ") and k.endswith(" executors")), None
    )
    pairs = [
        ("default shape / hand-picked shape", opt, hand, True),
        ("this tree / baseline", opt, base, True),
        ("optimized / floor", opt, floor, True),
        ("two-process floor / floor", relay, floor, True),
        ("optimized / two-process floor", opt, relay, False),
        ("busy polling off / floor", unpolled, floor, True),
        *((f"optimized / {peer.name}", opt, results.get(peer.name), True) for peer in (RayServe, LitServe, BentoML)),
    ]
    out = {}
    for flow in FLOWS:
        for label, a, b, throughput in pairs:
            if a and b:
                if throughput:
                    out[f"{flow}: {label} throughput at c=8"] = a[f"{flow}/c8"]["rps"] / b[f"{flow}/c8"]["rps"]
                out[f"{flow}: {label} p50 at c=1"] = a[f"{flow}/c1"]["p50_ms"] / b[f"{flow}/c1"]["p50_ms"]
    return out


def _plot(results: dict) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    for ax, metric, label in (
        (axes[0], "rps", "throughput at concurrency 8 (req/s)"),
        (axes[1], "p50_ms", "p50 latency at concurrency 1 (ms)"),
    ):
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
