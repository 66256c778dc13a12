"""update and merge_insert on Spark: the same plans and per-fragment steps as
:mod:`blobhouse.mutations`, run as Spark tasks; the driver commits once.

``merge_insert`` matches with a join Spark executes: tasks read the table's keys fragment by
fragment, the join runs in Spark, tasks write the new rows' data files and the deletion files of
the fragments whose rows are replaced, and only file metadata reaches the driver. So the keys
never have to fit in the driver. If anything fails, the table is unchanged and the staged files
are removed.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array, open_table, write_table
>>> uri = tempfile.mkdtemp() + "/t"
>>> _ = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}), uri)
>>> df = spark.createDataFrame([(2, b"B"), (3, b"c")], "id long, img binary")
>>> merge_insert(df, uri, on="id").num_inserted_rows
1
>>> update(spark, uri, {"img": None}, where="id = 1").rows_updated
1
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from blobhouse import mutations
from blobhouse.backfill import BlobFunction, table_for
from blobhouse.errors import InvalidInputError
from blobhouse.mutations import (
    ColumnRewrite,
    MergeInsert,
    MergeReport,
    UpdateReport,
    commit_rewrite,
    empty_rewrite,
    has_match,
    rewrite_fragment,
)
from blobhouse.options import WriteOptions
from blobhouse.placement import Placement
from blobhouse.spark.errors import spark_entry_point
from blobhouse.spark.jobs import run_tasks
from blobhouse.spark.lookup import store_payloads_first
from blobhouse.storage import checked_options
from blobhouse.table import TableWrite, open_at, open_table
from blobhouse.transaction import DEFAULT_RETRIES, Transaction, record_stored

_ADDRESS, _SCOPE = "__bh_rowaddr", "__bh_in_scope"


@spark_entry_point
def update(
    spark: SparkSession,
    uri: str,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None = None,
    *,
    dedup: str = "content",
    storage_options: Mapping[str, str] | None = None,
    retries: int = DEFAULT_RETRIES,
) -> UpdateReport:
    """:meth:`blobhouse.Table.update` with a Spark task per fragment: each task rewrites the
    changed columns of its fragment if a row matches ``where``; the driver commits once."""
    options = checked_options(storage_options)
    table = open_table(uri, storage_options=options)
    return mutations.update(
        table,
        updates,
        where,
        dedup=dedup,
        retries=retries,
        rewrite=lambda at, plan: _rewrite_in_tasks(spark, at, plan),
    )


def _rewrite_in_tasks(spark: SparkSession, table, plan: ColumnRewrite) -> dict:
    """:func:`~blobhouse.mutations.rewrite_fragment` of every fragment holding a matching row,
    a Spark task per fragment (each task checks its fragment for a match)."""
    location, version, options, where = (
        table.location,
        table.version,
        table.storage_options,
        plan.where,
    )

    def rewrite(fragment_id: int):
        at = open_at(location, version, options)
        if not has_match(at.dataset.get_fragment(fragment_id), where):
            return None
        return rewrite_fragment(at, plan, fragment_id)

    ids = [f.fragment_id for f in table.dataset.get_fragments()]
    results = run_tasks(spark, ids, rewrite)
    return {i: r for i, r in zip(ids, results, strict=True) if r is not None}


@spark_entry_point
def merge_insert(
    df: DataFrame,
    uri: str,
    *,
    on: str | Sequence[str],
    when_matched_update_all: bool = True,
    when_not_matched_insert_all: bool = True,
    when_not_matched_by_source_delete: bool | str = False,
    dedup: str = "content",
    ref_id_columns: Mapping[str, str] | None = None,
    placement: Mapping[str, Mapping[str, int]] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> MergeReport:
    """:meth:`blobhouse.Table.merge_insert` for a DataFrame, in one commit: the source rows
    whose key the table has replace those rows (``when_matched_update_all``), the others are
    inserted (``when_not_matched_insert_all``), and table rows whose key the source lacks are
    deleted when ``when_not_matched_by_source_delete`` is True or a SQL condition they match.
    New rows go through the write pipeline with ``dedup`` (``"global"``: payloads the table
    stores anywhere are referenced). Duplicate keys in ``df`` are an error naming one."""
    options = checked_options(storage_options)
    write_options = WriteOptions(dedup=dedup, ref_id_columns=ref_id_columns, placement=placement)
    table = table_for(open_table(uri, storage_options=options), dedup)
    merge = MergeInsert(table, on, write_options)
    keys = merge.on
    if when_matched_update_all:
        merge.when_matched_update_all()
    if when_not_matched_insert_all:
        merge.when_not_matched_insert_all()
    if when_not_matched_by_source_delete:
        merge.when_not_matched_by_source_delete(
            when_not_matched_by_source_delete
            if isinstance(when_not_matched_by_source_delete, str)
            else None
        )
    # the source's shape checked like the Python merge (keys, unknown columns), without data
    merge.check_source(table, to_arrow_schema(df.schema).empty_table())
    _check_unique_keys(df, keys)
    targets = _target_keys(df.sparkSession, table, df, keys, when_not_matched_by_source_delete)
    joined = df.join(targets, keys, "left")
    counts = joined.select(
        F.count(F.col(_ADDRESS)).alias("matched"), F.count(F.lit(1)).alias("rows")
    ).first()
    matched, rows = int(counts["matched"]), int(counts["rows"])
    keep = F.lit(False)
    if when_matched_update_all:
        keep = keep | F.col(_ADDRESS).isNotNull()
    if when_not_matched_insert_all:
        keep = keep | F.col(_ADDRESS).isNull()
    new_rows = joined.where(keep).drop(_ADDRESS, _SCOPE)
    doomed = None
    if when_matched_update_all:
        doomed = joined.where(F.col(_ADDRESS).isNotNull()).select(_ADDRESS)
    by_source = None
    if when_not_matched_by_source_delete:
        by_source = targets.where(F.col(_SCOPE)).join(df.select(*keys), keys, "left_anti")
        by_source = by_source.select(_ADDRESS)
        doomed = by_source if doomed is None else doomed.unionByName(by_source)
    txn = Transaction.start(table.location, table.version, options, kind="merge")
    written: list = []
    stored: list = []
    try:
        with txn.lease():
            if dedup == "global":  # payloads first: the new rows then carry store references
                new_rows, stored = store_payloads_first(
                    new_rows,
                    table.location,
                    _blob_columns(table, new_rows),
                    txn.name_prefix,
                    _pack_limit(write_options),
                    max(1, new_rows.rdd.getNumPartitions()),
                    options,
                )
            write = TableWrite.begin(
                uri,
                to_arrow_schema(new_rows.schema),
                write_options,
                mode="append",
                storage_options=options,
                load_store_index=dedup != "global",
                write_id=txn.id,
            )
            written = _write_rows(new_rows, write)
            deletions = _delete_rows(doomed, table) if doomed is not None else {}
            deleted = by_source.count() if by_source is not None else 0
        rewrite = empty_rewrite(table, txn)
        dataset = commit_rewrite(table, rewrite, {}, deletions=deletions, new_files=written)
    except BaseException:
        txn.abort(written, tasks_may_run=True)
        raise
    record_stored(table.location.root, stored, options)
    return MergeReport(
        read_version=table.version,
        version=dataset.version,
        num_inserted_rows=(rows - matched) if when_not_matched_insert_all else 0,
        num_updated_rows=matched if when_matched_update_all else 0,
        num_deleted_rows=deleted,
        bytes_written=sum(w.size_bytes + w.sidecar_bytes for w in written),
    )


def _pack_limit(options: WriteOptions) -> int:
    """The store's pack size: the merge's ``pack_file_size_threshold``, else the default."""
    given = (options.placement or {}).get("*", {}).get("pack_file_size_threshold")
    return int(given) if given is not None else Placement().pack_file_size_threshold


def _blob_columns(table, df: DataFrame) -> list[str]:
    return [c for c in table.blob_columns if "." not in c and c in df.columns]


def _check_unique_keys(df: DataFrame, keys: list[str]) -> None:
    twice = df.groupBy(*keys).count().where(F.col("count") > 1).limit(1).collect()
    if twice:
        key = {k: twice[0][k] for k in keys}
        raise InvalidInputError(
            f"the source has key(s) more than once, e.g. {key} ({twice[0]['count']} rows): "
            "a merge needs one source row per key"
        )


def _target_keys(
    spark: SparkSession, table, df: DataFrame, keys: list[str], scope: bool | str
) -> DataFrame:
    """The table's keys with each row's address, read by one task per fragment; ``scope``:
    whether a row may be deleted by the source's lack of it."""
    schema = StructType(
        [df.schema[k] for k in keys]
        + [StructField(_ADDRESS, LongType(), False), StructField(_SCOPE, BooleanType(), True)]
    )
    arrow_schema = to_arrow_schema(schema)
    location, version, options = table.location, table.version, table.storage_options
    condition = scope if isinstance(scope, str) else "true"

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        at = open_at(location, version, options)
        for batch in batches:
            for fragment_id in batch.column(0).to_pylist():
                fragment = at.dataset.get_fragment(fragment_id)
                columns = {k: k for k in keys} | {_SCOPE: f"({condition})"}
                scan = fragment.scanner(columns=columns, with_row_address=True)
                for part in scan.to_batches():
                    arrays = [part.column(k).cast(arrow_schema.field(k).type) for k in keys]
                    arrays += [part.column("_rowaddr").cast(pa.int64()), part.column(_SCOPE)]
                    yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    ids = [f.fragment_id for f in table.dataset.get_fragments()] or [-1]
    frame = spark.createDataFrame([(i,) for i in ids], "fragment long").repartition(len(ids))
    frame = frame.where(F.col("fragment") >= 0)
    return frame.mapInArrow(read, schema)


