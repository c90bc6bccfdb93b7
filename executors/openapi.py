"""The gateway's OpenAPI 3.1 document, with one path per deployed flow."""

from __future__ import annotations

_ERROR = {"type": "object", "properties": {
    "error": {"type": "string"}, "message": {"type": "string"},
    "operator": {"type": "string"}, "qid": {"type": "integer"}}, "required": ["error", "message"]}

_JSON_TYPES = {"int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
               "str": {"type": "string"}, "bytes": {"type": "string", "contentEncoding": "base64"}}


def _column_schema(t) -> dict:
    if t.kind == "tensor":
        inner: dict = {"type": "number"}
        for dim in reversed(t.shape):
            inner = {"type": "array", "items": inner, "minItems": dim, "maxItems": dim}
        return inner
    return dict(_JSON_TYPES.get(t.kind, {}))


def _row_schema(schema) -> dict:
    if schema is None:
        return {"type": "object", "description": "one query: column name -> value"}
    return {"type": "object", "additionalProperties": False, "required": list(schema),
            "properties": {c: _column_schema(t) for c, t in schema.items()}}


def _responses() -> dict:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    out = {"200": {"description": "output rows (JSON, or Arrow IPC when Accept asks for it)",
                   "content": {"application/json": {"schema": {"type": "object", "properties": {
                       "rows": {"type": "array", "items": {"type": "object"}}}}},
                               "application/vnd.apache.arrow.stream": {}}}}
    for code, what in (("400", "malformed body or schema mismatch"), ("401", "missing or wrong bearer token"),
                       ("404", "unknown flow"), ("413", "body over the size limit"),
                       ("422", "an operator rejected the row"), ("500", "an operator raised"),
                       ("503", "no executor"), ("504", "deadline exceeded")):
        out[code] = dict(err, description=what)
    return out


def openapi_document(flows: dict) -> dict:
    paths = {
        "/flows": {"get": {"summary": "Deployed flows and their input schemas", "responses": {"200": {"description": "ok"}}}},
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "ok"}}}},
    }
    for name, f in sorted(flows.items()):
        row = _row_schema(f.plan.input_schema)
        paths[f"/flows/{name}"] = {
            "post": {"summary": f"Run flow {name}", "operationId": f"invoke_{name}".replace("-", "_").replace(".", "_"),
                     "requestBody": {"required": True, "content": {
                         "application/json": {"schema": {"oneOf": [row, {"type": "array", "items": row}]}},
                         "application/vnd.apache.arrow.stream": {}}},
                     "responses": _responses()},
            "get": {"summary": f"Plan of {name}, with replicas and latency", "responses": {"200": {"description": "ok"}}},
        }
    return {"openapi": "3.1.0", "info": {"title": "FlowServe gateway", "version": "1"},
            "paths": paths, "components": {"schemas": {"Error": _ERROR}}}
