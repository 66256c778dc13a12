"""Errors raised by blobhouse.

Every error that comes from bad input names what was wrong (column, row, ref_id, path)
and is raised before anything is committed, so the table stays at its previous version.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator


class BlobhouseError(Exception):
    """Base class of every error blobhouse raises on purpose."""


class InvalidInputError(BlobhouseError, ValueError):
    """Input data or options that blobhouse cannot write as asked."""


class UnknownOptionError(InvalidInputError, TypeError):
    """An option name blobhouse does not know (a keyword, a Spark option, a CLI flag); the
    message names the closest valid one."""


class InvalidSettingError(InvalidInputError):
    """A setting (a keyword, an option object's field, a CLI flag, a Spark option or table
    property, a property read back from a table) of the wrong type, range or shape: the
    message names the setting, the value and what is expected (:mod:`blobhouse.settings`).
    ``setting`` is its name."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting

    def __reduce__(self):  # keep the setting's name across processes (Spark tasks)
        return type(self), (str(self), self.setting)


class SchemaError(InvalidInputError):
    """A schema that cannot hold blob columns as asked (unknown column, blob in a list...)."""


class ColumnNameError(SchemaError):
    """A column name Lance cannot address (empty, holding a backtick, a dot at top level, one of
    its row columns such as ``_rowid``), one blobhouse reserves (``__bh_...``), or a name given
    to two columns. The message names the column and the rule; nothing was written."""


class PropertyConflictError(InvalidInputError):
    """A write asked for a setting other than the one the table keeps (its properties); the
    message names the setting and both values. Change the property first
    (``Table.set_properties``) or leave the option out to use the table's."""


class TableMetadataError(BlobhouseError):
    """The table's own metadata (the schema metadata key ``blobhouse``: its properties and
    bases) is not what blobhouse writes: damaged by another tool, or written by a newer
    blobhouse. Writes refuse such a table; reads go on without its external bases."""


class RefIdConflictError(InvalidInputError):
    """Two rows share a ref_id but carry different bytes."""


class ExternalBlobError(InvalidInputError):
    """An external URI outside the table's allowed bases, missing, or with a bad range."""


class ManagedObjectOwnedError(ExternalBlobError):
    """A write hands the table a managed object another table owns (its owner marker names
    that table: a second table sharing the managed folder, or the original of a copied or
    moved table). The message names the object and its owner; nothing was committed.
    Reference the object unmanaged, or give the table a managed folder of its own."""


class TableExistsError(BlobhouseError, FileExistsError):
    """``mode="create"`` on a table that already exists."""


class TableNotFoundError(BlobhouseError, FileNotFoundError):
    """Opening a table that does not exist (the subclasses below say why)."""


class PathNotFoundError(TableNotFoundError):
    """Nothing exists at the path."""


class NotATableError(TableNotFoundError):
    """The path is a folder that holds no table (no ``_versions/``)."""


class PathIsFileError(NotATableError, NotADirectoryError):
    """The path (or a folder above it) is a file; a table is a folder."""


class VersionNotFoundError(TableNotFoundError):
    """The table never had this version (it is newer than the latest)."""


class VersionRemovedError(VersionNotFoundError):
    """The version existed but cleanup (``gc``, Lance's ``cleanup_old_versions``) removed it;
    the message names the oldest version still there."""


class CorruptBlobError(BlobhouseError):
    """Stored bytes that no longer match the blake3 recorded when they were written."""


class VideoFrameError(BlobhouseError, ValueError):
    """A video chunk that cannot be decoded, or that has no frame at a row's timestamp."""


class LeRobotDatasetError(InvalidInputError):
    """A LeRobot dataset folder that is not what its layout says: the message names the file
    and the field."""


class BlobReadError(BlobhouseError, OSError):
    """A stored payload could not be read: its object is missing or shorter than its
    reference says. ``uri`` is the object (empty when re-raised from a DataLoader worker,
    which keeps only the type and the message: the message names it)."""

    def __init__(self, message: str, uri: str = "") -> None:
        super().__init__(message)
        self.uri = uri

    def __reduce__(self):  # OSError pickles its args only: keep the uri across processes
        return type(self), (str(self), self.uri)


