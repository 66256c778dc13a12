"""Ingest: load rows from a manifest (JSONL, CSV or Parquet) whose blob columns name files or
URIs, and write them as a blob table on Spark.

Two steps. :func:`plan_ingest` runs on the driver without Spark: it reads the manifest with
pyarrow, checks its format, its blob columns and that every file it names exists, and (when
appending) casts its columns to the table's types, so a bad manifest fails in a second with
one message naming the row, column and path. :meth:`IngestPlan.run` then loads the files on the
executors and writes them in one commit. :func:`ingest` does both.

What the table gets: the manifest's rows in manifest order, its columns in manifest order
(JSONL: in the order keys first appear), each blob column holding the file's bytes, and next to
it a string column ``<blob column>_path`` with the path or URI exactly as the manifest wrote it
(``drop_path_columns=True`` leaves those out). With ``managed=True`` the blob columns reference
the files in place instead, and the table takes ownership of them (``Blob(uri, managed=True)``
rows: gc deletes a file once no retained version references it; docs/managed-objects.md).
"""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from blobhouse.columns import check_column_names
from blobhouse.errors import InvalidInputError, TableNotFoundError
from blobhouse.io.objects import (
    StorageOptions,
    checked_options,
    is_local,
    long_name,
    object_store,
    read_object,
    uri_to_path,
)
from blobhouse.io.uris import normalize_uri
from blobhouse.layout import TableLocation
from blobhouse.maintenance.reports import IngestReport
from blobhouse.placement import AllowedBases
from blobhouse.progress import ProgressCallback
from blobhouse.settings import SETTINGS
from blobhouse.write import check_target

FORMATS = ("jsonl", "csv", "parquet")
#: dedup modes ingest offers (``ref_id`` needs ref ids, which a manifest's paths do not carry)
DEDUP_MODES = ("content", "global", "off")
MODES = ("append", "overwrite")
#: the path column kept beside blob column ``c`` is named ``c + PATH_SUFFIX``
PATH_SUFFIX = "_path"
#: a task loads about this many bytes of distinct files (rows stay in manifest order, so
#: per-file dedup sees the rows of one task; ``dedup="global"`` dedups across tasks) ...
TASK_BYTES = 1 << 30
#: ... and writes at most this many rows (what bounds a task that references files in place)
TASK_ROWS = 1 << 20
#: Arrow batches handed to the writer hold at most this many bytes (or one row) ...
BATCH_BYTES = 64 << 20
#: ... and at most this many rows
BATCH_ROWS = 256
#: an executor keeps files it read up to this many bytes, for rows naming them again
CACHE_BYTES = 256 << 20


