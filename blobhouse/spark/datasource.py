"""The ``blobhouse`` Spark data source: ``df.write.format("blobhouse")`` and
``spark.read.format("blobhouse")``.

Write: the driver plans the write once (:func:`~blobhouse.write.begin_write`), every task writes
complete data files and sidecars with the core write pipeline and returns them, the driver
commits all of them in one Lance transaction; ``abort`` removes what the tasks wrote.

Read: one input partition per fragment (split by row range when big), Arrow batches, blob
columns as resolved references ``struct<uri, position, size, blake3>`` carrying the blake3
recorded for each payload (bytes only with ``option("blobs", "bytes")``, checked against it;
``option("check_hashes", "false")`` reads bytes unchecked and references without it).

SQL: ``CREATE TABLE t USING blobhouse OPTIONS (path '<uri>')`` makes a catalog table of an existing
table, or of a new one with ``columns``; :mod:`blobhouse.spark.catalog` and docs/spark-sql.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from blobhouse.errors import InvalidInputError, SchemaError, TableNotFoundError
from blobhouse.files.ranges import REF_FIELDS, is_reference
from blobhouse.io.objects import checked_options
from blobhouse.io.storage_options import is_secret
from blobhouse.layout import TableLocation
from blobhouse.options import WriteOptions
from blobhouse.settings import SETTINGS, THRESHOLDS, check_names
from blobhouse.spark.catalog import parse_columns, table_options, with_table_options
from blobhouse.table import open_at, write_table
from blobhouse.values import path_name, stored_blob_columns
from blobhouse.write import WriteAttempt, begin_write
from blobhouse.write.pipeline import WrittenFile

STORAGE_PREFIX = "storage."
_STALE_PUSHDOWN_VERSIONS = ("4.1.", "4.2.", "4.3.")

# CREATE TABLE ... USING blobhouse (docs/spark-sql.md). Spark shows the data source its table
# properties (TableCatalog.PROP_*), the TBLPROPERTIES, the OPTIONS, and every OPTIONS key again
# under "option."; `path` comes qualified ("file:/data/t"), from OPTIONS (path ...) or LOCATION.
# The PROP_* keys and the "option." copies are not blobhouse options: accepted and ignored.
SPARK_TABLE_KEYS = frozenset(
    {
        "provider",
        "owner",
        "location",
        "external",
        "is_managed_location",
        "table_type",
        "comment",
        "collation",
    }
)
SPARK_TABLE_KEY_PREFIX = "option."
# Options of CREATE TABLE only: `columns` declares the columns of a table it creates.
CREATE_TABLE_OPTIONS = frozenset({"columns"})

# every option name the data source knows (Spark hands them over lower-cased); storage options
# are ``storage.<name>``
_BOTH = ("path", "branch")
WRITE_OPTIONS = frozenset(
    (
        *_BOTH,
        "blob_columns",
        "dedup",
        "ref_id_columns",
        "inline_size_threshold",
        "dedicated_size_threshold",
        "pack_file_size_threshold",
        "placement",
        "max_rows_per_file",
        "max_bytes_per_file",
        "allowed_bases",
        "managed_bases",
        "allow_nonempty_folder",
    )
)
# set by blobhouse.spark.write_table for a write whose payloads are stored first
INTERNAL_OPTIONS = frozenset(("store_index", "write_id"))
READ_OPTIONS = frozenset(
    (
        *_BOTH,
        "version",
        "blobs",
        "filter",
        "rows_per_partition",
        "max_batch_bytes",
        "pushdown",
        "check_hashes",
    )
)


def check_options(options: Mapping[str, str], valid: frozenset[str], what: str) -> None:
    """Refuse option names the data source does not know, naming the closest valid one."""
    names = (k for k in options if not k.startswith(STORAGE_PREFIX))
    check_names(names, valid, what, INTERNAL_OPTIONS)


def check_table_options(options: Mapping[str, str]) -> None:
    """The options of ``CREATE TABLE ... USING blobhouse`` (OPTIONS and TBLPROPERTIES, next to
    the keys Spark adds): any blobhouse option, nothing else."""
    names = [k.removeprefix(SPARK_TABLE_KEY_PREFIX) for k in options if k not in SPARK_TABLE_KEYS]
    check_options(
        dict.fromkeys(names), READ_OPTIONS | WRITE_OPTIONS | CREATE_TABLE_OPTIONS, "table option"
    )
    secrets = [
        n
        for n in names
        if n.startswith(STORAGE_PREFIX) and is_secret(n.removeprefix(STORAGE_PREFIX))
    ]
    if secrets:
        raise InvalidInputError(
            f"{secrets[0]}: a credential in CREATE TABLE's OPTIONS or TBLPROPERTIES would be kept "
            "in the Spark catalog (SHOW CREATE TABLE prints it) and in the table's column "
            "metadata. Give credentials from the environment of the driver and the executors "
            "(AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, ..., or an instance profile), or "
            "per statement: SELECT ... FROM t WITH ('storage.<name>' = ...), INSERT INTO t WITH "
            "(...); OPTIONS may keep the rest (storage.aws_endpoint, storage.aws_region)"
        )


class BlobhouseDataSource(DataSource):
    """Spark data source ``blobhouse`` (register with :func:`blobhouse.spark.register`).

    Write options: ``blob_columns`` (``"a,b.c"``), ``dedup`` (``"content"``, or JSON
    ``{"col": "ref_id"}``), ``ref_id_columns`` (``"video:video_ref"`` or JSON),
    ``inline_size_threshold`` / ``dedicated_size_threshold`` / ``pack_file_size_threshold``
    (every blob column) or ``placement`` (JSON per column), ``max_rows_per_file``,
    ``max_bytes_per_file``, ``allowed_bases`` and ``managed_bases`` (comma separated).

    Both: ``storage.<name>``, the storage options of the table's store (``storage.aws_endpoint``,
    ``storage.aws_region``, ...; see :func:`blobhouse.io.objects.checked_options`).

    Both: ``branch``, a branch of the table (made with Lance's ``create_branch``).

    Read options: ``version`` (a number or a tag), ``blobs`` (``"refs"`` or ``"bytes"``),
    ``filter`` (a Lance SQL filter applied in the scan), ``rows_per_partition``,
    ``max_batch_bytes`` (Arrow batch size cap, default 1 GiB), ``pushdown`` (``"off"``, or
    ``"on"``:
    see :class:`PushdownReader`), ``check_hashes`` (``"true"``, the default: bytes are checked
    against the blake3 recorded when they were written, and references carry it for
    ``read_blob`` / ``materialize`` to check; ``"false"``: neither).

    ``CREATE TABLE`` only: ``columns`` (Spark DDL, ``"id BIGINT, img BINARY"``) creates the table
    at ``path`` when it does not exist (:data:`CREATE_TABLE_OPTIONS`).
    """

    @classmethod
    def name(cls) -> str:
        return "blobhouse"

    def schema(self) -> StructType:
        if "provider" in self.options:  # CREATE TABLE ... USING blobhouse
            check_table_options(self.options)
            return _catalog_table_schema(self.options)
        check_options(self.options, READ_OPTIONS, "blobhouse read option")
        read = ReadSpec.from_options(self.options)
        return from_arrow_schema(read.open().output_schema(blobs=read.blobs))

    def reader(self, schema: StructType) -> BlobhouseReader:
        check_options(self.options, READ_OPTIONS, "blobhouse read option")
        spec = ReadSpec.from_options(_read_options(self.options, schema))
        if spec.pushdown == "on":
            _check_pushdown_is_safe()
            return PushdownReader(spec, schema)
        return BlobhouseReader(spec, schema)

    def writer(self, schema: StructType, overwrite: bool) -> BlobhouseWriter:
        check_options(self.options, WRITE_OPTIONS, "blobhouse write option")
        options = _SparkWriteOptions(_write_options(self.options, schema))
        # planned on the driver: the table path is resolved here, never on an executor
        try:
            write = begin_write(
                options.path,
                to_arrow_schema(schema),
                options.write_options(),
                mode="overwrite" if overwrite else "append",
                storage_options=storage_options_of(options.options),
                branch=options.options.get("branch"),
                in_tasks=True,
                **options.table_write_kwargs(),
            )
        except SchemaError as error:
            refs = [f.name for f in schema.fields if _is_reference(f.dataType)]
            if not refs:
                raise
            raise SchemaError(
                f"{error}. {refs} hold blob references (struct<uri, position, size, blake3>, what "
                "blobhouse reads with blobs='refs'), not bytes: write read_blob(column) or "
                "blobhouse.spark.materialize(df, columns); in SQL, INSERT into a catalog table "
                "made with OPTIONS (blobs 'bytes') (docs/spark-sql.md)"
            ) from error
        return BlobhouseWriter(write)


def count_rows(path: str, **options: str) -> int:
    """The rows ``spark.read.format("blobhouse").options(**options).load(path).count()``
    counts, from the table's metadata on the driver, with no Spark job: pyspark gives a Python
    data source no aggregate pushdown or column pruning, so ``df.count()`` reads every row's
    columns (blob references included) in tasks. The same read options (``version``,
    ``branch``, ``filter``, ``storage.*``); with ``filter``, Lance scans only the columns it
    names.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": [1, 2, 3]}), uri)
    >>> count_rows(uri), count_rows(uri, filter="id > 1"), count_rows(uri, version="1")
    (3, 2, 3)
    """
    check_options(options, READ_OPTIONS, "blobhouse read option")
    spec = ReadSpec.from_options({**options, "path": path})
    return spec.open().count_rows(spec.filter)


@dataclass(frozen=True)
class WrittenFiles(WriterCommitMessage):
    """What one task wrote: complete data files, not yet visible."""

    files: tuple[WrittenFile, ...]


class BlobhouseWriter(DataSourceArrowWriter):
    """Writes a task's batches as data files; the driver commits them together (the write's
    attempt: planned in ``writer``, committed or aborted here)."""

    def __init__(self, write: WriteAttempt) -> None:
        self.attempt = write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenFiles:
        return WrittenFiles(tuple(self.attempt.plan.write(iterator)))

    def commit(self, messages: Sequence[WrittenFiles | None]) -> None:
        self.attempt.ending(lambda: self.attempt.commit(_files(messages)))

    def abort(self, messages: Sequence[WrittenFiles | None]) -> None:
        self.attempt.ending(lambda: self.attempt.abort(_files(messages), tasks_may_run=True))


@dataclass(frozen=True)
class ReadSpec:
    """What to read: a table (located on the driver) at a version or tag, how blobs come back,
    an optional Lance filter."""

    location: TableLocation
    version: int | str | None
    blobs: str
    filter: str | None
    rows_per_partition: int
    pushdown: str
    max_batch_bytes: int = SETTINGS["max_batch_bytes"].default
    check_hashes: bool = SETTINGS["check_hashes"].default
    storage_options: dict[str, str] | None = field(
        default=None, repr=False
    )  # credentials: never printed

    @classmethod
    def from_options(cls, options) -> ReadSpec:
        blobs = options.get("blobs", "refs")
        if blobs not in ("refs", "bytes"):
            raise InvalidInputError(f"option blobs must be 'refs' or 'bytes', got {blobs!r}")
        pushdown = options.get("pushdown", "off")
        if pushdown not in ("on", "off"):
            raise InvalidInputError(f"option pushdown must be 'on' or 'off', got {pushdown!r}")
        version = options.get("version")
        storage_options = storage_options_of(options)
        return cls(
            location=TableLocation.of(_path(options), options.get("branch"), storage_options),
            version=version,
            blobs=blobs,
            filter=options.get("filter"),
            rows_per_partition=_setting(options, "rows_per_partition"),
            pushdown=pushdown,
            max_batch_bytes=_setting(options, "max_batch_bytes"),
            check_hashes=_setting(options, "check_hashes"),
            storage_options=storage_options,
        )

    def open(self):
        return open_at(self.location, self.version, self.storage_options)


@dataclass(frozen=True)
class FragmentRange(InputPartition):
    """Rows ``[offset, offset + limit)`` of one fragment (``limit`` None: to the end)."""

    fragment_id: int
    offset: int | None = None
    limit: int | None = None


class BlobhouseReader(DataSourceReader):
    """Reads one table version, a fragment (or row range of one) per Spark partition."""

    def __init__(self, spec: ReadSpec, schema: StructType) -> None:
        table = spec.open()
        # every task reads the version the driver saw, even if writers commit meanwhile (a tag
        # may point into a branch)
        self.spec = dataclasses.replace(spec, location=table.location, version=table.version)
        self.columns = schema.fieldNames()
        self.arrow_schema = to_arrow_schema(schema)
        self.pushed: list[str] = []  # Lance SQL of filters Spark pushed (PushdownReader)

    def partitions(self) -> list[FragmentRange]:
        table = self.spec.open()
        ranges: list[FragmentRange] = []
        step = self.spec.rows_per_partition
        splittable = self.spec.filter is None and not self.pushed
        for fragment in table.dataset.get_fragments():
            rows = fragment.count_rows()
            if not splittable or rows <= step:
                ranges.append(FragmentRange(fragment.fragment_id))
                continue
            ranges.extend(
                FragmentRange(fragment.fragment_id, start, min(step, rows - start))
                for start in range(0, rows, step)
            )
        return ranges

    def read(self, partition: FragmentRange) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FragmentRange):
            return  # pyspark reads one InputPartition(None) when partitions() is empty
        table = self.spec.open()
        conditions = [c for c in [self.spec.filter, *self.pushed] if c]
        batches = table.scan(
            self.columns,
            filter=" AND ".join(f"({c})" for c in conditions) or None,
            blobs=self.spec.blobs,
            fragment_ids=[partition.fragment_id],
            offset=partition.offset,
            limit=partition.limit,
            check_hashes=self.spec.check_hashes,
        )
        for batch in batches:
            for piece in _fit(batch, self.spec.max_batch_bytes):
                yield _as_requested(piece, self.arrow_schema)


class PushdownReader(BlobhouseReader):
    """A reader that evaluates the Spark filters Lance can express inside the Lance scan.

    Chosen with ``option("pushdown", "on")`` (Spark needs
    ``spark.sql.python.filterPushdown.enabled=true`` too). Refused on pyspark 4.1-4.3, which keep
    the read planned for one query of a loaded DataFrame and reuse it for a later query that
    pushes nothing: ``df.filter(...).count()`` then ``df.count()`` would lose rows. The
    ``filter`` option is the safe way to filter inside the scan on those versions.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.pushed = []
        for spark_filter in filters:
            sql = filter_to_sql(spark_filter)
            if sql is None:
                yield spark_filter
            else:
                self.pushed.append(sql)


