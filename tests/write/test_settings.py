"""Every setting has one typed schema (blobhouse.settings), applied at every door: Python
keywords and option objects, the command line and what a table records on disk (Spark's
options and TBLPROPERTIES: tests/spark/test_spark_properties.py). A wrong type, range or shape
is refused before anything is written, naming the setting, the value and what is expected; a
damaged stored setting never widens anything: the table reads, writes and gc refuse it, naming
it and the one command that sets it anew (issue 57)."""

from __future__ import annotations

import json
import os
import re
import warnings
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    CommitOptions,
    CompactionTargets,
    ExternalBlobError,
    InvalidInputError,
    WriteOptions,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.cli import main
from blobhouse.errors import TableMetadataError
from blobhouse.loader import BatchLoader
from blobhouse.settings import SETTINGS, TABLE_WIDE
from tests.helpers import tree

ROOTS = ["/", "file:///", "s3://bucket", "az://container/", "gs://bucket/"]
# keyword, value, what the message says (the setting, the value, what is expected)
WRONG = [
    ("managed_bases", "/data/media", "managed_bases must be a list of absolute directories"),
    ("managed_bases", "/data/media", "got '/data/media' (a string, not a list"),
    ("allowed_bases", "/data", "allowed_bases must be a list of URIs or absolute paths"),
    ("managed_bases", [1, None], "got [1, None] (1 is not a URI)"),
    ("allowed_bases", [""], "got [''] ('' is not a URI)"),
    *(
        ("managed_bases", [root], "is the root of a filesystem, bucket or container")
        for root in ROOTS
    ),
    (
        "placement",
        {"*": {"inline_size_threshold": 2**64}},
        "inline_size_threshold of column '*' must be a whole number of bytes from 0 to "
        "2**64 - 1, got 18446744073709551616",
    ),
    ("placement", {"video": {"dedicated_size_threshold": 0}}, "from 1 to 2**64 - 1, got 0"),
    ("placement", {"video": {"inline_size_treshold": 5}}, "did you mean 'inline_size_threshold'"),
    ("max_rows_per_file", 2**64, "max_rows_per_file must be a whole number from 1 to 2**63 - 1"),
    ("max_bytes_per_file", 1.5, "max_bytes_per_file must be a whole number of bytes from 1"),
    ("max_rows_per_file", True, "got True"),
    ("dedup", ["global"], "dedup must be one of 'content', 'ref_id', 'global', 'off', or a"),
    ("dedup", {"video": "globl"}, "dedup of column 'video' must be one of"),
    ("ref_id_columns", {"video": 3}, "ref_id_columns of column 'video' must be a column name"),
]


def frames(first: int = 0, rows: int = 2, uri: str | None = None) -> pa.Table:
    """Rows with a blob column of their own bytes and, given ``uri``, an external reference."""
    ids = list(range(first, first + rows))
    refs = [Blob(uri=uri) if uri else None for _ in ids]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "video": blob_array([b"v%d" % i * 100 for i in ids]),
            "clip": blob_array(refs),
        }
    )


def media(tmp_path) -> tuple[str, str]:
    """A folder of the user's files and one file in it."""
    folder = tmp_path / "media"
    folder.mkdir(exist_ok=True)
    path = folder / "mine.bin"
    path.write_bytes(os.urandom(1000))
    return str(folder), str(path)


def edit_settings(uri: str, **changes) -> None:
    """What another tool does: the schema metadata key ``blobhouse`` edited by hand."""
    dataset = lance.dataset(uri)
    settings = json.loads(dataset.schema.metadata[b"blobhouse"])
    dataset.update_schema_metadata({"blobhouse": json.dumps({**settings, **changes})})


@pytest.mark.parametrize(("keyword", "value", "message"), WRONG)
def test_a_wrong_setting_is_refused_at_every_python_door_before_anything_is_written(
    tmp_path, keyword, value, message
):
    uri = str(tmp_path / "t")
    with pytest.raises(InvalidInputError, match=re.escape(message)) as refused:
        write_table(frames(), uri, **{keyword: value})
    assert type(refused.value).__name__ in ("InvalidSettingError", "UnknownOptionError")
    assert not os.path.exists(uri)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        WriteOptions(**{keyword: value})
    table = write_table(frames(), uri)
    files = tree(uri)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        table.set_properties(**{keyword: value})
    if keyword in ("dedup", "ref_id_columns", "placement"):  # what changes take
        with pytest.raises(InvalidInputError, match=re.escape(message)):
            table.merge_insert("id", **{keyword: value})
        with pytest.raises(InvalidInputError, match=re.escape(message)):
            write_table(frames(2), uri, mode="append", **{keyword: value})
    assert open_table(uri).version == 1 and tree(uri) == files


