"""The option objects at the edges: every public entry takes the object (``options=``,
``targets=``, ``commit=``) and keeps its fields as keyword sugar, read from the dataclass
fields; an object given with its keywords is refused naming both."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pyarrow as pa
import pytest

import blobhouse
from blobhouse import (
    CommitOptions,
    CompactionTargets,
    InvalidInputError,
    WriteOptions,
    blob_array,
    open_table,
    write_table,
)
from blobhouse.changes.schema_changes import PROPERTY_COMMIT
from blobhouse.errors import UnknownOptionError
from blobhouse.maintenance import compact
from blobhouse.maintenance.table_maintenance import TableMaintenance
from blobhouse.options import option_keywords
from blobhouse.table import PROPERTIES


def appended(uri: str, times: int = 3) -> blobhouse.Table:
    for i in range(times):
        table = write_table(
            pa.table({"id": [i], "img": blob_array([b"x" * 1000])}), uri, mode="append"
        )
    return table


def names(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_every_compaction_entry_shows_the_targets_and_commit_fields_as_keywords():
    sugar = {f.name for cls in (CompactionTargets, CommitOptions) for f in fields(cls)}
    for entry in (blobhouse.Table.compact, TableMaintenance.compact, compact):
        assert {"targets", "commit"} | sugar <= names(entry), entry


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.compact(CompactionTargets(target_rows=100), commit=CommitOptions(0)),
        lambda t: t.compact(target_rows=100, retries=0),
        lambda t: t.maintenance.compact(target_rows=100),
        lambda t: t.maintenance.compact({"target_rows": 100}, retries=0),
        lambda t: compact(t, target_rows=100, retries=0),
        lambda t: compact(t, CompactionTargets(target_rows=100)),
    ],
)
def test_the_object_and_its_keywords_compact_alike(table_uri, call):
    table = appended(table_uri)
    report = call(table)
    assert (report["fragments_removed"], report["fragments_added"]) == (3, 1)
    assert open_table(table_uri).maintenance.stats()["fragments"] == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda t: t.compact(CompactionTargets(), target_rows=5),
            r"compact\(\): give targets \(a CompactionTargets\) or its keywords \(target_rows\)",
        ),
        (
            lambda t: t.maintenance.compact(commit=CommitOptions(1), retries=2),
            r"give commit \(a CommitOptions\) or its keywords \(retries\), not both",
        ),
        (
            lambda t: compact(t, {"target_rows": 5}, deleted_fraction=0.5),
            r"give targets .* \(deleted_fraction\), not both",
        ),
        (
            lambda t: t.update({"id": "id + 1"}, commit=CommitOptions(), retries=1),
            r"update\(\): give commit \(a CommitOptions\) or its keywords \(retries\)",
        ),
        (
            lambda t: t.set_properties(WriteOptions(dedup="content"), max_rows_per_file=5),
            r"set_properties\(\): give options \(a WriteOptions\) or its keywords",
        ),
        (
            lambda t: write_table(
                pa.table({"id": [1]}), t.uri, WriteOptions(), mode="append", dedup="off"
            ),
            r"write_table\(\): give options \(a WriteOptions\) or its keywords \(dedup\)",
        ),
    ],
)
def test_an_object_with_its_keywords_is_refused_naming_both(table_uri, call, message):
    table = appended(table_uri, 1)
    with pytest.raises(InvalidInputError, match=message):
        call(table)
    assert open_table(table_uri).version == 1  # nothing committed


def test_keyword_sugar_is_checked_as_the_object_is(table_uri):
    table = appended(table_uri, 1)
    with pytest.raises(InvalidInputError, match="deleted_fraction must be a number in"):
        table.compact(deleted_fraction=2)
    with pytest.raises(UnknownOptionError, match="did you mean 'target_rows'"):
        table.compact(target_row=5)
    with pytest.raises(InvalidInputError, match="retries must be a whole number"):
        table.update({"id": "id + 1"}, retries=-1)


def test_update_takes_commit_options(table_uri):
    table = appended(table_uri, 1)
    report = table.update({"id": "id + 1"}, commit=CommitOptions(retries=0))
    assert report.rows_updated == 1 and table.to_arrow(columns=["id"])["id"].to_pylist() == [1]


def test_merge_insert_commits_with_commit_options_or_conflict_retries(table_uri):
    table = appended(table_uri, 1)
    merge = table.merge_insert("id").when_not_matched_insert_all()
    assert merge.commit(CommitOptions(retries=0)) is merge and merge._commit.retries == 0
    assert merge.conflict_retries(5)._commit == CommitOptions(retries=5)  # the same field
    with pytest.raises(InvalidInputError, match="commit\\(\\) takes a CommitOptions"):
        merge.commit(3)
    with pytest.raises(InvalidInputError, match="retries must be a whole number"):
        merge.conflict_retries(-1)
    report = merge.execute(pa.table({"id": [9], "img": blob_array([b"y"])}))
    assert report.num_inserted_rows == 1 and table.count_rows() == 2


def test_a_property_change_retries_more_than_other_changes():
    assert PROPERTY_COMMIT.retries == 8 > CommitOptions().retries


def test_write_table_takes_write_options_or_their_keywords(table_uri, tmp_path):
    data = pa.table({"id": [1, 2], "img": blob_array([b"a", b"a"])})
    by_object = write_table(data, table_uri, WriteOptions(dedup="content", max_rows_per_file=5))
    by_keywords = write_table(data, str(tmp_path / "k"), dedup="content", max_rows_per_file=5)
    for table in (by_object, by_keywords):
        assert table.properties.dedup == "content" and table.properties.max_rows_per_file == 5
    # the keywords are WriteOptions' fields, read from the dataclass
    assert {f.name for f in fields(WriteOptions)} <= names(write_table)


def test_set_properties_takes_write_options_or_their_keywords(table_uri):
    table = appended(table_uri, 1)
    table.set_properties(WriteOptions(dedup="content", max_rows_per_file=7))
    assert (table.properties.dedup, table.properties.max_rows_per_file) == ("content", 7)
    table.set_properties(max_rows_per_file=9)
    assert (table.properties.dedup, table.properties.max_rows_per_file) == ("content", 9)
    with pytest.raises(InvalidInputError, match="cannot change blob_columns"):
        table.set_properties(WriteOptions(blob_columns=["img"]))
    assert set(PROPERTIES) == names(blobhouse.Table.set_properties) - {"self", "options"}


def test_option_keywords_keeps_positional_arguments_and_refuses_name_clashes():
    @option_keywords(commit=CommitOptions)
    def change(table, where=None, *, commit=None):
        return table, where, commit

    assert change("t", "id > 1", retries=2) == ("t", "id > 1", CommitOptions(2))
    assert change("t") == ("t", None, None)
    assert change("t", retries=None) == ("t", None, None)  # None: not given
    with pytest.raises(TypeError, match="named as option fields"):
        option_keywords(commit=CommitOptions)(lambda table, retries=3, commit=None: None)
