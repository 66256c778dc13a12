"""The store index's level 1: once level 0 is big, gc moves it into shards by hash prefix, each
maintained on its own (a Spark task under ``blobhouse.spark.gc``). Every door still finds what
was moved, gc keeps and reclaims packs by the shards too, a move cut short loses nothing, and a
level 1 this version cannot read, or a shard gone, only lowers dedup and keeps every pack."""

from __future__ import annotations

import os
import random
import shutil
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.errors import StoreIndexError
from blobhouse.store.duplicates import find_duplicates
from blobhouse.store.index import (
    StoreIndex,
    append_to_index,
    index_parts,
    indexed_packs,
    open_index,
    shards_of,
)
from blobhouse.store.index_maintenance import move_to_shards
from blobhouse.store.index_part import IndexPart
from blobhouse.store.packs import (
    StoredPayload,
    index_shard_filters_uri,
    index_shard_uri,
    index_uri,
)
from tests.helpers import stock_read


@pytest.fixture
def few_shards(monkeypatch: pytest.MonkeyPatch) -> int:
    """Level 1 made of 4 shards, and made at gc's first run (250 shards' Lance datasets for a
    handful of entries would be what the default avoids)."""
    monkeypatch.setattr("blobhouse.store.index_maintenance.SHARDS", 4)
    monkeypatch.setattr("blobhouse.store.index_maintenance.SHARD_AFTER", 0)
    return 4


def _rows(ids: list[int], payloads: list[bytes]) -> pa.Table:
    return pa.table({"id": ids, "b": blob_array(payloads)})


def _packs(root: str) -> set[Path]:
    return set(Path(root, "_blobs", "packs").iterdir())


def _fragments(root: str, shards: int) -> list[int]:
    return [len(lance.dataset(index_shard_uri(root, s)).get_fragments()) for s in range(shards)]


def _shard_filters(root: str, shards: int) -> list[int]:
    names = [p.name for p in Path(index_shard_filters_uri(root)).iterdir()]
    return [sum(n.startswith(f"{s:02x}-") for n in names) for s in range(shards)]


def _rows_in(uri: str) -> int:
    return lance.dataset(uri).count_rows()


def test_gc_moves_the_index_into_shards_and_every_door_still_finds_it(
    table_uri, few_shards, monkeypatch
):
    payloads = [os.urandom(20_000) for _ in range(16)]
    write_table(_rows(list(range(16)), payloads), table_uri)
    report = open_table(table_uri).gc(grace=timedelta(hours=1))
    assert report["store_index"]["moved_entries"] == 16 and report["store_index"]["added_bytes"]
    assert shards_of(open_index(table_uri, None)) == few_shards
    assert _rows_in(index_uri(table_uri)) == 0  # all of it moved
    assert sum(_rows_in(index_shard_uri(table_uri, s)) for s in range(few_shards)) == 16
    digests = [content_hash(p) for p in payloads]
    opened, real_open = [], IndexPart.open.__func__

    def counted(cls, uri, *args, **kwargs):
        opened.append(uri)
        return real_open(cls, uri, *args, **kwargs)

    monkeypatch.setattr(IndexPart, "open", classmethod(counted))
    absent = [os.urandom(32) for _ in range(200)]
    assert StoreIndex.open(table_uri).find(absent) == {}
    assert opened == []  # the shards' filters answered: no shard was opened
    index = StoreIndex.open(table_uri)
    assert set(index.find([*digests, content_hash(b"absent")])) == set(digests)
    assert len(opened) == len({d[-1] >> 6 for d in digests})  # each shard asked, once
    assert len(index) == 16
    entry = index.find(digests[:1])[digests[0]]
    assert index.digest_at(entry.pack, entry.position, entry.size) == digests[0]
    # an append of the same payloads (Python and its second write) stores nothing new
    packs = _packs(table_uri)
    table = write_table(_rows([100, 101], payloads[:2]), table_uri, mode="append")
    assert _packs(table_uri) == packs
    later = os.urandom(20_000)  # a new payload goes to level 0, found beside the shards
    table = write_table(_rows([102], [later]), table_uri, mode="append")
    assert set(StoreIndex.open(table_uri).find([digests[3], content_hash(later)])) == {
        digests[3],
        content_hash(later),
    }
    assert table.read_blobs("b", [16, 17, 18]) == [*payloads[:2], later]
    assert stock_read(table_uri, "b") == [*payloads, *payloads[:2], later]
    assert table.verify(deep=True)["problems"] == []
    open_table(table_uri).gc(grace=timedelta(hours=1))  # moves the new entry in too
    assert _rows_in(index_uri(table_uri)) == 0 and len(StoreIndex.open(table_uri)) == 17


