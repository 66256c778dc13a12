"""Object storage: every object blobhouse reads, writes, lists or deletes itself, on a local
disk or an object store (Lance does its own I/O, with the same storage options).

One options dict, in Lance's spelling, configures both: it goes to pylance unchanged and is
translated here for obstore. :func:`checked_options` checks and normalizes it once, at the
entry points. :func:`object_store` picks the backend of a URI:

- local paths and ``file://`` URIs: plain system calls; new objects are created with
  ``O_EXCL``;
- ``s3://`` (and S3-compatible), ``az://``, ``gs://``, ``http(s)://``, ...: obstore, the
  Python bindings of the object_store crate Lance uses, with the same options; new objects
  are created with a conditional PUT (above :data:`SINGLE_PUT_BYTES`: a multipart upload of
  a name checked first), so an existing object is never overwritten, as locally.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> store = object_store(root)
>>> store.put(f"{root}/a/b.bin", b"hello")
>>> [(o.name, o.size) for o in store.list(root)]
[('a/b.bin', 5)]
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import os
import queue
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from blobhouse.errors import InvalidInputError, StoreError, cleanup_after
from blobhouse.io.page_cache import is_cached
from blobhouse.io.storage_options import check_option_names

StorageOptions = dict[str, str]
T = TypeVar("T")

MiB = 1024 * 1024
#: a new object up to this size is one conditional PUT, held in memory until it is closed
SINGLE_PUT_BYTES = 8 * MiB
# a bigger one is uploaded in parts of this size (S3's must be 5 MiB or more, but the last),
# a few at once: up to 32 MiB buffered per object
UPLOAD_PART_BYTES = 8 * MiB
UPLOAD_PARTS_IN_FLIGHT = 4
STAT_THREADS = 16  # HEAD requests in flight when sizing many objects
# what Lance's file API raises on I/O failures: OSError locally, RuntimeError ("LanceError(IO)")
# on object stores
LANCE_IO_ERRORS = (OSError, RuntimeError)
#: every request's budget, unless the caller sets one (Lance's names; Lance and obstore both
#: follow it): with Lance's own (a request may wait 30 s, retried 10 times within 3 minutes, for
#: each of the requests a call makes), a store that did not answer held a write over ten minutes
REQUEST_BUDGET = {
    "connect_timeout": "5s",
    "timeout": "60s",
    "client_max_retries": "3",
    "client_retry_timeout": "60",
}
#: how long a store may take to answer a call's first request (a listing) before the call fails
ANSWER_SECONDS = 10.0
_DURATION = re.compile(
    r"(?:\d+\s*(?:nsec|ns|usec|us|msec|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)\s*)+"
)


def checked_options(options: Mapping[str, object] | None) -> StorageOptions | None:
    """``options`` checked and normalized for every library blobhouse hands them to: values
    become strings (booleans ``"true"``/``"false"``, as Lance requires), an endpoint must name
    its scheme (Lance would panic on ``host:port``), and an ``http://`` endpoint turns on
    ``allow_http``. Keys are Lance's (``aws_endpoint``, ``aws_region``, ...); one Lance does not
    read is refused, naming the closest (:func:`~blobhouse.io.storage_options.check_option_names`).

    Requests get :data:`REQUEST_BUDGET` where the caller sets none (a number of seconds is
    taken for a ``timeout``); a budget that is not a duration or a count is refused.

    >>> options = checked_options({"aws_endpoint": "http://127.0.0.1:9000", "timeout": 120})
    >>> options["allow_http"], options["timeout"], options["client_max_retries"]
    ('true', '120s', '3')
    """
    if not options:
        return None
    if not isinstance(options, Mapping):
        raise InvalidInputError(f"storage_options must be a dict, got {type(options).__name__}")
    normalized: StorageOptions = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"storage option names must be strings, got {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        elif not isinstance(value, str):
            raise InvalidInputError(
                f"storage option {key!r}: value must be a string, got {type(value).__name__}"
            )
        normalized[key] = value
    check_option_names(normalized)
    _check_budget(normalized)
    endpoint = _option(normalized, "endpoint")
    if endpoint is not None:
        scheme = urlsplit(endpoint).scheme
        if scheme not in ("http", "https") or not urlsplit(endpoint).netloc:
            raise InvalidInputError(
                f"storage option endpoint {endpoint!r} must be a URL with its scheme, "
                "like http://127.0.0.1:9000 or https://s3.example.com"
            )
        allow_http = _option(normalized, "allow_http")
        if scheme == "http" and allow_http is None:
            normalized["allow_http"] = "true"
        elif scheme == "http" and allow_http.lower() != "true":
            raise InvalidInputError(
                f"storage option endpoint {endpoint!r} is http:// but allow_http is "
                f"{allow_http!r}; Lance refuses plain http unless allow_http is 'true'"
            )
    return normalized


# the HTTP client's durations (object_store's) and the retry counts and seconds Lance reads
_DURATIONS = (
    "timeout",
    "connect_timeout",
    "pool_idle_timeout",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
)
_COUNTS = {
    "client_max_retries": "a number of retries",
    "download_retry_count": "a number of retries",
    "client_retry_timeout": "a number of seconds",
}


def _check_budget(options: StorageOptions) -> None:
    """Durations and counts of the request budget checked (a number of seconds taken for a
    duration: Lance wants ``30s``), and :data:`REQUEST_BUDGET` for what is not given.

    >>> options = {"timeout": "2.5", "pool_idle_timeout": "90"}
    >>> _check_budget(options); options["timeout"], options["pool_idle_timeout"]
    ('2500ms', '90s')
    """
    for key, value in list(options.items()):
        bare = key.lower().removeprefix("aws_").removeprefix("azure_").removeprefix("google_")
        if bare in _DURATIONS:
            options[key] = _duration(key, value, positive=bare.endswith("timeout"))
        elif bare in _COUNTS and not value.strip().isdigit():
            raise InvalidInputError(
                f"storage option {key!r} must be {_COUNTS[bare]}, got {value!r}"
            )
    for name, value in REQUEST_BUDGET.items():
        if _option(options, name) is None:
            options[name] = value


def _duration(key: str, value: str, positive: bool) -> str:
    """``value`` as a duration Lance and obstore take (``30s``, ``1500ms``; a bare number is
    seconds); a timeout of zero would fail every request."""
    text = value.strip()
    with contextlib.suppress(ValueError, OverflowError):  # "inf" stays, and is refused
        seconds = float(text)
        if seconds >= 0:
            text = f"{int(seconds)}s" if seconds.is_integer() else f"{round(seconds * 1000)}ms"
    if not _DURATION.fullmatch(text):
        raise InvalidInputError(
            f"storage option {key!r} must be a duration like '30s' or '500ms', got {value!r}"
        )
    if positive and not any(int(n) for n in re.findall(r"\d+", text)):
        raise InvalidInputError(f"storage option {key!r} must be longer than 0, got {value!r}")
    return text


def _option(options: Mapping[str, str], name: str) -> str | None:
    """An option under any of the spellings Lance accepts (``aws_region``, ``region``,
    ``AWS_REGION``; ``endpoint_url`` for ``endpoint``, and Azure's ``azure_endpoint`` and
    ``azure_storage_endpoint``).

    >>> _option({"AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/a"}, "endpoint")
    'http://127.0.0.1:10000/a'
    """
    aliases = {name, f"{name}_url"} if name == "endpoint" else {name}
    for key, value in options.items():
        bare = key.lower().removeprefix("aws_").removeprefix("azure_").removeprefix("storage_")
        if bare in aliases:
            return value
    return None


@dataclass(frozen=True)
class ObjectInfo:
    """One object found by :meth:`ObjectStore.list`: its path relative to the listed prefix,
    its size, and when it was last written (epoch seconds, by the store's clock)."""

    name: str
    size: int
    mtime: float


class RangeSource(Protocol):
    """An object opened for ranged reads (see :meth:`ObjectStore.open`)."""

    def read(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``position`` (fewer only at the end of the object)."""

    def read_into(self, position: int, target: memoryview) -> int:
        """Fill ``target`` with the bytes at ``position``; how many there were."""

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """A hint that these ``(position, size)`` ranges are read next, one after another: a
        local file not in the page cache asks the kernel to start reading them all; an object
        store ignores it (its reads run as parallel requests instead)."""

    def close(self) -> None: ...


class NewObject(Protocol):
    """An object being created (see :meth:`ObjectStore.create`): on an object store it is
    visible whole at ``close``; it never replaces an object that exists."""

    def write(self, data: bytes | memoryview) -> None: ...

    def write_many(self, chunks: Sequence[bytes | memoryview]) -> None:
        """:meth:`write` each of ``chunks``, in order (a local file: a system call per 1,024)."""

    def close(self) -> None:
        """Finish the object; :class:`FileExistsError` if one appeared at its path meanwhile."""

    def abort(self) -> None:
        """Give up: nothing of the object remains."""


class ObjectStore(Protocol):
    """The operations blobhouse needs from a store; every method takes full URIs."""

    #: how many bytes a read must reach before a separate thread is worth it
    parallel_min_bytes: int
    #: the gap between two ranges of one object that one read may span (cheaper than a request)
    coalesce_gap: int
    #: threads beyond which one call's reads gain nothing (0: as many as the caller asks)
    max_read_threads: int
    #: how much a file object over a blob reads at once (``open_blob``, ``open_ref``)
    read_buffer_bytes: int

    def size(self, uri: str) -> int | None:
        """The object's size, None if there is no object (or it is not a regular file)."""

    def open(self, uri: str) -> RangeSource:
        """The object, for ranged reads; :class:`FileNotFoundError` if it is missing."""

    def create(self, uri: str, fresh: bool = False) -> NewObject:
        """A new object; :class:`FileExistsError` if one exists at ``uri`` (``fresh``: its name
        holds a random 128-bit id, a pack's, so a big one is not asked for first)."""

    def put(self, uri: str, data: bytes) -> None:
        """Write the whole object, replacing any (its modification time becomes now)."""

    def delete(self, uri: str) -> None:
        """Remove the object if it exists."""

    def delete_many(self, uris: Sequence[str]) -> None:
        """Remove those of the objects ``uris`` that exist: in bulk where the store offers it
        (S3: 1,000 a request; Azure: 256), a request each otherwise."""

    def list(self, uri: str) -> list[ObjectInfo]:
        """Every object below ``uri`` (recursively; none if the prefix does not exist)."""

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        """The objects below ``uri`` as they are listed, a page at a time (:meth:`list`
        lazily: a caller looking for one may stop early)."""

    def now(self, uri: str) -> float:
        """The clock to compare with :class:`ObjectInfo` mtimes (epoch seconds)."""


def object_store(uri: str, options: Mapping[str, str] | None = None) -> ObjectStore:
    """The store that holds ``uri`` (a local path or a URI), configured by ``options``.

    >>> [type(object_store(u)).__name__ for u in ("/tmp/x", "s3://bucket/x", "az://container/x")]
    ['LocalStore', 'RemoteStore', 'RemoteStore']
    """
    scheme = urlsplit(uri).scheme if "://" in uri else "file"
    if scheme == "file":
        return LOCAL
    return _remote_store(tuple(sorted((checked_options(options) or {}).items())))


def object_sizes(uris: Sequence[str], options: Mapping[str, str] | None = None) -> list[int | None]:
    """The size of each object of ``uris`` (None: missing), in order. On an object store each
    is a request: they run in parallel.

    >>> object_sizes(["/nonexistent/x"])
    [None]
    """
    return each_uri(uris, lambda u: object_store(u, options).size(u))


def each_uri(uris: Sequence[str], call: Callable[[str], T]) -> list[T]:
    """``call`` on each uri, in order; on an object store the calls (a request each, mostly
    waiting) run in parallel, locally one after another (a system call each: a thread would
    cost more than they do).

    >>> each_uri(["/a", "/b"], len)
    [2, 2]
    """
    if all(is_local(u) for u in uris):
        return [call(u) for u in uris]
    with ThreadPoolExecutor(min(len(uris), STAT_THREADS)) as pool:
        return list(pool.map(call, uris))


def put_new(store: ObjectStore, uri: str, data: bytes) -> bool:
    """Create the object at ``uri`` holding ``data`` unless one exists (``O_EXCL`` locally, a
    conditional PUT on an object store); whether this call created it. What claims, locks and owner
    markers are made of: of racing callers, exactly one gets True (on an object store, for
    ``data`` of up to :data:`SINGLE_PUT_BYTES`).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x")
    >>> put_new(LOCAL, path, b"a"), put_new(LOCAL, path, b"b"), open(path, "rb").read()
    (True, False, b'a')
    """
    try:
        new = store.create(uri)
    except FileExistsError:
        return False
    try:
        new.write(data)
        new.close()
    except FileExistsError:  # on an object store, the conditional PUT at close lost
        return False
    except BaseException as exc:
        cleanup_after(exc, new.abort)
        raise
    return True


def remove_folder(folder: str, options: Mapping[str, str] | None = None) -> None:
    """Delete every object directly in ``folder`` and, locally, the folder (best effort: what
    is left, gc removes).

    >>> import tempfile, os
    >>> folder = os.path.join(tempfile.mkdtemp(), "claims")
    >>> os.mkdir(folder); _ = open(os.path.join(folder, "a"), "wb").write(b"x")
    >>> remove_folder(folder); os.path.exists(folder)
    False
    """
    store = object_store(folder, options)
    try:
        for page in in_pages(store.walk(folder)):
            store.delete_many([f"{folder}/{info.name}" for info in page])
        if is_local(folder):  # object stores have no folders
            os.rmdir(uri_to_path(folder))
    except (OSError, StoreError):  # best effort: gc removes what is left
        return


def in_pages(items: Iterable[T], size: int = 1000) -> Iterator[list[T]]:
    """``items`` a page at a time: what one bulk delete takes, never a whole listing.

    >>> list(in_pages(range(5), 2))
    [[0, 1], [2, 3], [4]]
    """
    page: list[T] = []
    for info in items:
        page.append(info)
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page


def read_object(
    uri: str, options: Mapping[str, str] | None = None, size: int | None = None
) -> bytes:
    """The whole object at ``uri`` (:class:`FileNotFoundError` when there is none); ``size``:
    its size as a listing gave it, or more than it can hold (what there is is read), which
    saves a request on an object store.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"abc")
    >>> read_object(path), read_object(path, size=3)
    (b'abc', b'abc')
    """
    store = object_store(uri, options)
    size = store.size(uri) if size is None else size
    if size is None:
        raise FileNotFoundError("no such file")
    source = store.open(uri)
    try:
        return source.read(0, size)
    finally:
        source.close()


_ANSWERED: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
_ANSWER_KEPT_SECONDS = 60.0  # a store that answered is not asked again for this long


def check_answers(uri: str, options: Mapping[str, str] | None, doing: str = "reach") -> None:
    """Fail fast, with a :class:`~blobhouse.errors.StoreError` naming ``uri`` and its store,
    when the store that holds it does not answer a listing of it within
    :data:`ANSWER_SECONDS`: Lance would wait out its timeouts and retries for each of the
    requests the call makes. An error is an answer (the call that follows reports it); a store
    that answered is not asked again for a minute. Local paths are not asked.

    >>> check_answers("/tmp/anywhere", None)
    """
    if is_local(uri):
        return
    object_store(uri, options)._at(uri)  # settings no store can be set up with: refused here
    parts = urlsplit(uri)
    key = (parts.scheme, parts.netloc, tuple(sorted((options or {}).items())))
    if time.monotonic() - _ANSWERED.get(key, -_ANSWER_KEPT_SECONDS) < _ANSWER_KEPT_SECONDS:
        return
    _ask(uri, options, doing)
    _ANSWERED[key] = time.monotonic()


def _ask(uri: str, options: Mapping[str, str] | None, doing: str) -> None:
    """List ``uri`` once; a :class:`~blobhouse.errors.StoreError` when its store does not
    answer within :data:`ANSWER_SECONDS` (an error is an answer)."""
    answered = threading.Event()

    def ask() -> None:
        with contextlib.suppress(Exception):
            next(iter(object_store(uri, options).walk(uri)), None)
        answered.set()

    # a thread of its own: a store that never answers holds it (not the caller) until its
    # request's own timeout
    threading.Thread(target=ask, name="blobhouse-store-check", daemon=True).start()
    if not answered.wait(ANSWER_SECONDS):
        parts = urlsplit(uri)
        where = _option(options or {}, "endpoint") or f"{parts.scheme}://{parts.netloc}"
        raise StoreError(
            f"cannot {doing} {uri}: its store ({where}) did not answer a listing within "
            f"{ANSWER_SECONDS:g} s; check the endpoint, the network and the credentials "
            "(docs/object-storage.md: Timeouts)"
        )


def while_answering(
    uri: str, options: Mapping[str, str] | None, read: Callable[[], T], doing: str = "read"
) -> T:
    """``read()`` (a read by Lance of ``uri``, on a store), failed with a
    :class:`~blobhouse.errors.StoreError` once its store, asked after every
    :data:`ANSWER_SECONDS` the read runs, does not answer a listing within that bound either:
    Lance waits out each request's timeout several times (minutes) before it fails a read. A
    read of a store that answers may take as long as it takes. Reads only: an abandoned read
    goes on in the background until its own timeouts, which a commit never may.

    >>> while_answering("/tmp/local", None, lambda: 42)
    42
    """
    if is_local(uri):
        return read()
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, read()))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="blobhouse-read", daemon=True).start()
    while not done.wait(ANSWER_SECONDS):
        _ask(uri, options, doing)
    succeeded, value = outcome[0]
    if not succeeded:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


