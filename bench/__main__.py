"""``python -m bench [--quick] [--cases a,b] [--out DIR]``: run the benchmark cases, write
``<out>/<case>.json``, and (full size, default out) BENCHMARKS.md, the chart and README.md's
performance headline."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench import harness
from bench.cases import CASES, FULL, QUICK
from bench.harness import machine
from bench.report import write_report

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="CI-sized smoke run")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--out", default=None, help="results directory")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    harness.WARM_UP = not args.quick
    out = (
        Path(args.out)
        if args.out
        else ROOT / "bench" / ("results-quick" if args.quick else "results")
    )
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    # a user's install reads its imports compiled (pip writes the bytecode); a machine that
    # sets PYTHONDONTWRITEBYTECODE would make every process of the run compile them instead
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"size": size.name, **machine()}, indent=2))
    for name in names:
        started = time.perf_counter()
        print(f"[bench] {name} ({size.name}) ...", file=sys.stderr, flush=True)
        CASES[name](size).save(out)
        print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if not args.quick and args.out is None:
        write_report(out, ROOT / "BENCHMARKS.md", readme=ROOT / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
