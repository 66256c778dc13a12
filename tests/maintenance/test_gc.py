"""gc: old versions and unreferenced files go, after the grace period; nothing referenced, and
nothing outside the table's data directory, is ever removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import Blob, BlobhouseError, TableNotFoundError, blob_array, open_table, write_table
from blobhouse.cli import main
from blobhouse.layout import TableLocation
from blobhouse.maintenance.garbage_collection import clean_failed_create, gc_at
from blobhouse.write.pipeline import plan_write, write_data_files
from tests.helpers import aged, disk_bytes, set_age, stock_read, tree


def expire_leases(root: str) -> None:
    """Let the leases of the writes so far expire (as 30 s without a touch would)."""
    set_age([os.path.join(root, p) for p in tree(root) if p.startswith("_leases/")], hours=1)


@pytest.fixture
def with_leftovers(table_uri):
    payloads = [os.urandom(200_000), os.urandom(10)]
    table = write_table(pa.table({"b": blob_array(payloads)}), table_uri)
    staged = pa.table({"b": blob_array([os.urandom(300_000)])})
    write_data_files(staged.to_batches(), plan_write(staged.schema), TableLocation(table_uri))
    return table, payloads


def test_leftovers_are_kept_during_the_grace_period_then_removed(with_leftovers, table_uri):
    table, payloads = with_leftovers
    before = tree(table_uri)
    report = table.gc()
    assert (report["removed_files"], report["kept_young_files"]) == (0, 2)
    assert tree(table_uri) == before
    # while the write is fresh, files without its prefix that are younger are its own for gc
    assert open_table(table_uri).gc(dry_run=True, grace=timedelta(0))["kept_leased_files"] == 2
    expire_leases(table_uri)
    unreferenced = open_table(table_uri).gc(dry_run=True, grace=timedelta(0))["paths"]
    assert len(unreferenced) == 2  # the staged data file and its sidecar
    set_age(unreferenced, hours=48)
    dry = open_table(table_uri).gc(dry_run=True)
    assert dry["removed_files"] == 2 and tree(table_uri) == before
    done = open_table(table_uri).gc()
    assert done["removed_files"] == 2 and done["reclaimed_bytes"] >= 300_000
    assert open_table(table_uri).stats()["orphan_files"] == 0
    assert stock_read(table_uri, "b") == payloads
    assert open_table(table_uri).verify()["problems"] == []


def test_gc_leaves_a_users_files_in_the_tables_folders_alone(table_uri):
    """gc sweeps only the files Lance and blobhouse name (data files, sidecars, packs): a file
    a user put in ``data/`` or a branch's data folder is listed as foreign and kept."""
    payloads = [os.urandom(200_000), os.urandom(10)]
    write_table(pa.table({"b": blob_array(payloads)}), table_uri, dedup="global")
    lance.dataset(table_uri).create_branch("relabel")
    users = ["data/notes.txt", "data/photos/cat.jpg", "_blobs/packs/readme.md"]
    users.append("tree/relabel/data/labels.csv")
    for name in users:
        os.makedirs(os.path.dirname(os.path.join(table_uri, name)), exist_ok=True)
        with open(os.path.join(table_uri, name), "wb") as f:
            f.write(name.encode())
    aged(table_uri, hours=48)
    assert open_table(table_uri).stats()["orphan_files"] == 0
    for dry_run in (True, False):
        report = open_table(table_uri).gc(grace=timedelta(0), dry_run=dry_run)
        assert report["foreign_files"] == sorted(os.path.join(table_uri, n) for n in users)
        assert report["removed_files"] == 0
    for name in users:
        with open(os.path.join(table_uri, name), "rb") as f:
            assert f.read() == name.encode()
    assert stock_read(table_uri, "b") == payloads


def test_old_versions_go_and_what_is_referenced_stays(table_uri, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "clip.bin").write_bytes(b"z" * 1000)
    first = [os.urandom(300_000), Blob(uri=str(media / "clip.bin"))]
    write_table(
        pa.table({"b": blob_array(first)}), table_uri, allowed_bases=[str(media)], dedup="content"
    )
    second = [os.urandom(200_000)]
    write_table(pa.table({"b": blob_array(second)}), table_uri, mode="overwrite", dedup="content")
    table = open_table(table_uri)
    report = table.gc(retain_versions=1, grace=timedelta(0))
    assert report["removed_versions"] == [1]
    assert [v["version"] for v in open_table(table_uri).versions()] == [2]
    assert stock_read(table_uri, "b") == second
    assert (media / "clip.bin").read_bytes() == b"z" * 1000  # the user's object is untouched
    stats = open_table(table_uri).stats()
    assert stats["orphan_files"] == 0
    assert stats["physical_bytes"] == 200_000


