"""Schema changes: add, alter and drop columns of a blob table with Lance's own schema evolution.

Each change is checked against the latest version of the table's branch before Lance runs it,
so bad input (an unknown column, an expression that does not parse, a cast of a blob column)
raises a :class:`~blobhouse.errors.SchemaError` naming the column and leaves the table as it
was: no version, no file. Columns are identified by Lance field id, so a renamed blob column
keeps its recorded hashes, placement settings and sharing (see :mod:`blobhouse.files.checksums`).

What each change costs (pylance 14.0.2, measured):

- ``add_columns`` with SQL expressions reads the columns the expressions name and writes one
  new data file per fragment holding the new columns; blob bytes are never read or copied.
- ``add_columns`` with fields (all-null columns, blob columns among them), renames and
  nullability changes write a new manifest only.
- a cast rewrites the cast column into a new data file per fragment; its old values stay in
  the old data files (which hold other columns) until compaction rewrites those fragments.
- ``drop_columns`` writes a new manifest; data files all of whose columns are dropped leave
  it, and ``gc`` removes them, the dropped blob columns' sidecars and the store packs only
  they referenced once no retained version uses them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.blob import blob_field as lance_blob_field

from blobhouse.columns import check_column_names, check_new_name, lance_path
from blobhouse.commit.change import ManifestUpdate, commit_once, run_change
from blobhouse.errors import (
    InvalidInputError,
    SchemaError,
    lance_io,
    lance_message,
)
from blobhouse.files.references import field_id
from blobhouse.io.objects import StorageOptions
from blobhouse.layout import TableLocation
from blobhouse.options import CommitOptions
from blobhouse.placement import AllowedBases, placement_metadata
from blobhouse.properties import TableProperties, field_ids
from blobhouse.settings import check_names
from blobhouse.snapshot import TableSnapshot
from blobhouse.values import (
    ColumnPath,
    find_blob_columns,
    is_lance_blob_field,
    is_logical_blob_type,
    path_name,
    stored_blob_columns,
)

NewColumns = Mapping[str, str] | pa.Field | pa.Schema | Sequence[pa.Field]
ALTER_KEYS = ("path", "name", "nullable", "data_type")
# what a user might pass to change where a blob column's payloads go: fixed once written
_PLACEMENT_KEYS = frozenset(
    ("metadata", "inline_size_threshold", "dedicated_size_threshold", "pack_file_size_threshold")
)
# Lance's error texts for bad input (anything else, an I/O error say, is raised as it is)
_LANCE_INPUT_ERRORS = ("Invalid user input", "LanceError(Arrow)", "LanceError(Schema)")


def latest(location: TableLocation, storage_options: StorageOptions | None = None) -> LanceDataset:
    """The latest version of the table's branch, as a dataset object of its own (Lance moves
    the object it changes to the new version: a caller's dataset is never touched)."""
    with lance_io(location.root, "change the schema of"):
        dataset = lance.dataset(location.dataset_path, storage_options=storage_options)
    # a name holding NUL (another tool's rename): Lance cannot export the schema, say so
    TableSnapshot(dataset, location, storage_options).schema  # noqa: B018
    return dataset


def add_columns(
    location: TableLocation,
    columns: NewColumns,
    storage_options: StorageOptions | None = None,
) -> LanceDataset:
    """Add columns to the latest version: ``{name: SQL expression}`` computed from the
    existing non-blob columns, or nullable fields added all null (blob fields too, filled
    later by ``backfill_blob_column``). Returns the dataset at the new version.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_field, write_table
    >>> t = write_table(pa.table({"id": [1, 2]}), tempfile.mkdtemp() + "/t")
    >>> add_columns(t.location, {"double": "id * 2"}).to_table().column("double").to_pylist()
    [2, 4]
    >>> add_columns(t.location, blob_field("img")).schema.names
    ['id', 'double', 'img']
    """
    dataset = latest(location, storage_options)
    if isinstance(columns, Mapping):
        _check_expressions(dataset, columns)
        names, transforms = list(columns), dict(columns)
    else:
        transforms = _new_fields(dataset.schema, columns)
        names = [f.name for f in transforms]
    return _run(
        dataset,
        lambda d: d.add_columns(transforms),
        f"adding column(s) {names}",
        location,
        storage_options,
    )


