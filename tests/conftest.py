"""Fixtures of tests/ (the Spark session fixture is in the repository's conftest.py), and the
local S3-compatible server and Azure emulator object-storage tests run against."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
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
# a test lives or what it asks for, applied here; a test that needs one otherwise carries it in
# its own file (``@pytest.mark.slow``, a module's ``pytestmark``).

# Every test of a wing (tests/<wing>/) carries its marker.
WING_MARKERS = {"faults": "faults"}
# The fixtures that start the local S3 server or Azurite.
OBJECT_STORE_FIXTURES = {"s3", "s3_server", "azure", "azure_server"}
# Doctests that start a server of their own: a doctest cannot carry a marker, so it is named here
# (the LocalS3Server example of blobhouse/testing.py).
OBJECT_STORE_DOCTESTS = {"blobhouse/testing.py::blobhouse.testing"}
# Doctests that need pyspark, by where they live (the docs' Spark pages are marked in
# tests/docs/test_docs.py).
SPARK_DOCTESTS = ("blobhouse/spark/", "bench/spark_targets.py")


def _markers(item: pytest.Item) -> set[str]:
    """The markers ``item`` gets from where it lives and what it asks for."""
    fixtures = set(getattr(item, "fixturenames", ()))
    markers = set()
    parts = item.path.relative_to(item.config.rootpath).parts
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in WING_MARKERS:
        markers.add(WING_MARKERS[parts[1]])
    if "spark" in fixtures or item.nodeid.startswith(SPARK_DOCTESTS):
        markers.add("spark")
    if fixtures & OBJECT_STORE_FIXTURES or item.nodeid in OBJECT_STORE_DOCTESTS:
        markers.add("object_store")
    return markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test ``spark``, ``object_store`` and ``faults`` as its wing and fixtures
    say; ``cluster``, ``slow`` and the rest are on the tests themselves (tests/README.md).
    ``pytest -m "not spark"`` runs the Python-only tests (what ``pip install blobhouse``
    without the ``spark`` extra supports), and ``-m "not spark and not faults and not
    object_store and not slow"`` is the quick loop."""
    for item in items:
        for marker in sorted(_markers(item)):
            item.add_marker(getattr(pytest.mark, marker))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once a run's tests are chosen (-m, -k applied): the quick benchmark run starts if its
    test is among them. (A parallel run's workers leave it to their controller.)"""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    if any(item.nodeid == QUICK_BENCH_TEST for item in session.items):
        session.config.stash[_QUICK_BENCH] = QuickBench.start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """In a parallel run's controller, once a worker collected: the quick benchmark run starts
    if its test is among the tests (each worker collects all of them, so once)."""
    config = node.config
    if QUICK_BENCH_TEST in ids and _QUICK_BENCH not in config.stash:
        config.stash[_QUICK_BENCH] = QuickBench.start()


QUICK_BENCH_TEST = "tests/project/test_bench.py::test_quick_benchmark_run"
_QUICK_BENCH = pytest.StashKey["QuickBench"]()


@dataclass
class QuickBench:
    """The quick benchmark run (``python -m bench --quick``, 3 minutes on 2 cores), started in
    the background as soon as a run that selects its test is collected, niced: the rest of
    the suite runs beside it (the suite's wall time was over its 20 minutes with the run in
    line), and the test waits for it and checks its numbers. It lives in the run's temporary
    folder, ``quick-bench/``, where a parallel run's worker finds the run its controller
    started: ``bench.log``, ``results/`` and, once it ended, ``exit`` (its exit status)."""

    out: Path
    process: subprocess.Popen | None = None  # in the process that started it

    @staticmethod
    def folder() -> Path:
        return Path(tempfile.gettempdir()) / "quick-bench"  # the run's folder (conftest.py)

    @classmethod
    def start(cls) -> QuickBench:
        """Starts the run, or finds the one this pytest run started already."""
        out = cls.folder()
        try:
            out.mkdir()
        except FileExistsError:
            return cls(out)
        bench = [sys.executable, "-m", "bench", "--quick", "--out", str(out / "results")]
        then_exit = '"$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"'  # $0: where the status goes
        with open(out / "bench.log", "wb") as log:
            process = subprocess.Popen(
                ["/bin/sh", "-c", then_exit, str(out / "exit"), *bench],
                cwd=Path(__file__).resolve().parent.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stopped as a group: the shell and the run
                preexec_fn=lambda: os.nice(5),  # the suite's own timings come first
            )
        return cls(out, process)

    def results(self) -> Path:
        """The run's results folder, once it ended; its log in the error if it failed."""
        status = self.out / "exit"
        deadline = time.monotonic() + 30 * 60  # ten times its usual length: it hangs
        while not status.exists() and time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                break  # the shell was killed before it wrote the status
            time.sleep(0.5)
        if not status.exists() or status.read_text().strip() != "0":
            log = (self.out / "bench.log").read_text(errors="replace")
            raise AssertionError(f"the quick benchmark run failed:\n{log[-4000:]}")
        return self.out / "results"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def quick_bench_results(request: pytest.FixtureRequest) -> Path:
    """The folder of the quick benchmark run's results (the run started at collection, in
    this process or in a parallel run's controller)."""
    bench = request.config.stash.get(_QUICK_BENCH, None)
    if bench is None:  # a parallel run's worker, or collected some other way
        bench = request.config.stash[_QUICK_BENCH] = QuickBench.start()
    return bench.results()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that ends before the quick benchmark run's test (-x, Ctrl-C) stops it."""
    bench = session.config.stash.get(_QUICK_BENCH, None)
    if bench is not None:
        bench.stop()


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
