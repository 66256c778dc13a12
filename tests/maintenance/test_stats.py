"""stats: the totals are the sums of the lines (external references included, and told apart
from what the table stores), and the bytes on disk no current row needs are accounted for:
rows deleted but still stored, older versions, leftovers."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import Blob, blob_array, open_table, write_table
from blobhouse.cli import main
from tests.helpers import assert_totals_are_the_sum_of_the_lines, disk_bytes, media_file

PAYLOADS = [os.urandom(300_000) for _ in range(4)]


@pytest.fixture
def media(tmp_path):
    return media_file(tmp_path, "clip.mp4", 1_000_000)


def test_a_table_of_external_references_says_what_it_references_and_stores(table_uri, media):
    folder, clip = media
    values = [Blob(uri=clip)] * 60 + [Blob(uri=clip, position=10, size=100)]
    write_table(pa.table({"video": blob_array(values)}), table_uri, allowed_bases=[folder])
    stats = open_table(table_uri).stats()
    assert_totals_are_the_sum_of_the_lines(stats)
    assert stats["logical_bytes"] == 60 * 1_000_000 + 100  # what rows reference, as the lines
    assert stats["external_bytes"] == stats["physical_bytes"] == 1_000_100  # distinct ranges
    assert stats["table_owned_bytes"] == 0  # the table stores none of it
    external = stats["columns"]["video"]["kinds"]["external"]
    assert (external["rows"], external["logical_bytes"], external["table_owned"]) == (
        61,
        60_000_100,
        False,
    )
    assert stats["on_disk_bytes"] == disk_bytes(table_uri) < 100_000
    assert main(["stats", table_uri, "--json"]) == 0


def test_a_mixed_table_keeps_stored_and_external_apart(table_uri, media):
    folder, clip = media
    values = [PAYLOADS[0], PAYLOADS[0], b"tiny", Blob(uri=clip), None]
    write_table(pa.table({"b": blob_array(values)}), table_uri, allowed_bases=[folder])
    stats = open_table(table_uri).stats()
    assert_totals_are_the_sum_of_the_lines(stats)
    assert stats["logical_bytes"] == 600_000 + 4 + 1_000_000
    assert stats["table_owned_bytes"] == 300_000 + 4
    assert stats["external_bytes"] == 1_000_000


def test_deleted_rows_bytes_are_what_only_deleted_rows_hold(table_uri, media):
    """A deleted row's payload counts unless a live row shares it; external references free
    nothing; compaction moves the bytes to old versions, gc removes them."""
    folder, clip = media
    ids = pa.array(range(8), pa.int64())
    values = [*PAYLOADS[:1], PAYLOADS[0], PAYLOADS[1], PAYLOADS[2], PAYLOADS[3], b"tiny"]
    values += [Blob(uri=clip), Blob(uri=clip)]
    data = pa.table({"id": ids, "b": blob_array(values)})
    write_table(data, table_uri, allowed_bases=[folder], max_rows_per_file=4, dedup="content")
    assert open_table(table_uri).stats()["deleted_rows_bytes"] == 0
    # 0 shares its payload with 1 (live), 2 is the only row of its payload, 5 is inline,
    # 6 references the user's clip
    open_table(table_uri).delete("id IN (0, 2, 5, 6)")
    stats = open_table(table_uri).stats()
    assert_totals_are_the_sum_of_the_lines(stats)
    assert stats["deleted_rows"] == 4
    assert stats["deleted_rows_bytes"] == 300_000 + len(b"tiny")
    assert stats["table_owned_bytes"] == 3 * 300_000  # the live rows' payloads
    assert stats["old_versions_bytes"] < 5_000  # version 1's manifest: its files are shared
    open_table(table_uri).compact()
    compacted = open_table(table_uri).stats()
    assert compacted["deleted_rows_bytes"] == 0 and compacted["deleted_rows"] == 0
    assert compacted["table_owned_bytes"] == 3 * 300_000
    # the files written before compaction: only versions 1 and 2 use them now
    assert compacted["old_versions_bytes"] > 1_200_000
    assert compacted["on_disk_bytes"] == disk_bytes(table_uri)
    dry = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0), dry_run=True)
    assert compacted["old_versions_bytes"] == dry["reclaimed_bytes"]
    before = disk_bytes(table_uri)
    done = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert done["reclaimed_bytes"] == before - disk_bytes(table_uri) == dry["reclaimed_bytes"]
    after = open_table(table_uri).stats()
    assert (after["old_versions_bytes"], after["orphan_bytes"]) == (0, 0)
    assert after["on_disk_bytes"] == disk_bytes(table_uri)


def test_old_versions_bytes_are_what_gc_may_remove(table_uri):
    """The files of an overwritten version count, unless a tag keeps that version."""
    write_table(pa.table({"b": blob_array(PAYLOADS[:2])}), table_uri)
    write_table(pa.table({"b": blob_array([b"new"])}), table_uri, mode="overwrite")
    stats = open_table(table_uri).stats()
    assert 600_000 < stats["old_versions_bytes"] < 610_000  # data file, sidecar, manifest
    assert stats["table_owned_bytes"] == 3
    assert stats["on_disk_bytes"] == disk_bytes(table_uri)
    lance.dataset(table_uri).tags.create("keep", 1)
    assert open_table(table_uri).stats()["old_versions_bytes"] == 0  # gc keeps it
    lance.dataset(table_uri).tags.delete("keep")
    assert open_table(table_uri).stats()["old_versions_bytes"] == stats["old_versions_bytes"]


def test_old_versions_bytes_count_store_packs_only_old_versions_reference(table_uri):
    write_table(pa.table({"b": blob_array(PAYLOADS[:2])}), table_uri, dedup="global")
    write_table(
        pa.table({"b": blob_array([PAYLOADS[1]])}), table_uri, mode="overwrite", dedup="content"
    )
    stats = open_table(table_uri).stats()
    # the new version stores its payload anew in a pack of its own (content dedup) and the
    # first pack is only the old version's; retired by a first gc, reaped by a later one
    assert stats["old_versions_bytes"] > 600_000
    assert stats["columns"]["b"]["kinds"]["packed"]["physical_bytes"] == 300_000


def test_stats_on_a_branch_counts_the_branch(table_uri):
    write_table(pa.table({"b": blob_array(PAYLOADS[:2])}), table_uri)
    lance.dataset(table_uri).create_branch("exp", 1)
    write_table(pa.table({"b": blob_array([b"x"])}), table_uri, mode="overwrite", branch="exp")
    branch = open_table(table_uri, branch="exp").stats()
    assert_totals_are_the_sum_of_the_lines(branch)
    assert branch["table_owned_bytes"] == 1
    # version 1 of the branch is its parent's files: gc on the branch frees only its manifest
    assert branch["old_versions_bytes"] < 5_000
    main_stats = open_table(table_uri).stats()
    assert main_stats["table_owned_bytes"] == 600_000 and main_stats["old_versions_bytes"] == 0


def lance_answer(table) -> dict[str, int]:
    """Lance's own explanation of ``cleanup_old_versions(retain_versions=1)``: the files that
    only removed versions use (no leftovers), by path."""
    from blobhouse.maintenance.garbage_collection import explain_version_cleanup

    cleanup = explain_version_cleanup(table.snapshot, 1, None)
    return {p: n for p, n in cleanup.files.items() if p not in cleanup.unverified}


@pytest.mark.parametrize("branch", [None, "exp"])
def test_old_versions_files_are_lances_own_answer_told_without_asking_lance(
    table_uri, monkeypatch, branch
):
    """Stats tells the files gc's cleanup of old versions removes (manifests, transaction and
    deletion files, data files) from a listing and each version's last manifest bytes, without
    Lance's explanation, which reads every manifest whole (8x the time a fragment at 10,000
    versions): Lance's files exactly, whatever the history did (appends, deletes that replace
    a deletion file, pylance's update and compaction, a tag), on main and on a branch. The
    payloads are inline: no sidecar or pack adds to what Lance names."""
    from blobhouse.maintenance.garbage_collection import reclaimable

    def append(n: int) -> None:
        data = pa.table({"id": [2 * n, 2 * n + 1], "b": blob_array([os.urandom(100)] * 2)})
        write_table(
            data, table_uri, mode="append" if n else "create", branch=branch if n > 3 else None
        )

    for n in range(4):
        append(n)
    lance.dataset(table_uri).create_branch("exp", 4)
    append(4)
    table = open_table(table_uri, branch=branch)
    table.delete("id = 0")
    table.delete("id = 1 OR id = 2")  # the same fragment's deletion file, replaced
    dataset = lance.dataset(table_uri)
    if branch:
        dataset = dataset.checkout_version((branch, None))
    dataset.update({"id": "id + 100"}, where="id = 3")
    append(5)
    dataset = (
        lance.dataset(table_uri) if branch is None else dataset.checkout_version((branch, None))
    )
    dataset.optimize.compact_files()
    append(6)
    lance.dataset(table_uri).tags.create("gold", (branch or "main", 6 if branch else 2))
    table = open_table(table_uri, branch=branch)
    expected = lance_answer(table)
    assert any("_deletions/" in p for p in expected) and any(
        "_transactions/" in p for p in expected
    )
    monkeypatch.setattr(
        lance.LanceDataset,
        "explain_cleanup_old_versions",
        lambda *a, **k: pytest.fail("stats asked Lance to explain the cleanup"),
    )
    told = reclaimable(table.snapshot)
    assert (told["old_versions_files"], told["old_versions_bytes"]) == (
        len(expected),
        sum(expected.values()),
    )
    stats = table.stats()
    done = open_table(table_uri, branch=branch).gc(retain_versions=1, grace=timedelta(0))
    assert done["reclaimed_bytes"] == stats["old_versions_bytes"] + stats["orphan_bytes"]


def test_old_versions_files_of_a_table_with_an_index_are_lances_answer(table_uri):
    """Index files: which versions use them is Lance's to tell (stats asks it)."""
    from blobhouse.maintenance.garbage_collection import reclaimable

    for n in range(3):
        data = pa.table({"id": [n], "b": blob_array([os.urandom(100)])})
        write_table(data, table_uri, mode="append" if n else "create")
        if n == 1:
            lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    table = open_table(table_uri)
    expected = lance_answer(table)
    told = reclaimable(table.snapshot)
    assert (told["old_versions_files"], told["old_versions_bytes"]) == (
        len(expected),
        sum(expected.values()),
    )


