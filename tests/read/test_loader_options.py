"""LoaderOptions: the training read's options declared once, taken as ``options=`` by
BatchLoader and the torch datasets, their fields kept as keyword sugar."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from blobhouse import InvalidInputError, blob_array, write_table
from blobhouse.loader import BATCHING, BatchLoader, LoaderOptions
from blobhouse.torch import TableBatchDataset, TableRowDataset

FIELDS = {f.name for f in fields(LoaderOptions)}


@pytest.fixture
def table(table_uri):
    rows = {"id": list(range(10)), "img": blob_array([b"%d" % (i % 3) for i in range(10)])}
    write_table(pa.table(rows), table_uri)
    return table_uri


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_the_object_and_its_keywords_load_alike(table):
    options = LoaderOptions(batch_size=3, filter="id < 8", seed=4, rank=1, world_size=2)
    by_object = BatchLoader(table, ["id", "img"], options=options)
    by_keywords = BatchLoader(
        table, ["id", "img"], batch_size=3, filter="id < 8", seed=4, rank=1, world_size=2
    )
    assert ids(by_object) == ids(by_keywords) and len(ids(by_object)) == 4
    assert by_object.options == by_keywords.options == options


def test_each_reader_shows_the_fields_it_takes_as_keywords():
    def keywords(cls) -> set[str]:
        return set(inspect.signature(cls.__init__).parameters) & FIELDS

    assert keywords(BatchLoader) == FIELDS
    assert keywords(TableBatchDataset) == FIELDS - {"worker_id", "num_workers"}
    assert keywords(TableRowDataset) == FIELDS - set(BATCHING)


def test_loader_options_are_checked_once_when_made():
    for bad, message in [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, 1\], got 2"),
        ({"blobs": "descriptors"}, "blobs must be 'bytes' or 'refs'"),
        ({"check_hashes": "no"}, "check_hashes must be True or False"),
        ({"shuffle_window": 0}, "shuffle_window must be >= 1"),
        ({"frames": ["v"], "blobs": "refs"}, "frames decode the chunks' bytes"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            LoaderOptions(**bad)


def test_an_object_with_its_keywords_or_a_field_a_reader_does_not_take_is_refused(table):
    options = LoaderOptions(batch_size=2)
    with pytest.raises(InvalidInputError, match=r"BatchLoader\(\): give options .* \(seed\)"):
        BatchLoader(table, options=options, seed=3)
    with pytest.raises(InvalidInputError, match=r"batch_size .* is required"):
        BatchLoader(table, options=LoaderOptions(seed=3))
    with pytest.raises(InvalidInputError, match="TableBatchDataset takes no num_workers"):
        TableBatchDataset(table, options=LoaderOptions(batch_size=2, num_workers=2))
    with pytest.raises(InvalidInputError, match="TableRowDataset takes no batch_size"):
        TableRowDataset(table, options=options)


def test_the_torch_datasets_take_loader_options(table):
    batches = TableBatchDataset(
        table, ["id"], options=LoaderOptions(batch_size=4, shuffle=False, filter="id >= 2")
    )
    got = [i for b in DataLoader(batches, batch_size=None) for i in b["id"].tolist()]
    assert got == list(range(2, 10))
    rows = TableRowDataset(table, options=LoaderOptions(filter="id > 6", blobs="refs"))
    assert len(rows) == 3 and rows[0]["id"] == 7 and isinstance(rows[0]["img"], dict)
