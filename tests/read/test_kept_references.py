"""Random reads by position from kept references (blobhouse.kept_references): once a fragment
is kept, reads of it skip Lance's take; whatever is kept, every read returns what Lance's own
take of the same version would, checked, and errors name their rows as before."""

from __future__ import annotations

import random
import shutil
import threading
import time

import lance
import numpy as np
import pyarrow as pa
import pytest

from blobhouse import (
    CorruptBlobError,
    ExternalBlobError,
    PreparedBlob,
    WrittenFile,
    blob_array,
    open_table,
    write_table,
)
from blobhouse import kept_references as kept_module
from blobhouse.cache import SharedCache
from blobhouse.files import checksums
from blobhouse.files.references import ResolvedRows
from blobhouse.files.session import BlobSession, prepared_array, prepared_field
from blobhouse.kept_references import KeptReferences
from blobhouse.placement import Kind
from tests.helpers import flip_payload, stock_read

# inline, packed and dedicated sizes, a repeat of an earlier payload, and nulls
SIZES = [100, 70_000, 5_000_000, 3_000, 200_000]


def payload(i: int) -> bytes | None:
    if i % 11 == 7:
        return None
    if i % 13 == 5:
        return payload(i - 5)
    size = SIZES[i % len(SIZES)]
    return i.to_bytes(4, "little") * (size // 4)


def keep_every_take(monkeypatch) -> None:
    """Every fragment a take touches from now on is kept at once (never has to earn it)."""
    monkeypatch.setattr(kept_module, "KEEP_TAKE_SECONDS", 0.0)
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", 0.0)


@pytest.fixture
def keep_at_once(monkeypatch):
    """Every fragment a take touches is kept at once (its takes never have to earn it)."""
    keep_every_take(monkeypatch)


def rows_from(first: int, rows: int) -> pa.Table:
    """Rows ``first`` to ``first + rows - 1`` of the fragments table: ``b`` holds payload(id),
    ``meta.img`` payload(id + 1) unless the row's ``meta`` is null."""
    ids = range(first, first + rows)
    meta = pa.StructArray.from_arrays(
        [blob_array([payload(i + 1) for i in ids]), pa.array(ids)],
        names=["img", "n"],
        mask=pa.array([i % 17 == 3 for i in ids]),
    )
    return pa.table({"id": ids, "b": blob_array([payload(i) for i in ids]), "meta": meta})


@pytest.fixture
def fragments_table(tmp_path):
    """Three fragments of 40 rows, some rows deleted from the middle one, a nested blob column
    with a null parent, written with each dedup mode's placement in turn."""
    uri = str(tmp_path / "t")
    write_table(rows_from(0, 120), uri, max_rows_per_file=40, dedup="content")
    open_table(uri).delete("id >= 50 AND id < 60 OR id = 79")
    return uri


def stock_bytes(uri: str, column: str, positions: list[int], version: int | None = None):
    """What pylance reads for ``positions`` (bytes of blob column ``column``, None for null)."""
    dataset = lance.dataset(uri, version=version)
    by_row = dataset.to_table(columns=["id"]).column("id").to_pylist()
    if column == "b":
        return [payload(by_row[p]) for p in positions]
    nulls = {i for i in range(120) if i % 17 == 3}
    return [None if by_row[p] in nulls else payload(by_row[p] + 1) for p in positions]


def draws(rows: int, seed: int) -> list[list[int]]:
    """Position lists as readers send them: one row, a few, unsorted, repeats, all."""
    rng = random.Random(seed)
    return [
        [rng.randrange(rows)],
        rng.sample(range(rows), 7),
        [rng.randrange(rows) for _ in range(30)],
        sorted(rng.sample(range(rows), 25), reverse=True),
        list(range(rows)),
    ]


@pytest.mark.parametrize("column", ["b", "meta.img"])
def test_kept_rows_read_what_lance_reads(fragments_table, keep_at_once, column):
    table = open_table(fragments_table)
    rows = table.count_rows()
    assert rows == 109
    for positions in draws(rows, seed=len(column)) * 2:  # the second round from what is kept
        assert table.read_blobs(column, positions) == stock_bytes(
            fragments_table, column, positions
        )
    kept = table.snapshot._kept[tuple(column.split("."))]
    assert kept.held() == [0, 1, 2]  # every fragment is read from memory now


def test_reads_are_the_same_kept_or_taken(fragments_table, monkeypatch):
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", float("inf"))
    taken = open_table(fragments_table)
    expected = [taken.read_blobs("b", p) for p in draws(109, seed=3)]
    assert not taken.snapshot._kept[("b",)].held()  # never earned: each read is a take
    keep_every_take(monkeypatch)
    kept = open_table(fragments_table)
    assert [kept.read_blobs("b", p) for p in draws(109, seed=3)] == expected
    assert kept.snapshot._kept[("b",)].held() == [0, 1, 2]


def test_kept_rows_stay_within_their_budget(fragments_table, keep_at_once):
    table = open_table(fragments_table)
    snapshot = table.snapshot
    kept = KeptReferences(
        snapshot.dataset,
        ("b",),
        lambda read: read(),
        lambda d, a: snapshot.resolve_rows(("b",), d, a),
        limit=3_000,  # room for one fragment's rows at a time
    )
    for positions in draws(109, seed=5):
        rows = kept.take(positions)
        assert kept._kept.weight <= 3_000 and len(kept.held()) <= 1
        want = snapshot.dataset.take(positions, ["b", "_rowaddr"])
        assert rows.addresses.tolist() == want.column("_rowaddr").to_pylist()
        sizes = [None if d is None else d["size"] for d in want.column("b").to_pylist()]
        got = rows.refs.sizes.tolist()
        assert [s if v else None for s, v in zip(got, rows.refs.valid, strict=True)] == sizes


def test_a_fragment_with_a_row_that_does_not_resolve_is_read_by_take(tmp_path, keep_at_once):
    """A fragment another writer filled with a reference outside every base is never kept:
    its good rows read, its bad row fails naming it, every time."""
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [0], "b": blob_array([b"z" * 1000])}), uri)
    session = BlobSession(table.data_file_path())
    schema = pa.schema([pa.field("id", pa.int64()), prepared_field("b")])
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret" * 10)
    values = [PreparedBlob(Kind.INLINE, size=100, data=b"good" * 25)] * 3
    values.insert(1, PreparedBlob(Kind.EXTERNAL, size=10, uri=f"file://{outside}"))
    batch = pa.record_batch([pa.array(range(1, 5)), prepared_array(values)], schema=schema)
    writer = session.open_data_file(schema)
    writer.write_batch(batch)
    session.close_data_file(writer)
    table = table.add_data_file(WrittenFile(session.data_file_name, 4, writer.size_bytes, (), 0))
    for _ in range(3):
        assert table.read_blobs("b", [3, 1, 0]) == [b"good" * 25, b"good" * 25, b"z" * 1000]
        with pytest.raises(ExternalBlobError, match=r"'b', fragment 1 row 1"):
            table.read_blobs("b", [2])
    assert table.snapshot._kept[("b",)].held() == [0]


