"""Lance and ``fork()``: pylance's runtime threads do not survive a fork, and a child forked
from a process whose Lance runtime had started crashes or hangs at random in its own Lance
reads (measured with pylance 14.0.2: a segfault in about one child of five).

Readers that must work in forked children (DataLoader workers fork by default on Linux) keep
the parent from starting Lance: what the parent needs from the table is computed in a fresh
Python process (:func:`in_fresh_process`). A child forked after Lance had started
(:func:`forked_after_lance`) never calls Lance itself: it reads through a
:class:`FreshProcess` of its own, at the cost of a copy of what it reads.

>>> lance_is_running() in (True, False)
True
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from blobhouse.errors import BlobhouseError

T = TypeVar("T")
_TASKS = Path("/proc/self/task")
# the helper imports blobhouse from where this process did: a script may have found it on a
# sys.path of its own (a vendored copy), which a new interpreter does not inherit; and not
# from its working directory ("" on the path of ``python -c``)
_BOOT = """
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
if sys.argv[1] not in sys.path:
    sys.path.insert(0, sys.argv[1])
from blobhouse.io.forks import _serve
_serve()
"""
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


def forked_after_lance() -> bool:
    """Whether this process was forked from one where Lance had started: Lance must not be
    called here."""
    return _forked_after_lance


class FreshProcess:
    """A new Python interpreter that runs functions for this one, one call at a time (calls
    from several threads wait their turn): functions, arguments and results travel as pickles
    through pipes (not the command line: storage options may hold secrets), and a function's
    exception is raised here. The interpreter exits when this object is closed or this process
    ends.

    >>> with FreshProcess() as helper:
    ...     helper.call(sorted, [3, 1, 2]), helper.call(max, 4, 9)
    ([1, 2, 3], 9)
    """

    def __init__(self) -> None:
        # its stderr: a pipe nobody reads could fill; a file is read when it fails
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._child = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(Path(__file__).resolve().parents[2])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
        )
        self._lock = threading.Lock()

    def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` in the fresh interpreter."""
        with self._lock:
            try:
                pickle.dump((function, args, kwargs), self._child.stdin)
                self._child.stdin.flush()
                ok, value = pickle.load(self._child.stdout)
            except (BrokenPipeError, EOFError, pickle.UnpicklingError):
                raise self._died() from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.stdin.close()  # the helper's loop ends at end of input
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        self._child.stdout.close()
        self._errors.close()

    def __enter__(self) -> FreshProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _died(self) -> BlobhouseError:
        try:
            code = self._child.wait(timeout=5)  # it is exiting: its code and last words
        except subprocess.TimeoutExpired:  # alive but talking nonsense: it cannot serve on
            self._child.kill()
            code = self._child.wait()
        self._errors.seek(0)
        said = self._errors.read().decode(errors="replace").strip()[-2000:]
        return BlobhouseError(f"the helper process exited with {code}: {said}")


def in_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` run in a new Python interpreter (a :class:`FreshProcess`), so that
    this process does not start Lance.

    >>> in_fresh_process(sorted, [3, 1, 2])
    [1, 2, 3]
    """
    with FreshProcess() as helper:
        return helper.call(function, *args)


def _serve() -> None:
    """The helper's side of :class:`FreshProcess`: calls until the input ends."""
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the functions print goes to stderr, not into the replies
    while True:
        try:
            function, args, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = pickle.dumps((True, function(*args, **kwargs)))
        except Exception as error:
            try:
                reply = pickle.dumps((False, error))
            except Exception:  # an exception that does not pickle: its type and message
                reply = pickle.dumps((False, BlobhouseError(f"{type(error).__name__}: {error}")))
        replies.write(reply)
        replies.flush()


def _before_fork() -> None:
    global _lance_at_fork
    _lance_at_fork = "lance" in sys.modules and lance_is_running()


def _after_fork_in_child() -> None:
    global _forked_after_lance
    _forked_after_lance = _forked_after_lance or _lance_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
