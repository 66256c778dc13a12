"""gc never breaks a write in flight, whatever its grace (issue 38): files Lance names itself
(its temporary files, a schema change's data files) are kept while a write that started
before them runs, and a write that loses anyway fails with StaleWriteError."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import lance
import pyarrow as pa

from blobhouse import blob_array, open_table, write_table
from blobhouse.commit import leases
from blobhouse.commit.runners import Here
from blobhouse.errors import ConcurrentCommitError, StaleWriteError, StoreRaceError
from blobhouse.layout import LEASES_DIR
from blobhouse.maintenance.garbage_collection import gc

NO_GRACE = timedelta(0)


def _table(uri: str, rows: int = 20):
    data = {"id": list(range(rows)), "img": blob_array([os.urandom(20_000) for _ in range(rows)])}
    return write_table(pa.table(data), uri)


def _age_leases(uri: str) -> None:
    """Let the leases of the writes so far expire (as 30 s without a touch would)."""
    folder = os.path.join(uri, LEASES_DIR)
    for name in os.listdir(folder):
        os.utime(os.path.join(folder, name), (1, 1))


def test_a_file_lance_names_is_kept_while_a_write_that_started_before_it_runs(table_uri):
    table = _table(table_uri)
    _age_leases(table_uri)
    temporary = os.path.join(table_uri, "data", ".tmpLance01")
    with leases.held(table.location.root, "write-0123456789ab-"):
        with open(temporary, "wb") as f:  # what Lance's local writer renames when it is done
            f.write(b"x" * 100)
        report = table.gc(grace=NO_GRACE)
        assert os.path.exists(temporary)
        assert report["kept_leased_files"] == 1
    _age_leases(table_uri)
    report = open_table(table_uri).gc(grace=NO_GRACE)
    assert not os.path.exists(temporary)
    assert report["removed_by_sweep"]["files"] == 1


def test_a_leftover_older_than_every_running_write_is_swept(table_uri):
    table = _table(table_uri)
    leftover = os.path.join(table_uri, "data", ".tmpOld")
    with open(leftover, "wb") as f:
        f.write(b"x")
    os.utime(leftover, (1, 1))  # long before any running write started
    with leases.held(table.location.root, "write-0123456789ab-"):
        table.gc(grace=NO_GRACE)
        assert not os.path.exists(leftover)


def test_a_store_race_is_a_stale_write():
    assert issubclass(StoreRaceError, StaleWriteError)


def test_gc_with_no_grace_beside_appends_updates_and_compactions(table_uri):
    """gc(grace=0) in a loop beside writers: every writer either commits or fails with a
    documented error, and every committed row reads back."""
    _table(table_uri)
    stop = threading.Event()
    gc_errors: list[BaseException] = []

    def collect() -> None:
        while not stop.is_set():
            try:
                open_table(table_uri).gc(grace=NO_GRACE)
            except BaseException as exc:
                gc_errors.append(exc)

    thread = threading.Thread(target=collect)
    thread.start()
    failures, committed = [], {}
    try:
        for i in range(12):
            payload = os.urandom(20_000)
            try:
                table = write_table(
                    pa.table({"id": [100 + i], "img": blob_array([payload])}),
                    table_uri,
                    mode="append",
                )
                committed[100 + i] = payload
                table.update({"id": "id + 0"}, where=f"id = {i}")
                table.add_columns({f"c{i}": "id * 2"})
                open_table(table_uri).compact()
            except (StaleWriteError, ConcurrentCommitError):
                pass
            except Exception as exc:  # a raw Lance error: what this test is about
                failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    assert not gc_errors, gc_errors
    table = open_table(table_uri)
    ids = table.to_arrow(columns=["id"]).column("id").to_pylist()
    rows = [ids.index(i) for i in committed]
    assert table.read_blobs("img", rows) == list(committed.values())
    assert not [p for p in table.verify(deep=True)["problems"] if p["rows"]]


def test_a_version_tagged_while_gc_marks_keeps_its_files(tmp_path):
    """gc marks the versions Lance's cleanup is to leave, then runs the cleanup. A version
    tagged in between is kept by Lance: gc marks it too, so its files are not swept and the
    tag reads every row. (The mark's runner, Spark's door, tags the version mid-run.)"""
    uri = str(tmp_path / "t")
    first = [b"first-%d" % i * 3000 for i in range(4)]
    write_table(pa.table({"id": range(4), "b": blob_array(first)}), uri)
    write_table(pa.table({"id": [9], "b": blob_array([b"second" * 3000])}), uri, mode="overwrite")

    class TagThenMark(Here):
        def map(self, *args, **kwargs):
            if "v1" not in lance.dataset(uri).tags.list():
                lance.dataset(uri).tags.create("v1", 1)
            return super().map(*args, **kwargs)

    report = gc(
        open_table(uri).snapshot, retain_versions=1, grace=timedelta(0), runner=TagThenMark()
    )
    assert report["removed_versions"] == [] and report["retained_versions"] == [1, 2]
    tagged = open_table(uri, version="v1")
    assert tagged.read_blobs("b", range(4)) == first
    assert tagged.verify(deep=True)["problems"] == []
