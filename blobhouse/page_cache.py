"""Whether a range of a local file is in the page cache, asked without reading it.

``mincore(2)`` on a short-lived mapping of the range's pages: the kernel answers from its page
tables and reads nothing. The probe it replaces, a one-byte ``preadv`` with ``RWF_NOWAIT``,
starts a read of the page it asks about; on a fast disk that read often finished inside the
call, which then answered "cached" for a cold range (94 of 320 cold batches of the loader bench),
and the batch was read without its prefetch hints, one range at a time.
"""

from __future__ import annotations

import ctypes
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
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


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
