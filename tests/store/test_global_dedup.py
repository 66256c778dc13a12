"""dedup="global": one copy per payload across appends, data files, Spark tasks and backfills, in
a store the table owns and stock pylance resolves; failed writes leave nothing; gc reclaims packs
without ever racing a writer (retire, then reap); compaction keeps store references and repacks
mostly dead packs."""

from __future__ import annotations

import os
import random
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.errors import StoreRaceError
from blobhouse.store.index import StoreIndex
from tests.helpers import aged, disk_bytes, stock_read, tree, worker_script

PAYLOADS = [os.urandom(300_000), os.urandom(120_000), os.urandom(5_000), os.urandom(20)]
UNIQUE = sum(len(p) for p in PAYLOADS)


def rows(ids: list[int], payloads: list) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})


def packs_bytes(uri: str) -> int:
    return disk_bytes(os.path.join(uri, "_blobs", "packs"))


def test_appends_of_the_same_payloads_store_them_once(table_uri):
    write_table(rows([0, 1, 2, 3], PAYLOADS), table_uri, dedup="global")
    again = PAYLOADS[::-1] + PAYLOADS[:2]
    write_table(rows(list(range(4, 10)), again), table_uri, mode="append", dedup="global")
    expected = PAYLOADS + again
    assert packs_bytes(table_uri) == UNIQUE
    stats = open_table(table_uri).stats()
    assert stats["columns"]["b"]["kinds"]["global"]["rows"] == 10
    assert UNIQUE <= stats["physical_bytes"] <= 1.05 * UNIQUE
    assert stats["logical_bytes"] == sum(len(p) for p in expected)
    assert open_table(table_uri).read_blobs("b", range(10)) == expected
    assert stock_read(table_uri, "b") == expected
    descriptor = lance.dataset(table_uri).to_table(columns=["b"]).column("b")[0].as_py()
    assert descriptor["kind"] == 3 and descriptor["blob_uri"].startswith("packs/")
    assert len(StoreIndex.open(table_uri)) == len(PAYLOADS)
    assert open_table(table_uri).verify()["problems"] == []


