"""blobhouse on Spark: the ``blobhouse`` data source, SQL functions, and dedup-aware writes.

>>> import tempfile
>>> import blobhouse.spark as bs
>>> bs.register(spark)
>>> uri = tempfile.mkdtemp() + "/frames"
>>> df = spark.createDataFrame([(i, i // 30, b"chunk-%d" % (i // 30)) for i in range(90)],
...                            "frame long, chunk long, video binary")
>>> bs.write_table(df, uri, blob_columns=["video"], dedup="ref_id",
...                ref_id_columns={"video": "chunk"})
>>> spark.read.format("blobhouse").load(uri).createOrReplaceTempView("frames")
>>> spark.sql("SELECT frame, read_blob(video) AS v FROM frames WHERE frame = 31").collect()
[Row(frame=31, v=b'chunk-1')]
"""

from __future__ import annotations

try:  # the Python data source API of Spark 4.1 (filter pushdown), from the spark extra
    from pyspark.sql.datasource import Filter  # noqa: F401
except ImportError:  # a one-line MissingExtraError naming `pip install "blobhouse[spark]"`
    from blobhouse.extras import require_spark

    require_spark()
    raise

import os
import sys
import warnings
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from blobhouse.changes.backfill import BlobFunction, backfill
from blobhouse.columns import check_column_names
from blobhouse.commit.transaction import Transaction
from blobhouse.dedup import mode_of
from blobhouse.errors import InvalidInputError, SchemaError, closest
from blobhouse.io.objects import checked_options
from blobhouse.layout import TableLocation
from blobhouse.options import WriteOptions, as_options, option_keywords
from blobhouse.properties import TableProperties
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import open_dataset, open_snapshot
from blobhouse.spark.datasource import (
    WRITE_OPTIONS,
    check_options,
    count_rows,
    ensure_registered,
    parsed_write_options,
    spark_writer_options,
    storage_prefixed,
)
from blobhouse.spark.errors import spark_entry_point
from blobhouse.spark.functions import blob_size, materialize, read_blob, read_blob_function
from blobhouse.spark.jobs import SparkTasks, compact, gc, verify
from blobhouse.spark.lerobot import ingest_lerobot
from blobhouse.spark.lookup import store_payloads_first
from blobhouse.spark.mutations import merge_insert, update
from blobhouse.write.prepare import kept_properties
from blobhouse.write.store_first import run_store_first

__all__ = [
    "backfill_blob_column",
    "blob_size",
    "compact",
    "count_rows",
    "gc",
    "ingest_lerobot",
    "local_session",
    "materialize",
    "merge_insert",
    "read_blob",
    "register",
    "update",
    "verify",
    "write_table",
]

_COLOCATE_KEY = "__bh_colocate"  # RESERVED_PREFIX: no column of the data has it
ARROW_RECORDS_PER_BATCH = 256


