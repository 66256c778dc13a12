"""A least-recently-used cache bounded by the weight of what it holds, not by a count.

Per-file checksums and per-pack store entries are loaded as reads reach them; a walk over every
data file of a large table (a deep verify, a compaction, a training epoch) keeps only the latest
ones, so memory stays flat however many files the table has.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WeightedLRU(Generic[K, V]):
    """Values loaded on first use and kept while their total weight is at most ``limit``
    (the most recently used one is kept whatever it weighs).

    >>> cache = WeightedLRU(limit=4, weight=len)
    >>> cache.get("a", lambda: "xx"), cache.get("b", lambda: "yy"), cache.get("a", lambda: "?")
    ('xx', 'yy', 'xx')
    >>> cache.get("c", lambda: "zz"), list(cache.keys())  # "b" was the least recently used
    ('zz', ['a', 'c'])
    """

    def __init__(self, limit: int, weight: Callable[[V], int]) -> None:
        self.limit = limit
        self._weight = weight
        self._values: OrderedDict[K, tuple[V, int]] = OrderedDict()  # least recent first
        self.weight = 0  # of the values held

    def get(self, key: K, load: Callable[[], V]) -> V:
        """The value of ``key``, loaded with ``load()`` if it is not held."""
        held = self._values.get(key)
        if held is not None:
            self._values.move_to_end(key)
            return held[0]
        value = load()
        weight = self._weight(value)
        self._values[key] = (value, weight)
        self.weight += weight
        while self.weight > self.limit and len(self._values) > 1:
            self.weight -= self._values.popitem(last=False)[1][1]
        return value

    def find(self, key: K) -> V | None:
        """The value of ``key`` if it is held (now the most recently used), else None."""
        held = self._values.get(key)
        if held is None:
            return None
        self._values.move_to_end(key)
        return held[0]

    def keys(self):
        """The keys held, least recently used first."""
        return self._values.keys()

    def __len__(self) -> int:
        return len(self._values)