def alter_columns(
    location: TableLocation,
    alterations: Sequence[Mapping[str, Any]],
    storage_options: StorageOptions | None = None,
) -> LanceDataset:
    """Rename columns, change their nullability, cast non-blob columns (Lance's
    ``alter_columns``: ``{"path", "name", "nullable", "data_type"}`` each), on the latest
    version. Returns the dataset at the new version.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"id": [1], "img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t")
    >>> alter_columns(t.location, [{"path": "img", "name": "photo"}]).schema.names
    ['id', 'photo']
    """
    dataset = latest(location, storage_options)
    if not alterations:
        raise InvalidInputError("alter_columns needs at least one alteration")
    checked = _check_alterations(dataset.schema, alterations)
    paths = [a["path"] for a in checked]
    # quoted for Lance's path parser: a name another tool gave a backtick can be renamed
    quoted = [{**a, "path": lance_path(tuple(a["path"].split(".")))} for a in checked]
    return _run(
        dataset,
        lambda d: d.alter_columns(*quoted),
        f"altering column(s) {paths}",
        location,
        storage_options,
    )


def drop_columns(
    location: TableLocation,
    columns: str | Iterable[str],
    storage_options: StorageOptions | None = None,
) -> LanceDataset:
    """Drop columns (``"parent.child"`` inside structs) from the latest version, blob columns
    too. Returns the dataset at the new version.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"id": [1], "img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t")
    >>> drop_columns(t.location, ["img"]).schema.names
    ['id']
    """
    dataset = latest(location, storage_options)
    names = [columns] if isinstance(columns, str) else list(columns)
    if not names or not all(isinstance(n, str) for n in names):
        raise InvalidInputError(f"drop_columns needs column names, got {columns!r}")
    schema = dataset.schema
    for name in names:
        _resolve(schema, name)
    if {n for n in names if "." not in n} >= set(schema.names):
        raise SchemaError(
            f"dropping {names} would drop every column of the table; a table keeps at least one"
        )
    for blob, own in TableProperties.of(dataset).columns.items():
        if own.ref_id_column in names and blob not in names:
            raise SchemaError(
                f"column {own.ref_id_column!r} holds the ref_ids of blob column {blob!r}: change "
                f"that first (set_properties(ref_id_columns={{{blob!r}: None}}) or another "
                "column), or drop both"
            )
    return _run(
        dataset,
        lambda d: d.drop_columns(names),
        f"dropping column(s) {names}",
        location,
        storage_options,
    )


#: how a property change commits: more retries than :class:`CommitOptions`' 3, because it is
#: a manifest-only change (cheap to plan again) that is run beside busy writers (the mode
#: changed while others append), whose every commit preempts it
PROPERTY_COMMIT = CommitOptions(retries=8)


def set_properties(
    location: TableLocation,
    changes: Mapping[str, Any],
    storage_options: StorageOptions | None = None,
    commit: CommitOptions = PROPERTY_COMMIT,
) -> LanceDataset:
    """Change the table's properties (:meth:`TableProperties.changed` names them) in one commit
    on the latest version (a new manifest only: nothing is rewritten; later writes follow the
    new settings, ``compact`` brings earlier rows under a new dedup mode). Bases can be added,
    never removed (rows may reference them). Returns the dataset at the new version.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"id": [1], "img": blob_array([b"x"])}), tempfile.mkdtemp() + "/t")
    >>> TableProperties.of(set_properties(t.location, {"dedup": "content"})).dedup
    'content'
    """
    if not changes:
        raise InvalidInputError("set_properties needs at least one property to change")
    change = ManifestUpdate("properties", _PropertyChange(dict(changes)).update)
    snapshot = TableSnapshot(latest(location, storage_options), location, storage_options)
    return run_change(change, snapshot, retries=commit.retries).snapshot.dataset


