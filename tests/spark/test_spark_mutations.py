"""update and merge_insert on Spark: the same results as in Python, tasks doing the work, one
commit, and nothing left behind on failure."""

from __future__ import annotations

import os
from datetime import timedelta

import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import InvalidInputError, blob_array, open_table, write_table
from blobhouse.errors import ConcurrentCommitError
from tests.helpers import disk_bytes, stock_read, tree, unreferenced_deletion_files

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


@pytest.mark.parametrize("dedup", ["content", "global", "off"])
def test_spark_update_rewrites_the_changed_column_in_tasks(spark, table_uri, dedup):
    make(table_uri, dedup)
    before = disk_bytes(table_uri)
    report = bs.update(spark, table_uri, {"label": "upper(label)"}, where="id >= 40")
    assert (report.rows_updated, report.fragments_rewritten) == (20, 1)
    got = rows(table_uri)
    assert got[45] == ("L45", SHARED[2]) and got[5] == ("l5", SHARED[0])
    open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert disk_bytes(table_uri) - before < 10_000
    fresh = os.urandom(90_000)
    bs.update(
        spark,
        table_uri,
        {"img": lambda batch: [fresh] * batch.num_rows},
        where="id < 3",
        dedup=dedup,
    )
    assert [rows(table_uri)[i][1] for i in (0, 2, 3)] == [fresh, fresh, SHARED[0]]
    if dedup != "off":  # the three rows share one copy, the rest keep sharing theirs
        physical = open_table(table_uri).stats()["columns"]["img"]["physical_bytes"]
        assert physical == sum(map(len, SHARED)) + len(fresh)
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


@pytest.mark.parametrize("dedup", ["content", "global", "off"])
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


def test_a_small_merge_runs_a_few_tasks_not_the_shuffle_partitions(spark, table_uri):
    """The source joined with the table's keys is cached, and AQE does not coalesce a cached
    plan: a merge of 2 rows into a 3-fragment table ran its join in 3 x 200 tasks (690 in all,
    6-16 s on local[2]); now in as many as the larger side has partitions."""
    make(table_uri, "global")
    source = spark.createDataFrame(
        [(5, "u5", SHARED[1]), (500, "u500", b"new")], "id long, label string, img binary"
    )
    context = spark.sparkContext
    context.setJobGroup("small-merge", "a merge of 2 rows")
    spark.conf.set("spark.sql.shuffle.partitions", "200")  # Spark's default (the fixture's: 4)
    try:
        report = bs.merge_insert(source, table_uri, on="id")
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert (report.num_updated_rows, report.num_inserted_rows) == (1, 1)
    tracker = context.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup("small-merge")
        for stage in tracker.getJobInfo(job).stageIds
    ]
    assert stages and max(s.numTasks for s in stages if s) < 50, [s.numTasks for s in stages if s]


