"""Placement: where a payload goes (inline, packed, dedicated, external) and which URIs may be
referenced.

Thresholds equal Lance's defaults and are stored in Lance's own field metadata keys, so they
are kept with the table and honoured by stock Lance writers too.
"""

from __future__ import annotations

import enum
import json
import os
import posixpath
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from urllib.parse import quote, unquote, urlsplit

import pyarrow as pa

from blobhouse.errors import ExternalBlobError, InvalidInputError, TableMetadataError
from blobhouse.storage import object_store

SETTINGS_KEY = b"blobhouse"
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

    inline_size_threshold: int = 64 * KiB
    dedicated_size_threshold: int = 4 * MiB
    pack_file_size_threshold: int = 1 * GiB

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"{f.name} must be a non-negative int, got {value!r}")
        if self.dedicated_size_threshold <= 0 or self.pack_file_size_threshold <= 0:
            raise InvalidInputError("dedicated and pack file thresholds must be positive")

    def kind_for(self, size: int, *, shared: bool) -> Kind:
        """Where a payload of ``size`` bytes goes."""
        if size > self.dedicated_size_threshold:
            return Kind.DEDICATED
        if size <= self.inline_size_threshold and not shared:
            return Kind.INLINE
        return Kind.PACKED

    def updated(self, overrides: Mapping[bytes, bytes] | Mapping[str, int] | None) -> Placement:
        """This placement with the thresholds in ``overrides`` (field metadata or kwargs)."""
        if not overrides:
            return self
        changes: dict[str, int] = {}
        for name, key in _META_KEYS.items():
            if name in overrides:
                changes[name] = overrides[name]  # type: ignore[index]
            elif key in overrides:
                changes[name] = int(overrides[key])  # type: ignore[index]
        unknown = {k for k in overrides if isinstance(k, str)} - set(_META_KEYS)
        if unknown:
            raise InvalidInputError(
                f"unknown placement option(s) {sorted(unknown)}; known: {sorted(_META_KEYS)}"
            )
        return replace(self, **changes)

    @staticmethod
    def overrides(**thresholds: int | None) -> dict[bytes, bytes]:
        """Field metadata that records the given thresholds (None = not overridden)."""
        given = {k: v for k, v in thresholds.items() if v is not None}
        Placement().updated(given)  # validates names and values
        return {_META_KEYS[k]: str(v).encode() for k, v in given.items()}


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
        self.managed = sorted({_checked_base(b, "managed base") for b in managed})
        self.bases = sorted({_checked_base(b) for b in bases} | set(self.managed))
        self.table_root = normalize_uri(table_root).rstrip("/") if table_root else None
        for base in self.bases:
            if self.table_root and _is_under(base, self.table_root):
                raise InvalidInputError(
                    f"allowed base {base!r} lies inside the table ({self.table_root}); the "
                    "table's own files cannot be external blobs (gc and compaction own them)"
                )

    def __bool__(self) -> bool:
        return bool(self.bases)

    @classmethod
    def of_table(
        cls, schema: pa.Schema | None, table_root: str | None = None, *, reading: bool = False
    ) -> AllowedBases:
        """The bases a table schema records (none if it records nothing). Damaged metadata
        raises :class:`TableMetadataError`, unless ``reading``: then a warning, and no base
        (the table's own payloads still read; external ones are refused)."""
        try:
            settings = table_settings(schema)
            return cls(
                settings.get("allowed_bases", []), table_root, settings.get("managed_bases", [])
            )
        except (TableMetadataError, InvalidInputError, TypeError) as exc:
            problem = exc if isinstance(exc, TableMetadataError) else _damaged(repr(exc))
            if not reading:
                raise problem from None
            warnings.warn(f"{problem}; reading without its external bases", stacklevel=3)
            return cls((), table_root)

    def is_managed(self, normalized: str) -> bool:
        """Whether a normalized uri lies under a managed base."""
        return any(normalized.startswith(base + "/") for base in self.managed)

    def check(self, uri: str, *, column: str, row: int, managed: bool = False) -> str:
        """The normalized form of ``uri``, or :class:`ExternalBlobError` if not allowed
        (``managed``: the row hands the object to the table, which the message says)."""
        normalized, problem = self.resolve(uri)
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
        if self.table_root and _is_under(normalized, self.table_root):
            return "", (
                f"external uri {uri!r} lies inside the table; its own files cannot be "
                "external blobs (gc and compaction own them)"
            )
        if any(normalized.startswith(base + "/") for base in self.bases):
            return normalized, ""
        allowed = self.bases or "none (pass allowed_bases=[...] when creating the table)"
        return "", f"external uri {uri!r} is outside the table's allowed bases; allowed: {allowed}"