def test_gc_command(with_leftovers, table_uri, capsys):
    assert main(["gc", table_uri, "--dry-run"]) == 0
    assert (
        "would remove versions none and 0 files no retained version uses" in capsys.readouterr().out
    )
    expire_leases(table_uri)
    assert main(["gc", table_uri, "--grace-hours", "0", "--json"]) == 0
    assert '"removed_files": 2' in capsys.readouterr().out
    write_table(pa.table({"b": blob_array([b"new"])}), table_uri, mode="overwrite")
    assert main(["gc", table_uri, "--retain-versions", "1", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed_versions"] == [1]
    for _ in range(3):
        write_table(pa.table({"b": blob_array([b"more"])}), table_uri, mode="append")
    assert main(["verify", table_uri]) == 0
    assert "references in versions 1-5;" in capsys.readouterr().out  # runs, not every number
    assert main(["gc", table_uri, "--retain-versions", "1", "--dry-run"]) == 0
    assert "would remove versions 1-4 and" in capsys.readouterr().out


def test_gc_reports_what_lance_cleanup_removed_with_the_versions(table_uri):
    """The bytes of removed versions are counted too (Lance's cleanup deletes their files)."""
    for _ in range(3):
        data = pa.table({"b": blob_array([os.urandom(200_000), os.urandom(1_000)])})
        write_table(data, table_uri, mode="append")
    open_table(table_uri).delete("true")  # every row gone: the old files only old versions use
    before = disk_bytes(table_uri)
    report = open_table(table_uri).gc(retain_versions=1, grace=timedelta(hours=1))
    freed = before - disk_bytes(table_uri)
    assert report["removed_by_lance_cleanup"]["files"] >= 3
    assert report["reclaimed_bytes"] == freed


def build_history(uri: str, dedup: str) -> None:
    """Appends, a tag, a branch, a delete, a compaction and a write that never committed:
    versions and files of every sort for Lance's cleanup and the sweep to remove."""
    for i in range(4):
        payloads = [os.urandom(300_000), os.urandom(70_000)]
        data = pa.table({"id": pa.array([i, i + 10], pa.int64()), "b": blob_array(payloads)})
        write_table(data, uri, mode="append", dedup=dedup)
    lance.dataset(uri).tags.create("gold", 2)
    lance.dataset(uri).create_branch("exp", 3)
    extra = pa.table({"id": pa.array([99], pa.int64()), "b": blob_array([os.urandom(100_000)])})
    write_table(extra, uri, mode="append", branch="exp", dedup=dedup)
    open_table(uri).delete("id < 2")
    open_table(uri).compact()
    staged = pa.table({"b": blob_array([os.urandom(300_000)])})
    write_data_files(staged.to_batches(), plan_write(staged.schema), TableLocation(uri))


def sizes(root: str) -> dict[str, int]:
    """Files and their sizes; leases (a write's start, not table data) are left out."""
    return {
        p: os.path.getsize(os.path.join(root, p))
        for p in tree(root)
        if not p.startswith("_leases/")
    }


SAME_IN_BOTH = (
    "removed_versions",
    "retained_versions",
    "kept_tagged_versions",
    "removed_files",
    "reclaimed_bytes",
    "removed_by_lance_cleanup",
    "removed_by_sweep",
    "store_index",
    "paths",
    "kept_young_files",
    "retired_packs",
    "reaped_packs",
    "resurrected_packs",
    "expired_leases",
)


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_dry_run_lists_exactly_what_the_real_run_removes(table_uri, dedup):
    """Versions (Lance's rules: the latest, tagged versions and a branch's parent are kept),
    files (Lance's and the sweep's, none twice) and bytes, the same in a dry run and in the
    run that follows; the bytes are what the directory lost."""
    build_history(table_uri, dedup)
    aged(table_uri, hours=48, folders=False)
    removed = []
    for branch, kwargs in [
        (None, {"retain_versions": 1}),
        (None, {"older_than": timedelta(0), "grace": timedelta(0)}),
        ("exp", {"retain_versions": 1}),
    ]:
        before = sizes(table_uri)
        dry = open_table(table_uri, branch=branch).gc(dry_run=True, **kwargs)
        assert sizes(table_uri) == before  # a dry run changes nothing
        done = open_table(table_uri, branch=branch).gc(**kwargs)
        assert {k: dry[k] for k in SAME_IN_BOTH} == {k: done[k] for k in SAME_IN_BOTH}
        after = sizes(table_uri)
        gone = {p for p in before.keys() - after.keys() if not p.startswith("_leases/")}
        gone -= {p for p in gone if p.startswith("_blobs/tombstones/")}  # empty markers
        assert sorted(os.path.join(table_uri, p) for p in gone) == done["paths"]
        assert done["removed_files"] == len(gone) == len(set(done["paths"]))
        assert done["reclaimed_bytes"] == sum(before.values()) - sum(after.values())
        assert done["reclaimed_bytes"] == (
            done["removed_by_lance_cleanup"]["bytes"]
            + done["removed_by_sweep"]["bytes"]
            + done["store_index"]["removed_bytes"]
        )
        removed.append(done["removed_versions"])
    assert removed == [[1, 4, 5], [], [3]]  # main's, then the branch's
    main_versions = [v["version"] for v in open_table(table_uri).versions()]
    assert 2 in main_versions and 3 in main_versions  # tagged, and the branch's parent
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_the_first_dry_run_names_the_versions_lance_would_remove(table_uri):
    for _ in range(4):
        write_table(pa.table({"b": blob_array([os.urandom(100_000)])}), table_uri, mode="append")
    lance.dataset(table_uri).tags.create("keep", 2)
    dry = open_table(table_uri).gc(retain_versions=1, dry_run=True)
    assert dry["removed_versions"] == [1, 3] and dry["retained_versions"] == [2, 4]
    assert dry["kept_tagged_versions"] == [2]
    manifests = [p for p in dry["paths"] if "_versions" in p]
    assert len(manifests) == 2  # the manifests of versions 1 and 3
    assert [v["version"] for v in open_table(table_uri).versions()] == [1, 2, 3, 4]
    done = open_table(table_uri).gc(retain_versions=1)
    assert done["removed_versions"] == [1, 3] and done["paths"] == dry["paths"]


def test_versions_kept_only_for_a_tag_are_reported_when_none_is_removed(table_uri):
    """Every version beyond the retention is tagged: nothing is removed, and the report says
    which versions the tags kept (it said none)."""
    for _ in range(3):
        write_table(pa.table({"b": blob_array([os.urandom(1000)])}), table_uri, mode="append")
    for version in (1, 2):
        lance.dataset(table_uri).tags.create(f"v{version}", version)
    for dry_run in (True, False):
        report = open_table(table_uri).gc(retain_versions=1, dry_run=dry_run)
        assert report["removed_versions"] == []
        assert report["kept_tagged_versions"] == [1, 2]
    assert open_table(table_uri).gc()["kept_tagged_versions"] == []  # no retention asked


def test_a_version_a_branch_was_made_from_is_reported_as_kept(table_uri):
    for _ in range(6):
        write_table(pa.table({"b": blob_array([os.urandom(50_000)])}), table_uri, mode="append")
    lance.dataset(table_uri).create_branch("exp", 3)
    write_table(
        pa.table({"b": blob_array([os.urandom(50_000)])}), table_uri, branch="exp", mode="append"
    )
    lance.dataset(table_uri).tags.create("gold", 2)
    dry = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0), dry_run=True)
    done = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    for report in (dry, done):
        assert report["retained_versions"] == [2, 3, 6]
        assert report["kept_tagged_versions"] == [2, 3]  # the tag's, and the branch point
    # on the branch, its own versions are not main's branch points
    assert open_table(table_uri, branch="exp").gc(retain_versions=1)["kept_tagged_versions"] == []


