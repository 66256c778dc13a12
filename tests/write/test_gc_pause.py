"""Writes pause Python's cyclic collector while they place a batch (blobhouse.gc_pause): no
collection walks the process's objects per few hundred payloads, and the collector is as the
user left it after every write, failed ones and concurrent ones included."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import ExternalBlobError
from blobhouse.gc_pause import gc_paused

ROWS = 20_000


def _made(fail_at: int | None) -> list[pa.RecordBatch]:
    """Batches of 2,000 unique 512-byte payloads (from row ``fail_at`` on, each batch's last
    row names a file outside every allowed base: refused while the batch is placed)."""
    rng = np.random.default_rng(7)
    batches = []
    for start in range(0, ROWS, 2_000):
        payloads: list = [rng.bytes(512) for _ in range(2_000)]
        if fail_at is not None and start >= fail_at:
            payloads[-1] = "file:///etc/passwd"
        ids = pa.array(range(start, start + 2_000), pa.int64())
        batches.append(pa.record_batch({"id": ids, "b": blob_array(payloads)}))
    return batches


def _batches(seen: list[bool], *, fail_at: int | None = None) -> Iterator[pa.RecordBatch]:
    """:func:`_made`'s batches, made before the write asks for the first (their Blob objects
    are the user's); ``seen`` gets whether the collector ran when each was asked for."""
    made = _made(fail_at)
    return _handed(made, seen)


def _handed(batches: list[pa.RecordBatch], seen: list[bool]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        seen.append(gc.isenabled())
        yield batch


@contextmanager
def collections() -> Iterator[list[int]]:
    """The generation of every collection that runs in the ``with`` block."""
    runs: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield runs
    finally:
        gc.callbacks.remove(count)


def test_a_write_of_small_payloads_collects_between_batches_only(tmp_path):
    # placing 2,000 payloads makes thousands of objects (one young collection per 700):
    # without the pause a write of 20,000 ran ~140 collections, 3 of them of the whole process
    seen: list[bool] = []
    batches = _batches(seen)
    gc.collect()  # what earlier tests left is not this write's to collect
    with collections() as runs:
        write_table(batches, tmp_path / "t", blob_columns=["b"])
    assert len(runs) <= 2 * len(seen), runs
    assert all(seen)  # the user's iterator ran with the collector on
    assert gc.isenabled()
    assert open_table(tmp_path / "t").count_rows() == ROWS


def test_the_collector_runs_again_after_a_write_that_failed(tmp_path):
    seen: list[bool] = []
    with pytest.raises(ExternalBlobError, match="row 5999"):
        write_table(_batches(seen, fail_at=4_000), tmp_path / "t", blob_columns=["b"])
    assert gc.isenabled()
    assert seen == [True] * 3
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").rglob("*.lance"))


def test_a_collector_the_user_disabled_stays_disabled(tmp_path):
    gc.disable()
    try:
        write_table(_batches([]), tmp_path / "t", blob_columns=["b"])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_writes_in_threads_leave_the_collector_on(tmp_path):
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            write_table(_batches([]), tmp_path / name, blob_columns=["b"], dedup="content")
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert gc.isenabled()
    assert [open_table(tmp_path / f"t{i}").count_rows() for i in range(3)] == [ROWS] * 3


def test_pauses_nest_and_a_forked_child_collects():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
        pid = os.fork()
        if pid == 0:  # the child: no thread of its own paused it
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert gc.isenabled()
