"""Write pipeline: logical blob values -> dedup key -> placement -> prepared values -> data file.

:func:`plan_write` resolves what a write means for a given input schema (which columns are blobs,
their placement and dedup mode, the data file and table schemas). :class:`DataFileWriter` writes
one Lance data file and its sidecars from logical batches, and :func:`write_data_files` splits a
stream of batches into data files by rows and bytes. Everything below the plan is per data file,
so the same code runs in a Python process and in a Spark task.

Small payloads wait in a bounded window before they are placed: a payload that appears more
than once in the window is packed once and shared instead of being inlined.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import lance
import pyarrow as pa
from lance.blob import blob_field as lance_blob_field
from lance.file import LanceFileSession

from blobhouse import leases
from blobhouse.dedup import DedupIndex, DedupMode, Fingerprint, content_hash, dedup_modes
from blobhouse.errors import ExternalBlobError, InvalidInputError, SchemaError
from blobhouse.layout import TableLocation
from blobhouse.managed import ManagedPolicy
from blobhouse.placement import (
    AllowedBases,
    Kind,
    MiB,
    Placement,
    as_uri,
    external_range,
    placement_metadata,
)
from blobhouse.references import file_path
from blobhouse.session import (
    BlobSession,
    PackedSidecar,
    PreparedBlob,
    WrittenFile,
    prepared_array,
    prepared_field,
)
from blobhouse.storage import LANCE_IO_ERRORS, StorageOptions, object_store
from blobhouse.store import StoreReference, StoreWriter, remove_packs, remove_staged_packs
from blobhouse.values import (
    ColumnPath,
    LogicalColumn,
    find_blob_columns,
    get_column,
    get_field,
    path_name,
    replace_column,
    replace_field,
    stored_blob_columns,
)

DEFAULT_MAX_ROWS_PER_FILE = 1024 * 1024
DEFAULT_MAX_BYTES_PER_FILE = 90 * 1024 * MiB
WINDOW_BYTES = 64 * MiB
WINDOW_ROWS = 64 * 1024  # small rows cost more in bookkeeping than in bytes


@dataclass(frozen=True)
class BlobColumnPlan:
    """How one blob column is written."""

    path: ColumnPath
    placement: Placement
    dedup: DedupMode
    ref_id_column: str | None = None

    @property
    def name(self) -> str:
        return path_name(self.path)


@dataclass(frozen=True)
class WritePlan:
    """What a write means for one input schema: built once, used by every data file."""

    columns: tuple[BlobColumnPlan, ...]
    input_schema: pa.Schema
    file_schema: pa.Schema
    table_schema: pa.Schema
    allowed_bases: AllowedBases = field(default_factory=AllowedBases)
    max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE
    max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE
    store_base_id: int | None = None  # the table's store (blobhouse.store), when it has one
    load_store_index: bool = True  # False: the rows were already looked up (a Spark join)
    avoid_packs: frozenset[str] = frozenset()  # store packs not to reference (being repacked)

    @property
    def uses_store(self) -> bool:
        """Whether some column stores its payloads in the table's store (dedup="global")."""
        return any(c.dedup == "global" for c in self.columns)


