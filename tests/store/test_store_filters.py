"""Filters of the store index's data files: a write whose payloads are all new skips the
scalar-index lookup, no filter ever hides a stored payload, and gc keeps the index covered by
few filters."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash, digest_matrix
from blobhouse.files.ranges import BlobRef
from blobhouse.io.objects import uri_to_path
from blobhouse.store.digest_filter import (
    DigestFilter,
    _read_each,
    may_contain,
    read_filters,
    write_filter,
)
from blobhouse.store.index import StoreIndex
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.index_part import IndexPart, filters_uri
from blobhouse.store.packs import index_uri


def rows(payloads: list[bytes]) -> pa.Table:
    return pa.table({"b": blob_array(payloads)})


def random_digests(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.frombuffer(rng.bytes(32 * count), np.uint8).reshape(count, 32)


def stored_bytes(root: str) -> int:
    packs = Path(root, "_blobs", "packs")
    return sum(p.stat().st_size for p in packs.iterdir())


def data_files(root: str) -> set[str]:
    index = lance.dataset(index_uri(root))
    return {str(d.path) for f in index.get_fragments() for d in f.data_files()}


@pytest.fixture
def queries(monkeypatch) -> list[int]:
    """One item per scalar-index query of the store's index."""
    asked: list[int] = []
    real = IndexPart._query

    def counted(self, *args):
        asked.append(1)
        return real(self, *args)

    monkeypatch.setattr(IndexPart, "_query", counted)
    return asked


def test_a_filter_holds_every_digest_added_and_few_others(tmp_path):
    held, absent = random_digests(50_000, 1), random_digests(200_000, 2)
    bloom = DigestFilter.for_entries(len(held))
    bloom.add(held)
    assert bloom.may_contain(held).all()
    assert bloom.may_contain(absent).sum() < 40  # ~4 expected at 28 bits an entry
    # read back from its file, block by block: the same answers
    uri = f"file://{tmp_path}/filters/a.bloom"
    write_filter(uri, ["x.lance", "y.lance"], bloom)
    (read,) = read_filters(f"file://{tmp_path}/filters")
    assert read.covered == {"x.lance", "y.lance"} and read.loaded is None  # too big to load
    both = np.concatenate([held[:3000], absent[:3000]])
    assert (may_contain([read], both) == bloom.may_contain(both)).all()


def test_a_filter_file_cut_short_or_of_another_version_is_not_used(tmp_path):
    bloom = DigestFilter.for_entries(10)
    bloom.add(digest_matrix([content_hash(b"a")]))
    folder = tmp_path / "filters"
    write_filter(f"file://{folder}/whole.bloom", ["a.lance"], bloom)
    data = (folder / "whole.bloom").read_bytes()
    (folder / "short.bloom").write_bytes(data[:-1])  # a writer died writing it
    (folder / "future.bloom").write_bytes(data[:4] + b"\x02" + data[5:])
    (folder / "junk.bloom").write_bytes(b"not a filter at all, but long enough")
    assert [Path(f.uri).name for f in read_filters(f"file://{folder}")] == ["whole.bloom"]
    with pytest.raises(ValueError, match="32-byte digests"):
        digest_matrix([b"short"])
    # a filter gc removes between the listing and the read is left out, the others are read
    gone = BlobRef(f"file://{folder}/removed.bloom", 0, 40)
    whole = BlobRef(f"file://{folder}/whole.bloom", 0, len(data))
    assert _read_each([gone, whole], None) == {whole.uri: data}


def test_a_write_of_new_payloads_skips_the_lookup_and_repeats_are_found(
    table_uri, queries, monkeypatch
):
    for _ in range(3):
        write_table(
            rows([os.urandom(2000) for _ in range(20)]), table_uri, mode="append", dedup="global"
        )
    assert len(read_filters(filters_uri(index_uri(table_uri)))) == 3  # one per index fragment
    stored, asked = stored_bytes(table_uri), len(queries)
    scanned = []  # the index scanned for copies of the new hashes a racing writer stored
    real_scan = lance.LanceDataset.to_table
    monkeypatch.setattr(
        lance.LanceDataset,
        "to_table",
        lambda self, *a, **k: (
            (index_uri(table_uri) in self.uri and scanned.append(k)) or real_scan(self, *a, **k)
        ),
    )
    write_table(
        rows([os.urandom(2000) for _ in range(50)]), table_uri, mode="append", dedup="global"
    )
    assert len(queries) == asked  # no hash any filter may hold: the index was not asked
    assert scanned == []  # nor scanned for copies: the filters cover its other data files
    assert stored_bytes(table_uri) == stored + 50 * 2000
    known = open_table(table_uri).read_blobs("b", [0, 25, 40])
    asked = len(queries)  # the read asked for the hashes of the packs it read
    write_table(rows(known), table_uri, mode="append", dedup="global")
    assert len(queries) == asked + 1  # the filters let them through; the index found them
    assert stored_bytes(table_uri) == stored + 50 * 2000  # nothing stored twice


