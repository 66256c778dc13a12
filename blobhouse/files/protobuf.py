"""The few protobuf reads blobhouse does itself: Lance's file footers, manifests and
transaction files hold protobuf messages, and reading a handful of their fields here needs
neither Lance's runtime nor a protobuf library.

>>> [(number, bytes(value) if isinstance(value, memoryview) else value)
...  for number, value in fields(b"\\x08\\x96\\x01\\x12\\x02hi")]
[(1, 150), (2, b'hi')]
"""

from __future__ import annotations

from collections.abc import Iterator


def message(value: object) -> memoryview:
    """A length-delimited value (a message, a string, bytes); ValueError for a varint where
    one belongs (a damaged file: ``bytes(2**40)`` would allocate a terabyte)."""
    if not isinstance(value, memoryview):
        raise ValueError(f"a varint {value} where a message belongs")
    return value


def as_bytes(value: object) -> bytes:
    """A length-delimited value as bytes (empty when absent)."""
    return b"" if value is None else bytes(message(value))


def int32(value: object) -> int:
    """A protobuf int32 (negative ones are ten-byte varints of their 64-bit two's complement)."""
    if not isinstance(value, int):
        raise ValueError("a message where a varint belongs")
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(buf: memoryview | bytes) -> Iterator[tuple[int, memoryview | int]]:
    """The ``(field number, value)`` pairs of a protobuf message: varints as ints,
    length-delimited values as views (fixed-width ones are skipped: no field read here has one).
    A field that runs past the message's end is damage: ValueError (IndexError for a varint
    cut short), never a shorter value.

    >>> list(fields(b"\\x12\\x05hi"))
    Traceback (most recent call last):
    ValueError: field 2 runs past the end of its message (5 bytes at 2 of 4)
    """
    view = memoryview(buf)
    at, end = 0, len(view)
    while at < end:
        key, at = varint(view, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(view, at)
            yield number, value
            continue
        if wire == 2:
            size, at = varint(view, at)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not one Lance writes")
        if at + size > end:
            raise ValueError(
                f"field {number} runs past the end of its message ({size} bytes at {at} of {end})"
            )
        if wire == 2:
            yield number, view[at : at + size]
        at += size


def varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def map_entry(value: object) -> tuple[bytes, bytes]:
    """The key and value of one entry of a ``map<string, bytes>`` (fields 1 and 2 of a
    length-delimited entry)."""
    entry = dict(fields(message(value)))
    return as_bytes(entry.get(1)), as_bytes(entry.get(2))
