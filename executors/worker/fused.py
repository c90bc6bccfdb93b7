"""A fused stage's operators run back to back as one compiled chain (``BoundStage`` uses it).

The generic loop hands each operator full Tables and lets it check them: every map
re-checks its input, builds its output Table through the constructor (a dict copy, a length
check per column), a join on qid re-derives which columns go where. In a fused stage all
of that is known once: ``FusedChain`` compiles the stage's nodes into steps over numbered
slots (no name lookups), and the common shapes take a short path:

- a batching map whose function returns numpy arrays (one per output column, one value
  per row): each array is checked and typed once (``build_column``: the NaN mask, the
  storage dtype) and the output is assembled without the constructor's re-checks; the
  qid array is handed on as it is (a map keeps its input's qids). A torch tensor of two
  or more dimensions stays the tensor (``flow.table.TorchColumn``): on a GPU executor the
  next operator or stage there takes it from GPU memory (``table.tensor(name)``), and it
  is copied to the host only when read as numpy or sent to another process;
- a join on qid of two branches of the same rows (both keep the same qid array, as maps
  do): the output's columns are the two inputs' columns renamed by a mapping computed
  once per pair of input column lists; no row is compared or copied.

Anything else (other operators, cached operators, a map returning a DataFrame, a dict, a
Table, lists, wrong lengths, a join of other rows) runs the operator's own code, so its
rows and errors are exactly ``flow.run``'s. tests/executors/test_fused.py checks the chain
against the generic loop and ``flow.run``.

A streamed request's sink stage whose generator map is followed only by a chain of
row-wise operators (``FusedChain.yields``) runs output by output (``each_output``): each
value the generator yields goes through the operators after it as a one-row Table and is
handed on (executors/worker/progress.py sends it to the gateway) before the generator
resumes; the stage's output is those Tables put together.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flow.errors import DataTypeError, OperatorOutputError
from flow.operators import (
    BoundOperator,
    _BoundJoin,
    _BoundMap,
    _columns_from_values,
    _distinct,
    _invoke,
    arity_error,
    batch_output,
    each_generated,
)
from flow.table import Column, Row, Table, built_column, is_torch_tensor, torch_column
from flow.types import ColumnType, build_column

ENABLED = True  # tests compare the compiled chain against the generic loop by turning it off


class FusedChain:
    """The compiled form of a stage's operators: ``chain(inputs, store, on_node)``."""

    def __init__(self, nodes: Sequence, bound: Sequence[BoundOperator]):
        slot = {node.name: i for i, node in enumerate(nodes)}
        self.steps = []
        for node, b in zip(nodes, bound):
            # a stage input "@k" is slot -1-k; a node's output is its position
            ins = tuple(-1 - int(i[1:]) if i.startswith("@") else slot[i] for i in node.inputs)
            self.steps.append((node, _step(b), ins))
        self.size = len(self.steps)
        # the stage's generator whose outputs may leave one by one, by position, or None
        self.yields = _yield_point(nodes, bound)

    def __call__(self, inputs: Sequence[Table], store=None, on_node=None) -> Table:
        out: list = [None] * self.size
        last = None
        for k, (node, step, ins) in enumerate(self.steps):
            if on_node is not None:
                on_node(node)
            last = out[k] = step([inputs[-1 - i] if i < 0 else out[i] for i in ins], store)
        return last

    def each_output(self, inputs: Sequence[Table], store, on_node, emit) -> Table:
        """The chain's output (as ``self(inputs, ...)``), its generator's outputs (at
        ``self.yields``) going through the operators after it one at a time: ``emit(rows)``
        gets each one's rows (one input row's qid; none filtered out) before the generator
        resumes. ``on_node`` is told of the generator again each time it resumes."""
        g = self.yields
        out: list = [None] * self.size
        for k, (node, step, ins) in enumerate(self.steps[:g]):
            if on_node is not None:
                on_node(node)
            out[k] = step([inputs[-1 - i] if i < 0 else out[i] for i in ins], store)
        gen, b, (i,) = self.steps[g]
        source = inputs[-1 - i] if i < 0 else out[i]
        after = self.steps[g + 1 :]
        parts = []
        if on_node is not None:
            on_node(gen)
        for rows in each_generated(b, source):
            for node, step, _ins in after:
                if on_node is not None:
                    on_node(node)
                rows = step([rows], store)
            if len(rows):
                emit(rows)
                parts.append(rows)
            if after and on_node is not None:
                on_node(gen)
        if not parts:  # no row came out: the operators' own empty output (their columns, no rows)
            rows = b([source.take(np.zeros(0, dtype=np.int64))], store)
            for _node, step, _ins in after:
                rows = step([rows], store)
            return rows
        try:
            return Table.concat(parts)
        except DataTypeError as e:  # outputs of types that do not go together (flow.run fails on them too)
            raise OperatorOutputError(f"operator {gen.name!r}: {e}", operator=gen.name) from None


