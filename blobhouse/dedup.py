"""Dedup: which rows share one stored payload.

Three modes, chosen per write (or per column):

- ``"content"`` (default): byte-identical payloads share one copy (blake3-256 of the bytes).
- ``"ref_id"``: rows with the same positive ref_id share one copy (seed 000). Unlike the seed,
  every later row's bytes are checked against the first one's (size and hash): a mismatch is a
  :class:`RefIdConflictError` naming column, ref_id and rows.
- ``"global"``: like ``"content"``, but for the whole table: payloads go to the table's
  content-addressed store (:mod:`blobhouse.store`) and rows reference them there.
- ``"off"``: every row stores its own copy.

Apart from ``"global"``, the scope is one data file: a :class:`DedupIndex` lives as long as the
file being written.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal, NamedTuple

import blake3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blobhouse.columns import check_blob_column
from blobhouse.errors import RefIdConflictError
from blobhouse.io.kept_threads import KeptThreads
from blobhouse.settings import DEDUP_MODE

DedupMode = Literal["content", "ref_id", "global", "off"]

DIGEST_BYTES = 32  # blake3-256

CORES = os.cpu_count() or 1  # asked once: the call costs ~30 us, and a write hashes per run


# a lone payload this large is hashed on every core: below it, waking blake3's pool costs more
# than it saves (after a Lance take, 1 MB: 181-194 us on one thread, 232-251 us on the pool; a
# write of 20x repeated 1 MB payloads, which hashes its distinct ones one by one: 106 against
# 121 ms); at 16 MB the two are a draw
PARALLEL_HASH_BYTES = 16 << 20
# below this many bytes in all, a list of payloads is hashed on the calling thread: handing
# work to the pool costs more than it saves
_SPREAD_BYTES = 4 << 20


def content_hash(payload: memoryview | bytes, threads: int | None = None) -> bytes:
    """blake3-256 of ``payload``; payloads of ``PARALLEL_HASH_BYTES`` or more are hashed on
    every core unless ``threads=1`` (the calling thread only).

    >>> content_hash(b"abc").hex()[:16]
    '6437b3ac38465133'
    >>> content_hash(b"x" * (20 << 20), threads=1) == content_hash(b"x" * (20 << 20))
    True
    """
    if threads != 1 and len(payload) >= PARALLEL_HASH_BYTES:
        return blake3.blake3(payload, max_threads=blake3.blake3.AUTO).digest()
    return blake3.blake3(payload).digest()


def content_hashes(
    payloads: Sequence[memoryview | bytes], threads: int | None = None
) -> list[bytes]:
    """blake3-256 of each payload, the list spread over ``threads`` cores (default: all).

    blake3 releases the GIL while it hashes, so slices of the list hashed on pool threads run
    in parallel; one payload of many MB is still split across cores by :func:`content_hash`.
    ``threads=1`` hashes on the calling thread only (a core is busy writing, say).

    >>> content_hashes([b"abc", b""]) == [content_hash(b"abc"), content_hash(b"")]
    True
    """
    threads = CORES if threads is None else threads
    if threads < 2:
        return [blake3.blake3(p).digest() for p in payloads]
    sizes = [len(p) for p in payloads]
    total = sum(sizes)
    if len(payloads) < 2 or total < _SPREAD_BYTES or max(sizes) * 2 > total:
        return [content_hash(p) for p in payloads]
    first, *rest = _byte_balanced(sizes, total, threads)

    def hash_slice(part: slice) -> list[bytes]:
        # one thread per slice already keeps every core busy: each payload on one thread
        return [blake3.blake3(p).digest() for p in payloads[part]]

    # the calling thread hashes a slice too: it would only wait, and a hand-off costs a wake-up
    futures = [_HASH_THREADS.pool().submit(hash_slice, part) for part in rest]
    digests = hash_slice(first)
    for future in futures:
        digests += future.result()
    return digests


def digest_matrix(digests: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Digests as an ``n x 32`` uint8 matrix, over the Arrow buffer where they are one
    (``binary(32)``, or variable-length binary all 32 bytes long); :class:`ValueError` if one
    is null or not 32 bytes.

    >>> digest_matrix([content_hash(b"a"), content_hash(b"b")]).shape
    (2, 32)
    """
    if isinstance(digests, pa.ChunkedArray):
        digests = digests.chunk(0) if digests.num_chunks == 1 else digests.combine_chunks()
    if not isinstance(digests, pa.Array):
        digests = pa.array(digests, pa.binary())
    if len(digests) == 0:
        return np.empty((0, DIGEST_BYTES), np.uint8)
    if digests.null_count:
        raise ValueError("a digest is null")
    if digests.type == pa.binary(DIGEST_BYTES):
        start = digests.offset * DIGEST_BYTES
    else:
        lengths = pc.min_max(pc.binary_length(digests)).as_py()
        if lengths != {"min": DIGEST_BYTES, "max": DIGEST_BYTES}:
            raise ValueError(f"{DIGEST_BYTES}-byte digests only, got lengths {lengths}")
        if not pa.types.is_large_binary(digests.type):
            digests = digests.cast(pa.large_binary())
        # equal lengths: the values lie back to back from the first one's offset
        start = np.frombuffer(digests.buffers()[1], np.int64)[digests.offset]
    values = np.frombuffer(digests.buffers()[-1], np.uint8)
    return values[start : start + DIGEST_BYTES * len(digests)].reshape(-1, DIGEST_BYTES)


