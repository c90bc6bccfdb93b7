"""One URL redaction for every package (kvs.redact.redact_url)."""

from __future__ import annotations

import pytest

from kvs import KVS
from kvs.redact import redact_url

SECRET = "s3cr@t:pw"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("redis://:pw@kvs:6379/0", "redis://:***@kvs:6379/0"),
        ("redis://app:pw@kvs:6379/0", "redis://app:***@kvs:6379/0"),
        ("rediss://app:pw@KVS.Example.com/0", "rediss://app:***@KVS.Example.com/0"),  # host as written
        ("redis://:pw@[::1]:6379/0", "redis://:***@[::1]:6379/0"),  # IPv6 keeps its brackets
        ("redis://:p@ss@kvs:6379/0", "redis://:***@kvs:6379/0"),  # an unescaped '@' in the password
        ("redis://kvs:6379/0?password=pw&db=1", "redis://kvs:6379/0?password=***&db=1"),
        ("unix:///run/redis.sock?db=0&password=pw", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://:pw@kvs:99999999/0", "redis://:***@kvs:99999999/0"),  # urllib refuses this port
        ("redis://:pw@[::1/0", "redis://:***@[::1/0"),  # nor this IPv6 literal
        (
            "connect to redis://:pw@a:1/0 and redis://u:pw@b:2/0 failed",
            "connect to redis://:***@a:1/0 and redis://u:***@b:2/0 failed",
        ),
    ],
)
def test_passwords_are_masked_and_the_rest_is_kept(url, expected):
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "redis://kvs:6379/0",
        "redis://user@kvs:6379/0",
        "redis://kvs:6379/0?db=1",
        "not a url",
        "http://example.com/a:b@c",  # ':' and '@' in the path, not in the userinfo
    ],
)
def test_text_without_a_password_is_unchanged(url):
    assert redact_url(url) == url


@pytest.mark.parametrize(
    "template",
    [
        "redis://:{}@kvs:6379/0",
        "redis://user:{}@kvs/0",
        "rediss://:{}@[fe80::1]:6380",
        "redis://kvs/0?password={}",
        "error: redis://x:{}@kvs:1 refused",
    ],
)
def test_no_form_of_a_password_survives(template):
    assert "s3cr" not in redact_url(template.format(SECRET))


def test_k8s_and_the_kvs_client_use_the_same_function():
    import k8s.kube_config

    assert k8s.kube_config.redact_url is redact_url
    with KVS.from_url("redis://user:hunter2@[::1]:6379/0") as store:  # connects lazily: nothing is sent
        assert store.url == "redis://user:***@[::1]:6379/0"
        assert "hunter2" not in repr(store)
