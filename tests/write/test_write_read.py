"""Round trips: every blob kind, dedup mode and write mode, read back by blobhouse and by stock
pylance, byte for byte."""

from __future__ import annotations

import io
import os

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blobhouse
from blobhouse import (
    Blob,
    Kind,
    PropertyConflictError,
    blob_array,
    blob_field,
    open_table,
    write_table,
)
from blobhouse.dedup import BatchHasher
from blobhouse.files.ranges import REF_TYPE
from tests.helpers import media_file, stock_descriptors, stock_read

PLACEMENT = {"dedicated_size_threshold": 200_000}
SMALL = b"s" * 100
SHARED_SMALL = bytes(range(256)) * 4
MEDIUM = os.urandom(100_000)
LARGE = os.urandom(300_000)


@pytest.fixture
def external(tmp_path):
    return media_file(tmp_path, "clip.bin", 5000)


def sample(external_path: str) -> tuple[pa.Table, list[bytes | None]]:
    """Ten rows covering inline, shared small, packed, dedicated, external, null, empty."""
    with open(external_path, "rb") as f:
        content = f.read()
    values = [
        Blob(data=SMALL),
        Blob(data=SHARED_SMALL, ref_id=5),
        Blob(data=SHARED_SMALL, ref_id=5),
        Blob(data=MEDIUM),
        Blob(data=LARGE, ref_id=9),
        Blob(data=LARGE, ref_id=9),
        Blob(uri=external_path),
        None,
        Blob(data=b""),
        Blob(uri="file://" + external_path, position=100, size=50),
    ]
    expected = [
        SMALL,
        SHARED_SMALL,
        SHARED_SMALL,
        MEDIUM,
        LARGE,
        LARGE,
        content,
        None,
        b"",
        content[100:150],
    ]
    table = pa.table(
        {"id": pa.array(range(10), pa.int64()), "media": blob_array(values)},
        schema=pa.schema([pa.field("id", pa.int64()), blob_field("media", **PLACEMENT)]),
    )
    return table, expected


def write(data, uri, base, **kwargs):
    kwargs.setdefault("allowed_bases", [base])
    kwargs.setdefault("dedup", "content")
    return write_table(data, uri, **kwargs)


@pytest.mark.parametrize("dedup", ["content", "ref_id", "off"])
@pytest.mark.parametrize("mode", ["create", "append", "overwrite"])
def test_every_kind_round_trips_byte_identical(table_uri, external, dedup, mode):
    base, path = external
    data, expected = sample(path)
    if mode == "append":
        write(data, table_uri, base, dedup=dedup)
        table = write_table(data, table_uri, mode="append", dedup=dedup)
        expected = expected * 2
    elif mode == "overwrite":
        other = pa.table({"id": pa.array([99], pa.int64()), "media": blob_array([b"old"])})
        write(other, table_uri, base)
        table = write(data, table_uri, base, mode="overwrite", dedup=dedup)
    else:
        table = write(data, table_uri, base, dedup=dedup)

    assert stock_read(table_uri, "media") == expected
    n = len(expected)
    handles = lance.dataset(table_uri).take_blobs("media", indices=[0, 3, 4, 6, 9])
    assert [h.read() for h in handles] == [expected[i] for i in (0, 3, 4, 6, 9)]
    assert table.read_blobs("media", list(range(n))) == expected
    assert table.to_arrow(blobs="bytes").column("media").to_pylist() == expected
    assert open_table(table_uri).read_blobs("media", [n - 1, 0]) == [expected[-1], expected[0]]
    assert lance.dataset(table_uri).data_storage_version == "2.2"


@pytest.mark.parametrize("dedup", ["content", "ref_id"])
def test_rows_sharing_a_payload_share_one_stored_copy(table_uri, external, dedup):
    base, path = external
    data, _ = sample(path)
    write(data, table_uri, base, dedup=dedup)
    d = stock_descriptors(table_uri, "media")
    kinds = [None if x is None else x["kind"] for x in d]
    assert kinds == [
        Kind.INLINE,
        Kind.PACKED,
        Kind.PACKED,
        Kind.PACKED,
        Kind.DEDICATED,
        Kind.DEDICATED,
        Kind.EXTERNAL,
        None,
        Kind.INLINE,
        Kind.EXTERNAL,
    ]
    assert (d[1]["blob_id"], d[1]["position"]) == (d[2]["blob_id"], d[2]["position"])
    assert d[4]["blob_id"] == d[5]["blob_id"]
    assert d[6]["blob_uri"] == "file://" + os.path.realpath(path)


