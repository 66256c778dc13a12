"""``dedup="global"`` on Spark: payloads first, rows after.

:func:`store_payloads_first` hashes every payload of the global columns on the executors, keeps
one row per distinct payload the store's index lacks (the index is read by the ``blobhouse``
data source, so it never has to fit in one process), and stores those in tasks partitioned by
hash: each distinct payload of every column is written once, whichever task its rows are in.
Then every row is joined with the index and the new entries and becomes a reference into the
store, ``struct<data: null, uri, position, size, managed>``: the writing tasks store no bytes of
these columns. Packs gc retired are left out of the join. The input is computed twice (once for
the payloads, once for the rows).
"""

from __future__ import annotations

from collections.abc import Iterator

import blake3
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType, BooleanType

from blobhouse.commit import leases
from blobhouse.errors import cleanup_after
from blobhouse.io.objects import StorageOptions
from blobhouse.layout import TableLocation
from blobhouse.spark.datasource import ensure_registered, storage_prefixed
from blobhouse.store.checks import entry_verdicts
from blobhouse.store.index import INDEX_SCHEMA, has_index
from blobhouse.store.packs import StoredPayload, index_uri, retired_packs, store_uri_prefix
from blobhouse.store.writer import StoreWriter

_DIGEST, _PACK, _POSITION, _SIZE = "__bh_digest", "__bh_pack", "__bh_position", "__bh_size"
_FRESH = "__bh_fresh"  # an entry this write stored: its bytes were just hashed


@arrow_udf(BinaryType())
def _blake3(payloads: pa.Array) -> pa.Array:
    return pa.array(
        [None if p is None else blake3.blake3(p).digest() for p in payloads.to_pylist()],
        pa.binary(),
    )


def store_payloads_first(
    df: DataFrame,
    location: TableLocation,
    columns: list[str],
    name_prefix: str,
    pack_limit: int,
    partitions: int,
    storage_options: StorageOptions | None = None,
) -> tuple[DataFrame, list[StoredPayload]]:
    """Store the distinct payloads of ``columns`` the table's store lacks (packs named with
    ``name_prefix``, the write's), and return ``df`` with every such payload a reference into
    the store, plus what was stored (for the index, once the rows commit)."""
    spark = df.sparkSession
    index = _index(spark, location.root, storage_options)
    payloads = None
    for column in columns:
        data = _payload(df, column)
        one = df.select(_blake3(data).alias(_DIGEST), data.alias("data")).where(
            F.col(_DIGEST).isNotNull()
        )
        payloads = one if payloads is None else payloads.unionByName(one)
    missing = payloads.dropDuplicates([_DIGEST])
    if index is not None:
        missing = missing.join(index.select(F.col("blake3").alias(_DIGEST)), _DIGEST, "left_anti")
    store = _store_task(location.root, name_prefix, pack_limit, storage_options)
    stored = missing.repartition(partitions, _DIGEST).mapInArrow(store, _ENTRIES_SCHEMA).toArrow()
    entries = [
        StoredPayload(d, p, pos, size)
        for d, p, pos, size in zip(*(stored.column(i).to_pylist() for i in range(4)), strict=True)
    ]
    new = spark.createDataFrame(stored) if entries else None
    return look_up_in_store(spark, df, location, columns, storage_options, new), entries


_ENTRIES_SCHEMA = "blake3 binary, pack string, position long, size long"


def _payload(df: DataFrame, column: str) -> Column:
    """The bytes of ``column`` the store would hold: not null, not empty, not a reference."""
    if _is_struct(df, column):
        data = F.when(F.col(f"{column}.uri").isNull(), F.col(f"{column}.data"))
    else:
        data = F.col(column)
    return F.when(F.length(data) > 0, data)


