"""The benchmark family: the Ensemble, the Cascade and a lookup pipeline written every way
a user writes them, each cell served by the default deployment and by a floor running the
same user code in one process.

    python -m benchmarks matrix [--quick] [--reps 2] [--seconds 1]

The axes (a cell is one of each):

- pipeline: ``ensemble`` (preprocess, both MLPs, keep the more confident answer),
  ``cascade`` (the big MLP only where the small one is unsure), ``lookup`` (a user's
  vector read from the store by a per-row key, scored against a fixed item matrix);
  the model code is benchmarks/pipelines.py's.
- style: ``row`` (row functions on untyped JSON: no schema) or ``table`` (Table functions
  with ``batching=True`` and a typed schema: a uint8 28x28 tensor, an int).
- stages: 1, 3 or 6. Every pipeline is written as three operators (``lookup``'s middle
  one is the built-in per-row ``lookup``). 1: those three with the default optimizer,
  which fuses them into one stage; 3: the same flow with ``optimize=False`` (one stage
  per operator); 6: each operator followed by a pass-through map of its output columns,
  ``optimize=False``. The stages each deployed plan has are in the results.
- body: JSON or Arrow IPC (``application/vnd.apache.arrow.stream``); answers are JSON.

One row per request. The floor (``floor_app``, one uvicorn process) calls the same user
functions directly, back to back, on rows parsed from the same body: what a user would
write by hand without FlowServe. Not ``flow.run``: that is the reference meaning, with the
per-operator Table machinery a hand-written server does not have, so it would be a slower
floor. Its lookup reads a dict holding the store's contents (an executor's warm cache
holds the same). Per cell and rep: requests/s at c=8, p50 at c=1 (wrk, closed loop), and
CPU seconds per request at c=8 of every process serving it (/proc utime + stime: the
supervisor, gateway, executors and redis-server; the floor's one process). Floor and
deployment alternate cell by cell, rep after rep; ratios are medians of per-rep ratios.

With ``--relay``, the two-process floor too (benchmarks/relay_server.py ``--app matrix``:
an HTTP process relaying the raw body to one worker process that runs the floor's code,
both busy-polling, nothing else): the least a server that keeps user code out of its HTTP
process can do, and FlowServe's ratios to it beside those to the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import numpy as np

from benchmarks.common import ROOT, free_port, plt, progress, save, save_plot, wait_http, wrk
from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess, sample_image

PIPELINES = ("ensemble", "cascade", "lookup")
STYLES = ("row", "table")
STAGES = (1, 3, 6)
BODIES = ("json", "arrow")
ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"
USERS, DIM, ITEMS = 1000, 32, 500
QUICK = {"pipelines": ("ensemble", "lookup"), "styles": STYLES, "stages": (1, 6), "bodies": ("json",)}


# -- the user code: row functions (untyped) -----------------------------------------------


def pre_row(row):
    return preprocess(np.asarray(row.img, dtype=np.uint8))


class ModelsRow:
    def __init__(self):
        self.small, self.big = MLP("small"), MLP("big")

    def __call__(self, row):
        x = row.x[None]
        (ca, pa), (cb, pb) = self.small(x), self.big(x)
        return ca[0].item(), pa[0].item(), cb[0].item(), pb[0].item()


def pick_row(row):
    return pick(row.cls_a, row.conf_a, row.cls_b, row.conf_b)


class SmallRow:
    def __init__(self):
        self.small = MLP("small")

    def __call__(self, row):
        cls, conf = self.small(row.x[None])
        return row.x, cls[0].item(), conf[0].item()


class BigIfUnsureRow:
    def __init__(self):
        self.big = MLP("big")

    def __call__(self, row):
        if row.conf >= CASCADE_THRESHOLD:
            return row.cls, row.conf
        cls, conf = self.big(row.x[None])
        return pick(row.cls, row.conf, cls[0].item(), conf[0].item())


def key_row(row):
    return f"user:{row.user}"


def _items() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((ITEMS, DIM)).astype(np.float32)


class ScoreRow:
    def __init__(self):
        self.items = _items()

    def __call__(self, row):
        scores = self.items @ row.vec
        best = int(np.argmax(scores))
        return best, float(scores[best])


# -- the user code: Table functions (batching=True, typed schema) -------------------------


def pre_table(t):
    return preprocess(t["img"])


class ModelsTable:
    def __init__(self):
        self.small, self.big = MLP("small"), MLP("big")

    def __call__(self, t):
        (ca, pa), (cb, pb) = self.small(t["x"]), self.big(t["x"])
        return ca, pa, cb, pb


def pick_table(t):
    first = t["conf_a"] >= t["conf_b"]
    return np.where(first, t["cls_a"], t["cls_b"]), np.where(first, t["conf_a"], t["conf_b"])


class SmallTable:
    def __init__(self):
        self.small = MLP("small")

    def __call__(self, t):
        cls, conf = self.small(t["x"])
        return t["x"], cls, conf


class BigIfUnsureTable:
    def __init__(self):
        self.big = MLP("big")

    def __call__(self, t):
        cls, conf = np.array(t["cls"], dtype=np.int64), np.array(t["conf"], dtype=np.float64)
        unsure = np.flatnonzero(conf < CASCADE_THRESHOLD)
        if len(unsure):
            c2, p2 = self.big(np.asarray(t["x"])[unsure])
            better = p2 > conf[unsure]
            cls[unsure[better]], conf[unsure[better]] = c2[better], p2[better]
        return cls, conf


def key_table(t):
    return [f"user:{u}" for u in t["user"]]


class ScoreTable:
    def __init__(self):
        self.items = _items()

    def __call__(self, t):
        scores = np.stack(list(t["vec"])) @ self.items.T
        best = np.argmax(scores, axis=1)
        return best.astype(np.int64), scores[np.arange(len(best)), best].astype(np.float64)


# -- pass-through maps (the 6-stage flows) ---------------------------------------------------


def _pass(style: str, cols: tuple[str, ...]):
    """A named module-level no-op of ``style`` returning ``cols`` (executors import it by name)."""
    name = f"pass_{style}_{'_'.join(cols)}"
    if name in globals():
        return globals()[name]
    if style == "row":

        def fn(row):
            out = tuple(getattr(row, c) for c in cols)
            return out if len(out) > 1 else out[0]
    else:

        def fn(t):
            out = tuple(t[c] for c in cols)
            return out if len(out) > 1 else out[0]

    fn.__name__ = fn.__qualname__ = name
    globals()[name] = fn
    return fn


# a pipeline's three operators: ("map", fn, output names) or ("lookup", key column, output name)
STEPS = {
    ("ensemble", "row"): [("map", pre_row, ("x",)), ("map", ModelsRow, ("cls_a", "conf_a", "cls_b", "conf_b")),
                          ("map", pick_row, ("cls", "conf"))],
    ("ensemble", "table"): [("map", pre_table, ("x",)),
                            ("map", ModelsTable, ("cls_a", "conf_a", "cls_b", "conf_b")),
                            ("map", pick_table, ("cls", "conf"))],
    ("cascade", "row"): [("map", pre_row, ("x",)), ("map", SmallRow, ("x", "cls", "conf")),
                         ("map", BigIfUnsureRow, ("cls", "conf"))],
    ("cascade", "table"): [("map", pre_table, ("x",)), ("map", SmallTable, ("x", "cls", "conf")),
                           ("map", BigIfUnsureTable, ("cls", "conf"))],
    ("lookup", "row"): [("map", key_row, ("key",)), ("lookup", "key", "vec"), ("map", ScoreRow, ("item", "score"))],
    ("lookup", "table"): [("map", key_table, ("key",)), ("lookup", "key", "vec"),
                          ("map", ScoreTable, ("item", "score"))],
}  # fmt: skip


def _columns(steps, i: int) -> tuple[str, ...]:
    """The columns after operator ``i`` (a lookup keeps its input's and adds one)."""
    kind, _arg, names = steps[i]
    if kind == "map":
        return names
    return _columns(steps, i - 1) + (names,)


def steps(pipeline: str, style: str, stages: int) -> list:
    """The operators of a cell's flow: the three, or (6 stages) each followed by a pass-through."""
    base = STEPS[(pipeline, style)]
    if stages != 6:
        return base
    out = []
    for i, step in enumerate(base):
        cols = _columns(base, i)
        out += [step, ("map", _pass(style, cols), cols)]
    return out


for (_p, _s), _steps in STEPS.items():  # every pass-through exists at import, on every process
    steps(_p, _s, 6)


def flow_name(pipeline: str, style: str, stages: int) -> str:
    return f"{pipeline}_{style}_{stages}"


def schema(pipeline: str, style: str):
    if style == "row":
        return None
    from flow import ColumnType

    return {"user": int} if pipeline == "lookup" else {"img": ColumnType.tensor(np.uint8, (28, 28))}


def build_flow(pipeline: str, style: str, stages: int):
    from flow import Flow

    flow = Flow(flow_name(pipeline, style, stages), schema=schema(pipeline, style))
    node = flow
    for kind, arg, names in steps(pipeline, style, stages):
        if kind == "lookup":
            node = node.lookup(column=arg, name=names)
        else:
            node = node.map(arg, names=list(names), batching=style == "table")
    return flow


def store_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {f"user:{u}": rng.standard_normal(DIM).astype(np.float32) for u in range(USERS)}


def request_row(pipeline: str) -> dict:
    return {"user": 17} if pipeline == "lookup" else {"img": sample_image().tolist()}


def body(pipeline: str, kind: str) -> bytes:
    row = request_row(pipeline)
    if kind == "json":
        return json.dumps(row).encode()
    import pyarrow as pa

    if pipeline == "lookup":
        table = pa.table({"user": pa.array([row["user"]], pa.int64())})
    else:
        table = pa.table({"img": pa.array([row["img"]], pa.list_(pa.list_(pa.uint8())))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# -- the floor: the same functions called directly, in one process ------------------------


class FloorPipeline:
    """One cell's user code run back to back on a request's rows, as a hand-written server would."""

    def __init__(self, pipeline: str, style: str, stages: int, store: dict):
        self.style, self.store = style, store
        self.steps = [
            (kind, arg() if isinstance(arg, type) else arg, names)
            for kind, arg, names in steps(pipeline, style, stages)
        ]
        self.tensor = None if pipeline == "lookup" else "img"

    def __call__(self, rows: list[dict]) -> list[dict]:
        return self._rows(rows) if self.style == "row" else self._table(rows)

    def _rows(self, rows):
        out = []
        for r in rows:
            state = SimpleNamespace(**r)
            for kind, fn, names in self.steps:
                if kind == "lookup":
                    setattr(state, names, self.store[getattr(state, fn)])
                    continue
                got = fn(state)
                state = SimpleNamespace(**dict(zip(names, got if len(names) > 1 else (got,))))
            out.append(vars(state))
        return out

    def _table(self, rows):
        cols = {k: [r[k] for r in rows] for k in rows[0]}
        cols = {k: np.asarray(v, dtype=np.uint8 if k == self.tensor else None) for k, v in cols.items()}
        for kind, fn, names in self.steps:
            if kind == "lookup":
                cols = {**cols, names: [self.store[k] for k in cols[fn]]}
                continue
            got = fn(cols)
            cols = dict(zip(names, got if len(names) > 1 else (got,)))
        return [{k: _plain(v[i]) for k, v in cols.items()} for i in range(len(rows))]


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray | np.generic) else v


def _parse(raw: bytes, content_type: str) -> list[dict]:
    if content_type.startswith(ARROW):
        import pyarrow as pa

        return pa.ipc.open_stream(raw).read_all().to_pylist()
    doc = json.loads(raw)
    return [doc] if isinstance(doc, dict) else doc


def floor_cells() -> dict[str, FloorPipeline]:
    """Every cell's floor run, by its flow's name (the store's contents in a dict)."""
    store = store_data()
    return {flow_name(p, s, n): FloorPipeline(p, s, n, store) for p in PIPELINES for s in STYLES for n in STAGES}


def run_whole(pipeline: FloorPipeline, rows: list[dict]) -> list[dict]:
    """All of a cell's operators in one process (the floor's code), the rows' values plain
    Python: the floor, the two-process floor, LitServe, BentoML, Ray Serve's 1 stage."""
    return [{k: _plain(v) for k, v in r.items()} for r in pipeline(rows)]


def answer(rows: list[dict]) -> str:
    """The JSON answer every system gives: ``{"rows": [...]}``."""
    return json.dumps({"rows": rows})


def floor_answer(run: FloorPipeline, raw: bytes, content_type: str) -> bytes:
    """The floor's answer to a request body: its rows run, as JSON."""
    return answer(run_whole(run, _parse(raw, content_type))).encode()


def floor_app():
    """The floor's ASGI app, every cell at /flows/<flow name> (``uvicorn --factory``)."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def route(name, run):
        async def answer(request):
            raw = await request.body()
            return Response(floor_answer(run, raw, request.headers.get("content-type", JSON)), media_type=JSON)

        return Route(f"/flows/{name}", answer, methods=["POST"])

    return Starlette(routes=[route(name, run) for name, run in floor_cells().items()])


def run_facts(args, took_s: float) -> dict:
    """What a results file says of its run: the options, how long it took, when."""
    return {
        "quick": args.quick,
        "reps": args.reps,
        "seconds": args.seconds,
        "took_s": round(took_s),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def start_floor() -> tuple[subprocess.Popen, int]:
    """The floor's process (``floor_app`` under uvicorn) and its port."""
    port = free_port()
    floor = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.matrix:floor_app", "--port", str(port)]
        + ["--log-level", "warning"],
        cwd=ROOT,
    )
    return floor, port


def start_two_process_floor() -> tuple[subprocess.Popen, int]:
    """The two-process floor's relay process (benchmarks/relay_server.py ``--app matrix``,
    which starts its worker) and its port."""
    port = free_port()
    relay = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "relay_server.py"), "--port", str(port), "--app", "matrix"],
        cwd=ROOT,
    )
    return relay, port


