"""Generated flows, inputs and KVS contents for differential tests (Hypothesis).

Every generated flow is valid and runs without errors on its inputs, and uses a random
mix of every operator: ``map`` (row functions, several outputs, ``col=``, classes,
``init=``, ``batching=True``, ``gpu=``/``high_variance=`` flags), ``filter`` (also batching),
``agg`` with and without ``groupby``, ``join`` (inner/left/outer, on qid or on a data
column), ``union``, ``lookup`` (fixed key, per-row key from different key columns,
``missing="null"``) and ``anyof`` (with and without ``valid=``, batching, alternatives
that fail). Nodes branch at random (any earlier node may be an operator's input) and all
dangling branches are joined or unioned into one sink. Operator functions are instances
of small module-level classes, so they pickle (also with plain pickle) and their reprs
read well in failure messages.

    from hypothesis import given, settings
    from tests.flowgen import flows_and_inputs, assert_same_rows

    @settings(max_examples=50, deadline=None, derandomize=True, database=None)
    @given(flows_and_inputs())
    def test_my_runtime(case):
        expected = case.flow.run(case.table, kvs=case.store)
        assert_same_rows(my_runtime(case.flow, case.table, case.store), expected)

A ``FlowCase`` holds ``flow``, ``rows`` (input row dicts), ``qids``, ``table`` (all rows as
one Table), ``requests`` (the rows split into 1..max_requests Tables with disjoint qids,
for batching), ``store`` (a dict for ``kvs=``), ``script`` (the flow as code, shown by
``repr``) and ``features`` (the operator variants used, e.g. ``"join.outer"``).
``random_case(seed)`` builds the same kind of case from a ``random.Random`` (no Hypothesis).
Both take ``race_lookups=<percent>``: that share of operators becomes a racing
(``high_variance``) map feeding a per-row lookup, the mix key routing must get right.

Comparing results: ``assert_same_rows(actual, expected)`` checks the same columns and, per
qid, the same multiset of rows (row order is free; ``ordered=True`` also checks the rows'
order, where ``flow.run``'s is defined and the runtime must keep it). Values compare loosely where merging
requests may change a type: ints equal floats of the same value, and None equals NaN
(both are "missing"; ``Table[col]`` shows a missing float as NaN).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from flow import Flow, Table

KEYS = ("ka", "kb", "kc", "kd")  # per-row lookup keys; the store holds all of them
ABSENT_KEY = "kz"  # appears only in nullable key columns (missing="null")
FIXED = {"cfg_int": 7, "cfg_float": 0.25, "cfg_str": "hello", "cfg_vec": np.array([1.0, 2.0])}
FIXED_KIND = {"cfg_int": "int", "cfg_float": "float", "cfg_str": "str", "cfg_vec": "tensor"}
NUMERIC = ("int", "float")
MAX_MULT = 24  # cap on rows per qid, so joins cannot explode


# -- operator functions: small picklable callables with readable reprs ----------------------


class _Fn:
    """Base: repr shows the constructor call, so a failing case prints as code."""

    def __repr__(self) -> str:
        args = ", ".join(repr(v) for v in self.__dict__.values())
        return f"{type(self).__name__}({args})"


def _num(v):
    """A number, or None for missing values (None or NaN)."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v


class AddK(_Fn):
    """row -> row[src] + k, re-emitting the ``keep`` columns after it."""

    def __init__(self, src, k, keep=()):
        self.src, self.k, self.keep = src, k, tuple(keep)

    def __call__(self, row):
        v = _num(row[self.src])
        out = None if v is None else v + self.k
        return (out, *[row[c] for c in self.keep]) if self.keep else out


class Pair(_Fn):
    """row -> (2 * row[src], "s<value>")."""

    def __init__(self, src):
        self.src = src

    def __call__(self, row):
        v = _num(row[self.src])
        return (None, None) if v is None else (v * 2, f"s{v}")


class KeyOf(_Fn):
    """row -> one of KEYS chosen by row[src] (a derived per-row lookup key)."""

    def __init__(self, src):
        self.src = src

    def __call__(self, row):
        v = row[self.src]
        if isinstance(v, str):
            return KEYS[len(v) % len(KEYS)]
        v = _num(v)
        return None if v is None else KEYS[int(v) % len(KEYS)]


class Vec(_Fn):
    """row -> a float vector [v, v + 1] (a tensor column)."""

    def __init__(self, src):
        self.src = src

    def __call__(self, row):
        v = _num(row[self.src])
        return None if v is None else np.array([float(v), float(v) + 1.0])


