"""The LeRobot dataset a table version holds: the meta its import kept
(:mod:`blobhouse.lerobot.meta`) and the episodes its rows give.

Episodes are read from the rows, not kept: they stay true after deletes, updates and appends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from blobhouse.errors import InvalidInputError, LeRobotDatasetError, NotATableError
from blobhouse.io.forks import in_fresh_process, lance_is_running
from blobhouse.layout import TableLocation
from blobhouse.lerobot.folder import dataset_path
from blobhouse.lerobot.meta import LeRobotMeta, table_meta
from blobhouse.loader import PinnedRows
from blobhouse.read.video import TIMESTAMP_SUFFIX
from blobhouse.table import Table, open_at

_SCAN_ROWS = 65_536


@dataclass(frozen=True)
class Episodes:
    """The episodes of a table version as its rows give them: each a stretch of consecutive
    rows (``start`` to ``stop``, positions in the table) of one ``episode_index``, in table
    order, with its tasks and, per camera, where it starts and ends in its video file."""

    index: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    tasks: list[list[str]]
    from_timestamp: dict[str, np.ndarray] = field(default_factory=dict)
    to_timestamp: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def length(self) -> np.ndarray:
        return self.stop - self.start

    def of_position(self, positions: np.ndarray) -> np.ndarray:
        """Which episode (its place in this list) holds each of ``positions``."""
        return np.searchsorted(self.start, positions, side="right") - 1

    def rows(self, cameras: Sequence[str] = ()) -> list[dict[str, Any]]:
        """One dict per episode, in LeRobot's words (``episodes/`` Parquet's fields)."""
        rows = []
        for i in range(len(self)):
            row: dict[str, Any] = {
                "episode_index": int(self.index[i]),
                "tasks": list(self.tasks[i]),
                "length": int(self.stop[i] - self.start[i]),
                "dataset_from_index": int(self.start[i]),
                "dataset_to_index": int(self.stop[i]),
            }
            for key in cameras:
                row[f"videos/{key}/from_timestamp"] = float(self.from_timestamp[key][i])
                row[f"videos/{key}/to_timestamp"] = float(self.to_timestamp[key][i])
            rows.append(row)
        return rows


@dataclass(frozen=True)
class DatasetInfo:
    """A LeRobot dataset as a table version keeps it: the meta the import recorded and the
    episodes its rows hold (:func:`dataset_info`)."""

    meta: LeRobotMeta
    episodes: Episodes

    @property
    def total_frames(self) -> int:
        return int(self.episodes.length.sum())

    @property
    def total_episodes(self) -> int:
        return len(self.episodes)

    def summary(self) -> dict[str, Any]:
        """What ``blobhouse stats`` shows of it."""
        return {
            "fps": self.meta.fps,
            "robot_type": self.meta.robot_type,
            "total_frames": self.total_frames,
            "total_episodes": self.total_episodes,
            "total_tasks": len(self.meta.tasks),
            "cameras": self.meta.camera_keys,
            "features": {k: f.get("shape") for k, f in self.meta.features.items()},
            "stats_of": sorted(self.meta.stats),
            "stats_frames": self.meta.stats_frames,
        }


def dataset_info(table: Table) -> DatasetInfo | None:
    """The LeRobot dataset a table version holds (None: the table was not imported from one):
    the meta its import kept and the episodes read from its rows (a scan of their small
    columns).

    >>> import tempfile
    >>> from blobhouse.lerobot import ingest_lerobot
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> info = dataset_info(ingest_lerobot(root, tempfile.mkdtemp() + "/robot").table)
    >>> info.meta.fps, info.total_frames, info.episodes.length.tolist()
    (30, 8, [4, 4])
    """
    meta = table_meta(table.dataset)
    if meta is None:
        return None
    return DatasetInfo(meta, _episodes(table, meta))


def _episodes(table: Table, meta: LeRobotMeta) -> Episodes:
    """The episodes of ``table``'s rows: one scan of ``episode_index``, ``task``,
    ``timestamp`` and each camera's timestamp, a batch at a time."""
    cameras = {key: meta.columns[key] + TIMESTAMP_SUFFIX for key in meta.video_keys}
    columns = ["episode_index", "task", "timestamp", *cameras.values()]
    index: list[int] = []
    start: list[int] = []
    tasks: list[set[str]] = []
    first: dict[str, list[float]] = {key: [] for key in cameras}
    last: dict[str, list[float]] = {key: [] for key in cameras}
    seen = 0
    for batch in table.dataset.to_batches(columns=columns, batch_size=_SCAN_ROWS):
        episodes = batch.column("episode_index").to_numpy(zero_copy_only=False)
        if not len(episodes):
            continue
        cuts = np.flatnonzero(np.diff(episodes)) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [len(episodes)]])
        seconds = batch.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        for a, b in zip(starts, stops, strict=True):
            texts = set(pc.unique(batch.column("task").slice(a, b - a)).to_pylist())
            continuing = bool(index) and a == 0 and index[-1] == episodes[0]
            if continuing:
                tasks[-1] |= texts
            else:
                index.append(int(episodes[a]))
                start.append(seen + int(a))
                tasks.append(texts)
            for key, column in cameras.items():
                times = batch.column(column).to_numpy(zero_copy_only=False)
                if not continuing:
                    first[key].append(float(times[a] - seconds[a]))
                    last[key].append(0.0)
                last[key][-1] = float(times[b - 1])
        seen += len(episodes)
    starts_array = np.asarray(start, np.int64)
    step = 1.0 / meta.fps
    return Episodes(
        np.asarray(index, np.int64),
        starts_array,
        np.append(starts_array[1:], seen).astype(np.int64),
        [sorted(t) for t in tasks],
        {key: np.asarray(first[key]) for key in cameras},
        {key: np.asarray(last[key]) + step for key in cameras},
    )


