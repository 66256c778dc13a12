"""Writers creating the same table at once: with ``append`` every writer's rows land, with
``create`` exactly one succeeds and the others raise TableExistsError; never two successes with
rows gone. Lance commits a second creator's Overwrite on top of the first one, so blobhouse
commits a create as version 1 or not at all and re-plans the loser."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from blobhouse import SchemaError, TableExistsError, blob_array, open_table
from blobhouse.options import WriteOptions
from blobhouse.write import begin_write
from tests.helpers import data_files, stock_read

SHARED = os.urandom(120_000)


def rows(ids, payloads) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "b": blob_array(list(payloads))})


def staged(uri: str, data: pa.Table, mode: str, dedup: str = "content"):
    """A write planned (the table missing for every one of them) and its files written."""
    write = begin_write(uri, data.schema, WriteOptions(dedup=dedup), mode=mode, in_tasks=True)
    return write, write.plan.write(data.to_batches())


def contents(uri: str) -> dict[int, bytes]:
    table = open_table(uri)
    return {r["id"]: r["b"] for r in table.to_arrow(blobs="bytes").to_pylist()}


@pytest.mark.parametrize("dedup", ["content", "global"])
def test_the_losers_of_a_create_race_append(table_uri, dedup):
    first = rows([0, 1], [SHARED, os.urandom(90_000)])
    second = rows([2, 3], [SHARED, os.urandom(300)])
    one, one_files = staged(table_uri, first, "append", dedup)
    two, two_files = staged(table_uri, second, "append", dedup)  # also sees no table
    one.commit(one_files)
    table = two.commit(two_files).snapshot
    assert table.version == 2 and [v["version"] for v in table.versions()] == [1, 2]
    expected = dict(zip(range(4), [*first["b"].to_pylist(), *second["b"].to_pylist()], strict=True))
    assert contents(table_uri) == {i: v["data"] for i, v in expected.items()}
    ids = lance.dataset(table_uri).to_table(columns=["id"])["id"].to_pylist()
    assert dict(zip(ids, stock_read(table_uri, "b"), strict=True)) == {
        i: v["data"] for i, v in expected.items()
    }
    assert open_table(table_uri).verify(deep=True)["problems"] == []


def test_exactly_one_creator_wins_and_the_others_leave_nothing(table_uri):
    first, second = rows([0], [SHARED]), rows([1], [os.urandom(200_000)])
    one, one_files = staged(table_uri, first, "create")
    two, two_files = staged(table_uri, second, "create")
    one.commit(one_files)
    files_after_first = {f for f in data_files(table_uri)} - {
        f for f in data_files(table_uri) if two.transaction.name_prefix in f
    }
    with pytest.raises(TableExistsError, match="created by another writer"):
        two.commit(two_files)
    assert contents(table_uri) == {0: SHARED}
    assert data_files(table_uri) == files_after_first  # the loser's files are gone
    assert open_table(table_uri).version == 1


def test_a_loser_with_another_schema_commits_nothing(table_uri):
    one, one_files = staged(table_uri, rows([0], [SHARED]), "append")
    other = pa.table({"id": pa.array(["x"]), "b": blob_array([b"other"])})
    two, two_files = staged(table_uri, other, "append")
    one.commit(one_files)
    with pytest.raises(SchemaError, match="id: table has int64, data has string"):
        two.commit(two_files)
    assert contents(table_uri) == {0: SHARED}
    assert not [f for f in data_files(table_uri) if two.transaction.name_prefix in f]


def test_overwrites_of_a_missing_table_are_last_writer_wins(table_uri):
    one, one_files = staged(table_uri, rows([0], [SHARED]), "overwrite")
    two, two_files = staged(table_uri, rows([1], [b"later"]), "overwrite")
    one.commit(one_files)
    two.commit(two_files)
    assert contents(table_uri) == {1: b"later"}
    assert contents(table_uri) == {1: b"later"} and open_table(table_uri, 1).count_rows() == 1


WRITER = """
import os, sys, time
import pyarrow as pa
from blobhouse import TableExistsError, blob_array, write_table
uri, mode, writer, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
data = pa.table({"id": pa.array([writer * 10, writer * 10 + 1], pa.int64()),
                 "b": blob_array([b"shared" * 20_000, os.urandom(50_000)])})
time.sleep(max(0.0, start - time.time()))
try:
    write_table(data, uri, mode=mode)
except TableExistsError:
    sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["append", "create"])
def test_processes_creating_one_table_at_the_same_moment(tmp_path: Path, mode):
    uri = str(tmp_path / "table")
    start = time.time() + 3  # every process is up and waiting by then
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, uri, mode, str(w), str(start)])
        for w in range(4)
    ]
    codes = [p.wait(timeout=120) for p in procs]
    ids = sorted(open_table(uri).to_arrow(columns=["id"])["id"].to_pylist())
    if mode == "append":
        assert codes == [0, 0, 0, 0]
        assert ids == sorted(i for w in range(4) for i in (w * 10, w * 10 + 1))
    else:
        assert sorted(codes) == [0, 3, 3, 3]
        winner = codes.index(0)
        assert ids == [winner * 10, winner * 10 + 1]
    assert open_table(uri).verify(deep=True)["problems"] == []


def test_spark_jobs_creating_one_table_at_the_same_moment(spark, table_uri):
    frames = [
        spark.createDataFrame([(j * 10 + i, SHARED) for i in range(3)], "id long, b binary")
        for j in range(3)
    ]
    errors = []

    def run(df) -> None:
        # pyspark 4.3 finds Python data sources through the JVM thread's active session
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            df.write.format("blobhouse").mode("append").option("blob_columns", "b").save(table_uri)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(df,)) for df in frames]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    ids = sorted(open_table(table_uri).to_arrow(columns=["id"])["id"].to_pylist())
    assert ids == sorted(j * 10 + i for j in range(3) for i in range(3))
    assert set(open_table(table_uri).read_blobs("b", range(9))) == {SHARED}
