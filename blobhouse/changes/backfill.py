"""Column backfill: compute a blob column for existing rows, one data file per fragment, and swap
the files in with one transaction (Lance ``Merge`` for a new column, ``DataReplacement`` for an
existing one: the geneva-style backfill of seed 001).

The per-fragment step (:func:`backfill_fragment`) is a unit of a
:class:`~blobhouse.commit.runners.Runner` -- in this process for ``Table.backfill_blob_column``,
Spark tasks for ``blobhouse.spark.backfill_blob_column`` -- and writes through the same write
pipeline as every other write. With ``dedup="global"`` each fragment's store writer claims the
new payloads it stores, so that a payload several fragments compute is stored once
(:mod:`blobhouse.store.claims`, as an update's fragments do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.blob import blob_field as lance_blob_field
from lance.fragment import DataFile
from lance.schema import LanceSchema

from blobhouse.changes.schema_changes import add_null_blob_column
from blobhouse.columns import check_new_name, resolve_column
from blobhouse.commit.change import BaseChange, Committed, Planned, Staged, run_change
from blobhouse.commit.runners import HERE, Runner
from blobhouse.commit.transaction import Transaction
from blobhouse.errors import InvalidInputError, SchemaError, cleanup_after
from blobhouse.files.session import WrittenFile
from blobhouse.placement import AllowedBases, placement_metadata
from blobhouse.properties import DEDUP_KEY, TableProperties
from blobhouse.store.packs import store_base_id
from blobhouse.values import blob_array, get_field, is_lance_blob_field, stored_blob_columns
from blobhouse.write.pipeline import DataFileWriter, plan_write, store_writer_for_plan
from blobhouse.write.prepare import prepared_for_write

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

BlobFunction = Callable[[pa.RecordBatch], Any]


@dataclass(frozen=True)
class BackfillPlan:
    """What one backfill writes: which columns each new data file holds, and how to place them.

    For a new column every file holds just that column; for an existing one each file holds the
    columns of the data file it replaces (they must share one layout across fragments).
    """

    column: str
    file_columns: tuple[str, ...]
    field_ids: tuple[int, ...]
    new_column: bool
    input_columns: tuple[str, ...]
    dedup: str
    placement: dict[bytes, bytes]
    allowed_bases: AllowedBases
    transaction: Transaction
    store_base_id: int | None = None  # dedup="global": the table's store (prepared_for_write)
    recorded: Mapping[bytes, bytes] | None = None  # a new column's own properties

    @property
    def name_prefix(self) -> str:
        """What the files this backfill stages are named with."""
        return self.transaction.name_prefix

    @classmethod
    def create(cls, table: TableSnapshot, column: str, dedup: str = "content") -> BackfillPlan:
        """The backfill of ``column`` with ``dedup`` (its mode: see
        :meth:`~blobhouse.properties.TableProperties.change_mode`)."""
        schema = table.schema
        if isinstance(column, str) and "." in column:
            # nested blob columns exist already (Table.backfill_blob_column updates them);
            # a new one would be a new struct field, which Lance's Merge cannot add
            path = resolve_column(schema, column, "blob column to backfill")
            kind = "" if is_lance_blob_field(get_field(schema, path)) else " (not a blob column)"
            raise InvalidInputError(
                f"backfill adds top-level blob columns only: {column!r} is inside struct "
                f"{path[0]!r}{kind}"
            )
        blob_columns = {p[0] for p in stored_blob_columns(schema)}
        input_columns = tuple(n for n in schema.names if n not in blob_columns and n != column)
        bases = AllowedBases.of_table(schema, table.uri)
        txn = Transaction.start(
            table.location, table.version, table.storage_options, kind="backfill"
        )
        store = store_base_id(table.dataset) if dedup == "global" else None
        if dedup == "global" and store is None:
            raise InvalidInputError(
                "dedup='global' backfills a table with a store (prepared_for_write)"
            )
        if column not in schema.names:
            check_new_name(column, "backfill")
            field_id = _new_field_id(table.dataset, column)
            properties = TableProperties.of(table.dataset)
            own = properties.recorded and dedup != properties.dedup
            return cls(
                column,
                (column,),
                () if field_id is None else (field_id,),  # (): Lance adds it first
                True,
                input_columns,
                dedup,
                {},
                bases,
                txn,
                store_base_id=store,
                recorded={DEDUP_KEY: dedup.encode()} if own else None,
            )
        if not is_lance_blob_field(schema.field(column)):
            raise SchemaError(f"column {column!r} exists and is not a blob column")
        layout = _file_layout(table.dataset, column)
        names = _names_of(table.dataset, layout)
        stored_blobs = [n for n in names if n in blob_columns and n != column]
        if stored_blobs:
            raise SchemaError(
                f"column {column!r} shares its data files with blob column(s) {stored_blobs}; "
                "backfill can only replace files whose other columns are plain columns"
            )
        return cls(
            column,
            tuple(names),
            layout,
            False,
            input_columns,
            dedup,
            placement_metadata(schema.field(column).metadata),
            bases,
            txn,
            store_base_id=store,
        )


def backfill_fragment(
    table: TableSnapshot, fragment_id: int, fn: BlobFunction, plan: BackfillPlan
) -> WrittenFile:
    """Compute ``plan.column`` for every physical row of one fragment and write its new file:
    one unit of a backfill, here or in a Spark task.

    ``fn`` gets Arrow batches of the fragment's live rows (the table's non-blob columns) and
    returns one blob value per row (bytes, URI, :class:`Blob`, None, or an Arrow array of them).
    Deleted rows get null.
    """
    try:
        with plan.transaction.lease():
            written = _backfill_fragment(table, fragment_id, fn, plan)
    except BaseException as exc:
        cleanup_after(exc, lambda: plan.transaction.end_task(None))
        raise
    # a Spark task can finish after the job was aborted and swept: it cleans up itself
    plan.transaction.end_task([written])
    return written


def _backfill_fragment(
    table: TableSnapshot, fragment_id: int, fn: BlobFunction, plan: BackfillPlan
) -> WrittenFile:
    read = set(plan.input_columns) | (set(plan.file_columns) - {plan.column})
    batches = _fragment_batches(table, fragment_id, plan, read)
    fragment = table.dataset.get_fragment(fragment_id)
    writer: DataFileWriter | None = None
    store = None
    rows = 0
    try:
        for batch in batches:
            out = _file_batch(batch, fn, plan, rows)
            if writer is None:  # the file's schema is the function's first values'
                write = _write_plan(out.schema, plan)
                where, options = table.location, table.storage_options
                store = store_writer_for_plan(write, where, options, plan.name_prefix)
                writer = DataFileWriter(write, where, options, plan.name_prefix, store)
            writer.write(out, first_row=rows)
            rows += batch.num_rows
        if writer is None:
            raise InvalidInputError(f"fragment {fragment_id} has no rows to backfill")
        written = writer.finish()
        if store is not None:
            store.finish()  # its packs complete (an object store's uploads too)
    except BaseException as exc:
        cleanup_after(
            exc,
            *([writer.abort] if writer is not None else []),
            *([store.abort] if store is not None else []),
        )
        raise
    check_fragment_rows(written, fragment)
    return written


def check_fragment_rows(written: WrittenFile, fragment) -> None:
    """A new file of a fragment's columns holds exactly one row per physical row."""
    if written.num_rows != fragment.metadata.physical_rows:
        raise InvalidInputError(
            f"fragment {fragment.fragment_id}: wrote {written.num_rows} rows, the fragment has "
            f"{fragment.metadata.physical_rows}"
        )


