"""Spark keeps the promise on its natural paths: ``df.write`` and SQL INSERT store each distinct
payload once across every task of the write and against what the table holds, use the table's
properties, and errors name the user's input."""

from __future__ import annotations

import json
import os
import re

import lance
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import blobhouse.spark as bs
from blobhouse import open_table, write_table
from blobhouse.errors import InvalidInputError, PathIsFileError, SchemaError
from blobhouse.spark.ingest import ingest
from tests.helpers import stock_read

pytestmark = pytest.mark.usefixtures("spark")

CHUNKS = [os.urandom(150_000 + 1000 * i) for i in range(8)]
CALIBRATION = [os.urandom(4_000 + i) for i in range(4)]
SCHEMA = "frame long, episode long, video binary, calib binary, thumb binary"
BLOB_COLUMNS = "video,calib,thumb"


def episodes(spark, first: int = 0, rows: int = 240, partitions: int = 6):
    """The issue's data: 30 Hz frames, a video chunk per 30 frames, a calibration file per 60,
    a thumbnail per frame, spread round-robin over ``partitions`` (each chunk in every task)."""
    data = [
        (
            f,
            f // 60,
            CHUNKS[(f // 30) % len(CHUNKS)],
            CALIBRATION[(f // 60) % len(CALIBRATION)],
            b"thumb-%06d" % f * 100,
        )
        for f in range(first, first + rows)
    ]
    return spark.createDataFrame(data, SCHEMA).repartition(partitions)


def unique_bytes(first: int, rows: int) -> int:
    frames = range(first, first + rows)
    chunks = {(f // 30) % len(CHUNKS) for f in frames}
    calibs = {(f // 60) % len(CALIBRATION) for f in frames}
    return (
        sum(len(CHUNKS[c]) for c in chunks)
        + sum(len(CALIBRATION[c]) for c in calibs)
        + sum(len(b"thumb-%06d" % f * 100) for f in frames)
    )


def physical(uri: str) -> int:
    return open_table(uri).stats()["physical_bytes"]


def test_natural_df_write_stores_each_payload_once_across_tasks(spark, table_uri):
    """The issue's case: 240 rows over 6 partitions stored 5.39x the unique bytes."""
    writer = episodes(spark).write.format("blobhouse").option("blob_columns", BLOB_COLUMNS)
    writer.mode("append").save(table_uri)
    assert physical(table_uri) <= 1.05 * unique_bytes(0, 240)
    # again, with frames overlapping what the table holds: stored against it too
    episodes(spark, first=120).write.format("blobhouse").mode("append").save(table_uri)
    assert physical(table_uri) <= 1.05 * unique_bytes(0, 360)
    table = open_table(table_uri)
    assert table.properties.dedup == "global" and table.count_rows() == 480
    got = table.to_arrow(columns=["frame", "video"], blobs="bytes").to_pylist()
    assert all(r["video"] == CHUNKS[(r["frame"] // 30) % len(CHUNKS)] for r in got)
    frames = table.to_arrow(columns=["frame"]).column("frame").to_pylist()
    expected = [CHUNKS[(f // 30) % len(CHUNKS)] for f in frames]
    assert stock_read(table_uri, "video") == expected  # stock pylance reads the same bytes
    assert table.verify(deep=True)["problems"] == []
    claims = os.path.join(table_uri, "_blobs", "claims")
    assert not os.path.isdir(claims) or not any(os.scandir(claims))  # removed at the commit


def test_sql_insert_stores_each_payload_once(spark, table_uri):
    episodes(spark, rows=60).write.format("blobhouse").option("blob_columns", BLOB_COLUMNS).mode(
        "append"
    ).save(table_uri)
    spark.sql(
        f"CREATE TABLE frames_sql USING blobhouse OPTIONS (path '{table_uri}', blobs 'bytes')"
    )
    try:
        episodes(spark, first=60, rows=180).createOrReplaceTempView("more_frames")
        spark.sql(f"INSERT INTO frames_sql WITH ('path' = '{table_uri}') SELECT * FROM more_frames")
    finally:
        spark.sql("DROP TABLE frames_sql")
    assert open_table(table_uri).count_rows() == 240
    assert physical(table_uri) <= 1.05 * unique_bytes(0, 240)


def test_spark_writes_use_and_keep_the_table_properties(spark, table_uri):
    first = episodes(spark, rows=60, partitions=2)
    first.write.format("blobhouse").mode("append").option("blob_columns", BLOB_COLUMNS).option(
        "dedup", '{"video": "ref_id"}'
    ).option("ref_id_columns", "video:episode").option("max_rows_per_file", "25").save(table_uri)
    properties = open_table(table_uri).properties
    assert properties.dedup_of("video") == "ref_id" and properties.dedup_of("thumb") == "global"
    assert properties.columns["video"].ref_id_column == "episode"
    assert properties.max_rows_per_file == 25
    version = open_table(table_uri).version
    with pytest.raises(Exception, match="dedup of column 'video': the table's is 'ref_id'"):
        first.write.format("blobhouse").mode("append").option("dedup", "content").save(table_uri)
    assert open_table(table_uri).version == version
    # bs.write_table and merge_insert leave the settings out: the table's
    bs.write_table(episodes(spark, first=60, rows=30), table_uri)
    report = bs.merge_insert(episodes(spark, first=90, rows=30), table_uri, on="frame")
    assert report.num_inserted_rows == 30
    table = open_table(table_uri)
    assert table.count_rows() == 120 and table.properties == properties
    assert max(f.count_rows() for f in table.dataset.get_fragments()) <= 25


def test_create_table_tblproperties_set_the_table_properties(spark, tmp_path):
    uri = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE props USING blobhouse OPTIONS (path '{uri}', columns 'id BIGINT, img "
        "BINARY', blob_columns 'img', blobs 'bytes') TBLPROPERTIES (dedup 'content')"
    )
    try:
        assert open_table(uri).properties.dedup == "content"
        spark.sql(f"INSERT INTO props WITH ('path' = '{uri}') VALUES (1, X'0102'), (2, X'0102')")
    finally:
        spark.sql("DROP TABLE props")
    assert open_table(uri).read_blobs("img", [0, 1]) == [b"\x01\x02"] * 2
    with pytest.raises(Exception, match="dedup of column 'img': the table's is 'content'"):
        spark.sql(
            f"CREATE TABLE props2 USING blobhouse OPTIONS (path '{uri}') "
            "TBLPROPERTIES (dedup 'off')"
        )


def test_read_blob_on_a_column_that_is_not_a_reference_names_it(spark, table_uri):
    write_table(pa.table({"id": [1], "label": ["cat"]}), table_uri)
    df = spark.read.format("blobhouse").load(table_uri)
    with pytest.raises(Exception) as caught:
        df.select(bs.read_blob(F.col("label"))).collect()
    last = str(caught.value).strip().splitlines()
    assert any("read_blob takes a blob reference" in line and "string" in line for line in last)
    assert "'StringArray' object has no attribute" not in str(caught.value)


def test_missing_columns_and_empty_frames_are_named_or_written(spark, table_uri):
    df = episodes(spark, rows=10, partitions=1)
    typo = r"column 'vidoe' is not in the DataFrame \(did you mean 'video'\?\)"
    with pytest.raises(SchemaError, match=typo):
        bs.write_table(df, table_uri, blob_columns=["vidoe"])
    empty = spark.createDataFrame([], SCHEMA)
    bs.write_table(empty, table_uri, blob_columns=["video", "calib", "thumb"])
    assert open_table(table_uri).count_rows() == 0
    empty.write.format("blobhouse").mode("append").save(table_uri)
    assert open_table(table_uri).count_rows() == 0
    assert open_table(table_uri).version == 1  # an append of no rows commits nothing
    with pytest.raises(InvalidInputError, match=r"unknown materialize column 'nope'"):
        bs.materialize(spark.read.format("blobhouse").load(table_uri), ["nope"])


def test_ingest_into_a_file_is_refused_before_spark_runs(spark, tmp_path):
    manifest = tmp_path / "rows.jsonl"
    (tmp_path / "a.bin").write_bytes(b"x")
    manifest.write_text('{"image": "a.bin"}\n')
    target = tmp_path / "table.txt"
    target.write_text("not a table")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(PathIsFileError, match="it is a file"):
        ingest(spark, str(manifest), str(target), ["image"])
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs


def test_spark_options_and_tblproperties_are_checked_by_the_settings_schema(spark, tmp_path):
    """Issue 57: every setting by one schema at Spark's doors too (writer options, read options,
    TBLPROPERTIES, the jobs' keywords), refused before anything is written, naming the option,
    the value and what it takes; a damaged stored setting refuses Spark's writes the same way."""
    uri = str(tmp_path / "t")
    df = episodes(spark, rows=4, partitions=1)
    for option, value, message in [
        ("managed_bases", "/", "'/' is the root of a filesystem, bucket or container"),
        ("max_rows_per_file", "ten", "max_rows_per_file must be a whole number from 1"),
        ("inline_size_threshold", str(2**64), "from 0 to 2**64 - 1, got '18446744073709551616'"),
        ("placement", '{"video": 5}', "the thresholds of 'video' are not a mapping"),
        ("dedup", '{"video": "globl"}', "dedup of column 'video' must be one of"),
        ("allow_nonempty_folder", "yes", "allow_nonempty_folder must be true or false"),
    ]:
        with pytest.raises(Exception, match=re.escape(message)):
            df.write.format("blobhouse").mode("append").option("blob_columns", BLOB_COLUMNS).option(
                option, value
            ).save(uri)
        assert not os.path.exists(uri)
    with pytest.raises(InvalidInputError, match=re.escape("partitions must be a whole number")):
        bs.write_table(df, uri, blob_columns=["video"], partitions="3")
    with pytest.raises(Exception, match=re.escape("managed_bases must be a list of absolute")):
        spark.sql(
            f"CREATE TABLE roots USING blobhouse OPTIONS (path '{uri}', columns 'id BIGINT, img "
            "BINARY', blob_columns 'img') TBLPROPERTIES (managed_bases 's3://bucket')"
        )
    assert not os.path.exists(uri)
    write_table(pa.table({"id": [1]}), uri)
    with pytest.raises(Exception, match=re.escape("rows_per_partition must be a whole number")):
        spark.read.format("blobhouse").option("rows_per_partition", "1e3").load(uri).collect()
    with pytest.raises(InvalidInputError, match=re.escape("dry_run must be True or False")):
        bs.gc(spark, uri, dry_run="yes")
    with pytest.raises(InvalidInputError, match=re.escape("target_rows must be a whole number")):
        bs.compact(spark, uri, target_rows=0)
    settings = json.loads(lance.dataset(uri).schema.metadata[b"blobhouse"])
    damaged = json.dumps({**settings, "max_rows_per_file": "10"})
    lance.dataset(uri).update_schema_metadata({"blobhouse": damaged})
    with pytest.raises(Exception, match=re.escape(f"blobhouse properties {uri} --set max_rows")):
        spark.createDataFrame([(2,)], "id long").write.format("blobhouse").mode("append").save(uri)
    assert open_table(uri).version == 2  # the hand edit's version: nothing written since
