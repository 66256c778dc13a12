"""update and merge_insert on Spark: the same plans and per-fragment steps as
:mod:`blobhouse.changes.update` and :mod:`blobhouse.changes.merge_insert`, run as Spark tasks;
the driver commits once.

``merge_insert`` matches with a join Spark executes: tasks read the table's keys fragment by
fragment, the join runs in Spark, tasks write the new rows' data files, the rewritten columns of
the fragments whose rows get only some columns (``when_matched_update``), and the deletion files
of the fragments whose rows are replaced or deleted; only file metadata reaches the driver. So
the keys never have to fit in the driver. The source is cached for the merge: it is read several
times and must give the same rows each time. A commit that a concurrent one preempted is planned
again on the latest version. If anything fails, the table is unchanged and the staged files
(deletion files included) are removed.

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

import contextlib
import itertools
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from lance import LanceDataset
from pyroaring import BitMap
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from blobhouse.changes.backfill import BlobFunction
from blobhouse.changes.column_rewrite import (
    ColumnRewrite,
    commit_rewrite,
    empty_rewrite,
    rewrite_fragment,
    store_mode,
)
from blobhouse.changes.merge_insert import (
    MergeClauses,
    MergeInsert,
    MergeReport,
    deleted_fragments,
)
from blobhouse.changes.update import UpdateReport, update_rows
from blobhouse.commit.change import BaseChange, Staged
from blobhouse.commit.transaction import (
    SHOWN_KEYS,
    Inserts,
    StagedDeletion,
    Transaction,
    remove_deletions,
    stage_deletion,
)
from blobhouse.dedup import mode_of
from blobhouse.errors import BlobhouseError, InvalidInputError, cleanup_after
from blobhouse.files.session import WrittenFile
from blobhouse.io.objects import checked_options
from blobhouse.options import CommitOptions, WriteOptions, option_keywords
from blobhouse.snapshot import TableSnapshot, open_snapshot
from blobhouse.spark.errors import spark_entry_point
from blobhouse.spark.jobs import SparkTasks
from blobhouse.spark.lookup import store_payloads_first
from blobhouse.values import ROW_ADDRESS
from blobhouse.write import TableWrite, prepared_for_write

_ADDRESS, _SCOPE = "__bh_rowaddr", "__bh_in_scope"


@spark_entry_point
@option_keywords(commit=CommitOptions)
def update(
    spark: SparkSession,
    uri: str,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None = None,
    *,
    dedup: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    commit: CommitOptions | None = None,
) -> UpdateReport:
    """:meth:`blobhouse.Table.update` with a Spark task per fragment: each task rewrites the
    changed columns of its fragment if a row matches ``where``; the driver commits once
    (``commit``, or its field ``retries=`` as a keyword: as :meth:`~blobhouse.Table.update`)."""
    options = checked_options(storage_options)
    table = open_snapshot(uri, None, options)
    return update_rows(
        table,
        updates,
        where,
        dedup=dedup,
        commit=commit,
        runner=SparkTasks(spark),
    ).report


_FLAGS = (
    "on",
    "when_matched_update_all",
    "when_matched_update",
    "when_not_matched_insert_all",
    "when_not_matched_by_source_delete",
    "dedup",
    "ref_id_columns",
    "placement",
    "storage_options",
    "commit",
    "conflict_retries",
)


@spark_entry_point
def merge_insert(
    df: DataFrame,
    uri: str | MergeInsert,
    *,
    on: str | Sequence[str] | None = None,
    when_matched_update_all: bool | None = None,
    when_matched_update: Sequence[str] | None = None,
    when_not_matched_insert_all: bool | None = None,
    when_not_matched_by_source_delete: bool | str | None = None,
    dedup: str | Mapping[str, str] | None = None,
    ref_id_columns: Mapping[str, str] | None = None,
    placement: Mapping[str, Mapping[str, int]] | None = None,
    storage_options: Mapping[str, str] | None = None,
    commit: CommitOptions | None = None,
    conflict_retries: int | None = None,
) -> MergeReport:
    """:meth:`blobhouse.Table.merge_insert` for a DataFrame, in one commit, run by Spark tasks:
    ``uri`` is a builder (``open_table(uri).merge_insert("id").when_matched_update(["label"])
    ...``), whose table, key, clauses, write options and commit options the merge runs (the
    builder and the table that built it move to the version committed, as ``execute`` does);
    or the table's URI with the keywords, sugar that builds the same builder (giving a builder
    and keywords is refused, naming both). The keywords: the source rows whose key the table
    has replace those rows (``when_matched_update_all``, the default), or give them only the
    ``when_matched_update`` columns (a column rewrite: the other columns, their blobs included,
    are not written again); the others are inserted (``when_not_matched_insert_all``, True by
    default), and table rows whose key the source lacks are deleted when
    ``when_not_matched_by_source_delete`` is True or a SQL condition they match.

    New rows go through the write pipeline with the table's properties (``dedup`` and the
    other options, if given, must be the same; ``"global"``: payloads the table stores
    anywhere are referenced). Duplicate keys in ``df`` are an error naming one. ``df`` is
    cached for the merge and released after it (unless the caller cached it): its keys and its
    rows are read several times, and a source that is not deterministic (``rand()``, files
    changing underneath) would otherwise match one set of rows and write another. A commit
    that a concurrent one preempted is planned again on the latest version, up to
    ``commit.retries`` times (``conflict_retries``: sugar for it, this is
    :attr:`CommitOptions.retries <blobhouse.options.CommitOptions.retries>`); a conflict that
    ends the merge is a :class:`~blobhouse.errors.ConcurrentCommitError`, and nothing of the
    merge is left. Every check of the builder's (no clause, an unknown column, a key
    updated, the source's columns) happens before any Spark job.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import open_table, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": [1, 2], "label": ["a", "b"]}), uri)
    >>> df = spark.createDataFrame([(2, "B"), (3, "c")], "id long, label string")
    >>> report = merge_insert(df, uri, on="id", when_matched_update=["label"])
    >>> report.num_updated_rows, report.num_inserted_rows
    (1, 1)
    >>> builder = open_table(uri).merge_insert("id").when_matched_update(["label"])
    >>> merge_insert(df, builder).num_updated_rows
    2
    """
    if not isinstance(df, DataFrame):
        raise InvalidInputError(f"merge_insert needs a Spark DataFrame as its source, got {df!r}")
    arguments = locals()
    given = {name: arguments[name] for name in _FLAGS if arguments[name] is not None}
    if isinstance(uri, MergeInsert):
        if given:
            raise InvalidInputError(
                f"merge_insert(): give a MergeInsert builder or the table's uri with its "
                f"keywords ({', '.join(given)}), not both: the builder holds them"
            )
        builder = uri
    else:
        builder = _builder(uri, given)
    builder.check_actions()
    merge = _Merge(builder)
    table = merge.prepared(builder.table)
    merge.check(table, df)  # before any Spark job
    with _evaluated_once(df) as source:
        _check_unique_keys(source, list(merge.on))
        return builder.run(_MergeInTasks(merge, source))


def _builder(uri: str, given: Mapping[str, Any]) -> MergeInsert:
    """The builder the keywords of :func:`merge_insert` spell, on the table's latest version
    (matched rows updated whole and new ones inserted unless told otherwise); ``given``: the
    keywords given (:data:`_FLAGS`)."""
    on, commit, conflict_retries = (
        given.get("on"),
        given.get("commit"),
        given.get("conflict_retries"),
    )
    when_matched_update = given.get("when_matched_update")
    when_not_matched_insert_all = given.get("when_not_matched_insert_all")
    delete = given.get("when_not_matched_by_source_delete")
    if not isinstance(uri, str):
        raise InvalidInputError(
            f"merge_insert takes a table's uri or a MergeInsert builder, got {uri!r}"
        )
    if on is None:
        raise TypeError(  # as when on= was a required keyword
            "merge_insert() missing 1 required keyword-only argument: 'on' (or give a "
            "MergeInsert builder in place of the uri)"
        )
    if conflict_retries is not None:
        if commit is not None:
            raise InvalidInputError(
                "merge_insert(): give commit (a CommitOptions) or conflict_retries, not both"
            )
        commit = CommitOptions(retries=conflict_retries)
    keys = _names(on, "on")
    update_all = _updates_all(given.get("when_matched_update_all"), when_matched_update)
    columns = (
        None if when_matched_update is None else _names(when_matched_update, "when_matched_update")
    )
    options = WriteOptions(
        **{k: given[k] for k in ("dedup", "ref_id_columns", "placement") if k in given}
    )
    table = open_snapshot(uri, None, checked_options(given.get("storage_options")))
    builder = MergeInsert(table, list(keys), options).commit(commit or CommitOptions())
    if update_all:
        builder.when_matched_update_all()
    if columns is not None:
        builder.when_matched_update(list(columns))
    if when_not_matched_insert_all is None or when_not_matched_insert_all:
        builder.when_not_matched_insert_all()
    if delete:
        builder.when_not_matched_by_source_delete(delete if isinstance(delete, str) else None)
    return builder


def _updates_all(update_all: bool | None, columns: Sequence[str] | None) -> bool:
    """Whether matched rows get all the source's columns: by default, unless columns are
    named; both asked for is an error."""
    if columns is not None and update_all:
        raise InvalidInputError(
            "when_matched_update_all and when_matched_update exclude each other: a matched "
            "row gets all the source's columns, or only the columns named; give one"
        )
    return columns is None if update_all is None else update_all


def _names(columns: str | Sequence[str], option: str) -> tuple[str, ...]:
    """Column names given as one name or a list of them (anything else names ``option``)."""
    names = (columns,) if isinstance(columns, str) else columns
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise InvalidInputError(
            f"{option} takes a column name or a list of column names, got {columns!r}"
        )
    return tuple(names)


@dataclass(frozen=True)
class _Merge:
    """What a Spark merge was asked to do, read from its builder: the same for each attempt."""

    builder: MergeInsert  # the one given: its keys, clauses and write options

    @property
    def on(self) -> list[str]:
        return self.builder.on

    @property
    def clauses(self) -> MergeClauses:
        return self.builder.clauses

    def prepared(self, table: TableSnapshot) -> TableSnapshot:
        """``table`` ready for this merge's dedup mode (its store registered, say)."""
        resolved = self.builder.resolved(table)
        return prepared_for_write(table, store_mode(resolved))

    def check(self, table: TableSnapshot, df: DataFrame) -> MergeInsert:
        """The builder on ``table`` (the version an attempt read: its keys and update columns
        checked again), with the source's shape checked like the Python merge's (keys,
        unknown columns), without reading data."""
        merge = self.builder.on_version(table)
        merge.check_actions()
        merge.check_source(table, to_arrow_schema(df.schema).empty_table())
        return merge


