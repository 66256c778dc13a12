"""Column rewrites: new values for some columns of the rows that match, keeping blob sharing.

Lance's own ``update`` and ``merge_insert`` rewrite every column of a changed row, so a row's
blob payloads are copied once per row and sharing is lost until a compaction. A column rewrite
touches only the fragments holding a matching row: each gets one new data file with the changed
columns for all its rows, and the old file's copy of them is retired (Lance's
``rewrite_columns`` update, which every Lance reader understands). Blob payloads of unchanged
columns are not touched; a blob column set to new values goes through the write pipeline with
its dedup mode. :func:`~blobhouse.changes.update.update` and
:class:`~blobhouse.changes.merge_insert.MergeInsert`'s ``when_matched_update(columns)`` plan
one; :func:`rewrite_fragment` is the per-fragment step Spark runs as tasks, and
:func:`commit_rewrite` the one commit.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset, LanceOperation
from lance.fragment import DataFile
from pyroaring import BitMap

from blobhouse.changes.backfill import BlobFunction, check_fragment_rows
from blobhouse.columns import column_paths, unknown_column
from blobhouse.commit.transaction import (
    Inserts,
    Transaction,
)
from blobhouse.errors import InvalidInputError, cleanup_after, is_lance_io_error, lance_message
from blobhouse.files.references import leaf_field_ids
from blobhouse.files.session import WrittenFile
from blobhouse.options import WriteOptions
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties
from blobhouse.settings import DEDUP_MODE
from blobhouse.store.packs import StoredPayload, store_base_id
from blobhouse.values import (
    ROW_ADDRESS,
    ColumnPath,
    blob_array,
    path_name,
    stored_blob_columns,
)
from blobhouse.write.carry import INPUT_BLOB_TYPE, carried_schema, logical_values
from blobhouse.write.pipeline import (
    DataFileWriter,
    WritePlan,
    plan_write,
    store_writer_for_plan,
)

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot


_MATCH = "__bh_match"


_TOMBSTONE = -2  # Lance's field id for a column a data file no longer provides


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


def blob_modes(
    table: TableSnapshot, columns: Iterable[str], given: str | None = None
) -> dict[str, str]:
    """The dedup mode each blob column among ``columns`` is written with: the table's
    property (``given``, if any, must be the same; see
    :meth:`~blobhouse.properties.TableProperties.change_mode`)."""
    if given is not None:
        DEDUP_MODE.check(given)
    properties = TableProperties.of(table.dataset)
    blobs = [c for c in columns if c in set(table.blob_columns)]
    if given is not None and not blobs:
        raise InvalidInputError(
            f"dedup={given!r} applies to blob columns; this change sets none of them"
        )
    return {c: properties.change_mode(c, given) for c in blobs}


def rewrite_if_matched(
    table: TableSnapshot, plan: ColumnRewrite, fragment_id: int
) -> tuple[WrittenFile, BitMap] | None:
    """:func:`rewrite_fragment` of ``fragment_id`` if a live row of it matches the plan's
    ``where`` (None otherwise): one unit of an update, here or in a Spark task."""
    if not has_match(table.dataset.get_fragment(fragment_id), plan.where):
        return None
    return rewrite_fragment(table, plan, fragment_id)


def plan_column_rewrite(
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
    modes = {c: _rewrite_mode((dedup or {}).get(c) or properties.dedup_of(c)) for c in blobs}
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


def _rewrite_mode(mode: str) -> str:
    """How a rewrite stores a column of dedup ``mode``: its values reach the pipeline without
    their ref_ids (the table keeps none), so a ref_id column shares by content instead: the
    rows that shared a payload carry the same bytes (compaction does the same)."""
    return "content" if mode == "ref_id" else mode


def check_disjoint(paths: Mapping[str, ColumnPath]) -> None:
    """Refuse a change that names a struct and one of its fields (which value would win?)."""
    for column, path in paths.items():
        for other, inner in paths.items():
            if len(inner) > len(path) and inner[: len(path)] == path:
                raise InvalidInputError(
                    f"the update names both {column!r} and its field {other!r}; name one"
                )


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
    except BaseException as exc:
        cleanup_after(exc, writer.abort, *([store.abort] if store is not None else []))
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
            new = cast_values(batch.column(f"__bh_new_{column}"), old.type, column)
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
    values = logical_struct(values, column)
    spread = np.full(batch.num_rows, -1, dtype=np.int64)
    spread[positions] = np.arange(len(positions))
    return values.take(pa.array(spread, mask=spread < 0))


def logical_struct(values: pa.Array, column: str) -> pa.StructArray:
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


def cast_values(values: pa.Array, to: pa.DataType, column: str) -> pa.Array:
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
    stored: Sequence[StoredPayload] = (),
) -> LanceDataset:
    """One Lance ``Update`` commit: each fragment of ``files`` reads ``rewrite.columns`` from
    its new file (the old files' copies retired), ``deletions`` (fragment id -> metadata with
    a new deletion file, or None when no row is left) apply, and ``new_files`` become new
    fragments. ``matched`` (fragment id -> offsets of the rows that got new values; by default
    the rows ``rewrite.source`` names) lets Lance stamp those rows, and only those, as updated
    in this version on a table with stable row ids (elsewhere Lance has no use for them).
    ``inserts``: the keys a merge inserts, ``stored``: payloads stored besides the files' own
    (see :meth:`Transaction.commit`)."""
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
        [*files.values(), *new_files], lambda: operation, inserts=inserts, stored=stored
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


def empty_rewrite(table: TableSnapshot, txn: Transaction) -> ColumnRewrite:
    """A rewrite of no columns, on ``txn``: a merge that only deletes and appends rows."""
    plan = plan_write(pa.schema([]), table_schema=pa.schema([]))
    return ColumnRewrite((), (), {}, {}, None, plan, txn)


def store_mode(options: WriteOptions) -> str:
    """``"global"`` if a column of these (resolved) options stores in the table's store."""
    modes = [options.dedup] if isinstance(options.dedup, str) else options.dedup.values()
    return "global" if "global" in modes else "content"


