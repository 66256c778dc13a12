"""compact: sharing kept or re-established, deleted bytes dropped, row-order packing, external
blobs left as references, one transaction, nothing changed on failure; on Spark too."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import blobhouse.spark as bs
from blobhouse import Blob, CompactionTargets, blob_array, open_table, snapshot, write_table
from blobhouse.cli import main
from blobhouse.commit.runners import Here
from blobhouse.errors import CorruptBlobError
from blobhouse.maintenance.compaction import plan_compaction
from blobhouse.maintenance.versions import fragment_states, opened_states, version_of
from tests.helpers import flip, flip_payload, stock_read, tree

SHARED = os.urandom(300_000)


def append(uri: str, ids: list[int], payloads: list, **kwargs) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})
    write_table(data, uri, mode="append", **kwargs, dedup="content")


@pytest.fixture
def appended(table_uri):
    """Four appends, each holding the shared payload, a unique one and a small one; one row
    deleted. Per-file dedup stored the shared payload four times."""
    unique = [os.urandom(200_000) for _ in range(4)]
    for i in range(4):
        append(table_uri, [3 * i, 3 * i + 1, 3 * i + 2], [SHARED, unique[i], b"tiny-%d" % i])
    table = open_table(table_uri)
    table.delete("id = 4")  # unique[1]
    return open_table(table_uri)


def live_rows(uri: str, version: int | None = None) -> list[tuple[int, bytes]]:
    rows = open_table(uri, version).to_arrow(blobs="bytes").to_pylist()
    return [(r["id"], r["b"]) for r in rows]


def test_compaction_re_establishes_sharing_and_drops_deleted_bytes(appended, table_uri):
    before = live_rows(table_uri)
    stats = appended.stats()
    # live rows only: the shared payload stored in each of 4 files, 3 unique, 4 tiny
    assert stats["physical_bytes"] == 4 * 300_000 + 3 * 200_000 + 4 * len(b"tiny-0")
    read_version = appended.version
    report = appended.compact()
    assert (report["fragments_removed"], report["fragments_added"]) == (4, 1)
    assert report["deleted_rows_dropped"] == 1 and report["version"] == read_version + 1
    assert appended.version == report["version"]  # the table moved to what it committed
    after = open_table(table_uri)
    assert live_rows(table_uri) == before
    assert stock_read(table_uri, "b") == [b for _, b in before]
    unique_live = sum(len(b) for b in {b for _, b in before})
    assert after.stats()["physical_bytes"] <= 1.05 * unique_live
    assert after.stats()["deleted_rows"] == 0
    assert after.verify(deep=True)["problems"] == []
    # the previous version still reads what it read
    assert live_rows(table_uri, appended.version) == before


def test_packed_payloads_follow_the_new_row_order(table_uri):
    payloads = [os.urandom(70_000 + i) for i in range(6)]
    for i in range(3):
        append(table_uri, [2 * i, 2 * i + 1], payloads[2 * i : 2 * i + 2])
    open_table(table_uri).compact()
    refs = open_table(table_uri).to_arrow(blobs="refs").column("b").to_pylist()
    assert len({r["uri"] for r in refs}) == 1  # one pack sidecar
    positions = [r["position"] for r in refs]
    assert positions == sorted(positions) and positions[0] == 0


def test_external_blobs_stay_references(table_uri, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    clip = media / "clip.bin"
    clip.write_bytes(os.urandom(500_000))
    data = pa.table(
        {"id": pa.array([0, 1], pa.int64()), "b": blob_array([Blob(uri=str(clip)), SHARED])}
    )
    write_table(data, table_uri, allowed_bases=[str(media)], dedup="content")
    append(table_uri, [2], [Blob(uri=str(clip), position=10, size=100)])
    before = live_rows(table_uri)
    open_table(table_uri).compact()
    refs = open_table(table_uri).to_arrow(blobs="refs").column("b").to_pylist()
    assert refs[0]["uri"] == refs[2]["uri"] == clip.as_uri()
    assert (refs[2]["position"], refs[2]["size"]) == (10, 100)
    assert live_rows(table_uri) == before
    kinds = open_table(table_uri).stats()["columns"]["b"]["kinds"]
    assert kinds["external"]["rows"] == 2


def test_targets_split_the_output_and_nothing_to_do_commits_nothing(table_uri):
    for i in range(6):
        append(table_uri, [i], [SHARED])
    table = open_table(table_uri)
    report = table.compact(target_rows=4)
    assert (report["fragments_removed"], report["fragments_added"]) == (6, 2)
    after = open_table(table_uri)
    assert [f.metadata.physical_rows for f in after.dataset.get_fragments()] == [4, 2]
    assert after.stats()["physical_bytes"] == 2 * len(SHARED)  # once per new data file
    again = after.compact(target_rows=4)
    assert again["fragments_removed"] == 0
    assert open_table(table_uri).version == after.version


def test_a_failed_compaction_changes_nothing(appended, table_uri):
    # a sidecar the compaction must read is gone: it fails half way through
    victim = sorted(Path(table_uri, "data").rglob("*.blob"))[-1]
    victim.unlink()
    files = tree(table_uri)
    with pytest.raises(OSError):
        appended.compact()
    assert tree(table_uri) == files
    assert open_table(table_uri).version == appended.version


def test_plan_groups_only_adjacent_candidates(table_uri):
    big = [os.urandom(10) for _ in range(8)]
    append(table_uri, [0], [b"a"])
    append(table_uri, list(range(1, 9)), big)
    append(table_uri, [9], [b"b"])
    plan = plan_compaction(open_table(table_uri), CompactionTargets(target_rows=8))
    assert plan.groups == ()  # the small fragments are not adjacent; the big one is full
    open_table(table_uri).delete("id = 1")
    plan = plan_compaction(open_table(table_uri), CompactionTargets(target_rows=8))
    # 1 + 7 live rows fill the target; fragment 2 alone, with nothing deleted, is left alone
    assert [g.fragment_ids for g in plan.groups] == [(0, 1)]


def test_compact_command(appended, table_uri, capsys):
    assert main(["compact", table_uri, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["fragments_added"] == 1
    assert "compact: 1/1" in out.err  # progress on stderr
    assert main(["compact", table_uri]) == 0
    assert "nothing to compact" in capsys.readouterr().out


def test_spark_compact_verify_and_gc(spark, appended, table_uri):
    before = live_rows(table_uri)
    report = bs.compact(spark, table_uri)
    assert (report["fragments_removed"], report["fragments_added"]) == (4, 1)
    assert live_rows(table_uri) == before
    assert stock_read(table_uri, "b") == [b for _, b in before]
    checked = bs.verify(spark, table_uri, deep=True)
    assert checked["problems"] == [] and checked["hashed"] > 0
    assert checked == open_table(table_uri).verify(deep=True)
    collected = bs.gc(spark, table_uri, retain_versions=1)
    assert collected["retained_versions"] == [report["version"]]
    assert live_rows(table_uri) == before
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert lance.dataset(table_uri).count_rows() == len(before)


def test_fragments_lance_rewrote_are_taken_over_once(table_uri):
    for i in range(3):
        append(table_uri, [i], [SHARED])
    lance.dataset(table_uri).optimize.compact_files()  # one fragment, SHARED stored 3 times
    assert open_table(table_uri).stats()["physical_bytes"] == 3 * len(SHARED)
    first = open_table(table_uri).compact()
    assert (first["fragments_removed"], first["fragments_added"]) == (1, 1)
    assert open_table(table_uri).stats()["physical_bytes"] == len(SHARED)
    assert open_table(table_uri).compact()["fragments_removed"] == 0  # now ours: left alone
    assert stock_read(table_uri, "b") == [SHARED] * 3


def test_compaction_refuses_to_copy_damaged_bytes(appended, table_uri):
    refs = appended.to_arrow(blobs="refs").column("b").to_pylist()
    damaged = refs[1]  # a unique 200 kB payload in a pack sidecar
    flip(damaged["uri"], damaged["position"] + 7)
    files = tree(table_uri)
    with pytest.raises(CorruptBlobError, match=r"do not match the blake3 recorded") as error:
        appended.compact()
    assert damaged["uri"] in str(error.value) and "'b'" in str(error.value)
    assert tree(table_uri) == files
    assert open_table(table_uri).version == appended.version


def test_a_compaction_never_retires_a_dead_pack_its_own_rows_found_again(table_uri):
    """A pack no row references (its rows deleted) is dead when compaction plans; rows the
    compaction moves into the store (their column became global) may find their payload in
    it and reference it again: it must not be retired under them (the next write or
    compaction would refuse it as retired by gc, and gc would reap bytes rows read)."""
    from blobhouse.store.packs import retired_packs

    def rows(ids: list[int], payloads: list[bytes]) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})

    shared, other = os.urandom(70_000), os.urandom(70_000)
    write_table(rows([1], [shared]), table_uri, dedup="global")  # a pack of its own
    write_table(rows([2], [other]), table_uri, mode="append")
    open_table(table_uri).delete("id = 1")  # the first pack holds only a dead entry now
    open_table(table_uri).set_properties(dedup="content")
    write_table(rows([3, 4], [shared, shared]), table_uri, mode="append")
    open_table(table_uri).set_properties(dedup="global")  # the content rows move to the store
    open_table(table_uri).compact(target_rows=1)
    table = open_table(table_uri)
    referenced = {
        ref["uri"].rsplit("/", 1)[-1]
        for ref in table.to_arrow(blobs="refs").column("b").to_pylist()
        if ref is not None and "/packs/" in ref["uri"]
    }
    retired = {p.rsplit("/", 1)[-1] for p in retired_packs(table_uri)}
    assert referenced and not referenced & retired
    open_table(table_uri).compact()  # refused before: a pack it references was retired
    assert sorted(open_table(table_uri).read_blobs("b", [0, 1, 2])) == sorted(
        [other, shared, shared]
    )


@pytest.mark.parametrize(
    ("dedup", "indexed"), [("content", False), ("global", False), ("global", True)]
)
def test_a_compaction_reads_its_fragments_a_run_at_a_time(table_uri, monkeypatch, dedup, indexed):
    """Compaction reads the version's fragments a run at a time, each run in a dataset object
    of its own (Lance keeps state for every file a dataset scanned until the dataset goes):
    runs of 2 over 5 fragments lose and repeat nothing (an index's rows remapped too)."""
    monkeypatch.setattr(snapshot, "FRAGMENTS_PER_DATASET", 2)
    payloads = [os.urandom(100_000 + i) for i in range(3)] + [b"tiny"]
    for i in range(5):
        ids = [2 * i, 2 * i + 1]
        data = pa.table({"id": ids, "b": blob_array([payloads[j % 4] for j in ids])})
        write_table(data, table_uri, mode="append", dedup=dedup)
    if indexed:
        lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    table = open_table(table_uri)
    table.delete("id = 3")
    before = live_rows(table_uri)
    report = table.compact()
    assert (report["fragments_removed"], report["fragments_added"]) == (5, 1)
    assert report["rows"] == 9 and report["deleted_rows_dropped"] == 1
    assert live_rows(table_uri) == before
    assert stock_read(table_uri, "b") == [b for _, b in before]
    if indexed:  # the index still finds each row, through its remapped addresses
        found = lance.dataset(table_uri).to_table(columns=["id"], filter="id >= 8")
        assert sorted(found.column("id").to_pylist()) == [8, 9]
        assert lance.dataset(table_uri).describe_indices()
    open_table(table_uri).gc(older_than=timedelta(0), grace=timedelta(0), retain_versions=1)
    after = open_table(table_uri)
    assert live_rows(table_uri) == before
    assert after.verify(deep=True)["problems"] == []
    assert after.stats()["physical_bytes"] <= 1.05 * sum(len(p) for p in payloads)


def test_a_walk_over_one_versions_fragments_reopens_it_every_run(table_uri, monkeypatch):
    """verify, gc, stats and merges walk fragments a run at a time, and open the version again
    for every run of FRAGMENTS_PER_DATASET fragments (here 2, over 5 fragments of one write):
    each finds what it finds in one pass."""
    monkeypatch.setattr(snapshot, "FRAGMENTS_PER_DATASET", 2)
    payloads = [os.urandom(100_000 + i) for i in range(10)]
    table = write_table(
        pa.table({"id": range(10), "b": blob_array(payloads)}), table_uri, max_rows_per_file=2
    )
    states = fragment_states(table.snapshot)
    assert len(states) == 5
    opened = [id(at.dataset) for at, _ in opened_states(table.snapshot, states)]  # gc's walk
    assert len(set(opened)) == 3 and opened[0] == opened[1] != opened[2] == opened[3]
    by_runner: list = []  # verify's walk
    Here().map(table.snapshot, lambda at, _: by_runner.append(at.dataset), states, "", version_of)
    assert len({id(d) for d in by_runner}) == 3 and by_runner[1] is not by_runner[2]
    checked = table.verify(deep=True)
    assert checked["problems"] == [] and checked["references"] == 10
    stats = table.stats()  # its scans too, by runs
    assert stats["logical_bytes"] == stats["physical_bytes"] == sum(map(len, payloads))
    # a merge matches keys in every run: rows 1 (first run) and 8 (last) updated, 10 added
    source = pa.table({"id": [1, 8, 10], "b": blob_array([payloads[0], payloads[0], b"new"])})
    merged = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    result = merged.execute(source)
    assert (result.num_updated_rows, result.num_inserted_rows) == (2, 1)
    payloads[1] = payloads[8] = payloads[0]
    payloads.append(b"new")
    open_table(table_uri).gc(older_than=timedelta(0), grace=timedelta(0))
    assert sorted(live_rows(table_uri)) == list(enumerate(payloads))  # gc kept every payload
    flip_payload(table_uri, "b", 7)  # in the walk's third run, of a reopened dataset
    problems = open_table(table_uri).verify(deep=True)["problems"]
    assert {p["row"] for p in problems} == {7}  # the row, and the store's entry of its bytes
    assert any("content hash mismatch" in p["reason"] for p in problems)
