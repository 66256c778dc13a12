"""Store-first writes (blobhouse.write.store_first): payloads into the store, then rows that
reference them, one transaction; what was stored is recorded next to the store until the rows'
commit puts it in the index, and never outlives the write."""

from __future__ import annotations

import os
from datetime import timedelta

import pyarrow as pa
import pytest

from blobhouse import open_table
from blobhouse.commit import leases
from blobhouse.commit.transaction import Transaction
from blobhouse.io.objects import uri_to_path
from blobhouse.layout import STORED, TableLocation
from blobhouse.lerobot import ingest_lerobot
from blobhouse.lerobot.sample import write_sample_dataset
from blobhouse.store.index import open_index
from blobhouse.store.packs import StoredPayload
from blobhouse.store.records import read_records, write_record
from blobhouse.write.store_first import run_store_first
from tests.helpers import aged


def records(table_uri: str) -> list[str]:
    folder = os.path.join(uri_to_path(table_uri), STORED)
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "robot"
    return write_sample_dataset(root, episodes=2, frames=4, size=(16, 16))


def test_an_import_leaves_no_record_and_indexes_what_it_stored(dataset, tmp_path):
    uri = str(tmp_path / "t")
    done = ingest_lerobot(dataset, uri)
    assert records(uri) == []
    assert open_index(uri, None).count_rows() >= done.video_files


def test_a_failed_rows_step_removes_the_packs_and_the_records(tmp_path):
    uri = str(tmp_path / "t")
    txn = Transaction.start(TableLocation.of(uri), None, kind="write")
    payload = StoredPayload(b"\x01" * 32, f"packs/{txn.name_prefix}{'0' * 32}.pack", 0, 1)

    def rows(_result, _begin):
        assert read_records(uri, txn.id) == [payload]  # recorded before the rows are written
        raise RuntimeError("the rows' step failed")

    with pytest.raises(RuntimeError, match="rows' step failed"):
        run_store_first(txn, lambda: ("stored", [payload]), rows)
    assert records(uri) == []
    assert read_records(uri, txn.id) == []


def test_the_rows_commit_records_what_the_store_step_stored(tmp_path):
    uri = str(tmp_path / "t")
    txn = Transaction.start(TableLocation.of(uri), None, kind="write")
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
    payload = StoredPayload(b"\x02" * 32, f"packs/{txn.name_prefix}{'0' * 32}.pack", 0, 0)

    def rows(_result, begin):
        return begin(batch.schema, batches=[batch]).run().snapshot

    _, snapshot = run_store_first(txn, lambda: (None, [payload]), rows)
    assert snapshot.count_rows() == 2
    assert records(uri) == []
    index = open_index(uri, None).to_table(columns=["blake3"]).column("blake3").to_pylist()
    assert payload.digest in index


def test_gc_sweeps_the_records_of_a_write_that_died_and_keeps_a_live_ones(tmp_path, dataset):
    uri = str(tmp_path / "t")
    ingest_lerobot(dataset, uri)
    dead = Transaction.start(TableLocation.of(uri), None, kind="write")
    live = Transaction.start(TableLocation.of(uri), None, kind="write")
    stored = [StoredPayload(b"\x03" * 32, "packs/x.pack", 0, 1)]
    write_record(uri, dead.id, stored)
    with leases.held(uri, live.name_prefix):
        write_record(uri, live.id, stored)
        aged(os.path.join(uri, STORED), hours=48)
        open_table(uri).gc(grace=timedelta(0))
        assert read_records(uri, dead.id) == []
        assert read_records(uri, live.id) == stored


def test_a_damaged_record_leaves_the_commit_standing_with_a_warning(tmp_path):
    """The rows committed: a record that cannot be read costs dedup (the index lags), never the
    commit, and the records still go."""
    from blobhouse.store.records import records_folder

    uri = str(tmp_path / "t")
    txn = Transaction.start(TableLocation.of(uri), None, kind="write")
    batch = pa.record_batch({"id": pa.array([1], pa.int64())})

    def rows(_result, begin):
        folder = uri_to_path(records_folder(uri, txn.id))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "0" * 32 + ".arrow"), "wb") as damaged:
            damaged.write(b"not an arrow file")
        return begin(batch.schema, batches=[batch]).run().snapshot

    with pytest.warns(UserWarning, match="store index .* was not updated"):
        _, snapshot = run_store_first(txn, lambda: (None, ()), rows)
    assert snapshot.count_rows() == 1
    assert records(uri) == []