def test_damage_is_caught_in_kept_rows(fragments_table, keep_at_once):
    table = open_table(fragments_table)
    assert table.read_blobs("b", list(range(109)))  # every fragment kept
    flip_payload(fragments_table, "b", 42)
    with pytest.raises(CorruptBlobError, match=r"'b', fragment 1 row 2: the bytes at"):
        table.read_blobs("b", [42])


def test_threads_share_kept_rows(fragments_table, keep_at_once):
    table = open_table(fragments_table)
    failures: list[BaseException] = []
    # what pylance reads, asked before the threads start: pylance's own reads in threads
    # beside a data file's global buffer being read can wait on each other for ever
    expected = {
        seed: [stock_bytes(fragments_table, "b", p) for p in draws(109, seed)] for seed in range(8)
    }

    def reader(seed: int) -> None:
        try:
            for positions, want in zip(draws(109, seed) * 3, expected[seed] * 3, strict=True):
                assert table.read_blobs("b", positions) == want
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


def test_each_version_keeps_its_own_rows(fragments_table, keep_at_once):
    """A table pinned at a version reads that version's rows from what it kept, after other
    Lance tools deleted, updated and compacted the table."""
    old = open_table(fragments_table)
    version = old.version
    positions = list(range(0, 109, 3))
    before = old.read_blobs("b", positions)
    dataset = lance.dataset(fragments_table)
    dataset.delete("id < 10")
    dataset.update({"id": "id + 1000"}, where="id > 100")
    dataset.optimize.compact_files()
    assert (
        old.read_blobs("b", positions)
        == before
        == stock_bytes(fragments_table, "b", positions, version)
    )
    new = open_table(fragments_table)
    expected = stock_read(fragments_table, "b")
    assert new.read_blobs("b", list(range(len(expected)))) == expected