class AddKCol(_Fn):
    """``col=`` function: value -> value + k."""

    def __init__(self, k):
        self.k = k

    def __call__(self, v):
        v = _num(v)
        return None if v is None else v + self.k


class SumVec(_Fn):
    """``col=`` function on a tensor column: vector -> its sum."""

    def __call__(self, v):
        return None if v is None else float(np.sum(v))


class Doubler:
    """A class operator (built once per replica) used with ``col=``: value -> 2 * value."""

    def __init__(self):
        self.factor = 2

    def __call__(self, v):
        v = _num(v)
        return None if v is None else v * self.factor


class QidTag:
    """A class operator on rows: row -> "q<qid>"."""

    def __init__(self):
        self.prefix = "q"

    def __call__(self, row):
        return f"{self.prefix}{row.qid}"


def make_state():
    """``init=`` function: the per-replica state of InitScale."""
    return {"scale": 3}


class InitScale(_Fn):
    """``init=`` operator: (state, row) -> row[src] * state["scale"]."""

    def __init__(self, src):
        self.src = src

    def __call__(self, state, row):
        v = _num(row[self.src])
        return None if v is None else v * state["scale"]


class BatchAdd(_Fn):
    """``batching=True``: Table -> [row[src] + k per row], re-emitting ``keep``."""

    def __init__(self, src, k, keep=()):
        self.src, self.k, self.keep = src, k, tuple(keep)

    def __call__(self, table):
        out = [None if _num(v) is None else v + self.k for v in table[self.src]]
        if not self.keep:
            return out
        return (out, *[list(table[c]) for c in self.keep])


class BatchAddCol(_Fn):
    """``batching=True`` with ``col=``: array -> array + k (missing stays missing)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, values):
        return [None if _num(v) is None else v + self.k for v in values]


class Gt(_Fn):
    """Filter: row[src] > t (missing is False)."""

    def __init__(self, src, t):
        self.src, self.t = src, t

    def __call__(self, row):
        v = _num(row[self.src])
        return v is not None and v > self.t


class IsIn(_Fn):
    """Filter: row[src] in values."""

    def __init__(self, src, values):
        self.src, self.values = src, tuple(values)

    def __call__(self, row):
        return row[self.src] in self.values


class BatchGt(_Fn):
    """``batching=True`` filter: Table -> bools (row[src] > t)."""

    def __init__(self, src, t):
        self.src, self.t = src, t

    def __call__(self, table):
        return np.array([_num(v) is not None and _num(v) > self.t for v in table[self.src]], dtype=bool)


class Alt(_Fn):
    """anyof alternative: row -> (value, conf). ``final`` ones are always confident.
    ``same``: every alternative answers a row alike when it is valid (value v + 1, conf
    1.0; an invalid one says conf 0.0): deployed, the first valid answer to *arrive* wins,
    not the first in argument order as in ``flow.run`` (docs/flow-semantics.md), so
    runtime differential tests need alternatives whose valid answers are interchangeable."""

    def __init__(self, src, k, final=False, same=False):
        self.src, self.k, self.final = src, k, final
        if same:
            self.same = True

    def _one(self, v, qid):
        v = _num(v)
        v = float(qid if v is None else v)
        if getattr(self, "same", False):
            valid = self.final or (int(abs(v) * 10) + self.k) % 3 != 0
            return v + 1, 1.0 if valid else 0.0
        conf = 1.0 if self.final else ((int(abs(v) * 10) + self.k) % 10) / 10
        return v + self.k, conf

    def __call__(self, row):
        return self._one(row[self.src] if self.src else None, row.qid)


class BatchAlt(Alt):
    """``batching=True`` anyof alternative: Table -> (values, confs)."""

    def __call__(self, table):
        src = table[self.src] if self.src else [None] * len(table)
        pairs = [self._one(v, q) for v, q in zip(src, table.qid.tolist())]
        return [p[0] for p in pairs], [p[1] for p in pairs]


class Flaky(Alt):
    """anyof alternative that raises when a row's value exceeds ``limit`` (the whole
    alternative then fails, which anyof treats as 'not valid')."""

    def __init__(self, src, k, limit, same=False):
        super().__init__(src, k, same=same)
        self.limit = limit

    def __call__(self, row):
        v = _num(row[self.src]) if self.src else None
        if v is not None and v > self.limit:
            raise ValueError(f"flaky alternative: {v} > {self.limit}")
        return super().__call__(row)


class BatchFlaky(BatchAlt):
    """``batching=True`` alternative that raises if any row's value exceeds ``limit``: a
    merged batch fails if one request has such a row, while the others would not."""

    def __init__(self, src, k, limit, same=False):
        super().__init__(src, k, same=same)
        self.limit = limit

    def __call__(self, table):
        for v in table[self.src] if self.src else []:
            if _num(v) is not None and v > self.limit:
                raise ValueError(f"flaky alternative: {v} > {self.limit}")
        return super().__call__(table)


class ConfAtLeast(_Fn):
    """anyof ``valid=``: row[col] >= t."""

    def __init__(self, col, t):
        self.col, self.t = col, t

    def __call__(self, row):
        c = row[self.col]
        return c is not None and c >= self.t


# -- the generator ---------------------------------------------------------------------------


class _Choices:
    """Where the generator's decisions come from: Hypothesis draws or a Random."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq):
        seq = list(seq)
        return seq[self.integer(0, len(seq) - 1)]

    def chance(self, percent: int) -> bool:
        """True with about ``percent``% probability (shrinks to False)."""
        return self.integer(0, 99) >= 100 - percent


