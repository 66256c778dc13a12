"""Command line: ``blobhouse demo`` (the main job, on Spark), ``blobhouse ingest MANIFEST TABLE``,
the table services ``blobhouse stats|verify|gc|compact TABLE``, and ``blobhouse relocate TABLE``
for a table copied or moved to a new place."""

from __future__ import annotations

import argparse
import json
import os
import sys

from blobhouse.errors import BlobhouseError, InvalidInputError
from blobhouse.storage import checked_options


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``blobhouse`` command."""
    parser = argparse.ArgumentParser(prog="blobhouse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    spark = argparse.ArgumentParser(add_help=False)
    spark.add_argument(
        "--master", default="local[*]", help="Spark master (default: embedded local[*])"
    )
    spark.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.host=10.0.0.5 (repeat for more; see "
        "docs/spark-cluster.md)",
    )
    storage = argparse.ArgumentParser(add_help=False)
    storage.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a storage option of the table's object store, e.g. aws_endpoint=http://127.0.0.1:9000"
        " (repeat for more; see docs/object-storage.md)",
    )

    on_branch = argparse.ArgumentParser(add_help=False)
    on_branch.add_argument(
        "--branch", default=None, help="a branch of the table (made with Lance's create_branch)"
    )

    demo = commands.add_parser(
        "demo", parents=[storage, spark], help="write, query and verify a robot-episode table"
    )
    demo.add_argument("--rows", type=int, default=1800, help="frames to generate (30 Hz)")
    demo.add_argument(
        "--out", default="demo-output/episodes", help="where to write the table (replaced)"
    )
    demo.add_argument(
        "--local-s3",
        action="store_true",
        help="write the table to a local S3-compatible server (moto, started for the run)",
    )
    demo.add_argument("--json", action="store_true", help="print the report as JSON")

    ingest = commands.add_parser(
        "ingest", parents=[storage, spark], help="load files named in a manifest into a table"
    )
    ingest.add_argument("manifest", help="JSONL, CSV or Parquet file of rows")
    ingest.add_argument("table", help="the table to create or append to")
    ingest.add_argument(
        "--blob-columns",
        required=True,
        help="comma-separated manifest columns that name files or URIs",
    )
    ingest.add_argument("--format", choices=["jsonl", "csv", "parquet"], default=None)
    ingest.add_argument("--mode", choices=["append", "overwrite"], default="append")

    stats = commands.add_parser(
        "stats", parents=[storage, on_branch], help="logical vs physical bytes of a table"
    )
    stats.add_argument("table")
    stats.add_argument("--json", action="store_true", help="print the report as JSON")

    verify = commands.add_parser(
        "verify",
        parents=[storage],
        help="check that every blob reference of every version and branch resolves",
    )
    verify.add_argument("table")
    verify.add_argument(
        "--deep", action="store_true", help="also re-hash every payload against its recorded hash"
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")

    compact = commands.add_parser(
        "compact",
        parents=[storage, on_branch],
        help="rewrite small and sparse fragments, keeping blob sharing",
    )
    compact.add_argument("table")
    compact.add_argument("--target-rows", type=int, default=None, help="rows per new data file")
    compact.add_argument("--target-mb", type=float, default=None, help="MB per new data file")
    compact.add_argument(
        "--deleted-fraction",
        type=float,
        default=None,
        help="rewrite fragments with at least this fraction of rows deleted (default 0.1)",
    )
    compact.add_argument(
        "--repack-threshold",
        type=float,
        default=None,
        help="repack store packs of which less than this fraction is referenced (default 0.5)",
    )
    compact.add_argument("--json", action="store_true", help="print the report as JSON")

    collect = commands.add_parser(
        "gc", parents=[storage, on_branch], help="remove old versions and unreferenced files"
    )
    collect.add_argument("table")
    collect.add_argument("--retain-versions", type=int, default=None)
    collect.add_argument("--older-than-hours", type=float, default=None)
    collect.add_argument(
        "--grace-hours",
        type=float,
        default=24.0,
        help="keep unreferenced files younger than this (default 24)",
    )
    collect.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    collect.add_argument("--json", action="store_true", help="print the report as JSON")

    relocate = commands.add_parser(
        "relocate",
        parents=[storage],
        help="point a copied or moved table's store at its new place (one commit)",
    )
    relocate.add_argument("table")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "ingest":
            return _ingest(args)
        if args.command == "verify":
            return _verify(args)
        if args.command == "gc":
            return _gc(args)
        if args.command == "compact":
            return _compact(args)
        if args.command == "relocate":
            return _relocate(args)
        return _stats(args)
    except BlobhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `blobhouse stats T | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0


def _demo(args: argparse.Namespace) -> int:
    from blobhouse.demo import run_demo

    if args.rows < 1:
        raise SystemExit("--rows must be at least 1")
    if args.local_s3:
        from blobhouse.testing import LocalS3Server

        with LocalS3Server() as s3:
            _progress(f"S3-compatible server on {s3.endpoint}")
            out = f"s3://{s3.bucket('blobhouse-demo')}/{args.out.rstrip('/').rsplit('/', 1)[-1]}"
            report = run_demo(out, args.rows, args.master, _progress, s3.options, _conf(args))
    else:
        options = _storage_options(args)
        report = run_demo(args.out, args.rows, args.master, _progress, options, _conf(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"table            {report['table']}")
        print(f"rows             {report['rows']}")
        print(f"logical bytes    {_mb(report['logical_bytes'])}")
        print(f"physical bytes   {_mb(report['physical_bytes'])}")
        print(f"dedup ratio      {report['dedup_ratio']:.1f}x")
        print(f"write            {report['write_mb_s']} MB/s (logical)")
        print(f"read + verify    {report['read_mb_s']} MB/s")
        print(f"verified blobs   {report['verified_blobs']}, mismatches {report['mismatches']}")
        first = report["sql_first_frames"]
        print(
            f"SQL read_blob    {len(first)} episodes, "
            f"{sum(r['video_bytes'] for r in first) / 1e6:,.1f} MB of first-frame video"
        )
        for name, column in report["columns"].items():
            print(
                f"  {name:<12} {_mb(column['logical_bytes']):>12} -> "
                f"{_mb(column['physical_bytes']):>10}  ({column['dedup_ratio']:.1f}x)"
            )
    return 0 if report["mismatches"] == 0 else 1


def _ingest(args: argparse.Namespace) -> int:
    import blobhouse.spark as bs
    from blobhouse.spark.ingest import ingest
    from blobhouse.table import open_table

    _progress(f"starting Spark ({args.master}) ...")
    spark = bs.local_session(args.master, conf=_conf(args))
    bs.register(spark)
    columns = [c.strip() for c in args.blob_columns.split(",") if c.strip()]
    _progress(f"ingesting {args.manifest} into {args.table} ...")
    options = _storage_options(args)
    ingest(
        spark,
        args.manifest,
        args.table,
        columns,
        fmt=args.format,
        mode=args.mode,
        storage_options=options,
    )
    report = open_table(args.table, storage_options=options).stats()
    print(
        f"{args.table}: version {report['version']}, {report['rows']} rows, "
        f"{_mb(report['logical_bytes'])} logical, {_mb(report['physical_bytes'])} physical"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:

    report = _open(args).verify(deep=args.deep, progress=ProgressBar())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        hashed = (
            f", {report['hashed']} payloads re-hashed ({report['unhashed']} without a hash)"
            if report["deep"]
            else ""
        )
        branches = "".join(f", branch {b} {v}" for b, v in report["branches"].items())
        print(
            f"{report['references']} references in versions {report['versions']}{branches}, "
            f"{report['objects']} objects{hashed}, {len(report['problems'])} problem(s)"
        )
        for p in report["problems"]:
            where = f"branch {p['branch']} " if p["branch"] else ""
            print(
                f"  {where}version {p['version']} column {p['column']} row {p['row']}: "
                f"{p['reason']}: {p['uri']}"
            )
    return 1 if report["problems"] else 0


def _gc(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from blobhouse.maintenance.garbage_collection import gc_at

    hours = args.older_than_hours
    # a folder without a table but with a failed create's leftovers is cleaned too
    report = gc_at(
        args.table,
        branch=args.branch,
        storage_options=_storage_options(args),
        retain_versions=args.retain_versions,
        older_than=None if hours is None else timedelta(hours=hours),
        grace=timedelta(hours=args.grace_hours),
        dry_run=args.dry_run,
        progress=ProgressBar(),
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verb = "would remove" if report["dry_run"] else "removed"
        tagged = report["kept_tagged_versions"]
        print(
            f"{verb} versions {report['removed_versions']} and {report['removed_files']} "
            f"unreferenced files ({_mb(report['reclaimed_bytes'])}); kept "
            f"{report['kept_young_files']} younger than the grace period"
            + (f" and tagged versions {tagged}" if tagged else "")
        )
        if report.get("failed_create"):
            print(f"no table at {args.table}: these were the leftovers of a failed create")
        for path in report.get("foreign_files", []):
            print(f"left alone (not blobhouse's): {path}")
    return 0


def _compact(args: argparse.Namespace) -> int:

    options = {
        "target_rows": args.target_rows,
        "target_bytes": None if args.target_mb is None else int(args.target_mb * 1e6),
        "deleted_fraction": args.deleted_fraction,
        "repack_threshold": args.repack_threshold,
    }
    report = _open(args).compact(
        progress=ProgressBar(), **{k: v for k, v in options.items() if v is not None}
    )
    if args.json:
        print(json.dumps(report, indent=2))
    elif report["fragments_removed"] == 0:
        print(f"nothing to compact at version {report['read_version']}")
    else:
        print(
            f"version {report['read_version']} -> {report['version']}: "
            f"{report['fragments_removed']} fragments -> {report['fragments_added']} "
            f"({report['rows']} rows, {report['deleted_rows_dropped']} deleted rows dropped), "
            f"{_mb(report['bytes_before'])} -> {_mb(report['bytes_after'])}"
        )
    return 0


def _relocate(args: argparse.Namespace) -> int:
    from blobhouse.maintenance.walk import VersionGraph

    table = _open(args)
    graph = VersionGraph.of(table)
    latest = [table.checkout(None, branch=b or "main") for b in {r.branch for r in graph.versions}]
    moved = {t.branch: t.moved_from for t in latest if t.moved_from is not None}
    if moved:
        table.relocate()
    for branch, old in moved.items():
        print(f"{args.table}: relocated the store of {branch or 'main'} from {old}")
    for branch, reason in graph.unreadable:
        print(f"{args.table}: branch {branch} cannot be relocated: {reason}")
    if not moved and not graph.unreadable:
        print(f"{args.table}: already in place, nothing to relocate")
    return 1 if graph.unreadable else 0


class ProgressBar:
    """Progress of long steps on stderr: a bar redrawn in place on a terminal, a line at the
    start and the end of each step otherwise (logs stay short)."""

    WIDTH = 30

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def __call__(self, step: str, done: int, total: int) -> None:
        if self.tty:
            filled = self.WIDTH * done // max(total, 1)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            end = "\n" if done >= total else ""
            print(f"\r{step:<8} [{bar}] {done}/{total}", end=end, file=self.stream, flush=True)
        elif done == 0 or done >= total:
            print(f"{step}: {done}/{total}", file=self.stream, flush=True)


def _open(args: argparse.Namespace):
    """The table ``args.table``, reached with the command's storage options."""
    from blobhouse.table import open_table

    branch = getattr(args, "branch", None)
    return open_table(args.table, storage_options=_storage_options(args), branch=branch)


