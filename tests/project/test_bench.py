"""The benchmark suite runs end to end at its quick size, and its numbers hold together."""

from __future__ import annotations

import json

import pytest

# the smoke run (300 s) runs the Spark and object-storage cases in child processes
pytestmark = [pytest.mark.spark, pytest.mark.object_store, pytest.mark.slow]


def test_quick_benchmark_run(quick_bench_results):
    """The run started in the background when the suite was collected (tests/conftest.py)."""
    results = {p.stem: json.loads(p.read_text()) for p in quick_bench_results.glob("*.json")}
    assert set(results) >= {
        "run",
        "machine",
        "storage",
        "write_throughput",
        "random_access",
        "scale",
        "versions",
        "spark",
        "demo_read",
        "maintenance",
        "global_dedup",
        "space_back",
        "concurrent_writers",
        "index_shards",
        "object_storage",
        "mutations",
        "loader",
        "startup",
        "small_blobs",
        "first_call",
        "tiny_rows",
        "checked_loader",
        "robot_video",
        "lerobot_dropin",  # rows only where LeRobot is installed (bench/lerobot_env)
    }
    first = {
        (r["moment"], r["fragments"] > 1, r["contender"]) for r in results["first_call"]["rows"]
    }
    assert {m for m, _, _ in first} == {"fresh process", "new version"} and len(first) == 8
    tiny = {(r["phase"], r["contender"]): r for r in results["tiny_rows"]["rows"]}
    assert len(tiny) == 9 and all(r["seconds"] > 0 for r in tiny.values())
    assert tiny[("first 30 reads", "pylance take, large_binary column")]["vs_pylance"] == 1
    demo = {r["contender"]: r for r in results["demo_read"]["rows"]}
    assert {"demo read-back", "plain read"} < set(demo) and demo["plain read"]["vs_plain_read"] == 1
    shards = {r["step"] for r in results["index_shards"]["rows"]}  # the lookups checked theirs
    assert {"move", "maintain", "lookup found (level 1)", "one shard's maintenance"} <= shards
    robot = results["robot_video"]["rows"]
    stored = next(r for r in robot if r["metric"] == "bytes")
    assert stored["video_bytes"] < stored["table_bytes"] and stored["frames"] == 180
    assert next(r for r in robot if r["metric"] == "frames_equal_to_source")["equal"] is True
    rates = {(r["order"], r["workers"]): r["blobhouse"] for r in robot if "order" in r}
    assert set(rates) == {(o, w) for o in ("chunk_windows", "random") for w in (0, 2)}
    assert all(rate > 0 for rate in rates.values())
    storage = results["storage"]["rows"]
    seed = {r["contender"]: r for r in storage if r["workload"].startswith("seed")}
    assert seed["blobhouse ref_id"]["ratio_to_unique"] <= 1.05
    assert seed["pylance"]["ratio_to_unique"] >= 19  # one copy per row
    # a plain large_binary column shares a value within a page only (dictionary encoding)
    assert seed["pylance large_binary, batches of 1024"]["ratio_to_unique"] <= 1.05
    assert seed["pylance large_binary, batches of 8"]["ratio_to_unique"] >= 2.5
    writes = results["write_throughput"]["rows"]
    dup = {r["contender"]: r for r in writes if r["workload"].startswith("20x")}
    assert dup["blobhouse"]["physical_mb_s"] < dup["blobhouse"]["logical_mb_s"] / 10
    limit = dup["blake3, all cores (the limit)"]  # the duplicates target's yardstick
    assert limit["logical_mb_s"] > 0 and limit["physical_mb_s"] == "-"  # it writes nothing
    # a plain large_binary column stores a duplicate once per page: each batch of 8 rows
    # holds at most 8 copies of a payload, so it writes several times blobhouse's bytes
    assert dup["pylance large_binary, batches of 8"]["bytes"] > 2 * dup["blobhouse"]["bytes"]
    assert dup["lancedb large_binary"]["bytes"] >= dup["blobhouse"]["bytes"] * 0.9  # it wrote
    contenders = {r["contender"] for r in results["random_access"]["rows"]}
    assert contenders == {
        "blobhouse refs + ranged reads",
        "blobhouse read_blobs",
        'blobhouse take blobs="bytes"',
        "pylance read_blobs",
        "pylance take, large_binary column",
        "lancedb take_offsets, large_binary",
        "parquet row groups",
    }
    assert all(r["seconds"] > 0 for r in results["random_access"]["rows"])
    compacted = {
        r["contender"]: r for r in results["maintenance"]["rows"] if r["operation"] == "compact"
    }
    assert compacted["blobhouse compact"]["ratio_to_unique"] <= 1.05
    space = {(r["deletion"], r["contender"]): r for r in results["space_back"]["rows"]}
    # every pattern of deletes gives the space back within the budget, each live byte
    # rewritten at most once, a spread 2% left alone
    assert all(r["ratio_to_live"] <= 1.05 for (_, c), r in space.items() if c == "blobhouse")
    assert all(
        0 <= r["rewritten_to_live"] <= 1.0 for (_, c), r in space.items() if c == "blobhouse"
    )
    assert space[("2% spread", "blobhouse")]["rewritten_to_live"] == 0
    # writers racing on every store: what the race stored twice is merged (the quick run's
    # payloads are small: the table's own files are a few percent of it)
    raced = results["concurrent_writers"]["rows"]
    assert {r["store"] for r in raced} >= {"local", "s3"}
    for r in raced:
        if r["contender"] == "blobhouse":
            assert r["ratio_after_compaction"] <= 1.1, r
        else:  # a copy per writer, whatever compaction does
            assert r["ratio_after_compaction"] >= 0.95 * r["writers"], r
    assert compacted["pylance compact_files"]["ratio_to_unique"] > 1.5  # a copy per row
    stored = {r["contender"]: r for r in results["global_dedup"]["rows"]}
    assert stored["blobhouse global"]["ratio_to_unique"] <= 1.05
    assert stored["blobhouse per file"]["ratio_to_unique"] > 2  # one copy per append
    s3 = {r["contender"]: r for r in results["object_storage"]["rows"] if r["operation"] != "write"}
    ranged = s3["blobhouse refs + ranged reads, s3"]
    assert ranged["requests"] == {"GET": ranged["coalesced_reads"]}  # one GET per coalesced range
    rows_read = int(ranged["operation"].split()[1])
    assert ranged["bytes_read"] == rows_read * 1024 * 1024  # only the rows' bytes
    writes = [r for r in results["object_storage"]["rows"] if r["operation"] == "write"]
    assert all(r["requests"].get("PUT", 0) > 0 for r in writes if r["contender"].endswith("s3"))
    # the natural df.write: each payload once, its requests against Arrow's Parquet writer's
    spark_writes = [r for r in results["object_storage"]["rows"] if r["operation"] == "df.write"]
    ours = [r for r in spark_writes if r["contender"].startswith("blobhouse")]
    assert len(ours) == 2 and all(r["stored_vs_unique"] <= 1.05 for r in ours)
    assert all(0 < r["payload_uploads"] < sum(r["requests"].values()) for r in ours)
    assert all(r["vs_parquet"] > 0 for r in ours) and len(spark_writes) == 4
    spark = results["spark"]["rows"][0]
    assert spark["read_blob_mb_s"] > 0 and spark["write_ratio"] > 0
    assert spark["scan_vs_floor"] > 0 and spark["read_blob_vs_floor"] > 0  # the targets' floors
    for name in ("read_blob", "materialize", "scan"):  # the hash check, with and without
        assert spark[f"{name}_checked_vs_unchecked"] > 0
    # where a write's time goes: the rows reach Python, then blake3; and the workers' memory
    assert (
        spark["write_shared_python_floor_s"] > 0 and spark["write_shared_python_floor_hash_s"] > 0
    )
    # a quick run's tasks are small enough to add nothing measurable
    assert 0 <= spark["write_shared_worker_added_mb"] <= spark["write_shared_worker_peak_rss_mb"]
    assert spark["write_shared_worker_peak_rss_mb"] > 0
    mutated = results["mutations"]["rows"]
    assert all(r["seconds"] > 0 for r in mutated)
    relabels = [r for r in mutated if r["operation"].startswith("update")]
    small = [r for r in relabels if r["rows_per_fragment"] < 10_000]  # 4 small fragments
    mine = [r["growth"] for r in small if r["contender"] == "blobhouse"]
    assert mine and all(g < 100 * 1024 for g in mine)  # the label column only: no payload
    copied = [r["growth"] for r in small if r["contender"] == "pylance" and r["dedup"] == "content"]
    assert min(copied) > 100 * max(mine)  # pylance writes the changed rows' payloads again
    one = [r for r in relabels if r["rows_per_fragment"] >= 100_000]  # one fragment
    assert {(r["operation"], r["contender"]) for r in one} == {
        ("update label, 10% of rows", "blobhouse"),
        ("update label, 10% of rows", "pylance"),
        ("update label, 100% of rows", "blobhouse"),  # pylance's: every payload again, left out
    }
    for r in one:
        if r["contender"] == "blobhouse":  # a page of 100K+ labels compresses: < the column
            assert 0 < r["growth_vs_reference"] < 1 and r["target"].endswith("(met)")
        else:  # a 10-20 KB payload again for each of the 10% of the rows
            assert r["growth"] > r["rows_per_fragment"] // 10 * 10 * 1024
    (upsert,) = [
        r
        for r in mutated
        if r["operation"].startswith("upsert")
        and r["dedup"] == "global"
        and r["contender"] == "blobhouse"
    ]
    assert upsert["growth_vs_reference"] <= 1.05  # only the new payloads are stored
    for mode in ("store", "store found"):  # appends of new payloads, and of found ones
        store = {
            r["store_payloads"]: r for r in results["store_scale"]["rows"] if r["mode"] == mode
        }
        assert store[0]["vs_empty_store"] == 1 and all(r["seconds"] > 0 for r in store.values())
    loader = results["loader"]["rows"]
    contenders = {"blobhouse", "pylance read_blobs", "parquet", "webdataset"}
    epochs = [r for r in loader if r["contender"] in contenders]
    delivered = {(r["workload"].split(":")[0], r["contender"], r["workers"]) for r in epochs}
    limit = {r["contender"] for r in loader if r["contender"].startswith("random-read limit")}
    assert delivered == {(w, c, n) for w in ("images", "clips") for c in contenders for n in (0, 2)}
    assert len(limit) == 3 and all(r["seconds"] > 0 for r in loader)
    clips = {(r["contender"], r["workers"]): r for r in epochs if r["workload"].startswith("clips")}
    unique_mb = float(epochs[-1]["workload"].split(", ")[1].split()[0])
    for (contender, _), r in clips.items():  # every clip once in blobhouse, once a row elsewhere
        if contender == "blobhouse":
            assert r["on_disk_mb"] < 2 * unique_mb + 1 and isinstance(r["vs_best_other"], float)
        else:
            assert r["on_disk_mb"] > 20 * unique_mb
    images = [r for r in epochs if r["workload"].startswith("images")]
    assert all(r["vs_limit"] > 0 for r in images if r["contender"] == "blobhouse")
    # the first batch (the DataLoader starting its workers) and the rate after it
    assert all(r["first_batch_s"] > 0 and r["after_first_batch_vs_limit"] > 0 for r in images)
    firsts = [r for r in loader if r["workload"].startswith("first batch")]
    assert [r["contender"] for r in firsts] == ["blobhouse BatchLoader", "blobhouse DataLoader"]
    started = {r["contender"]: r["seconds"] for r in results["startup"]["rows"]}
    lance_s = started.pop("python -c 'import lance'")
    assert started["blobhouse --help"] < lance_s  # help never loads Lance
    # a command does load Lance, so the yardstick is fair; against --help, since a median of a
    # quick run's few starts of `stats` (import lance + ~0.3 s) fell below import lance's on CI
    assert started["blobhouse stats"] > started["blobhouse --help"] + 0.3 * lance_s
    small = results["small_blobs"]["rows"]
    assert {(r["k"], r["contender"]) for r in small} == {
        (k, c)
        for k in (1, 64, 1000)
        for c in (
            "blobhouse read_blobs",
            'blobhouse take, blobs="bytes"',
            "pylance take, large_binary column",
            "pylance read_blobs, blob column",
            "lancedb take_offsets, large_binary",
        )
    }
    assert all(r["seconds"] > 0 and r["vs_large_binary"] > 0 for r in small)
    checked = {r["contender"]: r for r in results["checked_loader"]["rows"]}
    assert set(checked) == {
        "blobhouse BatchLoader, checked",
        "blobhouse BatchLoader, unchecked",
        "pylance read_blobs loop",
    }
    assert all(r["seconds"] > 0 for r in checked.values())
