"""The ``blobhouse`` command: ``demo``, ``ingest``, the table services ``stats``, ``verify``,
``gc``, ``compact`` and ``relocate``.

The library does the work; this module parses options, prints reports (:mod:`blobhouse.console`)
and turns failures into one line on stderr: ``error: ...`` (exit 2 for bad input and other
expected failures, 1 for anything unexpected; ``--debug`` adds the traceback) and
``interrupted: ...`` on Ctrl-C (exit 130).
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    os.write(2, b"interrupted while starting; nothing was changed\n")
    os._exit(130)


# A Ctrl-C before main() runs (Python loading this module: its imports, then its classes and
# functions) is one line and exit 130, never a traceback through a half-defined module. Only
# when this module is the process's command; main() restores Python's own handler.
_STARTING_AS_COMMAND = __name__ == "__main__" or os.path.basename(sys.argv[0]) == "blobhouse"
if _STARTING_AS_COMMAND and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import argparse  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import difflib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

from blobhouse.commit.interrupts import HeldInterrupts  # noqa: E402
from blobhouse.console import (  # noqa: E402
    ProgressBars,
    format_value,
    mb,
    print_report,
    when_interrupted,
)
from blobhouse.errors import BlobhouseError, InvalidInputError, MissingExtraError  # noqa: E402

# the storage layer, Lance, pyarrow and Spark are imported where a command runs (loading them
# takes most of a second): --help and an argument error answer without them

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C

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

LOG4J_PROPERTIES = """\
# blobhouse's command line: Spark's JVM logs nothing on the terminal (errors reach Python and
# are printed as one line); --debug keeps Spark's own logging
status = off
rootLogger.level = off
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %m%n
logger.apache.name = org.apache
logger.apache.level = off
logger.sparkproject.name = org.sparkproject
logger.sparkproject.level = off
logger.netty.name = io.netty
logger.netty.level = off
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``blobhouse`` command."""
    if _STARTING_AS_COMMAND:
        _CTRL_C.install()
    elif signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        run = _CTRL_C.run
        if run is None:  # before a command began (parsing, Spark's start is inside)
            print("interrupted while starting; nothing was changed", file=sys.stderr, flush=True)
            code = INTERRUPTED
        else:  # as the command ended: what is true is checked as for any Ctrl-C
            code = run.interrupted()
    if _STARTING_AS_COMMAND:
        _CTRL_C.settle(code)
    return code


class _CtrlC:
    """SIGINT in the ``blobhouse`` process. The first Ctrl-C raises ``KeyboardInterrupt`` (after
    Spark's own handler, once Spark put one in front: it cancels the jobs); while the command
    says what is true, more are absorbed (a held key repeats, and a second exception would cut
    that line), and one :data:`FORCE_AFTER` seconds later ends the process at once; once the
    command has its exit code, Ctrl-C ends the process with that code."""

    FORCE_AFTER = 2.0

    def __init__(self) -> None:
        self.first: float | None = None  # when the first Ctrl-C came
        self.code: int | None = None  # the command's exit code, once it has one
        self.spark: Callable | None = None  # Spark's handler, which it installs as it starts
        self.run: Run | None = None  # the command's run, once it began

    def __call__(self, signum: int, frame: object) -> None:
        if self.code is not None:
            os._exit(self.code)
        if self.first is None:
            self.first = time.monotonic()
            if self.spark is not None:  # cancels Spark's jobs, raises KeyboardInterrupt
                with contextlib.suppress(Exception):  # (Spark stopped already, say)
                    self.spark(signum, frame)
            raise KeyboardInterrupt
        if time.monotonic() - self.first >= self.FORCE_AFTER:
            os.write(2, b"interrupted again: stopped at once\n")
            os._exit(INTERRUPTED)

    def install(self) -> None:
        """Put this handler in front, after Spark's if Spark put its own there since."""
        if threading.current_thread() is not threading.main_thread():
            return  # (a status from another thread) Python handles signals in the main one
        current = signal.getsignal(signal.SIGINT)
        if current is self or isinstance(getattr(current, "__self__", None), HeldInterrupts):
            return  # (a commit holds Ctrl-C until its records are written: it puts ours back)
        if callable(current) and current not in (
            signal.default_int_handler,
            _interrupted_while_starting,
        ):
            self.spark = current
        signal.signal(signal.SIGINT, self)

    def absorb(self) -> None:
        """A Ctrl-C is being answered (it may have come through Spark's handler): the next
        ones are absorbed."""
        self.install()
        if self.first is None:
            self.first = time.monotonic()

    def settle(self, code: int) -> None:
        """The command ended with ``code``: a Ctrl-C from now on ends the process with it,
        and one while Python finalizes (which puts back the default handler: the process
        would die of the signal) is ignored."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.code = code
        self.install()
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)


_CTRL_C = _CtrlC()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's parser, with a suggestion
        _subparser(parser, args.command).error(_unknown(unknown))
    run = Run(args)
    with _logging(args.debug), ProgressBars() as bars:
        run.bars = bars
        if _STARTING_AS_COMMAND:
            _CTRL_C.run = run
        try:
            code = COMMANDS[args.command](args, run)
        except KeyboardInterrupt:
            code = run.interrupted()
        except BrokenPipeError:  # `blobhouse stats T | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
            code = 0
        except Exception as exc:
            code = run.failed(exc)
        if _STARTING_AS_COMMAND:
            _CTRL_C.settle(code)  # closing the bars and logging below ends with it too
        return code


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
        help="create the table (the default; refused if it exists), append to it, or "
        "overwrite its rows with a new version",
    )


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
        "--repack-threshold",
        type=_setting("repack_threshold"),
        default=None,
        help="repack store packs of which less than this fraction is referenced (default 0.5)",
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


# argparse types of the options that set a setting: its text parsed by the setting's schema
# (blobhouse.settings), so a bad value is a bad command line (exit 2) naming its option, what
# it takes and the value, before anything runs


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


def _unknown(tokens: list[str]) -> str:
    """What argparse calls unrecognized arguments, options first (the likelier typo)."""
    options = [t for t in tokens if t.startswith("-")]
    others = [t for t in tokens if not t.startswith("-")]
    if options:
        return f"unknown option{'s' if len(options) > 1 else ''} {' '.join(options)}"
    return f"unexpected argument{'s' if len(others) > 1 else ''} {' '.join(others)}"


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
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


@dataclass
class Run:
    """One command's run: what it is doing (for the line Ctrl-C prints) and the table it
    writes, with the version it started from."""

    args: argparse.Namespace
    bars: ProgressBars | None = None
    doing: str = ""
    writes: str | None = None  # the table a writing command changes
    storage_options: dict[str, str] | None = field(
        default=None, repr=False
    )  # credentials: never printed
    branch: str | None = None
    version_before: int | None = None
    existed_before: bool = True
    started: float = field(default_factory=time.time)
    had_spark: bool = field(default_factory=lambda: _spark_context() is not None)

    def status(self, message: str) -> None:
        """A line on stderr; also what an interrupt reports as happening."""
        if _STARTING_AS_COMMAND:  # Spark, once started, put its own handler in front
            _CTRL_C.install()
        self.doing = message.removesuffix(" ...").removesuffix("...")
        if self.bars is not None:
            self.bars.message(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def progress(self, step: str, done: int, total: int) -> None:
        if self.bars is not None:
            self.bars(step, done, total)

    def will_write(self, uri: str, options, branch: str | None = None) -> None:
        """Remember ``uri``'s version now, to tell after Ctrl-C what was committed."""
        from blobhouse.storage import is_local, uri_to_path

        self.writes, self.storage_options, self.branch = uri, options, branch
        self.version_before = _version_of(uri, options, branch)
        self.existed_before = not is_local(uri) or os.path.exists(uri_to_path(uri))

    def interrupted(self) -> int:
        """After Ctrl-C: stop Spark quietly, then one line saying what was true."""
        if _STARTING_AS_COMMAND:  # Spark's handler would raise again: more are absorbed
            _CTRL_C.absorb()
        if self.bars is not None:
            self.bars.close()
        _silence_python_logging()
        _SPARK_OUTPUT.mute()
        stopped = _stop_spark() if not self.had_spark else False
        print(
            f"interrupted{': ' + self.doing if self.doing else ''}; {self._outcome(stopped)}",
            file=sys.stderr,
            flush=True,
        )
        return INTERRUPTED

    def _outcome(self, spark_stopped: bool) -> str:
        command = self.args.command
        if command in ("stats", "verify") or (command == "gc" and self.args.dry_run):
            return "nothing was changed"
        if command == "gc":
            return (
                "the table reads as before (gc removes only what no retained version "
                "references); run gc again to finish"
            )
        if self.writes is None:
            return "nothing was committed"
        try:
            after = _version_of(self.writes, self.storage_options, self.branch)
        except Exception:
            return f"could not check {self.writes} afterwards"
        if after == self.version_before:
            if after is None:
                # Spark stopped on this machine, or none ran: no task still writes there
                if _spark_context() is None and (self._local_master() or not spark_stopped):
                    _tidy_failed_create(self.writes, self.started, self.existed_before)
                return "nothing was committed (no table was created)"
            return f"nothing was committed ({self.writes} stays at version {after})"
        return f"version {after} of {self.writes} had been committed before that"

    def _local_master(self) -> bool:
        return getattr(self.args, "master", "local").startswith("local")

    def failed(self, exc: BaseException) -> int:
        """An error as one line on stderr (with the traceback under ``--debug``)."""
        if self.bars is not None:
            self.bars.close()
        _silence_python_logging()
        if self.args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        message = one_line(exc, self.args.command)  # may ask the JVM: before Spark stops
        if not self.had_spark:
            _SPARK_OUTPUT.mute()
            _stop_spark()
        print(f"error: {message}", file=sys.stderr, flush=True)
        return 2 if _expected(exc) else 1


def one_line(exc: BaseException, command: str = "") -> str:
    """The message of ``exc`` as one line: a blobhouse error raised in a Spark task or
    process is found inside the Java exception that carries it.

    >>> one_line(ValueError("bad\\nthing"))
    'ValueError: bad (--debug prints the traceback)'
    """
    if _missing_spark(exc):
        return f'blobhouse {command or "on Spark"} needs Spark: pip install "blobhouse[spark]"'
    if isinstance(exc, BlobhouseError):
        return _first_line(str(exc))
    text = str(exc)
    inner = re.findall(r"blobhouse\.errors\.\w+: ([^\n]+)", text)
    if inner:
        return inner[-1].strip()
    if "JAVA_GATEWAY_EXITED" in text:
        said = _SPARK_OUTPUT.startup_error()
        return "could not start Spark: " + (
            said or "its Java process exited (is Java 17 installed, on PATH or in JAVA_HOME?)"
        )
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString())
    line = _first_line(text)
    return f"{type(exc).__name__}: {line} (--debug prints the traceback)"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no message)"
    return line[:497] + "..." if len(line) > 500 else line


