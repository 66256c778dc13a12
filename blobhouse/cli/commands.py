"""The ``blobhouse`` command's commands, one function each (``COMMANDS``): the library does
the work, each prints its report."""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable, Mapping

from blobhouse.cli.console import format_value, mb, print_report
from blobhouse.cli.run import (
    Run,
    check_master,
    pairs,
    spark_conf,
    spark_output,
    start_spark,
    storage_options,
)
from blobhouse.errors import InvalidInputError


def _demo(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.cli.demo import run_demo

    if args.rows < 1:
        raise InvalidInputError("--rows must be at least 1")
    check_master(args.master)
    conf = spark_conf(args)
    if args.local_s3:
        from blobhouse.testing import LocalS3Server

        with LocalS3Server() as s3:
            run.status(f"S3-compatible server on {s3.endpoint}")
            out = f"s3://{s3.bucket('blobhouse-demo')}/{args.out.rstrip('/').rsplit('/', 1)[-1]}"
            with spark_output(args):
                report = run_demo(
                    out,
                    args.rows,
                    args.master,
                    run.status,
                    s3.options,
                    conf,
                    task_progress=run.progress,
                )
    else:
        options = storage_options(args)
        run.will_write(args.out, options)
        with spark_output(args):
            report = run_demo(
                args.out,
                args.rows,
                args.master,
                run.status,
                options,
                conf,
                task_progress=run.progress,
            )
    _close(run)
    if args.json:
        _print_json(report)
    else:
        print_report(report)
    return 0 if report["mismatches"] == 0 else 1


def _ingest(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.spark.ingest import plan_ingest

    columns = _list(args.blob_columns)
    options = storage_options(args)
    run.doing = f"checking {args.manifest}"
    plan = plan_ingest(
        args.manifest,
        args.table,
        columns,
        fmt=args.format,
        mode=args.mode,
        dedup=args.dedup,
        drop_path_columns=args.drop_path_columns,
        storage_options=options,
        managed=args.managed,
        allowed_bases=args.allowed_bases,
    )
    check_master(args.master)
    run.will_write(args.table, options)
    with spark_output(args):
        spark = start_spark(args, run)
        how = "referencing (managed)" if plan.managed else "ingesting"
        run.status(
            f"{how} {plan.rows.num_rows} rows ({len(plan.sizes)} files, "
            f"{mb(plan.logical_bytes)}) from {args.manifest} into {args.table} ..."
        )
        report = plan.run(spark, partitions=args.tasks, progress=run.progress)
    _close(run)
    if args.json:
        _print_json(report)
        return 0
    print(
        f"{args.table}: version {report['version']}, {report['rows']} rows, "
        f"{mb(report['logical_bytes'])} logical, {mb(report['physical_bytes'])} physical"
    )
    print_report(
        report, skip=("table", "version", "rows", "logical_bytes", "physical_bytes"), separate=True
    )
    return 0


def _ingest_lerobot(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.lerobot import ingest_lerobot

    options = storage_options(args)
    run.doing = f"importing {args.dataset}"
    run.will_write(args.table, options)
    done = ingest_lerobot(
        args.dataset,
        args.table,
        mode=args.mode,
        storage_options=options,
        progress=run.progress,
        again=args.again,
    )
    _close(run)
    report = {
        "table": args.table,
        "version": done.table.version,
        "frames": done.frames,
        "episodes": done.episodes,
        "cameras": list(done.cameras),
        "video_files": done.video_files,
        "video_bytes": done.video_bytes,
    }
    if args.json:
        _print_json(report)
        return 0
    print(
        f"{args.table}: version {done.table.version}, {done.frames} frames of "
        f"{done.episodes} episodes, {done.video_files} video files ({mb(done.video_bytes)}) "
        f"for cameras {', '.join(done.cameras) or '(none)'}"
    )
    return 0


def _export_lerobot(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.lerobot.export import export_lerobot

    run.doing = f"exporting {args.table} to {args.folder}"
    done = export_lerobot(_open(args), args.folder, progress=run.progress)
    _close(run)
    report = {
        "folder": str(done.folder),
        "frames": done.frames,
        "episodes": done.episodes,
        "video_files": done.video_files,
        "data_files": done.data_files,
    }
    if args.json:
        _print_json(report)
        return 0
    print(
        f"{done.folder}: {done.frames} frames of {done.episodes} episodes, "
        f"{done.video_files} video files, {done.data_files} data files"
    )
    return 0


def _stats(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.lerobot.info import dataset_info  # here: --help loads no Lance

    run.doing = f"reading the statistics of {args.table}"
    table = _open(args)
    report = table.stats()
    lerobot = dataset_info(table)
    if args.json:
        _print_json(report if lerobot is None else {**report, "lerobot": lerobot.summary()})
        return 0
    shown = [
        "version",
        "rows",
        "deleted_rows",
        "fragments",
        "logical_bytes",
        "physical_bytes",
        "dedup_ratio",
        "orphan_files",
        "orphan_bytes",
    ]
    print(f"version        {report['version']}")
    print(f"rows           {report['rows']} ({report['deleted_rows']} deleted)")
    print(f"fragments      {report['fragments']}")
    print(f"logical        {mb(report['logical_bytes'])}")
    print(f"physical       {mb(report['physical_bytes'])} ({report['dedup_ratio']:.2f}x dedup)")
    print(f"orphans        {report['orphan_files']} files, {mb(report['orphan_bytes'])}")
    print(f"dedup          {report['properties']['dedup']} (the table's mode; per column below)")
    for owner, refs in report["external_references"].items():
        print(
            f"{owner + ' refs':<14} {refs['references']} references, {refs['objects']} "
            f"objects, {mb(refs['bytes'])}"
        )
    print_report(report, skip=[*shown, "external_references", "properties"], separate=True)
    if lerobot is not None:
        print_report(lerobot.summary(), "LeRobot dataset", separate=True)
    return 0


def _verify(args: argparse.Namespace, run: Run) -> int:
    run.doing = f"verifying {args.table}"
    report = _open(args).verify(deep=args.deep, progress=run.progress)
    _close(run)
    if args.json:
        _print_json(report)
        return 1 if report["problems"] else 0
    hashed = (
        f", {report['hashed']} payloads re-hashed ({report['unhashed']} without a hash)"
        if report["deep"]
        else ""
    )
    branches = "".join(
        f"; branch {b} versions {format_value('versions', v)}"
        for b, v in report["branches"].items()
    )
    missing = ", ".join(f"{n} {owner}" for owner, n in report["missing_objects"].items() if n)
    print(
        f"{report['references']} references in versions "
        f"{format_value('versions', report['versions'])}{branches}; "
        f"{report['objects']} objects{hashed}, {len(report['problems'])} problem(s)"
        + (f"; missing objects: {missing}" if missing else "")
    )
    shown = [
        "references",
        "versions",
        "branches",
        "objects",
        "hashed",
        "unhashed",
        "deep",
        "missing_objects",
    ]
    print_report(report, skip=shown if report["problems"] else [*shown, "problems"], separate=True)
    return 1 if report["problems"] else 0


def _gc(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.maintenance.garbage_collection import gc_at

    run.doing = f"collecting garbage in {args.table}"
    # a folder without a table but with a failed create's leftovers is cleaned too
    report = gc_at(
        args.table,
        branch=args.branch,
        storage_options=storage_options(args),
        retain_versions=args.retain_versions,
        older_than=args.older_than_hours,
        grace=args.grace_hours,
        dry_run=args.dry_run,
        progress=run.progress,
    )
    _close(run)
    if args.json:
        _print_json(report)
        return 0
    verb = "would remove" if report["dry_run"] else "removed"
    tagged = report["kept_tagged_versions"]
    print(
        f"{verb} versions {format_value('versions', report['removed_versions'])} and "
        f"{report['removed_files']} "
        f"files no retained version uses ({mb(report['reclaimed_bytes'])}); kept "
        f"{report['kept_young_files']} younger than the grace period"
        + (f" and pinned versions {format_value('versions', tagged)}" if tagged else "")
    )
    managed = report.get("managed")
    if managed and (managed["registered"] or managed["removed"]):
        print(
            f"managed objects: {verb} {managed['removed']} ({mb(managed['removed_bytes'])}), "
            f"{managed['referenced']} of {managed['registered']} referenced, "
            f"{managed['retired'] + managed['doomed'] + managed['waiting']} on their way out"
        )
    for kept in (managed or {}).get("kept", []):  # another table's (or unjudgeable): not deleted
        print(f"managed object kept: {kept}")
    if report.get("failed_create"):
        print(f"no table at {args.table}: these were the leftovers of a failed create")
    for path in report.get("foreign_files", []):
        print(f"left alone (not blobhouse's): {path}")
    if report.get("stale_leftovers"):
        print(
            f"{verb} {report['stale_leftovers']} stale leftover(s): locks and leases no live "
            "writer holds (a dead holder's, a directory, a link, an empty or garbage file)"
        )
    shown = [
        "dry_run",
        "stale_leftovers",
        "removed_versions",
        "removed_files",
        "reclaimed_bytes",
        "kept_young_files",
        "kept_tagged_versions",
        "failed_create",
        "foreign_files",
    ]
    print_report(report, skip=shown, separate=True)
    return 0


def _compact(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.options import CompactionTargets

    given = {
        "target_rows": args.target_rows,
        "target_bytes": None if args.target_mb is None else round(args.target_mb * 1e6),
        "deleted_fraction": args.deleted_fraction,
        "max_unused": args.max_unused,
    }
    targets = CompactionTargets(**{k: v for k, v in given.items() if v is not None})
    table = _open(args)
    run.will_write(args.table, storage_options(args), args.branch)
    run.doing = f"compacting {args.table}"
    report = table.compact(targets, progress=run.progress)
    _close(run)
    if args.json:
        _print_json(report)
        return 0
    if report["fragments_removed"] == 0:
        print(f"nothing to compact at version {report['read_version']}")
        return 0
    print(
        f"version {report['read_version']} -> {report['version']}: "
        f"{report['fragments_removed']} fragments -> {report['fragments_added']} "
        f"({report['rows']} rows, {report['deleted_rows_dropped']} deleted rows dropped), "
        f"{mb(report['bytes_before'])} -> {mb(report['bytes_after'])}"
    )
    shown = [
        "read_version",
        "version",
        "fragments_removed",
        "fragments_added",
        "rows",
        "deleted_rows_dropped",
        "bytes_before",
        "bytes_after",
    ]
    print_report(report, skip=shown, separate=True)
    return 0


def _relocate(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.borrowing import borrowed_by
    from blobhouse.errors import MovedTableWarning
    from blobhouse.maintenance.versions import VersionGraph
    from blobhouse.managed import Registry

    with warnings.catch_warnings():  # what the command is about: no warning to relocate
        warnings.simplefilter("ignore", MovedTableWarning)
        table = _open(args)
    run.will_write(args.table, storage_options(args))
    run.doing = f"relocating {args.table}"
    graph = VersionGraph.of(table)
    latest = [table.checkout(None, branch=b or "main") for b in {r.branch for r in graph.versions}]
    moved = {t.branch: t.moved_from for t in latest if t.moved_from is not None}
    table.relocate()  # in place already, it still borrows what its original owns
    carried = Registry.load(table.location, table.storage_options).carried
    borrowed = borrowed_by(table.location, carried, table.storage_options)
    report = {
        "table": args.table,
        "relocated": {branch or "main": old for branch, old in moved.items()},
        "unreadable": {branch: reason for branch, reason in graph.unreadable},
        "borrowed": len(borrowed),
    }
    if args.json:
        _print_json(report)
    else:
        for branch, old in moved.items():
            print(f"{args.table}: relocated the store of {branch or 'main'} from {old}")
        for branch, reason in graph.unreadable:
            print(f"{args.table}: branch {branch} cannot be relocated: {reason}")
        if not moved and not graph.unreadable:
            print(f"{args.table}: already in place, nothing to relocate")
        if borrowed:
            print(
                f"{args.table}: borrows {len(borrowed)} managed object(s) another table owns "
                "(that table's gc keeps them while this one exists)"
            )
    return 1 if graph.unreadable else 0


def _properties(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.properties import parse_settings

    table = _open(args)
    if args.set:
        names = [item.split("=", 1)[0] for item in args.set]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidInputError(f"--set names {twice} more than once: give each once")
        changes = parse_settings(pairs(args.set, "--set", "NAME=VALUE"))
        run.will_write(args.table, storage_options(args), args.branch)
        run.doing = f"changing the properties of {args.table}"
        table.set_properties(**changes)
    report = {"table": args.table, "version": table.version, **table.properties.to_dict()}
    if args.json:
        _print_json(report)
    else:
        print_report(report, skip=["recorded", "damaged"])
        for problem in dict.fromkeys(report["damaged"].values()):
            print(f"damaged: {problem}")
        if report["damaged"]:
            from blobhouse.settings import repair_command

            print(f"set them anew: {repair_command(report['damaged'], args.table)}")
        if not table.properties.recorded:
            print(
                "(recorded by no blobhouse version that keeps properties: writers use their own "
                "options, per-file content dedup by default, until a property is set)"
            )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Run], int]] = {
    "demo": _demo,
    "ingest": _ingest,
    "ingest-lerobot": _ingest_lerobot,
    "export-lerobot": _export_lerobot,
    "stats": _stats,
    "verify": _verify,
    "gc": _gc,
    "compact": _compact,
    "relocate": _relocate,
    "properties": _properties,
}


def _open(args: argparse.Namespace):
    """The table ``args.table``, reached with the command's storage options."""
    from blobhouse.table import open_table

    branch = getattr(args, "branch", None)
    return open_table(args.table, storage_options=storage_options(args), branch=branch)


def _close(run: Run) -> None:
    """Finish the progress bars before a report goes to stdout."""
    if run.bars is not None:
        run.bars.close()


def _list(value: str) -> list[str]:
    """A comma-separated option's items."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _print_json(report: Mapping) -> None:
    print(json.dumps(report, indent=2, default=str))
