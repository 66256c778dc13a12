"""A table imported from LeRobot written back as a LeRobot v3.0 dataset folder, for LeRobot's own
tools (its ``LeRobotDataset``, visualization, the Hub).

The video files come out byte for byte as they were imported (each stored once, read once and
checked against its hash); the frame rows, tasks, episodes, stats and ``meta/info.json`` are
written from the table and the metadata its import kept (:mod:`blobhouse.lerobot.meta`).
Frames and episodes are numbered from 0 in table order, as LeRobot needs (``index`` is a
frame's place in the dataset, ``episode_index`` an episode's): the numbers they had unless
rows were deleted. The folder appears whole or not at all: it is written beside its place
and renamed into it at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blobhouse.errors import InvalidInputError, LeRobotDatasetError, cleanup_after
from blobhouse.lerobot.info import DatasetInfo, dataset_info, tasks_frame
from blobhouse.progress import ProgressCallback, progress_to
from blobhouse.table import Table

CHUNK_SIZE = 1000  # files per chunk folder (LeRobot's default)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
#: frames per data file at most (a file holds whole episodes, so one may hold more)
FILE_FRAMES = 500_000
_READ_ROWS = 4096


@dataclass(frozen=True)
class LeRobotExport:
    """What an export wrote."""

    folder: Path
    frames: int
    episodes: int
    video_files: int
    data_files: int


def export_lerobot(
    table: Table, folder: str | os.PathLike, progress: ProgressCallback | None = None
) -> LeRobotExport:
    """Write ``table`` (imported from a LeRobot dataset) as a LeRobot v3.0 dataset in
    ``folder`` (made; refused if it holds anything), which ``lerobot``'s ``LeRobotDataset``
    loads: each video file as it was imported, byte for byte. ``progress``
    (:mod:`blobhouse.progress`) hears of the video files (their bytes) and frames written.

    >>> import tempfile
    >>> from blobhouse.lerobot import ingest_lerobot
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> table = ingest_lerobot(root, tempfile.mkdtemp() + "/robot").table
    >>> done = export_lerobot(table, tempfile.mkdtemp() + "/back")
    >>> done.frames, done.episodes, sorted(p.name for p in (done.folder / "meta").iterdir())
    (8, 2, ['episodes', 'info.json', 'stats.json', 'tasks.parquet'])
    """
    info = dataset_info(table)
    if info is None:
        raise LeRobotDatasetError(
            f"table {table.uri} holds no LeRobot dataset's metadata: only a table imported "
            "with blobhouse.lerobot.ingest_lerobot can be exported"
        )
    target = _empty_target(folder)
    partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:12]}")
    try:
        partial.mkdir(parents=True)
        done = _Export(table, info, partial, progress).run()
        partial.rename(target)
    except BaseException as exc:
        cleanup_after(exc, lambda: shutil.rmtree(partial, ignore_errors=True))
        raise
    return LeRobotExport(
        target, done.frames, done.episodes_written, done.video_files, done.data_files
    )


def _empty_target(folder: str | os.PathLike) -> Path:
    if not isinstance(folder, str | os.PathLike):
        raise InvalidInputError(f"the export's folder must be a path, got {folder!r}")
    target = Path(folder)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InvalidInputError(
            f"{target} exists and is not an empty folder: export into a new one"
        )
    if target.exists():
        target.rmdir()  # made again by the rename
    return target


class _Export:
    """One export into ``root`` (a folder of its own until it is whole)."""

    def __init__(
        self, table: Table, info: DatasetInfo, root: Path, progress: ProgressCallback | None
    ):
        self.table, self.info, self.root = table, info, root
        self.progress = progress_to(progress)
        self.meta = info.meta
        self.episodes = info.episodes
        self.ids = table.row_ids()
        self.schema = self._schema()  # of the data files
        self.frames = 0
        self.episodes_written = 0
        self.video_files = 0
        self.data_files = 0

    def run(self) -> _Export:
        videos = {key: self._videos(key) for key in self.meta.video_keys}
        data = self._data()
        self._episodes(data, videos)
        self._meta_files()
        return self

    def _tell(self, step: str, done: int, total: int, **amounts: int) -> None:
        if self.progress is not None:
            self.progress(step, done, total, **amounts)

    def _videos(self, key: str) -> list[tuple[int, int]]:
        """Each distinct video file of camera ``key`` written once, numbered in the order the
        episodes first use them; each episode's (chunk, file)."""
        column = self.meta.columns[key]
        starts = self.ids[self.episodes.start]
        refs = self.table.take_rows(starts, [column], blobs="refs").column(column).to_pylist()
        numbers: dict[bytes, int] = {}
        written = 0
        for n, ref in enumerate(refs):
            if ref["blake3"] in numbers:
                continue
            number = numbers[ref["blake3"]] = len(numbers)
            path = self._path(VIDEO_PATH, number, video_key=key)
            row = self.table.take_rows(starts[n : n + 1], [column], blobs="bytes")
            written += path.write_bytes(row.column(column)[0].as_py())  # checked: its hash
            self.video_files += 1
            self._tell(f"video files of {key}", len(numbers), len(refs), bytes=written)
        return [divmod(numbers[ref["blake3"]], CHUNK_SIZE) for ref in refs]

    def _path(self, template: str, number: int, **fields: str) -> Path:
        chunk, file = divmod(number, CHUNK_SIZE)
        path = self.root / template.format(chunk_index=chunk, file_index=file, **fields)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _data(self) -> list[tuple[int, int]]:
        """The frame rows, whole episodes per data file; each episode's (chunk, file)."""
        where = []
        writer, number, rows_in_file = None, -1, 0
        total = int(self.episodes.length.sum())
        try:
            for episode in range(len(self.episodes)):
                if writer is None or rows_in_file >= FILE_FRAMES:
                    if writer is not None:
                        writer.close()
                    number += 1
                    writer = pq.ParquetWriter(self._path(DATA_PATH, number), self.schema)
                    self.data_files += 1
                    rows_in_file = 0
                start, stop = int(self.episodes.start[episode]), int(self.episodes.stop[episode])
                for first in range(start, stop, _READ_ROWS):
                    writer.write_table(self._rows(episode, first, min(first + _READ_ROWS, stop)))
                rows_in_file += stop - start
                self.frames += stop - start
                self._tell("frames", self.frames, total, rows=self.frames)
                where.append(divmod(number, CHUNK_SIZE))
        finally:
            if writer is not None:
                writer.close()
        return where

    def _value_keys(self) -> list[str]:
        return [k for k, f in self.meta.features.items() if f["dtype"] != "video"]

    def _schema(self) -> pa.Schema:
        fields = []
        for key in self._value_keys():
            feature = self.meta.features[key]
            if feature["dtype"] == "image":
                kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            else:
                kind = _arrow_type(feature)
            fields.append(pa.field(key, kind))
        return pa.schema(fields)

    def _rows(self, episode: int, start: int, stop: int) -> pa.Table:
        """Frames ``start`` to ``stop`` (table positions) of ``episode`` as LeRobot's rows:
        its feature names, ``index`` the frame's position, ``episode_index`` the episode's."""
        keys = self._value_keys()
        columns = [self.meta.columns[k] for k in keys]
        taken = self.table.take_rows(self.ids[start:stop], columns, blobs="bytes")
        schema = self.schema
        arrays = []
        for key, column, field in zip(keys, columns, schema, strict=True):
            values = taken.column(column).combine_chunks()
            if key == "index":
                values = pa.array(np.arange(start, stop), field.type)
            elif key == "episode_index":
                values = pa.array(np.full(stop - start, episode), field.type)
            elif self.meta.features[key]["dtype"] == "image":
                values = pa.StructArray.from_arrays(
                    [values.cast(pa.binary()), pa.nulls(len(values), pa.string())],
                    names=["bytes", "path"],
                )
            else:
                values = values.cast(field.type)
            arrays.append(values)
        return pa.Table.from_arrays(arrays, schema=schema)

    def _episodes(
        self, data: list[tuple[int, int]], videos: dict[str, list[tuple[int, int]]]
    ) -> None:
        bounds = self.episodes
        columns: dict[str, pa.Array] = {
            "episode_index": pa.array(np.arange(len(bounds)), pa.int64()),
            "tasks": pa.array(bounds.tasks, pa.list_(pa.string())),
            "length": pa.array(bounds.length, pa.int64()),
            "data/chunk_index": pa.array([c for c, _ in data], pa.int64()),
            "data/file_index": pa.array([f for _, f in data], pa.int64()),
            "dataset_from_index": pa.array(bounds.start, pa.int64()),
            "dataset_to_index": pa.array(bounds.stop, pa.int64()),
        }
        for key, files in videos.items():
            columns[f"videos/{key}/chunk_index"] = pa.array([c for c, _ in files], pa.int64())
            columns[f"videos/{key}/file_index"] = pa.array([f for _, f in files], pa.int64())
            columns[f"videos/{key}/from_timestamp"] = pa.array(bounds.from_timestamp[key])
            columns[f"videos/{key}/to_timestamp"] = pa.array(bounds.to_timestamp[key])
        columns["meta/episodes/chunk_index"] = pa.array(np.zeros(len(bounds), np.int64))
        columns["meta/episodes/file_index"] = pa.array(np.zeros(len(bounds), np.int64))
        path = self.root / EPISODES_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path)
        self.episodes_written = len(bounds)

    def _meta_files(self) -> None:
        meta = self.meta
        tasks_frame(meta.tasks).to_parquet(self.root / "meta/tasks.parquet")
        (self.root / "meta/stats.json").write_text(json.dumps(meta.stats, indent=4))
        info = {
            "codebase_version": meta.codebase_version,
            "robot_type": meta.robot_type,
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": len(meta.tasks),
            "chunks_size": CHUNK_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": meta.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if meta.video_keys else None,
            "features": meta.features,
        }
        (self.root / "meta/info.json").write_text(json.dumps(info, indent=4))


_ARROW = {
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
    "string": pa.string(),
}


def _arrow_type(feature: dict) -> pa.DataType:
    """The Arrow type LeRobot's Hugging Face features give a feature (``shape`` (1,): a
    value; one dimension: a fixed-size list; more: nested fixed-size lists)."""
    kind = _ARROW.get(feature["dtype"])
    if kind is None:
        raise LeRobotDatasetError(f"a feature of dtype {feature['dtype']!r} cannot be exported")
    shape = list(feature["shape"])
    if shape == [1]:
        return kind
    for size in reversed(shape):
        kind = pa.list_(kind, size)
    return kind
