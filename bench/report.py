"""BENCHMARKS.md, the chart and README.md's performance headline, from the JSON results of a
full run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

DEFAULT_FRAGMENT_ROWS = 1_000_000  # Lance's default fragment size, as the mutations case writes it

TARGETS = (
    "| target | result |\n"
    "| --- | --- |\n"
    "| physical bytes <= 1.05 x unique when duplicates share a data file | {storage} |\n"
    "| write, unique 4 KB-10 MB payloads >= 1.0 x pylance, default dedup (page cache) "
    "| {write_unique} |\n"
    '| write, unique 10 KB-10 MB payloads >= 1.0 x pylance, dedup="off" (page cache) '
    "| {write_unique_off} |\n"
    "| write, default dedup (global) >= 0.8 x per-file dedup (content), unique 4 KB-10 MB "
    "and 20x duplicates (page cache) | {write_default_vs_file} |\n"
    "| write, 20x duplicated 1 MB: logical MB/s >= 0.8 x blake3 on all cores (same run) "
    "| {write_dup_hash} |\n"
    "| write, 20x duplicates >= 5 x pylance (page cache) | {write_dup} |\n"
    "| write, 20x duplicates >= 5 x pylance (durable: "
    "until os.sync returns) | {write_dup_durable} |\n"
    '| checked reads (read_blobs, blobs="bytes") >= 1.0 x pylance read_blobs '
    "at K = 1, 100, 1000 | {checked_reads} |\n"
    "| references + read_ranges >= 1.2 x pylance read_blobs | {access} |\n"
    "| random access, K = 1, 1 MB >= 10 x Parquet | {access_parquet} |\n"
    "| peak RSS flat (within 1.5x) from 1 GB to 8 GB written | {rss} |\n"
    "| after compaction, physical bytes <= 1.05 x unique live bytes | {compaction} |\n"
    '| dedup="global": bytes on disk <= 1.05 x unique across appends | {global_dedup} |\n'
    "| after deletes, compact + gc (latest version kept): bytes on disk <= 1.05 x unique live "
    "| {space_back} |\n"
    "| 2, 4 and 8 processes appending the same new payloads at once (local, S3, Azurite), and "
    "2 Spark applications on a standalone cluster: compact + gc <= 1.05 x unique | "
    "{concurrent_writers} |\n"
    '| dedup="global": append of 1,000 new payloads, and of 1,000 the store holds (each looked '
    "up and checked), to a 10 M-payload store <= 1.5 x to an empty store, in Python (writer "
    "peak RSS < 1 GB) and through blobhouse.spark.write_table | {store_scale} |\n"
    "| S3: one GET per coalesced range (requests the server logged) | {s3_requests} |\n"
    "| S3: a natural df.write of 1 MB payloads (unique; video chunks shared by 30 frames across "
    "tasks): requests besides the payload uploads within 2 x Arrow's Parquet writer's (a file "
    "per task) | {s3_write_requests} |\n"
    "| S3: reads by reference >= 1.0 x pylance read_blobs on the same store | {s3_access} |\n"
    "| Azure (Azurite): one GET per coalesced range | {azure_requests} |\n"
    "| Azure (Azurite): reads by reference >= 1.0 x pylance read_blobs on the same store "
    "| {azure_access} |\n"
    "| update of a plain column, 1,250-row fragments: "
    "growth after gc < the rewritten column's bytes | {update_growth} |\n"
    "| update of a plain column at Lance's default fragment size (1M rows): "
    "growth after gc < the column's bytes | {update_growth_default} |\n"
    '| upsert, dedup="global": '
    "growth after gc <= 1.05 x the new unique payloads | {upsert_growth} |\n"
    "| Spark: reference scan >= 0.95 x the Python data source floor | {spark_scan} |\n"
    "| Spark: read_blob and materialize >= 1.5 GB/s on local[2] | {spark_bytes} |\n"
    "| Spark: read_blob and materialize >= 0.95 x Spark's own floor (an Arrow UDF / mapInArrow "
    "moving the same bytes without I/O) | {spark_bytes_floor} |\n"
    "| Spark: df.write of blob data >= 1.0 x df.write.parquet of the same rows (unique, dedup "
    "off; shared chunks, default dedup) | {spark_write} |\n"
    "| Spark: a short query (a sum over every row, no bytes) within 2 x Parquet's "
    "| {spark_short} |\n"
    "| Spark: a count within 2 x Parquet's df.count(), through bs.count_rows (the documented "
    "fast path: pyspark gives a Python data source no aggregate pushdown) | {spark_count} |\n"
    "| Spark: natural df.write, video chunks repeating across tasks: bytes <= 1.05 x unique "
    "(and seconds against df.write.parquet) | {spark_shared} |\n"
    "| the demo's read-back (every payload read on local[2] and checked against what was "
    "generated) >= 0.8 x one thread's plain read of the table's files, both from the disk "
    "| {demo_read} |\n"
    "| loader, 100 KB images, cold: MB/s >= 0.8 x the random-read limit (0, 2, 4 workers) "
    "| {loader_images} |\n"
    "| loader, 1-4 MB clips each in 30 rows, cold: >= 1.5 x the best contender "
    "(0, 2, 4 workers) | {loader_clips} |\n"
    "| loader, first batch of a 1 M-row table < 1 s | {loader_startup} |\n"
    "| loader with its hash check >= 1.0 x a pylance read_blobs loop over the same batches, "
    "batches of 16-256, with and without an id column, the loader made once or per epoch "
    "(warm, 0 workers; cold with workers: the loader rows above) | {checked_loader} |\n"
    "| small blobs (5-64 KB) by row, K = 1, 64, 1000: read_blobs >= 1.0 x pylance take of a "
    "plain large_binary column (in the process that wrote the tables) | {small_blobs} |\n"
    "| small blobs, the first read (64 random 5-64 KB rows) of a fresh process and of the new "
    "version an append returns, in one fragment and in fragments of 10 rows: read_blobs >= "
    "1.0 x pylance's take of a plain large_binary column | {first_call} |\n"
    "| small rows (100 B) in files of Lance's default 1 Mi rows, 64 random rows a read, checked: "
    "read_blobs >= 1.0 x pylance's take of a plain large_binary column, over a fresh process's "
    "first reads and in its steady state | {tiny_rows} |\n"
    "| CLI: --help and an argument error < 0.3 s; a command on a small table <= import lance "
    "+ 0.3 s | {cli_startup} |\n"
    "| robot video (LeRobot datasets, 2 cameras: 240 x 320 AV1, and a small 48 x 64 H.264 one): "
    "table bytes on disk <= 1.05 x the dataset's | {robot_bytes} |\n"
    "| robot video, batches of 64 from chunk windows: frames/s >= 3 x LeRobot's LeRobotDataset "
    "(0, 2, 4 workers) | {robot_windows} |\n"
    "| robot video, fully random batches of 64: frames/s >= 1.0 x LeRobot's (0, 2, 4 workers) "
    "| {robot_random} |\n"
    "| robot video: decoded frames equal to LeRobot's, pixel for pixel | {robot_equal} |\n"
    "| LeRobot drop-in: blobhouse.lerobot.LeRobotDataset's items equal LeRobot's (with and "
    "without delta_timestamps, a subset of episodes), an export loaded by LeRobot, and "
    "LeRobot's ACT training steps and its lerobot-train command give the same losses "
    "| {dropin_equal} |\n"
    "| LeRobot drop-in with delta_timestamps (2 frames per camera, 2 states, 16 actions): "
    "items/s >= 2 x LeRobot's (chunk windows and random, 0, 2, 4 workers) | {dropin_deltas} |\n"
    "| LeRobot drop-in: the first batch with 2 workers, in a fresh process, within 1.5 x "
    "LeRobot's | {dropin_first} |\n"
    "{growth}"
)
# the heading bench/findings.md opens with, as a link inside BENCHMARKS.md
NOTES_ANCHOR = "#where-a-target-is-missed-and-why-profiled"
# README.md's performance headline: a few rows of TARGETS in README's words, each showing the
# verdicts of the TARGETS keys after it; written between the two markers by write_report
README_HEADLINE = (
    ("physical bytes <= 1.05 x unique when duplicates share a data file", ("storage",)),
    ('dedup="global": bytes on disk <= 1.05 x unique across appends', ("global_dedup",)),
    ("write, 20x duplicates >= 5 x pylance (page cache)", ("write_dup",)),
    (
        "write, unique 4 KB-10 MB payloads >= 1.0 x pylance, default dedup (page cache)",
        ("write_unique",),
    ),
    ("references + read_ranges >= 1.2 x pylance read_blobs", ("access",)),
    (
        "LeRobot dataset, decoded frames in batches of 64 from chunk windows >= 3 x LeRobot's "
        "own `LeRobotDataset` (0, 2, 4 workers)",
        ("robot_windows",),
    ),
    (
        "LeRobot dataset, fully random batches >= 1.0 x LeRobot; frames equal to LeRobot's",
        ("robot_random", "robot_equal"),
    ),
)
README_START = "<!-- performance: generated by bench/report.py -->"
README_END = "<!-- /performance -->"
GROWTH_LIMIT = 1.5  # a growth curve is flat when the largest point is within 1.5x the smallest
# the services' target spans 10 to 2,000 versions (issue 61); points past it are reported beside
VERSIONS_TARGET_UP_TO = 2000
# the growth curves of the scale case (mode, operation) and of the store (the store_scale
# case), as the targets and the chart name them
GROWTH_CURVES = {
    ("rows", "write"): "write, small rows",
    ("gb", "write"): "write, unique 1 MB payloads (GB)",
    ("dup_gb", "write"): "write, 1 MB payloads x32 (logical GB)",
    ("store", "append"): "append to a global-dedup store (payloads in the store)",
    ("versions", "stats"): "stats",
    ("versions", "verify"): "verify",
    ("versions", "verify deep"): "verify deep",
    ("versions", "gc"): "gc",
    ("versions", "compact"): "compact",
}


def write_report(results: Path, target: Path, readme: Path | None = None) -> None:
    """Write ``target`` (BENCHMARKS.md: the machine, the targets, each case's table, then
    bench/findings.md, the gaps explained) and ``results/chart.png``, and rewrite the
    performance headline of ``readme`` (README.md, :func:`readme_headline`) if given."""
    run, data = load_results(results)
    lines = [
        "# Benchmarks",
        "",
        "Every contender runs on the same data in the same process run; times are medians of "
        f"{5} runs after a warm-up, contenders alternating inside each round. Regenerate with "
        "`bin/bench` (roughly 15-20 minutes on 2 cores; `bin/bench --quick` is the CI smoke run).",
        "",
        f"Machine: {run.get('cpus')} cores, {run.get('memory_gb')} GiB, Python "
        f"{run.get('python')}, {run.get('platform')}.",
        "",
        "![ratios](bench/results/chart.png)",
        "",
        "## Targets",
        "",
        TARGETS.format(**_verdicts(data)),
    ]
    findings = Path(__file__).with_name("findings.md")
    if findings.exists():  # the notes come after every table: a reader meets the figures first
        lines += [
            "Why a target is missed, where the time goes, and what moves between runs: "
            f"[the notes]({NOTES_ANCHOR}) after the per-case tables.",
            "",
        ]
    for name, case in data.items():
        lines += [f"## {name}", "", case["description"], "", *_table(case["rows"]), ""]
        lines += [f"- {note}" for note in case.get("notes", [])]
        lines.append("")
    if findings.exists():
        lines += [findings.read_text(), ""]
    target.write_text("\n".join(lines))
    _chart(data, results / "chart.png")
    if readme is not None:
        write_readme_headline(results, readme)


def load_results(results: Path) -> tuple[dict, dict[str, dict]]:
    """The run's machine (``run.json``) and each case's results by name."""
    data = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    return data.pop("run", {}), data


def readme_headline(results: Path) -> str:
    """README.md's performance headline (:data:`README_HEADLINE`) from the results, between
    the markers: the targets README names, with the verdicts of BENCHMARKS.md's table and a
    link to the notes where one is missed."""
    run, data = load_results(results)
    verdicts = _verdicts(data)
    why = f"(missed, [why](BENCHMARKS.md{NOTES_ANCHOR})"
    lines = [
        README_START,
        f"The headline of the recorded run on a {run.get('cpus')}-core machine (all targets, "
        "met and missed, with the",
        "reasons: [BENCHMARKS.md](BENCHMARKS.md)):",
        "",
        "| target | result |",
        "| --- | --- |",
    ]
    for target, keys in README_HEADLINE:
        result = "; ".join(verdicts[k].replace("(missed", why, 1) for k in keys)
        lines.append(f"| {target} | {result} |")
    return "\n".join([*lines, README_END])


def write_readme_headline(results: Path, readme: Path) -> None:
    """Rewrite the performance headline of ``readme`` from ``results`` (``python -m
    bench.report``: README.md's, from bench/results, without running a benchmark)."""
    readme.write_text(with_headline(readme.read_text(), readme_headline(results)))


def with_headline(readme: str, headline: str) -> str:
    """``readme`` with the text between its performance markers (them included) replaced by
    ``headline``."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start or readme.count(README_START) != 1:
        raise ValueError(f"README needs one {README_START} ... {README_END} block")
    return readme[:start] + headline + readme[end + len(README_END) :]


def _table(rows: list[dict]) -> list[str]:
    """The rows as tables: one per run of rows with the same fields (a case may record
    several kinds of rows)."""
    if not rows:
        return ["(no rows)"]
    out: list[str] = []
    for keys, run in itertools.groupby(rows, key=lambda r: tuple(r)):
        if out:
            out.append("")
        out += ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        out += ["| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in run]
    return out


def _cell(value) -> str:
    if isinstance(value, dict):  # request counts by method
        return ", ".join(f"{n} {k}" for k, n in value.items()) or "-"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def _verdicts(data: dict) -> dict[str, str]:
    def rows(case: str, **match) -> list[dict]:
        return [
            r
            for r in data.get(case, {}).get("rows", [])
            if all(r.get(k) == v for k, v in match.items())
        ]

    storage = [
        r["ratio_to_unique"]
        for r in rows("storage")
        if r["contender"].startswith("blob") and "unique 1 MB" not in r["workload"]
    ]

    def unique(contender: str, smallest_kb: int = 10) -> list[float]:
        """The target's range: ``smallest_kb`` (the default mode's: 4) to 10 MB."""
        return [
            r["vs_pylance"]
            for r in rows("write_throughput", contender=contender, durable=False)
            if r["workload"].startswith("unique ") and int(r["workload"].split()[1]) >= smallest_kb
        ]

    dup_page_cache = rows("write_throughput", workload="20x duplicated 1 MB", durable=False)
    limit = [r["logical_mb_s"] for r in dup_page_cache if r["contender"].startswith("blake3")]
    dup_hash = [
        round(r["logical_mb_s"] / limit[0], 3)
        for r in dup_page_cache
        if limit and r["contender"] == "blobhouse"
    ]
    dup = [
        r["vs_pylance"]
        for r in rows("write_throughput", contender="blobhouse", workload="20x duplicated 1 MB")
        if not r["durable"]
    ]
    dup_durable = [
        r["vs_pylance"]
        for r in rows("write_throughput", contender="blobhouse", workload="20x duplicated 1 MB")
        if r["durable"]
    ]
    access = [
        r["vs_pylance"] for r in rows("random_access", contender="blobhouse refs + ranged reads")
    ]
    checked_reads = [
        r["vs_pylance"]
        for contender in ("blobhouse read_blobs", 'blobhouse take blobs="bytes"')
        for r in rows("random_access", contender=contender)
    ]
    access_parquet = [
        r["vs_parquet"]
        for r in rows("random_access", k=1, contender="blobhouse refs + ranged reads")
    ]
    compaction = [r["ratio_to_unique"] for r in rows("maintenance", contender="blobhouse compact")]
    global_dedup = [
        r["ratio_to_unique"] for r in rows("global_dedup", contender="blobhouse global")
    ]
    space_back = [r["ratio_to_live"] for r in rows("space_back", contender="blobhouse")]
    concurrent = [
        r["ratio_after_compaction"] for r in rows("concurrent_writers", contender="blobhouse")
    ]
    ranged_s3 = rows("object_storage", contender="blobhouse refs + ranged reads, s3")
    s3_requests = [r["requests"].get("GET", 0) / r["coalesced_reads"] for r in ranged_s3]
    s3_access = [r["vs_pylance_same_store"] for r in ranged_s3]
    s3_writes = rows("object_storage", contender="blobhouse df.write, s3")
    ranged_azure = rows("object_storage", contender="blobhouse refs + ranged reads, azure")
    azure_requests = [r["requests"].get("GET", 0) / r["coalesced_reads"] for r in ranged_azure]
    azure_access = [r["vs_pylance_same_store"] for r in ranged_azure]
    updates = [
        r for r in rows("mutations", contender="blobhouse") if r["operation"].startswith("update")
    ]
    update_growth = [
        r["growth_vs_reference"]
        for r in updates
        if r.get("rows_per_fragment", 0) < DEFAULT_FRAGMENT_ROWS
    ]
    update_growth_default = [
        r["growth_vs_reference"]
        for r in updates
        if r.get("rows_per_fragment", 0) >= DEFAULT_FRAGMENT_ROWS
    ]
    upsert_growth = [
        r["growth_vs_reference"]
        for r in rows("mutations", contender="blobhouse", dedup="global")
        if r["operation"].startswith("upsert")
    ]
    store_scale = _store_scale(
        {what: rows("store_scale", mode=mode) for mode, what in _STORE_MODES.items()}
    )
    spark = rows("spark")
    loader = rows("loader", contender="blobhouse")
    gb = rows("scale", mode="gb")
    rss = gb[-1]["peak_rss_mb"] / gb[0]["peak_rss_mb"] if gb else None
    return {
        "storage": _range(storage, "x unique", lambda v: v <= 1.05),
        "write_unique": _range(unique("blobhouse", smallest_kb=4), "x pylance", lambda v: v >= 1.0),
        "write_unique_off": _range(unique("blobhouse, dedup off"), "x pylance", lambda v: v >= 1.0),
        "write_default_vs_file": _range(
            [
                r["vs_per_file"]
                for r in rows("write_throughput", contender="blobhouse", durable=False)
                if "vs_per_file" in r
            ],
            "x per-file",
            lambda v: v >= 0.8,
        ),
        "spark_shared": _spark_shared(spark),
        "write_dup_hash": _range(dup_hash, "x blake3", lambda v: v >= 0.8),
        "write_dup": _range(dup, "x pylance", lambda v: v >= 5),
        "write_dup_durable": _range(dup_durable, "x pylance", lambda v: v >= 5),
        "access": _range(access, "x pylance", lambda v: v >= 1.2),
        "checked_reads": _range(checked_reads, "x pylance", lambda v: v >= 1.0),
        "access_parquet": _range(access_parquet, "x parquet", lambda v: v >= 10),
        "compaction": _range(compaction, "x unique", lambda v: v <= 1.05),
        "global_dedup": _range(global_dedup, "x unique", lambda v: v <= 1.05),
        "space_back": _range(space_back, "x unique live", lambda v: v <= 1.05),
        "concurrent_writers": _range(concurrent, "x unique", lambda v: v <= 1.05),
        "s3_requests": _range(s3_requests, "GETs per coalesced range", lambda v: v == 1),
        "s3_access": _range(s3_access, "x pylance", lambda v: v >= 1.0),
        "s3_write_requests": _range(
            [r["vs_parquet"] for r in s3_writes], "x Parquet's", lambda v: v <= 2
        ),
        "azure_requests": _range(azure_requests, "GETs per coalesced range", lambda v: v == 1),
        "azure_access": _range(azure_access, "x pylance", lambda v: v >= 1.0),
        "update_growth": _range(update_growth, "x the column", lambda v: v < 1),
        "update_growth_default": _range(update_growth_default, "x the column", lambda v: v < 1),
        "upsert_growth": _range(upsert_growth, "x new unique", lambda v: v <= 1.05),
        "store_scale": store_scale,
        "rss": "-" if rss is None else f"{rss:.2f}x ({'met' if rss <= 1.5 else 'missed'})",
        "growth": "".join(_growth_targets(data)),
        "spark_scan": _range(
            [r["scan_vs_floor"] for r in spark if "scan_vs_floor" in r],
            "x the floor",
            lambda v: v >= 0.95,
        ),
        "spark_bytes": _spark_bytes(spark),
        "spark_bytes_floor": _range(
            [r[k] for r in spark for k in ("read_blob_vs_floor", "materialize_vs_floor") if k in r],
            "x the floor",
            lambda v: v >= 0.95,
        ),
        "spark_write": _range(
            [r[k] for r in spark for k in ("write_ratio", "write_shared_vs_parquet") if k in r],
            "x Parquet",
            lambda v: v >= 1.0,
        ),
        "spark_short": _range(
            [r["scan_ratio"] for r in spark if "scan_ratio" in r], "x Parquet", lambda v: v >= 0.5
        ),
        "spark_count": _spark_count(spark),
        "loader_images": _loader_images([r for r in loader if r["workload"].startswith("images")]),
        "loader_clips": _range(
            [r["vs_best_other"] for r in loader if r["workload"].startswith("clips")],
            "x the best contender",
            lambda v: v >= 1.5,
        ),
        "loader_startup": _loader_startup(rows("loader")),
        "cli_startup": _cli_startup(rows("startup")),
        "demo_read": _range(
            [r["vs_plain_read"] for r in rows("demo_read", contender="demo read-back")],
            "x a plain read",
            lambda v: v >= 0.8,
        ),
        "checked_loader": _range(
            [
                r["vs_pylance"]
                for r in rows("checked_loader", contender="blobhouse BatchLoader, checked")
            ],
            "x pylance",
            lambda v: v >= 1.0,
        ),
        "small_blobs": _small_blobs(rows("small_blobs")),
        "first_call": _first_call(rows("first_call", contender="blobhouse read_blobs")),
        "tiny_rows": _tiny_rows(rows("tiny_rows", contender="blobhouse read_blobs")),
        "robot_bytes": _range(
            [r["table_vs_dataset"] for r in rows("robot_video", metric="bytes")],
            "x the dataset",
            lambda v: v <= 1.05,
        ),
        "robot_windows": _range(
            [
                r["vs_lerobot"]
                for r in rows("robot_video", order="chunk_windows")
                if "vs_lerobot" in r
            ],
            "x LeRobot",
            lambda v: v >= 3.0,
        ),
        "robot_random": _range(
            [r["vs_lerobot"] for r in rows("robot_video", order="random") if "vs_lerobot" in r],
            "x LeRobot",
            lambda v: v >= 1.0,
        ),
        "robot_equal": _robot_equal(rows("robot_video", metric="frames_equal_to_lerobot")),
        "dropin_equal": _dropin_equal(rows("lerobot_dropin")),
        "dropin_deltas": _range(
            [
                r["vs_lerobot"]
                for r in rows("lerobot_dropin", metric="items_per_s_with_delta_timestamps")
            ],
            "x LeRobot",
            lambda v: v >= 2.0,
        ),
        "dropin_first": _range(
            [
                round(1 / r["vs_lerobot"], 3)
                for r in rows("lerobot_dropin", metric="first_batch_s_2_workers")
            ],
            "x LeRobot's seconds",
            lambda v: v <= 1.5,
        ),
    }


def _dropin_equal(rows: list[dict]) -> str:
    checks = [r for r in rows if "equal" in r]
    if not checks:
        return "-"
    equal = sum(bool(r["equal"]) for r in checks)
    met = equal == len(checks)
    return f"{equal} of {len(checks)} comparisons equal ({'met' if met else 'missed'})"


def _robot_equal(rows: list[dict]) -> str:
    if not rows:
        return "-"
    r = rows[0]
    met = r["equal"] == r["compared"]
    return f"{r['equal']} of {r['compared']} frames equal ({'met' if met else 'missed'})"


def _small_blobs(rows: list[dict]) -> str:
    """The verdict on read_blobs (a list of bytes), with take's Arrow array beside it."""
    verdict = _range(
        [r["vs_large_binary"] for r in rows if r["contender"] == "blobhouse read_blobs"],
        "x large_binary take",
        lambda v: v >= 1.0,
    )
    taken = [r["vs_large_binary"] for r in rows if r["contender"].startswith("blobhouse take")]
    if not taken:
        return verdict
    return f'{verdict}; take(blobs="bytes") {min(taken)} to {max(taken)} x'


