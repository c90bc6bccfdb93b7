"""The ``matrix`` cells on Ray Serve, LitServe and BentoML beside FlowServe's default
deployment and the in-process floor: FlowServe / peer per cell, c=8 and c=1.

    python -m benchmarks matrix_peers [--quick] [--reps 2] [--seconds 1] [--peers ray,litserve,bentoml]

Every system runs the same user code (benchmarks/matrix.py's steps; the lookup's store is an
in-process dict holding the store's contents, as in the floor), parses the same JSON or
Arrow IPC body and answers JSON ``{"rows": [...]}``:

- Ray Serve (``ray_matrix_server.py``): an HTTP ingress deployment parses the body; for 1
  stage it runs all the cell's operators itself (``FloorPipeline``), for 3 and 6 stages it
  calls one deployment per operator in turn through DeploymentHandles (``Operator``), the
  request's state passed between them (rows, or numpy columns in the table style).
- LitServe (``litserve_matrix_server.py``) and BentoML (``bentoml_matrix_server.py``) do not
  compose separately scaled stages: each runs all of a cell's operators in one service
  (``FloorPipeline``), one LitAPI / one BentoML route per cell. No peer batches.

Each peer is measured in a phase of its own beside FlowServe, as ``e2e`` does: a peer's
idle processes (Ray's cluster above all) would otherwise share the 2 cores with the others'
measurements. The floor is measured in the first phase. Per cell, every system of the phase
must answer the floor's rows first; then, in rounds, each is measured in turn (requests/s at
c=8, p50 at c=1, wrk, the order rotating round by round). Ratios are FlowServe / system,
medians of per-round ratios taken within the phase. FlowServe serves every selected cell for
the whole run, LitServe and BentoML for their phase; Ray Serve serves one cell's flow at a
time (its replicas' processes, 1 to 7 a cell, would crowd 2 cores if all were up).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.common import ROOT, free_port, plt, progress, save, save_plot, wait_http, wrk
from benchmarks.matrix import (
    ARROW,
    JSON,
    _medians,
    _plain,
    add_axis_options,
    body,
    build_flow,
    chosen_axes,
    flow_name,
    measure,
    process_tree,
    run_facts,
    same_answer,
    start_floor,
    steps,
    store_data,
)

SYSTEMS = ("floor", "ray", "litserve", "bentoml")  # what FlowServe is compared with
METRICS = ("throughput_c8", "p50_c1")

# -- the peer-side code: what the peer servers call (no peer imported here) ----------------


def tensor_column(pipeline: str) -> str | None:
    return None if pipeline == "lookup" else "img"


def start_state(style: str, tensor: str | None, rows: list[dict]):
    """A request's state before its first operator: its rows, or (table style) numpy columns
    built as ``FloorPipeline`` builds them."""
    if style == "row":
        return rows
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    return {k: np.asarray(v, dtype=np.uint8 if k == tensor else None) for k, v in cols.items()}


def final_rows(style: str, state) -> list[dict]:
    """A request's answer rows, plain values, from its state after the last operator."""
    if style == "row":
        return [{k: _plain(v) for k, v in r.items()} for r in state]
    n = len(next(iter(state.values())))
    return [{k: _plain(v[i]) for k, v in state.items()} for i in range(n)]


class Operator:
    """Operator ``index`` of a cell's flow, alone: what one Ray Serve deployment of a 3- or
    6-stage cell runs on a request's state (rows as dicts, or numpy columns)."""

    def __init__(self, pipeline: str, style: str, stages: int, index: int):
        self.kind, arg, self.names = steps(pipeline, style, stages)[index]
        self.style = style
        self.fn = arg() if isinstance(arg, type) else arg  # a lookup's arg: its key column
        self.store = store_data() if self.kind == "lookup" else {}

    def __call__(self, state):
        if self.style == "row":
            return [self._row(r) for r in state]
        if self.kind == "lookup":
            return {**state, self.names: [self.store[k] for k in state[self.fn]]}
        return self._named(self.fn(state))

    def _row(self, row: dict) -> dict:
        if self.kind == "lookup":
            return {**row, self.names: self.store[row[self.fn]]}
        return self._named(self.fn(SimpleNamespace(**row)))

    def _named(self, got) -> dict:
        return dict(zip(self.names, got if len(self.names) > 1 else (got,)))


def operator_chain(pipeline: str, style: str, stages: int) -> list[Operator]:
    return [Operator(pipeline, style, stages, i) for i in range(len(steps(pipeline, style, stages)))]


