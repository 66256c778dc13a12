"""Typed options: small frozen objects checked once, each field by its setting's schema
(:mod:`blobhouse.settings`): :class:`WriteOptions`, :class:`CompactionTargets`,
:class:`CommitOptions`. Keyword names are checked too (:func:`keywords_checked`): a misspelled
option is an error naming the closest valid one, never a setting silently ignored. A public
entry taking an options object may take its fields as keywords too (:func:`option_keywords`):
sugar that builds the object, derived from its fields.

>>> WriteOptions(managed_bases="/data/media")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
blobhouse.errors.InvalidSettingError: managed_bases must be a list of absolute directories ...
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from blobhouse.errors import InvalidInputError
from blobhouse.settings import SETTINGS, Flag, check_names, unknown_option

F = TypeVar("F", bound=Callable)
DEFAULT_MAX_ROWS_PER_FILE: int = SETTINGS["max_rows_per_file"].default
DEFAULT_MAX_BYTES_PER_FILE: int = SETTINGS["max_bytes_per_file"].default  # Lance's default


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
        _checked_fields(self, unset=None)  # None: the table's (or the default)

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
    a fragment with more than ``deleted_fraction`` of its rows deleted is rewritten; the
    store's packs with the most unreferenced bytes are repacked until those left are at most
    ``max_unused`` of the bytes still referenced (a table-wide budget, as restic's prune).

    >>> CompactionTargets(target_rows=1000).deleted_fraction
    0.1
    >>> CompactionTargets(deleted_fraction=2)
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidSettingError: deleted_fraction must be a number in (0, 1], got 2
    """

    target_rows: int = SETTINGS["target_rows"].default
    target_bytes: int = SETTINGS["target_bytes"].default
    deleted_fraction: float = SETTINGS["deleted_fraction"].default
    max_unused: float = SETTINGS["max_unused"].default

    def __post_init__(self) -> None:
        _checked_fields(self)


@dataclass(frozen=True)
class CommitOptions:
    """How a change commits: how often it is planned and run again on the latest version
    after a concurrent commit preempted it (Lance's retryable conflict).

    >>> CommitOptions().retries
    3
    """

    retries: int = SETTINGS["retries"].default

    def __post_init__(self) -> None:
        _checked_fields(self)


_CHECK_ALL = object()


def _checked_fields(options: Any, unset: object = _CHECK_ALL) -> None:
    """Every field of the frozen ``options`` checked (and kept canonical) by its setting's
    schema, but those left at ``unset``."""
    for f in fields(options):
        value = getattr(options, f.name)
        if value is not unset:
            object.__setattr__(options, f.name, SETTINGS[f.name].check(value))


Opts = TypeVar("Opts")


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


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int if it is an integer (numpy's too, never a bool) in ``[low, high]``,
    else an error naming ``name``, the value and the range.

    >>> check_int("batch_size", 0, 1)
    Traceback (most recent call last):
    blobhouse.errors.InvalidInputError: batch_size must be >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's ints too
        raise InvalidInputError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidInputError(f"{name} must be {bounds}, got {value}")
    return int(value)


def check_flag(name: str, value: object) -> bool:
    """``value`` as a bool if it is True or False (numpy's too), else an error naming ``name``
    (not merely truthy: a misspelled string is).

    >>> check_flag("check_hashes", "no")
    Traceback (most recent call last):
    blobhouse.errors.InvalidSettingError: check_hashes must be True or False, got 'no'
    """
    return Flag(name, "").check(value)


def keywords_checked(fn: F) -> F:
    """``fn`` refusing unknown keyword arguments with the closest valid name (Python's own
    TypeError names the argument but not what was meant).

    >>> from blobhouse.errors import UnknownOptionError
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


def field_keywords(cls: type, names: Collection[str]) -> Callable[[F], F]:
    """``fn(..., **changes)`` showing the fields ``names`` of ``cls`` as its keywords (in its
    signature, so :func:`keywords_checked` knows them), in place of ``**changes``: for an
    entry whose keywords are a partial change of those fields rather than an object (one that
    may say None for a column: :meth:`~blobhouse.Table.set_properties`)."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        parameters = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        chosen = [f for f in fields(cls) if f.name in names]
        fn.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=parameters + _keyword_parameters(chosen)
        )
        return fn

    return decorate


def _keyword_parameters(chosen: Sequence[Any]) -> list[inspect.Parameter]:
    """Dataclass fields as keyword-only parameters, each None by default (not given)."""
    return [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=f.type if str(f.type).endswith("| None") else f"{f.type} | None",
        )
        for f in chosen
    ]


def option_keywords(**objects: type | tuple[type, Collection[str]]) -> Callable[[F], F]:
    """``fn`` taking, beside each options parameter named here (``targets=CompactionTargets``),
    the fields of its class as keywords: sugar that builds the object (a keyword left at None
    is not given). Giving an object and its keywords at once is refused, naming both. The
    keywords are read from the dataclass fields, so they never drift from the object, and
    they show in ``fn``'s signature (keyword-only, default None). ``(cls, names)``: only
    those fields are keywords of ``fn``.

    >>> @option_keywords(commit=CommitOptions)
    ... def change(table, *, commit=None):
    ...     return commit
    >>> change("t", retries=5)
    CommitOptions(retries=5)
    >>> change("t", commit=CommitOptions(1), retries=5)
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: change(): give commit (a CommitOptions) or its \
keywords (retries), not both
    """

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        classes = {n: o[0] if isinstance(o, tuple) else o for n, o in objects.items()}
        sugar = [
            (name, f)
            for name, o in objects.items()
            for f in fields(classes[name])
            if not isinstance(o, tuple) or f.name in o[1]
        ]
        owner = {f.name: name for name, f in sugar}
        called = (
            fn.__qualname__.removesuffix(".__init__") if fn.__name__ == "__init__" else fn.__name__
        )
        clash = [name for name in owner if name in signature.parameters]
        if clash:
            raise TypeError(f"{fn.__qualname__} has parameters named as option fields: {clash}")

        @functools.wraps(fn)
        def built(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in list(kwargs) if name in owner}
            if not given:
                return fn(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs)
            for name, cls in classes.items():
                mine = {k: v for k, v in given.items() if owner[k] == name and v is not None}
                if not mine:
                    continue
                if bound.arguments.get(name) is not None:
                    raise InvalidInputError(
                        f"{called}(): give {name} (a {cls.__name__}) or its keywords "
                        f"({', '.join(mine)}), not both"
                    )
                bound.arguments[name] = cls(**mine)
            return fn(*bound.args, **bound.kwargs)

        parameters = list(signature.parameters.values())
        at = next((i for i, p in enumerate(parameters) if p.kind == p.VAR_KEYWORD), len(parameters))
        keywords = _keyword_parameters([f for _, f in sugar])
        built.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=parameters[:at] + keywords + parameters[at:]
        )
        return built  # type: ignore[return-value]

    return decorate
