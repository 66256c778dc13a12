"""gc: remove old versions, then every file the table owns that no retained version of any
branch references once it is older than a grace period.

What the table owns (data files, their sidecars, leftovers of writes that never committed) lives
under ``data/`` and each branch's ``tree/<branch>/data/``, and store packs under
``_blobs/packs/``; external objects under the table's allowed bases belong to the user and are
never looked at, unless a committed write handed them to the table (managed objects, reclaimed
by the rules of :class:`blobhouse.managed.Reclaim`). The mark phase (:func:`referenced_paths`)
covers every retained version of main and of every branch (tagged versions among them: Lance
keeps those), per :class:`~blobhouse.maintenance.versions.FragmentState`, here or in Spark tasks
(``blobhouse.spark.gc``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Container, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from blobhouse.commit import leases, locks
from blobhouse.commit.runners import Here, Runner, parts_on
from blobhouse.errors import (
    BlobhouseError,
    LeftoverError,
    StoreIndexError,
    TableNotFoundError,
)
from blobhouse.files.transactions import UnreadTransaction, remembered_names, transaction_name
from blobhouse.io.leftovers import BREAK, Found, clear_once, folder_leftovers
from blobhouse.io.objects import (
    ObjectInfo,
    StorageOptions,
    in_pages,
    is_local,
    object_store,
    uri_to_path,
)
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    CLAIMS,
    CREATE_DIRS,
    DATA_FOLDER_FILE,
    DELETIONS_DIR,
    DOOMED_DIR,
    INDEX_DIR,
    INDEX_SHARDS_DIR,
    INDICES_DIR,
    LANCE_DIRS,
    LEASE_FILE,
    LEASES_DIR,
    LOCKS_DIR,
    MANAGED_DIR,
    OWNED_FILE_NAMES,
    PACKS,
    REGISTRY_DIR,
    STAGED_BY_A_WRITE,
    STORE_DIR,
    STORED,
    TRANSACTIONS_DIR,
    TREE_DIR,
    UNREFERENCED_DIR,
    VERSIONS_DIR,
    WRITE_PREFIX,
    TableLocation,
    branch_data_dir,
    is_lance_temporary,
    manifest_version,
    sidecar_folder,
)
from blobhouse.maintenance.reports import (
    FailedCreateReport,
    GcReport,
    OrphansReport,
    ReclaimableReport,
)
from blobhouse.maintenance.versions import (
    FragmentState,
    VersionGraph,
    VersionRef,
    VersionSet,
    fragment_references,
    fragment_states,
    opened_states,
    version_of,
)
from blobhouse.managed import Reclaim, Registry
from blobhouse.placement import AllowedBases
from blobhouse.progress import Amounts, ProgressCallback, progress_to
from blobhouse.properties import TableProperties
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import damaged_file_error, open_snapshot, snapshot_of, table_io
from blobhouse.store.index import indexed_packs, open_parts, retire_packs
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.index_part import READER_WINDOW
from blobhouse.store.packs import forget_tombstones, retired_packs

if TYPE_CHECKING:
    from blobhouse.snapshot import TableSnapshot

DEFAULT_GRACE = timedelta(hours=24)
#: objects one sweep request removes (S3's bulk delete takes 1,000; Azure's 256 a batch)
SWEEP_BATCH = 1000


def referenced_paths(
    table: TableSnapshot, state: FragmentState, registered: Container[str] = frozenset()
) -> set[str]:
    """Paths, relative to the table root, of the data files, sidecars and store packs one
    fragment state uses, and the URIs of the ``registered`` managed objects it references;
    ``table`` is opened at ``state.ref``.

    A data file the version names may be gone (Lance's cleanup has been seen removing the files
    of a version it keeps): what it referenced cannot be read, so its sidecar directory and the
    whole store are marked (entries ending in ``/``: everything under them is kept)."""
    prefix = f"{table.uri}/"
    referenced = {uri.removeprefix(prefix) for uri in state.data_files if uri.startswith(prefix)}
    try:
        for batch in fragment_references(table, state.fragment_id):
            referenced |= _unjudged(batch.unresolved, prefix)
            for uri in batch.refs.field("uri").unique().to_pylist():
                if uri.startswith(prefix):
                    referenced.add(uri.removeprefix(prefix))
                elif uri in registered:  # absolute: never mistaken for a relative path
                    referenced.add(uri)
    except (OSError, ValueError, pa.ArrowException):
        store = object_store(table.uri, table.storage_options)
        missing = [uri for uri in state.data_files if store.size(uri) is None]
        if not missing:
            raise
        referenced |= {f"{sidecar_folder(uri.removeprefix(prefix))}/" for uri in missing} | {
            f"{PACKS}/"
        }
    return referenced


# a mark entry naming a reference gc could not resolve (kept, and reported); see Marked
UNRESOLVED = "unresolved:"


def _unjudged(unresolved: Iterable[tuple[int, str, str]], prefix: str) -> set[str]:
    """What references that cannot be resolved keep: whatever they may name (the object at
    their uri as stored; the whole store for one relative to a base path), and a mark entry
    that reports them and holds back every managed object's reclaim (gc keeps what it
    cannot judge)."""
    kept: set[str] = set()
    for _, uri, _ in unresolved:
        kept.add(f"{UNRESOLVED}{uri}")
        if "://" not in uri and not uri.startswith("/"):
            kept.add(f"{PACKS}/")
            continue
        absolute = as_uri(uri)
        kept |= {uri, absolute}
        if absolute.startswith(prefix):  # inside the table
            kept.add(absolute.removeprefix(prefix))
    return kept


def mark(
    table: TableSnapshot,
    graph: VersionGraph | None = None,
    progress: ProgressCallback | None = None,
    registered: Container[str] = frozenset(),
    runner: Runner | None = None,
) -> set[str]:
    """Every path (relative to the table root) that a retained version of any branch (of
    ``graph``) references, and every ``registered`` managed object's URI; a branch that cannot
    be read where the table is now keeps its directory and the whole store (entries ending in
    ``/``). ``runner`` reads the fragment states (default: here, telling ``progress``)."""
    table = snapshot_of(table)
    graph = graph or VersionGraph.of(table)
    referenced = unreadable_marks(graph)
    states = fragment_states(table, list(graph.versions))

    def paths(at: TableSnapshot, state: FragmentState) -> set[str]:
        return referenced_paths(at, state, registered)

    (runner or Here(progress)).map(
        table,
        paths,
        states,
        "mark",
        where=version_of,
        into=referenced.update,
        measure=FragmentState.amounts,
    )
    return referenced


def state_marks(
    table: TableSnapshot,
    graph: VersionGraph,
    progress: ProgressCallback | None = None,
    registered: Container[str] = frozenset(),
) -> Iterator[tuple[FragmentState, set[str]]]:
    """Each fragment state of ``graph``'s versions with the paths (and ``registered`` managed
    objects) it references, one at a time."""
    states = fragment_states(table, list(graph.versions))
    report = progress_to(progress)
    read = Amounts(bytes=0)
    for done, (at, state) in enumerate(opened_states(table, states)):
        if report:
            report("mark", done, len(states), bytes=read.bytes)
        yield state, referenced_paths(at, state, registered)
        read += state.amounts()
    if report:
        report("mark", len(states), len(states), bytes=read.bytes)


def unreadable_marks(graph: VersionGraph) -> set[str]:
    """What branches that cannot be read keep: their directory and the whole store."""
    if not graph.unreadable:
        return set()
    return {f"{TREE_DIR}/{name}/" for name, _ in graph.unreadable} | {f"{PACKS}/"}


class Marked:
    """The result of a mark: paths, and directories (ending in ``/``) kept whole."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = set(paths)
        self.unresolved = sorted(
            p.removeprefix(UNRESOLVED) for p in self.paths if p.startswith(UNRESOLVED)
        )
        self.paths -= {f"{UNRESOLVED}{u}" for u in self.unresolved}
        self.dirs = tuple(sorted(p for p in self.paths if p.endswith("/")))

    def __contains__(self, path: str) -> bool:
        return path in self.paths or path.startswith(self.dirs)

    def keeps_whole(self, directory: str) -> bool:
        """Whether everything under ``directory`` (ending in ``/``) is kept."""
        return directory.startswith(self.dirs)

    @property
    def kept_whole(self) -> list[str]:
        """Directories kept because what references them could not be read."""
        return list(self.dirs)


