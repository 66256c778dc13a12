"""Placement: where a payload goes (inline, packed, dedicated, external) and which URIs may be
referenced.

Thresholds equal Lance's defaults and are stored in Lance's own field metadata keys, so they
are kept with the table and honoured by stock Lance writers too.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

import pyarrow as pa

from blobhouse.errors import ExternalBlobError, InvalidInputError, InvalidSettingError
from blobhouse.io.objects import long_name, object_store, uri_to_path
from blobhouse.io.uris import is_root, is_under, normalize_uri
from blobhouse.settings import SETTINGS, THRESHOLDS, check_names, damage_error, recorded_settings

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_META_KEYS = {
    "inline_size_threshold": b"lance-encoding:blob-inline-size-threshold",
    "dedicated_size_threshold": b"lance-encoding:blob-dedicated-size-threshold",
    "pack_file_size_threshold": b"lance-encoding:blob-pack-file-size-threshold",
}


class Kind(enum.IntEnum):
    """Blob v2 descriptor kinds as Lance stores them."""

    INLINE = 0
    PACKED = 1
    DEDICATED = 2
    EXTERNAL = 3
    MANAGED = 4


@dataclass(frozen=True)
class Placement:
    """Size thresholds of one blob column.

    As in Lance, a payload above ``dedicated_size_threshold`` gets a dedicated sidecar; else it
    is inline when ``size <= inline_size_threshold``, packed otherwise. A payload several rows
    share is never inline (an inline copy cannot be shared).

    >>> Placement().kind_for(1000, shared=False).name, Placement().kind_for(1000, shared=True).name
    ('INLINE', 'PACKED')
    """

    inline_size_threshold: int = SETTINGS["inline_size_threshold"].default
    dedicated_size_threshold: int = SETTINGS["dedicated_size_threshold"].default
    pack_file_size_threshold: int = SETTINGS["pack_file_size_threshold"].default

    def __post_init__(self) -> None:
        for f in fields(self):  # in the range Lance accepts for its field metadata keys
            SETTINGS[f.name].check(getattr(self, f.name))

    def kind_for(self, size: int, *, shared: bool) -> Kind:
        """Where a payload of ``size`` bytes goes."""
        if size > self.dedicated_size_threshold:
            return Kind.DEDICATED
        if size <= self.inline_size_threshold and not shared:
            return Kind.INLINE
        return Kind.PACKED

    def updated(
        self,
        overrides: Mapping[bytes, bytes] | Mapping[str, int] | None,
        column: str | None = None,
    ) -> Placement:
        """This placement with the thresholds in ``overrides``: field metadata (Lance's keys,
        text) or ``{threshold: bytes}``; each checked by its setting (``column``: whose, for the
        message).

        >>> Placement().updated({b"lance-encoding:blob-inline-size-threshold": b"+10"})
        ... # doctest: +ELLIPSIS
        Placement(inline_size_threshold=10, ...)
        """
        if not overrides:
            return self
        check_names((k for k in overrides if isinstance(k, str)), THRESHOLDS, "placement threshold")
        changes: dict[str, int] = {}
        for name, key in _META_KEYS.items():
            whose = f"{name} of column {column!r}" if column else name
            if name in overrides:
                changes[name] = SETTINGS[name].check(overrides[name], whose)  # type: ignore[index]
            elif key in overrides:
                text = overrides[key].decode(errors="replace")  # type: ignore[index, union-attr]
                changes[name] = SETTINGS[name].parse(text, whose)
        return replace(self, **changes)

    @staticmethod
    def overrides(**thresholds: int | None) -> dict[bytes, bytes]:
        """Field metadata that records the given thresholds (None = not overridden)."""
        given = Placement().updated({k: v for k, v in thresholds.items() if v is not None})
        return {
            _META_KEYS[k]: str(getattr(given, k)).encode()
            for k in thresholds
            if thresholds[k] is not None
        }


def placement_metadata(metadata: Mapping[bytes, bytes] | None) -> dict[bytes, bytes]:
    """The placement keys of a field's metadata."""
    keys = set(_META_KEYS.values())
    return {k: v for k, v in (metadata or {}).items() if k in keys}


