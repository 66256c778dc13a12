"""Each managed object has one owning table, named by an owner marker next to the object
(``<dir>/.blobhouse-owner/<name>.json``) that a write creates exclusively right before its
commit: a second table handing the same object over is refused at write time, and gc deletes
only what its table owns. Real tables, files and S3 objects throughout."""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    ExternalBlobError,
    ManagedObjectOwnedError,
    StaleWriteError,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.cli import main as blobhouse_cli
from blobhouse.layout import OWNER_DIR, TableLocation, owner_marker
from blobhouse.managed import Registry
from blobhouse.ownership import claim, read_owner, release
from blobhouse.write import begin_write

NOW = timedelta(0)


@pytest.fixture
def media(tmp_path) -> str:
    """One folder of media files both tables name as a managed base (the issue's scenario)."""
    folder = tmp_path / "media"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.bin").write_bytes(os.urandom(5_000 + i))
    return str(folder)


def rows(values: list, first_id: int = 0) -> pa.Table:
    ids = pa.array(range(first_id, first_id + len(values)), pa.int64())
    return pa.table({"id": ids, "v": blob_array(values)})


def write(uri: str, values: list, *, mode: str = "append", **bases) -> None:
    write_table(rows(values), uri, mode=mode, **bases)


def managed_table(uri: str, media: str, values: list) -> None:
    write(uri, values, mode="create", managed_bases=[media])


def gc_runs(uri: str, runs: int = 3) -> list[dict]:
    """``runs`` gc passes with no grace: retire, doom, reap."""
    return [open_table(uri).gc(grace=NOW, retain_versions=1)["managed"] for _ in range(runs)]


def file_uri(path: str) -> str:
    return f"file://{os.path.realpath(path)}"


def owner(path: str) -> str | None:
    """The root uri the object's owner marker names (None: no marker)."""
    return read_owner(file_uri(path)).table


def marker_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), OWNER_DIR, f"{os.path.basename(path)}.json")


def registered(uri: str) -> set[str]:
    return set(Registry.load(TableLocation(uri)).entries)


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_second_table_sharing_the_managed_folder_is_refused_at_write_time(tmp_path, media):
    """The issue: train and eval name one managed media folder. Eval's write of train's file
    is refused, naming both; train's gc later deletes only what train owns, and eval reads."""
    train, evals = str(tmp_path / "train"), str(tmp_path / "eval")
    clip, own = f"{media}/0.bin", f"{media}/1.bin"
    managed_table(train, media, [Blob(uri=clip), b"x"])
    assert owner(clip) == file_uri(train)
    managed_table(evals, media, [Blob(uri=own)])
    assert owner(own) == file_uri(evals)
    version = open_table(evals).version

    with pytest.raises(ManagedObjectOwnedError) as refused:
        write(evals, [Blob(uri=clip)])
    message = str(refused.value)
    assert file_uri(clip) in message and f"owned by table {file_uri(train)}" in message
    assert "unmanaged" in message and "nothing was committed" in message
    assert isinstance(refused.value, ExternalBlobError)
    assert open_table(evals).version == version and open_table(evals).count_rows() == 1
    assert registered(evals) == {file_uri(own)}
    assert owner(clip) == file_uri(train) and owner(own) == file_uri(evals)
    with pytest.raises(ManagedObjectOwnedError, match="owned by table"):  # nor as a new table
        managed_table(str(tmp_path / "third"), media, [Blob(uri=clip)])
    assert not os.path.exists(tmp_path / "third" / "_versions")

    open_table(train).delete("id = 0")
    reports = gc_runs(train)
    assert [r["removed"] for r in reports] == [0, 0, 1]
    assert reports[-1]["paths"] == [file_uri(clip)]
    assert not os.path.exists(clip) and not os.path.exists(marker_path(clip))
    assert open_table(evals).read_blobs("v", [0]) == [content(own)]  # eval's object stays
    assert open_table(evals).verify()["problems"] == []
    write(evals, [Blob(uri=f"{media}/2.bin")])  # new objects of the folder are anyone's


