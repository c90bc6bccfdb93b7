"""The Flow builder: operators return new node handles, so branches are just several handles.

    flow = Flow("cascade")
    img  = flow.map(preprocess, names=["img"])
    fast = img.map(SmallNet, names=["img", "cls", "conf"], batching=True)
    slow = fast.filter(lambda r: r.conf < 0.85).map(BigNet, names=["cls2", "conf2"])
    out  = fast.join(slow, how="left").map(pick, names=["cls"])
    flow.run([{"raw": ...}])

A flow is checked as it is built: unknown columns (where the input schema is known), a
non-callable, a node of another flow, bad argument values each raise a FlowError subclass
that names the operator. Sinks are checked when the flow is run, optimized or deployed.
"""

from __future__ import annotations

import inspect
import keyword
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flow import prediction, targets
from flow.errors import (
    FlowTypeError,
    FlowValueError,
)
from flow.operators import (
    AGGREGATES,
    JOIN_HOWS,
    SYSTEM_PREFIX,
    AggOp,
    AnyOfOp,
    FilterOp,
    JoinOp,
    LookupOp,
    MapOp,
    Operator,
    SourceOp,
    UnionOp,
    callable_name,
    is_generator,
    outside_namespace,
)
from flow.progressive import FirstThenOp
from flow.table import QID, Table
from flow.types import ColumnType


