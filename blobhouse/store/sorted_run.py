"""Sorted runs of the store index: each entry's digest prefix and row address in digest order,
with a directory of buckets, so a found hash costs one small read whatever the index's size.

Lance's BTREE answers a found hash with a page read and decode (~80 us cold at 10 M entries,
against ~10 us in a small index). blake3 digests are uniform, so their first bits place them:
bucket ``b`` of a run of ``2**bits`` buckets holds the entries whose digest starts with
``b``, about :data:`BUCKET_ENTRIES` of them. A lookup reads two directory slots and one bucket
per hash, then takes the candidates' rows from the index (their full digests decide: a run
can only make a write store a payload anew, never reference another's bytes).

A run covers data files of the index as they were when gc built it (each named with its
fragment and deletion file): once a covered file is compacted away or has rows deleted, the
run is no longer used, and gc builds another. A run file is a header, what it covers (JSON),
the entries, then the directory; its size is fixed by its header, so a file still being
written or cut short is recognized and not used.

>>> import lance, tempfile, pyarrow as pa
>>> from blobhouse.dedup import content_hash, digest_matrix
>>> digests = [content_hash(bytes([i])) for i in range(100)]
>>> folder = tempfile.mkdtemp()
>>> dataset = lance.write_dataset(pa.table({"blake3": digests}), folder + "/index")
>>> run = read_run(write_run(folder + "/runs", dataset))
>>> run.candidates(digest_matrix([digests[7], content_hash(b"absent")]))
([0], [7])
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lance import LanceDataset, LanceFragment

from blobhouse.dedup import digest_matrix
from blobhouse.files.ranges import BlobRef, read_ranges
from blobhouse.io.objects import StorageOptions, is_local, object_store, uri_to_path
from blobhouse.layout import sorted_run_name

BUCKET_ENTRIES = 32  # on average: a bucket is ~512 bytes, one small read
ENTRY = np.dtype([("prefix", "<u8"), ("address", "<u8")])
# magic, version, bucket bits, unused, entries, bytes of the covered JSON that follows
HEADER = struct.Struct("<4sBBHQI")
MAGIC, VERSION = b"BHSR", 1
_PARTITIONS_BITS = 8  # the build sorts one of 256 parts of the hash space at a time
_SCAN_BATCH = 65_536
_HEAD_BYTES = 1 << 16  # what is read of a run first: its header and most covered lists


def fragment_signatures(fragments: Iterable[LanceFragment]) -> dict[str, str]:
    """Each data file of ``fragments`` (of the store index) with its fragment and deletion
    file: a run built on the file is usable while this stays the same."""
    return {
        str(data_file.path): _signature(fragment)
        for fragment in fragments
        for data_file in fragment.data_files()
    }


def _signature(fragment: LanceFragment) -> str:
    deletion = fragment.metadata.deletion_file
    deleted = "-" if deletion is None else f"{deletion.read_version}.{deletion.id}"
    return f"{fragment.fragment_id}:{deleted}"


@dataclass(frozen=True)
class SortedRun:
    """A run file as a reader sees it: what it covers and where its parts are."""

    uri: str
    covered: dict[str, str]  # data file -> signature (see :func:`fragment_signatures`)
    entries: int
    bits: int
    _entries_start: int  # where the entries begin: after the header and what it covers
    storage_options: StorageOptions | None = None

    @property
    def _directory_start(self) -> int:
        return self._entries_start + self.entries * ENTRY.itemsize

    def usable_on(self, signatures: dict[str, str]) -> bool:
        """Whether every file the run covers is in the index as it was (``signatures``)."""
        return all(signatures.get(path) == sign for path, sign in self.covered.items())

    def candidates(self, digests: np.ndarray) -> tuple[list[int], list[int]]:
        """For ``digests`` (``n x 32`` uint8), the positions of those whose prefix the run
        holds and the row address of each such entry (a digest may have several)."""
        if not self.entries or not len(digests):
            return [], []
        prefixes = _prefixes(digests)
        buckets = prefixes >> np.uint64(64 - self.bits) if self.bits else prefixes * 0
        needed = np.unique(buckets).astype(np.int64)
        # buckets in order, each sorted: together one sorted array of every candidate
        held = self._buckets(needed)
        lo = np.searchsorted(held["prefix"], prefixes, "left")
        hi = np.searchsorted(held["prefix"], prefixes, "right")
        counts = hi - lo
        positions = np.repeat(np.arange(len(prefixes)), counts)
        at = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return positions.tolist(), held["address"][at].tolist()

    def _buckets(self, buckets: np.ndarray) -> np.ndarray:
        """The entries of ``buckets`` (ascending), in order: from a local file through a
        memory map (the page cache answers), from an object store in two rounds of ranged
        reads."""
        if is_local(self.uri):
            mapped = np.memmap(uri_to_path(self.uri), np.uint8, "r")
            directory = mapped[self._directory_start :].view("<u8")
            entries = mapped[self._entries_start : self._directory_start].view(ENTRY)
            starts, ends = self._checked(directory[buckets], directory[buckets + 1])
            counts = ends - starts
            first = np.repeat(starts - np.cumsum(counts) + counts, counts)
            return entries[first + np.arange(counts.sum())]
        slots = [BlobRef(self.uri, self._directory_start + 8 * b, 16) for b in buckets.tolist()]
        bounds = np.frombuffer(b"".join(self._read(slots)), "<u8").reshape(-1, 2)
        bounds = np.stack(self._checked(bounds[:, 0], bounds[:, 1]), axis=1).tolist()
        size = ENTRY.itemsize
        ranges = [
            BlobRef(self.uri, self._entries_start + size * lo, size * (hi - lo))
            for lo, hi in bounds
            if hi > lo
        ]
        return np.frombuffer(b"".join(self._read(ranges)), ENTRY)

    def _checked(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Directory slots as bucket bounds; ValueError if a damaged one leaves the run (a
        bucket ending before it starts, or past the last entry)."""
        starts, ends = starts.astype(np.uint64), ends.astype(np.uint64)
        if (ends < starts).any() or (ends > np.uint64(self.entries)).any():
            raise ValueError(f"the sorted run {self.uri} is damaged")
        return starts.astype(np.int64), ends.astype(np.int64)

    def _read(self, refs: list[BlobRef]) -> list[bytes]:
        return read_ranges(refs, storage_options=self.storage_options) if refs else []


