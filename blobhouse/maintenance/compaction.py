"""compact: rewrite small fragments and fragments with many deleted rows into files of a target
size, keeping (or re-establishing) blob sharing.

Lance's own ``compact_files`` copies a shared payload once per row. Here the live rows of a group
of fragments go back through the write pipeline with content dedup, so every live payload is
stored once per new data file however many rows share it, packed in the new file's row order;
deleted rows' bytes are dropped; external blobs stay references. The groups are committed as one
Lance ``Rewrite``; if anything fails, what was written is removed and the table is unchanged.

:func:`plan_compaction`, :func:`compact_group` and :func:`commit_compaction` are the three steps;
:func:`compact` runs them here, ``blobhouse.spark.compact`` runs the middle one in Spark tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.optimize import Compaction, RewriteResult
from pyroaring import BitMap64

from blobhouse.commit.change import BaseChange, Committed, Planned, Staged, run_change
from blobhouse.commit.runners import Here, Runner, parts_on
from blobhouse.commit.transaction import (
    Transaction,
    commit_errors,
    lance_commit,
)
from blobhouse.errors import InvalidInputError, StoreIndexError
from blobhouse.files.checksums import written_by_blobhouse
from blobhouse.files.references import leaf_field_ids
from blobhouse.files.session import WrittenFile
from blobhouse.io.objects import object_store
from blobhouse.layout import sidecar_folder
from blobhouse.maintenance.reports import CompactionReport
from blobhouse.maintenance.versions import fragment_references
from blobhouse.options import (
    CommitOptions,
    CompactionTargets,
    keywords_checked,
    option_keywords,
)
from blobhouse.placement import AllowedBases, Kind, MiB
from blobhouse.progress import Amounts, ProgressCallback
from blobhouse.properties import TableProperties
from blobhouse.snapshot import in_fresh_datasets, snapshot_of
from blobhouse.store.duplicates import Duplicates, referenced_duplicates, settle_duplicates
from blobhouse.store.index import indexed_packs, retire_packs
from blobhouse.store.packs import store_base_id, store_uri_prefix
from blobhouse.values import (
    ROW_ADDRESS,
    ColumnPath,
    get_column,
    path_name,
    replace_column,
    stored_blob_columns,
)
from blobhouse.write.carry import INPUT_BLOB_TYPE, carried_schema, logical_values
from blobhouse.write.pipeline import WritePlan, plan_write, write_data_files
from blobhouse.write.prepare import prepared_for_write

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

READ_BYTES = 64 * MiB  # blob bytes read per batch handed to the pipeline


@dataclass(frozen=True)
class CompactionGroup:
    """Fragments rewritten together into new data files (adjacent, in ascending id order). As
    after Lance's ``compact_files``, the new fragments follow the ones left alone."""

    fragment_ids: tuple[int, ...]
    rows: int
    deleted_rows: int
    bytes: int


@dataclass(frozen=True)
class CompactionPlan:
    """What one compaction rewrites, planned against ``read_version``."""

    transaction: Transaction
    groups: tuple[CompactionGroup, ...]
    target_rows: int
    target_bytes: int
    repack: tuple[str, ...] = ()  # store packs with the most dead: their live payloads move out
    unused_bytes: int = 0  # unreferenced bytes of the packs the compacted version references
    # payloads racing writers stored twice (store.duplicates): the bytes of the copies that do
    # not stay, the records read, and the digests that keep copies after this compaction
    duplicate_bytes: int = 0
    duplicate_records: tuple[str, ...] = ()
    unsettled_duplicates: tuple[bytes, ...] = ()
    dead: tuple[str, ...] = ()  # packs the index names that no row of the version read does
    # whether it retires what it repacks: not when the table has branches (another line may
    # still read a pack this one no longer does; gc, which marks every line, retires it)
    retires: bool = True
    global_columns: tuple[str, ...] = ()  # columns written into the table's store
    leave_store: tuple[str, ...] = ()  # columns whose mode is per file: out of the store

    @property
    def fragments(self) -> int:
        return sum(len(g.fragment_ids) for g in self.groups)

    @property
    def read_version(self) -> int:
        return self.transaction.read_version

    @property
    def name_prefix(self) -> str:
        return self.transaction.name_prefix


