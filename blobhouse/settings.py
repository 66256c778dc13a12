"""Every setting blobhouse takes has one typed schema here (:data:`SETTINGS`): its name, the
values it takes (type, range or shape), its default and what it means. Every door checks a
value with the same spec: Python keywords and option objects (:meth:`Setting.check`), the
command line and Spark options and ``TBLPROPERTIES`` (text, :meth:`Setting.parse`), and the
settings a table records in its manifest (:meth:`Setting.stored`, :func:`recorded_settings`).
A wrong value is an :class:`~blobhouse.errors.InvalidSettingError` naming the setting, the value
and what is expected, raised before anything is written; a wrong value read back from a table
is damage (:func:`damage_error`): it is never read as something wider (a string where a list
belongs is not a list of characters).

Setting names are checked too: a misspelled one is an error naming the closest valid one,
never a setting silently ignored (:func:`check_names`).

>>> SETTINGS["max_rows_per_file"].check("10")
Traceback (most recent call last):
...
blobhouse.errors.InvalidSettingError: max_rows_per_file must be a whole number from 1 to \
2**63 - 1, got '10'
>>> SETTINGS["managed_bases"].check("/data/media")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
blobhouse.errors.InvalidSettingError: managed_bases must be a list of absolute directories ...
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import shlex
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from blobhouse.errors import (
    InvalidInputError,
    InvalidSettingError,
    TableMetadataError,
    UnknownOptionError,
    closest,
)
from blobhouse.io.uris import base_uri, is_root, normalize_uri

#: the longest duration a setting takes (a century: retention and grace periods)
MAX_DAYS = 36_500
#: the largest count or size blobhouse keeps (Arrow's and numpy's int64; Lance's u64 holds it)
MAX_INT64 = 2**63 - 1
#: Lance reads its placement thresholds as Rust ``usize`` (64-bit here): the largest it accepts
MAX_USIZE = 2**64 - 1
DEDUP_MODES: tuple[str, ...] = ("content", "ref_id", "global", "off")
#: the schema metadata key holding a table's table-wide settings (JSON, ``"format": 2``)
SETTINGS_KEY = b"blobhouse"
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


# -- names ---------------------------------------------------------------------------------


#: options that were replaced: the old name -> the new one, and what it is
RETIRED = {
    "repack_threshold": (
        "max_unused",
        "a table-wide budget of unreferenced store bytes (docs/global-dedup.md)",
    ),
}


def unknown_option(name: str, valid: Collection[str], what: str) -> UnknownOptionError:
    """The error for option ``name``, which is none of ``valid``."""
    near = closest(name, valid)
    hint = f" (did you mean {near!r}?)" if near else ""
    if name in RETIRED and RETIRED[name][0] in valid:
        hint = " (replaced by {}, {})".format(*RETIRED[name])
    return UnknownOptionError(f"unknown {what} {name!r}{hint}; valid: {', '.join(sorted(valid))}")


def check_names(
    given: Iterable[str],
    valid: Collection[str],
    what: str,
    internal: Collection[str] = (),
) -> None:
    """Raise :class:`UnknownOptionError` for the first name of ``given`` that is neither in
    ``valid`` nor ``internal`` (accepted, never suggested).

    >>> try:
    ...     check_names(["dedupe"], ["dedup", "blob_columns"], "write option")
    ... except UnknownOptionError as error:
    ...     print(error)
    unknown write option 'dedupe' (did you mean 'dedup'?); valid: blob_columns, dedup
    """
    for name in given:
        if name not in valid and name not in internal:
            raise unknown_option(name, valid, what)


# -- the kinds of setting ------------------------------------------------------------------


class _Wrong(Exception):
    """A value a setting does not take (``detail``: why, when the expectation alone does not
    say)."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Setting:
    """One setting: ``name``, ``meaning``, ``default`` (None: none, or the table's) and
    ``metavar`` (what stands for its value in a command blobhouse shows: a word with no
    character a shell would act on, which as a value is refused). Subclasses say what values
    it takes (:attr:`expected`) and how a value becomes its canonical form."""

    name: str
    meaning: str
    default: Any = None
    metavar: str = "VALUE"

    @property
    def expected(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, name: str | None = None) -> Any:
        """``value`` (a Python value: a keyword, an option object's field) in canonical form,
        or :class:`InvalidSettingError` naming the setting (``name``, if it is known by
        another name there, such as ``"dedup of column 'video'"``)."""
        try:
            return self._canonical(value)
        except _Wrong as wrong:
            raise self.error(value, name, wrong.detail) from None

    @property
    def expected_text(self) -> str:
        """What :meth:`parse` takes (text)."""
        return self.expected

    def parse(self, text: str, name: str | None = None) -> Any:
        """``text`` (the command line, a Spark option or table property) as a checked value."""
        try:
            return self._canonical(self._from_text(text))
        except _Wrong as wrong:
            raise self.error(text, name, wrong.detail, self.expected_text) from None

    def stored(self, value: Any, name: str | None = None) -> Any:
        """A value read back from a table's manifest (JSON), checked as :meth:`check` does."""
        return self.check(value, name)

    def error(
        self, value: Any, name: str | None = None, detail: str = "", expected: str = ""
    ) -> InvalidSettingError:
        """The error for ``value``, which this setting does not take."""
        why = f" ({detail})" if detail else ""
        return InvalidSettingError(
            f"{name or self.name} must be {expected or self.expected}, got {_shown(value)}{why}",
            setting=self.name,
        )

    def _canonical(self, value: Any) -> Any:
        raise NotImplementedError

    def _from_text(self, text: str) -> Any:
        if not isinstance(text, str):
            return text  # a Python value given where text is usual: checked as it is
        return text.strip()


