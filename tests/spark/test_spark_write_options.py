"""``blobhouse.spark.write_table`` takes a ``WriteOptions`` (``write_options=``, its
``blob_columns``/``ref_id_columns``/``dedup`` keywords as sugar): every field reaches the data
source through one function, :func:`~blobhouse.spark.datasource.spark_writer_options`, which
the data source's parsing turns back into the same object."""

from __future__ import annotations

from dataclasses import fields

import pytest

import blobhouse.spark as bs
from blobhouse import InvalidInputError, open_table
from blobhouse.options import WriteOptions
from blobhouse.spark.datasource import _SparkWriteOptions, spark_writer_options

REALISTIC = [
    WriteOptions(),
    WriteOptions(blob_columns=["img"]),
    WriteOptions(blob_columns=["video", "meta.thumb"], dedup="content"),
    WriteOptions(dedup={"video": "ref_id", "*": "global"}),
    WriteOptions(dedup={"video": "off", "img": None}),
    WriteOptions(ref_id_columns={"video": "video_chunk"}, dedup="ref_id"),
    WriteOptions(placement={"*": {"inline_size_threshold": 1024}}),
    WriteOptions(
        placement={
            "img": {"inline_size_threshold": 0, "dedicated_size_threshold": 1 << 20},
            "*": {"pack_file_size_threshold": 64 << 20, "dedicated_size_threshold": None},
        }
    ),
    WriteOptions(allowed_bases=["s3://bucket/media", "/data/raw"]),
    WriteOptions(managed_bases=["/data/managed", "az://container/objects"]),
    WriteOptions(max_rows_per_file=10, max_bytes_per_file=64 << 20),
    WriteOptions(
        blob_columns=["img", "depth"],
        ref_id_columns={"depth": "frame"},
        dedup={"img": "global", "depth": "ref_id"},
        placement={"depth": {"pack_file_size_threshold": 1 << 30}},
        allowed_bases=["gs://b/x"],
        managed_bases=["/mnt/owned"],
        max_rows_per_file=1_000,
        max_bytes_per_file=1 << 30,
    ),
]


@pytest.mark.parametrize("options", REALISTIC, ids=range(len(REALISTIC)))
def test_write_options_round_trip_through_writer_options(options):
    text = spark_writer_options(options)
    assert all(isinstance(v, str) for v in text.values())
    back = _SparkWriteOptions({"path": "/data/t", **text}).write_options()
    assert back == options


def test_every_write_options_field_is_a_writer_option():
    """A field added to WriteOptions without a writer option fails here, not silently."""
    full = REALISTIC[-1]
    assert {f.name for f in fields(WriteOptions)} == set(spark_writer_options(full))


def test_a_list_with_a_comma_cannot_be_a_writer_option():
    with pytest.raises(InvalidInputError, match="comma"):
        spark_writer_options(WriteOptions(blob_columns=["a,b"]))


def test_spark_write_table_takes_write_options(spark, table_uri, tmp_path):
    payloads = [bytes([i]) * 5_000 for i in range(3)]
    df = spark.createDataFrame(
        [(i, payloads[i % 3]) for i in range(30)], "id long, img binary"
    ).repartition(3)
    options = WriteOptions(
        blob_columns=["img"],
        dedup="content",
        max_rows_per_file=4,
        placement={"img": {"inline_size_threshold": 1_000, "dedicated_size_threshold": 10_000}},
    )
    bs.write_table(df, table_uri, write_options=options)
    table = open_table(table_uri)
    properties = table.stats()["properties"]
    assert properties["max_rows_per_file"] == 4 and properties["dedup"] == "content"
    placement = properties["columns"]["img"]
    assert (placement["inline_size_threshold"], placement["dedicated_size_threshold"]) == (
        1_000,
        10_000,
    )
    assert table.stats()["columns"]["img"]["dedup"] == "content"
    assert all(f.count_rows() <= 4 for f in table.dataset.get_fragments())
    assert sorted(r["id"] for r in table.to_arrow(columns=["id"]).to_pylist()) == list(range(30))
    # the keywords build the same object; an object with its keywords is refused, naming both
    other = str(tmp_path / "by_keywords")
    bs.write_table(df, other, blob_columns=["img"], dedup="content")
    assert open_table(other).stats()["properties"]["dedup"] == "content"
    with pytest.raises(
        InvalidInputError, match=r"give write_options .* keywords \(dedup\), not both"
    ):
        bs.write_table(df, other, write_options=WriteOptions(), dedup="content")
    # a write to the table that gives another max_rows_per_file is refused before Spark runs
    version = table.version
    with pytest.raises(Exception, match="max_rows_per_file"):
        bs.write_table(df, table_uri, write_options=WriteOptions(max_rows_per_file=5))
    assert open_table(table_uri).version == version
