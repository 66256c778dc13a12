"""The Spark entries take the option objects too: ``targets``/``commit`` for compact and
update, ``commit`` for merge_insert (``conflict_retries`` its sugar)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import (
    CommitOptions,
    CompactionTargets,
    InvalidInputError,
    blob_array,
    open_table,
    write_table,
)


def appended(uri: str) -> None:
    for i in range(3):
        rows = pa.table({"id": [i], "label": ["a"], "img": blob_array([b"x" * 1000])})
        write_table(rows, uri, mode="append")


def test_spark_compact_takes_targets_or_their_keywords(spark, table_uri, tmp_path):
    appended(table_uri)
    report = bs.compact(spark, table_uri, CompactionTargets(target_rows=2), commit=CommitOptions(0))
    assert report["fragments_removed"] == 2  # groups of up to 2 rows
    other = str(tmp_path / "other")
    appended(other)
    assert bs.compact(spark, other, target_rows=2, retries=0)["fragments_removed"] == 2
    with pytest.raises(InvalidInputError, match=r"give targets .* \(target_rows\), not both"):
        bs.compact(spark, other, CompactionTargets(), target_rows=2)


def test_spark_merge_and_update_take_commit_options(spark, table_uri):
    appended(table_uri)
    df = spark.createDataFrame([(1, "b"), (7, "c")], "id long, label string")
    report = bs.merge_insert(
        df, table_uri, on="id", when_matched_update=["label"], commit=CommitOptions(retries=1)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (1, 1)
    with pytest.raises(InvalidInputError, match=r"give commit .* or conflict_retries, not both"):
        bs.merge_insert(df, table_uri, on="id", commit=CommitOptions(), conflict_retries=1)
    with pytest.raises(InvalidInputError, match="retries must be a whole number"):
        bs.merge_insert(df, table_uri, on="id", conflict_retries=-1)
    update = bs.update(spark, table_uri, {"label": "'z'"}, "id = 0", commit=CommitOptions(0))
    assert update.rows_updated == 1
    assert bs.update(spark, table_uri, {"label": "'y'"}, "id = 0", retries=0).rows_updated == 1
    assert open_table(table_uri).count_rows("label = 'y'") == 1
