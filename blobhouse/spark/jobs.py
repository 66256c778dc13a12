"""Table services on Spark: the units of work of ``blobhouse.maintenance`` (and of backfill) run
as Spark tasks; the driver plans and commits, exactly as the Python entry points do.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array, write_table
>>> uri = tempfile.mkdtemp() + "/t"
>>> for i in range(3):
...     _ = write_table(pa.table({"b": blob_array([b"x" * 100_000])}), uri, mode="append")
>>> compact(spark, uri)["fragments_removed"]
3
>>> verify(spark, uri, deep=True)["problems"]
[]
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import SparkSession

from blobhouse.commit.interrupts import _INTERRUPT_HOOKS
from blobhouse.commit.runners import UnitFn, Where
from blobhouse.layout import TableLocation
from blobhouse.maintenance import gc as gc_table
from blobhouse.maintenance.compaction import (
    run_compaction,
)
from blobhouse.maintenance.garbage_collection import DEFAULT_GRACE
from blobhouse.maintenance.reports import CompactionReport, GcReport, VerifyReport
from blobhouse.maintenance.verification import verify as verify_table
from blobhouse.maintenance.versions import VersionRef
from blobhouse.options import CommitOptions, CompactionTargets, option_keywords
from blobhouse.progress import Amounts, Progress, ProgressCallback, progress_to
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import TableSnapshot, open_snapshot
from blobhouse.spark.errors import spark_entry_point

Unit = TypeVar("Unit")
_RESULT = pa.schema([("index", pa.int64()), ("result", pa.binary())])


# units are spread over at most this many tasks per core of the cluster: a task costs Spark
# ~0.1-0.3 s whatever it does, and a fragment state of a table grown by small appends takes
# milliseconds (verify of 500 states took 189 s as 500 tasks on local[2])
TASKS_PER_CORE = 4


def run_tasks(spark: SparkSession, units: Sequence[Unit], fn: Callable[[Unit], Any]) -> list:
    """``fn(unit)`` for every unit, in Spark tasks (one per unit, or up to
    :data:`TASKS_PER_CORE` per core of the cluster when there are more units); results in
    order.

    Units and results travel pickled; ``fn`` is shipped to the executors with its closure.
    """
    if not units:
        return []
    tasks = min(len(units), spark.sparkContext.defaultParallelism * TASKS_PER_CORE)
    rows = [(i, pickle.dumps(u)) for i, u in enumerate(units)]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index, unit in zip(
                batch["index"].to_pylist(), batch["unit"].to_pylist(), strict=True
            ):
                result = pickle.dumps(fn(pickle.loads(unit)))
                yield pa.record_batch({"index": [index], "result": [result]}, schema=_RESULT)

    frame = spark.createDataFrame(rows, "index long, unit binary").repartition(tasks)
    results = [None] * len(units)
    for index, result in frame.mapInArrow(run, "index long, result binary").collect():
        results[index] = pickle.loads(result)
    return results


@spark_entry_point
@option_keywords(targets=CompactionTargets, commit=CommitOptions)
def compact(
    spark: SparkSession,
    uri: str,
    targets: CompactionTargets | None = None,
    *,
    storage_options: dict[str, str] | None = None,
    commit: CommitOptions | None = None,
    branch: str | None = None,
) -> CompactionReport:
    """:func:`~blobhouse.maintenance.compaction.compact` with a Spark task per group of
    fragments and one commit on the driver; if a task or the commit fails, the new files are
    removed (a preempted commit is run again, up to ``commit.retries`` times). The fields of
    ``targets`` and ``commit`` may be given as keywords instead (``target_rows=...``)."""

    return run_compaction(
        open_snapshot(uri, None, storage_options, branch=branch),
        targets or CompactionTargets(),
        SparkTasks(spark),
        commit=commit,
    ).report


@spark_entry_point
def verify(
    spark: SparkSession,
    uri: str,
    *,
    deep: bool = False,
    storage_options: dict[str, str] | None = None,
) -> VerifyReport:
    """:func:`blobhouse.maintenance.verification.verify` with a Spark task per fragment state
    (of every branch)."""
    deep = SETTINGS["deep"].check(deep)
    table = open_snapshot(uri, None, storage_options)
    table.check_column_names()  # as Table.verify: the one repair, before any task
    return verify_table(table, deep=deep, runner=SparkTasks(spark))


@spark_entry_point
def gc(
    spark: SparkSession,
    uri: str,
    *,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    storage_options: dict[str, str] | None = None,
    branch: str | None = None,
) -> GcReport:
    """:func:`~blobhouse.maintenance.garbage_collection.gc` with the mark phase (which files
    retained versions of every branch reference) in a Spark task per fragment state; versions
    and the sweep run on the driver."""
    return gc_table(
        open_snapshot(uri, None, storage_options, branch=branch),
        retain_versions=retain_versions,
        older_than=older_than,
        grace=grace,
        dry_run=dry_run,
        runner=SparkTasks(spark),
    )


@dataclass(frozen=True)
class _Opener:
    """Opens versions of a table in Spark tasks: the location was resolved on the driver (an
    executor's working directory is not the driver's), and it pickles."""

    location: TableLocation
    storage_options: dict[str, str] | None

    @classmethod
    def of(cls, table: TableSnapshot) -> _Opener:
        return cls(table.location, table.storage_options)

    def open(self, version: int) -> TableSnapshot:
        """The table's own branch at ``version``."""
        return self.open_ref(VersionRef(self.location.branch, version))

    def open_ref(self, ref: VersionRef) -> TableSnapshot:
        """The table at ``ref``, refused as :func:`~blobhouse.maintenance.versions.open_version`
        refuses it when Lance cannot read a column's name (the current version's is checked
        on the driver)."""
        opened = open_snapshot(self.location.on(ref.branch), ref.version, self.storage_options)
        opened.check_column_names(retained=True)
        return opened