def _storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    return checked_options(_pairs(args.storage_option, "--storage-option", "NAME=VALUE"))


def _conf(args: argparse.Namespace) -> dict[str, str]:
    return _pairs(args.conf, "--conf", "KEY=VALUE")


def _pairs(items: list[str], flag: str, shape: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in items]
    bad = [item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2 or not pair[0]]
    if bad:
        raise InvalidInputError(f"{flag} must be {shape}, got {bad[0]!r}")
    return dict(pairs)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stats(args: argparse.Namespace) -> int:

    report = _open(args).stats()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    orphans = f"{report['orphan_files']} files, {_mb(report['orphan_bytes'])}"
    print(f"version        {report['version']}")
    print(f"rows           {report['rows']} ({report['deleted_rows']} deleted)")
    print(f"fragments      {report['fragments']}")
    print(f"logical        {_mb(report['logical_bytes'])}")
    print(f"physical       {_mb(report['physical_bytes'])} ({report['dedup_ratio']:.2f}x dedup)")
    print(f"orphans        {orphans}")
    print()
    print(f"{'column':<16} {'kind':<10} {'rows':>9} {'logical':>12} {'physical':>12} {'dedup':>7}")
    for name, column in report["columns"].items():
        for kind, entry in column["kinds"].items():
            print(
                f"{name:<16} {kind:<10} {entry['rows']:>9} {_mb(entry['logical_bytes']):>12} "
                f"{_mb(entry['physical_bytes']):>12} {entry['dedup_ratio']:>6.2f}x"
            )
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


if __name__ == "__main__":
    sys.exit(main())
