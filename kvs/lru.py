"""A least-recently-used map bounded by bytes (not thread-safe: ``CachedKVS`` locks).

Sizes are given by the caller (``CachedKVS`` uses the encoded size plus a fixed
per-entry overhead): decoded arrays are zero-copy views of the received bytes, so the
encoded size is what they actually keep alive.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ByteLRU:
    """``key -> (value, nbytes)``; inserting evicts least-recently-used entries until
    the total fits ``max_bytes``. An entry larger than ``max_bytes`` is not stored."""

    __slots__ = ("_entries", "max_bytes", "nbytes", "evictions", "last_eviction")

    def __init__(self, max_bytes: int):
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.evictions = 0
        self.last_eviction = -math.inf  # time.monotonic() of the latest eviction

    def get(self, key: Hashable) -> Any | None:
        """The entry's value (marked most recently used), or None if absent."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> bool:
        """Insert or replace; False if ``nbytes`` alone exceeds the budget."""
        self.pop(key)
        if nbytes > self.max_bytes:
            return False
        self._entries[key] = (value, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            _, (_, size) = self._entries.popitem(last=False)
            self.nbytes -= size
            self.evictions += 1
            self.last_eviction = time.monotonic()
        return True

    def pop(self, key: Hashable) -> bool:
        """Remove ``key``; True if it was present."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.nbytes -= entry[1]
        return True

    def clear(self) -> int:
        """Remove everything; returns how many entries there were."""
        count = len(self._entries)
        self._entries.clear()
        self.nbytes = 0
        return count

    def keys(self) -> list:
        """Keys from least to most recently used (a snapshot)."""
        return list(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
