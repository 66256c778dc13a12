"""The ``lerobot_dropin`` case: ``blobhouse.lerobot.LeRobotDataset`` against LeRobot's own
``LeRobotDataset``, item for item, on a dataset LeRobot's recorder made.

The dataset (``.venv-lerobot``, ``bench/lerobot_env/install.sh``) has episodes of 31 to 120
frames, two cameras and an image feature. It is imported with ``ingest_lerobot``; then both
classes give the items of the same indices, with and without ``delta_timestamps`` and for a
subset of ``episodes``, and every key is compared: the same keys, dtypes and shapes, and equal
values (frames pixel for pixel); the ``meta`` fields training code reads are compared too.
The table exported back (``export_lerobot``) is loaded by LeRobot: its items equal LeRobot's
items of the original dataset, its video files the original's bytes. Then
``bench/lerobot_env/train_dropin.py`` runs LeRobot's own training steps for an ACT
policy (its policy factory from ``dataset.meta``, normalization from ``meta.stats``, CPU, no
pretrained weights) twice with the same seed: on the table through blobhouse's classes, and on
the dataset's folder through LeRobot's; the same items give the same losses, bit for bit.
Without LeRobot the case only notes that it could not run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.harness import Case, Scratch, Size
from bench.robot_case import (
    BATCH,
    LEROBOT_PYTHON,
    LEROBOT_READY,
    LEROBOT_SIDE,
    PRELOAD,
    ROOT,
    batch_plan,
    loader_rates,
    make_dataset,
)
from blobhouse import open_table
from blobhouse.lerobot import LeRobotDataset, export_lerobot, ingest_lerobot

TRAIN = LEROBOT_SIDE.parent / "train_dropin.py"
#: LeRobot's training command, in its environment
LEROBOT_TRAIN = LEROBOT_PYTHON.parent / "lerobot-train"
LENGTHS = "31,120,64,45"
STEP = 1 / 30
PLANS: dict[str, dict[str, Any]] = {
    "no deltas": {},
    "delta_timestamps": {
        "delta_timestamps": {
            "observation.images.cam0": [-3 * STEP, -STEP, 0.0],
            "observation.state": [-STEP, 0.0],
            "action": [i * STEP for i in range(16)],
            "observation.images.png": [-STEP, 0.0],
        }
    },
    "episodes 1 and 3, deltas": {
        "episodes": [1, 3],
        "delta_timestamps": {"observation.images.cam1": [-STEP, 0.0], "action": [0.0, 1.0]},
    },
}
META = ("fps", "camera_keys", "video_keys", "total_episodes", "total_frames", "robot_type")


def lerobot_dropin(size: Size) -> Case:
    case = Case(
        "lerobot_dropin",
        "blobhouse.lerobot.LeRobotDataset against LeRobot's LeRobotDataset on a dataset "
        "LeRobot's recorder made (episodes of 31-120 frames, two AV1 cameras, an image "
        "feature): every key of the same items compared, with and without delta_timestamps",
    )
    if not LEROBOT_READY.exists():
        case.notes.append(
            "LeRobot is not installed here (bench/lerobot_env/install.sh makes .venv-lerobot): "
            "nothing to compare with (tests/read/test_lerobot_dataset.py checks the items "
            "against the dataset's own files)"
        )
        return case
    with Scratch() as root:
        dataset = root / "dataset"
        subprocess.run(
            [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "make", str(dataset), "--cameras=2",
             "--height=48", "--width=64", f"--lengths={LENGTHS}", "--image"],
            check=True, capture_output=True,
        )  # fmt: skip
        table = ingest_lerobot(dataset, str(root / "table")).table.uri
        rng = np.random.default_rng(0)
        for name, plan in PLANS.items():
            ours = LeRobotDataset("bench/robot", root=table, **plan)
            count = min(len(ours), 16 if size.name == "quick" else 64)
            indices = sorted(rng.choice(len(ours), count, replace=False).tolist())
            theirs = _lerobot_items(dataset, root, {**plan, "indices": indices})
            problems = _differences(ours, indices, theirs)
            case.add(
                metric="items_equal_to_lerobot",
                plan=name,
                items=len(indices),
                keys=len(theirs["items"][0]),
                equal=not problems,
                differences="; ".join(problems[:5]) or "-",
            )
        # the export, loaded by LeRobot itself: its items against the original dataset's
        export = export_lerobot(open_table(table), root / "export").folder
        plan = {**PLANS["delta_timestamps"], "indices": list(range(0, 260, 7))}
        original = _lerobot_items(dataset, root, plan)
        exported = _lerobot_items(export, root, plan)
        problems = _same_lerobot_items(original, exported)
        same_videos = all(
            (export / p.relative_to(dataset)).read_bytes() == p.read_bytes()
            for p in dataset.glob("videos/*/*/*.mp4")
        )
        case.add(
            metric="export_loaded_by_lerobot",
            plan="delta_timestamps",
            items=len(plan["indices"]),
            keys=len(original["items"][0]),
            equal=not problems and same_videos,
            differences="; ".join(problems[:5]) or ("-" if same_videos else "video bytes"),
        )
        _speed(case, size, root)
        steps = 2 if size.name == "quick" else 5
        ours_run = _train(table, steps)
        theirs_run = _train(str(dataset), steps, "--lerobot")
        case.add(
            metric="training_losses_equal_to_lerobot",
            plan="ACT, batches of 8, seed 0",
            items=steps,
            equal=ours_run["losses"] == theirs_run["losses"],
            differences=f"losses {ours_run['losses']} against {theirs_run['losses']}",
            blobhouse_step_s=round(statistics.median(ours_run["step_seconds"][1:]), 3),
            lerobot_step_s=round(statistics.median(theirs_run["step_seconds"][1:]), 3),
        )
        ours_cli = _train_command(root / "cli-ours", table, steps, "-m", "blobhouse.lerobot.train")
        theirs_cli = _train_command(root / "cli-lerobot", str(dataset), steps, str(LEROBOT_TRAIN))
        case.add(
            metric="lerobot_train_command",
            plan="ACT, batches of 8, seed 0, 2 workers",
            items=steps,
            equal=bool(ours_cli) and ours_cli == theirs_cli,
            differences=f"losses {ours_cli} against {theirs_cli}",
        )
    return case


def _train_command(out: Path, root: str, steps: int, *command: str) -> list[str]:
    """The losses ``lerobot-train`` logs (``command``: LeRobot's, or blobhouse's
    ``python -m blobhouse.lerobot.train``), for ACT on CPU on the dataset or table ``root``."""
    done = subprocess.run(
        [str(LEROBOT_PYTHON), *command, "--dataset.repo_id=bench/robot",
         f"--dataset.root={root}", "--policy.type=act", "--policy.device=cpu",
         "--policy.pretrained_backbone_weights=null", "--policy.push_to_hub=false",
         "--policy.chunk_size=10", "--policy.n_action_steps=10", "--batch_size=8",
         f"--steps={steps}", "--log_freq=1", "--save_checkpoint=false", "--num_workers=2",
         "--seed=0", "--wandb.enable=false", "--eval_freq=0", f"--output_dir={out}"],
        check=True, capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return re.findall(r"\bloss:([0-9.]+)", done.stdout + done.stderr)


def speed_deltas(cameras: list[str]) -> dict[str, list[float]]:
    """A diffusion-policy-like reader's: two frames of each camera, two states, an action
    chunk of 16."""
    return {
        **{key: [-STEP, 0.0] for key in cameras},
        "observation.state": [-STEP, 0.0],
        "action": [i * STEP for i in range(16)],
    }


FIRST_SCRIPT = """
import json, sys, time
started = time.perf_counter()
import torch
from torch.utils.data import DataLoader
from blobhouse.lerobot import LeRobotDataset
imported = time.perf_counter()
plan = json.load(open(sys.argv[2]))
dataset = LeRobotDataset("bench/robot", root=sys.argv[1], delta_timestamps=plan["delta_timestamps"])
loader = DataLoader(dataset, batch_size=plan["batch_size"], shuffle=True,
                    num_workers=plan["workers"])