def plan_write(
    input_schema: pa.Schema,
    *,
    blob_columns: Iterable[str] = (),
    ref_id_columns: Mapping[str, str] | None = None,
    dedup: str | Mapping[str, str] = "content",
    placement: Mapping[str, Mapping[str, int]] | None = None,
    table_schema: pa.Schema | None = None,
    allowed_bases: AllowedBases | None = None,
    max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE,
    max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
) -> WritePlan:
    """Resolve a write of ``input_schema``; ``table_schema`` is the existing table's (append).

    Placement of a column: ``placement[column]`` > ``placement["*"]`` (every blob column) > the
    input field's metadata > the table's field metadata > Lance's defaults.
    """
    if max_rows_per_file < 1 or max_bytes_per_file < 1:
        raise InvalidInputError("max_rows_per_file and max_bytes_per_file must be positive")
    named = set(blob_columns)
    if table_schema is not None:
        named |= {path_name(p) for p in stored_blob_columns(table_schema)}
    paths = find_blob_columns(input_schema, sorted(named))
    names = [path_name(p) for p in paths]
    ref_id_columns = dict(ref_id_columns or {})
    _check_ref_id_columns(input_schema, ref_id_columns, names)
    placement = dict(placement or {})
    unknown = set(placement) - set(names) - {"*"}
    if unknown:
        raise InvalidInputError(f"placement names unknown blob column(s) {sorted(unknown)}")
    modes = dedup_modes(dedup, names)

    columns = []
    file_schema, new_table_schema = input_schema, input_schema
    for path, name in zip(paths, names, strict=True):
        in_field = get_field(input_schema, path)
        column_placement = Placement()
        if table_schema is not None:
            column_placement = column_placement.updated(get_field(table_schema, path).metadata)
        overrides = {**placement.get("*", {}), **placement.get(name, {})}
        column_placement = column_placement.updated(in_field.metadata).updated(overrides)
        columns.append(
            BlobColumnPlan(path, column_placement, modes[name], ref_id_columns.get(name))
        )
        file_schema = replace_field(file_schema, path, prepared_field(path[-1], in_field.nullable))
        kept = _placement_to_keep(in_field, table_schema, path, overrides)
        table_field = lance_blob_field(path[-1], nullable=in_field.nullable)
        new_table_schema = replace_field(
            new_table_schema, path, table_field.with_metadata(kept) if kept else table_field
        )
    if table_schema is not None:
        check_same_schema(new_table_schema, table_schema)
        new_table_schema = table_schema
    return WritePlan(
        columns=tuple(columns),
        input_schema=input_schema,
        file_schema=file_schema,
        table_schema=new_table_schema,
        allowed_bases=allowed_bases or AllowedBases(),
        max_rows_per_file=max_rows_per_file,
        max_bytes_per_file=max_bytes_per_file,
    )


class DataFileWriter:
    """Writes one Lance data file and its sidecars from logical batches.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse.values import blob_array
    >>> batch = pa.record_batch({"img": blob_array([b"a" * 10, b"a" * 10])})
    >>> writer = DataFileWriter(plan_write(batch.schema), TableLocation(tempfile.mkdtemp()))
    >>> writer.write(batch)
    >>> written = writer.finish()
    >>> written.num_rows, written.sidecar_bytes  # two rows, one shared copy
    (2, 10)
    """

    def __init__(
        self,
        plan: WritePlan,
        location: TableLocation,
        storage_options: StorageOptions | None = None,
        name_prefix: str = "",
        store: StoreWriter | None = None,
        managed: ManagedPolicy | None = None,
    ) -> None:
        self.plan = plan
        name = f"{name_prefix}{uuid.uuid4().hex}.lance"
        self.session = BlobSession(f"{location.data_dir}/{name}", storage_options)
        if plan.uses_store and store is None:
            raise InvalidInputError(
                "dedup='global' writes go through a table write (write_table, the Spark writer), "
                "which shares one store writer between its data files"
            )
        self.store = store
        self.own_store = store_reference(plan, location, storage_options)
        policy = managed or ManagedPolicy(plan.allowed_bases, location, storage_options)
        self.placers = [
            _ColumnPlacer(c, self.session, plan.allowed_bases, store, self.own_store, policy)
            for c in plan.columns
        ]
        self.num_rows = 0
        self._file_bytes = 0
        self._writer = None
        self._window: list[tuple[pa.RecordBatch, list[_Decided]]] = []
        self._window_bytes = 0
        self._window_rows = 0

    @property
    def bytes_written(self) -> int:
        """Bytes handed to the data file and the sidecars so far."""
        return self._file_bytes + sum(p.sidecar_bytes for p in self.placers)

    def write(self, batch: pa.RecordBatch, first_row: int = 0) -> None:
        """Add ``batch``; ``first_row`` is its first row's index in the whole write (errors)."""
        decided = [p.decide(batch, first_row) for p in self.placers]
        self._window.append((batch, decided))
        self._window_bytes += batch.nbytes
        self._window_rows += batch.num_rows
        self.num_rows += batch.num_rows
        if self._window_bytes >= WINDOW_BYTES or self._window_rows >= WINDOW_ROWS:
            self._flush()

    def finish(self) -> WrittenFile:
        """Write what is pending, close the data file and its sidecars."""
        self._flush()
        for placer in self.placers:
            placer.close()
        self.session.writes.close()
        packs, stored = self.store.take_new() if self.store is not None else ((), ())
        writer = self._data_file()
        self.session.close_data_file(writer)
        return WrittenFile(
            name=self.session.data_file_name,
            num_rows=self.num_rows,
            size_bytes=writer.size_bytes,
            sidecars=tuple(self.session.sidecars),
            sidecar_bytes=sum(p.sidecar_bytes for p in self.placers),
            packs=packs,
            stored=stored,
            found_packs=tuple(sorted(self._found_packs())),
            managed=tuple(sorted(set().union(*(p.handed for p in self.placers)))),
        )

    def _found_packs(self) -> set[str]:
        """Store packs this file references without having written them."""
        found = set(self.store.found_packs) if self.store is not None else set()
        return found | (self.own_store.found if self.own_store is not None else set())

    def abort(self) -> None:
        """Remove everything this writer put on storage."""
        # close open sidecars and drop the data file writer before their files are deleted
        self._writer = None
        for placer in self.placers:
            placer.discard()
        self.session.abort()

    def _data_file(self):
        if self._writer is None:
            self._writer = self.session.open_data_file(self.plan.file_schema)
        return self._writer

    def _flush(self) -> None:
        counts = [Counter[Hashable]() for _ in self.placers]
        for _, decided in self._window:
            for count, column in zip(counts, decided, strict=True):
                count.update(v.key for v in column.values if isinstance(v, _Pending) and v.key)
        file_row = self.num_rows - self._window_rows  # rows of the window start here in the file
        for batch, decided in self._window:
            for placer, count, column in zip(self.placers, counts, decided, strict=True):
                batch = replace_column(
                    batch,
                    placer.plan.path,
                    prepared_array(placer.resolve(column, count, file_row), column.column.data),
                    get_field(self.plan.file_schema, placer.plan.path),
                )
            file_row += batch.num_rows
            out = pa.RecordBatch.from_arrays(batch.columns, schema=self.plan.file_schema)
            self._data_file().write_batch(out)
            self._file_bytes += out.nbytes
        self._window.clear()
        self._window_bytes = 0
        self._window_rows = 0


