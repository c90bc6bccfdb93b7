"""``KVS`` against a real Redis: values, missing keys, options, errors, fork safety."""

from __future__ import annotations

import os
import pickle
import signal
import time

import numpy as np
import pytest

from flow.configuration import ConfigError
from flow.errors import AccessDeniedError, FlowError, FlowValueError, RetryableError, UnreachableError
from kvs import (
    KVS,
    KeyNotFoundError,
    KVSOptions,
    KVSRef,
    RedisServer,
    SerializationError,
)
from tests.kvs.helpers import run_in_fork


def test_put_get_every_type(kvs):
    values = {
        "none": None,
        "bool": True,
        "int": 7,
        "float": 2.5,
        "str": "héllo",
        "bytes": b"\x00\x01",
        "empty": b"",
        "list": [1, "a", None],
        "dict": {"a": {"b": [1.5]}},
        "ref": KVSRef("other"),
        "arr0d": np.array(3.0),
        "arr_empty": np.zeros((0, 4), np.int32),
    }
    for key, value in values.items():
        kvs.put(key, value)
    for key, value in values.items():
        out = kvs.get(key)
        if isinstance(value, np.ndarray):
            assert out.dtype == value.dtype and out.shape == value.shape
            np.testing.assert_array_equal(out, value)
        else:
            assert out == value and type(out) is type(value)


def test_replies_are_parsed_by_hiredis(kvs):
    """A dependency: redis-py's pure-Python parser reads an 8 MB value 3-4x slower."""
    conn = kvs.redis.connection_pool.get_connection()
    try:
        assert type(conn._parser).__name__ == "_HiredisParser"
    finally:
        kvs.redis.connection_pool.release(conn)


def test_large_array_roundtrip(kvs):
    arr = np.random.default_rng(0).random((1024, 1024))
    kvs.put("big", arr)
    np.testing.assert_array_equal(kvs.get("big"), arr)


def test_get_missing_raises_naming_the_key(kvs):
    with pytest.raises(KeyNotFoundError, match="'nope'") as info:
        kvs.get("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, FlowError)
    assert info.value.key == "nope"


def test_get_missing_with_default(kvs):
    sentinel = object()
    assert kvs.get("nope", sentinel) is sentinel
    assert kvs.get("nope", None) is None


def test_stored_none_is_not_missing(kvs):
    kvs.put("k", None)
    assert kvs.get("k", "default") is None
    assert kvs.exists("k")


def test_mget_mput(kvs):
    kvs.mput({"a": 1, "b": np.arange(3), "c": "x"})
    missing = object()
    a, b, c, d = kvs.mget(["a", "b", "c", "d"], missing)
    assert (a, c, d) == (1, "x", missing)
    np.testing.assert_array_equal(b, np.arange(3))
    with pytest.raises(KeyNotFoundError, match="'d'"):
        kvs.mget(["a", "d"])
    assert kvs.mget([]) == []
    assert kvs.mget(iter(["a", "a"])) == [1, 1]


def test_delete_and_exists(kvs):
    kvs.mput({"a": 1, "b": 2})
    assert kvs.exists("a")
    assert kvs.delete("a", "b", "zzz") == 2
    assert not kvs.exists("a")
    assert kvs.delete() == 0


def test_keys_must_be_str(kvs):
    for bad in (1, b"k", None, ("a",)):
        with pytest.raises(TypeError, match=type(bad).__name__):
            kvs.get(bad)
        with pytest.raises(TypeError):
            kvs.put(bad, 1)


def test_unsupported_value_is_refused_before_any_write(kvs):
    with pytest.raises(SerializationError, match="Custom"):
        kvs.put("k", type("Custom", (), {})())
    assert not kvs.exists("k")


def test_trusted_values(kvs):
    kvs.put_trusted("fn", lambda x: x * 2)
    with pytest.raises(SerializationError, match="'fn'"):
        kvs.get("fn")
    assert kvs.get("fn", trusted=True)(21) == 42


def test_foreign_raw_value_gives_a_serialization_error(kvs):
    kvs.redis.set("raw", b"written by redis-cli")
    with pytest.raises(SerializationError, match="'raw'"):
        kvs.get("raw")


def test_raw_redis_access_for_hashes(kvs):
    kvs.redis.hset("members", mapping={"e0": "cpu", "e1": "gpu"})
    assert kvs.redis.hgetall("members") == {b"e0": b"cpu", b"e1": b"gpu"}


def test_ping_and_context_manager(redis_url):
    with KVS.from_url(redis_url) as store:
        assert store.ping()
    with pytest.raises(FlowValueError, match="closed"):
        store.get("k")


# -- options ---------------------------------------------------------------------------


def test_option_defaults_are_documented_values():
    options = KVSOptions()
    assert options.cache_max_bytes == 256 << 20
    assert options.retry_timeout == 5.0 and options.socket_timeout == 5.0


@pytest.mark.parametrize(
    "field, value",
    [
        ("socket_timeout", -1),
        ("socket_timeout", 0),
        ("connect_timeout", float("nan")),
        ("retry_timeout", -0.5),
        ("retry_timeout", float("inf")),
        ("max_connections", 0),
        ("cache_max_bytes", -5),
        ("backoff_base", 0),
        ("health_check_interval", -2),
        ("client_name", "has space"),
        ("client_name", ""),
    ],
)
def test_bad_option_values_raise_value_error_quoting_the_value(field, value):
    with pytest.raises(ValueError, match=field) as info:
        KVSOptions(**{field: value})
    assert repr(value) in str(info.value)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    "field, value",
    [
        ("socket_timeout", "5"),
        ("max_connections", 2.5),
        ("cache_max_bytes", True),
        ("retry_timeout", None),
        ("client_name", 3),
    ],
)
def test_wrong_option_types_raise_type_error_quoting_the_value(field, value):
    with pytest.raises(TypeError, match=field) as info:
        KVSOptions(**{field: value})
    assert repr(value) in str(info.value)


