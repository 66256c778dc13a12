"""Writers appending to one table at the same time from separate processes, alone and beside
compaction, gc and deletes running in processes of their own: every write a writer reports
committed is in the table exactly once and reads back exactly (blobhouse and stock pylance), a
write that fails leaves nothing visible and names its cause, deep verify is clean, and gc past
the grace period leaves no orphan. Workers: ``tests/workers/concurrent_writer_worker.py``.

CI runs a bounded, seeded sample; a longer run is a few environment variables away (see
docs/reliability.md). Run with ``-s`` to see the counts of each run.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.properties import TableProperties
from tests.helpers import aged, worker_script
from tests.workers.concurrent_writer_worker import PLACEMENT, deletable, payload

WRITERS = int(os.environ.get("BLOBHOUSE_CONCURRENCY_WRITERS", "4"))
WRITES = int(os.environ.get("BLOBHOUSE_CONCURRENCY_WRITES", "12"))  # per writer
SEED = int(os.environ.get("BLOBHOUSE_CONCURRENCY_SEED", "20261123"))
# seconds, maintenance gc; writes may take longer (Lance's commit backs off under contention:
# writes of 1.5 s at CI sizes, of 3-16 s in longer runs): their leases keep their files
GRACE = float(os.environ.get("BLOBHOUSE_CONCURRENCY_GRACE", "5"))
RETAIN = int(os.environ.get("BLOBHOUSE_CONCURRENCY_RETAIN", "3"))  # versions, maintenance gc
# seconds a version is kept (besides the last RETAIN); 0: by count only, which removes versions
# that running writes and deletes read (writes then fail with StaleWriteError and are retried)
VERSION_GRACE = float(os.environ.get("BLOBHOUSE_CONCURRENCY_VERSION_GRACE", str(GRACE)))
VERSIONS_READ = int(os.environ.get("BLOBHOUSE_CONCURRENCY_VERSIONS_READ", "6"))  # test 2
WORKER = worker_script("concurrent_writer_worker.py")


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def run_writers(
    uri: str, writes: int = WRITES, dedup: str | None = None, beside: tuple[str, ...] = ()
) -> tuple[list[dict], list[subprocess.Popen]]:
    """WRITERS writer processes and the ``beside`` roles (maintain, delete), started at the same
    instant once all are imported; the writers' results, the other processes (still running)."""
    go, stop = f"{uri}.go", f"{uri}.stop"
    extra = [dedup] if dedup else []
    writers = [
        start(uri, str(k), str(writes), str(SEED), go, *extra) for k in range(1, WRITERS + 1)
    ]
    roles = {
        "maintain": ("maintain", uri, stop, str(GRACE), str(RETAIN), str(VERSION_GRACE), go),
        "delete": ("delete", uri, stop, go),
    }
    others = [start(*roles[role]) for role in beside]
    names = [str(k) for k in range(1, WRITERS + 1)] + list(beside)
    deadline = time.monotonic() + 120
    while not all(os.path.exists(f"{go}.{name}.ready") for name in names):
        assert all(p.poll() is None for p in writers + others), "a worker died before it started"
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.02)
    Path(go).touch()
    try:
        return [finish(w) for w in writers], others
    finally:
        Path(stop).touch()


def expand(writes: list[list[int]]) -> set[int]:
    return {i for first, count in writes for i in range(first, first + count)}


def tally(results: list[dict]) -> dict:
    """Counts over every writer; checks each writer's own accounts."""
    for r in results:
        assert r["commits"] + r["failures"] == r["writes"], r
        assert len(r["committed"]) == r["commits"] and len(r["failed"]) == r["failures"]
    failed = [f for r in results for f in r["failed"]]
    return {
        "writes": sum(r["writes"] for r in results),
        "commits": sum(r["commits"] for r in results),
        "failures": len(failed),
        "retries": sum(r["retries"] for r in results),
        "retried": dict(sum((Counter(r["retried"]) for r in results), Counter())),
        "slowest_write_seconds": max(r["slowest_write_seconds"] for r in results),
        "property_changes": sum(r["property_changes"] for r in results),
        "committed": expand([w for r in results for w in r["committed"]]),
        "failed_ids": expand([f["ids"] for f in failed]),
        "errors": [f"{f['error']}: {f['message']}" for f in failed],
    }


