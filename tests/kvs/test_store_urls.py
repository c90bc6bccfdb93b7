"""The store URL forms (kvs/urls.py): one server, Sentinel, Cluster; what each bad URL says."""

from __future__ import annotations

import pytest

from flow.errors import FlowTypeError, FlowValueError
from kvs import KVS
from kvs.urls import parse_store_url


def test_one_server_keeps_its_url_and_waits_for_no_replica():
    u = parse_store_url("redis://:pw@kvs:6379/2")
    assert (u.kind, u.url, u.wait_replicas, u.replicated) == ("redis", "redis://:pw@kvs:6379/2", 0, False)
    u = parse_store_url("rediss://kvs:6380/0?wait_replicas=1&wait_timeout=0.25&socket_keepalive=true")
    assert (u.wait_replicas, u.wait_timeout) == (1, 0.25)
    assert u.url == "rediss://kvs:6380/0?socket_keepalive=true"  # ours taken out, redis-py's kept
    assert parse_store_url("unix:///run/redis.sock?db=1").url == "unix:///run/redis.sock?db=1"


def test_sentinel_url():
    u = parse_store_url("redis+sentinel://app:p%40ss@s1:26379,[::1]:26380/main/3?sentinel_password=sp")
    assert u.kind == "sentinel" and u.replicated
    assert u.hosts == (("s1", 26379), ("::1", 26380))
    assert (u.service, u.db, u.username, u.password) == ("main", 3, "app", "p@ss")
    assert (u.sentinel_password, u.wait_replicas, u.wait_timeout) == ("sp", 1, 1.0)
    assert parse_store_url("redis+sentinel://s1:26379/main").db == 0


def test_cluster_url():
    u = parse_store_url("redis+cluster://:pw@n1:7000,n2:7001?wait_replicas=2")
    assert (u.kind, u.hosts, u.password, u.wait_replicas) == ("cluster", (("n1", 7000), ("n2", 7001)), "pw", 2)
    assert parse_store_url("redis+cluster://n1:7000/0").hosts == (("n1", 7000),)


@pytest.mark.parametrize(
    "url, says",
    [
        ("kvs:6379", "no scheme"),
        ("memcached://kvs:11211", "unknown scheme 'memcached'"),
        ("redis+sentinel://:pw@s1:26379", "the path must be /<service>"),
        ("redis+sentinel://s1:26379/main/x", "the database must be a number, got 'x'"),
        ("redis+sentinel://s1/main", "host 's1' has no port"),
        ("redis+sentinel://s1:0/main", "host 's1:0' has no valid port"),
        ("redis+sentinel://s1:26379/main?retries=3", "unknown parameter(s) ['retries']"),
        ("redis+cluster://n1:7000/2", "a Redis Cluster has only database 0"),
        ("redis+cluster://n1:7000?sentinel_password=x", "unknown parameter(s) ['sentinel_password']"),
        ("redis+cluster://:7000", "has no name"),
        ("redis+cluster://[::1:7000", "must be [address]:port"),
        ("redis://kvs:6379/0?wait_replicas=one", "wait_replicas must be an int >= 0, got 'one'"),
        ("redis+cluster://n1:7000?wait_timeout=0", "wait_timeout must be seconds in (0, 3600), got '0'"),
    ],
)
def test_a_bad_url_says_what_is_wrong_and_hides_the_password(url, says):
    secret = url.replace("://", "://:s3cret@", 1) if "@" not in url and "://" in url else url
    with pytest.raises(FlowValueError) as e:
        parse_store_url(secret)
    assert says in str(e.value)
    assert "s3cret" not in str(e.value)
    with pytest.raises(FlowValueError, match="bad store URL"):  # the same from every client
        KVS.from_url(secret)


def test_a_url_that_is_not_a_str():
    with pytest.raises(FlowTypeError, match="must be a str, got int"):
        KVS.from_url(6379)