def check_column(column: str, schema: pa.Schema, what: str = "column") -> None:
    """Refuse a name that is not a top-level column (merge_insert keys and the columns it
    updates match the source's top-level columns), naming the closest."""
    if not isinstance(column, str) or column not in schema.names:
        raise unknown_column(column, schema.names, what)


_SHORT = reprlib.Repr()  # a value quoted in an error: its start, never megabytes
_SHORT.maxstring = _SHORT.maxother = 40
_SQL = reprlib.Repr()  # a statement or Lance's error about one, as an error shows it
_SQL.maxstring = _SQL.maxother = 300


def blob_update(column: str, value: Any) -> BlobFunction | None:
    """How an update sets blob ``column``: a function of the matching rows' batch, None
    (null), or one payload for every matching row (bytes: stored once with dedup)."""
    if value is None or (isinstance(value, str) and value.strip().upper() == "NULL"):
        return None
    if callable(value):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        payload = bytes(value)
        return lambda batch: [payload] * batch.num_rows
    shown = _SHORT.repr(value)
    raise InvalidInputError(
        f"blob column {column!r} is set by a function (a batch of the matching rows' plain "
        f"columns -> one blob value per row), bytes (one payload for every row) or None "
        f"(null), not {type(value).__name__} {shown}: SQL cannot make blob payloads"
    )


def check_sql(dataset: LanceDataset, where: str | None, expressions: Mapping[str, str]) -> None:
    """Refuse a ``where`` or an expression Lance cannot parse or resolve, naming it."""
    if where is not None:
        if not isinstance(where, str) or not where.strip():
            raise InvalidInputError(f"where must be a SQL condition, got {_SQL.repr(where)}")
        _try_sql(dataset, {_MATCH: f"({where})"}, f"where {_SQL.repr(where)}")
    for column, expression in expressions.items():
        _try_sql(dataset, {column: expression}, f"the expression for column {column!r}")


def _try_sql(dataset: LanceDataset, projection: dict[str, str], what: str) -> None:
    try:
        # Lance scans need one stored column beside literal expressions
        anchor = {"__bh_anchor": _quoted(dataset.schema.names[0])}
        dataset.scanner(columns={**projection, **anchor}, limit=1).to_table()
    except (ValueError, OSError, pa.ArrowInvalid) as exc:
        if is_lance_io_error(exc):  # the store failed: the caller names it
            raise
        # Lance quotes the whole statement back: an error shows its start
        raise InvalidInputError(
            f"{what} is not valid SQL for this table: {_start(lance_message(exc))}"
        ) from None


def _start(text: str, limit: int = 500) -> str:
    """``text``, or its start when it is longer than ``limit``."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"`{name}`"


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
        values = logical_struct(values, column)
    else:
        values = cast_values(values, out_type, column)
    return values.take(pa.array(rows, mask=rows < 0))
