"""verify: every reference of every retained version resolves; damage is reported precisely."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import main
from tests.helpers import flip


@pytest.fixture
def two_versions(table_uri):
    first = [os.urandom(100_000), os.urandom(5_000_000), b"inline"]
    write_table(
        pa.table({"b": blob_array(first)}),
        table_uri,
        placement={"b": {"dedicated_size_threshold": 1_000_000}},
        dedup="content",
    )
    write_table(
        pa.table({"b": blob_array([os.urandom(200_000)])}),
        table_uri,
        mode="append",
        dedup="content",
    )
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
    assert len(report["problems"]) == 2  # one per damaged payload
    truncated = next(p for p in report["problems"] if p["reason"].startswith("range"))
    # the truncated 5 MB dedicated sidecar, referenced by row 1 of both versions
    assert [(r["version"], r["row"]) for r in truncated["rows"]] == [(1, 1), (2, 1)]
    assert (truncated["version"], truncated["row"], truncated["references"]) == (1, 1, 2)
    assert (truncated["position"], truncated["size"]) == (0, 5_000_000)
    assert any(
        p["reason"] == "missing object" and p["uri"].endswith(packed.name)
        for p in report["problems"]
    )
    assert all(p["column"] == "b" for p in report["problems"])
    assert main(["verify", two_versions.dataset.uri, "--json"]) == 1
    assert '"missing object"' in capsys.readouterr().out


def test_stats_reports_fragments_deleted_rows_and_orphans(two_versions):
    from blobhouse.write.pipeline import plan_write, write_data_files

    table = two_versions
    stats = table.stats()
    assert (stats["fragments"], stats["deleted_rows"], stats["orphan_files"]) == (2, 0, 0)
    # a write that staged files but never committed (a killed writer) leaves orphans
    data = pa.table({"b": blob_array([os.urandom(300_000)])})
    staged = write_data_files(data.to_batches(), plan_write(data.schema), table.location)
    stats = open_table(table.dataset.uri).stats()
    assert stats["orphan_files"] == 1 + len(staged[0].sidecars)
    assert stats["orphan_bytes"] >= 300_000
    # rows deleted in the latest version still count, their files stay referenced
    latest = open_table(table.dataset.uri)
    latest.delete("true")
    after = open_table(table.dataset.uri).stats()
    assert after["rows"] == 0 and after["orphan_files"] == stats["orphan_files"]


def test_stats_counts_deleted_rows(table_uri):
    data = pa.table({"id": pa.array(range(6), pa.int64()), "b": blob_array([b"x"] * 6)})
    table = write_table(data, table_uri, max_rows_per_file=3, dedup="content")
    table.delete("id IN (1, 4)")
    stats = open_table(table_uri).stats()
    assert (stats["rows"], stats["fragments"], stats["deleted_rows"]) == (4, 2, 2)


def test_deep_verify_detects_flipped_bytes_in_sidecars_and_data_files(two_versions, capsys):
    table = two_versions
    refs = table.to_arrow(blobs="refs").column("b").to_pylist()
    packed, inline = refs[0], refs[2]  # 100 kB packed, "inline" inside the data file
    assert packed["uri"].endswith(".blob") and inline["uri"].endswith(".lance")
    flip(packed["uri"], packed["position"] + 500)
    flip(inline["uri"], inline["position"])
    assert table.verify()["problems"] == []  # ranges still resolve: only hashes tell
    report = table.verify(deep=True)
    found = {(r["version"], r["row"]) for p in report["problems"] for r in p["rows"]}
    assert found == {(1, 0), (1, 2), (2, 0), (2, 2)}
    assert len(report["problems"]) == 2  # the packed payload and the inline one
    assert all(p["reason"].startswith("content hash mismatch") for p in report["problems"])
    assert report["hashed"] == report["references"] == 7
    assert main(["verify", table.dataset.uri, "--deep"]) == 1
    assert "content hash mismatch" in capsys.readouterr().out


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_one_damaged_payload_shared_by_60_rows_is_one_problem_listing_them(table_uri, dedup):
    shared, other = os.urandom(150_000), os.urandom(90_000)
    ids = pa.array(range(61), pa.int64())
    data = pa.table({"id": ids, "b": blob_array([shared] * 60 + [other])})
    table = write_table(data, table_uri, dedup=dedup, max_rows_per_file=20)  # 4 fragments
    refs = table.to_arrow(blobs="refs").column("b").to_pylist()
    assert len({(r["uri"], r["position"]) for r in refs[:60]}) == (1 if dedup == "global" else 3)
    for ref in {(r["uri"], r["position"]) for r in refs[:60]}:
        flip(ref[0], ref[1] + 7)
    report = open_table(table_uri).verify(deep=True)
    assert report["hashed"] == 61
    damaged = [p for p in report["problems"] if not p["reason"].startswith("store index entry")]
    entries = [p for p in report["problems"] if p["reason"].startswith("store index entry")]
    # the store's own entry for the payload is named too, with the same 60 rows
    assert [e["references"] for e in entries] == ([60] if dedup == "global" else [])
    assert len(damaged) == (1 if dedup == "global" else 3)  # one per stored copy
    rows = sorted(r["row"] for p in damaged for r in p["rows"])
    assert rows == list(range(60))
    assert sum(p["references"] for p in damaged) == 60
    assert all(p["reason"].startswith("content hash mismatch") for p in damaged)
    assert all(p["size"] == len(shared) for p in damaged)
    assert main(["verify", table_uri, "--deep", "--json"]) == 1
