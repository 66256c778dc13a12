"""Table services: storage statistics, verification of blob references, garbage collection.

Both read only descriptors (never blob bytes), one fragment batch at a time.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.fs as pafs

from blobhouse.placement import Kind, uri_to_path
from blobhouse.references import field_id
from blobhouse.values import get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from blobhouse.table import Table

_STORED_KINDS = (Kind.INLINE, Kind.PACKED, Kind.DEDICATED)


def blob_stats(table: Table) -> dict:
    """Logical vs physical bytes per blob column and kind.

    ``logical_bytes`` is what rows reference (each row counted), ``physical_bytes`` what is
    stored (each distinct stored range once); ``dedup_ratio`` is logical / physical. Column and
    table totals count bytes the table stores (inline, packed, dedicated); external blobs are
    reported under their kind with the distinct bytes they reference outside the table.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000] * 4)}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> s = t.stats()["columns"]["img"]
    >>> s["logical_bytes"], s["physical_bytes"], s["dedup_ratio"]
    (400000, 100000, 4.0)
    """
    dataset = table.dataset
    columns = {}
    for path in stored_blob_columns(table.schema):
        fid = field_id(dataset, path)
        kinds: dict[int, dict] = {}
        distinct: dict[int, set] = {}
        scanner = dataset.scanner(columns=[path[0]], with_row_address=True)
        for batch in scanner.to_batches():
            descriptors = get_column(batch, path)
            refs = table.resolver().resolve(descriptors, batch.column("_rowaddr"), fid)
            kind_values = descriptors.field("kind").to_numpy(zero_copy_only=False)
            valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
            for kind in np.unique(kind_values[valid]):
                rows = refs.filter(valid & (kind_values == kind))
                entry = kinds.setdefault(int(kind), _empty_entry())
                entry["rows"] += len(rows)
                entry["logical_bytes"] += int(rows.field("size").to_numpy().sum())
                distinct.setdefault(int(kind), set()).update(
                    zip(
                        rows.field("uri").to_pylist(),
                        rows.field("position").to_pylist(),
                        rows.field("size").to_pylist(),
                        strict=True,
                    )
                )
        for kind, ranges in distinct.items():
            kinds[kind]["physical_bytes"] = sum(size for _, _, size in ranges)
        columns[path_name(path)] = _column_summary(kinds)
    logical = sum(c["logical_bytes"] for c in columns.values())
    physical = sum(c["physical_bytes"] for c in columns.values())
    fragments = dataset.get_fragments()
    leftovers = orphans(table) if "://" not in table.uri.removeprefix("file://") else None
    return {
        "version": table.version,
        "rows": table.count_rows(),
        "fragments": len(fragments),
        "deleted_rows": sum(f.metadata.physical_rows for f in fragments) - table.count_rows(),
        "orphan_files": None if leftovers is None else leftovers["files"],
        "orphan_bytes": None if leftovers is None else leftovers["bytes"],
        "logical_bytes": logical,
        "physical_bytes": physical,
        "dedup_ratio": _ratio(logical, physical),
        "columns": columns,
    }


def _empty_entry() -> dict:
    return {"rows": 0, "logical_bytes": 0, "physical_bytes": 0}


def _column_summary(kinds: dict[int, dict]) -> dict:
    stored = [kinds[k] for k in _STORED_KINDS if k in kinds]
    logical = sum(e["logical_bytes"] for e in stored)
    physical = sum(e["physical_bytes"] for e in stored)
    for entry in kinds.values():
        entry["dedup_ratio"] = _ratio(entry["logical_bytes"], entry["physical_bytes"])
    return {
        "logical_bytes": logical,
        "physical_bytes": physical,
        "dedup_ratio": _ratio(logical, physical),
        "kinds": {Kind(k).name.lower(): v for k, v in sorted(kinds.items())},
    }


def _ratio(logical: int, physical: int) -> float:
    return round(logical / physical, 4) if physical else 1.0


@dataclass(frozen=True)
class Problem:
    """One reference that does not resolve to bytes."""

    version: int
    column: str
    row: int
    uri: str
    reason: str


def verify(table: Table, versions: list[int] | None = None) -> dict:
    """Check that every blob reference of every retained version (or of ``versions``) resolves
    to an existing object with its range inside it. Objects are stat'ed once each.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> verify(t)["problems"]
    []
    """
    versions = versions or [v["version"] for v in table.versions()]
    sizes: dict[str, int | None] = {}
    problems: list[Problem] = []
    checked = 0
    for at in _at_versions(table, versions):
        for column, row, ref in _references_of(at):
            checked += 1
            reason = _check(ref, sizes)
            if reason:
                problems.append(Problem(at.version, column, row, ref["uri"], reason))
    return {
        "versions": versions,
        "references": checked,
        "objects": len(sizes),
        "problems": [asdict(p) for p in problems],
    }


def orphans(table: Table) -> dict:
    """Files under the table's data directory that no retained version references: leftovers of
    writes that never committed, or of versions already removed. Local tables only for now.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> orphans(t)["files"]
    0
    """
    data_dir = uri_to_path(f"{table.uri}/data")
    referenced = _referenced_files(table)
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


def _referenced_files(table: Table) -> set[str]:
    """Paths, relative to data/, of the data files and sidecars retained versions use."""
    prefix = f"{table.uri}/data/"
    referenced: set[str] = set()
    for at in _at_versions(table, [v["version"] for v in table.versions()]):
        for fragment in at.dataset.get_fragments():
            referenced.update(f.path for f in fragment.metadata.files)
        for _, _, ref in _references_of(at):
            if ref["uri"].startswith(prefix):
                referenced.add(ref["uri"].removeprefix(prefix))
    return referenced


def _at_versions(table: Table, versions: list[int]) -> Iterator[Table]:
    """The table at each of ``versions``, opened once each."""
    from blobhouse.table import open_table

    for version in versions:
        yield open_table(table.uri, version, table.storage_options)


def _references_of(table: Table) -> Iterator[tuple[str, int, dict]]:
    """``(column, row, reference)`` of every non-null blob value of one table version."""
    for path in stored_blob_columns(table.schema):
        row = 0
        for batch in table.scan(columns=[path[0]], blobs="refs"):
            for ref in get_column(batch, path).to_pylist():
                if ref is not None:
                    yield path_name(path), row, ref
                row += 1


def _check(ref: dict, sizes: dict[str, int | None]) -> str | None:
    uri = ref["uri"]
    if uri not in sizes:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
            info = fs.get_file_info(path)
            sizes[uri] = info.size if info.type == pafs.FileType.File else None
        except (OSError, ValueError):
            sizes[uri] = None
    size = sizes[uri]
    if size is None:
        return "missing object"
    if ref["position"] + ref["size"] > size:
        return f"range [{ref['position']}, +{ref['size']}) is past the end ({size} bytes)"
    return None


DEFAULT_GRACE = timedelta(hours=24)


def gc(
    table: Table,
    *,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
) -> dict:
    """Remove old versions, then every file under ``data/`` that no retained version references
    and that is older than ``grace`` (younger ones may belong to a write still in progress).

    Versions go through Lance (``cleanup_old_versions``; nothing is removed unless
    ``retain_versions`` or ``older_than`` is given). Only files inside the table's data directory
    are ever considered: external objects the user owns are never touched. ``dry_run`` reports
    without deleting. Local tables only for now.

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
    leftovers = orphans(table)
    cutoff = time.time() - grace.total_seconds()
    old = [p for p in leftovers["paths"] if os.path.getmtime(p) < cutoff]
    young = len(leftovers["paths"]) - len(old)
    reclaimed = sum(os.path.getsize(p) for p in old)
    if not dry_run:
        for path in old:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        _remove_empty_dirs(uri_to_path(f"{table.uri}/data"))
    return {
        "dry_run": dry_run,
        "removed_versions": removed_versions,
        "removed_files": len(old),
        "reclaimed_bytes": reclaimed,
        "kept_young_files": young,
        "paths": old,
    }


def _remove_empty_dirs(root: str) -> None:
    for folder, dirs, files in os.walk(root, topdown=False):
        if folder != root and not dirs and not files:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
