"""Spark functions over resolved blob references: ``read_blob``, ``blob_size``, ``materialize``.

A reference column (``struct<uri, position, size, blake3>``) is what the ``blobhouse`` data
source returns for a blob column. These functions turn references into bytes only for the rows
that reach them, after Spark's filters and joins, with coalesced ranged reads, and check each
payload against the blake3 its reference carries (recorded when it was written) unless told
``check_hashes=False``: a damaged payload, or another file in its place, raises
:class:`~blobhouse.errors.CorruptBlobError`. References without a hash (built by hand, external
blobs the user owns) are read as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from blobhouse.columns import resolve_column
from blobhouse.dedup import DIGEST_BYTES, content_hash
from blobhouse.errors import InvalidInputError
from blobhouse.files.ranges import (
    MAX_READ_BYTES,
    BlobRef,
    Verify,
    is_reference,
    payload_mismatch,
    read_ranges_arrow,
)
from blobhouse.io.objects import checked_options
from blobhouse.options import check_flag
from blobhouse.values import ColumnPath, get_column, numbers, replace_column

MATERIALIZE_BATCH_BYTES = 64 << 20


def read_bytes(
    array: pa.Array,
    storage_options: Mapping[str, str] | None = None,
    check_hashes: bool = True,
    function: str = "read_blob",
) -> pa.Array:
    """The bytes of every reference in ``array`` as ``large_binary`` (null stays null), each
    checked against the blake3 its reference carries (unless ``check_hashes`` is False;
    ``function`` names the caller in errors).

    References that continue one another (rows of one data file or sidecar in the order they
    were written: what a scan returns) are read as one range of at most 64 MiB straight into
    the result, so a batch costs a few reads and no copy beyond the read itself; each row's
    bytes are hashed in the reading thread as its range arrives.

    >>> import os, tempfile
    >>> from blobhouse.files.ranges import REF_TYPE
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"hello world")
    >>> refs = [("file://" + path, 0, 6), None, ("file://" + path, 6, 5), ("file://" + path, 0, 5)]
    >>> refs = [None if r is None else dict(zip(["uri", "position", "size"], r)) for r in refs]
    >>> read_bytes(pa.array(refs, REF_TYPE)).to_pylist()
    [b'hello ', None, b'world', b'hello']
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    check_references(array, function)
    valid = _readable(array)
    sizes = np.where(valid, numbers(array.field("size")), 0)
    if (sizes < 0).any():
        row = int(np.flatnonzero(sizes < 0)[0])
        raise InvalidInputError(
            f"{function}: the reference {array[row].as_py()} (row {row} of the batch) has a "
            "negative size"
        )
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    runs, members = _runs(array, valid, offsets)
    verify = None
    if check_flag("check_hashes", check_hashes):
        verify = _verifier(array, valid, offsets, runs, members, function)
    data = read_ranges_arrow(runs, storage_options=storage_options, verify=verify)
    nulls = len(array) - int(valid.sum())
    validity = pa.array(valid).buffers()[1] if nulls else None
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(array),
        [validity, pa.py_buffer(offsets), data.buffers()[2]],
        null_count=nulls,
    )


def check_references(array: pa.Array, function: str) -> None:
    """Refuse anything but blob references ``struct<uri, position, size[, blake3]>`` as the
    argument of ``function``, naming what it got (an executor's error is the last line Spark
    shows).

    >>> check_references(pa.array(["a.jpg"]), "read_blob")
    Traceback (most recent call last):
    ...
    blobhouse.errors.InvalidInputError: read_blob takes a blob reference \
struct<uri, position, size[, blake3]> (a blob column as the blobhouse data source reads it), got a \
column of string
    """
    fields = [f.name for f in array.type] if pa.types.is_struct(array.type) else None
    if fields is None or not is_reference(fields):
        raise InvalidInputError(
            f"{function} takes a blob reference struct<uri, position, size[, blake3]> (a blob "
            f"column as the blobhouse data source reads it), got a column of {array.type}"
        )


