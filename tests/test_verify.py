"""verify: every reference of every retained version resolves; damage is reported precisely."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import main


@pytest.fixture
def two_versions(table_uri):
    first = [os.urandom(100_000), os.urandom(5_000_000), b"inline"]
    write_table(
        pa.table({"b": blob_array(first)}),
        table_uri,
        placement={"b": {"dedicated_size_threshold": 1_000_000}},
    )
    write_table(pa.table({"b": blob_array([os.urandom(200_000)])}), table_uri, mode="append")
    return open_table(table_uri)


def sidecars(uri: str) -> list[Path]:
    return sorted(Path(uri).rglob("*.blob"), key=lambda p: p.stat().st_size)


def test_a_healthy_table_has_no_problems(two_versions, capsys):
    report = two_versions.verify()
    assert report["problems"] == []
    assert report["versions"] == [1, 2]
    assert report["references"] == 3 + 4  # version 1 has 3 rows, version 2 has 4
    assert main(["verify", two_versions.dataset.uri]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def test_truncated_and_deleted_sidecars_are_reported(two_versions, capsys):
    packed, dedicated = (
        sidecars(two_versions.dataset.uri)[0],
        sidecars(two_versions.dataset.uri)[-1],
    )
    with open(dedicated, "r+b") as f:
        f.truncate(1000)
    packed.unlink()
    report = two_versions.verify()
    reasons = {(p["version"], p["row"], p["reason"].split(" ")[0]) for p in report["problems"]}
    assert (1, 1, "range") in reasons  # the truncated 5 MB dedicated sidecar, in both versions
    assert (2, 1, "range") in reasons
    assert any(
        p["reason"] == "missing object" and p["uri"].endswith(packed.name)
        for p in report["problems"]
    )
    assert all(p["column"] == "b" for p in report["problems"])
    assert main(["verify", two_versions.dataset.uri, "--json"]) == 1
    assert '"missing object"' in capsys.readouterr().out