class _Draws(_Choices):
    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo, hi):
        return self.draw(st.integers(lo, hi))


class _Random(_Choices):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)


@dataclass
class Col:
    kind: str  # int, float, str, key (a str column holding lookup keys), tensor, null
    nullable: bool  # may hold None (or, for key columns, ABSENT_KEY)


@dataclass
class _G:
    """A generated node: the flow node, its columns as the generator knows them, and caps."""

    node: object
    cols: dict
    var: str
    rows: int  # upper bound on its rows
    mult: int  # upper bound on rows per qid
    consumers: int = 0


@dataclass(frozen=True)
class FlowCase:
    """One generated flow with its inputs (see module docs)."""

    flow: Flow
    rows: tuple
    qids: tuple
    requests: tuple
    store: dict = field(compare=False)
    script: str = ""
    features: frozenset = frozenset()

    @property
    def table(self) -> Table:
        """All rows as one request."""
        return Table.from_pylist(list(self.rows), qid=list(self.qids), schema=self.flow.schema)

    def __repr__(self) -> str:
        rows = "\n".join(f"  qid {q}: {r}" for q, r in zip(self.qids, self.rows))
        reqs = [list(t.qid.tolist()) for t in self.requests]
        return f"FlowCase(\n{self.script}\nrows:\n{rows}\nrequests (qids): {reqs}\nstore: {self.store})"


