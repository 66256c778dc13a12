"""A store that does not answer fails the call in seconds, with a blobhouse error naming the store
and what was being done: Lance's own budget (a 30 s request retried 10 times, for each of the
requests an open makes) kept a write waiting more than ten minutes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.errors import InvalidInputError, StoreError
from blobhouse.loader import BatchLoader
from blobhouse.storage import REQUEST_BUDGET, _boto3_client, checked_options, obstore_settings

pytestmark = pytest.mark.object_store


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


def silent_store(kind: str, endpoint: str) -> tuple[str, dict[str, str]]:
    if kind == "s3":
        options = {"aws_endpoint": endpoint, "aws_access_key_id": "k"}
        return "s3://bucket/t", {**options, "aws_secret_access_key": "s"}
    account = "devstoreaccount1"
    options = {"account_name": account, "account_key": "a2V5", "allow_http": "true"}
    return "az://container/t", {**options, "azure_endpoint": f"{endpoint}/{account}"}


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_store_that_does_not_answer_fails_open_and_write_fast(silent_endpoint, kind):
    uri, options = silent_store(kind, silent_endpoint)
    rows = pa.table({"img": blob_array([b"x" * 200_000])})
    for call in (
        lambda: open_table(uri, storage_options=options),
        lambda: write_table(rows, uri, storage_options=options),
    ):
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"{uri}.* did not answer .* within") as raised:
            call()
        assert time.monotonic() - started < 30
        assert isinstance(raised.value, OSError)


def test_a_loader_on_a_store_that_does_not_answer_fails_fast(silent_endpoint):
    """The loader lists the table's versions itself (to pin one) before Lance is asked."""
    uri, options = silent_store("s3", silent_endpoint)
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot read {uri}.* did not answer"):
        BatchLoader(uri, batch_size=2, storage_options=options)
    assert time.monotonic() - started < 30


def test_requests_have_a_budget_unless_given_one():
    """Lance, obstore and boto3 get the same timeouts and retries: blobhouse's defaults, or the
    caller's; a number of seconds is taken where Lance wants a duration."""
    options = checked_options({"aws_region": "us-east-1"})
    assert {k: options[k] for k in REQUEST_BUDGET} == REQUEST_BUDGET
    given = checked_options({"timeout": 300, "connect_timeout": "2s", "client_max_retries": 1})
    assert (given["timeout"], given["connect_timeout"]) == ("300s", "2s")
    assert given["client_max_retries"] == "1"
    _, client, retry = obstore_settings("az", given)
    assert client["timeout"] == "300s" and retry["max_retries"] == 1
    config = _boto3_client(given).meta.config
    assert (config.connect_timeout, config.read_timeout) == (2, 300)
    assert config.retries["total_max_attempts"] == 1  # no retry fits in the default 60 s
    config = _boto3_client(checked_options({"aws_region": "x"})).meta.config
    assert config.retries["total_max_attempts"] == 2  # 60 s requests, retried within 60 s
    assert checked_options(None) is None  # a local table's options stay empty


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("client_max_retries", "abc"),
        ("client_max_retries", "-1"),
        ("client_retry_timeout", "soon"),
        ("timeout", "30 parsecs"),
        ("connect_timeout", ""),
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
    started = time.monotonic()
    with pytest.raises(Exception, match=silent):
        df.write.format("blobhouse").options(**storage_prefixed(options)).mode("append").save(uri)
    with pytest.raises(Exception, match=silent):
        spark.read.format("blobhouse").options(**storage_prefixed(options)).load(uri).count()
    with pytest.raises(StoreError, match=f"{uri}.* did not answer"):
        bs.write_table(df, uri, storage_options=options)
    assert time.monotonic() - started < 60
