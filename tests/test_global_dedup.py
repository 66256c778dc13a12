"""dedup="global": one copy per payload across appends, data files and Spark tasks, in a store
the table owns and stock pylance resolves; failed writes leave nothing, gc never deletes an
indexed pack, compaction keeps store references."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import InvalidInputError
from blobhouse.store import StoreIndex

from helpers import disk_bytes, stock_read, tree

PAYLOADS = [os.urandom(300_000), os.urandom(120_000), os.urandom(5_000), os.urandom(20)]
UNIQUE = sum(len(p) for p in PAYLOADS)


def rows(ids: list[int], payloads: list) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})


def packs_bytes(uri: str) -> int:
    return disk_bytes(os.path.join(uri, "_blobs", "packs"))


def age(root: str, hours: float) -> None:
    past = time.time() - hours * 3600
    for path in Path(root).rglob("*"):
        os.utime(path, (past, past))


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
    assert len(StoreIndex.load(table_uri)) == len(PAYLOADS)
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


def test_failed_writes_leave_no_pack_and_gc_keeps_indexed_packs(table_uri):
    write_table(rows([0, 1, 2, 3], PAYLOADS), table_uri, dedup="global")
    before = tree(table_uri)

    def failing():
        yield from rows([4], [os.urandom(50_000)]).to_batches()
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        write_table(failing(), table_uri, mode="append", dedup="global")
    assert tree(table_uri) == before
    # overwrite: the first version's payloads are referenced by nothing once it is gone, but
    # the index still names their pack, so gc keeps it (a writer may be about to use it)
    write_table(rows([9], [os.urandom(70_000)]), table_uri, mode="overwrite", dedup="global")
    age(table_uri, hours=48)
    report = open_table(table_uri).gc(retain_versions=1)
    assert report["kept_indexed_packs"] == 1
    assert packs_bytes(table_uri) == UNIQUE + 70_000
    write_table(rows([10], [PAYLOADS[0]]), table_uri, mode="append", dedup="global")
    assert packs_bytes(table_uri) == UNIQUE + 70_000  # found in the index, not written again
    assert stock_read(table_uri, "b") == [stock_read(table_uri, "b")[0], PAYLOADS[0]]


def test_packs_of_a_write_that_never_committed_are_collected_after_the_grace(table_uri):
    from blobhouse.table import TableWrite

    write_table(rows([0], [PAYLOADS[0]]), table_uri, dedup="global")
    staged = rows([1], [os.urandom(90_000)])
    write = TableWrite.begin(table_uri, staged.schema, mode="append", dedup="global")
    write.write(staged.to_batches())  # a writer killed before its commit
    assert packs_bytes(table_uri) == len(PAYLOADS[0]) + 90_000
    assert open_table(table_uri).gc()["kept_young_files"] >= 2  # data file and pack
    age(table_uri, hours=48)
    report = open_table(table_uri).gc()
    assert report["removed_files"] >= 2 and report["kept_indexed_packs"] == 0
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


def test_backfill_refuses_global_dedup_clearly(table_uri):
    table = write_table(pa.table({"id": pa.array([1], pa.int64())}), table_uri)
    with pytest.raises(InvalidInputError, match="backfill does not write to the table's store"):
        table.backfill_blob_column("img", lambda b: [b"x"], dedup="global")
    assert open_table(table_uri).version == table.version


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
    assert [(p["row"], p["reason"][:21]) for p in problems] == [(1, "content hash mismatch")]
