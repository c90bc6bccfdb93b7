"""What the gateway sees of each stage between two steps of the control loop: arrivals,
run time and batch sizes from the answers' traces (the autoscaler and SLO tuner read them,
``GET /flows/{name}`` shows them)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class StageCounters:
    """What the gateway saw of one stage since the last control step."""

    arrivals: int = 0
    service_ms: float = 0.0
    served: int = 0
    last: list = field(default_factory=list)  # recent decisions, for status
    batches: deque = field(default_factory=lambda: deque(maxlen=4096))  # (monotonic s, batch size) per answer
    caps: dict = field(default_factory=dict)  # executor -> (monotonic s, AIMD's cap) from its last answer

    def batch_seen(self, window_s: float = 2.0, now: float | None = None) -> dict | None:
        """The batches the answers of the last ``window_s`` ran in: their mean size (per
        batch, not per request) and the largest; None when none was answered."""
        now = time.monotonic() if now is None else now
        sizes = [b for t, b in list(self.batches) if t > now - window_s]
        if not sizes:
            return None
        return {"mean": round(len(sizes) / sum(1.0 / b for b in sizes), 2), "max": max(sizes), "window_s": window_s}

    def batch_caps(self, window_s: float = 60.0, now: float | None = None) -> dict | None:
        """AIMD's cap on each executor, as its latest answer of the last ``window_s`` said;
        None when no answer carried one (no SLO, or no traffic)."""
        now = time.monotonic() if now is None else now
        caps = {ex: cap for ex, (t, cap) in list(self.caps.items()) if t > now - window_s}
        return caps or None
