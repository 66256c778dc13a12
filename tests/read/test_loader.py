"""BatchLoader: every row once per epoch across ranks and workers, orders by (seed, epoch),
resumption, forks and spawns, pinned versions, checked bytes, clear errors."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.blob import blob_array as lance_blob_array
from lance.blob import blob_field as lance_blob_field

import blobhouse
from blobhouse import (
    BlobhouseError,
    CorruptBlobError,
    InvalidInputError,
    PathIsFileError,
    TableNotFoundError,
    blob_array,
    write_table,
)
from blobhouse.loader import READ_AHEAD, BatchLoader
from blobhouse.table import Table
from tests.helpers import ROW_ADDRESS, clips_table, flip, run_fork_worker
from tests.workers.fork_worker import read_in_children, read_watched

ROWS = 103  # not a multiple of any batch size or world below: padding and short batches show


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """103 rows; rows share payloads in groups of 5 (clips of one video), some are inline."""
    uri = str(tmp_path_factory.mktemp("loader") / "videos")
    kwargs = dict(share=5, largest=300_000, val_every=4, rows_per_file=40, seed=7)
    return uri, clips_table(uri, ROWS, **kwargs)


def ids_of(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def shard_ids(uri, epoch=0, **kwargs) -> list[list[int]]:
    """The ids each (rank, worker) reads in ``epoch``, ranks and workers in order."""
    out = []
    for rank in range(kwargs.get("world_size", 1)):
        for worker in range(kwargs.get("num_workers", 1)):
            loader = BatchLoader(uri, ["id"], rank=rank, worker_id=worker, **kwargs)
            loader.set_epoch(epoch)
            out.append(ids_of(loader))
    return out


def test_two_ranks_of_two_workers_read_every_row_once_per_epoch(videos):
    uri, _ = videos
    shards = shard_ids(uri, batch_size=8, world_size=2, num_workers=2)
    everything = Counter(i for s in shards for i in s)
    assert set(everything) == set(range(ROWS))
    # 103 rows on 2 ranks: one row of the epoch's order pads the second rank
    assert sum(everything.values()) == 104 and list(everything.values()).count(2) == 1
    ranks = [shards[0] + shards[1], shards[2] + shards[3]]
    assert len(ranks[0]) == len(ranks[1]) == 52
    lengths = [
        len(BatchLoader(uri, batch_size=8, world_size=2, rank=r, num_workers=2, worker_id=w))
        for r in (0, 1)
        for w in (0, 1)
    ]
    assert lengths == [4, 3, 4, 3]  # 7 batches a rank: 52 rows of 8, the last short


def test_drop_last_gives_full_batches_and_no_row_twice(videos):
    uri, _ = videos
    shards = shard_ids(uri, batch_size=8, world_size=2, drop_last=True)
    assert [len(s) for s in shards] == [48, 48]
    both = shards[0] + shards[1]
    assert len(set(both)) == len(both) == 96


def test_orders_depend_on_seed_and_epoch_only(videos):
    uri, _ = videos
    first = shard_ids(uri, epoch=0, batch_size=10, seed=3)
    assert shard_ids(uri, epoch=0, batch_size=10, seed=3) == first
    assert shard_ids(uri, epoch=1, batch_size=10, seed=3) != first
    assert shard_ids(uri, epoch=0, batch_size=10, seed=4) != first
    assert sorted(first[0]) == list(range(ROWS))
    assert shard_ids(uri, batch_size=10, shuffle=False) == [list(range(ROWS))]


def test_bytes_are_each_rows_own_and_a_filter_picks_rows_first(videos):
    uri, digests = videos
    loader = BatchLoader(uri, ["id", "clip"], batch_size=16, filter="split = 'train'", seed=9)
    seen = []
    for batch in loader:
        assert batch.schema.field("clip").type == pa.large_binary()
        for row in batch.to_pylist():
            assert hashlib.sha256(row["clip"]).hexdigest() == digests[row["id"]]
            seen.append(row["id"])
    assert sorted(seen) == [i for i in range(ROWS) if i % 4]
    refs = next(iter(BatchLoader(uri, ["clip"], batch_size=4, blobs="refs")))
    assert refs.schema.field("clip").type.names == ["uri", "position", "size", "blake3"]


def test_row_batches_are_the_batches_as_rows_sharing_each_payload(videos):
    uri, digests = videos
    loader = BatchLoader(uri, ["id", "clip"], batch_size=16, seed=5)
    as_rows = list(loader.row_batches())
    assert as_rows == [batch.to_pylist() for batch in loader]
    for rows in as_rows:
        by_video: dict[int, bytes] = {}
        for row in rows:
            assert hashlib.sha256(row["clip"]).hexdigest() == digests[row["id"]]
            first = by_video.setdefault(row["id"] // 5, row["clip"])
            assert row["clip"] is first  # one object per payload in a batch, never a copy
        assert len({id(r["clip"]) for r in rows}) == len(by_video)
    refs = next(BatchLoader(uri, ["clip"], batch_size=4, blobs="refs").row_batches())
    assert set(refs[0]["clip"]) == {"uri", "position", "size", "blake3"}


def test_resuming_from_a_state_continues_the_epoch(videos):
    uri, _ = videos
    whole = BatchLoader(
        uri, ["id"], batch_size=7, seed=5, world_size=2, rank=1, num_workers=2, worker_id=1
    )
    whole.set_epoch(2)
    expected = [b.column("id").to_pylist() for b in whole]
    loader = BatchLoader(
        uri, ["id"], batch_size=7, seed=5, world_size=2, rank=1, num_workers=2, worker_id=1
    )
    loader.set_epoch(2)
    batches = iter(loader)
    done = [next(batches).column("id").to_pylist() for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    assert state["epoch"] == 2 and state["position"] == 4  # worker 1 read rank batches 1 and 3
    resumed = BatchLoader(
        uri, ["id"], batch_size=7, seed=5, world_size=2, rank=1, num_workers=2, worker_id=1
    )
    resumed.load_state_dict(state)
    assert done + [b.column("id").to_pylist() for b in resumed] == expected
    assert [b.column("id").to_pylist() for b in resumed] == expected  # the next pass: whole
    with pytest.raises(InvalidInputError, match=r"seed 5 \(this loader: 6\)"):
        BatchLoader(uri, ["id"], batch_size=7, seed=6).load_state_dict(state)


def test_spawned_workers_read_their_share_after_the_parent_used_lance(videos):
    uri, _ = videos
    loaders = [
        BatchLoader(uri, ["id", "clip"], batch_size=9, num_workers=3, worker_id=w) for w in range(3)
    ]
    list(loaders[0])  # the parent has read with Lance before the children start
    got = read_in_children("spawn", loaders)
    assert sorted(i for ids in got for i in ids) == list(range(ROWS))


def test_forked_workers_read_their_share_when_the_parent_has_not_used_lance(videos):
    uri, _ = videos
    assert run_fork_worker("loader", uri)["result"] == list(range(ROWS))


def test_a_worker_forked_after_the_parent_used_lance_reads_through_a_fresh_process(videos):
    # pylance's reads crash or hang at random in such a child: it must never call Lance
    uri, digests = videos
    loader = BatchLoader(uri, ["id", "clip"], batch_size=9, filter="split = 'train'")
    expected = sorted(ids_of(loader))  # the parent has read with Lance
    (got,) = read_in_children("fork", [loader], work=read_watched)
    assert sorted(i for i, _ in got["rows"]) == expected
    assert all(digests[i] == sha for i, sha in got["rows"])
    assert not got["lance_started"]
    (warned,) = [w for w in got["warnings"] if w.startswith("ForkedAfterLanceWarning")]
    assert "multiprocessing_context='forkserver'" in warned


def test_a_fresh_process_imports_blobhouse_from_where_its_parent_did(tmp_path):
    # a script that finds blobhouse on a sys.path of its own (a vendored copy): len() runs in
    # a fresh process, which must import that copy, not another or none
    vendored = tmp_path / "vendored"
    shutil.copytree(Path(blobhouse.__file__).parent, vendored / "blobhouse")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import blobhouse; "
        "from blobhouse.io.forks import in_fresh_process; "
        "print(in_fresh_process(eval, '__import__(\"blobhouse\").__file__') == blobhouse.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(vendored)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.stdout.split() == ["True"], done.stderr


def test_a_reader_in_a_fresh_process_names_how_it_failed(tmp_path):
    from blobhouse.io.forks import FreshProcess

    with FreshProcess() as helper:
        with pytest.raises(ZeroDivisionError):
            helper.call(divmod, 1, 0)  # an exception of the call is raised here
        assert helper.call(divmod, 7, 2) == (3, 1)  # and the helper serves on
        with pytest.raises(BlobhouseError, match=r"helper process exited with 3"):
            helper.call(os._exit, 3)
    # what the helper said before it died is in the error
    unimportable = r"(?s)exited with 1: .*No module named 'test_loader'"
    with FreshProcess() as helper, pytest.raises(BlobhouseError, match=unimportable):
        helper.call(test_a_reader_in_a_fresh_process_names_how_it_failed, tmp_path)


def test_the_version_is_pinned_when_the_loader_is_made(tmp_path):
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0, 1], "b": blob_array([b"a", b"b"])}), uri)
    loader = BatchLoader(uri, ["id"], batch_size=10)
    write_table(pa.table({"id": [2], "b": blob_array([b"c"])}), uri, mode="append")
    assert sorted(ids_of(loader)) == [0, 1] and loader.version == 1
    lance.dataset(uri).tags.create("first", 1)
    assert sorted(ids_of(BatchLoader(uri, ["id"], batch_size=10, version="first"))) == [0, 1]
    assert sorted(ids_of(BatchLoader(uri, ["id"], batch_size=10))) == [0, 1, 2]


def test_a_tag_is_resolved_once_so_workers_read_its_version_after_it_moves(tmp_path):
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0, 1], "b": blob_array([b"a", b"b"])}), uri)
    write_table(pa.table({"id": [2], "b": blob_array([b"c"])}), uri, mode="append")
    lance.dataset(uri).tags.create("gold", 1)
    loader = BatchLoader(uri, ["id"], batch_size=10, version="gold")
    lance.dataset(uri).tags.update("gold", 2)  # moved before a worker unpickles the loader
    in_worker = pickle.loads(pickle.dumps(loader))
    assert in_worker.version == loader.version == 1
    assert sorted(ids_of(in_worker)) == [0, 1]
    assert in_worker.state_dict()["version"] == 1
    lance.dataset(uri).tags.create("größer", 2)  # Lance stores it as %C3%B6 and %C3%9F
    assert BatchLoader(uri, batch_size=1, version="größer").version == 2
    tags = r"\(tags: \['gold', 'größer'\]\)"
    with pytest.raises(TableNotFoundError, match=rf"no tag 'nope' in .* {tags}"):
        BatchLoader(uri, batch_size=1, version="nope")
    with pytest.raises(TableNotFoundError, match=r"no tag '\.\./gold'"):
        BatchLoader(uri, batch_size=1, version="../gold")  # not a path out of _refs/tags


def test_a_tag_is_resolved_without_starting_lance(tmp_path):
    # a DataLoader's parent that starts Lance cannot fork its workers safely
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [0, 1], "b": blob_array([b"a", b"b"])}), uri)
    lance.dataset(uri).tags.create("gold", 1)
    script = (
        "import sys; from blobhouse.loader import BatchLoader; "
        "from blobhouse.io.forks import lance_is_running; "
        "loader = BatchLoader(sys.argv[1], batch_size=1, version='gold'); "
        "print(loader.version, lance_is_running())"
    )
    done = subprocess.run([sys.executable, "-c", script, uri], capture_output=True, text=True)
    assert done.stdout.split() == ["1", "False"], done.stderr


def test_batches_are_read_ahead_on_threads_each_with_its_own_table(videos, monkeypatch):
    uri, _ = videos
    readers: Counter = Counter()
    at_once = [0, 0]  # (now, most)
    lock = threading.Lock()
    take_rows = Table.take_rows

    def counted(self, *args, **kwargs):
        with lock:
            readers[threading.get_ident(), id(self)] += 1
            at_once[0] += 1
            at_once[1] = max(at_once)
        time.sleep(0.02)  # long enough for the others to start
        try:
            return take_rows(self, *args, **kwargs)
        finally:
            with lock:
                at_once[0] -= 1

    monkeypatch.setattr(Table, "take_rows", counted)
    batches = iter(BatchLoader(uri, ["id"], batch_size=5))
    next(batches)
    time.sleep(0.2)  # the consumer is slow: the loader reads ahead, never more than READ_AHEAD
    assert sum(readers.values()) == 1 + READ_AHEAD
    assert sorted(ids_of(batches)) != []
    assert at_once[1] == READ_AHEAD
    threads = {t for t, _ in readers}
    assert len(threads) == READ_AHEAD == len({table for _, table in readers})  # none shared
    readers.clear()
    worker = iter(BatchLoader(uri, ["id"], batch_size=5, worker_id=0, num_workers=2))
    next(worker)
    time.sleep(0.2)  # a DataLoader's workers share the read-ahead
    assert sum(readers.values()) == 1 + READ_AHEAD // 2


def test_damaged_bytes_raise_naming_the_column_unless_hashes_are_not_checked(tmp_path):
    uri = str(tmp_path / "t")
    payload = os.urandom(200_000)
    write_table(pa.table({"id": [0], "b": blob_array([payload])}), uri)
    pack = next(p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size >= 200_000)
    flip(str(pack), 100_000)
    with pytest.raises(CorruptBlobError, match="'b'"):
        list(BatchLoader(uri, batch_size=1))
    with pytest.raises(CorruptBlobError, match="'b'"):
        list(BatchLoader(uri, batch_size=1).row_batches())
    unchecked = BatchLoader(uri, batch_size=1, check_hashes=False)
    (batch,) = list(unchecked)
    (rows,) = list(unchecked.row_batches())
    damaged = batch.column("b")[0].as_py()
    assert damaged != payload and len(damaged) == len(payload) and rows[0]["b"] == damaged
    table = blobhouse.open_table(uri)
    ids = table.row_ids()
    assert table.take_row_dicts(ids, check_hashes=np.False_) == rows  # numpy's bools too
    for blobs in ("bytes", "refs"):
        with pytest.raises(InvalidInputError, match="check_hashes must be True or False"):
            table.take_row_dicts(ids, blobs=blobs, check_hashes="false")
    with pytest.raises(InvalidInputError, match="columns is empty"):
        table.take_row_dicts(ids, [])
    with pytest.raises(InvalidInputError, match="columns is empty"):
        table.take_rows(ids, [])
    for missing in ([999], [2**40]):  # past the fragment's rows; a fragment that is not there
        with pytest.raises(IndexError, match=r"row ids \[\d+\] are not all rows of version 1"):
            table.take_row_dicts(missing)
        with pytest.raises(IndexError, match=r"take ids from row_ids\(\)"):
            table.take_rows(missing, blobs="bytes")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"batch_size": "8"}, "batch_size must be an integer"),
        ({"batch_size": 8, "rank": 2, "world_size": 2}, r"rank must be in \[0, 1\], got 2"),
        ({"batch_size": 8, "worker_id": 3, "num_workers": 2}, r"worker_id must be in \[0, 1\]"),
        ({"batch_size": 8, "blobs": "descriptors"}, "blobs must be 'bytes' or 'refs'"),
        ({"batch_size": 8, "filter": 3}, "filter must be a SQL predicate"),
        ({"batch_size": 8, "columns": "clip"}, "columns must be a list of column names"),
        ({"batch_size": 8, "columns": ["id", 3]}, "columns must be a list of column names"),
        ({"batch_size": 8, "check_hashes": "no"}, "check_hashes must be True or False"),
        ({"batch_size": 8, "shufle": False}, "did you mean 'shuffle'"),
    ],
)
def test_bad_arguments_are_refused_by_name(videos, kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        BatchLoader(videos[0], **kwargs)


def test_unknown_columns_and_missing_tables_are_named(videos, tmp_path):
    with pytest.raises(InvalidInputError, match=r"unknown column.*'nope'"):
        list(BatchLoader(videos[0], ["id", "nope"], batch_size=8))
    for bad in ("split = = 'val'", "nope > 1"):
        with pytest.raises(InvalidInputError, match=rf"filter {bad!r} is not valid SQL") as got:
            list(BatchLoader(videos[0], ["id"], batch_size=8, filter=bad))
        assert ".rs:" not in str(got.value)  # no Rust source locations
    with pytest.raises(TableNotFoundError, match=r"no table at .*missing: no such file"):
        BatchLoader(str(tmp_path / "missing"), batch_size=8)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PathIsFileError, match="file is not a table"):
        BatchLoader(str(tmp_path / "file"), batch_size=8)


def test_stable_row_ids_after_a_compaction_read_the_right_rows(tmp_path):
    # with stable row ids a row's id is not its address once compaction has moved it
    uri = str(tmp_path / "t")
    payloads = {i: os.urandom(1_000 + i) for i in range(12)}
    first = pa.table(
        {
            "id": pa.array(range(4), pa.int64()),
            "b": lance_blob_array([payloads[i] for i in range(4)]),
        }
    )
    first = first.cast(first.schema.set(1, lance_blob_field("b")))
    lance.write_dataset(first, uri, enable_stable_row_ids=True, max_rows_per_file=2)
    for start in (4, 8):
        rows = range(start, start + 4)
        more = {"id": pa.array(rows, pa.int64()), "b": blob_array([payloads[i] for i in rows])}
        write_table(pa.table(more), uri, mode="append", max_rows_per_file=2)
    lance.dataset(uri).delete("id = 3")
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=100)
    dataset = lance.dataset(uri)
    assert dataset.has_stable_row_ids
    ids = dataset.to_table(columns=[], with_row_id=True, with_row_address=True)
    assert ids.column("_rowid") != ids.column(ROW_ADDRESS)
    got = {}
    for batch in BatchLoader(uri, ["id", "b"], batch_size=5, seed=2):
        got.update((r["id"], r["b"]) for r in batch.to_pylist())
    assert got == {i: p for i, p in payloads.items() if i != 3}


def test_a_table_on_s3_reads_every_row_once_with_its_bytes(s3):
    uri = f"{s3.uri}/clips"
    payloads = [os.urandom(70_000 + i) for i in range(5)]
    data = {"id": list(range(20)), "clip": blob_array([payloads[i % 5] for i in range(20)])}
    write_table(pa.table(data), uri, storage_options=s3.options, max_rows_per_file=8)
    seen = []
    for worker in (0, 1):
        loader = BatchLoader(
            uri, batch_size=3, num_workers=2, worker_id=worker, storage_options=s3.options
        )
        seen += [(r["id"], r["clip"]) for b in loader for r in b.to_pylist()]
    assert sorted(i for i, _ in seen) == list(range(20))
    assert all(clip == payloads[i % 5] for i, clip in seen)
    assert len(BatchLoader(uri, batch_size=3, storage_options=s3.options)) == 7
    write_table(pa.table(data), uri, mode="append", storage_options=s3.options)
    tags = lance.dataset(uri, storage_options=s3.options).tags
    for tag in ("gold", "größer"):  # Lance's key for the second: "gr%C3%B6%C3%9Fer.json"
        tags.create(tag, 1)
        pinned = BatchLoader(uri, ["id"], batch_size=30, version=tag, storage_options=s3.options)
        assert (pinned.version, sorted(ids_of(pinned))) == (1, list(range(20)))


def test_a_loader_reads_a_table_object_at_its_version(tmp_path):
    """``BatchLoader(table)`` reads the Table it is given: its place, options, branch and the
    version it is at (a later write is not read); anything else is refused by name."""
    uri = str(tmp_path / "t")
    table = blobhouse.write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}), uri)
    blobhouse.write_table(pa.table({"id": [3], "img": blob_array([b"c"])}), uri, mode="append")
    loader = BatchLoader(table, batch_size=8, shuffle=False)
    assert loader.version == table.version == 1
    assert [r for b in loader for r in b.column("img").to_pylist()] == [b"a", b"b"]
    with pytest.raises(blobhouse.InvalidInputError, match="got Table"):
        BatchLoader(pa.table({"id": [1]}), batch_size=1)
