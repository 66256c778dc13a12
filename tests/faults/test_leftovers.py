"""Leftovers recover or explain themselves within seconds: a lock, a lease, a claim or an owner
marker left as a directory (empty or not), a dangling symbolic link, an empty file or garbage
is taken over when it is provably no live writer's, or named in one line with the command that
clears it; never a long wait and "run it again" forever. gc reports and clears the stale ones.
What a link points to is never created or removed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import Blob, blob_array, open_table, write_table
from blobhouse.commit import leases, locks
from blobhouse.commit.transaction import upsert_lock
from blobhouse.dedup import content_hash
from blobhouse.errors import LeftoverError, ManagedObjectOwnedError
from blobhouse.io.objects import uri_to_path
from blobhouse.layout import LEASES_DIR
from blobhouse.ownership import owner_marker, read_owner
from blobhouse.store.claims import Claim, Claimant, Claims
from tests.helpers import ROOT

SHAPES = ("directory", "full-directory", "dangling-symlink", "empty", "garbage")
SECONDS = 10  # "within seconds": what a waiter may take to get past a leftover


def leave(path: str, shape: str, nowhere: Path) -> None:
    """Put a leftover of ``shape`` at ``path`` (a link points into ``nowhere``, which must
    never be created)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if shape == "directory":
        os.mkdir(path)
    elif shape == "full-directory":
        os.makedirs(os.path.join(path, "inside"))
        Path(path, "inside", "file").write_bytes(b"not a lock")
    elif shape == "dangling-symlink":
        os.symlink(nowhere / "target", path)
    elif shape == "empty":
        Path(path).write_bytes(b"")
        old = time.time() - 60  # its creator died long ago
        os.utime(path, (old, old))
    else:
        Path(path).write_bytes(b"\x00{garbage, not what blobhouse writes")


# the table's own folders themselves: a link (to a user's folder), a file where a folder belongs
FOLDER_SHAPES = ("symlink-to-user-folder", "file")


def leave_folder(path: str, shape: str, user: Path) -> None:
    """Put ``shape`` where the table's own folder ``path`` belongs (``user``: a folder of the
    user's, with their files, which nothing may touch)."""
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if shape == "file":
        Path(path).write_bytes(b"x")
    else:
        os.symlink(user, path)


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """A user's folder outside the table, holding names blobhouse uses in its own folders."""
    folder = tmp_path / "user"
    (folder / "photos").mkdir(parents=True)
    (folder / "photos" / "cat.jpg").write_bytes(b"cat")
    (folder / "locks").mkdir()
    (folder / "locks" / "todo.txt").write_bytes(b"todo")
    (folder / "upsert").write_bytes(b"mine")
    return folder


def _user_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def make(uri: str, storage_options: dict | None = None):
    ids = list(range(4))
    data = pa.table({"id": ids, "img": blob_array([b"v%d" % i * 30_000 for i in ids])})
    return write_table(data, uri, storage_options=storage_options)


def insert(uri: str, keys: list[int], storage_options: dict | None = None):
    """An inserting merge (it takes the table's upsert lock), timed."""
    data = pa.table({"id": keys, "img": blob_array([b"n%d" % k for k in keys])})
    started = time.monotonic()
    report = (
        open_table(uri, storage_options=storage_options)
        .merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(data)
    )
    return report, time.monotonic() - started


@pytest.mark.parametrize("shape", SHAPES)
def test_a_leftover_upsert_lock_is_taken_over_within_seconds(table_uri, tmp_path, shape):
    table = make(table_uri)
    lock = uri_to_path(upsert_lock(table.location))
    leave(lock, shape, tmp_path / "nowhere")
    report, took = insert(table_uri, [10, 11])
    assert report.num_inserted_rows == 2 and took < SECONDS
    assert not os.path.lexists(lock)  # taken over, then released
    assert os.listdir(os.path.dirname(lock)) == []  # no marker, nothing set aside, left
    assert not (tmp_path / "nowhere").exists()