def test_blob_columns_given_as_a_string_are_refused_naming_the_list_to_write(tmp_path):
    with pytest.raises(InvalidInputError, match=r"got 'video' \(a string, not a list: write"):
        write_table(frames(), str(tmp_path / "t"), blob_columns="video")


def test_a_threshold_in_the_written_schema_is_checked_by_the_same_schema(tmp_path):
    """A placement key in the data's own field metadata (as Lance's writers take it) is a door
    too: it raised Python's ValueError before."""
    data = frames()
    key = b"lance-encoding:blob-inline-size-threshold"
    field = data.schema.field("video")
    data = data.cast(
        data.schema.set(1, field.with_metadata({**(field.metadata or {}), key: b"4k"}))
    )
    uri = str(tmp_path / "t")
    with pytest.raises(InvalidInputError, match="inline_size_threshold of column 'video' must"):
        write_table(data, uri)
    assert not os.path.exists(uri)


def test_the_largest_thresholds_lance_accepts_are_accepted(tmp_path):
    most = {"inline_size_threshold": 2**64 - 1, "dedicated_size_threshold": 2**64 - 1}
    table = write_table(frames(), str(tmp_path / "t"), placement={"video": most})
    assert table.properties.columns["video"].placement.inline_size_threshold == 2**64 - 1
    assert table.read_blobs("video", [1]) == [b"v1" * 100]
    assert lance.dataset(table.uri).to_table(columns=["id"]).num_rows == 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.compact(target_rows=2**70), "target_rows must be a whole number of rows"),
        (lambda t: t.compact(retries="3"), "retries must be a whole number from 0 to 1000"),
        (lambda t: t.maintenance.compact({"target_bytes": 0}), "target_bytes must be a whole"),
        (lambda t: t.maintenance.compact(commit={"retries": -1}), "got -1"),
        (lambda t: t.gc(grace=-1), "grace must be a datetime.timedelta from 0 to 36,500 days"),
        (lambda t: t.gc(grace=timedelta.max, dry_run=True), "grace must be a datetime.timedelta"),
        (lambda t: list(t.scan(batch_size=0)), "batch_size must be a whole number of rows from 1"),
        (lambda t: list(t.scan(batch_size=-1)), "batch_size must be a whole number of rows"),
        (lambda t: list(t.scan(limit=-1)), "limit must be a whole number of rows from 0"),
        (lambda t: list(t.scan(offset="2")), "offset must be a whole number of rows"),
        (lambda t: list(t.scan(fragment_ids=[-1])), "fragment_ids must be in [0, 1844"),
        (lambda t: list(t.scan(fragment_ids=[2**40])), "version 1 has no fragment 1099511627776"),
        (lambda t: list(t.scan(fragment_ids="0")), "a list of integers, got '0'"),
        (lambda t: list(t.scan(fragment_ids=[0.0])), "fragment_ids must be an integer, got 0.0"),
        (lambda t: BatchLoader(t, ["id"], batch_size=2, world_size=2**63), "in [1, 1048576]"),
        (lambda t: BatchLoader(t, ["id"], batch_size=2, frame_layout="xyz"), "got 'xyz'"),
        (
            lambda t: BatchLoader(t, ["id"], batch_size=2, max_frame_pixels=-1),
            "max_frame_pixels must be a whole number of pixels from 1",
        ),
        (
            lambda t: BatchLoader(t, ["id"], batch_size=2, max_frame_pixels=2**64),
            "max_frame_pixels must be a whole number of pixels from 1 to 2**63 - 1",
        ),
        (lambda t: t.gc(older_than=timedelta(hours=-1)), "older_than must be a datetime"),
        (lambda t: t.gc(retain_versions="3"), "retain_versions must be a whole number"),
        (lambda t: t.gc(dry_run="yes"), "dry_run must be True or False, got 'yes'"),
        (lambda t: t.verify(deep="yes"), "deep must be True or False, got 'yes'"),
        (lambda t: t.update({"id": "id + 1"}, retries=-1), "retries must be a whole number"),
        (lambda t: t.merge_insert("id").conflict_retries("3"), "retries must be a whole"),
        (lambda t: t.update({"id": "id + 1"}, dedup="globl"), "dedup must be one of"),
        (lambda t: t.backfill_blob_column("new", lambda b: [b"x"], dedup=3), "got 3"),
        (lambda t: CompactionTargets(deleted_fraction=float("nan")), "a number in (0, 1]"),
        (lambda t: CommitOptions(retries=True), "retries must be a whole number"),
    ],
)
def test_options_of_changes_and_services_are_refused_the_same_way(table_uri, call, message):
    table = write_table(frames(), table_uri)
    files = tree(table_uri)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        call(table)
    assert open_table(table_uri).version == 1 and tree(table_uri) == files


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["properties", "T", "--set", "managed_bases=/"], "is the root of a filesystem"),
        (["properties", "T", "--set", "max_rows_per_file=1e3"], "got '1e3'"),
        (["properties", "T", "--set", f"inline_size_threshold={2**64}"], "from 0 to 2**64 - 1"),
        (["properties", "T", "--set", "dedup=globl"], "dedup must be one of 'content'"),
        (["gc", "T", "--retain-versions", "3.5"], "--retain-versions: must be a whole number"),
        (["gc", "T", "--grace-hours", "-1"], "--grace-hours: must be a number of hours from 0 to"),
        (["compact", "T", "--target-rows", str(2**70)], "from 1 to 2**63 - 1, got '1180591"),
        (["compact", "T", "--deleted-fraction", "nan"], "must be a number in (0, 1], got 'nan'"),
    ],
)
def test_the_command_line_refuses_wrong_settings_naming_them(table_uri, capsys, argv, message):
    write_table(frames(), table_uri)
    files = tree(table_uri)
    try:
        code = main([table_uri if a == "T" else a for a in argv])
    except SystemExit as done:  # a bad command line: argparse's own exit
        code = done.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert tree(table_uri) == files