class Node:
    """A handle on one operator of a Flow; call operators on it to build downstream nodes."""

    __slots__ = ("flow", "id", "op", "inputs", "name", "columns")

    def __init__(
        self, flow: Flow, id_: int, op: Operator, inputs: tuple[Node, ...], name: str, columns: tuple[str, ...] | None
    ):
        self.flow = flow
        self.id = id_
        self.op = op
        self.inputs = inputs
        self.name = name
        self.columns = columns  # None when not known before run time (source without schema)

    def __repr__(self) -> str:
        cols = "?" if self.columns is None else ", ".join(self.columns)
        return f"<Node {self.name} ({self.op.kind}) -> [{cols}]>"

    # -- operators ----------------------------------------------------------------------

    def map(
        self,
        fn,
        names: Sequence[str] | str | None = None,
        *,
        init: Callable | None = None,
        col: str | None = None,
        batching: bool = False,
        gpu: bool = False,
        high_variance: bool = False,
        timeout_s: float | None = None,
        cache=None,
        hedge=None,
    ) -> Node:
        """Apply ``fn`` to each row (or, with ``batching=True``, to the whole Table).

        ``fn`` is a function of a row, a class (built once per replica; its ``__call__``
        takes a row or a Table), or a function whose first argument is ``init()``'s
        result. ``col=`` passes one column's value instead of the row. The output has the
        columns ``names`` (plus qid): return one value, or a tuple matching ``names``.
        ``timeout_s=``: in a deployment, a run of this operator that takes longer is
        abandoned and its requests answered 504 naming it (a hung model call); ``flow.run``
        does not enforce it. ``cache=``: memoise outputs per row by the values it reads
        (True, a size, or ``CacheSpec``); ``hedge=``: deployed, send a backup copy to another
        replica when no answer came by ``"p95"`` of the stage's latency (or a delay in s).
        Neither changes a result (flow/prediction.py).

            probs = img.map(Net, names=["cls", "conf"], batching=True, gpu=True)
        """
        label = _check_callable(fn, "map")
        if init is not None:
            _check_callable(init, f"map {label!r} init")
            if inspect.isclass(fn):
                raise FlowTypeError(f"operator map {label!r}: init= goes with a function, not a class")
        names = _check_names(names, label, "map", default=label)
        _check_flags(f"map {label!r}", batching=batching, gpu=gpu, high_variance=high_variance)
        if init is not None:
            _check_arity(init, 0, f"map {label!r}", "init")
        _check_arity(fn, 1 if init is None else 2, f"map {label!r}", "fn")
        if col is not None:
            if not isinstance(col, str):
                raise FlowTypeError(f"operator map {label!r}: col= must be a column name (str), got {col!r}")
            self._need_columns([col], f"map {label!r}", "col")
        if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool)):
            raise FlowTypeError(f"operator map {label!r}: timeout_s must be a number of seconds, got {timeout_s!r}")
        if timeout_s is not None and not 0 < timeout_s < float("inf"):
            raise FlowValueError(f"operator map {label!r}: timeout_s must be > 0 and finite, got {timeout_s!r}")
        if is_generator(fn) and (batching or cache):
            # a generator gives each row any number of output rows: a batch's columns (one
            # value per row) and a cached output per row cannot hold that
            flag = "batching=True" if batching else "cache="
            raise FlowValueError(
                f"operator map {label!r}: a generator function yields rows one input row at a time; "
                f"it does not take {flag}"
            )
        op = MapOp(
            fn=fn,
            names=names,
            init=init,
            col=col,
            batching_=batching,
            gpu_=gpu,
            high_variance_=high_variance,
            timeout_s_=None if timeout_s is None else float(timeout_s),
            cache=prediction.parse_cache(cache, label),
            hedge=prediction.parse_hedge(hedge, label),
        )
        return self.flow._add(op, (self,), label, names)

    def filter(self, pred, *, batching: bool = False) -> Node:
        """Keep the rows for which ``pred(row)`` is True (``batching=True``: pred(table) -> bools)."""
        label = _check_callable(pred, "filter")
        _check_flags(f"filter {label!r}", batching=batching)
        _check_arity(pred, 1, f"filter {label!r}", "pred")
        return self.flow._add(FilterOp(pred=pred, batching_=batching), (self,), label, self.columns)

    def groupby(self, col: str) -> GroupedNode:
        """Group rows by ``col``; follow with ``.agg(fn, col)``."""
        if not isinstance(col, str):
            raise FlowTypeError(f"operator groupby: column must be a str, got {col!r}")
        if col == QID:
            raise FlowValueError(
                "operator groupby: cannot group by qid (rows of one query are never merged "
                "with others' by a rowwise flow); group by a data column"
            )
        self._need_columns([col], "groupby", "column")
        return GroupedNode(self, col)

    def agg(self, fn: str, col: str | None = None, *, name: str | None = None, _by: str | None = None) -> Node:
        """Aggregate the whole Table (count, sum, min, max, mean); one output row."""
        op_name = f"agg {fn}" + (f" by {_by}" if _by else "")
        if fn not in AGGREGATES:
            raise FlowValueError(f"operator {op_name}: unknown aggregate {fn!r}; expected one of {AGGREGATES}")
        if col is None and fn != "count":
            raise FlowValueError(f"operator {op_name}: {fn} needs a column: agg({fn!r}, 'column')")
        if col is not None:
            if not isinstance(col, str):
                raise FlowTypeError(f"operator {op_name}: column must be a str, got {col!r}")
            if col == QID:
                raise FlowValueError(f"operator {op_name}: cannot aggregate the qid column")
            self._need_columns([col], op_name, "column")
        out = name if name is not None else (fn if col is None else f"{fn}_{col}")
        _check_names([out], op_name, "agg", default=None)
        if out == _by:
            raise FlowValueError(f"operator {op_name}: output name {out!r} is the group column; pass name=")
        op = AggOp(fn=fn, col=col, by=_by, name=out)
        columns = ((_by,) if _by else ()) + (out,)
        return self.flow._add(op, (self,), op.label, columns)

    def join(
        self, other: Node, on: str | Sequence[str] = QID, how: str = "inner", suffixes: tuple[str, str] = ("", "_right")
    ) -> Node:
        """Join with another branch on ``on`` (default: qid). ``how``: inner, left, outer.

        Columns both sides have (other than the keys) are renamed with ``suffixes``.
        """
        other = self._check_same_flow(other, "join")
        if how not in JOIN_HOWS:
            raise FlowValueError(f"operator join: how={how!r}; expected one of {JOIN_HOWS}")
        keys = (on,) if isinstance(on, str) else tuple(on) if isinstance(on, (list, tuple)) else ()
        if not keys or not all(isinstance(k, str) for k in keys):
            raise FlowTypeError(f"operator join: on= must be a column name or a list of them, got {on!r}")
        if QID in keys and len(keys) > 1:
            raise FlowValueError("operator join: join on qid alone, or on data columns")
        if (
            not isinstance(suffixes, (tuple, list))
            or len(suffixes) != 2
            or not all(isinstance(s, str) for s in suffixes)
            or suffixes[0] == suffixes[1]
        ):
            raise FlowValueError(f"operator join: suffixes must be two different strings, got {suffixes!r}")
        keys_data = [k for k in keys if k != QID]
        self._need_columns(keys_data, "join", "on")
        other._need_columns(keys_data, "join", "on (right side)")
        columns = None
        if self.columns is not None and other.columns is not None:
            clash = (set(self.columns) & set(other.columns)) - set(keys_data)
            left = [c + suffixes[0] if c in clash else c for c in self.columns]
            right = [c + suffixes[1] if c in clash else c for c in other.columns if c not in keys_data]
            columns = tuple(left + right)
            if len(set(columns)) != len(columns):
                raise FlowValueError(f"operator join: suffixes {suffixes} give duplicate columns {columns}")
        # a list passes the check above too: rebuild the pair as a tuple
        op = JoinOp(on=keys, how=how, suffixes=(suffixes[0], suffixes[1]))
        return self.flow._add(op, (self, other), "join", columns)

    def union(self, *others: Node) -> Node:
        """All rows of this node and the others; their columns must match by name."""
        if not others:
            raise FlowValueError("operator union: needs at least one other node")
        others = tuple(self._check_same_flow(o, "union") for o in others)
        for o in others:
            if self.columns is not None and o.columns is not None and set(self.columns) != set(o.columns):
                raise FlowValueError(
                    f"operator union: columns differ: {list(self.columns)} vs {list(o.columns)} (from {o.name})"
                )
        return self.flow._add(UnionOp(arity=1 + len(others)), (self, *others), "union", self.columns)

    def lookup(
        self, key: str | None = None, *, column: str | None = None, name: str | None = None, missing: str = "error"
    ) -> Node:
        """Add a column read from the KVS: one fixed ``key``, or a per-row key from ``column``.

        ``missing="error"`` (default) fails the query on a missing key; ``"null"`` gives None.
            user = flow.lookup(column="user_id", name="user_vec")
        """
        if (key is None) == (column is None):
            raise FlowValueError("operator lookup: pass either key= (a fixed key) or column= (a per-row key)")
        if key is not None and not isinstance(key, str):
            raise FlowTypeError(f"operator lookup: key must be a str, got {key!r}")
        if missing not in ("error", "null"):
            raise FlowValueError(f"operator lookup: missing={missing!r}; expected 'error' or 'null'")
        if column is not None:
            if not isinstance(column, str) or column == QID:
                raise FlowValueError(
                    f"operator lookup: column= must name a data column holding str keys, got {column!r}"
                )
            self._need_columns([column], f"lookup({column})", "column")
        out = name if name is not None else (key if key is not None else f"{column}_value")
        label = f"lookup({key if key is not None else column})"
        (out,) = _check_names([out], label, "lookup", default=None)
        if self.columns is not None and out in self.columns:
            raise FlowValueError(f"operator {label}: output column {out!r} already exists; pass name=")
        if key is not None:
            why = outside_namespace(key, self.flow.key_prefixes)
            if why is not None:
                raise FlowValueError(f"operator {label}: {why}")
        op = LookupOp(key=key, column=column, name=out, missing=missing, prefixes=self.flow.key_prefixes)
        columns = None if self.columns is None else self.columns + (out,)
        return self.flow._add(op, (self,), label, columns)

    def anyof(
        self,
        *alternatives,
        names: Sequence[str] | str | None = None,
        valid: Callable | None = None,
        batching: bool = False,
        gpu: bool = False,
    ) -> Node:
        """Run the alternatives on the same input; per row, the first valid result wins.

        In a deployment the alternatives race and the first valid answer moves on; locally
        (``flow.run``) all run and the first valid one in argument order is taken. A row for
        which none is valid fails its query (NoValidResultError).
            best = img.anyof(small, medium, large, names=["cls", "conf"], valid=lambda r: r.conf > 0.9)
        """
        if len(alternatives) < 2:
            raise FlowValueError("operator anyof: needs at least two alternatives")
        labels = [_check_callable(f, "anyof") for f in alternatives]
        label = "anyof(" + ",".join(labels) + ")"
        names = _check_names(names, label, "anyof", default=labels[0])
        _check_flags(label, batching=batching, gpu=gpu)
        for f in alternatives:
            _check_arity(f, 1, label, "alternative")
        if valid is not None:
            _check_callable(valid, f"{label} valid")
            _check_arity(valid, 1, label, "valid")
        op = AnyOfOp(alternatives=tuple(alternatives), names=names, valid=valid, batching_=batching, gpu_=gpu)
        return self.flow._add(op, (self,), label, names)

    def first_then(
        self,
        fast,
        slow,
        *,
        names: Sequence[str] | str | None = None,
        when: Callable | None = None,
        batching: bool = False,
        gpu: bool = False,
    ) -> Node:
        """Per row, ``fast``'s output, or ``slow``'s where ``when(fast's row)`` is True (every
        row without ``when``). Both take the input row (the Table with ``batching=True``)
        and return ``names``' values, as map functions do. A streamed answer sends the fast
        row at once (``"final": false`` where the slow one follows) when this is the
        flow's last operator (flow/progressive.py); every other answer is the final one.

            best = img.first_then(small, big, names=["cls", "conf"], when=lambda r: r.conf < 0.9)
        """
        labels = [_check_callable(fast, "first_then"), _check_callable(slow, "first_then")]
        label = f"first_then({labels[0]},{labels[1]})"
        names = _check_names(names, label, "first_then", default=labels[0])
        _check_flags(label, batching=batching, gpu=gpu)
        for fn in (fast, slow):
            _check_arity(fn, 1, label, "branch")
            if is_generator(fn):
                raise FlowValueError(f"operator {label}: a branch answers one row per row; it cannot be a generator")
        if when is not None:
            _check_callable(when, f"{label} when")
            _check_arity(when, 1, label, "when")
        op = FirstThenOp(fast=fast, slow=slow, names=names, when=when, batching_=batching, gpu_=gpu)
        return self.flow._add(op, (self,), label, names)

    def ensemble(self, *others: Node, fn, names: Sequence[str] | str | None = None, deadline_ms=None) -> Node:
        """Combine this node's and ``others``' answers per query: ``fn(answers)`` gets one
        entry per member (its output ``Row``, or ``None`` if it had not answered by the
        deadline) and returns ``names``' values; the output adds ``missing`` (the members
        that had not answered, comma-separated, ``""`` if none). Deployed, the ensemble
        answers at the request's deadline, or ``deadline_ms`` after the first member's
        answer, with what has arrived; ``flow.run`` waits for all.

            out = a.ensemble(b, c, fn=vote, names=["cls"], deadline_ms=20)
        """
        if not others:
            raise FlowValueError("operator ensemble: needs at least one other member node")
        members = (self, *(self._check_same_flow(o, "ensemble") for o in others))
        if len({m.id for m in members}) != len(members):
            raise FlowValueError("operator ensemble: a member is listed twice")
        label = _check_callable(fn, "ensemble")
        names = _check_names(names, label, "ensemble", default=label)
        if prediction.MISSING_COLUMN in names:
            raise FlowValueError(
                f"operator ensemble {label!r}: {prediction.MISSING_COLUMN!r} is the ensemble's own column"
            )
        _check_arity(fn, 1, f"ensemble {label!r}", "fn")
        if deadline_ms is not None:
            if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, (int, float)):
                raise FlowTypeError(f"operator ensemble {label!r}: deadline_ms must be a number, got {deadline_ms!r}")
            if not 0 < deadline_ms < float("inf"):
                raise FlowValueError(f"operator ensemble {label!r}: deadline_ms must be > 0, got {deadline_ms!r}")
            deadline_ms = float(deadline_ms)
        op = prediction.EnsembleOp(fn=fn, names=names, members=tuple(m.name for m in members), deadline_ms=deadline_ms)
        return self.flow._add(op, members, label, names + (prediction.MISSING_COLUMN,))

    def select(
        self,
        models: Sequence,
        names: Sequence[str] | str | None = None,
        *,
        policy: str = "exp4",
        seed: int = 0,
        context: str | None = None,
        eta: float = 0.5,
        explore: float = 0.1,
        threshold: float | None = None,
        default=None,
        batching: bool = False,
        key: str | None = None,
    ) -> Node:
        """Choose one of ``models`` per query (``policy="exp3"``) or combine them all by a
        weighted vote on the first output column (``"exp4"``; the weighted mean if it holds
        probability or score vectors, a tensor column), with weights learned from
        feedback (``POST /flows/{name}/feedback``, or ``flow.prediction.feedback`` in-process)
        and kept in the store per flow and per value of the ``context`` column. Adds a
        ``confidence`` column (Exp4: the share of models agreeing with the answer; Exp3:
        the chosen model's probability); below ``threshold`` the answer is ``default``.
        Exp3's draw is a function of (``seed``, qid): ``flow.run`` is deterministic.

            best = img.select([small, big], names=["cls"], policy="exp4", threshold=0.5, default=-1)
        """
        if isinstance(models, (str, bytes)) or not isinstance(models, Sequence) or len(models) < 2:
            raise FlowValueError(f"operator select: models must be a list of at least two models, got {models!r}")
        labels = [_check_callable(m, "select") for m in models]
        label = "select(" + ",".join(labels) + ")"
        names = _check_names(names, label, "select", default=labels[0])
        if prediction.CONFIDENCE_COLUMN in names:
            raise FlowValueError(f"operator {label}: {prediction.CONFIDENCE_COLUMN!r} is the select's own column")
        if policy not in prediction.POLICIES:
            raise FlowValueError(f"operator {label}: policy={policy!r}; expected one of {prediction.POLICIES}")
        _check_flags(label, batching=batching)
        for m in models:
            _check_arity(m, 1, label, "model")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise FlowTypeError(f"operator {label}: seed must be an int, got {seed!r}")
        for what, v, lo, hi in (("eta", eta, 0, float("inf")), ("explore", explore, 0, 1)):
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not lo <= v <= hi
                or (what == "eta" and v == 0)
            ):
                raise FlowValueError(f"operator {label}: {what} must be a number in ({lo}, {hi}], got {v!r}")
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1
        ):
            raise FlowValueError(f"operator {label}: threshold must be a number in [0, 1], got {threshold!r}")
        if context is not None:
            if not isinstance(context, str):
                raise FlowTypeError(f"operator {label}: context= must be a column name, got {context!r}")
            self._need_columns([context], label, "context")
        key = label if key is None else key
        if not isinstance(key, str) or not key or ":" in key:
            raise FlowValueError(f"operator {label}: key= must be a non-empty str without ':', got {key!r}")
        if any(isinstance(n.op, prediction.SelectOp) and n.op.key == key for n in self.flow.nodes):
            raise FlowValueError(f"operator {label}: another select of this flow keeps its state as {key!r}; pass key=")
        op = prediction.SelectOp(
            models=tuple(models),
            names=names,
            policy=policy,
            flow=self.flow.name,
            key=key,
            context=context,
            seed=seed,
            eta=float(eta),
            explore=float(explore),
            threshold=None if threshold is None else float(threshold),
            default=tuple(default) if isinstance(default, list) else default,
            batching_=batching,
        )
        return self.flow._add(op, (self,), label, names + (prediction.CONFIDENCE_COLUMN,))

    # -- checks -------------------------------------------------------------------------

    def _need_columns(self, cols: Sequence[str], op_name: str, arg: str) -> None:
        if self.columns is None:
            return
        for c in cols:
            if c != QID and c not in self.columns:
                raise FlowValueError(
                    f"operator {op_name}: {arg} {c!r} is not a column of {self.name!r}; "
                    f"its columns are {list(self.columns)}"
                )

    def _check_same_flow(self, other, op_name: str) -> Node:
        if isinstance(other, Flow):  # a Flow stands for its input node
            other = other.source
        if not isinstance(other, Node):
            raise FlowTypeError(
                f"operator {op_name}: expected a node of flow {self.flow.name!r}, got {type(other).__name__}"
            )
        if other.flow is not self.flow:
            raise FlowValueError(
                f"operator {op_name}: node {other.name!r} belongs to flow {other.flow.name!r}, not {self.flow.name!r}"
            )
        return other


