"""Payloads that racing writers both stored: recorded by the later index append, merged by
compaction, reclaimed by gc, never while a retained version reads the copy
(blobhouse/store/duplicates.py, docs/global-dedup.md)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.store.duplicates import recorded_duplicates
from blobhouse.write.table_write import begin_write
from tests.helpers import aged, disk_bytes, stock_read, worker_script

SIZE = 200_000


def rows(ids: list[int], payloads: list[bytes]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})


def payloads(seed: int, n: int, size: int = SIZE) -> list[bytes]:
    return [random.Random(seed * 1000 + i).randbytes(size) for i in range(n)]


FIRST = b"first"  # the table's first row, before the race: its payload is in the store too


def packs_bytes(uri: str, bucket=None) -> int:
    """The bytes of the store's packs, less the first row's."""
    if bucket is not None:
        folder = f"{uri.removeprefix(bucket.uri + '/')}/_blobs/packs/"
        return sum(bucket.objects(folder).values()) - len(FIRST)
    return disk_bytes(os.path.join(uri, "_blobs", "packs")) - len(FIRST)


def race(uri: str, tables: list[pa.Table], storage_options: dict | None = None) -> None:
    """Writes that each look the store up and store their payloads before any of them commits
    (two processes or Spark applications appending at the same moment), then commit in turn."""
    attempts = [
        begin_write(uri, t.schema, mode="append", in_tasks=True, storage_options=storage_options)
        for t in tables
    ]
    written = [a.plan.write(t.to_batches()) for a, t in zip(attempts, tables, strict=True)]
    for attempt, files in zip(attempts, written, strict=True):
        attempt.commit(files)


def table_rows(uri: str, storage_options: dict | None = None) -> dict[int, bytes]:
    table = open_table(uri, storage_options=storage_options)
    return {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}


def test_racing_writers_store_twice_and_compaction_then_gc_keep_one_copy(table_uri):
    shared = payloads(1, 6)
    write_table(rows([0], [FIRST]), table_uri)
    race(table_uri, [rows(list(range(i, i + 6)), shared) for i in (10, 20, 30)])
    assert packs_bytes(table_uri) == 3 * 6 * SIZE  # three writers, three copies
    assert recorded_duplicates(table_uri).digests == {content_hash(p) for p in shared}
    want = table_rows(table_uri)

    report = open_table(table_uri).compact()
    assert report["duplicate_store_bytes"] == 2 * 6 * SIZE
    assert report["repacked_packs"] == 2 and report["new_store_bytes"] == 0  # repointed
    assert report["unused_store_bytes"] == 0
    assert recorded_duplicates(table_uri).digests == frozenset()  # settled
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)

    assert packs_bytes(table_uri) == 6 * SIZE
    assert table_rows(table_uri) == want
    assert sorted(stock_read(table_uri, "b")) == sorted(want.values())
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_copy_a_tag_still_reads_is_kept_until_the_tag_goes(table_uri):
    shared = payloads(2, 3)
    write_table(rows([0], [FIRST]), table_uri)
    race(table_uri, [rows([1, 2, 3], shared), rows([4, 5, 6], shared)])
    lance.dataset(table_uri).tags.create("raced", open_table(table_uri).version)
    open_table(table_uri).compact()
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) == 2 * 3 * SIZE  # the tag reads the other copy
    tagged = open_table(table_uri, "raced")
    assert tagged.read_blobs("b", range(1, 7)) == shared + shared
    lance.dataset(table_uri).tags.delete("raced")
    # the tag's gc took the copy back (resurrected): a pack nothing references, reaped once
    # the leases of the writes that made it expire
    aged(os.path.join(table_uri, "_leases"), 1)
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) == 3 * SIZE
    assert sorted(table_rows(table_uri).items()) == [(0, FIRST)] + [
        (i, shared[(i - 1) % 3]) for i in range(1, 7)
    ]


def test_duplicates_within_the_budget_stay_recorded_until_a_compaction_takes_them(table_uri):
    """One shared payload among 60 unique ones is ~1.6% of the store: under max_unused it
    stays (counted as unused), and is merged when a compaction must keep nothing unused."""
    shared, first, second = payloads(3, 1), payloads(4, 30), payloads(5, 30)
    write_table(rows([0], [FIRST]), table_uri)
    race(
        table_uri,
        [rows(list(range(1, 32)), first + shared), rows(list(range(40, 71)), second + shared)],
    )
    report = open_table(table_uri).compact()
    assert report["duplicate_store_bytes"] == SIZE and report["repacked_packs"] == 0
    assert report["unused_store_bytes"] == SIZE
    assert recorded_duplicates(table_uri).digests == {content_hash(shared[0])}
    open_table(table_uri).gc(grace=timedelta(0))  # gc (and Lance's cleanup) keep the record
    assert recorded_duplicates(table_uri).digests == {content_hash(shared[0])}
    report = open_table(table_uri).compact(max_unused=0.0)
    assert report["repacked_packs"] == 1 and report["new_store_bytes"] == 30 * SIZE
    assert report["unused_store_bytes"] == 0
    assert recorded_duplicates(table_uri).digests == frozenset()
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) == 61 * SIZE
    got = table_rows(table_uri)
    assert [got[i] for i in range(1, 32)] == first + shared
    assert [got[i] for i in range(40, 71)] == second + shared


def test_a_record_is_a_hint_a_wrong_or_stale_one_changes_nothing(table_uri):
    """A record naming payloads stored once (or never) moves no byte, and is dropped."""
    data = payloads(6, 4)
    write_table(rows([0, 1, 2, 3], data), table_uri)
    folder = os.path.join(table_uri, "_blobs", "index", "_duplicates")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "made-up.digests"), "wb") as f:
        f.write(content_hash(data[0]) + content_hash(b"never stored"))
    with open(os.path.join(folder, "cut.digests"), "wb") as f:
        f.write(b"x" * 33)  # not whole digests: left out
    outside = os.path.join(os.path.dirname(table_uri), "outside.digests")
    with open(outside, "wb") as f:  # whole digests, but outside the table
        f.write(content_hash(data[1]) * 4)
    os.symlink(outside, os.path.join(folder, "link.digests"))
    os.mkfifo(os.path.join(folder, "pipe.digests"))  # read, it would never end
    assert recorded_duplicates(table_uri).digests == {
        content_hash(data[0]),
        content_hash(b"never stored"),
    }
    report = open_table(table_uri).compact()
    assert report["duplicate_store_bytes"] == 0 and report["repacked_packs"] == 0
    assert recorded_duplicates(table_uri).digests == frozenset()
    assert open_table(table_uri).read_blobs("b", range(4)) == data


def test_processes_appending_the_same_new_payloads_at_once_end_stored_once(table_uri):
    """Four processes append the same 12 new payloads at one moment: whatever the race left,
    compaction and gc leave each payload stored once, every row readable."""
    shared = payloads(7, 12)
    write_table(rows([0], [FIRST]), table_uri)
    go = f"{table_uri}.go"
    script = worker_script("duplicate_writer_worker.py")
    workers = [subprocess.Popen([sys.executable, script, table_uri, go, str(w)]) for w in range(4)]
    time.sleep(1.0)  # each has imported blobhouse and waits for the start
    open(go, "w").close()
    assert [w.wait(timeout=300) for w in workers] == [0, 0, 0, 0]
    stored = packs_bytes(table_uri)
    assert stored >= 12 * SIZE
    # a race that stored a payload again is recorded
    assert (stored > 12 * SIZE) == bool(recorded_duplicates(table_uri).digests)
    open_table(table_uri).compact()
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) <= 1.05 * 12 * SIZE
    got = table_rows(table_uri)
    assert len(got) == 1 + 4 * 12
    assert all(got[100 * w + i] == shared[i] for w in range(1, 5) for i in range(12))
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_racing_writers_on_every_store_end_stored_once(bucket):
    uri = f"{bucket.uri}/t"
    shared = payloads(8, 3)
    write_table(rows([0], [FIRST]), uri, storage_options=bucket.options)
    race(uri, [rows([1, 2, 3], shared), rows([4, 5, 6], shared)], bucket.options)
    assert packs_bytes(uri, bucket=bucket) == 2 * 3 * SIZE
    open_table(uri, storage_options=bucket.options).compact()
    time.sleep(1.1)  # the stores' clocks are whole seconds: the tombstone must be older
    open_table(uri, storage_options=bucket.options).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(uri, bucket=bucket) == 3 * SIZE
    got = table_rows(uri, bucket.options)
    assert [got[i] for i in range(1, 7)] == shared + shared
    assert bucket.uploads() == []


def test_a_spark_append_racing_a_python_write_is_merged_by_spark_compaction(spark, table_uri):
    """The natural df.write path stores a payload a Python write holds uncommitted; the
    later index append records the copy, and Spark's compaction merges it."""
    import blobhouse.spark as bs

    shared = payloads(9, 4)
    write_table(rows([0], [FIRST]), table_uri)
    local = rows([1, 2, 3, 4], shared)
    attempt = begin_write(table_uri, local.schema, mode="append", in_tasks=True)
    staged = attempt.plan.write(local.to_batches())  # stored, not committed yet
    df = spark.createDataFrame([(10 + i, p) for i, p in enumerate(shared)], "id long, b binary")
    df.write.format("blobhouse").mode("append").save(table_uri)
    attempt.commit(staged)
    assert packs_bytes(table_uri) == 2 * 4 * SIZE
    assert recorded_duplicates(table_uri).digests == {content_hash(p) for p in shared}
    report = bs.compact(spark, table_uri)
    assert report["duplicate_store_bytes"] == 4 * SIZE and report["new_store_bytes"] == 0
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert packs_bytes(table_uri) == 4 * SIZE
    got = table_rows(table_uri)
    assert [got[i] for i in (1, 2, 3, 4, 10, 11, 12, 13)] == shared + shared


