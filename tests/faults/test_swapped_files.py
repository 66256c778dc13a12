"""A file of the table replaced by another of the same size (issue 57): another table's data
file, this table's data file copied over another of its own, a store pack replaced by another
pack. Each carries checksums that agree with its own bytes, so a check of bytes against the
hashes the file holds passes; every read of bytes raises (a ``DataFileError`` naming the file,
or a ``CorruptBlobError``) and verify names the file, never returning the other file's bytes."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import BlobhouseError, CorruptBlobError, DataFileError
from blobhouse.files.ranges import BlobRef, open_ref, read_ranges
from blobhouse.loader import BatchLoader
from blobhouse.torch import TableBatchDataset, TableRowDataset
from tests.helpers import tree

ROWS = 4


def _append(uri: str, dedup: str, size: int, mode: str) -> tuple[list[bytes], str]:
    """Rows of random payloads of ``size`` bytes appended to ``uri``, and the data file written."""
    before = set(glob.glob(f"{uri}/data/*.lance"))
    payloads = [os.urandom(size) for _ in range(ROWS)]
    data = pa.table({"id": list(range(ROWS)), "img": blob_array(payloads)})
    write_table(data, uri, mode=mode, dedup=dedup)
    (written,) = set(glob.glob(f"{uri}/data/*.lance")) - before
    return payloads, written


def _swap(source: str, target: str) -> None:
    """``target`` replaced by the bytes of ``source``, which has the same size."""
    assert os.path.getsize(source) == os.path.getsize(target)
    shutil.copyfile(source, target)


# the layouts: inline payloads (per-file dedup), pack sidecars of the data file, the store
LAYOUTS = {
    "inline": ("content", 20_000),
    "sidecar": ("content", 200_000),
    "store": ("global", 20_000),
}


@pytest.fixture(params=["another table's", "its own, renamed"])
def swapped(request, tmp_path):
    """A table whose first data file was replaced by a data file of the same size: another
    table's (same schema and sizes), or this table's second one. Returns (uri, the replaced
    file)."""

    def make(layout: str) -> tuple[str, str]:
        dedup, size = LAYOUTS[layout]
        uri = str(tmp_path / f"t-{layout}")
        _, first = _append(uri, dedup, size, "create")
        if request.param == "another table's":
            _, source = _append(str(tmp_path / f"other-{layout}"), dedup, size, "create")
        else:
            _, source = _append(uri, dedup, size, "append")
        _swap(source, first)
        return uri, first

    return make


def _loader(uri: str) -> list:
    return [b for b in BatchLoader(uri, batch_size=ROWS, shuffle=False)]


def _torch_batches(uri: str) -> list:
    return list(DataLoader(TableBatchDataset(uri, batch_size=ROWS), batch_size=None))


def _torch_rows(uri: str) -> list:
    return list(DataLoader(TableRowDataset(uri), batch_size=2))


def _ranged(t) -> list:
    """References read by hand: ``BlobRef(**ref)`` keeps the hash a reference carries."""
    refs = [BlobRef(**r) for r in t.blob_refs("img", [0, 1]).to_pylist()]
    return [*read_ranges(refs), open_ref(refs[0]).read()]


# every read that returns bytes, and the references that carry the recorded hashes
DOORS = {
    "read_blobs": lambda t: t.read_blobs("img", [0]),
    "to_arrow bytes": lambda t: t.to_arrow(blobs="bytes"),
    "scan bytes": lambda t: list(t.scan(blobs="bytes")),
    "take bytes": lambda t: t.take([0], blobs="bytes"),
    "take_rows bytes": lambda t: t.take_rows(t.row_ids()[:1], blobs="bytes"),
    "take_row_dicts": lambda t: t.take_row_dicts(t.row_ids()[:1]),
    "open_blob": lambda t: t.open_blob("img", 0).read(),
    "blob_refs": lambda t: t.blob_refs("img", [0]),
    "to_arrow refs": lambda t: t.to_arrow(),
    "take_rows refs": lambda t: t.take_rows(t.row_ids()[:1]),
    "refs + read_ranges": _ranged,
    "BatchLoader": lambda t: _loader(t.location.root),
    "TableBatchDataset": lambda t: _torch_batches(t.location.root),
    "TableRowDataset": lambda t: _torch_rows(t.location.root),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_read_of_a_swapped_data_file_names_it(swapped, layout):
    uri, first = swapped(layout)
    table = open_table(uri)
    for name, read in DOORS.items():
        with pytest.raises(DataFileError) as raised:
            read(table)
        error = raised.value
        assert error.uri.endswith(Path(first).name), (name, str(error))
        assert "another data file" in str(error), (name, str(error))
        assert Path(first).name in str(error), name


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("deep", [False, True])
def test_verify_names_a_swapped_data_file(swapped, layout, deep):
    uri, first = swapped(layout)
    problems = open_table(uri).verify(deep=deep)["problems"]
    named = [p for p in problems if p["uri"].endswith(Path(first).name)]
    assert named, problems
    assert "another data file" in named[0]["reason"], named


def test_a_swapped_data_file_changes_nothing_and_earlier_versions_read(tmp_path):
    """A change (compaction carries the payloads) refuses the file before writing anything;
    a version written before the swapped file still reads every row."""
    uri = str(tmp_path / "t")
    ours, _ = _append(uri, "content", 20_000, "create")
    _, second = _append(uri, "content", 20_000, "append")
    _, source = _append(str(tmp_path / "other"), "content", 20_000, "create")
    _swap(source, second)
    table = open_table(uri)
    version, before = table.version, tree(uri)
    with pytest.raises(BlobhouseError, match="another data file"):
        table.compact()
    assert open_table(uri).version == version and tree(uri) == before
    assert open_table(uri, version=1).read_blobs("img", list(range(ROWS))) == ours


def test_a_pack_swapped_for_another_of_the_same_size_is_caught(tmp_path):
    """Two store packs of the same size: the first replaced by the second. Every read of
    bytes raises CorruptBlobError (none returns the other pack's payloads) and deep verify
    names the rows."""
    uri = str(tmp_path / "t")
    _append(uri, "global", 200_000, "create")
    _append(uri, "global", 200_000, "append")
    first, second = sorted(glob.glob(f"{uri}/_blobs/packs/*.pack"), key=os.path.getmtime)
    _swap(second, first)
    table = open_table(uri)
    for name, read in DOORS.items():
        if name.endswith(" refs") or name == "blob_refs":
            continue  # references carry the recorded hash: reading them is the check
        with pytest.raises(CorruptBlobError, match="do not match the blake3"):
            read(table)
    problems = table.verify(deep=True)["problems"]
    assert {p["uri"] for p in problems} == {f"file://{first}"}
    rows = [p["row"] for p in problems if p["reason"].startswith("content hash mismatch")]
    assert sorted(rows) == list(range(ROWS))  # and the index entries naming those bytes too


def test_a_truncated_data_file_is_named_by_every_read(tmp_path):
    uri = str(tmp_path / "t")
    _, first = _append(uri, "content", 20_000, "create")
    data = Path(first).read_bytes()
    Path(first).write_bytes(data[: len(data) // 2])
    table = open_table(uri)
    for name, read in DOORS.items():
        with pytest.raises(DataFileError) as raised:
            read(table)
        assert raised.value.uri.endswith(Path(first).name), name
    (problem,) = table.verify(deep=True)["problems"]
    assert problem["uri"].endswith(Path(first).name)


def test_unchecked_reads_of_a_table_lance_compacted_still_read(tmp_path):
    """Files Lance writes itself (its own compaction) carry no checksums: nothing to check
    them against, and they read as before."""
    import lance

    uri = str(tmp_path / "t")
    ours, _ = _append(uri, "content", 20_000, "create")
    more, _ = _append(uri, "content", 20_000, "append")
    lance.dataset(uri).optimize.compact_files()
    table = open_table(uri)
    assert table.read_blobs("img", list(range(2 * ROWS))) == ours + more
    refs = table.blob_refs("img", [0, 1])
    assert refs.field("blake3").null_count == 2  # nothing recorded: the references say so
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_references_carry_the_recorded_hash_unless_told_not_to(tmp_path):
    """Every read of references gives each the blake3 recorded for its payload (what Spark's
    read_blob and materialize check against); check_hashes=False gives none and opens no
    data file (a swapped one is then not seen)."""
    from blobhouse.dedup import content_hash

    for layout, (dedup, size) in LAYOUTS.items():
        uri = str(tmp_path / layout)
        payloads, _ = _append(uri, dedup, size, "create")
        table = open_table(uri)
        digests = [content_hash(p) for p in payloads]
        reads = {
            "blob_refs": table.blob_refs("img", list(range(ROWS))),
            "to_arrow": table.to_arrow().column("img").combine_chunks(),
            "take": table.take(list(range(ROWS))).column("img").combine_chunks(),
            "take_rows": table.take_rows(table.row_ids()).column("img").combine_chunks(),
        }
        for name, refs in reads.items():
            assert refs.field("blake3").to_pylist() == digests, (layout, name)
        unchecked = table.to_arrow(check_hashes=False).column("img").combine_chunks()
        assert unchecked.field("blake3").null_count == ROWS
        taken = table.take([0], check_hashes=False).column("img")
        assert taken.combine_chunks().field("blake3").null_count == 1
        refs = [BlobRef(**r) for r in reads["blob_refs"].to_pylist()]
        assert read_ranges(refs) == payloads and open_ref(refs[1]).read() == payloads[1]