@dataclass(frozen=True)
class _PropertyChange:
    """New properties recorded in the manifest (schema and field metadata), read and checked
    anew on the version each attempt plans on."""

    changes: dict[str, Any]

    def update(self, snapshot: TableSnapshot) -> LanceOperation.UpdateConfig | None:
        dataset = snapshot.dataset
        before = TableProperties.of(dataset)
        after = before.changed(**self.changes)
        if after == before:  # nothing to change: no new version
            return None
        _check_property_change(dataset.schema, before, after, snapshot.location)
        return _update_config(before, after, field_ids(dataset.lance_schema.fields()))


def _update_config(
    before: TableProperties, after: TableProperties, ids: Mapping[str, int]
) -> LanceOperation.UpdateConfig:
    """The manifest update that records ``after`` (``before``: what it records now)."""
    return LanceOperation.UpdateConfig(
        schema_metadata_updates=LanceOperation.UpdateMap(
            {k.decode(): v.decode() for k, v in after.schema_metadata().items()}
        ),
        field_metadata_updates={
            ids[column]: LanceOperation.UpdateMap(
                {
                    k.decode(): None if v is None else v.decode()
                    for k, v in after.field_metadata(column, ids).items()
                }
            )
            for column in after.columns
        },
    )


def _check_property_change(
    schema: pa.Schema, before: TableProperties, after: TableProperties, location: TableLocation
) -> None:
    for column, own in after.columns.items():
        ref = own.ref_id_column
        if ref is not None and (ref not in schema.names or not _is_integer(schema, ref)):
            raise SchemaError(
                f"ref_id column {ref!r} of {column!r} must be an integer column of the table "
                f"(columns: {schema.names})"
            )
    after.bases(location.root_uri)  # checked: URIs, none inside the table
    for name in ("allowed_bases", "managed_bases"):
        old = set(AllowedBases(getattr(before, name)).bases)
        removed = sorted(old - set(AllowedBases(getattr(after, name)).bases))
        if removed:
            raise InvalidInputError(
                f"{name} can be added to, not removed from: rows may reference {removed} "
                "(write the table anew with mode='overwrite' to drop a base)"
            )


def _is_integer(schema: pa.Schema, name: str) -> bool:
    return pa.types.is_integer(schema.field(name).type)


def add_null_blob_column(
    location: TableLocation,
    column: str,
    read_version: int,
    storage_options: StorageOptions | None = None,
    metadata: Mapping[bytes, bytes] | None = None,
) -> tuple[LanceDataset, int]:
    """Add blob ``column``, all null, on ``read_version`` (a new manifest only); the dataset at
    the new version and the column's field id. How a backfill adds a column when Lance keeps
    a dropped column's field id reserved and so cannot add it with its data in one commit."""
    dataset = lance.dataset(
        location.dataset_path, version=read_version, storage_options=storage_options
    )
    _check_new_name(dataset.schema, column, "backfill")
    dataset = _run(
        dataset,
        lambda d: d.add_columns(lance_blob_field(column).with_metadata(metadata or None)),
        f"adding blob column {column!r}",
        location,
        storage_options,
    )
    return dataset, field_id(dataset, (column,))


def _run(
    dataset: LanceDataset,
    change: Callable[[LanceDataset], None],
    what: str,
    location: TableLocation,
    storage_options: StorageOptions | None = None,
) -> LanceDataset:
    """Run one Lance schema change under a lease (the data files Lance writes for it are
    named by Lance: gc keeps them by their age while the lease lives); Lance's bad-input
    errors as a :class:`SchemaError` that says what was being done (Lance names the column)."""
    snapshot = TableSnapshot(dataset, location, storage_options)
    try:
        return commit_once(snapshot, "schema", change).dataset
    except BaseException as exc:
        if not isinstance(exc, OSError | ValueError):
            raise
        if isinstance(exc, OSError) and not str(exc).startswith(_LANCE_INPUT_ERRORS):
            raise
        raise SchemaError(f"{what}: {lance_message(exc)}") from None


