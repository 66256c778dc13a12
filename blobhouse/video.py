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
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from blobhouse.errors import InvalidInputError, VideoFrameError
from blobhouse.extras import require_av
from blobhouse.kept_threads import KeptThreads

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


def decode_frames(
    chunk: bytes | memoryview | BinaryIO,
    timestamps: Sequence[float],
    *,
    tolerance_s: float = TOLERANCE_S,
) -> list[np.ndarray]:
    """The RGB frames (``uint8``, height x width x 3) of the video ``chunk`` (its bytes, or a
    seekable file over them, of which only what the frames need is read) at ``timestamps``
    (seconds), in the order asked; the chunk is decoded once, each frame at most once.

    >>> from blobhouse.video import encode_test_video
    >>> chunk = encode_test_video(frames=6, fps=30, size=(16, 16))
    >>> [f.shape for f in decode_frames(chunk, [2 / 30, 0.0])]
    [(16, 16, 3), (16, 16, 3)]
    """
    require_av()
    import av

    wanted = np.asarray(timestamps, dtype=np.float64)
    frames: list[Any] = [None] * len(wanted)
    if not len(wanted):
        return []
    try:
        source = io.BytesIO(chunk) if isinstance(chunk, (bytes, memoryview)) else chunk
        with av.open(source, mode="r") as container:
            if not container.streams.video:
                raise VideoFrameError("the chunk holds no video stream")
            stream = container.streams.video[0]
            stream.thread_count = DECODE_THREADS
            walk = _Walk(container, stream, tolerance_s)
            converted: dict[int, np.ndarray] = {}  # by pts: a frame asked twice is converted once
            for index in np.argsort(wanted, kind="stable"):
                frame = walk.frame_at(float(wanted[index]))
                if frame.pts not in converted:
                    converted[frame.pts] = frame.to_ndarray(format="rgb24")
                frames[index] = converted[frame.pts]
    except av.FFmpegError as error:
        raise VideoFrameError(f"the chunk cannot be decoded: {error}") from None
    return frames


class _Walk:
    """One pass through a chunk's frames in time order: it keeps the last two frames decoded
    (the closest one to a timestamp is one of them) and seeks over long gaps."""

    def __init__(self, container: Any, stream: Any, tolerance_s: float) -> None:
        self.container, self.stream, self.tolerance_s = container, stream, tolerance_s
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
            key=lambda f: abs(f.time - time),
        )
        if not abs(nearest.time - time) < self.tolerance_s:
            raise VideoFrameError(
                f"no frame at {time:.6f} s: the nearest is at {nearest.time:.6f} s, further than "
                f"the tolerance of {self.tolerance_s} s"
            )
        return nearest

    def _seek_gap(self) -> float:
        return _FIRST_SEEK_GAP_S if self.spacing is None else self.spacing

    def _seek(self, time: float) -> None:
        stream = self.stream
        target = int((time - self.tolerance_s) / stream.time_base) if time > 0 else 0
        self.container.seek(max(target, 0), stream=stream, backward=True, any_frame=False)
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
    >>> frames.columns, frames.timestamp_columns()
    ({'cam': 'cam_timestamp'}, ['cam_timestamp'])
    """

    columns: Mapping[str, str]  # video column -> its timestamp column
    layout: FrameLayout = "hwc"
    tolerance_s: float = TOLERANCE_S

    @classmethod
    def of(
        cls,
        frames: Sequence[str] | Mapping[str, str] | None,
        layout: object = "hwc",
        tolerance_s: object = TOLERANCE_S,
    ) -> VideoFrames | None:
        """The reader option ``frames``: None, video column names (timestamps in
        ``<column>_timestamp``), or a mapping from video column to timestamp column."""
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
        if layout not in FRAME_LAYOUTS:
            raise InvalidInputError(f"frame_layout must be one of {FRAME_LAYOUTS}, got {layout!r}")
        if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, (int, float)):
            raise InvalidInputError(f"tolerance_s must be a number, got {tolerance_s!r}")
        if not tolerance_s > 0:
            raise InvalidInputError(f"tolerance_s must be positive, got {tolerance_s!r}")
        require_av()
        return cls(columns, layout, float(tolerance_s))  # type: ignore[arg-type]

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

    def decode(self, rows: list[dict[str, Any]], open_chunk: ChunkOpener) -> list[dict[str, Any]]:
        """``rows`` (video columns as references ``{uri, position, size}``) with each video
        column's reference replaced by the frame at the row's timestamp: each distinct chunk
        is opened once (``open_chunk(column, reference, row)``, on this thread) and decoded
        once for all its rows; distinct chunks are decoded side by side (FFmpeg releases the
        GIL), on up to one thread per core."""
        jobs = []
        for column, timestamp in self.columns.items():
            chunks: dict[tuple, list[int]] = {}
            for position, row in enumerate(rows):
                ref = row[column]
                if ref is not None:
                    key = (ref["uri"], ref["position"], ref["size"])
                    chunks.setdefault(key, []).append(position)
            for positions in chunks.values():
                chunk = open_chunk(column, rows[positions[0]][column], positions[0])
                jobs.append((column, timestamp, chunk, positions))
        if len(jobs) == 1:
            self._decode_chunk(rows, *jobs[0])
        elif jobs:
            pool = _DECODERS.pool()
            for done in [pool.submit(self._decode_chunk, rows, *job) for job in jobs]:
                done.result()
        return rows

    def _decode_chunk(
        self,
        rows: list[dict[str, Any]],
        column: str,
        timestamp: str,
        chunk: bytes | BinaryIO,
        positions: list[int],
    ) -> None:
        times = [rows[p][timestamp] for p in positions]
        if any(t is None for t in times):
            raise VideoFrameError(
                f"column {timestamp!r} is null in a row whose {column!r} holds a chunk"
            )
        try:
            decoded = decode_frames(chunk, times, tolerance_s=self.tolerance_s)
        except VideoFrameError as error:
            raise VideoFrameError(f"video column {column!r}: {error}") from None
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
    with av.open(target, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        for image in images:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))


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
