"""The same pipelines on Ray Serve, composed with deployment handles (Ray's documented
model-composition pattern). Run with a Python that has ray[serve] and torch installed
(see requirements-peers.txt); prints READY when serving.

    /path/to/ray-venv/bin/python benchmarks/ray_server.py --port 8002
    /path/to/ray-venv/bin/python benchmarks/ray_server.py --port 8002 --chains 1,2,4,8

``--chains``: instead, chains of N no-op deployments at /flows/chainN (benchmarks/stages.py):
the HTTP ingress is the first and calls the next through its handle, and so on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess  # noqa: E402

OPTS = {"num_cpus": 0.1}  # 2 cores: let every replica fit


@serve.deployment(ray_actor_options=OPTS)
class Preprocess:
    def __call__(self, imgs):
        return preprocess(imgs)


@serve.deployment(ray_actor_options=OPTS)
class Model:
    def __init__(self, name: str):
        self.model = MLP(name)

    def __call__(self, x):
        return self.model(x)


def _rows(body: bytes) -> list:
    doc = json.loads(body)
    return [doc] if isinstance(doc, dict) else doc


@serve.deployment(ray_actor_options=OPTS)
class Ensemble:
    def __init__(self, pre, small, big):
        self.pre, self.small, self.big = pre, small, big

    async def __call__(self, request: Request) -> Response:
        rows = _rows(await request.body())
        x = await self.pre.remote(np.asarray([r["img"] for r in rows], dtype=np.uint8))
        a_ref, b_ref = self.small.remote(x), self.big.remote(x)
        a, b = await a_ref, await b_ref
        out = [
            dict(zip(("cls", "conf"), pick(a[0][i].item(), a[1][i].item(), b[0][i].item(), b[1][i].item())))
            for i in range(len(rows))
        ]
        return Response(json.dumps({"rows": out}), media_type="application/json")


@serve.deployment(ray_actor_options=OPTS)
class Cascade:
    def __init__(self, pre, small, big):
        self.pre, self.small, self.big = pre, small, big

    async def __call__(self, request: Request) -> Response:
        rows = _rows(await request.body())
        x = await self.pre.remote(np.asarray([r["img"] for r in rows], dtype=np.uint8))
        cls, conf = await self.small.remote(x)
        out = []
        for i in range(len(rows)):
            c, p = cls[i].item(), conf[i].item()
            if p < CASCADE_THRESHOLD:
                c2, p2 = await self.big.remote(x[i : i + 1])
                c, p = pick(c, p, c2[0].item(), p2[0].item())
            out.append({"cls": c, "conf": p})
        return Response(json.dumps({"rows": out}), media_type="application/json")


class _Stage:
    """A chain's stage: hands ``x`` to the next stage (a deployment handle), if any."""

    def __init__(self, next_stage=None):
        self.next = next_stage

    async def forward(self, x):
        return x if self.next is None else await self.next.remote(x)


@serve.deployment(ray_actor_options=OPTS)
class NoOp(_Stage):
    """A chain's stage after the first."""

    async def __call__(self, x):
        return await self.forward(x)


@serve.deployment(ray_actor_options=OPTS)
class ChainIngress(_Stage):
    """A chain's first stage: reads ``{"x": ...}`` from HTTP and answers it as FlowServe does."""

    async def __call__(self, request: Request) -> Response:
        x = await self.forward(json.loads(await request.body())["x"])
        return Response(json.dumps({"rows": [{"x": x}]}), media_type="application/json")


def serve_chains(lengths: list[int]) -> None:
    for n in lengths:
        stage = None
        for _ in range(n - 1):
            stage = NoOp.bind(stage)
        serve.run(ChainIngress.bind(stage), name=f"chain{n}", route_prefix=f"/flows/chain{n}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--chains", default=None, help="serve no-op chains of these lengths instead (e.g. 1,2,4,8)")
    args = p.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    if args.chains:
        serve_chains([int(n) for n in args.chains.split(",")])
        print("READY", flush=True)
        while True:
            time.sleep(3600)
    serve.run(
        Ensemble.bind(Preprocess.bind(), Model.bind("small"), Model.bind("big")),
        name="ensemble",
        route_prefix="/flows/ensemble",
    )
    serve.run(
        Cascade.bind(Preprocess.bind(), Model.bind("small"), Model.bind("big")),
        name="cascade",
        route_prefix="/flows/cascade",
    )
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