#: the longest name of a file or folder on local file systems (NAME_MAX: Linux, macOS), in bytes
NAME_MAX = 255


def long_name(uri: str) -> str | None:
    """Why the local ``uri`` cannot name a file or folder: a component longer than
    :data:`NAME_MAX` bytes (UTF-8 bytes, not characters); None when every one fits, and on an
    object store, whose keys are not local names (an S3 key holds 1,024 bytes).

    >>> long_name("/data/" + "é" * 200)  # doctest: +ELLIPSIS
    "its component 'éééééééééééééééééééééééé...' is 400 bytes long; a local file or ... 255 bytes"
    >>> long_name("/data/t"), long_name("s3://bucket/" + "a" * 300)
    (None, None)
    """
    if not is_local(uri):
        return None
    for part in uri_to_path(uri).split("/"):
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            return (
                f"its component {part[:24] + '...'!r} is {size} bytes long; a local file or "
                f"folder name holds at most {NAME_MAX} bytes"
            )
    return None


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a local path or a ``file://`` URI."""
    return "://" not in uri or uri.startswith("file://")


def uri_to_path(uri: str) -> str:
    """The local path of a ``file://`` URI, or of Spark's and Hadoop's ``file:/path`` (other
    URIs and local paths unchanged).

    >>> uri_to_path("file:///data/my%20clips/a.mp4"), uri_to_path("file:/data/t")
    ('/data/my clips/a.mp4', '/data/t')
    """
    if uri.startswith("file://"):
        return unquote(urlsplit(uri).path)
    if uri.startswith("file:/"):
        return unquote(uri.removeprefix("file:"))
    return uri