def _readable(refs: pa.Array) -> np.ndarray:
    """Rows holding a reference (a null struct, or a null uri, reads as null)."""
    valid = pc.and_(refs.is_valid(), refs.field("uri").is_valid())
    return valid.to_numpy(zero_copy_only=False)


def _runs(
    refs: pa.Array, valid: np.ndarray, offsets: np.ndarray, limit: int = MAX_READ_BYTES
) -> tuple[list[BlobRef], list[np.ndarray]]:
    """One reference per run of rows whose bytes follow one another in one object, in row
    order (null rows hold no bytes, so a run continues past them), and the rows of each run;
    a run ends before its bytes would cross a ``limit`` boundary of the output, so reads stay
    bounded and can run in parallel (as :func:`~blobhouse.files.ranges.plan_reads` bounds them)."""
    rows = np.flatnonzero(valid)
    if not len(rows):
        return [], []
    positions = numbers(refs.field("position"))[rows]
    sizes = np.diff(offsets)[rows]
    uris = refs.field("uri").take(pa.array(rows))
    starts = offsets[rows]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (
        (positions[1:] != positions[:-1] + sizes[:-1])
        | (starts[1:] // limit != starts[:-1] // limit)
        | pc.not_equal(uris[1:], uris[:-1]).to_numpy(zero_copy_only=False)
    )
    first = np.flatnonzero(new)
    run_sizes = np.add.reduceat(sizes, first)
    run_uris = uris.take(pa.array(first)).to_pylist()
    runs = [
        BlobRef(uri, int(position), int(size))
        for uri, position, size in zip(run_uris, positions[first], run_sizes, strict=True)
    ]
    return runs, np.split(rows, first[1:])


def _verifier(
    refs: pa.Array,
    valid: np.ndarray,
    offsets: np.ndarray,
    runs: list[BlobRef],
    members: list[np.ndarray],
    function: str,
) -> Verify | None:
    """A :data:`~blobhouse.files.ranges.Verify` of the runs :func:`_runs` planned: each row of a
    run whose reference carries a blake3 is hashed from the run's bytes and compared (a
    payload many rows share, once). None when no reference carries one."""
    if "blake3" not in refs.type.names:
        return None  # built by hand (or by an older blobhouse): nothing to check against
    digests = refs.field("blake3")
    checked = valid & digests.is_valid().to_numpy(zero_copy_only=False)
    if not checked.any():
        return None
    lengths = pc.binary_length(digests).fill_null(DIGEST_BYTES).to_numpy(zero_copy_only=False)
    wrong = checked & (lengths != DIGEST_BYTES)
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        raise InvalidInputError(
            f"{function}: the reference of row {row} of the batch carries a blake3 of "
            f"{lengths[row]} bytes, not {DIGEST_BYTES} (leave it null to read unchecked)"
        )
    expected = digests.to_pylist()
    positions, sizes = numbers(refs.field("position")), np.diff(offsets)
    passed: set[tuple[str, int, int, bytes]] = set()

    def verify(run: int, data: memoryview) -> None:
        ref, start = runs[run], offsets[members[run][0]]
        for row in members[run][checked[members[run]]].tolist():
            key = (ref.uri, int(positions[row]), int(sizes[row]), expected[row])
            if key in passed:
                continue
            at = int(offsets[row] - start)
            if content_hash(data[at : at + key[2]], threads=1) != key[3]:
                raise payload_mismatch(f"{function}, row {row} of the batch: ", *key[:3])
            passed.add(key)

    return verify


def read_blob_function(storage_options: Mapping[str, str] | None = None, check_hashes: bool = True):
    """``read_blob(ref)`` reading objects with ``storage_options`` (which travel to the
    executors with the function), checking each payload against the blake3 its reference
    carries unless ``check_hashes`` is False: what :func:`blobhouse.spark.register`
    registers."""
    options = checked_options(storage_options)
    check = check_flag("check_hashes", check_hashes)

    @arrow_udf(BinaryType())
    def read_blob(refs: pa.Array) -> pa.Array:
        """``read_blob(ref)``: the bytes a reference points at (SQL and DataFrames)."""
        return read_bytes(refs, options, check)

    return read_blob


read_blob = read_blob_function()


@arrow_udf(LongType())
def blob_size(refs: pa.Array) -> pa.Array:
    """``blob_size(ref)``: the size in bytes of a referenced blob, without reading it."""
    check_references(refs, "blob_size")
    sizes = refs.field("size")
    return pc.if_else(refs.is_valid(), sizes, pa.nulls(len(refs), pa.int64())).cast(pa.int64())


def materialize(
    df: DataFrame,
    columns: Sequence[str],
    *,
    max_batch_bytes: int = MATERIALIZE_BATCH_BYTES,
    storage_options: Mapping[str, str] | None = None,
    check_hashes: bool = True,
) -> DataFrame:
    """``df`` with the reference ``columns`` replaced by their bytes (``binary``), each
    checked against the blake3 its reference carries unless ``check_hashes`` is False.

    Runs as ``mapInArrow``: each Arrow batch's references are read together, ranges grouped by
    object and coalesced, objects read in parallel. Output batches hold at most
    ``max_batch_bytes`` of blob bytes (or one row), however large the input batches.
    ``storage_options`` reach the objects the references name (on an object store).
    """
    options = checked_options(storage_options)
    check = check_flag("check_hashes", check_hashes)
    paths = {name: _spark_path(df.schema, name) for name in columns}
    for name, path in paths.items():
        data_type = _spark_field(df.schema, path).dataType
        if not _is_ref_type(data_type):
            raise InvalidInputError(
                f"materialize: column {name!r} is {data_type.simpleString()}, "
                "not a blob reference struct<uri, position, size[, blake3]>"
            )
    out_schema = df.schema
    for path in paths.values():
        out_schema = _with_binary(out_schema, path)
    wanted = list(paths.values())

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for piece in _by_referenced_bytes(batch, wanted, max_batch_bytes):
                for path in wanted:
                    values = read_bytes(get_column(piece, path), options, check, "materialize")
                    piece = replace_column(piece, path, values, pa.field(path[-1], values.type))
                yield piece

    return df.mapInArrow(convert, out_schema)


def _spark_path(schema: StructType, name: str) -> ColumnPath:
    """The path of column ``name`` (``meta.image`` inside a struct) of a DataFrame's schema, by
    the rule every blobhouse API follows (:func:`blobhouse.columns.resolve_column`)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return resolve_column(to_arrow_schema(schema), name, "materialize column")


def _spark_field(schema: StructType, path: ColumnPath) -> StructField:
    field = schema[path[0]]
    for name in path[1:]:
        field = field.dataType[name]
    return field


def _with_binary(schema: StructType, path: ColumnPath) -> StructType:
    """``schema`` with the field at ``path`` made ``binary``."""
    fields = []
    for f in schema.fields:
        if f.name != path[0]:
            fields.append(f)
        elif len(path) == 1:
            fields.append(StructField(f.name, BinaryType()))
        else:
            fields.append(StructField(f.name, _with_binary(f.dataType, path[1:]), f.nullable))
    return StructType(fields)


def _by_referenced_bytes(
    batch: pa.RecordBatch, columns: Sequence[ColumnPath], limit: int
) -> Iterator[pa.RecordBatch]:
    """Slices of ``batch`` whose references point at no more than ``limit`` bytes (one row at
    least), so output batches stay bounded whatever the input batch size."""
    sizes = [0] * batch.num_rows
    for path in columns:
        column = get_column(batch, path).field("size").fill_null(0).to_pylist()
        sizes = [a + b for a, b in zip(sizes, column, strict=True)]
    start, total = 0, 0
    for row, size in enumerate(sizes):
        if row > start and total + size > limit:
            yield batch.slice(start, row - start)
            start, total = row, 0
        total += size
    if start < batch.num_rows:
        yield batch.slice(start)


def _is_ref_type(data_type) -> bool:
    if not isinstance(data_type, StructType):
        return False
    return is_reference([f.name for f in data_type.fields])
