"""blobhouse.torch with real torch (CPU): DataLoader workers under fork and spawn, ranks given
and from torch.distributed, every row once per epoch, orders by (seed, epoch), resumption from
the main process's count of batches, the map-style dataset with torch's samplers."""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
from collections import Counter

import pyarrow as pa
import pytest
import torch
import torch.multiprocessing
from torch import distributed
from torch.utils.data import DataLoader, DistributedSampler

from blobhouse import (
    InvalidInputError,
    TableNotFoundError,
    UnknownOptionError,
)
from blobhouse.loader import BatchLoader
from blobhouse.torch import TableBatchDataset, TableRowDataset
from tests.helpers import clips_table, run_fork_worker

ROWS = 45  # 23 rows a rank on 2 ranks: one row pads the second rank


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """45 rows sharing payloads in groups of 3, in several fragments."""
    uri = str(tmp_path_factory.mktemp("torch") / "clips")
    kwargs = dict(share=3, largest=120_000, val_every=5, rows_per_file=16, seed=11)
    return uri, clips_table(uri, ROWS, **kwargs)


def decode(row: dict) -> dict:
    """A transform: what a worker made of one row, and which process made it."""
    return {"id": row["id"], "sha": hashlib.sha256(row["clip"]).hexdigest(), "pid": os.getpid()}


def collate(samples: list[dict]) -> list[dict]:
    return samples


def epoch_of(uri, rank, *, context="spawn", epoch=0, workers=2, **kwargs) -> list[list[dict]]:
    """The batches one rank's DataLoader yields in ``epoch``, in order."""
    dataset = TableBatchDataset(
        uri,
        ["id", "clip"],
        batch_size=4,
        transform=decode,
        collate=collate,
        rank=rank,
        world_size=2,
        **kwargs,
    )
    dataset.set_epoch(epoch)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
    )
    batches = list(loader)
    assert len(batches) == len(loader) == len(dataset)
    return batches


def ids(batches: list[list[dict]]) -> list[int]:
    return [sample["id"] for batch in batches for sample in batch]


def check_two_ranks(samples: list, digests: dict, parent: int, rows: list[int]) -> Counter:
    """Samples of 2 ranks x 2 workers as (id, sha256, pid): each row's own bytes, every row
    read, the transform run in four worker processes; the count of each id."""
    seen = Counter(i for i, _, _ in samples)
    assert set(seen) == set(rows)
    assert all(sha == digests[i] for i, sha, _ in samples)
    pids = {pid for _, _, pid in samples}
    assert parent not in pids and len(pids) == 4  # the transform ran in the workers
    return seen


@pytest.mark.slow
def test_two_ranks_of_two_spawned_workers_read_every_row_once(clips):
    uri, digests = clips
    ranks = [epoch_of(uri, rank, context="spawn", seed=4) for rank in (0, 1)]
    assert [len(r) for r in ranks] == [6, 6]  # 23 rows a rank in batches of 4
    samples = [[s["id"], s["sha"], s["pid"]] for rank in ranks for b in rank for s in b]
    seen = check_two_ranks(samples, digests, os.getpid(), list(range(ROWS)))
    assert sum(seen.values()) == 46 and list(seen.values()).count(2) == 1  # one padding row


@pytest.mark.slow
def test_two_ranks_of_two_forked_workers_read_every_row_once(clips):
    # the parent of forked workers must not have used Lance: a fresh process, as in training
    uri, digests = clips
    run = run_fork_worker("batches", uri)
    seen = check_two_ranks(run["result"], digests, run["parent"], list(range(ROWS)))
    assert sum(seen.values()) == 46 and list(seen.values()).count(2) == 1
    forked_spawned = ids(epoch_of(uri, 0, context="spawn", seed=4))
    assert [i for i, _, _ in run["result"]][: len(forked_spawned)] == forked_spawned


