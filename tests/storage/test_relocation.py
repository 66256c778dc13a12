"""A table copied or moved (``cp -r``, ``mv``, an object-store sync) is read, appended to,
compacted and gc'd at its new place without touching the old one; its store base path is
pointed home with one commit (on the first write, or ``relocate``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import BlobhouseError, blob_array, open_table, write_table
from blobhouse.layout import BasePaths
from tests.helpers import stock_read

SHARED = os.urandom(150_000)
# every test here opens copied tables on purpose: the warning they get is checked once, in
# test_table_properties.py
pytestmark = pytest.mark.filterwarnings("ignore::blobhouse.errors.MovedTableWarning")


def rows(ids, payloads) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "b": blob_array(payloads)})


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the hash of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def read_all(uri: str, **kwargs) -> dict[int, bytes]:
    table = open_table(uri, **kwargs)
    return {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}


def build(orig: Path) -> dict[int, bytes]:
    """A global-dedup table of two appends sharing a payload: id -> bytes."""
    content = {}
    for start in (0, 3):
        payloads = [SHARED, os.urandom(80_000), os.urandom(700)]
        data = rows(range(start, start + 3), payloads)
        write_table(data, str(orig), mode="append", dedup="global")
        content.update(zip(range(start, start + 3), payloads, strict=True))
    return content


@pytest.fixture
def moved(tmp_path: Path):
    """A global-dedup table built at ``orig``, copied to ``copy``; the original is then
    renamed away, so any read or write of the old place fails."""
    orig = tmp_path / "orig"
    content = build(orig)
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    away = tmp_path / "away"
    orig.rename(away)
    return copy, away, content, fingerprint(away)


def test_a_copied_table_reads_at_its_new_place(moved):
    copy, away, content, before = moved
    table = open_table(str(copy))
    assert table.moved_from is not None and table.moved_from.endswith("/orig")
    assert read_all(str(copy)) == content
    report = table.verify(deep=True)
    # blobhouse reads right; stock Lance would not: the latest version until a relocation,
    # the older ones for good
    problems = {p["version"]: p for p in report["problems"]}
    assert set(problems) == {1, table.version}
    assert all(p["uri"].endswith("/orig") for p in problems.values())
    latest = problems[table.version]
    assert "copied or moved" in latest["reason"] and "relocate" in latest["reason"]
    assert "version 1 and the versions after it" in problems[1]["reason"]
    assert report["hashed"] > 0
    with pytest.raises(ValueError, match="orig/_blobs"):  # Lance follows the old store path
        lance.dataset(str(copy)).read_blobs("b", indices=[0])
    assert fingerprint(away) == before


def test_a_branch_made_before_a_move_is_refused_and_kept_whole(tmp_path, capsys):
    from blobhouse.cli import main

    orig, copy = tmp_path / "orig", tmp_path / "copy"
    content = build(orig)
    lance.dataset(str(orig)).create_branch("exp", 2)
    extra = {9: os.urandom(60_000)}
    write_table(rows(extra, extra.values()), str(orig), mode="append", branch="exp")
    shutil.copytree(orig, copy)  # the original stays: reading it would give its bytes
    with pytest.raises(BlobhouseError, match=r"branch 'exp' .* was made when the table was at"):
        open_table(str(copy), branch="exp")
    # main is still maintained; what the branch may use (its directory, the store) is kept
    branch_files = fingerprint(copy / "tree" / "exp")
    open_table(str(copy)).delete("id = 0")
    assert open_table(str(copy)).compact()["fragments_removed"] == 2
    report = open_table(str(copy)).gc(retain_versions=1, grace=timedelta(0))
    assert report["kept_unreadable"] == ["_blobs/packs/", "tree/exp/"]
    assert report["retired_packs"] == report["reaped_packs"] == 0
    assert fingerprint(copy / "tree" / "exp") == branch_files
    del content[0]
    assert read_all(str(copy)) == content
    verified = open_table(str(copy)).verify(deep=True)
    assert [p["branch"] for p in verified["problems"]] == ["exp"]
    assert open_table(str(copy)).stats()["rows"] == 5
    assert main(["relocate", str(copy)]) == 1
    out = capsys.readouterr().out
    # main's store was pointed home by the compaction, its first write here
    assert "branch exp cannot be relocated" in out and "of main" not in out
    lance.dataset(str(copy)).branches.delete("exp")
    assert open_table(str(copy)).verify(deep=True)["problems"] == []
    assert read_all(str(orig), branch="exp") == {**build_content_of(orig), **extra}


def build_content_of(root: Path) -> dict[int, bytes]:
    """What version 2 of the table at ``root`` holds (the branch's parent)."""
    return read_all(str(root), version=2)


def test_the_first_write_points_the_store_home(moved):
    copy, away, content, before = moved
    extra = {6: SHARED, 7: os.urandom(90_000)}
    table = write_table(rows(extra, extra.values()), str(copy), mode="append", dedup="global")
    content.update(extra)
    assert table.moved_from is None
    store = BasePaths(table.dataset, table.location).store
    assert store.uri == table.location.store_uri
    assert read_all(str(copy)) == content
    ids = lance.dataset(str(copy)).to_table(columns=["id"])["id"].to_pylist()
    assert dict(zip(ids, stock_read(str(copy), "b"), strict=True)) == content
    # the shared payload was found in the copy's own store, the new one stored there
    assert table.stats()["columns"]["b"]["kinds"]["global"]["rows"] == 8
    open_table(str(copy)).delete("id = 1")
    del content[1]
    assert open_table(str(copy)).compact()["fragments_removed"] == 3
    gc = open_table(str(copy)).gc(retain_versions=1, grace=timedelta(0))
    assert all(str(copy) in p for p in gc["paths"])
    assert read_all(str(copy)) == content
    assert open_table(str(copy)).verify(deep=True)["problems"] == []
    assert fingerprint(away) == before  # the old place was never touched


def test_relocate_command_repairs_with_one_commit(moved):
    copy, away, content, before = moved
    version = open_table(str(copy)).version
    done = subprocess.run(
        [sys.executable, "-m", "blobhouse.cli", "relocate", str(copy)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "relocated" in done.stdout
    assert open_table(str(copy)).version == version + 1
    ids = lance.dataset(str(copy)).to_table(columns=["id"])["id"].to_pylist()
    assert dict(zip(ids, stock_read(str(copy), "b"), strict=True)) == content
    # a manifest keeps its base paths: the versions before the relocation still name the old
    # store, and stock Lance cannot read them with it gone; verify names each
    (problem,) = open_table(str(copy)).verify(deep=True)["problems"]
    assert problem["version"] == 1 and "stock Lance readers of those versions" in problem["reason"]
    with pytest.raises(ValueError, match="orig/_blobs"):
        lance.dataset(str(copy), version=version).read_blobs("b", indices=[0])
    open_table(str(copy)).gc(retain_versions=1, grace=timedelta(0))
    assert open_table(str(copy)).verify(deep=True)["problems"] == []
    again = subprocess.run(
        [sys.executable, "-m", "blobhouse.cli", "relocate", str(copy)],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0 and "already" in again.stdout
    assert open_table(str(copy)).version == version + 1
    assert fingerprint(away) == before


def test_a_table_synced_to_another_bucket(s3, s3_server):
    source = f"{s3.uri}/clips"
    content = dict(zip(range(3), [SHARED, SHARED, os.urandom(70_000)], strict=True))
    write_table(rows(content, content.values()), source, dedup="global", storage_options=s3.options)
    target_bucket = s3_server.bucket("synced-" + s3.name[-12:])
    for key in s3.objects("clips/"):  # what `aws s3 sync` does: every object, same key
        s3.client.copy_object(
            Bucket=target_bucket, Key=f"moved/{key}", CopySource={"Bucket": s3.name, "Key": key}
        )
        s3.client.delete_object(Bucket=s3.name, Key=key)
    target = f"s3://{target_bucket}/moved/clips"
    assert read_all(target, storage_options=s3.options) == content
    table = write_table(
        rows([3], [SHARED]), target, mode="append", dedup="global", storage_options=s3.options
    )
    assert table.moved_from is None
    content[3] = SHARED
    assert read_all(target, storage_options=s3.options) == content
    pairs = lance.dataset(target, storage_options=s3.options).read_blobs("b", indices=[0, 3])
    assert [p for _, p in pairs] == [SHARED, SHARED]
    assert s3.objects("clips/") == {}  # nothing was written back to the old place
