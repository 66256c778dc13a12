"""Measuring: alternate contenders, warm up, take medians; sizes on disk; peak memory."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Size:
    """How big each case runs: ``quick`` for CI smoke runs, ``full`` for BENCHMARKS.md."""

    name: str
    runs: int
    distinct_rows: int  # the "1000 rows from 50 distinct 1 MB" storage case
    distinct_payloads: int
    episodes_rows: int
    unique_rows: int  # all-unique 1 MB rows
    write_bytes: int  # logical bytes per write-throughput case
    access_rows: int  # rows of 1 MB in the random-access table
    scale_rows: tuple[int, ...]
    scale_gb: tuple[float, ...]  # unique 1 MB payloads
    scale_dup_gb: tuple[float, ...]  # logical GB of 1 MB payloads, each in SCALE_DUPLICATES rows
    scale_versions: tuple[int, ...]  # fragments (and versions) at which maintenance is timed
    spark_rows: int
    machine_bytes: int
    appends: int  # appends of 24 rows piled up before a compaction
    s3_rows: int  # 1 MB payloads per object-storage workload
    mutation_rows: int  # rows of the table the mutations case changes
    one_fragment_rows: int  # rows of its second table, in one fragment (Lance's default size)
    loader_images: int  # rows of 100 KB images the loader case reads in an epoch
    loader_clips: int  # distinct clips of the loader case, each in ROWS_PER_CLIP rows
    loader_clip_bytes: tuple[int, int]  # their smallest and largest size
    loader_workers: tuple[int, ...]  # DataLoader worker counts
    startup_rows: int  # rows of the table whose first batch is timed
    robot_episodes: int  # episodes of the robot_video case's LeRobot dataset ...
    robot_frames: int  # ... frames per episode ...
    robot_image: tuple[int, int]  # ... camera image height and width ...
    robot_cameras: int  # ... and cameras
    robot_batches: int  # batches of 64 rows each reader reads per order and round
    concurrent_payloads: tuple[int, int]  # payloads each concurrent writer appends, and size
    concurrent_writers: tuple[tuple[int, ...], tuple[int, ...]]  # writers: local, object stores
    demo_rows: int  # frames of the demo table whose read-back is timed


@dataclass
class Case:
    """One benchmark case: named measurements per contender, and the ratios that matter."""

    name: str
    description: str
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, **row) -> dict:
        self.rows.append(row)
        return row

    def save(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.name}.json"
        path.write_text(
            json.dumps(
                {
                    "case": self.name,
                    "description": self.description,
                    "rows": self.rows,
                    "notes": self.notes,
                },
                indent=2,
            )
        )
        return path


#: whether :func:`medians` runs a warm-up round first (not in a quick run: a smoke run checks
#: that every case runs and holds together, not how fast)
WARM_UP = True


def medians(
    contenders: dict[str, Callable[[], object]],
    runs: int,
    before: Callable[[str], object] | None = None,
    warm_up: bool | None = None,
) -> dict[str, float]:
    """Median seconds of each contender over ``runs`` rounds after one warm-up round; contenders
    alternate inside every round so drifts of the machine hit all of them alike, in an order
    shuffled per round (seeded). ``before(name)`` runs untimed ahead of each call: writes
    pass :func:`settled`, so none pays for a neighbour's page-cache writeback or leftover files
    (with a seeded order, one contender followed Parquet's write in 3 of 5 rounds and was
    0.05-0.1 s slower for it). ``warm_up``: whether to run the warm-up round (default:
    :data:`WARM_UP`)."""
    for name, fn in contenders.items() if (WARM_UP if warm_up is None else warm_up) else ():
        if before is not None:
            before(name)
        fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(runs):
        names = list(contenders)
        random.Random(round_).shuffle(names)
        for name in names:
            fn = contenders[name]
            if before is not None:
                before(name)
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def disk_bytes(path: str | Path) -> int:
    """Bytes of every file under ``path`` (or of the file)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Scratch:
    """A temporary directory for one case, removed afterwards."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="blobhouse-bench-"))
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def settled(outputs: dict[str, Path]) -> Callable[[str], None]:
    """A ``before`` for :func:`medians`: remove what the contender wrote last time (its path
    in ``outputs``), then flush every dirty page to the disk."""

    def settle(name: str) -> None:
        path = outputs.get(name)  # a contender that writes nothing (a hash) has none
        if path is not None and path.is_dir():
            shutil.rmtree(path)
        elif path is not None:
            path.unlink(missing_ok=True)
        os.sync()

    return settle


def machine() -> dict:
    """What this run ran on."""
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