class AllowedBases:
    """The URI prefixes external blobs may live under, kept with the table.

    A table's own files are never external blobs: gc and compaction own everything under the
    table root, so a uri inside ``table_root`` is refused even when a base covers it.
    ``managed`` bases are allowed bases too, and every external uri a write references under
    one is handed to the table (a managed object: docs/managed-objects.md).

    >>> bases = AllowedBases(["/data/videos"], managed=["/data/scratch"])
    >>> bases.check("/data/videos/a.mp4", column="video", row=0)
    'file:///data/videos/a.mp4'
    >>> bases.bases, bases.is_managed("file:///data/scratch/b.mp4")
    (['file:///data/scratch', 'file:///data/videos'], True)
    """

    def __init__(
        self,
        bases: Iterable[str] = (),
        table_root: str | None = None,
        managed: Iterable[str] = (),
    ) -> None:
        # each checked by its setting: a string is not a list, a managed base is no root
        checked = {
            "allowed_bases": (bases, SETTINGS["allowed_bases"].check(bases)),
            "managed_bases": (managed, SETTINGS["managed_bases"].check(managed)),
        }
        self.managed = list(checked["managed_bases"][1])
        self.bases = sorted({*checked["allowed_bases"][1], *self.managed})
        self.damage = ""  # why the table's stored bases are not all read (of_table, reading)
        self.table_root = normalize_uri(table_root).rstrip("/") if table_root else None
        for name, (given, normalized) in checked.items():
            for base in normalized if self.table_root else ():
                if is_under(base, self.table_root):
                    raise SETTINGS[name].error(
                        given,
                        detail=f"{base} lies inside the table ({self.table_root}); the table's "
                        "own files cannot be external blobs (gc and compaction own them)",
                    )

    def __bool__(self) -> bool:
        return bool(self.bases)

    @classmethod
    def of_table(
        cls, schema: pa.Schema | None, table_root: str | None = None, *, reading: bool = False
    ) -> AllowedBases:
        """The bases a table schema records (none if it records nothing). Damaged ones raise
        :class:`~blobhouse.errors.TableMetadataError` naming them and the command that sets
        them anew, unless ``reading``: then a warning, and only the intact allowed bases, none
        managed (the table's own payloads still read; external ones elsewhere are refused,
        naming the damage)."""
        recorded, damaged = recorded_settings(schema)
        bad = {k: v for k, v in damaged.items() if k in ("allowed_bases", "managed_bases")}
        if not bad:
            try:
                allowed, managed = (recorded.get(k, ()) for k in ("allowed_bases", "managed_bases"))
                return cls(allowed, table_root, managed)
            except InvalidSettingError as exc:  # a base inside the table
                bad = {exc.setting: str(exc)}
        # with the table's other damaged settings: the command it names repairs them all
        problem = damage_error({**damaged, **bad}, uri_to_path(table_root or ""))
        if not reading:
            raise problem
        warnings.warn(f"{problem}; reading without its damaged bases", stacklevel=3)
        intact = () if "allowed_bases" in bad else recorded.get("allowed_bases", ())
        try:
            kept = cls(intact, table_root)
        except InvalidSettingError:  # an allowed base inside the table: none is read
            kept = cls((), table_root)
        kept.damage = str(problem).split(" (or Table.set_properties)")[0]
        return kept

    def is_managed(self, normalized: str) -> bool:
        """Whether a normalized uri lies under a managed base."""
        return any(_below(normalized, base) for base in self.managed)

    def may_own(self, normalized: str) -> bool:
        """Whether the table may own (and gc one day delete) the object at normalized ``uri``:
        it lies under a managed base, or under an allowed base that is a directory. Never one
        only a filesystem, bucket or container root covers, where gc would delete anywhere."""
        return self.is_managed(normalized) or any(
            _below(normalized, base) and not is_root(base) for base in self.bases
        )

    def check(self, uri: str, *, column: str, row: int, managed: bool = False) -> str:
        """The normalized form of ``uri``, or :class:`ExternalBlobError` if not allowed
        (``managed``: the row hands the object to the table, which the message says, and
        which only a directory base allows: :meth:`may_own`)."""
        normalized, problem = self.resolve(uri)
        if not problem and managed and not self.may_own(normalized):
            problem = (
                f"external uri {uri!r} lies under no directory the table may own objects in: "
                "the base covering it is the root of a filesystem, bucket or container, where "
                "gc would delete; add the directory that holds it as an allowed or managed base"
            )
        if problem:
            what = "managed " if managed else ""
            raise ExternalBlobError(f"blob column {column!r}, row {row}: {what}{problem}")
        return normalized

    def resolve(self, uri: str) -> tuple[str, str]:
        """``(normalized uri, "")``, or ``("", why it is not allowed)``."""
        try:
            normalized = normalize_uri(uri)
        except InvalidInputError as exc:
            return "", str(exc)
        if self.table_root and is_under(normalized, self.table_root):
            return "", (
                f"external uri {uri!r} lies inside the table; its own files cannot be "
                "external blobs (gc and compaction own them)"
            )
        if any(_below(normalized, base) for base in self.bases):
            return normalized, ""
        if self.damage:  # the bases that would allow it may be the damaged ones
            return "", f"external uri {uri!r} cannot be read: {self.damage}"
        allowed = self.bases or "none (pass allowed_bases=[...] when creating the table)"
        return "", f"external uri {uri!r} is outside the table's allowed bases; allowed: {allowed}"


