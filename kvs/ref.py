"""``KVSRef``: a pointer to a value in the KVS, passed downstream instead of the data.

An operator that produces a large value (an embedding matrix, a model output) can put
it in the KVS once and send only ``KVSRef(key)`` to the next stage; the stage that
needs the data resolves it through its own executor's cache, so a value already
cached there never crosses the network again, and the scheduler can place work where
``CachedKVS.holds(ref.key)``.

    >>> ref = KVSRef("emb/42")
    >>> ref.resolve(store)          # doctest: +SKIP  (store: KVS or CachedKVS)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

_MISSING: Any = object()


class _Store(Protocol):
    def get(self, key: str, default: Any = ...) -> Any: ...


@dataclass(frozen=True, slots=True)
class KVSRef:
    """An immutable reference to the KVS value stored under ``key``."""

    key: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"KVSRef key must be a str, got {type(self.key).__name__} ({self.key!r})")

    def resolve(self, store: _Store, default: Any = _MISSING) -> Any:
        """The referenced value, read through ``store`` (use the executor's
        ``CachedKVS`` so repeated resolves are local). Raises ``KeyNotFoundError``
        if the key is gone and no ``default`` is given."""
        if default is _MISSING:
            return store.get(self.key)
        return store.get(self.key, default)
