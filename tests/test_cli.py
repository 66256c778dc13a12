"""The main job and the CLI, end to end on small data."""

from __future__ import annotations

import json

from conftest import stock_read

from blobhouse.cli import main
from blobhouse.demo import EpisodeData


def test_demo_writes_verifies_and_reports(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    assert main(["demo", "--rows", "75", "--out", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 75
    assert report["mismatches"] == 0
    assert report["verified_blobs"] == 225
    # three video chunks referenced by 75 rows; one calibration for the episode
    data = EpisodeData(75)
    chunks = [len(data.chunk(i)) for i in range(3)]
    assert report["columns"]["video"]["physical_bytes"] == sum(chunks)
    assert (
        report["columns"]["video"]["logical_bytes"]
        == 30 * chunks[0] + 30 * chunks[1] + 15 * chunks[2]
    )
    assert report["columns"]["calibration"]["dedup_ratio"] == 75.0
    assert stock_read(out, "video") == [data.payload("video", r) for r in range(75)]


def test_stats_command(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    main(["demo", "--rows", "30", "--out", out])
    capsys.readouterr()
    assert main(["stats", out]) == 0
    text = capsys.readouterr().out
    assert "30 rows" in text and "video" in text
    assert main(["stats", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 30


def test_missing_table_is_a_clear_error(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert "no table at" in capsys.readouterr().err
