"""A Lance data file's schema metadata and global buffers, read with blobhouse's own ranged reads.

Each blobhouse data file keeps its payload checksums in a Lance *global buffer* named by the
file's schema metadata (:mod:`blobhouse.files.checksums`). pylance's ``LanceFileReader`` can read
both, but it blocks on Lance's runtime while holding the GIL: a thread doing so beside threads
running pylance scans was seen to hang them all. Reading the few bytes here needs no runtime.

The layout (Lance file format 2.x, ``protos/file2.proto``; the footer holds three offsets,
not the four that file's diagram draws): the file ends in a 40-byte footer (the u64 offsets of
the column metadata, its offset table and the global buffer offset table; the global buffer
and column counts as u32; the version as two u16; ``LANC``). The global buffer offset table
holds a ``(position, size)`` u64 pair per buffer; buffer 0 is a protobuf ``FileDescriptor``
whose ``Schema`` carries the fields and the schema metadata. Every offset is checked against
the file's size before it sizes a read: a damaged file is named, never read past its end.

A data file blobhouse writes records the name it was written under (:data:`DATA_FILE_KEY`):
Lance's manifest records only a file's name and size, so another file of the same size put in
its place (another table's, or one of this table's copied over it), whose recorded hashes agree
with its own bytes, is told apart by that name (:meth:`DataFileFooter.foreign`).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from blobhouse.errors import BlobReadError, DataFileError, StoreError
from blobhouse.files import protobuf
from blobhouse.io.objects import RangeSource, object_store

MISSING = "it is missing"  # what data_file_problem says of a data file that is not there
DATA_FILE_KEY = "blobhouse:data-file"  # schema metadata: the name the file was written under
_FOOTER = struct.Struct("<QQQIIHH4s")
_MAGIC = b"LANC"
_LAST_MINOR = 3  # Lance file format 2.0 to 2.3
_ALIGNMENT = 64  # where Lance starts each global buffer
# one read from the end usually holds the footer, the offset tables and the schema buffer
_TAIL_BYTES = 64 << 10
# protobuf field numbers: FileDescriptor.schema; Schema.fields, Schema.metadata; Field.name,
# id, parent_id, logical_type, metadata
_SCHEMA, _FIELDS, _METADATA = 1, 1, 5
_NAME, _ID, _PARENT, _TYPE, _FIELD_METADATA = 2, 3, 4, 5, 10
_BLOB_MARKS = {(b"lance-encoding:blob", b"true"), (b"ARROW:extension:name", b"lance.blob.v2")}


@dataclass(frozen=True)
class FileField:
    """One field of a data file's schema as Lance records it (nested fields by parent id)."""

    name: str
    id: int
    parent_id: int
    logical_type: str
    metadata: dict[bytes, bytes]

    @property
    def is_blob(self) -> bool:
        return any(self.metadata.get(key) == value for key, value in _BLOB_MARKS)