@spark_entry_point
def local_session(
    master: str = "local[*]",
    shuffle_partitions: int | None = None,
    app_name: str = "blobhouse",
    driver_memory: str = "4g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session for blobhouse: embedded (``local[*]``, the default) or connected to a
    cluster's ``master`` (``spark://host:7077``, ``yarn``, ``k8s://...``), with workers on this
    Python (or on ``$PYSPARK_PYTHON`` when set), unless ``spark.pyspark.python`` in ``conf``
    names another (it is put in ``$PYSPARK_PYTHON``: a session built from Python reads only
    that).

    An embedded session binds to loopback. On a cluster, executors connect back to the driver:
    Spark picks this machine's address, or set ``spark.driver.host`` (and
    ``spark.driver.bindAddress``) in ``conf``, which is applied last and may set anything
    (docs/spark-cluster.md). Arrow batches are capped at 256 rows: ``read_blob`` returns one
    blob per row, so with multi-MB blobs a default 10,000-row batch would need tens of GB. Set
    the same (``spark.sql.execution.arrow.maxRecordsPerBatch``) on sessions you build yourself.
    Spark's console progress bar is off when standard error is not a terminal (a log file).
    """
    # Spark starts its JVM and Python workers by fork+exec; lance warns on every fork although
    # nothing of lance runs in those children before exec
    warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
    # a session built from Python starts its workers with $PYSPARK_PYTHON and ignores
    # spark.pyspark.python (only spark-submit reads it): the setting goes to the environment
    python = (conf or {}).get("spark.pyspark.python")
    if python:
        os.environ["PYSPARK_PYTHON"] = python
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
        .config("spark.driver.memory", driver_memory)
        # read_blob returns one blob per input row: a batch of 10k multi-MB blobs is too big
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_RECORDS_PER_BATCH))
    )
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not _is_terminal(sys.stderr):  # its bar redraws with \r: a log file gets a line per redraw
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@spark_entry_point
def register(
    spark: SparkSession,
    storage_options: Mapping[str, str] | None = None,
    check_hashes: bool = True,
) -> None:
    """Register the ``blobhouse`` data source and the SQL functions ``read_blob``/``blob_size``.
    ``read_blob`` reads object stores with ``storage_options`` (an S3 endpoint, credentials)
    and checks each payload against the blake3 its reference carries unless ``check_hashes``
    is False. Spark finds the data source through the calling thread's active session: a
    thread of your own that uses ``format("blobhouse")`` calls this first (it is cheap, and
    idempotent).
    """
    ensure_registered(spark)
    spark.udf.register("read_blob", read_blob_function(storage_options, check_hashes))
    spark.udf.register("blob_size", blob_size)


@spark_entry_point
@option_keywords(write_options=(WriteOptions, ("blob_columns", "ref_id_columns", "dedup")))
def write_table(
    df: DataFrame,
    uri: str,
    *,
    mode: str = "append",
    write_options: WriteOptions | None = None,
    colocate_by: str | None = None,
    partitions: int | None = None,
    options: Mapping[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Write ``df`` with rows that share a payload brought into the same task first.

    Per-file dedup only sees rows written by one task. This shuffles the rows by the column
    ``colocate_by`` (default: the first blob column whose dedup is on) -- by its ref_id column
    in ``ref_id`` mode, else by a hash of its bytes computed on the executors -- and sorts each
    partition by that key, so each payload is written once whatever the input partitioning.
    Cost: one shuffle of the rows, payload bytes included. Plain ``df.write`` is enough when
    rows that share payloads already sit in the same partition, or when duplicates are rare.
    Columns written with ``dedup="global"`` (a new table's default) are stored first, each
    distinct payload once, and the rows then carry references (:mod:`blobhouse.spark.lookup`):
    they need no colocation.

    ``write_options`` is a :class:`~blobhouse.options.WriteOptions` (as delta-rs's
    ``write_deltalake(..., writer_properties=)``): every field reaches the data source as its
    writer option; ``blob_columns=``, ``ref_id_columns=`` and ``dedup=`` are its keywords, sugar
    building it (not both). ``options`` are Spark writer options (text), as ``df.write
    .option(...)`` takes them; one naming a field the object sets too wins, as before. Options
    left out are the table's properties. ``storage_options`` reach the table's object store
    (as ``storage.<name>`` writer options).
    """
    if mode not in ("append", "overwrite"):
        raise InvalidInputError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    check_options(options or {}, WRITE_OPTIONS, "blobhouse write option")
    given = as_options(WriteOptions, write_options, "write option")
    blob_columns = given.blob_columns
    # before any payload is stored (dedup="global" stores them before the rows)
    check_column_names(to_arrow_schema(df.schema), "the DataFrame")
    _check_columns(df, [*blob_columns, *([colocate_by] if colocate_by else [])])
    options_checked = checked_options(storage_options)
    location = TableLocation.of(uri, storage_options=options_checked)
    resolved = _resolved(location, options_checked, mode, given)
    ref_id_columns = dict(resolved.ref_id_columns or {})
    key_column = colocate_by or _default_colocation(df, blob_columns, resolved.dedup)
    writer_options = {
        "blob_columns": "",
        **spark_writer_options(given),
        **dict(options or {}),
        **storage_prefixed(storage_options),
    }
    if partitions is not None:
        SETTINGS["partitions"].check(partitions)
    count = max(1, partitions or df.rdd.getNumPartitions())  # an empty DataFrame has none
    ensure_registered(df.sparkSession)

    def colocated(df: DataFrame) -> DataFrame:
        if key_column is None:
            return df
        key_mode = mode_of(resolved.dedup, key_column)
        key = _colocation_key(df, key_column, key_mode, ref_id_columns.get(key_column))
        return (
            df.withColumn(_COLOCATE_KEY, key)
            .repartition(count, _COLOCATE_KEY)
            .sortWithinPartitions(_COLOCATE_KEY)
            .drop(_COLOCATE_KEY)
        )

    stored_globally = _global_columns(df, blob_columns, resolved.dedup)
    if not stored_globally:
        colocated(df).write.format("blobhouse").mode(mode).options(**writer_options).save(
            location.dataset_path
        )
        return
    # the store packs and the rows' data files are staged under one transaction's prefix; the
    # data source's commit (its begin_write gets the write's id) records what was stored
    txn = Transaction.start(location, None, options_checked)

    def store() -> tuple[DataFrame, list]:
        limit = _pack_limit(writer_options, stored_globally)
        return store_payloads_first(
            df, location, stored_globally, txn.name_prefix, limit, count, options_checked
        )

    def write_rows(joined: DataFrame, _begin: object) -> None:
        writer_options.update(store_index="joined", write_id=txn.id)
        colocated(joined).write.format("blobhouse").mode(mode).options(**writer_options).save(
            location.dataset_path
        )

    run_store_first(txn, store, write_rows)


