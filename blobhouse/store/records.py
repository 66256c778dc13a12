"""What a write's steps or tasks stored, recorded next to the store until the write's commit.

A store-first write (:mod:`blobhouse.write.store_first`) puts payloads in the store before its
rows exist, in one step (this process, or Spark tasks), and commits the rows in another (its own
process, or the Spark data source's commit in a Python worker of its own); the tasks of a Spark
write record what they stored instead of sending it to the driver. Each writes what it stored
as a record, an Arrow file in the write's folder ``_blobs/stored/<write id>-stored/``; the
commit streams the records into the store's index with its files' own, inside its Ctrl-C
guard (:meth:`~blobhouse.commit.transaction.Transaction.commit`), then removes them. An abort
removes them with the rest of the write (a task that ends after it, its own); gc sweeps those
of a write that died.

>>> import tempfile
>>> from blobhouse.store.packs import StoredPayload
>>> root = tempfile.mkdtemp()
>>> write_record(root, "write-0123456789ab", [StoredPayload(b"\\x01" * 32, "packs/p.pack", 0, 5)])
>>> [s.pack for s in read_records(root, "write-0123456789ab")]
['packs/p.pack']
>>> remove_records(root, "write-0123456789ab"); read_records(root, "write-0123456789ab")
[]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from blobhouse.io.objects import (
    StorageOptions,
    object_store,
    read_object,
    remove_folder,
)
from blobhouse.io.uris import as_uri
from blobhouse.layout import STORED_DIR, store_dir, stored_folder_name, stored_record_name
from blobhouse.store.index_part import INDEX_SCHEMA
from blobhouse.store.packs import StoredPayload

#: records of one write up to this size in all are read once per commit, kept in memory
KEPT_RECORD_BYTES = 16 << 20

RECORD_SCHEMA = pa.schema(
    [
        ("blake3", pa.binary(32)),
        ("pack", pa.string()),
        ("position", pa.int64()),
        ("size", pa.int64()),
    ]
)


def records_folder(table_path: str, write_id: str) -> str:
    """Where the records of write ``write_id`` live."""
    return as_uri(f"{store_dir(table_path)}/{STORED_DIR}/{stored_folder_name(write_id)}")


def write_record(
    table_path: str,
    write_id: str,
    stored: Sequence[StoredPayload],
    storage_options: StorageOptions | None = None,
) -> None:
    """Record ``stored`` (what one step of write ``write_id`` put in the store); nothing when
    it stored nothing."""
    if not stored:
        return
    table = pa.table(
        {
            "blake3": pa.array([s.digest for s in stored], pa.binary(32)),
            "pack": [s.pack for s in stored],
            "position": pa.array([s.position for s in stored], pa.int64()),
            "size": pa.array([s.size for s in stored], pa.int64()),
        },
        schema=RECORD_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, RECORD_SCHEMA) as writer:
        writer.write_table(table)
    uri = f"{records_folder(table_path, write_id)}/{stored_record_name()}"
    object_store(uri, storage_options).put(uri, sink.getvalue().to_pybytes())


def read_records(
    table_path: str, write_id: str, storage_options: StorageOptions | None = None
) -> list[StoredPayload]:
    """What write ``write_id`` recorded it stored (none: an empty list)."""
    found: list[StoredPayload] = []
    for batch in recorded_entries(table_path, write_id, storage_options)():
        columns = (batch.column(n).to_pylist() for n in RECORD_SCHEMA.names)
        found += [StoredPayload(*entry) for entry in zip(*columns, strict=True)]
    return found


def recorded_entries(
    table_path: str, write_id: str, storage_options: StorageOptions | None = None
) -> Callable[[], Iterator[pa.RecordBatch]]:
    """What write ``write_id`` recorded it stored, as a function giving batches of the store
    index's schema each time it is called, one record at a time in memory (a write's tasks may
    have stored many millions). The records are listed once, at the first call (a commit
    reads them when every task that records has ended), and read once when they hold at most
    :data:`KEPT_RECORD_BYTES` in all (a commit reads them twice: into the index, then for the
    payloads a concurrent write stored too), else once per call."""
    folder = records_folder(table_path, write_id)
    listing: list[tuple[str, int]] | None = None
    kept: dict[str, bytes] = {}

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal listing
        if listing is None:
            try:
                listed = object_store(folder, storage_options).list(folder)
                listing = [(f"{folder}/{info.name}", info.size) for info in listed]
            except FileNotFoundError:
                listing = []
        keep = sum(size for _, size in listing) <= KEPT_RECORD_BYTES
        for uri, size in listing:
            raw = kept.get(uri) or read_object(uri, storage_options, size=size)
            if keep:
                kept[uri] = raw
            reader = pa.ipc.open_file(pa.py_buffer(raw))
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                yield pa.record_batch(
                    [batch.column(0).cast(pa.binary()), *batch.columns[1:]], schema=INDEX_SCHEMA
                )

    return batches


def remove_records(
    table_path: str, write_id: str, storage_options: StorageOptions | None = None
) -> None:
    """Remove the records of a write that committed or aborted (best effort: gc removes what
    is left)."""
    remove_folder(records_folder(table_path, write_id), storage_options)
