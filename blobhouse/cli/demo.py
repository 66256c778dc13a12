"""The demo job, on Spark: a robot-episode training table generated on the executors, written with
dedup, queried with Spark SQL and ``read_blob``, and every byte checked.

Rows are camera frames at 30 Hz. Every 30 frames share one video chunk (1-6 MB), every frame of
an episode shares one calibration file, and each frame has its own small thumbnail: the
"physically low-frequency, logically high-frequency" shape of seed 000.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from blobhouse.dedup import content_hash, content_hashes
from blobhouse.errors import InvalidInputError
from blobhouse.files.ranges import REF_TYPE
from blobhouse.io.objects import (
    StorageOptions,
    checked_options,
    is_local,
    object_store,
    uri_to_path,
)
from blobhouse.layout import VERSIONS_DIR
from blobhouse.progress import Amounts, ProgressCallback

FPS = 30
FRAMES_PER_EPISODE = 300
MiB = 1 << 20
BLOB_COLUMNS = ("video", "calibration", "thumbnail")
ROW_SCHEMA = (
    "row long, episode long, frame long, timestamp_s double, video_chunk long, "
    "video binary, calibration binary, thumbnail binary"
)
DEMO_COLUMNS = [column.split()[0] for column in ROW_SCHEMA.split(", ")]


_POOL_BYTES = 8 * MiB
_ID_BYTES = 8
_KEPT_HASHES = 20_000  # the read-back's hashes of ranges and payloads met in a task


@functools.lru_cache(maxsize=2)
def _pool(seed: int) -> bytes:
    return np.random.default_rng((seed, 0)).bytes(_POOL_BYTES)


@dataclass(frozen=True)
class EpisodeData:
    """Deterministic generator of the demo rows; payload bytes are derived from ids.

    >>> data = EpisodeData(rows=45)
    >>> [b.num_rows for b in data.batches_for(range(2))]
    [30, 15]
    """

    rows: int
    seed: int = 0

    @property
    def chunks(self) -> int:
        return (self.rows + FPS - 1) // FPS

    def chunk(self, chunk_id: int) -> bytes:
        return self._payload(1, chunk_id, 1 * MiB, 6 * MiB)

    def calibration(self, episode: int) -> bytes:
        return self._payload(2, episode, 256 * 1024, 256 * 1024)

    def thumbnail(self, row: int) -> bytes:
        return self._payload(3, row, 2048, 8192)

    def _payload(self, kind: int, number: int, low: int, high: int) -> bytes:
        """Incompressible bytes of a size from ``low`` to ``high``, unique to (kind, number):
        the number, then a stretch of a random pool at a place drawn from it. Slicing a pool
        is a copy, where drawing every byte anew ran at ~1 GB/s: the read-back regenerates
        every payload to check it, and did so slower than a disk reads."""
        rng = np.random.default_rng((self.seed, kind, number))
        size = int(rng.integers(low, high + 1)) - _ID_BYTES
        start = int(rng.integers(0, _POOL_BYTES - size + 1))
        return number.to_bytes(_ID_BYTES, "little") + _pool(self.seed)[start : start + size]

    def batches_for(self, chunk_ids: Iterator[int] | range) -> Iterator[pa.RecordBatch]:
        """One batch per video chunk (30 rows at 30 Hz): the rows that chunk covers."""
        for chunk_id in chunk_ids:
            rows = range(chunk_id * FPS, min((chunk_id + 1) * FPS, self.rows))
            chunk = self.chunk(chunk_id)
            episodes = [r // FRAMES_PER_EPISODE for r in rows]
            yield pa.record_batch(
                {
                    "row": pa.array(rows, pa.int64()),
                    "episode": pa.array(episodes, pa.int64()),
                    "frame": pa.array([r % FRAMES_PER_EPISODE for r in rows], pa.int64()),
                    "timestamp_s": pa.array([(r % FRAMES_PER_EPISODE) / FPS for r in rows]),
                    "video_chunk": pa.array([chunk_id + 1] * len(rows), pa.int64()),
                    "video": pa.array([chunk] * len(rows), pa.binary()),
                    "calibration": pa.array([self.calibration(e) for e in episodes], pa.binary()),
                    "thumbnail": pa.array([self.thumbnail(r) for r in rows], pa.binary()),
                }
            )

    def payload_id(self, column: str, row: int) -> int:
        """Rows with the same id carry the same bytes in ``column``."""
        if column == "video":
            return row // FPS
        if column == "calibration":
            return row // FRAMES_PER_EPISODE
        return row

    def payload(self, column: str, row: int) -> bytes:
        """The bytes ``row`` carries in ``column``."""
        if column == "video":
            return self.chunk(row // FPS)
        if column == "calibration":
            return self.calibration(row // FRAMES_PER_EPISODE)
        return self.thumbnail(row)

    def expected_hash(self, column: str, row: int, known: dict[tuple[str, int], bytes]) -> bytes:
        """The blake3 of what ``row`` carries in ``column`` (each payload hashed once in
        ``known``)."""
        key = (column, self.payload_id(column, row))
        if key not in known:
            known[key] = content_hash(self.payload(column, row))
        return known[key]


@dataclass(frozen=True)
class ReadBack:
    """For ``mapInArrow`` over a demo table's rows as references (``row`` and the blob
    columns): every row's payload checked against what was generated, reading and hashing
    each stored range once however many of the task's rows share it (a video chunk: 30), and the
    reference's recorded blake3 checked too (what readers check against). Yields one row per
    batch: references checked, mismatches, the rows' logical bytes, the bytes read."""

    data: EpisodeData
    storage_options: StorageOptions | None = None
    counter: Any = None  # an amounts counter: rows and bytes read, for progress

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        expected: dict[tuple[str, int], bytes] = {}
        stored: dict[tuple[str, int, int], bytes] = {}  # range -> the blake3 of its bytes
        for batch in batches:
            if len(stored) > _KEPT_HASHES:  # memory stays flat: rows that share a payload
                stored.clear()  # are neighbours (a chunk's 30 frames, an episode's 300)
                expected.clear()
            rows = batch.column("row").to_pylist()
            checked = mismatches = logical = read = 0
            for column in BLOB_COLUMNS:
                refs = batch.column(column).to_pylist()
                read += self._read(refs, stored)
                for row, ref in zip(rows, refs, strict=True):
                    want = self.data.expected_hash(column, row, expected)
                    checked += 1
                    if ref is None:
                        mismatches += 1
                        continue
                    logical += ref["size"]
                    got = stored[(ref["uri"], ref["position"], ref["size"])]
                    mismatches += got != want or ref["blake3"] != want
            if self.counter is not None:
                self.counter.add(Amounts(len(rows), read))
            yield pa.record_batch(
                {
                    "checked": [checked],
                    "mismatches": [mismatches],
                    "bytes": [logical],
                    "read_bytes": [read],
                }
            )

    def _read(self, refs: list[dict | None], stored: dict[tuple[str, int, int], bytes]) -> int:
        """Read and hash the ranges of ``refs`` not read yet; the bytes read."""
        from blobhouse.spark.functions import read_bytes

        new = {}
        for ref in refs:
            if ref is not None:
                key = (ref["uri"], ref["position"], ref["size"])
                if key not in stored:
                    new[key] = ref
        if not new:
            return 0
        values = read_bytes(
            pa.array(list(new.values()), REF_TYPE), self.storage_options, check_hashes=False
        )
        offsets = np.frombuffer(values.buffers()[1], np.int64)[: len(values) + 1].tolist()
        data = memoryview(values.buffers()[2] or b"")
        payloads = [data[start:stop] for start, stop in itertools.pairwise(offsets)]
        stored.update(zip(new, content_hashes(payloads), strict=True))
        return sum(key[2] for key in new)


