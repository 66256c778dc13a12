"""Table: create / append / overwrite blob tables, read them back, one Lance transaction per write.

A blobhouse table is a standard Lance 2.2 dataset. Its schema metadata ``blobhouse`` keeps the
table's settings (the allowed external bases); stock Lance readers ignore it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from itertools import chain
from typing import Any, BinaryIO, Literal

import lance
import numpy as np
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.fragment import DataFile, FragmentMetadata
from lance.schema import LanceSchema

from blobhouse import leases, mutations, schema_changes
from blobhouse.backfill import (
    BackfillPlan,
    BlobFunction,
    backfill_fragment,
    commit_backfill,
    store_writer_for,
    table_for,
)
from blobhouse.checksums import RecordedHashes
from blobhouse.columns import check_blob_column, lance_name, resolve_columns
from blobhouse.console import version_spans
from blobhouse.errors import (
    BlobhouseError,
    BlobReadError,
    InvalidInputError,
    MovedTableWarning,
    NotATableError,
    PathIsFileError,
    PathNotFoundError,
    PropertyConflictError,
    SchemaError,
    StaleWriteError,
    TableExistsError,
    TableMetadataError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionRemovedError,
    lance_message,
)
from blobhouse.layout import STORE_DIR, BasePaths, TableLocation
from blobhouse.maintenance import compaction, garbage_collection, verification
from blobhouse.maintenance.stats import blob_stats
from blobhouse.maintenance.walk import Progress
from blobhouse.mutations import UpdateReport
from blobhouse.options import (
    WriteOptions,
    check_flag,
    keywords_checked,
)
from blobhouse.pipeline import WritePlan, check_same_schema, plan_write, write_data_files
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties, field_ids, new_table_properties
from blobhouse.rangeio import (
    REF_TYPE,
    BlobRef,
    open_ref,
    read_ranges,
    read_ranges_arrow,
    refs_from_arrow,
)
from blobhouse.references import ReferenceResolver, Unresolved, field_id, leaf_field_ids
from blobhouse.session import WrittenFile
from blobhouse.storage import checked_options
from blobhouse.store import (
    PACKS_DIR,
    StoreIndex,
    ensure_store,
    relocate_store,
    store_base,
    store_uri_prefix,
)
from blobhouse.transaction import (
    DEFAULT_RETRIES,
    TableCreatedMeanwhile,
    Transaction,
)
from blobhouse.values import (
    Blob,
    ColumnPath,
    blob_array,
    find_blob_columns,
    get_column,
    get_field,
    path_name,
    replace_column,
    replace_field,
    stored_blob_columns,
)

BlobsMode = Literal["refs", "bytes", "descriptors"]
WriteMode = Literal["create", "append", "overwrite"]
_ROW_ADDRESS = "_rowaddr"
_ROW_ID = "_rowid"
#: a blob column to convert: (its path in a read batch, its path in the table)
BlobTarget = tuple[ColumnPath, ColumnPath]


@dataclass(frozen=True)
class Selection:
    """What ``columns=`` selects (see :func:`blobhouse.columns.resolve_column`): a nested
    name (``meta.image``) reads as one top-level column of that name holding the field's
    values (null where a parent is null), as Lance's scan returns it; every read of a
    :class:`Table` (scan, take, take_rows, take_row_dicts) gives that same shape."""

    names: list[str]  # the output columns, as the caller named them
    lance: list[str]  # the same columns as Lance's ``columns=`` takes them
    paths: list[ColumnPath]  # their paths in the table
    blobs: list[BlobTarget]  # the blob columns they hold, to convert

    @property
    def nested(self) -> bool:
        return any(len(p) > 1 for p in self.paths)

    def flat(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch Lance's take returned (a nested column inside its pruned parent struct)
        in the scan's shape: each nested column its own top-level column."""
        if not self.nested:
            return batch
        arrays = [get_column(batch, p) for p in self.paths]
        fields = [
            get_field(batch.schema, p).with_name(n)
            for p, n in zip(self.paths, self.names, strict=True)
        ]
        if _ROW_ADDRESS in batch.schema.names:
            arrays.append(batch.column(_ROW_ADDRESS))
            fields.append(batch.schema.field(_ROW_ADDRESS))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def named(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A scanned batch with its columns named as the caller named them (Lance names a
        nested column by its quoted name, ``s.`a.b```)."""
        if self.lance == self.names:
            return batch
        return batch.rename_columns(self.names + batch.schema.names[len(self.names) :])


@keywords_checked
def write_table(
    data: Any,
    uri: str,
    *,
    mode: WriteMode = "create",
    blob_columns: Sequence[str] = (),
    ref_id_columns: Mapping[str, str] | None = None,
    dedup: str | Mapping[str, str] | None = None,
    placement: Mapping[str, Mapping[str, int]] | None = None,
    allowed_bases: Sequence[str] | None = None,
    managed_bases: Sequence[str] | None = None,
    max_rows_per_file: int | None = None,
    max_bytes_per_file: int | None = None,
    storage_options: dict[str, str] | None = None,
    branch: str | None = None,
    allow_nonempty_folder: bool = False,
) -> Table:
    """Write ``data`` to the blob table at ``uri`` in one Lance transaction.

    ``data`` is a pyarrow Table, RecordBatch, RecordBatchReader, iterable of RecordBatches, or a
    pandas DataFrame. ``mode="append"`` creates the table when it is missing (when several
    writers create it at once, every one's rows land); ``mode="create"`` raises
    :class:`TableExistsError` if the table exists, also when another writer created it while
    this one ran. ``branch`` writes to a branch of the table (made with Lance's
    ``create_branch``). If anything fails, the table stays at its previous version and what
    this call wrote is removed. A new table is not created in a folder that holds other files
    unless ``allow_nonempty_folder``. The other keywords are :class:`WriteOptions`
    (``managed_bases``: allowed bases whose objects the table takes ownership of once
    referenced, docs/managed-objects.md). A new table records them as its properties
    (:attr:`Table.properties`; ``dedup`` defaults to ``"global"``: each distinct payload once
    for the whole table); a write to an existing table uses the table's for the ones it
    leaves out, and refuses others than the table's (:class:`PropertyConflictError`).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> frames = pa.table({"frame": [0, 1, 2], "image": blob_array([b"cat"] * 3)})
    >>> table = write_table(frames, tempfile.mkdtemp() + "/t")
    >>> table.read_blobs("image", [0, 2])
    [b'cat', b'cat']
    """
    options = WriteOptions(
        blob_columns=blob_columns,
        ref_id_columns=ref_id_columns,
        dedup=dedup,
        placement=placement,
        allowed_bases=allowed_bases,
        managed_bases=managed_bases,
        max_rows_per_file=max_rows_per_file,
        max_bytes_per_file=max_bytes_per_file,
    )
    schema, batches = _input_stream(data)
    write = TableWrite.begin(
        uri,
        schema,
        options,
        mode=mode,
        storage_options=storage_options,
        branch=branch,
        allow_nonempty_folder=allow_nonempty_folder,
    )
    return write.run(batches)


@dataclass(frozen=True)
class TableWrite:
    """One write to a table: planned once, data files written anywhere, committed once, on
    one :class:`~blobhouse.transaction.Transaction`.

    :func:`write_table` runs all three steps in one process; the Spark writer plans on the
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
        existing = _open_dataset(location, None, storage_options)
        if existing is None and location.branch is None:
            _check_new_table_folder(location.root, allow_nonempty_folder)
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
        kept = _kept_properties(existing, appending)
        bases = _allowed_bases(
            existing, options.allowed_bases, appending, location.root_uri, options.managed_bases
        )
        if appending:
            options = kept.resolve(options, columns=_blob_names(existing.schema))
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
            existing, base_id = _with_store(location, existing, storage_options)
            plan = replace(plan, store_base_id=base_id, load_store_index=load_store_index)
        read_version = existing.version if existing is not None else None
        transaction = Transaction.start(location, read_version, storage_options, id=write_id)
        recorded = None if appending else _properties_of(plan, options)
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

    def run(self, batches: Iterable[pa.RecordBatch]) -> Table:
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

    def commit(self, written: Sequence[WrittenFile]) -> Table:
        """Make every written file visible in one Lance transaction.

        A write that created the table and lost that race to another creator commits again
        on the table the other one made: as an append (``mode="append"``) or an overwrite,
        or not at all (``mode="create"``: :class:`TableExistsError`). An append of no rows
        commits nothing (no new version)."""
        if self.appending and not any(w.num_rows for w in written):
            self.abort(written)  # its lease (and any empty file)
            return Table(self.transaction.read_dataset(), self.location, self.storage_options)
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
        return Table(dataset, self.location, self.storage_options)

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
        _remove_empty_local_dirs(
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
            existing, base_id = _with_store(location, existing, options)
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


@keywords_checked
def open_table(
    uri: str,
    version: int | str | None = None,
    storage_options: dict[str, str] | None = None,
    *,
    branch: str | None = None,
) -> Table:
    """Open the table at ``uri``: its latest version, or ``version`` (a version number, or the
    name of a tag, which may point into a branch); ``branch`` opens a branch made with
    Lance's ``create_branch`` (``uri`` may also name the branch's directory,
    ``<table>/tree/<branch>``).

    >>> import tempfile, pyarrow as pa, lance
    >>> from blobhouse import blob_array, open_table, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"image": blob_array([b"x"])}), uri)
    >>> open_table(uri).count_rows()
    1
    >>> lance.dataset(uri).tags.create("gold", 1)
    >>> open_table(uri, "gold").version
    1
    """
    storage_options = checked_options(storage_options)
    return open_at(TableLocation.of(uri, branch, storage_options), version, storage_options)


def open_at(
    location: TableLocation,
    version: int | str | None = None,
    storage_options: dict[str, str] | None = None,
) -> Table:
    """:func:`open_table` for a location resolved earlier (on a Spark driver, say: tasks open
    the table where the driver found it, whatever their working directory)."""
    if isinstance(version, str):
        location, version = resolve_tag(location, version, storage_options)
    elif version is not None:
        version = _version_number(version)
    dataset = _open_dataset(location, version, storage_options)
    if dataset is None:
        raise _not_found(location, version, storage_options)
    if location.branch is not None and (bases := BasePaths(dataset, location)).moved:
        raise BlobhouseError(
            f"branch {location.branch!r} of {location.root} was made when the table was at "
            f"{bases.recorded_root}: Lance records a branch's parent as that absolute path and "
            "cannot rewrite it, so the branch reads its parent's files there, not here. Delete "
            f"the branch here (lance.dataset({location.root!r}).branches.delete(...)) and make "
            "it again, or read it at the old place"
        )
    if version is None:  # older versions name the old place even after a relocation
        _warn_if_moved(dataset, location)
    return Table(dataset, location, storage_options)


_WARNED_MOVED: set[str] = set()


def _warn_if_moved(dataset: LanceDataset, location: TableLocation) -> None:
    """Warn once per process that a copied or moved table sends stock readers elsewhere."""
    if location.root in _WARNED_MOVED:
        return
    bases = BasePaths(dataset, location)
    if bases.store_moved:
        _WARNED_MOVED.add(location.root)
        warnings.warn(
            f"table {location.root} was copied or moved from {bases.recorded_root}: blobhouse "
            "reads its own files, but stock Lance readers (pylance, LanceDB) read its store at "
            "the old place until the first blobhouse write or `blobhouse relocate "
            f"{location.root}` (Table.relocate())",
            MovedTableWarning,
            stacklevel=3,
        )


def _not_found(
    location: TableLocation, version: int | None, storage_options: dict[str, str] | None
) -> TableNotFoundError:
    """Why there is no table at ``location`` (at ``version``): the path, or the version."""
    root = location.root
    if location.branch is None or "://" in root:
        problem = path_problem(root)
        if problem is not None:
            return problem
    latest = _open_dataset(location, None, storage_options) if version is not None else None
    where = f"branch {location.branch!r} of " if location.branch else ""
    if latest is None:
        if location.branch is not None:
            return TableNotFoundError(f"no branch {location.branch!r} in {root}")
        return TableNotFoundError(f"no table at {root}")
    retained = [v["version"] for v in latest.versions()]
    if version > latest.version:
        return VersionNotFoundError(
            f"{where}{root} has no version {version}: it never existed (the latest is "
            f"{latest.version})"
        )
    return VersionRemovedError(
        f"version {version} of {where}{root} was removed by cleanup (gc); the oldest retained "
        f"version is {min(retained)} (retained: {', '.join(version_spans(retained))})"
    )


def path_problem(path: str) -> TableNotFoundError | None:
    """What is wrong with a local ``path`` that should hold a table, if anything is."""
    if "://" in path:
        return None
    in_the_way = _file_in_the_way(path)
    if in_the_way is not None:
        return PathIsFileError(f"{path} is not a table: {in_the_way}; a table is a folder")
    if not os.path.exists(path):
        return PathNotFoundError(f"no table at {path}: no such file or folder")
    if not os.path.isdir(os.path.join(path, "_versions")):
        entries = sorted(os.listdir(path))
        what = "an empty folder" if not entries else f"a folder of {_listing(entries)}"
        return NotATableError(f"{path} is not a table: it is {what} (no _versions/)")
    return None


# what a folder holding a table, or a failed create's leftovers, may contain
_TABLE_ENTRIES = frozenset(
    ("_versions", "_transactions", "_deletions", "_indices", "_refs", "tree", "data")
) | {STORE_DIR, leases.LEASES_DIR}


def check_target(uri: str, allow_nonempty_folder: bool = False) -> None:
    """Refuse a local ``uri`` a write cannot make or change a table at (a file, a folder below
    a file, a folder of other files), before any work starts (ingest checks it before Spark).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
    >>> _ = open(path, "w").write("{}")
    >>> check_target(path)
    Traceback (most recent call last):
    ...
    blobhouse.errors.PathIsFileError: cannot create a table at ... it is a file
    """
    if "://" in uri and not uri.startswith("file://"):
        return  # object stores have no files in the way
    root = TableLocation.of(uri).root
    if path_problem(root) is not None:  # no table there yet
        _check_new_table_folder(root, allow_nonempty_folder)


def _check_new_table_folder(root: str, allow_nonempty_folder: bool) -> None:
    """Refuse to create a table at a file, or in a folder of other files (unless asked)."""
    in_the_way = _file_in_the_way(root)
    if in_the_way is not None:
        raise PathIsFileError(f"cannot create a table at {root}: {in_the_way}")
    if isinstance(path_problem(root), NotATableError) and not allow_nonempty_folder:
        foreign = sorted(set(os.listdir(root)) - _TABLE_ENTRIES)
        if foreign:
            raise InvalidInputError(
                f"{root} is a folder of other files ({_listing(foreign)}): a new table would "
                "mix its _versions/ and data/ into them. Write to a new or empty folder, or "
                "pass allow_nonempty_folder=True (Spark: option allow_nonempty_folder=true)"
            )


def _file_in_the_way(path: str) -> str | None:
    """``"it is a file"`` or which folder above ``path`` is a file, if one is."""
    if os.path.isfile(path):
        return "it is a file"
    while (parent := os.path.dirname(path)) != path:
        if os.path.isfile(parent):
            return f"{parent}, a folder above it, is a file"
        path = parent
    return None


def _listing(entries: list[str], shown: int = 3) -> str:
    more = f" and {len(entries) - shown} more" if len(entries) > shown else ""
    return ", ".join(entries[:shown]) + more


def _version_number(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise InvalidInputError(f"version must be a number or a tag name, got {version!r}")
    number = int(version)
    if not 1 <= number < 2**63:
        raise InvalidInputError(f"versions are numbered from 1 (a 64-bit number), got {version!r}")
    return number


def resolve_tag(
    location: TableLocation, tag: str, storage_options: dict[str, str] | None
) -> tuple[TableLocation, int]:
    """The branch and version tag ``tag`` points at; a string of digits that names no tag is
    a version number."""
    found = location.tag(tag, storage_options)
    if found is None:
        if tag.isdigit():
            return location, _version_number(tag)
        if not location.on(None).listed_versions(storage_options):
            raise TableNotFoundError(f"no table at {location.root}")
        tags = location.tag_names(storage_options)
        raise TableNotFoundError(f"no tag {tag!r} in {location.root} (tags: {tags or 'none'})")
    if location.branch is not None and found.branch != location.branch:
        raise InvalidInputError(
            f"tag {tag!r} points into {'main' if found.branch is None else repr(found.branch)}, "
            f"not branch {location.branch!r}"
        )
    return location.on(found.branch), found.version


class Table:
    """A blob table at one version. Blob columns read as references unless asked otherwise.

    Every change made through a ``Table`` (append through :meth:`add_data_file`, delete,
    update, merge_insert, schema changes, backfill, compaction) moves that object to the
    version it committed and returns it (or, for compaction and merge_insert, a report).
    Changes by others become visible with :meth:`refresh`; :meth:`checkout` gives another
    version as a new object.

    ``blobs`` selects how blob columns come back: ``"refs"`` (``struct<uri, position, size>``,
    absolute and self-contained), ``"bytes"`` (``large_binary``), or ``"descriptors"`` (Lance's
    stored descriptors). Bytes read as ``"bytes"`` or by :meth:`read_blobs` are checked
    against the blake3 recorded when they were written: damaged bytes raise
    :class:`~blobhouse.errors.CorruptBlobError` naming the column, fragment, row and file.
    """

    def __init__(
        self,
        dataset: LanceDataset,
        location: TableLocation,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.dataset = dataset
        self.location = location
        self.uri = location.root_uri  # references into the table's files start with it
        self.storage_options = storage_options
        self._resolver: ReferenceResolver | None = None
        self._hashes: RecordedHashes | None = None
        self._schema: pa.Schema | None = None
        self._stored_blob_columns: list[ColumnPath] | None = None
        self._field_ids: dict[ColumnPath, int] = {}

    def __repr__(self) -> str:
        branch = f", branch={self.branch!r}" if self.branch else ""
        return f"Table({self.uri!r}{branch}, version={self.version}, rows={self.count_rows()})"

    @property
    def schema(self) -> pa.Schema:
        """The table's Lance schema (blob columns as Lance blob fields)."""
        if self._schema is None:
            self._schema = self.dataset.schema  # rebuilt by Lance on every access
        return self._schema

    @property
    def version(self) -> int:
        return self.dataset.version

    @property
    def branch(self) -> str | None:
        """The branch this table is on (None: main)."""
        return self.location.branch

    @property
    def blob_columns(self) -> list[str]:
        """Names of the blob columns (``parent.child`` inside structs)."""
        return [path_name(p) for p in self._blob_paths()]

    @property
    def allowed_bases(self) -> list[str]:
        """URI prefixes external blobs of this table may live under."""
        return AllowedBases.of_table(self.schema).bases

    @property
    def managed_bases(self) -> list[str]:
        """The allowed bases whose objects the table takes ownership of once referenced."""
        return AllowedBases.of_table(self.schema).managed

    @property
    def properties(self) -> TableProperties:
        """The table's write settings (dedup mode, blob columns, ref_id columns, placement,
        bases, file size limits) as its manifest records them; every writer uses them.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t")
        >>> t.properties.dedup, t.properties.blob_columns
        ('global', ('img',))
        """
        return TableProperties.of(self.dataset)

    @keywords_checked
    def set_properties(
        self,
        *,
        dedup: str | Mapping[str, str | None] | None = None,
        ref_id_columns: Mapping[str, str | None] | None = None,
        placement: Mapping[str, Mapping[str, int]] | None = None,
        allowed_bases: Sequence[str] | None = None,
        managed_bases: Sequence[str] | None = None,
        max_rows_per_file: int | None = None,
        max_bytes_per_file: int | None = None,
    ) -> Table:
        """Change the table's properties in one commit (a new manifest; nothing rewritten) and
        move this table to the new version. Later writes follow them; :meth:`compact` brings
        earlier rows under a new dedup mode. ``dedup`` is the table's mode or
        ``{column: mode}`` (None: the table's again); bases can be added, not removed.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t",
        ...                 dedup="content")
        >>> t.set_properties(dedup="global").properties.dedup_of("img")
        'global'
        """
        given = {
            "dedup": dedup,
            "ref_id_columns": ref_id_columns,
            "placement": placement,
            "allowed_bases": allowed_bases,
            "managed_bases": managed_bases,
            "max_rows_per_file": max_rows_per_file,
            "max_bytes_per_file": max_bytes_per_file,
        }
        changes = {name: value for name, value in given.items() if value is not None}
        return self._advance(
            schema_changes.set_properties(self.location, changes, self.storage_options)
        )

    def versions(self) -> list[dict]:
        """Every version of this branch (``version``, ``timestamp``, ``metadata``)."""
        return self.dataset.versions()

    def tags(self) -> dict[str, dict]:
        """Every tag of the table: name -> ``{"branch", "version"}`` (branch None: main)."""
        return {
            name: {"branch": tag["branch"], "version": tag["version"]}
            for name, tag in self.dataset.tags.list().items()
        }

    def branches(self) -> dict[str, dict]:
        """Every branch of the table: name -> ``{"parent_branch", "parent_version"}``."""
        return {
            name: {"parent_branch": b["parent_branch"], "parent_version": b["parent_version"]}
            for name, b in self.dataset.branches.list().items()
        }

    @keywords_checked
    def checkout(self, version: int | str, *, branch: str | None = None) -> Table:
        """This table at another version (or tag) of its branch, or of ``branch`` ("main" for
        main)."""
        location = self.location
        if branch is not None:
            location = TableLocation.of(location.root, branch, self.storage_options)
        return open_at(location, version, self.storage_options)

    def relocate(self) -> Table:
        """Point the store base of main and of every branch at the table's own store, one
        commit each where needed, after the table was copied or moved (stock Lance readers
        follow the store path a manifest records; blobhouse reads the table's own store either
        way, and its writes relocate first). Moves this table to its new version."""
        for branch in [None, *self.branches()]:
            try:
                on = self.checkout(None, branch=branch or "main")
            except BlobhouseError:
                if branch is None:
                    raise
                continue  # made before a move: Lance cannot repoint it (verify says so)
            relocate_store(on.dataset, on.location, self.storage_options)
        return self.refresh()

    @property
    def moved_from(self) -> str | None:
        """The root this version's manifest records for the table's store, when the table was
        copied or moved from there and not relocated yet (None: in place)."""
        bases = self._resolved().base_paths
        return bases.recorded_root if bases.store_moved else None

    @keywords_checked
    def count_rows(self, filter: str | None = None) -> int:
        return self.dataset.count_rows(filter)

    def delete(self, filter: str) -> Table:
        """Delete the rows matching the SQL ``filter``, as a new version (this table moves to
        it)."""
        dataset = self.dataset
        dataset.delete(filter)  # Lance moves the dataset object to the new version
        return self._advance(dataset)

    @keywords_checked
    def update(
        self,
        updates: Mapping[str, str | BlobFunction | None],
        where: str | None = None,
        *,
        dedup: str | None = None,
        retries: int = DEFAULT_RETRIES,
    ) -> UpdateReport:
        """Set columns on the rows matching the SQL ``where`` (every row if None), in one
        commit; this table moves to the new version.

        ``updates`` maps a column to a SQL expression over the row (Lance's ``update``); a
        blob column to a function of the matching rows' plain columns (an Arrow batch -> one
        blob value per row, like :meth:`backfill_blob_column`) or None (null). Only the
        changed columns are rewritten, in the fragments holding a matching row: blob payloads
        of other columns are never copied. New blob values go through the write pipeline with
        the column's dedup mode (its property; ``dedup``, if given, must be the same); the
        unchanged rows of a rewritten blob column are copied once per distinct
        payload (their store references kept, with ``dedup="global"``).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "label": ["cat", "dog"],
        ...                           "img": blob_array([b"x", b"y"])}), tempfile.mkdtemp() + "/t")
        >>> t.update({"label": "upper(label)"}, where="id = 2").rows_updated
        1
        >>> t.to_arrow(columns=["id", "label"]).to_pylist()
        [{'id': 1, 'label': 'cat'}, {'id': 2, 'label': 'DOG'}]
        """
        report = mutations.update(self, updates, where, dedup=dedup, retries=retries)
        if report.version != self.version:
            self._advance(self.checkout(report.version).dataset)
        return report

    @keywords_checked
    def merge_insert(
        self,
        on: str | Sequence[str],
        *,
        dedup: str | Mapping[str, str] | None = None,
        ref_id_columns: Mapping[str, str] | None = None,
        placement: Mapping[str, Mapping[str, int]] | None = None,
    ) -> mutations.MergeInsert:
        """An upsert keyed by ``on``, built like Lance's ``merge_insert`` and run with
        ``execute(data)`` in one commit (see :class:`~blobhouse.mutations.MergeInsert`). New
        rows are written through the write pipeline with the table's properties (options
        given must be the same): with ``dedup="global"``, the default, a payload the table
        already stores anywhere is referenced, not written again.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1], "img": blob_array([b"a"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> upsert = pa.table({"id": [1, 2], "img": blob_array([b"A", b"b"])})
        >>> t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all(
        ...     ).execute(upsert).num_inserted_rows
        1
        """
        options = WriteOptions(dedup=dedup, ref_id_columns=ref_id_columns, placement=placement)
        return mutations.MergeInsert(self, on, options)

    def refresh(self) -> Table:
        """Move this table to the latest version of its branch (another writer's commits
        become visible); returns it.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import open_table, write_table
        >>> uri = tempfile.mkdtemp() + "/t"
        >>> mine = write_table(pa.table({"id": [1]}), uri)
        >>> _ = write_table(pa.table({"id": [2]}), uri, mode="append")  # another writer
        >>> mine.count_rows(), mine.refresh().count_rows()
        (1, 2)
        """
        latest = _open_dataset(self.location, None, self.storage_options)
        if latest is None:
            raise _not_found(self.location, None, self.storage_options)
        return self._advance(latest)

    def _advance(self, dataset: LanceDataset) -> Table:
        """This table at ``dataset``'s version (what every mutation does once it committed)."""
        self.dataset = dataset
        self._resolver = None
        self._hashes = None
        self._schema = None
        self._stored_blob_columns = None
        self._field_ids = {}
        return self

    @keywords_checked
    def add_columns(self, columns: schema_changes.NewColumns) -> Table:
        """Add columns in one commit and move this table to the new version; returns ``self``.

        ``{name: SQL expression}`` computes each new column from the non-blob columns (one new
        data file per fragment; blob bytes are not read). Nullable pyarrow fields (a field, a
        list, a schema) are added all null, a new manifest only; a blob field
        (``blob_field(name, ...)`` with its placement settings, or Lance's) becomes an all-null
        blob column that :meth:`backfill_blob_column` fills, and appends can carry.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_field, write_table
        >>> t = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t")
        >>> t.add_columns({"double": "id * 2"}).to_arrow().column("double").to_pylist()
        [2, 4]
        >>> t = t.add_columns(blob_field("img"))  # all null until backfilled
        >>> t = t.backfill_blob_column("img", lambda b: [b"%d" % i for i in b["id"].to_pylist()])
        >>> t.read_blobs("img", [1])
        [b'2']
        """
        return self._advance(
            schema_changes.add_columns(self.location, columns, self.storage_options)
        )

    @keywords_checked
    def alter_columns(self, *alterations: Mapping[str, Any]) -> Table:
        """Alter columns as Lance's ``alter_columns`` does, in one commit, and move this table
        to the new version; returns ``self``. Each alteration is ``{"path": column, "name":
        new name, "nullable": bool, "data_type": pyarrow type}`` (any of the last three).

        Renames (blob columns too: hashes, placement and sharing follow the column) and
        nullability changes write a new manifest only; a cast rewrites that column's values
        into a new data file per fragment. Blob columns are never cast, nor their placement
        settings changed: such an alteration is refused, naming the column.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> data = pa.table({"id": pa.array([1], pa.int64()), "img": blob_array([b"x"])})
        >>> t = write_table(data, tempfile.mkdtemp() + "/t")
        >>> t = t.alter_columns({"path": "img", "name": "photo"},
        ...                     {"path": "id", "data_type": pa.int32()})
        >>> t.schema.field("id").type, t.read_blobs("photo", [0])
        (DataType(int32), [b'x'])
        """
        return self._advance(
            schema_changes.alter_columns(self.location, alterations, self.storage_options)
        )

    @keywords_checked
    def drop_columns(self, columns: str | Sequence[str]) -> Table:
        """Drop columns (blob columns too) in one commit, a new manifest only, and move this
        table to the new version; returns ``self``. Older versions still read them; ``gc``
        reclaims their bytes (sidecars, packs and store payloads only they used) once no
        retained version needs them.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1], "img": blob_array([b"x"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> t.drop_columns(["img"]).schema.names
        ['id']
        """
        return self._advance(
            schema_changes.drop_columns(self.location, columns, self.storage_options)
        )

    @keywords_checked
    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        blobs: BlobsMode = "refs",
        batch_size: int | None = None,
        *,
        fragment_ids: Sequence[int] | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the table as record batches (memory stays bounded by the batch size).

        ``fragment_ids``, ``offset`` and ``limit`` restrict the scan to some fragments and a
        range of their rows (how Spark splits a read).
        """
        selection = self._selection(columns, blobs)
        fragments = None
        if fragment_ids is not None:
            fragments = [self.dataset.get_fragment(i) for i in fragment_ids]
        scanner = self.dataset.scanner(
            columns=selection.lance,
            filter=filter,
            batch_size=batch_size,
            with_row_address=bool(selection.blobs),
            fragments=fragments,
            offset=offset,
            limit=limit,
        )
        for batch in scanner.to_batches():
            yield self._convert(selection.named(batch), selection.blobs, blobs, check_hashes=True)

    @keywords_checked
    def to_arrow(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        blobs: BlobsMode = "refs",
    ) -> pa.Table:
        """The table (or the selected columns / rows) as a pyarrow Table.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> t.to_arrow(filter="id = 2", blobs="bytes").to_pylist()
        [{'id': 2, 'img': b'b'}]
        """
        batches = list(self.scan(columns, filter, blobs))
        if batches:
            return pa.Table.from_batches(batches)
        return self._empty(columns, blobs)

    @keywords_checked
    def take(
        self,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "refs",
    ) -> pa.Table:
        """Rows at ``indices`` (positions among the live rows), in the order asked."""
        indices = self._check_indices(indices)
        return self._taken(lambda cols: self.dataset.take(indices, columns=cols), columns, blobs)

    def row_ids(self, filter: str | None = None) -> np.ndarray:
        """The ids of the live rows (those matching ``filter``), in table order, for
        :meth:`take_rows`: a scan of the filter's columns only, never of blob bytes.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2, 3], "img": blob_array([b"a", b"b", b"c"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> t.take_rows(t.row_ids("id >= 2"), blobs="bytes").to_pylist()
        [{'id': 2, 'img': b'b'}, {'id': 3, 'img': b'c'}]
        """
        try:
            scanner = self.dataset.scanner(columns=[], filter=filter, with_row_id=True)
            ids = [batch.column(_ROW_ID).to_numpy() for batch in scanner.to_batches()]
        except (ValueError, pa.ArrowInvalid) as exc:
            if filter is None:
                raise
            raise InvalidInputError(
                f"filter {filter!r} is not valid SQL for this table: {lance_message(exc)}"
            ) from None
        return np.concatenate(ids) if ids else np.zeros(0, np.uint64)

    @keywords_checked
    def take_rows(
        self,
        row_ids: Sequence[int] | np.ndarray,
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "refs",
        *,
        check_hashes: bool = True,
    ) -> pa.Table:
        """Rows by id (from :meth:`row_ids`), in the order asked: one native take for the
        rows and their addresses, then each distinct payload read once (``blobs="bytes"``,
        checked against its recorded hash unless ``check_hashes`` is False)."""
        ids = np.asarray(row_ids, dtype=np.uint64).tolist()
        return self._taken(lambda cols: self._by_id(ids, cols), columns, blobs, check_hashes)

    @keywords_checked
    def take_row_dicts(
        self,
        row_ids: Sequence[int] | np.ndarray,
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "bytes",
        *,
        check_hashes: bool = True,
    ) -> list[dict[str, Any]]:
        """Rows by id as dicts, in the order asked, for Python consumers (a DataLoader's
        ``transform``). With ``blobs="bytes"`` each distinct payload is read once, straight
        into one ``bytes`` object that every row referencing it shares, and checked against
        its recorded hash (unless ``check_hashes`` is False): no Arrow buffer in between.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"a"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> rows = t.take_row_dicts(t.row_ids())
        >>> rows, rows[0]["img"] is rows[1]["img"]
        ([{'id': 1, 'img': b'a'}, {'id': 2, 'img': b'a'}], True)
        """
        check_hashes = check_flag("check_hashes", check_hashes)
        if blobs != "bytes":
            return self.take_rows(row_ids, columns, blobs, check_hashes=check_hashes).to_pylist()
        ids = np.asarray(row_ids, dtype=np.uint64).tolist()
        selection = self._taken_columns(columns, blobs)
        lance_columns = selection.lance
        taken = self._by_id(
            ids, [*lance_columns, _ROW_ADDRESS] if selection.blobs else lance_columns
        )
        batches = [selection.flat(b) for b in taken.to_batches()]
        return [
            row
            for batch in batches
            for row in self._row_dicts(batch, selection.blobs, check_hashes)
        ]

    def _by_id(self, ids: list[int], columns: list[str]) -> pa.Table:
        """One native take of rows by id (pylance's public take is by position)."""
        try:
            return self.dataset._take_rows(ids, columns=columns)
        except OSError as exc:
            if not str(exc).startswith("Invalid user input"):
                raise  # a missing or unreadable data file
            raise IndexError(
                f"row ids {ids[:5]}{' ...' if len(ids) > 5 else ''} are not all rows of version "
                f"{self.version} of this table (take ids from row_ids()): {lance_message(exc)}"
            ) from None

    def _row_dicts(
        self, batch: pa.RecordBatch, targets: list[BlobTarget], check_hashes: bool
    ) -> list[dict[str, Any]]:
        if not targets:
            return batch.to_pylist()
        addresses, payloads = batch.column(_ROW_ADDRESS), []
        for out, path in targets:
            descriptors = get_column(batch, out)
            payloads.append(
                self._checked_bytes(path, descriptors, addresses, read_ranges, check_hashes)
            )
            # the descriptors are not wanted in the rows: nulls convert for nothing
            nulls = pa.nulls(batch.num_rows)
            batch = replace_column(batch, out, nulls, pa.field(out[-1], pa.null()))
        rows = batch.drop_columns([_ROW_ADDRESS]).to_pylist()
        for (out, _), values in zip(targets, payloads, strict=True):
            for row, value in zip(rows, values, strict=True):
                _set_nested(row, out, value)
        return rows

    def _taken(
        self,
        take: Callable[[list[str]], pa.Table],
        columns: Sequence[str] | None,
        blobs: BlobsMode,
        check_hashes: bool = True,
    ) -> pa.Table:
        """The rows ``take(columns)`` returns (with their addresses when blobs are read), blob
        columns converted as ``blobs`` says."""
        check_hashes = check_flag("check_hashes", check_hashes)
        selection = self._taken_columns(columns, blobs)
        lance_columns = selection.lance
        taken = take([*lance_columns, _ROW_ADDRESS] if selection.blobs else lance_columns)
        batches = [
            self._convert(selection.flat(b), selection.blobs, blobs, check_hashes)
            for b in taken.to_batches()
            if b.num_rows
        ]
        if batches:
            return pa.Table.from_batches(batches)
        return self._empty(columns, blobs)

    def blob_refs(self, column: str, indices: Sequence[int]) -> pa.StructArray:
        """Resolved references ``struct<uri, position, size>`` of ``column`` at ``indices``."""
        self._blob_path(column, "blob_refs")
        taken = self.take(indices, columns=[column], blobs="refs")
        return taken.column(column).combine_chunks() if len(taken) else pa.array([], type=REF_TYPE)

    def read_blobs(self, column: str, indices: Sequence[int]) -> list[bytes | None]:
        """The bytes of ``column`` at ``indices`` (None for null), with coalesced ranged reads,
        checked against their recorded hashes."""
        path = self._blob_path(column, "read_blobs")
        indices = self._check_indices(indices)
        if not indices:
            return []
        # one take for descriptors and row addresses; each payload read into its own bytes
        taken = self.dataset.take(indices, columns=[lance_name(path), _ROW_ADDRESS])
        taken = taken.combine_chunks().to_batches()[0]
        descriptors, addresses = get_column(taken, path), taken.column(_ROW_ADDRESS)
        return self._checked_bytes(path, descriptors, addresses, read_ranges)

    def open_blob(self, column: str, index: int) -> BinaryIO | None:
        """A seekable file object over one blob (None if the value is null). Reading it whole,
        front to back, checks its recorded hash at the end (ranged reads cannot be checked).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"v": blob_array([b"frames" * 20_000])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> with t.open_blob("v", 0) as f:
        ...     _ = f.seek(6); f.read(6)
        b'frames'
        """
        path = self._blob_path(column, "open_blob")
        (index,) = self._check_indices([index])
        taken = self.dataset.take([index], columns=[lance_name(path), _ROW_ADDRESS])
        taken = taken.to_batches()[0]
        descriptor, address = get_column(taken, path), taken.column(_ROW_ADDRESS)
        (ref,) = refs_from_arrow(self.resolve_refs(path, descriptor, address))
        if ref is None:
            return None
        value, row = descriptor[0].as_py(), address[0].as_py()
        digest = self.recorded_hashes().expected(
            value["kind"],
            value["blob_id"],
            self.file_column(path)(row >> 32),
            row & 0xFFFFFFFF,
            ref.uri,
            ref.position,
            ref.size,
            self.data_file_of(path)(row >> 32),
        )
        name = f"blob column {column!r}, fragment {row >> 32} row {row & 0xFFFFFFFF}"
        return open_ref(ref, digest, name, self.storage_options)

    def add_data_file(self, written: WrittenFile) -> Table:
        """Append a data file written by a :class:`~blobhouse.session.BlobSession` as a new
        fragment, in one transaction. The file must hold every column of the table.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import BlobSession, blob_field, write_table
        >>> schema = pa.schema([pa.field("id", pa.int64()), blob_field("img")])
        >>> table = write_table(schema.empty_table(), tempfile.mkdtemp() + "/t")
        >>> session = BlobSession(table.data_file_path())
        >>> images = session.open_writer("img")
        >>> pack = images.new_packed()
        >>> shared = pack.write_blob(b"one payload, two rows")
        >>> images.extend(pack.finish() + [shared])
        >>> written = session.write_data_file(pa.table({"id": [1, 2], "img": images.finish()}))
        >>> table.add_data_file(written).read_blobs("img", [0, 1])
        [b'one payload, two rows', b'one payload, two rows']
        """
        data_file = DataFile.create(self.dataset, written.name)
        fields = self.dataset.lance_schema.fields()
        missing = [
            f.name() for f in fields if not set(leaf_field_ids([f])) <= set(data_file.fields)
        ]
        if missing:
            raise SchemaError(
                f"data file {written.name} lacks column(s) {missing} of the table; a new fragment "
                "holds every column"
            )
        operation = LanceOperation.Append(
            [FragmentMetadata(id=0, files=[data_file], physical_rows=written.num_rows)]
        )
        # the file and its sidecar directory start with the file's name: its lease covers both
        prefix = written.name.removesuffix(".lance")
        txn = Transaction(self.location, self.version, self.storage_options, prefix)
        return self._advance(txn.commit([written], lambda: operation))

    def replace_column(self, column: str, files: Mapping[int, WrittenFile]) -> Table:
        """Make session-written ``files`` (fragment id -> file) the data of blob ``column``, in
        one transaction: Lance ``DataReplacement`` for an existing column (any fragments), or
        ``Merge`` adding a new column (every fragment). Each file holds the fragment's number of
        physical rows and the columns of the file it replaces."""
        plan = BackfillPlan.create(self, column)
        if not plan.new_column:
            for fragment_id, written in files.items():
                held = DataFile.create(self.dataset, written.name).fields
                if list(held) != list(plan.field_ids):
                    raise SchemaError(
                        f"file {written.name} for fragment {fragment_id} must hold the columns "
                        f"{list(plan.file_columns)} in that order, like the file it replaces"
                    )
        return self._advance(commit_backfill(self, plan, files))

    def data_file_path(self) -> str:
        """A fresh path for a data file of this table (for a :class:`BlobSession`)."""
        return f"{self.location.data_dir}/{uuid.uuid4().hex}.lance"

    @keywords_checked
    def backfill_blob_column(
        self, column: str, fn: BlobFunction, *, dedup: str | None = None
    ) -> Table:
        """Compute blob ``column`` for every row and commit it in one transaction.

        ``fn`` maps an Arrow batch of a fragment's non-blob columns to one blob value per row.
        A new column is added (Lance ``Merge``); an existing one has its files replaced (Lance
        ``DataReplacement``). If anything fails, nothing changes and the staged files are gone.
        ``blobhouse.spark.backfill_blob_column`` runs the same steps with a Spark task per
        fragment. The column is written with its dedup mode (a new one: ``dedup``, else the
        table's). A blob column inside a struct (``meta.image``) must exist: it is computed
        for every row as :meth:`update` ``({column: fn})`` does.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import write_table
        >>> t = write_table(pa.table({"id": [1, 2, 3]}), tempfile.mkdtemp() + "/t")
        >>> def render(batch):
        ...     return [b"img-%d" % i for i in batch["id"].to_pylist()]
        >>> t = t.backfill_blob_column("img", render)
        >>> t.read_blobs("img", [2])
        [b'img-3']
        """
        if column in self.blob_columns and "." in column:
            # a nested blob column is rewritten with its struct, as an update of every row is
            self.update({column: fn}, dedup=dedup)
            return self
        mode = self.properties.change_mode(column, dedup)
        table = table_for(self, mode)
        plan = BackfillPlan.create(table, column, mode)
        store = store_writer_for(table, plan)  # shared: a payload is stored once per backfill
        try:
            files = {
                f.fragment_id: backfill_fragment(table, f.fragment_id, fn, plan, store)
                for f in table.dataset.get_fragments()
            }
            if store is not None:
                store.finish()
        except BaseException:
            if store is not None:
                store.abort()
            plan.transaction.abort()
            raise
        return self._advance(commit_backfill(table, plan, files))

    @keywords_checked
    def gc(
        self,
        *,
        retain_versions: int | None = None,
        older_than: timedelta | None = None,
        grace: timedelta | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> dict:
        """Remove old versions and files no retained version references (after ``grace``,
        24 hours by default); see :func:`blobhouse.maintenance.garbage_collection.gc`."""
        return garbage_collection.gc(
            self,
            retain_versions=retain_versions,
            older_than=older_than,
            grace=garbage_collection.DEFAULT_GRACE if grace is None else grace,
            dry_run=dry_run,
            progress=progress,
        )

    @keywords_checked
    def verify(self, *, deep: bool = False, progress: Progress | None = None) -> dict:
        """Check every blob reference of every retained version (``deep``: and its bytes against
        the hash recorded at write time): problems by version, column, row and path (see
        :func:`blobhouse.maintenance.verification.verify`)."""
        return verification.verify(self, deep=deep, progress=progress)

    @keywords_checked
    def compact(
        self,
        *,
        target_rows: int = compaction.DEFAULT_TARGET_ROWS,
        target_bytes: int = compaction.DEFAULT_TARGET_BYTES,
        deleted_fraction: float = compaction.DEFAULT_DELETED_FRACTION,
        repack_threshold: float = compaction.DEFAULT_REPACK_THRESHOLD,
        progress: Progress | None = None,
        retries: int = compaction.DEFAULT_RETRIES,
    ) -> dict:
        """Rewrite small fragments and fragments with many deleted rows, keeping blob sharing,
        in one transaction (see :func:`~blobhouse.maintenance.compaction.compact`); a commit a
        concurrent delete or write preempted is run again, up to ``retries`` times. Returns what
        it did, and moves this table to the version it committed."""
        done = compaction.compact(
            self,
            target_rows=target_rows,
            target_bytes=target_bytes,
            deleted_fraction=deleted_fraction,
            repack_threshold=repack_threshold,
            progress=progress,
            retries=retries,
        )
        if done["version"] != self.version:
            self._advance(self.checkout(done["version"]).dataset)
        return done

    def stats(self) -> dict:
        """Per blob column and kind: logical bytes, physical bytes and dedup ratio; fragments,
        rows, deleted rows and orphan files (see :func:`blobhouse.maintenance.stats.blob_stats`)."""
        return blob_stats(self)

    def resolve_refs(
        self,
        path: ColumnPath,
        descriptors: pa.Array,
        row_addresses: pa.Array,
        unresolved: list[Unresolved] | None = None,
    ) -> pa.StructArray:
        """Resolved references ``struct<uri, position, size>`` of blob column ``path``, from its
        stored descriptors and the row addresses (``_rowaddr``) they were read at (with an
        ``unresolved`` list: external references that cannot be resolved go there, as nulls;
        see :meth:`ReferenceResolver.resolve`)."""
        return self._resolved().resolve(
            descriptors, row_addresses, self._field_id(path), path_name(path), unresolved
        )

    def file_column(self, path: ColumnPath) -> Callable[[int], int]:
        """For blob column ``path``: fragment id -> the column it is in that fragment's data
        file (what recorded inline hashes are keyed by)."""
        resolver, field = self._resolved(), self._field_id(path)
        return lambda fragment_id: resolver.file_column(fragment_id, field)

    def data_file_of(self, path: ColumnPath) -> Callable[[int], str]:
        """For blob column ``path``: fragment id -> the data file holding it in that fragment
        (where its rows' recorded hashes are)."""
        resolver, field = self._resolved(), self._field_id(path)
        return lambda fragment_id: resolver.data_file_uri(fragment_id, field)

    def data_file_uri(self, data_file: DataFile) -> str:
        """Where one of this version's data files is (in this branch's ``data/``, or under a
        base path: a branch reading its parent's files)."""
        return self._resolved().locate(data_file)

    def _resolved(self) -> ReferenceResolver:
        if self._resolver is None:
            self._resolver = ReferenceResolver(self.dataset, self.location)
        return self._resolver

    def recorded_hashes(self) -> RecordedHashes:
        """The blake3 recorded for this table's stored payloads (loaded as they are needed)."""
        if self._hashes is None:
            root, options = self.location.root, self.storage_options
            store = (store_uri_prefix(self.uri), lambda: StoreIndex.open(root, options))
            self._hashes = RecordedHashes(options, store)
        return self._hashes

    def _blob_paths(self) -> list[ColumnPath]:
        if self._stored_blob_columns is None:  # walking the schema costs ~30 us per read
            self._stored_blob_columns = stored_blob_columns(self.schema)
        return self._stored_blob_columns

    def _field_id(self, path: ColumnPath) -> int:
        # Lance rebuilds its schema object on every access: look each column up once
        if path not in self._field_ids:
            self._field_ids[path] = field_id(self.dataset, path)
        return self._field_ids[path]

    def _blob_path(self, column: str, what: str) -> ColumnPath:
        """The path of blob column ``column`` (``parent.child`` inside a struct); any other
        name is refused, naming the closest blob column (``what``: the API it was given to)."""
        names = self.blob_columns
        return self._blob_paths()[names.index(check_blob_column(column, names, what))]

    def _selection(self, columns: Sequence[str] | None, blobs: str) -> Selection:
        if blobs not in ("refs", "bytes", "descriptors"):
            raise InvalidInputError(
                f"blobs must be 'refs', 'bytes' or 'descriptors', got {blobs!r}"
            )
        if columns is None:
            names = list(self.schema.names)
            paths = [(n,) for n in names]
        else:
            names = list(columns)
            paths = resolve_columns(self.schema, names)
        targets: list[BlobTarget] = []
        if blobs != "descriptors":
            for name, path in zip(names, paths, strict=True):
                # a nested selection is one top-level column named as selected
                out = (name,) if len(path) > 1 else path
                targets.extend(
                    ((*out, *b[len(path) :]), b)
                    for b in self._blob_paths()
                    if b[: len(path)] == path
                )
        return Selection(names, [lance_name(p) for p in paths], paths, targets)

    def _taken_columns(self, columns: Sequence[str] | None, blobs: str) -> Selection:
        """:meth:`_selection` for a take, which needs a column (a scan may have none)."""
        selection = self._selection(columns, blobs)
        if not selection.names:
            raise InvalidInputError(f"columns is empty: name one or more of {self.schema.names}")
        return selection

    def _check_indices(self, indices: Sequence[int]) -> list[int]:
        indices = [int(i) for i in indices]
        rows = self.count_rows()
        bad = [i for i in indices if not 0 <= i < rows]
        if bad:
            raise IndexError(f"row indices {bad[:5]} out of range for a table of {rows} rows")
        return indices

    def _convert(
        self, batch: pa.RecordBatch, targets: list[BlobTarget], blobs: str, check_hashes: bool
    ) -> pa.RecordBatch:
        if not targets:
            return batch
        addresses = batch.column(_ROW_ADDRESS)
        for out, path in targets:
            descriptors = get_column(batch, out)
            if blobs == "bytes":
                values = self._checked_bytes(
                    path, descriptors, addresses, read_ranges_arrow, check_hashes
                )
                batch = replace_column(batch, out, values, pa.field(out[-1], pa.large_binary()))
            else:
                refs = self.resolve_refs(path, descriptors, addresses)
                batch = replace_column(batch, out, refs, pa.field(out[-1], REF_TYPE))
        return batch.drop_columns([_ROW_ADDRESS])

    def _checked_bytes(
        self,
        path: ColumnPath,
        descriptors: pa.Array,
        addresses: pa.Array,
        read: Callable[..., pa.Array | list],
        check_hashes: bool = True,
    ) -> pa.Array | list:
        """The payloads of blob column ``path`` (``read_ranges`` or ``read_ranges_arrow``),
        each checked against its recorded blake3 as it arrives (hashing overlaps reading)
        unless ``check_hashes`` is False."""
        refs = self._resolved().resolve_list(
            descriptors, addresses, self._field_id(path), path_name(path)
        )
        verify = None
        if check_hashes:
            verify = self.recorded_hashes().verifier(
                path_name(path),
                self.file_column(path),
                descriptors,
                refs,
                addresses,
                self.data_file_of(path),
            )
        try:
            return read(refs, storage_options=self.storage_options, verify=verify)
        except BlobReadError as exc:
            raise _naming_row(exc, path_name(path), refs, addresses) from None

    def output_schema(
        self, columns: Sequence[str] | None = None, blobs: BlobsMode = "refs"
    ) -> pa.Schema:
        """The schema :meth:`scan` yields for these columns and blob mode."""
        selection = self._selection(columns, blobs)
        schema = self.dataset.scanner(columns=selection.lance).projected_schema
        if selection.lance != selection.names:
            schema = pa.schema(
                [f.with_name(n) for f, n in zip(schema, selection.names, strict=True)],
                metadata=schema.metadata,
            )
        out_type = pa.large_binary() if blobs == "bytes" else REF_TYPE
        for out, _ in selection.blobs:
            schema = replace_field(schema, out, pa.field(out[-1], out_type))
        return schema

    def _empty(self, columns: Sequence[str] | None, blobs: BlobsMode) -> pa.Table:
        return self.output_schema(columns, blobs).empty_table()


def _set_nested(row: dict[str, Any], path: ColumnPath, value: object) -> None:
    """``row[path[0]]...[path[-1]] = value``, unless a parent struct is null (then so is
    ``value``)."""
    for name in path[:-1]:
        row = row[name]
        if row is None:
            return
    row[path[-1]] = value


def _naming_row(
    error: BlobReadError, column: str, refs: list[BlobRef | None], addresses: pa.Array
) -> BlobReadError:
    """``error`` naming the first row of the batch whose reference points at its object."""
    row = next(i for i, ref in enumerate(refs) if ref is not None and ref.uri == error.uri)
    address = addresses[row].as_py()
    return BlobReadError(
        f"blob column {column!r}, fragment {address >> 32} row {address & 0xFFFFFFFF}: {error}",
        error.uri,
    )


def _open_dataset(
    location: TableLocation, version: int | None, storage_options: dict[str, str] | None
) -> LanceDataset | None:
    path = location.dataset_path
    if "://" not in path and not os.path.isdir(os.path.join(path, "_versions")):
        return None
    try:
        return lance.dataset(path, version=version, storage_options=storage_options)
    except (ValueError, OSError) as exc:
        if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
            return None
        raise


def _with_store(
    location: TableLocation, existing: LanceDataset | None, storage_options: dict[str, str] | None
) -> tuple[LanceDataset | None, int]:
    """The table with its store registered (an existing table gets one commit for it, once),
    and the store's base id; a table being created registers it in its first commit."""
    if existing is None:
        return None, store_base(location, None).id
    existing, base_id = ensure_store(existing, location, storage_options)
    bases = BasePaths(existing, location)
    if not bases.store_is_own():
        raise InvalidInputError(
            f"{location}: the store this table's manifest names ({bases.store.uri}) is not the "
            f"table's own ({location.store_uri}); a shallow clone shares its source's store, "
            "so dedup='global' writes to it are refused"
        )
    return existing, base_id


def _remove_empty_local_dirs(*paths: str) -> None:
    """Remove directories a failed create made, if they are local and empty."""
    for path in paths:
        if "://" not in path:
            with contextlib.suppress(OSError):
                os.rmdir(path)


def _kept_properties(existing: LanceDataset | None, appending: bool) -> TableProperties:
    """The properties a write plans by: the table's (an overwrite replaces damaged ones)."""
    if existing is None:
        return TableProperties()
    try:
        return TableProperties.of(existing)
    except TableMetadataError:
        if appending:
            raise
        return TableProperties()


def _blob_names(schema: pa.Schema) -> list[str]:
    return [path_name(p) for p in stored_blob_columns(schema)]


def _properties_of(plan: WritePlan, options: WriteOptions) -> TableProperties:
    """What a write that makes the table anew records (its bases as the plan checked them)."""
    columns = [(c.name, c.dedup, c.ref_id_column, c.placement) for c in plan.columns]
    properties = new_table_properties(options, columns)
    bases = plan.allowed_bases
    return replace(properties, allowed_bases=tuple(bases.bases), managed_bases=tuple(bases.managed))


def _allowed_bases(
    existing: LanceDataset | None,
    given: Sequence[str] | None,
    appending: bool,
    root_uri: str,
    managed: Sequence[str] | None = None,
) -> AllowedBases:
    try:
        kept = AllowedBases.of_table(existing.schema if existing is not None else None, root_uri)
    except TableMetadataError:
        if appending:
            raise
        kept = AllowedBases((), root_uri)  # an overwrite replaces damaged metadata
    if given is None and managed is None:
        return kept
    requested = AllowedBases(given or (), root_uri, managed or ())
    if not appending:
        return requested
    # an append may repeat the table's settings (what it gives of them), never change them
    same_allowed = given is None or set(requested.bases) | set(kept.managed) == set(kept.bases)
    if not same_allowed or (managed is not None and requested.managed != kept.managed):
        raise PropertyConflictError(
            "allowed_bases are set when a table is created or overwritten (managed_bases "
            f"too); this table's are {kept.bases} (managed: {kept.managed}), the append asked "
            f"for {requested.bases} (managed: {requested.managed})"
        )
    return kept


def _input_stream(data: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Schema and batches of any accepted input, without materializing a stream."""
    if _is_pandas(data):
        data = _from_pandas(data)
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        batches = iter(data)
        first = next(batches, None)
        if not isinstance(first, pa.RecordBatch):
            raise InvalidInputError(
                "an iterable input must yield pyarrow RecordBatches (got "
                f"{type(first).__name__}); pass a pyarrow Table to write an empty table"
            )
        return first.schema, chain([first], batches)
    raise InvalidInputError(
        f"cannot write a {type(data).__name__}; pass a pyarrow Table, RecordBatch, "
        "RecordBatchReader, iterable of RecordBatches, or a pandas DataFrame"
    )


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and type(data).__name__ == "DataFrame"


def _from_pandas(frame) -> pa.Table:
    """A pandas DataFrame as Arrow; object columns holding :class:`Blob` become blob arrays."""
    columns = {}
    for name in frame.columns:
        values = frame[name]
        if values.dtype == object and any(isinstance(v, Blob) for v in values):
            columns[name] = blob_array(values.tolist())
        else:
            columns[name] = pa.Array.from_pandas(values)
    return pa.table(columns)
