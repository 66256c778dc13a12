"""Data file footers read with blobhouse's own ranged reads (blobhouse.data_file_footer): the
same schema metadata and global buffers pylance's file reader gives, column names that agree
with what the writer recorded, clear errors for damaged files, and no hang beside pylance scans
in other threads (pylance's file reader holds the GIL while it waits on Lance's runtime)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance.file import LanceFileReader

from blobhouse import BlobReadError, blob_array, write_table
from blobhouse.checksums import CHECKSUMS_KEY, FILE_COLUMNS_KEY
from blobhouse.data_file_footer import DataFileFooter


def data_files(table: str) -> list[Path]:
    return sorted(Path(table, "data").glob("*.lance"))


@pytest.fixture
def mixed_table(tmp_path) -> str:
    """Nested structs, a list of structs, two blob columns (one inside a struct) with inline
    payloads in every file, two files."""
    rows = 60
    meta = pa.StructArray.from_arrays(
        [pa.array(range(rows)), blob_array([bytes([i]) * (10 + i) for i in range(rows)])],
        names=["n", "thumb"],
    )
    data = pa.table(
        {
            "id": pa.array(range(rows)),
            "deep": pa.array([{"a": i, "s": {"x": float(i), "y": str(i)}} for i in range(rows)]),
            "tags": pa.array([[{"k": i}] for i in range(rows)]),
            "meta": meta,
            "img": blob_array([os.urandom(50 + (i % 5) * 40_000) for i in range(rows)]),
        }
    )
    uri = str(tmp_path / "t")
    write_table(data, uri, max_rows_per_file=30, dedup="content")
    return uri


def test_footer_matches_pylance_file_reader(mixed_table, tmp_path):
    lance.write_dataset(pa.table({"id": [1, 2], "s": [{"q": 1}, None]}), str(tmp_path / "stock"))
    files = data_files(mixed_table) + data_files(str(tmp_path / "stock"))
    assert len(files) == 3
    for path in files:
        reader = LanceFileReader(str(path))
        metadata = reader.metadata()
        footer = DataFileFooter.read(str(path))
        assert footer.buffers == [(b.position, b.size) for b in metadata.global_buffers]
        assert footer.metadata == (metadata.schema.metadata or {})
        for index in range(len(footer.buffers)):
            assert footer.read_buffer(index) == bytes(reader.read_global_buffer(index))
    assert CHECKSUMS_KEY.encode() in DataFileFooter.read(str(files[0])).metadata
    assert CHECKSUMS_KEY.encode() not in DataFileFooter.read(str(files[-1])).metadata


def test_column_names_agree_with_what_the_writer_recorded(mixed_table):
    for path in data_files(mixed_table):
        footer = DataFileFooter.read("file://" + str(path))
        index = int(footer.metadata[CHECKSUMS_KEY.encode()])
        stream = pa.ipc.open_stream(pa.py_buffer(footer.read_buffer(index)))
        recorded = json.loads(stream.schema.metadata[FILE_COLUMNS_KEY])
        names = footer.leaf_names()
        columns = ["id", "deep.a", "deep.s.x", "deep.s.y", "tags", "meta.n", "meta.thumb"]
        assert names == [*columns, "img"]
        # inline payloads of both blob columns were recorded under the file's own columns
        assert {"meta.thumb", "img"} <= set(recorded)
        assert all(names[column] == name for name, column in recorded.items())


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-1], id="cut-short"),
        pytest.param(lambda data: data[:20], id="shorter-than-a-footer"),
        pytest.param(lambda data: data[:-4] + b"PARQ", id="foreign-magic"),
        pytest.param(lambda data: data[:-48] + b"\xff" * 44 + b"LANC", id="offsets-past-end"),
    ],
)
def test_a_damaged_data_file_names_itself(mixed_table, damage):
    path = data_files(mixed_table)[0]
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(BlobReadError, match=f"data file .*{path.name}"):
        DataFileFooter.read(str(path))


def test_a_missing_data_file_names_itself(tmp_path):
    with pytest.raises(BlobReadError, match=r"data file .*gone\.lance is missing"):
        DataFileFooter.read(str(tmp_path / "gone.lance"))


HANG_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    import lance, pyarrow as pa
    from blobhouse import blob_array, open_table, write_table

    uri = sys.argv[1]
    rows = 600
    write_table(pa.table({"id": range(rows), "b": blob_array([os.urandom(2000)] * rows)}),
                uri, max_rows_per_file=50, dedup="off")
    stop = time.monotonic() + 4
    failures = []

    def scans():
        try:
            while time.monotonic() < stop:
                lance.dataset(uri).to_table(columns=["id"])
        except BaseException as exc:
            failures.append(exc)

    def checked_reads():  # a table opened afresh loads each data file's recorded hashes
        try:
            while time.monotonic() < stop:
                assert len(open_table(uri).read_blobs("b", range(0, rows, 7))) == 86
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=f) for f in [scans, checked_reads] * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("failures", failures)
    """
)


def test_checked_reads_beside_pylance_scans_in_threads_do_not_hang(tmp_path):
    """With pylance's file reader loading the hashes, this hung 4 runs of 4."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", HANG_SCRIPT, str(tmp_path / "t")],
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("threads reading checked blobs beside pylance scans hung")
    assert done.returncode == 0, done.stderr
    assert "failures []" in done.stdout
