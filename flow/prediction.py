"""Clipper's layer over the flow: prediction cache and hedging options of ``map``, the
deadline-answering ``ensemble`` and the learning ``select`` (Exp3 / Exp4 with feedback).

What each means for ``flow.run`` (docs/flow-semantics.md has the exact form):
- ``map(..., cache=...)`` changes no result: a cache hit returns what the call returned.
- ``map(..., hedge=...)`` changes no result: a backup copy runs the same operator.
- ``ensemble(..., deadline_ms=...)``: in-process every member arrives, so ``missing`` is
  ``""`` on every row; deployed, at the deadline the members that have not answered are
  ``None`` for the combining function and named in ``missing``.
- ``select(models, policy=...)``: deterministic with a seed: the weights are read from the
  store given to ``flow.run`` (uniform when there is none) and Exp3's draw for a query is a
  function of (seed, qid) only. ``feedback(store, flow, qid, reward=|label=)`` updates them.
  Exp4 votes on the first output column, or averages it when it holds probability / score
  vectors (a tensor column; ``_exp4_mean``).

    s = flow.select([small, big], names=["cls"], policy="exp4", threshold=0.6, default=-1)
    out = flow.run(rows, kvs=weights)       # weights: a dict or a KVS
    feedback(weights, flow, qid=0, label=3)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flow.errors import (
    DataError,
    FlowTypeError,
    FlowValueError,
    OperatorFailedError,
    OperatorOutputError,
    SchemaError,
)
from flow.operators import (
    _MISSING,
    SYSTEM_PREFIX,
    BoundOperator,
    MapOp,
    Operator,
    _columns_from_values,
    _invoke,
    build_callable,
    callable_name,
    read_many,
)
from flow.table import Column, Row, Table
from flow.types import build_column

CACHE_POLICIES = ("clock", "lru")
POLICIES = ("exp3", "exp4")
MISSING_COLUMN = "missing"
CONFIDENCE_COLUMN = "confidence"
RECORD_TTL_S = 24 * 3600  # a query's selection record waits this long for its feedback


# -- prediction cache ------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSpec:
    """``map(..., cache=CacheSpec(size=10_000, policy="clock"))``: memoise the operator's
    output per row, keyed by a hash of the columns it reads (``col=`` or the whole row).
    ``size``: entries per executor (per replica); ``policy``: ``"clock"`` (Clipper's LRU
    approximation) or ``"lru"``. ``cache=True`` is ``CacheSpec()``, ``cache=5000`` a size.
    ``shared=True``: deployed, entries also go to the KVS (under the flow version's prefix,
    expiring ``ttl_s`` after they were written), so a value one replica computed is a hit
    on the others; a redeploy is a new version and so a new prefix."""

    size: int = 10_000
    policy: str = "clock"
    shared: bool = False
    ttl_s: float = 3600.0

    def describe(self) -> str:
        shared = f" shared ttl {self.ttl_s:g}s" if self.shared else ""
        return f"cache {self.policy} {self.size}{shared}"


def parse_cache(value, label: str) -> CacheSpec | None:
    if value is None or value is False:
        return None
    if value is True:
        return CacheSpec()
    if isinstance(value, CacheSpec):
        spec = value
    elif isinstance(value, int) and not isinstance(value, bool):
        spec = CacheSpec(size=value)
    else:
        raise FlowTypeError(
            f"operator map {label!r}: cache= takes True, a number of entries or a CacheSpec, got {value!r}"
        )
    if not isinstance(spec.size, int) or isinstance(spec.size, bool) or spec.size < 1:
        raise FlowValueError(f"operator map {label!r}: cache size must be an int >= 1, got {spec.size!r}")
    if spec.policy not in CACHE_POLICIES:
        raise FlowValueError(f"operator map {label!r}: cache policy {spec.policy!r}; expected one of {CACHE_POLICIES}")
    if not isinstance(spec.shared, bool):
        raise FlowTypeError(f"operator map {label!r}: cache shared= must be True or False, got {spec.shared!r}")
    ttl = spec.ttl_s
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 1 <= ttl < float("inf"):
        raise FlowValueError(f"operator map {label!r}: cache ttl_s must be a number of seconds >= 1, got {ttl!r}")
    return spec


def cache_prefix(flow: str, version: int, node: str) -> str:
    """Where a shared prediction cache keeps its entries in the KVS: one prefix per flow
    version and operator (a redeploy's new version starts with none; old ones expire)."""
    return f"{SYSTEM_PREFIX}pcache:{flow}:v{int(version)}:{node}:"


def row_keys(table: Table, col: str | None) -> list[bytes]:
    """One 16-byte key per row: a hash of the values the map reads (``col`` or every column,
    by name, so the order of the input's columns does not matter)."""
    names = [col] if col is not None else sorted(table.columns)
    cols = [table.column(c).to_list() if c != "qid" else table.qid.tolist() for c in names]
    keys = []
    for i in range(len(table)):
        h = hashlib.blake2b(digest_size=16)
        for name, values in zip(names, cols):
            h.update(name.encode())
            _feed(h, values[i])
        keys.append(h.digest())
    return keys


def _feed(h, v) -> None:
    if isinstance(v, np.ndarray):
        h.update(b"A" + str(v.dtype).encode() + repr(v.shape).encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, (bytes, bytearray)):
        h.update(b"B%d:" % len(v) + bytes(v))
    else:
        r = repr(v).encode()
        h.update(b"V%d:" % len(r) + r)


# -- hedging ----------------------------------------------------------------------------------

_PERCENTILE = re.compile(r"^p(\d{1,2}(\.\d+)?)$")


def parse_hedge(value, label: str) -> str | float | None:
    """``hedge="p95"`` (a percentile of the stage's observed latency, p1-p99.9) or a delay
    in seconds (a number > 0). Returns the normalised form: ``"p95"`` or a float."""
    if value is None:
        return None
    if isinstance(value, str):
        m = _PERCENTILE.match(value)
        if m is None or not 0 < float(m.group(1)) < 100:
            raise FlowValueError(
                f"operator map {label!r}: hedge={value!r}; expected a percentile such as 'p95' or a delay in seconds"
            )
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value < float("inf"):
            raise FlowValueError(f"operator map {label!r}: hedge delay must be > 0 seconds and finite, got {value!r}")
        return float(value)
    raise FlowTypeError(f"operator map {label!r}: hedge= takes 'pNN' or seconds, got {value!r}")


def describe_hedge(hedge) -> str:
    if isinstance(hedge, str):
        return f"hedge at {hedge}"
    return f"hedge after {hedge * 1000:g} ms"


# -- ensemble with deadline answers -----------------------------------------------------------


@dataclass(frozen=True)
class EnsembleOp(Operator):
    """Combine the answers of several member branches per query (joined on qid).

    ``fn(answers)`` gets one entry per member, in order: the member's output row (a
    ``Row``), or ``None`` when that member had not answered by the deadline. The output
    is ``names`` plus ``missing``: the names of the members that had not answered,
    comma-separated (``""``: all answered)."""

    kind = "ensemble"
    fn: Any = None
    names: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    deadline_ms: float | None = None

    @property
    def arity(self):  # type: ignore[override]  # a class attribute on Operator, computed here
        return len(self.members)

    @property
    def label(self) -> str:
        return callable_name(self.fn)

    @property
    def rowwise(self):
        return False  # inputs may be missing per request: never merge requests

    def describe(self) -> str:
        when = f"{self.deadline_ms:g} ms after the first answer or " if self.deadline_ms is not None else ""
        return (
            f"ensemble {self.label} of {', '.join(self.members)} -> {', '.join(self.names)}, missing "
            f"[answers at {when}the request's deadline]"
        )

    def instantiate(self):
        return _BoundEnsemble(self, self.label, build_callable(self.fn, None, self.label))


class _BoundEnsemble(BoundOperator):
    op: EnsembleOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __init__(self, op, name, call):
        super().__init__(op, name)
        self.call = call

    def __call__(self, inputs, store=None):
        op: EnsembleOp = self.op
        present = [t for t in inputs if t is not None]
        if not present:
            raise OperatorFailedError(f"operator {self.name!r}: no member answered", operator=self.name)
        order: list[int] = []
        seen_q: set[int] = set()
        where: list[dict[int, int]] = []
        for t in inputs:
            pos: dict[int, int] = {}
            if t is not None:
                for i, q in enumerate(t.qid.tolist()):
                    pos.setdefault(q, i)
                    if q not in seen_q:
                        seen_q.add(q)
                        order.append(q)
            where.append(pos)
        k = len(op.names)
        outputs: list[list] = [[] for _ in range(k)]
        missing_col = []
        for q in order:
            answers = [Row(t, where[m][q]) if t is not None and q in where[m] else None for m, t in enumerate(inputs)]
            missing_col.append(",".join(op.members[m] for m, a in enumerate(answers) if a is None))
            result = _invoke(self.name, self.call, answers, q)
            if k == 1:
                outputs[0].append(result)
                continue
            if not isinstance(result, (tuple, list)) or len(result) != k:
                raise OperatorOutputError(
                    f"operator {self.name!r} returned {type(result).__name__}; expected {k} values for {list(op.names)}",
                    operator=self.name,
                    qid=q,
                )
            for j in range(k):
                outputs[j].append(result[j])
        cols = _columns_from_values(self.name, op.names, outputs, None)
        ctype, arr, valid = build_column(missing_col, MISSING_COLUMN)
        cols[MISSING_COLUMN] = Column(ctype, arr, valid)
        return Table(cols, np.asarray(order, dtype=np.int64))


# -- selection with feedback ------------------------------------------------------------------


def state_prefix(flow: str, key: str) -> str:
    return f"{SYSTEM_PREFIX}select:{flow}:{key}"


def weights_key(prefix: str, context) -> str:
    return f"{prefix}:w:{'' if context is None else context}"


def record_key(prefix: str, qid: int) -> str:
    return f"{prefix}:q:{int(qid)}"


@dataclass(frozen=True)
class SelectOp(Operator):
    """Choose among (Exp3) or combine (Exp4) several models per query, with weights kept
    in the store under ``flowserve:select:<flow>:<key>:w:<context>``."""

    kind = "select"
    models: tuple = ()
    names: tuple[str, ...] = ()
    policy: str = "exp4"
    flow: str = ""
    key: str = "select"
    context: str | None = None
    seed: int = 0
    eta: float = 0.5
    explore: float = 0.1
    threshold: float | None = None
    default: Any = None
    batching_: bool = False

    @property
    def label(self) -> str:
        return f"select({','.join(callable_name(m) for m in self.models)})"

    @property
    def prefix(self) -> str:
        return state_prefix(self.flow, self.key)

    def describe(self) -> str:
        extra = f", by {self.context}" if self.context else ""
        if self.threshold is not None:
            extra += f", default below confidence {self.threshold:g}"
        return (
            f"select {self.policy} of {', '.join(callable_name(m) for m in self.models)} -> "
            f"{', '.join(self.names)}, confidence [seed {self.seed}{extra}]"
        )

    def member(self, i: int) -> MapOp:
        return MapOp(fn=self.models[i], names=self.names, batching_=self.batching_)

    def instantiate(self):
        return _BoundSelect(self, self.label, [self.member(i).instantiate() for i in range(len(self.models))])


def _plain(v):
    """A JSON-able form of a prediction (None if it has none)."""
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return None


def _read_weights(store, keys: list[str], k: int) -> dict[str, np.ndarray]:
    out = {}
    values = read_many(store, keys) if store is not None else [_MISSING] * len(keys)
    for key, v in zip(keys, values):
        w = _decode_weights(v, k)
        out[key] = w
    return out


def _decode_weights(v, k: int) -> np.ndarray:
    if v is _MISSING or v is None:
        return np.ones(k)
    if isinstance(v, (bytes, str)):
        v = json.loads(v)
    w = np.asarray(v, dtype=float)
    if w.shape != (k,) or not np.isfinite(w).all() or (w <= 0).any():
        return np.ones(k)
    return w


def exp3_probabilities(w: np.ndarray, explore: float) -> np.ndarray:
    k = len(w)
    return (1 - explore) * w / w.sum() + explore / k


def exp3_draw(seed: int, qid: int, p: np.ndarray) -> int:
    """The model Exp3 picks for query ``qid``: a function of (seed, qid, p) only."""
    u = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(qid) & 0xFFFFFFFFFFFF]).random()
    return min(int(np.searchsorted(np.cumsum(p), u, side="right")), len(p) - 1)


