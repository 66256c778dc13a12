"""The demo job: a robot-episode training table written with dedup, read back, every byte checked.

Rows are camera frames at 30 Hz. Every 30 frames share one video chunk (1-6 MB), every frame of
an episode shares one calibration file, and each frame has its own small thumbnail: the
"physically low-frequency, logically high-frequency" shape of seed 000.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from blobhouse.dedup import content_hash
from blobhouse.table import open_table, write_table

FPS = 30
FRAMES_PER_EPISODE = 300
MiB = 1 << 20


@dataclass(frozen=True)
class EpisodeData:
    """Deterministic generator of the demo rows; payload bytes are derived from ids."""

    rows: int
    seed: int = 0

    def chunk(self, chunk_id: int) -> bytes:
        rng = np.random.default_rng((self.seed, 1, chunk_id))
        return rng.bytes(int(rng.integers(1 * MiB, 6 * MiB + 1)))

    def calibration(self, episode: int) -> bytes:
        return np.random.default_rng((self.seed, 2, episode)).bytes(256 * 1024)

    def thumbnail(self, row: int) -> bytes:
        rng = np.random.default_rng((self.seed, 3, row))
        return rng.bytes(int(rng.integers(2048, 8193)))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """One batch per second of video (30 rows), streamed."""
        for start in range(0, self.rows, FPS):
            rows = range(start, min(start + FPS, self.rows))
            chunk_id = start // FPS
            chunk = self.chunk(chunk_id)
            episodes = [r // FRAMES_PER_EPISODE for r in rows]
            yield pa.record_batch(
                {
                    "episode": pa.array(episodes, pa.int64()),
                    "frame": pa.array([r % FRAMES_PER_EPISODE for r in rows], pa.int64()),
                    "timestamp_s": pa.array([(r % FRAMES_PER_EPISODE) / FPS for r in rows]),
                    "video_chunk": pa.array([chunk_id + 1] * len(rows), pa.int64()),
                    "video": pa.array([chunk] * len(rows), pa.large_binary()),
                    "calibration": pa.array(
                        [self.calibration(e) for e in episodes], pa.large_binary()
                    ),
                    "thumbnail": pa.array([self.thumbnail(r) for r in rows], pa.large_binary()),
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


def run_demo(out: str, rows: int = 1800, progress: Callable[[str], None] = print) -> dict:
    """Write the demo table to ``out`` (replacing it), read it back, verify, and report."""
    shutil.rmtree(out, ignore_errors=True)
    data = EpisodeData(rows)
    progress(f"writing {rows} frames ({rows // FPS} video chunks) to {out} ...")
    started = time.perf_counter()
    table = write_table(
        data.batches(),
        out,
        blob_columns=["video", "calibration", "thumbnail"],
        ref_id_columns={"video": "video_chunk"},
        dedup={"video": "ref_id", "calibration": "content", "thumbnail": "content"},
    )
    write_s = time.perf_counter() - started
    stats = table.stats()

    progress("reading every blob back and checking its bytes ...")
    started = time.perf_counter()
    table = open_table(out)
    read_bytes = 0
    mismatches = 0
    for column in ("video", "calibration", "thumbnail"):
        for start in range(0, rows, 300):
            span = range(start, min(start + 300, rows))
            payloads = table.read_blobs(column, list(span))
            read_bytes += sum(len(p) for p in payloads)
            mismatches += _count_mismatches(data, column, span, payloads)
    read_s = time.perf_counter() - started
    return {
        "table": out,
        "rows": table.count_rows(),
        "logical_bytes": stats["logical_bytes"],
        "physical_bytes": stats["physical_bytes"],
        "dedup_ratio": stats["dedup_ratio"],
        "write_mb_s": round(stats["logical_bytes"] / write_s / 1e6, 1),
        "read_mb_s": round(read_bytes / read_s / 1e6, 1),
        "verified_blobs": 3 * rows,
        "mismatches": mismatches,
        "columns": {
            c: {k: v for k, v in s.items() if k != "kinds"} for c, s in stats["columns"].items()
        },
    }


def _count_mismatches(data: EpisodeData, column: str, rows: range, payloads: list) -> int:
    """Rows whose bytes differ from what the generator made for them."""
    expected: dict[int, bytes] = {}
    wrong = 0
    for row, payload in zip(rows, payloads, strict=True):
        payload_id = data.payload_id(column, row)
        if payload_id not in expected:
            expected[payload_id] = content_hash(data.payload(column, row))
        wrong += payload is None or content_hash(payload) != expected[payload_id]
    return wrong
