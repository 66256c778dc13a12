"""Random sequences of writes and table services keep every retained version readable, intact."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta

import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from lance.commit import CommitConflictError

from blobhouse import (
    Blob,
    RefIdConflictError,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.commit import leases
from blobhouse.layout import TableLocation
from blobhouse.maintenance import compaction, orphans
from blobhouse.store.packs import retired_packs
from blobhouse.write.pipeline import plan_write, write_data_files
from tests.helpers import aged, assert_totals_are_the_sum_of_the_lines, disk_bytes, tree

_rng = random.Random(20240611)
# two of each size: 10 B (inline when unique), 70 KB and 300 KB (packed); and null
POOL: list[bytes | None] = [
    _rng.randbytes(10),
    _rng.randbytes(10),
    _rng.randbytes(70_000),
    _rng.randbytes(70_000),
    _rng.randbytes(300_000),
    _rng.randbytes(300_000),
    None,
]
PICKS = st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=6)
FILTERS = st.one_of(
    st.integers(0, 40).map(lambda n: f"id < {n}"),
    st.tuples(st.integers(2, 4), st.integers(0, 3)).map(lambda t: f"id % {t[0]} = {t[1] % t[0]}"),
    st.lists(st.integers(0, 40), min_size=1, max_size=4).map(
        lambda ids: f"id IN ({', '.join(map(str, ids))})"
    ),
)
PROPERTY_SETTINGS = settings(
    max_examples=15,
    stateful_step_count=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
Rows = list[tuple[int, bytes | None]]


def matches(row_id: int, where: str) -> bool:
    """Python's reading of the filters in :data:`FILTERS`."""
    if where.startswith("id < "):
        return row_id < int(where[5:])
    if where.startswith("id % "):
        k, r = where[5:].split(" = ")
        return row_id % int(k) == int(r)
    return row_id in {int(i) for i in where[len("id IN (") : -1].split(", ")}


def rows_table(ids: list[int], values: list) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(values)})


def file_bytes(root: str, relative: set[str]) -> dict[str, bytes]:
    out = {}
    for rel in relative:
        with open(os.path.join(root, rel), "rb") as f:
            out[rel] = f.read()
    return out


def read_blobhouse(uri: str, version: int) -> Rows:
    table = open_table(uri, version)
    got = table.to_arrow(blobs="bytes").to_pylist()
    # read_blobs by position agrees with the scan
    assert table.read_blobs("b", range(len(got))) == [r["b"] for r in got]
    return sorted((r["id"], r["b"]) for r in got)


def read_stock(uri: str, version: int) -> Rows:
    dataset = lance.dataset(uri, version=version)
    ids = dataset.to_table(columns=["id"]).column("id").to_pylist()
    if not ids:
        return []
    pairs = dataset.read_blobs("b", indices=list(range(len(ids))), preserve_order=True)
    return sorted(zip(ids, [p for _, p in pairs], strict=True))


def assert_versions_read_back(uri: str, model: dict[int, Rows]) -> None:
    """Exactly the model's versions are retained, and each reads back exactly its rows."""
    retained = [v["version"] for v in open_table(uri).versions()]
    assert retained == sorted(model)
    for version, rows in model.items():
        assert read_blobhouse(uri, version) == rows, f"blobhouse read of version {version}"
        assert read_stock(uri, version) == rows, f"stock pylance read of version {version}"