# -- measuring ---------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (processes that ended count nothing)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        kids = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout.split()
        todo += [int(k) for k in kids]
    return out


def same_answer(ours: str, floor: str, raw: bytes, ctype: str) -> None:
    """The deployment and the floor give the same answer (the floor runs the same code),
    or the benchmark stops: a floor computing something else would be no floor."""
    got = [httpx.post(u, content=raw, headers={"Content-Type": ctype}, timeout=30) for u in (ours, floor)]
    rows = [[{k: v for k, v in r.items() if k != "qid"} for r in a.json()["rows"]] for a in got]
    if len(rows[0]) != len(rows[1]) or any(
        a.keys() != b.keys() or not np.allclose([a[k] for k in a], [b[k] for k in a], rtol=1e-5) for a, b in zip(*rows)
    ):
        raise RuntimeError(f"{ours} answered {rows[0]}, the floor {rows[1]}")


#: a serving process's role, by what its command line runs
ROLES = [
    ("executors.hosts.local_gateway", "gateway"),
    ("executors.worker.executor", "executor"),
    ("executors.hosts.supervisor", "supervisor"),
    ("redis-server", "redis"),
    ("--worker", "worker"),  # relay_server.py's worker (its relay: the line below)
    ("relay_server.py", "relay"),
    ("uvicorn", "floor"),
]


