"""Where an executor runs a stage: on its IO thread (cheap) or on its worker pool."""

from executors.worker.hosting import CHEAP_MS, COSTLY_MS, HostedStage
from flow import Flow
from optimizer import OptimizerOptions, optimize


def _hosted() -> HostedStage:
    f = Flow("costs")
    f.map(lambda r: r.x + 1, names=["y"])
    plan = optimize(f)
    return HostedStage(plan, plan.sink, 1)


def _settle(hosted: HostedStage, ms: float, runs: int = 40) -> None:
    for _ in range(runs):
        hosted.observe(ms)


def test_an_unmeasured_stage_starts_on_the_pool_and_a_quick_one_moves_to_the_io_thread():
    hosted = _hosted()
    assert not hosted.cheap
    _settle(hosted, CHEAP_MS / 4)
    assert hosted.cheap


def test_a_stage_near_the_threshold_does_not_flip_back_and_forth():
    hosted = _hosted()
    _settle(hosted, CHEAP_MS * 0.9)
    assert hosted.cheap
    seen = set()
    for ms in [CHEAP_MS * 1.3, CHEAP_MS * 0.7] * 20:  # averages about CHEAP_MS, either side
        hosted.observe(ms)
        seen.add(hosted.cheap)
    assert seen == {True}


def test_a_stage_that_became_costly_goes_to_the_pool_and_stays_until_it_is_cheap_again():
    hosted = _hosted()
    _settle(hosted, CHEAP_MS / 4)
    _settle(hosted, COSTLY_MS * 1.5)
    assert not hosted.cheap
    _settle(hosted, (CHEAP_MS + COSTLY_MS) / 2)  # between the thresholds: stays on the pool
    assert not hosted.cheap
    _settle(hosted, CHEAP_MS / 2)
    assert hosted.cheap


def _raced(**options) -> HostedStage:
    f = Flow("races")
    f.map(lambda r: r.x + 1, names=["y"], high_variance=True, **options)
    plan = optimize(f, options=OptimizerOptions(competitive_replicas=3))
    return HostedStage(plan, plan.sink, 1)


def test_a_racing_or_hedged_stage_stays_on_the_pool_however_quick():
    """Its copies on one executor must run beside each other, and a copy waiting in
    flow.wait must be stoppable by a Cancel that the IO thread reads."""
    for hosted in (_raced(), _raced(hedge=0.05)):
        assert hosted.stage.competitive > 1 or hosted.stage.hedge is not None
        _settle(hosted, CHEAP_MS / 10)
        assert hosted.pooled and not hosted.cheap
