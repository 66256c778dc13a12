"""What a version's commit appended, read from the end of its manifest and its transaction file,
without Lance loading the manifest.

Lance's ``read_transaction(version)`` opens the version first: it decodes the whole manifest,
which lists every fragment so far, so reading each version of a history of appends is
quadratic (at 2,000 versions, 0.75 ms a version against 0.15 ms at 10). What an append
added is in its transaction file, which the manifest names in ``transaction_file`` (field 12),
one of the few fields written after the fragments: the manifest's last bytes hold it.

A manifest file ends with its protobuf ``Manifest`` and a 16-byte footer (where the message
starts, the format version, ``LANC``). The name is found in the message's last
:data:`TAIL_BYTES` by its shape (``<read version>-<uuid>.txn``, framed as field 12): the first
place from which the fields parse to the message's exact end with no second field 12 (one
shaped like it in a field written later, a table config value say, comes after the real one;
one before it meets the real one). Anything else -- a manifest written another way (an inline
transaction, another naming scheme), a missing or unreadable file -- raises
:class:`UnreadTransaction`, and the caller asks Lance. Callers check what this returns against
a manifest they read whole (:func:`blobhouse.maintenance.versions.fragment_states`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from blobhouse.files import protobuf
from blobhouse.io.objects import object_store, read_object
from blobhouse.layout import manifest_path, transaction_path

TAIL_BYTES = 64 << 10  # what Lance itself reads first of a manifest
_FOOTER_BYTES = 16
_MAGIC = b"LANC"
# Manifest.transaction_file, framed: key (12 << 3 | 2), a one-byte length, the name
_TRANSACTION_NAME = re.compile(
    rb"\x62([\x01-\x7f])(\d{1,20}-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.txn)"
)
_TRANSACTION_FILE = 12
# Transaction: the ``append`` operation (other operations are 101-114); Append.fragments;
# DataFragment.files and physical_rows; DataFile.path and base_id
_APPEND, _OPERATIONS = 100, range(100, 200)
_FRAGMENTS = 1
_FILES, _PHYSICAL_ROWS = 2, 4
_PATH, _BASE_ID = 1, 7

# names read inside remembered_names(), by (manifest uri, size): stats asks for each removed
# version's twice (what it appended, then its files). Not kept past the block: a table
# removed and made again at the same place writes manifests of the same sizes.
_NAMES: ContextVar[dict[tuple[str, int], str] | None] = ContextVar("_NAMES", default=None)

#: a fragment as an append writes it: its data files' (path, base id) and its physical rows
Written = tuple[tuple[tuple[str, int | None], ...], int]


class UnreadTransaction(Exception):
    """This module cannot tell what a version's commit did: ask Lance."""


def appended(
    dataset_uri: str, version: int, storage_options: Mapping[str, str] | None = None
) -> list[Written] | None:
    """The fragments ``version`` appended, as written (in the order its transaction lists
    them), or None when its commit was not an append; :class:`UnreadTransaction` when that
    cannot be read here.

    >>> import tempfile, lance, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = lance.write_dataset(pa.table({"a": [1]}), uri)
    >>> _ = lance.write_dataset(pa.table({"a": [2, 3]}), uri, mode="append")
    >>> [(len(files), rows) for files, rows in appended(uri, 2)]
    [(1, 2)]
    >>> appended(uri, 1) is None  # the first version is a create: an overwrite
    True
    """
    name = transaction_name(dataset_uri, version, storage_options)
    uri = transaction_path(dataset_uri, name)
    try:
        return _appended_by(read_object(uri, storage_options))
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise UnreadTransaction(f"{uri}: {exc}") from None


