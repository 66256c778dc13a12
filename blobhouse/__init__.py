"""blobhouse: multimodal blob tables with cross-row dedup, stored as standard Lance 2.2 datasets.

>>> import tempfile, pyarrow as pa
>>> import blobhouse
>>> rows = pa.table({"frame": [0, 1], "image": blobhouse.blob_array([b"jpeg", b"jpeg"])})
>>> table = blobhouse.write_table(rows, tempfile.mkdtemp() + "/frames")
>>> table.read_blobs("image", [1])
[b'jpeg']
"""

from blobhouse.errors import (
    BlobhouseError,
    BlobReadError,
    ConcurrentCommitError,
    CorruptBlobError,
    ExternalBlobError,
    ForkedAfterLanceWarning,
    InvalidInputError,
    ManagedObjectRaceError,
    NotATableError,
    PathIsFileError,
    PathNotFoundError,
    RefIdConflictError,
    SchemaError,
    StaleWriteError,
    StoreRaceError,
    TableExistsError,
    TableNotFoundError,
    UnknownOptionError,
    VersionNotFoundError,
    VersionRemovedError,
)
from blobhouse.placement import Kind, Placement
from blobhouse.rangeio import REF_TYPE, BlobRef, open_ref, read_ranges
from blobhouse.session import BlobColumnWriter, BlobSession, PreparedBlob, WrittenFile
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
    "ConcurrentCommitError",
    "CorruptBlobError",
    "ExternalBlobError",
    "ForkedAfterLanceWarning",
    "InvalidInputError",
    "Kind",
    "ManagedObjectRaceError",
    "NotATableError",
    "PathIsFileError",
    "PathNotFoundError",
    "Placement",
    "PreparedBlob",
    "RefIdConflictError",
    "SchemaError",
    "StaleWriteError",
    "StoreRaceError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "UnknownOptionError",
    "VersionNotFoundError",
    "VersionRemovedError",
    "WrittenFile",
    "blob_array",
    "blob_field",
    "open_ref",
    "open_table",
    "read_ranges",
    "write_table",
]
