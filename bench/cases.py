"""The benchmark cases. Each builds its data once, runs every contender on it, and records
medians and ratios in a :class:`~bench.harness.Case`."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import blake3
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.dropin_case import lerobot_dropin
from bench.harness import Case, Scratch, Size, disk_bytes, fresh, medians, settled
from bench.loader_case import loader, parquet_take
from bench.robot_case import robot_video
from blobhouse import Blob, blob_array, open_table, read_ranges, write_table
from blobhouse.cli.demo import BLOB_COLUMNS, EpisodeData
from blobhouse.dedup import content_hashes
from blobhouse.files.ranges import plan_reads, refs_from_arrow
from blobhouse.io.objects import checked_options, object_store
from blobhouse.options import DEFAULT_MAX_ROWS_PER_FILE
from blobhouse.store.index_maintenance import maintain_index
from blobhouse.store.index_part import INDEX_SCHEMA, maintain_part
from blobhouse.store.packs import index_uri
from blobhouse.testing import LocalS3Server
from blobhouse.values import LogicalColumn

KB, MB = 1024, 1024 * 1024
# the batch sizes a plain large_binary column is written at: it shares a value within a page
PLAIN_BATCHES = (1024, 8)


QUICK = Size(
    "quick",
    1,  # a smoke run: every case end to end, one round without a warm-up (the full run: 5)
    100,
    10,
    90,
    20,
    16 * MB,
    60,
    (10_000, 40_000),
    (0.03, 0.12),
    (0.06, 0.24),
    (4, 12),
    400,
    64 * MB,
    4,
    16,
    200,
    100_000,
    320,
    16,
    (64 * KB, 256 * KB),
    (0, 2),
    20_000,
    2,
    90,
    (48, 64),
    1,
    2,
    (8, 256 * KB),
    ((2, 4), (2,)),
    120,
)
FULL = Size(
    "full",
    5,
    1000,
    50,
    1800,
    200,
    256 * MB,
    1000,
    (10_000, 100_000, 1_000_000, 10_000_000),
    (1.0, 2.0, 4.0, 8.0),
    (1.0, 4.0, 16.0, 64.0),
    (10, 100, 500, 2000, 10_000),  # the target spans 10 to 2,000 (bench/report.py)
    8000,
    1024 * MB,
    24,
    128,
    5000,
    1_000_000,
    10_240,
    32,
    (1 * MB, 4 * MB),
    (0, 2, 4),
    1_000_000,
    20,
    300,
    (240, 320),
    2,
    16,
    (24, 512 * KB),
    ((2, 4, 8), (2, 4, 8)),
    9000,
)


def rng_bytes(rng: np.random.Generator, size: int) -> bytes:
    return rng.bytes(size)


def lance_table(payloads: list[bytes | None]) -> pa.Table:
    """The same payloads as pylance's own blob v2 input."""
    field = lance.blob.blob_field("b")
    return pa.table({"b": lance.blob.blob_array(payloads)}, schema=pa.schema([field]))


def storage(size: Size) -> Case:
    """Bytes on disk for four workloads, against the unique bytes (the physical limit)."""
    case = Case("storage", "Bytes on disk per contender; ratio = bytes / unique payload bytes")
    rng = np.random.default_rng(1)
    seed = rng_bytes(rng, 6 * MB)
    distinct = [rng_bytes(rng, MB) for _ in range(size.distinct_payloads)]
    drawn = [distinct[i % len(distinct)] for i in range(size.distinct_rows)]
    random.Random(2).shuffle(drawn)
    unique = [rng_bytes(rng, MB) for _ in range(size.unique_rows)]
    workloads = {
        "seed: 20 rows x one 6 MB payload": ([seed] * 20, [1] * 20),
        f"{size.distinct_rows} rows from {size.distinct_payloads} distinct 1 MB": (drawn, None),
        f"{size.unique_rows} unique 1 MB rows": (unique, None),
    }
    with Scratch() as root:
        for label, (payloads, ref_ids) in workloads.items():
            unique_bytes = sum(len(p) for p in {bytes(p) for p in payloads})
            sizes = _storage_contenders(root, payloads, ref_ids)
            for contender, nbytes in sizes.items():
                case.add(
                    workload=label,
                    contender=contender,
                    bytes=nbytes,
                    ratio_to_unique=round(nbytes / unique_bytes, 3),
                )
        episodes = _episode_storage(root, size.episodes_rows)
        for contender, (nbytes, unique_bytes) in episodes.items():
            case.add(
                workload=f"robot episodes ({size.episodes_rows} frames)",
                contender=contender,
                bytes=nbytes,
                ratio_to_unique=round(nbytes / unique_bytes, 3),
            )
    return case


def _storage_contenders(root: Path, payloads: list[bytes], ref_ids: list[int] | None) -> dict:
    binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
    out = {}
    if ref_ids is not None:
        rows = [Blob(data=p, ref_id=r) for p, r in zip(payloads, ref_ids, strict=True)]
        write_table(pa.table({"b": blob_array(rows)}), fresh(root / "bh_ref"), dedup="ref_id")
        out["blobhouse ref_id"] = disk_bytes(root / "bh_ref")
    write_table(binary, fresh(root / "bh"), blob_columns=["b"])  # the default: global
    out["blobhouse"] = disk_bytes(root / "bh")
    write_table(binary, fresh(root / "bh_file"), blob_columns=["b"], dedup="content")
    out["blobhouse content"] = disk_bytes(root / "bh_file")
    lance.write_dataset(lance_table(payloads), fresh(root / "pylance"), data_storage_version="2.2")
    out["pylance"] = disk_bytes(root / "pylance")
    # plain large_binary columns: their dictionary pages share a value within a page only,
    # so what they store depends on how the rows arrive
    db = _lancedb().connect(str(fresh(root / "lancedb")))
    lancedb_sizes = {}
    for rows_per_batch in PLAIN_BATCHES:
        plain = fresh(root / f"plain{rows_per_batch}")
        _write_plain(binary, rows_per_batch, plain)
        out[f"pylance large_binary, batches of {rows_per_batch}"] = disk_bytes(plain)
        db.create_table(f"t{rows_per_batch}", data=_batched(binary, rows_per_batch))
        lancedb_sizes[f"lancedb large_binary, batches of {rows_per_batch}"] = disk_bytes(
            root / "lancedb" / f"t{rows_per_batch}.lance"
        )
    out.update(lancedb_sizes)
    pq.write_table(binary, fresh(root / "default.parquet"))
    out["parquet"] = disk_bytes(root / "default.parquet")
    pq.write_table(binary, fresh(root / "nodict.parquet"), use_dictionary=False)
    out["parquet, no dictionary"] = disk_bytes(root / "nodict.parquet")
    return out


def _episode_storage(root: Path, rows: int) -> dict[str, tuple[int, int]]:
    data = EpisodeData(rows)
    unique = sum(len(data.chunk(c)) for c in range(data.chunks))
    unique += sum(len(data.calibration(e)) for e in range((rows - 1) // 300 + 1))
    unique += sum(len(data.thumbnail(r)) for r in range(rows))
    write_table(
        data.batches_for(range(data.chunks)),
        fresh(root / "ep_bh"),
        blob_columns=list(BLOB_COLUMNS),
        ref_id_columns={"video": "video_chunk"},
        dedup={"video": "ref_id", "calibration": "content", "thumbnail": "content"},
    )
    out = {"blobhouse": (disk_bytes(root / "ep_bh"), unique)}
    schema = pa.schema(
        [
            lance.blob.blob_field(c) if c in BLOB_COLUMNS else f
            for c, f in zip(_episode_schema().names, _episode_schema(), strict=True)
        ]
    )
    lance_batches = (
        pa.record_batch(
            [
                lance.blob.blob_array(b.column(c).to_pylist()) if c in BLOB_COLUMNS else b.column(c)
                for c in b.schema.names
            ],
            schema=schema,
        )
        for b in data.batches_for(range(data.chunks))
    )
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, lance_batches),
        fresh(root / "ep_lance"),
        data_storage_version="2.2",
    )
    out["pylance"] = (disk_bytes(root / "ep_lance"), unique)
    writer = pq.ParquetWriter(fresh(root / "ep.parquet"), _episode_schema())
    for batch in data.batches_for(range(data.chunks)):
        writer.write_batch(batch)
    writer.close()
    out["parquet"] = (disk_bytes(root / "ep.parquet"), unique)
    return out


def _episode_schema() -> pa.Schema:
    return next(iter(EpisodeData(1).batches_for(range(1)))).schema


