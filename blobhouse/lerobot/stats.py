"""LeRobot's stats of a dataset's features, in ``meta/stats.json``'s form: per feature ``min``,
``max``, ``mean``, ``std``, ``count`` and the quantiles ``q01`` to ``q99``; camera features
(video and image) per channel, shaped ``(3, 1, 1)``, on pixels scaled to [0, 1].

An import keeps a dataset's ``meta/stats.json`` as it is, and computes here what it lacks
(:func:`computed_stats`) as LeRobot computes it: numeric features over every frame, camera
features over frames sampled from each episode (LeRobot's ``sample_indices``: 100 of a short
episode, ``length ** 0.75`` of a long one, at most 10,000), downsampled as LeRobot does. Both
stream: numbers a column of a data file at a time, in two passes (moments, then a histogram
over their range for the quantiles), frames a batch of one episode at a time.

Appends aggregate the stats of the datasets (:func:`aggregate_stats`), as LeRobot's merge does.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from blobhouse.errors import LeRobotDatasetError, VideoFrameError
from blobhouse.extras import require_pillow
from blobhouse.lerobot.folder import DatasetPath, readable

Stats = dict[str, dict[str, Any]]  # feature -> stat name -> nested lists of numbers

#: LeRobot's dtypes whose values are numbers
NUMERIC = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64", "bool"})
#: LeRobot's quantiles (``DEFAULT_QUANTILES``) by their names in ``stats.json``
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
#: the histogram a numeric feature's quantiles are read from (LeRobot's bins)
_BINS = 5000
#: frame rows read at once while sampling camera features (image features are PNGs in them)
_SAMPLE_ROWS = 512
#: frames of one video decoded at once
_DECODE_FRAMES = 16


class VideoFileLike(Protocol):
    key: str
    chunk: int
    file: int
    path: DatasetPath


class DatasetLike(Protocol):
    """What stats read of a dataset (a checked
    :class:`~blobhouse.lerobot.source.LeRobotSource`)."""

    info: Mapping[str, Any]
    video_keys: tuple[str, ...]
    image_keys: tuple[str, ...]
    episodes: pa.Table
    data_files: tuple[DatasetPath, ...]
    videos: Sequence[VideoFileLike]


def sample_offsets(length: int) -> np.ndarray:
    """The frames of an episode of ``length`` frames that camera stats sample (LeRobot's
    ``sample_indices``).

    >>> sample_offsets(5).tolist(), len(sample_offsets(1000)), len(sample_offsets(10**7))
    ([0, 1, 2, 3, 4], 177, 10000)
    """
    if length <= 0:
        return np.arange(0)
    count = max(min(100, length), min(int(length**0.75), 10_000))
    return np.unique(np.round(np.linspace(0, length - 1, count)).astype(np.int64))


def downsampled(frame: np.ndarray) -> np.ndarray:
    """A height x width x channels frame as LeRobot's stats see it
    (``auto_downsample_height_width``): every n-th pixel of a frame 300 pixels or more on a
    side, to about 150 on its longer side.

    >>> downsampled(np.zeros((480, 640, 3), np.uint8)).shape
    (120, 160, 3)
    """
    height, width = frame.shape[:2]
    if max(height, width) < 300:
        return frame
    step = int(width / 150) if width > height else int(height / 150)
    return frame[::step, ::step]


def computed_stats(source: DatasetLike, features: Iterable[str]) -> Stats:
    """The stats of ``features`` of the dataset ``source`` (the ones its ``stats.json`` lacks):
    numeric features over all its frames, camera features over sampled frames."""
    wanted = list(features)
    kinds = {key: source.info["features"][key]["dtype"] for key in wanted}
    stats = {key: numeric_stats(source.data_files, key) for key in wanted if kinds[key] in NUMERIC}
    cameras = [key for key in wanted if kinds[key] in ("image", "video")]
    if cameras:
        pixels = {key: _Pixels() for key in cameras}
        for key, frame in _sampled_frames(source, cameras):
            pixels[key].add(frame)
        stats.update({key: p.stats() for key, p in pixels.items() if p.frames})
    return {key: value for key, value in stats.items() if value is not None}


def numeric_stats(data_files: Iterable[DatasetPath], key: str) -> dict[str, list] | None:
    """The stats of numeric feature ``key`` over the frame rows of ``data_files`` (None: no
    rows), reading them twice a column at a time."""
    files = list(data_files)
    moments = _Moments()
    for values in _columns(files, key):
        moments.add(values)
    if not moments.count:
        return None
    histogram = _Histogram(moments.min, moments.max)
    for values in _columns(files, key):
        histogram.add(values)
    return {**moments.stats(), **histogram.quantiles(moments.count)}


def _columns(files: list[DatasetPath], key: str) -> Iterator[np.ndarray]:
    for path in files:
        try:
            column = pq.read_table(readable(path), columns=[key]).column(0)
        except (OSError, pa.ArrowException) as error:  # a damaged page
            raise LeRobotDatasetError(f"{path} cannot be read: {error}") from None
        yield _matrix(column)


def _matrix(column: pa.ChunkedArray) -> np.ndarray:
    """A column of numbers or fixed-size lists of numbers as rows x dimensions (float64)."""
    column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type):
        width = len(column[0]) if len(column) else 0
        values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
        return values.astype(np.float64).reshape(len(column), width)
    return column.to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, 1)


class _Moments:
    """count, sum, sum of squares, min and max per dimension, added a block at a time."""

    def __init__(self) -> None:
        self.count = 0
        self.sum = self.squares = self.min = self.max = None

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        low, high = values.min(axis=0), values.max(axis=0)
        if self.count == 0:
            self.sum, self.squares = values.sum(axis=0), (values**2).sum(axis=0)
            self.min, self.max = low, high
        else:
            self.sum = self.sum + values.sum(axis=0)
            self.squares = self.squares + (values**2).sum(axis=0)
            self.min, self.max = np.minimum(self.min, low), np.maximum(self.max, high)
        self.count += len(values)

    def stats(self) -> dict[str, list]:
        mean = self.sum / self.count
        std = np.sqrt(np.maximum(self.squares / self.count - mean**2, 0.0))
        return {
            "min": self.min.tolist(),
            "max": self.max.tolist(),
            "mean": mean.tolist(),
            "std": std.tolist(),
            "count": [self.count],
        }


class _Histogram:
    """Counts per dimension in :data:`_BINS` bins from its min to its max; quantiles read
    from them as LeRobot's ``RunningQuantileStats`` reads them (interpolated in the bin)."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        pairs = zip(low, high, strict=True)
        self.edges = [np.linspace(lo - 1e-10, hi + 1e-10, _BINS + 1) for lo, hi in pairs]
        self.counts = np.zeros((len(self.edges), _BINS))

    def add(self, values: np.ndarray) -> None:
        for dim, edges in enumerate(self.edges):
            self.counts[dim] += np.histogram(values[:, dim], bins=edges)[0]

    def quantiles(self, count: int) -> dict[str, list]:
        out = {}
        for name, q in QUANTILES.items():
            out[name] = [
                _quantile(counts, edges, q * count)
                for counts, edges in zip(self.counts, self.edges, strict=True)
            ]
        return out


