"""Walking a table's retained versions: each distinct fragment state is visited once.

Most fragments are identical across versions (same data files, same deletions), so verify and
gc work on :class:`FragmentState` s, not on (version, fragment) pairs: a state is read once and
what it finds is reported for every version that holds it. A state is small and pickles, so a
Spark task can take one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from blobhouse.values import get_column, path_name, stored_blob_columns

if TYPE_CHECKING:
    from blobhouse.table import Table

_ROW_ADDRESS = "_rowaddr"
# called as progress(step, done, total) by long-running services (the CLI draws a bar)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FragmentState:
    """One fragment as one or more versions see it.

    ``version`` is a version that holds it (where to open it); ``appearances`` is
    ``(version, first_row)`` for every version holding it, ``first_row`` being the position of
    the fragment's first live row among that version's rows.
    """

    fragment_id: int
    version: int
    appearances: tuple[tuple[int, int], ...]
    data_files: tuple[str, ...]


@dataclass(frozen=True)
class ReferenceBatch:
    """Blob references of one column for a batch of a fragment's live rows.

    ``rows`` are positions among the fragment's live rows, ``offsets`` physical row offsets in
    the fragment (the row inside its data file); ``refs`` are resolved ``struct<uri, position,
    size>`` values; null values are left out.
    """

    column: str
    rows: np.ndarray
    offsets: np.ndarray
    kinds: np.ndarray
    blob_ids: np.ndarray
    refs: pa.StructArray


def retained_versions(table: Table) -> list[int]:
    """Every version of the table that Lance still keeps."""
    return [v["version"] for v in table.versions()]


def fragment_states(table: Table, versions: list[int] | None = None) -> list[FragmentState]:
    """The distinct fragment states of ``versions`` (default: every retained version).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"b": blob_array([b"x"])}), uri)
    >>> t = write_table(pa.table({"b": blob_array([b"y"])}), uri, mode="append")
    >>> [(s.fragment_id, s.appearances) for s in fragment_states(t)]
    [(0, ((1, 0), (2, 0))), (1, ((2, 1),))]
    """
    found: dict[tuple, list] = {}
    for version in versions or retained_versions(table):
        first_row = 0
        for fragment in table.checkout(version).dataset.get_fragments():
            metadata = fragment.metadata
            files = tuple(f.path for f in metadata.files)
            deletion = metadata.deletion_file
            key = (
                metadata.id,
                files,
                None if deletion is None else (deletion.id, deletion.read_version),
            )
            entry = found.setdefault(key, [metadata.id, version, [], files])
            entry[2].append((version, first_row))
            first_row += metadata.num_rows
    return [
        FragmentState(fid, version, tuple(appearances), files)
        for fid, version, appearances, files in found.values()
    ]


def opened_states(
    table: Table, states: list[FragmentState]
) -> Iterator[tuple[Table, FragmentState]]:
    """Each state with the table opened at its version; every version is opened once."""
    opened: Table | None = None
    for state in sorted(states, key=lambda s: (s.version, s.fragment_id)):
        if opened is None or opened.version != state.version:
            opened = table if table.version == state.version else table.checkout(state.version)
        yield opened, state


def fragment_references(table: Table, fragment_id: int) -> Iterator[ReferenceBatch]:
    """Every non-null blob reference of one fragment's live rows, a batch at a time, for every
    blob column; ``table`` is opened at a version holding the fragment."""
    fragment = table.dataset.get_fragment(fragment_id)
    for path in stored_blob_columns(table.schema):
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
                rows=np.arange(row, row + batch.num_rows)[valid],
                offsets=(addresses.to_numpy() & 0xFFFFFFFF)[valid],
                kinds=descriptors.field("kind").filter(keep).to_numpy(zero_copy_only=False),
                blob_ids=descriptors.field("blob_id").filter(keep).to_numpy(zero_copy_only=False),
                refs=refs.filter(keep),
            )
            row += batch.num_rows
