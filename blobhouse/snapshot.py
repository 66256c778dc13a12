"""TableSnapshot: one version of a table -- the state every service, change and Spark task works on.

A snapshot is the dataset at one version, where the table lives (:class:`TableLocation`) and the
storage options, plus what is read from them on demand and cached: the schema, the blob
columns, the reference resolver and the recorded hashes. It never changes: a change commits a
new version, and its caller takes a new snapshot of it. :class:`blobhouse.table.Table`, the
public facade, holds one and moves to the next (PyIceberg's ``TableMetadata`` under its
``Table``). Opening one (:func:`open_snapshot`) also says precisely why there is no table, or
no such version, at a place.

>>> import tempfile, pyarrow as pa
>>> from blobhouse import blob_array, write_table
>>> uri = tempfile.mkdtemp() + "/t"
>>> _ = write_table(pa.table({"img": blob_array([b"x", b"x"])}), uri)
>>> snapshot = open_snapshot(TableLocation.of(uri))
>>> snapshot.version, snapshot.blob_columns
(1, ['img'])
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, TypeVar
from urllib.parse import urlsplit

import lance
import numpy as np
import pyarrow as pa
from lance import LanceDataset
from lance.fragment import DataFile

from blobhouse.columns import check_blob_column, check_column_names, name_problem
from blobhouse.errors import (
    BlobhouseError,
    ColumnNameError,
    DataFileError,
    InvalidInputError,
    MovedTableWarning,
    NotATableError,
    PathIsFileError,
    PathNotFoundError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionRemovedError,
    as_store_error,
    is_damaged_file_error,
    is_not_found_error,
    lance_io,
    lance_message,
)
from blobhouse.files.checksums import RecordedHashes
from blobhouse.files.digests import Digests
from blobhouse.files.footer import MISSING, data_file_problem
from blobhouse.files.references import ReferenceResolver, ResolvedRows, Unresolved, field_id
from blobhouse.io.objects import (
    MISSING_BUCKET,
    check_answers,
    checked_options,
    is_local,
    object_store,
    while_answering,
)
from blobhouse.kept_references import KeptReferences
from blobhouse.layout import VERSIONS_DIR, BasePaths, TableLocation
from blobhouse.placement import AllowedBases
from blobhouse.properties import TableProperties
from blobhouse.store.index import StoreIndex
from blobhouse.store.packs import store_uri_prefix
from blobhouse.values import ColumnPath, path_name, stored_blob_columns

R = TypeVar("R")


class TableSnapshot:
    """A table at one version: its dataset, location and storage options, and what is derived
    from them (read once, then cached). Services take one; nothing here commits."""

    def __init__(
        self,
        dataset: LanceDataset,
        location: TableLocation,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.dataset = dataset
        self.location = location
        self.uri = location.root_uri  # references into the table's files start with it
        self.storage_options = storage_options
        self._field_ids: dict[ColumnPath, int] = {}
        self._kept: dict[ColumnPath, KeptReferences] = {}

    def __repr__(self) -> str:
        branch = f", branch={self.branch!r}" if self.branch else ""
        return f"TableSnapshot({self.uri!r}{branch}, version={self.version})"

    @cached_property
    def schema(self) -> pa.Schema:
        """The table's Lance schema (blob columns as Lance blob fields)."""
        # a name holding NUL (another tool's rename) cannot be exported to Arrow: Lance
        # panics, printing to stderr first; looked for in its own schema (11 us), before
        names = [n for n in _lance_names(self.dataset.lance_schema.fields()) if "\0" in n]
        if names:
            problem = name_problem(names[0])
            raise ColumnNameError(
                f"table {self.uri}: column name {names[0]!r} {problem}; {self._restore_hint()}"
            )
        return self.dataset.schema  # rebuilt by Lance on every access

    @property
    def version(self) -> int:
        return self.dataset.version

    @property
    def branch(self) -> str | None:
        """The branch this version is on (None: main)."""
        return self.location.branch

    @cached_property
    def blob_paths(self) -> list[ColumnPath]:
        """Paths of the blob columns (walking the schema costs ~30 us per read)."""
        return stored_blob_columns(self.schema)

    @property
    def blob_columns(self) -> list[str]:
        """Names of the blob columns (``parent.child`` inside structs)."""
        return [path_name(p) for p in self.blob_paths]

    @property
    def allowed_bases(self) -> list[str]:
        """URI prefixes external blobs of this table may live under."""
        return AllowedBases.of_table(self.schema).bases

    @property
    def managed_bases(self) -> list[str]:
        """The allowed bases whose objects the table takes ownership of once referenced."""
        return AllowedBases.of_table(self.schema).managed

    @property
    def properties(self) -> TableProperties:
        """The table's write settings as this version's manifest records them."""
        return TableProperties.of(self.dataset, self.schema)

    def count_rows(self, filter: str | None = None) -> int:
        return self.dataset.count_rows(filter)

    def versions(self) -> list[dict]:
        """Every version of this branch (``version``, ``timestamp``, ``metadata``)."""
        return self.dataset.versions()

    def tags(self) -> dict[str, dict]:
        """Every tag of the table: name -> ``{"branch", "version"}`` (branch None: main)."""
        return {
            name: {"branch": tag["branch"], "version": tag["version"]}
            for name, tag in self.dataset.tags.list().items()
        }

    def branches(self) -> dict[str, dict]:
        """Every branch of the table: name -> ``{"parent_branch", "parent_version"}``."""
        return {
            name: {"parent_branch": b["parent_branch"], "parent_version": b["parent_version"]}
            for name, b in self.dataset.branches.list().items()
        }

    def checkout(self, version: int | str | None, *, branch: str | None = None) -> TableSnapshot:
        """This table at another version (a tag; None: the latest) of its branch, or of
        ``branch`` ("main" for main)."""
        location = self.location
        if branch is not None:
            location = TableLocation.of(location.root, branch, self.storage_options)
        return open_snapshot(location, version, self.storage_options)

    def on_version(self, branch: str | None, version: int) -> TableSnapshot:
        """This table at ``version`` of ``branch`` (None: main): itself when it is there
        already; a version whose column names Lance cannot read is refused, saying why and the
        way out (as for every retained version a service reads)."""
        if (self.branch, self.version) == (branch, version):
            return self
        opened = self.checkout(version, branch=branch or "main")
        opened.check_column_names(retained=True)
        return opened

    def latest(self) -> TableSnapshot:
        """The latest version of this branch (this snapshot if nothing committed since)."""
        latest = open_dataset(self.location, None, self.storage_options)
        if latest is None:
            raise not_found(self.location, None, self.storage_options)
        return self if latest.version == self.version else self.at(latest)

    def at(self, dataset: LanceDataset) -> TableSnapshot:
        """This table at ``dataset``'s version (a dataset a commit returned: no re-open)."""
        return TableSnapshot(dataset, self.location, self.storage_options)

    def reopened(self) -> TableSnapshot:
        """This version in a new dataset object, with nothing of this one's state: Lance keeps
        ~26 KB for every data file a dataset has scanned for as long as the dataset lives (a
        scan of 2,000 fragments through one dataset: +53 MB), and dropping the dataset frees
        it. See :func:`in_fresh_datasets`."""
        dataset = open_dataset(self.location, self.version, self.storage_options)
        if dataset is None:
            raise not_found(self.location, self.version, self.storage_options)
        return self.at(dataset)

    @property
    def moved_from(self) -> str | None:
        """The root this version's manifest records for the table's store, when the table was
        copied or moved from there and not relocated yet (None: in place)."""
        bases = self.resolver.base_paths
        return bases.recorded_root if bases.store_moved else None

    @cached_property
    def resolver(self) -> ReferenceResolver:
        """Resolves this version's stored descriptors into references."""
        return ReferenceResolver(self.dataset, self.location, self.storage_options)

    def recorded_hashes(self, shared: bool = True) -> RecordedHashes:
        """The blake3 recorded for this table's stored payloads (loaded as they are needed):
        each data file's list loaded once for the process (``shared``), or read from the files
        again (what a check of the files themselves needs)."""
        return self._recorded_hashes if shared else self._new_recorded_hashes(shared=False)

    @cached_property
    def _recorded_hashes(self) -> RecordedHashes:
        return self._new_recorded_hashes(shared=True)

    def _new_recorded_hashes(self, shared: bool) -> RecordedHashes:
        root, options = self.location.root, self.storage_options
        store = (store_uri_prefix(self.uri), lambda: StoreIndex.open(root, options))
        return RecordedHashes(options, store, shared=shared)

    def resolve_refs(
        self,
        path: ColumnPath,
        descriptors: pa.Array,
        row_addresses: pa.Array,
        unresolved: list[Unresolved] | None = None,
    ) -> pa.StructArray:
        """Resolved references ``struct<uri, position, size, blake3>`` of blob column
        ``path``, from its stored descriptors and the row addresses (``_rowaddr``) they were
        read at (with an ``unresolved`` list: external references that cannot be resolved go
        there, as nulls; see :meth:`ReferenceResolver.resolve`)."""
        return self.resolver.resolve(
            descriptors, row_addresses, self.field_id(path), path_name(path), unresolved
        )

    def rows_at(
        self, path: ColumnPath, positions: list[int], recorded: bool = False
    ) -> ResolvedRows:
        """Blob column ``path`` at ``positions`` (among the live rows, checked in range),
        resolved: from Lance's take or, for fragments read often, from memory
        (:mod:`blobhouse.kept_references`); with ``recorded``, carrying their recorded
        hashes (what a checked read needs: kept rows keep theirs)."""
        return self._kept_references(path).take(positions, recorded)

    def rows_by_id(self, path: ColumnPath, ids: np.ndarray, recorded: bool = False) -> ResolvedRows:
        """Blob column ``path`` at row ``ids`` of a version without stable row ids (ids are
        row addresses), resolved as :meth:`rows_at` does; IndexError for an id that is not a
        row of this version."""
        return self._kept_references(path).take_ids(ids, recorded)

    def resolve_rows(
        self, path: ColumnPath, descriptors: pa.Array, row_addresses: pa.Array
    ) -> ResolvedRows:
        """:meth:`resolve_refs` as the columns reads are planned from, with what finds each
        row's recorded hash (:class:`~blobhouse.files.references.ResolvedRows`)."""
        return self.resolver.resolve_rows(
            descriptors, row_addresses, self.field_id(path), path_name(path)
        )

    def _kept_references(self, path: ColumnPath) -> KeptReferences:
        kept = self._kept.get(path)
        if kept is None:
            kept = self._kept.setdefault(
                path,
                KeptReferences(
                    self.dataset,
                    path,
                    functools.partial(self.lance_read, "read blobs of"),
                    lambda descriptors, addresses: self.resolve_rows(path, descriptors, addresses),
                    scope=(path, self.field_id(path), self.resolver.fingerprint),
                    own=lambda rows: self.resolver.sized_from_objects(rows.refs.uris),
                    recorded=functools.partial(self._recorded_of, path),
                ),
            )
        return kept

    def _recorded_of(self, path: ColumnPath, rows: ResolvedRows) -> Digests:
        """The recorded hashes of ``rows`` of blob column ``path``, from their data files."""
        return self.lance_read(
            "read blobs of",
            lambda: self.recorded_hashes().expected(
                self.file_column(path), rows, self.data_file_of(path)
            ),
        )

    def file_column(self, path: ColumnPath) -> Callable[[int], int]:
        """For blob column ``path``: fragment id -> the column it is in that fragment's data
        file (what recorded inline hashes are keyed by)."""
        resolver, field = self.resolver, self.field_id(path)
        return lambda fragment_id: resolver.file_column(fragment_id, field)

    def data_file_of(self, path: ColumnPath) -> Callable[[int], str]:
        """For blob column ``path``: fragment id -> the data file holding it in that fragment
        (where its rows' recorded hashes are)."""
        resolver, field = self.resolver, self.field_id(path)
        return lambda fragment_id: resolver.data_file_uri(fragment_id, field)

    def data_file_uri(self, data_file: DataFile) -> str:
        """Where one of this version's data files is (in this branch's ``data/``, or under a
        base path: a branch reading its parent's files)."""
        return self.resolver.locate(data_file)

    def damaged_data_files(self, every_version: bool = False) -> dict[str, str]:
        """This version's data files (with ``every_version``, those of every version of its
        branch: what stats and gc walk) that Lance cannot read -> why: missing, not the size
        the manifest records, or a damaged footer (:func:`~blobhouse.files.footer.
        data_file_problem`). Every file is checked, on a few threads: what a read that met
        damaged bytes runs to name the file."""
        files: dict[str, int | None] = {}
        problems: dict[str, str] = {}
        versions = [v["version"] for v in self.versions()] if every_version else [self.version]
        for version in versions:
            at = self if version == self.version else self.checkout(version)
            for fragment in at.dataset.get_fragments():
                for data_file in fragment.metadata.files:
                    try:
                        files[at.data_file_uri(data_file)] = data_file.file_size_bytes
                    except BlobhouseError as exc:  # its path cannot be a file of this table
                        problems[data_file.path] = str(exc)
        options = self.storage_options

        def check(item: tuple[str, int | None]) -> str | None:
            return data_file_problem(item[0], options, item[1])

        with ThreadPoolExecutor(max_workers=8) as pool:
            for uri, problem in zip(files, pool.map(check, files.items()), strict=True):
                if problem is not None:
                    problems[uri] = problem
        return problems

    @cached_property
    def _name_problem(self) -> str | None:
        try:
            check_column_names(self.schema, f"table {self.uri}", reserved=False)
        except ColumnNameError as exc:
            return str(exc)
        return None

    def _restore_hint(self) -> str:
        """The repair of a version with a column Lance can neither read, rename nor drop (an
        empty name, one holding NUL): the newest version before it, made the latest again."""
        for version in sorted((v["version"] for v in self.dataset.versions()), reverse=True):
            if version >= self.version:
                continue
            fields = self.dataset.checkout_version(version).lance_schema.fields()
            if all(n and "\0" not in n for n in _lance_names(fields)):
                return (
                    "Lance can neither rename nor drop such a column: make the newest version "
                    f"without it the latest again, lance.dataset({self.uri!r}, "
                    f"version={version}).restore() (version {version}, the newest without it; "
                    "a new version, nothing rewritten)"
                )
        return (
            "Lance can neither rename nor drop such a column, and no earlier version is "
            "without it: copy the other columns into a new table"
        )

    def check_column_names(self, *, retained: bool = False) -> None:
        """Refuse to read a version whose schema another tool gave a column name Lance cannot
        address (``_rowid``, ``""``, one with a backtick, a name twice): Lance's own reads of
        it fail (a panic, a missing field). A :class:`~blobhouse.errors.ColumnNameError`
        names the column, the rule, and the repair: a rename, or for an older version
        (``retained``: one verify or gc walks) its removal. Checked once per snapshot."""
        if self._name_problem is None:
            return
        if retained:
            raise ColumnNameError(
                f"{self._name_problem} (version {self.version}, which the table retains): "
                "Lance cannot read that version; gc removes it once it is out of the "
                "retention (`blobhouse gc <table> --retain-versions 1 --older-than-hours 0` "
                "removes it now)"
            )
        if any(not n for n in _lance_names(self.dataset.lance_schema.fields())):
            raise ColumnNameError(f"{self._name_problem}; {self._restore_hint()}")
        raise ColumnNameError(
            f"{self._name_problem}; rename it first (Table.alter_columns({{'path': ..., "
            "'name': ...}) reaches it: a new manifest, nothing rewritten), then read again"
        )

    def lance_read(self, doing: str, read: Callable[[], R]) -> R:
        """``read()``, a read of this version by Lance (:func:`lance_read`): a data file
        whose bytes Lance finds damaged is named (:meth:`damaged_data_files`)."""
        return lance_read(self.uri, self.storage_options, doing, read, self.damaged_data_files)

    def field_id(self, path: ColumnPath) -> int:
        """The Lance field id of column ``path``."""
        # Lance rebuilds its schema object on every access: look each column up once
        if path not in self._field_ids:
            self._field_ids[path] = field_id(self.dataset, path)
        return self._field_ids[path]

    def blob_path(self, column: str, what: str) -> ColumnPath:
        """The path of blob column ``column`` (``parent.child`` inside a struct); any other
        name is refused, naming the closest blob column (``what``: the API it was given to)."""
        names = self.blob_columns
        return self.blob_paths[names.index(check_blob_column(column, names, what))]


