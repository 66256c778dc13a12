"""``blobhouse.lerobot.LeRobotDataset``: LeRobot's ``LeRobotDataset`` over a table, checked here
against the dataset's own files (its Parquet and a start-to-end decode of its MP4s) and
LeRobot's rules written out independently; the bench's ``robot_video`` case compares it with
LeRobot itself. The meta the import keeps: ``dataset_info``, appends, ``blobhouse stats``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import av
import lance
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lance import LanceOperation
from torch.utils.data import DataLoader

import blobhouse.read.video
from blobhouse import open_table
from blobhouse.cli import main
from blobhouse.errors import InvalidInputError, LeRobotDatasetError, UnknownOptionError
from blobhouse.lerobot import LeRobotDataset, LeRobotDatasetMetadata, dataset_info, ingest_lerobot
from blobhouse.lerobot.meta import META_KEY
from blobhouse.lerobot.sample import (
    FIRST_IMAGE_CAMERA,
    IMAGE_SIZE,
    STATE_DIM,
    drawn_frame,
    write_sample_dataset,
)

CAMERAS = ("observation.images.top", "observation.images.wrist")
IMAGE = "observation.images.gripper"  # an image feature: PNGs in the frame rows
EPISODES, FRAMES, PER_FILE, SIZE = 4, 40, 2, (24, 32)
STEP = 1 / 30


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_sample_dataset(
        tmp_path_factory.mktemp("dropin") / "ds",
        episodes=EPISODES,
        frames=FRAMES,
        cameras=CAMERAS,
        images=[IMAGE],
        size=SIZE,
        episodes_per_file=PER_FILE,
    )


@pytest.fixture(scope="module")
def table(source, tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("dropin") / "robot")
    ingest_lerobot(source, uri)
    return uri


@pytest.fixture(scope="module")
def frames(source) -> dict[str, list[np.ndarray]]:
    """Every frame of each camera by row index, as LeRobot gives it (float32 CHW in [0, 1]),
    decoded by walking each file start to end."""
    decoded: dict[str, list[np.ndarray]] = {}
    for key in CAMERAS:
        decoded[key] = []
        for path in sorted((source / "videos" / key / "chunk-000").iterdir()):
            with av.open(str(path)) as container:
                for frame in container.decode(video=0):
                    pixels = frame.to_ndarray(format="rgb24").transpose(2, 0, 1)
                    decoded[key].append(pixels.astype(np.float32) / 255)
    return decoded


@pytest.fixture(scope="module")
def rows(source) -> dict[str, np.ndarray]:
    data = pq.read_table(sorted(source.glob("data/*/*.parquet"))).to_pydict()
    return {key: np.asarray(values) for key, values in data.items()}


def test_an_item_is_lerobots_dict(table, frames, rows):
    dataset = LeRobotDataset("me/robot", root=table)
    assert (len(dataset), dataset.num_frames, dataset.num_episodes) == (160, 160, 4)
    for i in (0, 39, 40, 123):
        item = dataset[i]
        assert set(item) == {
            *CAMERAS,
            IMAGE,
            "observation.state",
            "action",
            "timestamp",
            "frame_index",
            "episode_index",
            "index",
            "task_index",
            "task",
        }
        for key in CAMERAS:
            assert item[key].dtype == torch.float32 and item[key].shape == (3, *SIZE)
            assert np.array_equal(item[key].numpy(), frames[key][i]), (key, i)
        drawn = drawn_frame(
            IMAGE_SIZE, i // FRAMES, i % FRAMES, FIRST_IMAGE_CAMERA
        )  # the PNG's pixels (lossless)
        assert item[IMAGE].dtype == torch.float32 and item[IMAGE].shape == (3, *IMAGE_SIZE)
        assert np.array_equal(item[IMAGE].numpy(), drawn.transpose(2, 0, 1) / np.float32(255))
        assert item["observation.state"].dtype == torch.float32
        assert item["observation.state"].shape == (STATE_DIM,)
        assert np.array_equal(item["observation.state"].numpy(), rows["observation.state"][i])
        assert item["timestamp"].dtype == torch.float32 and item["timestamp"].shape == ()
        assert item["index"].dtype == torch.int64 and item["index"].item() == i
        assert item["episode_index"].item() == i // FRAMES
        assert isinstance(item["task"], str) and item["task"]


def _expected(i: int, deltas: list[int]) -> tuple[list[int], list[bool]]:
    """LeRobot's rule: each delta's frame clamped into the item's episode, and padded where
    it had to be."""
    first = i // FRAMES * FRAMES
    last = first + FRAMES - 1
    asked = [i + d for d in deltas]
    return [min(max(a, first), last) for a in asked], [a < first or a > last for a in asked]


def test_delta_timestamps_stack_frames_and_steps_padded_at_episode_edges(table, frames, rows):
    history, chunk = [-2, -1, 0], [0, 1, 2, 3]
    dataset = LeRobotDataset(
        "me/robot",
        root=table,
        delta_timestamps={
            "observation.images.top": [d * STEP for d in history],
            "action": [d * STEP for d in chunk],
        },
    )
    for i in (0, 1, 38, 39, 40, 79, 100, 159):
        item = dataset[i]
        shown, padded = _expected(i, history)
        assert item["observation.images.top"].shape == (3, 3, *SIZE)
        for got, row in zip(item["observation.images.top"], shown, strict=True):
            assert np.array_equal(got.numpy(), frames["observation.images.top"][row]), (i, row)
        assert item["observation.images.top_is_pad"].tolist() == padded
        assert item["observation.images.wrist"].shape == (3, *SIZE)  # no deltas: one frame
        steps, padded = _expected(i, chunk)
        assert item["action"].shape == (4, STATE_DIM) and item["action"].dtype == torch.float32
        assert np.array_equal(item["action"].numpy(), rows["action"][steps])
        assert item["action_is_pad"].dtype == torch.bool
        assert item["action_is_pad"].tolist() == padded
        assert "observation.state_is_pad" not in item


def test_a_batch_decodes_each_video_file_once(table, monkeypatch):
    calls: list[int] = []
    real = blobhouse.read.video.decode_frames

    def counted(chunk, timestamps, **kwargs):
        calls.append(len(timestamps))
        return real(chunk, timestamps, **kwargs)

    monkeypatch.setattr(blobhouse.read.video, "decode_frames", counted)
    dataset = LeRobotDataset(
        "me/robot", root=table, delta_timestamps={"observation.images.top": [-STEP, 0]}
    )
    # rows 70-89 with their previous frames: 69-89, in file 0 (rows 0-79) and file 1
    items = dataset.__getitems__(list(range(70, 90)))
    assert len(items) == 20
    top, wrist = calls[:2], calls[2:]
    assert sorted(top) == [10, 11] and sorted(wrist) == [10, 10]


def test_episodes_select_frames_and_keep_their_edges(table, frames):
    dataset = LeRobotDataset(
        "me/robot", root=table, episodes=[3, 1], delta_timestamps={"action": [-STEP, 0]}
    )
    assert (len(dataset), dataset.num_episodes, dataset.meta.total_episodes) == (80, 2, 4)
    first = dataset[0]  # episode 1's first frame (table order)
    assert first["index"].item() == 40 and first["action_is_pad"].tolist() == [True, False]
    assert dataset[40]["index"].item() == 120
    assert np.array_equal(dataset[79]["observation.images.top"].numpy(), frames[CAMERAS[0]][159])
    with pytest.raises(IndexError, match="outside the 80 frames"):
        dataset[80]
    assert dataset.__getitems__([]) == []
    assert len(LeRobotDataset("me/robot", root=table, episodes=[])) == 0


def test_meta_offers_what_training_code_reads(table, rows):
    meta = LeRobotDataset("me/robot", root=table).meta
    assert meta.fps == 30 and isinstance(meta.fps, int)
    assert meta.video_keys == list(CAMERAS) and meta.image_keys == [IMAGE]
    assert meta.camera_keys == [*CAMERAS, IMAGE]
    assert meta.features["observation.state"]["shape"] == [STATE_DIM]
    assert meta.shapes["observation.images.top"] == (*SIZE, 3)
    assert (meta.total_episodes, meta.total_frames, meta.total_tasks) == (4, 160, 2)
    assert meta.robot_type == "sample"
    assert meta.episodes["dataset_from_index"] == [0, 40, 80, 120]
    assert meta.episodes["dataset_to_index"] == [40, 80, 120, 160]
    assert meta.episodes[2]["length"] == FRAMES and len(meta.episodes) == 4
    assert sorted(meta.tasks["task_index"].tolist()) == [0, 1]
    assert meta.get_task_index(meta.tasks.index[0]) == meta.tasks["task_index"].iloc[0]
    # the sample has no meta/stats.json: the import computed LeRobot's stats of the numbers
    state = rows["observation.state"].astype(np.float64)
    stats = meta.stats["observation.state"]
    assert np.allclose(stats["mean"], state.mean(axis=0))
    assert np.allclose(stats["std"], state.std(axis=0))
    assert np.array_equal(stats["min"], state.min(axis=0))
    assert stats["count"].tolist() == [160]


def test_image_transforms_change_every_camera(table):
    dataset = LeRobotDataset("me/robot", root=table, image_transforms=lambda f: f[:, :8, :8])
    item = dataset[5]
    assert all(item[key].shape == (3, 8, 8) for key in CAMERAS)


def test_a_dataloader_with_workers_gives_the_same_batches(table):
    dataset = LeRobotDataset("me/robot", root=table, delta_timestamps={"action": [0, STEP]})
    loader = DataLoader(
        dataset,
        batch_size=8,
        shuffle=False,
        num_workers=2,
        multiprocessing_context="forkserver",
    )
    batches = list(loader)
    assert len(batches) == 20
    direct = torch.stack([dataset[i]["observation.images.wrist"] for i in range(8, 16)])
    assert torch.equal(batches[1]["observation.images.wrist"], direct)
    assert batches[4]["action"].shape == (8, 2, STATE_DIM)
    assert batches[4]["action_is_pad"][7].tolist() == [False, True]  # row 39, episode 0's last


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"delta_timestamps": {"action": "0.1"}}, r"delta_timestamps\['action'\] must be a list"),
        ({"delta_timestamps": {"actions": [0]}}, r"names 'actions', which is not a feature"),
        ({"delta_timestamps": {"action": [0.01]}}, r"not a whole number of frames at 30 fps"),
        ({"delta_timestamps": [0.0]}, r"delta_timestamps must map feature keys"),
        ({"episodes": [0, 9]}, r"episodes \[9\] are not in table"),
    ],
)
def test_wrong_arguments_are_refused_naming_them(table, arguments, message):
    with pytest.raises(InvalidInputError, match=message):
        LeRobotDataset("me/robot", root=table, **arguments)


def test_a_dataset_folder_or_a_misspelled_option_is_named(source, table):
    with pytest.raises(LeRobotDatasetError, match=r"is a LeRobot dataset's folder, not a table"):
        LeRobotDataset("me/robot", root=str(source))  # what LeRobot's root would have been
    with pytest.raises(LeRobotDatasetError, match=r"is a LeRobot dataset's folder, not a table"):
        LeRobotDatasetMetadata("me/robot", root=str(source))
    with pytest.raises(UnknownOptionError, match=r"'delta_timestamp' \(did you mean 'delta_"):
        LeRobotDataset("me/robot", root=table, delta_timestamp={"action": [0.0]})
    # LeRobot's recording arguments are taken, and change nothing here
    assert len(LeRobotDataset("me/robot", root=table, vcodec="h264", video_backend="pyav")) == 160


def test_other_lance_tools_leave_the_reader_working(table, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(table, copy)
    lance.dataset(copy).optimize.compact_files()
    lance.dataset(copy).tags.create("gold", 1)
    dataset = LeRobotDataset("me/robot", root=copy, delta_timestamps={"action": [0.0, STEP]})
    assert len(dataset) == 160 and dataset[39]["action_is_pad"].tolist() == [False, True]
    assert dataset_info(open_table(copy, "gold")).total_frames == 160


def test_a_table_without_a_datasets_meta_is_refused_naming_the_way_out(table, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(table, copy)
    dataset = lance.dataset(str(copy))
    forget = LanceOperation.UpdateConfig(
        schema_metadata_updates=LanceOperation.UpdateMap({META_KEY: None})
    )
    lance.LanceDataset.commit(str(copy), forget, read_version=dataset.version)
    with pytest.raises(LeRobotDatasetError, match="holds no LeRobot dataset's metadata"):
        LeRobotDataset("me/robot", root=str(copy))


def _copy(source: Path, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(source, tmp_path / name))


def test_an_append_aggregates_the_stats_and_keeps_the_tasks(source, tmp_path):
    uri = str(tmp_path / "robot")
    first = ingest_lerobot(source, uri).table
    once = dataset_info(first).meta
    again = ingest_lerobot(source, uri, mode="append", again=True).table
    info = dataset_info(again)
    assert info.total_frames == 320 and info.meta.stats_frames == 320
    state = info.meta.stats["observation.state"]
    assert state["count"] == [320]
    assert np.allclose(state["mean"], once.stats["observation.state"]["mean"])
    assert np.allclose(state["std"], once.stats["observation.state"]["std"])
    assert info.meta.tasks == once.tasks
    # an older version reads the meta of its own rows
    assert dataset_info(first).meta.stats_frames == 160
    # the second copy's episodes follow the first's, and LeRobot's reader sees 8 of them
    dataset = LeRobotDataset("me/robot", root=uri, delta_timestamps={"action": [-STEP, 0]})
    assert dataset.meta.episodes["episode_index"] == list(range(8))
    assert dataset[160]["index"].item() == 160 and dataset[160]["episode_index"].item() == 4
    assert dataset[160]["action_is_pad"].tolist() == [True, False]
    assert info.meta.stats["index"]["max"] == [319.0]


def test_another_datasets_tasks_are_numbered_by_their_text(source, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(source, uri)
    other = _copy(source, tmp_path, "other")
    tasks = pq.read_table(other / "meta/tasks.parquet").to_pandas()
    texts = {int(i): t for t, i in zip(tasks.index, tasks["task_index"], strict=True)}
    # the other dataset: task 0 is a new text, task 1 the table's task 1
    renamed = {0: "stack the cups", 1: texts[1]}
    table = pa.table(
        {"task_index": pa.array([0, 1], pa.int64())},
    ).to_pandas()
    table.index = pd.Index([renamed[0], renamed[1]], name="task")
    table.to_parquet(other / "meta/tasks.parquet")
    appended = ingest_lerobot(other, uri, mode="append").table
    meta = dataset_info(appended).meta
    assert meta.tasks == {0: texts[0], 1: texts[1], 2: "stack the cups"}
    rows = appended.to_arrow(columns=["task_index", "task"]).slice(160)
    for index, text in zip(rows["task_index"].to_pylist(), rows["task"].to_pylist(), strict=True):
        assert meta.tasks[index] == text


def test_an_append_of_another_rate_or_shape_is_refused_before_anything_is_stored(source, tmp_path):
    uri = str(tmp_path / "robot")
    version = ingest_lerobot(source, uri).table.version
    packs = sorted((tmp_path / "robot" / "_blobs" / "packs").iterdir())

    def edited(name: str, change) -> Path:
        copy = _copy(source, tmp_path, name)
        info = json.loads((copy / "meta/info.json").read_text())
        change(info)
        (copy / "meta/info.json").write_text(json.dumps(info))
        return copy

    faster = edited("faster", lambda i: i.update(fps=15))
    with pytest.raises(LeRobotDatasetError, match=r"fps is 15, the table .*'s 30"):
        ingest_lerobot(faster, uri, mode="append")
    names = edited("names", lambda i: i["features"]["action"].update(names=["a"] * STATE_DIM))
    with pytest.raises(LeRobotDatasetError, match=r"feature 'action' is .*'names': \['a'"):
        ingest_lerobot(names, uri, mode="append")
    assert lance.dataset(uri).version == version
    assert sorted((tmp_path / "robot" / "_blobs" / "packs").iterdir()) == packs


def test_the_datasets_stats_file_is_kept_as_it_is(source, tmp_path):
    copy = _copy(source, tmp_path, "with_stats")
    given = {"action": {"min": [0.0] * 6, "max": [1.0] * 6, "mean": [0.5] * 6, "std": [0.1] * 6,
                        "count": [160], "q01": [0.01] * 6}}  # fmt: skip
    (copy / "meta/stats.json").write_text(json.dumps(given))
    meta = dataset_info(ingest_lerobot(copy, str(tmp_path / "robot")).table).meta
    assert meta.stats["action"] == given["action"]
    assert meta.stats["observation.state"]["count"] == [160]  # computed: not in the file


def test_stats_command_shows_the_dataset(table, capsys):
    assert main(["stats", table, "--json"]) == 0
    lerobot = json.loads(capsys.readouterr().out)["lerobot"]
    assert lerobot["fps"] == 30 and lerobot["total_frames"] == 160
    assert lerobot["total_episodes"] == 4 and lerobot["cameras"] == [*CAMERAS, IMAGE]
    assert main(["stats", table]) == 0
    assert "LeRobot dataset" in capsys.readouterr().out


def test_the_training_command_without_lerobot_names_what_to_install(monkeypatch):
    from blobhouse.errors import MissingExtraError
    from blobhouse.lerobot.train import main as train

    monkeypatch.setitem(sys.modules, "lerobot", None)  # as where LeRobot is not installed
    with pytest.raises(MissingExtraError, match=r"runs LeRobot's lerobot-train.*install lerobot"):
        train(["--steps=1"])
