"""Decoded frames of video columns (`frames=`): exact frames by timestamp, each distinct chunk
of a batch decoded once, chunk-window shuffling, DataLoader workers, and clear errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import av
import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import blobhouse.read.video
from blobhouse import Blob, blob_array, open_table, write_table
from blobhouse.errors import CorruptBlobError, InvalidInputError, MissingExtraError, VideoFrameError
from blobhouse.lerobot import ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset
from blobhouse.loader import BatchLoader
from blobhouse.read.video import decode_frames, encode_test_video, encode_video
from blobhouse.torch import TableBatchDataset, TableRowDataset, collate_rows
from tests.helpers import flip_payload

CAMERAS = ("observation.images.top", "observation.images.wrist")
COLUMNS = ["observation_images_top", "observation_images_wrist"]
EPISODES, FRAMES, PER_FILE = 4, 40, 2


@pytest.fixture(scope="module")
def robot(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("frames")
    root = write_sample_dataset(
        folder / "ds", episodes=EPISODES, frames=FRAMES, cameras=CAMERAS, size=(24, 32),
        episodes_per_file=PER_FILE,
    )  # fmt: skip
    return root, str(ingest_lerobot(root, str(folder / "robot")).table.snapshot.location.root)


@pytest.fixture(scope="module")
def reference(robot) -> dict[tuple[str, int], np.ndarray]:
    """Every frame by (camera column, row index), decoded by walking each file start to end."""
    root, _ = robot
    frames = {}
    for key, column in zip(CAMERAS, COLUMNS, strict=True):
        files = sorted((root / "videos" / key / "chunk-000").iterdir())
        for number, path in enumerate(files):
            with av.open(str(path)) as container:
                for position, frame in enumerate(container.decode(video=0)):
                    index = number * PER_FILE * FRAMES + position
                    frames[(column, index)] = frame.to_ndarray(format="rgb24")
    return frames


def _same(rows, reference, layout="hwc") -> None:
    for row in rows:
        for column in COLUMNS:
            frame = row[column]
            expected = reference[(column, row["index"])]
            got = frame if layout == "hwc" else np.asarray(frame).transpose(1, 2, 0)
            assert np.array_equal(np.asarray(got), expected), (column, row["index"])


def test_the_loader_hands_each_row_its_exact_frame(robot, reference):
    _, uri = robot
    loader = BatchLoader(uri, ["index"], batch_size=16, frames=COLUMNS, seed=3)
    rows = [row for batch in loader.row_batches() for row in batch]
    assert sorted(r["index"] for r in rows) == list(range(EPISODES * FRAMES))
    _same(rows, reference)
    assert rows[0][COLUMNS[0]].dtype == np.uint8 and rows[0][COLUMNS[0]].shape == (24, 32, 3)
    with pytest.raises(InvalidInputError, match=r"row_batches\(\)"):
        next(iter(loader))


def test_each_distinct_chunk_of_a_batch_is_decoded_once(robot, monkeypatch):
    _, uri = robot
    calls: list[int] = []
    real = blobhouse.read.video.decode_frames

    def counted(chunk, timestamps, **kwargs):
        calls.append(len(timestamps))
        return real(chunk, timestamps, **kwargs)

    monkeypatch.setattr(blobhouse.read.video, "decode_frames", counted)
    loader = BatchLoader(uri, ["index"], batch_size=64, frames=COLUMNS[:1], shuffle=False)
    batches = list(loader.row_batches())
    # video files hold 80 frames: rows 0-63 lie in file 0 (one decode of 64 frames), rows
    # 64-127 straddle files 0 and 1 (two decodes), rows 128-159 lie in file 1
    assert sorted(calls) == [16, 32, 48, 64]  # batches are read on threads, in any order
    assert sum(calls) == EPISODES * FRAMES and len(batches) == 3


def test_chunk_windows_keep_batches_inside_few_chunks_and_read_every_row(robot):
    _, uri = robot
    windowed = BatchLoader(uri, ["index"], batch_size=16, shuffle_window=16, seed=5)
    rowwise = BatchLoader(uri, ["index"], batch_size=16, seed=5)

    def episodes_per_batch(loader):
        return [len({r["index"] // FRAMES for r in b}) for b in loader.row_batches()]

    assert max(episodes_per_batch(windowed)) <= 2 < max(episodes_per_batch(rowwise))
    first = [r["index"] for b in windowed.row_batches() for r in b]
    windowed.set_epoch(1)
    second = [r["index"] for b in windowed.row_batches() for r in b]
    assert sorted(first) == sorted(second) == list(range(EPISODES * FRAMES))
    assert first != second
    state = windowed.state_dict()
    assert state["shuffle_window"] == 16
    with pytest.raises(InvalidInputError, match="shuffle_window 16"):
        BatchLoader(uri, batch_size=16, seed=5).load_state_dict({**state, "position": 1})


def test_an_av1_encode_leaves_the_process_scheduled_as_it_was():
    """SVT-AV1, run as root, made the encoding thread real-time (SCHED_FIFO 99): a Spark JVM
    started after it inherited that, spun, and starved the suite's 2-core machine."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    encode_test_video(4, 30, (16, 16))
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    started = subprocess.run(["chrt", "-p", str(os.getpid())], capture_output=True, text=True)
    assert "SCHED_FIFO" not in started.stdout  # what a child would inherit