next(iter(loader))
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "first_batch_s": done - imported}))
"""


def _speed(case: Case, size: Size, root: Path) -> None:
    """Items per second of both classes with :func:`speed_deltas`, on the same batches of 64
    (random, and chunk windows), and the first batch of a fresh process with 2 workers."""
    dataset = root / "speed"
    make_dataset(dataset, size, lerobot=True)
    table = ingest_lerobot(dataset, str(root / "speed_table")).table.uri
    plain = LeRobotDataset("bench/robot", root=table)
    frames, deltas = len(plain), speed_deltas(plain.meta.video_keys)
    plan = batch_plan(frames, size.robot_batches, size.runs, size.loader_workers)
    plan = {**plan, "delta_timestamps": deltas}
    plan_path = root / "speed-plan.json"
    plan_path.write_text(json.dumps(plan))
    out = root / "speed-lerobot.json"
    subprocess.run(
        [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "read", str(dataset), str(plan_path), str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    theirs = {(r["order"], r["workers"]): r["rows"] / r["seconds"]
              for r in json.loads(out.read_text())["results"]}  # fmt: skip
    dataset_ours = LeRobotDataset(
        "bench/robot", root=table, delta_timestamps=plan["delta_timestamps"]
    )
    # this process used Lance (the import): workers start from a fresh one (PRELOAD), as the
    # robot_video case's do; a training script that made nothing before forks them
    multiprocessing.set_forkserver_preload(PRELOAD)
    ours = loader_rates(dataset_ours, plan, "lerobot_dropin", context="forkserver")
    for key, rate in ours.items():
        case.add(
            metric="items_per_s_with_delta_timestamps",
            order=key[0],
            workers=key[1],
            blobhouse=round(rate),
            lerobot=round(theirs[key]),
            vs_lerobot=round(rate / theirs[key], 3),
            frames=frames,
        )
    first = {"delta_timestamps": deltas, "batch_size": BATCH, "workers": 2}
    first_path = root / "first.json"
    first_path.write_text(json.dumps(first))
    runs = {"blobhouse": [], "lerobot": []}
    for _ in range(max(size.runs, 1)):
        mine = subprocess.run(
            [sys.executable, "-c", FIRST_SCRIPT, table, str(first_path)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        runs["blobhouse"].append(json.loads(mine.stdout.strip().splitlines()[-1]))
        theirs_first = subprocess.run(
            [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "first", str(dataset), str(first_path)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        runs["lerobot"].append(json.loads(theirs_first.stdout.strip().splitlines()[-1]))
    medians = {
        who: {k: statistics.median(r[k] for r in rs) for k in ("import_s", "first_batch_s")}
        for who, rs in runs.items()
    }
    case.add(
        metric="first_batch_s_2_workers",
        order="random",
        workers=2,
        blobhouse=round(medians["blobhouse"]["first_batch_s"], 3),
        lerobot=round(medians["lerobot"]["first_batch_s"], 3),
        vs_lerobot=round(
            medians["lerobot"]["first_batch_s"] / medians["blobhouse"]["first_batch_s"], 3
        ),
        blobhouse_import_s=round(medians["blobhouse"]["import_s"], 3),
        lerobot_import_s=round(medians["lerobot"]["import_s"], 3),
    )


def _train(root: str, steps: int, *flags: str) -> dict[str, Any]:
    """``train_dropin.py`` on ``root``: its losses and step times."""
    done = subprocess.run(
        [str(LEROBOT_PYTHON), str(TRAIN), root, f"--steps={steps}", *flags],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _lerobot_items(dataset: Path, root: Path, plan: dict[str, Any]) -> dict[str, Any]:
    plan_path, out = root / "items-plan.json", root / "items.pt"
    plan_path.write_text(json.dumps(plan))
    subprocess.run(
        [str(LEROBOT_PYTHON), str(LEROBOT_SIDE), "items", str(dataset), str(plan_path), str(out)],
        check=True,
        capture_output=True,
    )
    return torch.load(out, weights_only=False)


def _same_lerobot_items(one: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """What differs between two of LeRobot's own item lists (none: equal)."""
    problems = [] if one["len"] == other["len"] else [f"len {one['len']} {other['len']}"]
    for n, (a, b) in enumerate(zip(one["items"], other["items"], strict=True)):
        if set(a) != set(b):
            problems.append(f"item {n}: keys")
            continue
        for key, value in a.items():
            same = (
                torch.equal(value, b[key]) and value.dtype == b[key].dtype
                if isinstance(value, torch.Tensor)
                else value == b[key]
            )
            if not same:
                problems.append(f"item {n} {key}")
    return problems


