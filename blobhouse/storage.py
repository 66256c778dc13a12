"""Object storage: every object blobhouse reads, writes, lists or deletes itself, on a local
disk or an S3-compatible store (Lance does its own I/O, with the same storage options).

One options dict, in Lance's spelling, configures both: it goes to pylance unchanged and is
translated here for boto3. :func:`checked_options` checks and normalizes it once, at the entry
points. :func:`object_store` picks the backend of a URI:

- local paths and ``file://`` URIs: plain system calls; new objects are created with
  ``O_EXCL``;
- ``s3://``: boto3, one request per operation; new objects are created with a conditional
  PUT (``If-None-Match: *``), so an existing object is never overwritten, as locally;
- other schemes (``az://``, ``gs://``, ``http(s)://``, ...): obstore, the Python bindings of
  the object_store crate Lance uses, with the same options; new objects are created with a
  conditional PUT too.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> store = object_store(root)
>>> store.put(f"{root}/a/b.bin", b"hello")
>>> [(o.name, o.size) for o in store.list(root)]
[('a/b.bin', 5)]
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import unquote, urlsplit

from blobhouse.errors import InvalidInputError, StoreError, cleanup_after
from blobhouse.storage_options import check_option_names

StorageOptions = dict[str, str]

MiB = 1024 * 1024
# S3 parts must be 5 MiB or more (but the last); bigger parts mean fewer requests, more memory
S3_PART_BYTES = 8 * MiB
S3_PARTS_IN_FLIGHT = 4  # per object: up to 32 MiB buffered
S3_MAX_CONNECTIONS = 32
STAT_THREADS = 16  # HEAD requests in flight when sizing many objects
# what Lance's file API raises on I/O failures: OSError locally, RuntimeError ("LanceError(IO)")
# on object stores
LANCE_IO_ERRORS = (OSError, RuntimeError)
#: every request's budget, unless the caller sets one (Lance's names; Lance, obstore and boto3 all
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
    read is refused, naming the closest (:func:`~blobhouse.storage_options.check_option_names`).

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


def _check_budget(options: StorageOptions) -> None:
    """Durations and counts of the request budget checked (a number of seconds taken for a
    duration: Lance wants ``30s``), and :data:`REQUEST_BUDGET` for what is not given."""
    for key, value in list(options.items()):
        bare = key.lower().removeprefix("aws_").removeprefix("azure_").removeprefix("google_")
        if bare in ("timeout", "connect_timeout"):
            if value.strip().isdigit():
                options[key] = value = f"{value.strip()}s"
            if not _DURATION.fullmatch(value.strip()):
                raise InvalidInputError(
                    f"storage option {key!r} must be a duration like '30s' or '500ms', "
                    f"got {value!r}"
                )
        elif bare in ("client_max_retries", "client_retry_timeout") and not value.isdigit():
            what = "a number of retries" if bare == "client_max_retries" else "a number of seconds"
            raise InvalidInputError(f"storage option {key!r} must be {what}, got {value!r}")
    for name, value in REQUEST_BUDGET.items():
        if _option(options, name) is None:
            options[name] = value


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

    def close(self) -> None: ...


class NewObject(Protocol):
    """An object being created (see :meth:`ObjectStore.create`): it is visible whole at
    ``close`` on S3, and never replaces an object that exists."""

    def write(self, data: bytes | memoryview) -> None: ...

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
    #: how much a file object over a blob reads at once (``open_blob``, ``open_ref``)
    read_buffer_bytes: int

    def size(self, uri: str) -> int | None:
        """The object's size, None if there is no object (or it is not a regular file)."""

    def open(self, uri: str) -> RangeSource:
        """The object, for ranged reads; :class:`FileNotFoundError` if it is missing."""

    def create(self, uri: str) -> NewObject:
        """A new object; :class:`FileExistsError` if one exists at ``uri``."""

    def put(self, uri: str, data: bytes) -> None:
        """Write the whole object, replacing any (its modification time becomes now)."""

    def delete(self, uri: str) -> None:
        """Remove the object if it exists."""

    def list(self, uri: str) -> list[ObjectInfo]:
        """Every object below ``uri`` (recursively; none if the prefix does not exist)."""

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        """The objects below ``uri`` as they are listed, a page at a time (:meth:`list`
        lazily: a caller looking for one may stop early)."""

    def now(self, uri: str) -> float:
        """The store's clock (epoch seconds), to compare with :class:`ObjectInfo` mtimes."""

    def abort_uploads(self, uri: str, before: float, keep: Callable[[str], bool]) -> int:
        """Abort unfinished uploads below ``uri`` started before ``before``, but those whose
        name (relative to ``uri``) ``keep`` holds on to; how many."""


