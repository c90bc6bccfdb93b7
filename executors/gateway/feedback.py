"""``POST /flows/{name}/feedback``: a reward or the true label for a query a ``select``
answered (flow/prediction.py), applied to the weights the select keeps in the store.

    POST /flows/digits/feedback   {"qid": 17, "label": 3}      or   {"qid": 17, "reward": 1.0}
    -> 200 {"flow": "digits", "qid": 17, "updated": 1}

The qid is the one the answer's ``X-Qid-Start`` header gave (row i: start + i). Each
query takes one feedback (its record is deleted); a qid with no record (unknown, given
feedback already, or older than a day) is 404 ``FeedbackError``, a body that is not
one object with ``qid`` and one of ``reward`` (in [0, 1]) or ``label`` is 400. The update
is a read-modify-write of the weights (not atomic across several gateways).
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from executors.errors import http_error
from flow.prediction import FeedbackError, apply_feedback, selects_of

MAX_BODY = 64 << 10


def _error(answer) -> Response:
    status, body = answer
    return Response(body, status_code=status, media_type="application/json")


async def feedback(gateway, request: Request) -> Response:
    name = request.path_params["name"]
    flow = gateway.dispatcher.flows.get(name)
    if flow is None:
        return _error(http_error("UnknownFlow", f"no deployed flow named {name!r}; GET /flows lists them"))
    selects = selects_of([n.op for s in flow.plan.stages.values() for n in s.nodes])
    if not selects:
        return _error(http_error("FeedbackError", f"flow {name!r} has no select operator to take feedback", status=400))
    body = await request.body()
    if len(body) > MAX_BODY:
        return _error(http_error("PayloadTooLarge", f"feedback body is over {MAX_BODY} bytes"))
    try:
        doc = json.loads(body)
    except ValueError as e:
        return _error(http_error("FeedbackError", f"feedback body is not JSON: {e}", status=400))
    if not isinstance(doc, dict) or "qid" not in doc or set(doc) - {"qid", "reward", "label"}:
        return _error(
            http_error(
                "FeedbackError",
                f"feedback body must be an object with qid and one of reward or label, got {str(doc)[:200]}",
                status=400,
            )
        )
    if isinstance(doc["qid"], float) and doc["qid"].is_integer():
        # JSON Schema (and the OpenAPI document) call 17.0 an integer: take it as 17.
        doc["qid"] = int(doc["qid"])
    try:
        updated = await asyncio.to_thread(
            apply_feedback, gateway.store, selects, doc["qid"], doc.get("reward"), doc.get("label")
        )
    except FeedbackError as e:
        status = 404 if "no selection record" in str(e) else 400
        return _error(http_error("FeedbackError", str(e), status=status))
    return JSONResponse({"flow": name, "qid": doc["qid"], "updated": updated})