def _tiny_rows(rows: list[dict]) -> str:
    """The verdict on the first reads together and the steady state, each named (the first
    read alone is the first_call row's)."""
    judged = [r for r in rows if r["phase"] != "first read"]
    if not judged:
        return "-"
    met = all(r["vs_pylance"] >= 1.0 for r in judged)
    each = "; ".join(f"{r['phase']}: {r['vs_pylance']}x" for r in judged)
    return f"{each} pylance ({'met' if met else 'missed'})"


def _first_call(rows: list[dict]) -> str:
    """The verdict on both first calls, each named: a fresh process's and a new version's, of
    one fragment and of many small ones."""
    if not rows:
        return "-"
    met = all(r["vs_pylance"] >= 1.0 for r in rows)
    layouts: dict[int, list[str]] = {}
    for r in rows:
        layouts.setdefault(r.get("fragments", 1), []).append(f"{r['moment']} {r['vs_pylance']}x")
    each = "; ".join(
        f"{fragments:,} fragment{'s' if fragments > 1 else ''}: {', '.join(moments)}"
        for fragments, moments in sorted(layouts.items())
    )
    return f"{each} pylance ({'met' if met else 'missed'})"


def _spark_shared(rows: list[dict]) -> str:
    """Bytes on disk of the natural df.write of shared chunks, and its time against Parquet's."""
    found = [r for r in rows if "shared_ratio_to_unique" in r]
    if not found:
        return "-"
    r = found[0]
    met = r["shared_ratio_to_unique"] <= 1.05
    return (
        f"{r['shared_ratio_to_unique']:.3f} x unique ({'met' if met else 'missed'}); "
        f"{r['write_shared_blobhouse_s']} s against Parquet's {r['write_shared_parquet_s']} s "
        f"({r['write_shared_vs_parquet']:.2f}x), writing {r['shared_bytes_on_disk'] / 1e6:.0f} "
        f"MB against {r['shared_parquet_bytes_on_disk'] / 1e6:.0f} MB"
        + (
            f"; handing the rows to Python workers alone takes "
            f"{r['write_shared_python_floor_s']} s, with blake3 of every value "
            f"{r['write_shared_python_floor_hash_s']} s; a task of "
            f"{r['write_shared_task_mb']:.0f} MB of rows adds at most "
            f"{r['write_shared_worker_added_mb']:.0f} MB to its Python worker (peak RSS "
            f"{r['write_shared_worker_peak_rss_mb']:.0f} MB)"
            if "write_shared_python_floor_s" in r
            else ""
        )
    )


