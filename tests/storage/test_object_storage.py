"""Every blobhouse feature on an ``s3://`` table, against a real S3-compatible server on
127.0.0.1 (moto's standalone server, started by the ``s3_server`` fixture)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

from blobhouse import (
    Blob,
    BlobRef,
    BlobSession,
    DataFileError,
    ExternalBlobError,
    InvalidInputError,
    RefIdConflictError,
    TableNotFoundError,
    blob_array,
    kept_references,
    open_table,
    read_ranges,
    snapshot,
    write_table,
)
from blobhouse.cache import WeightedLRU
from blobhouse.commit import leases
from blobhouse.dedup import content_hash, digest_matrix
from blobhouse.errors import BlobReadError, StoreError
from blobhouse.files.ranges import READ_THREADS, _balanced_groups, plan_reads
from blobhouse.io.objects import (
    REQUEST_BUDGET,
    SINGLE_PUT_BYTES,
    RemoteStore,
    checked_options,
    object_store,
    put_new,
    read_object,
    remove_folder,
)
from blobhouse.loader import BatchLoader
from blobhouse.store.digest_filter import may_contain, read_filters
from blobhouse.store.index import StoreIndex, indexed_packs
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.index_part import _RUN_ENTRIES, filters_uri, runs_uri
from blobhouse.store.packs import index_uri, retired_packs
from blobhouse.store.sorted_run import read_runs
from blobhouse.table import Table
from blobhouse.testing import LocalS3Server
from blobhouse.write import begin_write
from tests.helpers import synthetic_entries, worker_script

# every test here runs against the local S3 server (those taking no fixture start their own)
pytestmark = pytest.mark.object_store

KIB, MIB = 1024, 1024 * 1024
S3_CRASH_KILLS = int(os.environ.get("BLOBHOUSE_S3_CRASH_KILLS", "3"))
S3_CRASH_SEED = int(os.environ.get("BLOBHOUSE_S3_CRASH_SEED", "9"))
WRITES_BESIDE_GC = int(os.environ.get("BLOBHOUSE_S3_WRITES_BESIDE_GC", "10"))  # per writer


def payload(seed: int, size: int) -> bytes:
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


def rows(n: int = 12) -> pa.Table:
    """Rows with every placement: inline, shared packed, dedicated, and nulls."""
    values = []
    for i in range(n):
        if i % 4 == 0:
            values.append(payload(i, 100))  # inline
        elif i % 4 == 1:
            values.append(payload(1, 300 * KIB))  # packed, shared by every such row
        elif i % 4 == 2:
            values.append(payload(i, 5 * MIB))  # dedicated
        else:
            values.append(None)
    return pa.table({"id": list(range(n)), "media": blob_array(values)})


def stock_blobs(uri: str, options: dict, column: str) -> list[bytes | None]:
    dataset = lance.dataset(uri, storage_options=checked_options(options))
    indices = list(range(dataset.count_rows()))
    return [data for _, data in dataset.read_blobs(column, indices=indices, preserve_order=True)]


# -- storage options ----------------------------------------------------------------------


def test_storage_options_are_checked_and_normalized():
    options = checked_options(
        {"aws_endpoint": "http://127.0.0.1:9", "aws_virtual_hosted_style_request": False}
    )
    assert options == {
        "aws_endpoint": "http://127.0.0.1:9",
        "aws_virtual_hosted_style_request": "false",
        "allow_http": "true",
        **REQUEST_BUDGET,
    }
    assert checked_options({"aws_endpoint": "https://s3.example.com"}) == {
        "aws_endpoint": "https://s3.example.com",
        **REQUEST_BUDGET,
    }
    assert checked_options({}) is None and checked_options(None) is None
    with pytest.raises(InvalidInputError, match=r"127\.0\.0\.1:9000.*scheme"):
        checked_options({"aws_endpoint": "127.0.0.1:9000"})
    with pytest.raises(InvalidInputError, match="allow_http"):
        checked_options({"aws_endpoint": "http://127.0.0.1:9", "allow_http": False})
    with pytest.raises(InvalidInputError, match="'aws_region'"):
        checked_options({"aws_region": ["us-east-1"]})


def test_a_bad_endpoint_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(InvalidInputError, match="scheme"):
        write_table(rows(4), "s3://bucket/t", storage_options={"aws_endpoint": "localhost:1"})


# -- write and read -----------------------------------------------------------------------


def test_a_missing_bucket_is_named_and_not_masked_by_cleanup(s3):
    for data in ([b"x"], [payload(1, 300 * KIB)]):
        with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket/t.*NoSuchBucket"):
            write_table(
                pa.table({"b": blob_array(data)}),
                "s3://no-such-bucket/t",
                storage_options=s3.options,
            )
    with pytest.raises(TableNotFoundError, match=r"no-such-bucket.*NoSuchBucket"):
        open_table("s3://no-such-bucket/t", storage_options=s3.options)
    missing = BlobRef("s3://no-such-bucket/x", 0, 10)
    with pytest.raises(BlobReadError, match=r"missing object s3://no-such-bucket/x \(.*Bucket"):
        read_ranges([missing], storage_options=s3.options)


def test_a_missing_data_file_is_named_on_every_store(bucket):
    """As on a local disk: a read of a table whose data file is gone names the file, not
    Lance's raw "Not found" (`test_every_read_of_a_damaged_data_file_names_it`)."""
    uri = f"{bucket.uri}/t"
    for start in (0, 100):
        rows = range(start, start + 100)
        data = pa.table({"id": list(rows), "b": blob_array([b"x%d" % i * 50 for i in rows])})
        mode = "append" if start else "create"
        write_table(data, uri, mode=mode, storage_options=bucket.options)
    second = open_table(uri, storage_options=bucket.options).snapshot.dataset.get_fragments()[1]
    gone = f"{uri}/data/{second.metadata.files[0].path}"
    object_store(gone, bucket.options).delete(gone)
    table = open_table(uri, storage_options=bucket.options)
    for read in (table.to_arrow, lambda: table.take([150], blobs="bytes"), table.stats):
        with pytest.raises(DataFileError, match=r"data file .* is missing; its rows cannot be"):
            read()
    assert table.take([50], blobs="bytes")["b"].to_pylist() == [b"x50" * 50]  # the rest reads


@pytest.mark.parametrize("where", ["s3", "azure"])
def test_a_new_table_is_not_mixed_into_a_prefix_of_other_objects(where, request):
    """As a local folder: a prefix holding a user's objects (in ``data/`` too) gets no new
    table beside them unless asked, and gc leaves them alone in the table made there anyway."""
    place = request.getfixturevalue(where)
    uri, options = f"{place.uri}/project", place.options
    store = object_store(uri, options)
    users = {"data/cat.jpg": b"jpeg", "notes.txt": b"mine"}
    for name, data in users.items():
        store.put(f"{uri}/{name}", data)
    with pytest.raises(InvalidInputError, match=r"folder of other files .*data/cat\.jpg"):
        write_table(rows(4), uri, storage_options=options)
    assert {o.name for o in store.list(uri)} == set(users)
    table = write_table(rows(4), uri, storage_options=options, allow_nonempty_folder=True)
    time.sleep(1.1)  # object ages are whole seconds on S3
    report = table.gc(grace=timedelta(0))
    assert report["foreign_files"] == [f"{uri}/data/cat.jpg"]
    assert report["removed_files"] == 0
    assert {n: read_object(f"{uri}/{n}", options) for n in users} == users
    assert open_table(uri, storage_options=options).verify()["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_store_that_goes_away_mid_write_fails_it_with_the_writes_own_error(dedup):
    """The store is down for the cleanup too: its failure is noted on the write's error, never
    raised in its place (users saw "cannot stat .../aborted-write-..." instead of the write's)."""
    server = LocalS3Server().__enter__()
    server.bucket("gone-midway")
    # no retries: which error is raised is the point, not the ~15 s of backoff before it
    options = {**server.options, "allow_http": "true", "client_max_retries": 0}

    def batches():
        for i in range(4):
            if i == 2:
                server.__exit__(None, None, None)
            yield from rows(4).to_batches()

    reader = pa.RecordBatchReader.from_batches(rows(1).schema, batches())
    with pytest.raises(StoreError, match=r"cannot .* s3://gone-midway/t") as raised:
        write_table(reader, "s3://gone-midway/t", storage_options=options, dedup=dedup)
    assert "aborted-" not in str(raised.value)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "cleaning up" in notes and "gc" in notes


def test_a_store_that_goes_away_fails_reads_with_a_store_error_naming_it():
    """Reads of a table whose store went away: a StoreError naming the table or the object
    and the read, said once (users saw a raw ``OSError: LanceError(IO)`` from read_blobs, and
    "cannot read X: cannot read X:" from read_ranges)."""
    with LocalS3Server() as server:
        server.bucket("gone-later")
        options = {**server.options, "allow_http": "true", "client_max_retries": 0}
        table = write_table(rows(4), "s3://gone-later/t", storage_options=options)
        refs = [BlobRef(**r) for r in table.blob_refs("media", [1]).to_pylist()]
        loader = BatchLoader(table, batch_size=2, columns=["media"])
    # blob_refs took the row's descriptor before the store went, but a fragment's first take
    # keeps nothing (reads from kept descriptors: the test below): each read fails on Lance's
    # take of the descriptor, naming the table and the read
    for read in (
        lambda: table.read_blobs("media", [1]),
        lambda: table.take([1], columns=["media"], blobs="bytes"),
    ):
        with pytest.raises(StoreError, match=r"^cannot read blobs of s3://gone-later/t: ") as e:
            read()
        assert str(e.value).count("cannot") == 1
    with pytest.raises(StoreError, match=r"cannot read s3://gone-later/t/(data|_blobs)/") as raised:
        read_ranges(refs, storage_options=options)
    assert isinstance(raised.value, BlobReadError) and str(raised.value).count("cannot") == 1
    with pytest.raises(StoreError, match=r"s3://gone-later/t"):
        next(iter(loader))


def test_a_store_that_goes_away_fails_kept_reads_with_a_store_error(monkeypatch):
    """Reads from kept references (no Lance take) of a store that went away: a StoreError
    naming the row, fast (the row's name made it a plain BlobReadError, "missing or short")."""
    monkeypatch.setattr(kept_references, "KEEP_TAKE_SECONDS", 0.0)
    monkeypatch.setattr(kept_references, "LOAD_SECONDS_PER_ROW", 0.0)
    with LocalS3Server() as server:
        server.bucket("gone-kept")
        options = {**server.options, "allow_http": "true"}
        write_table(rows(8), "s3://gone-kept/t", storage_options=options, dedup="content")
        table = open_table("s3://gone-kept/t", storage_options=options)
        table.read_blobs("media", [0])
        ids = table.row_ids()
        table.take_rows(ids[:1], ["media"], "bytes")
        assert table.snapshot._kept  # what follows reads no descriptor from the store
    reads = {
        "read_blobs": lambda: table.read_blobs("media", [1]),
        "take": lambda: table.take([2], columns=["media"], blobs="bytes"),
        "take_rows": lambda: table.take_rows(ids[5:6], ["media"], "bytes"),
    }
    for name, read in reads.items():
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"blob column 'media', fragment 0 row \d+: ") as e:
            read()
        assert isinstance(e.value, BlobReadError), name
        assert time.monotonic() - started < 30, name


