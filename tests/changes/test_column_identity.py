"""Columns are identified by Lance field id, never by name: after Lance renames, swaps, drops
and adds columns, damaged bytes still raise CorruptBlobError, intact bytes never do, and
verify's results never cross from one column to another."""

from __future__ import annotations

import os

import lance
import pyarrow as pa
import pytest

from blobhouse import CorruptBlobError, blob_array, open_table, write_table
from tests.helpers import flip_payload, stock_read

ROWS = 6


@pytest.fixture
def two_columns(table_uri) -> dict[str, list[bytes]]:
    """Blob columns ``a`` and ``b`` of small (inline) and packed payloads."""
    a = [os.urandom(300 + i) for i in range(ROWS)]
    b = [os.urandom(90_000 + i) if i % 2 else os.urandom(500 + i) for i in range(ROWS)]
    data = pa.table(
        {"id": pa.array(range(ROWS), pa.int64()), "a": blob_array(a), "b": blob_array(b)}
    )
    write_table(data, table_uri, dedup="content")
    return {"a": a, "b": b}


def read(table_uri: str, column: str) -> list[bytes]:
    return open_table(table_uri).read_blobs(column, range(ROWS))


def problems(table_uri: str) -> set[tuple[str, int]]:
    """Problems verify finds in the latest version (older versions name columns as they did)."""
    table = open_table(table_uri)
    report = table.verify(deep=True)
    rows = [r for p in report["problems"] for r in p["rows"]]
    return {(r["column"], r["row"]) for r in rows if r["version"] == table.version}


def test_a_renamed_column_still_detects_damage(table_uri, two_columns):
    lance.dataset(table_uri).alter_columns({"path": "a", "name": "picture"})
    assert read(table_uri, "picture") == two_columns["a"]
    flip_payload(table_uri, "picture", 2)  # inline: keyed by its column in the data file
    with pytest.raises(CorruptBlobError, match="'picture', fragment 0 row 2"):
        read(table_uri, "picture")
    with pytest.raises(CorruptBlobError):
        open_table(table_uri).to_arrow(columns=["picture"], blobs="bytes")
    with pytest.raises(CorruptBlobError):
        open_table(table_uri).open_blob("picture", 2).read()
    assert problems(table_uri) == {("picture", 2)}
    (damaged,) = open_table(table_uri).verify(deep=True)["problems"]  # one payload
    old = {(r["version"], r["column"]) for r in damaged["rows"]}
    assert old == {(1, "a"), (2, "picture")}  # each version under its own name
    open_table(table_uri).delete("id = 5")  # so that compaction rewrites the fragment
    with pytest.raises(CorruptBlobError):
        open_table(table_uri).compact()  # the copy would launder the damage


def test_swapped_names_read_clean_and_damage_lands_in_the_right_column(table_uri, two_columns):
    dataset = lance.dataset(table_uri)
    dataset.alter_columns({"path": "a", "name": "tmp"})
    lance.dataset(table_uri).alter_columns({"path": "b", "name": "a"})
    lance.dataset(table_uri).alter_columns({"path": "tmp", "name": "b"})
    assert read(table_uri, "a") == two_columns["b"]
    assert read(table_uri, "b") == two_columns["a"]
    assert problems(table_uri) == set()
    open_table(table_uri).delete("id = 5")
    assert open_table(table_uri).compact()["fragments_removed"] == 1  # reads every row
    flip_payload(table_uri, "b", 4)  # the old ``a``: inline, in the file compaction wrote
    assert open_table(table_uri).read_blobs("a", range(5)) == two_columns["b"][:5]
    with pytest.raises(CorruptBlobError, match="'b'"):
        open_table(table_uri).read_blobs("b", range(5))
    assert problems(table_uri) == {("b", 4)}


def test_drop_then_rename_to_the_dropped_name(table_uri, two_columns):
    lance.dataset(table_uri).drop_columns(["a"])
    lance.dataset(table_uri).alter_columns({"path": "b", "name": "a"})
    assert read(table_uri, "a") == two_columns["b"]
    assert stock_read(table_uri, "a") == two_columns["b"]
    assert problems(table_uri) == set()
    flip_payload(table_uri, "a", 0)  # inline (even rows are small)
    with pytest.raises(CorruptBlobError):
        read(table_uri, "a")
    assert problems(table_uri) == {("a", 0)}


def test_added_columns_and_later_appends_keep_their_checks(table_uri, two_columns):
    lance.dataset(table_uri).add_columns({"score": "id * 2"})
    more = pa.table(
        {
            "id": pa.array([ROWS], pa.int64()),
            "a": blob_array([b"new-a" * 10]),
            "b": blob_array([b"new-b" * 10]),
            "score": pa.array([99], pa.int64()),
        }
    )
    table = write_table(more, table_uri, mode="append", dedup="content")
    assert table.read_blobs("a", [ROWS]) == [b"new-a" * 10]
    assert problems(table_uri) == set()
    flip_payload(table_uri, "b", 1)  # packed
    assert problems(table_uri) == {("b", 1)}
