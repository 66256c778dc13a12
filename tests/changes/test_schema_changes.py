"""Schema changes (``Table.add_columns``, ``alter_columns``, ``drop_columns``) and appends after
any schema change, blobhouse's own or Lance's: what they cost on disk, that blob columns keep
reading, verifying, compacting, sharing and gc-ing, and that bad input names its column and
leaves the table exactly as it was."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    InvalidInputError,
    SchemaError,
    UnknownOptionError,
    blob_array,
    blob_field,
    open_table,
    write_table,
)
from blobhouse.table import Table
from tests.helpers import data_files, disk_bytes, sized_tree, stock_read

SHARED = os.urandom(200_000)  # packed, shared by every row
ROWS = 6


def clips(ids: list[int], mode: str = "content", payload: bytes = SHARED) -> pa.Array:
    ref_id = 1 if mode == "ref_id" else None
    return blob_array([Blob(data=payload, ref_id=ref_id) for _ in ids])


def frames(ids: list[int], mode: str = "content") -> pa.Table:
    """Rows of ``id``, ``label`` and ``clip`` (one payload every row shares)."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([f"l{i}" for i in ids]),
            "clip": clips(ids, mode),
        }
    )


@pytest.fixture
def table(table_uri) -> Table:
    """Two fragments of three rows each; every row shares one payload."""
    return write_table(frames(list(range(ROWS))), table_uri, max_rows_per_file=3, dedup="content")


def no_leases(uri: str) -> None:
    """The writes of a test ended moments ago: their leases would keep their files for 30 s."""
    shutil.rmtree(os.path.join(uri, "_leases"), ignore_errors=True)


def column(table: Table, name: str) -> list:
    return table.to_arrow(columns=[name]).column(name).to_pylist()


# ---- the version rule -----------------------------------------------------------------------


def test_every_change_moves_the_table_and_returns_it(table, table_uri):
    version = table.version
    assert table.add_columns({"double": "id * 2"}) is table
    assert table.version == version + 1 and "double" in table.schema.names
    assert table.alter_columns({"path": "double", "name": "twice"}) is table
    assert table.schema.names == ["id", "label", "clip", "twice"]
    assert table.drop_columns("twice") is table
    assert table.version == version + 3 and table.schema.names == ["id", "label", "clip"]
    assert open_table(table_uri).version == table.version


def test_refresh_moves_to_the_latest_version_and_forgets_the_old_one(table, table_uri):
    reader = open_table(table_uri)
    assert reader.read_blobs("clip", [0]) == [SHARED]  # caches the resolver and hashes
    open_table(table_uri).alter_columns({"path": "clip", "name": "video"})
    write_table(frames([ROWS]).rename_columns(["id", "label", "video"]), table_uri, mode="append")
    assert reader.refresh() is reader
    assert reader.version == table.version + 2 and reader.blob_columns == ["video"]
    assert reader.read_blobs("video", [0, ROWS]) == [SHARED, SHARED]


def test_a_misspelled_keyword_is_refused(table):
    with pytest.raises(UnknownOptionError, match="did you mean 'columns'"):
        table.add_columns(colums={"x": "id"})
    with pytest.raises(UnknownOptionError):
        table.drop_columns(column=["label"])


# ---- add_columns ----------------------------------------------------------------------------


def test_sql_columns_write_one_small_file_per_fragment_and_copy_no_blob(table, table_uri):
    before = data_files(table_uri)
    table.add_columns({"double": "id * 2", "kind": "'frame'", "upper": "upper(label)"})
    added = data_files(table_uri) - before
    assert data_files(table_uri) >= before  # nothing rewritten
    assert len(added) == 2 and all(p.endswith(".lance") for p in added)  # no sidecar
    assert sum(os.path.getsize(os.path.join(table_uri, p)) for p in added) < 10_000
    assert column(table, "double") == [2 * i for i in range(ROWS)]
    assert column(table, "upper") == [f"L{i}" for i in range(ROWS)]
    assert table.schema.field("kind").nullable is False  # a literal: Lance says not null
    assert stock_read(table_uri, "clip") == [SHARED] * ROWS
    assert table.verify(deep=True)["problems"] == []


