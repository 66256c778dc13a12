"""Level 0 of the store's index between gc runs: every write appends a fragment, a filter and a
version. Writers merge the small fragments and clean versions past the reader window, so a
table written by thousands of small appends and no gc keeps appends, lookups and manifests
the same size (before, 10,000 appends held 4.2 GB of index manifests)."""

from __future__ import annotations

import os
import threading
import warnings
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from lance.commit import CommitConflictError

from blobhouse import blob_array, open_table, write_table
from blobhouse.commit.transaction import record_stored
from blobhouse.dedup import content_hash
from blobhouse.store import index_part
from blobhouse.store.digest_filter import read_filters
from blobhouse.store.index import StoreIndex, append_to_index
from blobhouse.store.index_part import (
    _MERGE_WIDTH,
    MOVING,
    filters_uri,
    merge_small_fragments,
    runs_uri,
)
from blobhouse.store.packs import StoredPayload, index_uri
from blobhouse.store.sorted_run import write_run


def entry(n: int) -> StoredPayload:
    return StoredPayload(content_hash(b"%d" % n), f"packs/{n % 7}.pack", 10 * n, 10)


def record(root: str, n: int) -> None:
    """What a committed write does with a payload it stored: the index append, the duplicate
    check, the writer's share of the upkeep."""
    record_stored(root, [entry(n)], None)


def level0(root: str) -> lance.LanceDataset:
    return lance.dataset(index_uri(root))


def found_all(root: str, count: int) -> bool:
    wanted = {entry(n).digest: entry(n) for n in range(count)}
    return StoreIndex.open(root).find([*wanted, content_hash(b"absent")]) == wanted


def test_many_small_appends_keep_level0_fragments_and_filters_bounded(tmp_path):
    root = str(tmp_path)
    appends = 5 * _MERGE_WIDTH  # two size tiers: fewer than 8 entries, fewer than 64
    for n in range(appends):
        record(root, n)
        assert len(level0(root).get_fragments()) <= 2 * (_MERGE_WIDTH - 1)
    index = level0(root)
    assert index.count_rows() == appends  # merged, nothing lost or doubled
    covered = set().union(*(f.covered for f in read_filters(filters_uri(index_uri(root)))))
    files = {str(d.path) for f in index.get_fragments() for d in f.data_files()}
    assert files <= covered  # every data file covered: lookups skip absent hashes
    assert len(read_filters(filters_uri(index_uri(root)))) <= 2 * (_MERGE_WIDTH - 1)
    assert found_all(root, appends)


def test_table_writes_without_gc_merge_level0_and_read_back(tmp_path):
    """The natural door: small default-mode appends, then a duplicate of each found."""
    root = str(tmp_path / "t")
    payloads = [os.urandom(2000) for _ in range(2 * _MERGE_WIDTH + 3)]
    for n, payload in enumerate(payloads):
        table = pa.table({"id": [n], "b": blob_array([payload])})
        write_table(table, root, mode="append" if n else "create", dedup="global")
    assert len(level0(root).get_fragments()) <= 2 * (_MERGE_WIDTH - 1)
    packs = set(Path(root, "_blobs", "packs").iterdir())
    again = pa.table({"id": list(range(100, 100 + len(payloads))), "b": blob_array(payloads)})
    table = write_table(again, root, mode="append", dedup="global")
    assert set(Path(root, "_blobs", "packs").iterdir()) == packs  # every payload found
    assert table.read_blobs("b", list(range(len(payloads), 2 * len(payloads)))) == payloads


def test_fragments_a_sorted_run_covers_are_not_merged_and_the_run_holds(tmp_path):
    root = str(tmp_path)
    for n in range(_MERGE_WIDTH - 1):  # not merged yet
        record(root, n)
    run = write_run(runs_uri(index_uri(root)), level0(root))  # what gc writes of a big index
    before = {f.fragment_id for f in level0(root).get_fragments()}
    later = range(_MERGE_WIDTH - 1, 3 * _MERGE_WIDTH)
    for n in later:
        record(root, n)
    after = {f.fragment_id for f in level0(root).get_fragments()}
    assert before <= after and len(after) < len(before) + len(later)  # only later ones merged
    assert found_all(root, 3 * _MERGE_WIDTH)
    index = StoreIndex.open(root)
    index.find([entry(0).digest])
    assert index._level0._run and index._level0._run[0].uri == run  # the run still answers


