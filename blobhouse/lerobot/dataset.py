"""``LeRobotDataset`` over a blobhouse table: LeRobot's training code, unchanged but for its
import line, reads a table made by :func:`~blobhouse.lerobot.ingest_lerobot`.

``dataset[i]`` is the dict LeRobot's ``LeRobotDataset[i]`` returns for the same dataset: its
feature keys (with their dots), ``float32`` tensors for float features and ``int64`` for
integers (scalars 0-dimensional), camera frames as ``float32`` CHW in [0, 1], ``task`` (the
text), and with ``delta_timestamps`` each named key stacked at the frames it asks for, with a
``<key>_is_pad`` mask where they fall outside the frame's episode (clamped to its first or last
frame, as LeRobot pads). A DataLoader's batch of indices is one read: the rows every item and
its deltas need in one take, and each distinct video file decoded once, in time order, for all
the frames the batch needs of it (:mod:`blobhouse.read.video`).

``.meta`` offers what LeRobot's training code reads of ``LeRobotDatasetMetadata`` (``fps``,
``features``, ``stats``, ``camera_keys``, ``video_keys``, ``episodes``, ``tasks``,
``total_episodes``, ``total_frames``, ``robot_type``, ...): the meta the import kept with the
table (:mod:`blobhouse.lerobot.meta`), and the episodes as the rows give them.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.extras import require_pillow, require_torch

require_torch("blobhouse.lerobot.LeRobotDataset")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from blobhouse.errors import InvalidInputError  # noqa: E402
from blobhouse.lerobot.info import LeRobotDatasetMetadata, load_pinned, pinned_rows  # noqa: E402
from blobhouse.lerobot.meta import LeRobotMeta  # noqa: E402
from blobhouse.loader import checked_frames, read_row_dicts  # noqa: E402
from blobhouse.options import keywords_checked  # noqa: E402


class LeRobotDataset(Dataset):
    """LeRobot's ``LeRobotDataset`` over a blobhouse table: ``root`` names the table (a path
    or an object-store URI; without it ``repo_id`` does). The arguments LeRobot's constructor
    takes for downloading or recording (``revision``, ``force_cache_sync``,
    ``download_videos``, ``video_backend``, ``batch_encoding_size``, ``vcodec``, ...) are
    accepted and have nothing to do here; a name it does not take is refused, naming the
    closest.

    >>> import tempfile
    >>> from blobhouse.lerobot import ingest_lerobot
    >>> from blobhouse.lerobot.sample import write_sample_dataset
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=2, frames=4, size=(16, 16))
    >>> table = ingest_lerobot(root, tempfile.mkdtemp() + "/robot").table
    >>> ds = LeRobotDataset("me/robot", root=table.uri, delta_timestamps={"action": [-1/30, 0]})
    >>> item = ds[4]  # the first frame of the second episode
    >>> item["observation.images.cam"].shape, item["action"].shape, item["action_is_pad"].tolist()
    (torch.Size([3, 16, 16]), torch.Size([2, 6]), [True, False])
    """

    @keywords_checked
    def __init__(
        self,
        repo_id: str,
        root: str | os.PathLike | None = None,
        episodes: Sequence[int] | None = None,
        image_transforms: Callable | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        revision: str | None = None,
        force_cache_sync: bool = False,
        download_videos: bool = True,
        video_backend: str | None = None,
        batch_encoding_size: int = 1,
        vcodec: str = "libsvtav1",
        streaming_encoding: bool = False,
        encoder_queue_maxsize: int = 30,
        encoder_threads: int | None = None,
        *,
        storage_options: dict[str, str] | None = None,
        check_hashes: bool = True,
    ) -> None:
        super().__init__()
        # lance warns before every fork once imported; this reader checks for itself whether
        # Lance had started before its DataLoader workers forked (it has not, unless the script
        # used it: the meta is read in a fresh process), and reads through a fresh process with
        # a ForkedAfterLanceWarning of its own if so (blobhouse.io.forks)
        warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
        uri = os.fspath(root) if root is not None else repo_id
        if not isinstance(uri, str):
            raise InvalidInputError(f"root must name a table (a path or URI), got {root!r}")
        self.repo_id, self.root = repo_id, uri
        self.image_transforms = image_transforms
        self.tolerance_s = tolerance_s
        self.check_hashes = check_hashes
        self._rows = pinned_rows(uri, storage_options)
        meta, self._episodes = load_pinned(self._rows)
        self.meta = LeRobotDatasetMetadata(repo_id, uri, _loaded=(meta, self._episodes))
        self.episodes = None if episodes is None else list(episodes)
        self._positions = self._selected(self.episodes)
        self.delta_indices = None
        if delta_timestamps is not None:
            self.delta_indices = _delta_indices(delta_timestamps, meta, tolerance_s)
        self.delta_timestamps = None if delta_timestamps is None else dict(delta_timestamps)
        self._columns = meta.columns
        self._values = [k for k in meta.features if meta.features[k]["dtype"] != "video"]
        self._checked_chunks: set[tuple[str, int, int]] = set()

    def _selected(self, episodes: list[int] | None) -> np.ndarray:
        """The table positions of the frames of ``episodes`` (all: every row)."""
        bounds = self._episodes
        if episodes is None:
            return np.arange(int(bounds.stop[-1]) if len(bounds) else 0)
        wanted = set(episodes)
        missing = wanted - set(bounds.index.tolist())
        if missing:
            raise InvalidInputError(
                f"episodes {sorted(missing)} are not in table {self.root} (its episodes: "
                f"{bounds.index.min()} to {bounds.index.max()})"
            )
        keep = [i for i, e in enumerate(bounds.index) if int(e) in wanted]
        ranges = [np.arange(bounds.start[i], bounds.stop[i]) for i in keep]
        return np.concatenate(ranges) if ranges else np.arange(0)

    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    @property
    def num_frames(self) -> int:
        return len(self._positions)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes) if self.episodes is not None else self.meta.total_episodes

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return self.__getitems__([idx])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The items at ``indices``: one read for all of them (a DataLoader calls this with
        each batch of indices)."""
        positions = self._positions_of(indices)
        if not len(positions):
            return []
        queries, pads = self._queries(positions)
        needed = {key: q for key, q in queries.items() if key in self._values}
        values = self._read_values(
            np.unique(np.concatenate([positions, *(q.ravel() for q in needed.values())]))
        )
        frames = self._read_frames(positions, queries)
        items = []
        for n, position in enumerate(positions):
            item: dict[str, Any] = {key: frames[key][n] for key in self.meta.video_keys}
            for key in self._values:
                item[key] = values[key](position)
            for key, query in queries.items():
                if key in self._values:
                    item[key] = torch.stack([values[key](p) for p in query[n]])
                item[f"{key}_is_pad"] = torch.from_numpy(pads[key][n].copy())
            if self.image_transforms is not None:
                for key in self.meta.camera_keys:
                    item[key] = self.image_transforms(item[key])
            item["task"] = values["task"](position)
            items.append(item)
        return items

    def _positions_of(self, indices: Sequence[int]) -> np.ndarray:
        wanted = np.asarray(indices)
        if wanted.ndim == 1 and not len(wanted):
            return np.arange(0)
        if wanted.ndim != 1 or wanted.dtype.kind not in "iu":
            raise InvalidInputError(f"indices must be integers, got {indices!r}")
        outside = wanted[(wanted < -len(self)) | (wanted >= len(self))]
        if len(outside):
            raise IndexError(f"index {outside[0]} is outside the {len(self)} frames of the dataset")
        return self._positions[wanted]

    def _queries(self, positions: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Per key with deltas: the positions each item asks for (items x deltas, clamped to
        the item's episode) and where they were clamped (LeRobot's ``_get_query_indices``)."""
        if self.delta_indices is None:
            return {}, {}
        which = self._episodes.of_position(positions)
        first = self._episodes.start[which][:, None]
        last = self._episodes.stop[which][:, None] - 1
        queries, pads = {}, {}
        for key, deltas in self.delta_indices.items():
            asked = positions[:, None] + np.asarray(deltas)[None, :]
            queries[key] = np.clip(asked, first, last)
            pads[key] = (asked < first) | (asked > last)
        return queries, pads

    def _table(self):
        return self._rows.table()

    def _read_values(self, positions: np.ndarray) -> dict[str, Callable[[int], Any]]:
        """The non-video features and ``task`` of the rows at ``positions``: per key, a lookup
        by position giving LeRobot's tensor (or the text)."""
        ids = self._rows.ids()[positions]
        images = [k for k in self._values if self.features[k]["dtype"] == "image"]
        plain = [k for k in self._values if k not in images]
        table = self._table().take_rows(ids, [self._columns[k] for k in plain] + ["task"])
        where = {int(p): n for n, p in enumerate(positions)}
        values: dict[str, Callable[[int], Any]] = {}
        for key in plain:
            tensors = _tensors(table.column(self._columns[key]), self.features[key])
            values[key] = lambda p, t=tensors: t[where[int(p)]]
        texts = table.column("task").to_pylist()
        values["task"] = lambda p: texts[where[int(p)]]
        if images:
            require_pillow()
            rows = read_row_dicts(
                self._table(),
                ids,
                [self._columns[k] for k in images],
                "bytes",
                self.check_hashes,
                storage_options=self._rows.storage_options,
            )
            for key in images:
                decoded = [_image_tensor(row[self._columns[key]]) for row in rows]
                values[key] = lambda p, d=decoded: d[where[int(p)]]
        return values

    def _read_frames(
        self, positions: np.ndarray, queries: dict[str, np.ndarray]
    ) -> dict[str, list[torch.Tensor]]:
        """Per camera, each item's frame (or its frames at its deltas, stacked), as LeRobot's
        ``float32`` CHW in [0, 1]: every frame the batch needs of a camera in one read."""
        frames: dict[str, list[torch.Tensor]] = {}
        for key in self.meta.video_keys:
            asked = queries.get(key, positions[:, None])
            unique, inverse = np.unique(asked, return_inverse=True)
            column = self._columns[key]
            video = checked_frames([column], "chw", "bytes")
            rows = read_row_dicts(
                self._table(),
                self._rows.ids()[unique],
                [],
                "bytes",
                self.check_hashes,
                video,
                self._rows.storage_options,
                self._checked_chunks,
            )
            # each item's own tensor, as LeRobot gives (a transform may change it in place);
            # turning each distinct frame to float once and sharing it measured no faster,
            # nor did one tensor for the whole batch (its fresh pages fault in every batch)
            decoded = [torch.from_numpy(np.asarray(row[column])) for row in rows]
            stacks = inverse.reshape(asked.shape)
            frames[key] = [
                torch.stack([decoded[i] for i in stack]).float().div_(255).squeeze(0)
                for stack in stacks
            ]
        return frames

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset(repo_id={self.repo_id!r}, table={self.root!r}, "
            f"episodes={self.num_episodes}, frames={self.num_frames}, "
            f"features={list(self.features)})"
        )


def _delta_indices(
    delta_timestamps: Mapping[str, Sequence[float]], meta: LeRobotMeta, tolerance_s: float
) -> dict[str, list[int]]:
    """Each key's deltas in frames, checked as LeRobot checks them: every delta a whole
    number of frames at the dataset's fps (within ``tolerance_s``), every key a feature."""
    if not isinstance(delta_timestamps, Mapping):
        raise InvalidInputError(
            f"delta_timestamps must map feature keys to lists of seconds, got {delta_timestamps!r}"
        )
    indices = {}
    for key, deltas in delta_timestamps.items():
        if key not in meta.features:
            raise InvalidInputError(
                f"delta_timestamps names {key!r}, which is not a feature of the dataset (its "
                f"features: {', '.join(meta.features)})"
            )
        if isinstance(deltas, str | bytes) or not isinstance(deltas, Sequence):
            raise InvalidInputError(
                f"delta_timestamps[{key!r}] must be a list of seconds, got {deltas!r}"
            )
        frames = []
        for delta in deltas:
            if not isinstance(delta, int | float) or not math.isfinite(delta):
                raise InvalidInputError(
                    f"delta_timestamps[{key!r}] holds {delta!r}: deltas are seconds"
                )
            steps = round(delta * meta.fps)
            if abs(steps / meta.fps - delta) > tolerance_s:
                raise InvalidInputError(
                    f"delta_timestamps[{key!r}] holds {delta!r} s, not a whole number of frames "
                    f"at {meta.fps:g} fps (within tolerance_s={tolerance_s})"
                )
            frames.append(steps)
        indices[key] = frames
    return indices


def _tensors(column: pa.ChunkedArray, feature: Mapping[str, Any]) -> list[torch.Tensor]:
    """A column's values as LeRobot's tensors: floats ``float32``, integers ``int64``,
    booleans ``bool``; a feature of shape ``(1,)`` a 0-dimensional tensor."""
    column = column.combine_chunks()
    base = column.type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(base) or pa.types.is_list(base):
        shape.append(base.list_size if pa.types.is_fixed_size_list(base) else -1)
        column = pc.list_flatten(column)
        base = column.type
    values = column.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(base):
        values = values.astype(np.float32)
    elif pa.types.is_integer(base):
        values = values.astype(np.int64)
    rows = values.reshape(-1, *[s if s > 0 else -1 for s in shape]) if shape else values
    return [torch.from_numpy(np.array(row)) for row in rows]


def _image_tensor(data: bytes) -> torch.Tensor:
    """An image feature's bytes (PNG) as LeRobot gives it: ``float32`` CHW in [0, 1]."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"))
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy()).float().div_(255)