# hand edits of the schema metadata key ``blobhouse``: (the edit, the setting it damages, a
# good value of that setting for the repair, given the media folder)
DAMAGE = [
    ({"managed_bases": "/"}, "managed_bases", lambda folder: folder),
    ({"allowed_bases": "/", "managed_bases": "/"}, "allowed_bases", lambda folder: folder),
    ({"allowed_bases": [1, None]}, "allowed_bases", lambda folder: folder),
    ({"managed_bases": ["/"]}, "managed_bases", lambda folder: folder),
    ({"allowed_bases": ["media"]}, "allowed_bases", lambda folder: folder),
    ({"max_rows_per_file": "10"}, "max_rows_per_file", lambda folder: "10"),
    ({"max_bytes_per_file": 2**64}, "max_bytes_per_file", lambda folder: "1000000"),
    ({"dedup": ["global"]}, "dedup", lambda folder: "global"),
    ({"dedup": {"video": "off"}}, "dedup", lambda folder: "global"),  # a column's is elsewhere
    ({"managed_bases": None}, "managed_bases", lambda folder: folder),
    ({"max_rows_per_file": None}, "max_rows_per_file", lambda folder: "10"),
    ({"allowed_bases": ["<table>/data"]}, "allowed_bases", lambda folder: folder),  # gc's files
]