def test_a_new_version_reads_the_fragments_it_shares_from_memory(fragments_table, keep_at_once):
    """What one version kept serves the next at once (the table object an append returns,
    before any read), fragment by fragment as the manifest describes it: a fragment a delete
    changed is read again, and every read is what Lance reads."""
    table = open_table(fragments_table)
    table.read_blobs("b", list(range(109)))
    appended = write_table(rows_from(120, 30), fragments_table, mode="append", dedup="content")
    assert appended.snapshot._kept_references(("b",)).held() == [0, 1, 2]
    expected = stock_bytes(fragments_table, "b", list(range(139)))
    assert appended.read_blobs("b", list(range(139))) == expected
    assert appended.snapshot._kept_references(("b",)).held() == [0, 1, 2, 3]
    version = appended.version
    changed = appended.delete("id = 45")  # fragment 1, a new deletion file
    assert changed.snapshot._kept_references(("b",)).held() == [0, 2, 3]
    assert changed.read_blobs("b", list(range(138))) == stock_bytes(
        fragments_table, "b", list(range(138))
    )
    # the older version reads its own rows still
    assert changed.checkout(version).read_blobs("b", list(range(139))) == expected


def test_a_copy_keeps_rows_of_its_own(fragments_table, keep_at_once, tmp_path):
    """A copy of the table (``cp -r``, the original gone) kept nothing of the original's,
    though its manifest describes the same fragments: its rows resolve into its own files."""
    table = open_table(fragments_table)
    expected = table.read_blobs("b", list(range(109)))
    copy = str(tmp_path / "copy")
    shutil.copytree(fragments_table, copy)
    shutil.rmtree(fragments_table)
    copied = open_table(copy)
    assert copied.snapshot._kept_references(("b",)).held() == []
    assert copied.read_blobs("b", list(range(109))) == expected
    uris = {ref["uri"] for ref in copied.blob_refs("b", list(range(109))).to_pylist() if ref}
    assert uris and all(uri.startswith(f"file://{copy}/") for uri in uris), uris


@pytest.mark.parametrize("fragments", ["native", "pylance's wrappers"])
def test_positions_are_counted_as_lance_counts_them(fragments_table, fragments, monkeypatch):
    """The fragment of every position, from the manifest's row and deletion counts alone,
    is the one Lance's take reads it from: counted from Lance's own fragment objects, or
    from pylance's wrappers of them (a pylance without the former)."""
    if fragments != "native":
        monkeypatch.setattr(kept_module, "_fragments_of", lambda dataset: dataset.get_fragments())
    dataset = lance.dataset(fragments_table)
    kept = KeptReferences(dataset, ("b",), lambda read: read(), lambda d, a: None)
    addresses = dataset.take(list(range(109)), ["_rowaddr"]).column("_rowaddr").to_numpy()
    fragments = np.searchsorted(kept._starts, np.arange(109), side="right") - 1
    ids = np.array([f.fragment_id for f in dataset.get_fragments()])
    assert (ids[fragments] == addresses >> 32).all()


@pytest.mark.parametrize(
    "columns",
    [["b"], ["id", "b"], ["meta.img", "id", "b"], ["meta", "b"], ["meta", "meta.img"], None],
)
@pytest.mark.parametrize("blobs", ["bytes", "refs"])
def test_rows_by_id_are_the_same_kept_or_taken(fragments_table, monkeypatch, columns, blobs):
    """take_rows (what BatchLoader reads) gives the same table, schema included, whether its
    blob columns come from kept references or from Lance's take."""
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", float("inf"))
    taken = open_table(fragments_table)
    ids = taken.row_ids()
    picks = [ids[p] for p in draws(len(ids), seed=7)]
    expected = [taken.take_rows(p, columns, blobs) for p in picks]
    keep_every_take(monkeypatch)
    kept = open_table(fragments_table)
    for _ in range(2):  # the second round from what is kept
        for p, want in zip(picks, expected, strict=True):
            got = kept.take_rows(p, columns, blobs)
            assert got.equals(want, check_metadata=True), (got.schema, want.schema)
    # a blob column inside a selected struct is read by the take, as before (a struct and
    # its blob column selected side by side: the struct's blob bytes too, not descriptors)
    assert bool(kept.snapshot._kept) == (columns is not None and "meta" not in columns)
    if blobs == "bytes" and columns and "meta" in columns:
        values = got.column("meta").combine_chunks().field("img").to_pylist()
        assert all(v is None or isinstance(v, bytes) for v in values)


