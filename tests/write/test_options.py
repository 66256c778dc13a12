"""Misspelled options are errors naming the option and the closest valid one, in Python, in
the Spark data source (read and write) and in every blobhouse.spark function; nothing is
written."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import InvalidInputError, UnknownOptionError


def rows() -> pa.Table:
    return pa.table({"id": [1, 2], "image": blob_array([b"x" * 10, b"x" * 10])})


def test_a_misspelled_keyword_of_write_table_names_the_closest_option(table_uri):
    with pytest.raises(UnknownOptionError, match=r"'dedupe' \(did you mean 'dedup'\?\)"):
        write_table(rows(), table_uri, dedupe="off")
    assert not os.path.exists(table_uri)


def test_misspelled_keywords_of_table_methods_are_refused(table_uri):
    table = write_table(rows(), table_uri)
    with pytest.raises(UnknownOptionError, match="did you mean 'retain_versions'"):
        table.gc(retain_version=1)
    with pytest.raises(UnknownOptionError, match="did you mean 'target_rows'"):
        table.compact(target_row=10)
    with pytest.raises(UnknownOptionError, match="did you mean 'version'"):
        open_table(table_uri, verison=1)
    assert isinstance(UnknownOptionError("x"), TypeError | InvalidInputError)


def test_a_misspelled_spark_write_option_is_refused_and_nothing_is_written(spark, table_uri):
    bs.register(spark)
    df = spark.createDataFrame([(1, b"x")], "id long, image binary")
    with pytest.raises(Exception, match=r"'blob_column' \(did you mean 'blob_columns'\?\)"):
        df.write.format("blobhouse").mode("append").option("blob_column", "image").save(table_uri)
    assert not os.path.exists(os.path.join(table_uri, "_versions"))
    with pytest.raises(UnknownOptionError, match="did you mean 'dedup'"):
        bs.write_table(df, table_uri, blob_columns=["image"], options={"dedupe": "off"})
    with pytest.raises(UnknownOptionError, match="did you mean 'blob_columns'"):
        bs.write_table(df, table_uri, blob_column=["image"])
    assert not os.path.exists(os.path.join(table_uri, "_versions"))


def test_a_misspelled_spark_read_option_is_refused(spark, table_uri):
    bs.register(spark)
    write_table(rows(), table_uri)
    with pytest.raises(Exception, match=r"'verison' \(did you mean 'version'\?\)"):
        spark.read.format("blobhouse").option("verison", "1").load(table_uri).collect()
    assert spark.read.format("blobhouse").option("version", "1").load(table_uri).count() == 2


def test_a_blobhouse_error_inside_spark_reaches_the_caller_as_itself(spark, table_uri):
    df = spark.createDataFrame([(1, b"x")], "id long, image binary")
    with pytest.raises(InvalidInputError, match=r"dedup must be one of .*got 'nope'") as raised:
        bs.write_table(df, table_uri, blob_columns=["image"], options={"dedup": "nope"})
    assert str(raised.value).startswith("dedup must be one of")  # the first line is ours
    with pytest.raises(UnknownOptionError, match="did you mean 'deep'"):
        bs.verify(spark, table_uri, dep=True)
