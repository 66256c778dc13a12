"""Resolved references by row position or id, kept in memory for the fragments read again and
again.

A read by position (``read_blobs``) or by row id (``take_rows``, what the loaders read) needs
each row's descriptor and address first. Lance's take costs ~0.6 ms a call however few rows it
returns (an integer column's ~0.26 ms), more than reading a small blob, and resolving a
handful of descriptors costs ~0.1 ms more; reading and resolving a fragment's whole descriptor
column costs about a microsecond a row. So the takes that touch a fragment are timed (after
its first, which runs cold), and once they have cost as much as reading the fragment whole
would (a take's own cost, and a microsecond a row), its rows are read and resolved once and
kept (rent until buying pays: never more than twice the cheaper of the two). The fragments one
take earned are read whole together, in one scan: a table of many small fragments pays a
read's fixed cost once, not once a fragment. Kept fragments stay within a byte budget, least
recently used out first.

A checked read needs each row's recorded hash too, from its data file's hash list, and a list
too large to stay loaded beside the others (a million small rows: ~100 MB) is read again by
every such read. So a checked take's lookups are charged to its fragments with the take, and
kept rows carry their hashes, looked up once when a checked read first meets them.

What is kept is the process's, not one version's: a fragment's rows are kept by what the
manifest says of it (its data files, its deletion file, its row count) and by what resolves its
descriptors (the table's place and base paths, the column's field id), so a new version after
an append, or another table object over the same version, reads the fragments that did not
change from memory at once. None of these ever changes under the same description: Lance
writes a new file, or a new deletion file, for every change.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from lance import LanceDataset
from lance.fragment import FragmentMetadata, LanceFragment

from blobhouse.cache import SharedCache
from blobhouse.columns import lance_name
from blobhouse.errors import BlobhouseError
from blobhouse.files.digests import Digests
from blobhouse.files.references import ResolvedRows
from blobhouse.placement import MiB
from blobhouse.values import ROW_ADDRESS, ColumnPath, get_column

#: resolved rows kept for the process, every table and version (~72 bytes a row with their
#: recorded hashes: 3.7 M rows; a fragment of Lance's default 1 Mi rows fits in half of it)
KEPT_BYTES = 256 * MiB
#: what reading and resolving a fragment's descriptors costs: a take's own cost (pylance 14:
#: ~0.6 ms a call however few rows), and per row (~1 us)
KEEP_TAKE_SECONDS = 0.6e-3
LOAD_SECONDS_PER_ROW = 1e-6
_ROW_BYTES = 72
_PIECE = 1 << 16  # rows read at a time when a fragment is kept

LanceRead = Callable[[Callable[[], pa.Table]], pa.Table]
"""Runs one of Lance's reads of the table (its errors raised as blobhouse's)."""
Resolve = Callable[[pa.Array, pa.Array], ResolvedRows]
"""Resolves descriptors read at row addresses."""
Fragment = Any  # pylance's LanceFragment, or the native fragment it wraps


class KeptReferences:
    """Resolved rows of one blob column, by position among a version's live rows or by row
    id: from Lance's take, or from memory for the fragments that earned it.

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
        *,
        scope: Hashable | None = None,
        own: Callable[[ResolvedRows], bool] | None = None,
        recorded: Callable[[ResolvedRows], Digests] | None = None,
    ) -> None:
        self._dataset = dataset
        self._path = path
        self._columns = [lance_name(path), ROW_ADDRESS]
        self._read = lance_read
        self._resolve = resolve
        self._fragments = _fragments_of(dataset)
        self._rows = np.array([_live_rows(f) for f in self._fragments], np.int64)
        self._starts = np.zeros(len(self._rows) + 1, np.int64)
        np.cumsum(self._rows, out=self._starts[1:])
        self._ids = ids = np.array([_fragment_id(f) for f in self._fragments], np.uint64)
        self._id_order = np.argsort(ids)
        self._sorted_ids = ids[self._id_order]
        self._spent = np.zeros(len(self._rows))  # seconds of takes, each fragment's share
        self._seen = np.zeros(len(self._rows), bool)  # taken before
        self._limit = KEPT_BYTES if limit is None else limit
        # ``scope``: what resolves this column's descriptors (see the module's docstring);
        # with one, kept rows are the process's; without, this object's own
        self._scope = scope
        self._kept: SharedCache[Hashable, ResolvedRows] = (
            _KEPT if scope is not None and limit is None else SharedCache(self._limit, _weight)
        )
        self._keys: dict[int, Hashable] = {}  # fragment index -> its key in ``_kept``
        # ``own(rows)``: whether rows were resolved from more than the manifest says (kept
        # under a key no other object makes: it resolves them again itself)
        self._own, self._token = own, next(_TOKENS)
        # ``recorded(rows)``: their recorded hashes (what a checked read asks with its rows)
        self._recorded = recorded
        self._lock = threading.Lock()  # guards ``_spent``

    def take(self, positions: Sequence[int], recorded: bool = False) -> ResolvedRows:
        """The rows at ``positions`` (in range, any order, repeats allowed), in that order;
        with ``recorded``, carrying their recorded hashes (:attr:`ResolvedRows.recorded`)."""
        positions = np.asarray(positions, np.int64)
        return self._serve(
            np.searchsorted(self._starts, positions, side="right") - 1,
            lambda fragment, _, rows: positions[rows] - self._starts[fragment],
            lambda rows: self._dataset.take(positions[rows].tolist(), self._columns),
            recorded,
        )

    def take_ids(self, ids: np.ndarray, recorded: bool = False) -> ResolvedRows:
        """The rows with row ids ``ids`` (any order, repeats allowed), in that order, of a
        version without stable row ids, where a row's id is its address (``recorded`` as
        :meth:`take`). IndexError names the ids that are not live rows of this version."""
        ids = np.asarray(ids, np.uint64)
        fragment_ids = ids >> np.uint64(32)
        # where each id's fragment sits among the version's (one search, not np.isin's sort:
        # a batch of a loader asks this every few milliseconds)
        at = np.minimum(np.searchsorted(self._sorted_ids, fragment_ids), len(self._sorted_ids) - 1)
        absent = (
            self._sorted_ids[at] != fragment_ids if len(self._sorted_ids) else fragment_ids >= 0
        )
        if absent.any():
            missing = np.unique(fragment_ids[absent])
            raise IndexError(f"this version has no fragment {missing[:5].tolist()}")
        return self._serve(
            self._id_order[at],
            lambda _, held, rows: _offsets_of(held.addresses, ids[rows]),
            lambda rows: take_rows_by_id(self._dataset, ids[rows], self._columns),
            recorded,
        )

    def _serve(
        self,
        fragments: np.ndarray,
        local: Callable[[int, ResolvedRows, np.ndarray], np.ndarray],
        lance_take: Callable[[np.ndarray], pa.Table],
        recorded: bool,
    ) -> ResolvedRows:
        """The request's rows, each from the fragment at index ``fragments[i]``: rows of kept
        fragments at ``local(fragment, kept rows, request rows)``, the others from
        ``lance_take(request rows)``, all back in the request's order (with ``recorded``,
        each carrying its recorded hash)."""
        recorded = recorded and self._recorded is not None
        first = int(fragments[0])
        touched = [first] if (fragments == first).all() else np.unique(fragments).tolist()
        kept = {f: self._kept.find(self._key(f)) for f in touched}
        if recorded:
            self._add_recorded(kept)
        everything = np.arange(len(fragments))
        if len(touched) == 1 and kept[first] is not None:  # the common case: no copy
            return kept[first].take(local(first, kept[first], everything))
        parts, rows_of_parts = [], []
        taken = [f for f, held in kept.items() if held is None]
        if taken:
            rows = (
                everything if len(taken) == len(kept) else np.flatnonzero(np.isin(fragments, taken))
            )
            parts.append(self._lance_take(lambda: lance_take(rows), fragments[rows], recorded))
            rows_of_parts.append(rows)
        for fragment, held in kept.items():
            if held is not None:
                rows = np.flatnonzero(fragments == fragment)
                parts.append(held.take(local(fragment, held, rows)))
                rows_of_parts.append(rows)
        if len(parts) == 1:  # its rows are all the request's, in order
            return parts[0]
        order = np.empty(len(fragments), np.int64)
        order[np.concatenate(rows_of_parts)] = everything
        return ResolvedRows.concat(parts).take(order)

    def _lance_take(
        self, take: Callable[[], pa.Table], fragments: np.ndarray, recorded: bool
    ) -> ResolvedRows:
        """Lance's ``take()``, resolved (with ``recorded``, its rows' recorded hashes looked
        up); its time is charged to the fragments it read, and those whose charges reached
        their reading cost are read whole for the next calls. A checked read pays for the
        lookup too: a data file's hash list too large to stay loaded is read again by every
        such take, and that is what keeping the fragment (with its hashes) saves."""
        started = time.perf_counter()
        rows = self._resolved(take)
        if recorded:
            rows = rows.with_recorded(self._recorded(rows))
        spent = time.perf_counter() - started
        touched, counts = np.unique(fragments, return_counts=True)
        with self._lock:
            # a fragment's first take is not charged: it runs cold (Lance opens the file; in
            # a fresh process, its runtime starts: 3-11 ms against 0.6-1 ms later), and it
            # bought the fragment whole on a process's first call, which took 1.3x as long
            charged = self._seen[touched]
            self._seen[touched] = True
            self._spent[touched] += charged * spent * counts / len(fragments)
            cost = KEEP_TAKE_SECONDS + self._rows[touched] * LOAD_SECONDS_PER_ROW
            earned = touched[self._spent[touched] >= cost]
            self._spent[earned] = 0.0  # charged from nothing again if it is ever dropped
        self._keep(earned[self._rows[earned] > 0].tolist())
        return rows

    def _add_recorded(self, kept: dict[int, ResolvedRows | None]) -> None:
        """Give the kept rows in ``kept`` (fragment index -> its kept rows, or None) that carry
        no recorded hashes theirs, looked up for all of them at once, and keep them so. Looked
        up when a checked read first meets them, not when they are kept: a list no checked
        read asked for is never loaded."""
        lacking = [f for f, held in kept.items() if held is not None and held.recorded is None]
        if not lacking:
            return
        joined = ResolvedRows.concat([kept[f] for f in lacking])
        digests = self._recorded(joined)
        ends = np.cumsum([len(kept[f]) for f in lacking]).tolist()
        for fragment, end in zip(lacking, ends, strict=True):
            rows = np.arange(end - len(kept[fragment]), end)
            kept[fragment] = kept[fragment].with_recorded(digests.take(rows))
            self._kept.put(self._key(fragment), kept[fragment])

    def _resolved(self, take: Callable[[], pa.Table]) -> ResolvedRows:
        """The rows Lance's ``take()`` returns, resolved."""
        taken = pa.RecordBatch.from_struct_array(
            self._read(take).combine_chunks().to_struct_array().combine_chunks()
        )
        return self._resolve(get_column(taken, self._path), taken.column(ROW_ADDRESS))

    def _keep(self, fragments: list[int]) -> None:
        """Read and resolve the rows of ``fragments`` whole and keep those that fit the
        budget: together, in scans of up to half the budget's rows (a fragment of more is
        never kept), so many small fragments cost one scan and large ones never all sit in
        memory at once."""
        most = self._limit // 2 // _ROW_BYTES
        group: list[int] = []
        rows = 0
        for fragment in fragments:
            count = int(self._rows[fragment])
            if count > most:
                continue
            if rows + count > most:
                self._keep_together(group)
                group, rows = [], 0
            group.append(fragment)
            rows += count
        self._keep_together(group)

    def _keep_together(self, fragments: list[int]) -> None:
        """Read and resolve the rows of ``fragments`` whole, in one scan, and keep them; if a
        row does not resolve, each fragment is tried alone (a fragment with such a row is left
        to the takes, which name it)."""
        if not fragments:
            return
        try:
            held = self._read_whole(fragments)
        except (BlobhouseError, OSError):
            if len(fragments) > 1:
                for fragment in fragments:
                    self._keep_together([fragment])
            return
        ends = np.cumsum(self._rows[fragments])
        if len(held) != ends[-1]:
            return  # positions counted otherwise than Lance counts them: never serve them
        for fragment, end in zip(fragments, ends.tolist(), strict=True):
            rows = held.take(np.arange(end - int(self._rows[fragment]), end))
            rows = dataclasses.replace(rows, refs=rows.refs.compact())  # its own files only
            if ((rows.addresses >> np.uint64(32)) != self._ids[fragment]).any():
                continue  # positions counted otherwise than Lance counts them: never serve them
            if self._own is not None and self._own(rows):
                self._keys[fragment] = (*self._key(fragment), self._token)
            self._kept.put(self._key(fragment), rows)

    def _read_whole(self, fragments: list[int]) -> ResolvedRows:
        """Every row of ``fragments``, resolved, in their order: one scan of the column and
        the row addresses (a scan reads a million descriptors in ~0.6 s, Lance's takes by
        position in ~1 s), resolved in pieces of ``_PIECE`` rows."""
        chosen = [self._dataset.get_fragment(int(self._ids[f])) for f in fragments]
        scanned = self._read(
            lambda: self._dataset.scanner(
                columns=[self._columns[0]],
                with_row_address=True,
                fragments=chosen,
                batch_size=_PIECE,
                scan_in_order=True,
            ).to_table()
        )
        # a nested column comes as one flat column, its parents' nulls applied
        return ResolvedRows.concat(
            [
                self._resolve(batch.column(0), batch.column(ROW_ADDRESS))
                for batch in scanned.to_batches(max_chunksize=_PIECE)
            ]
        )

    def _key(self, fragment: int) -> Hashable:
        """The fragment at index ``fragment`` as kept rows are found by: the scope, and the
        manifest's whole description of the fragment (its repr: id, data files with their
        fields and sizes, deletion file, physical rows)."""
        key = self._keys.get(fragment)
        if key is None:
            metadata = _metadata(self._fragments[fragment])
            key = self._keys[fragment] = (self._scope, repr(metadata))
        return key

    def held(self) -> list[int]:
        """Indices of this version's fragments whose rows are kept now.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"b": blob_array([b"a" * 100])}), tempfile.mkdtemp() + "/t")
        >>> kept = KeptReferences(t.dataset, ("b",), lambda read: read(),
        ...                       lambda d, a: t.snapshot.resolve_rows(("b",), d, a))
        >>> kept.held()
        []
        """
        return [f for f in range(len(self._fragments)) if self._kept.find(self._key(f)) is not None]