class GroupedNode:
    """``node.groupby(col)``: call ``.agg(fn, col)`` to get one row per group."""

    def __init__(self, node: Node, by: str):
        self.node = node
        self.by = by

    def agg(self, fn: str, col: str | None = None, *, name: str | None = None) -> Node:
        """Aggregate per group: count, sum, min, max or mean of ``col``."""
        return self.node.agg(fn, col, name=name, _by=self.by)


class Flow:
    """A dataflow of operators over a Table of queries. The Flow itself is the input node.

    flow = Flow("double", schema={"x": int})
    flow.map(lambda r: r.x * 2, names=["y"])
    flow.run([{"x": 1}, {"x": 2}]).to_pylist()   # [{'qid': 0, 'y': 2}, {'qid': 1, 'y': 4}]
    """

    def __init__(
        self, name: str, schema: Mapping[str, Any] | None = None, *, key_prefixes: Sequence[str] | None = None
    ):
        if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "-_." for ch in name):
            raise FlowValueError(
                f"Flow name must be a non-empty string of letters, digits, '-', '_' or '.', got {name!r}"
            )
        self.name = name
        self.key_prefixes = _check_prefixes(name, key_prefixes)
        self.schema: dict[str, ColumnType] | None = None
        if schema is not None:
            if not isinstance(schema, Mapping):
                raise FlowTypeError(f"Flow {name!r}: schema must be a mapping of column to type, got {schema!r}")
            for col in schema:
                if not isinstance(col, str) or not col:
                    raise FlowValueError(f"Flow {name!r}: schema column names must be non-empty strings, got {col!r}")
                if col == QID:
                    raise FlowValueError(
                        f"Flow {name!r}: schema column 'qid' is reserved for query ids; "
                        f"pass qid='qid' to run() to use an input column as the query ids"
                    )
            self.schema = {c: ColumnType.parse(t, c) for c, t in schema.items()}
        self._lock = threading.Lock()
        self._nodes: list[Node] = []
        self._names: set[str] = set()
        self.source = self._add(SourceOp(), (), "source", tuple(self.schema) if self.schema else None)

    # The Flow is the source: flow.map(...) etc. start branches from the input rows.
    def map(self, *args, **kwargs) -> Node:
        return self.source.map(*args, **kwargs)

    def filter(self, *args, **kwargs) -> Node:
        return self.source.filter(*args, **kwargs)

    def groupby(self, *args, **kwargs) -> GroupedNode:
        return self.source.groupby(*args, **kwargs)

    def agg(self, *args, **kwargs) -> Node:
        return self.source.agg(*args, **kwargs)

    def lookup(self, *args, **kwargs) -> Node:
        return self.source.lookup(*args, **kwargs)

    def anyof(self, *args, **kwargs) -> Node:
        return self.source.anyof(*args, **kwargs)

    def first_then(self, *args, **kwargs) -> Node:
        return self.source.first_then(*args, **kwargs)

    def join(self, *args, **kwargs) -> Node:
        return self.source.join(*args, **kwargs)

    def union(self, *args, **kwargs) -> Node:
        return self.source.union(*args, **kwargs)

    def select(self, *args, **kwargs) -> Node:
        return self.source.select(*args, **kwargs)

    # -- graph ----------------------------------------------------------------------------

    def _add(self, op: Operator, inputs: tuple[Node, ...], label: str, columns) -> Node:
        with self._lock:
            name = label
            n = 2
            while name in self._names:
                name = f"{label}#{n}"
                n += 1
            node = Node(self, len(self._nodes), op, inputs, name, tuple(columns) if columns is not None else None)
            self._nodes.append(node)
            self._names.add(name)
            return node

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes in creation order (a topological order: inputs come first)."""
        return tuple(self._nodes)

    def consumers(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {n.id: [] for n in self._nodes}
        for n in self._nodes:
            for i in n.inputs:
                out[i.id].append(n)
        return out

    def sink(self) -> Node:
        """The one node whose output is the flow's result; FlowValueError if there is not one."""
        if len(self._nodes) == 1:
            raise FlowValueError(f"flow {self.name!r} has no operators: add one, e.g. flow.map(fn, names=[...])")
        consumers = self.consumers()
        sinks = [n for n in self._nodes if not consumers[n.id] and n.op.kind != "source"]
        if len(sinks) != 1:
            names = ", ".join(repr(s.name) for s in sinks)
            raise FlowValueError(
                f"flow {self.name!r} has {len(sinks)} unmerged sinks ({names}); join or union them into one"
            )
        return sinks[0]

    def validate(self) -> Node:
        """Check the flow is complete; returns the sink."""
        return self.sink()

    # -- running ----------------------------------------------------------------------------

    def input_table(self, data, qid=None) -> Table:
        """The request rows as a Table checked against the flow's schema (if it has one)."""
        from flow.validation import check_input

        return check_input(self, data, qid=qid)

    def run(self, data, kvs=None, qid=None) -> Table:
        """Run the flow in-process, unoptimized: the reference meaning of the flow.

        ``data``: one row as a dict (as ``Deployment.invoke`` and an HTTP JSON object take
        it), a list of row dicts, a Table, DataFrame, pyarrow Table or dict of columns
        (``as_rows`` tells one row from a dict of columns).
        ``kvs``: the store lookups read from (a KVS client, or a plain dict, read-only).
        ``qid``: the query ids (a column name such as ``"qid"``, or a sequence); default 0..n-1.

            flow.run({"x": 1}); flow.run(pd.DataFrame({"x": [1, 2]}))
        """
        from flow.context import using_store
        from flow.reference import run_nodes

        sink = self.validate()
        with using_store(kvs):  # operator code may read it via flow.current_store()
            return run_nodes(self, self.input_table(as_rows(data, self.schema), qid=qid), sink, kvs)

    def deploy(
        self,
        cluster=None,
        *,
        optimize: bool = True,
        rules=None,
        options=None,
        timeout_s=None,
        slo=None,
        canary=None,
        shadow=False,
        **serving,
    ):
        """Serve the flow over HTTP; returns a Deployment (``.url``, ``.invoke(rows)``).

        With no ``cluster``, an embedded local cluster is started (or reused).
        ``optimize=False`` deploys one stage per operator; ``rules``/``options`` go to the
        optimizer. ``timeout_s``: this flow's deadline in seconds (default: the cluster's).
        ``slo=SLO(p99_ms=50)`` serves it under a latency objective, sized for
        ``traffic=`` (req/s) from a profile on ``samples=`` rows (docs/slo.md).
        ``canary=0.1`` serves this version beside the one served, answering that share of
        the requests; ``shadow=True`` mirrors every request to it and compares the answers
        (docs/operations.md); ``cluster.promote(name)`` or ``cluster.rollback(name)`` ends it.
            d = flow.deploy(); d.invoke({"x": 1}); d.undeploy()
        """
        target = cluster if cluster is not None else targets.cluster("local")  # flow/targets.py
        if not callable(getattr(target, "deploy", None)):
            raise FlowTypeError(
                f"flow {self.name!r}: deploy(cluster=...) takes a cluster with a deploy(flow, ...) "
                f"method (LocalCluster, KubernetesCluster), got {type(target).__name__}"
            )
        if slo is None and serving:
            raise FlowTypeError(f"flow {self.name!r}: deploy({', '.join(sorted(serving))}=...) needs slo=SLO(...)")
        extra = {"slo": slo, **serving} if slo is not None else {}  # targets without SLOs still work
        if timeout_s is not None:
            extra["timeout_s"] = timeout_s  # likewise: only targets asked for a deadline need to know it
        if canary is not None:
            extra["canary"] = canary  # likewise: only targets asked for a canary or shadow need to know
        if shadow:
            extra["shadow"] = shadow
        return target.deploy(self, optimize=optimize, rules=rules, options=options, **extra)

    def explain(self, *, rules=None, options=None) -> PlanText:
        """The physical plan the optimizer makes of this flow (default rules and options),
        as text: stages, fused operators, replicas, batching, racing, continuations.

            print(flow.explain())     # at a prompt, flow.explain() shows it as is
        """
        return PlanText(targets.planner()(self, rules=rules, options=options).explain())

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, {len(self._nodes) - 1} operators)"


