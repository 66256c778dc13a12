"""Table properties: a table remembers its write settings, every writer uses them, and a new
table stores each distinct payload once for the whole table by default (issue: "Stored once on
every path")."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import lance
import pyarrow as pa
import pytest
from lance import LanceDataset, LanceOperation

from blobhouse import (
    Blob,
    PropertyConflictError,
    RefIdConflictError,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.cli import main
from blobhouse.errors import InvalidInputError, TableMetadataError, UnknownOptionError
from blobhouse.settings import SETTINGS_KEY
from tests.helpers import disk_bytes, stock_read

CHUNKS = [os.urandom(300_000 + i) for i in range(4)]
CALIBRATION = [os.urandom(5_000 + i) for i in range(2)]


def frames(first: int, rows: int) -> pa.Table:
    """Robot frames: a video chunk shared by 10 rows, a calibration file shared by 20, a
    thumbnail of each row's own."""
    ids = list(range(first, first + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "video": blob_array([CHUNKS[(i // 10) % len(CHUNKS)] for i in ids]),
            "calib": blob_array([CALIBRATION[(i // 20) % len(CALIBRATION)] for i in ids]),
            "thumb": blob_array([b"t%06d" % i * 200 for i in ids]),
        }
    )


def unique_bytes(*tables: pa.Table) -> int:
    seen: dict[bytes, int] = {}
    for table in tables:
        for column in ("video", "calib", "thumb"):
            for value in table.column(column).to_pylist():
                seen[value["data"]] = len(value["data"])
    return sum(seen.values())


def physical(table) -> int:
    return open_table(table.location.root).stats()["physical_bytes"]


def test_a_new_table_stores_each_payload_once_across_appends_and_merges(table_uri):
    first, second, upsert = frames(0, 40), frames(40, 40), frames(60, 40)
    table = write_table(first, table_uri)
    assert table.properties.dedup == "global"
    write_table(second, table_uri, mode="append")  # no dedup keyword: the table's
    table = open_table(table_uri)
    table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(upsert)
    stats = open_table(table_uri).stats()
    assert stats["physical_bytes"] <= 1.05 * unique_bytes(first, second, upsert)
    assert set(stats["columns"]["video"]["kinds"]) == {"global"}
    got = {r["id"]: r["video"] for r in open_table(table_uri).to_arrow(blobs="bytes").to_pylist()}
    assert sorted(got) == list(range(100))
    assert all(got[i] == CHUNKS[(i // 10) % 4] for i in got)
    assert stock_read(table_uri, "video", 100).count(CHUNKS[0]) == 30  # stock pylance reads it


def test_a_table_created_global_stays_global_for_plain_appends_and_merges(table_uri):
    """The issue's case: 3.0x unique before, each later writer fell back to per-file packs."""
    first, second, upsert = frames(0, 40), frames(0, 40), frames(40, 40)
    write_table(first, table_uri, dedup="global")
    write_table(second.set_column(0, "id", pa.array(range(40, 80))), table_uri, mode="append")
    open_table(table_uri).merge_insert("id").when_not_matched_insert_all().execute(upsert)
    assert physical(open_table(table_uri)) <= 1.05 * unique_bytes(first, second, upsert)


def test_a_write_asking_for_another_setting_is_refused_and_changes_nothing(table_uri):
    table = write_table(frames(0, 20), table_uri, dedup={"video": "ref_id"}, max_rows_per_file=8)
    before = sorted(os.listdir(f"{table_uri}/data")), table.version
    cases = [
        ({"dedup": "content"}, "dedup of column 'video': the table's is 'ref_id'"),
        ({"dedup": {"thumb": "off"}}, "dedup of column 'thumb': the table's is 'global'"),
        ({"max_rows_per_file": 9}, "max_rows_per_file: the table's is 8, this write asked for 9"),
        (
            {"placement": {"video": {"inline_size_threshold": 0}}},
            "inline_size_threshold of column 'video': the table's is 65536",
        ),
    ]
    for options, message in cases:
        with pytest.raises(PropertyConflictError, match=message):
            write_table(frames(20, 5), table_uri, mode="append", **options)
        if "max_rows_per_file" in options:
            continue  # not an option of merge_insert
        merge = open_table(table_uri).merge_insert("id", **options)
        with pytest.raises(PropertyConflictError, match=message):
            merge.when_not_matched_insert_all().execute(frames(20, 5))
    with pytest.raises(PropertyConflictError, match="dedup of column 'video'"):
        open_table(table_uri).update({"video": lambda b: [b"x"] * b.num_rows}, dedup="off")
    assert (sorted(os.listdir(f"{table_uri}/data")), open_table(table_uri).version) == before
    # the same values are no conflict
    write_table(frames(20, 5), table_uri, mode="append", dedup={"video": "ref_id"})
    assert open_table(table_uri).count_rows() == 25


def test_ref_id_columns_and_file_limits_are_remembered(table_uri):
    rows = pa.table(
        {
            "id": pa.array(range(12), pa.int64()),
            "chunk": pa.array([i // 4 for i in range(12)], pa.int64()),
            "video": pa.array([CHUNKS[i // 4] for i in range(12)], pa.binary()),
        }
    )
    write_table(
        rows,
        table_uri,
        blob_columns=["video"],
        dedup={"video": "ref_id"},
        ref_id_columns={"video": "chunk"},
        max_rows_per_file=5,
    )
    properties = open_table(table_uri).properties
    assert properties.columns["video"].ref_id_column == "chunk"
    assert properties.dedup_of("video") == "ref_id" and properties.max_rows_per_file == 5
    table = write_table(rows, table_uri, mode="append")  # 12 rows: three data files of <= 5
    assert [f.count_rows() for f in table.dataset.get_fragments()][-3:] == [5, 5, 2]
    # an append that names nothing still checks ref_ids: chunk 1 with other bytes is refused
    bad = rows.slice(4, 1).set_column(2, "video", pa.array([b"other"], pa.binary()))
    with pytest.raises(RefIdConflictError, match="'video'"):
        write_table(pa.concat_tables([rows.slice(4, 1), bad]), table_uri, mode="append")


def test_set_properties_changes_later_writes_and_compact_brings_earlier_rows_under_it(table_uri):
    data = [frames(i * 20, 20) for i in range(3)]
    table = write_table(data[0], table_uri, dedup="content")
    write_table(data[1], table_uri, mode="append")
    assert "global" not in open_table(table_uri).stats()["columns"]["video"]["kinds"]
    table = open_table(table_uri).set_properties(dedup="global")
    assert table.properties.dedup_of("video") == "global"
    write_table(data[2], table_uri, mode="append")
    assert "global" in open_table(table_uri).stats()["columns"]["video"]["kinds"]
    open_table(table_uri).compact()
    stats = open_table(table_uri).stats()
    assert set(stats["columns"]["video"]["kinds"]) == {"global"}
    assert stats["physical_bytes"] <= 1.05 * unique_bytes(*data)
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    # and back: per-file again, compact moves the payloads out of the store into the data file
    open_table(table_uri).set_properties(dedup="content").compact()
    stats = open_table(table_uri).stats()
    assert "global" not in stats["columns"]["video"]["kinds"]
    assert stats["physical_bytes"] <= 1.05 * unique_bytes(*data)  # one data file: once each
    assert open_table(table_uri).verify(deep=True)["problems"] == []
    rows = open_table(table_uri).to_arrow(columns=["id", "video"], blobs="bytes").to_pylist()
    assert all(r["video"] == CHUNKS[(r["id"] // 10) % len(CHUNKS)] for r in rows)
    # and per column, back to the table's mode with None
    table = open_table(table_uri).set_properties(dedup={"thumb": "off"})
    assert table.properties.dedup_of("thumb") == "off"
    table = table.set_properties(dedup={"thumb": None})
    assert table.properties.dedup_of("thumb") == "content"  # the table's own again


def test_set_properties_refuses_bad_changes_naming_them(table_uri, tmp_path):
    table = write_table(frames(0, 5), table_uri, allowed_bases=[str(tmp_path / "media")])
    version = table.version
    for changes, error, message in [
        ({"dedup": "globl"}, InvalidInputError, "dedup must be one of .*got 'globl'"),
        ({"dedup": {"nope": "off"}}, InvalidInputError, "'nope', which is not a blob column"),
        ({"ref_id_columns": {"video": "thumb"}}, InvalidInputError, "must be an integer column"),
        ({"allowed_bases": []}, InvalidInputError, "can be added to, not removed"),
        ({"max_rows_per_file": 0}, InvalidInputError, "a whole number from 1"),
    ]:
        with pytest.raises(error, match=message):
            table.set_properties(**changes)
    with pytest.raises(UnknownOptionError, match="did you mean 'dedup'"):
        table.set_properties(dedupe="off")
    assert open_table(table_uri).version == version
    added = table.set_properties(allowed_bases=[str(tmp_path / "media"), str(tmp_path / "more")])
    assert len(added.properties.allowed_bases) == 2


def test_properties_follow_a_renamed_column_and_survive_lance_tools(table_uri):
    rows = pa.table(
        {
            "id": pa.array(range(8), pa.int64()),
            "chunk": pa.array([i // 4 for i in range(8)], pa.int64()),
            "video": pa.array([CHUNKS[i // 4] for i in range(8)], pa.binary()),
        }
    )
    write_table(
        rows, table_uri, blob_columns=["video"], dedup="ref_id", ref_id_columns={"video": "chunk"}
    )
    dataset = lance.dataset(table_uri)
    dataset.alter_columns({"path": "chunk", "name": "episode_chunk"})
    dataset.alter_columns({"path": "video", "name": "clip"})
    dataset.update({"id": "id + 100"})
    dataset.add_columns({"twice": "id * 2"})
    properties = open_table(table_uri).properties
    assert properties.dedup == "ref_id"
    assert properties.columns["clip"].ref_id_column == "episode_chunk"
    more = rows.rename_columns(["id", "episode_chunk", "clip"]).append_column(
        "twice", pa.array([0] * 8, pa.int64())
    )
    table = write_table(more, table_uri, mode="append")  # ref_ids from the renamed column
    assert table.count_rows() == 16


def test_a_table_written_before_properties_keeps_its_behaviour(table_uri):
    """A table whose metadata records only bases (format 1, what blobhouse wrote before):
    writers use their own options, per-file content dedup by default, and no conflict."""
    table = write_table(frames(0, 20), table_uri, dedup="content")
    old = {SETTINGS_KEY.decode(): json.dumps({"format": 1, "allowed_bases": []})}
    ids = {f.name(): f.id() for f in table.dataset.lance_schema.fields()}
    LanceDataset.commit(
        table_uri,
        LanceOperation.UpdateConfig(
            schema_metadata_updates=LanceOperation.UpdateMap(old),
            field_metadata_updates={
                ids["video"]: LanceOperation.UpdateMap({"blobhouse:dedup": None})
            },
        ),
        read_version=table.version,
    )
    assert not open_table(table_uri).properties.recorded
    write_table(frames(20, 20), table_uri, mode="append")
    assert "global" not in open_table(table_uri).stats()["columns"]["video"]["kinds"]
    write_table(frames(40, 20), table_uri, mode="append", dedup="global")  # no conflict
    assert "global" in open_table(table_uri).stats()["columns"]["video"]["kinds"]
    assert open_table(table_uri).count_rows() == 60


def test_an_overwrite_keeps_the_settings_it_does_not_give(table_uri):
    write_table(frames(0, 10), table_uri, dedup="content", max_rows_per_file=4)
    table = write_table(frames(0, 10), table_uri, mode="overwrite", dedup="off")
    assert table.properties.dedup == "off" and table.properties.max_rows_per_file == 4


def test_a_copied_table_warns_once_that_stock_readers_still_read_the_original(tmp_path):
    original, copy = str(tmp_path / "a"), str(tmp_path / "b")
    write_table(frames(0, 10), original)
    shutil.copytree(original, copy)
    with pytest.warns(UserWarning, match="copied or moved from") as caught:
        table = open_table(copy)
        open_table(copy)
    assert len(caught) == 1 and "blobhouse relocate" in str(caught[0].message)
    assert table.read_blobs("video", [0]) == [CHUNKS[0]]
    shutil.rmtree(original)
    with pytest.raises((OSError, ValueError), match=r"(?i)not found"):  # loud, never wrong
        stock_read(copy, "video", 1)
    table.relocate()
    assert stock_read(copy, "video", 1) == [CHUNKS[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_table(copy)  # relocated: no warning


def test_the_properties_command_shows_and_changes_them(table_uri, capsys):
    write_table(frames(0, 5), table_uri)
    assert main(["properties", table_uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dedup"] == "global" and shown["blob_columns"] == ["video", "calib", "thumb"]
    argv = ["properties", table_uri, "--set", "dedup=content", "--set", "dedup.video=off"]
    assert main([*argv, "--set", "inline_size_threshold.thumb=0"]) == 0
    properties = open_table(table_uri).properties
    assert properties.dedup == "content" and properties.dedup_of("video") == "off"
    assert properties.columns["thumb"].placement.inline_size_threshold == 0
    assert main(["properties", table_uri, "--set", "dedupe=off"]) == 2
    assert "did you mean 'dedup'" in capsys.readouterr().err
    assert main(["stats", table_uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["properties"]["dedup"] == "content"


def test_pandas_and_blob_values_use_the_default_too(table_uri):
    import pandas as pd

    clip = os.urandom(100_000)
    frame = pd.DataFrame({"id": range(6), "clip": [Blob(data=clip)] * 6})
    write_table(frame, table_uri)
    write_table(frame, table_uri, mode="append")
    assert physical(open_table(table_uri)) == len(clip)
    assert disk_bytes(table_uri) < 2 * len(clip) + 200_000


# --- found by a user's tryout -------------------------------------------------------------


def test_an_overwrite_keeps_each_columns_settings_it_does_not_give(table_uri):
    rows = pa.table({"id": [0], "img": blob_array([CHUNKS[0]])})
    placement = {"img": {"inline_size_threshold": 0}}
    write_table(rows, table_uri, dedup={"img": "off"}, placement=placement, max_rows_per_file=10)
    properties = write_table(rows, table_uri, mode="overwrite").properties
    assert properties.dedup_of("img") == "off" and properties.max_rows_per_file == 10
    assert properties.columns["img"].placement.inline_size_threshold == 0
    # a column the overwrite no longer has is simply gone
    properties = write_table(pa.table({"id": [1]}), table_uri, mode="overwrite").properties
    assert properties.blob_columns == () and properties.max_rows_per_file == 10


def test_compaction_keeps_to_the_tables_file_limits(table_uri):
    for k in range(4):
        rows = pa.table({"id": range(10 * k, 10 * k + 10), "b": blob_array([b"x" * 10] * 10)})
        write_table(rows, table_uri, mode="append")
    open_table(table_uri).set_properties(max_rows_per_file=25)
    open_table(table_uri).compact()
    sizes = [f.count_rows() for f in open_table(table_uri).dataset.get_fragments()]
    assert sum(sizes) == 40 and max(sizes) <= 25


def test_a_dropped_ref_id_column_is_refused_or_named(table_uri):
    rows = pa.table(
        {
            "id": pa.array([0, 1], pa.int64()),
            "chunk": pa.array([1, 1], pa.int64()),
            "other": pa.array([2, 2], pa.int64()),
            "img": pa.array([CHUNKS[0]] * 2, pa.binary()),
        }
    )
    args = {"blob_columns": ["img"], "dedup": "ref_id", "ref_id_columns": {"img": "chunk"}}
    write_table(rows, table_uri, **args)
    with pytest.raises(InvalidInputError, match="'chunk' holds the ref_ids of blob column 'img'"):
        open_table(table_uri).drop_columns(["chunk"])
    lance.dataset(table_uri).drop_columns(["chunk"])  # Lance's own drop cannot be refused
    assert open_table(table_uri).properties.to_dict()["columns"]["img"]["ref_id_column"] == (
        "(dropped)"
    )
    more = rows.drop_columns(["chunk"])
    with pytest.raises(InvalidInputError, match="ref_ids from a column that was dropped"):
        write_table(more, table_uri, mode="append")  # would store a copy per row, silently
    open_table(table_uri).set_properties(ref_id_columns={"img": "other"})
    write_table(more, table_uri, mode="append")
    assert open_table(table_uri).stats()["physical_bytes"] == 2 * len(CHUNKS[0])  # per file


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_rows_per_file": "10"}, "max_rows_per_file must be a whole number from 1 to"),
        ({"max_bytes_per_file": 0}, "max_bytes_per_file must be a whole number of bytes from 1"),
        ({"dedup": 3}, "dedup must be one of .*, or a mapping {column: mode}, got 3"),
        ({"dedup": "globl"}, "dedup must be one of .*got 'globl'"),
        ({"placement": "big"}, "placement must be a mapping"),
    ],
)
def test_bad_option_values_are_named_before_anything_is_written(table_uri, options, message):
    with pytest.raises(InvalidInputError, match=message):
        write_table(frames(0, 2), table_uri, **options)
    assert not os.path.exists(table_uri)


@pytest.mark.parametrize("garbage", ["not json {", "[1, 2]", '{"dedup": "bogus", "format": 2}'])
def test_damaged_metadata_still_reads_refuses_writes_and_an_overwrite_repairs_it(
    table_uri, garbage
):
    write_table(frames(0, 3), table_uri)
    lance.dataset(table_uri).update_schema_metadata({"blobhouse": garbage})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert open_table(table_uri).read_blobs("video", [0]) == [CHUNKS[0]]
    if not garbage.startswith("{"):  # the bases unreadable too: reads go on without them
        assert any("damaged" in str(w.message) for w in caught)
    for write in (
        lambda: write_table(frames(3, 1), table_uri, mode="append"),
        lambda: open_table(table_uri).set_properties(max_rows_per_file=5),  # not the damaged
    ):
        with pytest.raises(TableMetadataError, match="damaged"):
            write()
    assert write_table(frames(0, 3), table_uri, mode="overwrite").properties.dedup == "global"


def test_properties_of_a_newer_blobhouse_are_read_but_never_written_over(table_uri):
    write_table(frames(0, 2), table_uri)
    newer = json.dumps({"format": 99, "dedup": "global"})
    lance.dataset(table_uri).update_schema_metadata({"blobhouse": newer})
    assert open_table(table_uri).read_blobs("video", [1]) == [CHUNKS[0]]
    with pytest.raises(TableMetadataError, match=r"newer blobhouse \(format 99"):
        write_table(frames(2, 1), table_uri, mode="append")
    assert lance.dataset(table_uri).schema.metadata[b"blobhouse"] == newer.encode()


def test_stats_names_where_a_copy_came_from_and_old_versions_do_not_warn(tmp_path):
    original, copy = str(tmp_path / "a"), str(tmp_path / "b")
    write_table(frames(0, 2), original)
    shutil.copytree(original, copy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert open_table(copy).stats()["moved_from"].endswith("/a")
    open_table(copy).relocate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_table(copy).stats()["moved_from"] is None
        open_table(copy, version=1)  # names the old place, as Lance recorded it: no warning


def test_small_misuses_of_properties_are_named(table_uri, capsys):
    table = write_table(frames(0, 2), table_uri)
    assert table.set_properties(dedup={}).version == 1  # nothing to change: no version
    with pytest.raises(InvalidInputError, match="applies to blob columns"):
        table.update({"id": "id + 1"}, dedup="off")
    argv = ["properties", table_uri, "--set", "dedup=content", "--set", "dedup=off"]
    assert main(argv) == 2 and "more than once" in capsys.readouterr().err
    main(["properties", table_uri, "--set", "dedup.video=off", "--set", "inline_size_threshold=0"])
    argv = ["properties", table_uri, "--set", "dedup.video=default"]
    assert main([*argv, "--set", "inline_size_threshold.thumb=default"]) == 0
    properties = open_table(table_uri).properties
    assert properties.dedup_of("video") == "global"
    assert properties.columns["thumb"].placement.inline_size_threshold == 65536
    assert properties.columns["calib"].placement.inline_size_threshold == 0
