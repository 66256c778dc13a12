"""Lance indices survive blobhouse compaction: every index that covered the old fragments covers
the new ones (remapped by Lance's own compaction commit), so query plans keep using them and
lookups return the right rows."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.spark import compact as spark_compact

DIM = 8


def append(uri: str, start: int, count: int, rng) -> None:
    vectors = rng.random((count, DIM), dtype=np.float32)
    data = pa.table(
        {
            "id": pa.array(range(start, start + count), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
            "img": blob_array([b"img-%d" % i * 50 for i in range(start, start + count)]),
        }
    )
    write_table(data, uri, mode="append")


def indexed_rows(uri: str) -> dict[str, int]:
    return {i.name: i.num_rows_indexed for i in lance.dataset(uri).describe_indices()}


def assert_lookups_right(uri: str, live: list[int]) -> None:
    dataset = lance.dataset(uri)
    plan = dataset.scanner(filter=f"id = {live[-1]}").explain_plan()
    assert "ScalarIndexQuery" in plan, plan
    table = open_table(uri)
    for i in [*live[::7], live[-1]]:
        assert dataset.to_table(filter=f"id = {i}", columns=["id"])["id"].to_pylist() == [i]
        got = table.to_arrow(["id", "img"], filter=f"id = {i}", blobs="bytes").to_pylist()
        assert got == [{"id": i, "img": b"img-%d" % i * 50}]
    query = dataset.to_table(filter=f"id = {live[3]}", columns=["vec"])["vec"][0].as_py()
    nearest = dataset.to_table(nearest={"column": "vec", "q": query, "k": 1}, columns=["id"])
    assert nearest["id"].to_pylist() == [live[3]]
    ann = dataset.scanner(nearest={"column": "vec", "q": query, "k": 1}).explain_plan()
    assert "ANN" in ann, ann


@pytest.fixture
def indexed(table_uri) -> list[int]:
    """Five appends, a BTREE index on ``id`` and an IVF_PQ index on ``vec``, then deletes;
    returns the live ids."""
    rng = np.random.default_rng(7)
    for start in range(0, 500, 100):
        append(table_uri, start, 100, rng)
    dataset = lance.dataset(table_uri)
    dataset.create_scalar_index("id", "BTREE")
    lance.dataset(table_uri).create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)
    open_table(table_uri).delete("id % 9 = 0")
    return [i for i in range(500) if i % 9]


def test_compaction_keeps_every_index_covering_every_row(table_uri, indexed):
    assert indexed_rows(table_uri) == {"id_idx": len(indexed), "vec_idx": len(indexed)}
    report = open_table(table_uri).compact()
    assert report["fragments_removed"] == 5 and report["deleted_rows_dropped"] == 56
    assert indexed_rows(table_uri) == {"id_idx": len(indexed), "vec_idx": len(indexed)}
    assert_lookups_right(table_uri, indexed)
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_spark_compaction_keeps_every_index(spark, table_uri, indexed):
    report = spark_compact(spark, table_uri)
    assert report["fragments_removed"] == 5
    assert indexed_rows(table_uri) == {"id_idx": len(indexed), "vec_idx": len(indexed)}
    assert_lookups_right(table_uri, indexed)


def test_a_partial_compaction_remaps_only_what_it_rewrote(table_uri):
    """Two small fragments rewritten next to a big one that stays: entries of the rewritten
    rows move to their new rows, the others stay where they were."""
    rng = np.random.default_rng(3)
    for start, count in ((0, 100), (100, 100), (200, 300), (500, 100)):
        append(table_uri, start, count, rng)
    lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    lance.dataset(table_uri).create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)
    open_table(table_uri).delete("id < 200 AND id % 5 = 0")
    report = open_table(table_uri).compact(target_rows=250)  # fragments 0, 1; 2 is big
    assert report["fragments_removed"] == 2
    live = [i for i in range(600) if i >= 200 or i % 5]
    assert sorted(open_table(table_uri).to_arrow(["id"])["id"].to_pylist()) == live
    assert indexed_rows(table_uri) == {"id_idx": len(live), "vec_idx": len(live)}
    assert_lookups_right(table_uri, live)


def test_fragments_an_index_covers_are_never_grouped_with_ones_it_does_not(table_uri):
    """Rows appended after an index was built: Lance refuses a rewrite group that an index
    covers in part, so each is compacted with its own kind (as Lance's compact_files does)."""
    rng = np.random.default_rng(5)
    for start in (0, 100):
        append(table_uri, start, 100, rng)
    lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    for start in (200, 300):
        append(table_uri, start, 100, rng)
    version = open_table(table_uri).version
    report = open_table(table_uri).compact()
    assert report["fragments_removed"] == 4 and report["fragments_added"] == 2
    assert open_table(table_uri).version > version
    live = list(range(400))
    assert sorted(open_table(table_uri).to_arrow(["id"])["id"].to_pylist()) == live
    assert indexed_rows(table_uri)["id_idx"] == 200  # what it covered, it covers
    for i in (5, 150, 250, 399):
        assert lance.dataset(table_uri).to_table(filter=f"id = {i}")["id"].to_pylist() == [i]
