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


def test_the_check_sees_a_wrong_report():
    assert mismatches(
        {"files": 1, "bytes": "2", "extra": 0},
        GcReport.__annotations__ and typing.get_type_hints(GcReport)["removed_by_sweep"],
    ) == [
        "extra: not declared",
        "bytes: str, declared <class 'int'>",
    ]
