"""The ``blobhouse`` command: ``demo``, ``ingest``, the table services ``stats``, ``verify``,
``gc``, ``compact`` and ``relocate``.

The library does the work; the command parses options (:mod:`~blobhouse.cli.parser`), runs one
of its commands (:mod:`~blobhouse.cli.commands`) in a run (:mod:`~blobhouse.cli.run`: Spark
started and stopped, errors, Ctrl-C, logging), prints reports (:mod:`~blobhouse.cli.console`) and
turns failures into one line on stderr: ``error: ...`` (exit 2 for bad input and other
expected failures, 1 for anything unexpected; ``--debug`` adds the traceback) and
``interrupted: ...`` on Ctrl-C (exit 130).
"""

from __future__ import annotations

# first, so that a Ctrl-C while the rest loads is one line (blobhouse.cli.starting)
from blobhouse.cli.starting import STARTING_AS_COMMAND, interrupted_while_starting  # isort: skip

import os
import signal
import sys

from blobhouse.cli.commands import COMMANDS
from blobhouse.cli.console import ProgressBars
from blobhouse.cli.parser import build_parser, subparser, unknown_options
from blobhouse.cli.run import CTRL_C, INTERRUPTED, Run, command_logging

# the storage layer, Lance, pyarrow and Spark are imported where a command runs (loading them
# takes most of a second): --help and an argument error answer without them


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``blobhouse`` command."""
    if STARTING_AS_COMMAND:
        CTRL_C.install()
    elif signal.getsignal(signal.SIGINT) is interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        run = CTRL_C.run
        if run is None:  # before a command began (parsing, Spark's start is inside)
            print("interrupted while starting; nothing was changed", file=sys.stderr, flush=True)
            code = INTERRUPTED
        else:  # as the command ended: what is true is checked as for any Ctrl-C
            code = run.interrupted()
    if STARTING_AS_COMMAND:
        CTRL_C.settle(code)
    return code


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's parser, with a suggestion
        subparser(parser, args.command).error(unknown_options(unknown))
    run = Run(args)
    with command_logging(args.debug), ProgressBars() as bars:
        run.bars = bars
        if STARTING_AS_COMMAND:
            CTRL_C.run = run
        try:
            code = COMMANDS[args.command](args, run)
        except KeyboardInterrupt:
            code = run.interrupted()
        except BrokenPipeError:  # `blobhouse stats T | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
            code = 0
        except Exception as exc:
            code = run.failed(exc)
        if STARTING_AS_COMMAND:
            CTRL_C.settle(code)  # closing the bars and logging below ends with it too
        return code


# argparse types of the options that set a setting: its text parsed by the setting's schema
# (blobhouse.settings), so a bad value is a bad command line (exit 2) naming its option, what
# it takes and the value, before anything runs


# -- commands ---------------------------------------------------------------------------------


# -- helpers ----------------------------------------------------------------------------------
