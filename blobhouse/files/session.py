"""Blob session: one data file's sidecar namespace, its blob_id allocator and sidecar writers.

A Lance data file ``data/<key>.lance`` owns the sidecars ``data/<key>/<blob_id>.blob``. The
session hands out blob_ids (never 0, never reused, never one whose sidecar already exists), opens
packed and dedicated sidecar writers on Lance's own writers, and turns the values they produce
into the *prepared* column Lance's blob v2 encoder accepts. Everything the write pipeline stores
goes through here, and :meth:`BlobSession.abort` removes all of it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import blake3
import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.blob import BlobDescriptorArrayBuilder
from lance.file import LanceFileSession, LanceFileWriter
from lance.fragment import DataFile, FragmentMetadata

from blobhouse.columns import check_column_names
from blobhouse.dedup import content_hash
from blobhouse.errors import BlobhouseError, InvalidInputError
from blobhouse.files.checksums import ChecksumLog
from blobhouse.files.footer import DATA_FILE_KEY
from blobhouse.io.objects import (
    LANCE_IO_ERRORS,
    NewObject,
    StorageOptions,
    checked_options,
    object_store,
)
from blobhouse.io.uris import as_uri
from blobhouse.layout import (
    DATA_FILE_NAME,
    PACK_NAME,
    TableLocation,
    blob_id_of,
    is_sidecar,
    is_sidecar_of,
    sidecar_folder,
    sidecar_name,
)
from blobhouse.managed import ManagedPolicy
from blobhouse.ownership import marker_problem
from blobhouse.placement import AllowedBases, Kind, external_range

# the names of files blobhouse and Lance write: nothing that could lead outside a directory
MAX_BLOB_ID = 2**32 - 1
MAX_U64 = 2**64 - 1
_PREPARED_FIELD = BlobDescriptorArrayBuilder("blob").field
PREPARED_TYPE: pa.StructType = _PREPARED_FIELD.type


@dataclass(frozen=True)
class PreparedBlob:
    """One row's prepared blob value: where its bytes are (or the bytes, when inline)."""

    kind: Kind
    size: int
    blob_id: int = 0
    position: int = 0
    uri: str | None = None
    data: bytes | memoryview | None = None


def _prepared_problem(value: PreparedBlob) -> str | None:
    if value.kind not in (Kind.INLINE, Kind.PACKED, Kind.DEDICATED, Kind.EXTERNAL):
        return "kind must be INLINE, PACKED, DEDICATED or EXTERNAL"
    for name, limit in (("size", MAX_U64), ("position", MAX_U64), ("blob_id", MAX_BLOB_ID)):
        number = getattr(value, name)
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= limit:
            return f"{name} must be an integer in 0..{limit}"
    if value.position + value.size > MAX_U64:
        return "position + size overflows 64 bits"
    if value.kind == Kind.INLINE and (value.data is None or len(value.data) != value.size):
        return "an inline value carries its bytes (size = their length)"
    if value.kind in (Kind.PACKED, Kind.DEDICATED) and value.blob_id == 0:
        return "a sidecar value needs a blob_id (from a session's writers or loaders)"
    if value.kind == Kind.EXTERNAL and not isinstance(value.uri, str):
        return "an external value needs a uri"
    return None


def prepared_field(name: str, nullable: bool = True) -> pa.Field:
    """The Arrow field of a prepared blob column named ``name``."""
    return pa.field(name, PREPARED_TYPE, nullable=nullable, metadata=_PREPARED_FIELD.metadata)


def prepared_array(
    values: Sequence[PreparedBlob | None], data: pa.Array | None = None
) -> pa.StructArray:
    """A prepared blob column from per-row values (None = null row).

    Inline rows carry their bytes in ``PreparedBlob.data``, or, when ``data`` (a binary array
    aligned with ``values``) is given, are taken from it without a round trip through Python.

    >>> arr = prepared_array([PreparedBlob(Kind.PACKED, size=3, blob_id=1), None])
    >>> arr.null_count, arr.type == PREPARED_TYPE
    (1, True)
    """
    # one pass per child: comprehensions, not appends, for the many small rows a batch has
    kinds = [None if v is None else int(v.kind) for v in values]
    columns = {
        "kind": kinds,
        "data": [None] * len(values) if data is not None else [v and v.data for v in values],
        "uri": [v and v.uri for v in values],
        "blob_id": [v and v.blob_id for v in values],
        "blob_size": [v and v.size for v in values],
        "position": [v and v.position for v in values],
    }
    try:
        children = [pa.array(columns[f.name], type=f.type) for f in PREPARED_TYPE]
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidInputError(f"prepared blob values out of range: {exc}") from None
    if data is not None and int(Kind.INLINE) in kinds:  # else every data child stays null
        inline = pc.fill_null(pc.equal(children[0], int(Kind.INLINE)), False)
        data = data.cast(pa.large_binary())
        # a batch of small payloads, all inline, keeps its bytes where they are (no copy)
        all_inline = inline.equals(data.is_valid())
        children[1] = data if all_inline else pc.if_else(inline, data, children[1])
    mask = pc.is_null(children[0])
    return pa.StructArray.from_arrays(children, fields=list(PREPARED_TYPE), mask=mask)