def plan_compaction(
    table: TableSnapshot,
    targets: CompactionTargets | None = None,
    runner: Runner | None = None,
) -> CompactionPlan:
    """Group the fragments worth rewriting toward ``targets`` (``runner``: where the store
    index's parts are scanned for the packs no row references; default here).

    Store packs (``dedup="global"``) are repacked, the most unreferenced first, until the bytes
    of the packs the current version references that no row references are at most
    ``max_unused`` of the referenced (:meth:`StoreUsage.to_repack`): every fragment referencing
    a repacked pack is rewritten, its live payloads go to new packs, and it is retired (gc
    deletes it once no retained version references it). A payload that racing writers stored
    twice counts as unused in every pack but one (:mod:`blobhouse.store.duplicates`): a
    repacked pack's rows then reference the copy that stays.

    The targets never exceed the table's ``max_rows_per_file`` and ``max_bytes_per_file``
    properties. A fragment is a candidate when it is small (fewer than ``target_rows`` rows and
    ``target_bytes`` bytes, sidecars included) or when at least ``deleted_fraction`` of its rows
    are deleted. Runs of adjacent candidates are grouped up to the targets. A group of one
    fragment with nothing deleted is left alone (rewriting it gains nothing) unless another
    writer wrote it: Lance's own ``compact_files``, for one, stores a shared payload once per
    row, and blobhouse takes such fragments over once to share their payloads again.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for i in range(3):
    ...     t = write_table(pa.table({"b": blob_array([b"x"])}), uri, mode="append")
    >>> [g.fragment_ids for g in plan_compaction(t).groups]
    [(0, 1, 2)]
    """
    targets = targets or CompactionTargets()
    target_rows, target_bytes = targets.target_rows, targets.target_bytes
    properties = TableProperties.of(table.dataset)
    properties.check_writable()  # it rewrites rows by them: never by damaged ones
    if properties.recorded:  # no new data file beyond the table's own limits
        target_rows = min(target_rows, properties.max_rows_per_file)
        target_bytes = min(target_bytes, properties.max_bytes_per_file)
    global_columns, per_file_columns = _columns_by_mode(table)
    usage = StoreUsage.of(table, scan=bool(global_columns))
    has_store = store_base_id(table.dataset) is not None
    duplicates = _duplicates(table, usage) if has_store else Duplicates()
    repack, unused = usage.to_repack(targets.max_unused, duplicates.redundant_bytes)
    retires = has_store and not table.branches()
    dead = _dead_packs(table, usage, runner) if retires else ()
    # rows of a column whose mode changed move: into the store (global now), or out of it
    forced = (
        usage.fragments_using(repack)
        | usage.fragments_per_file(global_columns)
        | usage.fragments_in_store(per_file_columns)
    )
    groups: list[CompactionGroup] = []
    run = _Run()
    indexed = _index_coverage(table)

    def close(run: _Run) -> _Run:
        groups.extend(run.groups(table))
        return _Run()

    for fragment in table.dataset.get_fragments():
        metadata = fragment.metadata
        physical, live = metadata.physical_rows, metadata.num_rows
        size = _fragment_bytes(table, metadata)
        small = physical < target_rows and size < target_bytes
        sparse = physical > 0 and (physical - live) / physical >= targets.deleted_fraction
        if small or sparse or metadata.id in forced:
            live_bytes = size * live // max(physical, 1)
            if run.ids and (
                run.rows + live > target_rows
                or run.live_bytes + live_bytes > target_bytes
                # Lance remaps indices from old row addresses in ascending order to the new
                # rows in order: a group's fragments must keep ascending ids
                or metadata.id < run.ids[-1]
                # and it refuses a group some index covers in part
                or indexed.get(metadata.id) != indexed.get(run.ids[-1])
            ):
                run = close(run)
            run.add(metadata.id, live, physical - live, size, live_bytes, metadata.id in forced)
        else:
            run = close(run)
    close(run)
    return CompactionPlan(
        transaction=Transaction.start(
            table.location, table.version, table.storage_options, kind="compact"
        ),
        groups=tuple(groups),
        repack=tuple(sorted(repack)),
        unused_bytes=unused,
        duplicate_bytes=sum(duplicates.redundant_bytes.values()),
        duplicate_records=duplicates.records,
        unsettled_duplicates=tuple(duplicates.unsettled(repack)),
        dead=dead,
        retires=retires,
        global_columns=tuple(sorted((usage.columns - per_file_columns) | global_columns)),
        leave_store=tuple(sorted(per_file_columns)),
        target_rows=target_rows,
        target_bytes=target_bytes,
    )