def _store_task(
    root: str, name_prefix: str, pack_limit: int, storage_options: StorageOptions | None
):
    """The task that stores one partition of distinct payloads and yields their entries."""

    def store(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with leases.held(root, name_prefix, storage_options):
            writer = StoreWriter(root, 0, name_prefix, pack_limit, storage_options, False)
            try:
                for batch in batches:
                    payloads = batch.column("data").to_pylist()
                    writer.place_many(payloads, batch.column(_DIGEST).to_pylist())
                writer.finish()
            except BaseException as exc:
                cleanup_after(exc, writer.abort)
                raise
        stored = writer.packs.stored
        yield pa.record_batch(
            [
                pa.array([s.digest for s in stored], pa.binary()),
                pa.array([s.pack for s in stored], pa.string()),
                pa.array([s.position for s in stored], pa.int64()),
                pa.array([s.size for s in stored], pa.int64()),
            ],
            names=INDEX_SCHEMA.names,
        )

    return store


def look_up_in_store(
    spark: SparkSession,
    df: DataFrame,
    location: TableLocation,
    columns: list[str],
    storage_options: StorageOptions | None = None,
    new_entries: DataFrame | None = None,
) -> DataFrame:
    """``df`` with every payload of ``columns`` that the table's store holds (or
    ``new_entries`` lists: payloads stored by this write) replaced by a reference into it (the
    columns become logical blob structs)."""
    index = _index(spark, location.root, storage_options)
    if index is not None:
        index = index.withColumn(_FRESH, F.lit(False))
    if new_entries is not None:
        # a concurrent writer may have indexed the same payload since: one row per hash
        new_entries = new_entries.withColumn(_FRESH, F.lit(True))
        both = new_entries if index is None else new_entries.unionByName(index)
        index = both.dropDuplicates(["blake3"])
    if index is None:
        return df
    prefix = store_uri_prefix(location.root_uri)
    usable = _usable_entry(location.root, storage_options)
    for column in columns:
        data = F.col(f"{column}.data") if _is_struct(df, column) else F.col(column)
        found = index.select(
            F.col("blake3").alias(_DIGEST),
            F.col("pack").alias(_PACK),
            F.col("position").alias(_POSITION),
            F.col("size").alias(_SIZE),
            F.col(_FRESH),
        )
        joined = df.withColumn(_DIGEST, _blake3(data)).join(found, on=_DIGEST, how="left")
        # an entry from the index is referenced only once its bytes are checked (a damaged
        # index must not hand rows another payload's bytes): otherwise the row keeps its bytes
        # and its task stores them anew
        checked = F.when(
            F.col(_PACK).isNotNull()
            & (
                F.col(_FRESH) | usable(F.col(_DIGEST), F.col(_PACK), F.col(_POSITION), F.col(_SIZE))
            ),
            F.col(_PACK),
        )
        joined = joined.withColumn(_PACK, checked)
        reference = F.struct(
            F.lit(None).cast("binary").alias("data"),
            F.concat(F.lit(prefix), F.col(_PACK)).alias("uri"),
            F.col(_POSITION).alias("position"),
            F.col(_SIZE).alias("size"),
            F.lit(None).cast("boolean").alias("managed"),
        )
        df = joined.withColumn(
            column, F.when(F.col(_PACK).isNotNull(), reference).otherwise(_as_logical(df, column))
        ).drop(_DIGEST, _PACK, _POSITION, _SIZE, _FRESH)
    return df


def _usable_entry(root: str, storage_options: StorageOptions | None):
    """A Spark function (digest, pack, position, size) -> whether that index entry's bytes
    hash to its digest; each distinct entry is read once per Python worker."""
    verdicts: dict[StoredPayload, bool] = {}

    @arrow_udf(BooleanType())
    def usable(
        digests: pa.Array, packs: pa.Array, positions: pa.Array, sizes: pa.Array
    ) -> pa.Array:
        rows = zip(*(a.to_pylist() for a in (digests, packs, positions, sizes)), strict=True)
        entries = [StoredPayload(*row) if row[1] is not None else None for row in rows]
        unknown = list({e for e in entries if e is not None and e not in verdicts})
        for entry, verdict in zip(
            unknown, entry_verdicts(root, unknown, storage_options), strict=True
        ):
            verdicts[entry] = verdict is None
        return pa.array([None if e is None else verdicts[e] for e in entries], pa.bool_())

    return usable


def _index(
    spark: SparkSession, table_path: str, storage_options: StorageOptions | None
) -> DataFrame | None:
    if not has_index(table_path, storage_options):
        return None  # nothing stored yet: nothing to find
    ensure_registered(spark)
    reader = spark.read.format("blobhouse").options(**storage_prefixed(storage_options))
    index = reader.load(index_uri(table_path))
    retired = sorted(retired_packs(table_path, storage_options))
    if retired:
        index = index.filter(~F.col("pack").isin(retired))
    # concurrent writers may both have stored a payload: one row per hash keeps rows unique
    return index.dropDuplicates(["blake3"])


def _is_struct(df: DataFrame, column: str) -> bool:
    return hasattr(df.schema[column].dataType, "fieldNames")


def _as_logical(df: DataFrame, column: str) -> Column:
    """The column as ``struct<data, uri, position, size, managed>`` (what a store reference
    looks like; the ``managed`` flag of external rows is kept)."""
    names = df.schema[column].dataType.fieldNames() if _is_struct(df, column) else []

    def child(name: str, spark_type: str) -> Column:
        value = F.col(f"{column}.{name}") if name in names else F.lit(None)
        return value.cast(spark_type).alias(name)

    data = child("data", "binary") if names else F.col(column).cast("binary").alias("data")
    return F.struct(
        data,
        child("uri", "string"),
        child("position", "long"),
        child("size", "long"),
        child("managed", "boolean"),
    )
