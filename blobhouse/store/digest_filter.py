"""Blocked Bloom filters over blake3 digests: the digests a set surely does not hold.

The store's index keeps filters of its data files (:mod:`blobhouse.store`), so a write whose
payloads are all new skips Lance's scalar-index lookup, whose cost grows with the index (~80 us
a digest at 10 M entries). blake3 digests are uniform, so their own bytes place them: bytes 0-7
pick a 64-byte block, bytes 8-31 the :data:`PROBES` bits set in it; a lookup reads one block
per digest, wherever the filter lives. At :data:`BITS_PER_ENTRY` bits an entry about 1 in 50,000
absent digests is reported as maybe present; no added digest is ever reported absent.

A filter file is a header, the names of what it covers (one per line), then the blocks. Its
size is fixed by its header, so a file still being written (or cut short) is recognized and
not used.

>>> from blobhouse.dedup import content_hash, digest_matrix
>>> held, other = content_hash(b"held"), content_hash(b"other")
>>> bloom = DigestFilter.for_entries(1)
>>> bloom.add(digest_matrix([held]))
>>> bloom.may_contain(digest_matrix([held, other])).tolist()
[True, False]
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from blobhouse.cache import WeightedLRU
from blobhouse.files.ranges import BlobRef, read_ranges
from blobhouse.io.objects import ObjectInfo, StorageOptions, object_store

BLOCK_BYTES = 64
# 1 M random digests against a filter of 1 M: 20 bits an entry and 10 probes let 2.0e-4 pass,
# 24 and 12 5.4e-5, 28 and 12 1.8e-5; a lookup asks several filters, and each false positive
# costs a scalar-index query (~20 ms at 10 M entries)
BITS_PER_ENTRY = 28
PROBES = 12  # 9 bits each place one in a block of 512; 12 use the digest's last byte
# digests added in one vectorized step: few of their bits share a byte, so few are set again
# (1 M digests at once: 0.94 s; in steps of 1,000-10,000: 0.10 s)
_ADDED_AT_ONCE = 8192
# magic, version, probes, unused, blocks, bytes of the covered names that follow
HEADER = struct.Struct("<4sBBHQI")
MAGIC, VERSION = b"BHBF", 1
_WHOLE_BYTES = 64 << 10  # a filter file this small is read whole, once
_PROBED_AT_ONCE = 4 << 20  # bytes of filters probed in one vectorized step
_HEAD_BYTES = 4096  # what is read of a bigger one first: its header and covered names
# whole filter files already read, by (uri, size): a file never changes once whole (a new
# filter gets a new random name), and a writer reads the folder's several times an append
_READ: WeightedLRU[tuple[str, int], FilterFile] = WeightedLRU(
    64 << 20, lambda f: 256 + len(f.uri) + sum(len(n) for n in f.covered) + _loaded_bytes(f)
)
_READ_LOCK = threading.Lock()


def _blocks_of(digests: np.ndarray, blocks: int) -> np.ndarray:
    """The block each digest falls in, of a filter of ``blocks`` blocks."""
    first = np.ascontiguousarray(digests[:, :8]).view("<u8").ravel()
    return (first % np.uint64(blocks)).astype(np.int64)


def _bits(digests: np.ndarray) -> np.ndarray:
    """The ``PROBES`` bit positions (0-511) each digest sets within its block."""
    probes = np.ascontiguousarray(digests[:, 8 : 8 + 2 * PROBES]).view("<u2")
    return (probes & (BLOCK_BYTES * 8 - 1)).astype(np.int64)


def _contains(digests: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Whether each digest may be in the filter, given the block it falls in (row by row)."""
    bits = _bits(digests)
    held = blocks[np.arange(len(digests))[:, None], bits >> 3] & (1 << (bits & 7))
    return (held != 0).all(axis=1)


