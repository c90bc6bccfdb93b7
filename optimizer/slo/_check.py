"""Small validators shared by the SLO modules: each raises an FlowValueError quoting the value."""

from __future__ import annotations

import math

from flow.errors import FlowTypeError, FlowValueError
from optimizer.plan import _is_int


def positive_number(what: str, v, allow_zero: bool = False) -> float:
    """``v`` as a float if it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise FlowTypeError(f"{what} must be a number, got {type(v).__name__} {v!r:.80}")
    f = float(v)
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise FlowValueError(f"{what} must be a finite number {bound}, got {v!r}")
    return f


def positive_int(what: str, v, minimum: int = 1) -> int:
    if not _is_int(v):
        raise FlowTypeError(f"{what} must be an int, got {type(v).__name__} {v!r:.80}")
    if v < minimum:
        raise FlowValueError(f"{what} must be >= {minimum}, got {v!r}")
    return int(v)


def name(what: str, v) -> str:
    if not isinstance(v, str) or not v:
        raise FlowTypeError(f"{what} must be a non-empty str, got {v!r:.80}")
    return v
