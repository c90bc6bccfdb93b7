"""AutoscalingConfig: documented defaults, validation messages that quote the value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from executors.hosts.autoscale import AutoscalingConfig
from flow import FlowError
from flow.configuration import ConfigError, ConfigTypeError


def test_defaults_are_the_documented_ones():
    c = AutoscalingConfig()
    assert (c.min_replicas, c.max_replicas) == (1, 8)
    assert (c.target_utilisation, c.target_queue_per_replica) == (0.7, 2.0)
    assert (c.upscale_delay_s, c.downscale_delay_s) == (1.0, 15.0)  # seconds (InferLine), not Ray's 30 s
    assert (c.upscale_cooldown_s, c.downscale_cooldown_s) == (2.0, 15.0)
    assert (c.max_step_up, c.smoothing_window_s, c.hysteresis) == (2.0, 1.0, 0.1)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AutoscalingConfig().max_replicas = 3


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"min_replicas": -1}, ValueError, "AutoscalingConfig.min_replicas must be an int >= 0, got -1"),
        ({"min_replicas": 1.5}, TypeError, "AutoscalingConfig.min_replicas must be an int >= 0, got 1.5"),
        ({"min_replicas": True}, TypeError, "AutoscalingConfig.min_replicas must be an int >= 0, got True"),
        ({"min_replicas": "2"}, TypeError, "AutoscalingConfig.min_replicas must be an int >= 0, got '2'"),
        ({"max_replicas": 0}, ValueError, "AutoscalingConfig.max_replicas must be an int >= 1, got 0"),
        (
            {"min_replicas": 5, "max_replicas": 3},
            ValueError,
            "AutoscalingConfig.max_replicas must be >= min_replicas (5), got 3",
        ),
        (
            {"target_utilisation": 0},
            ValueError,
            "AutoscalingConfig.target_utilisation must be a number in (0, 1] or None, got 0",
        ),
        (
            {"target_utilisation": 1.5},
            ValueError,
            "AutoscalingConfig.target_utilisation must be a number in (0, 1] or None, got 1.5",
        ),
        (
            {"target_utilisation": math.nan},
            ValueError,
            "AutoscalingConfig.target_utilisation must be a number in (0, 1] or None, got nan",
        ),
        (
            {"target_utilisation": "0.7"},
            TypeError,
            "AutoscalingConfig.target_utilisation must be a number in (0, 1] or None, got '0.7'",
        ),
        (
            {"target_queue_per_replica": 0},
            ValueError,
            "AutoscalingConfig.target_queue_per_replica must be a number > 0 or None, got 0",
        ),
        (
            {"target_utilisation": None, "target_queue_per_replica": None},
            ValueError,
            "AutoscalingConfig needs target_utilisation or target_queue_per_replica, got both None",
        ),
        (
            {"upscale_delay_s": -1},
            ValueError,
            "AutoscalingConfig.upscale_delay_s must be a number >= 0 (seconds), got -1",
        ),
        (
            {"downscale_delay_s": math.inf},
            ValueError,
            "AutoscalingConfig.downscale_delay_s must be a number >= 0 (seconds), got inf",
        ),
        (
            {"upscale_cooldown_s": None},
            TypeError,
            "AutoscalingConfig.upscale_cooldown_s must be a number >= 0 (seconds), got None",
        ),
        (
            {"downscale_cooldown_s": -0.5},
            ValueError,
            "AutoscalingConfig.downscale_cooldown_s must be a number >= 0 (seconds), got -0.5",
        ),
        (
            {"smoothing_window_s": -2},
            ValueError,
            "AutoscalingConfig.smoothing_window_s must be a number >= 0 (seconds), got -2",
        ),
        ({"max_step_up": 0.5}, ValueError, "AutoscalingConfig.max_step_up must be a number >= 1, got 0.5"),
        ({"hysteresis": 1}, ValueError, "AutoscalingConfig.hysteresis must be a number in [0, 1), got 1"),
        ({"hysteresis": -0.1}, ValueError, "AutoscalingConfig.hysteresis must be a number in [0, 1), got -0.1"),
    ],
)
def test_bad_values_name_the_field_and_quote_the_value(kwargs, error, message):
    with pytest.raises(error) as info:
        AutoscalingConfig(**kwargs)
    assert str(info.value) == message
    # the one config error, under the project's root, split by what is wrong
    assert isinstance(info.value, FlowError)
    assert type(info.value) is (ConfigError if error is ValueError else ConfigTypeError)


def test_one_target_is_enough():
    assert AutoscalingConfig(target_utilisation=None).target_queue_per_replica == 2.0
    assert AutoscalingConfig(target_queue_per_replica=None).target_utilisation == 0.7


def test_edge_values_are_accepted():
    c = AutoscalingConfig(
        min_replicas=0,
        max_replicas=1,
        target_utilisation=1,
        upscale_delay_s=0,
        downscale_delay_s=0,
        max_step_up=1,
        smoothing_window_s=0,
        hysteresis=0,
    )
    assert (c.min_replicas, c.max_replicas) == (0, 1)
    assert AutoscalingConfig(min_replicas=3, max_replicas=3).max_replicas == 3


def test_json_round_trip():
    c = AutoscalingConfig(min_replicas=0, max_replicas=4, target_queue_per_replica=None)
    assert AutoscalingConfig.from_json(c.to_json()) == c
    assert AutoscalingConfig.from_json({}) == AutoscalingConfig()


def test_json_unknown_field_is_named():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['max_replica'\]; known: \['downscale_cooldown_s', "):
        AutoscalingConfig.from_json({"max_replica": 3})
    with pytest.raises(TypeError, match=r"needs a dict, got \[1\]"):
        AutoscalingConfig.from_json([1])
    with pytest.raises(ValueError, match="got -3"):
        AutoscalingConfig.from_json({"max_replicas": -3})
