"""A LeRobot dataset folder on an object store (the S3 server, Azurite) is imported as a local
one is, and the table read back through ``LeRobotDataset`` on the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blobhouse.errors import LeRobotDatasetError
from blobhouse.lerobot import LeRobotDataset, dataset_info, ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset

STEP = 1 / 30


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_sample_dataset(
        tmp_path_factory.mktemp("remote") / "ds",
        episodes=3,
        frames=10,
        cameras=("observation.images.top",),
        images=("observation.images.wrist",),  # PNGs in the frame rows
        size=(16, 16),
        episodes_per_file=2,
    )


def _upload(source: Path, bucket, prefix: str) -> str:
    for path in sorted(source.rglob("*")):
        if path.is_file():
            bucket.put(f"{prefix}/{path.relative_to(source)}", path.read_bytes())
    return f"{bucket.uri}/{prefix}"


def test_a_dataset_on_a_store_imports_as_a_local_one(source, bucket, tmp_path):
    remote = _upload(source, bucket, "datasets/pick")
    done = ingest_lerobot(remote, f"{bucket.uri}/robot", storage_options=bucket.options)
    local = ingest_lerobot(source, str(tmp_path / "local")).table
    assert (done.frames, done.video_files) == (30, 2)
    assert dataset_info(done.table).meta.stats == dataset_info(local).meta.stats
    deltas = {"action": [-STEP, 0.0], "observation.images.top": [-STEP, 0.0]}
    ours = LeRobotDataset(
        "me/pick", root=f"{bucket.uri}/robot", storage_options=bucket.options,
        delta_timestamps=deltas,
    )  # fmt: skip
    theirs = LeRobotDataset("me/pick", root=str(tmp_path / "local"), delta_timestamps=deltas)
    for mine, expected in zip(
        ours.__getitems__(list(range(30))), theirs.__getitems__(list(range(30))), strict=True
    ):
        for key, value in expected.items():
            same = (
                torch.equal(mine[key], value)
                if isinstance(value, torch.Tensor)
                else mine[key] == value
            )
            assert same, key
    # the same dataset again: its images are found in the remote store, none stored again
    packs = bucket.objects("robot/_blobs/packs/")
    again = ingest_lerobot(
        remote, f"{bucket.uri}/robot", mode="append", again=True, storage_options=bucket.options
    )
    assert again.table.count_rows() == 60 and bucket.objects("robot/_blobs/packs/") == packs
    wrist = again.table.read_blobs("observation_images_wrist", [0, 30])
    assert wrist[0] == wrist[1]


def test_a_missing_or_damaged_remote_dataset_is_named(source, bucket):
    with pytest.raises(LeRobotDatasetError, match=r"is not a folder"):
        ingest_lerobot(f"{bucket.uri}/nothing", f"{bucket.uri}/t1", storage_options=bucket.options)
    remote = _upload(source, bucket, "datasets/cut")
    bucket.put("datasets/cut/meta/info.json", b"{not json")
    with pytest.raises(
        LeRobotDatasetError, match=r"datasets/cut/meta/info\.json is not valid JSON"
    ):
        ingest_lerobot(remote, f"{bucket.uri}/t2", storage_options=bucket.options)


def test_spark_imports_a_dataset_on_a_store(spark, source, s3):
    import blobhouse.spark as bs

    remote = _upload(source, s3, "datasets/pick")
    done = bs.ingest_lerobot(spark, remote, f"{s3.uri}/robot", storage_options=s3.options)
    assert (done.frames, done.video_files) == (30, 2)
    assert dataset_info(done.table).total_episodes == 3
