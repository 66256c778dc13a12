"""Training reads: a table's rows in shuffled, sharded batches, with their blob bytes.

:class:`BatchLoader` needs no torch. Each epoch's order is a function of ``(seed, epoch)``;
ranks and workers take disjoint shares of it, so every row is read once per epoch across all
of them, and every rank gets the same number of batches. A batch is one native take of its
rows, then each distinct payload it references read once (coalesced ranged reads) and checked
against its recorded hash; a few batches are read at once, each on a thread of its own.

Nothing Lance owns crosses a fork or a pickle: the table is opened in the process that
iterates, at the version pinned when the loader was made; a process forked after Lance had
started reads through a fresh interpreter instead of calling Lance, whose reads crash at
random there (:mod:`blobhouse.io.forks`).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, BinaryIO, Literal, TypeVar

import numpy as np
import pyarrow as pa

from blobhouse.errors import ForkedAfterLanceWarning, InvalidInputError, TableNotFoundError
from blobhouse.files.ranges import BlobRef, open_ref
from blobhouse.io.forks import FreshProcess, forked_after_lance, in_fresh_process, lance_is_running
from blobhouse.io.objects import check_answers, checked_options, is_local
from blobhouse.layout import TableLocation
from blobhouse.options import check_flag, check_int, keywords_checked, option_keywords
from blobhouse.read.video import MAX_FRAME_PIXELS, FrameLayout, VideoFrames

# at import, not at the first open: a DataLoader's workers (forked, or from a forkserver that
# preloads this module) then find it imported instead of each paying 0.07-0.2 s for it
from blobhouse.table import Table, open_at

LoaderBlobs = Literal["bytes", "refs"]
_Batch = TypeVar("_Batch")  # what a loader yields per batch: a RecordBatch or a list of rows
#: batches a rank reads at once, each on its own thread with its own handle of the table,
#: while the caller has the one yielded: one batch at a time leaves the disk idle while a batch
#: is checked and assembled (bench/findings.md, the loader case). Shared by a DataLoader's
#: workers (each reads READ_AHEAD // num_workers at once, at least one), which read side by
#: side already: 4 workers reading 4 each were slower, and held 4x the memory. No more than the
#: cores: from the page cache a batch is CPU (hashing, the GIL), and on 2 cores 4 reading
#: threads made a warm epoch 0.84x of 2 threads' speed, the same cold.
READ_AHEAD = min(4, max(2, os.cpu_count() or 1))


#: the most ranks (and workers per rank) a loader splits an epoch into: a rank past the rows
#: reads padding, and padding for more would take more memory than any job has processes
MAX_SHARDS = 2**20


@dataclass(frozen=True)
class Shard:
    """Which share of an epoch's batches one loader reads: ``rank`` of ``world_size`` (each
    rank a share of the rows), ``worker_id`` of ``num_workers`` (each worker every
    ``num_workers``-th batch of its rank, so a DataLoader that takes one batch from each
    worker in turn yields the rank's batches in order)."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, 1, MAX_SHARDS)
        check_int("num_workers", self.num_workers, 1, MAX_SHARDS)
        check_int("rank", self.rank, 0, self.world_size - 1)
        check_int("worker_id", self.worker_id, 0, self.num_workers - 1)


@dataclass(frozen=True)
class EpochPlan:
    """The rows of one rank in one epoch, as positions into the selected rows, cut into
    batches of ``batch_size``.

    ``window``: shuffle windows of ``window`` consecutive rows, then the rows inside each,
    instead of every row (each rank takes a contiguous share, so windows stay whole).

    >>> plan = EpochPlan.of(10, batch_size=4, seed=0, epoch=0, shuffle=False,
    ...                     world_size=2, rank=1, drop_last=False)
    >>> [plan.batch(i).tolist() for i in range(len(plan))]
    [[1, 3, 5, 7], [9]]
    >>> plan = EpochPlan.of(8, batch_size=4, seed=0, epoch=0, shuffle=True,
    ...                     world_size=1, rank=0, drop_last=False, window=4)
    >>> [sorted(plan.batch(i).tolist()) for i in range(len(plan))]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    """

    rows: np.ndarray
    batch_size: int

    @classmethod
    def of(
        cls,
        n: int,
        *,
        batch_size: int,
        seed: int,
        epoch: int,
        shuffle: bool,
        world_size: int,
        rank: int,
        drop_last: bool,
        window: int | None = None,
    ) -> EpochPlan:
        rng = np.random.default_rng([seed, epoch])
        order = _shuffled(n, rng, window) if shuffle else np.arange(n)
        if drop_last:
            per_rank = n // world_size
            per_rank -= per_rank % batch_size
            order = order[: per_rank * world_size]
        elif n:
            per_rank = math.ceil(n / world_size)
            missing = per_rank * world_size - n  # padded from the start of the order
            order = np.concatenate([order, np.resize(order, missing)])
        if window is not None and len(order):
            return cls(order.reshape(world_size, -1)[rank], batch_size)
        return cls(order[rank::world_size], batch_size)

    def __len__(self) -> int:
        return math.ceil(len(self.rows) / self.batch_size)

    def batch(self, index: int) -> np.ndarray:
        return self.rows[index * self.batch_size : (index + 1) * self.batch_size]


def _shuffled(n: int, rng: np.random.Generator, window: int | None) -> np.ndarray:
    """A random order of ``n`` rows: of every row, or of windows of ``window`` consecutive
    rows with the rows inside each window shuffled too."""
    if window is None:
        return rng.permutation(n)
    window = min(window, max(n, 1))  # a window past the table is the whole table
    starts = rng.permutation(np.arange(0, n, window))
    return np.concatenate([s + rng.permutation(min(window, n - s)) for s in starts] or [starts])


#: the fields of :class:`LoaderOptions` that batch, order and shard an epoch (a map-style
#: dataset of rows leaves them to torch's DataLoader and samplers)
BATCHING = (
    "batch_size",
    "shuffle",
    "seed",
    "drop_last",
    "shuffle_window",
    "rank",
    "world_size",
    "worker_id",
    "num_workers",
)


@dataclass(frozen=True)
class LoaderOptions:
    """What a training read reads and how, checked once: one object for :class:`BatchLoader`
    and ``blobhouse.torch``'s ``TableBatchDataset`` and ``TableRowDataset`` (each takes it as
    ``options=``, or its fields as keywords).

    Rows: ``filter`` (a SQL predicate on the small columns) picks the rows before any blob is
    read. ``version`` (a number or a tag) pins what is read; by default the latest version
    when the loader is made, so every worker reads the same rows. ``branch`` reads a branch,
    ``storage_options`` are the object store's.

    Blobs: ``blobs`` as ``"bytes"`` (checked against their recorded hashes) or ``"refs"``.
    ``check_hashes=False`` skips the check of each payload against its recorded blake3 (about
    a sixth of a cold epoch's time on 2 cores; a damaged payload then reaches the caller).
    ``frames`` names video columns to decode (:class:`~blobhouse.read.video.VideoFrames`:
    each row's chunk becomes the ``uint8`` frame at its ``<column>_timestamp``, laid out as
    ``frame_layout``, ``"hwc"`` or ``"chw"``); each distinct chunk of a batch is read and
    decoded once, on the loader's reading threads, and checked against its recorded hash the
    first time the loader meets it (with ``check_hashes``). ``max_frame_pixels`` bounds a
    decoded frame's size (default a 4K frame's, 3840 x 2160 pixels): a chunk of larger frames
    is refused from its header, before a batch is decoded.

    Batches (:data:`BATCHING`; not for a map-style dataset): ``batch_size`` rows each, in an
    order shuffled by ``(seed, epoch)`` (unless ``shuffle`` is False). ``drop_last`` drops the
    rows that would make ranks uneven or a batch short; otherwise the last rows are padded with
    rows from the start of the epoch's order, so every rank has the same number of batches.
    ``shuffle_window`` shuffles windows of that many consecutive rows (and the rows inside
    each) instead of single rows: a batch then holds neighbouring frames, which share video
    chunks, so far fewer chunks are decoded per batch, at the cost of batches whose rows are
    correlated (every row is still read once per epoch, in an order that changes each epoch).
    ``rank`` of ``world_size`` (default 0 of 1; ``torch.distributed``'s in a
    ``TableBatchDataset``) and ``worker_id`` of ``num_workers`` (default torch's inside a
    DataLoader worker) pick this process's share.

    >>> LoaderOptions(batch_size=64, shuffle_window=16).seed
    0
    >>> LoaderOptions(batch_size=0)
    Traceback (most recent call last):
    blobhouse.errors.InvalidInputError: batch_size must be >= 1, got 0
    """

    batch_size: int | None = None
    filter: str | None = None
    shuffle: bool = True
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    worker_id: int | None = None
    num_workers: int | None = None
    drop_last: bool = False
    blobs: LoaderBlobs = "bytes"
    storage_options: dict[str, str] | None = None
    version: int | str | None = None
    branch: str | None = None
    check_hashes: bool = True
    frames: Sequence[str] | Mapping[str, str] | None = None
    frame_layout: FrameLayout = "hwc"
    shuffle_window: int | None = None
    max_frame_pixels: int = MAX_FRAME_PIXELS

    def __post_init__(self) -> None:
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        check_int("seed", self.seed, 0)
        check_blobs(self.blobs)
        object.__setattr__(self, "check_hashes", check_flag("check_hashes", self.check_hashes))
        if self.shuffle_window is not None:
            check_int("shuffle_window", self.shuffle_window, 1)
        rank, world_size = self.rank or 0, 1 if self.world_size is None else self.world_size
        Shard(rank, world_size, self.worker_id or 0, self.num_workers or 1)  # checked now
        checked_frames(self.frames, self.frame_layout, self.blobs, self.max_frame_pixels)

    def refuse(self, names: Sequence[str], reader: str, why: str) -> None:
        """Raises, naming the first of ``names`` set away from its default: ``reader`` does
        not take it (``why``)."""
        for f in fields(self):
            if f.name in names and getattr(self, f.name) != f.default:
                raise InvalidInputError(f"{reader} takes no {f.name} ({why})")


class BatchLoader:
    """Batches of a table's rows for training: shuffled by ``(seed, epoch)``, sharded by rank
    and worker, blobs as bytes (checked against their recorded hashes) or references. What it
    reads and how is a :class:`LoaderOptions` (``options=``, or its fields as keywords:
    ``batch_size`` is required). Inside a torch DataLoader worker, ``worker_id`` and
    ``num_workers`` default to torch's. Decoded ``frames`` come with :meth:`row_batches`.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": list(range(10)),
    ...                          "img": blob_array([b"x" * i for i in range(10)])}), uri)
    >>> loader = BatchLoader(uri, ["id", "img"], batch_size=4, filter="id < 6", seed=1)
    >>> len(loader), sorted(r["id"] for b in loader for r in b.to_pylist())
    (2, [0, 1, 2, 3, 4, 5])
    """

    @keywords_checked
    @option_keywords(options=LoaderOptions)
    def __init__(
        self,
        uri: str | os.PathLike,
        columns: Sequence[str] | None = None,
        *,
        options: LoaderOptions | None = None,
    ) -> None:
        o = options or LoaderOptions()
        if o.batch_size is None:
            raise InvalidInputError("batch_size (rows per batch) is required")
        self.options = o
        self.frames = checked_frames(o.frames, o.frame_layout, o.blobs, o.max_frame_pixels)
        self.rows = PinnedRows(
            uri,
            filter=o.filter,
            storage_options=o.storage_options,
            version=o.version,
            branch=o.branch,
        )
        self.columns = checked_columns(columns)
        self.shuffle_window = o.shuffle_window
        self.checked_chunks: set[tuple[str, int, int]] = set()  # video chunks this loader checked
        self.batch_size, self.shuffle, self.seed = o.batch_size, o.shuffle, o.seed
        self.drop_last, self.blobs, self.check_hashes = o.drop_last, o.blobs, o.check_hashes
        world_size = 1 if o.world_size is None else o.world_size
        self._given = (o.rank or 0, world_size, o.worker_id, o.num_workers)
        self.epoch = 0
        self._resume_at = 0
        self._position = 0

    @property
    def version(self) -> int:
        """The version every process of this loader reads (a tag named it when the loader was
        made)."""
        return self.rows.version

    @property
    def shard(self) -> Shard:
        """This loader's share; the worker's from torch when not given and inside a torch
        DataLoader worker."""
        rank, world_size, worker_id, num_workers = self._given
        if worker_id is None and num_workers is None:
            worker_id, num_workers = _torch_worker()
        return Shard(rank, world_size, worker_id or 0, num_workers or 1)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s order next (from its first batch)."""
        check_int("epoch", epoch, 0)
        self.epoch, self._resume_at, self._position = epoch, 0, 0

    def __len__(self) -> int:
        """Batches per epoch of this shard (rank and worker)."""
        return len(self._batches(self._plan(self.rows.ids(keep_lance_out=True)), 0))

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self.frames is not None:
            raise InvalidInputError(
                "decoded frames come as rows: iterate loader.row_batches() (or use "
                "blobhouse.torch's datasets)"
            )
        return self._iterate(self._read)

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        """The batches iteration yields, each as a list of rows (dicts), for Python code that
        wants rows: blob payloads are read straight into ``bytes``, one object for all the
        rows of a batch that reference the same payload (no Arrow buffer, no second copy)."""
        return self._iterate(self._read_rows)

    def _iterate(self, read: Callable[[Table, np.ndarray], _Batch]) -> Iterator[_Batch]:
        ids = self.rows.ids()
        plan = self._plan(ids)
        indices = self._batches(plan, self._resume_at)
        self._resume_at = 0
        tables = _ThreadTables(self.rows)
        at_once = max(1, READ_AHEAD // self.shard.num_workers)
        with ThreadPoolExecutor(at_once, thread_name_prefix="blobhouse-loader") as pool:
            ahead: deque[tuple[int, Future]] = deque()
            pending = iter(indices)

            def read_ahead() -> None:
                while len(ahead) < at_once and (i := next(pending, None)) is not None:
                    ahead.append((i, pool.submit(tables.read, read, ids[plan.batch(i)])))

            read_ahead()
            try:
                while ahead:
                    i, future = ahead.popleft()
                    read_ahead()  # the next ones are read while the caller has this one
                    batch = future.result()
                    self._position = i + 1
                    yield batch
            finally:
                for _, future in ahead:
                    future.cancel()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: ``position`` counts the rank's batches done, up to the last
        one this loader yielded, so a single-worker loader resumed from it
        (:meth:`load_state_dict`) continues the epoch after that batch. With several workers
        the rank's count is the consumer's (``TableBatchDataset.state_dict`` in
        :mod:`blobhouse.torch`)."""
        return {
            "epoch": self.epoch,
            "position": self._position,
            **self._identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (of a loader over the same version, filter, seed and batch
        size): the next pass deals the rank's batches from ``position`` on to the workers,
        worker 0 first."""
        missing = {"epoch", "position", *self._identity()} - set(state)
        if missing:
            raise InvalidInputError(f"state is missing {sorted(missing)}")
        identity = {"shuffle_window": None, **self._identity()}  # a state may name a window
        differ = [
            f"{k} {state.get(k)!r} (this loader: {v!r})"
            for k, v in identity.items()
            if state.get(k) != v
        ]
        if differ:
            raise InvalidInputError(f"state is of a different loader: {', '.join(differ)}")
        self.set_epoch(state["epoch"])
        check_int("position", state["position"], 0)
        self._resume_at = self._position = state["position"]

    def _batches(self, plan: EpochPlan, start: int) -> range:
        """This worker's share of the rank's batches from ``start`` on: every
        ``num_workers``-th, so a DataLoader taking one from each worker in turn (from worker 0)
        yields the rank's batches in order, also when a pass resumes mid-epoch."""
        shard = self.shard
        return range(start + shard.worker_id, len(plan), shard.num_workers)

    def _identity(self) -> dict[str, Any]:
        """What a state's position means only for: the rows, their order and the batches."""
        window = {} if self.shuffle_window is None else {"shuffle_window": self.shuffle_window}
        return {
            "seed": self.seed,
            "version": self.rows.version,
            "filter": self.rows.filter,
            "batch_size": self.batch_size,
            **window,
        }

    def _plan(self, ids: np.ndarray) -> EpochPlan:
        shard = self.shard
        return EpochPlan.of(
            len(ids),
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            world_size=shard.world_size,
            rank=shard.rank,
            drop_last=self.drop_last,
            window=self.shuffle_window,
        )

    def _read(self, table: Table, rows: np.ndarray) -> pa.RecordBatch:
        taken = table.take_rows(rows, self.columns, self.blobs, check_hashes=self.check_hashes)
        return taken.combine_chunks().to_batches()[0]

    def _read_rows(self, table: Table, rows: np.ndarray) -> list[dict[str, Any]]:
        return read_row_dicts(
            table,
            rows,
            self.columns,
            self.blobs,
            self.check_hashes,
            self.frames,
            self.rows.storage_options,
            self.checked_chunks,
        )


class _ThreadTables:
    """A handle of the pinned table for each reading thread: a table's caches (the recorded
    hashes) are not shared between threads."""

    def __init__(self, rows: PinnedRows) -> None:
        self._rows, self._local = rows, threading.local()

    def read(self, read: Callable[[Table, np.ndarray], _Batch], rows: np.ndarray) -> _Batch:
        table = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = self._rows.open()
        return read(table, rows)


class PinnedRows:
    """A table at one version and the ids of its rows that match ``filter``, for the process
    that reads them: the table is opened in each process (a forked child opens its own, a
    pickle carries the location, version and ids). ``version`` (a number or a tag) defaults
    to the latest one now, read from the manifests' names.

    The ids a parent process needs before its workers start (``len()``) are computed in a
    fresh Python process while this one has not started Lance, so workers forked from it can
    read (:mod:`blobhouse.io.forks`).

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import write_table
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = write_table(pa.table({"id": [1, 2, 3]}), uri)
    >>> rows = PinnedRows(uri, filter="id > 1")
    >>> rows.version, rows.ids().tolist()
    (1, [1, 2])
    """

    def __init__(
        self,
        uri: str | os.PathLike,
        *,
        filter: str | None = None,
        storage_options: dict[str, str] | None = None,
        version: int | str | None = None,
        branch: str | None = None,
    ) -> None:
        if filter is not None and not isinstance(filter, str):
            raise InvalidInputError(f"filter must be a SQL predicate string, got {filter!r}")
        opened = getattr(uri, "snapshot", None)  # a Table: read it where and as it is
        if opened is not None:
            storage_options = opened.storage_options if storage_options is None else storage_options
            version = opened.version if version is None else version
            branch = opened.branch if branch is None else branch
            uri = opened.location.root
        elif not isinstance(uri, str | os.PathLike):
            raise InvalidInputError(
                f"rows are read from a table's URI or a blobhouse Table, got {type(uri).__name__}"
            )
        self.storage_options = checked_options(storage_options)
        self.location = TableLocation.of(uri, branch, self.storage_options)
        check_answers(self.location.dataset_path, self.storage_options, "read")
        self.filter = filter
        self.version = self._pinned(version)
        self._ids: np.ndarray | None = None
        self._opened: tuple[int, Table | TableInFreshProcess] | None = None  # (pid, table)
        self._helper: tuple[int, TableInFreshProcess] | None = None

    def table(self) -> Table | TableInFreshProcess:
        """The table at the pinned version, opened once in this process."""
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), self.open())
        return self._opened[1]

    def open(self) -> Table | TableInFreshProcess:
        """A new handle of the table at the pinned version (for one more thread). In a process
        forked after Lance had started, whose own Lance calls crash at random, the one handle
        of this process that reads through a fresh interpreter."""
        if forked_after_lance():
            with _HELPER_LOCK:  # the loader's threads ask at once: one helper for them all
                if self._helper is None or self._helper[0] != os.getpid():
                    self._helper = (os.getpid(), TableInFreshProcess(self))
            return self._helper[1]
        return open_at(self.location, self.version, self.storage_options)

    def ids(self, *, keep_lance_out: bool = False) -> np.ndarray:
        """The ids of the rows matching the filter, in table order. ``keep_lance_out``: if
        this process has not started Lance, compute them in a fresh process (for a parent
        whose DataLoader workers may fork)."""
        if self._ids is None:
            if keep_lance_out and not lance_is_running():
                self._ids = in_fresh_process(_row_ids, self.location, self.version,
                                             self.storage_options, self.filter)  # fmt: skip
            else:
                self._ids = self.table().row_ids(self.filter)
        return self._ids

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None, "_helper": None}  # reopened where unpickled

    def _pinned(self, version: int | str | None) -> int:
        """``version`` as a number: a tag resolved once, here, so every worker reads the
        version it named when the loader was made, also if it is moved meanwhile."""
        if not isinstance(version, str):
            return self._latest() if version is None else version
        from blobhouse.snapshot import resolve_tag

        self.location, number = resolve_tag(self.location, version, self.storage_options)
        return number

    def _latest(self) -> int:
        listed = self.location.listed_versions(self.storage_options)
        if not listed:
            from blobhouse.snapshot import path_problem

            problem = path_problem(self.location.root) if self.location.branch is None else None
            raise problem or TableNotFoundError(f"no table at {self.location}")
        return listed[-1]


