"""The change template: one runner for every change that stages files and commits them.

A change -- an update, a compaction, a backfill -- supplies only what differs (PyIceberg's snapshot
producers, Lance's ``execute_uncommitted``): its plan on a snapshot (holding its
:class:`~blobhouse.commit.transaction.Transaction`), the files it stages (in this process, or in
Spark tasks), its commit and its report. :func:`run_change` does the rest, the same way for all of
them: plan on the version read, hold the transaction's lease while staging, commit through the
transaction (its checks and records), abort on any failure (removing exactly what was staged; with
Spark tasks, marking the abort first so a task still running cleans up after itself), plan again on
the latest version when a concurrent commit preempted it, and hand back the report with the
committed snapshot, so the caller moves to it without opening the table again.

>>> import tempfile, pyarrow as pa
>>> from lance import LanceOperation
>>> from blobhouse import write_table
>>> from blobhouse.files.session import BlobSession
>>> table = write_table(pa.table({"id": [1]}), tempfile.mkdtemp() + "/t")
>>> class AppendOne(BaseChange):
...     def plan(self, snapshot):
...         return Transaction.start(snapshot.location, snapshot.version, kind="example")
...     def stage(self, txn, staged):
...         path = f"{txn.location.data_dir}/{txn.name_prefix}0.lance"
...         staged.written.append(BlobSession(path).write_data_file(pa.table({"id": [2]})))
...     def commit(self, txn, staged):
...         fragments = [w.fragment([0]) for w in staged.written]
...         return txn.commit(staged.written, lambda: LanceOperation.Append(fragments))
...     def report(self, txn, staged, committed, attempt):
...         return committed.count_rows()
>>> done = run_change(AppendOne(), table.snapshot)
>>> done.report, done.snapshot.version
(2, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from lance import LanceDataset, LanceOperation
from lance.commit import CommitConflictError

from blobhouse.commit.transaction import (
    DEFAULT_RETRIES,
    StagedDeletion,
    Transaction,
    conflict_error,
    retrying,
)
from blobhouse.errors import (
    BlobhouseError,
    ConcurrentCommitError,
    as_store_error,
    cleanup_after,
    is_damaged_file_error,
    lance_io,
)
from blobhouse.files.session import WrittenFile
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import TableSnapshot, damage_named, damaged_file_error

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclass
class Staged:
    """What one attempt of a change staged so far, filled as it goes so that an abort removes
    all of it: data files (with their sidecars and packs), the deletion files Lance named, and
    what else the change wants to report (``detail``)."""

    written: list[WrittenFile] = field(default_factory=list)
    deletions: list[StagedDeletion] = field(default_factory=list)
    detail: Any = None


class Change(Protocol[P, R]):
    """What a change supplies to :func:`run_change`. ``P`` is its plan; :func:`transaction_of`
    finds the plan's transaction (the plan itself, or its ``transaction``)."""

    #: its files are staged by Spark tasks: an abort while they stage marks first, so a task
    #: still running removes its own file (see Transaction.abort)
    in_tasks: bool
    #: it reads the table's rows (every change but a schema or property change): refused on a
    #: table with a column name Lance cannot address (TableSnapshot.check_column_names)
    reads_rows: bool

    def plan(self, snapshot: TableSnapshot | None) -> P:
        """The change planned on ``snapshot`` (the version read; None: a write that creates
        the table)."""

    def stage(self, plan: P, staged: Staged) -> None:
        """Write the change's files, adding each to ``staged`` as it is written."""

    def commit(self, plan: P, staged: Staged) -> LanceDataset:
        """Commit ``staged`` through the plan's transaction; the committed dataset."""

    def report(self, plan: P, staged: Staged, committed: TableSnapshot, attempt: int) -> R:
        """What the change did, once committed (``attempt``: 1, 2, ... after preemptions)."""

    def abort(self, plan: P, staged: Staged, *, tasks_may_run: bool) -> None:
        """Remove what ``staged`` holds and everything else the attempt staged."""

    def release(self, plan: P) -> None:
        """Drop what the plan holds (a Spark cache, say) once its attempt ended, either way."""


class BaseChange(Generic[P, R]):
    """Defaults for a :class:`Change`: staged in this process, aborted by its transaction,
    nothing to release."""

    in_tasks = False
    reads_rows = True

    def abort(self, plan: P, staged: Staged, *, tasks_may_run: bool) -> None:
        transaction_of(plan).abort(
            staged.written, deletions=staged.deletions, tasks_may_run=tasks_may_run
        )

    def release(self, plan: P) -> None:
        return None


@dataclass(frozen=True)
class Committed(Generic[R]):
    """A change's report and the snapshot it committed (the version read, if it had nothing to
    commit)."""

    report: R
    snapshot: TableSnapshot


