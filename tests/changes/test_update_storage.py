"""What an update leaves in storage over time: repeated updates keep one copy of the column,
row ids and Lance's per-row version metadata stay right on a stable-row-id table, and a column's
own compression choice is kept by the files an update writes."""

from __future__ import annotations

import os
from datetime import timedelta

import lance
import lancedb
import pyarrow as pa
import pytest
from lance.blob import blob_array as lance_blob_array
from lance.blob import blob_field as lance_blob_field

from blobhouse import blob_array, open_table, write_table
from tests.helpers import disk_bytes

ROWS = 4_000
PER_FILE = 1_000


def gc_old(table) -> None:
    table.gc(retain_versions=1, grace=timedelta(0))


def random_labels(n: int) -> list[str]:
    # random hex: every update's column has the same size whatever it compresses to
    return [os.urandom(12).hex() for _ in range(n)]


def plain_and_blob_table(uri: str):
    return write_table(
        pa.table(
            {
                "id": pa.array(range(ROWS), pa.int64()),
                "label": random_labels(ROWS),
                "img": blob_array([os.urandom(2_000) for _ in range(ROWS)]),
            }
        ),
        uri,
        max_rows_per_file=PER_FILE,
        dedup="content",
    )


# ---------------------------------------------------------------------------------------------
# 1. repeated updates keep one copy of the column


def relabel(table, k: int) -> None:
    # new values of the same length every time (hex digits in upper, then lower case)
    table.update({"label": "upper(label)" if k % 2 == 0 else "lower(label)"})


def new_images(table, k: int) -> None:
    table.update({"img": lambda batch: [os.urandom(2_000) for _ in range(batch.num_rows)]})


@pytest.mark.parametrize("change", [relabel, new_images], ids=["plain", "blob"])
def test_repeated_updates_and_gc_keep_one_copy_of_the_column(tmp_path, change):
    """After N updates of one column and gc, the table holds the column's original copy
    (inside the original files, which hold the other columns too) and the newest one only:
    each update's file of the column is dropped from its fragment by the next update, so gc
    removes it. Bytes after 6 updates equal those after 1 within 5 % of what one update adds
    (one more copy would be +100 %; what differs otherwise is a few bytes of manifest)."""
    after = {}
    for updates in (1, 6):
        uri = str(tmp_path / f"t{updates}")
        table = plain_and_blob_table(uri)
        gc_old(table)
        before = disk_bytes(uri)
        for k in range(updates):
            change(table, k)
        gc_old(table)
        after[updates] = disk_bytes(uri) - before
        dataset = lance.dataset(uri)
        # each fragment: its original file and the newest file of the column, nothing more
        assert [len(f.metadata.files) for f in dataset.get_fragments()] == [2] * (ROWS // PER_FILE)
        stock = dataset.to_table(columns=["id", "label"])
        assert stock.num_rows == ROWS and stock["id"].to_pylist() == list(range(ROWS))
        assert table.to_arrow(columns=["label"])["label"].equals(stock["label"])
        if change is new_images:
            stored = table.read_blobs("img", list(range(ROWS)))
            assert [p for _, p in dataset.read_blobs("img", indices=list(range(ROWS)))] == stored
        assert table.verify(deep=True)["problems"] == []
    assert after[1] > 20_000  # the column's new copy: the tolerance below is 5 % of it
    assert abs(after[6] - after[1]) < 0.05 * after[1], after


def test_a_file_of_several_columns_stays_until_none_of_them_is_live(table_uri):
    table = write_table(
        pa.table({"id": pa.array(range(100), pa.int64()), "a": range(100), "b": range(100)}),
        table_uri,
        max_rows_per_file=50,
        dedup="content",
    )
    table.update({"a": "a + 1", "b": "b + 1"})
    table.update({"a": "a + 1"})  # the first file still provides b
    assert [len(f.metadata.files) for f in table.dataset.get_fragments()] == [3, 3]
    table.update({"b": "b + 1"})  # now it provides nothing: dropped
    assert [len(f.metadata.files) for f in table.dataset.get_fragments()] == [3, 3]
    data = lance.dataset(table_uri).to_table().to_pydict()
    assert data["a"] == [i + 2 for i in range(100)] and data["b"] == [i + 2 for i in range(100)]


# ---------------------------------------------------------------------------------------------
# 2. stable row ids

ROW_META = ["id", "_rowid", "_row_created_at_version", "_row_last_updated_at_version"]


def stable_row_id_table(uri: str):
    """A table created by pylance with stable row ids (blobhouse has no such option), with a
    blob column, then appended to by blobhouse and with a row deleted."""
    data = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "label": [f"l{i}" for i in range(6)],
            "img": lance_blob_array([b"x" * 1_000] * 6),
        }
    )
    data = data.cast(data.schema.set(2, lance_blob_field("img")))
    lance.write_dataset(data, uri, enable_stable_row_ids=True, max_rows_per_file=3)
    more = {"id": pa.array([6, 7, 8], pa.int64()), "label": ["l6", "l7", "l8"]}
    write_table(
        pa.table({**more, "img": blob_array([b"y" * 1_000] * 3)}),
        uri,
        mode="append",
        dedup="content",
    )
    table = open_table(uri)
    table.delete("id = 1")
    return table


