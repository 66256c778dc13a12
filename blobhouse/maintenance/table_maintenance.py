"""``table.maintenance``: the table services of one :class:`~blobhouse.Table`, grouped as
delta-rs groups ``optimize`` and PyIceberg ``maintenance``, so that the table class stays a
facade. Each takes typed options (:class:`~blobhouse.options.CompactionTargets`,
:class:`~blobhouse.options.CommitOptions`) and returns a typed report
(:mod:`blobhouse.maintenance.reports`).

>>> import tempfile, pyarrow as pa
>>> from blobhouse import CompactionTargets, blob_array, write_table
>>> uri = tempfile.mkdtemp() + "/t"
>>> for i in range(3):
...     t = write_table(pa.table({"img": blob_array([b"x" * 1000])}), uri, mode="append")
>>> t.maintenance.compact(CompactionTargets(target_rows=100))["fragments_removed"]
3
>>> t.maintenance.stats()["fragments"], t.maintenance.verify()["problems"]
(1, [])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from blobhouse.commit.runners import Here
from blobhouse.maintenance import compaction, garbage_collection, verification
from blobhouse.maintenance.reports import CompactionReport, GcReport, StatsReport, VerifyReport
from blobhouse.maintenance.stats import blob_stats
from blobhouse.options import (
    CommitOptions,
    CompactionTargets,
    as_options,
    keywords_checked,
    option_keywords,
)
from blobhouse.progress import ProgressCallback
from blobhouse.snapshot import TableSnapshot


class TableMaintenance:
    """The services of a table: ``current()`` is the version it is at, ``moved_to(snapshot)``
    moves it to the version a service committed."""

    def __init__(
        self,
        current: Callable[[], TableSnapshot],
        moved_to: Callable[[TableSnapshot], object],
    ) -> None:
        self._current = current
        self._moved_to = moved_to

    @keywords_checked
    @option_keywords(targets=CompactionTargets, commit=CommitOptions)
    def compact(
        self,
        targets: CompactionTargets | Mapping[str, Any] | None = None,
        *,
        progress: ProgressCallback | None = None,
        commit: CommitOptions | Mapping[str, Any] | None = None,
    ) -> CompactionReport:
        """Rewrite small fragments and fragments with many deleted rows, keeping blob sharing,
        in one transaction (see :func:`~blobhouse.maintenance.compaction.compact`); a commit a
        concurrent delete or write preempted is run again, up to ``commit.retries`` times.
        Returns what it did, and moves the table to the version it committed. ``targets`` and
        ``commit`` may also be mappings of their fields, or their fields given as keywords
        (``target_rows=...``, ``retries=...``; not both)."""
        done = compaction.run_compaction(
            self._current(),
            as_options(CompactionTargets, targets, "compaction target"),
            Here(progress),
            commit=as_options(CommitOptions, commit, "commit option"),
        )
        self._moved_to(done.snapshot)
        return done.report

    @keywords_checked
    def gc(
        self,
        *,
        retain_versions: int | None = None,
        older_than: timedelta | None = None,
        grace: timedelta | None = None,
        dry_run: bool = False,
        progress: ProgressCallback | None = None,
    ) -> GcReport:
        """Remove old versions and files no retained version references (after ``grace``,
        24 hours by default); see :func:`blobhouse.maintenance.garbage_collection.gc`."""
        return garbage_collection.gc(
            self._current(),
            retain_versions=retain_versions,
            older_than=older_than,
            grace=garbage_collection.DEFAULT_GRACE if grace is None else grace,
            dry_run=dry_run,
            progress=progress,
        )

    @keywords_checked
    def verify(
        self, *, deep: bool = False, progress: ProgressCallback | None = None
    ) -> VerifyReport:
        """Check every blob reference of every retained version (``deep``: and its bytes against
        the hash recorded at write time): problems by version, column, row and path (see
        :func:`blobhouse.maintenance.verification.verify`)."""
        return verification.verify(self._current(), deep=deep, progress=progress)

    def stats(self) -> StatsReport:
        """Per blob column and kind: logical bytes, physical bytes and dedup ratio; fragments,
        rows, deleted rows and orphan files (see :func:`blobhouse.maintenance.stats.blob_stats`)."""
        return blob_stats(self._current())