def test_a_fresh_empty_lock_is_given_the_moment_of_its_write(tmp_path):
    """Empty, it may be a holder's between its create and its write: taken over only once it
    stays empty for longer than that takes (seconds), not for the lock's whole expiry."""
    uri = locks.lock_uri(str(tmp_path), "example")
    Path(uri_to_path(uri)).parent.mkdir(parents=True)
    Path(uri_to_path(uri)).write_bytes(b"")
    started = time.monotonic()
    with locks.held(uri, wait=SECONDS):
        waited = time.monotonic() - started
    assert 1.5 < waited < SECONDS


def test_a_lock_held_by_a_live_holder_is_never_taken(tmp_path):
    uri = locks.lock_uri(str(tmp_path), "example")
    with locks.held(uri):
        token = locks.holder(uri)
        with pytest.raises(locks.LockTimeoutError), locks.held(uri, wait=3):
            pass
        assert locks.holder(uri) == token


def test_a_leftover_that_cannot_be_removed_is_named_at_once(table_uri, tmp_path, immutable):
    """Removing it fails (here: an immutable directory): one line names it and the command
    that clears it, at once, not after the lock's wait; nothing is committed."""
    table = make(table_uri)
    lock = uri_to_path(upsert_lock(table.location))
    leave(lock, "full-directory", tmp_path / "nowhere")
    immutable(lock)
    started = time.monotonic()
    with pytest.raises(LeftoverError) as failed:
        insert(table_uri, [10])
    assert time.monotonic() - started < SECONDS
    message = str(failed.value)
    assert f"{lock} is a directory" in message and f"`rm -r -- {lock}`" in message
    assert "\n" not in message
    assert open_table(table_uri).version == table.version


@pytest.mark.parametrize("shape", SHAPES)
def test_a_leftover_at_a_lease_is_replaced_never_written_through(tmp_path, shape):
    root = str(tmp_path / "t")
    lease = os.path.join(root, LEASES_DIR, "write-0123456789ab-")
    leave(lease, shape, tmp_path / "nowhere")
    with leases.held(root, "write-0123456789ab-"):
        assert leases.live_prefixes(root, since=time.time() - 5) == {"write-0123456789ab-"}
    assert os.path.isfile(lease) and not os.path.islink(lease)
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_leftover_claim_is_taken_over_within_seconds(tmp_path, shape):
    root = str(tmp_path / "t")
    claims = Claims(root, "write-1", claimant=Claimant(0, 0, "a"))
    digest = content_hash(b"clip")
    leave(uri_to_path(claims._entry_uri(0)), shape, tmp_path / "nowhere")
    started = time.monotonic()
    mine = Claim(digest, "packs/write-1-a.pack", 0, 4, claims.claimant)
    assert claims.claim(mine) is None  # this task stores the payload
    assert time.monotonic() - started < SECONDS
    theirs = Claims(root, "write-1", claimant=Claimant(1, 0, "b"))
    assert theirs.claim(Claim(digest, "packs/write-1-b.pack", 0, 4, theirs.claimant)) == mine
    assert not (tmp_path / "nowhere").exists()


def _managed_world(tmp_path: Path):
    media = tmp_path / "media"
    media.mkdir()
    clip = media / "clip.mp4"
    clip.write_bytes(b"clip bytes" * 1000)
    uri = str(tmp_path / "t")
    table = write_table(
        pa.table({"id": [0], "img": blob_array([b"x"])}), uri, managed_bases=[str(media)]
    )
    return table, uri, str(clip)


def _hand_over(uri: str, clip: str):
    rows = pa.table({"id": [1], "img": blob_array([Blob(uri=clip, managed=True)])})
    return write_table(rows, uri, mode="append")


@pytest.mark.parametrize("shape", ["directory", "full-directory", "dangling-symlink", "empty"])
def test_a_leftover_owner_marker_that_names_no_table_is_taken_over(tmp_path, shape):
    table, uri, clip = _managed_world(tmp_path)
    leave(uri_to_path(owner_marker(clip)), shape, tmp_path / "nowhere")
    written = _hand_over(uri, clip)
    assert written.version == table.version + 1
    assert read_owner(clip).is_table(written.location)
    assert written.read_blobs("img", [1]) == [Path(clip).read_bytes()]
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("written_by_then", [True, False])
def test_a_fresh_empty_owner_marker_is_judged_once_its_creator_had_time(tmp_path, written_by_then):
    """An empty marker may be another table's, between its create and its write: judged once
    it is written (another table's: refused, naming that table) or empty for 2 s (taken)."""
    table, uri, clip = _managed_world(tmp_path)
    marker = uri_to_path(owner_marker(clip))
    os.makedirs(os.path.dirname(marker))
    Path(marker).write_bytes(b"")
    other = '{"format": 1, "table": "file:///elsewhere/other", "created": 0}'
    if written_by_then:
        threading.Timer(0.5, lambda: Path(marker).write_text(other)).start()
        with pytest.raises(ManagedObjectOwnedError, match="table file:///elsewhere/other"):
            _hand_over(uri, clip)
        assert open_table(uri).version == table.version
    else:
        assert _hand_over(uri, clip).version == table.version + 1
        assert read_owner(clip).is_table(open_table(uri).location)