class TableServices(RuleBasedStateMachine):
    """Appends, deletes, overwrites, compactions, gc, failed and abandoned writes on one table,
    checked against a model of every retained version."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="blobhouse-props-")
        self.uri = os.path.join(self.root, "table")
        self.data_dir = os.path.join(self.uri, "data")
        self.next_id = 0
        self.model: dict[int, Rows] = {}  # retained version -> sorted (id, bytes)
        self.leftovers: dict[str, bytes] = {}  # staged, never committed: path -> bytes
        self.store_registered = False

    # --- helpers -------------------------------------------------------------------------

    @property
    def latest(self) -> int:
        return max(self.model)

    def new_rows(self, picks: list[int]) -> tuple[list[int], list]:
        ids = list(range(self.next_id, self.next_id + len(picks)))
        self.next_id += len(picks)
        return ids, [POOL[p] for p in picks]

    def use_mode(self, dedup: str) -> None:
        """Make ``dedup`` the table's mode (a commit of its own when it changes)."""
        table = open_table(self.uri)
        if table.properties.dedup != dedup:
            table.set_properties(dedup=dedup)
            self.model[table.version] = self.model[self.latest]

    def committed(self, rows: Rows) -> None:
        version = open_table(self.uri).version
        assert version not in self.model
        assert self.latest < version <= self.latest + 2
        previous = self.model[self.latest]
        for registered in range(self.latest + 1, version):
            # the first global write to a table registers its store in a commit of its own
            assert not self.store_registered
            self.model[registered] = previous
        self.store_registered |= version > self.latest + 1
        self.model[version] = sorted(rows)

    # --- rules ---------------------------------------------------------------------------

    @initialize(picks=PICKS)
    def create(self, picks):
        ids, values = self.new_rows(picks)
        table = write_table(rows_table(ids, values), self.uri)
        self.model[table.version] = sorted(zip(ids, values, strict=True))

    @rule(picks=PICKS, dedup=st.sampled_from(["content", "global"]))
    def append(self, picks, dedup):
        ids, values = self.new_rows(picks)
        self.use_mode(dedup)  # appends use the table's mode
        write_table(rows_table(ids, values), self.uri, mode="append")
        self.committed(self.model[self.latest] + list(zip(ids, values, strict=True)))

    @rule(picks=PICKS, dedup=st.sampled_from(["content", "global"]))
    def overwrite(self, picks, dedup):
        ids, values = self.new_rows(picks)
        write_table(rows_table(ids, values), self.uri, mode="overwrite", dedup=dedup)
        self.committed(list(zip(ids, values, strict=True)))

    @rule(where=FILTERS)
    def delete(self, where):
        open_table(self.uri).delete(where)
        self.committed([r for r in self.model[self.latest] if not matches(r[0], where)])

    @rule(small=st.booleans())
    def compact(self, small):
        before = open_table(self.uri)
        report = before.compact(**({"target_rows": 4} if small else {}))
        after = open_table(self.uri).version
        if report["fragments_removed"]:
            self.committed(self.model[self.latest])
            assert report["version"] == after
        else:
            assert after == before.version

    @rule(retain=st.sampled_from([None, 1, 2, 3]), young=st.booleans())
    def gc(self, retain, young):
        grace = None if young else timedelta(0)  # None: the default 24 hours
        report = open_table(self.uri).gc(retain_versions=retain, grace=grace)
        if retain is not None:
            expected = sorted(self.model)[-retain:]
            assert report["retained_versions"] == expected
            assert report["removed_versions"] == [v for v in sorted(self.model) if v < expected[0]]
            self.model = {v: self.model[v] for v in expected}
        if young:  # every leftover was staged moments ago: kept, byte for byte
            assert file_bytes(self.data_dir, set(self.leftovers)) == self.leftovers
        else:
            assert not any(os.path.exists(os.path.join(self.data_dir, p)) for p in self.leftovers)
            self.leftovers.clear()
            # what is left unreferenced: store packs retired by this run, reaped by a later one
            # once their tombstone has aged (docs/global-dedup.md)
            left = set(orphans(open_table(self.uri))["paths"])
            assert left <= {os.path.join(self.uri, "_blobs", p) for p in retired_packs(self.uri)}

    @rule(picks=PICKS, conflict=st.booleans())
    def failed_append(self, picks, conflict):
        if conflict:  # ref_ids are checked in ref_id mode
            self.use_mode("ref_id")
        before = tree(self.uri)
        ids, values = self.new_rows(picks)

        def batches() -> Iterator[pa.RecordBatch]:
            yield from rows_table(ids, values).to_batches()
            if conflict:  # bad input in later batches: one ref_id, two different payloads
                for payload in (b"first" * 20_000, b"other" * 20_000):
                    yield from rows_table([ids[-1]], [Blob(data=payload, ref_id=9)]).to_batches()
            raise RuntimeError("the source failed mid-write")

        error = RefIdConflictError if conflict else RuntimeError
        with pytest.raises(error):
            write_table(batches(), self.uri, mode="append")
        assert open_table(self.uri).version == self.latest
        assert tree(self.uri) == before, "a failed write left files behind or changed the table"

    @rule(picks=PICKS)
    def abandoned_write(self, picks):
        """A writer that staged files and died before committing."""
        ids, values = self.new_rows(picks)
        data = rows_table(ids, values)
        before = tree(self.data_dir) if os.path.isdir(self.data_dir) else set()
        # named as blobhouse names a write's files; its lease never taken (a dead write)
        prefix = f"write-{uuid.uuid4().hex[:12]}-"
        location = TableLocation(self.uri)
        write_data_files(data.to_batches(), plan_write(data.schema), location, None, prefix)
        leases.release(self.uri, prefix)  # expired: the writer died long ago
        staged = tree(self.data_dir) - before
        assert staged
        self.leftovers.update(file_bytes(self.data_dir, staged))
        assert open_table(self.uri).version == self.latest

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def every_retained_version_reads_back(self):
        if self.model:
            assert_versions_read_back(self.uri, self.model)

    @invariant()
    def deep_verify_finds_nothing(self):
        if self.model:
            report = open_table(self.uri).verify(deep=True)
            assert report["problems"] == []
            assert report["versions"] == sorted(self.model)

    @invariant()
    def stats_add_up(self):
        """stats' totals are the sums of their lines, its logical bytes what the model's live
        rows hold, and its figure of the bytes on disk what is on disk; leftovers are
        orphans."""
        if not self.model:
            return
        stats = open_table(self.uri).stats()
        assert_totals_are_the_sum_of_the_lines(stats)
        live = [v for _, v in self.model[self.latest] if v is not None]
        assert stats["logical_bytes"] == sum(map(len, live))
        assert stats["external_bytes"] == 0
        assert stats["table_owned_bytes"] >= sum(map(len, set(live)))
        assert stats["on_disk_bytes"] == disk_bytes(self.uri)
        assert stats["orphan_files"] >= len(self.leftovers)

    def teardown(self) -> None:
        try:
            if self.model:
                # past the grace period, gc removes every file no retained version references
                aged(self.uri, hours=48, folders=False)  # data files and store packs
                report = open_table(self.uri).gc()
                assert report["kept_young_files"] == 0
                assert not any(
                    os.path.exists(os.path.join(self.data_dir, p)) for p in self.leftovers
                )
                aged(self.uri, hours=48, folders=False)  # tombstones the first pass retired
                open_table(self.uri).gc()
                assert open_table(self.uri).stats()["orphan_files"] == 0
                assert_versions_read_back(self.uri, self.model)
                assert open_table(self.uri).verify(deep=True)["problems"] == []
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