class _BoundSelect(BoundOperator):
    op: SelectOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __init__(self, op, name, members):
        super().__init__(op, name)
        self.members = members

    def __call__(self, inputs, store=None):
        (table,) = inputs
        op: SelectOp = self.op
        n, k = len(table), len(op.models)
        qids = table.qid.tolist()
        if op.context is not None:
            if op.context not in table.columns:
                raise SchemaError(
                    f"operator {self.name!r}: input has no context column {op.context!r}; "
                    f"columns are {list(table.columns)}"
                )
            contexts = table.column(op.context).to_list()
        else:
            contexts = [None] * n
        wkeys = [weights_key(op.prefix, c) for c in contexts]
        weights = _read_weights(store, list(dict.fromkeys(wkeys)), k)
        if op.policy == "exp3":
            probs = [exp3_probabilities(weights[wk], op.explore) for wk in wkeys]
            chosen = np.asarray([exp3_draw(op.seed, q, p) for q, p in zip(qids, probs)], dtype=np.int64)
            parts, positions = [], []
            for m in np.unique(chosen).tolist():
                idx = np.flatnonzero(chosen == m)
                parts.append(self.members[m]([table.take(idx)], store))
                positions.append(idx)
            if parts:
                out = Table.concat(parts).take(np.argsort(np.concatenate(positions), kind="stable"))
            else:
                out = self.members[0]([table], store)
            conf = [float(p[c]) for p, c in zip(probs, chosen.tolist())]
            first = out.column(op.names[0]).to_list()
            records = [
                {"policy": "exp3", "model": int(c), "p": float(p[c]), "ctx": wk, "pred": _plain(first[i])}
                for i, (p, c, wk) in enumerate(zip(probs, chosen.tolist(), wkeys))
            ]
        else:
            outs = [m([table], store) for m in self.members]
            for j, o in enumerate(outs):
                if len(o) != n:
                    raise OperatorOutputError(
                        f"operator {self.name!r}: model {callable_name(op.models[j])!r} gave {len(o)} rows for {n}",
                        operator=self.name,
                    )
            vectors = _score_vectors(self.name, op, outs)
            if vectors is not None:  # probability / score vectors: a weighted mean (_exp4_mean)
                out, conf, records = _exp4_mean(op, outs, vectors, [weights[wk] for wk in wkeys], wkeys)
                cols = {c: out.column(c) for c in op.names}
                return self._finish(op, table, qids, cols, conf, records, store)
            preds = [o.column(op.names[0]).to_list() for o in outs]
            pick = np.zeros(n, dtype=np.int64)
            conf = []
            records = []
            for i in range(n):
                w = weights[wkeys[i]]
                votes: dict = {}
                for j in range(k):
                    key = _vote_key(preds[j][i])
                    votes.setdefault(key, [0.0, []])
                    votes[key][0] += w[j]
                    votes[key][1].append(j)
                best = max(votes.values(), key=lambda v: v[0])  # ties: the first answer in model order
                agree = best[1]
                pick[i] = max(agree, key=lambda j: (w[j], -j))
                conf.append(len(agree) / k)
                records.append({"policy": "exp4", "preds": [_plain(preds[j][i]) for j in range(k)], "ctx": wkeys[i]})
            rows = [outs[int(pick[i])].take(np.asarray([i])) for i in range(n)]
            out = Table.concat(rows) if rows else outs[0]
        cols = {c: out.column(c) for c in op.names}
        return self._finish(op, table, qids, cols, conf, records, store)

    def _finish(self, op: SelectOp, table: Table, qids: list[int], cols: dict, conf: list, records: list, store):
        """The answer's columns plus confidence, the default below the threshold, and the records."""
        n = len(table)
        conf_col = Column(*build_column(conf, CONFIDENCE_COLUMN)) if n else None
        if op.threshold is not None and n:
            low = [i for i, c in enumerate(conf) if c < op.threshold]
            if low:
                cols = _with_default(self.name, op, cols, low, n)
        if conf_col is None:
            ctype, arr, valid = build_column([], CONFIDENCE_COLUMN)
            conf_col = Column(ctype, np.zeros(0, dtype=float), valid)
        cols[CONFIDENCE_COLUMN] = conf_col
        _write_records(store, op, qids, records)
        return Table(cols, table.qid)