def open_snapshot(
    location: TableLocation | str | os.PathLike,
    version: int | str | None = None,
    storage_options: dict[str, str] | None = None,
    *,
    branch: str | None = None,
) -> TableSnapshot:
    """The table at ``location`` (a :class:`TableLocation` resolved earlier, or a URI and a
    ``branch``) at ``version`` (a number or a tag; None: the latest), as the state every
    service works on (:func:`blobhouse.open_table` wraps it in a :class:`~blobhouse.Table`)."""
    if not isinstance(location, TableLocation):  # a URI or a path
        storage_options = checked_options(storage_options)
        location = TableLocation.of(location, branch, storage_options)
    if isinstance(version, str):
        location, version = resolve_tag(location, version, storage_options)
    elif version is not None:
        version = version_number(version)
    dataset = open_dataset(location, version, storage_options)
    if dataset is None:
        raise not_found(location, version, storage_options)
    if location.branch is not None and (bases := BasePaths(dataset, location)).moved:
        raise BlobhouseError(
            f"branch {location.branch!r} of {location.root} was made when the table was at "
            f"{bases.recorded_root}: Lance records a branch's parent as that absolute path and "
            "cannot rewrite it, so the branch reads its parent's files there, not here. Delete "
            f"the branch here (lance.dataset({location.root!r}).branches.delete(...)) and make "
            "it again, or read it at the old place"
        )
    if version is None:  # older versions name the old place even after a relocation
        _warn_if_moved(dataset, location)
    return TableSnapshot(dataset, location, storage_options)


