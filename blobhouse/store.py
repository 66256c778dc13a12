"""The table's content-addressed store (``dedup="global"``): each payload once for the whole table.

Layout under the table root::

    _blobs/packs/<write id>-<uuid>.pack   payloads back to back, written once, never modified
    _blobs/index/                         a Lance dataset: blake3 -> (pack, position, size)

``_blobs`` is registered in the table's manifest as the Lance base path ``blobhouse-store``, so a
row references its payload as a Lance external blob (kind 3) whose ``blob_id`` is that base's id
and whose uri is the pack's path relative to it: stock Lance readers resolve it like any blob, and
Lance's own cleanup never deletes files under a base.

The index is a cache of what the packs hold. A writer looks payloads up in it before writing them
and appends what it wrote after its table commit; when it lags, dedup is lower, never wrong.
gc reclaims an unreferenced indexed pack in two steps, retire (tombstone, out of the index) then
reap after a grace period, and a writer checks right before its commit that the packs it took
from the index were not retired meanwhile: the argument is in docs/global-dedup.md.
"""

from __future__ import annotations

import contextlib
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import blake3
import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance import DatasetBasePath, LanceDataset
from lance.indices import IndexConfig

from blobhouse.cache import WeightedLRU
from blobhouse.claims import (
    CLAIM_MIN_BYTES,
    SMALL_PROBE,
    SMALL_SHARED_RATIO,
    Claim,
    Claims,
)
from blobhouse.dedup import content_hash, digest_matrix
from blobhouse.digest_filter import (
    DigestFilter,
    FilterFile,
    may_contain,
    read_filters,
    write_filter,
)
from blobhouse.errors import (
    BlobhouseError,
    ExternalBlobError,
    InvalidInputError,
    StoreIndexError,
    StoreIndexWarning,
    StoreRaceError,
    lance_message,
)
from blobhouse.layout import (
    STORE_BASE_NAME,
    STORE_DIR,
    TableLocation,
    is_store_base_name,
    store_dir,
)
from blobhouse.placement import Kind, as_uri, normalize_uri, object_size
from blobhouse.rangeio import BlobRef, read_ranges
from blobhouse.session import PACK_NAME, PreparedBlob, SidecarFile, WriteQueue
from blobhouse.storage import StorageOptions, is_local, object_sizes, object_store, uri_to_path

if TYPE_CHECKING:
    from blobhouse.values import LogicalColumn