def test_a_window_past_the_table_shuffles_the_whole_table(robot):
    _, uri = robot
    rows = list(range(EPISODES * FRAMES))
    for window in (EPISODES * FRAMES, 2**63):  # numpy's arange once failed on the huge one
        loader = BatchLoader(uri, ["index"], batch_size=16, shuffle_window=window, seed=5)
        order = [r["index"] for b in loader.row_batches() for r in b]
        assert sorted(order) == rows and order != rows


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_stacks_frames_decoded_in_its_workers(robot, reference, workers):
    _, uri = robot
    dataset = TableBatchDataset(
        uri, ["index", "observation_state"], batch_size=20, frames=COLUMNS, frame_layout="chw",
        shuffle_window=20,
    )  # fmt: skip
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
    )  # fmt: skip
    seen = []
    for batch in loader:
        frames = batch[COLUMNS[1]]
        assert frames.dtype == torch.uint8 and frames.shape[1:] == (3, 24, 32)
        assert batch["observation_state"].shape == (len(frames), 6)
        for position, index in enumerate(batch["index"].tolist()):
            expected = reference[(COLUMNS[1], index)]
            assert np.array_equal(frames[position].permute(1, 2, 0).numpy(), expected)
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(EPISODES * FRAMES))


def test_the_row_dataset_decodes_a_sampler_batch(robot, reference):
    _, uri = robot
    rows = TableRowDataset(uri, ["index"], frames=COLUMNS)
    batch = rows.__getitems__([5, 150, 5, 79])
    _same(batch, reference)
    assert batch[0][COLUMNS[0]] is batch[2][COLUMNS[0]]  # one frame for the same row twice


def test_bad_frame_options_are_named(robot, tmp_path):
    _, uri = robot
    with pytest.raises(InvalidInputError, match="frame_layout must be one of"):
        BatchLoader(uri, batch_size=4, frames=COLUMNS, frame_layout="HWC")
    with pytest.raises(InvalidInputError, match="blobs must be 'bytes', not 'refs'"):
        BatchLoader(uri, batch_size=4, frames=COLUMNS, blobs="refs")
    with pytest.raises(InvalidInputError, match="frames must be a list of column names"):
        TableRowDataset(uri, frames="observation_images_top")
    with pytest.raises(InvalidInputError, match=r"list of column names, got \['cam', 3\]"):
        BatchLoader(uri, batch_size=4, frames=["cam", 3])
    with pytest.raises(InvalidInputError, match="by string, got 'cam': 3"):
        BatchLoader(uri, batch_size=4, frames={"cam": 3})
    with pytest.raises(InvalidInputError, match="shuffle_window must be >= 1"):
        BatchLoader(uri, batch_size=4, shuffle_window=0)
    missing = TableRowDataset(uri, frames={"observation_images_top": "when"})
    with pytest.raises(
        InvalidInputError, match="timestamp of 'observation_images_top' column 'when'"
    ):
        missing[0]