def _check_pushdown_is_safe() -> None:
    if pyspark.__version__.startswith(_STALE_PUSHDOWN_VERSIONS):
        raise InvalidInputError(
            f"option pushdown='on' is refused on pyspark {pyspark.__version__}: it reuses a "
            "read planned with pushed filters for later queries of the same loaded DataFrame, "
            "which would return too few rows. Filter with Spark (the default), or inside the "
            "Lance scan with option('filter', '<Lance SQL>')."
        )


def filter_to_sql(spark_filter: Filter) -> str | None:
    """A Lance SQL condition equal to a Spark filter, or None if it has no exact translation.

    >>> from pyspark.sql.datasource import EqualTo, In
    >>> filter_to_sql(EqualTo(("episode",), 3)), filter_to_sql(In(("name",), ("a", "b")))
    ('`episode` = 3', "`name` IN ('a', 'b')")
    """
    column = (
        ".".join(f"`{part}`" for part in spark_filter.attribute)
        if hasattr(spark_filter, "attribute")
        else None
    )
    comparisons = {
        EqualTo: "=",
        GreaterThan: ">",
        GreaterThanOrEqual: ">=",
        LessThan: "<",
        LessThanOrEqual: "<=",
    }
    if type(spark_filter) in comparisons:
        value = _literal(spark_filter.value)
        return None if value is None else f"{column} {comparisons[type(spark_filter)]} {value}"
    if isinstance(spark_filter, EqualNullSafe) and spark_filter.value is None:
        return f"{column} IS NULL"
    if isinstance(spark_filter, IsNull):
        return f"{column} IS NULL"
    if isinstance(spark_filter, IsNotNull):
        return f"{column} IS NOT NULL"
    if isinstance(spark_filter, In):
        values = [_literal(v) for v in spark_filter.value]
        if not values or any(v is None for v in values):
            return None
        return f"{column} IN ({', '.join(values)})"
    if isinstance(spark_filter, StringStartsWith):
        prefix = spark_filter.value
        if any(c in prefix for c in "%_\\'"):
            return None
        return f"{column} LIKE '{prefix}%'"
    if isinstance(spark_filter, Not):
        inner = filter_to_sql(spark_filter.child)
        return None if inner is None else f"NOT ({inner})"
    return None


