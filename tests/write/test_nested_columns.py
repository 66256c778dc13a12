"""One naming rule for nested columns: every API that takes a column name takes ``meta.image``
(a blob column inside struct ``meta``) and ``meta.label`` (a plain field beside it), and a
misspelled name is refused naming the closest valid one."""

from __future__ import annotations

import pyarrow as pa
import pytest

from blobhouse import blob_array, write_table
from blobhouse.columns import column_paths, lance_name, resolve_column
from blobhouse.errors import ColumnNameError, InvalidInputError
from blobhouse.loader import BatchLoader

IMAGES = [b"img-1" * 100, b"img-2" * 100, b"img-3" * 100, b"img-4" * 100]
LABELS = ["cat", "dog", "eel", "fox"]


def _meta(images: list[bytes | None], labels: list[str]) -> pa.StructArray:
    return pa.StructArray.from_arrays([blob_array(images), pa.array(labels)], ["image", "label"])


@pytest.fixture
def table(tmp_path):
    data = pa.table({"id": [1, 2, 3, 4], "meta": _meta(IMAGES, LABELS)})
    return write_table(data, str(tmp_path / "t"))


def _rows(table) -> list[dict]:
    return sorted(table.to_arrow(blobs="bytes").to_pylist(), key=lambda r: r["id"])


def test_resolve_column_rule():
    schema = pa.schema([("id", pa.int64()), ("meta", _meta(IMAGES, LABELS).type)])
    assert list(column_paths(schema)) == ["id", "meta", "meta.image", "meta.label"]
    assert resolve_column(schema, "meta.image") == ("meta", "image")
    # a blob column is a leaf: its struct's own fields are not columns
    with pytest.raises(InvalidInputError, match=r"unknown column 'meta.image.data'"):
        resolve_column(schema, "meta.image.data")
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.label'\?"):
        resolve_column(schema, "meta.lable")
    assert lance_name(("s", "a.b")) == "s.`a.b`"


def test_top_level_dotted_name_is_refused(tmp_path):
    """Lance refuses a dot at top level (raw, while it commits): blobhouse says so first."""
    with pytest.raises(ColumnNameError, match=r"'a\.b' must be without '\.' at top level"):
        write_table(pa.table({"a.b": [1]}), str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_child_name_with_a_dot_is_addressable(tmp_path):
    s = pa.StructArray.from_arrays([pa.array([1, 2]), blob_array([b"x", b"y"])], ["a.b", "img"])
    t = write_table(pa.table({"s": s}), str(tmp_path / "t"))
    assert t.to_arrow(columns=["s.a.b"]).to_pylist() == [{"s.a.b": 1}, {"s.a.b": 2}]


def test_read_blobs_and_open_blob(table):
    assert table.blob_columns == ["meta.image"]
    assert table.read_blobs("meta.image", [0, 3]) == [IMAGES[0], IMAGES[3]]
    with table.open_blob("meta.image", 1) as f:
        assert f.read() == IMAGES[1]
    assert table.blob_refs("meta.image", [2]).field("size").to_pylist() == [len(IMAGES[2])]
    for read in (table.read_blobs, table.blob_refs):
        with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
            read("meta.imag", [0])


def test_columns_select_like_lance_scan(table):
    """``columns=["meta.image"]`` gives a top-level column named ``meta.image``, as pylance's
    ``to_table(columns=...)`` does; every read gives the same shape."""
    lance_names = table.dataset.to_table(columns=["meta.label", "id"]).schema.names
    out = table.to_arrow(columns=["meta.label", "meta.image", "id"], blobs="bytes")
    assert out.schema.names == ["meta.label", "meta.image", "id"]
    assert lance_names == ["meta.label", "id"]
    assert out.column("meta.image").to_pylist() == IMAGES
    assert out.column("meta.label").to_pylist() == LABELS
    assert table.output_schema(["meta.image"], "bytes").field("meta.image").type == (
        pa.large_binary()
    )
    batches = list(table.scan(columns=["meta.image"], blobs="bytes", batch_size=2))
    assert [v for b in batches for v in b.column("meta.image").to_pylist()] == IMAGES
    taken = table.take([3, 0], columns=["meta.image", "meta.label"], blobs="bytes")
    assert taken.to_pylist() == [
        {"meta.image": IMAGES[3], "meta.label": "fox"},
        {"meta.image": IMAGES[0], "meta.label": "cat"},
    ]
    ids = table.row_ids("id >= 3")
    assert table.take_rows(ids, columns=["meta.image"], blobs="bytes").to_pylist() == [
        {"meta.image": IMAGES[2]},
        {"meta.image": IMAGES[3]},
    ]
    assert table.take_row_dicts(ids, columns=["id", "meta.image"]) == [
        {"id": 3, "meta.image": IMAGES[2]},
        {"id": 4, "meta.image": IMAGES[3]},
    ]
    refs = table.to_arrow(columns=["meta.image"]).column("meta.image")
    assert refs.type.names == ["uri", "position", "size", "blake3"]
    empty = table.take_rows([], columns=["meta.image"], blobs="bytes")
    assert empty.schema.names == ["meta.image"]


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.to_arrow(columns=["meta.imag"]),
        lambda t: list(t.scan(columns=["meta.imag"])),
        lambda t: t.take([0], columns=["meta.imag"]),
        lambda t: t.take_rows(t.row_ids(), columns=["meta.imag"]),
        lambda t: t.take_row_dicts(t.row_ids(), columns=["meta.imag"]),
    ],
)
def test_misspelled_selection_names_closest(table, read):
    with pytest.raises(InvalidInputError, match=r"unknown column 'meta.imag' \(did you mean"):
        read(table)


