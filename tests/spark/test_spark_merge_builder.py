"""One merge builder whatever runs it: ``Table.merge_insert(...).when_*(...)`` runs locally with
``.execute(arrow_table)`` and on Spark with ``blobhouse.spark.merge_insert(df, builder)``, to
the same table; the Spark keywords are sugar building that builder, and its mistakes are the
same errors, raised before any Spark job."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import InvalidInputError, SchemaError, blob_array, open_table, write_table
from blobhouse.changes.merge_insert import MergeClauses
from blobhouse.options import CommitOptions
from tests.helpers import tree

PAYLOADS = [os.urandom(100_000) for _ in range(4)]
SOURCE = [(i, f"s{i}", PAYLOADS[i % 4]) for i in (5, 15, 25, 61, 62)]
SCHEMA = "id long, label string, img binary"

CLAUSES = {
    "update_all_insert": lambda m: m.when_matched_update_all().when_not_matched_insert_all(),
    "update_columns_insert": lambda m: m.when_matched_update(
        ["label"]
    ).when_not_matched_insert_all(),
    "update_all_delete": lambda m: m.when_matched_update_all().when_not_matched_by_source_delete(
        "id < 20"
    ),
    "insert_delete": lambda m: m.when_not_matched_insert_all().when_not_matched_by_source_delete(),
}


def make(uri: str):
    ids = list(range(40))
    return write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "label": [f"l{i}" for i in ids],
                "img": blob_array([PAYLOADS[i % 3] for i in ids]),
            }
        ),
        uri,
        max_rows_per_file=10,
    )


def source_arrow() -> pa.Table:
    ids, labels, imgs = zip(*SOURCE, strict=True)
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "label": list(labels), "img": blob_array(list(imgs))}
    )


def rows(uri: str) -> list[dict]:
    return sorted(open_table(uri).to_arrow(blobs="bytes").to_pylist(), key=lambda r: r["id"])


def counts(report) -> tuple:
    return (
        report.version - report.read_version,
        report.num_inserted_rows,
        report.num_updated_rows,
        report.num_deleted_rows,
        report.attempts,
    )


def stats(uri: str) -> dict:
    """The table's stats but what depends on how the rows were split into files."""
    found = open_table(uri).stats()
    kept = ("version", "rows", "deleted_rows", "logical_bytes", "physical_bytes", "dedup_ratio")
    kept += ("table_owned_bytes", "deleted_rows_bytes", "unresolved_references", "properties")
    out = {k: found[k] for k in kept}
    out["columns"] = {c: {**v} for c, v in found["columns"].items()}
    return out


@pytest.mark.parametrize("clauses", list(CLAUSES))
def test_a_builder_runs_on_spark_as_it_executes_locally(spark, tmp_path, clauses):
    local_uri, spark_uri = str(tmp_path / "local"), str(tmp_path / "spark")
    make(local_uri)
    table = make(spark_uri)
    local = CLAUSES[clauses](open_table(local_uri).merge_insert("id")).execute(source_arrow())
    builder = CLAUSES[clauses](table.merge_insert("id"))
    report = bs.merge_insert(spark.createDataFrame(SOURCE, SCHEMA), builder)
    assert counts(report) == counts(local)
    assert rows(spark_uri) == rows(local_uri)
    assert stats(spark_uri) == stats(local_uri)
    # the builder and the table that built it moved to the version committed, as execute does
    assert table.version == builder.table.version == report.version
    assert open_table(spark_uri).verify(deep=True)["problems"] == []