def test_spark_merge_insert_by_ref_id_stores_a_ref_id_once(spark, table_uri):
    """dedup="ref_id": the new rows carrying one ref_id share one stored payload."""
    data = pa.table({"id": [1, 2], "ref": [1, 2], "img": [SHARED[0], SHARED[1]]})
    write_table(
        data, table_uri, blob_columns=["img"], dedup="ref_id", ref_id_columns={"img": "ref"}
    )
    fresh = os.urandom(300_000)
    source = spark.createDataFrame(
        [(2, 2, SHARED[1]), (3, 9, fresh), (4, 9, fresh), (5, 9, fresh)],
        "id long, ref long, img binary",
    ).coalesce(1)
    report = bs.merge_insert(
        source, table_uri, on="id", dedup="ref_id", ref_id_columns={"img": "ref"}
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (1, 3)
    table = open_table(table_uri)
    got = {
        r["id"]: r["img"] for r in table.to_arrow(columns=["id", "img"], blobs="bytes").to_pylist()
    }
    assert got == {1: SHARED[0], 2: SHARED[1], 3: fresh, 4: fresh, 5: fresh}
    physical = table.stats()["columns"]["img"]["physical_bytes"]
    # the live rows' payloads, each stored once (the replaced row's old copy is not live)
    assert physical == len(SHARED[0]) + len(SHARED[1]) + len(fresh)


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
    with pytest.raises(InvalidInputError, match="on takes a column name or a list"):
        bs.merge_insert(twice, table_uri, on=5)
    with pytest.raises(InvalidInputError, match="needs a Spark DataFrame"):
        bs.merge_insert([(7, "a", b"x")], table_uri, on="id")
    assert open_table(table_uri).version == version and tree(table_uri) == files


def fragments_files(uri: str) -> dict[int, list[str]]:
    """fragment id -> the paths of its data files (which file provides which column)."""
    dataset = open_table(uri).dataset
    return {f.fragment_id: [d.path for d in f.metadata.files] for f in dataset.get_fragments()}


def test_spark_merge_updates_only_the_named_columns(spark, table_uri):
    make(table_uri)
    before_files = fragments_files(table_uri)
    other = os.urandom(100_000)  # the source's img of a matched row: not applied
    source = spark.createDataFrame(
        [(5, "five", other), (45, "forty-five", other), (70, "seventy", other)],
        "id long, label string, img binary",
    )
    report = bs.merge_insert(source, table_uri, on="id", when_matched_update=["label"])
    assert (report.num_updated_rows, report.num_inserted_rows) == (2, 1)
    got = rows(table_uri)
    assert got[5] == ("five", SHARED[0]) and got[45] == ("forty-five", SHARED[2])
    assert got[70] == ("seventy", other) and got[6] == ("l6", SHARED[0]) and len(got) == 61
    # a column rewrite: the touched fragments keep their files (img included) plus one small
    # file of labels; no blob byte was written for them
    after_files = fragments_files(table_uri)
    for fragment_id in (0, 2):
        assert (
            after_files[fragment_id][: len(before_files[fragment_id])]
            == (before_files[fragment_id])
        )
        assert len(after_files[fragment_id]) == len(before_files[fragment_id]) + 1
    assert after_files[1] == before_files[1]
    assert report.bytes_written < 20_000 + len(other)  # labels, and the inserted row's payload
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    fresh = os.urandom(90_000)
    blobs = spark.createDataFrame([(25, fresh)], "id long, img binary")
    report = bs.merge_insert(
        blobs,
        table_uri,
        on="id",
        when_matched_update=["img"],
        when_not_matched_insert_all=False,
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (1, 0)
    got = rows(table_uri)
    assert got[25] == ("l25", fresh) and got[26] == ("l26", SHARED[1]) and len(got) == 61
    assert stock_read(table_uri, "img").count(fresh) == 1


def test_spark_merge_refuses_bad_column_updates(spark, table_uri):
    make(table_uri)
    files, version = tree(table_uri), open_table(table_uri).version
    source = spark.createDataFrame([(5, "five")], "id long, label string")
    bad = [
        ({"when_matched_update": ["lable"]}, r"unknown column 'lable' \(did you mean 'label'\?\)"),
        ({"when_matched_update": ["id"]}, "'id' is a key column"),
        ({"when_matched_update": []}, "at least one column"),
        (
            {"when_matched_update": ["label"], "when_matched_update_all": True},
            "when_matched_update_all and when_matched_update",
        ),
        (
            {"when_matched_update_all": False, "when_not_matched_insert_all": False},
            "merge_insert does nothing",
        ),
    ]
    for keywords, message in bad:
        with pytest.raises(InvalidInputError, match=message):
            bs.merge_insert(source, table_uri, on="id", **keywords)
    assert open_table(table_uri).version == version and tree(table_uri) == files


def once(flag: str, action):
    """A Spark UDF passing its value through that runs ``action()`` the first time any task
    evaluates it (``flag``: a file, so that it runs once across Python workers)."""
    from pyspark.sql import functions as F

    def passthrough(value):
        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return value
        action()
        return value

    return F.udf(passthrough, "string")


def racing_source(spark, flag: str, action, ids, label: str = "u"):
    """A source whose evaluation commits ``action`` to the table: a concurrent writer that
    commits while the merge runs, after it read the table's version."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(
        [(i, f"{label}{i}", SHARED[1]) for i in ids], "id long, label string, img binary"
    )
    return frame.withColumn("label", once(flag, action)(F.col("label")))


def listing_after(action, path: str, listing: str):
    """``action``, then the table folder's listing written to ``listing`` (one path a line)."""

    def run():
        action()
        found = [
            os.path.relpath(os.path.join(root, name), path)
            for root, _, names in os.walk(path)
            for name in names
        ]
        with open(listing, "w") as out:
            out.write("\n".join(found))

    return run


def test_spark_merge_retries_after_a_concurrent_delete(spark, table_uri, tmp_path):
    make(table_uri)
    version = open_table(table_uri).version

    def delete_three():
        open_table(table_uri).delete("id = 3")  # fragment 0, which the merge also changes

    source = racing_source(spark, str(tmp_path / "flag"), delete_three, [1, 2, 70])
    report = bs.merge_insert(source, table_uri, on="id", conflict_retries=1)
    assert report.attempts == 2 and report.read_version == version + 1
    assert (report.num_updated_rows, report.num_inserted_rows) == (2, 1)
    got = rows(table_uri)
    assert 3 not in got and len(got) == 60
    assert got[1] == ("u1", SHARED[1]) and got[70] == ("u70", SHARED[1]) and got[4][0] == "l4"
    assert unreferenced_deletion_files(table_uri) == set()  # the first attempt's are gone
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_spark_merge_updates_keys_another_merge_inserted_meanwhile(spark, table_uri, tmp_path):
    make(table_uri)
    version = open_table(table_uri).version
    new = list(range(70, 80))

    def insert_them():  # a concurrent merge inserting the same new keys commits first
        data = pa.table(
            {
                "id": pa.array(new, pa.int64()),
                "label": [f"p{i}" for i in new],
                "img": blob_array([SHARED[0]] * len(new)),
            }
        )
        open_table(table_uri).merge_insert("id").when_not_matched_insert_all().execute(data)

    source = racing_source(spark, str(tmp_path / "flag"), insert_them, [1, *new])
    report = bs.merge_insert(source, table_uri, on="id")
    # planned again on the other merge's version: its rows are updates, each key stays once
    assert report.attempts == 2 and report.read_version == version + 1
    assert (report.num_updated_rows, report.num_inserted_rows) == (11, 0)
    ids = open_table(table_uri).to_arrow(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == [*range(60), *new]
    got = rows(table_uri)
    assert all(got[i] == (f"u{i}", SHARED[1]) for i in [1, *new])
    assert unreferenced_deletion_files(table_uri) == set()


def test_spark_merge_that_meets_an_incompatible_commit_leaves_nothing(spark, table_uri, tmp_path):
    make(table_uri)
    version = open_table(table_uri).version
    listing = str(tmp_path / "listing")

    def overwrite():
        write_table(pa.table({"id": pa.array([100], pa.int64())}), table_uri, mode="overwrite")

    action = listing_after(overwrite, table_uri, listing)
    source = racing_source(spark, str(tmp_path / "flag"), action, [1, 2, 25, 70])
    with pytest.raises(ConcurrentCommitError, match="incompatible") as raised:
        bs.merge_insert(source, table_uri, on="id")
    assert raised.value.retryable is False
    # the overwrite stands, and the merge left no file: data files, deletion files, lease
    assert open_table(table_uri).version == version + 1
    assert open_table(table_uri).to_arrow()["id"].to_pylist() == [100]
    with open(listing) as found:
        after_overwrite = set(found.read().split("\n"))
    assert tree(table_uri) - after_overwrite == set()


def test_spark_merge_evaluates_a_nondeterministic_source_once(spark, table_uri):
    import random

    from pyspark.sql import functions as F

    make(table_uri)
    coin = F.udf(lambda _: random.random() < 0.5, "boolean").asNondeterministic()
    source = (
        spark.createDataFrame(
            [(i, f"u{i}", SHARED[2]) for i in range(20, 100)], "id long, label string, img binary"
        )
        .repartition(3)
        .where(coin(F.col("id")))
    )
    report = bs.merge_insert(source, table_uri, on="id")
    got = rows(table_uri)
    updated = {i for i, (label, _) in got.items() if label.startswith("u")}
    # every row the merge matched was replaced by the source's row, none lost or doubled
    assert set(range(60)) <= set(got)
    assert len(got) == 60 + report.num_inserted_rows == open_table(table_uri).count_rows()
    assert len(updated) == report.num_updated_rows + report.num_inserted_rows
    assert all(got[i] == (f"u{i}", SHARED[2]) for i in updated)
    assert not source.is_cached  # the merge's copy of the source is released
