"""``dedup="global"`` on Spark: the store's index lookup as a join Spark executes.

Each row's payload is hashed on the executors and joined with the table store's index (read by
the ``blobhouse`` data source, so it never has to fit in one process). A row whose payload the
store holds becomes a reference into it, ``struct<data: null, uri, position, size>``, and its
bytes go no further; the others keep their bytes and are stored by the writing tasks, which then
skip loading the index. Packs gc retired are left out of the join.
"""

from __future__ import annotations

import blake3
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType

from blobhouse.layout import TableLocation
from blobhouse.spark.datasource import storage_prefixed
from blobhouse.storage import StorageOptions
from blobhouse.store import index_uri, retired_packs, store_uri_prefix

_DIGEST, _PACK, _POSITION, _SIZE = "__bh_digest", "__bh_pack", "__bh_position", "__bh_size"


@arrow_udf(BinaryType())
def _blake3(payloads: pa.Array) -> pa.Array:
    return pa.array(
        [None if p is None else blake3.blake3(p).digest() for p in payloads.to_pylist()],
        pa.binary(),
    )


def look_up_in_store(
    spark: SparkSession,
    df: DataFrame,
    location: TableLocation,
    columns: list[str],
    storage_options: StorageOptions | None = None,
) -> DataFrame:
    """``df`` with every payload of ``columns`` that the table's store holds replaced by a
    reference into it (the columns become logical blob structs)."""
    index = _index(spark, location.root, storage_options)
    if index is None:
        return df
    prefix = store_uri_prefix(location.root_uri)
    for column in columns:
        data = F.col(f"{column}.data") if _is_struct(df, column) else F.col(column)
        found = index.select(
            F.col("blake3").alias(_DIGEST),
            F.col("pack").alias(_PACK),
            F.col("position").alias(_POSITION),
            F.col("size").alias(_SIZE),
        )
        joined = df.withColumn(_DIGEST, _blake3(data)).join(found, on=_DIGEST, how="left")
        reference = F.struct(
            F.lit(None).cast("binary").alias("data"),
            F.concat(F.lit(prefix), F.col(_PACK)).alias("uri"),
            F.col(_POSITION).alias("position"),
            F.col(_SIZE).alias("size"),
        )
        df = joined.withColumn(
            column, F.when(F.col(_PACK).isNotNull(), reference).otherwise(_as_logical(df, column))
        ).drop(_DIGEST, _PACK, _POSITION, _SIZE)
    return df


def _index(
    spark: SparkSession, table_path: str, storage_options: StorageOptions | None
) -> DataFrame | None:
    reader = spark.read.format("blobhouse").options(**storage_prefixed(storage_options))
    try:
        index = reader.load(index_uri(table_path))
    except Exception:  # no index yet: nothing to find
        return None
    retired = sorted(retired_packs(table_path, storage_options))
    if retired:
        index = index.filter(~F.col("pack").isin(retired))
    # concurrent writers may both have stored a payload: one row per hash keeps rows unique
    return index.dropDuplicates(["blake3"])


def _is_struct(df: DataFrame, column: str) -> bool:
    return hasattr(df.schema[column].dataType, "fieldNames")


def _as_logical(df: DataFrame, column: str) -> Column:
    """The column as ``struct<data, uri, position, size>`` (what a store reference looks like)."""
    if not _is_struct(df, column):
        data, uri, position, size = F.col(column), None, None, None
    else:
        names = df.schema[column].dataType.fieldNames()
        data, uri = F.col(f"{column}.data"), F.col(f"{column}.uri")
        position = F.col(f"{column}.position") if "position" in names else None
        size = F.col(f"{column}.size") if "size" in names else None
    return F.struct(
        data.cast("binary").alias("data"),
        (uri if uri is not None else F.lit(None)).cast("string").alias("uri"),
        (position if position is not None else F.lit(None)).cast("long").alias("position"),
        (size if size is not None else F.lit(None)).cast("long").alias("size"),
    )