def _loader_startup(rows: list[dict]) -> str:
    """Seconds to the first batch, met under 1 s on a table of at least 1 M rows."""
    firsts = [r for r in rows if r["workload"].startswith("first batch")]
    if not firsts:
        return "-"
    table_rows = int(firsts[0]["workload"].split(": ")[1].split()[0].replace(",", ""))
    met = table_rows >= 1_000_000 and all(r["seconds"] < 1 for r in firsts)
    times = ", ".join(f"{r['contender']} {r['seconds']} s" for r in firsts)
    return f"{times} at {table_rows:,} rows ({'met' if met else 'missed'})"


def _cli_startup(rows: list[dict]) -> str:
    """--help and an argument error under 0.3 s, commands within import lance + 0.3 s."""
    if not rows:
        return "-"
    quick = [r for r in rows if "--help" in r["contender"] or "argument" in r["contender"]]
    commands = [r for r in rows if r not in quick and "import lance" not in r["contender"]]
    met = all(r["seconds"] < 0.3 for r in quick)
    met = met and all(r["over_import_lance_s"] <= 0.3 for r in commands)
    shown = ", ".join(f"{r['contender']} {r['seconds']} s" for r in quick)
    over = ", ".join(f"{r['contender']} +{r['over_import_lance_s']} s" for r in commands)
    return f"{shown}; over import lance: {over} ({'met' if met else 'missed'})"