def test_the_keywords_build_the_same_builder(spark, tmp_path):
    flags_uri, builder_uri = str(tmp_path / "flags"), str(tmp_path / "builder")
    make(flags_uri)
    make(builder_uri)
    df = spark.createDataFrame(SOURCE, SCHEMA)
    by_flags = bs.merge_insert(
        df,
        flags_uri,
        on="id",
        when_matched_update=["label"],
        when_not_matched_by_source_delete="id >= 30",
        dedup="global",
        commit=CommitOptions(retries=2),
    )
    builder = (
        open_table(builder_uri)
        .merge_insert("id", dedup="global")
        .when_matched_update(["label"])
        .when_not_matched_insert_all()  # the keywords' default
        .when_not_matched_by_source_delete("id >= 30")
        .commit(CommitOptions(retries=2))
    )
    assert builder.clauses == MergeClauses(
        update_columns=("label",), insert=True, delete="id >= 30"
    )
    by_builder = bs.merge_insert(df, builder)
    assert counts(by_flags) == counts(by_builder) == (1, 2, 3, 10, 1)
    assert rows(flags_uri) == rows(builder_uri)
    assert stats(flags_uri) == stats(builder_uri)


def test_a_builder_with_keywords_is_refused_naming_both(spark, table_uri):
    table = make(table_uri)
    files, version = tree(table_uri), table.version
    df = spark.createDataFrame(SOURCE, SCHEMA)
    builder = table.merge_insert("id").when_matched_update_all()
    for keywords in ({"on": "id"}, {"when_not_matched_insert_all": False}, {"dedup": "global"}):
        with pytest.raises(InvalidInputError) as refused:
            bs.merge_insert(df, builder, **keywords)
        message = str(refused.value)
        assert "MergeInsert builder" in message and next(iter(keywords)) in message
    with pytest.raises(InvalidInputError, match="a table's uri or a MergeInsert builder"):
        bs.merge_insert(df, 42, on="id")
    with pytest.raises(TypeError, match="'on'"):
        bs.merge_insert(df, table_uri)
    assert open_table(table_uri).version == version and tree(table_uri) == files


def jobs_run(spark, group: str, action, *args) -> list[int]:
    """The ids of the Spark jobs ``action(*args)`` ran (in a job group of its own)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, "counted")
    try:
        action(*args)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return list(sc.statusTracker().getJobIdsForGroup(group))


def test_a_builder_is_refused_on_spark_as_locally_before_any_job(spark, table_uri):
    from pyspark.sql import functions as F

    table = make(table_uri)
    files, version = tree(table_uri), table.version
    df = spark.createDataFrame(SOURCE, SCHEMA)
    arrow = source_arrow()
    cases = [
        (lambda m: m, arrow, df, InvalidInputError, "merge_insert does nothing"),
        (
            lambda m: m.when_matched_update_all(),
            arrow.append_column("extra", pa.array([1] * 5, pa.int64())),
            df.withColumn("extra", F.lit(1).cast("long")),
            SchemaError,
            r"the source has column\(s\) \['extra'\] the table lacks",
        ),
        (
            lambda m: m.when_matched_update_all(),
            arrow.drop_columns(["id"]),
            df.drop("id"),
            InvalidInputError,
            "the source lacks key column",
        ),
    ]
    for n, (clauses, data, frame, error, message) in enumerate(cases):
        with pytest.raises(error, match=message) as locally:
            clauses(open_table(table_uri).merge_insert("id")).execute(data)
        builder = clauses(open_table(table_uri).merge_insert("id"))
        with pytest.raises(error, match=message) as on_spark:
            jobs_run(spark, f"refused-{n}", bs.merge_insert, frame, builder)
        assert str(on_spark.value) == str(locally.value)
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(f"refused-{n}") == []
    # the builder's own checks, made as it is built: the same whichever runs it
    builder = open_table(table_uri).merge_insert("id")
    with pytest.raises(InvalidInputError, match=r"unknown column 'lable' \(did you mean"):
        builder.when_matched_update(["lable"])
    with pytest.raises(InvalidInputError, match="'id' is a key column"):
        builder.when_matched_update(["id"])
    assert builder.clauses == MergeClauses()  # a refused clause leaves it as it was
    assert open_table(table_uri).version == version and tree(table_uri) == files
    # the count above sees jobs: a merge that runs does start some
    merge = open_table(table_uri).merge_insert("id").when_matched_update_all()
    assert jobs_run(spark, "runs", bs.merge_insert, df, merge)
