"""What an update leaves in storage over time: repeated updates keep one copy of the column."""

from __future__ import annotations

import os
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import blob_array, write_table
from tests.helpers import disk_bytes

ROWS = 4_000
PER_FILE = 1_000


def gc_old(table) -> None:
    table.gc(retain_versions=1, grace=timedelta(0))


def random_labels(n: int) -> list[str]:
    # random hex: every update's column has the same size whatever it compresses to
    return [os.urandom(12).hex() for _ in range(n)]


def plain_and_blob_table(uri: str):
    return write_table(
        pa.table(
            {
                "id": pa.array(range(ROWS), pa.int64()),
                "label": random_labels(ROWS),
                "img": blob_array([os.urandom(2_000) for _ in range(ROWS)]),
            }
        ),
        uri,
        max_rows_per_file=PER_FILE,
    )


# ---------------------------------------------------------------------------------------------
# 1. repeated updates keep one copy of the column


def relabel(table, k: int) -> None:
    # new values of the same length every time (hex digits in upper, then lower case)
    table.update({"label": "upper(label)" if k % 2 == 0 else "lower(label)"})


def new_images(table, k: int) -> None:
    table.update({"img": lambda batch: [os.urandom(2_000) for _ in range(batch.num_rows)]})


@pytest.mark.parametrize("change", [relabel, new_images], ids=["plain", "blob"])
def test_repeated_updates_and_gc_keep_one_copy_of_the_column(tmp_path, change):
    """After N updates of one column and gc, the table holds the column's original copy
    (inside the original files, which hold the other columns too) and the newest one only:
    each update's file of the column is dropped from its fragment by the next update, so gc
    removes it. Bytes after 6 updates equal those after 1 within 5 % of what one update adds
    (one more copy would be +100 %; what differs otherwise is a few bytes of manifest)."""
    after = {}
    for updates in (1, 6):
        uri = str(tmp_path / f"t{updates}")
        table = plain_and_blob_table(uri)
        gc_old(table)
        before = disk_bytes(uri)
        for k in range(updates):
            change(table, k)
        gc_old(table)
        after[updates] = disk_bytes(uri) - before
        dataset = lance.dataset(uri)
        # each fragment: its original file and the newest file of the column, nothing more
        assert [len(f.metadata.files) for f in dataset.get_fragments()] == [2] * (ROWS // PER_FILE)
        stock = dataset.to_table(columns=["id", "label"])
        assert stock.num_rows == ROWS and stock["id"].to_pylist() == list(range(ROWS))
        assert table.to_arrow(columns=["label"])["label"].equals(stock["label"])
        if change is new_images:
            stored = table.read_blobs("img", list(range(ROWS)))
            assert [p for _, p in dataset.read_blobs("img", indices=list(range(ROWS)))] == stored
        assert table.verify(deep=True)["problems"] == []
    assert after[1] > 20_000  # the column's new copy: the tolerance below is 5 % of it
    assert abs(after[6] - after[1]) < 0.05 * after[1], after


def test_a_file_of_several_columns_stays_until_none_of_them_is_live(table_uri):
    table = write_table(
        pa.table({"id": pa.array(range(100), pa.int64()), "a": range(100), "b": range(100)}),
        table_uri,
        max_rows_per_file=50,
    )
    table.update({"a": "a + 1", "b": "b + 1"})
    table.update({"a": "a + 1"})  # the first file still provides b
    assert [len(f.metadata.files) for f in table.dataset.get_fragments()] == [3, 3]
    table.update({"b": "b + 1"})  # now it provides nothing: dropped
    assert [len(f.metadata.files) for f in table.dataset.get_fragments()] == [3, 3]
    data = lance.dataset(table_uri).to_table().to_pydict()
    assert data["a"] == [i + 2 for i in range(100)] and data["b"] == [i + 2 for i in range(100)]