@pytest.mark.slow
def test_forked_workers_of_a_parent_that_used_lance_read_through_a_fresh_process(clips):
    # this pytest process has used Lance: its forked workers must not call Lance themselves
    # (pylance crashes or hangs at random there); they read through a helper process each
    uri, digests = clips
    ranks = [epoch_of(uri, rank, context="fork", seed=4) for rank in (0, 1)]
    samples = [[s["id"], s["sha"], s["pid"]] for rank in ranks for b in rank for s in b]
    seen = check_two_ranks(samples, digests, os.getpid(), list(range(ROWS)))
    assert sum(seen.values()) == 46 and list(seen.values()).count(2) == 1
    spawned = [epoch_of(uri, rank, context="spawn", seed=4) for rank in (0, 1)]
    assert [ids(r) for r in ranks] == [ids(r) for r in spawned]  # the same order


@pytest.mark.slow
def test_orders_change_with_the_epoch_and_repeat_with_the_seed(clips):
    uri, _ = clips
    first = ids(epoch_of(uri, 0, seed=8, epoch=0))
    assert ids(epoch_of(uri, 0, seed=8, epoch=0)) == first
    assert ids(epoch_of(uri, 0, seed=8, epoch=0, workers=0)) == first  # workers do not matter
    assert ids(epoch_of(uri, 0, seed=8, epoch=1)) != first
    assert ids(epoch_of(uri, 0, seed=9, epoch=0)) != first


@pytest.mark.slow
def test_resuming_from_the_main_process_count_continues_the_epoch(clips):
    uri, _ = clips
    expected = ids(epoch_of(uri, 1, seed=2, epoch=3))

    def dataset():
        return TableBatchDataset(
            uri, ["id", "clip"], batch_size=4, transform=decode, collate=collate, seed=2,
            rank=1, world_size=2,
        )  # fmt: skip

    interrupted = dataset()
    interrupted.set_epoch(3)
    done = []
    for count, batch in enumerate(
        DataLoader(interrupted, batch_size=None, num_workers=2, multiprocessing_context="spawn"), 1
    ):
        done += [s["id"] for s in batch]
        if count == 3:
            state = pickle.loads(pickle.dumps(interrupted.state_dict(batches_done=count)))
            break
    assert state["epoch"] == 3 and state["position"] == 3
    resumed = dataset()
    resumed.load_state_dict(state)
    rest = list(
        DataLoader(resumed, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    )
    assert done + ids(rest) == expected
    # a second interruption counts from where this pass started
    assert resumed.state_dict(batches_done=1)["position"] == 4
    with pytest.raises(InvalidInputError, match=r"batches_done must be in \[0, 3\]"):
        resumed.state_dict(batches_done=4)
    resumed.set_epoch(4)
    assert (
        len(
            list(
                DataLoader(resumed, batch_size=None, num_workers=2, multiprocessing_context="spawn")
            )
        )
        == 6
    )


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_persistent_workers_read_the_epoch_set_and_a_resumed_start(clips, context):
    uri, digests = clips
    dataset = TableBatchDataset(
        uri, ["id", "clip"], batch_size=4, transform=decode, collate=collate, seed=6,
        rank=0, world_size=2,
    )  # fmt: skip
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
    )
    epochs = []
    for epoch in (0, 1, 2):
        dataset.set_epoch(epoch)
        samples = [s for batch in loader for s in batch]
        assert all(s["sha"] == digests[s["id"]] for s in samples)
        epochs.append([s["id"] for s in samples])
    expected = []
    for epoch in (0, 1, 2):  # the rank's order: what one loader of the rank reads in turn
        rank = BatchLoader(uri, ["id"], batch_size=4, seed=6, rank=0, world_size=2)
        rank.set_epoch(epoch)
        expected.append([i for batch in rank for i in batch.column("id").to_pylist()])
    assert epochs == expected and len({tuple(e) for e in epochs}) == 3
    dataset.load_state_dict({**dataset.state_dict(batches_done=2), "epoch": 1})
    assert [s["id"] for batch in loader for s in batch] == expected[1][8:]


