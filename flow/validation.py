"""Checking request data against a flow's input schema, with errors that name the column."""

from __future__ import annotations

import numpy as np

from flow.errors import DataTypeError, SchemaError
from flow.table import Table


def check_input(flow, data, qid=None) -> Table:
    """Build the input Table; with a flow schema, missing/extra columns and types are errors."""
    schema = flow.schema
    table = Table.from_any(data, qid=qid, schema=schema)
    if qid is not None and isinstance(data, Table):  # from_any returns a Table as it is
        from flow.table import _make_qids

        table = table.with_qid(_make_qids(qid, len(table)))
    check_unique_qids(flow.name, table)
    if schema is None:
        return table
    return check_schema(flow.name, schema, table)


def check_unique_qids(flow_name: str, table: Table) -> None:
    """Every row of a request is its own query: its qids must be unique."""
    qids = np.sort(table.qid)
    dup = np.flatnonzero(qids[1:] == qids[:-1])
    if len(dup):
        raise SchemaError(
            f"flow {flow_name!r}: column 'qid': query ids must be unique in a request; "
            f"{int(qids[dup[0]])} appears more than once"
        )


def check_schema(flow_name: str, schema, table: Table) -> Table:
    """The input columns of ``table`` in schema order; missing/extra/mistyped columns are errors."""
    missing = [c for c in schema if c not in table.columns]
    if missing:
        raise SchemaError(f"flow {flow_name!r}: input is missing column(s) {missing}; expected {_describe(schema)}")
    extra = [c for c in table.columns if c not in schema]
    if extra:
        raise SchemaError(f"flow {flow_name!r}: unexpected input column(s) {extra}; expected {_describe(schema)}")
    cast = {}
    for name, want in schema.items():
        col = table.column(name)
        got = col.type
        if got == want:
            continue
        if (
            got.kind == "null"
            or (got.kind == "int" and want.kind == "float")
            or (
                got.kind == want.kind == "tensor"
                and got.shape == want.shape
                and np.can_cast(got.dtype, want.dtype, casting="safe")
            )
        ):
            cast[name] = col.as_type(want)  # all missing, or a lossless widening
            continue
        raise DataTypeError(f"flow {flow_name!r}: column {name!r} should be {want}, got {got}")
    if not cast and table.columns == tuple(schema):
        return table  # the usual request: typed and ordered as the schema says already
    return table.with_columns(cast).select(list(schema))


def _describe(schema) -> str:
    return "{" + ", ".join(f"{c}: {t}" for c, t in schema.items()) + "}"