def _file_field(field: pa.Field) -> pa.Field:
    """The data file field for an input field: prepared blob structs get Lance's marker."""
    if field.type == PREPARED_TYPE:
        return prepared_field(field.name, field.nullable)
    names = {f.name for f in field.type} if pa.types.is_struct(field.type) else set()
    if {"kind", "blob_id"} <= names:
        raise InvalidInputError(
            f"column {field.name!r} is not exactly the prepared blob layout: {field.type}; "
            f"expected {PREPARED_TYPE}"
        )
    if {"data", "uri"} <= names:
        raise InvalidInputError(
            f"column {field.name!r} is a logical blob struct ({field.type}); a session writes "
            "prepared columns only (session.open_writer(...).finish()); use write_table for "
            "logical values"
        )
    return field


@dataclass(frozen=True)
class WrittenFile:
    """A complete data file (and its sidecars), ready to be committed as a fragment."""

    name: str
    num_rows: int
    size_bytes: int
    sidecars: tuple[str, ...]
    sidecar_bytes: int
    packs: tuple[str, ...] = ()  # store packs (dedup="global") holding payloads added for it
    stored: tuple = ()  # those payloads (store.StoredPayload), for the store's index
    # the bytes of those payloads a Spark task recorded instead (store.records), not listed
    recorded_bytes: int = 0
    found_packs: tuple[str, ...] = ()  # store packs it references that the index named
    # payloads it references that another task of the write claimed and stored (store.
    # StoredPayload; blobhouse.store.claims): the commit checks that a succeeding task stored them
    borrowed: tuple = ()
    claimed: bool = False  # its task claimed payloads for the write (blobhouse.store.claims)
    # external objects it hands to the table (normalized URIs): checked before the commit,
    # registered after it (blobhouse.managed)
    managed: tuple[str, ...] = ()

    @property
    def bytes_written(self) -> int:
        """What writing it wrote: the data file, its sidecars and the store payloads it added."""
        stored = sum(p.size for p in self.stored) + self.recorded_bytes
        return self.size_bytes + self.sidecar_bytes + stored

    def __post_init__(self) -> None:
        # these names are joined to the table's directories, committed and, on abort,
        # deleted: each must stay where it belongs
        key = sidecar_folder(self.name)
        names = [(self.name, DATA_FILE_NAME.fullmatch(self.name))]
        names += [(s, is_sidecar_of(key, s)) for s in self.sidecars]
        packs = (*self.packs, *self.found_packs, *(b.pack for b in self.borrowed))
        names += [(p, PACK_NAME.fullmatch(p)) for p in packs]
        bad = [name for name, ok in names if not ok]
        if bad:
            raise InvalidInputError(
                f"written file {self.name!r}: {bad[0]!r} is not a name blobhouse writes "
                "(data/<name>.lance, data/<name>/<blob_id>.blob, packs/<name>.pack)"
            )
        odd = [u for u in self.managed if not isinstance(u, str) or "://" not in u]
        if odd:
            raise InvalidInputError(
                f"written file {self.name!r}: managed object {odd[0]!r} is not an absolute URI"
            )

    def data_file(self, field_ids: list[int]) -> DataFile:
        """Lance's record of this file; ``field_ids`` are the table's ids of its columns."""
        return DataFile(self.name, field_ids, list(range(len(field_ids))), 2, 2, self.size_bytes)

    def fragment(self, field_ids: list[int]) -> FragmentMetadata:
        """Metadata of a new fragment made of this file alone."""
        return FragmentMetadata(
            id=0, files=[self.data_file(field_ids)], physical_rows=self.num_rows
        )


