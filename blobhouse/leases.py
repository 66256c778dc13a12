"""Write leases: a running write keeps proof that it is alive, so gc keeps what it staged.

A write's files stay unreferenced until its commit, and gc sweeps unreferenced files older than
its grace period. A write can outlast any grace (a long Spark job, a commit Lance retries under
contention), so while a write stages files or commits, it touches ``_leases/<its name prefix>``
every :data:`REFRESH_SECONDS` (every process of the write does: Spark tasks and the committing
driver share one lease). gc keeps every file whose name starts with the prefix of a lease
touched less than :data:`TIMEOUT_SECONDS` before its mark began: a write that committed after
the mark began touched its lease after that, so its files are kept too. A lease nobody touches
any more (the write ended or died) expires, and gc removes it once it is older than the grace.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pyarrow.fs as pafs

from blobhouse.placement import as_uri

LEASES_DIR = "_leases"
REFRESH_SECONDS = 2.0
TIMEOUT_SECONDS = 30.0


@contextlib.contextmanager
def held(
    table_path: str, prefix: str, storage_options: dict[str, str] | None = None
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
    fs, path = _lease_path(table_path, prefix)
    _touch(fs, path)
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(REFRESH_SECONDS):
            with contextlib.suppress(OSError):  # a missed touch is retried; gc allows 15
                _touch(fs, path)

    thread = threading.Thread(target=refresh, name="blobhouse-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def release(table_path: str, prefix: str, storage_options: dict[str, str] | None = None) -> None:
    """Remove the lease of a write that will never commit (it was aborted)."""
    if not prefix:
        return
    fs, root = pafs.FileSystem.from_uri(as_uri(f"{table_path}/{LEASES_DIR}"))
    with contextlib.suppress(OSError):
        fs.delete_file(f"{root}/{prefix}")


def live_prefixes(table_path: str, since: float) -> set[str]:
    """Prefixes of the writes whose lease was touched at ``since`` (epoch seconds) or later."""
    return {name for name, touched in _leases(table_path).items() if touched >= since}


def remove_expired(table_path: str, before: float) -> int:
    """Delete the leases last touched before ``before``; returns how many."""
    fs, root = pafs.FileSystem.from_uri(as_uri(f"{table_path}/{LEASES_DIR}"))
    expired = [name for name, touched in _leases(table_path).items() if touched < before]
    for name in expired:
        with contextlib.suppress(OSError):
            fs.delete_file(f"{root}/{name}")
    return len(expired)


def _leases(table_path: str) -> dict[str, float]:
    fs, root = pafs.FileSystem.from_uri(as_uri(f"{table_path}/{LEASES_DIR}"))
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return {i.base_name: i.mtime.timestamp() for i in infos if i.type == pafs.FileType.File}


def _lease_path(table_path: str, prefix: str) -> tuple[pafs.FileSystem, str]:
    fs, root = pafs.FileSystem.from_uri(as_uri(f"{table_path}/{LEASES_DIR}"))
    fs.create_dir(root, recursive=True)
    return fs, f"{root}/{prefix}"


def _touch(fs: pafs.FileSystem, path: str) -> None:
    # rewriting the empty object sets its modification time on every file system and store
    with fs.open_output_stream(path):
        pass
