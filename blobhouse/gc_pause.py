"""Python's cyclic garbage collector paused while a write places a batch of payloads.

A write keeps a few Python objects per payload alive while it places a batch (views of the
payloads, their store entries and references). The collector counts every one of them, and
each full collection they trigger walks every object of the process: the user's, and torch's
when it is imported. That was a quarter of a write of small payloads (half with torch
imported). Reference counting still frees everything at once while the collector pauses;
only reference cycles, which the write does not make, wait until the batch is placed.

Pauses nest and may overlap across threads: the collector runs again when the last one ends,
if it ran before the first began. The user's own iterator of batches runs with it on.

>>> import gc
>>> with gc_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0  # pauses under way, in every thread
_was_enabled = False  # whether the collector ran when the first of them began


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector paused for the ``with`` block (see the module)."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


def _forked() -> None:
    """A forked child starts with no pause of its own: the threads that paused are not in
    it, so it collects again as the parent did before them."""
    global _lock, _pauses
    _lock = threading.Lock()
    if _pauses and _was_enabled:
        gc.enable()
    _pauses = 0


if hasattr(os, "register_at_fork"):  # not on Windows, which never forks
    os.register_at_fork(after_in_child=_forked)
