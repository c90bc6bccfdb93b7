"""The SLO machinery's exceptions, under the optimizer's ``PlanError`` (so a caller that
already catches plan mistakes catches these too)."""

from __future__ import annotations

from optimizer.plan import PlanError, PlanTypeError


class SLOError(PlanError):
    """A bad SLO, profile, trace or planner setting; the message quotes the bad value."""


class SLOTypeError(SLOError, PlanTypeError):
    """An SLO argument has the wrong type."""


class InfeasibleSLOError(SLOError):
    """No configuration the planner may choose meets the SLO. ``stage`` names the stage
    that cannot meet it (its fastest run alone, or the bottleneck the search could not
    relieve), so the user knows what to speed up or which budget to relax."""

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage
