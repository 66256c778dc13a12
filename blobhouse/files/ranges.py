"""Ranged I/O: read resolved blob references with as few, as large, and as parallel reads as
possible.

A resolved reference is ``struct<uri: string, position: int64, size: int64, blake3: binary>``
with an absolute URI and the blake3-256 recorded for its payload when it was written (null when
none was: external blobs the user owns, files other writers made); it is self-contained, so
any process can read and check it without opening the table. A reference built by hand may
leave ``blake3`` out (:func:`is_reference`): its bytes are read unchecked. :func:`read_ranges`
checks each :class:`BlobRef` that carries one unless told ``check_hashes=False``.
"""

from __future__ import annotations

import io
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import NamedTuple

import blake3
import numpy as np
import pyarrow as pa

from blobhouse.errors import (
    BlobReadError,
    CorruptBlobError,
    InvalidInputError,
    StoreError,
    StoreReadError,
)
from blobhouse.io.kept_threads import KeptThreads
from blobhouse.io.objects import MISSING_BUCKET, RangeSource, object_store
from blobhouse.options import check_flag
from blobhouse.placement import MiB

REF_FIELDS = ("uri", "position", "size")  # where the bytes are
REF_TYPE = pa.struct(
    [
        pa.field("uri", pa.utf8()),
        pa.field("position", pa.int64()),
        pa.field("size", pa.int64()),
        pa.field("blake3", pa.binary()),  # what they hash to, recorded when they were written
    ]
)
MAX_READ_BYTES = 64 * MiB
READ_THREADS = 16
DIGEST_BYTES = 32  # a blake3-256


@dataclass(frozen=True)
class BlobRef:
    """Where one blob's bytes are: ``size`` bytes at ``position`` of the object at ``uri``,
    and the ``blake3`` they hash to, recorded when they were written (None: unchecked).

    >>> BlobRef("file:///tmp/x.bin", 10, 5).end
    15
    """

    uri: str
    position: int
    size: int
    blake3: bytes | None = field(default=None, repr=False)

    @property
    def end(self) -> int:
        return self.position + self.size


MAX_END = 2**63 - 1  # where a range may end at the latest: an int64, as Arrow and Lance hold it


