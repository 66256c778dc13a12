"""Table properties: the write settings a table keeps in its own Lance manifest, so that every
writer -- ``write_table``, ``df.write``, SQL INSERT, ``merge_insert``, ``update``, backfill,
ingest, compaction -- in every process and on every executor stores data the same way, without
the user repeating a keyword (Iceberg's ``write.*``, Delta's ``delta.*`` properties).

Where they live (both are part of the manifest, so they change with a commit and travel with
versions, branches and copies):

- table-wide settings in the schema metadata key ``blobhouse`` (JSON, ``"format": 2``): the
  dedup mode of blob columns that have none of their own, the allowed and managed bases of
  external blobs, and the data file size limits;
- a blob column's own settings in its field's metadata, which Lance keys by field id (they
  follow a rename and go with a drop): ``blobhouse:dedup``, ``blobhouse:ref-id-field`` (the
  field id of the integer column holding the column's ref_ids) and Lance's own placement keys
  (``lance-encoding:blob-inline-size-threshold``, ...), which stock Lance writers honour too.

A write to an existing table that leaves a setting out uses the table's; one that gives the
same value is fine; one that gives another value is refused with
:class:`~blobhouse.errors.PropertyConflictError` naming the setting and both values. A create
or an overwrite sets them (an overwrite keeps what it does not give). Tables written before
properties existed (``"format": 1`` or no key) keep their old behaviour: a writer's own options,
or per-file ``"content"`` dedup by default. :meth:`TableProperties.changed` validates a change
(``Table.set_properties``).

>>> props = TableProperties(columns={"video": ColumnProperties(dedup="ref_id")})
>>> props.dedup, props.dedup_of("video"), props.dedup_of("thumb")
('global', 'ref_id', 'global')
>>> props.resolve(WriteOptions(dedup="content"), columns=["video"])
Traceback (most recent call last):
...
blobhouse.errors.PropertyConflictError: dedup of column 'video': the table's is 'ref_id', this \
write asked for 'content' (leave the option out to use the table's, or change the property \
with Table.set_properties)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from blobhouse.columns import check_blob_column, column_paths
from blobhouse.errors import (
    InvalidInputError,
    InvalidSettingError,
    PropertyConflictError,
    TableMetadataError,
)
from blobhouse.io.objects import uri_to_path
from blobhouse.options import DEFAULT_MAX_BYTES_PER_FILE, DEFAULT_MAX_ROWS_PER_FILE, WriteOptions
from blobhouse.placement import AllowedBases, Placement, placement_metadata
from blobhouse.settings import (
    DEDUP_MODE,
    SETTINGS,
    SETTINGS_KEY,
    THRESHOLDS,
    Count,
    check_names,
    damage_error,
    recorded_settings,
)
from blobhouse.values import get_field, path_name, replace_field, stored_blob_columns

if TYPE_CHECKING:
    from lance import LanceDataset

FORMAT = 2
#: the dedup mode of a new table's blob columns when the writer names none: each distinct
#: payload once for the whole table (docs/table-properties.md says why this one)
DEFAULT_DEDUP = "global"
#: what a writer used when a table records no dedup mode (tables of earlier blobhouse)
LEGACY_DEDUP = "content"
DEDUP_KEY = b"blobhouse:dedup"
REF_ID_FIELD_KEY = b"blobhouse:ref-id-field"
#: how a blob column's ref_id column is recorded: its Lance field id (an i32 in Lance)
_FIELD_ID = Count("ref_id_column", "the Lance field id of the ref_id column", low=0, high=2**31 - 1)
#: what ``set_properties`` and ``blobhouse properties --set`` change
SETTABLE = (
    "dedup",
    "ref_id_columns",
    "placement",
    "allowed_bases",
    "managed_bases",
    "max_rows_per_file",
    "max_bytes_per_file",
)
_HINT = "leave the option out to use the table's, or change the property with Table.set_properties"


@dataclass(frozen=True)
class ColumnProperties:
    """The settings of one blob column: its dedup mode (None: the table's), the integer column
    holding its ref_ids (None: ref_ids come in the blob values, if any) and its placement."""

    dedup: str | None = None
    ref_id_column: str | None = None
    placement: Placement = field(default_factory=Placement)
    ref_id_dropped: bool = False  # its ref_id column was dropped (by Lance's drop_columns)

    def to_dict(self, table_dedup: str) -> dict[str, Any]:
        return {
            "dedup": self.dedup or table_dedup,
            "ref_id_column": "(dropped)" if self.ref_id_dropped else self.ref_id_column,
            **{name: getattr(self.placement, name) for name in THRESHOLDS},
        }


@dataclass(frozen=True)
class TableProperties:
    """A table's write settings (see the module docstring). ``columns`` has every blob
    column, by name; ``recorded`` is False for a table written before properties existed.

    >>> TableProperties().to_dict()["dedup"]
    'global'
    """

    dedup: str = DEFAULT_DEDUP
    columns: Mapping[str, ColumnProperties] = field(default_factory=dict)
    allowed_bases: tuple[str, ...] = ()
    managed_bases: tuple[str, ...] = ()
    max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE
    max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE
    recorded: bool = True
    format: int = FORMAT  # what wrote them: a newer blobhouse may mean more than this knows
    #: the stored settings that are damaged (by name, ``dedup.<column>`` for a column's own:
    #: what is wrong); each holds its narrowest value here (no base, the default)
    damaged: Mapping[str, str] = field(default_factory=dict)
    where: str = field(default="", compare=False, repr=False)  # the table, for messages

    def __post_init__(self) -> None:
        DEDUP_MODE.check(self.dedup, "dedup of the table")
        for name, column in self.columns.items():
            if column.dedup is not None:
                DEDUP_MODE.check(column.dedup, f"dedup of column {name!r}")
        for name in ("allowed_bases", "managed_bases", "max_rows_per_file", "max_bytes_per_file"):
            object.__setattr__(self, name, SETTINGS[name].check(getattr(self, name)))

    @property
    def blob_columns(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def dedup_of(self, column: str) -> str:
        """The dedup mode blob column ``column`` is written with."""
        own = self.columns.get(column)
        return own.dedup if own is not None and own.dedup else self.dedup

    def check_writable(self) -> None:
        """Refuse to write by these properties when a newer blobhouse recorded them (they may
        say more than this version knows), or when some are damaged (naming them and the one
        command that sets them anew)."""
        self._check_known()
        if self.damaged:
            raise damage_error(self.damaged, self.where)

    def _check_known(self) -> None:
        if self.format > FORMAT:
            raise TableMetadataError(
                f"this table's properties were written by a newer blobhouse (format "
                f"{self.format}; this one knows {FORMAT}): upgrade blobhouse to write to it"
            )

    def change_mode(self, column: str, given: str | None = None) -> str:
        """The dedup mode a change (update, backfill, merge) writes blob column ``column``
        with: the table's for a column it has (``given``, if any, must be the same), else
        ``given`` or the table's mode; for a table without recorded properties, ``given`` or
        ``"content"``.

        >>> TableProperties(columns={"img": ColumnProperties()}).change_mode("new", "off")
        'off'
        """
        self.check_writable()
        if given is not None:
            DEDUP_MODE.check(given, f"dedup of column {column!r}")
        if not self.recorded:
            return given or LEGACY_DEDUP
        if column in self.columns:
            mode = self.dedup_of(column)
            if given is not None and given != mode:
                raise _conflict(f"dedup of column {column!r}", mode, given)
            return mode
        return given or self.dedup

    @classmethod
    def of(cls, dataset: LanceDataset, schema: pa.Schema | None = None) -> TableProperties:
        """The properties ``dataset``'s manifest records (``schema``: its schema, if read
        already)."""
        names = _names_by_id(dataset.lance_schema.fields())
        schema = dataset.schema if schema is None else schema
        return cls.of_schema(schema, names, uri_to_path(dataset.uri))

    @classmethod
    def of_schema(
        cls, schema: pa.Schema, names: Mapping[int, str], where: str = ""
    ) -> TableProperties:
        """The properties of a table schema (``names``: field id -> column name, which
        resolves a ref_id column recorded by field id; ``where``: the table, for messages).
        Each stored setting is checked by its schema; a damaged one is named in
        :attr:`damaged` and holds its narrowest value (no base, the default), never a wider
        reading of what is there.

        >>> import pyarrow as pa
        >>> schema = pa.schema([]).with_metadata({b"blobhouse": b'{"format": 2, "dedup": 3}'})
        >>> TableProperties.of_schema(schema, {}).damaged
        {'dedup': "dedup must be one of 'content', 'ref_id', 'global', 'off', got 3"}
        """
        recorded, damaged = recorded_settings(schema)
        while where:  # a base inside the table is damage too (its files are gc's)
            allowed, managed = (recorded.get(k, ()) for k in ("allowed_bases", "managed_bases"))
            try:
                AllowedBases(allowed, where, managed)
                break
            except InvalidSettingError as exc:
                damaged[exc.setting] = str(exc)
                if recorded.pop(exc.setting, None) is None:
                    break
        version = recorded.get("format", FORMAT if damaged else 1)
        columns = {}
        integers = _integer_columns(schema)
        for path in stored_blob_columns(schema):
            column = path_name(path)
            metadata = get_field(schema, path).metadata or {}
            columns[column] = _stored_column(column, metadata, names, integers, damaged)
        legacy = {} if version >= FORMAT else {"dedup": LEGACY_DEDUP}
        kept = {k: v for k, v in recorded.items() if k != "format"}
        return cls(
            **{**legacy, **kept},
            columns=columns,
            recorded=version >= FORMAT,
            format=version,
            damaged=damaged,
            where=where,
        )

    def resolve(self, options: WriteOptions, columns: Iterable[str] = ()) -> WriteOptions:
        """The options of a write that adds rows to this table: each one left out (None) is
        the table's; one given must equal the table's (:class:`PropertyConflictError`).
        ``columns``: the blob columns of the write. A table without recorded properties keeps
        the old rule: the writer's options, per-file content dedup by default."""
        self.check_writable()
        if not self.recorded:
            return replace(
                options,
                dedup=LEGACY_DEDUP if options.dedup is None else options.dedup,
                max_rows_per_file=_given(options.max_rows_per_file, DEFAULT_MAX_ROWS_PER_FILE),
                max_bytes_per_file=_given(options.max_bytes_per_file, DEFAULT_MAX_BYTES_PER_FILE),
            )
        columns = list(dict.fromkeys([*self.columns, *columns]))
        self._check_dedup(options.dedup, columns)
        self._check_ref_ids(options.ref_id_columns)
        self.check_ref_id_columns(options.ref_id_columns)
        self._check_placement(options.placement)
        for name in ("max_rows_per_file", "max_bytes_per_file"):
            given = getattr(options, name)
            if given is not None and given != getattr(self, name):
                raise _conflict(name, getattr(self, name), given)
        return replace(
            options,
            dedup={c: self.dedup_of(c) for c in columns},
            # a ref_id column given for a column that records none is used by this write
            ref_id_columns={
                **(options.ref_id_columns or {}),
                **{c: p.ref_id_column for c, p in self.columns.items() if p.ref_id_column},
            },
            max_rows_per_file=self.max_rows_per_file,
            max_bytes_per_file=self.max_bytes_per_file,
        )

    def for_new_table(self, options: WriteOptions, columns: Iterable[str] = ()) -> WriteOptions:
        """The options of a write that makes the table anew (create, overwrite) of blob
        ``columns``: what it gives, else what this table had for them (an overwrite keeps its
        settings), else defaults."""
        self.check_writable()
        kept_columns = {c: p for c, p in self.columns.items() if c in set(columns)}
        dedup = {} if options.dedup is None else options.dedup
        if isinstance(dedup, Mapping):  # columns it leaves out keep theirs, or the table's
            kept = {c: p.dedup for c, p in kept_columns.items() if p.dedup}
            dedup = {"*": self.dedup, **kept, **dedup}
        given_ids = options.ref_id_columns
        kept_ids = {c: p.ref_id_column for c, p in kept_columns.items() if p.ref_id_column}
        return replace(
            options,
            dedup=dedup,
            ref_id_columns=given_ids if given_ids is not None else kept_ids or None,
            max_rows_per_file=_given(options.max_rows_per_file, self.max_rows_per_file),
            max_bytes_per_file=_given(options.max_bytes_per_file, self.max_bytes_per_file),
            placement=self._placement_kept(kept_columns, options.placement),
        )

    @staticmethod
    def _placement_kept(
        columns: Mapping[str, ColumnProperties], given: Mapping[str, Mapping[str, int]] | None
    ) -> dict[str, dict[str, int]] | None:
        """The thresholds a write that makes the table anew records: those it gives, over the
        ``columns``' own (an overwrite keeps what it does not give)."""
        default = Placement()
        kept: dict[str, dict[str, int]] = {}
        for column, own in columns.items():
            changed = {
                n: v for n, v in _thresholds(own.placement).items() if v != getattr(default, n)
            }
            if changed:
                kept[column] = changed
        for target, thresholds in (given or {}).items():
            kept[target] = {**kept.get(target, {}), **thresholds}
        return kept or None

    def changed(self, **changes: Any) -> TableProperties:
        """These properties with ``changes`` (the names of :data:`SETTABLE`), validated:
        ``dedup`` a mode or ``{column: mode}`` (``None`` for a column: the table's mode
        again), ``ref_id_columns`` ``{column: integer column or None}``, ``placement``
        ``{column or "*": {threshold: bytes}}``, bases lists of URIs, limits positive ints
        (each by its setting, :mod:`blobhouse.settings`). Every damaged setting must be among
        ``changes`` (set anew: the repair), else :class:`TableMetadataError` names them.

        >>> TableProperties().changed(dedup="content").dedup
        'content'
        >>> TableProperties().changed(dedupe="off")
        Traceback (most recent call last):
        ...
        blobhouse.errors.UnknownOptionError: unknown property 'dedupe' (did you mean 'dedup'?); \
valid: allowed_bases, dedup, managed_bases, max_bytes_per_file, max_rows_per_file, placement, \
ref_id_columns
        """
        check_names(changes, SETTABLE, "property")
        self._check_known()
        left = _left_damaged(self.damaged, changes)
        if left:  # each damaged one must be set anew: it would be written back as its default
            raise damage_error(left, self.where)
        columns = dict(self.columns)
        updated = replace(self, recorded=True, damaged={})
        if "dedup" in changes:
            updated, columns = _with_dedup(updated, columns, changes["dedup"])
        if "ref_id_columns" in changes:
            columns = _with_ref_ids(columns, changes["ref_id_columns"])
        if "placement" in changes:
            columns = _with_placement(columns, changes["placement"])
        for name in ("allowed_bases", "managed_bases", "max_rows_per_file", "max_bytes_per_file"):
            if name in changes:
                updated = replace(updated, **{name: SETTINGS[name].check(changes[name])})
        return replace(updated, columns=columns)

    def schema_metadata(self) -> dict[bytes, bytes]:
        """The schema metadata that records the table-wide settings (``allowed_bases`` also
        lists the managed ones, so a reader that knows only allowed bases still reads them)."""
        managed = sorted(self.managed_bases)
        settings = {
            "format": FORMAT,
            "dedup": self.dedup,
            "allowed_bases": sorted({*self.allowed_bases, *managed}),
            "managed_bases": managed,
            "max_rows_per_file": self.max_rows_per_file,
            "max_bytes_per_file": self.max_bytes_per_file,
        }
        return {SETTINGS_KEY: json.dumps(settings).encode()}

    def field_metadata(self, column: str, ids: Mapping[str, int]) -> dict[bytes, bytes | None]:
        """The metadata keys of blob column ``column``'s field (None: remove the key);
        ``ids``: column name -> field id."""
        own = self.columns.get(column, ColumnProperties())
        ref = str(ids[own.ref_id_column]).encode() if own.ref_id_column else None
        metadata: dict[bytes, bytes | None] = {
            DEDUP_KEY: own.dedup.encode() if own.dedup else None,
            REF_ID_FIELD_KEY: ref,
        }
        # only thresholds other than Lance's defaults are recorded (as Lance's writers do)
        default = Placement()
        changed = {
            name: value
            for name, value in _thresholds(own.placement).items()
            if value != getattr(default, name)
        }
        recorded = Placement.overrides(**changed)
        for key in Placement.overrides(**_thresholds(default)):
            metadata[key] = recorded.get(key)
        return metadata

    def recorded_in(self, schema: pa.Schema, ids: Mapping[str, int]) -> pa.Schema:
        """``schema`` (a new table's) recording these properties."""
        for path in stored_blob_columns(schema):
            column = path_name(path)
            if column not in self.columns:
                continue
            current = get_field(schema, path)
            kept = {k: v for k, v in (current.metadata or {}).items()}
            for key, value in self.field_metadata(column, ids).items():
                if value is None:
                    kept.pop(key, None)
                else:
                    kept[key] = value
            schema = replace_field(schema, path, current.with_metadata(kept or None))
        return schema.with_metadata({**(schema.metadata or {}), **self.schema_metadata()})

    def bases(self, table_root: str | None = None) -> AllowedBases:
        """The allowed and managed bases of external blobs, checked."""
        return AllowedBases(self.allowed_bases, table_root, self.managed_bases)

    def to_dict(self) -> dict[str, Any]:
        """The properties as plain values (for JSON, the CLI and ``stats``)."""
        return {
            "dedup": self.dedup,
            "blob_columns": list(self.columns),
            "columns": {c: p.to_dict(self.dedup) for c, p in self.columns.items()},
            "allowed_bases": sorted(self.allowed_bases),
            "managed_bases": sorted(self.managed_bases),
            "max_rows_per_file": self.max_rows_per_file,
            "max_bytes_per_file": self.max_bytes_per_file,
            "recorded": self.recorded,
            "damaged": dict(self.damaged),
        }

    def _check_dedup(self, given: str | Mapping[str, str] | None, columns: Sequence[str]) -> None:
        if given is None:
            return
        if isinstance(given, str):
            asked = dict.fromkeys(columns, given)
        else:  # "*": every column it does not name
            for name in sorted(set(given) - set(columns) - {"*"}):
                check_blob_column(name, list(columns), "dedup")  # raises, naming the closest
            asked = {c: given.get(c, given.get("*")) for c in columns if c in given or "*" in given}
        for column, mode in asked.items():
            DEDUP_MODE.check(mode, f"dedup of column {column!r}")
            if column in columns and mode != self.dedup_of(column):
                raise _conflict(f"dedup of column {column!r}", self.dedup_of(column), mode)

    def check_ref_id_columns(self, given: Mapping[str, str] | None = None) -> None:
        """Refuse to write a ref_id column whose ref_id column was dropped (by Lance's
        ``drop_columns``) unless ``given`` names another: its rows would share nothing."""
        for column, own in self.columns.items():
            if (
                own.ref_id_dropped
                and self.dedup_of(column) == "ref_id"
                and column not in (given or {})
            ):
                raise InvalidInputError(
                    f"blob column {column!r} takes its ref_ids from a column that was dropped; "
                    f"name another with set_properties(ref_id_columns={{{column!r}: ...}}) (or "
                    "ref_id_columns=... on this write), or change its dedup mode"
                )

    def _check_ref_ids(self, given: Mapping[str, str] | None) -> None:
        for column, ref in (given or {}).items():
            own = self.columns.get(column)
            recorded = own.ref_id_column if own is not None else None
            if recorded is not None and ref != recorded:
                raise _conflict(f"ref_id column of column {column!r}", recorded, ref)

    def _check_placement(self, given: Mapping[str, Mapping[str, int]] | None) -> None:
        for target, thresholds in (given or {}).items():
            targets = list(self.columns) if target == "*" else [target]
            for column in targets:
                own = self.columns.get(column)
                if own is None:
                    continue
                for name, value in thresholds.items():
                    if getattr(own.placement, name, value) != value:
                        current = getattr(own.placement, name)
                        raise _conflict(f"{name} of column {column!r}", current, value)