@contextlib.contextmanager
def _evaluated_once(df: DataFrame) -> Iterator[DataFrame]:
    """``df`` cached while the block runs, so that Spark computes its rows once: the keys the
    merge matches are then the rows it writes. A DataFrame the caller cached stays cached.

    Spark's cache is best effort: a cached partition lost with its executor is computed again.
    (``localCheckpoint`` would fail instead, but leaves its blocks until the JVM collects them;
    a caller who needs that can checkpoint the source: a cached source is used as it is.)"""
    level = df.storageLevel
    if level.useMemory or level.useDisk or level.useOffHeap:
        yield df
        return
    df.persist()
    try:
        yield df
    finally:
        df.unpersist()


@dataclass
class _Staged:
    """What one attempt of a merge wrote so far: the new rows' data files, the rewritten
    fragments' files, the deletion files and the store payloads (abort removes them)."""

    new_files: list[WrittenFile] = field(default_factory=list)
    rewritten: dict[int, WrittenFile] = field(default_factory=dict)
    changed: dict[int, BitMap] = field(default_factory=dict)  # rewritten rows per fragment
    deletions: list[StagedDeletion] = field(default_factory=list)
    stored: list = field(default_factory=list)

    def files(self) -> list[WrittenFile]:
        return [*self.new_files, *self.rewritten.values()]