def transaction_name(
    dataset_uri: str, version: int, storage_options: Mapping[str, str] | None = None
) -> str:
    """The transaction file ``version``'s manifest names (in ``_transactions/``).

    >>> import tempfile, lance, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = lance.write_dataset(pa.table({"a": [1]}), uri)
    >>> transaction_name(uri, 1).startswith("0-") and transaction_name(uri, 1).endswith(".txn")
    True
    """
    uri = manifest_path(dataset_uri, version)
    store = object_store(uri, storage_options)
    try:
        size = store.size(uri)
        if size is None or size < _FOOTER_BYTES + 4:
            raise UnreadTransaction(f"{uri}: no manifest of the V2 naming scheme")
        names = _NAMES.get()
        if names is not None and (uri, size) in names:
            return names[uri, size]
        source = store.open(uri)
        try:
            start = max(0, size - TAIL_BYTES)
            tail = source.read(start, size - start)
        finally:
            source.close()
        name = _named(tail, start, size)
        if names is not None:
            names[uri, size] = name
        return name
    except (OSError, ValueError, IndexError) as exc:
        raise UnreadTransaction(f"{uri}: {exc}") from None


@contextmanager
def remembered_names() -> Iterator[None]:
    """Inside the block, :func:`transaction_name` reads each manifest's last bytes once.

    >>> import tempfile, lance, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = lance.write_dataset(pa.table({"a": [1]}), uri)
    >>> with remembered_names():
    ...     transaction_name(uri, 1) == transaction_name(uri, 1)
    True
    """
    token = _NAMES.set({} if _NAMES.get() is None else _NAMES.get())
    try:
        yield
    finally:
        _NAMES.reset(token)


def _named(tail: bytes, start: int, size: int) -> str:
    """The transaction file named by the manifest whose file's bytes from ``start`` to its
    ``size`` are ``tail``."""
    if len(tail) != size - start or not tail.endswith(_MAGIC):
        raise UnreadTransaction("not a Lance manifest")
    at = int.from_bytes(tail[-_FOOTER_BYTES : -_FOOTER_BYTES + 8], "little", signed=True)
    first, end = max(at + 4, start) - start, len(tail) - _FOOTER_BYTES  # past its length
    if not 0 <= first <= end:
        raise UnreadTransaction("its footer points outside the file")
    message = tail[first:end]
    # the first that parses to the end: one in a field written later (a table config value
    # shaped like a name) comes after the real field; one before it meets the real field
    for found in _TRANSACTION_NAME.finditer(message):
        name = found.group(2)
        if found.group(1)[0] == len(name) and _ends_cleanly(message, found.start()):
            return name.decode()
    raise UnreadTransaction("no transaction file named in its last bytes")


def _ends_cleanly(message: bytes, at: int) -> bool:
    """Whether the fields from ``at`` parse to the message's exact end, field 12 only first
    (a top-level field boundary, not bytes that look like one inside another field)."""
    try:
        numbers = [number for number, _ in protobuf.fields(memoryview(message)[at:])]
    except (ValueError, IndexError):
        return False
    return numbers[:1] == [_TRANSACTION_FILE] and _TRANSACTION_FILE not in numbers[1:]


def _appended_by(transaction: bytes) -> list[Written] | None:
    """The fragments a transaction file's ``append`` lists (None: another operation)."""
    operations = [(n, v) for n, v in protobuf.fields(transaction) if n in _OPERATIONS]
    if len(operations) != 1:
        raise UnreadTransaction(f"{len(operations)} operations in one transaction")
    number, append = operations[0]
    if number != _APPEND:
        return None
    return [
        _written(protobuf.message(fragment))
        for n, fragment in protobuf.fields(protobuf.message(append))
        if n == _FRAGMENTS
    ]


def _written(fragment: memoryview) -> Written:
    files, rows = [], 0
    for number, value in protobuf.fields(fragment):
        if number == _FILES:
            file = dict(protobuf.fields(protobuf.message(value)))
            base = file.get(_BASE_ID)
            if base is not None and not isinstance(base, int):
                raise ValueError("a data file's base id is not a number")
            files.append((protobuf.as_bytes(file.get(_PATH)).decode(), base))
        elif number == _PHYSICAL_ROWS:
            if not isinstance(value, int):
                raise ValueError("a fragment's rows are not a number")
            rows = value
    return tuple(files), rows
