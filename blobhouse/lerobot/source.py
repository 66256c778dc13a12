"""A LeRobot dataset on disk (its v3.0 layout), read and checked before anything is written.

LeRobot (Hugging Face's robot-learning library) keeps a dataset as:

- ``meta/info.json``: ``codebase_version`` ("v3.0"), ``fps``, ``features`` (name -> ``dtype``,
  ``shape``; cameras have ``dtype`` "video"), and the path templates ``data_path`` and
  ``video_path``;
- ``meta/tasks.parquet``: the task strings (the index) and their ``task_index``;
- ``meta/episodes/chunk-XXX/file-XXX.parquet``: one row per episode: ``episode_index``,
  ``length``, where its frames are (``data/chunk_index``, ``data/file_index``) and, per camera
  ``K``, which video file holds it (``videos/K/chunk_index``, ``videos/K/file_index``) and where
  its segment starts in it (``videos/K/from_timestamp``, seconds);
- ``data/chunk-XXX/file-XXX.parquet``: one row per frame: ``index``, ``episode_index``,
  ``frame_index``, ``timestamp`` (seconds from the episode's start), ``task_index`` and the
  state, action and other features;
- ``videos/K/chunk-XXX/file-XXX.mp4``: the camera's frames, several episodes back to back.

A frame of camera ``K`` is at ``from_timestamp + timestamp`` in its video file: what
:class:`LeRobotSource` gives each row (the column ``<K>_timestamp``).

:meth:`LeRobotSource.read` checks all of it before an import writes anything: the layout and
its fields here, the values (:mod:`blobhouse.lerobot.checks`) and the video files
(:mod:`blobhouse.lerobot.videos`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from blobhouse.errors import LeRobotDatasetError
from blobhouse.lerobot.checks import (
    FRAME_COLUMNS,
    FRAME_INTEGERS,
    FrameScan,
    check_kinds,
    check_names,
    check_range,
    column_name,
    episode_rows,
    positive_number,
    task_texts,
)
from blobhouse.lerobot.folder import DatasetPath, dataset_path, readable
from blobhouse.lerobot.meta import Renumbering
from blobhouse.lerobot.videos import Segment, VideoCheck
from blobhouse.read.video import TIMESTAMP_SUFFIX

INFO = "meta/info.json"
TASKS = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index")
VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp")
#: frame rows handed to the writer at once
BATCH_ROWS = 8192


@dataclass(frozen=True)
class VideoFile:
    """One MP4 of a camera: ``videos/<key>/chunk-<chunk>/file-<file>.mp4``."""

    key: str
    chunk: int
    file: int
    path: DatasetPath


@dataclass(frozen=True)
class LeRobotSource:
    """A checked LeRobot v3 dataset: :meth:`read` checks it, :meth:`frame_batches` yields its
    frame rows with each camera's video file and timestamp in it.

    >>> import tempfile
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> source = LeRobotSource.read(root)
    >>> source.fps, source.video_keys, source.frames
    (30.0, ('observation.images.cam',), 8)
    """

    root: DatasetPath
    info: Mapping[str, Any]
    fps: float
    video_keys: tuple[str, ...]
    image_keys: tuple[str, ...]
    episodes: pa.Table  # sorted by episode_index
    tasks: Mapping[int, str]
    data_files: tuple[DatasetPath, ...]
    videos: tuple[VideoFile, ...]

    @classmethod
    def read(
        cls, root: str | os.PathLike, storage_options: Mapping[str, str] | None = None
    ) -> LeRobotSource:
        """Check the dataset at ``root`` (a folder, or an object-store URI read with
        ``storage_options``): every file, field and value the import needs, and every video
        file against the episodes that use it, naming the file and field of the first problem
        (:class:`~blobhouse.errors.LeRobotDatasetError`)."""
        root = dataset_path(root, storage_options)
        if not root.is_dir():
            raise LeRobotDatasetError(
                f"{root} is not a folder: a LeRobot dataset is a folder with meta/, data/ "
                "and videos/"
            )
        info = _info(root)
        features = info["features"]
        video_keys = tuple(k for k, f in features.items() if f["dtype"] == "video")
        image_keys = tuple(k for k, f in features.items() if f["dtype"] == "image")
        episodes = _episodes(root, video_keys)
        data_files = tuple(
            _template_path(root, info, "data_path", chunk_index=c, file_index=f)
            for c, f in _pairs(episodes, "data")
        )
        videos = tuple(
            VideoFile(
                k,
                c,
                f,
                _template_path(root, info, "video_path", video_key=k, chunk_index=c, file_index=f),
            )
            for k in video_keys
            for c, f in _pairs(episodes, f"videos/{k}")
        )
        for path in (*data_files, *(v.path for v in videos)):
            if not path.is_file():
                raise LeRobotDatasetError(
                    f"{path} is missing: {root / EPISODES_DIR} names it for an episode"
                )
        _check_frame_count(root, data_files, episodes)
        schema = _data_schema(data_files, image_keys)
        _check_all_names(root, features, video_keys, schema, data_files[0])
        source = cls(
            root,
            info,
            float(info["fps"]),
            video_keys,
            image_keys,
            episodes,
            _tasks(root),
            data_files,
            videos,
        )
        source._check_values_and_videos(schema)
        return source

    def _check_values_and_videos(self, schema: pa.Schema) -> None:
        """Every frame row's fields, then every video file against the episodes using it."""
        scan = FrameScan(self.episodes["episode_index"].to_numpy(), self.tasks)
        for path in self.data_files:
            scan.scan(path, schema)
        scan.check_lengths(
            self.episodes["length"].to_numpy(), self.root / "data", self.root / EPISODES_DIR
        )
        for video in self.videos:
            VideoCheck(video.path, video.key, self.fps, _declared_size(self.info, video.key)).check(
                self._segments(video, scan)
            )

    def _segments(self, video: VideoFile, scan: FrameScan) -> list[Segment]:
        """The frames each episode in ``video`` needs of it."""
        prefix = f"videos/{video.key}"
        held = (_ints(self.episodes, f"{prefix}/chunk_index") == video.chunk) & (
            _ints(self.episodes, f"{prefix}/file_index") == video.file
        )
        start = self.episodes[f"{prefix}/from_timestamp"].to_numpy().astype(np.float64)
        return [
            Segment(int(e), float(start[i] + scan.first[i]), float(start[i] + scan.last[i]))
            for i, e in zip(
                np.flatnonzero(held), self.episodes["episode_index"].to_numpy()[held], strict=True
            )
        ]

    @property
    def frames(self) -> int:
        """Frame rows in all (the sum of the episodes' lengths)."""
        return int(pc.sum(self.episodes["length"]).as_py() or 0)

    def video_bytes(self) -> int:
        return sum(v.path.stat().st_size for v in self.videos)

    def frame_batches(
        self,
        chunks: Mapping[tuple[str, int, int], ChunkRef],
        files: Sequence[DatasetPath] | None = None,
        renumbering: Renumbering | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Each data file's frame rows (of ``files``, by default all), renamed
        (:func:`column_name`), with ``task`` (the task's text) and per camera a reference to
        its video file (``chunks``, keyed by camera, chunk and file) and
        ``<camera>_timestamp``, the frame's time in that file; ``index``, ``episode_index``
        and ``task_index`` renumbered as ``renumbering`` says (an append's). :meth:`read`
        checked them."""
        for path in self.data_files if files is None else files:
            batches = _parquet(path).iter_batches(BATCH_ROWS)
            while True:
                try:
                    batch = next(batches, None)
                except (OSError, pa.ArrowException) as error:  # a damaged page
                    raise LeRobotDatasetError(f"{path} cannot be read: {error}") from None
                if batch is None:
                    break
                rows = self._frame_rows(batch, path, chunks)
                yield rows if renumbering is None else _renumbered(rows, renumbering)

    def _frame_rows(
        self,
        batch: pa.RecordBatch,
        path: DatasetPath,
        chunks: Mapping[tuple[str, int, int], ChunkRef],
    ) -> pa.RecordBatch:
        rows = episode_rows(
            self.episodes["episode_index"].to_numpy(),
            batch.column("episode_index").to_numpy(),
            batch.column("index").to_numpy(),
            path,
        )
        columns: dict[str, pa.Array] = {}
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if name in self.image_keys:  # LeRobot's image feature: struct<bytes, path>
                column = column.field("bytes")
            columns[column_name(name)] = column.cast(_plain_lists(column.type))
        columns["task"] = pa.array(
            [self.tasks[i] for i in batch["task_index"].to_pylist()], pa.string()
        )
        seconds = batch.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        for key in self.video_keys:
            chunk = _ints(self.episodes, f"videos/{key}/chunk_index")[rows]
            file = _ints(self.episodes, f"videos/{key}/file_index")[rows]
            pairs, which = np.unique(np.stack([chunk, file], 1), axis=0, return_inverse=True)
            refs = [chunks[(key, int(c), int(f))] for c, f in pairs]
            columns[column_name(key)] = chunk_references(refs).take(which.reshape(-1))
            start = self.episodes[f"videos/{key}/from_timestamp"].to_numpy()[rows]
            columns[column_name(key) + TIMESTAMP_SUFFIX] = pa.array(
                start.astype(np.float64) + seconds
            )
        return pa.record_batch(columns)


def _renumbered(rows: pa.RecordBatch, renumbering: Renumbering) -> pa.RecordBatch:
    columns = []
    for name, column in zip(rows.schema.names, rows.columns, strict=True):
        if name in ("index", "episode_index", "task_index"):
            values = renumbering.apply(name, column.to_numpy(zero_copy_only=False))
            column = pa.array(values, column.type)
        columns.append(column)
    return pa.record_batch(columns, schema=rows.schema)


@dataclass(frozen=True)
class ChunkRef:
    """Where a video file's bytes are: ``size`` bytes at ``position`` of ``uri``."""

    uri: str
    position: int
    size: int


#: a blob column given as references (``data, uri, position, size``): rows of the table's own
#: store, which the write keeps as references without reading them
REFERENCE_TYPE = pa.struct(
    [
        pa.field("data", pa.large_binary()),
        pa.field("uri", pa.string()),
        pa.field("position", pa.uint64()),
        pa.field("size", pa.uint64()),
    ]
)


def chunk_references(refs: list[ChunkRef]) -> pa.StructArray:
    """Blob values referencing ``refs``, one row each.

    >>> chunk_references([ChunkRef("file:///t/_blobs/packs/a.pack", 0, 9)])[0]["size"]
    <pyarrow.UInt64Scalar: 9>
    """
    return pa.StructArray.from_arrays(
        [
            pa.nulls(len(refs), pa.large_binary()),
            pa.array([r.uri for r in refs], pa.string()),
            pa.array([r.position for r in refs], pa.uint64()),
            pa.array([r.size for r in refs], pa.uint64()),
        ],
        fields=list(REFERENCE_TYPE),
    )


def _plain_lists(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every list's item field named ``item`` (Parquet names it ``element``;
    Lance and a table written before name it ``item``, and a write compares the names).

    >>> _plain_lists(pa.list_(pa.field("element", pa.float32()), 6))
    FixedSizeListType(fixed_size_list<item: float>[6])
    """
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(_plain_lists(kind.value_type), kind.list_size)
    if pa.types.is_list(kind):
        return pa.list_(_plain_lists(kind.value_type))
    if pa.types.is_large_list(kind):
        return pa.large_list(_plain_lists(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_plain_lists(f.type)) for f in kind])
    return kind


def _parquet(path: DatasetPath) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(readable(path))
    except (OSError, pa.ArrowException) as error:
        raise LeRobotDatasetError(f"{path} is not a readable Parquet file: {error}") from None


def _info(root: DatasetPath) -> dict[str, Any]:
    path = root / INFO
    if not path.is_file():
        raise LeRobotDatasetError(f"{path} is missing: {root} is not a LeRobot dataset")
    try:
        info = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise LeRobotDatasetError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(info, dict):
        raise LeRobotDatasetError(f"{path} must hold a JSON object, got {type(info).__name__}")
    version = info.get("codebase_version")
    if not isinstance(version, str) or not version.startswith("v3"):
        raise LeRobotDatasetError(
            f"{path}: codebase_version is {version!r}; blobhouse imports LeRobot's v3 layout "
            "(convert older datasets with LeRobot's convert_dataset_v21_to_v30)"
        )
    fps = info.get("fps")
    if positive_number(fps) is None:
        raise LeRobotDatasetError(f"{path}: fps must be a positive number, got {_shown(fps)}")
    features = info.get("features")
    if not isinstance(features, dict) or not features:
        raise LeRobotDatasetError(
            f"{path}: features must be an object of features, got {features!r}"
        )
    for key, feature in features.items():
        if not isinstance(feature, dict) or not isinstance(feature.get("dtype"), str):
            raise LeRobotDatasetError(f"{path}: features.{key} has no dtype")
        if feature["dtype"] == "video":
            _video_info(path, key, feature)
    for template in ("data_path",) + (("video_path",) if _has_videos(features) else ()):
        if not isinstance(info.get(template), str):
            raise LeRobotDatasetError(
                f"{path}: {template} must be a path template, got {info.get(template)!r}"
            )
    return info


def _shown(value: object) -> str:
    """``value`` for a message, cut short if long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _has_videos(features: Mapping[str, Any]) -> bool:
    return any(f["dtype"] == "video" for f in features.values())


#: where info.json declares a camera's frame size: LeRobot's ``info`` of a video feature
VIDEO_SIZE = ("video.width", "video.height")


def _video_info(path: DatasetPath, key: str, feature: Mapping[str, Any]) -> None:
    """A camera's declared frame size, if declared, is positive integers."""
    info = feature.get("info")
    if info is None:
        return
    if not isinstance(info, dict):
        raise LeRobotDatasetError(
            f"{path}: features.{key}.info must be an object, got {_shown(info)}"
        )
    for name in VIDEO_SIZE:
        value = info.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ):
            raise LeRobotDatasetError(
                f"{path}: features.{key}.info.{name} must be a positive integer, "
                f"got {_shown(value)}"
            )


def _declared_size(info: Mapping[str, Any], key: str) -> tuple[int, int] | None:
    """The frame size (width, height) info.json declares for camera ``key``, if it does."""
    declared = info["features"][key].get("info") or {}
    width, height = (declared.get(name) for name in VIDEO_SIZE)
    return None if width is None or height is None else (width, height)


def _data_schema(data_files: Sequence[DatasetPath], image_keys: Sequence[str]) -> pa.Schema:
    """The frame rows' columns, the same in every data file (read from their footers), with
    LeRobot's frame fields of the right types and images as ``struct<bytes, path>``."""
    first = data_files[0]
    schema = _parquet(first).schema_arrow
    for path in data_files[1:]:
        other = _parquet(path).schema_arrow
        if not other.equals(schema):
            raise LeRobotDatasetError(
                f"{path}: its columns {other.names} differ from those of {first} ({schema.names})"
            )
    for column in FRAME_COLUMNS:
        if column not in schema.names:
            raise LeRobotDatasetError(f"{first} lacks the frame field {column!r}")
    check_kinds(schema, first, FRAME_INTEGERS, ["timestamp"])
    for key in image_keys:
        kind = schema.field(key).type if key in schema.names else None
        if kind is None or not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
            raise LeRobotDatasetError(
                f"{first}: image feature {key!r} must be a column of struct<bytes, path>, "
                f"got {kind}"
            )
    return schema


def _check_all_names(
    root: DatasetPath,
    features: Mapping[str, Any],
    video_keys: Sequence[str],
    schema: pa.Schema,
    first: DatasetPath,
) -> None:
    """Every column the import makes, against every other (:func:`check_names`): the
    features and data columns, then the import's own (``task``, and per camera its video and
    ``<camera>_timestamp`` columns)."""
    twice = sorted({name for name in schema.names if schema.names.count(name) > 1})
    if twice:  # Arrow keeps both, a table only one: the other's values would be lost
        raise LeRobotDatasetError(
            f"data column {twice[0]!r} of {first} is there twice: rename one of them"
        )
    dataset = [(k, f"feature {k!r} of {root / INFO}") for k in features if k not in video_keys]
    dataset += [(name, f"data column {name!r} of {first}") for name in schema.names]
    made = [("task", "each frame's task text")]
    for key in video_keys:
        made.append((column_name(key), f"the video of camera {key!r}"))
        made.append(
            (
                column_name(key) + TIMESTAMP_SUFFIX,
                f"the frame's time in the video file of camera {key!r}",
            )
        )
    check_names(dataset, made)


def _template_path(
    root: DatasetPath, info: Mapping[str, Any], template: str, **fields: Any
) -> DatasetPath:
    try:
        relative = info[template].format(**fields)
    except (KeyError, IndexError, ValueError) as error:
        raise LeRobotDatasetError(
            f"{root / INFO}: {template} {info[template]!r} cannot be filled in: {error}"
        ) from None
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise LeRobotDatasetError(f"{root / INFO}: {template} leads outside the dataset ({path})")
    return path


def _episodes(root: DatasetPath, video_keys: tuple[str, ...]) -> pa.Table:
    folder = root / EPISODES_DIR
    files = sorted(folder.glob("chunk-*/file-*.parquet"))
    if not files:
        raise LeRobotDatasetError(f"{folder} holds no chunk-XXX/file-XXX.parquet episode files")
    needed = [*EPISODE_COLUMNS] + [f"videos/{k}/{f}" for k in video_keys for f in VIDEO_FIELDS]
    tables = []
    for path in files:
        try:
            names = pq.read_schema(readable(path)).names
        except (OSError, pa.ArrowException) as error:
            raise LeRobotDatasetError(f"{path} is not a readable Parquet file: {error}") from None
        missing = [c for c in needed if c not in names]
        if missing:
            raise LeRobotDatasetError(f"{path} lacks the episode fields {missing}")
        table = pq.read_table(readable(path), columns=needed)
        for column in needed:
            if table[column].null_count:
                raise LeRobotDatasetError(f"{path}: field {column!r} is null for an episode")
        _check_episode_values(table, path)
        tables.append(table)
    episodes = pa.concat_tables(tables).sort_by("episode_index")
    indices = episodes["episode_index"].to_numpy()
    if len(np.unique(indices)) != len(indices):
        raise LeRobotDatasetError(f"{folder}: an episode_index appears twice")
    return episodes


def _check_episode_values(table: pa.Table, path: DatasetPath) -> None:
    """Indices and lengths are integers >= 0; where an episode starts in a video file is a
    finite number of seconds >= 0."""
    starts = [c for c in table.column_names if c.endswith("/from_timestamp")]
    integers = [c for c in table.column_names if c not in starts]
    check_kinds(table.schema, path, integers, starts)
    names = table["episode_index"].to_numpy()
    for column in table.column_names:
        rule = (
            "an episode's start in its video file must be a finite number of seconds >= 0"
            if column in starts
            else "it must be >= 0"
        )
        values = table[column].to_numpy()
        check_range(values, names, path, column, "episode", rule)


def _check_frame_count(
    root: DatasetPath, data_files: tuple[DatasetPath, ...], episodes: pa.Table
) -> None:
    """The data files hold as many frames as the episodes' lengths add up to (from the
    files' footers: nothing is read)."""
    held = sum(_parquet(path).metadata.num_rows for path in data_files)
    listed = int(pc.sum(episodes["length"]).as_py() or 0)
    if not listed:
        raise LeRobotDatasetError(f"{root / EPISODES_DIR}: its episodes hold no frames")
    if held != listed:
        raise LeRobotDatasetError(
            f"{root / 'data'}: its files hold {held} frames, but the lengths in "
            f"{root / EPISODES_DIR} add up to {listed}"
        )


def _pairs(episodes: pa.Table, prefix: str) -> list[tuple[int, int]]:
    """The distinct (chunk, file) pairs the episodes name under ``prefix``, in order."""
    pairs = zip(
        _ints(episodes, f"{prefix}/chunk_index"),
        _ints(episodes, f"{prefix}/file_index"),
        strict=True,
    )
    return sorted({(int(c), int(f)) for c, f in pairs})


def _ints(episodes: pa.Table, column: str) -> np.ndarray:
    return episodes[column].to_numpy()


def _tasks(root: DatasetPath) -> dict[int, str]:
    path = root / TASKS
    if not path.is_file():
        raise LeRobotDatasetError(f"{path} is missing: it names the tasks of the frames")
    try:
        frame = pd.read_parquet(readable(path))
    except (OSError, ValueError, pa.ArrowException) as error:
        raise LeRobotDatasetError(f"{path} is not a readable Parquet file: {error}") from None
    if "task_index" not in frame.columns:
        raise LeRobotDatasetError(f"{path} lacks the field 'task_index'")
    texts = frame["task"] if "task" in frame.columns else frame.index
    return task_texts(path, frame["task_index"].tolist(), texts.tolist())
