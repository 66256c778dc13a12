"""PyTorch datasets over a blobhouse table (``pip install "blobhouse[torch]"``).

:class:`TableBatchDataset` is an ``IterableDataset`` of whole batches, a
:class:`~blobhouse.loader.BatchLoader` in each DataLoader worker: shuffled by ``(seed, epoch)``,
sharded by rank (``torch.distributed``'s by default) and by worker, resumable. Give it to
``DataLoader(dataset, batch_size=None, num_workers=...)``: the dataset makes the batches.

:class:`TableRowDataset` is a map-style dataset of rows for torch's samplers
(``DistributedSampler``, ``RandomSampler``): a DataLoader fetches each batch of indices with one
take (``__getitems__``), so a payload several rows of a batch share is read once.

Both run ``transform`` on each row (a dict of column values, blob columns as checked bytes) in
the process that reads it, a DataLoader worker when there are workers. Neither starts Lance in
the process that makes the DataLoader (what it needs there is computed in a fresh process), so
workers may fork; a worker forked after something else in the parent had used Lance reads
through a fresh process, slower, and warns naming the way to full speed
(``multiprocessing_context="forkserver"``, see :mod:`blobhouse.io.forks`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pyarrow as pa

from blobhouse.extras import require_torch

require_torch()

import torch  # noqa: E402
from torch import distributed  # noqa: E402
from torch.utils.data import Dataset, IterableDataset, default_collate  # noqa: E402

from blobhouse.errors import InvalidInputError  # noqa: E402
from blobhouse.loader import (  # noqa: E402
    BATCHING,
    BatchLoader,
    LoaderOptions,
    PinnedRows,
    checked_columns,
    checked_frames,
    read_row_dicts,
)
from blobhouse.options import keywords_checked, option_keywords  # noqa: E402

Row = dict[str, Any]
_ALL_FIELDS = [f.name for f in fields(LoaderOptions)]
#: the :class:`LoaderOptions` keywords of each dataset (the worker is torch's; a map-style
#: dataset leaves batching to the DataLoader)
_BATCH_FIELDS = [n for n in _ALL_FIELDS if n not in ("worker_id", "num_workers")]
_ROW_FIELDS = [n for n in _ALL_FIELDS if n not in BATCHING]


class TableBatchDataset(IterableDataset):
    """Shuffled, sharded batches of a table for ``DataLoader(dataset, batch_size=None)``.

    Each batch is ``collate([transform(row) for row in rows])`` (by default ``torch``'s
    ``default_collate``; without a ``transform``, ``collate`` gets the rows themselves), or
    with neither a dict of columns: numeric columns without nulls as tensors, the others (blob
    bytes, strings, references) as lists. ``rank`` and ``world_size`` default to
    ``torch.distributed``'s when a process group is initialized; the worker is torch's. Call
    :meth:`set_epoch` before each epoch: the epoch (and a resumed start) reaches the workers
    also when they persist between epochs (``persistent_workers=True``). What it reads and how
    is a :class:`~blobhouse.loader.LoaderOptions` (``options=``, or its fields as keywords;
    ``batch_size`` is required, ``worker_id`` and ``num_workers`` are torch's); decoded
    ``frames`` are stacked into one tensor per column without a ``collate``.

    >>> import tempfile, pyarrow as pa
    >>> from torch.utils.data import DataLoader
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": list(range(6)),
    ...                          "img": blob_array([b"x" * i for i in range(6)])}), uri)
    >>> dataset = TableBatchDataset(uri, batch_size=4, transform=lambda row: len(row["img"]))
    >>> sorted(n for batch in DataLoader(dataset, batch_size=None) for n in batch.tolist())
    [0, 1, 2, 3, 4, 5]
    """

    @keywords_checked
    @option_keywords(options=(LoaderOptions, _BATCH_FIELDS))
    def __init__(
        self,
        uri: str | os.PathLike,
        columns: Sequence[str] | None = None,
        *,
        options: LoaderOptions | None = None,
        transform: Callable[[Row], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        options = options or LoaderOptions()
        options.refuse(["worker_id", "num_workers"], "TableBatchDataset", "the worker is torch's")
        rank, world_size = _distributed(options.rank, options.world_size)
        _check_callable("transform", transform, optional=True)
        _check_callable("collate", collate, optional=True)
        self.loader = BatchLoader(
            uri, columns, options=replace(options, rank=rank, world_size=world_size)
        )
        self.transform, self.collate = transform, collate
        # (epoch, the rank's batch the pass starts at), in shared memory: persistent workers
        # keep their copy of the dataset between epochs, and read this at each pass
        self._pass = torch.zeros(2, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s order next, from its first batch; call it before each epoch."""
        self.loader.set_epoch(epoch)
        self._pass[0], self._pass[1] = epoch, 0

    @property
    def _start(self) -> int:
        return int(self._pass[1])

    def __len__(self) -> int:
        """Batches per epoch of this rank (what a DataLoader over it yields)."""
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._pass.tolist()
        self.loader.load_state_dict({**self.loader.state_dict(), "epoch": epoch, "position": start})
        if self.transform is None and self.collate is None:
            if self.loader.frames is not None:
                yield from (collate_rows(rows) for rows in self.loader.row_batches())
            else:
                yield from (_as_tensors(batch) for batch in self.loader)
            return
        collate = self.collate or default_collate
        for rows in self.loader.row_batches():
            yield collate(rows if self.transform is None else [self.transform(r) for r in rows])

    def state_dict(self, batches_done: int) -> dict[str, Any]:
        """Where this rank is after a DataLoader yielded ``batches_done`` batches of this pass
        (the main process counts them; the workers do the reading). The DataLoader must yield
        in order (``in_order=True``, its default)."""
        if isinstance(batches_done, bool) or not isinstance(batches_done, (int, np.integer)):
            raise InvalidInputError(f"batches_done must be an integer, got {batches_done!r}")
        left = len(self) - self._start
        if not 0 <= batches_done <= left:
            raise InvalidInputError(
                f"batches_done must be in [0, {left}] (batches of this pass), got {batches_done}"
            )
        return {**self.loader.state_dict(), "position": self._start + int(batches_done)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict` of a dataset over the same rows, seed
        and version): the next pass starts at the batch after the last one counted."""
        self.loader.load_state_dict(state)
        self._pass[0], self._pass[1] = state["epoch"], state["position"]


class TableRowDataset(Dataset):
    """The rows of a table (those matching ``filter``, at ``version``) by position, for a
    DataLoader with torch's samplers: ``dataset[i]`` is ``transform(row)`` (the row as a dict
    when there is no ``transform``), and a DataLoader's batch of indices is one take, each
    distinct payload read once and checked against its recorded hash. What it reads and how
    is a :class:`~blobhouse.loader.LoaderOptions` (``options=``, or its fields as keywords)
    but its batching fields (:data:`~blobhouse.loader.BATCHING`: the DataLoader and its
    sampler batch, order and shard); decoded ``frames`` come each distinct chunk of a
    DataLoader's batch once.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": [7, 8, 9], "img": blob_array([b"a", b"b", b"c"])}), uri)
    >>> rows = TableRowDataset(uri, ["id", "img"], filter="id > 7")
    >>> len(rows), rows[1]
    (2, {'id': 9, 'img': b'c'})
    """

    @keywords_checked
    @option_keywords(options=(LoaderOptions, _ROW_FIELDS))
    def __init__(
        self,
        uri: str | os.PathLike,
        columns: Sequence[str] | None = None,
        *,
        options: LoaderOptions | None = None,
        transform: Callable[[Row], Any] | None = None,
    ) -> None:
        o = options or LoaderOptions()
        o.refuse(BATCHING, "TableRowDataset", "the DataLoader and its sampler batch the rows")
        _check_callable("transform", transform, optional=True)
        self.options = o
        self.frames = checked_frames(o.frames, o.frame_layout, o.blobs, o.max_frame_pixels)
        self.checked_chunks: set[tuple[str, int, int]] = set()  # video chunks this dataset checked
        self.rows = PinnedRows(
            uri,
            filter=o.filter,
            storage_options=o.storage_options,
            version=o.version,
            branch=o.branch,
        )
        self.columns = checked_columns(columns)
        self.transform, self.blobs, self.check_hashes = transform, o.blobs, o.check_hashes

    def __len__(self) -> int:
        return len(self.rows.ids(keep_lance_out=True))

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read with one take (DataLoader calls this per batch)."""
        ids = self.rows.ids()
        positions = np.asarray(indices)
        if positions.ndim != 1 or (len(positions) and positions.dtype.kind not in "iu"):
            raise InvalidInputError(f"indices must be integers, got {indices!r}")
        if not len(positions):
            return []
        outside = positions[(positions < 0) | (positions >= len(ids))]
        if len(outside):
            raise IndexError(f"index {outside[0]} is outside the {len(ids)} rows of the dataset")
        table = self.rows.table()
        rows = read_row_dicts(
            table,
            ids[positions],
            self.columns,
            self.blobs,
            self.check_hashes,
            self.frames,
            self.rows.storage_options,
            self.checked_chunks,
        )
        return rows if self.transform is None else [self.transform(row) for row in rows]


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The rank and world size given, else ``torch.distributed``'s, else a single process."""
    if rank is not None or world_size is not None:
        return (0 if rank is None else rank), (1 if world_size is None else world_size)
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size()
    return 0, 1


def _as_tensors(batch: pa.RecordBatch) -> dict[str, Any]:
    """Numeric and boolean columns without nulls as tensors; the others as Python lists."""
    columns: dict[str, Any] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        kind = column.type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        if (numeric or pa.types.is_boolean(kind)) and column.null_count == 0:
            columns[name] = torch.from_numpy(np.array(column))  # a writable copy
        else:
            columns[name] = column.to_pylist()
    return columns


def collate_rows(rows: list[Row]) -> dict[str, Any]:
    """A batch of rows as columns: frames (arrays) stacked into one tensor, numbers and
    equal-length number lists as tensors, the rest (bytes, strings, nulls) as lists. The
    ``collate_fn`` for a DataLoader over :class:`TableRowDataset` with ``frames``.

    >>> import numpy as np
    >>> batch = collate_rows([{"i": 1, "s": [0.5, 1.0], "f": np.zeros((2, 2), np.uint8)},
    ...                       {"i": 2, "s": [1.5, 2.0], "f": np.ones((2, 2), np.uint8)}])
    >>> batch["i"].tolist(), batch["s"].shape, batch["f"].shape
    ([1, 2], torch.Size([2, 2]), torch.Size([2, 2, 2]))
    """
    columns: dict[str, Any] = {}
    for name in rows[0] if rows else ():
        values = [row[name] for row in rows]
        if all(isinstance(v, np.ndarray) for v in values):
            # default_collate stacks straight into shared memory in a DataLoader worker (one
            # copy less than stacking here and handing the batch over)
            columns[name] = default_collate([torch.from_numpy(v) for v in values])
            continue
        tensor = _numbers_as_tensor(values)
        columns[name] = values if tensor is None else tensor
    return columns


def _numbers_as_tensor(values: list[Any]) -> torch.Tensor | None:
    """``values`` as a tensor when they are numbers or equal-length lists of numbers (floats
    as float32, torch's default), else None: bytes and strings are never copied into an array
    (a batch's video chunks would be, 64 times over)."""
    probe = values[0]
    if isinstance(probe, (list, tuple)) and probe:
        probe = probe[0]
    if not isinstance(probe, (bool, int, float, np.number)):
        return None
    try:
        return torch.tensor(values)
    except (TypeError, ValueError, RuntimeError):  # nulls, ragged lists
        return None


def _check_callable(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise InvalidInputError(f"{name} must be a function, got {value!r}")
