"""A writer that appends forever, to be killed (SIGKILL) at a random point by the crash test.

``python crash_worker.py URI SEED [STORAGE_OPTIONS_JSON]``: rows with ids from
``SEED * 10_000`` on, whose payload is ``payload(id)``; the table's dedup mode alternates
between per-file and global (a property change before a write) and sizes (inline, packed,
dedicated), so a kill lands in every phase: sidecars, data files, store packs, the Lance
commit, the store index append.
"""

from __future__ import annotations

import json
import random
import sys

import pyarrow as pa

from blobhouse import TableNotFoundError, blob_array, open_table, write_table

SIZES = (100, 20_000, 120_000)
PLACEMENT = {"b": {"dedicated_size_threshold": 100_000}}


def payload(row_id: int) -> bytes:
    """Deterministic bytes of a row: readers check every row against it."""
    size = SIZES[row_id % 3]
    return row_id.to_bytes(8, "little") * (size // 8)


def use_mode(uri: str, dedup: str, placement: dict, storage_options: dict | None = None) -> dict:
    """Make ``dedup`` the table's mode: a property change (a commit of its own, where a kill may
    land too); a table not created yet gets it from its first write, with the options
    returned."""
    try:
        table = open_table(uri, storage_options=storage_options)
    except TableNotFoundError:
        return {"dedup": dedup, "placement": placement}
    if table.properties.dedup != dedup:
        table.set_properties(dedup=dedup)
    return {}


def main(uri: str, seed: int, storage_options: dict | None = None) -> None:
    rng = random.Random(seed)
    next_id = seed * 10_000
    while True:
        count = rng.randint(1, 12)
        ids = list(range(next_id, next_id + count))
        next_id += count
        data = pa.table(
            {"id": pa.array(ids, pa.int64()), "b": blob_array([payload(i) for i in ids])}
        )
        dedup = rng.choice(["content", "global", "off"])
        options = use_mode(uri, dedup, PLACEMENT, storage_options)
        write_table(data, uri, mode="append", storage_options=storage_options, **options)
        print(f"committed {ids[-1]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
