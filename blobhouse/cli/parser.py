"""The ``blobhouse`` command's arguments: one parser per command, checked values, unknown
options named with the closest."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from blobhouse.errors import InvalidInputError

DESCRIPTION = """\
blobhouse: multimodal training tables whose blob bytes are stored once however many rows
reference them, written as standard Lance datasets.

Run "blobhouse COMMAND --help" for a command's options. Every command prints a readable
summary, or its full report as JSON with --json. Errors are one line on stderr (--debug prints
the traceback); Ctrl-C stops a command cleanly, exit code 130.
"""


INGEST_DESCRIPTION = """\
Load the files a manifest names into a blob table, on Spark.

The manifest (JSONL, CSV or Parquet) has one row per table row; the blob columns hold file
paths (relative to the manifest's directory, absolute, or URIs such as s3://bucket/key). The
manifest is read and checked before Spark starts: a missing manifest, an unknown format, a
missing blob column or a missing file is reported in a second, naming row, column and path.

The table gets the manifest's rows in manifest order and its columns in manifest order (JSONL:
in the order keys first appear). Each blob column holds the file's bytes, and a string column
<blob column>_path next to it keeps the path as the manifest wrote it (--drop-path-columns
leaves them out). Appending casts the manifest's columns to the table's types (a CSV manifest
appended to a table a JSONL one made), or names the column that cannot be cast.

Rows are split into consecutive ranges, one Spark task each (about 1 GiB of distinct files
per task, or --tasks N). Each distinct file is stored once per table, across tasks and appends
(the table's dedup property, "global" for a new table); --dedup content stores it once per
task, --dedup off once per row (a new table records the choice; an existing one keeps its own).

--managed references the files in place instead of copying them, and hands them to the table:
gc deletes a file once no retained version of the table references it. The files must lie
under the folders the table allows (--allowed-bases when the ingest creates the table).
"""


PROPERTIES_DESCRIPTION = """\
Show the table's properties: the write settings every writer uses (write_table, df.write, SQL
INSERT, merge_insert, update, backfill, ingest, compact): the dedup mode of each blob column,
ref_id columns, placement thresholds, allowed and managed bases, data file size limits. A
writer that leaves a setting out uses the table's; one that asks for another value is refused.

--set NAME=VALUE changes them in one commit (a new manifest, nothing rewritten): later writes
follow the new settings, and compact brings earlier rows under a new dedup mode. Bases can be
added, not removed.
"""


DEMO_DESCRIPTION = """\
The main job, on Spark: generate robot episodes (30 Hz frames sharing 1-6 MB video chunks, a
calibration file per episode, a thumbnail per frame), write them with dedup, query them with
Spark SQL and read_blob, read every blob back and check its bytes. Exit code 1 if any byte
differs. --out is a new place or the demo's own table (overwritten as a new version); a folder
holding anything else is refused, never deleted.
"""


SERVICE_DESCRIPTIONS = {
    "stats": "Per blob column and kind: rows, logical bytes (what rows reference), physical "
    "bytes (each stored range once) and the dedup ratio; external references, managed and "
    "unmanaged apart; fragments, deleted rows, orphan files.",
    "verify": "Check that every blob reference of every retained version of every branch "
    "resolves to an existing object with its range inside it (--deep: also re-hash every "
    "stored payload); missing objects are counted apart: the table's, managed and unmanaged "
    "external ones. Exit code 1 if there is a problem.",
    "gc": "Remove old versions (through Lance; tagged versions are kept), then files under "
    "the table's data/ and store that no retained version of any branch references, once "
    "older than the grace period. External objects the user owns are never touched; managed "
    "ones (handed to the table by a write) are deleted once no retained version references "
    "them, two grace periods after gc first finds them unreferenced.",
    "compact": "Rewrite small fragments and fragments with many deleted rows in one commit, "
    "each payload stored once per new data file; deleted rows' bytes are dropped.",
    "relocate": "Point a copied or moved table's store at its new place (one commit); until "
    "then stock Lance readers follow the old path.",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``blobhouse`` argument parser (every option has help; help text is plain)."""
    parser = _Parser(
        prog="blobhouse",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--debug", action="store_true", help="print tracebacks and Spark's own logging"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = _Parents.make()

    def command(name: str, summary: str, description: str, *parents):
        return commands.add_parser(
            name,
            parents=list(parents),
            help=summary,
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    for add in _COMMAND_PARSERS:
        add(command, parents)
    return parser


_Command = Callable[..., argparse.ArgumentParser]


@dataclass(frozen=True)
class _Parents:
    """The option groups commands share: ``common`` (every command), ``spark`` (the commands
    that run on Spark), ``table`` (the table argument) and ``on_branch`` (``--branch``)."""

    common: argparse.ArgumentParser
    spark: argparse.ArgumentParser
    table: argparse.ArgumentParser
    on_branch: argparse.ArgumentParser

    @classmethod
    def make(cls) -> _Parents:
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,  # the global flag's value stays unless given here
            help="print tracebacks and Spark's own logging",
        )
        common.add_argument(
            "--json", action="store_true", help="print the full report as JSON on stdout"
        )
        common.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a storage option of the table's object store, e.g. "
            "aws_endpoint=http://127.0.0.1:9000 (repeat for more; see docs/object-storage.md)",
        )
        spark = argparse.ArgumentParser(add_help=False)
        spark.add_argument(
            "--master",
            default="local[*]",
            help="Spark master URL, e.g. spark://host:7077 (default: embedded local[*])",
        )
        spark.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a Spark setting, e.g. spark.driver.host=10.0.0.5 (repeat for more; see "
            "docs/spark-cluster.md)",
        )
        table = argparse.ArgumentParser(add_help=False)
        table.add_argument("table", help="the table: a local path or a URI such as s3://bucket/t")
        on_branch = argparse.ArgumentParser(add_help=False)
        on_branch.add_argument(
            "--branch", default=None, help="a branch of the table (made with Lance's create_branch)"
        )

        return cls(common, spark, table, on_branch)


