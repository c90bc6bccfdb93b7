"""Signed pickles are bound to the key they are stored under: a plan copied to another
flow's key, or an older version's plan copied over the current one, is refused; so is a
value signed in the old format (MAC over the pickle alone), with a message to re-deploy."""

from __future__ import annotations

import hmac
import struct

import pytest

from kvs import KVS, CachedKVS, SerializationError
from kvs.serialization import MAGIC, decode, dumps_trusted, is_trusted_payload, sign_trusted
from tests.kvs.helpers import InvalidationRecorder

KEY = bytes(range(32))
A1, A2, B7 = "flowserve:plan:A:1", "flowserve:plan:A:2", "flowserve:plan:B:7"


def old_format(obj) -> bytes:
    """A value as FlowServe signed it before signatures named their key."""
    blob = dumps_trusted(obj)
    return bytes([MAGIC]) + b"Q" + hmac.digest(KEY, blob, "sha256") + blob


# -- the codec ---------------------------------------------------------------------------


def test_a_signed_value_decodes_only_under_the_key_it_was_signed_for():
    signed = sign_trusted(dumps_trusted({"v": 2}), KEY, A2)
    assert is_trusted_payload(signed)
    assert decode(signed, trusted=True, signing_key=KEY, key=A2) == {"v": 2}
    for elsewhere in (B7, A1, A2 + " ", ""):
        with pytest.raises(SerializationError, match="signature does not match this key: a plan copied") as e:
            decode(signed, trusted=True, signing_key=KEY, key=elsewhere)
        assert repr(A2) in str(e.value)  # where it came from, to find the culprit
    with pytest.raises(SerializationError, match="pass key="):  # no key: nothing to check it against
        decode(signed, trusted=True, signing_key=KEY)
    with pytest.raises(SerializationError, match="only with trusted=True"):
        decode(signed, key=A2)


def test_the_key_a_value_names_is_not_trusted_the_mac_decides():
    # a forger rewrites the key inside the value to the one it is copied to: the MAC,
    # computed over the key read from, refuses it
    signed = sign_trusted(dumps_trusted("b"), KEY, "flowserve:plan:B:2")
    forged = signed.replace(b"flowserve:plan:B:2", A2.encode(), 1)
    assert len(forged) == len(signed) and forged != signed
    with pytest.raises(SerializationError, match=r"signature does not match \(tampered"):
        decode(forged, trusted=True, signing_key=KEY, key=A2)
    # and so does one whose key length is rewritten to move a byte from MAC to key, read
    # from the key that it then names
    n = len(b"flowserve:plan:B:2")
    longer = signed[:2] + struct.pack("<H", n + 1) + signed[4:]
    named = signed[4 : 4 + n + 1].decode("utf-8", "surrogateescape")
    with pytest.raises(SerializationError, match=r"signature does not match \(tampered"):
        decode(longer, trusted=True, signing_key=KEY, key=named)


def test_a_tampered_value_or_another_clusters_key_is_refused():
    signed = sign_trusted(dumps_trusted([1, 2]), KEY, A2)
    tampered = signed[:-1] + bytes([signed[-1] ^ 1])
    with pytest.raises(SerializationError, match="signature does not match"):
        decode(tampered, trusted=True, signing_key=KEY, key=A2)
    with pytest.raises(SerializationError, match="signature does not match"):
        decode(signed, trusted=True, signing_key=bytes(32), key=A2)
    with pytest.raises(SerializationError, match="truncated"):
        decode(signed[:20], trusted=True, signing_key=KEY, key=A2)


def test_an_old_format_signed_value_is_refused_with_a_redeploy_message():
    with pytest.raises(SerializationError, match="old format.*re-deploy the flow"):
        decode(old_format({"v": 1}), trusted=True, signing_key=KEY, key=A2)
    with pytest.raises(SerializationError, match="only with trusted=True"):
        decode(old_format({"v": 1}), key=A2)


def test_only_trusted_pickles_are_signed():
    with pytest.raises(SerializationError, match="dumps_trusted"):
        sign_trusted(b"\xf5Sx", KEY, A2)


# -- the client: put_trusted signs for its key, get checks the key it read from -----------


@pytest.fixture
def signed(kvs, redis_url):
    store = KVS.from_url(redis_url, signing_key=KEY)
    yield store
    store.close()


def test_a_value_copied_to_another_key_is_refused_naming_that_key(kvs, signed):
    signed.put_trusted(A1, {"flow": "A", "v": 1})
    signed.put_trusted(A2, {"flow": "A", "v": 2})
    signed.put_trusted(B7, {"flow": "B", "v": 7})
    genuine = signed.get_bytes(A2)
    assert signed.get(A2, trusted=True) == {"flow": "A", "v": 2}
    for source in (B7, A1):  # another flow's plan; an older version of this one
        kvs.redis.set(A2, signed.get_bytes(source))  # anyone with the store's password can
        with pytest.raises(SerializationError, match="signature does not match this key") as e:
            signed.get(A2, trusted=True)
        assert f"value of key {A2!r}" in str(e.value)
        with pytest.raises(SerializationError, match="signature does not match this key"):
            signed.mget([A1, A2], trusted=True)
    kvs.redis.set(A2, genuine)  # back where it was signed for: accepted again
    assert signed.mget([A1, A2], trusted=True) == [{"flow": "A", "v": 1}, {"flow": "A", "v": 2}]


def test_an_old_format_value_in_the_store_is_refused_naming_its_key(kvs, signed):
    kvs.redis.set(A2, old_format({"v": 2}))
    with pytest.raises(SerializationError, match=f"value of key {A2!r}: .*old format.*re-deploy"):
        signed.get(A2, trusted=True)


def test_the_cached_client_checks_the_key_too(kvs, signed, redis_url):
    signed.put_trusted(A2, {"v": 2})
    signed.put_trusted(B7, {"v": 7})
    cached = CachedKVS.from_url(redis_url, cache_max_bytes=1 << 20, signing_key=KEY)
    try:
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        assert cached.get(A2, trusted=True) == {"v": 2}
        assert cached.holds(A2)
        kvs.redis.set(A2, signed.get_bytes(B7))  # the server invalidates the cached copy
        assert recorder.wait_for_key(A2), "no invalidation"
        with pytest.raises(SerializationError, match="signature does not match this key"):
            cached.get(A2, trusted=True)
        assert not cached.holds(A2)  # a refused value is not cached either
        with pytest.raises(SerializationError, match="signature does not match this key"):
            cached.mget([B7, A2], trusted=True)
        kvs.redis.set(A2, old_format({"v": 2}))
        assert recorder.wait_for_key(A2)
        with pytest.raises(SerializationError, match="re-deploy"):
            cached.get(A2, trusted=True)
        cached.put_trusted(A2, {"v": 3})  # the cluster's own write is accepted, and cached
        assert cached.get(A2, trusted=True) == {"v": 3}
        assert cached.get(A2, trusted=True) == {"v": 3} and cached.holds(A2)
    finally:
        cached.close()
