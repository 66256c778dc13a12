"""The store's index: where the store holds each payload (blake3 -> pack, position, size), in
two levels made of parts (:mod:`blobhouse.store.index_part`: a Lance dataset each, with its
filters, sorted run and scalar indices, maintained on its own).

- **Level 0**, ``_blobs/index``: every write appends the entries it added after its commit.
- **Level 1**, once level 0 is big (:mod:`blobhouse.store.index_maintenance`): 256 shards
  ``_blobs/index-shards/<xx>``, each the hashes whose last byte is ``xx`` (the last: filters
  and sorted runs place a hash by its first bytes), and their filters, all in one folder
  ``_blobs/index-shards/_filters/<xx>-<uuid>.bloom``. gc moves level 0's entries into them and
  maintains each shard as a unit of its runner (a Spark task under ``blobhouse.spark.gc``): no
  process ever holds or rewrites the whole index, whatever its size. Level 0's config records
  that level 1 exists.

A lookup asks level 0, then, for each hash, its shard's filters (one listing for all of
level 1, one block per hash), and opens a shard only for the hashes they may hold. An entry
being moved is in both levels for a moment (found twice, at the same place: one copy), never in
neither: a shard takes it, and its filter covers it, before level 0 lets it go, and a reader
opens level 0 before any shard.

>>> import tempfile
>>> from blobhouse.dedup import content_hash
>>> root, digest = tempfile.mkdtemp(), content_hash(b"hello")
>>> _ = append_to_index(root, [StoredPayload(digest, "packs/a.pack", 0, 5)])
>>> index = StoreIndex.open(root)
>>> index.find([digest, content_hash(b"other")])[digest].pack
'packs/a.pack'
>>> from blobhouse.store.index_maintenance import move_to_shards
>>> move_to_shards(root, threshold=0)
1
>>> StoreIndex.open(root).digest_at("packs/a.pack", 0, 5) == digest
True
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence, Set
from typing import Any, TypeVar

import lance
from lance import LanceDataset

from blobhouse.cache import WeightedLRU
from blobhouse.dedup import digest_matrix
from blobhouse.errors import BlobhouseError, StoreIndexError
from blobhouse.io.kept_threads import KeptThreads
from blobhouse.io.objects import ObjectInfo, StorageOptions, object_store
from blobhouse.layout import index_shard_name
from blobhouse.store.digest_filter import (
    FilterFile,
    may_contain,
    read_filters,
)
from blobhouse.store.index_part import (
    EntryBatches,
    IndexPart,
    PackEntries,
    append_to_part,
    open_part,
    packs_of,
    tidy_level0,
)
from blobhouse.store.packs import (
    StoredPayload,
    index_shard_filters_uri,
    index_shard_uri,
    index_uri,
    tombstone_packs,
)

T = TypeVar("T")

LEVEL_ONE = "blobhouse.index.shards"  # in level 0's config: how many shards level 1 has


_CACHED_PACK_ENTRIES = 500_000  # entries of recently read packs kept for digest_at


_PARTS_AT_ONCE = KeptThreads(8, "blobhouse-index-parts")  # shards asked or deleted from at once


def shards_of(dataset: LanceDataset | None) -> int:
    """How many shards level 1 has, by level 0's ``dataset`` (0: none yet): a power of two
    up to 256, the first bits of a hash's last byte naming its shard. Any other count is
    refused: a newer layout whose entries this version could not find."""
    value = None if dataset is None else dataset.config().get(LEVEL_ONE)
    if value is None:
        return 0
    if value not in _KNOWN_COUNTS:
        raise StoreIndexError(
            f"the store index {dataset.uri} has {value!r} shards, which this blobhouse cannot "
            "read: upgrade blobhouse"
        )
    return int(value)


_KNOWN_COUNTS = {str(1 << bits) for bits in range(9)}


def by_shard(digests: Sequence[bytes], shards: int) -> dict[int, list[bytes]]:
    """``digests`` grouped by the one of ``shards`` that holds each.

    >>> grouped = by_shard([b"\\x81" * 32, b"\\x00" * 32, b"\\xff" * 32], 2)
    >>> {shard: len(digests) for shard, digests in grouped.items()}
    {1: 2, 0: 1}
    """
    shift = shard_shift(shards)
    grouped: defaultdict[int, list[bytes]] = defaultdict(list)
    for digest in digests:
        grouped[digest[-1] >> shift].append(digest)
    return dict(grouped)


def shard_shift(shards: int) -> int:
    """How far a hash's last byte is shifted right to name its shard, of ``shards``."""
    return 8 - (shards.bit_length() - 1)