def check_ref(ref: BlobRef, at: int = 0) -> None:
    """Refuse a reference no object can answer (``at``: its place in a list, for the message),
    before anything is read or allocated.

    >>> check_ref(BlobRef("file:///x.bin", -1, 5))
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: reference 0 (BlobRef(uri='file:///x.bin', position=-1, \
size=5)): position must be a whole number from 0 to 2**63 - 1, got -1
    """
    problem = ""
    if not isinstance(ref.uri, str) or not ref.uri:
        problem = f"uri must be a URI, got {ref.uri!r}"
    elif "\x00" in ref.uri:
        problem = "its uri holds a NUL character"
    for name in ("position", "size"):
        value = getattr(ref, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            problem = problem or f"{name} must be a whole number, got {value!r}"
        elif not 0 <= value <= MAX_END:
            problem = problem or f"{name} must be a whole number from 0 to 2**63 - 1, got {value}"
    if not problem and ref.position + ref.size > MAX_END:
        problem = f"it ends past 2**63 - 1 ({ref.position} + {ref.size})"
    digest = ref.blake3
    wrong = not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES
    if not problem and digest is not None and wrong:
        shown = f"{len(digest)} bytes" if isinstance(digest, bytes) else type(digest).__name__
        problem = f"it carries a blake3 of {shown}, not {DIGEST_BYTES} bytes (None: unchecked)"
    if problem:
        raise InvalidInputError(f"reference {at} ({ref!r}): {problem}")


def check_ends(
    refs: RefColumns, storage_options: Mapping[str, str] | None = None, every: bool = False
) -> None:
    """Refuse, before its bytes are allocated, a reference larger than one read
    (:data:`MAX_READ_BYTES`) that runs past the end of its object (``every``: any reference
    that does): a hand-built reference claiming a terabyte of a small file would otherwise be
    allocated whole first. One size request per object holding such a reference."""
    big = refs.valid & (refs.sizes > (0 if every else MAX_READ_BYTES))
    if not big.any():
        return
    ends: dict[str, int] = {}
    for row in np.flatnonzero(big).tolist():
        uri = refs.uris[refs.codes[row]]
        ends[uri] = max(ends.get(uri, 0), int(refs.positions[row] + refs.sizes[row]))
    for uri, end in ends.items():
        try:
            size = object_store(uri, storage_options).size(uri)
        except OSError as exc:
            raise _read_error(uri, exc) from None
        if size is None:
            raise BlobReadError(f"missing object {uri}", uri)
        if end > size:
            raise BlobReadError(
                f"a reference runs past the end of {uri}: to byte {end}, the object has {size}",
                uri,
            )


@dataclass(frozen=True)
class RefColumns:
    """Resolved references as columns, what reads are planned from: the distinct ``uris`` and
    each row's index into them (``codes``), ``positions`` and ``sizes``; ``valid`` False for a
    row without a reference. A Python object per row costs more than reading a small blob.

    >>> refs = RefColumns.of([BlobRef("a", 0, 5), None, BlobRef("a", 9, 1)])
    >>> refs.uris, refs.codes.tolist(), refs.ref(2), refs.ref(1)
    (['a'], [0, 0, 0], BlobRef(uri='a', position=9, size=1), None)
    """

    uris: list[str]
    codes: np.ndarray
    positions: np.ndarray
    sizes: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, refs: Sequence[BlobRef | None]) -> RefColumns:
        """Columns of a list of references (None: no reference), each checked
        (:func:`check_ref`: a caller may have built them by hand)."""
        if isinstance(refs, RefColumns):
            return refs
        for at, ref in enumerate(refs):
            if ref is not None:
                check_ref(ref, at)
        codes_of: dict[str, int] = {}
        codes = [codes_of.setdefault(r.uri, len(codes_of)) if r else 0 for r in refs]
        return cls(
            list(codes_of),
            np.array(codes, np.int64),
            np.array([r.position if r else 0 for r in refs], np.int64),
            np.array([r.size if r else 0 for r in refs], np.int64),
            np.array([r is not None for r in refs], bool),
        )

    def __len__(self) -> int:
        return len(self.valid)

    def take(self, rows: np.ndarray) -> RefColumns:
        """The references at ``rows`` (indices into these)."""
        return RefColumns(
            self.uris, self.codes[rows], self.positions[rows], self.sizes[rows], self.valid[rows]
        )

    def compact(self) -> RefColumns:
        """These references naming only the uris they use (a slice of rows read from many
        files keeps its own files' names only).

        >>> refs = RefColumns.of([BlobRef("a", 0, 1), BlobRef("b", 0, 1), None]).take([1, 2])
        >>> refs.uris, refs.compact().uris, refs.compact().codes.tolist()
        (['a', 'b'], ['b'], [0, 0])
        """
        used = np.unique(self.codes[self.valid])
        if len(used) == len(self.uris):
            return self
        code_of = np.zeros(len(self.uris), np.int64)
        code_of[used] = np.arange(len(used))
        return RefColumns(
            [self.uris[u] for u in used.tolist()],
            np.where(self.valid, code_of[self.codes], 0),
            self.positions,
            self.sizes,
            self.valid,
        )

    @staticmethod
    def concat(parts: Sequence[RefColumns]) -> RefColumns:
        """``parts`` one after the other (their uris merged).

        >>> RefColumns.concat([RefColumns.of([BlobRef("a", 0, 1)]),
        ...                    RefColumns.of([BlobRef("b", 0, 1), BlobRef("a", 1, 1)])]).codes
        array([0, 1, 0])
        """
        at: dict[str, int] = {}
        codes = []
        for part in parts:
            mapping = np.array([at.setdefault(u, len(at)) for u in part.uris] or [0], np.int64)
            codes.append(mapping[part.codes])
        return RefColumns(
            list(at),
            np.concatenate(codes),
            np.concatenate([p.positions for p in parts]),
            np.concatenate([p.sizes for p in parts]),
            np.concatenate([p.valid for p in parts]),
        )

    def to_arrow(self, digests: pa.Array | None = None) -> pa.StructArray:
        """These references as :data:`REF_TYPE`, with the recorded blake3 of each payload
        (``digests``, ``binary``; None: none recorded).

        >>> RefColumns.of([BlobRef("a", 0, 5)]).to_arrow().to_pylist()
        [{'uri': 'a', 'position': 0, 'size': 5, 'blake3': None}]
        """
        uris = (
            pa.array(self.uris, pa.utf8()).take(pa.array(self.codes))
            if self.uris
            else pa.nulls(len(self), pa.utf8())
        )
        if digests is None:
            digests = pa.nulls(len(self), pa.binary())
        return pa.StructArray.from_arrays(
            [uris, pa.array(self.positions), pa.array(self.sizes), digests],
            fields=list(REF_TYPE),
            mask=None if self.valid.all() else pa.array(~self.valid),
        )

    def ref(self, row: int) -> BlobRef | None:
        """Row ``row`` as a :class:`BlobRef` (None without a reference)."""
        if not self.valid[row]:
            return None
        return BlobRef(self.uris[self.codes[row]], int(self.positions[row]), int(self.sizes[row]))

    def first_row_of(self, uri: str) -> int | None:
        """The first row referencing ``uri`` (errors name a row)."""
        if uri not in self.uris:
            return None
        rows = np.flatnonzero(self.valid & (self.codes == self.uris.index(uri)))
        return int(rows[0]) if len(rows) else None