def run_demo(
    out: str,
    rows: int = 1800,
    master: str = "local[*]",
    progress: Callable[[str], None] = print,
    storage_options: Mapping[str, str] | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    task_progress: ProgressCallback | None = None,
) -> dict:
    """Generate, write, query and verify the demo table at ``out`` on Spark (``master``, with
    the Spark settings ``conf``). An existing table at ``out`` is overwritten (a new version:
    earlier ones stay until ``blobhouse gc``); anything else there is refused, never deleted.
    ``out`` may be on an object store that ``storage_options`` reach.

    Ctrl-C cancels the Spark jobs and waits for them (:func:`blobhouse.spark.jobs.run_spark_job`):
    an interrupted write removes what its tasks staged and commits nothing.
    ``task_progress`` is told the Spark tasks of each step as they finish, with the rows and
    bytes they generated (the write) or read (the read-back)."""
    from blobhouse.extras import require_spark

    require_spark("the demo")  # without pyspark: one line naming the spark extra

    import blobhouse.spark as bs
    from blobhouse.spark.datasource import storage_prefixed
    from blobhouse.spark.jobs import amounts_counter, run_spark_job
    from blobhouse.table import open_table

    options = checked_options(storage_options)
    _check_out(out, options)
    progress(f"starting Spark ({master}) ...")
    spark = bs.local_session(master, conf=conf)
    bs.register(spark, storage_options=options)
    data = EpisodeData(rows)
    # several tasks a core: Spark tells the driver what a task did when it ends (progress)
    tasks = max(1, min(data.chunks, spark.sparkContext.defaultParallelism * 4))

    chunks, parts = _count(data.chunks, "video chunk"), _count(tasks, "task")
    progress(f"writing {rows} frames ({chunks}) in {parts} to {out} ...")
    started = time.perf_counter()
    generated = amounts_counter(spark)
    frames = spark.range(data.chunks, numPartitions=tasks).mapInArrow(
        lambda ids: _generate(data, ids, generated), ROW_SCHEMA
    )
    # the default dedup stores each distinct payload once for the whole table, whichever task
    # meets it (tasks claim new payloads in the table's store); overwrite: a new version
    # replacing the rows (and creating the table when it is missing), never a delete of what
    # another run may still be reading
    writer = (
        frames.write.format("blobhouse")
        .mode("overwrite")
        .option("blob_columns", ",".join(BLOB_COLUMNS))
        .options(**storage_prefixed(options))
    )
    run_spark_job(
        spark,
        lambda: writer.save(out),
        step="write",
        progress=task_progress,
        counted=generated,
    )
    write_s = time.perf_counter() - started
    stats = open_table(out, storage_options=options).stats()
    reader = spark.read.format("blobhouse").options(**storage_prefixed(options))

    progress("querying with Spark SQL and read_blob ...")
    reader.load(out).createOrReplaceTempView("episodes")
    first_frames = run_spark_job(
        spark,
        spark.sql(
            "SELECT episode, count(*) AS frames, sum(length(read_blob(video))) AS video_bytes "
            "FROM episodes WHERE frame % 30 = 0 GROUP BY episode ORDER BY episode"
        ).collect,
        step="query",
        progress=task_progress,
    )

    progress("reading every blob back on the executors and checking its bytes ...")
    started = time.perf_counter()
    totals = read_back(spark, out, data, options, task_progress)
    read_s = time.perf_counter() - started
    return {
        "table": out,
        "rows": stats["rows"],
        "logical_bytes": stats["logical_bytes"],
        "physical_bytes": stats["physical_bytes"],
        "dedup_ratio": stats["dedup_ratio"],
        "write_mb_s": round(stats["logical_bytes"] / write_s / 1e6, 1),
        # each stored range is read (and hashed) once by each task whose rows share it
        "read_mb_s": round(totals["read_bytes"] / read_s / 1e6, 1),
        "read_bytes": totals["read_bytes"],
        "verified_blobs": totals["checked"],
        "mismatches": totals["mismatches"],
        "sql_first_frames": [row.asDict() for row in first_frames],
        "columns": {
            c: {k: v for k, v in s.items() if k != "kinds"} for c, s in stats["columns"].items()
        },
    }


