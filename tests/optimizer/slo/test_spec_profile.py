"""SLO and Profile: validation with clear errors, the fit, and the JSON round trip."""

from __future__ import annotations

import pytest

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo import SLO, LatencyFit, Profile


def test_slo_fields_and_defaults():
    slo = SLO(p99_ms=50, p50_ms=20)
    assert (slo.p99_ms, slo.p50_ms, slo.percentile) == (50.0, 20.0, 99.0)
    assert slo.describe() == "p99 <= 50 ms, p50 <= 20 ms"
    assert SLO(200, percentile=99.9).describe() == "p99.9 <= 200 ms"
    assert slo.met_by(49.0, 19.0) and not slo.met_by(51.0, 10.0) and not slo.met_by(40.0, 21.0)
    assert SLO.from_dict(slo.to_dict()) == slo


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"p99_ms": 0}, r"SLO.p99_ms must be a finite number > 0, got 0"),
        ({"p99_ms": -5}, r"SLO.p99_ms must be a finite number > 0, got -5"),
        ({"p99_ms": float("inf")}, r"SLO.p99_ms must be a finite number > 0, got inf"),
        ({"p99_ms": 10, "p50_ms": 20}, r"SLO.p50_ms \(20.0\) cannot exceed SLO.p99_ms \(10.0\)"),
        ({"p99_ms": 10, "percentile": 100}, r"SLO.percentile must be in \[50, 100\), got 100"),
    ],
)
def test_bad_slo_values_are_quoted(kwargs, message):
    with pytest.raises(FlowValueError, match=message):
        SLO(**kwargs)


def test_slo_errors_are_the_flows_definition_errors():
    with pytest.raises(FlowTypeError, match="SLO.p99_ms must be a number, got str '50'"):
        SLO(p99_ms="50")
    with pytest.raises(FlowValueError, match=r"unknown SLO field\(s\) \['p95_ms'\]"):
        SLO.from_dict({"p99_ms": 5, "p95_ms": 3})


PROFILE = {
    "model": {"cpu": {1: [5.0, 5.0, 6.0], 4: [8.0, 8.0, 9.0], 16: [20.0, 20.0, 23.0]}, "gpu": {1: [2.0], 32: [4.0]}}
}


def test_profile_answers_measured_points_and_fits_the_rest():
    p = Profile(PROFILE)
    assert p.classes("model") == ("cpu", "gpu")
    assert p.batch_sizes("model", "cpu") == (1, 4, 16)
    assert p.latency("model", "cpu", 4) == 8.0
    assert p.latency("model", "cpu", 4, q=100) == 9.0
    fit = p.fit("model", "gpu")
    assert fit.a_ms == pytest.approx(2.0 - 2.0 / 31) and fit.c_ms == pytest.approx(2.0 / 31)
    # batch 8 is not measured: the nearest measured batch (4) scaled by fit(8) / fit(4)
    scale = p.fit("model", "cpu")(8) / p.fit("model", "cpu")(4)
    assert p.samples("model", "cpu", 8) == pytest.approx((8.0 * scale, 8.0 * scale, 9.0 * scale))


def test_fit_is_never_negative():
    assert LatencyFit.of({1: 5.0}) == LatencyFit(0.0, 5.0)  # one point: no batching gain assumed
    assert LatencyFit.of({1: 5.0, 8: 4.0}) == LatencyFit(4.5, 0.0)  # noise, not a cheaper call
    fit = LatencyFit.of({1: 1.0, 2: 5.0, 3: 9.0})  # the line would cross below 0 at b=0
    assert fit.a_ms == 0.0 and fit.c_ms > 0


def test_profile_json_round_trip_keeps_every_sample():
    p = Profile(PROFILE).with_stage("pick", "cpu", {1: (0.1, 0.2)})
    back = Profile.from_json(p.to_json())
    assert back == p and back.samples("model", "cpu", 16) == (20.0, 20.0, 23.0)
    assert back.to_dict()["stages"]["model"]["gpu"]["fit"]["c_ms"] == pytest.approx(2.0 / 31)


@pytest.mark.parametrize(
    "stages, message",
    [
        ({"model": {}}, r"profile of stage 'model': needs \{class:"),
        ({"model": {"cpu": {0: [1.0]}}}, r"profile of stage 'model' on 'cpu': batch size must be >= 1, got 0"),
        ({"model": {"cpu": {1: []}}}, r"profile of stage 'model' on 'cpu' batch 1: needs a non-empty list"),
        (
            {"model": {"cpu": {1: [-1.0]}}},
            r"profile of stage 'model' on 'cpu' batch 1: latency must be a finite number >= 0, got -1.0",
        ),
    ],
)
def test_bad_profiles_name_stage_class_and_batch(stages, message):
    with pytest.raises(FlowValueError, match=message):
        Profile(stages)


def test_missing_stage_or_class_is_named():
    p = Profile(PROFILE)
    with pytest.raises(FlowValueError, match=r"no profile for stage 'other'; profiled stages: \['model'\]"):
        p.latency("other", "cpu", 1)
    with pytest.raises(
        FlowValueError,
        match=r"stage 'model' was not profiled on executor class 'tpu'; profiled classes: \['cpu', 'gpu'\]",
    ):
        p.latency("model", "tpu", 1)
    with pytest.raises(FlowValueError, match="not a stored profile"):
        Profile.from_json('{"stages": {}}')
    with pytest.raises(FlowValueError, match="must be JSON text"):
        Profile.from_json("{nope")
