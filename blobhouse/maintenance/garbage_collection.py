"""gc: remove old versions, then every file the table owns that no retained version of any
branch references once it is older than a grace period.

What the table owns (data files, their sidecars, leftovers of writes that never committed) lives
under ``data/`` and each branch's ``tree/<branch>/data/``, and store packs under
``_blobs/packs/``; external objects under the table's allowed bases belong to the user and are
never looked at. The mark phase (:func:`referenced_paths`) covers every retained version of main
and of every branch (tagged versions among them: Lance keeps those), per
:class:`~blobhouse.maintenance.walk.FragmentState`, here or in Spark tasks
(``blobhouse.spark.gc``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

import pyarrow as pa

from blobhouse import leases
from blobhouse.errors import BlobhouseError, InvalidInputError
from blobhouse.layout import TREE_DIR, branch_data_dir
from blobhouse.maintenance.walk import (
    FragmentState,
    Progress,
    VersionGraph,
    VersionRef,
    fragment_references,
    fragment_states,
    opened_states,
)
from blobhouse.storage import ObjectInfo, is_local, object_store, uri_to_path
from blobhouse.store import (
    PACKS_DIR,
    STORE_DIR,
    forget_tombstone,
    indexed_packs,
    maintain_index,
    retire_packs,
    retired_packs,
)

if TYPE_CHECKING:
    from blobhouse.table import Table

DEFAULT_GRACE = timedelta(hours=24)
_PACKS = f"{STORE_DIR}/{PACKS_DIR}"


def referenced_paths(table: Table, state: FragmentState) -> set[str]:
    """Paths, relative to the table root, of the data files, sidecars and store packs one
    fragment state uses; ``table`` is opened at ``state.ref``.

    A data file the version names may be gone (Lance's cleanup has been seen removing the files
    of a version it keeps): what it referenced cannot be read, so its sidecar directory and the
    whole store are marked (entries ending in ``/``: everything under them is kept)."""
    prefix = f"{table.uri}/"
    referenced = {uri.removeprefix(prefix) for uri in state.data_files if uri.startswith(prefix)}
    try:
        for batch in fragment_references(table, state.fragment_id):
            referenced.update(
                uri.removeprefix(prefix)
                for uri in batch.refs.field("uri").unique().to_pylist()
                if uri.startswith(prefix)
            )
    except (OSError, ValueError, pa.ArrowException):
        store = object_store(table.uri, table.storage_options)
        missing = [uri for uri in state.data_files if store.size(uri) is None]
        if not missing:
            raise
        referenced |= {f"{uri.removeprefix(prefix).removesuffix('.lance')}/" for uri in missing} | {
            f"{_PACKS}/"
        }
    return referenced


def mark(
    table: Table, graph: VersionGraph | None = None, progress: Progress | None = None
) -> set[str]:
    """Every path (relative to the table root) that a retained version of any branch (of
    ``graph``) references; a branch that cannot be read where the table is now keeps its
    directory and the whole store (entries ending in ``/``)."""
    graph = graph or VersionGraph.of(table)
    states = fragment_states(table, list(graph.versions))
    referenced = unreadable_marks(graph)
    for done, (at, state) in enumerate(opened_states(table, states)):
        if progress:
            progress("mark", done, len(states))
        referenced |= referenced_paths(at, state)
    if progress:
        progress("mark", len(states), len(states))
    return referenced


def unreadable_marks(graph: VersionGraph) -> set[str]:
    """What branches that cannot be read keep: their directory and the whole store."""
    if not graph.unreadable:
        return set()
    return {f"{TREE_DIR}/{name}/" for name, _ in graph.unreadable} | {f"{_PACKS}/"}


class Marked:
    """The result of a mark: paths, and directories (ending in ``/``) kept whole."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = set(paths)
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


def orphans(table: Table, referenced: Iterable[str] | None = None) -> dict:
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
    marked = Marked(mark(table) if referenced is None else referenced)
    owned = _TableFiles(table)
    found = sorted(p for p in owned.objects if p not in marked)
    return {
        "files": len(found),
        "bytes": sum(owned.objects[p].size for p in found),
        "paths": [owned.location(p) for p in found],
    }