def test_an_object_flagged_managed_per_row_has_one_owner(tmp_path, media):
    """``managed=True`` rows, the folder only an allowed base: the same rule. A plain
    reference from the other table is the documented way to share (unmanaged there)."""
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    clip = f"{media}/3.bin"
    # two rows of one write hand the object over: one marker
    write(first, [Blob(uri=clip, managed=True)] * 2, mode="create", allowed_bases=[media])
    assert os.listdir(os.path.dirname(marker_path(clip))) == ["3.bin.json"]
    write(first, [Blob(uri=clip, managed=True)])  # the owner hands it over again: fine
    write(second, [b"x"], mode="create", allowed_bases=[media])

    with pytest.raises(
        ManagedObjectOwnedError, match=f"owned by table {re.escape(file_uri(first))}"
    ):
        write(second, [Blob(uri=clip, managed=True)])
    assert open_table(second).count_rows() == 1 and registered(second) == set()
    write(second, [Blob(uri=clip)])  # unmanaged in the second table
    assert open_table(second).stats()["external_references"]["unmanaged"]["objects"] == 1
    assert owner(clip) == file_uri(first)


def test_branches_share_their_tables_ownership(table_uri, media):
    clip = f"{media}/0.bin"
    managed_table(table_uri, media, [Blob(uri=clip)])
    lance.dataset(table_uri).create_branch("exp", 1)
    write_table(rows([Blob(uri=clip)], 5), table_uri, mode="append", branch="exp")
    assert open_table(table_uri, branch="exp").count_rows() == 2
    assert owner(clip) == file_uri(table_uri)


@pytest.mark.filterwarnings("ignore::blobhouse.errors.MovedTableWarning")
def test_a_copy_neither_takes_over_nor_deletes_the_originals_objects(tmp_path, media):
    original, copy = str(tmp_path / "original"), str(tmp_path / "copy")
    owned, legacy = f"{media}/0.bin", f"{media}/1.bin"
    managed_table(original, media, [Blob(uri=owned), Blob(uri=legacy), b"x"])
    os.remove(marker_path(legacy))  # registered before owner markers existed
    shutil.copytree(original, copy)

    # handing either over in the copy is refused by name: by its marker, or by the
    # original's registry entry the copy carries
    for path in (owned, legacy):
        with pytest.raises(
            ManagedObjectOwnedError, match=f"owned by table {re.escape(file_uri(original))}"
        ):
            write(copy, [Blob(uri=path)])
    assert owner(owned) == file_uri(original) and not os.path.exists(marker_path(legacy))
    assert open_table(copy).count_rows() == 3 and registered(copy) == set()

    # compaction rewrites the copy's rows: it keeps their references and takes nothing over
    open_table(copy).delete("id = 2")
    open_table(copy).compact()
    assert open_table(copy).read_blobs("v", [0, 1]) == [content(owned), content(legacy)]
    assert registered(copy) == set() and not os.path.exists(marker_path(legacy))

    open_table(copy).delete("id >= 0")
    reports = gc_runs(copy, runs=4)
    assert all(r["registered"] == 0 and r["removed"] == 0 for r in reports)
    assert os.path.exists(owned) and os.path.exists(legacy)
    assert open_table(original).read_blobs("v", [0, 1]) == [content(owned), content(legacy)]


def test_an_object_without_marker_is_claimed_then_reaped_by_its_table(tmp_path, media):
    table, other = str(tmp_path / "table"), str(tmp_path / "other")
    legacy, taken = f"{media}/0.bin", f"{media}/1.bin"
    managed_table(table, media, [Blob(uri=legacy), Blob(uri=taken)])
    for path in (legacy, taken):  # registered before owner markers existed
        os.remove(marker_path(path))
    # another table hands one of them over first: it is that table's now
    managed_table(other, media, [Blob(uri=taken)])
    assert owner(taken) == file_uri(other)

    open_table(table).delete("id >= 0")
    reports = gc_runs(table)
    assert [r["removed"] for r in reports] == [0, 0, 1]
    assert reports[-1]["paths"] == [file_uri(legacy)]
    assert reports[-1]["kept_owned_elsewhere"] == 1
    assert reports[-1]["kept"] == [f"{file_uri(taken)}: owned by table {file_uri(other)}"]
    assert not os.path.exists(legacy) and not os.path.exists(marker_path(legacy))
    assert registered(table) == set()  # the other table's object left this registry
    assert open_table(other).read_blobs("v", [0]) == [content(taken)]
    assert owner(taken) == file_uri(other)
    assert all(r["removed"] == 0 for r in gc_runs(table))