@pytest.mark.parametrize("columns", [["b"], ["meta.img", "id", "b"], ["meta", "b"], None])
@pytest.mark.parametrize("blobs", ["bytes", "refs"])
def test_rows_by_position_are_the_same_kept_or_taken(fragments_table, monkeypatch, columns, blobs):
    """take (rows by position) gives the same table kept or taken, and its bytes are what
    pylance reads at those positions."""
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", float("inf"))
    taken = open_table(fragments_table)
    picks = draws(109, seed=11)
    expected = [taken.take(p, columns, blobs) for p in picks]
    keep_every_take(monkeypatch)
    kept = open_table(fragments_table)
    for _ in range(2):  # the second round from what is kept
        for p, want in zip(picks, expected, strict=True):
            got = kept.take(p, columns, blobs)
            assert got.equals(want, check_metadata=True), (got.schema, want.schema)
            if blobs == "bytes":
                assert got.column("b").to_pylist() == stock_bytes(fragments_table, "b", p)
    assert bool(kept.snapshot._kept) == (columns is not None and "meta" not in columns)


@pytest.mark.parametrize("columns", [["b"], ["id", "b"], ["id"]])
def test_deleted_ids_are_named_however_they_are_asked_for(fragments_table, columns):
    """Lance leaves deleted rows out of a take by id without a word, and panics when one
    comes with a repeated id: blobhouse refuses them, naming them, kept or taken."""
    table = open_table(fragments_table)
    ids = [int(i) for i in table.row_ids()]
    deleted = (1 << 32) | 12  # id 52
    for asked in ([*ids[:40], deleted], [ids[0], ids[0], deleted], [deleted, deleted]):
        for _ in range(2):
            with pytest.raises(IndexError, match=r"deleted rows") as raised:
                table.take_rows(asked, columns, "bytes")
            assert f"row ids [{deleted}]" in str(raised.value)
    got = table.take_rows([ids[3], ids[0], ids[3]], columns, "bytes")
    want = table.take_rows([ids[3], ids[0]], columns, "bytes")
    assert got.slice(0, 2).equals(want) and got.slice(2).equals(want.slice(0, 1))


def test_ids_that_are_not_rows_are_refused_kept_or_taken(fragments_table, keep_at_once):
    table = open_table(fragments_table)
    ids = table.row_ids()
    assert table.take_rows(ids, ["b"]).num_rows == 109  # every fragment kept
    deleted = (1 << 32) | 12  # id 52, deleted from the second fragment: Lance leaves it out
    for bad, why in (
        ([int(ids[0]), deleted], f"row ids \\[{deleted}\\] .*: deleted rows"),
        ([5 << 32], f"id {5 << 32} names fragment 5, not in this version"),
        ([(2 << 32) | 40], f"id {(2 << 32) | 40} names row 40 of fragment 2 of \\d+ rows"),
    ):
        with pytest.raises(IndexError, match=r"are not all rows of version \d+ of this table"):
            table.take_rows(bad, ["b"], "bytes")
        with pytest.raises(IndexError, match=why):
            open_table(fragments_table).take_rows(bad, ["b"], "bytes")  # nothing kept yet
        with pytest.raises(IndexError, match=why):
            open_table(fragments_table).take_rows(bad, ["b"])  # refs: Lance's take


def test_stable_ids_that_are_no_rows_are_not_called_deleted(tmp_path):
    """With stable row ids an id is no address: one that no row of the version has may be a
    deleted row's or one never given out; the error says so, not only "deleted rows"."""
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).delete("id = 2")
    table = open_table(uri)
    assert table.row_ids().tolist() == [0, 2]
    for asked in ([1], [10**6], [0, 99]):
        with pytest.raises(IndexError, match=r"no row of this version has them \(deleted rows"):
            table.take_rows(asked)
    assert table.take_rows([2]).column("id").to_pylist() == [3]


