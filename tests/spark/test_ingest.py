"""``blobhouse ingest`` and ``blobhouse.spark.ingest``: manifests checked before Spark starts,
rows and columns in manifest order, path columns, appends cast to the table's types, dedup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import blobhouse.spark as bs
from blobhouse import open_table
from blobhouse.cli import main
from blobhouse.errors import InvalidInputError
from blobhouse.progress import ProgressEvent
from blobhouse.spark.ingest import ingest, plan_ingest
from tests.helpers import stock_read

pytestmark = pytest.mark.usefixtures("spark")

NAMES = ["a.jpg", "c.mp4", "a.jpg", "b.jpg", "c.mp4", "a.jpg"]


@pytest.fixture
def media(tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    files = {
        name: os.urandom(size)
        for name, size in [("a.jpg", 150_000), ("b.jpg", 20_000), ("c.mp4", 900_000)]
    }
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder, files


def write_manifest(path, rows: list[dict], fmt: str | None = None) -> str:
    fmt = fmt or str(path).rsplit(".", 1)[-1]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        names = list(rows[0])
        lines = [",".join(names)] + [",".join(str(r[n]) for n in names) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def cli(*args: str) -> int:
    return main(["ingest", *args, "--master", "local[2]"])


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_ingest_stores_each_named_file_once(tmp_path, media, fmt, capsys):
    folder, files = media
    rows = [
        {"id": i, "image": f"media/{n}" if i % 2 else str(folder / n)} for i, n in enumerate(NAMES)
    ]
    manifest = write_manifest(tmp_path / f"rows.{fmt}", rows)
    table = str(tmp_path / "table")
    assert cli(manifest, table, "--blob-columns", "image") == 0
    assert "6 rows" in capsys.readouterr().out
    assert stock_read(table, "image") == [files[n] for n in NAMES]
    assert open_table(table).stats()["physical_bytes"] == sum(len(c) for c in files.values())


def test_rows_keep_manifest_order_in_one_task_or_many(tmp_path, media):
    _, files = media
    names = NAMES * 5  # grouping rows by file (the old shuffle) would reorder them
    rows = [{"id": 100 - i, "image": f"media/{n}"} for i, n in enumerate(names)]
    manifest = write_manifest(tmp_path / "rows.jsonl", rows)
    for tasks in (None, 4):
        table = str(tmp_path / f"table-{tasks}")
        flags = [] if tasks is None else ["--tasks", str(tasks)]
        assert cli(manifest, table, "--blob-columns", "image", *flags) == 0
        stored = open_table(table).to_arrow(columns=["id", "image_path"]).to_pylist()
        assert stored == [{"id": r["id"], "image_path": r["image"]} for r in rows]
        assert stock_read(table, "image") == [files[n] for n in names]


def test_jsonl_columns_keep_file_order_with_path_columns_beside_blobs(tmp_path, media):
    rows = [
        {"zone": "b", "image": "media/a.jpg", "alpha": 1.5, "depth": "media/b.jpg", "k": True},
        {"zone": "a", "image": "media/c.mp4", "alpha": 2.5, "depth": None, "k": False},
    ]
    manifest = write_manifest(tmp_path / "rows.jsonl", rows)
    table = str(tmp_path / "table")
    assert cli(manifest, table, "--blob-columns", "image,depth") == 0
    assert open_table(table).schema.names == [
        "zone",
        "image",
        "image_path",
        "alpha",
        "depth",
        "depth_path",
        "k",
    ]
    got = open_table(table).to_arrow(columns=["depth_path", "k"]).to_pylist()
    assert got == [{"depth_path": "media/b.jpg", "k": True}, {"depth_path": None, "k": False}]
    assert stock_read(table, "depth") == [media[1]["b.jpg"], None]


def test_path_columns_can_be_dropped(tmp_path, media):
    manifest = write_manifest(tmp_path / "rows.csv", [{"id": 1, "image": "media/a.jpg"}])
    table = str(tmp_path / "table")
    assert cli(manifest, table, "--blob-columns", "image", "--drop-path-columns") == 0
    assert open_table(table).schema.names == ["id", "image"]
    # appending with path columns to a table without them names the difference
    assert cli(manifest, table, "--blob-columns", "image") == 2


def test_csv_then_jsonl_append_to_one_table(tmp_path, media, capsys):
    _, files = media
    csv = write_manifest(tmp_path / "a.csv", [{"id": i, "image": "media/a.jpg"} for i in range(3)])
    jsonl = write_manifest(
        tmp_path / "b.jsonl", [{"id": 10 + i, "image": "media/b.jpg"} for i in range(2)]
    )
    table = str(tmp_path / "table")
    assert cli(csv, table, "--blob-columns", "image") == 0
    assert cli(jsonl, table, "--blob-columns", "image") == 0, capsys.readouterr().err
    stored = open_table(table)
    assert stored.version == 2
    assert stored.to_arrow(columns=["id"])["id"].to_pylist() == [0, 1, 2, 10, 11]
    assert stock_read(table, "image") == [files["a.jpg"]] * 3 + [files["b.jpg"]] * 2


def test_append_casts_to_the_table_types_or_names_the_column(tmp_path, media, capsys):
    first = tmp_path / "first.parquet"
    pq.write_table(
        pa.table({"id": pa.array([1], pa.int32()), "image": ["media/a.jpg"], "w": [0.5]}), first
    )
    table = str(tmp_path / "table")
    assert cli(str(first), table, "--blob-columns", "image") == 0
    more = write_manifest(tmp_path / "more.jsonl", [{"id": 2, "image": "media/b.jpg", "w": 1}])
    assert cli(more, table, "--blob-columns", "image") == 0  # int64 -> int32, int64 -> double
    assert open_table(table).schema.field("id").type == pa.int32()
    assert open_table(table).to_arrow(columns=["id", "w"]).to_pylist()[1] == {"id": 2, "w": 1.0}
    capsys.readouterr()
    bad = write_manifest(tmp_path / "bad.jsonl", [{"id": "two", "image": "media/b.jpg", "w": 1}])
    assert cli(bad, table, "--blob-columns", "image") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "column 'id' (string) cannot be cast" in err and "int32" in err
    too_big = write_manifest(
        tmp_path / "big.jsonl", [{"id": 2**40, "image": "media/b.jpg", "w": 1}]
    )
    assert cli(too_big, table, "--blob-columns", "image") == 2
    assert "column 'id'" in capsys.readouterr().err
    assert open_table(table).version == 2


def test_dedup_off_stores_a_copy_per_row_and_global_one_per_table(tmp_path, media):
    _, files = media
    rows = [{"id": i, "image": f"media/{n}"} for i, n in enumerate(NAMES)]
    manifest = write_manifest(tmp_path / "rows.jsonl", rows)
    off = str(tmp_path / "off")
    assert cli(manifest, off, "--blob-columns", "image", "--dedup", "off") == 0
    stats = open_table(off).stats()
    assert stats["physical_bytes"] == stats["logical_bytes"] == sum(len(files[n]) for n in NAMES)
    shared = str(tmp_path / "global")
    for _ in range(2):
        assert cli(manifest, shared, "--blob-columns", "image", "--dedup", "global") == 0
    assert open_table(shared).stats()["physical_bytes"] == sum(len(c) for c in files.values())
    assert stock_read(shared, "image") == [files[n] for n in NAMES] * 2


def test_missing_file_fails_fast_in_one_line_before_spark_starts(tmp_path, media):
    rows = [{"id": 1, "image": "media/a.jpg"}, {"id": 2, "image": "media/nope.jpg"}]
    manifest = write_manifest(tmp_path / "rows.jsonl", rows)
    table = str(tmp_path / "table")
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "blobhouse.cli",
            "ingest",
            manifest,
            table,
            "--blob-columns",
            "image",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no "starting Spark"
    assert "row 2, column 'image': no such file: media/nope.jpg" in done.stderr
    assert elapsed < 20  # imports and pyarrow only (starting Spark took 8-23 s alone)
    assert not os.path.exists(table)


def test_manifest_problems_are_one_line_errors_without_spark(tmp_path, media, capsys, monkeypatch):
    def no_spark(*args, **kwargs):
        raise AssertionError("Spark must not start for a bad manifest")

    monkeypatch.setattr(bs, "local_session", no_spark)
    table = str(tmp_path / "table")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": 1, "image": "media/a.jpg"}\n{"id": 2, "image": \n')
    numbers = write_manifest(tmp_path / "numbers.jsonl", [{"id": 1, "image": 7}])
    taken = write_manifest(tmp_path / "taken.jsonl", [{"image": "media/a.jpg", "image_path": "x"}])
    folder = str(tmp_path / "folder.jsonl")
    os.mkdir(folder)
    cases = [
        (str(tmp_path / "none.jsonl"), "image", "none.jsonl: no such file"),
        (str(tmp_path / "rows.txt"), "image", "pass --format"),
        (str(broken), "image", "is not valid jsonl"),
        (numbers, "image", "must hold file paths or URIs (strings), got int64"),
        (numbers, "video", "has no column(s) ['video']"),
        (taken, "image", "already has column(s) ['image_path']"),
        (folder, "image", "is a directory"),
    ]
    for manifest, column, message in cases:
        assert cli(manifest, table, "--blob-columns", column) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not os.path.exists(table)


def test_library_ingest_returns_a_report_and_plans_without_spark(spark, tmp_path, media):
    _, files = media
    manifest = write_manifest(tmp_path / "rows.jsonl", [{"image": "media/c.mp4"}] * 3)
    plan = plan_ingest(manifest, str(tmp_path / "t"), ["image"])
    assert plan.rows.num_rows == 3 and plan.logical_bytes == 3 * len(files["c.mp4"])
    assert plan.ranges() == [(0, 3)] and plan.ranges(2) == [(0, 2), (2, 3)]
    report = ingest(spark, manifest, str(tmp_path / "t"), ["image"])
    assert (report["rows"], report["files"], report["physical_bytes"]) == (
        3,
        1,
        len(files["c.mp4"]),
    )
    with pytest.raises(InvalidInputError, match="dedup must be one of"):
        plan_ingest(manifest, str(tmp_path / "t"), ["image"], dedup="ref_id")


def test_ingest_progress_counts_the_rows_and_bytes_the_tasks_loaded(spark, tmp_path, media):
    _, files = media
    names = ["a.jpg", "c.mp4", "b.jpg", "a.jpg"]
    manifest = write_manifest(tmp_path / "rows.jsonl", [{"image": f"media/{n}"} for n in names])
    events: list[ProgressEvent] = []
    plan = plan_ingest(manifest, str(tmp_path / "t"), ["image"])
    plan.run(spark, partitions=2, progress=events.append)
    assert events and events[0].done == 0 and events[-1].finished
    assert events[0].rows in (0, None) or events[0].rows == 0
    assert (events[-1].rows, events[-1].bytes) == (4, sum(len(files[n]) for n in names))


def test_a_file_gone_after_the_check_fails_the_write_in_one_line(spark, tmp_path, media):
    from blobhouse.cli.run import one_line

    manifest = write_manifest(tmp_path / "rows.jsonl", [{"image": "media/b.jpg"}])
    table = str(tmp_path / "t")
    plan = plan_ingest(manifest, table, ["image"])
    os.remove(media[0] / "b.jpg")
    with pytest.raises(Exception) as failed:
        plan.run(spark)
    assert one_line(failed.value) == (
        f"manifest column 'image': cannot read file://{media[0]}/b.jpg: no such file"
    )
    leftovers = (
        [p for _, _, names in os.walk(table) for p in names] if os.path.exists(table) else []
    )
    assert all(p.startswith("aborted-") for p in leftovers), leftovers
