"""What checking that values fit their column's type costs: ``python -m benchmarks value_checks``.

A value that does not fit a column's type (300 or -1 in a uint8 tensor, 1e39 in a float32
one) is refused on every path (``flow.types.check_fits``). This measures that check's
share of building a request's input, in one process, each case once with the check and
once with it switched off (``check_fits`` and ``_check_rows_fit`` made no-ops,
``bodies.may_hold_bool`` False; a float column's search for infinities after its cast is
inline and stays), configurations interleaved round by round:

- ``json_1`` / ``json_32``: an HTTP JSON body of 1 or 32 rows of a uint8 (28, 28) image
  (the e2e benchmark's request) parsed against the flow's schema (``bodies.parse_body``):
  nested lists read as int64, checked, cast to uint8;
- ``run_lists_32``: ``flow.input_table`` of 32 rows whose images are nested lists
  (what ``flow.run`` and ``Deployment.invoke`` take from a user);
- ``run_float64_32``: 32 rows of float64 arrays into a float32 (28, 28) column;
- ``run_uint8_32``: 32 rows already uint8: the dtype always fits, the check costs nothing;
- ``arrow_int64_1000``: an Arrow table of 1,000 int64 images (a fixed-shape tensor
  column) into the uint8 column (``Table.from_arrow``: one vectorised min/max over
  784,000 values).

``--baseline TREE`` also runs the same cases on another checkout (e.g. ``git archive
HEAD | tar -x -C /tmp/base``: the code before a change) in a child process, a round of it
between this tree's rounds.

Reported as microseconds per call (the median of ``--rounds`` rounds); writes
benchmarks/results/value_checks.json and a plot beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import orjson

from benchmarks.common import plt, progress, save, save_plot

SHAPE = (28, 28)


def cases() -> dict:
    import pyarrow as pa

    from executors.codec import bodies
    from flow import ColumnType, Flow
    from flow.table import Table

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (1000, *SHAPE), dtype=np.uint8)
    uint8 = {"img": ColumnType.tensor(np.uint8, SHAPE)}
    float32 = {"img": ColumnType.tensor(np.float32, SHAPE)}
    body_1 = orjson.dumps({"img": images[0].tolist()})
    body_32 = orjson.dumps([{"img": x.tolist()} for x in images[:32]])
    flow_u8 = Flow("u8", schema=uint8)
    flow_u8.map(lambda r: 0, names=["y"])
    flow_f32 = Flow("f32", schema=float32)
    flow_f32.map(lambda r: 0, names=["y"])
    lists_32 = [{"img": x.tolist()} for x in images[:32]]
    float64_32 = [{"img": x.astype(np.float64)} for x in images[:32]]
    uint8_32 = [{"img": x} for x in images[:32]]
    storage = pa.FixedSizeListArray.from_arrays(pa.array(images.astype(np.int64).reshape(-1)), SHAPE[0] * SHAPE[1])
    tensors = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int64(), SHAPE), storage)
    arrow_1000 = pa.table({"img": tensors})
    return {
        "json_1": lambda: bodies.parse_body(body_1, bodies.JSON, uint8),
        "json_32": lambda: bodies.parse_body(body_32, bodies.JSON, uint8),
        "run_lists_32": lambda: flow_u8.input_table(lists_32),
        "run_float64_32": lambda: flow_f32.input_table(float64_32),
        "run_uint8_32": lambda: flow_u8.input_table(uint8_32),
        "arrow_int64_1000": lambda: Table.from_arrow(arrow_1000, schema=uint8),
    }


@contextlib.contextmanager
def unchecked():
    """The same code with the fit checks switched off (what numpy's cast alone costs)."""
    from executors.codec import bodies
    from flow import types

    saved = types.check_fits, types._check_rows_fit, bodies.check_fits, bodies.may_hold_bool

    def nothing(*args, **kwargs):
        return None

    # _check_rows_fit too: it stacks a column's rows for check_fits
    types.check_fits = types._check_rows_fit = bodies.check_fits = nothing
    bodies.may_hold_bool = lambda body: False
    try:
        yield
    finally:
        types.check_fits, types._check_rows_fit, bodies.check_fits, bodies.may_hold_bool = saved


def _us_per_call(fn, number: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        return (time.perf_counter_ns() - t0) / number / 1000
    finally:
        gc.enable()


def child() -> None:
    """The ``--baseline`` side: this file run with another tree first on PYTHONPATH; reads
    "CASE CALLS" lines, answers each with the microseconds per call."""
    fns = cases()
    for line in sys.stdin:
        name, number = line.split()
        print(_us_per_call(fns[name], int(number)), flush=True)


class Baseline:
    """Another tree's cases, measured in a child process (``child``)."""

    def __init__(self, tree: str):
        env = dict(os.environ, PYTHONPATH=tree)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def measure(self, name: str, number: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{name} {number}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def run(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks value_checks", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--seconds", type=float, default=0.1, help="per case, configuration and round (about)")
    p.add_argument("--baseline", metavar="TREE", help="also measure the cases on this checkout (the code before)")
    p.add_argument("--save-as", default="value_checks", help="results file name (default value_checks)")
    args = p.parse_args(argv)
    fns = cases()
    baseline = Baseline(args.baseline) if args.baseline else None
    numbers = {}
    for name, fn in fns.items():  # warm up; calls per round so that each takes about --seconds
        t = _us_per_call(fn, 3)
        numbers[name] = max(3, int(args.seconds * 1e6 / max(t, 1e-3)))
    configs = ["checked", "unchecked"] + (["baseline"] if baseline else [])
    samples: dict[str, dict[str, list[float]]] = {n: {c: [] for c in configs} for n in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            samples[name]["checked"].append(_us_per_call(fn, numbers[name]))
            with unchecked():
                samples[name]["unchecked"].append(_us_per_call(fn, numbers[name]))
            if baseline is not None:
                samples[name]["baseline"].append(baseline.measure(name, numbers[name]))
        progress(f"round {r + 1}/{args.rounds}")
    if baseline is not None:
        baseline.close()
    med = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    # per round: the check's share, then the median of those (the VM's speed drifts)
    added = {n: statistics.median(c - u for c, u in zip(s["checked"], s["unchecked"])) for n, s in samples.items()}
    ratio = {n: statistics.median(c / u for c, u in zip(s["checked"], s["unchecked"])) for n, s in samples.items()}
    over_baseline = {
        n: statistics.median(c / b for c, b in zip(s["checked"], s["baseline"])) for n, s in samples.items() if baseline
    }
    for n in fns:
        print(
            f"{n:18s} checked {med[n]['checked']:9.1f} us  unchecked {med[n]['unchecked']:9.1f} us  "
            f"check {added[n]:+8.1f} us ({ratio[n]:.2f}x)"
            + (f"  baseline {med[n]['baseline']:9.1f} us ({over_baseline[n]:.2f}x)" if baseline else "")
        )
    save(
        args.save_as,
        {
            "rounds": args.rounds,
            "calls_per_round": numbers,
            "median_us": med,
            "check_us": added,
            "checked_over_unchecked": ratio,
            "baseline": args.baseline,
            "checked_over_baseline": over_baseline,
            "samples_us": samples,
        },
    )
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(8, 3.6))
    names = list(fns)
    x = np.arange(len(names))
    width = 0.8 / len(configs)
    labels = {
        "unchecked": "fit checks off",
        "checked": "fit checks on (today)",
        "baseline": "--baseline tree (the code before)",
    }
    for i, c in enumerate(["unchecked", "checked", "baseline"][: len(configs)]):
        ax.bar(x + (i - (len(configs) - 1) / 2) * width, [med[n][c] for n in names], width, label=labels[c])
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("µs per call (median)")
    ax.set_title("Building a request's input with and without checking that values fit")
    ax.legend(fontsize=8)
    save_plot(fig, args.save_as)


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else run(sys.argv[1:])