@pytest.mark.parametrize("columns", [["b"], ["id", "meta.img", "b"], ["meta", "b"]])
def test_row_dicts_are_the_same_kept_or_taken(fragments_table, monkeypatch, columns):
    """take_row_dicts (what BatchLoader.row_batches reads), kept or taken: the same rows, and
    rows sharing a payload share one bytes object either way."""
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", float("inf"))
    taken = open_table(fragments_table)
    ids = taken.row_ids()
    picks = [ids[p] for p in draws(len(ids), seed=9)]
    expected = [taken.take_row_dicts(p, columns) for p in picks]
    keep_every_take(monkeypatch)
    kept = open_table(fragments_table)
    for _ in range(2):
        for p, want in zip(picks, expected, strict=True):
            got = kept.take_row_dicts(p, columns)
            assert got == want
            assert [list(row) for row in got] == [list(row) for row in want]
    rows = kept.take_row_dicts(ids, columns)
    refs = kept.take_rows(ids, ["b"], "refs").column("b").to_pylist()
    by_range: dict[tuple, bytes] = {}
    for row, ref in zip(rows, refs, strict=True):
        if ref is not None:  # one object for every row of the same stored payload
            assert by_range.setdefault(tuple(ref.values()), row["b"]) is row["b"]
    assert len(by_range) < sum(r is not None for r in refs)


@pytest.mark.parametrize(
    ("read", "bad", "error", "message"),
    [
        ("take_rows", [1.5], TypeError, r"row ids must be integers, got 1.5"),
        ("take_rows", ["0"], TypeError, r"row ids must be integers, got '0'"),
        ("take_rows", [True], TypeError, r"row ids must be integers, got True"),
        ("take_rows", [-1], IndexError, r"row ids \[-1\] are not rows"),
        ("take_rows", np.array([-1]), IndexError, r"row ids \[-1\] are not rows"),
        ("take_rows", [-1, 1 << 63], IndexError, r"are not rows"),
        ("take_row_dicts", [2.0], TypeError, r"row ids must be integers, got 2.0"),
        ("take", [1.5], TypeError, r"row indices must be integers, got 1.5"),
        ("take", ["0"], TypeError, r"row indices must be integers, got '0'"),
        ("read_blobs", [0.0], TypeError, r"row indices must be integers, got 0.0"),
        ("take", 3, TypeError, r"row indices must be a sequence of integers, got 3"),
        (
            "take",
            np.array([[1, 2]]),
            TypeError,
            r"row indices must be one-dimensional, got.*\(1, 2\)",
        ),
        # a uint64 array is what row_ids() returns: a reshaped one is still not rows
        (
            "take_rows",
            np.array([[1, 2]], np.uint64),
            TypeError,
            r"row ids must be one-dim.*\(1, 2\)",
        ),
        ("take_row_dicts", np.zeros((2, 1), np.uint64), TypeError, r"row ids must be one-dim"),
        ("take_rows", np.array([[1, 2]]), TypeError, r"row ids must be one-dimensional"),
        ("read_blobs", np.array(3), TypeError, r"row indices must be one-dimensional, got.*\(\)"),
        ("take_rows", "12", TypeError, r"row ids must be a sequence of integers, got '12'"),
        ("take", [-1], IndexError, r"row indices \[-1\] out of range"),
        ("take", [1 << 64], IndexError, r"out of range"),
    ],
)
def test_rows_are_asked_for_by_integers(fragments_table, read, bad, error, message):
    """A float, a string or a bool is not a row (1.5 read row 1, "0" row 0), and a negative
    id is not one either (numpy wrapped -1 to 2**64 - 1; a list of it overflowed)."""
    table = open_table(fragments_table)
    args = ("b", bad) if read == "read_blobs" else (bad,)
    with pytest.raises(error, match=message):
        getattr(table, read)(*args)


def test_rows_are_asked_for_by_any_kind_of_integer(fragments_table):
    """numpy's integers and torch's integer tensors read the rows they name."""
    torch = pytest.importorskip("torch")
    table = open_table(fragments_table)
    want = table.take([3, 7], ["id"]).column("id").to_pylist()
    for indices in ([np.int32(3), np.uint64(7)], torch.tensor([3, 7]), np.array([3, 7])):
        assert table.take(indices, ["id"]).column("id").to_pylist() == want
    ids = table.row_ids()
    got = table.take_rows(torch.tensor(ids[[3, 7]].astype(np.int64)), ["id"])
    assert got.column("id").to_pylist() == want
    # a mask is not rows: its True would read row 1
    for read in (table.take, table.take_rows):
        with pytest.raises(TypeError, match=r"must be integers, got tensor\(True\)"):
            read(torch.tensor([True, False, True]), ["id"])


