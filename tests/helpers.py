"""Test helpers: table files on disk, blobs read back by stock pylance, files made to look old or
damaged, and where the subprocess scripts are."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from blobhouse import blob_array, open_table, write_table
from blobhouse.files.session import BlobSession
from blobhouse.io.objects import uri_to_path
from blobhouse.layout import sidecar_name
from blobhouse.store.index_part import INDEX_SCHEMA
from blobhouse.store.packs import index_uri

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository
WORKERS = TESTS / "workers"  # the scripts tests run in child processes
ROW_ADDRESS = "_rowaddr"  # Lance's row address column: fragment id << 32 | offset


def disk_bytes(path: str) -> int:
    """Total size of every file under ``path``."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def tree(path: str) -> set[str]:
    """Every file under ``path``, relative to it."""
    return {
        os.path.relpath(os.path.join(root, name), path)
        for root, _, names in os.walk(path)
        for name in names
    }


def sized_tree(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size: what "the files on disk are the same" means."""
    return {p: os.path.getsize(os.path.join(root, p)) for p in tree(root)}


def media_file(tmp_path: Path, name: str, size: int) -> tuple[str, str]:
    """A file of ``size`` random bytes in a new folder ``tmp_path/media`` (what a table may
    reference as an external object): the folder and the file."""
    folder = tmp_path / "media"
    folder.mkdir()
    path = folder / name
    path.write_bytes(os.urandom(size))
    return str(folder), str(path)


def data_files(path: str) -> set[str]:
    """Files under ``path/data`` (data files and sidecars), relative to the table root."""
    return {p for p in tree(path) if p.startswith("data")}


def stock_read(uri: str, column: str, rows: int | None = None) -> list[bytes | None]:
    """Every blob of ``column`` read by stock pylance, in row order."""
    dataset = lance.dataset(uri)
    rows = dataset.count_rows() if rows is None else rows
    pairs = dataset.read_blobs(column, indices=list(range(rows)), preserve_order=True)
    return [payload for _, payload in pairs]


def stock_descriptors(uri: str, column: str) -> list[dict | None]:
    return lance.dataset(uri).to_table(columns=[column]).column(column).to_pylist()


def placed_sidecar(session: BlobSession, blob_id: int, content: bytes) -> None:
    """A sidecar someone else already put in the session's namespace."""
    folder = os.path.join(session.data_dir, session.key)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, sidecar_name(blob_id)), "wb") as f:
        f.write(content)


def assert_totals_are_the_sum_of_the_lines(stats: dict) -> None:
    """Every total equals the sum of its columns, and each column's the sum of its kinds."""
    columns = stats["columns"].values()
    for key in ("logical_bytes", "physical_bytes", "table_owned_bytes", "external_bytes"):
        assert stats[key] == sum(c[key] for c in columns), key
    assert stats["deleted_rows_bytes"] == sum(c["deleted_rows_bytes"] for c in columns)
    assert stats["physical_bytes"] == stats["table_owned_bytes"] + stats["external_bytes"]
    for column in columns:
        kinds = column["kinds"].values()
        for key in ("logical_bytes", "physical_bytes"):
            assert column[key] == sum(k[key] for k in kinds), key
        owned = sum(k["physical_bytes"] for k in kinds if k["table_owned"])
        assert column["table_owned_bytes"] == owned
        assert column["external_bytes"] == sum(
            k["physical_bytes"] for k in kinds if not k["table_owned"]
        )
        assert column["physical_bytes"] == column["table_owned_bytes"] + column["external_bytes"]


def unreferenced_deletion_files(path: str) -> set[str]:
    """Deletion files under ``path`` that no version of the table uses (a failed or retried
    change left them)."""
    used = set()
    for version in lance.dataset(path).versions():
        for fragment in lance.dataset(path, version=version["version"]).get_fragments():
            deletion = fragment.metadata.deletion_file
            if deletion is not None:
                used.add(deletion.path(fragment.fragment_id))
    return {p for p in tree(path) if p.startswith("_deletions/")} - used


def wait_for_idle_tasks(spark, seconds: float = 30) -> None:
    """Tasks of a failed job may still be finishing: wait until Spark runs none."""
    import time

    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + seconds
    while tracker.getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.1)


