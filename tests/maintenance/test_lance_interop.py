"""Lance's own compact_files and cleanup_old_versions on a blobhouse table lose no data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import Blob, ExternalBlobError, blob_array, open_table, write_table
from tests.helpers import stock_read

PLACEMENT = {"b": {"dedicated_size_threshold": 1_000_000}}  # 1.5 MB payloads are dedicated


@dataclass
class Built:
    uri: str
    external: Path
    external_bytes: bytes
    versions: dict[int, dict[int, bytes | None]]  # version -> {id: bytes} of its live rows

    @property
    def live(self) -> dict[int, bytes | None]:
        return self.versions[max(self.versions)]

    def content(self, version: int) -> dict[int, bytes | None]:
        """What ``version`` holds: maintenance versions keep the rows of the last write."""
        return self.versions.get(version, self.live)

    def unique_stored_bytes(self) -> int:
        """Distinct payloads the table itself stores for the live rows (not null, not external)."""
        stored = {v for v in self.live.values() if v is not None and v != self.external_bytes}
        return sum(len(v) for v in stored)


@pytest.fixture
def built(tmp_path: Path) -> Built:
    """Shared (content dedup), packed, dedicated, inline, null and external blobs over three
    appends and a delete; the same payloads recur across appends (stored once per file)."""
    media = tmp_path / "media"
    media.mkdir()
    external_bytes = os.urandom(5_000)
    external = media / "clip.bin"
    external.write_bytes(external_bytes)
    uri = str(tmp_path / "table")
    shared_packed = os.urandom(200_000)
    shared_small = os.urandom(20)  # shared, so packed, not inline
    dedicated = os.urandom(1_500_000)
    versions: dict[int, dict[int, bytes | None]] = {}
    rows: dict[int, bytes | None] = {}
    next_id = 0

    def append(values: list) -> None:
        nonlocal next_id
        ids = list(range(next_id, next_id + len(values)))
        next_id += len(values)
        data = pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(values)})
        table = write_table(
            data,
            uri,
            mode="append",
            placement=PLACEMENT,
            allowed_bases=None if rows or versions else [str(media)],
            dedup="content",
        )
        for i, value in zip(ids, values, strict=True):
            rows[i] = external_bytes if isinstance(value, Blob) else value
        versions[table.version] = dict(rows)

    clip = Blob(uri=str(external))
    append([shared_packed, shared_packed, shared_small, shared_small, None, clip])
    append([os.urandom(10), os.urandom(90_000), shared_small])
    append([shared_packed, dedicated, dedicated, b"tiny", os.urandom(100_000), shared_small])
    append([*[shared_packed] * 4, dedicated, None, clip, os.urandom(30)])
    table = open_table(uri)
    table.delete("id IN (1, 9, 14, 17)")
    for i in (1, 9, 14, 17):
        del rows[i]
    versions[open_table(uri).version] = dict(rows)
    built = Built(uri, external, external_bytes, versions)
    assert_intact(built)  # the starting point reads back
    before = open_table(uri).stats()
    assert before["columns"]["b"]["kinds"]["dedicated"]["rows"] >= 1
    assert before["columns"]["b"]["kinds"]["inline"]["rows"] >= 1
    assert before["columns"]["b"]["kinds"]["packed"]["dedup_ratio"] > 1
    assert before["columns"]["b"]["kinds"]["external"]["rows"] == 2
    return built


def live_ids(dataset) -> list[int]:
    return dataset.to_table(columns=["id"]).column("id").to_pylist()


def assert_intact(built: Built) -> None:
    """Every retained version reads back its rows through blobhouse and stock pylance, deep
    verify finds nothing wrong, and the external object is untouched."""
    uri = built.uri
    latest = open_table(uri)
    retained = [v["version"] for v in latest.versions()]
    assert latest.version in retained
    for version in retained:
        expected = built.content(version)
        table = open_table(uri, version)
        got = table.to_arrow(blobs="bytes").to_pylist()
        assert {r["id"]: r["b"] for r in got} == expected, f"blobhouse, version {version}"
        assert len(got) == len(expected)
        order = [r["id"] for r in got]
        assert table.read_blobs("b", range(len(order))) == [expected[i] for i in order]
        dataset = lance.dataset(uri, version=version)
        stock = dataset.read_blobs("b", indices=list(range(len(expected))), preserve_order=True)
        assert [p for _, p in stock] == [expected[i] for i in live_ids(dataset)], (
            f"stock pylance, version {version}"
        )
    assert stock_read(uri, "b") == [built.live[i] for i in live_ids(lance.dataset(uri))]
    report = latest.verify(deep=True)
    assert report["problems"] == []
    assert report["references"] > 0
    assert built.external.read_bytes() == built.external_bytes


def lance_compact(uri: str) -> None:
    metrics = lance.dataset(uri).optimize.compact_files()
    assert metrics.fragments_removed >= 2  # Lance really rewrote the blobhouse files


def lance_cleanup(uri: str) -> None:
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    assert len(lance.dataset(uri).versions()) == 1


def assert_sharing_restored(built: Built) -> None:
    """blobhouse's compaction stores each distinct live payload about once again."""
    stats = open_table(built.uri).stats()
    unique = built.unique_stored_bytes()
    assert stats["rows"] == len(built.live)
    assert stats["physical_bytes"] <= 1.05 * unique, (
        f"physical {stats['physical_bytes']} bytes for {unique} unique live bytes "
        f"({stats['fragments']} fragment(s))"
    )