def _load(
    location: TableLocation, version: int, storage_options: dict[str, str] | None
) -> tuple[str, Episodes] | None:
    """The meta (JSON) and episodes of a table version, picklable: what a reader needs before
    it reads rows (run in a fresh process when this one has not started Lance, so DataLoader
    workers forked from it can read)."""
    info = dataset_info(open_at(location, version, storage_options))
    return None if info is None else (info.meta.to_json(), info.episodes)


def pinned_rows(uri: str, storage_options: dict[str, str] | None) -> PinnedRows:
    """The table at ``uri`` pinned at its latest version; a LeRobot dataset's folder given
    where the table belongs is named as what it is."""
    try:
        return PinnedRows(uri, storage_options=storage_options)
    except NotATableError:
        if (dataset_path(uri, storage_options) / "meta/info.json").is_file():
            raise LeRobotDatasetError(
                f"{uri} is a LeRobot dataset's folder, not a table: import it once with "
                "blobhouse.lerobot.ingest_lerobot(folder, table) (or blobhouse ingest-lerobot "
                "FOLDER TABLE) and name the table as root"
            ) from None
        raise


def load_pinned(rows: PinnedRows) -> tuple[LeRobotMeta, Episodes]:
    """The meta and episodes of the table version ``rows`` pins, without starting Lance in
    this process if it has not (its DataLoader workers may fork), or an error naming the
    way out when the table keeps no LeRobot dataset's meta."""
    args = (rows.location, rows.version, rows.storage_options)
    loaded = _load(*args) if lance_is_running() else in_fresh_process(_load, *args)
    if loaded is None:
        raise LeRobotDatasetError(
            f"table {rows.location} holds no LeRobot dataset's metadata: import the dataset "
            "with blobhouse.lerobot.ingest_lerobot (a table imported before blobhouse kept "
            "the metadata needs importing again)"
        )
    return LeRobotMeta.from_json(loaded[0]), loaded[1]


def tasks_frame(tasks: Mapping[int, str]) -> pd.DataFrame:
    """Tasks as LeRobot keeps them (``meta/tasks.parquet``, ``meta.tasks``): indexed by the
    text, with its ``task_index``."""
    ordered = sorted(tasks.items())
    return pd.DataFrame(
        {"task_index": [i for i, _ in ordered]},
        index=pd.Index([t for _, t in ordered], name="task"),
    )