def test_rows_sized_from_their_objects_are_kept_for_one_table_object(tmp_path, keep_at_once):
    """A row stock Lance recorded as a whole external object takes its size from the object
    when it is resolved: what one table object kept of its fragment is never another's (the
    object may have changed since), though the manifest describes the fragment alike."""
    import lance.blob as lance_blob

    clip = tmp_path / "clip.bin"
    clip.write_bytes(b"a" * 7000)
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0], "v": blob_array([b"x"])}), uri, allowed_bases=[str(tmp_path)])
    whole = lance_blob.blob_array([lance_blob.Blob(uri=f"file://{clip}")] * 2)
    lance.write_dataset(
        pa.table({"id": pa.array([1, 2], pa.int64()), "v": whole}),
        uri,
        mode="append",
        allow_external_blob_outside_bases=True,
    )
    first = open_table(uri)
    assert first.read_blobs("v", [0, 1, 2]) == [b"x", b"a" * 7000, b"a" * 7000]
    assert first.snapshot._kept_references(("v",)).held() == [0, 1]
    clip.write_bytes(b"b" * 5000)
    second = open_table(uri)
    assert second.snapshot._kept_references(("v",)).held() == [0]
    assert second.read_blobs("v", [2, 0]) == [b"b" * 5000, b"x"]


def test_a_read_of_a_few_rows_looks_at_their_fragments_files_only(tmp_path):
    """Each version's reader notes where a fragment's data files are when it first resolves
    a row of it: a new version of a table of many fragments (a table grown by appends) reads
    a few rows without walking every fragment's metadata first (16 ms at 2,000 fragments)."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (100 + i) for i in range(200)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=4)
    table = open_table(uri)
    assert len(table.dataset.get_fragments()) == 50
    assert table.read_blobs("b", [9, 10, 121]) == [payloads[9], payloads[10], payloads[121]]
    assert table.snapshot.resolver._loaded == {2, 30}
    assert table.data_file_of(("b",))(44).endswith(".lance")
    assert table.snapshot.resolver._loaded == {2, 30, 44}


def count_lance_reads(monkeypatch) -> list[tuple[str, int]]:
    """Lance's takes (and their rows) and scans (and their fragments) from now on."""
    reads: list[tuple[str, int]] = []
    take, scanner = lance.LanceDataset.take, lance.LanceDataset.scanner

    def counted_take(self, rows, *args, **kwargs):
        reads.append(("take", len(rows)))
        return take(self, rows, *args, **kwargs)

    def counted_scanner(self, *args, **kwargs):
        reads.append(("scan", len(kwargs.get("fragments") or ())))
        return scanner(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "take", counted_take)
    monkeypatch.setattr(lance.LanceDataset, "scanner", counted_scanner)
    return reads


def test_fragments_one_read_earns_are_kept_in_one_read_of_lance(tmp_path, monkeypatch):
    """A read spread over many small fragments (a table grown by small appends) keeps the
    fragments it earned with one more read of Lance, not one a fragment: a fresh process's first
    read of 64 rows of 2,000 fragments of 10 rows took 65 takes (0.2 s against pylance's 20 ms)."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (100 + i) for i in range(200)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=4)
    keep_every_take(monkeypatch)
    table = open_table(uri)
    reads = count_lance_reads(monkeypatch)
    spread = list(range(1, 200, 4))  # a row of every fragment
    assert table.read_blobs("b", spread) == [payloads[p] for p in spread]
    assert reads == [("take", 50), ("scan", 50)]  # the read's own take; one scan keeps them
    assert table.snapshot._kept[("b",)].held() == list(range(50))
    assert table.read_blobs("b", spread[::-1]) == [payloads[p] for p in spread[::-1]]
    assert len(reads) == 2  # from memory


def test_a_take_of_small_fragments_earns_them_only_past_a_takes_own_cost(tmp_path, monkeypatch):
    """Keeping a fragment costs a take of its own (~0.6 ms however few its rows), so a read
    whose share of a fragment costs less does not keep it; the fragment is kept once its
    reads have cost what keeping it does."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (100 + i) for i in range(200)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=4)
    monkeypatch.setattr(kept_module, "KEEP_TAKE_SECONDS", 3600.0)
    table = open_table(uri)
    for _ in range(3):
        assert table.read_blobs("b", [0, 5, 199]) == [payloads[0], payloads[5], payloads[199]]
    kept = table.snapshot._kept[("b",)]
    assert kept.held() == []
    kept._spent[[0, 1]] = 3600.0  # as if their takes had cost an hour
    assert table.read_blobs("b", [0, 5, 199]) == [payloads[0], payloads[5], payloads[199]]
    assert kept.held() == [0, 1]


