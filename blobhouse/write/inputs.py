"""What a write accepts: pyarrow tables, batches, readers, iterables of batches, pandas frames.

>>> import pyarrow as pa
>>> schema, batches = input_stream(pa.table({"id": [1, 2]}))
>>> schema.names, sum(b.num_rows for b in batches)
(['id'], 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import pyarrow as pa

from blobhouse.errors import InvalidInputError
from blobhouse.values import Blob, blob_array


def input_stream(data: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Schema and batches of any accepted input, without materializing a stream."""
    if _is_pandas(data):
        data = _from_pandas(data)
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        batches = iter(data)
        first = next(batches, None)
        if not isinstance(first, pa.RecordBatch):
            raise InvalidInputError(
                "an iterable input must yield pyarrow RecordBatches (got "
                f"{type(first).__name__}); pass a pyarrow Table to write an empty table"
            )
        return first.schema, chain([first], batches)
    raise InvalidInputError(
        f"cannot write a {type(data).__name__}; pass a pyarrow Table, RecordBatch, "
        "RecordBatchReader, iterable of RecordBatches, or a pandas DataFrame"
    )


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and type(data).__name__ == "DataFrame"


def _from_pandas(frame) -> pa.Table:
    """A pandas DataFrame as Arrow; object columns holding :class:`Blob` become blob arrays."""
    columns = {}
    for name in frame.columns:
        values = frame[name]
        if values.dtype == object and any(isinstance(v, Blob) for v in values):
            columns[name] = blob_array(values.tolist())
        else:
            columns[name] = pa.Array.from_pandas(values)
    return pa.table(columns)
