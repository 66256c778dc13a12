"""Ranged reads of resolved references: coalescing, parallel objects, clear errors."""

from __future__ import annotations

import multiprocessing
import os
import platform
import re
import threading
from pathlib import Path

import blake3
import pytest

from blobhouse import (
    BlobReadError,
    BlobRef,
    CorruptBlobError,
    InvalidInputError,
    read_ranges,
)
from blobhouse.files.ranges import MAX_READ_BYTES, open_ref, plan_reads, read_ranges_arrow
from blobhouse.io import page_cache
from blobhouse.io.page_cache import is_cached


@pytest.fixture
def objects(tmp_path):
    paths = []
    for name in ("a.bin", "b.bin"):
        path = tmp_path / name
        path.write_bytes(os.urandom(200_000))
        paths.append("file://" + str(path))
    return paths


def test_same_range_once_adjacent_and_overlapping_merged(objects):
    a, b = objects
    refs = [
        BlobRef(a, 0, 100),
        BlobRef(a, 100, 50),
        BlobRef(a, 20, 10),
        BlobRef(a, 0, 100),
        BlobRef(a, 5000, 10),
        BlobRef(b, 0, 10),
        None,
    ]
    reads = plan_reads(refs)
    assert sorted((r.uri, r.start, r.end) for r in reads) == [
        (a, 0, 150),
        (a, 5000, 5010),
        (b, 0, 10),
    ]
    assert sum(len(r.members) for r in reads) == 6


def test_read_ranges_returns_exact_bytes_in_order(objects):
    a, b = objects
    content = {u: Path(u.removeprefix("file://")).read_bytes() for u in objects}
    refs = [BlobRef(u, p, s) for u in (b, a) for p, s in ((0, 1), (10, 90_000), (199_999, 1))]
    refs.insert(2, None)
    got = read_ranges(refs)
    want = [None if r is None else content[r.uri][r.position : r.end] for r in refs]
    assert got == want


def test_merged_reads_are_capped(objects):
    a, _ = objects
    size = MAX_READ_BYTES // 2 + 1
    reads = plan_reads([BlobRef(a, 0, size), BlobRef(a, size, size)])
    assert len(reads) == 2


def test_short_read_names_the_object(objects):
    a, _ = objects
    with pytest.raises(OSError, match=r"short read from .*a\.bin"):
        read_ranges([BlobRef(a, 199_990, 100)])


def test_open_ref_reads_and_seeks_within_the_range(objects):
    a, _ = objects
    content = Path(a.removeprefix("file://")).read_bytes()
    f = open_ref(BlobRef(a, 1000, 500))
    assert f.read(10) == content[1000:1010]
    f.seek(490)
    assert f.read() == content[1490:1500]
    assert f.read() == b""


def test_references_to_one_range_share_one_bytes_object(objects):
    a, _ = objects
    got = read_ranges([BlobRef(a, 10, 100), BlobRef(a, 0, 500), BlobRef(a, 10, 100)])
    assert got[0] is got[2] and got[0] == got[1][10:110]


@pytest.mark.parametrize("read", [read_ranges, read_ranges_arrow])
def test_verify_sees_each_payload_as_read_and_its_error_fails_the_read(objects, read):
    a, b = objects
    content = {u: Path(u.removeprefix("file://")).read_bytes() for u in objects}
    refs = [BlobRef(a, 0, 100), BlobRef(a, 50, 100), None, BlobRef(b, 5, 50_000), BlobRef(a, 0, 0)]
    seen = {}

    def record(index: int, payload: memoryview) -> None:
        seen[index] = bytes(payload)

    read(refs, verify=record)
    assert seen == {i: content[r.uri][r.position : r.end] for i, r in enumerate(refs) if r}

    def refuse(index: int, payload: memoryview) -> None:
        if index == 3:
            raise CorruptBlobError("payload 3 is damaged")

    with pytest.raises(CorruptBlobError, match="payload 3 is damaged"):
        read(refs, verify=refuse)


@pytest.mark.parametrize("read", [read_ranges, read_ranges_arrow])
def test_large_reads_are_checked_in_the_threads_that_read_them(tmp_path, read):
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(12 * 2**20))
    # a byte apart: separate reads, in parallel
    refs = [BlobRef(f"file://{path}", i * 2**20, 2**20 - 1) for i in range(12)]
    threads = set()

    def record(index: int, payload: memoryview) -> None:
        threads.add(threading.get_ident())

    read(refs, verify=record)
    # 12 MiB: 3 threads' worth at 4 MiB a thread, as many as the cores. Each checks what it
    # read (the caller too), so hashing one range overlaps reading another
    assert len(threads) == min(os.cpu_count() or 1, 3)