def write_data_files(
    batches: Iterable[pa.RecordBatch],
    plan: WritePlan,
    location: TableLocation,
    storage_options: StorageOptions | None = None,
    name_prefix: str = "",
) -> list[WrittenFile]:
    """Write ``batches`` into as many data files as the plan's limits need.

    Data file names start with ``name_prefix`` (how a write finds every file it staged), and the
    write's lease is held meanwhile (:mod:`blobhouse.leases`). On any error, every file written
    so far is removed and the error is raised.
    """
    with leases.held(location.root, name_prefix, storage_options):
        return _write_data_files(batches, plan, location, storage_options, name_prefix)


def _write_data_files(
    batches: Iterable[pa.RecordBatch],
    plan: WritePlan,
    location: TableLocation,
    storage_options: StorageOptions | None,
    name_prefix: str,
) -> list[WrittenFile]:
    written: list[WrittenFile] = []
    writer: DataFileWriter | None = None
    store = _store_writer(plan, location, storage_options, name_prefix)
    managed = ManagedPolicy(plan.allowed_bases, location, storage_options)  # one per write
    row = 0
    try:
        for batch in batches:
            batch = _conform(batch, plan.input_schema)
            by_bytes = max(1, int(batch.num_rows * WINDOW_BYTES / max(batch.nbytes, 1)))
            by_bytes = min(by_bytes, WINDOW_ROWS)
            start = 0
            while start < batch.num_rows:
                writer = writer or DataFileWriter(
                    plan, location, storage_options, name_prefix, store, managed
                )
                take = min(
                    batch.num_rows - start, by_bytes, plan.max_rows_per_file - writer.num_rows
                )
                writer.write(batch.slice(start, take), first_row=row)
                start += take
                row += take
                if (
                    writer.num_rows >= plan.max_rows_per_file
                    or writer.bytes_written >= plan.max_bytes_per_file
                ):
                    written.append(writer.finish())
                    writer = None
        if writer is not None:
            written.append(writer.finish())
            writer = None
        if store is not None:
            store.finish()
    except BaseException:
        if writer is not None:
            writer.abort()
        if store is not None:
            store.abort()
        remove_written(written, location, storage_options)
        raise
    return written


def _store_writer(
    plan: WritePlan,
    location: TableLocation,
    storage_options: StorageOptions | None,
    name_prefix: str,
) -> StoreWriter | None:
    if not plan.uses_store:
        return None
    if plan.store_base_id is None:
        raise InvalidInputError("dedup='global' needs the table's store registered (TableWrite)")
    limit = min(c.placement.pack_file_size_threshold for c in plan.columns if c.dedup == "global")
    return StoreWriter(
        location.root,
        plan.store_base_id,
        name_prefix,
        limit,
        storage_options,
        plan.load_store_index,
        plan.avoid_packs,
    )