TableServices.TestCase.settings = settings(
    PROPERTY_SETTINGS, max_examples=25, stateful_step_count=10
)
test_table_services = pytest.mark.slow(TableServices.TestCase)


# --- leftovers and the grace period -------------------------------------------------------


def test_young_leftovers_are_kept_byte_identical_and_removed_once_aged(table_uri):
    pool = POOL[:6]
    write_table(rows_table(list(range(6)), pool), table_uri)
    write_table(rows_table([6, 7], [pool[4], pool[0]]), table_uri, mode="append")
    data_dir = os.path.join(table_uri, "data")
    committed = tree(data_dir)
    for picks in ([4, 4, 0], [2, 5]):
        staged = rows_table([100, 101, 102][: len(picks)], [pool[p] for p in picks])
        write_data_files(staged.to_batches(), plan_write(staged.schema), TableLocation(table_uri))
    leftovers = file_bytes(data_dir, tree(data_dir) - committed)
    assert len(leftovers) >= 4  # two data files and their sidecars
    expected = sorted(zip(range(8), [*pool, pool[4], pool[0]], strict=True))

    report = open_table(table_uri).gc()  # default grace: 24 hours
    assert (report["removed_files"], report["kept_young_files"]) == (0, len(leftovers))
    assert file_bytes(data_dir, set(leftovers)) == leftovers
    aged(data_dir, hours=12, folders=False)  # still inside the grace period
    report = open_table(table_uri).gc()
    assert report["removed_files"] == 0
    assert file_bytes(data_dir, set(leftovers)) == leftovers
    assert open_table(table_uri).gc(grace=timedelta(hours=11))["removed_files"] == len(leftovers)
    assert tree(data_dir) == committed
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert read_blobhouse(table_uri, 2) == expected and read_stock(table_uri, 2) == expected
    assert open_table(table_uri).verify(deep=True)["problems"] == []


# --- compaction stores each distinct live payload once ------------------------------------