def role(pid: int) -> str:
    """What process ``pid`` is, for the CPU split (``ROLES``); "other" if none matches."""
    try:
        line = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except OSError:
        return "other"
    return next((name for mark, name in ROLES if mark in line), "other")


def measure(url: str, raw: bytes, ctype: str, seconds: float, pids: list[int]) -> dict:
    """Requests/s at c=8, p50 at c=1, and CPU per request at c=8 of ``pids`` in all and by
    role (the gateway, the executors, ...: where the time goes)."""
    before = {pid: cpu_s([pid]) for pid in pids}
    c8 = wrk(url, raw, 8, seconds, content_type=ctype)
    used = {pid: cpu_s([pid]) - t for pid, t in before.items()}
    c1 = wrk(url, raw, 1, seconds, content_type=ctype)
    n = max(1.0, c8["rps"] * max(1, round(seconds)))
    errors = c8["non_2xx"] + c1["non_2xx"]
    if errors:
        raise RuntimeError(f"{url}: {errors} answers were not 2xx")
    by_role: dict[str, float] = {}
    for pid, t in used.items():
        r = role(pid)
        by_role[r] = by_role.get(r, 0.0) + t / n * 1e6
    return {
        "rps_c8": c8["rps"],
        "p50_c1_ms": c1["p50_ms"],
        "cpu_us_per_request": sum(used.values()) / n * 1e6,
        "cpu_us_by_process": by_role,
    }


