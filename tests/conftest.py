"""Fixtures of tests/ (the Spark session fixture is in the repository's conftest.py), and the
local S3-compatible server and Azure emulator object-storage tests run against."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from blobhouse.testing import LocalAzureServer, LocalS3Server


@pytest.fixture
def table_uri(tmp_path: Path) -> str:
    """Where a test's table lives (not created yet)."""
    return str(tmp_path / "table")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """A real S3-compatible server (moto's standalone server) on 127.0.0.1 for the whole run,
    logging its requests (tests count them: :meth:`S3Bucket.gets`)."""
    with LocalS3Server(log=tmp_path_factory.mktemp("s3-server") / "requests.log") as server:
        yield server


@pytest.fixture(scope="session")
def azure_server() -> Iterator[LocalAzureServer]:
    """Azurite (Azure's emulator, installed by ``bin/bootstrap --azurite``) on 127.0.0.1 for the
    whole run."""
    with LocalAzureServer() as server:
        yield server


@pytest.fixture
def azure(azure_server: LocalAzureServer) -> AzureContainer:
    """A fresh container on Azurite, and the storage options that reach it."""
    name = azure_server.create_container("t" + uuid.uuid4().hex[:20])
    return AzureContainer(f"az://{name}", dict(azure_server.options), azure_server)


@pytest.fixture(params=["s3", "azure"])
def bucket(request: pytest.FixtureRequest) -> S3Bucket | AzureContainer:
    """A fresh S3 bucket, then a fresh Azure container: a test taking it runs on both stores
    (``uri``, ``options``, ``objects()``, ``get``, ``put``, ``uploads()``)."""
    return request.getfixturevalue(request.param)


@dataclass
class AzureContainer:
    """A container of Azurite: its URI and storage options, and what it holds, read with
    obstore (the same questions :class:`S3Bucket` answers with boto3)."""

    uri: str
    options: dict[str, str]
    server: LocalAzureServer

    @property
    def name(self) -> str:
        return self.uri.removeprefix("az://")

    def _store(self):
        from obstore.store import AzureStore

        return AzureStore(
            self.name,
            account_name=self.options["account_name"],
            account_key=self.options["account_key"],
            endpoint=self.options["azure_endpoint"],
            client_options={"allow_http": True},
        )

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        import obstore

        pages = obstore.list(self._store(), prefix=prefix or None)
        return {o["path"]: o["size"] for page in pages for o in page}

    def get(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self._store(), key).bytes())

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self._store(), key, data)

    def uploads(self) -> list[str]:
        """Blobs with staged, never committed blocks (Azure keeps an aborted upload's blocks
        until it discards them, a week later: none is ever an object)."""
        return self.server.uncommitted(self.name)


@pytest.fixture
def s3(s3_server: LocalS3Server) -> S3Bucket:
    """A fresh bucket on the local S3 server, and the storage options that reach it."""
    name = s3_server.bucket("t-" + uuid.uuid4().hex[:20])
    options = {**s3_server.options, "allow_http": "true"}
    return S3Bucket(f"s3://{name}", options, s3_server.client, name, s3_server)


@dataclass
class S3Bucket:
    """A bucket of the local S3 server: its URI, storage options and a boto3 client."""

    uri: str
    options: dict[str, str]
    client: object
    name: str
    server: LocalS3Server

    def gets(self, key: str = "") -> int:
        """How many GETs of objects whose key starts with ``key`` the server answered so far
        (listings are not counted)."""
        return self.server.requests(f"/{self.name}/{key}").get("GET", 0)

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


# Markers (declared in pyproject.toml; tests/README.md has the quick loop). Most come from where
# a test lives or what it asks for; the sets below name the tests that need one otherwise.