def test_a_compaction_on_a_branch_leaves_mains_records_for_main(table_uri):
    shared = payloads(10, 3)
    write_table(rows([0], [FIRST]), table_uri)
    race(table_uri, [rows([1, 2, 3], shared), rows([4, 5, 6], shared)])
    lance.dataset(table_uri).create_branch("exp", open_table(table_uri).version)
    write_table(rows([7], [b"on the branch"]), table_uri, mode="append", branch="exp")
    open_table(table_uri, branch="exp").compact()
    assert recorded_duplicates(table_uri).digests == {content_hash(p) for p in shared}
    report = open_table(table_uri).compact()
    assert report["duplicate_store_bytes"] == 3 * SIZE
    assert recorded_duplicates(table_uri).digests == frozenset()
    assert open_table(table_uri, branch="exp").read_blobs("b", range(1, 7)) == shared + shared
    # neither compaction retired a pack the other line reads: each compacts again
    assert report["retired_packs"] == 0
    open_table(table_uri, branch="exp").delete("id = 7")
    open_table(table_uri, branch="exp").compact()
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    assert open_table(table_uri, branch="exp").read_blobs("b", range(1, 7)) == shared + shared
    assert table_rows(table_uri) == {
        0: FIRST,
        **dict(zip(range(1, 7), shared + shared, strict=True)),
    }


