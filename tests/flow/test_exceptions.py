"""The exception tree's branches: grouped by what the caller can do; errors carry what
failed (operator, qid, ...) across processes. tests/test_errors_tree.py walks every class
of every package."""

from __future__ import annotations

import pickle

import pytest

import flow
from flow import (
    AccessDeniedError,
    ConfigError,
    ConfigTypeError,
    DataError,
    DataTypeError,
    DeadlineExceededError,
    FeedbackError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    InternalError,
    LookupKeyError,
    NotInstalledError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    RowRejectedError,
    SchemaError,
    UnavailableError,
    UnreachableError,
)

BRANCHES = (FlowDefinitionError, DataError, OperatorError, RetryableError, DeadlineExceededError, InternalError)


@pytest.mark.parametrize(
    "exc, parents",
    [
        (FlowTypeError, (FlowDefinitionError, TypeError)),
        (FlowValueError, (FlowDefinitionError, ValueError)),
        (ConfigError, (FlowDefinitionError, ValueError)),
        (ConfigTypeError, (ConfigError, TypeError)),
        (AccessDeniedError, (FlowDefinitionError,)),
        (NotInstalledError, (FlowDefinitionError, ImportError)),
        (SchemaError, (DataError, ValueError)),
        (DataTypeError, (DataError, TypeError)),
        (RowRejectedError, (DataError,)),  # 422s: the input is what to change
        (NoValidResultError, (DataError,)),
        (LookupKeyError, (DataError, KeyError)),
        (FeedbackError, (DataError, ValueError)),
        (OperatorFailedError, (OperatorError,)),
        (OperatorOutputError, (OperatorError,)),
        (UnreachableError, (RetryableError,)),
        (UnavailableError, (RetryableError,)),
    ],
)
def test_tree(exc, parents):
    for p in parents:
        assert issubclass(exc, p)


def test_branches_do_not_overlap():
    for a in BRANCHES:
        assert a.__bases__ == (FlowError,)
        for b in BRANCHES:
            assert a is b or not issubclass(a, b)
    assert not issubclass(DeadlineExceededError, RetryableError)  # wait longer or give up, not "again"
    assert not issubclass(RejectRow, FlowError)  # users raise it; the runtime turns it into RowRejectedError


@pytest.mark.parametrize(
    "cls", [OperatorFailedError, OperatorOutputError, RowRejectedError, NoValidResultError, LookupKeyError]
)
def test_operator_errors_carry_operator_and_qid_across_pickling(cls):
    e = cls("operator 'net' failed", operator="net", qid=42)
    assert (e.operator, e.qid) == ("net", 42)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and (back.operator, back.qid) == ("net", 42) and str(back) == str(e)


def test_what_was_not_given_reads_as_none():
    e = SchemaError("bad column")
    assert (e.operator, e.qid, e.status, e.body) == (None, None, None, None)
    assert UnreachableError("down", url="redis://kvs:6379/0").url == "redis://kvs:6379/0"


def test_lookup_key_error_message_is_not_quoted():
    assert (
        str(LookupKeyError("operator 'lookup(k)': key 'k' is not in the store"))
        == "operator 'lookup(k)': key 'k' is not in the store"
    )


def test_a_nested_flows_422_keeps_its_status_through_the_outer_operator():
    """A RowRejectedError names its operator: the outer operator passes it on as it is
    (fix the request), not as its own OperatorFailedError (500)."""
    inner = flow.Flow("inner", schema={"x": int})

    def check(row):
        if row.x < 0:
            raise RejectRow("x must be >= 0")
        return row.x

    inner.map(check, names=["y"])
    outer = flow.Flow("outer", schema={"x": int})
    outer.map(lambda row: int(inner.run([{"x": row.x}]).column("y").to_list()[0]), names=["z"])
    with pytest.raises(RowRejectedError, match="operator 'check' rejected the row: x must be >= 0") as e:
        outer.run([{"x": -1}])
    assert e.value.operator == "check"


def test_everything_is_exported():
    for name in flow.__all__:
        assert hasattr(flow, name)