def is_reference(names: Sequence[str]) -> bool:
    """Whether a struct with fields ``names`` is a blob reference: :data:`REF_TYPE`'s, or
    one built without the recorded hash (by hand, or by blobhouse before it carried one).

    >>> is_reference(["uri", "position", "size"]), is_reference(["uri", "size"])
    (True, False)
    """
    return tuple(names) in (REF_FIELDS, tuple(REF_TYPE.names))


def refs_from_arrow(array: pa.Array) -> list[BlobRef | None]:
    """Python references from a ``struct<uri, position, size[, blake3]>`` array (null rows stay
    None)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    uris = array.field("uri").to_pylist()
    positions = array.field("position").to_pylist()
    sizes = array.field("size").to_pylist()
    valid = array.is_valid().to_pylist()
    digests = (
        array.field("blake3").to_pylist() if "blake3" in array.type.names else [None] * len(array)
    )
    return [
        BlobRef(u, p, s, d) if ok and u is not None else None
        for ok, u, p, s, d in zip(valid, uris, positions, sizes, digests, strict=True)
    ]


class RangeRead(NamedTuple):
    """One physical read: bytes ``[start, end)`` of ``uri``, serving the references ``members``
    (indices into the list given to :func:`plan_reads`). A tuple: a call plans thousands."""

    uri: str
    start: int
    end: int
    members: tuple[int, ...]


def plan_reads(refs: Sequence[BlobRef | None] | RefColumns, gap: int = 0) -> list[RangeRead]:
    """The reads that serve ``refs``: ranges of one object that overlap, touch, or lie at most
    ``gap`` bytes apart merge into one read of at most 64 MiB (a range larger than that is read
    on its own), so the same range is never read twice.

    >>> [(r.start, r.end, r.members) for r in plan_reads(
    ...     [BlobRef("a", 0, 10), BlobRef("a", 10, 5), BlobRef("a", 0, 10), BlobRef("a", 99, 1)])]
    [(0, 15, (0, 2, 1)), (99, 100, (3,))]
    """
    refs = RefColumns.of(refs)
    rows = np.flatnonzero(refs.valid)
    codes, positions = refs.codes[rows], refs.positions[rows]
    ends = positions + refs.sizes[rows]
    order = np.lexsort((ends, positions, codes))  # stable: a repeated range keeps row order
    reads: list[RangeRead] = []
    uris, code, start, end, members = refs.uris, -1, 0, 0, []
    # one pass over plain ints: a few hundred nanoseconds a reference
    for row, at, position, stop in zip(
        rows[order].tolist(),
        codes[order].tolist(),
        positions[order].tolist(),
        ends[order].tolist(),
        strict=True,
    ):
        if at == code and position <= end + gap and max(end, stop) - start <= MAX_READ_BYTES:
            end = max(end, stop)
            members.append(row)
            continue
        if members:
            reads.append(RangeRead(uris[code], start, end, tuple(members)))
        code, start, end, members = at, position, stop, [row]
    if members:
        reads.append(RangeRead(uris[code], start, end, tuple(members)))
    return reads


Verify = Callable[[int, memoryview], None]
"""Called with a reference's index and its bytes as soon as they are read, in the reading
thread (so checks of one range overlap the reads of others); raises to fail the read."""


@dataclass
class DigestCheck:
    """A :data:`Verify` of references whose bytes must hash to a known blake3: ``expected[i]``
    for reference i (None: not checked), ``place(i)`` the range it reads (references sharing
    one are hashed once) and ``mismatch(i)`` the error of bytes that hash to anything else.

    >>> check = DigestCheck([blake3.blake3(b"a").digest(), None], lambda i: i,
    ...                     lambda i: ValueError(f"reference {i}"))
    >>> check(0, memoryview(b"a")), check(1, memoryview(b"anything"))
    (None, None)
    >>> check.single(0, memoryview(b"b"))
    Traceback (most recent call last):
    ValueError: reference 0
    """

    expected: Sequence[bytes | None]
    place: Callable[[int], object]
    mismatch: Callable[[int], Exception]
    _passed: set = field(default_factory=set, repr=False)

    def __call__(self, index: int, payload: memoryview) -> None:
        digest = self.expected[index]
        if digest is None:
            return
        key = (self.place(index), digest)
        if key in self._passed:
            return
        self.single(index, payload)
        self._passed.add(key)

    def single(self, index: int, payload: memoryview) -> None:
        """The check of a range no other reference of the read shares: no bookkeeping, as
        it runs once a payload, for millions of them. On the reading thread alone: reads run
        in parallel, and waking blake3's pool for one payload costs more than it gains (1 MB
        after a Lance take: 235 against 190 us; 8 MB: 1,550 against 1,480 us)."""
        digest = self.expected[index]
        if digest is not None and blake3.blake3(payload).digest() != digest:
            raise self.mismatch(index)


def _single_check(verify: Verify | None) -> Verify | None:
    """What checks a payload whose range no other reference of the read shares."""
    return verify.single if isinstance(verify, DigestCheck) else verify


def read_ranges(
    refs: Sequence[BlobRef | None] | RefColumns,
    *,
    threads: int = READ_THREADS,
    storage_options: Mapping[str, str] | None = None,
    verify: Verify | None = None,
    check_hashes: bool = True,
) -> list:
    """The bytes of every reference, in order (None for None). ``storage_options`` configure
    access to object stores (see :func:`blobhouse.io.objects.checked_options`); ``verify`` checks
    each payload as it arrives (see :data:`Verify`), and so does the blake3 a
    :class:`BlobRef` carries, unless ``check_hashes`` is False (:func:`carried_hashes`).

    Each payload is read straight into its own ``bytes`` object (one copy, no buffer in
    between); references to the same range share one object.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"hello world")
    >>> read_ranges([BlobRef("file://" + path, 6, 5), BlobRef("file://" + path, 0, 5), None])
    [b'world', b'hello', None]
    """
    columns = RefColumns.of(refs)  # hand-built references checked first
    verify = carried_hashes(refs, verify, check_hashes)
    refs = columns
    check_ends(refs, storage_options)
    out: list = [None] * len(refs)
    positions, sizes = refs.positions.tolist(), refs.sizes.tolist()
    single = _single_check(verify)

    def fill(reader: _ObjectReader, read: RangeRead) -> None:
        data = reader.read(read.uri, read.start, read.end - read.start)
        members = read.members
        if len(members) == 1 and sizes[members[0]] == len(data):  # the common case
            out[members[0]] = data
            if single is not None:
                single(members[0], memoryview(data))
            return
        raw, last, value = memoryview(data), None, b""
        for index in members:  # ordered by range: a repeated range follows its first
            start = positions[index] - read.start
            if (start, sizes[index]) != last:
                last = start, sizes[index]
                whole = start == 0 and sizes[index] == len(data)
                # bytes(data) is data itself: no copy for a whole read
                value = data if whole else bytes(raw[start : start + sizes[index]])
            out[index] = value
            if verify is not None:
                verify(index, memoryview(value))

    _run_reads(refs, threads, storage_options, fill)
    return out


def read_ranges_arrow(
    refs: Sequence[BlobRef | None] | RefColumns,
    *,
    threads: int = READ_THREADS,
    storage_options: Mapping[str, str] | None = None,
    verify: Verify | None = None,
    check_hashes: bool = True,
) -> pa.LargeBinaryArray:
    """The bytes of every reference as one ``large_binary`` array (null for None); ``verify``
    checks each payload as it arrives (see :data:`Verify`), and so does the blake3 a
    :class:`BlobRef` carries, unless ``check_hashes`` is False (:func:`carried_hashes`).

    Reads go straight into the array's buffer, as :func:`plan_reads` plans them: each distinct
    range once, nearby ranges of one object merged (on object stores, ranges up to
    ``coalesce_gap`` apart: one GET), objects and ranges in parallel (on object stores, up to
    ``threads`` requests in flight).
    """
    columns = RefColumns.of(refs)  # hand-built references checked first
    verify = carried_hashes(refs, verify, check_hashes)
    refs = columns
    check_ends(refs, storage_options)
    sizes = np.where(refs.valid, refs.sizes, 0)
    offsets = np.zeros(len(refs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = _allocate(refs, int(offsets[-1]), storage_options)
    out = memoryview(data).cast("B") if data.size else memoryview(bytearray())
    slots, positions, sizes = offsets.tolist(), refs.positions.tolist(), sizes.tolist()
    single = _single_check(verify)

    def fill(reader: _ObjectReader, read: RangeRead) -> None:
        members = read.members
        if len(members) == 1 and sizes[members[0]] == read.end - read.start:
            slot = slots[row := members[0]]
            target = out[slot : slot + sizes[row]]
            reader.read_into(read.uri, read.start, target)
            if single is not None:
                single(row, target)
            return
        raw = memoryview(reader.read(read.uri, read.start, read.end - read.start))
        for index in members:
            slot, start = slots[index], positions[index] - read.start
            target = out[slot : slot + sizes[index]]
            target[:] = raw[start : start + sizes[index]]
            if verify is not None:
                verify(index, target)

    _run_reads(refs, threads, storage_options, fill)
    nulls = len(refs) - int(refs.valid.sum())
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(refs),
        [pa.array(refs.valid).buffers()[1] if nulls else None, pa.py_buffer(offsets), data],
        null_count=nulls,
    )


def _allocate(refs: RefColumns, size: int, storage_options: Mapping[str, str] | None) -> pa.Buffer:
    """A buffer of ``size`` bytes for ``refs``' payloads; when memory cannot hold it, the
    reference that runs past its object is named (many hand-built ones can claim terabytes
    together), else how much was asked for."""
    try:
        return pa.allocate_buffer(size)
    except (MemoryError, pa.ArrowMemoryError):
        check_ends(refs, storage_options, every=True)
        raise BlobReadError(
            f"{int(refs.valid.sum())} references ask for {size:,} bytes together, more than "
            "this process can allocate: read them in smaller groups",
            refs.uris[0] if refs.uris else "",
        ) from None


def carried_hashes(
    refs: Sequence[BlobRef | None] | RefColumns, verify: Verify | None, check_hashes: bool = True
) -> Verify | None:
    """``verify``, and (unless ``check_hashes`` is False) a check of each of ``refs`` that
    carries its blake3: bytes that hash to anything else raise
    :class:`~blobhouse.errors.CorruptBlobError` naming the object and range (a range many
    references share is hashed once). A digest that is not 32 bytes is refused before any read.

    >>> import tempfile, os, blake3
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"hello world")
    >>> ref = BlobRef("file://" + path, 0, 5, blake3.blake3(b"hellO").digest())
    >>> try:
    ...     read_ranges([ref])
    ... except CorruptBlobError as error:
    ...     print(str(error).split(": ", 1)[1][:52])
    the stored copy is damaged or another file is in its
    >>> read_ranges([ref], check_hashes=False)
    [b'hello']
    """
    if not check_flag("check_hashes", check_hashes) or isinstance(refs, RefColumns):
        return verify
    carried = [None if ref is None else ref.blake3 for ref in refs]  # checked: check_ref
    if not any(carried):
        return verify
    passed: set[BlobRef] = set()

    def check(index: int, payload: memoryview) -> None:
        ref = refs[index]
        if ref.blake3 is not None and ref not in passed:
            if blake3.blake3(payload).digest() != ref.blake3:
                raise payload_mismatch("", ref.uri, ref.position, ref.size)
            passed.add(ref)
        if verify is not None:
            verify(index, payload)

    return check


def payload_mismatch(where: str, uri: str, position: int, size: int) -> CorruptBlobError:
    """The error of bytes at ``uri`` ``[position, +size)`` (``where``: the reader and row, or
    empty) that differ from the blake3 their reference carries."""
    return CorruptBlobError(
        f"{where}the bytes at {uri} [{position}, +{size}) do not match the blake3 their "
        "reference carries, recorded when they were written: the stored copy is damaged or "
        "another file is in its place (check_hashes=False reads them unchecked)"
    )


def _run_reads(
    refs: RefColumns,
    threads: int,
    storage_options: Mapping[str, str] | None,
    fill: Callable[[_ObjectReader, RangeRead], None],
) -> None:
    """Plan the reads of ``refs`` and run ``fill`` on each, groups of them in parallel."""
    stores = [object_store(uri, storage_options) for uri in refs.uris]
    gap = min((s.coalesce_gap for s in stores), default=0)
    min_bytes = max((s.parallel_min_bytes for s in stores), default=0)
    capped = bool(stores) and all(s.max_read_threads for s in stores)
    if capped:
        threads = min(threads, max(s.max_read_threads for s in stores))
    groups = _balanced_groups(plan_reads(refs, gap), threads, min_bytes)

    def run(group: list[RangeRead]) -> None:
        with _ObjectReader(storage_options) as reader:
            if len(group) > 1:  # read one by one: prefetched, the disk gets them at once
                reader.prefetch(group)
            for read in group:
                fill(reader, read)

    if len(groups) <= 1:
        for group in groups:
            run(group)
    elif capped:  # a few groups on the kept threads, one on the caller's
        _run_beside(run, groups, _LOCAL_READ_THREADS.pool())
    else:  # each request waits on the network: a thread per group, however many callers
        with ThreadPoolExecutor(len(groups)) as pool:
            list(pool.map(run, groups))


#: threads kept for reads of local files, as many as the cores (their ``max_read_threads``)
_LOCAL_READ_THREADS = KeptThreads(os.cpu_count() or 1, "blobhouse-read")


def _run_beside(
    run: Callable[[list[RangeRead]], None], groups: list[list[RangeRead]], pool: ThreadPoolExecutor
) -> None:
    """``run`` every group: the first on the calling thread, the others on ``pool``. Returns
    (or raises the first error) only once every group is done: none writes into a result the
    caller has given up on. The caller's own group guarantees progress when the pool is busy
    with other callers' groups."""
    others: list[Future] = [pool.submit(run, group) for group in groups[1:]]
    try:
        run(groups[0])
    finally:
        wait(others)
    for future in others:
        future.result()