_PREFETCH = hasattr(os, "posix_fadvise")  # Linux


class LocalStore:
    """Objects are files; new ones are created with ``O_EXCL``."""

    parallel_min_bytes = 4 * MiB
    coalesce_gap = 0
    read_buffer_bytes = 1 * MiB
    # hinted (:meth:`_LocalFile.prefetch`), one thread's reads reach the disk at once, so more
    # threads than cores add nothing cold and contend for the GIL warm: 1,000 reads of 5-64 KB
    # from the page cache, checked, took 24 ms on 2 threads and 33 ms on 8 (cold: the same)
    max_read_threads = (os.cpu_count() or 1) if _PREFETCH else 0

    def size(self, uri: str) -> int | None:
        try:
            info = os.stat(uri_to_path(uri))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None

    def open(self, uri: str) -> RangeSource:
        # non-blocking, so a FIFO put where an object belongs is refused, not waited on
        fd = os.open(uri_to_path(uri), os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return _LocalFile(fd)

    def create(self, uri: str, fresh: bool = False) -> NewObject:
        path = uri_to_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return _LocalNewFile(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def put(self, uri: str, data: bytes) -> None:
        # written beside, then renamed over: a reader never sees it half written (a lock's
        # token, a lease), and a symbolic link left at the path is replaced, never written
        # through to wherever it points
        path = uri_to_path(uri)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        staged = os.path.join(folder, f".{uuid.uuid4().hex[:16]}.put")  # short: any name fits
        try:
            with open(staged, "xb") as file:
                file.write(data)
            os.replace(staged, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(staged)
            raise

    def delete(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(uri_to_path(uri))

    def delete_many(self, uris: Sequence[str]) -> None:
        for uri in uris:
            self.delete(uri)

    def list(self, uri: str) -> list[ObjectInfo]:
        return list(self.walk(uri))

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        # os.walk descends into no symlinked directory: a listing stays inside ``uri``, and
        # lists the link itself, as an object (what it leads to is not ``uri``'s)
        root = uri_to_path(uri).rstrip("/")
        for folder, dirs, names in os.walk(root):
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            # os.walk yields root's own subfolders below it: their names relative to root
            # without a relpath per file (two abspaths each: most of a big folder's listing)
            within = os.path.relpath(folder, root)
            within = "" if within == "." else within + os.sep
            for name in [*names, *links]:
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):  # removed while listed
                    info = os.lstat(path)
                    yield ObjectInfo(within + name, info.st_size, info.st_mtime)

    def now(self, uri: str) -> float:
        return time.time()


class _LocalFile:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def read_into(self, position: int, target: memoryview) -> int:
        filled = 0
        while filled < len(target):
            n = os.preadv(self._fd, [target[filled:]], position + filled)
            if n == 0:
                break
            filled += n
        return filled

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        # one thread's reads otherwise reach the disk one at a time: hinted, they are all
        # queued at once (cold 100 KB reads ran 1.5x faster). A hint costs 2-10 us even when
        # the pages are cached, so the first range is looked up first: cached, none is hinted.
        # An empty range is left out: a hint of length 0 runs to the end of the file
        ranges = [r for r in ranges if r[1] > 0]
        if not _PREFETCH or not ranges or is_cached(self._fd, *ranges[0]):
            return
        for position, size in ranges:
            os.posix_fadvise(self._fd, position, size, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        os.close(self._fd)


class _LocalNewFile:
    def __init__(self, path: str, fd: int) -> None:
        self._path, self._fd = path, fd

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._fd, view) :]

    def write_many(self, chunks: Sequence[bytes | memoryview]) -> None:
        # one writev per IOV_MAX chunks: a write each was a third of a write of 4 KB payloads
        if not _IOV_MAX:  # no writev (Windows)
            for chunk in chunks:
                self.write(chunk)
            return
        pending = collections.deque(memoryview(c).cast("B") for c in chunks if len(c))
        while pending:
            done = os.writev(self._fd, list(itertools.islice(pending, _IOV_MAX)))
            while done:  # a short write ends inside one chunk: its rest goes first next time
                if done < len(pending[0]):
                    pending[0] = pending[0][done:]
                    break
                done -= len(pending.popleft())

    def close(self) -> None:
        os.close(self._fd)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path)


# chunks one writev takes (0: the platform has no writev)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "writev") else 0
LOCAL = LocalStore()


#: the schemes of :class:`RemoteStore`
REMOTE_SCHEMES = ("s3", "s3a", "az", "azure", "abfs", "abfss", "adl", "gs", "http", "https")


class RemoteStore:
    """Objects of every store Lance reaches but the local disk (``s3://``, ``az://``,
    ``gs://``, ``http(s)://``, ...), through obstore (the Python bindings of object_store, the
    crate Lance itself uses), configured by the same storage options as Lance
    (:func:`obstore_settings`): one request per operation (a listing: one per 1000 keys). New
    objects never replace one that exists (:class:`_RemoteNewObject`)."""

    parallel_min_bytes = 0  # a request waits on the network: run many at once
    coalesce_gap = 256 * 1024  # reading that much more costs less than a second request
    max_read_threads = 0
    read_buffer_bytes = UPLOAD_PART_BYTES  # a GET per 8 MiB of a blob read front to back

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    def _at(self, uri: str):
        """The obstore store of ``uri``'s bucket or container, and the object's path in it."""
        parts = urlsplit(uri)
        if parts.scheme not in REMOTE_SCHEMES:
            stores = ", ".join(f"{scheme}://" for scheme in REMOTE_SCHEMES)
            raise InvalidInputError(
                f"{uri}: {parts.scheme}:// is no store blobhouse reaches (local paths, {stores})"
            )
        try:
            store = _obstore(parts.scheme, parts.netloc, tuple(sorted(self.options.items())))
        except Exception as exc:  # obstore: settings it cannot set a store up with
            raise InvalidInputError(
                f"cannot reach {uri}: {_first(exc)}; give the store's settings as storage "
                "options or in its environment variables (docs/object-storage.md)"
            ) from None
        return store, unquote(parts.path).lstrip("/")

    def size(self, uri: str) -> int | None:
        import obstore

        store, path = self._at(uri)
        try:
            with _obstore_errors("stat", uri):
                return obstore.head(store, path)["size"]
        except FileNotFoundError:
            return None

    def open(self, uri: str) -> RangeSource:
        store, path = self._at(uri)
        return _RemoteObject(store, path, uri)

    def create(self, uri: str, fresh: bool = False) -> NewObject:
        store, path = self._at(uri)
        return _RemoteNewObject(store, path, uri, fresh)

    def put(self, uri: str, data: bytes) -> None:
        import obstore

        store, path = self._at(uri)
        with _obstore_errors("write", uri):
            obstore.put(store, path, data)

    def delete(self, uri: str) -> None:
        import obstore

        store, path = self._at(uri)
        with contextlib.suppress(FileNotFoundError), _obstore_errors("delete", uri):
            obstore.delete(store, path)

    def delete_many(self, uris: Sequence[str]) -> None:
        import obstore

        by_bucket: dict[tuple[str, str], list[str]] = {}
        for uri in uris:
            parts = urlsplit(uri)
            by_bucket.setdefault((parts.scheme, parts.netloc), []).append(uri)
        for same in by_bucket.values():
            store, _ = self._at(same[0])
            paths = [self._at(uri)[1] for uri in same]
            try:
                with _obstore_errors("delete", same[0]):
                    obstore.delete(store, paths)
            except FileNotFoundError:
                # Azure fails a batch naming an object already gone (another remover's):
                # what is left, one request each (an object gone is no failure then)
                with ThreadPoolExecutor(min(len(same), STAT_THREADS)) as pool:
                    list(pool.map(self.delete, same))

    def list(self, uri: str) -> list[ObjectInfo]:
        return list(self.walk(uri))

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        import obstore

        store, path = self._at(uri)
        prefix = path.rstrip("/")
        marker: ObjectInfo | None = None  # an empty object, perhaps another tool's "folder/"
        with _obstore_errors("list", uri):
            for page in obstore.list(store, prefix=prefix or None, chunk_size=1000):
                for meta in page:
                    name = meta["path"][len(prefix) :].lstrip("/") if prefix else meta["path"]
                    if not name:
                        continue
                    info = ObjectInfo(name, meta["size"], meta["last_modified"].timestamp())
                    # keys come in order: a directory marker ("data/", listed as "data")
                    # comes right before the objects in it, and is skipped
                    if marker is not None and not name.startswith(f"{marker.name}/"):
                        yield marker
                    marker = info if info.size == 0 else None
                    if marker is None:
                        yield info
        if marker is not None:
            yield marker

    def now(self, uri: str) -> float:
        # obstore shows no response's Date header, and a probe write would land beside the
        # caller's objects (inside a lock's folder, say): this machine's clock (docs: Limits),
        # a second early, as object times are whole seconds (S3, Azure): no age is overstated
        return time.time() - 1.0


class _RemoteObject:
    def __init__(self, store, path: str, uri: str) -> None:
        self._store, self._path, self._uri = store, path, uri

    def _get(self, position: int, size: int):
        import obstore

        if size <= 0:
            return b""
        try:
            with _obstore_errors("read", self._uri):
                # a range past the end gives the bytes there are, as a file does
                return obstore.get_range(self._store, self._path, start=position, length=size)
        except _RangeNotSatisfiable:
            return b""  # the range starts at or after the end of the object

    def read(self, position: int, size: int) -> bytes:
        return bytes(self._get(position, size))

    def read_into(self, position: int, target: memoryview) -> int:
        data = memoryview(self._get(position, len(target)))
        target[: len(data)] = data
        return len(data)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        return None

    def close(self) -> None:
        return None


class _RemoteNewObject:
    """A new object, invisible until :meth:`close`. Up to :data:`SINGLE_PUT_BYTES` it is held
    in memory and written with one conditional PUT: of racing creators the store lets exactly
    one win (claims, locks and markers are such objects). A bigger one -- a sidecar, in the
    folder of a data file named with a random 128-bit id, or a pack -- is refused if its name
    is taken when it grows past that size (a sidecar's number may be one a caller chose; a
    ``fresh`` name, a pack's own random id, is not asked for), then streamed as a multipart
    upload (:class:`_Upload`: memory stays bounded) that completes at :meth:`close`
    (object_store cannot make a multipart upload conditional)."""

    def __init__(self, store, path: str, uri: str, fresh: bool = False) -> None:
        self._store, self._path, self._uri = store, path, uri
        self._fresh = fresh
        self._buffer = bytearray()
        self._upload: _Upload | None = None

    def write_many(self, chunks: Sequence[bytes | memoryview]) -> None:
        self.write(b"".join(chunks))  # one copy, which the upload makes of any part anyway

    def write(self, data: bytes | memoryview) -> None:
        if self._upload is not None:
            self._upload.write(data)
            return
        self._buffer += data
        if len(self._buffer) > SINGLE_PUT_BYTES:
            self._start_upload()

    def _start_upload(self) -> None:
        import obstore

        if not self._fresh:  # a pack's random name is never taken: not asked for
            try:
                with _obstore_errors("create", self._uri):
                    obstore.head(self._store, self._path)
            except FileNotFoundError:
                pass
            else:
                raise FileExistsError(f"{self._uri} already exists")
        self._upload = _Upload(self._store, self._path, self._uri)
        self._upload.write(self._buffer)
        self._buffer = bytearray()

    def close(self) -> None:
        import obstore

        try:
            if self._upload is not None:
                self._upload.finish()
                return
            with _obstore_errors("create", self._uri):
                obstore.put(self._store, self._path, self._buffer, mode="create")
        except BaseException as exc:
            cleanup_after(exc, self.abort)
            raise
        finally:
            self._buffer = bytearray()

    def abort(self) -> None:
        self._buffer = bytearray()
        if self._upload is not None:
            self._upload.abort()
            self._upload = None


class _Upload:
    """A multipart upload fed by :meth:`write`: obstore reads the parts from a short queue on a
    thread of its own (so memory stays bounded); :meth:`abort` ends the feed with an error, on
    which obstore aborts the upload, leaving nothing."""

    _END, _ABORT = object(), object()

    def __init__(self, store, path: str, uri: str) -> None:
        self._uri = uri
        self._parts: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(store, path), name="blobhouse-upload", daemon=True
        )
        self._thread.start()

    def _run(self, store, path: str) -> None:
        import obstore

        try:
            with _obstore_errors("upload", self._uri):
                obstore.put(
                    store,
                    path,
                    self._feed(),
                    chunk_size=UPLOAD_PART_BYTES,
                    max_concurrency=UPLOAD_PARTS_IN_FLIGHT,
                )
        except BaseException as exc:
            self._error = exc

    def _feed(self) -> Iterator[bytes]:
        while (part := self._parts.get()) is not self._END:
            if part is self._ABORT:
                raise _UploadAborted()
            yield part

    def write(self, data: bytes | memoryview) -> None:
        self._send(bytes(data))

    def finish(self) -> None:
        """Complete the upload: the object appears whole."""
        self._send(self._END)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._send(self._ABORT)
        self._thread.join()

    def _send(self, part: object) -> None:
        while True:  # the uploading thread may have failed: never wait on it forever
            if self._error is not None or not self._thread.is_alive():
                raise self._error or StoreError(f"cannot upload {self._uri}: the upload ended")
            with contextlib.suppress(queue.Full):
                self._parts.put(part, timeout=0.5)
                return