def new_table_properties(
    options: WriteOptions, columns: Iterable[tuple[str, str, str | None, Placement]]
) -> TableProperties:
    """The properties a create or an overwrite records: the table-wide settings of
    ``options`` (resolved by :meth:`TableProperties.for_new_table`) and, per blob column of the
    write, ``(name, dedup mode, ref_id column, placement)``."""
    given = options.dedup if options.dedup is not None else DEFAULT_DEDUP
    explicit = dict(given) if isinstance(given, Mapping) else {}
    table_dedup = given if isinstance(given, str) else explicit.pop("*", DEFAULT_DEDUP)
    return TableProperties(
        dedup=table_dedup,
        columns={
            name: ColumnProperties(
                dedup=mode if name in explicit and mode != table_dedup else None,
                ref_id_column=ref,
                placement=placement,
            )
            for name, mode, ref, placement in columns
        },
        allowed_bases=tuple(options.allowed_bases or ()),
        managed_bases=tuple(options.managed_bases or ()),
        max_rows_per_file=_given(options.max_rows_per_file, DEFAULT_MAX_ROWS_PER_FILE),
        max_bytes_per_file=_given(options.max_bytes_per_file, DEFAULT_MAX_BYTES_PER_FILE),
    )


def parse_settings(pairs: Mapping[str, str]) -> dict[str, Any]:
    """``NAME=VALUE`` settings (the command line's ``--set``) as changes for
    :meth:`TableProperties.changed`: ``dedup`` (the table's mode), ``dedup.<column>``,
    ``ref_id_column.<column>`` (``none`` to clear), a placement threshold for every blob column
    (``inline_size_threshold``) or one (``inline_size_threshold.<column>``), ``allowed_bases``
    and ``managed_bases`` (comma separated), ``max_rows_per_file``, ``max_bytes_per_file``;
    ``default`` as the value of ``dedup.<column>`` or a threshold goes back to the default.

    >>> parse_settings({"dedup.video": "ref_id", "inline_size_threshold": "0"})
    {'dedup': {'video': 'ref_id'}, 'placement': {'*': {'inline_size_threshold': 0}}}
    >>> parse_settings({"dedup": "content"})
    {'dedup': {'*': 'content'}}
    """
    changes: dict[str, Any] = {}
    for name, value in pairs.items():
        key, _, column = name.partition(".")
        default = value.strip().lower() == "default"
        if key == "dedup":
            mode = None if column and default else DEDUP_MODE.parse(value, name)
            changes.setdefault("dedup", {})[column or "*"] = mode
        elif key == "ref_id_column" and column:
            ref = None if value.strip().lower() in ("", "none") else value.strip()
            changes.setdefault("ref_id_columns", {})[column] = ref
        elif key in THRESHOLDS:
            target = changes.setdefault("placement", {}).setdefault(column or "*", {})
            target[key] = None if default else SETTINGS[key].parse(value, name)
        elif key in _TABLE_WIDE_PARSED and not column:
            changes[key] = SETTINGS[key].parse(value)
        else:
            valid = [
                "dedup",
                "dedup.<column>",
                "ref_id_column.<column>",
                *THRESHOLDS,
                *(f"{n}.<column>" for n in THRESHOLDS),
                *_TABLE_WIDE_PARSED,
            ]
            check_names([name], valid, "property")
    return changes