def test_a_fragments_first_take_runs_cold_and_buys_nothing(tmp_path, monkeypatch):
    """A fragment's first take opens its file (in a fresh process, Lance's runtime too: 3-11 ms
    against 0.6-1 ms later) and is not charged: however cheap keeping is, a process's first
    read is a take alone (it read the fragment whole too, 1.3x the time), and the second read
    of the fragment keeps it."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (100 + i) for i in range(40)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=20)
    monkeypatch.setattr(kept_module, "KEEP_TAKE_SECONDS", 1e-12)  # any charge buys it
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", 0.0)
    table = open_table(uri)
    assert table.read_blobs("b", [3, 5]) == [payloads[3], payloads[5]]
    kept = table.snapshot._kept[("b",)]
    assert kept.held() == []
    assert table.read_blobs("b", [5, 25]) == [payloads[5], payloads[25]]
    assert kept.held() == [0]  # fragment 1's take was its first
    assert table.read_blobs("b", [25]) == [payloads[25]]
    assert kept.held() == [0, 1]


def test_fragments_earned_together_are_read_in_scans_of_half_the_budget(tmp_path, monkeypatch):
    """Fragments earned by one read are read whole together, but never more rows at once
    than half the budget holds: large fragments earned at once never all sit in memory."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i % 251]) * (100 + i) for i in range(40)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=10)
    keep_every_take(monkeypatch)
    snapshot = open_table(uri).snapshot
    reads = count_lance_reads(monkeypatch)
    kept = KeptReferences(
        snapshot.dataset,
        ("b",),
        lambda read: read(),
        lambda d, a: snapshot.resolve_rows(("b",), d, a),
        limit=20 * kept_module._ROW_BYTES * 2,  # half of it: the rows of two fragments of 10
    )
    rows = kept.take([0, 15, 25, 35])
    assert rows.refs.sizes.tolist() == [100, 115, 125, 135]
    assert reads == [("take", 4), ("scan", 2), ("scan", 2)]  # the read, then two at a time


def test_kept_rows_carry_their_recorded_hashes(fragments_table, keep_at_once, monkeypatch):
    """A checked read of kept rows opens no data file's hash list: each kept fragment carries
    its rows' recorded hashes, looked up once (a list too large to stay loaded was read again
    by every read of 64 random rows: 0.035x pylance's take over 800,000 small rows)."""
    positions = list(range(109))
    table = open_table(fragments_table)
    expected = stock_bytes(fragments_table, "b", positions)
    assert table.read_blobs("b", positions) == expected  # every fragment kept
    assert table.read_blobs("b", positions) == expected  # their hashes looked up, and kept
    loads = []
    real_load = checksums.load_checksums
    monkeypatch.setattr(checksums, "_LOADED", SharedCache(1 << 30, lambda _: 1))  # none held
    monkeypatch.setattr(
        checksums, "load_checksums", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k)
    )
    fresh = open_table(fragments_table)  # another table object: the process's kept rows
    ids = fresh.row_ids()
    for draw in draws(109, seed=5):
        assert fresh.read_blobs("b", draw) == [expected[p] for p in draw]
        taken = fresh.take(draw, columns=["b"], blobs="bytes").column("b").to_pylist()
        assert taken == [expected[p] for p in draw]
        by_id = fresh.take_rows(ids[draw], columns=["b"], blobs="bytes").column("b").to_pylist()
        assert by_id == [expected[p] for p in draw]
    refs = fresh.blob_refs("b", positions).to_pylist()
    assert [r is not None and r["blake3"] is not None for r in refs] == [
        v is not None for v in expected
    ]
    assert loads == []
    flip_payload(fragments_table, "b", 42)
    with pytest.raises(CorruptBlobError, match=r"'b', fragment 1 row 2: the bytes at"):
        fresh.read_blobs("b", [41, 42])
    assert loads == []  # caught by the hash the kept row carries


