"""A damaged data file (truncated, its footer overwritten, a page garbled) is named: every read
raises ``DataFileError`` naming the file and why, never Lance's or Arrow's raw error (nor, for a
take by id, an error blaming the ids); ``verify`` lists it as a problem and goes on with the
other fragments; gc refuses to run on it. Versions written before the file still read."""

from __future__ import annotations

import glob
import pickle
import struct
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import DataFileError, blob_array, open_table, write_table
from blobhouse.files.checksums import CHECKSUMS_KEY
from blobhouse.files.footer import _FOOTER, DataFileFooter
from tests.helpers import tree


def _two_fragment_table(uri: str) -> str:
    """A table of two appends, and the data file the second wrote."""
    before = set(glob.glob(f"{uri}/data/*.lance"))
    for start in (0, 100):
        rows = range(start, start + 100)
        batch = pa.table(
            {
                "id": list(rows),
                "name": [f"name-{i:05d}" for i in rows],
                "img": blob_array([b"img-%d" % i * 50 for i in rows]),
            }
        )
        write_table(batch, uri, mode="append" if start else "create")
        before = before or set(glob.glob(f"{uri}/data/*.lance"))
    (second,) = set(glob.glob(f"{uri}/data/*.lance")) - before
    return second


def _truncate(path: str) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


def _zero_footer(path: str) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-40] + bytes(40))


READS = {
    "to_arrow": lambda t: t.to_arrow(),
    "to_arrow bytes": lambda t: t.to_arrow(blobs="bytes"),
    "count_rows filter": lambda t: t.count_rows("id > 3"),
    "take": lambda t: t.take([150]),
    "take bytes": lambda t: t.take([150], blobs="bytes"),
    "take_rows": lambda t: t.take_rows(t.row_ids()[150:152]),
    "take_row_dicts": lambda t: t.take_row_dicts(t.row_ids()[150:152]),
    "read_blobs": lambda t: t.read_blobs("img", [150]),
    "stats": lambda t: t.stats(),
}


def _remove(path: str) -> None:
    Path(path).unlink()


@pytest.mark.parametrize(
    ("damage", "said"),
    [(_truncate, "is damaged: it "), (_zero_footer, "is damaged: it "), (_remove, "is missing;")],
    ids=["truncated", "footer", "missing"],
)
def test_every_read_of_a_damaged_data_file_names_it(tmp_path, damage, said):
    """A missing data file too: Lance's raw "Not found" named no column and no way back."""
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    damage(second)
    table = open_table(uri)
    for name, read in READS.items():
        with pytest.raises(DataFileError) as raised:
            read(table)
        error = raised.value
        assert error.uri.endswith(Path(second).name), name
        assert said in str(error) and "row ids" not in str(error), name
        assert pickle.loads(pickle.dumps(error)).uri == error.uri  # crosses to Spark's driver
    # the version written before the file reads, through blobhouse, every row
    first = open_table(uri, version=1).to_arrow(blobs="bytes")
    assert first["img"].to_pylist() == [b"img-%d" % i * 50 for i in range(100)]


@pytest.mark.parametrize("deep", [False, True])
def test_verify_lists_a_damaged_data_file_and_checks_the_rest(tmp_path, deep):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    _zero_footer(second)
    report = open_table(uri).verify(deep=deep)
    (problem,) = report["problems"]
    assert problem["uri"].endswith(Path(second).name)
    assert problem["reason"].startswith("damaged data file: it does not end in b'LANC'")
    assert "fragment 1 is unreadable" in problem["reason"]
    # the first fragment's rows were checked, in each of the two versions holding them
    assert report["references"] == 200 and report["hashed"] == (200 if deep else 0)


def test_verify_says_how_much_of_a_truncated_data_file_is_left(tmp_path):
    """As reads do: the size found and the size the manifest records, not only that the end
    is not a footer."""
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    size = Path(second).stat().st_size
    _truncate(second)
    (problem,) = open_table(uri).verify()["problems"]
    assert problem["uri"].endswith(Path(second).name)
    assert problem["reason"].startswith(
        f"damaged data file: it is {size // 2:,} bytes, its manifest records {size:,}"
    )


