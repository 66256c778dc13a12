"""The :class:`~blobhouse.Table` facade written out: every public member keeps the signature
it had when members were generated from strings, the snapshot's accessors are typed and
forward to the snapshot, and the read methods are declared once (:class:`TableReads`), the
same functions on a table as on a :class:`TableReader`."""

from __future__ import annotations

import inspect
import typing

import pyarrow as pa
import pytest

from blobhouse import blob_array, write_table
from blobhouse.read.table_reader import TableReader, TableReads
from blobhouse.snapshot import TableSnapshot
from blobhouse.table import Table

# each public member's signature before the facade was written out (2026-11-29); compact,
# set_properties and update as they took the option objects (their fields kept as keywords)
SIGNATURES = {
    "add_columns": "(self, columns: 'schema_changes.NewColumns') -> 'Table'",
    "add_data_file": "(self, written: 'WrittenFile') -> 'Table'",
    "alter_columns": "(self, *alterations: 'Mapping[str, Any]') -> 'Table'",
    "backfill_blob_column": (
        "(self, column: 'str', fn: 'BlobFunction', *, dedup: 'str | None' = None) -> 'Table'"
    ),
    "blob_refs": "(self, column: 'str', indices: 'Sequence[int]') -> 'pa.StructArray'",
    "checkout": "(self, version: 'int | str | None', *, branch: 'str | None' = None) -> 'Table'",
    "compact": (
        "(self, targets: 'CompactionTargets | None' = None, *, progress: "
        "'ProgressCallback | None' = None, commit: 'CommitOptions | None' = None, "
        "target_rows: 'int | None' = None, "
        "target_bytes: 'int | None' = None, deleted_fraction: 'float | None' = None, "
        "max_unused: 'float | None' = None, retries: 'int | None' = None) -> "
        "'CompactionReport'"
    ),
    "count_rows": "(self, filter: 'str | None' = None) -> 'int'",
    "data_file_path": "(self) -> 'str'",
    "delete": "(self, filter: 'str') -> 'Table'",
    "drop_columns": "(self, columns: 'str | Sequence[str]') -> 'Table'",
    "gc": "(self, **options: 'Any') -> 'GcReport'",
    "merge_insert": (
        "(self, on: 'str | Sequence[str]', *, dedup: 'str | Mapping[str, str] | None' = None, "
        "ref_id_columns: 'Mapping[str, str] | None' = None, placement: 'Mapping[str, Mapping[str, "
        "int]] | None' = None) -> 'MergeInsert'"
    ),
    "open_blob": "(self, column: 'str', index: 'int') -> 'BinaryIO | None'",
    "output_schema": (
        "(self, columns: 'Sequence[str] | None' = None, blobs: 'BlobsMode' = 'refs') -> 'pa.Schema'"
    ),
    "read_blobs": "(self, column: 'str', indices: 'Sequence[int]') -> 'list[bytes | None]'",
    "refresh": "(self) -> 'Table'",
    "relocate": "(self) -> 'Table'",
    "replace_column": "(self, column: 'str', files: 'Mapping[int, WrittenFile]') -> 'Table'",
    "row_ids": "(self, filter: 'str | None' = None) -> 'np.ndarray'",
    "scan": (
        "(self, columns: 'Sequence[str] | None' = None, filter: 'str | None' = None, "
        "blobs: 'BlobsMode' = 'refs', batch_size: 'int | None' = None, *, "
        "fragment_ids: 'Sequence[int] | None' = None, offset: 'int | None' = None, "
        "limit: 'int | None' = None, check_hashes: 'bool' = True) -> 'Iterator[pa.RecordBatch]'"
    ),
    "set_properties": (
        "(self, options: 'WriteOptions | None' = None, *, ref_id_columns: 'Mapping[str, str] "
        "| None' = None, dedup: 'str | Mapping[str, str] | None' = None, placement: "
        "'Mapping[str, Mapping[str, int]] | None' = None, allowed_bases: 'Sequence[str] | "
        "None' = None, managed_bases: 'Sequence[str] | None' = None, max_rows_per_file: 'int "
        "| None' = None, max_bytes_per_file: 'int | None' = None) -> 'Table'"
    ),
    "stats": "(self) -> 'StatsReport'",
    "take": (
        "(self, indices: 'Sequence[int]', columns: 'Sequence[str] | None' = None, "
        "blobs: 'BlobsMode' = 'refs', *, check_hashes: 'bool' = True) -> 'pa.Table'"
    ),
    "take_row_dicts": (
        "(self, row_ids: 'Sequence[int] | np.ndarray', columns: 'Sequence[str] | None' = None, "
        "blobs: 'BlobsMode' = 'bytes', *, check_hashes: 'bool' = True) -> 'list[dict[str, Any]]'"
    ),
    "take_rows": (
        "(self, row_ids: 'Sequence[int] | np.ndarray', columns: 'Sequence[str] | None' = None, "
        "blobs: 'BlobsMode' = 'refs', *, check_hashes: 'bool' = True) -> 'pa.Table'"
    ),
    "to_arrow": (
        "(self, columns: 'Sequence[str] | None' = None, filter: 'str | None' = None, "
        "blobs: 'BlobsMode' = 'refs', *, check_hashes: 'bool' = True) -> 'pa.Table'"
    ),
    "update": (
        "(self, updates: 'Mapping[str, str | BlobFunction | None]', where: 'str | None' = "
        "None, *, dedup: 'str | None' = None, commit: 'CommitOptions | None' = None, "
        "retries: 'int | None' = None) -> 'UpdateReport'"
    ),
    "verify": "(self, **options: 'Any') -> 'VerifyReport'",
}
PROPERTIES = [
    "allowed_bases",
    "blob_columns",
    "branch",
    "dataset",
    "location",
    "maintenance",
    "managed_bases",
    "moved_from",
    "properties",
    "schema",
    "snapshot",
    "storage_options",
    "uri",
    "version",
]