def row_meta(uri: str) -> dict[int, dict]:
    rows = lance.dataset(uri).to_table(columns=ROW_META).to_pylist()
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize(
    "updates",
    [{"label": "upper(label)"}, {"img": lambda batch: [b"z" * 500] * batch.num_rows}],
    ids=["plain", "blob"],
)
def test_update_keeps_stable_row_ids_and_stamps_the_updated_rows(tmp_path, updates):
    uri = str(tmp_path / "t.lance")
    table = stable_row_id_table(uri)
    assert table.dataset.has_stable_row_ids
    before = row_meta(uri)
    report = table.update(updates, where="id % 2 = 0")
    after = row_meta(uri)
    assert after.keys() == before.keys() == {0, 2, 3, 4, 5, 6, 7, 8}
    for i, row in after.items():
        assert row["_rowid"] == before[i]["_rowid"]
        assert row["_row_created_at_version"] == before[i]["_row_created_at_version"]
        expected = report.version if i % 2 == 0 else before[i]["_row_last_updated_at_version"]
        assert row["_row_last_updated_at_version"] == expected, (i, row)
    if "label" in updates:
        labels = lance.dataset(uri).to_table(columns=["id", "label"], filter="id % 2 = 0")
        assert labels["label"].to_pylist() == ["L0", "L2", "L4", "L6", "L8"]
    else:
        images = table.to_arrow(columns=["id", "img"], blobs="bytes").to_pydict()
        expected_images = {0: b"z", 2: b"z", 3: b"x", 4: b"z", 5: b"x", 6: b"z", 7: b"y", 8: b"z"}
        got = dict(zip(images["id"], images["img"], strict=True))
        assert got == {i: c * (500 if c == b"z" else 1_000) for i, c in expected_images.items()}
    # rows found by their stable id after the update
    found = lance.dataset(uri).to_table(columns=["id"], filter=f"_rowid = {before[4]['_rowid']}")
    assert found["id"].to_pylist() == [4]
    assert table.verify()["problems"] == []


def test_merge_updating_columns_stamps_the_matched_rows(tmp_path):
    uri = str(tmp_path / "t.lance")
    table = stable_row_id_table(uri)
    before = row_meta(uri)
    source = pa.table({"id": pa.array([3, 6], pa.int64()), "label": ["m3", "m6"]})
    report = table.merge_insert("id").when_matched_update(["label"]).execute(source)
    after = row_meta(uri)
    for i, row in after.items():
        assert row["_rowid"] == before[i]["_rowid"]
        expected = report.version if i in (3, 6) else before[i]["_row_last_updated_at_version"]
        assert row["_row_last_updated_at_version"] == expected, (i, row)