def test_gc_refuses_a_table_with_a_damaged_data_file_and_removes_nothing(tmp_path):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    _truncate(second)
    before = tree(uri)
    with pytest.raises(DataFileError, match="is damaged"):
        open_table(uri).gc(retain_versions=1, grace=timedelta(0))
    assert tree(uri) == before


def test_a_damaged_page_is_named_by_deep_verify(tmp_path):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    data = bytearray(Path(second).read_bytes())
    data[data.find(b"name-00150")] = 0xFF  # not UTF-8: Lance refuses the string page
    Path(second).write_bytes(bytes(data))
    table = open_table(uri)
    with pytest.raises(DataFileError, match="inside a page: verify") as raised:
        table.to_arrow(columns=["name"])
    assert raised.value.uri == ""  # every file's footer and size are intact
    assert table.to_arrow(columns=["id"])["id"].to_pylist() == list(range(200))
    assert table.verify()["problems"] == []  # the references are intact
    (problem,) = table.verify(deep=True)["problems"]
    assert problem["uri"].endswith(Path(second).name)
    assert problem["reason"].startswith("damaged data file: Encountered corrupt file")
    assert problem["reason"].endswith("rows of fragment 1 cannot be read")


def test_a_spark_read_of_a_damaged_data_file_names_it(tmp_path, spark):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    _zero_footer(second)
    frames = spark.read.format("blobhouse").load(uri)
    with pytest.raises(Exception, match=r"DataFileError: .* is damaged") as raised:
        frames.collect()
    assert Path(second).name in str(raised.value)


