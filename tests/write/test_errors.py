"""Bad input gets a clear error naming the column, row or path, and leaves the table as it was."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    ExternalBlobError,
    InvalidInputError,
    RefIdConflictError,
    SchemaError,
    TableExistsError,
    TableNotFoundError,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.values import LOGICAL_BLOB_TYPE
from tests.helpers import stock_read, tree


@pytest.fixture
def existing(table_uri, tmp_path):
    """A committed table, and a snapshot of every file it has."""
    media = tmp_path / "media"
    media.mkdir()
    (media / "ok.bin").write_bytes(b"x" * 100)
    write_table(
        pa.table({"id": [0], "b": blob_array([b"first"])}),
        table_uri,
        allowed_bases=[str(media)],
        dedup="ref_id",  # per file; appends that carry ref_ids check them
    )
    return table_uri, tree(table_uri), str(media)


def assert_unchanged(uri: str, before: set[str]) -> None:
    assert tree(uri) == before, "the failed write left files behind or changed the table"
    assert open_table(uri).version == 1
    assert stock_read(uri, "b") == [b"first"]


def append(uri, data, **kwargs):
    return write_table(data, uri, mode="append", **kwargs)


@pytest.mark.parametrize("size", [10, 100_000, 5_000_000])
def test_ref_id_conflict_names_column_ref_id_and_rows(existing, size):
    uri, before, _ = existing
    rows = [
        Blob(data=os.urandom(size), ref_id=7),
        Blob(data=b"z" * 3, ref_id=1),
        Blob(data=os.urandom(size), ref_id=7),
    ]
    with pytest.raises(RefIdConflictError, match=r"'b'.*ref_id 7.*row 0.*row 2"):
        append(uri, pa.table({"id": [1, 2, 3], "b": blob_array(rows)}), dedup="ref_id")
    assert_unchanged(uri, before)


def test_ref_id_conflict_across_batches_and_files_of_one_write(existing):
    uri, before, _ = existing
    batches = [
        pa.record_batch({"id": [i], "b": blob_array([Blob(data=bytes([i]) * 70_000, ref_id=5)])})
        for i in range(3)
    ]
    with pytest.raises(RefIdConflictError, match="row 1"):
        append(uri, batches, dedup="ref_id")
    assert_unchanged(uri, before)


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_failure_mid_stream_removes_everything_written(table_uri, dedup):
    write_table(pa.table({"id": [0], "b": blob_array([b"first"])}), table_uri, dedup=dedup)
    open_table(table_uri).set_properties(max_rows_per_file=1)  # several files before it fails
    before = tree(table_uri)

    def batches():
        for i in range(3):
            yield pa.record_batch({"id": [i], "b": blob_array([os.urandom(200_000)])})
        raise RuntimeError("upstream source failed")

    with pytest.raises(RuntimeError, match="upstream"):
        append(table_uri, batches())
    assert tree(table_uri) == before, "the failed write left files behind or changed the table"
    assert stock_read(table_uri, "b") == [b"first"]


def test_failed_create_leaves_no_table(table_uri):
    rows = [Blob(data=b"a" * 100_000, ref_id=1), Blob(data=b"b" * 100_000, ref_id=1)]
    with pytest.raises(RefIdConflictError):
        write_table(pa.table({"b": blob_array(rows)}), table_uri, dedup="ref_id")
    assert not os.path.exists(table_uri)
    with pytest.raises(TableNotFoundError):
        open_table(table_uri)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda m: {"id": [1], "b": blob_array([Blob(uri="/etc/passwd")])},
            ExternalBlobError,
            "row 0: external uri '/etc/passwd' is outside",
        ),
        (
            lambda m: {"id": [1], "b": blob_array([Blob(uri=m + "/../escape.bin")])},
            ExternalBlobError,
            "outside the table's allowed bases",
        ),
        (
            lambda m: {"id": [1], "b": blob_array([Blob(uri=m + "/missing.bin")])},
            ExternalBlobError,
            "missing.bin' does not exist",
        ),
        (
            lambda m: {"id": [1], "b": blob_array([Blob(uri=m + "/ok.bin", position=90, size=20)])},
            InvalidInputError,
            "past the end",
        ),
        (
            lambda m: {"id": [1], "b": blob_array([Blob(uri="s3://bucket/x.bin")])},
            ExternalBlobError,
            "outside",
        ),
    ],
    ids=["outside", "dotdot", "missing", "range", "other-scheme"],
)
def test_bad_external_references(existing, make, error, message):
    uri, before, media = existing
    with pytest.raises(error, match=message):
        append(uri, pa.table(make(media)))
    assert_unchanged(uri, before)


def test_negative_ref_id_names_the_row(table_uri):
    data = pa.table({"id": [1, 2], "ref": [3, -1], "b": pa.array([b"a", b"b"])})
    with pytest.raises(InvalidInputError, match=r"'b', row 1: .*ref_id -1"):
        write_table(
            data, table_uri, blob_columns=["b"], ref_id_columns={"b": "ref"}, dedup="ref_id"
        )
    assert not os.path.exists(table_uri)
    with pytest.raises(InvalidInputError, match="ref_id"):
        Blob(data=b"x", ref_id=-3)


def test_blob_inside_a_list_or_map_is_rejected(table_uri):
    in_list = pa.array(
        [[{"data": b"x", "uri": None}]],
        pa.list_(pa.struct([("data", pa.large_binary()), ("uri", pa.utf8())])),
    )
    with pytest.raises(SchemaError, match=r"'frames\.item' is inside a list"):
        write_table(pa.table({"frames": in_list}), table_uri, dedup="content")
    in_map = pa.array([[("k", b"v")]], pa.map_(pa.utf8(), pa.binary()))
    with pytest.raises(SchemaError, match="inside a map"):
        write_table(pa.table({"m": in_map}), table_uri, blob_columns=["m.value"], dedup="content")
    assert not os.path.exists(table_uri)


def test_unknown_or_wrongly_typed_blob_column(table_uri):
    data = pa.table({"id": [1], "img": [b"x"]})
    with pytest.raises(SchemaError, match=r"\['video'\].*no such column"):
        write_table(data, table_uri, blob_columns=["video"], dedup="content")
    with pytest.raises(SchemaError, match="'id' has type int64"):
        write_table(data, table_uri, blob_columns=["id"], dedup="content")
    with pytest.raises(SchemaError, match=r"ref_id column 'nope'"):
        write_table(
            data, table_uri, blob_columns=["img"], ref_id_columns={"img": "nope"}, dedup="content"
        )
    with pytest.raises(InvalidInputError, match=r"dedup must be one of .*got 'fuzzy'"):
        write_table(data, table_uri, blob_columns=["img"], dedup="fuzzy")
    with pytest.raises(InvalidInputError, match="unknown placement threshold 'inline'"):
        write_table(
            data, table_uri, blob_columns=["img"], placement={"img": {"inline": 5}}, dedup="content"
        )
    assert not os.path.exists(table_uri)


def test_wrong_value_types(table_uri):
    with pytest.raises(InvalidInputError, match="value 1 is a int"):
        blob_array([b"ok", 123])
    with pytest.raises(InvalidInputError, match="cannot write a int"):
        write_table(123, table_uri, dedup="content")
    with pytest.raises(InvalidInputError, match="both data and uri"):
        Blob(data=b"x", uri="/tmp/x")
    bad = pa.array(
        [{"data": b"x", "uri": "/tmp/y", "position": None, "size": None, "ref_id": None}],
        LOGICAL_BLOB_TYPE,
    )
    with pytest.raises(InvalidInputError, match="'b', row 0: sets both data and uri"):
        write_table(pa.table({"b": bad}), table_uri, dedup="content")
    assert not os.path.exists(table_uri)


def test_append_with_a_different_schema(existing):
    uri, before, _ = existing
    with pytest.raises(SchemaError, match="id: table has int64, data has string"):
        append(uri, pa.table({"id": ["x"], "b": blob_array([b"y"])}))
    with pytest.raises(
        SchemaError, match=r"column\(s\) \['extra'\] of the data are not in the table"
    ):
        append(uri, pa.table({"id": [1], "b": blob_array([b"y"]), "extra": [1]}))
    assert_unchanged(uri, before)


def test_mode_errors(existing):
    uri, before, _ = existing
    with pytest.raises(TableExistsError, match="already exists"):
        write_table(pa.table({"id": [1], "b": blob_array([b"y"])}), uri, dedup="content")
    with pytest.raises(InvalidInputError, match="mode must be"):
        write_table(
            pa.table({"id": [1], "b": blob_array([b"y"])}), uri, mode="upsert", dedup="content"
        )
    with pytest.raises(InvalidInputError, match="allowed_bases are set when a table is created"):
        append(uri, pa.table({"id": [1], "b": blob_array([b"y"])}), allowed_bases=["/other"])
    assert_unchanged(uri, before)


def test_allowed_bases_are_kept_with_the_table(existing):
    uri, _, media = existing
    assert open_table(uri).allowed_bases == ["file://" + os.path.realpath(media)]
    table = append(uri, pa.table({"id": [1], "b": blob_array([Blob(uri=media + "/ok.bin")])}))
    assert table.read_blobs("b", [1]) == [b"x" * 100]


SPARK_STYLE = pa.struct([("data", pa.binary()), ("uri", pa.string()), ("ref_id", pa.int64())])


@pytest.mark.parametrize(
    ("columns", "kwargs", "error", "message"),
    [
        (
            {"b": pa.array([{"data": b"x", "uri": None, "ref_id": -2}], SPARK_STYLE)},
            {"dedup": "ref_id"},
            InvalidInputError,
            r"'b', row 0: .*ref_id -2",
        ),
        ({"b": pa.array([1], pa.int64())}, {}, SchemaError, "'b' has type int64"),
        (
            {"b": blob_array([b"x"]), "frames": pa.array([[b"y"]], pa.list_(pa.binary()))},
            {"blob_columns": ["frames.item"]},
            SchemaError,
            "inside a list",
        ),
        ({"b": blob_array([b"x"])}, {"blob_columns": ["nope"]}, SchemaError, "no such column"),
        (
            {"b": blob_array([b"x"])},
            {"ref_id_columns": {"b": "ref"}},
            SchemaError,
            "ref_id column 'ref'",
        ),
    ],
    ids=["negative-ref-id", "wrong-type", "blob-in-list", "unknown-column", "unknown-ref-col"],
)
def test_bad_appends_leave_the_table_unchanged(existing, columns, kwargs, error, message):
    uri, before, _ = existing
    data = pa.table(
        {"id": pa.array([5] * len(next(iter(columns.values()))), pa.int64()), **columns}
    )
    with pytest.raises(error, match=message):
        append(uri, data, **kwargs)
    assert_unchanged(uri, before)


def test_a_task_finishing_after_abort_removes_its_own_files(existing):
    from blobhouse.errors import BlobhouseError
    from blobhouse.write import begin_write

    uri, before, _ = existing
    data = pa.table({"id": [7], "b": blob_array([os.urandom(200_000)])})
    write = begin_write(uri, data.schema, mode="append", in_tasks=True)
    write.abort([], tasks_may_run=True)  # the driver gave up while this task still ran
    with pytest.raises(BlobhouseError, match="was aborted"):
        write.plan.write(data.to_batches())
    assert {p for p in tree(uri) - before} == {f"data/aborted-{write.transaction.name_prefix}"}
    assert open_table(uri).version == 1


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_create_that_fails_mid_stream_leaves_no_folder(table_uri, dedup):
    """The store's folders a global create made go with its packs: the path is as before."""

    def batches():
        yield pa.record_batch({"id": [1], "img": blob_array([os.urandom(100_000)])})
        raise RuntimeError("the source broke")

    schema = pa.schema([("id", pa.int64()), ("img", blob_array([b"x"]).type)])
    with pytest.raises(RuntimeError, match="the source broke"):
        write_table(pa.RecordBatchReader.from_batches(schema, batches()), table_uri, dedup=dedup)
    assert not os.path.exists(table_uri)
