"""Walking a table's retained versions: each distinct fragment state is visited once.

Most fragments are identical across versions (same data files, same deletions), so verify and
gc work on :class:`FragmentState` s, not on (version, fragment) pairs: a state is read once and
what it finds is reported for every version that holds it. A state is small and pickles, so a
Spark task can take one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa

from blobhouse.errors import BlobhouseError
from blobhouse.files import transactions
from blobhouse.files.references import Unresolved, file_path
from blobhouse.progress import Amounts
from blobhouse.snapshot import one_more_fragment, snapshot_of
from blobhouse.values import ROW_ADDRESS, get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from lance.fragment import DataFile, FragmentMetadata

    from blobhouse.snapshot import TableSnapshot


@dataclass(frozen=True)
class VersionRef:
    """One version of one branch of the table (``branch`` None: main)."""

    branch: str | None
    version: int

    def __str__(self) -> str:
        return f"{self.branch or 'main'}@{self.version}"

    def sort_key(self) -> tuple[str, int]:
        return (self.branch or "", self.version)


@dataclass(frozen=True)
class Appearances:
    """The versions that hold one fragment state, with the position of its first live row in
    each: iterates as ``(VersionRef, first_row)``. Kept as runs ``(branch, first version, last
    version, first_row)`` of consecutive versions, so a fragment that every version of a long
    history holds takes one run, not an entry per version (memory flat as versions grow).

    >>> a = Appearances(((None, 3, 5, 0), ("exp", 1, 1, 4)))
    >>> [(str(v), row) for v, row in a], len(a)
    ([('main@3', 0), ('main@4', 0), ('main@5', 0), ('exp@1', 4)], 4)
    """

    runs: tuple[tuple[str | None, int, int, int], ...]

    def __iter__(self) -> Iterator[tuple[VersionRef, int]]:
        for branch, first, last, first_row in self.runs:
            for version in range(first, last + 1):
                yield VersionRef(branch, version), first_row

    def __len__(self) -> int:
        return sum(last - first + 1 for _, first, last, _ in self.runs)

    def within(self, versions: VersionSet) -> bool:
        """Whether every version holding the state is one of ``versions``.

        >>> a = Appearances(((None, 3, 5, 0),))
        >>> a.within(VersionSet.of([VersionRef(None, v) for v in (3, 4, 5, 9)]))
        True
        >>> a.within(VersionSet.of([VersionRef(None, v) for v in (3, 5)]))
        False
        """
        return all(
            versions.count(branch, first, last) == last - first + 1
            for branch, first, last, _ in self.runs
        )


@dataclass(frozen=True)
class VersionSet:
    """Versions, counted by range: a state's runs are checked against it without iterating
    every version of a long history (that was quadratic in a history of appends)."""

    by_branch: dict[str | None, np.ndarray]

    @classmethod
    def of(cls, refs: Iterable[VersionRef]) -> VersionSet:
        """The set of ``refs``."""
        versions: dict[str | None, list[int]] = {}
        for ref in refs:
            versions.setdefault(ref.branch, []).append(ref.version)
        return cls({b: np.unique(np.array(v, np.int64)) for b, v in versions.items()})

    def count(self, branch: str | None, first: int, last: int) -> int:
        """How many of the versions are ``first`` to ``last`` of ``branch``."""
        versions = self.by_branch.get(branch)
        if versions is None:
            return 0
        return int(np.searchsorted(versions, last, "right") - np.searchsorted(versions, first))


@dataclass(frozen=True)
class FragmentState:
    """One fragment as one or more versions see it.

    ``ref`` is the last version (in walk order) that holds it, where it is opened: the newest
    versions hold most states, so a long history of appends opens one; ``appearances`` are
    ``(version, first_row)`` for every version holding it (on any branch), ``first_row`` being
    the position of the fragment's first live row among that version's rows. ``data_files``
    are the URIs of its data files, ``data_file_sizes`` their sizes as the manifest records
    them (None where it records none); ``deletion_file`` the URI of its deletion file (None:
    it has none, or one under another base path, which Lance's cleanup never removes).
    """

    fragment_id: int
    ref: VersionRef
    appearances: Appearances
    data_files: tuple[str, ...]
    data_file_sizes: tuple[int | None, ...]
    deletion_file: str | None = None

    def amounts(self) -> Amounts:
        """The bytes of its data files (those the manifest records sizes of): what a service
        reading the fragment reads, for progress."""
        return Amounts(bytes=sum(size or 0 for size in self.data_file_sizes))


@dataclass(frozen=True)
class ReferenceBatch:
    """Blob references of one column for a batch of a fragment's live rows.

    ``rows`` are positions among the fragment's live rows, ``offsets`` physical row offsets in
    the fragment (the row inside its data file), ``file_column`` the column's position in the
    fragment's data file ``data_file``; ``refs`` are resolved
    ``struct<uri, position, size, blake3>`` values; null values are left out.
    """

    column: str
    file_column: int
    data_file: str | None
    rows: np.ndarray
    offsets: np.ndarray
    kinds: np.ndarray
    blob_ids: np.ndarray
    refs: pa.StructArray
    # references that cannot be resolved (they escape their base, or the allowed bases):
    # (row among the fragment's live rows, the uri as stored, why), left out of ``refs``
    unresolved: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class VersionGraph:
    """Every version Lance keeps, on main and on every branch (tagged versions among them), and
    the branches that cannot be read where the table is now (name -> why): a branch made before
    the table was moved reads its parent's files at the old place."""

    versions: tuple[VersionRef, ...]
    unreadable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, table: TableSnapshot) -> VersionGraph:
        """The graph of ``table``'s versions.

        >>> import tempfile, pyarrow as pa, lance
        >>> from blobhouse import blob_array, write_table
        >>> uri = tempfile.mkdtemp() + "/t"
        >>> t = write_table(pa.table({"b": blob_array([b"x"])}), uri)
        >>> _ = lance.dataset(uri).create_branch("exp", 1)
        >>> [str(v) for v in VersionGraph.of(t).versions]
        ['main@1', 'exp@1']
        """
        refs: list[VersionRef] = []
        unreadable: list[tuple[str, str]] = []
        for branch in [None, *sorted(table.branches())]:
            try:
                on = table.checkout(None, branch=branch or "main")
            except BlobhouseError as exc:
                if branch is None:
                    raise
                unreadable.append((branch, str(exc)))
                continue
            listed = on.location.listed_versions(on.storage_options)
            refs.extend(VersionRef(branch, v) for v in listed)
        return cls(tuple(refs), tuple(unreadable))

    def without(self, branch: str | None, versions: Iterable[int]) -> VersionGraph:
        """This graph less ``versions`` of ``branch`` (what a cleanup would remove)."""
        gone = {VersionRef(branch, v) for v in versions}
        if not gone:
            return self
        return VersionGraph(tuple(r for r in self.versions if r not in gone), self.unreadable)


