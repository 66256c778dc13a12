"""``blobhouse.spark.ingest_lerobot``: the LeRobot import (:mod:`blobhouse.lerobot.ingest`) with
Spark tasks: one job stores the video files (a task per file, up to a few per core), one writes
the frame rows (a task per data file), and the driver commits once. The dataset's folder must
be readable at the same path by every executor (a shared file system, or a local path on one
machine), as for ``blobhouse ingest``'s files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

from blobhouse.errors import cleanup_after
from blobhouse.files.session import WrittenFile
from blobhouse.lerobot.ingest import (
    ImportMode,
    ImportPlan,
    LeRobotImport,
    StoredVideos,
    plan_import,
)
from blobhouse.snapshot import TableSnapshot
from blobhouse.spark.errors import spark_entry_point
from blobhouse.spark.jobs import run_tasks
from blobhouse.write.store_first import BeginRows, run_store_first
from blobhouse.write.table_write import TableWrite


@spark_entry_point
def ingest_lerobot(
    spark: SparkSession,
    dataset: str | os.PathLike,
    table: str,
    *,
    mode: ImportMode = "create",
    storage_options: dict[str, str] | None = None,
    again: bool = False,
) -> LeRobotImport:
    """:func:`blobhouse.lerobot.ingest_lerobot` on Spark: the same table, each video file
    stored once (by whichever task stores it), the frame rows written by a task per data
    file, one commit; a failed task or commit leaves the table as it was and removes what the
    tasks wrote. ``again``: as there (an append of a dataset the table holds)."""
    plan, txn = plan_import(dataset, table, mode, storage_options, again)

    def store() -> StoredVideos:
        return StoredVideos.merged(run_tasks(spark, [[v] for v in plan.source.videos], plan.store))

    def write_rows(stored: StoredVideos, begin: BeginRows) -> TableSnapshot:
        write = plan.begin_write(stored, mode, begin, in_tasks=True)
        try:
            written = run_tasks(
                spark,
                [[path] for path in plan.source.data_files],
                _frames_writer(plan, write.plan, stored),
            )
        except BaseException as exc:
            cleanup_after(exc, lambda: write.ending(lambda: write.abort(tasks_may_run=True)))
            raise
        return write.ending(lambda: write.commit([f for fs in written for f in fs])).snapshot

    _, snapshot = run_store_first(txn, plan.store_step(store), write_rows, tasks_may_run=True)
    return plan.finished(snapshot)


def _frames_writer(
    plan: ImportPlan, write: TableWrite, stored: StoredVideos
) -> Callable[[list[Path]], list[WrittenFile]]:
    """What a task runs: the frame rows of its data files, written as data files."""

    def run(files: list[Path]) -> list[WrittenFile]:
        return write.write(plan.frame_batches(stored.chunks, files))

    return run