class _Builder:
    def __init__(self, c: _Choices, race_lookups: int = 0, same_anyof: bool = False):
        self.c = c
        self.race_lookups = race_lookups  # percent of operators that are a racing map + key lookup
        self.same_anyof = same_anyof  # anyof alternatives with interchangeable valid answers (Alt)
        self.lines: list[str] = []
        self.features: set[str] = set()
        self.nodes: list[_G] = []
        self.fresh = 0
        self.column_joins = 0

    # -- helpers ---------------------------------------------------------------------------

    def name(self) -> str:
        self.fresh += 1
        return f"c{self.fresh}"

    def add(self, node, cols, inputs, code, rows=None, mult=None) -> _G:
        for g in inputs:
            g.consumers += 1
        g = _G(
            node,
            dict(cols),
            f"n{len(self.nodes)}",
            rows if rows is not None else inputs[0].rows,
            mult if mult is not None else max(g.mult for g in inputs),
        )
        self.lines.append(f"{g.var} = {code}")
        self.nodes.append(g)
        return g

    def pick_node(self) -> _G:
        """Mostly the latest node (chains), sometimes an earlier one (branches)."""
        return self.nodes[len(self.nodes) - 1 - self.c.integer(0, len(self.nodes) - 1)]

    def cols_of(self, g: _G, kinds) -> list[str]:
        return [n for n, col in g.cols.items() if col.kind in kinds]

    # -- operators -----------------------------------------------------------------------------

    def op_map(self, g: _G) -> _G:
        c = self.c
        nums = self.cols_of(g, NUMERIC)
        variant = c.choice(
            ["row", "multi", "col", "class", "init", "batching", "batching_col", "key", "vec", "sumvec", "qid_class"]
        )
        flags = {}
        if c.chance(20):
            flags["gpu"] = True
            self.features.add("map.gpu")
        if c.chance(30):
            flags["high_variance"] = True
            self.features.add("map.high_variance")
        if variant in ("row", "multi", "col", "class", "init", "batching", "batching_col", "vec") and not nums:
            variant = "qid_class"
        if variant == "sumvec" and not self.cols_of(g, ("tensor",)):
            variant = "key"
        if variant == "key" and not nums + self.cols_of(g, ("str", "key")):
            variant = "qid_class"
        f = self.name()
        cols: dict[str, Col] = {}
        kwargs = dict(flags)
        if variant in ("row", "batching"):
            src = c.choice(nums)
            k = c.choice([1, 2, 0.5])
            keep = tuple(n for n in g.cols if c.chance(35))
            fn = AddK(src, k, keep) if variant == "row" else BatchAdd(src, k, keep)
            kind = "float" if isinstance(k, float) or g.cols[src].kind == "float" else "int"
            cols[f] = Col(kind, True)
            for n in keep:
                cols[n] = Col(g.cols[n].kind, True)
            names = [f, *keep]
            if variant == "batching":
                kwargs["batching"] = True
                self.features.add("map.batching")
            else:
                self.features.add("map.row")
            if keep:
                self.features.add("map.keep")
        elif variant == "multi":
            src = c.choice(nums)
            fn, g2 = Pair(src), self.name()
            names = [f, g2]
            cols = {f: Col(g.cols[src].kind, True), g2: Col("str", True)}
            self.features.add("map.multi")
        elif variant in ("col", "class", "batching_col"):
            src = c.choice(nums)
            kwargs["col"] = src
            if variant == "class":
                fn = Doubler
                self.features.add("map.class")
                kind = g.cols[src].kind
            elif variant == "col":
                fn = AddKCol(c.choice([3, 1.5]))
                kind = "float" if isinstance(fn.k, float) or g.cols[src].kind == "float" else "int"
                self.features.add("map.col")
            else:
                fn = BatchAddCol(c.choice([3, 1.5]))
                kwargs["batching"] = True
                kind = "float" if isinstance(fn.k, float) or g.cols[src].kind == "float" else "int"
                self.features.update(("map.col", "map.batching"))
            names = [f]
            cols = {f: Col(kind, True)}
        elif variant == "init":
            fn = InitScale(c.choice(nums))
            kwargs["init"] = make_state
            names = [f]
            cols = {f: Col(g.cols[fn.src].kind, True)}
            self.features.add("map.init")
        elif variant == "key":
            fn = KeyOf(c.choice(nums + self.cols_of(g, ("str", "key"))))
            names = [f]
            cols = {f: Col("key", g.cols[fn.src].nullable)}
            self.features.add("map.key")
        elif variant == "vec":
            fn = Vec(c.choice(nums))
            names = [f]
            cols = {f: Col("tensor", True)}
            self.features.add("map.tensor")
        elif variant == "sumvec":
            fn = SumVec()
            kwargs["col"] = c.choice(self.cols_of(g, ("tensor",)))
            names = [f]
            cols = {f: Col("float", True)}
            self.features.update(("map.tensor", "map.col"))
        else:
            fn = QidTag
            names = [f]
            cols = {f: Col("str", False)}
            self.features.add("map.class")
        self.features.add("map")
        node = g.node.map(fn, names=names, **kwargs)
        kw = "".join(f", {k}={v.__name__ if callable(v) else repr(v)}" for k, v in kwargs.items())
        code = f"{g.var}.map({fn.__name__ if isinstance(fn, type) else repr(fn)}, names={names}{kw})"
        return self.add(node, cols, [g], code)

    def filter_pred(self, g: _G):
        c = self.c
        nums = self.cols_of(g, NUMERIC)
        strs = self.cols_of(g, ("key", "str"))
        if nums and (not strs or c.chance(60)):
            src = c.choice(nums)
            t = c.choice([0, 1, 2.5, -1])
            if c.chance(40):
                self.features.add("filter.batching")
                return BatchGt(src, t), True
            return Gt(src, t), False
        if strs:
            src = c.choice(strs)
            return IsIn(src, KEYS[: c.integer(1, 3)]), False
        return None, False

    def op_filter(self, g: _G) -> _G | None:
        pred, batching = self.filter_pred(g)
        if pred is None:
            return None
        self.features.add("filter")
        node = g.node.filter(pred, batching=batching)
        return self.add(
            node,
            {n: Col(col.kind, col.nullable) for n, col in g.cols.items()},
            [g],
            f"{g.var}.filter({pred!r}{', batching=True' if batching else ''})",
        )

    def op_agg(self, g: _G) -> _G | None:
        c = self.c
        fn = c.choice(["count", "sum", "min", "max", "mean"])
        if fn == "count":
            col = c.choice([None, *g.cols]) if g.cols else None
        elif fn in ("sum", "mean"):
            options = self.cols_of(g, NUMERIC + ("tensor",))
            col = c.choice(options) if options else None
        else:
            options = self.cols_of(g, NUMERIC + ("str", "key", "tensor"))
            col = c.choice(options) if options else None
        if col is None and fn != "count":
            fn = "count"
        out = self.name()
        kind_in = g.cols[col].kind if col else None
        kind = {"count": "int", "mean": "tensor" if kind_in == "tensor" else "float"}.get(fn, kind_in)
        cols = {}
        by_options = self.cols_of(g, ("int", "key", "str"))
        if by_options and c.chance(65):
            by = c.choice(by_options)
            if by == col:
                col, fn, kind = None, "count", "int"
            node = g.node.groupby(by).agg(fn, col, name=out)
            cols[by] = Col(g.cols[by].kind, g.cols[by].nullable)  # a key column may hold ABSENT_KEY
            code = f"{g.var}.groupby({by!r}).agg({fn!r}, {col!r}, name={out!r})"
            self.features.add("groupby.agg")
        else:
            node = g.node.agg(fn, col, name=out)
            code = f"{g.var}.agg({fn!r}, {col!r}, name={out!r})"
            self.features.add("agg")
        self.features.add(f"agg.{fn}")
        cols[out] = Col(kind, fn not in ("count", "sum"))
        return self.add(node, cols, [g], code, rows=g.rows, mult=g.mult)

    def op_join(self, left: _G) -> _G | None:
        c = self.c
        right = self.pick_node()
        how = c.choice(["inner", "left", "outer"])
        shared = [
            n
            for n in self.cols_of(left, ("int", "key", "str"))
            if n in right.cols and right.cols[n].kind == left.cols[n].kind
        ]
        on = "qid"
        if shared and self.column_joins < 1 and c.chance(30):
            on = c.choice(shared)
        if on == "qid":
            mult = left.mult * right.mult
            rows = left.rows * right.mult + right.rows
        else:
            mult = left.mult * right.rows
            rows = left.rows * right.rows + right.rows
        if mult > MAX_MULT or rows > MAX_MULT * 8:
            return None
        if on != "qid":
            self.column_joins += 1
            self.features.add("join.on_column")
        else:
            self.features.add("join.qid")
        suffix = f"_r{self.fresh + 1}"
        self.fresh += 1
        keys = [] if on == "qid" else [on]
        cols: dict[str, Col] = {}
        for k in keys:
            cols[k] = Col(left.cols[k].kind, left.cols[k].nullable or right.cols[k].nullable)
        clash = (set(left.cols) & set(right.cols)) - set(keys)
        for n, col in left.cols.items():
            if n not in keys:
                cols[n] = Col(col.kind, col.nullable or how == "outer")
        for n, col in right.cols.items():
            if n not in keys:
                cols[n + suffix if n in clash else n] = Col(col.kind, col.nullable or how != "inner")
        node = left.node.join(right.node, on=on, how=how, suffixes=("", suffix))
        self.features.update(("join", f"join.{how}"))
        return self.add(
            node,
            cols,
            [left, right],
            f"{left.var}.join({right.var}, on={on!r}, how={how!r}, suffixes=('', {suffix!r}))",
            rows=rows,
            mult=mult,
        )

    def op_union(self, g: _G) -> _G | None:
        c = self.c
        same = [
            h
            for h in self.nodes
            if h.cols.keys() == g.cols.keys()
            and h is not self.nodes[0]
            and all(h.cols[n].kind == g.cols[n].kind for n in g.cols)
        ]
        if not same or c.chance(40):
            other = self.op_filter(g)
            if other is None:
                return None
        else:
            other = c.choice(same)
        others = [other]
        if len(same) > 1 and c.chance(25):
            others.append(c.choice(same))
        rows = g.rows + sum(o.rows for o in others)
        mult = g.mult + sum(o.mult for o in others)
        if mult > MAX_MULT:
            return None
        cols = {n: Col(col.kind, col.nullable or any(o.cols[n].nullable for o in others)) for n, col in g.cols.items()}
        node = g.node.union(*[o.node for o in others])
        self.features.add("union")
        return self.add(
            node, cols, [g, *others], f"{g.var}.union({', '.join(o.var for o in others)})", rows=rows, mult=mult
        )

    def op_lookup(self, g: _G) -> _G:
        c = self.c
        keys = self.cols_of(g, ("key",))
        out = self.name()
        cols = {n: Col(col.kind, col.nullable) for n, col in g.cols.items()}
        if keys and c.chance(70):
            column = c.choice(keys)
            missing = "null" if g.cols[column].nullable or c.chance(30) else "error"
            node = g.node.lookup(column=column, name=out, missing=missing)
            cols[out] = Col("int", missing == "null")
            code = f"{g.var}.lookup(column={column!r}, name={out!r}, missing={missing!r})"
            self.features.add("lookup.dynamic")
            if missing == "null":
                self.features.add("lookup.missing_null")
        elif c.chance(20):
            node = g.node.lookup("cfg_absent", name=out, missing="null")
            cols[out] = Col("null", True)
            code = f"{g.var}.lookup('cfg_absent', name={out!r}, missing='null')"
            self.features.update(("lookup.fixed", "lookup.missing_null"))
        else:
            key = c.choice(sorted(FIXED))
            node = g.node.lookup(key, name=out)
            cols[out] = Col(FIXED_KIND[key], False)
            code = f"{g.var}.lookup({key!r}, name={out!r})"
            self.features.add("lookup.fixed")
        self.features.add("lookup")
        return self.add(node, cols, [g], code)

    def op_race_lookup(self, g: _G) -> _G:
        """A racing (high_variance) map whose output feeds a per-row lookup: the racing
        copies each route the lookup's rows by key (a deployment's hardest mix)."""
        c = self.c
        nums, keys = self.cols_of(g, NUMERIC), self.cols_of(g, ("key",))
        f = self.name()
        if nums and keys and c.chance(70):
            key = c.choice(keys)
            keep = (key, *(n for n in g.cols if n != key and c.chance(35)))
            fn = AddK(c.choice(nums), 1, keep)
            kind = "float" if g.cols[fn.src].kind == "float" else "int"
            cols = {f: Col(kind, True), **{n: Col(g.cols[n].kind, g.cols[n].nullable) for n in keep}}
            names = [f, *keep]
        else:
            src = c.choice(nums + self.cols_of(g, ("str", "key"))) if nums or self.cols_of(g, ("str", "key")) else None
            if src is None:
                return self.op_map(g)
            fn, key, names = KeyOf(src), f, [f]
            cols = {f: Col("key", g.cols[src].nullable)}
        mapped = self.add(
            g.node.map(fn, names=names, high_variance=True),
            cols,
            [g],
            f"{g.var}.map({fn!r}, names={names}, high_variance=True)",
        )
        out = self.name()
        missing = "null" if cols[key].nullable else "error"
        node = mapped.node.lookup(column=key, name=out, missing=missing)
        self.features.update(("map.high_variance", "lookup", "lookup.dynamic", "race.lookup"))
        return self.add(
            node,
            {**cols, out: Col("int", missing == "null")},
            [mapped],
            f"{mapped.var}.lookup(column={key!r}, name={out!r}, missing={missing!r})",
        )

    def op_anyof(self, g: _G) -> _G:
        c = self.c
        nums = self.cols_of(g, NUMERIC)
        src = c.choice(nums) if nums else None
        n = c.integer(2, 3)
        batching = c.chance(25)
        gpu = c.chance(20)
        alts = []
        same = self.same_anyof
        for i in range(n):
            final = i == n - 1
            if batching and not final and src is not None and c.chance(30):
                alts.append(BatchFlaky(src, i + 1, c.choice([0, 2, 4]), same=same))
                self.features.add("anyof.failing")
            elif batching:
                alts.append(BatchAlt(src, i + 1, final, same=same))
            elif not final and src is not None and c.chance(25):
                alts.append(Flaky(src, i + 1, c.choice([0, 2, 4]), same=same))
                self.features.add("anyof.failing")
            else:
                alts.append(Alt(src, i + 1, final, same=same))
        val, conf = self.name(), self.name()
        valid = ConfAtLeast(conf, c.choice([0.3, 0.6, 0.9])) if c.chance(75) else None
        if same:  # without a valid= every answer is valid, and then their confs differ
            valid = ConfAtLeast(conf, c.choice([0.3, 0.6, 0.9]))
        node = g.node.anyof(*alts, names=[val, conf], valid=valid, batching=batching, gpu=gpu)
        self.features.add("anyof")
        if valid is not None:
            self.features.add("anyof.valid")
        if batching:
            self.features.add("anyof.batching")
        if gpu:
            self.features.add("anyof.gpu")
        code = (
            f"{g.var}.anyof({', '.join(map(repr, alts))}, names={[val, conf]}, valid={valid!r}"
            f"{', batching=True' if batching else ''}{', gpu=True' if gpu else ''})"
        )
        return self.add(node, {val: Col("float", False), conf: Col("float", False)}, [g], code)

    # -- the whole case --------------------------------------------------------------------------

    def inputs(self, max_rows: int):
        c = self.c
        cols = {"i0": Col("int", c.chance(30)), "f0": Col("float", c.chance(30)), "s0": Col("key", c.chance(30))}
        if c.chance(30):
            cols["i1"] = Col("int", c.chance(30))
        if c.chance(40):
            cols["s1"] = Col("key", c.chance(30))
        if c.chance(20):
            cols["t0"] = Col("tensor", c.chance(30))
        rows = []
        for _ in range(0 if c.chance(8) else c.integer(1, max_rows)):
            row = {}
            for n, col in cols.items():
                if col.nullable and c.chance(25):
                    row[n] = None
                elif col.kind == "int":
                    row[n] = c.integer(-3, 5)
                elif col.kind == "float":
                    row[n] = c.integer(-6, 10) / 2 + 0.25
                elif col.kind == "key":
                    row[n] = c.choice(KEYS + ((ABSENT_KEY,) if col.nullable else ()))
                else:
                    row[n] = np.array([float(c.integer(-2, 2)), 0.5])
            rows.append(row)
        return cols, rows

    def build(self, max_ops: int, max_rows: int, max_requests: int) -> FlowCase:
        c = self.c
        cols, rows = self.inputs(max_rows)
        schema = None
        if c.chance(60) or not rows:  # without rows or a schema, the columns are unknown
            schema = {n: {"int": int, "float": float, "key": str}.get(col.kind) for n, col in cols.items()}
            if "t0" in schema:
                from flow import ColumnType

                schema["t0"] = ColumnType.tensor(np.float64, (2,))
        flow = Flow("gen", schema=schema)
        self.lines.append(f"n0 = Flow('gen', schema={schema!r})")
        self.nodes.append(_G(flow.source, cols, "n0", max(len(rows), 1), 1))
        ops = [self.op_map, self.op_filter, self.op_agg, self.op_join, self.op_union, self.op_lookup, self.op_anyof]
        for _ in range(c.integer(min(2, max_ops), max_ops)):
            op = self.op_race_lookup if self.race_lookups and c.chance(self.race_lookups) else c.choice(ops)
            g = self.pick_node()
            if op in (self.op_agg, self.op_union, self.op_join) and g is self.nodes[0] and c.chance(50):
                g = self.nodes[-1]
            op(g)
        if len(self.nodes) == 1:
            self.op_map(self.nodes[0])
        self.merge_sinks()
        n = len(rows)
        base = c.integer(0, 40)
        qids = tuple(base + 3 * i for i in range(n))
        k = c.integer(1, max(1, min(max_requests, n)))
        cuts = sorted(set(c.integer(1, n - 1) for _ in range(k - 1))) if n > 1 else []
        bounds = [0, *cuts, n]
        requests = tuple(
            Table.from_pylist(rows[a:b], qid=list(qids[a:b]), schema=schema)
            if b > a
            else Table.from_pylist([], schema=schema)
            for a, b in zip(bounds, bounds[1:])
        )
        store = {k_: c.integer(-5, 5) for k_ in KEYS}
        store.update(FIXED)
        return FlowCase(flow, tuple(rows), qids, requests, store, "\n".join(self.lines), frozenset(self.features))

    def merge_sinks(self) -> None:
        c = self.c
        while True:
            dangling = [g for g in self.nodes[1:] if g.consumers == 0]
            if len(dangling) <= 1:
                return
            a, b = dangling[-1], dangling[-2]
            if (
                a.cols.keys() == b.cols.keys()
                and all(a.cols[n].kind == b.cols[n].kind for n in a.cols)
                and c.chance(50)
            ):
                cols = {n: Col(col.kind, col.nullable or b.cols[n].nullable) for n, col in a.cols.items()}
                self.features.add("union")
                self.add(
                    a.node.union(b.node),
                    cols,
                    [a, b],
                    f"{a.var}.union({b.var})",
                    rows=a.rows + b.rows,
                    mult=a.mult + b.mult,
                )
                continue
            for g in (a, b):
                if g.mult > 4:  # keep the joins below small: reduce to one row per group first
                    self.op_agg_count(g)
                    break
            else:
                how = c.choice(["inner", "left", "outer"])
                suffix = f"_r{self.fresh + 1}"
                self.fresh += 1
                clash = set(a.cols) & set(b.cols)
                cols = {n: Col(col.kind, col.nullable or how == "outer") for n, col in a.cols.items()}
                for n, col in b.cols.items():
                    cols[n + suffix if n in clash else n] = Col(col.kind, col.nullable or how != "inner")
                self.features.update(("join", f"join.{how}", "join.qid"))
                self.add(
                    a.node.join(b.node, how=how, suffixes=("", suffix)),
                    cols,
                    [a, b],
                    f"{a.var}.join({b.var}, how={how!r}, suffixes=('', {suffix!r}))",
                    rows=a.rows * b.mult + b.rows,
                    mult=a.mult * b.mult,
                )

    def op_agg_count(self, g: _G) -> _G:
        out = self.name()
        self.features.update(("agg", "agg.count"))
        return self.add(
            g.node.agg("count", name=out),
            {out: Col("int", False)},
            [g],
            f"{g.var}.agg('count', name={out!r})",
            rows=1,
            mult=1,
        )