def test_dedup_off_stores_every_row(table_uri, external):
    base, path = external
    data, _ = sample(path)
    write(data, table_uri, base, dedup="off")
    d = stock_descriptors(table_uri, "media")
    assert d[1]["kind"] == d[2]["kind"] == Kind.INLINE
    assert d[1]["position"] != d[2]["position"]
    assert d[4]["blob_id"] != d[5]["blob_id"]


def test_placement_matches_stock_lance_defaults(table_uri, tmp_path):
    sizes = [0, 65_535, 65_536, 65_537, 4 * 2**20, 4 * 2**20 + 1]
    payloads = [os.urandom(s) for s in sizes]
    write_table(pa.table({"b": blob_array(payloads)}), table_uri, dedup="off")
    stock_uri = str(tmp_path / "stock")
    lance.write_dataset(
        pa.table(
            {"b": lance.blob.blob_array(payloads)}, schema=pa.schema([lance.blob.blob_field("b")])
        ),
        stock_uri,
        data_storage_version="2.2",
    )
    ours = [d["kind"] for d in stock_descriptors(table_uri, "b")]
    theirs = [d["kind"] for d in stock_descriptors(stock_uri, "b")]
    assert ours == theirs == [0, 0, 0, 1, 1, 2]


def test_placement_overrides_per_column_are_kept_with_the_table(table_uri):
    payload = os.urandom(1000)
    schema = pa.schema([blob_field("a", inline_size_threshold=0), blob_field("b")])
    table = write_table(
        pa.table({"a": blob_array([payload]), "b": blob_array([payload])}, schema=schema),
        table_uri,
        dedup="off",
    )
    assert stock_descriptors(table_uri, "a")[0]["kind"] == Kind.PACKED
    assert stock_descriptors(table_uri, "b")[0]["kind"] == Kind.INLINE
    # appends follow the thresholds stored with the table, and stock pylance keeps them too
    write_table(
        pa.table({"a": blob_array([payload]), "b": blob_array([payload])}),
        table_uri,
        mode="append",
        dedup="off",
    )
    assert stock_descriptors(table_uri, "a")[1]["kind"] == Kind.PACKED
    assert table.schema.field("a").metadata[b"lance-encoding:blob-inline-size-threshold"] == b"0"
    # thresholds are the table's properties: a write asking for others is refused, a change
    # of the property applies to later writes
    more = pa.table({"a": blob_array([payload]), "b": blob_array([payload])})
    with pytest.raises(PropertyConflictError, match="dedicated_size_threshold of column 'b'"):
        write_table(
            more, table_uri, mode="append", placement={"b": {"dedicated_size_threshold": 500}}
        )
    open_table(table_uri).set_properties(placement={"b": {"dedicated_size_threshold": 500}})
    write_table(more, table_uri, mode="append")
    assert stock_descriptors(table_uri, "b")[2]["kind"] == Kind.DEDICATED