# Lance buffers this much column data of a data file before it writes pages. Its default,
# 8 MiB, unless inline payloads make up most of the file's first batch: those encode ~1.5x
# faster in fewer, larger flushes (bench/findings.md). A bigger buffer only holds more memory
# for other columns (a 6M-row file of ids, timestamps and shared 100-byte payloads peaked at
# 381 MB with 64 MiB, 243 MB with 8). Either way the buffer is bounded: memory stays flat.
DATA_CACHE_BYTES = 8 << 20
INLINE_DATA_CACHE_BYTES = 64 << 20


def data_cache_bytes(first: pa.RecordBatch | None) -> int:
    """How much column data Lance buffers for a data file whose first batch is ``first``
    (prepared blob columns carry their inline payloads in their ``data`` child).

    >>> inline = prepared_array([PreparedBlob(Kind.INLINE, size=1000, data=b"x" * 1000)] * 8)
    >>> data_cache_bytes(pa.record_batch({"img": inline})) == INLINE_DATA_CACHE_BYTES
    True
    >>> data_cache_bytes(pa.record_batch({"id": range(8)})) == DATA_CACHE_BYTES
    True
    """
    if first is None or not first.nbytes:
        return DATA_CACHE_BYTES
    inline = sum(_inline_bytes(column) for column in first.columns)
    return INLINE_DATA_CACHE_BYTES if 2 * inline >= first.nbytes else DATA_CACHE_BYTES


def _inline_bytes(array: pa.Array) -> int:
    if array.type == PREPARED_TYPE:
        return array.field("data").nbytes
    if pa.types.is_struct(array.type):
        return sum(_inline_bytes(array.field(i)) for i in range(array.type.num_fields))
    return 0


class WriteQueue:
    """Writes on one background thread, in submission order, so hashing the next payload
    overlaps writing this one. At most ``limit`` bytes wait; an error of a background write is
    raised by the next submit or by :meth:`drain`, and the writes queued behind it are not run
    (on a store that stopped answering each would wait out a request budget of its own)."""

    # 64 MiB: the queued views keep their input batches alive, so a writer stalled in the kernel
    # (page-cache writeback) may hold that much of a write's input; 256 MiB wrote no faster
    def __init__(self, limit: int = 64 << 20, name: str = "blobhouse-sidecar") -> None:
        self.limit = limit
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: deque[tuple[Future, int]] = deque()
        self._bytes = 0
        self._failed = threading.Event()

    def submit(self, fn, nbytes: int = 0) -> None:
        # writes already done leave the queue here, so it stays short (and errors come early)
        while self._pending and (self._pending[0][0].done() or self._bytes + nbytes > self.limit):
            self._wait_oldest()
        self._pending.append((self._pool.submit(self._run, fn), nbytes))
        self._bytes += nbytes

    def _run(self, fn) -> None:
        if self._failed.is_set():
            raise RuntimeError("not written: an earlier write of the queue failed")
        try:
            fn()
        except BaseException:
            self._failed.set()
            raise

    @property
    def unwritten_bytes(self) -> int:
        """Bytes of the submitted writes still running or waiting."""
        return sum(nbytes for future, nbytes in self._pending if not future.done())

    def drain(self) -> None:
        """Wait for every submitted write."""
        while self._pending:
            self._wait_oldest()

    def abandon(self) -> None:
        """Wait for every submitted write, ignoring their errors (the files are being removed);
        those not started yet are dropped."""
        self._failed.set()
        while self._pending:
            with contextlib.suppress(Exception):
                self._wait_oldest()

    def close(self) -> None:
        """Wait for every write, then stop the background thread."""
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)

    def _wait_oldest(self) -> None:
        future, nbytes = self._pending.popleft()
        self._bytes -= nbytes
        future.result()


# batches of up to this many bytes wait for the data file's writer thread (one placement window)
DATA_WRITE_BYTES = 32 << 20

# Payloads reach a sidecar's writer thread in runs of about this many bytes: one hand-off per
# payload cost ~25 us of locking and GIL switches, a third of a 256 MB write of 100 KB payloads
SIDECAR_RUN_BYTES = 4 << 20


