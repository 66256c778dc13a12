"""Duplicates: payloads that racing writers both stored, found when the later one records its
payloads in the index, merged by compaction.

Claims are per write, so two writes (processes, Spark applications) that look the same new
payload up before either commits each store a copy. Lance commits the two index appends one
after the other, and the later append's version holds both copies: right after appending, a
writer asks every *other* data file of the index for the hashes it added (the filters first,
then the scalar index for the few they may hold) and records those found there in a file of
``_blobs/index/_duplicates/``. Compaction reads the records, counts every copy the current
version references but one as unused bytes of its pack, and so repacks the packs that hold
many: their rows are rewritten to reference the copy that stays (the repack's store writer
finds it in the index), and the pack is retired like any other (docs/global-dedup.md).

A record is a hint, never trusted: compaction looks each digest up again, and a lost record only
leaves a duplicate in place (lower dedup, never a wrong reference).

>>> import tempfile
>>> from blobhouse.dedup import content_hash
>>> from blobhouse.store.index import append_to_index
>>> root, digest = tempfile.mkdtemp(), content_hash(b"clip")
>>> first = [StoredPayload(digest, "packs/a.pack", 0, 4)]
>>> second = [StoredPayload(digest, "packs/b.pack", 0, 4)]  # another writer's copy
>>> find_duplicates(root, append_to_index(root, first), first)
[]
>>> find_duplicates(root, append_to_index(root, second), second) == [digest]
True
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset

from blobhouse.dedup import digest_matrix
from blobhouse.errors import StoreError, StoreIndexError
from blobhouse.io.objects import StorageOptions, is_local, object_store, read_object, uri_to_path
from blobhouse.layout import INDEX_DUPLICATES_DIR
from blobhouse.store.digest_filter import FilterFile, may_contain
from blobhouse.store.index import StoreIndex, shards_of
from blobhouse.store.index_part import (
    INDEX_SCHEMA,
    LOOKUP_WINDOW,
    EntryBatches,
    covering_filters,
    data_files,
    entry_batches,
    index_rows,
)
from blobhouse.store.packs import StoredPayload, index_uri, retired_packs

DIGEST_BYTES = 32
RECORD_SUFFIX = ".digests"


def duplicates_uri(table_path: str) -> str:
    return f"{index_uri(table_path)}/{INDEX_DUPLICATES_DIR}"


def find_duplicates(
    table_path: str,
    index: LanceDataset | None,
    added: Sequence[StoredPayload] | EntryBatches,
    storage_options: StorageOptions | None = None,
    superseded: Set[str] = frozenset(),
) -> list[bytes]:
    """The digests of ``added`` (just appended to the index, whose version after the append is
    ``index``) that another data file of the index holds at another place, in a pack other
    than ``superseded`` (those the writer moved payloads out of): copies a concurrent writer
    stored. One filter block per digest, and a scalar-index query for the few that a filter
    may hold (all of them when a data file has no filter yet). Also those ``added`` holds at
    two places: the tasks of one write that each stored a payload they did not claim
    (:mod:`blobhouse.store.claims`). ``added`` is read a window at a time (it may be a Spark
    write's records, millions of entries), twice."""
    entries = entry_batches(added)
    others: set[str] = set()
    if index is not None:
        others = set(data_files(index)) - _appended_files(index)
    filters = []  # the filters live beside the index (level 0), not at the table's root
    if others:
        filters = covering_filters(index_uri(table_path), index, storage_options, files=others)
    found: set[bytes] = set()
    prefixes: list[np.ndarray] = []  # of every entry, for those stored twice by this write
    level1 = StoreIndex(table_path, index, storage_options) if _sharded(index) else None
    for window in _windows(entries()):
        prefixes.append(_prefixes(window))
        if others:
            found |= _held_elsewhere(index, window, filters, storage_options, superseded)
        if level1 is not None:
            found |= _held_in_shards(level1, window, superseded)
    return sorted(found | _stored_twice(entries, prefixes))


def _sharded(index: LanceDataset | None) -> bool:
    try:
        return shards_of(index) > 0
    except StoreIndexError:
        return False  # a hint: a level 1 this version cannot read finds nothing


def _held_in_shards(level1: StoreIndex, window: pa.RecordBatch, superseded: Set[str]) -> set[bytes]:
    """The digests of ``window`` the index's shards hold at another place, in a pack other
    than ``superseded``: a copy gc moved out of level 0 before this write's append."""
    places = _places(window)
    return {
        digest
        for digest, copies in level1.shard_copies(sorted(places), superseded).items()
        if any((c.pack, c.position, c.size) not in places[digest] for c in copies)
    }


def _places(window: pa.RecordBatch) -> dict[bytes, set[tuple[str, int, int]]]:
    """Each digest of ``window`` and the places it names."""
    places: dict[bytes, set[tuple[str, int, int]]] = {}
    for digest, pack, position, size in index_rows(window, INDEX_SCHEMA.names):
        places.setdefault(digest, set()).add((pack, position, size))
    return places


def _held_elsewhere(
    index: LanceDataset,
    window: pa.RecordBatch,
    filters: Sequence[FilterFile],
    storage_options: StorageOptions | None,
    superseded: Set[str],
) -> set[bytes]:
    """The digests of ``window`` the index holds at another place, in a pack other than
    ``superseded``: filters first (when they cover the other data files), then one query."""
    places = _places(window)
    digests = sorted(places)
    if filters:
        maybe = may_contain(filters, digest_matrix(digests), storage_options).tolist()
        digests = [d for d, held in zip(digests, maybe, strict=True) if held]
    if not digests:
        return set()
    rows = index.to_table(filter=pc.field("blake3").isin(pa.array(digests, pa.binary())))
    return {
        digest
        for digest, pack, position, size in index_rows(rows, INDEX_SCHEMA.names)
        if (pack, position, size) not in places[digest] and pack not in superseded
    }


def _windows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` cut into windows of at most :data:`LOOKUP_WINDOW` entries."""
    for batch in batches:
        for start in range(0, batch.num_rows, LOOKUP_WINDOW):
            yield batch.slice(start, LOOKUP_WINDOW)


def _prefixes(batch: pa.RecordBatch) -> np.ndarray:
    """The first 8 bytes of each digest of ``batch``, as integers."""
    return digest_matrix(batch.column(0))[:, :8].copy().view("<u8").ravel()


def _stored_twice(entries: EntryBatches, prefixes: list[np.ndarray]) -> set[bytes]:
    """The digests ``entries`` hold at more than one place, given the :func:`_prefixes` of
    all of them (8 bytes an entry): ``entries`` is read again only when a prefix repeats."""
    if not prefixes:
        return set()
    values, counts = np.unique(np.concatenate(prefixes), return_counts=True)
    repeated = values[counts > 1]
    if not len(repeated):
        return set()
    places: dict[bytes, set[tuple[str, int, int]]] = {}
    for batch in entries():
        if not batch.num_rows:
            continue
        picked = batch.filter(pa.array(np.isin(_prefixes(batch), repeated)))
        for digest, pack, position, size in index_rows(picked, INDEX_SCHEMA.names):
            places.setdefault(digest, set()).add((pack, position, size))
    return {digest for digest, at in places.items() if len(at) > 1}


def _appended_files(index: LanceDataset) -> set[str]:
    """The data files the commit that made ``index``'s version added."""
    if index.version <= 1:
        return set(data_files(index))
    before = index.checkout_version(index.version - 1)
    return set(data_files(index)) - set(data_files(before))


def record_duplicates(
    table_path: str, digests: Iterable[bytes], storage_options: StorageOptions | None = None
) -> None:
    """Record ``digests`` as stored more than once, for compaction to merge."""
    body = b"".join(sorted(set(digests)))
    if body:
        uri = f"{duplicates_uri(table_path)}/{uuid.uuid4().hex}{RECORD_SUFFIX}"
        object_store(uri, storage_options).put(uri, body)


@dataclass(frozen=True)
class Recorded:
    """The duplicate records found, and the digests they name."""

    files: tuple[str, ...] = ()
    digests: frozenset[bytes] = frozenset()


def recorded_duplicates(table_path: str, storage_options: StorageOptions | None = None) -> Recorded:
    """Every record of duplicates (one that cannot be read, or is not whole, is left out: it
    is a hint)."""
    folder = duplicates_uri(table_path)
    store = object_store(folder, storage_options)
    try:
        listed = [f"{folder}/{i.name}" for i in store.list(folder)]
    except OSError:
        return Recorded()
    files, digests = [], set()
    for uri in listed:
        if not uri.endswith(RECORD_SUFFIX) or not _plain_file(uri):
            continue
        with contextlib.suppress(OSError):
            body = read_object(uri, storage_options)
            if len(body) % DIGEST_BYTES == 0:
                files.append(uri)
                digests.update(
                    body[i : i + DIGEST_BYTES] for i in range(0, len(body), DIGEST_BYTES)
                )
    return Recorded(tuple(files), frozenset(digests))


def _plain_file(uri: str) -> bool:
    """Whether ``uri`` is an object, or locally a regular file: never a link (a record is read
    inside the table only), a folder or a pipe."""
    if not is_local(uri):
        return True
    try:
        return stat.S_ISREG(os.lstat(uri_to_path(uri)).st_mode)
    except OSError:
        return False


@dataclass(frozen=True)
class Duplicates:
    """Payloads the current version references in more than one place of the store, as a
    compaction plans them: per digest its copies, the one that stays first (in the pack with
    the fewest unreferenced bytes: the least likely to be repacked)."""

    records: tuple[str, ...] = ()
    copies: Mapping[bytes, tuple[StoredPayload, ...]] = field(default_factory=dict)

    @property
    def redundant_bytes(self) -> dict[str, int]:
        """By pack, the bytes of the copies that do not stay.

        >>> a, b = (StoredPayload(b"d", f"packs/{p}.pack", 0, 5) for p in "ab")
        >>> Duplicates(copies={b"d": (a, b)}).redundant_bytes
        {'packs/b.pack': 5}
        """
        by_pack: dict[str, int] = {}
        for copies in self.copies.values():
            for copy in copies[1:]:
                by_pack[copy.pack] = by_pack.get(copy.pack, 0) + copy.size
        return by_pack

    def unsettled(self, repacked: Set[str]) -> list[bytes]:
        """The digests that keep more than one referenced copy once ``repacked`` are gone."""
        return sorted(
            digest
            for digest, copies in self.copies.items()
            if sum(c.pack not in repacked for c in copies) > 1
        )


def referenced_duplicates(
    table_path: str,
    referenced: Mapping[str, Set[tuple[int, int]]],
    pack_sizes: Mapping[str, int],
    storage_options: StorageOptions | None = None,
) -> Duplicates:
    """The recorded duplicates that a version still references more than one copy of, given
    the ``(position, size)`` ranges it references in each pack and the packs' sizes. Copies in
    retired packs do not count (they go with their pack)."""
    recorded = recorded_duplicates(table_path, storage_options)
    if not recorded.digests:
        return Duplicates(recorded.files)
    index = StoreIndex.open(table_path, storage_options)
    retired = set(retired_packs(table_path, storage_options))
    live = {p: sum(size for _, size in ranges) for p, ranges in referenced.items()}

    def unreferenced(pack: str) -> float:
        return 1 - live[pack] / max(pack_sizes.get(pack, 0), live[pack], 1)

    copies: dict[bytes, tuple[StoredPayload, ...]] = {}
    found = index.find_copies(sorted(recorded.digests), avoid=retired)
    for digest, all_copies in found.items():
        places = {
            c for c in all_copies if (c.position, c.size) in referenced.get(c.pack, frozenset())
        }
        if len(places) > 1:
            copies[digest] = tuple(sorted(places, key=lambda c: (unreferenced(c.pack), c.pack)))
    return Duplicates(recorded.files, copies)


def settle_duplicates(
    table_path: str,
    records: Sequence[str],
    unsettled: Sequence[bytes],
    storage_options: StorageOptions | None = None,
) -> None:
    """After a compaction's commit: one record of the digests still stored more than once
    replaces the ``records`` it read (writers may have added others meanwhile: kept)."""
    with contextlib.suppress(OSError, StoreError):
        record_duplicates(table_path, unsettled, storage_options)
        if records:
            object_store(records[0], storage_options).delete_many(list(records))
