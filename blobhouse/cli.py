"""Command line: ``blobhouse demo`` (the main job) and ``blobhouse stats TABLE``."""

from __future__ import annotations

import argparse
import json
import sys

from blobhouse.errors import BlobhouseError


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``blobhouse`` command."""
    parser = argparse.ArgumentParser(prog="blobhouse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="write, query and verify a robot-episode table")
    demo.add_argument("--rows", type=int, default=1800, help="frames to generate (30 Hz)")
    demo.add_argument("--out", default="demo-output/episodes", help="where to write the table")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")

    stats = commands.add_parser("stats", help="logical vs physical bytes of a table")
    stats.add_argument("table")
    stats.add_argument("--json", action="store_true", help="print the report as JSON")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        return _stats(args)
    except BlobhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _demo(args: argparse.Namespace) -> int:
    from blobhouse.demo import run_demo

    if args.rows < 1:
        raise SystemExit("--rows must be at least 1")
    report = run_demo(args.out, args.rows, progress=lambda m: print(m, file=sys.stderr))
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
        for name, column in report["columns"].items():
            print(
                f"  {name:<12} {_mb(column['logical_bytes']):>12} -> "
                f"{_mb(column['physical_bytes']):>10}  ({column['dedup_ratio']:.1f}x)"
            )
    return 0 if report["mismatches"] == 0 else 1


def _stats(args: argparse.Namespace) -> int:
    from blobhouse.table import open_table

    report = open_table(args.table).stats()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"version {report['version']}, {report['rows']} rows, "
        f"{_mb(report['logical_bytes'])} logical, {_mb(report['physical_bytes'])} physical "
        f"({report['dedup_ratio']:.1f}x)"
    )
    for name, column in report["columns"].items():
        for kind, entry in column["kinds"].items():
            print(
                f"  {name:<16} {kind:<10} {entry['rows']:>9} rows "
                f"{_mb(entry['logical_bytes']):>12} -> {_mb(entry['physical_bytes']):>10}"
            )
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


if __name__ == "__main__":
    sys.exit(main())