def test_a_retired_pack_waits_for_its_tombstone_and_is_counted_once(table_uri):
    """A pack gc retired is deleted only once its tombstone is past the grace period (a gc run
    in between keeps it), and the run that reaps it counts it once."""
    first = pa.table({"b": blob_array([os.urandom(300_000)])})
    write_table(first, table_uri, dedup="global")
    write_table(
        pa.table({"b": blob_array([os.urandom(1_000)])}),
        table_uri,
        mode="overwrite",
        dedup="content",
    )
    aged(table_uri, hours=48, folders=False)
    retired = open_table(table_uri).gc(retain_versions=1)
    assert (retired["retired_packs"], retired["reaped_packs"]) == (1, 0)
    packs = os.path.join(table_uri, "_blobs", "packs")
    (pack,) = os.listdir(packs)
    again = open_table(table_uri).gc()  # the tombstone is young
    assert os.listdir(packs) == [pack] and again["removed_files"] == 0
    assert again["kept_retired_packs"] == 1 and again["kept_young_files"] == 0
    aged(table_uri, hours=48, folders=False)
    before = disk_bytes(table_uri)
    dry = open_table(table_uri).gc(dry_run=True)
    reaped = open_table(table_uri).gc()
    assert reaped["reaped_packs"] == 1 and os.listdir(packs) == []
    assert reaped["paths"] == dry["paths"] == [os.path.join(packs, pack)]
    assert reaped["removed_files"] == 1
    assert reaped["reclaimed_bytes"] == dry["reclaimed_bytes"] == 300_000
    assert before - disk_bytes(table_uri) == 300_000


