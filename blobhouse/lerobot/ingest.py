"""Import a LeRobot dataset into one blobhouse table, each video file stored once.

The naive way -- every frame row carrying its video file's bytes -- would hand the writer a
200 MB file once per frame. Instead the import stores each distinct video file in the table's
content-addressed store first (hashed as it is read; one already in the store is referenced,
not stored again), then writes the frame rows with each camera column a reference into the
store (``data, uri, position, size``), which the write keeps as a reference. Both happen under
one transaction: a failed or interrupted import removes the packs it wrote and commits nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from blobhouse.commit.transaction import Transaction, record_stored
from blobhouse.dedup import content_hash
from blobhouse.errors import InvalidInputError, TableExistsError, cleanup_after
from blobhouse.layout import TableLocation
from blobhouse.lerobot.layout import ChunkRef, LeRobotSource, column_name
from blobhouse.options import WriteOptions
from blobhouse.placement import Placement
from blobhouse.snapshot import open_dataset
from blobhouse.storage import checked_options
from blobhouse.store.packs import store_uri_prefix
from blobhouse.store.writer import StoreWriter
from blobhouse.table import Table
from blobhouse.write.table_write import begin_write

ImportMode = Literal["create", "append", "overwrite"]
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LeRobotImport:
    """What :func:`ingest_lerobot` did: the table (at its new version) and what went in."""

    table: Table
    frames: int
    episodes: int
    cameras: tuple[str, ...]  # the table's video columns
    video_files: int
    video_bytes: int  # of the distinct video files read


def ingest_lerobot(
    dataset: str | os.PathLike,
    table: str,
    *,
    mode: ImportMode = "create",
    storage_options: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> LeRobotImport:
    """Import the LeRobot v3 dataset in folder ``dataset`` into the table at ``table``: one
    row per frame with the frame's columns (dots in names become underscores), ``task`` (the
    task's text), and per camera a blob column referencing its video file (each file stored
    once) plus ``<camera>_timestamp``, the frame's time in that file. The dataset is checked
    first; nothing is written unless it is whole. ``progress(step, done, total)`` hears of the
    video files stored and the frames written.

    >>> import tempfile
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> done = ingest_lerobot(root, tempfile.mkdtemp() + "/robot")
    >>> done.frames, done.cameras, done.table.count_rows()
    (8, ('observation_images_cam',), 8)
    """
    if mode not in ("create", "append", "overwrite"):
        raise InvalidInputError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
    source = LeRobotSource.read(dataset)
    storage_options = checked_options(storage_options)
    location = TableLocation.of(table, None, storage_options)
    exists = open_dataset(location, None, storage_options, doing="import into") is not None
    if exists and mode == "create":  # before any video file is stored
        raise TableExistsError(f"table {table} already exists (use mode='append' or 'overwrite')")
    cameras = tuple(column_name(k) for k in source.video_keys)
    txn = Transaction.start(location, None, storage_options, kind="write")
    with txn.lease():
        store = StoreWriter(
            location.root,
            0,
            txn.name_prefix,
            Placement().pack_file_size_threshold,
            storage_options,
            load_index=exists,
        )
        try:
            chunks = _store_videos(source, store, store_uri_prefix(location.root), progress)
            store.finish()
            write = begin_write(
                table,
                _schema(source, chunks),
                WriteOptions(
                    blob_columns=cameras + tuple(column_name(k) for k in source.image_keys),
                    dedup=dict.fromkeys(cameras, "global") or None,
                ),
                mode=mode,
                storage_options=storage_options,
                batches=_counted(source.frame_batches(chunks), source.frames, progress),
                load_store_index=False,
                write_id=txn.id,
            )
            snapshot = write.run().snapshot
        except BaseException as exc:
            cleanup_after(exc, store.abort, txn.abort)
            raise
    record_stored(location.root, store.packs.stored, storage_options)
    return LeRobotImport(
        Table(snapshot),
        source.frames,
        len(source.episodes),
        cameras,
        len(source.videos),
        source.video_bytes(),
    )


def _store_videos(
    source: LeRobotSource,
    store: StoreWriter,
    prefix: str,
    progress: Progress | None,
) -> dict[tuple[str, int, int], ChunkRef]:
    """Each video file in the store (once; one the store holds already is referenced)."""
    chunks = {}
    for done, video in enumerate(source.videos):
        if progress is not None:
            progress("video files", done, len(source.videos))
        data = video.path.read_bytes()
        reference = store.place(data, content_hash(data))
        chunks[(video.key, video.chunk, video.file)] = ChunkRef(
            prefix + str(reference.uri), reference.position, reference.size
        )
        del data
    if progress is not None:
        progress("video files", len(source.videos), len(source.videos))
    return chunks


def _counted(
    batches: Iterator[pa.RecordBatch], total: int, progress: Progress | None
) -> Iterator[pa.RecordBatch]:
    done = 0
    for batch in batches:
        if progress is not None:
            progress("frames", done, total)
        done += batch.num_rows
        yield batch
    if progress is not None:
        progress("frames", done, total)


def _schema(source: LeRobotSource, chunks: dict[tuple[str, int, int], ChunkRef]) -> pa.Schema:
    """The rows' schema: the first batch's (every data file has the same columns)."""
    return next(source.frame_batches(chunks)).schema  # LeRobotSource.read found frames