def object_store(uri: str, options: Mapping[str, str] | None = None) -> ObjectStore:
    """The store that holds ``uri`` (a local path or a URI), configured by ``options``.

    >>> [type(object_store(u)).__name__ for u in ("/tmp/x", "s3://bucket/x", "az://container/x")]
    ['LocalStore', 'S3Store', 'RemoteStore']
    """
    scheme = urlsplit(uri).scheme if "://" in uri else "file"
    if scheme == "file":
        return LOCAL
    if scheme in ("s3", "s3a"):
        return _s3_store(tuple(sorted((checked_options(options) or {}).items())))
    return _remote_store(tuple(sorted((checked_options(options) or {}).items())))


def object_sizes(uris: Sequence[str], options: Mapping[str, str] | None = None) -> list[int | None]:
    """The size of each object of ``uris`` (None: missing), in order. On an object store each
    is a request: they run in parallel.

    >>> object_sizes(["/nonexistent/x"])
    [None]
    """
    if all(is_local(u) for u in uris):  # a stat each: a thread would cost more than them
        return [LOCAL.size(u) for u in uris]
    with ThreadPoolExecutor(min(len(uris), STAT_THREADS)) as pool:
        return list(pool.map(lambda u: object_store(u, options).size(u), uris))


def put_new(store: ObjectStore, uri: str, data: bytes) -> bool:
    """Create the object at ``uri`` holding ``data`` unless one exists (``O_EXCL`` locally, a
    conditional PUT on S3); whether this call created it. What claims, locks and owner
    markers are made of: of racing callers, exactly one gets True.

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


def read_object(uri: str, options: Mapping[str, str] | None = None) -> bytes:
    """The whole object at ``uri`` (:class:`FileNotFoundError` when there is none).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"abc")
    >>> read_object(path)
    b'abc'
    """
    store = object_store(uri, options)
    size = store.size(uri)
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
    parts = urlsplit(uri)
    key = (parts.scheme, parts.netloc, tuple(sorted((options or {}).items())))
    if time.monotonic() - _ANSWERED.get(key, -_ANSWER_KEPT_SECONDS) < _ANSWER_KEPT_SECONDS:
        return
    answered = threading.Event()

    def ask() -> None:
        with contextlib.suppress(Exception):
            next(iter(object_store(uri, options).walk(uri)), None)
        answered.set()

    # a thread of its own: a store that never answers holds it (not the caller) until its
    # request's own timeout
    threading.Thread(target=ask, name="blobhouse-store-check", daemon=True).start()
    if not answered.wait(ANSWER_SECONDS):
        where = _option(options or {}, "endpoint") or f"{parts.scheme}://{parts.netloc}"
        raise StoreError(
            f"cannot {doing} {uri}: its store ({where}) did not answer a listing within "
            f"{ANSWER_SECONDS:g} s; check the endpoint, the network and the credentials "
            "(docs/object-storage.md: Timeouts)"
        )
    _ANSWERED[key] = time.monotonic()


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


class LocalStore:
    """Objects are files; new ones are created with ``O_EXCL``."""

    parallel_min_bytes = 4 * MiB
    coalesce_gap = 0
    read_buffer_bytes = 1 * MiB

    def size(self, uri: str) -> int | None:
        try:
            info = os.stat(uri_to_path(uri))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None

    def open(self, uri: str) -> RangeSource:
        return _LocalFile(os.open(uri_to_path(uri), os.O_RDONLY))

    def create(self, uri: str) -> NewObject:
        path = uri_to_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return _LocalNewFile(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def put(self, uri: str, data: bytes) -> None:
        path = uri_to_path(uri)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)

    def delete(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(uri_to_path(uri))

    def list(self, uri: str) -> list[ObjectInfo]:
        return list(self.walk(uri))

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        # os.walk descends into no symlinked directory: a listing stays inside ``uri``
        root = uri_to_path(uri).rstrip("/")
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):  # removed while listed
                    info = os.lstat(path)
                    yield ObjectInfo(os.path.relpath(path, root), info.st_size, info.st_mtime)

    def now(self, uri: str) -> float:
        return time.time()

    def abort_uploads(self, uri: str, before: float, keep: Callable[[str], bool]) -> int:
        return 0


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

    def close(self) -> None:
        os.close(self._fd)


class _LocalNewFile:
    def __init__(self, path: str, fd: int) -> None:
        self._path, self._fd = path, fd

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        os.close(self._fd)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path)


LOCAL = LocalStore()


class S3Store:
    """Objects in an S3-compatible store, through one thread-safe boto3 client: one request per
    operation (a listing: one per 1000 keys), no directory markers, conditional PUTs for new
    objects."""

    parallel_min_bytes = 0  # a request waits on the network: run many at once
    coalesce_gap = 256 * 1024  # reading that much more costs less than a second request
    read_buffer_bytes = S3_PART_BYTES  # a GET per 8 MiB of a blob read front to back

    def __init__(self, options: Mapping[str, str]) -> None:
        self.client = _boto3_client(options)

    def size(self, uri: str) -> int | None:
        bucket, key = _bucket_key(uri)
        try:
            with _s3_errors("stat", uri):
                return self.client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        except FileNotFoundError:
            return None

    def open(self, uri: str) -> RangeSource:
        return _S3Object(self.client, uri)

    def create(self, uri: str) -> NewObject:
        return _S3Upload(self.client, uri)

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = _bucket_key(uri)
        with _s3_errors("write", uri):
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, uri: str) -> None:
        bucket, key = _bucket_key(uri)
        with _s3_errors("delete", uri):
            self.client.delete_object(Bucket=bucket, Key=key)

    def list(self, uri: str) -> list[ObjectInfo]:
        return list(self.walk(uri))

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        bucket, key = _bucket_key(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        with _s3_errors("list", uri):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(prefix) :]
                    if name and not name.endswith("/"):  # skip directory markers
                        yield ObjectInfo(name, item["Size"], item["LastModified"].timestamp())

    def now(self, uri: str) -> float:
        # the Date header of a response is the store's clock, the one object mtimes follow
        bucket, key = _bucket_key(uri)
        with _s3_errors("list", uri):  # a request gc needs the permission for anyway
            response = self.client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        date = response["ResponseMetadata"]["HTTPHeaders"].get("date")
        if date is None:
            return time.time()
        return parsedate_to_datetime(date).timestamp()

    def abort_uploads(self, uri: str, before: float, keep: Callable[[str], bool]) -> int:
        bucket, key = _bucket_key(uri)
        prefix = key.rstrip("/") + "/"
        aborted = 0
        with _s3_errors("list uploads under", uri):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=bucket, Prefix=prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    name = upload["Key"][len(prefix) :]
                    if upload["Initiated"].timestamp() < before and not keep(name):
                        self.client.abort_multipart_upload(
                            Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        aborted += 1
        return aborted


class _S3Object:
    def __init__(self, client, uri: str) -> None:
        self._client, self._uri = client, uri
        self._bucket, self._key = _bucket_key(uri)

    def read(self, position: int, size: int) -> bytes:
        if size <= 0:
            return b""
        try:
            with _s3_errors("read", self._uri):
                response = self._client.get_object(
                    Bucket=self._bucket,
                    Key=self._key,
                    Range=f"bytes={position}-{position + size - 1}",
                )
                return response["Body"].read()
        except _RangeNotSatisfiable:
            return b""  # the range starts at or after the end of the object

    def read_into(self, position: int, target: memoryview) -> int:
        data = self.read(position, len(target))
        target[: len(data)] = data
        return len(data)

    def close(self) -> None:
        pass


class _S3Upload:
    """A new S3 object: one conditional PUT up to a part's size, else a multipart upload with
    up to :data:`S3_PARTS_IN_FLIGHT` parts uploading at once and a conditional completion.
    Until it completes, nothing is visible at the key."""

    def __init__(self, client, uri: str) -> None:
        self._client, self._uri = client, uri
        self._bucket, self._key = _bucket_key(uri)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict | None] = []
        self._in_flight: deque[Future] = deque()

    def write(self, data: bytes | memoryview) -> None:
        self._buffer += data
        while len(self._buffer) > S3_PART_BYTES:  # the last part stays: it may be the only one
            self._start_part(bytes(memoryview(self._buffer)[:S3_PART_BYTES]))
            del self._buffer[:S3_PART_BYTES]

    def close(self) -> None:
        try:
            if self._upload_id is None:
                with _s3_errors("create", self._uri):
                    self._client.put_object(
                        Bucket=self._bucket,
                        Key=self._key,
                        Body=bytes(self._buffer),
                        IfNoneMatch="*",
                    )
                return
            self._start_part(bytes(self._buffer))
            while self._in_flight:
                self._in_flight.popleft().result()
            with _s3_errors("create", self._uri):
                self._client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                    IfNoneMatch="*",
                )
        except BaseException as exc:
            cleanup_after(exc, self.abort)
            raise
        finally:
            self._buffer = bytearray()

    def abort(self) -> None:
        self._buffer = bytearray()
        while self._in_flight:  # a part finishing after the abort would be billed, not visible
            with contextlib.suppress(Exception):
                self._in_flight.popleft().result()
        if self._upload_id is not None:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._key, UploadId=self._upload_id
                )
            self._upload_id = None

    def _start_part(self, body: bytes) -> None:
        if self._upload_id is None:
            with _s3_errors("upload", self._uri):
                self._upload_id = self._client.create_multipart_upload(
                    Bucket=self._bucket, Key=self._key
                )["UploadId"]
        while len(self._in_flight) >= S3_PARTS_IN_FLIGHT:  # bounds memory: parts wait here
            self._in_flight.popleft().result()
        self._parts.append(None)
        number = len(self._parts)
        self._in_flight.append(_part_pool().submit(self._upload_part, number, body))

    def _upload_part(self, number: int, body: bytes) -> None:
        with _s3_errors("upload", self._uri):
            response = self._client.upload_part(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
        self._parts[number - 1] = {"ETag": response["ETag"], "PartNumber": number}


@functools.cache
def _part_pool() -> ThreadPoolExecutor:
    """Threads that upload parts, shared by every upload of the process."""
    return ThreadPoolExecutor(S3_MAX_CONNECTIONS // 2, thread_name_prefix="blobhouse-part")


class _RangeNotSatisfiable(OSError):
    pass


@contextlib.contextmanager
def _s3_errors(action: str, uri: str):
    """botocore's errors as the OSErrors callers handle, naming the object."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = f"cannot {action} {uri}: {code or status} {error.get('Message', '')}".rstrip()
        if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
            raise FileNotFoundError(message) from None
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            raise FileExistsError(f"{uri} already exists ({code or status})") from None
        if code == "InvalidRange" or status == 416:
            raise _RangeNotSatisfiable(message) from None
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            raise PermissionError(message) from None
        raise StoreError(message) from None
    except BotoCoreError as exc:
        raise StoreError(f"cannot {action} {uri}: {exc}") from None


