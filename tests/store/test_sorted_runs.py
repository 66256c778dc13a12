"""Sorted runs of the store index: every entry found at one small read a hash whatever the
index's size, built by gc once the index is big, never used once untrue, and never making a
write reference bytes other than its own."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash, digest_matrix
from blobhouse.store.index import StoreIndex
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.index_part import _RUN_ENTRIES, runs_uri
from blobhouse.store.packs import index_uri
from blobhouse.store.sorted_run import read_run, read_runs, write_run
from tests.helpers import flip, synthetic_entries


@pytest.mark.parametrize("count", [0, 1, 100, 20_000])
def test_a_run_finds_every_entry_and_nothing_else(tmp_path, count):
    rng = np.random.default_rng(count)
    digests = [rng.bytes(32) for _ in range(count)]
    if count:
        digests.append(digests[0])  # two racing writers stored one payload twice
        digests.append(digests[0][:8] + rng.bytes(24))  # another digest of the same prefix
    dataset = lance.write_dataset(
        pa.table({"blake3": pa.array(digests, pa.binary())}), tmp_path / "index"
    )
    run = read_run(write_run(str(tmp_path / "runs"), dataset))
    assert run is not None and run.entries == len(digests)
    addresses = dataset.to_table(with_row_address=True).column("_rowaddr").to_pylist()
    asked = [*digests[:50], *(rng.bytes(32) for _ in range(50))]
    positions, found = run.candidates(digest_matrix(asked))
    expected = sorted(
        (i, a)
        for i, d in enumerate(asked)
        for a, held in zip(addresses, digests, strict=True)
        if held[:8] == d[:8]
    )
    assert sorted(zip(positions, found, strict=True)) == expected
    if count:
        assert len([p for p in positions if p == 0]) == 3  # the copy and the shared prefix


def test_a_run_file_cut_short_or_of_another_kind_is_not_used(tmp_path):
    dataset = lance.write_dataset(pa.table({"blake3": [os.urandom(32)]}), tmp_path / "index")
    uri = write_run(str(tmp_path / "runs"), dataset)
    data = Path(uri).read_bytes()
    Path(uri).write_bytes(data[:-3])
    Path(tmp_path / "runs" / "other.run").write_bytes(b"not a run" * 10)
    assert read_runs(str(tmp_path / "runs")) == []


SYNTHETIC = _RUN_ENTRIES + 100  # entries of other payloads in a big store


def big_store(root: str, payloads: list[bytes]) -> None:
    """A default table whose store holds ``payloads`` and more than a run's worth of other
    entries, after gc's maintenance."""
    write_table(pa.table({"id": list(range(len(payloads))), "b": blob_array(payloads)}), root)
    synthetic_entries(root, SYNTHETIC)
    maintain_index(root, timedelta(hours=1))


def test_gc_builds_a_run_of_a_big_index_and_writers_find_through_it(tmp_path):
    root = str(tmp_path / "t")
    payloads = [os.urandom(20_000) for _ in range(30)]
    big_store(root, payloads)
    (run,) = read_runs(runs_uri(index_uri(root)))
    assert run.entries == SYNTHETIC + 30
    maintain_index(root, timedelta(0))  # Lance's cleanup leaves the run alone, and it stands
    assert read_runs(runs_uri(index_uri(root))) == [run]
    index = StoreIndex.open(root)
    digests = [content_hash(p) for p in payloads]
    found = index.find([*digests, content_hash(b"absent")])
    assert set(found) == set(digests) and index._level0._run  # answered by the run
    packs = set(Path(root, "_blobs", "packs").iterdir())
    table = write_table(
        pa.table({"id": [100, 101], "b": blob_array(payloads[:2])}), root, mode="append"
    )
    assert set(Path(root, "_blobs", "packs").iterdir()) == packs  # stored nothing new
    assert table.read_blobs("b", [30, 31]) == payloads[:2]


def test_a_run_is_not_used_once_the_index_changed_under_it_and_gc_replaces_it(tmp_path):
    root = str(tmp_path / "t")
    payloads = [os.urandom(20_000) for _ in range(4)]
    big_store(root, payloads)
    (old,) = read_runs(runs_uri(index_uri(root)))
    # rows deleted from a covered file (what retiring a pack does): the run would name them
    lance.dataset(index_uri(root)).delete("pack = 'packs/synthetic.pack' AND position < 100")
    index = StoreIndex.open(root)
    assert set(index.find([content_hash(p) for p in payloads])) == {
        content_hash(p) for p in payloads
    }
    assert index._level0._run == ()  # asked the scalar indices instead
    maintain_index(root, timedelta(hours=1))
    (new,) = read_runs(runs_uri(index_uri(root)))
    assert new.uri != old.uri and new.entries == SYNTHETIC + 4 - 10
    assert StoreIndex.open(root).find([content_hash(payloads[0])])