def test_old_versions_stats_read_each_manifest_tail_once_and_a_remade_table_afresh(
    table_uri, monkeypatch
):
    """Stats asks each removed version's transaction name twice (what it appended, then its
    files): the manifest's last bytes are read once (a request each on an object store). A
    table removed and made again at the same place, same shapes, in the same process is told
    afresh: Lance's answer both times."""
    import shutil

    from blobhouse.files import transactions
    from blobhouse.maintenance.garbage_collection import reclaimable

    def make() -> None:
        for n in range(4):
            data = pa.table({"id": [n], "b": blob_array([os.urandom(100)])})
            write_table(data, table_uri, mode="append" if n else "create")

    make()
    reads = []
    named = transactions._named
    monkeypatch.setattr(transactions, "_named", lambda *a: reads.append(bytes(a[0])) or named(*a))
    for attempt in range(2):
        table = open_table(table_uri)
        expected = lance_answer(table)
        reads.clear()
        told = reclaimable(table.snapshot)
        assert (told["old_versions_files"], told["old_versions_bytes"]) == (
            len(expected),
            sum(expected.values()),
        )
        if attempt == 0:
            assert reads and len(reads) == len(set(reads))
        shutil.rmtree(table_uri)
        make()


def test_stats_command_prints_every_key(table_uri, capsys):
    write_table(pa.table({"b": blob_array(PAYLOADS[:1])}), table_uri)
    assert main(["stats", table_uri, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    for key in ("deleted_rows_bytes", "old_versions_bytes", "on_disk_bytes", "table_owned_bytes"):
        assert key in printed
