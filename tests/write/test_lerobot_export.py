"""``export_lerobot`` and ``blobhouse export-lerobot``: a table imported from LeRobot written
back as a LeRobot v3.0 folder, video files byte for byte, the same items once imported again
(the bench's ``lerobot_dropin`` case loads an export with LeRobot itself)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import blobhouse.lerobot.export
from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import main
from blobhouse.errors import InvalidInputError, LeRobotDatasetError
from blobhouse.lerobot import LeRobotDataset, dataset_info, export_lerobot, ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset

CAMERAS = ("observation.images.top", "observation.images.wrist")
STEP = 1 / 30
DELTAS = {"observation.images.top": [-STEP, 0.0], "action": [0.0, STEP, 2 * STEP]}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_sample_dataset(
        tmp_path_factory.mktemp("export") / "ds",
        episodes=5,
        frames=12,
        cameras=CAMERAS,
        size=(16, 24),
        episodes_per_file=2,
    )


@pytest.fixture(scope="module")
def table(source, tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("export") / "robot")
    ingest_lerobot(source, uri)
    return uri


def _same_items(one: LeRobotDataset, other: LeRobotDataset) -> None:
    assert len(one) == len(other)
    for mine, theirs in zip(
        one.__getitems__(list(range(len(one)))),
        other.__getitems__(list(range(len(other)))),
        strict=True,
    ):
        assert set(mine) == set(theirs)
        for key, value in mine.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == theirs[key].dtype and torch.equal(value, theirs[key]), key
            else:
                assert value == theirs[key], key


def test_an_export_imports_back_to_the_same_items_and_video_bytes(source, table, tmp_path):
    done = export_lerobot(open_table(table), tmp_path / "back")
    assert (done.frames, done.episodes, done.video_files, done.data_files) == (60, 5, 6, 1)
    for original in sorted(source.glob("videos/*/*/*.mp4")):
        exported = done.folder / original.relative_to(source)
        assert exported.read_bytes() == original.read_bytes()  # byte for byte
    info = json.loads((done.folder / "meta/info.json").read_text())
    assert (info["codebase_version"], info["fps"], info["total_frames"]) == ("v3.0", 30, 60)
    again = ingest_lerobot(done.folder, str(tmp_path / "again")).table
    _same_items(
        LeRobotDataset("me/robot", root=table, delta_timestamps=DELTAS),
        LeRobotDataset("me/robot", root=again.uri, delta_timestamps=DELTAS),
    )
    before, after = dataset_info(open_table(table)).meta, dataset_info(again).meta
    assert (after.fps, after.features, after.tasks) == (before.fps, before.features, before.tasks)
    assert after.stats == before.stats


def test_deleted_episodes_are_left_out_and_the_rest_numbered_from_zero(source, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(source, uri).table.delete("episode_index = 1")
    done = export_lerobot(open_table(uri), tmp_path / "back")
    assert (done.frames, done.episodes) == (48, 4)
    exported = LeRobotDataset(
        "me/robot", root=ingest_lerobot(done.folder, str(tmp_path / "t")).table.uri
    )
    assert exported.meta.episodes["dataset_from_index"] == [0, 12, 24, 36]
    item = exported[12]  # what was episode 2's first frame
    assert (item["index"].item(), item["episode_index"].item()) == (12, 1)
    kept = LeRobotDataset("me/robot", root=uri)
    assert np.array_equal(item[CAMERAS[0]].numpy(), kept[12][CAMERAS[0]].numpy())


def test_a_folder_in_use_or_a_table_without_metadata_is_refused(table, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match="exists and is not an empty folder"):
        export_lerobot(open_table(table), busy)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    with pytest.raises(InvalidInputError, match="exists and is not an empty folder"):
        export_lerobot(open_table(table), busy / "notes.txt")
    plain = tmp_path / "plain"
    write_table(pa.table({"id": [1], "img": blob_array([b"x"])}), str(plain))
    with pytest.raises(LeRobotDatasetError, match="holds no LeRobot dataset's metadata"):
        export_lerobot(open_table(str(plain)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_interrupted_export_leaves_nothing(table, tmp_path, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(blobhouse.lerobot.export._Export, "_meta_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_lerobot(open_table(table), tmp_path / "back")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its partial


def test_the_command_exports(table, tmp_path, capsys):
    assert main(["export-lerobot", table, str(tmp_path / "back"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frames"] == 60 and report["video_files"] == 6
    assert main(["export-lerobot", table, str(tmp_path / "back")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
