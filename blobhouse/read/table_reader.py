"""Reading the rows of one table version: selections, scans, takes by position and by id,
blob columns returned as references or as checked bytes.

:class:`TableReads` declares the read methods once; :class:`~blobhouse.Table` has them, and
:class:`TableReader`, the service that runs them, holds one
:class:`~blobhouse.snapshot.TableSnapshot`. Blob columns of fragments read often come from
their kept references (:mod:`blobhouse.kept_references`) instead of Lance's take; bytes are
read with coalesced ranged reads (:mod:`blobhouse.files.ranges`), checked against the blake3
recorded when they were written (:mod:`blobhouse.files.checksums`). References carry that blake3
(``REF_TYPE``'s ``blake3``), so whoever reads them later checks the bytes without the table.
"""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, TypeVar

import numpy as np
import pyarrow as pa

from blobhouse.columns import lance_name, resolve_columns
from blobhouse.errors import (
    BlobReadError,
    InvalidInputError,
    is_damaged_file_error,
    lance_message,
)
from blobhouse.files.digests import Digests
from blobhouse.files.ranges import REF_TYPE, open_ref, read_ranges, read_ranges_arrow
from blobhouse.files.references import ResolvedRows
from blobhouse.kept_references import DeletedRowsError, take_rows_by_id
from blobhouse.options import check_flag, check_int, keywords_checked
from blobhouse.settings import SETTINGS
from blobhouse.snapshot import TableSnapshot
from blobhouse.values import (
    ROW_ADDRESS,
    ColumnPath,
    get_column,
    get_field,
    path_name,
    replace_column,
    replace_field,
)

BlobsMode = Literal["refs", "bytes", "descriptors"]
T = TypeVar("T")
_ROW_ID = "_rowid"
#: a blob column to convert: (its path in a read batch, its path in the table)
BlobTarget = tuple[ColumnPath, ColumnPath]


