"""Import a LeRobot dataset into one blobhouse table, each video file stored once.

The naive way -- every frame row carrying its video file's bytes -- would hand the writer a
200 MB file once per frame. Instead the import stores each distinct video file in the table's
content-addressed store first (hashed as it is read; one already in the store is referenced,
not stored again), then writes the frame rows with each camera column a reference into the
store (``data, uri, position, size``), which the write keeps as a reference. Both happen under
one transaction: a failed or interrupted import removes the packs it wrote and commits nothing.

:func:`ingest_lerobot` does both steps in this process; ``blobhouse.spark.ingest_lerobot`` runs
the same :class:`ImportPlan` in Spark tasks (video files, then data files, spread over them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.commit import leases
from blobhouse.commit.transaction import Transaction
from blobhouse.dedup import content_hash
from blobhouse.errors import (
    InvalidInputError,
    LeRobotDatasetError,
    TableExistsError,
    cleanup_after,
)
from blobhouse.io.objects import StorageOptions, checked_options
from blobhouse.layout import TableLocation
from blobhouse.lerobot.meta import (
    LeRobotMeta,
    Renumbering,
    append_meta,
    source_meta,
    table_meta,
    with_meta,
)
from blobhouse.lerobot.source import ChunkRef, LeRobotSource, VideoFile, column_name
from blobhouse.lerobot.stats import computed_stats
from blobhouse.options import WriteOptions
from blobhouse.placement import Placement
from blobhouse.progress import ProgressCallback, progress_to
from blobhouse.snapshot import TableSnapshot, open_dataset, open_snapshot
from blobhouse.store.packs import StoredPayload, store_uri_prefix
from blobhouse.store.writer import StoreWriter
from blobhouse.table import Table
from blobhouse.write.store_first import BeginRows, run_store_first
from blobhouse.write.table_write import WriteAttempt

ImportMode = Literal["create", "append", "overwrite"]
ChunkKey = tuple[str, int, int]  # camera, chunk, file


@dataclass(frozen=True)
class LeRobotImport:
    """What an import did: the table (at its new version) and what went in."""

    table: Table
    frames: int
    episodes: int
    cameras: tuple[str, ...]  # the table's video columns
    video_files: int
    video_bytes: int  # of the distinct video files read


@dataclass(frozen=True)
class StoredVideos:
    """Video files in the store: where each is (``chunks``), and the payloads written anew
    (``stored``, for the store's index once the rows commit)."""

    chunks: dict[ChunkKey, ChunkRef]
    stored: tuple[StoredPayload, ...]

    @classmethod
    def merged(cls, parts: Iterable[StoredVideos]) -> StoredVideos:
        chunks: dict[ChunkKey, ChunkRef] = {}
        stored: list[StoredPayload] = []
        for part in parts:
            chunks.update(part.chunks)
            stored += part.stored
        return cls(chunks, tuple(stored))


@dataclass(frozen=True)
class ImportPlan:
    """One import, checked and planned where it starts: the dataset, the table and the
    transaction's name prefix (the packs and data files it stages). It pickles, so Spark
    tasks run :meth:`store` and :meth:`frame_batches` on parts of it."""

    source: LeRobotSource
    location: TableLocation
    storage_options: StorageOptions | None
    name_prefix: str
    table_exists: bool
    mode: ImportMode
    meta: LeRobotMeta  # the dataset's, recorded with the rows (merged with the table's)
    renumbering: Renumbering | None = None  # an append's, to the table's numbering

    def frame_batches(
        self, chunks: dict[ChunkKey, ChunkRef], files: Sequence[Path] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The rows of the frames of ``files`` (default: all), numbered for the table."""
        return self.source.frame_batches(chunks, files, self.renumbering)

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(column_name(k) for k in self.source.video_keys)

    def write_options(self) -> WriteOptions:
        images = tuple(column_name(k) for k in self.source.image_keys)
        return WriteOptions(
            blob_columns=self.cameras + images,
            dedup=dict.fromkeys(self.cameras, "global") or None,
        )

    def store(
        self, videos: Sequence[VideoFile], progress: ProgressCallback | None = None
    ) -> StoredVideos:
        """Each of ``videos`` in the store, once (one the store holds already is referenced),
        under the transaction's lease; on failure what it wrote is removed."""
        root = self.location.root
        prefix = store_uri_prefix(root)
        report = progress_to(progress)
        stored = 0
        with leases.held(root, self.name_prefix, self.storage_options):
            store = StoreWriter(
                root,
                0,
                self.name_prefix,
                Placement().pack_file_size_threshold,
                self.storage_options,
                load_index=self.table_exists,
            )
            try:
                chunks = {}
                for done, video in enumerate(videos):
                    if report is not None:
                        report("video files", done, len(videos), bytes=stored)
                    data = video.path.read_bytes()
                    stored += len(data)
                    reference = store.place(data, content_hash(data))
                    del data
                    chunks[(video.key, video.chunk, video.file)] = ChunkRef(
                        prefix + str(reference.uri), reference.position, reference.size
                    )
                store.finish()
            except BaseException as exc:
                cleanup_after(exc, store.abort)
                raise
        if report is not None:
            report("video files", len(videos), len(videos), bytes=stored)
        return StoredVideos(chunks, tuple(store.packs.stored))

    def begin_write(
        self, stored: StoredVideos, mode: str, begin: BeginRows, **how: Any
    ) -> WriteAttempt:
        """The write of the frame rows (``how``: its batches here, or ``in_tasks``) begun with
        ``begin`` (:func:`~blobhouse.write.store_first.run_store_first`'s: under the import's
        transaction), its camera columns references into the store already."""
        return begin(
            self._schema(stored.chunks),
            self.write_options(),
            mode=mode,
            # image features are payloads of the rows: looked up in the store, so that a
            # dataset imported again (or sharing images) stores each of them once
            load_store_index=bool(self.source.image_keys),
            **how,
        )

    def _schema(self, chunks: dict[ChunkKey, ChunkRef]) -> pa.Schema:
        """The rows' schema: the first batch's (every data file has the same columns), with
        the dataset's meta when the import makes the table (an append records it after)."""
        schema = next(self.frame_batches(chunks)).schema  # read() found frames
        appending = self.mode == "append" and self.table_exists
        return schema if appending else with_meta(schema, self.meta)

    def store_step(
        self, store: Callable[[], StoredVideos]
    ) -> Callable[[], tuple[StoredVideos, tuple[StoredPayload, ...]]]:
        """``store`` as a store-first write's first step: the videos and what was stored anew
        (the rows' commit records it in the store's index)."""

        def step() -> tuple[StoredVideos, tuple[StoredPayload, ...]]:
            stored = store()
            return stored, stored.stored

        return step

    def finished(self, snapshot: TableSnapshot) -> LeRobotImport:
        """What the import did, once its rows committed (an append's meta recorded then)."""
        # a table this import made is version 1 and holds the meta already; one another
        # writer made meanwhile took the rows as an append
        if self.mode == "append" and (self.table_exists or snapshot.version > 1):
            snapshot = append_meta(snapshot, self.meta, str(self.location))
        return LeRobotImport(
            Table(snapshot),
            self.source.frames,
            len(self.source.episodes),
            self.cameras,
            len(self.source.videos),
            self.source.video_bytes(),
        )


def plan_import(
    dataset: str | os.PathLike,
    table: str,
    mode: str,
    storage_options: dict[str, str] | None,
    again: bool = False,
) -> tuple[ImportPlan, Transaction]:
    """Check the dataset and the target, and start the import's transaction."""
    if mode not in ("create", "append", "overwrite"):
        raise InvalidInputError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
    if not isinstance(again, bool):
        raise InvalidInputError(f"again must be True or False, got {again!r}")
    storage_options = checked_options(storage_options)
    source = LeRobotSource.read(dataset, storage_options)
    location = TableLocation.of(table, None, storage_options)
    exists = open_dataset(location, None, storage_options, doing="import into") is not None
    if exists and mode == "create":  # before any video file is stored
        raise TableExistsError(f"table {table} already exists (use mode='append' or 'overwrite')")
    meta = source_meta(source.root, source.info, source.tasks, source.frames)
    plan = ImportPlan(source, location, storage_options, "", exists, mode, meta)
    renumbering = None
    if exists and mode == "append":
        snapshot = open_snapshot(location, None, storage_options)
        _check_blob_columns(plan, snapshot, table)
        renumbering = _append_numbering(plan, snapshot, table, again)
    # computed once the append is known to go ahead: camera stats decode frames
    missing = [key for key in source.info["features"] if key not in meta.stats]
    meta = replace(meta, stats={**meta.stats, **computed_stats(source, missing)})
    if renumbering is not None:
        meta = meta.renumbered(renumbering)
    plan = replace(plan, meta=meta, renumbering=renumbering)
    txn = Transaction.start(location, None, storage_options, kind="write")
    return replace(plan, name_prefix=txn.name_prefix), txn


def _append_numbering(
    plan: ImportPlan, snapshot: TableSnapshot, where: str, again: bool
) -> Renumbering | None:
    """How ``plan``'s dataset is numbered appended to ``snapshot``'s (after its frames,
    episodes and tasks), once checked against the table's meta (the same fps and features;
    not a dataset the table holds already, unless ``again``); all before a video file is
    stored. None: the table keeps no meta (imported before it was kept)."""
    kept = table_meta(snapshot.dataset)
    if kept is None:
        return None
    fingerprint = plan.meta.sources[0]
    if fingerprint in kept.sources and not again:
        raise LeRobotDatasetError(
            f"the dataset {plan.source.root} is in the table {where} already (imported "
            "before): importing it again would repeat its episodes (as new ones); pass "
            "again=True (--again) if that is what you want"
        )
    next_index, next_episode = _next_numbers(snapshot)
    renumbering = Renumbering.after(kept, next_index, next_episode, plan.source.tasks)
    kept.merged(plan.meta.renumbered(renumbering), where)  # the same fps and features
    return renumbering


def _next_numbers(snapshot: TableSnapshot) -> tuple[int, int]:
    """The ``index`` and ``episode_index`` after the table's largest (a scan of the two)."""
    largest = [-1, -1]
    for batch in snapshot.dataset.to_batches(columns=["index", "episode_index"]):
        for n, column in enumerate(batch.columns):
            if len(column):
                largest[n] = max(largest[n], pc.max(column).as_py())
    return largest[0] + 1, largest[1] + 1


def _check_blob_columns(plan: ImportPlan, table: TableSnapshot, where: str) -> None:
    """Refuse, before a video file is stored, an append whose cameras or image features the
    table has no blob column for (another dataset's cameras)."""
    keys = [*plan.source.video_keys, *plan.source.image_keys]
    for key, column in zip(keys, plan.write_options().blob_columns, strict=True):
        if column not in table.blob_columns:
            what = "camera" if key in plan.source.video_keys else "image feature"
            raise LeRobotDatasetError(
                f"the dataset's {what} {key!r} (column {column!r}) is not a blob column of the "
                f"table {where} (its blob columns: {', '.join(table.blob_columns) or 'none'}): "
                "append datasets with the same cameras, or import this one into a table of its "
                "own"
            )


def ingest_lerobot(
    dataset: str | os.PathLike,
    table: str,
    *,
    mode: ImportMode = "create",
    storage_options: dict[str, str] | None = None,
    progress: ProgressCallback | None = None,
    again: bool = False,
) -> LeRobotImport:
    """Import the LeRobot v3 dataset in folder ``dataset`` into the table at ``table``: one
    row per frame with the frame's columns (dots in names become underscores), ``task`` (the
    task's text), and per camera a blob column referencing its video file (each file stored
    once) plus ``<camera>_timestamp``, the frame's time in that file. The dataset is checked
    first (its names, values and video files: :meth:`LeRobotSource.read`); nothing is written
    unless it is whole, and nothing of it is lost (two names that would become one column
    are refused). ``progress`` (:mod:`blobhouse.progress`) hears of the video files stored
    (their bytes) and the frames written. The dataset's metadata is kept with the table
    (:func:`dataset_info`).

    ``mode="append"`` adds a dataset as LeRobot's merge does: the same fps and features
    (another is refused naming the feature), its ``index`` and ``episode_index`` numbered
    after the table's, its tasks under the table's ``task_index`` for their text, its stats
    aggregated with the table's. A dataset the table holds already is refused unless
    ``again`` (its episodes would be repeated as new ones).

    >>> import tempfile
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> done = ingest_lerobot(root, tempfile.mkdtemp() + "/robot")
    >>> done.frames, done.cameras, done.table.count_rows()
    (8, ('observation_images_cam',), 8)
    """
    plan, txn = plan_import(dataset, table, mode, storage_options, again)

    def write_rows(stored: StoredVideos, begin: BeginRows) -> TableSnapshot:
        frames = _counted(plan.frame_batches(stored.chunks), plan.source.frames, progress)
        return plan.begin_write(stored, mode, begin, batches=frames).run().snapshot

    store = plan.store_step(lambda: plan.store(plan.source.videos, progress))
    _, snapshot = run_store_first(txn, store, write_rows)
    return plan.finished(snapshot)


def _counted(
    batches: Iterator[pa.RecordBatch], total: int, progress: ProgressCallback | None
) -> Iterator[pa.RecordBatch]:
    report = progress_to(progress)
    done = 0
    for batch in batches:
        if report is not None:
            report("frames", done, total, rows=done)
        done += batch.num_rows
        yield batch
    if report is not None:
        report("frames", done, total, rows=done)
