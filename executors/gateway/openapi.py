"""The gateway's OpenAPI 3.1 document: every route it serves to applications (not the
admin routes), and per deployed flow its path with its rows' schema, example bodies and
every status it can answer, its plan, history and readiness, and, for a flow with a
``select``, its feedback.

The schemas say what the gateway's JSON reading (executors/codec/bodies.py) accepts, no
more and no less, so a client generated from the document and a fuzzer that trusts it
meet no surprise (tests/executors/test_openapi_fuzz.py runs schemathesis against a live
cluster): integers within their dtype's bounds, floats within their dtype's finite range,
booleans apart from numbers, bytes as strict base64, tensors of their exact shape, and
``null`` for a missing value in any column. JSON Schema reads 75.0 as an integer, and so
does the gateway. The page and its assets (``/``, ``/docs``) are not operations of the
API and are not listed.
"""

from __future__ import annotations

import numpy as np

from flow.prediction import selects_of
from optimizer.positions import POS

ERROR = {
    "type": "object",
    "description": "every error answer: the class of the error tree (flow/errors.py) or the edge's own name, "
    "a message naming what was wrong, and where known the operator and the query",
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "operator": {"type": "string"},
        "qid": {"type": "integer"},
    },
    "required": ["error", "message"],
}

_INT64 = {"minimum": -(2**63), "maximum": 2**63 - 1}
# base64 as the gateway decodes it (the standard alphabet, padded, no whitespace)
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _float_bounds(dtype: np.dtype) -> dict:
    """A float dtype's range as the gateway checks it: a float64 holds every JSON number
    up to its largest finite value; a narrower float takes every number that rounds to a
    finite value of it (below the largest finite one plus half a step: 65519.9 is a
    float16, 65520 would be its infinity)."""
    info = np.finfo(dtype)
    if dtype == np.float64:
        return {"minimum": -float(info.max), "maximum": float(info.max)}
    limit = 2.0**info.maxexp - 2.0 ** (info.maxexp - info.nmant - 2)
    return {"exclusiveMinimum": -limit, "exclusiveMaximum": limit}


def _element_schema(dtype) -> dict:
    """A tensor element: integer dtypes with their bounds (uint8 pixels are 0..255), floats
    within their range, booleans for bool tensors only."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    if dtype.kind == "b":
        return {"type": "boolean"}
    return {"type": "number", **_float_bounds(dtype)}


def type_doc(t) -> dict:
    """A column type as GET /flows shows it: dtypes by name ("uint8", not "|u1")."""
    if t.kind == "tensor":
        return {"kind": "tensor", "dtype": np.dtype(t.dtype).name, "shape": list(t.shape)}
    return {"kind": t.kind}


_SCALARS = {
    "int": {"type": ["integer", "null"], **_INT64, "description": "int64"},
    "float": {"type": ["number", "null"], **_float_bounds(np.dtype(np.float64)), "description": "float64"},
    "bool": {"type": ["boolean", "null"]},
    "str": {"type": ["string", "null"]},
    "bytes": {"type": ["string", "null"], "contentEncoding": "base64", "pattern": BASE64, "description": "base64"},
    "null": {"type": "null", "description": "every value missing"},
}


def column_schema(t) -> dict:
    """A column's JSON values: its type, or null (a missing value, in any column)."""
    if t.kind != "tensor":
        return dict(_SCALARS[t.kind])
    inner: dict = _element_schema(t.dtype)
    for dim in reversed(t.shape):
        inner = {"type": "array", "items": inner, "minItems": dim, "maxItems": dim}
    inner["type"] = ["array", "null"]  # a missing tensor is null; a missing element is not allowed
    inner["description"] = f"tensor of {np.dtype(t.dtype).name}, shape {list(t.shape)}, as nested lists"
    return inner


# What a flow without an input schema takes in a column: what a Table holds. Its operators
# decide the rest (the types of one column must agree across rows, tensors be regular).
_ANY_VALUE = {
    "anyOf": [
        {"type": ["null", "boolean", "string"]},
        {"type": "integer", **_INT64},
        {"type": "number", **_float_bounds(np.dtype(np.float64))},
        {"type": "array", "description": "a tensor as nested lists of numbers or booleans, of one shape"},
    ]
}


