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

import functools
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from lance.blob import blob_field as lance_blob_field

from blobhouse.columns import check_blob_column, check_column_names, resolve_column
from blobhouse.commit import leases
from blobhouse.commit.transaction import remove_written
from blobhouse.dedup import (
    CORES,
    BatchHasher,
    DedupIndex,
    DedupMode,
    Fingerprint,
    dedup_modes,
)
from blobhouse.errors import ExternalBlobError, InvalidInputError, SchemaError, cleanup_after
from blobhouse.files.session import (
    BlobSession,
    PackedSidecar,
    PreparedBlob,
    WrittenFile,
    data_cache_bytes,
    prepared_array,
    prepared_field,
)
from blobhouse.gc_pause import gc_paused
from blobhouse.io.objects import StorageOptions
from blobhouse.layout import TableLocation, data_file_name
from blobhouse.managed import ManagedPolicy
from blobhouse.options import DEFAULT_MAX_BYTES_PER_FILE, DEFAULT_MAX_ROWS_PER_FILE
from blobhouse.ownership import marker_problem
from blobhouse.placement import (
    AllowedBases,
    Kind,
    MiB,
    Placement,
    external_range,
    placement_metadata,
)
from blobhouse.store.claims import Claims
from blobhouse.store.writer import StoreReference, StoreWriter
from blobhouse.values import (
    LOGICAL_BLOB_TYPE,
    ColumnPath,
    LogicalColumn,
    find_blob_columns,
    get_column,
    get_field,
    is_lance_blob_field,
    path_name,
    replace_column,
    replace_field,
    stored_blob_columns,
)

# while a window is placed, the one before it is written (blobhouse.files.session.DATA_WRITE_BYTES):
# two windows at most are in memory
WINDOW_BYTES = 32 * MiB
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
    # the tasks of a Spark write claim new store payloads, so that one of them stores each
    claim_payloads: bool = False
    filled: tuple[str, ...] = ()  # nullable table columns the input lacks: written as nulls
    # (pack, position, size) -> the blake3 rows recorded for a store payload they keep
    # referencing (a rewrite fills it as it reads them): recorded again in the new data file
    store_digests: dict[tuple[str, int, int], bytes] | None = field(default=None, compare=False)

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
    check_column_names(input_schema)
    named = set(blob_columns)
    filled: tuple[str, ...] = ()
    if table_schema is not None:
        find_blob_columns(input_schema, sorted(named))  # the data's own problems first
        input_schema, filled = align_to_table(input_schema, table_schema)
        named |= {path_name(p) for p in stored_blob_columns(table_schema)}
    paths = find_blob_columns(input_schema, sorted(named))
    names = [path_name(p) for p in paths]
    ref_id_columns = dict(ref_id_columns or {})
    _check_ref_id_columns(input_schema, ref_id_columns, names)
    placement = dict(placement or {})
    for name in sorted(set(placement) - set(names) - {"*"}):
        check_blob_column(name, names, "placement")  # raises, naming the closest
    modes = dedup_modes(dedup, names)

    columns = []
    file_schema, new_table_schema = input_schema, input_schema
    for path, name in zip(paths, names, strict=True):
        in_field = get_field(input_schema, path)
        column_placement = Placement()
        if table_schema is not None:
            recorded = get_field(table_schema, path).metadata
            column_placement = column_placement.updated(recorded, name)
        overrides = {**placement.get("*", {}), **placement.get(name, {})}
        column_placement = column_placement.updated(in_field.metadata, name)
        column_placement = column_placement.updated(overrides, name)
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
        filled=filled,
    )


def align_to_table(
    input_schema: pa.Schema, table_schema: pa.Schema
) -> tuple[pa.Schema, tuple[str, ...]]:
    """``input_schema`` in the table's column order, with the nullable table columns it lacks
    added (they are written as nulls), and their names. Refused, naming the columns: columns
    the table does not have, and missing columns the table requires (not nullable). Types
    are compared later (:func:`check_same_schema`).

    >>> table = pa.schema([pa.field("id", pa.int64()), pa.field("label", pa.string())])
    >>> aligned, filled = align_to_table(pa.schema([pa.field("id", pa.int64())]), table)
    >>> aligned.names, filled
    (['id', 'label'], ('label',))
    """
    names = input_schema.names  # each once (plan_write checked the names)
    extra = [n for n in names if n not in table_schema.names]
    missing = [f for f in table_schema if f.name not in names]
    required = [f.name for f in missing if not f.nullable]
    if extra or required:
        raise SchemaError(
            _columns_problem(extra, required, [f.name for f in missing], table_schema)
        )
    fields = [
        input_schema.field(f.name) if f.name in names else _as_input(f).with_nullable(True)
        for f in table_schema
    ]
    return pa.schema(fields, metadata=input_schema.metadata), tuple(f.name for f in missing)


