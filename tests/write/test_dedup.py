"""Cross-row dedup inside each data file: ref_id (seed 000), content, off."""

from __future__ import annotations

import os
import random

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blobhouse import Blob, Kind, blob_array, write_table
from tests.helpers import disk_bytes, stock_descriptors, stock_read

MB = 1_000_000


def test_seed_scenario_20_rows_one_6mb_payload_with_one_ref_id(table_uri):
    payload = os.urandom(6 * MB)
    rows = [Blob(data=payload, ref_id=42)] * 20
    write_table(pa.table({"id": range(20), "video": blob_array(rows)}), table_uri, dedup="ref_id")
    assert disk_bytes(table_uri) <= 1.05 * 6 * MB
    assert stock_read(table_uri, "video") == [payload] * 20


def test_1000_rows_from_50_distinct_1mb_payloads_content_dedup(table_uri):
    rng = random.Random(7)
    distinct = [rng.randbytes(MB) for _ in range(50)]
    rows = [distinct[i % 50] for i in range(1000)]
    rng.shuffle(rows)
    table = write_table(
        pa.table({"img": pa.array(rows, pa.large_binary())}), table_uri, blob_columns=["img"]
    )
    assert len(table.dataset.get_fragments()) == 1
    assert disk_bytes(table_uri) <= 1.05 * 50 * MB
    assert stock_read(table_uri, "img") == rows
    stats = table.stats()
    assert stats["physical_bytes"] == 50 * MB
    assert stats["dedup_ratio"] == 20.0


def test_without_dedup_every_row_is_stored(table_uri):
    payload = os.urandom(MB)
    write_table(pa.table({"b": blob_array([payload] * 5)}), table_uri, dedup="off")
    assert disk_bytes(table_uri) >= 5 * MB


def test_shared_small_payloads_are_packed_once_never_inlined(table_uri):
    small = os.urandom(500)
    rows = [small, os.urandom(10), small, small]
    write_table(pa.table({"b": blob_array(rows)}), table_uri, dedup="content")
    d = stock_descriptors(table_uri, "b")
    assert [x["kind"] for x in d] == [Kind.PACKED, Kind.INLINE, Kind.PACKED, Kind.PACKED]
    assert len({(x["blob_id"], x["position"]) for x in (d[0], d[2], d[3])}) == 1


def test_small_payload_shared_across_batches_is_packed_once(table_uri):
    small = os.urandom(300)
    batches = [pa.record_batch({"b": blob_array([small, os.urandom(5)])}) for _ in range(4)]
    write_table(batches, table_uri, dedup="content")
    d = stock_descriptors(table_uri, "b")
    shared = [x for i, x in enumerate(d) if i % 2 == 0]
    assert {x["kind"] for x in shared} == {Kind.PACKED}
    assert len({(x["blob_id"], x["position"]) for x in shared}) == 1


def test_ref_id_zero_or_null_means_no_sharing(table_uri):
    a, b = os.urandom(100_000), os.urandom(100_000)
    rows = [Blob(data=a, ref_id=0), Blob(data=b, ref_id=0), Blob(data=a), Blob(data=a, ref_id=3)]
    write_table(pa.table({"b": blob_array(rows)}), table_uri, dedup="ref_id")
    d = stock_descriptors(table_uri, "b")
    assert len({(x["blob_id"], x["position"]) for x in d}) == 4
    assert stock_read(table_uri, "b") == [a, b, a, a]


def test_ref_ids_are_per_column(table_uri):
    a, b = os.urandom(70_000), os.urandom(70_000)
    data = pa.table(
        {"x": blob_array([Blob(data=a, ref_id=1)]), "y": blob_array([Blob(data=b, ref_id=1)])}
    )
    write_table(data, table_uri, dedup="ref_id")
    assert stock_read(table_uri, "x") == [a] and stock_read(table_uri, "y") == [b]


