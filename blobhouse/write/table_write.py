"""One write to a table, as a change (:mod:`blobhouse.commit.change`): planned once, its data
files written anywhere (here, or by Spark tasks), committed once.

:func:`begin_write` checks the target and plans the write (:class:`TableWrite`, what the tasks
run); the attempt it returns commits or aborts where it began.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array
>>> data = pa.table({"id": [1, 2], "img": blob_array([b"x", b"x"])})
>>> write = begin_write(tempfile.mkdtemp() + "/t", data.schema, in_tasks=True)
>>> written = write.plan.write(data.to_batches())  # in a Spark task, say
>>> write.commit(written).snapshot.count_rows()
2
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import lance
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.fragment import DataFile, FragmentMetadata
from lance.schema import LanceSchema

from blobhouse.columns import check_column_names
from blobhouse.commit.change import Attempt, BaseChange, Staged, run_change
from blobhouse.commit.transaction import TableCreatedMeanwhile, Transaction
from blobhouse.errors import (
    InvalidInputError,
    PropertyConflictError,
    SchemaError,
    StaleWriteError,
    TableExistsError,
    TableNotFoundError,
    cleanup_after,
)
from blobhouse.files.references import leaf_field_ids
from blobhouse.files.session import WrittenFile
from blobhouse.io.objects import checked_options
from blobhouse.layout import LEASES_DIR, PACKS_DIR, STORE_DIR, TableLocation, sidecar_folder
from blobhouse.options import WriteOptions
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties, field_ids
from blobhouse.snapshot import TableSnapshot, open_dataset
from blobhouse.store.packs import store_base
from blobhouse.store.records import write_record
from blobhouse.values import find_blob_columns, path_name
from blobhouse.write.pipeline import WritePlan, check_same_schema, plan_write, write_data_files
from blobhouse.write.prepare import (
    allowed_bases_of,
    blob_names,
    check_new_table_folder,
    kept_properties,
    properties_of,
    relocate_store,
    remove_empty_local_dirs,
    with_store,
)

WriteMode = Literal["create", "append", "overwrite"]


@dataclass(frozen=True)
class TableWrite:
    """A planned write (the plan of a :class:`WriteChange`): the data files it writes
    (:meth:`write`, here or in Spark tasks: the object pickles), then one commit of them all
    on its :class:`~blobhouse.commit.transaction.Transaction`, or an abort that removes them."""

    transaction: Transaction
    plan: WritePlan
    appending: bool
    mode: WriteMode = "append"
    properties: TableProperties | None = None  # what a create or an overwrite records
    store_first: bool = False  # payloads stored before the rows, under the write's id

    @classmethod
    def planned(cls, at: TableSnapshot | None, request: WriteChange) -> TableWrite:
        """The write ``request`` asks for, planned on ``at`` (None: it creates the table)."""
        options, location, storage_options = (
            request.options,
            request.location,
            request.storage_options,
        )
        existing = at.dataset if at is not None else None
        appending = request.mode == "append" and existing is not None
        kept = kept_properties(existing, appending)
        bases = allowed_bases_of(
            existing, options.allowed_bases, appending, location.root_uri, options.managed_bases
        )
        if appending:
            options = kept.resolve(options, columns=blob_names(existing.schema))
        else:
            named = sorted(options.blob_columns)
            columns = [path_name(p) for p in find_blob_columns(request.schema, named)]
            options = kept.for_new_table(options, columns)
        plan = plan_write(
            request.schema,
            **options.layout(),
            table_schema=existing.schema if appending else None,
            allowed_bases=bases,
        )
        if plan.uses_store:
            existing, base_id = with_store(location, existing, storage_options)
            # tasks that get no shuffle claim each new payload, so one of them stores it
            claim = request.in_tasks and request.load_store_index
            plan = replace(
                plan,
                store_base_id=base_id,
                load_store_index=request.load_store_index,
                claim_payloads=claim,
            )
        read_version = existing.version if existing is not None else None
        transaction = Transaction.start(
            location, read_version, storage_options, id=request.write_id
        )
        recorded = None if appending else properties_of(plan, options)
        store_first = request.write_id is not None
        return cls(transaction, plan, appending, request.mode, recorded, store_first)

    @property
    def location(self) -> TableLocation:
        return self.transaction.location

    @property
    def storage_options(self) -> dict[str, str] | None:
        return self.transaction.storage_options

    @property
    def read_version(self) -> int | None:
        return self.transaction.read_version

    @property
    def name_prefix(self) -> str:
        """Every data file this write stages is named ``<write id>-<uuid>.lance``."""
        return self.transaction.name_prefix

    def write(self, batches: Iterable[pa.RecordBatch]) -> list[WrittenFile]:
        """Write data files (and sidecars) for ``batches``; nothing is visible until commit.

        Runs once per Spark task: on failure it removes only its own files (other tasks of the
        same write, or a retry of this one, may still commit).
        """
        txn, location, options = self.transaction, self.location, self.storage_options
        try:
            written = write_data_files(batches, self.plan, location, options, self.name_prefix)
        except BaseException as exc:
            cleanup_after(exc, lambda: txn.end_task(None))
            if self.read_version is None:
                self._remove_empty_dirs()
            raise
        if self.plan.claim_payloads:  # a Spark task: its payloads' entries skip the driver
            written = _recorded(written, txn, options)
        # a Spark task can finish after the job was aborted and swept: it cleans up itself
        # (its record too)
        txn.end_task(written)
        return written

    def commit(self, written: Sequence[WrittenFile]) -> TableSnapshot:
        """Make every written file visible in one Lance transaction; a store-first write's
        commit also records what it stored before its rows (:mod:`blobhouse.store.records`).

        A write that created the table and lost that race to another creator commits again
        on the table the other one made: as an append (``mode="append"``) or an overwrite,
        or not at all (``mode="create"``: :class:`TableExistsError`). An append of no rows
        commits nothing (no new version)."""
        if self.appending and not any(w.num_rows for w in written):
            self.abort(written)  # its lease (and any empty file)
            dataset = self.transaction.read_dataset()
            return TableSnapshot(dataset, self.location, self.storage_options)
        try:
            dataset = self.transaction.commit(
                written,
                lambda: self._operation(written),
                recorded=self.store_first or self.plan.claim_payloads,
            )
        except TableCreatedMeanwhile:
            try:
                again = self._on_table_made_meanwhile()
            except BaseException as exc:
                cleanup_after(exc, lambda: self.abort(written))
                raise
            return again.commit(written)
        except BaseException:
            self._remove_empty_dirs_if_new()
            raise
        return TableSnapshot(dataset, self.location, self.storage_options)

    def abort(self, written: Sequence[WrittenFile], *, tasks_may_run: bool = False) -> None:
        """Remove files this write created; a table that did not exist is left absent
        (``tasks_may_run``: see :meth:`Transaction.abort`)."""
        self.transaction.abort(written, tasks_may_run=tasks_may_run)
        self._remove_empty_dirs_if_new()

    def _remove_empty_dirs_if_new(self) -> None:
        """Remove the directories a failed create made, if they are local and empty."""
        if self.read_version is None:
            self._remove_empty_dirs()

    def _remove_empty_dirs(self) -> None:
        root = self.location.root
        store = f"{root}/{STORE_DIR}"
        remove_empty_local_dirs(
            self.location.data_dir,
            f"{root}/{LEASES_DIR}",
            f"{store}/{PACKS_DIR}",
            store,
            root,
        )

    def _on_table_made_meanwhile(self) -> TableWrite:
        """This write, planned again on the table another writer created while it ran."""
        location, options = self.location, self.storage_options
        if self.mode == "create":
            raise TableExistsError(
                f"table {location} was created by another writer while this write ran; "
                "nothing of this write was committed (use mode='append' to add to it)"
            )
        existing = lance.dataset(location.dataset_path, storage_options=options)
        check_same_schema(self.plan.table_schema, existing.schema)
        theirs = AllowedBases.of_table(existing.schema, location.root_uri).bases
        if self.plan.allowed_bases.bases and self.plan.allowed_bases.bases != theirs:
            raise PropertyConflictError(
                f"table {location} was created meanwhile with allowed_bases {theirs}; this "
                f"write asked for {self.plan.allowed_bases.bases} and committed nothing"
            )
        their_properties = TableProperties.of(existing)
        for column in self.plan.columns:
            if their_properties.dedup_of(column.name) != column.dedup:
                raise PropertyConflictError(
                    f"table {location} was created meanwhile with dedup "
                    f"{their_properties.dedup_of(column.name)!r} for column {column.name!r}; "
                    f"this write stored it with {column.dedup!r} and committed nothing (retry "
                    "it: it then uses the table's)"
                )
        if self.plan.uses_store:
            existing, base_id = with_store(location, existing, options)
            if base_id != self.plan.store_base_id:
                raise StaleWriteError(
                    f"table {location} was created meanwhile and registered its store as "
                    f"base {base_id}; nothing of this write was committed, retry it"
                )
        return replace(
            self,
            transaction=self.transaction.on_version(existing.version),
            appending=self.mode == "append",
        )

    def _operation(self, written: Sequence[WrittenFile]) -> LanceOperation.BaseOperation:
        if self.appending:
            dataset = self.transaction.read_dataset()
            ids = leaf_field_ids(dataset.lance_schema.fields())
            return LanceOperation.Append([w.fragment(ids) for w in written])
        fields = LanceSchema.from_pyarrow(self.plan.table_schema).fields()
        schema = self.properties.recorded_in(self.plan.table_schema, field_ids(fields))
        ids = leaf_field_ids(fields)
        # a new table that stores payloads globally (or will: its mode is global, its blob
        # columns may come later) registers its store as it is created
        global_mode = self.plan.uses_store or self.properties.dedup == "global"
        bases = (
            [store_base(self.location, None)] if global_mode and self.read_version is None else None
        )
        return LanceOperation.Overwrite(
            schema, [w.fragment(ids) for w in written], initial_bases=bases
        )


def _recorded(
    written: list[WrittenFile], txn: Transaction, storage_options: dict[str, str] | None
) -> list[WrittenFile]:
    """``written`` with the store payloads they added moved to a record of the write
    (:mod:`blobhouse.store.records`): the commit streams them into the store's index, so the
    driver's memory does not grow with a write's new payloads."""
    stored = [s for w in written for s in w.stored]
    if not stored:
        return written
    write_record(txn.location.root, txn.id, stored, storage_options)
    return [replace(w, stored=(), recorded_bytes=sum(s.size for s in w.stored)) for w in written]


@dataclass(frozen=True)
class _AddFile(BaseChange[Transaction, None]):
    """A data file written by a session (:class:`~blobhouse.files.session.BlobSession`), appended as
    one new fragment; its transaction is named by the file, so its lease covers the file and
    its sidecar directory."""

    written: WrittenFile

    def plan(self, snapshot: TableSnapshot) -> Transaction:
        data_file = DataFile.create(snapshot.dataset, self.written.name)
        fields = snapshot.dataset.lance_schema.fields()
        missing = [
            f.name() for f in fields if not set(leaf_field_ids([f])) <= set(data_file.fields)
        ]
        if missing:
            raise SchemaError(
                f"data file {self.written.name} lacks column(s) {missing} of the table; a new "
                "fragment holds every column"
            )
        prefix = sidecar_folder(self.written.name)
        return Transaction(snapshot.location, snapshot.version, snapshot.storage_options, prefix)

    def stage(self, txn: Transaction, staged: Staged) -> None:
        staged.written.append(self.written)  # written already: an abort removes it

    def commit(self, txn: Transaction, staged: Staged) -> LanceDataset:
        data_file = DataFile.create(txn.read_dataset(), self.written.name)
        fragment = FragmentMetadata(id=0, files=[data_file], physical_rows=self.written.num_rows)
        return txn.commit(staged.written, lambda: LanceOperation.Append([fragment]))

    def report(self, *_: object) -> None:
        return None


def add_data_file(snapshot: TableSnapshot, written: WrittenFile) -> TableSnapshot:
    """Append ``written`` (a session's data file of the table) as one new fragment; the
    committed snapshot. Its columns must be all of the table's."""
    return run_change(_AddFile(written), snapshot, retries=0).snapshot


@dataclass(frozen=True)
class WriteChange(BaseChange[TableWrite, TableSnapshot]):
    """A write of data shaped as ``schema`` to the table at ``location``, as a change: planned
    on the table as it is (or on none: a create), its files staged from ``batches`` here, or
    by Spark tasks (``in_tasks``: ``batches`` is None, the tasks hand their files to the
    commit); the report is the committed snapshot."""

    location: TableLocation
    schema: pa.Schema
    options: WriteOptions
    mode: WriteMode
    storage_options: dict[str, str] | None = field(
        default=None, repr=False
    )  # credentials: never printed
    load_store_index: bool = True
    write_id: str | None = None
    batches: Iterable[pa.RecordBatch] | None = field(default=None, compare=False)

    @property
    def in_tasks(self) -> bool:  # type: ignore[override]
        return self.batches is None

    def plan(self, snapshot: TableSnapshot | None) -> TableWrite:
        return TableWrite.planned(snapshot, self)

    def stage(self, write: TableWrite, staged: Staged) -> None:
        if self.batches is not None:
            staged.written.extend(write.write(self.batches))

    def commit(self, write: TableWrite, staged: Staged) -> LanceDataset:
        return write.commit(staged.written).dataset

    def report(
        self, write: TableWrite, staged: Staged, committed: TableSnapshot, attempt: int
    ) -> TableSnapshot:
        return committed

    def abort(self, write: TableWrite, staged: Staged, *, tasks_may_run: bool) -> None:
        write.abort(staged.written, tasks_may_run=tasks_may_run)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "batches": None}  # a stream stays where it was read