def _columns_problem(
    extra: list[str], required: list[str], missing: list[str], table_schema: pa.Schema
) -> str:
    """Why data with these columns cannot be appended, naming them."""
    problems = []
    if extra:
        problems.append(f"column(s) {extra} of the data are not in the table")
    if required:
        problems.append(
            f"the data lacks column(s) {required}, which the table requires (not nullable)"
        )
    elif extra and missing:  # a renamed column, most likely
        problems.append(f"the table's column(s) {missing} are not in the data")
    return "; ".join(problems) + f" (the table's columns: {table_schema.names})"


def _as_input(field: pa.Field) -> pa.Field:
    """A table field as input data carries it: blob columns as the logical blob struct."""
    if is_lance_blob_field(field):
        return pa.field(field.name, LOGICAL_BLOB_TYPE, field.nullable)
    if pa.types.is_struct(field.type):
        children = [_as_input(child) for child in field.type]
        return pa.field(field.name, pa.struct(children), field.nullable, field.metadata)
    return field


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
        name = data_file_name(name_prefix)
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
        with gc_paused():  # a few objects a payload: see blobhouse.gc_pause
            self._write(batch, first_row)

    def _write(self, batch: pa.RecordBatch, first_row: int) -> None:
        decided = [p.decide(batch, first_row) for p in self.placers]
        self._window.append((batch, decided))
        self._window_bytes += batch.nbytes
        self._window_rows += batch.num_rows
        self.num_rows += batch.num_rows
        if self._window_bytes >= WINDOW_BYTES or self._window_rows >= WINDOW_ROWS:
            self._flush()

    def finish(self) -> WrittenFile:
        """Write what is pending, close the data file and its sidecars."""
        with gc_paused():
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
            borrowed=tuple(self.store.borrowed.values()) if self.store is not None else (),
            claimed=self.store is not None and self.store.claims is not None,
            managed=tuple(sorted(set().union(*(p.handed for p in self.placers)))),
        )

    def _found_packs(self) -> set[str]:
        """Store packs this file references without having written them."""
        found = set(self.store.found_packs) if self.store is not None else set()
        return found | (self.own_store.found if self.own_store is not None else set())

    def abort(self) -> None:
        """Remove everything this writer put on storage."""
        # drop open sidecars (the session aborts them) and the data file writer before their
        # files are deleted
        self._writer = None
        for placer in self.placers:
            placer.discard()
        self.session.abort()

    def _data_file(self, first: pa.RecordBatch | None = None):
        """The data file's writer, opened for ``first``, the file's first batch (None: the
        file has no rows)."""
        if self._writer is None:
            cache_bytes = data_cache_bytes(first)
            self._writer = self.session.open_data_file(self.plan.file_schema, cache_bytes)
        return self._writer

    def _flush(self) -> None:
        counts = [Counter[Hashable]() for _ in self.placers]
        for _, decided in self._window:
            for placer, count, column in zip(self.placers, counts, decided, strict=True):
                count.update(placer.waiting_keys(column))
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
            self.session.write_data(self._data_file(out), out)
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
    write's lease is held meanwhile (:mod:`blobhouse.commit.leases`). On any error, every file
    written so far is removed and the error is raised.
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
    store = store_writer_for_plan(plan, location, storage_options, name_prefix)
    managed = ManagedPolicy(plan.allowed_bases, location, storage_options)  # one per write
    row = 0
    try:
        for batch in batches:
            batch = _conform(batch, plan, row)
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
    except BaseException as exc:
        if store is not None and store.claimed:  # other tasks may reference its packs
            written = [replace(w, packs=()) for w in written]
        cleanup_after(
            exc,
            *([writer.abort] if writer is not None else []),
            *([store.abort] if store is not None else []),
            lambda: remove_written(written, location, storage_options),
        )
        raise
    return written


