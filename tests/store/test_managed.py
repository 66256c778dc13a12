"""Managed external objects: a committed write hands external objects to the table (the
``managed`` flag or a managed base), and gc deletes one once no retained version of any branch or
tag references it, two grace periods after it first finds it unreferenced; unmanaged external
objects are never touched. Real tables and files on disk throughout."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    ExternalBlobError,
    InvalidInputError,
    ManagedObjectRaceError,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.cli import main
from blobhouse.layout import DOOMED_DIR, OWNER_DIR
from blobhouse.managed import Registry, managed_dir
from blobhouse.options import WriteOptions
from blobhouse.write import begin_write
from tests.helpers import aged, tree

HOUR = timedelta(hours=1)
NOW = timedelta(0)


@pytest.fixture
def media(tmp_path):
    """Two folders of files: ``owned`` (a managed base) and ``shared`` (an allowed base)."""
    folders = {}
    for name in ("owned", "shared"):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(3):
            (folder / f"{i}.bin").write_bytes(os.urandom(10_000 + i))
        folders[name] = str(folder)
    return folders


def make_table(uri: str, media: dict, values: list, **kwargs):
    rows = pa.table({"id": pa.array(range(len(values)), pa.int64()), "v": blob_array(values)})
    return write_table(
        rows,
        uri,
        mode=kwargs.pop("mode", "create"),
        allowed_bases=[media["shared"]],
        managed_bases=[media["owned"]],
        **kwargs,
    )


def gc(uri: str, grace: timedelta = NOW, **kwargs) -> dict:
    return open_table(uri).gc(grace=grace, retain_versions=1, **kwargs)["managed"]


def gc_runs(uri: str, runs: int = 3, **kwargs) -> list[dict]:
    """``runs`` gc passes with no grace: retire, doom, reap."""
    return [gc(uri, **kwargs) for _ in range(runs)]


def registered(uri: str) -> set[str]:
    return set(Registry.load(open_table(uri).location).entries)


def file_uri(path: str) -> str:
    return f"file://{os.path.realpath(path)}"


def owner_of(name: str) -> str:
    """The owner marker of the object ``name``, relative to its folder."""
    return f"{OWNER_DIR}/{name}.json"


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_managed_flag_and_managed_base_register_only_what_a_commit_hands_over(table_uri, media):
    flagged = f"{media['shared']}/0.bin"
    in_base = f"{media['owned']}/0.bin"
    plain = f"{media['shared']}/1.bin"
    table = make_table(
        table_uri,
        media,
        [Blob(uri=flagged, managed=True), Blob(uri=in_base), Blob(uri=plain), b"bytes", None],
    )
    assert registered(table_uri) == {file_uri(flagged), file_uri(in_base)}
    assert table.managed_bases == [file_uri(media["owned"])]
    assert table.read_blobs("v", [0, 1, 2]) == [content(p) for p in (flagged, in_base, plain)]
    assert lance.dataset(table_uri).count_rows() == 5  # stock Lance reads it as ever
    # an append keeps the table's bases, and may repeat them but not change them
    make_table(table_uri, media, [Blob(uri=plain)], mode="append")
    with pytest.raises(InvalidInputError, match="managed_bases too"):
        write_table(
            pa.table({"id": [9], "v": blob_array([b"x"])}),
            table_uri,
            mode="append",
            managed_bases=[media["shared"]],
        )


def test_pandas_rows_hand_objects_over_too(table_uri, media):
    import pandas as pd

    flagged = f"{media['shared']}/2.bin"
    frame = pd.DataFrame({"id": [0, 1], "v": [Blob(uri=flagged, managed=True), Blob(data=b"x")]})
    write_table(frame, table_uri, allowed_bases=[media["shared"]])
    assert registered(table_uri) == {file_uri(flagged)}


def test_gc_deletes_an_unreferenced_managed_object_after_grace_and_keeps_it_before(
    table_uri, media
):
    owned = f"{media['owned']}/1.bin"
    make_table(table_uri, media, [Blob(uri=owned), b"kept bytes"])
    open_table(table_uri).delete("id = 0")
    registry = managed_dir(table_uri)

    first = gc(table_uri, grace=HOUR)
    assert (first["retired"], first["doomed"], first["removed"]) == (1, 0, 0)
    for _ in range(2):  # within the grace period nothing moves on
        kept = gc(table_uri, grace=HOUR)
        assert (kept["retired"], kept["doomed"], kept["removed"], kept["waiting"]) == (0, 0, 0, 1)
    assert os.path.exists(owned)

    aged(registry, hours=2, folders=False)  # unreferenced (and registered) past the grace
    doomed = gc(table_uri, grace=HOUR)
    assert (doomed["doomed"], doomed["removed"]) == (1, 0) and os.path.exists(owned)
    assert gc(table_uri, grace=HOUR)["waiting"] == 1 and os.path.exists(owned)

    aged(registry, hours=2, folders=False)
    size = os.path.getsize(owned)
    reaped = gc(table_uri, grace=HOUR)
    assert (reaped["removed"], reaped["removed_bytes"]) == (1, size)
    assert reaped["paths"] == [file_uri(owned)]
    assert not os.path.exists(owned)
    assert registered(table_uri) == set()
    assert tree(registry) == set()  # markers gone with the entry
    assert open_table(table_uri).read_blobs("v", [0]) == [b"kept bytes"]
    assert open_table(table_uri).verify()["problems"] == []


def test_gc_never_deletes_unmanaged_external_objects(table_uri, media):
    plain = [f"{media['shared']}/{i}.bin" for i in range(3)]
    make_table(table_uri, media, [Blob(uri=p) for p in plain])
    open_table(table_uri).delete("id >= 0")
    reports = gc_runs(table_uri, runs=4)
    assert all(r["registered"] == 0 and r["removed"] == 0 for r in reports)
    assert all(os.path.exists(p) for p in plain)
    assert sorted(os.listdir(media["shared"])) == ["0.bin", "1.bin", "2.bin"]


@pytest.mark.parametrize("keeper", ["tag", "branch"])
def test_an_object_a_tag_or_branch_references_is_kept(table_uri, media, keeper):
    owned = f"{media['owned']}/0.bin"
    make_table(table_uri, media, [Blob(uri=owned), b"x"])
    dataset = lance.dataset(table_uri)
    if keeper == "tag":
        dataset.tags.create("gold", 1)
    else:
        dataset.create_branch("relabel", 1)
    open_table(table_uri).delete("id = 0")
    reports = gc_runs(table_uri, runs=4)
    assert all(r["referenced"] == 1 and r["removed"] == 0 for r in reports)
    assert os.path.exists(owned)
    if keeper == "tag":
        lance.dataset(table_uri).tags.delete("gold")
    else:
        lance.dataset(table_uri).branches.delete("relabel")
    reports = gc_runs(table_uri)
    assert [r["removed"] for r in reports] == [0, 0, 1]
    assert not os.path.exists(owned)


def test_an_object_only_a_branch_references_is_kept_and_registered_at_the_root(table_uri, media):
    make_table(table_uri, media, [b"x"])
    lance.dataset(table_uri).create_branch("exp", 1)
    owned = f"{media['owned']}/2.bin"
    write_table(
        pa.table({"id": [7], "v": blob_array([Blob(uri=owned)])}),
        table_uri,
        mode="append",
        branch="exp",
    )
    assert registered(table_uri) == {file_uri(owned)}  # one registry for the whole table
    reports = gc_runs(table_uri)  # gc of main marks every branch
    assert all(r["referenced"] == 1 for r in reports) and os.path.exists(owned)
    open_table(table_uri, branch="exp").delete("id = 7")
    reports = [
        open_table(table_uri, branch="exp").gc(grace=NOW, retain_versions=1) for _ in range(3)
    ]
    assert [r["managed"]["removed"] for r in reports] == [0, 0, 1]
    assert not os.path.exists(owned)


def test_a_failed_or_aborted_write_hands_nothing_over(table_uri, media):
    make_table(table_uri, media, [b"first"])
    owned = f"{media['owned']}/0.bin"
    flagged = f"{media['shared']}/0.bin"
    values = blob_array([Blob(uri=owned), Blob(uri=flagged, managed=True)])

    def failing_source():
        yield pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": values})
        raise RuntimeError("the source died")

    with pytest.raises(RuntimeError, match="the source died"):
        write_table(failing_source(), table_uri, mode="append")
    # a write planned and written, then aborted (what a failed Spark job does)
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": values})
    write = begin_write(table_uri, batch.schema, mode="append", in_tasks=True)
    written = write.plan.write([batch])
    assert {u for w in written for u in w.managed} == {file_uri(owned), file_uri(flagged)}
    write.abort(written)
    assert registered(table_uri) == set()
    assert open_table(table_uri).version == 1
    reports = gc_runs(table_uri)
    assert all(r["registered"] == 0 for r in reports)
    assert os.path.exists(owned) and os.path.exists(flagged)


def test_a_registry_that_cannot_be_written_leaves_the_object_unmanaged(table_uri, media, immutable):
    make_table(table_uri, media, [b"first"])
    # a registry folder nothing can be written in: the commit stands, the registration fails
    os.makedirs(f"{managed_dir(table_uri)}/registry")
    immutable(f"{managed_dir(table_uri)}/registry")
    owned = f"{media['owned']}/1.bin"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_table(table_uri, media, [Blob(uri=owned)], mode="append")
    assert any("were not registered" in str(w.message) for w in caught)
    assert open_table(table_uri).count_rows() == 2  # committed
    assert registered(table_uri) == set()
    open_table(table_uri).delete("id >= 0")
    assert all(r["removed"] == 0 for r in gc_runs(table_uri))
    assert os.path.exists(owned)  # a leak, never a delete


def test_written_files_carry_managed_uris_through_pickling_to_the_commit(table_uri, media):
    owned = f"{media['owned']}/2.bin"
    batch = pa.record_batch({"id": pa.array([0], pa.int64()), "v": blob_array([Blob(uri=owned)])})
    options = WriteOptions(allowed_bases=[media["shared"]], managed_bases=[media["owned"]])
    write = begin_write(table_uri, batch.schema, options, in_tasks=True)
    task_result = pickle.dumps(write.plan.write([batch]))  # what a Spark task sends the driver
    pickle.loads(pickle.dumps(write)).commit(pickle.loads(task_result))
    assert registered(table_uri) == {file_uri(owned)}


def test_dry_run_lists_exactly_what_the_run_does(table_uri, media):
    owned = [f"{media['owned']}/{i}.bin" for i in range(3)]
    make_table(table_uri, media, [Blob(uri=p) for p in owned])
    open_table(table_uri).delete("id < 2")
    os.remove(owned[1])  # the user deleted one already
    for step in range(3):
        before = tree(os.path.dirname(owned[0])), tree(managed_dir(table_uri))
        dry = open_table(table_uri).gc(grace=NOW, retain_versions=1, dry_run=True)
        assert (tree(os.path.dirname(owned[0])), tree(managed_dir(table_uri))) == before
        done = open_table(table_uri).gc(grace=NOW, retain_versions=1)
        assert dry["managed"] == done["managed"], step
    assert (done["managed"]["removed"], done["managed"]["already_missing"]) == (1, 1)
    assert done["managed"]["paths"] == [file_uri(owned[0])]
    assert done["managed"]["removed_bytes"] == 10_000
    assert tree(media["owned"]) == {"2.bin", owner_of("2.bin")}  # its marker went with it
    assert registered(table_uri) == {file_uri(owned[2])}


def test_bad_managed_input_names_column_and_row(table_uri, media, tmp_path):
    with pytest.raises(InvalidInputError, match="managed without a uri"):
        Blob(data=b"bytes", managed=True)
    bad = pa.StructArray.from_arrays(
        [
            pa.array([None, b"x"], pa.large_binary()),
            pa.array(["/a", None]),
            pa.array([False, True]),
        ],
        names=["data", "uri", "managed"],
    )
    with pytest.raises(InvalidInputError, match="'v', row 1: sets managed without a uri"):
        write_table(pa.table({"v": bad}), table_uri, allowed_bases=[media["shared"]])
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x")
    values = [b"ok", Blob(uri=str(outside), managed=True)]
    with pytest.raises(ExternalBlobError, match=r"'v', row 1: managed external uri .* outside"):
        make_table(table_uri, media, values)
    make_table(table_uri, media, [b"first"])
    inside = f"{table_uri}/data/mine.bin"
    with open(inside, "wb") as f:
        f.write(b"y")
    with pytest.raises(ExternalBlobError, match=r"'v', row 0: managed external uri .* inside the"):
        make_table(table_uri, media, [Blob(uri=inside, managed=True)], mode="append")
    with pytest.raises(InvalidInputError, match="lies inside the table"):
        write_table(
            pa.table({"v": [b"x"]}),
            table_uri,
            mode="overwrite",
            managed_bases=[f"{table_uri}/media"],
        )
    assert open_table(table_uri).count_rows() == 1 and registered(table_uri) == set()


def test_a_row_cannot_hand_the_table_an_object_under_a_root_base(table_uri, media):
    # an allowed base may be a root (reads of any file); a root is never where gc deletes
    path = f"{media['shared']}/0.bin"
    write_table(pa.table({"v": blob_array([b"first"])}), table_uri, allowed_bases=["/"])
    values = pa.table({"v": blob_array([Blob(uri=path, managed=True)])})
    with pytest.raises(ExternalBlobError, match=r"'v', row 0: managed external uri .* root"):
        write_table(values, table_uri, mode="append")
    assert open_table(table_uri).version == 1 and registered(table_uri) == set()
    write_table(pa.table({"v": blob_array([Blob(uri=path)])}), table_uri, mode="append")
    assert open_table(table_uri).read_blobs("v", [1]) == [content(path)]


def test_gc_keeps_a_registered_object_whose_only_base_became_a_root(table_uri, media):
    owned = f"{media['owned']}/0.bin"
    make_table(table_uri, media, [Blob(uri=owned)])
    assert registered(table_uri) == {file_uri(owned)}
    # another tool leaves the root as the table's only base (bases are only added to here)
    dataset = lance.dataset(table_uri)
    metadata = {k.decode(): v.decode() for k, v in dataset.schema.metadata.items()}
    settings = {**json.loads(metadata["blobhouse"]), "allowed_bases": ["file:///"]}
    settings["managed_bases"] = []
    dataset.update_schema_metadata({"blobhouse": json.dumps(settings)})
    assert open_table(table_uri).properties.allowed_bases == ("file:///",)
    open_table(table_uri).delete("id >= 0")
    reports = gc_runs(table_uri, runs=4)
    assert reports[-1]["kept_outside_bases"] == 1 and reports[-1]["removed"] == 0
    assert os.path.exists(owned)


def test_managed_wins_once_registered(table_uri, media):
    """One row hands the object over, another references it plainly: it stays while any row
    references it, and goes once none does."""
    shared = f"{media['shared']}/2.bin"
    make_table(table_uri, media, [Blob(uri=shared, managed=True), Blob(uri=shared)])
    # a later plain reference to it is a managed reference too
    make_table(table_uri, media, [Blob(uri=shared)], mode="append")
    stats = open_table(table_uri).stats()
    assert stats["external_references"]["managed"]["references"] == 3
    assert stats["external_references"]["unmanaged"]["references"] == 0
    open_table(table_uri).delete("id = 0")
    assert all(r["removed"] == 0 for r in gc_runs(table_uri)) and os.path.exists(shared)
    open_table(table_uri).delete("id >= 0")
    assert [r["removed"] for r in gc_runs(table_uri)] == [0, 0, 1]
    assert not os.path.exists(shared)


@pytest.mark.filterwarnings("ignore::blobhouse.errors.MovedTableWarning")
def test_compaction_keeps_ownership_and_a_copied_table_takes_none(table_uri, media, tmp_path):
    owned = [f"{media['owned']}/{i}.bin" for i in range(3)]
    for path in owned:
        make_table(table_uri, media, [Blob(uri=path)], mode="append")
    open_table(table_uri).delete("id = 0 AND v IS NOT NULL")  # every fragment has row id 0
    assert open_table(table_uri).count_rows() == 0
    make_table(table_uri, media, [Blob(uri=owned[2])], mode="append")
    open_table(table_uri).compact()
    assert registered(table_uri) == {file_uri(p) for p in owned}
    reports = gc_runs(table_uri)
    assert [r["removed"] for r in reports] == [0, 0, 2]
    assert tree(media["owned"]) == {"2.bin", owner_of("2.bin")}
    assert open_table(table_uri).read_blobs("v", [0]) == [content(owned[2])]

    copy = str(tmp_path / "copy")
    shutil.copytree(table_uri, copy)
    open_table(copy).delete("id >= 0")
    reports = [open_table(copy).gc(grace=NOW, retain_versions=1)["managed"] for _ in range(3)]
    assert all(r["registered"] == 0 and r["foreign_entries"] == 1 for r in reports)
    assert os.path.exists(owned[2])  # the original still references it


def test_nothing_is_retired_while_some_references_cannot_be_read(table_uri, media):
    owned = [f"{media['owned']}/{i}.bin" for i in range(2)]
    make_table(table_uri, media, [Blob(uri=owned[0])])
    make_table(table_uri, media, [Blob(uri=owned[1])], mode="append")
    open_table(table_uri).delete("id = 0")  # both rows have id 0: only old versions have them
    lost = sorted(p for p in tree(f"{table_uri}/data") if p.endswith(".lance"))[0]
    os.remove(f"{table_uri}/data/{lost}")  # a data file of a retained version is gone
    reports = [open_table(table_uri).gc(grace=NOW)["managed"] for _ in range(3)]
    # what the readable one references is known; the other object cannot be judged
    assert all((r["referenced"], r["undecided"]) == (1, 1) for r in reports)
    assert all(r["retired"] == r["doomed"] == r["removed"] == 0 for r in reports)
    assert all(os.path.exists(p) for p in owned)


def test_a_write_referencing_a_doomed_object_commits_nothing(table_uri, media):
    """A retired object may be referenced again (it is resurrected); a doomed one may not, by
    a managed or a plain reference (managed wins once registered)."""
    flagged = f"{media['shared']}/0.bin"
    make_table(table_uri, media, [Blob(uri=flagged, managed=True), b"x"])
    open_table(table_uri).delete("id = 0")
    gc(table_uri)  # retired: referencing it again is fine and takes it back
    make_table(table_uri, media, [Blob(uri=flagged, managed=True)], mode="append")
    assert gc(table_uri)["resurrected"] == 1
    open_table(table_uri).delete("id = 0")
    assert [r["doomed"] for r in gc_runs(table_uri, runs=2)] == [0, 1]
    assert os.listdir(f"{managed_dir(table_uri)}/{DOOMED_DIR}")
    version = open_table(table_uri).version
    for value in (Blob(uri=flagged, managed=True), Blob(uri=flagged)):
        with pytest.raises(ManagedObjectRaceError, match="being deleted by gc"):
            make_table(table_uri, media, [value], mode="append")
    assert open_table(table_uri).version == version
    assert gc(table_uri)["removed"] == 1 and not os.path.exists(flagged)


def test_a_managed_object_gone_before_the_commit_commits_nothing(table_uri, media):
    owned = f"{media['owned']}/1.bin"
    make_table(table_uri, media, [b"x"])
    batch = pa.record_batch({"id": pa.array([1], pa.int64()), "v": blob_array([Blob(uri=owned)])})
    write = begin_write(table_uri, batch.schema, mode="append", in_tasks=True)
    written = write.plan.write([batch])
    os.remove(owned)  # deleted while the write ran (by someone, or by gc)
    with pytest.raises(ManagedObjectRaceError, match="are gone"):
        write.commit(written)
    assert open_table(table_uri).version == 1 and registered(table_uri) == set()


def test_stats_and_verify_report_managed_and_unmanaged_apart(table_uri, media):
    owned = [f"{media['owned']}/{i}.bin" for i in range(2)]
    plain = f"{media['shared']}/2.bin"
    values = [Blob(uri=owned[0]), Blob(uri=owned[0]), Blob(uri=owned[1]), Blob(uri=plain), b"b"]
    table = make_table(table_uri, media, values)
    stats = table.stats()
    refs = stats["external_references"]
    assert refs["managed"] == {"references": 3, "objects": 2, "bytes": 10_000 + 10_001}
    assert refs["unmanaged"] == {"references": 1, "objects": 1, "bytes": 10_002}
    kinds = stats["columns"]["v"]["kinds"]
    assert (kinds["managed"]["rows"], kinds["external"]["rows"]) == (3, 1)
    assert not kinds["managed"]["table_owned"]
    assert stats["managed_bytes"] == 20_001
    assert stats["external_bytes"] == 20_001 + 10_002
    assert stats["physical_bytes"] == stats["table_owned_bytes"] + stats["external_bytes"]

    os.remove(owned[1])
    os.remove(plain)
    report = open_table(table_uri).verify()
    assert report["missing_objects"] == {"table": 0, "managed": 1, "unmanaged": 1}
    owners = {p["uri"]: p["owner"] for p in report["problems"]}
    assert owners == {file_uri(owned[1]): "managed", file_uri(plain): "unmanaged"}


def test_cli_reports_managed_objects(table_uri, media, capsys):
    make_table(
        table_uri,
        media,
        [Blob(uri=f"{media['owned']}/0.bin"), Blob(uri=f"{media['shared']}/0.bin")],
    )
    assert main(["stats", table_uri]) == 0
    out = capsys.readouterr().out
    assert "managed refs" in out and "unmanaged refs" in out
    os.remove(f"{media['owned']}/0.bin")
    assert main(["verify", table_uri]) == 1
    assert "missing objects: 1 managed" in capsys.readouterr().out
    assert main(["gc", table_uri, "--json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["managed"]["registered"] == 1


def test_spark_write_of_managed_blobs(spark, tmp_path, media):
    import blobhouse.spark as bs
    from blobhouse.spark import gc as spark_gc

    uri = str(tmp_path / "t")
    flagged = f"{media['shared']}/1.bin"
    in_base = f"{media['owned']}/1.bin"
    plain = f"{media['shared']}/2.bin"
    rows = [(0, None, flagged, True), (1, None, in_base, False), (2, None, plain, None)]
    rows += [(3 + i, os.urandom(100), None, None) for i in range(6)]
    df = spark.createDataFrame(
        [(i, (data, path, flag)) for i, data, path, flag in rows],
        "id long, v struct<data binary, uri string, managed boolean>",
    ).repartition(3)
    (
        df.write.format("blobhouse")
        .mode("append")
        .option("allowed_bases", media["shared"])
        .option("managed_bases", media["owned"])
        .save(uri)
    )
    assert registered(uri) == {file_uri(flagged), file_uri(in_base)}
    refs = open_table(uri).stats()["external_references"]
    assert (refs["managed"]["objects"], refs["unmanaged"]["objects"]) == (2, 1)
    open_table(uri).delete("id < 3")
    reports = [spark_gc(spark, uri, grace=NOW, retain_versions=1)["managed"] for _ in range(3)]
    assert [r["removed"] for r in reports] == [0, 0, 2]
    assert not os.path.exists(flagged) and not os.path.exists(in_base)
    assert os.path.exists(plain)

    # dedup="global" stores payloads first and keeps the flag of the rows it references
    kept = f"{media['shared']}/0.bin"
    globally = str(tmp_path / "global")
    frame = spark.createDataFrame(
        [(0, (None, kept, True)), (1, (b"p" * 1000, None, None)), (2, (b"p" * 1000, None, None))],
        "id long, v struct<data binary, uri string, managed boolean>",
    )
    bs.write_table(frame, globally, dedup="global", options={"allowed_bases": media["shared"]})
    assert registered(globally) == {file_uri(kept)}
    read = open_table(globally).to_arrow(blobs="bytes").to_pylist()
    assert {r["id"]: r["v"] for r in read} == {0: content(kept), 1: b"p" * 1000, 2: b"p" * 1000}


def write_manifest(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_ingest_managed_references_files_in_place_and_owns_them(spark, tmp_path, media, capsys):
    from blobhouse.spark.ingest import plan_ingest  # blobhouse.spark needs pyspark

    folder = media["owned"]
    manifest = write_manifest(
        tmp_path / "rows.jsonl", [{"id": i, "image": f"owned/{i % 3}.bin"} for i in range(6)]
    )
    table = str(tmp_path / "table")
    args = [manifest, table, "--blob-columns", "image", "--master", "local[2]", "--managed"]
    assert main(["ingest", *args]) == 2  # the table has no bases to reference files under
    assert "--allowed-bases" in capsys.readouterr().err
    assert main(["ingest", *args, "--allowed-bases", folder]) == 0
    stats = open_table(table).stats()
    assert stats["table_owned_bytes"] == 0  # nothing copied
    assert stats["external_references"]["managed"] == {
        "references": 6,
        "objects": 3,
        "bytes": 3 * 10_000 + 3,
    }
    assert registered(table) == {file_uri(f"{folder}/{i}.bin") for i in range(3)}
    assert open_table(table).read_blobs("image", [4]) == [content(f"{folder}/1.bin")]

    outside = write_manifest(tmp_path / "out.jsonl", [{"id": 9, "image": "shared/0.bin"}])
    with pytest.raises(InvalidInputError, match=r"row 1, column 'image': shared/0.bin: managed"):
        plan_ingest(outside, table, ["image"], managed=True)
    with pytest.raises(InvalidInputError, match="not by an append"):
        plan_ingest(manifest, table, ["image"], managed=True, allowed_bases=[media["shared"]])
    with pytest.raises(InvalidInputError, match="does not apply to a managed ingest"):
        plan_ingest(manifest, table, ["image"], managed=True, dedup="global")

    # a new version without two of the files: gc deletes them once no version needs them
    fewer = write_manifest(tmp_path / "fewer.jsonl", [{"id": 0, "image": "owned/0.bin"}])
    assert (
        main(
            [
                "ingest",
                fewer,
                table,
                "--blob-columns",
                "image",
                "--master",
                "local[2]",
                "--managed",
                "--mode",
                "overwrite",
                "--allowed-bases",
                folder,
            ]
        )
        == 0
    )
    reports = gc_runs(table)
    assert [r["removed"] for r in reports] == [0, 0, 2]
    assert tree(folder) == {"0.bin", owner_of("0.bin")}


def test_update_and_merge_insert_hand_over_and_release_managed_objects(table_uri, media):
    """A mutation is a commit like any other: the objects it references are handed over, the
    ones it stops referencing are deleted by gc once no retained version needs them."""
    first, second, third = (f"{media['owned']}/{i}.bin" for i in range(3))
    shared = f"{media['shared']}/0.bin"
    table = make_table(table_uri, media, [Blob(uri=first), b"bytes"])
    report = table.update(
        {"v": lambda rows: [Blob(uri=second) for _ in range(rows.num_rows)]}, where="id = 0"
    )
    assert report.rows_updated == 1
    assert registered(table_uri) == {file_uri(first), file_uri(second)}
    upsert = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "v": blob_array([Blob(uri=third), Blob(uri=shared, managed=True)]),
        }
    )
    merged = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    assert merged.execute(upsert).num_inserted_rows == 1
    assert registered(table_uri) == {file_uri(p) for p in (first, second, third, shared)}
    assert table.read_blobs("v", [0, 1, 2]) == [content(p) for p in (second, third, shared)]

    results = gc_runs(table_uri)  # `first` is referenced by no retained version any more
    assert [r["removed"] for r in results] == [0, 0, 1]
    assert results[-1]["paths"] == [file_uri(first)]
    assert not os.path.exists(first)
    assert all(os.path.exists(p) for p in (second, third, shared))
    assert open_table(table_uri).verify()["problems"] == []


def test_a_failed_update_hands_nothing_over(table_uri, media):
    owned = f"{media['owned']}/1.bin"
    table = make_table(table_uri, media, [b"a", b"b"])
    outside = f"{os.path.dirname(media['owned'])}/nowhere.bin"
    with open(outside, "wb") as f:
        f.write(b"not under a base")
    with pytest.raises(ExternalBlobError, match="'v', row 1"):
        table.update({"v": lambda rows: [Blob(uri=owned), Blob(uri=outside)]})
    assert registered(table_uri) == set()
    assert open_table(table_uri).version == table.version
    assert open_table(table_uri).read_blobs("v", [0, 1]) == [b"a", b"b"]
