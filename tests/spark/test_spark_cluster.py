"""The main job, the table services and the mutations on a real standalone Spark cluster on
127.0.0.1 (a master and two worker processes, started and stopped here), from relative table
paths: each executor runs in a working directory of its own, so a path resolved anywhere but on
the driver names nothing there."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from blobhouse import open_table
from blobhouse.testing import LocalSparkCluster, _alive_workers
from tests.helpers import stock_read

# a standalone master and workers (190 s), the jobs in child processes
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow]

SERVICES = """
import contextlib, io, json, os, sys
from datetime import timedelta
import blobhouse.spark as bs
from blobhouse import open_table
from blobhouse.cli import main as blobhouse

# the main job as a user starts it (`blobhouse demo --master spark://...`), in this process: the
# services below run in the Spark application it started (one start of the executors)
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = blobhouse(["demo", "--json", "--master", sys.argv[1], "--conf",
                      "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m",
                      "--rows", "90", "--out", "rel/episodes"])
demo = json.loads(out.getvalue())
assert code == 0, code
spark = bs.local_session(sys.argv[1])
assert spark.sparkContext.master == sys.argv[1]
bs.register(spark)
table = "rel/episodes"  # relative: resolved on the driver, never on an executor
frames = spark.read.format("blobhouse").load(table)  # pinned to the version it found
rows = frames.count()
first = frames.where("frame % 30 = 0").select("row", "video")
videos = bs.materialize(first, ["video"]).collect()
clips = spark.createDataFrame([(i, b"clip-%d" % (i % 3) * 40_000) for i in range(12)],
                              "id long, clip binary")
bs.write_table(clips, "rel/clips", blob_columns=["clip"], dedup="global", partitions=3)
bs.backfill_blob_column(spark, "rel/clips", "preview", lambda b: [b"p%d" % i for i in b["id"]])
clip_bytes = open_table("rel/clips").stats()["columns"]["clip"]["physical_bytes"]
relabel = lambda b: [b"new-%d" % i * 1000 for i in b["id"].to_pylist()]
bs.update(spark, "rel/clips", {"clip": relabel}, where="id >= 10", dedup="global")
source = spark.createDataFrame([(4, b"clip-1" * 40_000, b"q4"), (99, b"z" * 5000, b"q99")],
                               "id long, clip binary, preview binary")
merged = bs.merge_insert(source, "rel/clips", on="id", dedup="global")
os.makedirs("media", exist_ok=True)
for i in range(3):
    with open(f"media/{i}.bin", "wb") as f:
        f.write(b"media-%d" % i * 1000)
with open("media/manifest.jsonl", "w") as f:  # file paths relative to the manifest
    f.writelines(json.dumps({"id": i, "file": f"{i % 3}.bin"}) + chr(10) for i in range(6))
from blobhouse.spark.ingest import ingest
ingest(spark, "media/manifest.jsonl", "rel/ingested", ["file"])
# the natural write: each chunk in every task of the write (round-robin), stored once
chunks = spark.createDataFrame([(i, b"chunk-%d" % (i % 4) * 50_000) for i in range(48)],
                               "id long, chunk binary").repartition(4)