def orphans(table: TableSnapshot, referenced: Iterable[str] | None = None) -> OrphansReport:
    """Files the table owns (under ``data/``, branches' ``tree/<name>/data/`` and the store's
    ``_blobs/packs/``) that no retained version references: leftovers of writes that never
    committed, or of versions already removed. ``paths`` are local paths for local tables,
    URIs for tables on object stores.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> orphans(t)["files"]
    0
    """
    table = snapshot_of(table)
    marked = Marked(mark(table) if referenced is None else referenced)
    owned = _TableFiles(table)
    found = sorted(p for p in owned.objects if p not in marked)
    return {
        "files": len(found),
        "bytes": sum(owned.objects[p].size for p in found),
        "paths": [owned.location(p) for p in found],
    }


@remembered_names()  # each removed version's name is asked twice: its appends, its files
def reclaimable(table: TableSnapshot) -> ReclaimableReport:
    """What of the table's files no current row needs, by who would reclaim it:

    - ``orphan_files`` / ``orphan_bytes`` / ``orphan_paths``: files under ``data/``, the
      branches' ``tree/<name>/data/`` and ``_blobs/packs/`` that no retained version of any
      branch references (leftovers of writes that never committed): gc's sweep;
    - ``old_versions_files`` / ``old_versions_bytes``: files that only versions of this
      branch that ``gc(retain_versions=1)`` removes use (Lance decides which: tagged
      versions, versions a branch was made from and the latest stay), their manifests,
      transaction, deletion and index files included, and the store packs only they
      reference: gc with ``retain_versions`` (or ``older_than``).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), uri)
    >>> t = write_table(pa.table({"img": blob_array([b"y"])}), uri, mode="overwrite")
    >>> reclaimable(t)["old_versions_bytes"] > 100_000
    True
    """
    graph = VersionGraph.of(table)
    versions = versions_to_clean(table, 1, None)
    gone = VersionSet.of(VersionRef(table.branch, v) for v in versions)
    # a version only a branch keeps keeps its manifest, not its transaction file (measured)
    latest = max(r.version for r in graph.versions if r.branch == table.branch)
    parents = _parent_versions(table) - _tagged_versions(table) - {latest}
    referenced, by_kept = unreadable_marks(graph), unreadable_marks(graph)
    gone_deletions: set[str | None] = set()
    kept_deletions: set[str | None] = set()
    for state, paths in state_marks(table, graph):
        referenced |= paths
        if state.appearances.within(gone):
            gone_deletions.add(state.deletion_file)
        else:
            kept_deletions.add(state.deletion_file)
            by_kept |= paths
    everything, kept = Marked(referenced), Marked(by_kept)
    owned = _TableFiles(table)
    orphaned = sorted(p for p in owned.objects if p not in everything)
    old = _old_lance_files(table, versions, parents, gone_deletions - kept_deletions)
    old.update(
        (p, info.size) for p, info in owned.objects.items() if p in everything and p not in kept
    )
    return {
        "orphan_files": len(orphaned),
        "orphan_bytes": sum(owned.objects[p].size for p in orphaned),
        "orphan_paths": [owned.location(p) for p in orphaned],
        "old_versions_files": len(old),
        "old_versions_bytes": sum(old.values()),
    }


def _old_lance_files(
    table: TableSnapshot,
    versions: Sequence[int],
    parents: Set[int],
    deletions: Set[str | None],
) -> dict[str, int]:
    """The files of Lance's own that removing ``versions`` of ``table``'s branch removes
    (path relative to the root -> size): their manifests and transaction files, the
    transaction files of ``parents`` (versions kept for a branch alone), and the
    ``deletions`` files only they use (the marks tell data files). Told from one listing and
    a manifest's last bytes a version: Lance's explanation reads every manifest whole, each
    listing every fragment so far (8x the time a fragment at 10,000 versions). A table with
    index files, or a manifest whose transaction cannot be told so, gets Lance's own answer
    (:func:`explain_version_cleanup`)."""
    listed = lance_files(table, (VERSIONS_DIR, TRANSACTIONS_DIR, DELETIONS_DIR, INDICES_DIR))
    within = _dataset_prefix(table)
    try:
        if any(p.startswith(f"{within}{INDICES_DIR}/") for p in listed):
            raise UnreadTransaction("index files: which versions use them")
        dataset_uri = table.location.dataset_uri
        names = [
            f"{within}{TRANSACTIONS_DIR}/{transaction_name(dataset_uri, v, table.storage_options)}"
            for v in sorted({*versions, *parents})
        ]
    except UnreadTransaction:
        cleanup = explain_version_cleanup(table, 1, None)
        return {p: size for p, size in cleanup.files.items() if p not in cleanup.unverified}
    gone = set(versions)
    manifests = [p for p in listed if _manifest_version(p, within) in gone]
    prefix = f"{table.uri}/"
    deleted = [uri.removeprefix(prefix) for uri in deletions if uri and uri.startswith(prefix)]
    return {p: listed[p] for p in sorted({*manifests, *names, *deleted}) if p in listed}


def disk_usage(table: TableSnapshot) -> int:
    """Bytes of every object under the table's root: every branch, the store, Lance's
    metadata."""
    return sum(info.size for info in object_store(table.uri, table.storage_options).list(table.uri))