def unclear(errors: list[str]) -> list[str]:
    """Errors that are not blobhouse's own (which name what happened and what to do)."""
    return [e for e in errors if not e.startswith("blobhouse.")]


def read_back(uri: str, version: int | None = None) -> list[int]:
    """The ids of a version, each row's bytes checked through blobhouse and stock pylance; no
    id twice."""
    table = open_table(uri, version)
    got = table.to_arrow(blobs="bytes").to_pylist()
    wrong = [r["id"] for r in got if r["b"] != payload(r["id"])]
    assert not wrong, f"version {table.version}: wrong bytes for ids {wrong[:10]}"
    dataset = lance.dataset(uri, version=table.version)
    ids = dataset.to_table(columns=["id"]).column("id").to_pylist()
    stock = dataset.read_blobs("b", indices=list(range(len(ids))), preserve_order=True)
    bad = [i for i, (_, b) in zip(ids, stock, strict=True) if b != payload(i)]
    assert not bad, f"version {table.version}: stock pylance reads wrong bytes for ids {bad[:10]}"
    assert sorted(ids) == sorted(r["id"] for r in got)
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not twice, f"version {table.version}: ids {twice[:10]} are in the table twice"
    return ids


def check_rows(ids: list[int], counts: dict, may_be_deleted: bool = False) -> None:
    present = set(ids)
    lost = {i for i in counts["committed"] - present if not (may_be_deleted and deletable(i))}
    assert not lost, f"committed ids lost: {sorted(lost)[:10]}"
    assert not present & counts["failed_ids"], "a failed write is visible"
    assert present <= counts["committed"], (
        f"ids nobody wrote: {sorted(present - counts['committed'])}"
    )


def create(uri: str, dedup: str = "global") -> None:
    """The table, with id 0 (``dedup="global"``: its store is registered already)."""
    data = pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([payload(0)])})
    write_table(data, uri, dedup=dedup, placement=PLACEMENT)


def report(name: str, figures: dict) -> None:
    """Print a run's counts (``-s`` shows them); also append them as a JSON line to the file
    ``BLOBHOUSE_CONCURRENCY_REPORT`` names, if set."""
    shown = {k: v for k, v in figures.items() if k not in ("committed", "failed_ids")}
    print(f"\n{name}: {json.dumps(shown)}")
    if os.environ.get("BLOBHOUSE_CONCURRENCY_REPORT"):
        with open(os.environ["BLOBHOUSE_CONCURRENCY_REPORT"], "a") as f:
            f.write(json.dumps({"test": name, "seed": SEED, **shown}) + "\n")


def test_writers_appending_at_the_same_time_lose_nothing(table_uri):
    started = time.monotonic()
    create(table_uri)
    results, _ = run_writers(table_uri)
    counts = tally(results)
    counts["committed"].add(0)
    ids = read_back(table_uri)
    check_rows(ids, counts)
    assert len(ids) == len(counts["committed"])
    # appends commute: Lance rebases an append on the appends that committed first
    assert not unclear(counts["errors"]), counts["errors"]
    assert counts["commits"] == counts["writes"] - counts["failures"]
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    versions = len(open_table(table_uri).versions())
    # one version per write and per change of the table's dedup mode, none lost or extra
    modes = [
        TableProperties.of(lance.dataset(table_uri, version=v["version"])).dedup
        for v in open_table(table_uri).versions()
    ]
    changes = sum(a != b for a, b in itertools.pairwise(modes))
    assert changes <= counts["property_changes"]  # each writer's change, once it committed
    assert versions == counts["commits"] + changes + 1
    report("writers", counts | {"rows": len(ids), "seconds": time.monotonic() - started})