@PROPERTY_SETTINGS
@given(
    first=PICKS,
    steps=st.lists(
        st.one_of(st.tuples(st.just("append"), PICKS), st.tuples(st.just("delete"), FILTERS)),
        max_size=8,
    ),
)
def test_compaction_stores_each_distinct_live_payload_once(first, steps):
    """With default targets every candidate fragment falls into one group, rewritten into one
    data file (the table's store: its default dedup is global): each distinct live payload is
    stored once. stats counts
    each distinct stored range once (inline payloads at their offset in the data file, packed and
    dedicated ones in their sidecar), nulls not at all, so after ``compact()``:
    ``sum(len(p) for p in distinct live payloads) <= physical_bytes <= 1.05 * that sum``
    (a lone fragment with nothing deleted and no pack to repack is not rewritten, but it was
    written with global dedup, so the bound holds for it too)."""
    root = tempfile.mkdtemp(prefix="blobhouse-compact-")
    try:
        uri = os.path.join(root, "table")
        live: dict[int, bytes | None] = {}
        next_id = 0
        for op, arg in [("append", first), *steps]:
            if op == "append":
                ids = list(range(next_id, next_id + len(arg)))
                next_id += len(arg)
                values = [POOL[p] for p in arg]
                write_table(rows_table(ids, values), uri, mode="append")
                live.update(zip(ids, values, strict=True))
            else:
                open_table(uri).delete(arg)
                live = {i: v for i, v in live.items() if not matches(i, arg)}
        before = open_table(uri)
        report = before.compact()
        # a lone fragment is rewritten only to drop deleted rows or to repack a store pack
        # mostly dead (the default dedup: global)
        lone = report["fragments_removed"] == 1
        assert not lone or report["deleted_rows_dropped"] > 0 or report["repacked_packs"] > 0
        table = open_table(uri)
        assert table.stats()["fragments"] <= 1
        unique = sum(len(v) for v in {v for v in live.values() if v is not None})
        physical = table.stats()["physical_bytes"]
        assert unique <= physical <= 1.05 * unique, (physical, unique, report)
        expected = sorted(live.items())
        assert read_blobhouse(uri, table.version) == expected
        assert read_stock(uri, table.version) == expected
        assert table.verify(deep=True)["problems"] == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- a compaction whose commit fails changes nothing --------------------------------------


@pytest.fixture
def fragmented(table_uri) -> tuple[str, Rows]:
    rows: Rows = []
    for start in range(0, 12, 3):
        ids = list(range(start, start + 3))
        values = [POOL[i % 6] for i in ids]
        write_table(rows_table(ids, values), table_uri, mode="append")
        rows += zip(ids, values, strict=True)
    open_table(table_uri).delete("id = 4")
    return table_uri, sorted(r for r in rows if r[0] != 4)


def test_a_compaction_whose_commit_raises_changes_nothing(fragmented, monkeypatch):
    uri, rows = fragmented
    before, version = tree(uri), open_table(uri).version
    written = []

    def failing_commit(table, plan, results):
        written.extend(w for files in results for w in files)
        raise OSError("the object store went away")

    monkeypatch.setattr(compaction, "commit_compaction", failing_commit)
    with pytest.raises(OSError, match="went away"):
        open_table(uri).compact(target_rows=4)
    assert written, "the compaction wrote files before its commit failed"
    assert tree(uri) == before
    assert open_table(uri).version == version
    assert read_blobhouse(uri, version) == rows and read_stock(uri, version) == rows
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_a_compaction_preempted_by_a_concurrent_delete_changes_nothing(fragmented, monkeypatch):
    """A delete on a fragment being rewritten commits between plan and commit: Lance refuses the
    Rewrite, compaction removes its files, and the deleted row stays deleted."""
    uri, rows = fragmented
    data_before, version = tree(os.path.join(uri, "data")), open_table(uri).version
    real_group = compaction.compact_group

    def group_then_concurrent_delete(table, plan, group):
        files = real_group(table, plan, group)
        if group is plan.groups[-1]:
            open_table(uri).delete("id = 0")  # fragment 0 is in the first group
        return files

    monkeypatch.setattr(compaction, "compact_group", group_then_concurrent_delete)
    with pytest.raises(CommitConflictError):
        open_table(uri).compact(retries=0)
    assert tree(os.path.join(uri, "data")) == data_before  # no compaction file left
    assert open_table(uri).version == version + 1  # only the delete committed
    assert [v["version"] for v in open_table(uri).versions()][-2:] == [version, version + 1]
    assert read_blobhouse(uri, version) == rows
    after = [r for r in rows if r[0] != 0]
    assert read_blobhouse(uri, version + 1) == after and read_stock(uri, version + 1) == after
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_a_preempted_compaction_runs_again_on_the_new_version(fragmented, monkeypatch):
    """The same race, once: compaction plans again on the version the delete made, rewrites,
    and commits; the deleted row stays deleted and the first attempt leaves no file."""
    uri, rows = fragmented
    version = open_table(uri).version
    real_group = compaction.compact_group
    raced = []

    def group_then_one_concurrent_delete(table, plan, group):
        files = real_group(table, plan, group)
        if not raced and group is plan.groups[-1]:
            raced.append(plan.name_prefix)
            open_table(uri).delete("id = 0")
        return files

    monkeypatch.setattr(compaction, "compact_group", group_then_one_concurrent_delete)
    report = open_table(uri).compact()
    assert report["attempts"] == 2 and report["read_version"] == version + 1
    assert report["version"] == version + 2 and report["fragments_removed"] > 0
    after = [r for r in rows if r[0] != 0]
    assert read_blobhouse(uri, version + 2) == after and read_stock(uri, version + 2) == after
    assert not [p for p in tree(os.path.join(uri, "data")) if raced[0] in p]  # first attempt's
    assert open_table(uri).verify(deep=True)["problems"] == []
    assert open_table(uri).stats()["orphan_files"] == 0


