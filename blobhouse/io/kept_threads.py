"""Thread pools made on first use and kept for the process: starting threads for each call
costs as much as the small work they do (reading 64 payloads of 35 KB, hashing a run)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class KeptThreads:
    """A :class:`ThreadPoolExecutor` of ``threads`` threads, made on first :meth:`pool` and
    kept; a forked child (a Spark Python worker, a DataLoader worker) inherits the pool but not
    its threads, so it forgets it and makes its own.

    >>> kept = KeptThreads(2, "example")
    >>> kept.pool().submit(sum, [1, 2]).result(), kept.pool() is kept.pool()
    (3, True)
    """

    def __init__(self, threads: int, name: str) -> None:
        self._threads, self._name = threads, name
        self._forget()
        if hasattr(os, "register_at_fork"):  # not on Windows, which never forks
            os.register_at_fork(after_in_child=self._forget)

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            return self._pool

    def _forget(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
