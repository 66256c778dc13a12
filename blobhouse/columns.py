"""Column names: the one rule every API that takes a column name follows.

A column is named by its top-level name, or by ``parent.child`` (``a.b.c`` deeper) for a
field inside a struct: a blob column inside a struct (``meta.image``) or any other nested field
(``meta.label``). A blob column is a leaf: the fields of its stored descriptor are not columns.
Fields inside lists and maps have no name of their own. A name that does not resolve is an
:class:`~blobhouse.errors.InvalidInputError` naming the closest valid name.

Lance refuses a top-level name holding a dot; a struct child may hold one (``s`` with child
``a.b``): ``s.a.b`` names it, quoted as Lance wants (:func:`lance_name`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import pyarrow as pa

from blobhouse.errors import InvalidInputError
from blobhouse.settings import closest
from blobhouse.values import ColumnPath, is_lance_blob_field, is_logical_blob_type, path_name


def column_paths(schema: pa.Schema) -> dict[str, ColumnPath]:
    """Every name a column of ``schema`` answers to -> its path, in schema order (a struct
    before its children: the order of a data file's columns).

    >>> meta = pa.struct([("image", pa.binary()), ("label", pa.string())])
    >>> list(column_paths(pa.schema([("id", pa.int64()), ("meta", meta)])))
    ['id', 'meta', 'meta.image', 'meta.label']
    """
    paths: dict[str, ColumnPath] = {}

    def walk(field: pa.Field, path: ColumnPath) -> None:
        paths.setdefault(path_name(path), path)
        dtype = field.type
        if is_lance_blob_field(field) or is_logical_blob_type(dtype):
            return  # a blob column is one value: its descriptor's fields are not columns
        if isinstance(dtype, pa.ExtensionType):
            dtype = dtype.storage_type
        if pa.types.is_struct(dtype):
            for child in dtype:
                walk(child, (*path, child.name))

    for field in schema:
        walk(field, (field.name,))
    return paths


def resolve_column(
    schema: pa.Schema,
    name: object,
    what: str = "column",
    error: type[InvalidInputError] = InvalidInputError,
) -> ColumnPath:
    """The path of the column ``name`` (``"id"``, ``"meta.image"``) of ``schema``; an
    unknown name raises :class:`InvalidInputError` naming the closest valid one.

    >>> meta = pa.struct([("image", pa.binary()), ("label", pa.string())])
    >>> schema = pa.schema([("id", pa.int64()), ("meta", meta)])
    >>> resolve_column(schema, "meta.label")
    ('meta', 'label')
    >>> resolve_column(schema, "meta.lable")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: unknown column 'meta.lable' (did you mean 'meta.label'?)...
    """
    paths = column_paths(schema)
    if not isinstance(name, str) or name not in paths:
        raise unknown_column(name, list(paths), what, error)
    return paths[name]


def resolve_columns(
    schema: pa.Schema, names: Iterable[object], what: str = "column"
) -> list[ColumnPath]:
    """:func:`resolve_column` of each of ``names``, in their order.

    >>> resolve_columns(pa.schema([("id", pa.int64())]), ["id"])
    [('id',)]
    """
    paths = column_paths(schema)
    resolved = []
    for name in names:
        if not isinstance(name, str) or name not in paths:
            raise unknown_column(name, list(paths), what)
        resolved.append(paths[name])
    return resolved


def check_blob_column(
    name: object,
    blob_columns: Sequence[str],
    what: str,
    error: type[InvalidInputError] = InvalidInputError,
) -> str:
    """``name`` if it is one of ``blob_columns`` (``parent.child`` names, as
    ``Table.blob_columns`` lists them); else an :class:`InvalidInputError` that says ``what``
    named it and which blob column is closest.

    >>> check_blob_column("meta.image", ["meta.image"], "dedup")
    'meta.image'
    >>> check_blob_column("meta.imag", ["meta.image"], "dedup")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: dedup names 'meta.imag', which is not a blob column ...
    """
    if isinstance(name, str) and name in blob_columns:
        return name
    hint = closest(str(name), blob_columns)
    near = f" (did you mean {hint!r}?)" if hint else ""
    raise error(
        f"{what} names {name!r}, which is not a blob column of the table{near}; blob columns: "
        f"{', '.join(blob_columns) or 'none'}"
    )


def unknown_column(
    name: object,
    valid: Sequence[str],
    what: str = "column",
    error: type[InvalidInputError] = InvalidInputError,
) -> InvalidInputError:
    """The error for a column ``name`` that is none of ``valid``, naming the closest.

    >>> str(unknown_column("lable", ["id", "label"]))
    "unknown column 'lable' (did you mean 'label'?); columns: id, label"
    """
    hint = closest(str(name), valid)
    near = f" (did you mean {hint!r}?)" if hint else ""
    return error(f"unknown {what} {name!r}{near}; columns: {', '.join(valid)}")


def lance_name(path: ColumnPath) -> str:
    """The name Lance's ``columns=`` takes for ``path``: parts joined by dots, a part that is
    not a plain identifier in backquotes (so a dot inside a child's name is not a separator).

    >>> lance_name(("meta", "image")), lance_name(("s", "a.b"))
    ('meta.image', 's.`a.b`')
    """
    if len(path) == 1:
        return path[0]  # top-level names are looked up as they are (Lance refuses dots in them)
    return ".".join(p if _PLAIN.fullmatch(p) else f"`{p}`" for p in path)


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
