"""The blob preparation API of seed 001: sessions, column writers, loaders, commit paths, and
column backfill (Python and Spark)."""

from __future__ import annotations

import os
import time

import lance
import pyarrow as pa
import pytest
from lance.blob import blob_field as lance_blob_field

import blobhouse.spark as bs
from blobhouse import (
    BlobSession,
    InvalidInputError,
    SchemaError,
    blob_array,
    blob_field,
    open_table,
    write_table,
)
from blobhouse.errors import BlobhouseError, ExternalBlobError
from blobhouse.files.session import MAX_U64, PREPARED_TYPE
from blobhouse.values import is_lance_blob_field
from tests.helpers import placed_sidecar, stock_read, tree, wait_for_idle_tasks

SCHEMA = pa.schema([pa.field("id", pa.int64()), blob_field("img")])


@pytest.fixture
def table(table_uri, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "clip.bin").write_bytes(os.urandom(4000))
    return write_table(SCHEMA.empty_table(), table_uri, allowed_bases=[str(media)])


def test_every_kind_of_prepared_value_in_one_column(table, tmp_path):
    session = BlobSession(table.data_file_path())
    existing_pack, existing_dedicated = os.urandom(3000), os.urandom(6000)
    placed_sidecar(session, 1, existing_pack)
    placed_sidecar(session, 2, existing_dedicated)
    images = session.open_writer("img")
    pack = images.new_packed()
    a, b = pack.write_blob(b"alpha" * 100), pack.write_blob(b"beta" * 100)
    assert pack.blob_id == 3  # 1 and 2 are taken by existing sidecars
    assert pack.finish() == [a, b]
    dedicated = images.new_dedicated()
    big = os.urandom(300_000)
    for start in range(0, len(big), 100_000):
        dedicated.write(big[start : start + 100_000])
    whole = dedicated.finish()
    loaded = images.load_packed(1, offsets=[0, 1000], sizes=[1000, 2000])
    loaded_dedicated = images.load_dedicated(2)
    assert loaded_dedicated.size == 6000
    images.extend([a, b, a, whole])
    images.extend(loaded)
    images.append(loaded_dedicated)
    images.append_inline(b"tiny")
    images.append_external(str(tmp_path / "media" / "clip.bin"), position=10, size=20)
    images.append_null()
    column = images.finish()
    assert column.type == PREPARED_TYPE and images.field.name == "img"
    written = session.write_data_file(pa.table({"id": range(len(column)), "img": column}))
    updated = table.add_data_file(written)
    clip = (tmp_path / "media" / "clip.bin").read_bytes()
    expected = [
        b"alpha" * 100,
        b"beta" * 100,
        b"alpha" * 100,
        big,
        existing_pack[:1000],
        existing_pack[1000:3000],
        existing_dedicated,
        b"tiny",
        clip[10:30],
        None,
    ]
    assert stock_read(updated.dataset.uri, "img") == expected
    assert updated.read_blobs("img", list(range(len(expected)))) == expected
    # rows 0 and 2 share one stored copy
    d = lance.dataset(updated.dataset.uri).to_table(columns=["img"]).column("img").to_pylist()
    assert (d[0]["blob_id"], d[0]["position"]) == (d[2]["blob_id"], d[2]["position"])
    # the table shows the logical blob field, never the prepared layout
    assert is_lance_blob_field(open_table(updated.dataset.uri).schema.field("img"))
    assert open_table(updated.dataset.uri).schema.field("img").type != PREPARED_TYPE


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.load_packed(0, [0], [1]), "blob_id must be an integer in 1"),
        (lambda w: w.load_dedicated(2**32), "blob_id must be an integer in 1"),
        (lambda w: w.load_packed(7, [0], [1]), "no sidecar .* in the namespace"),
        (lambda w: w.load_packed(1, [90], [20]), r"range \[90, \+20\) is past the end"),
        (lambda w: w.load_packed(1, [MAX_U64], [2]), "out of range"),
        (lambda w: w.load_packed(1, [-1], [2]), "out of range"),
        (lambda w: w.load_packed(1, [0, 5], [1]), "2 offsets but 1 sizes"),
        (lambda w: w.append("not a value"), "append takes a PreparedBlob"),
        (lambda w: w.append_external("/etc/passwd"), "outside the table's allowed bases"),
    ],
)
def test_loaders_and_writers_validate(table, call, message):
    session = BlobSession(table.data_file_path())
    placed_sidecar(session, 1, b"x" * 100)
    with pytest.raises((InvalidInputError, ExternalBlobError), match=message):
        call(session.open_writer("img"))


