"""A Ctrl-C while the ``blobhouse`` command loads (its imports, then its classes and functions)
is one line and exit 130, never a traceback through a half-defined module. Imported first by
:mod:`blobhouse.cli`; only when that is the process's command (the ``blobhouse`` script, or
``python -m blobhouse.cli``, during whose import ``sys.argv[0]`` is ``"-m"``); ``main()``
restores Python's own handler."""

from __future__ import annotations

import os
import signal
import sys


def interrupted_while_starting(signum, frame) -> None:
    os.write(2, b"interrupted while starting; nothing was changed\n")
    os._exit(130)


STARTING_AS_COMMAND = sys.argv[:1] == ["-m"] or os.path.basename(sys.argv[0]) == "blobhouse"
if STARTING_AS_COMMAND and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted_while_starting)
