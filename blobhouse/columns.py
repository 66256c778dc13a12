"""Column names: the one rule every API that takes a column name follows.

A column is named by its top-level name, or by ``parent.child`` (``a.b.c`` deeper) for a
field inside a struct: a blob column inside a struct (``meta.image``) or any other nested field
(``meta.label``). A blob column is a leaf: the fields of its stored descriptor are not columns.
Fields inside lists and maps have no name of their own. A name that does not resolve is an
:class:`~blobhouse.errors.InvalidInputError` naming the closest valid name.

A column's own name follows one rule (:func:`name_problem`, checked by
:func:`check_column_names` at every door that names columns: writes, Spark, SQL, ingest,
add-column, backfill, rename): not empty, no NUL (Lance cuts a name there), no backtick (Lance
quotes column paths in backticks),
no dot at top level (a struct child may hold one: ``s`` with child ``a.b`` is ``s.a.b``, quoted
as Lance wants by :func:`lance_name`), at top level none of Lance's row columns (``_rowid``,
...) and nothing starting with ``__bh_`` (blobhouse's working columns), and no name given to
two columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from blobhouse.errors import ColumnNameError, InvalidInputError, closest
from blobhouse.values import ColumnPath, is_lance_blob_field, is_logical_blob_type, path_name

#: Lance's row columns: a scan adds them when asked (``with_row_id``, ...), so a top-level column
#: of one of these names makes every scan of the table fail (pylance 14.0.2: a panic, or a
#: "merge incompatible fields" error); a struct child of such a name is read as it should be
LANCE_ROW_COLUMNS = (
    "_rowid",
    "_rowaddr",
    "_rowoffset",
    "_row_last_updated_at_version",
    "_row_created_at_version",
)
#: the prefix of the working columns blobhouse adds to rows while it merges, updates and runs
#: Spark jobs (``__bh_source_row``, ``__bh_match``, ...): a user's column of such a name would
#: be taken for one of them
RESERVED_PREFIX = "__bh_"


def name_problem(name: object, *, top_level: bool = True, reserved: bool = True) -> str | None:
    """Why a column cannot be named ``name`` (``top_level``: a column of its own, not a struct
    child; ``reserved``: blobhouse's own names count too), as the rule that refuses it, or
    None when it can.

    >>> name_problem("image"), name_problem("a.b", top_level=False)
    (None, None)
    >>> name_problem("_rowid")  # doctest: +ELLIPSIS
    "is one of Lance's row columns (_rowid, _rowaddr, ...), ... every read of the table fail"
    """
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty: Lance cannot address a column without a name"
    if "\x00" in name:
        return (
            "must be without the NUL character: Lance keeps a name up to its first NUL only "
            f"({name.split(chr(0))[0]!r} here)"
        )
    if "`" in name:
        return (
            "must be without '`': Lance quotes column paths in backticks (s.`a.b`), so a name "
            "holding one cannot be addressed"
        )
    if not top_level:
        return None
    if "." in name:
        return (
            "must be without '.' at top level: '.' separates a struct's children (meta.image), "
            "and Lance refuses it there (a struct child may hold one)"
        )
    if name in LANCE_ROW_COLUMNS:
        return (
            f"is one of Lance's row columns ({', '.join(LANCE_ROW_COLUMNS)}), which its scans "
            "add: a top-level column of that name makes every read of the table fail"
        )
    if reserved and name.startswith(RESERVED_PREFIX):
        return (
            f"starts with {RESERVED_PREFIX!r}, which blobhouse keeps for the working columns of "
            "its merges, updates and Spark jobs"
        )
    return None


def check_new_name(name: object, what: str, *, top_level: bool = True) -> None:
    """Refuse ``name`` for a new column (``what``: the change that names it, for the message)
    when :func:`name_problem` does, with a :class:`~blobhouse.errors.ColumnNameError`.

    >>> check_new_name("_rowaddr", "add_columns")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.ColumnNameError: add_columns: new column name '_rowaddr' is one of Lance's ...
    """
    problem = name_problem(name, top_level=top_level)
    if problem is not None:
        raise ColumnNameError(f"{what}: new column name {name!r} {problem}")


def check_column_names(schema: pa.Schema, what: str = "the data", *, reserved: bool = True) -> None:
    """Refuse, with a :class:`~blobhouse.errors.ColumnNameError` naming the column and the rule
    (:func:`name_problem`), a name in ``schema`` (``what``: whose it is, for the message) that
    Lance cannot address or blobhouse reserves, at any depth of structs, and a name two columns
    answer to (``id`` twice; a child ``y.z`` of ``x`` beside ``x.y.z``).

    >>> check_column_names(pa.schema([("id", pa.int64()), ("img", pa.binary())]))
    >>> twice = pa.schema([("id", pa.int64()), ("id", pa.int64())])
    >>> check_column_names(twice)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.ColumnNameError: the data: 'id' names two columns; each column needs a name ...
    """
    seen: set[str] = set()
    for field, path in _columns(schema):
        problem = name_problem(field.name, top_level=len(path) == 1, reserved=reserved)
        shown = path_name(path)
        if problem is not None:
            where = f" (in struct {path_name(path[:-1])!r})" if len(path) > 1 else ""
            raise ColumnNameError(f"{what}: column name {field.name!r}{where} {problem}")
        if shown in seen:  # a child 'y.z' of x is named x.y.z, as child z of x.y is
            raise ColumnNameError(
                f"{what}: {shown!r} names two columns; each column needs a name of its own"
            )
        seen.add(shown)


def column_paths(schema: pa.Schema) -> dict[str, ColumnPath]:
    """Every name a column of ``schema`` answers to -> its path, in schema order (a struct
    before its children: the order of a data file's columns).

    >>> meta = pa.struct([("image", pa.binary()), ("label", pa.string())])
    >>> list(column_paths(pa.schema([("id", pa.int64()), ("meta", meta)])))
    ['id', 'meta', 'meta.image', 'meta.label']
    """
    paths: dict[str, ColumnPath] = {}
    for _, path in _columns(schema):
        paths.setdefault(path_name(path), path)
    return paths


def _columns(schema: pa.Schema) -> Iterator[tuple[pa.Field, ColumnPath]]:
    """Every column of ``schema`` (field and path), a struct before its children; a blob
    column is one value: its descriptor's fields are not columns."""

    def walk(field: pa.Field, path: ColumnPath) -> Iterator[tuple[pa.Field, ColumnPath]]:
        yield field, path
        dtype = field.type
        if is_lance_blob_field(field) or is_logical_blob_type(dtype):
            return
        if isinstance(dtype, pa.ExtensionType):
            dtype = dtype.storage_type
        if pa.types.is_struct(dtype):
            for child in dtype:
                yield from walk(child, (*path, child.name))

    for field in schema:
        yield from walk(field, (field.name,))


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
    return lance_path(path)


def lance_path(path: ColumnPath) -> str:
    """``path`` as Lance's schema changes parse a column path (``alter_columns``,
    ``drop_columns``): a part that is not a plain identifier in backquotes, a backquote in it
    doubled, at every depth (what lets a rename reach a column another tool named with one).

    >>> lance_path(("a`b",)), lance_path(("meta", "image"))
    ('`a``b`', 'meta.image')
    """
    return ".".join(p if _PLAIN.fullmatch(p) else "`" + p.replace("`", "``") + "`" for p in path)


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
