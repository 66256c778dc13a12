"""Blob values: the logical input surface and the columns that carry it.

A blob column is written from one of:

- the logical blob struct ``struct<data, uri, position, size, ref_id, managed>`` (built with
  :func:`blob_array` / :func:`blob_field`; any layout ``data, uri[, position, size][, ref_id]
  [, managed]`` with binary / string / integer / boolean children is accepted, so Spark's
  ``binary``/``long`` variant and Lance's own ``lance.blob.v2`` arrays work too);
- a plain ``binary`` / ``large_binary`` column named in ``blob_columns=[...]``.

Blob columns may sit at top level or inside structs (addressed as ``"parent.child"``), never
inside a list or map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from blobhouse.errors import InvalidInputError, SchemaError
from blobhouse.placement import Placement

ColumnPath = tuple[str, ...]

#: the column Lance adds to a scan or take asked ``with_row_address``
ROW_ADDRESS = "_rowaddr"

LOGICAL_BLOB_TYPE = pa.struct(
    [
        pa.field("data", pa.large_binary()),
        pa.field("uri", pa.utf8()),
        pa.field("position", pa.uint64()),
        pa.field("size", pa.uint64()),
        pa.field("ref_id", pa.uint64()),
        pa.field("managed", pa.bool_()),
    ]
)
_BASE_LAYOUTS = (
    ("data", "uri"),
    ("data", "uri", "position", "size"),
    ("data", "uri", "ref_id"),
    ("data", "uri", "position", "size", "ref_id"),
)
# each layout may end with ``managed`` (the table takes ownership of the external object)
_LOGICAL_LAYOUTS = _BASE_LAYOUTS + tuple((*layout, "managed") for layout in _BASE_LAYOUTS)
LANCE_BLOB_EXTENSION = "lance.blob.v2"


@dataclass(frozen=True)
class Blob:
    """One logical blob value: bytes, or a reference to (a range of) an external object.

    ``ref_id`` (> 0) marks rows that carry the same payload so it is stored once. ``managed``
    hands the external object at ``uri`` to the table: once the write commits, gc deletes it
    when no retained version references it any more (docs/managed-objects.md).

    >>> Blob(data=b"jpeg bytes", ref_id=7).ref_id
    7
    >>> Blob(uri="file:///data/video.mp4", position=0, size=1024).size
    1024
    >>> Blob(uri="file:///data/video.mp4", managed=True).managed
    True
    """

    data: bytes | None = None
    uri: str | None = None
    position: int | None = None
    size: int | None = None
    ref_id: int | None = None
    managed: bool = False

    def __post_init__(self) -> None:
        problem = _value_problem(
            self.data, self.uri, self.position, self.size, self.ref_id, self.managed
        )
        if problem:
            raise InvalidInputError(f"invalid Blob: {problem}")


def blob_field(
    name: str,
    *,
    nullable: bool = True,
    inline_size_threshold: int | None = None,
    dedicated_size_threshold: int | None = None,
    pack_file_size_threshold: int | None = None,
) -> pa.Field:
    """An Arrow field for a blob column, with optional per-column placement thresholds.

    Thresholds not given fall back to the table's, then to Lance's defaults (inline <= 64 KiB,
    packed <= 4 MiB, dedicated above, pack sidecars roll over at 1 GiB).

    >>> blob_field("video", inline_size_threshold=0).name
    'video'
    """
    placement = Placement.overrides(
        inline_size_threshold=inline_size_threshold,
        dedicated_size_threshold=dedicated_size_threshold,
        pack_file_size_threshold=pack_file_size_threshold,
    )
    return pa.field(name, LOGICAL_BLOB_TYPE, nullable=nullable, metadata=placement or None)


def blob_array(values: Iterable[Any]) -> pa.StructArray:
    """Build a logical blob array from bytes, URI strings, :class:`Blob` values or None.

    >>> arr = blob_array([b"abc", "file:///tmp/x.bin", Blob(data=b"z", ref_id=3), None])
    >>> arr.type == LOGICAL_BLOB_TYPE, arr.null_count
    (True, 1)
    """
    rows: list[Blob | None] = []
    for index, value in enumerate(values):
        if value is None or isinstance(value, Blob):
            rows.append(value)
        elif isinstance(value, bytes | bytearray | memoryview):
            rows.append(Blob(data=bytes(value)))
        elif isinstance(value, str):
            rows.append(Blob(uri=value))
        else:
            raise InvalidInputError(
                f"blob_array: value {index} is a {type(value).__name__}; "
                "expected bytes, a URI string, a Blob, or None"
            )
    children = [
        pa.array([None if r is None else getattr(r, f.name) for r in rows], type=f.type)
        for f in LOGICAL_BLOB_TYPE
    ]
    mask = pa.array([r is None for r in rows], type=pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(LOGICAL_BLOB_TYPE), mask=mask)


def is_logical_blob_type(dtype: pa.DataType) -> bool:
    """True for the logical blob struct (any accepted layout) and Lance's blob extension."""
    if isinstance(dtype, pa.ExtensionType):
        return dtype.extension_name == LANCE_BLOB_EXTENSION
    if not pa.types.is_struct(dtype):
        return False
    names = tuple(f.name for f in dtype)
    if names not in _LOGICAL_LAYOUTS:
        return False
    kinds = {"data": _is_binary, "uri": _is_string, "managed": pa.types.is_boolean}
    return all(kinds.get(f.name, pa.types.is_integer)(f.type) for f in dtype)


