"""One of several processes appending the same new payloads at one moment
(tests/store/test_duplicates.py): waits for the start file, then appends rows
``100 * (worker + 1) + i`` carrying the test's shared payloads.

Usage: duplicate_writer_worker.py <table uri> <start file> <worker>
"""

from __future__ import annotations

import os
import random
import sys
import time

import pyarrow as pa

from blobhouse import blob_array, write_table


def main(uri: str, start: str, worker: int) -> None:
    shared = [random.Random(7 * 1000 + i).randbytes(200_000) for i in range(12)]
    data = pa.table(
        {
            "id": pa.array([100 * (worker + 1) + i for i in range(12)], pa.int64()),
            "b": blob_array(shared),
        }
    )
    while not os.path.exists(start):
        time.sleep(0.005)
    write_table(data, uri, mode="append")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