@dataclass(frozen=True)
class _MergePlan:
    table: TableSnapshot  # the version read, ready for the merge's dedup mode
    builder: MergeInsert
    match: _Match
    transaction: Transaction
    rewrite: ColumnRewrite | None


@dataclass(frozen=True)
class _MergeInTasks(BaseChange):
    """A Spark merge as a :class:`~blobhouse.commit.change.Change`: each attempt matches the
    source with the version read (a Spark join), writes in tasks, and commits once."""

    merge: _Merge
    source: DataFrame
    in_tasks: bool = True

    def plan(self, snapshot: TableSnapshot) -> _MergePlan:
        merge, table = self.merge, self.merge.prepared(snapshot)
        builder = merge.check(table, self.source)
        match = _Match.of(self.source, table, merge)
        try:
            txn = Transaction.start(
                table.location, table.version, table.storage_options, kind="merge"
            )
            rewrite = builder.column_rewrite(table, txn) if merge.clauses.update_columns else None
        except BaseException as exc:
            cleanup_after(exc, match.release)
            raise
        return _MergePlan(table, builder, match, txn, rewrite)

    def stage(self, plan: _MergePlan, staged: Staged) -> None:
        matched, rows = plan.match.counts()
        written = _Staged(deletions=staged.deletions)  # abort removes them as they come
        deleted = _write(
            self.merge,
            plan.builder,
            plan.table,
            plan.match,
            plan.transaction,
            plan.rewrite,
            written,
        )
        staged.written.extend(written.files())
        staged.detail = (written, deleted, matched, rows)

    def commit(self, plan: _MergePlan, staged: Staged) -> LanceDataset:
        written, _, matched, rows = staged.detail
        table, insert = plan.table, self.merge.clauses.insert
        dataset = commit_rewrite(
            table,
            plan.rewrite or empty_rewrite(table, plan.transaction),
            written.rewritten,
            deletions=deleted_fragments(written.deletions),
            new_files=written.new_files,
            matched=written.changed,
            inserts=plan.match.inserts(table, rows - matched) if insert else None,
            stored=written.stored,
        )
        return dataset

    def report(
        self, plan: _MergePlan, staged: Staged, committed: TableSnapshot, attempt: int
    ) -> MergeReport:
        _, deleted, matched, rows = staged.detail
        merge = self.merge
        return MergeReport(
            read_version=plan.table.version,
            version=committed.version,
            num_inserted_rows=(rows - matched) if merge.clauses.insert else 0,
            num_updated_rows=matched if merge.clauses.updates else 0,
            num_deleted_rows=deleted,
            bytes_written=sum(w.bytes_written for w in staged.written),
            attempts=attempt,
        )

    def release(self, plan: _MergePlan) -> None:
        plan.match.release()