def fragment_states(
    table: TableSnapshot, versions: list[VersionRef] | None = None
) -> list[FragmentState]:
    """The distinct fragment states of ``versions`` (default: every retained version of every
    branch that can be read).

    A run of versions that each append to the one before is read from the versions'
    transactions plus the run's last manifest, not from every manifest: each manifest lists
    every fragment so far, so reading them all was quadratic in a history of appends. The last
    manifest must list the first one's fragments followed by the appended ones, or the run's
    versions are read one by one.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"b": blob_array([b"x"])}), uri)
    >>> t = write_table(pa.table({"b": blob_array([b"y"])}), uri, mode="append")
    >>> [(s.fragment_id, [(str(v), row) for v, row in s.appearances])
    ...  for s in fragment_states(t)]
    [(0, [('main@1', 0), ('main@2', 0)]), (1, [('main@2', 1)])]
    """
    table = snapshot_of(table)
    found: dict[tuple, list] = {}
    places = _DataFilePlaces()
    refs = list(versions or VersionGraph.of(table).versions)
    i, one_by_one_until = 0, -1
    while i < len(refs):
        start = refs[i]
        opened = open_version(table, start)
        at = _Manifest.read(opened, places)
        appended = [] if i < one_by_one_until else _appends_after(opened, refs, i)
        last = refs[i + len(appended)]
        new: tuple[_Fragment, ...] = ()
        if appended:
            end = _Manifest.read(open_version(table, last), places)
            if end.extends(at, appended):
                new = end.fragments[len(at.fragments) :]
            else:
                one_by_one_until, appended, last = i + len(appended) + 1, [], start
        for fragment in at.fragments:
            _record(found, fragment, start, last.version)
        fragments = iter(new)
        for k, added in enumerate(appended, start=1):
            for _ in added:
                _record(found, next(fragments), refs[i + k], last.version)
        i += len(appended) + 1
    return [
        FragmentState(fid, ref, Appearances(tuple(map(tuple, runs))), files, sizes, deletion)
        for fid, ref, runs, files, sizes, deletion in found.values()
    ]


