"""The gateway's HTTP layer alone: an invocation answered by the lean path (executors/gateway/leanhttp.py)
against the same answered through the ASGI app (gateway.InvokeFastPath under uvicorn), on the
gateway's own server stack (uvicorn, httptools, uvloop, serving.limited_protocol) with a gateway
that answers at once (no flow, no executor): what the HTTP layer costs a request.

    python -m benchmarks leanhttp [--seconds 2] [--reps 6]

Both servers are up at once; wrk at concurrency 1 and 8 alternates between them rep after rep.
Per request: the server process's CPU (user + system, from /proc), requests/s and p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import ROOT, free_port, progress, save, wait_http, wrk
from benchmarks.overhead import _cpu_s

_SERVER = """
import sys, uvicorn
from executors.gateway.invoke import InvokeFastPath
from executors.gateway.http_server import HttpLimits, limited_protocol

ANSWER = b'{"rows":[{"cls":3,"conf":0.91,"qid":1}]}'
EXTRA = [(b"content-type", b"application/json"), (b"server-timing", b"flow;dur=0.123"),
         (b"x-qid-start", b"1"), (b"x-flowserve-trace", b'[["s0","cpu0",0.3,1]]')]

class Answering:  # the gateway's part: read the body, answer at once
    async def invoke(self, name, headers, receive):
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        return 200, ANSWER, EXTRA

fast = InvokeFastPath(Answering(), None)
if sys.argv[2] == "asgi":
    async def app(scope, receive, send):  # no ``answer``: the protocol hands every request to ASGI
        await fast(scope, receive, send)
else:
    app = fast
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", lifespan="off", access_log=False,
            proxy_headers=False, http=limited_protocol(HttpLimits()))
"""


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks leanhttp", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement (default 2)")
    p.add_argument("--reps", type=int, default=6, help="reps over both servers (default 6)")
    args = p.parse_args(argv)
    body = json.dumps({"img": [[i % 256 for i in range(28)] for _ in range(28)]}).encode()
    servers, procs = {}, []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        for kind in ("lean", "asgi"):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-c", _SERVER, str(port), kind], cwd=ROOT, env=env))
            servers[kind] = (f"http://127.0.0.1:{port}/flows/ensemble", procs[-1].pid)
        for url, _ in servers.values():
            wait_http(url, body)
            wrk(url, body, 8, 1)
        reps = []
        for rep in range(args.reps):
            figures: dict = {}
            for c in (1, 8):
                for kind, (url, pid) in servers.items():
                    before = _cpu_s(pid)
                    r = wrk(url, body, c, args.seconds)
                    n = max(1.0, r["rps"] * round(args.seconds))
                    figures.setdefault(kind, {})[f"c{c}"] = {**r, "cpu_us": (_cpu_s(pid) - before) / n * 1e6}
            progress(
                f"rep {rep + 1}: "
                + "; ".join(
                    f"{k}: c=8 {f['c8']['cpu_us']:.1f} us CPU/req {f['c8']['rps']:.0f} req/s, "
                    f"c=1 p50 {f['c1']['p50_ms'] * 1000:.0f} us"
                    for k, f in figures.items()
                )
            )
            reps.append(figures)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    summary: dict = {}
    for kind in servers:
        summary[kind] = {
            f"c{c}": {
                key: statistics.median(r[kind][f"c{c}"][key] for r in reps) for key in ("rps", "p50_ms", "cpu_us")
            }
            for c in (1, 8)
        }
    ratios = {
        "lean/asgi cpu_us c8": statistics.median(r["lean"]["c8"]["cpu_us"] / r["asgi"]["c8"]["cpu_us"] for r in reps),
        "lean/asgi rps c8": statistics.median(r["lean"]["c8"]["rps"] / r["asgi"]["c8"]["rps"] for r in reps),
        "lean/asgi p50 c1": statistics.median(r["lean"]["c1"]["p50_ms"] / r["asgi"]["c1"]["p50_ms"] for r in reps),
    }
    for kind, f in summary.items():
        progress(
            f"{kind}: c=8 {f['c8']['cpu_us']:.1f} us CPU/request, {f['c8']['rps']:.0f} req/s; "
            f"c=1 {f['c1']['cpu_us']:.1f} us CPU/request, p50 {f['c1']['p50_ms'] * 1000:.0f} us"
        )
    for what, ratio in ratios.items():
        progress(f"{what}: {ratio:.2f}x (median of per-rep ratios)")
    out = {"seconds": args.seconds, "reps": reps, "medians": summary, "ratios": ratios}
    save("leanhttp", out)
    return out


if __name__ == "__main__":
    run(sys.argv[1:])
