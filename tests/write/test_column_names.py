"""Column names Lance cannot address, or blobhouse reserves, are refused at every door that
names columns (a write, an append, Spark's ``df.write`` / ``write_table`` / SQL, ingest,
add-column, backfill, rename) with the rule in the message, before anything is written; a table
another tool gave such a name is refused by every read and service with the same message, and
a blobhouse rename repairs it."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import ColumnNameError, blob_array, blob_field, open_table, write_table
from blobhouse.columns import LANCE_ROW_COLUMNS
from tests.helpers import sized_tree, stock_read

PAYLOADS = [b"x" * 100, b"y" * 100]

# name -> the words of the rule its message must say
TOP_LEVEL = {
    "": "must not be empty",
    "a`b": "must be without '`'",
    "a\x00b": "must be without the NUL character",
    "a.b": "must be without '.' at top level",
    "__bh_source_row": "starts with '__bh_'",
    **{name: "is one of Lance's row columns" for name in LANCE_ROW_COLUMNS},
}
IN_A_STRUCT = {
    "": "must not be empty",
    "a`b": "must be without '`'",
    "\x00": "must be without the NUL",
}


def _bad_blob(name: str) -> pa.Table:
    return pa.table({"id": [1, 2], name: blob_array(PAYLOADS)})


def _bad_plain(name: str) -> pa.Table:
    return pa.table({"id": [1, 2], name: [3, 4], "img": blob_array(PAYLOADS)})


def _bad_child(name: str) -> pa.Table:
    s = pa.StructArray.from_arrays([blob_array(PAYLOADS), pa.array([1, 2])], ["img", name])
    return pa.table({"id": [1, 2], "s": s})


@pytest.mark.parametrize("name", TOP_LEVEL)
@pytest.mark.parametrize("shape", [_bad_blob, _bad_plain])
def test_a_top_level_name_lance_cannot_address_is_refused_at_create(tmp_path, name, shape):
    uri = tmp_path / "t"
    with pytest.raises(
        ColumnNameError, match=rf"column name {re.escape(repr(name))} {TOP_LEVEL[name]}"
    ):
        write_table(shape(name), str(uri))
    assert not uri.exists()  # nothing written


@pytest.mark.parametrize("name", IN_A_STRUCT)
def test_a_struct_child_lance_cannot_address_is_refused(tmp_path, name):
    with pytest.raises(
        ColumnNameError, match=rf"{re.escape(repr(name))} \(in struct 's'\) {IN_A_STRUCT[name]}"
    ):
        write_table(_bad_child(name), str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_a_struct_child_may_be_named_like_a_row_column(tmp_path):
    """Lance adds its row columns at top level only: ``s._rowid`` reads as it should."""
    table = write_table(_bad_child("_rowid"), str(tmp_path / "t"))
    assert table.to_arrow(columns=["s._rowid"]).column(0).to_pylist() == [1, 2]
    assert table.read_blobs("s.img", [1]) == [PAYLOADS[1]]
    assert table.verify(deep=True)["problems"] == []


@pytest.mark.parametrize(
    "data",
    [
        pa.Table.from_arrays([blob_array(PAYLOADS), blob_array(PAYLOADS)], ["img", "img"]),
        pa.Table.from_arrays([pa.array([1, 2]), pa.array([1, 2])], ["id", "id"]),
    ],
    ids=["blob-column-twice", "plain-column-twice"],
)
def test_a_name_given_twice_is_refused_naming_it(tmp_path, data):
    name = data.column_names[0]
    with pytest.raises(ColumnNameError, match=rf"'{name}' names two columns"):
        write_table(data, str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_an_append_with_a_bad_name_changes_nothing(tmp_path):
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [1, 2], "img": blob_array(PAYLOADS)}), uri)
    before = sized_tree(uri)
    bad = pa.Table.from_arrays(
        [pa.array([3]), pa.array([4]), blob_array([b"z"])], ["id", "id", "img"]
    )
    with pytest.raises(ColumnNameError, match="'id' names two columns"):
        write_table(bad, uri, mode="append")
    assert open_table(uri).version == table.version and sized_tree(uri) == before


def test_a_merge_whose_source_names_a_column_twice_changes_nothing(tmp_path, spark):
    from blobhouse.spark import merge_insert as spark_merge_insert

    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [1, 2], "x": [1, 2], "img": blob_array(PAYLOADS)}), uri)
    before = sized_tree(uri)
    source = pa.Table.from_arrays(
        [pa.array([1, 3]), pa.array([5, 6]), pa.array([7, 8])], ["id", "x", "x"]
    )
    merge = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    with pytest.raises(ColumnNameError, match="merge_insert's source: 'x' names two columns"):
        merge.execute(source)
    df = spark.createDataFrame([(1, 5, 7)], ["id", "x", "y"]).toDF("id", "x", "x")
    with pytest.raises(ColumnNameError, match="merge_insert's source: 'x' names two columns"):
        spark_merge_insert(df, uri, on="id")
    assert open_table(uri).version == table.version and sized_tree(uri) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.add_columns({"_rowid": "id + 1"}), "new column name '_rowid' is one of"),
        (lambda t: t.add_columns(pa.field("a`b", pa.int64())), "'a`b' must be without '`'"),
        (
            lambda t: t.add_columns(pa.field("m", pa.struct([pa.field("", pa.int8())]))),
            r"column name '' \(in struct 'm'\) must not be empty",
        ),
        (lambda t: t.add_columns(blob_field("__bh_match")), "starts with '__bh_'"),
        (lambda t: t.backfill_blob_column("_rowaddr", lambda r: None), "'_rowaddr' is one of"),
        (lambda t: t.alter_columns({"path": "id", "name": "_rowoffset"}), "'_rowoffset' is one"),
        (lambda t: t.alter_columns({"path": "img", "name": ""}), "'' must not be empty"),
        (lambda t: t.alter_columns({"path": "img", "name": "x`y"}), "must be without '`'"),
    ],
    ids=[
        "add-expression",
        "add-field",
        "add-struct-child",
        "add-blob-field",
        "backfill",
        "rename-row-column",
        "rename-empty",
        "rename-backtick",
    ],
)
def test_add_backfill_and_rename_refuse_bad_names_and_change_nothing(tmp_path, change, message):
    uri = str(tmp_path / "t")
    table = write_table(pa.table({"id": [1, 2], "img": blob_array(PAYLOADS)}), uri)
    before = sized_tree(uri)
    with pytest.raises(ColumnNameError, match=message):
        change(table)
    assert open_table(uri).version == table.version and sized_tree(uri) == before


OTHER_TOOLS_NAMES = ["_rowid", "_row_created_at_version", "", "a`b", "a\x00b"]
#: names Lance can neither read (NUL: its schema export panics), rename nor drop: the repair is
#: the newest version without them, made the latest again
UNRENAMEABLE = ("", "a\x00b")


def _misnamed_by_another_tool(uri: str, name: str) -> None:
    """A blobhouse table whose blob column Lance's own ``alter_columns`` renamed to ``name``
    (Lance lets another tool do that)."""
    write_table(pa.table({"id": [1, 2], "img": blob_array(PAYLOADS)}), uri)
    lance.dataset(uri).alter_columns({"path": "img", "name": name})


SERVICES = {
    "to_arrow": lambda t, name: t.to_arrow(blobs="bytes"),
    "read_blobs": lambda t, name: t.read_blobs(name, [0]),
    "take": lambda t, name: t.take([0]),
    "count_rows": lambda t, name: t.count_rows(),
    "verify": lambda t, name: t.verify(deep=True),
    "gc": lambda t, name: t.gc(),
    "compact": lambda t, name: t.compact(),
    "stats": lambda t, name: t.stats(),
    "update": lambda t, name: t.update({"id": "id + 10"}, where="id = 1"),
    "delete": lambda t, name: t.delete("id = 1"),
    "merge": lambda t, name: (
        t.merge_insert("id").when_matched_update_all().execute(pa.table({"id": [1]}))
    ),
}


@pytest.mark.parametrize("name", OTHER_TOOLS_NAMES)
def test_a_table_another_tool_misnamed_is_refused_by_every_read_and_service(tmp_path, name):
    """Lance's own reads of such a table fail (a panic, "No field named"): every read and
    service says which column and which rule instead, and the table stays as it was."""
    uri = str(tmp_path / "t")
    _misnamed_by_another_tool(uri, name)
    table = open_table(uri)
    before = (table.version, sized_tree(uri))
    repair = r"restore\(\) \(version 1, the newest" if name in UNRENAMEABLE else "rename it"
    for service, run in SERVICES.items():
        with pytest.raises(
            ColumnNameError, match=rf"column name {re.escape(repr(name))} .*{repair}"
        ) as caught:
            run(table, name)
        assert uri in str(caught.value) or service in ("merge",), service
    assert (open_table(uri).version, sized_tree(uri)) == before


def test_schema_and_property_changes_name_a_column_holding_nul(tmp_path, capfd):
    """Lance cannot export such a schema (a panic no ``except Exception`` catches): the changes
    that read no rows, allowed beside other bad names (a rename is their repair), say so too."""
    uri = str(tmp_path / "t")
    _misnamed_by_another_tool(uri, "a\x00b")
    table = open_table(uri)
    before = sized_tree(uri)
    for change in (
        lambda: table.set_properties(max_rows_per_file=5),
        lambda: table.alter_columns({"path": "id", "name": "key"}),
        lambda: table.drop_columns(["id"]),
        lambda: table.add_columns({"double": "id * 2"}),
    ):
        with pytest.raises(ColumnNameError, match=r"restore\(\) \(version 1, the newest"):
            change()
    assert sized_tree(uri) == before
    from blobhouse.cli import main

    assert main(["properties", uri]) == 2
    error = capfd.readouterr().err  # Lance's panic once printed four lines of Rust first
    assert error.startswith("error: table ") and "panicked" not in error


@pytest.mark.parametrize("name", ["", "a\x00b"])
def test_spark_services_refuse_a_table_another_tool_misnamed(spark, tmp_path, name):
    import blobhouse.spark as bs

    uri = str(tmp_path / "t")
    _misnamed_by_another_tool(uri, name)
    before = sized_tree(uri)
    for service in (
        lambda: bs.verify(spark, uri, deep=True),  # a task once met Lance's raw error
        lambda: bs.verify(spark, uri),
        lambda: bs.gc(spark, uri, dry_run=True),
        lambda: bs.compact(spark, uri),
    ):
        with pytest.raises(ColumnNameError, match=r"restore\(\) \(version 1, the newest"):
            service()
    assert sized_tree(uri) == before


@pytest.mark.parametrize("name", ["_rowid", "_row_created_at_version", "a`b"])
def test_a_blobhouse_rename_repairs_a_misnamed_column(tmp_path, name):
    """The rename reaches the column (quoted for Lance); the version that misnamed it stays
    unreadable to Lance, and verify and gc say so, naming the way out, until gc removes it."""
    uri = str(tmp_path / "t")
    _misnamed_by_another_tool(uri, name)
    table = open_table(uri).alter_columns({"path": name, "name": "img"})
    assert table.read_blobs("img", [0, 1]) == PAYLOADS
    for service in (table.verify, table.gc, table.stats):
        with pytest.raises(ColumnNameError, match=r"\(version 2, .*--retain-versions 1"):
            service()
    assert table.gc(retain_versions=1, older_than=timedelta(0))["removed_versions"] == [1, 2]
    assert table.verify(deep=True)["problems"] == []
    assert stock_read(uri, "img") == PAYLOADS


@pytest.mark.parametrize("name", UNRENAMEABLE)
def test_the_named_repair_of_a_column_lance_cannot_rename_works(tmp_path, name):
    uri = str(tmp_path / "t")
    _misnamed_by_another_tool(uri, name)
    with pytest.raises(ColumnNameError) as caught:
        open_table(uri).to_arrow()
    repair = re.search(r"lance\.dataset\((.*)\)\.restore\(\)", str(caught.value))
    assert repair is not None, caught.value
    eval(f"lance.dataset({repair.group(1)}).restore()")  # the one line the message gives
    table = open_table(uri)
    assert table.version == 3 and table.read_blobs("img", [0, 1]) == PAYLOADS


def test_spark_doors_refuse_bad_names_before_anything_is_written(spark, tmp_path):
    from blobhouse.spark import write_table as spark_write_table

    uri = str(tmp_path / "t")
    rows = [(1, b"a" * 100_000), (2, b"b" * 100_000)]
    for name, rule in [("_rowid", "one of Lance's row columns"), ("__bh_x", "'__bh_'")]:
        df = spark.createDataFrame(rows, ["id", name])
        with pytest.raises(Exception, match=rf"ColumnNameError.*{name}.*{rule}|{name}.*{rule}"):
            df.write.format("blobhouse").mode("append").option("blob_columns", name).save(uri)
        assert not (tmp_path / "t").exists()
        for dedup in ("global", "content"):  # global stores the payloads before the rows
            with pytest.raises(ColumnNameError, match=rf"{name}.*{rule}"):
                spark_write_table(df, uri, blob_columns=[name], dedup=dedup)
            assert not (tmp_path / "t").exists()
    twice = spark.createDataFrame([(1, 2)], ["id", "x"]).toDF("id", "id")
    with pytest.raises(ColumnNameError, match="'id' names two columns"):
        spark_write_table(twice, uri)
    assert not (tmp_path / "t").exists()


def test_sql_create_table_refuses_a_bad_column_name(spark, tmp_path):
    uri = str(tmp_path / "t")
    with pytest.raises(Exception, match=r"_rowid.*one of Lance's row columns"):
        spark.sql(
            f"CREATE TABLE bad_rowid USING blobhouse OPTIONS (path '{uri}', "
            "columns '`_rowid` BIGINT, img BINARY', blob_columns 'img')"
        )
    spark.sql("DROP TABLE IF EXISTS bad_rowid")
    assert not (tmp_path / "t").exists()


def test_ingest_refuses_a_manifest_column_lance_cannot_address(spark, tmp_path):
    from blobhouse.spark.ingest import ingest

    (tmp_path / "a.bin").write_bytes(b"a" * 1000)
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text(json.dumps({"_rowaddr": 1, "image": "a.bin"}) + "\n")
    with pytest.raises(ColumnNameError, match=r"manifest .*'_rowaddr' is one of Lance's"):
        ingest(spark, str(manifest), str(tmp_path / "t"), blob_columns=["image"], dedup="global")
    assert not (tmp_path / "t").exists()