def gc(
    table: Table,
    *,
    retain_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    progress: Progress | None = None,
    referenced: Callable[[Table, list[VersionRef]], set[str]] | None = None,
) -> dict:
    """Remove old versions, then every file the table owns (under ``data/`` and
    ``_blobs/packs/``) that no retained version references and that is older than ``grace``
    (younger ones may belong to a write still in progress). A store pack the store's index
    names is retired first and deleted by a later run (:class:`_StorePacks`), since a writer may
    have found it in the index and be about to reference it.

    Versions of this table's branch go through Lance (``cleanup_old_versions``; nothing is
    removed unless ``retain_versions`` or ``older_than`` is given); tagged versions, and
    versions a branch was made from, are kept and reported (``kept_tagged_versions``), never an
    error. Files are marked by every retained version of every branch. Only the table's own
    directories are ever considered: external objects the user owns are never touched.
    ``dry_run`` reports without deleting. ``referenced(table, versions)`` replaces the mark
    of the versions that can be read (Spark runs it in parallel).
    Ages are measured by the store's clock (on S3: the server's), never the local one; on S3,
    uploads a killed write left unfinished are aborted too, by the same rules.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"img": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t")
    >>> gc(t, dry_run=True)["removed_files"]
    0
    """
    _check_retention(retain_versions, older_than, grace)
    removed_versions: list[int] = []
    kept_tagged: list[int] = []
    by_lance = {"files": 0, "bytes": 0}  # what Lance's cleanup removed with the versions
    if retain_versions is not None or older_than is not None:
        before = {v["version"] for v in table.versions()}
        if not dry_run:
            cleaned = table.dataset.cleanup_old_versions(
                older_than=older_than,
                retain_versions=retain_versions,
                error_if_tagged_old_versions=False,
            )
            by_lance = {
                "files": cleaned.data_files_removed
                + cleaned.deletion_files_removed
                + cleaned.index_files_removed,
                "bytes": cleaned.bytes_removed,
            }
        table = table.checkout(table.version)
        removed_versions = sorted(before - {v["version"] for v in table.versions()})
        kept_tagged = _kept_for_tags(table, removed_versions)
    table_path, options = table.location.root, table.storage_options
    store = object_store(table.uri, options)
    # files staged after this instant may belong to a write that commits after the mark
    mark_started = store.now(table.uri)
    cutoff = mark_started - grace.total_seconds()
    graph = VersionGraph.of(table)
    if referenced is not None:  # Spark marks what can be read; the rest is kept whole here
        marked = Marked(referenced(table, list(graph.versions)) | unreadable_marks(graph))
    else:
        marked = Marked(mark(table, graph, progress))
    owned = _TableFiles(table)
    packs = _StorePacks(table, marked, owned, cutoff)
    # writes that ran at any time since the mark began (including those that committed after
    # it, which the mark could not see) keep their files, however old
    running = leases.live_prefixes(table_path, mark_started - leases.TIMEOUT_SECONDS, options)
    # retired packs (tombstoned) follow the store's rules only: reaped once their tombstone
    # has aged (counted there), never swept as plain leftovers before that
    leftovers = sorted(p for p in owned.objects if p not in marked and p not in packs.tombstoned)
    old = [
        p
        for p in leftovers
        if owned.objects[p].mtime < cutoff
        and p not in packs.indexed
        and not _staged_by(owned.relative[p], running)
    ]
    young = len(leftovers) - len(old) - len(packs.unreferenced_indexed)
    reclaimed = sum(owned.objects[p].size for p in old + packs.reap_paths)
    aborted_uploads = 0
    if not dry_run:
        for done, path in enumerate(old):
            if progress and done % 100 == 0:
                progress("sweep", done, len(old))
            owned.delete(path)
        packs.apply()
        # index versions a writer may be reading stay, whatever the grace
        maintain_index(table_path, max(grace, timedelta(hours=1)), options)
        leases.remove_expired(
            table_path, min(cutoff, mark_started - leases.TIMEOUT_SECONDS), options
        )
        aborted_uploads = owned.abort_uploads(cutoff, running)
        owned.remove_empty_dirs()
    return {
        "dry_run": dry_run,
        "branch": table.branch,
        "removed_versions": removed_versions,
        "retained_versions": [v["version"] for v in table.versions()],
        "kept_tagged_versions": kept_tagged,
        "removed_files": len(old) + len(packs.reap) + by_lance["files"],
        "reclaimed_bytes": reclaimed + by_lance["bytes"],
        "removed_by_lance_cleanup": by_lance,
        "kept_referenced_files": len(marked.paths),
        "kept_unreadable": marked.kept_whole,
        "kept_young_files": young,
        "retired_packs": len(packs.retire),
        "reaped_packs": len(packs.reap),
        "resurrected_packs": len(packs.resurrect),
        "kept_retired_packs": len(packs.waiting),
        "aborted_uploads": aborted_uploads,
        "paths": [owned.location(p) for p in old + packs.reap_paths],
    }