def test_a_store_that_goes_away_fails_changes_and_services_with_a_store_error():
    """Every change and service of a table whose store went away: a StoreError naming the
    table (users saw raw ``OSError``/``ArrowInvalid: LanceError(IO)``, and an update's
    condition called "not valid SQL")."""
    with LocalS3Server() as server:
        server.bucket("gone-later")
        options = {**server.options, "allow_http": "true", "client_max_retries": 0}
        table = write_table(rows(4), "s3://gone-later/t", storage_options=options)
    more = pa.table({"id": pa.array([9], pa.int64()), "media": blob_array([b"nine"])})
    calls = {
        "verify": lambda: table.verify(),
        "deep verify": lambda: table.verify(deep=True),
        "stats": lambda: table.stats(),
        "compact": lambda: table.maintenance.compact(),
        "gc": lambda: table.gc(grace=timedelta(0)),
        "update": lambda: table.update({"id": "id + 1"}, where="id > 1"),
        "merge_insert": lambda: (
            table.merge_insert("id").when_not_matched_insert_all().execute(more)
        ),
        "add_columns": lambda: table.add_columns({"double": "id * 2"}),
        "delete": lambda: table.delete("id = 1"),
        "append": lambda: write_table(more, table.uri, mode="append", storage_options=options),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError, match=r"s3://gone-later/t") as raised:
            call()
        assert "not valid SQL" not in str(raised.value), (name, raised.value)


def test_write_and_read_every_placement_on_s3(s3):
    uri = f"{s3.uri}/tables/t"
    data = rows()
    table = write_table(data, uri, storage_options=s3.options, dedup="content")
    expected = data.column("media").to_pylist()
    expected = [None if v is None else v["data"] for v in expected]

    # stock pylance reads what we wrote, byte for byte
    assert stock_blobs(uri, s3.options, "media") == expected
    opened = open_table(uri, storage_options=s3.options)
    assert opened.read_blobs("media", range(len(expected))) == expected
    as_bytes = opened.to_arrow(blobs="bytes").column("media").to_pylist()
    assert as_bytes == expected
    refs = opened.to_arrow().column("media").to_pylist()
    assert (
        read_ranges([None if r is None else BlobRef(**r) for r in refs], storage_options=s3.options)
        == expected
    )
    sidecar = refs[2]["uri"].removeprefix(f"{s3.uri}/")  # the object blob 2 is in
    before = s3.gets(sidecar)
    with opened.open_blob("media", 2) as f:  # 5 MiB: one GET to read it all
        assert f.read() == expected[2]
    assert s3.gets(sidecar) - before == 1
    with opened.open_blob("media", 2) as f:
        f.seek(1000)
        assert f.read(10) == expected[2][1000:1010]
        assert f.read(10) == expected[2][1010:1020]  # from the buffer
    assert s3.gets(sidecar) - before == 2

    # the shared payload is stored once; nothing but the table's own objects in the bucket
    keys = s3.objects("tables/t/")
    sidecars = {k: v for k, v in keys.items() if k.endswith(".blob")}
    assert sorted(sidecars.values()) == sorted([300 * KIB] + [5 * MIB] * 3)
    assert not any(k.endswith("/") for k in keys), "no directory markers"
    assert table.stats()["orphan_files"] == 0