def row_schema(schema) -> dict:
    """One row (one query) of a flow's input: its columns, each one required."""
    if schema is None:
        return {
            "type": "object",
            "description": "one query: column name -> value (the flow declares no input schema)",
            "propertyNames": {"minLength": 1, "not": {"enum": ["qid", POS]}},
            "additionalProperties": _ANY_VALUE,
        }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(schema),
        "properties": {c: column_schema(t) for c, t in schema.items()},
    }


_EXAMPLE_MAX_VALUES = 4096  # a bigger tensor has no written example (the page makes one from the schema)


def example_row(schema) -> dict | None:
    """A row the flow's input schema takes (zeros, "text", base64 of b"bytes"), or None
    where there is no schema or a tensor too big to write out."""
    if schema is None:
        return None
    row = {}
    for name, t in schema.items():
        if t.kind == "tensor":
            if int(np.prod(t.shape)) > _EXAMPLE_MAX_VALUES:
                return None
            row[name] = np.zeros(t.shape, dtype=t.dtype).tolist()
        else:
            row[name] = {"int": 0, "float": 0.0, "bool": False, "str": "text", "bytes": "Ynl0ZXM=", "null": None}[
                t.kind
            ]
    return row


def _output_row(plan, observed=None) -> dict:
    """The answer's row: qid and the sink's output columns. A plan knows the names of a
    map's outputs but not their types (operators are Python code); the gateway learns them
    from the first answer it serves (``observed``: column -> ColumnType) and from then on
    this schema says them exactly, like the input's."""
    props: dict = {"qid": {"type": "integer", "description": "the query id of the input row it answers"}}
    if observed:
        # a column all missing in that answer ("null") says nothing of its values' type
        unknown = {"description": "output column (all missing in the first answer)"}
        props.update({c: unknown if t.kind == "null" else column_schema(t) for c, t in observed.items() if c != "qid"})
        return {"type": "object", "properties": props, "required": list(props)}
    names = getattr(plan.stages[plan.sink].nodes[-1].op, "names", None)
    if not names:
        return {
            "type": "object",
            "properties": props,
            "required": ["qid"],
            "description": "output columns: their names and types are shown once the flow has answered",
        }
    props.update(
        {n: {"description": f"output column {n!r} (its type is shown once the flow has answered)"} for n in names}
    )
    return {"type": "object", "properties": props, "required": list(props)}


def _error(description: str, example: dict) -> dict:
    """An error answer: the JSON error body, with an example of it."""
    body = {"schema": {"$ref": "#/components/schemas/Error"}, "example": example}
    return {"description": description, "content": {"application/json": body}}


def _named(error: str, message: str, **extra) -> dict:
    return {"error": error, "message": message, **extra}


# what any route may answer: the connection's limits (http_server.py) and the last resort
_ANY_ROUTE = {
    "408": _error(
        "the request's head or body came too slowly (RequestTimeout)",
        _named("RequestTimeout", "the request body came too slowly"),
    ),
    "431": _error(
        "the request's headers are too large (HeadersTooLarge)",
        _named("HeadersTooLarge", "request headers over the limit"),
    ),
    "500": _error("the gateway failed (InternalError): report it", _named("InternalError", "KeyError: 'x'")),
    "503": _error(
        "the gateway holds as many connections as it takes (TooManyConnections): retry",
        _named("TooManyConnections", "the gateway holds as many connections as it takes; retry"),
    ),
}
_UNAUTHORIZED = {
    "401": _error(
        "missing or wrong bearer token (Unauthorized)", _named("Unauthorized", "missing or wrong bearer token")
    )
}
_UNKNOWN_FLOW = {
    "404": _error(
        "no deployed flow of this name (UnknownFlow)",
        _named("UnknownFlow", "no deployed flow named 'digits'; GET /flows lists them"),
    )
}


def _row_event(row: dict) -> dict:
    return {
        "type": "object",
        "properties": {"qid": {"type": "integer"}, "row": row},
        "required": ["qid", "row"],
    }


_ERROR_EVENT = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "operator": {"type": "string"},
        "qid": {"type": "integer"},
        "status": {"type": "integer"},
    },
    "required": ["error", "message", "status"],
}
_END_EVENT = {
    "type": "object",
    "properties": {
        "end": {"type": "boolean"},
        "rows": {"type": "integer"},
        "trace": {"type": "array", "items": {"type": "array"}},
    },
    "required": ["end", "rows", "trace"],
}