def _differences(ours: LeRobotDataset, indices: list[int], theirs: dict[str, Any]) -> list[str]:
    """What differs between our items and meta and LeRobot's, in words (none: equal)."""
    problems = []
    if (len(ours), ours.num_episodes) != (theirs["len"], theirs["num_episodes"]):
        problems.append(f"len/num_episodes {len(ours)}/{ours.num_episodes}")
    for i, mine, their in zip(indices, ours.__getitems__(indices), theirs["items"], strict=True):
        if set(mine) != set(their):
            problems.append(f"item {i}: keys {sorted(set(mine) ^ set(their))}")
            continue
        for key, value in their.items():
            got = mine[key]
            if isinstance(value, torch.Tensor):
                if (got.dtype, got.shape) != (value.dtype, value.shape):
                    problems.append(f"item {i} {key}: {got.dtype} {tuple(got.shape)}")
                elif not torch.equal(got, value):
                    problems.append(f"item {i} {key}: values")
            elif got != value:
                problems.append(f"item {i} {key}: {got!r} != {value!r}")
    meta = theirs["meta"]
    problems += [f"meta.{n}" for n in META if getattr(ours.meta, n) != meta[n]]
    if list(ours.meta.episodes["dataset_from_index"]) != meta["from_index"]:
        problems.append("meta.episodes dataset_from_index")
    if ours.meta.tasks.to_dict() != meta["tasks"]:
        problems.append("meta.tasks")
    for key, stats in meta["stats"].items():
        for name, value in stats.items():
            got = ours.meta.stats.get(key, {}).get(name)
            if got is None or np.shape(got) != np.shape(value) or not np.allclose(got, value):
                problems.append(f"meta.stats {key} {name}")
    return problems
