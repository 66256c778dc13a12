"""A Spark job killed with SIGKILL mid-write, again and again: every process of it at once (the
driver, the JVM, the Python daemons and their task workers), at a seeded random point after it
has committed once. After every kill the table opens at a committed version, holds every write
the job reported committed and nothing of the write it was killed in unless that one committed
whole, and reads back exactly; at the end what the killed jobs left is only orphans that gc
removes once they are older than the grace period."""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.maintenance.garbage_collection import orphans
from tests.faults.test_crash_safety import assert_latest_reads_back, assert_only_orphans_left
from tests.helpers import worker_script
from tests.workers.crash_worker import payload

pytestmark = pytest.mark.spark  # the jobs start Spark in child processes

KILLS = int(os.environ.get("BLOBHOUSE_SPARK_CRASH_KILLS", "3"))
SEED = int(os.environ.get("BLOBHOUSE_SPARK_CRASH_SEED", "20261122"))
# the kill lands in the job's 2nd, 3rd or 4th write: up to KILL_WINDOW s after the write began
# (a write takes ~0.3-1 s on 2 cores once Spark is up, most of it planning), or, half the
# time, up to FILE_WINDOW s after its tasks put their first file in data/ (files, commit)
KILL_WINDOW = float(os.environ.get("BLOBHOUSE_SPARK_CRASH_WINDOW", "1.0"))
FILE_WINDOW = 0.3
STARTUP_TIMEOUT = 120  # s to the first commit: a hung JVM fails the test instead of hanging
EXIT_TIMEOUT = 30  # s for every process of a killed job to be gone


def session_processes(sid: int) -> dict[int, int]:
    """Live processes of session ``sid`` (the job's): pid -> process group. Spark's Python
    daemons put themselves in process groups of their own, but stay in the job's session."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        state, _ppid, pgid, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state not in ("Z", "X"):
            found[int(entry)] = int(pgid)
    return found


def kill_job(process: subprocess.Popen) -> None:
    """SIGKILL every process group of the job's session, all in one pass, until none of its
    processes is left (a group made meanwhile is caught by the next pass)."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    groups = {process.pid, *session_processes(process.pid).values()}
    while groups:
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        time.sleep(0.05)
        left = session_processes(process.pid)
        assert time.monotonic() < deadline, f"processes of the killed job still run: {left}"
        groups = set(left.values())
    process.wait(timeout=EXIT_TIMEOUT)


def read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        if line.startswith(("writing ", "committed ")):  # not what Spark may print
            lines.put(line.split())
    lines.put(None)  # end of output: every process holding the pipe is gone


def wait_for(lines: queue.Queue, seen: list[list[str]], word: str, count: int, err: Path) -> None:
    """Read the job's lines into ``seen`` until ``count`` more of them start with ``word``."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while count:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {word!r} line in {STARTUP_TIMEOUT} s; see {err}") from None
        assert line is not None, f"the job exited:\n{err.read_text()[-3000:]}"
        seen.append(line)
        count -= line[0] == word


def wait_for_new_file(folder: Path, before: set[str]) -> None:
    """Until something not in ``before`` appears in ``folder`` (a task's data file or
    sidecar folder)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not set(os.listdir(folder)) - before:
        assert time.monotonic() < deadline, f"no new file in {folder} in {STARTUP_TIMEOUT} s"
        time.sleep(0.005)


def run_and_kill(rng: random.Random, uri: str, seed: int, env: dict, err: Path):
    """Start the job, kill it at a random point of one of its writes. Returns its output lines
    (split), how long it took to commit once, and where the kill was aimed."""
    worker = worker_script("spark_crash_worker.py")
    started = time.monotonic()
    with err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, worker, uri, str(seed)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            start_new_session=True,  # its own session: every process of it can be found
        )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    seen: list[list[str]] = []
    try:
        wait_for(lines, seen, "committed", 1, err)  # Spark and its Python workers are up
        startup = time.monotonic() - started
        wait_for(lines, seen, "writing", rng.randint(1, 3), err)
        aimed = seen[-1][1]  # the first id of the write the kill aims at
        before = set(os.listdir(Path(uri) / "data"))
        on_file = rng.random() < 0.5
        delay = rng.uniform(0.0, FILE_WINDOW if on_file else KILL_WINDOW)
        if on_file:
            wait_for_new_file(Path(uri) / "data", before)
        time.sleep(delay)
        running = process.poll() is None
    finally:
        kill_job(process)
    # no write failed before the kill (its abort would pass for a kill before the commit)
    assert running and "Traceback" not in err.read_text(), f"the job failed: see {err}"
    reader.join(timeout=EXIT_TIMEOUT)
    assert not reader.is_alive(), "the killed job's stdout is still open"
    while (line := lines.get_nowait()) is not None:
        seen.append(line)
    process.stdout.close()
    aim = f"{delay:.2f} s after the {'first file' if on_file else 'start'} of write {aimed}"
    return seen, startup, aim


