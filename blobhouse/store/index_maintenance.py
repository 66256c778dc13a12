"""gc's maintenance of the store index (:mod:`blobhouse.store.index`): once level 0 outgrows
:data:`SHARD_AFTER` entries it is moved into the shards of level 1 (:func:`move_to_shards`), and
each part is maintained on its own, as a unit of gc's runner (a Spark task each under
``blobhouse.spark.gc``): no process holds, scans or rewrites more than one shard.

>>> import tempfile
>>> from blobhouse.dedup import content_hash
>>> from blobhouse.store.index import StoreIndex, append_to_index
>>> from blobhouse.store.packs import StoredPayload
>>> root, digest = tempfile.mkdtemp(), content_hash(b"hello")
>>> _ = append_to_index(root, [StoredPayload(digest, "packs/a.pack", 0, 5)])
>>> move_to_shards(root, threshold=0)
1
>>> StoreIndex.open(root).find([digest])[digest].pack
'packs/a.pack'
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance import LanceDataset

from blobhouse.dedup import digest_matrix
from blobhouse.errors import BlobhouseError
from blobhouse.io.objects import StorageOptions, object_store
from blobhouse.layout import index_shard_name, shard_filter_name
from blobhouse.store.digest_filter import DigestFilter, read_filters, write_filter
from blobhouse.store.index import (
    LEVEL_ONE,
    EachPart,
    index_parts,
    open_index,
    runner_for,
    shard_shift,
    shards_of,
)
from blobhouse.store.index_part import (
    INDEX_SCHEMA,
    MOVING,
    EntryBatches,
    append_to_part,
    maintain_part,
    open_part,
)
from blobhouse.store.packs import (
    index_shard_filters_uri,
    index_shard_uri,
    index_uri,
    retired_packs,
)

SHARDS = 256  # level 1's shards when gc makes it: a hash's last byte names its shard


#: level-0 entries past which gc moves them into level 1 (2^24: up to 10 M entries a lookup
#: costs what it costs an empty store, measured; at 10^9 entries a shard holds ~4 M)
SHARD_AFTER = 1 << 24


_SHARD_FILTERS = 8  # more filters than this over one shard and gc merges them into one


_MOVED = "blobhouse.index.moved"  # in a shard's append: the move it took part of
_RECENT_COMMITS = 32  # a shard's commits looked through for an earlier try of a move


# a scan of a whole part a batch at a time: Lance's default read-ahead holds more of a big
# part the bigger it is (measured: 517 MB at 10 M entries, 295 MB with these)
_STREAMED = {
    "batch_size": 65536,
    "batch_readahead": 1,
    "fragment_readahead": 1,
    "io_buffer_size": 32 << 20,
}


def maintain_index(
    table_path: str,
    keep: timedelta,
    storage_options: StorageOptions | None = None,
    each_part: EachPart = None,
) -> int:
    """gc's maintenance of the index: move level 0 into the shards once it outgrows
    :data:`SHARD_AFTER` entries (:func:`move_to_shards`), then maintain each part on its own
    (:func:`~blobhouse.store.index_part.maintain_part`: compaction, scalar indices, filters,
    sorted run, old versions), through ``each_part``; how many entries were moved. The index
    is a cache: a failure here is a warning."""
    try:
        moved = move_to_shards(table_path, storage_options)
        parts = index_parts(table_path, storage_options)
    except (BlobhouseError, ValueError, OSError) as exc:  # a cache: gc goes on
        warnings.warn(f"the store index of {table_path} was not maintained: {exc}", stacklevel=2)
        return 0
    runner_for(each_part, parts)(_Maintain(table_path, keep, storage_options), parts)
    return moved


class _Maintain:
    """gc's maintenance of one part, as a unit a Spark task runs (it pickles): level 0's, or
    a shard's (:func:`maintain_shard`)."""

    def __init__(
        self, table_path: str, keep: timedelta, storage_options: StorageOptions | None
    ) -> None:
        self.table_path, self.keep, self.storage_options = table_path, keep, storage_options

    def __call__(self, uri: str) -> None:
        if uri == index_uri(self.table_path):
            maintain_part(uri, self.keep, self.storage_options)
        else:
            shard = int(uri.rstrip("/").rsplit("/", 1)[-1], 16)
            maintain_shard(self.table_path, shard, self.keep, self.storage_options)