def _expected(exc: BaseException) -> bool:
    """Bad input and environments (exit 2), as opposed to bugs (exit 1)."""
    return (
        isinstance(exc, BlobhouseError | OSError)
        or _missing_spark(exc)
        or re.search(r"blobhouse\.errors\.\w+: |JAVA_GATEWAY_EXITED", str(exc)) is not None
    )


def _missing_spark(exc: BaseException) -> bool:
    """pyspark is not installed (an old one is a MissingExtraError saying which it found)."""
    if isinstance(exc, MissingExtraError):
        return isinstance(exc.__cause__, ImportError)
    return isinstance(exc, ImportError) and (getattr(exc, "name", None) or "").split(".")[0] in (
        "pyspark",
        "py4j",
    )


# -- commands ---------------------------------------------------------------------------------


def _demo(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.demo import run_demo

    if args.rows < 1:
        raise InvalidInputError("--rows must be at least 1")
    _check_master(args.master)
    conf = _spark_conf(args)
    if args.local_s3:
        from blobhouse.testing import LocalS3Server

        with LocalS3Server() as s3:
            run.status(f"S3-compatible server on {s3.endpoint}")
            out = f"s3://{s3.bucket('blobhouse-demo')}/{args.out.rstrip('/').rsplit('/', 1)[-1]}"
            with _spark_output(args):
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
        options = _storage_options(args)
        run.will_write(args.out, options)
        with _spark_output(args):
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
    options = _storage_options(args)
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
    _check_master(args.master)
    run.will_write(args.table, options)
    with _spark_output(args):
        spark = _start_spark(args, run)
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

    options = _storage_options(args)
    run.doing = f"importing {args.dataset}"
    run.will_write(args.table, options)
    done = ingest_lerobot(
        args.dataset, args.table, mode=args.mode, storage_options=options, progress=run.progress
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


def _stats(args: argparse.Namespace, run: Run) -> int:
    run.doing = f"reading the statistics of {args.table}"
    report = _open(args).stats()
    if args.json:
        _print_json(report)
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
        storage_options=_storage_options(args),
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
    options = {
        "target_rows": args.target_rows,
        "target_bytes": None if args.target_mb is None else round(args.target_mb * 1e6),
        "deleted_fraction": args.deleted_fraction,
        "repack_threshold": args.repack_threshold,
    }
    table = _open(args)
    run.will_write(args.table, _storage_options(args), args.branch)
    run.doing = f"compacting {args.table}"
    report = table.compact(
        progress=run.progress, **{k: v for k, v in options.items() if v is not None}
    )
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
    from blobhouse.errors import MovedTableWarning
    from blobhouse.maintenance.versions import VersionGraph

    with warnings.catch_warnings():  # what the command is about: no warning to relocate
        warnings.simplefilter("ignore", MovedTableWarning)
        table = _open(args)
    run.will_write(args.table, _storage_options(args))
    run.doing = f"relocating {args.table}"
    graph = VersionGraph.of(table)
    latest = [table.checkout(None, branch=b or "main") for b in {r.branch for r in graph.versions}]
    moved = {t.branch: t.moved_from for t in latest if t.moved_from is not None}
    if moved:
        table.relocate()
    report = {
        "table": args.table,
        "relocated": {branch or "main": old for branch, old in moved.items()},
        "unreadable": {branch: reason for branch, reason in graph.unreadable},
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
    return 1 if graph.unreadable else 0


def _properties(args: argparse.Namespace, run: Run) -> int:
    from blobhouse.properties import parse_settings

    table = _open(args)
    if args.set:
        names = [item.split("=", 1)[0] for item in args.set]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidInputError(f"--set names {twice} more than once: give each once")
        changes = parse_settings(_pairs(args.set, "--set", "NAME=VALUE"))
        run.will_write(args.table, _storage_options(args), args.branch)
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
    "stats": _stats,
    "verify": _verify,
    "gc": _gc,
    "compact": _compact,
    "relocate": _relocate,
    "properties": _properties,
}


# -- helpers ----------------------------------------------------------------------------------


def _open(args: argparse.Namespace):
    """The table ``args.table``, reached with the command's storage options."""
    from blobhouse.table import open_table

    branch = getattr(args, "branch", None)
    return open_table(args.table, storage_options=_storage_options(args), branch=branch)


def _close(run: Run) -> None:
    """Finish the progress bars before a report goes to stdout."""
    if run.bars is not None:
        run.bars.close()


def _list(value: str) -> list[str]:
    """A comma-separated option's items."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _print_json(report: Mapping) -> None:
    print(json.dumps(report, indent=2, default=str))


def _storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    from blobhouse.storage import checked_options

    return checked_options(_pairs(args.storage_option, "--storage-option", "NAME=VALUE"))


def _pairs(items: list[str], flag: str, shape: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in items]
    bad = [item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2 or not pair[0]]
    if bad:
        raise InvalidInputError(f"{flag} must be {shape}, got {bad[0]!r}")
    return dict(pairs)


def _version_of(uri: str, options, branch: str | None = None) -> int | None:
    from blobhouse.table import open_table

    try:
        return open_table(uri, storage_options=options, branch=branch).version
    except Exception:  # no table (or none readable): only a message depends on it
        return None


def _spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """Spark settings of a command: quiet (no JVM logs, no console progress bar: ours shows
    the tasks) unless ``--debug``; then the user's ``--conf`` on top."""
    given = _pairs(args.conf, "--conf", "KEY=VALUE")
    conf = {"spark.ui.showConsoleProgress": "false"}
    if not args.debug:
        quiet = f"-Dlog4j2.configurationFile={_log4j_file()}"
        theirs = given.pop("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{quiet} {theirs}".strip()
    return {**conf, **given}


_LOG4J: list[str] = []


def _log4j_file() -> str:
    if not _LOG4J:
        fd, path = tempfile.mkstemp(prefix="blobhouse-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as f:
            f.write(LOG4J_PROPERTIES)
        atexit.register(lambda: os.path.exists(path) and os.remove(path))
        _LOG4J.append(path)
    return _LOG4J[0]


def _check_master(master: str) -> None:
    """A ``spark://`` master that does not answer is an error now, not after Spark's minute of
    retries."""
    if not master.startswith("spark://"):
        return
    problem: OSError | None = None
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or address, int(port or 7077)), timeout=5).close()
            return
        except ValueError:
            raise InvalidInputError(f"--master {master}: {address!r} is not host:port") from None
        except OSError as exc:
            problem = exc
    reason = getattr(problem, "strerror", None) or str(problem) or type(problem).__name__
    raise InvalidInputError(
        f"cannot reach the Spark master {master}: {reason} (is it running? see "
        "docs/spark-cluster.md)"
    )


class _SparkOutput:
    """What Spark's JVM (and the Python workers it starts) print on stderr, relayed line by
    line: held back while the JVM starts (a failed start becomes one line of the error instead),
    without the JVM's notice about incubator modules, and nothing once Ctrl-C was pressed
    (killed tasks' workers print broken-pipe tracebacks)."""

    NOISE = (b"WARNING: Using incubator modules",)

    def __init__(self) -> None:
        self.muted = threading.Event()
        self.lock = threading.Lock()
        self.held: list[bytes] | None = None  # lines of a start in progress
        self.failed_start: list[str] = []

    def mute(self) -> None:
        self.muted.set()

    def launch(self, original, conf, popen_kwargs):
        """pyspark's ``launch_gateway``, with the JVM's stderr through this relay. A start
        that fails or is interrupted kills the JVM: pyspark removes the file the JVM reports
        its port in, and a JVM that cannot write it never exits (its gateway thread waits)."""
        import pyspark.java_gateway as java_gateway

        read, write = os.pipe()
        with self.lock:
            self.held = []
        ended = threading.Event()
        threading.Thread(target=self._copy, args=(read, ended), daemon=True).start()
        popen, started = getattr(java_gateway, "Popen", None), []

        def remembered(*args, **kwargs):
            started.append(popen(*args, **kwargs))
            return started[-1]

        if popen is not None:
            java_gateway.Popen = remembered
        try:
            gateway = original(conf, {**(popen_kwargs or {}), "stderr": write})
        except BaseException:
            for process in started:
                _kill_tree(process.pid)
            os.close(write)
            ended.wait(timeout=5)  # the JVM exited: its last lines are in
            with self.lock:
                self.failed_start = [line.decode(errors="replace") for line in self.held or []]
                self.held = None
            raise
        finally:
            if popen is not None:
                java_gateway.Popen = popen
        os.close(write)  # the JVM holds its own copy
        with self.lock:
            held, self.held = self.held or [], None
            for line in held:
                self._write(line)
        return gateway

    def startup_error(self) -> str | None:
        """The line saying why the JVM did not start, if it said."""
        for line in self.failed_start:
            if re.search(r"(Exception|Error)\b", line):
                return line.strip().removeprefix('Exception in thread "main" ')
        return None

    def _copy(self, fd: int, ended: threading.Event) -> None:
        with contextlib.suppress(Exception), os.fdopen(fd, "rb") as stream:
            for line in iter(stream.readline, b""):
                with self.lock:
                    if self.held is not None:
                        self.held.append(line)
                    else:
                        self._write(line)
        ended.set()

    def _write(self, line: bytes) -> None:
        if not self.muted.is_set() and not line.startswith(self.NOISE):
            with contextlib.suppress(OSError):
                os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, line)


_SPARK_OUTPUT = _SparkOutput()


@contextlib.contextmanager
def _spark_output(args: argparse.Namespace) -> Iterator[None]:
    """While a command starts Spark (unless ``--debug``): the JVM's stderr goes through
    :class:`_SparkOutput` (pyspark's ``launch_gateway`` takes ``popen_kwargs`` for this)."""
    try:
        import pyspark.core.context as context_module
    except ImportError:
        yield
        return
    original = getattr(context_module, "launch_gateway", None)
    if args.debug or original is None:
        yield
        return

    def launch(conf=None, popen_kwargs=None):
        return _SPARK_OUTPUT.launch(original, conf, popen_kwargs)

    context_module.launch_gateway = launch
    unregister = when_interrupted(_SPARK_OUTPUT.mute)
    try:
        yield
    finally:
        context_module.launch_gateway = original
        unregister()


def _start_spark(args: argparse.Namespace, run: Run):
    import blobhouse.spark as bs

    run.status(f"starting Spark ({args.master}) ...")
    spark = bs.local_session(args.master, conf=_spark_conf(args))
    bs.register(spark, storage_options=_storage_options(args))
    return spark


def _kill_tree(pid: int) -> None:
    """Kill process ``pid`` and every process below it: spark-submit's shell runs a launcher
    JVM before Spark's, and killing the shell alone leaves that one running."""
    below, frontier = set(), {pid}
    parents = _parents()
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    for each in (pid, *below):
        with contextlib.suppress(OSError):
            os.kill(each, signal.SIGKILL)


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc (empty where there is none: the shell alone goes)."""
    parents = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with (
                    contextlib.suppress(OSError, IndexError, ValueError),
                    open(f"/proc/{entry}/stat") as stat,
                ):
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    return parents


def _spark_context():
    """The running SparkContext, if pyspark was imported and started one."""
    module = sys.modules.get("pyspark")
    return getattr(getattr(module, "SparkContext", None), "_active_spark_context", None)


def _stop_spark() -> bool:
    """Stop the Spark session this command started (quietly); whether one was stopped."""
    context = _spark_context()
    if context is None:
        return False
    with contextlib.suppress(Exception):
        context.stop()
    return True


def _tidy_failed_create(uri: str, since: float, existed: bool) -> None:
    """After an interrupted create on a local path with Spark stopped: the abort markers the
    write left (``data/aborted-*``) and the empty directories it made go too, so the path is as
    before (the write's staged files were removed by its abort)."""
    from blobhouse.storage import is_local, uri_to_path

    if not is_local(uri):
        return
    root = uri_to_path(uri)
    data = os.path.join(root, "data")
    if os.path.isdir(data):
        for name in os.listdir(data):
            path = os.path.join(data, name)
            if name.startswith("aborted-") and os.path.getmtime(path) >= since - 1:
                with contextlib.suppress(OSError):
                    os.remove(path)
    for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        made_now = os.path.getmtime(folder) >= since - 1  # (a removal touched it)
        if (folder != root and made_now) or (folder == root and not existed):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only empty ones


class _OneLineLogs(logging.Handler):
    """Python logging on the command line: py4j's and pyspark's records (its tracebacks of
    connections a Ctrl-C cut) are dropped, others print as ``warning: ...`` lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.silent = False

    def emit(self, record: logging.LogRecord) -> None:
        noisy = record.name.startswith(("py4j", "pyspark")) or (
            f"{os.sep}py4j{os.sep}" in (record.pathname or "")
        )
        if self.silent or noisy:
            return
        print(f"warning: {_first_line(record.getMessage())}", file=sys.stderr, flush=True)


_HANDLERS: list[_OneLineLogs] = []


@contextlib.contextmanager
def _logging(debug: bool) -> Iterator[None]:
    """Python logging for one command; with ``--debug`` Python's defaults stay."""
    if debug:
        yield
        return
    handler = _OneLineLogs()
    root = logging.getLogger()
    root.addHandler(handler)  # a handler of its own: logging.exception adds none to stderr
    _HANDLERS.append(handler)
    unregister = when_interrupted(_silence_python_logging)
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning
    try:
        yield
    finally:
        warnings.showwarning = shown
        unregister()
        _HANDLERS.remove(handler)
        root.removeHandler(handler)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A Python warning as one line, ``warning: ...``, without the source line it came from."""
    print(f"warning: {_first_line(str(message))}", file=sys.stderr, flush=True)


def _silence_python_logging() -> None:
    for handler in _HANDLERS:
        handler.silent = True


if __name__ == "__main__":
    sys.exit(main())
