"""The ``robot_video`` case: a LeRobot dataset read for training, by LeRobot itself and by
blobhouse, frame for frame.

The dataset is made with LeRobot's own recorder API when ``.venv-lerobot`` exists
(``bench/lerobot_env/install.sh``), else written in LeRobot's layout by
:mod:`blobhouse.lerobot.sample`. It is imported with ``ingest_lerobot`` (bytes on disk against
the dataset's), then both read the same batches of 64 row indices through a torch DataLoader
(``batch_sampler``), at each worker count: LeRobot's ``LeRobotDataset`` (a row at a time, each
frame decoded by seeking into its video file with torchcodec) and blobhouse's
``TableRowDataset(frames=...)`` (a batch at a time, each distinct video file of the batch opened
and decoded once). Two orders: batches drawn from chunk windows (64 consecutive frames, the
windows shuffled: ``shuffle_window=64``) and fully random batches. Workers persist between
rounds and a warm-up round goes first, so worker start-up is not timed; the video files are in
the page cache (decoding, not the disk, is what either reader waits for). Frames are compared
pixel for pixel: blobhouse's against a full decode of the source files, and against LeRobot's
(its float32 / 255 turned back into ``uint8``).
"""

from __future__ import annotations

import io
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
from torch.utils.data import DataLoader

from bench.harness import Case, Scratch, Size, disk_bytes
from blobhouse.lerobot import LeRobotSource, column_name, ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset
from blobhouse.loader import EpochPlan
from blobhouse.torch import TableRowDataset, collate_rows

ROOT = Path(__file__).resolve().parent.parent
LEROBOT_PYTHON = ROOT / ".venv-lerobot" / "bin" / "python"
LEROBOT_READY = ROOT / ".venv-lerobot" / ".ready"  # install.sh finished
LEROBOT_SIDE = ROOT / "bench" / "lerobot_env" / "lerobot_side.py"
BATCH = 64
PRELOAD = [
    "torch", "av", "blobhouse.torch", "blobhouse.read.video", "blobhouse.lerobot.dataset"
]  # fmt: skip


def robot_video(size: Size) -> Case:
    case = Case(
        "robot_video",
        "A LeRobot dataset (30 fps camera frames sharing AV1 video files) read in batches of "
        f"{BATCH}: LeRobot's LeRobotDataset against blobhouse's TableRowDataset(frames=...), "
        "same batches, same DataLoader, frames compared pixel for pixel",
    )
    lerobot = LEROBOT_READY.exists()
    with Scratch() as root:
        dataset = root / "dataset"
        made = make_dataset(dataset, size, lerobot)
        started = time.perf_counter()
        done = ingest_lerobot(dataset, str(root / "table"))
        seconds = time.perf_counter() - started
        cameras = list(done.cameras)
        shape = DatasetShape.of(size)
        _bytes_row(case, dataset, root / "table", made, _described(shape), done, seconds)
        small = root / "small"
        made_small = make_dataset(small, SMALL, lerobot)
        started = time.perf_counter()
        small_done = ingest_lerobot(small, str(root / "small_table"))
        seconds = time.perf_counter() - started
        _bytes_row(case, small, root / "small_table", made_small, _described(SMALL), small_done,
                   seconds)  # fmt: skip
        plan = batch_plan(done.frames, size.robot_batches, size.runs, size.loader_workers)
        (root / "plan.json").write_text(json.dumps(plan))
        table = str(root / "table")
        ours = _blobhouse_rates(table, cameras, plan)
        check = np.asarray(plan["check"])
        frames = TableRowDataset(table, ["index"], frames=cameras, frame_layout="chw")
        got = frames.__getitems__(check.tolist())
        source = _reference(dataset, cameras, check)
        case.add(
            metric="frames_equal_to_source",
            rows=len(check),
            equal=all(
                np.array_equal(row[c], source[c][i]) for i, row in enumerate(got) for c in cameras
            ),
        )
        theirs = _lerobot_rates(dataset, root, plan, got, cameras) if lerobot else None
    for key, rate in ours.items():
        row = case.add(metric="frames_per_s", order=key[0], workers=key[1], blobhouse=round(rate))
        if theirs is not None:
            lerobot_rate = theirs["rates"][key]
            row.update(lerobot=round(lerobot_rate), vs_lerobot=round(rate / lerobot_rate, 3))
    if theirs is not None:
        case.add(metric="frames_equal_to_lerobot", **theirs["equality"], **theirs["about"])
    else:
        case.notes.append(
            "LeRobot is not installed here (bench/lerobot_env/install.sh makes .venv-lerobot): "
            "blobhouse alone was measured, on a dataset written in LeRobot's layout"
        )
    return case