def _invoke_responses(plan, observed, token: bool, max_body_bytes: int | None) -> dict:
    row = _output_row(plan, observed)
    limit = f" of {max_body_bytes} bytes" if max_body_bytes else ""
    answers: dict = {
        "200": {
            "description": "the output rows, in the request's order (JSON, or Arrow IPC when Accept asks for it)",
            "headers": {
                "X-Qid-Start": {
                    "description": "row i of the request became query X-Qid-Start + i",
                    "schema": {"type": "integer"},
                },
                "X-Flowserve-Trace": {
                    "description": "JSON: [stage, executor, ms, batch size] for each stage run",
                    "schema": {"type": "string"},
                },
                "Server-Timing": {"description": "the flow's time in the gateway", "schema": {"type": "string"}},
            },
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {"rows": {"type": "array", "items": row}},
                        "required": ["rows"],
                    }
                },
                "application/vnd.apache.arrow.stream": {"schema": {"type": "string", "format": "binary"}},
                "application/x-ndjson": {
                    "description": "a stream (Accept: application/x-ndjson): one JSON event a line, as rows "
                    "complete: {qid, row} per row; {error, message, operator, qid, status} if the request fails "
                    "(the stream ends there); {end: true, rows, trace} after the last row",
                    "schema": {"oneOf": [_row_event(row), _ERROR_EVENT, _END_EVENT]},
                },
                "text/event-stream": {
                    "description": "the same events as Server-Sent Events (a 'data: ' line each)",
                    "schema": {"type": "string"},
                },
            },
        },
        "400": _error(
            "the body is not rows of the flow's input (the message names the row, the column and the type), "
            "or X-Request-Timeout is not a number of seconds > 0",
            _named("DataTypeError", "column 'x': row 0: 300 does not fit in int8 (integers -128..127)"),
        ),
        **(_UNAUTHORIZED if token else {}),
        **_UNKNOWN_FLOW,
        "413": _error(
            f"the body is over the size limit{limit} (PayloadTooLarge), or its rows are too many or would take "
            "too much memory (RequestTooLargeError): send fewer rows a request",
            _named("PayloadTooLarge", f"body is over the limit{limit}"),
        ),
        "422": _error(
            "an operator refused the row (RowRejectedError), no anyof alternative was valid "
            "(NoValidResultError) or a lookup key is not in the store (LookupKeyError)",
            _named("RowRejectedError", "operator 'check': the image is blank", operator="check", qid=17),
        ),
        **_ANY_ROUTE,
        "500": _error(
            "an operator raised (its name, the exception's type and message), or FlowServe failed",
            _named(
                "OperatorFailedError", "operator 'predict' raised ValueError: bad shape", operator="predict", qid=17
            ),
        ),
        "503": _error(
            "retry: no executor is live, the store is restarting or lost its data, the gateway is stopping "
            "(Retry-After) or holds as many connections as it takes",
            _named("NoExecutorError", "no live executor can run stage 'predict' yet"),
        ),
        "504": _error(
            "the deadline passed (OperatorTimeoutError names the operator that was running)",
            _named("OperatorTimeoutError", "operator 'predict' still ran at the deadline (2 s)", operator="predict"),
        ),
    }
    return dict(sorted(answers.items()))


def _json_answer(description: str, schema: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_FLOW_LIST = {
    "type": "object",
    "required": ["flows"],
    "properties": {
        "flows": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "version", "url", "input_schema"],
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "integer"},
                    "url": {"type": "string"},
                    "input_schema": {"type": ["object", "null"], "description": "column -> {kind, dtype?, shape?}"},
                },
            },
        }
    },
}
_PLAN = {
    "type": "object",
    "required": ["name", "version", "sink", "stages", "explain"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "integer"},
        "sink": {"type": "string"},
        "stages": {"type": "array", "items": {"type": "object"}},
        "explain": {"type": "string"},
    },
}
_HEALTH = {
    "type": "object",
    "required": ["status", "executors", "flows"],
    "properties": {
        "status": {"enum": ["ok", "degraded", "stopping"]},
        "executors": {"type": "integer", "description": "executors that answered a ping lately"},
        "flows": {"type": "array", "items": {"type": "string"}},
    },
}
_READY = {
    "type": "object",
    "required": ["ready", "executors", "flows"],
    "properties": {
        "ready": {"type": "boolean"},
        "executors": {"type": "integer", "description": "executors that answered a ping lately"},
        "flows": {
            "type": "object",
            "description": "flow -> its readiness: version, ready, and a deploy or candidate version under way",
            "additionalProperties": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        },
        "missing": {"type": "array", "items": {"type": "string"}, "description": "what keeps it from being ready"},
        "notes": {"type": "array", "items": {"type": "string"}, "description": "what is under way"},
    },
}
# not ready, and why; or a connection the gateway cannot take (an error, as on any route)
_NOT_READY = _json_answer("not ready, and why", {"anyOf": [_READY, {"$ref": "#/components/schemas/Error"}]})
_LIVE = {"type": "object", "required": ["live"], "properties": {"live": {"const": True}}}
_HISTORY = {
    "type": "object",
    "required": ["flow", "history"],
    "properties": {
        "flow": {"type": "string"},
        "history": {"type": "array", "items": {"type": "object"}, "description": "deploys, promotions, rollbacks"},
    },
}