@dataclass
class IngestPlan:
    """A checked manifest, ready to be written by :meth:`run`.

    ``rows``: the manifest's rows in order, cast to the table's types when appending; blob
    columns hold the resolved URIs of the files (``path columns`` the paths as written).
    ``sizes``: the size of every distinct file.
    """

    manifest: str
    table: str
    rows: pa.Table
    blob_columns: list[str]
    path_columns: dict[str, str]
    sizes: dict[str, int]
    mode: str
    dedup: str | None  # None: the table's (a new table: "global")
    storage_options: StorageOptions | None
    managed: bool = False  # reference the files in place; the table owns them
    allowed_bases: list[str] | None = None  # the table's, when this ingest creates it

    @property
    def logical_bytes(self) -> int:
        """Bytes the rows reference (a file named by n rows counts n times)."""
        return sum(
            self.sizes[uri]
            for name in self.blob_columns
            for uri in self.rows.column(name).to_pylist()
            if uri is not None
        )

    def ranges(self, partitions: int | None = None) -> list[tuple[int, int]]:
        """Consecutive row ranges, one per Spark task: ``partitions`` of them, or cut where a
        range's distinct files reach :data:`TASK_BYTES` (files referenced in place weigh
        nothing) or its rows :data:`TASK_ROWS`."""
        count = self.rows.num_rows
        if count == 0:
            return []
        if partitions is not None:
            partitions = SETTINGS["partitions"].check(partitions)
            step = -(-count // min(partitions, count))
            return [(start, min(start + step, count)) for start in range(0, count, step)]
        uris = [self.rows.column(name).to_pylist() for name in self.blob_columns]
        ranges, start, seen, held = [], 0, set(), 0
        for row in range(count):
            for column in uris:
                uri = column[row]
                if uri is not None and uri not in seen:
                    seen.add(uri)
                    held += 0 if self.managed else self.sizes[uri]
            full = held >= TASK_BYTES or row + 1 - start >= TASK_ROWS
            if full and row + 1 < count:
                ranges.append((start, row + 1))
                start, seen, held = row + 1, set(), 0
        ranges.append((start, count))
        return ranges

    def run(
        self,
        spark,
        *,
        partitions: int | None = None,
        progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Load the files on the executors and write the rows in one commit (Ctrl-C cancels
        the write and removes what its tasks staged: :func:`blobhouse.spark.jobs.run_spark_job`).
        Returns a report: the table's version, rows and bytes, what this ingest added."""
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        from blobhouse.spark.datasource import ensure_registered, storage_prefixed
        from blobhouse.spark.jobs import amounts_counter, run_spark_job
        from blobhouse.table import open_table

        ranges = self.ranges(partitions)
        if not ranges:
            raise InvalidInputError(f"manifest {self.manifest} has no rows")
        blob_type = MANAGED_REFERENCE if self.managed else pa.binary()
        out_schema = pa.schema(
            [
                pa.field(f.name, blob_type) if f.name in self.blob_columns else f
                for f in self.rows.schema
            ]
        )
        spark_schema = from_arrow_schema(out_schema)
        shared = spark.sparkContext.broadcast(self.rows)
        loader = _Loader(
            shared,
            ranges,
            self.blob_columns,
            to_arrow_schema(spark_schema),
            self.storage_options,
            self.managed,
            counter := amounts_counter(spark),
        )
        tasks = spark.range(len(ranges), numPartitions=len(ranges))
        ensure_registered(spark)
        writer = (
            tasks.mapInArrow(loader, spark_schema)
            .write.format("blobhouse")
            .mode(self.mode)
            .option("blob_columns", ",".join(self.blob_columns))
            .options(**({"dedup": self.dedup} if self.dedup is not None else {}))
            .options(**storage_prefixed(self.storage_options))
        )
        if self.allowed_bases is not None:
            writer = writer.option("allowed_bases", ",".join(self.allowed_bases))
        try:
            run_spark_job(
                spark,
                lambda: writer.save(self.table),
                step="ingest",
                progress=progress,
                counted=counter,
            )
        finally:
            shared.unpersist()
        table = open_table(self.table, storage_options=self.storage_options)
        stats = table.stats()
        return {
            "table": self.table,
            "manifest": self.manifest,
            "version": stats["version"],
            "mode": self.mode,
            "dedup": {c: table.properties.dedup_of(c) for c in self.blob_columns},
            "managed": self.managed,
            "ingested_rows": self.rows.num_rows,
            "files": len(self.sizes),
            "ingested_bytes": self.logical_bytes,
            "path_columns": list(self.path_columns.values()),
            "tasks": len(ranges),
            "rows": stats["rows"],
            "logical_bytes": stats["logical_bytes"],
            "physical_bytes": stats["physical_bytes"],
            "dedup_ratio": stats["dedup_ratio"],
            "columns": {
                name: {k: v for k, v in column.items() if k != "kinds"}
                for name, column in stats["columns"].items()
            },
        }


def plan_ingest(
    manifest: str,
    table: str,
    blob_columns: Sequence[str],
    *,
    fmt: str | None = None,
    mode: str = "append",
    dedup: str | None = None,
    drop_path_columns: bool = False,
    storage_options: Mapping[str, str] | None = None,
    managed: bool = False,
    allowed_bases: Sequence[str] | None = None,
) -> IngestPlan:
    """Read and check ``manifest`` on the driver (pyarrow, no Spark), or raise
    :class:`InvalidInputError` naming the problem: the manifest missing or unreadable, not
    ``fmt`` (by default told by its extension), a blob column missing or not holding strings,
    a file it names missing (row, column and path), or, when appending, a column whose values
    cannot be cast to the table's type. Relative paths are resolved against the manifest's
    directory; files on an object store are checked with one HEAD request each.

    ``managed``: reference the files in place and hand them to the table instead of copying
    their bytes; every file must lie under the table's allowed bases (``allowed_bases``, when
    the ingest creates or overwrites the table) and outside the table."""
    options = checked_options(storage_options)
    blob_columns = list(blob_columns)
    if mode not in MODES:
        raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}")
    if dedup is not None and dedup not in DEDUP_MODES:
        raise InvalidInputError(f"dedup must be one of {DEDUP_MODES} for ingest, got {dedup!r}")
    if managed and dedup is not None:
        raise InvalidInputError(
            f"dedup={dedup!r} does not apply to a managed ingest: the files are referenced in "
            "place, never copied (leave dedup at its default)"
        )
    if not blob_columns:
        raise InvalidInputError("name at least one blob column (the columns holding paths)")
    check_target(table, storage_options=options)  # a file or a folder of others in the way
    if len(set(blob_columns)) != len(blob_columns):
        raise InvalidInputError(f"blob columns named twice: {blob_columns}")
    fmt = fmt or _format_of(manifest)
    rows = read_manifest(manifest, fmt, options)
    check_column_names(rows.schema, f"manifest {manifest}")  # its columns become the table's
    missing = [c for c in blob_columns if c not in rows.column_names]
    if missing:
        raise InvalidInputError(
            f"manifest {manifest} has no column(s) {missing}; its columns: {rows.column_names}"
        )
    for name in blob_columns:
        dtype = rows.schema.field(name).type
        if (
            not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype))
            and dtype != pa.null()
        ):
            raise InvalidInputError(
                f"manifest column {name!r} must hold file paths or URIs (strings), got {dtype}"
            )
    path_columns = {} if drop_path_columns else {c: c + PATH_SUFFIX for c in blob_columns}
    taken = [p for p in path_columns.values() if p in rows.column_names]
    if taken:
        raise InvalidInputError(
            f"manifest {manifest} already has column(s) {taken}, the names of the path columns "
            "ingest keeps; rename them, or drop the path columns (--drop-path-columns)"
        )
    base = _base_of(manifest)
    resolved = {name: _resolve_column(manifest, rows, name, base) for name in blob_columns}
    sizes = _check_files(manifest, resolved, rows, options)
    bases = None
    if managed:
        bases = _reference_bases(table, mode, allowed_bases, options)
        _check_under_bases(manifest, resolved, rows, bases)
    elif allowed_bases is not None:
        bases = AllowedBases(allowed_bases)
    columns, names = [], []
    for name in rows.column_names:
        column = rows.column(name)
        if name in resolved:
            columns.append(pa.chunked_array([pa.array(resolved[name], pa.string())]))
            names.append(name)
            if name in path_columns:
                columns.append(column.cast(pa.string()))
                names.append(path_columns[name])
        else:
            columns.append(column.cast(pa.string()) if column.type == pa.null() else column)
            names.append(name)
    staged = pa.Table.from_arrays(columns, names=names)
    if mode == "append":
        staged = _cast_to_table(manifest, table, staged, blob_columns, path_columns, options)
    return IngestPlan(
        manifest,
        table,
        staged,
        blob_columns,
        path_columns,
        sizes,
        mode,
        dedup,
        options,
        managed,
        None if allowed_bases is None else bases.bases,
    )


