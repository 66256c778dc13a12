"""Store-first writes: payloads into the table's store first, then the rows that reference
them, as one change under one transaction.

Some writes must put payloads in the store before their rows exist: the LeRobot import stores
each video file once, then writes frame rows referencing it. :func:`run_store_first` is that
envelope, the same for every runner (this process, or Spark tasks for either step): it holds the
transaction's lease while ``store`` writes packs named with the transaction's prefix, then
``write_rows`` writes and commits the rows under the same id (:func:`begin_write` with
``write_id``). What ``store`` stored is recorded next to the store (:mod:`blobhouse.store.records`)
so that the rows' commit, wherever it runs (the Spark data source commits in a Python worker of
its own), puts it in the store's index inside its Ctrl-C guard, with the files' own
(:meth:`Transaction.commit`). Any failure, in either step, removes what both staged: nothing
becomes visible.

>>> import tempfile, pyarrow as pa
>>> from blobhouse.commit.transaction import Transaction
>>> from blobhouse.layout import TableLocation
>>> txn = Transaction.start(TableLocation.of(tempfile.mkdtemp() + "/t"), None)
>>> batch = pa.record_batch({"id": [1, 2]})
>>> def rows(stored, begin):
...     return begin(batch.schema, batches=[batch]).run()
>>> stored, done = run_store_first(txn, lambda: ("nothing stored", ()), rows)
>>> done.snapshot.count_rows()
2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from blobhouse.commit.transaction import Transaction
from blobhouse.errors import cleanup_after
from blobhouse.store.packs import StoredPayload
from blobhouse.store.records import write_record
from blobhouse.write.table_write import begin_write

S = TypeVar("S")
R = TypeVar("R")
BeginRows = Callable[..., Any]  # begin_write with the table (and branch) and the write id set


def run_store_first(
    txn: Transaction,
    store: Callable[[], tuple[S, Sequence[StoredPayload]]],
    write_rows: Callable[[S, BeginRows], R],
    *,
    tasks_may_run: bool = False,
) -> tuple[S, R]:
    """Run ``store()`` (a result and the payloads it stored anew) under ``txn``'s lease,
    record what it stored, then run ``write_rows(result, begin)``, which writes and commits the
    rows with ``begin(schema, ...)`` (:func:`~blobhouse.write.table_write.begin_write` on
    ``txn``'s table, under its id: its commit records the stored payloads). ``tasks_may_run``:
    Spark tasks of either step may still run when it fails (an abort marks the transaction
    first)."""
    location = txn.location
    begin = partial(
        begin_write,
        location.root,
        storage_options=txn.storage_options,
        branch=location.branch,
        write_id=txn.id,
    )
    with txn.lease():
        try:
            result, stored = store()
            write_record(txn.location.root, txn.id, stored, txn.storage_options)
            return result, write_rows(result, begin)
        except BaseException as exc:
            cleanup_after(exc, lambda: txn.abort(tasks_may_run=tasks_may_run))
            raise
