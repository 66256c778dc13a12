"""TableWrite: one write to a table -- planned once, data files written anywhere, committed once.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array
>>> data = pa.table({"id": [1, 2], "img": blob_array([b"x", b"x"])})
>>> write = TableWrite.begin(tempfile.mkdtemp() + "/t", data.schema)
>>> write.commit(write.write(data.to_batches())).count_rows()
2
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import lance
import pyarrow as pa
from lance import LanceOperation
from lance.schema import LanceSchema

from blobhouse.commit import leases
from blobhouse.commit.transaction import TableCreatedMeanwhile, Transaction
from blobhouse.errors import (
    InvalidInputError,
    PropertyConflictError,
    StaleWriteError,
    TableExistsError,
    TableNotFoundError,
)
from blobhouse.layout import STORE_DIR, TableLocation
from blobhouse.options import WriteOptions
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties, field_ids
from blobhouse.references import leaf_field_ids
from blobhouse.session import WrittenFile
from blobhouse.snapshot import TableSnapshot, open_dataset
from blobhouse.storage import checked_options
from blobhouse.store.packs import PACKS_DIR, store_base
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
    """One write to a table: planned once, data files written anywhere, committed once, on
    one :class:`~blobhouse.commit.transaction.Transaction`.

    :func:`blobhouse.write_table` runs all three steps in one process; the Spark writer plans on the
    driver, writes in tasks and commits on the driver. The object pickles, so it travels to the
    tasks and to the commit. A write that does not commit removes what it wrote (:meth:`abort`).
    """

    transaction: Transaction
    plan: WritePlan
    appending: bool
    mode: WriteMode = "append"
    properties: TableProperties | None = None  # what a create or an overwrite records

    @classmethod
    def begin(
        cls,
        uri: str,
        schema: pa.Schema,
        options: WriteOptions | None = None,
        *,
        mode: WriteMode = "create",
        storage_options: dict[str, str] | None = None,
        load_store_index: bool = True,
        branch: str | None = None,
        write_id: str | None = None,
        allow_nonempty_folder: bool = False,
    ) -> TableWrite:
        """Check the mode against the table, and plan the write of data shaped as ``schema``.

        ``load_store_index=False``: the rows were already looked up in the table's store (a
        Spark join), so the writing tasks do not load its index. ``write_id``: the id of a
        write that already staged files (store packs stored before the rows)."""
        if mode not in ("create", "append", "overwrite"):
            raise InvalidInputError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
        options = options or WriteOptions()
        storage_options = checked_options(storage_options)
        location = TableLocation.of(uri, branch, storage_options)
        existing = open_dataset(location, None, storage_options)
        if existing is None and location.branch is None:
            check_new_table_folder(location.root, allow_nonempty_folder)
        if existing is None and location.branch is not None:
            raise TableNotFoundError(
                f"no branch {location.branch!r} in {location.root} (make it with Lance's "
                "create_branch)"
            )
        if mode == "create" and existing is not None:
            raise TableExistsError(f"table {uri} already exists (use mode='append' or 'overwrite')")
        if existing is not None:
            existing = relocate_store(existing, location, storage_options)
        appending = mode == "append" and existing is not None
        kept = kept_properties(existing, appending)
        bases = allowed_bases_of(
            existing, options.allowed_bases, appending, location.root_uri, options.managed_bases
        )
        if appending:
            options = kept.resolve(options, columns=blob_names(existing.schema))
        else:
            named = sorted(options.blob_columns)
            columns = [path_name(p) for p in find_blob_columns(schema, named)]
            options = kept.for_new_table(options, columns)
        plan = plan_write(
            schema,
            **options.layout(),
            table_schema=existing.schema if appending else None,
            allowed_bases=bases,
        )
        if plan.uses_store:
            existing, base_id = with_store(location, existing, storage_options)
            plan = replace(plan, store_base_id=base_id, load_store_index=load_store_index)
        read_version = existing.version if existing is not None else None
        transaction = Transaction.start(location, read_version, storage_options, id=write_id)
        recorded = None if appending else properties_of(plan, options)
        return cls(transaction, plan, appending, mode, recorded)

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

    def run(self, batches: Iterable[pa.RecordBatch]) -> TableSnapshot:
        """Write ``batches`` and commit them: the whole write in this process."""
        try:
            written = self.write(batches)
        except BaseException:
            self.abort([])  # the files are gone already; the lease and new directories go too
            raise
        return self.commit(written)

    def write(self, batches: Iterable[pa.RecordBatch]) -> list[WrittenFile]:
        """Write data files (and sidecars) for ``batches``; nothing is visible until commit.

        Runs once per Spark task: on failure it removes only its own files (other tasks of the
        same write, or a retry of this one, may still commit).
        """
        txn, location, options = self.transaction, self.location, self.storage_options
        try:
            written = write_data_files(batches, self.plan, location, options, self.name_prefix)
        except BaseException:
            txn.end_task(None)
            if self.read_version is None:
                self._remove_empty_dirs()
            raise
        # a Spark task can finish after the job was aborted and swept: it cleans up itself
        txn.end_task(written)
        return written

    def commit(self, written: Sequence[WrittenFile]) -> TableSnapshot:
        """Make every written file visible in one Lance transaction.

        A write that created the table and lost that race to another creator commits again
        on the table the other one made: as an append (``mode="append"``) or an overwrite,
        or not at all (``mode="create"``: :class:`TableExistsError`). An append of no rows
        commits nothing (no new version)."""
        if self.appending and not any(w.num_rows for w in written):
            self.abort(written)  # its lease (and any empty file)
            dataset = self.transaction.read_dataset()
            return TableSnapshot(dataset, self.location, self.storage_options)
        try:
            dataset = self.transaction.commit(written, lambda: self._operation(written))
        except TableCreatedMeanwhile:
            try:
                again = self._on_table_made_meanwhile()
            except BaseException:
                self.abort(written)
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
            f"{root}/{leases.LEASES_DIR}",
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
