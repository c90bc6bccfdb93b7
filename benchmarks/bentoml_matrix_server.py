"""The ``matrix`` cells on BentoML 1.4 (benchmarks/matrix_peers.py): one service computing
all of a cell's operators in-process (BentoML composes services, not separately scaled
stages of one request's flow), the cells named by $MATRIX_CELLS (pipeline/style/stages,...).

- JSON bodies: an API route per cell at /flows/<flow name>, its typed parameter the row's
  field (``img: list`` or ``user: int``), as BentoML's APIs take JSON.
- Arrow IPC bodies: BentoML's API routes take JSON, multipart or its own pickle only, so an
  ASGI app mounted at /arrow has a route per cell at /arrow/flows/<flow name> (BentoML's
  pattern for custom routes; a Starlette app, as BentoML's venv has no FastAPI) that reads
  the body as the floor does and runs the cell on the service instance.

Run with a Python that has bentoml and torch (requirements-peers.txt), from the repository root:

    MATRIX_CELLS=ensemble/row/1 /path/to/bentoml-venv/bin/bentoml serve benchmarks.bentoml_matrix_server:Cells --port 8007
"""

# no `from __future__ import annotations`: BentoML reads the APIs' annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bentoml  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from benchmarks.matrix import ARROW, JSON, FloorPipeline, _parse, answer, flow_name, run_whole, store_data  # noqa: E402
from benchmarks.matrix_peers import parse_cells  # noqa: E402

CELLS = parse_cells(os.environ.get("MATRIX_CELLS", "ensemble/row/1"))


def _init(self):
    store = store_data()
    self.runs = {flow_name(*c): FloorPipeline(*c, store) for c in CELLS}


def _image_api(name: str):
    def api(self, img: list) -> dict:
        return {"rows": run_whole(self.runs[name], [{"img": img}])}

    api.__name__ = api.__qualname__ = name  # the service's method of that name
    return api


def _user_api(name: str):
    def api(self, user: int) -> dict:
        return {"rows": run_whole(self.runs[name], [{"user": user}])}

    api.__name__ = api.__qualname__ = name
    return api


def _arrow_route(name: str) -> Route:
    async def route(request: Request) -> Response:
        rows = _parse(await request.body(), request.headers.get("content-type", ARROW))
        return Response(answer(run_whole(bentoml.get_current_service().runs[name], rows)), media_type=JSON)

    return Route(f"/flows/{name}", route, methods=["POST"])


def _service():
    namespace: dict = {"__init__": _init, "__module__": __name__}
    for cell in CELLS:
        name = flow_name(*cell)
        make = _user_api if cell[0] == "lookup" else _image_api
        namespace[name] = bentoml.api(make(name), route=f"/flows/{name}", name=name)
    arrow_app = Starlette(routes=[_arrow_route(flow_name(*c)) for c in CELLS])
    cls = type("Cells", (), namespace)
    return bentoml.service(workers=1)(bentoml.asgi_app(arrow_app, path="/arrow")(cls))


Cells = _service()
