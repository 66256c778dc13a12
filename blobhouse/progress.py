"""Progress of long steps: one event type that every service, import, export and Spark job
reports to, with the units done, and the rows and bytes behind them when the step knows them.

A ``progress`` callback takes one :class:`ProgressEvent`; one written for earlier releases,
``progress(step, done, total)``, is still called that way (:func:`progress_to` tells them
apart by the arguments they take).

>>> events = []
>>> report = progress_to(events.append)
>>> report("verify", 0, 2)
>>> report("verify", 2, 2, rows=10, bytes=4_000_000)
>>> events[-1].step, events[-1].done, events[-1].total, events[-1].rows, events[-1].bytes
('verify', 2, 2, 10, 4000000)
>>> progress_to(lambda step, done, total: print(step, done, total))("gc", 1, 3, rows=5)
gc 1 3
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressEvent:
    """Where a long step is: ``done`` of ``total`` units (fragments, files, frames, Spark
    tasks), the ``rows`` and ``bytes`` those units held when the step counts them (None when
    it does not), and the ``seconds`` since the step began.

    >>> ProgressEvent("write", 3, 8, rows=900, bytes=50_000_000, seconds=2.0).bytes_per_second
    25000000.0
    """

    step: str
    done: int
    total: int
    rows: int | None = None
    bytes: int | None = None
    seconds: float = 0.0

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def rows_per_second(self) -> float | None:
        return _rate(self.rows, self.seconds)

    @property
    def bytes_per_second(self) -> float | None:
        return _rate(self.bytes, self.seconds)


@dataclass(frozen=True)
class Amounts:
    """Rows and bytes counted so far (None: not counted); ``+`` adds what both count.

    >>> Amounts(rows=2) + Amounts(rows=3, bytes=10)
    Amounts(rows=5, bytes=10)
    """

    rows: int | None = None
    bytes: int | None = None

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(_plus(self.rows, other.rows), _plus(self.bytes, other.bytes))

    def zero(self) -> Amounts:
        """What counts the same things and has counted none yet.

        >>> Amounts(bytes=7).zero()
        Amounts(rows=None, bytes=0)
        """
        return Amounts(None if self.rows is None else 0, None if self.bytes is None else 0)


def _plus(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _rate(amount: int | None, seconds: float) -> float | None:
    return None if amount is None or seconds <= 0 else amount / seconds


#: what a ``progress=`` argument takes: a callable of one :class:`ProgressEvent`, or of
#: ``(step, done, total)`` (the earlier form)
ProgressCallback = Callable[[ProgressEvent], None] | Callable[[str, int, int], None]


class Progress:
    """A ``progress`` callback as the library calls it: ``report(step, done, total, rows=,
    bytes=)`` makes the event (timing each step from its first report; a step reported again
    from 0 after it finished starts anew) and hands it on in the form the callback takes.
    Thread-safe: Spark's watcher and the caller may report at once."""

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback
        self._takes_event = not _takes_three(callback)
        self._started: dict[str, float] = {}
        self._finished: set[str] = set()
        self._lock = threading.Lock()

    def begin(self, step: str) -> None:
        """Start ``step``'s clock now (before its first report, which may come late)."""
        with self._lock:
            self._finished.discard(step)
            self._started[step] = time.monotonic()

    def __call__(
        self, step: str, done: int, total: int, *, rows: int | None = None, bytes: int | None = None
    ) -> None:
        if not self._takes_event:
            self.callback(step, done, total)  # type: ignore[call-arg]
            return
        now = time.monotonic()
        with self._lock:
            if step in self._finished and done == 0:
                self._finished.discard(step)
                self._started.pop(step, None)
            started = self._started.setdefault(step, now)
            if done >= total:
                self._finished.add(step)
        event = ProgressEvent(step, done, total, rows, bytes, now - started)
        self.callback(event)  # type: ignore[call-arg]


def progress_to(callback: ProgressCallback | Progress | None) -> Progress | None:
    """``callback`` as a :class:`Progress` (itself if it is one; None for None)."""
    if callback is None or isinstance(callback, Progress):
        return callback
    if not callable(callback):
        raise TypeError(
            f"progress must be a callable taking a ProgressEvent, not {type(callback).__name__}"
        )
    return Progress(callback)


def _takes_three(callback: Callable) -> bool:
    """Whether ``callback`` is of the earlier form, ``(step, done, total)``: it takes three
    positional arguments (``*args`` included) but does not need to be given only one."""
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # a builtin without a signature (print): the earlier form
        return True
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    if len(required) >= 2:
        return True
    if len(required) == 1:
        return False
    return variadic or len(positional) >= 3
