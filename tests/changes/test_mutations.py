"""update and merge_insert: they cost what changed, keep blob sharing, and leave the table as it
was on bad input or failure."""

from __future__ import annotations

import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import InvalidInputError, SchemaError, blob_array, open_table, write_table
from blobhouse.changes import column_rewrite
from blobhouse.errors import ConcurrentCommitError, UnknownOptionError
from tests.helpers import disk_bytes, stock_read, tree, unreferenced_deletion_files

MODES = ["off", "content", "ref_id", "global"]
SHARED = [os.urandom(200_000) for _ in range(4)]  # packed, each shared by 25 rows


def frames(ids: range, label: str = "l") -> pa.Table:
    """Rows whose payloads repeat: row i carries SHARED[i // 25 % 4]."""
    payloads = [SHARED[i // 25 % 4] for i in ids]
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "chunk": pa.array([i // 25 % 4 + 1 for i in ids], pa.int64()),
            "label": [f"{label}{i}" for i in ids],
            "img": blob_array(payloads),
        }
    )


def make(uri: str, dedup: str, rows: int = 100):
    ref_ids = {"img": "chunk"} if dedup == "ref_id" else None
    return write_table(
        frames(range(rows)),
        uri,
        dedup=dedup,
        ref_id_columns=ref_ids,
        max_rows_per_file=25,
    )


def gc_old(table) -> None:
    table.gc(retain_versions=1, grace=timedelta(0))


def payloads(table) -> dict[int, bytes]:
    data = table.to_arrow(columns=["id", "img"], blobs="bytes")
    return dict(zip(data["id"].to_pylist(), data["img"].to_pylist(), strict=True))


@pytest.mark.parametrize("fraction", [0.1, 1.0])
@pytest.mark.parametrize("dedup", MODES)
def test_update_of_a_plain_column_rewrites_that_column_only(table_uri, dedup, fraction):
    table = make(table_uri, dedup)
    before = disk_bytes(table_uri)
    where = "id % 10 = 0" if fraction < 1 else None
    report = table.update({"label": "upper(label) || '!'"}, where=where)
    assert report.rows_updated == (10 if fraction < 1 else 100)
    assert table.version == report.version == report.read_version + 1  # the table moved
    labels = {r["id"]: r["label"] for r in table.to_arrow(columns=["id", "label"]).to_pylist()}
    for i in range(100):
        changed = fraction == 1.0 or i % 10 == 0
        assert labels[i] == (f"L{i}!" if changed else f"l{i}")
    assert payloads(table) == {i: SHARED[i // 25 % 4] for i in range(100)}
    gc_old(table)
    # the labels' new files are all that was added: no blob byte was copied
    assert disk_bytes(table_uri) - before < 20_000
    assert report.bytes_written < 20_000
    assert stock_read(table_uri, "img", 3) == [SHARED[0]] * 3
    assert table.verify(deep=True)["problems"] == []


def test_update_keeps_indices_right(table_uri):
    table = make(table_uri, "content")
    dataset = lance.dataset(table_uri)
    dataset.create_scalar_index("label", "BTREE")
    dataset.create_scalar_index("id", "BTREE")
    table.refresh().update({"label": "'relabelled'"}, where="id < 30")
    assert table.count_rows("label = 'relabelled'") == 30
    assert table.count_rows("label = 'l5'") == 0 and table.count_rows("label = 'l50'") == 1
    assert table.count_rows("id = 7") == 1


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_update_of_a_blob_column_goes_through_the_write_pipeline(table_uri, dedup):
    table = make(table_uri, dedup)
    fresh = os.urandom(150_000)
    report = table.update(
        {"img": lambda batch: [fresh] * batch.num_rows}, where="id >= 90", dedup=dedup
    )
    assert report.rows_updated == 10 and report.columns == ("img",)
    expected = {i: (fresh if i >= 90 else SHARED[i // 25 % 4]) for i in range(100)}
    assert payloads(table) == expected
    assert lance.dataset(table_uri).take_blobs("img", indices=[95])[0].read() == fresh
    stats = table.stats()
    # the new payload is stored once for its ten rows
    assert stats["physical_bytes"] <= stats["logical_bytes"]
    assert table.verify(deep=True)["problems"] == []
    table.update({"img": None}, where="id = 0")
    assert table.read_blobs("img", [0, 1]) == [None, SHARED[0]]


@pytest.mark.parametrize("dedup", ["content", "ref_id", "global"])
def test_rewrites_store_each_payload_of_a_file_once(table_uri, dedup):
    """An update or a merge rewrites a file's blob column: the rows it does not change keep
    sharing their payload, and a payload it sets on many rows is stored once. The rewrite
    carries no ref_id (a ref_id table stored a shared payload once per row: 12.7 -> 24 MB)."""
    table = make(table_uri, dedup)
    fresh = os.urandom(150_000)
    table.update({"img": fresh}, where="id < 10")
    upsert = frames(range(40, 60), label="m")
    table.merge_insert("id").when_matched_update_all().execute(upsert)
    table.update({"img": lambda b: [fresh] * b.num_rows}, where="id >= 90")
    gc_old(table)
    expected = {i: fresh if i < 10 or i >= 90 else SHARED[i // 25 % 4] for i in range(100)}
    assert payloads(table) == expected
    stored = table.stats()["physical_bytes"]
    # each payload once per data file that holds it: the new one in two files, and the
    # merge's updated rows (two payloads) in a new file of their own
    assert stored <= sum(map(len, SHARED)) + 2 * len(SHARED[0]) + 2 * len(fresh), stored
    assert table.verify(deep=True)["problems"] == []
    assert stock_read(table_uri, "img") == [expected[i] for i in ids_in_order(table)]


def test_an_update_reports_the_store_payloads_it_wrote(table_uri):
    """With dedup="global" a new payload goes to a store pack: bytes_written counts it."""
    table = make(table_uri, "global")
    fresh = os.urandom(150_000)
    report = table.update({"img": fresh}, where="id < 10", dedup="global")
    assert 150_000 <= report.bytes_written < 200_000


def test_update_of_a_blob_column_to_a_stored_payload_references_it_with_global(table_uri):
    table = make(table_uri, "global")
    gc_old(table)
    before = disk_bytes(table_uri)
    table.update({"img": lambda b: [SHARED[3]] * b.num_rows}, where="id < 25", dedup="global")
    assert payloads(table)[0] == SHARED[3]
    gc_old(table)
    assert disk_bytes(table_uri) - before < 50_000  # references, not the 200 kB payload


BAD_UPDATES = [
    (
        {"lable": "'x'"},
        None,
        InvalidInputError,
        r"unknown column 'lable' \(did you mean 'label'\?\)",
    ),
    ({"label": "'x'"}, "id >>> 3", InvalidInputError, r"where 'id >>> 3' is not valid SQL"),
    ({"label": "nosuch + 1"}, None, InvalidInputError, r"expression for column 'label'"),
    ({"id": "'not a number'"}, None, InvalidInputError, r"column 'id'.* do not fit"),
    ({"img": "X'00'"}, None, InvalidInputError, r"blob column 'img' is set by a function"),
    ({"label": 5}, None, InvalidInputError, r"column 'label': give a SQL expression"),
    ({"img": 5}, None, InvalidInputError, r"blob column 'img' is set by .* not int 5"),
    ({}, None, InvalidInputError, "non-empty mapping"),
]


def test_a_huge_bad_where_is_quoted_by_its_start(table_uri):
    """A generated condition of megabytes: the error shows its start, not all of it twice."""
    table = make(table_uri, "content")
    where = "id IN (" + ", ".join(map(str, range(200_000))) + ") AND id >>> 3"
    with pytest.raises(InvalidInputError, match=r"where 'id IN \(0, 1, 2.*not valid SQL") as raised:
        table.update({"label": "'x'"}, where=where)
    assert len(str(raised.value)) < 2_000


@pytest.mark.parametrize(("updates", "where", "error", "message"), BAD_UPDATES)
def test_bad_updates_are_refused_and_change_nothing(table_uri, updates, where, error, message):
    table = make(table_uri, "content")
    files, version = tree(table_uri), table.version
    with pytest.raises(error, match=message):
        table.update(updates, where=where)
    assert table.version == version and open_table(table_uri).version == version
    assert tree(table_uri) - files <= {p for p in tree(table_uri) if p.startswith("_leases/")}


def test_a_blob_column_is_set_to_bytes_stored_once(table_uri):
    """Bytes set every matching row to one payload (a placeholder image, say): stored once."""
    table = make(table_uri, "global")
    placeholder = os.urandom(300_000)
    before = disk_bytes(table_uri)
    report = table.update({"img": placeholder}, where="id >= 10")
    assert report.rows_updated == 90
    after = payloads(table)
    assert all((p == placeholder) == (i >= 10) for i, p in after.items())
    gc_old(table)
    assert disk_bytes(table_uri) - before < 2 * len(placeholder)


def test_a_big_value_is_never_quoted_whole_in_an_error(table_uri):
    """A refused value is named by its type and a short start (a 28 MB message once)."""
    table = make(table_uri, "content")
    for updates in ({"label": os.urandom(5_000_000)}, {"img": "X'00'" * 1_000_000}):
        with pytest.raises(InvalidInputError) as raised:
            table.update(updates)
        assert len(str(raised.value)) < 500


def test_a_failing_blob_function_leaves_nothing_behind(table_uri):
    table = make(table_uri, "content")
    files, version = tree(table_uri), table.version
    calls = []

    def fails_on_the_second_fragment(batch):
        calls.append(batch.num_rows)
        if len(calls) == 2:
            raise RuntimeError("decoder crashed")
        return [os.urandom(100_000) for _ in range(batch.num_rows)]

    with pytest.raises(RuntimeError, match="decoder crashed"):
        table.update({"img": fails_on_the_second_fragment})
    assert open_table(table_uri).version == version
    assert {p for p in tree(table_uri) - files if not p.startswith("_leases/")} == set()


def test_update_retries_after_a_concurrent_delete(table_uri, monkeypatch):
    table = make(table_uri, "content")
    original = column_rewrite.rewrite_fragment
    raced = []

    def then_someone_deletes(t, plan, fragment_id):
        out = original(t, plan, fragment_id)
        if not raced:
            raced.append(fragment_id)
            lance.dataset(table_uri).delete("id = 3")
        return out

    monkeypatch.setattr(column_rewrite, "rewrite_fragment", then_someone_deletes)
    report = table.update({"label": "'x'"}, where="id < 5")
    assert report.attempts == 2 and report.rows_updated == 4  # planned again without id 3
    assert table.count_rows("label = 'x'") == 4 and table.count_rows() == 99


@pytest.mark.parametrize("dedup", MODES)
def test_upsert_updates_matched_rows_inserts_new_ones_in_one_commit(table_uri, dedup):
    table = make(table_uri, dedup)
    version = table.version
    new = os.urandom(120_000)
    upsert = frames(range(90, 110), label="u")
    upsert = upsert.set_column(
        3, "img", blob_array([new if i >= 100 else SHARED[0] for i in range(90, 110)])
    )
    options = {"ref_id_columns": {"img": "chunk"}} if dedup == "ref_id" else {}
    report = (
        table.merge_insert("id", dedup=dedup, **options)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (10, 10)
    assert table.version == version + 1 == report.version
    rows = {r["id"]: r["label"] for r in table.to_arrow(columns=["id", "label"]).to_pylist()}
    assert len(rows) == 110 and rows[95] == "u95" and rows[105] == "u105" and rows[5] == "l5"
    got = payloads(table)
    assert got[95] == SHARED[0] and got[105] == new and got[5] == SHARED[0]
    assert table.verify(deep=True)["problems"] == []
    assert stock_read(table_uri, "img")[:1] == [
        got[table.to_arrow(columns=["id"])["id"][0].as_py()]
    ]


def test_upsert_on_a_global_table_stores_only_new_payloads(table_uri):
    table = make(table_uri, "global")
    gc_old(table)
    before = disk_bytes(table_uri)
    fresh = [os.urandom(150_000) for _ in range(2)]
    ids = list(range(80, 100)) + list(range(100, 110))
    upsert = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "chunk": pa.array([1] * len(ids), pa.int64()),
            "label": ["u"] * len(ids),
            # matched rows carry payloads the table stores; new rows two new ones, repeated
            "img": blob_array([SHARED[i % 4] if i < 100 else fresh[i % 2] for i in ids]),
        }
    )
    report = (
        table.merge_insert("id", dedup="global")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (20, 10)
    gc_old(table)
    grown = disk_bytes(table_uri) - before
    assert grown <= 1.05 * sum(map(len, fresh)), grown
    assert payloads(table)[105] == fresh[1]


def test_merge_with_partial_update_and_delete_by_source(table_uri):
    table = make(table_uri, "content")
    before = disk_bytes(table_uri)
    source = pa.table({"id": pa.array([1, 2, 60], pa.int64()), "label": ["one", "two", "sixty"]})
    report = (
        table.merge_insert("id")
        .when_matched_update(["label"])
        .when_not_matched_by_source_delete("id >= 90")
        .execute(source)
    )
    assert (report.num_updated_rows, report.num_deleted_rows) == (3, 10)
    assert table.count_rows() == 90
    rows = {r["id"]: r["label"] for r in table.to_arrow(columns=["id", "label"]).to_pylist()}
    assert rows[1] == "one" and rows[60] == "sixty" and rows[3] == "l3" and 95 not in rows
    assert payloads(table)[60] == SHARED[2]
    assert disk_bytes(table_uri) - before < 30_000  # labels and deletion files only


BAD_MERGES = [
    (lambda t: t.merge_insert("idd"), None, r"unknown key column 'idd' \(did you mean 'id'\?\)"),
    (lambda t: t.merge_insert("img"), None, "key column 'img' is a blob column"),
    (lambda t: t.merge_insert("id"), pa.table({"id": [1]}), "merge_insert does nothing"),
    (
        lambda t: t.merge_insert("id").when_not_matched_insert_all(),
        pa.table({"label": ["x"]}),
        r"the source lacks key column\(s\) \['id'\]",
    ),
    (
        lambda t: t.merge_insert("id").when_not_matched_insert_all(),
        pa.table({"id": [500, 500], "label": ["a", "b"], "chunk": [1, 1]}),
        r"key\(s\) more than once, e.g. \{'id': 500\}",
    ),
    (
        lambda t: t.merge_insert("id").when_not_matched_insert_all(),
        pa.table({"id": [500], "lable": ["a"]}),
        r"column\(s\) \['lable'\] the table lacks \(did you mean 'label'\?\)",
    ),
    (
        lambda t: t.merge_insert("id").when_matched_update(["nope"]),
        None,
        r"unknown column 'nope'",
    ),
]


@pytest.mark.parametrize(("build", "source", "message"), BAD_MERGES)
def test_bad_merges_are_refused_and_change_nothing(table_uri, build, source, message):
    table = make(table_uri, "content")
    files, version = tree(table_uri), table.version
    with pytest.raises((InvalidInputError, SchemaError), match=message):
        build(table).execute(source)
    assert open_table(table_uri).version == version
    assert {p for p in tree(table_uri) - files if not p.startswith("_leases/")} == set()


def test_mutations_keep_compaction_and_gc_sharing(table_uri):
    table = make(table_uri, "content")
    table.update({"label": "'x'"}, where="id < 50")
    upsert = frames(range(40, 60), label="m")
    table.merge_insert("id").when_matched_update_all().execute(upsert)
    expected = payloads(table)
    table.set_properties(max_rows_per_file=1000)  # compaction keeps to it: one file now
    table.compact(deleted_fraction=0.01)
    gc_old(table)
    assert payloads(table) == expected
    stats = table.stats()
    assert stats["physical_bytes"] == sum(map(len, SHARED))  # one copy of each again
    assert table.verify(deep=True)["problems"] == []
    assert stock_read(table_uri, "img", 5) == [expected[i] for i in ids_in_order(table)[:5]]


def ids_in_order(table) -> list[int]:
    return table.to_arrow(columns=["id"])["id"].to_pylist()


def test_merge_insert_refuses_a_misspelled_option(table_uri):
    table = make(table_uri, "content")
    with pytest.raises(UnknownOptionError, match=r"'dedupe' \(did you mean 'dedup'\?\)"):
        table.merge_insert("id", dedupe="global")


@pytest.mark.parametrize("retries", [0, 1])
def test_a_merge_a_concurrent_delete_preempts_leaves_no_file(table_uri, retries):
    table = make(table_uri, "content")
    version = table.version
    seen = {}

    def source():  # read by execute(), after the merge read its version
        lance.dataset(table_uri).delete("id = 3")  # fragment 0, whose rows the merge replaces
        seen["files"] = tree(table_uri)
        yield from frames(range(10), label="u").to_batches()

    merge = table.merge_insert("id").when_matched_update_all().conflict_retries(retries)
    if retries == 0:
        with pytest.raises(ConcurrentCommitError, match="preempted") as raised:
            merge.execute(source())
        assert raised.value.retryable is True
        assert open_table(table_uri).version == version + 1  # the delete only
        # nothing of the merge is left: no data file, deletion file or lease
        assert tree(table_uri) - seen["files"] == set()
    else:
        report = merge.execute(source())
        assert report.attempts == 2 and report.num_updated_rows == 9  # planned without id 3
        labels = {r["id"]: r["label"] for r in table.to_arrow(columns=["id", "label"]).to_pylist()}
        assert 3 not in labels and labels[4] == "u4" and labels[10] == "l10"
        assert unreferenced_deletion_files(table_uri) == set()  # the first attempt's are gone
    assert open_table(table_uri).count_rows() == 99


def test_a_merge_that_meets_an_incompatible_commit_leaves_no_file(table_uri):
    table = make(table_uri, "content")
    seen = {}

    def source():
        write_table(pa.table({"id": pa.array([500], pa.int64())}), table_uri, mode="overwrite")
        seen["files"] = tree(table_uri)
        yield from frames(range(20, 40), label="u").to_batches()

    merge = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    with pytest.raises(ConcurrentCommitError, match="incompatible"):
        merge.execute(source())
    assert open_table(table_uri).to_arrow()["id"].to_pylist() == [500]
    assert tree(table_uri) - seen["files"] == set()
