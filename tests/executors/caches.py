"""Warming executors' caches unevenly, for tests of key routing on a real cluster.

A lookup-only flow is routed from the gateway by pure rendezvous (no cache involved), so
the trace header of its answer names the key's owner. A second flow, a per-row lookup of
an "anchor" key followed by operator code that reads other keys (``flow.current_store()``),
runs on the anchor's owner: those keys then sit in that executor's cache and in no other.
Anchors are found once per test for every executor, so any executor can be warmed.
"""

from __future__ import annotations

import json
from collections import Counter

from flow import Flow
from tests.executors.conftest import unique

ANCHORS = 32  # candidate anchor keys: with 2 executors each owns one of them but with odds 2^-31


def read_keys(row):
    from flow import current_store

    store = current_store()
    keys = row.keys_.split(",")
    for key in keys:  # into the cache of the executor running this stage
        store.get(key)
    return len(keys)


def _executors(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [executor for _stage, executor, _ms, _batch in json.loads(response.headers["x-flowserve-trace"])]


class CacheWarmer:
    """``owners(keys)``: the executor each key is routed to; ``warm(keys, on=)``: read keys
    into one executor's cache; ``warm_foreign(keys)``: make an executor hold a key that
    another executor owns."""

    def __init__(self, cluster, http):
        self.http = http
        probe = Flow(unique("owner"), schema={"k": str})
        probe.lookup(column="k", name="v", missing="null")
        self.probe = cluster.deploy(probe)
        reader = Flow(unique("warm"), schema={"k": str, "keys_": str})
        reader.lookup(column="k", name="anchor", missing="null").map(read_keys, names=["n"])
        self.reader = cluster.deploy(reader)
        self.anchors: dict[str, str] = {}  # executor -> a key it owns
        for key, owner in self.owners([f"{self.probe.name}:anchor:{i}" for i in range(ANCHORS)]).items():
            self.anchors.setdefault(owner, key)
        assert len(self.anchors) >= 2, f"every anchor key is owned by {list(self.anchors)}"

    def owners(self, keys) -> dict[str, str]:
        """key -> the executor its rows go to when no sender holds it."""
        return {k: _executors(self.http.post(self.probe.url, json={"k": k}))[0] for k in keys}

    def warm(self, keys, on: str | None = None) -> str:
        """Read ``keys`` into the cache of executor ``on`` (default: any); returns its id."""
        on = on or next(iter(self.anchors))
        (where,) = set(
            _executors(self.http.post(self.reader.url, json={"k": self.anchors[on], "keys_": ",".join(keys)}))
        )
        assert where == on, f"the anchor of {on} was routed to {where}"
        return where

    def warm_foreign(self, keys) -> tuple[str, str]:
        """Make another executor hold a key owned by the executor that owns most of ``keys``;
        returns (that key, the executor holding it). Racing copies on the two executors
        then see different caches for the same rows."""
        owners = self.owners(keys)  # the owners read them: they hold their own keys now
        owner, _n = Counter(owners.values()).most_common(1)[0]
        key = next(k for k in keys if owners[k] == owner)
        other = next(e for e in self.anchors if e != owner)
        return key, self.warm([key], on=other)