@table_io("collect garbage in")
def gc(
    table: TableSnapshot,
    *,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    runner: Runner | None = None,
) -> GcReport:
    """Remove old versions, then every file the table owns (under ``data/`` and
    ``_blobs/packs/``) that no retained version references and that is older than ``grace``
    (younger ones may belong to a write still in progress). A store pack the store's index
    names is retired first and deleted by a later run (:class:`_StorePacks`), since a writer may
    have found it in the index and be about to reference it.

    Versions of this table's branch go through Lance (``cleanup_old_versions``; nothing is
    removed unless ``retain_versions`` or ``older_than`` is given); tagged versions, and
    versions a branch was made from, are kept and reported (``kept_tagged_versions``), never an
    error. Files are marked by every retained version of every branch. Only the table's own
    directories are ever swept, and in them only files named as Lance and blobhouse name theirs:
    external objects, and files a user put there (``foreign_files``), are never touched. Objects a
    committed write handed to the table (managed objects) are retired, doomed and deleted once
    no retained version references them, a grace period apart (``managed`` in the report;
    :class:`blobhouse.managed.Reclaim`). ``dry_run`` deletes nothing and reports what the same
    call would remove: the versions and files Lance's cleanup would remove (as Lance explains
    it), the files the sweep would take once those versions are gone, and the managed objects.
    ``runner`` marks the fragment states of the versions that can be read (default: one after
    another in this process; Spark runs them as tasks).
    Ages are measured by this machine's clock against the store's modification times (on an
    object store, keep the clocks in step: docs/object-storage.md, Limits).

    The report counts every file once: ``removed_files``, ``reclaimed_bytes`` and ``paths``
    are the sum of what Lance's cleanup removed (``removed_by_lance_cleanup``: manifests,
    transaction, data, deletion and index files of the removed versions, measured by listing
    the branch's directories before and after), what the sweep removed (``removed_by_sweep``:
    unreferenced files and reaped store packs) and what the store index's own cleanup
    removed (``store_index``).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> gc(t, dry_run=True)["removed_files"]
    0
    """
    table = snapshot_of(table)
    _check_retention(retain_versions, older_than, grace, dry_run)
    # a damaged stored setting (a managed base read as '/', say) never decides what is deleted
    TableProperties.of(table.dataset).check_writable()
    # a link or file where the table's own folders belong is cleared before anything lists
    # them (what a link leads to is a user's: never listed, never removed)
    folders = own_folder_leftovers(table)
    if not dry_run:
        _clear_leftovers(folders, table.storage_options)
    planned = _planned_cleanup(table, retain_versions, older_than, dry_run)
    # files staged after this instant may belong to a write that commits after the mark
    mark_started = object_store(table.uri, table.storage_options).now(table.uri)
    cutoff = mark_started - grace.total_seconds()
    # read before the mark: what a write registers later is not this run's to decide
    registry = Registry.load(table.location, table.storage_options)

    def marks(graph: VersionGraph) -> set[str]:
        # and those a copy carries from its original: given back once no longer referenced
        return mark(table, graph, progress, registry.uris | registry.carried, runner)

    # marked before Lance's cleanup removes a version: a data file the mark cannot read (a
    # garbled blob descriptor) stops the run while the versions before it are still there
    graph = VersionGraph.of(table).without(table.branch, planned.versions)
    found = marks(graph)
    cleanup = planned
    if not dry_run and (retain_versions is not None or older_than is not None):
        table, cleanup = _clean_versions(table, retain_versions, older_than, planned, progress)
        graph, found = _marked_after_cleanup(table, graph, found, planned, cleanup, marks)
    removed_versions = list(cleanup.versions)
    marked = Marked(found)
    owned = _TableFiles(table, without=cleanup.files)
    packs = _StorePacks(table, marked, owned, cutoff, runner)
    managed = Reclaim.plan(
        table.location,
        AllowedBases.of_table(table.schema, table.uri),
        registry,
        marked.paths,
        complete=not marked.dirs and not marked.unresolved,
        cutoff=cutoff,
        storage_options=table.storage_options,
    )
    sweep = _Sweep.plan(table, owned, packs, marked, mark_started, cutoff)
    # index versions a writer may be reading stay, whatever the grace
    index_keep = max(grace, READER_WINDOW)
    blocked = {uri for uri, _ in folders}  # a dry run lists nothing through them
    stale = _stale_leftovers(table, blocked)
    if dry_run:
        expired = 0 if _in_blocked(table, LEASES_DIR, blocked) else sweep.expired_leases()
        done = _SweepDone(_IndexCleanup.explained(table, index_keep), expired)
        cleared = len(stale) + len(folders)
    else:
        done = sweep.apply(managed, index_keep, progress, runner)
        cleared = _clear_leftovers(stale, table.storage_options) + len(folders)
    # from the graph, not Lance's versions() before the cleanup: that reads every manifest
    retained = [ref.version for ref in graph.versions if ref.branch == table.branch]
    removed = {**cleanup.files, **sweep.swept_sizes, **done.index.removed}
    return {
        "dry_run": dry_run,
        "branch": table.branch,
        "removed_versions": removed_versions,
        "retained_versions": retained,
        "kept_tagged_versions": _kept_for_tags(table, removed_versions, retained, retain_versions),
        "removed_files": len(removed),
        "reclaimed_bytes": sum(removed.values()),
        "removed_by_lance_cleanup": {"files": len(cleanup.files), "bytes": cleanup.bytes},
        "removed_by_sweep": {
            "files": len(sweep.swept_sizes),
            "bytes": sum(sweep.swept_sizes.values()),
        },
        "store_index": {
            "removed_files": len(done.index.removed),
            "removed_bytes": sum(done.index.removed.values()),
            "added_bytes": done.index.added_bytes,
            "moved_entries": done.index.moved_entries,
        },
        "kept_referenced_files": len(marked.paths - registry.uris - registry.carried),
        "kept_unreadable": marked.kept_whole,
        # references no object could be judged for (escaping their base or the allowed
        # bases): what they may name is kept, and no managed object is reclaimed this run
        "unresolved_references": marked.unresolved,
        **sweep.packs_report(),
        "expired_leases": done.expired_leases,
        "stale_leftovers": cleared,
        "paths": [sweep.owned.location(p) for p in sorted(removed)],
        "foreign_files": [owned.location(p) for p in owned.foreign],
        "managed": managed.report(),
    }


def _planned_cleanup(
    table: TableSnapshot, retain_versions: int | None, older_than: timedelta | None, dry_run: bool
) -> VersionCleanup:
    """What Lance's cleanup of old versions will remove (nothing without ``retain_versions`` or
    ``older_than``): as Lance explains it for a dry run, which reports it; else its versions
    as :func:`versions_to_clean` foresees them (the marks made before the cleanup rest on them,
    and gc reconciles them with what Lance removed). Unless this is a dry run, a damaged data
    file refuses the run first: the versions written before it are the way back to its rows."""
    if retain_versions is None and older_than is None:
        return VersionCleanup()
    if dry_run:
        return explain_version_cleanup(table, retain_versions, older_than)
    damaged = table.damaged_data_files()
    if damaged:
        raise damaged_file_error(table.location.root, "collect garbage in", damaged)
    return VersionCleanup(versions_to_clean(table, retain_versions, older_than))