_TABLE_WIDE_PARSED = ("allowed_bases", "managed_bases", "max_rows_per_file", "max_bytes_per_file")


def field_ids(lance_fields, prefix: str = "") -> dict[str, int]:
    """Column name (``parent.child`` inside structs) -> Lance field id."""
    ids: dict[str, int] = {}
    for lance_field in lance_fields:
        name = f"{prefix}{lance_field.name()}"
        ids[name] = lance_field.id()
        ids.update(field_ids(lance_field.children(), f"{name}."))
    return ids


def _names_by_id(lance_fields) -> dict[int, str]:
    return {i: name for name, i in field_ids(lance_fields).items()}


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _conflict(setting: str, table: object, given: object) -> PropertyConflictError:
    return PropertyConflictError(
        f"{setting}: the table's is {table!r}, this write asked for {given!r} ({_HINT})"
    )


def _integer_columns(schema: pa.Schema) -> frozenset[str]:
    """The columns of ``schema`` that may hold ref_ids: those of an integer type."""
    return frozenset(
        name
        for name, path in column_paths(schema).items()
        if pa.types.is_integer(get_field(schema, path).type)
    )


def _stored_column(
    column: str,
    metadata: Mapping[bytes, bytes],
    names: Mapping[int, str],
    integers: frozenset[str],
    damaged: dict,
) -> ColumnProperties:
    """Blob column ``column``'s own settings as its field ``metadata`` records them, each
    checked by its setting (its ref_id column one of ``integers``); what is damaged is added
    to ``damaged`` (``<setting>.<column>``) and left at its default."""

    def stored(key: bytes, spec: Any, setting: str) -> Any:
        try:
            return spec.parse(metadata[key].decode(errors="replace"), f"{setting} of {column!r}")
        except InvalidSettingError as exc:
            damaged[f"{setting}.{column}"] = str(exc)
            return None

    dedup = stored(DEDUP_KEY, DEDUP_MODE, "dedup") if DEDUP_KEY in metadata else None
    field_id = (
        stored(REF_ID_FIELD_KEY, _FIELD_ID, "ref_id_column")
        if metadata.get(REF_ID_FIELD_KEY)
        else None
    )
    placement = Placement()
    for key, value in placement_metadata(metadata).items():
        try:
            placement = placement.updated({key: value}, column)
        except InvalidSettingError as exc:
            damaged[f"{exc.setting}.{column}"] = str(exc)
    ref = names.get(field_id) if field_id is not None else None
    if ref is not None and ref not in integers:  # another tool pointed it at another column
        damaged[f"ref_id_column.{column}"] = (
            f"ref_id_column of {column!r} must be an integer column, got column {ref!r} (field "
            f"id {field_id})"
        )
        field_id = ref = None
    return ColumnProperties(
        dedup=dedup,
        ref_id_column=ref,
        placement=placement,
        ref_id_dropped=field_id is not None and ref is None,
    )