@dataclass(frozen=True)
class SparkTasks:
    """A :class:`~blobhouse.commit.runners.Runner` running each unit as a Spark task, on the
    table's version opened in the task (:class:`_Opener`)."""

    spark: SparkSession
    in_tasks: ClassVar[bool] = True

    def map(
        self,
        table: TableSnapshot,
        fn: UnitFn[T],
        units: Sequence,
        step: str,
        where: Where | None = None,
        into: Callable[[T], None] | None = None,
        measure: Callable[[Any], Amounts] | None = None,  # progress is the job's, by task
    ) -> list[T]:
        at, own = _Opener.of(table), (table.branch, table.version)

        def run(unit: Any) -> T:
            return fn(at.open_ref(VersionRef(*(where(unit) if where else own))), unit)

        results = run_tasks(self.spark, list(units), run)
        if into is None:
            return results
        for result in results:
            into(result)
        return []


T = TypeVar("T")


class _AmountsParam(AccumulatorParam):
    def zero(self, value: Amounts) -> Amounts:
        return Amounts(0, 0)

    def addInPlace(self, value1: Amounts, value2: Amounts) -> Amounts:
        return value1 + value2


def amounts_counter(spark) -> Accumulator:
    """An accumulator that a Spark job's tasks ``add(Amounts(rows=, bytes=))`` to, for
    :func:`run_spark_job`'s progress (Spark hands a task's additions to the driver when the
    task ends; a retried task's are counted again).

    >>> from blobhouse.spark import local_session
    >>> counter = amounts_counter(local_session())
    >>> counter.add(Amounts(rows=3, bytes=100)); counter.value
    Amounts(rows=3, bytes=100)
    """
    return spark.sparkContext.accumulator(Amounts(0, 0), _AmountsParam())


def counted_batches(
    batches: Iterable[pa.RecordBatch], counter: Accumulator | None, columns: Sequence[str] = ()
) -> Iterator[pa.RecordBatch]:
    """``batches`` passed on (in a Spark task), the rows and the bytes of each (of its
    ``columns``, or all of it) added to ``counter`` (None: passed on only)."""
    for batch in batches:
        if counter is not None:
            held = [batch.column(c) for c in columns] if columns else batch.columns
            counter.add(Amounts(batch.num_rows, sum(map(_held_bytes, held))))
        yield batch


