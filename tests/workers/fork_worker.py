"""Reads a table with forked workers from a parent that has not used Lance, as a training
script does; tests run it as a fresh process (a pytest process has used Lance by then).

    python tests/workers/fork_worker.py MODE URI  ->  JSON on stdout

MODE ``loader``: three BatchLoader workers made by multiprocessing's fork: their ids.
MODE ``batches``: TableBatchDataset, 2 ranks x 2 DataLoader workers: (id, sha256, pid) rows.
MODE ``rows``: TableRowDataset with DistributedSampler, 2 ranks x 2 workers: the same.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys


def sample(row: dict) -> list:
    return [row["id"], hashlib.sha256(row["clip"]).hexdigest(), os.getpid()]


def listed(samples: list) -> list:
    return samples


def read_ids(loader, queue) -> None:
    """A child's work: the ids its loader reads, or the error it raised."""
    try:
        queue.put([i for b in loader for i in b.column("id").to_pylist()])
    except Exception as error:
        queue.put(error)


def read_watched(loader, queue) -> None:
    """A child's work: its loader's (id, sha256) rows, the warnings it gave, and whether Lance
    started in the child."""
    import hashlib
    import warnings

    from blobhouse.io.forks import lance_is_running

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = [
                (row["id"], hashlib.sha256(row["clip"]).hexdigest())
                for batch in loader
                for row in batch.to_pylist()
            ]
        said = [f"{w.category.__name__}: {w.message}" for w in caught]
        queue.put({"rows": rows, "warnings": said, "lance_started": lance_is_running()})
    except Exception as error:
        queue.put(error)


def read_in_children(method: str, loaders: list, work=read_ids) -> list:
    """What each loader read (or raised) in a child process made by ``method``, doing
    ``work``."""
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    children = [context.Process(target=work, args=(lo, queue)) for lo in loaders]
    for child in children:
        child.start()
    got = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0, child.exitcode
    return got


def loader_ids(uri: str) -> list[int]:
    from blobhouse.loader import BatchLoader

    loaders = [BatchLoader(uri, ["id"], batch_size=9, num_workers=3, worker_id=w) for w in range(3)]
    return sorted(i for ids in read_in_children("fork", loaders) for i in ids)


def torch_samples(uri: str, mode: str) -> list[list]:
    from torch.utils.data import DataLoader, DistributedSampler

    from blobhouse.torch import TableBatchDataset, TableRowDataset

    samples = []
    for rank in (0, 1):
        common = {"num_workers": 2, "multiprocessing_context": "fork"}
        if mode == "batches":
            dataset = TableBatchDataset(
                uri, ["id", "clip"], batch_size=4, transform=sample, collate=listed,
                rank=rank, world_size=2, seed=4,
            )  # fmt: skip
            loader = DataLoader(dataset, batch_size=None, **common)
        else:
            dataset = TableRowDataset(uri, ["id", "clip"], transform=sample)
            sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=3)
            loader = DataLoader(dataset, 6, sampler=sampler, collate_fn=listed, **common)
        samples += [s for batch in loader for s in batch]
    return samples


if __name__ == "__main__":
    mode, uri = sys.argv[1:3]
    result = loader_ids(uri) if mode == "loader" else torch_samples(uri, mode)
    print(json.dumps({"parent": os.getpid(), "result": result}))