@pytest.mark.parametrize(("edit", "setting", "good"), DAMAGE)
def test_a_setting_damaged_on_disk_never_widens_and_one_command_repairs_it(
    tmp_path, capsys, edit, setting, good
):
    uri = str(tmp_path / "t")
    folder, mine = media(tmp_path)
    write_table(frames(), uri, allowed_bases=[folder])
    edit_settings(uri, **json.loads(json.dumps(edit).replace("<table>", uri)))
    version, files = lance.dataset(uri).version, tree(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading without damaged bases warns
        table = open_table(uri)
        assert table.read_blobs("video", [1]) == [b"v1" * 100]  # the table reads
        assert setting in table.properties.damaged
        assert setting in table.stats()["properties"]["damaged"]
    refusals = [
        lambda: write_table(frames(2, uri=mine), uri, mode="append"),
        lambda: (
            open_table(uri)
            .merge_insert("id")
            .when_not_matched_insert_all()
            .execute(frames(5, uri=mine))
        ),
        lambda: open_table(uri).update({"video": b"new"}),
        lambda: open_table(uri).update({"id": "id + 10"}),  # a plain column's too
        lambda: open_table(uri).compact(),
        lambda: open_table(uri).gc(retain_versions=1, grace=timedelta(0)),
        lambda: open_table(uri).set_properties(**other),  # another setting than the damaged
    ]
    other = {"dedup": "off"} if setting == "max_rows_per_file" else {"max_rows_per_file": 7}
    for refused in refusals:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(TableMetadataError) as error:
                refused()
        message = str(error.value)
        assert f"{setting} must be" in message, message
        assert f"one command: blobhouse properties {uri} --set {setting}=" in message, message
    assert lance.dataset(uri).version == version and tree(uri) == files
    assert os.path.exists(mine)  # the user's own file: never referenced, never deleted
    # the repair is the command the message names
    argv = ["properties", uri, "--set", f"{setting}={good(folder)}"]
    if setting == "allowed_bases" and "managed_bases" in edit:
        argv += ["--set", f"managed_bases={folder}"]
    assert main(argv) == 0, capsys.readouterr().err
    assert open_table(uri).properties.damaged == {}
    write_table(frames(2, uri=mine), uri, mode="append")
    assert open_table(uri).read_blobs("clip", [2])[0] == Path(mine).read_bytes()


def test_a_whole_damaged_key_is_named_whole_and_its_one_command_repairs_it(table_uri, capsys):
    write_table(frames(), table_uri)
    lance.dataset(table_uri).update_schema_metadata({"blobhouse": "[1, 2]"})
    with pytest.raises(TableMetadataError) as error:  # the first refusal names every one
        write_table(frames(2), table_uri, mode="append")
    names = ["dedup", "allowed_bases", "managed_bases", "max_rows_per_file", "max_bytes_per_file"]
    assert " ".join(f"--set {n}=" for n in names) in re.sub(r"=\S+", "=", str(error.value))
    values = ["global", "", "", "1000", "1000000"]
    argv = [a for n, v in zip(names, values, strict=True) for a in ("--set", f"{n}={v}")]
    assert main(["properties", table_uri, *argv]) == 0, capsys.readouterr().err
    write_table(frames(2), table_uri, mode="append")
    assert open_table(table_uri).properties.max_rows_per_file == 1000


def test_a_plain_reference_never_becomes_managed_through_a_damaged_base(tmp_path):
    """The attack: managed_bases stored as the string "/" read as one base per character
    made every local file managed, and gc deleted the user's own file outside the table."""
    uri = str(tmp_path / "t")
    folder, mine = media(tmp_path)
    write_table(frames(uri=mine), uri, allowed_bases=[folder])
    edit_settings(uri, allowed_bases="/", managed_bases="/")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ExternalBlobError, match="cannot be read: the table's stored prop"):
            open_table(uri).read_blobs("clip", [0])  # no base: external reads refused
    assert any("managed_bases must be" in str(w.message) for w in caught)
    with pytest.raises(TableMetadataError, match="managed_bases"):
        write_table(frames(2, uri=mine), uri, mode="append")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        open_table(uri).delete("id >= 0")
    with pytest.raises(TableMetadataError, match="managed_bases"):
        open_table(uri).gc(retain_versions=1, grace=timedelta(0))
    assert os.path.exists(mine)


def test_a_damaged_column_setting_is_named_and_set_anew(table_uri, capsys):
    write_table(frames(), table_uri)
    lance.dataset(table_uri).update_field_metadata(
        {"video": {"blobhouse:dedup": "bogus", "blobhouse:ref-id-field": "x9"}}
    )
    damaged = open_table(table_uri).properties.damaged
    assert set(damaged) == {"dedup.video", "ref_id_column.video"}
    assert "dedup of 'video' must be one of" in damaged["dedup.video"]
    with pytest.raises(TableMetadataError) as error:
        write_table(frames(2), table_uri, mode="append")
    assert "--set dedup.video=MODE --set ref_id_column.video=COLUMN" in str(error.value)
    assert main(["properties", table_uri, "--set", "dedup.video=content"]) == 2  # not both
    assert "ref_id_column of 'video'" in capsys.readouterr().err
    argv = ["properties", table_uri, "--set", "dedup.video=content"]
    assert main([*argv, "--set", "ref_id_column.video=none"]) == 0
    assert open_table(table_uri).properties.dedup_of("video") == "content"
    write_table(frames(2), table_uri, mode="append")