# the store_scale case's modes, as the target row names them
_STORE_MODES = {
    "store": "new",
    "store found": "found",
    "spark": "Spark new",
    "spark found": "Spark found",
}


def _store_scale(modes: dict[str, list[dict]]) -> str:
    """The appends to the biggest store against the empty one, and the writers' peak RSS
    (Python's; the Spark modes measure none)."""
    if not modes.get("new"):
        return "-"
    parts, met = [], True
    for what, rows in modes.items():
        if not rows:
            continue
        big = max(rows, key=lambda r: r["store_payloads"])
        met = met and big["store_payloads"] >= 10_000_000 and big["vs_empty_store"] <= 1.5
        peak = big["peak_rss_mb"]
        met = met and (peak is None or peak < 1024)
        rss = "" if peak is None else f", peak RSS {peak} MB"
        parts.append(f"{what} {big['vs_empty_store']}x at {big['store_payloads']:,} payloads{rss}")
    return f"{'; '.join(parts)} ({'met' if met else 'missed'})"


def scale_rows(data: dict) -> list[dict]:
    """The growth rows: the scale case's writes and the versions case's maintenance."""
    return [*data.get("scale", {}).get("rows", []), *data.get("versions", {}).get("rows", [])]


def growth_curves(data: dict) -> dict[tuple[str, str], list[dict]]:
    """blobhouse's growth curves by (mode, operation), each a list of points ``amount``,
    ``unit``, ``seconds_per_unit``, ``peak_rss_mb`` from the smallest to the largest:
    the scale case's, and the store_scale case's if it ran (the seconds of one append of the
    same payloads, whatever the store holds, are its seconds per unit)."""
    curves: dict[tuple[str, str], list[dict]] = {}
    for row in scale_rows(data):
        if row.get("contender", "blobhouse") == "blobhouse":
            key = (row["mode"], row.get("operation", "write"))
            curves.setdefault(key, []).append(row)
    store = [r for r in data.get("store_scale", {}).get("rows", []) if r["mode"] == "store"]
    if store:
        curves[("store", "append")] = [
            {
                "amount": r["store_payloads"],
                "unit": "append",
                "seconds_per_unit": r["seconds"],
                "peak_rss_mb": r.get("peak_rss_mb"),
            }
            for r in sorted(store, key=lambda r: r["store_payloads"])
        ]
    return curves


