"""``blobhouse.spark.ingest_lerobot``: the LeRobot import with Spark tasks makes the table the
Python import makes, each video file stored once, and a failed task leaves nothing."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import blobhouse.spark as bs
from blobhouse.errors import LeRobotDatasetError
from blobhouse.layout import is_lance_temporary
from blobhouse.lerobot import dataset_info, ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset
from blobhouse.maintenance.garbage_collection import gc_at
from tests.helpers import aged, damage_page, declare_stats

pytestmark = pytest.mark.usefixtures("spark")
CAMERAS = ("observation.images.top", "observation.images.wrist")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lerobot") / "pick_place"
    return write_sample_dataset(
        root,
        episodes=5,
        frames=20,
        cameras=CAMERAS,
        images=["observation.images.gripper"],  # PNGs in the frame rows
        size=(24, 32),
        episodes_per_file=2,
    )


def _packs(table: Path) -> int:
    return sum(p.stat().st_size for p in (table / "_blobs" / "packs").iterdir())


def test_the_spark_import_makes_the_python_import_s_table(spark, dataset, tmp_path):
    done = bs.ingest_lerobot(spark, dataset, str(tmp_path / "spark"))
    python = ingest_lerobot(dataset, str(tmp_path / "python")).table
    assert done.frames == 100 and done.video_files == 6
    assert done.table.schema == python.schema
    assert dataset_info(done.table).meta == dataset_info(python).meta  # the dataset's meta kept
    blobs = (*done.cameras, "observation_images_gripper")  # references: compared by bytes
    columns = [c for c in python.schema.names if c not in blobs]
    spark_rows = done.table.to_arrow(columns=columns).sort_by("index")
    assert spark_rows.equals(python.to_arrow(columns=columns).sort_by("index"))
    order = done.table.to_arrow(columns=["index"])["index"].to_numpy().argsort()
    assert done.table.read_blobs("observation_images_gripper", order.tolist()) == (
        python.read_blobs("observation_images_gripper", list(range(100)))
    )
    for camera in done.cameras:
        ids = done.table.row_ids()
        by_index = dict(
            zip(done.table.to_arrow(columns=["index"])["index"].to_pylist(), ids, strict=True)
        )
        ours = done.table.take_row_dicts([by_index[i] for i in (0, 45, 99)], [camera])
        theirs = python.take_row_dicts(python.row_ids()[[0, 45, 99]], [camera])
        assert [r[camera] for r in ours] == [r[camera] for r in theirs]
    video_bytes = sum(p.stat().st_size for p in dataset.glob("videos/*/*/*.mp4"))
    rows = pa.concat_tables(pq.read_table(p) for p in sorted(dataset.glob("data/*/*.parquet")))
    pngs = set(rows["observation.images.gripper"].combine_chunks().field("bytes").to_pylist())
    stored = video_bytes + sum(map(len, pngs))
    assert _packs(tmp_path / "spark") == stored  # each file and image once, whichever task
    # the same types: the Python import appends to the table Spark made
    again = ingest_lerobot(dataset, str(tmp_path / "spark"), mode="append", again=True)
    assert again.table.count_rows() == 200 and _packs(tmp_path / "spark") == stored
    assert dataset_info(again.table).meta.stats_frames == 200
    # and Spark's own append of it again: its tasks find every image in the store
    thrice = bs.ingest_lerobot(spark, dataset, str(tmp_path / "spark"), mode="append", again=True)
    assert thrice.table.count_rows() == 300 and _packs(tmp_path / "spark") == stored
    assert thrice.table.read_blobs("observation_images_gripper", [250]) == [
        rows["observation.images.gripper"].combine_chunks().field("bytes")[50].as_py()
    ]


def test_a_failed_task_leaves_nothing(spark, dataset, tmp_path):
    """A data page the checks do not read (the action column's) is damaged: the task writing
    that data file fails, naming it, and the import removes what the tasks wrote."""
    root = tmp_path / "copy"
    shutil.copytree(dataset, root)
    declare_stats(root)  # else the driver computes stats, and reads the page first
    damage_page(sorted(root.glob("data/*/*.parquet"))[-1], "action")
    with pytest.raises(LeRobotDatasetError, match=r"file-002\.parquet cannot be read: "):
        bs.ingest_lerobot(spark, root, str(tmp_path / "robot"))
    # the abort marker stays for tasks that might still finish, and a task Spark cancelled
    # mid-file may leave Lance's temporary file: gc removes both once no write runs
    robot = tmp_path / "robot"
    left = [p.relative_to(robot).as_posix() for p in robot.rglob("*") if p.is_file()]
    markers = [p for p in left if p.startswith("data/aborted-")]
    assert len(markers) <= 1 and set(left) - set(markers) <= set(filter(is_lance_temporary, left))
    aged(robot, hours=2, folders=False)
    report = gc_at(str(robot), grace=timedelta(hours=1))
    assert report["foreign_files"] == [] and not robot.exists(), report
    with pytest.raises(TypeError, match="did you mean 'mode'"):
        bs.ingest_lerobot(spark, root, str(tmp_path / "robot"), mdoe="append")


@pytest.mark.parametrize("problem", ["truncated video", "colliding column", "timestamp inf"])
def test_a_hostile_dataset_is_refused_before_any_task_runs(spark, dataset, tmp_path, problem):
    """The Spark import runs the Python import's checks on the driver before any task: the
    dataset is refused and nothing at all is written (no abort marker either)."""
    root = tmp_path / "copy"
    shutil.copytree(dataset, root)
    first = sorted(root.glob("data/*/*.parquet"))[0]
    frames = pq.read_table(first)
    if problem == "truncated video":
        video = root / "videos/observation.images.top/chunk-000/file-001.mp4"
        video.write_bytes(video.read_bytes()[:2000])
        message = r"file-001\.mp4 \(camera 'observation\.images\.top', episodes 2, 3\)"
    elif problem == "colliding column":
        for path in sorted(root.glob("data/*/*.parquet")):
            table = pq.read_table(path)
            pq.write_table(table.append_column("task", pa.array(["x"] * table.num_rows)), path)
        message = r"data column 'task' of .* would be replaced by the import's column 'task'"
    else:
        stamps = frames["timestamp"].to_pylist()
        stamps[5] = float("inf")
        column = frames.schema.get_field_index("timestamp")
        pq.write_table(
            frames.set_column(column, "timestamp", pa.array(stamps, pa.float32())), first
        )
        message = r"file-000\.parquet: timestamp of frame index 5 is inf"
    with pytest.raises(LeRobotDatasetError, match=message):
        bs.ingest_lerobot(spark, root, str(tmp_path / "robot"))
    assert not (tmp_path / "robot").exists()