def test_null_columns_are_a_new_manifest_only(table, table_uri):
    before = data_files(table_uri)
    table.add_columns(pa.field("note", pa.string()))
    table.add_columns([pa.field("score", pa.float32()), pa.field("n", pa.int8())])
    table.add_columns(pa.schema([pa.field("meta", pa.struct([("k", pa.string())]))]))
    assert data_files(table_uri) == before
    assert column(table, "score") == [None] * ROWS
    assert table.schema.names == ["id", "label", "clip", "note", "score", "n", "meta"]


def test_a_blob_field_adds_a_null_blob_column_that_backfill_fills(table, table_uri):
    before = data_files(table_uri)
    table.add_columns(blob_field("thumb", inline_size_threshold=0))  # placement kept
    assert data_files(table_uri) == before
    assert table.blob_columns == ["clip", "thumb"]
    assert table.read_blobs("thumb", range(ROWS)) == [None] * ROWS
    assert stock_read(table_uri, "thumb") == [None] * ROWS
    filled = table.backfill_blob_column(
        "thumb", lambda b: [b"t%d" % i for i in b["id"].to_pylist()]
    )
    assert filled.read_blobs("thumb", [5]) == [b"t5"]
    kinds = lance.dataset(table_uri).to_table(columns=["thumb"]).column("thumb")
    assert {d["kind"] for d in kinds.to_pylist()} == {
        1
    }  # packed: the column's inline threshold is 0
    more = frames([ROWS]).append_column("thumb", blob_array([b"appended"]))
    write_table(more, table_uri, mode="append", dedup="content")
    assert stock_read(table_uri, "thumb")[-2:] == [b"t5", b"appended"]
    assert open_table(table_uri).verify(deep=True)["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_new_blob_column_after_a_drop_is_one_backfill(table, table_uri, dedup):
    table.add_columns({"plain": "id + 1"})
    table.drop_columns(["label"])  # its data file stays (it holds "id"): its field id too
    version = table.version
    preview = b"p" * 100_000
    filled = table.backfill_blob_column("preview", lambda b: [preview] * b.num_rows, dedup=dedup)
    # Lance adds the column, then its files fill it (global: the store is registered first)
    assert filled.version == version + (3 if dedup == "global" else 2)
    assert filled.read_blobs("preview", [0, 5]) == [preview] * 2
    assert stock_read(table_uri, "preview") == [preview] * ROWS
    assert filled.verify(deep=True)["problems"] == []
    copies = 1 if dedup == "global" else 2  # one per fragment with per-file dedup
    assert filled.stats()["columns"]["preview"]["physical_bytes"] == copies * len(preview)


def blob_reading_expression(table: Table) -> None:
    table.add_columns({"n": "clip IS NULL"})


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda t: t.add_columns({"x": "id +* 2"}), SchemaError, "'x' .*not valid.*parsing"),
        (lambda t: t.add_columns({"x": "nope + 1"}), SchemaError, "'x' .*No field named nope"),
        (lambda t: t.add_columns({"label": "'a'"}), SchemaError, "column 'label' already exists"),
        (blob_reading_expression, SchemaError, r"'n' reads blob column\(s\) \['clip'\]"),
        (lambda t: t.add_columns({"x": 3}), InvalidInputError, "column 'x': an SQL expression"),
        (lambda t: t.add_columns({"a.b": "1"}), SchemaError, "'a.b' must be without '.'"),
        (lambda t: t.add_columns({}), InvalidInputError, "at least one column"),
        (
            lambda t: t.add_columns(pa.field("x", pa.int64(), nullable=False)),
            SchemaError,
            "new column 'x' is added all null, so it must be nullable",
        ),
        (
            lambda t: t.add_columns(blob_field("img", nullable=False)),
            SchemaError,
            "'img' is added all null",
        ),
        (
            lambda t: t.add_columns(pa.field("m", pa.struct([blob_field("img")]))),
            SchemaError,
            r"'m' holds blob column\(s\) \['m.img'\] inside a struct",
        ),
        (
            lambda t: t.add_columns({"x": "CAST(id + 300 AS tinyint)"}),
            SchemaError,
            r"adding column\(s\) \['x'\]: .*Can't cast value 300",
        ),
    ],
    ids=[
        "unparsable",
        "unknown-column",
        "existing-name",
        "reads-a-blob",
        "not-sql",
        "dotted-name",
        "nothing",
        "not-nullable",
        "not-nullable-blob",
        "nested-blob",
        "fails-while-computed",
    ],
)
def test_bad_additions_name_the_column_and_change_nothing(table, table_uri, change, error, message):
    check_unchanged(table, table_uri, change, error, message)