def _prefixes(digests: np.ndarray) -> np.ndarray:
    """Each digest's first 8 bytes as an unsigned integer (big-endian: digest order)."""
    return np.ascontiguousarray(digests[:, :8]).view(">u8").ravel().astype(np.uint64)


def _covered_json(covered: dict[str, str]) -> bytes:
    return json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()


def bucket_bits(entries: int) -> int:
    """Bits of the bucket number for a run of ``entries`` (~:data:`BUCKET_ENTRIES` a bucket).

    >>> bucket_bits(0), bucket_bits(32), bucket_bits(10_000_000)
    (0, 0, 19)
    """
    return max(0, math.ceil(math.log2(max(entries, 1) / BUCKET_ENTRIES)))


def write_run(
    folder: str, dataset: LanceDataset, storage_options: StorageOptions | None = None
) -> str:
    """Write a run of every entry of ``dataset`` (the store index) into ``folder``; its URI.
    Memory stays flat: the entries are split by their first byte into local temporary files
    in one scan, then each part is sorted and written in turn."""
    covered = fragment_signatures(dataset.get_fragments())
    entries = dataset.count_rows()
    bits = bucket_bits(entries)
    uri = f"{folder}/{sorted_run_name()}"
    new = object_store(uri, storage_options).create(uri)
    try:
        with tempfile.TemporaryDirectory(prefix="blobhouse-run-") as scratch:
            parts = _split(dataset, Path(scratch))
            new.write(HEADER.pack(MAGIC, VERSION, bits, 0, entries, len(_covered_json(covered))))
            new.write(_covered_json(covered))
            written, directory = 0, Path(scratch) / "directory"
            with open(directory, "wb") as slots:
                for part in range(1 << _PARTITIONS_BITS):
                    sorted_part = _sorted_part(parts, part)
                    new.write(sorted_part.tobytes())
                    _directory_of(sorted_part, part, bits, written).tofile(slots)
                    written += len(sorted_part)
                np.array([written], "<u8").tofile(slots)  # the end of the last bucket
            with open(directory, "rb") as slots:
                while block := slots.read(1 << 20):
                    new.write(block)
    except BaseException:
        new.abort()
        raise
    new.close()
    return uri