def _quantile(counts: np.ndarray, edges: np.ndarray, target: float) -> float:
    cumulative = np.cumsum(counts)
    at = int(np.searchsorted(cumulative, target))
    if at == 0:
        return float(edges[0])
    if at >= len(cumulative):
        return float(edges[-1])
    before = cumulative[at - 1]
    inside = cumulative[at] - before
    if inside == 0:
        return float(edges[at])
    return float(edges[at] + (target - before) / inside * (edges[at + 1] - edges[at]))


class _Pixels:
    """A camera feature's sampled frames, as counts of each 8-bit value per channel: every
    stat of the pixels (scaled to [0, 1]) is exact from them."""

    def __init__(self) -> None:
        self.frames = 0
        self.counts: np.ndarray | None = None

    def add(self, frame: np.ndarray) -> None:
        frame = downsampled(frame)
        channels = frame.shape[2]
        if self.counts is None:
            self.counts = np.zeros((channels, 256), np.int64)
        for c in range(channels):
            self.counts[c] += np.bincount(frame[..., c].ravel(), minlength=256)
        self.frames += 1

    def stats(self) -> dict[str, list]:
        counts = self.counts
        levels = np.arange(256) / 255.0
        total = counts.sum(axis=1)
        mean = counts @ levels / total
        std = np.sqrt(np.maximum(counts @ levels**2 / total - mean**2, 0.0))
        held = counts > 0
        low = levels[held.argmax(axis=1)]
        high = levels[255 - held[:, ::-1].argmax(axis=1)]
        cumulative = np.cumsum(counts, axis=1)
        out = {"min": low, "max": high, "mean": mean, "std": std}
        for name, q in QUANTILES.items():
            at = [int(np.searchsorted(cumulative[c], q * total[c])) for c in range(len(counts))]
            out[name] = levels[np.minimum(at, 255)]
        shaped = {name: np.asarray(v).reshape(-1, 1, 1).tolist() for name, v in out.items()}
        return {**shaped, "count": [self.frames]}


