"""Concurrent upserts keep keys unique: two merges inserting the same new keys at the same time
end with each key once (the later one re-plans: its rows become updates), a merge out of
retries fails naming the keys, a killed lock holder blocks nobody past the lock's expiry, and
merges that insert nothing never take the lock."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest

from blobhouse import (
    blob_array,
    open_table,
    write_table,
)
from blobhouse.commit import locks
from blobhouse.commit.transaction import upsert_lock
from blobhouse.errors import ConcurrentCommitError
from tests.helpers import ROOT, tree

KEYS = 40


def make(uri: str, storage_options: dict | None = None):
    """A table of keys 0..9 with a blob column (inline and sidecar payloads)."""
    ids = list(range(10))
    return write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "img": blob_array([b"old%d" % i for i in ids])}),
        uri,
        storage_options=storage_options,
    )


def payload(key: int, tag: str) -> bytes:
    """Key ``key``'s payload from writer ``tag``; every other one is large enough for a
    sidecar."""
    return f"{tag}{key}".encode() * (1 if key % 2 else 20_000)


def source(keys: list[int], tag: str) -> pa.Table:
    """Rows for ``keys`` whose payloads name the writer (``tag``)."""
    payloads = [payload(k, tag) for k in keys]
    return pa.table({"id": pa.array(keys, pa.int64()), "img": blob_array(payloads)})


def upsert(table, data: pa.Table):
    return (
        table.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(data)
    )


def contents(uri: str, storage_options: dict | None = None) -> list[dict]:
    """Every row, blobs read as bytes (all must be readable)."""
    table = open_table(uri, storage_options=storage_options)
    return table.to_arrow(blobs="bytes").to_pylist()


def assert_each_key_once(rows: list[dict], keys: list[int], tags: str) -> None:
    counts = Counter(r["id"] for r in rows)
    assert [k for k, n in counts.items() if n > 1] == []
    by_key = {r["id"]: r["img"] for r in rows}
    for key in keys:
        assert by_key[key] in [payload(key, tag) for tag in tags]


def race_round(uri: str, keys: list[int], storage_options: dict | None = None) -> list:
    """Two threads upserting the same new ``keys``: each opens the table (both read the same
    version), then both start together after a barrier. Their reports, or errors."""
    barrier = threading.Barrier(2)
    done: list = []

    def merge(tag: str) -> None:
        table = open_table(uri, storage_options=storage_options)
        data = source(keys, tag)
        barrier.wait()
        try:
            done.append(upsert(table, data))
        except Exception as exc:  # reported to the test thread
            done.append(exc)

    threads = [threading.Thread(target=merge, args=(tag,)) for tag in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return done


def race(uri: str, rounds: int, storage_options: dict | None = None) -> list:
    """``rounds`` rounds of :func:`race_round`, each on new keys, checked."""
    reports = []
    for r in range(rounds):
        keys = list(range(100 + r * KEYS, 100 + (r + 1) * KEYS))
        done = race_round(uri, keys, storage_options)
        assert [d for d in done if isinstance(d, Exception)] == []
        assert sorted(d.num_inserted_rows for d in done) == [0, KEYS]  # one inserted them ...
        assert sorted(d.num_updated_rows for d in done) == [0, KEYS]  # ... the other updated
        assert_each_key_once(contents(uri, storage_options), keys, "ab")
        reports.extend(done)
    return reports


def test_two_threads_upserting_the_same_new_keys_insert_each_once(table_uri):
    make(table_uri)
    reports = race(table_uri, rounds=4)
    assert max(r.attempts for r in reports) == 2  # the later one re-planned once
    rows = contents(table_uri)
    assert len(rows) == 10 + 4 * KEYS
    assert not os.listdir(os.path.join(table_uri, locks.LOCKS_DIR))  # every lock released


def test_two_merges_on_object_storage_insert_each_key_once(s3):
    uri = f"{s3.uri}/t"
    make(uri, s3.options)
    race(uri, rounds=2, storage_options=s3.options)
    assert [k for k in s3.objects() if "/locks/" in k] == []


def test_two_merges_on_azure_insert_each_key_once(azure):
    from blobhouse.io.objects import object_store

    uri = f"{azure.uri}/t"
    make(uri, azure.options)
    race(uri, rounds=2, storage_options=azure.options)
    listed = object_store(uri, azure.options).list(uri)
    assert [o.name for o in listed if o.name.startswith(locks.LOCKS_DIR)] == []


def _process_merge(uri: str, tag: str, keys: list[int], barrier, results) -> None:
    table = open_table(uri)
    data = source(keys, tag)
    barrier.wait()
    report = upsert(table, data)
    results.put((report.num_inserted_rows, report.num_updated_rows))


def test_two_processes_upserting_the_same_new_keys_insert_each_once(table_uri):
    make(table_uri)
    keys = list(range(100, 100 + KEYS))
    context = multiprocessing.get_context("spawn")  # no fork: Lance's threads already run here
    barrier, results = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_process_merge, args=(table_uri, tag, keys, barrier, results))
        for tag in "ab"
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in workers) == [(0, KEYS), (KEYS, 0)]
    assert_each_key_once(contents(table_uri), keys, "ab")


def test_keys_inserted_after_the_merge_read_its_version_become_updates(table_uri):
    make(table_uri)
    keys = list(range(100, 100 + KEYS))
    late = open_table(table_uri)  # reads the version before the other merge's
    first = upsert(open_table(table_uri), source(keys, "a"))
    assert (first.num_inserted_rows, first.num_updated_rows) == (KEYS, 0)

    report = upsert(late, source(keys, "b"))

    assert report.read_version == first.version  # planned again, on the latest version
    assert (report.attempts, report.num_inserted_rows, report.num_updated_rows) == (2, 0, KEYS)
    rows = contents(table_uri)
    assert_each_key_once(rows, keys, "b")  # the later merge's values won, as updates
    assert len(rows) == 10 + KEYS


def test_an_insert_only_merge_replanned_leaves_the_keys_it_lost(table_uri):
    make(table_uri)
    keys = list(range(100, 100 + KEYS))
    late = open_table(table_uri)
    upsert(open_table(table_uri), source(keys, "a"))

    report = late.merge_insert("id").when_not_matched_insert_all().execute(source(keys, "b"))

    assert (report.attempts, report.num_inserted_rows, report.num_updated_rows) == (2, 0, 0)
    assert_each_key_once(contents(table_uri), keys, "a")


def test_a_merge_out_of_retries_fails_naming_the_keys_and_commits_nothing(table_uri):
    make(table_uri)
    keys = list(range(100, 100 + KEYS))
    late = open_table(table_uri)
    first = upsert(open_table(table_uri), source(keys, "a"))
    before = tree(table_uri)

    merge = late.merge_insert("id").when_not_matched_insert_all().conflict_retries(0)
    with pytest.raises(ConcurrentCommitError) as failed:
        merge.execute(source([5, *keys], "b"))

    message = str(failed.value)
    assert table_uri in message and "['id']" in message and "{'id': 100}" in message
    assert failed.value.retryable
    assert open_table(table_uri).version == first.version
    assert tree(table_uri) == before  # its staged files are gone too


def _hold_and_die(uri: str) -> subprocess.Popen:
    """A process that takes the lock at ``uri`` and waits to be killed."""
    script = (
        "import sys, time\nfrom blobhouse.commit import locks\n"
        "with locks.held(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", script, uri], stdout=subprocess.PIPE, text=True, env=env
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_killed_holders_lock_blocks_merges_only_until_it_expires(table_uri):
    table = make(table_uri)
    uri = upsert_lock(table.location)
    holder = _hold_and_die(uri)
    holder.kill()
    holder.wait()
    assert locks.holder(uri)  # left behind

    done: list = []
    merge = threading.Thread(
        target=lambda: done.append(upsert(open_table(table_uri), source([100, 101], "a")))
    )
    merge.start()
    merge.join(1.0)
    assert merge.is_alive()  # the lock is fresh: the merge waits

    stale = time.time() - locks.EXPIRY_SECONDS - 1  # as if the expiry had passed
    os.utime(uri.removeprefix("file://"), (stale, stale))
    merge.join(5.0)
    assert not merge.is_alive()
    assert done[0].num_inserted_rows == 2
    assert locks.holder(uri) is None
    assert not [n for n in os.listdir(os.path.dirname(uri.removeprefix("file://")))]


def test_merges_that_insert_nothing_do_not_take_the_lock(table_uri):
    table = make(table_uri)
    lock_dir = os.path.join(table_uri, locks.LOCKS_DIR)
    # only updates: matched keys, or new keys a merge does not insert
    upsert(open_table(table_uri), source([1, 2], "a"))
    open_table(table_uri).merge_insert("id").when_matched_update_all().execute(
        source([3, 100], "b")
    )
    assert not os.path.exists(lock_dir)  # never created

    with locks.held(upsert_lock(table.location)):  # another merge holds it
        started = time.monotonic()
        report = upsert(open_table(table_uri), source([4, 5], "c"))
        assert report.num_updated_rows == 2
        open_table(table_uri).merge_insert("id").when_matched_update(["img"]).execute(
            source([6], "d")
        )
        assert time.monotonic() - started < 5  # neither waited for the lock

        inserting = threading.Thread(
            target=upsert, args=(open_table(table_uri), source([200], "e"))
        )
        inserting.start()
        inserting.join(0.5)
        assert inserting.is_alive()  # one that inserts does wait
    inserting.join(5)
    assert not inserting.is_alive()
    assert len(contents(table_uri)) == 11


def test_the_lock_admits_one_holder_at_a_time(tmp_path):
    uri = locks.lock_uri(str(tmp_path), "example")
    path = uri.removeprefix("file://")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as dead:  # a dead holder's lock: the waiters race to break it
        dead.write("dead")
    stale = time.time() - locks.EXPIRY_SECONDS - 1
    os.utime(path, (stale, stale))
    inside, most, entries = [0], [0], []
    guard = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            with locks.held(uri):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                entries.append(1)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert (most[0], len(entries)) == (1, 60)
    assert locks.holder(uri) is None


def test_a_waiter_gives_up_on_a_live_holder_after_its_wait(tmp_path):
    uri = locks.lock_uri(str(tmp_path), "example")
    with locks.held(uri):
        waiter = locks.held(uri, wait=0.3)
        with pytest.raises(locks.LockTimeoutError, match="stayed held"):
            waiter.__enter__()
    assert locks.holder(uri) is None
