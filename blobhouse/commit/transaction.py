"""The transaction layer: every change to a table is one :class:`Transaction`.

A transaction stages files -- data files, their sidecars, store packs -- whose names start with
its prefix (``<kind>-<id>-``), holds a lease while it stages and commits so gc keeps them
(:mod:`blobhouse.commit.leases`), commits one Lance operation on the version it read, and on any
failure removes everything it staged. Every commit to a table goes through one: writes,
backfills, compactions, updates, merges, deletes, schema and property changes, and the
registration or relocation of the table's store (only the store index, a dataset of its own,
commits on its own: :mod:`blobhouse.store`).

What differs between changes is supplied by them, as in PyIceberg's snapshot producers: a change
plans its work, writes its files (in this process, or in Spark tasks: the transaction pickles, and
every task stages under its prefix and holds its lease) and names its Lance operation;
:meth:`Transaction.commit` does the rest, and the change template (:mod:`blobhouse.commit.change`)
runs every change's lifecycle (lease, stage, commit or abort, again on the latest version when a
concurrent commit preempted it: :func:`retrying`).

A merge that inserts rows also names their keys (:class:`Inserts`): Lance would rebase two
merges' appended rows over each other silently, so such a commit runs under the table's upsert
lock (:mod:`blobhouse.commit.locks`) after a check that no commit since its read version holds
one of those keys; one that does makes the merge plan again (its rows are then updates).

Deletion files are the exception to the naming rule: Lance names them itself
(``_deletions/<fragment>-<read version>-<random>.arrow``; pylance 14.0.2 offers no way to choose
the name or write one with another writer), so they cannot carry the prefix and no sweep of the
prefix finds them. A change writes them with :func:`stage_deletion`, keeps the records it gets,
and hands them to :meth:`Transaction.abort`, which removes exactly those files.

>>> import tempfile, pyarrow as pa, lance
>>> from lance import LanceOperation
>>> from blobhouse import open_table, write_table
>>> from blobhouse.files.session import BlobSession
>>> table = write_table(pa.table({"id": [1]}), tempfile.mkdtemp() + "/t")
>>> txn = Transaction.start(table.location, table.version, kind="example")
>>> session = BlobSession(f"{table.location.data_dir}/{txn.name_prefix}0.lance")
>>> written = session.write_data_file(pa.table({"id": [2]}))
>>> fragment = written.fragment([0])
>>> dataset = txn.commit([written], lambda: LanceOperation.Append([fragment]))
>>> open_table(table.uri).to_arrow().column("id").to_pylist()
[1, 2]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import lance
from lance import LanceDataset, LanceOperation
from lance.commit import CommitConflictError
from lance.file import LanceFileSession
from lance.fragment import FragmentMetadata

from blobhouse.commit import leases, locks
from blobhouse.commit.interrupts import HeldInterrupts
from blobhouse.errors import (
    BlobhouseError,
    ConcurrentCommitError,
    KeysInsertedMeanwhile,
    StaleWriteError,
    cleanup_after,
    lance_message,
)
from blobhouse.files.references import file_path
from blobhouse.files.session import BlobSession, WrittenFile
from blobhouse.io.objects import LANCE_IO_ERRORS, StorageOptions, object_store
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    STORE_DIR,
    TableLocation,
    aborted_marker,
    branch_data_dir,
    sidecar_folder,
)
from blobhouse.managed import Registry, check_usable, register
from blobhouse.options import CommitOptions
from blobhouse.ownership import claim, release
from blobhouse.store.claims import adopt, remove_claims
from blobhouse.store.duplicates import find_duplicates, record_duplicates
from blobhouse.store.index import append_to_index, tidy_index
from blobhouse.store.index_part import EntryBatches, entry_batches
from blobhouse.store.packs import (
    StoredPayload,
    check_packs_usable,
    missing_objects,
    remove_packs,
    remove_staged_packs,
)
from blobhouse.store.records import recorded_entries, remove_records

T = TypeVar("T")
DEFAULT_RETRIES = CommitOptions.retries
Operation = Callable[[], LanceOperation.BaseOperation]
#: how many of the keys that two merges inserted an error names
SHOWN_KEYS = 3


class TableCreatedMeanwhile(BlobhouseError):
    """A write that created the table lost the race to another creator; nothing of it was
    committed (its files are still staged)."""


@dataclass(frozen=True)
class Inserts:
    """The keys a merge inserts: ``count`` rows whose key (``columns``) the version it read
    lacks. ``found(dataset, fragment_ids)``: up to :data:`SHOWN_KEYS` of those keys that the
    given fragments of ``dataset`` hold (as dicts), computed where the keys are (in this process,
    or in Spark tasks)."""

    columns: tuple[str, ...]
    count: int
    found: Callable[[LanceDataset, list[int]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Transaction:
    """One change to the table at ``location``, planned on ``read_version`` (None: the change
    creates the table). The files it stages are named ``<name_prefix><uuid>...``."""

    location: TableLocation
    read_version: int | None
    storage_options: StorageOptions | None = field(
        default=None, repr=False
    )  # credentials: never printed
    name_prefix: str = "write-0-"

    @classmethod
    def start(
        cls,
        location: TableLocation,
        read_version: int | None,
        storage_options: StorageOptions | None = None,
        *,
        kind: str = "write",
        id: str | None = None,
    ) -> Transaction:
        """A new transaction of ``kind`` (it names the staged files), or the one ``id`` names
        (a write that already staged files under it, such as Spark's store packs)."""
        id = id or f"{kind}-{uuid.uuid4().hex[:12]}"
        return cls(location, read_version, storage_options, f"{id}-")

    @property
    def id(self) -> str:
        """What names this transaction's files (``<id>-<uuid>...``) and its lease."""
        return self.name_prefix.removesuffix("-")

    @property
    def kind(self) -> str:
        """What kind of change this is (``write``, ``merge``, ...), as its id says."""
        return self.id.rpartition("-")[0] or "change"

    def on_version(self, read_version: int | None) -> Transaction:
        """The same transaction (same staged files and lease), planned on another version."""
        return replace(self, read_version=read_version)

    def lease(self) -> contextlib.AbstractContextManager[None]:
        """Hold this transaction's lease while a block stages files (gc keeps them)."""
        return leases.held(self.location.root, self.name_prefix, self.storage_options)

    def read_dataset(self) -> LanceDataset:
        """The table's dataset at the version this transaction read."""
        return lance.dataset(
            self.location.dataset_path,
            version=self.read_version,
            storage_options=self.storage_options,
        )

    def commit(
        self,
        written: Sequence[WrittenFile],
        operation: Operation | None = None,
        *,
        commit: Callable[[], LanceDataset] | None = None,
        inserts: Inserts | None = None,
        stored: Sequence[StoredPayload] = (),
        recorded: bool = False,
        superseded: frozenset[str] = frozenset(),
    ) -> LanceDataset:
        """Make ``written`` visible with one Lance commit of ``operation()`` on the read
        version (or with ``commit()``, a commit of the caller's own such as Lance's compaction
        commit that remaps indices), and return the committed dataset.

        A merge that inserts keys names them (``inserts``): it commits under the table's upsert
        lock, and only if no commit since its read version holds one of them
        (:meth:`check_inserts`); else :class:`~blobhouse.errors.KeysInsertedMeanwhile`.

        ``stored``: payloads this transaction put in the store besides its files' own (a
        backfill's or a merge's tasks'): recorded with them; ``recorded``: so are those its
        store-first steps or Spark tasks recorded (:mod:`blobhouse.store.records`), streamed
        into the index, whose records then go.
        ``superseded``: store packs this change moves payloads out of (a compaction's
        repacked ones): the copies it makes of theirs are not duplicates.

        Right before the commit, every staged file must still exist and the store packs the
        files reference must not be retired (gc may have run meanwhile); the lease is held
        throughout, also while Lance retries; the external objects the files hand to the table
        must not be doomed or gone (:func:`blobhouse.managed.check_usable`), and this table
        becomes their one owner (:func:`blobhouse.ownership.claim`: an object another table
        owns refuses the commit, except in a compaction, which keeps such references without
        registering them). Right after it,
        the payloads the files added to the table's store are recorded in its index and the
        objects they hand over in its managed-object registry (a crash in between loses dedup
        or leaves an object unmanaged, never a reference). If anything fails, nothing is visible
        and what this transaction staged is removed; except when the table was created by
        another writer meanwhile (:class:`TableCreatedMeanwhile`): the caller may commit the
        same files again on that table."""
        if commit is None:
            if operation is None:
                raise ValueError("commit needs an operation or a commit function")
            commit = lambda: lance_commit(  # noqa: E731
                self.location, operation, self.read_version, self.storage_options
            )
        with HeldInterrupts() as interrupts:  # a Ctrl-C waits for the commit's records
            commit = _armed(commit, interrupts)
            if inserts is not None and inserts.count:
                commit = self._with_unique_keys(commit, inserts)
            try:
                dataset, owned_elsewhere = self._checked_commit(written, commit)
            except TableCreatedMeanwhile:
                raise
            except BaseException as exc:
                cleanup_after(exc, lambda: self.abort(written))
                raise
            own = [s for w in written for s in w.stored] + _adopted(written) + list(stored)
            root, options = self.location.root, self.storage_options
            record_stored(root, self._stored_entries(own, recorded), options, superseded)
            if recorded:
                remove_records(root, self.id, options)
            self._register_managed(dataset, written, owned_elsewhere)
            if any(w.claimed for w in written):
                remove_claims(self.location.root, self.id, self.storage_options)
            interrupts.landed(f"the {self.kind} committed first: version {dataset.version}")
            return dataset

    def _stored_entries(self, own: list[StoredPayload], recorded: bool) -> EntryBatches:
        """The store entries this transaction added: ``own``, and (``recorded``) those its
        steps or tasks recorded (:mod:`blobhouse.store.records`), streamed a record at a time."""
        mine = entry_batches(own)
        if not recorded:
            return mine
        records = recorded_entries(self.location.root, self.id, self.storage_options)
        return lambda: itertools.chain(mine(), records())

    def _with_unique_keys(
        self, commit: Callable[[], LanceDataset], inserts: Inserts
    ) -> Callable[[], LanceDataset]:
        """``commit`` run under the table's upsert lock, after :meth:`check_inserts`.

        Checking the latest version and then committing leaves a window in which another merge
        commits the same keys (Lance rebases one merge's appended rows over another's without a
        conflict): the lock closes it among blobhouse's merges. The versions committed before
        the lock is asked for are checked outside it, so that the lock is held only for what
        lands meanwhile (usually nothing) and the commit."""

        def guarded() -> LanceDataset:
            checked = self.check_inserts(inserts)
            try:
                with locks.held(upsert_lock(self.location), self.storage_options):
                    self.check_inserts(inserts, checked)
                    return commit()
            except locks.LockTimeoutError as exc:
                raise ConcurrentCommitError(
                    f"merge into {self.location}: another merge held the table's upsert lock "
                    f"for {locks.WAIT_SECONDS:.0f} s; nothing was committed, run it again",
                    True,
                ) from exc

        return guarded

    def check_inserts(self, inserts: Inserts, checked: LanceDataset | None = None) -> LanceDataset:
        """Raise :class:`~blobhouse.errors.KeysInsertedMeanwhile` if a commit since the read
        version (or since ``checked``, a later version checked already) holds a key of
        ``inserts``; returns the latest version, now checked. The read version lacked every
        such key, so only the fragments made or rewritten since can hold one: only those are
        read."""
        latest = lance.dataset(self.location.dataset_path, storage_options=self.storage_options)
        since = checked.version if checked is not None else self.read_version
        if latest.version == since:
            return latest
        with commit_errors(self.location, self.read_version, self.storage_options):
            before = checked or self.read_dataset()  # gc may have removed the read version
        changed = changed_fragments(before, latest)
        found = inserts.found(latest, changed) if changed else []
        if found:
            columns = list(inserts.columns)
            raise KeysInsertedMeanwhile(
                f"merge into {self.location}: a concurrent commit (version "
                f"{since + 1}..{latest.version}) inserted key(s) on {columns} that this merge, "
                f"planned on version {self.read_version}, inserts too, e.g. "
                f"{', '.join(map(str, found))}",
                found,
            )
        return latest

    @property
    def rewrites_only(self) -> bool:
        """Whether this change only rewrites rows the table has (a compaction): it hands no
        object over that the rows did not reference already."""
        return self.name_prefix.startswith("compact-")

    def _register_managed(
        self, dataset: LanceDataset, written: Sequence[WrittenFile], skipped: Iterable[str]
    ) -> None:
        skipped = set(skipped)
        uris = [u for u in _managed(written) if u not in skipped]
        if not uris:
            return
        try:
            register(self.location, dataset.schema, uris, self.name_prefix, self.storage_options)
        except Exception as exc:  # the commit stands: an unregistered object is only a leak
            warnings.warn(
                f"managed objects of {self.location.root} were not registered: {exc}",
                stacklevel=3,
            )

    def _checked_commit(
        self, written: Sequence[WrittenFile], commit: Callable[[], LanceDataset]
    ) -> tuple[LanceDataset, list[str]]:
        """The checks, then the commit: the committed dataset, and the managed objects a
        compaction keeps referencing that another table owns (not this table's to register)."""
        root, options = self.location.root, self.storage_options
        managed = _managed(written)
        taken: list[str] = []
        try:
            with self.lease():
                check_packs_usable(root, {p for w in written for p in w.found_packs}, options)
                adopt(root, _adopted(written), options)
                check_usable(root, managed, options)
                claimed = claim(
                    self.location,
                    managed,
                    options,
                    foreign=lambda: Registry.load(self.location, options).foreign_owners,
                )
                taken = claimed.created
                if claimed.refused and not self.rewrites_only:
                    raise claimed.error(self.location)
                lost = _lost_files(self.location, written, options)
                if lost:
                    raise StaleWriteError(
                        f"{len(lost)} file(s) this write staged are gone (e.g. {lost[0]}): gc "
                        "swept them because the write ran longer than its grace period; "
                        "nothing was committed, retry"
                    )
                return commit(), sorted(claimed.refused)
        except BaseException as exc:
            cleanup_after(
                exc,
                lambda: release(taken, options),  # the objects stay unowned: nothing handed over
                lambda: leases.release(root, self.name_prefix, options),  # it will not commit
            )
            raise

    def abort(
        self,
        written: Iterable[WrittenFile] = (),
        *,
        deletions: Iterable[StagedDeletion] = (),
        tasks_may_run: bool = False,
    ) -> None:
        """Remove what this transaction staged: ``written`` and every file named with its
        prefix (also those of tasks whose results never arrived), the deletion files of
        ``deletions`` (see :func:`stage_deletion`) and its lease; unless it committed after all
        (a Ctrl-C reaches Python only once Lance's commit returned).

        ``tasks_may_run`` (Spark): tasks may still be finishing, so an abort marker goes
        first; a task that completes a file after the sweep finds it and removes its file."""
        if tasks_may_run:
            uri = self._marker_uri()
            object_store(uri, self.storage_options).put(uri, b"")
        remove_written(written, self.location, self.storage_options)
        remove_deletions(deletions, self.location, self.storage_options)
        remove_staged(self.location, self.name_prefix, self.storage_options)
        remove_claims(self.location.root, self.id, self.storage_options)
        remove_records(self.location.root, self.id, self.storage_options)

    def end_task(self, written: Sequence[WrittenFile] | None) -> None:
        """End one task's part of this transaction (``written``: its files; None: it failed
        and removed them). If the driver aborted meanwhile, its sweep may have run before the
        task wrote or touched its lease: the task removes both itself, and a task that
        succeeded raises, since nobody will commit its files. It also sweeps what the write
        staged and claimed since: the packs a failed task kept for others (its claims) and the
        claims tasks made after the sweep."""
        if not self.is_aborted():
            return
        remove_written(written or (), self.location, self.storage_options)
        remove_staged(self.location, self.name_prefix, self.storage_options)
        remove_claims(self.location.root, self.id, self.storage_options)
        remove_records(self.location.root, self.id, self.storage_options)
        leases.release(self.location.root, self.name_prefix, self.storage_options)
        if written is not None:
            raise BlobhouseError(f"write {self.id} was aborted; its files are removed")

    def is_aborted(self) -> bool:
        """Whether the transaction was aborted while tasks ran (see :meth:`abort`)."""
        uri = self._marker_uri()
        return object_store(uri, self.storage_options).size(uri) is not None

    def _marker_uri(self) -> str:
        # outside the prefix: sweeps of the prefix keep it; gc removes it with the leftovers
        return as_uri(f"{self.location.data_dir}/{aborted_marker(self.name_prefix)}")


def _adopted(written: Sequence[WrittenFile]) -> list[StoredPayload]:
    """Payloads the files borrowed from packs no file of the write lists: stored by a task
    that failed after claiming them (blobhouse.store.claims), checked before the commit and
    recorded in the index after it."""
    produced = {p for w in written for p in w.packs}
    found = {b.digest: b for w in written for b in w.borrowed if b.pack not in produced}
    return list(found.values())


def _managed(written: Sequence[WrittenFile]) -> list[str]:
    return sorted({u for w in written for u in w.managed})


def record_stored(
    table_path: str,
    stored: Sequence[StoredPayload] | EntryBatches,
    storage_options: StorageOptions | None,
    superseded: frozenset[str] = frozenset(),
) -> None:
    """Record payloads a committed change added to the store in its index, and those a
    concurrent writer stored too (:mod:`blobhouse.store.duplicates`: compaction merges them),
    then do this write's share of the index's upkeep (:func:`tidy_index`). The commit stands
    whatever happens here: an index that lags only lowers dedup, so a failure is a warning."""
    try:
        index = append_to_index(table_path, stored, storage_options)
    except Exception as exc:
        warnings.warn(f"the store index of {table_path} was not updated: {exc}", stacklevel=3)
        return
    try:
        twice = find_duplicates(table_path, index, stored, storage_options, superseded)
        record_duplicates(table_path, twice, storage_options)
    except Exception as exc:  # a lost record leaves a race's copy in place, nothing else
        warnings.warn(
            f"payloads of {table_path} that another write stored too were not recorded for "
            f"compaction to merge: {exc}",
            stacklevel=3,
        )
    if index is not None:
        tidy_index(table_path, index, storage_options)


def retrying(attempt: Callable[[int], T], retries: int = DEFAULT_RETRIES) -> T:
    """``attempt(n)`` for n = 1, 2, ...: again (it plans on the latest version) after a commit
    that a concurrent one preempted (Lance's retryable conflict), up to ``retries`` times.
    Each attempt after the first waits a random moment first (up to 1 s). A conflict that ends
    it -- a concurrent commit this change cannot be planned over, or a preemption past
    ``retries`` -- is raised as :class:`~blobhouse.errors.ConcurrentCommitError`.

    >>> retrying(lambda n: f"done in {n}")
    'done in 1'
    """
    attempts = 0
    while True:
        attempts += 1
        if attempts > 1:  # jittered: writers preempted together do not meet again at once
            time.sleep(random.uniform(0, min(1.0, 0.01 * 2**attempts)))
        try:
            return attempt(attempts)
        except ConcurrentCommitError:
            raise  # an inner retrying explained it already
        except CommitConflictError as exc:
            if not exc.retryable or attempts > retries:
                raise conflict_error(exc, attempts) from exc
        except OSError as exc:
            if not getattr(exc, "retryable", False) or attempts > retries:
                raise


def conflict_error(exc: CommitConflictError, attempts: int) -> ConcurrentCommitError:
    """Lance's conflict as the reason the change failed, and what the caller can do."""
    if isinstance(exc, KeysInsertedMeanwhile):
        return ConcurrentCommitError(
            f"{exc}; on all {attempts} attempt(s): nothing was committed. Run it again (those "
            "rows are then updates), or allow more conflict retries",
            True,
        )
    if exc.retryable:
        what = (
            f"concurrent commits preempted all {attempts} attempt(s) of this change; nothing "
            "was committed: run it again, or allow more retries"
        )
    else:
        what = (
            "a concurrent commit is incompatible with this change (an overwrite, say); "
            "nothing was committed, and planning it again cannot help"
        )
    return ConcurrentCommitError(f"{what} (Lance: {lance_message(exc)})", exc.retryable)


def lance_commit(
    location: TableLocation,
    operation: Operation,
    read_version: int | None,
    storage_options: StorageOptions | None = None,
) -> LanceDataset:
    """Commit ``operation()`` on ``read_version`` of the table's dataset (main or a branch).

    A table being created (``read_version`` None) is committed as version 1 or not at all:
    Lance would commit a second creator's ``Overwrite`` on top of the first one, so a create
    that finds the table made meanwhile raises :class:`TableCreatedMeanwhile` instead."""
    path = location.dataset_path
    with commit_errors(location, read_version, storage_options):
        if read_version is None:
            return LanceDataset.commit(
                path, operation(), storage_options=storage_options, max_retries=0
            )
        return LanceDataset.commit(
            path, operation(), read_version=read_version, storage_options=storage_options
        )


def upsert_lock(location: TableLocation) -> str:
    """The lock merges that insert keys into the table's branch commit under.

    >>> upsert_lock(TableLocation("/data/t", "dev"))
    'file:///data/t/_leases/locks/upsert.dev'
    """
    name = "upsert" if location.branch is None else f"upsert.{location.branch}"
    return locks.lock_uri(location.root, name)


def changed_fragments(before: LanceDataset, after: LanceDataset) -> list[int]:
    """The fragments of ``after`` that ``before`` lacks or that read other data files (a
    column rewrite): the only ones that may hold rows ``before`` did not."""
    known = {f.fragment_id: _data_files(f) for f in before.get_fragments()}
    return [
        f.fragment_id for f in after.get_fragments() if known.get(f.fragment_id) != _data_files(f)
    ]


def _data_files(fragment) -> tuple[str, ...]:
    return tuple(file_path(d) for d in fragment.metadata.files)


@contextlib.contextmanager
def commit_errors(
    location: TableLocation, read_version: int | None, storage_options: StorageOptions | None
) -> Iterator[None]:
    """Lance's errors of a commit on ``read_version`` told apart: the table was created by
    another writer meanwhile (:class:`TableCreatedMeanwhile`), or gc removed the read version
    while the write ran (:class:`StaleWriteError`); anything else as it is."""
    path = location.dataset_path
    try:
        yield
    except (OSError, ValueError) as exc:
        if read_version is None and _version_exists(path, None, storage_options):
            raise TableCreatedMeanwhile(f"{location} was created by another writer") from exc
        if read_version is not None and not _version_exists(path, read_version, storage_options):
            raise StaleWriteError(
                f"version {read_version} of {location}, which this write started from, was "
                "removed by gc while it ran; nothing was committed, retry the write"
            ) from exc
        raise


@dataclass(frozen=True)
class StagedDeletion:
    """Rows a change deletes from one fragment: the fragment's new metadata (None: no row is
    left) and the deletion file Lance wrote for it, relative to the dataset (None: it wrote
    none). It pickles: Spark tasks return it to the driver."""

    fragment_id: int
    metadata: FragmentMetadata | None
    path: str | None


def stage_deletion(
    dataset: LanceDataset, fragment_id: int, offsets: Sequence[int]
) -> StagedDeletion:
    """Delete the rows at ``offsets`` (physical, within the fragment) of a fragment of
    ``dataset``, staged: Lance writes the fragment's new deletion file, visible once a commit
    uses the returned metadata. Keep the record for :meth:`Transaction.abort`: the file's name
    cannot carry the transaction's prefix.

    >>> import tempfile, lance, pyarrow as pa
    >>> dataset = lance.write_dataset(pa.table({"id": [1, 2, 3]}), tempfile.mkdtemp())
    >>> staged = stage_deletion(dataset, 0, [1])
    >>> staged.metadata.num_deletions, staged.path.startswith("_deletions/0-1-")
    (1, True)
    >>> stage_deletion(dataset, 0, [0, 1, 2])  # no row left: no file
    StagedDeletion(fragment_id=0, metadata=None, path=None)
    """
    fragment = dataset.get_fragment(fragment_id)
    before = _deletion_path(fragment_id, fragment.metadata)
    metadata = fragment.delete_rows(offsets)
    path = _deletion_path(fragment_id, metadata)
    # no new row deleted: Lance hands back the fragment's committed file, which is not ours
    return StagedDeletion(fragment_id, metadata, path if path != before else None)


def _deletion_path(fragment_id: int, metadata: FragmentMetadata | None) -> str | None:
    if metadata is None or metadata.deletion_file is None:
        return None
    return metadata.deletion_file.path(fragment_id)


def remove_deletions(
    deletions: Iterable[StagedDeletion],
    location: TableLocation,
    storage_options: StorageOptions | None = None,
) -> None:
    """Delete the deletion files of ``deletions`` that will never be committed (those the
    latest version uses are kept: see :func:`committed_names`)."""
    paths = [d.path for d in deletions if d.path is not None]
    if not paths:
        return
    used = committed_deletions(location, storage_options)
    for path in paths:
        if path in used:
            continue
        uri = as_uri(f"{location.dataset_path}/{path}")
        with contextlib.suppress(*LANCE_IO_ERRORS):  # best effort: Lance's cleanup has the rest
            object_store(uri, storage_options).delete(uri)


def committed_deletions(
    location: TableLocation, storage_options: StorageOptions | None
) -> set[str]:
    """The deletion files (relative to the dataset) the latest version of the branch uses."""
    paths = (
        _deletion_path(f.fragment_id, f.metadata)
        for f in _latest_fragments(location, storage_options)
    )
    return {p for p in paths if p is not None}


def remove_written(
    files: Iterable[WrittenFile],
    location: TableLocation,
    storage_options: StorageOptions | None = None,
) -> None:
    """Delete data files, sidecars and store packs that were written but will never be
    committed (those the table's latest version uses are kept: see :func:`committed_names`)."""
    files = list(files)
    committed = committed_names(location, storage_options) if files else set()
    for written in files:
        if written.name in committed:
            continue
        remove_packs(location.root, written.packs, storage_options)
        session = BlobSession(f"{location.data_dir}/{written.name}", storage_options)
        session.sidecars = list(written.sidecars)
        session.abort()


def _armed(commit: Callable[[], T], interrupts: HeldInterrupts) -> Callable[[], T]:
    """``commit``, holding Ctrl-C from its start (what it commits is recorded after it)."""

    def armed() -> T:
        interrupts.arm()
        return commit()

    return armed


def committed_names(location: TableLocation, storage_options: StorageOptions | None) -> set[str]:
    """The data files the latest version of the table's branch uses. A write interrupted as
    its commit returns (Ctrl-C reaches Python only once Lance's commit is done) fails after
    committing: its cleanup must not remove what it committed."""
    fragments = _latest_fragments(location, storage_options)
    return {file_path(f) for fragment in fragments for f in fragment.metadata.files}


def _latest_fragments(location: TableLocation, storage_options: StorageOptions | None) -> list:
    """The fragments of the latest version of the table's branch (none: no table yet)."""
    try:
        dataset = lance.dataset(location.dataset_path, storage_options=storage_options)
    except (ValueError, OSError):
        return []
    return dataset.get_fragments()


def remove_staged(
    location: TableLocation, name_prefix: str, storage_options: StorageOptions | None = None
) -> None:
    """Delete every data file (and its sidecars) and store pack whose name starts with
    ``name_prefix``, and the lease of that prefix; unless the latest version uses one of them
    (the change committed after all)."""
    if not name_prefix:
        raise ValueError("remove_staged needs a non-empty prefix")
    if any(name.startswith(name_prefix) for name in committed_names(location, storage_options)):
        return
    data_dir = location.data_dir
    remove_staged_packs(location.root, name_prefix, storage_options)
    leases.release(location.root, name_prefix, storage_options)
    files = LanceFileSession(data_dir, storage_options=storage_options)
    try:
        listed = files.list()
    except LANCE_IO_ERRORS:  # cleanup is best effort: gc removes what is left
        return
    staged = [p for p in listed if p.startswith(name_prefix)]
    for path in staged:
        with contextlib.suppress(*LANCE_IO_ERRORS):
            files.delete_file(path)
    if "://" not in data_dir:
        for key in {sidecar_folder(p.split("/", 1)[0]) for p in staged}:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(data_dir, key))


def _lost_files(
    location: TableLocation, written: Sequence[WrittenFile], storage_options: StorageOptions | None
) -> list[str]:
    """The files of ``written`` (relative to the table root) that no longer exist."""
    data = branch_data_dir(location.branch)
    paths = [
        path
        for w in written
        for path in (
            f"{data}/{w.name}",
            *(f"{data}/{s}" for s in w.sidecars),
            *(f"{STORE_DIR}/{p}" for p in w.packs),
        )
    ]
    return missing_objects(location.root, paths, storage_options)


def _version_exists(path: str, version: int | None, storage_options: StorageOptions | None) -> bool:
    """Whether the dataset at ``path`` has ``version`` (None: any version)."""
    try:
        lance.dataset(path, version=version, storage_options=storage_options)
    except (OSError, ValueError):
        return False
    return True