class DataFileError(BlobhouseError, OSError):
    """A data file of the table that Lance cannot read: shorter or longer than its manifest
    records, its footer damaged, or a page inside it damaged. ``uri`` is the file when it is
    known (an empty string when every file's size and footer are intact: a damaged page,
    which ``verify(deep=True)`` finds by fragment). The table's other versions are unchanged:
    restore the file, or read a version written before it."""

    def __init__(self, message: str, uri: str = "") -> None:
        super().__init__(message)
        self.uri = uri

    def __reduce__(self):  # OSError pickles its args only: keep the uri across processes
        return type(self), (str(self), self.uri)


#: Lance's messages when the bytes of a data file are not what it wrote (its length, footer,
#: schema or a page), as opposed to its store failing a request
_DAMAGED_FILE = re.compile(
    r"corrupt file|not appear to be a Lance file|failed to decode Protobuf"
    r"|Invalid range \d+\.\.\d+ for object of size|encoding envelope|failed to fill whole buffer"
    r"|Range Not Satisfiable|InvalidRange|Unknown Lance storage version|outside metadata region"
    r"|not aligned to \d+ bytes|exceeds row bounds|panicked|producer terminated before end"
    r"|outside file of size"
    # a column's page metadata or the file's schema decoded but not consistent
    r"|Column \d+ page \d+|is missing its|buffer has \d+ bytes, expected|mini-?block"
    r"|Packed struct|references parent id|columns of differing lengths|CMO table needs"
    r"|buffer offsets but \d+ buffer sizes"
)