@dataclass(frozen=True)
class Count(Setting):
    """A whole number from ``low`` to ``high`` (``unit``: what it counts, for the message)."""

    low: int = 0
    high: int = MAX_INT64
    unit: str = ""
    metavar: str = "N"

    @property
    def expected(self) -> str:
        of = f" of {self.unit}" if self.unit else ""
        return f"a whole number{of} from {_bound(self.low)} to {_bound(self.high)}"

    def _canonical(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _Wrong()
        if not self.low <= value <= self.high:
            raise _Wrong()
        return int(value)

    def _from_text(self, text: str) -> Any:
        if not isinstance(text, str):
            return text  # a Python value given where text is usual: checked as it is
        if not _WHOLE_NUMBER.fullmatch(text.strip()):
            raise _Wrong()
        return int(text)


@dataclass(frozen=True)
class Fraction(Setting):
    """A number in the interval from ``low`` to ``high`` (each end open or closed)."""

    low: float = 0.0
    high: float = 1.0
    low_open: bool = False
    high_open: bool = False
    metavar: str = "X"

    @property
    def expected(self) -> str:
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"a number in {left}{self.low:g}, {self.high:g}{right}"

    def _canonical(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _Wrong()
        value = float(value)
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        if not (math.isfinite(value) and above and below):  # nan compares false
            raise _Wrong()
        return value

    def _from_text(self, text: str) -> Any:
        if not isinstance(text, str):
            return text
        try:
            return float(text)
        except ValueError:
            raise _Wrong() from None


@dataclass(frozen=True)
class Choice(Setting):
    """One of ``choices`` (text)."""

    choices: tuple[str, ...] = ()

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)

    def _canonical(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise _Wrong()
        return value


@dataclass(frozen=True)
class Flag(Setting):
    """True or False (numpy's too); ``true`` or ``false`` as text. Not merely truthy: a
    misspelled string is an error."""

    metavar: str = "TRUE_OR_FALSE"

    @property
    def expected(self) -> str:
        return "True or False"

    @property
    def expected_text(self) -> str:
        return "true or false"

    def _canonical(self, value: Any) -> bool:
        numpy = sys.modules.get("numpy")  # a numpy bool exists only once numpy is loaded
        if not (isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))):
            raise _Wrong()
        return bool(value)

    def _from_text(self, text: str) -> Any:
        word = text.strip().lower() if isinstance(text, str) else text
        if word not in ("true", "false"):
            raise _Wrong()
        return word == "true"


@dataclass(frozen=True)
class Duration(Setting):
    """A ``datetime.timedelta`` from 0 to :data:`MAX_DAYS` days (Lance counts time in int64
    microseconds); as text, a number of hours."""

    metavar: str = "HOURS"

    @property
    def expected(self) -> str:
        return f"a datetime.timedelta from 0 to {MAX_DAYS:,} days"

    @property
    def expected_text(self) -> str:
        return f"a number of hours from 0 to {MAX_DAYS * 24:,}"

    def _canonical(self, value: Any) -> timedelta:
        if not isinstance(value, timedelta) or not timedelta(0) <= value <= timedelta(MAX_DAYS):
            raise _Wrong()
        return value

    def _from_text(self, text: str) -> Any:
        try:
            hours = float(text)
            return timedelta(hours=hours) if math.isfinite(hours) else None
        except (TypeError, ValueError):
            raise _Wrong() from None
        except OverflowError:
            raise _Wrong("too long") from None