def external_range(
    uri: str,
    position: int | None,
    size: int | None,
    bases: AllowedBases,
    *,
    column: str,
    row: int,
    sizes: dict[str, int] | None = None,
    storage_options: Mapping[str, str] | None = None,
    managed: bool = False,
) -> tuple[str, int, int]:
    """``(normalized uri, position, size)`` of an external reference, checked: under an
    allowed base, the object exists, the range lies inside it. ``sizes`` caches object sizes;
    ``managed``: the row hands the object to the table (errors say so).

    >>> import tempfile, os
    >>> base = tempfile.mkdtemp(); path = os.path.join(base, "clip.bin")
    >>> _ = open(path, "wb").write(b"0123456789")
    >>> external_range(path, None, None, AllowedBases([base]), column="c", row=0)[1:]
    (0, 10)
    """
    normalized = bases.check(uri, column=column, row=row, managed=managed)
    problem = long_name(normalized)  # the OS would refuse it raw (errno 36)
    if problem is not None:
        raise ExternalBlobError(
            f"blob column {column!r}, row {row}: external uri {uri!r}: {problem}"
        )
    sizes = {} if sizes is None else sizes
    if normalized not in sizes:
        sizes[normalized] = object_size(
            normalized, column=column, row=row, storage_options=storage_options
        )
    if position is None:
        position, size = 0, sizes[normalized]
    if position + size > sizes[normalized]:
        raise ExternalBlobError(
            f"blob column {column!r}, row {row}: range [{position}, +{size}) is past the end of "
            f"{normalized} ({sizes[normalized]} bytes)"
        )
    return normalized, position, size


def object_size(
    uri: str, *, column: str, row: int, storage_options: Mapping[str, str] | None = None
) -> int:
    """Size in bytes of the object at ``uri``; :class:`ExternalBlobError` if it is missing."""
    try:
        size = object_store(uri, storage_options).size(uri)
    except (OSError, ValueError) as exc:
        raise ExternalBlobError(
            f"blob column {column!r}, row {row}: cannot stat external uri {uri!r}: {exc}"
        ) from None
    if size is None:
        raise ExternalBlobError(
            f"blob column {column!r}, row {row}: external uri {uri!r} does not exist "
            "or is not a file"
        )
    return size


def _below(uri: str, base: str) -> bool:
    """Whether normalized ``uri`` lies below ``base`` (not the base itself: a folder)."""
    return uri != base and is_under(uri, base)
