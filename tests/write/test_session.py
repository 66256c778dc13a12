"""The blob session: blob_id allocation, sidecar naming, cleanup."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from blobhouse import write_table
from blobhouse.errors import BlobhouseError
from blobhouse.files.session import SIDECAR_RUN_BYTES, BlobSession, WriteQueue
from blobhouse.layout import sidecar_name
from tests.helpers import stock_read


def test_sidecar_names_match_lance():
    assert sidecar_name(1) == "1" + "0" * 31 + ".blob"
    assert sidecar_name(2) == "01" + "0" * 30 + ".blob"
    assert sidecar_name(6) == "011" + "0" * 29 + ".blob"


def test_allocator_skips_zero_reused_and_existing_ids(tmp_path):
    data = tmp_path / "data"
    (data / "f").mkdir(parents=True)
    for taken in (1, 3):
        (data / "f" / sidecar_name(taken)).write_bytes(b"someone else's")
    session = BlobSession(str(data / "f.lance"))
    assert [session.allocate_blob_id() for _ in range(3)] == [2, 4, 5]
    packed = session.new_packed()
    assert packed.blob_id == 6
    packed.write_blob(b"abc")
    packed.finish()
    session.abort()
    # only what the session created is removed
    assert sorted(os.listdir(data / "f")) == sorted(sidecar_name(i) for i in (1, 3))


def test_sidecar_writers_record_positions_and_sizes(tmp_path):
    session = BlobSession(str(tmp_path / "data" / "g.lance"))
    pack = session.new_packed()
    first, second = pack.write_blob(b"hello"), pack.write_blob(memoryview(b"world!"))
    assert pack.finish() == [first, second]
    assert (first.position, first.size, second.position, second.size) == (0, 5, 5, 6)
    dedicated = session.new_dedicated()
    for chunk in (b"ab", b"cd", b"e"):
        dedicated.write(chunk)
    value = dedicated.finish()
    assert (value.blob_id, value.size, value.position) == (2, 5, 0)
    path = tmp_path / "data" / "g" / sidecar_name(2)
    assert path.read_bytes() == b"abcde"


def test_sidecar_writes_reach_the_writer_thread_in_runs_not_one_by_one(tmp_path, monkeypatch):
    """Handing each payload to the writer thread cost ~25 us of locking a payload (a third of a
    write of 100 KB payloads): a sidecar submits runs of ``SIDECAR_RUN_BYTES``, writes every
    byte in order, and a payload bigger than a run goes at once."""
    submitted: list[int] = []
    real_submit = WriteQueue.submit

    def counted(queue, fn, nbytes=0):
        submitted.append(nbytes)
        return real_submit(queue, fn, nbytes)

    monkeypatch.setattr(WriteQueue, "submit", counted)
    session = BlobSession(str(tmp_path / "data" / "h.lance"))
    pack = session.new_packed()
    payloads = [os.urandom(100_000) for _ in range(100)]  # 10 MB: three runs of 4 MiB
    values = [pack.write_blob(p) for p in payloads]
    big = os.urandom(SIDECAR_RUN_BYTES + 1)
    values.append(pack.write_blob(big))
    assert pack.finish() == values
    content = (tmp_path / "data" / "h" / sidecar_name(1)).read_bytes()
    assert content == b"".join(payloads) + big
    runs = [n for n in submitted if n]
    assert sum(runs) == len(content) and len(runs) <= 4
    assert len(submitted) <= 5  # the runs and the close


def test_data_file_path_must_be_a_lance_file(tmp_path):
    with pytest.raises(BlobhouseError, match=r"must end in <name>\.lance"):
        BlobSession(str(tmp_path / "data" / "x.parquet"))


def test_appends_never_touch_sidecars_of_committed_files(table_uri):
    first = [os.urandom(100_000) for _ in range(3)]
    write_table(pa.table({"b": pa.array(first, pa.large_binary())}), table_uri, blob_columns=["b"])
    before = {p: Path(p).read_bytes() for p in _sidecars(table_uri)}
    second = [os.urandom(100_000) for _ in range(3)]
    write_table(pa.table({"b": pa.array(second, pa.large_binary())}), table_uri, mode="append")
    assert {p: Path(p).read_bytes() for p in before} == before
    assert stock_read(table_uri, "b") == first + second


def _sidecars(uri: str) -> list[str]:
    return [os.path.join(r, n) for r, _, ns in os.walk(uri) for n in ns if n.endswith(".blob")]


def test_data_file_batches_are_written_on_their_own_thread_and_their_errors_raised(tmp_path):
    """The data file's batches are written on a thread of their own, in order (placing the
    next batch overlaps Lance encoding this one); a batch Lance refuses there is raised when
    the file is closed, and abort removes the file."""
    session = BlobSession(f"{tmp_path}/data/f.lance")
    writer = session.open_data_file(pa.schema([pa.field("a", pa.int64())]))
    threads = []
    write_batch = writer.write_batch

    def recorded(batch):
        threads.append((threading.current_thread().name, batch.column(0)[0].as_py()))
        write_batch(batch)

    writer.write_batch = recorded
    for first in (1, 2):
        session.write_data(writer, pa.record_batch({"a": [first, 9]}))
    session.write_data(writer, pa.record_batch({"a": ["not a number"]}))
    with pytest.raises(ValueError, match="does not match the file schema"):
        session.close_data_file(writer)
    assert [value for _, value in threads] == [1, 2, "not a number"]
    assert all(name.startswith("blobhouse-data") for name, _ in threads)
    session.abort()
    assert not os.path.exists(tmp_path / "data" / "f.lance")
    assert not os.path.exists(tmp_path / "data" / "f")  # no sidecar folder either


def test_a_stalled_writer_holds_at_most_the_queue_limit():
    """A submit waits while the writes queued would pass the limit: a writer stalled in the
    kernel keeps at most that many bytes of a write's input alive."""
    queue = WriteQueue(limit=10)
    release = threading.Event()
    queue.submit(release.wait, 6)  # a write that stalls
    queue.submit(lambda: None, 4)  # 10 bytes wait: fits
    third = threading.Thread(target=queue.submit, args=(lambda: None, 1))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # 11 bytes would wait: held until the stalled write ends
    release.set()
    third.join(10)
    assert not third.is_alive()
    queue.close()


@pytest.mark.parametrize("ending", ["close", "abandon"])
def test_after_a_failed_write_the_queued_writes_are_not_run(ending):
    """The writes queued behind a failed one are dropped: on a store that stopped answering
    each would wait out its own request budget (a paused store held a content-dedup write six
    minutes, one HEAD timeout per queued run of a sidecar)."""
    queue = WriteQueue()
    ran: list[int] = []

    def failing() -> None:
        time.sleep(0.2)
        raise OSError("the store went away")

    queue.submit(failing)
    for n in range(5):  # each would take 5 s: far above what a loaded machine adds
        queue.submit(lambda n=n: (ran.append(n), time.sleep(5)))
    started = time.monotonic()
    if ending == "close":
        with pytest.raises(OSError, match="went away"):
            queue.close()
    else:
        queue.abandon()
        queue.close()
    assert ran == [] and time.monotonic() - started < 4
