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
from tests.helpers import damage_page, declare_stats

CAMERAS = ("observation.images.top", "observation.images.wrist")
IMAGE = "observation.images.gripper"  # an image feature: a PNG in each frame row


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lerobot") / "pick_place"
    return write_sample_dataset(
        root,
        episodes=5,
        frames=30,
        cameras=CAMERAS,
        images=[IMAGE],
        size=(32, 48),
        episodes_per_file=2,
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

    # each video file and image once: the store holds exactly the distinct files' and PNGs'
    video_bytes = sum(p.stat().st_size for p in _videos(dataset))
    pngs = set(frames[IMAGE].combine_chunks().field("bytes").to_pylist())
    packs = list((tmp_path / "robot" / "_blobs" / "packs").iterdir())
    assert video_bytes == done.video_bytes
    assert sum(p.stat().st_size for p in packs) == video_bytes + sum(map(len, pngs))
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


def test_appending_a_dataset_with_other_cameras_is_refused_naming_them(dataset, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(dataset, uri)
    before = _tree(Path(uri))
    other = write_sample_dataset(
        tmp_path / "other", episodes=1, frames=8, cameras=[CAMERAS[0], "observation.images.side"],
        size=(24, 32),
    )  # fmt: skip
    with pytest.raises(LeRobotDatasetError, match=r"camera 'observation\.images\.side'.*"
                       r"not a blob column of the table"):  # fmt: skip
        ingest_lerobot(other, uri, mode="append")
    assert open_table(uri).version == 1 and _tree(Path(uri)) == before


def test_appending_the_same_dataset_stores_no_video_or_image_again(dataset, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(dataset, uri)
    packs = tmp_path / "robot" / "_blobs" / "packs"
    before = {p.name: p.stat().st_size for p in packs.iterdir()}
    with pytest.raises(LeRobotDatasetError, match=r"is in the table .* already.*again=True"):
        ingest_lerobot(dataset, uri, mode="append")  # refused before a video file is stored
    assert {p.name: p.stat().st_size for p in packs.iterdir()} == before
    again = ingest_lerobot(dataset, uri, mode="append", again=True)
    assert again.table.count_rows() == 300
    # numbered as LeRobot's merge numbers: after the table's frames and episodes
    rows = again.table.to_arrow(columns=["index", "episode_index"])
    assert rows["index"].to_pylist() == list(range(300))
    assert sorted(set(rows["episode_index"].to_pylist())) == list(range(10))
    assert {p.name: p.stat().st_size for p in packs.iterdir()} == before
    assert again.table.read_blobs("observation_images_top", [160]) == [
        sorted((dataset / "videos/observation.images.top/chunk-000").iterdir())[0].read_bytes()
    ]
    pngs = pq.read_table(sorted(dataset.glob("data/*/*.parquet"))[0])[IMAGE].combine_chunks()
    assert (
        again.table.read_blobs("observation_images_gripper", [150, 151])
        == (
            pngs.field("bytes").to_pylist()[:2]  # the copies' images: the same bytes, stored once
        )
    )
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
        r"feature 'observation\.state' of .*meta/info\.json and feature 'observation_state' of "
        r".*meta/info\.json would both be column 'observation_state'",
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
    "stats not JSON": (
        lambda r: (r / "meta/stats.json").write_text("{not json"),
        r"meta/stats\.json is not valid JSON",
    ),
    "stats not per feature": (
        lambda r: (r / "meta/stats.json").write_text('{"action": [1, 2]}'),
        r"meta/stats\.json must map each feature to its stats",
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


def test_a_frame_problem_is_found_before_anything_is_written(dataset, tmp_path):
    """Frame rows are checked before the video files go to the store: the failed import
    writes nothing, and an existing table keeps its version."""
    root = _copy(dataset, tmp_path)
    last = sorted(root.glob("data/*/*.parquet"))[-1]
    _rewrite_parquet(last, lambda t: t.set_column(
        t.schema.get_field_index("task_index"), "task_index", pa.array([7] * t.num_rows)
    ))  # fmt: skip
    with pytest.raises(
        LeRobotDatasetError, match=r"file-002\.parquet: task_index 7 \(frame index 120\) is not in"
    ):
        ingest_lerobot(root, str(tmp_path / "new"))
    assert not any(p.is_file() for p in (tmp_path / "new").rglob("*"))

    uri = str(tmp_path / "existing")
    ingest_lerobot(dataset, uri)
    before = _tree(tmp_path / "existing")
    _rewrite_parquet(_episodes_file(root), lambda t: t)  # same episodes, videos already stored
    (root / "videos/observation.images.top/chunk-000/file-000.mp4").write_bytes(b"other bytes")
    with pytest.raises(LeRobotDatasetError, match="task_index 7"):
        ingest_lerobot(root, uri, mode="append", again=True)
    assert open_table(uri).version == 1
    assert _tree(tmp_path / "existing") == before  # the new video's pack was removed


def test_a_data_page_damaged_where_the_checks_do_not_read_leaves_nothing(dataset, tmp_path):
    """The checks read the frame fields only: a damaged page of the action column is found
    while the rows are written, after the video files went to the store. The file is named,
    the import removes its packs and commits nothing."""
    root = _copy(dataset, tmp_path)
    declare_stats(root)  # else the import computes stats, and reads the page first
    damage_page(_data_files(root)[-1], "action")
    with pytest.raises(LeRobotDatasetError, match=r"file-002\.parquet cannot be read: "):
        ingest_lerobot(root, str(tmp_path / "new"))
    assert not any(p.is_file() for p in (tmp_path / "new").rglob("*"))
    uri = str(tmp_path / "existing")
    ingest_lerobot(dataset, uri)
    before = _tree(tmp_path / "existing")
    with pytest.raises(LeRobotDatasetError, match=r"file-002\.parquet cannot be read: "):
        ingest_lerobot(root, uri, mode="append", again=True)
    assert open_table(uri).version == 1
    assert _tree(tmp_path / "existing") == before


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


# --- a hostile dataset loses nothing: refused before anything is written -------------------

TOP = "videos/observation.images.top/chunk-000"


def _data_files(root: Path) -> list[Path]:
    return sorted(root.glob("data/*/*.parquet"))


def _each_data_file(root: Path, change) -> None:
    for path in _data_files(root):
        _rewrite_parquet(path, change)


def _with_column(name: str, values) -> callable:
    """A change adding (or replacing) column ``name``, ``values(table)`` its values."""

    def change(table: pa.Table) -> pa.Table:
        if name in table.column_names:
            return table.set_column(table.column_names.index(name), name, values(table))
        return table.append_column(name, values(table))

    return change


def _first_file_value(name: str, value, kind=None) -> callable:
    """A change of the first data file's column ``name``: row 3 becomes ``value``."""

    def change(table: pa.Table) -> pa.Table:
        values = table[name].to_pylist()
        values[3] = value
        return _with_column(name, lambda t: pa.array(values, kind or table[name].type))(table)

    return change


def _retyped(name: str, kind) -> callable:
    return _with_column(name, lambda t: t[name].cast(pa.string()).cast(kind))


def _episode_value(column: str, episode: int, value, kind=None) -> callable:
    def change(root: Path) -> None:
        def edit(table: pa.Table) -> pa.Table:
            values = table[column].to_pylist()
            values[episode] = value
            kind_ = kind or table[column].type
            return table.set_column(
                table.column_names.index(column), column, pa.array(values, kind_)
            )

        _rewrite_parquet(_episodes_file(root), edit)

    return change


def _invalid_utf8(values: list[bytes]) -> pa.Array:
    """A string array holding ``values`` as they are (Arrow's casts would refuse them)."""
    binary = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(values), binary.buffers())


def _write_tasks(root: Path, tasks: list, indices: list[int] | None = None) -> None:
    import pandas as pd

    frame = pd.DataFrame({"task_index": indices or list(range(len(tasks)))}, index=tasks)
    frame.to_parquet(root / "meta/tasks.parquet")


def _video(root: Path, key: str, file: int) -> Path:
    return root / f"videos/{key}/chunk-000/file-{file:03d}.mp4"


def _truncate(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _faststart(path: Path) -> None:
    """Remux ``path`` with its index (moov) before the frames, as `-movflags faststart` does."""
    import av

    out = path.with_suffix(".tmp.mp4")
    with (
        av.open(str(path)) as source,
        av.open(str(out), "w", format="mp4", options={"movflags": "faststart"}) as target,
    ):
        stream = target.add_stream_from_template(source.streams.video[0], opaque=True)
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                target.mux(packet)
    out.replace(path)


def _encode(path: Path, frames: int, fps: int, size: tuple[int, int]) -> None:
    from blobhouse.read.video import encode_video

    rng = np.random.default_rng(1)
    images = (rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(frames))
    encode_video(str(path), images, fps=fps, size=size, codec="mpeg4", gop=2)


def _truncated_faststart(root: Path) -> None:
    path = _video(root, "observation.images.top", 1)
    _faststart(path)
    _truncate(path, 0.6)


HOSTILE = {
    # names: every column the import makes, checked against every other
    "dotted data column beside an underscored one": (
        lambda r: _each_data_file(
            r,
            lambda t: _with_column("x_y", lambda t: pa.array([1.0] * t.num_rows))(
                _with_column("x.y", lambda t: pa.array([2.0] * t.num_rows))(t)
            ),
        ),
        r"data column 'x\.y' of .*file-000\.parquet and data column 'x_y' of "
        r".*file-000\.parquet would both be column 'x_y'",
    ),
    "data column given twice": (
        lambda r: _each_data_file(
            r, lambda t: t.append_column("action", pa.array([[9.0] * 6] * t.num_rows))
        ),
        r"data column 'action' of .*file-000\.parquet is there twice",
    ),
    # and against the rule of column names (Lance's row columns, backticks, ...)
    "data column named like Lance's row id": (
        lambda r: _each_data_file(r, _with_column("_rowid", lambda t: pa.array([1] * t.num_rows))),
        r"data column '_rowid' of .*file-000\.parquet cannot be a column of the table: its "
        r"name is one of Lance's row columns",
    ),
    "data column with a backtick": (
        lambda r: _each_data_file(r, _with_column("a`b", lambda t: pa.array([1] * t.num_rows))),
        r"data column 'a`b' of .*file-000\.parquet cannot be a column of the table: its name "
        r"must be without '`'",
    ),
    "data column named task": (
        lambda r: _each_data_file(r, _with_column("task", lambda t: pa.array(["x"] * t.num_rows))),
        r"data column 'task' of .*file-000\.parquet would be replaced by the import's column "
        r"'task' \(each frame's task text\)",
    ),
    "data column named as a camera's frame time": (
        lambda r: _each_data_file(
            r,
            _with_column(
                "observation.images.top_timestamp", lambda t: pa.array([0.5] * t.num_rows)
            ),
        ),
        r"data column 'observation\.images\.top_timestamp' of .*file-000\.parquet would be "
        r"replaced by the import's column 'observation_images_top_timestamp' \(the frame's time "
        r"in the video file of camera 'observation\.images\.top'\)",
    ),
    "data column named as a camera": (
        lambda r: _each_data_file(
            r, _with_column("observation_images_wrist", lambda t: pa.array([1] * t.num_rows))
        ),
        r"data column 'observation_images_wrist' of .*file-000\.parquet would be replaced by "
        r"the import's column 'observation_images_wrist' \(the video of camera "
        r"'observation\.images\.wrist'\)",
    ),
    "data files with different columns": (
        lambda r: _rewrite_parquet(_data_files(r)[1], lambda t: t.drop_columns(["action"])),
        r"file-001\.parquet: its columns .* differ from those of .*file-000\.parquet",
    ),
    # text: kept as text, or refused naming the row
    "task text not UTF-8": (
        lambda r: _write_tasks(r, [b"pick up the cube", b"push \xff the block"]),
        r"meta/tasks\.parquet: the task of task_index 1 is not UTF-8 text: b'push \\xff",
    ),
    "task text a number": (
        lambda r: _write_tasks(r, [5, 6]),
        r"meta/tasks\.parquet: the task of task_index 0 must be text, got 5",
    ),
    "task_index twice": (
        lambda r: _write_tasks(r, ["pick up the cube", "push"], [0, 0]),
        r"meta/tasks\.parquet: task_index 0 appears twice",
    ),
    "data text not UTF-8": (
        lambda r: _each_data_file(
            r,
            _with_column(
                "note",
                lambda t: _invalid_utf8([b"ok"] * 3 + [b"\xc3("] + [b"ok"] * (t.num_rows - 4)),
            ),
        ),
        r"file-000\.parquet: column 'note' of frame index 3 is not UTF-8 text: b'\\xc3\('",
    ),
    # numbers: of the right type, finite, in range
    "timestamp inf": (
        lambda r: _rewrite_parquet(_data_files(r)[0], _first_file_value("timestamp", float("inf"))),
        r"file-000\.parquet: timestamp of frame index 3 is inf: a frame's time in seconds "
        r"from its episode's start must be a finite number >= 0",
    ),
    "timestamp nan": (
        lambda r: _rewrite_parquet(_data_files(r)[0], _first_file_value("timestamp", float("nan"))),
        r"file-000\.parquet: timestamp of frame index 3 is nan",
    ),
    "timestamp negative": (
        lambda r: _rewrite_parquet(_data_files(r)[0], _first_file_value("timestamp", -1.0)),
        r"file-000\.parquet: timestamp of frame index 3 is -1\.0",
    ),
    "timestamp far past the video": (
        lambda r: _rewrite_parquet(_data_files(r)[0], _first_file_value("timestamp", 3e38)),
        r"file-000\.mp4 \(camera 'observation\.images\.top', episode 0\): episode 0 needs a "
        r"frame at 3e\+38 s \(the frame before its last at 30 fps\): no frame at 3e\+38 s: the "
        r"nearest is at 1\.966667 s",
    ),
    "timestamps as strings": (
        lambda r: _each_data_file(r, _retyped("timestamp", pa.string())),
        r"file-000\.parquet: timestamp must hold numbers, it holds string",
    ),
    "episode_index as strings": (
        lambda r: _each_data_file(r, _retyped("episode_index", pa.string())),
        r"file-000\.parquet: episode_index must hold integers, it holds string",
    ),
    "index as floats": (
        lambda r: _each_data_file(r, _retyped("index", pa.float64())),
        r"file-000\.parquet: index must hold integers, it holds double",
    ),
    "a frame field's page damaged": (
        lambda r: damage_page(_data_files(r)[0], "timestamp"),
        r"file-000\.parquet cannot be read: ",
    ),
    "frames of an episode miscounted": (
        lambda r: _rewrite_parquet(_data_files(r)[0], _first_file_value("episode_index", 1)),
        r"episode 0 has 29 frames in .*data, but .*meta/episodes gives its length as 30",
    ),
    "from_timestamp inf": (
        _episode_value("videos/observation.images.top/from_timestamp", 2, float("inf")),
        r"meta/episodes/chunk-000/file-000\.parquet: "
        r"videos/observation\.images\.top/from_timestamp of episode 2 is inf",
    ),
    "from_timestamp nan": (
        _episode_value("videos/observation.images.wrist/from_timestamp", 1, float("nan")),
        r"videos/observation\.images\.wrist/from_timestamp of episode 1 is nan",
    ),
    "from_timestamp as strings": (
        lambda r: _rewrite_parquet(
            _episodes_file(r),
            _retyped("videos/observation.images.top/from_timestamp", pa.string()),
        ),
        r"file-000\.parquet: videos/observation\.images\.top/from_timestamp must hold numbers, "
        r"it holds string",
    ),
    "chunk_index as strings": (
        lambda r: _rewrite_parquet(
            _episodes_file(r), _retyped("videos/observation.images.top/chunk_index", pa.string())
        ),
        r"videos/observation\.images\.top/chunk_index must hold integers, it holds string",
    ),
    "length negative": (
        _episode_value("length", 1, -5),
        r"length of episode 1 is -5: it must be >= 0",
    ),
    "fps NaN": (
        lambda r: _edit_info(r, lambda i: i.update(fps=float("nan"))),
        r"meta/info\.json: fps must be a positive number, got nan",
    ),
    "fps Infinity": (
        lambda r: _edit_info(r, lambda i: i.update(fps=float("inf"))),
        r"meta/info\.json: fps must be a positive number, got inf",
    ),
    "fps too large for a float": (
        lambda r: _edit_info(r, lambda i: i.update(fps=10**400)),
        r"meta/info\.json: fps must be a positive number, got 1000000000",
    ),
    "video size as strings": (
        lambda r: _edit_info(
            r,
            lambda i: i["features"]["observation.images.top"]["info"].update(
                {"video.height": "32"}
            ),
        ),
        r"meta/info\.json: features\.observation\.images\.top\.info\.video\.height must be a "
        r"positive integer, got '32'",
    ),
    # video files: opened and checked against the episodes that use them
    "video truncated": (
        lambda r: _truncate(_video(r, "observation.images.top", 1), 0.6),
        r"file-001\.mp4 \(camera 'observation\.images\.top', episodes 2, 3\): it cannot be "
        r"opened as a video",
    ),
    "video truncated, its index first": (
        _truncated_faststart,
        r"file-001\.mp4 \(camera 'observation\.images\.top', episodes? .*3\): it is truncated",
    ),
    "video not a video": (
        lambda r: _video(r, "observation.images.wrist", 2).write_bytes(b"\x00" * 5000),
        r"file-002\.mp4 \(camera 'observation\.images\.wrist', episode 4\): it cannot be "
        r"opened as a video",
    ),
    "video of another size": (
        lambda r: _encode(_video(r, "observation.images.top", 0), 60, 30, (64, 64)),
        r"file-000\.mp4 \(camera 'observation\.images\.top', episodes 0, 1\): its frames are "
        r"64x64 \(width x height\), but .*meta/info\.json declares 48x32",
    ),
    "video of another episode": (
        lambda r: shutil.copy(
            _video(r, "observation.images.top", 2), _video(r, "observation.images.top", 0)
        ),
        r"file-000\.mp4 \(camera 'observation\.images\.top', episode 1\): episode 1 needs a "
        r"frame at 1\.933333 s \(the frame before its last at 30 fps\): no frame at "
        r"1\.933333 s: the nearest is at 0\.966667 s",
    ),
    "video at another frame rate": (
        lambda r: _encode(_video(r, "observation.images.top", 1), 30, 15, (32, 48)),
        r"file-001\.mp4 \(camera 'observation\.images\.top', episode 2\): it has no frames "
        r"between 0\.133333 s and 0\.200000 s, where episode 2 needs one every 0\.033333 s "
        r"\(at 30 fps\)",
    ),
}


@pytest.fixture(scope="module")
def existing(dataset, tmp_path_factory) -> str:
    """A table the hostile imports append to: each must leave it as it was."""
    uri = str(tmp_path_factory.mktemp("existing") / "robot")
    ingest_lerobot(dataset, uri)
    return uri


@pytest.mark.parametrize("problem", list(HOSTILE))
def test_a_hostile_dataset_is_refused_before_anything_is_written(
    dataset, existing, tmp_path, problem
):
    root = _copy(dataset, tmp_path)
    damage, message = HOSTILE[problem]
    damage(root)
    with pytest.raises(LeRobotDatasetError, match=message):
        ingest_lerobot(root, str(tmp_path / "robot"))
    assert not (tmp_path / "robot").exists()
    before = _tree(Path(existing))
    with pytest.raises(LeRobotDatasetError, match=message):
        ingest_lerobot(root, existing, mode="append")
    assert open_table(existing).version == 1
    assert _tree(Path(existing)) == before


def test_binary_task_texts_are_kept_as_their_text(dataset, tmp_path):
    root = _copy(dataset, tmp_path)
    _write_tasks(root, [b"pick up the cube", "push the bl\u00f6ck".encode()])
    table = ingest_lerobot(root, str(tmp_path / "robot")).table
    assert set(table.to_arrow(columns=["task"])["task"].to_pylist()) == {
        "pick up the cube",
        "push the bl\u00f6ck",
    }


@pytest.mark.parametrize(
    ("codec", "per_file", "faststart"),
    [("libsvtav1", 2, False), ("libx264", 3, False), ("libx264", 1, True), ("mpeg4", 5, False)],
)
def test_real_layouts_are_never_refused(tmp_path, codec, per_file, faststart):
    """AV1 (LeRobot's default) and H.264 (B-frames), several episodes per file or one, the
    index before or after the frames: the checks of the video files pass and every frame
    decodes."""
    from blobhouse.torch import TableRowDataset

    root = write_sample_dataset(
        tmp_path / "ds", episodes=5, frames=17, cameras=CAMERAS[:1], size=(24, 32),
        episodes_per_file=per_file, codec=codec, gop=4,
    )  # fmt: skip
    if faststart:
        for path in _videos(root):
            _faststart(path)
    table = ingest_lerobot(root, str(tmp_path / "robot")).table
    rows = TableRowDataset(table, ["index"], frames=["observation_images_top"])
    frames = rows.__getitems__(list(range(len(rows))))
    assert len(frames) == 85 and all(
        r["observation_images_top"].shape == (24, 32, 3) for r in frames
    )


def test_the_command_refuses_a_hostile_dataset_and_writes_nothing(dataset, tmp_path):
    root = _copy(dataset, tmp_path)
    _truncate(_video(root, "observation.images.wrist", 0), 0.5)
    run = subprocess.run(
        [sys.executable, "-m", "blobhouse.cli", "ingest-lerobot", str(root), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert run.returncode == 2, run.stderr
    assert "file-000.mp4 (camera 'observation.images.wrist', episodes 0, 1)" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "t").exists()


def test_an_import_of_videos_without_pyav_names_the_extra(dataset, tmp_path, monkeypatch):
    from blobhouse.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(
        MissingExtraError, match=r"LeRobot imports of video files need PyAV.*\[video\]"
    ):
        ingest_lerobot(dataset, str(tmp_path / "robot"))
    assert not (tmp_path / "robot").exists()
