"""Data file footers read with blobhouse's own ranged reads (blobhouse.files.footer): the
same schema metadata and global buffers pylance's file reader gives, column names that agree
with what the writer recorded, clear errors for damaged files, and no hang beside pylance scans
in other threads (pylance's file reader holds the GIL while it waits on Lance's runtime)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance.file import LanceFileReader

from blobhouse import BlobReadError, DataFileError, blob_array, open_table, write_table
from blobhouse.files.checksums import CHECKSUMS_KEY, FILE_COLUMNS_KEY, load_checksums
from blobhouse.files.footer import DataFileFooter, data_file_problem

FOOTER = "<QQQIIHH4s"  # a Lance 2.x file's last 40 bytes


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


def _footer(data: bytes, **fields: int) -> bytes:
    """``data`` with footer fields replaced (their damage: a flipped bit, a cut write)."""
    names = ["columns_at", "offsets_at", "buffers_at", "count", "columns", "major", "minor"]
    values = dict(zip([*names, "magic"], struct.unpack(FOOTER, data[-40:]), strict=True))
    values.update(fields)
    return data[:-40] + struct.pack(FOOTER, *values.values())


def _buffer(data: bytes, index: int, **fields: int) -> bytes:
    """``data`` with global buffer ``index``'s position or size replaced."""
    table_at = struct.unpack(FOOTER, data[-40:])[2] + 16 * index
    position, size = struct.unpack("<QQ", data[table_at : table_at + 16])
    position, size = fields.get("position", position), fields.get("size", size)
    return data[:table_at] + struct.pack("<QQ", position, size) + data[table_at + 16 :]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-1], id="cut-short"),
        pytest.param(lambda data: data[:20], id="shorter-than-a-footer"),
        pytest.param(lambda data: data[:-4] + b"PARQ", id="foreign-magic"),
        pytest.param(lambda data: data[:-40] + b"\xff" * 36 + b"LANC", id="offsets-past-end"),
        pytest.param(lambda data: _footer(data, count=0xFFFFFFFF), id="huge-buffer-count"),
        pytest.param(lambda data: _buffer(data, 0, size=1 << 40), id="buffer-past-end"),
        pytest.param(lambda data: _buffer(data, 0, position=(1 << 64) - 5), id="buffer-at-2^64"),
        pytest.param(lambda data: _footer(data, major=1), id="format-1"),
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


