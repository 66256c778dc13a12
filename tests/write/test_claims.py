"""Claims: the tasks of one write store each new payload once between them, and a task that
fails after claiming never leaves a reference to bytes that are not there (blobhouse.store.claims).

Each "task" here is one :meth:`TableWrite.write` call (as a Spark task runs it), with its own
store writer and claimant; the driver's commit is the write attempt's (:func:`begin_write`)."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import BlobhouseError, StaleWriteError, blob_array, open_table, write_table
from blobhouse.dedup import content_hash
from blobhouse.io.objects import uri_to_path
from blobhouse.store.claims import Claim, Claimant, Claims, claims_folder, decode_entry
from blobhouse.store.index import StoreIndex
from blobhouse.table import Table
from blobhouse.write import WriteAttempt, begin_write
from tests.helpers import flip, stock_read, tree

CLIPS = [os.urandom(200_000 + i) for i in range(6)]
SMALL = os.urandom(2_000)  # repeats inside each task's batches: claimed too


def rows(first: int, clips: list[int]) -> pa.Table:
    ids = list(range(first, first + len(clips)))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "clip": blob_array([CLIPS[c] for c in clips]),
            "calib": blob_array([SMALL] * len(clips)),
        }
    )


def begin(uri: str, data: pa.Table) -> WriteAttempt:
    """A write as the Spark data source plans it: its tasks claim new payloads."""
    write = begin_write(uri, data.schema, mode="append", in_tasks=True)
    assert write.plan.plan.claim_payloads
    return write


def unique(*tables: pa.Table) -> int:
    seen = {v["data"] for t in tables for c in ("clip", "calib") for v in t[c].to_pylist()}
    return sum(len(v) for v in seen)


def claim_files(uri: str) -> list[str]:
    return [p for p in tree(uri) if p.startswith("_blobs/claims/")]


def logged_claims(uri: str) -> list[str]:
    """Every claim the claim logs of ``uri``'s writes hold (entry, digest), and each mark."""
    made = []
    for path in claim_files(uri):
        if os.path.basename(path).startswith("log-"):
            with open(os.path.join(uri_to_path(uri), path), "rb") as f:
                made += [f"{path}:{c.digest.hex()}" for c in decode_entry(f.read())]
        else:
            made.append(path)
    return made


