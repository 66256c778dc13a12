"""Upserts that keep blob sharing: :class:`MergeInsert`, shaped like Lance's builder.

The matched rows it replaces are deleted (deletion vectors) and the source's rows appended
through the write pipeline: with ``dedup="global"`` a payload the table already stores anywhere
is referenced, not written again. ``when_matched_update(columns)`` rewrites just those columns,
like an update (:mod:`~blobhouse.changes.column_rewrite`). One change
(:mod:`blobhouse.commit.change`), one Lance commit. Two merges inserting the same new key at
once leave it once: the later one is planned again, where its row is an update (see
:meth:`~blobhouse.commit.transaction.Transaction.commit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset

from blobhouse.changes.column_rewrite import (
    ColumnRewrite,
    cast_values,
    check_column,
    commit_rewrite,
    empty_rewrite,
    plan_column_rewrite,
    rewrite_fragment,
    store_mode,
)
from blobhouse.columns import check_column_names
from blobhouse.commit.change import (
    BaseChange,
    Change,
    Staged,
    run_change,
)
from blobhouse.commit.transaction import (
    SHOWN_KEYS,
    Inserts,
    StagedDeletion,
    Transaction,
    stage_deletion,
)
from blobhouse.errors import InvalidInputError, SchemaError, closest
from blobhouse.files.session import WrittenFile
from blobhouse.options import CommitOptions, WriteOptions
from blobhouse.properties import TableProperties
from blobhouse.snapshot import in_fresh_datasets
from blobhouse.values import (
    ROW_ADDRESS,
    is_lance_blob_field,
    stored_blob_columns,
)
from blobhouse.write.carry import INPUT_BLOB_TYPE
from blobhouse.write.inputs import input_stream
from blobhouse.write.pipeline import (
    WritePlan,
    plan_write,
    write_data_files,
)
from blobhouse.write.prepare import allowed_bases_of, prepared_for_write, with_store

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot


_SOURCE_ROW = "__bh_source_row"


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


@dataclass(frozen=True)
class MergeClauses:
    """What a merge does, declared once whatever runs it (:class:`MergeInsert` fills it through
    its ``when_*`` methods; the local merge and the Spark one read it): matched rows get every
    source column (``update_all``) or only ``update_columns``; source rows with no match are
    inserted (``insert``); table rows the source lacks are deleted (``delete``: True, or a SQL
    condition they must match too).

    >>> MergeClauses(insert=True).writes_rows, MergeClauses(update_columns=("a",)).updates
    (True, True)
    >>> MergeClauses().check()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: merge_insert does nothing: ...
    """

    update_all: bool = False
    update_columns: tuple[str, ...] | None = None
    insert: bool = False
    delete: bool | str = False

    @property
    def updates(self) -> bool:
        """Whether matched rows get (some of) the source's values."""
        return self.update_all or bool(self.update_columns)

    @property
    def writes_rows(self) -> bool:
        """Whether the merge writes source rows as new rows (updated whole, or inserted)."""
        return self.update_all or self.insert

    def check(self) -> None:
        """Refuse clauses that do nothing."""
        if not (self.updates or self.insert or self.delete):
            raise InvalidInputError(
                "merge_insert does nothing: call when_matched_update_all(), "
                "when_matched_update(...), when_not_matched_insert_all() or "
                "when_not_matched_by_source_delete() before execute()"
            )

    def check_columns(self, schema: pa.Schema, on: Sequence[str]) -> None:
        """Refuse update columns ``schema`` lacks (naming the closest), keys, or none."""
        if self.update_columns is None:
            return
        for column in self.update_columns:
            check_column(column, schema)
            if column in on:
                raise InvalidInputError(f"{column!r} is a key column; it cannot be updated")
        if not self.update_columns:
            raise InvalidInputError("when_matched_update needs at least one column")