def table_settings(schema: pa.Schema | None) -> dict:
    """The table's own metadata (schema metadata key ``blobhouse``, JSON) as a dict; empty if
    there is none; :class:`TableMetadataError` if it is not a JSON object.

    >>> try:
    ...     table_settings(pa.schema([]).with_metadata({b"blobhouse": b"[1]"}))
    ... except TableMetadataError as error:
    ...     print(str(error).split(";")[0])
    the table's metadata key 'blobhouse' is damaged (not a JSON object: [1])
    """
    raw = (schema.metadata or {}).get(SETTINGS_KEY) if schema is not None else None
    if not raw:
        return {}
    try:
        settings = json.loads(raw)
    except ValueError:
        raise _damaged(f"not JSON: {raw[:60]!r}") from None
    if not isinstance(settings, dict):
        raise _damaged(f"not a JSON object: {raw[:60].decode(errors='replace')}")
    return settings


def _damaged(detail: str) -> TableMetadataError:
    return TableMetadataError(
        f"the table's metadata key 'blobhouse' is damaged ({detail}); another tool changed it. "
        "Reading an earlier version works (open_table(uri, version=...)); writes and "
        "set_properties refuse this one"
    )


# the stores Lance and blobhouse both reach (Lance 14 has no hdfs:// and no http(s):// store)
SCHEMES = ("file", "s3", "gs", "az", "abfs", "abfss")
# RFC 3986 characters kept as they are in a path; everything else is percent-encoded
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def local_uri(path: str) -> str:
    """The ``file://`` URI of a local path: absolute, special characters percent-encoded (so
    a literal ``%`` or space in a name survives the round trip through URI parsers).

    >>> local_uri("/data/my clips/50%.mp4")
    'file:///data/my%20clips/50%25.mp4'
    """
    return "file://" + quote(os.path.abspath(path), safe=PATH_SAFE)


def child_of(root: str, name: str) -> str:
    """The location of the object ``name`` (any characters but ``/``) under ``root``: the name
    percent-encoded in a URI, as it is under a local path.

    >>> child_of("s3://bucket/t", "50%.json"), child_of("/data/t", "50%.json")
    ('s3://bucket/t/50%25.json', '/data/t/50%.json')
    """
    return f"{root}/{quote(name, safe=PATH_SAFE) if '://' in root else name}"


def as_uri(location: str) -> str:
    """``location`` as a URI: URIs unchanged, local paths through :func:`local_uri`."""
    return location if "://" in location else local_uri(location)


def normalize_uri(uri: str) -> str:
    """An absolute URI in one canonical form, or :class:`InvalidInputError`: percent-encoding
    decoded, then ``.`` and ``..`` resolved (so an encoded ``%2e%2e`` cannot escape a prefix
    check), local symlinks resolved, the path re-encoded. Local paths become ``file://`` URIs.
    Refused: control characters, unsupported schemes, credentials, queries and fragments, and
    ``file://`` URIs naming a host.

    >>> normalize_uri("/a/b/../c")
    'file:///a/c'
    >>> normalize_uri("s3://bucket/media/%2e%2e/x.bin")
    's3://bucket/x.bin'
    """
    if not isinstance(uri, str) or not uri:
        raise InvalidInputError(f"empty or non-string uri {uri!r}")
    if _has_control(uri):
        raise InvalidInputError(f"uri {uri!r} contains control characters")
    parts = urlsplit(uri)
    if not parts.scheme:
        return local_uri(os.path.realpath(uri))
    if parts.scheme not in SCHEMES:
        raise InvalidInputError(
            f"uri {uri!r}: scheme {parts.scheme!r} is not supported (supported: {SCHEMES})"
        )
    if parts.query or parts.fragment or uri.endswith(("?", "#")):
        raise InvalidInputError(f"uri {uri!r} has a query or fragment")
    if "@" in parts.netloc:
        raise InvalidInputError(f"uri {uri!r} carries credentials; use storage_options")
    path = unquote(parts.path)
    if _has_control(path):
        raise InvalidInputError(f"uri {uri!r} encodes control characters")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidInputError(
                f"file uri {uri!r} names a host ({parts.netloc!r}); use file:///absolute/path"
            )
        if not path:
            raise InvalidInputError(f"empty path in uri {uri!r}")
        return local_uri(os.path.realpath(path))
    if not parts.netloc:
        raise InvalidInputError(f"uri {uri!r} has no bucket or host")
    path = posixpath.normpath("/" + path.lstrip("/")) if path else ""
    path = "" if path == "/" else quote(path, safe=PATH_SAFE)
    return f"{parts.scheme}://{parts.netloc}{path}"


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _checked_base(base: str, what: str = "allowed base") -> str:
    try:
        return normalize_uri(base).rstrip("/")
    except InvalidInputError as exc:
        raise InvalidInputError(f"{what} {base!r}: {exc}") from None


def _is_under(uri: str, prefix: str) -> bool:
    """Whether normalized ``uri`` is ``prefix`` or lies below it."""
    return uri == prefix or uri.startswith(prefix + "/")


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