@dataclass(frozen=True)
class DatasetShape:
    """The dataset a case makes: episodes of frames, cameras of an image size, a codec."""

    episodes: int
    frames: int
    image: tuple[int, int]
    cameras: int
    vcodec: str = "libsvtav1"  # LeRobot's default (AV1)

    @classmethod
    def of(cls, size: Size) -> DatasetShape:
        return cls(size.robot_episodes, size.robot_frames, size.robot_image, size.robot_cameras)


#: a small, low-resolution, highly compressible dataset: where a row's own bytes weigh most
SMALL = DatasetShape(episodes=10, frames=90, image=(48, 64), cameras=2, vcodec="h264")


def make_dataset(dataset: Path, size: Size | DatasetShape, lerobot: bool) -> str:
    shape = size if isinstance(size, DatasetShape) else DatasetShape.of(size)
    height, width = shape.image
    if lerobot:
        subprocess.run(
            [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "make", str(dataset),
             f"--episodes={shape.episodes}", f"--frames={shape.frames}",
             f"--height={height}", f"--width={width}", f"--cameras={shape.cameras}",
             f"--vcodec={shape.vcodec}"],
            check=True, capture_output=True,
        )  # fmt: skip
        return "lerobot"
    write_sample_dataset(
        dataset,
        episodes=shape.episodes,
        frames=shape.frames,
        cameras=[f"observation.images.cam{c}" for c in range(shape.cameras)],
        size=(height, width),
        codec={"h264": "libx264"}.get(shape.vcodec, shape.vcodec),
        episodes_per_file=shape.episodes,  # LeRobot fills a file up to 200 MB
    )
    return "blobhouse.lerobot.sample"


def _bytes_row(
    case: Case, dataset: Path, table: Path, made: str, shape: str, done: Any, seconds: float
) -> dict:
    """How the table's bytes compare with the dataset folder's, and what each part holds."""
    data = disk_bytes(table / "data")
    return case.add(
        metric="bytes",
        dataset=shape,
        made_by=made,
        frames=done.frames,
        cameras=len(done.cameras),
        video_files=done.video_files,
        dataset_bytes=disk_bytes(dataset),
        video_bytes=done.video_bytes,
        table_bytes=disk_bytes(table),
        table_vs_dataset=round(disk_bytes(table) / disk_bytes(dataset), 3),
        row_bytes=round(data / done.frames, 1),
        dataset_row_bytes=round(disk_bytes(dataset / "data") / done.frames, 1),
        import_s=round(seconds, 3),
    )


def _described(shape: DatasetShape) -> str:
    return (
        f"{shape.episodes} x {shape.frames} frames, {shape.cameras} cameras of "
        f"{shape.image[0]} x {shape.image[1]}, {shape.vcodec}"
    )


def batch_plan(rows: int, batches: int, runs: int, workers: tuple[int, ...]) -> dict:
    """The same batches for both readers: the first ``batches`` of an epoch in each order."""

    def first(window: int | None) -> list[list[int]]:
        plan = EpochPlan.of(rows, batch_size=BATCH, seed=0, epoch=0, shuffle=True,
                            world_size=1, rank=0, drop_last=True, window=window)  # fmt: skip
        return [plan.batch(i).tolist() for i in range(min(batches, len(plan)))]

    random_order = first(None)
    return {
        "orders": {"chunk_windows": first(BATCH), "random": random_order},
        "workers": list(workers),
        "rounds": runs,
        "check": random_order[0][: min(BATCH, 96)],
    }