def test_a_threshold_lance_accepts_on_disk_reads_as_lance_reads_it(table_uri):
    write_table(frames(), table_uri)
    key = "lance-encoding:blob-inline-size-threshold"
    lance.dataset(table_uri).update_field_metadata({"video": {key: "+5"}})  # Rust's u64 parse
    properties = open_table(table_uri).properties
    assert properties.damaged == {}
    assert properties.columns["video"].placement.inline_size_threshold == 5


def test_the_settings_page_lists_every_setting_as_the_schema_says():
    """docs/table-properties.md's tables are the schema: name, what it takes, default, meaning."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "table-properties.md").read_text()
    for spec in SETTINGS.values():
        row = f"| `{spec.name}` | {spec.expected} | {_default_text(spec)} | {spec.meaning} |"
        assert row in page, row


def _default_text(spec) -> str:
    value = spec.default
    if value is None:
        return "none"
    if isinstance(value, timedelta):
        return f"{value.total_seconds() / 3600:g} hours"
    if isinstance(value, tuple):
        return "[]"
    if getattr(spec, "unit", "") == "bytes" and not isinstance(value, bool) and value >= 1024:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return str(value)


def test_stats_of_a_table_whose_bases_are_damaged_names_its_unresolved_references(tmp_path):
    uri = str(tmp_path / "t")
    folder, mine = media(tmp_path)
    write_table(frames(uri=mine), uri, allowed_bases=[folder])
    edit_settings(uri, managed_bases="/")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading without damaged bases warns
        assert open_table(uri).stats()["unresolved_references"] == 0  # allowed ones intact
        edit_settings(uri, allowed_bases="/")
        stats = open_table(uri).stats()
    assert "managed_bases" in stats["properties"]["damaged"]
    assert stats["unresolved_references"] == 2 == stats["columns"]["clip"]["unresolved_references"]
    assert stats["columns"]["video"]["logical_bytes"] == 2 * 200  # the rest is counted as ever


def test_a_ref_id_column_recorded_as_a_column_that_is_no_integer_is_damage(table_uri, capsys):
    rows = pa.table({"id": [0], "rid": [7], "label": ["a"], "video": blob_array([b"x" * 100_000])})
    write_table(rows, table_uri, dedup="ref_id", ref_id_columns={"video": "rid"})
    dataset = lance.dataset(table_uri)
    label = {f.name(): f.id() for f in dataset.lance_schema.fields()}["label"]
    dataset.update_field_metadata({"video": {"blobhouse:ref-id-field": str(label)}})
    damaged = open_table(table_uri).properties.damaged
    assert (
        "'label'" in damaged["ref_id_column.video"] and "integer" in damaged["ref_id_column.video"]
    )
    with pytest.raises(TableMetadataError, match=r"--set ref_id_column\.video=COLUMN"):
        write_table(rows, table_uri, mode="append")
    assert main(["properties", table_uri, "--set", "ref_id_column.video=rid"]) == 0
    write_table(rows, table_uri, mode="append")
    assert open_table(table_uri).read_blobs("video", [1]) == [b"x" * 100_000]


def test_the_repair_command_pasted_as_it_is_shown_changes_nothing(tmp_path, capsys):
    """The command a damage error names is one shell line; pasted without its placeholders
    filled in, it is refused (a '|' in it once made the shell run a pipeline that set dedup)."""
    import shlex

    from blobhouse.settings import repair_command

    uri = str(tmp_path / "t")
    write_table(frames(), uri)
    names = [*TABLE_WIDE, "dedup.video", "ref_id_column.video", "inline_size_threshold.video"]
    for name in names:
        argv = shlex.split(repair_command([name], uri))
        assert argv[:3] == ["blobhouse", "properties", uri] and len(argv) == 5, argv
        version = lance.dataset(uri).version
        assert main(argv[1:]) == 2, (name, capsys.readouterr())
        assert lance.dataset(uri).version == version
