"""A LeRobot dataset's folder where it is: a local path, or an object-store URI (``s3://``,
``az://``, ``gs://``, ...) read through blobhouse's object stores.

The import reads a dataset through the part of :class:`pathlib.Path` it needs; a folder on an
object store is a :class:`RemotePath` with that same part (joining, ``name``, ``is_file``,
``stat``, ``read_bytes``, ``glob``, ...), whose files open as seekable file objects of ranged
reads (:func:`readable`) for Parquet, pandas and PyAV. It pickles with its storage options,
so Spark tasks read the dataset where the driver found it.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import IO, Any

from blobhouse.files.ranges import BlobRef, open_ref
from blobhouse.io.objects import is_local, object_store, read_object, uri_to_path


@dataclass(frozen=True)
class RemotePath:
    """A file or folder of a dataset on an object store.

    >>> folder = RemotePath("s3://bucket/datasets/pick")
    >>> (folder / "meta/info.json").name, str((folder / "meta/../data").resolve())
    ('info.json', 's3://bucket/datasets/pick/data')
    """

    uri: str
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return self.uri

    def __lt__(self, other: RemotePath) -> bool:
        return self.uri < other.uri

    def __truediv__(self, part: str | os.PathLike) -> RemotePath:
        return RemotePath(f"{self.uri.rstrip('/')}/{os.fspath(part).lstrip('/')}", self.options)

    @property
    def _scheme_and_path(self) -> tuple[str, str]:
        scheme, _, rest = self.uri.partition("://")
        return scheme, rest

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri.rstrip("/"))

    @property
    def parent(self) -> RemotePath:
        return RemotePath(posixpath.dirname(self.uri.rstrip("/")), self.options)

    @property
    def storage_options(self) -> dict[str, str] | None:
        return dict(self.options) or None

    def resolve(self) -> RemotePath:
        scheme, rest = self._scheme_and_path
        return RemotePath(f"{scheme}://{posixpath.normpath(rest)}", self.options)

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        if not self.is_relative_to(other):
            raise ValueError(f"{self} is not in {other}")
        return PurePosixPath(self.uri[len(other.uri.rstrip("/")) + 1 :])

    def is_relative_to(self, other: RemotePath) -> bool:
        return self.uri.startswith(other.uri.rstrip("/") + "/")

    def _size(self) -> int | None:
        return object_store(self.uri, self.storage_options).size(self.uri)

    def is_file(self) -> bool:
        return self._size() is not None

    def is_dir(self) -> bool:
        return next(self._walk(), None) is not None

    def stat(self) -> SimpleNamespace:
        size = self._size()
        if size is None:
            raise FileNotFoundError(f"{self} does not exist")
        return SimpleNamespace(st_size=size)

    def read_bytes(self) -> bytes:
        return read_object(self.uri, self.storage_options)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def _walk(self) -> Iterator[Any]:
        folder = self.uri.rstrip("/") + "/"
        return object_store(folder, self.storage_options).walk(folder)

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """The files below this folder whose path under it matches ``pattern`` part for part
        (``chunk-*/file-*.parquet``)."""
        parts = pattern.split("/")
        for info in self._walk():
            names = info.name.split("/")
            if len(names) == len(parts) and all(
                fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts, strict=True)
            ):
                yield self / info.name

    def open(self) -> IO[bytes]:
        """A seekable file object of the file, read in ranges."""
        size = self.stat().st_size
        return open_ref(BlobRef(self.uri, 0, size), None, str(self), self.storage_options)


DatasetPath = Path | RemotePath  # a dataset's file or folder, where it is


def dataset_path(
    root: str | os.PathLike, storage_options: Mapping[str, str] | None = None
) -> DatasetPath:
    """``root`` as the import reads it: a local :class:`~pathlib.Path`, or a
    :class:`RemotePath` for an object-store URI (read with ``storage_options``).

    >>> dataset_path("/data/pick"), dataset_path("file:///data/pick")
    (PosixPath('/data/pick'), PosixPath('/data/pick'))
    >>> dataset_path("az://robots/pick", {"azure_storage_account_name": "me"}).uri
    'az://robots/pick'
    """
    text = os.fspath(root)
    if is_local(text):
        return Path(uri_to_path(text))
    return RemotePath(text.rstrip("/"), tuple(sorted((storage_options or {}).items())))


def readable(path: DatasetPath) -> Any:
    """What Parquet, pandas and PyAV open ``path`` from: a local path as a string, a remote
    file as a seekable file object of ranged reads."""
    return path.open() if isinstance(path, RemotePath) else str(path)
