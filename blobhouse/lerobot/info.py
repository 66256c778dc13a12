"""The LeRobot dataset a table version holds: the meta its import kept
(:mod:`blobhouse.lerobot.meta`) and the episodes its rows give.

Episodes are read from the rows, not kept: they stay true after deletes, updates and appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from blobhouse.lerobot.meta import LeRobotMeta, table_meta
from blobhouse.read.video import TIMESTAMP_SUFFIX
from blobhouse.table import Table

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