@st.composite
def flows_and_inputs(
    draw, max_ops: int = 8, max_rows: int = 6, max_requests: int = 3, race_lookups: int = 0
) -> FlowCase:
    """Hypothesis strategy of FlowCases: a valid flow of up to ``max_ops`` random operators
    (plus the joins/unions that merge its branches), up to ``max_rows`` input rows split
    into up to ``max_requests`` requests, and the KVS contents its lookups read.
    ``race_lookups``: the percentage of operators that are a racing map feeding a per-row
    lookup (0: the plain mix)."""
    return _Builder(_Draws(draw), race_lookups).build(max_ops, max_rows, max_requests)


def random_case(
    seed: int,
    max_ops: int = 8,
    max_rows: int = 6,
    max_requests: int = 3,
    race_lookups: int = 0,
    same_anyof: bool = False,
) -> FlowCase:
    """The same generator driven by ``random.Random(seed)`` (for loops and benchmarks).
    ``same_anyof``: anyof alternatives whose valid answers are interchangeable (``Alt``),
    for comparisons with a deployment, where the first valid answer to arrive wins."""
    return _Builder(_Random(random.Random(seed)), race_lookups, same_anyof).build(max_ops, max_rows, max_requests)


# -- comparing results ---------------------------------------------------------------------------


