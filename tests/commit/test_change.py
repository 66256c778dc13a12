"""The change template (blobhouse.commit.change.run_change) driven directly: what every update,
merge, compaction and backfill runs through."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from lance import LanceOperation

from blobhouse import write_table
from blobhouse.commit.change import BaseChange, Staged, run_change
from blobhouse.commit.transaction import Transaction
from blobhouse.errors import ConcurrentCommitError, MovedTableWarning
from blobhouse.files.session import BlobSession


class AppendRows(BaseChange):
    """Appends one row per attempt; ``fail_stage`` / ``preempt`` make attempts fail."""

    def __init__(self, uri: str, *, fail_stage: bool = False, preempt: int = 0) -> None:
        self.uri, self.fail_stage, self.preempt = uri, fail_stage, preempt
        self.planned_on: list[int] = []
        self.staged_names: list[str] = []

    def plan(self, snapshot):
        self.planned_on.append(snapshot.version)
        return Transaction.start(snapshot.location, snapshot.version, kind="test")

    def stage(self, txn, staged: Staged) -> None:
        path = f"{txn.location.data_dir}/{txn.name_prefix}0.lance"
        staged.written.append(BlobSession(path).write_data_file(pa.table({"id": [99]})))
        self.staged_names.append(staged.written[-1].name)
        if self.fail_stage:
            raise RuntimeError("the stage failed after writing a file")

    def commit(self, txn, staged: Staged):
        if self.preempt:
            self.preempt -= 1  # another writer commits first: this commit is preempted
            write_table(pa.table({"id": [0]}), self.uri, mode="append")
        fragments = [w.fragment([0]) for w in staged.written]
        return txn.commit(staged.written, lambda: LanceOperation.Append(fragments))

    def report(self, txn, staged, committed, attempt):
        return {"attempt": attempt, "version": committed.version}


def data_files(uri: str) -> set[str]:
    return set(os.listdir(os.path.join(uri, "data")))


@pytest.fixture
def table(tmp_path):
    return write_table(pa.table({"id": [1]}), str(tmp_path / "t"))


def test_a_change_commits_and_hands_back_the_committed_snapshot(table):
    done = run_change(AppendRows(table.uri.removeprefix("file://")), table.snapshot)
    assert done.report == {"attempt": 1, "version": 2}
    assert done.snapshot.version == 2
    assert sorted(done.snapshot.dataset.to_table().column("id").to_pylist()) == [1, 99]
    assert table.version == 1  # the snapshot it ran on never changes


def test_a_failed_stage_removes_exactly_what_it_staged(table):
    uri = table.uri.removeprefix("file://")
    before = data_files(uri)
    change = AppendRows(uri, fail_stage=True)
    with pytest.raises(RuntimeError, match="the stage failed"):
        run_change(change, table.snapshot)
    assert change.staged_names and data_files(uri) == before
    assert table.snapshot.latest().version == 1
    leases = os.listdir(os.path.join(uri, "_leases"))
    assert not [name for name in leases if name.startswith("test-")]  # its lease is gone too


def test_a_preempted_change_is_planned_again_on_the_latest_version(table):
    uri = table.uri.removeprefix("file://")
    change = AppendRows(uri, preempt=1)
    done = run_change(change, table.snapshot)
    # Lance rebases a plain append over another one; a conflict it cannot rebase would be
    # retried: here the first attempt commits on top of the other writer's append
    assert done.report["attempt"] == 1 and done.snapshot.version == 3
    assert change.planned_on == [1]


def test_a_changes_plan_is_released_after_every_attempt(table):
    uri = table.uri.removeprefix("file://")
    released = []

    class Releasing(AppendRows):
        def release(self, plan):
            released.append(plan.name_prefix)

    run_change(Releasing(uri), table.snapshot)
    with pytest.raises(RuntimeError):
        run_change(Releasing(uri, fail_stage=True), table.snapshot)
    assert len(released) == 2 and released[0] != released[1]


def test_preemptions_past_the_retries_fail_with_nothing_committed(table, monkeypatch):
    from lance.commit import CommitConflictError

    uri = table.uri.removeprefix("file://")
    change = AppendRows(uri)
    attempts = []

    def conflicting(txn, staged):
        attempts.append(1)
        raise CommitConflictError(1, "preempted by a concurrent commit (test)")

    monkeypatch.setattr(change, "commit", conflicting)
    before = data_files(uri)
    with pytest.raises(ConcurrentCommitError, match="all 3 attempt"):
        run_change(change, table.snapshot, retries=2)
    assert len(attempts) == 3 and change.planned_on == [1, 1, 1]
    assert data_files(uri) == before  # every attempt's file was removed
    assert table.snapshot.latest().version == 1


class Commits:
    """Where commits ran: the prefixes of transactions committed inside the template's commit
    step (``inside``) or outside it (``outside``), and whether a commit step and a
    transaction's commit are running now (``in_commit``)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.commits: list[int] = []
        self.inside: list[str] = []
        self.outside: list[str] = []

    @property
    def in_commit(self) -> bool:
        return bool(self.steps and self.commits)


