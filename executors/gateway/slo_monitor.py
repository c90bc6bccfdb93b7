"""The gateway's figures of flows served under a latency SLO (optimizer/slo; the runtime's
planning side is executors/hosts/profiling.py)."""

from __future__ import annotations

import json
import time

from optimizer.plan import Plan
from optimizer.slo import ArrivalEnvelope


class SLOMonitor:
    """Per flow with an SLO: answers within it and over it (``/metrics``:
    ``flowserve_slo_attainment``), each stage's budget share, and the arrival envelope.
    Flows without an SLO cost one attribute test per request."""

    def __init__(self, metrics=None):
        self.metrics = metrics
        self.envelopes: dict[str, ArrivalEnvelope] = {}
        self.counts: dict[str, list[int]] = {}  # flow -> [within, total]
        self._t0 = time.monotonic()
        self._shares: set = set()

    def arrived(self, name: str, plan: Plan) -> None:
        if getattr(plan, "slo", None) is None:
            return
        env = self.envelopes.get(name)
        if env is None:
            env = self.envelopes[name] = ArrivalEnvelope()
        env.record((time.monotonic() - self._t0) * 1000.0)

    def answered(self, name: str, plan: Plan, ms: float) -> None:
        slo = getattr(plan, "slo", None)
        if slo is None:
            return
        c = self.counts.setdefault(name, [0, 0])
        c[1] += 1
        if ms <= slo.slo.p99_ms:
            c[0] += 1
        if self.metrics is not None:
            m = self.metrics
            m.child(m.slo_requests, name, "within" if ms <= slo.slo.p99_ms else "over").inc()
            m.child(m.slo_attainment, name).set(c[0] / c[1])
            if (name, id(slo)) not in self._shares:  # set once per deployed version
                self._shares.add((name, id(slo)))
                m.child(m.slo_target, name).set(slo.slo.p99_ms)
                for stage, share in slo.shares().items():
                    m.child(m.slo_budget_share, name, stage).set(share)

    def attainment(self, name: str) -> float | None:
        c = self.counts.get(name)
        return None if not c or not c[1] else c[0] / c[1]

    def now_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1000.0

    def describe(self, name: str, plan: Plan) -> dict | None:
        """``GET /flows/{name}``'s ``slo`` field."""
        slo = getattr(plan, "slo", None)
        if slo is None:
            return None
        out = slo.to_dict()
        c = self.counts.get(name, [0, 0])
        out["answered"] = c[1]
        out["attainment"] = self.attainment(name)
        return out


def slo_json(slo) -> str:
    return json.dumps(slo.to_dict())
