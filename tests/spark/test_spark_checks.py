"""Spark's reads of bytes check them (issue 57): ``read_blob`` (SQL and DataFrames),
``materialize`` and the data source with ``blobs "bytes"`` check each payload against the blake3
recorded when it was written, which references carry; a store pack or a data file replaced by
another of the same size raises, naming it, instead of returning the other file's bytes. Each
has an opt-out (``check_hashes``) that reads unchecked."""

from __future__ import annotations

import glob
import os
import shutil

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import blobhouse.spark as bs
from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import InvalidInputError
from blobhouse.files.ranges import REF_TYPE
from blobhouse.spark.functions import read_blob_function, read_bytes

ROWS, SIZE = 4, 200_000


def _append(
    uri: str, mode: str = "append", dedup: str = "global", start: int = 0
) -> tuple[list[bytes], str]:
    """Rows ``start`` .. of random payloads appended to ``uri``, and the data file written."""
    before = set(glob.glob(f"{uri}/data/*.lance"))
    payloads = [os.urandom(SIZE) for _ in range(ROWS)]
    write_table(
        pa.table({"id": list(range(start, start + ROWS)), "img": blob_array(payloads)}),
        uri,
        mode=mode,
        dedup=dedup,
    )
    (written,) = set(glob.glob(f"{uri}/data/*.lance")) - before
    return payloads, written


@pytest.fixture
def swapped_pack(tmp_path) -> tuple[str, list[bytes]]:
    """A global table of two appends whose first store pack was replaced by the second (the
    same size), and the payloads now in the place of those written first."""
    uri = str(tmp_path / "t")
    _append(uri, "create")
    theirs, _ = _append(uri, start=ROWS)
    first, second = sorted(glob.glob(f"{uri}/_blobs/packs/*.pack"), key=os.path.getmtime)
    assert os.path.getsize(first) == os.path.getsize(second)
    shutil.copyfile(second, first)
    return uri, theirs


def _first_rows(df) -> list[bytes]:
    """The bytes of the rows the first append wrote."""
    return [r["img"] for r in df.where(f"id < {ROWS}").orderBy("id").collect()]


def test_read_blob_and_materialize_check_the_bytes_against_the_reference(spark, swapped_pack):
    uri, theirs = swapped_pack
    refs = spark.read.format("blobhouse").load(uri)
    refs.createOrReplaceTempView("swapped_pack")
    reads = {
        "read_blob": lambda: refs.select(bs.read_blob("img").alias("img")).collect(),
        "SQL read_blob": lambda: spark.sql("SELECT read_blob(img) FROM swapped_pack").collect(),
        "materialize": lambda: bs.materialize(refs, ["img"]).collect(),
        "blobs bytes": lambda: (
            spark.read.format("blobhouse").option("blobs", "bytes").load(uri).collect()
        ),
    }
    for read in reads.values():
        with pytest.raises(Exception, match=r"CorruptBlobError: .*do not match the blake3"):
            read()
    # the opt-outs read what is there, unchecked: the other pack's payloads
    unchecked = read_blob_function(check_hashes=False)
    assert _first_rows(refs.select("id", unchecked("img").alias("img"))) == theirs
    assert _first_rows(bs.materialize(refs, ["img"], check_hashes=False)) == theirs
    raw = spark.read.format("blobhouse").option("blobs", "bytes").option("check_hashes", "false")
    assert _first_rows(raw.load(uri)) == theirs
    plain = spark.read.format("blobhouse").option("check_hashes", "false").load(uri)
    assert plain.where(F.col("img.blake3").isNotNull()).count() == 0  # none carried


def test_a_swapped_data_file_is_named_by_every_spark_read(spark, tmp_path):
    """Another table's data file of the same size in place of this table's: the read of
    references names it (they would carry the other file's hashes), and so does every read
    of bytes."""
    uri = str(tmp_path / "t")
    _, first = _append(uri, "create", dedup="content")
    _, source = _append(str(tmp_path / "other"), "create", dedup="content")
    shutil.copyfile(source, first)
    refs = spark.read.format("blobhouse").load(uri)
    for read in (
        lambda: refs.collect(),
        lambda: refs.select(bs.read_blob("img")).collect(),
        lambda: bs.materialize(refs, ["img"]).collect(),
        lambda: spark.read.format("blobhouse").option("blobs", "bytes").load(uri).collect(),
    ):
        with pytest.raises(Exception, match=r"DataFileError: .*another data file") as raised:
            read()
        assert os.path.basename(first) in str(raised.value)


def test_healthy_tables_read_checked_and_hand_made_references_unchecked(spark, tmp_path):
    """Every layout reads right through the checks; references built without a blake3
    (by hand, or by blobhouse before references carried one) read as they are; a blake3 of
    the wrong length is refused naming the row."""
    uri = str(tmp_path / "t")
    payloads = [os.urandom(n) for n in (10, 20_000, 100_000, 5_000_000)]  # inline ... dedicated
    write_table(pa.table({"id": [0, 1, 2, 3], "img": blob_array(payloads)}), uri, dedup="content")
    refs = spark.read.format("blobhouse").load(uri)
    assert refs.where(F.col("img.blake3").isNull()).count() == 0
    read = refs.select("id", bs.read_blob("img").alias("img")).orderBy("id")
    assert [r["img"] for r in read.collect()] == payloads
    done = bs.materialize(refs, ["img"]).orderBy("id")
    assert [r["img"] for r in done.collect()] == payloads
    table_refs = open_table(uri).blob_refs("img", [0, 1, 2, 3])
    bare = pa.StructArray.from_arrays(
        [table_refs.field(n) for n in ("uri", "position", "size")], ["uri", "position", "size"]
    )
    assert read_bytes(bare).to_pylist() == payloads
    hand = refs.select("id", F.struct("img.uri", "img.position", "img.size").alias("img"))
    assert _first_rows(hand.select("id", bs.read_blob("img").alias("img"))) == payloads
    short = pa.array([{**table_refs[0].as_py(), "blake3": b"x" * 5}], REF_TYPE)
    with pytest.raises(InvalidInputError, match=r"row 0 of the batch carries a blake3 of 5 bytes"):
        read_bytes(short)


def test_a_schema_declaring_references_without_their_hash_still_reads(spark, tmp_path):
    """A catalog table made before references carried their blake3, or a schema given by
    hand, declares struct<uri, position, size>: the reads give that, and read_blob reads it
    unchecked."""
    uri = str(tmp_path / "t")
    payloads, _ = _append(uri, "create", dedup="content")
    declared = "id long, img struct<uri: string, position: long, size: long>"
    refs = spark.read.format("blobhouse").schema(declared).load(uri)
    assert refs.schema["img"].dataType.fieldNames() == ["uri", "position", "size"]
    assert _first_rows(refs.select("id", bs.read_blob("img").alias("img"))) == payloads