def test_a_collate_without_a_transform_gets_the_rows(clips):
    uri, digests = clips
    dataset = TableBatchDataset(
        uri, ["id", "clip"], batch_size=5, shuffle=False, filter="id < 5", collate=collate
    )
    (rows,) = list(DataLoader(dataset, batch_size=None))
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]
    assert [hashlib.sha256(r["clip"]).hexdigest() for r in rows] == [digests[i] for i in range(5)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distributed_rank(rank: int, uri: str, port: int, out: str) -> None:
    distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    try:
        dataset = TableBatchDataset(
            uri, ["id"], batch_size=5, filter="split = 'train'", drop_last=True, seed=1
        )
        got = [i for batch in DataLoader(dataset, batch_size=None) for i in batch["id"].tolist()]
        with open(f"{out}/{rank}", "wb") as f:
            pickle.dump((dataset.loader.shard.rank, got), f)
    finally:
        distributed.destroy_process_group()


def test_ranks_come_from_torch_distributed(clips, tmp_path):
    uri, _ = clips
    torch.multiprocessing.spawn(
        _distributed_rank, args=(uri, _free_port(), str(tmp_path)), nprocs=2, join=True
    )
    results = [pickle.loads((tmp_path / str(rank)).read_bytes()) for rank in (0, 1)]
    assert [rank for rank, _ in results] == [0, 1]
    got = [got for _, got in results]
    train = [i for i in range(ROWS) if i % 5]  # 36 rows: 18 a rank, 15 in full batches
    assert len(got[0]) == len(got[1]) == 15
    assert not set(got[0]) & set(got[1]) and set(got[0] + got[1]) <= set(train)


def test_without_a_transform_batches_are_tensors_and_lists(clips):
    uri, digests = clips
    dataset = TableBatchDataset(uri, batch_size=8, shuffle=False, filter="id < 8")
    (batch,) = list(DataLoader(dataset, batch_size=None))
    assert batch["id"].dtype == torch.int64 and batch["id"].tolist() == list(range(8))
    assert batch["split"][:2] == ["val", "train"]
    assert [hashlib.sha256(b).hexdigest() for b in batch["clip"]] == [digests[i] for i in range(8)]


@pytest.mark.slow
def test_the_row_dataset_with_a_distributed_sampler_reads_every_row_once(clips):
    uri, digests = clips
    dataset = TableRowDataset(uri, ["id", "clip"], transform=decode, filter="split = 'train'")
    assert len(dataset) == 36
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=3)
        loader = DataLoader(
            dataset,
            batch_size=6,
            sampler=sampler,
            num_workers=2,
            collate_fn=collate,
            multiprocessing_context="spawn",
        )
        seen += [[s["id"], s["sha"], s["pid"]] for batch in loader for s in batch]
    train = [i for i in range(ROWS) if i % 5]
    assert sorted(i for i, _, _ in seen) == train
    check_two_ranks(seen, digests, os.getpid(), train)


def test_the_row_dataset_with_forked_workers_reads_every_row_once(clips):
    uri, digests = clips
    run = run_fork_worker("rows", uri)
    seen = check_two_ranks(run["result"], digests, run["parent"], list(range(ROWS)))
    assert sum(seen.values()) == 46  # DistributedSampler pads 45 rows to 46 too


def test_the_row_dataset_with_workers_forked_after_lance_reads_every_row_once(clips):
    uri, digests = clips
    dataset = TableRowDataset(uri, ["id", "clip"], transform=decode)
    dataset[0]  # this process reads with Lance before its workers fork
    loader = DataLoader(
        dataset, batch_size=7, num_workers=2, collate_fn=collate, multiprocessing_context="fork"
    )
    samples = [s for batch in loader for s in batch]
    assert sorted(s["id"] for s in samples) == list(range(ROWS))
    assert all(s["sha"] == digests[s["id"]] for s in samples)
    assert len({s["pid"] for s in samples} - {os.getpid()}) == 2