def as_rows(data, schema: Mapping | None = None):
    """``data`` as ``flow.run`` and ``Deployment.invoke`` read it: one dict is one row (as an
    HTTP JSON object is), in a list of its own, unless it is a dict of columns, which is
    passed on as it is, as is anything else (a list of rows, a Table, a DataFrame).

    With a ``schema``, a dict is a dict of columns when each of its schema columns holds
    one more dimension than a row's value does (``{"x": [1, 2]}`` for an int column,
    ``{"img": images}`` for a (28, 28) tensor column); without one, when every value is a
    sequence (a list, tuple, Series or array of one dimension or more).

        as_rows({"x": 1}, {"x": ColumnType.scalar("int")})        # [{"x": 1}]
        as_rows({"x": [1, 2]}, {"x": ColumnType.scalar("int")})   # {"x": [1, 2]}
    """
    if not isinstance(data, Mapping) or not data:
        return [data] if isinstance(data, Mapping) else data
    if schema:
        given = [(data[n], t) for n, t in schema.items() if data.get(n) is not None]
        if given and all(_depth(v) == _row_depth(t) + 1 for v, t in given):
            return data
        if given:
            return [data]
    return data if all(_depth(v) >= 1 for v in data.values()) else [data]


def _row_depth(t) -> int:
    """Dimensions of one row's value of a column of type ``t`` (0: a scalar)."""
    shape = getattr(t, "shape", ())
    return len(shape) if getattr(t, "kind", None) == "tensor" else 0