def test_checked_reads_charge_their_hash_lookups_to_the_fragments(tmp_path, monkeypatch):
    """What a checked read of rows taken by Lance costs includes looking their hashes up: a
    fragment whose list is loaded again by every read earns keeping through those reads,
    where unchecked reads of the same rows, which open no list, have not earned it yet."""
    uri = str(tmp_path / "t")
    payloads = [bytes([i]) * (200 + i) for i in range(40)]
    write_table(pa.table({"b": blob_array(payloads)}), uri, max_rows_per_file=20)
    monkeypatch.setattr(kept_module, "KEEP_TAKE_SECONDS", 0.05)
    monkeypatch.setattr(kept_module, "LOAD_SECONDS_PER_ROW", 0.0)
    monkeypatch.setattr(checksums, "_LOADED", SharedCache(1, lambda _: 1))  # one list held
    real_load = checksums.load_checksums

    def slow_load(*args, **kwargs):
        time.sleep(0.03)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(checksums, "load_checksums", slow_load)
    rows = [3, 25]  # one row of each fragment: their lists evict each other
    unchecked = open_table(uri)
    for _ in range(3):
        taken = unchecked.take(rows, columns=["b"], blobs="bytes", check_hashes=False)
        assert taken.column("b").to_pylist() == [payloads[3], payloads[25]]
    assert unchecked.snapshot._kept[("b",)].held() == []
    checked = open_table(uri)
    for _ in range(3):  # the first take runs cold and is not charged; two lists a read
        assert checked.read_blobs("b", rows) == [payloads[3], payloads[25]]
    assert checked.snapshot._kept[("b",)].held() == [0, 1]


def test_rows_carrying_some_hashes_have_the_rest_looked_up(fragments_table):
    """A read that joins kept rows (their hashes carried) and taken rows (looked up now) gets
    each row's recorded hash, in the read's order."""
    snapshot = open_table(fragments_table).snapshot
    path = ("b",)
    hashes = snapshot.recorded_hashes()

    def expected(rows: ResolvedRows) -> list[bytes | None]:
        return hashes.expected(
            snapshot.file_column(path), rows, snapshot.data_file_of(path)
        ).to_list()

    rows = snapshot.rows_at(path, list(range(109)))
    assert rows.recorded is None
    every = hashes.expected(snapshot.file_column(path), rows, snapshot.data_file_of(path))
    assert sum(d is not None for d in every.to_list()) > 90
    carried = rows.take(np.arange(50)).with_recorded(every.take(np.arange(50)))
    joined = ResolvedRows.concat([rows.take(np.arange(50, 109)), carried])
    assert joined.looked is not None and joined.looked.sum() == 50
    order = np.r_[50:109, 0:50]
    assert expected(joined) == every.take(order).to_list()
    shuffled = np.random.default_rng(1).permutation(109)
    assert expected(joined.take(shuffled)) == every.take(order[shuffled]).to_list()
    with pytest.raises(ValueError, match="50 recorded hashes for 109 rows"):
        rows.with_recorded(every.take(np.arange(50)))


def test_unchecked_reads_load_no_hash_list_kept_or_taken(
    fragments_table, keep_at_once, monkeypatch
):
    """Kept rows get their recorded hashes when a checked read first meets them, not when they
    are kept: unchecked reads open no data file's hash list, and the first checked read loads
    each of its fragments' lists once."""
    loads = []
    real_load = checksums.load_checksums
    monkeypatch.setattr(checksums, "_LOADED", SharedCache(1 << 30, lambda _: 1))
    monkeypatch.setattr(
        checksums, "load_checksums", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k)
    )
    table = open_table(fragments_table)
    for draw in draws(109, seed=9):
        taken = table.take(draw, columns=["b"], blobs="bytes", check_hashes=False)
        assert taken.column("b").to_pylist() == stock_bytes(fragments_table, "b", draw)
    assert table.snapshot._kept[("b",)].held() == [0, 1, 2] and loads == []
    assert table.read_blobs("b", [0, 50, 100]) == stock_bytes(fragments_table, "b", [0, 50, 100])
    assert len(loads) == len(set(loads)) == 3  # each fragment's data file, once
    table.read_blobs("b", list(range(109)))
    assert len(loads) == 3
