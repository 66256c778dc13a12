"""A writer or a gc loop on one table, for the concurrency test (run as a separate process).

``python store_race_worker.py writer URI ROUNDS`` appends and sometimes overwrites rows whose
payload is ``payload(id)``, with ``dedup="global"``, retrying a write gc raced; ``... gc URI
SECONDS`` runs gc with a short grace until the time is up. Each prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import pyarrow as pa

from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import StoreRaceError

GRACE = timedelta(seconds=2)


def payload(row_id: int) -> bytes:
    """Three phases of 15 rows, each with two payloads of its own: a phase's payloads go
    unreferenced once the next overwrite and gc have passed, and come back two phases later,
    when writers may find them in the index while gc retires or reaps their pack."""
    phase, k = (row_id // 15) % 3, row_id % 2
    return bytes([phase * 2 + k]) * (40_000 + phase * 2 + k)


def writer(uri: str, rounds: int) -> dict:
    races = 0
    for r in range(rounds):
        ids = [r * 3 + k for k in range(3)]
        data = pa.table(
            {"id": pa.array(ids, pa.int64()), "b": blob_array([payload(i) for i in ids])}
        )
        mode = "overwrite" if r % 5 == 0 else "append"  # every phase starts afresh
        while True:
            try:
                write_table(data, uri, mode=mode, dedup="global")
                break
            except StoreRaceError:
                races += 1
    return {"races": races}


def collector(uri: str, seconds: float) -> dict:
    runs = retired = reaped = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        report = open_table(uri).gc(retain_versions=2, grace=GRACE)
        runs += 1
        retired += report["retired_packs"]
        reaped += report["reaped_packs"]
    return {"runs": runs, "retired": retired, "reaped": reaped}


if __name__ == "__main__":
    role, uri, amount = sys.argv[1], sys.argv[2], float(sys.argv[3])
    result = writer(uri, int(amount)) if role == "writer" else collector(uri, amount)
    print(json.dumps(result))
