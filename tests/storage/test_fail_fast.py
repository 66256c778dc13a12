"""A store that does not answer fails the call in seconds, with a blobhouse error naming the store
and what was being done: Lance's own budget (a 30 s request retried 10 times, for each of the
requests an open makes) kept a write waiting more than ten minutes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from blobhouse import blob_array, errors, open_table, write_table
from blobhouse.errors import InvalidInputError, StoreError
from blobhouse.io.objects import REQUEST_BUDGET, checked_options, obstore_settings
from blobhouse.loader import BatchLoader

pytestmark = pytest.mark.object_store


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


class StallingProxy:
    """A TCP proxy on 127.0.0.1 to a real server that, once :meth:`stall` is called, keeps
    taking connections and requests but never answers again: a store that goes silent in the
    middle of the work."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname, parts.port)
        self.stalled = threading.Event()
        self._held: list[socket.socket] = []  # connections kept open, never answered
        self._listening = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listening.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()

    def close(self) -> None:
        self._listening.close()
        for connection in self._held:
            connection.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listening.accept()
            except OSError:
                return
            self._held.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        if self.stalled.is_set():
            return
        with contextlib.suppress(OSError), socket.create_connection(self.target) as upstream:
            back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
            back.start()
            self._pump(client, upstream)

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (data := source.recv(1 << 16)) and not self.stalled.is_set():
                target.sendall(data)


def silent_store(kind: str, endpoint: str) -> tuple[str, dict[str, str]]:
    if kind == "s3":
        options = {"aws_endpoint": endpoint, "aws_access_key_id": "k"}
        return "s3://bucket/t", {**options, "aws_secret_access_key": "s"}
    account = "devstoreaccount1"
    options = {"account_name": account, "account_key": "a2V5", "allow_http": "true"}
    return "az://container/t", {**options, "azure_endpoint": f"{endpoint}/{account}"}


@pytest.fixture
def answer_bound(monkeypatch) -> float:
    """A 2 s answer bound for this process's calls (the default, 10 s, is what the Spark test's
    workers wait out): the bound's mechanism, in a fifth of the time."""
    from blobhouse.io import objects

    monkeypatch.setattr(objects, "ANSWER_SECONDS", 2.0)
    return 2.0


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_store_that_does_not_answer_fails_open_and_write_fast(
    silent_endpoint, kind, answer_bound
):
    uri, options = silent_store(kind, silent_endpoint)
    rows = pa.table({"img": blob_array([b"x" * 200_000])})

    def failing(call: Callable[[], object]) -> float:
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"{uri}.* did not answer .* within 2 s") as raised:
            call()
        assert isinstance(raised.value, OSError)
        return time.monotonic() - started

    with ThreadPoolExecutor(2) as calls:  # at once: each waits out its own budget
        took = calls.map(
            failing,
            [
                lambda: open_table(uri, storage_options=options),
                lambda: write_table(rows, uri, storage_options=options),
            ],
        )
        assert all(seconds < 6 * answer_bound for seconds in took)


def test_a_loader_on_a_store_that_does_not_answer_fails_fast(silent_endpoint, answer_bound):
    """The loader lists the table's versions itself (to pin one) before Lance is asked."""
    uri, options = silent_store("s3", silent_endpoint)
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot read {uri}.* did not answer"):
        BatchLoader(uri, batch_size=2, storage_options=options)
    assert time.monotonic() - started < 6 * answer_bound


