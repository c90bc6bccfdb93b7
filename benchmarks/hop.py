"""One hop of a big Table between two processes: ``python -m benchmarks hop``.

A ``run`` message (executors/wire/messages.py) carrying a one-row Table with a uint8 tensor of
``--mb`` MB goes from this process to an echo process over a Unix socket (the runtime's
Outbox and Reader) and back: each side decodes it to a Table and sends that Table on, as
an executor passes a stage's input to the next. A hop is half a round trip.

Three ways, interleaved in rounds, medians reported:

- ``socket``: shared memory off (every byte through the socket: into the kernel and out);
- ``shm, fresh``: this process sends a Table in its own memory each time (one copy into a
  new segment), the echo sends it back as received (no copy);
- ``shm, forwarded``: both sides send on what they received: no copy either way.

Writes benchmarks/results/hop.json.
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import ROOT, progress, save


def _endpoint(address: str, listen_at: str):
    from executors.wire.transport import Outbox, Reader, accept, listen

    listener = listen(listen_at)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)

    def receive():
        while True:
            for key, _ in sel.select():
                if key.data is None:
                    conn = accept(listener)
                    if conn is not None:
                        sel.register(conn, selectors.EVENT_READ, Reader(conn))
                    continue
                messages, _open = key.data.read()
                if messages:
                    return messages[0]

    return Outbox("hop"), receive


def _echo(address: str, listen_at: str, shm_off: bool) -> None:
    from executors.wire import messages, shm

    if shm_off:
        shm.SHM_MIN_BYTES = 1 << 62
    out, receive = _endpoint(address, listen_at)
    print("up", flush=True)
    while True:
        msg = messages.decode(receive())
        if msg.stage == "stop":
            return
        out.send(address, msg.encode())


def _measure(mb: int, shm_off: bool, n: int, tmp: str, tag: str) -> dict:
    from executors.wire import messages, shm
    from executors.wire.messages import StageInput
    from flow.table import Table

    shm.SHM_MIN_BYTES = 1 << 62 if shm_off else (1 << 20)
    here, there = f"ipc://{tmp}/{tag}-a.sock", f"ipc://{tmp}/{tag}-b.sock"
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.hop", "--echo", here, there] + (["--shm-off"] if shm_off else []),
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "up"
    out, receive = _endpoint(there, here)
    x = np.random.default_rng(0).integers(0, 255, (1, mb << 20), dtype=np.uint8)
    fresh = Table.from_dict({"x": x})

    def msg(table, stage="s"):
        return StageInput(
            req=1, attempt=0, flow="f", version=1, stage=stage, source="gw", routes={}, gateway=here, table=table
        )

    try:
        figures = {}
        for mode in ("fresh", "forwarded"):
            table, times = fresh, []
            for i in range(n + 2):
                t0 = time.perf_counter()
                out.send(there, msg(table).encode())
                back = messages.decode(receive())
                dt = time.perf_counter() - t0
                if i >= 2:  # warm: connections, the first segments
                    times.append(dt)
                if mode == "forwarded":
                    table = back.table
            assert np.array_equal(back.table["x"], x)
            figures[mode] = statistics.median(times) / 2 * 1000  # ms per hop
        out.send(there, msg(fresh, "stop").encode())
        child.wait(10)
        return figures
    finally:
        child.kill()
        out.close()


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks hop", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=20, help="round trips per measurement")
    p.add_argument("--echo", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--shm-off", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.echo:
        _echo(*args.echo, args.shm_off)
        return {}
    rows: dict[str, list] = {"socket": [], "shm, fresh": [], "shm, forwarded": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            s = _measure(args.mb, True, args.n, tmp, f"s{r}")
            m = _measure(args.mb, False, args.n, tmp, f"m{r}")
            rows["socket"].append(s["forwarded"])
            rows["shm, fresh"].append(m["fresh"])
            rows["shm, forwarded"].append(m["forwarded"])
            progress(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} ms" for k, v in rows.items()))
    result = {k: statistics.median(v) for k, v in rows.items()}
    progress(f"{args.mb} MB hop, medians: " + ", ".join(f"{k} {v:.3f} ms" for k, v in result.items()))
    save("hop", {"mb": args.mb, "rounds": args.rounds, "n": args.n, "ms_per_hop": result, "per_round": rows})
    return result


if __name__ == "__main__":
    run()