def is_lance_blob_field(field: pa.Field) -> bool:
    """True for a field Lance stores as a blob v2 column (extension type or its metadata)."""
    if isinstance(field.type, pa.ExtensionType):
        return field.type.extension_name == LANCE_BLOB_EXTENSION
    meta = field.metadata or {}
    return meta.get(b"ARROW:extension:name") == LANCE_BLOB_EXTENSION.encode()


def path_name(path: ColumnPath) -> str:
    """``("meta", "image")`` -> ``"meta.image"``."""
    return ".".join(path)


def find_blob_columns(schema: pa.Schema, named: Sequence[str] = ()) -> list[ColumnPath]:
    """Blob column paths of ``schema``: logical blob structs, plus binary columns in ``named``.

    Raises :class:`SchemaError` for a named column that does not exist or is not binary, and
    for a blob inside a list or map.
    """
    wanted = {tuple(name.split(".")): name for name in named}
    found: list[ColumnPath] = []

    def walk(field: pa.Field, path: ColumnPath, in_container: str | None) -> None:
        dtype = field.type
        is_blob = is_logical_blob_type(dtype) or is_lance_blob_field(field) or path in wanted
        if is_blob and in_container:
            raise SchemaError(
                f"blob column {path_name(path)!r} is inside a {in_container}; blobs are "
                "supported at top level and inside structs only"
            )
        if is_blob:
            if path in wanted and not (_is_binary(dtype) or is_logical_blob_type(dtype)):
                raise SchemaError(
                    f"blob column {path_name(path)!r} has type {dtype}; a blob column must "
                    "be binary, large_binary or the logical blob struct"
                )
            found.append(path)
            return
        if isinstance(dtype, pa.ExtensionType):
            dtype = dtype.storage_type
        if pa.types.is_struct(dtype):
            _check_not_blob_like(dtype, path)
            for child in dtype:
                walk(child, (*path, child.name), in_container)
        elif pa.types.is_map(dtype):
            walk(dtype.key_field, (*path, "key"), "map")
            walk(dtype.item_field, (*path, "value"), "map")
        elif _is_list(dtype):
            walk(dtype.value_field, (*path, dtype.value_field.name), "list")

    for field in schema:
        walk(field, (field.name,), None)
    missing = [name for path, name in wanted.items() if path not in found]
    if missing:
        raise SchemaError(
            f"blob_columns names {missing} but the data has no such column "
            f"(columns: {schema.names})"
        )
    return found


