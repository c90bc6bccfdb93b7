"""The exception tree: grouped by what the caller can do; run-time errors carry operator and qid."""

from __future__ import annotations

import pickle

import pytest

import flow
from flow import (
    DataError,
    DataTypeError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    ForeignNodeError,
    LookupKeyError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    RowRejectedError,
    SchemaError,
    SinkError,
    UnknownColumnError,
)


@pytest.mark.parametrize(
    "exc, parents",
    [
        (FlowDefinitionError, (FlowError,)),
        (FlowTypeError, (FlowDefinitionError, TypeError)),
        (FlowValueError, (FlowDefinitionError, ValueError)),
        (UnknownColumnError, (FlowValueError,)),
        (SinkError, (FlowValueError,)),
        (ForeignNodeError, (FlowDefinitionError,)),
        (DataError, (FlowError,)),
        (SchemaError, (DataError, ValueError)),
        (DataTypeError, (DataError, TypeError)),
        (OperatorError, (FlowError,)),
        (OperatorFailedError, (OperatorError,)),
        (OperatorOutputError, (OperatorError,)),
        (RowRejectedError, (OperatorError,)),
        (NoValidResultError, (OperatorError,)),
        (LookupKeyError, (OperatorError, KeyError)),
        (RetryableError, (FlowError,)),
    ],
)
def test_tree(exc, parents):
    for p in parents:
        assert issubclass(exc, p)


def test_groups_do_not_overlap():
    groups = (FlowDefinitionError, DataError, OperatorError)
    for a in groups:
        for b in groups:
            assert a is b or not issubclass(a, b)
    assert not issubclass(RejectRow, FlowError)  # users raise it; the runtime turns it into RowRejectedError


@pytest.mark.parametrize(
    "cls", [OperatorFailedError, OperatorOutputError, RowRejectedError, NoValidResultError, LookupKeyError]
)
def test_operator_errors_carry_operator_and_qid_across_pickling(cls):
    e = cls("operator 'net' failed", operator="net", qid=42)
    assert (e.operator, e.qid) == ("net", 42)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and (back.operator, back.qid) == ("net", 42) and str(back) == str(e)


def test_lookup_key_error_message_is_not_quoted():
    assert (
        str(LookupKeyError("operator 'lookup(k)': key 'k' is not in the store"))
        == "operator 'lookup(k)': key 'k' is not in the store"
    )


def test_everything_is_exported():
    for name in flow.__all__:
        assert hasattr(flow, name)