def test_a_copy_of_the_table_finds_through_the_run_with_the_original_gone(tmp_path):
    root, copy = str(tmp_path / "t"), str(tmp_path / "copy")
    payloads = [os.urandom(20_000) for _ in range(3)]
    big_store(root, payloads)
    shutil.copytree(root, copy)
    shutil.rmtree(root)
    index = StoreIndex.open(copy)
    assert set(index.find([content_hash(p) for p in payloads])) == {
        content_hash(p) for p in payloads
    }
    assert index._level0._run  # its files and row addresses are the copy's own


def test_a_write_beside_a_run_finds_what_later_writes_stored(tmp_path):
    root = str(tmp_path / "t")
    big_store(root, [os.urandom(20_000)])
    later = os.urandom(20_000)
    write_table(pa.table({"id": [1], "b": blob_array([later])}), root, mode="append")
    index = StoreIndex.open(root)
    assert content_hash(later) in index.find([content_hash(later)])
    assert (
        index._level0._run and index._level0._run[1]
    )  # the run, and the fragment it does not cover


def test_a_damaged_run_lowers_dedup_and_never_names_other_bytes(tmp_path):
    root = str(tmp_path / "t")
    payloads = [os.urandom(20_000) for _ in range(30)]
    big_store(root, payloads)
    (run,) = read_runs(runs_uri(index_uri(root)))
    start = run._entries_start
    for i in range(0, run.entries * 16, 997):  # prefixes and row addresses alike
        flip(run.uri, start + i)
    directory = run._directory_start
    for i in range(0, ((1 << run.bits) + 1) * 8, 61):  # bucket bounds too
        flip(run.uri, directory + i)
    index = StoreIndex.open(root)
    digests = [content_hash(p) for p in payloads]
    for digest, stored in index.find(digests).items():
        assert stored.digest == digest and stored.pack != "packs/synthetic.pack"
    table = write_table(
        pa.table({"id": list(range(100, 130)), "b": blob_array(payloads)}), root, mode="append"
    )
    assert table.read_blobs("b", list(range(30, 60))) == payloads
    problems = open_table(root).verify(deep=True)["problems"]
    assert [p for p in problems if p["column"] == "b"] == []  # (the synthetic pack is absent)


def test_spark_writes_ask_a_big_index_for_their_hashes_and_pass_over_retired_packs(spark, tmp_path):
    """``bs.write_table`` asks the index for the write's hashes in its tasks (the sorted run
    answers what it covers; bench case store_scale times it against the index's size); a
    copy in a pack gc retired is not referenced."""
    import blobhouse.spark as bs
    from blobhouse.io.objects import object_store
    from blobhouse.store.packs import _tombstone_uri

    root = str(tmp_path / "t")
    payloads = [os.urandom(20_000) for _ in range(3)]
    big_store(root, payloads[:2])
    later = pa.table({"id": [2], "b": blob_array(payloads[2:])})  # a pack of its own
    write_table(later, root, mode="append")
    retired = StoreIndex.open(root).find([content_hash(payloads[2])])[content_hash(payloads[2])]
    tombstone = _tombstone_uri(root, retired.pack)
    object_store(tombstone).put(tombstone, b"")  # retired, its index entry not yet dropped
    packs = {p.name: p.stat().st_size for p in Path(root, "_blobs", "packs").iterdir()}
    new = os.urandom(20_000)
    rows = [(100 + i, [payloads[0], payloads[1], payloads[2], new][i % 4]) for i in range(8)]
    df = spark.createDataFrame(rows, "id long, b binary").repartition(3)
    bs.write_table(df, root, mode="append", blob_columns=["b"], dedup="global")
    after = {p.name: p.stat().st_size for p in Path(root, "_blobs", "packs").iterdir()}
    added = sum(size for name, size in after.items() if name not in packs)
    assert added == len(new) + len(payloads[2])  # found ones referenced; each stored once
    table = open_table(root)
    got = {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist() if r["id"] >= 100}
    assert got == dict(rows)
    refs = table.to_arrow(blobs="refs").to_pylist()
    assert all(retired.pack not in r["b"]["uri"] for r in refs if r["id"] >= 100)