def _score_vectors(name: str, op: SelectOp, outs: list[Table]) -> list | None:
    """The models' first output column as (values, valid) per model if every model gave a
    1-d numeric vector per row (a tensor column), else None (Exp4 votes on it instead)."""
    cols = [o.column(op.names[0]) for o in outs]
    vector = [c.type.kind == "tensor" and len(c.type.shape) == 1 and c.type.dtype.kind in "biuf" for c in cols]
    if not any(vector):
        return None
    if not all(vector) or len({c.type.shape for c in cols}) != 1:
        got = ", ".join(f"{callable_name(m)}: {c.type}" for m, c in zip(op.models, cols))
        raise OperatorOutputError(
            f"operator {name!r}: Exp4 averages the models' {op.names[0]!r} vectors only if every model gives "
            f"a vector of one length; got {got}",
            operator=name,
        )
    return [(c.values.astype(float, copy=False), c.valid) for c in cols]


def _exp4_mean(op: SelectOp, outs: list[Table], vectors: list, weights: list[np.ndarray], wkeys: list[str]):
    """Exp4 on score vectors: per row, the weighted mean of the models' vectors (a model
    whose vector is missing abstains); the answer class is its argmax. The other columns
    come from the heaviest model whose own argmax is that class (else the heaviest model)."""
    n, k = len(outs[0]), len(outs)
    if n == 0:
        return outs[0], [], []
    values = np.stack([v for v, _ in vectors], axis=1)  # (n, k, classes)
    present = np.stack([np.ones(n, dtype=bool) if ok is None else ok for _, ok in vectors], axis=1)  # (n, k)
    w = np.asarray(weights, dtype=float).reshape(n, k) * present
    total = w.sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    mean = np.einsum("nk,nkc->nc", w, np.where(present[:, :, None], values, 0.0)) / safe[:, None]
    answered = total > 0
    own = values.argmax(axis=2)  # (n, k): each model's class
    cls = mean.argmax(axis=1)
    conf, pick, records = [], np.zeros(n, dtype=np.int64), []
    for i in range(n):
        agree = [j for j in range(k) if present[i, j] and own[i, j] == cls[i]] if answered[i] else []
        pool = agree or list(range(k))
        pick[i] = max(pool, key=lambda j: (w[i, j], -j))
        conf.append(len(agree) / k)
        records.append(
            {
                "policy": "exp4",
                "preds": [int(own[i, j]) if present[i, j] else None for j in range(k)],
                "answer": int(cls[i]) if answered[i] else None,
                "ctx": wkeys[i],
            }
        )
    rows = [outs[int(pick[i])].take(np.asarray([i])) for i in range(n)]
    out = Table.concat(rows) if rows else outs[0]
    first = op.names[0]
    ctype, arr, valid = build_column([mean[i] if answered[i] else None for i in range(n)], first)
    cols = {c: out.column(c) for c in out.columns}
    cols[first] = Column(ctype, arr, valid)
    return Table(cols, out.qid), conf, records