def _bucket_key(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    return parts.netloc, unquote(parts.path).lstrip("/")


_CLIENT_LOCK = threading.Lock()


@functools.lru_cache(maxsize=32)
def _s3_store(items: tuple[tuple[str, str], ...]) -> S3Store:
    return S3Store(dict(items))


def _boto3_client(options: Mapping[str, str]):
    """A boto3 S3 client configured like Lance is by the same options (anything not given
    comes from the environment, as it does for Lance)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    endpoint = _option(options, "endpoint")
    virtual = (_option(options, "virtual_hosted_style_request") or "").lower() == "true"
    anonymous = (_option(options, "skip_signature") or "").lower() == "true"
    budget = {n: _option(options, n) or v for n, v in REQUEST_BUDGET.items()}
    timeout = _seconds(budget["timeout"])
    # botocore has no cap on the time spent retrying: retries are spent only while they fit in
    # client_retry_timeout, as object_store spends them
    retries = min(
        int(budget["client_max_retries"]),
        int(int(budget["client_retry_timeout"]) // max(timeout, 1)),
    )
    config = Config(
        max_pool_connections=S3_MAX_CONNECTIONS,
        connect_timeout=_seconds(budget["connect_timeout"]),
        read_timeout=timeout,
        retries={"total_max_attempts": 1 + retries, "mode": "standard"},
        s3={"addressing_style": "virtual" if virtual else "path"},
        signature_version=UNSIGNED if anonymous else None,
    )
    region = (
        _option(options, "region")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1"
    )
    with _CLIENT_LOCK:  # creating clients is not thread-safe; using one is
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id=_option(options, "access_key_id"),
            aws_secret_access_key=_option(options, "secret_access_key"),
            aws_session_token=_option(options, "session_token"),
            config=config,
        )


def _seconds(duration: str) -> float:
    """A duration Lance takes (``5s``, ``500ms``, ``1m 30s``) in seconds.

    >>> _seconds("1m 30s"), _seconds("500ms")
    (90.0, 0.5)
    """
    units = {"n": 1e-9, "u": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*([a-z]+)", duration.lower()):
        key = "ms" if unit.startswith("ms") else unit[0]  # n, u, s, m(in), h
        total += int(number) * units[key]
    return total


#: the schemes of :class:`RemoteStore` (obstore's; ``s3``, ``s3a`` go to :class:`S3Store`)
REMOTE_SCHEMES = ("az", "azure", "abfs", "abfss", "adl", "gs", "http", "https", "s3", "s3a")


class RemoteStore:
    """Objects of every other store Lance reaches (``az://``, ``gs://``, ``http(s)://``, ...),
    through obstore (the Python bindings of object_store, the crate Lance itself uses),
    configured by the same storage options as Lance (:func:`obstore_settings`). New objects
    are created with a conditional PUT, so an existing one is never replaced."""

    parallel_min_bytes = 0  # a request waits on the network: run many at once
    coalesce_gap = 256 * 1024  # reading that much more costs less than a second request
    read_buffer_bytes = S3_PART_BYTES

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
        return _obstore(parts.scheme, parts.netloc, tuple(sorted(self.options.items()))), unquote(
            parts.path
        ).lstrip("/")

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

    def create(self, uri: str) -> NewObject:
        store, path = self._at(uri)
        if self.size(uri) is not None:  # fail early; the conditional PUT decides at close
            raise FileExistsError(f"{uri} already exists")
        return _RemoteNewObject(store, path, uri)

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

    def list(self, uri: str) -> list[ObjectInfo]:
        return list(self.walk(uri))

    def walk(self, uri: str) -> Iterator[ObjectInfo]:
        import obstore

        store, path = self._at(uri)
        prefix = path.rstrip("/")
        with _obstore_errors("list", uri):
            for page in obstore.list(store, prefix=prefix or None, chunk_size=1000):
                for meta in page:
                    name = meta["path"][len(prefix) :].lstrip("/") if prefix else meta["path"]
                    if name:
                        yield ObjectInfo(name, meta["size"], meta["last_modified"].timestamp())

    def now(self, uri: str) -> float:
        # obstore shows no response's Date header, and a probe write would land beside the
        # caller's objects (inside a lock's folder, say): this machine's clock (docs: Limits)
        return time.time()

    def abort_uploads(self, uri: str, before: float, keep: Callable[[str], bool]) -> int:
        return 0  # new objects are single PUTs: no upload is left unfinished


class _RemoteObject:
    def __init__(self, store, path: str, uri: str) -> None:
        self._store, self._path, self._uri = store, path, uri

    def read(self, position: int, size: int) -> bytes:
        import obstore

        if size <= 0:
            return b""
        try:
            with _obstore_errors("read", self._uri):
                return bytes(
                    obstore.get_range(self._store, self._path, start=position, length=size)
                )
        except OSError:
            # a range past the end: the bytes there are, as a file gives them
            with _obstore_errors("read", self._uri):
                total = obstore.head(self._store, self._path)["size"]
            if position >= total:
                return b""
            with _obstore_errors("read", self._uri):
                return bytes(obstore.get_range(self._store, self._path, start=position, end=total))

    def read_into(self, position: int, target: memoryview) -> int:
        data = self.read(position, len(target))
        target[: len(data)] = data
        return len(data)

    def close(self) -> None:
        return None


class _RemoteNewObject:
    """Buffered, then written with one conditional PUT at :meth:`close`."""

    def __init__(self, store, path: str, uri: str) -> None:
        self._store, self._path, self._uri = store, path, uri
        self._parts: list[bytes] = []

    def write(self, data: bytes | memoryview) -> None:
        self._parts.append(bytes(data))

    def close(self) -> None:
        import obstore

        with _obstore_errors("write", self._uri):
            obstore.put(self._store, self._path, b"".join(self._parts), mode="create")
        self._parts = []

    def abort(self) -> None:
        self._parts = []  # nothing was written


@contextlib.contextmanager
def _obstore_errors(action: str, uri: str):
    """obstore's errors as the OSErrors callers handle, naming the object."""
    from obstore.exceptions import AlreadyExistsError, PermissionDeniedError, UnauthenticatedError

    try:
        yield
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"cannot {action} {uri}: not found ({_first(exc)})") from None
    except AlreadyExistsError:
        raise FileExistsError(f"{uri} already exists") from None
    except (PermissionDeniedError, UnauthenticatedError) as exc:
        raise PermissionError(f"cannot {action} {uri}: {_first(exc)}") from None
    except Exception as exc:
        if isinstance(exc, OSError):
            raise
        raise StoreError(f"cannot {action} {uri}: {_first(exc)}") from None


def _first(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@functools.lru_cache(maxsize=32)
def _obstore(scheme: str, netloc: str, items: tuple[tuple[str, str], ...]):
    """The obstore store of one bucket or container (cached: it holds a connection pool)."""
    from obstore.store import AzureStore, GCSStore, HTTPStore, from_url

    config, client, retry = obstore_settings(scheme, dict(items))
    kwargs = {"client_options": client, **({"retry_config": retry} if retry else {})}
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
    from blobhouse.storage_options import AZURE, CLIENT, GOOGLE, S3

    azure = {*AZURE, *(f"azure_{n}" for n in AZURE)}
    own = {
        "s3": {*S3, *(n.removeprefix("aws_") for n in S3)},
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
    return config, client, retry


@functools.lru_cache(maxsize=32)
def _remote_store(items: tuple[tuple[str, str], ...]) -> RemoteStore:
    return RemoteStore(dict(items))