def _demo_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse demo``."""
    demo = command(
        "demo",
        "write, query and verify a robot-episode table on Spark",
        DEMO_DESCRIPTION,
        parents.common,
        parents.spark,
    )
    demo.add_argument(
        "--rows", type=int, default=1800, help="frames to generate at 30 Hz (default 1800)"
    )
    demo.add_argument(
        "--out",
        default="demo-output/episodes",
        help="where to write the table (default demo-output/episodes)",
    )
    demo.add_argument(
        "--local-s3",
        action="store_true",
        help="write the table to a local S3-compatible server (moto, started for the run)",
    )


def _ingest_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse ingest``."""
    ingest = command(
        "ingest",
        "load the files a manifest names into a table, on Spark",
        INGEST_DESCRIPTION,
        parents.common,
        parents.spark,
    )
    ingest.add_argument("manifest", help="a JSONL, CSV or Parquet file with one row per table row")
    ingest.add_argument("table", help="the table to create or append to (a path or a URI)")
    ingest.add_argument(
        "--blob-columns",
        required=True,
        metavar="COLUMNS",
        help="comma-separated manifest columns holding file paths or URIs, loaded as blobs",
    )
    ingest.add_argument(
        "--format",
        choices=["jsonl", "csv", "parquet"],
        default=None,
        help="the manifest's format (default: from its extension: .jsonl/.json, .csv, .parquet)",
    )
    ingest.add_argument(
        "--mode",
        choices=["append", "overwrite"],
        default="append",
        help="append to the table (created when missing; the default), or overwrite its rows "
        "with a new version",
    )
    ingest.add_argument(
        "--dedup",
        choices=["content", "global", "off"],
        default=None,
        help="global (a new table's default; an existing table's own mode otherwise): each "
        "distinct file once per table, across tasks and appends; content: once per task; "
        "off: one copy per row",
    )
    ingest.add_argument(
        "--managed",
        action="store_true",
        help="reference the files in place and hand them to the table (gc deletes a file once "
        "no retained version references it) instead of copying their bytes",
    )
    ingest.add_argument(
        "--allowed-bases",
        metavar="DIRS",
        type=_setting("allowed_bases"),
        default=None,
        help="comma-separated folders or URI prefixes the table may reference files under "
        "(set when the ingest creates or overwrites the table; --managed needs them)",
    )
    ingest.add_argument(
        "--drop-path-columns",
        action="store_true",
        help="do not keep the <blob column>_path columns (the paths as the manifest wrote them)",
    )
    ingest.add_argument(
        "--tasks",
        type=_setting("partitions"),
        default=None,
        metavar="N",
        help="Spark tasks, each a consecutive range of rows (default: one per ~1 GiB of files)",
    )


