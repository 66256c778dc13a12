"""Spark targets, measured side by side in one run (medians of N rounds, contenders alternating).

    .venv/bin/python -m bench.spark_targets [--rows 20000] [--blob-kb 256] [--runs 5]

1. Reading references through the blobhouse data source, against the floor of any pyspark
   Python data source (a source yielding the same columns, reference structs included, from
   memory with no I/O) and against ``spark.read.parquet`` of the non-blob columns.
2. ``read_blob`` and ``materialize`` MB/s over every blob (warm page cache), against Spark's
   own floor for each: an Arrow UDF (for ``read_blob``) and a ``mapInArrow`` (for
   ``materialize``) that return a preallocated binary column of the same sizes, no I/O; what is
   left is Spark moving the bytes from the Python worker into rows. Each also without its hash
   check (``check_hashes=False``), in the same rounds: what the check costs; and the scan of
   references without the recorded hashes they carry (``option("check_hashes", "false")``).
3. Writing with dedup off vs ``df.write.parquet`` of the same data.
4. The natural ``df.write`` of robot frames whose video chunks repeat across partitions (each
   chunk shared by 30 consecutive frames, rows dealt round-robin to the tasks, a thumbnail per
   frame), with the default dedup: bytes on disk against the unique bytes, and seconds against
   ``df.write.parquet`` of the same rows (which stores every row's bytes).
5. A count: ``df.count()`` of the references and of the Parquet copy, and ``bs.count_rows``
   (the table's metadata on the driver, no job).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType

import blobhouse.spark as bs
from bench.harness import medians
from blobhouse.dedup import content_hashes
from blobhouse.files.ranges import REF_TYPE
from blobhouse.spark.datasource import BlobhouseDataSource, BlobhouseWriter, WrittenFiles

_PARTITIONS = 4
_FLOOR_SCHEMA = pa.schema(
    [pa.field("id", pa.int64()), pa.field("group", pa.int64()), pa.field("payload", REF_TYPE)]
)


class _FloorReader(DataSourceReader):
    def __init__(self, rows: int, blob: int, uri: str) -> None:
        self.rows, self.blob, self.uri = rows, blob, uri

    def partitions(self):
        return [InputPartition(i) for i in range(_PARTITIONS)]

    def read(self, partition):
        ids = np.arange(partition.value, self.rows, _PARTITIONS, dtype=np.int64)
        one = np.zeros(len(ids), dtype=np.int64)
        refs = pa.StructArray.from_arrays(
            [
                pa.array([self.uri], pa.utf8()).take(one),
                pa.array(ids * self.blob),
                pa.array(np.full(len(ids), self.blob, dtype=np.int64)),
                pa.array([bytes(32)], pa.binary()).take(one),  # a blake3 per reference
            ],
            fields=list(REF_TYPE),
        )
        yield pa.record_batch([ids, ids % 97, refs], schema=_FLOOR_SCHEMA)


class _FloorSource(DataSource):
    """The cheapest possible Python data source: the columns the blobhouse source yields (one
    data file's uri in every reference) as Arrow batches from memory."""

    @classmethod
    def name(cls):
        return "bh_floor"

    def schema(self):
        return (
            "id long, group long, payload struct<uri string, position long, size long, "
            "blake3 binary>"
        )

    def reader(self, schema):
        options = self.options
        return _FloorReader(int(options["rows"]), int(options["blob"]), options["uri"])


class _SinkWriter(DataSourceArrowWriter):
    """Takes a task's batches and drops them: what Spark costs to hand the rows to a Python
    writer. With ``hash_values``, also blake3 of every binary value, as blobhouse's writer
    hashes them (``content_hashes``: every core)."""

    def __init__(self, hash_values: bool) -> None:
        self.hash_values = hash_values

    def write(self, iterator):
        for batch in iterator:
            if self.hash_values:
                for column in batch.columns:
                    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
                        content_hashes([v.as_buffer() for v in column if v.is_valid])
        return WriterCommitMessage()


class _SinkSource(DataSource):
    """A Python data source that writes nothing: the floor of any Python writer."""

    @classmethod
    def name(cls):
        return "bh_sink"

    def writer(self, schema, overwrite):
        return _SinkWriter(self.options.get("hash") == "1")


@dataclass(frozen=True)
class _MeasuredFiles(WrittenFiles):
    start_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0


def _status_mb(field: str) -> float:
    return int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024


class _MeasuredWriter(BlobhouseWriter):
    """blobhouse's writer, reporting each task's Python worker RSS when the task starts and at
    its peak to ``peaks``, a JSON file (pyspark commits in a Python process of its own, not the
    driver's). A reused worker starts a task holding what earlier tasks left (the rows it
    generated, say): what the task adds is the difference."""

    def __init__(self, attempt, peaks: str) -> None:
        super().__init__(attempt)
        self.peaks = peaks

    def write(self, iterator):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # Linux: resets VmHWM to the current RSS
        start = _status_mb("VmRSS")
        written = super().write(iterator)
        return _MeasuredFiles(written.files, start, _status_mb("VmHWM"))

    def commit(self, messages):
        super().commit(messages)
        tasks = [(m.start_rss_mb, m.peak_rss_mb) for m in messages if m is not None]
        Path(self.peaks).write_text(json.dumps(tasks))


class _MeasuredSource(BlobhouseDataSource):
    @classmethod
    def name(cls):
        return "bh_measured"

    def writer(self, schema, overwrite):
        peaks = self.options.pop("peaks")  # the bench's, not a blobhouse write option
        return _MeasuredWriter(super().writer(schema, overwrite).attempt, peaks)


_FILLED: list[pa.Buffer] = []  # one buffer per worker process, shared by every batch


def _preallocated(refs: pa.Array) -> pa.Array:
    """A binary column of the sizes ``refs`` name, over one buffer allocated (and touched)
    once per process: the bytes Spark moves, with no I/O and no allocation per batch."""
    sizes = refs.field("size").to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if not _FILLED or _FILLED[0].size < offsets[-1]:
        _FILLED[:] = [pa.py_buffer(np.ones(int(offsets[-1]), dtype=np.uint8))]
    return pa.Array.from_buffers(
        pa.large_binary(), len(sizes), [None, pa.py_buffer(offsets), _FILLED[0]]
    )


_floor_udf = arrow_udf(_preallocated, BinaryType())


def _floor_map(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield batch.set_column(2, "payload", _preallocated(batch.column("payload")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--blob-kb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run(args.rows, args.blob_kb, args.runs), indent=2))


def bench_session():
    """The bench's Spark session (every case that runs Spark shares it: a session made first
    with less memory would be the one the later cases get)."""
    # Spark's Parquet writer holds row groups of 1-3 MB binaries on the heap: it needs more
    # than the default 4g for the shared-chunks rows (blobhouse writes them with 2g)
    spark = bs.local_session("local[2]", shuffle_partitions=_PARTITIONS, driver_memory="8g")
    bs.register(spark)
    return spark


def run(rows: int, blob_kb: int, runs: int) -> dict:
    """Measure every Spark target once; returns seconds, ratios and MB/s."""
    spark = bench_session()
    root = tempfile.mkdtemp(prefix="bh-bench-")
    blob = blob_kb * 1024

    def payloads(batches):
        for batch in batches:
            ids = batch.column("id").to_pylist()
            yield pa.record_batch(
                {
                    "id": pa.array(ids, pa.int64()),
                    "group": pa.array([i % 97 for i in ids], pa.int64()),
                    "payload": pa.array([os.urandom(blob) for _ in ids], pa.binary()),
                }
            )

    # incompressible payloads, computed once: every contender writes the same rows
    source = (
        spark.range(rows, numPartitions=_PARTITIONS)
        .mapInArrow(payloads, "id long, group long, payload binary")
        .localCheckpoint()
    )
    total_mb = rows * blob / 1e6

    def write_blobhouse():
        shutil.rmtree(f"{root}/bh", ignore_errors=True)
        (
            source.write.format("blobhouse")
            .mode("append")
            .option("blob_columns", "payload")
            .option("dedup", "off")
            .save(f"{root}/bh")
        )

    def write_parquet():
        source.write.mode("overwrite").parquet(f"{root}/pq")

    writes = medians({"parquet": write_parquet, "blobhouse": write_blobhouse}, runs)
    results = {"rows": rows, "blob_bytes": blob}
    results["write_parquet_s"] = writes["parquet"]
    results["write_blobhouse_s"] = writes["blobhouse"]
    results["write_ratio"] = writes["parquet"] / writes["blobhouse"]

    results.update(_shared_chunks(spark, root, rows, runs))

    refs = spark.read.format("blobhouse").load(f"{root}/bh")
    unchecked_refs = (
        spark.read.format("blobhouse").option("check_hashes", "false").load(f"{root}/bh")
    )
    parquet = spark.read.parquet(f"{root}/pq").select("id", "group")
    spark.dataSource.register(_FloorSource)
    floor = (
        spark.read.format("bh_floor")
        .options(rows=str(rows), blob=str(blob), uri=refs.first()["payload"]["uri"])
        .load()
    )
    scans = medians(
        {
            "parquet": lambda: parquet.agg(F.sum("id")).collect(),
            "refs": lambda: refs.agg(F.sum("id"), F.sum(F.col("payload.size"))).collect(),
            "refs unchecked": lambda: unchecked_refs.agg(
                F.sum("id"), F.sum(F.col("payload.size"))
            ).collect(),
            "floor": lambda: floor.agg(F.sum("id"), F.sum(F.col("payload.size"))).collect(),
            "count parquet": parquet.count,
            "count refs": refs.count,
            "count_rows": lambda: bs.count_rows(f"{root}/bh"),
        },
        runs,
    )
    # a count: Spark's df.count() of each, and blobhouse's count from the table's metadata
    results["count_parquet_s"] = scans["count parquet"]
    results["count_refs_s"] = scans["count refs"]
    results["count_ratio"] = scans["count parquet"] / scans["count refs"]
    results["count_rows_s"] = scans["count_rows"]
    results["count_rows_ratio"] = scans["count parquet"] / scans["count_rows"]
    results["scan_parquet_s"] = scans["parquet"]
    results["scan_refs_s"] = scans["refs"]
    results["scan_ratio"] = scans["parquet"] / scans["refs"]
    results["scan_python_source_floor_s"] = scans["floor"]
    results["floor_ratio"] = scans["parquet"] / scans["floor"]
    results["scan_vs_floor"] = scans["floor"] / scans["refs"]
    # what looking up the recorded hash each reference carries costs the scan
    results["scan_refs_unchecked_s"] = scans["refs unchecked"]
    results["scan_checked_vs_unchecked"] = scans["refs unchecked"] / scans["refs"]

    def total_length(df, column) -> None:
        df.select(F.sum(F.length(column))).collect()

    unchecked_read_blob = bs.read_blob_function(check_hashes=False)
    reads = medians(
        {
            "read_blob": lambda: total_length(refs, bs.read_blob("payload")),
            "read_blob_unchecked": lambda: total_length(refs, unchecked_read_blob("payload")),
            "read_blob_floor": lambda: total_length(refs, _floor_udf("payload")),
            "materialize": lambda: total_length(bs.materialize(refs, ["payload"]), "payload"),
            "materialize_unchecked": lambda: total_length(
                bs.materialize(refs, ["payload"], check_hashes=False), "payload"
            ),
            "materialize_floor": lambda: total_length(
                refs.mapInArrow(_floor_map, "id long, group long, payload binary"), "payload"
            ),
        },
        runs,
    )
    for name in ("read_blob", "materialize"):
        results[f"{name}_mb_s"] = total_mb / reads[name]
        results[f"{name}_unchecked_mb_s"] = total_mb / reads[f"{name}_unchecked"]
        results[f"{name}_floor_mb_s"] = total_mb / reads[f"{name}_floor"]
        results[f"{name}_vs_floor"] = reads[f"{name}_floor"] / reads[name]
        # the hash check's cost: the checked read's speed as a fraction of the unchecked one's
        results[f"{name}_checked_vs_unchecked"] = reads[f"{name}_unchecked"] / reads[name]
    shutil.rmtree(root, ignore_errors=True)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}


def _shared_chunks(spark, root: str, rows: int, runs: int) -> dict:
    """Target 4: frames sharing 1-3 MB video chunks, 30 frames a chunk, dealt round-robin to
    the tasks (so every task meets every chunk of its range), a 50 KB thumbnail per frame."""
    frames = max(_PARTITIONS * 30, rows // 16)  # full size: ~1 GB of rows
    unit = 1 << 20 if rows >= 4000 else 64 << 10  # the quick run: small chunks
    chunk_sizes = [(1 + c % 3) * unit for c in range(frames // 30 + 1)]

    def generate(batches):
        for batch in batches:
            ids = batch.column("id").to_pylist()
            yield pa.record_batch(
                {
                    "frame": pa.array(ids, pa.int64()),
                    "video": pa.array(
                        [np.random.default_rng(i // 30).bytes(chunk_sizes[i // 30]) for i in ids],
                        pa.binary(),
                    ),
                    "thumb": pa.array(
                        [np.random.default_rng(10**9 + i).bytes(50_000) for i in ids], pa.binary()
                    ),
                }
            )

    source = (
        spark.range(frames, numPartitions=_PARTITIONS)
        .mapInArrow(generate, "frame long, video binary, thumb binary")
        .repartition(_PARTITIONS)  # round-robin: each chunk's frames in every task
        .localCheckpoint()
    )
    unique = sum(chunk_sizes[: (frames - 1) // 30 + 1]) + frames * 50_000

    def write_blobhouse():
        shutil.rmtree(f"{root}/shared", ignore_errors=True)
        source.write.format("blobhouse").mode("append").option("blob_columns", "video,thumb").save(
            f"{root}/shared"
        )

    def write_parquet():
        source.write.mode("overwrite").parquet(f"{root}/shared_pq")

    spark.dataSource.register(_SinkSource)

    def write_sink(hash_values: str):
        source.write.format("bh_sink").mode("append").option("hash", hash_values).save()

    times = medians(
        {
            "parquet": write_parquet,
            "blobhouse": write_blobhouse,
            "sink": lambda: write_sink("0"),
            "sink_hash": lambda: write_sink("1"),
        },
        runs,
    )
    spark.dataSource.register(_MeasuredSource)
    shutil.rmtree(f"{root}/measured", ignore_errors=True)
    peaks = f"{root}/peaks.json"
    (
        source.write.format("bh_measured")
        .mode("append")
        .option("blob_columns", "video,thumb")
        .option("peaks", peaks)
        .save(f"{root}/measured")
    )
    tasks = json.loads(Path(peaks).read_text())
    on_disk = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{root}/shared") for f in fs
    )
    parquet_disk = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{root}/shared_pq") for f in fs
    )
    return {
        "shared_frames": frames,
        "shared_unique_bytes": unique,
        "shared_bytes_on_disk": on_disk,
        "shared_parquet_bytes_on_disk": parquet_disk,
        "shared_ratio_to_unique": on_disk / unique,
        "write_shared_parquet_s": times["parquet"],
        "write_shared_blobhouse_s": times["blobhouse"],
        "write_shared_vs_parquet": times["parquet"] / times["blobhouse"],
        # where the time goes: handing the rows to Python workers, then hashing them
        "write_shared_python_floor_s": times["sink"],
        "write_shared_python_floor_hash_s": times["sink_hash"],
        "write_shared_vs_python_floor": times["sink"] / times["blobhouse"],
        "write_shared_worker_peak_rss_mb": round(max(p for _, p in tasks), 1),
        "write_shared_worker_added_mb": round(max(p - s for s, p in tasks), 1),
        # what one task hands its writer: a quarter of the rows' bytes
        "write_shared_task_mb": round(
            sum(chunk_sizes[i // 30] + 50_000 for i in range(frames)) / _PARTITIONS / 1e6, 1
        ),
    }


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