def _cold_file(path: Path, size: int) -> bytes:
    """Write ``size`` random bytes to ``path`` and take them out of the page cache."""
    data = os.urandom(size)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return data


@pytest.fixture
def hinted(monkeypatch) -> list[tuple[int, int]]:
    """The ``(offset, length)`` of every prefetch hint (``POSIX_FADV_WILLNEED``) given."""
    hints: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            hints.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return hints


def test_reads_of_a_cold_file_are_prefetched_and_of_a_cached_one_not(tmp_path, hinted):
    """Ranges one thread reads one by one are hinted to the kernel first when the file is not
    in the page cache (they reach the disk at once, not one at a time), and not hinted when it
    is (a hint costs more there than it saves). The bytes are the same either way."""
    path = tmp_path / "cold.bin"
    data = _cold_file(path, 4 << 20)
    refs = [BlobRef(f"file://{path}", position, 100_000) for position in (3 << 20, 0, 1 << 20)]
    assert read_ranges(refs) == [data[r.position : r.position + r.size] for r in refs]
    assert sorted(hinted) == [(0, 100_000), (1 << 20, 100_000), (3 << 20, 100_000)]
    hinted.clear()
    assert read_ranges_arrow(refs).to_pylist() == [data[r.position : r.end] for r in refs]
    assert hinted == []  # read just now: cached


def test_an_empty_payload_in_a_cold_group_hints_no_more_than_the_reads(tmp_path, hinted):
    """A hint of length 0 means "to the end of the file": an empty payload among a group's
    reads must not ask the kernel to read the rest of a (maybe many-GB) file."""
    path = tmp_path / "cold.bin"
    data = _cold_file(path, 8 << 20)
    refs = [BlobRef(f"file://{path}", p, s) for p, s in ((0, 0), (1 << 20, 1000), (5 << 20, 10))]
    assert read_ranges(refs) == [b"", *(data[r.position : r.end] for r in refs[1:])]
    assert sorted(hinted) == [(1 << 20, 1000), (5 << 20, 10)]


def _read_from_storage() -> int:
    """Bytes this process made the kernel read from storage (``/proc/self/io``)."""
    lines = Path("/proc/self/io").read_text().splitlines()
    return int(next(line for line in lines if line.startswith("read_bytes")).split()[1])


@pytest.mark.parametrize("asked_by", ["cachestat", "mincore"])
def test_asking_whether_a_cold_range_is_cached_reads_nothing(tmp_path, monkeypatch, asked_by):
    """The look-up before prefetching reads nothing: a probe that read (``preadv`` with
    ``RWF_NOWAIT``) started a read of each page it asked about, and on a fast disk answered
    "cached" for the read it had started itself, so a cold batch went unhinted. Kernels
    without ``cachestat`` (before 6.5) are asked with ``mincore``: the same answers."""
    if asked_by == "mincore":
        monkeypatch.setattr(page_cache._Cachestat, "available", False)
    path = tmp_path / "cold.bin"
    _cold_file(path, 16 << 20)
    ranges = [(i * 250_000, 100_000) for i in range(64)]
    fd = os.open(path, os.O_RDONLY)
    try:
        kernel = tuple(int(n) for n in re.findall(r"\d+", platform.release())[:2])
        if asked_by == "cachestat" and kernel >= (6, 5):  # it has the call: it is used
            assert page_cache._Cachestat.cached_pages(fd, 0, 1 << 20) == 0
        before = _read_from_storage()
        assert [is_cached(fd, *r) for r in ranges] == [False] * len(ranges)
        assert _read_from_storage() == before  # asking read nothing
        for position, size in ranges:
            os.pread(fd, size, position)
        assert [is_cached(fd, *r) for r in ranges] == [True] * len(ranges)
        assert is_cached(fd, 0, 0) is None  # an empty range has no pages to ask about
    finally:
        os.close(fd)


@pytest.mark.parametrize("read", [read_ranges, read_ranges_arrow])
def test_reads_of_local_files_use_no_more_threads_than_cores(tmp_path, read):
    """Hinted to the kernel, one thread's reads of a local file reach the disk at once: more
    threads than cores add nothing cold and only contend for the GIL when the pages are cached
    (1,000 checked reads of 5-64 KB: 24 ms on 2 threads, 33 ms on 8). The bytes are the same."""
    path = tmp_path / "many.bin"
    data = os.urandom(40 << 20)
    path.write_bytes(data)
    # 400 ranges of 64 KB a byte apart (separate reads): 10 groups' worth at 4 MiB a thread
    refs = [BlobRef(f"file://{path}", i * 100_001, 64 << 10) for i in range(400)]
    threads = set()

    def record(index: int, payload: memoryview) -> None:
        threads.add(threading.get_ident())

    out = read(refs, threads=16, verify=record)
    values = out.to_pylist() if read is read_ranges_arrow else out
    assert values == [data[r.position : r.end] for r in refs]
    assert 1 <= len(threads) <= (os.cpu_count() or 1)


