"""The ``loader`` case: one shuffled training epoch through a torch DataLoader from a cold page
cache, on the same rows: blobhouse's TableBatchDataset against pylance's ``read_blobs`` in a
Dataset, a Parquet-backed Dataset and WebDataset tar shards, with the machine's random-read
limit measured in the same run; and the first batch of a 1 M-row table.

Every epoch starts with the contender's files out of the page cache (``posix_fadvise``
DONTNEED), so their bytes come from the disk, as they do for a training set larger than
memory, while the programs' own code stays cached as it does in training. Workers start from a
forkserver that has imported the readers but not started Lance (a fork of a process that used
Lance crashes at random: :mod:`blobhouse.io.forks`), the same for every contender.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness import Case, Scratch, Size, disk_bytes

KB, MB = 1024, 1024 * 1024
BATCH = 32
ROWS_PER_CLIP = 30
SHARDS = 16  # WebDataset tar shards: at least one per worker
SHUFFLE_BUFFER = 1000  # WebDataset's usual shuffle buffer, in samples
PARQUET_GROUP_BYTES = MB  # row groups small enough for random access (1 MB of payloads)
LIMIT_THREADS = (1, 4, 16)  # the random-read limit is the best of these queue depths
# what the forkserver imports before it forks workers: the readers, not Lance's runtime
PRELOAD = ["torch", "pyarrow.parquet", "lance", "webdataset", "blobhouse.torch", __name__]


@dataclass(frozen=True)
class Workload:
    """Rows of one training read: ``payload(i)`` is row i's bytes, made again for each format."""

    name: str
    payload: Callable[[int], bytes]
    sizes: np.ndarray  # of every row's payload
    unique_bytes: int

    @property
    def rows(self) -> int:
        return len(self.sizes)

    @property
    def logical_bytes(self) -> int:
        return int(self.sizes.sum())

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as batches of about 64 MB."""
        rows = max(1, 64 * MB * self.rows // self.logical_bytes)
        for start in range(0, self.rows, rows):
            ids = range(start, min(start + rows, self.rows))
            yield pa.record_batch(
                {
                    "id": pa.array(ids, pa.int64()),
                    "b": pa.array([self.payload(i) for i in ids], pa.large_binary()),
                }
            )


def images(rows: int, size: int = 100 * KB) -> Workload:
    """Unique ``size`` payloads (incompressible, as encoded images are)."""

    def payload(i: int) -> bytes:
        return np.random.default_rng((7, i)).bytes(size)

    return Workload("images", payload, np.full(rows, size, dtype=np.int64), rows * size)


def clips(distinct: int, low: int, high: int) -> Workload:
    """``distinct`` clips of ``low``..``high`` bytes, each the payload of ROWS_PER_CLIP rows
    (row i carries clip i % distinct: rows sharing a clip are spread over the table)."""
    rng = np.random.default_rng(8)
    made = [rng.bytes(int(n)) for n in rng.integers(low, high + 1, distinct)]
    sizes = np.array([len(made[i % distinct]) for i in range(distinct * ROWS_PER_CLIP)])
    return Workload("clips", lambda i: made[i % distinct], sizes, sum(map(len, made)))


def loader(size: Size) -> Case:
    """The loader case at ``size``."""
    case = Case(
        "loader",
        "One shuffled epoch through torch's DataLoader, batches of 32: each row's payload "
        "reaches a per-row transform as bytes in the reading process (where a decoder would "
        "take it; here it takes the size), the data's files evicted from the page cache "
        "before each epoch. The random-read limit reads the images' bytes from one file in "
        "the epoch's order with os.pread",
    )
    workloads = [
        images(size.loader_images),
        clips(size.loader_clips, *size.loader_clip_bytes),
    ]
    # DataLoader workers fork from a server that imported the readers and never ran Lance
    multiprocessing.set_forkserver_preload(PRELOAD)
    with Scratch() as root:
        for workload in workloads:
            formats = write_formats(workload, root / workload.name)
            limit = _limit(case, workload, formats, size.runs) if workload is workloads[0] else None
            _epochs(case, workload, formats, size, limit)
        _startup(case, root, size.startup_rows, size.runs)
    return case


@dataclass(frozen=True)
class Formats:
    """Where each contender's copy of a workload is."""

    blobhouse: str
    pylance: str
    parquet: str
    shards: list[str]
    flat: str  # every row's payload, one after another: the random-read limit's file

    def of(self, contender: str) -> list[str]:
        """The files ``contender`` reads."""
        return {
            "blobhouse": [self.blobhouse],
            "pylance read_blobs": [self.pylance],
            "parquet": [self.parquet],
            "webdataset": self.shards,
        }[contender]