@pytest.mark.parametrize("shape", FOLDER_SHAPES)
def test_a_link_or_file_at_the_owner_markers_folder_is_never_followed(tmp_path, user_folder, shape):
    table, uri, clip = _managed_world(tmp_path)
    before = _user_files(user_folder)
    leave_folder(os.path.dirname(uri_to_path(owner_marker(clip))), shape, user_folder)
    assert _hand_over(uri, clip).version == table.version + 1
    assert read_owner(clip).is_table(open_table(uri).location)
    assert os.path.isdir(os.path.dirname(uri_to_path(owner_marker(clip))))
    assert _user_files(user_folder) == before


def test_a_garbage_owner_marker_is_named_with_the_command_that_clears_it(tmp_path):
    """Garbage may be another table's damaged marker: never taken over, but named, with the
    command, and nothing is committed; once cleared, the same write goes through."""
    table, uri, clip = _managed_world(tmp_path)
    marker = uri_to_path(owner_marker(clip))
    leave(marker, "garbage", tmp_path / "nowhere")
    with pytest.raises(ManagedObjectOwnedError) as refused:
        _hand_over(uri, clip)
    assert f"`rm -- {marker}`" in str(refused.value)
    assert open_table(uri).version == table.version
    subprocess.run(["sh", "-c", f"rm -- {marker}"], check=True)  # the command it names
    assert _hand_over(uri, clip).version == table.version + 1


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_reports_and_clears_stale_locks_and_leases(table_uri, tmp_path, dry_run):
    table = make(table_uri)
    lock_dir = os.path.join(table_uri, locks.LOCKS_DIR)
    for shape in SHAPES:
        leave(os.path.join(lock_dir, f"upsert.{shape}"), shape, tmp_path / "nowhere")
    expired = os.path.join(lock_dir, "upsert.expired")
    Path(expired).write_bytes(os.urandom(16).hex().encode())  # a dead holder's token
    old = time.time() - locks.EXPIRY_SECONDS - 5
    os.utime(expired, (old, old))
    live = locks.lock_uri(table_uri, "upsert.live")
    lease_dir = os.path.join(table_uri, LEASES_DIR, "write-0123456789ab-")
    os.makedirs(os.path.join(lease_dir, "inside"))
    with locks.held(live):
        report = table.gc(dry_run=dry_run)
        assert report["stale_leftovers"] == len(SHAPES) + 2
        left = sorted(os.listdir(lock_dir))
        if dry_run:
            assert len(left) == len(SHAPES) + 2
        else:
            assert left == ["upsert.live"]  # a live holder's lock stays
            assert not os.path.lexists(lease_dir)
    assert not (tmp_path / "nowhere").exists()


def test_the_cli_prints_what_gc_cleared(table_uri, tmp_path):
    table = make(table_uri)
    leave(uri_to_path(upsert_lock(table.location)), "directory", tmp_path / "nowhere")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "blobhouse.cli", "gc", table_uri],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "removed 1 stale leftover(s): locks and leases no live writer holds" in done.stdout


@pytest.mark.parametrize("body", [b"", b"\x00garbage"], ids=["empty", "garbage"])
def test_a_leftover_lock_object_on_s3_is_taken_over_within_seconds(s3, body):
    """An object store has no directories or links, but an empty or garbage object at the
    lock's key happens (another tool, a hand): taken over within seconds there too."""
    uri = f"{s3.uri}/t"
    table = make(uri, s3.options)
    key = upsert_lock(table.location).removeprefix(f"{s3.uri}/")
    s3.client.put_object(Bucket=s3.name, Key=key, Body=body)
    report, took = insert(uri, [10, 11], s3.options)
    assert report.num_inserted_rows == 2 and took < SECONDS
    assert [k for k in s3.objects() if "/locks/" in k] == []


