"""The stats an import computes for the features a LeRobot dataset's ``meta/stats.json`` lacks,
in LeRobot's form: numbers over every frame (quantiles from a histogram, as LeRobot's), camera
features per channel over frames sampled from each episode. Checked against the frames the
sample writer drew (not against blobhouse's decoding) and numpy's statistics."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blobhouse.errors import LeRobotDatasetError
from blobhouse.lerobot import dataset_info, ingest_lerobot
from blobhouse.lerobot.sample import (
    FIRST_IMAGE_CAMERA,
    IMAGE_SIZE,
    drawn_frame,
    write_sample_dataset,
)
from blobhouse.lerobot.stats import QUANTILES, downsampled, sample_offsets

EPISODES, FRAMES, SIZE = 3, 120, (32, 48)
WRIST = "observation.images.wrist"
CAMERA = "observation.images.cam"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_sample_dataset(
        tmp_path_factory.mktemp("stats") / "ds",
        episodes=EPISODES,
        frames=FRAMES,
        size=SIZE,
        images=[WRIST],
        episodes_per_file=2,
    )


@pytest.fixture(scope="module")
def stats(source, tmp_path_factory) -> dict:
    table = ingest_lerobot(source, str(tmp_path_factory.mktemp("stats") / "robot")).table
    return dataset_info(table).meta.stats


def _drawn(size: tuple[int, int], camera: int) -> np.ndarray:
    """The sampled frames of every episode as the sample writer drew them: samples x pixels
    x channels, scaled to [0, 1]."""
    offsets = sample_offsets(FRAMES)
    frames = [
        downsampled(drawn_frame(size, e, int(f), camera)) for e in range(EPISODES) for f in offsets
    ]
    return np.stack(frames).reshape(len(frames), -1, 3) / 255.0


def test_sampling_follows_lerobots_rule():
    assert len(sample_offsets(FRAMES)) == 100  # LeRobot: at least 100, or every frame
    assert len(sample_offsets(20_000)) == int(20_000**0.75)
    assert sample_offsets(20_000)[[0, -1]].tolist() == [0, 19_999]


def test_image_features_get_exact_per_channel_stats(stats):
    pixels = _drawn(
        IMAGE_SIZE, FIRST_IMAGE_CAMERA
    )  # PNG is lossless: the stats are the drawn pixels'
    got = {name: np.asarray(value) for name, value in stats[WRIST].items()}
    assert got["mean"].shape == (3, 1, 1)  # LeRobot's per-channel shape
    assert got["count"].tolist() == [EPISODES * 100]
    values = pixels.transpose(2, 0, 1).reshape(3, -1)
    assert np.allclose(got["mean"].ravel(), values.mean(axis=1))
    assert np.allclose(got["std"].ravel(), values.std(axis=1))
    assert np.array_equal(got["min"].ravel(), values.min(axis=1))
    assert np.array_equal(got["max"].ravel(), values.max(axis=1))
    for name, q in QUANTILES.items():
        expected = np.quantile(values, q, axis=1, method="inverted_cdf")
        assert np.allclose(got[name].ravel(), expected), name


def test_video_features_get_stats_of_their_decoded_frames(stats):
    pixels = _drawn(SIZE, 0)  # AV1 is lossy: near the drawn frames, not equal
    got = {name: np.asarray(value).ravel() for name, value in stats[CAMERA].items()}
    assert np.asarray(stats[CAMERA]["std"]).shape == (3, 1, 1)
    assert got["count"].tolist() == [EPISODES * 100]
    values = pixels.transpose(2, 0, 1).reshape(3, -1)
    assert np.abs(got["mean"] - values.mean(axis=1)).max() < 0.02
    assert np.abs(got["std"] - values.std(axis=1)).max() < 0.02
    assert np.abs(got["q50"] - np.median(values, axis=1)).max() < 0.05
    assert ((got["min"] >= 0) & (got["max"] <= 1) & (got["min"] < got["max"])).all()


def test_numbers_get_moments_and_quantiles_of_every_frame(source, stats):
    rows = pa.concat_tables(pq.read_table(p) for p in sorted(source.glob("data/*/*.parquet")))
    action = np.stack(rows["action"].to_numpy(zero_copy_only=False)).astype(np.float64)
    got = {name: np.asarray(value) for name, value in stats["action"].items()}
    assert got["count"].tolist() == [EPISODES * FRAMES]
    assert np.allclose(got["mean"], action.mean(axis=0))
    assert np.allclose(got["std"], action.std(axis=0))
    assert np.array_equal(got["min"], action.min(axis=0))
    ordered = np.sort(action, axis=0)
    slack = (ordered[-1] - ordered[0]) / 5000 + 1e-9  # a histogram bin
    for name, q in QUANTILES.items():
        at = q * len(ordered)  # between the order statistics around it
        low = ordered[max(int(np.floor(at)) - 1, 0)] - slack
        high = ordered[min(int(np.ceil(at)), len(ordered) - 1)] + slack
        assert ((got[name] >= low) & (got[name] <= high)).all(), name
    assert stats["frame_index"]["max"] == [FRAMES - 1.0]


def test_an_append_aggregates_camera_stats(source, stats, tmp_path):
    uri = str(tmp_path / "robot")
    ingest_lerobot(source, uri)
    twice = dataset_info(ingest_lerobot(source, uri, mode="append", again=True).table)
    both = twice.meta.stats[WRIST]
    assert both["count"] == [2 * EPISODES * 100]
    assert np.allclose(both["mean"], stats[WRIST]["mean"])
    assert np.allclose(both["std"], stats[WRIST]["std"])


def test_an_image_that_does_not_decode_is_named_and_nothing_is_written(source, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(source, copy)
    path = copy / "data/chunk-000/file-001.parquet"  # episode 2 starts there
    rows = pq.read_table(path)
    images = rows[WRIST].combine_chunks()
    data = images.field("bytes").to_pylist()
    data[0] = b"not a png"
    broken = pa.StructArray.from_arrays([pa.array(data, pa.binary()), images.field("path")],
                                        ["bytes", "path"])  # fmt: skip
    pq.write_table(rows.set_column(rows.schema.get_field_index(WRIST), WRIST, broken), path)
    with pytest.raises(LeRobotDatasetError, match=rf"{WRIST}'? of a frame of episode 2"):
        ingest_lerobot(copy, str(tmp_path / "robot"))
    assert not (tmp_path / "robot").exists()