@dataclass(frozen=True)
class _Match:
    """The source's rows matched with the table's keys (a Spark join: keys never gather on
    the driver); ``joined`` carries each source row's match, its address in the table, and
    ``keyed`` only the source's keys and that address."""

    source: DataFrame
    targets: DataFrame
    joined: DataFrame
    on: list[str]
    keyed: DataFrame

    @classmethod
    def of(cls, source: DataFrame, table: TableSnapshot, merge: _Merge) -> _Match:
        keys = list(merge.on)
        targets = _target_keys(source.sparkSession, table, source, keys, merge.clauses.delete)
        joined = source.join(targets, keys, "left")
        keyed = joined.select(*keys, _ADDRESS)
        if merge.clauses.insert:
            # the check before the commit reads the inserted keys again, under the upsert lock:
            # cached (keys only) by counts(), it does not read the table's keys a second time.
            # In as many tasks as the larger side has partitions: AQE does not coalesce a
            # cached plan, whose join would otherwise run spark.sql.shuffle.partitions (200)
            # tasks (a merge of 2 rows ran 600)
            parts = max(source.rdd.getNumPartitions(), targets.rdd.getNumPartitions(), 1)
            keyed = keyed.coalesce(parts).persist()
        return cls(source, targets, joined, keys, keyed)

    def release(self) -> None:
        """Drop what the match cached."""
        if self.keyed.is_cached:
            self.keyed.unpersist()

    def counts(self) -> tuple[int, int]:
        """How many source rows match a table row, and how many there are."""
        found = self.keyed.select(
            F.count(F.col(_ADDRESS)).alias("matched"), F.count(F.lit(1)).alias("rows")
        ).first()
        return int(found["matched"]), int(found["rows"])

    def matched(self) -> DataFrame:
        """The source rows that match, with the address of their table row."""
        return self.joined.where(F.col(_ADDRESS).isNotNull()).drop(_SCOPE)

    def rows_to_write(self, matched: bool, unmatched: bool) -> DataFrame:
        """The source rows that match (``matched``) and those that do not (``unmatched``)."""
        found = F.col(_ADDRESS).isNotNull()
        keep = (found if matched else F.lit(False)) | (~found if unmatched else F.lit(False))
        return self.joined.where(keep).drop(_ADDRESS, _SCOPE)

    def inserts(self, table: TableSnapshot, count: int) -> Inserts:
        """The ``count`` source rows that match no row of ``table`` (the version matched),
        whose keys the merge inserts: checked against a later version's fragments by a Spark
        join, so that the keys need not fit in the driver either."""
        inserted = self.keyed.where(F.col(_ADDRESS).isNull()).select(*self.on)
        spark = self.source.sparkSession

        def found(dataset: LanceDataset, fragment_ids: list[int]) -> list[dict]:
            later = open_snapshot(table.location, dataset.version, table.storage_options)
            present = _target_keys(spark, later, self.source, self.on, False, fragment_ids)
            both = inserted.join(present.select(*self.on), self.on, "left_semi")
            return [row.asDict() for row in both.limit(SHOWN_KEYS).collect()]

        return Inserts(tuple(self.on), count, found)

    def by_source(self) -> DataFrame:
        """The addresses of the table rows in scope whose key the source lacks."""
        in_scope = self.targets.where(F.col(_SCOPE))
        return in_scope.join(self.source.select(*self.on), self.on, "left_anti").select(_ADDRESS)