def _check_not_blob_like(dtype: pa.StructType, path: ColumnPath) -> None:
    """A struct that is almost a blob is an error, never a silent plain column."""
    names = [f.name for f in dtype]
    if {"kind", "blob_id", "blob_size"} <= set(names):
        raise SchemaError(
            f"column {path_name(path)!r} is a prepared blob column; prepared values belong to one "
            "data file's namespace: write them with BlobSession.write_data_file and commit with "
            "Table.add_data_file"
        )
    if {"data", "uri"} <= set(names):
        raise SchemaError(
            f"column {path_name(path)!r} looks like a blob struct but its fields {names} are not "
            "a logical blob layout: data, uri[, position, size][, ref_id][, managed] (binary, "
            "string, integers, boolean)"
        )


def stored_blob_columns(schema: pa.Schema) -> list[ColumnPath]:
    """Paths of the columns a Lance table schema stores as blobs."""
    paths: list[ColumnPath] = []

    def walk(field: pa.Field, path: ColumnPath) -> None:
        if is_lance_blob_field(field):
            paths.append(path)
        elif pa.types.is_struct(field.type):
            for child in field.type:
                walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return paths


def get_field(schema: pa.Schema, path: ColumnPath) -> pa.Field:
    """The field at ``path`` (``("meta", "image")``) of ``schema``."""
    field = schema.field(path[0])
    for name in path[1:]:
        field = field.type.field(name)
    return field


def replace_field(schema: pa.Schema, path: ColumnPath, new: pa.Field) -> pa.Schema:
    """``schema`` with the field at ``path`` replaced by ``new`` (renamed to fit)."""
    index = schema.get_field_index(path[0])
    return schema.set(index, _replace_in_field(schema.field(index), path[1:], new))


def _replace_in_field(parent: pa.Field, rest: ColumnPath, new: pa.Field) -> pa.Field:
    if not rest:
        return new.with_name(parent.name)
    children = [
        _replace_in_field(c, rest[1:], new) if c.name == rest[0] else c for c in parent.type
    ]
    return pa.field(parent.name, pa.struct(children), parent.nullable, parent.metadata)


def get_column(batch: pa.RecordBatch, path: ColumnPath) -> pa.Array:
    """The array at ``path`` of ``batch``, with parents' nulls applied to it."""
    array = batch.column(path[0])
    for name in path[1:]:
        struct_type = array.type
        array = array.flatten()[struct_type.get_field_index(name)]
    return array


def replace_column(
    batch: pa.RecordBatch, path: ColumnPath, array: pa.Array, field: pa.Field
) -> pa.RecordBatch:
    """``batch`` with the column at ``path`` replaced by ``array`` (typed as ``field``)."""
    index = batch.schema.get_field_index(path[0])
    old_field = batch.schema.field(index)
    new_array, new_field = _replace_in(batch.column(index), old_field, path[1:], array, field)
    return batch.set_column(index, new_field, new_array)


def _replace_in(
    parent: pa.Array, parent_field: pa.Field, rest: ColumnPath, array: pa.Array, field: pa.Field
) -> tuple[pa.Array, pa.Field]:
    if not rest:
        return array, field.with_name(parent_field.name)
    if parent.offset:
        parent = pa.concat_arrays([parent])  # children of a sliced struct carry the offset
    children = []
    fields = []
    for child_field in parent.type:
        child = parent.field(child_field.name)
        if child_field.name == rest[0]:
            child, child_field = _replace_in(child, child_field, rest[1:], array, field)
        children.append(child)
        fields.append(child_field)
    mask = parent.is_null() if parent.null_count else None
    rebuilt = pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    return rebuilt, pa.field(parent_field.name, rebuilt.type, parent_field.nullable)


