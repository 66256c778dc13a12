"""Resolved references by row position, kept in memory for the fragments read again and again.

A read by position (``read_blobs``) needs each row's descriptor and address first. Lance's take
costs ~0.6 ms a call however few rows it returns (an integer column's ~0.26 ms), more than
reading a small blob, and resolving a handful of descriptors costs ~0.1 ms more; reading and
resolving a fragment's whole descriptor column costs about a microsecond a row. So the takes
that touch a fragment are timed, and once they have cost as much as reading the fragment
whole would, its rows are read and resolved once and kept (rent until buying pays: never more
than twice the cheaper of the two). Kept fragments stay within a byte budget, least recently
used out first. A version never changes, so what is kept stays right.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
from lance import LanceDataset
from lance.fragment import LanceFragment

from blobhouse.cache import WeightedLRU
from blobhouse.columns import lance_name
from blobhouse.errors import BlobhouseError
from blobhouse.placement import MiB
from blobhouse.references import ResolvedRows
from blobhouse.values import ROW_ADDRESS, ColumnPath, get_column

#: resolved rows kept per blob column of a table version (~40 bytes a row: 1.6 M rows)
KEPT_BYTES = 64 * MiB
#: what reading and resolving a fragment's descriptors costs, per row (pylance 14: ~1 us)
LOAD_SECONDS_PER_ROW = 1e-6
_ROW_BYTES = 40
_PIECE = 1 << 16  # rows read at a time when a fragment is kept

LanceRead = Callable[[Callable[[], pa.Table]], pa.Table]
"""Runs one of Lance's reads of the table (its errors raised as blobhouse's)."""
Resolve = Callable[[pa.Array, pa.Array], ResolvedRows]
"""Resolves descriptors read at row addresses."""


class KeptReferences:
    """Resolved rows of one blob column, by position among a version's live rows: from
    Lance's take, or from memory for the fragments that earned it.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"b": blob_array([b"a" * 100, b"b" * 100])}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> kept = KeptReferences(t.dataset, ("b",), lambda read: read(),
    ...                       lambda d, a: t.snapshot.resolve_rows(("b",), d, a))
    >>> rows = kept.take([1, 0])
    >>> rows.refs.sizes.tolist(), rows.addresses.tolist()
    ([100, 100], [1, 0])
    """

    def __init__(
        self,
        dataset: LanceDataset,
        path: ColumnPath,
        lance_read: LanceRead,
        resolve: Resolve,
        limit: int | None = None,
    ) -> None:
        self._dataset = dataset
        self._path = path
        self._columns = [lance_name(path), ROW_ADDRESS]
        self._read = lance_read
        self._resolve = resolve
        self._fragments: list[LanceFragment] = dataset.get_fragments()
        self._rows = np.array([_live_rows(f) for f in self._fragments], np.int64)
        self._starts = np.zeros(len(self._rows) + 1, np.int64)
        np.cumsum(self._rows, out=self._starts[1:])
        self._spent = np.zeros(len(self._rows))  # seconds of takes, each fragment's share
        self._limit = KEPT_BYTES if limit is None else limit
        self._kept: WeightedLRU[int, ResolvedRows] = WeightedLRU(self._limit, _weight)
        self._lock = threading.Lock()

    def take(self, positions: Sequence[int]) -> ResolvedRows:
        """The rows at ``positions`` (in range, any order, repeats allowed), in that order."""
        positions = np.asarray(positions, np.int64)
        fragments = np.searchsorted(self._starts, positions, side="right") - 1
        first = int(fragments[0])
        touched = [first] if (fragments == first).all() else np.unique(fragments).tolist()
        with self._lock:
            kept = {f: self._kept.find(f) for f in touched}
        if len(touched) == 1 and kept[first] is not None:  # the common case: one call, no copy
            return kept[first].take(positions - self._starts[first])
        parts, rows_of_parts = [], []
        taken = [f for f, held in kept.items() if held is None]
        if taken:
            rows = np.flatnonzero(np.isin(fragments, taken))
            parts.append(self._lance_take(positions[rows], fragments[rows]))
            rows_of_parts.append(rows)
        for fragment, held in kept.items():
            if held is not None:
                rows = np.flatnonzero(fragments == fragment)
                parts.append(held.take(positions[rows] - self._starts[fragment]))
                rows_of_parts.append(rows)
        if len(parts) == 1:  # its rows are all the request's, in order
            return parts[0]
        order = np.empty(len(positions), np.int64)
        order[np.concatenate(rows_of_parts)] = np.arange(len(positions))
        return ResolvedRows.concat(parts).take(order)

    def _lance_take(self, positions: np.ndarray, fragments: np.ndarray) -> ResolvedRows:
        """Lance's take of ``positions``; its time is charged to the fragments it read, and
        those whose charges reached their reading cost are read whole for the next calls."""
        started = time.perf_counter()
        rows = self._lance_rows(positions)
        spent = time.perf_counter() - started
        touched, counts = np.unique(fragments, return_counts=True)
        with self._lock:
            self._spent[touched] += spent * counts / len(positions)
            earned = self._spent[touched] >= self._rows[touched] * LOAD_SECONDS_PER_ROW
        for fragment in touched[earned].tolist():
            self._keep(fragment)
        return rows

    def _lance_rows(self, positions: np.ndarray) -> ResolvedRows:
        """The rows at ``positions``, taken by Lance and resolved."""
        taken = self._read(lambda: self._dataset.take(positions, self._columns))
        taken = taken.combine_chunks().to_batches()[0]
        return self._resolve(get_column(taken, self._path), taken.column(ROW_ADDRESS))

    def _keep(self, fragment: int) -> None:
        """Read and resolve ``fragment``'s rows whole and keep them, if they fit the budget
        and all resolve (a row that does not is left to the take, which names it)."""
        rows = int(self._rows[fragment])
        if not rows:
            return
        with self._lock:
            self._spent[fragment] = 0.0  # charged from nothing again if it is ever dropped
        if rows * _ROW_BYTES > self._limit // 2:
            return
        start = int(self._starts[fragment])
        try:  # in pieces, as the take it replaces reads (a nested column's parents included)
            held = ResolvedRows.concat(
                [
                    self._lance_rows(np.arange(at, min(at + _PIECE, start + rows)))
                    for at in range(start, start + rows, _PIECE)
                ]
            )
        except (BlobhouseError, OSError):  # the takes go on, and name what they meet
            return
        if ((held.addresses >> np.uint64(32)) != self._fragments[fragment].fragment_id).any():
            return  # positions counted otherwise than Lance counts them: never serve them
        with self._lock:
            self._kept.get(fragment, lambda: held)


def _live_rows(fragment: LanceFragment) -> int:
    """Rows of ``fragment`` a take by position counts: its physical rows less the deleted."""
    metadata = fragment.metadata
    deletion = metadata.deletion_file
    if deletion is None:
        return metadata.physical_rows
    deleted = getattr(deletion, "num_deleted_rows", None)
    if deleted is None:  # an old deletion file without a count: read it
        return fragment.count_rows()
    return metadata.physical_rows - deleted


def _weight(rows: ResolvedRows) -> int:
    refs = rows.refs
    arrays = (refs.codes, refs.positions, refs.sizes, refs.valid, rows.kinds, rows.blob_ids)
    return sum(a.nbytes for a in arrays) + rows.addresses.nbytes + sum(map(len, refs.uris))
