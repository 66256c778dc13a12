"""The store's index at scale: writers look up only the hashes at hand through Lance scalar
indices (``blake3``, ``pack``) that writers and gc keep current; the index stays a cache that
may lag but never hands out a retired pack or a wrong place."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.layout import store_dir
from blobhouse.store.index import StoreIndex, append_to_index
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.packs import StoredPayload, index_uri
from blobhouse.store.writer import StoreWriter


def rows(payloads: list[bytes]) -> pa.Table:
    return pa.table({"b": blob_array(payloads)})


def lookups(root: str) -> dict[str, dict]:
    """Column -> stats of the scalar index on it."""
    index = lance.dataset(index_uri(root))
    return {d.field_names[0]: index.stats.index_stats(d.name) for d in index.describe_indices()}


def entry(n: int, pack: str = "packs/a.pack") -> StoredPayload:
    return StoredPayload(content_hash(b"%d" % n), pack, 10 * n, 10)


def test_writers_find_payloads_through_scalar_indices_that_gc_keeps_current(table_uri, monkeypatch):
    monkeypatch.setattr("blobhouse.store.index_part._UNINDEXED_ROWS", 5)
    for _ in range(5):  # few entries: scanned, no scalar index yet
        write_table(rows([os.urandom(1000)]), table_uri, mode="append", dedup="global")
    assert lookups(table_uri) == {}
    for _ in range(6):  # the 6th creates them; one index fragment per write after that
        write_table(rows([os.urandom(1000)]), table_uri, mode="append", dedup="global")
    assert lookups(table_uri)["blake3"]["num_unindexed_rows"] == 5
    open_table(table_uri).gc(grace=timedelta(hours=1))
    index = lance.dataset(index_uri(table_uri))
    assert len(index.get_fragments()) == 1
    for column, stats in lookups(table_uri).items():
        assert (stats["num_unindexed_rows"], stats["num_indices"]) == (0, 1), column
    digest = index.to_table(columns=["blake3"]).column(0)[0].as_py()
    plan = index.scanner(filter=pc.field("blake3").isin([digest])).explain_plan()
    assert "ScalarIndexQuery" in plan  # not a scan of every entry
    assert len(StoreIndex.open(table_uri).find([digest])) == 1


def test_a_big_write_indexes_what_it_added(table_uri, monkeypatch):
    monkeypatch.setattr("blobhouse.store.index_part._UNINDEXED_ROWS", 5)
    write_table(rows([os.urandom(100)]), table_uri, dedup="global")
    write_table(rows([os.urandom(100) for _ in range(3)]), table_uri, mode="append", dedup="global")
    assert lookups(table_uri) == {}  # few entries: scanned, no lookups yet
    write_table(rows([os.urandom(100) for _ in range(2)]), table_uri, mode="append", dedup="global")
    assert {c: s["num_unindexed_rows"] for c, s in lookups(table_uri).items()} == {
        "blake3": 0,
        "pack": 0,
    }  # past 5 entries: created over all of them
    write_table(rows([os.urandom(100) for _ in range(3)]), table_uri, mode="append", dedup="global")
    assert lookups(table_uri)["blake3"]["num_unindexed_rows"] == 3  # few: left to the scan
    write_table(rows([os.urandom(100) for _ in range(4)]), table_uri, mode="append", dedup="global")
    stats = lookups(table_uri)["blake3"]
    assert (stats["num_unindexed_rows"], stats["num_indices"]) == (0, 2)  # a delta


def test_an_append_returns_its_own_version_of_the_index_though_lookups_were_built_after(
    tmp_path, monkeypatch
):
    """The commit asks the index's other data files for the hashes an append added (the
    duplicates a concurrent writer stored): it needs the append's version, not the one the
    lookups' creation made after it (it once got that one, and took every file for another's)."""
    monkeypatch.setattr("blobhouse.store.index_part._UNINDEXED_ROWS", 1)  # lookups past 1 entry
    root = str(tmp_path)
    first = append_to_index(root, [entry(1), entry(3)])  # creates the index, then its lookups
    assert first.version == 1 and len(lance.dataset(index_uri(root)).describe_indices()) == 2
    second = append_to_index(root, [entry(2)])  # appends to the version it opened: one listing
    assert second.version == lance.dataset(index_uri(root)).version == 4  # no lookup to add
    assert len(StoreIndex.open(root).find([entry(1).digest, entry(2).digest])) == 2


def test_a_lookup_prefers_a_copy_in_a_pack_gc_is_not_reclaiming(tmp_path):
    root = str(tmp_path)
    doubled = StoredPayload(entry(1).digest, "packs/b.pack", 0, 10)
    append_to_index(root, [entry(1), entry(2)])
    append_to_index(root, [doubled])
    index = StoreIndex.open(root)
    assert index.find([entry(1).digest], avoid={"packs/a.pack"}) == {entry(1).digest: doubled}
    assert index.find([entry(2).digest, b"\0" * 32], avoid={"packs/a.pack"}) == {}
    assert index.find([entry(2).digest]) == {entry(2).digest: entry(2)}


def test_a_long_write_outlives_the_index_version_it_opened(tmp_path):
    """gc compacts the index and removes the old version's files while a writer still holds
    it: the writer's next lookup reads the current version instead of failing."""
    root = str(tmp_path)
    for n in range(10):
        append_to_index(root, [entry(n)])
    index = StoreIndex.open(root)
    maintain_index(root, keep=timedelta(0))
    assert len(lance.dataset(index_uri(root)).get_fragments()) == 1
    wanted = [entry(n).digest for n in range(10)]
    assert index.find(wanted) == {entry(n).digest: entry(n) for n in range(10)}