class LogicalColumn:
    """One blob column of one batch, normalized so each row is null, bytes, or a URI.

    ``payload(row)`` returns a zero-copy memoryview of the row's bytes (for hashing and sidecar
    writes); ``data`` is the column's bytes as a ``large_binary`` array. ``first_row`` is the
    index of the batch's first row in the whole write, for error messages.
    """

    def __init__(
        self, array: pa.Array, column: str, ref_ids: pa.Array | None = None, *, first_row: int = 0
    ) -> None:
        self.column = column
        self.first_row = first_row
        self.length = len(array)
        self.valid = validity(array)
        if isinstance(array.type, pa.ExtensionType):
            array = array.storage
        if pa.types.is_struct(array.type):
            children = dict(zip([f.name for f in array.type], array.flatten(), strict=True))
            data = children.get("data")
            self.uri = _pylist(children.get("uri"))
            self.position = _int_list(children.get("position"), column, "position")
            self.size = _int_list(children.get("size"), column, "size")
            struct_ref_ids = children.get("ref_id")
            self.managed = _bool_list(children.get("managed"), column)
        else:
            data, self.uri, self.position, self.size, struct_ref_ids = array, None, None, None, None
            self.managed = None
        if struct_ref_ids is not None and struct_ref_ids.null_count == len(struct_ref_ids):
            struct_ref_ids = None  # blob_array's ref_id field, left empty
        if ref_ids is not None and struct_ref_ids is not None:
            raise InvalidInputError(
                f"blob column {column!r} carries ref_id in its struct and in a ref_id column; "
                "use one of them"
            )
        self.ref_id = _int_list(
            ref_ids if ref_ids is not None else struct_ref_ids, column, "ref_id"
        )
        if data is not None and not pa.types.is_large_binary(data.type):
            data = data.cast(pa.large_binary())
        self.data = data
        self._offsets, self._data = _binary_buffers(data)
        self.has_data = None if data is None else validity(data)
        self._check_rows()

    def payload(self, row: int) -> memoryview:
        """The bytes of ``row`` (which must hold data, not a URI), without copying."""
        return self._data[self._offsets[row] : self._offsets[row + 1]]

    def payloads(self, rows: list[int]) -> list[memoryview]:
        """The bytes of each of ``rows`` (as :meth:`payload`), sliced in one pass.

        >>> column = LogicalColumn(pa.array([b"ab", b"", b"cde"]), "b")
        >>> [bytes(p) for p in column.payloads([2, 0])]
        [b'cde', b'ab']
        """
        rows_at = np.asarray(rows, dtype=np.int64)
        starts, ends = self._offsets[rows_at].tolist(), self._offsets[rows_at + 1].tolist()
        data = self._data
        return [data[start:end] for start, end in zip(starts, ends, strict=True)]

    def sizes(self, rows: list[int]) -> np.ndarray:
        """The payload sizes of ``rows`` (which must hold data)."""
        rows_at = np.asarray(rows, dtype=np.int64)
        return self._offsets[rows_at + 1] - self._offsets[rows_at]

    def samples(self, rows: list[int], min_size: int) -> list[bytes | None]:
        """A sample of each payload of ``rows`` holding ``min_size`` bytes or more (None for the
        others): its size and 16 bytes spread evenly over it, gathered for all rows at once.
        Byte-identical payloads have equal samples, so only those need comparing.

        >>> column = LogicalColumn(pa.array([b"abc" * 8, b"abc" * 8, b"x"]), "b")
        >>> one, two, small = column.samples([0, 1, 2], min_size=8)
        >>> one == two, small
        (True, None)
        """
        sizes = self.sizes(rows)
        big = np.flatnonzero(sizes >= max(min_size, 1))
        samples: list[bytes | None] = [None] * len(rows)
        if not len(big):
            return samples
        starts = self._offsets[np.asarray(rows, dtype=np.int64)[big]]
        spread = (sizes[big, None] - 1) * np.arange(_SAMPLED_BYTES) // (_SAMPLED_BYTES - 1)
        picked = np.frombuffer(self._data, dtype=np.uint8)[starts[:, None] + spread]
        keys = np.ascontiguousarray(np.hstack([sizes[big, None].view(np.uint8), picked]))
        for i, key in zip(big.tolist(), keys.view(f"V{keys.shape[1]}")[:, 0].tolist(), strict=True):
            samples[i] = key
        return samples

    def data_rows(self) -> list[int]:
        """The rows that hold bytes (not null, not a URI)."""
        if self.has_data is None:
            return []
        return np.flatnonzero(self.valid & self.has_data).tolist()

    def is_managed(self, row: int) -> bool:
        """Whether ``row`` hands its external object to the table (its ``managed`` field)."""
        return bool(self.managed is not None and self.managed[row])

    def _check_rows(self) -> None:
        given = (self.uri, self.position, self.size, self.ref_id, self.managed)
        if all(values is None for values in given):
            return  # plain bytes: every valid row holds data, nothing else to check
        for row in range(self.length):
            if not self.valid[row]:
                continue
            has_data = self.has_data is not None and bool(self.has_data[row])
            problem = _value_problem(
                b"" if has_data else None,
                self.uri[row] if self.uri is not None else None,
                self.position[row] if self.position is not None else None,
                self.size[row] if self.size is not None else None,
                self.ref_id[row] if self.ref_id is not None else None,
                self.is_managed(row),
            )
            if problem:
                raise InvalidInputError(
                    f"blob column {self.column!r}, row {self.first_row + row}: {problem}"
                )