def test_session_paths_must_be_data_files_of_a_table(table):
    root = table.dataset.uri
    for bad in (f"{root}/data/../x.lance", f"{root}/other/x.lance", f"{root}/data/x.parquet"):
        with pytest.raises(BlobhouseError, match="data"):
            BlobSession(bad)


def test_loaded_ids_are_never_allocated_again(table):
    session = BlobSession(table.data_file_path())
    placed_sidecar(session, 5, b"y" * 10)
    writer = session.open_writer("img")
    writer.load_dedicated(5)
    assert [session.allocate_blob_id() for _ in range(6)] == [1, 2, 3, 4, 6, 7]


def test_exact_schema_surfaces(table, table_uri):
    session = BlobSession(table.data_file_path())
    with pytest.raises(InvalidInputError, match="'img' is a logical blob struct"):
        session.write_data_file(pa.table({"id": [1], "img": blob_array([b"x"])}))
    images = session.open_writer("img")
    images.append_inline(b"x")
    prepared = pa.table({"id": [1], "img": images.finish()})
    with pytest.raises(SchemaError, match="'img' is a prepared blob column"):
        write_table(prepared, table_uri + "-2")
    near = pa.array(
        [{"data": b"x", "uri": None, "extra": 1}],
        pa.struct([("data", pa.binary()), ("uri", pa.string()), ("extra", pa.int8())]),
    )
    with pytest.raises(SchemaError, match="'img' looks like a blob struct"):
        write_table(pa.table({"img": near}), table_uri + "-3")


def test_add_data_file_with_missing_columns_changes_nothing(table):
    before = tree(table.dataset.uri)
    session = BlobSession(table.data_file_path())
    images = session.open_writer("img")
    images.append_inline(b"x")
    written = session.write_data_file(pa.table({"img": images.finish()}))
    with pytest.raises(SchemaError, match=r"lacks column\(s\) \['id'\]"):
        table.add_data_file(written)
    assert open_table(table.dataset.uri).version == table.version
    assert tree(table.dataset.uri) - before <= {f"data/{written.name}"}


@pytest.fixture
def fragmented(table_uri):
    """Three fragments, one with a deleted row."""
    data = pa.table({"id": pa.array(range(9), pa.int64()), "name": [f"n{i}" for i in range(9)]})
    table = write_table(data, table_uri, max_rows_per_file=3)
    table.delete("id = 4")
    return open_table(table_uri)


def render(batch: pa.RecordBatch) -> list[bytes]:
    return [b"%s-" % n.encode() * 30_000 for n in batch.column("name").to_pylist()]


def test_backfill_adds_a_new_blob_column(fragmented):
    read_version = fragmented.version
    updated = fragmented.backfill_blob_column("img", render)
    assert updated is fragmented  # a change moves the table it was made through
    names = updated.to_arrow(columns=["name"]).column("name").to_pylist()
    assert len(updated.dataset.get_fragments()) == 3
    assert stock_read(updated.dataset.uri, "img") == [b"%s-" % n.encode() * 30_000 for n in names]
    assert updated.version == read_version + 1


def test_backfill_replaces_an_existing_column(table_uri):
    data = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "name": [f"n{i}" for i in range(6)],
            "img": blob_array([b"old"] * 6),
        }
    )
    table = write_table(data, table_uri, max_rows_per_file=2)
    updated = table.backfill_blob_column(
        "img", lambda b: [b"new-" + n.encode() for n in b["name"].to_pylist()]
    )
    assert stock_read(table_uri, "img") == [b"new-n%d" % i for i in range(6)]
    assert updated.to_arrow(columns=["id"]).column("id").to_pylist() == list(range(6))
    assert open_table(table_uri, version=1).read_blobs("img", [0]) == [b"old"]