def versions_to_clean(
    table: TableSnapshot, retain_versions: int | None, older_than: timedelta | None
) -> tuple[int, ...]:
    """The versions of ``table``'s branch ``cleanup_old_versions(older_than, retain_versions,
    error_if_tagged_old_versions=False)`` is about to remove, foreseen from one listing of
    the branch's manifests (their names and ages): all but the latest ``retain_versions``,
    those older than ``older_than``, never the latest, a tagged version or one a branch was
    made from. Lance's own explanation reads every manifest (1.5 s at 2,000 versions, as
    long as the cleanup itself); a version foreseen wrongly costs gc nothing but a file kept
    one run longer (:func:`_marked_after_cleanup`).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for mode in ("create", "append", "append"):
    ...     t = write_table(pa.table({"b": blob_array([b"x"])}), uri, mode=mode)
    >>> versions_to_clean(t, 2, None), versions_to_clean(t, None, timedelta(0))
    ((1,), (1, 2))
    """
    store = object_store(table.uri, table.storage_options)
    listed = sorted(
        (version, info.mtime)
        for info in store.list(f"{table.location.dataset_path}/{VERSIONS_DIR}")
        if (version := manifest_version(info.name)) is not None
    )
    keep = {version for version, _ in listed[-(retain_versions or 1) :]}
    if older_than is not None:
        cutoff = store.now(table.uri) - older_than.total_seconds()
        keep |= {version for version, written in listed if written > cutoff}
    keep |= _pinned_versions(table)
    return tuple(version for version, _ in listed if version not in keep)


def _pinned_versions(table: TableSnapshot) -> set[int]:
    """Versions of ``table``'s branch that Lance's cleanup never removes: tagged ones, and
    those a branch was made from."""
    return _tagged_versions(table) | _parent_versions(table)


def _tagged_versions(table: TableSnapshot) -> set[int]:
    branch = table.branch or "main"
    return {t["version"] for t in table.tags().values() if (t["branch"] or "main") == branch}


def _parent_versions(table: TableSnapshot) -> set[int]:
    """Versions of ``table``'s branch that a branch was made from."""
    branch = table.branch or "main"
    return {
        b["parent_version"]
        for b in table.branches().values()
        if (b["parent_branch"] or "main") == branch
    }


def _clean_versions(
    table: TableSnapshot,
    retain_versions: int | None,
    older_than: timedelta | None,
    planned: VersionCleanup,
    progress: ProgressCallback | None,
) -> tuple[TableSnapshot, VersionCleanup]:
    """Lance's cleanup of old versions: the table after it, and what it removed. It is one
    call, so ``progress`` hears of the step ``clean versions`` as it starts (the ``planned``
    versions to remove) and once it ends (the versions and bytes it removed)."""
    report = progress_to(progress)
    if report is not None:
        report("clean versions", 0, len(planned.versions), bytes=0)
    listed = lance_files(table)
    table.dataset.cleanup_old_versions(
        older_than=older_than,
        retain_versions=retain_versions,
        error_if_tagged_old_versions=False,
    )
    table = table.checkout(table.version)
    cleanup = VersionCleanup.between(listed, lance_files(table), _dataset_prefix(table))
    if report is not None:
        removed = len(cleanup.versions)
        report("clean versions", removed, removed, bytes=cleanup.bytes)
    return table, cleanup


def _marked_after_cleanup(
    table: TableSnapshot,
    graph: VersionGraph,
    found: set[str],
    planned: VersionCleanup,
    cleanup: VersionCleanup,
    marks: Callable[[VersionGraph], set[str]],
) -> tuple[VersionGraph, set[str]]:
    """The graph and marks of what Lance's cleanup left, from those made before it of what it
    was to leave. It may remove more than planned (versions aged past ``older_than`` since):
    their marks keep files one run longer. It may keep a planned version (tagged since): that
    version is marked now, or files only it references would be swept."""
    graph = graph.without(table.branch, cleanup.versions)
    kept = set(planned.versions) - set(cleanup.versions)
    if not kept:
        return graph, found
    extra = tuple(
        r for r in VersionGraph.of(table).versions if r.branch == table.branch and r.version in kept
    )
    found = found | marks(VersionGraph(extra))
    versions = sorted({*graph.versions, *extra}, key=VersionRef.sort_key)
    return VersionGraph(tuple(versions), graph.unreadable), found


#: the table's own folders, which blobhouse creates small objects in, lists and clears
OWN_FOLDERS = (
    LOCKS_DIR,  # in LEASES_DIR
    CLAIMS,
    *(f"{STORE_DIR}/{MANAGED_DIR}/{sub}" for sub in (REGISTRY_DIR, UNREFERENCED_DIR, DOOMED_DIR)),
)


def own_folder_leftovers(table: TableSnapshot) -> list[tuple[str, Found]]:
    """What stands where one of the table's own folders (:data:`OWN_FOLDERS`) or a folder
    above it belongs and is no folder: a link (to a user's folder, say), a file."""
    root = table.location.root_uri
    store = object_store(root, table.storage_options)
    found = {uri: what for rel in OWN_FOLDERS for uri, what in folder_leftovers(store, root, rel)}
    return sorted(found.items())


def _in_blocked(table: TableSnapshot, relative: str, blocked: set[str]) -> bool:
    """Whether the table's folder ``relative`` lies at or below a link or file of
    ``blocked``."""
    uri = f"{table.location.root_uri}/{relative}"
    return any(uri == b or uri.startswith(b + "/") for b in blocked)


def _stale_leftovers(table: TableSnapshot, blocked: set[str]) -> list[tuple[str, Found]]:
    """Locks no live holder holds, and what stands in ``_leases/`` that no lease is (a
    directory, a special file): what no writer will ever clear (docs/table-services.md).
    Nothing is listed in a folder at or below one of ``blocked``."""
    root, options = table.location.root, table.storage_options
    stale = []
    if not _in_blocked(table, locks.LOCKS_DIR, blocked):
        stale += locks.stale_locks(root, options)
    if not _in_blocked(table, LEASES_DIR, blocked):
        stale += leases.leftover_leases(root, options)
    return stale


def _clear_leftovers(stale: list[tuple[str, Found]], options: StorageOptions | None) -> int:
    """Remove ``stale`` (each only if still what was found: a waiter may have taken it over);
    how many were removed."""
    cleared = 0
    for uri, found in stale:
        store = object_store(uri, options)
        if BREAK in uri.rsplit("/", 1)[-1]:  # a breaker's marker, its breaker dead
            store.delete(uri)
            cleared += 1
        else:
            try:
                cleared += clear_once(store, uri, found)
            except LeftoverError as exc:  # the rest of gc's work stands: say what is left
                warnings.warn(str(exc), stacklevel=3)
    return cleared


