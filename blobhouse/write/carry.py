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
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.checksums import RecordedHashes
from blobhouse.dedup import content_hash
from blobhouse.errors import CorruptBlobError
from blobhouse.placement import Kind
from blobhouse.rangeio import BlobRef, read_ranges_arrow, refs_from_arrow
from blobhouse.snapshot import ROW_ADDRESS
from blobhouse.store.packs import store_uri_prefix
from blobhouse.values import ColumnPath, get_column, get_field, path_name, replace_field

if TYPE_CHECKING:
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
    descriptors = get_column(batch, path)
    refs = table.resolve_refs(path, descriptors, batch.column(ROW_ADDRESS))
    valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
    kinds = descriptors.field("kind").fill_null(0).to_numpy(zero_copy_only=False)
    uris = refs.field("uri").to_pylist()
    # payloads of packs being repacked are read and stored again, other references kept
    store = store_uri_prefix(table.uri)
    moving = np.array(
        [u in repack or (leave_store and u is not None and u.startswith(store)) for u in uris],
        dtype=bool,
    )
    external = valid & (kinds == Kind.EXTERNAL) & ~moving
    stored = valid & ~external
    if store_digests is not None:
        kept = external & np.array([u is not None and u.startswith(store) for u in uris], bool)
        _kept_digests(table, path, batch, descriptors, refs, kept, store, store_digests)
    positions = refs.field("position").to_pylist()
    sizes = refs.field("size").to_pylist()
    wanted = [
        BlobRef(uris[i], positions[i], sizes[i]) if stored[i] else None for i in range(len(refs))
    ]
    data = read_ranges_arrow(wanted, storage_options=table.storage_options)
    _check_recorded(
        path_name(path),
        (table.file_column(path), table.data_file_of(path)),
        descriptors,
        batch.column(ROW_ADDRESS),
        wanted,
        data,
        hashes,
    )
    outside = pa.array(~external)
    return pa.StructArray.from_arrays(
        [
            data,
            _masked(refs.field("uri"), outside),
            _masked(refs.field("position").cast(pa.uint64()), outside),
            _masked(refs.field("size").cast(pa.uint64()), outside),
        ],
        fields=list(INPUT_BLOB_TYPE),
        mask=pa.array(~valid),
    )


def _kept_digests(
    table: TableSnapshot,
    path: ColumnPath,
    batch: pa.RecordBatch,
    descriptors: pa.StructArray,
    refs: pa.StructArray,
    kept: np.ndarray,
    store: str,
    out: dict[tuple[str, int, int], bytes],
) -> None:
    """Add to ``out`` the hash the ``kept`` rows (store references a rewrite keeps) recorded
    for their payloads, keyed by (pack, position, size)."""
    if not kept.any():
        return
    wanted = [r if k else None for r, k in zip(refs_from_arrow(refs), kept.tolist(), strict=True)]
    expected = table.recorded_hashes().expected_many(
        table.file_column(path),
        descriptors,
        wanted,
        np.asarray(batch.column(ROW_ADDRESS).to_numpy(zero_copy_only=False), np.uint64),
        table.data_file_of(path),
    )
    for ref, digest in zip(wanted, expected, strict=True):
        if ref is not None and digest is not None:
            out[(ref.uri.removeprefix(store), ref.position, ref.size)] = digest


def _check_recorded(
    column: str,
    located: tuple[Callable[[int], int], Callable[[int], str]],
    descriptors: pa.StructArray,
    addresses: pa.Array,
    refs: list[BlobRef | None],
    data: pa.LargeBinaryArray,
    hashes: RecordedHashes,
) -> None:
    """Refuse to copy a payload whose bytes differ from the hash recorded when it was written:
    the copy would get a fresh, matching hash and the damage would no longer show.
    ``located``: fragment id -> the column's column in its data file, and that file."""
    file_column, data_file = located
    kinds = descriptors.field("kind").fill_null(0).to_numpy(zero_copy_only=False)
    blob_ids = descriptors.field("blob_id").fill_null(0).to_numpy(zero_copy_only=False)
    addresses = addresses.to_numpy()
    checked: set[BlobRef] = set()
    for i, ref in enumerate(refs):
        if ref is None or ref in checked:
            continue
        checked.add(ref)
        address = int(addresses[i])
        expected = hashes.expected(
            int(kinds[i]),
            int(blob_ids[i]),
            file_column(address >> 32),
            address & 0xFFFFFFFF,
            ref.uri,
            ref.position,
            ref.size,
            data_file(address >> 32),
        )
        if expected is not None and content_hash(data[i].as_buffer()) != expected:
            raise CorruptBlobError(
                f"blob column {column!r}: the {ref.size} bytes at {ref.position} of {ref.uri} do "
                "not match the hash recorded when they were written; compaction stopped and "
                "changed nothing (run verify(deep=True) for every damaged row)"
            )


def _masked(values: pa.Array, hide: pa.Array) -> pa.Array:
    """``values`` with null where ``hide`` is true."""
    return pc.if_else(hide, pa.scalar(None, values.type), values)
