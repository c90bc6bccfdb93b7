"""The autoscaling control loop of a local cluster, and its local-process backend.

Every ``interval_s`` it turns what the gateway saw per stage (requests routed to it,
run time per request from the answers' traces, requests in flight) into
``StageMetrics``, asks the policy (``executors.autoscale``) for decisions, and applies
them: a scale-up pins the stage on more executors (building it there first, starting
a new executor process when every existing one already hosts it, up to
``max_executors``); a scale-down unpins it from the least busy ones. Unpinning is the
drain: the gateway routes no new request there, and requests already routed keep their
routes and finish. Extra executor processes that host nothing are stopped.

Decisions are logged, counted in ``/metrics`` (``flowserve_scaling_decisions_total``) and
shown per stage in ``GET /flows/{name}`` and ``flowserve status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from executors.autoscale import Autoscaler, AutoscalingConfig, ScalingDecision, StageMetrics

log = logging.getLogger("flowserve.autoscaler")


@dataclass
class StageCounters:
    """What the gateway saw of one stage since the last control step."""

    arrivals: int = 0
    service_ms: float = 0.0
    served: int = 0
    last: list = field(default_factory=list)  # recent decisions, for status


class ExecutorBackend(Protocol):
    """Where new executors come from: local processes (daemon.py), Kubernetes pods
    (k8s/scaling.py), or nowhere (``FixedExecutors``)."""

    async def add_executor(self, device: str) -> str | None:
        """Start one more executor of class ``device``; its id once it serves, else None."""

    async def remove_executor(self, executor_id: str) -> None:
        """Stop an executor that hosts nothing any more."""

    def removable(self) -> list[str]:
        """Executors this backend started beyond the baseline (stopped when idle)."""


class FixedExecutors:
    """No backend: stages scale across the executors the cluster already has."""

    async def add_executor(self, device: str) -> str | None:
        return None

    async def remove_executor(self, executor_id: str) -> None:
        return None

    def removable(self) -> list[str]:
        return []


class ScalingLoop:
    def __init__(
        self,
        dispatcher_of,
        backend: ExecutorBackend,
        config: AutoscalingConfig,
        *,
        metrics=None,
        interval_s: float = 0.5,
        max_executors: int = 8,
    ):
        self._dispatcher_of = dispatcher_of  # the dispatcher exists once the app starts
        self.backend = backend
        self.config = config
        self.metrics = metrics
        self.interval_s = interval_s
        self.max_executors = max_executors
        self.scalers: dict[str, Autoscaler] = {}
        self.decisions: dict[tuple[str, str], list[ScalingDecision]] = {}
        self._last = time.monotonic()

    @property
    def dispatcher(self):
        return self._dispatcher_of()

    def initial_placement(self, plan, full: dict[str, list[str]]) -> dict[str, list[str]]:
        """Start each scalable stage on ``min_replicas`` (at least one) executors."""
        out = {}
        for name, stage in plan.stages.items():
            if stage.continuation is not None or stage.competitive > 1:
                out[name] = full[name]  # key-routed / racing stages keep their spread
            else:
                out[name] = full[name][: max(1, self.config.min_replicas)]
        return out

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.step()
            except Exception:  # the control loop must outlive a bad step
                log.exception("autoscaling step failed")

    async def step(self) -> None:
        now = time.monotonic()
        dt = max(now - self._last, 1e-3)
        self._last = now
        d = self.dispatcher
        for name, flow in list(d.flows.items()):
            scaler = self.scalers.get(name)
            scalable = [s for s, st in flow.plan.stages.items() if st.continuation is None and st.competitive == 1]
            if scaler is None or set(scaler.configs) != set(scalable):
                scaler = self.scalers[name] = Autoscaler({s: self.config for s in scalable})
            inflight = d.inflight_by_stage(name)
            for stage in scalable:
                c = d.stage_counters(name, stage)
                service = c.service_ms / c.served if c.served else 0.0
                scaler.observe(
                    stage,
                    StageMetrics(
                        time=now,
                        arrival_rate=c.arrivals / dt,
                        service_time_ms=service,
                        replicas=len(flow.placement[stage]),
                        inflight=inflight.get(stage, 0),
                        device=flow.plan.stages[stage].device,
                    ),
                )
                c.arrivals, c.service_ms, c.served = 0, 0.0, 0
            for decision in scaler.decide(now):
                await self.apply(name, decision)
        await self._stop_idle_extras()

    async def apply(self, flow_name: str, decision: ScalingDecision) -> None:
        log.warning("flow %s: %s", flow_name, decision)
        d = self.dispatcher
        flow = d.flows.get(flow_name)
        if flow is None:
            return
        current = list(flow.placement[decision.stage])
        if decision.to_replicas > len(current):
            for _ in range(decision.to_replicas - len(current)):
                ex_id = await self._free_executor(flow, decision.stage, current)
                if ex_id is None:
                    log.warning("flow %s: no executor left for stage %s", flow_name, decision.stage)
                    break
                errors = await d.load(flow_name, flow.version, {decision.stage: [ex_id]}, 120)
                if errors.get(ex_id):
                    log.warning("building stage %s on %s failed: %s", decision.stage, ex_id, errors[ex_id])
                    break
                current.append(ex_id)
        else:
            # drain the least busy first: unpinned, they get no new requests of this stage
            busy = {e: d.executors[e].inflight for e in current}
            keep = sorted(current, key=lambda e: -busy[e])[: max(1, decision.to_replicas)]
            current = [e for e in current if e in keep]
        flow.placement[decision.stage] = current
        self.decisions.setdefault((flow_name, decision.stage), []).append(decision)
        if self.metrics:
            self.metrics.scaling.labels(flow_name, decision.stage, decision.direction).inc()

    async def _free_executor(self, flow, stage: str, current: list[str]) -> str | None:
        d = self.dispatcher
        device = flow.plan.stages[stage].device
        pool = [
            e
            for e in d.executors.values()
            if e.alive
            and e.id not in current
            and (e.device == device or not any(x.device == device for x in d.executors.values()))
        ]
        if pool:
            return min(pool, key=lambda e: (e.inflight, e.id)).id
        if len(d.executors) >= self.max_executors:
            return None
        return await self.backend.add_executor(device)

    async def _stop_idle_extras(self) -> None:
        used = {e for f in self.dispatcher.flows.values() for ids in f.placement.values() for e in ids}
        for id_ in self.backend.removable():
            info = self.dispatcher.executors.get(id_)
            if id_ not in used and (info is None or info.inflight == 0):
                await self.backend.remove_executor(id_)

    def status(self, flow_name: str) -> dict[str, dict]:
        scaler = self.scalers.get(flow_name)
        out = {}
        if scaler is None:
            return out
        for stage, st in scaler.status().items():
            last = self.decisions.get((flow_name, stage), [])
            out[stage] = {
                "target": st.replicas,
                "need": st.need,
                "reason": st.reason,
                "last_decision": str(last[-1]) if last else None,
            }
        return out
