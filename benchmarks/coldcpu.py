"""What a request's own work costs right after something else: ``python -m benchmarks coldcpu``.

The work is the gateway's for a 10 KB Arrow body (parse it, build the request's Table:
``httpcodec.parse_body`` + ``input_table``), timed alone in a loop ("hot") and right
after each of: a 5 ms sleep (a process that waited, as a gateway waits on its
executors), writing a 10 MiB body into a fresh shared-memory segment (what the gateway
does while it reads a big body, shm.SegmentWriter, the segment kept), a 10 MiB numpy
copy, and freeing a 10 MiB segment. Medians of ``--n`` tries each, in ``--rounds``
interleaved rounds.

Why: the fused 10-stage chain at 10 MB costs ~0.9 ms more in the gateway than at 10 KB,
although no step of it touches the payload; its parse, send and the executor's run
each take longer. Writes benchmarks/results/coldcpu.json.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from benchmarks.common import progress, save
from benchmarks.fusion import ARROW, arrow_body

MB = 1 << 20


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks coldcpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from executors.codec.bodies import input_table, parse_body
    from executors.wire import shm

    rng = np.random.default_rng(0)
    small = arrow_body({"x": rng.standard_normal((1, 2560)).astype(np.float32)})
    big = arrow_body({"x": rng.standard_normal((1, 10 * MB // 4)).astype(np.float32)})
    pieces = [big[i : i + 256_000] for i in range(0, len(big), 256_000)]
    src = np.frombuffer(big, dtype=np.uint8)
    dst = np.empty_like(src)
    qids = np.arange(1, dtype=np.int64)
    held: list = []

    def segment():
        w = shm.SegmentWriter()
        for piece in pieces:
            w.write(piece)
        return w.mapped()

    def freed():
        view = segment()
        shm.settle()
        del view  # 10 MiB: let go of on the reaper thread ...
        shm.settle()  # ... and waited for, so the freeing is done before the work

    before = {
        "hot": lambda: None,
        "after a 5 ms sleep": lambda: time.sleep(0.005),
        "after writing a 10 MiB segment": lambda: held.append(segment()),
        "after a 10 MiB numpy copy": lambda: np.copyto(dst, src),
        "after freeing a 10 MiB segment": freed,
    }
    samples: dict[str, list[float]] = {k: [] for k in before}
    gc.disable()  # a collection inside a timed try would land on one condition only
    try:
        for r in range(args.rounds):
            for name, first in before.items():
                times = []
                for _ in range(args.n):
                    first()
                    t0 = time.perf_counter()
                    input_table("f", parse_body(small, ARROW, None), qids, None)
                    times.append((time.perf_counter() - t0) * 1e6)
                    if len(held) > 2:
                        held.clear()
                held.clear()
                samples[name].append(statistics.median(times))
            progress(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f} us" for k, v in samples.items()))
    finally:
        gc.enable()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    hot = medians["hot"]
    for k, v in medians.items():
        progress(f"{k:34s} {v:7.1f} us  ({v / hot:.1f}x hot)")
    out = {"work": "parse + Table of a 10 KB Arrow body", "us_per_round": samples, "median_us": medians}
    save("coldcpu", out)
    return out


if __name__ == "__main__":
    run()