def maintain_shard(
    table_path: str, shard: int, keep: timedelta, storage_options: StorageOptions | None = None
) -> None:
    """Maintain one shard (:func:`maintain_part`, but its filters), then merge its filters
    into one once more than :data:`_SHARD_FILTERS` cover it: one scan of the shard's hashes,
    memory 3.5 bytes per entry of this shard alone. The merged filter is written before the
    ones it replaces are removed (only those listed before the scan: a move's filter written
    meanwhile stays). Files older than ``keep`` that are not whole filters (a gc died writing
    one) are removed. A cache: a failure is a warning."""
    uri = index_shard_uri(table_path, shard)
    maintain_part(uri, keep, storage_options, filtered=False)
    folder = index_shard_filters_uri(table_path)
    try:
        store = object_store(folder, storage_options)
        mine = [i for i in store.list(folder) if i.name.startswith(f"{index_shard_name(shard)}-")]
        whole = read_filters(folder, storage_options, mine)
        before = store.now(folder) - keep.total_seconds()
        done = {f.uri for f in whole}
        removed = [  # not whole filters, and old: a gc died writing them
            f"{folder}/{i.name}"
            for i in mine
            if f"{folder}/{i.name}" not in done and i.mtime < before
        ]
        if len(whole) > _SHARD_FILTERS and (dataset := open_part(uri, storage_options)):
            count = dataset.count_rows()  # of the version scanned: the filter's size first
            _write_shard_filter(table_path, shard, _hashes(dataset), count, storage_options)
            removed += sorted(done)
        if removed:
            store.delete_many(removed)
    except (BlobhouseError, ValueError, OSError) as exc:
        warnings.warn(f"the filters of index shard {uri} were not merged: {exc}", stacklevel=2)


def _hashes(dataset: LanceDataset) -> Iterable[pa.Array]:
    for batch in dataset.to_batches(columns=["blake3"], **_STREAMED):
        yield batch.column(0)


def _write_shard_filter(
    table_path: str,
    shard: int,
    hashes: Iterable[pa.Array],
    entries: int,
    storage_options: StorageOptions | None,
) -> None:
    """A filter of ``shard`` over ``hashes`` (``entries`` of them), streamed: memory is the
    filter's, 3.5 bytes an entry."""
    bloom = DigestFilter.for_entries(max(entries, 1))
    for column in hashes:
        bloom.add(digest_matrix(column))
    uri = f"{index_shard_filters_uri(table_path)}/{shard_filter_name(shard)}"
    write_filter(uri, [index_shard_name(shard)], bloom, storage_options)


def move_to_shards(
    table_path: str, storage_options: StorageOptions | None = None, threshold: int | None = None
) -> int:
    """Move level 0's entries into level 1 once it holds more than ``threshold`` entries
    (default :data:`SHARD_AFTER`), leaving out those of retired packs; how many were moved.
    Level 0 first records which fragments the move takes (its config); they are read once and
    split by shard into local scratch files (memory: a batch); each shard takes its entries as
    one Lance append, marked with the move, and gets a filter over them; then level 0 records
    that level 1 exists and drops the fragments. A move cut short (killed, Ctrl-C) leaves
    entries in both levels, found twice at one place; the next run finishes that move, and a
    shard whose append of it committed already is not appended to again."""
    threshold = SHARD_AFTER if threshold is None else threshold
    level0 = open_index(table_path, storage_options)
    if level0 is None:
        return 0
    moving = level0.config().get(MOVING)
    resumed = moving is not None  # a move cut short: some shards may have taken it
    if moving is None:
        if level0.count_rows() <= threshold:
            return 0
        moving = _ranges([f.fragment_id for f in level0.get_fragments()])
        level0.update_config({MOVING: moving})
    taken = set(_ids(moving))
    fragments = [f for f in level0.get_fragments() if f.fragment_id in taken]
    shards = shards_of(level0) or SHARDS
    moved: dict[int, int] = {}
    if fragments:  # none: the move was cut short after level 0 dropped them
        retired = pa.array(list(retired_packs(table_path, storage_options)), pa.utf8())
        with tempfile.TemporaryDirectory(prefix="blobhouse-shards-") as scratch:
            moved = _split_by_shard(level0, fragments, retired, shards, Path(scratch))
            for shard, count in moved.items():
                entries = _ShardEntries(Path(scratch) / f"{shard}.arrow")
                _take(table_path, shard, entries, count, moving, resumed, storage_options)
        if not shards_of(level0):  # the first move: every shard exists from now on
            _create_empty_shards(table_path, shards, storage_options)
            level0.update_config({LEVEL_ONE: str(shards)})
        _drop_fragments(level0, [f.fragment_id for f in fragments], storage_options)
    lance.dataset(level0.uri, storage_options=storage_options).delete_config_keys([MOVING])
    return sum(moved.values())