def test_update_nested_blob_keeps_siblings(table):
    report = table.update(
        {"meta.image": lambda b: [b"new-%d" % i for i in b["id"].to_pylist()]}, where="id >= 3"
    )
    assert report.rows_updated == 2 and report.columns == ("meta.image",)
    rows = _rows(table)
    assert [r["meta"]["image"] for r in rows] == [IMAGES[0], IMAGES[1], b"new-3", b"new-4"]
    assert [r["meta"]["label"] for r in rows] == LABELS
    assert table.verify(deep=True)["problems"] == []
    table.update({"meta.label": "upper(meta.label)"}, where="id = 1")
    rows = _rows(table)
    assert [r["meta"]["label"] for r in rows] == ["CAT", "dog", "eel", "fox"]
    assert [r["meta"]["image"] for r in rows] == [IMAGES[0], IMAGES[1], b"new-3", b"new-4"]
    table.update({"meta.image": None}, where="id = 2")
    assert table.read_blobs("meta.image", [0, 1]) == [IMAGES[0], None]


def test_update_refuses_bad_nested_names(table):
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        table.update({"meta.imag": None})
    with pytest.raises(InvalidInputError, match=r"'meta' holds blob column\(s\)"):
        table.update({"meta": None})
    with pytest.raises(InvalidInputError, match="names both"):
        table.update({"meta.label": "'x'", "meta.image": None, "meta": "null"})


def test_backfill_existing_nested_blob(table):
    table.backfill_blob_column("meta.image", lambda b: [b"b-%d" % i for i in b["id"].to_pylist()])
    assert table.read_blobs("meta.image", [0, 3]) == [b"b-1", b"b-4"]
    assert [r["meta"]["label"] for r in _rows(table)] == LABELS
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        table.backfill_blob_column("meta.imag", lambda b: [])
    with pytest.raises(InvalidInputError, match="top-level blob columns only"):
        table.backfill_blob_column("meta.label", lambda b: [])


def test_properties_take_nested_names(table):
    table.set_properties(
        dedup={"meta.image": "content"}, placement={"meta.image": {"inline_size_threshold": 0}}
    )
    assert table.properties.dedup_of("meta.image") == "content"
    for bad in (
        {"dedup": {"meta.imag": "off"}},
        {"placement": {"meta.imag": {}}},
        {"ref_id_columns": {"meta.imag": "id"}},
    ):
        with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
            table.set_properties(**bad)


def test_write_options_take_nested_names(tmp_path):
    data = pa.table({"id": [1, 2, 3], "meta": _meta([b"a", b"a", b"b"], ["x", "y", "z"])})
    t = write_table(
        data,
        str(tmp_path / "t"),
        dedup={"meta.image": "content"},
        placement={"meta.image": {"inline_size_threshold": 0}},
    )
    assert t.properties.dedup_of("meta.image") == "content"
    assert t.read_blobs("meta.image", [0, 1, 2]) == [b"a", b"a", b"b"]
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        write_table(data, str(tmp_path / "u"), dedup={"meta.imag": "content"})
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        write_table(data, str(tmp_path / "v"), ref_id_columns={"meta.imag": "id"})