@dataclass(frozen=True)
class _SweepDone:
    """What applying a sweep did besides removing its files."""

    index: _IndexCleanup
    expired_leases: int


@dataclass(frozen=True)
class _Sweep:
    """Which of the table's own files the sweep removes (``old``, and the store packs it reaps)
    and which it keeps: ``young`` (staged within the grace) and ``leased`` (older, but staged
    by a write still running)."""

    table: TableSnapshot
    owned: _TableFiles
    packs: _StorePacks
    young: list[str]
    leased: list[str]
    old: list[str]
    mark_started: float
    cutoff: float
    running: set[str]

    @classmethod
    def plan(
        cls,
        table: TableSnapshot,
        owned: _TableFiles,
        packs: _StorePacks,
        marked: Marked,
        mark_started: float,
        cutoff: float,
    ) -> _Sweep:
        table_path, options = table.location.root, table.storage_options
        # writes that ran at any time since the mark began (including those that committed
        # after it, which the mark could not see) keep their files, however old
        alive_since = mark_started - leases.TIMEOUT_SECONDS
        running = leases.live_prefixes(table_path, alive_since, options)
        # files Lance names itself (its temporary files, a schema change's data files) carry
        # no write's prefix: those younger than the oldest running write may be its own
        oldest = leases.oldest_start(table_path, alive_since, options)
        in_flight = cutoff if oldest is None else min(cutoff, oldest)
        # retired packs (tombstoned) follow the store's rules only: reaped once their
        # tombstone has aged, never swept as plain leftovers (which would skip its grace)
        leftovers = [
            p for p in sorted(owned.objects) if p not in marked and p not in packs.tombstoned
        ]
        unindexed = [p for p in leftovers if p not in packs.indexed]
        young = [p for p in unindexed if owned.objects[p].mtime >= cutoff]
        leased = [
            p
            for p in unindexed
            if owned.objects[p].mtime < cutoff
            and (
                _staged_by(owned.relative[p], running)
                or (not _prefixed(owned.relative[p]) and owned.objects[p].mtime >= in_flight)
            )
        ]
        old = sorted(set(unindexed) - set(young) - set(leased))
        return cls(table, owned, packs, young, leased, old, mark_started, cutoff, running)

    @property
    def swept_sizes(self) -> dict[str, int]:
        """Every file the sweep removes (unreferenced files and reaped packs), with its size."""
        return {p: self.owned.objects[p].size for p in self.old + self.packs.reap_paths}

    @property
    def lease_cutoff(self) -> float:
        return min(self.cutoff, self.mark_started - leases.TIMEOUT_SECONDS)

    def expired_leases(self) -> int:
        """How many leases are expired (what :meth:`apply` removes)."""
        location = self.table.location
        return len(leases.expired(location.root, self.lease_cutoff, self.table.storage_options))

    def apply(
        self,
        managed: Reclaim,
        index_keep: timedelta,
        progress: ProgressCallback | None,
        runner: Runner | None = None,
    ):
        """Remove the files, retire and reap packs, reclaim managed objects, clean the store
        index (its parts through ``runner``) and expired leases, then empty directories."""
        table, owned = self.table, self.owned
        owned.delete(self.old, progress)
        index_before = _IndexCleanup.listed(table)  # retiring packs adds to the index too
        self.packs.apply(progress)
        managed.apply()
        index = _IndexCleanup.run(table, index_keep, index_before, runner)
        expired = leases.remove_expired(
            table.location.root, self.lease_cutoff, table.storage_options
        )
        # a running write makes a data file's sidecar folder before its first sidecar: that
        # empty folder is its own (a tryout's writer lost it: FileNotFoundError)
        owned.remove_empty_dirs(
            lambda path, mtime: mtime >= self.cutoff or _staged_by(path, self.running)
        )
        return _SweepDone(index, expired)

    def packs_report(self) -> dict[str, Any]:
        """The report's account of the files kept and of the store's packs."""
        packs = self.packs
        return {
            # the store index cannot be read (damaged files): every pack is kept
            "store_index_unreadable": packs.unreadable_index,
            "kept_young_files": len(self.young),
            "kept_leased_files": len(self.leased),
            "retired_packs": len(packs.retire),
            # reclaimed by a later run, once their tombstone is older than the grace
            "retired_bytes": sum(packs.size(p) for p in packs.retire),
            "reaped_packs": len(packs.reap),
            "resurrected_packs": len(packs.resurrect),
            "kept_retired_packs": len(packs.waiting),
        }


@dataclass(frozen=True)
class VersionCleanup:
    """What Lance's cleanup of one branch's old versions removes (or would remove): the
    versions, and every file, as path relative to the table root -> size (manifests,
    transaction, data, sidecar, deletion and index files alike); ``unverified`` are files no
    manifest names, which Lance removes once they are 7 days old."""

    versions: tuple[int, ...] = ()
    files: dict[str, int] = field(default_factory=dict)
    unverified: frozenset[str] = frozenset()

    @property
    def bytes(self) -> int:
        return sum(self.files.values())

    @classmethod
    def between(cls, listed: dict[str, int], left: dict[str, int], within: str) -> VersionCleanup:
        """What a cleanup removed, from the files :func:`lance_files` ``listed`` before it and
        those ``left`` after (the removed versions are those whose manifests went)."""
        files = {p: listed[p] for p in sorted(listed.keys() - left.keys())}
        return cls(_manifest_versions(files, within), files)


def explain_version_cleanup(
    table: TableSnapshot, retain_versions: int | None, older_than: timedelta | None
) -> VersionCleanup:
    """What ``cleanup_old_versions(older_than, retain_versions,
    error_if_tagged_old_versions=False)`` would remove from ``table``'s branch now, as Lance
    itself decides it (tagged versions, versions a branch was made from and the latest are
    kept; files only removed versions use go with them): Lance's own explanation, every
    candidate file listed.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), uri)
    >>> t = write_table(pa.table({"img": blob_array([b"y"])}), uri, mode="overwrite")
    >>> explain_version_cleanup(t, 1, None).versions
    (1,)
    """
    if retain_versions is None and older_than is None:
        return VersionCleanup()
    explained = table.dataset.explain_cleanup_old_versions(
        older_than=older_than,
        retain_versions=retain_versions,
        error_if_tagged_old_versions=False,
        include_files=True,
        max_files=sys.maxsize,
    )
    within = _dataset_prefix(table)
    files: dict[str, int] = {}
    unverified = set()
    for candidate in explained.candidate_files:
        path = _relative_to_root(candidate.path, table.location.root, within)
        files[path] = candidate.size_bytes
        if candidate.unverified:
            unverified.add(path)
    return VersionCleanup(
        _manifest_versions(files, within), dict(sorted(files.items())), frozenset(unverified)
    )


