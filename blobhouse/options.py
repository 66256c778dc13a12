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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import numpy as np

from blobhouse.errors import InvalidInputError, UnknownOptionError

F = TypeVar("F", bound=Callable)
DEFAULT_MAX_ROWS_PER_FILE = 1024 * 1024
DEFAULT_MAX_BYTES_PER_FILE = 90 * 1024**3  # Lance's default


@dataclass(frozen=True)
class WriteOptions:
    """How a write stores blob columns: one object for :func:`~blobhouse.write_table`, the
    Spark writer, ``merge_insert`` and the CLI, checked once.

    ``dedup`` is one mode (``"off"``, ``"content"``, ``"ref_id"``, ``"global"``) or a mode per
    blob column (``"*"``: the others); ``placement`` maps a blob column (or ``"*"``) to its size
    thresholds; ``managed_bases`` are allowed bases whose objects the table takes ownership of
    (docs/managed-objects.md). An option left at None is the table's property
    (:mod:`blobhouse.properties`), or the default for a new table.

    >>> WriteOptions(blob_columns=["image"], dedup="global").dedup
    'global'
    >>> WriteOptions.of({"dedupe": "off"})
    Traceback (most recent call last):
    ...
    blobhouse.errors.UnknownOptionError: unknown write option 'dedupe' (did you mean 'dedup'?); \
valid: allowed_bases, blob_columns, dedup, managed_bases, max_bytes_per_file, max_rows_per_file, \
placement, ref_id_columns
    """

    blob_columns: Sequence[str] = ()
    ref_id_columns: Mapping[str, str] | None = None
    dedup: str | Mapping[str, str] | None = None
    placement: Mapping[str, Mapping[str, int]] | None = None
    allowed_bases: Sequence[str] | None = None
    managed_bases: Sequence[str] | None = None
    max_rows_per_file: int | None = None
    max_bytes_per_file: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.blob_columns, str):
            raise InvalidInputError(
                f"blob_columns must be a list of column names, got the string "
                f"{self.blob_columns!r} (write [{self.blob_columns!r}])"
            )
        object.__setattr__(self, "blob_columns", tuple(self.blob_columns))
        dedup = self.dedup
        if dedup is not None and not isinstance(dedup, str | Mapping):
            raise InvalidInputError(
                f"dedup must be a mode ('global', 'content', 'ref_id', 'off') or a mapping "
                f"{{column: mode}}, got {dedup!r}"
            )
        for name in ("max_rows_per_file", "max_bytes_per_file"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1
            ):
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        for name in ("ref_id_columns", "placement"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise InvalidInputError(f"{name} must be a mapping by column, got {value!r}")

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> WriteOptions:
        """Options from a mapping of their names (unknown names refused)."""
        check_names(options, [f.name for f in fields(cls)], "write option")
        return cls(**options)

    def keywords(self) -> dict[str, Any]:
        """These options as keywords of :func:`~blobhouse.write_table`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def layout(self) -> dict[str, Any]:
        """The keywords of :func:`~blobhouse.write.pipeline.plan_write` these options set."""
        bases = ("allowed_bases", "managed_bases")  # planned against the table's own
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in bases}


@dataclass(frozen=True)
class CompactionTargets:
    """What a compaction rewrites, one object for ``Table.maintenance.compact``, Spark and the
    CLI: fragments below ``target_rows`` rows and ``target_bytes`` bytes are merged toward them;
    a fragment with more than ``deleted_fraction`` of its rows deleted is rewritten; a store
    pack of which less than ``repack_threshold`` of the bytes is still referenced is repacked.

    >>> CompactionTargets(target_rows=1000).deleted_fraction
    0.1
    >>> CompactionTargets(deleted_fraction=2)
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: deleted_fraction must be in (0, 1], got 2
    """

    target_rows: int = 1024 * 1024
    target_bytes: int = 2 * 1024**3
    deleted_fraction: float = 0.1
    repack_threshold: float = 0.5

    def __post_init__(self) -> None:
        for name in ("target_rows", "target_bytes"):
            _check_number(name, getattr(self, name), int)
        for name in ("deleted_fraction", "repack_threshold"):
            _check_number(name, getattr(self, name), int | float)
        if self.target_rows < 1 or self.target_bytes < 1:
            raise InvalidInputError("target_rows and target_bytes must be positive")
        if not 0 < self.deleted_fraction <= 1:
            raise InvalidInputError(
                f"deleted_fraction must be in (0, 1], got {self.deleted_fraction}"
            )
        if not 0 <= self.repack_threshold <= 1:  # nan too
            raise InvalidInputError(
                f"repack_threshold must be in [0, 1], got {self.repack_threshold}"
            )


@dataclass(frozen=True)
class CommitOptions:
    """How a change commits: how often it is planned and run again on the latest version
    after a concurrent commit preempted it (Lance's retryable conflict).

    >>> CommitOptions().retries
    3
    """

    retries: int = 3

    def __post_init__(self) -> None:
        _check_number("retries", self.retries, int)
        if self.retries < 0:
            raise InvalidInputError(f"retries must be a whole number >= 0, got {self.retries!r}")


Opts = TypeVar("Opts", CompactionTargets, CommitOptions)


def as_options(cls: type[Opts], value: Opts | Mapping[str, Any] | None, what: str) -> Opts:
    """``value`` as an options object of ``cls``: itself, the defaults (None), or a mapping of
    its field names (an unknown name is refused, naming the closest).

    >>> as_options(CommitOptions, {"retries": 5}, "commit option")
    CommitOptions(retries=5)
    >>> as_options(CommitOptions, {"retry": 5}, "commit option")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    blobhouse.errors.UnknownOptionError: unknown commit option 'retry' (did you mean 'retries'?)...
    """
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        check_names(value, [f.name for f in fields(cls)], what)
        return cls(**value)
    raise InvalidInputError(
        f"{what}s are a {cls.__name__} or a mapping of its fields, got {type(value).__name__}"
    )


def _check_number(name: str, value: object, kind: type | Any) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidInputError(f"{name} must be a number, got {value!r}")


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


def check_flag(name: str, value: object) -> bool:
    """``value`` as a bool if it is True or False (numpy's too), else an error naming ``name``
    (not merely truthy: a misspelled string is).

    >>> check_flag("check_hashes", "no")
    Traceback (most recent call last):
    blobhouse.errors.InvalidInputError: check_hashes must be True or False, got 'no'
    """
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be True or False, got {value!r}")
    return bool(value)


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
    name = fn.__qualname__.removesuffix(".__init__") if fn.__name__ == "__init__" else fn.__name__
    what = f"option of {name}()"

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not keywords.issuperset(kwargs):
            unknown = [name for name in kwargs if name not in keywords]
            raise unknown_option(unknown[0], options, what)
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]