@dataclass(frozen=True)
class Selection:
    """What ``columns=`` selects (see :func:`blobhouse.columns.resolve_column`): a nested
    name (``meta.image``) reads as one top-level column of that name holding the field's
    values (null where a parent is null), as Lance's scan returns it; every read of a
    :class:`Table` (scan, take, take_rows, take_row_dicts) gives that same shape."""

    names: list[str]  # the output columns, as the caller named them
    lance: list[str]  # the same columns as Lance's ``columns=`` takes them
    paths: list[ColumnPath]  # their paths in the table
    blobs: list[BlobTarget]  # the blob columns they hold, to convert

    @property
    def nested(self) -> bool:
        return any(len(p) > 1 for p in self.paths)

    def flat(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch Lance's take returned (a nested column inside its pruned parent struct)
        in the scan's shape: each nested column its own top-level column."""
        if not self.nested:
            return batch
        arrays = [get_column(batch, p) for p in self.paths]
        fields = [
            get_field(batch.schema, p).with_name(n)
            for p, n in zip(self.paths, self.names, strict=True)
        ]
        if ROW_ADDRESS in batch.schema.names:
            arrays.append(batch.column(ROW_ADDRESS))
            fields.append(batch.schema.field(ROW_ADDRESS))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def named(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A scanned batch with its columns named as the caller named them (Lance names a
        nested column by its quoted name, ``s.`a.b```)."""
        if self.lance == self.names:
            return batch
        return batch.rename_columns(self.names + batch.schema.names[len(self.names) :])


class TableReads(ABC):
    """The read methods of a table version, declared once: :class:`TableReader` runs them on
    the version it holds, :class:`~blobhouse.Table` on the version it is at when one is called
    (each call reads one version, also when the table moves while a scan runs)."""

    @abstractmethod
    def _reader(self) -> TableReader:
        """The reader of the version a read call reads."""

    @keywords_checked
    def count_rows(self, filter: str | None = None) -> int:
        """The number of rows (those matching the SQL ``filter``)."""
        reader = self._reader()
        return reader._lance_read("read", lambda: reader.snapshot.count_rows(filter))

    @keywords_checked
    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        blobs: BlobsMode = "refs",
        batch_size: int | None = None,
        *,
        fragment_ids: Sequence[int] | None = None,
        offset: int | None = None,
        limit: int | None = None,
        check_hashes: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the table as record batches (memory stays bounded by the batch size).

        ``fragment_ids``, ``offset`` and ``limit`` restrict the scan to some fragments and a
        range of their rows (how Spark splits a read). ``check_hashes=False``: bytes are not
        checked against their recorded blake3, and references carry none.
        """
        window = {"batch_size": batch_size, "offset": offset, "limit": limit}
        return self._reader()._batches(columns, filter, blobs, fragment_ids, window, check_hashes)

    @keywords_checked
    def to_arrow(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        blobs: BlobsMode = "refs",
        *,
        check_hashes: bool = True,
    ) -> pa.Table:
        """The table (or the selected columns / rows) as a pyarrow Table (``check_hashes``:
        as :meth:`scan`).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> t.to_arrow(filter="id = 2", blobs="bytes").to_pylist()
        [{'id': 2, 'img': b'b'}]
        """
        reader = self._reader()
        batches = list(reader.scan(columns, filter, blobs, check_hashes=check_hashes))
        if batches:
            return pa.Table.from_batches(batches)
        return reader._empty(columns, blobs)

    @keywords_checked
    def take(
        self,
        indices: Sequence[int],
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "refs",
        *,
        check_hashes: bool = True,
    ) -> pa.Table:
        """Rows at ``indices`` (positions among the live rows), in the order asked
        (``check_hashes``: as :meth:`scan`). Blob columns of fragments read often come from
        their kept references (:mod:`blobhouse.kept_references`), without Lance's take."""
        reader = self._reader()
        check_hashes = check_flag("check_hashes", check_hashes)
        indices = reader._check_indices(indices)
        selection = reader._taken_columns(columns, blobs)

        def take(cols: list[str]) -> pa.Table:
            return reader.snapshot.dataset.take(indices, columns=cols)

        if indices and reader._kept_serves(selection, blobs, by_id=False):
            kept = functools.partial(
                reader.snapshot.rows_at, positions=indices, recorded=check_hashes
            )
            return reader._kept_table(take, kept, selection, blobs, check_hashes)
        return reader._taken(take, columns, blobs, check_hashes)

    def row_ids(self, filter: str | None = None) -> np.ndarray:
        """The ids of the live rows (those matching ``filter``), in table order, for
        :meth:`take_rows`: a scan of the filter's columns only, never of blob bytes.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2, 3], "img": blob_array([b"a", b"b", b"c"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> t.take_rows(t.row_ids("id >= 2"), blobs="bytes").to_pylist()
        [{'id': 2, 'img': b'b'}, {'id': 3, 'img': b'c'}]
        """
        reader = self._reader()

        def scan() -> list[np.ndarray]:
            scanner = reader.snapshot.dataset.scanner(columns=[], filter=filter, with_row_id=True)
            return [batch.column(_ROW_ID).to_numpy() for batch in scanner.to_batches()]

        try:  # a damaged file or a failing store is raised naming it, never as the filter's
            ids = reader._lance_read("read", scan)
        except (ValueError, pa.ArrowInvalid) as exc:
            if filter is None:
                raise
            raise InvalidInputError(
                f"filter {filter!r} is not valid SQL for this table: {lance_message(exc)}"
            ) from None
        return np.concatenate(ids) if ids else np.zeros(0, np.uint64)

    @keywords_checked
    def take_rows(
        self,
        row_ids: Sequence[int] | np.ndarray,
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "refs",
        *,
        check_hashes: bool = True,
    ) -> pa.Table:
        """Rows by id (from :meth:`row_ids`), in the order asked: one native take for the
        rows and their addresses, then each distinct payload read once (``blobs="bytes"``,
        checked against its recorded hash unless ``check_hashes`` is False). Blob columns
        of fragments read often come from their kept references
        (:mod:`blobhouse.kept_references`), without Lance's take."""
        reader = self._reader()
        ids = _row_ids(row_ids)
        check_hashes = check_flag("check_hashes", check_hashes)
        selection = reader._taken_columns(columns, blobs)
        take = functools.partial(reader._by_id, ids.tolist())
        if len(ids) and reader._kept_serves(selection, blobs, by_id=True):
            kept = functools.partial(reader._kept_by_id, ids=ids, recorded=check_hashes)
            return reader._kept_table(take, kept, selection, blobs, check_hashes)
        return reader._taken(take, columns, blobs, check_hashes)

    @keywords_checked
    def take_row_dicts(
        self,
        row_ids: Sequence[int] | np.ndarray,
        columns: Sequence[str] | None = None,
        blobs: BlobsMode = "bytes",
        *,
        check_hashes: bool = True,
    ) -> list[dict[str, Any]]:
        """Rows by id as dicts, in the order asked, for Python consumers (a DataLoader's
        ``transform``). With ``blobs="bytes"`` each distinct payload is read once, straight
        into one ``bytes`` object that every row referencing it shares, and checked against
        its recorded hash (unless ``check_hashes`` is False): no Arrow buffer in between.

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"a"])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> rows = t.take_row_dicts(t.row_ids())
        >>> rows, rows[0]["img"] is rows[1]["img"]
        ([{'id': 1, 'img': b'a'}, {'id': 2, 'img': b'a'}], True)
        """
        reader = self._reader()
        check_hashes = check_flag("check_hashes", check_hashes)
        if blobs != "bytes":
            return reader.take_rows(row_ids, columns, blobs, check_hashes=check_hashes).to_pylist()
        ids = _row_ids(row_ids)
        selection = reader._taken_columns(columns, blobs)
        if len(ids) and reader._kept_serves(selection, blobs, by_id=True):
            return reader._row_dicts_by_id(ids, selection, check_hashes)
        ids = ids.tolist()
        lance_columns = selection.lance
        wanted = [*lance_columns, ROW_ADDRESS] if selection.blobs else lance_columns
        taken = reader._lance_read("read", lambda: reader._by_id(ids, wanted))
        batches = [selection.flat(b) for b in taken.to_batches()]
        return [
            row
            for batch in batches
            for row in reader._row_dicts(batch, selection.blobs, check_hashes)
        ]

    def blob_refs(self, column: str, indices: Sequence[int]) -> pa.StructArray:
        """Resolved references ``struct<uri, position, size, blake3>`` of ``column`` at
        ``indices`` (``blake3``: recorded for the payload when it was written, or null)."""
        reader = self._reader()
        path = reader.snapshot.blob_path(column, "blob_refs")
        indices = reader._check_indices(indices)
        if not indices:
            return pa.array([], type=REF_TYPE)
        return reader._refs(path, reader.snapshot.rows_at(path, indices, recorded=True))

    def read_blobs(self, column: str, indices: Sequence[int]) -> list[bytes | None]:
        """The bytes of ``column`` at ``indices`` (None for null), with coalesced ranged reads,
        checked against their recorded hashes."""
        reader = self._reader()
        path = reader.snapshot.blob_path(column, "read_blobs")
        indices = reader._check_indices(indices)
        if not indices:
            return []
        # each payload read into its own bytes
        rows = reader.snapshot.rows_at(path, indices, recorded=True)
        return reader._checked_bytes(path, rows, read_ranges, doing="read blobs of")

    def open_blob(self, column: str, index: int) -> BinaryIO | None:
        """A seekable file object over one blob (None if the value is null). Reading it whole,
        front to back, checks its recorded hash at the end (ranged reads cannot be checked).

        >>> import tempfile, pyarrow as pa
        >>> from blobhouse import blob_array, write_table
        >>> t = write_table(pa.table({"v": blob_array([b"frames" * 20_000])}),
        ...                 tempfile.mkdtemp() + "/t")
        >>> with t.open_blob("v", 0) as f:
        ...     _ = f.seek(6); f.read(6)
        b'frames'
        """
        reader = self._reader()
        path = reader.snapshot.blob_path(column, "open_blob")
        (index,) = reader._check_indices([index])
        rows = reader.snapshot.rows_at(path, [index], recorded=True)
        ref = rows.refs.ref(0)
        if ref is None:
            return None
        digest = reader._recorded(path, rows, "read blobs of")[0]
        row = int(rows.addresses[0])
        name = f"blob column {column!r}, fragment {row >> 32} row {row & 0xFFFFFFFF}"
        return open_ref(ref, digest, name, reader.snapshot.storage_options)

    def output_schema(
        self, columns: Sequence[str] | None = None, blobs: BlobsMode = "refs"
    ) -> pa.Schema:
        """The schema :meth:`scan` yields for these columns and blob mode."""
        reader = self._reader()
        selection = reader._selection(columns, blobs)
        schema = reader.snapshot.dataset.scanner(columns=selection.lance).projected_schema
        if selection.lance != selection.names:
            schema = pa.schema(
                [f.with_name(n) for f, n in zip(schema, selection.names, strict=True)],
                metadata=schema.metadata,
            )
        out_type = pa.large_binary() if blobs == "bytes" else REF_TYPE
        for out, _ in selection.blobs:
            schema = replace_field(schema, out, pa.field(out[-1], out_type))
        return schema


class TableReader(TableReads):
    """The reads (:class:`TableReads`) of the one table version it holds.

    >>> import tempfile, pyarrow as pa
    >>> from blobhouse import blob_array, write_table
    >>> t = write_table(pa.table({"id": [1, 2], "img": blob_array([b"a", b"b"])}),
    ...                 tempfile.mkdtemp() + "/t")
    >>> TableReader(t.snapshot).take([1], blobs="bytes").to_pylist()
    [{'id': 2, 'img': b'b'}]
    """

    def __init__(self, snapshot: TableSnapshot) -> None:
        snapshot.check_column_names()  # Lance could not read a column another tool misnamed
        self.snapshot = snapshot

    def _reader(self) -> TableReader:
        """This reader: it reads the version it holds."""
        return self

    def _batches(
        self,
        columns: Sequence[str] | None,
        filter: str | None,
        blobs: BlobsMode,
        fragment_ids: Sequence[int] | None,
        window: dict[str, int | None],
        check_hashes: bool,
    ) -> Iterator[pa.RecordBatch]:
        """The batches of :meth:`scan` (``window``: its ``batch_size``, ``offset`` and
        ``limit``), checked and read as they are asked for."""
        check_hashes = check_flag("check_hashes", check_hashes)
        for name, value in window.items():
            if value is not None:
                SETTINGS[name].check(value)  # Lance's own refusals name its source lines
        selection = self._selection(columns, blobs)
        fragments = None if fragment_ids is None else self._fragments(fragment_ids)
        scanner = self.snapshot.dataset.scanner(
            columns=selection.lance,
            filter=filter,
            with_row_address=bool(selection.blobs),
            fragments=fragments,
            **window,
        )
        batches = scanner.to_batches()
        while (batch := self._lance_read("read", lambda: next(batches, None))) is not None:
            named = selection.named(batch)
            yield self._convert(named, selection.blobs, blobs, check_hashes)

    def _fragments(self, fragment_ids: object) -> list:
        """The snapshot's fragments of ``fragment_ids``, or an error naming the id it lacks."""
        if isinstance(fragment_ids, (str, bytes)) or not isinstance(fragment_ids, Iterable):
            raise InvalidInputError(
                f"fragment_ids must be a list of integers, got {fragment_ids!r}"
            )
        fragments = []
        for given in fragment_ids:
            fragment_id = check_int("fragment_ids", given, 0, 2**64 - 1)  # Lance's u64
            fragment = self.snapshot.dataset.get_fragment(fragment_id)
            if fragment is None:
                raise InvalidInputError(
                    f"fragment_ids: version {self.snapshot.version} has no fragment {fragment_id}"
                )
            fragments.append(fragment)
        return fragments

    def _kept_serves(self, selection: Selection, blobs: str, by_id: bool) -> bool:
        """Whether a take can read its blob columns from kept references: each blob column
        is selected itself, not inside a selected struct, and, for rows by id, a row's id is
        its address (no stable row ids)."""
        return (
            blobs in ("refs", "bytes")
            and bool(selection.blobs)
            # (a blob column inside a selected struct is read where it is, in the struct)
            and all(len(out) == 1 and path in selection.paths for out, path in selection.blobs)
            and not (by_id and self.snapshot.dataset.has_stable_row_ids)
        )

    def _kept_table(
        self,
        take: Callable[[list[str]], pa.Table],
        kept: Callable[[ColumnPath], ResolvedRows],
        selection: Selection,
        blobs: str,
        check_hashes: bool,
    ) -> pa.Table:
        """A take's rows with the blob columns from kept references (:meth:`_kept_parts`)."""
        plain, blob_rows = self._kept_parts(take, kept, selection)
        arrays, fields, at = [], [], 0
        for i, name in enumerate(selection.names):
            if i in blob_rows:
                path, rows = selection.paths[i], blob_rows[i]
                if blobs == "bytes":
                    arrays.append(self._checked_bytes(path, rows, read_ranges_arrow, check_hashes))
                else:
                    arrays.append(self._refs(path, rows, check_hashes))
                fields.append(pa.field(name, arrays[-1].type))
            else:  # the take holds the other columns in selection order
                arrays.append(plain.column(at))
                fields.append(plain.schema.field(at))
                at += 1
        schema = pa.schema(fields, metadata=self.snapshot.schema.metadata)
        return pa.Table.from_arrays(arrays, schema=schema)

    def _row_dicts_by_id(
        self, ids: np.ndarray, selection: Selection, check_hashes: bool
    ) -> list[dict[str, Any]]:
        """:meth:`take_row_dicts` with the blob columns from kept references."""
        plain, blob_rows = self._kept_parts(
            functools.partial(self._by_id, ids.tolist()),
            functools.partial(self._kept_by_id, ids=ids, recorded=check_hashes),
            selection,
        )
        rows = plain.to_pylist() if plain is not None else [{} for _ in range(len(ids))]
        for i, resolved in blob_rows.items():
            path, name = selection.paths[i], selection.names[i]
            values = self._checked_bytes(path, resolved, read_ranges, check_hashes)
            for row, value in zip(rows, values, strict=True):
                row[name] = value
        return [{name: row[name] for name in selection.names} for row in rows]

    def _kept_parts(
        self,
        take: Callable[[list[str]], pa.Table],
        kept: Callable[[ColumnPath], ResolvedRows],
        selection: Selection,
    ) -> tuple[pa.RecordBatch | None, dict[int, ResolvedRows]]:
        """For a take: the selected columns that are not blob columns (one ``take``; None
        when there are none), and each blob column's rows from kept references (``kept``),
        by its place in the selection."""
        blob_paths = {path for _, path in selection.blobs}
        plain = [i for i, path in enumerate(selection.paths) if path not in blob_paths]
        batch = None
        if plain:
            part = Selection(
                [selection.names[i] for i in plain],
                [selection.lance[i] for i in plain],
                [selection.paths[i] for i in plain],
                [],
            )
            taken = self._lance_read("read", lambda: take(part.lance))
            batch = part.named(part.flat(taken.combine_chunks().to_batches()[0]))
        blob_rows = {i: kept(path) for i, path in enumerate(selection.paths) if path in blob_paths}
        return batch, blob_rows

    def _kept_by_id(self, path: ColumnPath, ids: np.ndarray, recorded: bool) -> ResolvedRows:
        try:
            return self.snapshot.rows_by_id(path, ids, recorded)
        except DeletedRowsError as exc:
            raise _not_rows_here(self.snapshot, exc.ids, _absent(self.snapshot)) from None
        except (IndexError, OSError) as exc:
            if isinstance(exc, OSError) and not _bad_ids(exc):
                raise  # a missing, unreadable or damaged data file
            raise _not_rows_here(self.snapshot, ids.tolist(), exc) from None

    def _by_id(self, ids: list[int], columns: list[str]) -> pa.Table:
        """One native take of rows by id (pylance's public take is by position)."""
        try:
            return take_rows_by_id(self.snapshot.dataset, np.asarray(ids, np.uint64), columns)
        except OSError as exc:
            if not _bad_ids(exc):
                raise  # a missing, unreadable or damaged data file
            raise _not_rows_here(self.snapshot, ids, exc) from None
        except DeletedRowsError as exc:
            raise _not_rows_here(self.snapshot, exc.ids, _absent(self.snapshot)) from None

    def _row_dicts(
        self, batch: pa.RecordBatch, targets: list[BlobTarget], check_hashes: bool
    ) -> list[dict[str, Any]]:
        if not targets:
            return batch.to_pylist()
        addresses, payloads = batch.column(ROW_ADDRESS), []
        for out, path in targets:
            descriptors = get_column(batch, out)
            payloads.append(
                self._checked_bytes(
                    path,
                    self.snapshot.resolve_rows(path, descriptors, addresses),
                    read_ranges,
                    check_hashes,
                )
            )
            # the descriptors are not wanted in the rows: nulls convert for nothing
            nulls = pa.nulls(batch.num_rows)
            batch = replace_column(batch, out, nulls, pa.field(out[-1], pa.null()))
        rows = batch.drop_columns([ROW_ADDRESS]).to_pylist()
        for (out, _), values in zip(targets, payloads, strict=True):
            for row, value in zip(rows, values, strict=True):
                _set_nested(row, out, value)
        return rows

    def _taken(
        self,
        take: Callable[[list[str]], pa.Table],
        columns: Sequence[str] | None,
        blobs: BlobsMode,
        check_hashes: bool = True,
    ) -> pa.Table:
        """The rows ``take(columns)`` returns (with their addresses when blobs are read), blob
        columns converted as ``blobs`` says."""
        check_hashes = check_flag("check_hashes", check_hashes)
        selection = self._taken_columns(columns, blobs)
        lance_columns = selection.lance
        wanted = [*lance_columns, ROW_ADDRESS] if selection.blobs else lance_columns
        taken = self._lance_read("read", lambda: take(wanted))
        batches = [
            self._convert(selection.flat(b), selection.blobs, blobs, check_hashes)
            for b in taken.to_batches()
            if b.num_rows
        ]
        if batches:
            return pa.Table.from_batches(batches)
        return self._empty(columns, blobs)

    def _lance_read(self, doing: str, read: Callable[[], T]) -> T:
        """``read()``, a read of this table by Lance (:func:`~blobhouse.snapshot.lance_read`)."""
        return self.snapshot.lance_read(doing, read)

    def _selection(self, columns: Sequence[str] | None, blobs: str) -> Selection:
        if blobs not in ("refs", "bytes", "descriptors"):
            raise InvalidInputError(
                f"blobs must be 'refs', 'bytes' or 'descriptors', got {blobs!r}"
            )
        if columns is None:
            names = list(self.snapshot.schema.names)
            paths = [(n,) for n in names]
        else:
            names = list(columns)
            paths = resolve_columns(self.snapshot.schema, names)
        targets: list[BlobTarget] = []
        if blobs != "descriptors":
            for name, path in zip(names, paths, strict=True):
                # a nested selection is one top-level column named as selected
                out = (name,) if len(path) > 1 else path
                targets.extend(
                    ((*out, *b[len(path) :]), b)
                    for b in self.snapshot.blob_paths
                    if b[: len(path)] == path
                )
        return Selection(names, [lance_name(p) for p in paths], paths, targets)

    def _taken_columns(self, columns: Sequence[str] | None, blobs: str) -> Selection:
        """:meth:`_selection` for a take, which needs a column (a scan may have none)."""
        selection = self._selection(columns, blobs)
        if not selection.names:
            raise InvalidInputError(
                f"columns is empty: name one or more of {self.snapshot.schema.names}"
            )
        return selection

    def _check_indices(self, indices: Sequence[int]) -> list[int]:
        indices = _integers(indices, "row indices")
        rows = self.count_rows()
        bad = [i for i in indices if not 0 <= i < rows]
        if bad:
            raise IndexError(f"row indices {bad[:5]} out of range for a table of {rows} rows")
        return indices

    def _convert(
        self, batch: pa.RecordBatch, targets: list[BlobTarget], blobs: str, check_hashes: bool
    ) -> pa.RecordBatch:
        if not targets:
            return batch
        addresses = batch.column(ROW_ADDRESS)
        for out, path in targets:
            descriptors = get_column(batch, out)
            rows = self.snapshot.resolve_rows(path, descriptors, addresses)
            if blobs == "bytes":
                values = self._checked_bytes(path, rows, read_ranges_arrow, check_hashes)
                batch = replace_column(batch, out, values, pa.field(out[-1], pa.large_binary()))
            else:
                refs = self._refs(path, rows, check_hashes)
                batch = replace_column(batch, out, refs, pa.field(out[-1], REF_TYPE))
        return batch.drop_columns([ROW_ADDRESS])

    def _recorded(self, path: ColumnPath, rows: ResolvedRows, doing: str) -> Digests:
        """The blake3 recorded for each of ``rows`` of blob column ``path``, read from their
        data files (``doing`` names the read in a store's errors)."""
        return self._lance_read(
            doing,
            lambda: self.snapshot.recorded_hashes().expected(
                self.snapshot.file_column(path), rows, self.snapshot.data_file_of(path)
            ),
        )

    def _refs(
        self, path: ColumnPath, rows: ResolvedRows, check_hashes: bool = True
    ) -> pa.StructArray:
        """``rows`` of blob column ``path`` as references (``REF_TYPE``), each carrying the
        blake3 recorded for its payload unless ``check_hashes`` is False (then none: whoever
        reads them reads unchecked, and no data file is opened here)."""
        if not check_hashes:
            return rows.refs.to_arrow()
        return rows.refs.to_arrow(self._recorded(path, rows, "read").to_arrow())

    def _checked_bytes(
        self,
        path: ColumnPath,
        rows: ResolvedRows,
        read: Callable[..., pa.Array | list],
        check_hashes: bool = True,
        doing: str = "read",
    ) -> pa.Array | list:
        """The payloads of ``rows`` of blob column ``path`` (``read_ranges`` or
        ``read_ranges_arrow``), each checked against its recorded blake3 as it arrives
        (hashing overlaps reading) unless ``check_hashes`` is False. ``doing`` names the
        read in a store's errors (recorded hashes are read from the rows' data files)."""
        verify = None
        if check_hashes:
            verify = self._lance_read(
                doing,
                lambda: self.snapshot.recorded_hashes().verifier(
                    path_name(path),
                    self.snapshot.file_column(path),
                    rows,
                    self.snapshot.data_file_of(path),
                ),
            )
        try:
            return read(rows.refs, storage_options=self.snapshot.storage_options, verify=verify)
        except BlobReadError as exc:
            raise _naming_row(exc, path_name(path), rows) from None

    def _empty(self, columns: Sequence[str] | None, blobs: BlobsMode) -> pa.Table:
        return self.output_schema(columns, blobs).empty_table()


def _integers(values: Sequence[int] | np.ndarray, what: str) -> list[int]:
    """``values`` as Python ints; TypeError naming the first that is not an integer (a float,
    a string or a bool would read some other row: ``int(1.5)`` is row 1)."""
    if getattr(values, "ndim", 1) != 1:  # a numpy array or a tensor of another shape
        shape = tuple(getattr(values, "shape", ()))
        raise TypeError(f"{what} must be one-dimensional, got an array of shape {shape}")
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return values.tolist()
    # the common call: plain ints (type, not isinstance: a bool is an int and would read row 1)
    if type(values) is list and all(type(v) is int for v in values):
        return list(values)
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what} must be a sequence of integers, got {values!r}")
    out = []
    for value in values:
        try:  # an integer of any kind (numpy's, a torch scalar): what has __index__
            if isinstance(value, bool | np.bool_) or "bool" in str(getattr(value, "dtype", "")):
                raise TypeError  # a mask: True would read row 1
            out.append(operator.index(value))
        except TypeError:
            raise TypeError(f"{what} must be integers, got {value!r}") from None
    return out


def _row_ids(row_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Row ids (from :meth:`Table.row_ids`) as uint64, checked: integers, none negative (numpy
    would wrap -1 to the largest id)."""
    if isinstance(row_ids, np.ndarray) and row_ids.dtype == np.uint64 and row_ids.ndim == 1:
        return row_ids  # what row_ids() returns: nothing to check
    ids = _integers(row_ids, "row ids")
    bad = [i for i in ids if not 0 <= i < 1 << 64]
    if bad:
        raise IndexError(f"row ids {bad[:5]} are not rows: ids come from row_ids()")
    return np.array(ids, dtype=np.uint64)


def _bad_ids(exc: OSError) -> bool:
    """Whether Lance's error of a take by id says the ids are not rows (not that a file
    it read is missing, unreadable or damaged)."""
    return str(exc).startswith("Invalid user input") and not is_damaged_file_error(exc)


def _set_nested(row: dict[str, Any], path: ColumnPath, value: object) -> None:
    """``row[path[0]]...[path[-1]] = value``, unless a parent struct is null (then so is
    ``value``)."""
    for name in path[:-1]:
        row = row[name]
        if row is None:
            return
    row[path[-1]] = value


def _not_rows_here(snapshot: TableSnapshot, ids: list[int], why: Exception | str) -> IndexError:
    """Row ids of a take by id that are not all rows of ``snapshot``'s version: those that
    name no fragment of it, or a row past a fragment's end, when there are any; else the
    others, with ``why`` (Lance's error, or why they were not found)."""
    detail = lance_message(why) if isinstance(why, OSError) else str(why)
    if outside := _outside(snapshot, ids):
        ids, detail = list(outside), "; ".join(outside.values())
    return IndexError(
        f"row ids {ids[:5]}{' ...' if len(ids) > 5 else ''} are not all rows of version "
        f"{snapshot.version} of this table (take ids from row_ids()): {detail}"
    )


def _absent(snapshot: TableSnapshot) -> str:
    """Why ids a take by id did not find are not rows: an address names a deleted row (one
    past a fragment's end is caught before, :func:`_outside`); a stable id may also never have
    been given out."""
    if snapshot.dataset.has_stable_row_ids:
        return "no row of this version has them (deleted rows, or ids never given out)"
    return "deleted rows"


def _outside(snapshot: TableSnapshot, ids: list[int]) -> dict[int, str]:
    """Each of ``ids`` that is no row address of ``snapshot``'s version -> why (none when its
    row ids are stable ids, not addresses)."""
    if snapshot.dataset.has_stable_row_ids:
        return {}
    rows = {f.fragment_id: f.metadata.physical_rows for f in snapshot.dataset.get_fragments()}
    outside: dict[int, str] = {}
    for i in ids:
        fragment, row = i >> 32, i & 0xFFFFFFFF
        if fragment not in rows:
            outside[i] = f"id {i} names fragment {fragment}, not in this version"
        elif row >= rows[fragment]:
            outside[i] = f"id {i} names row {row} of fragment {fragment} of {rows[fragment]} rows"
    return outside


def _naming_row(error: BlobReadError, column: str, rows: ResolvedRows) -> BlobReadError:
    """``error`` naming the first row of the batch whose reference points at its object."""
    row = rows.refs.first_row_of(error.uri)
    if row is None:
        return error
    address = int(rows.addresses[row])
    # the same class: a store that failed the read stays a StoreError (StoreReadError)
    return type(error)(
        f"blob column {column!r}, fragment {address >> 32} row {address & 0xFFFFFFFF}: {error}",
        error.uri,
    )
