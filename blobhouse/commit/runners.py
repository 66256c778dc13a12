"""Runners: where a change's units of work run -- one after another in this process, or as
Spark tasks -- so that a service with a Spark form is written once.

A service that works unit by unit (update: a fragment each; compaction: a group of fragments
each; verify and gc's mark: a fragment state of a retained version each) hands its units and a
function doing one unit on a version of the table to :meth:`Runner.map`. :data:`HERE` runs them
in this process (reporting progress); ``blobhouse.spark.jobs.SparkTasks`` runs each as a Spark
task, on the same version opened in the task. What the service does with the results (a
change's commit and report: :mod:`blobhouse.commit.change`) is the same either way.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import write_table
>>> table = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t").snapshot
>>> HERE.map(table, lambda t, unit: t.version * unit, [1, 2, 3], "example")
[1, 2, 3]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from blobhouse.progress import Amounts, ProgressCallback, progress_to
from blobhouse.snapshot import one_more_fragment

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

U = TypeVar("U")
T = TypeVar("T")
UnitFn = Callable[["TableSnapshot", Any], T]  # one unit of work on a version of the table
# the (branch, version) a unit reads, when not the table's own: each is opened once here
Where = Callable[[Any], tuple[str | None, int]]


class Runner(Protocol):
    """Runs a service's units: ``fn(table, unit)`` for each of ``units``, results in their
    order, ``table`` at the version ``where(unit)`` names (default: its own). ``into``: each
    result is handed to it as it comes instead (a union, a sum: nothing is kept here; the
    list returned is empty). ``measure``: the rows and bytes a unit holds, for progress.
    ``in_tasks``: elsewhere (Spark tasks, which may still run when a change aborts)."""

    in_tasks: ClassVar[bool]

    def map(
        self,
        table: TableSnapshot,
        fn: UnitFn[T],
        units: Sequence,
        step: str,
        where: Where | None = None,
        into: Callable[[T], None] | None = None,
        measure: Callable[[Any], Amounts] | None = None,
    ) -> list[T]: ...


@dataclass(frozen=True)
class Here:
    """The units one after another in this process, ``progress`` told of each (with the rows
    and bytes ``measure`` finds in the units done); units reading other versions go version
    by version, each version opened once, and again every
    :data:`~blobhouse.snapshot.FRAGMENTS_PER_DATASET` units (what Lance keeps of the files a
    dataset scanned goes with the dataset: :meth:`~blobhouse.snapshot.TableSnapshot.reopened`)."""

    progress: ProgressCallback | None = None
    in_tasks: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "progress", progress_to(self.progress))

    def map(
        self,
        table: TableSnapshot,
        fn: UnitFn[T],
        units: Sequence,
        step: str,
        where: Where | None = None,
        into: Callable[[T], None] | None = None,
        measure: Callable[[Any], Amounts] | None = None,
    ) -> list[T]:
        order = list(range(len(units)))
        if where is not None:
            order.sort(key=lambda i: _sort_key(where(units[i])))
        results: list[Any] = [None] * len(units)
        opened, scanned = table, 0
        so_far = measure(units[order[0]]).zero() if measure and units else Amounts()
        for done, i in enumerate(order):
            self._tell(step, done, len(units), so_far)
            if where is not None:
                at = opened.on_version(*where(units[i]))
                opened, scanned = (at, 1) if at is not opened else one_more_fragment(at, scanned)
            if into is None:
                results[i] = fn(opened, units[i])
            else:
                into(fn(opened, units[i]))
            if measure is not None:
                so_far += measure(units[i])
        if units:
            self._tell(step, len(units), len(units), so_far)
        return results if into is None else []

    def _tell(self, step: str, done: int, total: int, amounts: Amounts) -> None:
        if self.progress is not None:
            self.progress(step, done, total, rows=amounts.rows, bytes=amounts.bytes)


def _sort_key(where: tuple[str | None, int]) -> tuple[str, int]:
    branch, version = where
    return (branch or "", version)


HERE = Here()


def parts_on(
    runner: Runner | None, table: TableSnapshot
) -> Callable[[Callable[[str], T], Sequence[str]], list[T]] | None:
    """Units that need no version of the table (the store index's parts, by URI) run by
    ``runner``, results in their order; None for no runner (the caller's default: here).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import write_table
    >>> table = write_table(pa.table({"id": [1]}), tempfile.mkdtemp() + "/t").snapshot
    >>> parts_on(HERE, table)(str.upper, ["a", "b"])
    ['A', 'B']
    """
    return None if runner is None else _PartsOn(runner, table)


@dataclass(frozen=True)
class _PartsOn:
    runner: Runner
    table: TableSnapshot

    def __call__(self, fn: Callable[[str], T], parts: Sequence[str]) -> list[T]:
        return self.runner.map(self.table, _Part(fn), list(parts), "store index")


@dataclass(frozen=True)
class _Part:
    """One part as a unit (it pickles: a Spark task runs it)."""

    fn: Callable[[str], Any]

    def __call__(self, _table: TableSnapshot, part: str) -> Any:
        return self.fn(part)