chunks.write.format("blobhouse").mode("append").option("blob_columns", "chunk").save("rel/shared")
chunks.write.format("blobhouse").mode("append").save("rel/shared")  # again: nothing new
import blobhouse.store.index_maintenance as upkeep
upkeep.SHARDS, upkeep.SHARD_AFTER = 4, 0  # level 1 at gc's first run (a small store)
sharded = bs.gc(spark, "rel/shared", grace=timedelta(hours=1))  # each shard in a task
chunks.write.format("blobhouse").mode("append").save("rel/shared")  # found in the shards
shards_verified = bs.verify(spark, "rel/shared", deep=True)
from blobhouse.lerobot.sample import write_sample_dataset
write_sample_dataset("robot_ds", episodes=3, frames=20, size=(24, 32), episodes_per_file=2)
robot = bs.ingest_lerobot(spark, "robot_ds", "rel/robot")  # video files, then frames, in tasks
open_table(table).delete("frame % 2 = 1")
compacted = bs.compact(spark, table)
verified = bs.verify(spark, table, deep=True)
collected = bs.gc(spark, table, retain_versions=1, grace=timedelta(0))
print(json.dumps({
    "demo": [demo["rows"], demo["verified_blobs"], demo["mismatches"]],
    "rows": rows,
    "first_frames": len(videos),
    "video_bytes": sum(len(r.video) for r in videos),
    "clips": clip_bytes,
    "clips_after_mutations": open_table("rel/clips").stats()["columns"]["clip"]["physical_bytes"],
    "merged": [merged.num_updated_rows, merged.num_inserted_rows],
    "mutated": {r["id"]: [r["clip"][:6].decode(), r["preview"].decode()] for r in
                open_table("rel/clips").to_arrow(filter="id in (4, 10, 99)", blobs="bytes")
                .to_pylist()},
    "previews": open_table("rel/clips").to_arrow(["preview"], filter="id = 4", blobs="bytes")[
        "preview"].to_pylist(),
    "ingested": open_table("rel/ingested").stats()["columns"]["file"]["physical_bytes"],
    "robot": [robot.frames, robot.video_files, open_table("rel/robot").count_rows(),
              open_table("rel/robot").stats()["physical_bytes"],
              sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk("robot_ds/videos")
                  for f in fs)],
    "shared": [open_table("rel/shared").count_rows(),
               open_table("rel/shared").stats()["physical_bytes"]],
    "shards": [sharded["store_index_unreadable"], shards_verified["problems"],
               sorted(os.listdir("rel/shared/_blobs/index-shards"))],
    "compacted": compacted["fragments_removed"],
    "problems": verified["problems"],
    "hashed": verified["hashed"],
    "gc_versions": collected["retained_versions"],
}, default=repr))
"""


def test_main_job_and_services_on_a_standalone_cluster(tmp_path: Path):
    with LocalSparkCluster(workers=2) as cluster:
        services = subprocess.run(
            [sys.executable, "-c", SERVICES, cluster.master],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert services.returncode == 0, services.stderr[-3000:]
        assert not list(cluster.work_dir.rglob("episodes"))  # nothing landed in an executor's dir
    assert not cluster.work_dir.exists()  # a cluster that stopped cleanly leaves nothing behind
    done = json.loads(services.stdout.strip().splitlines()[-1])
    assert done["demo"] == [90, 270, 0]  # rows, blobs read back and checked, mismatches
    assert (done["rows"], done["first_frames"]) == (90, 3)
    assert done["clips"] == 3 * 40_000 * len(b"clip-0")  # three distinct clips, once each
    assert done["previews"] == [repr(b"q4")]  # the merge updated row 4
    # the update stored two new payloads, the merge one: the matched row's payload was found
    assert done["clips_after_mutations"] == done["clips"] + 2 * 6000 + 5000
    assert done["merged"] == [1, 1]
    assert done["mutated"] == {
        "4": ["clip-1", "q4"],
        "10": ["new-10", "p10"],
        "99": ["zzzzzz", "q99"],
    }
    assert done["ingested"] == 3 * len(b"media-0") * 1000  # three files, each stored once
    # tasks claimed the chunks; the third write found them in the index's shards
    assert done["shared"] == [144, 4 * len(b"chunk-0") * 50_000]
    assert done["shards"] == [None, [], ["00", "01", "02", "03", "_filters"]]
    frames, files, rows, stored, video_bytes = done["robot"]
    assert (frames, files, rows) == (60, 2, 60) and stored == video_bytes  # each file once
    assert done["compacted"] >= 1 and done["problems"] == [] and done["hashed"] > 0
    assert len(done["gc_versions"]) == 1
    table = tmp_path / "rel" / "episodes"
    assert open_table(str(table)).count_rows() == 45
    rows = open_table(str(table)).to_arrow(columns=["row"])["row"].to_pylist()
    assert all(r % 2 == 0 for r in rows) and len(stock_read(str(table), "video")) == 45


def test_a_master_whose_status_page_answers_empty_is_still_starting():
    """A starting master's web UI can answer with an empty page: waiting goes on (it once
    failed the cluster's start with a JSONDecodeError)."""
    pages = iter([b"", b"{not json", b'{"aliveworkers": 2}'])

    class Status(BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(pages)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Status) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/json/"
        assert [_alive_workers(url) for _ in range(3)] == [None, None, 2]
        server.shutdown()
    assert _alive_workers(url) is None  # nothing listens any more