class TableInFreshProcess:
    """The pinned table of a process forked after Lance had started, read through a fresh
    Python interpreter (:class:`~blobhouse.io.forks.FreshProcess`): what :class:`BatchLoader`
    and the torch datasets call, each call's result copied through a pipe."""

    def __init__(self, rows: PinnedRows) -> None:
        self._warn_once()
        self._helper = FreshProcess()
        weakref.finalize(self, self._helper.close)
        self._helper.call(_open_pinned, rows.location, rows.version, rows.storage_options)

    @staticmethod
    def _warn_once() -> None:
        """Warn once per process (each worker): from whichever thread opens first, the
        warning's location varies, so Python's once-per-location filter would repeat it."""
        global _warned_in
        if _warned_in == os.getpid():
            return
        _warned_in = os.getpid()
        warnings.warn(
            "this process was forked from one that had already used Lance, whose reads crash "
            "or hang at random after a fork (pylance is not fork-safe): blobhouse reads through "
            "a fresh Python process instead, at the cost of a copy of every batch. For full "
            "speed make the DataLoader with multiprocessing_context='forkserver' (or 'spawn'), "
            "or use Lance in the parent only after its workers start",
            ForkedAfterLanceWarning,
            stacklevel=5,
        )

    def take_rows(self, *args: Any, **kwargs: Any) -> pa.Table:
        return self._helper.call(_on_pinned, "take_rows", *args, **kwargs)

    def take_row_dicts(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return self._helper.call(_on_pinned, "take_row_dicts", *args, **kwargs)

    def row_ids(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self._helper.call(_on_pinned, "row_ids", *args, **kwargs)

    def column_names(self) -> list[str]:
        return self._helper.call(_pinned_column_names)


_HELPER_LOCK = threading.Lock()
_warned_in: int | None = None  # the process that warned of reading through a fresh process
_pinned: Table | None = None  # the table a FreshProcess reads for TableInFreshProcess


def _open_pinned(
    location: TableLocation, version: int, storage_options: dict[str, str] | None
) -> None:
    global _pinned
    from blobhouse.table import open_at

    _pinned = open_at(location, version, storage_options)


def _on_pinned(method: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(_pinned, method)(*args, **kwargs)


def _pinned_column_names() -> list[str]:
    assert _pinned is not None
    return _pinned.schema.names


def _row_ids(
    location: TableLocation,
    version: int | str,
    storage_options: dict[str, str] | None,
    filter: str | None,
) -> np.ndarray:
    from blobhouse.table import open_at

    return open_at(location, version, storage_options).row_ids(filter)


def read_row_dicts(
    table: Table | TableInFreshProcess,
    rows: np.ndarray,
    columns: list[str] | None,
    blobs: LoaderBlobs,
    check_hashes: bool,
    frames: VideoFrames | None = None,
    storage_options: dict[str, str] | None = None,
    checked_chunks: set[tuple[str, int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Rows by id as dicts; with ``frames``, its video columns decoded into frames: those
    columns are taken as references, and each distinct chunk opened once, as a ranged file.
    With ``check_hashes``, a chunk not in ``checked_chunks`` (the reader's: each loader checks
    the chunks it meets, however many loaders this process made before) is read whole and
    checked against its recorded hash first, then added to it."""
    if frames is None:
        return table.take_row_dicts(rows, columns, blobs, check_hashes=check_hashes)
    names = _column_names(table)
    frames.check(names)
    video = list(frames.columns)
    wanted = [c for c in (names if columns is None else columns) if c not in video]
    taken = (
        table.take_row_dicts(rows, wanted, blobs, check_hashes=check_hashes)
        if wanted
        else [{} for _ in rows]  # frames alone
    )
    refs = table.take_row_dicts(
        rows, video + frames.timestamp_columns(), "refs", check_hashes=check_hashes
    )
    for row, ref in zip(taken, refs, strict=True):
        row.update(ref)

    checked = set() if checked_chunks is None else checked_chunks

    def open_chunk(column: str, ref: dict[str, Any], position: int) -> bytes | BinaryIO:
        key = (ref["uri"], ref["position"], ref["size"])
        if (check_hashes and key not in checked) or not is_local(key[0]):
            # read whole: to check it, or from an object store, where a GET per demuxer
            # seek would cost more than the chunk
            whole = table.take_row_dicts(
                rows[position : position + 1], [column], "bytes", check_hashes=check_hashes
            )
            checked.add(key)  # a later batch of this reader reads only what its frames need
            return whole[0][column]
        return open_ref(BlobRef(*key), storage_options=storage_options, buffer_size=VIDEO_READ)

    return frames.decode(taken, open_chunk, lambda position: f"row id {rows[position]}")


#: bytes read ahead per read of a local video chunk: the demuxer seeks between the index and
#: the frames' packets, and each seek drops the buffer (one frame of a 1 MB chunk read 2 MB
#: with the 1 MiB default buffer, 133 KB with this one)
VIDEO_READ = 64 << 10


def _column_names(table: Table | TableInFreshProcess) -> list[str]:
    if isinstance(table, TableInFreshProcess):
        return table.column_names()
    return table.schema.names


def checked_frames(
    frames: object, layout: object, blobs: object, max_frame_pixels: object = MAX_FRAME_PIXELS
) -> VideoFrames | None:
    """The ``frames`` options, checked; frames are decoded from bytes, not references."""
    checked = VideoFrames.of(frames, layout, max_frame_pixels=max_frame_pixels)  # type: ignore[arg-type]
    if checked is not None and blobs != "bytes":
        raise InvalidInputError(
            f"frames decode the chunks' bytes: blobs must be 'bytes', not {blobs!r}"
        )
    return checked


def checked_columns(columns: object) -> list[str] | None:
    """``columns`` as a list of names (None: all), or an error naming what is wrong."""
    if columns is None:
        return None
    listed = isinstance(columns, Sequence) and not isinstance(columns, (str, bytes))
    if not listed or not all(isinstance(name, str) for name in columns):
        raise InvalidInputError(f"columns must be a list of column names, got {columns!r}")
    return list(columns)


def check_blobs(blobs: object) -> None:
    """Raises unless ``blobs`` is ``"bytes"`` or ``"refs"``."""
    if blobs not in ("bytes", "refs"):
        raise InvalidInputError(f"blobs must be 'bytes' or 'refs', got {blobs!r}")


def _torch_worker() -> tuple[int | None, int | None]:
    """(worker id, worker count) inside a torch DataLoader worker, else (None, None)."""
    torch_data = sys.modules.get("torch.utils.data")
    info = torch_data.get_worker_info() if torch_data is not None else None
    return (info.id, info.num_workers) if info is not None else (None, None)
