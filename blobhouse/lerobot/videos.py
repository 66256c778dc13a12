"""A LeRobot dataset's video files, each checked against the episodes that use it before an
import writes anything: it opens as a video, its frames have the size ``meta/info.json``
declares, it is whole (the frames its index lists lie inside the file), its frames come at the
dataset's fps over every stretch an episode uses, and it decodes at the first and last frame
any episode needs (the frame of a row is at ``from_timestamp + timestamp``).

What is read is the file's index (an MP4's ``moov``: every frame's time, offset and size) and
the few frames around the two ends: not the whole file. A file that fails is named with its
camera and the episodes concerned (:class:`~blobhouse.errors.LeRobotDatasetError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blobhouse.errors import LeRobotDatasetError, VideoFrameError
from blobhouse.extras import require_av
from blobhouse.lerobot.folder import readable
from blobhouse.read.video import TOLERANCE_S, check_frames, seconds

#: how much longer than one frame (1 / fps) a step between two frames of the file may be
#: before the frames between are missing: half a frame, far above a container's rounding
_GAP = 1.5
#: frames an index's time may lag a frame's own (its decoding time: B-frames are decoded
#: before the frames they follow; x264 reorders up to 3): a gap is an episode's only when the
#: episode runs this far past it on both sides
_REORDER = 4


@dataclass(frozen=True)
class Segment:
    """The frames one episode needs from a video file: rows at ``start`` .. ``end`` seconds
    of the file (``from_timestamp`` plus the episode's first and last ``timestamp``)."""

    episode: int
    start: float
    end: float


@dataclass(frozen=True)
class VideoCheck:
    """What a video file is checked against: its path and camera, the dataset's ``fps`` and
    the frame size (width, height) ``meta/info.json`` declares for the camera, if it does."""

    path: Path
    camera: str
    fps: float
    size: tuple[int, int] | None

    def check(self, segments: Sequence[Segment]) -> None:
        """Refuse the file unless it holds every frame ``segments`` need (see the module).

        >>> import tempfile
        >>> from pathlib import Path
        >>> from blobhouse.read.video import encode_test_video
        >>> path = Path(tempfile.mkdtemp()) / "cam.mp4"
        >>> _ = path.write_bytes(encode_test_video(frames=10, fps=30, size=(16, 16)))
        >>> VideoCheck(path, "cam", 30.0, (16, 16)).check([Segment(0, 0.0, 9 / 30)])
        >>> VideoCheck(path, "cam", 30.0, (16, 16)).check([Segment(0, 0.0, 19 / 30)])
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        blobhouse.errors.LeRobotDatasetError: ...: episode 0 needs a frame at 0.600000 s ...
        """
        require_av("LeRobot imports of video files")
        segments = [s for s in segments if s.end >= s.start]  # episodes without frames: none
        if not segments:
            return
        self._check_index(segments)
        self._check_ends(segments)

    def _check_index(self, segments: list[Segment]) -> None:
        """Open the file: its stream, frame size, and the index of its frames."""
        import av

        try:
            container = av.open(readable(self.path))
        except (av.FFmpegError, OSError, ValueError) as error:
            raise self.error(
                segments,
                f"it cannot be opened as a video ({error}); it is truncated or not a video",
            ) from None
        with container:
            if not container.streams.video:
                raise self.error(segments, "it holds no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if self.size is not None and (width, height) != self.size:
                raise self.error(
                    segments,
                    f"its frames are {width}x{height} (width x height), but "
                    f"meta/info.json declares {self.size[0]}x{self.size[1]}",
                )
            self._check_frames_listed(stream, segments)

    def _check_frames_listed(self, stream: Any, segments: list[Segment]) -> None:
        """From the file's index: every frame it lists lies inside the file, and no stretch an
        episode uses lacks frames at the dataset's fps."""
        entries = stream.index_entries
        if len(entries) < 2:  # no index (not an MP4): the decoding of the ends checks it
            return
        base = float(stream.time_base)
        times = np.fromiter((e.timestamp for e in entries), np.float64, len(entries)) * base
        ends = np.fromiter((e.pos + e.size for e in entries), np.int64, len(entries))
        held = self.path.stat().st_size
        if ends.max() > held:
            lost = float(times[ends > held].min())
            cut = [s for s in segments if s.end >= lost - 1 / self.fps] or segments[-1:]
            raise self.error(
                cut,
                f"it is truncated: it holds {held:,} bytes, but its index places frames up to "
                f"byte {int(ends.max()):,} (its frames from {seconds(lost)} s on are missing)",
            )
        times.sort()  # decoding order may differ from time order
        steps = np.diff(times)
        for at in np.flatnonzero(steps > _GAP / self.fps):
            before, after = float(times[at]), float(times[at + 1])
            margin = _REORDER / self.fps
            inside = [s for s in segments if s.start < after - margin and s.end > before + margin]
            if inside:
                raise self.error(
                    inside[:1],
                    f"it has no frames between {seconds(before)} s and {seconds(after)} s, "
                    f"where episode {inside[0].episode} needs one every "
                    f"{seconds(1 / self.fps)} s (at {self.fps:g} fps)",
                )

    def _check_ends(self, segments: list[Segment]) -> None:
        """Decode the first frame any episode needs, and the last two (one frame apart at the
        dataset's fps): the frames are where the rows say, and the file decodes to its end."""
        first = min(segments, key=lambda s: s.start)
        last = max(segments, key=lambda s: s.end)
        ends = [(last.end, "its last frame row")]
        if last.end - 1 / self.fps >= last.start:
            ends.insert(
                0, (last.end - 1 / self.fps, f"the frame before its last at {self.fps:g} fps")
            )
        for segment, wanted in ((first, [(first.start, "its first frame row")]), (last, ends)):
            try:
                check_frames(
                    readable(self.path),
                    [time for time, _ in wanted],
                    tolerance_s=TOLERANCE_S,
                    label=lambda i, segment=segment, wanted=wanted: (
                        f"episode {segment.episode} needs a frame at {seconds(wanted[i][0])} s "
                        f"({wanted[i][1]})"
                    ),
                )
            except VideoFrameError as error:
                raise self.error([segment], str(error)) from None

    def error(self, segments: Sequence[Segment], problem: str) -> LeRobotDatasetError:
        """``problem`` of this file, named with its camera and the episodes concerned."""
        episodes = [s.episode for s in segments]
        which = (
            f"episode {episodes[0]}"
            if len(episodes) == 1
            else (f"episodes {', '.join(map(str, episodes))}")
        )
        return LeRobotDatasetError(
            f"{self.path} (camera {self.camera!r}, {which}): {problem}; nothing was imported"
        )