def test_an_unreadable_marker_keeps_the_object(tmp_path, media):
    table, other = str(tmp_path / "table"), str(tmp_path / "other")
    clip = f"{media}/2.bin"
    managed_table(table, media, [Blob(uri=clip), b"x"])
    with open(marker_path(clip), "w") as f:
        f.write("{not json")
    write(other, [b"y"], mode="create", managed_bases=[media])
    with pytest.raises(ManagedObjectOwnedError, match="unreadable owner marker"):
        write(other, [Blob(uri=clip)])

    open_table(table).delete("id = 0")
    reports = gc_runs(table, runs=4)
    assert all(r["removed"] == 0 for r in reports)
    assert [r["kept_unknown_owner"] for r in reports] == [0, 0, 1, 1]
    assert os.path.exists(clip) and registered(table) == {file_uri(clip)}  # judged again later
    dry = open_table(table).gc(grace=NOW, retain_versions=1, dry_run=True)["managed"]
    assert dry["kept_unknown_owner"] == 1 and dry["removed"] == 0

    with open(marker_path(clip), "w") as f:  # repaired: the table's own again
        json.dump({"format": 1, "table": file_uri(table), "created": 0}, f)
    assert gc_runs(table, runs=1)[0]["removed"] == 1 and not os.path.exists(clip)


def test_a_write_that_does_not_commit_removes_the_markers_it_created(tmp_path, media):
    table, other = str(tmp_path / "table"), str(tmp_path / "other")
    kept, fresh, theirs = (f"{media}/{i}.bin" for i in range(3))
    managed_table(table, media, [Blob(uri=kept)])
    managed_table(other, media, [Blob(uri=theirs)])

    # staged files gone before the commit (gc swept them): the markers go with the write
    batch = rows([Blob(uri=kept), Blob(uri=fresh)], 1).to_batches()[0]
    write_ = begin_write(table, batch.schema, mode="append", in_tasks=True)
    written = write_.plan.write([batch])
    os.remove(os.path.join(table, "data", written[0].name))
    with pytest.raises(StaleWriteError):
        write_.commit(written)
    assert owner(fresh) is None and not os.path.exists(marker_path(fresh))
    assert owner(kept) == file_uri(table)  # it owned this one already: still does

    # refused for one object: the marker made for the other one is removed too
    with pytest.raises(ManagedObjectOwnedError, match=r"2\.bin is owned by table"):
        write(table, [Blob(uri=fresh), Blob(uri=theirs)])
    assert owner(fresh) is None and owner(theirs) == file_uri(other)
    assert open_table(table).count_rows() == 1 and registered(table) == {file_uri(kept)}


def test_markers_on_an_object_store_are_exclusive(s3):
    """Many objects claimed at once (in parallel, conditional PUTs): one owner each."""
    clips = [f"{s3.uri}/media/{i}.bin" for i in range(24)]
    for clip in clips:
        s3.put(clip.removeprefix(f"{s3.uri}/"), b"clip")
    train, evals = TableLocation(f"{s3.uri}/train"), TableLocation(f"{s3.uri}/eval")
    assert sorted(claim(train, clips, s3.options).created) == sorted(clips)
    assert owner_marker(clips[0]) == f"{s3.uri}/media/{OWNER_DIR}/0.bin.json"
    again = claim(train, clips, s3.options)
    assert (again.created, again.refused) == ([], {})
    new = f"{s3.uri}/media/new.bin"
    lost = claim(evals, [*clips[:3], new], s3.options)
    assert lost.created == [new]
    assert sorted(lost.refused) == clips[:3]
    assert all(o.is_table(train) for o in lost.refused.values())
    with pytest.raises(ManagedObjectOwnedError, match=f"owned by table {s3.uri}/train"):
        raise lost.error(evals)
    release([*clips, new], s3.options)
    assert not [k for k in s3.objects("media/") if OWNER_DIR in k]