# POST /flows/{name}/feedback (feedback.py): exactly one of reward (a number in [0, 1]) and
# label (any value but null), the other absent or null, as apply_feedback checks them
_FEEDBACK = {
    "type": "object",
    "required": ["qid"],
    "additionalProperties": False,
    "properties": {
        "qid": {
            "type": "integer",
            "description": "the query the flow answered (X-Qid-Start + the row's index), written without a "
            "fraction: 17, not 17.0",
        },
        "reward": {"type": ["number", "null"], "minimum": 0, "maximum": 1, "description": "1: the answer was right"},
        "label": {"description": "the true answer"},
    },
    "oneOf": [
        {"required": ["reward"], "properties": {"reward": {"type": "number"}, "label": {"type": "null"}}},
        {"required": ["label"], "properties": {"reward": {"type": "null"}, "label": {"not": {"type": "null"}}}},
    ],
}
_FEEDBACK_ANSWER = {
    "type": "object",
    "required": ["flow", "qid", "updated"],
    "properties": {
        "flow": {"type": "string"},
        "qid": {"type": "integer"},
        "updated": {"type": "integer", "description": "how many of the flow's selects took it"},
    },
}


def _feedback_operation(name: str, tags: list, token: bool) -> dict:
    op = _operation(
        f"A reward or the true label for a query a select of {name} answered: it updates the select's weights",
        _json_answer("taken", _FEEDBACK_ANSWER),
        tags=tags,
        token=token,
        extra={
            "400": _error(
                "the body is not one JSON object with qid and one of reward (in [0, 1]) or label (FeedbackError)",
                _named("FeedbackError", "feedback reward must be a number in [0, 1], got 2"),
            ),
            "404": _error(
                "no deployed flow of this name (UnknownFlow), or no record of the query: unknown, given feedback "
                "already, or older than a day (FeedbackError)",
                _named("FeedbackError", "no selection record for qid 17 (unknown, already given feedback, or expired)"),
            ),
            "413": _error(
                "the body is over 64 KiB (PayloadTooLarge)",
                _named("PayloadTooLarge", "feedback body is over 65536 bytes"),
            ),
        },
    )
    op["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {
                "schema": _FEEDBACK,
                "examples": {
                    "label": {"value": {"qid": 0, "label": 1}},
                    "reward": {"value": {"qid": 0, "reward": 1.0}},
                },
            }
        },
    }
    return op


def _operation(summary: str, ok: dict, *, tags: list, token: bool, public: bool = False, extra=None) -> dict:
    op = {"summary": summary, "tags": tags, "responses": {"200": ok, **(extra or {})}}
    if token and not public:
        op["responses"].update(_UNAUTHORIZED)
    op["responses"].update({k: v for k, v in _ANY_ROUTE.items() if k not in op["responses"]})
    if token and public:
        op["security"] = []  # asked without the token
    return op