def _columns_by_mode(table: TableSnapshot) -> tuple[set[str], set[str]]:
    """The blob columns whose property stores them in the table's store, and those stored per
    data file (a table without recorded properties: neither, its rows stay as they are)."""
    properties = table.properties
    if not properties.recorded:
        return set(), set()
    modes = {c: properties.dedup_of(c) for c in properties.blob_columns}
    return {c for c, m in modes.items() if m == "global"}, {
        c for c, m in modes.items() if m != "global"
    }


def _duplicates(table: TableSnapshot, usage: StoreUsage) -> Duplicates:
    """The recorded duplicates the version references more than once (none if the index
    cannot be read: they wait for a compaction that can)."""
    try:
        return referenced_duplicates(
            table.location.root, usage.ranges, usage.pack_sizes, table.storage_options
        )
    except (ValueError, OSError, StoreIndexError):
        return Duplicates()


def _index_coverage(table: TableSnapshot) -> dict[int, frozenset[str]]:
    """For each indexed fragment, the index segments that cover it."""
    covering: dict[int, set[str]] = {}
    for index in table.dataset.describe_indices():
        for segment in index.segments:
            for fragment_id in segment.fragment_ids:
                covering.setdefault(fragment_id, set()).add(segment.uuid)
    return {fragment_id: frozenset(uuids) for fragment_id, uuids in covering.items()}


@dataclass
class _Run:
    """Adjacent candidate fragments being gathered into a group."""

    ids: list[int] = field(default_factory=list)
    rows: int = 0
    deleted_rows: int = 0
    bytes: int = 0
    live_bytes: int = 0
    forced: bool = False  # it references a pack being repacked

    def add(
        self, fragment_id: int, rows: int, deleted: int, size: int, live_size: int, forced: bool
    ) -> None:
        self.forced |= forced
        self.ids.append(fragment_id)
        self.rows += rows
        self.deleted_rows += deleted
        self.bytes += size
        self.live_bytes += live_size

    def groups(self, table: TableSnapshot) -> list[CompactionGroup]:
        """The group this run makes, or none if rewriting it gains nothing."""
        worth = len(self.ids) > 1 or (
            self.ids and (self.deleted_rows > 0 or self.forced or _foreign(table, self.ids[0]))
        )
        group = CompactionGroup(tuple(self.ids), self.rows, self.deleted_rows, self.bytes)
        return [group] if worth else []


def compact_group(
    table: TableSnapshot, plan: CompactionPlan, group: CompactionGroup
) -> list[WrittenFile]:
    """Write the live rows of one group into new data files (``table`` at
    ``plan.read_version``). Nothing is visible until :func:`commit_compaction`; on failure the
    files written so far are removed."""
    write = replace(_write_plan(table, plan), store_digests={})
    return write_data_files(
        _logical_batches(table, plan, group.fragment_ids, write.store_digests),
        write,
        table.location,
        table.storage_options,
        plan.name_prefix,
    )


def commit_compaction(
    table: TableSnapshot, plan: CompactionPlan, written: Sequence[Sequence[WrittenFile]]
) -> LanceDataset:
    """Replace each group's fragments by its new files in one Lance ``Rewrite`` transaction.

    ``written[i]`` are the files of ``plan.groups[i]``. A table with indices commits through
    Lance's own compaction commit, which remaps every index (scalar, vector) from the old rows
    to the new ones in the same transaction, after reserving the new fragments' ids (a version
    of its own, as Lance's ``compact_files`` makes). A concurrent write that conflicts (a delete
    on a rewritten fragment, say) makes the commit fail; the caller then removes the new
    files."""
    dataset = table.dataset
    location, options = table.location, table.storage_options
    if len(written) != len(plan.groups):
        raise InvalidInputError(f"{len(written)} results for {len(plan.groups)} groups")
    if dataset.describe_indices():
        rewrites = [
            _rewrite_result(table, plan, group, files)
            for group, files in zip(plan.groups, written, strict=True)
        ]

        def commit() -> LanceDataset:
            with commit_errors(location, plan.read_version, options):
                # an object of its own: Lance moves the dataset it commits to the new version
                target = lance.dataset(
                    location.dataset_path, version=plan.read_version, storage_options=options
                )
                Compaction.commit(target, rewrites)
            return target
    else:
        fragments = {f.fragment_id: f.metadata for f in dataset.get_fragments()}
        ids = leaf_field_ids(dataset.lance_schema.fields())
        groups = [
            LanceOperation.RewriteGroup(
                old_fragments=[fragments[i] for i in group.fragment_ids],
                new_fragments=[w.fragment(ids) for w in files],
            )
            for group, files in zip(plan.groups, written, strict=True)
        ]

        def commit() -> LanceDataset:
            rewrite = LanceOperation.Rewrite(groups, [])
            return lance_commit(location, lambda: rewrite, plan.read_version, options)

    committed = plan.transaction.commit(
        [w for files in written for w in files],
        commit=commit,
        superseded=frozenset(plan.repack),
    )
    retire_dead(table, plan, plan.repack, found=found_packs(written))
    return committed