@dataclass(frozen=True)
class Planned(Generic[P]):
    """A change's plan with the snapshot it was made on (prepared for the change: its store
    registered, say), which its staging and commit work on."""

    table: TableSnapshot
    plan: P

    @property
    def transaction(self) -> Transaction:
        return transaction_of(self.plan)


def transaction_of(plan: object) -> Transaction:
    """The transaction a plan stages under: the plan itself, or its ``transaction``."""
    return plan if isinstance(plan, Transaction) else plan.transaction  # type: ignore[attr-defined]


@dataclass
class Attempt(Generic[P, R]):
    """One attempt of a change, in steps that may run in different places: planned where it
    begins, staged here (:meth:`stage`) or by Spark tasks (which return their files to the
    driver), then committed or aborted where it began. :func:`run_change` runs the steps in one
    place; Spark's data source runs them as Spark calls it (plan in ``writer``, stage in
    tasks, then ``commit`` or ``abort``).

    A failed stage or commit aborts the attempt (removing what it staged); :meth:`end` releases
    what its plan holds, either way."""

    change: Change[P, R]
    at: TableSnapshot | None
    plan: P
    number: int = 1
    staged: Staged = field(default_factory=Staged)

    @classmethod
    def begin(cls, change: Change[P, R], at: TableSnapshot | None, number: int = 1) -> Attempt:
        """``change`` planned on ``at`` (None: it creates the table)."""
        if at is None:
            return cls(change, at, change.plan(at), number)
        if change.reads_rows:  # Lance could not read a column another tool misnamed
            at.check_column_names()
        else:  # a name holding NUL: Lance cannot even export the schema a change rewrites
            at.schema  # noqa: B018
        root = at.location.root
        # a plan reads the table (a compaction's): a damaged data file is named
        with lance_io(root, "change"), damage_named(root, "change", at.damaged_data_files):
            return cls(change, at, change.plan(at), number)

    @property
    def transaction(self) -> Transaction:
        return transaction_of(self.plan)

    def stage(self) -> None:
        """Stage the change's files in this process, under the transaction's lease."""
        try:
            with self.transaction.lease():
                self.change.stage(self.plan, self.staged)
        except BaseException as exc:
            # a change that starts Spark tasks waits for them: none runs once stage returned,
            # but one may while it raises
            self._failed(exc, lambda: self.abort(tasks_may_run=self.change.in_tasks))

    def commit(self, written: Sequence[WrittenFile] = ()) -> Committed[R]:
        """Commit what was staged (and ``written``: what tasks staged elsewhere); the report and
        the committed snapshot. On failure, nothing is visible and the attempt is aborted."""
        self.staged.written.extend(written)
        try:
            dataset = self.change.commit(self.plan, self.staged)
        except BaseException as exc:
            self._failed(exc, self.abort)
        committed = self._snapshot_of(dataset)
        return Committed(
            self.change.report(self.plan, self.staged, committed, self.number), committed
        )

    def _failed(self, exc: BaseException, cleanup: Callable[[], object]) -> NoReturn:
        """Raise ``exc`` -- Lance's I/O errors as a StoreError naming the table and the change --
        after ``cleanup``, which never replaces it."""
        txn = self.transaction
        doing = f"commit {'an' if txn.kind[:1] in 'aeiou' else 'a'} {txn.kind} to"
        if self.at is not None and is_damaged_file_error(exc):  # not the store's failure
            error: BaseException = damaged_file_error(
                txn.location.root, doing, self.at.damaged_data_files, exc
            )
        else:
            error = as_store_error(exc, txn.location.root, doing)
        if isinstance(exc, CommitConflictError) and not exc.retryable:
            # Lance's own refusal (a Spark commit has no retry loop to explain it)
            error = exc if isinstance(exc, BlobhouseError) else conflict_error(exc, self.number)
        cleanup_after(error, cleanup)
        if error is exc:
            raise exc
        raise error from exc

    def abort(self, written: Sequence[WrittenFile] = (), *, tasks_may_run: bool = False) -> None:
        """Remove everything the attempt staged (and ``written``: what tasks staged elsewhere);
        ``tasks_may_run``: tasks may still be finishing (see Transaction.abort)."""
        self.staged.written.extend(written)
        self.change.abort(self.plan, self.staged, tasks_may_run=tasks_may_run)

    def end(self) -> None:
        """Release what the plan holds; the attempt is over."""
        self.change.release(self.plan)

    def ending(self, step: Callable[[], T]) -> T:
        """``step()`` (the attempt's last: a commit or an abort), then :meth:`end`, whose failure
        never hides the step's."""
        try:
            result = step()
        except BaseException as exc:
            cleanup_after(exc, self.end)
            raise
        self.end()
        return result

    def run(self) -> Committed[R]:
        """Stage here, then commit: the whole attempt in this process."""

        def stage_and_commit() -> Committed[R]:
            self.stage()
            return self.commit()

        return self.ending(stage_and_commit)

    def __getstate__(self) -> dict[str, Any]:
        # a commit in another process (Spark's) builds the committed snapshot from the
        # transaction's location: the version read is not shipped to every task
        return {**self.__dict__, "at": None}

    def _snapshot_of(self, dataset: LanceDataset) -> TableSnapshot:
        if self.at is None:
            txn = self.transaction
            return TableSnapshot(dataset, txn.location, txn.storage_options)
        return self.at if dataset is self.at.dataset else self.at.at(dataset)