def test_merges_racing_past_one_leftover_lock_stay_exclusive(table_uri, tmp_path):
    """Four merges meet one leftover directory at once: one removes it, and the lock still
    admits one holder at a time (each key once)."""
    table = make(table_uri)
    leave(uri_to_path(upsert_lock(table.location)), "full-directory", tmp_path / "nowhere")
    results: list = []
    threads = [
        threading.Thread(target=lambda k=k: results.append(insert(table_uri, [100 + k])))
        for k in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(r[0].num_inserted_rows for r in results) == [1, 1, 1, 1]
    ids = open_table(table_uri).to_arrow(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == [0, 1, 2, 3, 100, 101, 102, 103]


@pytest.mark.parametrize("shape", FOLDER_SHAPES)
@pytest.mark.parametrize("folder", ["_leases", "_leases/locks"])
def test_a_link_or_file_at_the_leases_folder_is_never_followed(
    table_uri, user_folder, folder, shape
):
    make(table_uri)
    before = _user_files(user_folder)
    leave_folder(f"{table_uri}/{folder}", shape, user_folder)
    dry = open_table(table_uri).gc(grace=timedelta(0), dry_run=True)
    assert dry["stale_leftovers"] == 1 and dry["expired_leases"] == 0
    report, took = insert(table_uri, [10])  # a lease and the upsert lock: taken over
    assert report.num_inserted_rows == 1 and took < SECONDS
    write_table(pa.table({"id": [20], "img": blob_array([b"w"])}), table_uri, mode="append")
    open_table(table_uri).gc(grace=timedelta(0))
    assert _user_files(user_folder) == before  # nothing of the user's read, written, removed
    assert os.path.isdir(f"{table_uri}/_leases") and not os.path.islink(f"{table_uri}/_leases")


@pytest.mark.parametrize("shape", FOLDER_SHAPES)
def test_gc_clears_a_link_or_file_at_the_leases_folder_and_says_so(table_uri, user_folder, shape):
    make(table_uri)
    before = _user_files(user_folder)
    leave_folder(f"{table_uri}/_leases", shape, user_folder)
    report = open_table(table_uri).gc(grace=timedelta(0))
    assert report["stale_leftovers"] == 1 and report["expired_leases"] == 0
    assert not os.path.islink(f"{table_uri}/_leases") and not os.path.isfile(f"{table_uri}/_leases")
    assert _user_files(user_folder) == before


@pytest.mark.parametrize("shape", FOLDER_SHAPES)
def test_a_link_or_file_at_the_claims_folder_is_never_followed(tmp_path, user_folder, shape):
    root = str(tmp_path / "t")
    before = _user_files(user_folder)
    leave_folder(f"{root}/_blobs/claims", shape, user_folder)
    claims = Claims(root, "write-1", claimant=Claimant(0, 0, "a"))
    digest = content_hash(b"clip")
    assert claims.claim(Claim(digest, "packs/write-1-a.pack", 0, 4, claims.claimant)) is None
    assert os.path.isdir(f"{root}/_blobs/claims") and not os.path.islink(f"{root}/_blobs/claims")
    assert _user_files(user_folder) == before


@pytest.mark.parametrize("shape", FOLDER_SHAPES)
def test_a_link_or_file_at_the_managed_folders_is_never_followed(tmp_path, user_folder, shape):
    _, uri, clip = _managed_world(tmp_path)
    (user_folder / "doomed").mkdir()
    (user_folder / "doomed" / ("0" * 64)).write_bytes(b"not a marker")
    before = _user_files(user_folder)
    leave_folder(f"{uri}/_blobs/managed", shape, user_folder)
    _hand_over(uri, clip)
    assert os.path.isdir(f"{uri}/_blobs/managed/registry")
    open_table(uri).delete("id >= 0")
    for _ in range(3):
        open_table(uri).gc(grace=timedelta(0), retain_versions=1)
    assert _user_files(user_folder) == before
    assert not os.path.exists(clip)  # the table's own managed object: reclaimed as ever
