"""Fixtures shared by tests/ and the package doctests: one local Spark session for the run."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A local Spark session on loopback, created once, with blobhouse registered (its SQL
    warehouse, which catalog tables create, in a temporary directory, not the checkout)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from blobhouse.spark import local_session, register

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = local_session(
        master="local[2]",
        shuffle_partitions=4,
        conf={"spark.sql.warehouse.dir": str(warehouse)},
    )
    register(session)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _spark_for_doctests(request, doctest_namespace):
    """Spark doctests get ``spark``; other tests do not start it."""
    if request.node.nodeid.startswith("blobhouse/spark"):
        doctest_namespace["spark"] = request.getfixturevalue("spark")