def commit_backfill(
    table: TableSnapshot, plan: BackfillPlan, files: Mapping[int, WrittenFile]
) -> LanceDataset:
    """Swap the new files in for every fragment in one Lance transaction."""
    dataset = table.dataset
    fragments = dataset.get_fragments()
    unknown = sorted(set(files) - {f.fragment_id for f in fragments})
    missing = sorted({f.fragment_id for f in fragments} - set(files))
    if unknown or (missing and plan.new_column):
        raise InvalidInputError(
            f"files for column {plan.column!r}: no such fragment(s) {unknown}; a new column "
            f"needs every fragment, missing {missing if plan.new_column else []}"
        )
    fragments = [f for f in fragments if f.fragment_id in files]
    for fragment in fragments:
        written = files[fragment.fragment_id]
        if written.num_rows != fragment.metadata.physical_rows:
            raise InvalidInputError(
                f"fragment {fragment.fragment_id} has {fragment.metadata.physical_rows} rows, "
                f"its new file for {plan.column!r} has {written.num_rows}"
            )
    ids = list(plan.field_ids)
    location, options = table.location, table.storage_options
    add_first = plan.new_column and not ids
    transaction = plan.transaction
    if add_first:  # a dropped column's id is reserved: Lance adds the column, the files fill it
        dataset, added = add_null_blob_column(
            location, plan.column, dataset.version, options, plan.recorded
        )
        ids = [added]
        transaction = transaction.on_version(dataset.version)
    if plan.new_column and not add_first:
        merged = []
        for fragment in fragments:
            metadata = fragment.metadata
            metadata.files.append(files[fragment.fragment_id].data_file(ids))
            merged.append(metadata)
        new_field = lance_blob_field(plan.column)
        schema = dataset.schema.append(new_field.with_metadata(plan.recorded or None))
        operation = LanceOperation.Merge(merged, LanceSchema.from_pyarrow(schema))
    else:
        operation = LanceOperation.DataReplacement(
            [
                LanceOperation.DataReplacementGroup(
                    f.fragment_id, files[f.fragment_id].data_file(ids)
                )
                for f in fragments
            ]
        )
    return transaction.commit(list(files.values()), lambda: operation)