def test_a_spark_write_of_another_tables_object_is_refused(spark, tmp_path, media):
    train, evals = str(tmp_path / "train"), str(tmp_path / "eval")
    clip = f"{media}/0.bin"
    managed_table(train, media, [Blob(uri=clip)])
    managed_table(evals, media, [b"x"])
    frame = spark.createDataFrame(
        [(1, (None, clip)), (2, (b"y", None))], "id long, v struct<data binary, uri string>"
    )
    with pytest.raises(Exception, match=f"owned by table {re.escape(file_uri(train))}"):
        frame.write.format("blobhouse").mode("append").save(evals)
    assert open_table(evals).count_rows() == 1 and registered(evals) == set()
    assert owner(clip) == file_uri(train)


def test_a_copys_verify_names_the_objects_another_table_owns(tmp_path, media):
    """The original's gc deletes its objects once it no longer references them, whatever a copy
    still reads: the copy's verify names each as a problem (it said nothing before)."""
    original, copy = str(tmp_path / "original"), str(tmp_path / "copy")
    owned = f"{media}/0.bin"
    managed_table(original, media, [Blob(uri=owned), b"x"])
    assert open_table(original).verify()["problems"] == []  # its own: no dependency
    shutil.copytree(original, copy)
    problems = [p for p in open_table(copy).verify()["problems"] if "owned by" in p["reason"]]
    assert [p["uri"] for p in problems] == [file_uri(owned)]
    assert f"owned by table {file_uri(original)}" in problems[0]["reason"]
    # the danger it names: the original lets go of the object, and its gc deletes it
    open_table(original).delete("id = 0")
    gc_runs(original)
    assert not os.path.exists(owned)
    missing = open_table(copy).verify()["missing_objects"]
    assert sum(missing.values()) == 1


def test_a_relocated_copy_borrows_its_originals_objects_and_the_originals_gc_keeps_them(
    tmp_path, media, capsys
):
    """The rule for a copy's managed objects: ``relocate`` makes the copy a borrower of each
    object its original owns; the original's gc keeps a borrowed object while the copy exists
    (it deleted it before), the copy's gc gives it back once the copy no longer references it,
    and a copy that is gone borrows nothing."""
    original, copy = str(tmp_path / "original"), str(tmp_path / "copy")
    kept, other = f"{media}/0.bin", f"{media}/1.bin"
    managed_table(original, media, [Blob(uri=kept), Blob(uri=other), b"x"])
    shutil.copytree(original, copy)
    before = open_table(copy).verify()["problems"]
    assert all(
        "run `blobhouse relocate`" in p["reason"] for p in before if "owned by" in p["reason"]
    )
    assert blobhouse_cli(["relocate", copy, "--json"]) == 0  # the command borrows them
    assert json.loads(capsys.readouterr().out)["borrowed"] == 2
    problems = [p for p in open_table(copy).verify()["problems"] if "owned by" in p["reason"]]
    assert sorted(p["uri"] for p in problems) == [file_uri(kept), file_uri(other)]
    assert all("this table borrowed it" in p["reason"] for p in problems)  # still a dependency

    open_table(original).delete("id >= 0")  # the original lets go of both
    reports = gc_runs(original, runs=4)
    assert reports[-1]["kept_borrowed"] == 2 and reports[-1]["removed"] == 0
    assert any(f"borrowed by {file_uri(copy)}" in k for k in reports[-1]["kept"])
    assert open_table(copy).read_blobs("v", [0, 1]) == [content(kept), content(other)]

    # the copy lets go of one: its gc gives it back, and the original's next gc reaps it
    open_table(copy).delete("id = 1")
    assert gc_runs(copy, runs=1)[0]["given_back"] == 1
    report = gc_runs(original, runs=1)[0]
    assert report["removed"] == 1 and report["kept_borrowed"] == 1
    assert not os.path.exists(other) and os.path.exists(kept)

    # the copy is gone: its marker is stale, removed (not by a dry run), and the object reaped
    shutil.rmtree(copy)
    dry = open_table(original).gc(grace=NOW, retain_versions=1, dry_run=True)["managed"]
    assert dry["removed"] == 1 and len(list(Path(media, OWNER_DIR).rglob("borrowed/*/*"))) == 1
    report = gc_runs(original, runs=1)[0]
    assert report["removed"] == 1 and report["kept_borrowed"] == 0
    assert not os.path.exists(kept)
    assert list(Path(media, OWNER_DIR, "borrowed").rglob("*.json")) == []
