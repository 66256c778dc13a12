"""One part of the store's index (its level 0, or one of its shards: :mod:`blobhouse.store.index`):
a Lance dataset of blake3 -> (pack, position, size), looked up through digest filters, a sorted
run and scalar indices, appended after commits, maintained by gc. Every function here takes the
part's URI, never the table's."""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence, Set
from datetime import timedelta

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset
from lance.commit import CommitConflictError
from lance.indices import IndexConfig

from blobhouse.dedup import digest_matrix
from blobhouse.errors import (
    BlobhouseError,
    StoreIndexError,
    StoreIndexWarning,
    lance_message,
)
from blobhouse.files.references import file_path
from blobhouse.io.objects import StorageOptions, object_store
from blobhouse.layout import INDEX_FILTERS_DIR, INDEX_RUNS_DIR, index_filter_name
from blobhouse.store.digest_filter import (
    DigestFilter,
    FilterFile,
    may_contain,
    read_filters,
    write_filter,
)
from blobhouse.store.packs import StoredPayload
from blobhouse.store.sorted_run import SortedRun, fragment_signatures, read_runs, write_run

_INDEX_FRAGMENTS = 8  # more than this many and gc compacts the index


# level 0 between gc runs: every write appends a fragment, a filter and a version, and each
# version's manifest lists every fragment (measured before writers merged and cleaned: 4.2 GB
# of manifests and 0.55 s appends after 10,000 small writes). A writer keeps them bounded.
_SMALL_ROWS = 8192  # fragments of fewer rows are small: merged by writers
# small fragments merge by size tiers (rows < width, < width^2, ...): once a tier holds this many
# they merge into one of the next, so an entry is rewritten once a tier (5 times below
# _SMALL_ROWS), and at most width - 1 small fragments a tier stay
_MERGE_WIDTH = 8
_CLEAN_EVERY = 256  # the writer whose commit makes a multiple of this many versions cleans


#: how long an index version stays once a newer one exists: a writer reads the version it
#: opened for as long as its write runs (one that outlives it reopens the index)
READER_WINDOW = timedelta(hours=1)


#: in level 0's config while gc moves its fragments into the shards (their ids): writers do
#: not merge fragments then
MOVING = "blobhouse.index.moving"


_INDEX_FILTERS = 8  # more filters than this cover it and gc merges them into one


LOOKUP_WINDOW = 4096  # hashes per scalar-index query


_UNINDEXED_ROWS = 100_000  # more index rows outside its scalar indices and a writer adds them


_RUN_ENTRIES = 100_000  # a smaller index answers found hashes from Lance's BTREE as fast


# 256 rows per page instead of 4,096: a lookup reads one page per hash (random hashes touch
# every page), measured 6x faster cold and half the memory at 10 M entries
_LOOKUPS = {"blake3": IndexConfig("btree", {"zone_size": 256}), "pack": "BTREE"}