# --- a create that never committed --------------------------------------------------------

CREATE_THEN_HANG = r"""
import os, sys, time
import pyarrow as pa
from blobhouse import blob_array, write_table

def batches():
    for i in range(3):
        payload = blob_array([os.urandom(300_000), os.urandom(100)])
        yield pa.table({"id": pa.array([i, i], pa.int64()), "b": payload}).to_batches()[0]
    print("staged", flush=True)
    time.sleep(600)  # killed here, in the middle of the create

write_table(batches(), sys.argv[1], dedup=sys.argv[2], max_rows_per_file=2)
"""


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_gc_cleans_what_a_killed_create_left(table_uri, dedup, capsys):
    process = subprocess.Popen(
        [sys.executable, "-c", CREATE_THEN_HANG, table_uri, dedup],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "staged"
    finally:
        process.kill()
        process.wait(timeout=60)
        process.stdout.close()
    left = tree(table_uri)
    staged = sorted(p for p in left if not p.startswith("_leases/"))
    assert len(staged) >= 4 and not any(p.startswith("_versions") for p in left)
    assert any(p.startswith("_blobs/packs/") for p in staged) == (dedup == "global")
    with pytest.raises(TableNotFoundError):
        open_table(table_uri)
    # the killed write's lease is still fresh: its files are kept, whatever the grace
    assert main(["gc", table_uri, "--grace-hours", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed_create"] and report["removed_files"] == 0
    assert report["kept_leased_files"] == len(staged) and tree(table_uri) == left
    aged(table_uri, hours=2, folders=False)  # the lease expired long ago; the files are 2 hours old
    young = gc_at(table_uri)  # the default grace: a day
    assert (young["removed_files"], young["kept_young_files"]) == (0, len(staged))
    dry = gc_at(table_uri, grace=timedelta(hours=1), dry_run=True)
    assert dry["paths"] == [os.path.join(table_uri, p) for p in staged]
    assert dry["reclaimed_bytes"] == sum(os.path.getsize(p) for p in dry["paths"])
    assert tree(table_uri) == left
    assert main(["gc", table_uri, "--grace-hours", "1"]) == 0
    assert "leftovers of a failed create" in capsys.readouterr().out
    assert not os.path.exists(table_uri)  # it held nothing else
    with pytest.raises(TableNotFoundError, match="no leftovers"):
        gc_at(table_uri)
    assert main(["gc", table_uri]) == 2
    assert "no table at" in capsys.readouterr().err
    table = write_table(pa.table({"b": blob_array([b"x" * 70_000])}), table_uri, dedup=dedup)
    assert table.verify(deep=True)["problems"] == []


def test_cleaning_a_failed_create_leaves_foreign_files_and_names_them(table_uri):
    data = pa.table({"b": blob_array([os.urandom(200_000)])})
    write_data_files(
        data.to_batches(), plan_write(data.schema), TableLocation(table_uri), None, "0123456789ab-"
    )
    for foreign in ("notes.txt", "data/mine.lance", "_blobs/packs/x.pack"):
        os.makedirs(os.path.dirname(os.path.join(table_uri, foreign)), exist_ok=True)
        with open(os.path.join(table_uri, foreign), "wb") as f:
            f.write(b"mine")
    aged(table_uri, hours=2, folders=False)
    report = clean_failed_create(table_uri, grace=timedelta(hours=1))
    assert report["removed_files"] == 2  # the data file and its sidecar
    assert report["expired_leases"] == 1
    foreign = ["_blobs/packs/x.pack", "data/mine.lance", "notes.txt"]
    assert report["foreign_files"] == [os.path.join(table_uri, p) for p in foreign]
    assert sorted(tree(table_uri)) == foreign
    for path in foreign[1:]:
        os.remove(os.path.join(table_uri, path))
    with pytest.raises(TableNotFoundError, match="1 files there are not blobhouse's"):
        gc_at(table_uri)
    assert tree(table_uri) == {"_blobs/packs/x.pack"}


def test_cleaning_a_failed_create_removes_lances_temporary_files_once_no_write_runs(table_uri):
    """A Spark task cancelled mid-file leaves Lance's temporary file (``data/.tmp*``, no
    write id): kept while a write that started before it runs, removed after, not foreign."""
    data = pa.table({"b": blob_array([os.urandom(200_000)])})
    write_data_files(
        data.to_batches(), plan_write(data.schema), TableLocation(table_uri), None, "0123456789ab-"
    )
    temporary = os.path.join(table_uri, "data", ".tmpXxDGQ1")
    with open(temporary, "wb") as f:
        f.write(b"half a data file")
    time.sleep(0.01)
    report = clean_failed_create(table_uri, grace=timedelta(0))  # its write may still run
    assert (report["removed_files"], report["kept_leased_files"]) == (0, 3)
    assert report["foreign_files"] == [] and os.path.exists(temporary)
    aged(table_uri, hours=2, folders=False)  # and now it has ended (its lease expired)
    report = clean_failed_create(table_uri, grace=timedelta(hours=1))
    assert (report["removed_files"], report["kept_leased_files"]) == (3, 0)
    assert os.path.join(table_uri, "data", ".tmpXxDGQ1") in report["paths"]
    assert not os.path.exists(table_uri)
    # alone, such a name in a project's data/ folder is the project's own: never removed
    os.makedirs(os.path.join(table_uri, "data"))
    with open(temporary, "wb") as f:
        f.write(b"a user's file")
    aged(table_uri, hours=2, folders=False)
    with pytest.raises(TableNotFoundError, match="1 files there are not blobhouse's"):
        clean_failed_create(table_uri, grace=timedelta(hours=1))
    assert os.path.exists(temporary)


def test_cleaning_a_failed_create_refuses_a_table(table_uri):
    write_table(pa.table({"b": blob_array([b"x"])}), table_uri)
    with pytest.raises(BlobhouseError, match="_versions"):
        clean_failed_create(table_uri, grace=timedelta(0))
    assert open_table(table_uri).count_rows() == 1


def test_gc_keeps_the_empty_sidecar_folder_of_a_running_write(table_uri):
    """A write makes a data file's sidecar folder, then its first sidecar: gc between the two
    removed the empty folder, and the write failed (FileNotFoundError in a concurrency test).
    A folder of a running write, or younger than the grace, stays; a stale one goes."""
    from blobhouse.commit import leases

    write_table(pa.table({"id": [1]}), table_uri)
    folders = {
        name: os.path.join(table_uri, "data", f"write-{name * 12}-{name * 32}") for name in "abc"
    }
    with leases.held(table_uri, "write-aaaaaaaaaaaa-"):  # a: its write runs
        for folder in folders.values():
            os.makedirs(folder)
        set_age([folders["a"], folders["b"]], 2)  # b: older than the grace, no write
        open_table(table_uri).gc(grace=timedelta(hours=1))  # c: younger than the grace
        assert [os.path.isdir(f) for f in folders.values()] == [True, False, True]


def test_gc_foresees_the_versions_lance_removes_without_asking_lance(table_uri, monkeypatch):
    """A real gc foresees the versions Lance's cleanup removes from one listing of the
    manifests (Lance's explanation reads every manifest: as long as the cleanup itself at
    2,000 versions); the foresight is Lance's answer, tags and a branch's parent kept, on
    main and on a branch, by count and by age. Only a dry run, which reports the files too,
    asks Lance."""
    from blobhouse.maintenance.garbage_collection import explain_version_cleanup, versions_to_clean

    for _ in range(6):
        write_table(pa.table({"b": blob_array([os.urandom(5_000)])}), table_uri, mode="append")
    lance.dataset(table_uri).create_branch("exp", 3)
    for _ in range(3):
        write_table(
            pa.table({"b": blob_array([os.urandom(5_000)])}), table_uri, branch="exp", mode="append"
        )
    lance.dataset(table_uri).tags.create("gold", 2)
    lance.dataset(table_uri).tags.create("exp-gold", ("exp", 5))
    for branch in (None, "exp"):
        table = open_table(table_uri, branch=branch).snapshot
        for retain, older in [(1, None), (2, None), (None, timedelta(0)), (3, timedelta(0))]:
            foreseen = versions_to_clean(table, retain, older)
            assert foreseen == explain_version_cleanup(table, retain, older).versions
            assert foreseen  # each case removes some
    monkeypatch.setattr(
        lance.LanceDataset,
        "explain_cleanup_old_versions",
        lambda *a, **k: pytest.fail("a real gc asked Lance to explain its cleanup"),
    )
    done = open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
    assert done["removed_versions"] == [1, 4, 5] and done["retained_versions"] == [2, 3, 6]
    assert open_table(table_uri).verify(deep=True)["problems"] == []
