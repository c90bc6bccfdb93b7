"""Where a stage's output goes: one replica, all competing copies, or key groups by hash.

Shared by the gateway (sending a request's rows to the first stages) and executors
(sending a stage's output to its consumers), so both route the same way.

Continuation stages (a per-row ``lookup(column=...)`` at their head) are routed by
rendezvous (highest-random-weight) hashing of each row's key onto the stage's replicas:
the same key always lands on the same executor while the replica set is unchanged, so
that executor's local cache holds it after the first read; when a replica is added or
removed only the keys of that replica move (about 1/n of them). An executor that already
holds a row's key in its own cache may keep that row (a hit here costs no hop; a hit at
the owner costs one): the owner is where a key is read from the store, not the only place
it may be served from. The executor decides which (``worker.outputs.Outputs._kept_keys``: none while
its cache is evicting).

Racing copies of a producer (``competitive > 1``) each split the same output, and label
their parts alike; consumers keep the first part per label. The labels only fit together
if every copy splits the same way, so a racing producer routes continuation rows by pure
rendezvous, ignoring its own cache (``keeps_rows``): a part then has one content and one
destination whichever copy sends it, and the continuation there runs it once. A hedged
producer's backup copy races its primary the same way, so it routes the same way.

Each part carries its rows' positions in the table that was split (``optimizer.positions``),
so consumers merge the parts back into the request's row order (``merge``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flow.table import Table
from optimizer import positions

Path = tuple  # of (index, count) pairs: where a part sits in the tree of key splits


@dataclass(frozen=True)
class Delivery:
    """One message to send: ``table`` to ``address``; ``path`` locates it among the parts
    of a key-split output (empty: the whole output). A part's table carries its rows'
    positions in the split table (``optimizer.positions``)."""

    address: str
    table: Table
    path: Path = ()
    copy: int = 0  # which racing copy (competitive stages may put several on one executor)


def rendezvous(key, addresses: list[str]) -> str:
    """The address with the highest hash weight for ``key`` (stable, minimal movement)."""
    kb = key if isinstance(key, bytes) else str(key).encode()
    best, best_score = addresses[0], b""
    for addr in addresses:
        score = hashlib.blake2b(kb + b"\x00" + addr.encode(), digest_size=8).digest()
        if score > best_score:
            best, best_score = addr, score
    return best


def deliveries(
    table: Table,
    stage,
    addresses: list[str],
    path: Path = (),
    *,
    here: str | None = None,
    holds: Callable[[str], bool] | None = None,
) -> list[Delivery]:
    """Messages that carry ``table`` to consumer ``stage`` whose replicas are ``addresses``.

    ``path``: the table is itself one part of a key-split output; a continuation consumer
    splits it further (the path grows), others get it as that part and merge all parts.
    ``here`` / ``holds``: the sender's address and its cache's membership test; rows of a
    continuation whose key the sender holds stay with it if it is one of ``addresses``.
    """
    if not addresses:
        return []
    if stage.continuation is not None:
        local = holds if here is not None and holds is not None and here in addresses else None
        return _by_key(table, stage.continuation, addresses, path, here, local)
    if len(addresses) > 1 and stage.hedge is not None:
        # a hedged stage: the first replica runs it; the second is its backup (executors/worker/hedging.py)
        return [Delivery(addresses[0], table, path)]
    if len(addresses) > 1:
        # competing copies: every copy runs, the consumer keeps the first answer
        return [Delivery(a, table, path, j) for j, a in enumerate(addresses)]
    return [Delivery(addresses[0], table, path)]


def keeps_rows(producer, consumer) -> bool:
    """True if the executor running ``producer`` may keep ``consumer``'s continuation rows
    whose key its cache holds. Not for a racing producer: its copies run on executors whose
    caches differ, and would each split the same rows differently under the same labels
    (rows duplicated or lost, or parts that never add up). Pure rendezvous makes every
    copy's split the same; the first copy of each part to arrive at its owner runs. (Routing
    only the winner's output would need the copies to agree on a winner first: a round trip.)
    Nor for a hedged producer: its backup copy is a racing copy that starts late."""
    return consumer.continuation is not None and producer.competitive == 1 and producer.hedge is None


def _by_key(
    table: Table, column: str, addresses: list[str], path: Path, here: str | None, holds: Callable[[str], bool] | None
) -> list[Delivery]:
    if len(addresses) == 1 or len(table) == 0 or column not in table.columns:
        # the only part of its split: its rows stay in order, so it needs no positions (a
        # part split before keeps its own; a split of it later numbers its rows from here,
        # which are the root's positions too)
        return [Delivery(addresses[0], table, path + ((0, 1),))]
    keys = table.column(column).to_list()
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        cached_here = holds is not None and isinstance(k, str) and holds(k)
        groups.setdefault(here if cached_here else rendezvous(k, addresses), []).append(i)
    n = len(groups)
    return [
        Delivery(addr, positions.split(table, np.asarray(idx, dtype=np.int64)), path + ((p, n),))
        for p, (addr, idx) in enumerate(sorted(groups.items()))
    ]


def merge(parts: dict) -> Table:
    """One Table from the parts of an output, ``{path: Table}`` (complete): a single part as
    it is, several in the request's row order (by the positions they carry)."""
    if len(parts) == 1 and () in parts:
        return parts[()]  # not split: nothing to merge
    return positions.merge([parts[p] for p in sorted(parts)])


def whole(path) -> bool:
    """True if the one part at ``path`` is a whole output: every split on its way was of one
    part (``complete`` of that path alone; the root's path ``()`` is whole)."""
    return all(n == 1 for _part, n in path)


def complete(paths) -> bool:
    """True if the parts at ``paths`` make up a whole output (every split fully present)."""
    paths = set(paths)
    if () in paths:
        return len(paths) == 1
    if not paths:
        return False
    n = next(iter(paths))[0][1]
    children: dict[int, set] = {}
    for p in paths:
        (i, count), rest = p[0], p[1:]
        if count != n:
            return False
        children.setdefault(i, set()).add(rest)
    return set(children) == set(range(n)) and all(complete(c) for c in children.values())