def test_writers_beside_compaction_gc_and_deletes_lose_nothing(table_uri):
    started = time.monotonic()
    create(table_uri)
    results, (maintenance, deleter) = run_writers(
        table_uri, writes=3 * WRITES, beside=("maintain", "delete")
    )
    counts = tally(results)
    maintained, deleted = finish(maintenance), finish(deleter)
    counts["committed"].add(0)
    figures = counts | maintained | deleted
    figures["seconds"] = time.monotonic() - started
    report("writers + maintenance", figures)
    why = f" (slowest write {counts['slowest_write_seconds']} s, gc grace {GRACE} s)"
    assert not unclear(counts["errors"]), counts["errors"]
    assert maintained["gc_failures"] == [], f"{maintained['gc_failures']}{why}"
    # a compaction a delete preempted fails cleanly: Lance's retryable conflict, nothing left
    assert all(c["clean"] for c in maintained["conflicts"]), maintained["conflicts"]
    assert all(c["retryable"] for c in maintained["conflicts"]), f"{maintained['conflicts']}{why}"
    assert deleted["failed"] == [], f"{deleted['failed']}{why}"
    assert maintained["gc_passes"] >= 1 and deleted["deletes"] >= 1  # they ran beside writers
    table = open_table(table_uri)
    versions = [v["version"] for v in table.versions()]
    sample = random.Random(SEED).sample(versions, min(len(versions), VERSIONS_READ))
    try:
        for version in sample:  # deep verify below checks every retained version
            read_back(table_uri, version)
        ids = read_back(table_uri)
        check_rows(ids, counts, may_be_deleted=True)
    except (AssertionError, OSError, ValueError) as exc:
        raise AssertionError(f"{exc}{why}") from exc
    started_verify = time.monotonic()
    assert table.verify(deep=True)["problems"] == []
    print(f"verify: {time.monotonic() - started_verify:.1f} s, {len(versions)} versions")
    # quiet now: past the grace period, gc leaves no orphan (packs: retired, then reaped)
    for retain in (1, None, None):
        aged(table_uri, hours=48)
        open_table(table_uri).gc(retain_versions=retain, grace=timedelta(hours=1))
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert read_back(table_uri) == ids
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_a_store_registered_by_another_process_meanwhile_is_used(table_uri):
    """Two writers open a table without a store; both go to register it (their first global
    write), one commits first: the other uses that store (it used to fail with Lance's raw
    'Incompatible transaction: UpdateBases' OSError)."""
    from blobhouse.layout import TableLocation
    from blobhouse.store.packs import store_base_id
    from blobhouse.write.prepare import ensure_store

    create(table_uri, dedup="content")
    first, second = lance.dataset(table_uri), lance.dataset(table_uri)  # both read the table
    first, base_id = ensure_store(first, TableLocation(table_uri))
    second, other = ensure_store(second, TableLocation(table_uri))
    assert other == base_id == store_base_id(lance.dataset(table_uri))
    assert list(lance.dataset(table_uri).base_paths()) == [base_id]  # registered once


def test_writers_registering_the_store_at_the_same_time_all_commit(table_uri):
    create(table_uri, dedup="content")
    open_table(table_uri).set_properties(dedup="global")  # no store yet: each writer's first
    counts = tally(run_writers(table_uri, writes=2, dedup="global")[0])  # write registers it
    report("writers registering the store", counts)
    counts["committed"].add(0)
    check_rows(read_back(table_uri), counts)
    assert counts["failures"] == 0, counts["errors"]
    assert len(lance.dataset(table_uri).base_paths()) == 1


def stage(uri: str, ids: list[int], dedup: str):
    """A write of ``ids`` planned and staged, not committed yet."""
    from blobhouse.options import WriteOptions
    from blobhouse.write import begin_write

    data = pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array([payload(i) for i in ids])})
    write = begin_write(
        uri,
        data.schema,
        WriteOptions(dedup=dedup, placement=PLACEMENT),
        mode="append",
        in_tasks=True,
    )
    return write, write.plan.write(data.to_batches())


def staged_files(uri: str, prefix: str) -> list[Path]:
    return [p for p in Path(uri).rglob(f"{prefix}*") if p.is_file()]


def commit_or_fail_clearly(uri: str, write, written, ids: list[int], before: list[int]) -> None:
    """The write commits and its rows read back, or it fails with a blobhouse error and nothing
    of it is visible or left behind."""
    from blobhouse.errors import BlobhouseError

    try:
        write.commit(written)
    except BlobhouseError:
        assert sorted(read_back(uri)) == sorted(before)
        assert staged_files(uri, write.transaction.name_prefix) == []
    else:
        assert sorted(read_back(uri)) == sorted(before + ids)


