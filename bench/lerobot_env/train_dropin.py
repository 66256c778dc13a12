"""LeRobot's own training code on a blobhouse table, its import line changed: run with the Python
of ``.venv-lerobot`` (``bench/lerobot_env/install.sh``), blobhouse from this checkout.

    .venv-lerobot/bin/python bench/lerobot_env/train_dropin.py TABLE [--steps 3]
    .venv-lerobot/bin/python bench/lerobot_env/train_dropin.py DATASET --lerobot

``--lerobot``: the same script with LeRobot's own classes on the dataset's folder (the line as
it was), for the losses to compare: the same seed, the same items, the same losses.

What ``lerobot-train`` does for an ACT policy, step for step (``lerobot.datasets.factory``'s
``make_dataset``, then ``lerobot.scripts.lerobot_train``'s set-up and loop), on CPU and
without pretrained weights: the dataset's metadata, ``delta_timestamps`` resolved from the
policy's config, the policy built by LeRobot's factory from ``dataset.meta``, its
normalization from ``dataset.meta.stats``, and a few optimizer steps. Prints one JSON line:
the losses and how long each step took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the table is local: never the network
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # blobhouse from the checkout

import torch
from lerobot.datasets.factory import resolve_delta_timestamps
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.factory import make_policy, make_pre_post_processors
from torch.utils.data import DataLoader

if "--lerobot" in sys.argv:  # the line as it was
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
else:  # the one line a LeRobot user changes
    from blobhouse.lerobot import LeRobotDataset, LeRobotDatasetMetadata


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table", help="the table (or, with --lerobot, the dataset's folder)")
    parser.add_argument("--lerobot", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)

    # lerobot.datasets.factory.make_dataset
    config = ACTConfig(
        device="cpu", pretrained_backbone_weights=None, chunk_size=10, n_action_steps=10
    )
    ds_meta = LeRobotDatasetMetadata("blobhouse/robot", root=args.table)
    delta_timestamps = resolve_delta_timestamps(config, ds_meta)
    dataset = LeRobotDataset("blobhouse/robot", root=args.table, delta_timestamps=delta_timestamps)

    # lerobot.scripts.lerobot_train.train
    policy = make_policy(cfg=config, ds_meta=dataset.meta)
    preprocessor, _ = make_pre_post_processors(policy_cfg=config, dataset_stats=dataset.meta.stats)
    preset = config.get_optimizer_preset()
    optimizer = preset.build(policy.parameters())
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=False)
    policy.train()
    losses, seconds = [], []
    batches = iter(loader)
    for _ in range(args.steps):
        started = time.perf_counter()
        batch = preprocessor(next(batches))
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), preset.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - started)
    print(json.dumps({"losses": losses, "step_seconds": seconds, "frames": len(dataset)}))


if __name__ == "__main__":
    main()
