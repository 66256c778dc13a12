"""A synthetic LeRobot v3 dataset, written in LeRobot's own layout without LeRobot: for the
examples, the tests and the benchmark on machines where ``lerobot`` cannot be installed.

Like LeRobot's recorder it encodes each camera's episodes back to back into shared MP4 files
(AV1 by default, a keyframe every 2 frames, ``yuv420p``: LeRobot's defaults), records where each
episode's segment starts (``videos/<camera>/from_timestamp``), and writes one frame row per
frame with a 6-dimensional state and action; image features (``images``) are PNGs in the frame
rows, as LeRobot keeps them (``struct<bytes, path>``).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blobhouse.extras import require_av, require_pillow
from blobhouse.read.video import encode_video

CAMERA = "observation.images.cam"
STATE_DIM = 6
TASKS = ("pick up the cube", "push the block to the goal")
#: the size of image features (LeRobot's ``dtype: image``): small, as a wrist snapshot or mask
IMAGE_SIZE = (24, 32)
#: image feature ``n`` shows what :func:`drawn_frame` draws for camera ``FIRST_IMAGE_CAMERA + n``
FIRST_IMAGE_CAMERA = 9
_PATH = "chunk-{chunk_index:03d}/file-{file_index:03d}"


def write_sample_dataset(
    root: str | os.PathLike,
    *,
    episodes: int = 4,
    frames: int = 60,
    cameras: Sequence[str] = (CAMERA,),
    images: Sequence[str] = (),
    size: tuple[int, int] = (96, 128),
    fps: int = 30,
    episodes_per_file: int = 2,
    codec: str = "libsvtav1",
    gop: int = 2,
    seed: int = 0,
) -> Path:
    """Write a LeRobot v3 dataset of ``episodes`` episodes of ``frames`` frames each into
    ``root`` (made if missing) and return its path. Each camera's video files hold
    ``episodes_per_file`` episodes each; each of ``images`` is an image feature of
    :data:`IMAGE_SIZE` PNGs.

    >>> import tempfile
    >>> root = write_sample_dataset(tempfile.mkdtemp(), episodes=3, frames=4, size=(16, 16))
    >>> sorted(p.name for p in (root / "videos" / CAMERA / "chunk-000").iterdir())
    ['file-000.mp4', 'file-001.mp4']
    """
    require_av("writing a sample LeRobot dataset")
    root = Path(root)
    rng = np.random.default_rng(seed)
    groups = [
        list(range(start, min(start + episodes_per_file, episodes)))
        for start in range(0, episodes, episodes_per_file)
    ]
    meta: dict[str, list] = {"episode_index": list(range(episodes))}
    for camera_number, camera in enumerate(cameras):
        starts = _write_videos(root, camera, groups, frames, size, fps, codec, gop, camera_number)
        meta[f"videos/{camera}/chunk_index"] = [0] * episodes
        meta[f"videos/{camera}/file_index"] = [g for g, group in enumerate(groups) for _ in group]
        meta[f"videos/{camera}/from_timestamp"] = starts
        meta[f"videos/{camera}/to_timestamp"] = [s + frames / fps for s in starts]
    _write_frames(root, groups, frames, fps, rng, images)
    meta.update(
        {
            "tasks": [[TASKS[e % len(TASKS)]] for e in range(episodes)],
            "length": [frames] * episodes,
            "data/chunk_index": [0] * episodes,
            "data/file_index": [g for g, group in enumerate(groups) for _ in group],
            "dataset_from_index": [e * frames for e in range(episodes)],
            "dataset_to_index": [(e + 1) * frames for e in range(episodes)],
            "meta/episodes/chunk_index": [0] * episodes,
            "meta/episodes/file_index": [0] * episodes,
        }
    )
    _write_parquet(
        root / "meta/episodes" / f"{_PATH.format(chunk_index=0, file_index=0)}.parquet",
        pa.table(meta),
    )
    tasks = pd.DataFrame({"task_index": range(len(TASKS))}, index=list(TASKS))
    tasks.to_parquet(root / "meta/tasks.parquet")
    _write_info(root, episodes, frames, cameras, images, size, fps, codec)
    return root


def _write_videos(
    root: Path,
    camera: str,
    groups: list[list[int]],
    frames: int,
    size: tuple[int, int],
    fps: int,
    codec: str,
    gop: int,
    camera_number: int,
) -> list[float]:
    """One MP4 per group of episodes, back to back; each episode's start in its file."""
    starts: list[float] = []
    for file_index, group in enumerate(groups):
        path = (
            root / "videos" / camera / f"{_PATH.format(chunk_index=0, file_index=file_index)}.mp4"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        starts += [position * frames / fps for position in range(len(group))]
        images = (
            drawn_frame(size, episode, frame, camera_number)
            for episode in group
            for frame in range(frames)
        )
        encode_video(str(path), images, fps=fps, size=size, codec=codec, gop=gop)
    return starts


def drawn_frame(size: tuple[int, int], episode: int, frame: int, camera: int) -> np.ndarray:
    """What camera number ``camera`` sees at ``frame`` of ``episode`` (height x width x 3,
    ``uint8``): a smooth scene with a moving block, which compresses like camera footage, not
    noise.

    >>> drawn_frame((16, 16), episode=0, frame=3, camera=1).shape
    (16, 16, 3)
    """
    height, width = size
    y, x = np.mgrid[0:height, 0:width]
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (x * 255 // max(width - 1, 1) + 37 * episode) % 256
    image[..., 1] = (y * 255 // max(height - 1, 1) + 11 * camera) % 256
    image[..., 2] = (x + y + 3 * frame) % 256
    top, left = (frame * 2) % max(height - 8, 1), (frame * 3 + episode * 5) % max(width - 8, 1)
    image[top : top + 8, left : left + 8] = (255, 255 - 20 * camera, 0)
    return image


def _write_frames(
    root: Path,
    groups: list[list[int]],
    frames: int,
    fps: int,
    rng: np.random.Generator,
    images: Sequence[str],
) -> None:
    for file_index, group in enumerate(groups):
        count = frames * len(group)
        episode = np.repeat(group, frames)
        frame = np.tile(np.arange(frames), len(group))
        table = pa.table(
            {
                **{
                    key: _pngs(
                        episode, frame, FIRST_IMAGE_CAMERA + number, episode * frames + frame
                    )
                    for number, key in enumerate(images)
                },
                "observation.state": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(count * STATE_DIM, np.float32)), STATE_DIM
                ),
                "action": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(count * STATE_DIM, np.float32)), STATE_DIM
                ),
                "timestamp": pa.array((frame / fps).astype(np.float32)),
                "frame_index": pa.array(frame, pa.int64()),
                "episode_index": pa.array(episode, pa.int64()),
                "index": pa.array(episode * frames + frame, pa.int64()),
                "task_index": pa.array(episode % len(TASKS), pa.int64()),
            }
        )
        _write_parquet(
            root / "data" / f"{_PATH.format(chunk_index=0, file_index=file_index)}.parquet", table
        )