def test_requests_have_a_budget_unless_given_one():
    """Lance and obstore get the same timeouts and retries: blobhouse's defaults, or the
    caller's; a number of seconds is taken where Lance wants a duration."""
    options = checked_options({"aws_region": "us-east-1"})
    assert {k: options[k] for k in REQUEST_BUDGET} == REQUEST_BUDGET
    given = checked_options({"timeout": 300, "connect_timeout": "2s", "client_max_retries": 1})
    assert (given["timeout"], given["connect_timeout"]) == ("300s", "2s")
    assert checked_options({"timeout": 30.5})["timeout"] == "30500ms"
    assert given["client_max_retries"] == "1"
    for scheme in ("az", "s3", "gs"):
        _, client, retry = obstore_settings(scheme, given)
        assert (client["timeout"], client["connect_timeout"]) == ("300s", "2s")
        assert retry == {"max_retries": 1, "retry_timeout": timedelta(seconds=60)}
    assert checked_options(None) is None  # a local table's options stay empty


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("client_max_retries", "abc"),
        ("client_max_retries", "-1"),
        ("client_retry_timeout", "soon"),
        ("timeout", "30 parsecs"),
        ("connect_timeout", ""),
        ("timeout", "0"),
        ("connect_timeout", "0ms"),
        ("pool_idle_timeout", "a while"),
        ("http2_keep_alive_timeout", "-3"),
        ("download_retry_count", "x"),
        ("download_retry_count", "-1"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_option(name, value):
    with pytest.raises(InvalidInputError, match=f"storage option {name!r}"):
        checked_options({name: value})


def test_a_spark_write_and_read_fail_fast_too(spark, silent_endpoint):
    """The data source plans on the driver: the write's and the read's first request finds the
    store silent, and the job fails saying so (blobhouse.spark's helpers raise StoreError
    itself; Spark's own df.write and spark.read carry it in their error)."""
    import blobhouse.spark as bs
    from blobhouse.spark.datasource import storage_prefixed

    uri, options = silent_store("s3", silent_endpoint)
    df = spark.createDataFrame([(1, b"x" * 1000)], "id long, img binary")
    silent = f"StoreError: cannot (write to|open) {uri}.* did not answer"
    calls = {
        silent: lambda: (
            df.write.format("blobhouse")
            .options(**storage_prefixed(options))
            .mode("append")
            .save(uri)
        ),
        f"{silent} ": lambda: (
            spark.read.format("blobhouse").options(**storage_prefixed(options)).load(uri).count()
        ),
        f"^cannot (write to|open) {uri}.* did not answer": lambda: bs.write_table(
            df, uri, storage_options=options
        ),
    }

    def failing(expected: str) -> float:
        bs.register(spark)  # Spark finds the format through this thread's active session
        started = time.monotonic()
        with pytest.raises(Exception, match=expected.strip()) as raised:
            calls[expected]()
        assert isinstance(raised.value, StoreError) == expected.startswith("^")
        return time.monotonic() - started

    with ThreadPoolExecutor(len(calls)) as running:  # at once: each waits its own budget
        assert all(seconds < 60 for seconds in running.map(failing, calls))


def test_a_store_that_goes_silent_mid_write_fails_it_within_its_budget(s3, monkeypatch):
    """The store answers, then stops in the middle of a write: the write fails within the
    request budget plus the cleanup's bound (cleanup requests, each waiting a budget of its own,
    held a write more than 15 minutes; nested cleanups each waited a bound of their own), with
    the write's own StoreError, said once."""
    monkeypatch.setattr(errors, "CLEANUP_SECONDS", 5.0)
    proxy = StallingProxy(s3.options["aws_endpoint"])
    options = {**s3.options, "aws_endpoint": proxy.endpoint}
    options |= {"timeout": "2s", "connect_timeout": "1s", "client_max_retries": 0}
    payloads = [bytes([i]) * 300_000 for i in range(6)]

    def batches():
        for i, payload in enumerate(payloads):
            if i == 3:
                proxy.stall()
            yield pa.record_batch({"img": blob_array([payload])})

    reader = pa.RecordBatchReader.from_batches(next(batches()).schema, batches())
    started = time.monotonic()
    try:
        with pytest.raises(StoreError, match=f"{s3.uri}/t") as raised:
            write_table(reader, f"{s3.uri}/t", storage_options=options, dedup="content")
    finally:
        proxy.close()
    # the request's budget (2 s), then the cleanups' one bound (5 s) in all: nested cleanups
    # (the write's, the table write's, the change's) each waited 5 s of their own (17 s)
    assert time.monotonic() - started < 12
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == len(set(notes)) and len(notes) <= 2


def test_reads_of_an_open_table_whose_store_goes_silent_fail_within_the_answer_bound(
    s3, monkeypatch
):
    """A table is open, then its store stops answering: each read (verify and stats too) fails
    once the store has not answered a listing for the answer bound, with the default request
    budget (Lance waited out a 60 s request four times: reads took 240-330 s; an open inside
    the minute a store's answer is kept, 125 s)."""
    from blobhouse.io import objects as storage

    monkeypatch.setattr(storage, "ANSWER_SECONDS", 2.0)
    proxy = StallingProxy(s3.options["aws_endpoint"])
    options = {**s3.options, "aws_endpoint": proxy.endpoint}
    data = pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])})
    reads = {
        "read_blobs": lambda table: table.read_blobs("img", [0]),
        "take": lambda table: table.take([1], blobs="bytes"),
        "to_arrow": lambda table: table.to_arrow(columns=["id"]),
        "count_rows": lambda table: table.count_rows("id > 1"),
        "open_blob": lambda table: table.open_blob("img", 1),
        "open_table": lambda table: open_table(table.uri, storage_options=options),
        "verify": lambda table: table.verify(deep=True),
        "stats": lambda table: table.stats(),
    }

    def failing(name: str) -> float:
        started = time.monotonic()
        uri = tables[name].uri
        with pytest.raises(StoreError, match=rf"{uri}.* did not answer .* within 2 s"):
            reads[name](tables[name])
        return time.monotonic() - started

    try:
        # a table each: what one read brought into Lance's caches is not asked of the store
        tables = {name: write_table(data, f"{s3.uri}/{name}", storage_options=options)
                  for name in reads}  # fmt: skip
        proxy.stall()
        with ThreadPoolExecutor(len(reads)) as calls:  # at once, as a loader's threads read
            took = dict(zip(reads, calls.map(failing, reads), strict=True))
        assert all(seconds < 12 for seconds in took.values()), took
    finally:
        proxy.close()
