"""``SLO``: the latency objective a flow is served under.

SLO(p99_ms=50)                        # 99% of requests answered within 50 ms
SLO(p99_ms=50, p50_ms=20)             # and half of them within 20 ms
SLO(p99_ms=200, percentile=99.9)      # the bound applies to the 99.9th percentile
"""

from __future__ import annotations

from dataclasses import dataclass

from flow.errors import FlowValueError
from optimizer.slo._check import positive_number


@dataclass(frozen=True)
class SLO:
    """A tail-latency bound: ``percentile`` % of requests (default 99) end to end within
    ``p99_ms`` milliseconds, optionally also a median bound ``p50_ms``.

    The field keeps the name ``p99_ms`` whatever the percentile, because p99 is what users
    ask for (InferLine's and Clipper's objectives); ``percentile`` only moves the quantile.
    """

    p99_ms: float
    p50_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self):
        object.__setattr__(self, "p99_ms", positive_number("SLO.p99_ms", self.p99_ms))
        if self.p50_ms is not None:
            object.__setattr__(self, "p50_ms", positive_number("SLO.p50_ms", self.p50_ms))
            if self.p50_ms > self.p99_ms:
                raise FlowValueError(f"SLO.p50_ms ({self.p50_ms!r}) cannot exceed SLO.p99_ms ({self.p99_ms!r})")
        pct = positive_number("SLO.percentile", self.percentile)
        if not 50 <= pct < 100:
            raise FlowValueError(f"SLO.percentile must be in [50, 100), got {self.percentile!r}")
        object.__setattr__(self, "percentile", pct)

    def met_by(self, tail_ms: float, median_ms: float | None = None) -> bool:
        """True if a measured (or simulated) tail and median satisfy this SLO."""
        if tail_ms > self.p99_ms:
            return False
        return self.p50_ms is None or median_ms is None or median_ms <= self.p50_ms

    def to_dict(self) -> dict:
        return {"p99_ms": self.p99_ms, "p50_ms": self.p50_ms, "percentile": self.percentile}

    @classmethod
    def from_dict(cls, d) -> SLO:
        if not isinstance(d, dict) or "p99_ms" not in d:
            raise FlowValueError(f"an SLO needs a dict with 'p99_ms', got {d!r:.120}")
        unknown = set(d) - {"p99_ms", "p50_ms", "percentile"}
        if unknown:
            raise FlowValueError(f"unknown SLO field(s) {sorted(unknown)}; known: p99_ms, p50_ms, percentile")
        return cls(d["p99_ms"], d.get("p50_ms"), d.get("percentile", 99.0))

    def describe(self) -> str:
        tail = "p99" if self.percentile == 99.0 else f"p{self.percentile:g}"
        out = f"{tail} <= {self.p99_ms:g} ms"
        return out + (f", p50 <= {self.p50_ms:g} ms" if self.p50_ms is not None else "")