class BatchHasher:
    """blake3 of the payloads of one batch, where a payload byte-identical to one it has hashed
    already takes that digest instead of being hashed again.

    Comparing two payloads costs a memcmp, a few times less than blake3 on one core, so rows
    that repeat a payload (the same clip in 20 rows) cost a compare each, not a hash. Only
    payloads with equal samples (:meth:`LogicalColumn.samples`) are compared; a sample shared
    by two different payloads is not compared again (at most one wasted compare per sample).
    Holds views of the batch's payloads: one lives as long as its batch.

    >>> hasher = BatchHasher()
    >>> a, b = b"clip" * 16, b"clap" * 16
    >>> hasher.hashes([a, a, b], [b"s", b"s", None]) == content_hashes([a, a, b])
    True
    """

    def __init__(self) -> None:
        # sample -> the first payload with it and its digest (a one-item list, set once hashed)
        self._first: dict[bytes, tuple[memoryview | bytes, list[bytes]]] = {}
        self._ambiguous: set[bytes] = set()

    def hashes(
        self,
        payloads: Sequence[memoryview | bytes],
        samples: Sequence[bytes | None],
        threads: int | None = None,
    ) -> list[bytes]:
        """The blake3 of each payload (``samples``: each one's sample, None where it is not
        worth comparing), the ones hashed spread over ``threads`` cores."""
        sampled = [s for s in samples if s is not None]
        if not sampled:
            return content_hashes(payloads, threads)
        if len(set(sampled)) == len(sampled) and self._first.keys().isdisjoint(sampled):
            digests = content_hashes(payloads, threads)  # no payload can repeat another
            self._first.update(
                (s, (p, [d])) for s, p, d in zip(samples, payloads, digests, strict=True) if s
            )
            return digests
        hashed: list[int] = []  # positions of the payloads to hash
        digests: list[bytes | list[bytes]] = []  # a digest, or a cell set once hashed
        cells: dict[int, list[bytes]] = {}
        for i, (payload, sample) in enumerate(zip(payloads, samples, strict=True)):
            known = sample is not None and sample not in self._ambiguous
            first = self._first.get(sample) if known else None
            if first is not None:
                if _equal(first[0], payload):
                    digests.append(first[1])
                    continue
                self._ambiguous.add(sample)
            elif known:
                cells[i] = []
                self._first[sample] = (payload, cells[i])
            hashed.append(i)
            digests.append(b"")
        fresh = content_hashes([payloads[i] for i in hashed], threads)
        for i, digest in zip(hashed, fresh, strict=True):
            digests[i] = digest
            if i in cells:
                cells[i].append(digest)
        return [d if isinstance(d, bytes) else d[0] for d in digests]


def _equal(one: memoryview | bytes, other: memoryview | bytes) -> bool:
    # Arrow's buffer comparison is a memcmp; a memoryview's == compares item by item
    return len(one) == len(other) and pa.py_buffer(one).equals(pa.py_buffer(other))


def _byte_balanced(sizes: list[int], total: int, parts: int) -> list[slice]:
    """``parts`` consecutive slices of ``sizes`` holding about as many bytes each."""
    slices, start, done = [], 0, 0
    for i, size in enumerate(sizes):
        done += size
        if done * parts >= total * (len(slices) + 1) and len(slices) < parts - 1:
            slices.append(slice(start, i + 1))
            start = i + 1
    slices.append(slice(start, len(sizes)))
    return slices