def retired_by(plan: CompactionPlan, repacked: Sequence[str], found: frozenset[str]) -> list[str]:
    """The packs a compaction retires: those it ``repacked`` and those it found dead, but
    none its rewrite ``found`` a payload in (and none when it retires nothing)."""
    if not plan.retires:
        return []
    return [p for p in dict.fromkeys([*repacked, *plan.dead]) if p not in found]


def found_packs(written: Sequence[Sequence[WrittenFile]]) -> frozenset[str]:
    """The store packs the rewritten rows reference because their writes found a payload
    there (a dead pack among them is alive again)."""
    return frozenset(p for files in written for w in files for p in w.found_packs)


def retire_dead(
    table: TableSnapshot,
    plan: CompactionPlan,
    repacked: Sequence[str] = (),
    found: frozenset[str] = frozenset(),
) -> None:
    """Retire the packs no current row references (repacked ones, and those deletes left
    dead, but those the rewrite ``found`` a payload in and references again) unless the
    table has branches: writers stop finding them, and gc deletes them once no retained
    version does -- in its next run past the grace, not a run later (docs/global-dedup.md).
    On main, the records of duplicates are replaced by one of those it leaves stored twice."""
    root, options = table.location.root, table.storage_options
    if plan.retires:
        retire_packs(root, retired_by(plan, repacked, found), options)
    if table.location.branch is None:  # a branch's rows say nothing of main's copies
        settle_duplicates(root, plan.duplicate_records, plan.unsettled_duplicates, options)


def _dead_packs(table: TableSnapshot, usage: StoreUsage, runner: Runner | None) -> tuple[str, ...]:
    """The packs the store's index names that the version read references nowhere (an
    unreadable index: none, gc decides); each part of the index a unit of ``runner``."""
    try:
        each_part = parts_on(runner, table)
        indexed = indexed_packs(table.location.root, table.storage_options, each_part)
    except StoreIndexError:
        return ()
    return tuple(sorted(indexed - set(usage.ranges)))


def _rewrite_result(
    table: TableSnapshot, plan: CompactionPlan, group: CompactionGroup, files: Sequence
) -> RewriteResult:
    """What Lance's compaction commit takes for one group: the old and new fragments, and the
    live rows of the old ones (their row addresses, ascending: the new files hold them in that
    order), from which it maps every index entry to its new row."""
    dataset = table.dataset
    old = [dataset.get_fragment(i) for i in group.fragment_ids]
    live = BitMap64()
    for at, run in in_fresh_datasets(table, group.fragment_ids):
        for fragment_id in run:
            fragment = at.dataset.get_fragment(fragment_id)
            scan = at.dataset.scanner(columns=[], with_row_address=True, fragments=[fragment])
            for batch in scan.to_batches():
                live.update(batch.column(ROW_ADDRESS).to_numpy())
    ids = leaf_field_ids(dataset.lance_schema.fields())
    new = [w.fragment(ids) for w in files]
    if len(live) != sum(f.physical_rows for f in new):
        raise InvalidInputError(
            f"compaction of fragments {list(group.fragment_ids)}: {len(live)} live rows, but "
            f"the new files hold {sum(f.physical_rows for f in new)}"
        )
    result = {
        "metrics": {
            "fragments_removed": len(old),
            "fragments_added": len(new),
            "files_removed": sum(len(f.metadata.files) for f in old),
            "files_added": len(new),
        },
        "new_fragments": [f.to_json() for f in new],
        "read_version": plan.read_version,
        "original_fragments": [f.metadata.to_json() for f in old],
        "row_addrs": list(live.serialize()),
    }
    return RewriteResult.from_json(json.dumps(result))