def _canon(v):
    if v is None or (isinstance(v, float) and v != v):
        return ("missing",)
    if isinstance(v, np.ndarray):
        flat = tuple(("missing",) if x != x else ("n", float(x)) for x in v.astype(float).ravel().tolist())
        return ("tensor", v.shape, flat)
    if isinstance(v, (bool, np.bool_)):
        return ("bool", bool(v))
    if isinstance(v, (int, float, np.integer, np.floating)):
        return ("n", float(v))
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, (bytes, bytearray)):
        return ("b", bytes(v))
    return ("other", repr(v))


def canonical_rows(table: Table) -> dict[int, list[tuple]]:
    """Per qid, the sorted list of its rows as comparable tuples (see module docs)."""
    out: dict[int, list[tuple]] = {}
    cols = [table.column(n) for n in table.columns]
    for i, q in enumerate(table.qid.tolist()):
        out.setdefault(q, []).append(tuple(_canon(col.cell(i)) for col in cols))
    return {q: sorted(rows) for q, rows in out.items()}


def ordered_rows(table: Table) -> list[tuple]:
    """Every row with its qid as a comparable tuple, in the table's order."""
    cols = [table.column(n) for n in table.columns]
    return [(q, *(_canon(col.cell(i)) for col in cols)) for i, q in enumerate(table.qid.tolist())]