def test_tasks_of_one_write_store_each_new_payload_once(table_uri):
    write_table(rows(0, [0]), table_uri)  # the store holds clip 0 already
    tasks = [rows(100 * t, [0, 1, 2, 3, 1, 2, 4, 5]) for t in range(4)]
    write = begin(table_uri, tasks[0])
    written: list = [None] * len(tasks)

    def task(n: int) -> None:
        written[n] = write.plan.write(tasks[n].to_batches())

    threads = [threading.Thread(target=task, args=(n,)) for n in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    table = Table(write.commit([f for files in written for f in files]).snapshot)
    stats = table.stats()
    assert stats["physical_bytes"] == unique(rows(0, [0]), *tasks)
    assert set(stats["columns"]["clip"]["kinds"]) == {"global"}
    expected = [v["data"] for t in [rows(0, [0]), *tasks] for v in t["clip"].to_pylist()]
    assert sorted(stock_read(table_uri, "clip")) == sorted(expected)
    assert claim_files(table_uri) == []  # removed once the write committed
    assert table.verify(deep=True)["problems"] == []
    # the next write finds everything in the index: it stores nothing
    again = write_table(rows(900, [1, 2, 3]), table_uri, mode="append")
    assert again.stats()["physical_bytes"] == stats["physical_bytes"]


@pytest.mark.parametrize("files_before", [0, 1])
def test_a_task_that_failed_after_claiming_leaves_its_payloads_to_the_commit(
    table_uri, files_before
):
    write_table(rows(0, [5]), table_uri)
    if files_before:  # the failing task finished a data file before it failed
        open_table(table_uri).set_properties(max_rows_per_file=1)

    def failing():
        yield from rows(100, [0, 1]).to_batches()
        raise RuntimeError("the executor lost its input")

    write = begin(table_uri, rows(0, [0]))
    with pytest.raises(RuntimeError):
        write.plan.write(failing())  # claimed clips 0 and 1, then failed: its packs are finished
    survivor = write.plan.write(rows(200, [0, 1, 2]).to_batches())  # borrows clips 0 and 1
    assert {b.digest for f in survivor for b in f.borrowed} == {
        content_hash(CLIPS[0]),
        content_hash(CLIPS[1]),
    }
    table = Table(
        write.commit(survivor).snapshot
    )  # the failed task's packs are checked and adopted
    ids = table.to_arrow(columns=["id"])["id"].to_pylist()
    expected = {0: CLIPS[5], 200: CLIPS[0], 201: CLIPS[1], 202: CLIPS[2]}
    assert table.read_blobs("clip", range(4)) == [expected[i] for i in ids]
    assert stock_read(table_uri, "clip") == [expected[i] for i in ids]
    assert table.verify(deep=True)["problems"] == []
    # adopted payloads are in the index: the next write references them
    before = table.stats()["physical_bytes"]
    assert (
        write_table(rows(300, [0, 1]), table_uri, mode="append").stats()["physical_bytes"] == before
    )


@pytest.mark.parametrize("damage", ["missing", "wrong bytes"])
def test_borrowed_bytes_that_are_not_there_fail_the_commit_and_leave_nothing(table_uri, damage):
    table = write_table(rows(0, [5]), table_uri)
    version, before = table.version, tree(table_uri)

    def failing():
        yield from rows(100, [0]).to_batches()
        raise RuntimeError("killed")

    write = begin(table_uri, rows(0, [0]))
    with pytest.raises(RuntimeError):
        write.plan.write(failing())
    survivor = write.plan.write(rows(200, [0]).to_batches())
    (borrowed,) = {b.pack for f in survivor for b in f.borrowed}
    pack = os.path.join(table_uri, "_blobs", borrowed)
    if damage == "missing":
        os.remove(pack)
    else:
        flip(pack, 10)
    with pytest.raises(StaleWriteError, match="failed after claiming a payload"):
        write.commit(survivor)
    assert open_table(table_uri).version == version
    write.abort(survivor, tasks_may_run=True)
    left = tree(table_uri) - before
    assert not [p for p in left if not p.startswith("data/aborted-")], left


def test_a_retry_of_a_task_takes_its_predecessors_claims_over(table_uri, monkeypatch):
    write_table(rows(0, [5]), table_uri)
    write = begin(table_uri, rows(0, [0]))
    # attempt 0 of task 3 claimed clip 0 and died before storing it (no pack at all)
    dead = Claims(table_uri, write.transaction.id, claimant=Claimant(3, 0, "dead"))
    gone = f"packs/{write.transaction.name_prefix}never-written.pack"
    dead.claim(Claim(content_hash(CLIPS[0]), gone, 0, len(CLIPS[0]), dead.claimant))
    monkeypatch.setattr(Claimant, "here", classmethod(lambda cls: Claimant(3, 1, "retry")))
    written = write.plan.write(rows(100, [0, 1]).to_batches())
    assert not [b for f in written for b in f.borrowed]  # stored it itself
    claim = dead.claimed(content_hash(CLIPS[0]))
    assert claim.claimant.id == "retry" and claim.pack in {p for f in written for p in f.packs}
    table = Table(write.commit(written).snapshot)
    assert table.read_blobs("clip", [1, 2]) == [CLIPS[0], CLIPS[1]]


def test_a_log_entry_its_writer_never_finished_is_passed_over(table_uri, monkeypatch):
    write_table(rows(0, [5]), table_uri)
    write = begin(table_uri, rows(0, [0]))
    folder = uri_to_path(claims_folder(table_uri, write.transaction.id))
    os.makedirs(folder)
    open(os.path.join(folder, "log-000000000000"), "wb").close()  # its task died writing it
    monkeypatch.setattr("blobhouse.store.claims._READ_ATTEMPTS", 3)
    written = write.plan.write(rows(100, [0]).to_batches())
    claims = Claims(table_uri, write.transaction.id, claimant=Claimant(9, 0, "reader"))
    claim = claims.claimed(content_hash(CLIPS[0]))  # in the next entry: this task's copy
    assert claim.pack in {p for f in written for p in f.packs}
    assert os.path.exists(os.path.join(folder, "log-000000000001"))
    table = Table(write.commit(written).snapshot)
    assert table.read_blobs("clip", [1]) == [CLIPS[0]]


def test_gc_sweeps_the_claims_of_a_write_that_died(table_uri):
    write_table(rows(0, [5]), table_uri)
    write = begin(table_uri, rows(0, [0]))
    write.plan.write(rows(100, [0, 1]).to_batches())  # staged and claimed, never committed
    assert claim_files(table_uri)
    open_table(table_uri).gc(grace=timedelta(hours=1))  # the write's lease still lives
    assert claim_files(table_uri)
    from blobhouse.commit import leases

    leases.release(table_uri, write.transaction.name_prefix)
    open_table(table_uri).gc(grace=timedelta(0))
    assert claim_files(table_uri) == []
    assert open_table(table_uri).stats()["orphan_files"] == 0


def test_a_value_several_fragments_get_is_stored_once_by_update_and_compaction(table_uri):
    """Updates and compactions write each fragment (or group) with a store writer of its own:
    they claim, so one new payload several of them get is stored once."""
    write_table(rows(0, [0, 1, 2, 3]), table_uri, max_rows_per_file=1)  # four fragments
    open_table(table_uri).update({"clip": lambda batch: [CLIPS[5]] * batch.num_rows})
    table = open_table(table_uri)
    assert table.stats()["columns"]["clip"]["physical_bytes"] == len(CLIPS[5])
    assert table.read_blobs("clip", range(4)) == [CLIPS[5]] * 4
    # per file, then global: a compaction of two groups stores the shared clip once
    other = str(table_uri) + "-per-file"
    write_table(rows(0, [0, 0, 0, 0]), other, dedup="content", max_rows_per_file=1)
    open_table(other).set_properties(dedup="global", max_rows_per_file=2)
    assert open_table(other).compact()["fragments_added"] == 2
    stats = open_table(other).stats()
    assert stats["columns"]["clip"]["physical_bytes"] == len(CLIPS[0])
    assert set(stats["columns"]["clip"]["kinds"]) == {"global"}
    assert claim_files(other) == []


def test_small_payloads_are_claimed_while_their_column_shares_them(table_uri):
    """A small calibration file met once in each batch of every task is stored once (each
    batch alone would not show it repeats); thumbnails unique per row stop being claimed once
    the first PROBE of them turned out unique (but for the few their hash samples)."""
    from blobhouse.store.claims import PROBE

    calibration = [os.urandom(3_000), os.urandom(3_100)]
    unique = PROBE + 100

    def task(n: int):
        for i in range(unique):  # one row per batch: every batch is placed alone
            yield pa.record_batch(
                {
                    "id": pa.array([n * 10_000 + i], pa.int64()),
                    "calib": blob_array([calibration[i % 2]]),
                    "thumb": blob_array([b"%d-%d" % (n, i) * 500]),
                }
            )

    write_table(next(task(9)), table_uri)
    write = begin(table_uri, pa.Table.from_batches([next(task(9))]))
    written = [write.plan.write(task(n)) for n in range(3)]
    claims = logged_claims(table_uri)
    assert len(claims) <= 2 + 3 * (PROBE + 3)  # thumbnails stopped claiming
    table = Table(write.commit([f for files in written for f in files]).snapshot)
    stats = table.stats()["columns"]
    assert stats["calib"]["physical_bytes"] == sum(map(len, calibration))  # once, not per task
    assert stats["thumb"]["physical_bytes"] == stats["thumb"]["logical_bytes"]


def _payloads(count: int, size: int, seed: int, sampled: bool | None = None) -> list[bytes]:
    """``count`` distinct payloads of ``size`` bytes; ``sampled``: only those a task's sample
    holds (True) or only others (False), whatever their odds."""
    from blobhouse.store.claims import SharingOdds

    found, n = [], 0
    while len(found) < count:
        payload = (b"%d-%d-" % (seed, n)).ljust(size, b".")
        n += 1
        if sampled is None or SharingOdds.sampled(content_hash(payload), size) == sampled:
            found.append(payload)
    return found


def _one_per_batch(first_id: int, payloads: list[bytes]):
    for i, payload in enumerate(payloads):
        yield pa.record_batch(
            {"id": pa.array([first_id + i], pa.int64()), "clip": blob_array([payload])}
        )


@pytest.mark.parametrize("worker", ["new per task", "reused"])
def test_unique_payloads_cost_the_probe_and_a_sample_of_claims(table_uri, monkeypatch, worker):
    """A column of payloads unique per row (images) is claimed for its first PROBE payloads
    per task, then only for those its hash-chosen sample holds: a claim is a request. A task
    in a worker that ran a task of the write before (Spark reuses its Python workers) starts
    from what that one learned: no probe."""
    from blobhouse.store import write_memory
    from blobhouse.store.claims import PROBE, SharingOdds

    tasks = [_payloads(150, 100_000, seed=t) for t in range(3)]
    write_table(pa.table({"id": [0], "clip": blob_array([b"first" * 20_000])}), table_uri)
    write = begin(table_uri, pa.table({"id": [0], "clip": blob_array([b"x"])}))
    made: list[str] = []
    written = []
    for n, payloads in enumerate(tasks):
        if worker == "new per task":  # what a process of its own knows: nothing
            monkeypatch.setattr(write_memory, "_MEMORIES", type(write_memory._MEMORIES)())
        before = set(logged_claims(table_uri))
        written += write.plan.write(_one_per_batch(1000 * (n + 1), payloads))
        made += sorted(set(logged_claims(table_uri)) - before)
    probed = tasks if worker == "new per task" else tasks[:1]
    unprobed = [p for t in probed for p in t[PROBE:]] + [p for t in tasks[len(probed) :] for p in t]
    in_sample = sum(SharingOdds.sampled(content_hash(p), len(p)) for p in unprobed)
    assert len(made) == len(probed) * PROBE + in_sample < 40  # of 450 payloads
    table = Table(write.commit(written).snapshot)
    assert table.stats()["physical_bytes"] == 100_000 * 451
    assert claim_files(table_uri) == []


def test_a_task_ahead_of_the_others_claims_once_they_find_the_column_shared(table_uri, monkeypatch):
    """Task A meets 60 payloads first, past its probe (unique images before them): it claims
    only the one its sample holds. Task B meets them next and finds that claim: it marks the
    column shared for the write, and A, looking for the mark as it goes on, claims the rest
    and borrows B's copies. Without the mark A would store all 60 again."""
    from blobhouse.store import claims

    monkeypatch.setattr(claims, "MARK_CHECK_BYTES", 400_000)  # looked for every 4 payloads
    images = _payloads(claims.PROBE, 100_000, seed=7, sampled=False)
    shared = _payloads(60, 100_000, seed=8, sampled=False)
    shared[3] = _payloads(1, 100_000, seed=9, sampled=True)[0]  # the one A's sample holds
    write_table(pa.table({"id": [0], "clip": blob_array([b"first" * 20_000])}), table_uri)
    write = begin(table_uri, pa.table({"id": [0], "clip": blob_array([b"x"])}))
    halfway, b_done = threading.Event(), threading.Event()
    written: dict[str, list] = {}

    def task_a():
        def batches():
            for i, batch in enumerate(_one_per_batch(1000, [*images, *shared])):
                if i == len(images) + 10:
                    halfway.set()
                    b_done.wait(60)
                yield batch

        written["a"] = write.plan.write(batches())

    thread = threading.Thread(target=task_a)
    thread.start()
    assert halfway.wait(60)
    written["b"] = write.plan.write(_one_per_batch(2000, shared))
    assert any("shared-" in c for c in claim_files(table_uri))  # B left the mark
    b_done.set()
    thread.join(60)
    table = Table(write.commit([*written["a"], *written["b"]]).snapshot)
    stored = table.stats()["physical_bytes"] - 100_000 * (1 + len(images))
    # B stored the 9 A met unclaimed before it paused (3 of them before the claim B found, in
    # its probe); A stored at most 4 more before it saw the mark, then borrowed the rest
    assert stored <= 100_000 * (60 + 10 + 4), stored
    assert sorted(stock_read(table_uri, "clip")) == sorted(
        [b"first" * 20_000, *images, *shared, *shared]
    )
    table.compact(max_unused=0.0)
    open_table(table_uri).gc(grace=timedelta(0), retain_versions=1)
    after = open_table(table_uri).stats()
    assert after["physical_bytes"] == 100_000 * (1 + len(images) + 60)  # the copies merged


def test_tasks_ending_after_their_write_was_aborted_leave_no_claim_or_pack(table_uri):
    """Spark cancels a failed job's tasks, but one may still be running when the driver's
    abort swept the write: it claims and stores after the sweep, and cleans up as it ends."""
    table = write_table(rows(0, [5]), table_uri)
    before = tree(table_uri)
    write = begin(table_uri, rows(0, [0]))
    write.abort([], tasks_may_run=True)  # the driver gave up first

    def failing():
        yield from rows(100, [0, 1]).to_batches()
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError):  # failed after claiming: it kept its packs for others
        write.plan.write(failing())
    with pytest.raises(BlobhouseError, match="was aborted"):
        write.plan.write(rows(200, [2, 3]).to_batches())
    left = tree(table_uri) - before
    assert all(p.startswith("data/aborted-") for p in left), left
    assert open_table(table_uri).version == table.version


