"""blobhouse: multimodal blob tables with cross-row dedup, stored as standard Lance 2.2 datasets.

>>> import tempfile, pyarrow as pa
>>> import blobhouse
>>> rows = pa.table({"frame": [0, 1], "image": blobhouse.blob_array([b"jpeg", b"jpeg"])})
>>> table = blobhouse.write_table(rows, tempfile.mkdtemp() + "/frames")
>>> table.read_blobs("image", [1])
[b'jpeg']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blobhouse.errors import (
        BlobhouseError,
        BlobReadError,
        ColumnNameError,
        ConcurrentCommitError,
        CorruptBlobError,
        DataFileError,
        ExternalBlobError,
        ForkedAfterLanceWarning,
        InvalidInputError,
        InvalidSettingError,
        LeRobotDatasetError,
        ManagedObjectOwnedError,
        ManagedObjectRaceError,
        MovedTableWarning,
        NotATableError,
        PathIsFileError,
        PathNotFoundError,
        PropertyConflictError,
        RefIdConflictError,
        SchemaError,
        StaleWriteError,
        StoreError,
        StoreIndexError,
        StoreIndexWarning,
        StoreRaceError,
        TableExistsError,
        TableNotFoundError,
        UnknownOptionError,
        VersionNotFoundError,
        VersionRemovedError,
        VideoFrameError,
    )
    from blobhouse.files.ranges import REF_TYPE, BlobRef, open_ref, read_ranges
    from blobhouse.files.session import BlobColumnWriter, BlobSession, PreparedBlob, WrittenFile
    from blobhouse.options import CommitOptions, CompactionTargets, WriteOptions
    from blobhouse.placement import Kind, Placement
    from blobhouse.properties import ColumnProperties, TableProperties
    from blobhouse.snapshot import TableSnapshot
    from blobhouse.table import Table, open_table, write_table
    from blobhouse.values import Blob, blob_array, blob_field

__all__ = [
    "REF_TYPE",
    "Blob",
    "BlobColumnWriter",
    "BlobReadError",
    "BlobRef",
    "BlobSession",
    "BlobhouseError",
    "ColumnNameError",
    "ColumnProperties",
    "CommitOptions",
    "CompactionTargets",
    "ConcurrentCommitError",
    "CorruptBlobError",
    "DataFileError",
    "ExternalBlobError",
    "ForkedAfterLanceWarning",
    "InvalidInputError",
    "InvalidSettingError",
    "Kind",
    "LeRobotDatasetError",
    "ManagedObjectOwnedError",
    "ManagedObjectRaceError",
    "MovedTableWarning",
    "NotATableError",
    "PathIsFileError",
    "PathNotFoundError",
    "Placement",
    "PreparedBlob",
    "PropertyConflictError",
    "RefIdConflictError",
    "SchemaError",
    "StaleWriteError",
    "StoreError",
    "StoreIndexError",
    "StoreIndexWarning",
    "StoreRaceError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TableProperties",
    "TableSnapshot",
    "UnknownOptionError",
    "VersionNotFoundError",
    "VersionRemovedError",
    "VideoFrameError",
    "WriteOptions",
    "WrittenFile",
    "blob_array",
    "blob_field",
    "open_ref",
    "open_table",
    "read_ranges",
    "write_table",
]


# where each public name lives: imported on first use, so that `import blobhouse` (and the
# command line's --help, or a Ctrl-C while it starts) does not wait for Lance and pyarrow
_WHERE = {
    "Blob": "blobhouse.values",
    "BlobColumnWriter": "blobhouse.files.session",
    "BlobReadError": "blobhouse.errors",
    "BlobRef": "blobhouse.files.ranges",
    "BlobSession": "blobhouse.files.session",
    "BlobhouseError": "blobhouse.errors",
    "ColumnNameError": "blobhouse.errors",
    "CommitOptions": "blobhouse.options",
    "CompactionTargets": "blobhouse.options",
    "ConcurrentCommitError": "blobhouse.errors",
    "StoreError": "blobhouse.errors",
    "ColumnProperties": "blobhouse.properties",
    "CorruptBlobError": "blobhouse.errors",
    "DataFileError": "blobhouse.errors",
    "ExternalBlobError": "blobhouse.errors",
    "ForkedAfterLanceWarning": "blobhouse.errors",
    "InvalidInputError": "blobhouse.errors",
    "InvalidSettingError": "blobhouse.errors",
    "Kind": "blobhouse.placement",
    "ManagedObjectOwnedError": "blobhouse.errors",
    "ManagedObjectRaceError": "blobhouse.errors",
    "MovedTableWarning": "blobhouse.errors",
    "NotATableError": "blobhouse.errors",
    "PathIsFileError": "blobhouse.errors",
    "PathNotFoundError": "blobhouse.errors",
    "Placement": "blobhouse.placement",
    "PreparedBlob": "blobhouse.files.session",
    "PropertyConflictError": "blobhouse.errors",
    "REF_TYPE": "blobhouse.files.ranges",
    "RefIdConflictError": "blobhouse.errors",
    "LeRobotDatasetError": "blobhouse.errors",
    "VideoFrameError": "blobhouse.errors",
    "SchemaError": "blobhouse.errors",
    "StaleWriteError": "blobhouse.errors",
    "StoreIndexError": "blobhouse.errors",
    "StoreIndexWarning": "blobhouse.errors",
    "StoreRaceError": "blobhouse.errors",
    "Table": "blobhouse.table",
    "TableExistsError": "blobhouse.errors",
    "TableProperties": "blobhouse.properties",
    "TableNotFoundError": "blobhouse.errors",
    "TableSnapshot": "blobhouse.snapshot",
    "UnknownOptionError": "blobhouse.errors",
    "VersionNotFoundError": "blobhouse.errors",
    "VersionRemovedError": "blobhouse.errors",
    "WriteOptions": "blobhouse.options",
    "WrittenFile": "blobhouse.files.session",
    "blob_array": "blobhouse.values",
    "blob_field": "blobhouse.values",
    "open_ref": "blobhouse.files.ranges",
    "open_table": "blobhouse.table",
    "read_ranges": "blobhouse.files.ranges",
    "write_table": "blobhouse.table",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'blobhouse' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