def check_unchanged(
    table: Table, uri: str, change: Callable[[Table], object], error: type, message: str
) -> None:
    """``change`` raises ``error`` matching ``message``; the table's version, schema and files
    on disk are what they were."""
    version, schema, files = table.version, table.schema, sized_tree(uri)
    with pytest.raises(error, match=message):
        change(table)
    assert table.version == version and open_table(uri).version == version
    assert open_table(uri).schema == schema
    assert sized_tree(uri) == files


# ---- alter_columns --------------------------------------------------------------------------


def test_a_renamed_blob_column_reads_verifies_compacts_gcs_and_dedups(table, table_uri):
    before = data_files(table_uri)
    table.alter_columns({"path": "clip", "name": "video"})
    assert data_files(table_uri) == before  # a manifest only
    assert table.read_blobs("video", range(ROWS)) == [SHARED] * ROWS
    assert stock_read(table_uri, "video") == [SHARED] * ROWS
    assert table.verify(deep=True)["problems"] == []
    appended = frames([10, 11]).rename_columns(["id", "label", "video"])
    write_table(appended, table_uri, mode="append", dedup="content")
    table.refresh()
    assert table.stats()["columns"]["video"]["physical_bytes"] == 3 * len(SHARED)  # per file
    table.set_properties(max_rows_per_file=100)  # compaction keeps to it: one file now
    report = table.compact()
    assert report["fragments_added"] == 1
    assert table.refresh().stats()["columns"]["video"]["physical_bytes"] == len(SHARED)
    no_leases(table_uri)
    table.gc(retain_versions=1, grace=timedelta(0))
    assert table.refresh().read_blobs("video", range(ROWS + 2)) == [SHARED] * (ROWS + 2)
    assert stock_read(table_uri, "video") == [SHARED] * (ROWS + 2)
    assert table.verify(deep=True)["problems"] == []
    assert table.stats()["orphan_files"] == 0


def test_nullability_and_casts(table, table_uri):
    table.add_columns({"score": "CAST(id AS bigint) * 10"})
    table.alter_columns({"path": "label", "nullable": False}, {"path": "score", "nullable": True})
    assert table.schema.field("label").nullable is False
    before = data_files(table_uri)
    table.alter_columns({"path": "score", "data_type": pa.int32()})
    rewritten = data_files(table_uri) - before
    assert len(rewritten) == 2 and not any(p.endswith(".blob") for p in rewritten)
    assert table.schema.field("score").type == pa.int32()
    assert column(table, "score") == [10 * i for i in range(ROWS)]
    assert table.read_blobs("clip", [0]) == [SHARED]
    more = frames([ROWS]).append_column("score", pa.array([60], pa.int32()))
    write_table(more, table_uri, mode="append")
    with pytest.raises(SchemaError, match="score: table has int32, data has int64"):
        write_table(frames([7]).append_column("score", pa.array([7])), table_uri, mode="append")
    nulls = pa.table({"id": pa.array([8], pa.int64()), "label": pa.array([None], pa.string())})
    with pytest.raises(SchemaError, match="column 'label' is not nullable in the table"):
        write_table(nulls, table_uri, mode="append")
    assert open_table(table_uri).count_rows() == ROWS + 1