_WARNED_MOVED: set[str] = set()


def _warn_if_moved(dataset: LanceDataset, location: TableLocation) -> None:
    """Warn once per process that a copied or moved table sends stock readers elsewhere."""
    if location.root in _WARNED_MOVED:
        return
    bases = BasePaths(dataset, location)
    if bases.store_moved:
        _WARNED_MOVED.add(location.root)
        warnings.warn(
            f"table {location.root} was copied or moved from {bases.recorded_root}: blobhouse "
            "reads its own files, but stock Lance readers (pylance, LanceDB) read its store at "
            "the old place until the first blobhouse write or `blobhouse relocate "
            f"{location.root}` (Table.relocate())",
            MovedTableWarning,
            stacklevel=3,
        )


def not_found(
    location: TableLocation, version: int | None, storage_options: dict[str, str] | None
) -> TableNotFoundError:
    """Why there is no table at ``location`` (at ``version``): the path, or the version."""
    root = location.root
    if location.branch is None or "://" in root:
        problem = path_problem(root)
        if problem is not None:
            return problem
    latest = open_dataset(location, None, storage_options) if version is not None else None
    where = f"branch {location.branch!r} of " if location.branch else ""
    if latest is None:
        if location.branch is not None:
            return TableNotFoundError(f"no branch {location.branch!r} in {root}")
        return missing_bucket(root, storage_options) or TableNotFoundError(f"no table at {root}")
    retained = [v["version"] for v in latest.versions()]
    if version > latest.version:
        return VersionNotFoundError(
            f"{where}{root} has no version {version}: it never existed (the latest is "
            f"{latest.version})"
        )
    return VersionRemovedError(
        f"version {version} of {where}{root} was removed by cleanup (gc); the oldest retained "
        f"version is {min(retained)} (retained: {', '.join(version_spans(retained))})"
    )