def test_an_existing_table_gets_a_store_and_lance_maintenance_keeps_it(table_uri):
    write_table(rows([0, 1], PAYLOADS[:2]), table_uri)  # per-file dedup first
    for start in (2, 6):
        ids = list(range(start, start + 4))
        write_table(rows(ids, PAYLOADS), table_uri, mode="append", dedup="global")
    expected = PAYLOADS[:2] + PAYLOADS + PAYLOADS
    assert packs_bytes(table_uri) == UNIQUE
    dataset = lance.dataset(table_uri)
    dataset.optimize.compact_files()
    lance.dataset(table_uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    assert stock_read(table_uri, "b") == expected
    assert open_table(table_uri).read_blobs("b", range(10)) == expected
    assert packs_bytes(table_uri) == UNIQUE  # Lance never touches files under a base


def test_compaction_keeps_store_references(table_uri):
    for start in range(0, 12, 4):
        write_table(
            rows(list(range(start, start + 4)), PAYLOADS), table_uri, mode="append", dedup="global"
        )
    packs = tree(os.path.join(table_uri, "_blobs", "packs"))
    report = open_table(table_uri).compact()
    assert report["fragments_removed"] == 3
    assert tree(os.path.join(table_uri, "_blobs", "packs")) == packs
    assert open_table(table_uri).stats()["columns"]["b"]["kinds"]["global"]["rows"] == 12
    assert stock_read(table_uri, "b") == PAYLOADS * 3


def test_failed_writes_leave_no_pack_and_gc_reclaims_unreferenced_packs(table_uri):
    write_table(rows([0, 1, 2, 3], PAYLOADS), table_uri, dedup="global")
    before = tree(table_uri)

    def failing():
        yield from rows([4], [os.urandom(50_000)]).to_batches()
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        write_table(failing(), table_uri, mode="append", dedup="global")
    assert tree(table_uri) == before
    # overwrite: once version 1 is gone nothing references the first pack; the index still
    # names it, so gc first retires it (tombstone, out of the index) and keeps the bytes
    fresh = os.urandom(70_000)
    write_table(rows([9], [fresh]), table_uri, mode="overwrite", dedup="global")
    aged(table_uri, hours=48)
    report = open_table(table_uri).gc(retain_versions=1)
    assert (report["retired_packs"], report["reaped_packs"]) == (1, 0)
    assert packs_bytes(table_uri) == UNIQUE + 70_000
    # a writer no longer finds the retired payload: it stores it anew
    write_table(rows([10], [PAYLOADS[0]]), table_uri, mode="append", dedup="global")
    assert packs_bytes(table_uri) == UNIQUE + 70_000 + len(PAYLOADS[0])
    # once the tombstone is older than the grace period, the pack goes
    aged(table_uri, hours=48)
    report = open_table(table_uri).gc()
    assert (report["reaped_packs"], report["resurrected_packs"]) == (1, 0)
    assert packs_bytes(table_uri) == 70_000 + len(PAYLOADS[0])
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert stock_read(table_uri, "b") == [fresh, PAYLOADS[0]]


def test_packs_of_a_write_that_never_committed_are_collected_after_the_grace(table_uri):
    from blobhouse.options import WriteOptions
    from blobhouse.write import begin_write

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    staged = rows([1], [os.urandom(90_000)])
    write = begin_write(
        table_uri, staged.schema, WriteOptions(dedup="global"), mode="append", in_tasks=True
    )
    write.plan.write(staged.to_batches())  # a writer killed before its commit
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + 90_000
    assert open_table(table_uri).gc()["kept_young_files"] >= 2  # data file and pack
    aged(table_uri, hours=48)
    report = open_table(table_uri).gc()
    assert report["removed_files"] >= 2 and report["retired_packs"] == 0
    assert packs_bytes(table_uri) == len(PAYLOADS[0])
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert stock_read(table_uri, "b") == [PAYLOADS[0]]


def test_verify_reports_a_missing_pack(table_uri):
    write_table(rows([0, 1], PAYLOADS[:2]), table_uri, dedup="global")
    (pack,) = Path(table_uri, "_blobs", "packs").iterdir()
    pack.unlink()
    problems = open_table(table_uri).verify()["problems"]
    assert {(p["row"], p["reason"]) for p in problems} == {
        (0, "missing object"),
        (1, "missing object"),
    }


def test_backfill_stores_into_the_table_store(table_uri):
    ids = pa.array(range(6), pa.int64())
    table = write_table(pa.table({"id": ids}), table_uri, max_rows_per_file=2)

    def render(batch):  # three fragments, the same two payloads in each
        return [PAYLOADS[i % 2] for i in batch["id"].to_pylist()]

    table = table.backfill_blob_column("b", render, dedup="global")
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1])
    assert stock_read(table_uri, "b") == [PAYLOADS[i % 2] for i in range(6)]
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    # a second backfill of the same column finds both payloads in the index
    table = open_table(table_uri).backfill_blob_column("b", render, dedup="global")
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1])
    assert open_table(table_uri).read_blobs("b", range(6)) == [PAYLOADS[i % 2] for i in range(6)]


def test_spark_backfill_stores_into_the_table_store(spark, table_uri):
    ids = pa.array(range(6), pa.int64())
    write_table(pa.table({"id": ids}), table_uri, max_rows_per_file=2)

    def render(batch):
        return [PAYLOADS[i % 2] for i in batch["id"].to_pylist()]

    bs.backfill_blob_column(spark, table_uri, "b", render, dedup="global")
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1])  # once, not per task
    assert stock_read(table_uri, "b") == [PAYLOADS[i % 2] for i in range(6)]
    assert open_table(table_uri).stats()["columns"]["b"]["kinds"]["global"]["rows"] == 6


def test_spark_global_backfill_with_deleted_rows_and_a_failing_function(spark, table_uri):
    ids = pa.array(range(8), pa.int64())
    table = write_table(pa.table({"id": ids}), table_uri, max_rows_per_file=4)
    table.delete("id IN (1, 6)")

    def failing(batch):
        if 5 in batch["id"].to_pylist():
            raise ValueError("render failed on id 5")
        return [PAYLOADS[i % 2] for i in batch["id"].to_pylist()]

    with pytest.raises(Exception, match="render failed on id 5"):
        bs.backfill_blob_column(spark, table_uri, "b", failing, dedup="global")
    assert "b" not in open_table(table_uri).schema.names
    assert packs_bytes(table_uri) == 0

    def render(batch):
        return [PAYLOADS[i % 2] for i in batch["id"].to_pylist()]

    bs.backfill_blob_column(spark, table_uri, "b", render, dedup="global")
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1])
    got = open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    assert [(r["id"], r["b"]) for r in got] == [
        (i, PAYLOADS[i % 2]) for i in range(8) if i not in (1, 6)
    ]


