"""Ctrl-C held over a commit's last steps: Python raises ``KeyboardInterrupt`` only once
Lance's commit call returns, so a Ctrl-C pressed during the commit lands right after it. Raised
there, it would skip what the commit still has to record (the payloads it added to the store
index, the objects it hands to the table): the version stays, its records are lost. Held, it
is raised once they are written; pressed twice, at once.

>>> with HeldInterrupts() as held:
...     held.arm()  # from here on, a Ctrl-C waits for the block's end
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class HeldInterrupts:
    """Hold SIGINT from :meth:`arm` to the end of the block, then deliver it to the handler
    that was there; before :meth:`arm`, and a second time, it is delivered at once. Outside
    the main thread (where Python never delivers SIGINT) it holds nothing."""

    def __init__(self) -> None:
        self._armed = False
        self._caught = False
        self._previous: Any = None
        self._installed = False
        self._note: str | None = None

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def arm(self) -> None:
        """Hold a Ctrl-C from now on (right before the commit)."""
        self._armed = True

    def landed(self, note: str) -> None:
        """Say what the commit did, on the KeyboardInterrupt a held Ctrl-C raises (the caller
        cannot tell otherwise that its change is in the table)."""
        self._note = note

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._armed and not self._caught:
            self._caught = True
            return
        self._restore()
        signal.raise_signal(signum)  # the previous handler's to answer

    def _restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def __exit__(self, *exc: object) -> None:
        self._restore()
        if not self._caught:
            return
        if self._previous is not signal.default_int_handler or self._note is None:
            signal.raise_signal(signal.SIGINT)  # Spark's handler, say: it answers
            return
        interrupt = KeyboardInterrupt()
        interrupt.add_note(self._note)
        raise interrupt


_INTERRUPT_HOOKS: list[Callable[[], None]] = []


def when_interrupted(hook: Callable[[], None]) -> Callable[[], None]:
    """Call ``hook`` as soon as Ctrl-C stops a Spark job, before the jobs are cancelled (the
    command line mutes Spark's output there); returns a function that unregisters it."""
    _INTERRUPT_HOOKS.append(hook)
    return lambda: _INTERRUPT_HOOKS.remove(hook) if hook in _INTERRUPT_HOOKS else None