def test_dedup_mode_per_column(table_uri):
    a = os.urandom(100_000)
    data = pa.table({"x": blob_array([a, a]), "y": blob_array([a, a])})
    table = write_table(data, table_uri, dedup={"x": "content", "y": "off"})
    cols = table.stats()["columns"]
    assert cols["x"]["physical_bytes"] == 100_000
    assert cols["y"]["physical_bytes"] == 200_000


def test_files_split_by_rows_and_bytes_keep_dedup_inside_each_file(table_uri, tmp_path):
    payload = os.urandom(100_000)
    table = write_table(
        pa.table({"b": blob_array([payload] * 10)}), table_uri, max_rows_per_file=4, dedup="content"
    )
    assert [f.count_rows() for f in table.dataset.get_fragments()] == [4, 4, 2]
    assert table.stats()["physical_bytes"] == 3 * 100_000
    assert stock_read(table_uri, "b") == [payload] * 10
    uri = str(tmp_path / "by_bytes")
    unique = [os.urandom(100_000) for _ in range(10)]
    by_bytes = write_table(
        iter([pa.record_batch({"b": blob_array([p])}) for p in unique]),
        uri,
        max_bytes_per_file=250_000,
        dedup="content",
    )
    assert len(by_bytes.dataset.get_fragments()) == 4
    assert stock_read(uri, "b") == unique


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 700, 65_536, 65_537, 150_000]), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    dedup=st.sampled_from(["content", "ref_id", "off"]),
    batch_rows=st.integers(1, 7),
)
def test_any_mix_reads_back_and_stores_each_payload_once(
    tmp_path_factory, sizes, picks, dedup, batch_rows
):
    uri = str(tmp_path_factory.mktemp("prop") / "t")
    distinct = [os.urandom(s) for s in sizes]
    chosen = [p % len(distinct) for p in picks]
    rows = [Blob(data=distinct[c], ref_id=c + 1) for c in chosen]
    batches = [
        pa.record_batch({"b": blob_array(rows[i : i + batch_rows])})
        for i in range(0, len(rows), batch_rows)
    ]
    table = write_table(batches, uri, dedup=dedup)
    expected = [distinct[c] for c in chosen]
    assert stock_read(uri, "b") == expected
    assert table.read_blobs("b", list(range(len(rows)))) == expected
    physical = table.stats()["physical_bytes"]
    if dedup == "off":
        assert physical == sum(len(p) for p in expected)
    elif dedup == "ref_id":
        assert physical == sum(len(distinct[c]) for c in set(chosen))
    else:
        assert physical == sum(len(p) for p in {distinct[c] for c in chosen})


def test_same_payload_in_two_columns_is_placed_per_column(table_uri):
    big, small = os.urandom(100_000), os.urandom(100)
    data = pa.table({"x": blob_array([big, small]), "y": blob_array([big, small])})
    table = write_table(data, table_uri, dedup="content")
    for column in ("x", "y"):
        d = stock_descriptors(table_uri, column)
        assert [x["kind"] for x in d] == [Kind.PACKED, Kind.INLINE]
        assert stock_read(table_uri, column) == [big, small]
    assert table.stats()["physical_bytes"] == 2 * (100_000 + 100)


def test_small_payloads_next_to_large_ones_are_stored_at_most_twice(table_uri):
    # ~63 KB images repeated 24 rows apart in rows that also carry 4 MB videos: the placement
    # window (32 MiB) fills with the videos, so an image's copies land in different windows.
    # Each distinct image may cost one inline copy plus one shared copy, never one per row.
    rng = random.Random(3)
    images = [rng.randbytes(63_000) for _ in range(24)]
    rows = 72

    def batches():
        for start in range(0, rows, 4):
            yield pa.record_batch(
                {
                    "image": pa.array(
                        [images[i % 24] for i in range(start, start + 4)], pa.large_binary()
                    ),
                    "video": pa.array(
                        [bytes([i % 256]) * 4 * MB for i in range(start, start + 4)],
                        pa.large_binary(),
                    ),
                }
            )

    schema = pa.schema([("image", pa.large_binary()), ("video", pa.large_binary())])
    table = write_table(
        pa.RecordBatchReader.from_batches(schema, batches()),
        table_uri,
        blob_columns=["image", "video"],
    )
    assert len(table.dataset.get_fragments()) == 1
    image = table.stats()["columns"]["image"]
    assert image["logical_bytes"] == rows * 63_000
    assert image["physical_bytes"] <= 2 * 24 * 63_000
    assert stock_read(table_uri, "image") == [images[i % 24] for i in range(rows)]