def test_dedup_holds_when_filters_are_missing_cut_short_or_gone_meanwhile(
    table_uri, queries, monkeypatch
):
    payloads = [os.urandom(3000) for _ in range(8)]
    write_table(rows(payloads[:4]), table_uri, dedup="global")
    write_table(rows(payloads[4:]), table_uri, mode="append", dedup="global")
    folder = Path(filters_uri(index_uri(table_uri)))
    first, second = sorted(folder.iterdir())
    first.unlink()  # its data file is covered by no filter: every hash is looked up
    stored = stored_bytes(table_uri)
    write_table(rows(payloads[:2]), table_uri, mode="append", dedup="global")
    second.write_bytes(second.read_bytes()[:-7])  # cut short: not used
    write_table(rows(payloads[6:]), table_uri, mode="append", dedup="global")
    assert stored_bytes(table_uri) == stored
    # covered again by gc, and read block by block as big filters are
    open_table(table_uri).gc(grace=timedelta(hours=1))
    monkeypatch.setattr("blobhouse.store.digest_filter._WHOLE_BYTES", 0)
    monkeypatch.setattr("blobhouse.store.digest_filter._HEAD_BYTES", 32)
    index, asked = StoreIndex.open(table_uri), len(queries)
    assert index.find([content_hash(b"never stored")]) == {} and len(queries) == asked
    for bloom in folder.iterdir():
        bloom.unlink()  # gone after this writer listed them: it looks every hash up
    assert set(index.find([content_hash(p) for p in payloads])) == {
        content_hash(p) for p in payloads
    }
    assert len(queries) == asked + 1
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_gc_covers_a_compacted_index_with_one_filter_and_removes_the_rest(
    table_uri, queries, monkeypatch
):
    monkeypatch.setattr("blobhouse.store.index_part._MERGE_WIDTH", 1000)  # left to gc here
    payloads = [os.urandom(1500) for _ in range(12)]
    for payload in payloads:  # an index fragment and a filter each
        write_table(rows([payload]), table_uri, mode="append", dedup="global")
    folder = Path(filters_uri(index_uri(table_uri)))
    (folder / "dead-writer.bloom").write_bytes(b"BHBF")  # a writer died writing it
    old = time.time() - 7200
    os.utime(folder / "dead-writer.bloom", (old, old))
    (folder / "writing-now.bloom").write_bytes(b"BHBF")
    open_table(table_uri).gc(grace=timedelta(hours=1))
    (compacted,) = data_files(table_uri)  # 12 fragments were more than gc lets be
    (covering,) = [
        f for f in read_filters(filters_uri(index_uri(table_uri))) if compacted in f.covered
    ]
    assert covering.covered == {compacted}
    assert not (folder / "dead-writer.bloom").exists()
    asked = len(queries)
    found = StoreIndex.open(table_uri).find([content_hash(p) for p in payloads])
    assert len(found) == 12 and len(queries) == asked + 1
    assert StoreIndex.open(table_uri).find([content_hash(b"never stored")]) == {}
    assert len(queries) == asked + 1
    # the old filters stay as long as the old index versions (and their data files) do
    assert len(read_filters(filters_uri(index_uri(table_uri)))) == 13
    assert (folder / "writing-now.bloom").exists()  # younger than the grace: kept
    maintain_index(table_uri, keep=timedelta(0))
    assert [p.name for p in folder.iterdir()] == [Path(covering.uri).name]


def test_many_filters_over_one_index_are_merged_into_one(table_uri, monkeypatch):
    monkeypatch.setattr("blobhouse.store.index_part._INDEX_FRAGMENTS", 100)  # no compaction
    for _ in range(4):
        write_table(rows([os.urandom(800)]), table_uri, mode="append", dedup="global")
    open_table(table_uri).gc(grace=timedelta(hours=1))
    assert len(read_filters(filters_uri(index_uri(table_uri)))) == 4  # few: left as they are
    monkeypatch.setattr("blobhouse.store.index_part._INDEX_FILTERS", 3)
    maintain_index(table_uri, keep=timedelta(hours=1))
    (merged,) = read_filters(filters_uri(index_uri(table_uri)))
    assert merged.covered == data_files(table_uri) and len(merged.covered) == 4


def test_gc_keeps_the_filter_of_a_data_file_it_did_not_see(table_uri):
    write_table(rows([os.urandom(1000)]), table_uri, dedup="global")
    # a writer's new index fragment, on disk but in no version gc opened: its filter stays
    racing = Path(index_uri(table_uri), "data", "racing.lance")
    racing.write_bytes(b"")
    bloom = DigestFilter.for_entries(1)
    write_filter(
        f"file://{filters_uri(index_uri(table_uri))}/racing.bloom", ["racing.lance"], bloom
    )
    open_table(table_uri).gc(grace=timedelta(hours=1))
    assert {Path(f.uri).name for f in read_filters(filters_uri(index_uri(table_uri)))} >= {
        "racing.bloom"
    }


def test_each_filter_file_is_read_once_a_process(table_uri, monkeypatch):
    """A writer reads the index's filters several times an append: a whole filter file never
    changes (a new one gets a new name), so each is read once; a new one is read when it
    appears, and one gc removed is no longer returned."""
    import blobhouse.store.digest_filter as filters_module

    for _ in range(3):
        write_table(rows([os.urandom(2000) for _ in range(5)]), table_uri, mode="append")
    folder = filters_uri(index_uri(table_uri))
    first = read_filters(folder)
    read = []
    real = filters_module._read_each
    monkeypatch.setattr(
        filters_module, "_read_each", lambda refs, options: read.extend(refs) or real(refs, options)
    )
    assert [f.uri for f in read_filters(folder)] == [f.uri for f in first] and read == []
    write_table(rows([os.urandom(2000) for _ in range(5)]), table_uri, mode="append")
    read.clear()
    now = read_filters(folder)
    assert len(now) == 4 and len(read) == 0  # the writer read the new one already
    gone = Path(uri_to_path(now[0].uri))
    gone.unlink()
    assert [f.uri for f in read_filters(folder)] == [f.uri for f in now[1:]]
    # and a write still finds what the filters cover
    known = open_table(table_uri).read_blobs("b", [0, 7])
    stored = stored_bytes(table_uri)
    write_table(rows(known), table_uri, mode="append")
    assert stored_bytes(table_uri) == stored
