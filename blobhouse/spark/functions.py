"""Spark functions over resolved blob references: ``read_blob``, ``blob_size``, ``materialize``.

A reference column (``struct<uri, position, size>``) is what the ``blobhouse`` data source returns
for a blob column. These functions turn references into bytes only for the rows that reach them,
after Spark's filters and joins, with coalesced ranged reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from blobhouse.errors import InvalidInputError
from blobhouse.rangeio import read_ranges_arrow, refs_from_arrow
from blobhouse.storage import checked_options

MATERIALIZE_BATCH_BYTES = 64 << 20


def read_bytes(array: pa.Array, storage_options: Mapping[str, str] | None = None) -> pa.Array:
    """The bytes of every reference in ``array`` as ``large_binary`` (null stays null)."""
    return read_ranges_arrow(refs_from_arrow(array), storage_options=storage_options)


def read_blob_function(storage_options: Mapping[str, str] | None = None):
    """``read_blob(ref)`` reading objects with ``storage_options`` (which travel to the
    executors with the function): what :func:`blobhouse.spark.register` registers."""
    options = checked_options(storage_options)

    @arrow_udf(BinaryType())
    def read_blob(refs: pa.Array) -> pa.Array:
        """``read_blob(ref)``: the bytes a reference points at (SQL and DataFrames)."""
        return read_bytes(refs, options)

    return read_blob


read_blob = read_blob_function()


@arrow_udf(LongType())
def blob_size(refs: pa.Array) -> pa.Array:
    """``blob_size(ref)``: the size in bytes of a referenced blob, without reading it."""
    sizes = refs.field("size")
    return pc.if_else(refs.is_valid(), sizes, pa.nulls(len(refs), pa.int64())).cast(pa.int64())


def materialize(
    df: DataFrame,
    columns: Sequence[str],
    *,
    max_batch_bytes: int = MATERIALIZE_BATCH_BYTES,
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """``df`` with the reference ``columns`` replaced by their bytes (``binary``).

    Runs as ``mapInArrow``: each Arrow batch's references are read together, ranges grouped by
    object and coalesced, objects read in parallel. Output batches hold at most
    ``max_batch_bytes`` of blob bytes (or one row), however large the input batches.
    ``storage_options`` reach the objects the references name (on an object store).
    """
    options = checked_options(storage_options)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InvalidInputError(f"materialize: no column(s) {missing}; columns: {df.columns}")
    for name in columns:
        if not _is_ref_type(df.schema[name].dataType):
            raise InvalidInputError(
                f"materialize: column {name!r} is {df.schema[name].dataType.simpleString()}, "
                "not a blob reference struct<uri, position, size>"
            )
    wanted = set(columns)
    out_schema = StructType(
        [f if f.name not in wanted else StructField(f.name, BinaryType()) for f in df.schema]
    )

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for piece in _by_referenced_bytes(batch, wanted, max_batch_bytes):
                arrays = [
                    read_bytes(piece.column(name), options)
                    if name in wanted
                    else piece.column(name)
                    for name in piece.schema.names
                ]
                yield pa.RecordBatch.from_arrays(arrays, names=piece.schema.names)

    return df.mapInArrow(convert, out_schema)


def _by_referenced_bytes(
    batch: pa.RecordBatch, columns: set[str], limit: int
) -> Iterator[pa.RecordBatch]:
    """Slices of ``batch`` whose references point at no more than ``limit`` bytes (one row at
    least), so output batches stay bounded whatever the input batch size."""
    sizes = [0] * batch.num_rows
    for name in columns:
        column = batch.column(name).field("size").fill_null(0).to_pylist()
        sizes = [a + b for a, b in zip(sizes, column, strict=True)]
    start, total = 0, 0
    for row, size in enumerate(sizes):
        if row > start and total + size > limit:
            yield batch.slice(start, row - start)
            start, total = row, 0
        total += size
    if start < batch.num_rows:
        yield batch.slice(start)


def _is_ref_type(data_type) -> bool:
    if not isinstance(data_type, StructType):
        return False
    return [f.name for f in data_type.fields] == ["uri", "position", "size"]