def _reference_bases(
    table: str, mode: str, given: Sequence[str] | None, options: StorageOptions | None
) -> AllowedBases:
    """The bases a managed ingest's files must lie under: ``given`` (the new table's, or
    those an overwrite sets), else the existing table's; an append cannot change them."""
    from blobhouse.table import open_table

    root = TableLocation.of(table, storage_options=options).root_uri
    try:
        existing = open_table(table, storage_options=options).schema
    except TableNotFoundError:
        existing = None
    kept = AllowedBases.of_table(existing, root)
    bases = kept if given is None else AllowedBases(given, root)
    appending = mode == "append" and existing is not None
    if appending and set(bases.bases) | set(kept.managed) != set(kept.bases):
        raise InvalidInputError(
            f"table {table} allows external objects under {kept.bases or 'no base'}; its "
            "allowed bases are set when it is created or overwritten, not by an append"
        )
    bases = kept if appending else bases
    if not bases:
        raise InvalidInputError(
            f"a managed ingest references the files in place: name the folders table {table} "
            "may reference (allowed_bases / --allowed-bases DIR[,DIR...]) when it is created"
        )
    return bases


def _check_under_bases(
    manifest: str,
    resolved: Mapping[str, list[str | None]],
    rows: pa.Table,
    bases: AllowedBases,
) -> None:
    """An error naming the first row whose file lies outside ``bases`` (or inside the table)."""
    for name, uris in resolved.items():
        for row, uri in enumerate(uris):
            if uri is None:
                continue
            _, problem = bases.resolve(uri)
            if problem:
                written = rows.column(name)[row].as_py()
                raise InvalidInputError(
                    f"manifest {manifest} row {row + 1}, column {name!r}: {written}: managed "
                    f"{problem}"
                )