def write_throughput(size: Size) -> Case:
    """Logical and physical MB/s writing unique and 20x duplicated payloads."""
    case = Case("write_throughput", "Median write seconds; MB/s of logical (row) bytes")
    rng = np.random.default_rng(3)
    workloads = {}
    for payload in (4 * KB, 10 * KB, 100 * KB, MB, 10 * MB):
        count = max(2, size.write_bytes // payload)
        workloads[f"unique {payload // KB} KB"] = [rng_bytes(rng, payload) for _ in range(count)]
    # 4x the bytes of the unique workloads: the fixed cost of a write (open, commit) must not
    # hide the rate at which duplicates are recognized, which the blake3 limit measures
    distinct = [rng_bytes(rng, MB) for _ in range(max(1, 4 * size.write_bytes // MB // 20))]
    workloads["20x duplicated 1 MB"] = [p for p in distinct for _ in range(20)]
    # more rounds than other cases: a write of 0.1 s now and then stalls in the kernel for
    # 0.2-0.8 s (page-cache writes right after a big deletion), for any contender
    runs = 2 * size.runs - 1
    with Scratch() as root:
        for label, payloads in workloads.items():
            for durable in (False, True):
                _write_workload(case, root, label, payloads, runs, durable)
    case.notes.append(
        "durable = the timing includes os.sync(), i.e. the bytes reach the disk; without it the "
        "page cache absorbs writes at several GB/s and blake3 (see machine) bounds dedup"
    )
    return case


def _write_workload(
    case: Case, root: Path, label: str, payloads: list[bytes], runs: int, durable: bool
) -> None:
    logical = sum(len(p) for p in payloads)
    binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
    lance_input = lance_table(payloads)
    outputs = {
        "blobhouse": root / "bh",
        "blobhouse, per-file dedup": root / "bh_file",
        "blobhouse, dedup off": root / "bh_off",
        "pylance": root / "pl",
        **{f"pylance large_binary, batches of {n}": root / f"plain{n}" for n in PLAIN_BATCHES},
        "lancedb large_binary": root / "lancedb" / "t.lance",
        "parquet": root / "p.parquet",
    }
    db = _lancedb().connect(str(root / "lancedb"))
    writes = {
        # the default: dedup="global", each payload once for the whole table
        "blobhouse": lambda: write_table(binary, outputs["blobhouse"], blob_columns=["b"]),
        # the default before table properties: dedup="content", each payload once per file
        "blobhouse, per-file dedup": lambda: write_table(
            binary, outputs["blobhouse, per-file dedup"], blob_columns=["b"], dedup="content"
        ),
        "blobhouse, dedup off": lambda: write_table(
            binary, outputs["blobhouse, dedup off"], blob_columns=["b"], dedup="off"
        ),
        "pylance": lambda: lance.write_dataset(
            lance_input, outputs["pylance"], data_storage_version="2.2"
        ),
        "parquet": lambda: pq.write_table(binary, outputs["parquet"]),
    }
    # plain large_binary columns, timed in rounds of their own: one writes every copy of the
    # duplicates (1 GB, 4 s), whose deletion before the next round slowed the writes after
    # it 1.5-2x (the kernel reclaiming the freed pages)
    plain = {
        **{
            f"pylance large_binary, batches of {n}": functools.partial(
                _write_plain, binary, n, outputs[f"pylance large_binary, batches of {n}"]
            )
            for n in PLAIN_BATCHES
        },
        "lancedb large_binary": lambda: db.create_table("t", data=binary),
    }
    if label.startswith("20x") and not durable:
        # the limit when every logical byte is hashed once: blake3 on every core over the
        # bytes the write reads, the column's one buffer (hashing the Python payloads instead,
        # 20 references to each of 51 objects, runs in the CPU cache: 1.4x faster)
        column = LogicalColumn(binary.column("b").combine_chunks(), "b")
        views = [column.payload(row) for row in column.data_rows()]
        writes["blake3, all cores (the limit)"] = lambda: content_hashes(views)
    times = {}
    for group in (writes, plain):
        timed = {name: _then_sync(fn, durable) for name, fn in group.items()}
        times.update(medians(timed, runs, before=settled(outputs)))
    physical = {name: disk_bytes(path) for name, path in outputs.items()}
    for contender, seconds in times.items():
        case.add(
            workload=label,
            durable=durable,
            contender=contender,
            seconds=round(seconds, 4),
            bytes=physical.get(contender, "-"),
            logical_mb_s=round(logical / seconds / 1e6, 1),
            physical_mb_s=(
                round(physical[contender] / seconds / 1e6, 1) if contender in physical else "-"
            ),
            vs_pylance=round(times["pylance"] / seconds, 3),
            vs_per_file=round(times["blobhouse, per-file dedup"] / seconds, 3),
        )


def _batched(table: pa.Table, rows: int) -> pa.RecordBatchReader:
    """``table`` as it arrives in batches of ``rows``: a plain large_binary column shares a
    value only inside a page, so what it stores depends on how the rows arrive."""
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=rows))


def _write_plain(table: pa.Table, rows: int, uri: Path) -> None:
    lance.write_dataset(_batched(table, rows), uri, data_storage_version="2.2")


def _then_sync(write, durable: bool):
    def run():
        write()
        if durable:
            os.sync()

    return run


def random_access(size: Size) -> Case:
    """Latency of reading the blobs of K random rows of a table of 1 MB blobs."""
    case = Case("random_access", "Median seconds to read K random rows' 1 MB blobs")
    rng = np.random.default_rng(4)
    payloads = [rng_bytes(rng, MB) for _ in range(size.access_rows)]
    with Scratch() as root:
        binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
        table = write_table(binary, str(root / "bh"), blob_columns=["b"])
        lance.write_dataset(lance_table(payloads), root / "pl", data_storage_version="2.2")
        # unique payloads: how the rows arrive changes nothing a plain column stores or reads
        lance.write_dataset(binary, root / "plain", data_storage_version="2.2")
        others = {
            "stock": lance.dataset(str(root / "pl")),
            "plain": lance.dataset(str(root / "plain")),
            "lancedb": _lancedb().connect(str(root / "lancedb")).create_table("t", data=binary),
        }
        pq.write_table(binary, root / "p.parquet")
        parquet = pq.ParquetFile(root / "p.parquet")
        for k in (1, 100, 1000):
            if k <= size.access_rows:
                picks = sorted(random.Random(k).sample(range(size.access_rows), k))
                _access(case, table, others, parquet, picks, size.runs)
    return case


def _access(
    case: Case, table, others: dict, parquet: pq.ParquetFile, picks: list[int], runs: int
) -> None:
    refs = refs_from_arrow(table.blob_refs("b", picks))
    stock, plain, other = others["stock"], others["plain"], others["lancedb"]
    times = medians(
        {
            # the raw ranged reads: the references' recorded hashes left unchecked
            "blobhouse refs + ranged reads": lambda: read_ranges(refs, check_hashes=False),
            "blobhouse read_blobs": lambda: table.read_blobs("b", picks),
            'blobhouse take blobs="bytes"': lambda: table.take(picks, columns=["b"], blobs="bytes"),
            "pylance read_blobs": lambda: stock.read_blobs("b", indices=picks),
            "pylance take, large_binary column": lambda: plain.take(picks, columns=["b"]),
            "lancedb take_offsets, large_binary": lambda: other.take_offsets(picks).to_arrow(),
        },
        runs,
    )
    # Parquet reads whole row groups (all 1 GB at K = 1) and runs on its own: the first Lance
    # call after it was measured 5-15x slower (pylance's read_blobs of one row: 8-10 ms instead
    # of 0.6-0.8 ms), whichever contender made it
    times.update(medians({"parquet row groups": lambda: parquet_take(parquet, picks)}, runs))
    k = len(picks)
    for contender, seconds in times.items():
        case.add(
            k=k,
            contender=contender,
            seconds=round(seconds, 5),
            ms_per_row=round(seconds / k * 1e3, 3),
            mb_s=round(k * MB / seconds / 1e6, 1),
            vs_pylance=round(times["pylance read_blobs"] / seconds, 3),
            vs_large_binary=round(times["pylance take, large_binary column"] / seconds, 3),
            vs_parquet=round(times["parquet row groups"] / seconds, 3),
        )


#: the checked loader's shapes: batch size, an ``id`` column beside the blob, the loader made
#: once (as a training loop makes it) or anew each epoch
LOADER_SHAPES = (
    (32, False, True),
    (16, True, True),
    (64, True, True),
    (256, True, True),
    (64, False, True),
    (64, True, False),
)


def checked_loader(size: Size) -> Case:
    """One shuffled epoch of 100 KB images in this process, page cache warm, in each of
    :data:`LOADER_SHAPES`: BatchLoader with its hash check, without it, and a plain loop of
    pylance's read_blobs (and its take of the ``id`` column, when the shape has one) over the
    same batches (the loader's own batch order)."""
    case = Case(
        "checked_loader",
        "Median seconds of one shuffled epoch of 100 KB images, page cache warm, in this "
        "process (0 workers; the loader case measures cold epochs with workers), by batch "
        "size, with and without an id column beside the blob, the loader made once or per epoch",
    )
    rows = size.loader_images
    payloads = [np.random.default_rng((11, i)).bytes(100 * KB) for i in range(rows)]
    ids = pa.array(range(rows), pa.int64())
    with Scratch() as root:
        uri = str(root / "bh")
        write_table(pa.table({"id": ids, "b": blob_array(payloads)}), uri)
        stock_table = lance_table(payloads).add_column(0, "id", ids)
        lance.write_dataset(stock_table, root / "pl", data_storage_version="2.2")
        stock = lance.dataset(str(root / "pl"))
        for batch_size, with_id, made_once in LOADER_SHAPES:
            times = _checked_epochs(uri, stock, rows, batch_size, with_id, made_once, size.runs)
            columns = "id + blob" if with_id else "blob"
            made = "made once" if made_once else "made per epoch"
            for contender, seconds in times.items():
                case.add(
                    workload=f"{rows:,} x 100 KB, warm, batches of {batch_size}, {columns}, {made}",
                    batch_size=batch_size,
                    columns=columns,
                    loader=made,
                    contender=contender,
                    seconds=round(seconds, 4),
                    mb_s=round(rows * 100 * KB / seconds / 1e6, 1),
                    vs_pylance=round(times["pylance read_blobs loop"] / seconds, 3),
                )
    return case


def _checked_epochs(
    uri: str,
    stock: lance.LanceDataset,
    rows: int,
    batch_size: int,
    with_id: bool,
    made_once: bool,
    runs: int,
) -> dict[str, float]:
    """Median seconds of an epoch of each contender for one shape of :func:`checked_loader`."""
    from blobhouse.loader import BatchLoader, EpochPlan

    columns = ["id", "b"] if with_id else ["b"]
    # the loader's own order (rows are positions: one fragment, nothing deleted)
    plan = EpochPlan.of(
        rows,
        batch_size=batch_size,
        seed=3,
        epoch=0,
        shuffle=True,
        world_size=1,
        rank=0,
        drop_last=False,
    )
    batches = [sorted(plan.batch(i).tolist()) for i in range(len(plan))]

    def loader(check: bool) -> BatchLoader:
        return BatchLoader(uri, columns=columns, batch_size=batch_size, seed=3, check_hashes=check)

    kept = {check: loader(check) for check in (True, False)}

    def epoch(check: bool) -> None:
        chosen = kept[check] if made_once else loader(check)
        assert sum(b.num_rows for b in chosen) == rows

    def pylance_loop() -> None:
        read = 0
        for batch in batches:
            if with_id:
                stock.take(batch, columns=["id"])
            read += len(stock.read_blobs("b", indices=batch))
        assert read == rows

    return medians(
        {
            "blobhouse BatchLoader, checked": lambda: epoch(True),
            "blobhouse BatchLoader, unchecked": lambda: epoch(False),
            "pylance read_blobs loop": pylance_loop,
        },
        runs,
    )


def _lancedb():
    """LanceDB (a dev dependency), imported where a case compares with it."""
    import lancedb

    return lancedb


def small_blobs(size: Size) -> Case:
    """Latency of reading K random rows' small blobs (5-64 KB: thumbnails, audio snippets)
    against pylance's take of a plain large_binary column holding the same bytes."""
    case = Case("small_blobs", "Median seconds to read K random rows' 5-64 KB blobs")
    rows = size.access_rows * 20
    rng = np.random.default_rng(5)
    payloads = [rng_bytes(rng, int(n)) for n in rng.integers(5 * KB, 64 * KB, rows)]
    with Scratch() as root:
        binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
        table = write_table(binary, str(root / "bh"), blob_columns=["b"])
        lance.write_dataset(binary, root / "plain", data_storage_version="2.2")
        lance.write_dataset(lance_table(payloads), root / "pl", data_storage_version="2.2")
        plain, stock = lance.dataset(str(root / "plain")), lance.dataset(str(root / "pl"))
        other = _lancedb().connect(str(root / "lancedb")).create_table("t", data=binary)
        for k in (1, 64, 1000):
            # a fresh draw per call, as a training loop's rows are: nothing is read twice
            draws = [
                sorted(random.Random(k * 1000 + i).sample(range(rows), k))
                for i in range(64 if size.name == "full" else 8)  # a smoke run: fewer
            ]
            names = ("bh", "bh_take", "plain", "stock", "ldb")
            nth = {name: itertools.cycle(draws) for name in names}
            contenders = {
                "blobhouse read_blobs": lambda n=nth: table.read_blobs("b", next(n["bh"])),
                # an Arrow array, as pylance's take returns: no Python object per blob
                'blobhouse take, blobs="bytes"': lambda n=nth: table.take(
                    next(n["bh_take"]), columns=["b"], blobs="bytes"
                ),
                "pylance take, large_binary column": lambda n=nth: plain.take(
                    next(n["plain"]), columns=["b"]
                ),
                "pylance read_blobs, blob column": lambda n=nth: stock.read_blobs(
                    "b", indices=next(n["stock"])
                ),
                "lancedb take_offsets, large_binary": lambda n=nth: other.take_offsets(
                    next(n["ldb"])
                ).to_arrow(),
            }
            # a training loop's steady state: each contender reads every draw once first (so
            # blobhouse has kept the fragment's references: Lance's takes there cost as much
            # as reading them whole after ~30 reads of one row)
            for read in contenders.values():
                for _ in draws:
                    read()
            times = medians(contenders, 5 * size.runs)  # reads of 0.1-1 ms: more rounds
            for contender, seconds in times.items():
                case.add(
                    k=k,
                    contender=contender,
                    seconds=round(seconds, 6),
                    vs_large_binary=round(times["pylance take, large_binary column"] / seconds, 3),
                )
    return case


FIRST_CALL_ROWS = 64  # rows a first call reads, drawn at random
FIRST_CALL_SMALL = 10  # rows a fragment of the many-fragment tables holds

FIRST_CALL_SCRIPT = textwrap.dedent(
    f"""
    import json, random, sys, time
    import lance, numpy as np, pyarrow as pa
    import blobhouse
    contender, root, moment = sys.argv[1:4]
    seed, rows = map(int, sys.argv[4:6])
    layout = sys.argv[6]  # "" (one fragment) or "_small" (fragments of FIRST_CALL_SMALL rows)
    draws = [sorted(random.Random(seed * 1000 + i).sample(range(rows), {FIRST_CALL_ROWS}))
             for i in range(21)]
    if contender == "blobhouse":
        table = blobhouse.open_table(root + "/bh" + layout)
        read = lambda t, r: t.read_blobs("b", r)
    else:
        table = lance.dataset(root + "/plain" + layout)
        read = lambda t, r: t.take(r, columns=["b"])
    if moment == "new version":  # reads of a version in a training loop, then an append
        for draw in draws[1:]:
            read(table, draw)
        rng = np.random.default_rng(seed)
        fresh = [rng.bytes(5 << 10) for _ in range(64)]
        new = pa.table({{"b": pa.array(fresh, pa.large_binary())}})
        if contender == "blobhouse":
            table = blobhouse.write_table(new, root + "/bh" + layout, mode="append")
        else:
            table = lance.write_dataset(new, root + "/plain" + layout, mode="append",
                                        data_storage_version="2.2")
    started = time.perf_counter()
    read(table, draws[0])
    print(json.dumps({{"seconds": time.perf_counter() - started}}))
    """
)


def first_call(size: Size) -> Case:
    """The first read of 64 random 5-64 KB rows: in a fresh process (after the table is
    opened), and on the new version an append returns in a process that read the old one;
    blobhouse's read_blobs (checked) against pylance's take of a plain large_binary column.
    Each on a table of one fragment, and on the same rows in fragments of
    ``FIRST_CALL_SMALL`` rows (a table grown by small appends: a file each to open)."""
    case = Case(
        "first_call",
        "Median seconds of the first read of 64 random 5-64 KB rows, each in a fresh process",
    )
    rows = size.access_rows * 20
    rng = np.random.default_rng(6)
    payloads = [rng_bytes(rng, int(n)) for n in rng.integers(5 * KB, 64 * KB, rows)]
    processes = 9 if size.name == "full" else 1
    with Scratch() as root:
        binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
        for layout, per_file in (("", None), ("_small", FIRST_CALL_SMALL)):
            files = {} if per_file is None else {"max_rows_per_file": per_file}
            write_table(binary, str(root / f"bh{layout}"), blob_columns=["b"], **files)
            plain = root / f"plain{layout}"
            lance.write_dataset(binary, plain, data_storage_version="2.2", **files)
        os.sync()  # the tables' writeback done before any is read (it slowed the first runs)
        for layout, moment in itertools.product(("", "_small"), ("fresh process", "new version")):
            fragments = len(lance.dataset(root / f"plain{layout}").get_fragments())
            seconds = {"blobhouse read_blobs": [], "pylance take, large_binary column": []}
            for run in range(processes):  # alternating, as medians() does
                for contender, out in seconds.items():
                    name = contender.split()[0]
                    argv = [sys.executable, "-c", FIRST_CALL_SCRIPT, name, str(root), moment]
                    done = subprocess.run(  # rows drawn among the first: always there
                        [*argv, str(run), str(rows), layout],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    out.append(json.loads(done.stdout)["seconds"])
            pylance = statistics.median(seconds["pylance take, large_binary column"])
            for contender, values in seconds.items():
                median = statistics.median(values)
                case.add(
                    moment=moment,
                    fragments=fragments,
                    k=FIRST_CALL_ROWS,
                    contender=contender,
                    seconds=round(median, 5),
                    vs_pylance=round(pylance / median, 3),
                )
    return case


#: rows of the tiny_rows table, and rows a file of it holds (full: Lance's default file size)
TINY_ROWS = {"quick": (20_000, 10_000), "full": (2 << 20, 1 << 20)}
TINY_READS = {"quick": 30, "full": 300}  # reads of 64 random rows each process makes
TINY_BYTES = 100

TINY_ROWS_SCRIPT = textwrap.dedent(
    f"""
    import json, random, sys, time
    import lance
    import blobhouse
    contender, root, seed, reads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if contender == "pylance":
        table = lance.dataset(root + "/plain")
        read = lambda r: table.take(r, columns=["b"])
    else:
        table = blobhouse.open_table(root + "/bh")
        if contender == "read_blobs":
            read = lambda r: table.read_blobs("b", r)
        else:
            read = lambda r: table.take(r, columns=["b"], blobs="bytes")
    rows = table.count_rows()
    rng = random.Random(seed)
    seconds = []
    for _ in range(reads):  # a fresh draw per read, as a training loop's rows are
        draw = sorted(rng.sample(range(rows), {FIRST_CALL_ROWS}))
        started = time.perf_counter()
        read(draw)
        seconds.append(time.perf_counter() - started)
    print(json.dumps(seconds))
    """
)


def tiny_rows(size: Size) -> Case:
    """Checked reads of 64 random rows of 100-byte payloads, in files of Lance's default 1 Mi
    rows (metadata-sized values: captions, labels, embeddings' ids), each contender in fresh
    processes: the first read, the process's first reads together (the rows' references and
    recorded hashes are kept in memory once reads have paid for it) and the steady state after,
    against pylance's take of a plain large_binary column."""
    case = Case(
        "tiny_rows",
        "Checked reads of 64 random 100-byte rows in 1 Mi-row files, each in fresh processes",
    )
    rows, per_file = TINY_ROWS[size.name]
    reads = TINY_READS[size.name]
    processes = 3 if size.name == "full" else 1
    rng = np.random.default_rng(8)
    block = rng.bytes(rows * TINY_BYTES)
    payloads = pa.array(
        [block[i * TINY_BYTES : (i + 1) * TINY_BYTES] for i in range(rows)], pa.large_binary()
    )
    contenders = {
        "blobhouse read_blobs": "read_blobs",
        'blobhouse take, blobs="bytes"': "take",
        "pylance take, large_binary column": "pylance",
    }
    with Scratch() as root:
        binary = pa.table({"b": payloads})
        write_table(binary, str(root / "bh"), blob_columns=["b"], max_rows_per_file=per_file)
        lance.write_dataset(
            binary, root / "plain", data_storage_version="2.2", max_rows_per_file=per_file
        )
        os.sync()
        runs: dict[str, list[list[float]]] = {name: [] for name in contenders}
        for run in range(processes):  # alternating, as medians() does
            for name, argv in contenders.items():
                done = subprocess.run(
                    [sys.executable, "-c", TINY_ROWS_SCRIPT, argv, str(root), str(run), str(reads)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[name].append(json.loads(done.stdout))
    phases = {
        "first read": lambda s: s[0],
        f"first {reads} reads": sum,
        "steady state (a read, the last half)": lambda s: statistics.median(s[len(s) // 2 :]),
    }
    for phase, measure in phases.items():
        seconds = {n: statistics.median(measure(s) for s in r) for n, r in runs.items()}
        pylance = seconds["pylance take, large_binary column"]
        for name, value in seconds.items():
            case.add(
                phase=phase,
                rows=rows,
                rows_per_file=per_file,
                contender=name,
                seconds=round(value, 6),
                vs_pylance=round(pylance / value, 3),
            )
    return case


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec
PEAK_RSS = """
def peak_rss_mb():
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024
"""

SCALE_DUPLICATES = 32  # each payload of the duplicated-bytes curve is in 32 rows

SCALE_SCRIPT = PEAK_RSS + textwrap.dedent(
    f"""
    import json, sys, time
    import numpy as np, pyarrow as pa
    from blobhouse import write_table
    uri, mode, amount = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rng = np.random.default_rng(5)
    block = rng.bytes(1 << 20)
    DUP = {SCALE_DUPLICATES}

    def rows(n):  # small rows: ids, a timestamp and a 100-byte blob (1,000 distinct)
        small = pa.array([block[i % 1000 : i % 1000 + 100] for i in range(50_000)], pa.binary())
        for start in range(0, n, 50_000):
            m = min(50_000, n - start)
            ids = np.arange(start, start + m)
            yield pa.record_batch({{"id": ids, "ts": ids * 0.033, "b": small.slice(0, m)}})

    def payloads(first, count):  # distinct 1 MB payloads: a counter, then the block
        return pa.array([(first + i).to_bytes(8, "little") + block[8:] for i in range(count)],
                        pa.large_binary())

    def gigabytes(gb):  # 1 MB payloads, all different, streamed in 64 MB batches
        total = int(gb * 1024)
        for start in range(0, total, 64):
            m = min(64, total - start)
            yield pa.record_batch({{"id": np.arange(start, start + m),
                                   "b": payloads(start, m)}})

    def duplicated(gb):  # 1 MB payloads each in DUP rows: 32 distinct ones, batched DUP times
        total = int(gb * 1024)
        for group in range(0, total, 32 * DUP):
            distinct = payloads(group, 32)
            for start in range(group, min(group + 32 * DUP, total), 32):
                m = min(32, total - start)
                yield pa.record_batch({{"id": np.arange(start, start + m),
                                       "b": distinct.slice(0, m)}})

    source = {{"rows": lambda: rows(int(amount)), "gb": lambda: gigabytes(amount),
              "dup_gb": lambda: duplicated(amount)}}[mode]()
    started = time.perf_counter()
    write_table(source, uri, blob_columns=["b"])
    seconds = time.perf_counter() - started
    print(json.dumps({{"seconds": seconds, "peak_rss_mb": peak_rss_mb()}}))
    """
)

# one maintenance operation on a table in a fresh process; read-only ones are repeated (up to
# 5 runs, while under a second in all) and the median taken
SCALE_OPERATION_SCRIPT = PEAK_RSS + textwrap.dedent(
    """
    import json, statistics, sys, time
    from datetime import timedelta
    import lance
    uri, operation = sys.argv[1], sys.argv[2]

    def walk_versions():  # what any walk of every version costs in Lance itself
        for v in lance.dataset(uri).versions():
            for fragment in lance.dataset(uri, version=v["version"]).get_fragments():
                fragment.metadata

    if operation.startswith("pylance"):
        operations = {
            "pylance count_rows": (lambda: lance.dataset(uri).count_rows(), True),
            "pylance open every version": (walk_versions, True),
            "pylance cleanup_old_versions": (
                lambda: lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0)), False),
            "pylance compact_files": (
                lambda: lance.dataset(uri).optimize.compact_files(), False),
        }
    else:
        from blobhouse import open_table
        zero = timedelta(0)
        operations = {
            "stats": (lambda: open_table(uri).stats(), True),
            "verify": (lambda: open_table(uri).verify(), True),
            "verify deep": (lambda: open_table(uri).verify(deep=True), True),
            "gc": (lambda: open_table(uri).gc(older_than=zero, grace=zero), False),
            "compact": (lambda: open_table(uri).compact(), False),
        }
    run, repeatable = operations[operation]
    samples = []
    while not samples or (repeatable and len(samples) < 5 and sum(samples) < 1.0):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    print(json.dumps({"seconds": statistics.median(samples), "peak_rss_mb": peak_rss_mb()}))
    """
)

# each blobhouse operation of the versions curve, and pylance's nearest one
SCALE_OPERATIONS = {
    "stats": "pylance count_rows",
    "verify": "pylance open every version",
    "verify deep": None,
    "gc": "pylance cleanup_old_versions",
    "compact": "pylance compact_files",
}
SCALE_MUTATING = ("gc", "compact", "pylance cleanup_old_versions", "pylance compact_files")
SCALE_DEEP_UP_TO = 100  # deep verify reads every payload: measured at the small end only


def scale(size: Size) -> Case:
    """How writes grow, each point in a fresh process: streamed writes as rows, unique bytes
    and duplicated bytes grow (the services' curve is the ``versions`` case). Seconds per unit
    and peak RSS should stay flat."""
    case = Case(
        "scale",
        "Growth curves, each point in a fresh process: seconds, seconds per unit and peak RSS",
    )
    with Scratch() as root:
        curves = (
            ("rows", size.scale_rows, "1M rows"),
            ("gb", size.scale_gb, "GB"),
            ("dup_gb", size.scale_dup_gb, "GB"),
        )
        for mode, amounts, unit in curves:
            for amount in amounts:
                if not _fits(case, root, mode, amount):
                    continue
                result = _scale_run(SCALE_SCRIPT, str(fresh(root / "t")), mode, str(amount))
                units = amount / 1e6 if mode == "rows" else amount
                _scale_row(case, mode, "write", "blobhouse", amount, unit, units, result)
    case.notes += _scale_notes(case)
    return case


def versions(size: Size) -> Case:
    """How stats, verify, gc and compaction grow as fragments and versions grow (one table
    grown by appends, each operation in a fresh process), against pylance's nearest
    operations. Seconds per fragment and peak RSS should stay flat."""
    case = Case(
        "versions",
        "Maintenance as fragments and versions grow, each point in a fresh process: seconds, "
        "seconds per fragment and peak RSS",
    )
    with Scratch() as root:
        _version_curve(case, root, size.scale_versions)
    case.notes += _scale_notes(case)
    return case


def _fits(case: Case, root: Path, mode: str, amount: float) -> bool:
    """Whether the disk has room for a point of a write curve (its physical bytes, 1 GB to
    spare); a point that does not fit is left out and said so in the notes."""
    physical = {"rows": amount * 150, "gb": amount * 2**30, "dup_gb": amount * 2**30 / 32}
    free = shutil.disk_usage(root).free
    if physical[mode] + 2**30 <= free:
        return True
    case.notes.append(
        f"{mode} {amount} left out: it needs ~{physical[mode] / 2**30:.1f} GB on disk and "
        f"{free / 2**30:.1f} GB were free"
    )
    return False


def _scale_run(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"scale point {args[1:]} failed: {out.stderr[-2000:]}")
    return _last_json(out.stdout)


def _scale_row(case, mode, operation, contender, amount, unit, units, result) -> None:
    case.add(
        mode=mode,
        operation=operation,
        contender=contender,
        amount=amount,
        unit=unit,
        seconds=round(result["seconds"], 4),
        seconds_per_unit=float(f"{result['seconds'] / units:.4g}"),  # 4 significant digits
        # None: measured in the bench's own process (appends), where peak RSS says nothing
        peak_rss_mb=None if result["peak_rss_mb"] is None else round(result["peak_rss_mb"], 1),
    )


def _version_curve(case: Case, root: Path, steps: tuple[int, ...]) -> None:
    """One table grown by appends of 4 rows (three 1 KB inline payloads, one 70 KB packed):
    at each step it has that many fragments and versions, and every operation runs on it (on
    a copy, if it changes the table)."""
    rng = np.random.default_rng(9)
    table = root / "versions"
    appended = 0
    for step in steps:
        started = time.perf_counter()
        for a in range(appended, step):
            payloads = [rng_bytes(rng, KB) for _ in range(3)] + [rng_bytes(rng, 70 * KB)]
            data = pa.table({"id": pa.array(range(4 * a, 4 * a + 4)), "b": blob_array(payloads)})
            write_table(data, table, mode="append")
        appends = step - appended
        append = {"seconds": (time.perf_counter() - started) / appends, "peak_rss_mb": None}
        appended = step
        _scale_row(case, "versions", "append", "blobhouse", step, "append", 1, append)
        for operation, stock in SCALE_OPERATIONS.items():
            if operation == "verify deep" and step > SCALE_DEEP_UP_TO:
                continue
            for contender, name in (("blobhouse", operation), ("pylance", stock)):
                if name is None:
                    continue
                uri = table
                if name in SCALE_MUTATING:
                    uri = fresh(root / "copy")
                    shutil.copytree(table, uri)
                result = _scale_run(SCALE_OPERATION_SCRIPT, str(uri), name)
                _scale_row(case, "versions", operation, contender, step, "fragment", step, result)
                if contender == "pylance":
                    case.rows[-1]["operation"] = name.removeprefix("pylance ")


def _scale_notes(case: Case) -> list[str]:
    """Per curve: how seconds per unit and peak RSS changed from the smallest to the largest
    point."""
    notes = []
    for (mode, operation, contender), points in _curves(case.rows).items():
        if len(points) < 2 or operation == "append":
            continue
        first, last = points[0], points[-1]
        notes.append(
            f"{mode} {operation} ({contender}), {first['amount']} to {last['amount']}: seconds "
            f"per {first['unit']} " + ", ".join(str(p["seconds_per_unit"]) for p in points) + "; "
            f"peak RSS {_growth(first, last, 'peak_rss_mb')}x"
        )
    return notes


def _curves(rows: list[dict]) -> dict[tuple, list[dict]]:
    curves: dict[tuple, list[dict]] = {}
    for row in rows:
        curves.setdefault((row["mode"], row["operation"], row["contender"]), []).append(row)
    return curves


def _growth(first: dict, last: dict, key: str) -> float:
    return round(last[key] / first[key], 2) if first[key] else float("nan")


def machine_limits(size: Size) -> Case:
    """What this machine does at best: sequential disk write/read and blake3 hashing."""
    case = Case("machine", "Limits measured in the same run")
    data = np.random.default_rng(6).bytes(size.machine_bytes)
    with Scratch() as root:
        path = root / "seq.bin"

        def write():
            with open(path, "wb") as f:
                for start in range(0, len(data), 8 * MB):
                    f.write(data[start : start + 8 * MB])
                f.flush()
                os.fsync(f.fileno())

        def read():
            with open(path, "rb") as f:
                while f.read(8 * MB):
                    pass

        times = medians(
            {
                "sequential write (fsync)": write,
                "sequential read (warm)": read,
                "blake3": lambda: blake3.blake3(data).digest(),
            },
            size.runs,
        )
    for name, seconds in times.items():
        case.add(measure=name, mb_s=round(len(data) / seconds / 1e6, 1))
    return case


def spark(size: Size) -> Case:
    """The Spark targets: the data source vs Spark's parquet and the floor of any Python data
    source; read_blob and materialize vs Spark's own floor for moving the same bytes."""
    from bench.spark_targets import run as run_spark

    case = Case(
        "spark",
        "Spark local[2]: medians of the data source against Spark's parquet and the floor of a "
        "Python data source yielding the same columns from memory; read_blob and materialize "
        "against an Arrow UDF / mapInArrow returning the same bytes without I/O (Spark's floor)",
    )
    started = time.perf_counter()
    result = run_spark(rows=size.spark_rows, blob_kb=64, runs=size.runs)
    case.add(**result)
    case.notes.append(f"ran in {time.perf_counter() - started:.0f} s")
    return case


def demo_read(size: Size) -> Case:
    """The demo's read-back (every payload read on the executors and checked against what was
    generated) against a plain read of the same table's files, both from the disk (the files
    evicted from the page cache first), on the bench's local[2] session."""
    from bench.loader_case import evict
    from bench.spark_targets import bench_session
    from blobhouse.cli.demo import read_back, run_demo

    case = Case(
        "demo_read",
        "Median seconds of the demo's read-back on local[2] against one thread reading every "
        "file of the same table front to back, both from the disk",
    )
    spark = bench_session()
    with Scratch() as root:
        out = str(root / "episodes")
        rows = size.demo_rows
        run_demo(out, rows, master="local[2]", progress=lambda _: None)
        data = EpisodeData(rows)
        files = [p for p in Path(out).rglob("*") if p.is_file()]
        table_bytes = sum(p.stat().st_size for p in files)
        checked: dict[str, int] = {}

        def demo() -> None:
            checked.update(read_back(spark, out, data))

        # Spark's part of the read-back: the same scan of references and mapInArrow,
        # reading and checking nothing
        floor = (
            spark.read.format("blobhouse")
            .load(out)
            .select("row", *BLOB_COLUMNS)
            .mapInArrow(_no_rows, "checked long")
        )
        times = medians(
            {
                "demo read-back": demo,
                "plain read": lambda: _read_files(files),
                "Spark floor (same scan and mapInArrow, no reads)": floor.collect,
            },
            size.runs,
            before=lambda _: evict(out),
        )
        assert checked["mismatches"] == 0, checked
        for contender, seconds in times.items():
            case.add(
                workload=f"{rows:,} frames, {table_bytes / 1e6:,.0f} MB of files, cold",
                contender=contender,
                seconds=round(seconds, 4),
                mb_s=round(table_bytes / seconds / 1e6, 1),
                vs_plain_read=round(times["plain read"] / seconds, 3),
            )
    return case


def _no_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        yield from ()


def _read_files(files: list[Path]) -> int:
    read = 0
    for path in files:
        with open(path, "rb", buffering=0) as file:
            while chunk := file.read(8 * MB):
                read += len(chunk)
    return read


def maintenance(size: Size) -> Case:
    """Compaction of a table of many small appends with shared payloads and deleted rows, against
    Lance's own ``compact_files``; then verify, deep verify and gc of the compacted table."""
    case = Case(
        "maintenance",
        "Median seconds per operation; data bytes after compaction and cleanup of old versions, "
        "against the unique live payload bytes",
    )
    rng = np.random.default_rng(5)
    shared = [rng_bytes(rng, MB) for _ in range(6)]
    with Scratch() as root:
        base = root / "base"
        live: dict[int, bytes] = {}
        for a in range(size.appends):
            ids = list(range(24 * a, 24 * a + 24))
            payloads = [shared[(a + i) % 6] if i % 2 else rng_bytes(rng, 100 * KB) for i in ids]
            data = pa.table({"id": pa.array(ids, pa.int64()), "b": blob_array(payloads)})
            # per-file dedup: what compaction shares again (the default shares at write time)
            write_table(data, base, mode="append", dedup="content")
            live.update(zip(ids, payloads, strict=True))
        open_table(base).delete("id % 5 = 0")
        live = {i: p for i, p in live.items() if i % 5}
        unique = sum(len(p) for p in {bytes(p) for p in live.values()})
        logical = sum(len(p) for p in live.values())
        compactions = {
            "blobhouse compact": lambda uri: open_table(uri).compact(),
            "pylance compact_files": lambda uri: lance.dataset(uri).optimize.compact_files(),
        }
        samples = {name: [] for name in compactions}
        for run in range(size.runs):
            for number, (name, compact) in enumerate(compactions.items()):
                copy = fresh(root / f"copy-{number}-{run}")
                shutil.copytree(base, copy)
                started = time.perf_counter()
                compact(str(copy))
                samples[name].append((time.perf_counter() - started, copy))
        for name, results in samples.items():
            seconds = statistics.median(t for t, _ in results)
            kept = results[-1][1]
            lance.dataset(str(kept)).cleanup_old_versions(
                older_than=timedelta(0), delete_unverified=True
            )
            after = disk_bytes(kept / "data")
            case.add(
                operation="compact",
                contender=name,
                seconds=round(seconds, 4),
                logical_mb_s=round(logical / seconds / 1e6, 1),
                data_bytes_after=after,
                ratio_to_unique=round(after / unique, 3),
            )
        compacted = str(samples["blobhouse compact"][-1][1])
        services = {
            "verify": lambda: open_table(compacted).verify(),
            "verify deep": lambda: open_table(compacted).verify(deep=True),
            "gc": lambda: open_table(compacted).gc(grace=timedelta(0)),
        }
        for name, seconds in medians(services, size.runs).items():
            case.add(
                operation=name,
                contender="blobhouse",
                seconds=round(seconds, 4),
                logical_mb_s=round(logical / seconds / 1e6, 1),
                data_bytes_after=disk_bytes(Path(compacted) / "data"),
                ratio_to_unique=None,
            )
    case.notes.append(
        f"{size.appends} appends of 24 rows: half 100 KB unique, half one of 6 shared 1 MB "
        f"payloads; every 5th row deleted; {logical / 1e6:.0f} MB logical, {unique / 1e6:.0f} MB "
        "unique live. Lance's compact_files stores a shared payload once per row; blobhouse once "
        "per data file"
    )
    return case


def global_dedup(size: Size) -> Case:
    """The same payloads appended again and again: table-global dedup against per-file dedup
    and pylance, bytes on disk and write time of the whole series."""
    case = Case(
        "global_dedup",
        "Appends that repeat payloads: bytes on disk after all of them, median seconds for all",
    )
    rng = np.random.default_rng(7)
    recurring = [rng_bytes(rng, MB) for _ in range(8)]
    appends = [
        recurring + [rng_bytes(rng, 100 * KB) for _ in range(4)] for _ in range(size.appends)
    ]
    unique = sum(len(p) for p in {bytes(p) for batch in appends for p in batch})
    logical = sum(len(p) for batch in appends for p in batch)
    tables = [pa.table({"b": pa.array(batch, pa.large_binary())}) for batch in appends]

    def series(root: Path, write) -> Callable[[], None]:
        def run() -> None:
            fresh(root)
            for table in tables:
                write(table, root)

        return run

    with Scratch() as root:
        writers = {
            "blobhouse global": lambda t, uri: write_table(
                t, uri, mode="append", blob_columns=["b"], dedup="global"
            ),
            "blobhouse per file": lambda t, uri: write_table(
                t, uri, mode="append", blob_columns=["b"], dedup="content"
            ),
            "pylance": lambda t, uri: lance.write_dataset(
                lance_table(t.column("b").to_pylist()),
                uri,
                mode="append",
                data_storage_version="2.2",
            ),
        }
        paths = {name: root / name.replace(" ", "_") for name in writers}
        times = medians({name: series(paths[name], fn) for name, fn in writers.items()}, size.runs)
        for name, seconds in times.items():
            on_disk = disk_bytes(paths[name])
            case.add(
                contender=name,
                appends=size.appends,
                seconds=round(seconds, 4),
                logical_mb_s=round(logical / seconds / 1e6, 1),
                bytes=on_disk,
                ratio_to_unique=round(on_disk / unique, 3),
            )
    case.notes.append(
        f"{size.appends} appends, each of the same 8 x 1 MB payloads and 4 new 100 KB ones; "
        f"{logical / 1e6:.0f} MB logical, {unique / 1e6:.1f} MB unique"
    )
    return case


#: how the space-back case deletes rows (a SQL filter on ``id``), by name
DELETIONS = {
    "every other row": "id % 2 = 1",
    "first half": "id < {half}",
    "2% spread": "id % 50 = 1",
    "15% spread": "id % 7 = 1",
}


def space_back(size: Size) -> Case:
    """Deletes, then compaction and gc with nothing retained: the store's bytes against the
    unique live bytes, and what compaction rewrote to get there (its write amplification),
    against pylance's delete, ``compact_files`` and ``cleanup_old_versions``."""
    case = Case(
        "space_back",
        "Bytes left after deletes, compaction and cleanup against the unique live bytes; bytes "
        "compaction rewrote against the live bytes; median seconds of compaction",
    )
    rows = 10 * size.unique_rows  # 200 MB in the full run
    payloads = [random.Random(i).randbytes(100 * KB) for i in range(rows)]
    data = pa.table({"id": pa.array(range(rows), pa.int64()), "b": blob_array(payloads)})
    with Scratch() as root:
        for pattern, where in DELETIONS.items():
            where = where.format(half=rows // 2)
            live = rows - lance.write_dataset(
                pa.table({"id": pa.array(range(rows))}), fresh(root / "ids")
            ).count_rows(where)
            live_bytes = live * 100 * KB
            for contender in ("blobhouse", "pylance"):
                uri = fresh(root / contender)
                if contender == "blobhouse":
                    write_table(data, uri, placement={"b": {"pack_file_size_threshold": 16 * MB}})
                    open_table(uri).delete(where)
                    started = time.perf_counter()
                    report = open_table(uri).compact()
                    seconds = time.perf_counter() - started
                    open_table(uri).gc(grace=timedelta(0), retain_versions=1)
                    rewritten = report["new_store_bytes"]
                else:
                    dataset = lance.write_dataset(
                        lance_table(payloads).append_column("id", data.column("id")),
                        uri,
                        data_storage_version="2.2",
                    )
                    dataset.delete(where)
                    started = time.perf_counter()
                    dataset.optimize.compact_files()
                    seconds = time.perf_counter() - started
                    lance.dataset(str(uri)).cleanup_old_versions(
                        older_than=timedelta(0), delete_unverified=True
                    )
                    rewritten = None
                on_disk = disk_bytes(uri)
                case.add(
                    deletion=pattern,
                    contender=contender,
                    live_rows=live,
                    seconds=round(seconds, 4),
                    bytes_after=on_disk,
                    ratio_to_live=round(on_disk / live_bytes, 3),
                    rewritten_to_live=None
                    if rewritten is None
                    else round(rewritten / live_bytes, 3),
                )
    case.notes.append(
        f"{rows} rows of unique 100 KB payloads in 16 MB store packs (blobhouse's default "
        "table: dedup global); pylance: the same payloads as a blob v2 column. Deleted rows as "
        "named, then compact, then gc / cleanup_old_versions keeping only the latest version. "
        "blobhouse repacks the deadest packs until at most max_unused (5%) of the referenced "
        "bytes are dead: small spread deletes are left until they add up"
    )
    return case


CONCURRENT_WRITER_SCRIPT = textwrap.dedent(
    """
    import json, os, random, sys, time
    import pyarrow as pa
    uri, go, ready, worker, count, size, contender = sys.argv[1:8]
    options = json.loads(sys.argv[8]) or None
    worker, count, size = int(worker), int(count), int(size)
    payloads = [random.Random(i).randbytes(size) for i in range(count)]
    ids = pa.array([1000 * (worker + 1) + i for i in range(count)], pa.int64())
    if contender == "blobhouse":
        from blobhouse import blob_array, write_table
        data = pa.table({"id": ids, "b": blob_array(payloads)})
        write = lambda: write_table(data, uri, mode="append", storage_options=options)
    else:
        import lance
        from blobhouse.io.objects import checked_options
        blob = pa.field("b", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
        data = pa.table({"id": ids, "b": pa.array(payloads, pa.large_binary())},
                        schema=pa.schema([pa.field("id", pa.int64()), blob]))
        write = lambda: lance.write_dataset(data, uri, mode="append", data_storage_version="2.2",
                                            storage_options=checked_options(options))
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.002)
    started = time.perf_counter()
    write()
    print(json.dumps({"seconds": time.perf_counter() - started}))
    """
)


SPARK_APPLICATION_WRITER_SCRIPT = textwrap.dedent(
    """
    import json, os, random, sys, time
    import blobhouse.spark as bs
    master, uri, go, ready, worker, count, size = sys.argv[1:8]
    worker, count, size = int(worker), int(count), int(size)
    # one core each: the two applications run side by side on the cluster's two workers
    conf = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m",
            "spark.cores.max": "1"}
    spark = bs.local_session(master, app_name=f"writer-{worker}", conf=conf)
    bs.register(spark)
    rows = [(1000 * (worker + 1) + i, random.Random(i).randbytes(size)) for i in range(count)]
    frame = spark.createDataFrame(rows, "id long, b binary").repartition(2)
    frame.count()  # the executor is up
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    started = time.perf_counter()
    frame.write.format("blobhouse").mode("append").save(uri)
    print(json.dumps({"seconds": time.perf_counter() - started}))
    """
)


def concurrent_writers(size: Size) -> Case:
    """Several processes append the same new payloads at one moment: the bytes the table holds
    against the unique bytes right after the writes, and after compaction and gc (which merge
    what the race stored twice), on a local path, the S3 server and Azurite; pylance appends
    the same payloads the same way."""
    case = Case(
        "concurrent_writers",
        "N processes appending the same new payloads at once: table bytes against the unique "
        "payload bytes after the writes, and after compaction + gc; seconds of the slowest "
        "writer and of the compaction (one round each)",
    )
    count, payload_size = size.concurrent_payloads
    unique = count * payload_size
    with (
        Scratch() as root,
        LocalS3Server(log=root / "s3.log") as server,
        _azurite(root, case) as azure,
    ):
        stores = {"local": _Store(str(root), None, None)}
        stores["s3"] = _Store(f"s3://{server.bucket('bench')}", server.options, server)
        if azure is not None:
            stores["azure"] = _Store(azure.uri, azure.options, azure)
        for store_name, store in stores.items():
            for writers in size.concurrent_writers[store_name != "local"]:
                for contender in ("blobhouse", "pylance"):
                    uri = f"{store.root}/{contender}-{writers}-{uuid.uuid4().hex[:8]}"
                    row = _concurrent_run(root, store, uri, contender, writers, count, payload_size)
                    case.add(
                        store=store_name,
                        writers=writers,
                        contender=contender,
                        write_seconds=row["write_seconds"],
                        ratio_after_writes=round(row["after_writes"] / unique, 3),
                        ratio_after_compaction=None
                        if row["after_compaction"] is None
                        else round(row["after_compaction"] / unique, 3),
                        compaction_seconds=row["compaction_seconds"],
                    )
        if size.name == "full":  # a standalone cluster: too slow for the quick run
            row = _spark_applications_run(root, count, payload_size)
            case.add(
                store="local, a standalone Spark cluster",
                writers=2,
                contender="blobhouse",
                door="df.write in 2 Spark applications",
                write_seconds=row["write_seconds"],
                ratio_after_writes=round(row["after_writes"] / unique, 3),
                ratio_after_compaction=round(row["after_compaction"] / unique, 3),
                compaction_seconds=row["compaction_seconds"],
            )
    case.notes.append(
        "the Spark row: two Spark applications (spark.cores.max=1 each) on a standalone "
        "cluster of two 1-core workers on 127.0.0.1, each a natural df.write of the same "
        "payloads in 2 partitions, released together once both executors are up"
    )
    case.notes.append(
        f"{count} payloads of {payload_size // KB} KB, the same in every writer, each writer "
        "a fresh Python process, released by a shared start signal once all are ready (rows "
        "of ids of its own), appending to a table that holds one row; bytes are every object "
        "of the table (data files, store, index). blobhouse: its default table (dedup "
        "global); each write stores what the index lacked when it looked, so writers that "
        "overlap each store a copy, and the later index append records it; compact() merges "
        "the copies (rows repointed to one, nothing rewritten), gc(grace=0, "
        "retain_versions=1) reaps them. pylance: a blob v2 column, compact_files and "
        "cleanup_old_versions (older_than=0): it stores a copy per row by design"
    )
    return case


def _concurrent_run(
    root: Path, store: _Store, uri: str, contender: str, writers: int, count: int, size: int
) -> dict:
    """One round: a table of one row, ``writers`` processes appending at once, then the
    compaction and cleanup of the contender; the table's bytes after each."""
    options = checked_options(store.options) if store.options else None
    first = pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([b"first"])})
    if contender == "blobhouse":
        write_table(first, uri, storage_options=options)
    else:
        lance.write_dataset(
            lance_table([b"first"]).append_column("id", first.column("id")),
            uri,
            data_storage_version="2.2",
            storage_options=options,
        )
    go, ready = _signals(root, writers)
    script = [sys.executable, "-c", CONCURRENT_WRITER_SCRIPT, uri, str(go)]
    tail = [str(count), str(size), contender, json.dumps(store.options)]
    processes = [
        subprocess.Popen([*script, str(ready[n]), str(n), *tail], stdout=subprocess.PIPE, text=True)
        for n in range(writers)
    ]
    _release(processes, ready, go)
    seconds = _writer_seconds(processes, f"concurrent {contender}")
    after_writes = _table_bytes(uri, options)
    if contender == "blobhouse":
        compaction = _compact_and_gc(uri, options)
    else:
        started = time.perf_counter()
        lance.dataset(uri, storage_options=options).optimize.compact_files()
        compaction = time.perf_counter() - started
        lance.dataset(uri, storage_options=options).cleanup_old_versions(
            older_than=timedelta(0), delete_unverified=True
        )
    return {
        "write_seconds": round(max(seconds), 3),
        "after_writes": after_writes,
        "after_compaction": _table_bytes(uri, options),
        "compaction_seconds": round(compaction, 3),
    }


def _spark_applications_run(root: Path, count: int, size: int) -> dict:
    """Two Spark applications on a standalone cluster appending the same new payloads at
    once (:data:`SPARK_APPLICATION_WRITER_SCRIPT`) to a table of one row, then its compaction
    and gc; the table's bytes after each."""
    from blobhouse.testing import LocalSparkCluster

    uri = str(root / f"spark-applications-{uuid.uuid4().hex[:8]}")
    write_table(pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([b"first"])}), uri)
    go, ready = _signals(root, 2)
    with LocalSparkCluster(workers=2) as cluster:
        script = [sys.executable, "-c", SPARK_APPLICATION_WRITER_SCRIPT, cluster.master, uri]
        processes = [
            subprocess.Popen(
                [*script, str(go), str(ready[n]), str(n), str(count), str(size)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(2)
        ]
        _release(processes, ready, go)
        seconds = _writer_seconds(processes, "Spark application")
    after_writes = _table_bytes(uri, None)
    compaction = _compact_and_gc(uri, None)
    return {
        "write_seconds": round(max(seconds), 3),
        "after_writes": after_writes,
        "after_compaction": _table_bytes(uri, None),
        "compaction_seconds": round(compaction, 3),
    }


def _signals(root: Path, writers: int) -> tuple[Path, list[Path]]:
    """The start signal shared by ``writers`` processes, and the file each makes once ready."""
    return root / f"go-{uuid.uuid4().hex}", [
        root / f"ready-{uuid.uuid4().hex}" for _ in range(writers)
    ]


def _release(processes: list[subprocess.Popen], ready: list[Path], go: Path) -> None:
    """Give the start signal once every writer is ready (or one has ended: a failure, which
    :func:`_writer_seconds` reports)."""
    deadline = time.monotonic() + 600
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            break
        time.sleep(0.01)
    go.touch()


def _writer_seconds(processes: list[subprocess.Popen], what: str) -> list[float]:
    """The seconds each writer process printed last, once every one ended."""
    seconds = []
    for process in processes:
        out, _ = process.communicate(timeout=1800)
        if process.returncode:
            raise RuntimeError(f"a {what} writer failed ({process.returncode})")
        seconds.append(_last_json(out)["seconds"])
    return seconds


def _compact_and_gc(uri: str, options: dict[str, str] | None) -> float:
    """``compact()`` then ``gc`` with no grace, the latest version kept: the compaction's
    seconds."""
    started = time.perf_counter()
    open_table(uri, storage_options=options).compact()
    compaction = time.perf_counter() - started
    time.sleep(1.1)  # object stores' clocks are whole seconds: retired packs must be older
    open_table(uri, storage_options=options).gc(grace=timedelta(0), retain_versions=1)
    return compaction


def _table_bytes(uri: str, options: dict[str, str] | None) -> int:
    """Every object's bytes under the table's folder."""
    store = object_store(uri, options)
    return sum(info.size for info in store.list(uri))


STORE_APPEND_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np, pyarrow as pa
    from blobhouse import write_table
    uri, count, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(seed)  # the store's own payloads: STORE_FOUND_SEED
    table = pa.table({"b": pa.array([rng.bytes(size) for _ in range(count)], pa.large_binary())})
    started = time.perf_counter()
    write_table(table, uri, mode="append", blob_columns=["b"], dedup="global")
    seconds = time.perf_counter() - started
    status = open("/proc/self/status").read()  # VmHWM: see SCALE_SCRIPT
    peak_kb = int(status.split("VmHWM:")[1].split()[0])
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kb / 1024}))
    """
)
# distinct payloads the store holds before the timed appends (0: registered, empty)
STORE_PAYLOADS = {
    "quick": (0, 10_000),
    "full": (0, 10_000, 100_000, 1_000_000, 10_000_000),
}
STORE_APPEND = (1000, 10 * KB)  # payloads per timed append, and their size
STORE_ENTRY = 16  # bytes each synthetic store entry takes in its pack
STORE_FOUND_SEED = 1_000_000  # the seed of the STORE_APPEND payloads every store holds


def store_scale(size: Size) -> Case:
    """Appending 1,000 payloads with ``dedup="global"`` as the table's store grows, new ones
    and ones the store holds (every one looked up, checked and referenced): seconds and peak
    RSS of the writing process (fresh, so nothing is cached but the page cache)."""
    case = Case(
        "store_scale",
        "dedup=global appends of 1,000 10 KB payloads to a store of N payloads, new ones and "
        "ones the store holds, each in a fresh process (and through blobhouse.spark.write_table "
        "in the bench's Spark session): median seconds and peak RSS",
    )
    count, payload = STORE_APPEND
    with Scratch() as root:
        tables, built = {}, {}
        for n in STORE_PAYLOADS[size.name]:
            started = time.perf_counter()
            tables[n] = _store_with(root / f"store-{n}", n)
            built[n] = time.perf_counter() - started
        kinds = {"store": lambda run: run, "store found": lambda run: STORE_FOUND_SEED}
        samples = {(kind, n): [] for kind in kinds for n in tables}
        for run in range(size.runs):  # the store sizes alternate inside each round
            for (kind, n), results in samples.items():
                seed = kinds[kind](run)
                args = [tables[n], str(count), str(payload), str(seed)]
                out = subprocess.run(
                    [sys.executable, "-c", STORE_APPEND_SCRIPT, *args],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results.append(_last_json(out.stdout))
        samples.update(_spark_store_samples(tables, size.runs, root / "spark-warm-up"))
        for kind in (*kinds, *SPARK_STORE_KINDS):
            empty = statistics.median(s["seconds"] for s in samples[(kind, min(tables))])
            for n in tables:
                results = samples[(kind, n)]
                seconds = statistics.median(r["seconds"] for r in results)
                case.add(
                    mode=kind,
                    store_payloads=n,
                    seconds=round(seconds, 3),
                    vs_empty_store=round(seconds / empty, 2),
                    peak_rss_mb=_peak(results),
                    store_built_s=round(built[n], 1),
                )
    python = {"store": "new payloads", "store found": "payloads the store holds"}
    for kind, what in (python | SPARK_STORE_KINDS).items():
        rows = [r for r in case.rows if r["mode"] == kind]
        door = " through blobhouse.spark.write_table" if kind in SPARK_STORE_KINDS else ""
        case.notes.append(
            f"mode {kind!r}: every timed append adds {count} {what} of {payload // KB} KB{door} "
            f"({size.runs} appends per store, sizes alternating); seconds per append from "
            f"{rows[0]['store_payloads']:,} to {rows[-1]['store_payloads']:,} payloads: "
            + ", ".join(str(r["seconds"]) for r in rows)
            + ("" if rows[0]["peak_rss_mb"] is None else "; peak RSS MB: ")
            + ", ".join(str(r["peak_rss_mb"]) for r in rows if r["peak_rss_mb"] is not None)
        )
    case.notes.append(
        f"each store: first {count} real payloads of {payload // KB} KB (the ones mode 'store "
        "found' appends again: each is looked up in the index, its bytes read and hashed, and "
        "referenced), then N index entries written directly (random digests into one sparse "
        "pack), then gc's index maintenance (which builds a sorted run of "
        "an index of 100,000 entries or more)"
    )
    return case


def _peak(results: list[dict]) -> float | None:
    peaks = [r["peak_rss_mb"] for r in results if r["peak_rss_mb"] is not None]
    return round(max(peaks), 1) if peaks else None


INDEX_STEP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta
    import numpy as np
    from blobhouse.store import index, index_maintenance as upkeep, index_part
    root, step, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keep = timedelta(hours=1)
    started = time.perf_counter()
    if step == "move":
        upkeep.move_to_shards(root, threshold=0)
    elif step == "maintain":
        upkeep.maintain_index(root, keep)
    elif step == "unit":  # one shard's maintenance as a gc task does it, and its filter
        uri = root + "/_blobs/index"
        index_part.maintain_part(uri, keep, filtered=False)
        part = index_part.open_part(uri, None)
        upkeep._write_shard_filter(root, 0, upkeep._hashes(part), part.count_rows(), None)
    else:  # a lookup of 1,000 hashes: the first the store holds, or new ones
        rng = np.random.default_rng(seed)
        raw = rng.bytes(32 * 1000) if step == "found" else os.urandom(32 * 1000)
        found = index.StoreIndex.open(root).find([raw[i : i + 32] for i in range(0, 32000, 32)])
        assert len(found) == (1000 if step == "found" else 0), len(found)
    seconds = time.perf_counter() - started
    status = open("/proc/self/status").read()  # VmHWM: see SCALE_SCRIPT
    peak_kb = int(status.split("VmHWM:")[1].split()[0])
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kb / 1024}))
    """
)
# entries of the index moved into level 1, and of one shard as a store of 10^9 payloads has it
INDEX_SHARD_ENTRIES = {"quick": (50_000,), "full": (2_000_000, 20_000_000)}
SHARD_UNIT_ENTRIES = {"quick": 50_000, "full": 4_000_000}
INDEX_SEED = 11


def index_shards(size: Size) -> Case:
    """The index's level 1 at scale (docs/global-dedup.md, Toward 10^9 payloads): moving
    level 0 into 256 shards, maintaining every shard, one shard's maintenance at the size a
    store of 10^9 payloads gives it, and lookups of 1,000 hashes before and after the move,
    each in a fresh process: seconds and peak RSS."""
    case = Case(
        "index_shards",
        "the store index's level 1: gc moving N level-0 entries into 256 shards, maintaining "
        "them, one shard's maintenance at ~10^9 / 256 entries, and lookups of 1,000 hashes "
        "(held, new) on level 0 alone and on the shards, each in a fresh process: median "
        "seconds and peak RSS",
    )
    with Scratch() as root:
        for n in INDEX_SHARD_ENTRIES[size.name]:
            uri = root / f"index-{n}"
            _synthetic_index(uri, n, f"{uri}/_blobs/index", maintained=True)
            for level in ("level 0", "level 1"):
                if level == "level 1":
                    for step in ("move", "maintain"):
                        result = _index_step(uri, step)
                        case.add(step=step, entries=n, **result)
                for step in ("found", "new"):
                    runs = [_index_step(uri, step) for _ in range(size.runs)]
                    case.add(
                        step=f"lookup {step} ({level})",
                        entries=n,
                        seconds=round(statistics.median(r["seconds"] for r in runs), 3),
                        peak_rss_mb=_peak(runs),
                    )
            shutil.rmtree(uri)
        unit = SHARD_UNIT_ENTRIES[size.name]
        uri = root / "shard"
        _synthetic_index(uri, unit, f"{uri}/_blobs/index", maintained=False)
        result = _index_step(uri, "unit")
        case.add(step="one shard's maintenance", entries=unit, **result)
        shutil.rmtree(uri)
    unit_row = case.rows[-1]
    case.notes.append(
        f"one shard's maintenance (compaction, BTREE, sorted run, filter) at {unit:,} entries "
        f"took {unit_row['seconds']} s and {unit_row['peak_rss_mb']} MB, most of it Lance's "
        "BTREE build (~440 bytes an entry at once): at 10^9 entries gc runs 256 such units, "
        "each a task of its own under blobhouse.spark.gc; no process holds more than one shard"
    )
    case.notes.append(
        "move: level 0 read once, split by shard into local scratch files, one Lance append "
        "and one filter per shard; lookups: level 0's filters and run, then each hash's "
        "shard's filters (one listing for all shards), a shard opened only for the hashes its "
        "filters may hold (held ones: most of the 256 shards for 1,000 hashes)"
    )
    return case


def _random_entries(count: int, pack: str, seed: int) -> Iterator[pa.RecordBatch]:
    """``count`` index entries of random digests (of ``seed``), back to back in ``pack``
    (STORE_ENTRY bytes each), a million a batch."""
    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        digests = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(32), n, [None, pa.py_buffer(rng.bytes(32 * n))]
        ).cast(pa.binary())
        positions = np.arange(start, start + n, dtype=np.int64) * STORE_ENTRY
        yield pa.record_batch(
            [digests, pa.array([pack] * n), positions, np.full(n, STORE_ENTRY)],
            schema=INDEX_SCHEMA,
        )


def _synthetic_index(uri: Path, entries: int, index: str, maintained: bool) -> None:
    """An index part of ``entries`` random digests at ``index`` (seeded by INDEX_SEED), in
    one sparse pack of the table at ``uri``, ``maintained`` as gc leaves level 0."""
    fresh(uri)
    batches = _random_entries(entries, "packs/bench.pack", INDEX_SEED)
    lance.write_dataset(pa.RecordBatchReader.from_batches(INDEX_SCHEMA, batches), index)
    if maintained:
        maintain_part(index, timedelta(hours=1))


def _index_step(uri: Path, step: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", INDEX_STEP_SCRIPT, str(uri), step, str(INDEX_SEED)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = _last_json(out.stdout)
    return {"seconds": round(result["seconds"], 3), "peak_rss_mb": round(result["peak_rss_mb"], 1)}


#: the Spark modes of store_scale: what each appends (bs.write_table, in the bench's session)
SPARK_STORE_KINDS = {"spark": "new payloads", "spark found": "payloads the store holds"}


def _spark_store_samples(
    tables: dict[int, str], runs: int, warm_up: Path
) -> dict[tuple[str, int], list]:
    """Seconds of ``bs.write_table`` appending STORE_APPEND payloads, new ones and the ones
    every store holds, to each of ``tables`` (sizes alternating in each round), after one
    untimed write to ``warm_up`` (a session's first job pays for its start); peak RSS is the
    driver's, not measured: ``None``."""
    import blobhouse.spark as bs
    from bench.spark_targets import bench_session

    spark = bench_session()

    def append(uri: str, seed: int) -> float:
        count, size = STORE_APPEND
        rng = np.random.default_rng(seed)
        df = spark.createDataFrame(pa.table({"b": [rng.bytes(size) for _ in range(count)]}))
        started = time.perf_counter()
        bs.write_table(df, uri, mode="append", blob_columns=["b"], dedup="global")
        return time.perf_counter() - started

    append(str(warm_up), 0)
    samples: dict[tuple[str, int], list] = {(k, n): [] for k in SPARK_STORE_KINDS for n in tables}
    for run in range(runs):
        for (kind, n), results in samples.items():
            seed = STORE_FOUND_SEED if kind == "spark found" else 2 * STORE_FOUND_SEED + run
            results.append({"seconds": append(tables[n], seed), "peak_rss_mb": None})
    return samples


def _store_with(uri: Path, payloads: int) -> str:
    """A table whose store holds the STORE_APPEND payloads of STORE_FOUND_SEED, and
    ``payloads`` more (entries of STORE_ENTRY bytes in one sparse pack; their digests are
    random: no write will find them)."""
    fresh(uri)
    # an empty payload registers the store and stores nothing
    write_table(
        pa.table({"b": pa.array([b""], pa.large_binary())}),
        str(uri),
        blob_columns=["b"],
        dedup="global",
    )
    count, size = STORE_APPEND
    rng = np.random.default_rng(STORE_FOUND_SEED)  # as STORE_APPEND_SCRIPT makes them
    found = pa.table({"b": pa.array([rng.bytes(size) for _ in range(count)], pa.large_binary())})
    write_table(found, str(uri), mode="append", blob_columns=["b"], dedup="global")
    if not payloads:
        return str(uri)
    pack = f"packs/bench-{uuid.uuid4().hex}.pack"
    packs = uri / "_blobs" / "packs"
    packs.mkdir(parents=True, exist_ok=True)
    with open(uri / "_blobs" / pack, "wb") as f:
        f.truncate(payloads * STORE_ENTRY)
    entries = _random_entries(payloads, pack, 11)
    reader = pa.RecordBatchReader.from_batches(INDEX_SCHEMA, entries)
    lance.write_dataset(reader, index_uri(str(uri)), mode="append")
    maintain_index(str(uri), timedelta(hours=1))
    return str(uri)


def object_storage(size: Size) -> Case:
    """The same writes and reads on a local path and on the local S3-compatible server (moto,
    on 127.0.0.1), and the reads on Azurite too: throughput, and the requests each sent as the
    server logged them."""
    case = Case(
        "object_storage",
        "Median seconds on a local path vs the local S3 server (moto) and Azurite; requests per "
        "run, as the server logged them",
    )
    rng = np.random.default_rng(8)
    workloads = {
        "1 MB payloads (packed)": [rng_bytes(rng, MB) for _ in range(size.s3_rows)],
        "8 MB payloads (dedicated)": [rng_bytes(rng, 8 * MB) for _ in range(size.s3_rows // 8)],
    }
    with (
        Scratch() as root,
        LocalS3Server(log=root / "s3.log") as server,
        _azurite(root, case) as azure,
    ):
        bucket = f"s3://{server.bucket('bench')}"
        options = server.options
        for label, payloads in workloads.items():
            _object_store_writes(case, server, root, bucket, label, payloads, size.runs)
        stores = {"local": _Store(str(root), None, None), "s3": _Store(bucket, options, server)}
        if azure is not None:
            stores["azure"] = _Store(azure.uri, azure.options, azure)
        _object_store_reads(case, root, stores, workloads["1 MB payloads (packed)"], size)
        # a write's own requests amortize over more rows (the quick run measures one size)
        for scale in (4, 16) if size.name == "full" else (4,):
            _spark_write_requests(case, server, bucket, scale * size.s3_rows)
    case.notes.append(
        "moto is a Python server on the same 2 cores: absolute S3 numbers are the server's "
        "speed, not a real store's; the request counts and the ratios between contenders on the "
        "same store are what carry over. requests: GET/HEAD/PUT/POST/DELETE sent in one run "
        f"(blobhouse's obstore and Lance's object_store together); options {sorted(options)}"
    )
    return case


def _object_store_writes(
    case: Case, server, root: Path, bucket: str, label: str, payloads: list[bytes], runs: int
) -> None:
    logical = sum(len(p) for p in payloads)
    binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
    lance_input = lance_table(payloads)
    options = server.options

    def s3_uri(name: str) -> str:
        return f"{bucket}/{name}-{uuid.uuid4().hex}"

    writes = {
        "blobhouse, local": lambda: write_table(
            binary, str(fresh(root / "bh")), blob_columns=["b"]
        ),
        "blobhouse, s3": lambda: write_table(
            binary, s3_uri("bh"), blob_columns=["b"], storage_options=options
        ),
        "pylance, local": lambda: lance.write_dataset(
            lance_input, fresh(root / "pl"), data_storage_version="2.2"
        ),
        "pylance, s3": lambda: lance.write_dataset(
            lance_input,
            s3_uri("pl"),
            data_storage_version="2.2",
            storage_options=checked_options(options),
        ),
    }
    requests = {name: _requests_of(server, fn) for name, fn in writes.items()}
    times = medians(writes, runs)
    for contender, seconds in times.items():
        store = contender.rsplit(", ", 1)[1]
        case.add(
            operation="write",
            workload=f"{label} x {len(payloads)}",
            contender=contender,
            seconds=round(seconds, 4),
            mb_s=round(logical / seconds / 1e6, 1),
            requests=requests[contender],
            vs_pylance_same_store=round(times[f"pylance, {store}"] / seconds, 3),
        )


_SPARK_TASKS = 4  # the partitions of the df.write rows (the bench session's local[2] runs them)
_FRAMES_PER_CHUNK = 30


def _spark_write_requests(case: Case, server, bucket: str, rows: int) -> None:
    """The natural ``df.write`` of ``rows`` rows of 1 MB payloads to the S3 server, in
    :data:`_SPARK_TASKS` tasks: the requests it sends, against Arrow's Parquet writer writing
    the same rows to the same server, one file per task (the fewest requests a writer of the
    same files could send: Spark's own Parquet writer needs Hadoop's S3 connector, not
    installed here, and its committer sends more). Unique payloads, and frames whose 1 MB
    video chunk is shared by 30 frames dealt round-robin to the tasks."""
    from bench.spark_targets import bench_session

    spark = bench_session()
    for workload, shared in (("unique 1 MB payloads", False), ("1 MB chunks, 30 frames", True)):
        df = _payload_frames(spark, rows, shared)
        name = f"bh-write-{uuid.uuid4().hex}"
        ours, seconds = _timed_requests(
            server, lambda df=df, n=name: _blobhouse_write(df, bucket, n, server.options)
        )
        uploads = server.requests(f"/{bucket.removeprefix('s3://')}/{name}/_blobs/packs/")
        payload_uploads = uploads.get("PUT", 0) + uploads.get("POST", 0)
        parquet, parquet_seconds = _timed_requests(
            server, lambda df=df: _arrow_parquet_write(df, bucket, server.options)
        )
        packs = f"{bucket}/{name}/_blobs/packs"
        stored = sum(o.size for o in object_store(packs, server.options).walk(packs))
        unique = (-(-rows // _FRAMES_PER_CHUNK) if shared else rows) * MB
        mine, theirs = sum(ours.values()), sum(parquet.values())
        row = {"operation": "df.write", "workload": f"{workload} x {rows}, {_SPARK_TASKS} tasks"}
        case.add(
            **row,
            contender="blobhouse df.write, s3",
            seconds=round(seconds, 3),
            requests=ours,
            requests_per_row=round(mine / rows, 4),
            payload_uploads=payload_uploads,
            requests_besides_payload_uploads=mine - payload_uploads,
            vs_parquet=round((mine - payload_uploads) / theirs, 2),
            stored_vs_unique=round(stored / unique, 3),
        )
        case.add(
            **row,
            contender="Arrow's Parquet writer, a file per task, s3",
            seconds=round(parquet_seconds, 3),
            requests=parquet,
            requests_per_row=round(theirs / rows, 4),
        )
    note = (
        "df.write rows: the natural df.write of a blobhouse table to the S3 server against Arrow's "
        "Parquet writer writing the same rows there, a file per Spark task (Spark's own Parquet "
        "writer needs Hadoop's S3 connector, not installed here; its committer sends more "
        "requests than Arrow's writer). payload_uploads: the multipart requests of the store's "
        "packs (the payloads' own bytes, 8 MiB parts); vs_parquet: the other requests over "
        "Parquet's. Claims go a batch at a time in the write's claim log (one conditional PUT "
        "per batch that claims; a worker reads each entry of another task once): a task's first "
        "batch (the probe), then a sample by hash (a 1 MB payload with odds 1 in 32) unless the "
        "column turns out shared, when every batch claims"
    )
    if note not in case.notes:  # measured at two sizes
        case.notes.append(note)


def _payload_frames(spark, rows: int, shared: bool):
    """A DataFrame of ``rows`` rows (``id``, a 1 MB ``payload``) in :data:`_SPARK_TASKS`
    partitions: unique payloads, or ``shared`` chunks of :data:`_FRAMES_PER_CHUNK` frames each,
    the frames dealt round-robin so that every task meets every chunk."""

    def make(batches):
        for batch in batches:
            ids = batch.column("id").to_numpy()
            keys = ids // _FRAMES_PER_CHUNK if shared else ids
            payloads = [np.random.default_rng(int(k)).bytes(MB) for k in keys]
            yield pa.record_batch({"id": ids, "payload": pa.array(payloads, pa.binary())})

    frames = spark.range(rows, numPartitions=_SPARK_TASKS)
    if shared:
        frames = frames.repartition(_SPARK_TASKS)  # round-robin
    return frames.mapInArrow(make, "id long, payload binary")


def _blobhouse_write(df, bucket: str, name: str, options: dict[str, str]) -> None:
    """The natural ``df.write`` of ``df`` to a new blobhouse table ``name`` in ``bucket``."""
    from blobhouse.spark.datasource import storage_prefixed

    df.write.format("blobhouse").mode("append").option("blob_columns", "payload").options(
        **storage_prefixed(options)
    ).save(f"{bucket}/{name}")


def _arrow_parquet_write(df, bucket: str, options: dict[str, str]) -> None:
    """``df``'s rows written to ``bucket`` by Arrow's Parquet writer, one file per task."""
    import pyarrow.fs as pafs

    s3 = pafs.S3FileSystem(
        access_key=options["aws_access_key_id"],
        secret_key=options["aws_secret_access_key"],
        endpoint_override=options["aws_endpoint"],
        scheme="http",
        region=options["aws_region"],
    )
    prefix = f"{bucket.removeprefix('s3://')}/pq-{uuid.uuid4().hex}"

    def write_part(batches):
        part = pa.Table.from_batches(list(batches))
        if part.num_rows:
            pq.write_table(part, f"{prefix}/{uuid.uuid4().hex}.parquet", filesystem=s3)
        yield pa.record_batch({"n": pa.array([part.num_rows], pa.int64())})

    df.mapInArrow(write_part, "n long").collect()


def _timed_requests(server, fn: Callable[[], object]) -> tuple[dict[str, int], float]:
    """What one call of ``fn`` sent to ``server`` (:func:`_requests_of`), and its seconds."""
    started = time.perf_counter()
    sent = _requests_of(server, fn)
    return sent, time.perf_counter() - started


@dataclass(frozen=True)
class _Store:
    """Where a bench case reads: a root (a local path or a URI), its storage options and the
    server that logs its requests (None: not counted)."""

    root: str
    options: dict[str, str] | None
    server: object | None


@contextlib.contextmanager
def _azurite(root: Path, case: Case):
    """Azurite on 127.0.0.1 when ``bin/bootstrap --azurite`` installed it; else None (noted)."""
    from blobhouse.testing import AZURITE_HOME, LocalAzureServer

    if not (AZURITE_HOME / "node_modules" / "azurite").exists():
        case.notes.append("Azurite is not installed (bin/bootstrap --azurite): no azure rows")
        yield None
        return
    with LocalAzureServer(log=root / "azurite.log") as server:
        yield server


def _object_store_reads(
    case: Case, root: Path, stores: dict[str, _Store], payloads: list[bytes], size: Size
) -> None:
    binary = pa.table({"b": pa.array(payloads, pa.large_binary())})
    tables, stock = {}, {}
    for name, store in stores.items():
        options = checked_options(store.options)
        tables[name] = write_table(
            binary, f"{store.root}/read_bh", blob_columns=["b"], storage_options=options
        )
        lance.write_dataset(
            lance_table(payloads),
            f"{store.root}/read_pl",
            data_storage_version="2.2",
            storage_options=options,
        )
        stock[name] = lance.dataset(f"{store.root}/read_pl", storage_options=options)
    k = max(1, len(payloads) * 3 // 4)
    picks = sorted(random.Random(k).sample(range(len(payloads)), k))
    for store, table in tables.items():
        refs = refs_from_arrow(table.blob_refs("b", picks))
        gap = object_store(refs[0].uri, table.storage_options).coalesce_gap
        planned = plan_reads(refs, gap)
        reads = {
            f"blobhouse read_blobs, {store}": lambda t=table: t.read_blobs("b", picks),
            f"blobhouse refs + ranged reads, {store}": lambda t=table, r=refs: read_ranges(
                r, storage_options=t.storage_options, check_hashes=False
            ),
            f"pylance read_blobs, {store}": lambda d=stock[store]: d.read_blobs("b", indices=picks),
        }
        server = stores[store].server
        requests = {name: _requests_of(server, fn) for name, fn in reads.items()}
        times = medians(reads, size.runs)
        for contender, seconds in times.items():
            row = case.add(
                operation=f"read {k} of {len(payloads)} rows",
                workload="1 MB payloads (packed)",
                contender=contender,
                seconds=round(seconds, 4),
                mb_s=round(k * MB / seconds / 1e6, 1),
                requests=requests[contender],
                vs_pylance_same_store=round(times[f"pylance read_blobs, {store}"] / seconds, 3),
            )
            if contender.startswith("blobhouse refs"):
                row["coalesced_reads"] = len(planned)
                row["bytes_read"] = sum(r.end - r.start for r in planned)


def _requests_of(server, fn: Callable[[], object]) -> dict[str, int]:
    """What one call of ``fn`` sent to ``server``, by method (the server logs each request as
    it answers it: wait until the log stops growing); none for a local path (no server)."""
    if server is None:
        fn()
        return {}
    before = server.requests()
    fn()
    after, settled = server.requests(), None
    while settled != after:
        settled = after
        time.sleep(0.2)
        after = server.requests()
    return {m: n - before.get(m, 0) for m, n in sorted(after.items()) if n - before.get(m, 0)}


def _last_json(stdout: str) -> dict:
    import json

    return json.loads(stdout.strip().splitlines()[-1])


MUTATION_SHARE = 25  # rows that carry each payload in the mutations case (frames of one clip)
RELABEL = {"label": "upper(label)"}


class MutationData:
    """The mutations case's table and upsert. Row i carries payload i // 25 (100 KB to 1 MB);
    the upsert matches every 10th row (carrying the payload it has) and adds 10% new rows in
    clips of 25, alternately a new payload and one the table stores."""

    def __init__(self, rows: int) -> None:
        rng = np.random.default_rng(10)
        self.rows = rows
        self.payloads = self._draw(rng, max(1, rows // MUTATION_SHARE))
        added = max(1, rows // 10)
        clips = -(-added // MUTATION_SHARE)
        self.new_payloads = self._draw(rng, -(-clips // 2))
        self.upsert_ids = [*range(5, rows, 10), *range(rows, rows + added)]
        self.upsert_payloads = [self.payloads[i // MUTATION_SHARE] for i in range(5, rows, 10)] + [
            self._added(k) for k in range(added)
        ]
        self.new_unique_bytes = sum(map(len, self.new_payloads))
        self.column_bytes = pa.array(self._labels(range(rows))).nbytes

    @staticmethod
    def _draw(rng: np.random.Generator, count: int) -> list[bytes]:
        sizes = rng.integers(100 * KB, MB, count, endpoint=True)
        return [rng_bytes(rng, int(n)) for n in sizes]

    def _added(self, k: int) -> bytes:
        clip = k // MUTATION_SHARE
        if clip % 2 == 0:
            return self.new_payloads[clip // 2]
        return self.payloads[clip * 7 % len(self.payloads)]

    @staticmethod
    def _labels(ids) -> list[str]:
        return [f"label-{i:07d}" for i in ids]

    @property
    def fragment_rows(self) -> int:
        """Four data files, each holding whole clips."""
        return MUTATION_SHARE * max(1, self.rows // MUTATION_SHARE // 4)

    @property
    def unique_bytes(self) -> int:
        return sum(map(len, self.payloads))

    @property
    def logical_bytes(self) -> int:
        return sum(len(self.payloads[i // MUTATION_SHARE]) for i in range(self.rows))

    def batches(self) -> Iterator[pa.RecordBatch]:
        for start in range(0, self.rows, self.fragment_rows):
            ids = range(start, min(self.rows, start + self.fragment_rows))
            payloads = [self.payloads[i // MUTATION_SHARE] for i in ids]
            yield self._batch(ids, blob_array(payloads))

    def upsert(self, lance_typed: bool = False) -> pa.Table:
        """The upsert's rows: blobhouse's logical blobs, or pylance's blob v2 input."""
        if not lance_typed:
            return pa.Table.from_batches(
                [self._batch(self.upsert_ids, blob_array(self.upsert_payloads))]
            )
        img = lance.blob.blob_array(self.upsert_payloads)
        batch = self._batch(self.upsert_ids, img)
        schema = batch.schema.set(2, lance.blob.blob_field("img"))
        return pa.Table.from_batches([batch.cast(schema)])

    @staticmethod
    def _batch(ids, img: pa.Array) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "id": pa.array(list(ids), pa.int64()),
                "label": MutationData._labels(ids),
                "img": img,
            }
        )


ONE_FRAGMENT_SHARE = 1000  # rows that carry each payload in the one-fragment table


class OneFragmentData:
    """The mutations case's table at Lance's default fragment size: ``rows`` rows (id, label
    as in :class:`MutationData`, img) in one data file; row i carries payload i // 1000 (10-20
    KB), so 1M rows hold ~15 MB of unique payloads. Built batch by batch (one payload's 1,000
    rows each), so memory stays flat whatever the number of rows."""

    def __init__(self, rows: int) -> None:
        rng = np.random.default_rng(11)
        self.rows = rows
        sizes = rng.integers(
            10 * KB, 20 * KB, max(1, -(-rows // ONE_FRAGMENT_SHARE)), endpoint=True
        )
        self.payloads = [rng_bytes(rng, int(n)) for n in sizes]
        self.column_bytes = pa.array(MutationData._labels(range(rows))).nbytes

    def _rows_of(self, k: int) -> range:
        """The ids of the rows that carry payload ``k``."""
        return range(k * ONE_FRAGMENT_SHARE, min(self.rows, (k + 1) * ONE_FRAGMENT_SHARE))

    @property
    def unique_bytes(self) -> int:
        return sum(map(len, self.payloads))

    @property
    def logical_bytes(self) -> int:
        return sum(len(p) * len(self._rows_of(k)) for k, p in enumerate(self.payloads))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """One batch per payload: its 1,000 rows (20 MB in Arrow at most)."""
        for k, payload in enumerate(self.payloads):
            ids = self._rows_of(k)
            yield MutationData._batch(ids, blob_array([payload] * len(ids)))


@dataclass(frozen=True)
class Mutation:
    """One operation of the mutations case, as blobhouse and as pylance run it on a table's
    uri (None: pylance left out), and the target its growth in bytes is held to (growth /
    ``reference``)."""

    blobhouse: Callable[[str], object]
    pylance: Callable[[str], object] | None
    reference: int
    target: Callable[[float], bool] | None = None
    target_text: str = "-"


def mutations(size: Size) -> Case:
    """Update of a plain column on 10% and on 100% of the rows, and an upsert of 10% new + 10%
    matched rows, of a table whose rows share payloads (dedup "content" and "global"):
    blobhouse against Lance's own update and merge_insert on the same table, each on a fresh
    copy; seconds, and bytes on disk after a cleanup of the old version. The updates again on
    a table of one fragment of Lance's default size (1M rows, dedup "content"; pylance's
    update of 10% of its rows only). A note measures what Lance's zstd compression of the
    label column would trade (bytes against scan seconds)."""
    case = Case(
        "mutations",
        "Median seconds per operation, each on a fresh copy of the same table; bytes on disk "
        "after a cleanup of the old versions, and growth against the bytes of the rewritten "
        "column (updates) or of the new unique payloads (upsert); seconds_vs_pylance = seconds "
        "/ pylance's seconds",
    )
    data = MutationData(size.mutation_rows)
    one = OneFragmentData(size.one_fragment_rows)
    with Scratch() as root:
        for dedup in ("content", "global"):
            _mutation_base(root, data, dedup)
            for operation, mutation in _mutations(data, dedup).items():
                _mutate(case, root, dedup, data.fragment_rows, operation, mutation, size.runs)
        _one_fragment_base(root, one)
        for operation, mutation in _one_fragment_updates(one).items():
            _mutate(case, root, "content", one.rows, operation, mutation, size.runs)
        compression = _label_compression(root, data, size.runs)
    _mutation_notes(case, data, one)
    case.notes.append(compression)
    return case


def _mutation_base(root: Path, data: MutationData, dedup: str) -> None:
    """The table at ``root/table`` and its pristine copy at ``root/pristine`` (the table's
    store path is recorded in its manifests: each run restores the copy to the same path)."""
    table = write_table(
        data.batches(),
        str(fresh(root / "table")),
        dedup=dedup,
        max_rows_per_file=data.fragment_rows,
    )
    table.gc(retain_versions=1, grace=timedelta(0))
    shutil.copytree(root / "table", fresh(root / "pristine"))


def _one_fragment_base(root: Path, one: OneFragmentData) -> None:
    """The one-fragment table at ``root/table`` and its pristine copy, as
    :func:`_mutation_base` makes the case's first table (per-file dedup, Lance's default
    fragment size)."""
    table = write_table(one.batches(), str(fresh(root / "table")), dedup="content")
    assert len(table.dataset.get_fragments()) == 1
    table.gc(retain_versions=1, grace=timedelta(0))
    shutil.copytree(root / "table", fresh(root / "pristine"))


def _relabel(where: str | None, column_bytes: int, pylance: bool = True) -> Mutation:
    return Mutation(
        lambda uri: open_table(uri).update(RELABEL, where=where),
        (lambda uri: lance.dataset(uri).update(RELABEL, where=where)) if pylance else None,
        column_bytes,
        lambda ratio: ratio < 1,
        "growth < the label column's bytes",
    )


def _one_fragment_updates(one: OneFragmentData) -> dict[str, Mutation]:
    """pylance's update of every row is left out here: it writes each row again with its own
    copy of its payload, 10x its 10% update (the case's notes give the numbers)."""
    return {
        "update label, 10% of rows": _relabel("id % 10 = 0", one.column_bytes),
        "update label, 100% of rows": _relabel(None, one.column_bytes, pylance=False),
    }


def _mutations(data: MutationData, dedup: str) -> dict[str, Mutation]:
    source, lance_source = data.upsert(), data.upsert(lance_typed=True)
    upsert = Mutation(
        lambda uri: (
            open_table(uri)
            .merge_insert("id", dedup=dedup)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(source)
        ),
        lambda uri: (
            lance.dataset(uri)
            .merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(lance_source)
        ),
        data.new_unique_bytes,
    )
    if dedup == "global":
        upsert = replace(
            upsert, target=lambda ratio: ratio <= 1.05, target_text="growth <= 1.05 x new unique"
        )
    return {
        "update label, 10% of rows": _relabel("id % 10 = 0", data.column_bytes),
        "update label, 100% of rows": _relabel(None, data.column_bytes),
        "upsert 10% new + 10% matched": upsert,
    }


def _mutate(
    case: Case,
    root: Path,
    dedup: str,
    rows_per_fragment: int,
    operation: str,
    mutation: Mutation,
    runs: int,
) -> None:
    """Each contender on a fresh copy of the table, alternating, a warm-up round first; the
    bytes after cleanup of the old versions (the same every run) of the last."""
    table = root / "table"
    before = disk_bytes(table)
    contenders = {"blobhouse": (mutation.blobhouse, _blobhouse_gc)}
    if mutation.pylance is not None:
        contenders["pylance"] = (mutation.pylance, _lance_cleanup)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    after: dict[str, int] = {}
    for run in range(runs + 1):
        for name, (mutate, cleanup) in contenders.items():
            shutil.copytree(root / "pristine", fresh(table))
            started = time.perf_counter()
            mutate(str(table))
            if run:
                samples[name].append(time.perf_counter() - started)
            cleanup(str(table))
            after[name] = disk_bytes(table)
    shutil.copytree(root / "pristine", fresh(table))
    seconds = {name: statistics.median(values) for name, values in samples.items()}

    def vs_pylance(value: float, pylance: float | None) -> float | str:
        return "-" if pylance is None else round(value / pylance, 3)

    for name in contenders:
        growth = after[name] - before
        ratio = growth / mutation.reference
        met = mutation.target(ratio) if mutation.target and name == "blobhouse" else None
        case.add(
            dedup=dedup,
            rows_per_fragment=rows_per_fragment,
            operation=operation,
            contender=name,
            seconds=round(seconds[name], 4),
            seconds_vs_pylance=vs_pylance(seconds[name], seconds.get("pylance")),
            bytes_before=before,
            bytes_after=after[name],
            bytes_after_vs_pylance=vs_pylance(after[name], after.get("pylance")),
            growth=growth,
            growth_vs_reference=round(ratio, 3),
            target="-" if met is None else f"{mutation.target_text} ({'met' if met else 'missed'})",
        )


def _blobhouse_gc(uri: str) -> None:
    open_table(uri).gc(retain_versions=1, grace=timedelta(0))


def _lance_cleanup(uri: str) -> None:
    # unverified files are those younger than 7 days: all of them here
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)


ZSTD = {"lance-encoding:compression": "zstd"}  # Lance's per-field choice of compression


def _label_compression(root: Path, data: MutationData, runs: int) -> str:
    """Why the update's label files cost the column's bytes, and what compression would
    trade: the files an update of every label writes, with Lance's default encoding and with
    the label column created with zstd field metadata (which updates keep), on the case's
    layout and on one fragment of 200x more labels; seconds of the update and of a full scan
    of the column by pylance and LanceDB."""
    layouts = {
        f"{len(range(0, data.rows, data.fragment_rows))} x {data.fragment_rows:,} labels": (
            data.rows,
            data.fragment_rows,
        ),
        f"1 x {200 * data.rows:,} labels": (200 * data.rows, 200 * data.rows),
    }
    parts = []
    for layout, (rows, per_file) in layouts.items():
        measured = {
            name: _label_update(root / "labels.lance", rows, per_file, metadata, runs)
            for name, metadata in (("default", None), ("zstd", ZSTD))
        }
        arrow = pa.array(MutationData._labels(range(rows))).nbytes
        parts.append(
            f"{layout} ({arrow:,} Arrow bytes): "
            + "; ".join(
                f"{name} {m['bytes']:,} bytes ({m['bytes'] / arrow:.2f}x), update "
                f"{m['update']:.3f} s, scan {m['pylance'] * 1e3:.1f} ms pylance / "
                f"{m['lancedb'] * 1e3:.1f} ms LanceDB"
                for name, m in measured.items()
            )
        )
    return (
        "the label files an update writes, with Lance's default encoding and with the label "
        "column created with zstd field metadata (which updates keep; every reader gets the "
        "same values): " + ". ".join(parts)
    )


def _label_update(
    uri: Path, rows: int, per_file: int, metadata: dict | None, runs: int
) -> dict[str, float]:
    """An update of every label of a table of ``rows`` (id, label): bytes of its files, median
    seconds of one, and of a full scan of the column afterwards."""
    import lancedb

    labels = pa.array(MutationData._labels(range(rows)))
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("label", pa.string(), metadata=metadata)]
    )
    ids = pa.array(range(rows), pa.int64())
    table = write_table(
        pa.table([ids, labels], schema=schema), str(fresh(uri)), max_rows_per_file=per_file
    )
    table.update(RELABEL)
    written = sum(p.stat().st_size for p in (uri / "data").glob("update-*.lance"))
    seconds = medians({"update": lambda: table.update(RELABEL)}, runs)["update"]
    dataset = lance.dataset(str(uri))
    stock = lancedb.connect(str(uri.parent)).open_table(uri.stem)
    expected = pc.utf8_upper(labels)
    assert dataset.to_table(columns=["label"])["label"].combine_chunks().equals(expected)
    assert stock.to_arrow()["label"].combine_chunks().equals(expected)
    scans = medians(
        {
            "pylance": lambda: dataset.to_table(columns=["label"]),
            "lancedb": lambda: stock.to_arrow(),
        },
        max(runs, 5),
    )
    shutil.rmtree(uri)
    return {"bytes": written, "update": seconds, **scans}


def _mutation_notes(case: Case, data: MutationData, one: OneFragmentData) -> None:
    case.notes.append(
        f"{data.rows} rows (id, label, img) in 4 data files; {len(data.payloads)} payloads of "
        f"100 KB-1 MB, each carried by {MUTATION_SHARE} consecutive rows: "
        f"{data.logical_bytes / 1e6:.0f} MB logical, {data.unique_bytes / 1e6:.0f} MB unique. "
        f"Updates set label = upper(label) (the column: {data.column_bytes:,} bytes in Arrow) "
        f"where id % 10 = 0, or on every row. The upsert: {len(data.upsert_ids)} rows, every "
        f"10th row matched with the payload it has, {data.rows // 10} new ones in clips of "
        f"{MUTATION_SHARE}, alternately a new payload ({len(data.new_payloads)} new, "
        f"{data.new_unique_bytes / 1e6:.1f} MB) and one the table stores"
    )
    (before,) = {r["bytes_before"] for r in case.rows if r["rows_per_fragment"] == one.rows}
    case.notes.append(
        f"rows_per_fragment {one.rows:,}: the same updates on a second table of one fragment "
        f"(Lance's default fragment size, {DEFAULT_MAX_ROWS_PER_FILE:,} rows at most, is "
        f"blobhouse's too): {one.rows:,} rows (id, label, img) written by blobhouse with its "
        f"defaults (dedup content); {len(one.payloads)} payloads of 10-20 KB, each carried by "
        f"{ONE_FRAGMENT_SHARE:,} consecutive rows: {one.logical_bytes / 1e9:.1f} GB logical, "
        f"{one.unique_bytes / 1e6:.1f} MB unique, {before / 1e6:.1f} MB on disk; the label "
        f"column: {one.column_bytes:,} bytes in Arrow"
    )
    case.notes.append(
        "cleanup of the old versions: blobhouse gc(retain_versions=1, grace=0); pylance "
        "cleanup_old_versions(older_than=0, delete_unverified=True); growth = bytes after - "
        "bytes before (the whole table folder, store included)"
    )
    case.notes += _mutation_costs(case, data)
    case.notes.append(_one_fragment_costs(case, one))
    for row in case.rows:
        if row["target"] != "-":
            print(
                f"[bench] mutations {row['dedup']}, {row['rows_per_fragment']:,} rows per "
                f"fragment, {row['operation']}: {row['target']}",
                file=sys.stderr,
            )


def _mutation_costs(case: Case, data: MutationData) -> list[str]:
    """What each operation cost, and why, in this run's numbers."""

    def grew(dedup: str, operation: str, contender: str) -> str:
        row = next(
            r
            for r in case.rows
            if (r["dedup"], r["contender"], r["rows_per_fragment"])
            == (dedup, contender, data.fragment_rows)
            and r["operation"].startswith(operation)
        )
        return _megabytes(row["growth"])

    return [
        "update: blobhouse writes one new data file of the label column per fragment (Lance's "
        "rewrite_columns update) and never reads or copies img, so it costs the column whether "
        f"10% or 100% of the rows change ({grew('content', 'update label, 10%', 'blobhouse')} "
        f"and {grew('content', 'update label, 100%', 'blobhouse')}); the old labels stay inside "
        "the original data files (which hold id and img too) until a compaction. pylance's "
        "update deletes the changed rows and writes them again whole, each with its own copy of "
        f"its payload: {grew('content', 'update label, 10%', 'pylance')} and "
        f"{grew('content', 'update label, 100%', 'pylance')} with dedup content. On a "
        'dedup="global" table img holds references into the store, so pylance copies '
        f"references only ({grew('global', 'update label, 10%', 'pylance')} and "
        f"{grew('global', 'update label, 100%', 'pylance')}: it rewrites the changed rows, "
        "blobhouse the label column of every fragment holding one; at 100% pylance's one new "
        "data file replaces the four whole, and is smaller than they were)",
        "upsert: blobhouse deletes the matched rows (deletion files) and appends the source "
        "through the write pipeline. With dedup global every payload the table already stores, "
        "the matched rows' and the reused ones of the new rows, is referenced and only the new "
        f"ones are written ({grew('global', 'upsert', 'blobhouse')} for "
        f"{data.new_unique_bytes / 1e6:.2f} MB of new payloads); with per-file dedup (content) "
        "the new data file stores each distinct payload it carries once "
        f"({grew('content', 'upsert', 'blobhouse')}), which a compaction folds back into one "
        "copy. pylance writes every source row's payload again, once per row "
        f"({grew('content', 'upsert', 'pylance')})",
    ]


def _one_fragment_costs(case: Case, one: OneFragmentData) -> str:
    """What the updates cost on the one-fragment table, in this run's numbers."""
    rows = {
        (r["operation"].split(", ")[1].split()[0], r["contender"]): r
        for r in case.rows
        if r["rows_per_fragment"] == one.rows
    }
    mine = {share: rows[share, "blobhouse"] for share in ("10%", "100%")}
    copied = rows["10%", "pylance"]
    return (
        f"update at rows_per_fragment {one.rows:,}: blobhouse writes one new label file for the "
        f"fragment, and Lance's default encoding compresses a page of this many strings (FSST), "
        f"so the table grows by less than the column: "
        + " and ".join(
            f"{_megabytes(r['growth'])} ({r['growth_vs_reference']}x) in {r['seconds']} s at {s}"
            for s, r in mine.items()
        )
        + f". pylance's update of 10% of the rows writes them again with a copy of their "
        f"payload each: {_megabytes(copied['growth'])} in {copied['seconds']} s. Its update of "
        f"every row is left out of this table: it would write all {one.rows:,} rows again with "
        f"their payloads, ~10x that (~{copied['growth'] * 10 / 1e9:.1f} GB on disk and "
        f"~{copied['seconds'] * 10:.0f} s per run, on a fresh copy for each of the case's runs "
        f"and a warm-up)"
    )


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e6:+,.2f} MB" if abs(nbytes) >= 100_000 else f"{nbytes / 1e3:+,.1f} KB"


def startup(size: Size) -> Case:
    """Seconds from a shell to the answer, each in a fresh process: ``blobhouse --help``, an
    argument error and commands on a small table, against ``import lance`` alone."""
    case = Case("startup", "Seconds to an answer in a fresh process (median); vs import lance")
    with Scratch() as root:
        uri = str(root / "small")
        write_table(pa.table({"id": range(100), "b": blob_array([b"x" * KB] * 100)}), uri)
        script = Path(sys.executable).with_name("blobhouse")  # what a user runs
        command = [str(script)] if script.exists() else [sys.executable, "-m", "blobhouse.cli"]
        runs = {
            "python -c 'import lance'": [sys.executable, "-c", "import lance"],
            "blobhouse --help": [*command, "--help"],
            "blobhouse gc (argument error)": [*command, "gc"],
            "blobhouse stats": [*command, "stats", uri],
            "blobhouse verify": [*command, "verify", uri],
        }
        seconds = medians(
            {
                name: lambda argv=argv: subprocess.run(argv, capture_output=True)
                for name, argv in runs.items()
            },
            size.runs,
            warm_up=True,  # even quick: a first start reads its files from the disk, the rest not
        )
    lance_s = seconds["python -c 'import lance'"]
    for name, median in seconds.items():
        case.add(
            workload="100 rows, 1 KB blobs",
            contender=name,
            seconds=round(median, 3),
            over_import_lance_s=round(median - lance_s, 3),
        )
    return case


CASES = {
    "machine": machine_limits,
    "storage": storage,
    "write_throughput": write_throughput,
    "random_access": random_access,
    "small_blobs": small_blobs,
    "first_call": first_call,
    "tiny_rows": tiny_rows,
    "scale": scale,
    "versions": versions,
    "spark": spark,
    "demo_read": demo_read,
    "maintenance": maintenance,
    "global_dedup": global_dedup,
    "space_back": space_back,
    "concurrent_writers": concurrent_writers,
    "store_scale": store_scale,
    "index_shards": index_shards,
    "object_storage": object_storage,
    "mutations": mutations,
    "loader": loader,
    "checked_loader": checked_loader,
    "startup": startup,
    "robot_video": robot_video,
    "lerobot_dropin": lerobot_dropin,
}