class _UploadAborted(Exception):
    """Ends an upload's feed: obstore aborts the upload."""


class _RangeNotSatisfiable(OSError):
    pass


@contextlib.contextmanager
def _obstore_errors(action: str, uri: str):
    """obstore's errors as the OSErrors callers handle, naming the object."""
    from obstore.exceptions import AlreadyExistsError, PermissionDeniedError, UnauthenticatedError

    try:
        yield
    except FileNotFoundError as exc:
        code = _ERROR_CODE.search(str(exc))  # NoSuchBucket, ContainerNotFound: say which
        raise FileNotFoundError(
            f"cannot {action} {uri}: {code[1] if code else 'not found'} ({_first(exc)})"
        ) from None
    except AlreadyExistsError:
        raise FileExistsError(f"{uri} already exists") from None
    except (PermissionDeniedError, UnauthenticatedError) as exc:
        raise PermissionError(f"cannot {action} {uri}: {_first(exc)}") from None
    except Exception as exc:
        if isinstance(exc, OSError):
            raise
        text = str(exc)
        message = f"cannot {action} {uri}: {_first(exc)}"
        if (code := _ERROR_CODE.search(text)) is not None:  # the store's own word for it
            message = f"cannot {action} {uri}: {code[1]} ({_first(exc)})"
        if " 416 Range Not Satisfiable" in text:
            raise _RangeNotSatisfiable(message) from None
        if " 404 Not Found" in text:  # a listing in a bucket that is not there, say
            raise FileNotFoundError(message) from None
        if " 403 Forbidden" in text:
            raise PermissionError(message) from None
        raise StoreError(message) from None