def lance_files(table: TableSnapshot, directories: Sequence[str] = LANCE_DIRS) -> dict[str, int]:
    """Every file in the ``directories`` of ``table``'s branch (default: all that Lance's
    cleanup deletes in), path relative to the table root -> size."""
    store = object_store(table.uri, table.storage_options)
    within = _dataset_prefix(table)
    found = {}
    for directory in directories:
        for info in store.list(f"{table.uri}/{within}{directory}"):
            found[f"{within}{directory}/{info.name}"] = info.size
    return found


def _dataset_prefix(table: TableSnapshot) -> str:
    """Where the dataset of ``table``'s branch is, relative to the table root (``""`` or
    ``tree/<branch>/``)."""
    return "" if table.branch is None else f"{TREE_DIR}/{table.branch}/"


def _object_key(uri: str) -> str:
    """How Lance's object store names ``uri`` (a local path or a URI): its path, without the
    leading ``/``."""
    if is_local(uri):
        return os.path.abspath(uri_to_path(uri)).strip("/")
    return unquote(urlsplit(uri).path).strip("/")


def _relative_to_root(path: str, root: str, within: str) -> str:
    """A path Lance reports (an object store path) relative to the table root; ``within`` is
    where the dataset it belongs to is, relative to the root."""
    key = _object_key(root)
    path = unquote(path).lstrip("/")
    if key and path.startswith(key + "/"):
        return path[len(key) + 1 :]
    # spelled another way (a bucket in front, a symlink resolved): from the last of the
    # dataset's own directories on
    starts = [path.rfind(f"/{within}{d}/") for d in LANCE_DIRS]
    start = max(starts)
    if start < 0:
        raise BlobhouseError(f"Lance named a file outside the table {root}: {path}")
    return path[start + 1 :]


def _manifest_versions(paths: Iterable[str], within: str) -> tuple[int, ...]:
    """The versions whose manifests are among ``paths``, in order."""
    return tuple(sorted(v for v in (_manifest_version(p, within) for p in paths) if v is not None))


def _manifest_version(path: str, within: str) -> int | None:
    """The version a manifest path (relative to the root) names; None for other files."""
    folder = f"{within}{VERSIONS_DIR}/"
    return manifest_version(path[len(folder) :]) if path.startswith(folder) else None


@dataclass(frozen=True)
class _IndexCleanup:
    """What maintaining the store's index removed (or would remove): path relative to the
    table root -> size, the bytes its compaction and move wrote, and the entries it moved
    from level 0 into the shards."""

    removed: dict[str, int] = field(default_factory=dict)
    added_bytes: int = 0
    moved_entries: int = 0

    @classmethod
    def run(
        cls,
        table: TableSnapshot,
        keep: timedelta,
        before: dict[str, int],
        runner: Runner | None = None,
    ) -> _IndexCleanup:
        """Maintain the index, each part a unit of ``runner`` (default: here, one after
        another); what changed since it held ``before`` (:meth:`listed`)."""
        root, options = table.location.root, table.storage_options
        moved = maintain_index(root, keep, options, parts_on(runner, table))
        after = cls.listed(table)
        return cls(
            {p: before[p] for p in sorted(before.keys() - after.keys())},
            sum(after[p] for p in after.keys() - before.keys()),
            moved,
        )

    @classmethod
    def explained(cls, table: TableSnapshot, keep: timedelta) -> _IndexCleanup:
        """What the index's cleanup would remove now, in every part (a compaction or a move
        into the shards it may need first is not foreseen: they rewrite what they remove)."""
        root, options = table.location.root, table.storage_options
        removed: dict[str, int] = {}
        try:
            for uri, part in open_parts(root, options):
                explained = part.explain_cleanup_old_versions(
                    older_than=keep, include_files=True, max_files=sys.maxsize
                )
                within = uri.removeprefix(root.rstrip("/") + "/")  # both built from root
                for c in explained.candidate_files:
                    removed[f"{within}/{_relative_to_root(c.path, uri, '')}"] = c.size_bytes
        except (StoreIndexError, ValueError, OSError):
            pass  # no store, nothing stored yet, or a part gc's run would warn about
        return cls(removed)

    @staticmethod
    def listed(table: TableSnapshot) -> dict[str, int]:
        store = object_store(table.uri, table.storage_options)
        listed: dict[str, int] = {}
        for folder in (INDEX_DIR, INDEX_SHARDS_DIR):
            within = f"{STORE_DIR}/{folder}"
            listed |= {f"{within}/{i.name}": i.size for i in store.list(f"{table.uri}/{within}")}
        return listed


def gc_at(
    uri: str,
    *,
    branch: str | None = None,
    storage_options: StorageOptions | None = None,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
) -> GcReport | FailedCreateReport:
    """:func:`gc` of the table at ``uri``; where there is no table but the leftovers of a
    create that never committed, :func:`clean_failed_create` (what ``blobhouse gc PATH``
    runs). A folder with neither raises :class:`TableNotFoundError`.

    >>> import tempfile
    >>> gc_at(tempfile.mkdtemp() + "/nothing")
    Traceback (most recent call last):
    ...
    blobhouse.errors.TableNotFoundError: no table at ...
    """
    try:
        table = open_snapshot(uri, None, storage_options, branch=branch)
    except TableNotFoundError:
        if branch is not None:
            raise
        _check_retention(retain_versions, older_than, grace, dry_run)
        return clean_failed_create(
            uri, grace=grace, dry_run=dry_run, storage_options=storage_options
        )
    return gc(
        table,
        retain_versions=retain_versions,
        older_than=older_than,
        grace=grace,
        dry_run=dry_run,
        progress=progress,
    )


# what a failed create leaves: layout.STAGED_BY_A_WRITE, LEASE_FILE, CREATE_DIRS