def test_pack_sidecars_roll_over(table_uri):
    payloads = [os.urandom(70_000) for _ in range(6)]
    write_table(
        pa.table({"b": blob_array(payloads)}),
        table_uri,
        placement={"b": {"pack_file_size_threshold": 150_000}},
        dedup="content",
    )
    d = stock_descriptors(table_uri, "b")
    assert [x["kind"] for x in d] == [Kind.PACKED] * 6
    assert len({x["blob_id"] for x in d}) == 3
    assert stock_read(table_uri, "b") == payloads


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(st.integers(0, 8), min_size=1, max_size=30),
    dedup=st.sampled_from(["content", "off"]),
    batch_rows=st.integers(1, 9),
)
def test_stored_payloads_fill_packs_in_row_order_and_roll_over(
    tmp_path_factory, picks, dedup, batch_rows
):
    """Payloads too big to inline are stored in bulk per run of a batch: each goes to the
    current pack while it fits (a pack over the limit holds one payload), a dedicated
    sidecar above the threshold, and a repeat (content dedup) takes its first copy."""
    uri = str(tmp_path_factory.mktemp("packs") / "t")
    sizes = [0, 500, 1000, 1001, 70_000, 119_999, 120_000, 120_001, 200_000]
    distinct = [os.urandom(size) for size in sizes]
    rows = [distinct[p] for p in picks]
    batches = [
        pa.record_batch({"b": blob_array(rows[i : i + batch_rows])})
        for i in range(0, len(rows), batch_rows)
    ]
    limits = {"inline_size_threshold": 1000, "dedicated_size_threshold": 120_000}
    placement = {"b": {**limits, "pack_file_size_threshold": 150_000}}
    write_table(batches, uri, dedup=dedup, placement=placement)
    assert stock_read(uri, "b") == rows
    described = stock_descriptors(uri, "b")
    packs: dict[int, set[tuple[int, int]]] = {}  # blob_id -> its payloads' ranges
    big: dict[bytes, set[tuple[int, int]]] = {}  # a payload too big to inline -> its copies
    order: dict[int, list[int]] = {}  # blob_id -> positions of big payloads, in row order
    for row, (payload, d) in enumerate(zip(rows, described, strict=True)):
        if len(payload) > 120_000:
            assert d["kind"] == Kind.DEDICATED, row
        elif len(payload) > 1000:
            assert d["kind"] == Kind.PACKED, row
            order.setdefault(d["blob_id"], []).append(d["position"])
        if d["kind"] == Kind.PACKED:
            packs.setdefault(d["blob_id"], set()).add((d["position"], d["size"]))
        if len(payload) > 1000:
            big.setdefault(payload, set()).add((d["blob_id"], d["position"]))
    for blob_id, ranges in packs.items():
        ranges = sorted(ranges)
        ends = [position + size for position, size in ranges]
        assert [position for position, _ in ranges] == [0, *ends[:-1]], blob_id  # no gaps
        assert ends[-1] <= 150_000 or len(ranges) == 1, blob_id
    for blob_id, positions in order.items():  # a repeat (dedup off) is a new, later copy
        firsts = list(dict.fromkeys(positions)) if dedup == "content" else positions
        assert firsts == sorted(firsts), blob_id
    copies = [len(places) for payload, places in big.items()]
    if dedup == "content":
        assert copies == [1] * len(big)
    else:
        assert sum(copies) == sum(len(p) > 1000 for p in rows)


def test_binary_columns_named_as_blob_columns(table_uri):
    payloads = [os.urandom(10), os.urandom(100_000), None]
    data = pa.table(
        {
            "img": pa.array(payloads, pa.binary()),
            "big": pa.array(payloads, pa.large_binary()),
            "plain": pa.array([b"x", b"y", b"z"]),
        }
    )
    table = write_table(data, table_uri, blob_columns=["img", "big"], dedup="content")
    assert table.blob_columns == ["img", "big"]
    assert table.schema.field("plain").type == pa.binary()
    assert stock_read(table_uri, "img") == payloads
    assert stock_read(table_uri, "big") == payloads


def test_ref_id_column_carries_the_ref_ids(table_uri):
    video = [os.urandom(200_000), os.urandom(200_000)]
    rows = [video[0]] * 5 + [video[1]] * 5
    data = pa.table(
        {
            "frame": range(10),
            "video_ref": [1] * 5 + [2] * 5,
            "video": pa.array(rows, pa.large_binary()),
        }
    )
    table = write_table(
        data,
        table_uri,
        blob_columns=["video"],
        dedup="ref_id",
        ref_id_columns={"video": "video_ref"},
    )
    assert stock_read(table_uri, "video") == rows
    stats = table.stats()["columns"]["video"]
    assert stats["physical_bytes"] == 400_000
    assert stats["logical_bytes"] == 2_000_000
    assert table.schema.names == ["frame", "video_ref", "video"]


