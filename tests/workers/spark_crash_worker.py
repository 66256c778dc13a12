"""A Spark job that appends forever, to be killed (SIGKILL, every process of it) at a random
point by the Spark crash test.

``python spark_crash_worker.py URI SEED``: a local Spark session (``local[2]``), then writes of
rows with ids from ``SEED * 10_000`` on, whose payload is ``payload(id)`` (as the Python crash
worker's). Each write spreads its rows over 2-4 partitions, so several tasks write data files
(and sidecars, store packs) at once. It prints ``writing FIRST LAST HOW DEDUP`` before a write
and ``committed LAST`` after its commit. Each write goes, at random, through
``blobhouse.spark.write_table`` (shuffle by payload hash first; for global dedup a join with the
store index on the executors) or plain ``df.write.format("blobhouse")`` (tasks load the store
index themselves and claim new payloads), with the table's ``dedup`` drawn from content, global
and off before each write (a property change: a commit of its own). A kill lands in any phase
of a Spark write: the driver's plan, the tasks' file writes, the Lance commit, the store index
append after it.
"""

from __future__ import annotations

import json
import random
import sys

from crash_worker import PLACEMENT, payload, use_mode

from blobhouse.spark import local_session, register, write_table


def main(uri: str, seed: int) -> None:
    rng = random.Random(seed)
    spark = local_session("local[2]", shuffle_partitions=4, driver_memory="1g")
    register(spark)
    next_id = seed * 10_000
    while True:
        count = rng.randint(4, 24)
        ids = list(range(next_id, next_id + count))
        next_id += count
        partitions = rng.randint(2, 4)
        rows = spark.sparkContext.parallelize([(i, payload(i)) for i in ids], partitions)
        df = spark.createDataFrame(rows, "id long, b binary")
        dedup = rng.choice(["content", "global", "off"])
        how = rng.choice(["write_table", "df.write"])
        options = use_mode(uri, dedup, json.dumps(PLACEMENT))
        print(f"writing {ids[0]} {ids[-1]} {how} {dedup}", flush=True)
        if how == "write_table":
            write_table(
                df,
                uri,
                mode="append",
                blob_columns=["b"],
                partitions=partitions,
                options=options,
            )
        else:
            df.write.format("blobhouse").mode("append").option("blob_columns", "b").options(
                **options
            ).save(uri)
        print(f"committed {ids[-1]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
