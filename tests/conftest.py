"""Fixtures of tests/ (the Spark session fixture is in the repository's conftest.py), and the
local S3-compatible server object-storage tests run against."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from blobhouse.testing import LocalS3Server


@pytest.fixture
def table_uri(tmp_path: Path) -> str:
    """Where a test's table lives (not created yet)."""
    return str(tmp_path / "table")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3Server]:
    """A real S3-compatible server (moto's standalone server) on 127.0.0.1 for the whole run."""
    with LocalS3Server() as server:
        yield server


@pytest.fixture
def s3(s3_server: LocalS3Server) -> S3Bucket:
    """A fresh bucket on the local S3 server, and the storage options that reach it."""
    name = s3_server.bucket("t-" + uuid.uuid4().hex[:20])
    options = {**s3_server.options, "allow_http": "true"}
    return S3Bucket(f"s3://{name}", options, s3_server.client, name)


@dataclass
class S3Bucket:
    """A bucket of the local S3 server: its URI, storage options and a boto3 client."""

    uri: str
    options: dict[str, str]
    client: object
    name: str

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix
        )
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def uploads(self) -> list[str]:
        """Keys of unfinished multipart uploads."""
        listed = self.client.list_multipart_uploads(Bucket=self.name)
        return [u["Key"] for u in listed.get("Uploads", [])]


# Tests that start Spark without asking for the ``spark`` fixture: in child processes (a killed
# job, a standalone cluster, the benchmark's Spark contenders) or the README's Spark examples.
SPARK_MODULES = {"test_spark_crash_safety.py", "test_spark_cluster.py", "test_bench.py"}
SPARK_TESTS = {"tests/test_readme.py::test_readme_python_examples_run"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test that needs pyspark ``spark``, so ``pytest -m "not spark"`` runs the
    Python-only tests (what ``pip install blobhouse`` without the ``spark`` extra supports)."""
    for item in items:
        if (
            "spark" in getattr(item, "fixturenames", ())
            or item.path.name in SPARK_MODULES
            or item.nodeid in SPARK_TESTS
            or item.nodeid.startswith(("blobhouse/spark/", "bench/spark_targets.py"))
        ):
            item.add_marker(pytest.mark.spark)
