"""Table services: statistics, verification, garbage collection and compaction.

Each service is one module (``stats``, ``verification``, ``garbage_collection``, ``compaction``);
``walk`` is how they visit a table's retained versions. Every
service that grows with the table splits its work into units a Spark task can run
(``blobhouse.spark`` runs them in parallel); the Python entry points run the same units in
this process.
"""

from blobhouse.maintenance.compaction import compact
from blobhouse.maintenance.garbage_collection import (
    DEFAULT_GRACE,
    clean_failed_create,
    gc,
    gc_at,
    orphans,
)
from blobhouse.maintenance.reports import CompactionReport, GcReport, StatsReport, VerifyReport
from blobhouse.maintenance.stats import blob_stats
from blobhouse.maintenance.verification import Problem, verify

__all__ = [
    "DEFAULT_GRACE",
    "CompactionReport",
    "GcReport",
    "Problem",
    "StatsReport",
    "VerifyReport",
    "blob_stats",
    "clean_failed_create",
    "compact",
    "gc",
    "gc_at",
    "orphans",
    "verify",
]
