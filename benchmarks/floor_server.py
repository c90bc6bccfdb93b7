"""The floor: one uvicorn process computing the whole pipeline in-process, no hops.

uvicorn benchmarks.floor_server:app --port 8001
"""

from __future__ import annotations

import json

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess

small, big = MLP("small"), MLP("big")


def _rows(body: bytes) -> list:
    doc = json.loads(body)
    return [doc] if isinstance(doc, dict) else doc


def ensemble_answer(body: bytes) -> bytes:
    rows = _rows(body)
    x = preprocess(np.asarray([r["img"] for r in rows], dtype=np.uint8))
    a, b = small(x), big(x)
    out = [
        dict(zip(("cls", "conf"), pick(a[0][i].item(), a[1][i].item(), b[0][i].item(), b[1][i].item())))
        for i in range(len(rows))
    ]
    return json.dumps({"rows": out}).encode()


def cascade_answer(body: bytes) -> bytes:
    rows = _rows(body)
    x = preprocess(np.asarray([r["img"] for r in rows], dtype=np.uint8))
    cls, conf = small(x)
    out = []
    for i in range(len(rows)):
        c, p = cls[i].item(), conf[i].item()
        if p < CASCADE_THRESHOLD:
            c2, p2 = big(x[i : i + 1])
            c, p = pick(c, p, c2[0].item(), p2[0].item())
        out.append({"cls": c, "conf": p})
    return json.dumps({"rows": out}).encode()


def compute(flow: int, body: bytes) -> bytes:
    """Flow 0 (ensemble) or 1 (cascade) on a JSON body: the answer's JSON (relay_server.py's worker)."""
    return (ensemble_answer, cascade_answer)[flow](body)


async def ensemble(request: Request) -> Response:
    return Response(ensemble_answer(await request.body()), media_type="application/json")


async def cascade(request: Request) -> Response:
    return Response(cascade_answer(await request.body()), media_type="application/json")


app = Starlette(
    routes=[Route("/flows/ensemble", ensemble, methods=["POST"]), Route("/flows/cascade", cascade, methods=["POST"])]
)