def test_a_record_that_cannot_be_written_warns_and_the_write_stands(table_uri):
    shared = payloads(11, 2)
    write_table(rows([0], [FIRST]), table_uri)
    folder = os.path.join(table_uri, "_blobs", "index", "_duplicates")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder, "wb") as f:  # a file where the records' folder belongs
        f.write(b"not a folder")
    with pytest.warns(UserWarning, match="not recorded for compaction to merge"):
        race(table_uri, [rows([1, 2], shared), rows([3, 4], shared)])
    assert table_rows(table_uri) == {
        0: FIRST,
        1: shared[0],
        2: shared[1],
        3: shared[0],
        4: shared[1],
    }
    assert open_table(table_uri).compact()["duplicate_store_bytes"] == 0  # nothing recorded
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_what_the_tasks_of_one_write_stored_each_is_recorded_and_merged(table_uri):
    """Payloads are claimed only while they turn out shared: after PROBE unique thumbnails,
    a small payload every task meets once (and no task's sample holds) is stored once per
    task. The write's own
    index append records it, and a compaction merges the copies."""
    from blobhouse.store.claims import PROBE

    late = os.urandom(3_000)

    def task(n: int) -> list[pa.RecordBatch]:
        unique = [b"%d-%d" % (n, i) * 400 for i in range(PROBE + 50)]
        ids = [100_000 * (n + 1) + i for i in range(len(unique) + 1)]
        return rows(ids, [*unique, late]).to_batches(max_chunksize=1)

    write_table(rows([0], [FIRST]), table_uri)
    attempt = begin_write(table_uri, rows([0], [FIRST]).schema, mode="append", in_tasks=True)
    written = [f for n in range(3) for f in attempt.plan.write(task(n))]
    attempt.commit(written)
    assert recorded_duplicates(table_uri).digests == {content_hash(late)}
    report = open_table(table_uri).compact(max_unused=0.0)
    assert report["duplicate_store_bytes"] == 2 * len(late)
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    stats = open_table(table_uri).stats()["columns"]["b"]
    assert stats["physical_bytes"] == stats["logical_bytes"] - 2 * len(late)
    got = table_rows(table_uri)
    assert [got[100_000 * (n + 1) + PROBE + 50] for n in range(3)] == [late] * 3
