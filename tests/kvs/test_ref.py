"""``KVSRef``: a small frozen pointer passed downstream, resolved through a cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvs import KeyNotFoundError, KVSRef, decode, encode


def test_ref_is_small_frozen_and_hashable():
    ref = KVSRef("emb/1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.key = "other"
    assert {ref: 1}[KVSRef("emb/1")] == 1
    assert len(encode(ref)) == 2 + len("emb/1")


def test_ref_key_must_be_str():
    with pytest.raises(TypeError, match="int"):
        KVSRef(5)


def test_ref_roundtrips_through_the_codec_and_the_store(kvs):
    ref = KVSRef("target")
    assert decode(encode(ref)) == ref
    kvs.put("holder", ref)
    assert kvs.get("holder") == ref


def test_resolve_reads_through_the_executor_cache(cached_kvs):
    cached_kvs.put("emb", np.arange(6.0).reshape(2, 3))
    ref = KVSRef("emb")
    first = ref.resolve(cached_kvs)
    assert ref.resolve(cached_kvs) is first  # second resolve is a local hit
    assert cached_kvs.stats().hits == 1
    np.testing.assert_array_equal(first, np.arange(6.0).reshape(2, 3))


def test_resolve_missing(kvs):
    with pytest.raises(KeyNotFoundError, match="'gone'"):
        KVSRef("gone").resolve(kvs)
    assert KVSRef("gone").resolve(kvs, default=None) is None