def _growth_targets(data: dict) -> list[str]:
    """One target row per growth curve: seconds per unit and peak RSS of the largest point
    against the smallest."""
    out = []
    for key, points in growth_curves(data).items():
        if key not in GROWTH_CURVES or len(points) < 2:
            continue
        name, beyond = GROWTH_CURVES[key], []
        if key[0] == "versions":
            name = f"{name}, fragments and versions"
            beyond = [p for p in points if p["amount"] > VERSIONS_TARGET_UP_TO]
            points = [p for p in points if p["amount"] <= VERSIONS_TARGET_UP_TO] or points
        first, last = points[0], points[-1]
        span = f"{_amount(first['amount'])} to {_amount(last['amount'])}"
        ratios = _growth(points)
        result = f"seconds per {first['unit']} {ratios[0]:.2f}x"
        if len(ratios) > 1:
            result += f", peak RSS {ratios[1]:.2f}x"
        met = all(r <= GROWTH_LIMIT for r in ratios)
        result += f" ({'met' if met else 'missed'})"
        for point in beyond:  # measured further: the same ratios, for the record
            further = _growth([*points, point])
            result += f"; at {_amount(point['amount'])}: {further[0]:.2f}x" + (
                f", peak RSS {further[1]:.2f}x" if len(further) > 1 else ""
            )
        out.append(
            f"| growth, {name} {span}: seconds per unit and peak RSS of the largest point "
            f"within {GROWTH_LIMIT}x the curve's lowest | {result} |\n"
        )
    return out