@pytest.mark.parametrize("order", ["compact_then_cleanup", "cleanup_then_compact"])
def test_lance_maintenance_loses_nothing_and_blobhouse_compact_restores_sharing(built, order):
    steps = [lance_compact, lance_cleanup]
    if order == "cleanup_then_compact":
        steps.reverse()
    for step in steps:
        step(built.uri)
        assert_intact(built)
    # blobhouse gc recognizes Lance-written files and sidecars as referenced
    report = open_table(built.uri).gc(grace=timedelta(0))
    assert report["kept_referenced_files"] > 0
    assert open_table(built.uri).stats()["orphan_files"] == 0
    assert_intact(built)
    # Lance copied every shared payload once per row; blobhouse's compaction shares them again
    assert open_table(built.uri).stats()["physical_bytes"] > 1.05 * built.unique_stored_bytes()
    open_table(built.uri).compact()
    assert_intact(built)
    assert_sharing_restored(built)


def test_blobhouse_compact_then_lance_cleanup_loses_nothing(built):
    report = open_table(built.uri).compact()
    assert report["fragments_removed"] == 4 and report["deleted_rows_dropped"] == 4
    assert_intact(built)
    assert_sharing_restored(built)
    lance_cleanup(built.uri)
    assert_intact(built)
    assert_sharing_restored(built)
    # and Lance compacting blobhouse's compacted table, then cleaning up, still loses nothing
    open_table(built.uri).delete("id < 4")  # 3 of 16 rows: Lance rewrites the fragment
    built.versions[open_table(built.uri).version] = {i: v for i, v in built.live.items() if i >= 4}
    lance_compact_one = lance.dataset(built.uri).optimize.compact_files()
    assert lance_compact_one.fragments_removed == 1
    lance_cleanup(built.uri)
    assert_intact(built)


def test_an_external_blob_stock_lance_wrote_whole_reads_as_stock_lance_reads_it(tmp_path):
    """Lance records a whole external object as position 0, size 0 and reads it whole: so do
    blobhouse's reads, stats and verify (they read it as empty, without an error)."""
    import lance.blob as lance_blob

    media = tmp_path / "media"
    media.mkdir()
    clip = media / "clip.bin"
    clip.write_bytes(os.urandom(7000))
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0], "v": blob_array([b"x"])}), uri, allowed_bases=[str(media)])
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "v": lance_blob.blob_array(
                [lance_blob.Blob(uri=f"file://{clip}"), lance_blob.Blob(uri=f"file://{clip}")]
            ),
        }
    )
    lance.write_dataset(rows, uri, mode="append", allow_external_blob_outside_bases=True)
    assert stock_read(uri, "v")[1:] == [clip.read_bytes()] * 2
    table = open_table(uri)
    assert table.read_blobs("v", [1, 2]) == [clip.read_bytes()] * 2
    assert table.to_arrow(["v"], blobs="bytes").column("v").to_pylist()[2] == clip.read_bytes()
    assert [r["size"] for r in table.blob_refs("v", [1, 2]).to_pylist()] == [7000, 7000]
    assert table.stats()["external_bytes"] == 7000
    assert table.verify(deep=True)["problems"] == []
    clip.unlink()
    with pytest.raises(ExternalBlobError, match="does not exist"):
        open_table(uri).read_blobs("v", [1])
