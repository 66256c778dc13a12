"""``dedup="global"`` on Spark: payloads first, rows after.

:func:`store_payloads_first` hashes every payload of the global columns on the executors, keeps
one row per distinct payload the store's index lacks (each task asks the index for its hashes,
as a writer does: filters, the sorted run, the scalar indices; never a scan of the whole
index), and stores those in tasks partitioned by hash: each distinct payload of every column is
written once, whichever task its rows are in. Then every row becomes a reference into the
store, ``struct<data: null, uri, position, size, managed>``: found in the index by its task (the
entry's bytes checked first), or among the entries this write just stored (a join with them);
the writing tasks store no bytes of these columns. Packs gc retired are left out. The input
is computed twice (once for the payloads, once for the rows).
"""

from __future__ import annotations

from collections.abc import Iterator

import blake3
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from blobhouse.commit import leases
from blobhouse.errors import cleanup_after
from blobhouse.io.objects import StorageOptions
from blobhouse.layout import TableLocation
from blobhouse.store.checks import checked_entries
from blobhouse.store.index import StoreIndex, has_index
from blobhouse.store.index_part import INDEX_SCHEMA
from blobhouse.store.packs import StoredPayload, retired_packs, store_uri_prefix
from blobhouse.store.writer import StoreWriter

_DIGEST, _PACK = "__bh_digest", "__bh_pack"
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
    payloads = None
    for column in columns:
        data = _payload(df, column)
        one = df.select(_blake3(data).alias(_DIGEST), data.alias("data")).where(
            F.col(_DIGEST).isNotNull()
        )
        payloads = one if payloads is None else payloads.unionByName(one)
    missing = payloads.dropDuplicates([_DIGEST])
    if has_index(location.root, storage_options):
        lacking = _not_in_store(location.root, storage_options)
        missing = missing.mapInArrow(lacking, missing.schema)
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


def _not_in_store(root: str, storage_options: StorageOptions | None):
    """The task that keeps the rows of one partition of distinct payloads whose hash the
    store's index lacks (or holds only in retired packs)."""
    retired = frozenset(retired_packs(root, storage_options))

    def lacking(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        index = StoreIndex.open(root, storage_options)
        for batch in batches:
            digests = batch.column(_DIGEST).to_pylist()
            found = index.find(digests, avoid=retired)
            yield batch.filter(pa.array([d not in found for d in digests], pa.bool_()))

    return lacking


_ENTRY_ARROW = pa.struct([("pack", pa.string()), ("position", pa.int64()), ("size", pa.int64())])
_ENTRY = StructType(
    [
        StructField("pack", StringType()),
        StructField("position", LongType()),
        StructField("size", LongType()),
    ]
)


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
    found = _found_in_store(location.root, storage_options)
    if found is None and new_entries is None:
        return df
    fresh = None
    if new_entries is not None:
        # one row per hash: a payload two tasks stored (never, partitioned by hash) stays one
        fresh = new_entries.dropDuplicates(["blake3"]).select(
            F.col("blake3").alias(_DIGEST),
            F.struct(F.col("pack"), F.col("position"), F.col("size")).alias(_FRESH),
        )
    prefix = store_uri_prefix(location.root_uri)
    for column in columns:
        data = F.col(f"{column}.data") if _is_struct(df, column) else F.col(column)
        hashed = df.withColumn(_DIGEST, _blake3(data))
        # an entry from the index is referenced only once its bytes are checked (a damaged
        # index must not hand rows another payload's bytes): otherwise the row keeps its bytes
        # and its task stores them anew
        entry = found(F.col(_DIGEST)) if found is not None else F.lit(None).cast(_ENTRY)
        if fresh is not None:
            hashed = hashed.join(fresh, on=_DIGEST, how="left")
            entry = F.coalesce(entry, F.col(_FRESH))
        hashed = hashed.withColumn(_PACK, entry)
        reference = F.struct(
            F.lit(None).cast("binary").alias("data"),
            F.concat(F.lit(prefix), F.col(_PACK).getField("pack")).alias("uri"),
            F.col(_PACK).getField("position").alias("position"),
            F.col(_PACK).getField("size").alias("size"),
            F.lit(None).cast("boolean").alias("managed"),
        )
        df = hashed.withColumn(
            column, F.when(F.col(_PACK).isNotNull(), reference).otherwise(_as_logical(df, column))
        ).drop(_DIGEST, _PACK, _FRESH)
    return df


def _found_in_store(root: str, storage_options: StorageOptions | None):
    """A Spark function digest -> ``struct<pack, position, size>`` of the store's copy of the
    payload, its bytes checked (:func:`~blobhouse.store.checks.checked_entries`: a damaged copy
    is passed over for the next; null: not in the index, only in retired packs, or damaged);
    each task opens the index once and asks it once per hash. None when nothing was stored
    yet."""
    if not has_index(root, storage_options):
        return None
    retired = frozenset(retired_packs(root, storage_options))
    state: dict[str, object] = {}

    @arrow_udf(_ENTRY)
    def found(digests: pa.Array) -> pa.Array:
        index = state.get("index") or state.setdefault(
            "index", StoreIndex.open(root, storage_options)
        )
        usable: dict[bytes, StoredPayload | None] = state.setdefault("usable", {})
        asked = digests.to_pylist()
        wanted = list({d for d in asked if d is not None and d not in usable})
        checked = checked_entries(
            root, index.find_copies(wanted, avoid=retired), storage_options=storage_options
        ).usable
        usable.update({d: checked.get(d) for d in wanted})
        places = [
            {"pack": e.pack, "position": e.position, "size": e.size}
            if d is not None and (e := usable[d]) is not None
            else None
            for d in asked
        ]
        return pa.array(places, _ENTRY_ARROW)

    return found


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
