"""What a LeRobot dataset is besides its rows, kept with the table it was imported into.

LeRobot keeps it in ``meta/``: ``info.json`` (``fps``, ``robot_type``, ``features``: each
feature's ``dtype``, ``shape`` and ``names``), ``tasks.parquet`` and ``stats.json`` (the
normalization every policy needs: ``min``, ``max``, ``mean``, ``std`` and ``count`` per
feature, image features per channel). An import records them as :class:`LeRobotMeta` in the
table's schema metadata (key :data:`META_KEY`, JSON), so it is versioned with the table: a
version, tag, branch or copy reads the meta of its own rows. Episodes and frame counts are not
kept there: :func:`dataset_info` reads them from the rows, so they stay true after deletes and
updates too.

An import that creates the table records the meta in the commit that creates it. An append
commits its rows, then the meta merged with the table's (:meth:`LeRobotMeta.merged`: the same
``fps`` and features, tasks united, stats aggregated as LeRobot's ``aggregate_stats`` does), as
one more version: if the process dies between the two, the rows are in and the stats lack
them (:attr:`DatasetInfo.stats_frames` then differs from the frame count).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pyarrow as pa
from lance import LanceDataset, LanceOperation

from blobhouse.commit.change import ManifestUpdate, run_change
from blobhouse.errors import LeRobotDatasetError, TableMetadataError
from blobhouse.lerobot.checks import column_name
from blobhouse.lerobot.stats import Stats, aggregate_stats
from blobhouse.snapshot import TableSnapshot

#: the schema metadata key of the meta
META_KEY = "blobhouse:lerobot"
STATS = "meta/stats.json"
_CAMERA = {"video", "image"}


@dataclass(frozen=True)
class LeRobotMeta:
    """A LeRobot dataset's metadata as a table keeps it: ``features`` as in its
    ``meta/info.json`` (keys with their dots), ``tasks`` by ``task_index``, ``stats`` as in its
    ``meta/stats.json`` (``stats_frames``: the frames they describe).

    >>> meta = LeRobotMeta("v3.0", 30.0, "so100", {"action": {"dtype": "float32", "shape": [2]}})
    >>> LeRobotMeta.from_json(meta.to_json()) == meta
    True
    >>> meta.columns
    {'action': 'action'}
    """

    codebase_version: str
    fps: float
    robot_type: str | None
    features: dict[str, dict[str, Any]]
    tasks: dict[int, str] = field(default_factory=dict)
    stats: Stats = field(default_factory=dict)
    stats_frames: int = 0
    sources: tuple[str, ...] = ()  # fingerprints of the datasets imported (source_fingerprint)

    @property
    def columns(self) -> dict[str, str]:
        """Each feature's column in the table (dots become underscores)."""
        return {key: column_name(key) for key in self.features}

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] in _CAMERA]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 1,
                "codebase_version": self.codebase_version,
                "fps": self.fps,
                "robot_type": self.robot_type,
                "features": self.features,
                "tasks": {str(i): text for i, text in sorted(self.tasks.items())},
                "stats": self.stats,
                "stats_frames": self.stats_frames,
                "sources": list(self.sources),
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> LeRobotMeta:
        try:
            raw = json.loads(text)
            return cls(
                raw["codebase_version"],
                raw["fps"],
                raw["robot_type"],
                raw["features"],
                {int(i): t for i, t in raw["tasks"].items()},
                raw["stats"],
                int(raw["stats_frames"]),
                tuple(raw.get("sources", ())),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TableMetadataError(
                f"the table's LeRobot metadata ({META_KEY!r} in its schema metadata) cannot be "
                f"read: {exc!r}"
            ) from None

    def merged(self, other: LeRobotMeta, where: str) -> LeRobotMeta:
        """This meta with ``other``'s dataset appended: the same ``fps`` and features
        (``dtype``, ``shape``, ``names``), tasks united, stats aggregated."""
        if self.fps != other.fps:
            raise LeRobotDatasetError(
                f"the dataset's fps is {other.fps:g}, the table {where}'s {self.fps:g}: append "
                "datasets recorded at the same rate"
            )
        for key in sorted(set(self.features) | set(other.features)):
            mine, theirs = self.features.get(key), other.features.get(key)
            if _essentials(mine) != _essentials(theirs):
                raise LeRobotDatasetError(
                    f"the dataset's feature {key!r} is {_essentials(theirs)}, the table "
                    f"{where}'s {_essentials(mine)}: append datasets with the same features"
                )
        tasks = dict(self.tasks)
        for index, text in other.tasks.items():
            if tasks.setdefault(index, text) != text:  # other was renumbered: never
                raise LeRobotDatasetError(
                    f"the dataset's task_index {index} is {text!r}, the table {where}'s "
                    f"{tasks[index]!r}"
                )
        return replace(
            self,
            tasks=tasks,
            stats=aggregate_stats([self.stats, other.stats]),
            stats_frames=self.stats_frames + other.stats_frames,
            sources=self.sources + other.sources,
        )

    def renumbered(self, renumbering: Renumbering) -> LeRobotMeta:
        """This dataset's meta as it reads once appended with ``renumbering``: its tasks under
        their new indices, the stats of ``index`` and ``episode_index`` moved by the offsets
        (min, max, mean; the spread stays)."""
        stats = dict(self.stats)
        for key, offset in (("index", renumbering.index), ("episode_index", renumbering.episode)):
            if key in stats and offset:
                stats[key] = {
                    name: (np.asarray(value) + offset).tolist()
                    if name in ("min", "max", "mean", "q01", "q10", "q50", "q90", "q99")
                    else value
                    for name, value in stats[key].items()
                }
        tasks = {renumbering.tasks.get(i, i): text for i, text in self.tasks.items()}
        return replace(self, tasks=tasks, stats=stats)


@dataclass(frozen=True)
class Renumbering:
    """How an appended dataset's frames are numbered in the table, as LeRobot's own merge
    numbers them: ``index`` and ``episode_index`` moved past the table's, each task under the
    table's ``task_index`` for its text (a new text under the next free one).

    >>> table = LeRobotMeta("v3.0", 30, None, {}, tasks={0: "push", 1: "pick"})
    >>> Renumbering.after(table, 100, 4, {0: "pick", 1: "stack"})
    Renumbering(index=100, episode=4, tasks={0: 1, 1: 2})
    """

    index: int = 0
    episode: int = 0
    tasks: dict[int, int] = field(default_factory=dict)

    @classmethod
    def after(
        cls, table: LeRobotMeta, next_index: int, next_episode: int, tasks: Mapping[int, str]
    ) -> Renumbering:
        by_text = {text: i for i, text in table.tasks.items()}
        free = max(table.tasks, default=-1) + 1
        mapping = {}
        for index, text in sorted(tasks.items()):
            if text not in by_text:
                by_text[text], free = free, free + 1
            mapping[index] = by_text[text]
        return cls(next_index, next_episode, mapping)

    def apply(self, column: str, values: np.ndarray) -> np.ndarray:
        """A frame column's values renumbered (``index``, ``episode_index``, ``task_index``;
        others as they are)."""
        if column == "index":
            return values + self.index
        if column == "episode_index":
            return values + self.episode
        if column == "task_index" and self.tasks:
            lookup = np.vectorize(lambda i: self.tasks.get(int(i), int(i)), otypes=[np.int64])
            return lookup(values) if len(values) else values
        return values


def source_fingerprint(root: Path) -> str:
    """What identifies a dataset folder: the blake3 of its ``meta/info.json``, its tasks and
    its episode files (which name every data and video file, their frames and lengths)."""
    digest = blake3.blake3()
    episodes = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    for path in [root / "meta/info.json", root / "meta/tasks.parquet", *episodes]:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _essentials(feature: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if feature is None:
        return None
    return {k: feature.get(k) for k in ("dtype", "shape", "names")}


def source_meta(root: Path, info: Mapping[str, Any], tasks: Mapping[int, str], frames: int):
    """The meta of the dataset at ``root`` (``info``: its checked ``meta/info.json``): its
    ``meta/stats.json`` when it has one, else stats computed from its data files for its
    numeric features."""
    stats_path = root / STATS
    if stats_path.is_file():
        try:
            stats = json.loads(stats_path.read_text())
        except (ValueError, UnicodeDecodeError) as error:
            raise LeRobotDatasetError(f"{stats_path} is not valid JSON: {error}") from None
        if not isinstance(stats, dict) or not all(isinstance(s, dict) for s in stats.values()):
            raise LeRobotDatasetError(
                f"{stats_path} must map each feature to its stats, got {type(stats).__name__}"
            )
    else:
        stats = {}
    return LeRobotMeta(
        info["codebase_version"],
        info["fps"],  # as LeRobot gives it (an int, mostly)
        info.get("robot_type"),
        {key: dict(feature) for key, feature in info["features"].items()},
        dict(tasks),
        stats,
        frames,
        (source_fingerprint(root),),
    )


def table_meta(dataset: LanceDataset) -> LeRobotMeta | None:
    """The LeRobot meta a version of a table keeps (None: it was not imported from LeRobot,
    or by a blobhouse before 2026-11-30)."""
    text = (dataset.schema.metadata or {}).get(META_KEY.encode())
    return None if text is None else LeRobotMeta.from_json(text)


def with_meta(schema: pa.Schema, meta: LeRobotMeta) -> pa.Schema:
    """``schema`` carrying ``meta`` (what a create records)."""
    return schema.with_metadata({**(schema.metadata or {}), META_KEY.encode(): meta.to_json()})


def append_meta(snapshot: TableSnapshot, meta: LeRobotMeta, where: str) -> TableSnapshot:
    """Record ``meta`` (an appended dataset's) in the table, merged with the meta of the
    latest version (again after another commit preempts it); nothing when the table keeps
    none (its rows were imported by a blobhouse that did not keep it)."""

    def update(latest: TableSnapshot) -> LanceOperation.UpdateConfig | None:
        mine = table_meta(latest.dataset)
        if mine is None:  # rows imported before the meta was kept: this one's alone would lie
            return None
        merged = mine.merged(meta, where)
        return LanceOperation.UpdateConfig(
            schema_metadata_updates=LanceOperation.UpdateMap({META_KEY: merged.to_json()})
        )

    return run_change(ManifestUpdate("lerobot-meta", update), snapshot).snapshot