def _growth(points: list[dict]) -> list[float]:
    """Seconds per unit, and peak RSS where both ends have it, of the last of ``points``
    against the curve's lowest."""
    ratios = [_above_lowest(points, "seconds_per_unit")]
    if points[0].get("peak_rss_mb") and points[-1].get("peak_rss_mb"):
        ratios.append(_above_lowest(points, "peak_rss_mb"))
    return ratios


def _above_lowest(points: list[dict], key: str) -> float:
    """The largest point's ``key`` against the lowest of the curve: the smallest points carry
    fixed costs (a process start, a table open) that make them dearer per unit, which a ratio
    to the first point would count as the curve falling."""
    return points[-1][key] / min(p[key] for p in points if p.get(key))


def _amount(value: float) -> str:
    """10000 -> 10K, 1000000 -> 1M, 2.0 -> 2 (GB), 2000 -> 2,000."""
    for limit, suffix in ((1e6, "M"), (1e4, "K")):
        if value >= limit:
            return f"{value / (limit if suffix == 'M' else 1e3):g}{suffix}"
    return f"{value:,g}"


def _spark_count(rows: list[dict]) -> str:
    """The fast path's verdict (bs.count_rows against Parquet's df.count()), with the data
    source's own df.count() beside it (pyspark gives a Python source no aggregate pushdown)."""
    counted = [r for r in rows if "count_rows_ratio" in r]
    if not counted:
        return "-"
    verdict = _range([r["count_rows_ratio"] for r in counted], "x Parquet", lambda v: v >= 0.5)
    plain = ", ".join(f"{r['count_ratio']}x" for r in counted)
    return f"bs.count_rows {verdict}; the data source's df.count() {plain} Parquet's"