def flip(uri: str, position: int) -> None:
    """Damage the byte at ``position`` of the local file at ``uri`` (inverted: always a change,
    where writing a fixed byte leaves one that already had it untouched)."""
    with open(uri_to_path(uri), "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def damage_page(path: Path, column: str) -> None:
    """Damage the first page header of ``column`` in the Parquet file at ``path``: its
    footer and other columns stay readable, reading that column fails."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(path).metadata
    chunks = metadata.row_group(0)
    (chunk,) = [
        chunks.column(i)
        for i in range(metadata.num_columns)
        if f"{chunks.column(i).path_in_schema}.".startswith(f"{column}.")
    ]
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 16] = bytes(b ^ 0xFF for b in data[start : start + 16])
    path.write_bytes(bytes(data))


def declare_stats(dataset: Path) -> None:
    """Give a LeRobot dataset a ``meta/stats.json`` for every feature, so that an import
    reads none of their columns or frames to compute stats: only the checks' fields are read
    before the rows are written."""
    import json

    features = json.loads((dataset / "meta/info.json").read_text())["features"]
    stats = {key: {"mean": [0.0], "count": [1]} for key in features}
    (dataset / "meta/stats.json").write_text(json.dumps(stats))


def flip_payload(table_uri: str, column: str, row: int, offset: int | None = None) -> None:
    """Damage one byte of the stored payload of ``column`` at ``row`` of the table's latest
    version: the byte at ``offset`` into the payload (default: its middle)."""
    ref = open_table(table_uri).blob_refs(column, [row])[0].as_py()
    flip(ref["uri"], ref["position"] + (ref["size"] // 2 if offset is None else offset))


def set_age(paths: Iterable[str | Path], hours: float) -> None:
    """Make each of ``paths`` look ``hours`` old (its access and modification times)."""
    past = time.time() - hours * 3600
    for path in paths:
        os.utime(path, (past, past))


def aged(
    root: str | Path,
    hours: float,
    *,
    folders: bool = True,
    spare_leases: bool = False,
    links: bool = True,
) -> None:
    """Make everything under ``root`` look ``hours`` old, as if that long had passed since it
    was written: what gc's grace periods and the expiry of leases and markers read.

    ``folders=False``: files only, the folders keep their times. ``spare_leases=True``: not the
    write leases (``_leases/``), which a running write keeps touching. ``links=False``: not
    symbolic links (nor, through them, what they point at, which may be outside ``root``).
    """
    root = Path(root)
    set_age(
        (
            path
            for path in root.rglob("*")
            if (folders or not path.is_dir())
            and not (spare_leases and "_leases" in path.relative_to(root).parts)
            and (links or not path.is_symlink())
        ),
        hours,
    )


def worker_script(script: str) -> str:
    """The path of a script of tests/workers/: ``worker_script("crash_worker.py")``."""
    return str(WORKERS / script)


def run_fork_worker(mode: str, uri: str) -> dict:
    """tests/workers/fork_worker.py in a fresh Python (a parent that has not used Lance): its
    JSON."""
    done = subprocess.run(
        [sys.executable, worker_script("fork_worker.py"), mode, uri],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def clips_table(
    uri: str, rows: int, *, share: int, largest: int, val_every: int, rows_per_file: int, seed: int
) -> dict[int, str]:
    """A table of ``rows`` rows (``id``, ``split``, blob ``clip``) where each ``share``
    consecutive rows are clips of one video (one payload of up to ``largest`` bytes, some
    small enough to be inline), every ``val_every``-th row in split 'val'; the sha256 of each
    row's payload by id."""
    rng = np.random.default_rng(seed)
    payloads = [rng.bytes(int(rng.integers(10, largest))) for _ in range(rows // share + 1)]
    ids = list(range(rows))
    data = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "split": ["val" if i % val_every == 0 else "train" for i in ids],
            "clip": blob_array([payloads[i // share] for i in ids]),
        }
    )
    write_table(data, uri, max_rows_per_file=rows_per_file)
    return {i: hashlib.sha256(payloads[i // share]).hexdigest() for i in ids}


def synthetic_entries(
    root: str, count: int, seed: int = 5, storage_options: dict | None = None
) -> None:
    """Append ``count`` entries of random digests to the store index of ``root`` (a sparse
    pack no write will find: their digests are random)."""
    rng = np.random.default_rng(seed)
    digests = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(32), count, [None, pa.py_buffer(rng.bytes(32 * count))]
    ).cast(pa.binary())
    positions = np.arange(count, dtype=np.int64) * 10
    entries = pa.table(
        [digests, pa.array(["packs/synthetic.pack"] * count), positions, np.full(count, 10)],
        schema=INDEX_SCHEMA,
    )
    lance.write_dataset(entries, index_uri(root), mode="append", storage_options=storage_options)
