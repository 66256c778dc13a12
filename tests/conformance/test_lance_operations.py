"""Conformance: every Lance-native operation a user may apply to a blobhouse table, for every
dedup mode, followed by reads through blobhouse and stock pylance, ``verify(deep=True)``,
blobhouse compact and gc, and reads again. The only acceptable outcome is identical bytes and
honest reports.

blobhouse's own mutations (update, merge_insert, schema changes) run on the same tables, on
main and on a branch. Stock Lance operations that rewrite blob columns (``update``,
``merge_insert``, ``compact_files``, LanceDB's ``optimize``) copy a shared payload once per row:
the data stays intact and blobhouse's compaction shares it again (checked below).
``BLOBHOUSE_CONFORMANCE_SCALE`` (default 1) multiplies the rows and appends for a longer run
(docs/reliability.md).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import lance
import lancedb
import numpy as np
import pyarrow as pa
import pytest
from lance.blob import blob_array as lance_blob_array

from blobhouse import Blob, blob_array, blob_field, open_table, write_table

SCALE = int(os.environ.get("BLOBHOUSE_CONFORMANCE_SCALE", "1"))
MODES = ["content", "ref_id", "global", "off"]
DIM = 4
# payloads above 300 kB get a dedicated sidecar (Lance's default is 4 MiB)
PLACEMENT = {"b": {"dedicated_size_threshold": 300_000}}
SHARED = os.urandom(150_000)  # packed, shared by many rows
SHARED_SMALL = os.urandom(24)  # shared, so packed although small
DEDICATED = os.urandom(400_000)
REF_IDS = {SHARED: 1, SHARED_SMALL: 2, DEDICATED: 3}


@dataclass
class Model:
    """What the table holds: id -> (label, payload), and the names its columns have now."""

    rows: dict[int, tuple[int, bytes | None]]
    blob: str = "b"
    label: str | None = "label"
    external: frozenset[int] = frozenset()  # ids whose payload is a user-owned external file

    def logical_bytes(self) -> int:
        """Bytes the live rows reference, stored by the table or not (stats' logical bytes)."""
        return sum(len(v) for _, v in self.rows.values() if v is not None)

    def stored_bytes(self) -> int:
        """Logical bytes of the live rows the table stores (stats' table-owned kinds)."""
        return sum(
            len(v) for i, (_, v) in self.rows.items() if v is not None and i not in self.external
        )

    def unique_bytes(self) -> int:
        stored = {v for i, (_, v) in self.rows.items() if v is not None and i not in self.external}
        return sum(map(len, stored))


@dataclass
class Built:
    uri: str
    mode: str
    model: Model
    media: Path
    history: dict[int, Model] = field(default_factory=dict)  # version -> content
    branch: Model | None = None  # the branch "exp", when an operation made one
    tag: tuple[str, Model] | None = None
    index: str | None = None  # an index that must cover every row after compaction


def payloads_for(start: int, count: int, external: str) -> list:
    """Shared, small, inline, packed, dedicated, null and external values in turn."""
    kinds = [
        lambda i: SHARED,
        lambda i: os.urandom(300 + i),
        lambda i: SHARED_SMALL,
        lambda i: os.urandom(90_000 + i),
        lambda i: DEDICATED,
        lambda i: None,
        lambda i: SHARED,
        lambda i: Blob(uri=external),
    ]
    return [kinds[i % len(kinds)](i) for i in range(start, start + count)]


def logical(values: list, mode: str) -> pa.Array:
    if mode != "ref_id":
        return blob_array(values)
    return blob_array(
        [Blob(data=v, ref_id=REF_IDS.get(v)) if isinstance(v, bytes) else v for v in values]
    )


def rows_table(ids: list[int], values: list, mode: str) -> pa.Table:
    vectors = np.random.default_rng(ids[0]).random((len(ids), DIM), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([i * 10 for i in ids], pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
            "b": logical(values, mode),
        }
    )


@pytest.fixture(params=MODES)
def built(request, tmp_path: Path) -> Built:
    """Three appends and a delete, every kind of payload, in one dedup mode."""
    mode = request.param
    media = tmp_path / "media"
    media.mkdir()
    external = media / "clip.bin"
    external_bytes = os.urandom(5_000)
    external.write_bytes(external_bytes)
    uri = str(tmp_path / "t.lance")  # LanceDB finds tables by this suffix
    history: dict[int, Model] = {}
    rows: dict[int, tuple[int, bytes | None]] = {}
    externals: set[int] = set()
    per_append = 8 * SCALE
    for append in range(3 * SCALE):
        ids = list(range(append * per_append, (append + 1) * per_append))
        values = payloads_for(ids[0], per_append, str(external))
        table = write_table(
            rows_table(ids, values, mode),
            uri,
            mode="append",
            dedup=mode,
            placement=PLACEMENT,
            allowed_bases=[str(media)] if append == 0 else None,
        )
        for i, value in zip(ids, values, strict=True):
            rows[i] = (i * 10, external_bytes if isinstance(value, Blob) else value)
            if isinstance(value, Blob):
                externals.add(i)
        history[table.version] = Model(dict(rows), external=frozenset(externals))
    open_table(uri).delete("id % 11 = 3")
    rows = {i: v for i, v in rows.items() if i % 11 != 3}
    model = Model(rows, external=frozenset(externals))
    history[open_table(uri).version] = model
    return Built(uri, mode, model, media, history)


def rows_of(table_rows: list[dict], model: Model) -> dict[int, tuple[int | None, bytes | None]]:
    return {r["id"]: (r[model.label] if model.label else None, r[model.blob]) for r in table_rows}


def expected(model: Model) -> dict[int, tuple[int | None, bytes | None]]:
    return {i: (label if model.label else None, v) for i, (label, v) in model.rows.items()}


def read_blobhouse(uri: str, model: Model, **where) -> dict:
    table = open_table(uri, **where)
    return rows_of(table.to_arrow(blobs="bytes").to_pylist(), model)


def read_stock(path: str, model: Model, version=None) -> dict:
    dataset = lance.dataset(path, version=version)
    columns = ["id", model.label] if model.label else ["id"]
    plain = dataset.to_table(columns=columns).to_pylist()
    pairs = dataset.read_blobs(model.blob, indices=list(range(len(plain))), preserve_order=True)
    return {
        r["id"]: (r[model.label] if model.label else None, payload)
        for r, (_, payload) in zip(plain, pairs, strict=True)
    }


def check(built: Built, step: str) -> None:
    """Identical bytes through blobhouse and stock pylance, honest verify and stats."""
    uri, model = built.uri, built.model
    want = expected(model)
    assert read_blobhouse(uri, model) == want, f"{step}: blobhouse"
    assert read_stock(uri, model) == want, f"{step}: stock pylance"
    table = open_table(uri)
    report = table.verify(deep=True)
    assert report["problems"] == [], f"{step}: verify"
    assert report["hashed"] + report["unhashed"] > 0  # files Lance rewrote carry no hashes
    stats = table.stats()
    assert stats["rows"] == len(model.rows), f"{step}: stats rows"
    assert stats["logical_bytes"] == model.logical_bytes(), f"{step}: stats logical bytes"
    kinds = [k for column in stats["columns"].values() for k in column["kinds"].values()]
    stored = sum(k["logical_bytes"] for k in kinds if k["table_owned"])
    assert stored == model.stored_bytes(), f"{step}: stats stored logical bytes"
    if built.branch is not None:
        branch = built.branch
        assert read_blobhouse(uri, branch, branch="exp") == expected(branch), f"{step}: branch"
        assert read_stock(f"{uri}/tree/exp", branch) == expected(branch), f"{step}: stock branch"
    if built.tag is not None:
        name, tagged = built.tag
        assert read_blobhouse(uri, tagged, version=name) == expected(tagged), f"{step}: tag"


def maintain(built: Built) -> None:
    """blobhouse compaction and gc, each followed by the checks; sharing is back after the
    compaction, indices cover every row, and gc leaves nothing unreferenced."""
    uri = built.uri
    unindexed = unindexed_rows(built)
    open_table(uri).compact()
    check(built, "after blobhouse compact")
    stats = open_table(uri).stats()
    if stats["fragments"] == 1:  # one new file: each distinct payload stored once again
        assert stats["table_owned_bytes"] <= built.model.unique_bytes() + 4096
    if built.index is not None:  # every row the index covered before, it covers now
        assert unindexed_rows(built) <= unindexed, "index after compaction"
    # the writes above ended moments ago: their leases would keep their files for 30 s more
    shutil.rmtree(os.path.join(uri, "_leases"), ignore_errors=True)
    report = open_table(uri).gc(retain_versions=1, grace=timedelta(0))
    assert report["retained_versions"][-1] == open_table(uri).version
    # store packs no version uses are retired by one run and reaped by the next
    again = open_table(uri).gc(grace=timedelta(0))
    assert again["reaped_packs"] == report["retired_packs"]
    check(built, "after blobhouse gc")
    assert open_table(uri).stats()["orphan_files"] == 0
    if built.branch is None and built.tag is None:  # one version left: every row counted once
        verified = open_table(uri).verify(deep=True)
        live = [(i, v) for i, (_, v) in built.model.rows.items() if v is not None]
        external = sum(i in built.model.external for i, _ in live)
        # blobhouse rewrote every file Lance wrote: each stored payload has its hash again
        assert (verified["hashed"], verified["unhashed"]) == (len(live) - external, external)


def unindexed_rows(built: Built) -> int:
    """Live rows the operation's index does not cover (0 for no index)."""
    if built.index is None:
        return 0
    stats = lance.dataset(built.uri).stats.index_stats(built.index)
    assert stats["num_indexed_rows"] + stats["num_unindexed_rows"] == len(built.model.rows)
    return stats["num_unindexed_rows"]


def lance_blobs(values: list[bytes | None]) -> pa.Array:
    return lance_blob_array(values)


def stock_rows(ids: list[int], labels: list[int], values: list[bytes]) -> pa.Table:
    vectors = np.random.default_rng(ids[0] + 7).random((len(ids), DIM), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "label": pa.array(labels, pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
            "b": lance_blobs(values),
        }
    )


# ---- the operations: each applies itself with stock tools and updates the model ------------


def update(built: Built) -> None:
    lance.dataset(built.uri).update({"label": "label + 1"}, where="id % 2 = 0")
    rows = {i: (label + (1 - i % 2), v) for i, (label, v) in built.model.rows.items()}
    built.model = replace(built.model, rows=rows)


def merge_insert(built: Built) -> None:
    present = sorted(built.model.rows)[:3]
    new = [10_000, 10_001]
    values = [SHARED, os.urandom(2_000), SHARED_SMALL, DEDICATED, SHARED]
    source = stock_rows(present + new, [-1] * 5, values)
    lance.dataset(built.uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(source)
    rows = dict(built.model.rows)
    for i, value in zip(present + new, values, strict=True):
        rows[i] = (-1, value)
    built.model = replace(built.model, rows=rows, external=built.model.external - set(present))


def add_columns(built: Built) -> None:
    lance.dataset(built.uri).add_columns({"double": "id * 2"})


def alter_columns(built: Built) -> None:
    lance.dataset(built.uri).alter_columns(
        {"path": "b", "name": "media"}, {"path": "label", "name": "tag"}
    )
    built.model = replace(built.model, blob="media", label="tag")


def drop_columns(built: Built) -> None:
    lance.dataset(built.uri).drop_columns(["label"])
    built.model = replace(built.model, label=None)


def append_after_add_columns(built: Built) -> None:
    """Lance adds a column; a blobhouse append without it fills it with nulls."""
    lance.dataset(built.uri).add_columns({"double": "id * 2"})
    ids = list(range(30_000, 30_008))
    external = built.media / "clip.bin"
    values = payloads_for(0, len(ids), str(external))
    data = rows_table(ids, values, built.mode)
    write_table(data, built.uri, mode="append", dedup=built.mode, placement=PLACEMENT)
    rows, externals = dict(built.model.rows), set(built.model.external)
    for i, value in zip(ids, values, strict=True):
        rows[i] = (i * 10, external.read_bytes() if isinstance(value, Blob) else value)
        if isinstance(value, Blob):
            externals.add(i)
    built.model = replace(built.model, rows=rows, external=frozenset(externals))


# ---- blobhouse's own schema changes, on the same tables -------------------------------------


def blobhouse_add_columns(built: Built) -> None:
    table = open_table(built.uri).add_columns({"double": "id * 2"})
    table.add_columns(blob_field("thumb"))  # an all-null blob column


def blobhouse_alter_columns(built: Built) -> None:
    open_table(built.uri).alter_columns(
        {"path": "b", "name": "media"},
        {"path": "label", "name": "tag"},
        {"path": "id", "data_type": pa.int32()},  # a cast: the column gets files of its own
    )
    built.model = replace(built.model, blob="media", label="tag")


def blobhouse_drop_columns(built: Built) -> None:
    open_table(built.uri).drop_columns(["label", "vec"])
    built.model = replace(built.model, label=None)


# ---- blobhouse's own mutations, on the same tables ------------------------------------------


def new_payload(i: int) -> bytes:
    """A payload for row ``i`` that no row holds yet (inline, packed or dedicated by size)."""
    return i.to_bytes(4, "little") * (100 + (i % 3) * 50_000)


def as_input(values: list[bytes | None], mode: str) -> list:
    """Values for a blob function: with ref_id dedup a shared payload carries its id."""
    return [Blob(data=v, ref_id=REF_IDS.get(v)) if mode == "ref_id" and v else v for v in values]


def blobhouse_update(built: Built) -> None:
    """A plain column's update stores no payload again."""
    before = open_table(built.uri).stats()["table_owned_bytes"]
    open_table(built.uri).update({"label": "label * 3"}, where="id % 4 = 1")
    assert open_table(built.uri).stats()["table_owned_bytes"] == before
    rows = {
        i: (label * 3 if i % 4 == 1 else label, v) for i, (label, v) in built.model.rows.items()
    }
    built.model = replace(built.model, rows=rows)


def blob_values(ids: list[int]) -> list[bytes | None]:
    """New blob values by id: shared payloads, new ones and nulls."""
    return [SHARED if i % 2 else (new_payload(i) if i % 5 else None) for i in ids]


def blobhouse_update_blob(built: Built) -> None:
    """A blob column set through the write pipeline; the other rows' payloads stay shared."""

    def values(rows: pa.RecordBatch) -> list:
        return as_input(blob_values(rows.column("id").to_pylist()), built.mode)

    open_table(built.uri).update({"b": values}, where="id % 3 = 0", dedup=built.mode)
    changed = [i for i in built.model.rows if i % 3 == 0]
    rows = dict(built.model.rows)
    for i, value in zip(changed, blob_values(changed), strict=True):
        rows[i] = (rows[i][0], value)
    built.model = replace(built.model, rows=rows, external=built.model.external - set(changed))


def blobhouse_merge_insert(built: Built) -> None:
    """An upsert of matched rows (one keeps its payload, others get shared or new ones) and
    new rows; the payloads go through the write pipeline in the table's dedup mode."""
    present = sorted(built.model.rows)[:4]
    new = [10_000, 10_001, 10_002]
    ids = present + new
    values = [built.model.rows[present[0]][1], SHARED, new_payload(5), DEDICATED, SHARED, None]
    values.append(new_payload(7))
    data = rows_table(ids, as_input(values, built.mode), built.mode)
    table = open_table(built.uri)
    before = table.stats()["table_owned_bytes"]
    report = (
        table.merge_insert("id", dedup=built.mode, placement=PLACEMENT)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(data)
    )
    assert (report.num_updated_rows, report.num_inserted_rows) == (len(present), len(new))
    if built.mode == "global":  # only the two new payloads are stored
        growth = table.stats()["table_owned_bytes"] - before
        assert growth <= len(new_payload(5)) + len(new_payload(7)) + 4096
    rows = dict(built.model.rows)
    rows.update({i: (i * 10, v) for i, v in zip(ids, values, strict=True)})
    built.model = replace(built.model, rows=rows, external=built.model.external - set(present))


def blobhouse_merge_columns_and_delete(built: Built) -> None:
    """Matched rows get a new label only (their blobs untouched); table rows the source lacks
    and that match the condition are deleted."""
    present = sorted(built.model.rows)[::2]
    data = pa.table(
        {"id": pa.array(present, pa.int64()), "label": pa.array([-7] * len(present), pa.int64())}
    )
    report = (
        open_table(built.uri)
        .merge_insert("id")
        .when_matched_update(["label"])
        .when_not_matched_by_source_delete("id > 12")
        .execute(data)
    )
    gone = {i for i in built.model.rows if i not in present and i > 12}
    assert (report.num_updated_rows, report.num_deleted_rows) == (len(present), len(gone))
    rows = {
        i: (-7 if i in present else label, v)
        for i, (label, v) in built.model.rows.items()
        if i not in gone
    }
    built.model = replace(built.model, rows=rows, external=built.model.external - gone)


def blobhouse_update_on_branch(built: Built) -> None:
    """blobhouse's mutations on a branch leave main as it was."""
    dataset = lance.dataset(built.uri)
    dataset.create_branch("exp", dataset.version)
    branch = open_table(built.uri, branch="exp")
    branch.update({"label": "label - 1"})
    changed = sorted(built.model.rows)[:2]
    data = rows_table(changed, as_input([SHARED, new_payload(9)], built.mode), built.mode)
    branch.merge_insert("id", dedup=built.mode).when_matched_update_all().execute(data)
    rows = {i: (label - 1, v) for i, (label, v) in built.model.rows.items()}
    rows.update({i: (i * 10, v) for i, v in zip(changed, [SHARED, new_payload(9)], strict=True)})
    built.branch = replace(built.model, rows=rows, external=built.model.external - set(changed))


def update_after_index(built: Built) -> None:
    """An index, then blobhouse's update of the indexed column: queries through the index
    see the new values."""
    lance.dataset(built.uri).create_scalar_index("label", "BTREE")
    blobhouse_update(built)
    some = next(i for i in built.model.rows if i % 4 == 1)
    label = built.model.rows[some][0]
    found = lance.dataset(built.uri).to_table(columns=["id"], filter=f"label = {label}")
    assert some in found.column("id").to_pylist()


def scalar_index(built: Built) -> None:
    lance.dataset(built.uri).create_scalar_index("id", "BTREE")
    built.index = "id_idx"


def vector_index(built: Built) -> None:
    lance.dataset(built.uri).create_index("vec", "IVF_PQ", num_partitions=1, num_sub_vectors=2)
    built.index = "vec_idx"


def compact_files(built: Built) -> None:
    lance.dataset(built.uri).optimize.compact_files()


def cleanup(built: Built) -> None:
    lance.dataset(built.uri).cleanup_old_versions(older_than=timedelta(0))


def cleanup_unverified(built: Built) -> None:
    lance.dataset(built.uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)


def restore(built: Built) -> None:
    version = sorted(built.history)[1]
    lance.dataset(built.uri, version=version).restore()
    built.model = built.history[version]


def tag(built: Built) -> None:
    version = sorted(built.history)[0]
    lance.dataset(built.uri).tags.create("first", version)
    built.tag = ("first", built.history[version])


def branch(built: Built) -> None:
    dataset = lance.dataset(built.uri)
    made = dataset.create_branch("exp", dataset.version)
    extra = {20_000: SHARED, 20_001: os.urandom(70_000)}
    lance.write_dataset(
        stock_rows(list(extra), [0, 0], list(extra.values())), made.uri, mode="append"
    )
    rows = dict(built.model.rows)
    rows.update({i: (0, v) for i, v in extra.items()})
    built.branch = replace(built.model, rows=rows)


def lancedb_optimize(built: Built) -> None:
    folder, name = os.path.split(built.uri)
    table = lancedb.connect(folder).open_table(name.removesuffix(".lance"))
    table.optimize(cleanup_older_than=timedelta(0))


OPERATIONS: list[Callable[[Built], None]] = [
    update,
    merge_insert,
    add_columns,
    alter_columns,
    drop_columns,
    append_after_add_columns,
    blobhouse_add_columns,
    blobhouse_alter_columns,
    blobhouse_drop_columns,
    blobhouse_update,
    blobhouse_update_blob,
    blobhouse_merge_insert,
    blobhouse_merge_columns_and_delete,
    blobhouse_update_on_branch,
    update_after_index,
    scalar_index,
    vector_index,
    compact_files,
    cleanup,
    cleanup_unverified,
    restore,
    tag,
    branch,
    lancedb_optimize,
]


def test_the_built_table_reads_back(built: Built):
    """What every operation below starts from (built alike for each: checked once a mode)."""
    check(built, "as built")


@pytest.mark.filterwarnings("ignore:optimize\\(cleanup_older_than=0\\)")
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.__name__)
def test_a_lance_operation_then_blobhouse(built: Built, operation):
    operation(built)
    check(built, f"after {operation.__name__}")
    maintain(built)