def _sampled_frames(source: DatasetLike, cameras: list[str]) -> Iterator[tuple[str, np.ndarray]]:
    """``(camera, frame)`` for the frames camera stats sample of each episode: image
    features decoded from the data files' PNGs, video features from their files."""
    images = [key for key in cameras if key in source.image_keys]
    videos = [key for key in cameras if key in source.video_keys]
    if images:
        require_pillow(f"the stats of image features {images}")
    times: dict[int, list[np.ndarray]] = {}  # the sampled frames' times, per episode
    for episode, rows in _sampled_rows(source, images):
        for key in images:
            for data in rows.column(key).field("bytes").to_pylist():
                yield key, _png(data, key, episode)
        if videos:
            seconds = rows.column("timestamp").to_numpy(zero_copy_only=False)
            times.setdefault(episode, []).append(seconds.astype(np.float64))
    for key in videos:
        yield from ((key, frame) for frame in _video_frames(source, key, times))


def _sampled_rows(source: DatasetLike, images: list[str]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Per run of an episode's rows in the data files: its episode and the rows of it that
    stats sample (``timestamp`` and the image features)."""
    lengths = dict(
        zip(
            source.episodes["episode_index"].to_pylist(),
            source.episodes["length"].to_pylist(),
            strict=True,
        )
    )
    samples = {episode: sample_offsets(n) for episode, n in lengths.items()}
    seen: dict[int, int] = {}
    columns = ["episode_index", "timestamp", *images]
    for path in source.data_files:
        try:
            for batch in pq.ParquetFile(readable(path)).iter_batches(_SAMPLE_ROWS, columns=columns):
                episodes = batch.column("episode_index").to_numpy(zero_copy_only=False)
                cuts = np.flatnonzero(np.diff(episodes)) + 1
                for a, b in zip([0, *cuts], [*cuts, len(episodes)], strict=True):
                    episode = int(episodes[a])
                    first = seen.get(episode, 0)
                    seen[episode] = first + b - a
                    offsets = first + np.arange(b - a)
                    wanted = np.flatnonzero(np.isin(offsets, samples[episode]))
                    if len(wanted):
                        yield episode, batch.slice(a, b - a).take(pa.array(wanted))
        except (OSError, pa.ArrowException) as error:  # a damaged page
            raise LeRobotDatasetError(f"{path} cannot be read: {error}") from None


def _png(data: bytes | None, key: str, episode: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data or b"")) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as error:
        raise LeRobotDatasetError(
            f"image feature {key!r} of a frame of episode {episode} cannot be decoded: {error}"
        ) from None


def _video_frames(
    source: DatasetLike, key: str, times: Mapping[int, list[np.ndarray]]
) -> Iterator[np.ndarray]:
    """The frames of camera ``key`` at each episode's sampled ``times`` (seconds from the
    episode's start), a batch of one episode's at a time."""
    from blobhouse.read.video import decode_frames

    files = {(v.chunk, v.file): v.path for v in source.videos if v.key == key}
    prefix = f"videos/{key}"
    episodes = source.episodes
    where = zip(
        episodes["episode_index"].to_pylist(),
        episodes[f"{prefix}/chunk_index"].to_pylist(),
        episodes[f"{prefix}/file_index"].to_pylist(),
        episodes[f"{prefix}/from_timestamp"].to_pylist(),
        strict=True,
    )
    for episode, chunk, file, start in where:
        parts = times.get(episode)
        if not parts:
            continue
        wanted = np.sort(start + np.concatenate(parts)).tolist()
        path = files[(chunk, file)]
        for at in range(0, len(wanted), _DECODE_FRAMES):
            try:  # frames past a 4K frame's pixels are refused, as readers refuse them
                frames = decode_frames(readable(path), wanted[at : at + _DECODE_FRAMES])
            except VideoFrameError as error:
                raise LeRobotDatasetError(
                    f"{path}: the frames of episode {episode} that the stats of {key!r} "
                    f"sample cannot be decoded: {error}"
                ) from None
            yield from frames


def aggregate_stats(parts: Iterable[Stats]) -> Stats:
    """The stats of datasets taken together, from each one's (LeRobot's ``aggregate_stats``:
    counts added, means weighted by count, variances pooled, min of mins, max of maxes; other
    stats, such as quantiles, weighted by count). A feature some part has no stats for keeps
    none: stats of part of its frames would misdescribe it.

    >>> a = {"x": {"min": [0.0], "max": [2.0], "mean": [1.0], "std": [1.0], "count": [2]}}
    >>> b = {"x": {"min": [4.0], "max": [4.0], "mean": [4.0], "std": [0.0], "count": [2]}}
    >>> aggregate_stats([a, b])["x"]
    {'min': [0.0], 'max': [4.0], 'mean': [2.5], 'std': [1.6583123951777], 'count': [4]}
    """
    parts = list(parts)
    if len(parts) <= 1:
        return parts[0] if parts else {}
    merged: Stats = {}
    for key in set.intersection(*(set(p) for p in parts)):
        stats = [p[key] for p in parts]
        counts = np.array([float(np.asarray(s.get("count", [0])).sum()) for s in stats])
        if counts.sum() <= 0:
            continue
        weights = counts / counts.sum()
        names = [n for n in stats[0] if all(n in s for s in stats)]
        out: dict[str, Any] = {}
        means = [np.asarray(s["mean"], np.float64) for s in stats] if "mean" in names else []
        for name in (n for n in names if n != "count"):
            values = [np.asarray(s[name], np.float64) for s in stats]
            if name == "min":
                out[name] = np.minimum.reduce(values)
            elif name == "max":
                out[name] = np.maximum.reduce(values)
            elif name == "std" and means:
                mean = sum(w * m for w, m in zip(weights, means, strict=True))
                variance = sum(
                    w * (v**2 + (m - mean) ** 2)
                    for w, v, m in zip(weights, values, means, strict=True)
                )
                out[name] = np.sqrt(variance)
            else:
                out[name] = sum(w * v for w, v in zip(weights, values, strict=True))
        out = {name: np.asarray(value).tolist() for name, value in out.items()}
        out["count"] = [int(counts.sum())]
        merged[key] = out
    return merged