_ERROR_CODE = re.compile(r"<Code>(\w+)</Code>")  # S3's and Azure's XML error bodies
#: the store's word for a bucket or container that is not there, in an error's message
MISSING_BUCKET = re.compile(r"\b(NoSuchBucket|ContainerNotFound)\b")


def _first(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@functools.lru_cache(maxsize=32)
def _obstore(scheme: str, netloc: str, items: tuple[tuple[str, str], ...]):
    """The obstore store of one bucket or container (cached: it holds a connection pool)."""
    from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store, from_url

    config, client, retry = obstore_settings(scheme, dict(items))
    kwargs = {"client_options": client, **({"retry_config": retry} if retry else {})}
    if scheme in ("s3", "s3a"):
        return S3Store(netloc, config=config, **kwargs)
    if scheme in ("az", "azure"):
        return AzureStore(netloc, config=config, **kwargs)
    if scheme == "gs":
        return GCSStore(netloc, config=config, **kwargs)
    if scheme in ("http", "https"):
        return HTTPStore.from_url(f"{scheme}://{netloc}", **kwargs)
    return from_url(f"{scheme}://{netloc}", config=config, **kwargs)


def obstore_settings(
    scheme: str, options: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, object], dict[str, object]]:
    """Lance's storage options as obstore takes them for a store of ``scheme``: the store's
    own keys (``config``), the HTTP client's (``client_options``: obstore refuses them in
    ``config``) and Lance's retry budget (``retry_config``); keys of other stores dropped.

    >>> obstore_settings("az", {"account_name": "a", "allow_http": "true", "aws_region": "x",
    ...                         "client_max_retries": "1"})
    ({'account_name': 'a'}, {'allow_http': True}, {'max_retries': 1})
    """
    from blobhouse.io.storage_options import AZURE, CLIENT, GOOGLE, S3

    azure = {*AZURE, *(f"azure_{n}" for n in AZURE)}
    s3 = {*S3, *(n.removeprefix("aws_") for n in S3)}
    own = {
        **dict.fromkeys(("s3", "s3a"), s3),
        "gs": {*GOOGLE, *(f"google_{n}" for n in GOOGLE)},
        **dict.fromkeys(("az", "azure", "abfs", "abfss"), azure),
    }.get(scheme, set())
    config: dict[str, str] = {}
    client: dict[str, object] = {}
    retry: dict[str, object] = {}
    for key, value in options.items():
        name = key.lower()
        bare = name.removeprefix("aws_").removeprefix("azure_").removeprefix("google_")
        if bare in CLIENT:
            client[bare] = value.lower() == "true" if value.lower() in ("true", "false") else value
        elif name == "client_max_retries":
            retry["max_retries"] = int(value)
        elif name == "client_retry_timeout":
            retry["retry_timeout"] = timedelta(seconds=float(value))
        elif name in own:
            config[name] = value
    prefix = _ENV_PREFIX.get(scheme)
    for name in CLIENT:  # obstore reads only the store's own keys from the environment
        value = os.environ.get(f"{prefix}_{name}".upper()) if prefix else None
        if name not in client and value is not None:
            client[name] = value.lower() == "true" if value.lower() in ("true", "false") else value
    return config, client, retry


# the prefix of a store's environment variables (``AWS_ALLOW_HTTP``, as Lance reads them)
_ENV_PREFIX = (
    dict.fromkeys(("s3", "s3a"), "aws")
    | dict.fromkeys(("az", "azure", "abfs", "abfss"), "azure")
    | {"gs": "google"}
)


@functools.lru_cache(maxsize=32)
def _remote_store(items: tuple[tuple[str, str], ...]) -> RemoteStore:
    return RemoteStore(dict(items))
