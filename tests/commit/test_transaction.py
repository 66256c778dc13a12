"""The commit layer driven directly (blobhouse.commit.transaction): what an abort removes, when a
transaction's lease is held, and commits planned on a version another writer has moved on from.
Real pylance datasets in tmp_path; every change stages and commits as blobhouse's own do."""

from __future__ import annotations

import os
import time
import uuid

import lance
import pyarrow as pa
import pytest
from lance import LanceOperation

from blobhouse import open_table, write_table
from blobhouse.commit import leases
from blobhouse.commit.leases import live_prefixes
from blobhouse.commit.transaction import (
    Transaction,
    committed_deletions,
    lance_commit,
    retrying,
    stage_deletion,
)
from blobhouse.errors import ConcurrentCommitError
from blobhouse.files.session import BlobSession, WrittenFile
from blobhouse.layout import LEASES_DIR
from tests.helpers import tree


def stage(txn: Transaction, ids: list[int]) -> WrittenFile:
    """A data file of rows ``ids`` staged under the transaction's prefix, as writes stage them."""
    session = BlobSession(f"{txn.location.data_dir}/{txn.name_prefix}{uuid.uuid4().hex}.lance")
    return session.write_data_file(pa.table({"id": pa.array(ids, pa.int64())}))


def append(txn: Transaction, written: WrittenFile):
    """Commit ``written`` as an append on the transaction's read version."""
    return txn.commit([written], lambda: LanceOperation.Append([written.fragment([0])]))


def ids(uri: str) -> list[int]:
    return sorted(open_table(uri).to_arrow().column("id").to_pylist())


def staged_by(txn: Transaction) -> set[str]:
    """The files under the table root named with the transaction's prefix (its lease too)."""
    root = txn.location.root
    return {p for p in tree(root) if os.path.basename(p).startswith(txn.name_prefix)}


@pytest.fixture
def table(table_uri):
    return write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64())}), table_uri)


def test_abort_removes_exactly_what_was_staged_under_its_prefix(table):
    before = tree(table.location.root)
    other = Transaction.start(table.location, table.version, kind="write")
    with other.lease():  # another write in flight: its files and lease must stay
        stage(other, [7])
    theirs = tree(table.location.root) - before
    txn = Transaction.start(table.location, table.version, kind="write")
    with txn.lease():
        listed = stage(txn, [4])
        stage(txn, [5])  # staged but not handed to abort (a task that died): the sweep finds it
    ours = staged_by(txn)
    assert len(ours) == 3 and f"{LEASES_DIR}/{txn.name_prefix}" in ours  # 2 files, 1 lease
    assert not ours & theirs

    txn.abort([listed])
    assert tree(table.location.root) == before | theirs
    assert ids(table.uri) == [1, 2, 3]


def test_the_lease_is_held_from_staging_through_the_commit_and_not_after(table, monkeypatch):
    monkeypatch.setattr(leases, "REFRESH_SECONDS", 1.0)  # a touch a second: a short wait below
    root = table.location.root
    txn = Transaction.start(table.location, table.version, kind="write")
    assert txn.name_prefix not in live_prefixes(root, since=0)
    with txn.lease():
        written = stage(txn, [4])
        assert txn.name_prefix in live_prefixes(root, since=0)
    during = []

    def commit():
        during.append(txn.name_prefix in live_prefixes(root, since=time.time() - 1))
        operation = lambda: LanceOperation.Append([written.fragment([0])])  # noqa: E731
        return lance_commit(txn.location, operation, txn.read_version)

    assert txn.commit([written], commit=commit).version == table.version + 1
    assert during == [True]  # held, and just touched, while Lance commits
    lease = os.path.join(root, LEASES_DIR, txn.name_prefix)
    touched = os.stat(lease).st_mtime
    time.sleep(leases.REFRESH_SECONDS * 1.5)
    assert os.stat(lease).st_mtime == touched  # nobody touches it any more: it expires
    assert ids(table.uri) == [1, 2, 3, 4]

    aborted = Transaction.start(table.location, open_table(table.uri).version)
    with aborted.lease():
        stage(aborted, [5])
    aborted.abort()
    assert aborted.name_prefix not in live_prefixes(root, since=0)  # an abort releases it


def test_an_append_on_a_version_another_writer_moved_on_from_lands_beside_it(table):
    txn = Transaction.start(table.location, table.version, kind="write")
    with txn.lease():
        written = stage(txn, [4])
    write_table(pa.table({"id": pa.array([9], pa.int64())}), table.uri, mode="append")
    committed = append(txn, written)  # Lance rebases an append over a concurrent append
    assert committed.version == table.version + 2
    assert ids(table.uri) == [1, 2, 3, 4, 9]


def test_a_commit_a_concurrent_overwrite_preempted_is_a_conflict_and_leaves_nothing(table):
    txn = Transaction.start(table.location, table.version, kind="write")
    with txn.lease():
        written = stage(txn, [4])
    write_table(pa.table({"id": pa.array([8], pa.int64())}), table.uri, mode="overwrite")
    attempts = []

    def attempt(n: int):
        attempts.append(n)
        return append(txn, written)  # always on the version it read

    with pytest.raises(ConcurrentCommitError, match="incompatible") as failed:
        retrying(attempt)
    assert attempts == [1] and not failed.value.retryable  # planning again cannot help
    assert staged_by(txn) == set()  # its file and its lease are gone
    assert ids(table.uri) == [8]


def test_retrying_plans_again_on_the_latest_version_after_a_preemption(table):
    uri = table.location.root
    planned_on, staged_files = [], []

    def attempt(n: int):
        txn = Transaction.start(table.location, open_table(uri).version, kind="delete")
        planned_on.append(txn.read_version)
        dataset = txn.read_dataset()
        offset = dataset.to_table(columns=["id"]).column("id").to_pylist().index(1)
        staged = stage_deletion(dataset, 0, [offset])
        staged_files.append(staged.path)
        if n == 1:  # another writer deletes from the same fragment meanwhile
            lance.dataset(uri).delete("id = 2")
        operation = lambda: LanceOperation.Delete([staged.metadata], [], "id = 1")  # noqa: E731
        try:
            return txn.commit([], operation)
        except BaseException:
            txn.abort(deletions=[staged])
            raise

    committed = retrying(attempt)
    first = table.version
    assert planned_on == [first, first + 1]  # the second attempt read the concurrent delete
    assert committed.version == first + 2 and ids(uri) == [3]
    # the first attempt's deletion file is removed; the second one's is the table's
    lost, won = staged_files
    assert lost not in tree(table.location.dataset_path)
    assert committed_deletions(table.location, None) == {won}