# what was generated as ``(self, *args, **kwargs) -> Any``: now the snapshot's signature
SNAPSHOT_METHODS = (
    "versions",
    "tags",
    "branches",
    "resolve_refs",
    "file_column",
    "data_file_of",
    "data_file_uri",
    "recorded_hashes",
)
READS = (
    "count_rows",
    "scan",
    "to_arrow",
    "take",
    "row_ids",
    "take_rows",
    "take_row_dicts",
    "blob_refs",
    "read_blobs",
    "open_blob",
    "output_schema",
)


def _public(cls: type) -> dict[str, object]:
    return {name: m for name, m in inspect.getmembers(cls) if not name.startswith("_")}


def test_every_public_member_keeps_its_signature() -> None:
    members = _public(Table)
    assert set(members) == {*SIGNATURES, *PROPERTIES, *SNAPSHOT_METHODS}
    for name, signature in SIGNATURES.items():
        assert str(inspect.signature(members[name])) == signature, name
    for name in PROPERTIES:
        assert isinstance(members[name], property), name


def test_snapshot_accessors_are_typed_as_the_snapshot() -> None:
    for name in SNAPSHOT_METHODS:
        ours = inspect.signature(getattr(Table, name))
        theirs = inspect.signature(getattr(TableSnapshot, name))
        assert ours == theirs, name
        assert typing.get_type_hints(getattr(Table, name))  # the annotations resolve
    for name in PROPERTIES:
        hints = typing.get_type_hints(getattr(Table, name).fget)
        assert hints["return"] is not typing.Any, name


def test_every_public_member_is_documented() -> None:
    for name, member in _public(Table).items():
        assert (inspect.getdoc(member) or "").strip(), name


def test_the_read_methods_are_the_readers() -> None:
    assert issubclass(Table, TableReads) and issubclass(TableReader, TableReads)
    for name in READS:
        assert getattr(Table, name) is getattr(TableReads, name), name
        assert getattr(TableReader, name) is getattr(TableReads, name), name
    assert "scan" not in vars(Table) and "scan" not in vars(TableReader)


@pytest.fixture
def table(tmp_path) -> Table:
    data = pa.table({"id": [1, 2, 3], "img": blob_array([b"a", b"b", b"a"])})
    return write_table(data, str(tmp_path / "t"), max_rows_per_file=1)


def test_accessors_forward_to_the_snapshot(table: Table) -> None:
    snapshot = table.snapshot
    for name in PROPERTIES:
        if name not in ("maintenance", "properties", "snapshot"):
            assert getattr(table, name) == getattr(snapshot, name), name
    assert table.properties == snapshot.properties
    assert (table.versions(), table.tags(), table.branches()) == (
        snapshot.versions(),
        snapshot.tags(),
        snapshot.branches(),
    )
    assert table.recorded_hashes() is snapshot.recorded_hashes()
    fragment = table.dataset.get_fragments()[0]
    assert table.file_column(("img",))(fragment.fragment_id) == snapshot.file_column(("img",))(
        fragment.fragment_id
    )
    assert table.data_file_of(("img",))(0) == snapshot.data_file_of(("img",))(0)
    data_file = fragment.data_files()[0]
    assert table.data_file_uri(data_file) == snapshot.data_file_uri(data_file)


def test_a_table_and_its_reader_read_alike(table: Table) -> None:
    reader = TableReader(table.snapshot)
    assert table.take([2, 0], blobs="bytes") == reader.take([2, 0], blobs="bytes")
    assert table.to_arrow(blobs="bytes") == reader.to_arrow(blobs="bytes")
    assert table.take_row_dicts(table.row_ids()) == reader.take_row_dicts(reader.row_ids())
    assert table.read_blobs("img", [0, 1]) == reader.read_blobs("img", [0, 1]) == [b"a", b"b"]
    assert table.output_schema() == reader.output_schema()


def test_a_scan_reads_the_version_it_started_at(table: Table) -> None:
    batches = table.scan(blobs="bytes", batch_size=1)
    first = next(batches)
    write_table(pa.table({"id": [4], "img": blob_array([b"c"])}), table.uri, mode="append")
    table.refresh()  # the table moves on while its scan runs
    rest = list(batches)
    assert sum(b.num_rows for b in [first, *rest]) == 3
    assert table.count_rows() == 4
