"""The ``matrix`` cells on LitServe (benchmarks/matrix_peers.py): one LitAPI per cell at
/flows/<flow name>, each computing all of its cell's operators in its inference worker
(LitServe does not compose separately scaled stages). Run with a Python that has litserve
and torch (requirements-peers.txt); prints READY when serving.

    /path/to/litserve-venv/bin/python benchmarks/litserve_matrix_server.py --port 8006 --cells ensemble/row/1,lookup/table/6

LitServe parses a JSON body itself (``await request.json()``) and takes no other body, so the
request parameter is a FastAPI ``Body``: JSON arrives parsed, an Arrow IPC body as bytes,
which the worker reads as the floor does.
"""

# no `from __future__ import annotations`: LitServe and FastAPI read decode_request's annotation

import argparse
import sys
from pathlib import Path
from typing import Annotated, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import litserve as ls  # noqa: E402
from fastapi import Body  # noqa: E402

from benchmarks.litserve_server import serve  # noqa: E402
from benchmarks.matrix import (  # noqa: E402
    ARROW,
    FloorPipeline,
    _parse,
    flow_name,
    run_whole,  # noqa: E402
    store_data,
)
from benchmarks.matrix_peers import parse_cells  # noqa: E402


class Cell(ls.LitAPI):
    def __init__(self, pipeline: str, style: str, stages: int):
        super().__init__(api_path=f"/flows/{flow_name(pipeline, style, stages)}")
        self.cell = (pipeline, style, stages)

    def setup(self, device):
        self.run = FloorPipeline(*self.cell, store_data())

    def decode_request(self, request: Annotated[Any, Body()]):
        if isinstance(request, bytes):
            return _parse(request, ARROW)
        return [request] if isinstance(request, dict) else request

    def predict(self, rows):
        return run_whole(self.run, rows)

    def encode_response(self, output):
        return {"rows": output}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8006)
    p.add_argument("--cells", required=True, help="pipeline/style/stages,...")
    args = p.parse_args()
    server = ls.LitServer([Cell(*c) for c in parse_cells(args.cells)], accelerator="cpu", workers_per_device=1)
    serve(server, args.port)


if __name__ == "__main__":
    main()