def backfill(
    table: TableSnapshot, column: str, dedup: str, fn: BlobFunction, *, runner: Runner = HERE
) -> Committed[None]:
    """Backfill ``column`` with ``fn``'s values (written with ``dedup``, see
    :meth:`~blobhouse.properties.TableProperties.change_mode`) in one commit, each fragment's
    file written by ``runner`` (default: one after another in this process; Spark runs them as
    tasks); the committed snapshot. A conflicting commit meanwhile fails it
    (:class:`~blobhouse.errors.ConcurrentCommitError`), leaving the table as it was."""
    return run_change(_Backfill(column, dedup, fn, runner), table, retries=0)


@dataclass(frozen=True)
class _Backfill(BaseChange):
    """A backfill as a :class:`~blobhouse.commit.change.Change`."""

    column: str
    dedup: str
    fn: BlobFunction
    runner: Runner

    @property
    def in_tasks(self) -> bool:  # type: ignore[override]
        return self.runner.in_tasks

    def plan(self, snapshot: TableSnapshot) -> Planned[BackfillPlan]:
        table = prepared_for_write(snapshot, self.dedup)
        return Planned(table, BackfillPlan.create(table, self.column, self.dedup))

    def stage(self, run: Planned[BackfillPlan], staged: Staged) -> None:
        fn, plan = self.fn, run.plan  # what a Spark task gets: not the change and its runner
        ids = [f.fragment_id for f in run.table.dataset.get_fragments()]
        written = self.runner.map(
            run.table, lambda at, i: backfill_fragment(at, i, fn, plan), ids, "backfill"
        )
        staged.written.extend(written)
        staged.detail = dict(zip(ids, written, strict=True))

    def commit(self, run: Planned[BackfillPlan], staged: Staged) -> LanceDataset:
        return commit_backfill(run.table, run.plan, staged.detail)

    def report(self, *_: object) -> None:
        return None  # a backfill reports nothing but the version it committed


def replace_files(
    table: TableSnapshot, column: str, files: Mapping[int, WrittenFile]
) -> TableSnapshot:
    """Make session-written ``files`` (fragment id -> file) the data of blob ``column`` in one
    commit (see :meth:`blobhouse.Table.replace_column`); the committed snapshot."""
    return run_change(_ReplaceFiles(column, dict(files)), table, retries=0).snapshot


@dataclass(frozen=True)
class _ReplaceFiles(BaseChange):
    """Files a session wrote, swapped in as a backfill's would be."""

    column: str
    files: dict[int, WrittenFile]

    def plan(self, snapshot: TableSnapshot) -> Planned[BackfillPlan]:
        plan = BackfillPlan.create(snapshot, self.column)
        if not plan.new_column:
            for fragment_id, written in self.files.items():
                held = DataFile.create(snapshot.dataset, written.name).fields
                if list(held) != list(plan.field_ids):
                    raise SchemaError(
                        f"file {written.name} for fragment {fragment_id} must hold the columns "
                        f"{list(plan.file_columns)} in that order, like the file it replaces"
                    )
        return Planned(snapshot, plan)

    def stage(self, run: Planned[BackfillPlan], staged: Staged) -> None:
        staged.written.extend(self.files.values())  # written already: an abort removes them

    def commit(self, run: Planned[BackfillPlan], staged: Staged) -> LanceDataset:
        return commit_backfill(run.table, run.plan, self.files)

    def report(self, *_: object) -> None:
        return None