def _yield_point(nodes: Sequence, bound: Sequence[BoundOperator]) -> int | None:
    """The position of the stage's first generator map when every operator after it is
    row-wise and reads the one before it (so one yielded value can go through them alone,
    giving the rows the whole Table would); None for any other stage."""
    g = next((k for k, b in enumerate(bound) if type(b) is _BoundMap and b.op.generates), None)
    if g is None:
        return None
    for k in range(g + 1, len(nodes)):
        if not nodes[k].op.rowwise or tuple(nodes[k].inputs) != (nodes[k - 1].name,):
            return None
    ins = nodes[g].inputs
    return g if len(ins) == 1 else None


def _step(b: BoundOperator):
    """The callable that runs ``b`` in a chain: a short path for the common shapes, else ``b``."""
    kind = type(b)
    if kind is _BoundMap:
        if b.op.generates:
            return b  # several rows per row: the generic path (flow/operators.py)
        return _BatchMap(b) if b.op.batching else _RowMap(b)
    on = b.op.on if kind is _BoundJoin else None
    if kind is _BoundJoin and ((on,) if isinstance(on, str) else tuple(on)) == ("qid",):
        return _SameRowsJoin(b)
    return b


class _BatchMap:
    """A batching map: numpy arrays out become columns with one check each."""

    __slots__ = ("b", "name", "call", "names", "col", "k")

    def __init__(self, b: _BoundMap):
        self.b, self.name, self.call = b, b.name, b.call
        self.names, self.col, self.k = tuple(b.op.names), b.op.col, len(b.op.names)

    def __call__(self, inputs, store=None):
        (table,) = inputs
        qid = table._qid
        n = len(qid)
        col = self.col
        if n == 0 or (col is not None and col not in table._cols):
            return self.b(inputs, store)  # the generic code's empty output, or its SchemaError
        name = self.name
        result = _invoke(name, self.call, table if col is None else table._cols[col].to_numpy(), None)
        if self.k == 1:
            values = (result,) if type(result) is np.ndarray or is_torch_tensor(result) else None
        elif (type(result) is tuple or type(result) is list) and len(result) == self.k:
            values = result
        else:
            values = None
        cols = {}
        if values is not None:
            for c, v in zip(self.names, values):
                if type(v) is np.ndarray:
                    column = _array_column(v, n)
                elif is_torch_tensor(v):  # stays the tensor (on its device), or else this column alone goes to the host
                    column = torch_column(v, n)
                    if column is None:
                        column = _host_column(v, n)
                else:
                    column = None
                if column is None:
                    break
                cols[c] = column
            else:
                return Table.built(cols, qid)
        # anything else: the generic checks, errors and conversions
        return batch_output(name, self.names, table, result)


def _array_column(v: np.ndarray, n: int) -> Column | None:
    """The column ``build_column`` makes of a numpy array of ``n`` rows that is already in a
    storage form (contiguous; int64, float64 or bool, or a numeric tensor): the same type,
    the array itself, the NaN mask of a float one. None for any other array (the generic
    path converts it, or names what is wrong with it)."""
    if v.ndim == 0 or len(v) != n or not v.flags.c_contiguous:
        return None
    dt = v.dtype
    if v.ndim > 1:
        if dt.kind not in "biuf":
            return None
        return built_column(ColumnType.tensor(dt, v.shape[1:]), v, None)
    ctype = _SCALARS.get(dt)
    if ctype is None:
        return None
    if ctype is _FLOAT:
        if n == 1:
            x = v.item(0)
            if x != x:  # NaN: a missing value
                return Column(ctype, v, np.zeros(1, dtype=bool))
        else:
            nan = np.isnan(v)
            if np.count_nonzero(nan):
                return Column(ctype, v, ~nan)
    return built_column(ctype, v, None)


def _host_column(v, n: int) -> Column | None:
    """The column ``batch_output`` makes of a torch tensor that cannot stay one (1-d: a
    scalar column; a dtype numpy lacks), converted on its own so that the output's other
    tensors stay where they are; None where the generic path has something to say."""
    try:
        ctype, arr, valid = build_column(v.detach().cpu().numpy(), "")
    except Exception:  # the generic path converts it again and names what is wrong
        return None
    return built_column(ctype, arr, valid) if len(arr) == n else None


_FLOAT = ColumnType.scalar("float")
_SCALARS = {np.dtype(np.int64): ColumnType.scalar("int"), np.dtype(np.float64): _FLOAT}
_SCALARS[np.dtype(np.bool_)] = ColumnType.scalar("bool")


def _values_column(values: list) -> Column | None:
    """The column ``build_column`` makes of a row-wise map's values when they are all Python
    floats, all Python ints (not bools) that fit in int64, or all Python strings; None
    otherwise."""
    first = type(values[0])
    if first is not float and first is not int and first is not str:
        return None
    for x in values:
        if type(x) is not first:
            return None
    if first is str:
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return built_column(_STR, arr, None)
    if first is int:
        for x in values:
            if not _INT64_MIN <= x <= _INT64_MAX:
                return None
        return built_column(_INT, np.array(values, dtype=np.int64), None)
    arr = np.array(values, dtype=np.float64)
    missing = [x != x for x in values]  # NaN: a missing value
    if any(missing):
        return Column(_FLOAT, arr, ~np.array(missing, dtype=bool))
    return built_column(_FLOAT, arr, None)