class MergeInsert:
    """An upsert builder shaped like Lance's: say what happens to matched rows, to source rows
    with no match and to table rows the source lacks (its :class:`MergeClauses`), then
    :meth:`execute` once. The same builder runs on Spark: ``blobhouse.spark.merge_insert(df,
    builder)``.

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
        self.clauses = MergeClauses()
        self._commit = CommitOptions()
        if not self.on:
            raise InvalidInputError("merge_insert needs at least one key column (on=...)")
        for key in self.on:
            check_column(key, table.schema, "key column")
            if is_lance_blob_field(table.schema.field(key)):
                raise InvalidInputError(f"key column {key!r} is a blob column; keys are plain")

    def when_matched_update_all(self) -> MergeInsert:
        """A table row whose key the source has gets all of the source row's values."""
        self.clauses = replace(self.clauses, update_all=True, update_columns=None)
        return self

    def when_matched_update(self, columns: Sequence[str]) -> MergeInsert:
        """A table row whose key the source has gets the source's values of ``columns`` only
        (the other columns, their blobs included, are not rewritten)."""
        columns = [columns] if isinstance(columns, str) else list(columns)
        clauses = replace(self.clauses, update_all=False, update_columns=tuple(columns))
        clauses.check_columns(self.table.schema, self.on)
        self.clauses = clauses
        return self

    def when_not_matched_insert_all(self) -> MergeInsert:
        """A source row whose key the table lacks is inserted."""
        self.clauses = replace(self.clauses, insert=True)
        return self

    def when_not_matched_by_source_delete(self, expr: str | None = None) -> MergeInsert:
        """A table row whose key the source lacks (and that matches ``expr``, if given) is
        deleted."""
        self.clauses = replace(self.clauses, delete=expr if expr is not None else True)
        return self

    def commit(self, options: CommitOptions) -> MergeInsert:
        """How this merge commits (:class:`~blobhouse.options.CommitOptions`: how often it is
        planned again after a concurrent commit preempted it, 3 by default)."""
        if not isinstance(options, CommitOptions):
            raise InvalidInputError(f"commit() takes a CommitOptions, got {options!r}")
        self._commit = options
        return self

    def conflict_retries(self, retries: int) -> MergeInsert:
        """Sugar for ``.commit(CommitOptions(retries=retries))``: this is
        :attr:`CommitOptions.retries <blobhouse.options.CommitOptions.retries>`."""
        return self.commit(CommitOptions(retries=retries))

    def execute(self, data: Any) -> MergeReport:
        """Run the merge in one commit; this table moves to the new version."""
        self.check_actions()
        schema, batches = input_stream(data)
        source = pa.Table.from_batches(list(batches), schema=schema)
        return self.run(_Merge(self, source))

    def run(self, change: Change[Any, MergeReport]) -> MergeReport:
        """Run ``change`` (this merge, as a runner stages it: here, or in Spark tasks) on this
        builder's table with its commit options; the builder, and the table that built it,
        move to the version committed."""
        done = run_change(change, self.table, retries=self._commit.retries)
        self.table = done.snapshot
        if self._on_commit is not None:
            self._on_commit(self.table)
        return done.report

    def on_version(self, table: TableSnapshot) -> MergeInsert:
        """This merge (keys, clauses, write and commit options) on ``table``, another version
        of its table, checked again against that version's schema."""
        merge = MergeInsert(table, self.on, self.options)
        self.clauses.check_columns(table.schema, merge.on)
        merge.clauses, merge._commit = self.clauses, self._commit
        return merge

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
        self.clauses.check()

    def check_source(self, table: TableSnapshot, source: pa.Table) -> pa.Table:
        """The source with the table's column order and types; refuses missing keys,
        unknown columns and duplicate keys, naming them."""
        check_column_names(source.schema, "merge_insert's source")  # a name twice, say
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
        needed = set(self.on) | set(self.clauses.update_columns or ())
        if self.clauses.writes_rows:
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
                cast_values(source[key], schema.field(key).type, key),
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
        columns = tuple(self.clauses.update_columns or ())
        blobs = {p[0] for p in stored_blob_columns(table.schema)}
        modes = self.resolved(table).dedup
        rewrite = plan_column_rewrite(
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
        clauses = merge.clauses
        matches = _match(table, source, merge.on, clauses.delete)
        txn = Transaction.start(table.location, table.version, table.storage_options, kind="merge")
        matched_source = matches.source_rows()
        written_rows: list[int] = matched_source.tolist() if clauses.update_all else []
        inserted_keys = None
        if clauses.insert:
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
        if merge.clauses.update_columns:
            rewrite = merge._column_rewrite(table, plan.source, plan.matches, txn)
            for fragment_id in rewrite.source:
                files[fragment_id], _ = rewrite_fragment(table, rewrite, fragment_id)
                staged.written.append(files[fragment_id])
        clauses = merge.clauses
        _delete(table.dataset, plan.matches, clauses.update_all, clauses.delete, staged.deletions)
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
        clauses, matched = self.merge.clauses, len(plan.matches.source_rows())
        return MergeReport(
            read_version=plan.table.version,
            version=committed.version,
            num_inserted_rows=len(plan.written_rows) - (matched if clauses.update_all else 0),
            num_updated_rows=matched if clauses.updates else 0,
            num_deleted_rows=plan.matches.deleted_by_source() if clauses.delete else 0,
            bytes_written=sum(w.bytes_written for w in staged.written),
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


def _match(table: TableSnapshot, source: pa.Table, on: list[str], delete: str | bool) -> _Matches:
    """Join the table's keys with the source's, one fragment at a time (one join each: the
    source's keys are hashed once per fragment, not once per scan batch), a run of fragments
    per dataset object (:func:`~blobhouse.snapshot.in_fresh_datasets`)."""
    keys = source.select(on).append_column(_SOURCE_ROW, pa.array(np.arange(source.num_rows)))
    matches = _Matches()
    ids = [f.fragment_id for f in table.dataset.get_fragments()]
    for at, run in in_fresh_datasets(table, ids):
        _match_run(at.dataset, run, keys, on, delete, matches)
    return matches


def _match_run(
    dataset: LanceDataset,
    fragment_ids: Sequence[int],
    keys: pa.Table,
    on: list[str],
    delete: str | bool,
    matches: _Matches,
) -> None:
    """:func:`_match` over one run of fragments, into ``matches``."""
    for fragment in (dataset.get_fragment(i) for i in fragment_ids):
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