@pytest.mark.parametrize(
    ("alterations", "error", "message"),
    [
        (
            [{"path": "clip", "data_type": pa.large_binary()}],
            SchemaError,
            "column 'clip' is or holds a blob",
        ),
        (
            [{"path": "clip", "inline_size_threshold": 0}],
            SchemaError,
            "blob column 'clip': its placement",
        ),
        ([{"path": "clip", "metadata": {}}], SchemaError, "blob column 'clip': its placement"),
        ([{"path": "nope", "name": "x"}], SchemaError, "no column 'nope'"),
        (
            [{"path": "clip.size", "name": "x"}],
            SchemaError,
            "'clip.size' is inside blob column 'clip'",
        ),
        ([{"path": "id", "nam": "x"}], UnknownOptionError, "'nam' .*did you mean 'name'"),
        ([{"path": "id", "name": "label"}], SchemaError, r"two columns the name\(s\) \['label'\]"),
        ([{"path": "id", "name": "a.b"}], SchemaError, "'a.b' must be"),
        ([{"path": "id", "nullable": "no"}], InvalidInputError, "column 'id': nullable must be"),
        ([{"path": "id", "data_type": "int32"}], InvalidInputError, "'id': data_type must be"),
        ([{"path": "id", "data_type": pa.int8()}], SchemaError, "Can't cast value 295"),
        ([{"path": "label", "data_type": pa.int32()}], SchemaError, 'Cannot cast column "label"'),
        ([{"path": "note", "nullable": False}], SchemaError, '"note" contains NULL values'),
        ([{"path": "id"}], InvalidInputError, "alteration of 'id' changes nothing"),
        ([], InvalidInputError, "at least one alteration"),
    ],
    ids=[
        "cast-a-blob",
        "placement",
        "metadata",
        "unknown",
        "inside-a-blob",
        "unknown-key",
        "duplicate-name",
        "dotted-name",
        "bad-nullable",
        "bad-type",
        "overflow",
        "impossible-cast",
        "nulls-present",
        "nothing",
        "none",
    ],
)
def test_bad_alterations_name_the_column_and_change_nothing(table_uri, alterations, error, message):
    data = frames(list(range(ROWS))).append_column("note", pa.array([None, "x"] * 3))
    table = write_table(data.set_column(0, "id", pa.array(range(295, 301), pa.int64())), table_uri)
    check_unchanged(table, table_uri, lambda t: t.alter_columns(*alterations), error, message)


# ---- drop_columns ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "error", "message"),
    [
        (["nope"], SchemaError, "no column 'nope'"),
        (["clip.kind"], SchemaError, "'clip.kind' is inside blob column 'clip'"),
        (["id", "label", "clip"], SchemaError, "would drop every column"),
        ([], InvalidInputError, "needs column names"),
        ([3], InvalidInputError, "needs column names"),
    ],
    ids=["unknown", "inside-a-blob", "every-column", "none", "not-a-name"],
)
def test_bad_drops_name_the_column_and_change_nothing(table, table_uri, columns, error, message):
    check_unchanged(table, table_uri, lambda t: t.drop_columns(columns), error, message)


def gone_payloads() -> list[bytes | None]:
    """Packed (shared and not) and dedicated payloads, and a null."""
    big = os.urandom(5_000_000)
    return [SHARED, big, SHARED, os.urandom(100_000), SHARED, None]