def test_hashes_of_store_places_are_read_one_pack_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr("blobhouse.store.index._CACHED_PACK_ENTRIES", 3)
    root = str(tmp_path)
    append_to_index(root, [entry(n, f"packs/{n % 3}.pack") for n in range(9)])
    index = StoreIndex.open(root)
    for _ in range(2):  # packs evicted and read again
        for n in range(9):
            assert index.digest_at(f"packs/{n % 3}.pack", 10 * n, 10) == entry(n).digest
            assert len(index._packs) <= 2
    assert index.digest_at("packs/0.pack", 0, 11) is None
    assert index.digest_at("packs/missing.pack", 0, 10) is None


@pytest.mark.parametrize("many", [True, False])
def test_place_many_asks_the_index_once_and_stores_each_payload_once(tmp_path, many):
    root = str(tmp_path)
    known = b"known" * 100
    os.makedirs(f"{root}/_blobs/packs")
    with open(f"{root}/_blobs/packs/old.pack", "wb") as pack:  # the entry is checked: real bytes
        pack.write(known)
    append_to_index(root, [StoredPayload(content_hash(known), "packs/old.pack", 0, len(known))])
    writer = StoreWriter(root, 1, "w-", 1 << 20)
    asked = []
    find = writer.index.find_copies
    writer.index.find_copies = lambda digests, avoid: (
        asked.append(list(digests)) or find(digests, avoid)
    )
    payloads = [b"new" * 100, known, b"new" * 100, known]
    digests = [content_hash(p) for p in payloads]
    if many:
        placed = writer.place_many(payloads, digests)
    else:
        placed = [writer.place(p, d) for p, d in zip(payloads, digests, strict=True)]
    writer.finish()
    assert [p.uri for p in placed[1::2]] == ["packs/old.pack"] * 2
    assert placed[0] == placed[2] and placed[0].uri.startswith("packs/w-")
    assert writer.found_packs == {"packs/old.pack"}
    assert len(writer.packs.stored) == 1
    assert asked == ([digests[:2]] if many else [digests[:1], digests[1:2]])


def test_take_new_reports_payloads_whose_bytes_are_in_the_open_pack(tmp_path):
    """A pack stays open across data files; its bytes reach the writer thread in runs, and
    ``take_new`` (the payloads a data file may commit references to) hands the open run over
    and waits for it, so every reported payload is on disk before the pack is closed."""
    root = str(tmp_path)
    writer = StoreWriter(root, 1, "w-", 1 << 30)
    payloads = [os.urandom(1000 + n) for n in range(3)]
    writer.place_many(payloads, [content_hash(p) for p in payloads])
    packs, stored = writer.take_new()
    (pack,) = packs
    content = (Path(store_dir(root)) / pack).read_bytes()
    assert [content[s.position : s.position + s.size] for s in stored] == payloads
    writer.finish()