def clean_failed_create(
    uri: str,
    *,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    storage_options: StorageOptions | None = None,
) -> FailedCreateReport:
    """Remove what a create that never committed left at ``uri`` (Ctrl-C, a killed process, an
    aborted Spark job), where no table exists yet: gc cannot open a table there.

    Only files blobhouse stages are considered, recognized by their names: data files
    ``data/<write id>-<uuid>.lance`` and their sidecars ``data/<write id>-<uuid>/*.blob``,
    abort markers ``data/aborted-<write id>-``, store packs
    ``_blobs/packs/<write id>-<uuid>.pack``, leases ``_leases/<write id>-``, and the
    transaction file of the create's Lance commit (``_transactions/0-<uuid>.txn``), and the
    temporary files Lance's writers leave in ``data/`` when killed mid-file (``.tmp*``; a
    cancelled Spark task) beside any of those. As gc does, it keeps files younger than
    ``grace``, files of a write whose lease is live (a create still running) and temporary
    files younger than the oldest running write, and removes expired leases. Every other
    file is foreign: left alone and listed (``foreign_files``). A folder with a Lance
    dataset (``_versions/``) is refused: that is gc's. Emptied directories go, and the folder
    itself if nothing is left in it. The report has gc's keys (no versions) and
    ``failed_create: True``.

    >>> import tempfile
    >>> from blobhouse.layout import TableLocation
    >>> from blobhouse.write.pipeline import plan_write, write_data_files
    >>> from blobhouse.values import blob_array
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> data = pa.table({"b": blob_array([b"x" * 100_000])})
    >>> _ = write_data_files(data.to_batches(), plan_write(data.schema), TableLocation(uri), None,
    ...                      "0123456789ab-")  # staged by a create that never committed
    >>> report = clean_failed_create(uri, dry_run=True)  # staged just now: kept
    >>> report["kept_young_files"], report["removed_files"], report["foreign_files"]
    (2, 0, [])
    """
    _check_retention(None, None, grace, dry_run)
    location = TableLocation.of(uri, None, storage_options)
    root = location.root_uri
    store = object_store(root, storage_options)
    listed = {info.name: info for info in store.list(root)}
    if any(name.startswith(f"{VERSIONS_DIR}/") for name in listed):
        raise BlobhouseError(
            f"{location.root} holds a Lance dataset (_versions/), not only the leftovers of a "
            "failed create: open it as a table (blobhouse gc runs on tables); nothing removed"
        )
    staged: dict[str, str | None] = {}  # path -> the write that staged it (None: unknown)
    held: dict[str, str] = {}  # lease -> its write
    foreign, temporary = [], []
    for name in sorted(listed):
        lease = LEASE_FILE.fullmatch(name)
        found = lease or next((m for p in STAGED_BY_A_WRITE if (m := p.fullmatch(name))), None)
        if lease:
            held[name] = lease["write"]
        elif found:
            staged[name] = found.groupdict().get("write")
        elif is_lance_temporary(name):
            temporary.append(name)
        else:
            foreign.append(name)
    # Lance's temporary files (a task killed mid-file, a cancelled Spark task) name no write:
    # a failed create's only beside what a write staged, else a project's data/ folder's own
    if staged or held:
        staged.update(dict.fromkeys(temporary))
    else:
        foreign = sorted(foreign + temporary)
    if not staged and not held:
        alone = f"; {len(foreign)} files there are not blobhouse's: left alone" if foreign else ""
        raise TableNotFoundError(
            f"no table at {location.root}, and no leftovers of a failed create{alone}"
        )
    now = store.now(root)
    cutoff = now - grace.total_seconds()
    alive_since = now - leases.TIMEOUT_SECONDS
    running = leases.live_prefixes(location.root, alive_since, storage_options)
    # Lance's temporary files name no write: as gc's sweep does, those younger than the
    # oldest running write may be its own
    oldest = leases.oldest_start(location.root, alive_since, storage_options)
    in_flight = cutoff if oldest is None else min(cutoff, oldest)
    young = [p for p in staged if listed[p].mtime >= cutoff]
    leased = [
        p
        for p in staged
        if listed[p].mtime < cutoff
        and (staged[p] in running or (staged[p] is None and listed[p].mtime >= in_flight))
    ]
    old = sorted(set(staged) - set(young) - set(leased))
    lease_cutoff = min(cutoff, now - leases.TIMEOUT_SECONDS)
    expired = [p for p in held if listed[p].mtime < lease_cutoff]
    if not dry_run:
        store.delete_many([f"{root}/{path}" for path in old + expired])
        if is_local(root):
            _remove_create_dirs(uri_to_path(root))

    def where(path: str) -> str:
        return os.path.join(location.root, *path.split("/")) if is_local(root) else f"{root}/{path}"

    return {
        "dry_run": dry_run,
        "failed_create": True,
        "branch": None,
        "removed_versions": [],
        "retained_versions": [],
        "kept_tagged_versions": [],
        "removed_files": len(old),
        "reclaimed_bytes": sum(listed[p].size for p in old),
        "kept_young_files": len(young),
        "kept_leased_files": len(leased),
        "expired_leases": len(expired),
        "foreign_files": [where(p) for p in foreign],
        "paths": [where(p) for p in old],
    }


def _remove_create_dirs(root: str) -> None:
    """Remove the directories a create made once they are empty, and then the folder itself
    if nothing is left in it (as the create's own cleanup does)."""
    for directory in CREATE_DIRS:
        path = os.path.join(root, *directory.split("/"))
        if os.path.isdir(path) and not os.path.islink(path):
            _remove_empty_dirs(path)
            with contextlib.suppress(OSError):
                os.rmdir(path)
    with contextlib.suppress(OSError):
        os.rmdir(root)


def _check_retention(
    retain_versions: int | None, older_than: timedelta | None, grace: timedelta, dry_run: bool
) -> None:
    """gc's options, each by its setting (None: not given)."""
    given = {"retain_versions": retain_versions, "older_than": older_than}
    for name, value in {**given, "grace": grace, "dry_run": dry_run}.items():
        if value is not None or name not in given:
            SETTINGS[name].check(value)


def _kept_for_tags(
    table: TableSnapshot, removed: list[int], retained: list[int], retain_versions: int | None
) -> list[int]:
    """Versions of this branch that a tag, or a branch made from them, keeps although the
    cleanup removed a newer version, or although ``retain_versions`` left them out (when the
    tags kept every version it would have removed, it removed none)."""
    if removed:
        cut = max(removed)
    elif retain_versions is not None and len(retained) > retain_versions:
        cut = sorted(retained)[-retain_versions]  # the oldest of the versions it keeps anyway
    else:
        return []
    return sorted(v for v in _pinned_versions(table) & set(retained) if v < cut)


def owned_dirs(table: TableSnapshot) -> list[str]:
    """The directories (relative to the root) whose files belong to the table: main's and each
    branch's ``data/``, the store's packs, the claims of Spark writes (blobhouse.store.claims)
    and the records of store-first writes (blobhouse.store.records): those two named with their
    write's prefix, kept while it runs, swept once it died."""
    branches = [branch_data_dir(b) for b in sorted(table.branches())]
    return ["data", *branches, PACKS, CLAIMS, STORED]


def _made_by_the_table(owned: str, name: str) -> bool:
    """Whether ``name``, a file in the owned directory ``owned``, has a name Lance or blobhouse
    gives (the rest are a user's: never swept)."""
    return OWNED_FILE_NAMES.get(owned, DATA_FOLDER_FILE).fullmatch(name) is not None