_HASH_THREADS = KeptThreads(CORES, "blobhouse-hash")


def dedup_modes(dedup: str | Mapping[str, str], columns: list[str]) -> dict[str, DedupMode]:
    """The dedup mode of each blob column: one mode for all, or a mapping column -> mode
    (``"*"``: every column it does not name; without it, ``"content"``).

    >>> dedup_modes({"video": "ref_id", "*": "global"}, ["video", "thumb"])
    {'video': 'ref_id', 'thumb': 'global'}
    """
    if isinstance(dedup, str):
        modes = dict.fromkeys(columns, dedup)
    else:
        for name in sorted(set(dedup) - set(columns) - {"*"}):
            check_blob_column(name, list(columns), "dedup")  # raises, naming the closest
        modes = {c: dedup.get(c, dedup.get("*", "content")) for c in columns}
    for column, mode in modes.items():
        DEDUP_MODE.check(mode, f"dedup of column {column!r}")
    return modes  # type: ignore[return-value]


def mode_of(dedup: str | Mapping[str, str], column: str) -> str:
    """The mode ``dedup`` (one mode, or a mapping as :func:`dedup_modes` takes) gives
    ``column``.

    >>> mode_of({"video": "ref_id", "*": "global"}, "thumb")
    'global'
    """
    if isinstance(dedup, str):
        return dedup
    return dedup.get(column, dedup.get("*", "content"))


class Fingerprint(NamedTuple):
    """What the first row of a shared payload looked like: checked against later rows (a
    tuple: one is made for every row of a write)."""

    size: int
    digest: bytes | None
    row: int
    external: tuple[str, int, int] | None = None


class DedupIndex:
    """Dedup keys seen in one data file, with the fingerprint of their first row.

    A content key is the payload's digest: a later row with the key holds the same bytes, so
    content keys carry no fingerprint (None). A ref_id key's later rows must match the first.

    >>> index = DedupIndex()
    >>> key = index.key("ref_id", "img", ref_id=7, digest=b"h")
    >>> index.first_seen(key, Fingerprint(3, b"h", row=0), column="img", ref_id=7)
    True
    >>> index.first_seen(key, Fingerprint(3, b"h", row=5), column="img", ref_id=7)
    False
    >>> index.add([b"d1", b"d2"]); index.known({b"d2", b"d3"})
    {b'd2'}
    """

    def __init__(self) -> None:
        self._seen: dict[Hashable, Fingerprint | None] = {}

    @staticmethod
    def key(mode: DedupMode, column: str, *, ref_id: int | None, digest: bytes | None) -> Hashable:
        """The key rows share a payload by, or None when the row shares nothing."""
        if mode == "ref_id":
            return ("ref", column, ref_id) if ref_id else None
        if mode == "content" and digest is not None:
            return digest
        return None

    def first_seen(
        self, key: Hashable, fingerprint: Fingerprint | None, *, column: str, ref_id: int | None
    ) -> bool:
        """Record ``key``; True the first time. Later rows must match the first (ref_id mode)."""
        if key not in self._seen:
            self._seen[key] = fingerprint
            return True
        first = self._seen[key]
        if (
            first is not None
            and fingerprint is not None
            and (first.size, first.digest, first.external)
            != (fingerprint.size, fingerprint.digest, fingerprint.external)
        ):
            raise RefIdConflictError(
                f"blob column {column!r}: ref_id {ref_id} is used by row {first.row} "
                f"({_describe(first)}) and row {fingerprint.row} ({_describe(fingerprint)}) "
                "with different contents; rows sharing a ref_id must carry identical bytes"
            )
        return False

    def add(self, digests: Iterable[bytes]) -> None:
        """Record content keys (digests) seen for the first time, many at once."""
        self._seen.update(dict.fromkeys(digests))

    def known(self, keys: AbstractSet[Hashable]) -> AbstractSet[Hashable]:
        """Those of ``keys`` already recorded."""
        return self._seen.keys() & keys

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Drop ``keys``: a later row with one of them counts as a first sighting again."""
        seen = self._seen
        for key in keys:
            seen.pop(key, None)


def _describe(fp: Fingerprint) -> str:
    if fp.external is not None:
        uri, position, size = fp.external
        return f"uri {uri} [{position}, +{size})"
    return f"{fp.size} bytes, blake3 {fp.digest.hex()[:12] if fp.digest else '-'}"