def test_a_write_whose_read_version_gc_removed_meanwhile_fails_clearly(table_uri):
    """gc (retain_versions) removes the version a running write started from: the write fails
    with a clear, retryable error (it used to be Lance's raw 'manifest not found')."""
    create(table_uri)
    write, written = stage(table_uri, [1, 3], "global")
    for i in (2, 4):  # other writers commit, then gc keeps only the latest version
        more = pa.table({"id": pa.array([i], pa.int64()), "b": blob_array([payload(i)])})
        write_table(more, table_uri, mode="append")
    open_table(table_uri).gc(retain_versions=1, grace=timedelta(seconds=GRACE))
    commit_or_fail_clearly(table_uri, write, written, [1, 3], [0, 2, 4])


def test_a_stalled_write_fails_clearly(table_uri):
    """A write that stopped touching its lease (stalled for an hour) has its staged files swept
    once they are older than the grace: it then fails clearly instead of committing references
    to missing files."""
    create(table_uri, dedup="content")
    write, written = stage(table_uri, [1, 3, 5], "content")
    aged(table_uri, hours=1)  # the write has been running for an hour
    assert open_table(table_uri).gc(grace=timedelta(minutes=30))["removed_files"] >= 1
    commit_or_fail_clearly(table_uri, write, written, [1, 3, 5], [0])


def test_a_commit_retrying_longer_than_the_grace_keeps_its_files(table_uri, monkeypatch):
    """The files exist when the write checks them, then Lance's commit retries for longer than
    the grace while gc runs (found by the aggressive run, seed 9: a 9 s commit, a 2 s grace):
    the write's lease keeps its files, and what lands reads back."""
    from lance import LanceDataset

    create(table_uri, dedup="content")
    write, written = stage(table_uri, [1, 3, 5], "content")
    commit = LanceDataset.__dict__["commit"]

    def commit_while_gc_runs(*args, **kwargs):
        monkeypatch.setattr(LanceDataset, "commit", commit)
        aged(table_uri, hours=1, spare_leases=True)  # retrying for an hour, touching its lease
        assert open_table(table_uri).gc(grace=timedelta(minutes=30))["removed_files"] == 0
        return commit.__func__(*args, **kwargs)

    monkeypatch.setattr(LanceDataset, "commit", staticmethod(commit_while_gc_runs))
    commit_or_fail_clearly(table_uri, write, written, [1, 3, 5], [0])


def test_property_changes_at_the_same_time_all_commit(table_uri):
    """Lance refuses a manifest update beside another outright (not retryable); a property
    change plans again on the latest version, so each of several at once commits, and the
    changes to different properties all stand."""
    create(table_uri, dedup="content")
    changes = [{"max_rows_per_file": 1000 + i} for i in range(4)]
    changes += [{"dedup": "ref_id"}, {"max_bytes_per_file": 64 * 2**20}]
    start = threading.Barrier(len(changes))

    def change(properties: dict) -> None:
        table = open_table(table_uri)
        start.wait()
        table.set_properties(**properties)

    with ThreadPoolExecutor(len(changes)) as pool:
        for done in [pool.submit(change, c) for c in changes]:
            done.result()
    properties = TableProperties.of(lance.dataset(table_uri))
    assert properties.dedup == "ref_id"
    assert properties.max_bytes_per_file == 64 * 2**20
    assert properties.max_rows_per_file in {1000 + i for i in range(4)}
    versions = lance.dataset(table_uri).versions()
    assert len(versions) == 1 + len(changes)


def test_a_spark_style_append_that_an_overwrite_beat_fails_clearly(table_uri):
    """Tasks staged an append; an overwrite commits first: the append's commit (Spark's, on
    the driver) is refused as a blobhouse ConcurrentCommitError saying planning it again cannot
    help (it was Lance's raw CommitConflictError), and its files are removed."""
    from blobhouse.errors import ConcurrentCommitError

    create(table_uri, dedup="content")
    write, written = stage(table_uri, [1, 3], "content")
    write_table(
        pa.table({"id": pa.array([7], pa.int64()), "b": blob_array([payload(7)])}),
        table_uri,
        mode="overwrite",
    )
    with pytest.raises(ConcurrentCommitError, match="incompatible with this change") as raised:
        write.ending(lambda: write.commit(written))
    assert not raised.value.retryable
    assert read_back(table_uri) == [7]
    assert staged_files(table_uri, write.transaction.name_prefix) == []
