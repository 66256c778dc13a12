"""A writer killed with SIGKILL at random points, again and again: the table always opens at a
committed version, every row of every version reads back exactly, and what the killed writes left
behind is only orphans that gc removes once they are older than the grace period."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa

from blobhouse import blob_array, open_table, write_table
from blobhouse.layout import LEASES_DIR
from tests.helpers import aged, worker_script
from tests.workers.crash_worker import payload

KILLS = int(os.environ.get("BLOBHOUSE_CRASH_KILLS", "8"))
SEED = int(os.environ.get("BLOBHOUSE_CRASH_SEED", "20261122"))


def assert_latest_reads_back(uri: str, storage_options: dict | None = None) -> tuple[int, int]:
    """The latest version carries exactly its payloads (blobhouse and stock pylance); with
    appends only it holds every row ever committed. Returns its version and row count."""
    table = open_table(uri, storage_options=storage_options)
    got = table.to_arrow(blobs="bytes").to_pylist()
    assert all(r["b"] == payload(r["id"]) for r in got), f"version {table.version}"
    dataset = lance.dataset(uri, version=table.version, storage_options=table.storage_options)
    ids = dataset.to_table(columns=["id"]).column("id").to_pylist()
    stock = dataset.read_blobs("b", indices=list(range(len(ids))), preserve_order=True)
    assert [b for _, b in stock] == [payload(i) for i in ids], f"stock, version {table.version}"
    assert sorted(ids) == sorted(r["id"] for r in got)
    return table.version, len(got)


def test_writers_killed_at_random_points_lose_nothing(table_uri):
    rng = random.Random(SEED)
    write_table(
        pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([payload(0)])}), table_uri
    )
    worker = worker_script("crash_worker.py")
    checked, rows = 1, 1  # version, rows
    for kill in range(KILLS):
        process = subprocess.Popen(
            [sys.executable, worker, table_uri, str(kill + 1)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.8, 2.0))  # imports take ~0.5 s: kills land in writes
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        version, now = assert_latest_reads_back(table_uri)
        assert version >= checked and now >= rows  # appends only: nothing committed is lost
        checked, rows = version, now
    assert_only_orphans_left(table_uri, (checked, rows))


def assert_only_orphans_left(uri: str, latest: tuple[int, int]) -> None:
    """After the kills: every reference of every retained version resolves to the bytes it was
    written with, and what the killed writes left (files, leases) is only orphans that gc
    removes once past the grace period; the latest version still reads back."""
    assert open_table(uri).verify(deep=True)["problems"] == []
    aged(uri, hours=48)
    assert open_table(uri).gc(retain_versions=3)["kept_young_files"] == 0
    aged(uri, hours=48)
    open_table(uri).gc(grace=timedelta(hours=1))
    assert open_table(uri).stats()["orphan_files"] == 0
    assert not list((Path(uri) / LEASES_DIR).glob("*")), "leases of killed writes stay"
    assert assert_latest_reads_back(uri) == latest