class DeletedRowsError(IndexError):
    """Row ids asked for by a take that are rows this version deleted."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(f"row ids {ids[:5]} are deleted rows")
        self.ids = ids


def take_rows_by_id(dataset: LanceDataset, ids: np.ndarray, columns: list[str]) -> pa.Table:
    """Lance's take of ``columns`` by row id, in the order asked (repeats allowed), refusing
    deleted rows (:class:`DeletedRowsError`): Lance leaves them out without a word, and
    panics when one comes with a repeated id, so each distinct id is taken once."""
    distinct, back = np.unique(ids, return_inverse=True)
    if len(distinct) == len(ids):
        distinct, back = ids, None
    taken = dataset._take_rows(distinct.tolist(), columns=columns)
    if taken.num_rows != len(distinct):
        found = dataset._take_rows(distinct.tolist(), columns=["_rowid"]).column("_rowid")
        missing = distinct[~np.isin(distinct, found.to_numpy())]
        raise DeletedRowsError(missing.tolist())
    return taken if back is None else taken.take(pa.array(back.reshape(-1)))


def _fragments_of(dataset: LanceDataset) -> list[Fragment]:
    """The version's fragments as Lance's own objects where pylance has them (its
    ``get_fragments()`` wraps each in a Python object: at 2,000 fragments ~3 ms, and 2,000
    objects the cyclic collector counts, which can set off a full collection: ~50 ms in any
    process that imports ``pyarrow.dataset``; a new version's first read of 64 rows over 2,000
    fragments went from 0.34x to 0.51x pylance's take), else pylance's wrappers."""
    native = getattr(getattr(dataset, "_ds", None), "get_fragments", None)
    return native() if native is not None else dataset.get_fragments()


def _fragment_id(fragment: Fragment) -> int:
    return fragment.fragment_id if isinstance(fragment, LanceFragment) else fragment.id()


def _metadata(fragment: Fragment) -> FragmentMetadata:
    metadata = fragment.metadata  # a property of pylance's wrapper, a method of Lance's own
    return metadata if isinstance(fragment, LanceFragment) else metadata()


def _live_rows(fragment: Fragment) -> int:
    """Rows of ``fragment`` a take by position counts: its physical rows less the deleted."""
    if fragment.deletion_file() is None:  # the common case, without the whole metadata (5x)
        return fragment.physical_rows
    metadata = _metadata(fragment)
    deletion = metadata.deletion_file
    if deletion is None:
        return metadata.physical_rows
    deleted = getattr(deletion, "num_deleted_rows", None)
    if deleted is None:  # an old deletion file without a count: read it
        return fragment.count_rows(None)
    return metadata.physical_rows - deleted


def _offsets_of(addresses: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each of ``wanted`` is in ``addresses`` (a kept fragment's, ascending);
    :class:`DeletedRowsError` for those that are not there (a deleted row, or past the
    fragment's end: the caller tells which)."""
    at = np.minimum(np.searchsorted(addresses, wanted), len(addresses) - 1)
    if (addresses[at] != wanted).any():
        raise DeletedRowsError(wanted[addresses[at] != wanted].tolist())
    return at


def _weight(rows: ResolvedRows) -> int:
    refs = rows.refs
    arrays = (refs.codes, refs.positions, refs.sizes, refs.valid, rows.kinds, rows.blob_ids)
    carried = rows.recorded.nbytes if rows.recorded is not None else 0
    carried += rows.looked.nbytes if rows.looked is not None else 0
    return (
        sum(a.nbytes for a in arrays) + rows.addresses.nbytes + sum(map(len, refs.uris)) + carried
    )


_TOKENS = itertools.count()
# kept rows of every scoped KeptReferences of the process (see the module's docstring)
_KEPT: SharedCache[Hashable, ResolvedRows] = SharedCache(KEPT_BYTES, _weight)