def test_the_tasks_record_their_new_payloads_and_the_commit_streams_them_to_the_index(
    table_uri,
):
    """The driver does not collect what the tasks stored (~190 bytes a payload, 19 GB per
    100 M): each task records it beside the store, and the commit appends the records to the
    index a record at a time, then removes them."""
    write_table(rows(0, [0]), table_uri)
    tasks = [rows(100 * t, [1, 2, 3 + t]) for t in range(3)]
    write = begin(table_uri, tasks[0])
    written = [f for t in tasks for f in write.plan.write(t.to_batches())]
    assert all(w.stored == () for w in written)  # nothing of the entries travels to the driver
    new = sum(len(CLIPS[c]) for c in range(1, 6))  # each by one task (SMALL: in the store)
    assert sum(w.recorded_bytes for w in written) == new
    assert [p for p in tree(table_uri) if p.startswith("_blobs/stored/")]
    write.commit(written)
    assert not [p for p in tree(table_uri) if p.startswith("_blobs/stored/")]
    found = StoreIndex.open(table_uri).find([content_hash(clip) for clip in CLIPS])
    assert len(found) == len(CLIPS)  # each clip the tasks stored is in the index
    got = open_table(table_uri).to_arrow(blobs="bytes").to_pylist()
    assert {r["id"]: r["clip"] for r in got} == {
        **{0: CLIPS[0]},
        **{100 * t + i: CLIPS[c] for t in range(3) for i, c in enumerate([1, 2, 3 + t])},
    }