# Every test of a wing (tests/<wing>/) carries its marker.
WING_MARKERS = {"faults": "faults"}
# Tests that start Spark without asking for the ``spark`` fixture: in child processes (a killed
# job, a standalone cluster, the benchmark's Spark contenders); the docs' Spark pages ask for
# the fixture themselves (tests/docs/test_docs.py).
SPARK_MODULES = {"test_spark_crash_safety.py", "test_spark_cluster.py", "test_bench.py"}
CLUSTER_MODULES = {"test_spark_cluster.py"}  # a standalone master and workers
# The local S3 server: the fixtures that start it, and tests that start one of their own
# (the demo's --local-s3, the benchmark's object-storage case, the LocalS3Server doctest).
OBJECT_STORE_FIXTURES = {"s3", "s3_server", "azure", "azure_server"}
OBJECT_STORE_MODULES = {"test_object_storage.py", "test_bench.py"}
OBJECT_STORE_TESTS = {
    "tests/cli/test_cli.py::test_demo_on_a_local_s3_server",
    "blobhouse/testing.py::blobhouse.testing",
}
# The longest tests that no other marker keeps out of the quick loop (5 s or more in the quick
# loop's --durations on the 2-core machine: together 3 of its 5 minutes), and the two longest of
# the whole suite: the benchmark's smoke run (300 s) and the standalone cluster (190 s).
SLOW_MODULES = {"test_bench.py", "test_spark_cluster.py"}
SLOW_TESTS = {
    "tests/read/test_torch.py::test_resuming_from_the_main_process_count_continues_the_epoch",
    "tests/read/test_torch.py::test_orders_change_with_the_epoch_and_repeat_with_the_seed",
    "tests/read/test_torch.py::"
    "test_forked_workers_of_a_parent_that_used_lance_read_through_a_fresh_process",
    "tests/read/test_torch.py::test_persistent_workers_read_the_epoch_set_and_a_resumed_start[spawn]",
    "tests/read/test_torch.py::test_two_ranks_of_two_spawned_workers_read_every_row_once",
    "tests/read/test_torch.py::test_two_ranks_of_two_forked_workers_read_every_row_once",
    "tests/read/test_torch.py::test_the_row_dataset_with_a_distributed_sampler_reads_every_row_once",
    "tests/maintenance/test_table_services_properties.py::test_table_services::runTest",
    "tests/write/test_streaming.py::test_peak_memory_is_flat_as_a_data_file_of_small_rows_grows",
    "tests/write/test_streaming.py::test_peak_memory_is_flat_as_the_table_grows",
    "tests/store/test_global_dedup.py::test_a_writer_and_gc_in_separate_processes_lose_nothing",
}


def _markers(item: pytest.Item) -> set[str]:
    """The markers ``item`` gets from where it lives, what it asks for, and the sets above."""
    fixtures = set(getattr(item, "fixturenames", ()))
    module = item.path.name
    markers = set()
    parts = item.path.relative_to(item.config.rootpath).parts
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in WING_MARKERS:
        markers.add(WING_MARKERS[parts[1]])
    if (
        "spark" in fixtures
        or module in SPARK_MODULES
        or item.nodeid.startswith(("blobhouse/spark/", "bench/spark_targets.py"))
    ):
        markers.add("spark")
    if module in CLUSTER_MODULES:
        markers.add("cluster")
    if (
        fixtures & OBJECT_STORE_FIXTURES
        or module in OBJECT_STORE_MODULES
        or item.nodeid in OBJECT_STORE_TESTS
    ):
        markers.add("object_store")
    if module in SLOW_MODULES or item.nodeid in SLOW_TESTS:
        markers.add("slow")
    return markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test ``spark``, ``cluster``, ``object_store``, ``faults`` and ``slow`` as it
    needs (tests/README.md): ``pytest -m "not spark"`` runs the Python-only tests (what ``pip
    install blobhouse`` without the ``spark`` extra supports), and ``-m "not spark and not
    faults and not object_store and not slow"`` is the quick loop."""
    for item in items:
        for marker in sorted(_markers(item)):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture
def immutable():
    """Makes a path immutable (``chattr +i``: not even root may rename or remove it) for the
    test, and mutable again after."""
    made: list[str] = []

    def make_immutable(path: str) -> None:
        subprocess.run(["chattr", "+i", path], check=True)
        made.append(path)

    yield make_immutable
    for path in made:
        subprocess.run(["chattr", "-i", path], check=True)