def run_chain(pipeline: str, style: str, operators: list[Operator], rows: list[dict]) -> list[dict]:
    """``rows`` through ``operators`` in turn, as Ray Serve's ingress passes them from handle to handle."""
    state = start_state(style, tensor_column(pipeline), rows)
    for op in operators:
        state = op(state)
    return final_rows(style, state)


def parse_cells(text: str) -> list[tuple[str, str, int]]:
    """``pipeline/style/stages,...`` (how the driver tells a peer server which cells to serve)."""
    out = []
    for part in text.split(","):
        pl, st, n = part.split("/")
        out.append((pl, st, int(n)))
    return out


def format_cells(cells) -> str:
    return ",".join(f"{pl}/{st}/{n}" for pl, st, n in cells)


# -- the peers as child processes ------------------------------------------------------------


class _Peer:
    """A peer's server: a child process in a session of its own, ended with every process it started."""

    name = ""
    proc: subprocess.Popen
    port: int

    def __init__(self, python: str, cells: list[tuple[str, str, int]]):
        self.python, self.cells = python, cells
        self.seen: set[int] = set()

    def url(self, cell: tuple[str, str, int], kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/flows/{flow_name(*cell)}"

    def pids(self) -> list[int]:
        """The processes serving now (remembered, to end them all at the end)."""
        tree = process_tree(self.proc.pid)
        self.seen.update(tree)
        return tree

    def _start(self, cmd: list[str], env: dict | None = None, **kw) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), BENTOML_DO_NOT_TRACK="true", **(env or {}))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, **kw)

    def stop(self) -> None:
        if getattr(self, "proc", None) is None:
            return  # never started
        self.seen.update(process_tree(self.proc.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _kill_left(self.seen, self.proc.pid)


def _kill_left(pids: set[int], session: int) -> None:
    """SIGKILL what is left of ``pids`` (processes this benchmark started) still in ``session``."""
    deadline = time.monotonic() + 10
    while True:
        alive = [p for p in pids if _session(p) == session]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _session(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[4])
    except (OSError, IndexError, ValueError):
        return None


class RayServe(_Peer):
    """``ray_matrix_server.py``: one Ray cluster for the run, a cell's flow deployed while it is measured."""

    name = "ray"

    def start(self) -> None:
        self.port = free_port()
        self._start(
            [self.python, str(ROOT / "benchmarks" / "ray_matrix_server.py"), "--port", str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._expect("READY")

    def _expect(self, word: str) -> None:
        for line in self.proc.stdout or ():
            if line.startswith(word):
                self.pids()
                return
            if line.startswith("ERROR"):
                raise RuntimeError(f"ray serve: {line.strip()}")
        raise RuntimeError(f"ray serve exited with {self.proc.wait()}")

    def _say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def deploy(self, cell: tuple[str, str, int]) -> None:
        self._say("deploy " + format_cells([cell]))
        self._expect("DEPLOYED")

    def delete(self, cell: tuple[str, str, int]) -> None:
        self._say("delete " + format_cells([cell]))
        self._expect("DELETED")

    def stop(self) -> None:
        if getattr(self, "proc", None) is None:
            return
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            self.pids()
            self._say("quit")  # serve.shutdown() and ray.shutdown() end Ray's own processes
            self.proc.wait(timeout=60)
        super().stop()


class LitServe(_Peer):
    """``litserve_matrix_server.py``: one LitServer, a LitAPI (and its inference worker) per cell."""

    name = "litserve"

    def start(self) -> None:
        self.port = free_port()
        self._start(
            [self.python, str(ROOT / "benchmarks" / "litserve_matrix_server.py"), "--port", str(self.port)]
            + ["--cells", format_cells(self.cells)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for line in self.proc.stdout or ():
            if line.startswith("READY"):
                break
        else:
            raise RuntimeError(f"litserve exited with {self.proc.wait()}")


class BentoML(_Peer):
    """``bentoml_matrix_server.py``: one service, a JSON API route per cell and, for Arrow
    bodies (which BentoML's API routes do not take), a route per cell on a mounted FastAPI app."""

    name = "bentoml"

    def start(self) -> None:
        self.port = free_port()
        bentoml = str(Path(self.python).parent / "bentoml")
        self._start(
            [bentoml, "serve", "benchmarks.bentoml_matrix_server:Cells", "--port", str(self.port)]
            + ["--host", "127.0.0.1"],
            env={"MATRIX_CELLS": format_cells(self.cells)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def url(self, cell: tuple[str, str, int], kind: str) -> str:
        prefix = "/arrow" if kind == "arrow" else ""
        return f"http://127.0.0.1:{self.port}{prefix}/flows/{flow_name(*cell)}"


PEER_CLASSES = {"ray": RayServe, "litserve": LitServe, "bentoml": BentoML}


# -- the run ------------------------------------------------------------------------------------


def _args(argv):
    from benchmarks.e2e import PEERS, add_peer_options

    p = argparse.ArgumentParser(prog="python -m benchmarks matrix_peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2, help="rounds over every system, per cell (default 2)")
    p.add_argument("--seconds", type=float, default=1.0, help="per wrk measurement, whole seconds (default 1)")
    p.add_argument("--name", default="matrix_peers", help="results file name (default matrix_peers)")
    add_axis_options(p)
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="peers to measure, each in a phase of its own beside FlowServe (default: all; '' for none)",
    )
    add_peer_options(p)
    args = p.parse_args(argv)
    axes = chosen_axes(p, args)
    peers = [x for x in args.peers.split(",") if x]
    unknown = [x for x in peers if x not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {unknown}; choose among {list(PEERS)}")
    args.peer_list = []
    for peer in peers:
        python = getattr(args, PEERS[peer][1])
        if os.path.exists(python):
            args.peer_list.append((peer, python))
        else:
            progress(f"{peer} skipped: {python} not found")
    return args, axes


def run(argv=None) -> dict:
    args, axes = _args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    groups = [(pl, st, n) for pl in axes["pipelines"] for st in axes["styles"] for n in axes["stages"]]
    bodies = list(axes["bodies"])
    from executors import LocalCluster

    started = time.monotonic()
    floor, floor_port = start_floor()
    phases = [PEER_CLASSES[name](python, groups) for name, python in args.peer_list] or [None]
    per_round: dict[str, list[dict]] = {}
    plans: dict[str, int] = {}
    try:
        with LocalCluster() as cluster:
            with contextlib.ExitStack() as stack:  # the first peer starts while FlowServe deploys
                if phases[0] is not None:
                    stack.callback(phases[0].stop)
                    phases[0].start()
                cluster.kvs.mput(store_data())
                ours = {}
                for cell in groups:
                    d = cluster.deploy(build_flow(*cell), optimize=cell[2] == 1)
                    ours[cell] = d.url
                    plans[flow_name(*cell)] = len(d.plan.stages)
                ours_pids = process_tree(cluster.proc.pid)
                progress(f"deployed {len(ours)} flows; stages per plan: {plans} ({time.monotonic() - started:.0f} s)")
                stack.pop_all()
            urls = {
                "floor": lambda cell, kind: f"http://127.0.0.1:{floor_port}/flows/{flow_name(*cell)}",
                "flowserve": lambda cell, kind: ours[cell],
            }
            pids = {"floor": lambda: [floor.pid], "flowserve": lambda: ours_pids}
            for i, peer in enumerate(phases):
                with contextlib.ExitStack() as stack:
                    if peer is not None:
                        stack.callback(peer.stop)
                        if i > 0:
                            peer.start()
                    progress(f"phase {i + 1}: flowserve{', floor' if i == 0 else ''}{', ' + peer.name if peer else ''}")
                    _phase(groups, bodies, peer, urls, pids, i == 0, args, floor, per_round, started)
    finally:
        floor.terminate()
        floor.wait()
    return report(per_round, plans, [x.name for x in phases if x is not None], args, time.monotonic() - started)


def _phase(groups, bodies, peer, urls, pids, with_floor: bool, args, floor, per_round: dict, started: float) -> None:
    """Every cell with FlowServe and ``peer`` (and the floor in the first phase); rounds appended to ``per_round``."""
    here = {who: urls[who] for who in (["floor"] if with_floor else []) + ["flowserve"]}
    procs = {who: pids[who] for who in here}
    if peer is not None:
        here[peer.name], procs[peer.name] = peer.url, peer.pids
    for cell in groups:
        if isinstance(peer, RayServe):
            peer.deploy(cell)
        for kind in bodies:
            for name, rounds in _cell(cell, kind, here, procs, urls["floor"], args, floor).items():
                per_round.setdefault(name, []).extend(rounds)
        if isinstance(peer, RayServe):
            peer.delete(cell)
        progress(f"{flow_name(*cell)} done ({time.monotonic() - started:.0f} s)")


def _cell(cell, kind: str, urls: dict, pids: dict, floor_at, args, floor) -> dict:
    """One cell: every system answers the floor's rows, then ``args.reps`` rounds over all."""
    raw, ctype = body(cell[0], kind), ARROW if kind == "arrow" else JSON
    name = f"{cell[0]}/{cell[1]}/{cell[2]}/{kind}"
    floor_url = floor_at(cell, kind)
    for who, url in urls.items():
        wait_http(url(cell, kind), raw, proc=floor if who == "floor" else None, content_type=ctype)
        wrk(url(cell, kind), raw, 8, 1, content_type=ctype)  # warm: models, caches, connections
        if who != "floor":
            same_answer(url(cell, kind), floor_url, raw, ctype)
    rounds = []
    order = list(urls)
    for r in range(args.reps):
        turn = order[r % len(order) :] + order[: r % len(order)]
        rounds.append({who: measure(urls[who](cell, kind), raw, ctype, args.seconds, pids[who]()) for who in turn})
    figures = rounds[-1]
    progress(
        f"{name:24s} "
        + ", ".join(f"{who} {f['rps_c8']:.0f} req/s, {f['p50_c1_ms']:.2f} ms" for who, f in figures.items())
    )
    return {name: rounds}


def ratios(figures: dict) -> dict:
    """FlowServe / each other system in one round: throughput at c=8, p50 at c=1."""
    ours = figures["flowserve"]
    return {
        who: {
            "throughput_c8": ours["rps_c8"] / f["rps_c8"],
            "p50_c1": ours["p50_c1_ms"] / f["p50_c1_ms"],
        }
        for who, f in figures.items()
        if who != "flowserve"
    }


def report(per_round: dict, plans: dict, peers: list[str], args, took_s: float) -> dict:
    cells: dict = {}
    for name, rounds in per_round.items():
        rs = [ratios(r) for r in rounds]
        systems = list(dict.fromkeys(who for r in rounds for who in r))  # a peer appears in its phase's rounds
        cells[name] = {
            "figures": {who: _medians([r[who] for r in rounds if who in r]) for who in systems},
            "ratios": {
                who: {m: statistics.median(r[who][m] for r in rs if who in r) for m in METRICS}
                for who in systems
                if who != "flowserve"
            },
        }
    summary: dict = {}
    for who in ["floor", *peers]:
        summary[who] = {}
        for m in METRICS:
            values = {n: c["ratios"][who][m] for n, c in cells.items()}
            worst = (min if m == "throughput_c8" else max)(values, key=lambda n: values[n])
            behind = sorted(n for n, v in values.items() if (v < 1.0 if m == "throughput_c8" else v > 1.0))
            summary[who][m] = {
                "median": statistics.median(values.values()),
                "worst": {"cell": worst, "ratio": values[worst]},
                "cells_behind": behind,
            }
            progress(
                f"FlowServe / {who} {m}: median {summary[who][m]['median']:.2f}x, worst {worst} {values[worst]:.2f}x; "
                f"behind in {len(behind)} of {len(values)}"
            )
    out = {
        **run_facts(args, took_s),
        "peers": peers,
        "stages_per_plan": plans,
        "summary": summary,
        "cells": cells,
        "per_round": per_round,
    }
    save(args.name, out)
    _plot(cells, ["floor", *peers], args.name)
    return out


def _plot(cells: dict, systems: list[str], name: str) -> None:
    pyplot = plt()
    names = list(cells)
    fig, axes = pyplot.subplots(2, 1, figsize=(max(8, 0.32 * len(names) + 2), 8), sharex=True)
    titles = {
        "throughput_c8": "FlowServe / system, req/s at c=8 (above 1: FlowServe ahead)",
        "p50_c1": "FlowServe / system, p50 at c=1 (below 1: FlowServe ahead)",
    }
    x = np.arange(len(names))
    for ax, (metric, title) in zip(axes, titles.items()):
        for i, who in enumerate(systems):
            ax.scatter(x + (i - (len(systems) - 1) / 2) * 0.15, [cells[n]["ratios"][who][metric] for n in names],
                       s=14, label=who, marker="s" if who == "floor" else "o")  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, ncol=len(systems))
    axes[1].set_xticks(x, names, rotation=90, fontsize=7)
    save_plot(fig, name)


if __name__ == "__main__":
    run()