@dataclass(frozen=True)
class ColumnName(Setting):
    """A column's name (``parent.child`` inside a struct)."""

    metavar: str = "COLUMN"

    @property
    def expected(self) -> str:
        return "a column name"

    def _canonical(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _Wrong()
        return value


@dataclass(frozen=True)
class ColumnNames(Setting):
    """A list of column names; as text, comma separated."""

    metavar: str = "COLUMNS"

    @property
    def expected(self) -> str:
        return "a list of column names"

    def _canonical(self, value: Any) -> tuple[str, ...]:
        items = _items(value)
        for item in items:
            if not isinstance(item, str) or not item:
                raise _Wrong(f"{item!r} is not a column name")
        return tuple(items)

    def _from_text(self, text: str) -> Any:
        return _comma_list(text)


@dataclass(frozen=True)
class Bases(Setting):
    """URI prefixes of external blobs: a list of URIs or paths (as text, comma separated),
    kept normalized (:func:`~blobhouse.io.uris.normalize_uri`), each once, sorted. A relative path
    given is resolved against the working directory where it is given, and must name a folder
    there; one read back from a table must be absolute (it would mean another place in every
    process). ``managed``: gc deletes what the table owns under them, so none may be a
    filesystem or bucket root."""

    managed: bool = False
    metavar: str = "URIS"

    @property
    def expected(self) -> str:
        if self.managed:
            return (
                "a list of absolute directories (paths or URIs such as s3://bucket/media), none "
                "a filesystem or bucket root"
            )
        return "a list of URIs or absolute paths (s3://bucket/media, /data/media)"

    def stored(self, value: Any, name: str | None = None) -> tuple[str, ...]:
        for item in value if isinstance(value, list) else ():
            if isinstance(item, str) and item and "://" not in item and not item.startswith("/"):
                raise self.error(value, name, f"{item!r} is a relative path")
        return self.check(value, name)

    def _canonical(self, value: Any) -> tuple[str, ...]:
        return tuple(sorted({self._base(item) for item in _items(value)}))

    def _base(self, item: Any) -> str:
        if isinstance(item, _Base) and (item.managed or not self.managed):
            return item  # checked by this schema already (normalizing costs system calls)
        if not isinstance(item, str) or not item:
            raise _Wrong(f"{item!r} is not a URI")
        if "://" not in item and not item.startswith("/") and not os.path.isdir(item):
            # a relative path is taken where it is given: one naming nothing there is more
            # likely a placeholder (DIRS) or a typo than a folder still to be made
            raise _Wrong(
                f"{item!r} is a relative path to no directory here ({os.path.abspath(item)}); "
                "give an absolute path or a URI"
            )
        try:
            normalized = normalize_uri(item)
        except InvalidInputError as exc:
            raise _Wrong(f"{item!r}: {exc}") from None
        if self.managed and is_root(normalized):
            raise _Wrong(
                f"{item!r} is the root of a filesystem, bucket or container: gc would delete "
                "the table's objects anywhere in it; name the directory that holds them"
            )
        return _Base(base_uri(normalized), self.managed)

    def _from_text(self, text: str) -> Any:
        return _comma_list(text)


class _Base(str):
    """A base :class:`Bases` checked and normalized (``managed``: as a managed one): a string
    like any other (JSON, pickles), which the schema need not check again."""

    managed: bool

    def __new__(cls, text: str, managed: bool) -> _Base:
        base = super().__new__(cls, text)
        base.managed = managed
        return base

    def __reduce__(self):  # a string again in another process: checked there anew
        return str, (str(self),)


@dataclass(frozen=True)
class PerColumn(Setting):
    """``{column: value}``, each value a ``value`` setting (None too, if ``nullable``); as
    text, JSON or ``column:value,...``."""

    value: Setting = ColumnName("value", "")
    nullable: bool = False
    metavar: str = "COLUMN:VALUE"

    @property
    def expected(self) -> str:
        return f"a mapping {{column: {self.value.expected}}}"

    def _canonical(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _Wrong()
        checked = {}
        for column, item in value.items():
            if not isinstance(column, str) or not column:
                raise _Wrong(f"{column!r} is not a column name")
            if item is None and self.nullable:
                checked[column] = None
                continue
            checked[column] = self.value.check(item, f"{self.name} of column {column!r}")
        return checked

    def _from_text(self, text: str) -> Any:
        if not isinstance(text, str):
            return text
        if text.lstrip().startswith("{"):
            return _json_object(text)
        pairs = [item.split(":", 1) for item in _comma_list(text)]
        if any(len(pair) != 2 for pair in pairs):
            raise _Wrong("write 'column:value,...' or a JSON object")
        return {k.strip(): v.strip() for k, v in pairs}


@dataclass(frozen=True)
class Dedup(Setting):
    """A dedup mode for every blob column, or ``{column (or "*": the others): mode}`` (None:
    the table's mode again); as text, the mode or a JSON object."""

    metavar: str = "MODE"

    @property
    def expected(self) -> str:
        return f"{DEDUP_MODE.expected}, or a mapping {{column: mode}}"

    def stored(self, value: Any, name: str | None = None) -> str:
        """The table's own mode (a column's is kept in its field's metadata)."""
        return DEDUP_MODE.check(value, name or self.name)

    def _canonical(self, value: Any) -> str | dict[str, str | None]:
        if isinstance(value, str):
            return DEDUP_MODE.check(value, self.name)
        if isinstance(value, Mapping):
            return PerColumn(self.name, "", value=DEDUP_MODE, nullable=True).check(value)
        raise _Wrong()

    def _from_text(self, text: str) -> Any:
        if isinstance(text, str) and text.lstrip().startswith("{"):
            return _json_object(text)
        return super()._from_text(text)


@dataclass(frozen=True)
class PlacementOverrides(Setting):
    """``{column (or "*": every blob column): {threshold: bytes (None: the default)}}``; as
    text, a JSON object."""

    metavar: str = "JSON"

    @property
    def expected(self) -> str:
        return "a mapping {column: {threshold: bytes}}"

    def _canonical(self, value: Any) -> dict[str, dict[str, int | None]]:
        if not isinstance(value, Mapping):
            raise _Wrong()
        checked: dict[str, dict[str, int | None]] = {}
        for column, thresholds in value.items():
            if not isinstance(column, str) or not column:
                raise _Wrong(f"{column!r} is not a column name")
            if not isinstance(thresholds, Mapping):
                raise _Wrong(f"the thresholds of {column!r} are not a mapping")
            check_names(thresholds, THRESHOLDS, "placement threshold")
            checked[column] = {
                name: None
                if size is None
                else SETTINGS[name].check(size, f"{name} of column {column!r}")
                for name, size in thresholds.items()
            }
        return checked

    def _from_text(self, text: str) -> Any:
        return _json_object(text) if isinstance(text, str) else text


def _items(value: Any) -> list:
    """The items of a list-like ``value``; a string (or bytes, or a mapping) is not a list."""
    if isinstance(value, str):
        raise _Wrong(f"a string, not a list: write [{value!r}]")
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise _Wrong()
    return list(value)


def _comma_list(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    return [item.strip() for item in text.split(",") if item.strip()]


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _Wrong(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Wrong("not a JSON object")
    return value


def _bound(number: int) -> str:
    """A bound as people read it: 2**63 - 1 rather than 19 digits."""
    if number > 2**20 and (number + 1) & number == 0:
        return f"2**{(number + 1).bit_length() - 1} - 1"
    return str(number)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- the schema ----------------------------------------------------------------------------

KiB, MiB, GiB = 1024, 1024**2, 1024**3
DEDUP_MODE = Choice(
    "dedup",
    "how blob payloads are stored once: global (once for the whole table), content (once "
    "per data file), ref_id (rows with the same ref_id share one payload), off",
    "global",
    "MODE",
    choices=DEDUP_MODES,
)
#: Lance's placement thresholds (field metadata keys Lance's own writers honour too), in the
#: range Lance accepts for them: a usize, positive but for the inline one
THRESHOLDS = ("inline_size_threshold", "dedicated_size_threshold", "pack_file_size_threshold")

_SPECS: tuple[Setting, ...] = (
    # table properties: table-wide, in the schema metadata key ``blobhouse``
    Dedup(
        "dedup",
        "the table's dedup mode (a blob column may have its own): global, content, ref_id, off",
        "global",
    ),
    Bases(
        "allowed_bases",
        "URI prefixes external blobs may be referenced under (reads check every reference)",
        (),
    ),
    Bases(
        "managed_bases",
        "allowed bases whose objects the table takes ownership of once referenced: gc deletes "
        "them once no retained version references them (docs/managed-objects.md)",
        (),
        "DIRS",
        managed=True,
    ),
    Count("max_rows_per_file", "rows per data file a write starts a new one at", MiB, low=1),
    Count(
        "max_bytes_per_file",
        "bytes per data file a write starts a new one at",
        90 * GiB,
        low=1,
        unit="bytes",
    ),
    # table properties of one blob column, in its field metadata
    PerColumn(
        "ref_id_columns",
        "per blob column: the integer column holding its ref_ids (None: none)",
        None,
        value=ColumnName("ref_id_column", "the integer column holding a blob column's ref_ids"),
        nullable=True,
    ),
    Count(
        "inline_size_threshold",
        "payloads up to this size are kept inside the data file (unless shared)",
        64 * KiB,
        "BYTES",
        low=0,
        high=MAX_USIZE,
        unit="bytes",
    ),
    Count(
        "dedicated_size_threshold",
        "payloads above this size get a sidecar file of their own",
        4 * MiB,
        "BYTES",
        low=1,
        high=MAX_USIZE,
        unit="bytes",
    ),
    Count(
        "pack_file_size_threshold",
        "a pack sidecar (or store pack) is closed at this size",
        GiB,
        "BYTES",
        low=1,
        high=MAX_USIZE,
        unit="bytes",
    ),
    PlacementOverrides(
        "placement", "per blob column (or '*': all), its placement thresholds in bytes"
    ),
    # what a write takes besides the table's properties
    ColumnNames("blob_columns", "the columns written as blob columns", ()),
    Flag(
        "allow_nonempty_folder",
        "create a new table in a folder that holds other files",
        False,
    ),
    # compaction (CompactionTargets)
    Count(
        "target_rows",
        "compaction merges fragments below this many rows toward it",
        MiB,
        low=1,
        unit="rows",
    ),
    Count(
        "target_bytes",
        "compaction merges fragments below this size toward it",
        2 * GiB,
        low=1,
        unit="bytes",
    ),
    Fraction(
        "deleted_fraction",
        "compaction rewrites a fragment with more than this fraction of its rows deleted",
        0.1,
        low_open=True,
    ),
    Fraction(
        "max_unused",
        "compaction repacks the store's packs with the most unreferenced bytes until those "
        "left are at most this fraction of its referenced bytes",
        0.05,
    ),
    # commits (CommitOptions)
    Count(
        "retries",
        "how often a change preempted by a concurrent commit is planned and run again",
        3,
        high=1000,
    ),
    # gc
    Count(
        "retain_versions",
        "gc keeps the newest N versions of the branch and removes older ones",
        None,
        low=1,
        unit="versions",
    ),
    Duration("older_than", "gc removes versions older than this", None),
    Duration(
        "grace",
        "gc keeps unreferenced files younger than this (a write in progress may own them)",
        timedelta(hours=24),
    ),
    Flag("dry_run", "gc reports what it would remove and removes nothing", False),
    # verify
    Flag("deep", "verify also re-hashes every payload against its recorded hash", False),
    # reads
    Flag(
        "check_hashes",
        "reads check each payload's bytes against the blake3 recorded when it was written",
        True,
    ),
    Count(
        "batch_size",
        "rows per batch a scan yields (None: Lance's choice)",
        None,
        low=1,
        high=2**32 - 1,
        unit="rows",
    ),
    Count("offset", "rows a scan skips first", None, unit="rows"),
    Count("limit", "rows a scan yields at most", None, unit="rows"),
    Count(
        "max_frame_pixels",
        "a video chunk whose frames have more pixels is refused before a batch decodes (a 4K "
        "frame's: 3840 x 2160)",
        3840 * 2160,
        low=1,
        unit="pixels",
    ),
    # Spark reads and tasks
    Count(
        "rows_per_partition",
        "a Spark read's rows per input partition",
        1_000_000,
        low=1,
        unit="rows",
    ),
    Count(
        "max_batch_bytes",
        "a Spark read's Arrow batches are cut below this size",
        GiB,
        low=1,
        unit="bytes",
    ),
    Count("partitions", "Spark tasks a job runs (None: Spark's own count)", None, low=1),
)
#: every setting, by name
SETTINGS: dict[str, Setting] = {spec.name: spec for spec in _SPECS}


def setting(name: str) -> Setting:
    """The setting called ``name`` (``dedup.video``: a blob column's own ``dedup``)."""
    base = name.partition(".")[0]
    if base == "ref_id_column":
        return SETTINGS["ref_id_columns"].value  # type: ignore[attr-defined]
    return SETTINGS[base]


# -- what a table records --------------------------------------------------------------------

#: the table-wide settings of the schema metadata key ``blobhouse``
TABLE_WIDE = ("dedup", "allowed_bases", "managed_bases", "max_rows_per_file", "max_bytes_per_file")


def table_settings(schema: Any) -> dict:
    """The table's own metadata (schema metadata key ``blobhouse``, JSON) as a dict; empty if
    there is none; :class:`TableMetadataError` if it is not a JSON object.

    >>> import pyarrow as pa
    >>> try:
    ...     table_settings(pa.schema([]).with_metadata({b"blobhouse": b"[1]"}))
    ... except TableMetadataError as error:
    ...     print(error)
    the table's metadata key 'blobhouse' is not a JSON object: [1]
    """
    raw = (schema.metadata or {}).get(SETTINGS_KEY) if schema is not None else None
    if not raw:
        return {}
    try:
        settings = json.loads(raw)
    except ValueError:
        detail = f"is not JSON: {raw[:60]!r}"
        raise TableMetadataError(f"the table's metadata key 'blobhouse' {detail}") from None
    if not isinstance(settings, dict):
        shown = raw[:60].decode(errors="replace")
        detail = f"is not a JSON object: {shown}"
        raise TableMetadataError(f"the table's metadata key 'blobhouse' {detail}")
    return settings


def recorded_settings(schema: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The table-wide settings ``schema`` records (each one it has, checked, plus
    ``"format"``), and what is wrong with each damaged one (by name). A key that is not a JSON
    object damages every table-wide setting.

    >>> import pyarrow as pa
    >>> damaged = pa.schema([]).with_metadata({b"blobhouse": b'{"managed_bases": "/data"}'})
    >>> recorded_settings(damaged)[1]["managed_bases"]  # doctest: +ELLIPSIS
    "managed_bases must be a list of absolute directories ..., got '/data' (a string, ..."
    """
    try:
        recorded = table_settings(schema)
    except TableMetadataError as exc:
        return {}, dict.fromkeys(TABLE_WIDE, str(exc))
    values: dict[str, Any] = {}
    damaged: dict[str, str] = {}
    version = recorded.get("format", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        damaged["format"] = f"format must be a whole number, got {_shown(version)}"
    else:
        values["format"] = version
    for name in TABLE_WIDE:
        if name in recorded:
            try:
                values[name] = SETTINGS[name].stored(recorded[name])
            except InvalidSettingError as exc:
                damaged[name] = str(exc)
    return values, damaged


def repair_command(damaged: Iterable[str], where: str) -> str:
    """The one command that sets the ``damaged`` settings of the table at ``where`` anew.

    >>> repair_command(["managed_bases", "max_rows_per_file"], "/data/t")
    'blobhouse properties /data/t --set managed_bases=DIRS --set max_rows_per_file=N'
    """
    names = [name for name in damaged if name != "format"] or ["dedup"]
    sets = " ".join(f"--set {name}={setting(name).metavar}" for name in names)
    return f"blobhouse properties {shlex.quote(where or 'TABLE')} {sets}"


def damage_error(damaged: Mapping[str, str], where: str) -> TableMetadataError:
    """The error a write, gc or a property change meets on a table whose stored settings
    ``damaged`` are damaged (by name: what is wrong): the names and the one command that sets
    them anew come first (a one-line display may cut the rest), then what is wrong with each.

    >>> error = damage_error({"max_rows_per_file": "max_rows_per_file must be ..."}, "/t")
    >>> str(error).split("; ")[1].split(". ")[0]
    'set it anew with one command: blobhouse properties /t --set max_rows_per_file=N (or \
Table.set_properties)'
    """
    names = ", ".join(damaged)
    one = len(damaged) == 1
    what = f"property {names} is" if one else f"properties {names} are"
    it = "it" if one else "them"
    problems = "; ".join(dict.fromkeys(damaged.values()))  # a whole key's damage once
    return TableMetadataError(
        f"the table's stored {what} damaged (another tool changed its metadata); set {it} anew "
        f"with one command: {repair_command(damaged, where)} (or Table.set_properties). Until "
        f"then reads go on without {it} (external blobs under damaged bases are refused), and "
        "writes, merges, compaction, gc and changes of other properties refuse the table. "
        f"{problems}"
    )
