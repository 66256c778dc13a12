"""What the command line shows a person: progress bars on stderr and reports as tables on
stdout (both drawn by rich), and Spark jobs that stop cleanly on Ctrl-C.

Reports are the dicts the library returns. :func:`print_report` prints whatever keys a report
has (a field added to a report shows up without a change here): single values in a summary
table, lists of records (and mappings of records) in tables of their own.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from blobhouse.progress import ProgressEvent

#: list cells show at most this many items, then "... (N more)"
LIST_ITEMS = 8


class ProgressBars:
    """The :class:`~blobhouse.progress.ProgressEvent` callback the command line gives long steps.

    On a terminal, a bar per step (rich), redrawn in place, with the rows and bytes done so far
    and their rate; elsewhere a line when a step starts and one when it ends (with its rows,
    bytes and rate), so logs stay short. :meth:`message` prints a line above the bars. Use it
    as a context manager (or call :meth:`close`) so the terminal is left tidy.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self.tty = self.stream.isatty()
        self._bars = None
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def stream(self) -> IO[str]:
        return self._stream or sys.stderr  # sys.stderr at the time of use (tests swap it)

    def __call__(self, event: ProgressEvent) -> None:
        if not self.tty:
            if event.done == 0 or event.finished:
                print(
                    f"{event.step}: {event.done}/{event.total}{_amounts(event)}",
                    file=self.stream,
                    flush=True,
                )
            return
        with self._lock:
            bars = self._start()
            task = self._tasks.get(event.step)
            if task is not None and bars.tasks[task].finished and event.done == 0:
                task = None  # the step runs again (a retry): a new bar
            if task is None:
                task = self._tasks[event.step] = bars.add_task(
                    event.step, total=event.total, amounts=""
                )
            amounts = _amounts(event).removeprefix(", ")
            bars.update(task, completed=event.done, total=event.total, amounts=amounts)

    def message(self, text: str) -> None:
        """A line on the progress stream (above the bars on a terminal)."""
        if self._bars is not None:
            self._bars.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        with self._lock:
            if self._bars is not None:
                self._bars.stop()
                self._bars = None
                self._tasks.clear()

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self):
        if self._bars is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bars = Progress(
                TextColumn("{task.description:<10}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[amounts]}"),
                console=Console(file=self.stream),
            )
            self._bars.start()
        return self._bars


def _amounts(event: ProgressEvent) -> str:
    """What a step's units held so far and how fast, e.g. ``, 5,400 rows, 231.4 MB, 85.2 MB/s``
    (empty when the step counts neither rows nor bytes).

    >>> _amounts(ProgressEvent("read", 2, 4, rows=5400, bytes=231_400_000, seconds=2.0))
    ', 5,400 rows, 231.4 MB, 115.7 MB/s'
    """
    parts = []
    if event.rows is not None:
        parts.append(f"{event.rows:,} rows")
    if event.bytes is not None:
        parts.append(f"{event.bytes / 1e6:,.1f} MB")
    rate, row_rate = event.bytes_per_second, event.rows_per_second
    if event.done and event.seconds >= 0.5:  # a rate over less would be noise
        if rate is not None:
            parts.append(f"{rate / 1e6:,.1f} MB/s")
        elif row_rate is not None:
            parts.append(f"{row_rate:,.0f} rows/s")
    return "".join(", " + part for part in parts)


def print_report(
    report: Mapping[str, Any],
    title: str | None = None,
    *,
    skip: Iterable[str] = (),
    file: IO[str] | None = None,
    separate: bool = False,
) -> None:
    """Print ``report`` as tables: a summary of its single values (numbers, strings, short
    lists, small mappings), then one table per field that holds records (a list of dicts, or a
    dict of dicts, such as stats' ``columns`` or verify's ``problems``). Byte counts are shown
    in MB, ratios with an ``x``. Fields in ``skip`` are left out (``--json`` prints them);
    ``separate``: a blank line first (after lines printed before), if anything is printed."""
    from rich.table import Table

    skipped = set(skip)
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column()
    sections = []
    for key, value in report.items():
        if key in skipped:
            continue
        records = _records(key, value)
        if records is not None:
            sections.append(_records_table(_label(key), records))
        else:
            summary.add_row(_label(key), format_value(key, value))
    shown = ([summary] if summary.row_count else []) + sections
    if title and shown:
        shown.insert(0, title)
    if separate and shown:
        shown.insert(0, "")
    _print(shown, file or sys.stdout)