def _left_damaged(damaged: Mapping[str, str], changes: Mapping[str, Any]) -> dict[str, str]:
    """The damaged settings (of :attr:`TableProperties.damaged`) that ``changes`` (of
    :meth:`TableProperties.changed`) do not set anew; the format is written anew by any."""
    dedup = changes.get("dedup")
    columns_dedup = dedup if isinstance(dedup, Mapping) else {}
    refs = changes.get("ref_id_columns")
    placement = changes.get("placement")
    placement = placement if isinstance(placement, Mapping) else {}

    def set_anew(key: str) -> bool:
        name, _, column = key.partition(".")
        if name == "format":
            return True
        if name == "dedup":
            return (
                column in columns_dedup
                if column
                else isinstance(dedup, str) or "*" in columns_dedup
            )
        if name == "ref_id_column":
            return isinstance(refs, Mapping) and column in refs
        if name in THRESHOLDS:
            targets = (placement.get(t) for t in (column, "*"))
            return any(isinstance(t, Mapping) and name in t for t in targets)
        return name in changes

    return {key: problem for key, problem in damaged.items() if not set_anew(key)}


def _with_dedup(
    properties: TableProperties, columns: dict[str, ColumnProperties], dedup: Any
) -> tuple[TableProperties, dict[str, ColumnProperties]]:
    dedup = SETTINGS["dedup"].check(dedup)
    if isinstance(dedup, str):  # the table's mode, for every column without one of its own
        return replace(properties, dedup=dedup), columns
    if "*" in dedup:  # the table's mode, then the columns' own
        properties, columns = _with_dedup(properties, columns, dedup.pop("*"))
    for column, mode in dedup.items():
        own = _column(columns, column, "dedup")
        columns[column] = replace(own, dedup=None if mode == properties.dedup else mode)
    return properties, columns


def _with_ref_ids(columns: dict[str, ColumnProperties], given: Any) -> dict[str, ColumnProperties]:
    given = SETTINGS["ref_id_columns"].check(given)  # None: ref_ids from the values again
    for column, ref in given.items():
        own = _column(columns, column, "ref_id_columns")
        columns[column] = replace(own, ref_id_column=ref, ref_id_dropped=False)
    return columns


def _with_placement(
    columns: dict[str, ColumnProperties], given: Any
) -> dict[str, ColumnProperties]:
    default = Placement()
    for target, thresholds in SETTINGS["placement"].check(given).items():
        wanted = {n: getattr(default, n) if v is None else v for n, v in thresholds.items()}
        for column in list(columns) if target == "*" else [target]:
            own = _column(columns, column, "placement")
            columns[column] = replace(own, placement=own.placement.updated(wanted))
    return columns


def _column(columns: Mapping[str, ColumnProperties], name: str, what: str) -> ColumnProperties:
    return columns[check_blob_column(name, list(columns), what)]


def _thresholds(placement: Placement) -> dict[str, int]:
    return {name: getattr(placement, name) for name in THRESHOLDS}