def openapi_document(
    flows: dict,
    outputs: dict | None = None,
    *,
    token: bool = False,
    public_metrics: bool = False,
    max_rows: int | None = None,
    max_body_bytes: int | None = None,
) -> dict:
    """The document for ``flows`` (name -> deployed flow, ``.plan``); ``outputs``: name ->
    the output columns' types seen in its answers, where known. ``token``: the cluster
    asks for a bearer token (declared as the ``bearer`` scheme, on every route but the
    probes and, with ``public_metrics``, /metrics); ``max_rows``, ``max_body_bytes``: the
    gateway's limits on a request."""
    outputs = outputs or {}
    gateway = ["gateway"]
    paths: dict = {
        "/flows": {
            "get": _operation(
                "Deployed flows and their input schemas",
                _json_answer("the flows", _FLOW_LIST),
                tags=gateway,
                token=token,
            )
        },
        "/livez": {
            "get": _operation(
                "Liveness of the process: it answers",
                _json_answer("alive", _LIVE),
                tags=gateway,
                token=token,
                public=True,
            )
        },
        "/healthz": {
            "get": _operation(
                "Liveness: executors that answer, down, stuck, recycled or crashed",
                _json_answer("the gateway runs", _HEALTH),
                tags=gateway,
                token=token,
                public=True,
            )
        },
        "/readyz": {
            "get": _operation(
                "Readiness: every served flow has a warm replica of every stage",
                _json_answer("ready", _READY),
                tags=gateway,
                token=token,
                public=True,
                extra={"503": _NOT_READY},
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus metrics",
                {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}},
                tags=gateway,
                token=token,
                public=public_metrics,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "This document", _json_answer("OpenAPI 3.1", {"type": "object"}), tags=gateway, token=token
            )
        },
    }
    for name, f in sorted(flows.items()):
        schema = f.plan.input_schema
        row = row_schema(schema)
        rows: dict = {"type": "array", "items": row, "description": "any number of rows, also none"}
        if max_rows:
            rows["maxItems"] = max_rows
        body: dict = {"schema": {"oneOf": [row, rows]}}
        example = example_row(schema)
        if example is not None:
            body["examples"] = {"one row": {"value": example}, "rows": {"value": [example, example]}}
        tag = [f"flow {name}"]
        paths[f"/flows/{name}"] = {
            "post": {
                "summary": f"Run flow {name} on one row (an object) or rows (a list)",
                "description": "Header X-Request-Timeout: <seconds> (a number > 0) sets this request's deadline, "
                "up to the cluster's max_request_timeout_s; Accept: application/vnd.apache.arrow.stream asks for "
                "the answer as Arrow; Accept: application/x-ndjson (or text/event-stream) for a stream of the "
                "rows as they complete.",
                "operationId": f"invoke_{name}",  # unique: a flow's name is letters, digits, "-", "_", "."
                "tags": tag,
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": body,
                        "application/vnd.apache.arrow.stream": {
                            "schema": {"type": "string", "format": "binary"},
                            "description": "an Arrow IPC stream of the input columns (no qid column)",
                        },
                    },
                },
                "responses": _invoke_responses(f.plan, outputs.get(name), token, max_body_bytes),
            },
            "get": _operation(
                f"Plan of {name}: stages, replicas, devices, recent latency",
                _json_answer("the plan", _PLAN),
                tags=tag,
                token=token,
                extra=_UNKNOWN_FLOW,
            ),
        }
        paths[f"/flows/{name}/history"] = {
            "get": _operation(
                f"Recorded deploys, promotions and rollbacks of {name}, newest first",
                _json_answer("the history", _HISTORY),
                tags=tag,
                token=token,
                extra={
                    "503": _error(
                        "the store did not answer (StoreUnavailable): retry",
                        _named("StoreUnavailable", "flow 'digits': history unreadable (connection refused)"),
                    )
                },
            )
        }
        if selects_of([n.op for stage in f.plan.stages.values() for n in stage.nodes]):
            paths[f"/flows/{name}/feedback"] = {"post": _feedback_operation(name, tag, token)}
        paths[f"/readyz/{name}"] = {
            "get": _operation(
                f"Readiness of {name}: a warm replica of every stage",
                _json_answer("ready", _READY),
                tags=tag,
                token=token,
                public=True,
                extra={"503": _NOT_READY, **_UNKNOWN_FLOW},
            )
        }
    doc: dict = {
        "openapi": "3.1.0",
        "info": {
            "title": "FlowServe gateway",
            "version": "1",
            "description": "Each deployed flow is a POST /flows/{name}: a JSON row (object) or rows (list), "
            "or an Arrow IPC stream; the answer has the output columns and each row's qid. "
            "A missing value is null in any column.",
        },
        "paths": paths,
        "components": {"schemas": {"Error": ERROR}},
    }
    if token:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
