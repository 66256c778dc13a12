"""Runners (blobhouse.commit.runners): every service with a Spark form hands its units to the
runner it is given, so that the Spark form (spark.jobs.SparkTasks) is the same service."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import open_table, write_table
from blobhouse.changes.backfill import backfill
from blobhouse.changes.update import update_rows
from blobhouse.commit.runners import Here
from blobhouse.maintenance.compaction import compact
from blobhouse.maintenance.garbage_collection import mark
from blobhouse.maintenance.verification import verify


@dataclass(frozen=True)
class Recording(Here):
    """Runs here, recording each step's units."""

    seen: dict[str, list] = field(default_factory=dict)

    def map(self, table, fn, units, step, where=None, into=None, measure=None):
        self.seen.setdefault(step, []).extend(units)
        return super().map(table, fn, units, step, where=where, into=into, measure=measure)


@pytest.fixture
def three_fragments(table_uri):
    for first in (0, 2, 4):  # three appends: three small fragments a compaction merges
        ids = pa.array(range(first, first + 2), pa.int64())
        data = pa.table({"id": ids, "b": [b"payload-%d" % (i % 2) * 1000 for i in ids.tolist()]})
        table = write_table(data, table_uri, blob_columns=["b"], mode="append")
    return table.snapshot


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_backfill_writes_each_fragment_as_a_unit_of_its_runner(table_uri, dedup):
    table = write_table(pa.table({"id": pa.array(range(6))}), table_uri, max_rows_per_file=2)
    runner = Recording()
    ids = [f.fragment_id for f in table.snapshot.dataset.get_fragments()]

    def render(batch):  # the same two payloads in every fragment
        return [b"thumb-%d" % (i % 2) * 40_000 for i in batch["id"].to_pylist()]

    backfill(table.snapshot, "thumb", dedup, render, runner=runner)
    assert runner.seen == {"backfill": ids}
    got = open_table(table_uri).read_blobs("thumb", range(6))
    assert got == [b"thumb-%d" % (i % 2) * 40_000 for i in range(6)]
    if dedup == "global":  # fragments' own store writers claim: each payload stored once
        packs = Path(table_uri, "_blobs", "packs").iterdir()
        assert sum(p.stat().st_size for p in packs) == 2 * 40_000 * len(b"thumb-0")


def test_update_compaction_verify_and_gc_hand_their_units_to_the_runner(three_fragments):
    table = three_fragments
    ids = [f.fragment_id for f in table.dataset.get_fragments()]
    runner = Recording()
    done = update_rows(table, {"id": "id + 10"}, "id >= 4", runner=runner)
    assert runner.seen == {"update": ids}  # every fragment is a unit: it checks for a match
    assert done.report.fragments_rewritten == 1
    table = done.snapshot
    runner = Recording()
    compacted = compact(table, runner=runner)
    assert compacted["fragments_removed"] == 3 and len(runner.seen["compact"]) == 1
    table = open_table(table.uri).snapshot
    runner = Recording()
    assert verify(table, runner=runner)["problems"] == []
    assert runner.seen["verify"]
    runner = Recording()
    marked = mark(table, runner=runner)
    assert runner.seen["mark"] and any(p.endswith(".lance") for p in marked)