def test_spark_update_stamps_the_updated_rows(spark, tmp_path):
    import blobhouse.spark as bs

    uri = str(tmp_path / "t.lance")
    stable_row_id_table(uri)
    before = row_meta(uri)
    report = bs.update(spark, uri, {"label": "upper(label)"}, where="id > 4")
    assert report.rows_updated == 4
    after = row_meta(uri)
    for i, row in after.items():
        assert row["_rowid"] == before[i]["_rowid"]
        expected = report.version if i > 4 else before[i]["_row_last_updated_at_version"]
        assert row["_row_last_updated_at_version"] == expected, (i, row)


def test_spark_merge_updating_columns_stamps_the_matched_rows(spark, tmp_path):
    import blobhouse.spark as bs

    uri = str(tmp_path / "t.lance")
    stable_row_id_table(uri)
    before = row_meta(uri)
    source = spark.createDataFrame([(3, "m3"), (6, "m6")], "id long, label string")
    report = bs.merge_insert(
        source, uri, on="id", when_matched_update=["label"], when_not_matched_insert_all=False
    )
    after = row_meta(uri)
    for i, row in after.items():
        assert row["_rowid"] == before[i]["_rowid"]
        expected = report.version if i in (3, 6) else before[i]["_row_last_updated_at_version"]
        assert row["_row_last_updated_at_version"] == expected, (i, row)


def metadata_bytes(uri: str) -> int:
    """Bytes of the table's manifests and transaction files."""
    return sum(disk_bytes(os.path.join(uri, d)) for d in ("_versions", "_transactions"))


def test_without_stable_row_ids_the_changed_rows_are_not_recorded(table_uri):
    """Lance uses the changed rows' offsets only on a table with stable row ids; elsewhere they
    would only bloat the transaction file and the version's manifest, which keeps a copy of
    it (2 x ~26 KB here)."""
    ids = pa.array(range(200_000), pa.int64())
    table = write_table(
        pa.table({"id": ids, "label": pa.nulls(200_000, pa.string())}), table_uri, dedup="content"
    )
    gc_old(table)
    before = metadata_bytes(table_uri)
    table.update({"label": "'x'"}, where="id % 7 = 0")
    gc_old(table)
    assert metadata_bytes(table_uri) - before < 5_000


# ---------------------------------------------------------------------------------------------
# 3. compression: Lance's per-field choice, kept by an update


def update_file_bytes(uri: str) -> int:
    data = os.path.join(uri, "data")
    return sum(
        os.path.getsize(os.path.join(data, n)) for n in os.listdir(data) if n.startswith("update-")
    )


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_update_writes_a_string_column_with_its_own_compression(tmp_path, compression):
    """Lance stores a page of strings under ~48 KB as it is (FSST above), so by default an
    update's file of 1,000 labels costs their Arrow bytes; a column created with Lance's
    ``lance-encoding:compression`` field metadata keeps it in the update's files, and every
    reader gets the same values."""
    metadata = {"lance-encoding:compression": compression} if compression else None
    labels = [f"label-{i:07d}" for i in range(ROWS)]
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("label", pa.string(), metadata=metadata)]
    )
    uri = str(tmp_path / "t.lance")
    table = write_table(
        pa.table({"id": range(ROWS), "label": labels}, schema=schema),
        uri,
        max_rows_per_file=PER_FILE,
        dedup="content",
    )
    table.update({"label": "upper(label)"})
    expected = pa.array([label.upper() for label in labels])
    written = update_file_bytes(uri)
    if compression:
        assert written < 0.4 * expected.nbytes
    else:
        assert written > expected.nbytes
    assert lance.dataset(uri).to_table(columns=["label"])["label"].combine_chunks().equals(expected)
    stock = lancedb.connect(str(tmp_path)).open_table("t").to_arrow()
    assert stock["label"].combine_chunks().equals(expected)
    assert table.to_arrow(columns=["label"])["label"].combine_chunks().equals(expected)