def _split(dataset: LanceDataset, scratch: Path) -> Path:
    """Every entry's prefix and row address, appended to one file per first byte."""
    # one fragment at a time: Lance reads several ahead by default (measured at 10 M entries:
    # +380 MB of peak memory, +150 MB with one, whatever the index's size)
    for batch in dataset.to_batches(
        columns=["blake3"], with_row_address=True, batch_size=_SCAN_BATCH, fragment_readahead=1
    ):
        records = np.empty(batch.num_rows, ENTRY)
        records["prefix"] = _prefixes(digest_matrix(batch.column("blake3")))
        records["address"] = batch.column("_rowaddr").to_numpy()
        part = (records["prefix"] >> np.uint64(64 - _PARTITIONS_BITS)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        records, part = records[order], part[order]
        starts = np.searchsorted(part, np.arange((1 << _PARTITIONS_BITS) + 1))
        for p in np.unique(part).tolist():
            with open(scratch / f"{p}.part", "ab") as out:
                records[starts[p] : starts[p + 1]].tofile(out)
    return scratch


def _sorted_part(parts: Path, part: int) -> np.ndarray:
    path = parts / f"{part}.part"
    if not path.exists():
        return np.empty(0, ENTRY)
    records = np.fromfile(path, ENTRY)
    path.unlink()
    return records[np.argsort(records["prefix"], kind="stable")]


def _directory_of(records: np.ndarray, part: int, bits: int, before: int) -> np.ndarray:
    """The directory slots of the buckets in ``part`` (the first entry of each), given the
    entries written ``before`` it."""
    if bits < _PARTITIONS_BITS:  # a bucket spans parts: its slot comes with its first part
        first_of_bucket = part % (1 << (_PARTITIONS_BITS - bits)) == 0
        return np.array([before] if first_of_bucket else [], "<u8")
    per_part = 1 << (bits - _PARTITIONS_BITS)
    first = np.uint64(part * per_part)
    buckets = first + np.arange(per_part, dtype=np.uint64)
    keys = records["prefix"] >> np.uint64(64 - bits)
    return (np.searchsorted(keys, buckets) + before).astype("<u8")


def read_runs(folder: str, storage_options: StorageOptions | None = None) -> list[SortedRun]:
    """The whole run files under ``folder`` (those being written or cut short left out)."""
    store = object_store(folder, storage_options)
    with contextlib.suppress(FileNotFoundError):
        listed = {f"{folder}/{i.name}": i.size for i in store.list(folder) if i.size > HEADER.size}
        runs = []
        for uri, size in listed.items():
            with contextlib.suppress(OSError, ValueError):
                run = read_run(uri, storage_options, size)
                if run is not None:
                    runs.append(run)
        return runs
    return []


def read_run(
    uri: str, storage_options: StorageOptions | None = None, size: int | None = None
) -> SortedRun | None:
    """The run at ``uri``, or None if it is not a whole run file."""
    if size is None:
        size = object_store(uri, storage_options).size(uri) or 0
    (head,) = read_ranges(
        [BlobRef(uri, 0, min(size, _HEAD_BYTES))], storage_options=storage_options
    )
    if len(head) < HEADER.size:
        return None
    magic, version, bits, _, entries, names = HEADER.unpack_from(head)
    if (magic, version) != (MAGIC, VERSION):
        return None
    if HEADER.size + names > len(head):
        (head,) = read_ranges(
            [BlobRef(uri, 0, HEADER.size + names)], storage_options=storage_options
        )
    whole = HEADER.size + names + entries * ENTRY.itemsize + ((1 << bits) + 1) * 8
    if size != whole:
        return None  # still being written, or cut short
    covered = json.loads(head[HEADER.size : HEADER.size + names])
    return SortedRun(uri, covered, entries, bits, HEADER.size + names, storage_options)