def test_blob_columns_inside_structs(table_uri):
    image = os.urandom(80_000)
    meta_type = pa.struct(
        [
            pa.field("camera", pa.string()),
            pa.field("image", pa.large_binary()),
            pa.field("thumb", blobhouse.values.LOGICAL_BLOB_TYPE),
        ]
    )
    meta = pa.array(
        [
            {"camera": "left", "image": image, "thumb": {"data": b"t1"}},
            {"camera": "right", "image": image, "thumb": {"data": b"t2"}},
            None,
        ],
        type=meta_type,
    )
    data = pa.table({"id": [1, 2, 3], "meta": meta, "tags": [["a"], [], None]})
    table = write_table(data, table_uri, blob_columns=["meta.image"], dedup="content")
    assert sorted(table.blob_columns) == ["meta.image", "meta.thumb"]
    assert table.read_blobs("meta.image", [0, 1, 2]) == [image, image, None]
    assert table.read_blobs("meta.thumb", [0, 1]) == [b"t1", b"t2"]
    assert stock_read(table_uri, "meta.image") == [image, image, None]
    out = table.to_arrow(blobs="bytes").to_pylist()
    assert out[1]["meta"] == {"camera": "right", "image": image, "thumb": b"t2"}
    assert out[2]["meta"] is None and out[0]["tags"] == ["a"]
    refs = table.to_arrow(columns=["meta"]).column("meta").type.field("image").type
    assert refs == REF_TYPE


def test_references_are_absolute_and_self_contained(table_uri, external):
    base, path = external
    data, expected = sample(path)
    table = write(data, table_uri, base)
    refs = table.blob_refs("media", list(range(10))).to_pylist()
    assert refs[7] is None
    for ref, payload in zip(refs, expected, strict=True):
        if ref is None:
            continue
        assert ref["uri"].startswith("file:///")
        with open(ref["uri"].removeprefix("file://"), "rb") as f:
            f.seek(ref["position"])
            assert f.read(ref["size"]) == payload
    # descriptors mode returns what Lance stores
    kinds = table.to_arrow(blobs="descriptors").column("media").combine_chunks().field("kind")
    assert kinds.to_pylist()[0] == Kind.INLINE


def test_open_blob_is_a_seekable_file(table_uri):
    payload = os.urandom(300_000)
    table = write_table(pa.table({"b": blob_array([payload, None])}), table_uri, dedup="content")
    f = table.open_blob("b", 0)
    assert f.seekable()
    f.seek(1000)
    assert f.read(10) == payload[1000:1010]
    f.seek(-5, io.SEEK_END)
    assert f.read() == payload[-5:]
    assert table.open_blob("b", 1) is None


def test_take_filter_versions_and_delete(table_uri):
    payloads = [os.urandom(1000 * (i + 1)) for i in range(5)]
    table = write_table(
        pa.table({"id": range(5), "b": blob_array(payloads)}), table_uri, dedup="content"
    )
    assert table.take([4, 1], blobs="bytes").to_pylist() == [
        {"id": 4, "b": payloads[4]},
        {"id": 1, "b": payloads[1]},
    ]
    assert table.to_arrow(filter="id >= 3", blobs="bytes").column("b").to_pylist() == payloads[3:]
    v1 = table.version
    table.delete("id = 0")
    assert table.count_rows() == 4
    assert table.read_blobs("b", [0]) == [payloads[1]]
    assert open_table(table_uri, version=v1).read_blobs("b", [0]) == [payloads[0]]
    assert [v["version"] for v in table.versions()] == [v1, v1 + 1]
    with pytest.raises(IndexError, match="out of range"):
        table.take([10])


def test_inputs_of_every_accepted_shape(table_uri, tmp_path):
    import pandas as pd

    batch = pa.record_batch({"b": blob_array([b"one", b"two"])})
    frame = pd.DataFrame({"id": [1, 2], "b": [Blob(data=b"p1"), None]})
    sources = {
        "table": pa.Table.from_batches([batch]),
        "batch": batch,
        "reader": pa.RecordBatchReader.from_batches(batch.schema, [batch]),
        "iterable": iter([batch, batch]),
    }
    for name, source in sources.items():
        uri = str(tmp_path / name)
        write_table(source, uri, dedup="content")
        assert stock_read(uri, "b")[:2] == [b"one", b"two"], name
    uri = str(tmp_path / "pandas")
    write_table(frame, uri, dedup="content")
    assert stock_read(uri, "b") == [b"p1", None]


