"""An instance on an external store (``KubeConfig.external_kvs``) on the real API server, as
the deployer of docs/kubernetes.md: the store's password must be given in ``redis_secret``
(never generated), nothing of a KVS of its own is created, and ``deploy`` reaches the
store at its URL with the Secret's password."""

from __future__ import annotations

import pytest

from flow.configuration import ConfigError
from k8s import KubeConfig, render
from kvs.urls import parse_store_url

pytest.importorskip("kubernetes.client")

from tests.k8s.test_real_backend import IMAGE, cluster_as, live_objects  # noqa: E402

STORE = "redis+sentinel://sentinel-0.db:26379,sentinel-1.db:26379/flowserve/0"


def test_an_external_stores_password_is_given_not_generated(control_plane, k8s_namespace):
    cfg = KubeConfig(namespace=k8s_namespace, image=IMAGE, kvs_storage=None, external_kvs=STORE)
    cluster = cluster_as(control_plane, "developer", cfg)
    with pytest.raises(ConfigError, match=r"flowserve-redis \(key 'password'\) must hold the password of the external"):
        cluster.ensure_secrets()  # a random one would not be the store's
    assert live_objects(control_plane, k8s_namespace) == set()

    password = "p@ss:w/rd"  # characters a URL must quote
    control_plane.kubectl(
        "-n", k8s_namespace, "create", "secret", "generic", "flowserve-redis", f"--from-literal=password={password}"
    )
    assert sorted(cluster.ensure_secrets()) == ["flowserve-admin", "flowserve-cluster-key"]
    url = parse_store_url(cluster.kvs_url())  # where deploy reaches the store
    assert (url.kind, url.hosts, url.service, url.password) == (
        "sentinel",
        (("sentinel-0.db", 26379), ("sentinel-1.db", 26379)),
        "flowserve",
        password,
    )

    cluster.apply(render(cfg))
    kinds = {kind for kind, name in live_objects(control_plane, k8s_namespace) if name.endswith("-kvs")}
    assert kinds == set(), f"an instance on an external store created its own KVS: {kinds}"