def where_killed(seen: list[list[str]], new: set[int], base: int) -> str:
    """Check what the killed job added (ids ``new``) against what it printed: every write it
    reported committed, and the write it was killed in whole or not at all."""
    # the job writes ids base, base + 1, ... in order, printing "writing FIRST LAST HOW DEDUP"
    # before a write and "committed LAST" after its commit
    assert new == set(range(base, max(new, default=base - 1) + 1)), f"gaps: {sorted(new)}"
    last = seen[-1]
    if last[0] == "committed":
        assert max(new) == int(last[1]), f"after committed {last[1]}: {max(new)}"
        return f"killed after write {seen[-2][1]} committed, before the next began"
    first, end = int(last[1]), int(last[2])
    committed = max(new, default=base - 1) == end
    assert committed or max(new, default=base - 1) == first - 1, f"partial write: {sorted(new)}"
    return (
        f"killed in write {first} ({last[3]}, dedup={last[4]}) "
        f"{'after' if committed else 'before'} its commit"
    )


def file_kind(path: str) -> str:
    name = Path(path).name
    if name.startswith(".tmp"):
        return "temp"  # a data file not finished (Lance writes it under a temp name first)
    if name.endswith((".lance", ".pack")):
        return name.rsplit(".", 1)[1]
    return "sidecar" if Path(path).parent.parent.name == "data" else name


def test_spark_jobs_killed_mid_write_lose_nothing(table_uri, tmp_path):
    rng = random.Random(SEED)
    write_table(
        pa.table({"id": pa.array([0], pa.int64()), "b": blob_array([payload(0)])}), table_uri
    )
    scratch = tmp_path / "spark"  # the killed JVMs' temp and block manager folders
    scratch.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "SPARK_LOCAL_DIRS": str(scratch),
        # the JVM starts ~2 s sooner; a killed JVM's temp files stay in the scratch folder
        "SPARK_SUBMIT_OPTS": f"-XX:TieredStopAtLevel=1 -Djava.io.tmpdir={scratch}",
    }
    checked, rows = 1, 1  # version, rows
    ids = {0}  # every id the table holds
    landed, left = [], set()  # where each kill landed; the orphans so far
    for kill in range(KILLS):
        seed = kill + 1
        err = tmp_path / f"job-{seed}.err"
        seen, startup, aim = run_and_kill(rng, table_uri, seed, env, err)
        version, now = assert_latest_reads_back(table_uri)
        assert version >= checked and now >= rows, f"kill {seed}: back to version {version}"
        got = open_table(table_uri).to_arrow(columns=["id"]).column("id").to_pylist()
        assert len(got) == len(set(got)) == now, f"kill {seed}: duplicated ids"
        assert ids <= set(got), f"kill {seed}: lost ids {sorted(ids - set(got))[:10]}"
        place = where_killed(seen, set(got) - ids, seed * 10_000)
        now_left = set(orphans(open_table(table_uri))["paths"])
        gone = f" ({len(left - now_left)} earlier ones gone)" if left - now_left else ""
        new_files = Counter(file_kind(p) for p in now_left - left)
        landed.append(
            f"{seed}: up in {startup:.1f} s; {aim}: {place}; "
            f"left {', '.join(f'{n} {k}' for k, n in sorted(new_files.items())) or 'nothing'}{gone}"
        )
        checked, rows, ids, left = version, now, set(got), now_left
    print("\n".join([f"kills (seed {SEED}):", *landed]))
    assert_only_orphans_left(table_uri, (checked, rows))
