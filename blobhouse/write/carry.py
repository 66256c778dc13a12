"""Carrying stored payloads into new data files: a compaction, an update or a merge rewrites rows
whose blob values are already stored; they go back through the write pipeline as logical values
(bytes, or a reference into the table's store kept as it is), each checked against the hash
recorded when it was written.

>>> import pyarrow as pa
>>> from blobhouse import blob_field
>>> schema = pa.schema([pa.field("id", pa.int64()), blob_field("img")])
>>> carried_schema(schema, [("img",)]).field("img").type == INPUT_BLOB_TYPE
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.files.checksums import RecordedHashes
from blobhouse.files.ranges import read_ranges_arrow
from blobhouse.placement import Kind
from blobhouse.store.packs import store_uri_prefix
from blobhouse.values import (
    ROW_ADDRESS,
    ColumnPath,
    get_column,
    get_field,
    path_name,
    replace_field,
)

if TYPE_CHECKING:
    from blobhouse.files.references import ResolvedRows
    from blobhouse.snapshot import TableSnapshot

#: how a stored blob value travels back into the write pipeline: its bytes, or where it is
INPUT_BLOB_TYPE = pa.struct(
    [
        pa.field("data", pa.large_binary()),
        pa.field("uri", pa.utf8()),
        pa.field("position", pa.uint64()),
        pa.field("size", pa.uint64()),
    ]
)


def carried_schema(schema: pa.Schema, paths: Sequence[ColumnPath]) -> pa.Schema:
    """``schema`` with the blob columns at ``paths`` as the pipeline takes carried values."""
    for path in paths:
        field = get_field(schema, path)
        schema = replace_field(schema, path, pa.field(path[-1], INPUT_BLOB_TYPE, field.nullable))
    return schema


def logical_values(
    table: TableSnapshot,
    path: ColumnPath,
    batch: pa.RecordBatch,
    hashes: RecordedHashes,
    repack: frozenset[str],
    leave_store: bool = False,
    store_digests: dict[tuple[str, int, int], bytes] | None = None,
) -> pa.StructArray:
    """Blob column ``path`` of ``batch`` as logical values: bytes (checked) for what the table
    stores, the reference for external blobs and for store payloads that stay where they are
    (those of ``repack`` packs move, every store payload with ``leave_store``). The hash rows
    recorded for the store payloads they keep go to ``store_digests`` (pack, position, size)."""
    rows = table.resolve_rows(path, get_column(batch, path), batch.column(ROW_ADDRESS))
    refs = rows.refs
    # payloads of packs being repacked are read and stored again, other references kept
    store = store_uri_prefix(table.uri)
    in_store = np.array([u.startswith(store) for u in refs.uris] or [False])[refs.codes]
    moving = np.array([u in repack for u in refs.uris] or [False])[refs.codes]
    if leave_store:
        moving |= in_store
    external = refs.valid & (rows.kinds == Kind.EXTERNAL) & ~moving
    stored = refs.valid & ~external
    located = table.file_column(path), table.data_file_of(path)
    if store_digests is not None and (external & in_store).any():
        kept = replace(rows, refs=replace(refs, valid=external & in_store))
        store_digests.update(_kept_digests(kept, hashes, located, store))
    # a payload whose bytes differ from its recorded hash is refused, not copied: the copy
    # would get a fresh, matching hash and the damage would no longer show
    wanted = replace(rows, refs=replace(refs, valid=stored))
    verify = hashes.verifier(path_name(path), located[0], wanted, located[1])
    data = read_ranges_arrow(wanted.refs, storage_options=table.storage_options, verify=verify)
    arrow = refs.to_arrow()
    outside = pa.array(~external)
    return pa.StructArray.from_arrays(
        [
            data,
            _masked(arrow.field("uri"), outside),
            _masked(arrow.field("position").cast(pa.uint64()), outside),
            _masked(arrow.field("size").cast(pa.uint64()), outside),
        ],
        fields=list(INPUT_BLOB_TYPE),
        mask=pa.array(~refs.valid),
    )


def _kept_digests(
    kept: ResolvedRows,
    hashes: RecordedHashes,
    located: tuple[Callable[[int], int], Callable[[int], str]],
    store: str,
) -> dict[tuple[str, int, int], bytes]:
    """The hashes the ``kept`` rows (store references a rewrite keeps) recorded for their
    payloads, keyed by (pack, position, size)."""
    expected = hashes.expected_many(located[0], kept, located[1])
    found = {}
    for row in np.flatnonzero(kept.refs.valid).tolist():
        ref = kept.refs.ref(row)
        if expected[row] is not None:
            found[(ref.uri.removeprefix(store), ref.position, ref.size)] = expected[row]
    return found


def _masked(values: pa.Array, hide: pa.Array) -> pa.Array:
    """``values`` with null where ``hide`` is true."""
    return pc.if_else(hide, pa.scalar(None, values.type), values)