def _any_contains(digests: np.ndarray, filters: np.ndarray, blocks: int) -> np.ndarray:
    """Whether each digest may be in any of ``filters`` (``filters x blocks x 64`` uint8,
    filters of one size: a digest falls in the same block of each), a few MB of probed bytes
    at a time."""
    maybe = np.zeros(len(digests), bool)
    step = max(1, _PROBED_AT_ONCE // (len(filters) * PROBES))
    for start in range(0, len(digests), step):
        part = digests[start : start + step]
        bits = _bits(part)
        at = _blocks_of(part, blocks)[:, None]
        held = filters[:, at, bits >> 3] & (1 << (bits & 7))  # filters x digests x probes
        maybe[start : start + step] = (held != 0).all(axis=2).any(axis=0)
    return maybe


class DigestFilter:
    """A filter held whole in memory, as a writer or gc builds it.

    >>> bloom = DigestFilter.for_entries(1000)
    >>> bloom.blocks, len(bloom.to_bytes(["a.lance"]))
    (55, 3547)
    """

    def __init__(self, bits: np.ndarray) -> None:
        self.bits = bits  # blocks x 64 uint8

    @classmethod
    def for_entries(cls, entries: int) -> DigestFilter:
        """An empty filter sized for ``entries`` digests."""
        blocks = max(1, -(-entries * BITS_PER_ENTRY // (BLOCK_BYTES * 8)))
        return cls(np.zeros((blocks, BLOCK_BYTES), np.uint8))

    @property
    def blocks(self) -> int:
        return len(self.bits)

    def add(self, digests: np.ndarray) -> None:
        """Add the digests (``n x 32`` uint8, see :func:`digest_matrix`)."""
        flat = self.bits.reshape(-1)
        for start in range(0, len(digests), _ADDED_AT_ONCE):
            part = digests[start : start + _ADDED_AT_ONCE]
            at = _blocks_of(part, self.blocks)[:, None] * (BLOCK_BYTES * 8) + _bits(part)
            byte, mask = (at >> 3).ravel(), (1 << (at & 7)).astype(np.uint8).ravel()
            while len(byte):  # of bits of one byte set in one step only one sticks: again
                flat[byte] |= mask
                unset = (flat[byte] & mask) == 0
                byte, mask = byte[unset], mask[unset]

    def may_contain(self, digests: np.ndarray) -> np.ndarray:
        """For each digest, whether it may have been added (False: it surely was not)."""
        return _contains(digests, self.bits[_blocks_of(digests, self.blocks)])

    def to_bytes(self, covered: Iterable[str]) -> bytes:
        """The filter file, naming what it ``covered`` (names without line breaks)."""
        names = "\n".join(covered).encode()
        header = HEADER.pack(MAGIC, VERSION, PROBES, 0, self.blocks, len(names))
        return header + names + self.bits.tobytes()


@dataclass(frozen=True)
class FilterFile:
    """A filter file as a reader sees it: what it covers, and where its blocks are (small
    files are read whole: ``loaded``)."""

    uri: str
    covered: frozenset[str]
    blocks: int
    start: int
    loaded: DigestFilter | None


def write_filter(
    uri: str,
    covered: Sequence[str],
    bloom: DigestFilter,
    storage_options: StorageOptions | None = None,
) -> None:
    """Create the filter file at ``uri`` (a new name: an existing object is never replaced)."""
    new = object_store(uri, storage_options).create(uri)
    try:
        new.write(bloom.to_bytes(covered))
    except BaseException:
        new.abort()
        raise
    new.close()


def read_filters(
    folder: str,
    storage_options: StorageOptions | None = None,
    listed: Sequence[ObjectInfo] | None = None,
) -> list[FilterFile]:
    """The whole filter files under ``folder`` (those being written, cut short, of another
    version, or removed while read are left out): one read of each, two for a big one with
    many covered names. ``listed``: those of the folder's files to read (default: all).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> write_filter(f"{folder}/a.bloom", ["x.lance"], DigestFilter.for_entries(10))
    >>> [sorted(f.covered) for f in read_filters(folder)]
    [['x.lance']]
    """
    if listed is None:
        listed = object_store(folder, storage_options).list(folder)
    sizes = {f"{folder}/{i.name}": i.size for i in listed if i.size >= HEADER.size}
    with _READ_LOCK:
        known = {u: _READ.find((u, s)) for u, s in sizes.items()}
    fresh = _read_parsed({u: s for u, s in sizes.items() if known[u] is None}, storage_options)
    with _READ_LOCK:
        for uri, read in fresh.items():
            _READ.get((uri, sizes[uri]), lambda read=read: read)
    return [f for u in sizes if (f := known[u] or fresh.get(u)) is not None]


def _read_parsed(sizes: dict[str, int], storage_options: StorageOptions | None) -> dict:
    """The whole filter files among ``sizes`` (uri -> size), parsed, by uri."""
    firsts = [
        BlobRef(u, 0, s if s <= _WHOLE_BYTES else min(s, _HEAD_BYTES)) for u, s in sizes.items()
    ]
    heads = _read_each(firsts, storage_options)
    longer = {u: _names_end(h) for u, h in heads.items() if _names_end(h) > len(h)}
    if longer:
        refs = [BlobRef(u, 0, min(end, sizes[u])) for u, end in longer.items()]
        heads.update(_read_each(refs, storage_options))
    return {u: f for u, head in heads.items() if (f := _parsed(u, head, sizes[u])) is not None}


def _read_each(refs: list[BlobRef], storage_options: StorageOptions | None) -> dict[str, bytes]:
    """The bytes of each reference by uri, all in one go; if one cannot be read (gc removed
    it after the listing), one by one without those."""
    try:
        read = read_ranges(refs, storage_options=storage_options)
        return dict(zip((r.uri for r in refs), read, strict=True))
    except OSError:
        read = {}
        for ref in refs:
            with contextlib.suppress(OSError):
                read[ref.uri] = read_ranges([ref], storage_options=storage_options)[0]
        return read


def _loaded_bytes(bloom: FilterFile) -> int:
    return 0 if bloom.loaded is None else bloom.loaded.bits.nbytes


def _names_end(head: bytes) -> int:
    return HEADER.size + HEADER.unpack_from(head)[5]


def _parsed(uri: str, head: bytes, size: int) -> FilterFile | None:
    magic, version, probes, _, blocks, names = HEADER.unpack_from(head)
    start = HEADER.size + names
    if (magic, version, probes) != (MAGIC, VERSION, PROBES) or len(head) < start:
        return None
    if size != start + blocks * BLOCK_BYTES or not blocks:
        return None  # still being written, or cut short
    covered = frozenset(head[HEADER.size : start].decode().split("\n"))
    loaded = None
    if len(head) == size:
        body = np.frombuffer(head, np.uint8, offset=start).reshape(blocks, BLOCK_BYTES)
        loaded = DigestFilter(body)
    return FilterFile(uri, covered, blocks, start, loaded)


def may_contain(
    filters: Sequence[FilterFile],
    digests: np.ndarray,
    storage_options: StorageOptions | None = None,
) -> np.ndarray:
    """For each digest, whether any of ``filters`` may hold it (False: none does), reading
    one block of each unloaded filter per digest."""
    maybe = np.zeros(len(digests), bool)
    refs: list[BlobRef] = []
    wanted: list[tuple[np.ndarray, int]] = []  # per unloaded filter: blocks per digest, count
    loaded: dict[int, list[np.ndarray]] = {}  # filters held whole, by their number of blocks
    for bloom in filters:
        if bloom.loaded is not None:
            loaded.setdefault(bloom.blocks, []).append(bloom.loaded.bits)
            continue
        needed, back = np.unique(_blocks_of(digests, bloom.blocks), return_inverse=True)
        start = bloom.start
        refs += [BlobRef(bloom.uri, start + b * BLOCK_BYTES, BLOCK_BYTES) for b in needed.tolist()]
        wanted.append((back, len(needed)))
    for blocks, held in loaded.items():  # each size asked at once: an index of many small ones
        maybe |= _any_contains(digests, np.stack(held), blocks)
    if refs:
        read = np.frombuffer(b"".join(read_ranges(refs, storage_options=storage_options)), np.uint8)
        blocks, first = read.reshape(-1, BLOCK_BYTES), 0
        for back, count in wanted:
            maybe |= _contains(digests, blocks[first : first + count][back])
            first += count
    return maybe