class _TableFiles:
    """The files a table owns, listed once: path relative to the table root -> size, mtime;
    and the ``foreign`` files in its directories, named by no one but a user."""

    def __init__(self, table: TableSnapshot, without: Iterable[str] = ()) -> None:
        self.root = table.uri
        self.store = object_store(table.uri, table.storage_options)
        self.local = is_local(table.uri)
        self.dirs = owned_dirs(table)
        self.objects: dict[str, ObjectInfo] = {}
        self.relative: dict[str, str] = {}  # path -> path relative to its owned directory
        self.foreign: list[str] = []
        gone = set(without)  # removed already (a dry run: what Lance's cleanup would remove)
        for owned in self.dirs:
            if owned == CLAIMS and folder_leftovers(self.store, self.root, owned):
                continue  # a link or file where the claims belong: gc clears it, never lists it
            if self.local:
                _refuse_symlinked(uri_to_path(self.root), owned)
            for info in self.store.walk(f"{self.root}/{owned}"):
                path = f"{owned}/{info.name}"
                if not _made_by_the_table(owned, info.name):
                    self.foreign.append(path)
                elif path not in gone:
                    self.objects[path] = info
                    self.relative[path] = info.name
        self.foreign.sort()

    def location(self, path: str) -> str:
        """Where ``path`` is, as users name it: a local path, or a URI."""
        if self.local:
            return os.path.join(uri_to_path(self.root), *path.split("/"))
        return f"{self.root}/{path}"

    def delete(
        self, paths: Sequence[str], progress: ProgressCallback | None = None, step: str = "sweep"
    ) -> None:
        """Remove ``paths`` a bulk request at a time (on S3, 1,000 objects a request),
        telling ``progress`` (as ``step``)."""
        report = progress_to(progress)
        done = swept = 0
        for batch in in_pages(paths, SWEEP_BATCH):
            if report:
                report(step, done, len(paths), bytes=swept)
            self.store.delete_many([f"{self.root}/{path}" for path in batch])
            done += len(batch)
            swept += sum(self.objects[p].size for p in batch if p in self.objects)
        if report and paths:
            report(step, len(paths), len(paths), bytes=swept)

    def remove_empty_dirs(self, spared: Callable[[str, float], bool]) -> None:
        """Remove the empty folders of the owned directories but those ``spared(path relative
        to its owned directory, mtime)`` keeps."""
        if self.local:  # object stores have no directories
            for owned in self.dirs:
                _remove_empty_dirs(os.path.join(uri_to_path(self.root), *owned.split("/")), spared)


class _StorePacks:
    """What gc does with the packs of the table's store (see docs/global-dedup.md).

    An unreferenced pack the index does not name is a leftover like any other. One the index
    names may be about to be referenced by a writer that found it there, so it is first
    *retired*: tombstoned and dropped from the index (writers stop finding it, and one that found
    it before refuses to commit). A tombstone older than the grace period is *reaped*: the pack
    is deleted, unless a retained version references it (a write that checked before the
    tombstone and committed after the mark that retired it): then it is *resurrected*.
    """

    def __init__(
        self,
        table: TableSnapshot,
        marked: Marked,
        owned: _TableFiles,
        cutoff: float,
        runner: Runner | None = None,
    ) -> None:
        self.table_path, self.options = table.location.root, table.storage_options
        self.owned = owned
        self.unreadable_index: str | None = None
        try:  # each part of the index a unit of the runner: a Spark task each
            packs = indexed_packs(self.table_path, self.options, parts_on(runner, table))
        except StoreIndexError as exc:  # which packs writers may take cannot be told: keep all
            self.unreadable_index = str(exc)
            packs = {p.removeprefix(f"{STORE_DIR}/") for p in owned.objects if p.startswith(PACKS)}
        tombstones = retired_packs(self.table_path, self.options)
        # retired packs: only the rules below ever delete them
        self.tombstoned = {f"{STORE_DIR}/{p}" for p in tombstones}
        if marked.keeps_whole(f"{PACKS}/") or self.unreadable_index:  # retire, reap nothing
            self.indexed = {f"{STORE_DIR}/{p}" for p in packs}
            self.unreferenced_indexed, self.retire, self.resurrect, self.reap = [], [], [], []
            self.waiting = sorted(p for p in tombstones if f"{STORE_DIR}/{p}" in owned.objects)
            return
        referenced = {
            p.removeprefix(f"{STORE_DIR}/") for p in marked.paths if p.startswith(STORE_DIR)
        }
        self.indexed = {f"{STORE_DIR}/{p}" for p in packs}
        self.unreferenced_indexed = sorted(packs - referenced)
        self.retire = [p for p in self.unreferenced_indexed if self._mtime(p) < cutoff]
        due = [p for p, retired_at in tombstones.items() if retired_at < cutoff]
        self.resurrect = [p for p in due if p in referenced]
        # a pack still in the index (its retirement could not update it) is retired again
        self.retire += [p for p in due if p not in referenced and p in packs]
        self.reap = [p for p in due if p not in referenced and p not in packs]
        # retired packs whose tombstone is younger than the grace period: kept for now
        self.waiting = sorted(
            p for p in tombstones if p not in due and f"{STORE_DIR}/{p}" in owned.objects
        )

    @property
    def reap_paths(self) -> list[str]:
        """The reaped packs that exist (a tombstone may outlive its pack)."""
        return [f"{STORE_DIR}/{p}" for p in self.reap if f"{STORE_DIR}/{p}" in self.owned.objects]

    def apply(self, progress: ProgressCallback | None = None) -> None:
        retire_packs(self.table_path, self.retire, self.options)
        forget_tombstones(self.table_path, self.resurrect, self.options)
        self.owned.delete([f"{STORE_DIR}/{pack}" for pack in self.reap], progress, "reap packs")
        forget_tombstones(self.table_path, self.reap, self.options)

    def size(self, pack: str) -> int:
        info = self.owned.objects.get(f"{STORE_DIR}/{pack}")
        return info.size if info is not None else 0

    def _mtime(self, pack: str) -> float:
        info = self.owned.objects.get(f"{STORE_DIR}/{pack}")
        return info.mtime if info is not None else float("inf")


def _prefixed(path: str) -> bool:
    """Whether ``path`` (relative to its owned directory) is named after a blobhouse write."""
    return WRITE_PREFIX.match(path.split("/", 1)[0]) is not None


def _staged_by(path: str, prefixes: set[str]) -> bool:
    """Whether ``path`` (relative to its owned directory: a data file, a sidecar in its
    directory, or a store pack) was staged by a write with one of ``prefixes``: its first name
    tells."""
    return path.split("/", 1)[0].startswith(tuple(prefixes))


def _refuse_symlinked(root_dir: str, owned: str) -> None:
    """gc deletes only inside the table root: a symlinked owned directory would lead it
    elsewhere (listings descend into no other symlink)."""
    parts = owned.split("/")
    for depth in range(1, len(parts) + 1):
        path = os.path.join(root_dir, *parts[:depth])
        if os.path.islink(path):
            raise BlobhouseError(
                f"{path} is a symlink; gc refuses to sweep outside the table root "
                f"({root_dir}); replace the link with the directory it points to"
            )


def _remove_empty_dirs(root: str, spared: Callable[[str, float], bool] | None = None) -> None:
    """Remove the empty folders below ``root``, but those ``spared(path relative to root,
    mtime)`` keeps."""
    for folder, dirs, files in os.walk(root, topdown=False):
        if folder != root and not dirs and not files:
            with contextlib.suppress(OSError):
                if spared is None or not spared(
                    os.path.relpath(folder, root), os.stat(folder).st_mtime
                ):
                    os.rmdir(folder)