def _pngs(episode: np.ndarray, frame: np.ndarray, camera: int, index: np.ndarray) -> pa.Array:
    """An image feature's column: each frame's PNG and its name, as LeRobot writes them."""
    require_pillow("a sample dataset's image features")
    from PIL import Image

    data = []
    for e, f in zip(episode.tolist(), frame.tolist(), strict=True):
        out = io.BytesIO()
        Image.fromarray(drawn_frame(IMAGE_SIZE, e, f, camera)).save(out, format="PNG")
        data.append(out.getvalue())
    paths = [f"frame_{i:06d}.png" for i in index.tolist()]
    return pa.StructArray.from_arrays(
        [pa.array(data, pa.binary()), pa.array(paths, pa.string())], ["bytes", "path"]
    )


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_info(
    root: Path,
    episodes: int,
    frames: int,
    cameras: Sequence[str],
    images: Sequence[str],
    size: tuple[int, int],
    fps: int,
    codec: str,
) -> None:
    one = {"dtype": None, "shape": [1], "names": None}
    features = {
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
        "action": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
        "timestamp": {**one, "dtype": "float32"},
        "frame_index": {**one, "dtype": "int64"},
        "episode_index": {**one, "dtype": "int64"},
        "index": {**one, "dtype": "int64"},
        "task_index": {**one, "dtype": "int64"},
    }
    for camera in cameras:
        features[camera] = {
            "dtype": "video",
            "shape": [size[0], size[1], 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": size[0],
                "video.width": size[1],
                "video.codec": {"libsvtav1": "av1"}.get(codec, codec),
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for key in images:
        features[key] = {
            "dtype": "image",
            "shape": [*IMAGE_SIZE, 3],
            "names": ["height", "width", "channels"],
        }
    info = {
        "codebase_version": "v3.0",
        "robot_type": "sample",
        "total_episodes": episodes,
        "total_frames": episodes * frames,
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": fps,
        "splits": {"train": f"0:{episodes}"},
        "data_path": "data/" + _PATH + ".parquet",
        "video_path": "videos/{video_key}/" + _PATH + ".mp4",
        "features": features,
    }
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