def _read_in_child(refs: list[BlobRef], out: multiprocessing.Queue) -> None:
    out.put(read_ranges(refs))


def test_reads_of_local_files_run_on_kept_threads_also_after_a_fork(tmp_path):
    """Threads started for each call cost as much as reading 64 small payloads: the threads
    beside the caller are kept between calls. A forked child (a DataLoader worker) inherits
    the pool but not its threads, and reads on threads of its own."""
    path = tmp_path / "many.bin"
    data = os.urandom(24 << 20)
    path.write_bytes(data)
    refs = [BlobRef(f"file://{path}", i * 100_001, 64 << 10) for i in range(240)]
    seen: list[set[int]] = []
    for _ in range(5):
        seen.append(set())
        # native ids: Python's thread idents of exited threads come back for new ones
        read_ranges(refs, verify=lambda index, payload: seen[-1].add(threading.get_native_id()))
        seen[-1].discard(threading.get_native_id())
    if (os.cpu_count() or 1) > 1:  # each call beside the caller, all on the pool's threads
        assert all(seen) and len(set().union(*seen)) <= (os.cpu_count() or 1)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_read_in_child, args=(refs, out))
    child.start()
    try:
        assert out.get(timeout=60) == [data[r.position : r.end] for r in refs]
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"position": 2**63}, r"position must be a whole number from 0 to 2\*\*63 - 1"),
        ({"position": -1}, "position must be a whole number from 0"),
        ({"size": -1}, "size must be a whole number from 0"),
        ({"size": 1.5}, "size must be a whole number"),
        ({"uri": None}, "uri must be a URI"),
        ({"uri": ""}, "uri must be a URI"),
        ({"blake3": b"short"}, "carries a blake3 of 5 bytes, not 32"),
        ({"blake3": bytearray(32)}, "carries a blake3 of bytearray, not 32 bytes"),
        ({"uri": "file:///x\x00y"}, "its uri holds a NUL character"),
        ({"position": 2**62, "size": 2**62}, "ends past 2\\*\\*63 - 1"),
    ],
)
@pytest.mark.parametrize("read", ["read_ranges", "read_ranges_arrow", "open_ref"])
def test_a_hand_built_reference_is_checked_before_anything_is_read(objects, read, change, message):
    ref = BlobRef(**{"uri": objects[0], "position": 0, "size": 4, **change})
    with pytest.raises(InvalidInputError, match=message):
        if read == "open_ref":
            open_ref(ref).read()
        else:
            {"read_ranges": read_ranges, "read_ranges_arrow": read_ranges_arrow}[read]([ref])


@pytest.mark.parametrize("read", ["read_ranges", "read_ranges_arrow", "open_ref"])
def test_a_fifo_where_an_object_belongs_is_refused_not_waited_on(tmp_path, read):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ref = BlobRef(f"file://{fifo}", 0, 10)
    with pytest.raises(BlobReadError, match="not a regular file"):
        if read == "open_ref":
            open_ref(ref).read()
        else:
            {"read_ranges": read_ranges, "read_ranges_arrow": read_ranges_arrow}[read]([ref])


def test_an_empty_reference_carrying_another_payloads_hash_is_refused(objects):
    empty = BlobRef(objects[0], 0, 0, blake3.blake3(b"not empty").digest())
    with pytest.raises(CorruptBlobError):
        open_ref(empty).read()
    with pytest.raises(CorruptBlobError):
        read_ranges([empty])
    assert open_ref(BlobRef(objects[0], 0, 0, blake3.blake3(b"").digest())).read() == b""


def test_references_claiming_more_than_memory_together_are_named_not_allocated(objects):
    """Each within one read's size, so none is checked against its object up front (where
    the kernel grants any allocation, vm.overcommit_memory=1, the first read is short)."""
    refs = [BlobRef(objects[0], 0, MAX_READ_BYTES)] * 2**15  # 2 TiB together
    with pytest.raises(BlobReadError, match=r"runs past the end of|short read"):
        read_ranges_arrow(refs)


@pytest.mark.parametrize("read", ["read_ranges", "read_ranges_arrow", "open_ref"])
def test_a_reference_past_its_object_is_refused_before_its_bytes_are_allocated(objects, read):
    ref = BlobRef(objects[0], 0, 10**12)  # 1 TB of a small file: never allocated
    with pytest.raises(BlobReadError, match=r"short read|past the end"):
        if read == "open_ref":
            open_ref(ref).read()
        else:
            {"read_ranges": read_ranges, "read_ranges_arrow": read_ranges_arrow}[read]([ref])
