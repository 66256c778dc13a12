"""The LeRobot side of the ``robot_video`` case, run with the Python of ``.venv-lerobot``
(``bench/lerobot_env/install.sh``): it imports nothing of blobhouse.

``make ROOT --episodes E --frames F --height H --width W --cameras C``: a dataset made with
LeRobot's own recorder API (``LeRobotDataset.create``, ``add_frame``, ``save_episode``,
``finalize``), its default codec (AV1, libsvtav1) and file sizes.

``make ... --lengths 31,120,64 --image``: episodes of those lengths, and an image feature
(PNG in the Parquet, LeRobot's ``dtype: image``) beside the cameras.

``items ROOT PLAN OUT``: ``LeRobotDataset(..., episodes=, delta_timestamps=)[i]`` for each index
of ``PLAN`` (JSON: ``indices``, ``episodes``, ``delta_timestamps``), saved with ``torch.save``
(what ``blobhouse.lerobot.LeRobotDataset`` must equal), with the dataset's ``meta`` fields.

``first ROOT PLAN``: in this fresh process, ``LeRobotDataset`` made (with the plan's
``delta_timestamps``) and the first batch of a shuffled DataLoader with the plan's ``workers``
(its ``batch_size``) read: prints the seconds to import and to that batch (JSON).

``read ROOT PLAN OUT``: reads the batches ``PLAN`` (JSON: orders of batches of row indices,
worker counts, rounds, rows to check) with ``LeRobotDataset`` through a DataLoader, as a
LeRobot training script does, and writes frames/s per order and worker count to ``OUT`` (JSON)
and the checked rows' frames (``uint8``, recovered from LeRobot's float32 / 255) beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the dataset is local: never the network

import numpy as np
import torch
from torch.utils.data import DataLoader

REPO_ID = "bench/robot"


def scene(height: int, width: int, episode: int, frame: int, camera: int) -> np.ndarray:
    """A smooth scene with a moving block (as blobhouse.lerobot.sample draws it)."""
    y, x = np.mgrid[0:height, 0:width]
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (x * 255 // max(width - 1, 1) + 37 * episode) % 256
    image[..., 1] = (y * 255 // max(height - 1, 1) + 11 * camera) % 256
    image[..., 2] = (x + y + 3 * frame) % 256
    top, left = (frame * 2) % max(height - 8, 1), (frame * 3 + episode * 5) % max(width - 8, 1)
    image[top : top + 8, left : left + 8] = (255, 255 - 20 * camera, 0)
    return image


def make(args: argparse.Namespace) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cameras = [f"observation.images.cam{c}" for c in range(args.cameras)]
    features = {
        **{
            key: {"dtype": "video", "shape": (args.height, args.width, 3),
                  "names": ["height", "width", "channels"]}
            for key in cameras
        },
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (6,), "names": None},
    }  # fmt: skip
    if args.image:
        features["observation.images.png"] = {
            "dtype": "image", "shape": (24, 32, 3), "names": ["height", "width", "channels"]
        }  # fmt: skip
    lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else None
    started = time.perf_counter()
    dataset = LeRobotDataset.create(
        repo_id=REPO_ID, fps=30, root=args.root, features=features, use_videos=True,
        vcodec=args.vcodec,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for episode in range(len(lengths) if lengths else args.episodes):
        for frame in range(lengths[episode] if lengths else args.frames):
            png = {"observation.images.png": scene(24, 32, episode, frame, 9)} if args.image else {}
            dataset.add_frame(
                {
                    **png,
                    **{
                        key: scene(args.height, args.width, episode, frame, c)
                        for c, key in enumerate(cameras)
                    },
                    "observation.state": rng.standard_normal(6).astype(np.float32),
                    "action": rng.standard_normal(6).astype(np.float32),
                    "task": "pick up the cube" if episode % 2 else "push the block",
                }
            )
        dataset.save_episode()
    dataset.finalize()
    print(json.dumps({"seconds": time.perf_counter() - started, "vcodec": dataset.vcodec}))


def read(args: argparse.Namespace) -> None:
    import lerobot
    import torchcodec
    from lerobot.datasets import video_utils
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    plan = json.loads(Path(args.plan).read_text())
    dataset = LeRobotDataset(
        repo_id=REPO_ID, root=args.root, delta_timestamps=plan.get("delta_timestamps")
    )
    cameras = dataset.meta.video_keys
    results = []
    for order, batches in plan["orders"].items():
        for workers in plan["workers"]:
            # lerobot keeps open decoders in a module-level cache that forked workers must not
            # inherit (huggingface/lerobot#2488): cleared before each DataLoader starts them
            video_utils._default_decoder_cache.clear()
            loader = DataLoader(
                dataset,
                batch_sampler=batches,
                num_workers=workers,
                persistent_workers=workers > 0,
            )
            seconds = []
            for round_ in range(plan["rounds"] + 1):  # the first round warms up
                started = time.perf_counter()
                rows = sum(len(batch["index"]) for batch in loader)
                if round_:
                    seconds.append(time.perf_counter() - started)
            del loader
            results.append(
                {"order": order, "workers": workers, "rows": rows,
                 "seconds": statistics.median(seconds)}
            )  # fmt: skip
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    if plan.get("delta_timestamps"):  # rates only: the frames are compared elsewhere
        Path(args.out).write_text(json.dumps({"results": results}))
        return
    checked = {}
    for key in cameras:
        frames = [dataset[int(i)][key] for i in plan["check"]]
        checked[key] = (torch.stack(frames) * 255).round().to(torch.uint8).numpy()
    np.savez(Path(args.out).with_suffix(".npz"), **checked)
    Path(args.out).write_text(
        json.dumps(
            {
                "results": results,
                "cameras": list(cameras),
                "backend": dataset.video_backend,
                "versions": {
                    "lerobot": lerobot.__version__,
                    "torch": torch.__version__,
                    "torchcodec": torchcodec.__version__,
                },
            }
        )
    )


def items(args: argparse.Namespace) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    plan = json.loads(Path(args.plan).read_text())
    dataset = LeRobotDataset(
        repo_id=REPO_ID,
        root=args.root,
        episodes=plan.get("episodes"),
        delta_timestamps=plan.get("delta_timestamps"),
    )
    meta = dataset.meta
    torch.save(
        {
            "items": [dataset[int(i)] for i in plan["indices"]],
            "len": len(dataset),
            "num_episodes": dataset.num_episodes,
            "meta": {
                "fps": meta.fps,
                "features": meta.features,
                "stats": meta.stats,
                "camera_keys": meta.camera_keys,
                "video_keys": meta.video_keys,
                "total_episodes": meta.total_episodes,
                "total_frames": meta.total_frames,
                "robot_type": meta.robot_type,
                "tasks": meta.tasks.to_dict(),
                "from_index": list(meta.episodes["dataset_from_index"]),
                "to_index": list(meta.episodes["dataset_to_index"]),
            },
        },
        args.out,
    )


def first(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    imported = time.perf_counter()
    plan = json.loads(Path(args.plan).read_text())
    dataset = LeRobotDataset(
        repo_id=REPO_ID, root=args.root, delta_timestamps=plan.get("delta_timestamps")
    )
    loader = DataLoader(
        dataset, batch_size=plan["batch_size"], shuffle=True, num_workers=plan["workers"]
    )
    next(iter(loader))
    done = time.perf_counter()
    print(json.dumps({"import_s": imported - started, "first_batch_s": done - imported}))


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    maker = commands.add_parser("make")
    maker.add_argument("root")
    for name, default in (("episodes", 4), ("frames", 60), ("height", 96), ("width", 128),
                          ("cameras", 1)):  # fmt: skip
        maker.add_argument(f"--{name}", type=int, default=default)
    maker.add_argument("--lengths", default="")
    maker.add_argument("--image", action="store_true")
    maker.add_argument("--vcodec", default="libsvtav1")  # LeRobot's default
    firster = commands.add_parser("first")
    firster.add_argument("root")
    firster.add_argument("plan")
    itemizer = commands.add_parser("items")
    for name in ("root", "plan", "out"):
        itemizer.add_argument(name)
    reader = commands.add_parser("read")
    reader.add_argument("root")
    reader.add_argument("plan")
    reader.add_argument("out")
    args = parser.parse_args()
    {"make": make, "items": items, "read": read, "first": first}[args.command](args)


if __name__ == "__main__":
    main()
