"""stats: per blob column and kind, what rows reference (logical) and what it takes (physical),
what the table stores itself and what it references outside, and where the rest of the bytes
on disk are: rows deleted but still stored, older versions, leftovers.

Reads descriptors only, never blob bytes, one batch at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.maintenance.garbage_collection import disk_usage, reclaimable
from blobhouse.maintenance.reports import StatsReport
from blobhouse.managed import Registry
from blobhouse.placement import Kind
from blobhouse.snapshot import in_fresh_datasets, snapshot_of, table_io
from blobhouse.store.packs import store_uri_prefix
from blobhouse.values import ROW_ADDRESS, ColumnPath, get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from lance import LanceFragment, LanceScanner

    from blobhouse.snapshot import TableSnapshot

_GLOBAL = "global"  # external blobs in the table's own store: table-owned bytes
_GLOBAL_CODE = max(Kind) + 1
_MANAGED = "managed"  # external objects handed to the table (blobhouse.managed)
_MANAGED_CODE = max(Kind) + 2
_EXTERNAL = Kind.EXTERNAL.name.lower()  # external objects the user owns
# Lance's own kind-4 "managed" blobs are never written by blobhouse (nor resolved): the names
# of the kinds stats reports are these
_NAMES = {
    Kind.INLINE: "inline",
    Kind.PACKED: "packed",
    Kind.DEDICATED: "dedicated",
    Kind.EXTERNAL: _EXTERNAL,
    _MANAGED_CODE: _MANAGED,
    _GLOBAL_CODE: _GLOBAL,
}
_KIND_ORDER = list(_NAMES.values())
_STORED_KINDS = ("inline", "packed", "dedicated", _GLOBAL)
_OUTSIDE_KINDS = (_EXTERNAL, _MANAGED)


@table_io("read the stats of", reads_only=True)
def blob_stats(table: TableSnapshot) -> StatsReport:
    """Logical vs physical bytes per blob column and kind, and what the rest of the bytes on
    disk are.

    Per kind, ``logical_bytes`` is what rows reference (each row counted) and
    ``physical_bytes`` the distinct ranges behind them (each once); ``table_owned`` tells the
    kinds the table stores (inline, packed, dedicated, and ``global``: its content-addressed
    store) from those outside it: ``external`` (objects the user owns) and ``managed``
    (objects a write handed to the table, which gc deletes once unreferenced). A column's and
    the table's ``logical_bytes``, ``physical_bytes`` and ``dedup_ratio`` are the sums over
    every kind, external included, so the totals always equal the sum of the lines; of the
    physical bytes, ``table_owned_bytes`` are stored by the table and ``external_bytes``
    referenced outside it (``physical_bytes = table_owned_bytes + external_bytes``), of which
    ``managed_bytes`` managed. ``external_references`` splits the references outside the table
    into ``managed`` and ``unmanaged``: references (rows), distinct objects, bytes.
    ``unresolved_references`` counts the live rows whose external reference lies outside the
    bases the table reads with (another tool damaged them: :mod:`blobhouse.properties`); they
    are in no kind.

    Bytes on disk no current row needs: ``deleted_rows_bytes`` (stored ranges that only rows
    deleted in this version reference; compaction drops them), ``old_versions_bytes`` (files
    only older versions of this branch use, that gc with ``retain_versions`` removes),
    ``orphan_bytes`` (files no retained version references, that gc sweeps); and
    ``on_disk_bytes``, every object under the table's root.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000] * 4)}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> s = t.stats()["columns"]["img"]
    >>> s["logical_bytes"], s["physical_bytes"], s["dedup_ratio"], s["table_owned_bytes"]
    (400000, 100000, 4.0, 100000)
    """
    table = snapshot_of(table)
    dataset = table.dataset
    fragments = dataset.get_fragments()
    registered = Registry.load(table.location, table.storage_options).uris
    outside = {kind: _Outside() for kind in _OUTSIDE_KINDS}
    columns = {
        path_name(path): _column_stats(table, path, fragments, registered, outside)
        for path in stored_blob_columns(table.schema)
    }
    properties = table.properties
    for name, column in columns.items():
        column["dedup"] = properties.dedup_of(name)
    files = reclaimable(table)
    rows = table.count_rows()
    report = {
        "version": table.version,
        "rows": rows,
        "fragments": len(fragments),
        "deleted_rows": sum(f.metadata.physical_rows for f in fragments) - rows,
        "orphan_files": files["orphan_files"],
        "orphan_bytes": files["orphan_bytes"],
    }
    totals = {
        key: sum(c[key] for c in columns.values())
        for key in (
            "logical_bytes",
            "physical_bytes",
            "table_owned_bytes",
            "external_bytes",
            "managed_bytes",
            "deleted_rows_bytes",
        )
    }
    report |= {
        "logical_bytes": totals["logical_bytes"],
        "physical_bytes": totals["physical_bytes"],
        "dedup_ratio": _ratio(totals["logical_bytes"], totals["physical_bytes"]),
        "table_owned_bytes": totals["table_owned_bytes"],
        "external_bytes": totals["external_bytes"],
        "managed_bytes": totals["managed_bytes"],
        "external_references": {
            "managed": outside[_MANAGED].summary(),
            "unmanaged": outside[_EXTERNAL].summary(),
        },
        "deleted_rows_bytes": totals["deleted_rows_bytes"],
        "unresolved_references": sum(c["unresolved_references"] for c in columns.values()),
        "old_versions_files": files["old_versions_files"],
        "old_versions_bytes": files["old_versions_bytes"],
        "on_disk_bytes": disk_usage(table),
        "columns": columns,
        "properties": properties.to_dict(),
        # a copy whose manifest still names its old place: stock readers read the store there
        "moved_from": table.moved_from,
    }
    return report


class _Outside:
    """The references of one kind outside the table, over every column: rows, distinct
    objects, distinct ranges."""

    def __init__(self) -> None:
        self.references = 0
        self.ranges: set[tuple[str, int, int]] = set()

    def summary(self) -> dict:
        return {
            "references": self.references,
            "objects": len({uri for uri, _, _ in self.ranges}),
            "bytes": sum(size for _, _, size in self.ranges),
        }


def _column_stats(
    table: TableSnapshot,
    path: ColumnPath,
    fragments: list[LanceFragment],
    registered: frozenset[str],
    outside: dict[str, _Outside],
) -> dict:
    """One column's kinds, and the stored ranges only its deleted rows reference; references
    outside the table are added to ``outside`` too."""
    store_prefix = store_uri_prefix(table.uri)
    kinds: dict[str, dict] = {}
    distinct: dict[str, set] = {}
    deleted: set[tuple[str, int, int]] = set()  # stored ranges deleted rows reference
    unresolved = 0
    for refs, codes, live, lost in _references(table, path, fragments, store_prefix, registered):
        unresolved += lost
        for code in np.unique(codes[live]):
            rows = refs.filter(pa.array(live & (codes == code)))
            name = _NAMES[int(code)]
            entry = kinds.setdefault(name, {"rows": 0, "logical_bytes": 0, "physical_bytes": 0})
            entry["rows"] += len(rows)
            entry["logical_bytes"] += int(rows.field("size").to_numpy().sum())
            distinct.setdefault(name, set()).update(_ranges(rows))
        # deleting a reference frees nothing outside the table (gc may, for managed objects)
        gone = ~live & (codes != Kind.EXTERNAL) & (codes != _MANAGED_CODE)
        if gone.any():
            deleted.update(_ranges(refs.filter(pa.array(gone))))
    for kind, ranges in distinct.items():
        kinds[kind]["physical_bytes"] = sum(size for _, _, size in ranges)
        if kind in outside:
            outside[kind].references += kinds[kind]["rows"]
            outside[kind].ranges |= ranges
            kinds[kind]["objects"] = len({uri for uri, _, _ in ranges})
    live_stored = set().union(*(distinct.get(k, set()) for k in _STORED_KINDS))
    summary = _column_summary(kinds)
    summary["deleted_rows_bytes"] = sum(size for _, _, size in deleted - live_stored)
    summary["unresolved_references"] = unresolved
    return summary


def _references(
    table: TableSnapshot,
    path: ColumnPath,
    fragments: list,
    store_prefix: str,
    registered: frozenset[str],
):
    """Per batch of the column's non-null values: the resolved references, each row's kind
    (store references and managed objects told apart from external ones), and whether the row
    is live (rows deleted in this version are read too, from fragments that have deletions)."""
    for scanner, fragment_id in _scans(table, path, fragments):
        offset = 0  # physical row of the batch's first row (fragments with deletions)
        for batch in scanner.to_batches():
            descriptors = get_column(batch, path)
            addresses = batch.column(ROW_ADDRESS)
            live = addresses.is_valid().to_numpy(zero_copy_only=False)
            if fragment_id is not None and not live.all():
                # a deleted row has no address: it is its fragment's next physical row
                rows = np.arange(offset, offset + batch.num_rows, dtype=np.uint64)
                computed = pa.array((np.uint64(fragment_id) << np.uint64(32)) | rows)
                addresses = pc.if_else(addresses.is_valid(), addresses, computed)
            offset += batch.num_rows
            unresolved: list = []  # external references outside the bases read with
            refs = table.resolve_refs(path, descriptors, addresses, unresolved)
            valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
            valid[[u.row for u in unresolved]] = False
            keep = pa.array(valid)
            yield (
                refs.filter(keep),
                _kind_codes(descriptors.filter(keep), refs.filter(keep), store_prefix, registered),
                live[valid],
                int(live[[u.row for u in unresolved]].sum()),
            )


def _scans(
    table: TableSnapshot, path: ColumnPath, fragments: list
) -> Iterator[tuple[LanceScanner, int | None]]:
    """Scanners of the column's values: one for each run of fragments without deletions, then
    one for each fragment with deletions (its deleted rows too, and its id), each run of
    fragments in a dataset object of its own (:func:`~blobhouse.snapshot.in_fresh_datasets`)."""
    whole = [f.fragment_id for f in fragments if f.metadata.deletion_file is None]
    for at, run in in_fresh_datasets(table, whole):
        chosen = [at.dataset.get_fragment(i) for i in run]
        yield at.dataset.scanner(columns=[path[0]], with_row_address=True, fragments=chosen), None
    deleted = [f.fragment_id for f in fragments if f.metadata.deletion_file is not None]
    for at, run in in_fresh_datasets(table, deleted):
        for fragment_id in run:
            scanner = at.dataset.scanner(
                columns=[path[0]],
                with_row_address=True,
                with_row_id=True,  # Lance asks for it with deleted rows
                fragments=[at.dataset.get_fragment(fragment_id)],
                include_deleted_rows=True,
            )
            yield scanner, fragment_id


def _ranges(refs: pa.StructArray) -> zip:
    return zip(
        refs.field("uri").to_pylist(),
        refs.field("position").to_pylist(),
        refs.field("size").to_pylist(),
        strict=True,
    )


def _kind_codes(
    descriptors: pa.StructArray,
    refs: pa.StructArray,
    store_prefix: str,
    registered: frozenset[str],
) -> np.ndarray:
    """Each row's kind, with references into the table's store and to managed objects told
    apart from external ones."""
    codes = descriptors.field("kind").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    uris = refs.field("uri").fill_null("")
    in_store = pc.starts_with(uris, store_prefix).to_numpy(zero_copy_only=False)
    codes[(codes == Kind.EXTERNAL) & in_store] = _GLOBAL_CODE
    if registered:
        managed = pc.is_in(uris, pa.array(sorted(registered), pa.utf8()))
        codes[(codes == Kind.EXTERNAL) & managed.to_numpy(zero_copy_only=False)] = _MANAGED_CODE
    return codes


def _column_summary(kinds: dict[str, dict]) -> dict:
    for name, entry in kinds.items():
        entry["dedup_ratio"] = _ratio(entry["logical_bytes"], entry["physical_bytes"])
        entry["table_owned"] = name in _STORED_KINDS
    logical = sum(e["logical_bytes"] for e in kinds.values())
    physical = sum(e["physical_bytes"] for e in kinds.values())
    return {
        "logical_bytes": logical,
        "physical_bytes": physical,
        "dedup_ratio": _ratio(logical, physical),
        "table_owned_bytes": sum(e["physical_bytes"] for e in kinds.values() if e["table_owned"]),
        "external_bytes": sum(kinds[k]["physical_bytes"] for k in _OUTSIDE_KINDS if k in kinds),
        "managed_bytes": kinds[_MANAGED]["physical_bytes"] if _MANAGED in kinds else 0,
        "kinds": {k: kinds[k] for k in _KIND_ORDER if k in kinds},
    }


def _ratio(logical: int, physical: int) -> float:
    return round(logical / physical, 4) if physical else 1.0