def _print(renderables: list, out: IO[str]) -> None:
    """On a terminal, drawn by rich; elsewhere plain text without trailing blanks, never
    wrapped (logs and pipes stay greppable)."""
    from rich.console import Console

    if out.isatty():
        console = Console(file=out, highlight=False)
        for number, renderable in enumerate(renderables):
            console.print(*([""] if number and renderables[number - 1] != "" else []), renderable)
        return
    buffer = io.StringIO()
    console = Console(file=buffer, width=10_000, highlight=False, no_color=True)
    for number, renderable in enumerate(renderables):
        console.print(*([""] if number and renderables[number - 1] != "" else []), renderable)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    out.write("".join(line + "\n" for line in lines))
    out.flush()


def _records(key: str, value: Any) -> list[dict] | None:
    """``value`` as table rows if it holds records, else None."""
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        return [dict(v) for v in value]
    if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
        rows = []
        name = _singular(key)
        for item, fields in value.items():
            nested = {k: v for k, v in fields.items() if _is_record_map(v)}
            own = {k: v for k, v in fields.items() if k not in nested}
            if not nested:
                rows.append({name: item, **own})
                continue
            # e.g. stats' columns: a total row per column, then a row per kind
            rows.append({name: item, **{_singular(k): "all" for k in nested}, **own})
            for sub_key, sub_map in nested.items():
                for sub_item, sub_fields in sub_map.items():
                    rows.append({name: "", _singular(sub_key): sub_item, **sub_fields})
        return rows
    return None


def _is_record_map(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, Mapping) for v in value.values())
    )


def _records_table(title: str, records: Sequence[Mapping[str, Any]]):
    from rich import box
    from rich.table import Table

    columns: list[str] = []
    for record in records:  # keys in the order records have them (a key new here goes
        at = 0  # after the key it follows in this record)
        for key in record:
            if key in columns:
                at = columns.index(key) + 1
            else:
                columns.insert(at, key)
                at += 1
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, title_justify="left", pad_edge=False
    )
    for column in columns:
        numeric = any(isinstance(r.get(column), int | float) for r in records)
        table.add_column(_label(column), justify="right" if numeric else "left")
    for record in records:
        table.add_row(*(format_value(c, record.get(c)) if c in record else "" for c in columns))
    return table


def format_value(key: str, value: Any) -> str:
    """How one report field is shown.

    >>> format_value("physical_bytes", 12_345_678), format_value("dedup_ratio", 30.6)
    ('12.3 MB', '30.60x')
    >>> format_value("removed_versions", [1, 2, 3, 7] + list(range(10, 20, 2)))
    '1-3, 7, 10, 12, 14, 16, 18'
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and "bytes" in key.split("_"):
        return mb(value)
    if isinstance(value, int | float) and key.endswith("ratio"):
        return f"{value:.2f}x"
    if isinstance(value, int | float) and key.endswith("_mb_s"):
        return f"{value} MB/s"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        if not value:
            return "none"
        return ", ".join(f"{k} {format_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        if not items:
            return "none"
        if key.endswith("versions") and all(type(v) is int for v in items):
            from blobhouse.snapshot import version_spans  # (Lance is loaded by then)

            items = version_spans(items)
        shown = ", ".join(format_value(key, v) for v in items[:LIST_ITEMS])
        more = len(items) - LIST_ITEMS
        return shown + (f", ... ({more} more)" if more > 0 else "")
    return str(value)


def mb(n: float) -> str:
    """Bytes as MB, the unit the command line reports in."""
    return f"{n / 1e6:,.1f} MB"


def _label(key: str) -> str:
    return key.removesuffix("_mb_s").replace("_", " ")


def _singular(key: str) -> str:
    return key[:-1] if key.endswith("s") and len(key) > 1 else key
