"""Processes that work on one table at the same time, for the concurrency test.

``python concurrent_writer_worker.py URI WORKER_ID WRITES SEED [GO_FILE [DEDUP]]`` appends
``WRITES`` batches of 1-8 rows whose ids are ``WORKER_ID * 1_000_000 + n`` and whose payload is
``payload(id)``; each write draws a dedup mode (content, global, off) from ``SEED`` and sets
it as the table's property first (beside the other writers), or writes with the table's own
when ``DEDUP`` is given. Half the payloads come from a small pool every worker shares (global
dedup shares store packs across processes), the rest are the worker's own; sizes are inline
(100 B), packed (20 kB) and dedicated (120 kB), as in ``crash_worker.py``. A write that fails
with an error documented as
retryable (blobhouse's ``StoreRaceError`` and ``StaleWriteError``, Lance's ``CommitConflictError``
with ``retryable``) is retried, at most ``RETRIES`` times; any other error fails the write and is
recorded with its class and message. With ``GO_FILE``, the worker creates
``GO_FILE.<WORKER_ID>.ready`` once imported and starts when ``GO_FILE`` exists, so every process
starts at the same instant (the other roles too: ``GO_FILE.maintain.ready``...).

``python concurrent_writer_worker.py maintain URI STOP_FILE GRACE_SECONDS RETAIN_VERSIONS
VERSION_GRACE_SECONDS [GO_FILE]`` loops compaction then ``Table.gc`` (files older than the grace,
versions past the last ``RETAIN_VERSIONS`` and older than their grace, 0: any) until
``STOP_FILE`` exists; a compaction that fails is recorded, with a check that it left no file and
no version behind.

``python concurrent_writer_worker.py delete URI STOP_FILE [GO_FILE]`` deletes the rows of
:func:`deletable` every ``DELETE_PAUSE`` seconds until ``STOP_FILE`` exists.

Each prints one JSON line (its counts) as the last line of its stdout.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from datetime import timedelta

import pyarrow as pa

from blobhouse import blob_array, errors, open_table, write_table
from blobhouse.maintenance import compaction
from blobhouse.maintenance.compaction import compact_group

SIZES = (100, 20_000, 120_000)  # inline, packed, dedicated (threshold 100 kB below)
PLACEMENT = {"b": {"dedicated_size_threshold": 100_000}}
ID_SPAN = 1_000_000
SHARED = 6  # payloads every worker writes (global dedup finds them in each other's packs)
RETRIES = 5
DELETE_FILTER = "id % 10 = 7"
DELETE_PAUSE = 0.5  # seconds: most compactions commit between deletes, some are preempted


def payload(row_id: int) -> bytes:
    """Deterministic bytes of a row: readers check every row against it."""
    n = row_id % ID_SPAN
    if n % 2 == 0:  # from the pool every worker shares
        key = (n // 2) % SHARED
        return b"shared-%d:" % key + bytes([key]) * SIZES[key % 3]
    return row_id.to_bytes(8, "little") * (SIZES[n % 3] // 8)


def deletable(row_id: int) -> bool:
    """Rows the deleting process removes (``DELETE_FILTER``)."""
    return row_id % 10 == 7


# blobhouse errors documented as "nothing was committed, retrying the write succeeds"
RETRYABLE = tuple(
    getattr(errors, name) for name in ("StoreRaceError", "StaleWriteError") if hasattr(errors, name)
)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RETRYABLE) or getattr(exc, "retryable", False) is True


def _error(exc: BaseException) -> dict:
    kind = type(exc)
    return {"error": f"{kind.__module__}.{kind.__qualname__}", "message": str(exc)[:600]}


def wait_for_go(go: str | None, name: str) -> None:
    """Imports done: say so (``GO.<name>.ready``), and start when ``GO`` exists."""
    if go:
        open(f"{go}.{name}.ready", "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)


def writer(
    uri: str, worker_id: int, writes: int, seed: int, go: str | None, dedup: str | None
) -> dict:
    rng = random.Random(seed * 1000 + worker_id)
    wait_for_go(go, str(worker_id))
    next_id = worker_id * ID_SPAN
    committed: list[list[int]] = []  # [first id, rows] of every committed write
    failed: list[dict] = []
    retried: dict[str, int] = {}
    property_changes = 0
    slowest = 0.0
    for _ in range(writes):
        count = rng.randint(1, 8)
        ids = list(range(next_id, next_id + count))
        next_id += count
        mode = dedup or rng.choice(["content", "global", "off"])
        data = pa.table(
            {"id": pa.array(ids, pa.int64()), "b": blob_array([payload(i) for i in ids])}
        )
        for attempt in range(RETRIES + 1):
            started = time.monotonic()
            try:
                table = open_table(uri)
                if dedup is None and table.properties.dedup != mode:
                    # the table's mode changes beside the other writers (a change another
                    # writer made meanwhile leaves nothing to change: no version)
                    version = table.version
                    property_changes += table.set_properties(dedup=mode).version != version
                write_table(data, uri, mode="append")
            except Exception as exc:
                slowest = max(slowest, time.monotonic() - started)
                if _retryable(exc) and attempt < RETRIES:
                    retried[type(exc).__name__] = retried.get(type(exc).__name__, 0) + 1
                    continue
                failed.append({"ids": [ids[0], count], "dedup": mode, **_error(exc)})
                break
            slowest = max(slowest, time.monotonic() - started)
            committed.append([ids[0], count])
            break
    return {
        "worker": worker_id,
        "writes": writes,
        "commits": len(committed),
        "failures": len(failed),
        "retries": sum(retried.values()),
        "retried": retried,
        "committed": committed,
        "failed": failed,
        "property_changes": property_changes,
        "slowest_write_seconds": round(slowest, 3),
    }


def _staged(uri: str, prefix: str) -> list[str]:
    """Files whose name starts with ``prefix`` under the table's data directory."""
    return [
        name
        for _, _, names in os.walk(os.path.join(uri, "data"))
        for name in names
        if name.startswith(prefix)
    ]