def assert_same_rows(
    actual: Table, expected: Table, context: str = "", column_order: bool = True, ordered: bool = False
) -> None:
    """Assert the same columns and, per qid, the same rows in any order (see module docs);
    ``ordered=True``: also the same rows in the same order, row by row."""
    a_cols = actual.columns if column_order else tuple(sorted(actual.columns))
    e_cols = expected.columns if column_order else tuple(sorted(expected.columns))
    assert a_cols == e_cols, f"{context}columns differ: {actual.columns} != {expected.columns}"
    if not column_order:
        actual, expected = actual.select(a_cols), expected.select(e_cols)
    a, e = canonical_rows(actual), canonical_rows(expected)
    if a != e:
        diff = [q for q in sorted(set(a) | set(e)) if a.get(q) != e.get(q)]
        q = diff[0]
        raise AssertionError(
            f"{context}rows differ for {len(diff)} qid(s) {diff[:8]}; first, qid {q}:\n"
            f"  actual:   {a.get(q)}\n  expected: {e.get(q)}"
        )
    if ordered:
        a_rows, e_rows = ordered_rows(actual), ordered_rows(expected)
        if a_rows != e_rows:
            i = next(i for i, (x, y) in enumerate(zip(a_rows, e_rows)) if x != y)
            raise AssertionError(
                f"{context}the same rows in another order; first difference at row {i}:\n"
                f"  actual:   {a_rows[i]}\n  expected: {e_rows[i]}"
            )
