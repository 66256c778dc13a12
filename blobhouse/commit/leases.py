"""Write leases: a running write keeps proof that it is alive, so gc keeps what it staged.

A write's files stay unreferenced until its commit, and gc sweeps unreferenced files older than
its grace period. A write can outlast any grace (a long Spark job, a commit Lance retries under
contention), so while a write stages files or commits, it touches ``_leases/<its name prefix>``
every :data:`REFRESH_SECONDS` (every process of the write does: Spark tasks and the committing
driver share one lease). gc keeps every file whose name starts with the prefix of a lease
touched less than :data:`TIMEOUT_SECONDS` before its mark began: a write that committed after
the mark began touched its lease after that, so its files are kept too. A lease nobody touches
any more (the write ended or died) expires, and gc removes it once it is older than the grace.

Lance names some files itself (its temporary files while it writes one, the data files of a
schema change or of its own compaction): they carry no prefix. A lease holds the time its
write started, so gc keeps every file without a prefix that is younger than the oldest live
write (:func:`oldest_start`), whatever its grace.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator

from blobhouse.io.leftovers import Found, found_at, listed, make_way, own_folder
from blobhouse.io.objects import ObjectStore, StorageOptions, is_local, object_store, read_object
from blobhouse.io.uris import as_uri
from blobhouse.layout import LEASES_DIR, LOCKS_DIR

#: a store request per process of a write this often: 6 touches within TIMEOUT_SECONDS
REFRESH_SECONDS = 5.0
TIMEOUT_SECONDS = 30.0
_LEASE_READ_BYTES = 4096  # more than a lease holds


@contextlib.contextmanager
def held(
    table_path: str, prefix: str, storage_options: StorageOptions | None = None
) -> Iterator[None]:
    """Hold the lease of the write whose files start with ``prefix`` while the block runs.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> with held(root, "w1-"):
    ...     sorted(live_prefixes(root, since=0))
    ['w1-']
    """
    if not prefix:  # a write without a prefix cannot be told apart: nothing to hold
        yield
        return
    store, uri = _lease(table_path, prefix, storage_options)
    own_folder(store, as_uri(table_path.rstrip("/")), LEASES_DIR)  # never a link's target
    make_way(store, uri)  # a directory or a link left at its name is never a lease
    # the write's start: a write of many processes (Spark tasks) keeps its first one's
    started = _started(uri, storage_options) or time.time()
    body = json.dumps({"started": started}).encode()
    store.put(uri, body)  # rewriting the object sets its modification time, on every store
    with touching(lambda: store.put(uri, body), "blobhouse-lease"):
        yield


TOUCH_JOIN_SECONDS = 1.0  # how long a failure waits for a touch in flight


@contextlib.contextmanager
def touching(touch: Callable[[], None], name: str) -> Iterator[None]:
    """Call ``touch`` every :data:`REFRESH_SECONDS` on a thread of its own while the block
    runs (what keeps a lease or a lock alive); a touch that fails is retried at the next
    (those who judge it allow :data:`TIMEOUT_SECONDS`, 6 touches)."""
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(REFRESH_SECONDS):
            with contextlib.suppress(OSError):
                touch()

    thread = threading.Thread(target=refresh, name=name, daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        stop.set()
        # a touch in flight may wait out its store's budget: a failure is not held for it (a
        # lease it writes after the writer removed its own expires, and gc removes it)
        thread.join(TOUCH_JOIN_SECONDS)
        raise
    stop.set()
    thread.join()


def release(table_path: str, prefix: str, storage_options: StorageOptions | None = None) -> None:
    """Remove the lease of a write that will never commit (it was aborted)."""
    if not prefix:
        return
    store, uri = _lease(table_path, prefix, storage_options)
    with contextlib.suppress(OSError):
        store.delete(uri)


def live_prefixes(
    table_path: str, since: float, storage_options: StorageOptions | None = None
) -> set[str]:
    """Prefixes of the writes whose lease was touched at ``since`` (epoch seconds, by the
    store's clock) or later."""
    touched = _leases(table_path, storage_options)
    return {name for name, at in touched.items() if at >= since}


def oldest_start(
    table_path: str, since: float, storage_options: StorageOptions | None = None
) -> float | None:
    """When the oldest write whose lease was touched at ``since`` or later started (epoch
    seconds, the writer's clock less :data:`TIMEOUT_SECONDS` for clocks that differ; a
    lease that does not say: 0), or None when no lease is live.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> oldest_start(root, since=0) is None
    True
    >>> with held(root, "w1-"):
    ...     time.time() - 60 < oldest_start(root, since=0) < time.time()
    True
    """
    live = [n for n, at in _leases(table_path, storage_options).items() if at >= since]
    if not live:
        return None
    starts = []
    for name in live:
        _, uri = _lease(table_path, name, storage_options)
        starts.append(_started(uri, storage_options, missing=0.0))
    return min(starts) - TIMEOUT_SECONDS


def _started(
    uri: str, storage_options: StorageOptions | None, missing: float | None = None
) -> float | None:
    """The start a lease records (``missing`` if it has none: gone, or written by an older
    blobhouse, or being written)."""
    try:
        raw = read_object(uri, storage_options, size=_LEASE_READ_BYTES)  # one GET, no HEAD
        return float(json.loads(raw)["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return missing


def expired(
    table_path: str, before: float, storage_options: StorageOptions | None = None
) -> list[str]:
    """The leases (their write's prefix) last touched before ``before``."""
    return sorted(n for n, at in _leases(table_path, storage_options).items() if at < before)


def remove_expired(
    table_path: str, before: float, storage_options: StorageOptions | None = None
) -> int:
    """Delete the leases last touched before ``before``; returns how many."""
    expired_leases = expired(table_path, before, storage_options)
    for name in expired_leases:
        store, uri = _lease(table_path, name, storage_options)
        with contextlib.suppress(OSError):
            store.delete(uri)
    return len(expired_leases)


def leftover_leases(
    table_path: str, storage_options: StorageOptions | None = None
) -> list[tuple[str, Found]]:
    """What stands in ``_leases/`` that neither a lease nor the locks' folder is: a directory,
    a special file (what gc removes; a link is listed as a lease, and expires as one)."""
    root = as_uri(f"{table_path}/{LEASES_DIR}")
    if not is_local(root):
        return []  # an object store holds objects only: leases, which expire
    store = object_store(root, storage_options)
    stale = []
    for name in listed(store, root):
        found = found_at(store, f"{root}/{name}")
        locks = name == LOCKS_DIR.removeprefix(f"{LEASES_DIR}/")  # (the locks' own folder)
        if found is not None and found.kind in ("directory", "special") and not locks:
            stale.append((f"{root}/{name}", found))
    return stale


def _leases(table_path: str, storage_options: StorageOptions | None) -> dict[str, float]:
    root = as_uri(f"{table_path}/{LEASES_DIR}")
    listed = object_store(root, storage_options).list(root)
    return {info.name: info.mtime for info in listed if "/" not in info.name}


def _lease(
    table_path: str, prefix: str, storage_options: StorageOptions | None
) -> tuple[ObjectStore, str]:
    uri = as_uri(f"{table_path}/{LEASES_DIR}/{prefix}")
    return object_store(uri, storage_options), uri
