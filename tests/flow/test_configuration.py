"""flow.configuration: the one way configs are declared, validated and round-tripped as JSON,
and every config of the project following it."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from flow.configuration import (
    Bool,
    Config,
    ConfigError,
    ConfigTypeError,
    Int,
    Nested,
    Number,
    OneOf,
    Str,
    check_value,
    setting,
)
from flow.errors import FlowError


class PoolError(ConfigError):
    pass


class PoolTypeError(PoolError, ConfigTypeError):
    pass


@dataclass(frozen=True)
class Inner(Config):
    depth: int = setting(1, Int(0, 9))


@dataclass(frozen=True)
class Pool(Config):
    error, type_error = PoolError, PoolTypeError

    size: int = setting(4, Int(1, 64))
    timeout_s: float = setting(5.0, Number(gt=0, note="seconds"))
    ratio: float | None = setting(0.5, Number(gt=0, le=1, optional=True))
    mode: str = setting("fast", OneOf("fast", "safe"))
    name: str | None = setting(None, Str(optional=True))
    verbose: bool = setting(False, Bool())
    tags: tuple = setting((), lambda v, name: tuple(v))  # a check may convert
    inner: Inner = setting(default_factory=Inner, check=Nested(Inner, accept_mapping=True))

    def _validate(self):
        if self.mode == "safe" and self.size > 8:
            raise self.error(f"Pool.size must be <= 8 in mode 'safe', got {self.size!r}")


def test_defaults_and_frozen():
    p = Pool()
    assert (p.size, p.timeout_s, p.ratio, p.mode, p.name, p.verbose, p.tags, p.inner) == (
        4,
        5.0,
        0.5,
        "fast",
        None,
        False,
        (),
        Inner(1),
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.size = 5


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"size": 0}, PoolError, "Pool.size must be an int in 1..64, got 0"),
        ({"size": 2.0}, PoolTypeError, "Pool.size must be an int in 1..64, got 2.0"),
        ({"size": True}, PoolTypeError, "Pool.size must be an int in 1..64, got True"),
        ({"size": "4"}, PoolTypeError, "Pool.size must be an int in 1..64, got '4'"),
        ({"timeout_s": 0}, PoolError, "Pool.timeout_s must be a number > 0 (seconds), got 0"),
        ({"timeout_s": math.inf}, PoolError, "Pool.timeout_s must be a number > 0 (seconds), got inf"),
        ({"timeout_s": math.nan}, PoolError, "Pool.timeout_s must be a number > 0 (seconds), got nan"),
        ({"timeout_s": None}, PoolTypeError, "Pool.timeout_s must be a number > 0 (seconds), got None"),
        ({"ratio": 1.5}, PoolError, "Pool.ratio must be a number in (0, 1] or None, got 1.5"),
        ({"mode": "slow"}, PoolError, "Pool.mode must be one of ('fast', 'safe'), got 'slow'"),
        ({"name": ""}, PoolError, "Pool.name must be a non-empty string or None, got ''"),
        ({"name": 3}, PoolTypeError, "Pool.name must be a non-empty string or None, got 3"),
        ({"verbose": "yes"}, PoolTypeError, "Pool.verbose must be a bool, got 'yes'"),
        ({"inner": 3}, PoolTypeError, "Pool.inner must be an Inner or a mapping of its fields, got 3"),
        ({"inner": {"depth": 10}}, PoolError, "Pool.inner: Inner.depth must be an int in 0..9, got 10"),
        ({"inner": {"depth": "1"}}, PoolTypeError, "Pool.inner: Inner.depth must be an int in 0..9, got '1'"),
        ({"mode": "safe", "size": 9}, PoolError, "Pool.size must be <= 8 in mode 'safe', got 9"),
    ],
)
def test_bad_values_name_the_field_and_quote_the_value(kwargs, error, message):
    with pytest.raises(ConfigError) as info:
        Pool(**kwargs)
    assert str(info.value) == message
    assert type(info.value) is error  # the TypeError class exactly for a wrong type
    assert isinstance(info.value, FlowError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, TypeError) == (error is PoolTypeError)


def test_accepted_values_and_conversions():
    p = Pool(size=np.int64(64), timeout_s=np.float32(0.5), ratio=None, name="x", tags=["a"], inner={"depth": 0})
    assert p.size == 64 and p.ratio is None and p.tags == ("a",) and p.inner == Inner(0)
    assert Pool(size=1, ratio=1).size == 1  # bounds included where they say so


def test_replace_validates_again():
    with pytest.raises(PoolError, match="got 0"):
        dataclasses.replace(Pool(), size=0)


def test_json_round_trip():
    p = Pool(size=8, ratio=None, name="n", verbose=True, tags=("a", "b"), inner=Inner(3))
    doc = p.to_json()
    assert doc == {
        "size": 8,
        "timeout_s": 5.0,
        "ratio": None,
        "mode": "fast",
        "name": "n",
        "verbose": True,
        "tags": ["a", "b"],
        "inner": {"depth": 3},
    }
    assert Pool.from_json(json.loads(json.dumps(doc))) == p
    assert Pool.from_json({}) == Pool()  # missing keys default


def test_from_json_refuses_unknown_keys_naming_them_and_the_known_ones():
    with pytest.raises(PoolError) as info:
        Pool.from_json({"sise": 3, "size": 2})
    assert str(info.value) == (
        "Pool: unknown field(s) ['sise']; known: ['inner', 'mode', 'name', 'ratio', "
        "'size', 'tags', 'timeout_s', 'verbose']"
    )
    with pytest.raises(PoolTypeError, match=r"Pool.from_json needs a dict, got \[1\]"):
        Pool.from_json([1])
    with pytest.raises(PoolError, match=r"Pool.inner: Inner: unknown field\(s\) \['deep'\]"):
        Pool.from_json({"inner": {"deep": 1}})
    with pytest.raises(PoolError, match="Pool.size must be an int in 1..64, got 0"):
        Pool.from_json({"size": 0})


def test_check_value_outside_a_config():
    assert check_value(3, "--threads", Int(1)) == 3
    with pytest.raises(ConfigError, match="--threads must be an int >= 1, got 0"):
        check_value(0, "--threads", Int(1))
    with pytest.raises(ConfigTypeError, match="--threads must be an int >= 1, got 'x'"):
        check_value("x", "--threads", Int(1))


# -- every config of the project follows the idiom ----------------------------------------------

CONFIGS = [
    (
        "executors.hosts.cluster_config",
        "ClusterConfig",
        {"executors": 3, "autoscaling": {"max_replicas": 3}, "dir": "/tmp/x"},
        "executors",
        "flow.configuration",
        "ConfigError",
    ),
    (
        "executors.hosts.autoscale",
        "AutoscalingConfig",
        {"min_replicas": 0, "target_queue_per_replica": None},
        "max_replicas",
        "flow.configuration",
        "ConfigError",
    ),
    (
        "kvs.options",
        "KVSOptions",
        {"retry_timeout": 0, "client_name": None},
        "max_connections",
        "flow.configuration",
        "ConfigError",
    ),
    (
        "optimizer.plan",
        "BatchConfig",
        {"max_batch_size": 4, "max_wait_ms": 1.5},
        "max_batch_size",
        "flow.configuration",
        "ConfigError",
    ),
    (
        "optimizer.options",
        "OptimizerOptions",
        {"rules": ["fusion"], "batch": {"max_batch_size": 2}},
        "competitive_replicas",
        "flow.configuration",
        "ConfigError",
    ),
    (
        "k8s.kube_config",
        "KubeConfig",
        {
            "namespace": "ml",
            "image_pull_secrets": ["reg"],
            "env": {"A": "1"},
            "gpu_node_selector": {"gpu": "a100"},
            "autoscaling": {"max_replicas": 2},
            "gateway_resources": {"cpu": "1", "memory": "1Gi"},
            "gpu_tolerations": [{"key": "gpu", "effect": "NoExecute", "toleration_seconds": 5}],
        },
        "cpu_executors",
        "flow.configuration",
        "ConfigError",
    ),
    ("k8s.kube_config", "Resources", {"cpu": "2", "memory_limit": "1Gi"}, None, "flow.configuration", "ConfigError"),
    (
        "k8s.kube_config",
        "Toleration",
        {"key": "a", "operator": "Equal", "value": "b"},
        None,
        "flow.configuration",
        "ConfigError",
    ),
]


def _load(module, name):
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "module, name, fields, int_field, error_module, error_name", CONFIGS, ids=[c[1] for c in CONFIGS]
)
def test_every_config_round_trips_and_refuses_unknown_keys(module, name, fields, int_field, error_module, error_name):
    cls, error = _load(module, name), _load(error_module, error_name)
    assert issubclass(cls, Config) and issubclass(error, ConfigError)
    config = cls.from_json(fields)
    assert cls.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert cls.from_json(cls().to_json()) == cls()
    with pytest.raises(error) as info:
        cls.from_json({**fields, "colour": "red"})
    assert f"{name}: unknown field(s) ['colour']; known: [" in str(info.value)
    if int_field is not None:  # a wrong type: the package's error, a ConfigTypeError, naming field and value
        with pytest.raises(error) as info:
            cls(**{int_field: "2"})
        assert isinstance(info.value, ConfigTypeError) and f"{name}.{int_field} must be " in str(info.value)
        assert str(info.value).endswith("got '2'")


def test_every_config_raises_the_one_config_error():
    """One ConfigError (a ValueError) and ConfigTypeError (also a TypeError) for every
    package's config: no caller does anything different for a ClusterConfig's bad value
    than for a KVSOptions' one (the message names the class and the field)."""
    from executors.hosts.autoscale import AutoscalingConfig
    from executors.hosts.cluster_config import ClusterConfig
    from k8s import KubeConfig
    from kvs.options import KVSOptions
    from optimizer.plan import BatchConfig

    for make, wrong_type in [
        (lambda: ClusterConfig(executors=0), False),
        (lambda: AutoscalingConfig(max_replicas=0), False),
        (lambda: AutoscalingConfig(max_replicas="1"), True),
        (lambda: KVSOptions(max_connections=0), False),
        (lambda: KVSOptions(max_connections="1"), True),
        (lambda: BatchConfig(max_batch_size=0), False),
        (lambda: BatchConfig(max_batch_size="1"), True),
        (lambda: KubeConfig(namespace=""), False),
    ]:
        with pytest.raises(ConfigError) as info:
            make()
        assert isinstance(info.value, ValueError)
        assert type(info.value) is (ConfigTypeError if wrong_type else ConfigError), info.value
        assert isinstance(info.value, TypeError) is wrong_type