def _literal(value: object) -> str | None:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str) and "'" not in value:
        return f"'{value}'"
    return None


def _as_requested(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in the ``schema`` Spark asked for: a reference column it declares without
    ``blake3`` (a catalog table made before references carried it, a schema given by hand)
    gets the other fields, read unchecked by ``read_blob``."""
    columns = list(batch.columns)
    for i, wanted in enumerate(schema):
        given = columns[i].type
        if (
            pa.types.is_struct(wanted.type)
            and pa.types.is_struct(given)
            and tuple(wanted.type.names) == REF_FIELDS
            and is_reference(given.names)
        ):
            columns[i] = pa.StructArray.from_arrays(
                [columns[i].field(name) for name in REF_FIELDS],
                fields=list(wanted.type),
                mask=columns[i].is_null() if columns[i].null_count else None,
            )
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).cast(schema)


def _fit(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    """Slices of ``batch`` of at most ``limit`` bytes (or one row), so binary columns stay
    under the 2 GiB that Spark's 32-bit Arrow offsets can address."""
    if batch.nbytes <= limit or batch.num_rows <= 1:
        yield batch
        return
    half = batch.num_rows // 2
    yield from _fit(batch.slice(0, half), limit)
    yield from _fit(batch.slice(half), limit)


class _SparkWriteOptions:
    """Data source options of a write, as :func:`~blobhouse.write.begin_write` arguments."""

    def __init__(self, options) -> None:
        self.options = options
        self.path = _path(options)

    def write_options(self) -> WriteOptions:
        """How the write stores blob columns: each option's text parsed by its setting's
        schema (a wrong one names the option, the value and what it takes)."""
        return parsed_write_options(self.options)

    def table_write_kwargs(self) -> dict:
        """The other :func:`~blobhouse.write.begin_write` keywords the options set."""
        get = self.options.get
        kwargs: dict = {}
        if get("store_index") == "joined":
            kwargs["load_store_index"] = False
        if get("allow_nonempty_folder") is not None:
            flag = SETTINGS["allow_nonempty_folder"]
            kwargs["allow_nonempty_folder"] = flag.parse(get("allow_nonempty_folder"))
        if get("write_id"):
            kwargs["write_id"] = get("write_id")
        return kwargs


#: the write options that are settings of the same name (``placement``: :func:`_placement`)
_WRITE_SETTINGS = (
    "blob_columns",
    "ref_id_columns",
    "dedup",
    "allowed_bases",
    "managed_bases",
    "max_rows_per_file",
    "max_bytes_per_file",
)


def spark_writer_options(options: WriteOptions) -> dict[str, str]:
    """``options`` as the data source's writer options (text), the ones
    :meth:`_SparkWriteOptions.write_options` parses back into the same object: every field
    set, none left out (lists comma separated, mappings as JSON; a field at its default is
    not given, so the table's property applies).

    >>> spark_writer_options(WriteOptions(blob_columns=["img"], dedup={"img": "ref_id"},
    ...                             max_rows_per_file=10))
    {'blob_columns': 'img', 'dedup': '{"img": "ref_id"}', 'max_rows_per_file': '10'}
    """
    out: dict[str, str] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value is None or (f.name in ("blob_columns", "placement") and not value):
            continue
        if f.name not in (*_WRITE_SETTINGS, "placement"):  # a new field must be spelled here
            raise AssertionError(f"WriteOptions.{f.name} has no writer option")
        if isinstance(value, Mapping):
            out[f.name] = json.dumps(
                {k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
            )
        elif isinstance(value, (list, tuple)):
            names = [str(item) for item in value]
            if any("," in name for name in names):
                raise InvalidInputError(
                    f"{f.name} {names} holds a comma, which a Spark writer option cannot carry"
                )
            out[f.name] = ",".join(names)
        else:
            out[f.name] = str(value)
    return out


def parsed_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Writer options (text) as the :class:`~blobhouse.options.WriteOptions` the data source
    writes with, each parsed by its setting's schema: the inverse of
    :func:`spark_writer_options`."""
    given = {
        name: SETTINGS[name].parse(options[name])
        for name in _WRITE_SETTINGS
        if options.get(name) is not None
    }
    return WriteOptions(**given, placement=_placement(options))


def _placement(options: Mapping[str, str]) -> dict | None:
    """``placement`` (JSON per column) under the thresholds given for every blob column."""
    get = options.get
    per_column = SETTINGS["placement"].parse(get("placement")) if get("placement") else {}
    shared = {name: SETTINGS[name].parse(get(name)) for name in THRESHOLDS if get(name)}
    if shared:
        per_column["*"] = {**shared, **per_column.get("*", {})}
    return per_column or None


def storage_options_of(options) -> dict[str, str] | None:
    """The ``storage.<name>`` data source options, as storage options.

    >>> storage_options_of({"path": "s3://b/t", "storage.aws_region": "eu-west-1"})["aws_region"]
    'eu-west-1'
    """
    found = {
        k[len(STORAGE_PREFIX) :]: v for k, v in options.items() if k.startswith(STORAGE_PREFIX)
    }
    return checked_options(found)


def storage_prefixed(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """Storage options as data source options (``storage.<name>``)."""
    return {f"{STORAGE_PREFIX}{k}": v for k, v in (checked_options(storage_options) or {}).items()}


def _catalog_table_schema(options) -> StructType:
    """``CREATE TABLE ... USING blobhouse``: the table's schema, carrying its options (Spark
    shows them to the data source this once). With ``columns``, the table is created first when
    missing, so that a SELECT before any INSERT finds it, empty, with its blob columns."""
    own = {
        k: v
        for k, v in options.items()
        if k not in SPARK_TABLE_KEYS and not k.startswith(SPARK_TABLE_KEY_PREFIX)
    }
    if not own.get("path"):
        raise InvalidInputError(
            "CREATE TABLE ... USING blobhouse needs the table's location: OPTIONS (path '<uri>') "
            "or LOCATION '<uri>'"
        )
    read = ReadSpec.from_options(own)
    if own.get("columns"):
        _create_if_missing(read, own)
    try:
        table = read.open()
    except TableNotFoundError as error:
        raise TableNotFoundError(
            f"{error}; to create a new table there, declare its columns: OPTIONS (path '<uri>', "
            "columns 'id BIGINT, img BINARY', blob_columns 'img')"
        ) from error
    # the write settings its INSERTs will carry: refused now if they are not the table's own
    stored = sorted(path_name(p) for p in stored_blob_columns(table.schema))
    table.properties.resolve(_SparkWriteOptions(own).write_options(), stored)
    carried = {k: v for k, v in own.items() if k not in CREATE_TABLE_OPTIONS}
    # resolved here, on the driver: a relative path means the driver's working directory
    carried["path"] = table.location.root
    if table.location.branch is not None:
        carried["branch"] = table.location.branch
    blob_columns = {path_name(p) for p in stored_blob_columns(table.schema)}
    schema = from_arrow_schema(table.output_schema(blobs=read.blobs))
    return with_table_options(schema, carried, blob_columns, read.blobs)


def _create_if_missing(read: ReadSpec, options: dict[str, str]) -> None:
    declared = parse_columns(options["columns"])
    try:
        table = read.open()
    except TableNotFoundError:
        given = _SparkWriteOptions(options)
        allow = given.table_write_kwargs().get("allow_nonempty_folder", False)
        write_table(
            to_arrow_schema(declared).empty_table(),
            _path(options),
            mode="append",
            storage_options=read.storage_options,
            branch=options.get("branch"),
            allow_nonempty_folder=allow,
            **given.write_options().keywords(),
        )
        return
    existing = from_arrow_schema(table.output_schema(blobs="bytes"))
    shape = [(f.name, f.dataType.simpleString()) for f in existing.fields]
    if [(f.name, f.dataType.simpleString()) for f in declared.fields] != shape:
        raise InvalidInputError(
            f"option columns {options['columns']!r} does not match the table at "
            f"{table.location.root}: {', '.join(f'{n} {t}' for n, t in shape)} (leave columns "
            "out to use the table's own)"
        )
    stored = {path_name(p) for p in stored_blob_columns(table.schema)}
    given = options.get("blob_columns")
    named = SETTINGS["blob_columns"].parse(given) if given else ()
    missing = [c for c in named if c not in stored]
    if missing:
        raise InvalidInputError(
            f"blob_columns {missing} are not blob columns of the table at {table.location.root}"
        )


def _read_options(options, schema: StructType) -> Mapping[str, str]:
    """The options of a read: a catalog table's (carried in its schema, which is always the
    scanned table's own) under the statement's ``WITH (...)`` ones."""
    carried = table_options(schema, whole=True)
    if carried is None:
        return options
    blobs = carried.get("blobs", "refs")
    if options.get("blobs", blobs) != blobs:
        raise InvalidInputError(
            f"this catalog table reads blob columns as blobs={blobs!r} (its column types); "
            "make another table over the same path with OPTIONS (blobs '...') for the other"
        )
    return {**carried, **options}


def _write_options(options, schema: StructType) -> Mapping[str, str]:
    """The options of a write: the statement's own, plus a catalog table's when the columns
    carry the options of the table the statement names. Without a path in the statement the
    target is unknown: the columns may be those of an INSERT's source table."""
    if not options.get("path"):
        raise InvalidInputError(
            "blobhouse needs a table path: .save(uri), or for SQL INSERT INTO / INSERT "
            "OVERWRITE a catalog table, the path in the statement: INSERT INTO t WITH ('path' = "
            "'<uri>') VALUES ... (pyspark 4.3 does not show a Python data source which table a "
            "statement writes; docs/spark-sql.md). Or write with blobhouse.spark.write_table(df, "
            "uri) or df.write.format('blobhouse').save(uri). CREATE TABLE ... AS SELECT cannot "
            "name it: create the table, then INSERT."
        )
    carried = table_options(schema)
    if carried is None or not _same_table(carried, options):
        return options
    return {**carried, **options}


def _same_table(one: Mapping[str, str], other: Mapping[str, str]) -> bool:
    def where(options: Mapping[str, str]) -> TableLocation:
        return TableLocation.of(_path(options), options.get("branch"), storage_options_of(options))

    # the statement's path and branch (else the table's branch) against the table's own
    return where(one) == where({**one, **other})


def _is_reference(data_type) -> bool:
    return isinstance(data_type, StructType) and is_reference(data_type.fieldNames())


def _path(options) -> str:
    path = options.get("path")
    if not path:
        raise InvalidInputError(
            "blobhouse needs a table path: .save(uri) / .load(uri); a SQL catalog table needs "
            "CREATE TABLE t USING blobhouse OPTIONS (path '<uri>') without a column list "
            "(docs/spark-sql.md)"
        )
    return path  # Spark's qualified local paths (file:/data/t) resolve like any file URI


def _setting(options, name: str) -> Any:
    """Read option ``name`` by its setting (its default when not given)."""
    given = options.get(name)
    return SETTINGS[name].default if given is None else SETTINGS[name].parse(given)


def _files(messages: Sequence[WrittenFiles | None]) -> list[WrittenFile]:
    return [f for m in messages if m is not None for f in m.files]


def ensure_registered(spark: SparkSession) -> None:
    """Make the ``blobhouse`` format known to ``spark`` in the calling thread: blobhouse's own
    Spark functions use it in sessions nobody called :func:`blobhouse.spark.register` on
    (registering again is a no-op in effect: the same source replaces itself).

    Spark looks a Python data source up in the *active* session of the JVM thread asking, and
    pyspark runs each Python thread on a JVM thread of its own that has none: without this, a
    ``df.write.format("blobhouse")`` in a thread fails with DATA_SOURCE_NOT_FOUND."""
    spark.dataSource.register(BlobhouseDataSource)
    jsession = getattr(spark, "_jsparkSession", None)  # Spark Connect: none, nor a JVM here
    if jsession is not None:
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