# --- stats account for the bytes compaction and gc reclaim --------------------------------


@PROPERTY_SETTINGS
@given(
    first=PICKS,
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), PICKS),
            st.tuples(st.just("external"), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
            st.tuples(st.just("delete"), FILTERS),
            st.tuples(st.just("overwrite"), PICKS),
        ),
        max_size=7,
    ),
)
def test_stats_account_for_what_compaction_and_gc_reclaim(first, steps):
    """Random appends (stored payloads and ranges of an external object), deletes and
    overwrites: stats' totals are the sums of their lines; after compaction no deleted row
    holds a byte; what stats says older versions and leftovers hold is what gc
    (``retain_versions=1``, no grace) reclaims, in a dry run and for real, and the directory
    loses exactly that; afterwards stats finds nothing left to reclaim."""
    root = tempfile.mkdtemp(prefix="blobhouse-stats-")
    try:
        uri = os.path.join(root, "table")
        media = os.path.join(root, "media")
        os.makedirs(media)
        clip = os.path.join(media, "clip.bin")
        with open(clip, "wb") as f:
            f.write(_rng.randbytes(50_000))
        next_id = 0

        def write(values: list, mode: str) -> None:
            nonlocal next_id
            ids = list(range(next_id, next_id + len(values)))
            next_id += len(values)
            write_table(rows_table(ids, values), uri, mode=mode, allowed_bases=[media])

        write([POOL[p] for p in first], "create")
        for op, arg in steps:
            if op == "append":
                write([POOL[p] for p in arg], "append")
            elif op == "external":
                write([Blob(uri=clip, position=1000 * i, size=2000) for i in arg], "append")
            elif op == "overwrite":
                write([POOL[p] for p in arg], "overwrite")
            else:
                open_table(uri).delete(arg)
            assert_totals_are_the_sum_of_the_lines(open_table(uri).stats())
        open_table(uri).compact()
        stats = open_table(uri).stats()
        assert_totals_are_the_sum_of_the_lines(stats)
        assert stats["deleted_rows_bytes"] == 0 and stats["deleted_rows"] == 0
        assert stats["on_disk_bytes"] == disk_bytes(uri)
        reclaimable = stats["old_versions_bytes"] + stats["orphan_bytes"]
        dry = open_table(uri).gc(retain_versions=1, grace=timedelta(0), dry_run=True)
        before = disk_bytes(uri)
        done = open_table(uri).gc(retain_versions=1, grace=timedelta(0))
        assert done["reclaimed_bytes"] == dry["reclaimed_bytes"]
        # store packs a run retired, a later one reaps (once their tombstone has aged)
        runs = [done]
        while runs[-1]["retired_packs"] and len(runs) < 4:
            runs.append(open_table(uri).gc(retain_versions=1, grace=timedelta(0)))
        assert not runs[-1]["retired_packs"]
        reclaimed = sum(r["reclaimed_bytes"] for r in runs)
        added = sum(r["store_index"]["added_bytes"] for r in runs)
        assert reclaimed == reclaimable and before - disk_bytes(uri) == reclaimed - added
        after = open_table(uri).stats()
        assert (after["old_versions_bytes"], after["orphan_bytes"]) == (0, 0)
        assert after["table_owned_bytes"] == stats["table_owned_bytes"]
        assert open_table(uri).verify(deep=True)["problems"] == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