def _depth(value) -> int:
    """Dimensions of a value: an array's ndim, a list's one more than its first item's."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return 0
    ndim = getattr(value, "ndim", None)  # numpy arrays, pandas Series, torch tensors
    if isinstance(ndim, int):
        return ndim
    if isinstance(value, (list, tuple)):
        return 1 + (_depth(value[0]) if value else 0)
    return 0


class PlanText(str):
    """A plan's text that a prompt shows as text (its repr is itself, not a quoted string)."""

    def __repr__(self) -> str:
        return str(self)


def _check_prefixes(flow: str, prefixes) -> tuple[str, ...] | None:
    """``key_prefixes``: the key namespaces the flow's lookups may read (None: any user key)."""
    if prefixes is None:
        return None
    if isinstance(prefixes, str) or not all(isinstance(p, str) and p for p in prefixes):
        raise FlowTypeError(f"Flow {flow!r}: key_prefixes must be a list of non-empty strings, got {prefixes!r}")
    prefixes = tuple(prefixes)
    if not prefixes:
        raise FlowValueError(
            f"Flow {flow!r}: key_prefixes is empty (no lookup could read anything); pass None for any user key"
        )
    bad = [p for p in prefixes if p.startswith(SYSTEM_PREFIX) or SYSTEM_PREFIX.startswith(p)]
    if bad:
        raise FlowValueError(f"Flow {flow!r}: key prefix {bad[0]!r} reaches the runtime's own keys ({SYSTEM_PREFIX}*)")
    return prefixes