@keywords_checked
@option_keywords(targets=CompactionTargets, commit=CommitOptions)
def compact(
    table: TableSnapshot,
    targets: CompactionTargets | None = None,
    *,
    progress: ProgressCallback | None = None,
    runner: Runner | None = None,
    commit: CommitOptions | None = None,
) -> CompactionReport:
    """Plan, rewrite and commit a compaction toward ``targets``; returns what it did.
    ``runner`` writes the new files of every group (default: one group after another in this
    process, telling ``progress``; Spark runs them as tasks). If anything fails, every file the
    compaction wrote is removed. A commit that a concurrent delete or write preempted (Lance's
    retryable conflict) is planned and run again on the latest version, up to
    ``commit.retries`` times. The fields of ``targets`` and ``commit`` may be given as keywords
    instead (``target_rows=...``).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, open_table, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for i in range(3):  # three appends of the same 100 kB payload: three stored copies
    ...     t = write_table(pa.table({"b": blob_array([b"x" * 100_000])}), uri, mode="append",
    ...                     dedup="content")
    >>> report = compact(t)
    >>> report["fragments_removed"], report["fragments_added"]
    (3, 1)
    >>> open_table(uri).stats()["physical_bytes"]  # one copy again
    100000
    """
    return run_compaction(
        snapshot_of(table), targets or CompactionTargets(), runner or Here(progress), commit=commit
    ).report


def run_compaction(
    table: TableSnapshot,
    targets: CompactionTargets,
    runner: Runner,
    *,
    commit: CommitOptions | None = None,
) -> Committed[CompactionReport]:
    """:func:`compact` run by ``runner``: its report and the committed snapshot."""
    if table.dataset.has_stable_row_ids:
        raise InvalidInputError(
            f"{table.location} uses stable row ids; blobhouse compaction does not carry them "
            "over (Lance's compact_files does, without keeping blob sharing)"
        )
    table = prepared_for_write(table, "global" if _columns_by_mode(table)[0] else "content")
    retries = (commit or CommitOptions()).retries
    return run_change(_Compaction(targets, runner), table, retries=retries)


@dataclass(frozen=True)
class _Compaction(BaseChange):
    """A compaction as a :class:`~blobhouse.commit.change.Change`."""

    targets: CompactionTargets
    runner: Runner

    @property
    def in_tasks(self) -> bool:  # type: ignore[override]
        return self.runner.in_tasks

    def plan(self, snapshot: TableSnapshot) -> Planned[CompactionPlan]:
        return Planned(snapshot, plan_compaction(snapshot, self.targets, self.runner))

    def stage(self, run: Planned[CompactionPlan], staged: Staged) -> None:
        plan = run.plan
        groups = (
            self.runner.map(
                run.table,
                lambda at, g: compact_group(at, plan, g),
                plan.groups,
                "compact",
                measure=lambda group: Amounts(group.rows, group.bytes),
            )
            if plan.groups
            else []
        )
        staged.written.extend(w for group in groups for w in group)
        staged.detail = groups

    def commit(self, run: Planned[CompactionPlan], staged: Staged) -> LanceDataset:
        if not run.plan.groups:  # nothing to rewrite; what deletes left dead is retired
            retire_dead(run.table, run.plan)
            return run.table.dataset
        return commit_compaction(run.table, run.plan, staged.detail)

    def report(
        self, run: Planned[CompactionPlan], staged: Staged, committed: TableSnapshot, attempt: int
    ) -> CompactionReport:
        return report(committed.version, run.plan, staged.detail) | {"attempts": attempt}


def report(version: int, plan: CompactionPlan, written: Sequence[Sequence[WrittenFile]]) -> dict:
    """What a compaction did, for people and for ``--json``."""
    files = [w for group in written for w in group]
    return {
        "read_version": plan.read_version,
        "version": version,
        "fragments_removed": plan.fragments,
        "fragments_added": len(files),
        "rows": sum(g.rows for g in plan.groups),
        "deleted_rows_dropped": sum(g.deleted_rows for g in plan.groups),
        "bytes_before": sum(g.bytes for g in plan.groups),
        "bytes_after": sum(w.size_bytes + w.sidecar_bytes for w in files),
        "repacked_packs": len(plan.repack),
        "new_store_bytes": sum(s.size for w in files for s in w.stored),
        "unused_store_bytes": plan.unused_bytes,
        "duplicate_store_bytes": plan.duplicate_bytes,
        "retired_packs": len(retired_by(plan, plan.repack, found_packs(written))),
    }


