"""A least-recently-used cache bounded by the weight of what it holds, not by a count.

Per-file checksums and per-pack store entries are loaded as reads reach them; a walk over every
data file of a large table (a deep verify, a compaction, a training epoch) keeps only the latest
ones, so memory stays flat however many files the table has.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
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
        self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        """Hold ``value`` for ``key`` (now the most recently used), dropping the least recently
        used values while the total weight is over the limit."""
        held = self._values.pop(key, None)
        if held is not None:
            self.weight -= held[1]
        weight = self._weight(value)
        self._values[key] = (value, weight)
        self.weight += weight
        while self.weight > self.limit and len(self._values) > 1:
            self.weight -= self._values.popitem(last=False)[1][1]

    def __contains__(self, key: K) -> bool:
        return key in self._values

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


class SharedCache(Generic[K, V]):
    """A :class:`WeightedLRU` that threads share: each key is loaded once at a time (a caller
    asking for a key being loaded waits for that load, and gets its value or its error), and
    loads of different keys run at once. A forked child keeps the values but not the parent's
    lock or loads in flight (their threads are not in the child).

    >>> cache = SharedCache(limit=4, weight=len)
    >>> cache.get("a", lambda: "xx"), cache.get("a", lambda: "?"), cache.holds("a")
    ('xx', 'xx', True)
    """

    def __init__(self, limit: int, weight: Callable[[V], int]) -> None:
        self._values: WeightedLRU[K, V] = WeightedLRU(limit, weight)
        self._forget_loads()
        _LIVE.add(self)  # weakly: a fork hook of its own would keep it alive for ever

    def _forget_loads(self) -> None:
        self._lock = threading.Lock()
        self._loading: dict[K, Future] = {}

    @property
    def weight(self) -> int:
        """The weight of the values held."""
        return self._values.weight

    def __len__(self) -> int:
        return len(self._values)

    def holds(self, key: K) -> bool:
        """Whether ``key``'s value is held or being loaded (a get will not load it again)."""
        with self._lock:
            return key in self._values or key in self._loading

    def find(self, key: K) -> V | None:
        """The value of ``key`` if it is held (now the most recently used), else None."""
        with self._lock:
            return self._values.find(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._values.put(key, value)

    def get(self, key: K, load: Callable[[], V]) -> V:
        """The value of ``key``, loaded with ``load()`` if no thread holds or loads it."""
        with self._lock:
            if key in self._values:
                return self._values.find(key)  # type: ignore[return-value]
            pending = self._loading.get(key)
            mine = pending is None
            if mine:
                pending = self._loading[key] = Future()
        if not mine:
            return pending.result()
        try:
            value = load()
        except BaseException as exc:
            with self._lock:
                self._loading.pop(key, None)
            pending.set_exception(exc)
            raise
        with self._lock:
            self._values.put(key, value)
            self._loading.pop(key, None)
        pending.set_result(value)
        return value


_LIVE: weakref.WeakSet[SharedCache] = weakref.WeakSet()


def _forget_loads_in_child() -> None:
    for cache in list(_LIVE):
        cache._forget_loads()


if hasattr(os, "register_at_fork"):  # not on Windows, which never forks
    os.register_at_fork(after_in_child=_forget_loads_in_child)