def _blobhouse_rates(table: str, cameras: list[str], plan: dict) -> dict[tuple[str, int], float]:
    multiprocessing.set_forkserver_preload(PRELOAD)
    dataset = TableRowDataset(
        table, ["index", "observation_state", "action"], frames=cameras, frame_layout="chw"
    )
    rates = loader_rates(dataset, plan, "robot_video", collate_rows, "forkserver")
    return {key: rate * len(cameras) for key, rate in rates.items()}  # frames, not rows


def loader_rates(
    dataset, plan: dict, case: str, collate=None, context: str | None = None
) -> dict[tuple[str, int], float]:
    """Rows per second of a DataLoader over ``dataset`` through each of ``plan``'s orders of
    batches at each worker count (persistent workers, started by ``context``; a warm-up round
    first, the median of the others)."""
    rates = {}
    for order, batches in plan["orders"].items():
        for workers in plan["workers"]:
            loader = DataLoader(
                dataset,
                batch_sampler=batches,
                num_workers=workers,
                collate_fn=collate,
                persistent_workers=workers > 0,
                multiprocessing_context=context if workers else None,
            )
            seconds = []
            for round_ in range(plan["rounds"] + 1):  # the first round warms up
                started = time.perf_counter()
                rows = sum(len(batch["index"]) for batch in loader)
                if round_:
                    seconds.append(time.perf_counter() - started)
            del loader
            rates[(order, workers)] = rows / statistics.median(seconds)
            print(f"[{case}] blobhouse {order} {workers} workers: "
                  f"{rates[(order, workers)]:.0f} rows/s", file=sys.stderr)  # fmt: skip
    return rates


def _reference(dataset: Path, cameras: list[str], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The frames of ``rows`` (CHW ``uint8``), found by decoding each video file start to end."""
    source = LeRobotSource.read(dataset)
    table = pa.Table.from_batches(list(source.frame_batches(_files(source))))
    frames: dict[str, np.ndarray] = {}
    for key in source.video_keys:
        name = column_name(key)
        decoded = {}
        for video in (v for v in source.videos if v.key == key):
            with av.open(str(video.path)) as container:
                for frame in container.decode(video=0):
                    decoded[(str(video.path), round(frame.time * source.fps))] = frame
        times = table.column(name + "_timestamp").to_numpy()
        paths = table.column(name).combine_chunks().field("uri").to_pylist()
        frames[name] = np.stack(
            [
                decoded[(paths[r], round(times[r] * source.fps))]
                .to_ndarray(format="rgb24")
                .transpose(2, 0, 1)
                for r in rows
            ]
        )
    assert set(frames) == set(cameras)
    return frames


def _files(source: LeRobotSource):
    """Each video file "referenced" by its own path, to find a row's file and time."""
    from blobhouse.lerobot.source import ChunkRef

    return {(v.key, v.chunk, v.file): ChunkRef(str(v.path), 0, 1) for v in source.videos}


def _lerobot_rates(dataset: Path, root: Path, plan: dict, got: list, cameras: list[str]) -> dict:
    out = root / "lerobot.json"
    subprocess.run(
        [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "read", str(dataset), str(root / "plan.json"),
         str(out)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    answer = json.loads(out.read_text())
    theirs = np.load(io.BytesIO(out.with_suffix(".npz").read_bytes()))
    compared = equal = 0
    largest = 0
    for key, name in zip(answer["cameras"], cameras, strict=True):
        for i, row in enumerate(got):
            compared += 1
            difference = np.abs(row[name].astype(int) - theirs[key][i].astype(int))
            equal += int(difference.max() == 0)
            largest = max(largest, int(difference.max()))
    rates = {
        (r["order"], r["workers"]): r["rows"] * len(cameras) / r["seconds"]
        for r in answer["results"]
    }
    return {
        "rates": rates,
        "equality": {"compared": compared, "equal": equal, "largest_difference": largest},
        "about": {"backend": answer["backend"],
                  **{f"{k}_version": v for k, v in answer["versions"].items()}},
    }  # fmt: skip
