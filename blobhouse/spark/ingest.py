"""Ingest: load rows from a manifest (JSONL, CSV or Parquet) whose blob fields name files or
URIs, and write them as a blob table on Spark. Rows naming the same file store it once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from blobhouse.errors import InvalidInputError
from blobhouse.placement import normalize_uri
from blobhouse.spark.datasource import storage_prefixed
from blobhouse.storage import StorageOptions, checked_options, object_store

FORMATS = ("jsonl", "csv", "parquet")


def read_manifest(spark: SparkSession, manifest: str, fmt: str | None = None) -> DataFrame:
    """The manifest as a DataFrame; the format comes from ``fmt`` or the file extension."""
    fmt = fmt or _format_of(manifest)
    if fmt == "jsonl":
        return spark.read.json(manifest)
    if fmt == "csv":
        return spark.read.option("header", "true").option("inferSchema", "true").csv(manifest)
    if fmt == "parquet":
        return spark.read.parquet(manifest)
    raise InvalidInputError(f"unknown manifest format {fmt!r}; use one of {FORMATS}")


def ingest(
    spark: SparkSession,
    manifest: str,
    table: str,
    blob_columns: Sequence[str],
    *,
    fmt: str | None = None,
    mode: str = "append",
    partitions: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Load the files named in ``blob_columns`` of ``manifest`` and append them to ``table``.

    Relative paths are resolved against the manifest's directory. Rows are first grouped by the
    files they name (a shuffle of the small manifest rows, not of the bytes), so every task sees
    all rows of a file and per-file content dedup stores each file once.
    ``storage_options`` reach the table and the files the manifest names on an object store
    (Spark reads the manifest itself: a local path, or a URI its Hadoop filesystems know).
    """
    options = checked_options(storage_options)
    rows = read_manifest(spark, manifest, fmt)
    missing = [c for c in blob_columns if c not in rows.columns]
    if missing:
        raise InvalidInputError(f"manifest {manifest} has no column(s) {missing}: {rows.columns}")
    for name in blob_columns:
        if not isinstance(rows.schema[name].dataType, StringType):
            raise InvalidInputError(
                f"manifest column {name!r} must hold file paths or URIs (strings), got "
                f"{rows.schema[name].dataType.simpleString()}"
            )
    base = os.path.dirname(os.path.abspath(manifest)) if "://" not in manifest else None
    count = partitions or max(1, rows.rdd.getNumPartitions())
    grouped = rows.repartition(count, *[F.col(c) for c in blob_columns[:1]]).sortWithinPartitions(
        *blob_columns[:1]
    )
    out_schema = StructType(
        [
            StructField(f.name, BinaryType()) if f.name in blob_columns else f
            for f in grouped.schema.fields
        ]
    )
    names = list(blob_columns)

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            arrays = [
                _load_files(batch.column(n), base, n, options) if n in names else batch.column(n)
                for n in batch.schema.names
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)

    loaded = grouped.mapInArrow(load, out_schema)
    (
        loaded.write.format("blobhouse")
        .mode(mode)
        .option("blob_columns", ",".join(blob_columns))
        .options(**storage_prefixed(options))
        .save(table)
    )


def _load_files(
    paths: pa.Array, base: str | None, column: str, options: StorageOptions | None
) -> pa.Array:
    """The bytes of every file named in ``paths`` (each distinct file read once)."""
    cache: dict[str, bytes] = {}
    out = []
    for path in paths.to_pylist():
        if path is None:
            out.append(None)
            continue
        if path not in cache:
            cache[path] = _read_file(_resolve(path, base), column, options)
        out.append(cache[path])
    return pa.array(out, pa.binary())


def _resolve(path: str, base: str | None) -> str:
    if "://" in path or os.path.isabs(path) or base is None:
        return normalize_uri(path)
    return normalize_uri(os.path.join(base, path))


def _read_file(uri: str, column: str, options: StorageOptions | None) -> bytes:
    store = object_store(uri, options)
    try:
        size = store.size(uri)
        if size is None:
            raise FileNotFoundError("no such file")
        source = store.open(uri)
        try:
            return source.read(0, size)
        finally:
            source.close()
    except OSError as exc:
        raise InvalidInputError(f"manifest column {column!r}: cannot read {uri}: {exc}") from None


def _format_of(manifest: str) -> str:
    name = manifest.rstrip("/").lower()
    for ext, fmt in (
        (".jsonl", "jsonl"),
        (".json", "jsonl"),
        (".csv", "csv"),
        (".parquet", "parquet"),
    ):
        if name.endswith(ext):
            return fmt
    raise InvalidInputError(
        f"cannot tell the format of manifest {manifest!r}; pass --format ({', '.join(FORMATS)})"
    )
