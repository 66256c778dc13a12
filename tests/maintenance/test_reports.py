"""Every service report has exactly the keys its typed report declares (nested ones too), with
values of the declared kinds: what type checkers are told is what callers get."""

from __future__ import annotations

import types
import typing
from datetime import timedelta

import pyarrow as pa
import pytest

from blobhouse import blob_array, write_table
from blobhouse.maintenance import CompactionReport, GcReport, StatsReport, VerifyReport
from blobhouse.maintenance.garbage_collection import clean_failed_create, orphans, reclaimable
from blobhouse.maintenance.reports import (
    FailedCreateReport,
    IngestReport,
    OrphansReport,
    ReclaimableReport,
)
from blobhouse.write import begin_write


def mismatches(report: dict, declared: type, where: str = "") -> list[str]:
    """Keys missing or undeclared, and values of another kind, anywhere in ``report``."""
    hints = typing.get_type_hints(declared)
    found = [f"{where}{k}: not declared" for k in report.keys() - hints.keys()]
    found += [f"{where}{k}: missing" for k in hints.keys() - report.keys()]
    for key, hint in hints.items():
        if key not in report:
            continue
        value = report[key]
        if typing.is_typeddict(hint):
            found += mismatches(value, hint, f"{where}{key}.")
            continue
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = tuple(type(None) if k is None else typing.get_origin(k) or k for k in options)
        if not isinstance(value, kinds):
            found.append(f"{where}{key}: {type(value).__name__}, declared {hint}")
    return found


@pytest.fixture
def table(tmp_path):
    rows = pa.table({"id": [1, 2, 3], "img": blob_array([b"x" * 100, b"y" * 100_000, b"x" * 100])})
    table = write_table(rows, str(tmp_path / "t"))
    table.delete("id = 1")
    return table


def test_every_report_matches_its_declaration(table):
    assert mismatches(table.compact(), CompactionReport) == []
    assert mismatches(table.gc(dry_run=True), GcReport) == []
    assert mismatches(table.gc(grace=timedelta(0)), GcReport) == []
    assert mismatches(table.verify(deep=True), VerifyReport) == []
    assert mismatches(table.stats(), StatsReport) == []


def test_the_reports_of_orphans_reclaimable_and_a_failed_create(table, tmp_path):
    assert mismatches(orphans(table), OrphansReport) == []
    assert mismatches(reclaimable(table.snapshot), ReclaimableReport) == []
    rows = pa.table({"img": blob_array([b"z" * 100_000])})
    write = begin_write(str(tmp_path / "never"), rows.schema, in_tasks=True)
    write.plan.write(rows.to_batches())  # staged, never committed: a failed create's leftovers
    report = clean_failed_create(str(tmp_path / "never"), grace=timedelta(0))
    assert report["kept_leased_files"] >= 1  # its lease is still live
    assert mismatches(report, FailedCreateReport) == []


def test_the_ingest_report(spark, tmp_path):
    from blobhouse.spark.ingest import ingest

    (tmp_path / "a.bin").write_bytes(b"a" * 5000)
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text('{"id": 1, "image": "a.bin"}\n{"id": 2, "image": "a.bin"}\n')
    report = ingest(spark, str(manifest), str(tmp_path / "t"), ["image"])
    assert report["physical_bytes"] == 5000
    assert mismatches(report, IngestReport) == []


def test_the_check_sees_a_wrong_report():
    assert mismatches(
        {"files": 1, "bytes": "2", "extra": 0},
        GcReport.__annotations__ and typing.get_type_hints(GcReport)["removed_by_sweep"],
    ) == [
        "extra: not declared",
        "bytes: str, declared <class 'int'>",
    ]


def test_maintenance_options_are_checked_by_name_and_type(table):
    """table.maintenance takes typed options or mappings of their fields; anything else is
    refused naming the option, and the table stays where it was."""
    from blobhouse.errors import InvalidInputError, UnknownOptionError

    version = table.version
    with pytest.raises(UnknownOptionError, match=r"'target_row' .*did you mean 'target_rows'"):
        table.maintenance.compact({"target_row": 5})
    with pytest.raises(InvalidInputError, match="CompactionTargets or a mapping"):
        table.maintenance.compact(5)
    with pytest.raises(InvalidInputError, match="target_rows must be a whole number of rows"):
        table.maintenance.compact({"target_rows": "5"})
    with pytest.raises(InvalidInputError, match="retries must be a whole number"):
        table.maintenance.compact(commit={"retries": -1})
    for bad in (float("nan"), 2, -0.1):  # nan once planned a compaction
        with pytest.raises(InvalidInputError, match=r"max_unused must be a number in \["):
            table.maintenance.compact({"max_unused": bad})
    # the per-pack threshold it replaced is named, through every door that takes options
    with pytest.raises(UnknownOptionError, match=r"'repack_threshold' \(replaced by max_unused"):
        table.maintenance.compact({"repack_threshold": 0.5})
    with pytest.raises(UnknownOptionError, match=r"'repack_threshold' \(replaced by max_unused"):
        table.compact(repack_threshold=0.5)
    with pytest.raises(InvalidInputError, match="target_bytes must be a whole number of bytes"):
        table.maintenance.compact({"target_bytes": 0})
    assert table.version == table.refresh().version == version
    assert table.maintenance.compact({"target_rows": 100})["fragments_removed"] == 1