def _write(
    merge: _Merge,
    builder: MergeInsert,
    table: TableSnapshot,
    match: _Match,
    txn: Transaction,
    rewrite: ColumnRewrite | None,
    staged: _Staged,
) -> int:
    """The merge's files, written by tasks into ``staged`` as each job returns: new rows,
    rewritten columns, deletion files. Returns how many rows the source's lack deletes."""
    if merge.clauses.update_all or merge.clauses.insert:
        new_rows = match.rows_to_write(merge.clauses.update_all, merge.clauses.insert)
        _write_new_rows(new_rows, builder, table, txn, staged)
    if rewrite is not None:
        for fragment_id, (written, changed) in _rewrite_matched(
            match.matched(), table, rewrite
        ).items():
            staged.rewritten[fragment_id] = written
            staged.changed[fragment_id] = changed
    doomed = match.matched().select(_ADDRESS) if merge.clauses.update_all else None
    by_source = match.by_source() if merge.clauses.delete else None
    if by_source is not None:
        doomed = by_source if doomed is None else doomed.unionByName(by_source)
    if doomed is not None:
        _delete_rows(doomed, table, txn, staged.deletions)
    return by_source.count() if by_source is not None else 0


def _write_new_rows(
    rows: DataFrame, builder: MergeInsert, table: TableSnapshot, txn: Transaction, staged: _Staged
) -> None:
    """The rows to add, written as new data files by tasks (store payloads first with
    ``dedup="global"``: the rows then carry references into the table's store)."""
    options = table.storage_options
    resolved = builder.resolved(table)
    stored_globally = [
        c for c in _blob_columns(table, rows) if mode_of(resolved.dedup, c) == "global"
    ]
    globally = bool(stored_globally)
    if globally:
        rows, staged.stored = store_payloads_first(
            rows,
            table.location,
            stored_globally,
            txn.name_prefix,
            _pack_limit(table, stored_globally),
            max(1, rows.rdd.getNumPartitions()),
            options,
        )
    plan = builder.rows_plan(table, to_arrow_schema(rows.schema))
    if plan.uses_store:  # looked up in the store already: the tasks need not load its index
        plan = replace(plan, load_store_index=not globally)
    write = TableWrite(txn, plan, appending=True, mode="append")
    staged.new_files.extend(_write_rows(rows, write))