def _check_new_name(schema: pa.Schema, name: object, what: str = "add_columns") -> None:
    """A new top-level column's name: one the column-name rule allows, not taken yet."""
    check_new_name(name, what)
    if name in schema.names:
        raise SchemaError(f"column {name!r} already exists (columns: {schema.names})")


def _check_expressions(dataset: LanceDataset, columns: Mapping[str, str]) -> None:
    """Each ``{name: SQL}`` is a new name and an expression Lance can plan over the
    table's non-blob columns."""
    if not columns:
        raise InvalidInputError("add_columns needs at least one column")
    blobs = {p[0] for p in stored_blob_columns(dataset.schema)}
    for name, expression in columns.items():
        _check_new_name(dataset.schema, name)
        if not isinstance(expression, str):
            raise InvalidInputError(
                f"column {name!r}: an SQL expression (a string) is needed, got "
                f"{type(expression).__name__} (pass a pyarrow field to add an all-null column)"
            )
        read = sorted(blobs & _identifiers(expression))
        if read:
            raise SchemaError(
                f"the expression for column {name!r} reads blob column(s) {read}: Lance's "
                "add_columns cannot read blob columns (use backfill_blob_column to compute a "
                "blob column, or compute the value from the bytes yourself)"
            )
        try:  # planning the projection parses the expression and resolves its columns
            dataset.scanner(columns={name: expression}, with_row_id=True, limit=0)
        except (ValueError, OSError) as exc:
            raise SchemaError(
                f"the expression for column {name!r} ({expression!r}) is not valid: "
                f"{lance_message(exc)}"
            ) from None


def _identifiers(expression: str) -> set[str]:
    """Column names an SQL expression may read: its identifiers outside string literals
    (unquoted ones lowercased, as DataFusion reads them), quoted ones as written."""
    without_strings = re.sub(r"'(?:[^']|'')*'", " ", expression)
    quoted = set(re.findall(r'"((?:[^"]|"")*)"|`([^`]*)`', without_strings))
    found = {q for pair in quoted for q in pair if q}
    bare = re.sub(r'"(?:[^"]|"")*"|`[^`]*`', " ", without_strings)
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", bare)
    return found | set(words) | {w.lower() for w in words}


def _new_fields(schema: pa.Schema, columns: pa.Field | pa.Schema | Sequence[pa.Field]) -> list:
    """The fields Lance adds, all null: blob fields as Lance blob fields with their
    placement settings."""
    if isinstance(columns, pa.Field):
        columns = [columns]
    fields = list(columns)
    if not fields or not all(isinstance(f, pa.Field) for f in fields):
        raise InvalidInputError(
            "add_columns takes {name: SQL expression}, a pyarrow field, a list of fields or a "
            f"schema; got {columns!r}"
        )
    out = []
    for field in fields:
        _check_new_name(schema, field.name)
        check_column_names(pa.schema([field]), "add_columns")  # its struct children too
        if not field.nullable:
            raise SchemaError(
                f"new column {field.name!r} is added all null, so it must be nullable (make "
                "it non-nullable with alter_columns once it is filled)"
            )
        out.append(_as_stored(field))
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise SchemaError(f"add_columns names a column twice: {names}")
    return out


def _as_stored(field: pa.Field) -> pa.Field:
    """``field`` as the table stores it: a blob field as Lance's blob field (its placement
    settings kept), other fields as they are."""
    paths = find_blob_columns(pa.schema([field]))
    if not paths:
        return field
    if paths != [(field.name,)]:
        raise SchemaError(
            f"new column {field.name!r} holds blob column(s) {[path_name(p) for p in paths]} "
            "inside a struct; add blob columns at top level"
        )
    if is_lance_blob_field(field) and not is_logical_blob_type(field.type):
        return field
    placement = placement_metadata(field.metadata)
    blob = lance_blob_field(field.name)
    return blob.with_metadata(placement) if placement else blob


