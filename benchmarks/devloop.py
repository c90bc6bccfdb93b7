"""The dev loop's waits, as a user meets them (``flowserve serve app.py --reload``).

Each round runs ``flowserve serve`` on a one-operator script in a process of its own, on an
embedded cluster of one executor, and times what the user waits for:

1. start: from the command to the line that prints the flow's URL, and to its first answer;
2. reload: from saving a module the script imports (an edit that changes the answer) to the
   first answer of the new version, the client asking every 20 ms;
3. stop: from Ctrl-C (SIGINT to the process group, as a terminal sends it) to the command's
   exit, the flow undeployed and the cluster stopped.

    python -m benchmarks devloop [--rounds 3]

Writes results/devloop.json and results/devloop.png.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.common import ROOT, plt, progress, save, save_plot

APP = """\
import flowserve as fs
from helper import factor


def scale(row):
    return row.x * factor()


def flows():
    f = fs.Flow("devloop", schema={"x": int})
    f.map(scale, names=["y"])
    return f
"""


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, whatever the caller's shell did


def answer(url: str) -> int | None:
    try:
        r = httpx.post(url, json={"x": 1}, timeout=10)
    except httpx.HTTPError:
        return None
    return r.json()["rows"][0]["y"] if r.status_code == 200 else None


def one_round(workdir: Path) -> dict:
    (workdir / "app.py").write_text(APP)
    (workdir / "helper.py").write_text("def factor():\n    return 2\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(workdir), FLOWSERVE_QUIET="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowserve.cli", "serve", "app.py", "--reload", "--port", "0", "--executors", "1"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_interruptible,
    )
    lines: list[str] = []
    seen = threading.Event()  # the URL line was printed

    def drain() -> None:  # read all it prints (a full pipe would stall it), noting the URL line
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving flow devloop"):
                seen.set()
        seen.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        seen.wait(120)
        found = [m for m in (re.match(r"serving flow devloop v\d+ at (\S+)", line) for line in lines) if m]
        if not found:
            raise RuntimeError(f"flowserve serve did not serve:\n{''.join(lines)}")
        url = found[0].group(1)
        printed = time.monotonic() - t0
        while answer(url) != 2:
            if time.monotonic() - t0 > 120:
                raise RuntimeError("no answer within 120 s")
            time.sleep(0.02)
        first = time.monotonic() - t0
        # the edit: a module the script imports, saved as an editor does (one write)
        t1 = time.monotonic()
        (workdir / "helper.py").write_text("def factor():\n    return 3\n")
        while answer(url) != 3:
            if time.monotonic() - t1 > 120:
                raise RuntimeError("the edit did not serve within 120 s")
            time.sleep(0.02)
        reload_s = time.monotonic() - t1
        t2 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(120)
        reader.join(10)
        stop_s = time.monotonic() - t2
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"url_printed_s": printed, "first_answer_s": first, "reload_s": reload_s, "stop_s": stop_s, "exit": code}


def summary(rounds: list[dict], key: str) -> dict:
    values = [r[key] for r in rounds]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks devloop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="devloop-") as d:
            r = one_round(Path(d))
        progress(
            f"round {i + 1}: URL printed {r['url_printed_s']:.2f} s, first answer {r['first_answer_s']:.2f} s, "
            f"reload {r['reload_s']:.2f} s, stop {r['stop_s']:.2f} s (exit {r['exit']})"
        )
        rounds.append(r)
    keys = ("url_printed_s", "first_answer_s", "reload_s", "stop_s")
    result = {"rounds": rounds, "summary": {k: summary(rounds, k) for k in keys}, "load_average": os.getloadavg()}
    save("devloop", result)

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 3.2))
    labels = ["URL printed", "first answer", "reload\n(save to new answer)", "Ctrl-C to exit"]
    med = [result["summary"][k]["median"] for k in keys]
    low = [m - result["summary"][k]["min"] for m, k in zip(med, keys)]
    high = [result["summary"][k]["max"] - m for m, k in zip(med, keys)]
    ax.bar(labels, med, yerr=[low, high], capsize=4, color="#4c72b0")
    for x, m in enumerate(med):
        ax.text(x, m, f"{m:.2f} s", ha="center", va="bottom")
    ax.set_ylabel("seconds (median, min..max)")
    ax.set_title(f"flowserve serve --reload, {args.rounds} rounds, 1 executor")
    save_plot(fig, "devloop")
