"""The gateway's OpenAPI 3.1 document, with one path per deployed flow."""

from __future__ import annotations

_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "message": {"type": "string"},
        "operator": {"type": "string"},
        "qid": {"type": "integer"},
    },
    "required": ["error", "message"],
}

_JSON_TYPES = {
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "str": {"type": "string"},
    "bytes": {"type": "string", "contentEncoding": "base64"},
}


def _element_schema(dtype) -> dict:
    """A tensor element: integer dtypes with their bounds (uint8 pixels are 0..255)."""
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    if dtype.kind == "b":
        return {"type": "boolean"}
    return {"type": "number"}


def type_doc(t) -> dict:
    """A column type as GET /flows shows it: dtypes by name ("uint8", not "|u1")."""
    import numpy as np

    if t.kind == "tensor":
        return {"kind": "tensor", "dtype": np.dtype(t.dtype).name, "shape": list(t.shape)}
    return {"kind": t.kind}


def _column_schema(t) -> dict:
    if t.kind == "tensor":
        inner: dict = _element_schema(t.dtype)
        for dim in reversed(t.shape):
            inner = {"type": "array", "items": inner, "minItems": dim, "maxItems": dim}
        return inner
    return dict(_JSON_TYPES.get(t.kind, {}))


def _row_schema(schema) -> dict:
    if schema is None:
        return {"type": "object", "description": "one query: column name -> value"}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(schema),
        "properties": {c: _column_schema(t) for c, t in schema.items()},
    }


def _output_row(plan, observed=None) -> dict:
    """The answer's row: qid and the sink's output columns. A plan knows the names of a
    map's outputs but not their types (operators are Python code); the gateway learns them
    from the first answer it serves (``observed``: column -> ColumnType) and from then on
    this schema says them exactly, like the input's."""
    props = {"qid": {"type": "integer", "description": "the query id of the input row it answers"}}
    if observed:
        props.update({c: _column_schema(t) for c, t in observed.items() if c != "qid"})
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


def _responses(plan=None, observed=None) -> dict:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    row = _output_row(plan, observed) if plan is not None else {"type": "object"}
    out = {
        "200": {
            "description": "output rows (JSON, or Arrow IPC when Accept asks for it)",
            "content": {
                "application/json": {
                    "schema": {"type": "object", "properties": {"rows": {"type": "array", "items": row}}}
                },
                "application/vnd.apache.arrow.stream": {},
            },
        }
    }
    for code, what in (
        ("400", "malformed body or schema mismatch"),
        ("401", "missing or wrong bearer token"),
        ("404", "unknown flow"),
        ("413", "body over the size limit"),
        ("422", "an operator rejected the row"),
        ("500", "an operator raised"),
        ("503", "no executor"),
        ("504", "deadline exceeded"),
    ):
        out[code] = dict(err, description=what)
    return out


def openapi_document(flows: dict, outputs: dict | None = None) -> dict:
    """``flows``: name -> deployed flow (``.plan``); ``outputs``: name -> the output
    columns' types seen in its answers, where known."""
    outputs = outputs or {}
    paths = {
        "/docs": {
            "get": {"summary": "This document as an interactive page", "responses": {"200": {"description": "ok"}}}
        },
        "/flows": {
            "get": {"summary": "Deployed flows and their input schemas", "responses": {"200": {"description": "ok"}}}
        },
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
        "/readyz": {
            "get": {
                "summary": "Readiness: every served flow has a replica on an executor that answers",
                "responses": {"200": {"description": "ready"}, "503": {"description": "not ready, and why"}},
            }
        },
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "ok"}}}},
        "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "ok"}}}},
    }
    for name, f in sorted(flows.items()):
        row = _row_schema(f.plan.input_schema)
        paths[f"/flows/{name}"] = {
            "post": {
                "summary": f"Run flow {name}",
                "operationId": f"invoke_{name}".replace("-", "_").replace(".", "_"),
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"oneOf": [row, {"type": "array", "items": row}]}},
                        "application/vnd.apache.arrow.stream": {},
                    },
                },
                "responses": _responses(f.plan, outputs.get(name)),
            },
            "get": {
                "summary": f"Plan of {name}, with replicas and latency",
                "responses": {"200": {"description": "ok"}},
            },
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "FlowServe gateway", "version": "1"},
        "paths": paths,
        "components": {"schemas": {"Error": _ERROR}},
    }
