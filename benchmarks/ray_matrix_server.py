"""The ``matrix`` cells on Ray Serve (benchmarks/matrix_peers.py), composed with deployment
handles as ray_server.py composes the e2e pipelines. Run with a Python that has ray[serve]
and torch (requirements-peers.txt); prints READY when Ray Serve is up, then reads commands:

    deploy PIPELINE/STYLE/STAGES   serve that cell's flow at /flows/<flow name>; prints DEPLOYED
    delete PIPELINE/STYLE/STAGES   remove it; prints DELETED
    quit                           shut Ray Serve and Ray down

    /path/to/ray-venv/bin/python benchmarks/ray_matrix_server.py --port 8005

A cell of 1 stage is one deployment, the HTTP ingress, running all its operators itself; a cell
of 3 or 6 stages is the ingress and one deployment per operator, which the ingress calls in
turn through their handles, passing the request's state (rows, or numpy columns).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

from benchmarks.matrix import JSON, FloorPipeline, _parse, answer, flow_name, run_whole, steps, store_data  # noqa: E402
from benchmarks.matrix_peers import (  # noqa: E402
    Operator,
    final_rows,
    parse_cells,
    start_state,
    tensor_column,
)

OPTS = {"num_cpus": 0.1}  # 2 cores: let every replica fit


@serve.deployment(ray_actor_options=OPTS)
class Step:
    """One operator of a cell."""

    def __init__(self, pipeline: str, style: str, stages: int, index: int):
        self.op = Operator(pipeline, style, stages, index)

    def __call__(self, state):
        return self.op(state)


@serve.deployment(ray_actor_options=OPTS)
class Ingress:
    """A cell's HTTP ingress: parses the body (JSON or Arrow IPC), runs the cell, answers JSON."""

    def __init__(self, pipeline: str, style: str, stages: int, *operators):
        self.style, self.tensor, self.operators = style, tensor_column(pipeline), operators
        self.whole = None if operators else FloorPipeline(pipeline, style, stages, store_data())

    async def __call__(self, request: Request) -> Response:
        rows = _parse(await request.body(), request.headers.get("content-type", JSON))
        if self.whole is not None:
            out = run_whole(self.whole, rows)
        else:
            state = start_state(self.style, self.tensor, rows)
            for op in self.operators:
                state = await op.remote(state)
            out = final_rows(self.style, state)
        return Response(answer(out), media_type=JSON)


def app(pipeline: str, style: str, stages: int):
    if stages == 1:
        return Ingress.bind(pipeline, style, stages)
    ops = [Step.bind(pipeline, style, stages, i) for i in range(len(steps(pipeline, style, stages)))]
    return Ingress.bind(pipeline, style, stages, *ops)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8005)
    args = p.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            (cell,) = parse_cells(words[1])
            name = flow_name(*cell)
            if words[0] == "deploy":
                serve.run(app(*cell), name=name, route_prefix=f"/flows/{name}")
                print("DEPLOYED", flush=True)
            elif words[0] == "delete":
                serve.delete(name)
                print("DELETED", flush=True)
        except Exception as e:  # the driver reads why, then stops
            print(f"ERROR {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