def compact_once(uri: str) -> tuple[dict | None, dict | None]:
    """One compaction: (its report, None) or (None, its error). A compaction that fails must
    leave nothing behind: no staged file and no version referencing its files."""
    plans = []

    def group(table, plan, unit):
        plans.append(plan)
        return compact_group(table, plan, unit)

    compaction.compact_group = group  # (this process runs nothing else meanwhile)
    try:
        return compaction.compact(open_table(uri), target_rows=64), None
    except Exception as exc:
        error = _error(exc) | {"retryable": _retryable(exc), "clean": True}
        if plans:
            prefix = plans[0].name_prefix
            latest = open_table(uri).dataset
            used = {f.path for g in latest.get_fragments() for f in g.metadata.files}
            error["clean"] = not _staged(uri, prefix) and not any(
                p.startswith(prefix) for p in used
            )
        return None, error
    finally:
        compaction.compact_group = compact_group


def maintain(
    uri: str,
    stop_file: str,
    grace: float,
    retain_versions: int,
    version_grace: float,
    go: str | None = None,
) -> dict:
    wait_for_go(go, "maintain")
    counts = {"compactions": 0, "idle_compactions": 0, "gc_passes": 0}
    counts |= {"retired": 0, "reaped": 0, "removed_files": 0, "removed_versions": 0}
    conflicts: list[dict] = []
    gc_failures: list[dict] = []
    while not os.path.exists(stop_file):
        report, error = compact_once(uri)
        if error is not None:
            conflicts.append(error)
        else:
            counts["compactions" if report["fragments_removed"] else "idle_compactions"] += 1
        try:
            # versions younger than version_grace are kept too: a write or a delete that read
            # one may still be running (0: versions by count only, as store_race_worker does)
            report = open_table(uri).gc(
                retain_versions=retain_versions,
                older_than=timedelta(seconds=version_grace) if version_grace else None,
                grace=timedelta(seconds=grace),
            )
        except Exception as exc:
            gc_failures.append(_error(exc))
            continue
        counts["gc_passes"] += 1
        counts["retired"] += report["retired_packs"]
        counts["reaped"] += report["reaped_packs"]
        counts["removed_files"] += report["removed_files"]
        counts["removed_versions"] += len(report["removed_versions"])
    return counts | {
        "compaction_conflicts": len(conflicts),
        "conflicts": conflicts,
        "gc_failures": gc_failures,
    }


def deleter(uri: str, stop_file: str, go: str | None = None) -> dict:
    wait_for_go(go, "delete")
    deletes = 0
    failed: list[dict] = []
    while not os.path.exists(stop_file):
        try:
            open_table(uri).delete(DELETE_FILTER)
            deletes += 1
        except Exception as exc:
            failed.append(_error(exc))
        time.sleep(DELETE_PAUSE)
    return {"deletes": deletes, "delete_failures": len(failed), "failed": failed}


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "maintain":
        result = maintain(args[1], args[2], float(args[3]), int(args[4]), float(args[5]), *args[6:])
    elif args[0] == "delete":
        result = deleter(args[1], args[2], *args[3:])
    else:  # URI WORKER_ID WRITES SEED [GO_FILE [DEDUP]]
        go, dedup = [*args[4:], None, None][:2]
        result = writer(args[0], int(args[1]), int(args[2]), int(args[3]), go, dedup)
    print(json.dumps(result), flush=True)
