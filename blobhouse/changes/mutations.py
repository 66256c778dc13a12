"""Changes to rows that keep blob sharing: :func:`update` and :class:`MergeInsert` (upsert).

Lance's own ``update`` and ``merge_insert`` rewrite every column of a changed row, so a row's
blob payloads are copied once per row and sharing is lost until a compaction. Here:

- an **update** rewrites only the changed columns, and only in the fragments holding a
  matching row: each such fragment gets one new data file with those columns for all its rows,
  and the old file's copy of them is retired (Lance's ``rewrite_columns`` update, which every
  Lance reader understands). Blob payloads of unchanged columns are not touched. A blob column
  set to new values goes through the write pipeline with its dedup mode.
- a **merge_insert** deletes the matched rows it replaces (deletion vectors) and appends the
  source's rows through the write pipeline: with ``dedup="global"`` a payload the table already
  stores anywhere is referenced, not written again. ``when_matched_update(columns)`` rewrites
  just those columns, like an update.

Both run on one :class:`~blobhouse.commit.transaction.Transaction` each: one Lance commit, nothing
visible on failure, staged files removed, a commit a concurrent one preempted planned again.
Two merges inserting the same new key at once leave it once: the later one is planned again,
where its row is an update (see :meth:`~blobhouse.commit.transaction.Transaction.commit`).
The per-fragment steps (:func:`rewrite_fragment`) are what Spark runs as tasks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset, LanceOperation
from lance.fragment import DataFile
from pyroaring import BitMap

from blobhouse.changes.backfill import BlobFunction, check_fragment_rows
from blobhouse.columns import column_paths, resolve_column, unknown_column
from blobhouse.commit.change import (
    BaseChange,
    Committed,
    Planned,
    Staged,
    commit_once,
    run_change,
)
from blobhouse.commit.transaction import (
    DEFAULT_RETRIES,
    SHOWN_KEYS,
    Inserts,
    StagedDeletion,
    Transaction,
    stage_deletion,
)
from blobhouse.errors import InvalidInputError, SchemaError, lance_message
from blobhouse.options import WriteOptions, closest
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties
from blobhouse.references import leaf_field_ids
from blobhouse.session import WrittenFile
from blobhouse.snapshot import ROW_ADDRESS
from blobhouse.store.packs import store_base_id
from blobhouse.values import (
    ColumnPath,
    blob_array,
    is_lance_blob_field,
    path_name,
    stored_blob_columns,
)
from blobhouse.write.carry import INPUT_BLOB_TYPE, carried_schema, logical_values
from blobhouse.write.inputs import input_stream
from blobhouse.write.pipeline import (
    DataFileWriter,
    WritePlan,
    plan_write,
    store_writer_for_plan,
    write_data_files,
)
from blobhouse.write.prepare import allowed_bases_of, prepared_for_write, with_store

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

_MATCH = "__bh_match"
_TOMBSTONE = -2  # Lance's field id for a column a data file no longer provides
_SOURCE_ROW = "__bh_source_row"


# ---------------------------------------------------------------------------------------------
# update: rewrite the changed columns of the fragments that hold a matching row


@dataclass(frozen=True)
class UpdateReport:
    """What an update did."""

    read_version: int
    version: int
    rows_updated: int
    fragments_rewritten: int
    columns: tuple[str, ...]
    bytes_written: int
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ColumnRewrite:
    """The plan of a column rewrite: which columns get new files, and how each row's new
    value is found. ``expressions`` (SQL over the row) and ``functions`` (a blob column's new
    values, from the matching rows' plain columns) give values for rows matching ``where``;
    ``source`` (merge_insert) gives them for the rows it names instead."""

    columns: tuple[str, ...]
    field_ids: tuple[int, ...]
    expressions: Mapping[str, str]
    functions: Mapping[str, BlobFunction | None]
    where: str | None
    plan: WritePlan
    transaction: Transaction
    source: Mapping[int, tuple[np.ndarray, pa.Table]] = field(default_factory=dict)

    @property
    def blob_columns(self) -> list[str]:
        return [c.name for c in self.plan.columns]

    @property
    def file_columns(self) -> list[str]:
        """The top-level columns the new files hold: those of ``columns``, or holding one."""
        return self.plan.input_schema.names


Rewrite = Callable[["TableSnapshot", "ColumnRewrite"], dict[int, tuple[WrittenFile, BitMap]]]


def update(
    table: TableSnapshot,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None = None,
    *,
    dedup: str | None = None,
    retries: int = DEFAULT_RETRIES,
    rewrite: Rewrite | None = None,
) -> Committed[UpdateReport]:
    """Set ``updates`` (column -> SQL expression; for a blob column a function of the matching
    rows' plain columns, or None for null) on the rows matching ``where`` (every row if None),
    in one commit: the report and the committed snapshot. See :meth:`blobhouse.Table.update`.
    ``rewrite`` writes the new file of every fragment holding a matching row, with the offsets
    of the rows that changed in each (default: one fragment after another in this process;
    Spark runs them as tasks)."""
    change = _Update(updates, where, dedup, rewrite or _rewrite_here, rewrite is not None)
    return run_change(change, table, retries=retries)


@dataclass(frozen=True)
class _Update(BaseChange):
    """An update as a :class:`~blobhouse.commit.change.Change`."""

    updates: Mapping[str, str | BlobFunction | None]
    where: str | None
    dedup: str | None
    rewrite: Rewrite
    in_tasks: bool

    def plan(self, snapshot: TableSnapshot) -> Planned[ColumnRewrite]:
        modes = blob_modes(snapshot, self.updates, self.dedup)
        table = prepared_for_write(snapshot, "global" if "global" in modes.values() else "content")
        return Planned(table, plan_update(table, self.updates, self.where, modes))

    def stage(self, plan: Planned[ColumnRewrite], staged: Staged) -> None:
        done = self.rewrite(plan.table, plan.plan)
        staged.written.extend(written for written, _ in done.values())
        staged.detail = done

    def commit(self, plan: Planned[ColumnRewrite], staged: Staged) -> LanceDataset:
        done = staged.detail
        if not done:
            return plan.table.dataset
        files = {i: written for i, (written, _) in done.items()}
        matched = {i: rows for i, (_, rows) in done.items()}
        return commit_rewrite(plan.table, plan.plan, files, matched=matched)

    def report(
        self, plan: Planned[ColumnRewrite], staged: Staged, committed: TableSnapshot, attempt: int
    ) -> UpdateReport:
        done = staged.detail
        return UpdateReport(
            read_version=plan.table.version,
            version=committed.version,
            rows_updated=sum(len(rows) for _, rows in done.values()),
            fragments_rewritten=len(done),
            columns=plan.plan.columns,
            bytes_written=sum(w.size_bytes + w.sidecar_bytes for w in staged.written),
            attempts=attempt,
        )


def delete(table: TableSnapshot, filter: str) -> TableSnapshot:
    """Delete the rows matching the SQL ``filter`` in one commit (Lance's delete, through a
    transaction); the committed snapshot.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import write_table
    >>> t = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t")
    >>> delete(t.snapshot, "id = 1").count_rows()
    1
    """
    return commit_once(table, "delete", lambda dataset: dataset.delete(filter))


def blob_modes(
    table: TableSnapshot, columns: Iterable[str], given: str | None = None
) -> dict[str, str]:
    """The dedup mode each blob column among ``columns`` is written with: the table's
    property (``given``, if any, must be the same; see
    :meth:`~blobhouse.properties.TableProperties.change_mode`)."""
    properties = TableProperties.of(table.dataset)
    blobs = [c for c in columns if c in set(table.blob_columns)]
    if given is not None and not blobs:
        raise InvalidInputError(
            f"dedup={given!r} applies to blob columns; this change sets none of them"
        )
    return {c: properties.change_mode(c, given) for c in blobs}


def _rewrite_here(
    table: TableSnapshot, plan: ColumnRewrite
) -> dict[int, tuple[WrittenFile, BitMap]]:
    return {
        i: rewrite_fragment(table, plan, i) for i in touched_fragments(table.dataset, plan.where)
    }


def plan_update(
    table: TableSnapshot,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None,
    dedup: Mapping[str, str] | None = None,
    *,
    kind: str = "update",
) -> ColumnRewrite:
    """Check ``updates`` and ``where`` against the table and plan the rewrite."""
    if not isinstance(updates, Mapping) or not updates:
        raise InvalidInputError(
            "updates must be a non-empty mapping of column -> SQL expression, e.g. "
            "{'label': \"'cat'\"}"
        )
    schema = table.schema
    blob_paths = stored_blob_columns(schema)
    expressions: dict[str, str] = {}
    functions: dict[str, BlobFunction | None] = {}
    paths = {column: resolve_column(schema, column) for column in updates}
    _check_disjoint(paths)
    for column, value in updates.items():
        path = paths[column]
        held = [path_name(b) for b in blob_paths if len(b) > len(path) and b[: len(path)] == path]
        if held:
            # a struct holding blobs is rewritten field by field: its blobs by a function
            raise InvalidInputError(
                f"column {column!r} holds blob column(s) {held}: update its fields by name "
                f"(e.g. {held[0]!r})"
            )
        if path in blob_paths:
            functions[column] = _blob_update(column, value)
        elif isinstance(value, str):
            expressions[column] = value
        else:
            raise InvalidInputError(
                f"update of column {column!r}: give a SQL expression as a string (e.g. "
                f"'{column} + 1' or \"'text'\"), got {type(value).__name__}"
            )
    _check_sql(table.dataset, where, expressions)
    return _column_rewrite(table, tuple(updates), expressions, functions, where, dedup, kind)


def _column_rewrite(
    table: TableSnapshot,
    columns: tuple[str, ...],
    expressions: Mapping[str, str],
    functions: Mapping[str, BlobFunction | None],
    where: str | None,
    dedup: Mapping[str, str] | None,
    kind: str,
) -> ColumnRewrite:
    schema = table.schema
    order = column_paths(schema)
    columns = tuple(n for n in order if n in set(columns))
    # the new files hold whole top-level columns, in the table's order: a nested column is
    # rewritten with its top-level struct, whose other fields keep their values (Lance 14
    # cannot read a struct child alone once the struct's fields are split over data files)
    tops = [n for n in schema.names if any(order[c][0] == n for c in columns)]
    ids = tuple(leaf_field_ids([table.dataset.lance_schema.field(n) for n in tops]))
    blob_paths = [p for p in stored_blob_columns(schema) if p[0] in tops]
    blobs = [path_name(p) for p in blob_paths]
    properties = TableProperties.of(table.dataset)
    modes = {c: (dedup or {}).get(c) or properties.dedup_of(c) for c in blobs}
    input_schema = carried_schema(schema, blob_paths)
    plan = plan_write(
        pa.schema([input_schema.field(n) for n in tops]),
        blob_columns=blobs,
        dedup=modes,
        table_schema=pa.schema([schema.field(n) for n in tops]),
        allowed_bases=AllowedBases.of_table(schema, table.uri),
        max_rows_per_file=2**62,
        max_bytes_per_file=2**62,
    )
    # references into the table's own store stay references; each fragment is rewritten by a
    # store writer of its own (a Spark task, or one after another): they claim new payloads,
    # so that a value several fragments get is stored once (blobhouse.store.claims)
    plan = replace(plan, store_base_id=store_base_id(table.dataset), claim_payloads=True)
    txn = Transaction.start(table.location, table.version, table.storage_options, kind=kind)
    return ColumnRewrite(columns, ids, dict(expressions), dict(functions), where, plan, txn)


def _check_disjoint(paths: Mapping[str, ColumnPath]) -> None:
    """Refuse a change that names a struct and one of its fields (which value would win?)."""
    for column, path in paths.items():
        for other, inner in paths.items():
            if len(inner) > len(path) and inner[: len(path)] == path:
                raise InvalidInputError(
                    f"the update names both {column!r} and its field {other!r}; name one"
                )


def touched_fragments(dataset: LanceDataset, where: str | None) -> list[int]:
    """The fragments holding at least one live row that matches ``where``."""
    return [f.fragment_id for f in dataset.get_fragments() if has_match(f, where)]


def has_match(fragment, where: str | None) -> bool:
    """Whether a live row of ``fragment`` matches ``where`` (None: any live row)."""
    return (fragment.count_rows(where) if where else fragment.count_rows()) > 0


def rewrite_fragment(
    table: TableSnapshot, rewrite: ColumnRewrite, fragment_id: int
) -> tuple[WrittenFile, BitMap]:
    """Write one fragment's new data file of ``rewrite.columns``: the new value for every
    matching live row, the old one for every other row (null for deleted rows). Returns the
    file and the physical offsets of the rows that got new values (the commit hands them to
    Lance, which stamps those rows as updated). Runs in a Spark task as well."""
    dataset = table.dataset
    fragment = dataset.get_fragment(fragment_id)
    prefix = rewrite.transaction.name_prefix
    store = store_writer_for_plan(rewrite.plan, table.location, table.storage_options, prefix)
    writer = DataFileWriter(
        rewrite.plan,
        table.location,
        table.storage_options,
        prefix,
        store,
    )
    rows = 0
    matched = BitMap()
    try:
        for batch in _fragment_rows(dataset, fragment, rewrite):
            out, hits = _new_values(table, rewrite, fragment_id, batch, rows)
            writer.write(out, first_row=rows)
            _add_offsets(matched, hits)
            rows += batch.num_rows
        written = writer.finish()
        if store is not None:
            store.finish()  # its packs complete (an object store's uploads too)
    except BaseException:
        writer.abort()
        if store is not None:
            store.abort()
        raise
    check_fragment_rows(written, fragment)
    return written, matched


def _add_offsets(bitmap: BitMap, offsets: np.ndarray) -> None:
    """Add ascending ``offsets`` to ``bitmap`` (a run at once: an update of every row costs
    nothing per row)."""
    if not len(offsets):
        return
    first, last = int(offsets[0]), int(offsets[-1])
    if last - first + 1 == len(offsets):
        bitmap.add_range(first, last + 1)
    else:
        bitmap.update(offsets.tolist())


def _fragment_rows(
    dataset: LanceDataset, fragment, rewrite: ColumnRewrite
) -> Iterator[pa.RecordBatch]:
    """Every physical row of ``fragment``: the old values of the rewritten columns, their new
    values (``__bh_new_<column>``), whether the row matches, and the plain columns a blob
    function reads."""
    projection = {c: _quoted(c) for c in rewrite.file_columns}
    for column, expression in rewrite.expressions.items():
        projection[f"__bh_new_{column}"] = expression
    if rewrite.functions and not rewrite.source:
        schema = dataset.schema
        blob_names = {p[0] for p in stored_blob_columns(schema)}
        for name in schema.names:
            if name not in blob_names and name not in projection:
                projection[name] = _quoted(name)
    projection[_MATCH] = "true" if rewrite.where is None or rewrite.source else f"({rewrite.where})"
    return dataset.scanner(
        fragments=[fragment],
        columns=projection,
        include_deleted_rows=True,
        with_row_id=True,
        scan_in_order=True,
    ).to_batches()


def _new_values(
    table: TableSnapshot,
    rewrite: ColumnRewrite,
    fragment_id: int,
    batch: pa.RecordBatch,
    first_row: int,
) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rewritten columns of ``batch``'s rows, and the fragment offsets of those that
    changed."""
    live = batch.column("_rowid").is_valid()
    offsets = np.arange(first_row, first_row + batch.num_rows, dtype=np.uint64)
    if rewrite.source:
        match, source_rows = _source_match(rewrite.source.get(fragment_id), offsets)
        source = rewrite.source[fragment_id][1] if fragment_id in rewrite.source else None
    else:
        match = pc.and_(live, pc.fill_null(batch.column(_MATCH), False))
        source_rows, source = None, None
    addresses = pa.array((np.uint64(fragment_id) << np.uint64(32)) | offsets)
    wanted = set(rewrite.columns)

    def value(field: pa.Field, path: ColumnPath, old: pa.Array) -> pa.Array:
        """The new values of the column at ``path`` (``old``: its current ones)."""
        column = path_name(path)
        if column in rewrite.blob_columns:
            old = _old_blobs(table, path, old, addresses, live)
        elif column not in wanted and pa.types.is_struct(field.type):
            # a struct holding a rewritten column: its other fields keep their values
            children = old.flatten()
            rebuilt = [
                value(c, (*path, c.name), a) for c, a in zip(field.type, children, strict=True)
            ]
            mask = old.is_null() if old.null_count else None
            return pa.StructArray.from_arrays(rebuilt, fields=list(field.type), mask=mask)
        if column not in wanted:
            return old
        if source is not None:
            new = _from_source(source, source_rows, column, old.type)
        elif column in rewrite.expressions:
            new = _cast(batch.column(f"__bh_new_{column}"), old.type, column)
        else:
            new = _blob_function_values(rewrite, column, batch, match, old.type)
        return pc.if_else(match, new, old)

    schema = rewrite.plan.input_schema
    arrays = [value(f, (f.name,), batch.column(f.name)) for f in schema]
    out = pa.RecordBatch.from_arrays(arrays, schema=schema)
    hits = offsets[np.flatnonzero(match.to_numpy(zero_copy_only=False))]
    return out, hits.astype(np.uint32)


def _old_blobs(
    table: TableSnapshot,
    path: ColumnPath,
    descriptors: pa.Array,
    addresses: pa.Array,
    live: pa.Array,
) -> pa.StructArray:
    """Blob column ``path``'s current values (its ``descriptors``) as logical values (bytes
    the table stores, checked against their recorded hashes; references kept for external and
    store blobs); null for deleted rows."""
    values = pc.if_else(live, descriptors, pa.scalar(None, descriptors.type))
    for name in reversed(path[1:]):  # inside its parents, where logical_values looks for it
        values = pa.StructArray.from_arrays([values], names=[name])
    piece = pa.RecordBatch.from_arrays([values, addresses], names=[path[0], ROW_ADDRESS])
    return logical_values(table, path, piece, table.recorded_hashes(), frozenset())


def _blob_function_values(
    rewrite: ColumnRewrite,
    column: str,
    batch: pa.RecordBatch,
    match: pa.Array,
    out_type: pa.DataType,
) -> pa.Array:
    """A blob function's values for the matching rows, spread over the batch's rows."""
    fn = rewrite.functions[column]
    positions = np.flatnonzero(match.to_numpy(zero_copy_only=False))
    if fn is None or not len(positions):
        return pa.nulls(batch.num_rows, out_type)
    plain = [n for n in batch.schema.names if not n.startswith("__bh_") and n not in ("_rowid",)]
    plain = [n for n in plain if n not in rewrite.blob_columns]
    inputs = batch.select(plain).take(pa.array(positions))
    values = fn(inputs)
    if not isinstance(values, pa.Array | pa.ChunkedArray):
        values = blob_array(list(values))
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if len(values) != len(positions):
        raise InvalidInputError(
            f"update of blob column {column!r}: the function returned {len(values)} values "
            f"for {len(positions)} matching rows"
        )
    values = _logical(values, column)
    spread = np.full(batch.num_rows, -1, dtype=np.int64)
    spread[positions] = np.arange(len(positions))
    return values.take(pa.array(spread, mask=spread < 0))


def _logical(values: pa.Array, column: str) -> pa.StructArray:
    """Blob values (binary, or logical blob structs) as the rewrite's input type."""
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        values = blob_array(values.to_pylist())
    if not pa.types.is_struct(values.type):
        raise InvalidInputError(
            f"blob column {column!r}: new values must be bytes or blobs, got {values.type}"
        )
    arrays = [
        values.field(f.name).cast(f.type)
        if values.type.get_field_index(f.name) >= 0
        else pa.nulls(len(values), f.type)
        for f in INPUT_BLOB_TYPE
    ]
    return pa.StructArray.from_arrays(arrays, fields=list(INPUT_BLOB_TYPE), mask=values.is_null())


def _cast(values: pa.Array, to: pa.DataType, column: str) -> pa.Array:
    if values.type == to:
        return values
    try:
        return values.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidInputError(
            f"update of column {column!r}: its new values ({values.type}) do not fit the "
            f"column's type {to}: {exc}"
        ) from None


def commit_rewrite(
    table: TableSnapshot,
    rewrite: ColumnRewrite,
    files: Mapping[int, WrittenFile],
    *,
    deletions: Mapping[int, Any] | None = None,
    new_files: Sequence[WrittenFile] = (),
    matched: Mapping[int, BitMap] | None = None,
    inserts: Inserts | None = None,
) -> LanceDataset:
    """One Lance ``Update`` commit: each fragment of ``files`` reads ``rewrite.columns`` from
    its new file (the old files' copies retired), ``deletions`` (fragment id -> metadata with
    a new deletion file, or None when no row is left) apply, and ``new_files`` become new
    fragments. ``matched`` (fragment id -> offsets of the rows that got new values; by default
    the rows ``rewrite.source`` names) lets Lance stamp those rows, and only those, as updated
    in this version on a table with stable row ids (elsewhere Lance has no use for them).
    ``inserts``: the keys a merge inserts (see :meth:`Transaction.commit`)."""
    dataset = table.dataset
    deletions = dict(deletions or {})
    removed = sorted(i for i, metadata in deletions.items() if metadata is None)
    updated = []
    ids = set(rewrite.field_ids)
    for fragment in dataset.get_fragments():
        fid = fragment.fragment_id
        if fid in removed or (fid not in files and fid not in deletions):
            continue
        metadata = deletions.get(fid) or fragment.metadata
        if fid in files:
            kept = [_without(d, ids) for d in metadata.files]
            metadata.files = [d for d in kept if d is not None] + [
                files[fid].data_file(list(rewrite.field_ids))
            ]
        updated.append(metadata)
    schema_ids = leaf_field_ids(dataset.lance_schema.fields())
    operation = LanceOperation.Update(
        removed_fragment_ids=removed,
        updated_fragments=updated,
        new_fragments=[w.fragment(schema_ids) for w in new_files],
        fields_modified=list(rewrite.field_ids) if files else [],
        update_mode="rewrite_columns" if files else "rewrite_rows",
        updated_fragment_offsets=(
            _offsets(rewrite, files, matched, {m.id for m in updated})
            if dataset.has_stable_row_ids
            else None  # they would only bloat the transaction file and the manifest's copy
        ),
    )
    return rewrite.transaction.commit(
        [*files.values(), *new_files], lambda: operation, inserts=inserts
    )


def _offsets(
    rewrite: ColumnRewrite,
    files: Mapping[int, WrittenFile],
    matched: Mapping[int, BitMap] | None,
    updated: set[int],
) -> dict[int, bytes] | None:
    """Lance's ``updated_fragment_offsets``: per rewritten fragment, the physical offsets of the
    rows that changed, as portable roaring bitmaps. Without them Lance keeps every row's
    last-updated version as it was (it cannot tell the changed rows from the copied ones)."""
    if matched is None:
        matched = {i: BitMap(offsets.tolist()) for i, (offsets, _) in rewrite.source.items()}
    out = {i: matched[i].serialize() for i in files if i in updated and matched.get(i)}
    return out or None


def _without(data_file: DataFile, ids: set[int]) -> DataFile | None:
    """``data_file`` no longer providing the fields ``ids`` (None if it provides nothing)."""
    fields = [_TOMBSTONE if f in ids else f for f in data_file.fields]
    if all(f == _TOMBSTONE for f in fields):
        return None
    columns = data_file.column_indices or list(range(len(data_file.fields)))
    return DataFile(
        data_file.path,
        fields,
        list(columns),
        data_file.file_major_version,
        data_file.file_minor_version,
        data_file.file_size_bytes,
        data_file.base_id,
    )


# ---------------------------------------------------------------------------------------------
# merge_insert: match the source's rows to the table's by key, in one commit


@dataclass(frozen=True)
class MergeReport:
    """What a merge_insert did (Lance's names)."""

    read_version: int
    version: int
    num_inserted_rows: int
    num_updated_rows: int
    num_deleted_rows: int
    bytes_written: int
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MergeInsert:
    """An upsert builder shaped like Lance's: say what happens to matched rows, to source rows
    with no match and to table rows the source lacks, then :meth:`execute` once.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> new = pa.table({"id": [2, 3], "img": blob_array([b"B", b"c"])})
    >>> report = (t.merge_insert("id").when_matched_update_all()
    ...           .when_not_matched_insert_all().execute(new))
    >>> report.num_updated_rows, report.num_inserted_rows
    (1, 1)
    >>> sorted(t.to_arrow(blobs="bytes").to_pylist(), key=lambda r: r["id"])
    [{'id': 1, 'img': b'a'}, {'id': 2, 'img': b'B'}, {'id': 3, 'img': b'c'}]
    """

    def __init__(
        self,
        table: TableSnapshot,
        on: str | Sequence[str],
        options: WriteOptions,
        on_commit: Callable[[TableSnapshot], object] | None = None,
    ) -> None:
        self.table = table
        self._on_commit = on_commit  # the Table that built it moves to the committed version
        self.on = [on] if isinstance(on, str) else list(on)
        self.options = options
        self._update_all = False
        self._update_columns: list[str] | None = None
        self._insert = False
        self._delete: str | bool = False
        self._retries = DEFAULT_RETRIES
        if not self.on:
            raise InvalidInputError("merge_insert needs at least one key column (on=...)")
        for key in self.on:
            _check_column(key, table.schema, "key column")
            if is_lance_blob_field(table.schema.field(key)):
                raise InvalidInputError(f"key column {key!r} is a blob column; keys are plain")

    def when_matched_update_all(self) -> MergeInsert:
        """A table row whose key the source has gets all of the source row's values."""
        self._update_all, self._update_columns = True, None
        return self

    def when_matched_update(self, columns: Sequence[str]) -> MergeInsert:
        """A table row whose key the source has gets the source's values of ``columns`` only
        (the other columns, their blobs included, are not rewritten)."""
        columns = [columns] if isinstance(columns, str) else list(columns)
        for column in columns:
            _check_column(column, self.table.schema)
            if column in self.on:
                raise InvalidInputError(f"{column!r} is a key column; it cannot be updated")
        if not columns:
            raise InvalidInputError("when_matched_update needs at least one column")
        self._update_all, self._update_columns = False, columns
        return self

    def when_not_matched_insert_all(self) -> MergeInsert:
        """A source row whose key the table lacks is inserted."""
        self._insert = True
        return self

    def when_not_matched_by_source_delete(self, expr: str | None = None) -> MergeInsert:
        """A table row whose key the source lacks (and that matches ``expr``, if given) is
        deleted."""
        self._delete = expr if expr is not None else True
        return self

    def conflict_retries(self, retries: int) -> MergeInsert:
        """How often to plan again after a concurrent commit preempted this one (3)."""
        self._retries = retries
        return self

    def execute(self, data: Any) -> MergeReport:
        """Run the merge in one commit; this table moves to the new version."""
        self.check_actions()
        schema, batches = input_stream(data)
        source = pa.Table.from_batches(list(batches), schema=schema)
        done = run_change(_Merge(self, source), self.table, retries=self._retries)
        self.table = done.snapshot
        if self._on_commit is not None:
            self._on_commit(self.table)
        return done.report

    def resolved(self, table: TableSnapshot) -> WriteOptions:
        """This merge's options against ``table``'s properties: each one it leaves out is the
        table's, and one it gives must be the same (``PropertyConflictError``)."""
        return TableProperties.of(table.dataset).resolve(self.options, table.blob_columns)

    def check_actions(self) -> None:
        """Refuse a merge that was told to do nothing.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import write_table
        >>> t = write_table(pa.table({"id": [1]}), tempfile.mkdtemp() + "/t")
        >>> t.merge_insert("id").when_not_matched_insert_all().check_actions()
        >>> t.merge_insert("id").check_actions()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        blobhouse.errors.InvalidInputError: merge_insert does nothing: ...
        """
        if not (self._update_all or self._update_columns or self._insert or self._delete):
            raise InvalidInputError(
                "merge_insert does nothing: call when_matched_update_all(), "
                "when_matched_update(...), when_not_matched_insert_all() or "
                "when_not_matched_by_source_delete() before execute()"
            )

    def check_source(self, table: TableSnapshot, source: pa.Table) -> pa.Table:
        """The source with the table's column order and types; refuses missing keys,
        unknown columns and duplicate keys, naming them."""
        schema = table.schema
        missing_keys = [k for k in self.on if k not in source.schema.names]
        if missing_keys:
            raise InvalidInputError(
                f"the source lacks key column(s) {missing_keys} (it has {source.schema.names})"
            )
        unknown = [n for n in source.schema.names if n not in schema.names]
        if unknown:
            hint = closest(unknown[0], schema.names)
            near = f" (did you mean {hint!r}?)" if hint else ""
            raise SchemaError(
                f"the source has column(s) {unknown} the table lacks{near}; table columns: "
                f"{schema.names}"
            )
        needed = set(self.on) | set(self._update_columns or ())
        if self._update_all or self._insert:
            needed |= set(schema.names)
        absent = [n for n in schema.names if n in needed and n not in source.schema.names]
        not_nullable = [n for n in absent if not schema.field(n).nullable]
        if not_nullable:
            raise SchemaError(
                f"the source lacks column(s) {not_nullable}, which the table requires "
                "(not nullable)"
            )
        for name in absent:  # nullable columns the source lacks: null
            source = source.append_column(
                name, pa.nulls(source.num_rows, _source_type(schema, name))
            )
        names = [n for n in schema.names if n in source.schema.names]
        source = source.select(names)
        for key in self.on:
            source = source.set_column(
                source.schema.get_field_index(key),
                key,
                _cast(source[key], schema.field(key).type, key),
            )
        _check_unique(source, self.on)
        return source

    def _write_rows(
        self, table: TableSnapshot, rows: pa.Table, txn: Transaction
    ) -> list[WrittenFile]:
        """The source rows to add, written as new data files through the write pipeline."""
        plan = self.rows_plan(table, rows.schema)
        return write_data_files(
            rows.to_batches(), plan, table.location, table.storage_options, txn.name_prefix
        )

    def rows_plan(self, table: TableSnapshot, schema: pa.Schema) -> WritePlan:
        """How the source rows the merge adds (shaped as ``schema``) are written: planned on
        ``table``'s version, the one the merge read, not on the latest."""
        plan = plan_write(
            schema,
            **self.resolved(table).layout(),
            table_schema=table.schema,
            allowed_bases=allowed_bases_of(table.dataset, None, True, table.location.root_uri),
        )
        if plan.uses_store:
            _, base_id = with_store(table.location, table.dataset, table.storage_options)
            plan = replace(plan, store_base_id=base_id)
        return plan

    def column_rewrite(self, table: TableSnapshot, txn: Transaction) -> ColumnRewrite:
        """The rewrite of ``when_matched_update(columns)``'s columns on ``txn``, without the
        source's values yet (``source``: fragment id -> the matched rows' offsets and values,
        which :func:`rewrite_fragment` writes). Spark fills it one fragment per task."""
        columns = tuple(self._update_columns or ())
        blobs = {p[0] for p in stored_blob_columns(table.schema)}
        modes = self.resolved(table).dedup
        rewrite = _column_rewrite(
            table,
            columns,
            {},
            {c: None for c in columns if c in blobs},
            None,
            {c: modes[c] for c in columns if c in blobs},
            "merge",
        )
        return replace(rewrite, transaction=txn)

    def _column_rewrite(
        self, table: TableSnapshot, source: pa.Table, matches: _Matches, txn: Transaction
    ) -> ColumnRewrite:
        rewrite = self.column_rewrite(table, txn)
        by_fragment = {
            fragment_id: (offsets, source.take(pa.array(rows)).select(list(rewrite.columns)))
            for fragment_id, (offsets, rows) in matches.by_fragment().items()
        }
        return replace(rewrite, source=by_fragment)


@dataclass(frozen=True)
class _MergePlan:
    table: TableSnapshot  # the version read, ready for the merge's dedup modes
    source: pa.Table  # checked against the table
    matches: _Matches
    transaction: Transaction
    written_rows: list[int]  # source rows written as new rows (updated whole, or inserted)
    inserted_keys: pa.Table | None


@dataclass(frozen=True)
class _Merge(BaseChange):
    """A :class:`MergeInsert` as a :class:`~blobhouse.commit.change.Change`."""

    merge: MergeInsert
    source: pa.Table
    in_tasks: bool = False

    def plan(self, snapshot: TableSnapshot) -> _MergePlan:
        merge = self.merge
        table = prepared_for_write(snapshot, store_mode(merge.resolved(snapshot)))
        source = merge.check_source(table, self.source)
        matches = _match(table.dataset, source, merge.on, merge._delete)
        txn = Transaction.start(table.location, table.version, table.storage_options, kind="merge")
        matched_source = matches.source_rows()
        written_rows: list[int] = matched_source.tolist() if merge._update_all else []
        inserted_keys = None
        if merge._insert:
            unmatched = np.setdiff1d(np.arange(source.num_rows), matched_source)
            written_rows.extend(unmatched.tolist())
            inserted_keys = source.select(merge.on).take(pa.array(unmatched, pa.int64()))
        return _MergePlan(table, source, matches, txn, written_rows, inserted_keys)

    def stage(self, plan: _MergePlan, staged: Staged) -> None:
        merge, table, txn = self.merge, plan.table, plan.transaction
        rows = _rows_of(plan.source, sorted(plan.written_rows))
        new_files = merge._write_rows(table, rows, txn) if rows is not None else []
        staged.written.extend(new_files)
        files: dict[int, WrittenFile] = {}
        rewrite = None
        if merge._update_columns:
            rewrite = merge._column_rewrite(table, plan.source, plan.matches, txn)
            for fragment_id in rewrite.source:
                files[fragment_id], _ = rewrite_fragment(table, rewrite, fragment_id)
                staged.written.append(files[fragment_id])
        _delete(table.dataset, plan.matches, merge._update_all, merge._delete, staged.deletions)
        staged.detail = (new_files, files, rewrite or empty_rewrite(table, txn))

    def commit(self, plan: _MergePlan, staged: Staged) -> LanceDataset:
        new_files, files, rewrite = staged.detail
        inserted = plan.inserted_keys
        return commit_rewrite(
            plan.table,
            rewrite,
            files,
            deletions=deleted_fragments(staged.deletions),
            new_files=new_files,
            inserts=None if inserted is None else keys_inserted(inserted),
        )

    def report(
        self, plan: _MergePlan, staged: Staged, committed: TableSnapshot, attempt: int
    ) -> MergeReport:
        merge, matched = self.merge, len(plan.matches.source_rows())
        return MergeReport(
            read_version=plan.table.version,
            version=committed.version,
            num_inserted_rows=len(plan.written_rows) - (matched if merge._update_all else 0),
            num_updated_rows=matched if (merge._update_all or merge._update_columns) else 0,
            num_deleted_rows=plan.matches.deleted_by_source() if merge._delete else 0,
            bytes_written=sum(w.size_bytes + w.sidecar_bytes for w in staged.written),
            attempts=attempt,
        )


def keys_inserted(keys: pa.Table) -> Inserts:
    """The keys a merge inserts (``keys``: one row each), checked against the fragments of a
    later version in this process."""

    def found(dataset: LanceDataset, fragment_ids: list[int]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for fragment_id in fragment_ids:
            present = dataset.get_fragment(fragment_id).to_table(columns=keys.column_names)
            both = keys.join(present, keys.column_names, join_type="left semi")
            out.extend(both.slice(0, SHOWN_KEYS - len(out)).to_pylist())
            if len(out) >= SHOWN_KEYS:
                break
        return out

    return Inserts(tuple(keys.column_names), keys.num_rows, found)


def empty_rewrite(table: TableSnapshot, txn: Transaction) -> ColumnRewrite:
    """A rewrite of no columns, on ``txn``: a merge that only deletes and appends rows."""
    plan = plan_write(pa.schema([]), table_schema=pa.schema([]))
    return ColumnRewrite((), (), {}, {}, None, plan, txn)


@dataclass
class _Matches:
    """Which table rows (fragment, offset) the source's rows match, and which table rows the
    source lacks (deleted by ``when_not_matched_by_source_delete``)."""

    fragments: list[np.ndarray] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    unmatched: dict[int, np.ndarray] = field(default_factory=dict)

    def source_rows(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.array([], dtype=np.int64)

    def by_fragment(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """fragment id -> (offsets ascending, the source row of each)."""
        if not self.fragments:
            return {}
        fragments = np.concatenate(self.fragments)
        offsets = np.concatenate(self.offsets)
        rows = np.concatenate(self.rows)
        out = {}
        for fragment_id in np.unique(fragments):
            at = fragments == fragment_id
            order = np.argsort(offsets[at])
            out[int(fragment_id)] = (offsets[at][order], rows[at][order])
        return out

    def deleted_by_source(self) -> int:
        return sum(len(v) for v in self.unmatched.values())


def _match(dataset: LanceDataset, source: pa.Table, on: list[str], delete: str | bool) -> _Matches:
    """Join the table's keys with the source's, one fragment at a time (one join each: the
    source's keys are hashed once per fragment, not once per scan batch)."""
    keys = source.select(on).append_column(_SOURCE_ROW, pa.array(np.arange(source.num_rows)))
    matches = _Matches()
    for fragment in dataset.get_fragments():
        joined = _fragment_keys(fragment, on).join(keys, on, join_type="inner")
        if joined.num_rows:
            addresses = joined[ROW_ADDRESS].to_numpy()
            matches.fragments.append((addresses >> 32).astype(np.int64))
            matches.offsets.append((addresses & 0xFFFFFFFF).astype(np.int64))
            matches.rows.append(joined[_SOURCE_ROW].to_numpy())
        if delete:
            expr = delete if isinstance(delete, str) else None
            alone = _fragment_keys(fragment, on, expr).join(keys, on, join_type="left anti")
            if alone.num_rows:
                offsets = alone[ROW_ADDRESS].to_numpy() & 0xFFFFFFFF
                matches.unmatched[fragment.fragment_id] = offsets
    return matches


def _fragment_keys(fragment, on: list[str], expr: str | None = None) -> pa.Table:
    """The key columns and row addresses of a fragment's live rows (matching ``expr``)."""
    return fragment.to_table(columns=on, filter=expr, with_row_address=True)


def _delete(
    dataset: LanceDataset,
    matches: _Matches,
    update_all: bool,
    delete: str | bool,
    into: list[StagedDeletion],
) -> None:
    """Write a deletion file for each fragment losing rows to the merge (the matched rows it
    rewrites, and those the source lacks), appending each record to ``into`` as soon as its
    file exists (a failure later still finds it)."""
    doomed: dict[int, list[np.ndarray]] = {}
    if update_all:
        for fragment_id, (offsets, _) in matches.by_fragment().items():
            doomed.setdefault(fragment_id, []).append(offsets)
    if delete:
        for fragment_id, offsets in matches.unmatched.items():
            doomed.setdefault(fragment_id, []).append(offsets)
    for fragment_id, parts in doomed.items():
        # int64 each: matched offsets are signed, the source-lacks ones unsigned
        offsets = np.unique(np.concatenate([p.astype(np.int64) for p in parts])).tolist()
        into.append(stage_deletion(dataset, fragment_id, offsets))


def deleted_fragments(deletions: Sequence[StagedDeletion]) -> dict[int, Any]:
    """fragment id -> its metadata with its new deletion file, or None when no row is left
    (what :func:`commit_rewrite` takes).

    >>> deleted_fragments([StagedDeletion(3, None, None)])
    {3: None}
    """
    return {d.fragment_id: d.metadata for d in deletions}


def _source_match(
    found: tuple[np.ndarray, pa.Table] | None, offsets: np.ndarray
) -> tuple[pa.Array, np.ndarray]:
    """For a batch of a fragment's rows (``offsets``): which rows the source updates, and the
    source row of each (-1 for none)."""
    rows = np.full(len(offsets), -1, dtype=np.int64)
    if found is not None:
        matched_offsets = found[0]
        at = np.searchsorted(matched_offsets, offsets)
        at = np.minimum(at, max(len(matched_offsets) - 1, 0))
        hit = (
            (matched_offsets[at] == offsets)
            if len(matched_offsets)
            else np.zeros(len(offsets), bool)
        )
        rows[hit] = at[hit]
    return pa.array(rows >= 0), rows


def _from_source(
    source: pa.Table, rows: np.ndarray, column: str, out_type: pa.DataType
) -> pa.Array:
    """The source's values of ``column`` for the batch's rows (null where there is none)."""
    values = source[column].combine_chunks()
    if pa.types.is_struct(out_type) and out_type == INPUT_BLOB_TYPE:
        values = _logical(values, column)
    else:
        values = _cast(values, out_type, column)
    return values.take(pa.array(rows, mask=rows < 0))


def _rows_of(source: pa.Table, rows: list[int]) -> pa.Table | None:
    """The source's ``rows`` (ascending); the source itself when that is every row (no copy of
    its payloads)."""
    if not rows:
        return None
    if len(rows) == source.num_rows:
        return source
    return source.take(pa.array(rows, pa.int64()))


def _check_unique(source: pa.Table, on: list[str]) -> None:
    """Refuse a source in which a key appears twice, naming the key."""
    counts = source.group_by(on).aggregate([([], "count_all")])
    twice = counts.filter(pc.greater(counts["count_all"], 1))
    if twice.num_rows:
        key = {k: twice[k][0].as_py() for k in on}
        raise InvalidInputError(
            f"the source has {twice.num_rows} key(s) more than once, e.g. {key} "
            f"({twice['count_all'][0].as_py()} rows): a merge needs one source row per key"
        )


def _source_type(schema: pa.Schema, name: str) -> pa.DataType:
    field_ = schema.field(name)
    return INPUT_BLOB_TYPE if is_lance_blob_field(field_) else field_.type


def store_mode(options: WriteOptions) -> str:
    """``"global"`` if a column of these (resolved) options stores in the table's store."""
    modes = [options.dedup] if isinstance(options.dedup, str) else options.dedup.values()
    return "global" if "global" in modes else "content"


# ---------------------------------------------------------------------------------------------
# checks shared by update and merge_insert


def _check_column(column: str, schema: pa.Schema, what: str = "column") -> None:
    """Refuse a name that is not a top-level column (merge_insert keys and the columns it
    updates match the source's top-level columns), naming the closest."""
    if not isinstance(column, str) or column not in schema.names:
        raise unknown_column(column, schema.names, what)


def _blob_update(column: str, value: Any) -> BlobFunction | None:
    if value is None or (isinstance(value, str) and value.strip().upper() == "NULL"):
        return None
    if callable(value):
        return value
    raise InvalidInputError(
        f"blob column {column!r} is set by a function (a batch of the matching rows' plain "
        f"columns -> one blob value per row) or None (null), not {type(value).__name__} "
        f"{value!r}: SQL cannot make blob payloads"
    )


def _check_sql(dataset: LanceDataset, where: str | None, expressions: Mapping[str, str]) -> None:
    """Refuse a ``where`` or an expression Lance cannot parse or resolve, naming it."""
    if where is not None:
        if not isinstance(where, str) or not where.strip():
            raise InvalidInputError(f"where must be a SQL condition, got {where!r}")
        _try_sql(dataset, {_MATCH: f"({where})"}, f"where {where!r}")
    for column, expression in expressions.items():
        _try_sql(dataset, {column: expression}, f"the expression for column {column!r}")


def _try_sql(dataset: LanceDataset, projection: dict[str, str], what: str) -> None:
    try:
        # Lance scans need one stored column beside literal expressions
        anchor = {"__bh_anchor": _quoted(dataset.schema.names[0])}
        dataset.scanner(columns={**projection, **anchor}, limit=1).to_table()
    except (ValueError, OSError, pa.ArrowInvalid) as exc:
        raise InvalidInputError(
            f"{what} is not valid SQL for this table: {lance_message(exc)}"
        ) from None


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"`{name}`"