def ingest(
    spark,
    manifest: str,
    table: str,
    blob_columns: Sequence[str],
    *,
    fmt: str | None = None,
    mode: str = "append",
    dedup: str | None = None,
    drop_path_columns: bool = False,
    partitions: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
    managed: bool = False,
    allowed_bases: Sequence[str] | None = None,
) -> IngestReport:
    """Load the files named in ``blob_columns`` of ``manifest`` into ``table`` (created when
    missing; ``mode="overwrite"`` replaces its rows) and return a report.

    The manifest is checked first, on the driver (:func:`plan_ingest`); rows keep their
    manifest order, split into consecutive ranges, one Spark task each (``partitions`` of them,
    or one per ~1 GiB of distinct files); ``dedup`` (default: the table's, ``"global"`` for a
    new table) stores a file once per table (``"global"``), once per task (``"content"``) or
    once per row (``"off"``). ``storage_options``
    reach the table, the manifest and the files on an object store. ``managed=True``
    references the files in place and hands them to the table (they must lie under
    ``allowed_bases``, or the existing table's); gc deletes each once no retained version
    references it.

    >>> import os, tempfile, json
    >>> root = tempfile.mkdtemp()
    >>> with open(f"{root}/a.jpg", "wb") as f:
    ...     _ = f.write(os.urandom(1000))
    >>> with open(f"{root}/rows.jsonl", "w") as f:
    ...     _ = f.write("".join(json.dumps({"id": i, "image": "a.jpg"}) + "\\n" for i in range(3)))
    >>> report = ingest(spark, f"{root}/rows.jsonl", f"{root}/table", ["image"])
    >>> report["rows"], report["physical_bytes"], report["path_columns"]
    (3, 1000, ['image_path'])
    """
    plan = plan_ingest(
        manifest,
        table,
        blob_columns,
        fmt=fmt,
        mode=mode,
        dedup=dedup,
        drop_path_columns=drop_path_columns,
        storage_options=storage_options,
        managed=managed,
        allowed_bases=allowed_bases,
    )
    return plan.run(spark, partitions=partitions, progress=progress)


def read_manifest(
    manifest: str, fmt: str | None = None, storage_options: StorageOptions | None = None
) -> pa.Table:
    """The manifest's rows, read with pyarrow in file order; JSONL columns in the order their
    keys first appear. ``fmt`` defaults to what the file extension says."""
    fmt = fmt or _format_of(manifest)
    if fmt not in FORMATS:
        raise InvalidInputError(f"unknown manifest format {fmt!r}; use one of {FORMATS}")
    local = is_local(manifest)
    path = uri_to_path(manifest) if local else manifest
    if local and os.path.isdir(path):
        if fmt != "parquet":
            raise InvalidInputError(f"manifest {manifest} is a directory; give a {fmt} file")
        data = None
    else:
        data = _read_bytes(manifest, path, local, storage_options)
    try:
        if fmt == "jsonl":
            import pyarrow.json as pj

            return pj.read_json(io.BytesIO(data))
        if fmt == "csv":
            import pyarrow.csv as pc

            return pc.read_csv(
                io.BytesIO(data), convert_options=pc.ConvertOptions(strings_can_be_null=True)
            )
        import pyarrow.parquet as pq

        return pq.read_table(path if data is None else io.BytesIO(data))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInputError(f"manifest {manifest} is not valid {fmt}: {reason}") from None


def _read_bytes(manifest: str, path: str, local: bool, options: StorageOptions | None) -> bytes:
    if local:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise InvalidInputError(f"manifest {manifest}: no such file") from None
        except PermissionError:
            raise InvalidInputError(f"manifest {manifest}: permission denied") from None
        except OSError as exc:
            raise InvalidInputError(f"manifest {manifest}: cannot read: {exc}") from None
    try:
        return read_object(normalize_uri(manifest), options)
    except FileNotFoundError:
        raise InvalidInputError(f"manifest {manifest}: no such object") from None
    except OSError as exc:
        raise InvalidInputError(f"manifest {manifest}: cannot read: {exc}") from None


def _base_of(manifest: str) -> str:
    """Where relative paths of the manifest start: its directory (or URI prefix)."""
    if is_local(manifest):
        return os.path.dirname(os.path.abspath(uri_to_path(manifest)))
    return manifest.rstrip("/").rsplit("/", 1)[0]