def _vote_key(v):
    if isinstance(v, np.ndarray):
        return ("A", v.tobytes())
    if isinstance(v, np.generic):
        return v.item()
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


def _with_default(name, op: SelectOp, cols: dict, low: list[int], n: int) -> dict:
    defaults = op.default if isinstance(op.default, tuple) else (op.default,)
    out = {}
    for j, c in enumerate(op.names):
        values = cols[c].to_list()
        d = defaults[j] if j < len(defaults) else None
        for i in low:
            values[i] = d
        try:  # a vector column stays one: its default is a vector of its length, or None
            ctype, arr, valid = build_column(values, c, cols[c].type if cols[c].type.kind == "tensor" else None)
        except Exception as e:  # the user's default value: whatever the builder refuses is the operator's error
            raise OperatorOutputError(f"operator {name!r}: default answer does not fit column {c!r}: {e}") from None
        out[c] = Column(ctype, arr, valid)
    return out


def _write_records(store, op: SelectOp, qids: list[int], records: list[dict]) -> None:
    """Remember what each query was answered with, for its feedback (not in a read-only
    mapping, e.g. flow.run without a store)."""
    if store is None or not records:
        return
    keys = [record_key(op.prefix, q) for q in qids]
    if isinstance(store, MutableMapping):
        for key, rec in zip(keys, records):
            store[key] = json.dumps(rec)
        return
    if isinstance(store, Mapping):
        return
    redis = getattr(store, "redis", None)
    if redis is not None:  # a KVS: one round trip, records expire if no feedback comes
        pipe = redis.pipeline(transaction=False)
        for key, rec in zip(keys, records):
            pipe.set(key, json.dumps(rec).encode(), ex=RECORD_TTL_S)
        pipe.execute()
        return
    store.mput({key: json.dumps(rec) for key, rec in zip(keys, records)})