def write_formats(workload: Workload, root: Path) -> Formats:
    """The workload written as a blobhouse table, a pylance blob v2 dataset, one Parquet file
    and WebDataset tar shards; and, for images, the flat file the limit reads."""
    import webdataset as wds

    from blobhouse import write_table

    root.mkdir(parents=True)
    formats = Formats(
        str(root / "blobhouse"),
        str(root / "pylance"),
        str(root / "rows.parquet"),
        [str(root / f"shard-{k:03d}.tar") for k in range(SHARDS)],
        str(root / "flat.bin"),
    )
    write_table(workload.batches(), formats.blobhouse, blob_columns=["b"])
    lance.write_dataset(_pylance_batches(workload), formats.pylance, data_storage_version="2.2")
    group = max(1, PARQUET_GROUP_BYTES * workload.rows // workload.logical_bytes)
    schema = pa.schema([("id", pa.int64()), ("b", pa.large_binary())])
    with pq.ParquetWriter(formats.parquet, schema) as parquet:
        for batch in workload.batches():
            parquet.write_table(pa.Table.from_batches([batch]), row_group_size=group)
    per_shard = -(-workload.rows // SHARDS)
    for k, path in enumerate(formats.shards):
        with wds.TarWriter(path) as tar:
            for i in range(k * per_shard, min((k + 1) * per_shard, workload.rows)):
                tar.write({"__key__": f"{i:09d}", "bin": workload.payload(i)})
    if workload.name == "images":
        with open(formats.flat, "wb") as flat:
            for i in range(workload.rows):
                flat.write(workload.payload(i))
    os.sync()
    return formats


def _pylance_batches(workload: Workload) -> pa.RecordBatchReader:
    field = lance.blob.blob_field("b")
    schema = pa.schema([pa.field("id", pa.int64()), field])

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in workload.batches():
            payloads = lance.blob.blob_array(batch.column("b").to_pylist())
            yield pa.record_batch([batch.column("id"), payloads], schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


# -- the contenders: a DataLoader per epoch; each row's payload reaches a transform as bytes ---


def payload_size(row: dict) -> int:
    """blobhouse's per-row transform: where a decoder would take the row's payload (bytes in
    the reading process), the bench takes its size, so what is timed is the reading."""
    return len(row["b"])


def sizes(values: list[int]) -> Any:
    """A batch as the training process gets it: the sizes of its payloads."""
    import torch

    return torch.tensor(values, dtype=torch.int64)


def payload_sizes(payloads: list[bytes]) -> Any:
    """The collate of the map-style contenders (each batch a list of payloads)."""
    return sizes([len(p) for p in payloads])


def _sample_sizes(samples: list[tuple[bytes]]) -> Any:
    return sizes([len(sample[0]) for sample in samples])


class _LazyRows:
    """A map-style Dataset of ``rows`` rows at ``path``, opened in the process that reads:
    each batch of indices is one :meth:`take`."""

    def __init__(self, path: str, rows: int) -> None:
        self.path, self.rows, self._source = path, rows, None

    def __len__(self) -> int:
        return self.rows

    def __getitems__(self, indices: list[int]) -> list[bytes]:
        if self._source is None:
            self._source = self.open()
        return self.take(self._source, list(indices))

    def open(self) -> Any:
        raise NotImplementedError

    def take(self, source: Any, indices: list[int]) -> list[bytes]:
        raise NotImplementedError


class PylanceBlobs(_LazyRows):
    """A pylance blob v2 dataset: each batch is one ``read_blobs`` (pylance's reader for
    training loaders)."""

    def open(self) -> Any:
        return lance.dataset(self.path)

    def take(self, source: Any, indices: list[int]) -> list[bytes]:
        return [blob for _, blob in source.read_blobs("b", indices=indices)]


class ParquetRows(_LazyRows):
    """One Parquet file: each batch reads the row groups that hold its rows."""

    def open(self) -> Any:
        return pq.ParquetFile(self.path)

    def take(self, source: Any, indices: list[int]) -> list[bytes]:
        return parquet_take(source, indices)


def parquet_take(parquet: pq.ParquetFile, picks: Iterable[int]) -> list[bytes]:
    """Rows ``picks`` of column ``b``, reading only the row groups that hold them."""
    meta = parquet.metadata
    sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    picks = np.asarray(list(picks), dtype=np.int64)
    groups = np.searchsorted(starts, picks, side="right") - 1
    wanted, slot = np.unique(groups, return_inverse=True)
    table = parquet.read_row_groups(wanted.tolist(), columns=["b"])
    # where each wanted group starts inside ``table``, then each pick inside its group
    rows = np.concatenate([[0], np.cumsum(sizes[wanted])])[slot] + picks - starts[groups]
    return table.column("b").take(rows).to_pylist()


def _data_loader(contender: str, formats: Formats, workload: Workload, workers: int, epoch: int):
    from torch import Generator
    from torch.utils.data import DataLoader, RandomSampler

    context = {"multiprocessing_context": "forkserver"} if workers else {}
    if contender == "blobhouse":
        from blobhouse.torch import TableBatchDataset

        dataset = TableBatchDataset(
            formats.blobhouse,
            ["b"],
            batch_size=BATCH,
            seed=1,
            transform=payload_size,
            collate=sizes,
        )
        dataset.set_epoch(epoch)
        return DataLoader(dataset, batch_size=None, num_workers=workers, **context)
    if contender == "webdataset":
        import webdataset as wds

        dataset = (
            wds.WebDataset(formats.shards, shardshuffle=SHARDS, seed=epoch, empty_check=False)
            .shuffle(SHUFFLE_BUFFER, seed=epoch)
            .to_tuple("bin")
            .batched(BATCH, collation_fn=_sample_sizes)
        )
        return DataLoader(dataset, batch_size=None, num_workers=workers, **context)
    rows = {"pylance read_blobs": PylanceBlobs, "parquet": ParquetRows}[contender]
    path = formats.pylance if contender.startswith("pylance") else formats.parquet
    sampler = RandomSampler(range(workload.rows), generator=Generator().manual_seed(epoch))
    return DataLoader(
        rows(path, workload.rows),
        batch_size=BATCH,
        sampler=sampler,
        collate_fn=payload_sizes,
        num_workers=workers,
        **context,
    )


CONTENDERS = ("blobhouse", "pylance read_blobs", "parquet", "webdataset")


def _epochs(case: Case, workload: Workload, formats: Formats, size: Size, limit) -> None:
    """Every contender at every worker count, ``size.runs`` cold epochs each, alternating."""
    combos = [(c, w) for c in CONTENDERS for w in size.loader_workers]
    seconds: dict[tuple[str, int], list[float]] = {combo: [] for combo in combos}
    # the first batch waits for the DataLoader to start its worker processes: the rate after
    # it is what the reads themselves reach
    firsts: dict[tuple[str, int], list[float]] = {combo: [] for combo in combos}
    after_first: dict[tuple[str, int], list[float]] = {combo: [] for combo in combos}
    disk_read: dict[tuple[str, int], list[int]] = {combo: [] for combo in combos}
    logical = workload.logical_bytes
    for run in range(size.runs):
        order = list(combos)
        np.random.default_rng(run).shuffle(order)
        for contender, workers in order:
            data_loader = _data_loader(contender, formats, workload, workers, epoch=run)
            evict(*formats.of(contender))
            before = _disk_sectors_read()
            started = time.perf_counter()
            samples, nbytes, first_s, first_bytes = _drain(data_loader)
            took = time.perf_counter() - started
            seconds[contender, workers].append(took)
            firsts[contender, workers].append(first_s)
            after_first[contender, workers].append((nbytes - first_bytes) / (took - first_s))
            disk_read[contender, workers].append((_disk_sectors_read() - before) * 512)
            if (samples, nbytes) != (workload.rows, logical):
                raise AssertionError(
                    f"{contender} with {workers} workers delivered {samples} rows, {nbytes} "
                    f"bytes of {workload.rows} rows, {logical} bytes"
                )
    on_disk = {c: sum(disk_bytes(path) for path in formats.of(c)) for c in CONTENDERS}
    for (contender, workers), values in seconds.items():
        median = statistics.median(values)
        others = [statistics.median(seconds[c, workers]) for c in CONTENDERS if c != "blobhouse"]
        case.add(
            workload=f"{workload.name}: {workload.rows:,} rows, {workload.unique_bytes / MB:,.0f}"
            f" MB unique, {logical / MB:,.0f} MB read",
            contender=contender,
            workers=workers,
            seconds=round(median, 3),
            samples_s=round(workload.rows / median, 1),
            mb_s=round(logical / median / 1e6, 1),
            disk_read_mb=round(statistics.median(disk_read[contender, workers]) / 1e6, 1),
            on_disk_mb=round(on_disk[contender] / 1e6, 1),
            vs_best_other=round(min(others) / median, 3) if contender == "blobhouse" else "-",
            vs_limit="-" if limit is None else round(logical / median / 1e6 / limit, 3),
            first_batch_s=round(statistics.median(firsts[contender, workers]), 3),
            after_first_batch_vs_limit="-"
            if limit is None
            else round(statistics.median(after_first[contender, workers]) / 1e6 / limit, 3),
        )


def _drain(data_loader) -> tuple[int, int, float, int]:
    """Rows and bytes ``data_loader`` delivered, the seconds to its first batch and that
    batch's bytes."""
    samples = nbytes = 0
    started, first_s, first_bytes = time.perf_counter(), 0.0, 0
    for batch in data_loader:
        samples += len(batch)
        nbytes += int(batch.sum())
        if not first_s:
            first_s, first_bytes = time.perf_counter() - started, nbytes
    return samples, nbytes, first_s, first_bytes


def _limit(case: Case, workload: Workload, formats: Formats, runs: int) -> float:
    """The machine's random-read limit: every row's payload read from the flat file in a
    shuffled order with ``os.pread`` by 1, 4 and 16 threads, cold; the best MB/s."""
    sizes = workload.sizes
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    best = 0.0
    for threads in LIMIT_THREADS:
        times, reads = [], []
        for run in range(runs):
            order = np.random.default_rng(run).permutation(workload.rows)
            evict(formats.flat)
            before = _disk_sectors_read()
            started = time.perf_counter()
            _pread_all(formats.flat, offsets[order], sizes[order], threads)
            times.append(time.perf_counter() - started)
            reads.append((_disk_sectors_read() - before) * 512)
        median = statistics.median(times)
        mb_s = workload.logical_bytes / median / 1e6
        best = max(best, mb_s)
        case.add(
            workload=f"images: {workload.rows:,} rows",
            contender=f"random-read limit: os.pread, {threads} threads",
            workers="-",
            seconds=round(median, 3),
            samples_s=round(workload.rows / median, 1),
            mb_s=round(mb_s, 1),
            disk_read_mb=round(statistics.median(reads) / 1e6, 1),
            on_disk_mb=round(disk_bytes(formats.flat) / 1e6, 1),
            vs_best_other="-",
            vs_limit="-",
        )
    return best


def _pread_all(path: str, offsets: np.ndarray, sizes: np.ndarray, threads: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = np.array_split(np.arange(len(offsets)), threads)

        def read(rows: np.ndarray) -> int:
            return sum(len(os.pread(fd, int(sizes[r]), int(offsets[r]))) for r in rows)

        with ThreadPoolExecutor(threads) as pool:
            assert sum(pool.map(read, chunks)) == int(sizes.sum())
    finally:
        os.close(fd)


# -- startup: the first batch of a 1 M-row table, in a fresh process ------------------------

STARTUP_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    uri, how = sys.argv[1], sys.argv[2]
    from torch.utils.data import DataLoader
    from blobhouse.loader import BatchLoader
    from blobhouse.torch import TableBatchDataset
    started = time.perf_counter()
    if how == "BatchLoader":
        batches = iter(BatchLoader(uri, batch_size=32))
    else:  # a DataLoader with 2 workers, forked from this process (which has not used Lance)
        batches = iter(DataLoader(TableBatchDataset(uri, batch_size=32), batch_size=None,
                                  num_workers=2))
    next(batches)
    print(json.dumps(time.perf_counter() - started))
    """
)


def _startup(case: Case, root: Path, rows: int, runs: int) -> None:
    """Seconds from making the loader to its first batch on a ``rows``-row table (an id, a
    label and a 1 KB payload from a pool of 1,000), in a fresh process, the table's files out
    of the page cache."""
    from blobhouse import write_table

    uri = str(root / "startup")
    pool = [np.random.default_rng((9, k)).bytes(KB) for k in range(1000)]

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, rows, 50_000):
            ids = np.arange(start, min(start + 50_000, rows))
            yield pa.record_batch(
                {
                    "id": ids,
                    "label": ids % 10,
                    "b": pa.array([pool[i % 1000] for i in ids], pa.large_binary()),
                }
            )

    write_table(batches(), uri, blob_columns=["b"])
    for how, workers in (("BatchLoader", 0), ("DataLoader", 2)):
        times = []
        for _ in range(runs):
            evict(uri)
            done = subprocess.run(
                [sys.executable, "-c", STARTUP_SCRIPT, uri, how],
                check=True,
                capture_output=True,
                text=True,
            )
            times.append(json.loads(done.stdout.strip().splitlines()[-1]))
        median = statistics.median(times)
        case.add(
            workload=f"first batch: {rows:,} rows",
            contender=f"blobhouse {how}",
            workers=workers,
            seconds=round(median, 3),
            samples_s="-",
            mb_s="-",
            disk_read_mb="-",
            on_disk_mb=round(disk_bytes(uri) / 1e6, 1),
            vs_best_other="-",
            vs_limit="-",
        )


# -- the machine ----------------------------------------------------------------------------


def evict(*paths: str | Path) -> None:
    """Take every file under ``paths`` out of the page cache (written out first), so the next
    read of it comes from the disk."""
    os.sync()
    for path in map(Path, paths):
        for file in [path] if path.is_file() else path.rglob("*"):
            if file.is_file():
                fd = os.open(file, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _disk_sectors_read() -> int:
    """Sectors read from every disk since boot (/proc/diskstats; partitions left out)."""
    stats = Path("/proc/diskstats").read_text().splitlines()
    names = {line.split()[2] for line in stats}
    total = 0
    for line in stats:
        fields = line.split()
        name = fields[2]
        whole = not any(name != other and name.startswith(other) for other in names)
        if whole and not name.startswith(("loop", "ram", "dm-")):
            total += int(fields[5])
    return total