AXES = {"pipelines": PIPELINES, "styles": STYLES, "stages": STAGES, "bodies": BODIES}


def add_axis_options(p: argparse.ArgumentParser) -> None:
    """``--quick`` and one option per axis (``--pipelines ensemble,lookup``...)."""
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK}")
    for axis, values in AXES.items():
        p.add_argument(f"--{axis}", default=None, help=f"only these, comma-separated (of {','.join(map(str, values))})")


def chosen_axes(p: argparse.ArgumentParser, args) -> dict:
    """The values of each axis the options chose (all, ``--quick``'s, or a slice)."""
    axes = dict(QUICK) if args.quick else dict(AXES)
    for axis, values in AXES.items():
        chosen = getattr(args, axis)
        if chosen is not None:
            picked = tuple(type(values[0])(v) for v in chosen.split(","))
            unknown = [v for v in picked if v not in values]
            if unknown:
                p.error(f"--{axis}: unknown {unknown}; choose among {list(values)}")
            axes[axis] = picked
    return axes


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2, help="reps over every cell (default 2)")
    p.add_argument("--seconds", type=float, default=1.0, help="per wrk measurement, whole seconds (default 1)")
    p.add_argument("--name", default="matrix", help="results file name (default matrix)")
    p.add_argument(
        "--relay",
        action="store_true",
        help="also measure the two-process floor (relay_server.py: raw bodies relayed to one worker process)",
    )
    add_axis_options(p)
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    axes = chosen_axes(p, args)
    cells = [
        (pl, st, n, b)
        for pl in axes["pipelines"]
        for st in axes["styles"]
        for n in axes["stages"]
        for b in axes["bodies"]
    ]
    from executors import LocalCluster

    started = time.monotonic()
    floor, port = start_floor()
    relay, relay_port = start_two_process_floor() if args.relay else (None, None)
    per_rep: list[dict] = []
    plans: dict[str, int] = {}
    try:
        with LocalCluster() as cluster:
            cluster.kvs.mput(store_data())
            urls = {}
            for pl, st, n in dict.fromkeys(c[:3] for c in cells):
                d = cluster.deploy(build_flow(pl, st, n), optimize=n != 3 and n != 6)
                urls[(pl, st, n)] = d.url
                plans[flow_name(pl, st, n)] = len(d.plan.stages) if hasattr(d, "plan") else _stage_count(d)
            systems = {"floor": (floor, port, [floor.pid])}
            if relay is not None:
                systems["two_process"] = (relay, relay_port, process_tree(relay.pid))
            ours_pids = process_tree(cluster.proc.pid)
            progress(f"deployed {len(urls)} flows; stages per plan: {plans}")
            for pl, st, n, b in cells:
                raw, ctype = body(pl, b), ARROW if b == "arrow" else JSON
                ours = urls[(pl, st, n)]
                wait_http(ours, raw, content_type=ctype)
                wrk(ours, raw, 8, 1, content_type=ctype)  # warm: models, caches, connections
                for proc, at, _ in systems.values():
                    url = f"http://127.0.0.1:{at}/flows/{flow_name(pl, st, n)}"
                    wait_http(url, raw, proc=proc, content_type=ctype)
                    wrk(url, raw, 8, 1, content_type=ctype)
                    same_answer(ours, url, raw, ctype)
            if relay is not None:  # its worker is up once the relay has answered: count it too
                systems["two_process"] = (relay, relay_port, process_tree(relay.pid))
            for rep in range(args.reps):
                figures = {}
                for pl, st, n, b in cells:
                    raw, ctype = body(pl, b), ARROW if b == "arrow" else JSON
                    name = f"{pl}/{st}/{n}/{b}"
                    figures[name] = {
                        who: measure(
                            f"http://127.0.0.1:{at}/flows/{flow_name(pl, st, n)}", raw, ctype, args.seconds, pids
                        )
                        for who, (_, at, pids) in systems.items()
                    }
                    figures[name]["flowserve"] = measure(urls[(pl, st, n)], raw, ctype, args.seconds, ours_pids)
                per_rep.append(figures)
                progress(f"rep {rep + 1} of {args.reps} done ({time.monotonic() - started:.0f} s)")
    finally:
        for proc in (floor, relay):
            if proc is not None:
                proc.terminate()
                proc.wait()
    return report(per_rep, plans, args, time.monotonic() - started)


