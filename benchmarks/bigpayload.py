"""A 10 MB payload through a fused 10-stage chain over HTTP, against a bare HTTP echo of
the same bytes on the same server stack: ``python -m benchmarks bigpayload``.

The flow is 10 no-op maps fused into one stage (the fusion benchmark's chain); the body is
one float32 tensor row as an Arrow IPC stream, answered as Arrow. Three systems up at
once, measured in interleaved rounds from one bare keep-alive client (client.py):

- ``echo``: benchmarks/echo_server.py under uvicorn with httptools and uvloop (what our
  gateway runs on), reading the body and sending it back (joined into one ``bytes``);
- ``echo, unjoined``: the same, the body's pieces sent back as they came (no copy);
- ``flowserve``: the local cluster (1 executor), shared memory on (executors/wire/shm.py);
- ``flowserve, shm off``: the same with every frame through the socket (a cluster started
  with FLOWSERVE_SHM_MIN_BYTES set out of reach).

Requests alternate between the systems one by one (the order rotating), ``-n`` each per
round; medians over rounds of each round's p50, ratios to the echo per round.
``--baseline TREE`` adds the same cluster run from another checkout (an A/B of a change).
Writes benchmarks/results/bigpayload.json (``--out`` another name).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys

import numpy as np

from benchmarks.common import ROOT, free_port, progress, save
from benchmarks.fusion import arrow_body, chain_flow, post_arrow, stats


def _cluster_at(tree: str, max_body: int):
    """A 1-executor cluster run from another checkout (an A/B, as e2e's ``--baseline``),
    the chain deployed by that tree's own client: (cluster, url)."""
    from benchmarks.e2e import _Sent
    from executors import ClusterConfig, LocalCluster

    config = ClusterConfig(executors=1, max_body_bytes=max_body)
    here = os.getcwd()
    os.chdir(tree)  # LocalCluster puts the cwd first on its processes' PYTHONPATH
    try:
        cluster = LocalCluster(config)
        cluster.config = _Sent(config, {"executors": 1, "max_body_bytes": max_body})
        cluster.start()
    finally:
        os.chdir(here)
    deploy = (
        "import sys\n"
        "from benchmarks.fusion import chain_flow\n"
        "from executors.hosts.cluster import LocalCluster\n"
        "c = LocalCluster.connect(sys.argv[1])\n"
        "print(c.deploy(chain_flow(10, 'fused', False), optimize=True).url)\n"
    )
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, "-c", deploy, str(cluster.dir)], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return cluster, out.stdout.strip().splitlines()[-1]


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks bigpayload", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=15, help="requests per system and round")
    p.add_argument("--baseline", help="also a cluster run from this checkout (e.g. the previous commit): an A/B")
    p.add_argument("--out", default="bigpayload", help="results file name (benchmarks/results/NAME.json)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from benchmarks.client import BareClient
    from executors import ClusterConfig, LocalCluster

    body = arrow_body(
        {"x": np.random.default_rng(0).standard_normal((1, int(args.mb * (1 << 20)) // 4)).astype(np.float32)}
    )
    port = free_port()
    echo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.echo_server:app",
            "--port",
            str(port),
            "--http",
            "httptools",
            "--loop",
            "uvloop",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    clusters = []
    urls = {"echo": f"http://127.0.0.1:{port}/echo", "echo, unjoined": f"http://127.0.0.1:{port}/pieces"}
    try:
        for name, env in (("flowserve", None), ("flowserve, shm off", str(1 << 62))):
            if env is not None:
                os.environ["FLOWSERVE_SHM_MIN_BYTES"] = env
            else:
                os.environ.pop("FLOWSERVE_SHM_MIN_BYTES", None)
            c = LocalCluster(ClusterConfig(executors=1, max_body_bytes=64 << 20)).start()
            clusters.append(c)
            urls[name] = c.deploy(chain_flow(10, "fused", False), optimize=True).url
        os.environ.pop("FLOWSERVE_SHM_MIN_BYTES", None)
        if args.baseline:
            c, url = _cluster_at(os.path.abspath(args.baseline), 64 << 20)
            clusters.append(c)
            urls[f"flowserve @ {os.path.basename(os.path.abspath(args.baseline))}"] = url
        samples = {k: [] for k in urls}
        with contextlib.ExitStack() as stack:
            from benchmarks.common import wait_http

            wait_http(urls["echo"], b"{}")
            http = {k: stack.enter_context(BareClient(timeout=120)) for k in urls}  # one origin each
            for name, url in urls.items():
                for _ in range(3):
                    post_arrow(http[name], url, body)
            for r in range(args.rounds):
                # request by request in turn (the order rotating), so a stall of the shared
                # machine falls on every system alike
                got = {k: [] for k in urls}
                names = list(urls)
                for i in range(args.n):
                    for name in names[i % len(names) :] + names[: i % len(names)]:
                        got[name].append(post_arrow(http[name], urls[name], body))
                for name in urls:
                    samples[name].append(stats(got[name]))
                progress(
                    f"round {r + 1}: " + ", ".join(f"{k} p50 {v[-1]['p50_ms']:.2f} ms" for k, v in samples.items())
                )
    finally:
        for c in clusters:
            c.stop()
        echo.terminate()
        echo.wait()
    p50 = {k: statistics.median(s["p50_ms"] for s in v) for k, v in samples.items()}
    ratios, unjoined = (
        {
            k: statistics.median(a["p50_ms"] / e["p50_ms"] for a, e in zip(v, samples[ref]))
            for k, v in samples.items()
            if not k.startswith("echo")
        }
        for ref in ("echo", "echo, unjoined")
    )
    gateway = {k: statistics.median(s["server_p50_ms"] for s in v) for k, v in samples.items() if k in ratios}
    progress(f"p50 ms: {p50}; / echo: {ratios}; / echo unjoined: {unjoined}; in the gateway: {gateway}")
    out = {
        "mb": args.mb,
        "rounds": args.rounds,
        "n": args.n,
        "baseline": args.baseline,
        "p50_ms": p50,
        "ratio_to_echo": ratios,
        "ratio_to_echo_unjoined": unjoined,
        "gateway_p50_ms": gateway,
        "per_round": samples,
    }
    save(args.out, out)
    plot(out, args.out)
    return ratios


def plot(out: dict, name: str = "bigpayload") -> None:
    """Each round's p50 per system (points) and their median (bars)."""
    from benchmarks.common import plt, save_plot

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(8, 3.8))
    names = list(out["per_round"])
    for i, k in enumerate(names):
        values = [r["p50_ms"] for r in out["per_round"][k]]
        ax.bar(i, statistics.median(values), color=f"C{i}", alpha=0.6)
        ax.scatter([i] * len(values), values, color="black", s=8, zorder=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([k.replace(", ", "\n") for k in names], fontsize=8)
    ax.set_ylabel("p50 over HTTP (ms)\nbar: median, dots: rounds")
    ratio = out["ratio_to_echo"].get("flowserve", float("nan"))
    unjoined = out.get("ratio_to_echo_unjoined", {}).get("flowserve", float("nan"))
    ax.set_title(
        f"fused 10-stage chain, {out['mb']:g} MiB Arrow body: flowserve {ratio:.2f}x the echo, "
        f"{unjoined:.2f}x the unjoined echo",
        fontsize=9,
    )
    save_plot(fig, name)


if __name__ == "__main__":
    run()