@pytest.fixture
def tracked(monkeypatch) -> Commits:
    """Every template commit step and transaction commit of the test, tracked."""
    from blobhouse.commit import change as template

    seen = Commits()
    attempt_commit, txn_commit = template.Attempt.commit, Transaction.commit

    def in_step(self, written=()):
        seen.steps.append(1)
        try:
            return attempt_commit(self, written)
        finally:
            seen.steps.pop()

    def in_commit(self, *args, **kwargs):
        (seen.inside if seen.steps else seen.outside).append(self.name_prefix)
        seen.commits.append(1)
        try:
            return txn_commit(self, *args, **kwargs)
        finally:
            seen.commits.pop()

    monkeypatch.setattr(template.Attempt, "commit", in_step)
    monkeypatch.setattr(Transaction, "commit", in_commit)
    return seen


def test_every_change_a_user_makes_commits_through_the_template(tmp_path, tracked):
    """Writes, row changes, schema and property changes, maintenance and the store's own
    commits: each commits inside the template's commit step, none on its own."""
    import shutil

    from blobhouse import BlobSession, blob_array, open_table

    inside, outside = tracked.inside, tracked.outside
    uri = str(tmp_path / "t")

    def rows(ids):
        return pa.table(
            {"id": pa.array(ids, pa.int64()), "img": blob_array([b"x" * 500] * len(ids))}
        )

    def add_session_file(t):
        session = BlobSession(t.data_file_path())
        images = session.open_writer("img")
        pack = images.new_packed()
        shared = pack.write_blob(b"y" * 500)
        images.extend([*pack.finish(), shared])
        ids = pa.array([7, 8], pa.int64())
        return t.add_data_file(
            session.write_data_file(pa.table({"id": ids, "img": images.finish()}))
        )

    write_table(rows([1, 2, 3]), uri, dedup="content")
    changes = [
        add_session_file,
        lambda t: write_table(rows([4]), uri, mode="append"),
        lambda t: t.update({"id": "id + 10"}, where="id = 4"),
        lambda t: t.delete("id = 1"),
        lambda t: (
            t.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(rows([2, 5]))
        ),
        lambda t: t.add_columns({"double": "id * 2"}),
        lambda t: t.set_properties(dedup="global"),
        lambda t: t.backfill_blob_column("thumb", lambda batch: [b"t"] * batch.num_rows),
        lambda t: t.maintenance.compact(),
    ]
    for n, change in enumerate(changes):
        before = len(inside)
        change(open_table(uri))
        assert len(inside) > before, f"change {n} committed nothing through the template"
    shutil.copytree(uri, tmp_path / "copy")
    before = len(inside)
    with pytest.warns(MovedTableWarning):
        copy = open_table(str(tmp_path / "copy"))
    copy.relocate()  # the store's own commit
    assert len(inside) > before
    assert outside == []
    assert open_table(uri).count_rows() == 6


def test_store_first_writes_record_their_payloads_inside_the_commit(tmp_path, monkeypatch, tracked):
    """The LeRobot import stores its video files first, then writes the rows: one transaction,
    whose commit (inside the template's commit step) records the stored payloads in the store's
    index under its Ctrl-C guard; nothing appends to the index outside a commit."""
    from blobhouse.commit import transaction as transaction_module
    from blobhouse.lerobot import ingest_lerobot
    from blobhouse.lerobot.sample import write_sample_dataset
    from blobhouse.store.index import open_index
    from blobhouse.store.index_part import entry_batches

    recorded: list[tuple[bool, int]] = []  # (inside a commit step and its commit, how many)
    append = transaction_module.append_to_index

    def appended(table_path, stored, storage_options=None):
        count = sum(batch.num_rows for batch in entry_batches(stored)())  # a list, or records
        recorded.append((tracked.in_commit, count))
        return append(table_path, stored, storage_options)

    monkeypatch.setattr(transaction_module, "append_to_index", appended)
    root = write_sample_dataset(str(tmp_path / "robot"), episodes=2, frames=4, size=(16, 16))
    done = ingest_lerobot(root, str(tmp_path / "t"))
    videos = done.video_files
    assert recorded and all(inside for inside, _ in recorded), recorded
    assert sum(n for _, n in recorded) >= videos  # every stored video file is in the index
    assert open_index(str(tmp_path / "t"), None).count_rows() >= videos
    assert tracked.outside == []