def _stage_count(deployment) -> int:
    text = deployment.explain()
    return int(text.split("(", 1)[1].split(" stage", 1)[0])


def ratios(figures: dict, to: str = "floor", of: str = "flowserve") -> dict:
    """``of``'s figures over ``to``'s in one rep of one cell."""
    ours, floor = figures[of], figures[to]
    return {
        "throughput_c8": ours["rps_c8"] / floor["rps_c8"],
        "p50_c1": ours["p50_c1_ms"] / floor["p50_c1_ms"],
        "cpu": ours["cpu_us_per_request"] / floor["cpu_us_per_request"],
    }


METRICS = ("throughput_c8", "p50_c1", "cpu")


def _medians(figures: list[dict]) -> dict:
    """Each figure's median over reps (a dict of figures: each of its figures')."""
    return {
        k: _medians([f[k] for f in figures]) if isinstance(v, dict) else statistics.median(f[k] for f in figures)
        for k, v in figures[0].items()
    }


def _summary(cells: dict, key: str) -> tuple[dict, dict]:
    """The median cell and the worst cell of each ratio under ``cells[name][key]``."""
    median = {m: statistics.median(c[key][m] for c in cells.values()) for m in METRICS}
    worst = {
        "throughput_c8": min(cells, key=lambda c: cells[c][key]["throughput_c8"]),
        "p50_c1": max(cells, key=lambda c: cells[c][key]["p50_c1"]),
        "cpu": max(cells, key=lambda c: cells[c][key]["cpu"]),
    }
    return median, {m: {"cell": worst[m], "ratio": cells[worst[m]][key][m]} for m in METRICS}