def _fragment_batches(
    table: TableSnapshot, fragment_id: int, plan: BackfillPlan, columns: Iterable[str]
) -> Iterator[pa.RecordBatch]:
    fragment = table.dataset.get_fragment(fragment_id)
    if fragment is None:
        raise InvalidInputError(f"no fragment {fragment_id} in table {table.uri}")
    return table.dataset.scanner(
        fragments=[fragment], columns=sorted(columns), include_deleted_rows=True, with_row_id=True
    ).to_batches()


def _live_values(
    batch: pa.RecordBatch, fn: BlobFunction, plan: BackfillPlan, first_row: int
) -> tuple[pa.Array, np.ndarray]:
    live = batch.column("_rowid").is_valid().to_numpy(zero_copy_only=False)
    inputs = batch.select(list(plan.input_columns)).filter(pa.array(live))
    return _as_blob_array(fn(inputs), inputs.num_rows, plan.column, first_row), live


def _file_batch(
    batch: pa.RecordBatch, fn: BlobFunction, plan: BackfillPlan, first_row: int
) -> pa.RecordBatch:
    values, live = _live_values(batch, fn, plan, first_row)
    if not live.all():
        positions = np.full(batch.num_rows, -1, dtype=np.int64)
        positions[live] = np.arange(int(live.sum()))
        values = values.take(pa.array(positions, mask=~live))
    columns = [values if name == plan.column else batch.column(name) for name in plan.file_columns]
    return pa.RecordBatch.from_arrays(columns, names=list(plan.file_columns))


def _as_blob_array(values: Any, rows: int, column: str, first_row: int) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = blob_array(list(values))
    if len(values) != rows:
        raise InvalidInputError(
            f"backfill of {column!r}: the function returned {len(values)} values for a batch of "
            f"{rows} rows (starting at physical row {first_row})"
        )
    return values


def _write_plan(schema: pa.Schema, plan: BackfillPlan):
    field = schema.field(plan.column)
    schema = schema.set(
        schema.get_field_index(plan.column),
        field.with_metadata({**(field.metadata or {}), **plan.placement}),
    )
    write = plan_write(
        schema,
        blob_columns=[plan.column],
        dedup=plan.dedup,
        allowed_bases=plan.allowed_bases,
        max_rows_per_file=2**62,
        max_bytes_per_file=2**62,
    )
    # a fragment's store writer claims its new payloads: another fragment's (in this process
    # or a Spark task) borrows them rather than storing them again
    return replace(
        write, store_base_id=plan.store_base_id, claim_payloads=plan.store_base_id is not None
    )


def _new_field_id(dataset: LanceDataset, column: str) -> int | None:
    """The id Lance gives a column appended to the schema in a ``Merge``; None where Lance
    would refuse that Merge (ids not dense, or a dropped column's id still reserved): then
    the column is added first, all null, and its files replace the nulls (two commits)."""
    current = dataset.lance_schema
    appended = LanceSchema.from_pyarrow(dataset.schema.append(lance_blob_field(column)))
    new_id = appended.fields()[-1].id()
    # a dropped column keeps its id while a data file still holds it
    held = [i for f in dataset.get_fragments() for d in f.metadata.files for i in d.fields]
    if _ids(current.fields()) != _ids(appended.fields()[:-1]) or new_id <= max(held, default=-1):
        return None
    return new_id


def _ids(fields) -> list[int]:
    out = []
    for field in fields:
        out.append(field.id())
        out.extend(_ids(field.children()))
    return out


def _file_layout(dataset: LanceDataset, column: str) -> tuple[int, ...]:
    """Field ids of the data file that holds ``column``, identical in every fragment."""
    field_id = next(f.id() for f in dataset.lance_schema.fields() if f.name() == column)
    layouts = set()
    for fragment in dataset.get_fragments():
        holding = [f for f in fragment.metadata.files if field_id in f.fields]
        if len(holding) > 1:
            raise SchemaError(f"fragment {fragment.fragment_id} has no single file for {column!r}")
        # a column added by Lance's add_columns has no file yet: the new file holds it alone
        layouts.add(tuple(holding[0].fields) if holding else (field_id,))
    if len(layouts) != 1:
        raise SchemaError(f"column {column!r} is stored in differently shaped files per fragment")
    return layouts.pop()


def _names_of(dataset: LanceDataset, field_ids: tuple[int, ...]) -> list[str]:
    by_id = {f.id(): f.name() for f in dataset.lance_schema.fields()}
    unknown = [i for i in field_ids if i not in by_id]
    if unknown:
        raise SchemaError("backfill replaces files of top-level columns only")
    return [by_id[i] for i in field_ids]
