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
from blobhouse.values import get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
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
class FragmentState:
    """One fragment as one or more versions see it.

    ``ref`` is a version that holds it (where to open it); ``appearances`` is
    ``(version, first_row)`` for every version holding it (on any branch), ``first_row`` being
    the position of the fragment's first live row among that version's rows. ``data_files``
    are the URIs of its data files.
    """

    fragment_id: int
    ref: VersionRef
    appearances: tuple[tuple[VersionRef, int], ...]
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
    for ref in versions or VersionGraph.of(table).versions:
        first_row = 0
        at = open_version(table, ref)
        # what a version calls its blob columns is part of the state: problems are reported
        # under the names of the version they are found in
        names = tuple(path_name(p) for p in stored_blob_columns(at.schema))
        for fragment in at.dataset.get_fragments():
            metadata = fragment.metadata
            files = tuple(at.data_file_uri(f) for f in metadata.files)
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
            entry[2].append((ref, first_row))
            first_row += metadata.num_rows
    return [
        FragmentState(fid, ref, tuple(appearances), files)
        for fid, ref, appearances, files in found.values()
    ]


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