@pytest.mark.parametrize("damage", ["truncated", "footer"])
def test_damaged_data_files_on_object_stores_are_named(bucket, damage):
    uri = f"{bucket.uri}/t"
    options = bucket.options
    for start in (0, 100):
        rows = range(start, start + 100)
        batch = pa.table({"id": list(rows), "img": blob_array([b"i%d" % i * 90 for i in rows])})
        write_table(batch, uri, mode="append" if start else "create", storage_options=options)
    table = open_table(uri, storage_options=options)
    files = {
        f.metadata.id: f.metadata.files[0].path for f in table.snapshot.dataset.get_fragments()
    }
    key = f"t/data/{files[1]}"
    data = bucket.get(key)
    bucket.put(key, data[: len(data) // 2] if damage == "truncated" else data[:-40] + bytes(40))
    table = open_table(uri, storage_options=options)
    for name, read in READS.items():
        with pytest.raises(DataFileError) as raised:
            read(table)
        assert raised.value.uri.endswith(files[1]) and "is damaged: it " in str(raised.value), name
    (problem,) = table.verify()["problems"]
    assert problem["uri"].endswith(files[1]) and problem["reason"].startswith("damaged data file")


def _flip_footer_byte(from_end: int):
    """Damage that flips one byte ``from_end`` bytes before a data file's end."""

    def damage(path: str) -> None:
        data = bytearray(Path(path).read_bytes())
        data[-from_end] ^= 0xFF
        Path(path).write_bytes(bytes(data))

    return damage


def _move_footer_offset(from_end: int, by: int):
    """Damage that moves the u64 offset ``from_end`` bytes before a data file's end by ``by``
    bytes: the column metadata offset up into the first column's metadata, the table's down
    into the last one's (moved the other way, Lance reads the file right: only verify names
    it, and a flipped byte moves it either way, as the file's layout falls)."""

    def damage(path: str) -> None:
        data = bytearray(Path(path).read_bytes())
        (offset,) = struct.unpack_from("<Q", data, len(data) - from_end)
        struct.pack_into("<Q", data, len(data) - from_end, offset + by)
        Path(path).write_bytes(bytes(data))

    return damage


FOOTER_FIELDS = {  # the 40-byte footer: three u64 offsets, two u32 counts, two u16 versions
    "column metadata offset": _move_footer_offset(40, 64),
    "column metadata table offset": _move_footer_offset(32, -64),
    "global buffer table offset": _flip_footer_byte(24),
    "version": _flip_footer_byte(8),
}


@pytest.mark.parametrize("field", FOOTER_FIELDS)
def test_a_damaged_footer_field_is_named_by_reads_and_verify(tmp_path, field):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    FOOTER_FIELDS[field](second)
    table = open_table(uri)
    for name in ("to_arrow", "take_rows", "stats"):
        with pytest.raises(DataFileError) as raised:
            READS[name](table)
        assert raised.value.uri.endswith(Path(second).name), (name, str(raised.value))
    (problem,) = table.verify(deep=True)["problems"]
    assert problem["uri"].endswith(Path(second).name) and "damaged data file" in problem["reason"]


def test_a_damaged_file_of_an_older_version_is_named_by_the_services(tmp_path):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    open_table(uri).delete("id >= 100")  # the latest version no longer holds the file
    _zero_footer(second)
    table = open_table(uri)
    assert table.to_arrow()["id"].to_pylist() == list(range(100))  # the latest reads
    for service in (lambda: table.stats(), lambda: table.gc(grace=timedelta(0))):
        with pytest.raises(DataFileError) as raised:
            service()
        assert raised.value.uri.endswith(Path(second).name)
        assert "does not end in b'LANC'" in str(raised.value)


def test_a_loader_filter_on_a_damaged_table_is_not_called_invalid(tmp_path):
    from blobhouse.loader import BatchLoader

    uri = str(tmp_path / "t")
    _zero_footer(_two_fragment_table(uri))
    with pytest.raises(DataFileError, match="is damaged"):
        list(BatchLoader(uri, ["id", "img"], batch_size=8, filter="id < 10"))


@pytest.mark.parametrize("damage", [_truncate, _zero_footer], ids=["truncated", "footer"])
def test_changes_of_a_damaged_table_name_the_file_and_change_nothing(tmp_path, damage):
    uri = str(tmp_path / "t")
    second = _two_fragment_table(uri)
    damage(second)
    before = tree(uri)
    changes = {
        "compact": lambda t: t.compact(),
        "delete": lambda t: t.delete("id = 150"),
        "update": lambda t: t.update({"name": "'z'"}, where="id = 150"),
    }
    for name, change in changes.items():
        with pytest.raises(DataFileError) as raised:
            change(open_table(uri))
        assert raised.value.uri.endswith(Path(second).name), (name, str(raised.value))
        assert tree(uri) == before, name


def test_a_damaged_recorded_hash_is_told_apart_in_the_messages(tmp_path):
    """A byte of a row's recorded hash flipped (its bytes intact): the read's error and deep
    verify say the hash may be what is damaged, and verify shows the digests where they
    differ (the first 16 hex digits of both were the same)."""
    import struct

    import blake3

    from blobhouse import CorruptBlobError

    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * 1000 for i in range(20)]
    write_table(pa.table({"id": list(range(20)), "img": blob_array(payloads)}), uri)
    (path,) = glob.glob(f"{uri}/data/*.lance")
    data = bytearray(Path(path).read_bytes())
    *_, buffers_at, count, _, _, _, _ = struct.unpack("<QQQIIHH4s", data[-40:])
    at, size = struct.unpack_from("<QQ", data, buffers_at + 16 * (count - 1))  # the hashes
    digest = blake3.blake3(payloads[5]).digest()
    data[data.find(digest, at, at + size) + 20] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    table = open_table(uri)
    with pytest.raises(CorruptBlobError, match="or that recorded hash, is damaged"):
        table.read_blobs("img", [5])
    (problem,) = table.verify(deep=True)["problems"]
    recorded, read = problem["reason"].split("recorded ")[1].split(")")[0].split(", read ")
    assert recorded != read and read == digest.hex()[: len(read)]


def test_a_check_of_the_data_files_that_fails_keeps_lances_error(tmp_path, monkeypatch):
    """Naming the damaged file reads every footer: a store that fails those reads too leaves
    a DataFileError with Lance's reason and the check's failure, not the check's error."""
    from blobhouse.snapshot import TableSnapshot

    uri = str(tmp_path / "t")
    _zero_footer(_two_fragment_table(uri))

    def failing(self, every_version=False):
        raise OSError("the store went away")

    monkeypatch.setattr(TableSnapshot, "damaged_data_files", failing)
    with pytest.raises(DataFileError, match="checking its data files failed too") as raised:
        open_table(uri).to_arrow()
    assert "not appear to be a Lance file" in str(raised.value) and raised.value.uri == ""


FLIP_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from blobhouse import BlobhouseError, open_table

    table_uri, path = sys.argv[1], Path(sys.argv[2])
    start, stop, step, skipped = map(int, sys.argv[3:])
    pristine = path.read_bytes()
    expected = open_table(table_uri).to_arrow(blobs="bytes")
    for at in [at for at in range(start, stop, step) if at != skipped]:
        damaged = bytearray(pristine)
        damaged[at] ^= (0xFF, 0x01, 0x80)[at % 3]  # a byte, its lowest bit, its highest bit
        path.write_bytes(bytes(damaged))
        try:
            read = open_table(table_uri).to_arrow(blobs="bytes")
            outcome = "same" if read.equals(expected) else "CHANGED"
        except BlobhouseError as exc:
            outcome = type(exc).__name__
        except BaseException as exc:  # noqa: BLE001 -- what the test is looking for
            outcome = f"RAW {type(exc).__name__}: {str(exc)[:150]!r}"
        print(at, outcome, flush=True)
    path.write_bytes(pristine)
    """
)


def test_any_flipped_byte_of_a_data_files_metadata_is_read_or_named(tmp_path):
    """Each byte of a data file's column metadata, schema and footer damaged in turn (and of
    its recorded hashes, and a sample of its pages): a read returns the table unchanged or
    raises a blobhouse error. Before, a dozen of Lance's messages about metadata it cannot
    decode (page layouts, the schema's parents, the column table's size) came through raw."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (1000 + 7 * i) for i in range(12)]
    write_table(pa.table({"id": range(12), "b": blob_array(payloads)}), uri, dedup="off")
    (path,) = glob.glob(f"{uri}/data/*.lance")
    pristine = Path(path).read_bytes()
    metadata_at = _FOOTER.unpack(pristine[-_FOOTER.size :])[0]
    # the top byte of the footer's global buffer count: Lance allocates that many entries
    # before it checks them against the file, and the process aborts (32 GB; Lance's bug, in
    # docs/reliability.md); verify checks footers before Lance opens a file, and names it
    count_top = len(pristine) - _FOOTER.size + 27
    Path(path).write_bytes(pristine[:count_top] + b"\x80" + pristine[count_top + 1 :])
    (problem,) = open_table(uri).verify()["problems"]
    assert "global buffer table points past its end" in problem["reason"], problem
    Path(path).write_bytes(pristine)
    footer = DataFileFooter.read(path)
    hashes_at, hashes_size = footer.buffers[int(footer.metadata[CHECKSUMS_KEY.encode()])]
    outcomes = []
    passes = [  # a sample of the pages, the recorded hashes, the metadata and footer whole
        (0, len(pristine), 61),
        (hashes_at, hashes_at + hashes_size, 2),
        (metadata_at, len(pristine), 1),
    ]
    for start, stop, step in passes:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                FLIP_SCRIPT,
                uri,
                path,
                *map(str, (start, stop, step, count_top)),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (done.stdout[-500:], done.stderr[-2000:])
        outcomes += [line.split(" ", 1) for line in done.stdout.splitlines()]
    raw = [(at, outcome) for at, outcome in outcomes if outcome.startswith("RAW")]
    assert raw == [], raw[:10]
    kinds = Counter(outcome for _, outcome in outcomes)
    # the damage was seen: data pages (hash checks) and metadata (named files) both
    assert kinds["CorruptBlobError"] and kinds["DataFileError"] and kinds["same"], kinds
    # a changed value no check could see: Lance keeps no page checksums, and the id column's
    # values carry no recorded hash (docs/reliability.md); never a blob's bytes
    changed = [int(at) for at, outcome in outcomes if outcome == "CHANGED"]
    assert all(at < metadata_at for at in changed), changed
    assert open_table(uri).to_arrow(blobs="bytes")["b"].to_pylist() == payloads


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("kind", 201, "kind 201 is no blob kind Lance has"),
        ("size", 1 << 56, "past the end of its"),  # pyarrow was asked to allocate 64 PB
        ("size", (1 << 64) - 5, "past any file's end"),  # a negative size as int64
        ("position", 5000, "past the end of its"),  # inside no file of this size
    ],
)
def test_a_garbled_blob_descriptor_is_named_before_anything_is_read(tmp_path, field, value, says):
    """A descriptor whose values decode but cannot be what a writer stored (Lance keeps no
    page checksums): a DataFileError naming the column, row and data file, before a read sizes
    a buffer by it. A kind past 7 used to name a fragment the table does not have."""
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": range(4), "b": blob_array([b"x" * 100] * 4)}), uri, dedup="off")
    table = open_table(uri)
    read = table.snapshot.dataset.to_table(columns=["b"], with_row_address=True)
    descriptors, addresses = read["b"].combine_chunks(), read["_rowaddr"].combine_chunks()
    fields = {f.name: descriptors.field(f.name) for f in descriptors.type}
    values = fields[field].to_pylist()
    values[2] = value
    fields[field] = pa.array(values, fields[field].type)
    garbled = pa.StructArray.from_arrays(list(fields.values()), fields=list(descriptors.type))
    with pytest.raises(DataFileError, match=f"blob column 'b', fragment 0 row 2: .*{says}") as e:
        table.snapshot.resolve_rows(("b",), garbled, addresses)
    assert e.value.uri.endswith(".lance") and e.value.uri in str(e.value)
    table.snapshot.resolve_rows(("b",), descriptors, addresses)  # the real ones resolve


