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

import numpy as np
import pyarrow as pa

from blobhouse.errors import BlobhouseError
from blobhouse.references import file_path
from blobhouse.values import get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from lance.fragment import DataFile

    from blobhouse.table import Table

_ROW_ADDRESS = "_rowaddr"
# called as progress(step, done, total) by long-running services (the CLI draws a bar)
Progress = Callable[[str, int, int], None]


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


@dataclass(frozen=True)
class FragmentState:
    """One fragment as one or more versions see it.

    ``ref`` is the last version (in walk order) that holds it, where it is opened: the newest
    versions hold most states, so a long history of appends opens one; ``appearances`` are
    ``(version, first_row)`` for every version holding it (on any branch), ``first_row`` being
    the position of the fragment's first live row among that version's rows. ``data_files``
    are the URIs of its data files.
    """

    fragment_id: int
    ref: VersionRef
    appearances: Appearances
    data_files: tuple[str, ...]


@dataclass(frozen=True)
class ReferenceBatch:
    """Blob references of one column for a batch of a fragment's live rows.

    ``rows`` are positions among the fragment's live rows, ``offsets`` physical row offsets in
    the fragment (the row inside its data file), ``file_column`` the column's position in the
    fragment's data file; ``refs`` are resolved ``struct<uri, position, size>`` values; null
    values are left out.
    """

    column: str
    file_column: int
    rows: np.ndarray
    offsets: np.ndarray
    kinds: np.ndarray
    blob_ids: np.ndarray
    refs: pa.StructArray


@dataclass(frozen=True)
class VersionGraph:
    """Every version Lance keeps, on main and on every branch (tagged versions among them), and
    the branches that cannot be read where the table is now (name -> why): a branch made before
    the table was moved reads its parent's files at the old place."""

    versions: tuple[VersionRef, ...]
    unreadable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, table: Table) -> VersionGraph:
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
            refs.extend(VersionRef(branch, v["version"]) for v in on.versions())
        return cls(tuple(refs), tuple(unreadable))

    def without(self, branch: str | None, versions: Iterable[int]) -> VersionGraph:
        """This graph less ``versions`` of ``branch`` (what a cleanup would remove)."""
        gone = {VersionRef(branch, v) for v in versions}
        if not gone:
            return self
        return VersionGraph(tuple(r for r in self.versions if r not in gone), self.unreadable)


def fragment_states(table: Table, versions: list[VersionRef] | None = None) -> list[FragmentState]:
    """The distinct fragment states of ``versions`` (default: every retained version of every
    branch that can be read).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"b": blob_array([b"x"])}), uri)
    >>> t = write_table(pa.table({"b": blob_array([b"y"])}), uri, mode="append")
    >>> [(s.fragment_id, [(str(v), row) for v, row in s.appearances])
    ...  for s in fragment_states(t)]
    [(0, [('main@1', 0), ('main@2', 0)]), (1, [('main@2', 1)])]
    """
    found: dict[tuple, list] = {}
    places = _DataFilePlaces()
    for ref in versions or VersionGraph.of(table).versions:
        first_row = 0
        at = open_version(table, ref)
        # what a version calls its blob columns is part of the state: problems are reported
        # under the names of the version they are found in
        names = tuple(path_name(p) for p in stored_blob_columns(at.schema))
        locate = places.of(at)
        for fragment in at.dataset.get_fragments():
            metadata = fragment.metadata
            files = tuple(locate(f) for f in metadata.files)
            deletion = metadata.deletion_file
            key = (
                metadata.id,
                files,
                None
                if deletion is None
                else (deletion.base_id, ref.branch, deletion.id, deletion.read_version),
                names,
            )
            entry = found.setdefault(key, [metadata.id, ref, [], files])
            entry[1] = ref
            _appear(entry[2], ref, first_row)
            first_row += metadata.num_rows
    return [
        FragmentState(fid, ref, Appearances(tuple(map(tuple, runs))), files)
        for fid, ref, runs, files in found.values()
    ]


def _appear(runs: list[list], ref: VersionRef, first_row: int) -> None:
    """Add ``ref`` to the :class:`Appearances` runs being built: the last run grows when
    ``ref`` is the next version of its branch with the same first row."""
    last = runs[-1] if runs else None
    if last and last[0] == ref.branch and last[2] == ref.version - 1 and last[3] == first_row:
        last[2] = ref.version
    else:
        runs.append([ref.branch, ref.version, ref.version, first_row])


class _DataFilePlaces:
    """Where the data files of many versions are, each placed once.

    A data file's place depends only on its path, its base id, the branch and the base paths
    the manifest records; these rarely change between versions, so one opened version of each
    (branch, base paths) places the files of all of them: resolving per version would build a
    resolver over every fragment of every version, quadratic in a history of appends."""

    def __init__(self) -> None:
        self._places: dict[tuple, str] = {}
        self._placers: dict[tuple, Table] = {}  # the first version opened in each context

    def of(self, at: Table) -> Callable[[DataFile], str]:
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


def open_version(table: Table, ref: VersionRef) -> Table:
    """``table`` at ``ref`` (itself when it is there already)."""
    if table.branch == ref.branch and table.version == ref.version:
        return table
    return table.checkout(ref.version, branch=ref.branch or "main")


def opened_states(
    table: Table, states: list[FragmentState]
) -> Iterator[tuple[Table, FragmentState]]:
    """Each state with the table opened at its version; every version is opened once."""
    opened: Table | None = None
    for state in sorted(states, key=lambda s: (s.ref.sort_key(), s.fragment_id)):
        if opened is None or (opened.branch, opened.version) != (
            state.ref.branch,
            state.ref.version,
        ):
            opened = open_version(table, state.ref)
        yield opened, state


def fragment_references(table: Table, fragment_id: int) -> Iterator[ReferenceBatch]:
    """Every non-null blob reference of one fragment's live rows, a batch at a time, for every
    blob column; ``table`` is opened at a version holding the fragment."""
    fragment = table.dataset.get_fragment(fragment_id)
    for path in stored_blob_columns(table.schema):
        try:
            file_column = table.file_column(path)(fragment_id)
        except BlobhouseError:
            file_column = -1  # no data file holds the column: its rows read as null
        row = 0
        scanner = table.dataset.scanner(
            columns=[path[0]], with_row_address=True, fragments=[fragment]
        )
        for batch in scanner.to_batches():
            descriptors = get_column(batch, path)
            addresses = batch.column(_ROW_ADDRESS)
            refs = table.resolve_refs(path, descriptors, addresses)
            valid = descriptors.is_valid().to_numpy(zero_copy_only=False)
            keep = pa.array(valid)
            yield ReferenceBatch(
                column=path_name(path),
                file_column=file_column,
                rows=np.arange(row, row + batch.num_rows)[valid],
                offsets=(addresses.to_numpy() & 0xFFFFFFFF)[valid],
                kinds=descriptors.field("kind").filter(keep).to_numpy(zero_copy_only=False),
                blob_ids=descriptors.field("blob_id").filter(keep).to_numpy(zero_copy_only=False),
                refs=refs.filter(keep),
            )
            row += batch.num_rows