FLIP_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from blobhouse import open_table
    from blobhouse.files.checksums import load_checksums
    from blobhouse.errors import BlobReadError

    table_uri, path, position, size = sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:])
    pristine = path.read_bytes()
    for at in range(position, position + size, 16):
        damaged = bytearray(pristine)
        damaged[at] ^= 1
        path.write_bytes(bytes(damaged))
        try:
            load_checksums("file://" + str(path))
            loaded = "loaded"  # a flip the buffer's own structure cannot see (a digest, say)
        except BlobReadError as exc:
            assert path.name in str(exc), exc
            loaded = "named"
        problems = open_table(table_uri).verify(deep=True)["problems"]
        print(at, loaded, len(problems), flush=True)
    path.write_bytes(pristine)
    """
)


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_damaged_recorded_hashes_are_named_never_a_crash(tmp_path, dedup):
    """One flipped bit in a data file's recorded hashes: a BlobReadError naming the file, and
    deep verify lists it. Some flips crashed the process (pyarrow read the damaged IPC stream
    without complaint; the lookups then segfaulted); others leaked raw pyarrow errors. The
    global table's list numbers the store packs its entries refer to (a list of names in its
    metadata)."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (300 + i) for i in range(20)]
    data = pa.table({"id": range(20), "b": blob_array(payloads)})
    write_table(data, uri, max_rows_per_file=10, dedup=dedup)
    path = data_files(uri)[0]
    footer = DataFileFooter.read(str(path))
    position, size = footer.buffers[int(footer.metadata[CHECKSUMS_KEY.encode()])]
    done = subprocess.run(
        [sys.executable, "-c", FLIP_SCRIPT, uri, str(path), str(position), str(size)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    outcomes = [line.split()[1:] for line in done.stdout.splitlines()]
    assert len(outcomes) == len(range(0, size, 16))
    assert ["named", "1"] in outcomes
    # every flip the loader named is a problem deep verify lists
    assert all(problems != "0" for loaded, problems in outcomes if loaded == "named")
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_a_damaged_list_of_store_packs_is_named(tmp_path):
    """The store packs a data file's recorded hashes number, damaged: a BlobReadError naming
    the file on a checked read, and deep verify lists it; the table's bytes are intact."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * 5_000 for i in range(4)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, dedup="global")
    (path,) = data_files(uri)
    pristine = path.read_bytes()
    at = pristine.index(b'["packs/')
    path.write_bytes(pristine[:at] + b"{" + pristine[at + 1 :])
    with pytest.raises(BlobReadError, match=path.name):
        open_table(uri).read_blobs("b", [1])
    (problem,) = open_table(uri).verify(deep=True)["problems"]
    assert path.name in str(problem), problem
    path.write_bytes(pristine)
    assert open_table(uri).read_blobs("b", [1]) == [payloads[1]]


def test_any_flipped_bit_of_the_schema_is_read_or_named(mixed_table):
    """Each bit flipped in turn across the file's schema buffer (protobuf): the footer reads,
    or a BlobReadError names the file; never another error (a varint where a message belongs
    made ``bytes(n)`` of it: a terabyte for a large n)."""
    path = data_files(mixed_table)[0]
    pristine = path.read_bytes()
    position, size = DataFileFooter.read(str(path)).buffers[0]
    outcomes = {"read": 0, "named": 0}
    for at in range(position, position + size):
        for bit in (0, 1, 2, 7):  # bits 0-2 of a field key are its wire type
            damaged = bytearray(pristine)
            damaged[at] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            try:
                DataFileFooter.read(str(path)).leaf_names()
                load_checksums(str(path))  # the metadata names the hashes' buffer
                outcomes["read"] += 1
            except (BlobReadError, DataFileError) as exc:  # the latter: its name damaged
                assert path.name in str(exc)
                outcomes["named"] += 1
    assert outcomes["named"] > 0 and outcomes["read"] > 0


def test_a_buffer_within_the_bytes_read_for_the_footer_is_taken_from_them(tmp_path):
    """A small data file's recorded hashes lie in the last bytes read for its footer: they are
    taken from those, a request less a file on an object store (a checked read of rows spread
    over many small files loads a list per file); a large file's are read from the file."""
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    write_table(pa.table({"b": blob_array([b"x" * 100, b"y" * 200])}), small)
    write_table(pa.table({"b": blob_array([os.urandom(1_000) for _ in range(500)])}), large)
    footers = {}
    for table in (small, large):
        (path,) = data_files(table)
        footer = DataFileFooter.read(str(path))
        index = int(footer.metadata[CHECKSUMS_KEY.encode()])
        expected = bytes(LanceFileReader(str(path)).read_global_buffer(index))
        path.unlink()
        footers[table] = footer, index, expected
    footer, index, expected = footers[small]
    assert footer.read_buffer(index) == expected
    footer, index, _ = footers[large]
    with pytest.raises(FileNotFoundError):  # outside the footer's read: read from the file
        footer.read_buffer(index)


def test_hashes_load_without_parsing_the_schema_and_a_damaged_field_is_still_named(mixed_table):
    """Reading a file's recorded hashes needs its metadata alone: its fields are parsed on
    first use (a first read over many small files parsed every field of every file). A flip
    that damages a field only leaves the hashes loadable; the field's damage is still named
    by the file check (verify's) and by what reads the fields."""
    path = data_files(mixed_table)[0]
    pristine = path.read_bytes()
    position, size = DataFileFooter.read(str(path)).buffers[0]
    found = 0
    for at in range(position, position + size):
        if found == 3:
            break
        damaged = bytearray(pristine)
        damaged[at] ^= 0x80  # a varint's continuation bit: a length or a number runs on
        path.write_bytes(bytes(damaged))
        try:
            footer = DataFileFooter.read(str(path))
            load_checksums(str(path))
        except (BlobReadError, DataFileError):
            continue
        try:
            footer.fields  # noqa: B018
        except BlobReadError as exc:
            assert path.name in str(exc) and "schema does not parse" in str(exc)
            assert "schema does not parse" in data_file_problem(str(path))
            found += 1
    path.write_bytes(pristine)
    assert found > 0
    assert data_file_problem(str(path)) is None