@pytest.mark.parametrize("layout", ["same-file", "backfilled", "backfilled-global"])
def test_gc_reclaims_a_dropped_blob_column_once_no_retained_version_needs_it(table_uri, layout):
    """The dropped column's sidecars (its own data file too, when it had one; its store packs
    with dedup="global") go once no retained version needs them; a tag keeps them."""
    keep = [os.urandom(1_000 + i) for i in range(ROWS)]  # inline
    gone = gone_payloads()
    data = pa.table({"id": pa.array(range(ROWS), pa.int64()), "keep": blob_array(keep)})
    if layout == "same-file":
        table = write_table(
            data.append_column("gone", blob_array(gone)), table_uri, dedup="content"
        )
    else:
        dedup = "global" if layout == "backfilled-global" else "content"
        table = write_table(data, table_uri, dedup=dedup)
        table = table.backfill_blob_column("gone", lambda b: gone, dedup=dedup)
    stored = len(SHARED) + 5_000_000 + 100_000  # each distinct payload once
    before = table.version
    table.drop_columns(["gone"])
    lance.dataset(table_uri).tags.create("before", before)
    no_leases(table_uri)
    on_disk = disk_bytes(table_uri)

    def collect() -> None:  # twice: a store pack is retired by one run and reaped by the next
        open_table(table_uri).gc(retain_versions=1, grace=timedelta(0))
        open_table(table_uri).gc(grace=timedelta(0))

    collect()
    assert disk_bytes(table_uri) > on_disk - stored  # the tagged version still needs them
    assert open_table(table_uri, version="before").read_blobs("gone", range(ROWS)) == gone
    lance.dataset(table_uri).tags.delete("before")
    collect()
    assert on_disk - disk_bytes(table_uri) >= stored
    table.refresh()
    assert table.read_blobs("keep", range(ROWS)) == keep
    assert stock_read(table_uri, "keep") == keep
    assert table.verify(deep=True)["problems"] == []
    assert table.stats()["orphan_files"] == 0


# ---- appends after schema changes -----------------------------------------------------------


def test_appends_after_lance_schema_changes(table, table_uri):
    """Lance's own add/alter/drop on the dataset: appends follow the new schema."""
    lance.dataset(table_uri).add_columns({"double": "id * 2"})  # nullable
    write_table(frames([6]), table_uri, mode="append")  # lacks "double": nulls
    assert column(open_table(table_uri), "double") == [0, 2, 4, 6, 8, 10, None]
    lance.dataset(table_uri).add_columns({"source": "'camera'"})  # not nullable
    with pytest.raises(SchemaError, match=r"lacks column\(s\) \['source'\], which the table"):
        write_table(frames([7]), table_uri, mode="append")
    lance.dataset(table_uri).alter_columns({"path": "source", "nullable": True})
    lance.dataset(table_uri).alter_columns({"path": "clip", "name": "video"})
    with pytest.raises(SchemaError, match=r"\['clip'\] of the data .*\['video'"):
        write_table(frames([7]), table_uri, mode="append")
    lance.dataset(table_uri).drop_columns(["label"])
    with pytest.raises(SchemaError, match=r"column\(s\) \['label'\] of the data are not in"):
        write_table(frames([7]).rename_columns(["id", "label", "video"]), table_uri, mode="append")
    # columns in another order, lacking nullable ones (a blob column among them)
    write_table(pa.table({"video": clips([8]), "id": pa.array([8])}), table_uri, mode="append")
    write_table(pa.table({"id": pa.array([9])}), table_uri, mode="append")
    latest = open_table(table_uri)
    assert latest.schema.names == ["id", "video", "double", "source"]
    assert column(latest, "source")[-3:] == ["camera", None, None]
    assert latest.read_blobs("video", [6, 7, 8]) == [SHARED, SHARED, None]
    assert stock_read(table_uri, "video") == [SHARED] * 8 + [None]
    assert latest.verify(deep=True)["problems"] == []