def _check_flags(op_name: str, **flags) -> None:
    for flag, v in flags.items():
        if not isinstance(v, bool):
            raise FlowTypeError(f"operator {op_name}: {flag}= must be a bool, got {v!r}")


def _check_arity(fn, nargs: int, op_name: str, what: str) -> None:
    """Fail early if ``fn`` surely cannot be called with ``nargs`` positional arguments.

    A class is built with no arguments, then its instances are called with ``nargs``.
    Callables without a readable signature (some builtins) are let through.
    """
    if inspect.isclass(fn):
        _bind_or_fail(fn, 0, op_name, f"{what} class {fn.__name__!r} must be constructible without arguments")
        if not any("__call__" in vars(k) for k in fn.__mro__ if k is not object):
            raise FlowTypeError(f"operator {op_name}: {what} class {fn.__name__!r} has no __call__ method")
        _bind_or_fail(fn.__call__, nargs + 1, op_name, f"{what} {fn.__name__}.__call__ must take {nargs} argument(s)")
    else:
        _bind_or_fail(fn, nargs, op_name, f"{what} {callable_name(fn)!r} must take {nargs} positional argument(s)")


def _bind_or_fail(fn, nargs: int, op_name: str, message: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*([None] * nargs))
    except TypeError as e:
        raise FlowTypeError(f"operator {op_name}: {message} ({e})") from None


def _check_callable(fn, op_name: str) -> str:
    if not callable(fn):
        raise FlowTypeError(f"operator {op_name}: expected a function or class, got {type(fn).__name__} {fn!r:.60}")
    return callable_name(fn)


def _check_names(names, label: str, op_name: str, default: str | None) -> tuple[str, ...]:
    if names is None:
        if default is None or not default.isidentifier() or keyword.iskeyword(default) or default == QID:
            raise FlowValueError(f"operator {op_name} {label!r}: pass names=[...] for its output columns")
        names = [default]
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise FlowValueError(f"operator {op_name} {label!r}: names= is empty")
    for n in names:
        if not isinstance(n, str) or not n.isidentifier() or keyword.iskeyword(n):
            raise FlowValueError(f"operator {op_name} {label!r}: column name {n!r} is not a valid identifier")
        if n == QID:
            raise FlowValueError(f"operator {op_name} {label!r}: 'qid' is reserved for query ids")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise FlowValueError(f"operator {op_name} {label!r}: duplicate column name {dup!r}")
    return tuple(names)