def _resolve_column(manifest: str, rows: pa.Table, name: str, base: str) -> list[str | None]:
    resolved = []
    for row, path in enumerate(rows.column(name).to_pylist()):
        if path is None:
            resolved.append(None)
            continue
        if not path.strip():
            raise InvalidInputError(
                f"manifest {manifest} row {row + 1}, column {name!r}: empty path"
            )
        try:
            resolved.append(_resolve(path, base))
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"manifest {manifest} row {row + 1}, column {name!r}: {exc}"
            ) from None
    return resolved


def _resolve(path: str, base: str) -> str:
    if "://" in path or os.path.isabs(path):
        return normalize_uri(path)
    if "://" in base:
        return normalize_uri(f"{base}/{path}")
    return normalize_uri(os.path.join(base, path))


def _check_files(
    manifest: str,
    resolved: Mapping[str, list[str | None]],
    rows: pa.Table,
    options: StorageOptions | None,
) -> dict[str, int]:
    """The size of every distinct file, or an error naming the first row whose file is missing
    (and how many more are)."""
    first: dict[str, tuple[int, str]] = {}
    for name, uris in resolved.items():
        for row, uri in enumerate(uris):
            if uri is not None and uri not in first:
                first[uri] = (row, name)
    local = [uri for uri in first if is_local(uri)]
    remote = [uri for uri in first if not is_local(uri)]
    sizes: dict[str, int | str] = {uri: _local_size(uri) for uri in local}
    if remote:
        with ThreadPoolExecutor(16) as pool:
            sizes.update(
                zip(remote, pool.map(lambda u: _remote_size(u, options), remote), strict=True)
            )
    problems = sorted(
        (first[uri], uri, problem) for uri, problem in sizes.items() if isinstance(problem, str)
    )
    if problems:
        (row, name), uri, problem = problems[0]
        written = rows.column(name)[row].as_py()
        shown = written if written == uri else f"{written} ({uri})"
        more = f" (and {len(problems) - 1} more missing or unreadable)" if len(problems) > 1 else ""
        raise InvalidInputError(
            f"manifest {manifest} row {row + 1}, column {name!r}: {problem}: {shown}{more}"
        )
    return sizes  # type: ignore[return-value]


def _local_size(uri: str) -> int | str:
    problem = long_name(uri)
    if problem is not None:
        return problem
    path = uri_to_path(uri)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if not os.path.isfile(path):
        return "not a file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return info.st_size