@dataclass(frozen=True)
class _Fragment:
    """One fragment as one manifest lists it: ``key`` tells its states apart; ``written`` is
    what an append's transaction says of it (data file paths and base ids, physical rows)."""

    key: tuple
    fragment_id: int
    data_files: tuple[str, ...]
    first_row: int
    written: tuple
    data_file_sizes: tuple[int | None, ...]
    deletion: str | None


@dataclass(frozen=True)
class _Manifest:
    """The fragments of one version, from its manifest, and what it calls its blob columns
    (part of a fragment's state: problems are reported under the names of the version they are
    found in)."""

    names: tuple[str, ...]
    fragments: tuple[_Fragment, ...]

    @classmethod
    def read(cls, at: TableSnapshot, places: _DataFilePlaces) -> _Manifest:
        names = tuple(path_name(p) for p in stored_blob_columns(at.schema))
        locate = places.of(at)
        fragments, first_row = [], 0
        for fragment in at.dataset.get_fragments():
            metadata = fragment.metadata
            files = tuple(locate(f) for f in metadata.files)
            deletion = metadata.deletion_file
            key = (
                metadata.id,
                files,
                None
                if deletion is None
                else (deletion.base_id, at.branch, deletion.id, deletion.read_version),
                names,
            )
            written = _written(metadata) if deletion is None else None
            sizes = tuple(f.file_size_bytes or None for f in metadata.files)
            deleted = None
            if deletion is not None and deletion.base_id is None:
                deleted = f"{at.location.dataset_uri}/{deletion.path(metadata.id)}"
            fragments.append(_Fragment(key, metadata.id, files, first_row, written, sizes, deleted))
            first_row += metadata.num_rows
        return cls(names, tuple(fragments))

    def extends(self, before: _Manifest, appended: list[list[tuple]]) -> bool:
        """Whether this manifest lists ``before``'s fragments as they were, then fragments
        written as ``appended`` says, in order."""
        kept = len(before.fragments)
        added = [written for run in appended for written in run]
        return (
            len(self.fragments) == kept + len(added)
            and [f.key for f in self.fragments[:kept]] == [f.key for f in before.fragments]
            and [f.written for f in self.fragments[kept:]] == added
            and self.names == before.names
        )


def _written(metadata: FragmentMetadata) -> tuple:
    """A fragment's data files (paths, base ids) and physical rows: what an append's
    transaction and the manifest after it both say of it."""
    return (tuple((file_path(f), f.base_id) for f in metadata.files), metadata.physical_rows)


def _appends_after(at: TableSnapshot, refs: list[VersionRef], i: int) -> list[list[tuple]]:
    """What each version after ``refs[i]`` (opened: ``at``) appends, for as long as they are
    the consecutive versions of its branch and their transactions are appends."""
    appended: list[list[tuple]] = []
    for before, ref in zip(refs[i:], refs[i + 1 :], strict=False):
        if ref.branch != before.branch or ref.version != before.version + 1:
            break
        written = _appended(at, ref.version)
        if written is None:
            break
        appended.append(written)
    return appended


def _appended(at: TableSnapshot, version: int) -> list[tuple] | None:
    """The fragments ``version``'s transaction appends, as written (None: not an append):
    from its manifest's last bytes and its transaction file when they can be read so (a
    constant cost a version), else from Lance (which decodes the version's whole manifest)."""
    try:
        return transactions.appended(at.location.dataset_uri, version, at.storage_options)
    except transactions.UnreadTransaction:
        pass
    try:
        transaction = at.dataset.read_transaction(version)
    except Exception:  # the manifest is read instead
        # not only a missing file: pylance 14 fails to convert some transactions to Python
        # (TypeError on a compaction that rewrote an index)
        return None
    operation = getattr(transaction, "operation", None)
    if not isinstance(operation, lance.LanceOperation.Append):
        return None
    return [_written(fragment) for fragment in operation.fragments]


def _record(found: dict[tuple, list], fragment: _Fragment, ref: VersionRef, last: int) -> None:
    """``fragment`` is in ``ref``'s version and every version of its branch up to ``last``."""
    entry = found.setdefault(
        fragment.key,
        [
            fragment.fragment_id,
            ref,
            [],
            fragment.data_files,
            fragment.data_file_sizes,
            fragment.deletion,
        ],
    )
    entry[1] = VersionRef(ref.branch, last)
    runs = entry[2]
    run = runs[-1] if runs else None
    if run and run[0] == ref.branch and run[2] == ref.version - 1 and run[3] == fragment.first_row:
        run[2] = last
    else:
        runs.append([ref.branch, ref.version, last, fragment.first_row])