class SidecarFile:
    """A new sidecar object, written sequentially without copies through a :class:`WriteQueue`,
    in runs of :data:`SIDECAR_RUN_BYTES` (the views are kept, not copied, until written).

    An existing sidecar is never overwritten, even by a writer racing this one: local sidecars
    are created with ``O_EXCL``, S3 ones with a conditional PUT (:mod:`blobhouse.io.objects`).
    """

    def __init__(
        self,
        uri: str,
        queue: WriteQueue,
        storage_options: StorageOptions | None = None,
        fresh: bool = False,
    ) -> None:
        self.uri = uri
        self._queue = queue
        # fresh: named with a random 128-bit id (a pack): not asked for before its upload
        self._object: NewObject | None = object_store(uri, storage_options).create(uri, fresh)
        self._run: list[memoryview] = []
        self._run_bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self.write_many([data])

    def write_many(self, chunks: Iterable[bytes | memoryview]) -> None:
        """:meth:`write` each of ``chunks``, in order."""
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            self._run.append(view)
            self._run_bytes += len(view)
            if self._run_bytes >= SIDECAR_RUN_BYTES:
                self.flush()

    def flush(self) -> None:
        """Hand what was written so far to the queue (its bytes are written once it drains)."""
        if self._run:
            run, nbytes = self._run, self._run_bytes
            self._run, self._run_bytes = [], 0
            self._queue.submit(lambda: self._write_run(run), nbytes)

    def close(self, wait: bool = True) -> None:
        """Close the object; with ``wait`` (the default) return once every byte is written."""
        self.flush()
        self._queue.submit(self._close_now)
        if wait:
            self._queue.drain()

    def abort(self) -> None:
        """Give up on the object (after the queue stopped writing it)."""
        self._run.clear()
        if self._object is not None:
            self._object.abort()
            self._object = None

    def _write_run(self, run: list[memoryview]) -> None:
        self._object.write_many(run)

    def _close_now(self) -> None:
        if self._object is not None:
            self._object.close()
            self._object = None


class PackedSidecar:
    """A packed sidecar being written: many payloads appended to one object.

    ``write_blob`` returns the value rows use to reference the payload; ``finish`` closes the
    sidecar and returns every value in write order. Every payload's blake3 goes to ``checksums``.
    """

    def __init__(self, file: SidecarFile, blob_id: int, checksums: ChecksumLog) -> None:
        self._file = file
        self.blob_id = blob_id
        self.size = 0
        self._values: list[PreparedBlob] = []
        self._checksums = checksums

    def write_blob(self, payload: bytes | memoryview, digest: bytes | None = None) -> PreparedBlob:
        """Append ``payload``; returns the value rows use to reference it. ``digest`` is its
        blake3-256 when the caller already has it (else it is computed here)."""
        return self.write_blobs([payload], [digest or content_hash(payload)])[0]

    def write_blobs(
        self, payloads: Sequence[bytes | memoryview], digests: Sequence[bytes]
    ) -> list[PreparedBlob]:
        """Append ``payloads`` (whose blake3-256 are ``digests``) in order; returns their values.

        >>> import tempfile
        >>> pack = BlobSession(tempfile.mkdtemp() + "/data/f.lance").new_packed()
        >>> [v.position for v in pack.write_blobs([b"ab", b"cde"], [bytes(32)] * 2)]
        [0, 2]
        """
        sizes = [len(p) for p in payloads]
        ends = list(itertools.accumulate(sizes, initial=self.size))
        # recorded first: a digest of the wrong length is refused before a byte is written
        self._checksums.record_sidecars(self.blob_id, ends[:-1], sizes, digests)
        self._file.write_many(payloads)
        values = [
            PreparedBlob(Kind.PACKED, size=size, blob_id=self.blob_id, position=position)
            for size, position in zip(sizes, ends[:-1], strict=True)
        ]
        self.size = ends[-1]
        self._values.extend(values)
        return values

    def finish(self, wait: bool = True) -> list[PreparedBlob]:
        """Close the sidecar (``wait``: once written) and return every value in write order."""
        self._file.close(wait)
        return list(self._values)


class DedicatedSidecar:
    """A dedicated sidecar being written: one payload, in as many chunks as needed.

    The payload's blake3 goes to ``checksums`` on :meth:`finish`: ``digest`` when the caller
    already has it, else hashed chunk by chunk as they are written.
    """

    def __init__(
        self, file: SidecarFile, blob_id: int, checksums: ChecksumLog, digest: bytes | None = None
    ) -> None:
        self._file = file
        self.blob_id = blob_id
        self.size = 0
        self._checksums = checksums
        self._digest = digest
        # dedicated payloads are large: hash them on every core
        self._hasher = None if digest else blake3.blake3(max_threads=blake3.blake3.AUTO)

    def write(self, chunk: bytes | memoryview) -> None:
        self._file.write(chunk)
        if self._hasher is not None:
            self._hasher.update(chunk)
        self.size += len(chunk)

    def finish(self, wait: bool = True) -> PreparedBlob:
        """Close the sidecar (``wait``: once written) and return its value."""
        self._file.close(wait)
        digest = self._digest or self._hasher.digest()
        self._checksums.record_sidecar(self.blob_id, 0, self.size, digest)
        return PreparedBlob(Kind.DEDICATED, size=self.size, blob_id=self.blob_id)