def _take(
    table_path: str,
    shard: int,
    entries: EntryBatches,
    count: int,
    moving: str,
    resumed: bool,
    storage_options: StorageOptions | None,
) -> None:
    """Append a move's ``entries`` (``count`` of them) to ``shard``, unless an earlier try of
    the same move did (``resumed``: its commit names the move; a first try reads no commits),
    then cover them with a filter."""
    uri = index_shard_uri(table_path, shard)
    if not (resumed and _took(uri, moving, storage_options)):
        properties = {_MOVED: moving}
        append_to_part(uri, entries, storage_options, filtered=False, properties=properties)
    hashes = (batch.column(0) for batch in entries())
    _write_shard_filter(table_path, shard, hashes, count, storage_options)


def _took(uri: str, moving: str, storage_options: StorageOptions | None) -> bool:
    """Whether one of the shard's last commits appended the move ``moving`` (only gc
    commits to a shard: an earlier try is among its last few)."""
    dataset = open_part(uri, storage_options)
    if dataset is None:
        return False
    recent = dataset.get_transactions(_RECENT_COMMITS)
    return any(t is not None and t.transaction_properties.get(_MOVED) == moving for t in recent)


def _ranges(ids: Iterable[int]) -> str:
    """Fragment ids as ranges (a move's name: few runs, however many fragments).

    >>> _ranges([7, 1, 2, 3, 5]), _ids("1-3,5,7")
    ('1-3,5,7', [1, 2, 3, 5, 7])
    """
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _ids(ranges: str) -> list[int]:
    ids: list[int] = []
    for run in filter(None, ranges.split(",")):
        first, _, last = run.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


def _drop_fragments(
    level0: LanceDataset, ids: list[int], storage_options: StorageOptions | None
) -> None:
    """Drop fragments ``ids`` of level 0 (what the shards took). Writers commit to level 0
    meanwhile (appends, their scalar indices): a commit Lance cannot merge with theirs is
    retried on the latest version."""
    drop = lance.LanceOperation.Delete([], ids, "true")
    version = level0.version
    for attempt in range(5):
        try:
            lance.LanceDataset.commit(
                level0.uri, drop, read_version=version, storage_options=storage_options
            )
            return
        except (ValueError, OSError):
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
            version = lance.dataset(level0.uri, storage_options=storage_options).version


def _split_by_shard(
    level0: LanceDataset,
    fragments: list[lance.LanceFragment],
    retired: pa.Array,
    shards: int,
    scratch: Path,
) -> dict[int, int]:
    """Write the entries of ``fragments`` (but those of ``retired`` packs) into one Arrow
    file per shard of ``shards`` in ``scratch``; how many each shard took."""
    shift = shard_shift(shards)
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    sinks: list[pa.OSFile] = []
    moved: defaultdict[int, int] = defaultdict(int)
    try:
        scanner = level0.scanner(columns=INDEX_SCHEMA.names, fragments=fragments, **_STREAMED)
        for batch in scanner.to_batches():
            if len(retired):
                batch = batch.filter(pc.invert(pc.is_in(batch["pack"], retired)))
            if not batch.num_rows:
                continue
            of = digest_matrix(batch.column("blake3"))[:, -1] >> shift
            order = np.argsort(of, kind="stable")
            batch, of = batch.take(pa.array(order)), of[order]
            starts = np.flatnonzero(np.diff(of, prepend=-1))
            for start, end in zip(starts, [*starts[1:], len(of)], strict=True):
                shard = int(of[start])
                if shard not in writers:
                    sinks.append(pa.OSFile(str(scratch / f"{shard}.arrow"), "wb"))
                    writers[shard] = pa.ipc.new_file(sinks[-1], INDEX_SCHEMA)
                writers[shard].write_batch(batch.slice(start, end - start))
                moved[shard] += int(end - start)
    finally:
        for writer in writers.values():
            writer.close()
        for sink in sinks:
            sink.close()
    return moved


class _ShardEntries:
    """:data:`EntryBatches` of one shard's scratch file (none when it has no entries)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> Iterable[pa.RecordBatch]:
        if not self.path.exists():
            return
        with pa.memory_map(str(self.path)) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _create_empty_shards(
    table_path: str, shards: int, storage_options: StorageOptions | None
) -> None:
    """Create the shards that took no entry (a missing shard then means a damaged one), each
    with a filter that holds nothing (a shard without one is asked for every hash)."""
    for shard in range(shards):
        uri = index_shard_uri(table_path, shard)
        if open_part(uri, storage_options) is None:
            try:
                lance.write_dataset(
                    INDEX_SCHEMA.empty_table(), uri, mode="create", storage_options=storage_options
                )
            except (ValueError, OSError):
                if open_part(uri, storage_options) is None:  # not a concurrent gc's create
                    raise
            _write_shard_filter(table_path, shard, [], 0, storage_options)