def is_damaged_file_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Lance's error about damaged bytes in a file it read.

    >>> is_damaged_file_error(OSError("Encountered corrupt file binary mini-block: ..."))
    True
    >>> is_damaged_file_error(OSError("LanceError(IO): Generic S3 error: connection refused"))
    False
    """
    # a Lance panic (pyo3's PanicException, a BaseException) reading a file it wrote is damage
    panicked = type(exc).__name__ == "PanicException"
    return panicked or _DAMAGED_FILE.search(str(exc)) is not None


# Lance's (and its object stores') words for a file that is not there
_NOT_FOUND = re.compile(r"\bnot found\b|NoSuchKey|BlobNotFound|No such file", re.IGNORECASE)


def is_not_found_error(exc: BaseException) -> bool:
    """Whether ``exc`` may be Lance's error about a Lance file that is not there (a data
    file, say: the caller finds which); not one about a column or a key that is not.

    >>> is_not_found_error(OSError("Not found: t/data/x.lance, local.rs:273:40"))
    True
    >>> is_not_found_error(ValueError("Column id not found in the schema"))
    False
    """
    message = str(exc)
    return ".lance" in message and _NOT_FOUND.search(message) is not None


class StaleWriteError(BlobhouseError):
    """A write outlived what table maintenance keeps for it: gc removed the version it started
    from, or swept files it staged (the write ran longer than gc's grace period). Nothing was
    committed; retrying the write succeeds."""


def _commit_conflicts() -> dict[str, type[BaseException]]:
    """The errors built on Lance's :class:`~lance.commit.CommitConflictError`: made when first
    asked for (importing Lance takes most of a second, which ``blobhouse --help`` and an
    argument error should not pay)."""
    from lance.commit import CommitConflictError

    class ConcurrentCommitError(BlobhouseError, CommitConflictError):
        """A change lost to concurrent commits: one it cannot be planned over (an overwrite,
        say: ``retryable`` is False), or ones that preempted every attempt it was allowed
        (``retryable`` is True: running it again may succeed). Nothing of the change was
        committed. Lance's :class:`~lance.commit.CommitConflictError`, explained."""

        def __reduce__(self):  # OSError pickles its args only: keep retryable across processes
            return type(self), (str(self), self.retryable)

    class KeysInsertedMeanwhile(BlobhouseError, CommitConflictError):
        """A merge would insert keys that a concurrent commit inserted after the version the
        merge read (it was not committed). Retryable: planned again on the latest version, those
        rows are updates (:func:`blobhouse.commit.transaction.retrying` does so); a merge out of
        retries raises :class:`ConcurrentCommitError` naming the keys. ``keys``: some of them."""

        def __init__(self, message: str, keys: list | None = None) -> None:
            super().__init__(message, True)
            self.keys = list(keys or [])

        def __reduce__(self):  # OSError pickles its args only
            return type(self), (str(self), self.keys)

    made = {
        "ConcurrentCommitError": ConcurrentCommitError,
        "KeysInsertedMeanwhile": KeysInsertedMeanwhile,
    }
    for cls in made.values():  # found where they are named, as pickle looks for them
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return made


_MAKING = threading.Lock()  # one class each, however many threads ask first


def __getattr__(name: str) -> type[BaseException]:
    if name not in ("ConcurrentCommitError", "KeysInsertedMeanwhile"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _MAKING:
        if name not in globals():
            globals().update(_commit_conflicts())
    return globals()[name]


class StoreRaceError(StaleWriteError):
    """A write found payloads in the table's store that gc retired before the write committed;
    nothing was committed and retrying the write succeeds (a :class:`StaleWriteError`: gc
    took what the write used)."""


class ManagedObjectRaceError(BlobhouseError):
    """A write references a managed object that gc is deleting, or that is gone, by the time
    the write commits; nothing was committed (see docs/managed-objects.md)."""


class LeftoverError(BlobhouseError, OSError):
    """A lock, lease, claim or owner marker left in a shape no live writer leaves (a directory,
    a symbolic link, an empty or garbage object) that blobhouse cannot clear safely itself:
    the message names it and the one command that clears it. ``uri`` is the object."""

    def __init__(self, message: str, uri: str = "") -> None:
        super().__init__(message)
        self.uri = uri

    def __reduce__(self):  # OSError pickles its args only: keep the uri across processes
        return type(self), (str(self), self.uri)


class StoreIndexError(BlobhouseError):
    """The table's store index cannot be read (its files are damaged): writers store payloads
    anew, verify reports it, gc keeps every pack."""


class StoreIndexWarning(UserWarning):
    """The table's store index names bytes that differ from its entry (a damaged index or
    pack): the write stored those payloads anew instead of referencing them."""


class MovedTableWarning(UserWarning):
    """A table copied or moved (``cp -r``, a bucket sync) whose manifest still names its old
    place for the store: blobhouse reads the table's own files, stock Lance readers read the
    old place until the first blobhouse write or ``blobhouse relocate``."""


class ForkedAfterLanceWarning(UserWarning):
    """A read in a process forked from one where Lance had already started (pylance's reads
    crash or hang at random there), done through a fresh process instead; the message says
    how to start workers for full speed."""


class StoreError(BlobhouseError, OSError):
    """An object store that failed a request, or did not answer in time: the message names the
    table or object, the store and what was being done (never a raw Lance or Arrow error)."""


class StoreReadError(BlobReadError, StoreError):
    """A payload's object store failed the read, or did not answer in time (a
    :class:`BlobReadError` and a :class:`StoreError`: the message names the object)."""


class MissingExtraError(BlobhouseError, ImportError):
    """A part of blobhouse whose optional dependencies are not installed (Spark without
    pyspark). The message is one line naming the ``pip install`` that adds them."""


def lance_message(exc: BaseException) -> str:
    """The first line of a (Lance) error's message, without its "Invalid user input" prefix
    and the Rust source locations Lance adds, to quote in an error of blobhouse's own.

    >>> lance_message(ValueError("Invalid user input: bad, /build/lance/src/sql.rs:12:5"))
    'bad'
    """
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = re.sub(r", /home/runner/\S+$|,\s*\S+\.rs:\d+:\d+", "", text)
    return text.removeprefix("External error: ").removeprefix("Invalid user input: ").strip()


#: how long the cleanup after a store's failure may take before it is left to gc: the store
#: that failed the work may not answer the cleanup either (each request would wait its budget)
CLEANUP_SECONDS = 30.0


def cleanup_after(failure: BaseException, *cleanups: Callable[[], object]) -> None:
    """Run each of ``cleanups`` after ``failure`` (what a failed write staged, say), every one
    even if another fails. A cleanup that fails too -- the store that failed the work is often
    still down -- is noted on ``failure``, which the caller raises: it is never replaced by the
    cleanup's error, and what the cleanup left is gc's to remove. After a store's failure the
    cleanups get :data:`CLEANUP_SECONDS` in all (nested ones share the first one's deadline,
    also across the errors raised from ``failure``); one that takes longer goes on in the
    background, and the caller raises ``failure`` with a note saying so.

    >>> error = KeyError("the write's own error")
    >>> cleanup_after(error, lambda: 1 / 0)
    >>> error.__notes__[0][:64]
    'cleaning up after it failed too (ZeroDivisionError: division by '

    """
    if not _store_failed(failure):
        _run_cleanups(failure, cleanups)
        return
    done = threading.Event()

    def run() -> None:
        _run_cleanups(failure, cleanups)
        done.set()

    deadline = _cleanup_deadline(failure)
    threading.Thread(target=run, name="blobhouse-cleanup", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        _note(
            failure,
            f"cleaning up after it did not finish within {CLEANUP_SECONDS:g} s (the store does "
            "not answer); what it staged is left for gc",
        )


def _cleanup_deadline(failure: BaseException) -> float:
    """When the cleanups after ``failure`` must end: the deadline a cleanup of it, or of an
    error it was raised from, set already, or :data:`CLEANUP_SECONDS` from now."""
    seen: set[int] = set()
    error: BaseException | None = failure
    while error is not None and id(error) not in seen:
        if (deadline := getattr(error, "_blobhouse_cleanup_deadline", None)) is not None:
            return deadline
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    deadline = time.monotonic() + CLEANUP_SECONDS
    failure._blobhouse_cleanup_deadline = deadline  # type: ignore[attr-defined]
    return deadline


def _store_failed(failure: BaseException) -> bool:
    return isinstance(failure, StoreError) or is_lance_io_error(failure)


def is_lance_io_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Lance's error about its store (``LanceError(IO)``, also wrapped as
    Arrow's ``External error``), not about its input.

    >>> is_lance_io_error(ValueError("External error: LanceError(IO): Generic S3 error"))
    True
    """
    return "LanceError(IO)" in str(exc)


def _run_cleanups(failure: BaseException, cleanups: tuple[Callable[[], object], ...]) -> None:
    for cleanup in cleanups:
        try:
            cleanup()
        except Exception as failed:
            _note(
                failure,
                f"cleaning up after it failed too ({type(failed).__name__}: "
                f"{lance_message(failed)}); what it staged is left for gc",
            )


def _note(failure: BaseException, note: str) -> None:
    """Add ``note`` to ``failure`` once (nested cleanups meet the same store's failure)."""
    if note not in getattr(failure, "__notes__", ()):
        failure.add_note(note)


def as_store_error(exc: BaseException, uri: str, doing: str) -> BaseException:
    """``exc`` as a :class:`StoreError` naming ``uri`` and what was being done when it is an
    I/O error Lance raised about the store (``LanceError(IO)``); any other error as it is (the
    caller raises the new one ``from exc``).

    >>> as_store_error(OSError("LanceError(IO): Generic S3 error: connection refused"),
    ...                "s3://b/t", "write to")
    StoreError('cannot write to s3://b/t: LanceError(IO): Generic S3 error: connection refused')
    """
    if isinstance(exc, BlobhouseError) or not is_lance_io_error(exc):
        return exc
    from lance.commit import CommitConflictError  # loaded: Lance raised exc

    if isinstance(exc, CommitConflictError):
        return exc
    error = StoreError(f"cannot {doing} {uri}: {lance_message(exc)}")
    for note in getattr(exc, "__notes__", ()):  # what its cleanup met, say
        error.add_note(note)
    return error


@contextlib.contextmanager
def lance_io(uri: str, doing: str) -> Iterator[None]:
    """Lance's I/O errors inside the block raised as :class:`StoreError` naming ``uri`` and
    what was being done (:func:`as_store_error`); any other error as it is.

    >>> with lance_io("s3://b/t", "read"):
    ...     raise OSError("LanceError(IO): timed out")
    Traceback (most recent call last):
    blobhouse.errors.StoreError: cannot read s3://b/t: LanceError(IO): timed out
    """
    try:
        yield
    except (OSError, ValueError, RuntimeError) as exc:
        error = as_store_error(exc, uri, doing)
        if type(exc) is StoreError and not str(exc).startswith(f"cannot {doing} {uri}"):
            # blobhouse's own store calls inside Lance's reads (a data file's recorded
            # hashes) name an object: say which table and which read it failed
            error = StoreError(f"cannot {doing} {uri}: {exc}")
            for note in getattr(exc, "__notes__", ()):
                error.add_note(note)
        if error is exc:
            raise
        raise error from exc


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name ``name`` most likely misspells, if any is close (what an error about an
    unknown name suggests).

    >>> closest("dedupe", ["dedup", "placement"])
    'dedup'
    """
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return found[0] if found else None
