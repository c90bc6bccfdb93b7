"""The SLO machinery's one exception of its own; its other mistakes (a bad SLO, profile,
trace or planner setting) are ``flow.errors.FlowValueError``/``FlowTypeError`` quoting
the bad value, like the optimizer's."""

from __future__ import annotations

from flow.errors import FlowValueError


class InfeasibleSLOError(FlowValueError):
    """No configuration the planner may choose meets the SLO. ``stage`` names the stage
    that cannot meet it (its fastest run alone, or the bottleneck the search could not
    relieve), so the user knows what to speed up or which budget to relax."""

    stage: str | None = None