def test_a_copy_of_a_sharded_table_finds_its_payloads_with_the_original_gone(tmp_path, few_shards):
    root, copy = str(tmp_path / "t"), str(tmp_path / "copy")
    payloads = [os.urandom(20_000) for _ in range(6)]
    write_table(_rows(list(range(6)), payloads), root)
    open_table(root).gc(grace=timedelta(hours=1))
    shutil.copytree(root, copy)
    shutil.rmtree(root)
    packs = _packs(copy)
    write_table(_rows([6, 7], payloads[:2]), copy, mode="append")
    assert _packs(copy) == packs  # found in the copy's own shards
    assert stock_read(copy, "b") == [*payloads, *payloads[:2]]


def test_deletes_then_compaction_and_gc_reclaim_packs_the_shards_name(table_uri, few_shards):
    """gc keeps what any part names and reclaims what none does: retiring a pack drops its
    entries from every shard."""
    size, n = 100_000, 40
    data = [random.Random(i).randbytes(size) for i in range(n)]
    placement = {"b": {"pack_file_size_threshold": 1_000_000}}
    write_table(_rows(list(range(n)), data), table_uri, placement=placement)
    open_table(table_uri).gc(grace=timedelta(hours=1))
    before = indexed_packs(table_uri)
    assert before == {f"packs/{p.name}" for p in _packs(table_uri)}  # all named by shards
    open_table(table_uri).delete(f"id < {n // 2}")
    report = open_table(table_uri).compact()
    assert report["retired_packs"] >= 1
    gc = open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert gc["reaped_packs"] >= report["retired_packs"] and not gc["store_index_unreadable"]
    live = {f"packs/{p.name}" for p in _packs(table_uri)}
    assert indexed_packs(table_uri) == live < before
    assert sum(p.stat().st_size for p in _packs(table_uri)) <= 1.05 * size * (n // 2)
    assert open_table(table_uri).read_blobs("b", range(n // 2)) == data[n // 2 :]
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_move_cut_short_loses_no_entry_and_the_next_run_finishes_it(
    table_uri, few_shards, monkeypatch
):
    payloads = [os.urandom(20_000) for _ in range(8)]
    write_table(_rows(list(range(8)), payloads), table_uri)
    digests = [content_hash(p) for p in payloads]

    def killed(*args, **kwargs):
        raise OSError("killed before level 0 let go of what the shards took")

    with monkeypatch.context() as patched:
        patched.setattr(lance.LanceDataset, "commit", killed)
        with pytest.raises(OSError, match="killed"):
            move_to_shards(table_uri, threshold=0)
    assert _rows_in(index_uri(table_uri)) == 8  # in both levels now
    copies = StoreIndex.open(table_uri).find_copies(digests)
    assert all(len(copies[d]) == 1 for d in digests)  # found twice at one place: one copy
    packs = _packs(table_uri)
    write_table(_rows([8], payloads[:1]), table_uri, mode="append")
    assert _packs(table_uri) == packs
    assert move_to_shards(table_uri, threshold=0) == 8  # finished: level 0 lets go
    assert _rows_in(index_uri(table_uri)) == 0
    copies = StoreIndex.open(table_uri).find_copies(digests)
    assert all(len(copies[d]) == 1 for d in digests)
    assert len(StoreIndex.open(table_uri)) == 8  # no shard took the move twice


def test_a_move_interrupted_between_shards_is_finished_once(tmp_path, few_shards, monkeypatch):
    """Ctrl-C after some shards took their entries: the next run takes the same fragments
    (not those written since), and appends only to the shards that had not taken them."""
    from blobhouse.store import index_maintenance as index_module

    root = str(tmp_path)
    entries = [StoredPayload(os.urandom(32), "packs/a.pack", i, 1) for i in range(400)]
    append_to_index(root, entries[:300])
    real_take, taken = index_module._take, []

    def interrupted(*args, **kwargs):
        if len(taken) == 2:
            raise KeyboardInterrupt
        taken.append(args[1])
        real_take(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(index_module, "_take", interrupted)
        with pytest.raises(KeyboardInterrupt):
            move_to_shards(root, threshold=0)
    append_to_index(root, entries[300:])  # a writer, meanwhile
    assert move_to_shards(root, threshold=0) == 300  # the interrupted move, no more
    assert _rows_in(index_uri(root)) == 100  # the writer's entries wait for the next move
    index = StoreIndex.open(root)
    assert len(index) == 400 and set(index.find([e.digest for e in entries])) == {
        e.digest for e in entries
    }
    assert move_to_shards(root, threshold=0) == 100
    assert len(StoreIndex.open(root)) == 400


def test_a_copy_a_racing_writer_stored_is_found_in_the_shards(tmp_path, few_shards):
    root, digest = str(tmp_path), content_hash(b"payload")
    first = [StoredPayload(digest, "packs/first.pack", 0, 7)]
    second = [StoredPayload(digest, "packs/second.pack", 0, 7)]
    append_to_index(root, first)
    assert move_to_shards(root, threshold=0) == 1
    assert find_duplicates(root, append_to_index(root, first), first) == []  # same place
    assert move_to_shards(root, threshold=0) == 1  # gc moved every copy meanwhile
    assert find_duplicates(root, append_to_index(root, second), second) == [digest]


def test_a_level_1_this_version_cannot_read_or_a_shard_gone_keeps_every_pack(table_uri, few_shards):
    payloads = [os.urandom(20_000) for _ in range(6)]
    write_table(_rows(list(range(6)), payloads), table_uri)
    open_table(table_uri).gc(grace=timedelta(hours=1))
    shutil.rmtree(index_shard_uri(table_uri, 2))  # a sync that missed a folder
    with pytest.raises(StoreIndexError, match="cannot be read"):
        indexed_packs(table_uri)
    report = open_table(table_uri).gc(grace=timedelta(0))
    assert report["store_index_unreadable"] and report["retired_packs"] == 0
    problems = open_table(table_uri).verify(deep=True)["problems"]
    assert any("index" in str(p) and "cannot be read" in str(p) for p in problems)
    open_index(table_uri, None).update_config({"blobhouse.index.shards": "3"})  # a newer layout
    with pytest.raises(StoreIndexError, match="upgrade blobhouse"):
        index_parts(table_uri)
    with pytest.warns(UserWarning, match="upgrade blobhouse"):
        table = write_table(_rows([6], payloads[:1]), table_uri, mode="append")
    assert table.read_blobs("b", [6]) == payloads[:1]  # stored anew: lower dedup, no error
    assert open_table(table_uri).gc(grace=timedelta(0))["store_index_unreadable"]


def test_spark_gc_maintains_each_shard_in_a_task(spark, tmp_path, monkeypatch):
    """Fragments pile up in a shard, one per move; Spark's gc compacts each shard in a task
    of its own, and every entry is still found."""
    monkeypatch.setattr("blobhouse.store.index_maintenance.SHARDS", 2)
    root = str(tmp_path / "t")
    write_table(_rows([0], [os.urandom(20_000)]), root)
    rng = random.Random(7)
    digests = []
    for round_ in range(10):  # each move adds a fragment to both shards
        entries = [
            StoredPayload(rng.randbytes(31) + bytes([last]), "packs/synthetic.pack", i, 10)
            for i, last in enumerate((round_, 0x80 + round_))
        ]
        digests += [e.digest for e in entries]
        append_to_index(root, entries)
        move_to_shards(root, threshold=0)
    assert all(n >= 10 for n in _fragments(root, 2))
    assert all(n >= 10 for n in _shard_filters(root, 2))  # one per move
    bs.gc(spark, root, grace=timedelta(hours=1))
    assert _fragments(root, 2) == [1, 1]
    assert _shard_filters(root, 2) == [1, 1]  # merged, each shard in its task
    assert set(StoreIndex.open(root).find(digests)) == set(digests)
    # a shard's data file lost: its task says so, and gc keeps every pack (not a failed job)
    (fragment,) = lance.dataset(index_shard_uri(root, 1)).get_fragments()
    Path(index_shard_uri(root, 1), "data", fragment.data_files()[0].path).unlink()
    report = bs.gc(spark, root, grace=timedelta(0))
    assert report["store_index_unreadable"] and report["retired_packs"] == 0
    problems = [str(p) for p in bs.verify(spark, root, deep=True)["problems"]]
    assert any(index_shard_uri(root, 1) in p and "cannot be read" in p for p in problems)


def test_a_shard_that_took_nothing_is_not_opened_for_new_hashes(tmp_path, few_shards, monkeypatch):
    root = str(tmp_path)
    held = [os.urandom(31) + bytes([i]) for i in range(8)]  # all in shard 0 of 4
    append_to_index(root, [StoredPayload(d, "packs/a.pack", i, 1) for i, d in enumerate(held)])
    assert move_to_shards(root, threshold=0) == 8
    opened, real_open = [], IndexPart.open.__func__

    def counted(cls, uri, *args, **kwargs):
        opened.append(uri)
        return real_open(cls, uri, *args, **kwargs)

    monkeypatch.setattr(IndexPart, "open", classmethod(counted))
    absent = [os.urandom(31) + bytes([64 + i]) for i in range(192)]  # shards 1-3, empty
    assert StoreIndex.open(root).find(absent) == {} and opened == []
    assert set(StoreIndex.open(root).find(held)) == set(held)
