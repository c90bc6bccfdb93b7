"""flow ``Table`` values through the codec (Arrow IPC) and the stores."""

from __future__ import annotations

import numpy as np
import pytest

from flow.table import Table
from kvs import decode, encode


def sample_table() -> Table:
    return Table.from_pylist(
        [
            {"x": 1, "conf": 0.5, "cls": "cat", "img": np.zeros((2, 3))},
            {"x": 2, "conf": None, "cls": None, "img": np.ones((2, 3))},
            {"x": 3, "conf": 0.9, "cls": "dog", "img": np.full((2, 3), 7.0)},
        ],
        qid=[10, 11, 42],
    )


def test_table_roundtrips_with_qids_nulls_and_tensors():
    table = sample_table()
    out = decode(encode(table))
    assert isinstance(out, Table)
    assert out.equals(table) and out == table
    assert out.columns == table.columns
    assert list(out.qid) == [10, 11, 42]
    assert out["img"].shape == (3, 2, 3)


def test_empty_table_roundtrips():
    table = Table.empty()
    assert decode(encode(table)).equals(table)


def test_large_tensor_table_roundtrips():
    emb = np.random.default_rng(0).random((2000, 128)).astype(np.float32)
    table = Table.from_dict({"emb": emb, "k": np.arange(2000)}, qid=np.arange(2000) * 3)
    out = decode(encode(table))
    assert out.equals(table)
    np.testing.assert_array_equal(out["emb"], emb)


def test_table_through_the_store_and_the_cache(kvs, cached_kvs):
    table = sample_table()
    kvs.put("t", table)
    assert kvs.get("t").equals(table)
    first = cached_kvs.get("t")
    assert first.equals(table)
    assert cached_kvs.get("t") is first  # decoded once, then served from the cache
    assert cached_kvs.stats().hits == 1


def test_table_encoding_is_distinct_from_a_plain_arrow_table():
    pa = pytest.importorskip("pyarrow")
    table = sample_table()
    assert isinstance(decode(encode(table.to_arrow())), pa.Table)
    assert isinstance(decode(encode(table)), Table)