def store_reference(
    plan: WritePlan, location: TableLocation, storage_options: StorageOptions | None = None
) -> StoreReference | None:
    """How the placers of a write recognize references into the table's own store."""
    if plan.store_base_id is None:
        return None
    return StoreReference(location.root, plan.store_base_id, storage_options)


def remove_written(
    files: Iterable[WrittenFile],
    location: TableLocation,
    storage_options: StorageOptions | None = None,
) -> None:
    """Delete data files, sidecars and store packs that were written but will never be
    committed (those the table's latest version uses are kept: see :func:`committed_names`)."""
    files = list(files)
    committed = committed_names(location, storage_options) if files else set()
    for written in files:
        if written.name in committed:
            continue
        remove_packs(location.root, written.packs, storage_options)
        session = BlobSession(f"{location.data_dir}/{written.name}", storage_options)
        session.sidecars = list(written.sidecars)
        session.abort()


def committed_names(location: TableLocation, storage_options: StorageOptions | None) -> set[str]:
    """The data files the latest version of the table's branch uses. A write interrupted as
    its commit returns (Ctrl-C reaches Python only once Lance's commit is done) fails after
    committing: its cleanup must not remove what it committed."""
    try:
        dataset = lance.dataset(location.dataset_path, storage_options=storage_options)
    except (ValueError, OSError):
        return set()  # no table (yet)
    return {file_path(f) for fragment in dataset.get_fragments() for f in fragment.metadata.files}


def mark_aborted(
    location: TableLocation, name_prefix: str, storage_options: StorageOptions | None = None
) -> None:
    """Leave a marker that tells tasks of this write, still running, to remove what they wrote
    instead of reporting it (gc removes the marker with the other leftovers)."""
    uri = _marker_uri(location, name_prefix)
    object_store(uri, storage_options).put(uri, b"")


def is_aborted(
    location: TableLocation, name_prefix: str, storage_options: StorageOptions | None = None
) -> bool:
    """Whether :func:`mark_aborted` ran for this write."""
    uri = _marker_uri(location, name_prefix)
    return object_store(uri, storage_options).size(uri) is not None


def _marker_uri(location: TableLocation, name_prefix: str) -> str:
    uri = f"{location.data_dir}/aborted-{name_prefix}"  # outside the prefix: sweeps keep it
    return as_uri(uri)


def remove_staged(
    location: TableLocation, name_prefix: str, storage_options: StorageOptions | None = None
) -> None:
    """Delete every data file (and its sidecars) whose name starts with ``name_prefix``: what a
    write staged, including files of tasks whose results never reached the driver; and the
    write's lease (the write will not commit)."""
    if not name_prefix:
        raise ValueError("remove_staged needs a non-empty prefix")
    if any(name.startswith(name_prefix) for name in committed_names(location, storage_options)):
        return  # the write committed after all
    data_dir = location.data_dir
    remove_staged_packs(location.root, name_prefix, storage_options)
    leases.release(location.root, name_prefix, storage_options)
    files = LanceFileSession(data_dir, storage_options=storage_options)
    try:
        listed = files.list()
    except LANCE_IO_ERRORS:  # cleanup is best effort: gc removes what is left
        return
    staged = [p for p in listed if p.startswith(name_prefix)]
    for path in staged:
        with contextlib.suppress(*LANCE_IO_ERRORS):
            files.delete_file(path)
    if "://" not in data_dir:
        keys = {p.split("/", 1)[0].removesuffix(".lance") for p in staged}
        for key in keys:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(data_dir, key))


@dataclass(frozen=True)
class _Pending:
    """A small payload whose placement waits until its window is flushed (``digest``: its
    blake3, when dedup already computed it)."""

    row: int
    key: Hashable | None
    digest: bytes | None = None


@dataclass(frozen=True)
class _Decided:
    """One blob column of one batch: placed values, and small payloads still pending."""

    column: LogicalColumn
    values: list[PreparedBlob | _Pending | None]