def test_fragments_a_scalar_index_covers_are_not_merged(tmp_path):
    root = str(tmp_path)
    for n in range(_MERGE_WIDTH - 1):
        record(root, n)
    level0(root).create_scalar_index("blake3", "BTREE", name="blake3_idx")
    before = {f.fragment_id for f in level0(root).get_fragments()}
    for n in range(_MERGE_WIDTH - 1, 3 * _MERGE_WIDTH):
        record(root, n)
    after = {f.fragment_id for f in level0(root).get_fragments()}
    assert before <= after and len(after) < len(before) + 2 * _MERGE_WIDTH
    (lookup,) = level0(root).describe_indices()
    assert lookup.num_rows_indexed == _MERGE_WIDTH - 1  # still true of what it covers
    assert found_all(root, 3 * _MERGE_WIDTH)


def test_writers_merging_at_once_lose_and_double_nothing(tmp_path):
    root = str(tmp_path)
    append_to_index(root, [entry(0)])  # created: the writers below all append
    per_writer, writers = 2 * _MERGE_WIDTH, 4
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(per_writer):
                record(root, 1 + w * per_writer + i)
        except BaseException as exc:
            errors.append(exc)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert [str(w.message) for w in caught if "tidied" in str(w.message)] == []
    total = 1 + writers * per_writer
    assert level0(root).count_rows() == total
    assert len(level0(root).get_fragments()) <= 4 * _MERGE_WIDTH  # they merged
    assert found_all(root, total)


def test_a_merge_that_loses_the_commit_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(index_part, "_MERGE_WIDTH", 1000)  # writers do not merge here
    root = str(tmp_path)
    for n in range(_MERGE_WIDTH + 1):
        append_to_index(root, [entry(n)])
    monkeypatch.setattr(index_part, "_MERGE_WIDTH", _MERGE_WIDTH)
    stale = level0(root)
    files = set(os.listdir(Path(index_uri(root), "data")))
    filters = set(os.listdir(filters_uri(index_uri(root))))
    assert merge_small_fragments(index_uri(root), stale) is not None
    merged_files = set(os.listdir(Path(index_uri(root), "data")))
    merged_filters = set(os.listdir(filters_uri(index_uri(root))))
    with pytest.raises(CommitConflictError):  # tidy_level0 leaves it to the winner, silently
        merge_small_fragments(index_uri(root), stale)  # the same fragments, merged meanwhile
    assert set(os.listdir(Path(index_uri(root), "data"))) == merged_files
    assert set(os.listdir(filters_uri(index_uri(root)))) == merged_filters
    assert len(merged_files - files) == 1 and not merged_filters & filters - {""}
    assert found_all(root, _MERGE_WIDTH + 1)


def test_no_merge_while_gc_moves_level0_into_the_shards(tmp_path):
    root = str(tmp_path)
    append_to_index(root, [entry(0)])
    level0(root).update_config({MOVING: "0"})
    for n in range(1, _MERGE_WIDTH + 3):
        record(root, n)
    assert len(level0(root).get_fragments()) == _MERGE_WIDTH + 3


def test_writers_clean_level0_versions_past_the_reader_window(tmp_path, monkeypatch):
    monkeypatch.setattr(index_part, "_CLEAN_EVERY", 8)
    monkeypatch.setattr(index_part, "READER_WINDOW", timedelta(0))
    root = str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the duplicate check ran before: nothing missing
        for n in range(40):
            record(root, n)
    versions = [v["version"] for v in level0(root).versions()]
    assert len(versions) < 10 and versions[-1] >= 40
    assert found_all(root, 40)
    table = tmp_path / "t"  # the table's own versions are the table's: never touched
    warnings.simplefilter("error")
    for n in range(20):
        write_table(
            pa.table({"b": blob_array([os.urandom(100)])}),
            str(table),
            mode="append" if n else "create",
        )
    assert len(open_table(str(table)).versions()) == 20