def report(per_rep: list[dict], plans: dict, args, took_s: float) -> dict:
    cells: dict = {}
    relayed = "two_process" in per_rep[0][next(iter(per_rep[0]))]
    for name in per_rep[0]:
        reps = [r[name] for r in per_rep]
        cells[name] = {who: _medians([r[who] for r in reps]) for who in reps[0]}
        pairs = [("floor", "flowserve", "ratios")]
        if relayed:  # FlowServe against the two-process floor, and that against the floor
            pairs += [
                ("two_process", "flowserve", "ratios_two_process"),
                ("floor", "two_process", "two_process_vs_floor"),
            ]
        for to, of, key in pairs:
            rs = [ratios(r, to, of) for r in reps]
            cells[name][key] = {m: statistics.median(r[m] for r in rs) for m in METRICS}
    median, worst = _summary(cells, "ratios")
    for name, c in cells.items():
        r = c["ratios"]
        progress(
            f"{name:24s} c=8 {c['flowserve']['rps_c8']:6.0f} vs {c['floor']['rps_c8']:6.0f} req/s "
            f"({r['throughput_c8']:.2f}x); c=1 p50 {c['flowserve']['p50_c1_ms']:.3f} vs "
            f"{c['floor']['p50_c1_ms']:.3f} ms ({r['p50_c1']:.2f}x); CPU {c['flowserve']['cpu_us_per_request']:.0f}"
            f" vs {c['floor']['cpu_us_per_request']:.0f} us ({r['cpu']:.2f}x)"
        )
    for m in METRICS:
        progress(f"{m}: median cell {median[m]:.2f}x; worst {worst[m]['cell']} {worst[m]['ratio']:.2f}x")
    out = {
        **run_facts(args, took_s),
        "stages_per_plan": plans,
        "median_ratio": median,
        "worst": worst,
    }
    if relayed:
        out["two_process"] = {
            "vs_floor": dict(zip(("median_ratio", "worst"), _summary(cells, "two_process_vs_floor"))),
            "flowserve_vs_it": dict(zip(("median_ratio", "worst"), _summary(cells, "ratios_two_process"))),
        }
        for what, s in out["two_process"].items():
            for m in METRICS:
                progress(
                    f"two-process floor, {what}: {m} median {s['median_ratio'][m]:.2f}x; worst {s['worst'][m]['cell']} {s['worst'][m]['ratio']:.2f}x"
                )
    out["cells"], out["per_rep"] = cells, per_rep
    save(args.name, out)
    _plot(cells, args.name)
    return out


def _plot(cells: dict, name: str) -> None:
    pyplot = plt()
    rows = list(dict.fromkeys(n.rsplit("/", 2)[0] + "/" + n.rsplit("/", 1)[1] for n in cells))
    stages = sorted({int(n.split("/")[2]) for n in cells})
    fig, axes = pyplot.subplots(1, 3, figsize=(13, 1.2 + 0.42 * len(rows)))
    titles = {"throughput_c8": "req/s at c=8 / floor", "p50_c1": "p50 at c=1 / floor", "cpu": "CPU per request / floor"}
    for ax, (metric, title) in zip(axes, titles.items()):
        grid = np.full((len(rows), len(stages)), np.nan)
        for n, c in cells.items():
            pl, st, k, b = n.split("/")
            grid[rows.index(f"{pl}/{st}/{b}"), stages.index(int(k))] = c["ratios"][metric]
        good_high = metric == "throughput_c8"
        ax.imshow(np.log(grid), cmap="RdYlGn" if good_high else "RdYlGn_r", vmin=-1, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(stages)), [f"{k} stages" for k in stages])
        ax.set_yticks(range(len(rows)), rows if ax is axes[0] else [""] * len(rows))
        ax.set_title(title, fontsize=10)
    save_plot(fig, name)


if __name__ == "__main__":
    run()
