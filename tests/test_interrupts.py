"""Ctrl-C reaches Python only when the call into Lance returns: a commit interrupted that way
has landed, and the cleanup of the interrupted write must not remove what it committed (a
SIGINT loop on an indexed table found compaction deleting the files it had just committed)."""

from __future__ import annotations

import os

import lance
import pyarrow as pa
import pytest
from lance import LanceDataset
from lance.optimize import Compaction

import blobhouse.maintenance.compaction as compaction
import blobhouse.store as store
from blobhouse import blob_array, open_table, write_table

from helpers import stock_read


def interrupted_after(real):
    """``real``, with a Ctrl-C arriving as it returns."""

    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    return call


def payload(i: int) -> bytes:
    return b"%d" % i * 40_000 if i % 2 else b"%d" % i * 10


def rows(ids: range) -> pa.Table:
    data = blob_array([payload(i) for i in ids])
    return pa.table({"id": pa.array(list(ids), pa.int64()), "b": data})


def assert_reads(uri: str, ids: list[int]) -> None:
    table = open_table(uri)
    got = {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}
    assert got == {i: payload(i) for i in ids}
    order = lance.dataset(uri).to_table(columns=["id"])["id"].to_pylist()
    assert stock_read(uri, "b") == [got[i] for i in order]
    assert table.verify(deep=True)["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_write_interrupted_as_its_commit_returns_keeps_what_it_committed(
    table_uri, dedup, monkeypatch
):
    write_table(rows(range(4)), table_uri, dedup=dedup)
    monkeypatch.setattr(store.LanceDataset, "commit", interrupted_after(LanceDataset.commit))
    with pytest.raises(KeyboardInterrupt):
        write_table(rows(range(4, 8)), table_uri, mode="append", dedup=dedup)
    monkeypatch.undo()
    assert open_table(table_uri).version == 2
    assert_reads(table_uri, list(range(8)))


def test_an_indexed_compaction_interrupted_as_its_commit_returns(table_uri, monkeypatch):
    for start in (0, 4, 8):
        write_table(rows(range(start, start + 4)), table_uri, mode="append", dedup="global")
    lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    open_table(table_uri).delete("id = 5")
    monkeypatch.setattr(
        compaction,
        "Compaction",
        type("C", (), {"commit": staticmethod(interrupted_after(Compaction.commit))}),
    )
    with pytest.raises(KeyboardInterrupt):
        open_table(table_uri).compact()
    monkeypatch.undo()
    assert len(lance.dataset(table_uri).get_fragments()) == 1  # the compaction landed
    assert_reads(table_uri, [i for i in range(12) if i != 5])
    assert os.path.isdir(table_uri)


def test_a_backfill_interrupted_as_its_commit_returns(table_uri, monkeypatch):
    write_table(pa.table({"id": pa.array(range(6), pa.int64())}), table_uri, max_rows_per_file=2)
    monkeypatch.setattr(store.LanceDataset, "commit", interrupted_after(LanceDataset.commit))
    with pytest.raises(KeyboardInterrupt):
        open_table(table_uri).backfill_blob_column(
            "img",
            lambda b: [b"img-%d" % i * 30_000 for i in b["id"].to_pylist()],
            dedup="global",
        )
    monkeypatch.undo()
    table = open_table(table_uri)
    assert table.read_blobs("img", range(6)) == [b"img-%d" % i * 30_000 for i in range(6)]
    assert table.verify(deep=True)["problems"] == []
