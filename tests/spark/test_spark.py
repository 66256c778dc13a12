"""Spark: the blobhouse data source, read_blob in SQL, dedup across tasks, abort, stale filters."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

import blobhouse.spark as bs
from blobhouse import open_table, write_table
from blobhouse.errors import InvalidInputError, PathNotFoundError
from blobhouse.files.ranges import REF_TYPE
from blobhouse.spark.functions import _runs, read_bytes
from tests.helpers import disk_bytes, stock_read, tree, wait_for_idle_tasks

pytestmark = pytest.mark.usefixtures("spark")
KB = 1024


def frame(spark, rows, schema, partitions=2):
    return spark.createDataFrame(rows, schema).repartition(partitions)


def test_round_trip_every_kind(spark, table_uri, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "clip.bin").write_bytes(os.urandom(3000))
    payloads = [os.urandom(100), os.urandom(200 * KB), os.urandom(700 * KB), None, b""]
    rows = [(i, p) for i, p in enumerate(payloads)]
    df = spark.createDataFrame(rows, "id long, media binary").coalesce(1)
    (
        df.write.format("blobhouse")
        .mode("append")
        .option("blob_columns", "media")
        .option("dedicated_size_threshold", str(500 * KB))
        .option("dedup", "content")  # placed in the data file's own sidecars
        .save(table_uri)
    )
    kinds = [
        d and d["kind"]
        for d in lance.dataset(table_uri).to_table(columns=["media"]).column("media").to_pylist()
    ]
    assert kinds == [0, 1, 2, None, 0]
    assert stock_read(table_uri, "media") == payloads

    # the logical blob struct, with an external reference and a range of it
    external = str(media / "clip.bin")
    struct = "struct<data binary, uri string, position long, size long, ref_id long>"
    more = spark.createDataFrame(
        [
            (5, (None, external, None, None, None)),
            (6, (None, external, 10, 20, None)),
            (7, (b"inline", None, None, None, None)),
        ],
        f"id long, media {struct}",
    )
    (
        more.write.format("blobhouse")
        .mode("append")
        .option("allowed_bases", str(media))
        .save(table_uri + "2")
    )
    clip = (media / "clip.bin").read_bytes()
    assert stock_read(table_uri + "2", "media") == [clip, clip[10:30], b"inline"]

    read = spark.read.format("blobhouse").load(table_uri)
    assert read.schema["media"].dataType.simpleString() == (
        "struct<uri:string,position:bigint,size:bigint,blake3:binary>"
    )
    got = {r.id: r.media for r in bs.materialize(read, ["media"]).collect()}
    assert [got[i] for i in range(5)] == payloads
    as_bytes = spark.read.format("blobhouse").option("blobs", "bytes").load(table_uri)
    assert {r.id: r.media for r in as_bytes.collect()} == got


def test_read_blob_and_blob_size_in_sql(spark, table_uri):
    payloads = {i: os.urandom(random.Random(i).randint(1, 300_000)) for i in range(40)}
    df = spark.createDataFrame(list(payloads.items()), "id long, img binary")
    bs.write_table(df, table_uri, blob_columns=["img"])
    spark.read.format("blobhouse").load(table_uri).createOrReplaceTempView("imgs")
    rows = spark.sql(
        "SELECT id, read_blob(img) AS data, blob_size(img) AS n FROM imgs WHERE id % 3 = 0"
    ).collect()
    assert sorted(r.id for r in rows) == [i for i in payloads if i % 3 == 0]
    for r in rows:
        assert r.data == payloads[r.id] and r.n == len(payloads[r.id])
    via_api = (
        spark.read.format("blobhouse")
        .load(table_uri)
        .select("id", bs.read_blob("img").alias("data"))
        .where("id = 7")
        .collect()
    )
    assert via_api[0].data == payloads[7]


def test_dedup_across_partitions(spark, tmp_path):
    rng = random.Random(3)
    distinct = [rng.randbytes(200 * KB) for _ in range(20)]
    rows = [(i, distinct[rng.randrange(20)]) for i in range(600)]
    df = frame(spark, rows, "id long, img binary", partitions=8)
    unique = sum(len(p) for p in {r[1] for r in rows})
    colocated = str(tmp_path / "colocated")  # per-file dedup: rows sharing a payload shuffled
    bs.write_table(df, colocated, blob_columns=["img"], dedup="content", partitions=4)
    assert disk_bytes(colocated) <= 1.05 * unique
    got = dict(
        zip(
            *[
                open_table(colocated).to_arrow(blobs="bytes").column(c).to_pylist()
                for c in ("id", "img")
            ],
            strict=True,
        )
    )
    assert got == dict(rows)
    plain = str(tmp_path / "plain")
    df.write.format("blobhouse").mode("append").option("blob_columns", "img").option(
        "dedup", "content"
    ).save(plain)
    assert disk_bytes(plain) > 2 * unique  # what co-location saves per file
    natural = str(tmp_path / "natural")  # the default: tasks claim payloads, no shuffle
    df.write.format("blobhouse").mode("append").option("blob_columns", "img").save(natural)
    assert disk_bytes(natural) <= 1.05 * unique


def test_dedup_across_partitions_by_ref_id(spark, table_uri):
    chunks = {c: os.urandom(300 * KB) for c in range(1, 6)}  # ref_id 0 would mean "no sharing"
    rows = [(i, i % 5 + 1, chunks[i % 5 + 1]) for i in range(200)]
    df = frame(spark, rows, "frame long, chunk long, video binary", partitions=6)
    bs.write_table(
        df,
        table_uri,
        blob_columns=["video"],
        dedup="ref_id",
        ref_id_columns={"video": "chunk"},
        partitions=3,
    )
    assert open_table(table_uri).stats()["physical_bytes"] == 5 * 300 * KB
    assert sorted(stock_read(table_uri, "video")) == sorted(r[2] for r in rows)


def test_failed_job_aborts_and_leaves_the_table_untouched(spark, table_uri):
    write_table(
        pa.table({"id": pa.array([0], pa.int64()), "img": pa.array([b"x"])}),
        table_uri,
        blob_columns=["img"],
    )
    before = tree(table_uri)

    @F.udf("binary")
    def payload(i):
        if i == 37:
            raise ValueError("source failed on row 37")
        return os.urandom(100 * KB)

    df = spark.range(1, 60, numPartitions=4).select(F.col("id"), payload("id").alias("img"))
    with pytest.raises(Exception, match="row 37"):
        df.write.format("blobhouse").mode("append").save(table_uri)
    wait_for_idle_tasks(spark)
    left = tree(table_uri) - before
    # at most the abort marker and the lease a cancelled task touched last (gc removes both)
    assert all("aborted-" in p or p.startswith("_leases/") for p in left), left
    assert open_table(table_uri).version == 1
    past = time.time() - 48 * 3600
    for path in left:
        os.utime(os.path.join(table_uri, path), (past, past))
    open_table(table_uri).gc()
    assert tree(table_uri) == before


def test_bad_input_in_a_task_is_a_clear_error(spark, table_uri):
    struct = "struct<data binary, uri string, ref_id long>"
    df = spark.createDataFrame(
        [(1, (b"a", None, 4)), (2, (b"b", None, 4))], f"id long, img {struct}"
    ).coalesce(1)
    with pytest.raises(Exception, match=r"ref_id 4 is used by row 0 .* and row 1"):
        df.write.format("blobhouse").mode("append").option("dedup", "ref_id").save(table_uri)
    wait_for_idle_tasks(spark)
    leftovers = tree(table_uri) if os.path.exists(table_uri) else set()
    assert all("aborted-" in p for p in leftovers), leftovers  # only the abort marker


def test_a_misspelled_storage_option_is_refused_before_any_task(spark, table_uri):
    df = frame(spark, [(1, b"x")], "id long, img binary")
    writer = df.write.format("blobhouse").option("blob_columns", "img")
    writer = writer.option("storage.aws_endpiont", "http://127.0.0.1:9")
    with pytest.raises(Exception, match=r"'aws_endpiont' \(did you mean 'aws_endpoint'\?\)"):
        writer.mode("append").save(table_uri)
    with pytest.raises(Exception, match="did you mean 'aws_region'"):
        spark.read.format("blobhouse").option("storage.aws_regoin", "x").load(table_uri).count()
    assert not os.path.exists(table_uri)


def test_overwrite_and_version_option(spark, table_uri):
    df = spark.createDataFrame([(1, b"one")], "id long, b binary")
    df.write.format("blobhouse").mode("append").option("blob_columns", "b").save(table_uri)
    df2 = spark.createDataFrame([(2, b"two"), (3, b"three")], "id long, b binary")
    df2.write.format("blobhouse").mode("overwrite").option("blob_columns", "b").save(table_uri)
    latest = spark.read.format("blobhouse").option("blobs", "bytes").load(table_uri)
    assert sorted((r.id, r.b) for r in latest.collect()) == [(2, b"two"), (3, b"three")]
    first = (
        spark.read.format("blobhouse").option("version", 1).option("blobs", "bytes").load(table_uri)
    )
    assert [(r.id, r.b) for r in first.collect()] == [(1, b"one")]


def test_partitions_split_big_fragments_and_filter_option(spark, table_uri):
    write_table(
        pa.table(
            {"id": pa.array(range(100), pa.int64()), "b": pa.array([b"%d" % i for i in range(100)])}
        ),
        table_uri,
        blob_columns=["b"],
    )
    df = spark.read.format("blobhouse").option("rows_per_partition", 30).load(table_uri)
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.id for r in df.collect()) == list(range(100))
    filtered = (
        spark.read.format("blobhouse")
        .option("filter", "id >= 90")
        .option("blobs", "bytes")
        .load(table_uri)
    )
    assert sorted((r.id, r.b) for r in filtered.collect()) == [
        (i, b"%d" % i) for i in range(90, 100)
    ]


def test_count_rows_counts_what_the_data_source_counts_without_a_job(spark, table_uri):
    ids = pa.array(range(50), pa.int64())
    table = write_table(pa.table({"id": ids, "b": [b"%d" % (i % 7) for i in range(50)]}), table_uri)
    table.delete("id % 5 = 0")
    table.dataset.create_branch("side", table.version)
    write_table(pa.table({"id": [100], "b": [b"x"]}), table_uri, mode="append")
    reads = [{}, {"filter": "id > 20"}, {"version": "1"}, {"branch": "side"}]
    for options in reads:
        expected = spark.read.format("blobhouse").options(**options).load(table_uri).count()
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
        assert bs.count_rows(table_uri, **options) == expected, options
        assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs  # no job ran
    assert bs.count_rows(table_uri) == 41 and bs.count_rows(table_uri, version="1") == 50
    with pytest.raises(InvalidInputError, match="filtr"):
        bs.count_rows(table_uri, filtr="id > 1")
    with pytest.raises(PathNotFoundError, match="no table at"):
        bs.count_rows(table_uri + "-missing")


def test_stale_pushed_filters_never_change_results(spark, table_uri):
    write_table(
        pa.table({"id": pa.array(range(10), pa.int64()), "b": pa.array([b"x"] * 10)}),
        table_uri,
        blob_columns=["b"],
    )
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = spark.read.format("blobhouse").load(table_uri)
        assert df.filter("id > 5").count() == 4
        assert df.count() == 10  # pyspark 4.3 would re-apply 'id > 5' if it had been pushed
        df.filter("id > 7").explain()
        assert df.count() == 10
        assert df.filter("id > 2").count() == 7
        with pytest.raises(Exception, match="pushdown='on' is refused"):
            spark.read.format("blobhouse").option("pushdown", "on").load(table_uri).count()
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_big_values_are_split_into_bounded_batches(spark, table_uri):
    payloads = [os.urandom(600 * KB) for _ in range(12)]
    write_table(
        pa.table(
            {"id": pa.array(range(12), pa.int64()), "b": pa.array(payloads, pa.large_binary())}
        ),
        table_uri,
        blob_columns=["b"],
        dedup="off",
    )
    as_bytes = (
        spark.read.format("blobhouse")
        .option("blobs", "bytes")
        .option("max_batch_bytes", str(1024 * KB))
        .load(table_uri)
    )
    assert {r.id: r.b for r in as_bytes.collect()} == dict(enumerate(payloads))
    refs = spark.read.format("blobhouse").load(table_uri)
    out = bs.materialize(refs, ["b"], max_batch_bytes=1024 * KB).collect()
    assert {r.id: r.b for r in out} == dict(enumerate(payloads))


def test_unregistered_or_missing_table_errors(spark, tmp_path):
    with pytest.raises(AnalysisException, match="no table at"):
        spark.read.format("blobhouse").load(str(tmp_path / "missing")).count()
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(Exception, match="materialize: column 'id'"):
        bs.materialize(df, ["id"])


def test_blobhouse_functions_work_in_a_session_that_never_registered(spark, tmp_path):
    """``bs.write_table`` and friends use the data source themselves: a session nobody called
    ``bs.register`` on (a fresh ``newSession()``, a notebook's own session) still writes, and a
    global-dedup append still finds the payloads the table stores (never stored twice)."""
    fresh = spark.newSession()
    uri = str(tmp_path / "t")
    shared = os.urandom(200_000)
    for start in (0, 4):
        df = fresh.createDataFrame(
            [(i, shared) for i in range(start, start + 4)], "id long, b binary"
        )
        bs.write_table(df, uri, blob_columns=["b"], dedup="global")
    assert open_table(uri).count_rows() == 8
    assert disk_bytes(os.path.join(uri, "_blobs", "packs")) == len(shared)  # stored once


def test_threads_write_and_read_through_the_data_source(spark, tmp_path):
    """Spark looks a Python data source up in the JVM thread's active session, and pyspark
    runs each Python thread on a JVM thread without one: ``df.write.format("blobhouse")`` in a
    thread failed with DATA_SOURCE_NOT_FOUND even after ``bs.register(spark)`` in that thread.
    ``bs.register(spark)`` now makes the format known to the thread that calls it (a pool
    writing tables at once, a server's request threads); blobhouse's own functions work in
    any thread."""
    df = spark.createDataFrame([(i, b"%d" % (i % 2) * 5000) for i in range(4)], "id long, b binary")

    def helper_write(n: int) -> int:
        bs.write_table(df, str(tmp_path / f"helper{n}"), blob_columns=["b"])
        return open_table(str(tmp_path / f"helper{n}")).count_rows()

    def natural_write(n: int) -> int:
        bs.register(spark)  # this thread's JVM thread: the format is known here
        uri = str(tmp_path / f"natural{n}")
        df.write.format("blobhouse").mode("append").option("blob_columns", "b").save(uri)
        return spark.read.format("blobhouse").load(uri).count()

    # fresh threads for each: a thread that ran a Spark job may have an active session since
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(natural_write, range(2))) == [4, 4]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(helper_write, range(2))) == [4, 4]


def _read_plan(refs: pa.Array, limit: int = 64 << 20) -> list:
    valid = refs.is_valid().to_numpy(zero_copy_only=False)
    sizes = [s if ok else 0 for s, ok in zip(refs.field("size").to_pylist(), valid, strict=True)]
    return _runs(refs, valid, np.concatenate([[0], np.cumsum(sizes)]), limit)[0]


def test_read_bytes_reads_each_file_in_one_range_and_keeps_every_row(table_uri):
    # Lance starts inline payloads at multiples of 64 bytes: these leave no gaps between rows
    payloads = [os.urandom(64 * random.randrange(1, 48)) for _ in range(60)]
    for start in (0, 30):  # two fragments: two data files
        rows = range(start, start + 30)
        data = pa.table(
            {
                "id": pa.array(rows, pa.int64()),
                "b": pa.array([payloads[i] for i in rows], pa.large_binary()),
            }
        )
        write_table(data, table_uri, mode="append", blob_columns=["b"], dedup="off")
    refs = open_table(table_uri).to_arrow(blobs="refs").column("b").combine_chunks()
    assert read_bytes(refs).to_pylist() == payloads
    assert [r.size for r in _read_plan(refs)] == [
        sum(map(len, payloads[:30])),
        sum(map(len, payloads[30:])),
    ]
    # bounded reads: a run ends where its bytes cross a multiple of the limit
    bounded = _read_plan(refs, limit=4 * KB)
    assert sum(r.size for r in bounded) == sum(map(len, payloads)) and len(bounded) > 4
    assert all(r.size < 4 * KB + 3 * KB for r in bounded)
    # out of order, repeated, null, null uri, empty: each row its own bytes
    no_uri = pa.array([{"uri": None, "position": 0, "size": 5}], REF_TYPE)
    empty = pa.array([{"uri": refs[0]["uri"].as_py(), "position": 7, "size": 0}], REF_TYPE)
    pieces = [refs.slice(40, 10), pa.nulls(2, REF_TYPE), refs.slice(0, 5), refs.slice(2, 1)]
    mixed = pa.concat_arrays([*pieces, no_uri, empty, refs.slice(29, 3)])
    expected = [*payloads[40:50], None, None, *payloads[0:5], payloads[2], None, b""]
    assert read_bytes(mixed).to_pylist() == [*expected, *payloads[29:32]]
    assert read_bytes(pa.array([], REF_TYPE)).to_pylist() == []


def test_read_bytes_refuses_a_negative_size(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"hello")
    bad = pa.array([{"uri": path.as_uri(), "position": 0, "size": -1}], REF_TYPE)
    with pytest.raises(InvalidInputError, match=r"row 0 of the batch\) has a negative size"):
        read_bytes(bad)


def test_many_small_units_share_a_few_tasks_and_keep_their_order(spark):
    """verify, gc, mutations and backfills hand Spark a unit per fragment (state): a table
    grown by small appends has thousands, and a task each made a verify of 500 states take
    189 s on local[2]; units now share at most TASKS_PER_CORE tasks per core."""
    from pyspark import TaskContext

    from blobhouse.spark.jobs import TASKS_PER_CORE, run_tasks

    units = list(range(300))
    results = run_tasks(spark, units, lambda u: (u * 2, TaskContext.get().partitionId()))
    assert [doubled for doubled, _ in results] == [u * 2 for u in units]
    tasks = {partition for _, partition in results}
    cores = spark.sparkContext.defaultParallelism
    assert 1 < len(tasks) <= cores * TASKS_PER_CORE
    few = run_tasks(spark, [1, 2, 3], lambda u: TaskContext.get().partitionId())
    assert len(set(few)) == 3  # fewer units than that: a task each, as before


def test_the_console_progress_bar_is_off_when_stderr_is_not_a_terminal(spark):
    # the session was made by local_session in this process: under pytest (and in CI logs)
    # standard error is captured, and the bar's redraws would fill it
    shown = spark.sparkContext.getConf().get("spark.ui.showConsoleProgress", "true")
    assert shown == ("true" if sys.stderr.isatty() else "false")


def test_local_session_starts_workers_on_the_python_its_conf_names(tmp_path):
    """pyspark reads only $PYSPARK_PYTHON for a session built from Python: local_session puts
    spark.pyspark.python there (a cluster whose nodes keep Python elsewhere names it so)."""
    python = tmp_path / "python-for-workers"
    python.symlink_to(sys.executable)
    script = textwrap.dedent(
        """
        import sys
        import blobhouse.spark as bs
        spark = bs.local_session("local[1]", conf={"spark.pyspark.python": sys.argv[1]})
        used = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable)
        print(used.collect()[0])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(python)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(python)
