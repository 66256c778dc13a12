"""Ctrl-C reaches Python only when the call into Lance returns: a commit interrupted that way
has landed, and the cleanup of the interrupted write must not remove what it committed (a
SIGINT loop on an indexed table found compaction deleting the files it had just committed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import lance
import pyarrow as pa
import pytest
from lance import LanceDataset
from lance.optimize import Compaction

import blobhouse.maintenance.compaction as compaction
from blobhouse import blob_array, open_table, write_table
from tests.helpers import stock_read


def interrupted_after(real):
    """``real``, with a Ctrl-C arriving as it returns."""

    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    return call


def payload(i: int) -> bytes:
    return b"%d" % i * 40_000 if i % 2 else b"%d" % i * 10


def rows(ids: range) -> pa.Table:
    data = blob_array([payload(i) for i in ids])
    return pa.table({"id": pa.array(list(ids), pa.int64()), "b": data})


def assert_reads(uri: str, ids: list[int]) -> None:
    table = open_table(uri)
    got = {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}
    assert got == {i: payload(i) for i in ids}
    order = lance.dataset(uri).to_table(columns=["id"])["id"].to_pylist()
    assert stock_read(uri, "b") == [got[i] for i in order]
    assert table.verify(deep=True)["problems"] == []


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_a_write_interrupted_as_its_commit_returns_keeps_what_it_committed(
    table_uri, dedup, monkeypatch
):
    write_table(rows(range(4)), table_uri, dedup=dedup)
    monkeypatch.setattr(LanceDataset, "commit", interrupted_after(LanceDataset.commit))
    with pytest.raises(KeyboardInterrupt):
        write_table(rows(range(4, 8)), table_uri, mode="append", dedup=dedup)
    monkeypatch.undo()
    assert open_table(table_uri).version == 2
    assert_reads(table_uri, list(range(8)))


def test_ctrl_c_as_a_commit_returns_waits_for_what_the_commit_records(table_uri, monkeypatch):
    """A real SIGINT right after Lance's commit returned: the commit's records (the payloads
    it added to the store index) are written before the KeyboardInterrupt is raised (they were
    lost: the same payloads appended again were stored twice)."""
    write_table(rows(range(4)), table_uri, dedup="global")
    real = LanceDataset.commit

    def interrupted(*args, **kwargs):
        committed = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return committed

    monkeypatch.setattr(LanceDataset, "commit", interrupted)
    handler = signal.getsignal(signal.SIGINT)  # Python's, or Spark's when a session runs
    with pytest.raises(KeyboardInterrupt) as raised:
        write_table(rows(range(4, 8)), table_uri, mode="append", dedup="global")
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is handler  # handed back, and it answered
    if handler is signal.default_int_handler:  # it says the write is in (Spark's cannot)
        assert raised.value.__notes__ == ["the write committed first: version 2"]
    stored = open_table(table_uri).stats()["physical_bytes"]
    write_table(rows(range(4, 8)), table_uri, mode="append", dedup="global")
    assert open_table(table_uri).stats()["physical_bytes"] == stored
    assert_reads(table_uri, [*range(8), *range(4, 8)])


def test_an_indexed_compaction_interrupted_as_its_commit_returns(table_uri, monkeypatch):
    for start in (0, 4, 8):
        write_table(rows(range(start, start + 4)), table_uri, mode="append", dedup="global")
    lance.dataset(table_uri).create_scalar_index("id", "BTREE")
    open_table(table_uri).delete("id = 5")
    monkeypatch.setattr(
        compaction,
        "Compaction",
        type("C", (), {"commit": staticmethod(interrupted_after(Compaction.commit))}),
    )
    with pytest.raises(KeyboardInterrupt):
        open_table(table_uri).compact()
    monkeypatch.undo()
    assert len(lance.dataset(table_uri).get_fragments()) == 1  # the compaction landed
    assert_reads(table_uri, [i for i in range(12) if i != 5])
    assert os.path.isdir(table_uri)


def test_a_backfill_interrupted_as_its_commit_returns(table_uri, monkeypatch):
    write_table(pa.table({"id": pa.array(range(6), pa.int64())}), table_uri, max_rows_per_file=2)
    monkeypatch.setattr(LanceDataset, "commit", interrupted_after(LanceDataset.commit))
    with pytest.raises(KeyboardInterrupt):
        open_table(table_uri).backfill_blob_column(
            "img",
            lambda b: [b"img-%d" % i * 30_000 for i in b["id"].to_pylist()],
            dedup="global",
        )
    monkeypatch.undo()
    table = open_table(table_uri)
    assert table.read_blobs("img", range(6)) == [b"img-%d" % i * 30_000 for i in range(6)]
    assert table.verify(deep=True)["problems"] == []


# -- Ctrl-C on the command line ----------------------------------------------------------------

# The child restores Python's SIGINT handler: a process started in the background by a
# non-interactive shell (and so pytest, and its children) may ignore SIGINT.
CLI = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "{setup}\n"
    "from blobhouse.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def interrupt(argv: list[str], ready, setup: str = "", timeout: float = 900) -> tuple[int, str]:
    """Run the CLI in a child, send it SIGINT once ``ready(stderr_so_far, pid)`` holds, and
    return its exit code and stderr. Every process the child started (Spark's JVM, its Python
    workers) must be gone soon after the child exits."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI.format(setup=setup), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=False,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    started: set[int] = set()
    try:
        deadline = time.monotonic() + timeout
        while not ready("".join(lines), proc.pid):
            assert proc.poll() is None, f"finished before the signal: {''.join(lines)}"
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        started = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 60
    while {p for p in started if os.path.exists(f"/proc/{p}")} and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {p for p in started if os.path.exists(f"/proc/{p}")}
    for pid in left:  # do not leave them running, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running after the CLI exited: {left}"
    return proc.returncode, "".join(lines)


