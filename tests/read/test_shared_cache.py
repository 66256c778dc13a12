"""The cache threads share (blobhouse.cache.SharedCache): each key loaded once at a time,
however many threads ask; a failed load fails every thread that waited for it, and is tried
again by the next ask."""

from __future__ import annotations

import threading
import time

import pytest

from blobhouse.cache import SharedCache


def test_threads_asking_for_one_key_share_one_load():
    cache: SharedCache[str, bytes] = SharedCache(1 << 20, len)
    loads, results = [], []
    start = threading.Barrier(8)

    def load() -> bytes:
        loads.append(1)
        time.sleep(0.05)  # long enough for every other thread to ask meanwhile
        return b"value"

    def ask() -> None:
        start.wait()
        results.append(cache.get("k", load))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [b"value"] * 8 and len(loads) == 1
    assert cache.holds("k") and len(cache) == 1 and cache.weight == 5


def test_a_failed_load_fails_its_waiters_and_is_tried_again():
    cache: SharedCache[str, bytes] = SharedCache(1 << 20, len)
    started, errors = threading.Event(), []

    def failing() -> bytes:
        started.set()
        time.sleep(0.05)
        raise OSError("the file is gone")

    def waiter() -> None:
        started.wait()
        try:
            cache.get("k", lambda: b"never")  # waits for the failing load: not its own
        except OSError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=waiter)
    thread.start()
    with pytest.raises(OSError, match="the file is gone"):
        cache.get("k", failing)
    thread.join()
    assert errors == ["the file is gone"]
    assert not cache.holds("k")
    assert cache.get("k", lambda: b"again") == b"again"


def test_values_stay_within_the_limit_least_recently_used_out_first():
    cache: SharedCache[str, bytes] = SharedCache(4, len)
    cache.get("a", lambda: b"xx")
    cache.get("b", lambda: b"yy")
    cache.find("a")  # now the most recently used
    cache.put("c", b"zz")
    assert cache.holds("a") and cache.holds("c") and not cache.holds("b")
    assert cache.weight == 4


def test_a_cache_no_one_holds_is_freed():
    """A cache made for one run (a verify's own hashes) is freed with it: nothing the process
    keeps for forks holds it."""
    import gc
    import weakref

    cache: SharedCache[str, bytes] = SharedCache(1 << 20, len)
    cache.get("k", lambda: b"x" * 1000)
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None


def test_a_forked_child_loads_what_the_parent_was_loading():
    """A fork while a thread of the parent loads a key: the child's cache holds what was
    loaded and loads that key itself (the parent's thread, and its lock, are not in it)."""
    import os

    cache: SharedCache[str, bytes] = SharedCache(1 << 20, len)
    cache.get("held", lambda: b"held")
    release = threading.Event()
    loading = threading.Thread(target=cache.get, args=("slow", lambda: release.wait() and b"p"))
    loading.start()
    while not cache.holds("slow"):
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:  # the child: exit status says what it saw
        ok = cache.find("held") == b"held" and cache.get("slow", lambda: b"c") == b"c"
        os._exit(0 if ok else 1)
    release.set()
    loading.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.find("slow") == b"p"
