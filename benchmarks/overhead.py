"""Where a request's time goes besides the model: the e2e Ensemble's per-request CPU, per
process, side by side with the floor; and the pieces of the gateway's and the executor's
work timed in a hot loop.

    python -m benchmarks overhead [--seconds 3] [--reps 4] [--busy-poll-ms 0] [--baseline TREE]

Part 1 (in-process, one process, a hot loop, min of 9 reps): parsing the JSON body, the
input Table, the run message out and the answer back (encode + decode), the answer's JSON,
and the fused stage against its operators' own code called back to back (what the floor
runs) -- the Table machinery between operators is the difference -- and against the generic
per-operator loop (``executors.worker.fused`` off: the stage as it ran before its compiled chain).

Part 2 (processes): the floor (one uvicorn process), FlowServe in its default shape (and
``--baseline``: the same from another checkout), all up at once; wrk at concurrency 1 and 8
alternates between them rep after rep. Per request: the CPU seconds each process spent
(user + system, from /proc), requests/s and p50. Busy polling is off by default here
(``--busy-poll-ms 0``): a polling process's CPU time counts its polls, not its work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import timeit

import numpy as np

from benchmarks.common import progress, save, wait_http, wrk
from benchmarks.e2e import Floor, Ours, OursAt, ensemble_flow, pick_row, preprocess_table
from benchmarks.pipelines import sample_image

_TICK = os.sysconf("SC_CLK_TCK")


def _hot(fn, n: int) -> float:
    """us per call: the min over 9 reps of ``n`` calls (the least disturbed)."""
    return min(timeit.repeat(fn, number=n, repeat=9)) / n * 1e6


def in_process() -> dict:
    import time as clock

    import torch

    from executors.codec.bodies import input_table, json_rows, parse_body
    from executors.wire.messages import Result, StageInput, decode
    from executors.worker import fused
    from executors.worker.stage_runner import BoundStage
    from optimizer import optimize

    torch.set_num_threads(1)
    body = json.dumps({"img": sample_image().tolist()}).encode()
    plan = optimize(ensemble_flow())
    schema, sink = plan.input_schema, plan.sink
    rows = parse_body(body, "application/json", schema)
    qids = np.arange(1, 2, dtype=np.int64)
    table = input_table("ensemble", rows, qids, schema)
    routes = {s: ["ipc:///tmp/x/e0.ipc"] for s in plan.stages}

    def run_message():
        return StageInput(
            1, 0, "ensemble", 1, sink, "@input", routes, "ipc:///tmp/x/gw.ipc", clock.time() + 30, table=table
        ).encode()

    bound = BoundStage(plan.stages[sink])
    with torch.inference_mode():
        out = bound([table])
        trace = [[sink, "cpu0", 0.5, 1]]
        answer = Result(1, 0, (), trace, out).encode()
        frames = run_message()
        small, big = (b.call for b in bound.bound[1:3])
        parts: dict = {}
        for node, op in zip(plan.stages[sink].nodes, bound.bound):
            parts[node.name] = op([table if i.startswith("@") else parts[i] for i in node.inputs])
        joined = next(iter(parts[plan.stages[sink].nodes[3].name].rows()))

        def operators_alone():  # the operators' own code, as the floor runs it
            pre = {"img": preprocess_table(table)}
            small(pre), big(pre)
            return pick_row(joined)

        figures = {
            "gateway: parse the JSON body (28x28 uint8 tensor)": _hot(
                lambda: parse_body(body, "application/json", schema), 2000
            ),
            "gateway: the input Table (checked against the schema)": _hot(
                lambda: input_table("ensemble", rows, qids, schema), 2000
            ),
            "gateway: the run message, built and encoded": _hot(run_message, 2000),
            "executor: the run message decoded": _hot(lambda: decode(frames), 2000),
            "executor: the answer message, built and encoded": _hot(
                lambda: Result(1, 0, (), trace, out).encode(), 2000
            ),
            "gateway: the answer message decoded": _hot(lambda: decode(answer), 2000),
            "gateway: the answer's JSON": _hot(lambda: json_rows(out), 2000),
        }

        def generic_loop():  # the stage as the generic per-operator loop runs it (before fused.py)
            fused.ENABLED = False
            try:
                return bound([table])
            finally:
                fused.ENABLED = True

        stage, alone, generic = [], [], []
        for _ in range(9):  # interleaved: the machine's drift hits them alike
            stage.append(_hot(lambda: bound([table]), 100))
            alone.append(_hot(operators_alone, 100))
            generic.append(_hot(generic_loop, 100))
    figures["executor: the fused stage, generic per-operator loop (before executors/worker/fused.py)"] = min(generic)
    figures["executor: the fused stage (5 operators)"] = min(stage)
    figures["executor: its operators' own code back to back (the floor's work)"] = min(alone)
    figures["executor: the stage's Table machinery (difference)"] = min(stage) - min(alone)
    return figures


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except OSError:
        return ""


def _processes(system) -> dict[str, int]:
    """name -> pid of the processes serving ``system`` (gateway and executors, or the floor)."""
    if isinstance(system, Floor):
        return {"floor": system.proc.pid}
    daemon = system.cluster.proc.pid
    out = {"gateway": daemon}
    for child in _children(daemon):
        cmd = _cmdline(child)
        if "executors.worker.executor" in cmd:
            out[f"executor {cmd.split('--id ', 1)[1].split()[0]}"] = child
    return out


def in_processes(seconds: float, reps: int, busy_poll_ms: float, baseline: str | None) -> list[dict]:
    import contextlib

    from executors import ClusterConfig

    body = json.dumps({"img": sample_image().tolist()}).encode()
    ours = Ours(True)
    ours.busy_poll_ms = busy_poll_ms
    systems = [Floor(), ours]
    if baseline:
        other = OursAt(baseline)
        systems.append(other)
    out = []
    with contextlib.ExitStack() as stack:
        if baseline:  # OursAt sends its tree the config fields it knows: busy polling is one
            real = ClusterConfig

            def config(**kw):
                return real(**{**kw, "busy_poll_ms": busy_poll_ms})

            stack.enter_context(_patched(__import__("executors"), "ClusterConfig", config))
        started = [stack.enter_context(s) for s in systems]
        urls = {s.name: s.url("ensemble") for s in started}
        for url in urls.values():
            wait_http(url, body)
            wrk(url, body, 8, 2)
        pids = {s.name: _processes(s) for s in started}
        for rep in range(reps):
            figures: dict = {}
            for c in (1, 8):
                for s in started:
                    before = {p: _cpu_s(pid) for p, pid in pids[s.name].items()}
                    r = wrk(urls[s.name], body, c, seconds)
                    n = max(1.0, r["rps"] * round(seconds))
                    cpu = {p: (_cpu_s(pid) - before[p]) / n * 1e6 for p, pid in pids[s.name].items()}
                    figures.setdefault(s.name, {})[f"c{c}"] = {
                        "rps": r["rps"],
                        "p50_ms": r["p50_ms"],
                        "cpu_us_per_request": cpu,
                        "cpu_us_total": sum(cpu.values()),
                    }
            progress(
                f"rep {rep + 1} of {reps}: "
                + "; ".join(
                    f"{name}: c=1 {f['c1']['cpu_us_total']:.0f} us CPU/request, c=8 {f['c8']['cpu_us_total']:.0f}"
                    for name, f in figures.items()
                )
            )
            out.append(figures)
    return out


@__import__("contextlib").contextmanager
def _patched(module, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    p.add_argument("--reps", type=int, default=4, help="reps over all systems (default 4)")
    p.add_argument(
        "--busy-poll-ms", type=float, default=0.0, help="FlowServe's busy polling (default 0: CPU time is work)"
    )
    p.add_argument("--baseline", default=None, help="another checkout, measured beside this tree")
    p.add_argument("--skip-processes", action="store_true", help="only the in-process part")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    pieces = in_process()
    for what, us in pieces.items():
        progress(f"{what}: {us:.1f} us")
    reps = [] if args.skip_processes else in_processes(args.seconds, args.reps, args.busy_poll_ms, args.baseline)
    medians: dict = {}
    for name in reps[0] if reps else ():
        medians[name] = {}
        for c in ("c1", "c8"):
            keys = reps[0][name][c]["cpu_us_per_request"]
            medians[name][c] = {
                "rps": statistics.median(r[name][c]["rps"] for r in reps),
                "p50_ms": statistics.median(r[name][c]["p50_ms"] for r in reps),
                "cpu_us_per_request": {
                    k: statistics.median(r[name][c]["cpu_us_per_request"][k] for r in reps) for k in keys
                },
                "cpu_us_total": statistics.median(r[name][c]["cpu_us_total"] for r in reps),
            }
            progress(
                f"{name} {c}: {medians[name][c]['cpu_us_total']:.0f} us CPU/request ("
                + ", ".join(f"{k} {v:.0f}" for k, v in medians[name][c]["cpu_us_per_request"].items())
                + f"), {medians[name][c]['rps']:.0f} req/s, p50 {medians[name][c]['p50_ms']:.2f} ms"
            )
    save(
        "overhead",
        {
            "seconds": args.seconds,
            "reps": args.reps,
            "busy_poll_ms": args.busy_poll_ms,
            "baseline": args.baseline,
            "in_process_us": pieces,
            "per_process": medians,
            "per_rep": reps,
            "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
    )
    return medians


if __name__ == "__main__":
    run()