def _value_column(x) -> Column | None:
    """``_values_column([x])``: one row's value as its column, without the list's passes."""
    t = type(x)
    if t is float:
        arr = np.array([x], dtype=np.float64)
        if x != x:  # NaN: a missing value
            return Column(_FLOAT, arr, np.zeros(1, dtype=bool))
        return built_column(_FLOAT, arr, None)
    if t is int:
        if not _INT64_MIN <= x <= _INT64_MAX:
            return None
        return built_column(_INT, np.array([x], dtype=np.int64), None)
    if t is str:
        arr = np.empty(1, dtype=object)
        arr[0] = x
        return built_column(_STR, arr, None)
    return None


_INT = ColumnType.scalar("int")
_STR = ColumnType.scalar("str")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _RowMap:
    """A row-wise map on whole rows: one Row per row, the values gathered per column."""

    __slots__ = ("b", "name", "call", "names", "k")

    def __init__(self, b: _BoundMap):
        self.b, self.name, self.call = b, b.name, b.call
        self.names, self.k = tuple(b.op.names), len(b.op.names)

    def __call__(self, inputs, store=None):
        (table,) = inputs
        qid = table._qid
        if self.b.op.col is not None or len(qid) == 0:
            return self.b(inputs, store)
        if len(qid) == 1:
            return self._one(table, qid)
        name, call, k = self.name, self.call, self.k
        results = []
        for i, q in enumerate(qid.tolist()):
            r = _invoke(name, call, Row(table, i), q)
            if k > 1 and not ((type(r) is tuple or isinstance(r, (tuple, list))) and len(r) == k):
                raise arity_error(name, self.names, r, q)
            results.append(r)
        outputs = [results] if k == 1 else [list(c) for c in zip(*results)]
        cols = {}
        for c, values in zip(self.names, outputs):
            column = _values_column(values)
            # a column the short way does not take (arrays, None, mixed types) alone by the
            # general one, which names what is wrong: the columns before it were plain values
            # that it would have taken, so the first error is the general path's first
            cols[c] = column if column is not None else _columns_from_values(name, (c,), (values,), None)[c]
        return Table.built(cols, qid)

    def _one(self, table: Table, qid: np.ndarray) -> Table:
        """A one-row input (a relayed request's): the loop above for one row, its one value
        per column built by ``_value_column`` (the column ``_values_column`` makes of it)."""
        name, k = self.name, self.k
        q = qid.item(0)
        r = _invoke(name, self.call, Row(table, 0), q)
        if k == 1:
            values: Sequence = (r,)
        elif (type(r) is tuple or isinstance(r, (tuple, list))) and len(r) == k:
            values = r
        else:
            raise arity_error(name, self.names, r, q)
        cols = {}
        for c, v in zip(self.names, values):
            column = _value_column(v)
            cols[c] = column if column is not None else _columns_from_values(name, (c,), ([v],), None)[c]
        return Table.built(cols, qid)


class _SameRowsJoin:
    """A join on qid: two branches of the same rows (one qid array, each qid once) pair row
    i with row i, so the output is the inputs' columns, renamed once per column lists."""

    __slots__ = ("b", "plans")

    def __init__(self, b: _BoundJoin):
        self.b = b
        self.plans: dict = {}  # (left columns, right columns) -> [(out name, side, name)] or None

    def __call__(self, inputs, store=None):
        left, right = inputs
        lq = left._qid
        if lq is not right._qid or not _distinct(lq):
            return self.b(inputs, store)
        lcols, rcols = left._cols, right._cols
        key = (tuple(lcols), tuple(rcols))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = _join_plan(key[0], key[1], self.b.op.suffixes)
            if len(self.plans) > 64:  # a stage sees few column lists; never grow without bound
                self.plans.clear()
        if plan is False:  # a clash the suffixes do not resolve: the generic code names it
            return self.b(inputs, store)
        cols: dict[str, Column] = {}
        for out, side, c in plan:
            cols[out] = (lcols if side == 0 else rcols)[c]
        return Table.built(cols, lq)


def _join_plan(left: tuple, right: tuple, suffixes) -> list | bool:
    """Where a qid join's output columns come from (flow.operators._assemble's rule: left
    columns, then right ones, clashing names suffixed); False if two outputs would clash."""
    lsuf, rsuf = suffixes
    clash = set(left) & set(right)
    plan = [(c + lsuf if c in clash else c, 0, c) for c in left]
    plan += [(c + rsuf if c in clash else c, 1, c) for c in right]
    if len({out for out, _, _ in plan}) != len(plan):
        return False
    return plan
