"""Row positions of key-split parts: how a continuation's parts merge back in request order.

A continuation stage runs once per key group: the runtime splits its input rows by key
among the stage's replicas, and the consumer merges the groups' outputs. ``flow.run`` keeps
row order through the row-wise operators a continuation holds, so the merge must put every
row back where it was. Each part therefore carries its rows' positions in the table that
was split first (the root of the split tree) in a hidden column, ``POS``:

- ``split(table, idx)`` makes a part; a part that is split again keeps its rows' root
  positions (nested splits compose: positions stay relative to the root);
- the runtime runs a continuation stage on a part (``executors.worker.stage_runner``): its
  operators never see ``POS``; maps and lookups keep rows 1:1, filters drop some (their
  mask says which), so the output's positions are the surviving rows' (``with_positions``).
  A continuation stage is a chain of such one-input operators (``Stage`` validates it), so
  that is all it can do to rows;
- ``merge(parts)`` concatenates the parts and orders their rows by position (the root's
  order), dropping ``POS``.

A column travels with the Table through every runtime path for free: the wire format,
in-process hand-over, batching merges (``Table.concat``) and splits (``take``). Rows with
the same qid (after a union or join) are told apart, which matching by qid could not do.
Only tables sent to continuation stages carry it; every other path is untouched.

    part = split(table, np.array([0, 3]))    # rows 0 and 3, POS = [0, 3]
    out = BoundStage(stage)([part], store)   # POS = [0] if a filter dropped row 3
    merge([out, other_part_out])              # rows in the split table's order
"""

from __future__ import annotations

import numpy as np

from flow.table import Column, Table
from flow.types import ColumnType

# Not an identifier, so no operator can name an output column so; a request that brings a
# column of this name is refused by the gateway (executors/codec/bodies.py).
POS = "#pos"
_INT = ColumnType.parse(int, POS)


def split(table: Table, idx: np.ndarray) -> Table:
    """The rows of ``table`` at ``idx`` (ascending) as one part of a key split."""
    idx = np.asarray(idx, dtype=np.int64)
    part = table.take(idx)
    if POS in table.columns:  # a part split again: its rows keep their root positions
        return part
    return part.with_columns({POS: Column(_INT, idx)})


def whole(table: Table) -> Table:
    """``table`` as the only part of a split (a key split over one replica)."""
    return split(table, np.arange(len(table), dtype=np.int64))


def positions(table: Table) -> np.ndarray | None:
    """The root positions of a part's rows, or None for a table that is not a part."""
    return table.column(POS).values if POS in table.columns else None


def strip(table: Table) -> Table:
    """``table`` without ``POS``."""
    if POS not in table.columns:
        return table
    return table.select([c for c in table.columns if c != POS])


def with_positions(table: Table, pos: np.ndarray) -> Table:
    """``table`` (without ``POS``) carrying ``pos`` as its rows' positions."""
    return table.with_columns({POS: Column(_INT, pos)})


def merge(parts: list[Table]) -> Table:
    """One table from the parts of a split (in any order), rows in the root's order."""
    table = parts[0] if len(parts) == 1 else Table.concat(parts)
    pos = positions(table)
    if pos is None:
        return table
    table = strip(table)
    if len(parts) > 1 and len(pos) > 1 and (np.diff(pos) < 0).any():
        table = table.take(np.argsort(pos, kind="stable"))
    return table
