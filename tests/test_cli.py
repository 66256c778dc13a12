"""The main job and the CLI, end to end on small data (on the shared local Spark session)."""

from __future__ import annotations

import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import ProgressBar, main
from blobhouse.demo import FPS, EpisodeData

from helpers import stock_read, tree

pytestmark = pytest.mark.usefixtures("spark")


def test_demo_writes_queries_verifies_and_reports(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    assert main(["demo", "--rows", "75", "--out", out, "--json", "--master", "local[2]"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 75
    assert report["mismatches"] == 0
    assert report["verified_blobs"] == 225
    data = EpisodeData(75)
    chunks = [len(data.chunk(i)) for i in range(3)]
    video = report["columns"]["video"]
    assert video["physical_bytes"] == sum(chunks)
    assert video["logical_bytes"] == FPS * chunks[0] + FPS * chunks[1] + 15 * chunks[2]
    assert report["sql_first_frames"] == [{"episode": 0, "frames": 3, "video_bytes": sum(chunks)}]
    rows = open_table(out).to_arrow(columns=["row"]).column("row").to_pylist()
    assert stock_read(out, "video") == [data.payload("video", r) for r in rows]


def test_demo_never_deletes_what_is_at_out(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    assert main(["demo", "--rows", "30", "--out", str(folder), "--master", "local[2]"]) == 2
    assert "holds other files (notes.txt)" in capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "keep me" and len(list(folder.iterdir())) == 1
    a_file = tmp_path / "file"
    a_file.write_bytes(b"x")
    for out in (a_file, a_file / "below"):
        assert main(["demo", "--rows", "30", "--out", str(out), "--master", "local[2]"]) == 2
        assert "is a file" in capsys.readouterr().err and a_file.read_bytes() == b"x"
    other = str(tmp_path / "someone-elses")
    write_table(pa.table({"id": [1], "img": blob_array([b"mine"])}), other)
    assert main(["demo", "--rows", "30", "--out", other, "--master", "local[2]"]) == 2
    assert "not the demo's" in capsys.readouterr().err
    assert open_table(other).version == 1 and open_table(other).read_blobs("img", [0]) == [b"mine"]


def test_stats_command(tmp_path, capsys):
    out = str(tmp_path / "episodes")
    main(["demo", "--rows", "30", "--out", out, "--master", "local[2]"])
    capsys.readouterr()
    assert main(["stats", out]) == 0
    text = capsys.readouterr().out
    assert "30 (0 deleted)" in text and "video" in text
    assert main(["stats", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 30


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


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_ingest_stores_each_named_file_once(tmp_path, media, fmt, capsys):
    folder, files = media
    names = ["a.jpg", "c.mp4", "a.jpg", "b.jpg", "c.mp4", "a.jpg"]
    rows = [
        {"id": i, "image": f"media/{n}" if i % 2 else str(folder / n)} for i, n in enumerate(names)
    ]
    manifest = tmp_path / f"rows.{fmt}"
    if fmt == "jsonl":
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        manifest.write_text("id,image\n" + "".join(f"{r['id']},{r['image']}\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), manifest)
    table = str(tmp_path / "table")
    assert (
        main(["ingest", str(manifest), table, "--blob-columns", "image", "--master", "local[2]"])
        == 0
    )
    assert "6 rows" in capsys.readouterr().out
    stored = open_table(table)
    ids = stored.to_arrow(columns=["id"]).column("id").to_pylist()
    assert stock_read(table, "image") == [files[names[i]] for i in ids]
    assert stored.stats()["physical_bytes"] == sum(len(c) for c in files.values())


def test_ingest_errors_name_the_problem(tmp_path, capsys):
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text(json.dumps({"id": 1, "image": "nope.jpg"}) + "\n")
    table = str(tmp_path / "table")
    assert main(["ingest", str(manifest), table, "--blob-columns", "video"]) == 2
    assert "no column(s) ['video']" in capsys.readouterr().err
    with pytest.raises(Exception, match=r"cannot read .*nope\.jpg"):
        main(["ingest", str(manifest), table, "--blob-columns", "image"])
    leftovers = tree(table) if os.path.exists(table) else set()
    assert all("aborted-" in p for p in leftovers), leftovers  # only the abort marker


def test_missing_table_is_a_clear_error(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert "no table at" in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_on_a_terminal_and_logs_start_and_end_elsewhere():
    screen = Terminal()
    bar = ProgressBar(screen)
    for done in range(4):
        bar("verify", done, 3)
    drawn = screen.getvalue()
    assert drawn.count("\r") == 4 and drawn.endswith("[" + "#" * 30 + "] 3/3\n")
    assert "[" + "#" * 10 + "." * 20 + "] 1/3" in drawn
    log = io.StringIO()
    bar = ProgressBar(log)
    for done in range(4):
        bar("mark", done, 3)
    assert log.getvalue() == "mark: 0/3\nmark: 3/3\n"


def test_demo_on_a_local_s3_server(capsys):
    args = ["demo", "--rows", "40", "--local-s3", "--json", "--master", "local[2]"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["table"] == "s3://blobhouse-demo/episodes"
    assert (report["rows"], report["verified_blobs"], report["mismatches"]) == (40, 120, 0)
    assert report["columns"]["video"]["physical_bytes"] == sum(
        len(EpisodeData(40).chunk(i)) for i in range(2)
    )