def test_backoff_base_above_cap_is_refused():
    with pytest.raises(ValueError, match="backoff_base"):
        KVSOptions(backoff_base=2.0, backoff_cap=1.0)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        KVSOptions().retry_timeout = 1


def test_from_url_overrides_and_unknown_options(redis_url):
    with KVS.from_url(redis_url, retry_timeout=0.25) as store:
        assert store.options.retry_timeout == 0.25
    with pytest.raises(TypeError, match="'retry_total'"):
        KVS.from_url(redis_url, retry_total=3)
    with pytest.raises(ValueError, match="-1"):
        KVS.from_url(redis_url, socket_timeout=-1)


def test_bad_url_is_quoted_without_its_password():
    with pytest.raises(ValueError, match="http://") as info:
        KVS.from_url("http://:hunter2@localhost:1/0")
    assert "hunter2" not in str(info.value)


# -- server down, restart, auth --------------------------------------------------------


@pytest.fixture
def private_server(tmp_path):
    server = RedisServer(dir=tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def test_server_down_gives_retryable_error_within_the_budget(private_server):
    store = KVS.from_url(private_server.url, retry_timeout=0.5, connect_timeout=0.5)
    store.put("k", 1)
    private_server.kill()
    start = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        store.get("k")
    elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 3.0  # it did retry, and gave up in time
    assert isinstance(info.value, RetryableError)
    assert f"127.0.0.1:{private_server.port}" in str(info.value)
    assert info.value.url == private_server.url
    store.close()


def test_hung_server_times_out_within_the_budget(private_server):
    store = KVS.from_url(private_server.url, socket_timeout=0.3, retry_timeout=0.5)
    store.put("k", 1)
    os.kill(private_server.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(UnreachableError, match="Timeout"):
            store.get("k")
        assert time.monotonic() - start < 3.0
    finally:
        os.kill(private_server.pid, signal.SIGCONT)
    assert store.get("k") == 1  # and it works again without any help
    store.close()


def test_client_recovers_by_itself_after_a_restart(private_server):
    store = KVS.from_url(private_server.url, retry_timeout=5.0)
    store.put("k", 1)
    pooled = store.redis.connection_pool
    private_server.restart()  # no persistence: data is gone, the pooled socket is dead
    assert store.get("k", "gone") == "gone"
    store.put("k", 2)
    assert store.get("k") == 2
    assert store.redis.connection_pool is pooled
    store.close()


def test_client_retries_while_the_server_comes_back(private_server):
    store = KVS.from_url(private_server.url, retry_timeout=10.0)
    private_server.kill()
    import threading

    restarter = threading.Timer(0.3, private_server.start)  # back while get() retries
    restarter.start()
    try:
        assert store.get("k", "absent") == "absent"
    finally:
        restarter.join()
        store.close()


def test_password_protected_server(tmp_path):
    with RedisServer(dir=tmp_path, password="s3cr et") as server:
        with KVS.from_url(server.url) as store:
            store.put("k", 1)
            assert store.get("k") == 1
        wrong = server.url.replace("s3cr%20et", "wrong")
        with KVS.from_url(wrong, retry_timeout=5.0) as store:
            start = time.monotonic()
            with pytest.raises(AccessDeniedError) as info:
                store.get("k")
            assert not isinstance(info.value, RetryableError)  # not retryable
            assert time.monotonic() - start < 1.0
            assert "wrong" not in str(info.value)  # the password is redacted


# -- exceptions travel between processes -----------------------------------------------


def test_exceptions_pickle_with_their_fields():
    err = pickle.loads(pickle.dumps(UnreachableError("down", url="redis://h:1/0")))
    assert isinstance(err, UnreachableError) and err.url == "redis://h:1/0"
    err = pickle.loads(pickle.dumps(KeyNotFoundError("k1")))
    assert err.key == "k1" and "'k1'" in str(err)


# -- fork ------------------------------------------------------------------------------


def test_fork_safety(kvs):
    kvs.put("shared", np.arange(5))
    kvs.get("shared")  # the parent's pool now has a live connection

    def child():
        # the child must not reuse the parent's socket (replies would interleave)
        values = [kvs.get("shared").tolist() for _ in range(20)]
        kvs.put("from_child", os.getpid())
        return values[-1], kvs.redis.connection_pool.pid == os.getpid()

    last, fresh_pool = run_in_fork(child)
    assert last == [0, 1, 2, 3, 4] and fresh_pool
    # the parent's connection still works and sees the child's write
    assert kvs.get("from_child") != os.getpid()
    np.testing.assert_array_equal(kvs.get("shared"), np.arange(5))
