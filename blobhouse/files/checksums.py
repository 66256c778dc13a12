"""Payload checksums: a blake3-256 per stored payload, kept inside the data file itself.

Every data file blobhouse writes carries, in a Lance *global buffer*, one entry per payload it
stored: payloads in sidecars (packed and dedicated) keyed by ``(blob_id, position, size)``,
inline payloads keyed by ``(column, row)`` (the dotted column name the file was written with,
and the row inside the data file). The schema metadata key ``blobhouse:checksums`` holds the
buffer's index. Stock Lance readers never look at either, so tables stay plain Lance datasets.

Lookups never go by the column's name in the table: names change (``alter_columns`` renames,
swaps, drop and add), the data file does not. A lookup names the column by its position in the
data file (the manifest ties each Lance field id to a column of each data file), and the buffer
maps positions to the names it recorded: the buffer's metadata ``file_columns`` holds that map
(files written before it existed are mapped through the file's own schema).

Rows that reference the table's store (``dedup="global"``) record the blake3 of the value they
were written with once per store payload the data file references: *store entries* keyed by
``(pack, position, size)``, ``row`` -2: the pack is numbered by ``blob_id``, its place in
the sorted list of packs the buffer's metadata ``store_packs`` holds, and ``column`` is empty
(lists written before 2026-12-01 name the pack's path in ``column`` instead; a blobhouse of
that time finds no entry for such rows in newer lists and checks them by the store's index).

No entry is written for external blobs (objects the user owns) nor for sidecar ranges a session
only loaded (``load_packed`` / ``load_dedicated``): blobhouse never saw those bytes. Files that
Lance itself writes (stock writers, compaction) carry no checksums; :func:`load_checksums`
returns None for them.

The buffer is an uncompressed Arrow IPC stream (files written before: lz4 or zstd) of
:data:`CHECKSUM_SCHEMA`; sidecar entries have ``column ""`` and ``row -1``, inline entries
``blob_id 0`` and ``position 0``, store entries ``column ""`` and ``row -2``. blobhouse's
own rewrites (compaction, backfill) go through the write pipeline and record fresh checksums.
"""

from __future__ import annotations

import contextlib
import functools
import json
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.file import LanceFileWriter

from blobhouse.cache import SharedCache
from blobhouse.dedup import DIGEST_BYTES, digest_matrix
from blobhouse.errors import BlobhouseError, BlobReadError, CorruptBlobError
from blobhouse.files.digests import Digests
from blobhouse.files.footer import DataFileFooter, foreign_file_error
from blobhouse.files.ranges import DigestCheck, RefColumns
from blobhouse.io.objects import each_uri, is_local
from blobhouse.layout import data_file_of
from blobhouse.placement import Kind

if TYPE_CHECKING:
    from blobhouse.files.references import ResolvedRows