_INDEX_FRAGMENTS = 8  # more than this many and gc compacts the index
_INDEX_FILTERS = 8  # more filters than this cover it and gc merges them into one
_LOOKUP_WINDOW = 4096  # hashes per scalar-index query
_UNINDEXED_ROWS = 100_000  # more index rows outside its scalar indices and a writer adds them
_CACHED_PACK_ENTRIES = 500_000  # entries of recently read packs kept for digest_at
_CHECK_WINDOW = 256  # index entries per batch of verify's walk of the index (x16)
_CHECK_BYTES = 64 << 20  # payload bytes read at once by a check of index entries
_CHECK_BUFFER = 16 << 20  # the buffer a local check reads through (bigger payloads: in parts)
# 256 rows per page instead of 4,096: a lookup reads one page per hash (random hashes touch
# every page), measured 6x faster cold and half the memory at 10 M entries
_LOOKUPS = {"blake3": IndexConfig("btree", {"zone_size": 256}), "pack": "BTREE"}
PACKS_DIR = "packs"
# filters of the index's data files (blobhouse.digest_filter), inside the index's folder: Lance
# leaves folders of its own names alone
FILTERS_DIR = "_filters"
TOMBSTONES_DIR = "tombstones"
INDEX_SCHEMA = pa.schema(
    [
        # plain binary and signed integers: Spark reads the index for its lookup join
        pa.field("blake3", pa.binary(), nullable=False),
        pa.field("pack", pa.utf8(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class StoredPayload:
    """One payload in the store: ``size`` bytes at ``position`` of ``pack`` (relative to the
    store directory), whose blake3 is ``digest``."""

    digest: bytes
    pack: str
    position: int
    size: int

    def prepared(self, base_id: int) -> PreparedBlob:
        """The value a row stores to reference this payload (a Lance external blob)."""
        return PreparedBlob(
            Kind.EXTERNAL, size=self.size, position=self.position, uri=self.pack, blob_id=base_id
        )


def store_base_id(dataset: LanceDataset) -> int | None:
    """The id of the table's store among its Lance base paths (None: no store yet)."""
    for base_id, base in dataset.base_paths().items():
        if is_store_base_name(base.name):
            return base_id
    return None


def store_base(location: TableLocation, existing: LanceDataset | None) -> DatasetBasePath:
    """The base path to register for the store of a table (a fresh id if others exist)."""
    taken = existing.base_paths() if existing is not None else {}
    return DatasetBasePath(
        uri_to_path(location.store_path), name=STORE_BASE_NAME, id=max(taken, default=0) + 1
    )


_PackEntries = dict[tuple[int, int], bytes]  # (position, size) -> blake3 of one pack


class StoreIndex:
    """The store's index as one process reads it (the version current when opened): the
    payloads of the hashes at hand, found through a Lance scalar index on ``blake3``, and the
    hash of a payload at a place of a pack, one pack's entries at a time (through the scalar
    index on ``pack``). Nothing loads the whole index: a lookup first asks the filters of the
    index's data files (:mod:`blobhouse.digest_filter`, one block read per hash), then reads
    the index pages of the hashes they may hold, and the fragments the scalar indices do not
    cover yet (see :func:`index_lookups`).

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> root, digest = tempfile.mkdtemp(), content_hash(b"hello")
    >>> append_to_index(root, [StoredPayload(digest, "packs/a.pack", 0, 5)])
    >>> index = StoreIndex.open(root)
    >>> index.find([digest, content_hash(b"other")])[digest].pack
    'packs/a.pack'
    >>> index.digest_at("packs/a.pack", 0, 5) == digest, index.digest_at("packs/a.pack", 5, 1)
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
        self._dataset = dataset
        # a read or verify that walks every pack keeps only the latest ones (memory stays flat)
        self._packs: WeightedLRU[str, _PackEntries] = WeightedLRU(_CACHED_PACK_ENTRIES, len)
        self._filters: list[FilterFile] | None = None  # read at the first lookup

    @classmethod
    def open(cls, table_path: str, storage_options: StorageOptions | None = None) -> StoreIndex:
        """The index as it is now (an empty one when nothing was stored yet)."""
        return cls(table_path, _open_index(table_path, storage_options), storage_options)

    @classmethod
    def empty(cls, table_path: str) -> StoreIndex:
        """An index that finds nothing (rows already looked up, e.g. by a Spark join)."""
        return cls(table_path, None)

    def __len__(self) -> int:
        return 0 if self._dataset is None else self._dataset.count_rows()

    def find(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, StoredPayload]:
        """The stored payloads among ``digests``, found in packs other than ``avoid``: one
        scalar-index query per window of hashes. What the index says is not checked here (see
        :func:`checked_entries`)."""
        return {d: copies[0] for d, copies in self.find_copies(digests, avoid).items()}

    def find_copies(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, list[StoredPayload]]:
        """Every indexed copy of each of ``digests`` (concurrent writers may both have stored
        a payload), in packs other than ``avoid``."""
        found: defaultdict[bytes, list[StoredPayload]] = defaultdict(list)
        if self._dataset is None or not digests:
            return found
        digests = self._maybe_held(digests)
        for start in range(0, len(digests), _LOOKUP_WINDOW):
            window = pa.array(digests[start : start + _LOOKUP_WINDOW], pa.binary())
            rows = self._query(pc.field("blake3").isin(window))
            for digest, pack, position, size in _rows(rows, INDEX_SCHEMA.names):
                if pack not in avoid:
                    found[digest].append(StoredPayload(digest, pack, position, size))
        return found

    def _maybe_held(self, digests: Sequence[bytes]) -> Sequence[bytes]:
        """Those of ``digests`` the index may hold: the ones no filter rules out (all of
        them while a data file has no filter yet, or when a filter cannot be read)."""
        try:
            if self._filters is None:
                self._filters = _covering_filters(
                    self.table_path, self._dataset, self.storage_options
                )
            if not self._filters:
                return digests
            maybe = may_contain(self._filters, digest_matrix(digests), self.storage_options)
        except (BlobhouseError, OSError, ValueError):  # e.g. gc replaced a filter meanwhile
            self._filters = []
            return digests
        return [d for d, held in zip(digests, maybe.tolist(), strict=True) if held]

    def digest_at(self, pack: str, position: int, size: int) -> bytes | None:
        """The blake3 of the payload at ``[position, +size)`` of ``pack`` (None if unknown)."""
        return self._pack_entries(pack).get((position, size))

    def _pack_entries(self, pack: str) -> _PackEntries:
        return self._packs.get(pack, lambda: self._load_pack_entries(pack))

    def _load_pack_entries(self, pack: str) -> _PackEntries:
        entries: _PackEntries = {}
        if self._dataset is not None:
            rows = self._query(pc.field("pack") == pack)
            for digest, position, size in _rows(rows, ["blake3", "position", "size"]):
                entries.setdefault((position, size), digest)
        return entries

    def _query(self, condition: pc.Expression) -> pa.Table:
        try:
            return self._dataset.to_table(filter=condition)
        except (ValueError, OSError):
            # a long write outlived its version of the index (gc removed it after a compaction):
            # the current version has every entry that one had, minus retired packs
            self._dataset = _open_index(self.table_path, self.storage_options)
            self._filters = None  # the new version's data files may have others
            if self._dataset is None:
                return INDEX_SCHEMA.empty_table()
        try:
            return self._dataset.to_table(filter=condition)
        except (ValueError, OSError):
            pass
        try:  # its scalar index may be what is damaged: scan its data instead
            return self._dataset.to_table(filter=condition, use_scalar_index=False)
        except (ValueError, OSError) as exc:
            # the index is a cache: what it cannot answer is stored anew (lower dedup)
            warnings.warn(
                StoreIndexWarning(
                    f"the store index of {self.table_path} cannot be read ({lance_message(exc)}): "
                    "payloads are stored anew; `blobhouse verify` names the damage"
                ),
                stacklevel=4,
            )
            return INDEX_SCHEMA.empty_table()


@dataclass(frozen=True)
class CheckedEntries:
    """Index entries a writer is about to reference, checked against the bytes they name:
    ``usable`` (digest -> the first copy whose bytes hash to its key) and ``damaged`` (entries
    whose size or bytes differ from what their key says: a damaged index or pack). Entries
    whose pack cannot be read (gc took it, most likely) are neither: not used, not reported."""

    usable: dict[bytes, StoredPayload]
    damaged: list[StoredPayload]


def checked_entries(
    table_path: str,
    copies: Mapping[bytes, Sequence[StoredPayload]],
    sizes: Mapping[bytes, int] | None = None,
    storage_options: StorageOptions | None = None,
) -> CheckedEntries:
    """Check index entries before a write references them: each digest's copies in order,
    until one's size is ``sizes[digest]`` (when known) and its bytes hash to the digest. The
    index is a cache that a bit flip or a buggy tool can damage; a reference made from a wrong
    entry would hand every reader another payload's bytes. Reads are coalesced per pack.

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> root = tempfile.mkdtemp()
    >>> uri = f"{store_dir(root)}/{PACKS_DIR}/a.pack"
    >>> object_store(as_uri(uri)).put(as_uri(uri), b"helloworld")
    >>> good = StoredPayload(content_hash(b"hello"), "packs/a.pack", 0, 5)
    >>> bad = StoredPayload(content_hash(b"world"), "packs/a.pack", 0, 5)  # wrong position
    >>> checked = checked_entries(root, {good.digest: [good], bad.digest: [bad]})
    >>> list(checked.usable.values()) == [good], checked.damaged == [bad]
    (True, True)
    """
    usable: dict[bytes, StoredPayload] = {}
    damaged: list[StoredPayload] = []
    pending = {d: list(c) for d, c in copies.items() if c}
    while pending:
        tried = {d: c.pop(0) for d, c in pending.items()}
        for digest, entry in list(tried.items()):
            if sizes is not None and digest in sizes and sizes[digest] != entry.size:
                damaged.append(tried.pop(digest))
        for digest, verdict in _hash_entries(table_path, tried, storage_options).items():
            if verdict is None:
                usable[digest] = tried[digest]
            elif verdict == "damaged":
                damaged.append(tried[digest])
        pending = {d: c for d, c in pending.items() if d not in usable and c}
    return CheckedEntries(usable, damaged)


def _hash_entries(
    table_path: str, entries: Mapping[bytes, StoredPayload], storage_options: StorageOptions | None
) -> dict[bytes, str | None]:
    """Per digest: None when its entry's bytes hash to it, else "damaged" or "unreadable"."""
    listed = list(entries.values())
    verdicts = entry_verdicts(table_path, listed, storage_options)
    return {e.digest: None if v is None else v[0] for e, v in zip(listed, verdicts, strict=True)}


def entry_verdicts(
    table_path: str, entries: Sequence[StoredPayload], storage_options: StorageOptions | None
) -> list[tuple[str, str] | None]:
    """For each index entry: None when the bytes it names hash to its key, else ``("damaged",
    the blake3 read)`` or ``("unreadable", why)``. Reads of up to :data:`_CHECK_BYTES` at once,
    coalesced and in parallel, each payload hashed on the thread that read it."""
    verdicts: list[tuple[str, str] | None] = [None] * len(entries)
    prefix = as_uri(store_dir(table_path))
    order = sorted(range(len(entries)), key=lambda i: (entries[i].pack, entries[i].position))
    start = 0
    while start < len(order):
        end, total = start, 0
        while end < len(order) and (
            end == start or total + entries[order[end]].size <= _CHECK_BYTES
        ):
            total += entries[order[end]].size
            end += 1
        chunk = order[start:end]
        start = end
        for pack_members in _by_pack(entries, chunk):
            uri = f"{prefix}/{entries[pack_members[0]].pack}"
            places = [(entries[i].position, entries[i].size) for i in pack_members]
            try:
                actual = _hashes_at(uri, places, storage_options)
            except (BlobhouseError, OSError, ValueError) as exc:
                for i in pack_members:
                    verdicts[i] = ("unreadable", str(exc).splitlines()[0])
                continue
            for i, digest in zip(pack_members, actual, strict=True):
                if digest != entries[i].digest:
                    verdicts[i] = ("damaged", digest.hex())
    return verdicts


def _hashes_at(
    uri: str, places: list[tuple[int, int]], storage_options: StorageOptions | None
) -> list[bytes]:
    """The blake3 of the bytes at each ``(position, size)`` of the object at ``uri``. A local
    pack is read into one reused buffer (fresh memory for every payload cost more than the
    read and the hash together: 75 MB in 110 ms against 35); on an object store the reads
    are coalesced and parallel, each payload hashed on the thread that read it."""
    if not is_local(uri):
        actual: list[bytes] = [b""] * len(places)

        def hashed(at: int, payload: memoryview) -> None:
            actual[at] = content_hash(payload, threads=1)

        refs = [BlobRef(uri, position, size) for position, size in places]
        read_ranges(refs, storage_options=storage_options, verify=hashed)
        return actual
    source = object_store(uri, storage_options).open(uri)
    view = memoryview(bytearray(min(max(size for _, size in places), _CHECK_BUFFER)))
    try:
        return [_hash_range(source, uri, position, size, view) for position, size in places]
    finally:
        source.close()


def _hash_range(source, uri: str, position: int, size: int, view: memoryview) -> bytes:
    """The blake3 of ``size`` bytes at ``position`` of ``source``, read through ``view``
    (a payload bigger than it is hashed a buffer at a time: memory stays bounded)."""
    if size <= len(view):
        got = source.read_into(position, view[:size])
        if got < size:
            raise BlobhouseError(f"short read from {uri}: {got} of {size} bytes at {position}")
        return content_hash(view[:size])
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    done = 0
    while done < size:
        part = view[: min(len(view), size - done)]
        got = source.read_into(position + done, part)
        if got < len(part):
            raise BlobhouseError(f"short read from {uri}: {done + got} of {size} bytes")
        hasher.update(part)
        done += got
    return hasher.digest()


def _by_pack(entries: Sequence[StoredPayload], members: list[int]) -> list[list[int]]:
    """``members`` (sorted by pack) in runs of one pack each (a pack that cannot be read fails
    its own entries only)."""
    runs: dict[str, list[int]] = {}
    for i in members:
        runs.setdefault(entries[i].pack, []).append(i)
    return list(runs.values())


def _rows(table: pa.Table, names: Sequence[str]) -> Iterable[tuple]:
    return zip(*(table.column(name).to_pylist() for name in names), strict=True)


def _open_index(table_path: str, storage_options: StorageOptions | None) -> LanceDataset | None:
    try:
        return lance.dataset(index_uri(table_path), storage_options=storage_options)
    except (ValueError, OSError):
        return None  # nothing stored yet


def index_uri(table_path: str) -> str:
    return f"{store_dir(table_path)}/index"


def has_index(table_path: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether the table's store has an index yet (a write stored payloads in it)."""
    try:
        lance.dataset(index_uri(table_path), storage_options=storage_options)
    except (ValueError, OSError):
        return False
    return True


def append_to_index(
    table_path: str, stored: list[StoredPayload], storage_options: StorageOptions | None = None
) -> None:
    """Record payloads a committed write stored (concurrent appends are Lance appends)."""
    if not stored:
        return
    rows = pa.table(
        {
            "blake3": [s.digest for s in stored],
            "pack": [s.pack for s in stored],
            "position": [s.position for s in stored],
            "size": [s.size for s in stored],
        },
        schema=INDEX_SCHEMA,
    )
    uri = index_uri(table_path)
    try:
        dataset = lance.write_dataset(rows, uri, mode="create", storage_options=storage_options)
    except (ValueError, OSError):
        # it exists (maybe a concurrent writer just created it): append, Lance merges appends
        dataset = lance.write_dataset(rows, uri, mode="append", storage_options=storage_options)
    # its filter lets the next writer skip the lookup of hashes none of the index holds (gc
    # covers big fragments); a big write indexes what it added (lookups scan what the scalar
    # indices do not cover), small ones leave that to gc
    try:
        write_filters(table_path, dataset, storage_options, max_rows=_UNINDEXED_ROWS)
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the store index of {table_path} got no filter: {exc}", stacklevel=2)
    index_lookups(table_path, storage_options)


def index_lookups(
    table_path: str,
    storage_options: StorageOptions | None = None,
    merge: bool = False,
) -> None:
    """Create the index's scalar indices (``blake3`` for writers' lookups, ``pack`` for
    :meth:`StoreIndex.digest_at` and gc's deletes) if missing, and extend them by a delta over
    the fragments added since once those hold many rows (writers and gc alike: a lookup scans
    a few small fragments in no time). Lance's scalar indices cover only the fragments they
    were built on: every lookup scans what they miss. ``merge``, or too many deltas: merge
    them into one (Lance compacts together only fragments that one delta covers). The index is
    a cache: a failure here is a warning (e.g. a concurrent commit on the index won)."""
    dataset = _open_index(table_path, storage_options)
    if dataset is None:
        return
    try:
        present = {d.field_names[0]: d.name for d in dataset.describe_indices()}
        for column, config in _LOOKUPS.items():
            if column not in present:
                dataset.create_scalar_index(column, config, name=f"{column}_idx", replace=False)
        for name in present.values():
            stats = dataset.stats.index_stats(name)
            deltas, behind = stats["num_indices"], stats["num_unindexed_rows"]
            if (merge or deltas > _INDEX_FRAGMENTS) and (deltas > 1 or behind):
                dataset.optimize.optimize_indices(index_names=[name], num_indices_to_merge=deltas)
            elif behind > _UNINDEXED_ROWS:
                dataset.optimize.optimize_indices(index_names=[name], num_indices_to_merge=0)
    except (ValueError, OSError) as exc:
        warnings.warn(
            f"the lookups of the store index of {table_path} were not updated: {exc}",
            stacklevel=2,
        )


def maintain_index(
    table_path: str, keep: timedelta, storage_options: StorageOptions | None = None
) -> None:
    """Compact the index (one small fragment per write adds up), bring its scalar indices up
    to date (:func:`index_lookups`), remove its versions older than ``keep``, and cover its
    data files with filters again (:func:`_tidy_filters`). Lance's cleanup also removes files
    no version names once they are 7 days old: the leftovers of an index append that was
    killed before it committed. The index is a cache: a failure here is a warning."""
    dataset = _open_index(table_path, storage_options)
    if dataset is None:
        return  # no store, or nothing stored yet
    compact = len(dataset.get_fragments()) > _INDEX_FRAGMENTS
    index_lookups(table_path, storage_options, merge=compact)
    try:
        dataset = lance.dataset(index_uri(table_path), storage_options=storage_options)
        if compact:  # remaps the scalar indices onto the new fragments
            dataset.optimize.compact_files()
        dataset.cleanup_old_versions(older_than=keep)
        _tidy_filters(table_path, keep, storage_options)
    # e.g. a concurrent index delete won the commit, or a filter vanished while gc read it
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the store index of {table_path} was not maintained: {exc}", stacklevel=2)


def filters_uri(table_path: str) -> str:
    return f"{index_uri(table_path)}/{FILTERS_DIR}"


def _data_files(dataset: LanceDataset) -> dict[str, lance.LanceFragment]:
    """The index's data files (one per fragment) and their fragments."""
    return {
        str(data_file.path): fragment
        for fragment in dataset.get_fragments()
        for data_file in fragment.data_files()
    }


def _covering_filters(
    table_path: str,
    dataset: LanceDataset,
    storage_options: StorageOptions | None,
    filters: list[FilterFile] | None = None,
) -> list[FilterFile]:
    """Of ``filters`` (default: the index's), those that together cover every data file of
    ``dataset`` (none if one is not covered yet: a lookup must then ask the scalar index for
    every hash)."""
    files = set(_data_files(dataset))
    if filters is None:
        filters = read_filters(filters_uri(table_path), storage_options)
    chosen: list[FilterFile] = []
    covered: set[str] = set()
    # the widest first, and none whose files others cover: each one asked adds false positives
    for bloom in sorted(filters, key=lambda f: -len(f.covered & files)):
        if (bloom.covered & files) - covered:
            chosen.append(bloom)
            covered |= bloom.covered
    return chosen if files <= covered else []


def write_filters(
    table_path: str,
    dataset: LanceDataset,
    storage_options: StorageOptions | None = None,
    max_rows: int | None = None,
    filters: list[FilterFile] | None = None,
) -> frozenset[str]:
    """Cover the data files of ``dataset`` that none of ``filters`` (default: the index's)
    covers with one new filter, unless they hold more than ``max_rows`` rows (a writer covers
    its own small fragment; gc what a compaction wrote); the data files it covers."""
    if filters is None:
        filters = read_filters(filters_uri(table_path), storage_options)
    covered = set().union(*(f.covered for f in filters))
    missing = {name: f for name, f in _data_files(dataset).items() if name not in covered}
    rows = sum(f.physical_rows for f in missing.values())
    if not missing or (max_rows is not None and rows > max_rows):
        return frozenset()
    bloom = DigestFilter.for_entries(rows)
    for fragment in missing.values():
        for batch in fragment.to_batches(columns=["blake3"]):
            bloom.add(digest_matrix(batch.column(0)))
    uri = f"{filters_uri(table_path)}/{uuid.uuid4().hex}.bloom"
    write_filter(uri, sorted(missing), bloom, storage_options)
    return frozenset(missing)


def _tidy_filters(
    table_path: str, keep: timedelta, storage_options: StorageOptions | None = None
) -> None:
    """Cover the index with filters again after gc's maintenance: one new filter for the data
    files a compaction wrote, or, once more than a few filters cover the index, one for all
    of it. Then remove the filters whose data files are all gone or covered by the new one,
    and files older than ``keep`` that are not whole filters (a writer died writing one)."""
    dataset = _open_index(table_path, storage_options)
    if dataset is None:
        return
    folder = filters_uri(table_path)
    store = object_store(folder, storage_options)
    listed = store.list(folder)  # before the new filter is written: it is never removed below
    filters = read_filters(folder, storage_options)
    whole = len(_covering_filters(table_path, dataset, storage_options, filters)) > _INDEX_FILTERS
    fresh = write_filters(table_path, dataset, storage_options, filters=[] if whole else filters)
    on_disk = {i.name for i in store.list(f"{index_uri(table_path)}/data")}
    by_uri = {f.uri: f for f in filters}
    before = store.now(folder) - keep.total_seconds()
    for info in listed:
        uri = f"{folder}/{info.name}"
        bloom = by_uri.get(uri)
        # not a whole filter: removed once old; a filter: once its data files are all gone or
        # newly covered (a file a writer just covered is on disk, in no version gc saw: kept)
        if info.mtime < before if bloom is None else (bloom.covered & on_disk) <= fresh:
            store.delete(uri)


def _unreadable(table_path: str, cause: BaseException) -> StoreIndexError:
    return StoreIndexError(
        f"the store index {index_uri(table_path)} cannot be read: {lance_message(cause)}"
    )


def indexed_packs(table_path: str, storage_options: StorageOptions | None = None) -> set[str]:
    """Every pack the index names (gc keeps them); :class:`StoreIndexError` when the index
    cannot be read (gc then keeps every pack)."""
    dataset = _open_index(table_path, storage_options)
    if dataset is None:
        return set()
    packs: set[str] = set()
    try:
        for batch in dataset.to_batches(columns=["pack"]):  # streamed: the index may be big
            packs.update(pc.unique(batch.column("pack")).to_pylist())
    except (ValueError, OSError) as exc:
        raise _unreadable(table_path, exc) from None
    return packs


@dataclass(frozen=True)
class DamagedEntry:
    """An index entry whose bytes are not what its key says (``verdict``: "damaged" with the
    blake3 read, or "unreadable" with why)."""

    entry: StoredPayload
    verdict: tuple[str, str]

    @property
    def reason(self) -> str:
        key = self.entry.digest.hex()
        kind, detail = self.verdict
        if kind == "damaged":
            return f"store index entry {key}: the bytes it names hash to {detail}"
        return f"store index entry {key}: its bytes cannot be read ({detail})"


def damaged_entries(
    table_path: str, storage_options: StorageOptions | None = None
) -> Iterable[DamagedEntry]:
    """Every index entry whose bytes do not hash to its key, the index streamed a batch at
    a time (an index of millions of entries never sits in memory); entries of retired packs
    are left out (gc is reclaiming them; writers no longer take them). An index whose files
    cannot be read raises :class:`StoreIndexError` (after the damage found before it)."""
    dataset = _open_index(table_path, storage_options)
    if dataset is None:
        return
    retired = set(retired_packs(table_path, storage_options))
    try:
        yield from _damaged_in(table_path, dataset, retired, storage_options)
    except (ValueError, OSError) as exc:
        raise _unreadable(table_path, exc) from None


def _damaged_in(
    table_path: str,
    dataset: LanceDataset,
    retired: Set[str],
    storage_options: StorageOptions | None,
) -> Iterable[DamagedEntry]:
    for batch in dataset.to_batches(columns=INDEX_SCHEMA.names, batch_size=_CHECK_WINDOW * 16):
        entries = [
            StoredPayload(*row)
            for row in _rows(pa.Table.from_batches([batch]), INDEX_SCHEMA.names)
            if row[1] not in retired
        ]
        for entry, verdict in zip(
            entries, entry_verdicts(table_path, entries, storage_options), strict=True
        ):
            if verdict is not None:
                yield DamagedEntry(entry, verdict)


class PackWriter:
    """The packs one writing process adds to the store, rolled over at ``limit`` bytes.

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> packs = PackWriter(tempfile.mkdtemp(), "w1-", WriteQueue(), limit=1 << 20)
    >>> first = packs.write(b"hello", content_hash(b"hello"))
    >>> (first.position, first.size), packs.write(b"world", content_hash(b"world")).position
    ((0, 5), 5)
    >>> packs.finish(); len(packs.packs)
    1
    """

    def __init__(
        self,
        table_path: str,
        name_prefix: str,
        queue: WriteQueue,
        limit: int,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.table_path = table_path
        self.root = store_dir(table_path)
        self.name_prefix = name_prefix
        self.queue = queue
        self.limit = limit
        self.storage_options = storage_options
        self.packs: list[str] = []
        self.stored: list[StoredPayload] = []
        self._file: SidecarFile | None = None
        self._files: list[SidecarFile] = []
        self._next: str | None = None  # the name the next pack gets
        self._size = 0

    def next_place(self, size: int) -> tuple[str, int]:
        """The pack and position the next payload of ``size`` bytes goes to (a new pack past
        the size limit), so that it can be claimed before it is written (nothing is created
        until it is)."""
        if self._file is not None and self._size and self._size + size > self.limit:
            self._close()
        if self._file is not None:
            return self.packs[-1], self._size
        if self._next is None:
            self._next = f"{PACKS_DIR}/{self.name_prefix}{uuid.uuid4().hex}.pack"
        return self._next, 0

    def write(self, payload: bytes | memoryview, digest: bytes) -> StoredPayload:
        """Append ``payload`` to the current pack (a new one past the size limit)."""
        pack, _ = self.next_place(len(payload))
        if self._file is None:
            self._file = SidecarFile(f"{self.root}/{pack}", self.queue, self.storage_options)
            self._files.append(self._file)
            self.packs.append(pack)
            self._next, self._size = None, 0
        stored = StoredPayload(digest, self.packs[-1], self._size, len(payload))
        self._file.write(payload)
        self._size += len(payload)
        self.stored.append(stored)
        return stored

    def flush(self) -> None:
        """Hand the open pack's bytes so far to the queue (written once it drains)."""
        if self._file is not None:
            self._file.flush()

    def finish(self) -> None:
        """Close the current pack (its bytes are written once the queue drains)."""
        self._close()

    def abort_open(self) -> None:
        """Give up on packs still being written (after their queue stopped)."""
        for file in self._files:
            file.abort()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close(wait=False)
            self._file = None


class StoreWriter:
    """What one writing process adds to the store: payloads the index does not hold yet go
    to new packs; every data file of the write dedups against the index and against them.

    :meth:`place_many` looks a batch of payloads up in the index in one query (call it once
    per batch; :meth:`place` is one payload). :meth:`take_new` hands each data file the
    payloads added since the last call and the packs holding them (what its commit records in
    the index, and what its abort removes).
    """

    def __init__(
        self,
        table_path: str,
        base_id: int,
        name_prefix: str,
        pack_limit: int,
        storage_options: StorageOptions | None = None,
        load_index: bool = True,
        avoid: frozenset[str] = frozenset(),
        claims: Claims | None = None,
    ) -> None:
        self.base_id = base_id
        # the tasks of a Spark write claim new payloads, so that only one of them stores each
        self.claims = claims
        # a Spark write that joined its rows with the index already turned what it found into
        # references (see blobhouse.spark.write_table): no task needs the index
        self.index = (
            StoreIndex.open(table_path, storage_options)
            if load_index
            else StoreIndex.empty(table_path)
        )
        # packs never to reference
        self.retired = frozenset(retired_packs(table_path, storage_options)) | avoid
        self.found_packs: set[str] = set()  # packs found in the index: checked before commit
        self.damaged: set[StoredPayload] = set()  # index entries whose bytes differ from their key
        self.queue = WriteQueue()
        self.packs = PackWriter(table_path, name_prefix, self.queue, pack_limit, storage_options)
        # what this write references: payloads it stored, and payloads it found in the index
        self._written: dict[bytes, StoredPayload] = {}
        self._found: dict[bytes, StoredPayload] = {}
        # payloads another task of the write claimed and stores (checked at the commit)
        self.borrowed: dict[bytes, StoredPayload] = {}
        self.claimed = False  # it claimed payloads: its packs are kept if its task fails
        # per column: small payloads claimed, and how many of them turned out shared
        self._small_probe: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._small_claimed: dict[bytes, str] = {}  # claimed by this task, not met again yet
        self._reported = 0

    def place_many(
        self,
        payloads: Sequence[bytes | memoryview],
        digests: Sequence[bytes],
        column: str = "",
    ) -> list[PreparedBlob]:
        """The references of ``payloads`` (whose blake3 are ``digests``; of blob ``column``) in
        the store, writing only those the store lacks; the index is asked once for all."""
        known = (self._written, self._found, self.borrowed)
        unknown = [d for d in dict.fromkeys(digests) if not any(d in k for k in known)]
        if unknown:
            sizes = {d: len(p) for p, d in zip(payloads, digests, strict=True)}
            self._found.update(self._checked(self.index.find_copies(unknown, self.retired), sizes))
        repeated = set()
        if self.claims is not None and len(unknown) < len(digests):
            seen: set[bytes] = set()
            repeated = {d for d in digests if d in seen or seen.add(d)}
        return [
            self._place(p, d, column, d in repeated) for p, d in zip(payloads, digests, strict=True)
        ]

    def _checked(
        self, copies: Mapping[bytes, Sequence[StoredPayload]], sizes: Mapping[bytes, int]
    ) -> dict[bytes, StoredPayload]:
        """The entries of ``copies`` whose bytes are what their key says; a payload without
        one is stored anew (a damaged entry is named in a warning, once per write)."""
        checked = checked_entries(self.packs.table_path, copies, sizes, self.packs.storage_options)
        new = [e for e in checked.damaged if e not in self.damaged]  # warned once per write
        if new and not self.damaged:
            warnings.warn(
                StoreIndexWarning(
                    f"the store index of {self.packs.table_path} names bytes that differ from "
                    f"its entries (e.g. {new[0].digest.hex()[:16]} at {new[0].pack} "
                    f"[{new[0].position}, +{new[0].size})): this write stored those payloads "
                    "anew; `blobhouse verify --deep` lists every damaged entry and its rows"
                ),
                stacklevel=4,
            )
        self.damaged.update(new)
        return checked.usable

    def place(self, payload: bytes | memoryview, digest: bytes) -> PreparedBlob:
        """The reference of ``payload`` in the store, writing it only if the store lacks it."""
        return self.place_many([payload], [digest])[0]

    def _place(
        self, payload: bytes | memoryview, digest: bytes, column: str = "", repeated: bool = False
    ) -> PreparedBlob:
        stored = self._written.get(digest) or self.borrowed.get(digest)
        if stored is not None and digest in self._small_claimed:  # met again: shared
            self._small_probe[self._small_claimed.pop(digest)][1] += 1
        if stored is None:
            stored = self._found.get(digest)
            if stored is not None:
                self.found_packs.add(stored.pack)
            elif self._claimed_elsewhere(payload, digest, column, repeated):
                stored = self.borrowed[digest]
            else:  # not in the index, or in a pack gc is reclaiming: store anew
                stored = self._written[digest] = self.packs.write(payload, digest)
        return stored.prepared(self.base_id)

    def _claimed_elsewhere(
        self, payload: bytes | memoryview, digest: bytes, column: str, repeated: bool
    ) -> bool:
        """Whether another task of the write claimed ``digest`` first (then it is borrowed);
        else this one claims it, if worth it, and stores it (blobhouse.claims)."""
        small = len(payload) <= CLAIM_MIN_BYTES
        if self.claims is None or (small and not repeated and not self._small_worth(column)):
            return False
        pack, position = self.packs.next_place(len(payload))
        mine = Claim(digest, pack, position, len(payload), self.claims.claimant)
        theirs = self.claims.claim(mine)
        if small:
            self._small_probe[column][0] += 1
            if theirs is None:
                self._small_claimed[digest] = column
            else:  # another task met it: shared
                self._small_probe[column][1] += 1
        if theirs is None:
            self.claimed = True
            return False
        self.borrowed[digest] = StoredPayload(digest, theirs.pack, theirs.position, theirs.size)
        return True

    def _small_worth(self, column: str) -> bool:
        """Whether claiming ``column``'s small payloads pays: its first
        :data:`~blobhouse.claims.SMALL_PROBE` are claimed, later ones while at least 1 in
        :data:`~blobhouse.claims.SMALL_SHARED_RATIO` turned out shared (a column of thumbnails
        unique per row stops claiming; one of calibration files keeps on)."""
        claimed, shared = self._small_probe[column]
        return claimed < SMALL_PROBE or shared * SMALL_SHARED_RATIO >= claimed

    def take_new(self) -> tuple[tuple[str, ...], tuple[StoredPayload, ...]]:
        """Packs and payloads stored since the last call, once their bytes are written."""
        self.packs.flush()
        self.queue.drain()
        stored = tuple(self.packs.stored[self._reported :])
        self._reported = len(self.packs.stored)
        return tuple(dict.fromkeys(s.pack for s in stored)), stored

    def finish(self) -> None:
        """Close the open pack and wait for every byte."""
        self.packs.finish()
        self.queue.close()

    def abort(self) -> None:
        """Remove every pack this writer created (its write will not commit); a task that
        claimed payloads finishes its packs instead: other tasks of the write may reference
        them, and the commit checks them (blobhouse.claims)."""
        if self.claimed:
            with contextlib.suppress(Exception):
                self.finish()
                return
        self.packs.finish()
        self.queue.abandon()
        self.packs.abort_open()
        self.queue.close()
        remove_packs(self.packs.table_path, self.packs.packs, self.packs.storage_options)


class StoreReference:
    """Recognizes resolved references into the table's own store, so a rewrite (compaction)
    keeps them as store references instead of treating them as user-owned external blobs."""

    def __init__(
        self,
        table_path: str,
        base_id: int,
        storage_options: StorageOptions | None = None,
        digests: Mapping[tuple[str, int, int], bytes] | None = None,
    ) -> None:
        self.base_id = base_id
        self.storage_options = storage_options
        self.digests = digests if digests is not None else {}
        # compared in the canonical form: any spelling of a pack's path is recognized
        self.prefix = normalize_uri(store_dir(table_path)) + "/"
        self.found: set[str] = set()  # packs referenced this way: checked before commit
        self._sizes: dict[str, int] = {}

    def reference(self, column: LogicalColumn, row: int) -> PreparedBlob | None:
        """The store reference of row ``row`` of ``column`` (whose row holds a uri), or None
        when the uri is not a pack of this table's store. The range must lie inside the pack."""
        if column.position is None:
            return None
        try:
            uri = normalize_uri(column.uri[row])
        except InvalidInputError:
            return None  # not a store reference; the external check names the problem
        if not uri.startswith(f"{self.prefix}{PACKS_DIR}/"):
            return None
        pack = uri.removeprefix(self.prefix)
        if not PACK_NAME.fullmatch(pack):
            raise ExternalBlobError(
                f"blob column {column.column!r}, row {column.first_row + row}: {uri} is not a "
                "pack of the table's store"
            )
        position, size = column.position[row], column.size[row]
        if pack not in self._sizes:
            self._sizes[pack] = object_size(
                uri, column=column.column, row=row, storage_options=self.storage_options
            )
        if position + size > self._sizes[pack]:
            raise ExternalBlobError(
                f"blob column {column.column!r}, row {column.first_row + row}: range "
                f"[{position}, +{size}) is past the end of store pack {pack} "
                f"({self._sizes[pack]} bytes)"
            )
        self.found.add(pack)
        return StoredPayload(b"", pack, position, size).prepared(self.base_id)

    def recorded(self, reference: PreparedBlob) -> bytes | None:
        """The blake3 the rewritten rows recorded for the store payload ``reference`` names
        (None: unknown, e.g. rows Lance rewrote)."""
        return self.digests.get((reference.uri, reference.position, reference.size))


def store_uri_prefix(table_uri: str) -> str:
    """The prefix resolved references into the table's store start with."""
    return f"{as_uri(store_dir(table_uri))}/"


def remove_packs(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Delete store packs (relative to the store directory) that nothing committed uses."""
    for pack in packs:
        uri = as_uri(f"{store_dir(table_path)}/{pack}")
        with contextlib.suppress(OSError):
            object_store(uri, storage_options).delete(uri)


def remove_staged_packs(
    table_path: str, name_prefix: str, storage_options: StorageOptions | None = None
) -> None:
    """Delete every pack whose name starts with ``name_prefix`` (what one write staged)."""
    root = as_uri(f"{store_dir(table_path)}/{PACKS_DIR}")
    store = object_store(root, storage_options)
    try:
        listed = store.list(root)
    except OSError:  # cleanup is best effort: gc removes what is left, the cause is raised
        return
    for info in listed:
        if info.name.startswith(name_prefix):
            with contextlib.suppress(OSError):
                store.delete(f"{root}/{info.name}")


def retired_packs(
    table_path: str, storage_options: StorageOptions | None = None
) -> dict[str, float]:
    """Packs gc has retired (tombstoned), with the time each was retired (store clock)."""
    root = as_uri(f"{store_dir(table_path)}/{TOMBSTONES_DIR}")
    listed = object_store(root, storage_options).list(root)
    return {f"{PACKS_DIR}/{info.name}": info.mtime for info in listed if "/" not in info.name}


def retire_packs(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Tombstone ``packs`` and drop their index entries: from now on writers store those
    payloads anew, and a writer that found one earlier refuses to commit (see
    :func:`check_packs_usable`)."""
    packs = sorted(packs)
    if not packs:
        return
    for pack in packs:
        uri = _tombstone_uri(table_path, pack)
        object_store(uri, storage_options).put(uri, b"")
    quoted = ", ".join("'" + p.replace("'", "''") + "'" for p in packs)
    for attempt in range(5):
        try:
            index = lance.dataset(index_uri(table_path), storage_options=storage_options)
            index.delete(f"pack IN ({quoted})")
            return
        except (ValueError, OSError):
            # a writer appended to the index meanwhile; the tombstones already keep writers
            # away, and gc only deletes a pack once the index no longer names it
            time.sleep(0.05 * (attempt + 1))


def forget_tombstone(
    table_path: str, pack: str, storage_options: StorageOptions | None = None
) -> None:
    """Take a pack back from retirement (a retained version references it after all)."""
    uri = _tombstone_uri(table_path, pack)
    with contextlib.suppress(OSError):
        object_store(uri, storage_options).delete(uri)


def _tombstone_uri(table_path: str, pack: str) -> str:
    name = pack.removeprefix(PACKS_DIR + "/")
    return as_uri(f"{store_dir(table_path)}/{TOMBSTONES_DIR}/{name}")


def missing_objects(
    table_path: str, paths: Sequence[str], storage_options: StorageOptions | None
) -> list[str]:
    """Which of ``paths`` (relative to the table) do not exist. On an object store each is a
    request: they run in parallel."""
    root = as_uri(table_path)
    sizes = object_sizes([f"{root}/{p}" for p in paths], storage_options)
    return [p for p, size in zip(paths, sizes, strict=True) if size is None]


def check_packs_usable(
    table_path: str, packs: Iterable[str], storage_options: StorageOptions | None = None
) -> None:
    """Refuse to commit references to packs gc retired or removed while the write ran (the
    write found them in the index earlier); retrying the write stores those payloads anew."""
    packs = set(packs)
    if not packs:
        return
    retired = set(retired_packs(table_path, storage_options)) & packs
    others = sorted(f"{STORE_DIR}/{p}" for p in packs - retired)
    missing = {
        p.removeprefix(f"{STORE_DIR}/")
        for p in missing_objects(table_path, others, storage_options)
    }
    if retired or missing:
        raise StoreRaceError(
            f"store pack(s) {sorted(retired | missing)} were retired by gc while this write ran; "
            "nothing was committed, retry the write (it stores those payloads anew)"
        )