_PAYLOADS = [bytes([i]) * (1000 + 7 * i) for i in range(12)]


def _garbled_descriptor_table(uri: str, then: pa.Table | None = None) -> tuple[str, bytes]:
    """A table of 12 rows (``then`` appended after) whose first data file has one byte
    flipped so that a blob descriptor decodes but cannot be true: the bytes below the file's
    metadata are flipped, last first, until verify names a descriptor. The file, and its
    bytes before."""
    write_table(pa.table({"id": range(12), "b": blob_array(_PAYLOADS)}), uri, dedup="off")
    (path,) = glob.glob(f"{uri}/data/*.lance")
    if then is not None:
        write_table(then, uri, mode="append", dedup="off")
    pristine = Path(path).read_bytes()
    for at in reversed(range(_FOOTER.unpack(pristine[-_FOOTER.size :])[0])):
        Path(path).write_bytes(pristine[:at] + bytes([pristine[at] ^ 0xFF]) + pristine[at + 1 :])
        problems = open_table(uri).verify()["problems"]
        if problems and "blob descriptor" in problems[0]["reason"]:
            return path, pristine
    pytest.fail("no flipped byte garbled a blob descriptor")


def test_a_blob_descriptor_garbled_on_disk_is_named_by_reads_and_verify(tmp_path):
    """Damage on disk that leaves a descriptor decodable but untrue (found by flipping the
    bytes below the file's metadata, last first, until a read names a descriptor): reads and
    ``verify`` name the file and row; verify used to stop on it."""
    uri = str(tmp_path / "t")
    path, pristine = _garbled_descriptor_table(uri)
    with pytest.raises(DataFileError, match="blob descriptor") as raised:
        open_table(uri).to_arrow(blobs="bytes")
    named = raised.value
    assert f"data file {Path(path).as_uri()} is damaged" in str(named)
    (problem,) = open_table(uri).verify()["problems"]
    assert "blob descriptor" in problem["reason"] and problem["uri"] == named.uri
    Path(path).write_bytes(pristine)
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_gc_with_retention_stops_on_a_garbled_descriptor_before_removing_a_version(tmp_path):
    """gc marks what its retained versions reference before Lance's cleanup removes the old
    ones: a blob descriptor the mark cannot read stops the run with every version (the way
    back to the rows) still there. It used to remove the old versions first."""
    uri = str(tmp_path / "t")
    more = pa.table({"id": [12], "b": blob_array([b"later" * 300])})
    path, pristine = _garbled_descriptor_table(uri, then=more)
    before = tree(uri)
    with pytest.raises(DataFileError, match="blob descriptor"):
        open_table(uri).gc(retain_versions=1, grace=timedelta(0))
    assert tree(uri) == before
    Path(path).write_bytes(pristine)
    report = open_table(uri).gc(retain_versions=1, grace=timedelta(0))
    assert report["removed_versions"] == [1] and report["retained_versions"] == [2]
    assert open_table(uri).read_blobs("b", range(13)) == [*_PAYLOADS, b"later" * 300]