WriteAttempt = Attempt[TableWrite, TableSnapshot]


def begin_write(
    uri: str,
    schema: pa.Schema,
    options: WriteOptions | None = None,
    *,
    mode: WriteMode = "create",
    storage_options: dict[str, str] | None = None,
    branch: str | None = None,
    batches: Iterable[pa.RecordBatch] | None = None,
    in_tasks: bool = False,
    load_store_index: bool = True,
    write_id: str | None = None,
    allow_nonempty_folder: bool = False,
) -> WriteAttempt:
    """Check ``mode`` against the table at ``uri``, and plan the write of data shaped as
    ``schema``: of ``batches`` in this process (:meth:`~blobhouse.commit.change.Attempt.run`),
    or, ``in_tasks``, by Spark tasks that run ``attempt.plan.write`` and hand their files to
    ``attempt.commit`` (the attempt pickles, so the commit may run in another process).

    ``load_store_index=False``: the rows were already looked up in the table's store (a
    Spark join), so the writing tasks do not load its index. ``write_id``: the id of a
    write that already staged files (store packs stored before the rows: a store-first write,
    :mod:`blobhouse.write.store_first`, whose records of what it stored the commit reads)."""
    if mode not in ("create", "append", "overwrite"):
        raise InvalidInputError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
    if (batches is None) != in_tasks:
        raise ValueError("a write stages either batches here or files in tasks (in_tasks)")
    check_column_names(schema)  # before the table is looked at: nothing is written
    storage_options = checked_options(storage_options)
    location = TableLocation.of(uri, branch, storage_options)
    existing = open_dataset(location, None, storage_options, doing="write to")
    if existing is None and location.branch is None:
        check_new_table_folder(location.root, allow_nonempty_folder, storage_options)
    if existing is None and location.branch is not None:
        raise TableNotFoundError(
            f"no branch {location.branch!r} in {location.root} (make it with Lance's create_branch)"
        )
    if mode == "create" and existing is not None:
        raise TableExistsError(f"table {uri} already exists (use mode='append' or 'overwrite')")
    at = None
    if existing is not None:
        existing = relocate_store(existing, location, storage_options)
        at = TableSnapshot(existing, location, storage_options)
    request = WriteChange(
        location,
        schema,
        options or WriteOptions(),
        mode,
        storage_options,
        load_store_index,
        write_id,
        batches,
    )
    return Attempt.begin(request, at)