def _pack_limit(table: TableSnapshot, columns: Sequence[str]) -> int:
    """The store's pack size: the smallest ``pack_file_size_threshold`` of ``columns``."""
    properties = table.properties
    return min(properties.columns[c].placement.pack_file_size_threshold for c in columns)


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
    spark: SparkSession,
    table,
    df: DataFrame,
    keys: list[str],
    scope: bool | str,
    fragment_ids: Sequence[int] | None = None,
) -> DataFrame:
    """The table's keys with each row's address, read by one task per fragment (of
    ``fragment_ids``, or all); ``scope``: whether a row may be deleted by the source's lack of
    it."""
    schema = StructType(
        [df.schema[k] for k in keys]
        + [StructField(_ADDRESS, LongType(), False), StructField(_SCOPE, BooleanType(), True)]
    )
    arrow_schema = to_arrow_schema(schema)
    location, version, options = table.location, table.version, table.storage_options
    condition = scope if isinstance(scope, str) else "true"

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        at = open_snapshot(location, version, options)
        for batch in batches:
            for fragment_id in batch.column(0).to_pylist():
                fragment = at.dataset.get_fragment(fragment_id)
                columns = {k: k for k in keys} | {_SCOPE: f"({condition})"}
                scan = fragment.scanner(columns=columns, with_row_address=True)
                for part in scan.to_batches():
                    arrays = [part.column(k).cast(arrow_schema.field(k).type) for k in keys]
                    arrays += [part.column(ROW_ADDRESS).cast(pa.int64()), part.column(_SCOPE)]
                    yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    if fragment_ids is None:
        fragment_ids = [f.fragment_id for f in table.dataset.get_fragments()]
    ids = list(fragment_ids) or [-1]
    frame = spark.createDataFrame([(i,) for i in ids], "fragment long").repartition(len(ids))
    frame = frame.where(F.col("fragment") >= 0)
    return frame.mapInArrow(read, schema)


