"""What the table services return, typed: plain dicts (``report["removed_files"]`` and JSON
output work as before) whose keys and value types type checkers and editors know, as Lance
types its ``UpdateResult`` and ``Tag``.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array, write_table
>>> t = write_table(pa.table({"img": blob_array([b"x", b"x"])}), tempfile.mkdtemp() + "/t")
>>> report: GcReport = t.gc(dry_run=True)
>>> sorted(GcReport.__annotations__) == sorted(report)
True
"""

from __future__ import annotations

from typing import TypedDict


class FilesAndBytes(TypedDict):
    files: int
    bytes: int


class StoreIndexCleanup(TypedDict):
    """What gc did to the store index's own files."""

    removed_files: int
    removed_bytes: int
    added_bytes: int
    moved_entries: int  # from level 0 into the shards (a dry run does not foresee a move)


class ManagedReport(TypedDict):
    """What gc did (or would do) to the managed external objects the table owns."""

    registered: int
    referenced: int
    retired: int
    doomed: int
    removed: int
    removed_bytes: int
    already_missing: int
    resurrected: int
    waiting: int
    undecided: int
    kept_outside_bases: int
    foreign_entries: int
    kept_owned_elsewhere: int
    kept_unknown_owner: int
    kept_borrowed: int
    kept: list[str]
    given_back: int
    failed: list[str]
    paths: list[str]


class GcReport(TypedDict):
    """:func:`blobhouse.maintenance.garbage_collection.gc`'s report (docs/table-services.md
    says what each key means)."""

    dry_run: bool
    branch: str | None
    removed_versions: list[int]
    retained_versions: list[int]
    kept_tagged_versions: list[int]
    removed_files: int
    reclaimed_bytes: int
    removed_by_lance_cleanup: FilesAndBytes
    removed_by_sweep: FilesAndBytes
    store_index: StoreIndexCleanup
    kept_referenced_files: int
    kept_unreadable: list[str]
    unresolved_references: list[str]
    store_index_unreadable: str | None
    kept_young_files: int
    kept_leased_files: int
    retired_packs: int
    retired_bytes: int
    reaped_packs: int
    resurrected_packs: int
    kept_retired_packs: int
    expired_leases: int
    stale_leftovers: int
    paths: list[str]
    foreign_files: list[str]
    managed: ManagedReport


class CompactionReport(TypedDict):
    """:func:`blobhouse.maintenance.compaction.compact`'s report."""

    read_version: int
    version: int
    fragments_removed: int
    fragments_added: int
    rows: int
    deleted_rows_dropped: int
    bytes_before: int
    bytes_after: int
    repacked_packs: int
    new_store_bytes: int
    unused_store_bytes: int
    duplicate_store_bytes: int
    retired_packs: int
    attempts: int


class MissingObjects(TypedDict):
    """Objects verify found missing, by whose they are."""

    table: int
    managed: int
    unmanaged: int


class VerifyReport(TypedDict):
    """:func:`blobhouse.maintenance.verification.verify`'s report; each problem is a
    :class:`~blobhouse.maintenance.verification.Problem` as a dict."""

    versions: list[int]
    branches: dict[str, list[int]]
    tags: dict[str, dict]
    deep: bool
    references: int
    objects: int
    hashed: int
    unhashed: int
    missing_objects: MissingObjects
    problems: list[dict]


class ExternalUse(TypedDict):
    references: int
    objects: int
    bytes: int


class ExternalReferences(TypedDict):
    managed: ExternalUse
    unmanaged: ExternalUse


class StatsReport(TypedDict):
    """:func:`blobhouse.maintenance.stats.blob_stats`'s report; ``columns`` has one entry per
    blob column (bytes by kind), ``properties`` the table's properties as a dict."""

    version: int
    rows: int
    fragments: int
    deleted_rows: int
    orphan_files: int
    orphan_bytes: int
    logical_bytes: int
    physical_bytes: int
    dedup_ratio: float
    table_owned_bytes: int
    external_bytes: int
    managed_bytes: int
    external_references: ExternalReferences
    deleted_rows_bytes: int
    unresolved_references: int
    old_versions_files: int
    old_versions_bytes: int
    on_disk_bytes: int
    columns: dict[str, dict]
    properties: dict
    moved_from: str | None


class OrphansReport(TypedDict):
    """:func:`blobhouse.maintenance.garbage_collection.orphans`: files the table owns that no
    retained version references."""

    files: int
    bytes: int
    paths: list[str]


class ReclaimableReport(TypedDict):
    """:func:`blobhouse.maintenance.garbage_collection.reclaimable`: what gc's sweep and a
    cleanup of old versions would reclaim."""

    orphan_files: int
    orphan_bytes: int
    orphan_paths: list[str]
    old_versions_files: int
    old_versions_bytes: int


class FailedCreateReport(TypedDict):
    """:func:`blobhouse.maintenance.garbage_collection.clean_failed_create`: gc's keys that
    apply where no table exists, and the files left alone as foreign."""

    dry_run: bool
    failed_create: bool
    branch: None
    removed_versions: list[int]
    retained_versions: list[int]
    kept_tagged_versions: list[int]
    removed_files: int
    reclaimed_bytes: int
    kept_young_files: int
    kept_leased_files: int
    expired_leases: int
    foreign_files: list[str]
    paths: list[str]


class IngestReport(TypedDict):
    """``blobhouse.spark.ingest.ingest``: what was loaded, and the table's stats after."""

    table: str
    manifest: str
    version: int
    mode: str
    dedup: dict[str, str]
    managed: bool
    ingested_rows: int
    files: int
    ingested_bytes: int
    path_columns: list[str]
    tasks: int
    rows: int
    logical_bytes: int
    physical_bytes: int
    dedup_ratio: float
    columns: dict[str, dict]
