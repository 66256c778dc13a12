"""stats: per blob column and kind, what rows reference (logical) and what is stored (physical).

Reads descriptors only, never blob bytes, one batch at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.maintenance.garbage_collection import orphans
from blobhouse.placement import Kind
from blobhouse.store import store_uri_prefix
from blobhouse.values import get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from blobhouse.table import Table

_GLOBAL = "global"  # external blobs in the table's own store: table-owned bytes
_GLOBAL_CODE = max(Kind) + 1
_KIND_ORDER = [k.name.lower() for k in Kind] + [_GLOBAL]
_STORED_KINDS = ("inline", "packed", "dedicated", _GLOBAL)


def blob_stats(table: Table) -> dict:
    """Logical vs physical bytes per blob column and kind.

    ``logical_bytes`` is what rows reference (each row counted), ``physical_bytes`` what is
    stored (each distinct stored range once); ``dedup_ratio`` is logical / physical. Column and
    table totals count bytes the table stores (inline, packed, dedicated, and ``global``: its
    content-addressed store); external blobs are reported under their kind with the distinct
    bytes they reference outside the table.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000] * 4)}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> s = t.stats()["columns"]["img"]
    >>> s["logical_bytes"], s["physical_bytes"], s["dedup_ratio"]
    (400000, 100000, 4.0)
    """
    dataset = table.dataset
    store_prefix = store_uri_prefix(table.uri)
    columns = {}
    for path in stored_blob_columns(table.schema):
        kinds: dict[str, dict] = {}
        distinct: dict[str, set] = {}
        scanner = dataset.scanner(columns=[path[0]], with_row_address=True)
        for batch in scanner.to_batches():
            descriptors = get_column(batch, path)
            refs = table.resolve_refs(path, descriptors, batch.column("_rowaddr"))
            kind_values = _kind_codes(descriptors, refs, store_prefix)
            valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
            for kind in np.unique(kind_values[valid]):
                rows = refs.filter(valid & (kind_values == kind))
                name = _GLOBAL if kind == _GLOBAL_CODE else Kind(int(kind)).name.lower()
                entry = kinds.setdefault(name, _empty_entry())
                entry["rows"] += len(rows)
                entry["logical_bytes"] += int(rows.field("size").to_numpy().sum())
                distinct.setdefault(name, set()).update(
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
    leftovers = orphans(table)
    return {
        "version": table.version,
        "rows": table.count_rows(),
        "fragments": len(fragments),
        "deleted_rows": sum(f.metadata.physical_rows for f in fragments) - table.count_rows(),
        "orphan_files": leftovers["files"],
        "orphan_bytes": leftovers["bytes"],
        "logical_bytes": logical,
        "physical_bytes": physical,
        "dedup_ratio": _ratio(logical, physical),
        "columns": columns,
    }


def _empty_entry() -> dict:
    return {"rows": 0, "logical_bytes": 0, "physical_bytes": 0}


def _kind_codes(descriptors: pa.StructArray, refs: pa.StructArray, store_prefix: str) -> np.ndarray:
    """Each row's kind, with references into the table's store told apart from external ones."""
    codes = descriptors.field("kind").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    in_store = pc.starts_with(refs.field("uri").fill_null(""), store_prefix)
    codes[(codes == Kind.EXTERNAL) & in_store.to_numpy(zero_copy_only=False)] = _GLOBAL_CODE
    return codes


def _column_summary(kinds: dict[str, dict]) -> dict:
    stored = [kinds[k] for k in _STORED_KINDS if k in kinds]
    logical = sum(e["logical_bytes"] for e in stored)
    physical = sum(e["physical_bytes"] for e in stored)
    for entry in kinds.values():
        entry["dedup_ratio"] = _ratio(entry["logical_bytes"], entry["physical_bytes"])
    return {
        "logical_bytes": logical,
        "physical_bytes": physical,
        "dedup_ratio": _ratio(logical, physical),
        "kinds": {k: kinds[k] for k in _KIND_ORDER if k in kinds},
    }


def _ratio(logical: int, physical: int) -> float:
    return round(logical / physical, 4) if physical else 1.0