def missing_bucket(uri: str, storage_options: dict[str, str] | None) -> TableNotFoundError | None:
    """A :class:`PathNotFoundError` when the bucket or container of a store's ``uri`` is not
    there (one listing of it); None when it is, or ``uri`` is local."""
    if "://" not in uri or is_local(uri):
        return None
    parts = urlsplit(uri)
    try:
        next(
            iter(object_store(uri, storage_options).walk(f"{parts.scheme}://{parts.netloc}/")), None
        )
    except FileNotFoundError as exc:
        code = MISSING_BUCKET.search(str(exc))
        return PathNotFoundError(
            f"no table at {uri}: its bucket or container {parts.netloc!r} does not exist"
            + (f" ({code[1]})" if code else "")
        )
    except Exception:  # any other answer: the table is what is missing
        return None
    return None


def path_problem(path: str) -> TableNotFoundError | None:
    """What is wrong with a local ``path`` that should hold a table, if anything is."""
    if "://" in path:
        return None
    in_the_way = file_in_the_way(path)
    if in_the_way is not None:
        return PathIsFileError(f"{path} is not a table: {in_the_way}; a table is a folder")
    if not os.path.exists(path):
        return PathNotFoundError(f"no table at {path}: no such file or folder")
    if not os.path.isdir(os.path.join(path, VERSIONS_DIR)):
        entries = sorted(os.listdir(path))
        what = "an empty folder" if not entries else f"a folder of {listing(entries)}"
        return NotATableError(f"{path} is not a table: it is {what} (no _versions/)")
    return None