def test_the_row_dataset_indexes_like_a_sequence(clips):
    uri, digests = clips
    dataset = TableRowDataset(uri, ["id", "clip"], filter="id >= 40")
    assert [row["id"] for row in dataset] == [40, 41, 42, 43, 44]  # stops at IndexError
    assert hashlib.sha256(dataset[2]["clip"]).hexdigest() == digests[42]
    assert dataset.__getitems__([]) == []
    rows = dataset.__getitems__([0, 1, 2, 3, 4])  # ids 40-41 share a payload, and 42-44
    assert rows[0]["clip"] is rows[1]["clip"] and rows[2]["clip"] is rows[4]["clip"]
    with pytest.raises(IndexError, match="index 5 is outside the 5 rows"):
        dataset[5]
    with pytest.raises(InvalidInputError, match="indices must be integers"):
        dataset.__getitems__(["a"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 4, "transform": "decode"}, "transform must be a function"),
        ({"batch_size": 4, "collate": "stack"}, "collate must be a function"),
        ({"batch_size": 4, "rank": 2, "world_size": 2}, r"rank must be in \[0, 1\], got 2"),
        ({"batch_size": 4, "blobs": "bytez"}, "blobs must be 'bytes' or 'refs'"),
    ],
)
def test_bad_arguments_are_refused_by_name(clips, kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        TableBatchDataset(clips[0], **kwargs)
    with pytest.raises(InvalidInputError, match="check_hashes must be True or False"):
        TableRowDataset(clips[0], check_hashes=1)
    with pytest.raises(UnknownOptionError, match="did you mean 'check_hashes'"):
        TableRowDataset(clips[0], check_hash=False)
    with pytest.raises(UnknownOptionError, match=r"TableBatchDataset.*did you mean 'transform'"):
        TableBatchDataset(clips[0], batch_size=4, transfrom=decode)


def test_a_missing_table_is_named(tmp_path):
    with pytest.raises(TableNotFoundError, match="no table at"):
        TableRowDataset(str(tmp_path / "missing"))


def test_every_blobhouse_error_keeps_its_type_through_a_dataloader_worker():
    """torch re-raises a worker's exception in the main process as ``type(message)``, and as a
    RuntimeError when that call fails: every error blobhouse raises can be made from one."""
    import inspect

    from torch._utils import ExceptionWrapper

    import blobhouse.errors as errors

    classes = [
        getattr(errors, name)
        for name in [*dir(errors), "ConcurrentCommitError", "KeysInsertedMeanwhile"]
        if inspect.isclass(getattr(errors, name))
        and issubclass(getattr(errors, name), errors.BlobhouseError)
    ]
    assert len(classes) > 25
    for cls in classes:
        try:
            raise cls("what went wrong")
        except cls:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        with pytest.raises(cls, match="what went wrong") as raised:
            wrapped.reraise()
        assert type(raised.value) is cls


def _missing_and_damaged(uri: str) -> None:
    """A table of 8 rows: row 3's payload is missing (its sidecar removed), row 6's damaged."""
    from blobhouse import blob_array, open_table, write_table
    from tests.helpers import flip_payload, uri_to_path

    payloads = [os.urandom(200_000) for _ in range(8)]
    write_table(
        pa.table({"id": list(range(8)), "clip": blob_array(payloads)}),
        uri,
        placement={"clip": {"dedicated_size_threshold": 100_000}},  # a file per payload
        dedup="content",
    )
    refs = open_table(uri).blob_refs("clip", [3]).to_pylist()
    os.remove(uri_to_path(refs[0]["uri"]))
    flip_payload(uri, "clip", 6)


def test_errors_in_dataloader_workers_keep_their_type(tmp_path):
    """A missing payload read by a TableBatchDataset's worker, a damaged one by a
    TableRowDataset's: the main process catches BlobReadError and CorruptBlobError."""
    from blobhouse.errors import BlobReadError, CorruptBlobError

    uri = str(tmp_path / "t")
    _missing_and_damaged(uri)
    batches = TableBatchDataset(uri, batch_size=2, filter="id = 3 or id = 0")
    with pytest.raises(BlobReadError, match=r"'clip', fragment 0 row 3: missing object"):
        list(DataLoader(batches, batch_size=None, num_workers=2,
                        multiprocessing_context="forkserver"))  # fmt: skip
    rows = TableRowDataset(uri, filter="id = 6 or id = 0")
    with pytest.raises(CorruptBlobError, match=r"'clip', fragment 0 row 6: the bytes at"):
        list(DataLoader(rows, batch_size=2, num_workers=2, collate_fn=collate,
                        multiprocessing_context="forkserver"))  # fmt: skip