def _remote_size(uri: str, options: StorageOptions | None) -> int | str:
    try:
        size = object_store(uri, options).size(uri)
    except Exception as exc:  # credentials, endpoint, network: the message says which
        return (
            f"cannot reach ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        )
    return "no such object" if size is None else size


def _cast_to_table(
    manifest: str,
    table: str,
    staged: pa.Table,
    blob_columns: Sequence[str],
    path_columns: Mapping[str, str],
    options: StorageOptions | None,
) -> pa.Table:
    """``staged`` with the existing table's column order and types (a CSV manifest appended
    to a table a JSONL one made, int32 to int64, ...); unchanged if there is no table yet."""
    from blobhouse.table import open_table

    try:
        schema = open_table(table, storage_options=options).schema
    except TableNotFoundError:
        return staged
    ours, theirs = staged.column_names, schema.names
    lacking = [n for n in theirs if n not in ours]
    extra = [n for n in ours if n not in theirs]
    if lacking or extra:
        hint = ""
        if any(n.endswith(PATH_SUFFIX) for n in lacking + extra):
            hint = (
                f" (path columns {PATH_SUFFIX!r}: the table was written "
                + ("without" if extra else "with")
                + " them; "
                + ("pass --drop-path-columns)" if extra else "do not pass --drop-path-columns)")
            )
        raise InvalidInputError(
            f"manifest {manifest} does not match table {table}: "
            + "; ".join(
                part
                for part in (
                    f"the table has column(s) {lacking} the manifest lacks" if lacking else "",
                    f"the manifest has column(s) {extra} the table lacks" if extra else "",
                )
                if part
            )
            + hint
        )
    columns = []
    for field in schema:
        column = staged.column(field.name)
        if field.name in blob_columns or column.type == field.type:
            columns.append(column)
            continue
        try:
            columns.append(column.cast(field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            reason = str(exc).strip().splitlines()[0]
            raise InvalidInputError(
                f"manifest {manifest} column {field.name!r} ({column.type}) cannot be cast to "
                f"table {table}'s type {field.type}: {reason}"
            ) from None
    return pa.Table.from_arrays(columns, names=theirs)


#: what a managed ingest writes in a blob column: the file's uri, handed to the table
MANAGED_REFERENCE = pa.struct(
    [("data", pa.binary()), ("uri", pa.string()), ("managed", pa.bool_())]
)


class _Loader:
    """For ``mapInArrow`` over ``spark.range(tasks)``: task ``i`` reads rows ``ranges[i]`` of
    the broadcast manifest and yields them, in order, with every blob column's files loaded
    (``managed``: with every blob column a managed reference to its file)."""

    def __init__(
        self, rows, ranges, blob_columns, schema, options, managed=False, counter=None
    ) -> None:
        self.rows, self.ranges, self.blob_columns = rows, ranges, list(blob_columns)
        self.schema, self.options, self.managed = schema, options, managed
        self.counter = counter  # of the rows and loaded bytes, for progress

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from blobhouse.spark.jobs import counted_batches

        counted = () if self.managed else self.blob_columns
        yield from counted_batches(self._batches(batches), self.counter, counted)

    def _batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = self.rows.value
        cache = _FileCache(CACHE_BYTES)
        for batch in batches:
            for task in batch.column("id").to_pylist():
                start, stop = self.ranges[task]
                if self.managed:
                    yield from self._reference(rows.slice(start, stop - start))
                else:
                    yield from self._load(rows.slice(start, stop - start), cache)

    def _reference(self, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        for part in rows.to_batches(max_chunksize=BATCH_ROWS * 64):
            arrays = [
                _managed_references(part.column(name))
                if name in self.blob_columns
                else part.column(name)
                for name in part.schema.names
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=part.schema.names).cast(self.schema)

    def _load(self, rows: pa.Table, cache: _FileCache) -> Iterator[pa.RecordBatch]:
        uris = {name: rows.column(name).to_pylist() for name in self.blob_columns}
        start, loaded, held = 0, {name: [] for name in self.blob_columns}, 0
        for row in range(rows.num_rows):
            for name, column in uris.items():
                uri = column[row]
                data = None if uri is None else cache.get(uri, self._reader(uri, name))
                loaded[name].append(data)
                held += len(data or b"")
            if held >= BATCH_BYTES or row + 1 - start >= BATCH_ROWS or row + 1 == rows.num_rows:
                part = rows.slice(start, row + 1 - start)
                arrays = [
                    pa.array(loaded[name], pa.binary())
                    if name in loaded
                    else part.column(name).combine_chunks()
                    for name in part.column_names
                ]
                yield pa.RecordBatch.from_arrays(arrays, names=part.column_names).cast(self.schema)
                start, loaded, held = row + 1, {name: [] for name in self.blob_columns}, 0

    def _reader(self, uri: str, column: str) -> Callable[[], bytes]:
        return lambda: _read_file(uri, column, self.options)


def _managed_references(uris: pa.Array) -> pa.StructArray:
    """``struct<data: null, uri, managed: true>`` per uri (null where the uri is)."""
    return pa.StructArray.from_arrays(
        [pa.nulls(len(uris), pa.binary()), uris, pa.array([True] * len(uris))],
        fields=list(MANAGED_REFERENCE),
        mask=uris.is_null(),
    )


class _FileCache:
    """Files read recently, up to ``limit`` bytes (rows naming a file again in a row, as the
    frames of one video chunk do, read it once)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.files: OrderedDict[str, bytes] = OrderedDict()

    def get(self, uri: str, read: Callable[[], bytes]) -> bytes:
        if uri in self.files:
            self.files.move_to_end(uri)
            return self.files[uri]
        data = read()
        self.files[uri] = data
        self.held += len(data)
        while self.held > self.limit and len(self.files) > 1:
            _, dropped = self.files.popitem(last=False)
            self.held -= len(dropped)
        return data


def _read_file(uri: str, column: str, options: StorageOptions | None) -> bytes:
    try:
        return read_object(uri, options)
    except OSError as exc:
        raise InvalidInputError(f"manifest column {column!r}: cannot read {uri}: {exc}") from None


def _format_of(manifest: str) -> str:
    name = manifest.rstrip("/").lower()
    for ext, fmt in (
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "jsonl"),
        (".csv", "csv"),
        (".parquet", "parquet"),
        (".pq", "parquet"),
    ):
        if name.endswith(ext):
            return fmt
    raise InvalidInputError(
        f"cannot tell the format of manifest {manifest!r} from its name; pass --format "
        f"({', '.join(FORMATS)})"
    )
