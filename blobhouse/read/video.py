"""Decoded video frames for rows that reference a shared video chunk (``pip install
"blobhouse[video]"``).

A robot-learning table (LeRobot's layout, :mod:`blobhouse.lerobot`) has one row per camera frame:
a blob column holding the video chunk (an MP4 that hundreds of rows share, stored once) and a
column with the frame's timestamp in it. A training reader wants the frame, not the chunk.
LeRobot's own dataset decodes per row: a batch of 64 rows of one chunk opens, seeks and
decodes that chunk up to 64 times. :class:`VideoFrames` works per batch instead: the loader
opens each distinct chunk of a batch once (a seekable file over its stored range: only the
parts the frames need are read), and :func:`decode_frames` decodes it once, in timestamp
order, each frame at most once, up to the last one asked for. Between two timestamps further
apart than the chunk's keyframe spacing it seeks instead of decoding what lies between.

A frame is the one whose time (``pts * time_base``) is closest to the row's timestamp and
within ``tolerance_s`` of it (1e-4 s, LeRobot's default), converted to RGB by FFmpeg
(``rgb24``): the same pixels LeRobot's PyAV backend returns, as ``uint8``.

Decoding is bounded: a chunk whose frames have more than ``max_frame_pixels`` pixels (by
default a 4K frame's, 3840 x 2160) is refused from its stream's header, before a frame is
decoded (a 16 KB MP4 can hold 4096 x 4096 frames: 50 MB each once converted).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from blobhouse.errors import InvalidInputError, VideoFrameError
from blobhouse.extras import require_av
from blobhouse.io.kept_threads import KeptThreads
from blobhouse.settings import SETTINGS

FrameLayout = Literal["hwc", "chw"]
FRAME_LAYOUTS = ("hwc", "chw")
#: how far (seconds) a frame's time may be from the timestamp asked for: LeRobot's default
TOLERANCE_S = 1e-4
#: the timestamp column of video column ``c`` is ``c + TIMESTAMP_SUFFIX`` unless named
TIMESTAMP_SUFFIX = "_timestamp"
#: FFmpeg's decoding threads per chunk. One: the parallelism is the DataLoader's workers and the
#: loader's reading threads. 64 frames of 240x320 AV1 (dav1d) on this 2-core machine: 48-68 ms
#: on one thread, 45-58 ms with FFmpeg's default (a thread per core) when nothing else ran, but
#: 44 against 213 ms while another process was busy, as DataLoader workers are. torchcodec,
#: LeRobot's decoder, also decodes on one thread by default
DECODE_THREADS = 1
#: the threads that decode a batch's distinct chunks side by side
_DECODERS = KeptThreads(os.cpu_count() or 1, "blobhouse-video")
#: before the walk has seen two keyframes, timestamps further apart than this seek
_FIRST_SEEK_GAP_S = 1.0
#: the most pixels a decoded frame may have unless a reader's ``max_frame_pixels`` says
#: otherwise: a 4K frame's (3840 x 2160), above what robot cameras record
MAX_FRAME_PIXELS: int = SETTINGS["max_frame_pixels"].default
#: a seek target past this (in the stream's time base) is a seek to the end: FFmpeg takes a
#: 64-bit timestamp, and a row's timestamp of 3e38 s would not fit
_LAST_PTS = 2**62


def decode_frames(
    chunk: bytes | memoryview | BinaryIO,
    timestamps: Sequence[float],
    *,
    tolerance_s: float = TOLERANCE_S,
    max_frame_pixels: int | None = MAX_FRAME_PIXELS,
    label: Callable[[int], str] | None = None,
) -> list[np.ndarray]:
    """The RGB frames (``uint8``, height x width x 3) of the video ``chunk`` (its bytes, or a
    seekable file over them, of which only what the frames need is read) at ``timestamps``
    (seconds), in the order asked; the chunk is decoded once, each frame at most once. Frames
    of more than ``max_frame_pixels`` pixels (None: any size) are refused before decoding;
    ``label(i)`` names timestamp ``i`` in errors (a row, say).

    >>> from blobhouse.read.video import encode_test_video
    >>> chunk = encode_test_video(frames=6, fps=30, size=(16, 16))
    >>> [f.shape for f in decode_frames(chunk, [2 / 30, 0.0])]
    [(16, 16, 3), (16, 16, 3)]
    >>> decode_frames(chunk, [0.0], max_frame_pixels=100)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    blobhouse.errors.VideoFrameError: its frames are 16x16 (... 256 pixels), more than ...
    """
    require_av()
    from av.video.reformatter import VideoReformatter

    converted: dict[int, np.ndarray] = {}  # by pts: a frame asked twice is converted once

    # one converter for the chunk: frame.to_ndarray makes a new one (an FFmpeg scaling context)
    # per frame, which cost more than decoding the frame (240 x 320 AV1: 0.29 ms against
    # 0.19 ms; 0.07 ms with the context kept), for the same pixels
    reformatter = VideoReformatter()

    def convert(frame: Any) -> np.ndarray:
        if frame.pts not in converted:
            converted[frame.pts] = reformatter.reformat(frame, format="rgb24").to_ndarray()
        return converted[frame.pts]

    return _frames_at(chunk, timestamps, tolerance_s, max_frame_pixels, label, convert)


def check_frames(
    chunk: str | os.PathLike | BinaryIO,
    timestamps: Sequence[float],
    *,
    tolerance_s: float,
    label: Callable[[int], str] | None = None,
) -> None:
    """Raise :class:`~blobhouse.errors.VideoFrameError` unless the video ``chunk`` (a path,
    or a seekable file) decodes a frame within ``tolerance_s`` of each of ``timestamps``: the
    frames are decoded, not converted (what an import checks of a video file). ``label(i)``
    names timestamp ``i`` in errors.

    >>> import io
    >>> from blobhouse.read.video import encode_test_video
    >>> check_frames(io.BytesIO(encode_test_video(frames=6, fps=30, size=(16, 16))), [0.5],
    ...              tolerance_s=1e-4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    blobhouse.errors.VideoFrameError: no frame at 0.500000 s: the nearest is at 0.166667 s, ...
    """
    source = os.fspath(chunk) if isinstance(chunk, (str, os.PathLike)) else chunk
    _frames_at(source, timestamps, tolerance_s, None, label, lambda frame: None)


def _frames_at(
    chunk: bytes | memoryview | str | BinaryIO,
    timestamps: Sequence[float],
    tolerance_s: float,
    max_frame_pixels: int | None,
    label: Callable[[int], str] | None,
    keep: Callable[[Any], Any],
) -> list[Any]:
    """``keep(frame)`` of the frame at each of ``timestamps``, in the order asked."""
    require_av()
    import av

    given = np.asarray(timestamps)
    if not len(given):
        return []
    if given.dtype.kind not in "iuf":  # strings, None, bools: no frame has such a time
        index = next(i for i, t in enumerate(timestamps) if not _is_seconds(t))
        raise VideoFrameError(
            f"{_named(label, index)}timestamps must be numbers of seconds, "
            f"got {timestamps[index]!r}"
        )
    wanted = given.astype(np.float64)
    frames: list[Any] = [None] * len(wanted)
    if not np.isfinite(wanted).all():  # NaN or infinite: no frame has such a time
        index = int(np.argmin(np.isfinite(wanted)))
        raise VideoFrameError(
            f"{_named(label, index)}the timestamp is {float(wanted[index])!r}: a frame's time "
            "must be a finite number of seconds"
        )
    try:
        source = io.BytesIO(chunk) if isinstance(chunk, (bytes, memoryview)) else chunk
        with av.open(source, mode="r") as container:
            if not container.streams.video:
                raise VideoFrameError("the chunk holds no video stream")
            stream = container.streams.video[0]
            stream.thread_count = DECODE_THREADS
            context = stream.codec_context
            check_frame_size(context.width, context.height, max_frame_pixels)
            walk = _Walk(container, stream, tolerance_s, max_frame_pixels)
            for index in np.argsort(wanted, kind="stable"):
                try:
                    frame = walk.frame_at(float(wanted[index]))
                except VideoFrameError as error:
                    raise VideoFrameError(f"{_named(label, int(index))}{error}") from None
                frames[index] = keep(frame)
    except av.FFmpegError as error:
        raise VideoFrameError(f"the chunk cannot be decoded: {error}") from None
    return frames


def _is_seconds(value: object) -> bool:
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.number))


def _named(label: Callable[[int], str] | None, index: int) -> str:
    return "" if label is None else f"{label(index)}: "


def check_frame_size(width: int, height: int, max_frame_pixels: int | None) -> None:
    """Refuse frames of ``width`` x ``height`` with more than ``max_frame_pixels`` pixels.

    >>> check_frame_size(4096, 4096, MAX_FRAME_PIXELS)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    blobhouse.errors.VideoFrameError: its frames are 4096x4096 (... max_frame_pixels=8,294,400 ...
    """
    if max_frame_pixels is not None and width * height > max_frame_pixels:
        raise VideoFrameError(
            f"its frames are {width}x{height} (width x height: {width * height:,} pixels), "
            f"more than max_frame_pixels={max_frame_pixels:,} (a reader's max_frame_pixels "
            "option raises the bound)"
        )


def seconds(time: float) -> str:
    """A time for a message: six decimals, or a power of ten when that would be long.

    >>> seconds(59 / 30), seconds(3e38)
    ('1.966667', '3e+38')
    """
    return f"{time:.6f}" if abs(time) < 1e9 else f"{time:.6g}"


class _Walk:
    """One pass through a chunk's frames in time order: it keeps the last two frames decoded
    (the closest one to a timestamp is one of them) and seeks over long gaps."""

    def __init__(
        self, container: Any, stream: Any, tolerance_s: float, max_frame_pixels: int | None
    ) -> None:
        self.container, self.stream, self.tolerance_s = container, stream, tolerance_s
        self.max_frame_pixels = max_frame_pixels
        self.frames: Any = None  # the decoding iterator since the last seek
        self.previous: Any = None
        self.current: Any = None
        self.ended = False
        # the widest gap between two keyframes decoded one after the other: a wanted frame
        # further ahead than this is reached faster by a seek
        self.spacing: float | None = None
        self.last_keyframe: float | None = None  # of the current run (since the last seek)

    def frame_at(self, time: float) -> Any:
        if self.current is None or time - self.current.time > self._seek_gap():
            self._seek(time)
        while not self.ended and self.current.time < time:
            self._advance()
        nearest = min(
            (f for f in (self.previous, self.current) if f is not None),
            key=lambda f: (abs(f.time - time), -f.time),  # a tie (3e38 s away): the later
        )
        if not abs(nearest.time - time) < self.tolerance_s:
            raise VideoFrameError(
                f"no frame at {seconds(time)} s: the nearest is at {seconds(nearest.time)} s, "
                f"further than the tolerance of {self.tolerance_s} s"
            )
        return nearest

    def _seek_gap(self) -> float:
        return _FIRST_SEEK_GAP_S if self.spacing is None else self.spacing

    def _seek(self, time: float) -> None:
        stream = self.stream
        target = int((time - self.tolerance_s) / stream.time_base) if time > 0 else 0
        target = min(max(target, 0), _LAST_PTS)
        self.container.seek(target, stream=stream, backward=True, any_frame=False)
        self._restart()
        if self.current is not None and self.current.time > time + self.tolerance_s:
            # the container's index put the keyframe after the time: decode from the start
            self.container.seek(0, stream=stream, backward=True, any_frame=False)
            self._restart()

    def _restart(self) -> None:
        self.frames = self.container.decode(self.stream)
        self.previous = self.current = self.last_keyframe = None
        self.ended = False
        self._advance()
        if self.current is None:
            raise VideoFrameError("the chunk holds no frames")

    def _advance(self) -> None:
        frame = next(self.frames, None)
        while frame is not None and frame.time is None:  # no timestamp: not addressable
            frame = next(self.frames, None)
        if frame is None:
            self.ended = True
            return
        # the header's size bounds the first frame; a stream may change size on the way
        check_frame_size(frame.width, frame.height, self.max_frame_pixels)
        if frame.key_frame:
            if self.last_keyframe is not None and frame.time > self.last_keyframe:
                self.spacing = max(self.spacing or 0.0, frame.time - self.last_keyframe)
            self.last_keyframe = frame.time
        self.previous, self.current = self.current, frame


@dataclass(frozen=True)
class VideoFrames:
    """Which blob columns a reader decodes into frames, where their timestamps are, and the
    frames' layout (``"hwc"``: height x width x channels, ``"chw"``: channels first).

    >>> frames = VideoFrames.of(["cam"], "chw")
    >>> frames.columns, frames.timestamp_columns(), frames.max_frame_pixels
    ({'cam': 'cam_timestamp'}, ['cam_timestamp'], 8294400)
    """

    columns: Mapping[str, str]  # video column -> its timestamp column
    layout: FrameLayout = "hwc"
    tolerance_s: float = TOLERANCE_S
    max_frame_pixels: int = MAX_FRAME_PIXELS

    @classmethod
    def of(
        cls,
        frames: Sequence[str] | Mapping[str, str] | None,
        layout: object = "hwc",
        tolerance_s: object = TOLERANCE_S,
        max_frame_pixels: object = MAX_FRAME_PIXELS,
    ) -> VideoFrames | None:
        """The reader options ``frames`` (None, video column names, timestamps in
        ``<column>_timestamp``, or a mapping from video column to timestamp column),
        ``frame_layout`` and ``max_frame_pixels``, checked."""
        pixels = SETTINGS["max_frame_pixels"].check(max_frame_pixels)  # frames or not
        if layout not in FRAME_LAYOUTS:
            raise InvalidInputError(f"frame_layout must be one of {FRAME_LAYOUTS}, got {layout!r}")
        if frames is None:
            return None
        if isinstance(frames, str):
            raise InvalidInputError(f"frames must be a list of column names, got {frames!r}")
        if isinstance(frames, Mapping):
            columns = dict(frames)
        elif isinstance(frames, Sequence):
            if not all(isinstance(c, str) for c in frames):
                raise InvalidInputError(f"frames must be a list of column names, got {frames!r}")
            columns = {c: f"{c}{TIMESTAMP_SUFFIX}" for c in frames}
        else:
            raise InvalidInputError(
                f"frames must be column names or a mapping of column to timestamp column, "
                f"got {frames!r}"
            )
        for name, timestamp in columns.items():
            if not isinstance(name, str) or not isinstance(timestamp, str):
                raise InvalidInputError(
                    f"frames names columns by string, got {name!r}: {timestamp!r}"
                )
        if not columns:
            raise InvalidInputError("frames names no column")
        if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, (int, float)):
            raise InvalidInputError(f"tolerance_s must be a number, got {tolerance_s!r}")
        if not tolerance_s > 0:
            raise InvalidInputError(f"tolerance_s must be positive, got {tolerance_s!r}")
        require_av()
        return cls(columns, layout, float(tolerance_s), pixels)  # type: ignore[arg-type]

    def timestamp_columns(self) -> list[str]:
        return list(self.columns.values())

    def read_columns(self, columns: list[str] | None) -> list[str] | None:
        """The columns a take reads: ``columns`` plus the video and timestamp columns."""
        if columns is None:
            return None
        extra = [c for pair in self.columns.items() for c in pair if c not in columns]
        return columns + list(dict.fromkeys(extra))

    def check(self, names: Sequence[str]) -> None:
        """Refuse a video or timestamp column the table lacks."""
        for column, timestamp in self.columns.items():
            for name, what in ((column, "video"), (timestamp, f"timestamp of {column!r}")):
                if name not in names:
                    raise InvalidInputError(
                        f"frames: the {what} column {name!r} is not in the table "
                        f"(its columns: {list(names)})"
                    )

    def decode(
        self,
        rows: list[dict[str, Any]],
        open_chunk: ChunkOpener,
        row_name: Callable[[int], str] = lambda position: f"row {position} of the batch",
    ) -> list[dict[str, Any]]:
        """``rows`` (video columns as references ``{uri, position, size}``) with each video
        column's reference replaced by the frame at the row's timestamp: each distinct chunk
        is opened once (``open_chunk(column, reference, row)``, on this thread) and decoded
        once for all its rows; distinct chunks are decoded side by side (FFmpeg releases the
        GIL), on up to one thread per core. Errors name the column, the row (``row_name`` of
        its position in ``rows``) and the chunk."""
        jobs = []
        for column, timestamp in self.columns.items():
            chunks: dict[tuple, list[int]] = {}
            for position, row in enumerate(rows):
                ref = row[column]
                if ref is not None:
                    key = (ref["uri"], ref["position"], ref["size"])
                    chunks.setdefault(key, []).append(position)
            for key, positions in chunks.items():
                chunk = open_chunk(column, rows[positions[0]][column], positions[0])
                jobs.append((column, timestamp, key, chunk, positions))
        decode = functools.partial(self._decode_chunk, rows, row_name)
        if len(jobs) == 1:
            decode(*jobs[0])
        elif jobs:
            pool = _DECODERS.pool()
            for done in [pool.submit(decode, *job) for job in jobs]:
                done.result()
        return rows

    def _decode_chunk(
        self,
        rows: list[dict[str, Any]],
        row_name: Callable[[int], str],
        column: str,
        timestamp: str,
        key: tuple[str, int, int],
        chunk: bytes | BinaryIO,
        positions: list[int],
    ) -> None:
        times = [rows[p][timestamp] for p in positions]
        where = f"video column {column!r}"
        try:
            for position, time in zip(positions, times, strict=True):
                if not _is_seconds(time):
                    what = "is null" if time is None else f"holds {time!r}, not a number of seconds"
                    raise VideoFrameError(
                        f"{where}, {row_name(position)}: its timestamp column {timestamp!r} {what}"
                    )
            try:
                decoded = decode_frames(
                    chunk,
                    times,
                    tolerance_s=self.tolerance_s,
                    max_frame_pixels=self.max_frame_pixels,
                    label=lambda i: f"{row_name(positions[i])}, {timestamp} {times[i]!r}",
                )
            except VideoFrameError as error:
                uri, position, size = key
                raise VideoFrameError(
                    f"{where} (the chunk at {uri} [{position}, +{size}), first in "
                    f"{row_name(positions[0])}): {error}"
                ) from None
        finally:
            if not isinstance(chunk, (bytes, memoryview)):
                chunk.close()
        for position, frame in zip(positions, decoded, strict=True):
            rows[position][column] = frame if self.layout == "hwc" else frame.transpose(2, 0, 1)


#: what a reader hands :meth:`VideoFrames.decode` to get a chunk's bytes, or a seekable file
#: over them: ``(column, reference, row position in the batch)``
ChunkOpener = Callable[[str, Mapping[str, Any], int], "bytes | BinaryIO"]


def encode_video(
    target: str | BinaryIO,
    images: Iterable[np.ndarray],
    *,
    fps: int,
    size: tuple[int, int],
    codec: str = "libsvtav1",
    gop: int = 2,
) -> None:
    """Write ``images`` (RGB ``uint8``, height x width = ``size``) as an MP4 to ``target`` (a
    path or a file): ``libsvtav1`` (AV1) with a keyframe every 2 frames, in ``yuv420p``, is
    what LeRobot writes by default."""
    require_av()
    import av

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its settings otherwise
    with _scheduling_kept(), av.open(target, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        for image in images:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))


@contextlib.contextmanager
def _scheduling_kept() -> Iterator[None]:
    """SVT-AV1's encoder, run as root, makes the calling thread real-time (SCHED_FIFO 99):
    every process it starts afterwards (Spark's JVM) inherits that, and one spinning starves
    the machine. The thread's scheduling is put back as it was."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, policy, param)


def encode_test_video(
    frames: int, fps: int, size: tuple[int, int], *, codec: str = "libsvtav1", gop: int = 2
) -> bytes:
    """An MP4 of ``frames`` random-noise frames (height, width = ``size``): for examples and
    tests."""
    rng = np.random.default_rng(0)
    noise = (rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(frames))
    out = io.BytesIO()
    encode_video(out, noise, fps=fps, size=size, codec=codec, gop=gop)
    return out.getvalue()
