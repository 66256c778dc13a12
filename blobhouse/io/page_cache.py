"""Whether a range of a local file is in the page cache, asked without reading it.

``cachestat(2)`` (Linux 6.5+) counts the range's cached pages from the file's page cache;
elsewhere ``mincore(2)`` on a short-lived mapping of the range's pages answers from the page
tables. Neither reads anything. ``cachestat`` is preferred: ~2 us against ~9 us alone, and a
mapping takes the process's memory-map lock, which every page fault of the other reading
threads also takes (the loader spent ~0.3 ms per batch of 32 rows waiting on it, warm).

The probe both replace, a one-byte ``preadv`` with ``RWF_NOWAIT``, starts a read of the page it
asks about; on a fast disk that read often finished inside the call, which then answered
"cached" for a cold range (94 of 320 cold batches of the loader bench), and the batch was read
without its prefetch hints, one range at a time.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys

_PAGE = mmap.PAGESIZE
_FAILED = ctypes.c_void_p(-1).value
_PROBED_BYTES = 1 << 20  # a range's first MiB tells: reads of it go front to back


def _libc() -> ctypes.CDLL | None:
    if sys.platform not in ("linux", "darwin"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int64,  # off_t: 64 bits on the 64-bit platforms pylance ships for
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_CACHESTAT = 451  # the syscall's number on every architecture pylance ships for (Linux 6.5+)


class _Range(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class _Counts(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


class _Cachestat:
    """``cachestat(2)``, until the kernel refuses it once (older than 6.5, or a sandbox that
    filters the call): then None, and :func:`is_cached` maps the range instead."""

    available = _LIBC is not None and sys.platform == "linux"

    @classmethod
    def cached_pages(cls, fd: int, start: int, length: int) -> int | None:
        if not cls.available:
            return None
        counts = _Counts()
        wanted = _Range(start, length)
        number, file, flags = ctypes.c_long(_CACHESTAT), ctypes.c_long(fd), ctypes.c_long(0)
        if _LIBC.syscall(number, file, ctypes.byref(wanted), ctypes.byref(counts), flags) != 0:
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
                cls.available = False
            return None
        return counts.cache


def is_cached(fd: int, position: int, size: int) -> bool | None:
    """Whether every page of bytes ``[position, position + size)`` of the open file ``fd`` is
    in the page cache (of a range over 1 MiB, its first MiB); None when the system cannot tell
    (no ``mincore``, or a file that cannot be mapped). Nothing is read, so asking does not
    change the answer.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"x" * 10_000)
    >>> fd = os.open(path, os.O_RDONLY)
    >>> _ = os.pread(fd, 10_000, 0)
    >>> is_cached(fd, 100, 5_000)
    True
    >>> os.close(fd)
    """
    if _LIBC is None or size <= 0:
        return None
    start = position - position % _PAGE
    length = position + min(size, _PROBED_BYTES) - start
    cached = _Cachestat.cached_pages(fd, start, length)
    if cached is not None:
        return cached == (length + _PAGE - 1) // _PAGE
    address = _LIBC.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if address is None or address == _FAILED:
        return None
    try:
        pages = ctypes.create_string_buffer((length + _PAGE - 1) // _PAGE)
        if _LIBC.mincore(address, length, pages) != 0:
            return None
        return all(page & 1 for page in pages.raw)
    finally:
        _LIBC.munmap(address, length)