@dataclass(frozen=True)
class DataFileFooter:
    """What a data file says about itself: its schema metadata, fields and global buffers.

    >>> import tempfile, pyarrow as pa
    >>> from lance.file import LanceFileWriter
    >>> path = tempfile.mkdtemp() + "/f.lance"
    >>> writer = LanceFileWriter(path, pa.schema([("a", pa.int64())]), version="2.2")
    >>> writer.write_batch(pa.record_batch({"a": [1]}))
    >>> writer.add_global_buffer(b"hello")
    1
    >>> writer.add_schema_metadata("k", "v"); writer.close()
    1
    >>> footer = DataFileFooter.read(path)
    >>> footer.metadata[b"k"], footer.read_buffer(1), footer.leaf_names()
    (b'v', b'hello', ['a'])
    """

    uri: str
    metadata: dict[bytes, bytes]
    # the schema's fields as recorded (protobuf messages), parsed on first use (:attr:`fields`):
    # reading a file's recorded hashes needs its metadata alone, and parsing every field took
    # ~0.35 ms a file (a first read of rows spread over 64 small files parsed 384)
    field_messages: tuple[memoryview | bytes, ...]
    buffers: list[tuple[int, int]]
    storage_options: Mapping[str, str] | None = None
    # the file's last bytes as read for the footer, from ``tail_at``: a global buffer in them
    # (a small file's recorded hashes) is read without another request
    tail: bytes = dataclasses.field(default=b"", repr=False, compare=False)
    tail_at: int = dataclasses.field(default=0, repr=False, compare=False)

    @classmethod
    def read(
        cls, uri: str, storage_options: Mapping[str, str] | None = None, size: int | None = None
    ) -> DataFileFooter:
        """The footer of the data file at ``uri`` of ``size`` bytes (looked up when not
        given; :class:`~blobhouse.errors.BlobReadError` naming it when it is missing or is not
        a Lance 2.x file)."""
        store = object_store(uri, storage_options)
        size = store.size(uri) if size is None else size
        if size is None:
            raise BlobReadError(f"data file {uri} is missing", uri)
        source = store.open(uri)
        try:
            return cls._parse(uri, size, source, storage_options)
        except (ValueError, IndexError, OverflowError, struct.error) as exc:  # damaged bytes
            raise _not_lance(uri, f"its schema does not parse ({exc})") from None
        finally:
            source.close()

    @classmethod
    def _parse(
        cls, uri: str, size: int, source: RangeSource, options: Mapping[str, str] | None
    ) -> DataFileFooter:
        tail_at = max(0, size - _TAIL_BYTES)
        tail = source.read(tail_at, size - tail_at)
        if size < _FOOTER.size or len(tail) != size - tail_at:
            raise _not_lance(uri, "it is shorter than a footer")
        metadata_at, columns_at, buffers_at, count, columns, major, minor, magic = (
            _FOOTER.unpack_from(tail, len(tail) - _FOOTER.size)
        )
        if magic != _MAGIC:
            raise _not_lance(uri, f"it does not end in {_MAGIC!r} (found {magic!r})")
        if major != 2 or minor > _LAST_MINOR:
            raise _not_lance(uri, f"its footer says Lance format {major}.{minor}, not 2.0-2.3")
        # the offsets are read from the file: a damaged one must not size a read
        end = size - _FOOTER.size
        if metadata_at > columns_at or columns_at + 16 * columns > end:
            raise _not_lance(uri, "its column metadata table points past its end")
        if count == 0 or buffers_at + 16 * count > end:
            raise _not_lance(uri, "its global buffer table points past its end")
        entries = _span(uri, source, tail, tail_at, columns_at, 16 * columns)
        # Lance writes the columns' metadata one after another from the region's start to its
        # table: a damaged offset (the region's, or a column's) breaks that tiling, even where
        # it still lies inside the file
        expected = metadata_at
        for i in range(columns):
            at, length = struct.unpack_from("<QQ", entries, 16 * i)
            if at != expected or at + length > columns_at:
                raise _not_lance(uri, f"the metadata of its column {i} lies outside their region")
            expected = at + length
        if columns and expected != columns_at:
            raise _not_lance(uri, "its column metadata does not end where its table starts")
        table = _span(uri, source, tail, tail_at, buffers_at, 16 * count)
        buffers = [struct.unpack_from("<QQ", table, 16 * i) for i in range(count)]
        past = [i for i, (at, length) in enumerate(buffers) if at + length > size]
        if past:
            raise _not_lance(uri, f"its global buffer {past[0]} points past its end")
        unaligned = [i for i, (at, _) in enumerate(buffers) if at % _ALIGNMENT]
        if unaligned:  # Lance aligns each buffer: a position that is not was damaged
            raise _not_lance(uri, f"its global buffer {unaligned[0]} is not {_ALIGNMENT}-aligned")
        descriptor = _span(uri, source, tail, tail_at, *buffers[0])
        metadata: dict[bytes, bytes] = {}
        fields: list[memoryview] = []
        for number, schema in protobuf.fields(descriptor):
            if number != _SCHEMA:
                continue
            for key, value in protobuf.fields(protobuf.message(schema)):
                if key == _METADATA:
                    key_of, value_of = protobuf.map_entry(value)
                    metadata[key_of] = value_of
                elif key == _FIELDS:
                    fields.append(protobuf.message(value))
        return cls(uri, metadata, tuple(fields), buffers, options, tail, tail_at)

    @functools.cached_property
    def fields(self) -> list[FileField]:
        """The fields of the file's schema (:class:`~blobhouse.errors.BlobReadError` naming
        the file when one is damaged)."""
        try:
            return [_field(message) for message in self.field_messages]
        except (ValueError, IndexError, OverflowError) as exc:
            raise _not_lance(self.uri, f"its schema does not parse ({exc})") from None

    def foreign(self) -> str | None:
        """Why this file is not the data file its place names -- it records another name
        (:data:`DATA_FILE_KEY`) -- or None (also for files that record none: Lance's own, and
        blobhouse's before it recorded names)."""
        written = self.metadata.get(DATA_FILE_KEY.encode())
        name = self.uri.rsplit("/", 1)[-1]
        if written is None or written == name.encode():
            return None
        return (
            f"it is another data file, written as {written.decode(errors='replace')!r} "
            "(another table's, or one of this table's copied over it)"
        )

    def read_buffer(self, index: int) -> bytes:
        """The bytes of global buffer ``index``."""
        if not 0 <= index < len(self.buffers):
            raise _not_lance(self.uri, f"it has no global buffer {index}")
        position, size = self.buffers[index]
        if self.tail_at <= position and position + size <= self.tail_at + len(self.tail):
            return self.tail[position - self.tail_at : position - self.tail_at + size]
        source = object_store(self.uri, self.storage_options).open(self.uri)
        try:
            data = source.read(position, size)
        finally:
            source.close()
        if len(data) != size:
            raise _not_lance(self.uri, f"its global buffer {index} is cut short")
        return data

    def leaf_names(self) -> list[str]:
        """Dotted names of the columns the file stores, in file order: struct children in
        place of their struct, a blob column as one column."""
        children: dict[int, list[FileField]] = {}
        for field in self.fields:
            # a blob column's descriptor fields follow it with no field id: not columns
            if field.id >= 0:
                children.setdefault(field.parent_id, []).append(field)
        names: list[str] = []
        seen: set[int] = set()

        def walk(field: FileField, name: str) -> None:
            if field.id in seen:  # a damaged parent id: the fields would nest forever
                raise _not_lance(self.uri, f"its schema nests field {field.id} in itself")
            seen.add(field.id)
            inner = children.get(field.id, [])
            if field.is_blob or field.logical_type != "struct" or not inner:
                names.append(name)
                return
            for child in inner:
                walk(child, f"{name}.{child.name}")

        for top in children.get(-1, []):
            walk(top, top.name)
        return names