def _held_bytes(array: pa.Array) -> int:
    """The bytes of a binary column's values (its offsets left out), else its Arrow size."""
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        return pc.sum(pc.binary_length(array)).as_py() or 0
    return array.nbytes


def run_spark_job(
    spark,
    job: Callable[[], T],
    *,
    step: str = "spark",
    progress: ProgressCallback | None = None,
    counted: Accumulator | None = None,
) -> T:
    """Run ``job`` (Spark actions) so that Ctrl-C stops it cleanly.

    The actions run in a thread of their own, under a Spark job group; the calling thread
    waits, reporting the running stages' tasks to ``progress`` (with the rows and bytes the
    finished tasks added to ``counted``, an :func:`amounts_counter`). On Ctrl-C
    (``KeyboardInterrupt`` in the waiting thread) the group's jobs are cancelled and the thread
    is awaited -- a cancelled write returns only after its ``abort`` removed what the tasks
    staged -- then ``KeyboardInterrupt`` is raised again. A second Ctrl-C stops the waiting.
    Called outside the main thread (where no Ctrl-C arrives), ``job`` simply runs.
    """
    if threading.current_thread() is not threading.main_thread():
        return job()
    from pyspark.util import InheritableThread

    context = spark.sparkContext
    group = f"blobhouse-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            _make_active(spark)
            context.setJobGroup(group, step, interruptOnCancel=True)
            outcome["value"] = job()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            finished.set()

    thread = InheritableThread(target=target, daemon=True)
    thread.start()
    report = progress_to(progress)
    if report is not None:
        report.begin(step)  # its rate counts from here, not from the first poll
    watcher = _StageWatcher(context, group, step, report, counted) if report else None
    try:
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt:
        for hook in list(_INTERRUPT_HOOKS):
            with contextlib.suppress(Exception):
                hook()
        if watcher:
            watcher.stop()
        try:
            context.cancelJobGroup(group)
            while not finished.wait(0.1):
                pass
        except KeyboardInterrupt:
            pass  # asked twice: stop waiting for the cleanup
        raise KeyboardInterrupt from None
    if watcher:
        watcher.stop(finished="error" not in outcome)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _make_active(spark) -> None:
    """Make ``spark`` the JVM's active session in this thread: Spark finds Python data sources
    (``blobhouse``) through the active session, which a new thread does not have
    (docs/spark-cluster.md, Threads)."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


class _StageWatcher:
    """Polls Spark's status tracker for the tasks of a job group (its own thread, so Ctrl-C
    never lands inside one of its calls to the JVM)."""

    def __init__(
        self, context, group: str, step: str, progress: Progress, counted: Accumulator | None
    ) -> None:
        self.context, self.group, self.step, self.progress = context, group, step, progress
        self.counted = counted
        self.stopped = threading.Event()
        self.last: tuple[int, int] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            tracker = self.context.statusTracker()
            while not self.stopped.wait(0.5):
                done, total = self._tasks(tracker)
                if not self.stopped.is_set():
                    self._update(done, total)
        except Exception:  # progress is a courtesy: a failed poll ends it quietly
            return

    def _tasks(self, tracker) -> tuple[int, int]:
        """The group's tasks done and in all, over its jobs' stages."""
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def _update(self, done: int, total: int) -> None:
        if not total or (done, total) == self.last:
            return
        if self.last is None and done:
            self._tell(0, total)  # logs get a line when a step starts
        self.last = (done, total)
        self._tell(done, total)

    def stop(self, finished: bool = False) -> None:
        """Stop polling; ``finished``: the job succeeded, so its bar is shown full (a job
        quicker than a poll is asked for its tasks once now)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.thread.join(timeout=2)
        if not finished:
            return
        total = self.last[1] if self.last is not None else 0
        if not total:
            with contextlib.suppress(Exception):
                total = self._tasks(self.context.statusTracker())[1]
        self._update(total, total)

    def _tell(self, done: int, total: int) -> None:
        amounts = Amounts()
        if self.counted is not None:  # the start line: nothing done yet
            amounts = self.counted.value if done else Amounts(0, 0)
        self.progress(self.step, done, total, rows=amounts.rows, bytes=amounts.bytes)