def descendants(pid: int) -> set[int]:
    """Processes started by ``pid``, and by them (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def staged_files(table: str) -> list[str]:
    data = os.path.join(table, "data")
    return (
        [n for n in os.listdir(data) if not n.startswith("aborted-")] if os.path.isdir(data) else []
    )


@pytest.mark.spark  # Spark starts in the child process
def test_ctrl_c_in_the_demo_write_is_one_line_exit_130_and_leaves_no_files(tmp_path):
    out = str(tmp_path / "episodes")
    code, err = interrupt(
        ["demo", "--rows", "3000", "--out", out], lambda _, pid: bool(staged_files(out))
    )
    assert code == 130, err
    assert "Traceback" not in err and "ERROR" not in err and "Exception" not in err, err
    lines = err.splitlines()
    assert len(lines) <= 5, err  # starting Spark, writing ..., write: 0/N, interrupted
    assert re.fullmatch(
        rf"interrupted: writing 3000 frames \(100 video chunks\) in \d+ tasks to {out}; "
        r"nothing was committed \(no table was created\)",
        lines[-1],
    ), lines[-1]
    assert not os.path.exists(out)  # staged files removed by the abort, the rest tidied


@pytest.mark.spark  # Spark starts in the child process
def test_ctrl_c_while_spark_starts_for_an_ingest_keeps_the_table(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a" * 1000)
    manifest = tmp_path / "rows.jsonl"
    manifest.write_text('{"id": 1, "file": "a.bin"}\n')
    table = str(tmp_path / "table")
    write_table(
        pa.table(
            {
                "id": pa.array([0], pa.int64()),
                "file": blob_array([b"x"]),
                "file_path": ["x"],
            }
        ),
        table,
    )
    before = sorted(os.listdir(os.path.join(table, "data")))
    argv = ["ingest", str(manifest), table, "--blob-columns", "file"]
    # once Spark's JVM is starting: a JVM interrupted then must not be left running
    code, err = interrupt(argv, lambda text, pid: "starting Spark" in text and descendants(pid))
    assert code == 130, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"interrupted: starting Spark (local[*]); nothing was committed ({table} stays at "
        "version 1)"
    )
    assert open_table(table).version == 1
    assert sorted(os.listdir(os.path.join(table, "data"))) == before


# where the LeRobot import (run in the command's process) waits for the Ctrl-C: storing its
# videos, or writing its rows
_IMPORT_PHASES = {
    "videos": (
        "import time, blobhouse.lerobot.ingest as ingest\n"
        "place = ingest.StoreWriter.place\n"
        "def slow_place(self, *args):\n"
        "    placed = place(self, *args)\n"
        "    print('stored a video', file=sys.stderr, flush=True)\n"
        "    time.sleep(300)\n"
        "    return placed\n"
        "ingest.StoreWriter.place = slow_place"
    ),
    "rows": (
        "import time, blobhouse.lerobot.ingest as ingest\n"
        "counted = ingest._counted\n"
        "def _counted(batches, total, progress):\n"
        "    for batch in counted(batches, total, progress):\n"
        "        yield batch\n"
        "        print('writing rows', file=sys.stderr, flush=True)\n"
        "        time.sleep(300)\n"
        "ingest._counted = _counted"
    ),
}


@pytest.mark.parametrize("phase", sorted(_IMPORT_PHASES))
def test_ctrl_c_in_a_create_without_spark_leaves_no_folder(tmp_path, phase):
    """Interrupted, the import's create leaves no folder behind (storing videos, it once left
    the store's and the leases' folders)."""
    from blobhouse.lerobot.sample import write_sample_dataset

    dataset, table = tmp_path / "dataset", str(tmp_path / "table")
    write_sample_dataset(dataset, episodes=2, frames=20)
    code, err = interrupt(
        ["ingest-lerobot", str(dataset), table],
        lambda text, pid: ("stored a video" in text) or ("writing rows" in text),
        setup=_IMPORT_PHASES[phase],
    )
    assert code == 130, err
    assert err.splitlines()[-1].endswith("nothing was committed (no table was created)"), err
    assert not os.path.exists(table), os.listdir(table)


def test_ctrl_c_in_a_python_only_command(table_uri):
    write_table(rows(range(4)), table_uri)
    slow = (
        "import time, blobhouse.table as t\n"
        "def verify(self, **kwargs):\n"
        "    print('verifying', file=sys.stderr, flush=True)\n"
        "    time.sleep(300)\n"
        "t.Table.verify = verify"
    )
    code, err = interrupt(
        ["verify", table_uri, "--deep"], lambda text, pid: "verifying" in text, setup=slow
    )
    assert code == 130
    assert err.splitlines() == [
        "verifying",
        f"interrupted: verifying {table_uri}; nothing was changed",
    ]


@pytest.mark.parametrize(
    "argv, method, says",
    [
        (["stats"], "stats", "interrupted: reading the statistics of {t}; nothing was changed"),
        (["gc", "--dry-run"], "gc", "interrupted: collecting garbage in {t}; nothing was changed"),
        (["gc"], "gc", "the table reads as before"),
        (["compact"], "compact", "nothing was committed ({t} stays at version 1)"),
        (["relocate"], "relocate", "nothing was committed ({t} stays at version 1)"),
    ],
)
def test_every_command_turns_ctrl_c_into_one_line(
    table_uri, monkeypatch, capsys, argv, method, says
):
    from blobhouse.cli import main
    from blobhouse.table import Table

    write_table(rows(range(4)), table_uri)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Table, method, interrupted)
    if method == "gc":  # the command goes through gc_at (a table, or a failed create's folder)
        monkeypatch.setattr("blobhouse.maintenance.garbage_collection.gc_at", interrupted)
    if method == "relocate":  # relocate runs only on a moved table: interrupt what it reads
        monkeypatch.setattr("blobhouse.maintenance.versions.VersionGraph.of", interrupted)
    assert main([argv[0], table_uri, *argv[1:]]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert says.format(t=table_uri) in captured.err