CHECKSUMS_KEY = "blobhouse:checksums"
SIDECAR_ROW, STORE_ROW = -1, -2  # the ``row`` of sidecar and store entries
FILE_COLUMNS_KEY = b"file_columns"  # {recorded column name: its column in the data file}
STORE_PACKS_KEY = b"store_packs"  # [the store packs its store entries' blob_id numbers]
_NO_PACK = 0xFFFFFFFF  # the code of a store pack a file records nothing of
# files' checksums kept loaded for lookups, by their estimated memory: measured ~18 KB a file
# (2,000 files of 4 entries) and ~180 bytes an entry (one file of 400,000)
_CACHED_CHECKSUM_BYTES = 64 << 20
_FILE_BYTES, _ENTRY_BYTES = 16 << 10, 192
CHECKSUM_SCHEMA = pa.schema(
    [
        pa.field("column", pa.utf8(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("blob_id", pa.uint32(), nullable=False),
        pa.field("position", pa.uint64(), nullable=False),
        pa.field("size", pa.uint64(), nullable=False),
        pa.field("blake3", pa.binary(DIGEST_BYTES), nullable=False),
    ]
)


class ChecksumLog:
    """The checksums of the payloads stored for one data file, as they are written.

    A data file may hold a million small rows, so entries live in flat typed buffers (about
    52 bytes each), never as a Python object per entry.

    >>> log = ChecksumLog()
    >>> log.record_sidecar(blob_id=1, position=0, size=3, digest=bytes(32))
    >>> log.record_inline("img", row=7, size=4, digest=bytes(range(32)))
    >>> len(log), log.to_table().column("row").to_pylist()
    (2, [-1, 7])
    """

    def __init__(self) -> None:
        self._names: dict[str, int] = {"": 0}  # code 0: the column of sidecar entries
        self._blob_ids, self._positions = array("I"), array("Q")
        self._sidecar_sizes, self._sidecar_digests = array("Q"), bytearray()
        self._columns, self._rows = array("I"), array("q")
        self._inline_sizes, self._inline_digests = array("Q"), bytearray()
        self._packs, self._store_positions = array("I"), array("Q")
        self._store_sizes, self._store_digests = array("Q"), bytearray()

    def __len__(self) -> int:
        return len(self._sidecar_sizes) + len(self._inline_sizes) + len(self._store_sizes)

    def record_store(
        self, places: Sequence[tuple[str, int, int]], digests: Sequence[bytes]
    ) -> None:
        """Record the blake3 of the values rows were written with for store payloads at
        ``(pack, position, size)`` (packs named relative to the store)."""
        for digest in digests:
            _check_digest(digest)
        if len(digests) != len(places):
            raise ValueError("one blake3-256 digest per store payload")
        self._packs.extend(self._names.setdefault(p, len(self._names)) for p, _, _ in places)
        self._store_positions.extend(position for _, position, _ in places)
        self._store_sizes.extend(size for _, _, size in places)
        self._store_digests += b"".join(digests)

    def record_sidecar(self, blob_id: int, position: int, size: int, digest: bytes) -> None:
        """Record the payload at ``[position, +size)`` of sidecar ``blob_id``."""
        self.record_sidecars(blob_id, [position], [size], [digest])

    def record_sidecars(
        self, blob_id: int, positions: list[int], sizes: list[int], digests: Sequence[bytes]
    ) -> None:
        """:meth:`record_sidecar` for many payloads of sidecar ``blob_id`` at once."""
        for digest in digests:
            _check_digest(digest)
        if len(digests) != len(positions) or len(sizes) != len(positions):
            raise ValueError("one size and one blake3-256 digest per payload")
        self._blob_ids.extend([blob_id] * len(positions))
        self._positions.extend(positions)
        self._sidecar_sizes.extend(sizes)
        self._sidecar_digests += b"".join(digests)

    def record_inline(self, column: str, row: int, size: int, digest: bytes) -> None:
        """Record the inline payload of ``column`` (dotted name) at ``row`` of the data file."""
        _check_digest(digest)
        self._columns.append(self._names.setdefault(column, len(self._names)))
        self._rows.append(row)
        self._inline_sizes.append(size)
        self._inline_digests += digest

    def record_inline_many(
        self, column: str, rows: np.ndarray, sizes: np.ndarray, digests: list[bytes]
    ) -> None:
        """:meth:`record_inline` for many rows of ``column`` at once."""
        joined = b"".join(digests)
        if len(joined) != DIGEST_BYTES * len(rows) or len(sizes) != len(rows):
            raise ValueError("one size and one blake3-256 digest per row")
        self._columns.extend([self._names.setdefault(column, len(self._names))] * len(rows))
        self._rows.frombytes(np.asarray(rows, dtype=np.int64).tobytes())
        self._inline_sizes.frombytes(np.asarray(sizes, dtype=np.uint64).tobytes())
        self._inline_digests += joined

    def to_table(self) -> pa.Table:
        """Every entry (sidecar entries first) as a :data:`CHECKSUM_SCHEMA` table; the store
        packs its store entries number are in its metadata (:data:`STORE_PACKS_KEY`)."""
        names = pa.array(list(self._names), pa.utf8())
        sidecars, inline = len(self._sidecar_sizes), len(self._inline_sizes)
        stored = len(self._store_sizes)
        packs, codes = self._store_codes()
        positions = np.frombuffer(self._store_positions, np.uint64)
        sizes = np.frombuffer(self._store_sizes, np.uint64)
        order = _store_order(codes, positions, sizes)
        batches = [
            _batch(
                names.take(np.zeros(sidecars, np.uint32)),
                np.full(sidecars, -1, np.int64),
                _numbers(self._blob_ids, pa.uint32()),
                _numbers(self._positions, pa.uint64()),
                _numbers(self._sidecar_sizes, pa.uint64()),
                self._sidecar_digests,
            ),
            _batch(
                names.take(_numbers(self._columns, pa.uint32())),
                _numbers(self._rows, pa.int64()),
                np.zeros(inline, np.uint32),
                np.zeros(inline, np.uint64),
                _numbers(self._inline_sizes, pa.uint64()),
                self._inline_digests,
            ),
            _batch(
                names.take(np.zeros(stored, np.uint32)),  # "": the pack is numbered instead
                np.full(stored, STORE_ROW, np.int64),
                codes[order],
                positions[order],
                sizes[order],
                np.frombuffer(self._store_digests, np.uint8)
                .reshape(-1, DIGEST_BYTES)[order]
                .reshape(-1),
            ),
        ]
        table = pa.Table.from_batches([b for b in batches if b.num_rows], CHECKSUM_SCHEMA)
        return table.replace_schema_metadata({STORE_PACKS_KEY: json.dumps(packs).encode()})

    def _store_codes(self) -> tuple[list[str], np.ndarray]:
        """The packs store entries name, sorted, and each entry's pack as its place among
        them."""
        recorded = np.frombuffer(self._packs, np.uint32)
        used = np.unique(recorded)
        names = list(self._names)
        packs = sorted(names[code] for code in used.tolist())
        rank = {pack: i for i, pack in enumerate(packs)}
        code_of = np.zeros(len(names), np.uint32)
        code_of[used] = [rank[names[code]] for code in used.tolist()]
        return packs, code_of[recorded]

    def to_bytes(self, file_schema: pa.Schema | None = None) -> bytes:
        """The entries as an Arrow IPC stream (what the data file's global buffer holds);
        ``file_schema`` (the data file's) maps each recorded column name to its column."""
        sink = pa.BufferOutputStream()
        # not compressed: a fresh process's first read waits for the list, and lz4 took 2-4
        # ms to decompress 20,000 entries there, against 0.1-0.2 ms to read them in place
        # (the digests, most of the bytes, do not shrink: 1.28 against 0.84 MB)
        table = self.to_table()
        metadata = dict(table.schema.metadata)
        if file_schema is not None:
            columns = {name: i for i, name in enumerate(leaf_names(file_schema))}
            recorded = {n: columns[n] for n in self._names if n in columns}
            metadata[FILE_COLUMNS_KEY] = json.dumps(recorded).encode()
        table = table.replace_schema_metadata(metadata)
        with pa.ipc.new_stream(sink, table.schema) as stream:
            stream.write_table(table)
        # bytes, not the Arrow buffer: pylance copies any other buffer one byte at a time
        return sink.getvalue().to_pybytes()

    def attach(self, writer: LanceFileWriter, file_schema: pa.Schema | None = None) -> None:
        """Store the entries in ``writer``'s file (call before it is closed; ``file_schema``
        is the schema it writes). A file with no stored payloads gets an empty list too: the
        key tells files blobhouse wrote (which keep sharing) from files other writers wrote
        (Lance's compaction copies shared payloads per row), which blobhouse compaction takes
        over."""
        index = writer.add_global_buffer(self.to_bytes(file_schema))
        writer.add_schema_metadata(CHECKSUMS_KEY, str(index))


def _store_order(codes: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The order store entries are written in: by their place's mix as a reader computes it
    (:class:`_Places`, packs by their number), equal mixes in the order recorded. A reader
    finds them sorted and sorts nothing (1-2 ms of a fresh process's first read of 20,000
    entries)."""
    if not len(positions):
        return np.zeros(0, np.int64)
    return np.argsort(_mixed(*_place_fields(codes, positions, sizes)), kind="stable")


def _ranks(names: list[str]) -> np.ndarray:
    """Each name's place among ``names`` sorted (code points; distinct names)."""
    ranks = np.empty(len(names), np.int64)
    ranks[np.array(sorted(range(len(names)), key=names.__getitem__), np.int64)] = np.arange(
        len(names)
    )
    return ranks


def _name_codes(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    """The distinct names of a checksum list's ``column`` in sorted order, and each entry's
    code (its name's place among them): a code does not depend on the order of the entries,
    so a writer can sort store entries by the place mix a reader computes."""
    names = pc.dictionary_encode(column.combine_chunks())
    found: list[str] = names.dictionary.to_pylist()
    return sorted(found), _ranks(found)[names.indices.to_numpy(zero_copy_only=False)]


def _check_digest(digest: bytes) -> None:
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"a blake3-256 digest has {DIGEST_BYTES} bytes, got {len(digest)}")


def _numbers(values: array, dtype: pa.DataType) -> pa.Array:
    """An Arrow array over ``values``' memory (no copy)."""
    return pa.Array.from_buffers(dtype, len(values), [None, pa.py_buffer(values)])


def _batch(column, row, blob_id, position, size, digests: bytearray | np.ndarray) -> pa.RecordBatch:
    count = len(digests) // DIGEST_BYTES
    blake3 = pa.Array.from_buffers(pa.binary(DIGEST_BYTES), count, [None, pa.py_buffer(digests)])
    return pa.RecordBatch.from_arrays(
        [column, row, blob_id, position, size, blake3], schema=CHECKSUM_SCHEMA
    )


class FileChecksums:
    """The checksums recorded in one data file, looked up by what a blob descriptor holds.
    ``columns`` maps each recorded column name to its column in the data file.

    >>> log = ChecksumLog()
    >>> log.record_sidecar(blob_id=2, position=10, size=5, digest=b"s" * 32)
    >>> log.record_inline("meta.img", row=3, size=4, digest=b"i" * 32)
    >>> log.record_store([("packs/a", 0, 7)], [b"p" * 32])
    >>> checksums = FileChecksums(log.to_table(), {"meta.img": 1})
    >>> checksums.sidecar(2, 10, 5) == b"s" * 32, checksums.sidecar(2, 10, 6)
    (True, None)
    >>> checksums.inline(1, 3) == b"i" * 32, checksums.inline(0, 3)
    (True, None)
    >>> packs, at, sizes = np.array([0, 1, 0]), np.zeros(3), np.array([7, 7, 8])
    >>> found = checksums.stored_many(["packs/a", "packs/b"], packs, at, sizes)
    >>> found[0] == b"p" * 32, found[1:]
    (True, [None, None])
    """

    def __init__(self, table: pa.Table, columns: dict[str, int] | None = None) -> None:
        if not table.schema.equals(CHECKSUM_SCHEMA):
            raise BlobhouseError(f"not a checksum table: {table.schema}")
        self.table = table
        self._names = {column: name for name, column in (columns or {}).items()}
        self._packs = _recorded_packs(table.schema.metadata)
        table = table.combine_chunks()
        self._rows = table.column("row").to_numpy()
        self._positions = table.column("position").to_numpy()
        self._sizes = table.column("size").to_numpy()
        self._digests = digest_matrix(table.column("blake3"))
        self._blob_ids = table.column("blob_id")
        # the lookups below are built on first use: a read of a file's store rows needs no
        # other (a fresh process's first read pays for what it looks up)

    def __len__(self) -> int:
        return self.table.num_rows

    # entries sorted by their key (a lookup is one vectorized binary search): never a Python
    # object per entry (10,000 tuples set off a full garbage collection, ~0.1 s in a process
    # that imported torch)

    @functools.cached_property
    def _entry_names(self) -> tuple[list[str], np.ndarray]:
        """The names entries carry (an inline entry's column; in lists written before store
        entries were numbered, a store entry's pack), sorted, and each entry's as its place
        among them: a Python str per entry, or an Arrow pass hashing every name, would cost
        each lookup again."""
        return _name_codes(self.table.column("column"))

    @functools.cached_property
    def _sidecars(self) -> _Places:
        sidecar = np.flatnonzero(self._rows == SIDECAR_ROW)
        blob_ids = self._blob_ids.to_numpy()[sidecar]
        return _Places(sidecar, blob_ids, self._positions[sidecar], self._sizes[sidecar])

    @functools.cached_property
    def _store_packs(self) -> tuple[dict[str, int], np.ndarray]:
        """Each store pack's number, and the store entries' numbers (by their ``blob_id``;
        in lists written before, by their name)."""
        stored = self._rows == STORE_ROW
        if self._packs is not None:
            return {p: i for i, p in enumerate(self._packs)}, self._blob_ids.to_numpy()[stored]
        names, codes = self._entry_names
        return {name: code for code, name in enumerate(names)}, codes[stored]

    @functools.cached_property
    def _stored(self) -> _Places:
        stored = np.flatnonzero(self._rows == STORE_ROW)
        codes = self._store_packs[1].astype(np.uint32)
        return _Places(stored, codes, self._positions[stored], self._sizes[stored])

    @functools.cached_property
    def _inline(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        inline = np.flatnonzero(self._rows >= 0)
        if not len(inline):
            return {}
        names, codes = self._entry_names
        by_name = {}
        for code in np.unique(codes[inline]).tolist():
            of_column = inline[codes[inline] == code]
            by_name[names[code]] = _sorted(of_column, self._rows[of_column])
        return by_name

    def stored_many(
        self, packs: Sequence[str], codes: np.ndarray, positions: np.ndarray, sizes: np.ndarray
    ) -> list[bytes | None]:
        """The digests rows of this file were written with for the store payloads at
        ``[positions[i], +sizes[i])`` of pack ``packs[codes[i]]`` (relative to the store)."""
        return self.digests_of(self.stored_entries(packs, codes, positions, sizes))

    def stored_entries(
        self, packs: Sequence[str], codes: np.ndarray, positions: np.ndarray, sizes: np.ndarray
    ) -> np.ndarray:
        """:meth:`stored_many`'s entries (rows of :attr:`digests`), -1 where none is."""
        number = self._store_packs[0]
        ours = np.array([number.get(pack, _NO_PACK) for pack in packs], np.uint32)
        return self._stored.find(ours[codes], positions, sizes)

    def sidecar(self, blob_id: int, position: int, size: int) -> bytes | None:
        """The digest of the payload at ``[position, +size)`` of sidecar ``blob_id``."""
        if not (0 <= blob_id < 1 << 32 and 0 <= position < 1 << 64 and 0 <= size < 1 << 64):
            return None  # no such entry: numpy would wrap the number, or refuse it
        return self.sidecar_many(
            np.array([blob_id], np.uint32),
            np.array([position], np.uint64),
            np.array([size], np.uint64),
        )[0]

    def sidecar_many(
        self, blob_ids: np.ndarray, positions: np.ndarray, sizes: np.ndarray
    ) -> list[bytes | None]:
        """:meth:`sidecar` for many payloads at once (one vectorized search)."""
        return self.digests_of(self.sidecar_entries(blob_ids, positions, sizes))

    def sidecar_entries(
        self, blob_ids: np.ndarray, positions: np.ndarray, sizes: np.ndarray
    ) -> np.ndarray:
        """The entries (rows of :attr:`digests`) of sidecar payloads, -1 where none is."""
        return self._sidecars.find(blob_ids, positions, sizes)

    def inline_many(self, column: int, rows: np.ndarray) -> list[bytes | None]:
        """:meth:`inline` for many rows at once (one vectorized search)."""
        return self.digests_of(self.inline_entries(column, rows))

    def inline_entries(self, column: int, rows: np.ndarray) -> np.ndarray:
        """The entries (rows of :attr:`digests`) of ``rows`` of the data file's ``column``,
        -1 where none is."""
        name = self._names.get(column)
        if name not in self._inline:
            return np.full(len(rows), -1, np.int64)
        return self._lookup(*self._inline[name], rows)

    @property
    def digests(self) -> np.ndarray:
        """Every entry's blake3, one row of 32 bytes each."""
        return self._digests

    def digests_of(self, entries: np.ndarray) -> list[bytes | None]:
        """The digests of ``entries`` (None for -1)."""
        digests = self._digests
        return [digests[e].tobytes() if e >= 0 else None for e in entries.tolist()]

    def inline(self, column: int, row: int) -> bytes | None:
        """The digest of the inline payload at ``row`` of the data file's ``column``."""
        return self.inline_many(column, np.array([row], np.int64))[0]

    @staticmethod
    def _lookup(entries: np.ndarray, recorded: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """The entries of the ``wanted`` keys in ``recorded`` (sorted distinct keys of
        ``entries``: rows of a data file), -1 where a key is not there."""
        if not len(recorded) or not len(wanted):
            return np.full(len(wanted), -1, np.int64)
        if recorded[0] == 0 and recorded[-1] == len(recorded) - 1:  # keys 0..n-1: no search
            inside = (wanted >= 0) & (wanted < len(recorded))
            return np.where(inside, entries[np.where(inside, wanted, 0)], -1)
        at = np.minimum(np.searchsorted(recorded, wanted), len(recorded) - 1)
        return np.where(recorded[at] == wanted, entries[at], -1)


def _sorted(entries: np.ndarray, *keys: np.ndarray) -> tuple[np.ndarray, ...]:
    """``entries`` and their keys, ordered by the keys (first key first)."""
    order = np.lexsort(keys[::-1])
    return (entries[order], *(key[order] for key in keys))


#: places a list holds at most to be found by a dict, not a vectorized search
_FEW_PLACES = 64


class _Places:
    """Entries by payload place (an object -- a sidecar's blob id, a store pack's code --, a
    position and a size), found with one vectorized binary search over a 64-bit mix of the
    three, each hit then compared field by field (numpy searches a structured array of the
    three ~50x slower: 250 ms for 8,000 places among 200,000). Up to ``_FEW_PLACES`` places
    (a small file's) are a dict instead. A place recorded twice finds its first entry.

    >>> places = _Places(np.array([7, 8]), np.array([1, 1]), np.array([0, 10]), np.array([10, 5]))
    >>> places.find(np.array([1, 1, 2]), np.array([10, 0, 0]), np.array([5, 10, 10])).tolist()
    [8, 7, -1]
    >>> n = np.arange(100)
    >>> _Places(n, n % 3, n, n + 1).find(np.array([1, 0]), n[1:3], n[2:4]).tolist()
    [1, -1]
    """

    def __init__(
        self, entries: np.ndarray, objects: np.ndarray, positions: np.ndarray, sizes: np.ndarray
    ) -> None:
        self._few: dict[tuple[int, int, int], int] | None = None
        if len(entries) <= _FEW_PLACES:
            # a small file's list: a dict, its numpy set-up and search cost ~100 us a file
            # (a first read of rows spread over 64 small files paid it 64 times)
            self._few = {}
            keys = _place_keys(objects, positions, sizes)
            for key, entry in zip(keys, np.asarray(entries).tolist(), strict=True):
                self._few.setdefault(key, entry)  # one place recorded twice: the first entry
            return
        fields = _place_fields(objects, positions, sizes)
        mixed = _mixed(*fields)
        entries = np.asarray(entries, np.int64)
        if len(mixed) < 2 or (mixed[1:] >= mixed[:-1]).all():
            # written in this order (ChecksumLog sorts store entries, equal mixes in the
            # order recorded): nothing to sort (1-2 ms for 20,000 in a fresh process)
            self.mixed, self.entries, self.fields = mixed, entries, fields
            return
        # numpy's default sort, 6x a stable one (0.16 against 0.95 ms for 20,000 places: a
        # fresh process's first read waits for it); where two mixes are equal (one place
        # recorded twice) the stable order, so the entry written first is the one found
        order = np.argsort(mixed)
        if len(order) > 1 and (np.diff(mixed[order]) == 0).any():
            order = np.argsort(mixed, kind="stable")
        self.mixed, self.entries = mixed[order], entries[order]
        self.fields = tuple(field[order] for field in fields)

    def find(self, objects: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """The entry of each place, -1 where none is."""
        if self._few is not None:
            keys = _place_keys(objects, positions, sizes)
            return np.array([self._few.get(key, -1) for key in keys], np.int64)
        if not len(self.mixed) or not len(objects):
            return np.full(len(objects), -1, np.int64)
        wanted = _place_fields(objects, positions, sizes)
        mixed = _mixed(*wanted)
        # searched in order: each search starts near the last one (half the time, measured)
        order = np.argsort(mixed)
        at = np.empty(len(mixed), np.int64)
        at[order] = np.minimum(np.searchsorted(self.mixed, mixed[order]), len(self.mixed) - 1)
        same = np.logical_and.reduce(
            [ours[at] == it for ours, it in zip(self.fields, wanted, strict=True)]
        )
        found = np.where(same, self.entries[at], -1)
        # two places of one mix (about one in 2^64): the wanted one may follow the first
        for i in np.flatnonzero(~same & (self.mixed[at] == mixed)).tolist():
            j = int(at[i])
            while j < len(self.mixed) and self.mixed[j] == mixed[i]:
                if all(ours[j] == it[i] for ours, it in zip(self.fields, wanted, strict=True)):
                    found[i] = self.entries[j]
                    break
                j += 1
        return found


def _place_keys(*fields: np.ndarray) -> Iterator[tuple[int, ...]]:
    """Each place's numbers as a tuple of Python ints (the keys of a small list's dict)."""
    return zip(*(np.asarray(field).tolist() for field in fields), strict=True)


def _place_fields(*fields: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(field).astype(np.uint64, copy=False) for field in fields)


def _mixed(objects: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """A 64-bit mix of each place's three numbers (splitmix64's multipliers; wrapping)."""
    mixed = objects * np.uint64(0x9E3779B97F4A7C15)
    for value in (positions, sizes):
        mixed = (mixed ^ value) * np.uint64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> np.uint64(31)
    return mixed


def load_checksums(
    data_file_uri: str, storage_options: dict[str, str] | None = None
) -> FileChecksums | None:
    """The checksums recorded in a data file, or None when it has none (a file written by stock
    Lance or by Lance's compaction). A file that records another name than its own is another
    file in its place: :class:`~blobhouse.errors.DataFileError` naming it (its hashes agree
    with its bytes, not with the rows the manifest expects there).

    >>> import tempfile, pyarrow as pa
    >>> from lance.file import LanceFileWriter
    >>> path = tempfile.mkdtemp() + "/f.lance"
    >>> schema = pa.schema([("a", pa.int64())])
    >>> writer = LanceFileWriter(path, schema, version="2.2")
    >>> writer.write_batch(pa.record_batch({"a": [1]}))
    >>> log = ChecksumLog()
    >>> log.record_inline("a", row=0, size=1, digest=b"d" * 32)
    >>> log.attach(writer, schema); writer.close()
    1
    >>> load_checksums("file://" + path).inline(0, 0) == b"d" * 32
    True
    """
    footer = DataFileFooter.read(data_file_uri, storage_options)
    if (foreign := foreign_file_error(footer)) is not None:
        raise foreign
    index = _checksums_index(footer)
    if index is None:
        return None
    buffer = footer.read_buffer(index)
    try:
        return _parsed_checksums(buffer, footer)
    except (
        BlobhouseError,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        NotImplementedError,
        MemoryError,
    ) as exc:
        # pyarrow, JSON, or FileChecksums' own check: a damaged buffer, never a crash later (a
        # damaged length can make pyarrow ask for petabytes: ArrowMemoryError, seen once)
        raise BlobReadError(
            f"data file {data_file_uri}: its recorded blob hashes are damaged ({exc})",
            data_file_uri,
        ) from None


def _parsed_checksums(buffer: bytes, footer: DataFileFooter) -> FileChecksums:
    table = pa.ipc.open_stream(pa.py_buffer(buffer)).read_all()
    # a flipped bit can leave a stream that reads but whose offsets point outside its buffers
    # (lookups in it crashed the process): check every array before any is used
    table.validate(full=True)
    recorded = (table.schema.metadata or {}).get(FILE_COLUMNS_KEY)
    if recorded is not None:
        columns = json.loads(recorded)
        if not isinstance(columns, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in columns.items()
        ):
            raise ValueError(f"its column map is {recorded[:80]!r}")
    else:  # written before the map existed: the file's own schema names its columns
        columns = {name: i for i, name in enumerate(footer.leaf_names())}
    return FileChecksums(table, columns)


def _recorded_packs(metadata: dict[bytes, bytes] | None) -> list[str] | None:
    """The store packs a list's store entries number (None: a list written before they were
    numbered, its entries name their packs)."""
    recorded = (metadata or {}).get(STORE_PACKS_KEY)
    if recorded is None:
        return None
    packs = json.loads(recorded)
    if not isinstance(packs, list) or not all(isinstance(p, str) for p in packs):
        raise ValueError(f"its store packs are {recorded[:80]!r}")
    return packs


def leaf_names(schema: pa.Schema) -> list[str]:
    """Dotted names of the columns a data file stores, in file order: struct children in
    place of their struct, a blob column as one column (what
    :meth:`~blobhouse.files.footer.DataFileFooter.leaf_names` reads back from the file).

    >>> leaf_names(pa.schema([("id", pa.int64()), ("m", pa.struct([("a", pa.int8())]))]))
    ['id', 'm.a']
    """
    names: list[str] = []
    for field in schema:
        _leaves(field, field.name, names)
    return names


def _leaves(field: pa.Field, name: str, out: list[str]) -> None:
    if _is_blob(field) or not pa.types.is_struct(field.type) or not field.type.num_fields:
        out.append(name)
        return
    for child in field.type:
        _leaves(child, f"{name}.{child.name}", out)


def _is_blob(field: pa.Field) -> bool:
    metadata = field.metadata or {}
    return (
        metadata.get(b"lance-encoding:blob") == b"true"
        or metadata.get(b"ARROW:extension:name") == b"lance.blob.v2"
    )


def written_by_blobhouse(data_file_uri: str, storage_options: dict[str, str] | None = None) -> bool:
    """Whether blobhouse wrote this data file (it carries a checksum list, maybe empty); reads
    the file's metadata only.

    >>> import tempfile, pyarrow as pa
    >>> from lance.file import LanceFileWriter
    >>> path = tempfile.mkdtemp() + "/f.lance"
    >>> writer = LanceFileWriter(path, pa.schema([("a", pa.int64())]), version="2.2")
    >>> writer.write_batch(pa.record_batch({"a": [1]})); writer.close()
    1
    >>> written_by_blobhouse("file://" + path)
    False
    """
    return _checksums_index(DataFileFooter.read(data_file_uri, storage_options)) is not None


def _checksums_index(footer: DataFileFooter) -> int | None:
    index = footer.metadata.get(CHECKSUMS_KEY.encode())
    if index is None:
        return None
    if not index.isdigit():
        raise BlobReadError(
            f"data file {footer.uri}: its {CHECKSUMS_KEY} entry is {index[:40]!r}, not a number",
            footer.uri,
        )
    return int(index)


class RecordedHashes:
    """The recorded blake3 of resolved blob references, each data file's list loaded once.

    A reference's digest lives with the data file that stored it: inline payloads under
    ``(column of the file, row in the file)``, sidecar payloads (``data/<file>/<blob_id>.blob``)
    under ``(blob_id, position, size)``. A row referencing the table's store (``dedup="global"``)
    has the digest of the value it was written with in its own data file (a store entry,
    keyed by the payload's place); rows written before that was recorded (or rewritten by
    Lance) are looked up in ``store``: ``(uri prefix of the store, a function loading an object with
    digest_at(pack, position, size))``. Other external blobs have none.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> from blobhouse.dedup import content_hash
    >>> t = write_table(pa.table({"b": blob_array([b"x" * 100_000])}), tempfile.mkdtemp() + "/t",
    ...                 dedup="content")  # a pack of the data file's own
    >>> rows = t.snapshot.rows_at(("b",), [0])
    >>> [digest] = RecordedHashes().expected_many(t.file_column(("b",)), rows)
    >>> digest == content_hash(b"x" * 100_000)
    True
    """

    def __init__(
        self,
        storage_options: dict[str, str] | None = None,
        store: tuple | None = None,
        *,
        shared: bool = True,
    ) -> None:
        self.storage_options = storage_options
        self.store = store
        self._store_index = None  # loaded on the first store reference: most checks need none
        # shared: the lists every reader of the process loaded (a new version, or another
        # table object over the same files, reads none again); else this object's own, read
        # from the files themselves (what a check of the files needs)
        self._files: SharedCache[str, FileChecksums | None] = (
            _LOADED if shared else SharedCache(_CACHED_CHECKSUM_BYTES, _checksums_bytes)
        )

    def verifier(
        self,
        column: str,
        file_column: Callable[[int], int],
        rows: ResolvedRows,
        data_file: Callable[[int], str] | None = None,
    ) -> DigestCheck | None:
        """A :class:`~blobhouse.files.ranges.DigestCheck` for reading ``rows.refs``: it raises
        :class:`CorruptBlobError` if a payload differs from the blake3 recorded when it was
        written. ``column`` names the blob column in errors; ``file_column(fragment id)`` is
        its column in that fragment's data file, ``data_file(fragment id)`` that file (where
        store references' digests are). Rows without a recorded hash (user-owned external
        blobs, files other writers made) pass as they are; None when no row has one."""
        recorded = self.expected(file_column, rows, data_file)
        if not recorded.found.any():
            return None
        refs, addresses = rows.refs, rows.addresses
        codes, positions, sizes = refs.codes.tolist(), refs.positions.tolist(), refs.sizes.tolist()

        def mismatch(row: int) -> CorruptBlobError:
            address = int(addresses[row])
            ref = refs.ref(row)
            return CorruptBlobError(
                f"blob column {column!r}, fragment {address >> 32} row {address & 0xFFFFFFFF}: "
                f"the bytes at {ref.uri} [{ref.position}, +{ref.size}) do not match the blake3 "
                "recorded when they were written (in the row's data file): the stored copy, or "
                "that recorded hash, is damaged (`blobhouse verify --deep` lists every such row)"
            )

        return DigestCheck(
            recorded.to_list(),  # looked up once a row: the check runs per payload
            lambda row: (codes[row], positions[row], sizes[row]),
            mismatch,
        )

    def expected_many(
        self,
        file_column: Callable[[int], int],
        rows: ResolvedRows,
        data_file: Callable[[int], str] | None = None,
    ) -> list[bytes | None]:
        """The recorded digest of every reference (None: none recorded, or a null row), looked
        up for each data file's rows at once."""
        return self.expected(file_column, rows, data_file).to_list()

    def expected(
        self,
        file_column: Callable[[int], int],
        rows: ResolvedRows,
        data_file: Callable[[int], str] | None = None,
    ) -> Digests:
        """:meth:`expected_many` as :class:`Digests` (no Python object per row). Rows that
        carry their recorded hashes (:attr:`ResolvedRows.recorded`) are not looked up again."""
        if rows.recorded is None:
            return self._looked_up(file_column, rows, data_file)
        if rows.looked is None:
            return rows.recorded
        missing = np.flatnonzero(~rows.looked)
        expected = Digests(rows.recorded.matrix.copy(), rows.recorded.found.copy())
        looked_up = self._looked_up(file_column, rows.take(missing).without_recorded(), data_file)
        expected.put_rows(missing, looked_up)
        return expected

    def _looked_up(
        self,
        file_column: Callable[[int], int],
        rows: ResolvedRows,
        data_file: Callable[[int], str] | None,
    ) -> Digests:
        """The recorded hashes of ``rows``, from their data files' lists."""
        refs, kinds, blob_ids, addresses = rows.refs, rows.kinds, rows.blob_ids, rows.addresses
        expected = Digests.none(len(refs))
        if not refs.uris:
            return expected
        codes, valid = refs.codes, refs.valid
        in_store = np.array([self._in_store(uri) for uri in refs.uris])[codes]
        external = valid & (kinds == Kind.EXTERNAL)
        fragments = addresses >> np.uint64(32)
        # inline rows: by their data file, one fragment's; sidecar rows: by the data file
        # their sidecar belongs to; other external rows are the user's: none recorded
        inline = valid & (kinds == Kind.INLINE)
        sidecar = valid & ~inline & (kinds != Kind.EXTERNAL)
        stored = external & in_store
        self._load_at_once(
            [refs.uris[c] for c in np.unique(codes[inline]).tolist()]
            + [_sidecar_data_file(refs.uris[c]) for c in np.unique(codes[sidecar]).tolist()]
            + (
                [data_file(f) for f in np.unique(fragments[stored]).tolist()]
                if data_file is not None
                else []
            )
        )
        for code in np.unique(codes[inline]).tolist():
            rows = np.flatnonzero(inline & (codes == code))
            recorded = self._file(refs.uris[code])
            if recorded is not None:
                at = file_column(int(fragments[rows[0]]))
                rows_in_file = (addresses[rows] & 0xFFFFFFFF).astype(np.int64)
                expected.put(rows, recorded.digests, recorded.inline_entries(at, rows_in_file))
        for code in np.unique(codes[sidecar]).tolist():
            rows = np.flatnonzero(sidecar & (codes == code))
            recorded = self._file(_sidecar_data_file(refs.uris[code]))
            if recorded is not None:  # a dedicated payload's entry has position 0
                positions = refs.positions[rows].astype(np.uint64)  # 0 for dedicated already
                sizes = refs.sizes[rows].astype(np.uint64)
                entries = recorded.sidecar_entries(blob_ids[rows], positions, sizes)
                expected.put(rows, recorded.digests, entries)
        for fragment in np.unique(fragments[stored]).tolist():
            rows = np.flatnonzero(stored & (fragments == fragment))
            file = data_file(fragment) if data_file is not None else None
            self._put_stored(expected, file, refs, rows)
        return expected

    def _put_stored(
        self, expected: Digests, data_file: str | None, refs: RefColumns, rows: np.ndarray
    ) -> None:
        """The digests of the store payloads of ``rows`` of one data file into ``expected``:
        what the file recorded for them (the value its rows were written with), else the
        store's index."""
        recorded = self._file(data_file) if data_file is not None else None
        if recorded is not None:
            packs = [uri.removeprefix(self.store[0]) for uri in refs.uris]
            entries = recorded.stored_entries(
                packs, refs.codes[rows], refs.positions[rows], refs.sizes[rows]
            )
            expected.put(rows, recorded.digests, entries)
        unknown = rows[~expected.found[rows]]
        expected.put_each(
            unknown,
            [
                self._indexed(refs.uris[refs.codes[r]], int(refs.positions[r]), int(refs.sizes[r]))
                for r in unknown.tolist()
            ],
        )

    def _in_store(self, uri: str) -> bool:
        return bool(self.store) and uri.startswith(self.store[0])

    def _indexed(self, uri: str, position: int, size: int) -> bytes | None:
        """What the store's index says the payload at ``uri`` holds (rows without a record of
        their own)."""
        if self._store_index is None:
            self._store_index = self.store[1]()
        return self._store_index.digest_at(uri.removeprefix(self.store[0]), position, size)

    def _file(self, data_file: str) -> FileChecksums | None:
        return self._files.get(data_file, lambda: load_checksums(data_file, self.storage_options))

    def _load_at_once(self, data_files: list[str]) -> None:
        """Load the lists of ``data_files`` not held yet in parallel, on an object store (a
        few requests each, mostly waiting: one after another, the first checked read of rows
        spread over 64 files waited for ~200 requests in turn). Locally they load as they are
        looked up: threads would cost more than they do. A load that fails is left to the
        lookup, which raises its error."""
        missing = [f for f in dict.fromkeys(data_files) if not self._files.holds(f)]
        if len(missing) < 2 or all(is_local(f) for f in missing):
            return

        def load(data_file: str) -> None:
            with contextlib.suppress(Exception):
                self._file(data_file)

        each_uri(missing, load)


def _checksums_bytes(checksums: FileChecksums | None) -> int:
    return _FILE_BYTES + _ENTRY_BYTES * (len(checksums) if checksums is not None else 0)


# every data file's checksums this process loaded, by the file's URI: Lance names each data
# file once (a new write, compaction or update makes a new name) and never changes one, so a
# list read for one version holds for every version and table object over that file. A file
# replaced under its name while the process runs has its payloads checked against what it held
# (they fail: CorruptBlobError), and verify reads every list again (``shared=False``).
_LOADED: SharedCache[str, FileChecksums | None] = SharedCache(
    _CACHED_CHECKSUM_BYTES, _checksums_bytes
)


def _sidecar_data_file(uri: str) -> str:
    """The data file a sidecar (``data/<file>/<blob_id>.blob``) belongs to."""
    return data_file_of(uri)