def _check_retention(
    retain_versions: int | None, older_than: timedelta | None, grace: timedelta
) -> None:
    if retain_versions is not None and (
        isinstance(retain_versions, bool)
        or not isinstance(retain_versions, int)
        or not 1 <= retain_versions < 2**63
    ):
        raise InvalidInputError(
            f"retain_versions must be a whole number of versions, 1 or more, got "
            f"{retain_versions!r}"
        )
    for name, value in (("older_than", older_than), ("grace", grace)):
        if value is None and name == "older_than":
            continue
        if not isinstance(value, timedelta) or value < timedelta(0):
            raise InvalidInputError(
                f"{name} must be a datetime.timedelta of 0 or more, got {value!r}"
            )


def _kept_for_tags(table: Table, removed: list[int]) -> list[int]:
    """Versions of this branch a tag keeps although cleanup removed a newer version."""
    if not removed:
        return []
    retained = {v["version"] for v in table.versions()}
    tagged = {t["version"] for t in table.tags().values() if t["branch"] == table.branch}
    return sorted(v for v in tagged & retained if v < max(removed))


def owned_dirs(table: Table) -> list[str]:
    """The directories (relative to the root) whose files belong to the table: main's and each
    branch's ``data/``, and the store's packs."""
    branches = [branch_data_dir(b) for b in sorted(table.branches())]
    return ["data", *branches, _PACKS]


class _TableFiles:
    """The files a table owns, listed once: path relative to the table root -> size, mtime."""

    def __init__(self, table: Table) -> None:
        self.root = table.uri
        self.store = object_store(table.uri, table.storage_options)
        self.local = is_local(table.uri)
        self.dirs = owned_dirs(table)
        self.objects: dict[str, ObjectInfo] = {}
        self.relative: dict[str, str] = {}  # path -> path relative to its owned directory
        for owned in self.dirs:
            if self.local:
                _refuse_symlinked(uri_to_path(self.root), owned)
            for info in self.store.list(f"{self.root}/{owned}"):
                self.objects[f"{owned}/{info.name}"] = info
                self.relative[f"{owned}/{info.name}"] = info.name

    def location(self, path: str) -> str:
        """Where ``path`` is, as users name it: a local path, or a URI."""
        if self.local:
            return os.path.join(uri_to_path(self.root), *path.split("/"))
        return f"{self.root}/{path}"

    def delete(self, path: str) -> None:
        self.store.delete(f"{self.root}/{path}")

    def abort_uploads(self, cutoff: float, running: set[str]) -> int:
        """Abort uploads older than ``cutoff`` that no running write owns."""
        return sum(
            self.store.abort_uploads(
                f"{self.root}/{owned}",
                cutoff,
                lambda name: _staged_by(name, running),
            )
            for owned in self.dirs
        )

    def remove_empty_dirs(self) -> None:
        if self.local:  # object stores have no directories
            for owned in self.dirs:
                _remove_empty_dirs(os.path.join(uri_to_path(self.root), *owned.split("/")))


class _StorePacks:
    """What gc does with the packs of the table's store (see docs/global-dedup.md).

    An unreferenced pack the index does not name is a leftover like any other. One the index
    names may be about to be referenced by a writer that found it there, so it is first
    *retired*: tombstoned and dropped from the index (writers stop finding it, and one that found
    it before refuses to commit). A tombstone older than the grace period is *reaped*: the pack
    is deleted, unless a retained version references it (a write that checked before the
    tombstone and committed after the mark that retired it): then it is *resurrected*.
    """

    def __init__(self, table: Table, marked: Marked, owned: _TableFiles, cutoff: float) -> None:
        self.table_path, self.options = table.location.root, table.storage_options
        self.owned = owned
        packs = indexed_packs(self.table_path, self.options)
        tombstones = retired_packs(self.table_path, self.options)
        # retired packs: only the rules below ever delete them
        self.tombstoned = {f"{STORE_DIR}/{p}" for p in tombstones}
        if marked.keeps_whole(f"{_PACKS}/"):  # retire and reap nothing
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

    def apply(self) -> None:
        retire_packs(self.table_path, self.retire, self.options)
        for pack in self.resurrect:
            forget_tombstone(self.table_path, pack, self.options)
        for pack in self.reap:
            self.owned.delete(f"{STORE_DIR}/{pack}")
            forget_tombstone(self.table_path, pack, self.options)

    def _mtime(self, pack: str) -> float:
        info = self.owned.objects.get(f"{STORE_DIR}/{pack}")
        return info.mtime if info is not None else float("inf")


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


def _remove_empty_dirs(root: str) -> None:
    for folder, dirs, files in os.walk(root, topdown=False):
        if folder != root and not dirs and not files:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