def _write_plan(table: TableSnapshot, plan: CompactionPlan) -> WritePlan:
    schema = table.schema
    paths = stored_blob_columns(schema)
    input_schema = carried_schema(schema, paths)
    write = plan_write(
        input_schema,
        table_schema=schema,
        dedup={path_name(p): _mode(path_name(p), plan) for p in paths},
        allowed_bases=AllowedBases.of_table(schema, table.uri),
        max_rows_per_file=plan.target_rows,
        max_bytes_per_file=plan.target_bytes,
    )
    # references into the table's own store stay store references
    # each group has a store writer of its own (a Spark task, or one after another): they
    # claim the payloads they store, so that one several groups hold is stored once
    return replace(
        write,
        store_base_id=store_base_id(table.dataset),
        avoid_packs=frozenset(plan.repack),
        claim_payloads=True,
    )


def _mode(column: str, plan: CompactionPlan) -> str:
    # a column whose mode is global, or whose rows reference the store, stores there (repacked
    # payloads too); the others share payloads per file
    return "global" if column in plan.global_columns else "content"


def _logical_batches(
    table: TableSnapshot,
    plan: CompactionPlan,
    fragment_ids: Sequence[int],
    store_digests: dict[tuple[str, int, int], bytes] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The live rows of ``fragment_ids`` in order, blob columns as logical values: bytes for
    what the table stores (checked against their recorded hashes), the reference for external
    blobs. Each run of fragments is read in a dataset object of its own, with hash lists of
    its own (:func:`~blobhouse.snapshot.in_fresh_datasets`): the commit retires these files,
    nothing read of them is worth keeping, and memory stays flat however many there are."""
    paths = stored_blob_columns(table.schema)
    prefix = store_uri_prefix(table.uri)
    repack = frozenset(f"{prefix}{p}" for p in plan.repack)
    leave = {tuple(c.split(".")) for c in plan.leave_store}
    for at, run in in_fresh_datasets(table, fragment_ids):
        hashes = at.recorded_hashes(shared=False)
        scanner = at.dataset.scanner(
            fragments=[at.dataset.get_fragment(i) for i in run],
            with_row_address=True,
            scan_in_order=True,
        )
        for batch in scanner.to_batches():
            for piece in _pieces(batch, paths):
                for path in paths:
                    piece = replace_column(
                        piece,
                        path,
                        logical_values(
                            at, path, piece, hashes, repack, path in leave, store_digests
                        ),
                        pa.field(path[-1], INPUT_BLOB_TYPE),
                    )
                yield piece.drop_columns([ROW_ADDRESS])


def _pieces(batch: pa.RecordBatch, paths: list[ColumnPath]) -> Iterator[pa.RecordBatch]:
    """Slices of ``batch`` whose blobs add up to about :data:`READ_BYTES` (one row at least)."""
    sizes = np.zeros(batch.num_rows, dtype=np.int64)
    for path in paths:
        sizes += get_column(batch, path).field("size").fill_null(0).to_numpy().astype(np.int64)
    ends = np.cumsum(sizes)
    start = 0
    while start < batch.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + READ_BYTES, side="right")))
        yield batch.slice(start, stop - start)
        start = stop


@dataclass
class StoreUsage:
    """Which packs of the table's store the current version uses: the distinct ranges it
    references in each, which fragments reference each, and which columns reference any."""

    ranges: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    fragments: dict[str, set[int]] = field(default_factory=dict)
    columns: set[str] = field(default_factory=set)
    pack_sizes: dict[str, int] = field(default_factory=dict)
    # column -> fragments holding payloads of it in their own files (inline, packed, dedicated)
    per_file: dict[str, set[int]] = field(default_factory=dict)
    # column -> fragments referencing the store for it
    in_store: dict[str, set[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, table: TableSnapshot, scan: bool = False) -> StoreUsage:
        """The usage of the current version (``scan``: also without a store, for
        :attr:`per_file`)."""
        usage = cls()
        if store_base_id(table.dataset) is None and not scan:
            return usage
        prefix = store_uri_prefix(table.uri)
        ids = [f.fragment_id for f in table.dataset.get_fragments()]
        for at, run in in_fresh_datasets(table, ids):
            for fragment_id in run:
                usage._add(at, fragment_id, prefix)
        store = object_store(prefix, table.storage_options)
        for pack in usage.ranges:
            usage.pack_sizes[pack] = store.size(f"{prefix}{pack}") or 0
        return usage

    def _add(self, table: TableSnapshot, fragment_id: int, prefix: str) -> None:
        """Add what one fragment references (``prefix``: the store's)."""
        for batch in fragment_references(table, fragment_id):
            sizes = batch.refs.field("size").to_numpy(zero_copy_only=False)
            if ((batch.kinds <= int(Kind.DEDICATED)) & (sizes > 0)).any():
                self.per_file.setdefault(batch.column, set()).add(fragment_id)
            refs = zip(
                batch.refs.field("uri").to_pylist(),
                batch.refs.field("position").to_pylist(),
                batch.refs.field("size").to_pylist(),
                strict=True,
            )
            for uri, position, size in refs:
                if uri.startswith(prefix):
                    pack = uri.removeprefix(prefix)
                    self.ranges.setdefault(pack, set()).add((position, size))
                    self.fragments.setdefault(pack, set()).add(fragment_id)
                    self.columns.add(batch.column)
                    self.in_store.setdefault(batch.column, set()).add(fragment_id)

    def to_repack(
        self, max_unused: float, redundant: Mapping[str, int] | None = None
    ) -> tuple[set[str], int]:
        """The packs to repack so that the unreferenced bytes of the packs the current version
        references are at most ``max_unused`` of the referenced ones, the most unreferenced
        first (each byte rewritten buys back the most), and the unreferenced bytes left.
        ``redundant``: by pack, referenced bytes that are copies of payloads another pack
        holds too (they count as unreferenced: the rows can reference the other copy).

        >>> usage = StoreUsage(ranges={"a": {(0, 10)}, "b": {(0, 90)}})
        >>> usage.pack_sizes = {"a": 100, "b": 100}
        >>> usage.to_repack(0.1)  # 100 referenced, 100 not: a (90 dead) leaves b's 10
        ({'a'}, 10)
        >>> sorted(usage.to_repack(0.05)[0])  # 10 is more than 5% of 100
        ['a', 'b']
        >>> twice = StoreUsage(ranges={"a": {(0, 90)}, "b": {(0, 90)}})  # the same 90 bytes
        >>> twice.pack_sizes = {"a": 100, "b": 100}
        >>> twice.to_repack(0.2, {"b": 90})  # b's copies count as unused: b goes, a's 10 stay
        ({'b'}, 10)
        """
        redundant = redundant or {}
        live = {pack: sum(size for _, size in ranges) for pack, ranges in self.ranges.items()}
        dead = {
            pack: max(self.pack_sizes[pack] - live[pack], 0) + redundant.get(pack, 0)
            for pack in live
        }
        unique = sum(live.values()) - sum(redundant.values())
        unused, budget = sum(dead.values()), max_unused * unique
        chosen: set[str] = set()
        for pack in sorted(dead, key=lambda p: (-dead[p] / max(self.pack_sizes[p], 1), p)):
            if unused <= budget or not dead[pack]:
                break
            chosen.add(pack)
            unused -= dead[pack]
        return chosen, unused

    def fragments_using(self, packs: set[str]) -> set[int]:
        return set().union(*(self.fragments[p] for p in packs))

    def fragments_per_file(self, columns: set[str]) -> set[int]:
        """Fragments holding payloads of ``columns`` in their own files."""
        return set().union(*(self.per_file.get(c, set()) for c in columns))

    def fragments_in_store(self, columns: set[str]) -> set[int]:
        """Fragments referencing the store for ``columns``."""
        return set().union(*(self.in_store.get(c, set()) for c in columns))


def _foreign(table: TableSnapshot, fragment_id: int) -> bool:
    """Whether a data file of the fragment was written by another writer than blobhouse."""
    files = table.dataset.get_fragment(fragment_id).metadata.files
    return not all(
        written_by_blobhouse(table.data_file_uri(f), table.storage_options) for f in files
    )


def _fragment_bytes(table: TableSnapshot, metadata) -> int:
    """Bytes of a fragment's data files and their sidecars."""
    store = object_store(table.uri, table.storage_options)
    total = 0
    for data_file in metadata.files:
        uri = table.data_file_uri(data_file)
        total += store.size(uri) or 0
        total += sum(info.size for info in store.list(sidecar_folder(uri)))
    return total
