"""KubeConfig, Resources, Toleration: defaults, and bad values named and quoted."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import FlowError
from k8s import KubeConfig, Resources, Toleration, parse_quantity


def test_defaults_are_a_small_cpu_cluster():
    c = KubeConfig()
    assert (c.name, c.namespace, c.gateway_replicas, c.cpu_executors, c.gpu_executors) == (
        "flowserve",
        "flowserve",
        1,
        2,
        None,
    )
    assert c.image == "flowserve:0.1.0" and c.redis_image == "redis:7.4-alpine"
    assert (c.redis_secret_name, c.admin_secret_name, c.token_secret) == ("flowserve-redis", "flowserve-admin", None)
    assert c.service_type == "ClusterIP" and c.network_policies is True
    assert c.gpu_tolerations == (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.namespace = "other"


@pytest.mark.parametrize(
    "field,value,error,quoted",
    [
        ("name", "Flow_Serve", ConfigError, "'Flow_Serve'"),
        ("name", "9lives", ConfigError, "'9lives'"),
        ("name", "x" * 41, ConfigError, "at most 40 characters"),
        ("name", 7, ConfigTypeError, "7"),
        ("namespace", "ML", ConfigError, "'ML'"),
        ("image", "flowserve:latest", ConfigError, "'flowserve:latest'"),
        ("image", "flowserve", ConfigError, "must pin a tag or digest"),
        ("image", "flow serve:1", ConfigError, "'flow serve:1'"),
        ("redis_image", "redis:latest", ConfigError, "'redis:latest'"),
        ("image_pull_policy", "Sometimes", ConfigError, "'Sometimes'"),
        ("gateway_replicas", -1, ConfigError, "-1"),
        ("cpu_executors", "2", ConfigTypeError, "'2'"),
        ("cpu_executors", 2.0, ConfigTypeError, "2.0"),
        ("gpu_executors", True, ConfigTypeError, "True"),
        ("gpu_executors", 1001, ConfigError, "1001"),
        ("executor_threads", 0, ConfigError, "0"),
        ("gpus_per_executor", 0, ConfigError, "0"),
        ("service_type", "Ingress", ConfigError, "'Ingress'"),
        ("service_port", 70000, ConfigError, "70000"),
        ("redis_secret", "Bad Secret", ConfigError, "'Bad Secret'"),
        ("token_secret", "", ConfigError, "''"),
        ("kvs_storage", "lots", ConfigError, "'lots'"),
        ("kvs_storage", "0Gi", ConfigError, "'0Gi'"),
        ("artifact_cache_size", 10, ConfigTypeError, "10"),
        ("s3_endpoint", "minio:9000", ConfigError, "'minio:9000'"),
        ("version", "not a label!", ConfigError, "'not a label!'"),
        ("network_policies", "yes", ConfigTypeError, "'yes'"),
        ("gpu_node_selector", {"gpu": "a b"}, ConfigError, "'a b'"),
        ("gpu_node_selector", ["gpu"], ConfigTypeError, "['gpu']"),
        ("gpu_tolerations", {"key": "x"}, ConfigTypeError, "{'key': 'x'}"),
        ("gpu_tolerations", [{"key": "x", "operator": "Sometimes"}], ConfigError, "'Sometimes'"),
        ("gpu_tolerations", [{"key": "x", "colour": "red"}], ConfigError, "['colour']"),
        ("env", {"FLOWSERVE_KVS_URL": "redis://x"}, ConfigError, "'FLOWSERVE_KVS_URL'"),
        ("env", {"1BAD": "x"}, ConfigError, "'1BAD'"),
        ("env", {"LEVEL": 3}, ConfigTypeError, "3"),
        ("gateway_resources", {"cpu": "1"}, ConfigTypeError, "{'cpu': '1'}"),
        ("image_pull_secrets", ("ok", "Not OK"), ConfigError, "'Not OK'"),
        ("autoscaling", {"max_replicas": 0}, ConfigError, "got 0"),
        ("autoscaling", {"min_replicas": "1"}, ConfigTypeError, "'1'"),
        ("autoscaling", {"colour": "red"}, ConfigError, "['colour']"),
        ("autoscaling", 3, ConfigTypeError, "int 3"),
        ("gateway_url", "localhost:8080", ConfigError, "'localhost:8080'"),
        ("gateway_url", "ftp://gw", ConfigError, "'ftp://gw'"),
        ("gateway_url", 8080, ConfigTypeError, "8080"),
        ("kvs_url", "http://localhost:6379", ConfigError, "'http://localhost:6379'"),
        ("kvs_url", "redis://localhost:99999/0", ConfigError, "'redis://localhost:99999/0'"),
        ("kvs_url", 6379, ConfigTypeError, "int 6379"),
    ],
)
def test_bad_values_raise_naming_the_field_and_quoting_the_value(field, value, error, quoted):
    with pytest.raises(error) as info:
        KubeConfig(**{field: value})
    assert quoted in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError)) and isinstance(info.value, FlowError)
    assert isinstance(info.value, ConfigError)  # the one config error: fix the value
    if field not in ("gpu_tolerations",):
        assert field in str(info.value)


def test_autoscaling_takes_the_dataclass_or_its_fields():
    from executors.hosts.autoscale import AutoscalingConfig

    assert KubeConfig().autoscaling is None
    given = AutoscalingConfig(max_replicas=3)
    assert KubeConfig(autoscaling=given).autoscaling is given
    assert KubeConfig(autoscaling={"max_replicas": 3}).autoscaling == given
    assert KubeConfig.from_dict({"autoscaling": {"max_replicas": 3}}).autoscaling == given
    assert KubeConfig(autoscaling={}).autoscaling == AutoscalingConfig()


def test_autoscaling_runs_with_several_gateways_one_elected_through_a_lease():
    from k8s import render

    c = KubeConfig(autoscaling={}, gateway_replicas=3)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(c)}
    gateway = docs[("Deployment", "flowserve-gateway")]
    assert gateway["spec"]["replicas"] == 3
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--leader-election") + 1] == "k8s"
    leases = [r for r in docs[("Role", "flowserve-autoscaler")]["rules"] if r["resources"] == ["leases"]]
    assert leases == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["flowserve-leader"],
            "verbs": ["get", "update"],
        },
    ]
    assert KubeConfig(autoscaling={}, gateway_replicas=0).gateway_replicas == 0


def test_addresses_for_deploy():
    c = KubeConfig(gateway_url="http://localhost:8080", kvs_url="rediss://kvs.example.com:6380/0")
    assert (c.gateway_url, c.kvs_url) == ("http://localhost:8080", "rediss://kvs.example.com:6380/0")
    assert (KubeConfig().gateway_url, KubeConfig().kvs_url) == (None, None)


def test_kvs_url_must_not_hold_the_password_and_messages_do_not_show_it():
    with pytest.raises(ConfigError, match="must not hold a password .*'flowserve-redis'") as info:
        KubeConfig(kvs_url="redis://:hunter2@localhost:6379/0")
    assert "hunter2" not in str(info.value) and "redis://:***@localhost:6379/0" in str(info.value)
    with pytest.raises(ConfigError) as info:
        KubeConfig(kvs_url="redis://:hunter2@localhost:99999/0")  # invalid port: still masked
    assert "hunter2" not in str(info.value)


def test_ports_must_differ():
    with pytest.raises(ConfigError, match="ports must differ: gateway_port=5555"):
        KubeConfig(gateway_port=5555)


@pytest.mark.parametrize(
    "image",
    [
        "flowserve:0.1.0",
        "registry.example.com/team/flowserve:0.1.0",
        "localhost:5000/flowserve:dev",
        "ghcr.io/org/flow-serve:1.0.0-rc.1",
        "flowserve@sha256:" + "c" * 64,
        "reg.example.com:443/a/b:1@sha256:" + "d" * 64,
    ],
)
def test_good_image_references(image):
    assert KubeConfig(image=image).image == image


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"cpu": "2", "cpu_limit": "1"}, r"cpu_limit='1' is below the request cpu='2'"),
        ({"memory": "2Gi", "memory_limit": "1500Mi"}, r"memory_limit='1500Mi' is below the request memory='2Gi'"),
        ({"cpu": "half"}, r"Resources.cpu: 'half' is not a Kubernetes quantity"),
        ({"memory": "-1Gi"}, r"'-1Gi' is not a Kubernetes quantity"),
        ({"memory": 512}, r"Resources.memory must be a quantity string .* got int 512"),
    ],
)
def test_bad_resources(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Resources(**kwargs)


def test_resources_render_gpus_in_requests_and_limits():
    r = Resources(cpu="1", memory="1Gi", memory_limit="2Gi")
    assert r.to_k8s() == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    assert r.to_k8s(gpus=2)["limits"]["nvidia.com/gpu"] == "2"
    assert r.to_k8s(gpus=2)["requests"]["nvidia.com/gpu"] == "2"


def test_parse_quantity():
    assert parse_quantity("250m") == Decimal("0.25")
    assert parse_quantity("2") == 2
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("1.5G") == Decimal("1.5e9")
    with pytest.raises(ValueError, match="'1e3'"):
        parse_quantity("1e3")


def test_toleration_rules():
    assert Toleration.from_dict(
        {"key": "a", "operator": "Equal", "value": "b", "effect": "NoExecute", "tolerationSeconds": 5}
    ).to_k8s() == {"key": "a", "operator": "Equal", "value": "b", "effect": "NoExecute", "tolerationSeconds": 5}
    assert Toleration().to_k8s() == {"operator": "Exists"}  # tolerate every taint
    with pytest.raises(ConfigError, match="takes no value, got value='b'"):
        Toleration(key="a", operator="Exists", value="b")
    with pytest.raises(ConfigError, match="only applies to effect 'NoExecute', got effect='NoSchedule'"):
        Toleration(key="a", effect="NoSchedule", toleration_seconds=3)
    with pytest.raises(ConfigError, match="effect must be None or one of .* got 'Never'"):
        Toleration(key="a", effect="Never")


def test_from_dict_builds_nested_objects_and_rejects_unknown_fields():
    c = KubeConfig.from_dict(
        {
            "namespace": "ml",
            "gpu_executors": 1,
            "gpu_executor_resources": {"cpu": "2", "memory": "8Gi"},
            "gpu_tolerations": [{"key": "gpu", "operator": "Exists"}],
            "image_pull_secrets": ["regcred"],
        }
    )
    assert c.gpu_executor_resources == Resources(cpu="2", memory="8Gi")
    assert c.gpu_tolerations == (Toleration(key="gpu"),)
    assert c.image_pull_secrets == ("regcred",)
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['replicas'\]"):
        KubeConfig.from_dict({"replicas": 3})
    with pytest.raises(
        ConfigError, match=r"gateway_resources: Resources: unknown field\(s\) \['gpu'\]; known: \['cpu', "
    ):
        KubeConfig.from_dict({"gateway_resources": {"gpu": 1}})


def test_replace_validates_again():
    c = KubeConfig().replace(namespace="ml")
    assert c.namespace == "ml"
    with pytest.raises(ConfigError, match="'bad ns'"):
        c.replace(namespace="bad ns")