def store_writer_for_plan(
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
    write_id = name_prefix.removesuffix("-")
    claims = Claims(location.root, write_id, storage_options) if plan.claim_payloads else None
    return StoreWriter(
        location.root,
        plan.store_base_id,
        name_prefix,
        limit,
        storage_options,
        plan.load_store_index,
        plan.avoid_packs,
        claims,
    )


def store_reference(
    plan: WritePlan, location: TableLocation, storage_options: StorageOptions | None = None
) -> StoreReference | None:
    """How the placers of a write recognize references into the table's own store."""
    if plan.store_base_id is None:
        return None
    return StoreReference(location.root, plan.store_base_id, storage_options, plan.store_digests)


class _Pending(NamedTuple):
    """A small payload whose placement waits until its window is flushed (a tuple: one is
    made for most small rows)."""

    row: int
    key: Hashable | None
    digest: bytes


# the value of a row in :attr:`_Decided.fresh` until its window is resolved
_FRESH = _Pending(-1, None, b"")


@dataclass(frozen=True)
class _Decided:
    """One blob column of one batch: placed values, and small payloads still pending.

    Small payloads first seen in the batch (most rows of many small ones) wait in bulk: their
    rows and digests (:attr:`fresh`), not a :class:`_Pending` each.
    """

    column: LogicalColumn
    values: list[PreparedBlob | _Pending | None]
    fresh: tuple[list[int], list[bytes]]


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
        self._run_bytes = HASH_RUN_BYTES  # see _adapt_runs
        # a payload up to this size may be inlined: above it, it is stored (packed, dedicated)
        self._inline_limit = min(
            plan.placement.inline_size_threshold, plan.placement.dedicated_size_threshold
        )
        self._pack: PackedSidecar | None = None
        self._object_sizes: dict[str, int] = {}
        # store payloads whose blake3 this data file recorded (see _record_store)
        self._store_recorded: set[tuple[str, int, int]] = set()

    def decide(self, batch: pa.RecordBatch, first_row: int) -> _Decided:
        """Place every row that can be placed now; small payloads wait (:class:`_Decided`)."""
        ref_ids = None
        if self.plan.ref_id_column:  # a nested one (``meta.ref``) too
            ref_ids = get_column(batch, resolve_column(batch.schema, self.plan.ref_id_column))
        column = LogicalColumn(
            get_column(batch, self.plan.path), self.name, ref_ids, first_row=first_row
        )
        # every stored payload is hashed (dedup key and checksum), a run of rows per call spread
        # over the cores; each run is placed before the next is hashed, so its sidecar writes
        # overlap that hashing. A global store is asked once, for the whole batch.
        decided = _Decided(column, [], ([], []))
        hasher = BatchHasher()  # a payload repeated in the batch is compared, not hashed again
        rows = column.data_rows()
        ends = np.cumsum(column.sizes(rows))  # bytes up to and with each row of ``rows``
        end = 0
        while end < len(rows):
            start = end
            end, run = _run(ends, start, None if self.plan.dedup == "global" else self._run_bytes)
            until = column.length if end == len(rows) else rows[end]
            self._place_run(decided, hasher, rows[start:end], run, until, first_row)
        decided.values.extend(  # rows without bytes after the last one with bytes
            self._decide_row(column, row, first_row + row, None)
            for row in range(len(decided.values), column.length)
        )
        return decided

    def _place_run(
        self,
        decided: _Decided,
        hasher: BatchHasher,
        rows: list[int],
        run: int,
        until: int,
        first_row: int,
    ) -> None:
        """Hash the payloads of ``rows`` (``run`` bytes) and decide every row of ``decided`` up
        to ``until`` (``first_row``: the batch's first row in the write, for errors)."""
        column, values = decided.column, decided.values
        payloads = column.payloads(rows)
        queued = self.sidecar_bytes
        samples = column.samples(rows, COMPARED_BYTES)
        hashed = hasher.hashes(payloads, samples, self._hash_threads(run))
        digests = dict(zip(rows, hashed, strict=True))
        placed: dict[int, PreparedBlob] = {}
        fresh_rows: list[int] = []
        fresh_digests: list[bytes] = []
        if self.plan.dedup == "global":
            placed = self._place_in_store(rows, payloads, hashed)
        elif self.plan.dedup in ("content", "off"):
            small, big = _split(column.sizes(rows) <= self._inline_limit, rows, hashed)
            placed = self._store_new(column, *big)
            fresh_rows, fresh_digests = self._fresh(*small)
        decided.fresh[0].extend(fresh_rows)
        decided.fresh[1].extend(fresh_digests)
        waiting = set(fresh_rows)
        values.extend(
            _FRESH
            if row in waiting
            else placed.get(row) or self._decide_row(column, row, first_row + row, digests.get(row))
            for row in range(len(values), until)
        )
        self._adapt_runs(run, queued)

    def _adapt_runs(self, run: int, queued: int) -> None:
        """Size the next run after one of ``run`` bytes that had ``queued`` sidecar bytes
        before it: a run of payloads seen before wrote (next to) nothing, so there is no write
        to overlap and longer runs hash faster (each run is one hand-off to the hash pool)."""
        if (self.sidecar_bytes - queued) * 4 < run:
            self._run_bytes = min(2 * self._run_bytes, MAX_HASH_RUN_BYTES)
        else:
            self._run_bytes = HASH_RUN_BYTES

    def _fresh(self, rows: list[int], digests: list[bytes]) -> tuple[list[int], list[bytes]]:
        """Those of ``rows`` (payloads small enough to inline; hashed: ``digests``) seen for
        the first time, once in the run: each waits to be inlined. They are found with set
        operations over the run, not row by row (a data file may hold millions of small rows);
        the other rows are decided one by one (:meth:`_decide_row`)."""
        if not rows:
            return [], []
        if self.plan.dedup == "off":
            return rows, digests
        unique = set(digests)
        known = set(self.index.known(unique))
        if len(unique) < len(digests):
            known |= {d for d, n in Counter(digests).items() if n > 1}
        shorts = _shorts(digests)
        inlined_before = self.inlined_before.intersection(shorts)
        if known or inlined_before:
            kept = [
                i
                for i, (digest, short) in enumerate(zip(digests, shorts, strict=True))
                if digest not in known and short not in inlined_before
            ]
            rows, digests = [rows[i] for i in kept], [digests[i] for i in kept]
        self.index.add(digests)
        return rows, digests

    def _store_new(
        self, column: LogicalColumn, rows: list[int], digests: list[bytes]
    ) -> dict[int, PreparedBlob]:
        """Row -> value of those of ``rows`` (payloads too big to inline; hashed: ``digests``)
        new to the data file (the first row of each; ``dedup="off"``: all), stored in bulk:
        one pack write for all of them, not a :meth:`_decide_row` each."""
        if not rows:
            return {}
        new = dict(zip(rows, digests, strict=True))
        if self.plan.dedup == "content":
            known = self.index.known(set(new.values()))
            firsts: dict[bytes, int] = {}  # digest -> its first row
            for row, digest in new.items():
                if digest not in known:
                    firsts.setdefault(digest, row)
            self.index.add(firsts)
            new = {row: digest for digest, row in firsts.items()}
        values = self._store_many(column.payloads(list(new)), list(new.values()))
        if self.plan.dedup == "content":
            self.stored.update(zip(new.values(), values, strict=True))
        return dict(zip(new, values, strict=True))

    def _hash_threads(self, run: int) -> int | None:
        """Every core hashes a run of ``run`` bytes, unless the writer still has half as many
        to write: then one core is left to it (hashing on all of them would slow it as much)."""
        queue = self.store.queue if self.plan.dedup == "global" else self.session.writes
        if queue.unwritten_bytes * 2 >= run:
            return max(1, CORES - 1)
        return None

    def _place_in_store(
        self, rows: list[int], payloads: list[memoryview], digests: list[bytes]
    ) -> dict[int, PreparedBlob]:
        """Row -> store reference of every non-empty one of ``payloads`` (of ``rows``, whose
        blake3 are ``digests``; ``dedup="global"``): the store's index is asked once for all."""
        if not all(payloads):  # empty payloads are decided row by row (an empty value)
            kept = [i for i, payload in enumerate(payloads) if payload]
            rows, payloads, digests = ([seq[i] for i in kept] for seq in (rows, payloads, digests))
        placed = self.store.place_many(payloads, digests, self.name)
        self._record_store(placed, digests)
        return dict(zip(rows, placed, strict=True))

    def _record_store(self, values: list[PreparedBlob], digests: list[bytes]) -> None:
        """Record in the data file the blake3 of the value its rows referencing each store
        payload were written with, once per payload (not per row): reads and verify check
        those rows against it, never only against what the store's index says."""
        new: dict[tuple[str, int, int], bytes] = {}
        # rows sharing a payload share its value: one look per distinct payload
        for digest, value in dict(zip(digests, values, strict=True)).items():
            key = (value.uri, value.position, value.size)
            if key not in self._store_recorded:
                new.setdefault(key, digest)
        if new:
            self._store_recorded.update(new)
            self.session.checksums.record_store(list(new), list(new.values()))

    def waiting_keys(self, decided: _Decided) -> Iterator[Hashable]:
        """The dedup keys of ``decided``'s rows that wait for their window: counted over the
        window, a key met more than once is packed and shared."""
        yield from (v.key for v in decided.values if isinstance(v, _Pending) and v.key)
        if self.plan.dedup == "content":  # a fresh payload's key is its digest
            yield from decided.fresh[1]

    def resolve(
        self, decided: _Decided, counts: Counter, file_row: int
    ) -> list[PreparedBlob | None]:
        """Final values of one batch (whose first row is ``file_row`` of the data file):
        pending payloads are packed if shared, else inlined."""
        self._resolve_fresh(decided, counts, file_row)
        return [
            self._resolve_pending(decided.column, v, counts, file_row)
            if isinstance(v, _Pending)
            else v
            for v in decided.values
        ]

    def _resolve_fresh(self, decided: _Decided, counts: Counter, file_row: int) -> None:
        """Set the values of ``decided``'s fresh rows: inline, their checksums recorded at
        once, unless a later row of the window shares the payload (then a :class:`_Pending`,
        packed and shared as :meth:`resolve` meets it)."""
        rows, digests = decided.fresh
        if self.plan.dedup == "content":
            stored = self.stored
            alone = [i for i, d in enumerate(digests) if counts[d] == 1 and d not in stored]
            if len(alone) < len(rows):
                for i in set(range(len(rows))).difference(alone):
                    decided.values[rows[i]] = _Pending(rows[i], digests[i], digests[i])
                rows, digests = [rows[i] for i in alone], [digests[i] for i in alone]
            self.index.forget(digests)  # see _resolve_pending
            self.inlined_before.update(_shorts(digests))
        if not rows:
            return
        sizes = decided.column.sizes(rows)
        self.session.checksums.record_inline_many(
            self.name, np.asarray(rows, dtype=np.int64) + file_row, sizes, digests
        )
        for row, size in zip(rows, sizes.tolist(), strict=True):
            decided.values[row] = _inline(size)

    def close(self) -> None:
        if self._pack is not None:
            self._pack.finish(wait=False)
            self._pack = None

    def discard(self) -> None:
        self._pack = None  # the session aborts its file: an upload is never completed first

    def _decide_row(
        self, column: LogicalColumn, row: int, global_row: int, digest: bytes | None
    ) -> PreparedBlob | _Pending | None:
        if not column.valid[row]:
            return None
        ref_id = column.ref_id[row] if column.ref_id is not None else None
        if digest is None:  # no bytes: a uri
            return self._external(column, row, global_row, ref_id)
        payload = column.payload(row)
        key = self.index.key(self.plan.dedup, self.name, ref_id=ref_id, digest=digest)
        if key is not None:
            ref = self.plan.dedup == "ref_id"  # a content key is the digest: nothing to compare
            fingerprint = Fingerprint(len(payload), digest, global_row) if ref else None
            if not self.index.first_seen(key, fingerprint, column=self.name, ref_id=ref_id):
                if key in self.stored:
                    return self.stored[key]
                return _Pending(row, key, digest)
        if (
            self.plan.placement.kind_for(len(payload), shared=False) == Kind.INLINE
            and _short(digest) not in self.inlined_before
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
            self.index.forget([key])
            self.inlined_before.add(_short(pending.digest))
        self.session.checksums.record_inline(
            self.name, file_row + pending.row, len(payload), pending.digest
        )
        return _inline(len(payload))

    def _store(self, payload: memoryview, kind: Kind, digest: bytes) -> PreparedBlob:
        """Write ``payload`` (whose blake3 is ``digest``) to a sidecar of kind ``kind``."""
        if kind == Kind.DEDICATED:
            self.sidecar_bytes += len(payload)
            sidecar = self.session.new_dedicated(digest)
            sidecar.write(payload)
            return sidecar.finish(wait=False)  # the session drains before the file is done
        return self._pack_many([payload], [digest])[0]

    def _store_many(self, payloads: list[memoryview], digests: list[bytes]) -> list[PreparedBlob]:
        """Write each of ``payloads`` (too big to inline; blake3: ``digests``) to the sidecar
        its size calls for: consecutive packed ones in one :meth:`_pack_many`."""
        dedicated = self.plan.placement.dedicated_size_threshold
        values: list[PreparedBlob] = []
        start = 0
        while start < len(payloads):
            if len(payloads[start]) > dedicated:
                values.append(self._store(payloads[start], Kind.DEDICATED, digests[start]))
                start += 1
                continue
            end = start + 1
            while end < len(payloads) and len(payloads[end]) <= dedicated:
                end += 1
            values += self._pack_many(payloads[start:end], digests[start:end])
            start = end
        return values

    def _pack_many(self, payloads: list[memoryview], digests: list[bytes]) -> list[PreparedBlob]:
        """Append ``payloads`` (blake3: ``digests``) to packed sidecars, in order, starting a
        new one whenever the next payload would take the current one past the size limit."""
        limit = self.plan.placement.pack_file_size_threshold
        ends = np.cumsum([len(p) for p in payloads])
        self.sidecar_bytes += int(ends[-1])
        values: list[PreparedBlob] = []
        start = 0
        while start < len(payloads):
            self._pack = self._pack or self.session.new_packed()
            before = int(ends[start - 1]) if start else 0
            fits = int(np.searchsorted(ends, before + limit - self._pack.size, side="right"))
            if fits <= start and self._pack.size:  # the next payload does not fit: a new pack
                self._pack.finish(wait=False)
                self._pack = None
                continue
            end = max(fits, start + 1)  # an empty pack takes even a payload over the limit
            values += self._pack.write_blobs(payloads[start:end], digests[start:end])
            start = end
        return values

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
        if in_store is not None:  # the table's own store: compaction keeps such references
            digest = self.own_store.recorded(in_store)
            if digest is not None:  # and the hash its rows recorded, so reads stay checked
                self._record_store([in_store], [digest])
            return in_store
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
            problem = marker_problem(uri)  # checked now: the marker is made at the commit
            if problem is not None:
                raise ExternalBlobError(
                    f"blob column {name!r}, row {global_row}: managed object {uri}: {problem}"
                )
            self.handed.add(uri)
        if self.plan.dedup == "ref_id" and ref_id:
            key = self.index.key("ref_id", name, ref_id=ref_id, digest=None)
            fingerprint = Fingerprint(size, None, global_row, external=(uri, position, size))
            self.index.first_seen(key, fingerprint, column=name, ref_id=ref_id)
        return PreparedBlob(Kind.EXTERNAL, size=size, position=position, uri=uri)


# a batch is hashed and placed in runs of about this many bytes (see decide): with 1 MB
# payloads, 4 MB runs wrote slower, and with 16-64 MB the sidecar writer waits on each batch's
# first run. Runs that write (next to) nothing grow up to MAX_HASH_RUN_BYTES (_adapt_runs):
# 20x duplicated 1 MB payloads hash at 6.1 GB/s in 8 MB runs, 7.4 GB/s in 64 MB ones
HASH_RUN_BYTES = 8 << 20
MAX_HASH_RUN_BYTES = 64 << 20


# payloads of this many bytes or more are compared with the batch's earlier ones before they
# are hashed (BatchHasher): a compare costs ~40 us a MB, blake3 ~160 us a MB on one core, and
# below this size the sample and the lookup cost more than they save
COMPARED_BYTES = 64 << 10


def _split(
    mask: np.ndarray, rows: list[int], digests: list[bytes]
) -> tuple[tuple[list[int], list[bytes]], tuple[list[int], list[bytes]]]:
    """``(rows, digests)`` where ``mask`` holds, then where it does not.

    >>> _split(np.array([True, False, True]), [4, 5, 6], [b"a", b"b", b"c"])
    (([4, 6], [b'a', b'c']), ([5], [b'b']))
    """
    held = np.flatnonzero(mask).tolist()
    if len(held) == len(rows):
        return (rows, digests), ([], [])
    if not held:
        return ([], []), (rows, digests)
    other = np.flatnonzero(~mask).tolist()
    return (
        ([rows[i] for i in held], [digests[i] for i in held]),
        ([rows[i] for i in other], [digests[i] for i in other]),
    )


def _run(ends: np.ndarray, start: int, run_bytes: int | None) -> tuple[int, int]:
    """Where the run of payloads from ``start`` ends (once it holds ``run_bytes`` bytes, or at
    the last payload), and its bytes (``ends``: the payloads' cumulative sizes; ``run_bytes``
    None: all).

    >>> ends = np.cumsum([3, 3, 0, 3])
    >>> _run(ends, 0, 5), _run(ends, 2, 1), _run(ends, 0, None)
    ((2, 6), (4, 3), (4, 9))
    """
    before = int(ends[start - 1]) if start else 0
    end = len(ends)
    if run_bytes is not None:
        end = min(end, int(np.searchsorted(ends, before + run_bytes, side="left")) + 1)
    return end, int(ends[end - 1]) - before


@functools.lru_cache(maxsize=4096)
def _inline(size: int) -> PreparedBlob:
    """The value of an inline payload of ``size`` bytes (shared: most small rows get one)."""
    return PreparedBlob(Kind.INLINE, size=size)


def _short(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little")


def _shorts(digests: list[bytes]) -> list[int]:
    """:func:`_short` of each digest, in one pass."""
    if not digests:
        return []
    return np.frombuffer(b"".join(digests), dtype="<u8")[::4].tolist()


def _conform(batch: pa.RecordBatch, plan: WritePlan, first_row: int) -> pa.RecordBatch:
    """``batch`` shaped as the plan's input (table order, lacking columns null), its values
    checked against the table's non-nullable columns (``first_row``: its first row's index
    in the write, for errors)."""
    schema = plan.input_schema
    if batch.schema.names != schema.names:
        batch = _aligned(batch, schema, plan.filled)
    if batch.schema != schema:
        try:
            batch = batch.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"batch schema differs from the first batch's: {exc}") from None
    _check_not_null(batch, plan.table_schema, first_row)
    return batch


def _aligned(batch: pa.RecordBatch, schema: pa.Schema, filled: tuple[str, ...]) -> pa.RecordBatch:
    """``batch``'s columns in ``schema``'s order, with the ``filled`` columns all null."""
    given = [n for n in schema.names if n not in filled]
    if sorted(batch.schema.names) != sorted(given):
        raise SchemaError(
            f"batch columns {batch.schema.names} differ from the first batch's {given}"
        )
    arrays = [
        pa.nulls(batch.num_rows, schema.field(n).type) if n in filled else batch.column(n)
        for n in schema.names
    ]
    return pa.RecordBatch.from_arrays(arrays, names=schema.names)


def _check_not_null(batch: pa.RecordBatch, table_schema: pa.Schema, first_row: int) -> None:
    """Refuse nulls in the table's non-nullable columns (Lance would store them as they are)."""
    for column in table_schema:
        if column.nullable or column.name not in batch.schema.names:
            continue
        values = batch.column(column.name)
        if values.null_count:
            row = first_row + values.is_null().to_numpy(zero_copy_only=False).argmax()
            raise SchemaError(
                f"column {column.name!r} is not nullable in the table, but row {row} is null"
            )


def _check_ref_id_columns(
    schema: pa.Schema, ref_id_columns: dict[str, str], names: list[str]
) -> None:
    for blob, ref in ref_id_columns.items():
        check_blob_column(blob, names, "ref_id_columns", SchemaError)
        try:
            path = resolve_column(schema, ref, "ref_id column", SchemaError)
        except SchemaError as exc:
            raise SchemaError(f"blob column {blob!r}: {exc}") from None
        ref_type = get_field(schema, path).type
        if not pa.types.is_integer(ref_type):
            raise SchemaError(f"ref_id column {ref!r} must be an integer column, got {ref_type}")


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