def file_in_the_way(path: str) -> str | None:
    """``"it is a file"`` or which folder above ``path`` is a file, if one is."""
    if os.path.isfile(path):
        return "it is a file"
    while (parent := os.path.dirname(path)) != path:
        if os.path.isfile(parent):
            return f"{parent}, a folder above it, is a file"
        path = parent
    return None


def listing(entries: list[str], shown: int = 3) -> str:
    more = f" and {len(entries) - shown} more" if len(entries) > shown else ""
    return ", ".join(entries[:shown]) + more


def version_number(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise InvalidInputError(f"version must be a number or a tag name, got {version!r}")
    number = int(version)
    if not 1 <= number < 2**63:
        raise InvalidInputError(f"versions are numbered from 1 (a 64-bit number), got {version!r}")
    return number


def resolve_tag(
    location: TableLocation, tag: str, storage_options: dict[str, str] | None
) -> tuple[TableLocation, int]:
    """The branch and version tag ``tag`` points at; a string of digits that names no tag is
    a version number."""
    found = location.tag(tag, storage_options)
    if found is None:
        if tag.isdigit():
            return location, version_number(tag)
        if not location.on(None).listed_versions(storage_options):
            raise TableNotFoundError(f"no table at {location.root}")
        tags = location.tag_names(storage_options)
        raise TableNotFoundError(f"no tag {tag!r} in {location.root} (tags: {tags or 'none'})")
    if location.branch is not None and found.branch != location.branch:
        raise InvalidInputError(
            f"tag {tag!r} points into {'main' if found.branch is None else repr(found.branch)}, "
            f"not branch {location.branch!r}"
        )
    return location.on(found.branch), found.version


#: fragments a walk over one version scans through one dataset object before it opens the
#: version again (:func:`in_fresh_datasets`): an open costs about what scanning a few
#: fragments does, and what Lance keeps per scanned file stays under ~7 MB
FRAGMENTS_PER_DATASET = 256


def in_fresh_datasets(
    table: TableSnapshot, fragment_ids: Sequence[int], per: int | None = None
) -> Iterator[tuple[TableSnapshot, Sequence[int]]]:
    """``fragment_ids`` in order, in runs of ``per`` (default :data:`FRAGMENTS_PER_DATASET`),
    each with the version to scan them in: ``table`` for the first run, a new dataset object
    for each later one (:meth:`TableSnapshot.reopened`), so that a walk over every fragment
    holds Lance's state of one run's files at a time, not of every file it scanned.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for i in range(3):
    ...     t = write_table(pa.table({"b": blob_array([b"x"])}), uri, mode="append")
    >>> first = t.snapshot
    >>> [(at is first, list(ids)) for at, ids in in_fresh_datasets(first, [0, 1, 2], per=2)]
    [(True, [0, 1]), (False, [2])]
    """
    per = per or FRAGMENTS_PER_DATASET
    for start in range(0, len(fragment_ids), per):
        yield (table if start == 0 else table.reopened()), fragment_ids[start : start + per]


def one_more_fragment(opened: TableSnapshot, scanned: int) -> tuple[TableSnapshot, int]:
    """For a walk that meets fragments one by one: the snapshot to scan one more fragment of
    ``opened``'s version through, and how many that one will have scanned (``scanned``: so
    far): ``opened`` until it has scanned :data:`FRAGMENTS_PER_DATASET`, then the version in a
    new dataset object (:func:`in_fresh_datasets` does the same by runs)."""
    if scanned >= FRAGMENTS_PER_DATASET:
        return opened.reopened(), 1
    return opened, scanned + 1


def open_dataset(
    location: TableLocation,
    version: int | None,
    storage_options: dict[str, str] | None,
    doing: str = "open",
) -> LanceDataset | None:
    """The dataset at ``location`` (None: there is none); a store that does not answer, or
    fails, raises :class:`~blobhouse.errors.StoreError` saying what was being ``doing``."""
    path = location.dataset_path
    if "://" not in path and not os.path.isdir(os.path.join(path, VERSIONS_DIR)):
        return None
    check_answers(path, storage_options, doing)
    try:
        return while_answering(
            path,
            storage_options,
            lambda: lance.dataset(path, version=version, storage_options=storage_options),
            doing,
        )
    except (ValueError, OSError) as exc:
        if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
            return None
        error = as_store_error(exc, path, doing)
        if error is exc:
            raise
        raise error from exc


def lance_read(
    uri: str,
    options: dict[str, str] | None,
    doing: str,
    read: Callable[[], R],
    damaged: Callable[[], dict[str, str]] | None = None,
) -> R:
    """``read()``, a read by Lance of the table at ``uri``: its store's errors, and its silence
    (:func:`~blobhouse.io.objects.while_answering`), raised as a StoreError naming the table;
    damaged bytes in a file as a :class:`~blobhouse.errors.DataFileError` naming the data
    files ``damaged()`` finds."""
    with lance_io(uri, doing), damage_named(uri, doing, damaged):
        return while_answering(uri, options, read, doing)


@contextlib.contextmanager
def damage_named(
    uri: str, doing: str, damaged: Callable[[], dict[str, str]] | None
) -> Iterator[None]:
    """Lance's errors about damaged bytes in a file inside the block raised as a
    :class:`~blobhouse.errors.DataFileError` naming the data files ``damaged()`` finds."""
    try:
        yield
    except BaseException as exc:  # Lance's panics are BaseExceptions
        if damaged is None:
            raise
        if is_damaged_file_error(exc):
            raise damaged_file_error(uri, doing, damaged, exc) from exc
        if is_not_found_error(exc):  # a data file, or another of Lance's files (an index)?
            found = None
            with contextlib.suppress(Exception):
                found = damaged()
            if found:
                raise damaged_file_error(uri, doing, found, exc) from exc
        raise


def damaged_file_error(
    uri: str,
    doing: str,
    damaged: dict[str, str] | Callable[[], dict[str, str]],
    exc: BaseException | None = None,
) -> DataFileError:
    """The error of ``doing`` the table at ``uri`` whose data files ``damaged`` are (file ->
    why; or what finds them), or, when none is found, that met Lance's error ``exc`` about
    damaged bytes."""
    if callable(damaged):
        try:
            damaged = damaged()
        except Exception as failed:  # a store that fails the check too: Lance's error stays
            return DataFileError(
                f"cannot {doing} {uri}: Lance found damaged bytes ({lance_message(exc)}); "
                f"checking its data files failed too ({type(failed).__name__}: "
                f"{lance_message(failed)})"
            )
    if not damaged:
        return DataFileError(
            f"cannot {doing} {uri}: Lance found damaged bytes ({lance_message(exc)}); every "
            "data file's size and footer are intact, so they are inside a page: "
            "verify(deep=True) names the fragment"
        )
    first, why = next(iter(damaged.items()))
    more = f" (and {len(damaged) - 1} more data files)" if len(damaged) > 1 else ""
    state = "is missing" if why == MISSING else f"is damaged: {why}"
    return DataFileError(
        f"cannot {doing} {uri}: data file {first} {state}{more}; its rows cannot be read "
        "(restore the file, or read a version written before it)",
        first,
    )


def table_io(
    doing: str, *, reads_only: bool = False
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A service of a table (its first argument: a snapshot or a Table) whose Lance I/O errors
    are raised as :class:`~blobhouse.errors.StoreError` naming the table and ``doing``; one
    that ``reads_only`` also fails once its store stops answering
    (:func:`~blobhouse.io.objects.while_answering`: never a service that changes the table)."""

    def decorate(service: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(service)
        def run(table: object, *args: Any, **kwargs: Any) -> R:
            snapshot = snapshot_of(table)
            snapshot.check_column_names()  # Lance could not read such a table
            call = functools.partial(service, table, *args, **kwargs)
            root, options = snapshot.location.root, snapshot.storage_options
            # a service walks the versions of the branch: a damaged file may be in any
            damaged = functools.partial(snapshot.damaged_data_files, every_version=True)
            if reads_only:
                return lance_read(root, options, doing, call, damaged)
            with lance_io(root, doing), damage_named(root, doing, damaged):
                return call()

        return run

    return decorate


def snapshot_of(table: object) -> TableSnapshot:
    """The snapshot a public service works on, given one or a :class:`~blobhouse.Table` (which
    holds one): services never use the facade."""
    return getattr(table, "snapshot", table)  # type: ignore[return-value]


def _lance_names(lance_fields: Any) -> Iterator[str]:
    """The name of every field of a Lance schema, children included (Lance's own view: it
    holds names Arrow cannot)."""
    for lance_field in lance_fields:
        yield lance_field.name()
        yield from _lance_names(lance_field.children())


def version_spans(versions: Iterable[int]) -> list[str]:
    """Version numbers as runs of consecutive ones (a table may retain thousands).

    >>> version_spans([7, 1, 2, 3, 9])
    ['1-3', '7', '9']
    """
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return [str(a) if a == b else f"{a}-{b}" for a, b in spans]
