"""gc: remove old versions, then every file under ``data/`` that no retained version references
once it is older than a grace period.

What the table owns (data files, their sidecars, leftovers of writes that never committed) lives
under ``data/``; external objects under the table's allowed bases belong to the user and are never
looked at. The mark phase (:func:`referenced_paths`) runs per
:class:`~blobhouse.maintenance.walk.FragmentState`, here or in Spark tasks
(``blobhouse.spark.gc``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from blobhouse.maintenance.walk import (
    FragmentState,
    Progress,
    fragment_references,
    fragment_states,
    opened_states,
)
from blobhouse.placement import uri_to_path

if TYPE_CHECKING:
    from blobhouse.table import Table

DEFAULT_GRACE = timedelta(hours=24)


def referenced_paths(table: Table, state: FragmentState) -> set[str]:
    """Paths, relative to ``data/``, of the data files and sidecars one fragment state uses;
    ``table`` is opened at ``state.version``."""
    prefix = f"{table.uri}/data/"
    referenced = set(state.data_files)
    for batch in fragment_references(table, state.fragment_id):
        referenced.update(
            uri.removeprefix(prefix)
            for uri in batch.refs.field("uri").unique().to_pylist()
            if uri.startswith(prefix)
        )
    return referenced


def mark(table: Table, progress: Progress | None = None) -> set[str]:
    """Every path under ``data/`` that a retained version references."""
    states = fragment_states(table)
    referenced: set[str] = set()
    for done, (at, state) in enumerate(opened_states(table, states)):
        if progress:
            progress("mark", done, len(states))
        referenced |= referenced_paths(at, state)
    if progress:
        progress("mark", len(states), len(states))
    return referenced


def orphans(table: Table, referenced: Iterable[str] | None = None) -> dict:
    """Files under the table's data directory that no retained version references: leftovers of
    writes that never committed, or of versions already removed. Local tables only for now.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> orphans(t)["files"]
    0
    """
    data_dir = uri_to_path(f"{table.uri}/data")
    referenced = set(mark(table) if referenced is None else referenced)
    found = []
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            if os.path.relpath(path, data_dir) not in referenced:
                found.append(path)
    return {
        "files": len(found),
        "bytes": sum(os.path.getsize(p) for p in found),
        "paths": sorted(found),
    }


def gc(
    table: Table,
    *,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    progress: Progress | None = None,
    referenced: Callable[[Table], set[str]] | None = None,
) -> dict:
    """Remove old versions, then every file under ``data/`` that no retained version references
    and that is older than ``grace`` (younger ones may belong to a write still in progress).

    Versions go through Lance (``cleanup_old_versions``; nothing is removed unless
    ``retain_versions`` or ``older_than`` is given). Only files inside the table's data directory
    are ever considered: external objects the user owns are never touched. ``dry_run`` reports
    without deleting. ``referenced`` replaces the mark phase (Spark runs it in parallel).
    Local tables only for now.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> gc(t, dry_run=True)["removed_files"]
    0
    """
    removed_versions: list[int] = []
    if retain_versions is not None or older_than is not None:
        before = {v["version"] for v in table.versions()}
        if not dry_run:
            table.dataset.cleanup_old_versions(
                older_than=older_than, retain_versions=retain_versions
            )
        table = table.checkout(table.version)
        removed_versions = sorted(before - {v["version"] for v in table.versions()})
    # files staged after this instant may belong to a write that commits after the mark
    cutoff = time.time() - grace.total_seconds()
    marked = referenced(table) if referenced is not None else mark(table, progress)
    leftovers = orphans(table, marked)
    old = [p for p in leftovers["paths"] if _mtime(p) < cutoff]
    young = len(leftovers["paths"]) - len(old)
    reclaimed = sum(_size(p) for p in old)
    if not dry_run:
        for done, path in enumerate(old):
            if progress and done % 100 == 0:
                progress("sweep", done, len(old))
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        _remove_empty_dirs(uri_to_path(f"{table.uri}/data"))
    return {
        "dry_run": dry_run,
        "removed_versions": removed_versions,
        "retained_versions": [v["version"] for v in table.versions()],
        "removed_files": len(old),
        "reclaimed_bytes": reclaimed,
        "kept_referenced_files": len(marked),
        "kept_young_files": young,
        "paths": old,
    }


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except FileNotFoundError:
        return float("inf")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _remove_empty_dirs(root: str) -> None:
    for folder, dirs, files in os.walk(root, topdown=False):
        if folder != root and not dirs and not files:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