@pytest.mark.parametrize("log_entries", [128, 3])
def test_racing_tasks_claim_each_payload_exactly_once_through_the_log(
    tmp_path, monkeypatch, log_entries
):
    """Eight tasks claim overlapping batches at the same moment, each through a process memory
    of its own: every payload ends up claimed by exactly one task, and every other task that
    wanted it was handed that task's claim (the place its rows reference). Also once the log
    is full and claims are objects of their own (3 entries: most claims here)."""
    import random

    from blobhouse.store import claims as claims_module
    from blobhouse.store.write_memory import WriteMemory

    monkeypatch.setattr(claims_module, "LOG_ENTRIES", log_entries)

    digests = [content_hash(b"%d" % n) for n in range(300)]
    rng = random.Random(5)
    batches = [[rng.sample(digests, 60) for _ in range(4)] for _ in range(8)]
    won: dict[int, list[Claim]] = {}
    handed: dict[int, dict[bytes, Claim]] = {}
    start = threading.Barrier(8)

    def task(n: int) -> None:
        claims = Claims(
            str(tmp_path), "write-1", claimant=Claimant(n, 0, f"t{n}"), memory=WriteMemory()
        )
        won[n], handed[n] = [], {}
        start.wait()
        for batch in batches[n]:
            wanted = [
                (d, 10) for d in batch if d not in handed[n] and d not in {c.digest for c in won[n]}
            ]
            places = lambda w, n=n: [(f"packs/t{n}.pack", 10 * i) for i in range(len(w))]  # noqa: E731
            theirs = claims.claim_many(wanted, places)
            handed[n].update(theirs)
            mine = [d for d, _ in wanted if d not in theirs]
            won[n] += [
                Claim(d, f"packs/t{n}.pack", 10 * i, 10, claims.claimant)
                for i, d in enumerate(mine)
            ]

    threads = [threading.Thread(target=task, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owners: dict[bytes, int] = {}
    for n, claims in won.items():
        for claim in claims:
            assert claim.digest not in owners, "claimed twice"
            owners[claim.digest] = n
    wanted_by_any = {d for b in batches for batch in b for d in batch}
    assert set(owners) == wanted_by_any
    reader = Claims(str(tmp_path), "write-1", claimant=Claimant(99, 0, "reader"))
    for n, theirs in handed.items():
        for digest, claim in theirs.items():
            assert owners[digest] != n and claim.claimant.partition == owners[digest]
    some = next(iter(owners))
    assert reader.claimed(some).claimant.partition == owners[some]  # what the log says
    folder = Path(uri_to_path(claims_folder(str(tmp_path), "write-1")))
    made = os.listdir(folder)
    entries = [name for name in made if name.startswith("log-")]
    if log_entries == 128:
        assert len(made) == len(entries) <= 8 * 4  # an entry per batch at most
    else:  # three entries, then an object per claim
        in_log = sum(len(decode_entry((folder / e).read_bytes())) for e in entries)
        assert len(entries) == 3 and len(made) - 3 == len(owners) - in_log


@pytest.mark.parametrize("worker", ["new per task", "reused"])
def test_the_first_task_to_meet_payloads_claims_its_whole_first_batch(
    table_uri, monkeypatch, worker
):
    """A task's first batch is its probe while claims go in the log (one request whatever
    their number): a task that met 20 new payloads first, in one batch, claimed them all, so
    a task meeting them next borrows every one, in a worker of its own (it reads the leader's
    entry) or in the leader's (it knows the claims). With a probe of 8 payloads, the leader
    stored 12 unclaimed and the follower stored them again."""
    from blobhouse.store import write_memory
    from blobhouse.store.claims import PROBE, SharingOdds

    clips = _payloads(20, 100_000, seed=11, sampled=False)  # none in the hash's sample
    assert len(clips) > PROBE
    write_table(pa.table({"id": [0], "clip": blob_array([b"first" * 20_000])}), table_uri)
    write = begin(table_uri, pa.table({"id": [0], "clip": blob_array([b"x"])}))
    batch = pa.table({"id": pa.array(range(20), pa.int64()), "clip": blob_array(clips)})
    leader = write.plan.write(batch.to_batches())
    if worker == "new per task":  # what a process of its own knows: nothing
        monkeypatch.setattr(write_memory, "_MEMORIES", type(write_memory._MEMORIES)())
    follower = write.plan.write(batch.to_batches()[::-1])
    assert sum(len(f.borrowed) for f in follower) == 20
    assert not any(SharingOdds.sampled(content_hash(c), len(c)) for c in clips)
    table = Table(write.commit([*leader, *follower]).snapshot)
    assert table.stats()["physical_bytes"] == 100_000 * 21