class BlobColumnWriter:
    """Builds one prepared blob column, row by row, in a :class:`BlobSession`'s namespace.

    Several rows may reference the same prepared value (``append(value)`` again): they share
    one stored copy.

    >>> import tempfile
    >>> session = BlobSession(tempfile.mkdtemp() + "/data/f.lance")
    >>> images = session.open_writer("image")
    >>> pack = images.new_packed()
    >>> first, second = pack.write_blob(b"cat"), pack.write_blob(b"dog")
    >>> images.extend(pack.finish())
    >>> images.append(first)  # a third row sharing the first payload
    >>> images.append_inline(b"tiny")
    >>> images.append_null()
    >>> column = images.finish()
    >>> len(column), column.null_count, images.field.name
    (5, 1, 'image')
    """

    def __init__(self, session: BlobSession, column: str) -> None:
        self.session = session
        self.column = column
        self._values: list[PreparedBlob | None] = []

    @property
    def field(self) -> pa.Field:
        """The Arrow field of the prepared column."""
        return prepared_field(self.column)

    def new_packed(self) -> PackedSidecar:
        return self.session.new_packed()

    def new_dedicated(self, digest: bytes | None = None) -> DedicatedSidecar:
        return self.session.new_dedicated(digest)

    def load_packed(
        self, blob_id: int, offsets: Sequence[int], sizes: Sequence[int]
    ) -> list[PreparedBlob]:
        """Values for payloads of a packed sidecar already placed in this namespace (no
        checksums are recorded for them: the session never sees their bytes)."""
        return self.session.load_packed(blob_id, offsets, sizes)

    def load_dedicated(self, blob_id: int) -> PreparedBlob:
        """The value of a dedicated sidecar already placed in this namespace (no checksum)."""
        return self.session.load_dedicated(blob_id)

    def append(self, value: PreparedBlob | None) -> None:
        """Append a value from this session's writers or loaders (or None). What it points to
        is checked when the data file is written (:meth:`BlobSession.write_data_file`)."""
        if value is not None and not isinstance(value, PreparedBlob):
            raise InvalidInputError(
                f"column {self.column!r}: append takes a PreparedBlob or None, got "
                f"{type(value).__name__}"
            )
        problem = None if value is None else _prepared_problem(value)
        if problem:
            raise InvalidInputError(
                f"column {self.column!r}, row {len(self._values)}: bad value {value!r}: {problem}"
            )
        self._values.append(value)

    def extend(self, values: Iterable[PreparedBlob | None]) -> None:
        for value in values:
            self.append(value)

    def append_inline(self, data: bytes) -> None:
        """An inline row; its checksum is keyed by this writer's column and row index, which
        are the data file's as long as the column is written under this name, rows in order."""
        data = bytes(data)
        self.session.checksums.record_inline(
            self.column, len(self._values), len(data), content_hash(data)
        )
        self.append(PreparedBlob(Kind.INLINE, size=len(data), data=data))

    def append_external(
        self,
        uri: str,
        position: int | None = None,
        size: int | None = None,
        *,
        managed: bool = False,
    ) -> None:
        """A reference to (a range of) an object under the table's allowed bases; ``managed``
        hands the object to the table once the file is committed (so does a managed base)."""
        row = len(self._values)
        if (position is None) != (size is None):
            raise InvalidInputError(
                f"column {self.column!r}, row {row}: an external range needs position and size"
            )
        if position is not None and (position < 0 or size <= 0 or position + size > MAX_U64):
            raise InvalidInputError(
                f"column {self.column!r}, row {row}: bad external range position={position}, "
                f"size={size}"
            )
        normalized, position, size = external_range(
            uri,
            position,
            size,
            self.session.allowed_bases(),
            column=self.column,
            row=row,
            storage_options=self.session.storage_options,
            managed=managed,
        )
        if managed:
            self.session.flagged.add(normalized)
        self.append(PreparedBlob(Kind.EXTERNAL, size=size, position=position, uri=normalized))

    def append_null(self) -> None:
        self._values.append(None)

    def finish(self) -> pa.StructArray:
        """The prepared column (rows in append order)."""
        return prepared_array(self._values)