def _spark_bytes(rows: list[dict]) -> str:
    """read_blob and materialize MB/s against 1.5 GB/s, and against Spark's own floor (an Arrow
    UDF / mapInArrow returning a preallocated column of the same bytes, no I/O)."""
    verdicts = []
    for row in rows:
        for name in ("read_blob", "materialize"):
            if f"{name}_mb_s" not in row:
                continue
            mb_s, floor = row[f"{name}_mb_s"], row.get(f"{name}_floor_mb_s")
            text = f"{name} {mb_s:.0f} MB/s ({'met' if mb_s >= 1500 else 'missed'}"
            if floor is not None:
                text += f"; Spark's floor {floor:.0f} MB/s, {row[f'{name}_vs_floor']}x it"
            if f"{name}_checked_vs_unchecked" in row:  # the hash check's cost
                text += (
                    f"; unchecked {row[f'{name}_unchecked_mb_s']:.0f} MB/s, checked "
                    f"{row[f'{name}_checked_vs_unchecked']}x it"
                )
            verdicts.append(text + ")")
    return ", ".join(verdicts) or "-"


def _loader_images(rows: list[dict]) -> str:
    """The epochs against the limit, and, where a DataLoader's worker start-up is in them,
    the rate after each epoch's first batch."""
    epochs = _range([r["vs_limit"] for r in rows], "x the limit", lambda v: v >= 0.8)
    after = [r["after_first_batch_vs_limit"] for r in rows if "after_first_batch_vs_limit" in r]
    if not after:
        return epochs
    firsts = ", ".join(f"{r['first_batch_s']} s at {r['workers']}" for r in rows)
    return (
        f"{epochs}; after the first batch (the DataLoader starting its workers: {firsts} "
        f"workers) {min(after)} to {max(after)} x the limit"
    )


def _range(values: list[float], unit: str, ok) -> str:
    if not values:
        return "-"
    met = all(ok(v) for v in values)
    return f"{min(values)} to {max(values)} {unit} ({'met' if met else 'missed'})"


