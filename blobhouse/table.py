"""Table: create / append / overwrite blob tables, read them back, one Lance transaction per write.

A blobhouse table is a standard Lance 2.2 dataset. Its schema metadata ``blobhouse`` keeps the
table's settings (the allowed external bases); stock Lance readers ignore it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import pyarrow as pa
from lance import LanceDataset
from lance.fragment import DataFile

from blobhouse.changes import schema_changes
from blobhouse.changes.backfill import (
    BlobFunction,
    backfill,
    replace_files,
)
from blobhouse.changes.merge_insert import MergeInsert
from blobhouse.changes.update import UpdateReport, delete_rows, update_rows
from blobhouse.errors import BlobhouseError, InvalidInputError
from blobhouse.files.checksums import RecordedHashes
from blobhouse.files.references import Unresolved
from blobhouse.files.session import WrittenFile
from blobhouse.layout import TableLocation, data_file_name
from blobhouse.maintenance.reports import CompactionReport, GcReport, StatsReport, VerifyReport
from blobhouse.maintenance.table_maintenance import TableMaintenance
from blobhouse.managed import borrow_carried
from blobhouse.options import (
    CommitOptions,
    CompactionTargets,
    WriteOptions,
    field_keywords,
    keywords_checked,
    option_keywords,
)
from blobhouse.progress import ProgressCallback
from blobhouse.properties import TableProperties
from blobhouse.read.table_reader import TableReader, TableReads
from blobhouse.snapshot import TableSnapshot, open_snapshot
from blobhouse.values import ColumnPath
from blobhouse.write import WriteMode, add_data_file, begin_write, input_stream
from blobhouse.write.prepare import relocate_store

#: the fields of :class:`WriteOptions` a table records as properties that
#: :meth:`Table.set_properties` changes (the blob columns are the schema's)
PROPERTIES = tuple(f.name for f in fields(WriteOptions) if f.name != "blob_columns")


@keywords_checked
@option_keywords(options=WriteOptions)
def write_table(
    data: Any,
    uri: str,
    options: WriteOptions | None = None,
    *,
    mode: WriteMode = "create",
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
    unless ``allow_nonempty_folder``. ``options`` are :class:`WriteOptions`, or its fields
    given as keywords (``blob_columns=...``, ``dedup=...``; not both; ``managed_bases``:
    allowed bases whose objects the table takes ownership of once referenced,
    docs/managed-objects.md). A new table records them as its properties
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
    schema, batches = input_stream(data)
    write = begin_write(
        uri,
        schema,
        options or WriteOptions(),
        mode=mode,
        storage_options=storage_options,
        branch=branch,
        batches=batches,
        allow_nonempty_folder=allow_nonempty_folder,
    )
    return Table(write.run().snapshot)


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
    return Table(open_snapshot(uri, version, storage_options, branch=branch))


def open_at(
    location: TableLocation,
    version: int | str | None = None,
    storage_options: dict[str, str] | None = None,
) -> Table:
    """:func:`open_table` for a location resolved earlier (on a Spark driver, say: tasks open
    the table where the driver found it, whatever their working directory)."""
    return Table(open_snapshot(location, version, storage_options))


class Table(TableReads):
    """A blob table at one version. Blob columns read as references unless asked otherwise.

    Every change made through a ``Table`` (append through :meth:`add_data_file`, delete,
    update, merge_insert, schema changes, backfill, compaction) moves that object to the
    version it committed and returns it (or, for compaction and merge_insert, a report).
    Changes by others become visible with :meth:`refresh`; :meth:`checkout` gives another
    version as a new object.

    ``blobs`` selects how blob columns come back: ``"refs"`` (``struct<uri, position, size,
    blake3>``, absolute and self-contained, with the blake3 recorded for the payload), ``"bytes"``
    (``large_binary``), or ``"descriptors"`` (Lance's stored descriptors). Bytes read as
    ``"bytes"`` or by :meth:`read_blobs` are checked against the blake3 recorded when they were
    written: damaged bytes raise :class:`~blobhouse.errors.CorruptBlobError` naming the column,
    fragment, row and file; a data file that is another file in its place (of another table, or
    another of this table's) raises :class:`~blobhouse.errors.DataFileError` naming it.
    """

    def __init__(self, snapshot: TableSnapshot) -> None:
        self._snapshot = snapshot

    def __repr__(self) -> str:
        branch = f", branch={self.branch!r}" if self.branch else ""
        return f"Table({self.uri!r}{branch}, version={self.version}, rows={self.count_rows()})"

    def _reader(self) -> TableReader:
        """The reader of the version this table is at (one per read call)."""
        return TableReader(self._snapshot)

    @property
    def snapshot(self) -> TableSnapshot:
        """The version this table is at, as the services see it (it never changes; a change
        moves the table to a new one)."""
        return self._snapshot

    # the state of the version this table is at: its snapshot's, as the services see it
    @property
    def dataset(self) -> LanceDataset:
        """The Lance dataset at this version (stock pylance reads it)."""
        return self._snapshot.dataset

    @property
    def location(self) -> TableLocation:
        """Where the table lives (root, branch)."""
        return self._snapshot.location

    @property
    def uri(self) -> str:
        """The table's root as a URI (references into its own files start so)."""
        return self._snapshot.uri

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The storage options the table was opened with."""
        return self._snapshot.storage_options

    @property
    def schema(self) -> pa.Schema:
        """The table's Lance schema (blob columns as Lance blob fields)."""
        return self._snapshot.schema

    @property
    def version(self) -> int:
        """The version this table is at."""
        return self._snapshot.version

    @property
    def branch(self) -> str | None:
        """The branch this version is on (None: main)."""
        return self._snapshot.branch

    @property
    def blob_columns(self) -> list[str]:
        """Names of the blob columns (``parent.child`` inside structs)."""
        return self._snapshot.blob_columns

    @property
    def allowed_bases(self) -> list[str]:
        """URI prefixes external blobs of this table may live under."""
        return self._snapshot.allowed_bases

    @property
    def managed_bases(self) -> list[str]:
        """The allowed bases whose objects the table takes ownership of once referenced."""
        return self._snapshot.managed_bases

    @property
    def moved_from(self) -> str | None:
        """The root the table's store was copied or moved from, not relocated yet (None: none)."""
        return self._snapshot.moved_from

    def versions(self) -> list[dict]:
        """Every version of this branch (``version``, ``timestamp``, ``metadata``)."""
        return self._snapshot.versions()

    def tags(self) -> dict[str, dict]:
        """Every tag of the table: name -> ``{"branch", "version"}`` (branch None: main)."""
        return self._snapshot.tags()

    def branches(self) -> dict[str, dict]:
        """Every branch of the table: name -> ``{"parent_branch", "parent_version"}``."""
        return self._snapshot.branches()

    def resolve_refs(
        self,
        path: ColumnPath,
        descriptors: pa.Array,
        row_addresses: pa.Array,
        unresolved: list[Unresolved] | None = None,
    ) -> pa.StructArray:
        """Resolved references of blob column ``path``: :meth:`TableSnapshot.resolve_refs`."""
        return self._snapshot.resolve_refs(path, descriptors, row_addresses, unresolved)

    def file_column(self, path: ColumnPath) -> Callable[[int], int]:
        """For blob column ``path``: fragment id -> its column in that fragment's data file."""
        return self._snapshot.file_column(path)

    def data_file_of(self, path: ColumnPath) -> Callable[[int], str]:
        """For blob column ``path``: fragment id -> the data file holding it there."""
        return self._snapshot.data_file_of(path)

    def data_file_uri(self, data_file: DataFile) -> str:
        """Where one of this version's data files is (its branch's ``data/`` or a base)."""
        return self._snapshot.data_file_uri(data_file)

    def recorded_hashes(self, shared: bool = True) -> RecordedHashes:
        """The blake3 recorded for this table's stored payloads (loaded as they are needed):
        each data file's list loaded once for the process (``shared``), or read from the files
        again (what a check of the files themselves needs)."""
        return self._snapshot.recorded_hashes(shared)

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
        return self._snapshot.properties

    @keywords_checked
    @field_keywords(WriteOptions, PROPERTIES)
    def set_properties(self, options: WriteOptions | None = None, **changes: Any) -> Table:
        """Change the table's properties in one commit (a new manifest; nothing rewritten) and
        move this table to the new version. Later writes follow them; :meth:`compact` brings
        earlier rows under a new dedup mode. ``dedup`` is the table's mode or
        ``{column: mode}`` (None: the table's again); bases can be added, not removed. Each
        value is checked by its setting (:mod:`blobhouse.settings`). Setting a stored setting
        another tool damaged anew is its repair (a change must set every damaged one: the
        error naming them gives the command). The changes are the fields of ``options`` (a
        :class:`WriteOptions`) that are set, or the same fields as keywords (``dedup=...``;
        not both; as keywords a mode per column may be None: the table's again).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t",
        ...                 dedup="content")
        >>> t.set_properties(dedup="global").properties.dedup_of("img")
        'global'
        """
        given = {name: value for name, value in changes.items() if value is not None}
        if options is not None:
            if given:
                raise InvalidInputError(
                    f"set_properties(): give options (a WriteOptions) or its keywords "
                    f"({', '.join(given)}), not both"
                )
            if options.blob_columns:
                raise InvalidInputError("set_properties cannot change blob_columns")
            kept = options.keywords()
            given = {name: kept[name] for name in PROPERTIES if kept[name] is not None}
        return self._moved_to(
            schema_changes.set_properties(self.location, given, self.storage_options)
        )

    @keywords_checked
    def checkout(self, version: int | str | None, *, branch: str | None = None) -> Table:
        """This table at another version (or tag; None: the latest) of its branch, or of
        ``branch`` ("main" for main)."""
        return Table(self._snapshot.checkout(version, branch=branch))

    def relocate(self) -> Table:
        """Point the store base of main and of every branch at the table's own store, one
        commit each where needed, after the table was copied or moved (stock Lance readers
        follow the store path a manifest records; blobhouse reads the table's own store either
        way, and its writes relocate first), and borrow the managed objects its original owns
        (the original's gc keeps them while this table exists: docs/managed-objects.md).
        Moves this table to its new version."""
        for branch in [None, *self.branches()]:
            try:
                on = self.checkout(None, branch=branch or "main")
            except BlobhouseError:
                if branch is None:
                    raise
                continue  # made before a move: Lance cannot repoint it (verify says so)
            relocate_store(on.dataset, on.location, self.storage_options)
        try:
            borrow_carried(self.location, self.storage_options)
        except OSError as exc:
            raise BlobhouseError(
                f"{self.uri} was relocated, but borrowing the managed objects its original "
                f"owns failed ({exc}): run relocate again, or its original's gc may delete them"
            ) from exc
        return self.refresh()

    def delete(self, filter: str) -> Table:
        """Delete the rows matching the SQL ``filter``, as a new version (this table moves to
        it)."""
        return self._moved_to(delete_rows(self._snapshot, filter))

    @keywords_checked
    @option_keywords(commit=CommitOptions)
    def update(
        self,
        updates: Mapping[str, str | BlobFunction | None],
        where: str | None = None,
        *,
        dedup: str | None = None,
        commit: CommitOptions | None = None,
    ) -> UpdateReport:
        """Set columns on the rows matching the SQL ``where`` (every row if None), in one
        commit; this table moves to the new version.

        ``updates`` maps a column to a SQL expression over the row (Lance's ``update``); a
        blob column to a function of the matching rows' plain columns (an Arrow batch -> one
        blob value per row, like :meth:`backfill_blob_column`), to bytes (one payload for every
        matching row) or None (null). Only the
        changed columns are rewritten, in the fragments holding a matching row: blob payloads
        of other columns are never copied. New blob values go through the write pipeline with
        the column's dedup mode (its property; ``dedup``, if given, must be the same); the
        unchanged rows of a rewritten blob column are copied once per distinct
        payload (their store references kept, with ``dedup="global"``). A commit a concurrent
        one preempted is run again up to ``commit.retries`` times (or ``retries=``, its sugar).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "label": ["cat", "dog"],
        ...                           "img": blob_array([b"x", b"y"])}), tempfile.mkdtemp() + "/t")
        >>> t.update({"label": "upper(label)"}, where="id = 2").rows_updated
        1
        >>> t.to_arrow(columns=["id", "label"]).to_pylist()
        [{'id': 1, 'label': 'cat'}, {'id': 2, 'label': 'DOG'}]
        """
        done = update_rows(self._snapshot, updates, where, dedup=dedup, commit=commit)
        self._moved_to(done.snapshot)
        return done.report

    @keywords_checked
    def merge_insert(
        self,
        on: str | Sequence[str],
        *,
        dedup: str | Mapping[str, str] | None = None,
        ref_id_columns: Mapping[str, str] | None = None,
        placement: Mapping[str, Mapping[str, int]] | None = None,
    ) -> MergeInsert:
        """An upsert keyed by ``on``, built like Lance's ``merge_insert`` and run with
        ``execute(data)`` in one commit (see :class:`~blobhouse.changes.merge_insert.MergeInsert`).
        New rows are written through the write pipeline with the table's properties (options
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
        return MergeInsert(self._snapshot, on, options, on_commit=self._moved_to)

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
        self._snapshot = self._snapshot.latest()
        return self

    def _moved_to(self, snapshot: TableSnapshot | LanceDataset) -> Table:
        """This table at ``snapshot`` (or at a dataset a commit returned): what every change
        does once it committed."""
        if isinstance(snapshot, LanceDataset):
            snapshot = self._snapshot.at(snapshot)
        self._snapshot = snapshot
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
        return self._moved_to(
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
        return self._moved_to(
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
        return self._moved_to(
            schema_changes.drop_columns(self.location, columns, self.storage_options)
        )

    def add_data_file(self, written: WrittenFile) -> Table:
        """Append a data file written by a :class:`~blobhouse.files.session.BlobSession` as a new
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
        return self._moved_to(add_data_file(self._snapshot, written))

    def replace_column(self, column: str, files: Mapping[int, WrittenFile]) -> Table:
        """Make session-written ``files`` (fragment id -> file) the data of blob ``column``, in
        one transaction: Lance ``DataReplacement`` for an existing column (any fragments), or
        ``Merge`` adding a new column (every fragment). Each file holds the fragment's number of
        physical rows and the columns of the file it replaces."""
        return self._moved_to(replace_files(self._snapshot, column, files))

    def data_file_path(self) -> str:
        """A fresh path for a data file of this table (for a :class:`BlobSession`)."""
        return f"{self.location.data_dir}/{data_file_name('')}"

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
        done = backfill(self._snapshot, column, mode, fn)
        return self._moved_to(done.snapshot)

    @property
    def maintenance(self) -> TableMaintenance:
        """The table services: ``compact``, ``gc``, ``verify``, ``stats`` (see
        :class:`~blobhouse.maintenance.table_maintenance.TableMaintenance`); the flat methods
        below are the same services."""
        return TableMaintenance(lambda: self._snapshot, self._moved_to)

    def gc(self, **options: Any) -> GcReport:
        """Remove what no retained version needs: :meth:`TableMaintenance.gc`'s options."""
        return self.maintenance.gc(**options)

    def verify(self, **options: Any) -> VerifyReport:
        """Check every reference (and its bytes): :meth:`TableMaintenance.verify`'s options."""
        return self.maintenance.verify(**options)

    @keywords_checked
    @option_keywords(targets=CompactionTargets, commit=CommitOptions)
    def compact(
        self,
        targets: CompactionTargets | None = None,
        *,
        progress: ProgressCallback | None = None,
        commit: CommitOptions | None = None,
    ) -> CompactionReport:
        """:meth:`TableMaintenance.compact`: rewrites small fragments and those with many
        deleted rows, keeping blob sharing, and moves this table to the version it committed.
        The fields of ``targets`` (``target_rows``, ...) and of ``commit`` (``retries``) may
        be given as keywords instead."""
        return self.maintenance.compact(targets, progress=progress, commit=commit)

    def stats(self) -> StatsReport:
        """Logical and physical bytes, per column and kind: see :meth:`TableMaintenance.stats`."""
        return self.maintenance.stats()
