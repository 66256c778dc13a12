"""update and merge_insert on Spark: the same results as in Python, tasks doing the work, one
commit, and nothing left behind on failure."""

from __future__ import annotations

import os
from datetime import timedelta

import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import InvalidInputError, blob_array, open_table, write_table
from tests.helpers import disk_bytes, stock_read, tree

SHARED = [os.urandom(150_000) for _ in range(3)]


def make(uri: str, dedup: str = "content"):
    ids = list(range(60))
    return write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "label": [f"l{i}" for i in ids],
                "img": blob_array([SHARED[i // 20] for i in ids]),
            }
        ),
        uri,
        dedup=dedup,
        max_rows_per_file=20,
    )


def rows(uri: str) -> dict[int, tuple[str, bytes]]:
    data = open_table(uri).to_arrow(blobs="bytes").to_pylist()
    return {r["id"]: (r["label"], r["img"]) for r in data}


def test_spark_update_rewrites_the_changed_column_in_tasks(spark, table_uri):
    make(table_uri)
    before = disk_bytes(table_uri)
    report = bs.update(spark, table_uri, {"label": "upper(label)"}, where="id >= 40")
    assert (report.rows_updated, report.fragments_rewritten) == (20, 1)
    got = rows(table_uri)
    assert got[45] == ("L45", SHARED[2]) and got[5] == ("l5", SHARED[0])
    open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert disk_bytes(table_uri) - before < 10_000
    fresh = os.urandom(90_000)
    bs.update(spark, table_uri, {"img": lambda batch: [fresh] * batch.num_rows}, where="id < 3")
    assert [rows(table_uri)[i][1] for i in (0, 2, 3)] == [fresh, fresh, SHARED[0]]
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_spark_update_whose_task_fails_changes_nothing(spark, table_uri):
    make(table_uri)
    files, version = tree(table_uri), open_table(table_uri).version

    def broken(batch):
        raise RuntimeError("no decoder for this frame")

    with pytest.raises(Exception, match="no decoder for this frame"):
        bs.update(spark, table_uri, {"img": broken}, where="id = 30")
    assert open_table(table_uri).version == version
    left = {p for p in tree(table_uri) - files if not p.startswith("_leases/")}
    assert {p for p in left if not p.startswith("data/aborted-")} == set()


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_spark_merge_insert_upserts_in_one_commit(spark, table_uri, dedup):
    table = make(table_uri, dedup)
    table.gc(retain_versions=1, grace=timedelta(0))
    before, version = disk_bytes(table_uri), table.version
    fresh = os.urandom(400_000)  # fixed costs (manifests, small data files) stay inside 5%
    source = spark.createDataFrame(
        [(i, f"u{i}", SHARED[1] if i < 60 else fresh) for i in range(50, 70)],
        "id long, label string, img binary",
    ).repartition(3)
    report = bs.merge_insert(source, table_uri, on="id", dedup=dedup)
    assert (report.num_updated_rows, report.num_inserted_rows) == (10, 10)
    assert open_table(table_uri).version == version + 1 == report.version
    got = rows(table_uri)
    assert len(got) == 70 and got[55] == ("u55", SHARED[1]) and got[65] == ("u65", fresh)
    assert got[10] == ("l10", SHARED[0])
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    if dedup == "global":
        open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
        assert disk_bytes(table_uri) - before <= 1.05 * len(fresh)
        assert stock_read(table_uri, "img").count(fresh) == 10


def test_spark_merge_insert_deletes_what_the_source_lacks(spark, table_uri):
    make(table_uri)
    source = spark.createDataFrame([(1, "one", SHARED[0])], "id long, label string, img binary")
    report = bs.merge_insert(
        source,
        table_uri,
        on="id",
        when_not_matched_insert_all=False,
        when_not_matched_by_source_delete="id >= 50",
    )
    assert (report.num_updated_rows, report.num_deleted_rows) == (1, 10)
    got = rows(table_uri)
    assert len(got) == 50 and got[1][0] == "one" and 55 not in got


def test_spark_merge_insert_refuses_duplicate_keys_and_unknown_columns(spark, table_uri):
    make(table_uri)
    files, version = tree(table_uri), open_table(table_uri).version
    twice = spark.createDataFrame(
        [(7, "a", b"x"), (7, "b", b"y")], "id long, label string, img binary"
    )
    with pytest.raises(InvalidInputError, match=r"more than once, e\.g\. \{'id': 7\}"):
        bs.merge_insert(twice, table_uri, on="id")
    odd = spark.createDataFrame([(7, "a")], "id long, lable string")
    with pytest.raises(Exception, match="did you mean 'label'"):
        bs.merge_insert(odd, table_uri, on="id")
    with pytest.raises(InvalidInputError, match="unknown key column 'idd'"):
        bs.merge_insert(twice, table_uri, on="idd")
    assert open_table(table_uri).version == version and tree(table_uri) == files