def _value_problem(
    data: object,
    uri: str | None,
    position: int | None,
    size: int | None,
    ref_id: int | None,
    managed: object = False,
) -> str | None:
    """What is wrong with one logical blob value, or None."""
    if not isinstance(managed, bool):
        return f"has managed={managed!r}; managed is True or False"
    if managed and uri is None:
        return (
            "sets managed without a uri; only an external object (a uri) can be handed to the "
            "table, bytes are stored by it anyway"
        )
    if data is not None and uri is not None:
        return "sets both data and uri; a blob is either bytes or a reference"
    if data is None and uri is None:
        return "sets neither data nor uri (use a null value for a missing blob)"
    if uri == "":
        return "has an empty uri"
    if (position is None) != (size is None):
        return "must set both position and size, or neither"
    if position is not None and uri is None:
        return "sets position/size without a uri (a range needs an external uri)"
    if position is not None and (position < 0 or size < 0):
        return f"has a negative range (position={position}, size={size})"
    if size == 0:
        return "has an external range of size 0"
    if ref_id is not None and (not isinstance(ref_id, int) or ref_id < 0):
        return f"has ref_id {ref_id!r}; a ref_id is a non-negative integer (0 = no sharing)"
    return None


def _is_binary(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_binary_view(dtype)
    )


def _is_string(dtype: pa.DataType) -> bool:
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype)


def _is_list(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_fixed_size_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    )


def validity(array: pa.Array) -> np.ndarray:
    """Which rows of ``array`` are not null, as a numpy bool array."""
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return array.is_valid().to_numpy(zero_copy_only=False)


def numbers(array: pa.Array) -> np.ndarray:
    """An integer array as numpy, 0 where null (no copy when there is no null).

    >>> numbers(pa.array([3, None, 5], pa.uint8())).tolist()
    [3, 0, 5]
    """
    if array.null_count:
        array = array.fill_null(0)
    return array.to_numpy(zero_copy_only=False)


def _pylist(array: pa.Array | None) -> list | None:
    return None if array is None else array.to_pylist()


def _int_list(array: pa.Array | None, column: str, name: str) -> list[int | None] | None:
    return _checked_list(array, column, name, pa.types.is_integer, "an integer")


def _bool_list(array: pa.Array | None, column: str) -> list[bool | None] | None:
    return _checked_list(array, column, "managed", pa.types.is_boolean, "a boolean")


def _checked_list(
    array: pa.Array | None, column: str, name: str, is_kind: Callable, kind: str
) -> list | None:
    """The values of struct child ``name``, refused (naming the column) if not of ``kind``."""
    if array is None:
        return None
    if not is_kind(array.type):
        raise InvalidInputError(f"blob column {column!r}: {name} must be {kind}, got {array.type}")
    return array.to_pylist()


_SAMPLED_BYTES = 16  # bytes of each payload in :meth:`LogicalColumn.samples`


def _binary_buffers(array: pa.Array | None) -> tuple[np.ndarray, memoryview]:
    """Offsets and data of a binary-like array, so rows can be viewed without copies."""
    if array is None:
        return np.zeros(1, dtype=np.int64), memoryview(b"")
    if not _is_binary(array.type):
        raise InvalidInputError(f"blob data must be binary, got {array.type}")
    if pa.types.is_binary_view(array.type):
        array = array.cast(pa.large_binary())
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    return offsets, memoryview(data_buf).cast("B") if data_buf is not None else memoryview(b"")
