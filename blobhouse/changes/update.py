"""Updates and deletes of the rows that match a filter, each in one commit.

:func:`update_rows` rewrites only the changed columns of the fragments holding a matching row (a
:mod:`~blobhouse.changes.column_rewrite`), as a change (:mod:`blobhouse.commit.change`): nothing
visible on failure, staged files removed, a commit a concurrent one preempted planned again.
:func:`delete_rows` is Lance's delete through a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lance import LanceDataset

from blobhouse.changes.backfill import BlobFunction
from blobhouse.changes.column_rewrite import (
    ColumnRewrite,
    blob_modes,
    blob_update,
    check_disjoint,
    check_sql,
    commit_rewrite,
    plan_column_rewrite,
    rewrite_if_matched,
)
from blobhouse.columns import resolve_column
from blobhouse.commit.change import (
    BaseChange,
    Committed,
    Planned,
    Staged,
    commit_once,
    run_change,
)
from blobhouse.commit.runners import HERE, Runner
from blobhouse.errors import InvalidInputError
from blobhouse.options import CommitOptions
from blobhouse.values import (
    path_name,
    stored_blob_columns,
)
from blobhouse.write.prepare import prepared_for_write

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot


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


def update_rows(
    table: TableSnapshot,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None = None,
    *,
    dedup: str | None = None,
    commit: CommitOptions | None = None,
    runner: Runner = HERE,
) -> Committed[UpdateReport]:
    """Set ``updates`` (column -> SQL expression; for a blob column a function of the matching
    rows' plain columns, or None for null) on the rows matching ``where`` (every row if None),
    in one commit: the report and the committed snapshot. See :meth:`blobhouse.Table.update`.
    ``runner`` writes the new file of every fragment holding a matching row, with the offsets
    of the rows that changed in each (default: one fragment after another in this process;
    Spark runs them as tasks; each unit checks its fragment for a match). A preempted commit
    is run again up to ``commit.retries`` times."""
    change = _Update(updates, where, dedup, runner)
    return run_change(change, table, retries=(commit or CommitOptions()).retries)


@dataclass(frozen=True)
class _Update(BaseChange):
    """An update as a :class:`~blobhouse.commit.change.Change`."""

    updates: Mapping[str, str | BlobFunction | None]
    where: str | None
    dedup: str | None
    runner: Runner

    @property
    def in_tasks(self) -> bool:  # type: ignore[override]
        return self.runner.in_tasks

    def plan(self, snapshot: TableSnapshot) -> Planned[ColumnRewrite]:
        modes = blob_modes(snapshot, self.updates, self.dedup)
        table = prepared_for_write(snapshot, "global" if "global" in modes.values() else "content")
        return Planned(table, plan_update(table, self.updates, self.where, modes))

    def stage(self, plan: Planned[ColumnRewrite], staged: Staged) -> None:
        rewrite = plan.plan
        ids = [f.fragment_id for f in plan.table.dataset.get_fragments()]
        results = self.runner.map(
            plan.table, lambda at, i: rewrite_if_matched(at, rewrite, i), ids, "update"
        )
        done = {i: r for i, r in zip(ids, results, strict=True) if r is not None}
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
            bytes_written=sum(w.bytes_written for w in staged.written),
            attempts=attempt,
        )


def delete_rows(table: TableSnapshot, filter: str) -> TableSnapshot:
    """Delete the rows matching the SQL ``filter`` in one commit (Lance's delete, through a
    transaction); the committed snapshot.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import write_table
    >>> t = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t")
    >>> delete_rows(t.snapshot, "id = 1").count_rows()
    1
    """
    return commit_once(table, "delete", lambda dataset: dataset.delete(filter))


def plan_update(
    table: TableSnapshot,
    updates: Mapping[str, str | BlobFunction | None],
    where: str | None,
    dedup: Mapping[str, str] | None = None,
    *,
    kind: str = "update",
) -> ColumnRewrite:
    """Check ``updates`` and ``where`` against the table and plan the rewrite."""
    table.properties.check_writable()  # it writes data files: never by damaged settings
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
    check_disjoint(paths)
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
            functions[column] = blob_update(column, value)
        elif isinstance(value, str):
            expressions[column] = value
        else:
            raise InvalidInputError(
                f"update of column {column!r}: give a SQL expression as a string (e.g. "
                f"'{column} + 1' or \"'text'\"), got {type(value).__name__}"
            )
    check_sql(table.dataset, where, expressions)
    return plan_column_rewrite(table, tuple(updates), expressions, functions, where, dedup, kind)