class _ColumnPlacer:
    """Places the payloads of one blob column of one data file."""

    def __init__(
        self,
        plan: BlobColumnPlan,
        session: BlobSession,
        bases: AllowedBases,
        store: StoreWriter | None = None,
        own_store: StoreReference | None = None,
        managed: ManagedPolicy | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        self.own_store = own_store
        self.managed = managed
        self.handed: set[str] = set()  # external objects this column hands to the table
        self.name = plan.name  # read for every row: joined once
        self.session = session
        self.index = DedupIndex()
        self.bases = bases
        self.stored: dict[Hashable, PreparedBlob] = {}
        self.inlined: set[Hashable] = set()
        # short digests of unique small payloads already inlined (8 bytes each, not the
        # window's rows): a copy met in a later window is packed and shared from then on
        self.inlined_before: set[int] = set()
        self.sidecar_bytes = 0
        self._pack: PackedSidecar | None = None
        self._object_sizes: dict[str, int] = {}

    def decide(self, batch: pa.RecordBatch, first_row: int) -> _Decided:
        """Place every row that can be placed now; small payloads wait as :class:`_Pending`."""
        ref_ids = batch.column(self.plan.ref_id_column) if self.plan.ref_id_column else None
        column = LogicalColumn(
            get_column(batch, self.plan.path), self.name, ref_ids, first_row=first_row
        )
        values = [self._decide_row(column, row, first_row + row) for row in range(column.length)]
        return _Decided(column, values)

    def resolve(
        self, decided: _Decided, counts: Counter, file_row: int
    ) -> list[PreparedBlob | None]:
        """Final values of one batch (whose first row is ``file_row`` of the data file):
        pending payloads are packed if shared, else inlined."""
        return [
            self._resolve_pending(decided.column, v, counts, file_row)
            if isinstance(v, _Pending)
            else v
            for v in decided.values
        ]

    def close(self) -> None:
        if self._pack is not None:
            self._pack.finish(wait=False)
            self._pack = None

    def discard(self) -> None:
        if self._pack is not None:
            self._pack.finish()  # closes the file; the session deletes it
            self._pack = None

    def _decide_row(self, column: LogicalColumn, row: int, global_row: int):
        if not column.valid[row]:
            return None
        ref_id = column.ref_id[row] if column.ref_id is not None else None
        if column.uri is not None and column.uri[row] is not None:
            return self._external(column, row, global_row, ref_id)
        payload = column.payload(row)
        if self.plan.dedup == "global" and len(payload):
            return self.store.place(payload, content_hash(payload))
        digest = None
        if self.plan.dedup == "content" or (self.plan.dedup == "ref_id" and ref_id):
            digest = content_hash(payload)
        key = self.index.key(self.plan.dedup, self.name, ref_id=ref_id, digest=digest)
        if key is not None:
            fingerprint = Fingerprint(len(payload), digest, global_row)
            if not self.index.first_seen(key, fingerprint, column=self.name, ref_id=ref_id):
                if key in self.stored:
                    return self.stored[key]
                return _Pending(row, key, digest)
        seen_inlined = digest is not None and _short(digest) in self.inlined_before
        if (
            self.plan.placement.kind_for(len(payload), shared=False) == Kind.INLINE
            and not seen_inlined
        ):
            return _Pending(row, key, digest)
        kind = self.plan.placement.kind_for(len(payload), shared=True)
        value = self._store(payload, kind, digest)
        if key is not None:
            self.stored[key] = value
        return value

    def _resolve_pending(
        self, column: LogicalColumn, pending: _Pending, counts: Counter, file_row: int
    ) -> PreparedBlob:
        key = pending.key
        if key in self.stored:
            return self.stored[key]
        payload = column.payload(pending.row)
        if key is not None and (counts[key] > 1 or key in self.inlined):
            value = self._store(payload, Kind.PACKED, pending.digest)
            self.stored[key] = value
            return value
        if key is not None and self.plan.dedup == "ref_id":
            self.inlined.add(key)  # ref_ids stay known: a later row must match the first
        elif key is not None:
            # a unique small payload is forgotten once placed, so the index of a file holds
            # its stored payloads and the current window, not one entry per small row; a copy
            # met again in a later window is packed (one extra copy, then shared)
            self.index.forget(key)
            self.inlined_before.add(_short(pending.digest))
        digest = pending.digest or content_hash(payload)  # dedup "off" hashed nothing yet
        self.session.checksums.record_inline(
            self.name, file_row + pending.row, len(payload), digest
        )
        return PreparedBlob(Kind.INLINE, size=len(payload))

    def _store(self, payload: memoryview, kind: Kind, digest: bytes | None) -> PreparedBlob:
        """Write ``payload`` to a sidecar (``digest``: its blake3, when dedup computed it)."""
        self.sidecar_bytes += len(payload)
        if kind == Kind.DEDICATED:
            sidecar = self.session.new_dedicated(digest)
            sidecar.write(payload)
            return sidecar.finish(wait=False)  # the session drains before the file is done
        limit = self.plan.placement.pack_file_size_threshold
        if self._pack is not None and self._pack.size and self._pack.size + len(payload) > limit:
            self._pack.finish(wait=False)
            self._pack = None
        if self._pack is None:
            self._pack = self.session.new_packed()
        return self._pack.write_blob(payload, digest)

    def _external(
        self, column: LogicalColumn, row: int, global_row: int, ref_id: int | None
    ) -> PreparedBlob:
        name = self.name
        flagged = column.is_managed(row)
        in_store = self.own_store.reference(column, row) if self.own_store else None
        if in_store is not None and flagged:
            raise ExternalBlobError(
                f"blob column {name!r}, row {global_row}: managed uri {column.uri[row]!r} lies "
                "inside the table (its store); the table owns its own files already"
            )
        if in_store is not None:
            return in_store  # the table's own store: compaction keeps such references
        uri, position, size = external_range(
            column.uri[row],
            column.position[row] if column.position is not None else None,
            column.size[row] if column.size is not None else None,
            self.bases,
            column=name,
            row=global_row,
            sizes=self._object_sizes,
            storage_options=self.session.storage_options,
            managed=flagged,
        )
        if self.managed is not None and self.managed.managed(uri, flagged):
            self.handed.add(uri)
        if self.plan.dedup == "ref_id" and ref_id:
            key = self.index.key("ref_id", name, ref_id=ref_id, digest=None)
            fingerprint = Fingerprint(size, None, global_row, external=(uri, position, size))
            self.index.first_seen(key, fingerprint, column=name, ref_id=ref_id)
        return PreparedBlob(Kind.EXTERNAL, size=size, position=position, uri=uri)


def _short(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little")


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema == schema:
        return batch
    if batch.schema.names != schema.names:
        raise SchemaError(
            f"batch columns {batch.schema.names} differ from the first batch's {schema.names}"
        )
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"batch schema differs from the first batch's: {exc}") from None


def _check_ref_id_columns(
    schema: pa.Schema, ref_id_columns: dict[str, str], names: list[str]
) -> None:
    for blob, ref in ref_id_columns.items():
        if blob not in names:
            raise SchemaError(
                f"ref_id_columns names {blob!r}, which is not a blob column (blob columns: {names})"
            )
        if ref not in schema.names:
            raise SchemaError(
                f"ref_id column {ref!r} for blob column {blob!r} is not in the "
                f"data (columns: {schema.names})"
            )
        if not pa.types.is_integer(schema.field(ref).type):
            raise SchemaError(
                f"ref_id column {ref!r} must be an integer column, got {schema.field(ref).type}"
            )


def _placement_to_keep(
    in_field: pa.Field,
    table_schema: pa.Schema | None,
    path: ColumnPath,
    write_overrides: Mapping[str, int] | None,
) -> dict[bytes, bytes]:
    """Placement metadata the table schema records for a column created by this write."""
    kept = placement_metadata(in_field.metadata)
    if table_schema is not None:
        kept = {**placement_metadata(get_field(table_schema, path).metadata), **kept}
    return {**kept, **Placement.overrides(**dict(write_overrides or {}))}


def check_same_schema(new: pa.Schema, existing: pa.Schema) -> None:
    """Refuse data whose columns (names, types, order) differ from the table's."""

    def shape(schema: pa.Schema) -> list[tuple[str, str]]:
        return [(f.name, str(f.type)) for f in schema]

    if shape(new) != shape(existing):
        got = dict(shape(new))
        want = dict(shape(existing))
        diffs = [
            f"{n}: table has {want.get(n, '-')}, data has {got.get(n, '-')}"
            for n in dict.fromkeys([*want, *got])
            if want.get(n) != got.get(n)
        ]
        if not diffs:
            diffs = [f"column order: table {existing.names}, data {new.names}"]
        raise SchemaError("data does not match the table's schema: " + "; ".join(diffs))