INDEX_SCHEMA = pa.schema(
    [
        # plain binary and signed integers: Spark reads the index for its lookup join
        pa.field("blake3", pa.binary(), nullable=False),
        pa.field("pack", pa.utf8(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)


PackEntries = dict[tuple[int, int], bytes]  # (position, size) -> blake3 of one pack


class IndexPart:
    """One part of the store's index as one process reads it (the version current when
    opened): the payloads of the hashes at hand, and one pack's entries. Nothing loads the
    whole part: a lookup first asks the filters of its data files
    (:mod:`blobhouse.store.digest_filter`, one block read per hash), then gc's sorted run
    (:mod:`blobhouse.store.sorted_run`) and the scalar index on ``blake3`` for the hashes they
    may hold, scanning the fragments the scalar indices do not cover yet (see
    :func:`index_lookups`).

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> uri, digest = tempfile.mkdtemp() + "/index", content_hash(b"hello")
    >>> _ = append_to_part(uri, [StoredPayload(digest, "packs/a.pack", 0, 5)])
    >>> part = IndexPart.open(uri)
    >>> part.find_copies([digest, content_hash(b"other")])[digest][0].pack
    'packs/a.pack'
    >>> part.pack_entries("packs/a.pack") == {(0, 5): digest}
    True
    """

    def __init__(
        self,
        uri: str,
        dataset: LanceDataset | None,
        storage_options: StorageOptions | None = None,
        filtered: bool = True,
    ) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self._dataset = dataset
        # read at the first lookup; [] for a part whose filters are kept elsewhere (a shard:
        # the caller asked them already)
        self._filters: list[FilterFile] | None = None if filtered else []
        # gc's sorted run and the fragments it misses, () for none: read at the first lookup
        self._run: tuple[SortedRun, list[lance.LanceFragment]] | tuple[()] | None = None

    @classmethod
    def open(
        cls, uri: str, storage_options: StorageOptions | None = None, filtered: bool = True
    ) -> IndexPart:
        """The part as it is now (an empty one when nothing was stored in it yet)."""
        return cls(uri, open_part(uri, storage_options), storage_options, filtered)

    @property
    def dataset(self) -> LanceDataset | None:
        """The part's version this process reads (None: nothing stored in it yet)."""
        return self._dataset

    def find_copies(
        self, digests: Sequence[bytes], avoid: Set[str] = frozenset()
    ) -> dict[bytes, list[StoredPayload]]:
        """Every indexed copy of each of ``digests`` (concurrent writers may both have stored
        a payload), in packs other than ``avoid``: from gc's sorted run of the index where it
        covers the index, and through the scalar indices in what it does not."""
        found: defaultdict[bytes, list[StoredPayload]] = defaultdict(list)
        if self._dataset is None or not digests or not self._dataset.get_fragments():
            return found  # e.g. level 0 right after gc moved it into the shards
        held = self._maybe_held(digests)  # new payloads stop here: no filter holds them
        rest = self._from_run(held, found) if held else []
        if rest is None or rest:
            for start in range(0, len(held), LOOKUP_WINDOW):
                window = pa.array(held[start : start + LOOKUP_WINDOW], pa.binary())
                self._add(found, self._query(pc.field("blake3").isin(window), rest))
        return {
            digest: kept
            for digest, copies in found.items()
            if (kept := [c for c in dict.fromkeys(copies) if c.pack not in avoid])
        }

    def _from_run(
        self, digests: Sequence[bytes], found: defaultdict[bytes, list[StoredPayload]]
    ) -> list[lance.LanceFragment] | None:
        """Add what gc's sorted run finds of ``digests`` to ``found``; the fragments the run
        does not cover (None: there is no usable run, ask the scalar indices everywhere)."""
        try:
            if self._run is None:
                runs = read_runs(runs_uri(self.uri), self.storage_options)
                self._run = _usable_run(runs, self._dataset)
            if not self._run:
                return None
            run, rest = self._run
            _, addresses = run.candidates(digest_matrix(digests))
            if addresses:
                rows = self._dataset._take_rows(
                    addresses, columns=INDEX_SCHEMA.names, ignore_deletions=True
                )
                wanted = set(digests)  # a prefix is not a digest: the whole one decides
                self._add(found, rows, lambda digest: digest in wanted)
            return rest
        # e.g. gc replaced the run meanwhile; TypeError: a pylance whose unstable _take_rows
        # takes other arguments (the scalar indices answer all the same)
        except (BlobhouseError, OSError, ValueError, TypeError):
            self._run = ()
            found.clear()
            return None

    @staticmethod
    def _add(
        found: defaultdict[bytes, list[StoredPayload]],
        rows: pa.Table,
        keep: Callable[[bytes], bool] = lambda _: True,
    ) -> None:
        for digest, pack, position, size in index_rows(rows, INDEX_SCHEMA.names):
            if keep(digest):
                found[digest].append(StoredPayload(digest, pack, position, size))

    def _maybe_held(self, digests: Sequence[bytes]) -> Sequence[bytes]:
        """Those of ``digests`` the index may hold: the ones no filter rules out (all of
        them while a data file has no filter yet, or when a filter cannot be read)."""
        try:
            if self._filters is None:
                self._filters = covering_filters(self.uri, self._dataset, self.storage_options)
            if not self._filters:
                return digests
            maybe = may_contain(self._filters, digest_matrix(digests), self.storage_options)
        except (BlobhouseError, OSError, ValueError):  # e.g. gc replaced a filter meanwhile
            self._filters = []
            return digests
        return [d for d, held in zip(digests, maybe.tolist(), strict=True) if held]

    def pack_entries(self, pack: str) -> PackEntries:
        """The entries of ``pack`` in this part, by their ``(position, size)``."""
        entries: PackEntries = {}
        if self._dataset is not None:
            rows = self._query(pc.field("pack") == pack)
            for digest, position, size in index_rows(rows, ["blake3", "position", "size"]):
                entries.setdefault((position, size), digest)
        return entries

    def _query(
        self, condition: pc.Expression, fragments: list[lance.LanceFragment] | None = None
    ) -> pa.Table:
        """The index rows that meet ``condition``, in ``fragments`` (default: all)."""
        try:
            return _scan(self._dataset, condition, fragments)
        except (ValueError, OSError):
            # a long write outlived its version of the index (gc removed it after a compaction):
            # the current version has every entry that one had, minus retired packs
            self._dataset = open_part(self.uri, self.storage_options)
            self._filters, self._run = None, None  # the new version's data files may differ
            if self._dataset is None:
                return INDEX_SCHEMA.empty_table()
        try:
            return _scan(self._dataset, condition)
        except (ValueError, OSError):
            pass
        try:  # its scalar index may be what is damaged: scan its data instead
            return self._dataset.to_table(filter=condition, use_scalar_index=False)
        except (ValueError, OSError) as exc:
            # the index is a cache: what it cannot answer is stored anew (lower dedup)
            warnings.warn(
                StoreIndexWarning(
                    f"the store index of {self.uri} cannot be read ({lance_message(exc)}): "
                    "payloads are stored anew; `blobhouse verify` names the damage"
                ),
                stacklevel=4,
            )
            return INDEX_SCHEMA.empty_table()


def _scan(
    dataset: LanceDataset,
    condition: pc.Expression,
    fragments: list[lance.LanceFragment] | None = None,
) -> pa.Table:
    if fragments is None:
        return dataset.to_table(filter=condition)
    return dataset.scanner(filter=condition, fragments=fragments).to_table()


def _files_of(fragments: Iterable[lance.LanceFragment]) -> set[str]:
    return {str(f.path) for fragment in fragments for f in fragment.data_files()}


def _usable_run(
    runs: Iterable[SortedRun], dataset: LanceDataset
) -> tuple[SortedRun, list[lance.LanceFragment]] | tuple[()]:
    """The widest of ``runs`` that is still true of ``dataset``, and the fragments it does
    not cover; ``()`` when there is none."""
    fragments = dataset.get_fragments()
    signatures = fragment_signatures(fragments)
    usable = [r for r in runs if r.usable_on(signatures)]
    if not usable:
        return ()
    run = max(usable, key=lambda r: len(r.covered))
    rest = [f for f in fragments if not _files_of([f]) <= run.covered.keys()]
    return run, rest


def index_rows(table: pa.Table, names: Sequence[str]) -> Iterable[tuple]:
    return zip(*(table.column(name).to_pylist() for name in names), strict=True)


def open_part(uri: str, storage_options: StorageOptions | None) -> LanceDataset | None:
    try:
        return lance.dataset(uri, storage_options=storage_options)
    except (ValueError, OSError):
        return None  # nothing stored yet


#: the entries a committed change added to the store, readable again: batches of INDEX_SCHEMA
EntryBatches = Callable[[], Iterable[pa.RecordBatch]]


def entry_batches(stored: Sequence[StoredPayload] | EntryBatches) -> EntryBatches:
    """``stored`` as :data:`EntryBatches` (a function giving them already is returned as is).

    >>> from blobhouse.dedup import content_hash
    >>> entries = entry_batches([StoredPayload(content_hash(b"x"), "packs/a.pack", 0, 1)])
    >>> [b.num_rows for b in entries()], [b.num_rows for b in entries()]
    ([1], [1])
    """
    if callable(stored):
        return stored
    table = pa.table(
        {
            "blake3": [s.digest for s in stored],
            "pack": [s.pack for s in stored],
            "position": [s.position for s in stored],
            "size": [s.size for s in stored],
        },
        schema=INDEX_SCHEMA,
    )
    return table.to_batches


def append_to_part(
    uri: str,
    stored: Sequence[StoredPayload] | EntryBatches,
    storage_options: StorageOptions | None = None,
    filtered: bool = True,
    properties: dict[str, str] | None = None,
) -> LanceDataset | None:
    """Record payloads a committed write stored (concurrent appends are Lance appends),
    streamed from ``stored`` when it is a function giving batches (a Spark write's records:
    the driver never holds them all); the index's version this append made, None when there
    was nothing to add. ``filtered``: cover what was added with a filter of the part's own
    (a shard's filters are kept by the caller); ``properties``: the commit's own (Lance's
    transaction properties)."""
    entries = entry_batches(stored)
    first_pass = (b for b in entries() if b.num_rows)
    first = next(first_pass, None)
    if first is None:
        return None

    def rows() -> pa.RecordBatchReader:
        """The entries: the first read goes on from the batch that showed there are some."""
        nonlocal first_pass
        batches = (b for b in entries() if b.num_rows)
        if first_pass is not None:
            batches, first_pass = itertools.chain([first], first_pass), None
        return pa.RecordBatchReader.from_batches(INDEX_SCHEMA, batches)

    def write(target: str | LanceDataset, mode: str) -> LanceDataset:
        return lance.write_dataset(
            rows(), target, mode=mode, storage_options=storage_options,
            transaction_properties=properties,
        )  # fmt: skip

    dataset = open_part(uri, storage_options)
    if dataset is None:
        # a concurrent writer may create it first: then append, Lance merges appends (never an
        # append to a missing dataset: Lance makes it an overwrite, which can win over a create)
        with contextlib.suppress(ValueError, OSError):
            dataset = write(uri, "create")
        if dataset is not None:
            return _indexed(uri, dataset, storage_options, filtered)
    # on the version just opened (no second listing of its versions; a commit meanwhile is
    # merged by Lance's conflict resolution)
    dataset = write(uri if dataset is None else dataset, "append")
    return _indexed(uri, dataset, storage_options, filtered)


def _indexed(
    uri: str, dataset: LanceDataset, storage_options: StorageOptions | None, filtered: bool
) -> LanceDataset:
    """``dataset``, the index's version an append made, with its filter and lookups."""
    # its filter lets the next writer skip the lookup of hashes none of the index holds (gc
    # covers big fragments); a big write indexes what it added (lookups scan what the scalar
    # indices do not cover), small ones leave that to gc
    try:
        if filtered:
            write_filters(uri, dataset, storage_options, max_rows=_UNINDEXED_ROWS)
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the store index of {uri} got no filter: {exc}", stacklevel=3)
    # a copy: creating a scalar index moves the dataset it is called on to the version made
    index_lookups(uri, storage_options, dataset=copy.copy(dataset))
    return dataset


def tidy_level0(
    uri: str, dataset: LanceDataset, storage_options: StorageOptions | None = None
) -> None:
    """A writer's share of level 0's upkeep, after its append made ``dataset`` and it looked
    for duplicates through that version and the one before (which this may remove): merge
    small fragments of like size outside the scalar indices and gc's sorted run
    (:func:`merge_small_fragments`), and once its commits make a multiple of
    :data:`_CLEAN_EVERY` versions remove versions older than :data:`READER_WINDOW`. So
    appends, manifests and lookups stay the same size however many writes come between
    two gc runs. The index is a cache: a failure here is a warning, and a concurrent commit
    that wins (another writer's merge, gc) leaves the work to it."""
    try:
        merged = merge_small_fragments(uri, dataset, storage_options)
        last = dataset.version if merged is None else merged.version
        # this writer's commits (its append, its merge) made a multiple of _CLEAN_EVERY
        if last // _CLEAN_EVERY > (dataset.version - 1) // _CLEAN_EVERY:
            lance.dataset(uri, storage_options=storage_options).cleanup_old_versions(
                older_than=READER_WINDOW
            )
    except CommitConflictError:
        pass  # another writer merged them, or gc maintained the index
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the store index of {uri} was not tidied: {exc}", stacklevel=3)


def merge_small_fragments(
    uri: str, dataset: LanceDataset, storage_options: StorageOptions | None = None
) -> LanceDataset | None:
    """Rewrite small fragments of ``dataset`` (fewer than :data:`_SMALL_ROWS` rows) that no
    scalar index and no sorted run covers (both stay true) into one, once
    :data:`_MERGE_WIDTH` of a size tier are there (:func:`_due`); the version made (None:
    nothing to merge). The new data file gets its filter before the commit, and the filters
    that covered only the merged files go after it (a reader of an older version that misses
    them asks the scalar index).

    >>> import tempfile
    >>> from blobhouse.dedup import content_hash
    >>> uri = tempfile.mkdtemp() + "/index"
    >>> for i in range(_MERGE_WIDTH):
    ...     made = append_to_part(uri, [StoredPayload(content_hash(b"%d" % i), "p.pack", i, 1)])
    >>> _ = merge_small_fragments(uri, made)  # due: 8 fragments of one entry
    >>> part = IndexPart.open(uri)
    >>> len(part.dataset.get_fragments()), part.dataset.count_rows()
    (1, 8)
    >>> part.find_copies([content_hash(b"3")])[content_hash(b"3")][0].position
    3
    """
    small = [f for f in dataset.get_fragments() if f.metadata.physical_rows < _SMALL_ROWS]
    if not _due(small) or MOVING in dataset.config():
        return None
    covered = {i for d in dataset.describe_indices() for s in d.segments for i in s.fragment_ids}
    usable = _usable_run(read_runs(runs_uri(uri), storage_options), dataset)
    if usable:
        covered |= {int(sign.split(":", 1)[0]) for sign in usable[0].covered.values()}
    merged = _due([f for f in small if f.fragment_id not in covered])
    if not merged:
        return None
    bloom = DigestFilter.for_entries(sum(f.metadata.physical_rows for f in merged))

    def rows() -> Iterable[pa.RecordBatch]:
        scanner = dataset.scanner(columns=INDEX_SCHEMA.names, fragments=merged)
        for batch in scanner.to_batches():
            bloom.add(digest_matrix(batch.column("blake3")))
            yield batch

    reader = pa.RecordBatchReader.from_batches(INDEX_SCHEMA, rows())
    new = lance.fragment.write_fragments(
        reader, dataset, INDEX_SCHEMA, max_rows_per_file=1 << 30, storage_options=storage_options
    )
    names = [file_path(f) for fragment in new for f in fragment.files]
    filter_uri = f"{filters_uri(uri)}/{index_filter_name()}"
    write_filter(filter_uri, names, bloom, storage_options)
    group = lance.LanceOperation.RewriteGroup([f.metadata for f in merged], new)
    try:
        made = lance.LanceDataset.commit(
            uri,
            lance.LanceOperation.Rewrite([group], rewritten_indices=[]),
            read_version=dataset.version,
            storage_options=storage_options,
        )
    except (ValueError, OSError):
        # refused (another merge or gc won): what it wrote goes, unless the commit landed after
        # all; an interrupt leaves them to Lance's cleanup and gc (never a committed file lost)
        latest = open_part(uri, storage_options)
        if latest is None or not set(names) & set(data_files(latest)):
            store = object_store(uri, storage_options)
            store.delete_many([filter_uri, *(f"{uri}/data/{name}" for name in names)])
        raise
    gone = _files_of(merged)
    folder = filters_uri(uri)
    stale = [f.uri for f in read_filters(folder, storage_options) if f.covered <= gone]
    object_store(folder, storage_options).delete_many(stale)
    return made


def _due(fragments: Sequence[lance.LanceFragment]) -> list[lance.LanceFragment]:
    """Those of ``fragments`` one merge takes: every one of the size tiers up to the highest
    that holds :data:`_MERGE_WIDTH`, counting the fragment a merge of the tier below adds
    to it (none: no tier is full).

    >>> from types import SimpleNamespace as NS
    >>> frags = lambda *rows: [NS(metadata=NS(physical_rows=r)) for r in rows]
    >>> [f.metadata.physical_rows for f in _due(frags(1, 1, 1, 1, 1, 1, 1, 9))]
    []
    >>> [f.metadata.physical_rows for f in _due(frags(*[1] * 8, 9, 600))]
    [1, 1, 1, 1, 1, 1, 1, 1]
    >>> len(_due(frags(*[1] * 8, *[9] * 7, 600)))  # the merge of the first tier fills the next
    15
    """
    tiers: defaultdict[int, list[lance.LanceFragment]] = defaultdict(list)
    for fragment in fragments:
        tiers[_tier(fragment.metadata.physical_rows)].append(fragment)
    upto, carry = -1, 0
    for tier in range(max(tiers, default=-1) + 1):
        full = len(tiers[tier]) + carry >= _MERGE_WIDTH
        upto, carry = (tier, 1) if full else (upto, 0)
    return [f for tier in range(upto + 1) for f in tiers[tier]]


def _tier(rows: int) -> int:
    """The size tier of a fragment of ``rows`` rows: 0 below :data:`_MERGE_WIDTH`, 1 below
    its square, ..."""
    tier = 0
    while rows >= _MERGE_WIDTH:
        rows //= _MERGE_WIDTH
        tier += 1
    return tier


def index_lookups(
    uri: str,
    storage_options: StorageOptions | None = None,
    merge: bool = False,
    dataset: LanceDataset | None = None,
) -> None:
    """Create the index's scalar indices (``blake3`` for writers' lookups, ``pack`` for
    :meth:`StoreIndex.digest_at` and gc's deletes) if missing once the index holds more than
    :data:`_UNINDEXED_ROWS` entries (until then a lookup scans them in no time, and each
    scalar index would cost a write a dozen store requests), and extend them by a delta over
    the fragments added since once those hold many rows (writers and gc alike: a lookup scans
    a few small fragments in no time). Lance's scalar indices cover only the fragments they
    were built on: every lookup scans what they miss. ``merge``, or too many deltas: merge
    them into one (Lance compacts together only fragments that one delta covers). The index is
    a cache: a failure here is a warning (e.g. a concurrent commit on the index won).
    ``dataset``: the index as the caller has it open already."""
    dataset = dataset or open_part(uri, storage_options)
    if dataset is None:
        return
    try:
        present = {d.field_names[0]: d.name for d in dataset.describe_indices()}
        small = dataset.count_rows() <= _UNINDEXED_ROWS
        for column, config in _LOOKUPS.items():
            if column not in present and not small:
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
            f"the lookups of the store index of {uri} were not updated: {exc}",
            stacklevel=2,
        )


def maintain_part(
    uri: str,
    keep: timedelta,
    storage_options: StorageOptions | None = None,
    filtered: bool = True,
) -> None:
    """Compact the index (one small fragment per write adds up), bring its scalar indices up
    to date (:func:`index_lookups`), remove its versions older than ``keep``, and cover its
    data files with filters again (:func:`_tidy_filters`; not ``filtered``: a shard, whose
    filters the caller keeps). Lance's cleanup also removes files
    no version names once they are 7 days old: the leftovers of an index append that was
    killed before it committed. The index is a cache: a failure here is a warning."""
    dataset = open_part(uri, storage_options)
    if dataset is None:
        return  # no store, or nothing stored yet
    compact = len(dataset.get_fragments()) > _INDEX_FRAGMENTS
    index_lookups(uri, storage_options, merge=compact)
    try:
        dataset = lance.dataset(uri, storage_options=storage_options)
        if compact:  # remaps the scalar indices onto the new fragments
            dataset.optimize.compact_files()
        dataset.cleanup_old_versions(older_than=keep)
        if filtered:
            _tidy_filters(uri, keep, storage_options)
        _tidy_runs(uri, keep, storage_options)
    # e.g. a concurrent index delete won the commit, or a filter vanished while gc read it
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the store index of {uri} was not maintained: {exc}", stacklevel=2)


def filters_uri(uri: str) -> str:
    return f"{uri}/{INDEX_FILTERS_DIR}"


def runs_uri(uri: str) -> str:
    return f"{uri}/{INDEX_RUNS_DIR}"


def data_files(dataset: LanceDataset) -> dict[str, lance.LanceFragment]:
    """The index's data files (one per fragment) and their fragments."""
    return {
        file_path(data_file): fragment
        for fragment in dataset.get_fragments()
        for data_file in fragment.data_files()
    }


def covering_filters(
    uri: str,
    dataset: LanceDataset,
    storage_options: StorageOptions | None,
    filters: list[FilterFile] | None = None,
    files: Set[str] | None = None,
) -> list[FilterFile]:
    """Of ``filters`` (default: the index's), those that together cover ``files`` (default:
    every data file of ``dataset``); none if one is not covered yet (a lookup must then ask the
    scalar index for every hash)."""
    files = set(data_files(dataset)) if files is None else set(files)
    if filters is None:
        filters = read_filters(filters_uri(uri), storage_options)
    chosen: list[FilterFile] = []
    covered: set[str] = set()
    # the widest first, and none whose files others cover: each one asked adds false positives
    for bloom in sorted(filters, key=lambda f: -len(f.covered & files)):
        if (bloom.covered & files) - covered:
            chosen.append(bloom)
            covered |= bloom.covered
    return chosen if files <= covered else []


def write_filters(
    uri: str,
    dataset: LanceDataset,
    storage_options: StorageOptions | None = None,
    max_rows: int | None = None,
    filters: list[FilterFile] | None = None,
) -> frozenset[str]:
    """Cover the data files of ``dataset`` that none of ``filters`` (default: the index's)
    covers with one new filter, unless they hold more than ``max_rows`` rows (a writer covers
    its own small fragment; gc what a compaction wrote); the data files it covers."""
    if filters is None:
        filters = read_filters(filters_uri(uri), storage_options)
    covered = set().union(*(f.covered for f in filters))
    missing = {name: f for name, f in data_files(dataset).items() if name not in covered}
    rows = sum(f.physical_rows for f in missing.values())
    if not missing or (max_rows is not None and rows > max_rows):
        return frozenset()
    bloom = DigestFilter.for_entries(rows)
    for fragment in missing.values():
        for batch in fragment.to_batches(columns=["blake3"]):
            bloom.add(digest_matrix(batch.column(0)))
    write_filter(
        f"{filters_uri(uri)}/{index_filter_name()}", sorted(missing), bloom, storage_options
    )
    return frozenset(missing)


def _tidy_filters(uri: str, keep: timedelta, storage_options: StorageOptions | None = None) -> None:
    """Cover the index with filters again after gc's maintenance: one new filter for the data
    files a compaction wrote, or, once more than a few filters cover the index, one for all
    of it. Then remove the filters whose data files are all gone or covered by the new one,
    and files older than ``keep`` that are not whole filters (a writer died writing one)."""
    dataset = open_part(uri, storage_options)
    if dataset is None:
        return
    folder = filters_uri(uri)
    store = object_store(folder, storage_options)
    listed = store.list(folder)  # before the new filter is written: it is never removed below
    filters = read_filters(folder, storage_options)
    whole = len(covering_filters(uri, dataset, storage_options, filters)) > _INDEX_FILTERS
    fresh = write_filters(uri, dataset, storage_options, filters=[] if whole else filters)
    on_disk = {i.name for i in store.list(f"{uri}/data")}
    by_uri = {f.uri: f for f in filters}
    before = store.now(folder) - keep.total_seconds()
    for info in listed:
        file = f"{folder}/{info.name}"
        bloom = by_uri.get(file)
        # not a whole filter: removed once old; a filter: once its data files are all gone or
        # newly covered (a file a writer just covered is on disk, in no version gc saw: kept)
        if info.mtime < before if bloom is None else (bloom.covered & on_disk) <= fresh:
            store.delete(file)


def _tidy_runs(uri: str, keep: timedelta, storage_options: StorageOptions | None = None) -> None:
    """Build a sorted run of the whole index once what the widest usable run misses
    outgrows :func:`_run_due` (never for a small index: Lance's BTREE answers it as fast),
    then remove every other whole run (the kept one answers), and files older than ``keep``
    that are not whole runs (a gc died writing one). A lookup that loses its run meanwhile
    asks the scalar indices instead."""
    dataset = open_part(uri, storage_options)  # after the compaction and cleanup
    if dataset is None:
        return
    folder = runs_uri(uri)
    store = object_store(folder, storage_options)
    listed = store.list(folder)  # before the new run is written: it is never removed below
    runs = read_runs(folder, storage_options)
    usable = _usable_run(runs, dataset)
    kept = usable[0].uri if usable else None
    if _run_due(dataset.count_rows(), usable[0].entries if usable else 0):
        kept = write_run(folder, dataset, storage_options)
    whole = {r.uri for r in runs}
    before = store.now(folder) - keep.total_seconds()
    for info in listed:
        file = f"{folder}/{info.name}"
        if file != kept and (file in whole or info.mtime < before):
            store.delete(file)


def _run_due(total: int, covered: int) -> bool:
    """Whether gc builds a new run of an index of ``total`` entries, ``covered`` of them
    in a usable run: once the rest is more than a 16th of the index (as the index grows,
    each entry is written into runs ~17 times, whatever its size) and than what a
    writer's lookup scans outside the scalar indices.

    >>> _run_due(50_000, 0), _run_due(200_000, 0), _run_due(10**7, 10**7 - 500_000)
    (False, True, False)
    """
    return total >= _RUN_ENTRIES and total - covered > max(_UNINDEXED_ROWS, total // 16)


def unreadable_index(uri: str, cause: BaseException) -> StoreIndexError:
    """The error of the index part at ``uri``."""
    return StoreIndexError(f"the store index {uri} cannot be read: {lance_message(cause)}")


def packs_of(uri: str, storage_options: StorageOptions | None = None) -> set[str]:
    """Every pack the part names; :class:`StoreIndexError` when it cannot be read (or is
    missing: its caller knows it exists)."""
    dataset = open_part(uri, storage_options)
    if dataset is None:
        raise StoreIndexError(f"the store index part {uri} cannot be read")
    packs: set[str] = set()
    try:
        for batch in dataset.to_batches(columns=["pack"]):  # streamed: the index may be big
            packs.update(pc.unique(batch.column("pack")).to_pylist())
    except (ValueError, OSError) as exc:
        raise unreadable_index(uri, exc) from None
    return packs