def _write_rows(rows: DataFrame, write: TableWrite) -> list:
    """The rows' data files, written by tasks (nothing visible yet)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for written in write.write(batches):
            yield pa.record_batch({"file": [pickle.dumps(written)]})

    return [pickle.loads(r["file"]) for r in rows.mapInArrow(task, "file binary").collect()]


def _by_fragment(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.Table]]:
    """Rows sorted by their address (``_ADDRESS``), one table per fragment."""
    current, parts = -1, []
    for batch in batches:
        fragments = batch.column(_ADDRESS).to_numpy() >> 32
        starts = [0, *(np.flatnonzero(np.diff(fragments)) + 1).tolist(), len(fragments)]
        for begin, end in itertools.pairwise(starts):
            if end > begin and int(fragments[begin]) != current:
                if parts:
                    yield current, pa.Table.from_batches(parts)
                current, parts = int(fragments[begin]), []
            if end > begin:
                parts.append(batch.slice(begin, end - begin))
    if parts:
        yield current, pa.Table.from_batches(parts)


def _rewrite_matched(
    matched: DataFrame, table: TableSnapshot, rewrite: ColumnRewrite
) -> dict[int, tuple[WrittenFile, BitMap]]:
    """``when_matched_update(columns)``: :func:`~blobhouse.changes.column_rewrite.rewrite_fragment`
    of every fragment holding a matched row, in tasks fed that fragment's matched source rows
    (sorted by address: a task holds one fragment's rows at a time), with the rows it changed."""
    location, version, options = table.location, table.version, table.storage_options
    present = [c for c in rewrite.columns if c in matched.columns]

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        at = open_snapshot(location, version, options)
        for fragment_id, rows in _by_fragment(batches):
            source = {fragment_id: _fragment_source(rows, rewrite)}
            result = rewrite_fragment(at, replace(rewrite, source=source), fragment_id)
            yield pa.record_batch({"fragment": [fragment_id], "file": [pickle.dumps(result)]})

    fragment = F.shiftright(F.col(_ADDRESS), 32)
    partitions = max(1, len(table.dataset.get_fragments()))
    done = (
        matched.select(_ADDRESS, *present)
        .repartition(partitions, fragment)
        .sortWithinPartitions(_ADDRESS)
        .mapInArrow(task, "fragment long, file binary")
        .collect()
    )
    return {r["fragment"]: pickle.loads(r["file"]) for r in done}


def _fragment_source(rows: pa.Table, rewrite: ColumnRewrite) -> tuple[np.ndarray, pa.Table]:
    """A fragment's matched rows as a column rewrite's source: their offsets (ascending) and
    values of the rewritten columns (null for a nullable column the source lacks)."""
    offsets = rows.column(_ADDRESS).to_numpy() & 0xFFFFFFFF
    schema = rewrite.plan.input_schema
    values = [
        rows.column(c) if c in rows.column_names else pa.nulls(rows.num_rows, schema.field(c).type)
        for c in rewrite.columns
    ]
    return offsets, pa.table(values, names=list(rewrite.columns))


def _delete_rows(
    addresses: DataFrame, table: TableSnapshot, txn: Transaction, into: list[StagedDeletion]
) -> None:
    """Deletion files for the rows at ``addresses``, written by one task per group of
    fragments; each record lands in ``into``, then the first error a task met is raised.

    A task reports its error instead of failing: the results of a failed Spark job never
    reach the driver, and Lance names deletion files at random, so the driver must get every
    record to remove them (:func:`~blobhouse.commit.transaction.stage_deletion`)."""
    location, version, options = table.location, table.version, table.storage_options

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        staged: list[StagedDeletion] = []
        try:
            by_fragment: dict[int, list[int]] = {}
            for batch in batches:
                for address in batch.column(0).to_pylist():
                    by_fragment.setdefault(address >> 32, []).append(address & 0xFFFFFFFF)
            at = open_snapshot(location, version, options)
            for fragment_id, offsets in by_fragment.items():
                staged.append(stage_deletion(at.dataset, fragment_id, sorted(set(offsets))))
            if txn.is_aborted():  # the driver gave up while this task ran: nobody will commit
                remove_deletions(staged, location, options)
                return
        except Exception as exc:  # reported with the records, not raised: see above
            yield _deletion_rows(staged, exc)
            return
        yield _deletion_rows(staged, None)

    fragment = F.shiftright(F.col(_ADDRESS), 32)
    partitions = max(1, len(table.dataset.get_fragments()))
    done = (
        addresses.repartition(partitions, fragment)
        .mapInArrow(task, "deletion binary, error binary")
        .collect()
    )
    errors = []
    for row in done:
        if row["deletion"] is not None:
            into.append(pickle.loads(row["deletion"]))
        if row["error"] is not None:
            errors.append(pickle.loads(row["error"]))
    if errors:
        raise errors[0]


def _deletion_rows(staged: list[StagedDeletion], error: Exception | None) -> pa.RecordBatch:
    """A deletion task's result: a row per record, and one for its error if it met one."""
    deletions = [pickle.dumps(d) for d in staged]
    errors: list[bytes | None] = [None] * len(deletions)
    if error is not None:
        deletions.append(None)
        errors.append(_pickled_error(error))
    return pa.record_batch(
        {"deletion": pa.array(deletions, pa.binary()), "error": pa.array(errors, pa.binary())}
    )


def _pickled_error(error: Exception) -> bytes:
    """``error`` pickled; as a plain error with its text if it does not pickle."""
    try:
        return pickle.dumps(error)
    except Exception:
        return pickle.dumps(BlobhouseError(f"{type(error).__name__}: {error}"))
