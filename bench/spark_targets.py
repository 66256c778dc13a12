"""Spark targets of the Spark issue, measured side by side in one run (medians of N runs).

    .venv/bin/python bench/spark_targets.py [--rows 20000] [--blob-kb 256] [--runs 5]

1. reading references through the blobhouse data source vs ``spark.read.parquet`` of the same
   non-blob columns (``count`` and a full scan);
2. ``read_blob`` and ``materialize`` MB/s over every blob (warm page cache);
3. writing with dedup off vs ``df.write.parquet`` of the same data.

The floor of any pyspark Python data source is measured too: a reader that yields the same
non-blob columns from memory, with no I/O at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

import blobhouse.spark as bs


class _FloorReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self):
        return [InputPartition(i) for i in range(4)]

    def read(self, partition):
        ids = np.arange(partition.value, self.rows, 4, dtype=np.int64)
        yield pa.record_batch({"id": ids, "group": ids % 97})


class _FloorSource(DataSource):
    """The cheapest possible Python data source: Arrow batches from memory."""

    @classmethod
    def name(cls):
        return "bh_floor"

    def schema(self):
        return "id long, group long"

    def reader(self, schema):
        return _FloorReader(int(self.options["rows"]))


def timed(fn, runs: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--blob-kb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run(args.rows, args.blob_kb, args.runs), indent=2))


def run(rows: int, blob_kb: int, runs: int) -> dict:
    """Measure every Spark target once; returns seconds, ratios and MB/s."""
    args = argparse.Namespace(rows=rows, blob_kb=blob_kb, runs=runs)
    spark = bs.local_session("local[2]", shuffle_partitions=4)
    bs.register(spark)
    root = tempfile.mkdtemp(prefix="bh-bench-")
    blob = args.blob_kb * 1024

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
        spark.range(args.rows, numPartitions=4)
        .mapInArrow(payloads, "id long, group long, payload binary")
        .localCheckpoint()
    )
    total_mb = args.rows * blob / 1e6

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

    results = {"rows": args.rows, "blob_bytes": blob}
    results["write_parquet_s"] = timed(write_parquet, args.runs)
    results["write_blobhouse_s"] = timed(write_blobhouse, args.runs)
    results["write_ratio"] = results["write_parquet_s"] / results["write_blobhouse_s"]

    refs = spark.read.format("blobhouse").load(f"{root}/bh")
    parquet = spark.read.parquet(f"{root}/pq").select("id", "group")
    results["scan_parquet_s"] = timed(lambda: parquet.agg(F.sum("id")).collect(), args.runs)
    results["scan_refs_s"] = timed(
        lambda: refs.agg(F.sum("id"), F.sum(F.col("payload.size"))).collect(), args.runs
    )
    results["scan_ratio"] = results["scan_parquet_s"] / results["scan_refs_s"]
    spark.dataSource.register(_FloorSource)
    floor = spark.read.format("bh_floor").option("rows", str(args.rows)).load()
    results["scan_python_source_floor_s"] = timed(
        lambda: floor.agg(F.sum("id")).collect(), args.runs
    )
    results["floor_ratio"] = results["scan_parquet_s"] / results["scan_python_source_floor_s"]
    read_blob_s = timed(
        lambda: refs.select(F.sum(F.length(bs.read_blob("payload")))).collect(), args.runs
    )
    materialize_s = timed(
        lambda: bs.materialize(refs, ["payload"]).select(F.sum(F.length("payload"))).collect(),
        args.runs,
    )
    results["read_blob_mb_s"] = total_mb / read_blob_s
    results["materialize_mb_s"] = total_mb / materialize_s
    shutil.rmtree(root, ignore_errors=True)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
