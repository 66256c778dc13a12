"""Lance and ``fork()``: pylance's runtime threads do not survive a fork, and a child forked
from a process whose Lance runtime had started crashes or hangs at random in its own Lance
reads (measured with pylance 14.0.2: a segfault in about one child of five).

Readers that must work in forked children (DataLoader workers fork by default on Linux) keep
the parent from starting Lance: what the parent needs from the table is computed in a fresh
Python process (:func:`in_fresh_process`). A child forked after Lance had started refuses to
read (:func:`check_not_forked_after_lance`) with an error saying what to do, rather than
crashing.

>>> lance_is_running() in (True, False)
True
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from blobhouse.errors import BlobhouseError, ForkedAfterLanceError

T = TypeVar("T")
_TASKS = Path("/proc/self/task")
_lance_at_fork = False  # whether Lance had started in this process when it last forked
_forked_after_lance = False  # whether this process is a fork of one where Lance had started


def lance_is_running() -> bool:
    """Whether Lance's runtime has started in this process (its threads exist); where threads
    cannot be listed (not Linux), assumed so."""
    try:
        tasks = list(_TASKS.iterdir())
    except OSError:
        return True
    for task in tasks:
        try:
            if (task / "comm").read_text().startswith("lance_"):
                return True
        except OSError:
            continue  # a thread that ended meanwhile
    return False


def check_not_forked_after_lance(what: str) -> None:
    """Raises :class:`ForkedAfterLanceError` in a process forked after Lance had started."""
    if _forked_after_lance:
        raise ForkedAfterLanceError(
            f"{what} is in a process forked from one that had already used Lance, whose reads "
            "crash or hang at random after a fork (pylance is not fork-safe). Start workers "
            "with spawn or forkserver (DataLoader(..., multiprocessing_context='forkserver')), "
            "or start them before anything in the parent process uses Lance"
        )


def in_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` run in a new Python interpreter, so that this process does not start
    Lance; the function, its arguments and its result travel as pickles (through pipes, not the
    command line: storage options may hold secrets). Its exception is raised here.

    >>> in_fresh_process(sorted, [3, 1, 2])
    [1, 2, 3]
    """
    done = subprocess.run(
        [sys.executable, "-c", "from blobhouse.forks import _serve; _serve()"],
        input=pickle.dumps((function, args)),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        raise BlobhouseError(
            f"the helper process exited with {done.returncode}: "
            f"{done.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    ok, value = pickle.loads(done.stdout)
    if not ok:
        raise value
    return value


def _serve() -> None:
    """The helper's side of :func:`in_fresh_process`."""
    function, args = pickle.loads(sys.stdin.buffer.read())
    try:
        reply = pickle.dumps((True, function(*args)))
    except Exception as error:
        try:
            reply = pickle.dumps((False, error))
        except Exception:  # an exception that does not pickle: its type and message
            reply = pickle.dumps((False, BlobhouseError(f"{type(error).__name__}: {error}")))
    sys.stdout.buffer.write(reply)


def _before_fork() -> None:
    global _lance_at_fork
    _lance_at_fork = "lance" in sys.modules and lance_is_running()


def _after_fork_in_child() -> None:
    global _forked_after_lance
    _forked_after_lance = _forked_after_lance or _lance_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
