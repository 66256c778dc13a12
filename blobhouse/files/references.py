"""Resolved references: Lance blob descriptors turned into ``struct<uri, position, size, blake3>``.

A persisted descriptor (``kind, position, size, blob_id, blob_uri``) only makes sense next to the
data file that holds it: inline bytes sit at ``position`` of that file, packed and dedicated bytes
in ``data/<file-stem>/<blob_id>.blob``. The resolver knows which data file holds each fragment's
blob column and produces absolute references any process can read on its own.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset

from blobhouse.errors import BlobhouseError, DataFileError, ExternalBlobError, InvalidInputError
from blobhouse.files.digests import Digests
from blobhouse.files.ranges import RefColumns
from blobhouse.io.objects import StorageOptions, object_store
from blobhouse.io.uris import normalize_uri
from blobhouse.layout import DATA_FILE_NAME, BasePaths, TableLocation, sidecar_path
from blobhouse.placement import AllowedBases, Kind
from blobhouse.values import ColumnPath, numbers, path_name, validity

# numpy compares an array with a plain int ~8x faster than with an IntEnum member
_INLINE, _DEDICATED, _EXTERNAL = int(Kind.INLINE), int(Kind.DEDICATED), int(Kind.EXTERNAL)


def field_id(dataset: LanceDataset, path: ColumnPath) -> int:
    """Lance field id of the column at ``path``."""
    fields = dataset.lance_schema.fields()
    field = None
    for name in path:
        field = next((f for f in fields if f.name() == name), None)
        if field is None:
            raise BlobhouseError(f"no column {path_name(path)!r} in the table")
        fields = field.children()
    return field.id()


def leaf_field_ids(lance_fields) -> list[int]:
    """Field ids of the columns a data file stores, in file order (a blob column is one leaf)."""
    ids: list[int] = []
    for field in lance_fields:
        children = field.children()
        if children and "lance.blob.v2" not in field.metadata.values():
            ids.extend(leaf_field_ids(children))
        else:
            ids.append(field.id())
    return ids


def file_path(data_file) -> str:
    """A Lance ``DataFile``'s path. ``DataFile.path`` defines a class on every access (a
    callable str kept for compatibility, ~15 us): walking thousands of versions reads the
    plain value it wraps."""
    path = getattr(data_file, "_path", None)
    return path if isinstance(path, str) else str(data_file.path)


class ReferenceResolver:
    """Resolves descriptors of one dataset version into absolute references.

    Base paths are read where the table is now (:class:`~blobhouse.layout.BasePaths`), so a
    moved or copied table reads its own files, never those at its old place.
    """

    def __init__(
        self,
        dataset: LanceDataset,
        location: TableLocation,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.location = location
        self.storage_options = storage_options
        self._whole_sizes: dict[str, int | None] = {}  # external objects a row takes whole
        self.root_uri = location.root_uri
        self.base_paths = BasePaths(dataset, location)
        # external blobs whose blob_id names a base path live under it (the table's store)
        self._bases = {i: b.uri for i, b in self.base_paths.bases.items()}
        # and in the canonical form references are checked against (symlinks resolved)
        self._canonical_bases = {i: normalize_uri(base) for i, base in self._bases.items()}
        # a table written by another writer may hold anything: externals are checked on read
        self._allowed = AllowedBases.of_table(dataset.schema, self.root_uri, reading=True)
        self._externals: dict[tuple[int, str], str] = {}
        # (fragment, field id) -> (data file uri, the field's column in that file)
        self._files: dict[tuple[int, int], tuple[str, int]] = {}
        self._unreadable: dict[tuple[int, int], str] = {}
        self._file_sizes: dict[str, int] = {}  # data file uri -> its size as the manifest records
        self._data_dir = f"{location.dataset_uri}/data"
        self._located_files: dict[tuple[str, int | None], tuple[str, str | None]] = {}
        # each fragment's data files are looked at when a row of it is first resolved, not
        # all at once: a new version of a table of 2,000 fragments spent 16 ms here before
        # its first read of a few rows (pylance's whole take of them: 5 ms)
        self._dataset = dataset
        self._loaded: set[int] = set()

    def _load(self, fragment_id: int) -> None:
        """Note where fragment ``fragment_id``'s data files are, once (none: no such
        fragment; what asked says so)."""
        if fragment_id in self._loaded:
            return
        fragment = self._dataset.get_fragment(fragment_id)
        for data_file in fragment.metadata.files if fragment is not None else ():
            uri, problem = self._data_file(data_file)
            if problem is None and data_file.file_size_bytes:
                self._file_sizes[uri] = data_file.file_size_bytes
            columns = data_file.column_indices or range(len(data_file.fields))
            for field_id, column in zip(data_file.fields, columns, strict=False):
                key = (fragment_id, field_id)
                if problem is None:
                    self._files[key] = (uri, column)
                else:
                    self._unreadable[key] = problem
        self._loaded.add(fragment_id)  # after its entries: a reader in another thread sees all

    @property
    def fingerprint(self) -> tuple:
        """What resolving a fragment's descriptors depends on besides the fragment itself:
        where the table is read, its base paths as read from there, and the bases external
        blobs may live under (equal fingerprints resolve equal fragments alike)."""
        allowed = self._allowed
        return (
            self.location.dataset_uri,
            tuple(sorted((i, b.uri, b.is_dataset_root) for i, b in self.base_paths.bases.items())),
            tuple(allowed.bases),
            tuple(allowed.managed),
            allowed.damage,
        )

    def sized_from_objects(self, uris: Sequence[str]) -> bool:
        """Whether any of ``uris`` is an external object rows reference whole: resolving them
        asked the object its size, which the manifest does not hold (it may change or vanish
        while the manifest stays the same)."""
        return any(uri in self._whole_sizes for uri in uris)

    def _data_file(self, data_file) -> tuple[str, str | None]:
        """Where a data file of the manifest is: in this dataset's ``data/`` directory, or
        under a base path (a branch reading its parent's files); or why it cannot be read."""
        key = (file_path(data_file), data_file.base_id)
        if key not in self._located_files:
            self._located_files[key] = self._place(*key)
        return self._located_files[key]

    def _place(self, path: str, base_id: int | None) -> tuple[str, str | None]:
        if not DATA_FILE_NAME.fullmatch(path):
            return "", f"its data file path {path!r} is not a plain file name"
        if base_id is None:
            return f"{self._data_dir}/{path}", None
        base = self.base_paths.get(base_id)
        if base is None:
            return "", f"its data file names base path {base_id}, which is not registered"
        folder = f"{base.uri}/data" if base.is_dataset_root else base.uri
        return f"{folder}/{path}", None

    def locate(self, data_file) -> str:
        """The URI of one of the manifest's data files (Lance's ``DataFile``)."""
        uri, problem = self._data_file(data_file)
        if problem is not None:
            raise BlobhouseError(f"cannot read data file {data_file.path}: {problem}")
        return uri

    def data_file_uri(self, fragment_id: int, field_id: int) -> str:
        """The data file holding ``field_id`` in fragment ``fragment_id``."""
        return self._located(fragment_id, field_id)[0]

    def file_column(self, fragment_id: int, field_id: int) -> int:
        """The column of ``field_id`` inside its data file in fragment ``fragment_id`` (what
        the file's recorded checksums are keyed by: renames in the manifest never move it)."""
        return self._located(fragment_id, field_id)[1]

    def _located(self, fragment_id: int, field_id: int) -> tuple[str, int]:
        self._load(fragment_id)
        try:
            return self._files[(fragment_id, field_id)]
        except KeyError:
            problem = self._unreadable.get(
                (fragment_id, field_id), f"no data file holds field {field_id}"
            )
            raise BlobhouseError(f"fragment {fragment_id}: {problem}") from None

    def resolve(
        self,
        descriptors: pa.Array,
        row_addresses: pa.Array,
        field_id: int,
        column: str = "",
        unresolved: list[Unresolved] | None = None,
    ) -> pa.StructArray:
        """``REF_TYPE`` references for ``descriptors`` read at ``row_addresses`` (of blob
        ``column``, named in errors). With an ``unresolved`` list, an external reference that
        cannot be resolved (it escapes its base, lies outside the allowed bases) is appended
        to it and left null, instead of failing the whole batch: what verify and gc report."""
        return self._rows(descriptors, row_addresses, field_id, column, unresolved).to_arrow()

    def resolve_rows(
        self, descriptors: pa.Array, row_addresses: pa.Array, field_id: int, column: str = ""
    ) -> ResolvedRows:
        """:meth:`resolve` as the columns :mod:`blobhouse.files.ranges` reads (no Arrow array in
        between), with what finds each row's recorded hash."""
        if isinstance(descriptors, pa.ChunkedArray):
            descriptors = descriptors.combine_chunks()
        return ResolvedRows(
            self._rows(descriptors, row_addresses, field_id, column),
            numbers(descriptors.field("kind")),
            numbers(descriptors.field("blob_id")),
            np.asarray(row_addresses.to_numpy(zero_copy_only=False), np.uint64),
        )

    def _rows(
        self,
        descriptors: pa.Array,
        row_addresses: pa.Array,
        field_id: int,
        column: str,
        unresolved: list[Unresolved] | None = None,
    ) -> RefColumns:
        if isinstance(descriptors, pa.ChunkedArray):
            descriptors = descriptors.combine_chunks()
        valid = validity(descriptors)
        kinds, blob_ids = numbers(descriptors.field("kind")), numbers(descriptors.field("blob_id"))
        fragments = np.asarray(row_addresses.to_numpy(zero_copy_only=False)) >> 32
        where = _RowNames(column, row_addresses)
        unknown = valid & (kinds > _EXTERNAL)
        if unknown.any():  # before the keys below, whose 3 bits of kind it would overflow
            row = int(np.flatnonzero(unknown)[0])
            self._damaged(where, row, field_id, f"kind {kinds[row]} is no blob kind Lance has")
        # rows of one data file and sidecar share a URI: build each distinct URI once, keyed by
        # (fragment, kind, blob_id) packed into one integer; external rows by (their uri as
        # stored, blob_id), negated
        ids = np.where(kinds == _INLINE, 0, blob_ids).astype(np.int64)
        keys = (fragments.astype(np.int64) << 35) | (kinds.astype(np.int64) << 32) | ids
        external = valid & (kinds == _EXTERNAL)
        stored_uris: list[str] = []
        if external.any():
            rows = np.flatnonzero(external)
            encoded = pc.dictionary_encode(descriptors.field("blob_uri").take(pa.array(rows)))
            stored_uris = [u or "" for u in encoded.dictionary.to_pylist()]
            at = np.asarray(encoded.indices.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
            keys[rows] = -1 - ((at << 32) | ids[rows])
        unique, first, codes = np.unique(keys[valid], return_index=True, return_inverse=True)
        first = np.flatnonzero(valid)[first]
        uris, failed = [], []
        for key, row in zip(unique.tolist(), first.tolist(), strict=True):
            try:
                uris.append(self._uri_of_key(key, field_id, stored_uris, where, row))
            except BlobhouseError as exc:
                if unresolved is None or key >= 0:
                    raise
                failed.append((len(uris), stored_uris[(-1 - key) >> 32], str(exc)))
                uris.append("")
        row_codes = np.zeros(len(descriptors), dtype=np.int64)
        row_codes[valid] = codes.reshape(-1)
        if failed:  # every row of an unresolved reference is reported and left null
            valid = valid.copy()
            for code, uri, reason in failed:
                rows = np.flatnonzero(valid & (row_codes == code))
                unresolved.extend(Unresolved(row, uri, reason) for row in rows.tolist())
                valid[rows] = False
        positions, sizes = (
            numbers(descriptors.field("position")),
            numbers(descriptors.field("size")),
        )
        whole = valid & external & (positions == 0) & (sizes == 0)
        if whole.any():  # Lance's writers record a whole external object as (0, 0)
            sizes, valid = self._whole_objects(uris, row_codes, whole, sizes, valid, unresolved)
        self._check_places(uris, row_codes, kinds, positions, sizes, valid, where, field_id)
        return RefColumns(
            uris,
            row_codes,
            np.where(kinds == _DEDICATED, 0, positions).astype(np.int64),
            sizes.astype(np.int64),
            valid,
        )

    def _check_places(
        self,
        uris: list[str],
        codes: np.ndarray,
        kinds: np.ndarray,
        positions: np.ndarray,
        sizes: np.ndarray,
        valid: np.ndarray,
        where: _RowNames,
        field_id: int,
    ) -> None:
        """A :class:`DataFileError` naming the first row whose descriptor cannot be what a
        writer stored (garbled in the data file: Lance keeps no page checksums), before a read
        asks for its bytes (a garbled size made reads allocate petabytes)."""
        positions, sizes = positions.astype(np.uint64), sizes.astype(np.uint64)
        ends = positions + sizes
        # beyond 2^63 no file reaches; an end below its start wrapped around
        huge = valid & ((ends >= np.uint64(1 << 63)) | (ends < positions))
        damaged = huge.copy()
        inline = valid & (kinds == _INLINE) & ~huge
        if inline.any():  # inline bytes lie in the data file, whose size the manifest has
            known = np.array([self._file_sizes.get(uri, 1 << 63) for uri in uris], np.uint64)
            damaged |= inline & (ends > known[codes])
        if not damaged.any():
            return
        row = int(np.flatnonzero(damaged)[0])
        size = self._file_sizes.get(uris[codes[row]], 0)
        past = "any file's end" if huge[row] else f"the end of its {size:,}-byte data file"
        self._damaged(
            where, row, field_id, f"it names bytes [{positions[row]}, +{sizes[row]}), past {past}"
        )

    def _damaged(self, where: _RowNames, row: int, field_id: int, reason: str) -> NoReturn:
        """Raise the :class:`DataFileError` of a row whose blob descriptor is damaged."""
        column, fragment, offset = where.of(row)
        self._load(fragment)
        uri = self._files.get((fragment, field_id), ("",))[0]
        raise DataFileError(
            f"blob column {column!r}, fragment {fragment} row {offset}: its blob descriptor in "
            f"data file {uri or '(unknown)'} is damaged: {reason}",
            uri,
        )

    def _whole_objects(
        self,
        uris: list[str],
        row_codes: np.ndarray,
        whole: np.ndarray,
        sizes: np.ndarray,
        valid: np.ndarray,
        unresolved: list[Unresolved] | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``sizes`` with each ``whole`` row's the size of its object, as stock Lance reads
        it (a missing object: :class:`~blobhouse.errors.ExternalBlobError`, or with an
        ``unresolved`` list, the rows reported and left null)."""
        sizes, valid = sizes.astype(np.int64), valid.copy()
        for code in np.unique(row_codes[whole]).tolist():
            uri = uris[code]
            if uri not in self._whole_sizes:
                self._whole_sizes[uri] = object_store(uri, self.storage_options).size(uri)
            rows = whole & (row_codes == code)
            if self._whole_sizes[uri] is not None:
                sizes[rows] = self._whole_sizes[uri]
                continue
            reason = f"external object {uri} does not exist (the row references it whole)"
            if unresolved is None:
                raise ExternalBlobError(reason)
            unresolved.extend(Unresolved(row, uri, reason) for row in np.flatnonzero(rows))
            valid[rows] = False
        return sizes, valid

    def _uri_of_key(
        self, key: int, field_id: int, stored_uris: list[str], where: _RowNames, row: int
    ) -> str:
        if key < 0:  # (index of the stored uri << 32 | blob_id), negated
            key = -1 - key
            return self._external(key & 0xFFFFFFFF, stored_uris[key >> 32], where, row)
        return self._uri((key >> 32) & 7, key >> 35, field_id, key & 0xFFFFFFFF)

    def _external(self, blob_id: int, blob_uri: str | None, where: _RowNames, row: int) -> str:
        """The checked absolute uri of an external blob: under its base path, or under one of
        the table's allowed bases, never inside the table except in a base (its store)."""
        key = (blob_id, blob_uri or "")
        if key not in self._externals:
            self._externals[key] = self._checked_external(blob_id, blob_uri or "", where, row)
        return self._externals[key]

    def _checked_external(self, blob_id: int, blob_uri: str, where: _RowNames, row: int) -> str:
        column, fragment, offset = where.of(row)
        if blob_id and blob_id in self._bases:  # 0: no base (an absolute uri)
            # read as a URI path (percent-encoding decoded, as object stores do), spelled like
            # the base (gc matches references to files by it), checked in the canonical form
            base = self._bases[blob_id]
            uri = f"{base}/{posixpath.normpath(blob_uri)}"
            try:
                inside = normalize_uri(uri).startswith(self._canonical_bases[blob_id] + "/")
            except InvalidInputError:
                inside = False
            if not inside or posixpath.isabs(blob_uri):
                raise ExternalBlobError(
                    f"blob column {column!r}, fragment {fragment} row {offset}: external uri "
                    f"{blob_uri!r} escapes its base path {base}"
                )
            return uri
        if "://" in blob_uri or posixpath.isabs(blob_uri):
            uri, problem = self._allowed.resolve(blob_uri)
            if problem:
                raise ExternalBlobError(
                    f"blob column {column!r}, fragment {fragment} row {offset}: {problem}"
                )
            return uri
        raise BlobhouseError(
            f"blob column {column!r}, fragment {fragment} row {offset}: cannot resolve the "
            f"relative external uri {blob_uri!r} (no base path with id {blob_id})"
        )

    def _uri(self, kind: int, fragment_id: int, field_id: int, blob_id: int) -> str:
        if kind == Kind.INLINE:
            return self.data_file_uri(fragment_id, field_id)
        if kind in (Kind.PACKED, Kind.DEDICATED):
            data_file = self.data_file_uri(fragment_id, field_id)
            return sidecar_path(data_file, blob_id)
        raise BlobhouseError(
            f"fragment {fragment_id}: cannot resolve a blob descriptor of kind {kind}; "
            "blobhouse resolves inline, packed, dedicated and external blobs"
        )


@dataclass(frozen=True)
class ResolvedRows:
    """Rows of a blob column ready to read: their references, and what their recorded hashes
    are found by (each row's descriptor kind and blob id, and its row address). ``recorded``
    holds the recorded hashes of the rows ``looked`` marks (None: of every row), where they
    were looked up already: rows kept in memory carry theirs, so a checked read of them
    opens no data file's list again."""

    refs: RefColumns
    kinds: np.ndarray
    blob_ids: np.ndarray
    addresses: np.ndarray
    recorded: Digests | None = None
    looked: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.addresses)

    def take(self, rows: np.ndarray) -> ResolvedRows:
        """The rows at ``rows`` (indices into these)."""
        return ResolvedRows(
            self.refs.take(rows),
            self.kinds[rows],
            self.blob_ids[rows],
            self.addresses[rows],
            self.recorded.take(rows) if self.recorded is not None else None,
            self.looked[rows] if self.looked is not None else None,
        )

    def with_recorded(self, recorded: Digests) -> ResolvedRows:
        """These rows carrying ``recorded``, the recorded hash of every row."""
        if len(recorded) != len(self):
            raise ValueError(f"{len(recorded)} recorded hashes for {len(self)} rows")
        return dataclasses.replace(self, recorded=recorded, looked=None)

    def without_recorded(self) -> ResolvedRows:
        """These rows carrying no recorded hash."""
        return dataclasses.replace(self, recorded=None, looked=None)

    @staticmethod
    def concat(parts: Sequence[ResolvedRows]) -> ResolvedRows:
        """``parts`` one after the other."""
        recorded = looked = None
        if any(p.recorded is not None for p in parts):
            recorded = Digests.concat(
                [p.recorded if p.recorded is not None else Digests.none(len(p)) for p in parts]
            )
            looked = np.concatenate([_looked(p) for p in parts])
            looked = None if looked.all() else looked
        return ResolvedRows(
            RefColumns.concat([p.refs for p in parts]),
            np.concatenate([p.kinds for p in parts]),
            np.concatenate([p.blob_ids for p in parts]),
            np.concatenate([p.addresses for p in parts]),
            recorded,
            looked,
        )


def _looked(rows: ResolvedRows) -> np.ndarray:
    """Which of ``rows`` carry their recorded hash."""
    if rows.looked is not None:
        return rows.looked
    return np.full(len(rows), rows.recorded is not None)


@dataclass(frozen=True)
class Unresolved:
    """A reference that could not be resolved: its ``row`` in the batch, the ``uri`` it
    names (as stored) and why."""

    row: int
    uri: str
    reason: str


class _RowNames:
    """Names a row of a batch being resolved in errors: column, fragment, row offset."""

    def __init__(self, column: str, row_addresses: pa.Array) -> None:
        self.column = column
        self.addresses = row_addresses

    def of(self, row: int) -> tuple[str, int, int]:
        address = self.addresses[row].as_py()
        return self.column, address >> 32, address & 0xFFFFFFFF
