"""blobhouse's errors raised inside Spark (the data source, tasks) reach the caller of a
``blobhouse.spark`` function as themselves: the blobhouse message first, not under a page of
JVM and py4j frames. Spark's own errors pass through unchanged."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TypeVar

from blobhouse import errors
from blobhouse.options import keywords_checked

F = TypeVar("F", bound=Callable)

_RAISED = re.compile(r"blobhouse\.errors\.(\w+): ([^\n]*)")


def surfaced(error: BaseException) -> errors.BlobhouseError | None:
    """The blobhouse error a Spark error carries in its text, if it carries one.

    >>> surfaced(RuntimeError("Traceback ...\\nblobhouse.errors.SchemaError: no column 'x'\\n"))
    SchemaError("no column 'x'")
    """
    found = _RAISED.search(str(error))
    if found is None:
        return None
    kind = getattr(errors, found.group(1), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.BlobhouseError)):
        return None
    try:
        raised = kind(found.group(2))
    except TypeError:  # an error class with more arguments (BlobReadError: uri)
        raised = errors.BlobhouseError(found.group(2))
    raised.spark_error = error  # the whole story, for whoever needs it
    return raised


def spark_entry_point(fn: F) -> F:
    """A public ``blobhouse.spark`` function: unknown keywords refused with the closest valid
    name, and a blobhouse error from inside Spark raised as itself."""
    checked = keywords_checked(fn)

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        try:
            return checked(*args, **kwargs)
        except errors.BlobhouseError:
            raise
        except Exception as exc:
            raised = surfaced(exc)
            if raised is None:
                raise
            raise raised from None

    return entry  # type: ignore[return-value]
