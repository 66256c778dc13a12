"""`ingest_lerobot` and `blobhouse ingest-lerobot`: a LeRobot v3 dataset (written in LeRobot's
layout by blobhouse.lerobot.sample) becomes one row per frame, each video file stored once; a
malformed dataset is refused naming its file and field, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blobhouse import open_table
from blobhouse.errors import LeRobotDatasetError, TableExistsError
from blobhouse.lerobot import ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset

CAMERAS = ("observation.images.top", "observation.images.wrist")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lerobot") / "pick_place"
    return write_sample_dataset(
        root, episodes=5, frames=30, cameras=CAMERAS, size=(32, 48), episodes_per_file=2
    )


def _videos(root: Path) -> list[Path]:
    return sorted(root.glob("videos/*/chunk-*/file-*.mp4"))


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")} if path.exists() else set()


def test_an_import_has_a_row_per_frame_and_stores_each_video_file_once(dataset, tmp_path):
    done = ingest_lerobot(dataset, str(tmp_path / "robot"))
    table = done.table
    assert (done.frames, done.episodes, done.video_files) == (150, 5, 6)
    assert done.cameras == ("observation_images_top", "observation_images_wrist")
    rows = table.to_arrow(
        columns=[
            "index",
            "episode_index",
            "frame_index",
            "timestamp",
            "task",
            "observation_state",
            "observation_images_top_timestamp",
        ]
    )
    frames = pa.concat_tables([pq.read_table(p) for p in sorted(dataset.glob("data/*/*.parquet"))])
    assert rows["index"].to_pylist() == frames["index"].to_pylist()
    assert rows["observation_state"].to_pylist() == frames["observation.state"].to_pylist()
    assert set(rows["task"].to_pylist()) == {"pick up the cube", "push the block to the goal"}
    # the frame's time in its video file: the episode's start in the file plus its timestamp
    episode, stamp = rows["episode_index"].to_numpy(), rows["timestamp"].to_numpy()
    expected = (episode % 2) * 30 / 30 + stamp.astype(np.float64)
    assert np.array_equal(rows["observation_images_top_timestamp"].to_numpy(), expected)

    # each video file once: the store holds exactly the distinct files' bytes
    video_bytes = sum(p.stat().st_size for p in _videos(dataset))
    packs = list((tmp_path / "robot" / "_blobs" / "packs").iterdir())
    assert sum(p.stat().st_size for p in packs) == video_bytes == done.video_bytes
    stats = table.stats()
    for key, camera in zip(CAMERAS, done.cameras, strict=True):
        column = stats["columns"][camera]  # every row references the store, each file once
        files = sorted((dataset / "videos" / key / "chunk-000").iterdir())
        assert column["kinds"]["global"]["rows"] == 150
        assert column["physical_bytes"] == sum(p.stat().st_size for p in files)
    # stock pylance reads every frame row's video bytes: the file the episode is in
    ids = [0, 29, 30, 149]
    blobs = lance.dataset(str(tmp_path / "robot")).take_blobs("observation_images_wrist", ids=ids)
    read = [b.read() for b in blobs]
    wrist = sorted((dataset / "videos/observation.images.wrist/chunk-000").iterdir())
    assert read == [wrist[0].read_bytes()] * 3 + [wrist[2].read_bytes()]


def test_appending_the_same_dataset_stores_no_video_again(dataset, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(dataset, uri)
    packs = tmp_path / "robot" / "_blobs" / "packs"
    before = {p.name: p.stat().st_size for p in packs.iterdir()}
    again = ingest_lerobot(dataset, uri, mode="append")
    assert again.table.count_rows() == 300
    assert {p.name: p.stat().st_size for p in packs.iterdir()} == before
    assert again.table.read_blobs("observation_images_top", [160]) == [
        sorted((dataset / "videos/observation.images.top/chunk-000").iterdir())[0].read_bytes()
    ]
    with pytest.raises(TableExistsError, match="already exists"):
        ingest_lerobot(dataset, uri)  # refused before a video file is read


def _copy(dataset: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    return copy


def _edit_info(root: Path, change) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    change(info)
    (root / "meta/info.json").write_text(json.dumps(info))


def _rewrite_parquet(path: Path, change) -> None:
    pq.write_table(change(pq.read_table(path)), path)


def _episodes_file(root: Path) -> Path:
    return next(root.glob("meta/episodes/*/*.parquet"))


MALFORMED = {
    "no info": (lambda r: (r / "meta/info.json").unlink(), r"meta/info\.json is missing"),
    "info not JSON": (
        lambda r: (r / "meta/info.json").write_text("{not json"),
        r"meta/info\.json is not valid JSON",
    ),
    "old layout": (
        lambda r: _edit_info(r, lambda i: i.update(codebase_version="v2.1")),
        r"codebase_version is 'v2\.1'.*convert_dataset_v21_to_v30",
    ),
    "bad fps": (
        lambda r: _edit_info(r, lambda i: i.update(fps="thirty")),
        r"meta/info\.json: fps must be a positive number, got 'thirty'",
    ),
    "feature without dtype": (
        lambda r: _edit_info(r, lambda i: i["features"]["action"].pop("dtype")),
        r"meta/info\.json: features\.action has no dtype",
    ),
    "colliding names": (
        lambda r: _edit_info(
            r, lambda i: i["features"].update(observation_state={"dtype": "float32"})
        ),
        r"features 'observation\.state' and 'observation_state' would both be column",
    ),
    "episode field missing": (
        lambda r: _rewrite_parquet(
            _episodes_file(r),
            lambda t: t.drop_columns(["videos/observation.images.top/from_timestamp"]),
        ),
        r"file-000\.parquet lacks the episode fields "
        r"\['videos/observation\.images\.top/from_timestamp'\]",
    ),
    "video file missing": (
        lambda r: (r / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink(),
        r"videos/observation\.images\.wrist/chunk-000/file-001\.mp4 is missing",
    ),
    "data file missing": (
        lambda r: (r / "data/chunk-000/file-002.parquet").unlink(),
        r"data/chunk-000/file-002\.parquet is missing",
    ),
    "no frames": (
        lambda r: [
            _rewrite_parquet(p, lambda t: t.slice(0, 0)) for p in r.glob("data/*/*.parquet")
        ],
        r"data: its files hold 0 frames, but the lengths in .*meta/episodes add up to 150",
    ),
    "tasks missing": (
        lambda r: (r / "meta/tasks.parquet").unlink(),
        r"meta/tasks\.parquet is missing",
    ),
    "path template outside": (
        lambda r: _edit_info(
            r, lambda i: i.update(data_path="../../{chunk_index}/{file_index}.parquet")
        ),
        r"data_path leads outside the dataset",
    ),
}


@pytest.mark.parametrize("problem", list(MALFORMED))
def test_a_malformed_dataset_is_refused_naming_file_and_field(dataset, tmp_path, problem):
    root = _copy(dataset, tmp_path)
    damage, message = MALFORMED[problem]
    damage(root)
    with pytest.raises(LeRobotDatasetError, match=message):
        ingest_lerobot(root, str(tmp_path / "robot"))
    assert not (tmp_path / "robot").exists()


def test_a_frame_problem_found_while_writing_leaves_nothing(dataset, tmp_path):
    """Frame rows are checked as they are written, after the video files went to the store:
    the failed import removes its packs and commits nothing, and an existing table keeps its
    version."""
    root = _copy(dataset, tmp_path)
    last = sorted(root.glob("data/*/*.parquet"))[-1]
    _rewrite_parquet(last, lambda t: t.set_column(
        t.schema.get_field_index("task_index"), "task_index", pa.array([7] * t.num_rows)
    ))  # fmt: skip
    with pytest.raises(LeRobotDatasetError, match=r"file-002\.parquet: task_index 7 is not in"):
        ingest_lerobot(root, str(tmp_path / "new"))
    assert not any(p.is_file() for p in (tmp_path / "new").rglob("*"))

    uri = str(tmp_path / "existing")
    ingest_lerobot(dataset, uri)
    before = _tree(tmp_path / "existing")
    _rewrite_parquet(_episodes_file(root), lambda t: t)  # same episodes, videos already stored
    (root / "videos/observation.images.top/chunk-000/file-000.mp4").write_bytes(b"other bytes")
    with pytest.raises(LeRobotDatasetError, match="task_index 7"):
        ingest_lerobot(root, uri, mode="append")
    assert open_table(uri).version == 1
    assert _tree(tmp_path / "existing") == before  # the new video's pack was removed


def test_the_command_imports_and_reports(dataset, tmp_path):
    table = tmp_path / "robot"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "blobhouse.cli",
            "ingest-lerobot",
            str(dataset),
            str(table),
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["frames"] == 150 and report["video_files"] == 6
    assert report["cameras"] == ["observation_images_top", "observation_images_wrist"]
    assert "video files: 6/6" in run.stderr
    again = subprocess.run(
        [sys.executable, "-m", "blobhouse.cli", "ingest-lerobot", str(tmp_path), str(table)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert again.returncode == 2
    assert "meta/info.json is missing" in again.stderr


def test_ctrl_c_half_way_commits_nothing_and_leaves_no_video_bytes(dataset, tmp_path):
    """SIGINT while the third video file is being stored (two are in a pack already)."""
    from tests.faults.test_interrupts import interrupt

    table = tmp_path / "robot"
    slow = (
        "import time, blobhouse.lerobot.ingest as ingest\n"
        "hash_of, calls = ingest.content_hash, []\n"
        "def slow(data):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 3:\n"
        "        print('third video file', file=sys.stderr, flush=True); time.sleep(60)\n"
        "    return hash_of(data)\n"
        "ingest.content_hash = slow"
    )
    code, stderr = interrupt(
        ["ingest-lerobot", str(dataset), str(table)],
        lambda err, pid: "third video file" in err,
        setup=slow,
    )
    assert code == 130, stderr
    assert not any(p.is_file() for p in table.rglob("*")), sorted(table.rglob("*"))
    assert ingest_lerobot(dataset, str(table)).table.count_rows() == 150  # and it runs again