def test_lance_blob_arrays_are_accepted(table_uri):
    arr = lance.blob.blob_array([b"abc", None])
    write_table(pa.table({"b": arr}), table_uri, dedup="content")
    assert stock_read(table_uri, "b") == [b"abc", None]


def test_empty_create_then_append(table_uri):
    schema = pa.schema([pa.field("id", pa.int64()), blob_field("b")])
    table = write_table(schema.empty_table(), table_uri, dedup="content")
    assert table.count_rows() == 0
    assert table.to_arrow().schema.field("b").type == REF_TYPE
    write_table(
        pa.table({"id": [1], "b": blob_array([b"x"])}, schema=schema),
        table_uri,
        mode="append",
        dedup="content",
    )
    assert stock_read(table_uri, "b") == [b"x"]


def test_stats_by_column_and_kind(table_uri, external):
    base, path = external
    data, _ = sample(path)
    stats = write(data, table_uri, base).stats()
    media = stats["columns"]["media"]
    assert media["kinds"]["packed"]["logical_bytes"] == 2 * len(SHARED_SMALL) + len(MEDIUM)
    assert media["kinds"]["packed"]["physical_bytes"] == len(SHARED_SMALL) + len(MEDIUM)
    assert media["kinds"]["dedicated"]["dedup_ratio"] == 2.0
    assert media["kinds"]["external"]["rows"] == 2
    stored = len(SMALL) + len(SHARED_SMALL) + len(MEDIUM) + len(LARGE)
    assert media["table_owned_bytes"] == stored  # the empty payload takes no byte
    assert media["external_bytes"] == 5000 + 50  # two ranges of one object outside the table
    assert media["physical_bytes"] == stored + 5000 + 50
    assert stats["rows"] == 10


def test_nested_blobs_in_sliced_batches(table_uri):
    images = [os.urandom(70_000) for _ in range(5)]
    meta = pa.array(
        [None if i == 2 else {"image": images[i], "n": i} for i in range(5)],
        type=pa.struct([pa.field("image", pa.large_binary()), pa.field("n", pa.int64())]),
    )
    table = write_table(
        pa.table({"meta": meta}),
        table_uri,
        blob_columns=["meta.image"],
        max_rows_per_file=2,
        dedup="content",
    )
    assert len(table.dataset.get_fragments()) == 3
    expected = [None if i == 2 else images[i] for i in range(5)]
    assert stock_read(table_uri, "meta.image") == expected
    assert [r["meta"] and r["meta"]["n"] for r in table.to_arrow().to_pylist()] == [
        0,
        1,
        None,
        3,
        4,
    ]
    rows = table.take_row_dicts(table.row_ids()[::-1], ["meta"])  # as Python rows, in order
    assert rows == [
        {"meta": None if i == 2 else {"image": images[i], "n": i}} for i in range(4, -1, -1)
    ]


