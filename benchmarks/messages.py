"""The per-hop cost of a message, in-process: ``python -m benchmarks messages``.

Three measurements of one request's input for one stage (a ``run`` message carrying a
small Table of one row: a float, a string and a 2x3 float32 tensor), each built, encoded
to frames, decoded and read the way the executor reads it:

- ``dicts``: untyped header dicts (``dict(base, stage=..., path=..., copy=...)``,
  wire.pack/unpack, then key lookups): the reference the typed messages are measured against;
- ``messages``: the typed classes (StageInput.to, encode, messages.decode, attributes);
- ``dicts_result`` / ``messages_result``: the sink's answer to the gateway as a dict of the
  run header's keys, all sent, and as ``Result`` (only what the gateway reads);
- ``arrow_ipc`` vs ``wire``: the Table alone through an Arrow IPC stream
  (to_arrow, write, read, from_arrow) against wire.py's header + raw buffers, the claim
  wire.py makes for small tables.

Run from an older tree (``PYTHONPATH=/tmp/base python -m benchmarks.messages``, this
file copied there) it measures only what that tree has: the before of an A/B.

Reported as ns per message (the median of ``--rounds`` rounds of ``--number`` messages,
configurations interleaved); writes benchmarks/results/messages.json.
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import time

import numpy as np

from benchmarks.common import progress, save
from executors.wire.frames import pack, unpack
from flow.table import QID, Table

DEADLINE = time.time() + 3600
ROUTES = {"a": ["ipc:///tmp/fs/e0"], "b": ["ipc:///tmp/fs/e0"], "c": ["ipc:///tmp/fs/e1"]}


def small_table() -> Table:
    return Table.from_pylist(
        [{"x": 0.5, "s": "a query", "t": np.arange(6, dtype=np.float32).reshape(2, 3)}], qid=np.array([17])
    )


def dicts(table: Table):
    """The code before executors/wire/messages.py: header dicts with short keys, read by key."""
    base = {
        "type": "run",
        "req": 42,
        "att": 0,
        "flow": "ensemble",
        "ver": 3,
        "from": "a",
        "routes": ROUTES,
        "gw": "ipc:///tmp/fs/gw",
        "dl": DEADLINE,
        "trace": [["a", "e0", 0.123, 1]],
    }

    def once():
        frames = pack(dict(base, stage="b", path=[], copy=0), {"t": table})
        h, tables = unpack([bytes(f) for f in frames])
        if h.get("type") == "run":
            key = (h["flow"], int(h["ver"]), h["stage"])
            rid = (h["gw"], h["req"], h["att"], h["stage"], h.get("copy", 0))
            path = tuple(tuple(p) for p in h.get("path", ()))
            return key, rid, path, h["from"], h.get("trace", ()), h.get("dl"), tables.get("t")

    return once


def messages(table: Table):
    """The same through the typed classes of executors/wire/messages.py."""
    from executors.wire.messages import StageInput, decode

    base = StageInput(
        42, 0, "ensemble", 3, "a", "__input__", ROUTES, "ipc:///tmp/fs/gw", DEADLINE, [["a", "e0", 0.123, 1]]
    )

    def once():
        frames = base.to("b", "a", (), 0, table).encode()
        m = decode([bytes(f) for f in frames])
        if type(m) is StageInput:
            key = (m.flow, m.version, m.stage)
            rid = (m.gateway, m.req, m.attempt, m.stage, m.copy)
            path = tuple(tuple(p) for p in m.path)
            return key, rid, path, m.source, m.trace, m.deadline, m.table

    return once


def dicts_result(table: Table):
    """The sink's answer before: the run header's keys (all sent, the gateway read five)."""
    base = {
        "type": "run",
        "req": 42,
        "att": 0,
        "flow": "ensemble",
        "ver": 3,
        "from": "c",
        "routes": ROUTES,
        "gw": "ipc:///tmp/fs/gw",
        "dl": DEADLINE,
        "trace": [["a", "e0", 0.123, 1], ["c", "e0", 0.2, 1]],
    }

    def once():
        h, tables = unpack([bytes(f) for f in pack(dict(base, type="result", path=[]), {"t": table})])
        if h.get("type") == "result":
            return (
                h.get("req"),
                h.get("att"),
                tuple(tuple(p) for p in h.get("path", ())),
                h.get("trace", ()),
                tables["t"],
            )

    return once


def messages_result(table: Table):
    from executors.wire.messages import Result, decode

    def once():
        trace = [["a", "e0", 0.123, 1], ["c", "e0", 0.2, 1]]
        m = decode([bytes(f) for f in Result(42, 0, (), trace, table).encode()])
        if type(m) is Result:
            return m.req, m.attempt, tuple(tuple(p) for p in m.path), m.trace, m.table

    return once


def wire(table: Table):
    def once():
        return unpack([bytes(f) for f in pack({}, {"t": table})])[1]["t"]

    return once


def arrow_ipc(table: Table):
    import pyarrow as pa

    def once():
        sink = io.BytesIO()
        at = table.to_arrow()
        with pa.ipc.new_stream(sink, at.schema) as w:
            w.write_table(at)
        back = pa.ipc.open_stream(sink.getvalue()).read_all()
        return Table.from_arrow(back.drop_columns([QID]), qid=back.column(QID).to_numpy())

    return once


def _ns_per_call(fn, number: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        return (time.perf_counter_ns() - t0) / number
    finally:
        gc.enable()


def run(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks messages", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--number", type=int, default=2000, help="messages per round and configuration")
    p.add_argument("--save-as", default="messages", help="results file name (default messages)")
    args = p.parse_args(argv)
    table = small_table()
    configs = {
        "dicts": dicts(table),
        "dicts_result": dicts_result(table),
        "wire": wire(table),
        "arrow_ipc": arrow_ipc(table),
    }
    try:
        configs.update(messages=messages(table), messages_result=messages_result(table))
    except ImportError:  # a tree before executors/wire/messages.py
        progress("no executors/wire/messages.py in this tree: measuring the dicts only")
    else:
        a, b = configs["dicts"](), configs["messages"]()
        assert a[:-1] == b[:-1] and str(a[-1].to_pylist()) == str(b[-1].to_pylist()), "both must read the same"
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(args.rounds):
        for name, fn in configs.items():
            samples[name].append(_ns_per_call(fn, args.number))
        progress(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.0f} ns" for k, v in samples.items()))
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {"arrow_ipc / wire": med["arrow_ipc"] / med["wire"]}
    if "messages" in med:
        ratios.update(
            {
                "messages / dicts": med["messages"] / med["dicts"],
                "messages_result / dicts_result": med["messages_result"] / med["dicts_result"],
            }
        )
    for k, v in med.items():
        print(f"{k:16s} {v:9.0f} ns per message (median of {args.rounds} rounds of {args.number})")
    for k, v in ratios.items():
        print(f"{k:32s} {v:.2f}x")
    save(
        args.save_as,
        {"rounds": args.rounds, "number": args.number, "median_ns": med, "ratios": ratios, "samples_ns": samples},
    )


if __name__ == "__main__":
    import sys

    run(sys.argv[1:])
