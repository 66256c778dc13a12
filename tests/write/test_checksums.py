"""Payload checksums: a blake3 per stored payload in each data file, which stock Lance ignores."""

from __future__ import annotations

import json
import os
import random
import types
from collections import Counter

import blake3
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.file import LanceFileReader

import blobhouse
import blobhouse.dedup
import blobhouse.files.checksums
import blobhouse.files.session
import blobhouse.write.pipeline
from blobhouse import Blob, BlobSession, Kind, blob_array, blob_field, write_table
from blobhouse.cache import SharedCache
from blobhouse.dedup import content_hash, content_hashes
from blobhouse.files.checksums import (
    CHECKSUM_SCHEMA,
    CHECKSUMS_KEY,
    ChecksumLog,
    FileChecksums,
    load_checksums,
    written_by_blobhouse,
)
from tests.helpers import ROW_ADDRESS, flip, placed_sidecar, stock_read

PLACEMENT = {"dedicated_size_threshold": 200_000}
SMALL_SHARED = b"shared" * 20
MEDIUM = os.urandom(100_000)
LARGE = os.urandom(300_000)


def digest(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


@pytest.fixture
def media(tmp_path):
    base = tmp_path / "media"
    base.mkdir()
    (base / "clip.bin").write_bytes(os.urandom(5000))
    return base


def sample(media) -> pa.Table:
    """Every kind of row; small payloads unique, shared inside a window, and shared by ref_id."""
    clip = str(media / "clip.bin")
    values = [
        Blob(data=os.urandom(100)),
        Blob(data=SMALL_SHARED, ref_id=5),
        Blob(data=b""),
        Blob(data=SMALL_SHARED, ref_id=5),
        Blob(data=MEDIUM, ref_id=7),
        Blob(data=MEDIUM, ref_id=7),
        Blob(uri=clip),
        None,
        Blob(data=LARGE, ref_id=9),
        Blob(data=LARGE, ref_id=9),
        Blob(data=os.urandom(3000)),
        Blob(uri=clip, position=100, size=50),
        Blob(data=os.urandom(70_000)),
        Blob(data=os.urandom(10)),
    ]
    schema = pa.schema([pa.field("id", pa.int64()), blob_field("media", **PLACEMENT)])
    return pa.table({"id": range(len(values)), "media": blob_array(values)}, schema=schema)


def file_uri(table_uri: str, path: str) -> str:
    return f"file://{table_uri}/data/{path}"


def file_column(dataset, data_file, column: str) -> int:
    """The column of the data file that holds table column ``column`` (top level)."""
    field = next(f for f in dataset.lance_schema.fields() if f.name() == column)
    return data_file.column_indices[data_file.fields.index(field.id())]


def recorded(table_uri: str, column: str) -> list[tuple[dict | None, bytes | None]]:
    """Each row's stock descriptor and the digest its data file records for its payload."""
    dataset = lance.dataset(table_uri)
    checksums, columns = {}, {}
    for fragment in dataset.get_fragments():
        (data_file,) = fragment.metadata.files
        checksums[fragment.fragment_id] = load_checksums(file_uri(table_uri, data_file.path))
        columns[fragment.fragment_id] = file_column(dataset, data_file, column)
    rows = dataset.to_table(columns=[column], with_row_address=True)
    out = []
    for desc, address in zip(
        rows.column(column).to_pylist(), rows.column(ROW_ADDRESS).to_pylist(), strict=True
    ):
        found = checksums[address >> 32]
        if desc is None or desc["kind"] == Kind.EXTERNAL or found is None:
            out.append((desc, None))
        elif desc["kind"] == Kind.INLINE:
            at = columns[address >> 32]
            out.append((desc, found.inline(at, address & 0xFFFFFFFF)))
        else:
            out.append((desc, found.sidecar(desc["blob_id"], desc["position"], desc["size"])))
    return out


def stored_payloads(table_uri: str) -> int:
    """Distinct payloads blobhouse stored, counted from the descriptors."""
    rows = lance.dataset(table_uri).to_table(columns=["media"], with_row_address=True)
    seen = set()
    for desc, address in zip(
        rows.column("media").to_pylist(), rows.column(ROW_ADDRESS).to_pylist(), strict=True
    ):
        if desc is None or desc["kind"] == Kind.EXTERNAL:
            continue
        fragment = address >> 32
        if desc["kind"] == Kind.INLINE:
            seen.add((fragment, "inline", address))
        else:
            seen.add((fragment, desc["blob_id"], desc["position"]))
    return len(seen)


def recorded_entries(table_uri: str) -> int:
    total = 0
    for fragment in lance.dataset(table_uri).get_fragments():
        found = load_checksums(file_uri(table_uri, fragment.metadata.files[0].path))
        total += len(found) if found is not None else 0
    return total


def assert_every_payload_checked(table_uri: str, column: str) -> list[tuple[dict | None, bytes]]:
    """Every stored payload has a recorded digest equal to blake3 of what stock pylance reads;
    external and null rows have none."""
    payloads = stock_read(table_uri, column)
    pairs = recorded(table_uri, column)
    for row, ((desc, found), payload) in enumerate(zip(pairs, payloads, strict=True)):
        if desc is None or desc["kind"] == Kind.EXTERNAL:
            assert found is None, row
        else:
            assert found == digest(payload), (row, desc)
    return pairs


@pytest.mark.parametrize("dedup", ["off", "content", "ref_id"])
def test_every_stored_payload_has_its_hash(table_uri, media, dedup, monkeypatch):
    # small windows and files: inline rows of later batches, windows and files get their rows
    monkeypatch.setattr(blobhouse.write.pipeline, "WINDOW_ROWS", 5)
    data = sample(media)
    batches = pa.Table.from_batches(data.to_batches(max_chunksize=2))
    write_table(batches, table_uri, dedup=dedup, allowed_bases=[str(media)], max_rows_per_file=9)
    assert len(lance.dataset(table_uri).get_fragments()) == 2

    pairs = assert_every_payload_checked(table_uri, "media")
    kinds = Counter(desc["kind"] for desc, _ in pairs if desc is not None)
    assert kinds[Kind.INLINE] and kinds[Kind.PACKED] and kinds[Kind.DEDICATED]
    assert kinds[Kind.EXTERNAL] == 2
    # one entry per stored payload: shared payloads once, external rows never
    assert recorded_entries(table_uri) == stored_payloads(table_uri)


def test_a_shared_payload_has_one_entry(table_uri):
    rows = [MEDIUM] * 5 + [SMALL_SHARED] * 3 + [LARGE] * 2
    write_table(
        pa.table({"media": blob_array(rows)}),
        table_uri,
        placement={"media": PLACEMENT},
        dedup="content",
    )
    (fragment,) = lance.dataset(table_uri).get_fragments()
    found = load_checksums(file_uri(table_uri, fragment.metadata.files[0].path))
    assert sorted(found.table.column("size").to_pylist()) == sorted(
        [len(MEDIUM), len(SMALL_SHARED), len(LARGE)]
    )
    assert found.table.column("row").to_pylist() == [-1, -1, -1]  # all in sidecars
    assert_every_payload_checked(table_uri, "media")


def test_nested_inline_rows_are_keyed_by_their_column_in_the_data_file(table_uri):
    payloads = [os.urandom(40) for _ in range(3)]
    meta = pa.StructArray.from_arrays([blob_array(payloads), pa.array([1, 2, 3])], ["img", "n"])
    write_table(pa.table({"id": [7, 8, 9], "meta": meta}), table_uri, dedup="content")
    (fragment,) = lance.dataset(table_uri).get_fragments()
    found = load_checksums(file_uri(table_uri, fragment.metadata.files[0].path))
    # columns of the file: id, meta.img, meta.n
    assert [found.inline(1, row) for row in range(3)] == [digest(p) for p in payloads]
    assert found.inline(0, 0) is None and found.inline(2, 0) is None
    assert stock_read(table_uri, "meta.img") == payloads


def test_each_payload_is_hashed_once(table_uri, media, monkeypatch):
    """The pipeline hashes each payload at most once, a run of a batch in one call, and hands
    the digest to dedup and the checksums; the sidecars hash nothing again, with dedup on or
    off. A payload of COMPARED_BYTES or more that repeats one earlier in the batch (MEDIUM,
    LARGE) is compared with it, not hashed."""
    calls: Counter[str] = Counter()

    def counted(name, fn, items=lambda args: 1):
        def wrapper(*args, **kwargs):
            calls[name] += items(args)
            return fn(*args, **kwargs)

        return wrapper

    hasher = counted("hasher", blake3.blake3)
    hasher.AUTO = blake3.blake3.AUTO
    monkeypatch.setattr(blobhouse.files.session, "blake3", types.SimpleNamespace(blake3=hasher))
    monkeypatch.setattr(blobhouse.files.session, "content_hash", counted("session", content_hash))
    monkeypatch.setattr(
        blobhouse.dedup,
        "content_hashes",
        counted("pipeline", content_hashes, items=lambda args: len(args[0])),
    )
    data = sample(media)
    payloads = [v["data"] for v in data.column("media").to_pylist() if v and v["data"] is not None]
    repeats = sum(
        1
        for i, p in enumerate(payloads)
        if len(p) >= blobhouse.write.pipeline.COMPARED_BYTES and p in payloads[:i]
    )
    assert repeats == 2
    with_data = len(payloads) - repeats

    write_table(data, table_uri, dedup="content", allowed_bases=[str(media)])
    assert calls == {"pipeline": with_data}

    calls.clear()
    write_table(data, table_uri + "-off", dedup="off", allowed_bases=[str(media)])
    assert calls == {"pipeline": with_data}
    kinds = Counter(d["kind"] for d, _ in recorded(table_uri + "-off", "media") if d)
    assert kinds[Kind.INLINE] and kinds[Kind.PACKED] and kinds[Kind.DEDICATED]
    assert_every_payload_checked(table_uri + "-off", "media")


@pytest.fixture
def table(table_uri, media):
    schema = pa.schema([pa.field("id", pa.int64()), blob_field("img")])
    return write_table(schema.empty_table(), table_uri, allowed_bases=[str(media)])


def test_session_written_files_record_what_the_session_wrote(table, media):
    session = BlobSession(table.data_file_path())
    placed_sidecar(session, 1, os.urandom(3000))
    placed_sidecar(session, 2, os.urandom(6000))
    images = session.open_writer("img")
    pack = images.new_packed()
    a, b = pack.write_blob(b"alpha" * 100), pack.write_blob(memoryview(b"beta" * 100))
    pack.finish()
    dedicated = images.new_dedicated()
    big = os.urandom(300_000)
    for start in range(0, len(big), 70_000):
        dedicated.write(big[start : start + 70_000])
    images.extend([a, b, a, dedicated.finish()])
    images.extend(images.load_packed(1, offsets=[0, 1000], sizes=[1000, 2000]))
    images.append(images.load_dedicated(2))
    images.append_inline(b"tiny")
    images.append_external(str(media / "clip.bin"), position=10, size=20)
    images.append_null()
    images.append_inline(bytearray(b"second inline"))
    column = images.finish()
    written = session.write_data_file(pa.table({"id": range(len(column)), "img": column}))
    table.add_data_file(written)

    found = load_checksums(file_uri(table.dataset.uri, written.name))
    assert len(found) == 5  # two packed, one dedicated, two inline; nothing for loaded ranges
    pairs = recorded(table.dataset.uri, "img")
    payloads = stock_read(table.dataset.uri, "img")
    checked = [row for row, (_, d) in enumerate(pairs) if d is not None]
    assert checked == [0, 1, 2, 3, 7, 10]  # loaded (4, 5, 6), external and null rows: none
    assert all(pairs[row][1] == digest(payloads[row]) for row in checked)
    assert payloads[3] == big and payloads[10] == b"second inline"


def test_a_given_digest_is_recorded_as_given(tmp_path):
    session = BlobSession(str(tmp_path / "data" / "f.lance"))
    pack = session.new_packed()
    pack.write_blob(b"abc", digest=b"p" * 32)
    pack.write_blob(b"def")
    dedicated = session.new_dedicated(digest=b"d" * 32)
    dedicated.write(b"ghi")
    dedicated.finish()
    found = FileChecksums(session.checksums.to_table())
    assert found.sidecar(1, 0, 3) == b"p" * 32  # trusted, never hashed again
    assert found.sidecar(1, 3, 3) == digest(b"def")
    assert found.sidecar(2, 0, 3) == b"d" * 32
    session.abort()


def test_a_digest_of_the_wrong_length_is_refused_before_a_byte_is_written(tmp_path):
    session = BlobSession(str(tmp_path / "data" / "f.lance"))
    pack = session.new_packed()
    pack.write_blob(b"abc")
    with pytest.raises(ValueError, match="32 bytes, got 31"):
        pack.write_blobs([b"def", b"ghi"], [digest(b"def"), b"x" * 31])
    assert pack.size == 3 and len(session.checksums) == 1
    (value,) = pack.finish()
    assert os.path.getsize(os.path.join(session.data_dir, session.sidecar_path(value.blob_id))) == 3
    session.abort()


def test_stock_lance_reads_are_unaffected(table_uri, media):
    data = sample(media)
    write_table(data, table_uri, allowed_bases=[str(media)])
    dataset = lance.dataset(table_uri)
    (fragment,) = dataset.get_fragments()
    path = f"{table_uri}/data/{fragment.metadata.files[0].path}"
    reader = LanceFileReader(path)
    assert CHECKSUMS_KEY.encode() in reader.metadata().schema.metadata
    assert CHECKSUMS_KEY.encode() not in (dataset.schema.metadata or {})
    assert reader.num_rows() == data.num_rows
    assert dataset.to_table(columns=["id"]).column("id").to_pylist() == list(range(14))
    clip = (media / "clip.bin").read_bytes()
    expected = [None if v is None else v["data"] for v in data.column("media").to_pylist()]
    expected[6], expected[11] = clip, clip[100:150]
    assert stock_read(table_uri, "media") == expected


def test_files_without_stored_payloads_have_an_empty_list_stock_files_none(
    table_uri, media, tmp_path
):
    clip = str(media / "clip.bin")
    rows = pa.table({"id": [1, 2], "media": blob_array([clip, None])})
    write_table(rows, table_uri, allowed_bases=[str(media)])
    (ours,) = lance.dataset(table_uri).get_fragments()
    ours_uri = file_uri(table_uri, ours.metadata.files[0].path)
    assert len(load_checksums(ours_uri)) == 0 and written_by_blobhouse(ours_uri)
    lance.write_dataset(pa.table({"media": [b"stock"]}), str(tmp_path / "stock"))
    (stock,) = lance.dataset(str(tmp_path / "stock")).get_fragments()
    stock_uri = file_uri(str(tmp_path / "stock"), stock.metadata.files[0].path)
    assert load_checksums(stock_uri) is None and not written_by_blobhouse(stock_uri)


def test_lance_compaction_leaves_files_without_checksums(table_uri):
    payloads = [os.urandom(50) for _ in range(6)] + [MEDIUM]
    write_table(
        pa.table({"media": blob_array(payloads)}), table_uri, max_rows_per_file=3, dedup="content"
    )
    assert recorded_entries(table_uri) == 7
    lance.dataset(table_uri).optimize.compact_files(target_rows_per_fragment=100)
    (fragment,) = lance.dataset(table_uri).get_fragments()
    assert load_checksums(file_uri(table_uri, fragment.metadata.files[0].path)) is None
    assert stock_read(table_uri, "media") == payloads


def test_log_round_trips_through_the_ipc_buffer():
    log = ChecksumLog()
    top = 2**64 - 1
    log.record_sidecar(blob_id=2**32 - 1, position=top - 5, size=5, digest=b"a" * 32)
    log.record_sidecar(blob_id=3, position=0, size=top, digest=b"b" * 32)
    for row in (5, 0, 2**40):
        log.record_inline("img", row=row, size=1, digest=bytes([row % 251]) * 32)
    table = pa.ipc.open_stream(log.to_bytes()).read_all()
    assert table.schema.equals(CHECKSUM_SCHEMA)
    found = FileChecksums(table, {"img": 4})
    assert found.sidecar(2**32 - 1, top - 5, 5) == b"a" * 32
    assert found.sidecar(3, 0, top) == b"b" * 32
    assert [found.inline(4, r) for r in (0, 5, 2**40)] == [
        bytes([r % 251]) * 32 for r in (0, 5, 2**40)
    ]
    for miss in (found.sidecar(2**32, 0, 5), found.sidecar(3, -1, top), found.sidecar(3, 0, 4)):
        assert miss is None
    assert found.inline(4, -1) is None and found.inline(4, 1) is None and found.inline(3, 0) is None


def test_a_digest_must_be_32_bytes():
    with pytest.raises(ValueError, match="32 bytes"):
        ChecksumLog().record_inline("img", row=0, size=1, digest=b"short")


def test_many_sidecar_lookups_at_once_match_one_at_a_time():
    log = ChecksumLog()
    entries = [(b, p, s) for b in (1, 2, 7) for p in (0, 10, 2**40) for s in (5, 6)]
    for at, (blob_id, position, size) in enumerate(entries):
        log.record_sidecar(blob_id, position, size, digest=bytes([at]) * 32)
    found = FileChecksums(log.to_table())
    wanted = [*reversed(entries), (2, 10, 7), (3, 0, 5), (7, 2**40 + 1, 5), (0, 0, 0)]
    many = found.sidecar_many(*(np.array(k, np.uint64) for k in zip(*wanted, strict=True)))
    assert many == [found.sidecar(*key) for key in wanted]
    assert many[: len(entries)] == [bytes([at]) * 32 for at in reversed(range(len(entries)))]
    assert many[len(entries) :] == [None] * 4


def test_a_walk_over_many_data_files_keeps_a_bounded_set_of_checksums(table_uri, monkeypatch):
    # one budget per two files: a read of every file's rows, twice, loads each file's
    # checksums again once evicted, checks every row, and never holds more than two files
    checksums = blobhouse.files.checksums
    monkeypatch.setattr(
        checksums,
        "_LOADED",
        SharedCache(2 * checksums._FILE_BYTES + 4096, checksums._checksums_bytes),
    )
    payloads = [os.urandom(2_000 + n) for n in range(6)]
    for n, payload in enumerate(payloads):  # one data file per append, inline and packed rows
        table = write_table(
            pa.table({"b": blob_array([payload, MEDIUM + bytes([n])])}),
            table_uri,
            mode="append",
            dedup="content",
        )
    hashes = table.recorded_hashes()
    loaded = Counter()
    real_load = blobhouse.files.checksums.load_checksums

    def counting_load(uri, options=None):
        loaded[uri] += 1
        return real_load(uri, options)

    monkeypatch.setattr("blobhouse.files.checksums.load_checksums", counting_load)
    for _ in range(2):
        for row in range(12):
            expected = payloads[row // 2] if row % 2 == 0 else MEDIUM + bytes([row // 2])
            assert table.read_blobs("b", [row]) == [expected]
            assert len(hashes._files) <= 2
    assert len(loaded) == 6 and set(loaded.values()) == {2}
    corrupt = table.blob_refs("b", [0])[0].as_py()
    flip(corrupt["uri"], corrupt["position"])
    with pytest.raises(blobhouse.CorruptBlobError):  # a file read again is checked again
        table.read_blobs("b", [0])


def test_each_data_files_hashes_are_loaded_once_for_the_process(table_uri, monkeypatch):
    """A data file never changes once written, so its recorded hashes are read once for the
    process: by the first checked read (started beside Lance's take, and waited for, not
    loaded twice), never again by a new version or another table object over that file."""
    loaded = Counter()
    real_load = blobhouse.files.checksums.load_checksums

    def counting_load(uri, options=None):
        loaded[uri.rsplit("/", 1)[-1]] += 1
        return real_load(uri, options)

    monkeypatch.setattr("blobhouse.files.checksums.load_checksums", counting_load)
    payloads = [os.urandom(3_000 + n) for n in range(80)]
    table = write_table(pa.table({"b": blob_array(payloads[:50])}), table_uri)
    assert table.read_blobs("b", [3, 7]) == [payloads[3], payloads[7]]
    (first,) = loaded
    assert loaded[first] == 1
    appended = write_table(pa.table({"b": blob_array(payloads[50:])}), table_uri, mode="append")
    assert appended.read_blobs("b", [4, 49]) == [payloads[4], payloads[49]]
    assert blobhouse.open_table(table_uri).read_blobs("b", [5, 60]) == [payloads[5], payloads[60]]
    assert len(loaded) == 2 and set(loaded.values()) == {1}, loaded


def test_verify_reads_the_hashes_from_the_files_not_what_reads_loaded(table_uri):
    """A recorded hash damaged after this process loaded the file's list: reads check
    payloads against the list as written (the payloads are intact), while verify reads the
    files again and lists the damage."""
    payloads = [bytes([i]) * 1000 for i in range(20)]
    table = write_table(pa.table({"img": blob_array(payloads)}), table_uri)
    assert table.read_blobs("img", [5]) == [payloads[5]]
    (path,) = [p for p in os.listdir(f"{table_uri}/data") if p.endswith(".lance")]
    path = f"{table_uri}/data/{path}"
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(digest(payloads[5]))
    assert at > 0
    data[at + 20] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    assert blobhouse.open_table(table_uri).read_blobs("img", [5]) == [payloads[5]]
    (problem,) = blobhouse.open_table(table_uri).verify(deep=True)["problems"]
    assert problem["row"] == 5 and "recorded" in problem["reason"], problem


@pytest.mark.parametrize("count", [50, 5_000])  # a small file's list (a dict), a large one's
def test_a_place_recorded_twice_finds_the_entry_written_first(count):
    """Entries are sorted by a mix of their place with numpy's fast sort; a place recorded
    twice (the one case of equal mixes but for a collision) is found at its first entry, the
    same every time, among thousands of others, and among a few."""
    log = ChecksumLog()
    places = [("packs/a", 100 * i, 100) for i in range(count)]
    log.record_store(places, [digest(i.to_bytes(4, "little")) for i in range(count)])
    log.record_store([("packs/a", 4_200, 100)], [b"\x01" * 32])  # place 42 again
    checksums = FileChecksums(log.to_table())
    wanted = [42, count - 1, 0, 42, count, -1]
    found = checksums.stored_many(
        ["packs/a", "packs/b"],
        np.array([0, 0, 0, 0, 0, 1], np.uint32),
        np.array([100 * i for i in wanted], np.int64),
        np.full(6, 100, np.uint64),
    )
    recorded = [digest(i.to_bytes(4, "little")) for i in wanted[:4]]
    assert found == [*recorded, None, None]  # past the last place; in another pack


def test_store_entries_are_written_in_the_order_a_reader_searches_them():
    """A list's store entries number their packs (the sorted names once, in the list's
    metadata) and are written sorted by the place mix a reader searches: a fresh process's
    first read neither reads a pack's name per entry nor sorts. Lists written before (each
    entry naming its pack, in any order) are sorted when read; both find every entry, and a
    place recorded twice at its first."""
    rng = random.Random(5)
    packs = [f"packs/{name}" for name in ("zz", "aa", "mm")]
    places = [
        (rng.choice(packs), rng.randrange(1 << 40), rng.randrange(1, 1 << 20)) for _ in range(3_000)
    ]
    digests = [digest(i.to_bytes(4, "little")) for i in range(3_000)]
    log = ChecksumLog()
    log.record_inline("img", row=0, size=1, digest=b"i" * 32)  # another name among the packs'
    log.record_store(places, digests)
    log.record_store([places[7]], [b"\x01" * 32])  # place 7 again: the first entry wins
    data = log.to_bytes()
    assert all(data.count(pack.encode()) == 1 for pack in packs)
    written = pa.ipc.open_stream(data).read_all()
    names = sorted(packs)
    assert json.loads(written.schema.metadata[b"store_packs"]) == names
    in_store = pc.equal(written.column("row"), -2)
    assert set(written.filter(in_store).column("column").to_pylist()) == {""}
    numbered = [names[code] for code in written.filter(in_store).column("blob_id").to_pylist()]
    assert sorted(numbered) == sorted(place[0] for place in [*places, places[7]])
    # what blobhouse wrote before 2026-12-01: each store entry names its pack, in any order
    # (its place 7 recorded once)
    older = (
        written.set_column(
            0,
            "column",
            pc.if_else(
                in_store,
                pa.array(names, pa.utf8()).take(written.column("blob_id")),
                written.column("column"),
            ),
        )
        .set_column(
            2, "blob_id", pc.if_else(in_store, pa.scalar(0, pa.uint32()), written["blob_id"])
        )
        .cast(CHECKSUM_SCHEMA)
        .replace_schema_metadata(None)
    )
    once = older.filter(pc.not_equal(older["blake3"], pa.scalar(b"\x01" * 32, pa.binary(32))))
    shuffled = once.take(rng.sample(range(once.num_rows), once.num_rows))
    wanted = [*range(0, 3_000, 7), 7]
    codes = np.array([names.index(places[i][0]) for i in wanted], np.uint32)
    positions = np.array([places[i][1] for i in wanted], np.uint64)
    sizes = np.array([places[i][2] for i in wanted], np.uint64)
    for table, sorted_when_read in ((written, False), (shuffled, True)):
        checksums = FileChecksums(table, {"img": 0})
        stored = checksums._stored
        in_file_order = (np.diff(stored.entries) > 0).all()
        assert in_file_order != sorted_when_read
        found = checksums.stored_many(names, codes, positions, sizes)
        assert found == [digests[i] for i in wanted]
        assert checksums.inline(0, 0) == b"i" * 32
