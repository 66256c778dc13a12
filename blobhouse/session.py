"""Blob session: one data file's sidecar namespace, its blob_id allocator and sidecar writers.

A Lance data file ``data/<key>.lance`` owns the sidecars ``data/<key>/<blob_id>.blob``. The
session hands out blob_ids (never 0, never reused, never one whose sidecar already exists), opens
packed and dedicated sidecar writers on Lance's own writers, and turns the values they produce
into the *prepared* column Lance's blob v2 encoder accepts. Everything the write pipeline stores
goes through here, and :meth:`BlobSession.abort` removes all of it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from lance.blob import BlobDescriptorArrayBuilder
from lance.file import LanceFileSession, LanceFileWriter

from blobhouse.errors import BlobhouseError
from blobhouse.placement import Kind

MAX_BLOB_ID = 2**32 - 1
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
    columns: dict[str, list] = {f.name: [] for f in PREPARED_TYPE}
    for value in values:
        if value is None:
            for column in columns.values():
                column.append(None)
            continue
        columns["kind"].append(int(value.kind))
        columns["data"].append(value.data if data is None else None)
        columns["uri"].append(value.uri)
        columns["blob_id"].append(value.blob_id)
        columns["blob_size"].append(value.size)
        columns["position"].append(value.position)
    children = [pa.array(columns[f.name], type=f.type) for f in PREPARED_TYPE]
    if data is not None:
        inline = pa.array([v is not None and v.kind == Kind.INLINE for v in values])
        children[1] = pc.if_else(inline, data.cast(pa.large_binary()), children[1])
    mask = pa.array([v is None for v in values], type=pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(PREPARED_TYPE), mask=mask)


def sidecar_name(blob_id: int) -> str:
    """Lance's sidecar file name: blob_id as 32 binary digits, least-significant bit first.

    >>> sidecar_name(1)
    '10000000000000000000000000000000.blob'
    """
    return format(blob_id, "032b")[::-1] + ".blob"


class PackedSidecar:
    """A packed sidecar being written: many payloads appended to one object."""

    def __init__(self, writer, blob_id: int) -> None:
        self._writer = writer
        self.blob_id = blob_id
        self.size = 0

    def write(self, payload: bytes | memoryview) -> PreparedBlob:
        """Append ``payload``; returns the value rows use to reference it."""
        self._writer.write_blob(bytes(payload))  # Lance's binding takes bytes, not views
        value = PreparedBlob(
            Kind.PACKED, size=len(payload), blob_id=self.blob_id, position=self.size
        )
        self.size += len(payload)
        return value

    def close(self) -> None:
        self._writer.finish()


class DedicatedSidecar:
    """A dedicated sidecar being written: one payload, in as many chunks as needed."""

    def __init__(self, writer, blob_id: int) -> None:
        self._writer = writer
        self.blob_id = blob_id
        self.size = 0

    def write(self, chunk: bytes | memoryview) -> None:
        self._writer.write(bytes(chunk))
        self.size += len(chunk)

    def finish(self) -> PreparedBlob:
        self._writer.finish()
        return PreparedBlob(Kind.DEDICATED, size=self.size, blob_id=self.blob_id)


class BlobSession:
    """The blob namespace of one data file about to be written.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> session = BlobSession(f"{root}/data/f0.lance")
    >>> pack = session.new_packed()
    >>> pack.write(b"hello").position, pack.write(b"world").position
    (0, 5)
    >>> pack.close(); session.abort()
    """

    def __init__(self, data_file_path: str, storage_options: dict[str, str] | None = None) -> None:
        self.data_dir, self.data_file_name = data_file_path.rstrip("/").rsplit("/", 1)
        if not self.data_file_name.endswith(".lance"):
            raise BlobhouseError(f"data file path must end in .lance: {data_file_path!r}")
        self.key = self.data_file_name.removesuffix(".lance")
        self.files = LanceFileSession(self.data_dir, storage_options=storage_options)
        self.sidecars: list[str] = []
        self._next_id = 1
        self._taken: set[int] | None = None

    def sidecar_path(self, blob_id: int) -> str:
        """Path of ``blob_id``'s sidecar, relative to the data directory."""
        return f"{self.key}/{sidecar_name(blob_id)}"

    def allocate_blob_id(self) -> int:
        """A fresh blob_id: never 0, never handed out before, no existing sidecar."""
        if self._taken is None:
            self._taken = {
                int(os.path.basename(p).removesuffix(".blob")[::-1], 2)
                for p in self.files.list(self.key)
                if p.endswith(".blob")
            }
        while self._next_id in self._taken:
            self._next_id += 1
        if self._next_id > MAX_BLOB_ID:
            raise BlobhouseError(f"data file {self.data_file_name}: blob_ids exhausted")
        blob_id = self._next_id
        self._next_id += 1
        self.sidecars.append(self.sidecar_path(blob_id))
        return blob_id

    def new_packed(self) -> PackedSidecar:
        """Open a new packed sidecar."""
        blob_id = self.allocate_blob_id()
        return PackedSidecar(
            self.files.open_packed_blob_writer(self.data_file_name, blob_id), blob_id
        )

    def new_dedicated(self) -> DedicatedSidecar:
        """Open a new dedicated sidecar."""
        blob_id = self.allocate_blob_id()
        writer = self.files.open_dedicated_blob_writer(self.data_file_name, blob_id)
        return DedicatedSidecar(writer, blob_id)

    def open_data_file(self, schema: pa.Schema) -> LanceFileWriter:
        """Open the Lance 2.2 writer of the data file itself."""
        return self.files.open_writer(self.data_file_name, schema=schema, version="2.2")

    def abort(self) -> None:
        """Remove the data file and every sidecar this session created."""
        for path in [self.data_file_name, *self.sidecars]:
            with contextlib.suppress(OSError):
                self.files.delete_file(path)
        local_dir = os.path.join(self.data_dir, self.key)
        if "://" not in self.data_dir and os.path.isdir(local_dir):
            with contextlib.suppress(OSError):
                os.rmdir(local_dir)