def test_a_timestamp_without_a_frame_or_a_damaged_chunk_is_named():
    chunk = encode_test_video(frames=10, fps=30, size=(16, 16))
    with pytest.raises(VideoFrameError, match=r"no frame at 0\.016667 s: the nearest is at"):
        decode_frames(chunk, [0.5 / 30])
    with pytest.raises(VideoFrameError, match=r"no frame at 5\.000000 s"):
        decode_frames(chunk, [5.0])
    with pytest.raises(VideoFrameError, match="cannot be decoded"):
        decode_frames(b"not a video at all" * 100, [0.0])
    assert decode_frames(chunk, []) == []


def test_decoding_matches_a_full_walk_for_any_set_of_timestamps():
    """Random subsets, repeats and orders against decoding every frame: the seek-or-decode
    walk never hands a row a neighbouring frame (codecs with B-frames and long GOPs too)."""
    rng = np.random.default_rng(0)
    for codec, gop in (("libsvtav1", 2), ("libx264", 12), ("mpeg4", 30)):
        chunk = encode_test_video(frames=90, fps=30, size=(16, 24), codec=codec, gop=gop)
        with av.open(io.BytesIO(chunk)) as container:
            every = [(f.time, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
        for _ in range(10):
            picked = rng.choice(len(every), size=int(rng.integers(1, 30)))
            frames = decode_frames(chunk, [every[i][0] for i in picked])
            assert all(np.array_equal(f, every[i][1]) for f, i in zip(frames, picked, strict=True))
        assert len(every) == 90


def test_frames_without_pyav_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(MissingExtraError, match=r'pip install "blobhouse\[video\]"'):
        decode_frames(b"", [0.0])
    with pytest.raises(MissingExtraError, match="frames need PyAV"):
        BatchLoader("unused", batch_size=4, frames=["cam"])


def _bytes_read() -> int:
    with open("/proc/self/io") as io_stats:
        return next(int(line.split()[1]) for line in io_stats if line.startswith("rchar"))


def test_a_chunk_is_checked_whole_once_then_read_by_range(tmp_path):
    """The first batch to meet a chunk reads it whole and checks it against the row's recorded
    hash; later ones read only what their frames need. A damaged chunk is named."""
    chunk = encode_test_video(frames=300, fps=30, size=(128, 128), codec="mpeg4", gop=10)
    uri = str(tmp_path / "t")
    write_table(
        pa.table(
            {
                "i": list(range(300)),
                "cam": blob_array([Blob(data=chunk, ref_id=1)] * 300),
                "cam_timestamp": [i / 30 for i in range(300)],
            }
        ),
        uri,
    )
    rows = TableRowDataset(uri, ["i"], frames=["cam"])
    started = _bytes_read()
    rows.__getitems__([0])
    assert _bytes_read() - started >= len(chunk)
    started = _bytes_read()
    frame = rows.__getitems__([150])[0]["cam"]
    assert _bytes_read() - started < len(chunk) // 4
    assert frame.shape == (128, 128, 3)

    flip_payload(uri, "cam", 0)
    with pytest.raises(CorruptBlobError, match="cam"):
        TableRowDataset(uri, ["i"], frames=["cam"])[3]


def _one_chunk_table(uri: str, chunk: bytes, times: list[float]) -> None:
    write_table(
        pa.table(
            {
                "i": list(range(len(times))),
                "cam": blob_array([Blob(data=chunk, ref_id=1)] * len(times)),
                "cam_timestamp": times,
            }
        ),
        uri,
    )


def _readers(uri: str, **options):
    """Every reader that takes frames=, each reading rows 0-3 of ``uri`` (column i, frames of
    cam) in one batch: what each returns (or raises)."""
    return {
        "BatchLoader": lambda: [
            r for b in BatchLoader(
                uri, ["i"], batch_size=4, shuffle=False, filter="i < 4", frames=["cam"], **options
            ).row_batches() for r in b
        ],
        "TableBatchDataset": lambda: list(
            DataLoader(
                TableBatchDataset(uri, ["i"], batch_size=4, shuffle=False, filter="i < 4",
                                  frames=["cam"], **options),
                batch_size=None,
            )
        ),
        "TableRowDataset": lambda: TableRowDataset(uri, ["i"], frames=["cam"], **options)
        .__getitems__([0, 1, 2, 3]),
    }  # fmt: skip


@pytest.mark.parametrize("reader", ["BatchLoader", "TableBatchDataset", "TableRowDataset"])
def test_a_chunk_damaged_after_one_loader_checked_it_is_caught_by_the_next(tmp_path, reader):
    """Each loader checks the chunks it meets: a new loader in the same process reads the
    chunk whole again and finds the damage (column, row and file named), though an earlier
    loader found it whole."""
    uri = str(tmp_path / "t")
    _one_chunk_table(uri, encode_test_video(frames=30, fps=30, size=(32, 32), codec="mpeg4"),
                     [i / 30 for i in range(30)])  # fmt: skip
    read = _readers(uri)[reader]
    assert len(read()) in (1, 4)  # checked, and decoded
    flip_payload(uri, "cam", 0)
    ref = open_table(uri).blob_refs("cam", [0])[0].as_py()
    with pytest.raises(
        CorruptBlobError, match=rf"'cam', fragment 0 row \d: the bytes at {ref['uri']}"
    ):
        read()


@pytest.fixture(scope="module")
def huge_frames(tmp_path_factory) -> tuple[str, bytes]:
    """A table whose chunk is a small MP4 of 4096 x 4096 frames (50 MB each, decoded)."""
    out = io.BytesIO()
    flat = (np.full((4096, 4096, 3), 90 * i, np.uint8) for i in range(2))
    encode_video(out, flat, fps=30, size=(4096, 4096), codec="libx264", gop=2)
    chunk = out.getvalue()
    uri = str(tmp_path_factory.mktemp("huge") / "t")
    _one_chunk_table(uri, chunk, [0.0, 1 / 30, 0.0, 1 / 30])
    return uri, chunk


@pytest.mark.parametrize("reader", ["BatchLoader", "TableBatchDataset", "TableRowDataset"])
def test_frames_larger_than_the_pixel_limit_are_refused_naming_the_chunk(huge_frames, reader):
    uri, chunk = huge_frames
    assert len(chunk) < 100_000
    ref = open_table(uri).blob_refs("cam", [0])[0].as_py()
    where = (
        rf"video column 'cam' \(the chunk at {ref['uri']} \[{ref['position']}, \+{ref['size']}\), "
        r"first in row id \d+\): its frames are 4096x4096 \(width x height: 16,777,216 pixels\), "
        r"more than max_frame_pixels=8,294,400"
    )
    with pytest.raises(VideoFrameError, match=where):
        _readers(uri)[reader]()
    with pytest.raises(VideoFrameError, match="more than max_frame_pixels=1,000"):
        _readers(uri, max_frame_pixels=1000)[reader]()
    read = _readers(uri, max_frame_pixels=4096 * 4096)[reader]()  # raised: it decodes
    frames = [r["cam"] for r in read] if reader != "TableBatchDataset" else read[0]["cam"]
    assert tuple(frames[0].shape) == (4096, 4096, 3)


def test_timestamps_that_are_not_numbers_are_named(tmp_path):
    uri = str(tmp_path / "t")
    chunk = encode_test_video(frames=30, fps=30, size=(16, 16), codec="mpeg4")
    _one_chunk_table(uri, chunk, ["0.0", "0.5", "later", "0.1"])
    row = open_table(uri).row_ids()[0]
    for read in _readers(uri).values():
        with pytest.raises(
            VideoFrameError,
            match=rf"video column 'cam', row id {row}: its timestamp column 'cam_timestamp' holds "
            r"'0\.0', not a number of seconds",
        ):
            read()
    with pytest.raises(
        VideoFrameError, match=r"timestamps must be numbers of seconds, got 'later'"
    ):
        decode_frames(chunk, [0.0, "later"])


def test_the_pixel_limit_is_an_option_checked_by_every_reader(robot):
    _, uri = robot
    for value, message in (
        (0, "max_frame_pixels must be a whole number of pixels from 1 to 2\\*\\*63 - 1, got 0"),
        ("4k", "max_frame_pixels must be a whole number of pixels .*, got '4k'"),
        (True, "max_frame_pixels must be a whole number of pixels .*, got True"),
        (1e7, "max_frame_pixels must be a whole number of pixels .*, got 10000000.0"),
        (2**64, "max_frame_pixels must be a whole number of pixels .*, got 18446744073709551616"),
    ):
        for make, options in (
            (BatchLoader, {"batch_size": 4}),
            (TableBatchDataset, {"batch_size": 4}),
            (TableRowDataset, {}),
        ):
            for frames in (COLUMNS, None):  # checked whether frames are asked for or not
                with pytest.raises(InvalidInputError, match=message):
                    make(uri, frames=frames, max_frame_pixels=value, **options)
    with pytest.raises(VideoFrameError, match=r"its frames are 32x24 .* max_frame_pixels=100 "):
        decode_frames(open_table(uri).read_blobs(COLUMNS[0], [0])[0], [0.0], max_frame_pixels=100)


@pytest.mark.parametrize(
    ("time", "message"),
    [
        (float("inf"), r"the timestamp is inf: a frame's time must be a finite number"),
        (float("nan"), r"the timestamp is nan: a frame's time must be a finite number"),
        (3e38, r"cam_timestamp 3e\+38: no frame at 3e\+38 s: the nearest is at 0\.966667 s"),
        (-1.0, r"cam_timestamp -1\.0: no frame at -1\.000000 s: the nearest is at 0\.000000 s"),
    ],
)
def test_a_timestamp_that_is_no_frame_s_time_is_named_with_its_row(tmp_path, time, message):
    uri = str(tmp_path / "t")
    chunk = encode_test_video(frames=30, fps=30, size=(16, 16), codec="mpeg4")
    _one_chunk_table(uri, chunk, [0.0, 0.5, time, 0.1])
    row = open_table(uri).row_ids()[2]
    for read in _readers(uri).values():
        with pytest.raises(VideoFrameError, match=rf"video column 'cam' .*row id {row}.*{message}"):
            read()
    with pytest.raises(VideoFrameError, match=message.split(": ", 1)[-1]):
        decode_frames(chunk, [0.0, time])


def test_frames_of_an_imported_table_on_an_object_store(robot, reference, bucket):
    """On S3 and Azurite: the import stores each video file once in the table's store there,
    and the readers decode the same frames (a chunk read whole per batch: one GET)."""
    root, _ = robot
    uri = f"{bucket.uri}/robot"
    done = ingest_lerobot(root, uri, storage_options=bucket.options)
    assert done.table.count_rows() == EPISODES * FRAMES
    rows = TableRowDataset(uri, ["index"], frames=COLUMNS, storage_options=bucket.options)
    _same(rows.__getitems__([0, 79, 80, 159]), reference)


def test_frames_survive_compaction_by_blobhouse_and_by_lance(robot, reference, tmp_path):
    root, _ = robot
    uri = str(tmp_path / "robot")
    for n in range(3):  # three fragments, each referencing the same stored video files
        table = ingest_lerobot(root, uri, mode="append", again=n > 0).table
    table.compact()
    lance.dataset(uri).optimize.compact_files()
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0))
    rows = TableRowDataset(uri, ["index"], frames=COLUMNS)
    assert len(rows) == 3 * EPISODES * FRAMES
    got = rows.__getitems__([0, 79, 200, 479])
    assert [r["index"] for r in got] == [0, 79, 200, 479]  # each copy numbered after the last
    for row in got:
        row["index"] %= EPISODES * FRAMES  # the frame of the dataset's own row
    _same(got, reference)
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_collate_rows_stacks_frames_and_numbers_and_leaves_bytes_alone():
    frames = [np.full((2, 3, 3), i, np.uint8) for i in range(2)]
    batch = collate_rows(
        [
            {"f": frames[0], "i": 1, "s": [0.5, 1.0], "chunk": b"x" * 1000, "n": None},
            {"f": frames[1], "i": 2, "s": [1.5, 2.0], "chunk": b"y", "n": 3},
        ]
    )
    assert batch["f"].shape == (2, 2, 3, 3) and batch["f"].dtype == torch.uint8
    assert batch["i"].tolist() == [1, 2] and batch["s"].dtype == torch.float32
    assert batch["chunk"] == [b"x" * 1000, b"y"]  # bytes stay bytes (never copied per row)
    assert batch["n"] == [None, 3]