def _chart(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(15, 9.5))
    axes = grid[0]
    write = [
        r for r in data.get("write_throughput", {}).get("rows", []) if r["contender"] == "blobhouse"
    ]
    labels = [r["workload"] + (" (durable)" if r.get("durable") else "") for r in write]
    axes[0].barh(labels, [r["vs_pylance"] for r in write])
    axes[0].axvline(1.0, color="gray", linestyle="--")
    axes[0].set_title("write speed vs pylance (x)")
    access = [
        r
        for r in data.get("random_access", {}).get("rows", [])
        if r["contender"] == "blobhouse refs + ranged reads"
    ]
    axes[1].barh([f"K = {r['k']}" for r in access], [r["vs_pylance"] for r in access])
    axes[1].axvline(1.0, color="gray", linestyle="--")
    axes[1].set_title("random access vs pylance read_blobs (x)")
    storage = [
        r
        for r in data.get("storage", {}).get("rows", [])
        if r["contender"] in ("blobhouse content", "pylance", "parquet")
    ]
    labels = [f"{r['contender']}: {r['workload'][:28]}" for r in storage]
    axes[2].barh(labels, [r["ratio_to_unique"] for r in storage])
    axes[2].set_xscale("log")
    axes[2].set_title("bytes on disk / unique bytes (log)")
    _growth_panels(data, grid[1])
    for ax in grid.flat:
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _growth_panels(data: dict, axes) -> None:
    """The growth curves: writes' seconds per unit against their smallest point (both axes as
    growth factors, log-log: flat is 1), maintenance seconds per fragment as fragments and
    versions grow (pylance's nearest operation dashed), and peak RSS of every curve."""
    curves = growth_curves(data)
    writes = {k: v for k, v in curves.items() if k[0] != "versions"}
    for key, points in writes.items():
        label = f"{GROWTH_CURVES.get(key, key[0])} {_span(points)}"
        lowest = min(p["seconds_per_unit"] for p in points)
        shown = _sized(points)  # a log axis has no 0 (an empty store)
        x = [p["amount"] / shown[0]["amount"] for p in shown]
        y = [p["seconds_per_unit"] / lowest for p in shown]
        axes[0].plot(x, y, marker="o", label=label)
    _limits(axes[0], "writes: seconds per unit / the curve's lowest (log-log)")
    axes[0].set_xlabel("size / smallest size", fontsize=8)
    for number, (key, points) in enumerate(curves.items()):
        if key[0] != "versions":
            continue
        color = f"C{number % 10}"
        amounts = [p["amount"] for p in points]
        axes[1].plot(
            amounts, [p["seconds_per_unit"] for p in points], marker="o", color=color, label=key[1]
        )
        others = [
            r for r in scale_rows(data) if r.get("contender") == "pylance" and _paired(r, key[1])
        ]
        if others:
            axes[1].plot(
                [r["amount"] for r in others],
                [r["seconds_per_unit"] for r in others],
                linestyle="--",
                color=color,
                label=f"pylance {others[0]['operation']}",
            )
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    _log_log(axes[1])
    axes[1].set_title("maintenance: seconds per fragment (append: per append), log-log")
    axes[1].set_xlabel("fragments = versions (appends of 4 rows)", fontsize=8)
    axes[1].legend(fontsize=6)
    for key, points in curves.items():
        measured = [p for p in _sized(points) if p.get("peak_rss_mb")]
        if len(measured) < 2:
            continue
        name = GROWTH_CURVES.get(key, key[1])
        axes[2].plot(
            [p["amount"] / measured[0]["amount"] for p in measured],
            [p["peak_rss_mb"] for p in measured],
            marker="o",
            linestyle="--" if key[0] == "versions" else "-",
            label=f"{name} {_span(measured)}",
        )
    axes[2].set_xscale("log")
    _log_log(axes[2])
    axes[2].set_yscale("linear")
    axes[2].set_ylim(bottom=0)
    axes[2].set_title("peak RSS (MB) of each point, in a fresh process")
    axes[2].set_xlabel("size / smallest size", fontsize=8)
    axes[2].legend(fontsize=6)


def _log_log(ax) -> None:
    """Log scales on both axes, ticks at 1, 2, 5 x powers of ten, labelled as plain numbers."""
    from matplotlib import ticker

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())


def _paired(row: dict, operation: str) -> bool:
    """Whether a pylance row of the scale case is the counterpart of blobhouse ``operation``."""
    from bench.cases import SCALE_OPERATIONS

    stock = SCALE_OPERATIONS.get(operation)
    return stock is not None and row["operation"] == stock.removeprefix("pylance ")


def _sized(points: list[dict]) -> list[dict]:
    return [p for p in points if p["amount"] > 0]


def _span(points: list[dict]) -> str:
    return f"{_amount(points[0]['amount'])}-{_amount(points[-1]['amount'])}"


def _limits(ax, title: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_log(ax)
    ax.axhspan(1, GROWTH_LIMIT, color="green", alpha=0.1)
    ax.axhline(1.0, color="gray", linestyle="--")
    ax.set_title(title)
    ax.legend(fontsize=6)


if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parent.parent
    write_readme_headline(ROOT / "bench" / "results", ROOT / "README.md")