@pytest.mark.parametrize("dedup", ["content", "ref_id", "off"])
def test_a_batch_hashed_and_placed_in_runs_writes_what_one_run_writes(
    tmp_path, external, dedup, monkeypatch
):
    """The pipeline hashes a batch in runs of rows and places each run before hashing the
    next; with every data row its own run (and nulls and URIs between and after them), the
    table reads back the same and shares payloads exactly as with the whole batch in one run."""
    base, path = external
    data, expected = sample(path)
    whole = write(data, str(tmp_path / "whole"), base, dedup=dedup)
    monkeypatch.setattr(blobhouse.write.pipeline, "HASH_RUN_BYTES", 1)
    monkeypatch.setattr(blobhouse.write.pipeline, "MAX_HASH_RUN_BYTES", 1)
    runs = write(data, str(tmp_path / "runs"), base, dedup=dedup)
    assert stock_read(str(tmp_path / "runs"), "media") == expected
    assert runs.read_blobs("media", list(range(len(expected)))) == expected
    assert stock_descriptors(str(tmp_path / "runs"), "media") == stock_descriptors(
        str(tmp_path / "whole"), "media"
    )
    assert runs.stats()["physical_bytes"] == whole.stats()["physical_bytes"]
    assert runs.verify(deep=True)["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "off"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_payloads_placed_in_bulk_write_what_row_by_row_placement_writes(
    tmp_path, dedup, seed, monkeypatch
):
    """Small payloads seen for the first time are placed in bulk (set operations over a run
    of rows). On random mixes of repeats (within a run, across runs, batches and windows),
    nulls, empty payloads and payloads too big to inline, the table is exactly the one
    placing every row by itself writes: same descriptors, physical bytes and checksums."""
    rng = np.random.default_rng(seed)
    repeated = [rng.bytes(int(n)) for n in rng.integers(1, 300, 25)]
    values: list[bytes | None] = []
    for _ in range(700):
        pick = rng.random()
        if pick < 0.05:
            values.append(None)
        elif pick < 0.08:
            values.append(b"")
        elif pick < 0.45:
            values.append(repeated[int(rng.integers(len(repeated)))])
        else:
            values.append(rng.bytes(int(rng.integers(1, 300))))
    data = pa.table({"id": list(range(len(values))), "b": pa.array(values, pa.large_binary())})
    batches = data.to_batches(max_chunksize=45)
    monkeypatch.setattr(blobhouse.write.pipeline, "WINDOW_ROWS", 130)  # several windows
    monkeypatch.setattr(blobhouse.write.pipeline, "HASH_RUN_BYTES", 2_000)  # several runs a batch
    monkeypatch.setattr(blobhouse.write.pipeline, "MAX_HASH_RUN_BYTES", 5_000)
    options = dict(blob_columns=["b"], dedup=dedup, placement={"b": {"inline_size_threshold": 200}})
    bulk = write_table(pa.Table.from_batches(batches), str(tmp_path / "bulk"), **options)
    monkeypatch.setattr(blobhouse.write.pipeline._ColumnPlacer, "_fresh", lambda *_: ([], []))
    by_row = write_table(pa.Table.from_batches(batches), str(tmp_path / "by_row"), **options)

    assert stock_descriptors(str(tmp_path / "bulk"), "b") == stock_descriptors(
        str(tmp_path / "by_row"), "b"
    )
    kinds = {d["kind"] for d in stock_descriptors(str(tmp_path / "bulk"), "b") if d}
    assert kinds == {int(Kind.INLINE), int(Kind.PACKED)}  # both placements were exercised
    assert bulk.read_blobs("b", list(range(len(values)))) == values
    assert bulk.stats()["physical_bytes"] == by_row.stats()["physical_bytes"]
    assert bulk.verify(deep=True)["problems"] == []


def test_hash_runs_grow_while_they_write_nothing_and_start_over_once_they_write(
    tmp_path, monkeypatch
):
    """A run of payloads seen before writes nothing, so there is no write for hashing to
    overlap: the next run is twice as long (up to a cap). A run that writes starts over."""
    sizes = []
    hashes = BatchHasher.hashes

    def hashed(self, payloads, samples, threads=None):
        sizes.append(len(payloads))
        return hashes(self, payloads, samples, threads)

    monkeypatch.setattr(BatchHasher, "hashes", hashed)
    monkeypatch.setattr(blobhouse.write.pipeline, "HASH_RUN_BYTES", 1 << 20)
    monkeypatch.setattr(blobhouse.write.pipeline, "MAX_HASH_RUN_BYTES", 4 << 20)
    rng = np.random.default_rng(5)
    repeated = rng.bytes(256 << 10)  # packed: four make a 1 MiB run
    payloads = [repeated] * 40 + [rng.bytes(256 << 10) for _ in range(20)]
    data = pa.table({"b": pa.array(payloads, pa.large_binary())})
    table = write_table(data, str(tmp_path / "t"), blob_columns=["b"], dedup="content")
    # 1 MiB (the first copy written), then 1, 2, 4 and 4 MiB of copies, then 8 copies and
    # 8 new payloads (2 MiB written): the next run is 1 MiB again
    assert sizes[:6] == [4, 4, 8, 16, 16, 4]
    assert table.read_blobs("b", list(range(60))) == payloads
    assert table.stats()["physical_bytes"] == 21 * (256 << 10)