def test_merge_insert_blob_options(table):
    upsert = pa.table({"id": [4, 5], "meta": _meta([b"four", b"five"], ["FOX", "gnu"])})
    report = (
        table.merge_insert("id", dedup={"meta.image": "global"})
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (1, 1)
    assert table.read_blobs("meta.image", list(range(5)))[3:] in (
        [b"four", b"five"],
        [b"five", b"four"],
    )
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        table.merge_insert(
            "id", dedup={"meta.imag": "global"}
        ).when_not_matched_insert_all().execute(upsert)


def test_stats_name_nested_columns(table):
    assert list(table.stats()["columns"]) == ["meta.image"]


def test_loader_and_torch(table):
    loader = BatchLoader(table.uri, ["id", "meta.image"], batch_size=2, shuffle=False)
    rows = [r for batch in loader for r in batch.to_pylist()]
    assert [r["meta.image"] for r in rows] == IMAGES
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        list(BatchLoader(table.uri, ["meta.imag"], batch_size=2))
    torch_data = pytest.importorskip("blobhouse.torch")
    dataset = torch_data.TableRowDataset(table.uri, ["meta.image", "meta.label"])
    assert dataset[1] == {"meta.image": IMAGES[1], "meta.label": "dog"}
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.label'\?"):
        torch_data.TableRowDataset(table.uri, ["meta.lable"])[0]


def test_spark_materialize_nested(spark, table):
    import blobhouse.spark as bs

    df = spark.read.format("blobhouse").load(table.uri)
    rows = bs.materialize(df, ["meta.image"]).orderBy("id").collect()
    assert [bytes(r["meta"]["image"]) for r in rows] == IMAGES
    assert [r["meta"]["label"] for r in rows] == LABELS
    with pytest.raises(InvalidInputError, match=r"did you mean 'meta.image'\?"):
        bs.materialize(df, ["meta.imag"])


def test_structs_of_structs_split_across_files_and_sliced_inputs(tmp_path):
    """pylance 14's file writer panics on a slice of a struct that holds a struct (a file
    boundary inside a batch, or a caller's own slice): such columns reach it unsliced."""
    rows = 60
    deep = pa.array([{"a": i, "s": {"x": float(i), "y": str(i)}} for i in range(rows)])
    meta = pa.StructArray.from_arrays(
        [blob_array([bytes([i]) * 20 for i in range(rows)]), deep], ["image", "deep"]
    )
    data = pa.table({"id": pa.array(range(rows)), "deep": deep, "meta": meta})
    table = write_table(data, str(tmp_path / "t"), max_rows_per_file=25)
    assert len(table.dataset.get_fragments()) == 3
    table = write_table(data.slice(7, 30), table.uri, mode="append")
    got = sorted(table.to_arrow(blobs="bytes").to_pylist(), key=lambda r: r["id"])
    expected = data.to_pylist() + data.slice(7, 30).to_pylist()
    expected = sorted(expected, key=lambda r: r["id"])
    assert [r["deep"] for r in got] == [r["deep"] for r in expected]
    assert [r["meta"]["image"] for r in got] == [r["meta"]["image"]["data"] for r in expected]


def test_two_columns_with_one_dotted_name_are_refused(tmp_path):
    """``x["y.z"]`` beside ``x["y"]["z"]``: both are ``x.y.z``, so the hashes recorded for one
    were looked up for the other (an undamaged table read as corrupt): refused, naming them,
    and nothing is written."""
    a, b = blob_array([b"\x01" * 100, b"\x02" * 100]), blob_array([b"\x03" * 100] * 2)
    inner = pa.StructArray.from_arrays([b], names=["z"])
    x = pa.StructArray.from_arrays([a, inner], names=["y.z", "y"])
    uri = tmp_path / "t"
    with pytest.raises(InvalidInputError, match=r"'x\.y\.z' names two columns"):
        write_table(pa.table({"id": [0, 1], "x": x}), str(uri), dedup="content")
    assert not uri.exists() or not any(uri.rglob("*.lance"))