class _DataFilePlaces:
    """Where the data files of many versions are, each placed once.

    A data file's place depends only on its path, its base id, the branch and the base paths
    the manifest records; these rarely change between versions, so one opened version of each
    (branch, base paths) places the files of all of them: resolving per version would build a
    resolver over every fragment of every version, quadratic in a history of appends."""

    def __init__(self) -> None:
        self._places: dict[tuple, str] = {}
        self._placers: dict[tuple, TableSnapshot] = {}  # the first version opened in each context

    def of(self, at: TableSnapshot) -> Callable[[DataFile], str]:
        """``data file -> URI`` for the files of ``at``'s version."""
        bases = at.dataset.base_paths()
        recorded = tuple(
            sorted((i, b.path, b.name, bool(b.is_dataset_root)) for i, b in bases.items())
        )
        context = (at.branch, recorded)
        placer = self._placers.setdefault(context, at)

        def locate(data_file: DataFile) -> str:
            key = (context, file_path(data_file), data_file.base_id)
            if key not in self._places:
                self._places[key] = placer.data_file_uri(data_file)
            return self._places[key]

        return locate


def open_version(table: TableSnapshot, ref: VersionRef) -> TableSnapshot:
    """``table`` at ``ref`` (itself when it is there already)."""
    return snapshot_of(table).on_version(ref.branch, ref.version)


def version_of(state: FragmentState) -> tuple[str | None, int]:
    """The (branch, version) a fragment state is read at (a runner's ``where``)."""
    return (state.ref.branch, state.ref.version)


def opened_states(
    table: TableSnapshot, states: list[FragmentState]
) -> Iterator[tuple[TableSnapshot, FragmentState]]:
    """Each state with the table opened at its version: every version is opened once, and
    again every :data:`~blobhouse.snapshot.FRAGMENTS_PER_DATASET` states (what Lance keeps of
    the files a dataset scanned is dropped with it: see
    :meth:`~blobhouse.snapshot.TableSnapshot.reopened`)."""
    opened: TableSnapshot | None = None
    scanned = 0
    for state in sorted(states, key=lambda s: (s.ref.sort_key(), s.fragment_id)):
        if opened is None or (opened.branch, opened.version) != (
            state.ref.branch,
            state.ref.version,
        ):
            opened, scanned = open_version(table, state.ref), 1
        else:
            opened, scanned = one_more_fragment(opened, scanned)
        yield opened, state


def fragment_references(table: TableSnapshot, fragment_id: int) -> Iterator[ReferenceBatch]:
    """Every non-null blob reference of one fragment's live rows, a batch at a time, for every
    blob column; ``table`` is opened at a version holding the fragment."""
    fragment = table.dataset.get_fragment(fragment_id)
    for path in stored_blob_columns(table.schema):
        try:
            file_column = table.file_column(path)(fragment_id)
            data_file = table.data_file_of(path)(fragment_id)
        except BlobhouseError:
            file_column, data_file = -1, None  # no data file holds the column: rows read null
        row = 0
        scanner = table.dataset.scanner(
            columns=[path[0]], with_row_address=True, fragments=[fragment]
        )
        for batch in scanner.to_batches():
            descriptors = get_column(batch, path)
            addresses = batch.column(ROW_ADDRESS)
            unresolved: list[Unresolved] = []
            refs = table.resolve_refs(path, descriptors, addresses, unresolved)
            valid = refs.is_valid().to_numpy(zero_copy_only=False)
            keep = pa.array(valid)
            yield ReferenceBatch(
                column=path_name(path),
                file_column=file_column,
                data_file=data_file,
                rows=np.arange(row, row + batch.num_rows)[valid],
                offsets=(addresses.to_numpy() & 0xFFFFFFFF)[valid],
                kinds=descriptors.field("kind").filter(keep).to_numpy(zero_copy_only=False),
                blob_ids=descriptors.field("blob_id").filter(keep).to_numpy(zero_copy_only=False),
                refs=refs.filter(keep),
                unresolved=tuple((row + u.row, u.uri, u.reason) for u in unresolved),
            )
            row += batch.num_rows