def test_spark_tasks_writing_overlapping_content_store_each_payload_once(spark, table_uri):
    data = [(i, PAYLOADS[i % 3]) for i in range(48)]
    df = spark.createDataFrame(data, "id long, b binary").repartition(8)
    bs.write_table(df, table_uri, blob_columns=["b"], dedup="global", partitions=8)
    bs.write_table(df, table_uri, blob_columns=["b"], dedup="global", partitions=8)
    unique = sum(len(p) for p in PAYLOADS[:3])
    assert packs_bytes(table_uri) == unique
    table = open_table(table_uri)
    assert table.stats()["physical_bytes"] <= 1.05 * unique
    got = table.to_arrow(blobs="bytes").to_pylist()
    assert sorted((r["id"], r["b"]) for r in got) == sorted(data + data)
    dataset = lance.dataset(table_uri)
    ids = dataset.to_table(columns=["id"]).column("id").to_pylist()
    stock = stock_read(table_uri, "b")
    assert all(stock[i] == PAYLOADS[row_id % 3] for i, row_id in enumerate(ids))


def test_spark_stores_every_global_column_once_across_tasks(spark, table_uri):
    # rows pair images and videos in a pattern no single shuffle key brings together: every
    # distinct payload of every column is stored once, whichever column comes first
    images, videos = PAYLOADS[2:4], PAYLOADS[0:2]
    data = [(i, images[i % 2], videos[(i // 2) % 2]) for i in range(40)]
    df = spark.createDataFrame(data, "id long, image binary, video binary").repartition(8)
    for columns in (["image", "video"], ["video", "image"]):
        uri = f"{table_uri}-{columns[0]}"
        bs.write_table(df, uri, blob_columns=columns, dedup="global", partitions=8)
        assert packs_bytes(uri) == UNIQUE
        got = open_table(uri).to_arrow(blobs="bytes").to_pylist()
        assert sorted((r["id"], r["image"], r["video"]) for r in got) == sorted(data)
    bs.write_table(df, uri, blob_columns=["video", "image"], dedup="global", partitions=8)
    assert packs_bytes(uri) == UNIQUE  # a second append finds everything in the store


def test_spark_global_next_to_content_dedup_columns(spark, table_uri):
    data = [(i, PAYLOADS[i % 2], PAYLOADS[2 + i % 2]) for i in range(24)]
    df = spark.createDataFrame(data, "id long, video binary, image binary").repartition(4)
    bs.write_table(
        df,
        table_uri,
        blob_columns=["video", "image"],
        dedup={"video": "global", "image": "content"},
        partitions=4,
    )
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1])
    stats = open_table(table_uri).stats()["columns"]["image"]
    # colocated by the content-dedup column: each image once per task's file
    assert stats["physical_bytes"] <= 2 * 4 * (len(PAYLOADS[2]) + len(PAYLOADS[3]))
    got = open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    assert sorted((r["id"], r["video"], r["image"]) for r in got) == sorted(data)


def test_deep_verify_checks_store_payloads_against_the_index(table_uri):
    write_table(rows([0, 1, 2, 3], PAYLOADS), table_uri, dedup="global")
    report = open_table(table_uri).verify(deep=True)
    assert (report["hashed"], report["unhashed"], report["problems"]) == (4, 0, [])
    (pack,) = Path(table_uri, "_blobs", "packs").iterdir()
    with open(pack, "r+b") as f:  # flip a byte of the second payload
        f.seek(300_000 + 10)
        byte = f.read(1)
        f.seek(300_000 + 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    problems = open_table(table_uri).verify(deep=True)["problems"]
    # the row's bytes differ from its value, and the index entry from what it names
    assert sorted((p["row"], p["reason"][:17]) for p in problems) == [
        (1, "content hash mism"),
        (1, "store index entry"),
    ]


@pytest.fixture
def found_in_the_index(table_uri):
    """A write in flight that found a payload in the index while nothing references it."""
    from blobhouse.options import WriteOptions
    from blobhouse.write import begin_write

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    write_table(rows([1], [PAYLOADS[1]]), table_uri, mode="overwrite", dedup="global")
    open_table(table_uri).gc(retain_versions=1, grace=timedelta(hours=1))  # pack too young
    data = rows([2], [PAYLOADS[0]])
    write = begin_write(
        table_uri, data.schema, WriteOptions(dedup="global"), mode="append", in_tasks=True
    )
    written = write.plan.write(data.to_batches())
    assert written[0].found_packs and not written[0].packs  # a reference, nothing written
    aged(table_uri, hours=48)
    return write, written


@pytest.mark.parametrize("reaped", [False, True])
def test_a_write_never_commits_a_reference_to_a_pack_gc_retired(
    table_uri, found_in_the_index, reaped
):
    write, written = found_in_the_index
    assert open_table(table_uri).gc()["retired_packs"] == 1
    if reaped:
        aged(table_uri, hours=48)
        assert open_table(table_uri).gc()["reaped_packs"] == 1
    version = open_table(table_uri).version
    with pytest.raises(StoreRaceError, match="retired by gc while this write ran"):
        write.commit(written)
    assert open_table(table_uri).version == version
    assert stock_read(table_uri, "b") == [PAYLOADS[1]]
    # the retry stores the payload anew and commits
    write_table(rows([2], [PAYLOADS[0]]), table_uri, mode="append", dedup="global")
    assert stock_read(table_uri, "b") == [PAYLOADS[1], PAYLOADS[0]]


def test_a_pack_referenced_after_it_was_retired_is_resurrected_not_deleted(table_uri):
    from blobhouse.store.index import retire_packs

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    (pack,) = (f"packs/{p.name}" for p in Path(table_uri, "_blobs", "packs").iterdir())
    # what a commit racing the retiring gc leaves: a referenced pack with a tombstone
    retire_packs(table_uri, [pack])
    aged(table_uri, hours=48)
    report = open_table(table_uri).gc()
    assert (report["resurrected_packs"], report["reaped_packs"]) == (1, 0)
    assert not Path(table_uri, "_blobs", "tombstones", pack.removeprefix("packs/")).exists()
    assert stock_read(table_uri, "b") == [PAYLOADS[0]]
    assert open_table(table_uri).verify()["problems"] == []


@pytest.mark.slow
def test_a_writer_and_gc_in_separate_processes_lose_nothing(table_uri):
    """gc retires and reaps store packs (grace 2 s) while another process keeps appending and
    overwriting rows whose payloads it finds in the store's index."""
    import json
    import subprocess
    import sys

    from tests.workers.store_race_worker import GRACE, payload

    worker = worker_script("store_race_worker.py")
    write_table(rows([1000], [payload(1000)]), table_uri, dedup="global")

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, worker, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    collector = start("gc", table_uri, "8")
    writer = start("writer", table_uri, "40")
    outputs = [p.communicate(timeout=300) for p in (writer, collector)]
    for process, (_, err) in zip((writer, collector), outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
    results = [json.loads(out.splitlines()[-1]) for out, _ in outputs]
    assert results[1]["runs"] >= 2 and results[1]["retired"] >= 1  # the protocol ran
    table = open_table(table_uri)
    for version in [v["version"] for v in table.versions()]:
        at = open_table(table_uri, version)
        got = at.to_arrow(blobs="bytes").to_pylist()
        assert all(r["b"] == payload(r["id"]) for r in got), f"version {version}"
        ids = lance.dataset(table_uri, version=version).to_table(columns=["id"]).column("id")
        stock = lance.dataset(table_uri, version=version).read_blobs(
            "b", indices=list(range(len(ids))), preserve_order=True
        )
        assert [b for _, b in stock] == [payload(i) for i in ids.to_pylist()]
    assert table.verify(deep=True)["problems"] == []
    # quiet now: two aged passes reclaim every unreferenced pack
    for _ in range(2):
        aged(table_uri, hours=1)
        open_table(table_uri).gc(grace=GRACE)
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert all(
        r["b"] == payload(r["id"])
        for r in open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    )


def test_a_table_created_again_at_the_same_path_starts_with_an_empty_store(table_uri):
    import shutil

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    shutil.rmtree(table_uri)
    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")  # the old index is gone
    write_table(rows([1], [PAYLOADS[0]]), table_uri, mode="append", dedup="global")
    assert stock_read(table_uri, "b") == [PAYLOADS[0]] * 2
    assert packs_bytes(table_uri) == len(PAYLOADS[0])


def test_spark_looks_payloads_up_in_the_store_in_its_tasks(spark, table_uri):
    from blobhouse.layout import TableLocation
    from blobhouse.spark.lookup import look_up_in_store

    first = spark.createDataFrame([(i, PAYLOADS[i % 2]) for i in range(6)], "id long, b binary")
    bs.write_table(first, table_uri, blob_columns=["b"], dedup="global", partitions=2)
    new = os.urandom(80_000)
    second = spark.createDataFrame(
        [(10 + i, [PAYLOADS[0], PAYLOADS[1], new][i % 3]) for i in range(9)], "id long, b binary"
    )
    location = TableLocation.of(table_uri)
    looked_up = {
        r["id"] - 10: r["b"] for r in look_up_in_store(spark, second, location, ["b"]).collect()
    }
    found = [v for i, v in looked_up.items() if i % 3 != 2]
    assert len(found) == 6  # in the store already: references, no bytes travel further
    assert all(v["data"] is None and "/_blobs/packs/" in v["uri"] for v in found)
    assert all(v["data"] == new and v["uri"] is None for i, v in looked_up.items() if i % 3 == 2)
    bs.write_table(second, table_uri, blob_columns=["b"], dedup="global", partitions=3)
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + len(PAYLOADS[1]) + len(new)
    got = open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    expected = [(i, PAYLOADS[i % 2]) for i in range(6)] + [
        (10 + i, [PAYLOADS[0], PAYLOADS[1], new][i % 3]) for i in range(9)
    ]
    assert sorted((r["id"], r["b"]) for r in got) == sorted(expected)
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_compaction_repacks_mostly_dead_packs_and_gc_reclaims_them(table_uri):
    write_table(rows([0, 1, 2, 3], PAYLOADS), table_uri, dedup="global")
    write_table(
        rows([4, 5], PAYLOADS[3:] + PAYLOADS[2:3]), table_uri, mode="append", dedup="global"
    )
    open_table(table_uri).delete("id IN (0, 1)")  # 420 kB of the 425 kB pack is dead now
    (old_pack,) = Path(table_uri, "_blobs", "packs").iterdir()
    report = open_table(table_uri).compact()
    assert report["repacked_packs"] == 1
    assert report["new_store_bytes"] == len(PAYLOADS[2]) + len(PAYLOADS[3])
    expected = [PAYLOADS[2], PAYLOADS[3], PAYLOADS[3], PAYLOADS[2]]
    assert stock_read(table_uri, "b") == expected
    assert all(k == "global" for k in open_table(table_uri).stats()["columns"]["b"]["kinds"])
    assert old_pack.exists()  # older versions still read it
    assert open_table(table_uri).compact()["fragments_removed"] == 0  # nothing sparse now
    aged(table_uri, hours=48)  # the tombstone compaction wrote is past the grace too
    assert open_table(table_uri).gc(retain_versions=1)["reaped_packs"] == 1
    assert not old_pack.exists()
    assert packs_bytes(table_uri) == len(PAYLOADS[2]) + len(PAYLOADS[3])
    assert stock_read(table_uri, "b") == expected
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_store_reference_past_the_end_of_its_pack_is_refused(table_uri):
    from blobhouse import Blob
    from blobhouse.errors import ExternalBlobError

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    (pack,) = Path(table_uri, "_blobs", "packs").iterdir()
    before = tree(table_uri)
    bad = Blob(uri=pack.as_uri(), position=len(PAYLOADS[0]) - 10, size=20)
    with pytest.raises(ExternalBlobError, match=r"row 1: range .* past the end of store pack"):
        write_table(rows([1, 2], [PAYLOADS[1], bad]), table_uri, mode="append", dedup="global")
    assert tree(table_uri) == before


def test_gc_keeps_the_store_index_small_and_removes_what_a_killed_append_left(
    table_uri, monkeypatch
):
    """One index fragment per write adds up: gc compacts the index (writers merge small
    fragments of like size too: tests/store/test_level0_upkeep.py; not here). A kill between
    the table commit and the index commit leaves an unreferenced index file: gc removes it
    (Lance's cleanup, once it is 7 days old). The index still serves dedup afterwards."""
    monkeypatch.setattr("blobhouse.store.index_part._MERGE_WIDTH", 1000)
    for i in range(12):
        write_table(rows([i], [PAYLOADS[i % 2]]), table_uri, mode="append", dedup="global")
    index = Path(table_uri, "_blobs", "index")
    assert len(lance.dataset(str(index)).get_fragments()) == 2  # payloads stored twice only
    for i in range(12, 24):
        write_table(rows([i], [os.urandom(70_000)]), table_uri, mode="append", dedup="global")
    assert len(lance.dataset(str(index)).get_fragments()) == 14
    stray = index / "data" / "killed-append.lance"
    stray.write_bytes(next((index / "data").iterdir()).read_bytes())
    aged(str(index), hours=24 * 8)
    open_table(table_uri).gc(grace=timedelta(hours=1))
    assert len(lance.dataset(str(index)).get_fragments()) == 1
    assert not stray.exists()
    assert len(StoreIndex.open(table_uri)) == 14
    before = disk_bytes(str(Path(table_uri, "_blobs", "packs")))
    write_table(rows([99], [PAYLOADS[0]]), table_uri, mode="append", dedup="global")
    assert disk_bytes(str(Path(table_uri, "_blobs", "packs"))) == before  # still deduplicated
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_spark_global_write_records_what_it_stored_through_the_data_sources_commit(
    spark, table_uri
):
    """The payloads are stored before the rows; the data source's commit (a Python worker of
    its own) records them in the store's index from the write's records, then removes those."""
    from blobhouse.layout import STORED

    data = [(i, PAYLOADS[i % 3]) for i in range(12)]
    df = spark.createDataFrame(data, "id long, b binary").repartition(3)
    bs.write_table(df, table_uri, blob_columns=["b"], dedup="global", partitions=3)
    found = StoreIndex.open(table_uri).find([content_hash(p) for p in PAYLOADS[:3]])
    assert len(found) == 3  # every stored payload is in the index
    assert tree(os.path.join(table_uri, STORED)) == set()  # no record outlives the write


def test_deletes_then_compaction_and_gc_give_the_space_back(table_uri):
    """Every other row deleted leaves each pack half live: a per-pack threshold of one half
    kept 2.0x the live bytes forever; a table-wide budget (max_unused, 5% by default) repacks
    until at most 5% of the store is unreferenced, rewriting only what it must."""
    from datetime import timedelta

    size, n = 100_000, 240
    data = [random.Random(i).randbytes(size) for i in range(n)]
    table = write_table(
        rows(list(range(n)), data),
        table_uri,
        placement={"b": {"pack_file_size_threshold": 4_000_000}},
    )
    packs = len(list(Path(table_uri, "_blobs", "packs").iterdir()))
    assert packs >= 5
    table = table.delete("id % 50 = 1")  # 2%: within the budget, nothing moves
    report = table.compact()
    assert report["repacked_packs"] == 0 and report["new_store_bytes"] == 0
    assert report["unused_store_bytes"] == 5 * size
    table = open_table(table_uri).delete("id % 2 = 1")  # now every pack is exactly half dead
    report = open_table(table_uri).compact()
    live = size * (n // 2)
    assert report["repacked_packs"] == packs
    assert report["new_store_bytes"] == live  # each live byte rewritten once, no more
    assert report["unused_store_bytes"] <= 0.05 * live
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) <= 1.05 * live
    got = open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    assert [(r["id"], r["b"]) for r in got] == [(i, data[i]) for i in range(0, n, 2)]
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_packs_deletes_left_wholly_dead_are_retired_by_compaction_and_reaped_by_one_gc(
    table_uri,
):
    """Whole packs dead after deletes need no repack: compaction retires them (as gc's first
    run did), so the gc after it reaps them, not a second one; a version still reading one
    keeps it."""
    from datetime import timedelta

    size, n = 100_000, 120
    data = [random.Random(i).randbytes(size) for i in range(n)]
    placement = {"b": {"pack_file_size_threshold": 2_000_000}}
    write_table(rows(list(range(n)), data), table_uri, placement=placement)
    packs = set(Path(table_uri, "_blobs", "packs").iterdir())
    open_table(table_uri).delete(f"id < {n // 2}")
    report = open_table(table_uri).compact()
    assert report["retired_packs"] >= 2 and report["new_store_bytes"] <= 20 * size
    assert packs <= set(Path(table_uri, "_blobs", "packs").iterdir())  # old versions read them
    assert open_table(table_uri, 1).read_blobs("b", [0]) == [data[0]]
    gc = open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert gc["reaped_packs"] >= report["retired_packs"]
    assert packs_bytes(table_uri) <= 1.05 * size * (n // 2)
    assert open_table(table_uri).read_blobs("b", range(n // 2)) == data[n // 2 :]
    assert stock_read(table_uri, "b") == data[n // 2 :]


def test_the_budget_repacks_the_deadest_packs_first(table_uri):
    size = 100_000
    first = [random.Random(i).randbytes(size) for i in range(40)]
    second = [random.Random(100 + i).randbytes(size) for i in range(40)]
    write_table(rows(list(range(40)), first), table_uri)
    write_table(rows(list(range(100, 140)), second), table_uri, mode="append")
    # the first pack 3/4 dead, the second 1/10: repacking the first is enough
    open_table(table_uri).delete("id < 30 OR id IN (100, 101, 102, 103)")
    report = open_table(table_uri).compact(max_unused=0.1)
    assert report["repacked_packs"] == 1 and report["new_store_bytes"] == 10 * size
    assert report["unused_store_bytes"] == 4 * size
    report = open_table(table_uri).compact(max_unused=0.0)  # nothing unreferenced may stay
    assert report["repacked_packs"] == 1 and report["new_store_bytes"] == 36 * size
    assert report["unused_store_bytes"] == 0
    got = open_table(table_uri).read_blobs("b", range(46))
    assert got == first[30:] + second[4:]


def test_updates_then_compaction_and_gc_give_the_space_back(table_uri):
    """An update of every other row's blob leaves the old payloads half of each pack: the
    packs are repacked though no row was deleted (their fragments are rewritten for them)."""
    from datetime import timedelta

    size, n = 100_000, 120
    data = [random.Random(i).randbytes(size) for i in range(n)]
    placement = {"b": {"pack_file_size_threshold": 2_000_000}}
    write_table(rows(list(range(n)), data), table_uri, placement=placement)

    def new(batch):
        return [random.Random(1000 + i).randbytes(size) for i in batch["id"].to_pylist()]

    open_table(table_uri).update({"b": new}, where="id % 2 = 0")
    assert packs_bytes(table_uri) == 1.5 * n * size
    report = open_table(table_uri).compact()
    assert report["unused_store_bytes"] <= 0.05 * n * size
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) <= 1.05 * n * size
    expected = [
        random.Random(1000 + i).randbytes(size) if i % 2 == 0 else data[i] for i in range(n)
    ]
    assert stock_read(table_uri, "b") == expected


def test_a_compaction_retires_no_pack_another_branch_reads(table_uri):
    """Deletes on main then compaction repack main's packs; a branch made before still reads
    them: they are not retired (gc, which marks every branch, decides), so the branch's own
    compaction and writes go on."""
    size, n = 100_000, 40
    data = [random.Random(i).randbytes(size) for i in range(n)]
    write_table(rows(list(range(n)), data), table_uri)
    lance.dataset(table_uri).create_branch("exp", open_table(table_uri).version)
    open_table(table_uri).delete("id % 2 = 1")
    report = open_table(table_uri).compact()
    assert report["repacked_packs"] >= 1 and report["retired_packs"] == 0
    write_table(rows([100], [data[0]]), table_uri, mode="append", branch="exp")
    open_table(table_uri, branch="exp").delete("id < 10")
    open_table(table_uri, branch="exp").compact()
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert open_table(table_uri, branch="exp").read_blobs("b", range(31)) == data[10:] + data[:1]
    assert open_table(table_uri).read_blobs("b", range(20)) == data[::2]
    assert open_table(table_uri).verify(deep=True)["problems"] == []