class StoreIndex:
    """The store's index as one process reads it: level 0 as it was when opened, each shard
    as it is when first asked. What it says is not checked here (see
    :func:`blobhouse.store.checks.checked_entries`).

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> root, digest = tempfile.mkdtemp(), content_hash(b"x")
    >>> _ = append_to_index(root, [StoredPayload(digest, "packs/a.pack", 0, 1)])
    >>> index = StoreIndex.open(root)
    >>> index.digest_at("packs/a.pack", 0, 1) == digest, index.digest_at("packs/a.pack", 1, 1)
    (True, None)
    """

    def __init__(
        self,
        table_path: str,
        dataset: LanceDataset | None,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.table_path = table_path
        self.storage_options = storage_options
        self._level0 = IndexPart(index_uri(table_path), dataset, storage_options)
        self._shards: dict[int, IndexPart] = {}
        self._filters: ShardFilters | None = None  # listed at the first lookup in level 1
        # a read or verify that walks every pack keeps only the latest ones (memory stays flat)
        self._packs: WeightedLRU[str, PackEntries] = WeightedLRU(_CACHED_PACK_ENTRIES, len)

    @classmethod
    def open(cls, table_path: str, storage_options: StorageOptions | None = None) -> StoreIndex:
        """The index as it is now (an empty one when nothing was stored yet)."""
        return cls(table_path, open_index(table_path, storage_options), storage_options)

    def __len__(self) -> int:
        """How many entries the index holds (an entry being moved into the shards counts
        twice)."""
        parts = [self._level0, *(self._shard(s) for s in range(self._sharded()))]
        return sum(p.dataset.count_rows() for p in parts if p.dataset is not None)

    def find(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, StoredPayload]:
        """The stored payloads among ``digests``, found in packs other than ``avoid``."""
        return {d: copies[0] for d, copies in self.find_copies(digests, avoid).items()}

    def find_copies(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, list[StoredPayload]]:
        """Every indexed copy of each of ``digests`` (concurrent writers may both have stored
        a payload), in packs other than ``avoid``: level 0's, then the shards'."""
        found = self._level0.find_copies(digests, avoid)
        for digest, copies in self.shard_copies(digests, avoid).items():
            found[digest] = list(dict.fromkeys([*found.get(digest, []), *copies]))
        return found

    def shard_copies(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, list[StoredPayload]]:
        """The copies level 1 holds of ``digests`` (none before it exists)."""
        found: dict[bytes, list[StoredPayload]] = {}
        shards = self._sharded()
        if not digests or not shards:
            return found
        if self._filters is None:
            self._filters = ShardFilters.list(self.table_path, self.storage_options)
        asked = [
            (shard, held)
            for shard, wanted in by_shard(digests, shards).items()
            if (held := self._filters.may_hold(shard, wanted))
        ]

        def ask(shard: int, held: list[bytes]) -> dict[bytes, list[StoredPayload]]:
            return self._shard(shard).find_copies(held, avoid)

        # Lance's scans release the GIL: shards asked at once (a write finding many payloads
        # asks most shards)
        for copies in _PARTS_AT_ONCE.pool().map(lambda pair: ask(*pair), asked):
            found.update(copies)
        return found

    def digest_at(self, pack: str, position: int, size: int) -> bytes | None:
        """The blake3 of the payload at ``[position, +size)`` of ``pack`` (None if unknown)."""
        return self._packs.get(pack, lambda: self._pack_entries(pack)).get((position, size))

    def _pack_entries(self, pack: str) -> PackEntries:
        entries = self._level0.pack_entries(pack)
        for shard in range(self._sharded()):  # a pack's payloads are spread over every shard
            for place, digest in self._shard(shard).pack_entries(pack).items():
                entries.setdefault(place, digest)
        return entries

    def _sharded(self) -> int:
        """How many shards level 1 has (0: none, or a layout this version cannot read)."""
        try:
            return shards_of(self._level0.dataset)
        except StoreIndexError as exc:  # a cache: what it cannot answer is stored anew
            warnings.warn(str(exc), stacklevel=3)
            return 0

    def _shard(self, shard: int) -> IndexPart:
        if shard not in self._shards:
            uri = index_shard_uri(self.table_path, shard)
            self._shards[shard] = IndexPart.open(uri, self.storage_options, filtered=False)
        return self._shards[shard]


class ShardFilters:
    """The filters of level 1's shards, listed once (one request) and read a shard at a time,
    when a lookup first asks it. A shard's filters cover every entry it took before level 0
    let go of them; a shard with none (gc lost them) is asked for every hash."""

    def __init__(
        self, folder: str, listed: Sequence[ObjectInfo], storage_options: StorageOptions | None
    ) -> None:
        self.folder, self.storage_options = folder, storage_options
        self._listed: defaultdict[str, list[ObjectInfo]] = defaultdict(list)
        for info in listed:
            self._listed[info.name.split("-", 1)[0]].append(info)
        self._read: dict[int, list[FilterFile]] = {}

    @classmethod
    def list(cls, table_path: str, storage_options: StorageOptions | None) -> ShardFilters:
        folder = index_shard_filters_uri(table_path)
        try:
            listed = object_store(folder, storage_options).list(folder)
        except OSError:
            listed = []  # every shard is asked for every hash
        return cls(folder, listed, storage_options)

    def may_hold(self, shard: int, digests: list[bytes]) -> list[bytes]:
        """Those of ``digests`` (all of ``shard``'s) that its filters may hold."""
        try:
            if shard not in self._read:
                name = index_shard_name(shard)
                listed = self._listed.get(name, [])
                read = read_filters(self.folder, self.storage_options, listed)
                self._read[shard] = [f for f in read if f.covered == {name}]  # not a swapped one
            filters = self._read[shard]
            if not filters:
                return digests
            maybe = may_contain(filters, digest_matrix(digests), self.storage_options)
        except (BlobhouseError, OSError, ValueError):  # e.g. gc merged them meanwhile
            self._read[shard] = []
            return digests
        return [d for d, held in zip(digests, maybe.tolist(), strict=True) if held]


def open_index(table_path: str, storage_options: StorageOptions | None) -> LanceDataset | None:
    """The index's level 0 as it is now (None: nothing stored yet)."""
    return open_part(index_uri(table_path), storage_options)


def has_index(table_path: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether the table's store has an index yet (a write stored payloads in it)."""
    return open_index(table_path, storage_options) is not None


def append_to_index(
    table_path: str,
    stored: Sequence[StoredPayload] | EntryBatches,
    storage_options: StorageOptions | None = None,
) -> LanceDataset | None:
    """Record payloads a committed write stored, in level 0 (:func:`append_to_part`); the
    version of level 0 this append made, None when there was nothing to add."""
    return append_to_part(index_uri(table_path), stored, storage_options)


def tidy_index(
    table_path: str, index: LanceDataset, storage_options: StorageOptions | None = None
) -> None:
    """A writer's upkeep of level 0 after its append made ``index`` and it looked for
    duplicates (:func:`~blobhouse.store.index_part.tidy_level0`): small fragments merged,
    versions past the reader window removed, between gc runs."""
    tidy_level0(index_uri(table_path), index, storage_options)


def index_parts(table_path: str, storage_options: StorageOptions | None = None) -> list[str]:
    """The URIs of the index's parts: level 0, and every shard once level 1 exists (none:
    nothing stored yet); :class:`StoreIndexError` when level 0 cannot be told."""
    level0 = open_index(table_path, storage_options)
    if level0 is None:
        return []
    shards = shards_of(level0)
    return [index_uri(table_path), *(index_shard_uri(table_path, s) for s in range(shards))]


def open_parts(
    table_path: str, storage_options: StorageOptions | None = None
) -> list[tuple[str, LanceDataset]]:
    """Each part of the index and its current version; :class:`StoreIndexError` when one
    that exists cannot be opened (every shard exists once level 1 does)."""
    opened = []
    for uri in index_parts(table_path, storage_options):
        dataset = open_part(uri, storage_options)
        if dataset is None:
            raise StoreIndexError(f"the store index part {uri} cannot be read")
        opened.append((uri, dataset))
    return opened


#: runs ``fn`` on each of ``uris``, results in their order (gc's runner: Spark tasks under
#: ``blobhouse.spark.gc``)
EachPart = Callable[[Callable[[str], Any], Sequence[str]], list] | None


def one_by_one(fn: Callable[[str], T], uris: Sequence[str]) -> list[T]:
    """The default :data:`EachPart`: in this process, one part after another."""
    return [fn(uri) for uri in uris]


def runner_for(each_part: EachPart, uris: Sequence[str]) -> Callable:
    """``each_part`` for the shards; level 0 alone runs here (a Spark job of one small task
    would cost more than the work)."""
    return each_part if each_part is not None and len(uris) > 1 else one_by_one


def indexed_packs(
    table_path: str,
    storage_options: StorageOptions | None = None,
    each_part: EachPart = None,
) -> set[str]:
    """Every pack the index names (gc keeps them), each part scanned as a unit of
    ``each_part`` (default: here, one after another; a Spark task each under
    ``blobhouse.spark.gc``), streamed; :class:`StoreIndexError` when a part cannot be read
    (gc then keeps every pack)."""
    uris = index_parts(table_path, storage_options)
    found = runner_for(each_part, uris)(_PacksOf(storage_options), uris)
    unreadable = [error for error in found if isinstance(error, str)]
    if unreadable:
        raise StoreIndexError(unreadable[0])
    return set().union(*found)


class _PacksOf:
    """The packs one part names, as a unit a Spark task runs: its error's message rather
    than the error, which would fail the whole job instead of telling gc to keep every pack."""

    def __init__(self, storage_options: StorageOptions | None) -> None:
        self.storage_options = storage_options

    def __call__(self, uri: str) -> set[str] | str:
        try:
            return packs_of(uri, self.storage_options)
        except StoreIndexError as exc:
            return str(exc)


def retire_packs(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Tombstone ``packs`` (:func:`~blobhouse.store.packs.tombstone_packs`) and drop their
    entries from every part of the index: from now on writers store those payloads anew."""
    packs = sorted(packs)
    if not packs:
        return
    tombstone_packs(table_path, packs, storage_options)
    quoted = ", ".join("'" + p.replace("'", "''") + "'" for p in packs)
    try:
        parts = index_parts(table_path, storage_options)
    except StoreIndexError:
        return  # the tombstones keep writers away; gc keeps every pack while it cannot read

    def drop(uri: str) -> None:
        for attempt in range(5):
            try:
                lance.dataset(uri, storage_options=storage_options).delete(f"pack IN ({quoted})")
                return
            except (ValueError, OSError):
                # a writer appended meanwhile; the tombstones already keep writers away, and
                # gc only deletes a pack once the index no longer names it
                time.sleep(0.05 * (attempt + 1))

    list(_PARTS_AT_ONCE.pool().map(drop, parts))