def _span(
    uri: str, source: RangeSource, tail: bytes, tail_at: int, position: int, size: int
) -> memoryview | bytes:
    """``size`` bytes at ``position``: from the tail already read, or one more read."""
    if position >= tail_at and position + size <= tail_at + len(tail):
        return memoryview(tail)[position - tail_at : position - tail_at + size]
    data = source.read(position, size)
    if len(data) != size:
        raise _not_lance(uri, "its metadata points past its end")
    return data


def _field(message: memoryview | bytes) -> FileField:
    values: dict[int, object] = {}
    metadata: dict[bytes, bytes] = {}
    for number, value in protobuf.fields(message):
        if number == _FIELD_METADATA:
            key, value_of = protobuf.map_entry(value)
            metadata[key] = value_of
        else:
            values[number] = value
    return FileField(
        name=protobuf.as_bytes(values.get(_NAME)).decode(),
        id=protobuf.int32(values.get(_ID, 0)),
        parent_id=protobuf.int32(values.get(_PARENT, 0)),
        logical_type=protobuf.as_bytes(values.get(_TYPE)).decode(),
        metadata=metadata,
    )


def data_file_problem(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    recorded_size: int | None = None,
    size: int | None = None,
) -> str | None:
    """Why the data file at ``uri`` (of ``size`` bytes, looked up when not given) cannot be
    read as the table's -- missing, not the ``recorded_size`` its manifest records (when it
    records one), its footer damaged, or another data file in its place
    (:meth:`DataFileFooter.foreign`) -- or None. A store that fails the check raises its
    :class:`~blobhouse.errors.StoreError`.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/f.lance"
    >>> _ = open(path, "wb").write(b"not a Lance file" * 4)
    >>> data_file_problem(path, recorded_size=64)
    "it does not end in b'LANC' (found b'file')"
    >>> data_file_problem(path, recorded_size=100)
    'it is 64 bytes, its manifest records 100'
    """
    size = object_store(uri, storage_options).size(uri) if size is None else size
    if size is None:
        return MISSING
    if recorded_size and size != recorded_size:
        return f"it is {size:,} bytes, its manifest records {recorded_size:,}"
    try:
        footer = DataFileFooter.read(uri, storage_options, size)
        footer.fields  # noqa: B018 -- parsed here: a damaged field is a problem of the file
    except BlobReadError as exc:
        if isinstance(exc, StoreError):
            raise
        return str(exc).removeprefix(_not_lance(uri, "").args[0])
    return footer.foreign()


def foreign_file_error(footer: DataFileFooter) -> DataFileError | None:
    """The :class:`~blobhouse.errors.DataFileError` of a data file that is another file in
    its place (:meth:`DataFileFooter.foreign`), or None."""
    why = footer.foreign()
    if why is None:
        return None
    return DataFileError(
        f"data file {footer.uri} is damaged: {why}; its rows cannot be read (restore the file, "
        "or read a version written before it)",
        footer.uri,
    )


def _not_lance(uri: str, why: str) -> BlobReadError:
    return BlobReadError(f"data file {uri} cannot be read: {why}", uri)
