"""Storage option names: every spelling Lance reads is accepted; any other name is refused,
naming the closest, before anything is written (Lance would ignore it silently: a misspelled
endpoint sends Lance's requests to AWS itself)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from blobhouse import blob_array, open_table, write_table
from blobhouse.cli import main
from blobhouse.errors import UnknownOptionError
from blobhouse.io.objects import checked_options
from blobhouse.io.storage_options import check_option_names

TYPO = {"aws_endpiont": "http://127.0.0.1:9"}


@pytest.mark.parametrize(
    "name",
    [
        "aws_endpoint",
        "endpoint_url",
        "AWS_REGION",  # Lance lowercases names
        "region",
        "aws_session_token",
        "account_name",
        "azure_storage_account_key",
        "azure_endpoint",
        "sas_token",
        "service_account",
        "google_service_account_key",
        "timeout",
        "azure_timeout",
        "aws_allow_http",
        "client_max_retries",
        "download_retry_count",
        "lance_aimd_max_retries",
        "headers.x-ms-version",
    ],
)
def test_every_spelling_lance_reads_is_accepted(name):
    check_option_names({name: "1"})


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("aws_endpiont", "aws_endpoint"),
        ("aws_regoin", "aws_region"),
        ("acount_name", "account_name"),
        ("client_max_retires", "client_max_retries"),
        ("timout", "timeout"),
    ],
)
def test_a_misspelled_name_is_refused_naming_the_closest(name, closest):
    with pytest.raises(UnknownOptionError, match=rf"'{name}' \(did you mean '{closest}'\?\)"):
        checked_options({name: "1"})


def test_a_name_like_no_other_is_refused_too():
    with pytest.raises(UnknownOptionError, match="unknown storage option 'frobnicate'"):
        checked_options({"frobnicate": "1"})


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("endpoint_url", "aws_endpoint"),
        ("region", "aws_region"),
        ("AWS_REGION", "aws_region"),
        ("aws_default_region", "region"),
        ("aws_token", "session_token"),
        ("account_key", "azure_storage_account_key"),
        ("sas_token", "azure_storage_sas_key"),
        ("timeout", "aws_timeout"),
        ("service_account", "google_service_account_path"),
    ],
)
def test_two_spellings_of_one_option_are_refused_naming_both(first, second):
    """Lance takes one of them, at random (a hash map's order); obstore refused the pair with a
    bare "Duplicate key"."""
    with pytest.raises(UnknownOptionError, match=rf"'{first}' and '{second}' are one option"):
        checked_options({first: "1", second: "2"})


def test_one_name_for_several_stores_is_no_duplicate():
    """``endpoint`` is S3's and Azure's: given once, it is one option."""
    checked_options({"endpoint": "http://127.0.0.1:9", "account_name": "a", "region": "r"})


def test_a_misspelled_option_leaves_nothing_behind(tmp_path):
    uri = str(tmp_path / "t")
    data = pa.table({"id": [1], "img": blob_array([b"x"])})
    with pytest.raises(UnknownOptionError, match="aws_endpoint"):
        write_table(data, uri, storage_options=TYPO)
    assert not os.path.exists(uri)
    write_table(data, uri)
    with pytest.raises(UnknownOptionError, match="aws_endpoint"):
        open_table(uri, storage_options=TYPO)
    with pytest.raises(UnknownOptionError, match="aws_endpoint"):
        write_table(data, uri, mode="append", storage_options=TYPO)
    assert open_table(uri).version == 1


def test_the_cli_refuses_a_misspelled_option_in_one_line(tmp_path, capsys):
    uri = str(tmp_path / "t")
    write_table(pa.table({"id": [1]}), uri)
    code = main(["stats", uri, "--storage-option", "aws_endpiont=http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean 'aws_endpoint'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_store_neither_lance_nor_blobhouse_reaches_is_refused_by_name(tmp_path):
    from blobhouse.errors import InvalidInputError
    from blobhouse.io.objects import object_store

    with pytest.raises(InvalidInputError, match=r"hdfs:// is no store blobhouse reaches"):
        object_store("hdfs://namenode:8020/t").size("hdfs://namenode:8020/t/x")
    data = pa.table({"id": [1], "img": blob_array([b"x"])})
    with pytest.raises(InvalidInputError, match="scheme 'hdfs' is not supported"):
        write_table(data, str(tmp_path / "t"), allowed_bases=["hdfs://namenode:8020/media"])


def test_credentials_are_never_printed():
    """What holds storage options (a change's transaction, the Spark read spec, the CLI's
    context) leaves them out of its repr: it lands in logs and tracebacks."""
    from blobhouse.commit.transaction import Transaction
    from blobhouse.layout import TableLocation

    options = checked_options({"aws_secret_access_key": "hunter2", "aws_region": "eu-west-1"})
    txn = Transaction.start(TableLocation.of("s3://bucket/t"), None, options)
    assert txn.storage_options["aws_secret_access_key"] == "hunter2"
    assert "hunter2" not in repr(txn) and "s3://bucket/t" in repr(txn)