def read_back(
    spark,
    out: str,
    data: EpisodeData,
    options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, int]:
    """Every payload of the demo table at ``out`` read on the executors and checked
    (:class:`ReadBack`): the references checked, mismatches, logical bytes and bytes read."""
    from pyspark.sql import functions as F

    from blobhouse.spark.datasource import storage_prefixed
    from blobhouse.spark.jobs import amounts_counter, run_spark_job

    counter = amounts_counter(spark)
    refs = spark.read.format("blobhouse").options(**storage_prefixed(options)).load(out)
    checks = refs.select("row", *BLOB_COLUMNS).mapInArrow(
        ReadBack(data, options, counter),
        "checked long, mismatches long, bytes long, read_bytes long",
    )
    sums = [F.sum(c).alias(c) for c in ("checked", "mismatches", "bytes", "read_bytes")]
    totals = run_spark_job(
        spark, checks.agg(*sums).first, step="read", progress=progress, counted=counter
    )
    return {key: value or 0 for key, value in totals.asDict().items()}


def _check_out(uri: str, options: StorageOptions | None) -> None:
    """Refuse an ``--out`` that holds anything but a demo table (the demo overwrites its own
    table, never someone's files or tables)."""
    if is_local(uri):
        path = uri_to_path(uri)
        taken = next((p for p in [path, *Path(path).absolute().parents] if os.path.isfile(p)), None)
        if taken is not None:
            raise InvalidInputError(f"--out {uri}: {taken} is a file; give a directory")
    names = {info.name.split("/", 1)[0] for info in object_store(uri, options).list(uri)}
    if names and VERSIONS_DIR not in names:
        raise InvalidInputError(
            f"--out {uri} holds other files ({', '.join(sorted(names)[:3])}); the demo writes "
            "its table to a new place or over its own table, never among other files"
        )
    if names:
        from blobhouse.table import open_table

        columns = open_table(uri, storage_options=options).schema.names
        if columns != DEMO_COLUMNS:
            raise InvalidInputError(
                f"--out {uri} is a table with other columns ({', '.join(columns[:4])}, ...), "
                "not the demo's; the demo overwrites only its own table"
            )


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _generate(
    data: EpisodeData, ids: Iterator[pa.RecordBatch], counter: Any
) -> Iterator[pa.RecordBatch]:
    from blobhouse.spark.jobs import counted_batches

    for batch in ids:
        yield from counted_batches(
            data.batches_for(batch.column("id").to_pylist()), counter, BLOB_COLUMNS
        )