# -- feedback -----------------------------------------------------------------------------------


class FeedbackError(DataError, ValueError):
    """Feedback that cannot be applied: an unknown qid, or neither/both of reward and label
    (fix the feedback request; the gateway answers 400, or 404 for an unknown qid)."""


def selects_of(flow_or_ops) -> list[SelectOp]:
    ops = flow_or_ops
    if hasattr(flow_or_ops, "nodes"):
        ops = [n.op for n in flow_or_ops.nodes]
    return [op for op in ops if isinstance(op, SelectOp)]


def apply_feedback(store, selects: Sequence[SelectOp], qid, reward=None, label=None) -> int:
    """Update the weights of every ``select`` that answered query ``qid``: ``reward`` in
    [0, 1] (1: right), or the true ``label`` (each model judged by its own prediction under
    Exp4, the chosen one under Exp3). Returns how many selects it updated; FeedbackError if
    none had a record of the query."""
    if (reward is None) == (label is None):
        raise FeedbackError("feedback needs exactly one of reward (a number in [0, 1]) or label")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not 0 <= reward <= 1:
            raise FeedbackError(f"feedback reward must be a number in [0, 1], got {reward!r}")
    if isinstance(qid, bool) or not isinstance(qid, (int, np.integer)):
        raise FeedbackError(f"feedback qid must be an int, got {qid!r}")
    updated = 0
    for op in selects:
        rkey = record_key(op.prefix, int(qid))
        rec = _get_raw(store, rkey)
        if rec is None:
            continue
        k = len(op.models)
        w = _decode_weights(_get_raw(store, rec["ctx"], raw_json=False), k)
        if rec["policy"] == "exp3":
            r = float(reward) if reward is not None else float(rec["pred"] == label)
            j = int(rec["model"])
            w[j] *= math.exp(-op.eta * (1.0 - r) / max(rec["p"], 1e-9))
        else:
            preds = rec["preds"]
            if label is not None:
                loss = np.asarray([float(p != label) for p in preds])
            elif "answer" in rec:  # score vectors: the answer was the mean's class (_exp4_mean)
                agree = np.asarray([p is not None and p == rec["answer"] for p in preds])
                loss = np.where(agree, 1.0 - float(reward), float(reward))
            else:
                votes: dict = {}
                for j, p in enumerate(preds):
                    votes[_vote_key(p)] = votes.get(_vote_key(p), 0.0) + w[j]
                answer = max(votes, key=votes.__getitem__)
                agree = np.asarray([_vote_key(p) == answer for p in preds])
                loss = np.where(agree, 1.0 - float(reward), float(reward))
            w = w * np.exp(-op.eta * loss)
        w = np.maximum(w / w.max(), 1e-12)
        _put(store, rec["ctx"], [float(x) for x in w])
        _delete(store, rkey)
        updated += 1
    if not updated:
        raise FeedbackError(f"no selection record for qid {qid} (unknown, already given feedback, or expired)")
    return updated


def feedback(store, flow, qid, *, reward=None, label=None) -> int:
    """In-process feedback for ``flow.run(..., kvs=store)``: see ``apply_feedback``."""
    return apply_feedback(store, selects_of(flow), qid, reward=reward, label=label)


def _get_raw(store, key: str, raw_json: bool = True):
    if isinstance(store, Mapping):
        v = store.get(key)
    else:
        redis = getattr(store, "redis", None)
        v = redis.get(key) if (redis is not None and raw_json) else store.get(key, None)
    if v is None:
        return None
    return json.loads(v) if isinstance(v, (bytes, str)) else v


def _put(store, key: str, value) -> None:
    if isinstance(store, MutableMapping):
        store[key] = json.dumps(value)
    else:
        store.put(key, value)


def _delete(store, key: str) -> None:
    if isinstance(store, MutableMapping):
        store.pop(key, None)
    else:
        store.delete(key)
