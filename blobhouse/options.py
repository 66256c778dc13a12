"""Option names are checked everywhere: a misspelled option is an error that names it and the
closest valid one, never a setting silently ignored.

>>> try:
...     check_names(["dedupe"], ["dedup", "blob_columns"], "write option")
... except UnknownOptionError as error:
...     print(error)
unknown write option 'dedupe' (did you mean 'dedup'?); valid: blob_columns, dedup
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

from blobhouse.errors import UnknownOptionError

F = TypeVar("F", bound=Callable)


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name ``name`` most likely misspells, if any is close."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_option(name: str, valid: Collection[str], what: str) -> UnknownOptionError:
    """The error for option ``name``, which is none of ``valid``."""
    near = closest(name, valid)
    hint = f" (did you mean {near!r}?)" if near else ""
    return UnknownOptionError(f"unknown {what} {name!r}{hint}; valid: {', '.join(sorted(valid))}")


def check_names(
    given: Iterable[str],
    valid: Collection[str],
    what: str,
    internal: Collection[str] = (),
) -> None:
    """Raise :class:`UnknownOptionError` for the first name of ``given`` that is neither in
    ``valid`` nor ``internal`` (accepted, never suggested)."""
    for name in given:
        if name not in valid and name not in internal:
            raise unknown_option(name, valid, what)


def keywords_checked(fn: F) -> F:
    """``fn`` refusing unknown keyword arguments with the closest valid name (Python's own
    TypeError names the argument but not what was meant).

    >>> @keywords_checked
    ... def write(data, *, dedup="content"): return dedup
    >>> try:
    ...     write(1, dedupe="off")
    ... except UnknownOptionError as error:
    ...     print(error)
    unknown option of write() 'dedupe' (did you mean 'dedup'?); valid: dedup
    """
    parameters = inspect.signature(fn).parameters.values()
    keywords = frozenset(
        p.name
        for p in parameters
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "cls")
    )
    # what a user passes by name: keyword-only arguments and those with a default
    options = {
        p.name
        for p in parameters
        if p.name in keywords and (p.kind == p.KEYWORD_ONLY or p.default is not p.empty)
    } or keywords
    what = f"option of {fn.__name__}()"

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not keywords.issuperset(kwargs):
            unknown = [name for name in kwargs if name not in keywords]
            raise unknown_option(unknown[0], options, what)
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]