def _ingest_lerobot_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse ingest-lerobot``."""
    ingest = command(
        "ingest-lerobot",
        "load a LeRobot dataset (meta/, data/, videos/) into a table, each video once",
        "Import a LeRobot v3 dataset folder into one table: a row per frame with its state, "
        "action, timestamps and task, and per camera a blob column referencing the camera's "
        "video file (each file stored once) plus <camera>_timestamp, the frame's time in it. "
        "Dots in feature names become underscores. The dataset (its names, values and video "
        "files) is checked before anything is written; a failed import leaves the table as it "
        "was (docs/robot-learning.md).",
        parents.common,
    )
    ingest.add_argument("dataset", help="the LeRobot dataset's folder (holding meta/info.json)")
    ingest.add_argument("table", help="the table to create (a path or a URI)")
    ingest.add_argument(
        "--mode",
        choices=["create", "append", "overwrite"],
        default="create",
        help="create the table (the default; refused if it exists), append to it (the "
        "dataset's episodes numbered after the table's, as LeRobot's merge numbers them), or "
        "overwrite its rows with a new version",
    )
    ingest.add_argument(
        "--again",
        action="store_true",
        help="append a dataset the table holds already (refused without it: its episodes "
        "would be repeated as new ones)",
    )


def _export_lerobot_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse export-lerobot``."""
    export = command(
        "export-lerobot",
        "write a table made by ingest-lerobot back as a LeRobot dataset folder",
        "Write a table made by ingest-lerobot as a LeRobot v3.0 dataset folder (meta/, data/, "
        "videos/) that LeRobot's own tools load: each video file byte for byte as imported, "
        "the frames, tasks, episodes and stats from the table and the metadata it kept. The "
        "folder is new (refused if it holds anything) and appears whole or not at all "
        "(docs/robot-learning.md).",
        parents.common,
    )
    export.add_argument("table", help="the table (a path or a URI)")
    export.add_argument("folder", help="the dataset folder to make (a local path)")


def _stats_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse stats``."""
    command(
        "stats",
        "rows, logical and physical bytes, dedup ratio",
        SERVICE_DESCRIPTIONS["stats"],
        parents.common,
        parents.table,
        parents.on_branch,
    )


def _verify_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse verify``."""
    verify = command(
        "verify",
        "check that every blob reference of every version and branch resolves",
        SERVICE_DESCRIPTIONS["verify"],
        parents.common,
        parents.table,
    )
    verify.add_argument(
        "--deep", action="store_true", help="also re-hash every payload against its recorded hash"
    )


def _compact_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse compact``."""
    compact = command(
        "compact",
        "rewrite small and sparse fragments, keeping blob sharing",
        SERVICE_DESCRIPTIONS["compact"],
        parents.common,
        parents.table,
        parents.on_branch,
    )
    compact.add_argument(
        "--target-rows",
        type=_setting("target_rows"),
        default=None,
        help="rows per new data file (default 1M)",
    )
    compact.add_argument(
        "--target-mb", type=_megabytes, default=None, help="MB per new data file (default 2 GiB)"
    )
    compact.add_argument(
        "--deleted-fraction",
        type=_setting("deleted_fraction"),
        default=None,
        help="rewrite fragments with at least this fraction of rows deleted (default 0.1)",
    )
    compact.add_argument(
        "--max-unused",
        type=_setting("max_unused"),
        default=None,
        help="repack store packs, the most unreferenced first, until the unreferenced bytes "
        "are at most this fraction of the referenced (default 0.05)",
    )


def _gc_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse gc``."""
    collect = command(
        "gc",
        "remove old versions and unreferenced files",
        SERVICE_DESCRIPTIONS["gc"],
        parents.common,
        parents.table,
        parents.on_branch,
    )
    collect.add_argument(
        "--retain-versions",
        type=_setting("retain_versions"),
        default=None,
        metavar="N",
        help="keep the newest N versions, remove older ones (tagged versions are always kept)",
    )
    collect.add_argument(
        "--older-than-hours",
        type=_setting("older_than"),
        default=None,
        metavar="H",
        help="remove versions older than H hours (with --retain-versions: both must hold)",
    )
    collect.add_argument(
        "--grace-hours",
        type=_setting("grace"),
        default=timedelta(hours=24),
        metavar="H",
        help="keep unreferenced files younger than H hours: they may belong to a write in "
        "progress (default 24)",
    )
    collect.add_argument("--dry-run", action="store_true", help="report, delete nothing")