class BlobSession:
    """The blob namespace of one data file about to be written.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> session = BlobSession(f"{root}/data/f0.lance")
    >>> pack = session.new_packed()
    >>> pack.write_blob(b"hello").position, pack.write_blob(b"world").position
    (0, 5)
    >>> len(pack.finish()); session.abort()
    2
    """

    def __init__(self, data_file_path: str, storage_options: dict[str, str] | None = None) -> None:
        self.data_dir, self.data_file_name = data_file_path.rstrip("/").rsplit("/", 1)
        key = sidecar_folder(self.data_file_name)
        if not key or key == self.data_file_name:  # no <name>.lance
            raise BlobhouseError(f"data file path must end in <name>.lance: {data_file_path!r}")
        if (
            not self.data_dir.endswith("/data")
            or "/../" in f"{self.data_dir}/"
            or ("/./" in f"{self.data_dir}/")
        ):
            raise BlobhouseError(
                f"data file path {data_file_path!r} is not directly in a table's data/ directory"
            )
        self.key = sidecar_folder(self.data_file_name)
        self.storage_options = checked_options(storage_options)
        self.files = LanceFileSession(self.data_dir, storage_options=self.storage_options)
        self.sidecars: list[str] = []
        self._sidecar_files: list[SidecarFile] = []
        self._next_id = 1
        self._taken: set[int] | None = None
        self._bases: AllowedBases | None = None
        self._policy: ManagedPolicy | None = None
        self.flagged: set[str] = set()  # external objects rows hand to the table
        self.managed: set[str] = set()  # every external object the file hands to the table
        self.writes = WriteQueue()
        # Lance encodes and writes a batch with the GIL released: the next window is placed
        # meanwhile
        self._data_writes = WriteQueue(DATA_WRITE_BYTES, name="blobhouse-data")
        self.checksums = ChecksumLog()
        self._file_schema: pa.Schema | None = None

    def sidecar_path(self, blob_id: int) -> str:
        """Path of ``blob_id``'s sidecar, relative to the data directory."""
        return f"{self.key}/{sidecar_name(blob_id)}"

    def allocate_blob_id(self) -> int:
        """A fresh blob_id: never 0, never handed out before, no existing sidecar."""
        taken = self._taken_ids()
        while self._next_id in taken:
            self._next_id += 1
        if self._next_id > MAX_BLOB_ID:
            raise BlobhouseError(f"data file {self.data_file_name}: blob_ids exhausted")
        blob_id = self._next_id
        self._next_id += 1
        self.sidecars.append(self.sidecar_path(blob_id))
        return blob_id

    def allowed_bases(self) -> AllowedBases:
        """The external bases of the table this data file belongs to (read once)."""
        if self._bases is None:
            root = self.data_dir.rsplit("/", 1)[0]
            try:
                schema = lance.dataset(root, storage_options=self.storage_options).schema
            except (ValueError, OSError):
                schema = None  # no table there yet: no external bases
            self._bases = AllowedBases.of_table(schema, root)
        return self._bases

    def managed_policy(self) -> ManagedPolicy:
        """Which external objects of this file the table manages (see :mod:`blobhouse.managed`)."""
        if self._policy is None:
            # a branch's data directory is in tree/<branch>/: the registry is the table's
            dataset = self.data_dir.rsplit("/", 1)[0]
            location = TableLocation.of(dataset, storage_options=self.storage_options)
            self._policy = ManagedPolicy(self.allowed_bases(), location, self.storage_options)
        return self._policy

    def write_data_file(self, data: pa.Table | pa.RecordBatch) -> WrittenFile:
        """Write this session's data file: prepared blob columns (from :meth:`open_writer`) and
        ordinary columns. Commit it with ``Table.add_data_file``.

        A struct column shaped like a logical blob is refused: logical values are placed by
        ``write_table``; here every blob column must already be prepared.
        """
        self.flush()
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        schema = pa.schema([_file_field(f) for f in table.schema])
        for field in table.schema:
            if field.type == PREPARED_TYPE:
                self._check_prepared(field.name, table.column(field.name))
        batches = table.to_batches()
        writer = self.open_data_file(schema, data_cache_bytes(batches[0] if batches else None))
        for batch in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
        self.close_data_file(writer)
        return WrittenFile(
            name=self.data_file_name,
            num_rows=table.num_rows,
            size_bytes=writer.size_bytes,
            sidecars=tuple(self.sidecars),
            sidecar_bytes=0,
            managed=tuple(sorted(self.managed)),
        )

    def _check_prepared(self, column: str, values: pa.ChunkedArray) -> None:
        """Refuse prepared values that point outside this session's namespace or the table's
        allowed bases: a prepared column can be built by hand, and what it references is what
        readers will read."""
        sizes: dict[int, int] = {}
        objects: dict[str, int] = {}
        for row, value in enumerate(values.to_pylist()):
            if value is None:
                continue
            problem = self._prepared_value_problem(value, sizes, objects, column, row)
            if problem:
                raise InvalidInputError(f"column {column!r}, row {row}: {problem}")

    def _prepared_value_problem(
        self, value: dict, sizes: dict[int, int], objects: dict[str, int], column: str, row: int
    ) -> str | None:
        kind, blob_id = value["kind"], value["blob_id"] or 0
        position, size = value["position"] or 0, value["blob_size"] or 0
        if kind == Kind.INLINE:
            data = value["data"]
            return None if data is not None else "an inline value without bytes"
        if kind == Kind.EXTERNAL:
            if blob_id:
                return "an external value relative to a base path is not accepted from sessions"
            uri = value["uri"] or ""
            checked = external_range(
                uri,
                position,
                size,
                self.allowed_bases(),
                column=column,
                row=row,
                sizes=objects,
                storage_options=self.storage_options,
            )
            if checked[0] != uri:
                return f"external uri {uri!r} is not normalized"
            if self.managed_policy().managed(uri, uri in self.flagged):
                problem = marker_problem(uri)
                if problem is not None:
                    return f"managed object {uri}: {problem}"
                self.managed.add(uri)
            return None
        if kind not in (Kind.PACKED, Kind.DEDICATED):
            return f"blob kind {kind} is not accepted (inline, packed, dedicated, external)"
        if blob_id not in self._own_ids():
            return f"blob_id {blob_id} is not a sidecar of this session's namespace"
        if blob_id not in sizes:
            sizes[blob_id] = self._loaded_size(blob_id)
        if kind == Kind.DEDICATED and (position, size) != (0, sizes[blob_id]):
            return f"a dedicated value covers its whole sidecar ({sizes[blob_id]} bytes)"
        if position + size > sizes[blob_id]:
            return (
                f"range [{position}, +{size}) is past the end of sidecar "
                f"{self.sidecar_path(blob_id)} ({sizes[blob_id]} bytes)"
            )
        return None

    def _own_ids(self) -> set[int]:
        """blob_ids this session allocated or loaded."""
        return self._taken_ids() | {self._id_of(p) for p in self.sidecars}

    @staticmethod
    def _id_of(sidecar: str) -> int:
        return blob_id_of(sidecar)

    def open_writer(self, column: str) -> BlobColumnWriter:
        """A writer for the prepared values of blob ``column`` (every column of the session
        shares this namespace and its blob_id allocator)."""
        return BlobColumnWriter(self, column)

    def load_packed(
        self, blob_id: int, offsets: Sequence[int], sizes: Sequence[int]
    ) -> list[PreparedBlob]:
        """Values for ranges of an existing packed sidecar of this namespace (validated)."""
        if len(offsets) != len(sizes):
            raise InvalidInputError(
                f"load_packed: {len(offsets)} offsets but {len(sizes)} sizes (blob_id {blob_id})"
            )
        object_bytes = self._loaded_size(blob_id)
        values = []
        for offset, size in zip(offsets, sizes, strict=True):
            if offset < 0 or size < 0 or offset + size > MAX_U64:
                raise InvalidInputError(
                    f"load_packed: blob_id {blob_id}: offset {offset} / size {size} out of range"
                )
            if offset + size > object_bytes:
                raise InvalidInputError(
                    f"load_packed: blob_id {blob_id}: range [{offset}, +{size}) is past the end "
                    f"of {self.sidecar_path(blob_id)} ({object_bytes} bytes)"
                )
            values.append(PreparedBlob(Kind.PACKED, size=size, blob_id=blob_id, position=offset))
        return values

    def load_dedicated(self, blob_id: int) -> PreparedBlob:
        """The value of an existing dedicated sidecar of this namespace (its whole object)."""
        return PreparedBlob(Kind.DEDICATED, size=self._loaded_size(blob_id), blob_id=blob_id)

    def _loaded_size(self, blob_id: int) -> int:
        if (
            isinstance(blob_id, bool)
            or not isinstance(blob_id, int)
            or not (0 < blob_id <= MAX_BLOB_ID)
        ):
            raise InvalidInputError(
                f"blob_id must be an integer in 1..{MAX_BLOB_ID}, got {blob_id!r}"
            )
        uri = as_uri(f"{self.data_dir}/{self.sidecar_path(blob_id)}")
        try:
            size = object_store(uri, self.storage_options).size(uri)
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"cannot stat sidecar {uri}: {exc}") from None
        if size is None:
            raise InvalidInputError(
                f"blob_id {blob_id}: no sidecar {self.sidecar_path(blob_id)} in the namespace of "
                f"{self.data_file_name}"
            )
        self._taken_ids().add(blob_id)
        return size

    def _taken_ids(self) -> set[int]:
        """blob_ids with a sidecar in the namespace (listed once), plus those loaded since."""
        if self._taken is None:
            self._taken = {self._id_of(p) for p in self.files.list(self.key) if is_sidecar(p)}
        return self._taken

    def new_packed(self) -> PackedSidecar:
        """Open a new packed sidecar."""
        blob_id = self.allocate_blob_id()
        return PackedSidecar(self._sidecar_file(blob_id), blob_id, self.checksums)

    def new_dedicated(self, digest: bytes | None = None) -> DedicatedSidecar:
        """Open a new dedicated sidecar; ``digest`` is its payload's blake3-256 when the caller
        already has it (else the sidecar hashes what it is given)."""
        blob_id = self.allocate_blob_id()
        return DedicatedSidecar(self._sidecar_file(blob_id), blob_id, self.checksums, digest)

    def _sidecar_file(self, blob_id: int) -> SidecarFile:
        # sidecars are plain bytes (Lance writes them the same way); writing them ourselves
        # avoids a copy per payload and refuses to overwrite an existing one (Lance's writers
        # overwrite silently on object stores)
        path = f"{self.data_dir}/{self.sidecar_path(blob_id)}"
        file = SidecarFile(path, self.writes, self.storage_options)
        self._sidecar_files.append(file)
        return file

    def flush(self) -> None:
        """Wait until every sidecar byte handed to this session is written."""
        self.writes.drain()

    def open_data_file(
        self, schema: pa.Schema, cache_bytes: int = DATA_CACHE_BYTES
    ) -> LanceFileWriter:
        """Open the Lance 2.2 writer of the data file itself, buffering ``cache_bytes`` of
        column data (:func:`data_cache_bytes`)."""
        check_column_names(schema, "the data file")  # Lance could not address them
        self._file_schema = schema
        return self.files.open_writer(
            self.data_file_name, schema=schema, version="2.2", data_cache_bytes=cache_bytes
        )

    def write_data(self, writer: LanceFileWriter, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` to the data file's writer thread (:meth:`close_data_file` waits)."""
        batch = unsliced_structs_of_structs(batch)
        self._data_writes.submit(lambda: writer.write_batch(batch), batch.nbytes)

    def close_data_file(self, writer: LanceFileWriter) -> None:
        """Close the data file's writer, storing the checksums of every payload the session
        wrote in it first (see :mod:`blobhouse.files.checksums`)."""
        self._data_writes.close()
        self.checksums.attach(writer, self._file_schema)
        # the name it is written under: another file put in its place is told apart on read
        writer.add_schema_metadata(DATA_FILE_KEY, self.data_file_name)
        writer.close()

    def abort(self) -> None:
        """Remove the data file and every sidecar this session created."""
        for queue in (self._data_writes, self.writes):
            queue.abandon()
            queue.close()
        for file in self._sidecar_files:  # an unfinished S3 upload leaves no object to delete
            file.abort()
        for path in [self.data_file_name, *self.sidecars]:
            with contextlib.suppress(*LANCE_IO_ERRORS):
                self.files.delete_file(path)
        local_dir = os.path.join(self.data_dir, self.key)
        if "://" not in self.data_dir and os.path.isdir(local_dir):
            with contextlib.suppress(OSError):
                os.rmdir(local_dir)


def unsliced_structs_of_structs(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column that is a slice of a struct holding a struct copied to a
    column of its own: pylance 14's file writer panics on such slices (``end <= self.len()``),
    and file boundaries and callers' own slices make them. Other columns are not copied.

    >>> deep = pa.array([{"s": {"x": i}} for i in range(4)])
    >>> unsliced_structs_of_structs(pa.record_batch({"d": deep}).slice(1)).column(0).offset
    0
    """
    columns = [_unsliced(column) for column in batch.columns]
    if all(new is old for new, old in zip(columns, batch.columns, strict=True)):
        return batch
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _unsliced(array: pa.Array) -> pa.Array:
    return pa.concat_arrays([array]) if _sliced_struct_of_structs(array) else array


def _sliced_struct_of_structs(array: pa.Array) -> bool:
    if not pa.types.is_struct(array.type):
        return False
    children = [array.field(i) for i in range(array.type.num_fields)]
    if array.offset and any(pa.types.is_struct(child.type) for child in children):
        return True
    return any(_sliced_struct_of_structs(child) for child in children)