def run_change(
    change: Change[P, R], snapshot: TableSnapshot, *, retries: int = DEFAULT_RETRIES
) -> Committed[R]:
    """Run ``change`` on ``snapshot``: plan, stage under the lease, commit or abort, again on the
    latest version after a preemption (up to ``retries`` times; then, or on a conflict no
    new plan can resolve, :class:`~blobhouse.errors.ConcurrentCommitError`)."""

    retries = SETTINGS["retries"].check(retries)

    def attempt(n: int) -> Committed[R]:
        return Attempt.begin(change, snapshot if n == 1 else snapshot.latest(), n).run()

    return retrying(attempt, retries)


@dataclass(frozen=True)
class OneCommit(BaseChange[Transaction, None]):
    """A change that stages no file of its own: Lance writes and commits it in one call on the
    dataset at the version read (``apply``: a delete, a schema change, a base registration),
    through the transaction (its lease held while Lance runs: gc keeps the files Lance names
    itself; its abort if Lance fails)."""

    kind: str
    apply: Callable[[LanceDataset], object]

    @property
    def reads_rows(self) -> bool:  # type: ignore[override]
        return self.kind != "schema"  # a rename is what repairs a misnamed column

    def plan(self, snapshot: TableSnapshot) -> Transaction:
        return Transaction.start(
            snapshot.location, snapshot.version, snapshot.storage_options, kind=self.kind
        )

    def stage(self, txn: Transaction, staged: Staged) -> None:
        return None

    def commit(self, txn: Transaction, staged: Staged) -> LanceDataset:
        own = txn.read_dataset()  # Lance moves the object it changes: never a snapshot's

        def commit() -> LanceDataset:
            self.apply(own)
            return own

        return txn.commit([], commit=commit)

    def report(self, *_: object) -> None:
        return None


@dataclass(frozen=True)
class ManifestPlan:
    """The manifest update a :class:`ManifestUpdate` commits (None: nothing changes)."""

    table: TableSnapshot
    transaction: Transaction
    operation: LanceOperation.UpdateConfig | None


@dataclass(frozen=True)
class ManifestUpdate(BaseChange[ManifestPlan, None]):
    """A change of the manifest alone (schema, field or config metadata: table properties,
    an imported dataset's meta): no file staged. ``update`` makes it from the version read,
    and again from the latest one when another commit preempts it (Lance refuses a manifest
    update beside another outright, so that conflict is retried too)."""

    kind: str
    update: Callable[[TableSnapshot], LanceOperation.UpdateConfig | None]
    reads_rows = False

    def plan(self, snapshot: TableSnapshot) -> ManifestPlan:
        txn = Transaction.start(
            snapshot.location, snapshot.version, snapshot.storage_options, kind=self.kind
        )
        return ManifestPlan(snapshot, txn, self.update(snapshot))

    def stage(self, plan: ManifestPlan, staged: Staged) -> None:
        return None

    def commit(self, plan: ManifestPlan, staged: Staged) -> LanceDataset:
        operation = plan.operation
        if operation is None:
            return plan.table.dataset
        try:
            return plan.transaction.commit([], lambda: operation)
        except CommitConflictError as exc:
            if exc.retryable or isinstance(exc, ConcurrentCommitError):
                raise
            raise CommitConflictError(str(exc), retryable=True) from exc

    def report(self, *_: object) -> None:
        return None


def commit_once(
    snapshot: TableSnapshot, kind: str, apply: Callable[[LanceDataset], object]
) -> TableSnapshot:
    """Run a :class:`OneCommit` on ``snapshot`` (no retry: Lance retries what it can); the
    committed snapshot.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import write_table
    >>> t = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t")
    >>> commit_once(t.snapshot, "delete", lambda d: d.delete("id = 1")).count_rows()
    1
    """
    return run_change(OneCommit(kind, apply), snapshot, retries=0).snapshot