def _setting(name: str) -> Callable[[str], Any]:
    """The argparse type of an option that sets setting ``name``."""

    def parse(text: str) -> Any:
        from blobhouse.settings import SETTINGS

        try:
            return SETTINGS[name].parse(text)
        except InvalidInputError as exc:  # "must be ..., got ...": argparse names the option
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name} ")) from None

    return parse


def _megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value) or round(value * 1e6) < 1:  # less than a byte
        raise argparse.ArgumentTypeError(f"must be at least 0.000001 (a byte), got {text}")
    return value


def _relocate_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse relocate``."""
    command(
        "relocate",
        "point a copied or moved table's store at its new place (one commit)",
        SERVICE_DESCRIPTIONS["relocate"],
        parents.common,
        parents.table,
    )


def _properties_command(command: _Command, parents: _Parents) -> None:
    """``blobhouse properties``."""
    properties = command(
        "properties",
        "show or change the table's write settings (its properties)",
        PROPERTIES_DESCRIPTION,
        parents.common,
        parents.table,
        parents.on_branch,
    )
    properties.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a property (repeat for more, one commit): dedup, dedup.<column>, "
        "ref_id_column.<column>, inline_size_threshold[.<column>], dedicated_size_threshold"
        "[.<column>], pack_file_size_threshold[.<column>], allowed_bases, managed_bases, "
        "max_rows_per_file, max_bytes_per_file",
    )


_COMMAND_PARSERS = (
    _demo_command,
    _ingest_command,
    _ingest_lerobot_command,
    _export_lerobot_command,
    _stats_command,
    _verify_command,
    _compact_command,
    _gc_command,
    _relocate_command,
    _properties_command,
)


class _Parser(argparse.ArgumentParser):
    """argparse that never takes an option by a prefix of its name, and reports a bad command
    line as one line on stderr (exit code 2), suggesting the option or command meant."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        unknown = re.match(r"unknown options? (\S+)", message)
        if unknown:
            known = sorted(
                {
                    option
                    for parser in _all_parsers(self)
                    for action in parser._actions
                    for option in action.option_strings
                }
            )
            close = difflib.get_close_matches(unknown.group(1).split("=", 1)[0], known, n=1)
            if close:
                message += f" (did you mean {close[0]}?)"
        choice = re.match(r"argument \w+: invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            names = re.findall(r"'([^']*)'", choice.group(2))
            close = difflib.get_close_matches(choice.group(1), names, n=1)
            if close:
                message += f" (did you mean {close[0]}?)"
        message = re.sub(r"^argument (-[-\w]+(?:/-[-\w]+)*): ", r"\1: ", message)
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def unknown_options(tokens: list[str]) -> str:
    """What argparse calls unrecognized arguments, options first (the likelier typo)."""
    options = [t for t in tokens if t.startswith("-")]
    others = [t for t in tokens if not t.startswith("-")]
    if options:
        from blobhouse.settings import RETIRED

        said = f"unknown option{'s' if len(options) > 1 else ''} {' '.join(options)}"
        for option in options:  # an option that was replaced: say by what
            name = option.split("=")[0].lstrip("-").replace("-", "_")
            if name in RETIRED:
                said += f" (replaced by --{RETIRED[name][0].replace('_', '-')})"
        return said
    return f"unexpected argument{'s' if len(others) > 1 else ''} {' '.join(others)}"


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


def _all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)