def _write_rows(rows: DataFrame, write: TableWrite) -> list:
    """The rows' data files, written by tasks (nothing visible yet)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for written in write.write(batches):
            yield pa.record_batch({"file": [pickle.dumps(written)]})

    return [pickle.loads(r["file"]) for r in rows.mapInArrow(task, "file binary").collect()]


def _delete_rows(addresses: DataFrame, table) -> dict[int, object]:
    """Deletion files for the rows at ``addresses``, written by one task per fragment:
    fragment id -> its new metadata (None when no row is left)."""
    location, version, options = table.location, table.version, table.storage_options

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        by_fragment: dict[int, list[int]] = {}
        for batch in batches:
            for address in batch.column(0).to_pylist():
                by_fragment.setdefault(address >> 32, []).append(address)
        at = open_at(location, version, options)
        for fragment_id, doomed in by_fragment.items():
            predicate = f"_rowaddr IN ({', '.join(map(str, sorted(set(doomed))))})"
            metadata = at.dataset.get_fragment(fragment_id).delete(predicate)
            yield pa.record_batch({"fragment": [fragment_id], "metadata": [pickle.dumps(metadata)]})

    fragment = F.shiftright(F.col(_ADDRESS), 32)
    partitions = max(1, len(table.dataset.get_fragments()))
    done = (
        addresses.repartition(partitions, fragment)
        .mapInArrow(task, "fragment long, metadata binary")
        .collect()
    )
    return {r["fragment"]: pickle.loads(r["metadata"]) for r in done}