def test_append_errors_name_the_column_never_blob_columns(table, table_uri):
    table.alter_columns({"path": "clip", "name": "video"})
    with pytest.raises(SchemaError) as renamed:
        write_table(frames([6]), table_uri, mode="append")
    assert "blob_columns" not in str(renamed.value) and "'clip'" in str(renamed.value)
    with pytest.raises(SchemaError, match="id: table has int64, data has string"):
        data = pa.table({"id": pa.array(["6"]), "label": ["x"], "video": clips([6])})
        write_table(data, table_uri, mode="append")
    with pytest.raises(SchemaError, match=r"'id' names two columns"):
        write_table(
            pa.table([pa.array([1]), pa.array([2])], ["id", "id"]), table_uri, mode="append"
        )
    assert open_table(table_uri).version == table.version


@pytest.mark.parametrize("mode", ["off", "content", "ref_id", "global"])
def test_schema_changes_then_append_read_verify_compact_keep_sharing(table_uri, mode):
    table = write_table(frames(list(range(ROWS)), mode), table_uri, dedup=mode)
    table.add_columns({"score": "id * 10"})
    table.alter_columns({"path": "clip", "name": "video"}, {"path": "label", "name": "tag"})
    table.drop_columns(["tag"])
    more = pa.table(
        {"id": pa.array(range(ROWS, 2 * ROWS), pa.int64()), "video": clips([0] * ROWS, mode)}
    )
    write_table(more, table_uri, mode="append", dedup=mode)  # lacks "score": nulls
    table.refresh()
    rows = 2 * ROWS
    assert table.read_blobs("video", range(rows)) == [SHARED] * rows
    assert stock_read(table_uri, "video") == [SHARED] * rows
    assert column(table, "score") == [10 * i for i in range(ROWS)] + [None] * ROWS
    assert table.verify(deep=True)["problems"] == []
    copies = {"off": rows, "content": 2, "ref_id": 2, "global": 1}[mode]
    assert table.stats()["columns"]["video"]["physical_bytes"] == copies * len(SHARED)
    table.compact()
    table.refresh()
    assert table.stats()["columns"]["video"]["physical_bytes"] == len(SHARED)  # shared again
    assert table.read_blobs("video", range(rows)) == [SHARED] * rows
    assert stock_read(table_uri, "video") == [SHARED] * rows
    assert table.verify(deep=True)["problems"] == []


def test_schema_changes_on_a_branch_leave_main_alone(table, table_uri):
    lance.dataset(table_uri).create_branch("exp", table.version)
    branch = open_table(table_uri, branch="exp")
    branch.add_columns({"double": "id * 2"}).drop_columns(["label"])
    branch.alter_columns({"path": "clip", "name": "video"})
    assert open_table(table_uri, branch="exp").schema.names == ["id", "video", "double"]
    assert open_table(table_uri).schema.names == ["id", "label", "clip"]
    write_table(pa.table({"id": pa.array([6])}), table_uri, mode="append", branch="exp")
    assert branch.refresh().read_blobs("video", [0, 6]) == [SHARED, None]
    assert stock_read(f"{table_uri}/tree/exp", "video")[0] == SHARED


def test_spark_appends_and_backfills_after_schema_changes(spark, table, table_uri):
    import blobhouse.spark as bs

    table.add_columns({"double": "id * 2"})
    table.drop_columns(["label"])  # reserves a field id: the backfill adds its column first
    df = spark.createDataFrame([(6, SHARED)], "id long, clip binary")
    bs.write_table(df, table_uri, blob_columns=["clip"])  # lacks "double"
    table.refresh()
    assert column(table, "double") == [0, 2, 4, 6, 8, 10, None]
    bs.backfill_blob_column(spark, table_uri, "thumb", lambda b: [b"t"] * b.num_rows)
    assert table.refresh().read_blobs("thumb", range(ROWS + 1)) == [b"t"] * (ROWS + 1)
    assert table.read_blobs("clip", [6]) == [SHARED]
