"""Runners: where a change's units of work run -- one after another in this process, or as
Spark tasks -- so that a service with a Spark form is written once.

A change that stages files unit by unit (update: a fragment each; compaction: a group of
fragments each) hands its units and a function doing one unit on a version of the table to
:meth:`Runner.map`. :data:`HERE` runs them in this process (reporting progress);
``blobhouse.spark.jobs.SparkTasks`` runs each as a Spark task, on the same version opened in the
task. What the change does with the results, its commit and its report are the same either way
(:mod:`blobhouse.commit.change`).

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

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

U = TypeVar("U")
T = TypeVar("T")
Progress = Callable[[str, int, int], None]
UnitFn = Callable[["TableSnapshot", Any], T]  # one unit of work on a version of the table


class Runner(Protocol):
    """Runs a change's units: ``fn(table, unit)`` for each of ``units``, results in order.
    ``in_tasks``: elsewhere (Spark tasks, which may still run when the change aborts)."""

    in_tasks: ClassVar[bool]

    def map(
        self,
        table: TableSnapshot,
        fn: Callable[[TableSnapshot, Any], T],
        units: Sequence,
        step: str,
    ) -> list[T]: ...


@dataclass(frozen=True)
class Here:
    """The units one after another in this process, ``progress(step, done, total)`` told."""

    progress: Progress | None = None
    in_tasks: ClassVar[bool] = False

    def map(
        self,
        table: TableSnapshot,
        fn: Callable[[TableSnapshot, Any], T],
        units: Sequence,
        step: str,
    ) -> list[T]:
        results = []
        for done, unit in enumerate(units):
            if self.progress:
                self.progress(step, done, len(units))
            results.append(fn(table, unit))
        if self.progress and units:
            self.progress(step, len(units), len(units))
        return results


HERE = Here()