class EpisodeTable:
    """``LeRobotDatasetMetadata.episodes`` as LeRobot's training code reads it: ``[i]`` is
    episode ``i``'s row (a dict), ``["dataset_from_index"]`` a field over all episodes."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            if self._rows and key not in self._rows[0]:
                raise KeyError(key)
            return [row[key] for row in self._rows]
        return self._rows[key]

    @property
    def column_names(self) -> list[str]:
        return list(self._rows[0]) if self._rows else []

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self._rows)


class LeRobotDatasetMetadata:
    """LeRobot's ``LeRobotDatasetMetadata`` for a table: what its training code reads (``fps``,
    ``features``, ``stats`` as numpy arrays, ``camera_keys``, ``video_keys``, ``episodes``,
    ``tasks``, ``total_episodes``, ``total_frames``, ``robot_type``, ...). ``root`` names the
    table (without it ``repo_id`` does); ``revision`` and ``force_cache_sync`` are accepted and
    do nothing here.

    >>> import tempfile
    >>> from blobhouse.lerobot import ingest_lerobot
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> table = ingest_lerobot(root, tempfile.mkdtemp() + "/robot").table
    >>> meta = LeRobotDatasetMetadata("me/robot", root=table.uri)
    >>> meta.fps, meta.total_frames, meta.episodes["dataset_to_index"]
    (30, 8, [4, 8])
    """

    def __init__(
        self,
        repo_id: str,
        root: str | os.PathLike | None = None,
        revision: str | None = None,
        force_cache_sync: bool = False,
        *,
        storage_options: dict[str, str] | None = None,
        _loaded: tuple[LeRobotMeta, Episodes] | None = None,
    ) -> None:
        uri = os.fspath(root) if root is not None else repo_id
        if not isinstance(uri, str):
            raise InvalidInputError(f"root must name a table (a path or URI), got {root!r}")
        self.repo_id, self.root, self.revision = repo_id, uri, revision
        if _loaded is None:
            _loaded = load_pinned(pinned_rows(uri, storage_options))
        meta, episodes = _loaded
        self._meta = meta
        self.episodes = EpisodeTable(episodes.rows(meta.video_keys))
        self.tasks = tasks_frame(meta.tasks)
        self.stats = {
            key: {name: np.asarray(value) for name, value in stats.items()}
            for key, stats in meta.stats.items()
        }
        self.info = {
            "codebase_version": meta.codebase_version,
            "robot_type": meta.robot_type,
            "total_episodes": len(episodes),
            "total_frames": int(episodes.length.sum()),
            "total_tasks": len(meta.tasks),
            "fps": meta.fps,
            "features": meta.features,
        }

    @property
    def fps(self) -> float:
        return self._meta.fps

    @property
    def robot_type(self) -> str | None:
        return self._meta.robot_type

    @property
    def features(self) -> dict[str, dict]:
        return self._meta.features

    @property
    def image_keys(self) -> list[str]:
        return self._meta.image_keys

    @property
    def video_keys(self) -> list[str]:
        return self._meta.video_keys

    @property
    def camera_keys(self) -> list[str]:
        return self._meta.camera_keys

    @property
    def names(self) -> dict[str, Any]:
        return {key: f.get("names") for key, f in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple]:
        return {key: tuple(f["shape"]) for key, f in self.features.items()}

    @property
    def total_episodes(self) -> int:
        return self.info["total_episodes"]

    @property
    def total_frames(self) -> int:
        return self.info["total_frames"]

    @property
    def total_tasks(self) -> int:
        return self.info["total_tasks"]

    def get_task_index(self, task: str) -> int | None:
        return self.tasks.loc[task].task_index if task in self.tasks.index else None

    def __repr__(self) -> str:
        return (
            f"LeRobotDatasetMetadata(repo_id={self.repo_id!r}, "
            f"total_episodes={self.total_episodes}, total_frames={self.total_frames}, "
            f"features={list(self.features)})"
        )