def test_batches_of_payloads_are_hashed_across_threads_and_after_a_fork():
    """``content_hashes`` gives each payload's own blake3 whether it spreads the list over
    threads or not, and a forked child (a Spark Python worker) hashes with a pool of its own
    instead of waiting on the parent's threads, which the fork did not copy."""
    import multiprocessing

    from blobhouse.dedup import content_hash, content_hashes

    big = [os.urandom(300_000 + i) for i in range(40)]  # 12 MB: spread over the pool
    small = [os.urandom(i) for i in range(50)]  # 1.2 KB: hashed inline
    assert content_hashes(big) == [content_hash(p) for p in big]
    assert content_hashes(small) == [content_hash(p) for p in small]
    assert content_hashes([]) == []

    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        forked = pool.apply_async(content_hashes, (big,)).get(timeout=60)
    assert forked == [content_hash(p) for p in big]


def _lookalikes(count: int, size: int = 128 * 1024) -> list[bytes]:
    """Payloads of one size that differ only in byte 1, which no sample looks at."""
    return [bytes([0, i]) + bytes(size - 2) for i in range(count)]


def test_a_repeated_payload_takes_its_first_copys_digest_and_a_lookalike_is_hashed():
    """A payload equal to one hashed earlier in the batch (or earlier run) gets that one's
    digest; payloads whose samples are equal but whose bytes differ each get their own."""
    from blobhouse.dedup import BatchHasher, content_hash
    from blobhouse.values import LogicalColumn

    lookalikes = _lookalikes(3)
    unique = [os.urandom(200_000) for _ in range(3)]
    rows = [lookalikes[0], unique[0], lookalikes[1], unique[0], lookalikes[0], lookalikes[2]]
    rows += [unique[1], lookalikes[1], unique[2], b"tiny", unique[1], lookalikes[2]]
    column = LogicalColumn(pa.array(rows, pa.large_binary()), "b")
    samples = column.samples(list(range(len(rows))), min_size=64 * 1024)
    assert samples[0] == samples[2] == samples[5]  # the lookalikes' samples collide
    assert samples[9] is None  # too small to compare
    hasher = BatchHasher()
    digests = []
    for run in (range(0, 4), range(4, 8), range(8, 12)):  # runs of one batch
        payloads = [column.payload(r) for r in run]
        digests += hasher.hashes(payloads, [samples[r] for r in run])
    assert digests == [content_hash(p) for p in rows]


def test_lookalike_payloads_are_stored_apart_and_repeats_once(table_uri):
    """Through a write: payloads that only a full compare tells apart stay distinct, exact
    repeats are stored once, and stock pylance reads back every row's own bytes."""
    from blobhouse import open_table

    lookalikes = _lookalikes(6)
    rows = [lookalikes[i % 6] for i in range(60)] + [lookalikes[5 - i % 6] for i in range(60)]
    table = write_table(
        pa.table({"b": pa.array(rows, pa.large_binary())}), table_uri, blob_columns=["b"]
    )
    assert stock_read(table_uri, "b") == rows
    assert table.stats()["physical_bytes"] == 6 * len(lookalikes[0])
    assert open_table(table_uri).verify(deep=True)["problems"] == []