def _check_columns(df: DataFrame, columns: Sequence[str]) -> None:
    """Refuse column names (``parent.child`` inside structs) the DataFrame lacks, naming the
    closest one."""
    for name in columns:
        if name.split(".")[0] not in df.columns:
            near = closest(name, df.columns)
            hint = f" (did you mean {near!r}?)" if near else ""
            raise SchemaError(
                f"column {name!r} is not in the DataFrame{hint}; its columns: {df.columns}"
            )


def _resolved(
    location: TableLocation,
    storage_options: Mapping[str, str] | None,
    mode: str,
    given: WriteOptions,
) -> WriteOptions:
    """The options a write uses (its dedup modes and ref_id columns, say): the table's
    properties, checked against what the call gives (a conflict is refused before Spark runs
    anything)."""
    dataset = open_dataset(location, None, dict(storage_options or {}) or None, "write to")
    if dataset is None:  # no table yet: the write creates it
        return TableProperties().for_new_table(given)
    properties = kept_properties(dataset, appending=mode == "append")
    if mode == "append":
        return properties.resolve(given, properties.blob_columns)
    return properties.for_new_table(given, properties.blob_columns)


def _pack_limit(writer_options: Mapping[str, str], columns: Sequence[str]) -> int:
    """The store's pack size: the smallest ``pack_file_size_threshold`` the write gives
    ``columns`` (for every blob column, or in ``placement``), else the default."""
    placement = parsed_write_options(writer_options).placement or {}
    default = SETTINGS["pack_file_size_threshold"].default
    sizes = [
        {**placement.get("*", {}), **placement.get(c, {})}.get("pack_file_size_threshold")
        for c in columns
    ]
    return min((default if size is None else size) for size in sizes) if sizes else default


def _global_columns(
    df: DataFrame, blob_columns: Sequence[str], dedup: str | Mapping[str, str]
) -> list[str]:
    """Top-level blob columns written with ``dedup="global"``."""
    candidates = list(blob_columns) + [
        f.name for f in df.schema.fields if _looks_like_blob_struct(f.dataType)
    ]
    return [c for c in dict.fromkeys(candidates) if "." not in c and mode_of(dedup, c) == "global"]


def _default_colocation(
    df: DataFrame, blob_columns: Sequence[str], dedup: str | Mapping[str, str]
) -> str | None:
    candidates = list(blob_columns) + [
        f.name for f in df.schema.fields if _looks_like_blob_struct(f.dataType)
    ]
    for name in candidates:
        mode = mode_of(dedup, name)
        # global columns are stored before the rows move: only per-file dedup needs colocation
        if mode not in ("off", "global") and "." not in name:
            return name
    return None


def _colocation_key(df: DataFrame, column: str, mode: str, ref_column: str | None):
    field = df.schema[column].dataType
    if mode == "ref_id":
        if ref_column is not None:
            return F.col(ref_column)
        if _looks_like_blob_struct(field) and "ref_id" in field.fieldNames():
            return F.col(f"{column}.ref_id")
        raise InvalidInputError(
            f"dedup='ref_id' on {column!r} needs ref_ids: a ref_id field or ref_id_columns"
        )
    if _looks_like_blob_struct(field):
        return F.xxhash64(F.col(f"{column}.data"), F.col(f"{column}.uri"))
    return F.xxhash64(F.col(column))


def _looks_like_blob_struct(data_type) -> bool:
    names = getattr(data_type, "fieldNames", lambda: [])()
    return names[:2] == ["data", "uri"]


@spark_entry_point
def backfill_blob_column(
    spark: SparkSession,
    table_uri: str,
    column: str,
    fn: BlobFunction,
    *,
    dedup: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Compute blob ``column`` for every fragment of a table in parallel, one Spark task per
    fragment, and commit every new data file in one transaction.

    ``fn`` maps an Arrow batch of a fragment's non-blob columns to one blob value per row (it
    is shipped to the executors). A failed task, or a failed commit, leaves the table unchanged
    and removes what the tasks wrote; a task still running when the job failed removes its own
    file when it ends (an abort marker tells it, which gc removes later, as after a failed
    Spark write).
    """
    options = checked_options(storage_options)
    opened = open_snapshot(table_uri, None, options)
    if column in opened.blob_columns and "." in column:
        # a nested blob column is rewritten with its struct, as Table.backfill_blob_column does
        from blobhouse.spark.mutations import update

        update(spark, table_uri, {column: fn}, dedup=dedup, storage_options=options)
        return
    dedup = opened.properties.change_mode(column, dedup)  # the column's own, else the table's
    backfill(opened, column, dedup, fn, runner=SparkTasks(spark))