def test_backfill_after_a_column_was_dropped(fragmented):
    """Lance reserves a dropped column's field id: a new column cannot be added with its data
    in one Merge. The backfill adds it first (all null, a manifest only: Lance's add_columns),
    then its files replace the nulls (DataReplacement): one call, two versions."""
    uri = fragmented.dataset.uri
    data = pa.table({"id": pa.array(range(9), pa.int64()), "name": [f"n{i}" for i in range(9)]})
    write_table(
        data.append_column("extra", pa.array(range(9))), uri, mode="overwrite", dedup="content"
    )
    lance.dataset(uri).drop_columns(["extra"])  # its data stays in the files: its id too
    version = open_table(uri).version
    updated = open_table(uri).backfill_blob_column("img", render)
    assert updated.version == version + 2
    names = updated.to_arrow(columns=["name"]).column("name").to_pylist()
    assert updated.read_blobs("img", range(len(names))) == render(pa.record_batch({"name": names}))
    assert stock_read(uri, "img") == render(pa.record_batch({"name": names}))
    assert updated.verify(deep=True)["problems"] == []
    # the way users had to take before: Lance adds the column, the backfill fills it
    lance.dataset(uri).drop_columns(["img"])
    lance.dataset(uri).add_columns(lance_blob_field("img"))
    again = open_table(uri).backfill_blob_column("img", render)
    assert stock_read(uri, "img") == render(pa.record_batch({"name": names}))
    assert again.version == version + 5


def test_failed_backfill_leaves_the_table_unchanged(fragmented):
    before = tree(fragmented.dataset.uri)

    def fails_on_third_fragment(batch):
        if 7 in batch.column("id").to_pylist():
            raise RuntimeError("renderer crashed on id 7")
        return render(batch)

    with pytest.raises(RuntimeError, match="id 7"):
        fragmented.backfill_blob_column("img", fails_on_third_fragment)
    assert tree(fragmented.dataset.uri) == before
    with pytest.raises(InvalidInputError, match="returned 1 values for a batch of"):
        fragmented.backfill_blob_column("img", lambda b: [b"x"])
    assert tree(fragmented.dataset.uri) == before
    assert open_table(fragmented.dataset.uri).version == fragmented.version


def test_spark_backfill_on_a_multi_fragment_table(spark, fragmented):
    uri = fragmented.dataset.uri

    def render_on_executors(batch):  # defined here so Spark ships it by value
        return [b"%s-" % n.encode() * 30_000 for n in batch.column("name").to_pylist()]

    bs.backfill_blob_column(spark, uri, "img", render_on_executors)
    updated = open_table(uri)
    names = updated.to_arrow(columns=["name"]).column("name").to_pylist()
    assert stock_read(uri, "img") == [b"%s-" % n.encode() * 30_000 for n in names]
    before = tree(uri)

    def broken(batch):
        raise ValueError("renderer failed in a Spark task")

    with pytest.raises(Exception, match="renderer failed"):
        bs.backfill_blob_column(spark, uri, "img2", broken)
    wait_for_idle_tasks(spark)
    # tasks that ended after the driver's sweep cleaned up after themselves: at most the abort
    # marker and the lease a cancelled task touched last are left, and gc removes both
    left = tree(uri) - before
    assert all("aborted-" in p or p.startswith("_leases/") for p in left), left
    assert open_table(uri).version == updated.version
    past = time.time() - 48 * 3600
    for path in left:
        os.utime(os.path.join(uri.removeprefix("file://"), path), (past, past))
    open_table(uri).gc()
    assert tree(uri) == before


def test_replace_column_of_one_fragment_with_a_session_file(table_uri):
    data = pa.table({"id": pa.array(range(4), pa.int64()), "img": blob_array([b"old"] * 4)})
    table = write_table(data, table_uri, max_rows_per_file=2)
    fragment = table.dataset.get_fragments()[1]

    def session_file(rows: int):
        session = BlobSession(table.data_file_path())
        images = session.open_writer("img")
        for i in range(rows):
            images.append_inline(b"new-%d" % i)
        ids = pa.array(range(2, 2 + rows), pa.int64())
        return session.write_data_file(pa.table({"id": ids, "img": images.finish()}))

    with pytest.raises(InvalidInputError, match="has 2 rows, its new file for 'img' has 3"):
        table.replace_column("img", {fragment.fragment_id: session_file(3)})
    session = BlobSession(table.data_file_path())
    images = session.open_writer("img")
    images.extend([None, None])
    swapped = session.write_data_file(pa.table({"img": images.finish(), "id": [2, 3]}))
    with pytest.raises(SchemaError, match=r"must hold the columns \['id', 'img'\] in that order"):
        table.replace_column("img", {fragment.fragment_id: swapped})
    with pytest.raises(InvalidInputError, match=r"no such fragment\(s\) \[99\]"):
        table.replace_column("img", {99: session_file(2)})
    assert open_table(table_uri).version == table.version
    read_version = table.version
    updated = table.replace_column("img", {fragment.fragment_id: session_file(2)})
    assert stock_read(table_uri, "img") == [b"old", b"old", b"new-0", b"new-1"]
    assert updated.version == read_version + 1