def _balanced_groups(reads: list[RangeRead], threads: int, min_bytes: int) -> list[list[RangeRead]]:
    """Split reads into at most ``threads`` groups of similar byte counts. A group per thread
    needs ``min_bytes`` of work on local disks (a thread per tiny read costs more than the
    read); on object stores (``min_bytes`` 0) every request waits on the network, so each read
    gets a thread, up to ``threads``."""
    total = sum(r.end - r.start for r in reads)
    count = min(threads, len(reads), total // min_bytes if min_bytes else len(reads))
    if count <= 1:
        return [reads] if reads else []
    groups: list[list[RangeRead]] = [[] for _ in range(count)]
    loads = [0] * count
    for read in sorted(reads, key=lambda r: r.start - r.end):
        target = loads.index(min(loads))
        groups[target].append(read)
        loads[target] += read.end - read.start
    return [g for g in groups if g]


def open_ref(
    ref: BlobRef,
    digest: bytes | None = None,
    name: str = "",
    storage_options: Mapping[str, str] | None = None,
    buffer_size: int | None = None,
) -> io.BufferedReader:
    """A seekable, read-only file object over one reference's bytes. With ``digest`` (its
    blake3; by default the one the reference carries), reading the whole payload front to back
    checks it: the read that reaches the end
    raises :class:`~blobhouse.errors.CorruptBlobError` (naming ``name``) on a mismatch.
    ``buffer_size``: bytes read ahead per read (default: the store's read size); a reader
    that seeks often (a video demuxer) wants a small one, each seek drops the buffer.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"hello world")
    >>> f = open_ref(BlobRef("file://" + path, 6, 5))
    >>> f.seek(2); f.read()
    2
    b'rld'
    """
    check_ref(ref)
    check_ends(RefColumns.of([ref]), storage_options)
    digest = ref.blake3 if digest is None else digest  # what the reference carries, if any
    buffer = buffer_size or object_store(ref.uri, storage_options).read_buffer_bytes
    return io.BufferedReader(_RangeFile(ref, digest, name, storage_options), buffer_size=buffer)


class _ObjectReader:
    """Ranged reads that keep each object open while a group of reads runs."""

    def __init__(self, storage_options: Mapping[str, str] | None = None) -> None:
        self._options = storage_options
        self._open: dict[str, RangeSource] = {}

    def __enter__(self) -> _ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for source in self._open.values():
            source.close()

    def read_into(self, uri: str, position: int, target: memoryview) -> None:
        """Fill ``target`` with the bytes at ``position`` of ``uri``."""
        if not len(target):
            return
        # try/except inline, not a context manager: this runs once per range, maybe millions
        try:
            source = self._open.get(uri) or self._source(uri)
            filled = source.read_into(position, target)
        except OSError as exc:
            raise _read_error(uri, exc) from None
        if filled != len(target):
            raise _short_read(uri, position, len(target), filled)

    def prefetch(self, reads: Sequence[RangeRead]) -> None:
        """Hint that ``reads`` come next (see :meth:`RangeSource.prefetch`)."""
        by_uri: dict[str, list[tuple[int, int]]] = {}
        for read in reads:
            by_uri.setdefault(read.uri, []).append((read.start, read.end - read.start))
        for uri, ranges in by_uri.items():
            try:
                self._source(uri).prefetch(ranges)
            except OSError as exc:
                raise _read_error(uri, exc) from None

    def read(self, uri: str, position: int, size: int) -> bytes:
        if size == 0:
            return b""
        try:
            source = self._source(uri)
            data = source.read(position, size)
            if 0 < len(data) < size:  # one read(2) returns at most ~2 GiB: read on, then join
                parts, got = [data], len(data)
                while got < size and parts[-1]:
                    parts.append(source.read(position + got, size - got))
                    got += len(parts[-1])
                data = b"".join(parts)
        except OSError as exc:
            raise _read_error(uri, exc) from None
        if len(data) != size:
            raise _short_read(uri, position, size, len(data))
        return data

    def _source(self, uri: str) -> RangeSource:
        source = self._open.get(uri)
        if source is None:
            source = self._open[uri] = object_store(uri, self._options).open(uri)
        return source


def _read_error(uri: str, exc: OSError) -> BlobReadError:
    if isinstance(exc, BlobReadError):
        return exc
    if isinstance(exc, FileNotFoundError):
        bucket = MISSING_BUCKET.search(str(exc))
        why = f" (its bucket or container is not there: {bucket[1]})" if bucket else ""
        return BlobReadError(f"missing object {uri}{why}", uri)
    if isinstance(exc, StoreError):  # its message names the object and the read already
        return StoreReadError(str(exc), uri)
    if uri in str(exc):  # a store's refusal, named already
        return BlobReadError(str(exc), uri)
    # a directory, a device gone ...
    return BlobReadError(f"cannot read {uri}: {exc.strerror or exc}", uri)


def _short_read(uri: str, position: int, wanted: int, got: int) -> BlobReadError:
    return BlobReadError(
        f"short read from {uri}: wanted {wanted} bytes at {position}, got {got} "
        "(the object is smaller than the reference says)",
        uri,
    )


class _RangeFile(io.RawIOBase):
    def __init__(
        self,
        ref: BlobRef,
        digest: bytes | None,
        name: str,
        storage_options: Mapping[str, str] | None,
    ) -> None:
        self.ref = ref
        self._pos = 0
        self._reader = _ObjectReader(storage_options)
        self._digest, self._name = digest, name or ref.uri
        self._hasher = blake3.blake3() if digest is not None else None
        self._hashed = 0  # bytes hashed so far, all from the start: reads beyond do not count

    def close(self) -> None:
        if not self.closed:
            self._reader.__exit__()
        super().close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.ref.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readall(self) -> bytes:
        # the default reads 8 KiB at a time: on an object store, a request each
        size = max(0, self.ref.size - self._pos)
        if size == 0:
            self._check(b"")  # an empty payload is read whole by any read
            return b""
        data = self._reader.read(self.ref.uri, self.ref.position + self._pos, size)
        self._check(data)
        self._pos += size
        return data

    def readinto(self, buffer) -> int:
        size = max(0, min(len(buffer), self.ref.size - self._pos))
        if size == 0:
            self._check(b"")
            return 0
        data = self._reader.read(self.ref.uri, self.ref.position + self._pos, size)
        self._check(data)
        memoryview(buffer)[:size] = data
        self._pos += size
        return size

    def _check(self, data: bytes) -> None:
        if self._hasher is None or self._pos != self._hashed:
            return
        self._hasher.update(data)
        self._hashed += len(data)
        if self._hashed == self.ref.size and self._hasher.digest() != self._digest:
            raise CorruptBlobError(
                f"{self._name}: the bytes at {self.ref.uri} [{self.ref.position}, "
                f"+{self.ref.size}) do not match the blake3 recorded when they were written"
            )