def test_append_dedups_by_ref_id_and_content_on_every_store(bucket):
    uri = f"{bucket.uri}/t"
    chunk = payload(7, 200 * KIB)
    frames = pa.table(
        {
            "frame": list(range(30)),
            "chunk": [i // 10 + 1 for i in range(30)],  # ref_ids are positive
            "video": [payload(i // 10, 200 * KIB) for i in range(30)],
        }
    )
    write_table(
        frames,
        uri,
        blob_columns=["video"],
        dedup="ref_id",
        ref_id_columns={"video": "chunk"},
        storage_options=bucket.options,
    )
    table = write_table(
        pa.table({"frame": [99], "chunk": [9], "video": [chunk]}),
        uri,
        mode="append",
        storage_options=bucket.options,
    )
    assert table.count_rows() == 31
    stored = sum(v for k, v in bucket.objects("t/data/").items() if k.endswith(".blob"))
    assert stored == 4 * 200 * KIB
    assert stock_blobs(uri, bucket.options, "video")[::10] == [
        payload(0, 200 * KIB),
        payload(1, 200 * KIB),
        payload(2, 200 * KIB),
        chunk,
    ]


def test_a_failed_write_on_s3_leaves_the_table_and_the_bucket_as_they_were(s3):
    uri = f"{s3.uri}/t"
    options = {"blob_columns": ["media"], "dedup": "ref_id", "ref_id_columns": {"media": "ref"}}
    first = pa.table({"media": [payload(0, 100 * KIB)], "ref": [1]})
    write_table(first, uri, storage_options=s3.options, **options)
    before = s3.objects()
    # the conflict shows at row 1, after row 0's payload went into a sidecar upload
    bad = pa.table({"media": [payload(1, 9 * MIB), payload(2, 9 * MIB)], "ref": [5, 5]})
    with pytest.raises(RefIdConflictError, match="row 1"):
        write_table(bad, uri, mode="append", storage_options=s3.options, **options)
    after = s3.objects()
    assert open_table(uri, storage_options=s3.options).count_rows() == 1
    assert {k for k in after if "/_leases/" not in k} == {k for k in before if "/_leases/" not in k}
    assert s3.uploads() == []


@pytest.mark.parametrize(("dedup", "folder"), [("global", "_blobs/packs/"), ("off", "data/")])
def test_a_failed_write_aborts_its_open_upload_rather_than_completing_it(s3, dedup, folder):
    """A pack past one PUT's size is a multipart upload: the source failing mid-write aborts
    it (one POST starts it; completing it would be a second, then a DELETE)."""
    uri = f"{s3.uri}/t"
    write_table(
        pa.table({"media": blob_array([b"first"])}), uri, dedup=dedup, storage_options=s3.options
    )
    schema = pa.schema([("media", blob_array([b""]).type)])

    def batches():
        for n in range(3):
            yield pa.record_batch(
                [blob_array([payload(n * 40 + i, 300 * KIB) for i in range(40)])], schema=schema
            )
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        write_table(
            pa.RecordBatchReader.from_batches(schema, batches()),
            uri,
            mode="append",
            dedup=dedup,
            storage_options=s3.options,
        )
    sent = s3.server.requests(f"/{s3.name}/t/{folder}")
    # how many parts went out before the failure depends on timing (one on a loaded machine)
    assert sent.get("POST") == 1 and sent.get("PUT", 0) >= 1, sent
    assert s3.uploads() == []  # aborted, not left open
    assert open_table(uri, storage_options=s3.options).count_rows() == 1


def test_external_blobs_under_a_base_on_every_store(bucket):
    media = f"{bucket.uri}/media"
    bucket.put("media/clip.bin", payload(3, 1 * MIB))
    clips = [Blob(uri=f"{media}/clip.bin"), Blob(uri=f"{media}/clip.bin", position=10, size=20)]
    table = write_table(
        pa.table({"clip": blob_array(clips)}),
        f"{bucket.uri}/t",
        allowed_bases=[media],
        storage_options=bucket.options,
    )
    assert table.read_blobs("clip", [0, 1]) == [payload(3, 1 * MIB), payload(3, 1 * MIB)[10:30]]
    with pytest.raises(ExternalBlobError, match=r"missing\.bin"):
        write_table(
            pa.table({"clip": blob_array([Blob(uri=f"{media}/missing.bin")])}),
            f"{bucket.uri}/t",
            mode="append",
            storage_options=bucket.options,
        )


def test_managed_objects_on_every_store_are_deleted_only_once_unreferenced(bucket):
    """Managed external objects on an object store: gc deletes the one no retained version
    references (after retiring and dooming it), never an unmanaged one."""
    owned, shared = f"{bucket.uri}/owned", f"{bucket.uri}/shared"
    for key in ("owned/0.bin", "owned/1.bin", "shared/0.bin"):
        bucket.put(key, payload(len(key), 50 * KIB))
    values = [Blob(uri=f"{owned}/0.bin"), Blob(uri=f"{owned}/1.bin"), Blob(uri=f"{shared}/0.bin")]
    uri = f"{bucket.uri}/t"
    table = write_table(
        pa.table({"id": [0, 1, 2], "clip": blob_array(values)}),
        uri,
        allowed_bases=[shared],
        managed_bases=[owned],
        storage_options=bucket.options,
    )
    table.delete("id != 1")  # owned/0.bin and shared/0.bin are no longer referenced
    removed = []
    for _ in range(3):  # retire, doom, delete
        time.sleep(1.1)  # S3 times are whole seconds
        report = open_table(uri, storage_options=bucket.options).gc(
            retain_versions=1, grace=timedelta(0)
        )
        removed += report["managed"]["paths"]
    assert removed == [f"{owned}/0.bin"]
    left = bucket.objects()
    assert "owned/0.bin" not in left and {"owned/1.bin", "shared/0.bin"} <= set(left)
    # the owner markers: the kept object's names the table, the deleted one's went with it
    assert "owned/.blobhouse-owner/0.bin.json" not in left
    assert json.loads(bucket.get("owned/.blobhouse-owner/1.bin.json"))["table"] == uri
    again = open_table(uri, storage_options=bucket.options)
    assert again.read_blobs("clip", [0]) == [payload(len("owned/1.bin"), 50 * KIB)]
    assert again.verify()["problems"] == []


def test_a_synced_copy_borrows_its_originals_managed_objects_on_every_store(bucket):
    """A copy made by a bucket sync and relocated borrows the managed objects its original
    owns: the original's gc keeps them while the copy exists, and reaps them once the copy's
    gc gave them back (docs/managed-objects.md)."""
    owned = f"{bucket.uri}/owned"
    bucket.put("owned/0.bin", payload(3, 50 * KIB))
    uri, copy = f"{bucket.uri}/t", f"{bucket.uri}/copy"
    data = pa.table({"id": [0, 1], "clip": blob_array([Blob(uri=f"{owned}/0.bin"), b"x"])})
    write_table(data, uri, managed_bases=[owned], storage_options=bucket.options)
    for key in bucket.objects("t/"):  # what a bucket sync does: every object, another key
        bucket.put(f"copy/{key.removeprefix('t/')}", bucket.get(key))
    open_table(copy, storage_options=bucket.options).relocate()
    open_table(uri, storage_options=bucket.options).delete("id = 0")

    def gc(table: str) -> dict:
        time.sleep(1.1)  # the stores' times are whole seconds
        opened = open_table(table, storage_options=bucket.options)
        return opened.gc(retain_versions=1, grace=timedelta(0))["managed"]

    reports = [gc(uri) for _ in range(3)]  # retire, doom, and keep: borrowed
    assert reports[-1]["kept_borrowed"] == 1 and "owned/0.bin" in bucket.objects("owned/")
    again = open_table(copy, storage_options=bucket.options)
    assert again.read_blobs("clip", [0]) == [payload(3, 50 * KIB)]
    again.delete("id = 0")
    assert gc(copy)["given_back"] == 1
    assert gc(uri)["removed"] == 1 and "owned/0.bin" not in bucket.objects("owned/")


def test_schema_changes_on_every_store(bucket):
    uri = f"{bucket.uri}/t"
    data = pa.table({"id": list(range(4)), "label": list("abcd"), "media": rows(4)["media"]})
    table = write_table(data, uri, storage_options=bucket.options)
    table.add_columns({"double": "id * 2"})
    table.alter_columns({"path": "label", "name": "tag"}, {"path": "id", "data_type": pa.int32()})
    table.drop_columns(["double"])
    table.backfill_blob_column("thumb", lambda batch: [b"t%d" % i for i in batch["id"].to_pylist()])
    write_table(
        pa.table({"id": pa.array([9], pa.int32()), "media": blob_array([b"new"])}),
        uri,
        mode="append",
        storage_options=bucket.options,
    )
    got = open_table(uri, storage_options=bucket.options).to_arrow(blobs="bytes").to_pylist()
    assert [r["id"] for r in got] == [0, 1, 2, 3, 9]
    assert [r["tag"] for r in got] == ["a", "b", "c", "d", None]
    assert [r["thumb"] for r in got] == [b"t0", b"t1", b"t2", b"t3", None]
    written = [v["data"] if v else None for v in rows(4)["media"].to_pylist()]
    assert [r["media"] for r in got] == [*written, b"new"]
    assert stock_blobs(uri, bucket.options, "media")[1] == payload(1, 300 * KIB)


def test_services_walk_a_versions_fragments_a_run_at_a_time_on_every_store(bucket, monkeypatch):
    """Each run of FRAGMENTS_PER_DATASET fragments (here 2) is read through the version opened
    again on the store, with the table's storage options: stats, verify, a merge, compaction
    and gc find every row as one pass would."""
    monkeypatch.setattr(snapshot, "FRAGMENTS_PER_DATASET", 2)
    uri, options = f"{bucket.uri}/t", bucket.options
    payloads = [payload(i, 100 * KIB + i) for i in range(10)]
    for i in range(5):
        ids = [2 * i, 2 * i + 1]
        data = pa.table({"id": ids, "media": blob_array([payloads[j] for j in ids])})
        write_table(data, uri, mode="append", storage_options=options)
    table = open_table(uri, storage_options=options)
    table.delete("id = 3")
    source = pa.table({"id": [8, 10], "media": blob_array([payloads[0], b"new"])})
    merge = table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    merged = merge.execute(source)
    assert (merged.num_updated_rows, merged.num_inserted_rows) == (1, 1)
    expected = {i: p for i, p in enumerate(payloads) if i != 3} | {8: payloads[0], 10: b"new"}
    assert table.stats()["logical_bytes"] == sum(map(len, expected.values()))
    assert table.verify(deep=True)["problems"] == []
    report = table.compact()
    assert (report["fragments_removed"], report["fragments_added"]) == (6, 1)
    table.gc(older_than=timedelta(0), grace=timedelta(0), retain_versions=1)
    after = open_table(uri, storage_options=options)
    got = {r["id"]: r["media"] for r in after.to_arrow(blobs="bytes").to_pylist()}
    assert got == expected and after.verify(deep=True)["problems"] == []


# -- the object store layer -----------------------------------------------------------------


def test_new_objects_never_replace_existing_ones(bucket):
    """Small objects are one conditional PUT; a big one is refused when its name is taken as
    it grows past a single PUT, and otherwise uploaded in parts: either way an existing object
    stays, and no unfinished upload is left (an aborted one is aborted)."""
    store = object_store(bucket.uri, checked_options(bucket.options))
    small, big, fresh = (f"{bucket.uri}/{n}" for n in ("small", "big", "fresh"))
    store.put(small, b"first")
    with pytest.raises(FileExistsError, match="small"):
        new = store.create(small)
        new.write(b"second")
        new.close()
    assert read_object(small, bucket.options) == b"first"

    store.put(big, b"first")
    new = store.create(big)
    with pytest.raises(FileExistsError, match="big"):
        new.write(payload(1, SINGLE_PUT_BYTES + 1))  # past a single PUT: its name is checked
        new.close()
    assert read_object(big, bucket.options) == b"first"

    new = store.create(fresh)
    new.write(payload(1, 9 * MIB))
    new.write(payload(2, 1 * MIB))
    new.close()
    assert read_object(fresh, bucket.options) == payload(1, 9 * MIB) + payload(2, 1 * MIB)

    aborted = store.create(f"{bucket.uri}/aborted")
    aborted.write(payload(1, 9 * MIB))
    aborted.abort()
    assert sorted(o.name for o in store.list(bucket.uri)) == ["big", "fresh", "small"]
    if hasattr(bucket, "uploads"):  # S3's unfinished multipart uploads
        assert bucket.uploads() == []


@pytest.mark.parametrize("where", ["local", "s3", "azure"])
def test_many_chunks_written_at_once_arrive_in_order(where, request, tmp_path):
    """``write_many`` (a sidecar's run of payloads) on every store: more chunks than one system
    call takes (a local file's writev), empty ones among them, before and after a single
    write, and past a single PUT on an object store."""
    root = tmp_path.as_uri() if where == "local" else request.getfixturevalue(where).uri
    options = None if where == "local" else request.getfixturevalue(where).options
    store = object_store(root, checked_options(options) if options else None)
    chunks = [payload(i, (i * 37) % 9000) for i in range(3_000)]  # 13 MB, some empty
    uri = f"{root}/many"
    new = store.create(uri, fresh=True)
    new.write(b"head")
    new.write_many([memoryview(c) for c in chunks])
    new.write_many([])
    new.write(b"tail")
    new.close()
    assert read_object(uri, options) == b"head" + b"".join(chunks) + b"tail"


def test_short_writes_of_a_local_file_are_resumed_where_they_stopped(tmp_path, monkeypatch):
    """A writev the kernel cuts short (a signal, a full disk about to report it) resumes
    inside the chunk it stopped in; here every call writes at most 1,000 bytes."""
    real = os.writev

    def short(fd: int, buffers: list) -> int:
        data = b"".join(bytes(b) for b in buffers)[:1000]
        return real(fd, [data])

    chunks = [payload(i, 700 + i) for i in range(50)]
    new = object_store(tmp_path.as_uri()).create(f"{tmp_path.as_uri()}/short", fresh=True)
    monkeypatch.setattr(os, "writev", short)
    new.write_many(chunks)
    monkeypatch.undo()
    new.close()
    assert (tmp_path / "short").read_bytes() == b"".join(chunks)


def test_racing_creators_of_a_big_object_one_wins_whole(bucket):
    """Two writers of one big name (which blobhouse never makes: big objects have random
    names): one object, whole, from one of them, and nothing else. Small ones race atomically
    (test_of_racing_creators_exactly_one_wins_on_azure, the claims' tests); a big one's name is
    checked before its multipart upload, which cannot be conditional, so both may succeed (or
    the store fail the loser: Azure's block lists clash)."""
    store = object_store(bucket.uri, checked_options(bucket.options))
    uri = f"{bucket.uri}/raced"
    bodies = [payload(n, SINGLE_PUT_BYTES + 3 * MIB) for n in (1, 2)]
    won: list[bool | OSError] = []

    def create(body: bytes) -> None:
        try:
            won.append(put_new(store, uri, body))
        except OSError as lost:  # a StoreError naming the object
            assert "raced" in str(lost)
            won.append(lost)

    threads = [threading.Thread(target=create, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert True in won
    assert read_object(uri, bucket.options) in bodies
    assert [o.name for o in store.list(bucket.uri)] == ["raced"]


def test_session_sidecars_refuse_to_overwrite_on_s3(s3):
    options = checked_options(s3.options)
    # the session checks its options too: a boolean is what Lance would refuse
    session = BlobSession(f"{s3.uri}/t/data/f.lance", {**s3.options, "allow_http": True})
    pack = session.new_packed()
    pack.write_blob(b"abc")
    pack.finish()
    key = f"t/data/f/{session.sidecars[0].rsplit('/', 1)[1]}"
    assert s3.get(key) == b"abc"
    other = BlobSession(f"{s3.uri}/t/data/f.lance", options)
    other._taken = set()  # pretend it did not see the existing sidecar
    with pytest.raises(FileExistsError):
        other.new_packed().finish()
    assert s3.get(key) == b"abc"


def test_ranged_reads_on_s3_send_one_get_per_coalesced_range(s3):
    options = checked_options(s3.options)
    for name in ("a", "b", "c"):
        s3.put(name, payload(ord(name), 2 * MIB))
    refs = [BlobRef(f"{s3.uri}/a", i * 1000, 500) for i in range(50)]  # 500 B gaps: one read
    refs += [BlobRef(f"{s3.uri}/b", 0, 10), BlobRef(f"{s3.uri}/b", MIB, 10)]  # far apart: two
    refs += [BlobRef(f"{s3.uri}/c", 5, 5)] * 3  # the same range three times: one
    store = object_store(s3.uri, options)
    assert len(plan_reads(refs, store.coalesce_gap)) == 4
    before = s3.gets()
    got = read_ranges(refs, storage_options=options)
    assert s3.gets() - before == 4
    # on a store every read gets its own thread (up to 16); locally small reads share one
    reads = plan_reads([BlobRef(f"{s3.uri}/{i}", 0, 10) for i in range(20)], store.coalesce_gap)
    assert len(_balanced_groups(reads, READ_THREADS, store.parallel_min_bytes)) == READ_THREADS
    assert len(_balanced_groups(reads, READ_THREADS, object_store("/x").parallel_min_bytes)) == 1
    for ref, data in zip(refs, got, strict=True):
        name = ref.uri.rsplit("/", 1)[1]
        assert data == payload(ord(name), 2 * MIB)[ref.position : ref.end]


def test_reading_a_missing_or_short_s3_object_names_it(s3):
    options = checked_options(s3.options)
    s3.put("short", b"0123456789")
    with pytest.raises(OSError, match=r"missing object .*/nothing"):
        read_ranges([BlobRef(f"{s3.uri}/nothing", 0, 5)], storage_options=options)
    with pytest.raises(OSError, match=r"short read from .*/short"):
        read_ranges([BlobRef(f"{s3.uri}/short", 5, 10)], storage_options=options)


def test_the_store_layer_on_the_s3_server(s3):
    """The operations blobhouse's own objects need, on S3 (obstore), as Lance is configured."""
    store = object_store(s3.uri, checked_options(s3.options))
    assert isinstance(store, RemoteStore)
    store.put(f"{s3.uri}/x/one", b"12345")
    assert store.size(f"{s3.uri}/x/one") == 5 and store.size(f"{s3.uri}/x/two") is None
    assert put_new(store, f"{s3.uri}/x/one", b"other") is False  # a conditional PUT lost
    new = store.create(f"{s3.uri}/x/two")
    new.write(b"abc")
    new.close()
    for key in ("x/", "x/folder/", "x/folder/empty", "x/zero"):  # other tools' folder markers
        s3.put(key, b"")
    assert [(o.name, o.size) for o in sorted(store.list(f"{s3.uri}/x"), key=str)] == [
        ("folder/empty", 0),
        ("one", 5),
        ("two", 3),
        ("zero", 0),
    ]
    for key in ("x/", "x/folder/", "x/folder/empty", "x/zero"):
        s3.client.delete_object(Bucket=s3.name, Key=key)
    source = store.open(f"{s3.uri}/x/one")
    # ranged reads; past the end they give what there is, as a file does
    assert (source.read(1, 3), source.read(3, 10), source.read(9, 3)) == (b"234", b"45", b"")
    source.close()
    store.delete(f"{s3.uri}/x/one")
    store.delete(f"{s3.uri}/x/one")  # deleting what is gone is no error
    assert s3.get("x/two") == b"abc" and "x/one" not in s3.objects()
    with pytest.raises(FileNotFoundError, match="x/one"):
        store.open(f"{s3.uri}/x/one").read(0, 1)


# -- table services -------------------------------------------------------------------------


def test_gc_on_every_store_sweeps_leftovers_by_age_and_keeps_every_referenced_byte(bucket):
    uri = f"{bucket.uri}/t"
    table = write_table(rows(8), uri, storage_options=bucket.options)
    expected = table.read_blobs("media", range(8))
    # leftovers of a write that never committed (named as blobhouse names a write's files)
    dead = "write-0123456789ab-" + "0" * 32
    bucket.put(f"t/data/{dead}.lance", b"x" * 100)
    bucket.put(f"t/data/{dead}/00000000000000000000000000000001.blob", b"y" * 200)
    bucket.put(f"t/_blobs/packs/{dead}.pack", b"p" * 500)
    live = f"t/_blobs/packs/live-42{'0' * 32}.pack"  # a pack of a write still running
    bucket.put(live, b"l" * 600)
    young = table.gc()  # default grace: a day
    assert young["removed_files"] == 0 and young["kept_young_files"] == 4
    assert young["foreign_files"] == []
    time.sleep(1.1)  # S3 times are whole seconds: objects of the current one are kept
    with leases.held(table.uri, "live-42", table.storage_options):
        report = table.gc(grace=timedelta(0))
    assert report["removed_files"] == 3 and report["reclaimed_bytes"] == 800
    assert report["kept_leased_files"] == 1 and live in bucket.objects()
    assert not any(dead in k for k in bucket.objects())
    assert open_table(uri, storage_options=bucket.options).read_blobs("media", range(8)) == expected
    assert table.verify(deep=True)["problems"] == []


def test_gc_on_every_store_keeps_the_files_of_a_running_write(bucket):
    uri = f"{bucket.uri}/t"
    write_table(rows(4), uri, storage_options=bucket.options)
    data = rows(4)
    write = begin_write(
        uri, data.schema, mode="append", storage_options=bucket.options, in_tasks=True
    )
    written = write.plan.write(data.to_batches())  # staged, lease touched, not committed
    time.sleep(1.1)  # older than the grace below, by the store's whole-second clock
    with leases.held(
        write.transaction.location.root,
        write.transaction.name_prefix,
        write.transaction.storage_options,
    ):
        report = open_table(uri, storage_options=bucket.options).gc(grace=timedelta(0))
    assert report["removed_files"] == 0
    table = Table(write.commit(written).snapshot)
    assert table.count_rows() == 8
    assert table.read_blobs("media", [5]) == [payload(1, 300 * KIB)]


def test_compaction_verify_and_global_dedup_on_every_store(bucket, monkeypatch):
    uri = f"{bucket.uri}/t"
    shared = payload(5, 600 * KIB)
    for i in range(3):
        data = pa.table({"id": [i, i + 10], "media": blob_array([shared, payload(i, 700 * KIB)])})
        write_table(data, uri, mode="append", dedup="global", storage_options=bucket.options)
    packs = [k for k in bucket.objects("t/_blobs/packs/")]
    stored = sum(bucket.objects("t/_blobs/packs/").values())
    assert stored == 600 * KIB + 3 * 700 * KIB, packs  # the shared payload once, table-wide
    # each write's index fragment got its filter, and the later writes read them from S3
    # read as big filters are: the header first, then the names, then a block per digest
    monkeypatch.setattr("blobhouse.store.digest_filter._WHOLE_BYTES", 0)
    monkeypatch.setattr("blobhouse.store.digest_filter._HEAD_BYTES", 32)
    # the writes read them whole (and kept them): read anew, as another process would
    monkeypatch.setattr("blobhouse.store.digest_filter._READ", WeightedLRU(1 << 20, lambda _: 1))
    filters = read_filters(filters_uri(index_uri(uri)), bucket.options)
    assert not any(f.loaded for f in filters)
    assert len(filters) == 3 == len(bucket.objects("t/_blobs/index/_filters/"))
    asked = digest_matrix([content_hash(shared), content_hash(b"never stored")])
    assert may_contain(filters, asked, bucket.options).tolist() == [True, False]
    table = open_table(uri, storage_options=bucket.options)
    before = table.read_blobs("media", range(6))
    table.compact(target_rows=100)
    compacted = open_table(uri, storage_options=bucket.options)
    assert len(compacted.dataset.get_fragments()) == 1
    assert compacted.read_blobs("media", range(6)) == before
    assert stock_blobs(uri, bucket.options, "media") == before
    report = compacted.verify(deep=True)
    assert report["problems"] == [] and report["hashed"] > 0
    gc = compacted.gc(retain_versions=1, grace=timedelta(0))
    assert gc["removed_versions"]
    assert open_table(uri, storage_options=bucket.options).read_blobs("media", range(6)) == before


def test_a_big_store_index_answers_found_hashes_from_its_sorted_run_on_every_store(bucket):
    """gc's maintenance builds a sorted run of a big index on the store itself, and a
    writer finds stored payloads through it (ranged reads of the run, then the rows)."""
    uri = f"{bucket.uri}/t"
    payloads = [payload(i, 30 * KIB) for i in range(5)]
    data = pa.table({"id": range(5), "b": blob_array(payloads)})
    write_table(data, uri, storage_options=bucket.options)
    synthetic_entries(uri, _RUN_ENTRIES, storage_options=bucket.options)
    maintain_index(uri, timedelta(hours=1), bucket.options)
    (run,) = read_runs(runs_uri(index_uri(uri)), bucket.options)
    assert run.entries == _RUN_ENTRIES + 5
    index = StoreIndex.open(uri, bucket.options)
    assert set(index.find([content_hash(p) for p in payloads])) == {
        content_hash(p) for p in payloads
    }
    assert index._level0._run  # answered by the run
    packs = bucket.objects("t/_blobs/packs/")
    again = pa.table({"id": [10, 11], "b": blob_array(payloads[:2])})
    table = write_table(again, uri, mode="append", storage_options=bucket.options)
    assert bucket.objects("t/_blobs/packs/") == packs  # nothing stored anew
    assert table.read_blobs("b", [5, 6]) == payloads[:2]


def test_small_writes_merge_the_index_and_clean_its_versions_on_every_store(bucket, monkeypatch):
    """Writers' upkeep of level 0 between gc runs (merged small fragments, filters, old
    versions removed) through the store's own requests."""
    monkeypatch.setattr("blobhouse.store.index_part._MERGE_WIDTH", 3)
    monkeypatch.setattr("blobhouse.store.index_part._CLEAN_EVERY", 4)
    monkeypatch.setattr("blobhouse.store.index_part.READER_WINDOW", timedelta(0))
    uri = f"{bucket.uri}/t"
    payloads = [payload(i, 3 * KIB) for i in range(10)]
    for i, data in enumerate(payloads):
        rows = pa.table({"id": [i], "b": blob_array([data])})
        write_table(rows, uri, mode="append" if i else "create", storage_options=bucket.options)
    level0 = lance.dataset(index_uri(uri), storage_options=bucket.options)
    assert len(level0.get_fragments()) <= 6 and level0.count_rows() == 10  # 2 a size tier
    assert len(level0.versions()) < 10
    filters = read_filters(filters_uri(index_uri(uri)), bucket.options)
    assert len(filters) <= 6
    packs = bucket.objects("t/_blobs/packs/")
    again = pa.table({"id": range(10, 20), "b": blob_array(payloads)})
    table = write_table(again, uri, mode="append", storage_options=bucket.options)
    assert bucket.objects("t/_blobs/packs/") == packs  # every payload found
    assert table.read_blobs("b", range(10, 20)) == payloads


def test_the_index_moved_into_shards_finds_and_keeps_payloads_on_every_store(bucket, monkeypatch):
    """gc moves level 0 into shards on the store itself; a writer finds what was moved
    through the shards' filters, and gc after deletes reclaims packs the shards named."""
    monkeypatch.setattr("blobhouse.store.index_maintenance.SHARDS", 2)
    monkeypatch.setattr("blobhouse.store.index_maintenance.SHARD_AFTER", 0)
    uri = f"{bucket.uri}/t"
    payloads = [payload(i, 200 * KIB) for i in range(6)]
    placement = {"b": {"pack_file_size_threshold": 500 * KIB}}
    data = pa.table({"id": range(6), "b": blob_array(payloads)})
    write_table(data, uri, placement=placement, storage_options=bucket.options)
    open_table(uri, storage_options=bucket.options).gc(grace=timedelta(hours=1))
    assert bucket.objects("t/_blobs/index-shards/_filters/")  # level 1's filters, on the store
    assert lance.dataset(index_uri(uri), storage_options=bucket.options).count_rows() == 0
    packs = bucket.objects("t/_blobs/packs/")
    again = pa.table({"id": [10, 11], "b": blob_array(payloads[:2])})
    table = write_table(again, uri, mode="append", storage_options=bucket.options)
    assert bucket.objects("t/_blobs/packs/") == packs  # found in the shards: nothing anew
    assert table.read_blobs("b", [6, 7]) == payloads[:2]
    table.delete("id >= 2")  # the second pack wholly dead: compaction retires it
    report = open_table(uri, storage_options=bucket.options).compact()
    assert report["retired_packs"] >= 1
    retired = set(retired_packs(uri, bucket.options))
    # and every shard let go of its entries: gc deletes it once the grace allows
    named = {"packs/" + key.rsplit("/", 1)[-1] for key in packs}
    assert retired and indexed_packs(uri, bucket.options) == named - retired
    table = open_table(uri, storage_options=bucket.options)
    assert table.read_blobs("b", range(table.count_rows())) == payloads[:2]
    assert stock_blobs(uri, bucket.options, "b") == payloads[:2]


def test_backfill_on_every_store(bucket):
    uri = f"{bucket.uri}/t"
    write_table(pa.table({"id": list(range(6))}), uri, storage_options=bucket.options)
    table = open_table(uri, storage_options=bucket.options)
    filled = table.backfill_blob_column(
        "thumb", lambda batch: [payload(i, 100 * KIB) for i in batch.column("id").to_pylist()]
    )
    assert filled.read_blobs("thumb", range(6)) == [payload(i, 100 * KIB) for i in range(6)]
    assert stock_blobs(uri, bucket.options, "thumb")[3] == payload(3, 100 * KIB)


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_update_and_merge_insert_on_every_store(bucket, dedup):
    """Mutations on an object store: plain and blob columns updated, an upsert; stock pylance
    reads every byte; with global dedup only new payloads are uploaded, and every pack an
    update or merge stored is complete (its multipart upload finished)."""
    uri = f"{bucket.uri}/t"
    shared = payload(7, 300 * KIB)
    data = pa.table(
        {
            "id": list(range(8)),
            "label": [f"l{i}" for i in range(8)],
            "media": blob_array([shared if i % 2 else payload(i, 200 * KIB) for i in range(8)]),
        }
    )
    table = write_table(data, uri, dedup=dedup, storage_options=bucket.options)
    packs = sum(bucket.objects("t/_blobs/packs/").values())

    table.update({"label": "upper(label)"}, where="id < 4")

    def new_media(rows):  # shared payloads stay shared, one new payload per even row
        return [shared if i % 2 else payload(100 + i, 250 * KIB) for i in rows["id"].to_pylist()]

    table.update({"media": new_media}, where="id >= 6", dedup=dedup)
    upsert = pa.table(
        {
            "id": [1, 2, 20],
            "label": ["m1", "m2", "n20"],
            "media": blob_array([shared, payload(2, 200 * KIB), payload(20, 400 * KIB)]),
        }
    )
    report = (
        table.merge_insert("id", dedup=dedup)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (2, 1)

    want = {i: payload(i, 200 * KIB) if i % 2 == 0 else shared for i in range(8)}
    want.update({6: payload(106, 250 * KIB), 20: payload(20, 400 * KIB)})
    labels = {i: (f"L{i}" if i < 4 else f"l{i}") for i in range(8)}
    labels.update({1: "m1", 2: "m2", 20: "n20"})
    got = open_table(uri, storage_options=bucket.options).to_arrow(blobs="bytes").to_pylist()
    assert {r["id"]: (r["label"], r["media"]) for r in got} == {
        i: (labels[i], want[i]) for i in want
    }
    stock = lance.dataset(uri, storage_options=checked_options(bucket.options))
    ids = stock.to_table(columns=["id"]).column("id").to_pylist()
    assert dict(zip(ids, stock_blobs(uri, bucket.options, "media"), strict=True)) == want
    assert bucket.uploads() == []  # every pack's upload completed
    if dedup == "global":  # only the two new payloads went to the store
        grown = sum(bucket.objects("t/_blobs/packs/").values()) - packs
        assert grown == 250 * KIB + 400 * KIB
    assert open_table(uri, storage_options=bucket.options).verify(deep=True)["problems"] == []


def test_a_failed_update_on_s3_leaves_the_table_and_the_bucket_as_they_were(s3):
    uri = f"{s3.uri}/t"
    data = pa.table(
        {"id": list(range(6)), "media": blob_array([payload(i, 300) for i in range(6)])}
    )
    table = write_table(data, uri, dedup="global", max_rows_per_file=3, storage_options=s3.options)
    before, version = s3.objects(), table.version

    def failing(rows):  # the first fragment's big payloads are uploaded before the failure
        if rows["id"][0].as_py() >= 3:  # the second fragment
            raise RuntimeError("decoder crashed")
        return [payload(50 + i, 6 * MIB) for i in range(rows.num_rows)]

    with pytest.raises(RuntimeError, match="decoder crashed"):
        table.update({"media": failing}, dedup="global")
    after = s3.objects()
    assert {k for k in after if "/_leases/" not in k} == {k for k in before if "/_leases/" not in k}
    assert s3.uploads() == []
    assert open_table(uri, storage_options=s3.options).version == version


def test_spark_update_and_merge_insert_on_every_store(spark, bucket):
    import blobhouse.spark as bs

    uri = f"{bucket.uri}/t"
    shared = payload(3, 300 * KIB)
    rows_ = [(i, i * 10, shared if i % 2 else payload(i, 120 * KIB)) for i in range(10)]
    df = spark.createDataFrame(rows_, "id long, label long, media binary")
    bs.write_table(df, uri, blob_columns=["media"], dedup="global", storage_options=bucket.options)
    packs = sum(bucket.objects("t/_blobs/packs/").values())
    bs.update(spark, uri, {"label": "label + 1"}, where="id < 5", storage_options=bucket.options)
    source = spark.createDataFrame(
        [(2, -2, shared), (30, -30, payload(30, 500 * KIB))], "id long, label long, media binary"
    )
    bs.merge_insert(source, uri, on="id", dedup="global", storage_options=bucket.options)
    table = open_table(uri, storage_options=bucket.options)
    got = {r["id"]: (r["label"], r["media"]) for r in table.to_arrow(blobs="bytes").to_pylist()}
    want = {i: (i * 10 + (i < 5), media) for i, _, media in rows_}
    want.update({2: (-2, shared), 30: (-30, payload(30, 500 * KIB))})
    assert got == want
    assert sum(bucket.objects("t/_blobs/packs/").values()) - packs == 500 * KIB
    assert bucket.uploads() == []
    assert table.verify(deep=True)["problems"] == []


def test_opening_a_missing_s3_table_says_so(s3):
    with pytest.raises(TableNotFoundError, match="nothing"):
        open_table(f"{s3.uri}/nothing", storage_options=s3.options)


def test_env_only_configuration_reaches_the_same_server(s3, monkeypatch):
    """Without storage_options, obstore and Lance both read the standard AWS variables."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.options["aws_endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    table = write_table(rows(4), f"{s3.uri}/t")
    assert table.read_blobs("media", [1]) == [payload(1, 300 * KIB)]
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")


# -- Spark ----------------------------------------------------------------------------------


def test_spark_writes_reads_and_serves_bytes_from_s3(spark, s3):
    import blobhouse.spark as bs
    from blobhouse.spark.datasource import storage_prefixed

    uri = f"{s3.uri}/frames"
    frames = [(i, i // 10 + 1, payload(i // 10, 200 * KIB)) for i in range(40)]
    df = spark.createDataFrame(frames, "frame long, chunk long, video binary").repartition(3)
    bs.write_table(
        df,
        uri,
        blob_columns=["video"],
        dedup="ref_id",
        ref_id_columns={"video": "chunk"},
        storage_options=s3.options,
    )
    stored = sum(v for k, v in s3.objects("frames/data/").items() if k.endswith(".blob"))
    assert stored == 4 * 200 * KIB  # each chunk once, whatever the input partitioning
    order = lance.dataset(uri, storage_options=checked_options(s3.options)).to_table(
        columns=["frame"]
    )
    expected = [payload(f // 10, 200 * KIB) for f in order.column("frame").to_pylist()]
    assert stock_blobs(uri, s3.options, "video") == expected

    read = spark.read.format("blobhouse").options(**storage_prefixed(s3.options)).load(uri)
    assert read.count() == 40
    bs.register(spark, storage_options=s3.options)
    try:
        read.createOrReplaceTempView("s3_frames")
        (row,) = spark.sql("SELECT read_blob(video) AS v FROM s3_frames WHERE frame = 31").collect()
        assert row.v == payload(3, 200 * KIB)
    finally:
        bs.register(spark)  # the session is shared: back to reading local files only
    got = bs.materialize(read.filter("frame < 12"), ["video"], storage_options=s3.options)
    assert {r.frame: bytes(r.video) for r in got.collect()} == {
        i: payload(i // 10, 200 * KIB) for i in range(12)
    }
    as_bytes = (
        spark.read.format("blobhouse")
        .options(**storage_prefixed(s3.options))
        .option("blobs", "bytes")
        .load(uri)
        .filter("frame = 5")
        .collect()
    )
    assert bytes(as_bytes[0].video) == payload(0, 200 * KIB)


def test_spark_global_dedup_backfill_and_table_services_on_s3(spark, s3):
    import blobhouse.spark as bs

    uri = f"{s3.uri}/t"
    shared = payload(9, 300 * KIB)
    for start in (0, 10):
        rows_ = [(i, shared if i % 2 else payload(i, 150 * KIB)) for i in range(start, start + 10)]
        df = spark.createDataFrame(rows_, "id long, media binary")
        bs.write_table(df, uri, blob_columns=["media"], dedup="global", storage_options=s3.options)
    assert sum(s3.objects("t/_blobs/packs/").values()) == 300 * KIB + 10 * 150 * KIB

    bs.backfill_blob_column(
        spark,
        uri,
        "thumb",
        # self-contained: the function travels to the executors, this module does not
        lambda batch: [i.to_bytes(4, "little") * 17920 for i in batch.column("id").to_pylist()],
        storage_options=s3.options,
    )
    table = open_table(uri, storage_options=s3.options)
    ids = table.to_arrow(columns=["id"]).column("id").to_pylist()
    assert table.read_blobs("thumb", range(len(ids))) == [payload(i, 70 * KIB) for i in ids]
    expected = table.read_blobs("media", range(20))

    report = bs.compact(spark, uri, storage_options=s3.options)
    assert report["fragments_removed"] >= 2
    compacted = open_table(uri, storage_options=s3.options)
    assert compacted.read_blobs("media", range(20)) == expected
    assert bs.verify(spark, uri, deep=True, storage_options=s3.options)["problems"] == []
    dead = f"t/data/write-0123456789ab-{'0' * 32}.lance"  # a dead write's file, as named
    s3.put(dead, b"x")
    time.sleep(1.1)  # S3 times are whole seconds
    swept = bs.gc(spark, uri, grace=timedelta(0), storage_options=s3.options)
    assert swept["removed_files"] >= 1 and dead not in s3.objects()
    assert open_table(uri, storage_options=s3.options).read_blobs("media", range(20)) == expected
    assert stock_blobs(uri, s3.options, "media") == expected


def test_ingest_and_the_cli_on_s3(spark, s3, tmp_path, capsys):
    from blobhouse.cli import main
    from blobhouse.spark.ingest import ingest

    for name in ("a", "b"):
        s3.put(f"media/{name}.bin", payload(ord(name), 120 * KIB))
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text(
        "".join(f'{{"id": {i}, "file": "{s3.uri}/media/{"ab"[i % 2]}.bin"}}\n' for i in range(6))
    )
    uri = f"{s3.uri}/ingested"
    ingest(spark, str(manifest), uri, ["file"], storage_options=s3.options)
    table = open_table(uri, storage_options=s3.options)
    ids = table.to_arrow(columns=["id"]).column("id").to_pylist()
    assert table.read_blobs("file", range(6)) == [payload(ord("ab"[i % 2]), 120 * KIB) for i in ids]
    packs = s3.objects("ingested/_blobs/packs/")  # each file once in the table's store
    assert sum(packs.values()) == 2 * 120 * KIB

    flags = [f"--storage-option={k}={v}" for k, v in s3.options.items()]
    assert main(["stats", uri, *flags]) == 0
    assert "orphans        0 files" in capsys.readouterr().out
    assert main(["verify", uri, "--deep", *flags]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    assert main(["compact", uri, *flags]) == 0
    assert main(["gc", uri, "--grace-hours", "0", *flags]) == 0
    assert "removed versions none" in capsys.readouterr().out
    assert main(["stats", uri, "--storage-option", "aws_endpoint"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


# -- crash safety ---------------------------------------------------------------------------


def test_writers_killed_on_s3_lose_nothing_and_leave_only_orphans(s3, monkeypatch):
    """SIGKILLed writers on S3 (uploads half done, commits racing nothing): the table always
    opens at a committed version whose rows read back exactly, and gc removes everything the
    kills left once their leases expired: objects, leases and unfinished uploads."""
    from tests.faults.test_crash_safety import assert_latest_reads_back
    from tests.workers.crash_worker import payload as row_payload

    # gc (this process) judges leases: 5 s instead of 30 is still 2.5 of a writer's touches
    monkeypatch.setattr(leases, "TIMEOUT_SECONDS", 5.0)

    uri = f"{s3.uri}/t"
    first = pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([row_payload(0)])})
    write_table(first, uri, storage_options=s3.options)
    worker = worker_script("crash_worker.py")
    rng = random.Random(S3_CRASH_SEED)
    checked, rows_seen = 1, 1
    for kill in range(S3_CRASH_KILLS):
        process = subprocess.Popen(
            [sys.executable, worker, uri, str(kill + 1), json.dumps(s3.options)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(1.5, 3.5))  # imports and the first request take ~1 s
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        version, now = assert_latest_reads_back(uri, s3.options)
        assert version >= checked and now >= rows_seen
        checked, rows_seen = version, now
    table = open_table(uri, storage_options=s3.options)
    assert table.verify(deep=True)["problems"] == []
    time.sleep(leases.TIMEOUT_SECONDS + 1.5)  # the killed writes' leases expire
    table.gc(grace=timedelta(0))
    assert table.stats()["orphan_files"] == 0
    # (a kill may leave a multipart upload unfinished: invisible, a lifecycle rule's to abort)
    assert not [k for k in s3.objects("t/_leases/")], "leases of killed writes stay"
    assert assert_latest_reads_back(uri, s3.options) == (checked, rows_seen)


def test_concurrent_appends_on_every_store_lose_no_commit(bucket):
    """Writers racing on one S3 table: Lance's conditional manifest PUTs rebase them, and
    blobhouse's store index takes their concurrent appends."""
    uri = f"{bucket.uri}/t"
    shared = payload(77, 200 * KIB)

    def value(row: int) -> bytes:  # even rows share one payload
        return shared if row % 2 == 0 else payload(row, 90 * KIB)

    def writer(w: int) -> None:
        for row in range(w * 10, w * 10 + 3):
            data = pa.table({"id": [row], "media": blob_array([value(row)])})
            write_table(data, uri, mode="append", dedup="global", storage_options=bucket.options)

    write_table(
        pa.table({"id": [-2], "media": blob_array([shared])}), uri, storage_options=bucket.options
    )
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    table = open_table(uri, storage_options=bucket.options)
    ids = table.to_arrow(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted([-2] + [w * 10 + i for w in range(4) for i in range(3)])
    assert table.read_blobs("media", range(len(ids))) == [value(i) for i in ids]
    assert table.verify(deep=True)["problems"] == []


def test_the_demo_replaces_its_table_on_s3(spark, s3, capsys):
    from blobhouse.cli import main

    flags = [f"--storage-option={k}={v}" for k, v in s3.options.items()]
    out = f"{s3.uri}/episodes"
    for _ in range(2):  # the second run overwrites the first table (a new version)
        assert main(["demo", "--rows", "35", "--out", out, "--json", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["rows"], report["mismatches"]) == (35, 0)
    table = open_table(out, storage_options=s3.options)
    assert (table.version, table.count_rows()) == (2, 35)


def test_writers_beside_gc_and_compaction_on_s3_lose_nothing(s3, monkeypatch):
    """Writers racing a maintenance loop (compaction, then gc with a 1 s grace) on S3: gc ages
    files by the server's whole-second clock and keeps what running writes staged (their
    leases), so every committed row reads back exactly and nothing of a failed write shows."""
    from blobhouse.errors import ConcurrentCommitError, StaleWriteError, StoreRaceError

    # leases expire after 5 s instead of 30 (still 2.5 refresh periods), so the dead writes'
    # files are swept inside the test
    monkeypatch.setattr(leases, "TIMEOUT_SECONDS", 5.0)

    uri = f"{s3.uri}/t"
    write_table(
        pa.table({"id": [0], "b": blob_array([payload(0, 90 * KIB)])}),
        uri,
        dedup="global",
        storage_options=s3.options,
    )
    done = threading.Event()
    committed: list[int] = []
    maintenance = {"removed_files": 0, "removed_versions": 0}

    def writer(w: int) -> None:
        for i in range(WRITES_BESIDE_GC):
            ids = [w * 100 + i * 10 + k for k in range(3)]
            data = pa.table({"id": ids, "b": blob_array([payload(j % 7, 90 * KIB) for j in ids])})
            if i % 3 == 2:  # a write that dies after staging: leftovers for gc to sweep
                staged = begin_write(
                    uri, data.schema, mode="append", storage_options=s3.options, in_tasks=True
                )
                staged.plan.write(data.to_batches())
            for _ in range(5):  # documented as retryable: nothing was committed
                try:
                    # the table's mode changes beside the other writers, gc and compaction
                    table = open_table(uri, storage_options=s3.options)
                    mode = ("global", "content")[i % 2]
                    if table.properties.dedup != mode:
                        table.set_properties(dedup=mode)
                    write_table(data, uri, mode="append", storage_options=s3.options)
                except (StaleWriteError, StoreRaceError, ConcurrentCommitError):
                    continue
                committed.extend(ids)
                break

    def maintain() -> None:
        deadline = time.monotonic() + 120
        # runs beside the writers, and on until passes removed old versions and files
        while not (
            done.is_set() and maintenance["removed_versions"] and maintenance["removed_files"]
        ):
            assert time.monotonic() < deadline, maintenance
            try:
                open_table(uri, storage_options=s3.options).compact(target_rows=64)
            except StaleWriteError:  # gc retired a pack it read: nothing committed, retryable
                pass
            except OSError as exc:  # lost its commit to a writer's: Lance's retryable conflict
                assert getattr(exc, "retryable", False), exc
            report = open_table(uri, storage_options=s3.options).gc(
                retain_versions=2, older_than=timedelta(seconds=1), grace=timedelta(seconds=1)
            )
            maintenance["removed_files"] += report["removed_files"]
            maintenance["removed_versions"] += len(report["removed_versions"])

    with ThreadPoolExecutor(4) as pool:
        background = pool.submit(maintain)
        writers = [pool.submit(writer, w) for w in range(1, 4)]
        for future in writers:
            future.result()
        done.set()
        background.result()
    table = open_table(uri, storage_options=s3.options)
    got = table.to_arrow(blobs="bytes").to_pylist()
    assert sorted(r["id"] for r in got) == sorted([0, *committed])
    assert all(r["b"] == payload(r["id"] % 7, 90 * KIB) for r in got)
    assert len(committed) >= 3 * 3 * (WRITES_BESIDE_GC - 1)  # at most a write per writer gave up
    assert table.verify(deep=True)["problems"] == []


def test_claims_on_every_store_let_one_task_store_a_payload_and_the_others_borrow_it(bucket):
    """Tasks of one write claiming on S3 (a conditional PUT each): the first stores the
    payload, the others reference its copy; the write commits each payload once."""

    from blobhouse.dedup import content_hash
    from blobhouse.store.claims import Claim, Claimant, Claims

    uri = f"{bucket.uri}/t"
    clips = [payload(1, 200 * KIB), payload(2, 200 * KIB)]

    def rows(first: int) -> pa.Table:
        return pa.table(
            {"id": pa.array(range(first, first + 4), pa.int64()), "b": blob_array(clips * 2)}
        )

    write_table(rows(0), uri, storage_options=bucket.options)
    write = begin_write(
        uri, rows(0).schema, mode="append", storage_options=bucket.options, in_tasks=True
    )
    assert write.plan.plan.claim_payloads  # as the Spark data source plans it
    digest = content_hash(b"x" * 100)  # the claim itself: one conditional PUT
    first = Claims(uri, write.transaction.id, bucket.options, Claimant(0, 0, "a"))
    second = Claims(uri, write.transaction.id, bucket.options, Claimant(1, 0, "b"))
    assert first.claim(Claim(digest, "packs/a.pack", 0, 100, first.claimant)) is None
    assert second.claim(Claim(digest, "packs/b.pack", 0, 100, second.claimant)).pack == (
        "packs/a.pack"
    )
    new = [payload(3, 200 * KIB)] * 4
    tasks = [
        pa.table({"id": pa.array(range(n * 10, n * 10 + 4), pa.int64()), "b": blob_array(new)})
        for n in (1, 2, 3)
    ]
    written = [f for task in tasks for f in write.plan.write(task.to_batches())]
    assert sum(len(f.borrowed) for f in written) == 2  # two of three tasks borrowed it
    table = Table(write.commit(written).snapshot)
    assert table.stats()["physical_bytes"] == sum(map(len, clips)) + len(new[0])
    assert not bucket.objects("t/_blobs/claims/")  # removed at the commit
    assert table.read_blobs("b", range(table.count_rows()))[-1] == new[0]


def test_many_objects_are_removed_in_bulk_on_every_store(bucket):
    """A folder of claims or records, a failed write's packs, gc's sweep: removed a bulk
    request at a time (S3: 1,000 keys; Azure: 256), an object already gone no failure."""
    store = object_store(bucket.uri, bucket.options)
    keys = [f"claims/{i:05d}" for i in range(300)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: bucket.put(key, b"c"), keys))
    store.delete_many([f"{bucket.uri}/{k}" for k in keys[:10]] + [f"{bucket.uri}/claims/gone"])
    assert sorted(bucket.objects("claims/")) == keys[10:]
    remove_folder(f"{bucket.uri}/claims", bucket.options)
    assert bucket.objects("claims/") == {}


def test_a_sweep_of_many_objects_is_a_few_requests_on_s3(s3):
    keys = [f"t/_blobs/claims/w-claims/{i:05d}" for i in range(1_001)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: s3.put(key, b"c"), keys))
    before = s3.server.requests(f"/{s3.name}")
    remove_folder(f"{s3.uri}/t/_blobs/claims/w-claims", s3.options)
    after = s3.server.requests(f"/{s3.name}")
    sent = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    assert s3.objects("t/") == {}
    # two listing pages and two bulk deletes, where one DELETE a key made 1,001 requests
    assert sent.get("DELETE", 0) == 0 and sent["POST"] == 2 and sent["GET"] <= 3, sent


def test_a_pack_goes_up_without_a_head_first_and_a_sidecar_never_overwrites_on_s3(s3):
    """A pack is named with a random 128-bit id: its multipart upload starts without asking
    whether the name is taken (a request per pack); a sidecar, whose number a caller of the
    preparation API may choose, is still refused when one exists."""
    uri = f"{s3.uri}/t"
    big = os.urandom(9 * MIB)  # past one PUT: a multipart upload
    data = pa.table({"id": [0, 1], "clip": blob_array([big, big[::-1]])})
    packs = f"/{s3.name}/t/_blobs/packs/"
    write_table(data, uri, storage_options=s3.options)
    # one HEAD a pack: the commit's check that gc did not take it while the write ran
    assert s3.server.requests(packs).get("HEAD", 0) == len(s3.objects("t/_blobs/packs/")) == 1
    assert open_table(uri, storage_options=s3.options).read_blobs("clip", [1]) == [big[::-1]]
    sidecar = f"{uri}/data/x/00000000000000000000000000000001.blob"
    s3.put("t/data/x/00000000000000000000000000000001.blob", b"kept")
    new = object_store(sidecar, s3.options).create(sidecar)
    with pytest.raises(FileExistsError, match="already exists"):
        new.write(big)
    new.abort()
    assert s3.get("t/data/x/00000000000000000000000000000001.blob") == b"kept"


def test_the_tasks_of_a_write_in_one_worker_read_the_store_once_on_s3(s3):
    """Spark runs task after task of a write in one Python worker: the first task opens the
    store index and lists the retired packs, the later ones reuse what it read (they used to
    send both requests each); the commit lists the tasks' records once and opens the index
    once to append (it listed its versions twice, the records four times)."""
    uri = f"{s3.uri}/t"
    data = pa.table({"id": [0], "clip": blob_array([os.urandom(100_000)])})
    write_table(data, uri, storage_options=s3.options)  # the store has an index
    write = begin_write(uri, data.schema, mode="append", storage_options=s3.options, in_tasks=True)
    listings = {
        what: f"/{s3.name}?list-type=2&prefix=t/_blobs/{what}/"
        for what in ("index/_versions", "tombstones")
    }

    def listed() -> dict[str, int]:
        return {what: s3.server.requests(p).get("GET", 0) for what, p in listings.items()}

    before, written = listed(), []
    for task in range(3):
        clips = [os.urandom(100_000 + task) for _ in range(4)]
        rows = pa.table({"id": range(4), "clip": blob_array(clips)})
        written += write.plan.write(rows.to_batches())
    after_tasks = listed()
    assert {w: after_tasks[w] - before[w] for w in listings} == {
        "index/_versions": 1,
        "tombstones": 1,
    }
    records = f"/{s3.name}?list-type=2&prefix=t/_blobs/stored/"
    records_before = s3.server.requests(records).get("GET", 0)
    table = Table(write.commit(written).snapshot)
    assert s3.server.requests(records).get("GET", 0) - records_before == 2  # read, removed
    assert listed()["index/_versions"] - after_tasks["index/_versions"] <= 2  # open, append
    assert table.count_rows() == 13 and table.verify(deep=True)["problems"] == []
    assert table.stats()["physical_bytes"] == 100_000 + 4 * (300_003)


def _claims_requests(s3):
    """A function: what ``call()`` returned, and the requests it sent to the claims of the
    table ``t`` on ``s3``, by method."""
    prefix = f"/{s3.name}/t/_blobs/claims/"

    def sent_by(call):
        before = s3.server.requests(prefix)
        result = call()
        after = s3.server.requests(prefix)
        return result, {m: n - before.get(m, 0) for m, n in after.items() if n - before.get(m, 0)}

    return sent_by


def test_a_claim_another_task_made_first_costs_one_refused_put_and_its_read_on_s3(s3):
    """A task meeting a payload another task of the write claimed: its conditional PUT is
    refused and the claim is read (it once sent the refused PUT twice); a later task in the
    same process (Spark reuses its workers) knows the claim already and sends nothing."""
    from blobhouse.store.claims import Claim, Claimant, Claims
    from blobhouse.store.write_memory import WriteMemory

    uri = f"{s3.uri}/t"
    digest = content_hash(b"x" * 100)
    write = "write-0123456789ab"
    first = Claims(uri, write, s3.options, Claimant(0, 0, "a"), memory=WriteMemory())
    second = Claims(uri, write, s3.options, Claimant(1, 0, "b"), memory=WriteMemory())
    assert first.claim(Claim(digest, "packs/a.pack", 0, 100, first.claimant)) is None
    sent_by = _claims_requests(s3)

    theirs, sent = sent_by(
        lambda: second.claim(Claim(digest, "packs/b.pack", 0, 100, second.claimant))
    )
    assert theirs.pack == "packs/a.pack"
    assert sent == {"PUT": 1, "GET": 1}, sent  # the read asks for no size first (a HEAD)
    later = Claims(uri, write, s3.options, Claimant(2, 0, "c"), memory=second.memory)
    theirs, sent = sent_by(lambda: later.claim(Claim(digest, "packs/c.pack", 0, 100, None)))
    assert theirs.pack == "packs/a.pack" and sent == {}
    retry = Claims(uri, write, s3.options, Claimant(0, 1, "a2"), memory=second.memory)
    mine = Claim(digest, "packs/a2.pack", 0, 100, retry.claimant)
    assert retry.claim(mine) is None  # a later attempt of the claimant takes its claim over
    assert later.claim(Claim(digest, "packs/c.pack", 0, 100, None)).pack == "packs/a2.pack"
    # the mark that a column is shared: one conditional PUT to leave, one HEAD to look for
    assert not first.shared("clip")
    second.mark_shared("clip")
    second.mark_shared("clip")  # another task left it first: refused, no error
    assert first.shared("clip") and not first.shared("thumb")


def test_a_batch_of_claims_is_one_request_on_s3(s3):
    """A task claims a whole batch in one entry of the write's claim log: 200 payloads, one
    conditional PUT. Another task wanting 100 of them and 50 others: its PUT is refused, it
    reads the entry and borrows the 100, and claims the 50 in the next entry."""
    from blobhouse.store.claims import Claimant, Claims
    from blobhouse.store.write_memory import WriteMemory

    uri = f"{s3.uri}/t"
    write = "write-0123456789ab"
    digests = [content_hash(b"%d" % n) for n in range(250)]
    first = Claims(uri, write, s3.options, Claimant(0, 0, "a"), memory=WriteMemory())
    second = Claims(uri, write, s3.options, Claimant(1, 0, "b"), memory=WriteMemory())
    sent_by = _claims_requests(s3)

    def places(pack):
        return lambda wanted: [(pack, 10 * i) for i in range(len(wanted))]

    theirs, sent = sent_by(lambda: first.claim_many([(d, 10) for d in digests[:200]], places("a")))
    assert theirs == {} and sent == {"PUT": 1}
    wanted = [(d, 10) for d in digests[100:]]
    theirs, sent = sent_by(lambda: second.claim_many(wanted, places("b")))
    assert sent == {"PUT": 2, "GET": 1}, sent  # refused, read, the next entry
    assert set(theirs) == set(digests[100:200])
    assert {(c.pack, c.position) for c in theirs.values()} == {
        ("a", 10 * i) for i in range(100, 200)
    }
    assert second.claimed(digests[220]).pack == "b"
    assert second.claimed(digests[150]).pack == "a"


def test_append_transactions_are_read_from_every_store_without_lance(bucket):
    """What each append added is read from the manifest's last bytes and the transaction file
    on the store, as Lance's read_transaction says it (the walk of versions stays linear)."""
    import lance

    from blobhouse.files.transactions import appended

    uri = f"{bucket.uri}/t"
    for _ in range(3):
        table = write_table(rows(2), uri, mode="append", storage_options=bucket.options)
    dataset = lance.dataset(uri, storage_options=table.storage_options)
    for version in (2, 3):
        said = appended(uri, version, bucket.options)
        fragments = dataset.read_transaction(version).operation.fragments
        assert [rows_ for _, rows_ in said] == [f.physical_rows for f in fragments] == [2]
        assert [files[0][0] for files, _ in said] == [f.files[0].path for f in fragments]
    assert table.verify()["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_first_checked_read_over_many_data_files_loads_their_hashes_at_once_on_s3(
    s3, monkeypatch, dedup
):
    """The first checked read of rows spread over many data files (a table grown by small
    appends) loads each file's recorded hashes in parallel: one after another it waited for a
    few requests a file in turn (seconds, at an object store's latency, for 64 files). Inline
    rows (content) and store rows (global) alike; what is read is what was written."""
    from blobhouse.files import checksums as checksums_module

    uri = f"{s3.uri}/t"
    payloads = [os.urandom(size) for size in (2_000, 70_000) * 3]
    data = pa.table({"id": range(6), "b": blob_array(payloads)})
    write_table(data, uri, storage_options=s3.options, dedup=dedup, max_rows_per_file=1)
    together = threading.Barrier(2, timeout=30)  # two loads at once, or a broken barrier
    original, loads = checksums_module.load_checksums, []

    def load(data_file, options=None):
        loads.append(data_file)
        if len(loads) <= 2:
            together.wait()
        return original(data_file, options)

    monkeypatch.setattr(checksums_module, "load_checksums", load)
    table = open_table(uri, storage_options=s3.options)
    assert table.read_blobs("b", [5, 0, 3, 2]) == [payloads[p] for p in (5, 0, 3, 2)]
    assert len(loads) == len(set(loads)) == 4  # each file's list once
