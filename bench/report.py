"""BENCHMARKS.md and the chart, from the JSON results of a full run."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_FRAGMENT_ROWS = 1_000_000  # Lance's default fragment size, as the mutations case writes it

TARGETS = (
    "| target | result |\n"
    "| --- | --- |\n"
    "| physical bytes <= 1.05 x unique when duplicates share a data file | {storage} |\n"
    "| write, no duplicates >= 0.9 x pylance | {write_unique} |\n"
    "| write, 20x duplicates >= 5 x pylance (page cache) | {write_dup} |\n"
    "| write, 20x duplicates >= 5 x pylance (durable: "
    "until os.sync returns) | {write_dup_durable} |\n"
    "| random access of K rows >= 1.0 x pylance read_blobs | {access} |\n"
    "| random access, K = 1, 1 MB >= 10 x Parquet | {access_parquet} |\n"
    "| peak RSS flat (within 1.5x) from 1 GB to 8 GB written | {rss} |\n"
    "| after compaction, physical bytes <= 1.05 x unique live bytes | {compaction} |\n"
    '| dedup="global": bytes on disk <= 1.05 x unique across appends | {global_dedup} |\n'
    "| S3: one GET per coalesced range (requests the server logged) | {s3_requests} |\n"
    "| S3: reads by reference >= 1.0 x pylance read_blobs on the same store | {s3_access} |\n"
    "| update of a plain column, 1,250-row fragments: "
    "growth after gc < the rewritten column's bytes | {update_growth} |\n"
    "| update of a plain column at Lance's default fragment size (1M rows): "
    "growth after gc < the column's bytes | {update_growth_default} |\n"
    '| upsert, dedup="global": '
    "growth after gc <= 1.05 x the new unique payloads | {upsert_growth} |\n"
    "| Spark: reference scan >= 0.95 x the Python data source floor | {spark_scan} |\n"
    "| Spark: read_blob and materialize >= 1.5 GB/s on local[2] | {spark_bytes} |\n"
)


def write_report(results: Path, target: Path) -> None:
    """Write ``target`` (BENCHMARKS.md, with bench/findings.md: the gaps explained) and
    ``results/chart.png``."""
    data = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    run = data.pop("run", {})
    lines = [
        "# Benchmarks",
        "",
        "Every contender runs on the same data in the same process run; times are medians of "
        f"{5} runs after a warm-up, contenders alternating inside each round. Regenerate with "
        "`bin/bench` (roughly 10-15 minutes on 2 cores; `bin/bench --quick` is the CI smoke run).",
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
    if findings.exists():
        lines += [findings.read_text(), ""]
    for name, case in data.items():
        lines += [f"## {name}", "", case["description"], "", *_table(case["rows"]), ""]
        lines += [f"- {note}" for note in case.get("notes", [])]
        lines.append("")
    target.write_text("\n".join(lines))
    _chart(data, results / "chart.png")


def _table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    out += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
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
    unique = [
        r["vs_pylance"]
        for r in rows("write_throughput", contender="blobhouse", durable=False)
        if r["workload"].startswith("unique")
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
    access_parquet = [
        r["vs_parquet"]
        for r in rows("random_access", k=1, contender="blobhouse refs + ranged reads")
    ]
    compaction = [r["ratio_to_unique"] for r in rows("maintenance", contender="blobhouse compact")]
    global_dedup = [
        r["ratio_to_unique"] for r in rows("global_dedup", contender="blobhouse global")
    ]
    ranged_s3 = rows("object_storage", contender="blobhouse refs + ranged reads, s3")
    s3_requests = [r["requests"].get("GET", 0) / r["coalesced_reads"] for r in ranged_s3]
    s3_access = [r["vs_pylance_same_store"] for r in ranged_s3]
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
    spark = rows("spark")
    gb = rows("scale", mode="gb")
    rss = gb[-1]["peak_rss_mb"] / gb[0]["peak_rss_mb"] if gb else None
    return {
        "storage": _range(storage, "x unique", lambda v: v <= 1.05),
        "write_unique": _range(unique, "x pylance", lambda v: v >= 0.9),
        "write_dup": _range(dup, "x pylance", lambda v: v >= 5),
        "write_dup_durable": _range(dup_durable, "x pylance", lambda v: v >= 5),
        "access": _range(access, "x pylance", lambda v: v >= 1.0),
        "access_parquet": _range(access_parquet, "x parquet", lambda v: v >= 10),
        "compaction": _range(compaction, "x unique", lambda v: v <= 1.05),
        "global_dedup": _range(global_dedup, "x unique", lambda v: v <= 1.05),
        "s3_requests": _range(s3_requests, "GETs per coalesced range", lambda v: v == 1),
        "s3_access": _range(s3_access, "x pylance", lambda v: v >= 1.0),
        "update_growth": _range(update_growth, "x the column", lambda v: v < 1),
        "update_growth_default": _range(update_growth_default, "x the column", lambda v: v < 1),
        "upsert_growth": _range(upsert_growth, "x new unique", lambda v: v <= 1.05),
        "rss": "-" if rss is None else f"{rss:.2f}x ({'met' if rss <= 1.5 else 'missed'})",
        "spark_scan": _range(
            [r["scan_vs_floor"] for r in spark if "scan_vs_floor" in r],
            "x the floor",
            lambda v: v >= 0.95,
        ),
        "spark_bytes": _spark_bytes(spark),
    }


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
            verdicts.append(text + ")")
    return ", ".join(verdicts) or "-"


def _range(values: list[float], unit: str, ok) -> str:
    if not values:
        return "-"
    met = all(ok(v) for v in values)
    return f"{min(values)} to {max(values)} {unit} ({'met' if met else 'missed'})"


def _chart(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
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
    for ax in axes:
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
