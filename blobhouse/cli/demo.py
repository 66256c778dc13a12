"""The demo job, on Spark: a robot-episode training table generated on the executors, written with
dedup, queried with Spark SQL and ``read_blob``, and every byte checked.

Rows are camera frames at 30 Hz. Every 30 frames share one video chunk (1-6 MB), every frame of
an episode shares one calibration file, and each frame has its own small thumbnail: the
"physically low-frequency, logically high-frequency" shape of seed 000.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from blobhouse.dedup import content_hash
from blobhouse.errors import InvalidInputError
from blobhouse.io.objects import (
    StorageOptions,
    checked_options,
    is_local,
    object_store,
    uri_to_path,
)
from blobhouse.layout import VERSIONS_DIR

FPS = 30
FRAMES_PER_EPISODE = 300
MiB = 1 << 20
BLOB_COLUMNS = ("video", "calibration", "thumbnail")
ROW_SCHEMA = (
    "row long, episode long, frame long, timestamp_s double, video_chunk long, "
    "video binary, calibration binary, thumbnail binary"
)
DEMO_COLUMNS = [column.split()[0] for column in ROW_SCHEMA.split(", ")]


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
        rng = np.random.default_rng((self.seed, 1, chunk_id))
        return rng.bytes(int(rng.integers(1 * MiB, 6 * MiB + 1)))

    def calibration(self, episode: int) -> bytes:
        return np.random.default_rng((self.seed, 2, episode)).bytes(256 * 1024)

    def thumbnail(self, row: int) -> bytes:
        rng = np.random.default_rng((self.seed, 3, row))
        return rng.bytes(int(rng.integers(2048, 8193)))

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

    def check(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """For ``mapInArrow``: compare materialized blob columns with what was generated."""
        expected: dict[tuple[str, int], bytes] = {}
        for batch in batches:
            rows = batch.column("row").to_pylist()
            checked = mismatches = nbytes = 0
            for column in BLOB_COLUMNS:
                for row, payload in zip(rows, batch.column(column).to_pylist(), strict=True):
                    key = (column, self.payload_id(column, row))
                    if key not in expected:
                        expected[key] = content_hash(self.payload(column, row))
                    checked += 1
                    nbytes += len(payload or b"")
                    mismatches += payload is None or content_hash(payload) != expected[key]
            yield pa.record_batch(
                {"checked": [checked], "mismatches": [mismatches], "bytes": [nbytes]}
            )


def run_demo(
    out: str,
    rows: int = 1800,
    master: str = "local[*]",
    progress: Callable[[str], None] = print,
    storage_options: Mapping[str, str] | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    task_progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Generate, write, query and verify the demo table at ``out`` on Spark (``master``, with
    the Spark settings ``conf``). An existing table at ``out`` is overwritten (a new version:
    earlier ones stay until ``blobhouse gc``); anything else there is refused, never deleted.
    ``out`` may be on an object store that ``storage_options`` reach.

    Ctrl-C cancels the Spark jobs and waits for them (:func:`blobhouse.spark.jobs.run_spark_job`):
    an interrupted write removes what its tasks staged and commits nothing.
    ``task_progress(step, done, total)`` is told the Spark tasks of each step as they finish."""
    from blobhouse.extras import require_spark

    require_spark("the demo")  # without pyspark: one line naming the spark extra
    from pyspark.sql import functions as F

    import blobhouse.spark as bs
    from blobhouse.spark.datasource import storage_prefixed
    from blobhouse.spark.jobs import run_spark_job
    from blobhouse.table import open_table

    options = checked_options(storage_options)
    _check_out(out, options)
    progress(f"starting Spark ({master}) ...")
    spark = bs.local_session(master, conf=conf)
    bs.register(spark, storage_options=options)
    data = EpisodeData(rows)
    tasks = max(1, min(data.chunks, spark.sparkContext.defaultParallelism * 2))

    chunks, parts = _count(data.chunks, "video chunk"), _count(tasks, "task")
    progress(f"writing {rows} frames ({chunks}) in {parts} to {out} ...")
    started = time.perf_counter()
    frames = spark.range(data.chunks, numPartitions=tasks).mapInArrow(
        lambda ids: _generate(data, ids), ROW_SCHEMA
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
    run_spark_job(spark, lambda: writer.save(out), step="write", progress=task_progress)
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
    refs = reader.load(out).select("row", *BLOB_COLUMNS)
    checks = bs.materialize(refs, list(BLOB_COLUMNS), storage_options=options).mapInArrow(
        data.check, "checked long, mismatches long, bytes long"
    )
    totals = run_spark_job(
        spark,
        checks.agg(*[F.sum(c).alias(c) for c in ("checked", "mismatches", "bytes")]).first,
        step="read",
        progress=task_progress,
    )
    read_s = time.perf_counter() - started
    return {
        "table": out,
        "rows": stats["rows"],
        "logical_bytes": stats["logical_bytes"],
        "physical_bytes": stats["physical_bytes"],
        "dedup_ratio": stats["dedup_ratio"],
        "write_mb_s": round(stats["logical_bytes"] / write_s / 1e6, 1),
        "read_mb_s": round((totals["bytes"] or 0) / read_s / 1e6, 1),
        "verified_blobs": totals["checked"] or 0,
        "mismatches": totals["mismatches"] or 0,
        "sql_first_frames": [row.asDict() for row in first_frames],
        "columns": {
            c: {k: v for k, v in s.items() if k != "kinds"} for c, s in stats["columns"].items()
        },
    }


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


def _generate(data: EpisodeData, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in ids:
        yield from data.batches_for(batch.column("id").to_pylist())