def _check_alterations(
    schema: pa.Schema, alterations: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each alteration names an existing column, keys Lance knows, and changes a blob column
    only by name and nullability."""
    checked = []
    for alteration in alterations:
        if not isinstance(alteration, Mapping) or not isinstance(alteration.get("path"), str):
            raise InvalidInputError(
                'each alteration is a dict with a "path" (the column) and "name", "nullable" '
                f'or "data_type"; got {alteration!r}'
            )
        path = alteration["path"]
        field, blob = _resolve(schema, path)
        placement = sorted(set(alteration) & _PLACEMENT_KEYS)
        if blob and placement:
            raise SchemaError(
                f"blob column {path!r}: its placement settings ({placement}) are kept with the "
                "data already written and cannot be altered"
            )
        check_names(alteration, ALTER_KEYS, "alteration key")
        if len(alteration) == 1:
            raise InvalidInputError(
                f"alteration of {path!r} changes nothing: give name, nullable or data_type"
            )
        _check_alteration(path, field, blob, alteration)
        checked.append(dict(alteration))
    _check_renames(schema, checked)
    return checked


def _check_renames(schema: pa.Schema, alterations: list[dict[str, Any]]) -> None:
    """New names are valid and unique among their siblings once every rename is applied
    (Lance resolves every path in the schema before the change, and checks the names after)."""
    renamed: dict[str, dict[str, str]] = {}
    for alteration in alterations:
        if "name" in alteration:
            parent, _, name = alteration["path"].rpartition(".")
            new = alteration["name"]
            # blobhouse names nested columns parent.child: a rename never puts a dot in a
            # name, so every new name follows the top-level rule
            check_new_name(new, f"renaming {alteration['path']!r}")
            renamed.setdefault(parent, {})[name] = new
    for parent, names in renamed.items():
        final = [names.get(n, n) for n in _siblings(schema, parent)]
        twice = sorted({n for n in final if final.count(n) > 1})
        if twice:
            where = f" of {parent!r}" if parent else ""
            raise SchemaError(
                f"renaming {sorted(names)} would give two columns{where} the name(s) {twice}"
            )


def _check_alteration(
    path: str, field: pa.Field, blob: bool, alteration: Mapping[str, Any]
) -> None:
    if "nullable" in alteration and not isinstance(alteration["nullable"], bool):
        raise InvalidInputError(f"column {path!r}: nullable must be True or False")
    if "data_type" in alteration:
        data_type = alteration["data_type"]
        if not isinstance(data_type, pa.DataType):
            raise InvalidInputError(f"column {path!r}: data_type must be a pyarrow DataType")
        if blob or _holds_blobs(field):
            raise SchemaError(
                f"column {path!r} is or holds a blob column: a cast would change how its "
                "payloads are stored, so blob columns are never cast (rename them, or add "
                "a new column and backfill it)"
            )


def _resolve(schema: pa.Schema, path: str) -> tuple[pa.Field, bool]:
    """The field at dotted ``path`` and whether it is a blob column; an error naming the
    path if there is none, or if it lies inside a blob column (Lance would let a rename or
    drop break the blob column's layout: measured, the schema no longer loads)."""
    blobs = set(stored_blob_columns(schema))
    parts: ColumnPath = tuple(path.split("."))
    fields: Iterable[pa.Field] = schema
    field = None
    for depth, name in enumerate(parts):
        if field is not None and parts[:depth] in blobs:
            raise SchemaError(
                f"{path!r} is inside blob column {path_name(parts[:depth])!r}: the parts of "
                "a blob column are not columns of their own"
            )
        field = next((f for f in fields if f.name == name), None)
        if field is None:
            raise SchemaError(f"no column {path!r} in the table (columns: {schema.names})")
        fields = field.type if pa.types.is_struct(field.type) else ()
    return field, parts in blobs


def _siblings(schema: pa.Schema, parent: str) -> list[str]:
    """The names of the columns inside ``parent`` (``""``: the top-level columns)."""
    if not parent:
        return schema.names
    field, _ = _resolve(schema, parent)
    return [f.name for f in field.type]


def _holds_blobs(field: pa.Field) -> bool:
    return bool(stored_blob_columns(pa.schema([field])))
